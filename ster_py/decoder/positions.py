"""Position signals that are not rotations: ALiBi biases and Llama 4's query temperature.

ALiBi: Press et al. 2022 (arXiv:2108.12409), "Train Short, Test Long": each head adds
its slope times the key's position to the attention scores. The slopes are BLOOM's
(``build_alibi_tensor`` in Transformers' modeling_bloom): for n heads rounded down to a
power of two p, head h (from 1) gets 2 ** (-8 h / p); the remaining heads take every
other slope of the 2p-head series. For a power-of-two head count this equals MPT's
``build_mpt_alibi_tensor`` with alibi_bias_max 8. A bias by the key's absolute position
differs from the paper's -(query - key) by a constant per query row, which softmax
ignores. Step1 (Step-Audio's language model, seed 002) adds -slope * sqrt(query - key) instead,
measured from each query's absolute position; a square root is not shift-invariant, so that bias
is built per query row (``alibi_sqrt_bias``).

Query temperature: Llama 4 / Ministral 3 multiply each query by
1 + beta * ln(1 + floor((position + offset) / divisor)): Ministral 3 with llama_4_scaling_beta
over original_max_position_embeddings, offset 0 (Transformers' ``get_llama_4_attn_scale``);
Llama 4's text decoder on its unrotated layers with attn_scale over floor_scale, offset 1
(``Llama4TextAttention``; temperature tuning, arXiv:2501.19399).
"""
from __future__ import annotations

import math

import numpy as np


def alibi_slopes(num_heads: int, max_bias: float = 8.0) -> tuple[float, ...]:
    """One ALiBi slope per head (BLOOM's series for ``max_bias`` 8), as Python floats.

    With p the head count rounded down to a power of two: 2 ** (-max_bias k / p) for
    k = 1..p, then 2 ** (-max_bias k / 2p) for k = 1, 3, 5, ... for the remaining heads
    (llama.cpp's ``f_max_alibi_bias`` generalises BLOOM's fixed 8).
    """
    p = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = [2.0 ** (-max_bias * k / p) for k in range(1, p + 1)]
    slopes += [2.0 ** (-max_bias * k / (2 * p)) for k in range(1, 2 * min(p, num_heads - p), 2)]
    return tuple(slopes)


def alibi_bias(slopes: tuple[float, ...], num_keys: int, *, scale: float = 1.0, bf16: bool = False) -> np.ndarray:
    """The additive score bias float32 [num_heads, 1, num_keys]: slope * key position * scale.

    ``bf16`` reproduces references that build the bias in bfloat16 (Falcon's
    ``build_alibi_tensor`` rounds the slope, the position and their product to bfloat16
    before widening); a model trained that way is defined by those rounded values.
    """
    s = np.asarray(slopes, np.float32)[:, None, None]
    pos = np.arange(num_keys, dtype=np.float32)[None, None, :]
    if bf16:
        import ml_dtypes

        bf = ml_dtypes.bfloat16
        bias = (s.astype(bf).astype(np.float32) * pos.astype(bf).astype(np.float32)).astype(bf).astype(np.float32)
    else:
        bias = s * pos
    return bias * np.float32(scale) if scale != 1.0 else bias


def alibi_sqrt_bias(slopes: tuple[float, ...], query_positions: np.ndarray, num_keys: int) -> np.ndarray:
    """Step1's score bias float32 [num_heads, T, num_keys]: -slope * sqrt(query position - key position)
    for int query positions [T] (absolute, from 0), 0 where the key lies after the query (the causal
    mask hides those). Added to the scaled scores (seed 002)."""
    s = np.asarray(slopes, np.float64)[:, None, None]
    dist = np.asarray(query_positions, np.float64)[:, None] - np.arange(num_keys, dtype=np.float64)[None, :]
    return (-s * np.sqrt(np.maximum(dist, 0.0))[None]).astype(np.float32)


def query_temperature(positions: np.ndarray, beta: float, divisor: int, offset: int = 0) -> np.ndarray:
    """Llama 4's per-position query scale, float32 [len(positions), 1], for int positions [T]."""
    scale = 1.0 + beta * np.log1p(np.floor((positions.astype(np.float64) + offset) / divisor))
    return scale.astype(np.float32)[:, None]
