"""GGUF reader: memory-mapped, lazy, and strict about what it trusts.

Opening a file parses only the header (metadata key/values and tensor infos);
tensor data stays in the memory map and is handed out as zero-copy numpy views
on demand. Every count, length, dimension and offset read from the file is
checked against the bytes that remain and against sane limits before it is
used, so a truncated or hostile file ends in one SterError that names the field
at fault, never in a huge allocation, a hang or a crash.

Layout (GGUF v2 and v3, little-endian; llama.cpp ``docs/gguf.md`` and
``ggml/src/gguf.cpp``)::

    "GGUF" | version u32 | tensor_count u64 | kv_count u64
    kv_count x   key (u64 length + UTF-8) | value type u32 | value
    tensor_count x name | n_dims u32 | dims u64 x n_dims (innermost first) | ggml type u32 | offset u64
    padding to general.alignment (default 32), then the data section;
    each tensor's offset is relative to the data section and aligned.
"""
from __future__ import annotations

import mmap
import os
import stat
import struct
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ster_py.errors import SterError
from ster_py.gguf import quants

try:  # (the kernel reads lengths in the machine's byte order: little-endian hosts only)
    from ster_py._kernels.quants import gguf_strings as _kernel_strings
    if sys.byteorder != "little":
        _kernel_strings = None
except ImportError:  # kernels not built: the Python loop reads the strings
    _kernel_strings = None

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4               # GGML_MAX_DIMS
MAX_ARRAY_NESTING = 8      # arrays of arrays...: real files use none; bounds recursion
MAX_NESTED_ARRAYS = 1 << 12  # arrays inside arrays, in all (llama.cpp reads none): each costs a Python
                             # object ~38x the 12 bytes it takes in the file
MAX_NAME_BYTES = 1024      # keys and tensor names (llama.cpp itself caps tensor names at 63)
INT64_MAX = 2**63 - 1

# Metadata value types (gguf_type).
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
VALUE_TYPE_NAMES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool",
                    "string", "array", "uint64", "int64", "float64")
_SCALAR_DTYPES = {U8: "<u1", I8: "<i1", U16: "<u2", I16: "<i2", U32: "<u4", I32: "<i4", F32: "<f4",
                  BOOL: "<u1", U64: "<u8", I64: "<i8", F64: "<f8"}
_SCALAR_STRUCTS = {t: struct.Struct(f) for t, f in {
    U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B",
    U64: "<Q", I64: "<q", F64: "<d"}.items()}
_SCALAR_SIZES = {t: np.dtype(d).itemsize for t, d in _SCALAR_DTYPES.items()}
_U32 = struct.Struct("<I").unpack_from
_U64 = struct.Struct("<Q").unpack_from

_UINTS = frozenset({U8, U16, U32, U64})
_FLOATS = frozenset({F32, F64})

# Known keys -> (allowed value types, allowed array element types or None). Keys not listed
# are accepted with any type; these are the ones the loader and tokenizer rely on.
_KNOWN_KEYS: dict[str, tuple[frozenset, frozenset | None]] = {
    "general.alignment": (frozenset({U32}), None),
    "general.architecture": (frozenset({STRING}), None),
    "general.name": (frozenset({STRING}), None),
    "tokenizer.ggml.model": (frozenset({STRING}), None),
    "tokenizer.ggml.pre": (frozenset({STRING}), None),
    "tokenizer.chat_template": (frozenset({STRING}), None),
    "tokenizer.ggml.tokens": (frozenset({ARRAY}), frozenset({STRING})),
    "tokenizer.ggml.scores": (frozenset({ARRAY}), frozenset({F32})),
    "tokenizer.ggml.token_type": (frozenset({ARRAY}), frozenset({I32})),
    "tokenizer.ggml.merges": (frozenset({ARRAY}), frozenset({STRING})),
    "tokenizer.ggml.bos_token_id": (_UINTS, None),
    "tokenizer.ggml.eos_token_id": (_UINTS, None),
    "tokenizer.ggml.unknown_token_id": (_UINTS, None),
    "tokenizer.ggml.padding_token_id": (_UINTS, None),
    "tokenizer.ggml.add_bos_token": (frozenset({BOOL}), None),
    "tokenizer.ggml.add_eos_token": (frozenset({BOOL}), None),
}
# Keys "<arch>.<suffix>".
_KNOWN_SUFFIXES: dict[str, tuple[frozenset, frozenset | None]] = {
    ".block_count": (_UINTS, None),
    ".context_length": (_UINTS, None),
    ".embedding_length": (_UINTS, None),
    ".vocab_size": (_UINTS, None),
    ".rope.freq_base": (_FLOATS, None),
    ".attention.layer_norm_rms_epsilon": (_FLOATS, None),
}

_CORRUPT = "The file is truncated or corrupt: download it again (and check its SHA-256) or re-export it."


def _type_name(vtype: int, elem: int | None = None) -> str:
    name = VALUE_TYPE_NAMES[vtype] if 0 <= vtype < len(VALUE_TYPE_NAMES) else f"type {vtype}"
    if vtype == ARRAY and elem is not None:
        name += f" of {_type_name(elem)}"
    return name


def _expected_types(key: str) -> tuple[frozenset, frozenset | None] | None:
    if key in _KNOWN_KEYS:
        return _KNOWN_KEYS[key]
    if not key.startswith(("general.", "tokenizer.")):
        for suffix, spec in _KNOWN_SUFFIXES.items():
            if key.endswith(suffix) and key.count(".") == suffix.count("."):
                return spec
    return None


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file: its header entry and a zero-copy view of its bytes.

    Attributes:
        name: GGUF tensor name (``blk.0.attn_q.weight``).
        ggml_type: GGML type id; ``type_name`` its name (``Q4_K``).
        dims: dimensions as stored, innermost first (GGML ``ne``).
        shape: numpy order (``dims`` reversed): ``[rows, cols]`` for a matrix, last axis = row.
        offset: byte offset relative to the data section; ``nbytes`` its size.
        raw: uint8 [nbytes] read-only view into the memory map (no copy).
    """

    name: str
    ggml_type: int
    type_name: str
    dims: tuple[int, ...]
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    raw: np.ndarray = field(repr=False, compare=False)

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def row_bytes(self) -> int:
        """Bytes of one row (``shape[-1]`` weights)."""
        return quants.row_bytes(self.ggml_type, self.dims[0])

    @property
    def raw_rows(self) -> np.ndarray:
        """uint8 [n_rows, row_bytes] zero-copy view of the blocks, one row per line."""
        return self.raw.reshape(-1, self.row_bytes) if self.nbytes else self.raw.reshape(0, self.row_bytes)

    def dequantize(self, n_threads: int | None = None) -> np.ndarray:
        """float32 array of ``shape``, decoded by the Cython kernels (see ``quants.dequantize``).

        Raises SterError if ster cannot decode this tensor's type.
        """
        if self.name.endswith(quants.ID_TABLE_SUFFIXES) and self.type_name not in quants.TABLE_TYPE_NAMES:
            raise SterError(f"tensor {self.name!r} is stored as {self.type_name}; this table holds expert ids, which "
                            f"llama.cpp's converter writes and its graph reads as I32 only (an {self.type_name} "
                            "table stops llama.cpp's graph): the file is damaged or was not written by llama.cpp's "
                            "converter")
        if self.type_name in quants.TABLE_TYPE_NAMES:
            if not self.name.endswith(quants.ID_TABLE_SUFFIXES):   # its integers would be read as weights
                raise SterError(f"tensor {self.name!r} is stored as {self.type_name}, an integer type llama.cpp "
                                "uses only for id tables (such as DeepSeek-V4's ffn_gate_tid2eid); weights, norms "
                                "and biases are float or block-quantized types: the file is damaged or was not "
                                "written by llama.cpp's converter")
            return quants.integer_table(self.raw, self.ggml_type, self.shape)
        if not quants.GGML_TYPES[self.ggml_type].supported:
            raise SterError(f"tensor {self.name!r} has type {self.type_name} (id {self.ggml_type}), which ster "
                            f"cannot dequantize; supported: {', '.join(quants.SUPPORTED_TYPE_NAMES)}")
        return quants.dequantize(self.raw, self.ggml_type, self.shape, n_threads=n_threads)


class _Parser:
    """Bounds-checked little-endian reads from the map; every failure is a SterError."""

    def __init__(self, buf: mmap.mmap, size: int, path: str):
        self.buf, self.size, self.path, self.pos = buf, size, path, 0
        self.nested = 0  # arrays read inside other arrays so far

    def fail(self, what: str, hint: str = _CORRUPT) -> SterError:
        return SterError(f"{self.path}: invalid GGUF file: {what}. {hint}")

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(f"{what} needs {n} bytes at offset {self.pos}, but the file ends at {self.size}")

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64(self.buf, self.pos)
        self.pos += 8
        return v

    def string(self, what: str, limit: int | None = None) -> str:
        n = self.u64(f"length of {what}")
        if limit is not None and n > limit:
            raise self.fail(f"{what} is {n} bytes long (the limit is {limit})")
        self.need(n, f"{what} ({n} bytes)")
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what} is not valid UTF-8 ({e.reason} at byte {e.start})") from None

    def value(self, vtype: int, key: str, depth: int = 0) -> Any:
        if vtype in _SCALAR_STRUCTS:
            self.need(_SCALAR_SIZES[vtype], f"value of key {key!r}")
            (v,) = _SCALAR_STRUCTS[vtype].unpack_from(self.buf, self.pos)
            self.pos += _SCALAR_SIZES[vtype]
            return bool(v) if vtype == BOOL else v
        if vtype == STRING:
            return self.string(f"string value of key {key!r}")
        if vtype == ARRAY:
            return self.array(key, depth)
        raise self.fail(f"key {key!r} has value type {vtype}, which is not a GGUF type (0-12)")

    def array(self, key: str, depth: int) -> Any:
        if depth >= MAX_ARRAY_NESTING:
            raise self.fail(f"key {key!r} nests arrays more than {MAX_ARRAY_NESTING} deep")
        elem = self.u32(f"element type of array {key!r}")
        count = self.u64(f"element count of array {key!r}")
        if elem in _SCALAR_SIZES:
            min_size = _SCALAR_SIZES[elem]
        elif elem == STRING:
            min_size = 8
        elif elem == ARRAY:
            min_size = 12
        else:
            raise self.fail(f"array {key!r} has element type {elem}, which is not a GGUF type (0-12)")
        if count * min_size > self.size - self.pos:
            raise self.fail(f"array {key!r} claims {count} elements of {_type_name(elem)}, which cannot fit "
                            f"in the {self.size - self.pos} bytes left after offset {self.pos}")
        if elem in _SCALAR_DTYPES:
            # A read-only view into the map: no allocation however large the count claims to be.
            out = np.frombuffer(self.buf, dtype=_SCALAR_DTYPES[elem], count=count, offset=self.pos)
            self.pos += count * min_size
            return out != 0 if elem == BOOL else out
        if elem == STRING:
            return self.strings(key, count)
        self.nested += count
        if self.nested > MAX_NESTED_ARRAYS:
            raise self.fail(f"array {key!r} holds {count} arrays, and the file over {MAX_NESTED_ARRAYS} arrays "
                            "inside arrays in all; real files hold none (llama.cpp refuses any)")
        return [self.array(f"{key}[{i}]", depth + 1) for i in range(count)]

    def strings(self, key: str, count: int) -> list[str]:
        # The hot loop of opening a file (262k tokens for Gemma 3): the kernels read it when
        # built; a bad string sends us to the loop below, which words the error.
        if _kernel_strings is not None and count:
            out, end = _kernel_strings(self.buf, self.pos, count)
            if out is not None:
                self.pos = end
                return out
        # Locals only, one check per item; grown item by item (not preallocated from the
        # count), so memory follows the bytes actually parsed, never a hostile count.
        buf, size, p = self.buf, self.size, self.pos
        out: list[str] = []
        append = out.append
        for i in range(count):
            if p + 8 > size:
                self.pos = p
                raise self.fail(f"array {key!r}: length of string {i} of {count} runs past the end of the file")
            (n,) = _U64(buf, p)
            p += 8
            if n > size - p:
                self.pos = p
                raise self.fail(f"array {key!r}: string {i} of {count} claims {n} bytes at offset {p}, "
                                f"but the file ends at {size}")
            try:
                append(str(buf[p:p + n], "utf-8"))
            except UnicodeDecodeError as e:
                self.pos = p
                raise self.fail(f"array {key!r}: string {i} is not valid UTF-8 ({e.reason})") from None
            p += n
        self.pos = p
        return out


class GGUFFile:
    """A GGUF file, memory-mapped; the header is parsed and validated on open.

    Args:
        path: the ``.gguf`` file.
        allow_unsupported: if False (default), refuse a file holding any tensor whose
            GGML type ster cannot dequantize (IQ2_XXS, TQ1_0, ...). True opens it anyway
            (for inspection); ``tensor(name).dequantize()`` then refuses those tensors.

    Attributes:
        path, version (2 or 3), file_size, alignment (``general.alignment``, default 32),
        data_offset (absolute byte offset of the data section),
        metadata: key -> value (int / float / bool / str; numeric arrays as read-only numpy
            views into the map, arrays of strings as ``list[str]``, nested arrays as lists),
        metadata_types: key -> GGUF type name (``"uint32"``, ``"array of string"``),
        tensors: name -> GGUFTensor, in file order.

    Raises:
        SterError: the file is missing, unreadable, not GGUF, of an unsupported version,
            truncated or inconsistent (the message names the key or tensor at fault), or
            holds a tensor of an unknown or (unless allowed) unsupported type.
    """

    def __init__(self, path: str | os.PathLike, allow_unsupported: bool = False):
        self.path = os.fspath(path)
        try:
            if not stat.S_ISREG(os.stat(self.path).st_mode):  # a FIFO would block open()
                raise SterError(f"cannot open GGUF file {self.path}: not a regular file")
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    raise SterError(f"{self.path}: the file is empty, not a GGUF file. {_CORRUPT}")
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise SterError(f"cannot open GGUF file {self.path}: {getattr(e, 'strerror', None) or e}") from None
        self.file_size = size
        self._parse(allow_unsupported)

    # -- parsing --------------------------------------------------------------------------
    def _parse(self, allow_unsupported: bool) -> None:
        p = _Parser(self._map, self.file_size, self.path)
        if self.file_size < 4 or self._map[:4] != MAGIC:
            head = bytes(self._map[:4])
            raise p.fail(f"it starts with {head!r}, not the GGUF magic {MAGIC!r}",
                         "Is this really a .gguf file (safetensors and PyTorch checkpoints are not)?")
        p.pos = 4
        version = p.u32("version")
        if version not in SUPPORTED_VERSIONS:
            if version & 0xFFFF == 0 and (version >> 24) in SUPPORTED_VERSIONS:
                raise p.fail("it is a big-endian GGUF file", "ster reads little-endian GGUF only; "
                             "convert it with llama.cpp's gguf tools.")
            raise p.fail(f"GGUF version {version} is not supported (ster reads versions 2 and 3)",
                         "Re-convert the model with a current llama.cpp.")
        self.version = version
        n_tensors = p.u64("tensor count")
        n_kv = p.u64("metadata key/value count")
        # Lower bounds on entry sizes (a 1-byte key + type + 1-byte value; a 1-byte name, 1 dim).
        if n_kv * 14 + n_tensors * 33 > self.file_size - p.pos:
            raise p.fail(f"the header claims {n_kv} metadata entries and {n_tensors} tensors, "
                         f"which cannot fit in a {self.file_size}-byte file")

        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, str] = {}
        for i in range(n_kv):
            key = p.string(f"metadata key {i}", MAX_NAME_BYTES)
            if not key:
                raise p.fail(f"metadata key {i} is empty")
            if key in self.metadata:
                raise p.fail(f"metadata key {key!r} appears twice")
            vtype = p.u32(f"value type of key {key!r}")
            elem_at = p.pos
            value = p.value(vtype, key)
            elem = _U32(self._map, elem_at)[0] if vtype == ARRAY else None
            self._check_key_type(p, key, vtype, elem)
            self.metadata[key] = value
            self.metadata_types[key] = _type_name(vtype, elem)
        self._check_metadata(p)

        self.alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if self.alignment == 0 or self.alignment & (self.alignment - 1):
            raise p.fail(f"general.alignment is {self.alignment}; it must be a non-zero power of two")

        infos = []
        seen: set[str] = set()
        for i in range(n_tensors):
            name = p.string(f"name of tensor {i}", MAX_NAME_BYTES)
            if not name:
                raise p.fail(f"tensor {i} has an empty name")
            if name in seen:
                raise p.fail(f"tensor {name!r} appears twice")
            seen.add(name)
            infos.append(self._tensor_info(p, name))
        self.data_offset = -(-p.pos // self.alignment) * self.alignment

        self.tensors: dict[str, GGUFTensor] = {}
        unsupported = []
        for name, type_id, dims, offset, nbytes in infos:
            t = quants.GGML_TYPES[type_id]
            if offset % self.alignment:
                raise p.fail(f"tensor {name!r}: data offset {offset} is not a multiple of the alignment "
                             f"{self.alignment}")
            start = self.data_offset + offset
            if start > self.file_size or nbytes > self.file_size - start:
                raise p.fail(f"tensor {name!r} ({t.name}, {nbytes} bytes at offset {offset} of the data "
                             f"section, file offset {start}) extends past the end of the "
                             f"{self.file_size}-byte file")
            if not t.supported and t.name not in quants.TABLE_TYPE_NAMES:
                unsupported.append((name, t))
            raw = np.frombuffer(self._map, dtype=np.uint8, count=nbytes, offset=start)
            self.tensors[name] = GGUFTensor(name, type_id, t.name, dims, tuple(reversed(dims)),
                                            offset, nbytes, raw)
        # llama.cpp opens a file only when its tensors lie one after another in the listed order,
        # each starting where the one before ends, padded to the alignment (gguf_init_from_file).
        # Read as is, a tensor on another's bytes would silently run its weights; a gap or a
        # reordering means the file was damaged or written by something llama.cpp cannot read.
        expected, before = 0, None
        for t in self.tensors.values():
            if t.offset != expected:
                if before is not None and t.nbytes and t.offset < before.offset + before.nbytes:
                    raise p.fail(f"tensors {before.name!r} and {t.name!r} share bytes (tensor {t.name!r} starts at "
                                 f"offset {t.offset} of the data section, before {before.name!r} ends at "
                                 f"{before.offset + before.nbytes})")
                where = (f"where {before.name!r}, listed before it, ends, padded to the alignment {self.alignment}"
                         if before is not None else "the first tensor listed starts the data section")
                raise p.fail(f"tensor {t.name!r} starts at offset {t.offset} of the data section, not at {expected} "
                             f"({where}); llama.cpp reads only tensors stored one after another in the order "
                             "the file lists them")
            expected += -(-t.nbytes // self.alignment) * self.alignment
            before = t
        if unsupported and not allow_unsupported:
            name, t = unsupported[0]
            n_more = len(unsupported) - 1
            more = f" (and {n_more} more tensor{'s' if n_more > 1 else ''} of unsupported types)" if n_more else ""
            raise SterError(f"{self.path}: tensor {name!r} has type {t.name} (id {t.id}), which ster cannot "
                            f"dequantize{more}. Supported types: {', '.join(quants.SUPPORTED_TYPE_NAMES)}. "
                            "Use a GGUF file quantized to one of them (for example Q4_K_M or Q8_0).")

    def _tensor_info(self, p: _Parser, name: str) -> tuple:
        n_dims = p.u32(f"dimension count of tensor {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise p.fail(f"tensor {name!r} has {n_dims} dimensions (GGML allows 1 to {MAX_DIMS})")
        dims = tuple(p.u64(f"dimension {d} of tensor {name!r}") for d in range(n_dims))
        n = 1
        for d in dims:
            n *= d
        if any(d > INT64_MAX for d in dims) or n > INT64_MAX:
            raise p.fail(f"tensor {name!r} has dimensions {list(dims)} whose product overflows 64 bits")
        type_id = p.u32(f"type of tensor {name!r}")
        t = quants.GGML_TYPES.get(type_id)
        if t is None:
            raise p.fail(f"tensor {name!r} has GGML type id {type_id}, which is not a known type",
                         "It may come from a newer llama.cpp; ster cannot read it.")
        if dims[0] % t.block_size:
            raise p.fail(f"tensor {name!r}: its rows of {dims[0]} weights are not a whole number of "
                         f"{t.name} blocks ({t.block_size} weights each)")
        nbytes = n // t.block_size * t.type_size
        offset = p.u64(f"data offset of tensor {name!r}")
        return name, type_id, dims, offset, nbytes

    def _check_key_type(self, p: _Parser, key: str, vtype: int, elem: int | None) -> None:
        spec = _expected_types(key)
        if spec is None:
            return
        types, elems = spec
        if vtype not in types or (elems is not None and elem not in elems):
            want = " or ".join(_type_name(t, e) for t in sorted(types) for e in (sorted(elems) if elems else [None]))
            raise p.fail(f"key {key!r} has type {_type_name(vtype, elem)}, expected {want}")

    def _check_metadata(self, p: _Parser) -> None:
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        if tokens is None:
            return
        for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            other = self.metadata.get(key)
            if other is not None and len(other) != len(tokens):
                raise p.fail(f"{key} has {len(other)} entries but tokenizer.ggml.tokens has {len(tokens)}")

    # -- access ---------------------------------------------------------------------------
    @property
    def architecture(self) -> str | None:
        """``general.architecture`` (``"llama"``, ``"gemma3"``), or None if absent."""
        return self.metadata.get("general.architecture")

    def tensor_names(self) -> list[str]:
        """Tensor names in file order."""
        return list(self.tensors)

    def tensor(self, name: str) -> GGUFTensor:
        """The tensor called ``name``; SterError if the file has none."""
        if self._map is None:
            raise SterError(f"{self.path} is closed; open it again to read tensor {name!r}")
        try:
            return self.tensors[name]
        except KeyError:
            raise SterError(f"{self.path} has no tensor named {name!r} ({len(self.tensors)} tensors)") from None

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def __repr__(self) -> str:
        return (f"GGUFFile({self.path!r}, version={self.version}, architecture={self.architecture!r}, "
                f"{len(self.metadata)} keys, {len(self.tensors)} tensors)")

    def close(self) -> None:
        """Drop this object's references to the map; the map itself is unmapped once no
        tensor view still points into it."""
        self.tensors = {}
        self._map = None

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_gguf(path: str | os.PathLike, allow_unsupported: bool = False) -> GGUFFile:
    """Open and validate a GGUF file (see ``GGUFFile``)."""
    return GGUFFile(path, allow_unsupported=allow_unsupported)
