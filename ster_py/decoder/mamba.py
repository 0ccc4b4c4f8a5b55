"""Mamba's selective scan mixer (``LayerSpec.mixer`` ``"mamba"``).

Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces"
(arXiv:2312.00752), as Transformers' ``MambaMixer`` / ``FalconMambaMixer`` / ``JambaMambaMixer``
and llama.cpp's ``build_mamba_layer`` compute it. For x float32 [T, hidden]:

1. ``in_proj`` -> the stream s and the gate z (d_inner each);
2. s through the causal depthwise convolution and SiLU (``conv.causal_conv1d``);
3. ``x_proj`` -> the step (dt_rank wide), B and C (d_state each), which Falcon-Mamba and Jamba
   RMS-normalise (without / with a scale, ``SSMSpec.bcdt_norm``);
4. ``dt_proj`` (without its bias) lifts the step to d_inner; ``dt = softplus(step + dt_bias)``;
5. per channel d and state entry n: ``h = exp(dt * A[d, n]) * h + dt * B[n] * s[d]`` with
   A = -exp(A_log); the output is ``(C . h[d] + D[d] * s[d]) * silu(z[d])`` (``selective_scan``);
6. ``out_proj`` back to the model width.

The convolution's last d_conv - 1 inputs and the [d_inner, d_state] state are the layer's
``RecurrentState`` slot; positions enter only through the recurrence.
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


def selective_scan(x, dt, dt_bias, A, B, C, D, z, state: np.ndarray) -> np.ndarray:
    """Mamba's scan from ``state`` over T tokens (step 5 above), updating ``state`` in place.

    Args:
        x: float32 [T, Dn], the convolved stream. dt: float32 [T, Dn], the step before its bias
            and softplus; dt_bias: float32 [Dn] or None. A: float32 [Dn, N] (negative).
        B, C: float32 [T, N]. D: float32 [Dn]. z: float32 [T, Dn] gate or None (no gate).
        state: float32 [Dn, N].

    Returns:
        float32 [T, Dn]. The kernel is ``ster_py._kernels.scan.selective_scan``;
        ``selective_scan_reference`` is its numpy definition.
    """
    if _scan is not None and all(a is None or (a.dtype == np.float32 and (a.shape[-1] <= 1 or a.strides[-1] == 4))
                                 for a in (x, dt, B, C, z)):
        out = np.empty(x.shape, np.float32)
        _scan.selective_scan(x, dt, dt_bias, A, B, C, D, z, state, out)
        return out
    y, new = selective_scan_reference(x, dt, dt_bias, A, B, C, D, z, state)
    state[...] = new
    return y


def selective_scan_reference(x, dt, dt_bias, A, B, C, D, z, state) -> tuple[np.ndarray, np.ndarray]:
    """The numpy definition of ``selective_scan``: (float32 [T, Dn], the new state [Dn, N]);
    ``state`` is left as it was."""
    h = state.astype(np.float32).copy()
    delta = softplus(dt + (dt_bias if dt_bias is not None else np.float32(0.0)))
    out = np.empty(x.shape, np.float32)
    for t in range(x.shape[0]):
        d = delta[t][:, None]
        h = np.exp(d * A) * h + B[t][None, :] * (d * x[t][:, None])
        out[t] = h @ C[t] + D * x[t]
    if z is not None:
        out = out * silu(z)
    return out, h


class Mamba(Part):
    """The selective-scan mixer of one layer (module docstring).

    Args:
        spec: the ``ModelSpec`` (its ``ssm``: ``SSMSpec`` of kind ``"mamba"``).
        i: the layer.
        load: ``load(role, kind="weight", required=False)`` -> the layer's array (``Layout.get``):
            ``ssm_in``, ``ssm_conv``, ``ssm_x``, ``ssm_dt``, ``ssm_a_log`` (or llama.cpp's
            ``ssm_a`` = -exp(A_log)), ``ssm_d``, ``ssm_out`` and Jamba's ``ssm_*_norm``.
        norm: unused (the block's norms are the layer's).

    Calling it maps float32 [T, hidden] to float32 [T, hidden] and advances the layer's
    ``RecurrentState`` (``cache.slot(i)``). It has no projection adapters take (``ROLES``).
    """

    KV = False

    def __init__(self, spec, i: int, load, norm):
        s = self.ssm = spec.ssm
        self.i = i
        di, n, k, r = s.d_inner, s.d_state, s.d_conv, s.dt_rank
        self.in_proj = make_linear(load("ssm_in", required=True), load("ssm_in", "bias"))
        self.x_proj = make_linear(load("ssm_x", required=True), load("ssm_x", "bias"))
        self.dt_proj = make_linear(load("ssm_dt", required=True))
        self.dt_bias = vector(load("ssm_dt", "bias"), (di,))
        self.conv_w = vector(load("ssm_conv", required=True), (di, k))
        self.conv_b = vector(load("ssm_conv", "bias"), (di,))
        a_log = load("ssm_a_log", "")
        self.A = (-np.exp(vector(a_log, (di, n))) if a_log is not None
                  else vector(load("ssm_a", "", required=True), (di, n)))
        self.D = vector(load("ssm_d", "", required=True), (di,))
        self.out_proj = make_linear(load("ssm_out", required=True), load("ssm_out", "bias"))
        self.norms = None
        if s.bcdt_norm == "weighted":
            self.norms = tuple(vector(load(role, required=True), (w,))
                               for role, w in (("ssm_dt_norm", r), ("ssm_b_norm", n), ("ssm_c_norm", n)))

    def new_slot(self, dtype=None) -> RecurrentState:
        """The layer's recurrent state (float32 whatever ``dtype``, the key/value cache's)."""
        return RecurrentState(self.ssm.state_shapes())

    def read_order(self) -> list[tuple]:
        return [(self.in_proj,), (self.x_proj,), (self.dt_proj,), (self.out_proj,)]

    def __call__(self, x: np.ndarray, cache, positions, bias=None, tables=None) -> np.ndarray:
        s, state = self.ssm, cache.slot(self.i)
        di, n, r = s.d_inner, s.d_state, s.dt_rank
        xz = self.in_proj(x)
        stream = causal_conv1d(xz[:, :di], self.conv_w, self.conv_b, state["conv"])
        x_db = self.x_proj(stream)
        step, B, C = x_db[:, :r], x_db[:, r:r + n], x_db[:, r + n:r + 2 * n]
        if s.bcdt_norm is not None:
            step, B, C = (rms_norm(v, None, s.bcdt_eps) for v in (step, B, C))
            if self.norms is not None:
                step, B, C = (v * w for v, w in zip((step, B, C), self.norms))
        dt = self.dt_proj(np.ascontiguousarray(step))
        y = selective_scan(stream, dt, self.dt_bias, self.A, B, C, self.D, xz[:, di:], state["ssm"])
        return self.out_proj(y)
