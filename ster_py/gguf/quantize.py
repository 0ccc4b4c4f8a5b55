"""Block quantizers: float32 matrices -> GGML Q8_0, Q4_0, Q5_0 and Q4_K blocks.

What ``--quantize q8_0|q4_0|q4_k`` runs on a safetensors checkpoint as it loads
(``Decoder.quantize``): the blocks then go through the same kernels as a GGUF file's.
Each quantizer makes the blocks llama.cpp's reference quantizers make without an
importance matrix (``quantize_row_q8_0_ref``, ``_q4_0_ref``, ``_q5_0_ref``,
``_q4_K_ref`` in ggml/src/ggml-quants.c), bit for bit: tests/test_quantize.py compares
them with llama.cpp's own ``ggml_quantize_chunk``. The block layouts are ggml-common.h's
(restated in ``ster_py.gguf.quants``).

Two implementations of each: ``*_reference`` here in numpy (float32 operations in the
order the definition gives them, vectorised over blocks), and the Cython kernels
(``ster_py._kernels.qmatmul.quantize_rows``, C in ``cython/ster_quantize.h``), which
``quantize`` calls and the tests hold to the references byte for byte.

The module's public names are those of the quantizers ``ster convert`` uses (branch
wt-exp's ``gguf/quantize.py``: ``quantize(x, type_name, n_threads)``,
``quantize_reference(x, type_name)``, ``fallback_type(type_name, n_cols)``,
``QUANTIZED_TYPES``), so that one module can replace the other; what ``--quantize`` chooses
(block types per matrix, the output head's type, the inf/NaN refusal) is
``ster_py.decoder.qlinear``'s (``quantize_decoder_policy``).
"""
from __future__ import annotations

import numpy as np

from ..errors import SterError
from . import quants

#: Block types these quantizers write.
QUANTIZED_TYPES = ("Q8_0", "Q4_0", "Q5_0", "Q4_K")
TYPES = QUANTIZED_TYPES

_F32 = np.float32


def _fp16_bytes(v: np.ndarray) -> np.ndarray:
    """float32 [n] -> uint8 [n, 2]: IEEE half, round to nearest even (GGML_FP32_TO_FP16)."""
    return v.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _roundf(v: np.ndarray) -> np.ndarray:
    """C roundf of float32 values: nearest integer, halves away from zero (exact in float64)."""
    a = np.floor(np.abs(v.astype(np.float64)) + 0.5)
    return np.where(v < 0, -a, a)


def _nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int of float32 values, its bit trick itself: add 1.5 * 2^23 in float32
    and read the low mantissa bits (round half to even below 2^22; an inf or NaN gives what
    the C code gives)."""
    with np.errstate(invalid="ignore", over="ignore"):
        bits = (v.astype(_F32) + _F32(12582912.0)).astype(_F32).view(np.int32)
    return ((bits & 0x007FFFFF) - 0x00400000).astype(np.int64)


def _blocks(x: np.ndarray, size: int) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=_F32)
    if x.ndim != 2 or x.shape[1] % size:
        raise ValueError(f"rows of a multiple of {size} weights are needed, got shape {x.shape}")
    return x.reshape(-1, size)


def quantize_q8_0_reference(x: np.ndarray) -> np.ndarray:
    """float32 [rows, K] (K a multiple of 32) -> uint8 [rows, K / 32 * 34] Q8_0 blocks.

    Per 32 weights: d = max|x| / 127 (stored as f16), codes roundf(x / d) as int8 (x times
    the float32 inverse 1 / d, as ggml computes it).
    """
    rows = x.shape[0]
    b = _blocks(x, 32)
    d = (np.abs(b).max(axis=1) / _F32(127)).astype(_F32)
    inv = np.divide(_F32(1), d, out=np.zeros_like(d), where=d != 0).astype(_F32)
    q = _roundf((b * inv[:, None]).astype(_F32)).astype(np.int8)
    out = np.concatenate([_fp16_bytes(d), q.view(np.uint8)], axis=1)
    return out.reshape(rows, -1)


def _legacy_scale(b: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """(d, 1/d) of Q4_0 (levels 8) / Q5_0 (16): d = (the signed value of largest magnitude,
    the first one of a tie) / -levels."""
    m = b[np.arange(b.shape[0]), np.argmax(np.abs(b), axis=1)]
    m = np.where(m != 0, m, _F32(0))   # a block of zeros keeps ggml's starting +0.0 (d = -0.0)
    d = (m / _F32(-levels)).astype(_F32)
    inv = np.divide(_F32(1), d, out=np.zeros_like(d), where=d != 0).astype(_F32)
    return d, inv


def quantize_q4_0_reference(x: np.ndarray) -> np.ndarray:
    """float32 [rows, K] (K a multiple of 32) -> uint8 [rows, K / 32 * 18] Q4_0 blocks.

    Per 32 weights: d = -m / 8 with m the value of largest magnitude (f16), codes
    min(15, trunc(x / d + 8.5)); byte l holds weight l (low nibble) and weight l + 16.
    """
    rows = x.shape[0]
    b = _blocks(x, 32)
    d, inv = _legacy_scale(b, 8)
    q = np.minimum(15, np.trunc((b * inv[:, None]).astype(_F32) + _F32(8.5))).astype(np.uint8)
    qs = q[:, :16] | (q[:, 16:] << 4)
    return np.concatenate([_fp16_bytes(d), qs], axis=1).reshape(rows, -1)


def quantize_q5_0_reference(x: np.ndarray) -> np.ndarray:
    """float32 [rows, K] (K a multiple of 32) -> uint8 [rows, K / 32 * 22] Q5_0 blocks.

    As Q4_0 with d = -m / 16 and 5-bit codes min(31, trunc(x / d + 16.5)): their low
    nibbles packed as Q4_0's, their fifth bits in a little-endian u32 (bit l for weight l).
    """
    rows = x.shape[0]
    b = _blocks(x, 32)
    d, inv = _legacy_scale(b, 16)
    q = np.minimum(31, np.trunc((b * inv[:, None]).astype(_F32) + _F32(16.5))).astype(np.uint32)
    qs = ((q[:, :16] & 15) | ((q[:, 16:] & 15) << 4)).astype(np.uint8)
    qh = ((q >> 4) << np.arange(32, dtype=np.uint32)).sum(axis=1, dtype=np.uint64).astype("<u4")
    return np.concatenate([_fp16_bytes(d), qh.view(np.uint8).reshape(-1, 4), qs], axis=1).reshape(rows, -1)


def _make_qkx2(x: np.ndarray, w: np.ndarray, nmax: int = 15, rmin: float = -1.0, rdelta: float = 0.1,
               nstep: int = 20) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's make_qkx2_quants on n sub-blocks at once: x, w float32 [n, 32] -> (scale [n],
    min [n] (the negated offset, >= 0), codes int [n, 32]): codes of x ~= scale * L - min
    chosen among nstep + 1 trial scales by a weighted least-squares fit (weights w). Every
    sum runs element by element in float32, as the C loop does."""
    n = x.shape[0]
    lo, hi = x[:, 0].copy(), x[:, 0].copy()
    sum_w = w[:, 0].copy()
    sum_x = (sum_w * x[:, 0]).astype(_F32)
    for i in range(1, 32):
        lo = np.minimum(lo, x[:, i])
        hi = np.maximum(hi, x[:, i])
        sum_w = (sum_w + w[:, i]).astype(_F32)
        sum_x = (sum_x + (w[:, i] * x[:, i]).astype(_F32)).astype(_F32)
    lo = np.minimum(lo, _F32(0))
    flat = hi == lo
    span = np.where(flat, _F32(1), (hi - lo).astype(_F32)).astype(_F32)
    iscale = (_F32(nmax) / span).astype(_F32)
    scale = (_F32(1) / iscale).astype(_F32)
    t = ((x - lo[:, None]).astype(_F32) * iscale[:, None]).astype(_F32)
    L = np.clip(_nearest_int(t), 0, nmax)
    Lf = L.astype(_F32)
    best = np.zeros(n, _F32)
    for i in range(32):
        diff = (((scale * Lf[:, i]).astype(_F32) + lo).astype(_F32) - x[:, i]).astype(_F32)
        best = (best + (w[:, i] * (diff * diff).astype(_F32)).astype(_F32)).astype(_F32)
    mn = lo.copy()   # the C loop moves its min to each better fit's, and later trials start from it
    for step in range(nstep + 1):
        num = ((_F32(rmin) + (_F32(rdelta) * _F32(step)).astype(_F32)).astype(_F32) + _F32(nmax)).astype(_F32)
        with np.errstate(divide="ignore", invalid="ignore"):
            isc = (num / (hi - mn).astype(_F32)).astype(_F32)
            La = np.clip(_nearest_int(((x - mn[:, None]).astype(_F32) * isc[:, None]).astype(_F32)), 0, nmax)
        Laf = La.astype(_F32)
        sl = np.zeros(n, _F32)
        sl2 = np.zeros(n, _F32)
        sxl = np.zeros(n, _F32)
        for i in range(32):
            wl = (w[:, i] * Laf[:, i]).astype(_F32)
            sl = (sl + wl).astype(_F32)
            sl2 = (sl2 + (wl * Laf[:, i]).astype(_F32)).astype(_F32)
            sxl = (sxl + (wl * x[:, i]).astype(_F32)).astype(_F32)
        D = ((sum_w * sl2).astype(_F32) - (sl * sl).astype(_F32)).astype(_F32)
        ok = D > 0
        Dd = np.where(ok, D, _F32(1)).astype(_F32)
        this_scale = (((sum_w * sxl).astype(_F32) - (sum_x * sl).astype(_F32)).astype(_F32) / Dd).astype(_F32)
        this_min = (((sl2 * sum_x).astype(_F32) - (sl * sxl).astype(_F32)).astype(_F32) / Dd).astype(_F32)
        pos = this_min > 0
        sl2d = np.where(sl2 != 0, sl2, _F32(1)).astype(_F32)
        this_scale = np.where(pos, (sxl / sl2d).astype(_F32), this_scale).astype(_F32)
        this_min = np.where(pos, _F32(0), this_min).astype(_F32)
        cur = np.zeros(n, _F32)
        for i in range(32):
            diff = (((this_scale * Laf[:, i]).astype(_F32) + this_min).astype(_F32) - x[:, i]).astype(_F32)
            cur = (cur + (w[:, i] * (diff * diff).astype(_F32)).astype(_F32)).astype(_F32)
        better = ok & (cur < best) & ~flat
        L = np.where(better[:, None], La, L)
        best = np.where(better, cur, best)
        scale = np.where(better, this_scale, scale)
        mn = np.where(better, this_min, mn)
    scale = np.where(flat, _F32(0), scale).astype(_F32)
    L = np.where(flat[:, None], 0, L)
    return scale, (-mn).astype(_F32), L


def quantize_q4_k_reference(x: np.ndarray) -> np.ndarray:
    """float32 [rows, K] (K a multiple of 256) -> uint8 [rows, K / 256 * 144] Q4_K blocks.

    Per 256 weights, eight sub-blocks of 32: each gets a scale and a min by ``_make_qkx2``
    with weights rms(sub-block) + |x|; those are quantized to 6 bits against the block's
    largest (d = max scale / 63, dmin = max min / 63, both f16), and the 4-bit codes are
    recomputed from the stored scales: L = nearest(x + dmin * m) / (d * sc), clamped to 0..15
    (a sub-block whose stored scale is 0 keeps the codes of the search).
    """
    rows = x.shape[0]
    b = _blocks(x, 256)
    nb = b.shape[0]
    sub = b.reshape(nb * 8, 32)
    sum_x2 = np.zeros(nb * 8, _F32)
    for i in range(32):
        sum_x2 = (sum_x2 + (sub[:, i] * sub[:, i]).astype(_F32)).astype(_F32)
    av = np.sqrt((sum_x2 / _F32(32)).astype(_F32)).astype(_F32)
    weights = (av[:, None] + np.abs(sub)).astype(_F32)
    scales, mins, L = _make_qkx2(sub, weights)
    scales, mins, L = scales.reshape(nb, 8), mins.reshape(nb, 8), L.reshape(nb, 8, 32)
    max_scale = np.maximum(scales.max(axis=1), _F32(0))
    max_min = np.maximum(mins.max(axis=1), _F32(0))
    inv_scale = np.where(max_scale > 0, _F32(63) / np.where(max_scale > 0, max_scale, _F32(1)), _F32(0)).astype(_F32)
    inv_min = np.where(max_min > 0, _F32(63) / np.where(max_min > 0, max_min, _F32(1)), _F32(0)).astype(_F32)
    # uint8_t of the nearest integer (a negative one wraps), then at most 63
    ls = np.minimum(63, _nearest_int((inv_scale[:, None] * scales).astype(_F32)) & 0xFF)
    lm = np.minimum(63, _nearest_int((inv_min[:, None] * mins).astype(_F32)) & 0xFF)
    d = (max_scale / _F32(63)).astype(_F32).astype(np.float16)
    dmin = (max_min / _F32(63)).astype(_F32).astype(np.float16)
    dj = (d.astype(_F32)[:, None] * ls.astype(_F32)).astype(_F32)
    dm = (dmin.astype(_F32)[:, None] * lm.astype(_F32)).astype(_F32)
    safe = np.where(dj != 0, dj, _F32(1)).astype(_F32)
    redo = np.clip(_nearest_int(((sub.reshape(nb, 8, 32) + dm[:, :, None]).astype(_F32) / safe[:, :, None]).astype(_F32)),
                   0, 15)
    L = np.where((dj != 0)[:, :, None], redo, L).astype(np.uint8)
    packed = np.zeros((nb, 12), np.uint8)
    packed[:, 0:4] = ls[:, :4]
    packed[:, 4:8] = lm[:, :4]
    packed[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    packed[:, 0:4] |= ((ls[:, 4:] >> 4) << 6).astype(np.uint8)
    packed[:, 4:8] |= ((lm[:, 4:] >> 4) << 6).astype(np.uint8)
    pairs = L.reshape(nb, 4, 2, 32)     # 64-weight chunks: sub-blocks 2c (low nibble), 2c + 1 (high)
    qs = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(nb, 128)
    out = np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), packed, qs], axis=1)
    return out.reshape(rows, -1)


REFERENCES = {"Q8_0": quantize_q8_0_reference, "Q4_0": quantize_q4_0_reference,
              "Q5_0": quantize_q5_0_reference, "Q4_K": quantize_q4_k_reference}


def fallback_type(type_name: str, n_cols: int) -> str:
    """The type a row of ``n_cols`` weights takes when ``type_name``'s blocks do not fit it, as
    llama.cpp's quantizer falls back (src/llama-quant.cpp, ``tensor_type_fallback``): Q4_K ->
    Q5_0; a 32-weight type, or a fallback that does not fit either -> F16. ``type_name`` itself
    when its blocks fit."""
    if n_cols % quants.ggml_type(type_name).block_size == 0:
        return type_name
    smaller = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}.get(type_name, type_name)
    return smaller if n_cols % quants.ggml_type(smaller).block_size == 0 else "F16"


def _rows(x: np.ndarray, type_name: str) -> np.ndarray:
    """x (any float dtype, last axis = row) as float32 [rows, K], K whole blocks of type_name."""
    if type_name not in QUANTIZED_TYPES:
        raise SterError(f"no quantizer for {type_name}; ster quantizes to {', '.join(QUANTIZED_TYPES)}")
    t = quants.ggml_type(type_name)
    x = np.asarray(x)
    if x.ndim == 0 or x.shape[-1] % t.block_size:
        raise SterError(f"an array of shape {list(x.shape)} cannot be quantized to {type_name}: its rows must be a "
                        f"whole number of {t.block_size}-weight blocks")
    return np.ascontiguousarray(x, dtype=_F32).reshape(-1, x.shape[-1])


def quantize_reference(x: np.ndarray, type_name: str) -> np.ndarray:
    """The numpy reference of ``quantize`` (same contract, same bytes)."""
    x32 = _rows(x, type_name)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return REFERENCES[type_name](x32)


def quantize(x: np.ndarray, type_name: str, n_threads: int | None = None) -> np.ndarray:
    """The GGML blocks of ``x`` as ``type_name``, by the Cython kernels.

    Args:
        x: float array (any float dtype, widened to float32), last axis = row, rows a whole
            number of the type's blocks (``fallback_type`` chooses a type that fits).
        type_name: one of ``QUANTIZED_TYPES``.
        n_threads: threads of the kernels' pool; None = ``qlinear.set_threads``'s. The bytes do
            not depend on it.

    Returns:
        uint8 [rows, K / block_size * type_size], C-contiguous (rows = x.size / K).

    Raises:
        SterError: a type ster cannot write, or rows that are not whole blocks. inf/NaN weights
            are quantized as the C code does (the caller refuses them: see
            ``decoder.qlinear.quantize_matrix``).
    """
    from ..decoder.qlinear import _kernels

    x32 = _rows(x, type_name)
    t = quants.ggml_type(type_name)
    out = np.empty((x32.shape[0], x32.shape[1] // t.block_size * t.type_size), np.uint8)
    if out.size:
        _kernels().quantize_rows(x32, t.id, out, 0 if n_threads is None else int(n_threads))
    return out
