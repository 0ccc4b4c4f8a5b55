"""Lightning attention, MiniMax-01's linear attention (``LayerSpec.mixer`` ``"lightning"``).

MiniMax-01 (arXiv:2501.08313), as Transformers' ``MiniMaxLightningAttention`` and llama.cpp's
src/models/minimax-01.cpp compute it. For x float32 [T, hidden], with H heads of D channels:

1. ``qkv_proj`` (``ssm_in``) through SiLU -> per head its query, key and value (D each, stored
   head by head: [q_h | k_h | v_h]);
2. per head, a [D, D] state that decays by exp(-slope_h) per token and gains k^T v; the token's
   query reads it: ``S = decay * S + k^T v``, ``o = q S`` (no softmax, no scale);
3. the heads' outputs RMS-normed together (``norm``, ``ssm_norm``), times the sigmoid of
   ``output_gate(x)`` (``ssm_gate``), through ``out_proj`` (``ssm_out``).

The slopes are MiniMax's (ALiBi's geometric series): slope_h = 2 ** (-8 / H) raised to h + 1,
scaled per layer by 1 - i / (layers - 1 + slope_eps) + 1e-5 (``SSMSpec.slope_eps``). The
[H, D, D] states are the layer's ``RecurrentState`` slot (``"kv"``), so a prompt read whole, in
pieces or token by token leaves the same state. Transformers' prefill computes the same
recurrence block by block (an intra-block decayed product plus the inter-block state); the
recurrent form here is the one its decode step and llama.cpp's state use.

Ling 2.5's lightning attention (seed 002, ``bailing_hybrid`` without Kimi Delta Attention) is the
same recurrence with its extras as ``SSMSpec`` data: ``query_key_value`` holds every query head, then
every key head, then every value head (``qkv_layout`` "concat"), SiLU only under linear_silu
(``qkv_silu``), per-head query and key RMS norms (``qk_norm``: ``ssm_q_norm`` / ``ssm_k_norm``, the
model's epsilon), the leading partial_rotary_factor share of each head rotated by halves at
rope_theta (``rope``), the query scaled by head_dim ** -0.5 (``q_scaled``), ALiBi's slopes (``slopes``
"alibi": MiniMax's for a power-of-two head count) with the per-layer factor 1 - (i - 1) / (layers - 1) + 1e-5
(``slope_eps`` 0, ``slope_layer_offset`` -1: the release's code and every port of it; seed 002 words it
1 - i / (layers - 1) + 1e-5), and the read-out RMS-normed over
group_norm_size equal groups (``norm_groups``) by ``g_norm``, times sigmoid(g_proj(x)), through dense.

Step 2 runs the Cython kernel ``ster_py._kernels.lightning.lightning_scan``;
``lightning_scan_reference`` is its numpy definition.
"""
from __future__ import annotations

import numpy as np

from ._fast import lightning as _kernel
from .activations import sigmoid, silu
from .cache import RecurrentState
from .linear import make_linear
from .norms import rms_norm
from .parts import Part
from .positions import alibi_slopes
from .ssm import vector


def lightning_decay(heads: int, layer: int, layers: int, slope_eps: float = 1e-5, slopes: str = "minimax",
                    layer_offset: int = 0) -> np.ndarray:
    """Each head's decay per token, float32 [heads]: exp(-slope_h * factor) with
    factor = 1 - (layer + layer_offset) / (layers - 1 + slope_eps) + 1e-5.

    ``slopes`` "minimax": slope_h = 2 ** (-8 / heads * (h + 1)) (Transformers' ``get_slope_rate``;
    llama.cpp's with slope_eps 0). "alibi": ALiBi's series (``positions.alibi_slopes``), the same for a
    power-of-two head count, else the nearest power's followed by every other one of its double's
    (Lightning Attention-2's ``build_slope_tensor``, which Ling 2.5's release computes, with layer_offset
    -1). A one-layer model's factor is 1 + 1e-5."""
    if slopes == "alibi":
        base = np.asarray(alibi_slopes(heads), np.float64)
    else:
        base = 2.0 ** (-8.0 / heads * np.arange(1, heads + 1, dtype=np.float64))
    span = layers - 1 + slope_eps
    factor = (1.0 - (layer + layer_offset) / span if span else 1.0) + 1e-5
    return np.exp(-(base * factor)).astype(np.float32)


def lightning_scan(q: np.ndarray, k: np.ndarray, v: np.ndarray, decay: np.ndarray, state: np.ndarray) -> np.ndarray:
    """Step 2 over T tokens from ``state``, updating it in place.

    Args:
        q, k, v: float32 [T, H * D] (rows contiguous).
        decay: float32 [H], each head's factor per token.
        state: float32 [H, D, D] C-contiguous (key channel, value channel).

    Returns:
        float32 [T, H * D]: each token's query read through its head's state after that token.
    """
    if _kernel is not None and all(a.dtype == np.float32 and a.ndim == 2 and (a.shape[1] <= 1 or a.strides[1] == 4)
                                   for a in (q, k, v)):
        out = np.empty(q.shape, np.float32)
        _kernel.lightning_scan(q, k, v, decay, state, out)
        return out
    out, new = lightning_scan_reference(q, k, v, decay, state)
    state[...] = new
    return out


def lightning_scan_reference(q, k, v, decay, state) -> tuple[np.ndarray, np.ndarray]:
    """The numpy definition of ``lightning_scan``: (float32 [T, H * D], the new state [H, D, D]);
    ``state`` is left as it was."""
    H, D, _ = state.shape
    T = q.shape[0]
    s = state.astype(np.float32).copy()
    dec = np.asarray(decay, np.float32)[:, None, None]
    out = np.empty((T, H, D), np.float32)
    for t in range(T):
        qt, kt, vt = (a[t].reshape(H, D) for a in (q, k, v))
        s = dec * s + kt[:, :, None] * vt[:, None, :]
        out[t] = np.einsum("hd,hde->he", qt, s)
    return out.reshape(T, H * D), s


class Lightning(Part):
    """The lightning attention of one layer (module docstring).

    Args:
        spec: the ``ModelSpec`` (its ``ssm``: ``SSMSpec`` of kind ``"lightning"``: num_heads heads
            of d_state channels, the read-out norm's ``norm_eps`` and ``norm_groups``, ``slope_eps``,
            and Ling 2.5's ``qkv_layout``, ``qkv_silu``, ``qk_norm``, ``rope``, ``q_scaled``).
        i: the layer (its place in the stack scales the heads' decay rates).
        load: ``load(role, kind="weight", required=False)`` -> the layer's array: ``ssm_in``
            ([3 * H * D, hidden]), ``ssm_gate`` ([H * D, hidden]), ``ssm_norm`` ([H * D]),
            ``ssm_out`` ([hidden, H * D]) and, under ``qk_norm``, ``ssm_q_norm`` / ``ssm_k_norm`` ([D]).
        norm: unused.

    Calling it maps float32 [T, hidden] to float32 [T, hidden] and advances the layer's
    ``RecurrentState``. It has no projection adapters take (``ROLES``: seed 002 refuses adapters
    on MiniMax-Text-01).
    """

    KV = False

    def __init__(self, spec, i: int, load, norm):
        s = self.ssm = spec.ssm
        self.i = i
        self.qkv = make_linear(load("ssm_in", required=True), load("ssm_in", "bias"))
        self.gate = make_linear(load("ssm_gate", required=True))
        self.norm_w = vector(load("ssm_norm", required=True), (s.d_inner,))
        self.out_proj = make_linear(load("ssm_out", required=True), load("ssm_out", "bias"))
        self.decay = lightning_decay(s.num_heads, i, spec.num_hidden_layers, s.slope_eps, s.slopes,
                                     s.slope_layer_offset)
        self.q_norm = vector(load("ssm_q_norm", required=True), (s.d_state,)) if s.qk_norm else None
        self.k_norm = vector(load("ssm_k_norm", required=True), (s.d_state,)) if s.qk_norm else None

    def new_slot(self, dtype=None) -> RecurrentState:
        """The layer's recurrent state: [heads, D, D] (float32 whatever ``dtype``)."""
        return RecurrentState(self.ssm.state_shapes())

    def read_order(self) -> list[tuple]:
        return [(self.qkv,), (self.gate,), (self.out_proj,)]

    def __call__(self, x: np.ndarray, cache, positions, bias=None, tables=None) -> np.ndarray:
        s = self.ssm
        T, H, D = x.shape[0], s.num_heads, s.d_state
        qkv = self.qkv(x)
        if s.qkv_silu:
            qkv = silu(qkv)
        if s.qkv_layout == "concat":  # [q heads | k heads | v heads]
            qkv = qkv.reshape(T, 3, H, D)
            q, k, v = (np.array(qkv[:, j], np.float32) for j in range(3))
        else:  # [q_h | k_h | v_h] head after head
            qkv = qkv.reshape(T, H, 3, D)
            q, k, v = (np.array(qkv[:, :, j], np.float32) for j in range(3))
        if self.q_norm is not None:
            q, k = rms_norm(q, self.q_norm, s.norm_eps), rms_norm(k, self.k_norm, s.norm_eps)
        if s.rope is not None:  # [T, H, D] -> [H, T, D] for the rotation
            key = ("lightning", id(s.rope))
            tables = {} if tables is None else tables
            if key not in tables:
                tables[key] = s.rope.cos_sin(np.asarray(positions), int(positions[-1]) + 1)
            cos, sin = tables[key]
            qh, kh = (np.ascontiguousarray(a.transpose(1, 0, 2), np.float32) for a in (q, k))
            s.rope.apply_pair(qh, kh, cos, sin)
            q, k = qh.transpose(1, 0, 2), kh.transpose(1, 0, 2)
        if s.q_scaled:
            q = q * np.float32(D ** -0.5)
        q, k, v = (np.ascontiguousarray(a, np.float32).reshape(T, H * D) for a in (q, k, v))
        o = lightning_scan(q, k, v, self.decay, cache.slot(self.i)["kv"])
        g = s.norm_groups
        o = rms_norm(o.reshape(T, g, H * D // g), None, s.norm_eps).reshape(T, H * D) * self.norm_w
        gate = self.gate(x)
        o = o * sigmoid(gate)
        return self.out_proj(o.astype(np.float32, copy=False))
