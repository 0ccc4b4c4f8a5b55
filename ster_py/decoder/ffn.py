"""The feed-forward sublayer: plain or gated (Shazeer 2020), its activation from ``activations.ACT_FNS``."""
from __future__ import annotations

import numpy as np

from ._fast import ops as _ops
from .activations import ACT_FNS
from .parts import Part

# Activations the fused Cython gate (``ops.glu``) computes: SiLU (0) and the tanh GELU (1).
_GLU_KINDS = {"silu": 0, "gelu_pytorch_tanh": 1, "gelu_tanh": 1, "gelu_new": 1, "gelu_fast": 1}


def gated(act_name: str, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """act(gate) * up for float32 [T, intermediate] arrays (Shazeer 2020's gated feed-forward).

    SiLU and the tanh GELU on C-contiguous float32 run the fused kernel in place on
    ``gate`` (``ster_py._kernels.ops.glu``, tested against ``ACT_FNS``); anything else is
    the numpy definition ``ACT_FNS[act_name](gate) * up``.
    """
    kind = _GLU_KINDS.get(act_name)
    if (_ops is not None and kind is not None and gate.__class__ is np.ndarray and up.__class__ is np.ndarray
            and gate.ndim == 2 and gate.shape == up.shape and gate.dtype == up.dtype == np.float32
            and gate.flags.c_contiguous and up.flags.c_contiguous and gate.flags.writeable):
        _ops.glu(gate, up, kind)
        return gate
    return ACT_FNS[act_name](gate) * up


def swiglu_oai(gate: np.ndarray, up: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """gpt-oss's gated unit: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit).

    float32 [T, n] each -> float32 [T, n] (Transformers' ``GptOssExperts._apply_gate``).
    """
    g = np.minimum(gate, np.float32(limit))
    u = np.clip(up, -np.float32(limit), np.float32(limit))
    with np.errstate(over="ignore"):   # exp(-alpha g) beyond float32 for g far below 0: the product is its limit -0
        return (u + np.float32(1.0)) * (g / (np.float32(1.0) + np.exp(-np.float32(alpha) * g)))


def gaussian_top(x: np.ndarray, sparsity: float, ddof: int = 0) -> np.ndarray:
    """relu(x - (mean + std * z)) per row of x float32 [T, n], z the standard normal's quantile at
    ``sparsity`` (in (0, 1)): keeps what lies above the share ``sparsity`` of a normal fitted to the row.
    Gemma 3n's activation sparsity: Transformers' ``Gemma3nTextMLP._gaussian_topk`` takes the population
    std (``ddof`` 0), llama.cpp's gemma3n.cpp ``gaussian_topk`` the sample std (``ddof`` 1)."""
    from statistics import NormalDist   # here: one family uses it, and importing statistics costs every load ~2 ms

    z = np.float32(NormalDist().inv_cdf(sparsity))
    cutoff = np.mean(x, axis=-1, keepdims=True, dtype=np.float32) + np.std(x, axis=-1, keepdims=True,
                                                                           dtype=np.float32, ddof=ddof) * z
    return np.maximum(x - cutoff, np.float32(0))


class DenseFFN(Part):
    """A feed-forward: ``down(act(gate(x)) * up(x))`` (gated) or ``down(act(up(x)))`` (plain).

    Args:
        gate, up, down: projections (``make_linear``); ``gate`` None for a plain MLP.
        act_name: the activation's name (``ACT_FNS``; ``"xielu"`` with ``act`` given).
        act: the activation callable (default ``ACT_FNS[act_name]``).
        glu: ``"standard"``, or ``"oai"`` for gpt-oss's clamped unit (``swiglu_oai``).
        limit: the SwiGLU clamp: under ``"standard"``, gate clamped above and up on both
            sides to +-limit before ``act(gate) * up`` (``swiglu_limit``); under ``"oai"``, its limit.
        clamp_act: under ``"standard"``, the limit bounds act(gate) from above instead of gate
            (Step 3.5's ``min(act(gate), limit) * clamp(up, -limit, limit)``).
        alpha: the ``"oai"`` unit's sigmoid sharpness.
        gate_scale, out_scale: the gate's pre-activation and the output are multiplied by them
            (Falcon-H1's ``mlp_multipliers``).
        sparsity: above 0, the gate's pre-activation keeps only what ``gaussian_top`` keeps
            (Gemma 3n's activation_sparsity_pattern entry of the layer), its std taken with ``sparsity_ddof``.

    Calling it maps float32 [T, hidden_size] to float32 [T, hidden_size].
    """

    ROLES = ("gate", "up", "down")

    def __init__(self, gate, up, down, act_name: str, act=None, *, glu: str = "standard",
                 limit: float | None = None, alpha: float = 1.702, clamp_act: bool = False,
                 gate_scale: float = 1.0, out_scale: float = 1.0, sparsity: float = 0.0,
                 sparsity_ddof: int = 0):
        self.gate, self.up, self.down = gate, up, down
        self.sparsity, self.sparsity_ddof = sparsity, sparsity_ddof
        self.act_name, self.act = act_name, act if act is not None else ACT_FNS.get(act_name)
        self.glu, self.limit, self.alpha, self.clamp_act = glu, limit, alpha, clamp_act
        self.gate_scale, self.out_scale = np.float32(gate_scale), np.float32(out_scale)

    def read_order(self) -> list[tuple]:
        return [(self.gate, self.up) if self.gate is not None else (self.up,), (self.down,)]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.gate_scale != 1 or self.out_scale != 1:  # Falcon-H1: act(gate * m0) * up, then * m1
            g, u = self.project(("gate", "up"), x)
            return self.down(gated(self.act_name, g * self.gate_scale, u)) * self.out_scale
        if self.gate is None:
            return self.down(self.act(self.up(x)))
        if self.glu == "oai":
            return self.down(swiglu_oai(*self.project(("gate", "up"), x), self.alpha, self.limit))
        if self.act_name not in ACT_FNS:  # an activation with parameters of its own (xIELU)
            return self.down(self.act(self.gate(x)) * self.up(x))
        g, u = self.project(("gate", "up"), x)
        if self.sparsity > 0:
            g = gaussian_top(g, self.sparsity, self.sparsity_ddof)
        if self.limit is not None and self.clamp_act:
            lim = np.float32(self.limit)
            return self.down(np.minimum(self.act(g), lim) * np.clip(u, -lim, lim))
        if self.limit is not None:
            g, u = np.minimum(g, np.float32(self.limit)), np.clip(u, -np.float32(self.limit), np.float32(self.limit))
        return self.down(gated(self.act_name, g, u))
