"""GGUF v3 writer: the reader (``reader.py``) in reverse.

Layout written (little-endian; llama.cpp ``docs/gguf.md``, ``ggml/src/gguf.cpp``)::

    "GGUF" | version 3 (u32) | tensor count (u64) | metadata count (u64)
    per key:    key (u64 length + UTF-8) | value type (u32) | value
    per tensor: name | n_dims (u32) | dims innermost first (u64 each) | ggml type (u32) | offset (u64)
    zero padding to ``general.alignment``, then the data section: each tensor's bytes at its
    offset (relative to the section, a multiple of the alignment), zero-padded to the next.

Tensors are produced one at a time by their ``data`` callables and streamed to a temporary
file beside the target, which is renamed onto it only when everything is written (a failed or
interrupted write leaves nothing at the target). Every size is known before any tensor is made,
so the header is written first and memory holds one tensor at a time.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..artifacts import atomic_outputs
from ..errors import SterError
from .quants import ggml_type, tensor_bytes
from .reader import (ARRAY, BOOL, F32, F64, I8, I16, I32, I64, MAGIC, MAX_DIMS, STRING, U8, U16, U32, U64,
                     VALUE_TYPE_NAMES)

VERSION = 3
DEFAULT_ALIGNMENT = 32

_SCALAR = {U8: "<u1", I8: "<i1", U16: "<u2", I16: "<i2", U32: "<u4", I32: "<i4", F32: "<f4", BOOL: "<u1",
           U64: "<u8", I64: "<i8", F64: "<f8"}
_BY_NAME = {name: i for i, name in enumerate(VALUE_TYPE_NAMES)}

Progress = Callable[[str, int, "int | None"], None]


@dataclass(frozen=True)
class Typed:
    """A metadata value with its GGUF type stated: ``type`` is a reader type name (``"uint32"``,
    ``"float32"``, ``"string"``, ``"bool"``, ...) or ``"array of <type>"``. Plain Python values are
    typed by ``infer_type``; this keeps a type a file had (re-quantizing a GGUF) or one llama.cpp
    expects (``int32`` token types)."""

    type: str
    value: Any


@dataclass(frozen=True)
class TensorEntry:
    """One tensor to write.

    Attributes:
        name: GGUF tensor name (``blk.0.attn_q.weight``).
        shape: numpy order (last axis = row; the file stores it reversed).
        type_name: GGML type of the bytes (``"F32"``, ``"Q4_K"``, ...).
        data: returns the tensor's raw bytes (uint8, exactly ``nbytes``) when the writer reaches it.
    """

    name: str
    shape: tuple[int, ...]
    type_name: str
    data: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.type_name, self.shape)


def infer_type(value: Any) -> str:
    """The GGUF type a plain value is written as: bool -> bool; int -> uint32 (int32 if negative,
    uint64 / int64 beyond 32 bits); float -> float32; str -> string; a list or tuple -> an array of
    its elements' type (ints as int32 as llama.cpp's converter writes token types, mixed
    int/float as float32); a numpy array -> an array of its dtype. Raises SterError otherwise."""
    if isinstance(value, Typed):
        return value.type
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        v = int(value)
        if 0 <= v < 2**32:
            return "uint32"
        if -2**31 <= v < 0:
            return "int32"
        return "uint64" if v >= 0 else "int64"
    if isinstance(value, (float, np.floating)):
        return "float32"
    if isinstance(value, str):
        return "string"
    if isinstance(value, np.ndarray):
        kind = {np.dtype("<u1"): "uint8", np.dtype("<i1"): "int8", np.dtype("<u2"): "uint16",
                np.dtype("<i2"): "int16", np.dtype("<u4"): "uint32", np.dtype("<i4"): "int32",
                np.dtype("<f4"): "float32", np.dtype("<u8"): "uint64", np.dtype("<i8"): "int64",
                np.dtype("<f8"): "float64", np.dtype("?"): "bool"}.get(value.dtype.newbyteorder("<")
                                                                       if value.dtype.byteorder == ">" else value.dtype)
        if kind is None or value.ndim != 1:
            raise SterError(f"cannot store a {value.ndim}-D numpy array of {value.dtype} in GGUF metadata")
        return f"array of {kind}"
    if isinstance(value, (list, tuple)):
        if all(isinstance(x, str) for x in value):
            return "array of string"
        if all(isinstance(x, (bool, np.bool_)) for x in value):
            return "array of bool"
        if all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) for x in value):
            return "array of int32"
        if all(isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))
               for x in value):
            return "array of float32"
    raise SterError(f"cannot store {type(value).__name__} {str(value)[:60]!r} in GGUF metadata")


def _string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _scalar(vtype: int, value: Any, key: str) -> bytes:
    dtype = np.dtype(_SCALAR[vtype])
    if vtype == BOOL:
        return b"\x01" if value else b"\x00"
    if dtype.kind in "ui":
        info = np.iinfo(dtype)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or \
                not info.min <= int(value) <= info.max:
            raise SterError(f"GGUF metadata {key}: {value!r} is not a {VALUE_TYPE_NAMES[vtype]}")
        return np.array(int(value), dtype=dtype).tobytes()
    return np.array(float(value), dtype=dtype).tobytes()


def encode_value(key: str, value: Any) -> bytes:
    """Value type (u32) and value bytes of one metadata entry (see ``infer_type`` and ``Typed``).

    Raises:
        SterError: an unknown type name, or a value that does not fit its type.
    """
    tname = infer_type(value)
    raw = value.value if isinstance(value, Typed) else value
    if tname.startswith("array of "):
        elem_name = tname[len("array of "):]
        if elem_name not in _BY_NAME or elem_name == "array":
            raise SterError(f"GGUF metadata {key}: unsupported array element type {elem_name!r}")
        elem = _BY_NAME[elem_name]
        items = list(raw) if not isinstance(raw, np.ndarray) else raw
        head = struct.pack("<IIQ", ARRAY, elem, len(items))
        if elem == STRING:
            return head + b"".join(_string(str(s)) for s in items)
        dtype = np.dtype(_SCALAR[elem])
        arr = np.asarray(items)
        if elem == BOOL:
            arr = arr.astype(bool)
        elif dtype.kind in "ui" and arr.size:
            if not np.issubdtype(arr.dtype, np.integer) and not (arr.dtype == bool):
                raise SterError(f"GGUF metadata {key}: an array of {elem_name} needs integers")
            info = np.iinfo(dtype)
            if arr.min() < info.min or arr.max() > info.max:
                raise SterError(f"GGUF metadata {key}: values outside {elem_name}")
        return head + np.ascontiguousarray(arr.astype(dtype)).tobytes()
    if tname not in _BY_NAME:
        raise SterError(f"GGUF metadata {key}: unknown type {tname!r}")
    vtype = _BY_NAME[tname]
    if vtype == STRING:
        return struct.pack("<I", STRING) + _string(str(raw))
    if vtype == ARRAY:
        raise SterError(f"GGUF metadata {key}: write arrays as 'array of <type>'")
    return struct.pack("<I", vtype) + _scalar(vtype, raw, key)


def _pad(n: int, alignment: int) -> int:
    return -n % alignment


def header_bytes(metadata: Mapping[str, Any], tensors: Sequence[TensorEntry], alignment: int) -> tuple[bytes, list[int]]:
    """The header (padded to ``alignment``) and each tensor's offset in the data section.

    Raises:
        SterError: ``encode_value``'s refusals, and text UTF-8 cannot encode (a lone surrogate), naming the key.
    """
    parts = [MAGIC, struct.pack("<IQQ", VERSION, len(tensors), len(metadata))]
    for key, value in metadata.items():
        try:
            parts.append(_string(key) + encode_value(key, value))
        except UnicodeEncodeError as e:   # was a traceback from ster convert, with nothing to say which text
            raise SterError(f"GGUF metadata {key} cannot be written: its text holds the lone surrogate "
                            f"U+{ord(e.object[e.start]):04X}, which UTF-8 cannot encode (an unpaired JSON \\ud800-style "
                            "escape in the model's files, or bytes that are not UTF-8 in an argument); fix the text it "
                            "comes from") from None
    offsets, offset = [], 0
    for t in tensors:
        dims = tuple(int(d) for d in reversed(t.shape)) or (1,)
        parts.append(_string(t.name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
                     + struct.pack("<IQ", ggml_type(t.type_name).id, offset))
        offsets.append(offset)
        offset += t.nbytes + _pad(t.nbytes, alignment)
    head = b"".join(parts)
    return head + b"\0" * _pad(len(head), alignment), offsets


def check_entries(metadata: Mapping[str, Any], tensors: Sequence[TensorEntry], alignment: int) -> None:
    """Refuse what llama.cpp's loader would refuse, before anything is produced or written.

    Raises:
        SterError: an alignment that is not a power of two; ``general.alignment`` disagreeing with
            it; an empty or duplicate tensor name, a name over 63 bytes (GGML_MAX_NAME), more than 4
            dimensions, or a row that is not whole blocks of its type.
    """
    if alignment <= 0 or alignment & (alignment - 1):
        raise SterError(f"GGUF alignment {alignment} must be a positive power of two")
    stated = metadata.get("general.alignment")
    if stated is not None:
        value = stated.value if isinstance(stated, Typed) else stated
        if int(value) != alignment:
            raise SterError(f"general.alignment {value} disagrees with the alignment {alignment} being written")
    seen: set[str] = set()
    for t in tensors:
        if not t.name or t.name in seen:
            raise SterError(f"tensor name {t.name!r} is empty or written twice")
        if len(t.name.encode("utf-8")) > 63:
            raise SterError(f"tensor name {t.name!r} is longer than llama.cpp's 63 bytes")
        if len(t.shape) > MAX_DIMS:
            raise SterError(f"tensor {t.name!r} has {len(t.shape)} dimensions; GGUF allows {MAX_DIMS}")
        seen.add(t.name)
        t.nbytes  # noqa: B018 - refuses a row that is not whole blocks


def write_gguf(path: str | os.PathLike, metadata: Mapping[str, Any], tensors: Iterable[TensorEntry], *,
               alignment: int = DEFAULT_ALIGNMENT, progress: Progress | None = None) -> Path:
    """Write a GGUF v3 file atomically.

    Args:
        path: the file to write (replaced if it exists, only once the new one is complete).
        metadata: key -> value, in file order (plain values typed by ``infer_type``, or ``Typed``).
            ``general.alignment`` is added when ``alignment`` is not the default 32 and missing.
        tensors: ``TensorEntry`` per tensor, in file order; each ``data()`` is called once, in
            order, and must return exactly its ``nbytes`` bytes.
        alignment: data alignment in bytes (a power of two; llama.cpp's default 32).
        progress: optional ``progress("write", bytes_done, total_bytes)``.

    Returns:
        The path written.

    Raises:
        SterError: a value or tensor that cannot be written (see ``check_entries``), a tensor whose
            data has the wrong size, or an OS error writing the file (nothing is left at ``path``).
    """
    path = Path(path)
    tensors = list(tensors)
    meta = dict(metadata)
    if alignment != DEFAULT_ALIGNMENT and "general.alignment" not in meta:
        meta["general.alignment"] = Typed("uint32", alignment)
    check_entries(meta, tensors, alignment)
    head, _ = header_bytes(meta, tensors, alignment)
    total = len(head) + sum(t.nbytes + _pad(t.nbytes, alignment) for t in tensors)
    done = 0
    # atomic_outputs turns an OSError here (a full disk) into one "cannot write" SterError, flushes the
    # temporary to the disk and removes it on any failure
    with atomic_outputs(path) as (tmp,):
        with open(tmp, "wb") as f:
            f.write(head)
            done = len(head)
            if progress:
                progress("write", done, total)
            for t in tensors:
                data = np.ascontiguousarray(t.data())
                if data.dtype != np.uint8:
                    data = data.view(np.uint8)
                if data.size != t.nbytes:
                    raise SterError(f"internal: tensor {t.name!r} ({t.type_name} {list(t.shape)}) produced "
                                    f"{data.size} bytes, expected {t.nbytes}")
                # f.write, not ndarray.tofile: tofile passes small arrays through a C stdio buffer whose failed
                # flush (ENOSPC) numpy never reports, leaving a short file that looks written. Hosts are little-endian.
                f.write(memoryview(data.reshape(-1)))
                f.write(b"\0" * _pad(t.nbytes, alignment))
                done += t.nbytes + _pad(t.nbytes, alignment)
                if progress:
                    progress("write", done, total)
    return path
