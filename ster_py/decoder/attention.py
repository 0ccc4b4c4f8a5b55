"""Scaled dot-product attention with grouped key/value heads (GQA).

Vaswani et al. 2017; grouped-query attention: Ainslie et al. 2023 (arXiv:2305.13245).
Causal and sliding-window masks are exact: query at absolute position p sees keys
at positions j with j <= p and, under a window w, j > p - w (w positions, itself
included), as Transformers' masking_utils defines the sliding window. Gemma 2's
logit soft-capping applies cap * tanh(scores / cap) before the mask.

Float32 queries over float32 or float16 keys/values run the fused Cython kernel
(``ster_py._kernels.ops.attention``: one pass per query row over only the keys
it may see, with an online softmax, threaded over heads and rows and, when
decoding with few key/value heads, over parts of the keys merged afterwards;
float16 rows are widened to float32 as they are read, never the whole cache);
``attention_reference`` is the numpy definition it is tested against and the
fallback for anything the kernel does not take. Float16 keys/values mean their
exact float32 values: all arithmetic is float32 either way.
"""
from __future__ import annotations

import numpy as np

from ._fast import ops as _ops


def _kernel_bias(bias, H: int, T: int, S: int):
    """bias as float32 [H or 1, T or 1, S] with a contiguous last axis, or False if it has another shape."""
    b = np.asarray(bias, dtype=np.float32)
    if b.ndim > 3 or b.ndim == 0 or b.shape[-1] != S:
        return False
    b = b.reshape((1,) * (3 - b.ndim) + b.shape)
    if b.shape[0] not in (1, H) or b.shape[1] not in (1, T):
        return False
    return b if b.strides[2] == 4 else np.ascontiguousarray(b)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray, *, scale: float,
              window: int | None = None, softcap: float | None = None, bias: np.ndarray | None = None,
              sinks: np.ndarray | None = None) -> np.ndarray:
    """Attend new queries to all cached keys.

    Args:
        q: float32 [num_heads, T, head_dim], queries at absolute ``positions`` (int [T]).
        k, v: float32 or float16 (both the same) [num_kv_heads, S, head_dim], keys/values at
            positions 0..S-1 (a float16 cache: ``KVCache(dtype=np.float16)``).
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
    if _ops is not None:
        b = None
        if bias is not None:
            b = _kernel_bias(bias, q.shape[0], q.shape[1], k.shape[1]) if q.ndim == k.ndim == 3 else False
        if b is not False:
            # None: inputs the kernel does not take (not float32, ...)
            out = _ops.attention(q, k, v, positions, scale, window or 0, softcap or 0.0, b, sinks)
            if out is not None:
                return out
    return attention_reference(q, k, v, positions, scale=scale, window=window, softcap=softcap, bias=bias,
                               sinks=sinks)


def attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray, *, scale: float,
                        window: int | None = None, softcap: float | None = None, bias: np.ndarray | None = None,
                        sinks: np.ndarray | None = None) -> np.ndarray:
    """The numpy definition of ``attention`` (same arguments): full score matrix, masked softmax.

    float16 k, v are widened to float32 first (exactly), so the math is the float32 one."""
    if k.dtype == np.float16:
        k = k.astype(np.float32)
    if v.dtype == np.float16:
        v = v.astype(np.float32)
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
