"""The gated delta net mixer (``LayerSpec.mixer`` ``"gated_delta"``): Qwen3-Next, Qwen3.5, OLMo Hybrid.

Yang, Kautz & Hatamizadeh 2024, "Gated Delta Networks: Improving Mamba2 with Delta Rule"
(arXiv:2412.06464), as Transformers' ``Qwen3NextGatedDeltaNet``, ``Qwen3_5GatedDeltaNet`` and
``OlmoHybridGatedDeltaNet`` and llama.cpp's ``qwen3next`` / ``qwen35`` graphs compute it. For
x float32 [T, hidden]:

1. projections give the queries and keys (Hk key heads of K), the values and output gates z
   (Hv value heads of V), and per value head a write input b and a decay input a. Their storage
   differs by family and is undone here: Qwen3-Next's ``in_proj_qkvz`` holds, per key head, its
   query, key, and the values and gates of the value heads it serves, and ``in_proj_ba`` per key
   head their b then their a; Qwen3.5's ``in_proj_qkv`` holds every query, key, then value, beside
   ``in_proj_z``, ``in_proj_b``, ``in_proj_a``; OLMo Hybrid projects each apart (``q_proj`` ...
   ``g_proj``);
2. queries, keys and values pass one causal depthwise convolution and SiLU (``conv.causal_conv1d``);
3. queries and keys are L2-normalised per head, queries scaled by K^-0.5;
4. per value head: write strength beta = sigmoid(b) (times 2 under OLMo's
   ``linear_allow_neg_eigval``), decay exp(g) with g = -exp(A_log) * softplus(a + dt_bias), and the
   delta rule over its [V, K] state (``delta_rule``);
5. the read-out is RMS-normalised per value head, scaled by ``norm``, times SiLU of z
   (``gated_head_norm``), and ``out_proj`` maps it back to the model width.

``DeltaSpec`` holds the shape (also Kimi Delta Attention's, ``decoder/kda.py``). The
convolution's last K - 1 inputs and the [Hv, V, K] state are the layer's ``RecurrentState``
slot; the state is kept transposed (value channel first) against Transformers' [Hv, K, V].
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import SterError
from ._fast import delta as _delta
from .activations import sigmoid, silu, softplus
from .cache import RecurrentState
from .conv import causal_conv1d
from .linear import make_linear
from .norms import rms_norm
from .parts import Part
from .ssm import vector



@dataclass(frozen=True)
class DeltaSpec:
    """The shape of a model's delta-rule layers.

    Attributes:
        kind: ``"gated_delta"`` (one decay per value head and token) or ``"kda"`` (Kimi Delta
            Attention: one per key channel, ``decoder/kda.py``).
        num_k_heads, head_k_dim: the query/key heads and their width K.
        num_v_heads, head_v_dim: the value heads and their width V (a multiple of the key heads).
        conv_kernel: the causal convolution's taps.
        kv_map: which key head a value head reads: ``"grouped"`` (value head h reads h // (Hv / Hk),
            Transformers' repeat_interleave) or ``"tiled"`` (h % Hk: llama.cpp's qwen35 files,
            whose converter reorders the value heads so).
        beta_scale: the write strength's factor (2 under OLMo Hybrid's linear_allow_neg_eigval).
        norm_eps: the gated output norm's epsilon.
        l2_eps: the epsilon of the queries' and keys' L2 norms (x / sqrt(sum(x^2) + eps)).
        gate_act: the output gate's activation: ``"silu"`` (gated delta net) or ``"sigmoid"`` (KDA).
        safe_gate: KDA: the log-decay is ``lower_bound * sigmoid(exp(A_log) * (f + dt_bias))``
            instead of ``-exp(A_log) * softplus(f + dt_bias)``.
        lower_bound: that bound (negative).
    """

    kind: str
    num_k_heads: int
    head_k_dim: int
    num_v_heads: int
    head_v_dim: int
    conv_kernel: int
    kv_map: str = "grouped"
    beta_scale: float = 1.0
    norm_eps: float = 1e-6
    l2_eps: float = 1e-6
    gate_act: str = "silu"
    safe_gate: bool = False
    lower_bound: float = -5.0

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: queries, keys and values."""
        return 2 * self.key_dim + self.value_dim

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """One layer's recurrent state: the convolution's last inputs and the [Hv, V, K] state."""
        return {"conv": (self.conv_kernel - 1, self.conv_dim),
                "ssm": (self.num_v_heads, self.head_v_dim, self.head_k_dim)}

    def state_bytes(self) -> int:
        """Bytes of one layer's recurrent state (float32)."""
        return 4 * sum(math.prod(s) for s in self.state_shapes().values())

    def tensor_shapes(self, hidden: int) -> dict[tuple[str, str], tuple[int, ...]]:
        """(role, kind) -> shape of the mixer's tensors (``layout.expected_shapes``); the roles in
        ``layout.RESHAPED_ROLES`` may be stored in another shape of the same size."""
        kd, vd, hv, c, k = self.key_dim, self.value_dim, self.num_v_heads, self.conv_dim, self.conv_kernel
        per_head = hv if self.kind == "gated_delta" else self.value_dim  # KDA: one per key channel
        out = {("lin_qkvz", "weight"): (2 * kd + 2 * vd, hidden), ("lin_ba", "weight"): (2 * hv, hidden),
               ("lin_qkv", "weight"): (c, hidden), ("lin_z", "weight"): (vd, hidden),
               ("lin_b", "weight"): (hv, hidden), ("lin_a", "weight"): (hv, hidden),
               ("lin_q", "weight"): (kd, hidden), ("lin_k", "weight"): (kd, hidden), ("lin_v", "weight"): (vd, hidden),
               ("lin_conv", "weight"): (c, k), ("lin_conv", "bias"): (c,),
               ("lin_dt_bias", ""): (per_head,), ("lin_a_log", ""): (hv,), ("lin_ssm_a", ""): (hv,),
               ("lin_exp_a", ""): (hv,),
               ("lin_norm", "weight"): (self.head_v_dim,), ("lin_out", "weight"): (hidden, vd),
               ("lin_f_a", "weight"): (self.head_k_dim, hidden), ("lin_f_b", "weight"): (vd, self.head_k_dim),
               ("lin_g_a", "weight"): (self.head_v_dim, hidden), ("lin_g_b", "weight"): (vd, self.head_v_dim),
               ("lin_f", "weight"): (vd, hidden), ("lin_g", "weight"): (vd, hidden)}
        return out


# ------------------------------------------------------------------------- the delta rule


def delta_rule(q, k, v, decay, beta, state: np.ndarray, kv_map: str = "grouped") -> np.ndarray:
    """The delta rule over T tokens from ``state``, updated in place (step 4 of the module docstring).

    Args:
        q, k: float32 [T, Hk * K], q L2-normalised and scaled, k L2-normalised.
        v: float32 [T, Hv * V].
        decay: float32 [T, Hv] (a factor exp(g) per value head) or [T, Hv * K] (per key channel, KDA).
        beta: float32 [T, Hv].
        state: float32 [Hv, V, K].
        kv_map: ``"grouped"`` or ``"tiled"`` (``DeltaSpec.kv_map``).

    Returns:
        float32 [T, Hv * V]. The kernel is ``ster_py._kernels.delta.delta_rule``;
        ``delta_rule_reference`` is its numpy definition.
    """
    if _delta is not None and all(a.dtype == np.float32 and (a.shape[-1] <= 1 or a.strides[-1] == 4)
                                  for a in (q, k, v, decay, beta)):
        out = np.empty(v.shape, np.float32)
        _delta.delta_rule(q, k, v, decay, beta, state, out, 1 if kv_map == "tiled" else 0)
        return out
    y, new = delta_rule_reference(q, k, v, decay, beta, state, kv_map)
    state[...] = new
    return y


def delta_rule_reference(q, k, v, decay, beta, state, kv_map: str = "grouped") -> tuple[np.ndarray, np.ndarray]:
    """The numpy definition of ``delta_rule``: (float32 [T, Hv * V], the new state [Hv, V, K]);
    ``state`` is left as it was. As Transformers' ``torch_recurrent_gated_delta_rule``, with the
    state transposed: S [V, K] per head, S = S * decay; S += beta (v - S k) k^T; out = S q."""
    Hv, V, K = state.shape
    T = q.shape[0]
    Hk = q.shape[1] // K
    key_head = np.arange(Hv) % Hk if kv_map == "tiled" else np.arange(Hv) // (Hv // Hk)
    s = state.astype(np.float32).copy()
    out = np.empty((T, Hv, V), np.float32)
    for t in range(T):
        qt, kt = q[t].reshape(Hk, K)[key_head], k[t].reshape(Hk, K)[key_head]  # [Hv, K]
        vt = v[t].reshape(Hv, V)
        d = decay[t].reshape(Hv, 1, -1)  # [Hv, 1, 1] or [Hv, 1, K]
        s = s * d
        delta = beta[t][:, None] * (vt - np.einsum("hvk,hk->hv", s, kt))
        s = s + delta[:, :, None] * kt[:, None, :]
        out[t] = np.einsum("hvk,hk->hv", s, qt)
    return out.reshape(T, Hv * V), s


def l2_heads(x: np.ndarray, heads: int, eps: float) -> np.ndarray:
    """x float32 [T, heads * d] with each head's d numbers divided by sqrt(sum of squares + eps)
    (FLA's l2norm, Transformers' and llama.cpp's ``build_gdn_l2_norm``)."""
    T = x.shape[0]
    h = x.reshape(T, heads, -1)
    return (h / np.sqrt(np.sum(np.square(h), axis=-1, keepdims=True) + np.float32(eps))).reshape(T, -1)


def gated_head_norm(y: np.ndarray, z: np.ndarray, weight: np.ndarray, head_dim: int, eps: float,
                    act: str = "silu") -> np.ndarray:
    """Step 5: y float32 [T, H * d] RMS-normalised over each head's d numbers, times ``weight`` [d],
    times act(z) (``"silu"``: Transformers' ``Qwen3NextRMSNormGated``; ``"sigmoid"``: Kimi's
    ``KimiLinearRMSNormGated``)."""
    T = y.shape[0]
    h = rms_norm(y.reshape(T, -1, head_dim).astype(np.float32, copy=False), weight, eps)
    gate = silu(z) if act == "silu" else sigmoid(z)
    return (h.reshape(T, -1) * gate).astype(np.float32, copy=False)


def conv_weights(load, spec: DeltaSpec) -> tuple[np.ndarray, np.ndarray | None]:
    """The convolution over [queries | keys | values]: one stored tensor (``lin_conv``), or the
    three of Kimi's and OLMo-core's checkpoints (``lin_q_conv``, ``lin_k_conv``, ``lin_v_conv``)
    joined in that order, as Transformers joins them (which also reads three equal thirds, as its own
    writer splits the joined tensor). Returns (float32 [conv_dim, taps], bias or None).

    Raises:
        SterError: the convolution is missing, or its parts do not make up [conv_dim, taps].
    """
    k = spec.conv_kernel
    whole = load("lin_conv")
    if whole is not None:
        return vector(whole, (spec.conv_dim, k)), vector(load("lin_conv", "bias"), (spec.conv_dim,))
    parts = [load(r, required=True) for r in ("lin_q_conv", "lin_k_conv", "lin_v_conv")]
    rows = [int(np.prod(p.shape)) // k if int(np.prod(p.shape)) % k == 0 else -1 for p in parts]
    if -1 in rows or sum(rows) != spec.conv_dim:
        raise SterError(f"the linear attention's q/k/v convolutions have shapes {[list(p.shape) for p in parts]}, "
                        f"but the configuration implies {spec.conv_dim} channels of {k} taps in all; the weights "
                        "and the config disagree")
    return np.ascontiguousarray(np.concatenate([vector(p, (r, k)) for p, r in zip(parts, rows)])), None


class GatedDeltaNet(Part):
    """The gated delta net mixer of one layer (module docstring).

    Args:
        spec: the ``ModelSpec`` (its ``delta``: ``DeltaSpec`` of kind ``"gated_delta"``).
        i: the layer.
        load: ``load(role, kind="weight", required=False)`` -> the layer's array: the projections
            (``lin_qkvz`` + ``lin_ba``, or ``lin_qkv`` / ``lin_q``, ``lin_k``, ``lin_v`` with
            ``lin_z``, ``lin_b``, ``lin_a``), the convolution (``lin_conv`` or its three parts),
            ``lin_dt_bias``, ``lin_a_log`` (or llama.cpp's ``lin_ssm_a`` = -exp(A_log)),
            ``lin_norm`` and ``lin_out``.
        norm: unused.

    Calling it maps float32 [T, hidden] to float32 [T, hidden] and advances the layer's
    ``RecurrentState``. It has no projection adapters take (``ROLES``: seed 002 refuses them).

    Raises:
        SterError: a tensor the layer needs is missing or has the wrong shape.
    """

    KV = False

    def __init__(self, spec, i: int, load, norm):
        s = self.delta = spec.delta
        self.i = i
        hv, hk, kd, vd = s.num_v_heads, s.num_k_heads, s.key_dim, s.value_dim
        self._perm = self._ba_perm = None
        qkvz = load("lin_qkvz")
        if qkvz is not None:  # Qwen3-Next: per key head [q, k, its values, their gates]
            self.in_proj = make_linear(qkvz)
            r, K, V = hv // hk, s.head_k_dim, s.head_v_dim
            block = np.arange(hk * (2 * K + 2 * r * V)).reshape(hk, 2 * K + 2 * r * V)
            q, kk = block[:, :K], block[:, K:2 * K]
            vv, zz = block[:, 2 * K:2 * K + r * V], block[:, 2 * K + r * V:]
            self._perm = np.concatenate([q.ravel(), kk.ravel(), vv.ravel(), zz.ravel()])
            self._roles = ("in_proj",)
        else:
            qkv = load("lin_qkv")
            if qkv is not None:
                self.in_qkv = make_linear(qkv)
                roles = ("in_qkv",)
            else:
                self.in_q, self.in_k, self.in_v = (make_linear(load(r, required=True))
                                                   for r in ("lin_q", "lin_k", "lin_v"))
                roles = ("in_q", "in_k", "in_v")
            self.in_z = make_linear(load("lin_z", required=True))
            self._roles = roles + ("in_z",)
        ba = load("lin_ba")
        if ba is not None:  # per key head [its values' b, their a]
            self.in_ba = make_linear(ba)
            r = hv // hk
            block = np.arange(2 * hv).reshape(hk, 2 * r)
            self._ba_perm = np.concatenate([block[:, :r].ravel(), block[:, r:].ravel()])
            self._ab_roles = ("in_ba",)
        else:
            self.in_b, self.in_a = (make_linear(load(r, required=True)) for r in ("lin_b", "lin_a"))
            self._ab_roles = ("in_b", "in_a")
        self.conv_w, self.conv_b = conv_weights(load, s)
        self.dt_bias = vector(load("lin_dt_bias", "", required=True), (hv,))
        a_log = load("lin_a_log", "")
        self.A = (-np.exp(vector(a_log, (hv,))) if a_log is not None
                  else vector(load("lin_ssm_a", "", required=True), (hv,)))
        self.norm_w = vector(load("lin_norm", required=True), (s.head_v_dim,))
        self.out_proj = make_linear(load("lin_out", required=True))
        self._kd, self._vd = kd, vd

    def new_slot(self, dtype=None) -> RecurrentState:
        """The layer's recurrent state (float32 whatever ``dtype``, the key/value cache's)."""
        return RecurrentState(self.delta.state_shapes())

    def read_order(self) -> list[tuple]:
        return [tuple(getattr(self, r) for r in self._roles + self._ab_roles), (self.out_proj,)]

    def _project(self, x: np.ndarray):
        """(qkv [T, conv_dim] with rows contiguous, z [T, Hv * V], b [T, Hv], a [T, Hv])."""
        kd, vd = self._kd, self._vd
        roles = self._roles + self._ab_roles
        outs = self.project(roles, x) if len(roles) > 1 else (getattr(self, roles[0])(x),)
        if self._perm is not None:
            p = outs[0][:, self._perm]
            qkv, z, rest = p[:, :2 * kd + vd], p[:, 2 * kd + vd:], outs[1:]
        elif len(self._roles) == 2:
            qkv, z, rest = outs[0], outs[1], outs[2:]
        else:
            qkv, z, rest = np.concatenate(outs[:3], axis=1), outs[3], outs[4:]
        if self._ba_perm is not None:
            ba = rest[0][:, self._ba_perm]
            hv = self.delta.num_v_heads
            b, a = ba[:, :hv], ba[:, hv:]
        else:
            b, a = rest
        return qkv, z, b, a

    def __call__(self, x: np.ndarray, cache, positions, bias=None, tables=None) -> np.ndarray:
        s, state = self.delta, cache.slot(self.i)
        kd = self._kd
        qkv, z, b, a = self._project(x)
        mixed = causal_conv1d(qkv, self.conv_w, self.conv_b, state["conv"])
        q = l2_heads(mixed[:, :kd], s.num_k_heads, s.l2_eps) * np.float32(s.head_k_dim ** -0.5)
        k = l2_heads(mixed[:, kd:2 * kd], s.num_k_heads, s.l2_eps)
        beta = sigmoid(b)
        if s.beta_scale != 1.0:
            beta = beta * np.float32(s.beta_scale)
        decay = np.exp(self.A * softplus(a + self.dt_bias)).astype(np.float32)
        y = delta_rule(q, k, np.ascontiguousarray(mixed[:, 2 * kd:]), decay, np.ascontiguousarray(beta),
                       state["ssm"], s.kv_map)
        return self.out_proj(gated_head_norm(y, z, self.norm_w, s.head_v_dim, s.norm_eps, s.gate_act))
