"""Craft small GGUF files byte by byte, valid or deliberately broken, for the reader tests.

Independent of ster's reader (so a shared misunderstanding cannot hide) and of
gguf-py's writer (which refuses to write most broken files). The layout follows
llama.cpp's docs/gguf.md:

    magic | version u32 | n_tensors u64 | n_kv u64 | kv... | tensor infos... | pad | data
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR_FORMATS = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
                  BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}


def gstring(s: str | bytes, length: int | None = None) -> bytes:
    """u64 length + bytes; ``length`` overrides the stored length (to lie about it)."""
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b) if length is None else length) + b


def value_body(vtype: int, v, elem: int | None = None) -> bytes:
    """Encoding of a value without its type tag. Arrays: ``elem`` is the element type and
    ``v`` a list (for nested arrays, a list of (elem, list) pairs)."""
    if vtype in SCALAR_FORMATS:
        return struct.pack(SCALAR_FORMATS[vtype], v)
    if vtype == STRING:
        return gstring(v)
    if vtype == ARRAY:
        body = struct.pack("<IQ", elem, len(v))
        if elem == ARRAY:
            return body + b"".join(value_body(ARRAY, items, sub) for sub, items in v)
        return body + b"".join(value_body(elem, x) for x in v)
    raise ValueError(vtype)


def kv(key: str | bytes, vtype: int, v=None, elem: int | None = None, raw: bytes | None = None) -> bytes:
    """One metadata entry; ``raw`` replaces the encoded value (for broken values)."""
    return gstring(key) + struct.pack("<I", vtype) + (raw if raw is not None else value_body(vtype, v, elem))


def tensor_info(name: str, dims, ggml_type: int, offset: int) -> bytes:
    """One tensor info; ``dims`` innermost first, as stored."""
    return (gstring(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<IQ", ggml_type, offset))


@dataclass
class Craft:
    """A GGUF file under construction. ``build()`` returns its bytes.

    Tensors added with ``add_tensor`` get aligned offsets and their bytes in the data section;
    every count and field can be overridden to produce a broken file.
    """

    version: int = 3
    alignment: int = 32
    magic: bytes = b"GGUF"
    kvs: list = field(default_factory=list)
    infos: list = field(default_factory=list)
    blobs: list = field(default_factory=list)
    n_tensors: int | None = None
    n_kv: int | None = None
    _data_size: int = 0

    def add_kv(self, *args, **kwargs) -> "Craft":
        self.kvs.append(kv(*args, **kwargs))
        return self

    def add_tensor(self, name: str, data: bytes, dims, ggml_type: int, offset: int | None = None) -> "Craft":
        if offset is None:
            offset = -(-self._data_size // self.alignment) * self.alignment
        self.infos.append(tensor_info(name, dims, ggml_type, offset))
        self.blobs.append((offset, data))
        self._data_size = max(self._data_size, offset + len(data))
        return self

    def add_info(self, name: str, dims, ggml_type: int, offset: int) -> "Craft":
        """A tensor info only, no data (for offsets that point anywhere)."""
        self.infos.append(tensor_info(name, dims, ggml_type, offset))
        return self

    def build(self) -> bytes:
        head = self.magic + struct.pack("<IQQ", self.version,
                                        len(self.infos) if self.n_tensors is None else self.n_tensors,
                                        len(self.kvs) if self.n_kv is None else self.n_kv)
        head += b"".join(self.kvs) + b"".join(self.infos)
        head += b"\0" * (-len(head) % self.alignment)
        data = bytearray(self._data_size)
        for offset, blob in self.blobs:
            data[offset:offset + len(blob)] = blob
        return head + bytes(data)


def small_valid_file() -> tuple[bytes, dict]:
    """A small valid GGUF v3 file exercising all 13 value types, a nested array and three
    tensors (F32, F16, Q8_0). Returns (bytes, expected) where expected holds the values."""
    rng = np.random.default_rng(1)
    f32 = rng.standard_normal((2, 8)).astype(np.float32)
    f16 = rng.standard_normal((3, 4)).astype(np.float16)
    q8 = np.zeros((2, 34), np.uint8)  # 2 rows of one Q8_0 block: d = 0.5, codes -16..15
    q8[:, 0:2] = np.array([0.5], np.float16).view(np.uint8)
    q8[:, 2:] = np.arange(-16, 16, dtype=np.int8).view(np.uint8)
    c = Craft()
    c.add_kv("general.architecture", STRING, "llama")
    c.add_kv("test.u8", U8, 200).add_kv("test.i8", I8, -100).add_kv("test.u16", U16, 60000)
    c.add_kv("test.i16", I16, -30000).add_kv("test.u32", U32, 4_000_000_000).add_kv("test.i32", I32, -2_000_000_000)
    c.add_kv("test.f32", F32, 1.5).add_kv("test.bool", BOOL, True).add_kv("test.string", STRING, "héllo")
    c.add_kv("test.u64", U64, 2**63 + 5).add_kv("test.i64", I64, -(2**62)).add_kv("test.f64", F64, 0.1)
    c.add_kv("test.arr_i16", ARRAY, [1, -2, 3], elem=I16)
    c.add_kv("test.arr_str", ARRAY, ["a", "", "ü"], elem=STRING)
    c.add_kv("test.nested", ARRAY, [(U8, [1, 2]), (STRING, ["x"])], elem=ARRAY)
    c.add_tensor("a.weight", f32.tobytes(), (8, 2), 0)
    c.add_tensor("b.weight", f16.tobytes(), (4, 3), 1)
    c.add_tensor("c.weight", q8.tobytes(), (32, 2), 8)
    expected = {"f32": f32, "f16": f16.astype(np.float32),
                "q8": (np.arange(-16, 16, dtype=np.float32) * 0.5)[None].repeat(2, 0)}
    return c.build(), expected


def _skip_value(data: bytes, pos: int, vtype: int) -> int:
    """Offset after a value of ``vtype`` starting at ``pos``."""
    if vtype in SCALAR_FORMATS:
        return pos + struct.calcsize(SCALAR_FORMATS[vtype])
    if vtype == STRING:
        (n,) = struct.unpack_from("<Q", data, pos)
        return pos + 8 + n
    if vtype == ARRAY:
        elem, count = struct.unpack_from("<IQ", data, pos)
        pos += 12
        if elem in SCALAR_FORMATS:
            return pos + count * struct.calcsize(SCALAR_FORMATS[elem])
        for _ in range(count):
            pos = _skip_value(data, pos, elem)
        return pos
    raise ValueError(f"value type {vtype}")


_LAST_LAYOUT: list = []  # [(the bytes object, its layout)]: held, so its identity cannot be reused


def _layout(data: bytes):
    """(version, tensor count, [(key, raw kv bytes)], tensor-info bytes, alignment, data section) of a GGUF's
    bytes. The last file's is kept: tests edit one vocabulary (one bytes object) many times over, and
    parsing 150k token strings in Python costs ~0.7 s each time."""
    if _LAST_LAYOUT and _LAST_LAYOUT[0][0] is data:
        return _LAST_LAYOUT[0][1]
    layout = _parse_layout(data)
    _LAST_LAYOUT[:] = [(data, layout)]
    return layout


def _parse_layout(data: bytes):
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", data, 0)
    assert magic == b"GGUF" and version in (2, 3), (magic, version)
    pos = 24
    entries: list[tuple[str, bytes]] = []
    alignment = 32
    for _ in range(n_kv):
        (klen,) = struct.unpack_from("<Q", data, pos)
        key = data[pos + 8:pos + 8 + klen].decode("utf-8")
        (vtype,) = struct.unpack_from("<I", data, pos + 8 + klen)
        end = _skip_value(data, pos + 12 + klen, vtype)
        if key == "general.alignment":
            (alignment,) = struct.unpack_from("<I", data, pos + 12 + klen)
        entries.append((key, data[pos:end]))
        pos = end
    infos_start = pos
    for _ in range(n_tensors):
        (nlen,) = struct.unpack_from("<Q", data, pos)
        pos += 8 + nlen
        (ndim,) = struct.unpack_from("<I", data, pos)
        pos += 4 + 8 * ndim + 4 + 8
    infos = data[infos_start:pos]
    data_start = -(-pos // alignment) * alignment
    body = data[data_start:] if n_tensors else b""
    return version, n_tensors, entries, infos, alignment, body


def edit_metadata(data: bytes, changes: dict) -> bytes:
    """A valid GGUF file's bytes with metadata entries replaced, added or removed.

    ``changes`` maps a key to ``(vtype, value)`` or ``(ARRAY, items, elem)`` (the ``kv``
    arguments), or to None to remove the key. A replaced key keeps its place; new keys
    go last. Tensor infos and data are kept (the data section is re-aligned).
    """
    version, n_tensors, entries, infos, alignment, body = _layout(data)
    todo = dict(changes)
    out = []
    for key, raw in entries:
        if key in todo:
            change = todo.pop(key)
            if change is not None:
                out.append(kv(key, *change))
        else:
            out.append(raw)
    out += [kv(key, *change) for key, change in todo.items() if change is not None]
    head = struct.pack("<4sIQQ", b"GGUF", version, n_tensors, len(out)) + b"".join(out) + infos
    return head + b"\0" * (-len(head) % alignment) + body
