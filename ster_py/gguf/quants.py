"""GGML tensor types: the type table, and dequantization to float32.

Every GGML type stores a row of weights as a sequence of fixed-size blocks
(``block_size`` weights in ``type_size`` bytes); a row must be a whole number
of blocks. This module knows the size of every type llama.cpp defines (so the
GGUF reader can validate any file), and decodes the types ster supports:

    F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS MXFP4

``dequantize`` runs the Cython kernels (``ster_py._kernels.quants``, threaded
over blocks). ``dequantize_reference`` is the plain numpy reference the kernels
are tested against; it is written from the block layouts described below, one
gather table per type (weight index -> byte, bit shift, sub-block).

Source of the formats: llama.cpp ``ggml/src/ggml-common.h`` (block structs) and
``ggml-quants.c`` (``dequantize_row_*``), as restated by gguf-py's
``gguf/constants.py`` (``GGML_QUANT_SIZES``) and ``gguf/quants.py``. The
arithmetic is float32 in the same order as gguf-py, so results are bit-exact.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ster_py.errors import SterError

QK_K = 256  # weights per K-quant super-block


@dataclass(frozen=True)
class GGMLType:
    """One GGML tensor type: ``block_size`` weights stored in ``type_size`` bytes."""

    name: str
    id: int
    block_size: int
    type_size: int
    supported: bool  # ster can dequantize it


_SUPPORTED = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
              "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4"}

# (name, id, block_size, type_size), from ggml's type traits (gguf-py GGML_QUANT_SIZES).
_TABLE = [
    ("F32", 0, 1, 4), ("F16", 1, 1, 2), ("Q4_0", 2, 32, 18), ("Q4_1", 3, 32, 20),
    ("Q5_0", 6, 32, 22), ("Q5_1", 7, 32, 24), ("Q8_0", 8, 32, 34), ("Q8_1", 9, 32, 40),
    ("Q2_K", 10, 256, 84), ("Q3_K", 11, 256, 110), ("Q4_K", 12, 256, 144), ("Q5_K", 13, 256, 176),
    ("Q6_K", 14, 256, 210), ("Q8_K", 15, 256, 292), ("IQ2_XXS", 16, 256, 66), ("IQ2_XS", 17, 256, 74),
    ("IQ3_XXS", 18, 256, 98), ("IQ1_S", 19, 256, 50), ("IQ4_NL", 20, 32, 18), ("IQ3_S", 21, 256, 110),
    ("IQ2_S", 22, 256, 82), ("IQ4_XS", 23, 256, 136), ("I8", 24, 1, 1), ("I16", 25, 1, 2),
    ("I32", 26, 1, 4), ("I64", 27, 1, 8), ("F64", 28, 1, 8), ("IQ1_M", 29, 256, 56),
    ("BF16", 30, 1, 2), ("TQ1_0", 34, 256, 54), ("TQ2_0", 35, 256, 66), ("MXFP4", 39, 32, 17),
    ("NVFP4", 40, 64, 36), ("Q1_0", 41, 128, 18),
]

GGML_TYPES: dict[int, GGMLType] = {
    tid: GGMLType(name, tid, bs, ts, name in _SUPPORTED) for name, tid, bs, ts in _TABLE
}
GGML_TYPE_IDS: dict[str, int] = {t.name: t.id for t in GGML_TYPES.values()}
SUPPORTED_TYPE_NAMES = tuple(t.name for t in GGML_TYPES.values() if t.supported)
#: Integer types read only as small tables, never as weights (DeepSeek-V4's hash routing ``ffn_gate_tid2eid``,
#: written as I32 by llama.cpp's converter): ``integer_table`` decodes them.
TABLE_TYPE_NAMES = ("I32",)
#: Tensors llama.cpp's graph uses as ids, which must be stored as I32: DeepSeek-V4's ``ffn_gate_tid2eid`` is read
#: by ``ggml_get_rows`` (I32 in, I32 out) and its rows index the experts (``ggml_get_rows`` / ``mul_mat_id``
#: assert I32 ids; an F32 table would stop llama.cpp's graph), so any other type is refused, as llama.cpp would.
ID_TABLE_SUFFIXES = ("ffn_gate_tid2eid.weight",)


def integer_table(raw: np.ndarray, ggml_type_id: int | str, shape: tuple[int, ...]) -> np.ndarray:
    """An I32 tensor's bytes as float32 ``shape`` (exact: small integers such as expert ids).

    Raises:
        SterError: another type, a byte count that does not match the shape, or a value beyond 2 ** 24 in
            magnitude (float32 could not hold it exactly).
    """
    t = ggml_type(ggml_type_id)
    if t.name not in TABLE_TYPE_NAMES:
        raise SterError(f"{t.name} is not an integer table type ({', '.join(TABLE_TYPE_NAMES)})")
    shape = tuple(int(s) for s in shape)
    flat = np.asarray(raw).reshape(-1)
    if flat.dtype != np.uint8 or any(s < 0 for s in shape) or flat.size != 4 * int(np.prod(shape, dtype=np.int64)):
        raise SterError(f"an I32 tensor of shape {list(shape)} needs {4 * int(np.prod(shape))} bytes, got "
                        f"{flat.size} {flat.dtype} values")
    values = np.ascontiguousarray(flat).view("<i4")
    if values.size and int(np.abs(values.astype(np.int64)).max()) > 1 << 24:
        raise SterError("an I32 tensor holds integers beyond 2**24 in magnitude; ster reads I32 tensors only as "
                        "small integer tables (expert ids)")
    return values.astype(np.float32).reshape(shape)


def ggml_type(type_id_or_name: int | str) -> GGMLType:
    """The table entry for a type id (int) or name (``"Q4_K"``).

    Raises SterError for an id or name that is not a GGML type.
    """
    if isinstance(type_id_or_name, str):
        tid = GGML_TYPE_IDS.get(type_id_or_name.upper())
        if tid is None:
            raise SterError(f"unknown GGML type name {type_id_or_name!r}; known: {', '.join(GGML_TYPE_IDS)}")
        return GGML_TYPES[tid]
    t = GGML_TYPES.get(int(type_id_or_name))
    if t is None:
        raise SterError(f"unknown GGML type id {type_id_or_name}; this build knows ids "
                        f"{sorted(GGML_TYPES)} (a newer llama.cpp may have added it)")
    return t


def row_bytes(type_id: int | str, n_cols: int) -> int:
    """Bytes of one row of ``n_cols`` weights of the given type.

    Raises SterError if ``n_cols`` is not a whole number of the type's blocks.
    """
    t = ggml_type(type_id)
    if n_cols < 0 or n_cols % t.block_size:
        raise SterError(f"a {t.name} row of {n_cols} weights is not a whole number of "
                        f"{t.block_size}-weight blocks")
    return n_cols // t.block_size * t.type_size


def tensor_bytes(type_id: int | str, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of numpy ``shape`` (last axis = row) of the given type."""
    n_rows = 1
    for s in shape[:-1]:
        n_rows *= int(s)
    return n_rows * row_bytes(type_id, int(shape[-1]) if shape else 1)


def _check(raw: np.ndarray, type_id: int | str, shape: tuple[int, ...]) -> tuple[GGMLType, np.ndarray, tuple]:
    t = ggml_type(type_id)
    if not t.supported:
        raise SterError(f"tensor type {t.name} (id {t.id}) cannot be dequantized by ster; "
                        f"supported types: {', '.join(SUPPORTED_TYPE_NAMES)}. Use a GGUF file "
                        "quantized with one of those.")
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise SterError(f"negative dimension in shape {shape}")
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raise SterError(f"raw tensor bytes must be a uint8 array, got {raw.dtype}")
    expected = tensor_bytes(t.id, shape)
    if raw.size != expected:
        raise SterError(f"{t.name} tensor of shape {shape} needs {expected} bytes, got {raw.size}")
    return t, raw.reshape(-1), shape


# ---------------------------------------------------------------------------
# Fast path: the Cython kernels.

def dequantize(raw: np.ndarray, ggml_type_id: int | str, shape: tuple[int, ...],
               n_threads: int | None = None) -> np.ndarray:
    """Decode raw GGML blocks into a float32 array.

    Args:
        raw: uint8 array holding exactly the tensor's blocks (any shape; C-contiguous
            is zero-copy, e.g. a view into a memory-mapped GGUF file).
        ggml_type_id: GGML type id (``GGML_TYPES``) or name.
        shape: the tensor's numpy shape, last axis = row (GGUF ``ne[0]``).
        n_threads: OpenMP threads for the kernel; None = the OpenMP default.

    Returns:
        float32 array of ``shape`` (newly allocated, writable).

    Raises:
        SterError: unsupported or unknown type, a row that is not whole blocks, a
            byte count that does not match the shape, or kernels not built.
    """
    t, flat, shape = _check(raw, ggml_type_id, shape)
    try:
        from ster_py._kernels import quants as _k
    except ImportError as e:  # pragma: no cover - depends on the build
        raise SterError("the Cython kernels are not built (ster_py._kernels.quants is missing); "
                        "run `python setup.py build_ext --inplace` in the source tree "
                        f"or reinstall ster-py ({e})") from None
    out = np.empty(shape, dtype=np.float32)
    if out.size:
        _k.dequantize_into(np.ascontiguousarray(flat), out.reshape(-1), t.id,
                           0 if n_threads is None else int(n_threads))
    return out


# ---------------------------------------------------------------------------
# Reference path: plain numpy, one gather table per type.

def _f16(b: np.ndarray) -> np.ndarray:
    """[n, 2] little-endian bytes -> [n, 1] float32."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)


def _nib32(qs: np.ndarray) -> np.ndarray:
    """[n, 16] bytes -> [n, 32] nibbles: byte j's low nibble is weight j, high nibble weight j+16."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _hi_bits32(qh: np.ndarray) -> np.ndarray:
    """[n, 4] bytes = little-endian u32 -> [n, 32] bits, bit j for weight j."""
    return np.unpackbits(qh, axis=1, bitorder="little")


_W = np.arange(QK_K)
# K-quants: weight w of a super-block, written as w = 128*h + 32*j + l (h half, j shift group, l lane).
_H, _J, _L = _W >> 7, (_W >> 5) & 3, _W & 31
# IQ4_NL's non-linear 4-bit grid (llama.cpp kvalues_iq4nl) and MXFP4's E2M1 values, doubled
# (kvalues_mxfp4; the E8M0 scale is halved to match).
IQ4NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)


def _ref_q4_0(b):
    return _f16(b[:, 0:2]) * (_nib32(b[:, 2:18]).astype(np.float32) - 8)


def _ref_q4_1(b):
    return _f16(b[:, 0:2]) * _nib32(b[:, 4:20]).astype(np.float32) + _f16(b[:, 2:4])


def _ref_q5_0(b):
    q = _nib32(b[:, 6:22]) | (_hi_bits32(b[:, 2:6]) << 4)
    return _f16(b[:, 0:2]) * (q.astype(np.float32) - 16)


def _ref_q5_1(b):
    q = _nib32(b[:, 8:24]) | (_hi_bits32(b[:, 4:8]) << 4)
    return _f16(b[:, 0:2]) * q.astype(np.float32) + _f16(b[:, 2:4])


def _ref_q8_0(b):
    return _f16(b[:, 0:2]) * b[:, 2:34].view(np.int8).astype(np.float32)


def _ref_q2_k(b):
    # scales[16] | qs[64] | d | dmin. Weight w: 2 bits at shift 2j of qs[32h+l]; sub-block w//16
    # has a 4-bit scale (low nibble, times d) and a 4-bit min (high nibble, times dmin).
    sc = b[:, 0:16][:, _W >> 4]
    q = (b[:, 16 + 32 * _H + _L] >> (2 * _J)) & 3
    dl = _f16(b[:, 80:82]) * (sc & 0x0F).astype(np.float32)
    ml = _f16(b[:, 82:84]) * (sc >> 4).astype(np.float32)
    return dl * q.astype(np.float32) - ml


def _ref_q3_k(b):
    # hmask[32] | qs[64] | scales[12] | d. Sixteen 6-bit scales (bias 32): the low 4 bits of
    # scale i are nibble i//8 of byte i%8, the top 2 bits are bits 2*(i//4) of byte 8 + i%4.
    s = b[:, 96:108].astype(np.int32)
    i = np.arange(16)
    low = (s[:, i % 8] >> (4 * (i // 8))) & 0x0F
    high = (s[:, 8 + i % 4] >> (2 * (i // 4))) & 3
    scales = ((low | (high << 4)) - 32).astype(np.float32)
    dl = _f16(b[:, 108:110]) * scales[:, _W >> 4]
    q2 = (b[:, 32 + 32 * _H + _L] >> (2 * _J)) & 3
    hbit = (b[:, _L] >> (4 * _H + _J)) & 1  # a set bit means "no -4 offset"
    q = q2.astype(np.int32) - 4 * (1 - hbit.astype(np.int32))
    return dl * q.astype(np.float32)


def _scale_min_k4(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins (as float32).

    Sub-blocks 0-3: low 6 bits of bytes 0-3 (scale) and 4-7 (min). Sub-blocks 4-7: low 4 bits
    in the nibbles of bytes 8-11, top 2 bits in the top bits of bytes 0-3 (scale) / 4-7 (min).
    """
    s = s.astype(np.int32)
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _ref_q4_k(b):
    # d | dmin | scales[12] | qs[128]. Weight w = 64c + 32s + l: nibble s of qs[32c + l]; sub-block w//32.
    sc, mn = _scale_min_k4(b[:, 4:16])
    c, s, lane = _W >> 6, (_W >> 5) & 1, _W & 31
    q = (b[:, 16 + 32 * c + lane] >> (4 * s)) & 0x0F
    dl = (_f16(b[:, 0:2]) * sc)[:, _W >> 5]
    ml = (_f16(b[:, 2:4]) * mn)[:, _W >> 5]
    return dl * q.astype(np.float32) - ml


def _ref_q5_k(b):
    # d | dmin | scales[12] | qh[32] | qs[128]. As Q4_K, plus a 5th bit: bit (w//32) of qh[w%32].
    sc, mn = _scale_min_k4(b[:, 4:16])
    c, s, lane = _W >> 6, (_W >> 5) & 1, _W & 31
    q = ((b[:, 48 + 32 * c + lane] >> (4 * s)) & 0x0F) | (((b[:, 16 + lane] >> (_W >> 5)) & 1) << 4)
    dl = (_f16(b[:, 0:2]) * sc)[:, _W >> 5]
    ml = (_f16(b[:, 2:4]) * mn)[:, _W >> 5]
    return dl * q.astype(np.float32) - ml


def _ref_q6_k(b):
    # ql[128] | qh[64] | scales[16] (int8) | d. Weight w = 128h + 64s + m: low 4 bits are nibble s
    # of ql[64h + m]; with w = 128h + 32j + l, the top 2 bits are bits 2j of qh[32h + l].
    s, m = (_W >> 6) & 1, _W & 63
    low = (b[:, 64 * _H + m] >> (4 * s)) & 0x0F
    high = (b[:, 128 + 32 * _H + _L] >> (2 * _J)) & 3
    q = (low | (high << 4)).astype(np.int32) - 32
    dl = _f16(b[:, 208:210]) * b[:, 192:208].view(np.int8).astype(np.float32)
    return dl[:, _W >> 4] * q.astype(np.float32)


def _ref_iq4_nl(b):
    return _f16(b[:, 0:2]) * IQ4NL_VALUES[_nib32(b[:, 2:18])]


def _ref_iq4_xs(b):
    # d | scales_h (u16) | scales_l[4] | qs[128]. Sub-block ib (of 32): 6-bit scale (bias 32),
    # low 4 bits = nibble ib%2 of scales_l[ib//2], top 2 bits = bits 2ib of scales_h.
    ib = np.arange(8)
    sh = np.ascontiguousarray(b[:, 2:4]).view("<u2").astype(np.int32)
    low = (b[:, 4 + ib // 2].astype(np.int32) >> (4 * (ib % 2))) & 0x0F
    high = (sh >> (2 * ib)) & 3
    dl = _f16(b[:, 0:2]) * ((low | (high << 4)) - 32).astype(np.float32)
    # Weight w = 32ib + 16s + l: nibble s of qs[16ib + l].
    q = (b[:, 8 + 16 * (_W >> 5) + (_W & 15)] >> (4 * ((_W >> 4) & 1))) & 0x0F
    return dl[:, _W >> 5] * IQ4NL_VALUES[q]


def _e8m0_half(e: np.ndarray) -> np.ndarray:
    """E8M0 exponent byte -> float32 2**(e - 127) / 2 (ggml_e8m0_to_fp32_half); e < 2 gives subnormals."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << np.uint32(23)).astype(np.uint32)
    return bits.view(np.float32)


def _ref_mxfp4(b):
    return _e8m0_half(b[:, 0:1]) * MXFP4_VALUES[_nib32(b[:, 1:17])]


_REFERENCE = {
    "Q4_0": _ref_q4_0, "Q4_1": _ref_q4_1, "Q5_0": _ref_q5_0, "Q5_1": _ref_q5_1, "Q8_0": _ref_q8_0,
    "Q2_K": _ref_q2_k, "Q3_K": _ref_q3_k, "Q4_K": _ref_q4_k, "Q5_K": _ref_q5_k, "Q6_K": _ref_q6_k,
    "IQ4_NL": _ref_iq4_nl, "IQ4_XS": _ref_iq4_xs, "MXFP4": _ref_mxfp4,
}


def dequantize_reference(raw: np.ndarray, ggml_type_id: int | str, shape: tuple[int, ...]) -> np.ndarray:
    """Plain numpy dequantization (the reference for the Cython kernels).

    Same contract as ``dequantize``; slower, and memory grows with the tensor
    (it decodes in chunks of 4096 blocks to bound temporaries).
    """
    t, flat, shape = _check(raw, ggml_type_id, shape)
    if t.name == "F32":
        return flat.view("<f4").astype(np.float32).reshape(shape)
    if t.name == "F16":
        return flat.view("<f2").astype(np.float32).reshape(shape)
    if t.name == "BF16":
        return (flat.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    blocks = flat.reshape(-1, t.type_size)
    out = np.empty((blocks.shape[0], t.block_size), dtype=np.float32)
    fn = _REFERENCE[t.name]
    step = 4096
    for i in range(0, blocks.shape[0], step):
        out[i:i + step] = fn(blocks[i:i + step])
    return out.reshape(shape)
