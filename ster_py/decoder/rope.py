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

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope", "deepseek_yarn", "proportional")


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
        long_attention_factor: multiplies cos and sin with the long table instead of
            ``attention_factor`` (PhiMoE's long_mscale); None: the same factor for both.
    """

    inv_freq: np.ndarray
    rotary_dim: int
    attention_factor: float = 1.0
    interleaved: bool = False
    dynamic: tuple[float, float, int] | None = None
    long_inv_freq: np.ndarray | None = None
    long_from: int = 0
    long_attention_factor: float | None = None

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
        long = self.long_attention_factor is not None and self.long_inv_freq is not None and seq_len > self.long_from
        f = self.long_attention_factor if long else self.attention_factor
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


def _yarn(params: Mapping, base: float, dim: int, max_pos: int, number) -> tuple[np.ndarray, float]:
    orig = number("original_max_position_embeddings", max_pos) if params.get("original_max_position_embeddings") \
        else max_pos
    factor = number("factor", max_pos / orig)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = params.get("attention_factor")
    if attention_factor is not None:
        attention_factor = number("attention_factor")
    else:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if (m and m_all) else mscale(factor)
    beta_fast = number("beta_fast") if params.get("beta_fast") else 32
    beta_slow = number("beta_slow") if params.get("beta_slow") else 1

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


def _llama3(params: Mapping, base: float, dim: int, number) -> np.ndarray:
    inv = _default_inv_freq(base, dim)
    factor = number("factor")
    low, high = number("low_freq_factor"), number("high_freq_factor")
    old_ctx = number("original_max_position_embeddings")
    if not high > low:  # the smooth ramp divides by (high - low)
        raise SterError(f"{number.where}: llama3 rope needs high_freq_factor ({high:g}) above low_freq_factor "
                        f"({low:g})")
    wavelen = 2 * math.pi / inv
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled)


class _Numbers:
    """Reads a rope parameter as a finite number above 0, or refuses naming it (``where``: the source)."""

    def __init__(self, params: Mapping, rope_type: str, where: str):
        self.params, self.rope_type, self.where = params, rope_type, where

    def __call__(self, key: str, default: float | None = None, name: str | None = None) -> float:
        value = self.params.get(key, default)
        if value is None:
            raise SterError(f"{self.where}: rope_scaling of type {self.rope_type!r} is missing its key {key!r}")
        ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
        if not ok or not math.isfinite(value) or value <= 0:
            raise SterError(f"{self.where}: {name or key} must be a finite number above 0, got {brief_value(value)}")
        return float(value)


def brief_value(value) -> str:
    """A value for a message: at most one line and 60 characters (untrusted files hold anything)."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return f"a list of {len(value)} values"
    text = repr(value).replace("\n", " ")
    return text if len(text) <= 60 else text[:57] + "..."


def check_share(head_dim: int, partial: float, where: str, keys: str = "partial_rotary_factor") -> None:
    """Refuse a rotary share that is not a number in (0, 1], naming ``keys`` (also where the share is unread)."""
    ok = isinstance(partial, (int, float, np.integer, np.floating)) and not isinstance(partial, (bool, np.bool_))
    if not ok or not math.isfinite(partial) or not 0 < partial <= 1:
        raise SterError(f"{where}: {keys} must give a rotary width within the head (a share in (0, 1]), "
                        f"got {brief_value(partial)} (head_dim {head_dim})")


def rotary_width(head_dim: int, partial: float, where: str, keys: str = "partial_rotary_factor") -> int:
    """How many leading dimensions of a head rotate: ``int(head_dim * partial)``, checked first.

    The width sizes every frequency table, so an absurd share is refused here, before
    any table is built. ``keys`` names the configuration key(s) the share came from.

    Raises:
        SterError: ``partial`` not a number in (0, 1], or a width that is zero or odd.
    """
    check_share(head_dim, partial, where, keys)
    dim = int(head_dim * partial)
    if dim <= 0 or dim % 2:
        raise SterError(f"{where}: the rotary width {dim} (head_dim {head_dim} x {keys} {partial:g}) must be even "
                        "and above 0; rotary pairs need an even width")
    return dim


def _proportional(params: Mapping, base: float, head_dim: int, number, where: str, interleaved: bool) -> Rope:
    """Proportional RoPE (Gemma 4's full-attention rotation): the pairs are those of the whole head
    (j with j + head_dim / 2); only the first floor(p * head_dim / 2) of them turn, at
    base ** (-2j / head_dim) / factor, and the rest stay put (frequency 0), p being the set's own
    ``partial_rotary_factor`` (1 when absent), as Transformers' ``_compute_proportional_rope_parameters``."""
    share = params.get("partial_rotary_factor", 1.0)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
        raise SterError(f"{where}: partial_rotary_factor of a proportional rotation must be a number in 0..1, "
                        f"got {brief_value(share)}")
    if head_dim % 2:
        raise SterError(f"{where}: a proportional rotation needs an even head width, got {head_dim}")
    factor = number("factor", 1.0)
    turning = int(share * head_dim // 2)
    inv = np.zeros(head_dim // 2, np.float64)
    inv[:turning] = 1.0 / base ** (np.arange(0, 2 * turning, 2, dtype=np.float64) / head_dim)
    return Rope(inv / factor, head_dim, interleaved=interleaved)


def make_rope(params: Mapping, *, head_dim: int, max_position_embeddings: int,
              partial_rotary_factor: float = 1.0, interleaved: bool = False,
              where: str = "invalid rope parameters", partial_keys: str = "partial_rotary_factor") -> Rope:
    """Build a ``Rope`` from one set of rope parameters.

    Args:
        params: ``rope_type`` (or ``type``), ``rope_theta`` and the type's own keys, in the
            shape of Transformers 5's ``rope_parameters`` (a Transformers 4 ``rope_scaling``
            merged with ``rope_theta`` has the same keys).
        head_dim: width of one attention head.
        max_position_embeddings: the config's context length.
        partial_rotary_factor: share of each head that rotates (``params`` may override it).
        where: prefix of error messages ("invalid model config PATH").
        partial_keys: the configuration key(s) the share came from, for messages.

    Raises:
        SterError: an unknown rope type, a type missing one of its keys, a parameter that is
            not a finite positive number (rope_theta, factor...), a rotary share outside (0, 1]
            or an odd width (checked before any table is built), llama3 factors out of order,
            LongRoPE factor lists of the wrong length.
    """
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if not isinstance(rope_type, str) or rope_type not in ROPE_TYPES:
        raise SterError(f"rope type {brief_value(rope_type)} is not supported; supported types: {', '.join(ROPE_TYPES)}")
    if rope_type == "deepseek_yarn":  # DeepSeek's remote code names its YaRN so: the same scaling
        rope_type = "yarn"
    number = _Numbers(params, rope_type, where)
    base = number("rope_theta", 10000.0)
    if rope_type == "proportional":
        return _proportional(params, base, head_dim, number, where, interleaved)
    if "partial_rotary_factor" in params:
        partial_rotary_factor, partial_keys = params["partial_rotary_factor"], "partial_rotary_factor"
    dim = rotary_width(head_dim, partial_rotary_factor, where, partial_keys)
    if rope_type == "default":
        return Rope(_default_inv_freq(base, dim), dim, interleaved=interleaved)
    if rope_type == "linear":
        return Rope(_default_inv_freq(base, dim) / number("factor"), dim, interleaved=interleaved)
    if rope_type == "dynamic":
        return Rope(_default_inv_freq(base, dim), dim, interleaved=interleaved,
                    dynamic=(base, number("factor"), int(max_position_embeddings)))
    if rope_type == "yarn":
        inv, attn = _yarn(params, base, dim, max_position_embeddings, number)
        return Rope(inv, dim, attention_factor=attn, interleaved=interleaved)
    if rope_type == "llama3":
        return Rope(_llama3(params, base, dim, number), dim, interleaved=interleaved)
    # longrope
    orig = number("original_max_position_embeddings")
    factor = number("factor", max_position_embeddings / orig)
    attn = number("attention_factor") if params.get("attention_factor") is not None else None
    if attn is None:
        attn = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
    # PhiMoE states a factor per table (short_mscale, long_mscale), which replaces the one above
    mscales = ((number("short_mscale"), number("long_mscale"))
               if params.get("short_mscale") is not None or params.get("long_mscale") is not None else (attn, None))
    pos = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    tables = []
    for key in ("short_factor", "long_factor"):
        values = params.get(key)
        if not isinstance(values, (list, tuple)) or len(values) != dim // 2:
            shown = f"{len(values)} values" if isinstance(values, (list, tuple)) else brief_value(values)
            raise SterError(f"{where}: longrope {key} must list one factor per rotary pair ({dim // 2}), "
                            f"got {shown}")
        try:
            factors = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):
            factors = np.array([np.nan])
        if not np.all(np.isfinite(factors)) or np.any(factors <= 0):
            raise SterError(f"{where}: longrope {key} must hold finite numbers above 0")
        tables.append(1.0 / (factors * pos))
    return Rope(tables[0], dim, attention_factor=float(mscales[0]), interleaved=interleaved,
                long_inv_freq=tables[1], long_from=int(orig),
                long_attention_factor=None if mscales[1] is None else float(mscales[1]))
