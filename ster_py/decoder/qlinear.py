"""Projections over GGML-quantized weights that stay in their blocks.

``QuantTensor`` wraps a 2-D tensor of a memory-mapped GGUF file without reading
it: its rows are decoded only when asked for (the embedding lookup), and
``QuantLinear`` multiplies by it with the Cython kernels of
``ster_py._kernels.qmatmul``, which decode each block inside the product
(llama.cpp's approach: ggml-cpu's ``vec_dot_*`` / ``mul_mat``; block layouts from
ggml-common.h). Nothing here ever materialises the whole float matrix unless a
caller asks for a dense array (``np.asarray(qt)``). A row order (``permuted``)
reorders the product's outputs instead of the weights: that is how llama.cpp's q/k
row permutation is undone without a copy.

``QuantLinear`` also takes a 2-D float16 or bfloat16 array (a safetensors weight used
as stored, typically a view of the memory-mapped file): the same kernels read its 16-bit
rows in place, widening them inside the product (no float32 copy of the weights), with
AVX2, AVX-512 and AVX512_BF16 paths chosen at run time (``qmatmul.set_simd_level``).

``reference_matmul`` is the plain numpy reference the kernels are tested against:
dequantize with ``ster_py.gguf.quants.dequantize_reference`` (or widen the 16-bit floats),
multiply in float64.

Threads: ``set_threads(n)`` (or ``$STER_THREADS``; default every core) applies to
every product and attention call of the process.
"""
from __future__ import annotations

import mmap
from contextlib import contextmanager

import numpy as np

from ..errors import SterError
from ..gguf import quants

# GGML types the product kernels handle (the others are dequantized at load).
QUANT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
               "IQ4_NL", "IQ4_XS", "MXFP4")


#: Input rows up to which ``QuantLinear`` takes the few-row product (``few_rows``); 0: never.
_few_rows = 0


@contextmanager
def few_rows(limit: int = 12):
    """Within this block, products of 2 to ``limit`` (at most 16) input rows over quantized or
    16-bit weights run as row dots over each weight row while it is cached
    (``qmatmul.QMatrix.matmul`` force=3): each output equals that row's one-token product, and
    the weights are read from memory once for all the rows. Decoded panels (the prefill path)
    cost more than they save for so few rows (measured on [1536, 512] bf16, Q8_0, Q4_0 and Q4_K
    matrices: row dots cost ~1/T-th of the panels' time per row up to ~9 rows and the two cross
    between 9 and 16 rows; hence 12 by default). Speculative verification runs under it
    (``ster_py.speculative``); prefill does not (its rows keep the panel path's arithmetic,
    which the prompt cache's reuse relies on). Process-wide, like ``float_activations``: not for
    concurrent use by several threads (``ster serve`` runs one generation at a time).
    """
    global _few_rows
    before, _few_rows = _few_rows, max(0, min(int(limit), 16))
    try:
        yield
    finally:
        _few_rows = before


def _kernels():
    try:
        from .._kernels import check_built, qmatmul

        check_built(qmatmul)
    except ImportError as e:  # pragma: no cover - depends on the build
        raise SterError("the Cython kernels are not built (ster_py._kernels.qmatmul is missing); run "
                        "`python setup.py build_ext --inplace` in the source tree or reinstall ster-py "
                        f"({e})") from None
    return qmatmul


@contextmanager
def float_activations():
    """Within the block, every product takes its float32 inputs as they are: one-token (T = 1) products
    with block-quantized weights no longer round them to int16 per 32-block, and a bfloat16 matrix's
    several-token products no longer round them to bfloat16 for AVX512_BF16's vdpbf16ps or AMX's tiles,
    nor a block-quantized matrix's for AMX's tiles (with its decoded weights: ``qmatmul.set_bf16_inputs``,
    ``qmatmul.set_quantized_tiles``). Those roundings are speed trades of generation (the defaults),
    restored as they were after the block. Not for concurrent use by several threads."""
    qmatmul = _kernels()
    int16 = qmatmul.set_int16_activations(False)
    bf16 = qmatmul.set_bf16_inputs(False)
    try:
        yield
    finally:
        qmatmul.set_int16_activations(int16)
        qmatmul.set_bf16_inputs(bf16)


def bf16_rounded_products() -> int:
    """Products so far in this process whose inputs were rounded to bfloat16 (``qmatmul.set_bf16_inputs``)."""
    return _kernels().bf16_rounded_products()


#: GGML type ids of the 16-bit float rows the kernels multiply as stored, by dtype name (bfloat16 is
#: ml_dtypes', which a quantized model's load never imports).
HALF_TYPE_IDS = {"float16": 1, "bfloat16": 30}


def is_half(weight) -> bool:
    """True for a 2-D float16 / bfloat16 numpy array (a weight ``QuantLinear`` reads as stored)."""
    return (isinstance(weight, np.ndarray) and weight.ndim == 2 and weight.dtype.isnative
            and weight.dtype.name in HALF_TYPE_IDS)


def set_threads(n: int) -> None:
    """Use ``n`` threads for every product and attention call from now on, and bound the
    thread pools of the libraries numpy calls into (OpenBLAS or MKL, and OpenMP) to ``n``
    through threadpoolctl, so that no float32 matrix product or OpenMP loop starts more
    threads than ``--threads`` allows.

    Raises SterError unless ``n`` is a whole number (an int or numpy integer, not a bool) with
    1 <= n <= ``qmatmul.MAX_THREADS`` (1024): 2.5 ran on 2 threads, True on 1, and "abc" or None was
    a ValueError or TypeError.
    """
    limit = _kernels().MAX_THREADS
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= limit:
        shown = repr(n) if len(repr(n)) <= 20 else repr(n)[:20] + "..."   # '2' (a str) shown as one
        raise SterError(f"--threads must be a whole number from 1 to {limit}, got {shown}")
    _kernels().set_threads(int(n))
    from .._kernels import ops  # attention shares the setting (and the thread pool)

    ops.set_threads(int(n))
    from ._fast import scan  # so do the recurrent mixers' kernels

    if scan is not None:
        scan.set_threads(int(n))
    limit_library_threads(int(n))


def limit_library_threads(n: int) -> None:
    """Bound BLAS (OpenBLAS, MKL, BLIS) and OpenMP thread pools loaded in this process to ``n``
    threads (threadpoolctl; libraries loaded later, such as torch's for ``ster parity``, are
    bounded again by calling this after they load). A child process inherits the bound
    through OMP_NUM_THREADS / OPENBLAS_NUM_THREADS / MKL_NUM_THREADS, set here too."""
    import os

    from threadpoolctl import threadpool_limits

    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)
    threadpool_limits(limits=n)  # applied now, kept (not used as a context manager)
    if pool_blas():
        # float32 products run on the kernels' pool, one OpenBLAS call per thread
        # (ops.gemm_nt): OpenBLAS itself stays at one thread, so that its helpers neither
        # spin beside the pool's between products nor hold a product up when a core is taken
        threadpool_limits(limits={_POOL_BLAS_PREFIX: 1})


#: True once numpy's OpenBLAS ``cblas_sgemm`` was handed to the kernels (``pool_blas``).
POOL_BLAS = False
_POOL_BLAS_LOOKED = False
_POOL_BLAS_PREFIX = ""   # threadpoolctl's prefix of that library (only it is kept at one thread)
#: The kernel family OpenBLAS chose for this CPU (threadpoolctl's "architecture": Haswell, SkylakeX...), once
#: ``pool_blas`` found it; "" before or without one.
BLAS_CORE = ""
#: OpenBLAS's kernel families that run AVX-512 float32 products (the rest run AVX2 or less).
_AVX512_BLAS_CORES = frozenset({"skylakex", "cooperlake", "sapphirerapids"})


def pool_blas() -> bool:
    """Find the ILP64 ``cblas_sgemm`` and ``cblas_sgemv`` of the OpenBLAS numpy loaded (numpy's
    wheels: ``scipy_cblas_sgemm64_``) and give them to ``ops.gemm_nt``, once; True when found, so that
    ``Linear`` runs float32 products on the kernels' pool. $STER_POOL_BLAS=0 turns it off (numpy's
    matmul on OpenBLAS's threads, as before). Other BLAS libraries (MKL, BLIS, an OpenMP or
    LP64 OpenBLAS) are left to numpy."""
    global POOL_BLAS, _POOL_BLAS_LOOKED, _POOL_BLAS_PREFIX, BLAS_CORE
    import os

    if _POOL_BLAS_LOOKED:
        return POOL_BLAS
    _POOL_BLAS_LOOKED = True
    if os.environ.get("STER_POOL_BLAS", "").strip() == "0":
        return False
    import ctypes

    from threadpoolctl import threadpool_info

    from .._kernels import ops

    for info in threadpool_info():
        if info.get("internal_api") != "openblas" or info.get("threading_layer") != "pthreads":
            continue
        try:
            lib = ctypes.CDLL(info["filepath"])
        except OSError:
            continue
        for prefix in ("scipy_cblas_", "cblas_"):
            gemm, gemv = getattr(lib, prefix + "sgemm64_", None), getattr(lib, prefix + "sgemv64_", None)
            if gemm is not None and gemv is not None:
                ops.set_blas_sgemm(ctypes.cast(gemm, ctypes.c_void_p).value, ctypes.cast(gemv, ctypes.c_void_p).value)
                POOL_BLAS, _POOL_BLAS_PREFIX = True, info["prefix"]
                BLAS_CORE = str(info.get("architecture") or "")
                return True
    return False


def f32_panels() -> bool:
    """Whether ``Linear``'s float32 products of several rows run on the kernels' own register tile
    (``qmatmul.f32_matmul``) instead of OpenBLAS: where the kernels run AVX-512 and numpy's OpenBLAS chose
    narrower kernels for this CPU (its build does not know it: an AMD EPYC Zen 5 gets OpenBLAS's Haswell
    kernels). Measured on that CPU, 2 threads, [512, 576] x [1536, 576] and five other model shapes: the tile
    1.57-1.84x OpenBLAS's Haswell kernels, 0.89-1.04x its SkylakeX ones (forced by OPENBLAS_CORETYPE), and at
    AVX2 0.88-1.00x the Haswell ones, hence only there (runbook/performance.md). The tile is row-exact, so the
    prompt cache's reuse of float32 checkpoints holds there too. $STER_F32_PANELS=0/1 overrides."""
    import os

    forced = os.environ.get("STER_F32_PANELS", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return pool_blas() and _kernels().simd_level().startswith("avx512") and BLAS_CORE.lower() not in _AVX512_BLAS_CORES


def threads_from_env() -> int | None:
    """$STER_THREADS as a thread count, None when unset or empty.

    Raises SterError when it is set to anything but a whole number from 1 to 1024 (the
    kernels then fall back to every core; the CLI refuses instead of guessing).
    """
    import os

    env = os.environ.get("STER_THREADS", "").strip()
    if not env:
        return None
    limit = _kernels().MAX_THREADS
    if not (env.isascii() and env.isdigit() and 1 <= int(env) <= limit):
        shown = env if len(env) <= 20 else env[:20] + "..."
        raise SterError(f"STER_THREADS must be a whole number from 1 to {limit}, got {shown!r}; fix or unset it")
    return int(env)


def check_kernel_env() -> None:
    """Refuse a $STER_THREADS, $STER_SIMD_LEVEL, $STER_INTERLEAVE, $STER_F32_PANELS or $STER_BF16_INPUTS the kernels
    would not understand (they would ignore it: every core, no cap, interleaving or rounding on), so that a typo does
    not pass for a setting.

    Raises SterError naming the variable and the values it takes.
    """
    import os

    threads_from_env()

    levels = _kernels().SIMD_LEVELS
    level = os.environ.get("STER_SIMD_LEVEL", "").strip()
    if level and level.lower() not in levels:
        raise SterError(f"STER_SIMD_LEVEL must be one of {', '.join(levels)}, got {level[:20]!r}; fix or unset it")
    for name, meaning in (("STER_INTERLEAVE", "0 (rows in place) or 1 (interleaved, the default)"),
                          ("STER_F32_PANELS", "0 (float32 products on OpenBLAS) or 1 (on ster's register tile; "
                                              "unset: where OpenBLAS runs narrower kernels than the CPU has)"),
                          ("STER_BF16_INPUTS", "0 (float32 inputs) or 1 (a bf16 prompt's inputs rounded to bf16 "
                                               "where the CPU has AVX512_BF16; unset: where that is faster, "
                                               "AMD's cores and Intel's with AMX)")):
        value = os.environ.get(name, "").strip()
        if value and value not in ("0", "1"):
            raise SterError(f"{name} must be {meaning}, got {value[:20]!r}; fix or unset it")


def get_threads() -> int:
    """Threads the quantized products use."""
    return _kernels().get_threads()


def matvec_group(mats: tuple, x: np.ndarray, outs: tuple) -> None:
    """``qmatmul.matvec_group``: x float32 [1, K] times each QMatrix of ``mats`` into ``outs``."""
    global _matvec_group
    if _matvec_group is None:  # bound once: this runs twice per layer per decoded token
        _matvec_group = _kernels().matvec_group
    _matvec_group(mats, x, outs)


_matvec_group = None


class QuantTensor:
    """A [rows, cols] GGML-quantized matrix left in the file's blocks.

    Args:
        tensor: a 2-D ``ster_py.gguf.reader.GGUFTensor`` of one of ``QUANT_TYPES``.
        rows: optional int [rows] order: row i of this matrix is row ``rows[i]`` of the
            stored tensor (undoes a row permutation, or selects a row range, without
            copying any weight).

    Attributes:
        shape: (rows, cols); ``dtype`` float32 (what reading it yields);
        ggml_type / type_name: the stored block type; ``nbytes``: stored bytes it spans.

    Indexing: ``qt[a:b]`` is a QuantTensor of those rows (no copy); ``qt[ids]`` (int or
    int array) decodes just those rows to float32 (``rows(ids)``). ``np.asarray(qt)``
    dequantizes everything (for code that needs a dense array).
    """

    ndim = 2
    dtype = np.dtype(np.float32)

    def __init__(self, tensor, rows: np.ndarray | None = None, *, expert: int | None = None):
        if len(tensor.shape) != (2 if expert is None else 3) or tensor.type_name not in QUANT_TYPES:
            raise SterError(f"tensor {tensor.name!r} ({tensor.type_name}, shape {list(tensor.shape)}) cannot be "
                            f"kept quantized; the kernels multiply 2-D {', '.join(QUANT_TYPES)} matrices")
        self.tensor = tensor
        self.ggml_type, self.type_name = tensor.ggml_type, tensor.type_name
        # A plain ndarray view of the blocks (not the file's np.memmap subclass, whose
        # indexing is slower): the embedding looks a row up every decoded token.
        raw = np.asarray(tensor.raw_rows)
        if expert is None:
            self.name, self._raw = tensor.name, raw
        else:  # one expert's matrix of a [n_expert, rows, cols] stack: its rows, contiguous
            per = int(tensor.shape[1])
            self.name, self._raw = f"{tensor.name}[expert {expert}]", raw[expert * per:(expert + 1) * per]
        self._expert = expert
        self._order = None if rows is None else np.ascontiguousarray(rows, dtype=np.int32)
        n = self._raw.shape[0] if self._order is None else self._order.shape[0]
        self.shape = (int(n), int(tensor.shape[-1]))
        self.nbytes = self.shape[0] * tensor.row_bytes
        self._qmatrix = None

    @classmethod
    def from_blocks(cls, blocks: np.ndarray, type_name: str, cols: int, name: str = "quantized") -> "QuantTensor":
        """A QuantTensor over blocks made in memory: uint8 [rows, row_bytes] of ``type_name``
        (``ster_py.gguf.quantize``), ``cols`` weights per row."""
        from ..gguf.reader import GGUFTensor

        t = quants.ggml_type(type_name)
        blocks = np.ascontiguousarray(blocks, dtype=np.uint8)
        rows = blocks.shape[0]
        if blocks.ndim != 2 or cols % t.block_size or blocks.shape[1] != cols // t.block_size * t.type_size:
            raise SterError(f"{name}: {list(blocks.shape)} bytes are not rows of {cols} {type_name} weights")
        return cls(GGUFTensor(name, t.id, t.name, (cols, rows), (rows, cols), 0, blocks.nbytes, blocks.reshape(-1)))

    def __repr__(self) -> str:
        return f"QuantTensor({self.name!r}, {self.type_name}, shape={self.shape})"

    def __len__(self) -> int:
        return self.shape[0]

    def _raw_indices(self, ids: np.ndarray) -> np.ndarray:
        return ids if self._order is None else self._order[ids]

    def rows(self, ids) -> np.ndarray:
        """float32 [len(ids), cols]: the rows ``ids`` (int array), decoding only their blocks.

        Raises SterError for an index out of range.
        """
        n = self.shape[0]
        out_of_range = SterError(f"row index out of range for {self.name!r} with {n} rows")
        try:
            ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        except OverflowError:
            raise out_of_range from None
        if ids.size == 1:  # decoding: one token per step, a slice instead of a gather
            i = int(ids[0])
            if not -n <= i < n:
                raise out_of_range
            i = int(self._raw_indices(i + n if i < 0 else i))
            raw = self._raw[i:i + 1]
        else:
            if ids.size and (ids.min() < -n or ids.max() >= n):
                raise out_of_range
            raw = self._raw[self._raw_indices(np.where(ids < 0, ids + n, ids))]
        return quants.dequantize(raw, self.ggml_type, (ids.shape[0], self.shape[1]), n_threads=1)

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(self.shape[0])
            if (start, stop, step) == (0, self.shape[0], 1):
                return self
            return self.permuted(np.arange(start, stop, step))
        if np.ndim(key) == 0:
            return self.rows([int(key)])[0]
        return self.rows(key)

    def permuted(self, order: np.ndarray) -> "QuantTensor":
        """This matrix with its rows reordered: row i of the result is row ``order[i]``."""
        order = np.asarray(order, dtype=np.int64)
        return QuantTensor(self.tensor, self._raw_indices(order), expert=self._expert)

    def dequantize(self) -> np.ndarray:
        """float32 [rows, cols]: every weight decoded (allocates the whole matrix)."""
        rows = self._raw if self._order is None else self._raw[self._order]
        return quants.dequantize(np.ascontiguousarray(rows), self.ggml_type, self.shape)

    def __array__(self, dtype=None, copy=None):
        w = self.dequantize()
        return w if dtype is None else w.astype(dtype, copy=False)

    def astype(self, dtype, copy: bool = True) -> np.ndarray:
        """A dense array of ``dtype`` (dequantizes everything)."""
        return self.dequantize().astype(dtype, copy=False)

    def qmatrix(self):
        """The kernel's view of this matrix (built once).

        Blocks in a file mapping may be copied into the kernels' interleaved layout (by a
        background thread from here on, ``qmatmul.QMatrix``); their pages then leave the
        resident set (the row lookups of an embedding read them back from the page cache),
        so a model's memory stays about its file size. Blocks made in memory (``from_blocks``) are used where
        they are: a copy of them would double the memory they take.
        """
        if self._qmatrix is None:
            mapped = _file_mapping(self._raw)
            self._qmatrix = _kernels().QMatrix(self._raw, self.ggml_type, self.shape[1], self._order,
                                               None if mapped else False, mapped)
        return self._qmatrix


def _file_mapping(arr: np.ndarray) -> bool:
    """Whether ``arr`` views the memory of an ``mmap.mmap`` (a GGUF file's tensors do)."""
    base = arr
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return isinstance(base, mmap.mmap)


class QuantLinear:
    """y = x W^T + b with W a ``QuantTensor`` or a float16 / bfloat16 array [out_features, in_features].

    x float32 [T, in_features] (or [in_features]) -> float32 [T, out_features]: one
    fused row dot per output for T = 1, decoded 16-row panels shared by all tokens for
    T > 1 (see ``cython/qmatmul.pyx``). Accumulation is float32. For block-quantized W with
    AVX2 the T = 1 path first rounds x to int16 per 32-input block (relative step 2^-15 of
    the block's largest magnitude; llama.cpp uses int8 here, which moves real-model logits
    by ~3%, int16 by ~2e-4) so a block is two integer multiply-adds;
    ``qmatmul.set_int16_activations(False)`` keeps float inputs. 16-bit float W multiplies
    float32 x exactly widened (AVX2 / AVX-512), or with AVX512_BF16 for bfloat16 the two
    bfloat16 halves of x (``qmatmul.split_bf16``: 16 significant bits of each input).

    Raises SterError for a weight that is neither.
    """

    def __init__(self, weight, bias: np.ndarray | None = None):
        self.weight = weight
        self.bias = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
        self.out_features, self.in_features = weight.shape
        if isinstance(weight, QuantTensor):
            self._m = weight.qmatrix()
        elif is_half(weight):
            rows = np.ascontiguousarray(weight)  # a view of the file when stored contiguously
            self._m = _kernels().QMatrix(rows.view(np.uint8).reshape(rows.shape[0], -1), HALF_TYPE_IDS[rows.dtype.name],
                                         rows.shape[1])
            self._rows = rows  # the QMatrix reads these bytes
        else:
            raise SterError(f"QuantLinear takes a QuantTensor or a 2-D float16/bfloat16 array, got "
                            f"{type(weight).__name__} {getattr(weight, 'dtype', '')}")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if x.__class__ is np.ndarray and x.ndim == 2 and x.dtype == np.float32 and x.flags.c_contiguous:
            out = np.empty((x.shape[0], self.out_features), np.float32)  # the common case, no copies
            self._m.matmul(x, out, 3 if 1 < x.shape[0] <= _few_rows else 0)
            if self.bias is not None:
                out += self.bias
            return out
        x2 = np.ascontiguousarray(x, dtype=np.float32)
        vector = x2.ndim == 1
        if x2.ndim != 2:
            x2 = x2.reshape(-1, self.in_features)
        out = np.empty((x2.shape[0], self.out_features), np.float32)
        self._m.matmul(x2, out, 3 if 1 < x2.shape[0] <= _few_rows else 0)
        if self.bias is not None:
            out += self.bias
        return out[0] if vector else out.reshape(*x.shape[:-1], self.out_features)


def reference_matmul(x: np.ndarray, weight) -> np.ndarray:
    """The numpy reference: float64 [T, out] = x [T, in] @ dequantize_reference(W)^T, or
    x @ W^T with a float16 / bfloat16 W widened exactly.

    (For the int16 decode path, pass the quantized input ``dx * q`` from
    ``qmatmul.quantize_activations``; for the AVX512_BF16 decode path, hi + lo from
    ``qmatmul.split_bf16``; for a bfloat16 W's several-token products on bfloat16 inputs
    (``qmatmul.bf16_inputs``), x rounded to bfloat16.)
    """
    if is_half(weight):
        return np.asarray(x, dtype=np.float64) @ weight.astype(np.float64).T
    raw = weight._raw if weight._order is None else weight._raw[weight._order]
    w = quants.dequantize_reference(np.ascontiguousarray(raw), weight.ggml_type, weight.shape)
    return np.asarray(x, dtype=np.float64) @ w.astype(np.float64).T


class QuantStack:
    """A [n_expert, rows, cols] GGML-quantized stack (llama.cpp's ``ffn_*_exps``) left in the file.

    ``stack[e]`` is expert e's matrix as a ``QuantTensor`` over its own rows (no copy);
    ``shape`` is (n_expert, rows, cols). Only the experts a token chooses are ever read.
    """

    def __init__(self, tensor):
        if len(tensor.shape) != 3 or tensor.type_name not in QUANT_TYPES:
            raise SterError(f"tensor {tensor.name!r} ({tensor.type_name}, shape {list(tensor.shape)}) is not a "
                            f"3-D stack of {', '.join(QUANT_TYPES)} matrices")
        self.tensor, self.name = tensor, tensor.name
        self.shape = tuple(int(d) for d in tensor.shape)
        self.type_name = tensor.type_name

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, e: int) -> QuantTensor:
        if not 0 <= int(e) < self.shape[0]:
            raise SterError(f"expert {e} out of range for {self.name!r} with {self.shape[0]} experts")
        return QuantTensor(self.tensor, expert=int(e))


# ---------------------------------------------------------------------------- --quantize

#: --quantize names -> the block type of a matrix whose rows fit it.
QUANTIZE_TYPES = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_k": "Q4_K"}
#: The output head (or the embedding it is tied to) under each --quantize: llama.cpp keeps its
#: output matrix at a higher type than the layers (Q6_K for its Q4 presets); the quantizers
#: here have no Q6_K (wt-exp's do: with them this can follow llama.cpp), so the head is Q8_0.
HEAD_TYPE = {"q8_0": "Q8_0", "q4_0": "Q8_0", "q4_k": "Q8_0"}


def block_type_for(name: str, cols: int) -> str | None:
    """The block type of a matrix of rows of ``cols`` weights under --quantize ``name`` (a key of
    ``QUANTIZE_TYPES``, or a block type): that type when the rows are whole blocks of it, else
    llama.cpp's fallback when that fits (``gguf.quantize.fallback_type``: Q4_K -> Q5_0), else
    None (the matrix is kept as stored)."""
    from ..gguf.quantize import fallback_type

    t = fallback_type(QUANTIZE_TYPES.get(name, name), cols)
    return None if t in ("F16", "F32", "BF16") else t


def quantize_matrix(w: np.ndarray, type_name: str, where: str = "matrix") -> np.ndarray:
    """A float matrix [rows, K] -> uint8 [rows, row_bytes] blocks of ``type_name`` by
    ``gguf.quantize.quantize``, after refusing inf/NaN weights (a damaged checkpoint: the
    blocks of such a row mean nothing).

    Raises:
        SterError: inf or NaN in ``w`` (``where`` names the matrix), or what ``quantize`` raises.
    """
    from ..gguf.quantize import quantize

    x = np.ascontiguousarray(w, dtype=np.float32)
    if not np.isfinite(x).all():
        raise SterError(f"{where} holds inf or NaN weights; the checkpoint is damaged and cannot be quantized")
    return quantize(x, type_name)
