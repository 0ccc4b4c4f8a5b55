"""The fused decode step: one decoded token through one block in one kernel call.

Decoding runs a block's dozen small kernels (norm, q/k/v, RoPE, cache store,
attention, o, norm, gate/up, activation, down, residual adds) once per token. From
Python, each costs a call and an allocation, about 50 us per block on a 2-core
machine, as much as the products of a small model's block. ``layer_step`` hands
qualifying blocks to ``ster_py._kernels.ops.LayerStep``, which runs the same kernels
in the same order with the same float32 arithmetic, so its output equals
``_Layer.__call__``'s (tests/test_step.py compares them on tiny models of several
families, and the real-model tests run through it).

A block qualifies when its mixer is attention, its feed-forward dense or routed, all of its
projections quantized (``QuantLinear``; a routed feed-forward's are its own affair: the step
calls the ``MoE`` part itself between the attention half and the residual add, and that part
runs its chosen experts in one kernel call, ``ops.moe_experts``, when they qualify), its norms are RMSNorm with a [d] weight (or none), its feed-forward is gated with SiLU or
the tanh GELU, and the family needs nothing the step does not do: no parallel block,
ALiBi, q/k/v clipping, query temperature, chunked attention, per-head norm weights, a value
scale, an output gate, Falcon-H1's multipliers, value norms, layer scalars, per-layer inputs, AltUp, Laurel or activation sparsity, and the layer has the model's own attention shape (no per-layer head
counts or widths, values as wide as keys). Anything else, and prompts (more than one token),
keep the Python block.
"""
from __future__ import annotations

import numpy as np

from ..config import ModelSpec
from ._fast import ops as _ops
from .attention import Attention
from .ffn import _GLU_KINDS, DenseFFN
from .qlinear import QuantLinear

_NORMS = ("attn_norm", "attn_post_norm", "ffn_norm", "ffn_post_norm")
#: A block's projections, in the order LayerStep takes them.
PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")


def spec_allows_step(spec: ModelSpec) -> bool:
    """Whether blocks of this family can take the fused step (the per-layer part is in ``layer_step``)."""
    return (_ops is not None and spec.norm == "rms" and not spec.parallel and spec.clip_qkv is None
            and spec.query_temperature is None and spec.alibi_slopes is None and spec.hidden_act in _GLU_KINDS
            and spec.qk_norm in (None, "head", "proj") and spec.value_scale == 1.0 and spec.attn_gate is None
            and spec.mup is None and spec.norm_groups == 1 and spec.value_router is None
            and not spec.value_norm and not spec.layer_scalar and not spec.per_layer_input
            and spec.streams is None
            and spec.post_norm_eps is None
            and not getattr(spec, "query_bottleneck", 0)
            and spec.altup is None and not spec.laurel and not any(layer.ffn_sparsity for layer in spec.layers))


def _norm_weight(norm, size: int):
    """The norm's weight for the kernel: (True, float32 [size] or None), or (False, None) when it
    is not an RMSNorm the kernel takes (a 2-D per-head weight, another size)."""
    if norm is None or not norm._kernel:
        return False, None
    w = norm.weight
    if w is None:
        return True, None
    return (w.ndim == 1 and w.shape[0] == size and w.dtype == np.float32), w


def layer_step(layer):
    """A ``LayerStep`` for ``layer`` (a decoder ``_Layer``), or None when it does not qualify.

    Built from the layer's current projections: rebuild after replacing one (``_Layer``
    drops its step when a projection is set).
    """
    s, attn, ffn = layer.spec, layer.mixer, layer.ffn
    routed = False
    if ffn is not None and type(ffn) is not DenseFFN:
        from .moe import MoE  # (imported only by a model that routes)

        routed = type(ffn) is MoE
    if (not spec_allows_step(s) or type(attn) is not Attention or layer.layer.attention_chunk
            or layer.layer.residual is not None or layer.layer.loop_global is not None
            or not (routed or (type(ffn) is DenseFFN and ffn.gate is not None and ffn.glu == "standard"
                               and ffn.limit is None))):
        return None
    parts = [getattr(layer, r) for r in (PROJECTIONS[:4] if routed else PROJECTIONS)]
    if any(type(p) is not QuantLinear for p in parts):
        return None
    H, KV, D = s.num_attention_heads, s.num_key_value_heads, s.head_dim
    if s.attention_shape(layer.i) != (H, KV, D, D):
        return None
    E = s.hidden_size
    norms = {}
    for role in _NORMS:
        if role in layer.norms:
            ok, w = _norm_weight(layer.norms[role], E)
            if not ok:
                return None
            norms[role] = w
    qk_norm = 0
    if s.qk_norm is not None and attn.q_norm is not None:
        qk_norm = 1 if s.qk_norm == "head" else 2
        for role, norm, heads in (("q_norm", attn.q_norm, H), ("k_norm", attn.k_norm, KV)):
            ok, w = _norm_weight(norm, D if qk_norm == 1 else heads * D)
            if not ok:
                return None
            norms[role] = w
    rope = layer.layer.rope
    return _ops.LayerStep(
        tuple(p._m for p in parts), tuple(p.bias for p in parts), norms,
        num_heads=H, num_kv_heads=KV, head_dim=D, eps=float(s.norm_eps), qk_norm=qk_norm,
        qk_norm_after_rope=bool(s.qk_norm_after_rope),
        rotary_dim=0 if rope is None else rope.rotary_dim, interleaved=bool(rope is not None and rope.interleaved),
        scale=float(s.attn_scale), window=int(layer.layer.sliding_window or 0), softcap=float(s.attn_softcap or 0.0),
        sinks=attn.sinks, act=_GLU_KINDS[s.hidden_act], residual_scale=float(layer._residual_scale),
        ffn=ffn if routed else None)
