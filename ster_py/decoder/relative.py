"""Attention with a learned relative-position bias and residual short convolutions (Inkling).

No rotation: a query at position p scores a key at position j with q.k / head_dim (queries and keys
RMS-normed per head) plus a bias by their distance d = p - j, which the query's own relative state
r = ``rel_r``(x) [heads, d_rel] mixes from the layer's profiles ``rel_profiles`` [d_rel, extent]:
bias = (r_h @ profiles)[d] for 0 <= d < extent, else 0. The extent is the window on sliding layers,
``rel_extent`` on the others; on the others, under ``log_floor``, queries and bias at position p are
multiplied by 1 + log_alpha * ln(max((p + 1) / log_floor, 1)). Keys and values pass a residual short
convolution before their norm and cache (x + a depthwise causal convolution over ``conv_kernel``
positions, float32), and so does the attention's output (``attn_out_conv``); the block applies the same
to its feed-forward's output (``ffn_out_conv``, ``ModelSpec.ffn_out_conv``), its state kept in this
mixer's slot. Source: seed 002 (inkling_text); Transformers 5.24's ``InklingAttention``,
``InklingRelativeLogits``, ``InklingShortConvolution`` and ``InklingDecoderLayer``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .attention import attention
from .cache import RecurrentState
from .conv import causal_conv1d
from .linear import make_linear
from .parts import Part


@dataclass(frozen=True)
class RelativeSpec:
    """``ModelSpec.relative``: the relative bias's profile count ``d_rel`` and the full layers' extent
    ``rel_extent`` (positions), the short convolutions' taps ``conv_kernel``, and the log scaling of the
    full layers (``log_floor`` None: off; ``log_alpha`` its strength)."""

    d_rel: int
    rel_extent: int
    conv_kernel: int
    log_floor: int | None = None
    log_alpha: float = 0.1


def relative_bias(r: np.ndarray, profiles: np.ndarray, positions: np.ndarray, S: int) -> np.ndarray:
    """The score bias of queries at ``positions`` (int [T]) over keys 0..S-1.

    Args:
        r: float32 [T, heads, d_rel], each query's relative state.
        profiles: float32 [d_rel, extent].

    Returns:
        float32 [heads, T, S]: (r[t, h] @ profiles)[p_t - j] where 0 <= p_t - j < extent, else 0.
    """
    extent = profiles.shape[1]
    per_distance = np.ascontiguousarray((r @ profiles).transpose(1, 0, 2))   # [H, T, extent]
    distance = np.asarray(positions, np.int64)[:, None] - np.arange(S)[None, :]  # [T, S]
    inside = (distance >= 0) & (distance < extent)
    idx = np.broadcast_to(np.clip(distance, 0, extent - 1), per_distance.shape[:2] + (S,))
    return np.where(inside, np.take_along_axis(per_distance, idx, axis=-1), np.float32(0))


def log_scale(positions: np.ndarray, floor: int, alpha: float) -> np.ndarray:
    """float32 [T]: 1 + alpha * ln(max((p + 1) / floor, 1)) for each position p."""
    p = np.asarray(positions, np.float32) + np.float32(1)
    return (np.float32(1) + np.float32(alpha) * np.log(np.maximum(p / np.float32(floor), np.float32(1)))
            ).astype(np.float32)


def residual_conv(x: np.ndarray, weight: np.ndarray, state: np.ndarray) -> np.ndarray:
    """x + the depthwise causal convolution of x (float32 [T, C]) with weight [C, K] over ``state``
    [K - 1, C] (updated in place: ``conv.causal_conv1d``, no bias, no activation)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    return x + causal_conv1d(x, weight, None, state, silu=False)


class RelativeAttention(Part):
    """The mixer of the module docstring for one layer (``LayerSpec.mixer`` ``"relative"``).

    Reads ``q``, ``k``, ``v``, ``o``, ``rel_r`` [heads * d_rel, hidden], ``rel_profiles`` [d_rel, extent],
    ``q_norm`` / ``k_norm`` [head_dim], and the convolutions ``k_conv`` / ``v_conv`` [kv * head_dim, 1, K],
    ``attn_out_conv`` [hidden, 1, K] (and the block's ``ffn_out_conv``). Calling it maps x float32
    [T, hidden] (normed) to float32 [T, hidden] and stores keys and values in the cache.
    """

    ROLES = ("q", "k", "v", "o")
    KV = True

    def __init__(self, spec, i: int, load, norm):
        self.spec, self.i, self.layer = spec, i, spec.layers[i]
        self.shape = spec.attention_shape(i)
        for r in self.ROLES:
            object.__setattr__(self, r, make_linear(load(r, required=True), load(r, "bias")))
        self.r = make_linear(load("rel_r", required=True))
        self.profiles = np.asarray(load("rel_profiles", "", required=True), np.float32)
        self.q_norm, self.k_norm = norm("q_norm"), norm("k_norm")
        K = spec.relative.conv_kernel
        self.convs = {name: np.ascontiguousarray(np.asarray(load(role, required=True), np.float32).reshape(-1, K))
                      for name, role in (("k", "k_conv"), ("v", "v_conv"), ("attn_out", "attn_out_conv"))}

    def new_slot(self, dtype) -> RecurrentState:
        """The convolutions' last K - 1 inputs: keys', values', the attention output's and (with
        ``ModelSpec.ffn_out_conv``) the feed-forward output's."""
        _, kv, d, dv = self.shape
        K, E = self.spec.relative.conv_kernel, self.spec.hidden_size
        shapes = {"k": (K - 1, kv * d), "v": (K - 1, kv * dv), "attn_out": (K - 1, E)}
        if self.spec.ffn_out_conv:
            shapes["ffn_out"] = (K - 1, E)
        return RecurrentState(shapes)

    def read_order(self) -> list[tuple]:
        return [(self.q, self.k, self.v), (self.r,), (self.o,)]

    def __call__(self, x: np.ndarray, cache, positions: np.ndarray, bias, tables: dict) -> np.ndarray:
        s, T = self.spec, x.shape[0]
        H, KV, D, Dv = self.shape
        state = cache.slot(self.i)
        q, k, v = self.project(("q", "k", "v"), x)
        k = residual_conv(k, self.convs["k"], state["k"])
        v = residual_conv(v, self.convs["v"], state["v"])
        r = self.r(x).reshape(T, H, s.relative.d_rel)
        q = self.q_norm(np.ascontiguousarray(q.reshape(T, H, D).transpose(1, 0, 2)))
        k = self.k_norm(np.ascontiguousarray(k.reshape(T, KV, D).transpose(1, 0, 2)))
        v = np.ascontiguousarray(v.reshape(T, KV, Dv).transpose(1, 0, 2))
        keys, values = cache.append(self.i, k, v)
        rel = relative_bias(r, self.profiles, positions, keys.shape[1])
        if self.layer.sliding_window is None and s.relative.log_floor is not None:
            tau = log_scale(positions, s.relative.log_floor, s.relative.log_alpha)
            q = q * tau[None, :, None]
            rel = rel * tau[None, :, None]
        if bias is not None:
            rel = rel + bias
        out = attention(q, keys, values, positions, scale=1.0 / D, window=self.layer.sliding_window, bias=rel)
        out = self.o(out.transpose(1, 0, 2).reshape(T, H * Dv))
        return residual_conv(out, self.convs["attn_out"], state["attn_out"])
