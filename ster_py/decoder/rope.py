"""Rotary position embeddings: the frequency tables and their application.

A ``Rope`` holds what one layer's rotation needs: the inverse frequencies of its
rotary pairs, the factor its cos/sin are scaled by, how many leading dimensions
of each head rotate (partial rotary), and whether pairs are adjacent
(``interleaved``, GPT-J style) or split in halves (GPT-NeoX style, Llama's).

The scaling types follow the published methods as Transformers' ``modeling_rope_utils``
implements them: linear (position interpolation, Chen et al. 2023), dynamic NTK
(bloc97, 2023), YaRN (Peng et al. 2023, arXiv:2309.00071), Llama 3's band-wise
scaling (Meta, 2024) and LongRoPE (Ding et al. 2024, arXiv:2402.13753).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..errors import SterError
from ._fast import ops as _ops

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")


@dataclass(frozen=True)
class Rope:
    """One rotation.

    Attributes:
        inv_freq: float64 [rotary_dim // 2], radians per position for each rotary pair.
        rotary_dim: how many leading dimensions of each head rotate (even, <= head_dim).
        attention_factor: multiplies cos and sin (YaRN, LongRoPE); 1.0 otherwise.
        interleaved: pairs are (0,1), (2,3), ... instead of (0, d/2), (1, d/2+1), ...
        dynamic: for dynamic NTK, (base, factor, max_position_embeddings): the base
            grows once the sequence is longer than max_position_embeddings.
        long_inv_freq: for LongRoPE, the table used once the sequence is longer than
            ``long_from`` positions.
    """

    inv_freq: np.ndarray
    rotary_dim: int
    attention_factor: float = 1.0
    interleaved: bool = False
    dynamic: tuple[float, float, int] | None = None
    long_inv_freq: np.ndarray | None = None
    long_from: int = 0

    def freqs_for(self, seq_len: int) -> np.ndarray:
        """Inverse frequencies in force for a sequence of ``seq_len`` positions so far."""
        if self.dynamic is not None and seq_len > self.dynamic[2]:
            base, factor, max_pos = self.dynamic
            base = base * ((factor * seq_len / max_pos) - (factor - 1)) ** (self.rotary_dim / (self.rotary_dim - 2))
            return _default_inv_freq(base, self.rotary_dim)
        if self.long_inv_freq is not None and seq_len > self.long_from:
            return self.long_inv_freq
        return self.inv_freq

    def cos_sin(self, positions: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin tables, float32 [len(positions), rotary_dim // 2], scaled by attention_factor."""
        angles = np.outer(positions.astype(np.float64), self.freqs_for(seq_len))
        f = self.attention_factor
        return (np.cos(angles) * f).astype(np.float32), (np.sin(angles) * f).astype(np.float32)

    def apply(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """Rotate ``x`` float32 [heads, T, head_dim] in place by the tables of ``cos_sin``; returns x.

        Float32 C-contiguous inputs go to the Cython kernel; ``apply_reference`` is the
        numpy definition (and the fallback).
        """
        h = self.rotary_dim // 2
        if (_ops is not None and isinstance(x, np.ndarray) and x.ndim == 3 and x.dtype == np.float32
                and x.flags.c_contiguous and x.flags.writeable and cos.dtype == np.float32
                and sin.dtype == np.float32 and cos.shape == sin.shape == (x.shape[1], h)):
            _ops.rope(x, np.ascontiguousarray(cos), np.ascontiguousarray(sin), self.rotary_dim, self.interleaved)
            return x
        return self.apply_reference(x, cos, sin)

    def apply_pair(self, q: np.ndarray, k: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> None:
        """``apply`` to queries and keys (float32 [heads, T, head_dim] each) in one kernel call."""
        h = self.rotary_dim // 2
        if (_ops is not None and q.__class__ is np.ndarray and k.__class__ is np.ndarray and q.ndim == k.ndim == 3
                and q.dtype == k.dtype == cos.dtype == sin.dtype == np.float32 and q.flags.c_contiguous
                and k.flags.c_contiguous and q.flags.writeable and k.flags.writeable
                and cos.shape == sin.shape == (q.shape[1], h) and cos.flags.c_contiguous and sin.flags.c_contiguous):
            _ops.rope(q, cos, sin, self.rotary_dim, self.interleaved, k)
            return
        self.apply(q, cos, sin)
        self.apply(k, cos, sin)

    def apply_reference(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """The numpy definition of ``apply`` (in place on x [..., T, head_dim]; returns x)."""
        d = self.rotary_dim
        if self.interleaved:
            a, b = x[..., 0:d:2].copy(), x[..., 1:d:2].copy()
            x[..., 0:d:2] = a * cos - b * sin
            x[..., 1:d:2] = b * cos + a * sin
        else:
            h = d // 2
            a, b = x[..., :h].copy(), x[..., h:d].copy()
            x[..., :h] = a * cos - b * sin
            x[..., h:d] = b * cos + a * sin
        return x


def _default_inv_freq(base: float, dim: int) -> np.ndarray:
    return 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))


def _yarn(params: Mapping, base: float, dim: int, max_pos: int) -> tuple[np.ndarray, float]:
    factor = params.get("factor")
    orig = params.get("original_max_position_embeddings") or max_pos
    if factor is None:
        factor = max_pos / orig

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if (m and m_all) else mscale(factor)
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolate = 1 - ramp  # share of each pair that keeps its original frequency
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolate) + (1.0 / pos_freqs) * extrapolate
    return inv, float(attention_factor)


def _llama3(params: Mapping, base: float, dim: int) -> np.ndarray:
    inv = _default_inv_freq(base, dim)
    factor = params["factor"]
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    old_ctx = params["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled)


def make_rope(params: Mapping, *, head_dim: int, max_position_embeddings: int,
              partial_rotary_factor: float = 1.0, interleaved: bool = False) -> Rope:
    """Build a ``Rope`` from one set of rope parameters.

    Args:
        params: ``rope_type`` (or ``type``), ``rope_theta`` and the type's own keys, in the
            shape of Transformers 5's ``rope_parameters`` (a Transformers 4 ``rope_scaling``
            merged with ``rope_theta`` has the same keys).
        head_dim: width of one attention head.
        max_position_embeddings: the config's context length.
        partial_rotary_factor: share of each head that rotates (``params`` may override it).

    Raises:
        SterError: an unknown rope type, or a type missing one of its keys.
    """
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    base = float(params.get("rope_theta", 10000.0))
    partial = float(params.get("partial_rotary_factor", partial_rotary_factor))
    dim = int(head_dim * partial)
    try:
        if rope_type == "default":
            return Rope(_default_inv_freq(base, dim), dim, interleaved=interleaved)
        if rope_type == "linear":
            return Rope(_default_inv_freq(base, dim) / float(params["factor"]), dim, interleaved=interleaved)
        if rope_type == "dynamic":
            return Rope(_default_inv_freq(base, dim), dim, interleaved=interleaved,
                        dynamic=(base, float(params["factor"]), int(max_position_embeddings)))
        if rope_type == "yarn":
            inv, attn = _yarn(params, base, dim, max_position_embeddings)
            return Rope(inv, dim, attention_factor=attn, interleaved=interleaved)
        if rope_type == "llama3":
            return Rope(_llama3(params, base, dim), dim, interleaved=interleaved)
        if rope_type == "longrope":
            orig = params["original_max_position_embeddings"]
            factor = params.get("factor") or max_position_embeddings / orig
            attn = params.get("attention_factor")
            if attn is None:
                attn = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
            pos = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
            short = 1.0 / (np.asarray(params["short_factor"], dtype=np.float64) * pos)
            long = 1.0 / (np.asarray(params["long_factor"], dtype=np.float64) * pos)
            return Rope(short, dim, attention_factor=float(attn), interleaved=interleaved,
                        long_inv_freq=long, long_from=int(orig))
    except KeyError as e:
        raise SterError(f"rope_scaling of type {rope_type!r} is missing its key {e.args[0]!r}") from None
    raise SterError(f"rope type {rope_type!r} is not supported; supported types: {', '.join(ROPE_TYPES)}")
