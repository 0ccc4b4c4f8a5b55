# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Quantized matrix products over GGML blocks read in place (ster_py._kernels.qmatmul).

``QMatrix`` wraps the raw blocks of a [rows, cols] GGML tensor (a zero-copy view
of the memory-mapped file) and computes y = x W^T for float32 x [T, cols]:

- T = 1 (decoding): one fused row dot per output, decoding each block inside it.
  With AVX2 the input is first quantized to int16 per 32-input block (x ~= dx * q,
  relative error <= 2^-16 of the block's largest input) so that a block is two
  integer multiply-adds (vpmaddwd); the portable path multiplies in float;
- T > 1 (prefill): panels of 16 rows x 256 inputs are decoded to float32 once
  and a register tile runs every token over them (6 tokens x 16 rows with AVX2, 12 x 32,
  two panels, with AVX-512);
- 2 to 16 rows on request (``matmul(..., force=3)``, speculative verification): the
  T = 1 row dots of every input row over each block of weight rows while it is in the
  first-level cache, so the weights stream from memory once and each result equals
  that row's one-token product.

Work is split over output rows into chunks run by ``ster_pool.h``'s threads (the
caller works too and never waits for a helper that is not running, so a busy
machine degrades the product to fewer threads instead of stalling it). The arithmetic lives in
``ster_qkernels.h`` (AVX2/FMA when the CPU has it, a portable path otherwise);
``ster_py.decoder.qlinear`` holds the numpy reference it is tested against.
"""
import os

from cpython.pycapsule cimport PyCapsule_New
from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF
from libc.stdint cimport int16_t, int32_t, uint8_t, uint16_t, uintptr_t
from libc.limits cimport INT_MAX
from libc.stdlib cimport free, malloc

import numpy as np

cimport numpy as cnp

cnp.import_array()

cdef extern from "ster_pool.h" nogil:
    ctypedef void (*ster_task_fn)(void* ctx, long chunk, int tid) noexcept nogil
    void ster_pool_run(long n, ster_task_fn fn, void* ctx, int nthreads)
    void ster_pool_stats(long* out4)
    void ster_pool_hint(int n, const char* const* ptr, const long* len)

cdef extern from "ster_qkernels.h" nogil:
    int STER_KC
    int STER_NR
    int STER_F32
    int ster_block_size(int type)
    int ster_type_size(int type)
    int ster_cpu_avx2()
    int ster_cpu_level()
    int ster_cpu_fast_bf16_dot()
    int ster_is_half(int type)
    void ster_init_tables()
    void ster_sums16(const float* x, int K, float* xs16)
    int ster_quantize16(const float* x, int K, int16_t* q, float* dx, float* xs16)
    int ster_split_bf16(const float* x, int K, uint16_t* hi, uint16_t* lo)
    void ster_matvec16_range(int type, const uint8_t* W, size_t row_bytes, const int32_t* rows, int r0, int r1,
                             int K, const int16_t* q, const float* dx, const float* xs16, float* y, int level)
    void ster_matvec_range(int type, const uint8_t* W, size_t row_bytes, const int32_t* rows, int r0, int r1,
                           int K, const float* x, const float* xs16, float* y, int simd, const uint16_t* xbf)
    void ster_matmul_range(int type, const uint8_t* W, size_t row_bytes, const int32_t* rows, int n0, int n1,
                           int K, const float* X, int T, float* Y, int ldy, float* pack, int simd,
                           const uint16_t* Xb)
    void ster_round_inputs_bf16(const float* X, int T, int K, uint16_t* Xb)
    int STER_IL
    int STER_ILG
    int STER_IL_MAX_BLOCKS
    int ster_il_type(int type)
    ctypedef struct ster_il_job:
        int type, n_rows, release, src_rows
        const uint8_t* src
        size_t rb
        const int32_t* rows
        uint8_t* dst
        int state
    int STER_IL_IDLE
    int ster_il_init()
    int ster_il_submit(ster_il_job* j)
    void ster_il_finish(ster_il_job* j)
    void ster_il_cancel(ster_il_job* j)
    int ster_il_done(ster_il_job* j)
    void ster_il_release(const uint8_t* p, size_t n)

MAX_THREADS = 1024  # more than any machine this runs on; the pool itself stops at 64 helpers


def _default_threads() -> int:
    """$STER_THREADS when it is a whole number from 1 to MAX_THREADS, else every core
    (``ster_py.decoder.qlinear.threads_from_env`` reports a bad value to the user)."""
    env = os.environ.get("STER_THREADS", "").strip()
    if env.isascii() and env.isdigit() and 0 < int(env) <= MAX_THREADS:
        return int(env)
    return max(1, min(os.cpu_count() or 1, MAX_THREADS))


ster_init_tables()
ster_il_init()   # the interleaved copies' fork handlers, once, before any thread can hold their lock
cdef int _threads = _default_threads()
# Instruction-set levels (ster_qkernels.h STER_ISA_*): each includes the ones before it.
# amx_bf16: AVX512_BF16 plus AMX's tiles for bfloat16 prefill (ster_amx.h), where the OS grants them.
SIMD_LEVELS = ("portable", "avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx_bf16")


def _level_cap() -> int:
    """$STER_SIMD_LEVEL (a name of ``SIMD_LEVELS``): the highest level the kernels may use even
    where the CPU runs more, so that a run (or the test suite) on an AVX-512 machine takes the
    paths an AVX2-only or a portable machine takes. Unset or unknown: no cap."""
    env = os.environ.get("STER_SIMD_LEVEL", "").strip().lower()
    return SIMD_LEVELS.index(env) if env in SIMD_LEVELS else len(SIMD_LEVELS) - 1


cdef int _simd_ok = min(ster_cpu_level(), _level_cap())
cdef int _simd = _simd_ok
cdef int _int16 = 1
cdef int _read_ahead = 1
# $STER_INTERLEAVE=0 keeps quantized rows where they are (A/B benchmarks; see set_interleave); any other value is
# the default, on (check_kernel_env refuses values but 0 and 1)
cdef int _interleave = os.environ.get("STER_INTERLEAVE", "1").strip() != "0"
cdef int _background_copies = 1
# $STER_BF16_INPUTS=0 keeps float32 inputs for bfloat16 matrices' prefill, =1 rounds them; unset (or any other
# value, which check_kernel_env refuses before a model loads), they are rounded where vdpbf16ps beats the float32
# tile (see set_bf16_inputs). "false" or "off" once turned the rounding on.
_env_bf16 = os.environ.get("STER_BF16_INPUTS", "").strip()
cdef int _bf16_inputs = 1 if _env_bf16 == "1" else 0 if _env_bf16 == "0" else ster_cpu_fast_bf16_dot()
cdef int _quant_tiles = 1   # see set_quantized_tiles
#: Whether ``set_bf16_inputs`` starts on in this process ($STER_BF16_INPUTS, or the CPU).
BF16_INPUTS_DEFAULT = bool(_bf16_inputs)
# Below this many weights a product runs on one thread: waking the team costs more.
cdef long _PARALLEL_MIN_WEIGHTS = 65536


# The one pool of the process, shared with ster_py._kernels.ops through this capsule.
_pool_capsule = PyCapsule_New(<void*>ster_pool_run, b"ster_pool_run", NULL)


# Several matrices over one input (q/k/v, gate/up): one quantized input, one pool job.
DEF _MAX_GROUP = 4

ctypedef struct _GroupJob:
    int n, use16, simd, K
    int typ[_MAX_GROUP]
    int N[_MAX_GROUP]
    int chunk[_MAX_GROUP]
    long first[_MAX_GROUP + 1]   # chunk index where matrix m starts (prefix sums)
    const uint8_t* W[_MAX_GROUP]
    size_t rb[_MAX_GROUP]
    const int32_t* rows[_MAX_GROUP]
    float* y[_MAX_GROUP]
    const float* x
    const int16_t* q
    const float* dx
    const float* xs16
    const uint16_t* xbf   # the input split in two bfloat16 halves, or NULL


cdef void _group_task(void* ctx, long c, int tid) noexcept nogil:
    cdef _GroupJob* j = <_GroupJob*>ctx
    cdef int m = 0
    while c >= j.first[m + 1]:
        m += 1
    cdef int r0 = <int>(c - j.first[m]) * j.chunk[m]
    cdef int r1 = min(j.N[m], r0 + j.chunk[m])
    if j.use16 and not ster_is_half(j.typ[m]):
        ster_matvec16_range(j.typ[m], j.W[m], j.rb[m], j.rows[m], r0, r1, j.K, j.q, j.dx, j.xs16, j.y[m], j.simd)
    else:
        ster_matvec_range(j.typ[m], j.W[m], j.rb[m], j.rows[m], r0, r1, j.K, j.x, j.xs16, j.y[m], j.simd, j.xbf)


ctypedef struct _PanelJob:
    int typ, simd, K, N, T, nc
    const uint8_t* W
    size_t rb
    const int32_t* rows
    const float* X
    float* Y
    float* pack
    size_t per_thread
    const uint16_t* Xb    # [T, K + (K & 1)] the inputs in bfloat16 (ster_matmul_range), or NULL


# A few rows (speculative verification): every row of the input dotted with each weight row while
# that row is in the first-level cache. The arithmetic of each (row, output) is the decode step's.
cdef enum:
    _MAX_FEW = 16

#: Input rows ``QMatrix.matmul(..., force=3)`` takes at most.
FEW_ROWS = _MAX_FEW

ctypedef struct _FewJob:
    int typ, simd, K, N, T, chunk, sub
    const uint8_t* W
    size_t rb
    const int32_t* rows
    const float* X
    float* Y
    const int16_t* q
    const float* dx
    const float* xs16
    const uint16_t* xbf   # [T, 2K] the inputs' bfloat16 halves, or NULL
    int use16[_MAX_FEW]


cdef void _few_task(void* ctx, long c, int tid) noexcept nogil:
    cdef _FewJob* j = <_FewJob*>ctx
    cdef int r0 = <int>c * j.chunk
    cdef int r1 = min(j.N, r0 + j.chunk)
    cdef int s0, s1, t, K = j.K
    s0 = r0
    while s0 < r1:
        s1 = min(r1, s0 + j.sub)
        for t in range(j.T):
            if j.use16[t] and not ster_is_half(j.typ):
                ster_matvec16_range(j.typ, j.W, j.rb, j.rows, s0, s1, K, j.q + <size_t>t * K, j.dx + <size_t>t * (K // 32),
                                    j.xs16 + <size_t>t * (K // 16), j.Y + <size_t>t * j.N, j.simd)
            else:
                ster_matvec_range(j.typ, j.W, j.rb, j.rows, s0, s1, K, j.X + <size_t>t * K,
                                  j.xs16 + <size_t>t * (K // 16), j.Y + <size_t>t * j.N, j.simd,
                                  j.xbf + <size_t>t * 2 * K if j.xbf != NULL else NULL)
        s0 = s1


cdef void _panel_task(void* ctx, long c, int tid) noexcept nogil:
    cdef _PanelJob* j = <_PanelJob*>ctx
    cdef int n0 = <int>c * j.nc
    ster_matmul_range(j.typ, j.W, j.rb, j.rows, n0, min(j.N, n0 + j.nc), j.K, j.X, j.T, j.Y, j.N,
                      j.pack + j.per_thread * tid, j.simd, j.Xb)


def pool_stats() -> dict:
    """Counters of the thread pool since the process started (diagnostics for benchmarks):
    jobs shared out, jobs run alone while helpers were not getting a core, and the calling
    thread's seconds on its own chunks and waiting for helpers' chunks."""
    cdef long v[4]
    ster_pool_stats(v)
    return {"jobs": v[0], "alone": v[1], "caller_work_s": v[2] / 1e9, "caller_wait_s": v[3] / 1e9}


def set_threads(n):
    """Threads for every product from now on (``--threads``); 1 <= n <= MAX_THREADS."""
    global _threads
    if not 1 <= n <= MAX_THREADS:
        raise ValueError(f"threads must be from 1 to {MAX_THREADS}, got {n}")
    _threads = n


def get_threads() -> int:
    """Threads the products use (default: $STER_THREADS, else every core)."""
    return _threads


def simd_available() -> bool:
    """True if this CPU runs the AVX2/FMA kernels."""
    return bool(_simd_ok)


def cpu_simd_level() -> str:
    """The highest of ``SIMD_LEVELS`` this CPU runs (AVX2 = AVX2 + FMA + F16C; avx512 = AVX-512
    F/BW/VL/DQ; then + AVX512_VNNI; then + AVX512_BF16; then + AMX-TILE and AMX-BF16, which Linux grants
    this process on request), at most $STER_SIMD_LEVEL."""
    return SIMD_LEVELS[_simd_ok]


def simd_level() -> str:
    """The level the kernels use now (``set_simd_level``)."""
    return SIMD_LEVELS[_simd]


def set_simd(bint on):
    """Use the best kernels this CPU runs (on) or force the portable path (tests)."""
    global _simd
    _simd = _simd_ok if on else 0


def set_simd_level(level) -> str:
    """Use kernels up to ``level`` (a name of ``SIMD_LEVELS`` or its index), capped at what the
    CPU runs: tests force each path with the ones above it off. Returns the level in use.
    Raises ValueError for an unknown level."""
    global _simd
    n = SIMD_LEVELS.index(level) if isinstance(level, str) else int(level)
    if not 0 <= n < len(SIMD_LEVELS):
        raise ValueError(f"unknown SIMD level {level!r}; one of {', '.join(SIMD_LEVELS)}")
    _simd = min(n, _simd_ok)
    return SIMD_LEVELS[_simd]


def split_bf16(const float[::1] x):
    """The input the AVX512_BF16 row dots multiply: (hi, lo) float32 [K], each a bfloat16
    value, hi = bf16(x) and lo = bf16(x - hi) (round to nearest even), or None when x has
    inf/NaN (those products run in float32)."""
    cdef int K = x.shape[0]
    hi = np.empty(K, np.uint16)
    lo = np.empty(K, np.uint16)
    cdef uint16_t[::1] hv = hi
    cdef uint16_t[::1] lv = lo
    if K and not ster_split_bf16(&x[0], K, &hv[0], &lv[0]):
        return None
    return ((hi.astype(np.uint32) << 16).view(np.float32), (lo.astype(np.uint32) << 16).view(np.float32))


def set_interleave(bint on):
    """Whether ``QMatrix`` objects built from now on store Q4_0 / Q4_1 / Q8_0 / Q4_K rows interleaved
    in groups of 16 (``cython/ster_il16.h``; the default, on CPUs with AVX2), whose decode
    products take 16 rows per vector. Off: the rows as given (for tests and A/B benchmarks)."""
    global _interleave
    _interleave = on


def set_background_copies(bint on) -> bool:
    """Whether the interleaved copies of ``QMatrix`` objects built from now on are queued for the
    background thread (the default) or each made by its matrix's first one-token product (tests
    that need a copy not yet made; A/B benchmarks). Returns the previous setting."""
    global _background_copies
    previous = bool(_background_copies)
    _background_copies = on
    return previous


def set_bf16_inputs(bint on):
    """Whether products of a bfloat16 matrix over several tokens (prefill, routed experts) round
    their float32 inputs to bfloat16 and multiply with AVX512_BF16's vdpbf16ps, or at level amx_bf16
    with AMX's tdpbf16ps when the row length is a multiple of 32, as llama.cpp does for its BF16 tensors
    and transformers for a bf16 model; at amx_bf16 a block-quantized matrix's too (``set_quantized_tiles``;
    float32 and float16 matrices keep float32 inputs). On by default where that is faster than the float32
    tile (AMD's
    AVX512_BF16 cores: twice the products per instruction at an FMA's rate; Intel's with AMX; not Intel's
    without, where vdpbf16ps issues at half an FMA's rate: ``ster_cpu_fast_bf16_dot``), or as
    $STER_BF16_INPUTS says. Off, or below avx512_bf16: float32 inputs on the float32 tile.
    The one-token products keep 16 of the inputs' 24 bits either way (``split_bf16``).
    On this path subnormal inputs (|x| < 2^-126), products and partial sums count as zero, as the
    instructions define them (an error of at most ~1e-38 per term). Returns the setting before."""
    global _bf16_inputs
    before = bool(_bf16_inputs)
    _bf16_inputs = 1 if on else 0
    return before


cdef long _bf16_rounded = 0


def bf16_rounded_products() -> int:
    """How many products so far (in this process) rounded their inputs to bfloat16: a run that
    wants to say whether its numbers went through ``set_bf16_inputs``'s rounding compares it
    before and after."""
    return _bf16_rounded


def bf16_inputs() -> bool:
    """Whether a bfloat16 matrix's several-token products run on bfloat16 inputs now (the switch
    of ``set_bf16_inputs`` and a CPU with AVX512_BF16, not capped by ``set_simd_level``)."""
    return bool(_bf16_inputs and _simd >= 4)


cdef inline bint _rounds_inputs(int type_id, int K) noexcept:
    """Whether a several-token product of a matrix of GGML type ``type_id`` with rows of K rounds its inputs
    to bfloat16 now (``set_bf16_inputs``): a bfloat16 matrix's from avx512_bf16 on; at amx_bf16 a block
    type's too whose rows fill AMX's tiles (K a multiple of 32), its panels decoded and rounded
    (``set_quantized_tiles``). Float32 and float16 matrices keep float32 inputs."""
    if not _bf16_inputs or _simd < 4:
        return False
    return type_id == 30 or (_quant_tiles and _simd >= 5 and type_id not in (0, 1) and K % 32 == 0)


def set_quantized_tiles(bint on) -> bool:
    """Whether a block-quantized matrix's several-token products (prefill, routed experts) run on AMX's
    tiles at level amx_bf16 while ``set_bf16_inputs`` is on (both are, by default, on such a CPU): each
    panel of weights decoded to float32 as the float32 tile's are, rounded to bfloat16 (nearest even, a
    relative change of at most 2^-9 per weight), and multiplied by the inputs rounded likewise. On the
    two real GGUF files (SmolLM2 Q4_1, Gemma 3 Q4_K_M) a prompt's logits move 0.5-0.7 % from the
    dequantized model's (tests/test_real_models.py), where llama.cpp's 8-bit rounding of its inputs
    moves them 3-5 %; the prompt runs about twice as fast. Off: the float32 tile on float32 inputs, the
    dequantized model's sums (``float_activations`` turns it off with the rest). Returns the setting
    before."""
    global _quant_tiles
    before = bool(_quant_tiles)
    _quant_tiles = 1 if on else 0
    return before


cdef uint16_t* _round_inputs(int type_id, const float* x, int T, int K) except? NULL:
    """The bfloat16 copy of x [T, K] for ster_matmul_range's vdpbf16ps or AMX tile ([T, K + (K & 1)],
    64-byte aligned inside a malloc block whose address is stored in the word before it;
    ``_free_inputs`` frees it), or NULL when
    the float32 tile serves this product (``_rounds_inputs``)."""
    global _bf16_rounded
    if not _rounds_inputs(type_id, K):
        return NULL
    _bf16_rounded += 1
    cdef size_t n = <size_t>T * (K + (K & 1))
    cdef void* block = malloc(2 * n + 128)
    if block == NULL:
        raise MemoryError()
    cdef uintptr_t a = (<uintptr_t>block + 64 + 63) & ~(<uintptr_t>63)
    (<void**>(a - sizeof(void*)))[0] = block
    with nogil:
        ster_round_inputs_bf16(x, T, K, <uint16_t*>a)
    return <uint16_t*>a


cdef inline void _free_inputs(uint16_t* xb) noexcept:
    if xb != NULL:
        free((<void**>(<uintptr_t>xb - sizeof(void*)))[0])


def set_int16_activations(bint on):
    """Decode (T = 1) with int16-quantized inputs (default, AVX2 only) or in float32 (exact).
    Returns the setting before."""
    global _int16
    before = bool(_int16)
    _int16 = 1 if on else 0
    return before


def enable_read_ahead(bint on):
    """Let idle helper threads prefetch the next matrices of a decode step (default on;
    see ``QMatrix.set_read_ahead``). Off is for measuring what it gains."""
    global _read_ahead
    _read_ahead = 1 if on else 0


def quantize_activations(const float[:, ::1] x):
    """The inputs the int16 decode kernels see: (q int16 [T, K], dx float32 [T, K // 32]) with
    x ~= dx[:, block] * q; K must be a multiple of 32. Raises ValueError on inf/NaN."""
    cdef int T = x.shape[0], K = x.shape[1], t
    if K % 32:
        raise ValueError("K must be a multiple of 32")
    q = np.empty((T, K), np.int16)
    dx = np.empty((T, K // 32), np.float32)
    xs = np.empty((T, K // 16), np.float32)
    cdef int16_t[:, ::1] qv = q
    cdef float[:, ::1] dv = dx
    cdef float[:, ::1] sv = xs
    for t in range(T):
        if K and not ster_quantize16(&x[t, 0], K, &qv[t, 0], &dv[t, 0], &sv[t, 0]):
            raise ValueError("inputs are not finite")
    return q, dx


def supported_type_ids():
    """GGML type ids these kernels multiply."""
    return tuple(t for t in range(64) if ster_block_size(t))


cdef class QMatrix:
    """A GGML-quantized matrix [rows, cols] in place, with an optional output-row order.

    Args:
        raw: uint8 [n_raw_rows, row_bytes], C-contiguous (may be read-only: a view of the map).
        type_id: GGML type id (one of ``supported_type_ids()``).
        cols: weights per row (a whole number of blocks).
        rows: int32-convertible [rows] or None: output i is raw row ``rows[i]`` (a gather
            of rows, e.g. to undo llama.cpp's q/k permutation without copying the weights).
        interleave: None follows ``set_interleave`` (on by default); False keeps the rows
            where they are. ``raw`` must not change while the matrix lives: it may be read by
            a background copy at any time before the first product. When on, a Q4_0 / Q4_1 /
            Q8_0 / Q4_K matrix of at least 16 rows on a CPU with AVX2 is copied into the 16-row
            interleaved layout of ``ster_il16.h`` (the row order applied), and once it exists
            its products read only that copy (``interleaved``). A background thread copies
            it while the rest of the model loads;
            a row-dot product that comes first makes it with the threads already on it (or alone,
            if none is), so every row-dot product of the matrix runs on it, while decoded panels
            read the rows where they are until the copy exists (the same bits either way).
        release: ``raw`` views a read-only file mapping: as they are copied, its whole pages
            are dropped from the resident set (madvise MADV_DONTNEED; the page cache keeps them
            and a later read, e.g. an embedding's row lookup, maps them again), so that a
            model's memory stays about its file size. Refused (ValueError) on a writable array.
    """

    cdef const uint8_t[:, ::1] raw
    cdef object _rows_arr
    cdef const int32_t* _rows
    # read-ahead: the matrices decoding multiplies next (see set_read_ahead)
    cdef object _ahead
    cdef int _hint_n
    cdef const char* _hint_ptr[4]
    cdef long _hint_len[4]
    cdef readonly int type_id, n_rows, n_cols
    # the type id the drivers see: type_id, with STER_IL when the rows are interleaved
    cdef int _kt
    cdef object _packed_rows      # the interleaved copy: a [rows, row_bytes] view of its buffer
    cdef bint _pending
    cdef bint _source_read     # a product read the source rows while the copy was pending
    cdef ster_il_job _job
    # what the copy reads and writes (source, row order, buffer), held by the job itself: the
    # garbage collector may clear this object's attributes before __dealloc__ cancels the job
    cdef PyObject* _job_keep
    cdef size_t row_bytes

    def __cinit__(self, raw, int type_id, int cols, rows=None, interleave=None, bint release=False):
        cdef int bs = ster_block_size(type_id)
        if bs == 0:
            raise ValueError(f"no quantized product for GGML type id {type_id}")
        if cols <= 0 or cols % bs:
            raise ValueError(f"{cols} columns are not a whole number of {bs}-weight blocks")
        self.raw = raw
        self.type_id, self.n_cols = type_id, cols
        self.row_bytes = <size_t>(cols // bs) * ster_type_size(type_id)
        if self.raw.shape[1] != <Py_ssize_t>self.row_bytes:
            raise ValueError(f"rows of {cols} weights take {self.row_bytes} bytes, the raw array has {self.raw.shape[1]}")
        if release and not memoryview(raw).readonly:
            # dropping the pages of memory the caller may write would zero it (anonymous memory)
            raise ValueError("release is for a read-only file mapping; this array is writable")
        self._rows = NULL
        self._rows_arr = None
        self._ahead = None
        self._hint_n = 0
        self.n_rows = self.raw.shape[0]
        if rows is not None:
            given = np.asarray(rows)
            if given.size and given.dtype.kind not in "iu":
                raise ValueError(f"row order must hold integers, got {given.dtype}")
            if given.size and (given.min() < 0 or given.max() >= self.raw.shape[0]):
                raise ValueError("row order must be a 1-D array of raw row indices")
            arr = np.ascontiguousarray(given, dtype=np.int32)
            if arr.ndim != 1 or (arr.size and (arr.min() < 0 or arr.max() >= self.raw.shape[0])):
                raise ValueError("row order must be a 1-D array of raw row indices")
            self._rows_arr = arr
            self.n_rows = arr.shape[0]
            if arr.shape[0]:
                self._rows = <const int32_t*><uintptr_t>arr.ctypes.data
        self._kt = type_id
        self._packed_rows = None
        self._source_read = 0
        self._pending = ((_interleave if interleave is None else interleave) and ster_cpu_avx2()
                         and ster_il_type(type_id) and self.n_rows >= STER_ILG and cols // bs <= STER_IL_MAX_BLOCKS)
        if self._pending:
            self._queue_copy(raw, release)

    cdef int _queue_copy(self, raw, bint release) except -1:
        # The interleaved copy's buffer (64-byte aligned; no page is touched before the copy),
        # and its job, queued for the background worker now (whatever its size: a model's small
        # matrices left to their first product cost a prompt's first token their copy).
        cdef int groups = (self.n_rows + STER_ILG - 1) // STER_ILG
        cdef size_t nbytes = <size_t>groups * STER_ILG * self.row_bytes
        buf = np.empty(nbytes + 64, np.uint8)
        cdef size_t skip = (-<Py_ssize_t>(<uintptr_t>cnp.PyArray_DATA(buf))) & 63
        self._packed_rows = buf[skip:skip + nbytes].reshape(groups * STER_ILG, self.row_bytes)
        keep = (raw, self._rows_arr, buf)
        Py_INCREF(keep)
        self._job_keep = <PyObject*>keep
        self._job.type, self._job.n_rows, self._job.release = self.type_id, self.n_rows, release
        self._job.src_rows = self.raw.shape[0]
        self._job.src, self._job.rb, self._job.rows = &self.raw[0, 0], self.row_bytes, self._rows
        self._job.dst = <uint8_t*>cnp.PyArray_DATA(buf) + skip
        self._job.state = STER_IL_IDLE
        if _background_copies:
            ster_il_submit(&self._job)
        return 0

    cdef inline int _prepare(self) except -1:
        # Every product calls this first: from then on the matrix is its interleaved copy
        # (waited for, or made here, if the worker has not finished it).
        if self._pending:
            with nogil:
                ster_il_finish(&self._job)
                if self._source_read and self._job.release:   # pages a product mapped again after the copy's release
                    ster_il_release(self._job.src, <size_t>self._job.src_rows * self.row_bytes)
            Py_XDECREF(self._job_keep)
            self._job_keep = NULL
            self.raw = self._packed_rows
            self._rows = NULL
            self._rows_arr = None
            self._kt = self.type_id | STER_IL
            self._pending = 0
        return 0

    def __dealloc__(self):
        if self._pending:   # the worker may be reading the source and writing the buffer
            with nogil:
                ster_il_cancel(&self._job)
        Py_XDECREF(self._job_keep)

    @property
    def interleaved(self) -> bool:
        """True when the rows are (or, from the first product on, will be) stored interleaved in
        groups of 16 (``set_interleave``)."""
        return bool(self._kt & STER_IL) or bool(self._pending)

    @property
    def copy_pending(self) -> bool:
        """True while the interleaved copy does not exist yet (queued, being made, or left to the
        first one-token product); False once it exists, or when the matrix makes none."""
        return bool(self._pending) and not ster_il_done(&self._job)

    def set_read_ahead(self, tuple following):
        """Name the (up to 4) matrices a decode step multiplies after this one. While a
        one-token product on this matrix runs, idle helper threads prefetch their blocks
        (``ster_pool.h`` read-ahead hints); arithmetic is unchanged. () clears it."""
        if len(following) > 4:
            raise ValueError("at most 4 matrices to read ahead")
        for m in following:
            <QMatrix?>m
        self._ahead = following  # keeps them (and their memory) alive; _hints reads where they are
        self._hint_n = len(following)

    cdef void _hints(self):
        # The read-ahead matrices' bytes where they are now (an interleaved copy moves them).
        cdef QMatrix m
        cdef int i
        for i in range(self._hint_n):
            m = <QMatrix>self._ahead[i]
            self._hint_ptr[i] = <const char*>&m.raw[0, 0] if m.raw.shape[0] and not m._pending else NULL
            self._hint_len[i] = <long>m.raw.shape[0] * <long>m.row_bytes if self._hint_ptr[i] != NULL else 0

    def matmul(self, x, out, int force=0):
        """out[T, rows] = x[T, cols] @ W^T (float32 ndarrays, C-contiguous; ``out`` is overwritten).

        force: 0 chooses by T (fused row dots for T = 1, decoded panels for T > 1);
        1 forces the row dots, 2 the panels (tests); 3: the row dots of every input row
        while each weight row is cached (``FEW_ROWS`` rows at most: each result equals
        the T = 1 product of that row, and the weights are read from memory once; for
        verifying a few drafted tokens, where decoded panels cost more than they save).
        """
        # numpy's C API instead of typed memoryviews: decoding makes hundreds of these calls
        # per token, and acquiring two buffers costs more than a small product.
        if not (cnp.PyArray_Check(x) and cnp.PyArray_Check(out)):
            raise TypeError("x and out must be numpy arrays")
        cdef cnp.ndarray xa = <cnp.ndarray>x
        cdef cnp.ndarray oa = <cnp.ndarray>out
        if (cnp.PyArray_TYPE(xa) != cnp.NPY_FLOAT32 or cnp.PyArray_TYPE(oa) != cnp.NPY_FLOAT32
                or cnp.PyArray_NDIM(xa) != 2 or cnp.PyArray_NDIM(oa) != 2
                or not cnp.PyArray_IS_C_CONTIGUOUS(xa) or not cnp.PyArray_IS_C_CONTIGUOUS(oa)
                or not cnp.PyArray_ISWRITEABLE(oa)
                or not cnp.PyArray_ISNOTSWAPPED(xa) or not cnp.PyArray_ISNOTSWAPPED(oa)):
            raise ValueError("x and out must be 2-D C-contiguous float32 arrays in this CPU's byte order "
                             "(out writable)")
        cdef int T = <int>cnp.PyArray_DIM(xa, 0), K = self.n_cols, N = self.n_rows
        if cnp.PyArray_DIM(xa, 1) != K:
            raise ValueError(f"input has {cnp.PyArray_DIM(xa, 1)} features, the matrix {K}")
        if cnp.PyArray_DIM(oa, 0) != T or cnp.PyArray_DIM(oa, 1) != N:
            raise ValueError(f"output must be [{T}, {N}], got [{cnp.PyArray_DIM(oa, 0)}, {cnp.PyArray_DIM(oa, 1)}]")
        if T == 0 or N == 0:
            return
        cdef bint panels = not (force == 3 or force == 1 or (force == 0 and T == 1))
        source = None
        if self._pending and panels and not ster_il_done(&self._job):
            # The copy is not made yet: decoded panels read the rows where they are, with the same bits as
            # from the copy (ster_il_row gives them back in this layout), so a prompt need not wait for it.
            # The rows and their order stay referenced here: another thread's one-token product may switch
            # the matrix to its copy (and drop them) while these panels run.
            source = (self.raw, self._rows_arr)
            self._source_read = 1
        else:
            self._prepare()
        cdef const float* xp = <const float*>cnp.PyArray_DATA(xa)
        cdef float* op = <float*>cnp.PyArray_DATA(oa)
        # the products read x while they write out: the two must not share a byte
        if <const char*>xp < <const char*>(op + <size_t>T * N) and <const char*>op < <const char*>(xp + <size_t>T * K):
            raise ValueError("x and out overlap in memory; pass an output array of its own")
        if force == 3 and T > 1:
            if T > _MAX_FEW:
                raise ValueError(f"force=3 takes at most {_MAX_FEW} rows, got {T}")
            self._few(xp, T, op)
        elif (force == 0 and T == 1) or force == 1 or force == 3:
            self._rowdots(xp, T, op)
        else:
            self._panels(xp, T, op)

    cdef int _rowdots(self, const float* x, int T, float* out) except -1:
        cdef int t
        cdef float* y
        for t in range(T):
            y = out + <size_t>t * self.n_rows
            _group_rowdots((self,), x + <size_t>t * self.n_cols, self.n_cols, &y)
        return 0

    cdef int _few(self, const float* x, int T, float* out) except -1:
        cdef int K = self.n_cols, N = self.n_rows, t
        cdef int nt = _threads if <long>N * K >= _PARALLEL_MIN_WEIGHTS else 1
        cdef _FewJob j
        j.typ, j.simd, j.K, j.N, j.T = self._kt, _simd, K, N, T
        j.W, j.rb, j.rows, j.X, j.Y = &self.raw[0, 0], self.row_bytes, self._rows, x, out
        # Tasks as the decode step's (about eight per thread); within one, blocks of rows of at
        # most 16 KiB stay in the first-level cache while every input row passes over them.
        j.chunk = _chunk_rows(N, K, nt, self._kt)
        j.sub = max(1, min(j.chunk, 16384 // <int>self.row_bytes))
        if self._kt & STER_IL:   # whole groups of 16 rows
            j.sub = max(STER_ILG, j.sub // STER_ILG * STER_ILG)
        cdef size_t per = 2 * K + 4 * (K // 32 + K // 16) + 64   # int16 codes, scales, sums (one row)
        cdef char* buf = <char*>malloc(per * T + 4 * K * T + 128)
        if buf == NULL:
            raise MemoryError()
        cdef int16_t* q = <int16_t*>buf
        cdef float* dx = <float*>(buf + 2 * K * T + 32)
        cdef float* xs16 = dx + (K // 32) * T
        cdef uint16_t* xbf = <uint16_t*>((<uintptr_t>(xs16 + (K // 16) * T) + 63) & ~(<uintptr_t>63))
        cdef int half = ster_is_half(self.type_id), ok = 1
        j.q, j.dx, j.xs16, j.xbf = q, dx, xs16, NULL
        with nogil:
            for t in range(T):
                j.use16[t] = 0
                if not half:
                    j.use16[t] = _simd and _int16 and ster_quantize16(x + <size_t>t * K, K, q + <size_t>t * K,
                                                                    dx + <size_t>t * (K // 32), xs16 + <size_t>t * (K // 16))
                    if not j.use16[t]:
                        ster_sums16(x + <size_t>t * K, K, xs16 + <size_t>t * (K // 16))
                elif self.type_id == 30 and _simd >= 4:
                    ok = ok and ster_split_bf16(x + <size_t>t * K, K, xbf + <size_t>t * 2 * K,
                                                xbf + <size_t>t * 2 * K + K)
            if half and self.type_id == 30 and _simd >= 4 and ok:
                j.xbf = xbf
            ster_pool_run((N + j.chunk - 1) // j.chunk, _few_task, &j, nt)
        free(buf)
        return 0

    cdef int _panels(self, const float* x, int T, float* out) except -1:
        return _run_panels(self._kt, &self.raw[0, 0], self.row_bytes, self._rows, self.n_cols, self.n_rows, x, T, out,
                           self.type_id)


cdef int _run_panels(int typ, const uint8_t* W, size_t rb, const int32_t* rows, int K, int N, const float* x, int T,
                     float* out, int type_id) except -1:
    """out[T, N] = x[T, K] times the N rows of W (type ``typ``: a block type, with STER_IL for interleaved
    rows, or STER_F32) through ster_matmul_range's decoded panels, on the pool. ``type_id`` decides whether
    the inputs are rounded to bfloat16 (``_round_inputs``)."""
    cdef int nt = _threads if <long>N * K * T >= _PARALLEL_MIN_WEIGHTS else 1
    cdef _PanelJob j
    j.typ, j.simd, j.K, j.N, j.T = typ, _simd, K, N, T
    j.W, j.rb, j.rows = W, rb, rows
    j.X, j.Y = x, out
    # Tasks of nc rows, a multiple of the register tile's outputs (32 at AVX-512, whose tile
    # takes two 16-row panels; else 16): about four per thread, up to 128 rows each.
    cdef int tile = 2 * STER_NR if _simd >= 2 else STER_NR
    cdef int nc = (N + 4 * nt - 1) // (4 * nt)
    j.nc = min(128, max(tile, (nc + tile - 1) // tile * tile))
    cdef long n_tasks = (N + j.nc - 1) // j.nc
    j.per_thread = <size_t>j.nc * STER_KC  # floats: nc/16 panels of STER_KC x 16
    cdef void* block = malloc(sizeof(float) * j.per_thread * nt + 64)
    if block == NULL:
        raise MemoryError()
    j.pack = <float*>((<uintptr_t>block + 63) & ~(<uintptr_t>63))
    try:
        j.Xb = _round_inputs(type_id, x, T, K)
    except MemoryError:
        free(block)
        raise
    with nogil:
        ster_pool_run(n_tasks, _panel_task, &j, nt)
    _free_inputs(<uint16_t*>j.Xb)
    free(block)
    return 0


def f32_matmul(x, w, out) -> None:
    """out = x @ w.T for float32 x [T, K], w [N, K] (a checkpoint's float32 weight, read in place) and
    out [T, N], through the decoded-panel register tile the quantized products use (ster_matmul_range
    with the weights' rows copied into its panels instead of decoded): each output the same sum, term
    by term over K in 256-input chunks, whatever rows share the call (row-exact). ``Linear`` uses it
    where numpy's OpenBLAS runs narrower kernels than this CPU has (``qlinear.f32_panels``).

    Raises:
        ValueError: arrays that are not float32, C-contiguous and in this CPU's byte order, or whose
            shapes do not fit ([T, K] x [N, K] -> [T, N]); an empty product is left as is.
    """
    cdef cnp.ndarray xa, wa, oa
    for name, a in (("x", x), ("w", w), ("out", out)):
        if (not cnp.PyArray_Check(a) or cnp.PyArray_TYPE(<cnp.ndarray>a) != cnp.NPY_FLOAT32
                or cnp.PyArray_NDIM(<cnp.ndarray>a) != 2 or not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>a)
                or not cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>a)):
            raise ValueError(f"f32_matmul: {name} must be a C-contiguous 2-D float32 array in this CPU's byte order")
    xa, wa, oa = <cnp.ndarray>x, <cnp.ndarray>w, <cnp.ndarray>out
    if not cnp.PyArray_ISWRITEABLE(oa):
        raise ValueError("f32_matmul: out must be writable")
    cdef Py_ssize_t T = cnp.PyArray_DIM(xa, 0), K = cnp.PyArray_DIM(xa, 1), N = cnp.PyArray_DIM(wa, 0)
    if cnp.PyArray_DIM(wa, 1) != K or cnp.PyArray_DIM(oa, 0) != T or cnp.PyArray_DIM(oa, 1) != N:
        raise ValueError(f"f32_matmul: x [T, K], w [N, K] and out [T, N] do not fit")
    if K > INT_MAX // 4 or N > INT_MAX or T > INT_MAX:
        raise ValueError("f32_matmul: dimensions past the kernels' int range")
    if T == 0 or N == 0:
        return
    if K == 0:
        out[...] = 0
        return
    _run_panels(STER_F32, <const uint8_t*>cnp.PyArray_DATA(wa), <size_t>K * 4, NULL, <int>K, <int>N,
                <const float*>cnp.PyArray_DATA(xa), <int>T, <float*>cnp.PyArray_DATA(oa), STER_F32)


def matvec_group(tuple mats, x, tuple outs):
    """Decode-step products of one input with several matrices in one pool job.

    mats: up to 4 ``QMatrix`` with the same number of columns K; x: float32 [1, K]
    (C-contiguous); outs: float32 [1, rows of mats[m]] per matrix (C-contiguous,
    overwritten). Equals ``mats[m].matmul(x, outs[m])`` for each m (same arithmetic,
    the input quantized once); what it saves is the per-call overhead and the threads'
    wake-ups between the products.
    """
    cdef int n = len(mats), m
    if n < 1 or n > _MAX_GROUP or len(outs) != n:
        raise ValueError(f"1 to {_MAX_GROUP} matrices, one output each")
    if not cnp.PyArray_Check(x):
        raise TypeError("x must be a numpy array")
    cdef cnp.ndarray xa = <cnp.ndarray>x
    if (cnp.PyArray_TYPE(xa) != cnp.NPY_FLOAT32 or cnp.PyArray_NDIM(xa) != 2 or cnp.PyArray_DIM(xa, 0) != 1
            or not cnp.PyArray_IS_C_CONTIGUOUS(xa) or not cnp.PyArray_ISNOTSWAPPED(xa)):
        raise ValueError("x must be a C-contiguous float32 array [1, K] in this CPU's byte order")
    cdef int K = <int>cnp.PyArray_DIM(xa, 1)
    cdef QMatrix w
    cdef cnp.ndarray oa
    cdef float* ys[_MAX_GROUP]
    for m in range(n):
        w = <QMatrix?>mats[m]
        oa = <cnp.ndarray?>outs[m]
        if w.n_cols != K:
            raise ValueError(f"matrix {m} has {w.n_cols} columns, the input {K}")
        if (cnp.PyArray_TYPE(oa) != cnp.NPY_FLOAT32 or cnp.PyArray_NDIM(oa) != 2 or cnp.PyArray_DIM(oa, 0) != 1
                or cnp.PyArray_DIM(oa, 1) != w.n_rows or not cnp.PyArray_IS_C_CONTIGUOUS(oa)
                or not cnp.PyArray_ISWRITEABLE(oa) or not cnp.PyArray_ISNOTSWAPPED(oa)):
            raise ValueError(f"output {m} must be a writable C-contiguous float32 array [1, {w.n_rows}] in this "
                             "CPU's byte order")
        ys[m] = <float*>cnp.PyArray_DATA(oa)
        if (<const char*>cnp.PyArray_DATA(xa) < <const char*>(ys[m] + w.n_rows)
                and <const char*>ys[m] < <const char*>cnp.PyArray_DATA(xa) + 4 * <size_t>K):
            raise ValueError(f"x and output {m} overlap in memory; pass an output array of its own")
    _group_rowdots(mats, <const float*>cnp.PyArray_DATA(xa), K, ys)


# Routed experts over a batch of tokens (prefill): every expert's decoded panels, one pool job.
ctypedef struct _ExpertJob:
    int simd, K, nc, n_sets
    int N[_MAX_GROUP]
    const uint8_t** W           # [set * n_exp + e]
    size_t* rb
    int* typ
    unsigned char* rounds       # whether matrix [set * n_exp + e] multiplies Xb (_rounds_inputs)
    const int32_t** rows
    const long* off             # [n_exp + 1] token rows of each expert
    long* task                  # (set * n_exp + e) * n_chunks + chunk
    int n_exp, n_chunks
    const float* X
    float* Y[_MAX_GROUP]
    float* pack
    size_t per_thread
    const uint16_t* Xb          # [R, K + (K & 1)] the rows in bfloat16 for the experts that round, or NULL


cdef void _expert_task(void* ctx, long c, int tid) noexcept nogil:
    cdef _ExpertJob* j = <_ExpertJob*>ctx
    cdef long t = j.task[c]
    cdef int chunk = <int>(t % j.n_chunks)
    cdef int me = <int>(t // j.n_chunks)          # set * n_exp + e
    cdef int s = me // j.n_exp, e = me % j.n_exp
    cdef long a = j.off[e]
    cdef int n0 = chunk * j.nc, N = j.N[s]
    ster_matmul_range(j.typ[me], j.W[me], j.rb[me], j.rows[me], n0, min(N, n0 + j.nc), j.K, j.X + a * j.K,
                      <int>(j.off[e + 1] - a), j.Y[s] + a * N, N, j.pack + j.per_thread * tid, j.simd,
                      j.Xb + a * (j.K + (j.K & 1)) if j.Xb != NULL and j.rounds[me] else NULL)


def expert_matmul(tuple sets, x, offsets, tuple outs, int min_tokens=2):
    """Routed experts' products over a batch of tokens grouped by expert, in one pool job.

    For each set s (up to 4: e.g. the experts' gate and up matrices) and each expert e with
    at least ``min_tokens`` rows, ``outs[s][a:b] = x[a:b] @ sets[s][e]^T`` where a, b =
    ``offsets[e]``, ``offsets[e + 1]``: the decoded panels of ``QMatrix.matmul(force=2)``,
    with the same arithmetic (each output's sum runs over the inputs in the same order
    whatever the tiling). Experts with fewer rows are left untouched (the caller multiplies
    one-token experts by the row dots, as ``QMatrix.matmul`` does for T = 1).

    Args:
        sets: tuples of ``QMatrix``, one per expert, all of one shape [N_s, K] within a set.
        x: float32 [R, K], C-contiguous: the tokens' rows sorted by expert.
        offsets: int64 [n_exp + 1], non-decreasing from 0 to R.
        outs: float32 [R, N_s] per set, C-contiguous, writable.
        min_tokens: experts with fewer rows are skipped (>= 1).

    Raises ValueError when the shapes do not fit.
    """
    cdef int n_sets = len(sets), s, e, c
    if n_sets < 1 or n_sets > _MAX_GROUP or len(outs) != n_sets:
        raise ValueError(f"1 to {_MAX_GROUP} sets of matrices, one output each")
    if min_tokens < 1:
        raise ValueError("min_tokens must be at least 1")
    cdef const float[:, ::1] xv = x
    cdef const long[::1] ov = np.ascontiguousarray(offsets, dtype=np.int64)
    cdef int n_exp = len(sets[0]), K = xv.shape[1]
    cdef long R = xv.shape[0]
    if ov.shape[0] != n_exp + 1 or ov[0] != 0 or ov[n_exp] != R:
        raise ValueError("offsets must be [n_experts + 1], from 0 to the number of rows")
    for e in range(n_exp):
        if ov[e + 1] < ov[e]:
            raise ValueError("offsets must not decrease")
    cdef _ExpertJob j
    cdef float[:, ::1] yv
    cdef QMatrix w
    j.simd, j.K, j.n_sets, j.n_exp = _simd, K, n_sets, n_exp
    keep = []
    for s in range(n_sets):
        if len(sets[s]) != n_exp:
            raise ValueError("every set holds one matrix per expert")
        yv = outs[s]
        keep.append(yv)
        j.Y[s] = &yv[0, 0] if yv.shape[0] and yv.shape[1] else NULL
        j.N[s] = (<QMatrix?>sets[s][0]).n_rows
        if yv.shape[0] != R or yv.shape[1] != j.N[s]:
            raise ValueError(f"output {s} must be [{R}, {j.N[s]}]")
        for e in range(n_exp):
            w = <QMatrix?>sets[s][e]
            w._prepare()
            if w.n_rows != j.N[s] or w.n_cols != K:
                raise ValueError(f"set {s}, expert {e}: [{w.n_rows}, {w.n_cols}], expected [{j.N[s]}, {K}]")
    if R == 0 or K == 0:
        return
    cdef int maxN = 0
    for s in range(n_sets):
        maxN = max(maxN, j.N[s])
    j.nc = 64                                  # rows per task (a multiple of the 16-row panels)
    j.n_chunks = (maxN + j.nc - 1) // j.nc
    cdef long work = 0, n_tasks = 0
    cdef int nt = 1
    cdef size_t nm = <size_t>n_sets * n_exp
    j.W = <const uint8_t**>malloc(sizeof(void*) * nm)
    j.rb = <size_t*>malloc(sizeof(size_t) * nm)
    j.typ = <int*>malloc(sizeof(int) * nm)
    j.rounds = <unsigned char*>malloc(nm)
    j.rows = <const int32_t**>malloc(sizeof(void*) * nm)
    j.task = <long*>malloc(sizeof(long) * nm * j.n_chunks + 8)
    j.off = &ov[0]
    j.X = &xv[0, 0]
    j.pack = NULL
    j.Xb = NULL
    cdef void* block = NULL
    cdef int any_bf16 = 0
    try:
        if j.W == NULL or j.rb == NULL or j.typ == NULL or j.rounds == NULL or j.rows == NULL or j.task == NULL:
            raise MemoryError()
        for s in range(n_sets):
            for e in range(n_exp):
                w = <QMatrix>sets[s][e]
                c = s * n_exp + e
                j.W[c], j.rb[c], j.typ[c], j.rows[c] = &w.raw[0, 0], w.row_bytes, w._kt, w._rows
                j.rounds[c] = _rounds_inputs(w.type_id, K)
                any_bf16 |= j.rounds[c]
        # tasks: the largest experts first (their chunks are the longest), each expert's chunks in turn
        counts = np.diff(np.asarray(ov))
        for e in np.argsort(-counts, kind="stable"):
            if counts[e] < min_tokens:
                continue
            for s in range(n_sets):
                for c in range((j.N[s] + j.nc - 1) // j.nc):
                    j.task[n_tasks] = (<long>(s * n_exp + e)) * j.n_chunks + c
                    n_tasks += 1
                work += <long>counts[e] * j.N[s] * K
        if n_tasks == 0:
            return
        nt = _threads if work >= _PARALLEL_MIN_WEIGHTS else 1
        j.per_thread = <size_t>j.nc * STER_KC
        block = malloc(sizeof(float) * j.per_thread * nt + 64)
        if block == NULL:
            raise MemoryError()
        j.pack = <float*>((<uintptr_t>block + 63) & ~(<uintptr_t>63))
        if any_bf16:
            j.Xb = _round_inputs(30, j.X, <int>R, K)
        with nogil:
            ster_pool_run(n_tasks, _expert_task, &j, nt)
    finally:
        _free_inputs(<uint16_t*>j.Xb)
        free(block)
        free(j.W)
        free(j.rb)
        free(j.typ)
        free(j.rounds)
        free(j.rows)
        free(j.task)


# Decode products of several matrices over several inputs (a token's chosen experts) in one job.
DEF _MAX_MULTI = 16

ctypedef struct _MultiJob:
    int n, simd
    int typ[_MAX_MULTI]
    int N[_MAX_MULTI]
    int K[_MAX_MULTI]
    int chunk[_MAX_MULTI]
    int use16[_MAX_MULTI]
    long first[_MAX_MULTI + 1]
    const uint8_t* W[_MAX_MULTI]
    size_t rb[_MAX_MULTI]
    const int32_t* rows[_MAX_MULTI]
    float* y[_MAX_MULTI]
    const float* x[_MAX_MULTI]
    const int16_t* q[_MAX_MULTI]
    const float* dx[_MAX_MULTI]
    const float* xs16[_MAX_MULTI]


cdef void _multi_task(void* ctx, long c, int tid) noexcept nogil:
    cdef _MultiJob* j = <_MultiJob*>ctx
    cdef int m = 0
    while c >= j.first[m + 1]:
        m += 1
    cdef int r0 = <int>(c - j.first[m]) * j.chunk[m]
    cdef int r1 = min(j.N[m], r0 + j.chunk[m])
    if j.use16[m] and not ster_is_half(j.typ[m]):   # 16-bit rows take the float input (as _group_task)
        ster_matvec16_range(j.typ[m], j.W[m], j.rb[m], j.rows[m], r0, r1, j.K[m], j.q[m], j.dx[m], j.xs16[m], j.y[m],
                            j.simd)
    else:
        ster_matvec_range(j.typ[m], j.W[m], j.rb[m], j.rows[m], r0, r1, j.K[m], j.x[m], j.xs16[m], j.y[m], j.simd,
                          NULL)


cdef int _multi_rowdots(tuple mats, const int* which, const float** xs, float** ys) except -1:
    """Decode products with inputs of their own: ys[m] = QMatrix mats[m] times xs[which[m]]
    (len(mats) <= _MAX_MULTI; the inputs' lengths are their matrices' columns), as
    ``_group_rowdots`` computes each (every distinct input quantized once), all in one pool job."""
    cdef int n = len(mats), m, i
    cdef QMatrix w
    cdef _MultiJob j
    cdef long weights = 0
    cdef size_t need = 64
    if n < 1 or n > _MAX_MULTI:
        raise ValueError(f"1 to {_MAX_MULTI} matrices")
    j.n, j.simd = n, _simd
    j.first[0] = 0
    for m in range(n):
        w = <QMatrix>mats[m]
        w._prepare()
        j.typ[m], j.N[m], j.K[m], j.W[m], j.rb[m], j.rows[m] = w._kt, w.n_rows, w.n_cols, &w.raw[0, 0], \
            w.row_bytes, w._rows
        j.y[m], j.x[m] = ys[m], xs[which[m]]
        weights += <long>w.n_rows * w.n_cols
        need += 2 * w.n_cols + 4 * (w.n_cols // 32 + w.n_cols // 16) + 64
    cdef int nt = _threads if weights >= _PARALLEL_MIN_WEIGHTS else 1
    for m in range(n):   # chunks as _group_rowdots cuts them
        j.chunk[m] = _chunk_rows(j.N[m], j.K[m], nt, j.typ[m])
        j.first[m + 1] = j.first[m] + (j.N[m] + j.chunk[m] - 1) // j.chunk[m]
    cdef char* buf = <char*>malloc(need)
    if buf == NULL:
        raise MemoryError()
    cdef char* p = buf
    with nogil:
        for m in range(n):
            for i in range(m):   # an input seen before: its quantized copy
                if which[i] == which[m]:
                    j.q[m], j.dx[m], j.xs16[m], j.use16[m] = j.q[i], j.dx[i], j.xs16[i], j.use16[i]
                    break
            else:
                j.q[m] = <int16_t*>p
                j.dx[m] = <float*>(p + 2 * j.K[m] + 32)
                j.xs16[m] = j.dx[m] + j.K[m] // 32
                p += 2 * j.K[m] + 4 * (j.K[m] // 32 + j.K[m] // 16) + 64
                j.use16[m] = _simd and _int16 and ster_quantize16(j.x[m], j.K[m], <int16_t*>j.q[m], <float*>j.dx[m],
                                                                  <float*>j.xs16[m])
                if not j.use16[m]:
                    ster_sums16(j.x[m], j.K[m], <float*>j.xs16[m])
        if j.first[n]:
            ster_pool_run(j.first[n], _multi_task, &j, nt)
    free(buf)
    return 0


cdef inline int _chunk_rows(int N, int K, int nt, int kt) noexcept nogil:
    # Rows per task of a decode product: about eight tasks per thread (a short tail when one
    # thread starts late), at most ~128k weights each (so big matrices still split finely), at
    # least 8 rows; whole groups of 16 for interleaved rows.
    cdef int c = max(8, min((N + 8 * nt - 1) // (8 * nt), max(16, 131072 // K)))
    if kt & STER_IL:
        c = (c + STER_ILG - 1) // STER_ILG * STER_ILG
    return c


cdef int _group_rowdots(tuple mats, const float* x, int K, float** ys) except -1:
    """The one driver of decode products: x float32 [K] times every QMatrix of ``mats``
    (same K, at most _MAX_GROUP) into ys[m] [rows of m]: the input quantized once, one pool
    job over all their rows, the last matrix's read-ahead hint posted first."""
    cdef int n = len(mats), m
    cdef QMatrix w
    cdef _GroupJob j
    cdef long weights = 0
    j.n, j.K, j.simd = n, K, _simd
    j.first[0] = 0
    for m in range(n):
        w = <QMatrix>mats[m]
        w._prepare()
        j.typ[m], j.N[m], j.W[m], j.rb[m], j.rows[m] = w._kt, w.n_rows, &w.raw[0, 0], w.row_bytes, w._rows
        j.y[m] = ys[m]
        weights += <long>w.n_rows * K
    cdef int nt = _threads if weights >= _PARALLEL_MIN_WEIGHTS else 1
    cdef int blocks = 0, bf16 = 0   # matrices of block types; of bfloat16 rows
    for m in range(n):
        if ster_is_half(j.typ[m]):
            bf16 |= j.typ[m] == 30
        else:
            blocks = 1
    for m in range(n):
        j.chunk[m] = _chunk_rows(j.N[m], K, nt, j.typ[m])
        j.first[m + 1] = j.first[m] + (j.N[m] + j.chunk[m] - 1) // j.chunk[m]
    # One scratch block: int16 inputs [K], their scales [K/32], sums [K/16], then the two
    # bfloat16 halves of the input [2K].
    cdef char* buf = <char*>malloc(2 * K + 4 * (K // 32 + K // 16) + 64 + 4 * K + 64)
    if buf == NULL:
        raise MemoryError()
    j.q = <int16_t*>buf
    j.dx = <float*>(buf + 2 * K + 32)
    j.xs16 = j.dx + K // 32
    j.x = x
    j.xbf = NULL
    j.use16 = 0
    cdef uint16_t* xbf = <uint16_t*>((<uintptr_t>(j.xs16 + K // 16) + 63) & ~(<uintptr_t>63))
    if nt > 1 and w._hint_n and _read_ahead:
        w._hints()
    with nogil:
        if blocks:
            j.use16 = _simd and _int16 and ster_quantize16(j.x, K, <int16_t*>j.q, <float*>j.dx, <float*>j.xs16)
            if not j.use16:
                ster_sums16(j.x, K, <float*>j.xs16)
        if bf16 and _simd >= 4 and ster_split_bf16(j.x, K, xbf, xbf + K):
            j.xbf = xbf
        if nt > 1 and w._hint_n and _read_ahead:  # the last matrix's read-ahead (what follows)
            ster_pool_hint(w._hint_n, w._hint_ptr, w._hint_len)
        if j.first[n]:
            ster_pool_run(j.first[n], _group_task, &j, nt)
    free(buf)
    return 0


# The decode products' driver, for the fused decode step of ster_py._kernels.ops (which
# passes tuples of QMatrix it has checked).
_group_capsule = PyCapsule_New(<void*>_group_rowdots, b"ster_group_rowdots", NULL)
_multi_capsule = PyCapsule_New(<void*>_multi_rowdots, b"ster_multi_rowdots", NULL)

# ster_py._kernels.SOURCE_VERSION these sources implement (see ster_py/_kernels/__init__.py).
SOURCE_VERSION = 14
