"""Scaled dot-product attention with grouped key/value heads (GQA).

Vaswani et al. 2017; grouped-query attention: Ainslie et al. 2023 (arXiv:2305.13245).
Causal and sliding-window masks are exact: query at absolute position p sees keys
at positions j with j <= p and, under a window w, j > p - w (w positions, itself
included), as Transformers' masking_utils defines the sliding window. Gemma 2's
logit soft-capping applies cap * tanh(scores / cap) before the mask.
"""
from __future__ import annotations

import numpy as np


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray, *, scale: float,
              window: int | None = None, softcap: float | None = None, bias: np.ndarray | None = None,
              sinks: np.ndarray | None = None) -> np.ndarray:
    """Attend new queries to all cached keys.

    Args:
        q: float32 [num_heads, T, head_dim], queries at absolute ``positions`` (int [T]).
        k, v: float32 [num_kv_heads, S, head_dim], keys/values at positions 0..S-1.
        scale: multiplies q.k (usually head_dim ** -0.5).
        window: sliding window length in positions, or None.
        softcap: attention logit soft-cap, or None.
        bias: optional additive score bias broadcastable to float32 [num_heads, T, S]
            (ALiBi and other position biases), added after scaling and soft-capping.
        sinks: optional float32 [num_heads] learned logit per head that joins the softmax
            denominator without a value (attention sinks, gpt-oss / Granite SWA).

    Returns:
        float32 [num_heads, T, head_dim].
    """
    H, T, D = q.shape
    KV, S, _ = k.shape
    G = H // KV
    scores = (q.reshape(KV, G * T, D) @ k.transpose(0, 2, 1)).reshape(KV, G, T, S)
    scores *= np.float32(scale)
    if softcap:
        scores = np.tanh(scores / np.float32(softcap)) * np.float32(softcap)
    if bias is not None:
        scores += np.asarray(bias, np.float32).reshape(KV, G, *np.shape(bias)[-2:]) if np.ndim(bias) == 3 else bias
    key_pos = np.arange(S)
    visible = key_pos[None, :] <= positions[:, None]
    if window is not None:
        visible &= key_pos[None, :] > positions[:, None] - window
    scores = np.where(visible, scores, np.float32(-np.inf))
    peak = scores.max(axis=-1, keepdims=True)
    if sinks is not None:
        sink = np.asarray(sinks, np.float32).reshape(KV, G, 1, 1)
        peak = np.maximum(peak, sink)
    scores -= peak
    np.exp(scores, out=scores)
    total = scores.sum(axis=-1, keepdims=True)
    if sinks is not None:
        total = total + np.exp(sink - peak)
    scores /= total
    out = scores.reshape(KV, G * T, S) @ v
    return out.reshape(H, T, D)
