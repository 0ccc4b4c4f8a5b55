"""Named weight arrays from safetensors and GGUF files, memory-mapped.

``SafetensorsWeights`` indexes every tensor of a (possibly sharded) checkpoint by
reading only the file headers and maps the files: a tensor whose stored dtype is
the requested precision is a zero-copy view of the map (copy-on-write, so the file
is never modified); any other floating dtype is converted when asked for (float32,
float16 or bfloat16 via ml_dtypes); an integer or boolean tensor asked for is refused
by name. ``GGUFWeights`` does the same for GGUF files and keeps quantized matrices in
their blocks. Both remember what was asked for, so that ``unused_tensors`` can report
the stored tensors a model's configuration never reads.

safetensors layout (huggingface/safetensors docs): u64 little-endian header size N,
N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": ...},
then the data; offsets are relative to the end of the header.
"""
from __future__ import annotations

import functools
import json
import math
import mmap
import os
import stat
import struct
from pathlib import Path
from typing import Iterable

import numpy as np

from .decoder.qlinear import QUANT_TYPES, QuantStack, QuantTensor
from .errors import SterError

#: The precisions a model is held at: "auto" keeps every tensor as stored when float32, float16 or
#: bfloat16 and widens the others to float32 (``resident_dtype``); the others are one dtype each.
PRECISIONS = ("auto", "f32", "f16", "bf16")
#: Stored dtypes 'auto' keeps as they are (the kernels multiply 16-bit rows in place), by name.
KEPT_AS_STORED = ("float32", "float16", "bfloat16")


@functools.cache
def _ml_dtypes() -> dict[str, np.dtype]:
    """bfloat16 and the float8 kinds, numpy dtypes from ml_dtypes, imported on first use: a quantized
    GGUF's load needs none of them (the import was ~4 ms of it)."""
    import ml_dtypes

    return {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
            "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2)}


@functools.cache
def safetensors_dtypes() -> dict[str, np.dtype]:
    """safetensors dtype names -> numpy dtypes (little-endian)."""
    ml = _ml_dtypes()
    return {
        "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": ml["bfloat16"],
        "F8_E4M3": ml["float8_e4m3fn"], "F8_E5M2": ml["float8_e5m2"],
        "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
        "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
        "BOOL": np.dtype("?"),
    }


# Stored tensors no decoder role reads and that are safe to leave: rotary inverse-frequency
# buffers and the causal-mask buffers old GPT-2 / GPT-J / GPT-NeoX checkpoints saved.
HARMLESS_SUFFIXES = (".inv_freq", ".attn.bias", ".attn.masked_bias", ".attention.bias", ".attention.masked_bias",
                     # Transformers' MiniMax saves lightning attention's decay tables, which the layer's place
                     # and head count fix (decoder/lightning.py computes them)
                     ".self_attn.slope_rate", ".self_attn.query_decay", ".self_attn.key_decay",
                     ".self_attn.diagonal_decay")
# llama.cpp's rope_freqs and LongRoPE factors are read with the metadata (gguf/load.py), not as layer weights.
HARMLESS_NAMES = frozenset({"rope_freqs.weight", "rope_factors_short.weight", "rope_factors_long.weight"})


def _role_names(entry) -> tuple[str, ...]:
    return (entry,) if isinstance(entry, str) else tuple(entry)


class _Tracked:
    """Records the names asked for, so that the tensors nothing asked for can be reported."""

    _asked: set

    def _stored(self, name: str) -> str:
        return name

    def unused_tensors(self, spec) -> list[str]:
        """Stored tensors the decoder built from ``spec`` never asked for, sorted.

        Call after ``Decoder(spec, self)`` (it reads every tensor at construction).
        Leaves out the known-harmless ones (``HARMLESS_SUFFIXES``, ``HARMLESS_NAMES``), those under
        the spec's ``unread`` prefixes (multi-token-prediction modules) and,
        when the head is tied to the embedding, a stored head (a copy of the embedding is not used, as in
        Transformers; one that differs is the head), and tensors outside a wrapper's ``decoder_prefix`` (its vision tower
        and projector, never read), and a GGUF's multi-token-prediction blocks (``nextn_predict_layers``,
        run by no main pass). Anything else means the checkpoint holds weights this model
        configuration ignores: usually a config.json from another model or variant.
        """
        asked = {self._stored(n) for n in self._asked}
        if spec.tie_word_embeddings and "head" in spec.names:
            for head in _role_names(spec.names["head"]):
                root = spec.root or ""
                asked |= {self._stored(f"{head}.weight"), self._stored(f"{head.removeprefix(root)}.weight")}
        ours = spec.decoder_prefix or ""  # a wrapper's other towers are not this decoder's
        unread = tuple(spec.unread)
        return sorted(n for n in self.names() if n not in asked and n not in HARMLESS_NAMES
                      and not n.endswith(HARMLESS_SUFFIXES) and n.startswith(ours)
                      and not (unread and n.startswith(unread)))


def unused_tensor_warnings(spec, weights) -> list[str]:
    """One warning line for the stored tensors ``weights.unused_tensors(spec)`` lists, or none."""
    unused = weights.unused_tensors(spec)
    if not unused:
        return []
    shown = ", ".join(unused[:8]) + (f" and {len(unused) - 8} more" if len(unused) > 8 else "")
    return [f"the checkpoint holds {len(unused)} tensor(s) that a {spec.model_type} model with this "
            f"configuration does not use: {shown}; check that config.json belongs to these weights"]


def precision_dtype(precision: str) -> np.dtype | None:
    """'f32' | 'f16' | 'bf16' -> numpy dtype; 'auto' -> None (each tensor as stored, see
    ``resident_dtype``). Raises SterError for anything else."""
    if precision not in PRECISIONS:
        raise SterError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    if precision == "bf16":
        return _ml_dtypes()["bfloat16"]
    return {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16)}.get(precision)


def resident_dtype(precision: str, stored: np.dtype) -> np.dtype:
    """The dtype a floating tensor stored as ``stored`` is held at under ``precision``: that
    precision's dtype, or for 'auto' the stored dtype itself when it is float32, float16 or
    bfloat16 (no copy: a bf16 checkpoint stays bf16 in memory, and its matrices go to the
    16-bit kernels) and float32 for any other (float64, float8). Raises SterError for an
    unknown precision."""
    dtype = precision_dtype(precision)
    if dtype is not None:
        return dtype
    stored = np.dtype(stored)
    return stored if stored.isnative and stored.name in KEPT_AS_STORED else np.dtype(np.float32)


#: Largest safetensors JSON header read (the format's own limit is 100 MB; real headers are a
#: few MB for the biggest sharded checkpoints).
MAX_SAFETENSORS_HEADER = 100_000_000
#: Dimensions of one tensor: model weights have at most 5 (a video patch embedding's Conv3d);
#: numpy refuses arrays of over 64, which a header may claim.
MAX_SAFETENSORS_DIMS = 8


def _header_int(value, what: str, name: str) -> int:
    """A shape dimension or data offset: a JSON integer in 0 .. 2**63 - 1 (not a float,
    not Infinity, not a boolean)."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 63:
        raise ValueError(f"tensor {name[:200]!r} has {what} {str(value)[:40]}, which is not an integer "
                         f"from 0 to 2**63 - 1")
    return value


def read_safetensors_header(path: Path, m=None) -> tuple[int, dict[str, tuple[str, tuple[int, ...], int, int]]]:
    """Parse and validate one safetensors file's header without trusting it.

    Returns (data start, {name: (dtype name, shape, begin, end)}) with ``begin``/``end``
    relative to the data start. Every dimension and offset is a JSON integer below 2**63,
    the element count (an exact Python product, no int64 wrap) times the dtype's size is
    ``end - begin``, every range lies inside the file, and no two tensors' bytes overlap
    (what the safetensors library also refuses), and ``__metadata__`` is null or an object of
    strings (likewise), so ``inspect`` and loading agree.

    Raises ValueError / OSError with the reason (the caller wraps it in a SterError).
    """
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        size = st.st_size
        if size < 8:
            raise ValueError(f"the file is {size} bytes, too short for a safetensors header")
        (n,) = struct.unpack("<Q", f.read(8))
        if n > size - 8:
            raise ValueError(f"the header claims {n} bytes but the file has {size - 8} after its length")
        if n > MAX_SAFETENSORS_HEADER:
            raise ValueError(f"the header claims {n} bytes; ster reads headers of at most {MAX_SAFETENSORS_HEADER}")
        raw = f.read(n) if m is None else bytes(m[8:8 + n])
    try:
        header = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ValueError("its JSON header is nested too deeply") from None
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    base, index, spans = 8 + n, {}, []
    for name, info in header.items():
        if name == "__metadata__":
            # a map of strings or null, as the safetensors library reads it (it refuses the rest)
            if info is not None and (not isinstance(info, dict)
                                     or not all(isinstance(v, str) for v in info.values())):
                raise ValueError(f"its __metadata__ {str(info)[:200]} is not an object of strings")
            continue
        if not isinstance(info, dict) or not isinstance(info.get("shape"), list) \
                or not isinstance(info.get("data_offsets"), list) or len(info["data_offsets"]) != 2 \
                or info.get("dtype") not in safetensors_dtypes():
            raise ValueError(f"tensor {name[:200]!r} has a malformed entry {str(info)[:200]}")
        dtype = info["dtype"]
        if len(info["shape"]) > MAX_SAFETENSORS_DIMS:
            raise ValueError(f"tensor {name[:200]!r} has {len(info['shape'])} dimensions; model weights have at most "
                             f"{MAX_SAFETENSORS_DIMS}")
        shape = tuple(_header_int(d, "a dimension", name) for d in info["shape"])
        begin, end = (_header_int(o, "a data offset", name) for o in info["data_offsets"])
        count = 1
        for d in shape:
            count *= d
        if not begin <= end <= size - base or end - begin != count * safetensors_dtypes()[dtype].itemsize:
            raise ValueError(f"tensor {name[:200]!r} ({dtype} {list(shape)[:8]}) has data offsets {begin}..{end}, "
                             f"which do not fit its size or the file")
        index[name] = (dtype, shape, begin, end)
        if end > begin:
            spans.append((begin, end, name))
    spans.sort()
    for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
        if begin < end:
            raise ValueError(f"tensors {first[:200]!r} and {second[:200]!r} share bytes (their data offsets "
                             "overlap)")
    return base, index


def _map_safetensors(path: Path) -> tuple[mmap.mmap, dict[str, tuple[np.dtype, tuple[int, ...], int]]]:
    """Map one file and parse its header: name -> (dtype, shape, absolute byte offset).

    Raises ValueError / OSError with the reason (the caller wraps it).
    """
    with open(path, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError("not a regular file")
        if os.fstat(f.fileno()).st_size < 8:
            raise ValueError(f"the file is {os.fstat(f.fileno()).st_size} bytes, too short for a safetensors header")
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    base, header = read_safetensors_header(path, m)
    return m, {name: (safetensors_dtypes()[dtype], shape, base + begin)
               for name, (dtype, shape, begin, _) in header.items()}


class SafetensorsWeights(_Tracked):
    """The tensors of one checkpoint, memory-mapped.

    Args:
        files: the checkpoint's .safetensors files (order does not matter; a name found
            in two files is refused).
        precision: dtype for floating tensors: 'f32', 'f16' or 'bf16', or 'auto' (each
            tensor as stored, see ``resident_dtype``). A tensor stored at that precision is
            returned as a view of the map (no copy, pages read on use); other floating
            tensors are converted on ``get``.

    Raises:
        SterError: a file cannot be opened as safetensors ("failed to map N model weight
            files"), or two files hold the same tensor name; ``get`` of a tensor stored
            as integers or booleans.
    """

    def __init__(self, files: Iterable[Path], precision: str = "f32"):
        self.dtype, self.precision = precision_dtype(precision), precision
        self._maps: list[mmap.mmap] = []
        self._where: dict[str, tuple[int, np.dtype, tuple[int, ...], int]] = {}
        self._asked: set[str] = set()
        files = [Path(f) for f in files]
        for n, path in enumerate(files):
            try:
                m, index = _map_safetensors(path)
            except (OSError, ValueError, UnicodeDecodeError, RecursionError) as e:
                why = "its JSON header is nested too deeply" if isinstance(e, RecursionError) else e
                raise SterError(f"failed to map {len(files)} model weight files: {path}: {why}; re-download "
                                "the file") from None
            self._maps.append(m)
            for name, (dtype, shape, offset) in index.items():
                if name in self._where:
                    raise SterError(f"tensor {name!r} is stored twice: in {files[self._where[name][0]]} "
                                    f"and in {path}; remove the stray shard")
                self._where[name] = (n, dtype, shape, offset)
        self.files = files

    def names(self) -> list[str]:
        """Every tensor name in the checkpoint."""
        return list(self._where)

    def release_pages(self) -> None:
        """Let the kernel drop the file pages read so far (``madvise(MADV_DONTNEED)`` on every
        map). Arrays viewing the maps stay valid: their pages are read from the file again
        on use. For after a pass that read everything once (quantizing on load); any change
        made in place to a mapped array is lost with its page."""
        for m in self._maps:
            if hasattr(mmap, "MADV_DONTNEED") and hasattr(m, "madvise"):
                m.madvise(mmap.MADV_DONTNEED)

    def get(self, name: str) -> np.ndarray | None:
        """The tensor ``name`` at the precision; None if absent.

        A tensor already at the precision is a writable copy-on-write view of the file.

        Raises:
            SterError: the tensor is stored as integers or booleans (but an index table,
                ``INTEGER_TABLES``, read as int64). Every weight the
                decoder reads is a float; ster runs no integer-quantized safetensors
                scheme (``families.gate`` refuses a quantization_config), so such a
                tensor is a mislabelled or foreign file, not something to compute with.
        """
        self._asked.add(name)
        entry = self._where.get(name)
        if entry is None:
            return None
        n, dtype, shape, offset = entry
        if name.endswith(INTEGER_TABLES) and dtype.kind in "iu":  # an index table, read as integers
            count = math.prod(shape)
            return np.frombuffer(self._maps[n], dtype=dtype, count=count, offset=offset).reshape(shape).astype(np.int64)
        if not _is_float(dtype):
            stored = next(k for k, v in safetensors_dtypes().items() if v == dtype)
            raise SterError(f"tensor {name!r} in {self.files[n]} is stored as {stored}, but ster needs "
                            "floating-point weights (F32, F16, BF16, F64, F8); the file is not a "
                            "full-precision checkpoint of this model")
        count = math.prod(shape)
        t = np.frombuffer(self._maps[n], dtype=dtype, count=count, offset=offset).reshape(shape)
        return t.astype(resident_dtype(self.precision, dtype), copy=False)


    def rounds_weights(self) -> bool:
        """Whether the precision holds some floating tensor the decoder read in a dtype that cannot
        keep all its values (float32 held as f16 or bf16, bf16 as f16 and the reverse): the model
        then differs from the stored one by that rounding."""
        for name in self._asked:
            entry = self._where.get(name)
            if entry is None or not _is_float(entry[1]):
                continue
            stored, held = entry[1], resident_dtype(self.precision, entry[1])
            if held.itemsize < stored.itemsize or (held.itemsize == stored.itemsize and held != stored):
                return True
        return False


#: Tensors stored as integers that are tables, not weights (DeepSeek-V4's hash routing ``tid2eid``).
INTEGER_TABLES = ("tid2eid",)


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype in _ml_dtypes().values()


def unpermute_qk(w, n_head: int):
    """Undo llama.cpp's q/k row reordering for adjacent-pair rotation.

    llama.cpp's converter (``LlamaModel.permute`` in convert_hf_to_gguf.py) stores each
    head's rows as (pair, half) instead of Hugging Face's (half, pair); this puts
    them back. w: [n_head * head_dim, in_features] (or [n_head * head_dim]) -> same shape.
    A ``QuantTensor`` is not copied: it gets the row order, so its product's outputs
    come out in Hugging Face order.

    Raises:
        SterError: ``w`` has more than two dimensions or its rows are not a multiple of
            2 * n_head (checked before any reshape).
    """
    rows = w.shape[0]
    if len(w.shape) > 2 or n_head < 1 or rows % (2 * n_head):
        raise SterError(f"a q/k projection of shape {list(w.shape)} cannot be split into {n_head} heads of "
                        "rotary pairs: llama.cpp stores it as [heads * head_dim, in] with an even head_dim. "
                        "The GGUF file is corrupt or does not match its metadata; re-convert the model")
    if isinstance(w, QuantTensor):
        order = np.arange(rows).reshape(n_head, rows // n_head // 2, 2).swapaxes(1, 2).reshape(-1)
        return w.permuted(order)
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class GGUFWeights(_Tracked):
    """The tensors of a GGUF file under llama.cpp's names.

    Quantized 2-D tensors (``QUANT_TYPES``: Q4_0 ... IQ4_XS, MXFP4) stay in the memory map as
    ``QuantTensor`` and 3-D expert stacks as ``QuantStack``, unless ``quantized`` is False;
    everything else (F32/F16/BF16 tensors,
    vectors, other block types) is dequantized at ``precision``.

    Args:
        gguf: an open ``ster_py.gguf.reader.GGUFFile``.
        precision: 'f32' | 'f16' | 'bf16' for the dequantized arrays; 'auto' keeps F16 and BF16
            tensors as stored (views of the map) and decodes the rest to float32.
        qk_heads: (num_attention_heads, num_key_value_heads) when the file's architecture
            had its q/k rows reordered by llama.cpp's converter (undone here), else None.
        qk_layers: layer index -> that layer's own (query heads, key/value heads) where they are not
            ``qk_heads`` (llama.cpp's deci converter reorders each layer's rows by its own counts).
        rename: optional map from the names the decoder asks for to GGUF tensor names
            (a "GGUF directory" asks under Hugging Face names).
        quantized: keep quantized matrices in their blocks (default); False dequantizes
            every tensor at load (the f32 reference path).

    ``get`` accepts ``name.weight`` / ``name.bias`` and returns None when absent.
    """

    def __init__(self, gguf, precision: str = "f32", qk_heads: tuple[int, int] | None = None,
                 rename: dict[str, str] | None = None, quantized: bool = True,
                 qk_layers: dict[int, tuple[int, int]] | None = None):
        self.dtype, self.qk_heads, self.rename = precision_dtype(precision), qk_heads, rename
        self.qk_layers = qk_layers or {}
        self.precision = precision
        self.quantized = quantized
        self.path = gguf.path
        # Only the tensor table is kept (its views keep the map alive), not the file object:
        # its metadata (a Gemma 3 vocabulary is ~30 MB of Python strings) can then be freed.
        self._tensors = dict(gguf.tensors)
        self._names = set(self._tensors)
        self._asked: set[str] = set()

    def names(self) -> list[str]:
        return sorted(self._names)

    def _stored(self, name: str) -> str:
        return self.rename.get(name, name) if self.rename is not None else name

    def get(self, name: str):
        self._asked.add(name)
        gname = self._stored(name)
        if gname not in self._names:
            return None
        t = self._tensors[gname]
        heads = None
        if self.qk_heads is not None and gname.endswith((".attn_q.weight", ".attn_k.weight", ".attn_q.bias",
                                                         ".attn_k.bias")):
            counts = self.qk_heads
            if self.qk_layers and gname.startswith("blk.") and gname.split(".")[1].isdigit():
                counts = self.qk_layers.get(int(gname.split(".")[1]), counts)
            heads = counts[0] if ".attn_q." in gname else counts[1]
            if len(t.shape) > 2 or heads < 1 or t.shape[0] % (2 * heads):  # before any byte is decoded
                raise SterError(f"{self.path}: tensor {gname!r} has shape {list(t.shape)}, which cannot be split "
                                f"into {heads} heads of rotary pairs (llama.cpp stores [heads * head_dim, in] with "
                                "an even head_dim); the file is corrupt or does not match its metadata. "
                                "Re-convert the model")
        if self.quantized and len(t.shape) == 2 and t.type_name in QUANT_TYPES:
            w = QuantTensor(t)
        elif self.quantized and len(t.shape) == 3 and t.type_name in QUANT_TYPES:
            return QuantStack(t)  # routed experts, [n_expert, rows, cols]
        elif self.dtype is None and t.type_name in ("F16", "BF16"):  # 'auto': as stored, a view
            w = t.raw.view(np.float16 if t.type_name == "F16" else _ml_dtypes()["bfloat16"]).reshape(t.shape)
        else:
            w = t.dequantize()
        if heads is not None:
            w = unpermute_qk(w, heads)
        return w if isinstance(w, QuantTensor) else w.astype(resident_dtype(self.precision, w.dtype), copy=False)
