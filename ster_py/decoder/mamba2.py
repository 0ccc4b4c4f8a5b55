"""Mamba-2's multi-head scan mixer (``LayerSpec.mixer`` ``"mamba2"``).

Dao & Gu 2024, "Transformers are SSMs" (arXiv:2405.21060), as Transformers' ``Mamba2Mixer``
(and Bamba's, Granite 4.0's, Nemotron-H's, Falcon-H1's copies) and llama.cpp's
``build_mamba2_layer`` compute it. For x float32 [T, hidden]:

1. ``in_proj`` -> the gate z (d_inner), the stream s (d_inner), B and C (n_groups * d_state
   each) and one step per head;
2. s, B and C together through the causal depthwise convolution and SiLU;
3. per head h of head_dim channels: ``dt = clamp(softplus(step + dt_bias), dt_min, dt_max)``,
   one scalar decay ``exp(dt * A[h])`` (A = -exp(A_log)) for the head's [head_dim, d_state]
   state, ``state = decay * state + dt * s_h (x) B_g``, output ``state . C_g + D[h] * s_h``, the
   head's group g giving B and C (``multihead_scan``);
4. y * silu(z), RMS-normalised over each group's d_inner / n_groups share with the stored
   ``norm`` scale (``gated_group_norm``; Falcon-H1 may leave the norm out);
5. ``out_proj`` back to the model width.

Falcon-H1's multipliers (``ModelSpec.mup``) scale the input, the five parts of ``in_proj``'s
output and the output. The convolution's last d_conv - 1 inputs and the [heads, head_dim,
d_state] state are the layer's ``RecurrentState`` slot.
"""
from __future__ import annotations

import numpy as np

from ._fast import scan as _scan
from .activations import silu, softplus
from .cache import RecurrentState
from .conv import causal_conv1d
from .linear import make_linear
from .norms import rms_norm
from .parts import Part
from .ssm import vector


def multihead_scan(x, dt, dt_bias, A, B, C, D, state: np.ndarray, dt_min: float = 0.0,
                   dt_max: float = np.inf) -> np.ndarray:
    """Mamba-2's scan from ``state`` over T tokens (step 3 above), updating ``state`` in place.

    Args:
        x: float32 [T, H * P]. dt: float32 [T, H], the step before its bias and softplus;
            dt_bias: float32 [H] or None. A: float32 [H] (negative).
        B, C: float32 [T, G * N] (G groups; H a multiple of G). D: float32 [H].
        state: float32 [H, P, N].
        dt_min, dt_max: the clamp of the step after softplus.

    Returns:
        float32 [T, H * P]. The kernel is ``ster_py._kernels.scan.multihead_scan``;
        ``multihead_scan_reference`` is its numpy definition.
    """
    if _scan is not None and all(a.dtype == np.float32 and (a.shape[-1] <= 1 or a.strides[-1] == 4)
                                 for a in (x, dt, B, C)):
        out = np.empty(x.shape, np.float32)
        _scan.multihead_scan(x, dt, dt_bias, A, B, C, D, state, out, float(dt_min), float(dt_max))
        return out
    y, new = multihead_scan_reference(x, dt, dt_bias, A, B, C, D, state, dt_min, dt_max)
    state[...] = new
    return y


def multihead_scan_reference(x, dt, dt_bias, A, B, C, D, state, dt_min=0.0, dt_max=np.inf):
    """The numpy definition of ``multihead_scan``: (float32 [T, H * P], the new state [H, P, N]);
    ``state`` is left as it was."""
    H, P, N = state.shape
    T = x.shape[0]
    G = B.shape[1] // N
    h = state.astype(np.float32).copy()
    delta = np.clip(softplus(dt + (dt_bias if dt_bias is not None else np.float32(0.0))),
                    np.float32(dt_min), np.float32(dt_max))
    group = np.arange(H) // (H // G)
    out = np.empty((T, H, P), np.float32)
    for t in range(T):
        b = B[t].reshape(G, N)[group]  # [H, N]
        c = C[t].reshape(G, N)[group]
        xt = x[t].reshape(H, P)
        d = delta[t][:, None, None]
        h = np.exp(d * A[:, None, None]) * h + b[:, None, :] * (d * xt[:, :, None])
        out[t] = np.einsum("hpn,hn->hp", h, c) + D[:, None] * xt
    return out.reshape(T, H * P), h


def gated_group_norm(y: np.ndarray, z: np.ndarray, weight: np.ndarray | None, groups: int, eps: float) -> np.ndarray:
    """Step 4: (y * silu(z)) RMS-normalised over each of ``groups`` equal shares of the last axis,
    times ``weight`` (float32 [d]); with ``weight`` None, only y * silu(z). Transformers'
    ``MambaRMSNormGated`` (norm_before_gate=False); llama.cpp's grouped ``build_norm``."""
    g = y * silu(z)
    if weight is None:
        return g.astype(np.float32, copy=False)
    T, d = g.shape
    parts = rms_norm(g.reshape(T, groups, d // groups).astype(np.float32, copy=False), None, eps)
    return (parts.reshape(T, d) * weight).astype(np.float32, copy=False)


class Mamba2(Part):
    """The multi-head scan mixer of one layer (module docstring).

    Args:
        spec: the ``ModelSpec`` (its ``ssm``: ``SSMSpec`` of kind ``"mamba2"``; ``mup``).
        i: the layer.
        load: ``load(role, kind="weight", required=False)`` -> the layer's array: ``ssm_in``,
            ``ssm_conv``, ``ssm_dt_bias``, ``ssm_a_log`` (or llama.cpp's ``ssm_a``), ``ssm_d``,
            ``ssm_norm`` and ``ssm_out``.
        norm: unused.

    Calling it maps float32 [T, hidden] to float32 [T, hidden] and advances the layer's
    ``RecurrentState``. It has no projection adapters take (``ROLES``).
    """

    KV = False

    def __init__(self, spec, i: int, load, norm):
        s = self.ssm = spec.ssm
        self.i, self.mup = i, spec.mup
        di, h, k = s.d_inner, s.num_heads, s.d_conv
        self.in_proj = make_linear(load("ssm_in", required=True), load("ssm_in", "bias"))
        self.conv_w = vector(load("ssm_conv", required=True), (s.conv_dim, k))
        self.conv_b = vector(load("ssm_conv", "bias"), (s.conv_dim,))
        self.dt_bias = vector(load("ssm_dt_bias", "", required=True), (h,))
        a_log = load("ssm_a_log", "")
        self.A = -np.exp(vector(a_log, (h,))) if a_log is not None else vector(load("ssm_a", "", required=True), (h,))
        self.D = vector(load("ssm_d", "", required=True), (h,))
        # A llama.cpp file holds the norm where the model has one (Falcon-H1's is optional).
        self.norm_w = vector(load("ssm_norm", required=s.gated_norm), (di,)) if s.gated_norm else None
        self.out_proj = make_linear(load("ssm_out", required=True), load("ssm_out", "bias"))
        self.part_scale = None
        if self.mup is not None and self.mup.ssm_parts != (1.0,) * 5:
            gn = s.n_groups * s.d_state
            sizes = (di, di, gn, gn, h)
            self.part_scale = np.concatenate([np.full(n, v, np.float32) for n, v in zip(sizes, self.mup.ssm_parts)])

    def new_slot(self, dtype=None) -> RecurrentState:
        """The layer's recurrent state (float32 whatever ``dtype``, the key/value cache's)."""
        return RecurrentState(self.ssm.state_shapes())

    def read_order(self) -> list[tuple]:
        return [(self.in_proj,), (self.out_proj,)]

    def __call__(self, x: np.ndarray, cache, positions, bias=None, tables=None) -> np.ndarray:
        s, m, state = self.ssm, self.mup, cache.slot(self.i)
        di, gn = s.d_inner, s.n_groups * s.d_state
        if m is not None and m.ssm_in != 1.0:
            x = x * np.float32(m.ssm_in)
        p = self.in_proj(x)
        if self.part_scale is not None:
            p = p * self.part_scale
        conv_end = di + s.conv_dim
        xbc = causal_conv1d(p[:, di:conv_end], self.conv_w, self.conv_b, state["conv"])
        y = multihead_scan(xbc[:, :di], p[:, conv_end:], self.dt_bias, self.A, xbc[:, di:di + gn],
                           xbc[:, di + gn:], self.D, state["ssm"], s.dt_min, s.dt_max)
        out = self.out_proj(gated_group_norm(y, p[:, :di], self.norm_w, s.n_groups, s.norm_eps))
        if m is not None and m.ssm_out != 1.0:
            out = out * np.float32(m.ssm_out)
        return out
