"""Kimi Delta Attention (``LayerSpec.mixer`` ``"kda"``): Kimi-Linear's linear-attention layers.

Kimi Team 2025, "Kimi Linear: An Expressive, Efficient Attention Architecture" (arXiv:2510.26692),
as Transformers' ``KimiLinearDeltaAttention`` (and GLM-5-Next's ``Glm5NextTextLinearAttention``,
whose forget gate has the safe-gate bound) and llama.cpp's ``kimi-linear`` graph compute it. It is
the gated delta net (``decoder/delta.py``) with, for x float32 [T, hidden] and H heads of D:

1. separate ``q_proj``, ``k_proj``, ``v_proj`` (H * D each) through one causal depthwise
   convolution and SiLU (stored whole, or as Kimi's own ``q_conv1d``, ``k_conv1d``, ``v_conv1d``);
2. a decay per key channel from the low-rank forget gate f = f_b(f_a(x)) [T, H * D] (or a full-rank
   ``f_proj``, Ling 3.0's):
   g = -exp(A_log[h]) * softplus(f + dt_bias), or under the safe gate
   g = lower_bound * sigmoid(exp(A_log[h]) * (f + dt_bias)); write strength sigmoid(b_proj(x));
3. the delta rule over each head's [D, D] state with that per-channel decay;
4. the read-out RMS-normalised per head (``o_norm``) times the sigmoid of g_b(g_a(x)) (or of a
   full-rank ``g_proj``, Ling 3.0's), then ``o_proj``.

The state slot is the same as the gated delta net's (``DeltaSpec.state_shapes``).
"""
from __future__ import annotations

import numpy as np

from .activations import sigmoid, softplus
from .cache import RecurrentState
from .conv import causal_conv1d
from .delta import conv_weights, delta_rule, gated_head_norm, l2_heads
from .linear import make_linear
from .parts import Part
from .ssm import vector


def kda_log_decay(f: np.ndarray, dt_bias: np.ndarray, a_log: np.ndarray, head_dim: int, safe_gate: bool,
                  lower_bound: float) -> np.ndarray:
    """Step 2's log-decay g float32 [T, H * D] from the forget-gate input f float32 [T, H * D],
    dt_bias [H * D] and A_log [H] (Transformers' ``KimiLinearForgetGate``, GLM-5-Next's
    ``Glm5NextTextForgetGate`` under ``safe_gate``)."""
    T = f.shape[0]
    u = (f + dt_bias).reshape(T, -1, head_dim)
    rate = np.exp(a_log)[None, :, None].astype(np.float32)
    g = np.float32(lower_bound) * sigmoid(rate * u) if safe_gate else -rate * softplus(u)
    return g.reshape(T, -1).astype(np.float32, copy=False)


class KimiDeltaAttention(Part):
    """The Kimi Delta Attention mixer of one layer (module docstring).

    Args:
        spec: the ``ModelSpec`` (its ``delta``: ``DeltaSpec`` of kind ``"kda"``).
        i: the layer.
        load: ``load(role, kind="weight", required=False)`` -> the layer's array: ``lin_q``,
            ``lin_k``, ``lin_v``, the convolution (``lin_conv`` or ``lin_q_conv`` / ``lin_k_conv`` /
            ``lin_v_conv``), ``lin_f_a`` and ``lin_f_b`` (or the full-rank ``lin_f``), ``lin_dt_bias``,
            ``lin_a_log`` (or llama.cpp's ``lin_ssm_a`` = -exp(A_log) of kimi-linear files, or
            ``lin_exp_a`` = exp(A_log) of bailingmoe3 files), ``lin_b``, ``lin_g_a`` and ``lin_g_b``
            (or ``lin_g``), ``lin_norm``, ``lin_out``.
        norm: unused.

    Calling it maps float32 [T, hidden] to float32 [T, hidden] and advances the layer's
    ``RecurrentState``. It has no projection adapters take (seed 002 refuses them).

    Raises:
        SterError: a tensor the layer needs is missing or has the wrong shape.
    """

    KV = False

    def __init__(self, spec, i: int, load, norm):
        s = self.delta = spec.delta
        self.i = i
        h, d = s.num_v_heads, s.head_k_dim
        self.in_q, self.in_k, self.in_v, self.in_b = (
            make_linear(load(r, required=True)) for r in ("lin_q", "lin_k", "lin_v", "lin_b"))
        # each gate's projection: full rank (lin_f / lin_g, Ling 3.0) or Kimi's two factors (f_b is then
        # applied to f_a's output, g_b to g_a's)
        f_full, g_full = load("lin_f"), load("lin_g")
        self.f_a = make_linear(f_full if f_full is not None else load("lin_f_a", required=True))
        self.g_a = make_linear(g_full if g_full is not None else load("lin_g_a", required=True))
        self.f_b = make_linear(load("lin_f_b", required=True)) if f_full is None else None
        self.g_b = make_linear(load("lin_g_b", required=True)) if g_full is None else None
        self.conv_w, self.conv_b = conv_weights(load, s)
        self.dt_bias = vector(load("lin_dt_bias", "", required=True), (h * d,))
        a_log, exp_a = load("lin_a_log", ""), load("lin_exp_a", "")
        if a_log is not None:
            self.a_log = vector(a_log, (h,))
        elif exp_a is not None:  # exp(A_log), as llama.cpp's bailingmoe3 converter stores it
            self.a_log = np.log(vector(exp_a, (h,))).astype(np.float32)
        else:  # -exp(A_log), as its kimi-linear converter stores it
            self.a_log = np.log(-vector(load("lin_ssm_a", "", required=True), (h,))).astype(np.float32)
        self.norm_w = vector(load("lin_norm", required=True), (s.head_v_dim,))
        self.out_proj = make_linear(load("lin_out", required=True))

    def new_slot(self, dtype=None) -> RecurrentState:
        """The layer's recurrent state (float32 whatever ``dtype``, the key/value cache's)."""
        return RecurrentState(self.delta.state_shapes())

    def read_order(self) -> list[tuple]:
        factors = [(p,) for p in (self.f_b, self.g_b) if p is not None]
        return [(self.in_q, self.in_k, self.in_v, self.in_b), (self.f_a, self.g_a)] + factors + [(self.out_proj,)]

    def __call__(self, x: np.ndarray, cache, positions, bias=None, tables=None) -> np.ndarray:
        s, state = self.delta, cache.slot(self.i)
        h, d = s.num_v_heads, s.head_k_dim
        q, k, v, b = self.project(("in_q", "in_k", "in_v", "in_b"), x)
        f_low, g_low = self.project(("f_a", "g_a"), x)
        mixed = causal_conv1d(np.concatenate([q, k, v], axis=1), self.conv_w, self.conv_b, state["conv"])
        q = l2_heads(mixed[:, :h * d], h, s.l2_eps) * np.float32(d ** -0.5)
        k = l2_heads(mixed[:, h * d:2 * h * d], h, s.l2_eps)
        f = f_low if self.f_b is None else self.f_b(f_low)
        gate_in = g_low if self.g_b is None else self.g_b(g_low)
        g = kda_log_decay(f, self.dt_bias, self.a_log, d, s.safe_gate, s.lower_bound)
        y = delta_rule(q, k, mixed[:, 2 * h * d:], np.exp(g), sigmoid(b), state["ssm"], s.kv_map)
        return self.out_proj(gated_head_norm(y, gate_in, self.norm_w, s.head_v_dim, s.norm_eps, "sigmoid"))
