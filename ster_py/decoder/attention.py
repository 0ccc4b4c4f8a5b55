"""Scaled dot-product attention with grouped key/value heads (GQA).

Vaswani et al. 2017; grouped-query attention: Ainslie et al. 2023 (arXiv:2305.13245).
Causal, sliding-window and chunked masks are exact: query at absolute position p sees
keys at positions j with j <= p and, under a window w, j > p - w (w positions, itself
included), as Transformers' masking_utils defines the sliding window; under chunks of c
positions (Llama 4's attention_chunk_size), only j >= p - p mod c (its own chunk, as
masking_utils' chunked_overlay). Gemma 2's logit soft-capping applies
cap * tanh(scores / cap) before the mask.

Float32 queries over float32 or float16 keys/values run the fused Cython kernel
(``ster_py._kernels.ops.attention``: one pass per query row over only the keys
it may see, with an online softmax, threaded over heads and rows and, when
decoding with few key/value heads, over parts of the keys merged afterwards;
float16 rows are widened to float32 as they are read, never the whole cache). From 2
query rows (a prompt, or a part of one: a row's result must not depend on how its prompt
was cut into calls, see ster_py/prefix.py) on an AVX2 or AVX-512 CPU it runs in tiles instead: up to 12
query rows of one key/value group per item against blocks of a transposed float32
copy of the keys they see (``cython/ster_attn_tile.h``), every key and value loaded
serving all of them;
``attention_reference`` is the numpy definition it is tested against and the
fallback for anything the kernel does not take. Chunked attention runs the kernel once
per chunk the queries fall in, over that chunk's keys only (plain causal attention from the
chunk's start), so no mask the kernel lacks is needed. Float16 keys/values mean their
exact float32 values: all arithmetic is float32 either way.
"""
from __future__ import annotations

import numpy as np

from ._fast import ops as _ops
from .activations import GATES, sigmoid
from .linear import make_linear
from .norms import Norm
from .parts import Part
from .positions import query_temperature


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
              sinks: np.ndarray | None = None, chunk: int | None = None) -> np.ndarray:
    """Attend new queries to all cached keys.

    Args:
        q: float32 [num_heads, T, head_dim], queries at absolute ``positions`` (int [T]).
        k, v: float32 or float16 (both the same) [num_kv_heads, S, head_dim], keys/values at
            positions 0..S-1 (a float16 cache: ``KVCache(dtype=np.float16)``); values may be
            narrower or wider than keys ([num_kv_heads, S, v_head_dim], MiMo-V2-Flash).
        scale: multiplies q.k (usually head_dim ** -0.5).
        window: sliding window length in positions, or None.
        softcap: attention logit soft-cap, or None.
        bias: optional additive score bias broadcastable to float32 [num_heads, T, S]
            (ALiBi and other position biases), added after scaling and soft-capping.
        sinks: optional float32 [num_heads] learned logit per head that joins the softmax
            denominator without a value (attention sinks, gpt-oss / Granite SWA).
        chunk: chunked attention's chunk length in positions (Llama 4), or None: a query at
            position p sees only keys from p - p mod chunk on.

    Returns:
        float32 [num_heads, T, v_head_dim].
    """
    if chunk:
        return _by_chunk(q, k, v, positions, chunk, scale=scale, window=window, softcap=softcap, bias=bias,
                         sinks=sinks)
    if _ops is not None and v.shape[-1] == q.shape[-1]:  # the kernel takes one head width
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


def _by_chunk(q, k, v, positions, chunk: int, *, bias, **kw) -> np.ndarray:
    """Chunked ``attention``: the queries of each chunk attend causally to that chunk's keys."""
    positions = np.asarray(positions, np.int64)
    starts = positions - positions % chunk
    if starts.size == 0 or np.all(starts == starts[0]):  # one chunk (every decoded token)
        groups = [(slice(None), int(starts[0]) if starts.size else 0)]
    else:
        groups = [(starts == c, int(c)) for c in np.unique(starts)]
    out = np.empty(q.shape, np.float32)
    for rows, c in groups:
        b = None
        if bias is not None:  # broadcastable to [H, T, S]: the chunk's keys, and its rows where it has rows
            b = np.asarray(bias, np.float32)[..., c:]
            if b.ndim >= 2 and b.shape[-2] == len(positions) > 1:
                b = b[..., rows, :]
        out[:, rows] = attention(q[:, rows], k[:, c:], v[:, c:], positions[rows] - c, bias=b, **kw)
    return out


def attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray, *, scale: float,
                        window: int | None = None, softcap: float | None = None, bias: np.ndarray | None = None,
                        sinks: np.ndarray | None = None, chunk: int | None = None) -> np.ndarray:
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
        b = np.asarray(bias, np.float32)
        scores += b.reshape(KV, G, *b.shape[-2:]) if b.ndim == 3 and b.shape[0] == H else b  # [1, T, S] broadcasts
    key_pos = np.arange(S)
    visible = key_pos[None, :] <= positions[:, None]
    if window is not None:
        visible &= key_pos[None, :] > positions[:, None] - window
    if chunk:
        visible &= key_pos[None, :] >= (positions - positions % chunk)[:, None]
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
    return out.reshape(H, T, v.shape[-1])


#: The key of a forward call's ``tables`` holding the positions attention masks by, when they are not
#: the tokens' own: int [T], all the prompt's last position for a prefix-LM prompt (every query sees
#: the whole prompt). Rotations always use the tokens' own positions.
MASK_POSITIONS = "attention.mask_positions"


class Attention(Part):
    """The attention mixer of one layer: q/k/v projections, optional q/k norms and clipping,
    rotation, value scale, the cache, ``attention``, an optional output gate and the output
    projection.

    A query bottleneck (``spec.query_bottleneck``, Step3) makes each query ``q_up(q_inter_norm(q(x)))``.

    The output gate (``spec.attn_gate``: AFMoE's ``self_attn.gate_proj``, Laguna's and Step 3.5's
    ``g_proj``, or Qwen3-Next's rows of ``q`` under ``spec.attn_gate_in_q``) multiplies the heads' output, per element or per head, by ``sigmoid`` (or
    ``softplus``; K2-Horizon's ``silu`` or ``softplus2``, log2(1 + 2 ** g)) of the ``g``
    projection of the layer's normed input before ``o`` (gated
    attention: Qiu et al. 2025, arXiv:2505.06708).

    Args:
        spec: the ``ModelSpec`` (heads, head width, q/k norm kind, clip, scale, soft-cap, sinks,
            value scale, output gate, Falcon-H1's key multiplier ``mup.key``).
        i: the layer; its ``LayerSpec`` gives the rotation, the window and, where it has its
            own, its head counts and widths and whether it has sinks (``ModelSpec.attention_shape``).
        load: ``load(role, kind="weight", required=False)`` -> the layer's array (``Layout.get``).
        norm: ``norm(role)`` -> a ``Norm`` built from the role's weight and bias.
    """

    ROLES = ("q", "k", "v", "o")
    KV = True  # the layer keeps keys and values in the cache

    def __init__(self, spec, i: int, load, norm):
        self.spec, self.i, self.layer = spec, i, spec.layers[i]
        self.shape = spec.attention_shape(i)
        # a layer reading another's cache projects only its queries (LayerSpec.kv_source); one whose
        # values are its keys has no value projection (LayerSpec.v_from_k)
        self.source = self.layer.kv_source
        if self.source is not None:
            self.KV = False  # it caches nothing: the cache gives it no buffers
        own = ("q", "o") if self.source is not None else ("q", "k", "o") if (
            self.layer.v_from_k or self.layer.value_experts) else self.ROLES
        for r in self.ROLES:
            object.__setattr__(self, r, make_linear(load(r, required=True), load(r, "bias")) if r in own else None)
        self.q_norm = self._qk_norm("q_norm", load, norm)
        self.k_norm = self._qk_norm("k_norm", load, norm) if self.source is None else None
        self.v_norm = Norm("rms", spec.norm_eps, None, None) if spec.value_norm else None
        self.sinks = load("sinks", "", required=True).astype(np.float32) if spec.layer_sinks(i) else None
        # the gate is a projection of its own, or rows of q (``attn_gate_in_q``: split in ``__call__``)
        self.g = make_linear(load("g", required=True)) if spec.attn_gate and not spec.attn_gate_in_q else None
        # values from routed value experts (LayerSpec.value_experts, decoder/mova.py), not from v
        self.v_experts = None
        if self.layer.value_experts:
            from .mova import ValueExperts

            r = spec.value_router
            self.v_experts = ValueExperts(
                r, make_linear(load("v_router", required=True)),
                load("v_router_select_bias", "", required=True) if r.select_bias else None,
                [make_linear(load("v_exp", required=True, slot=e)) for e in range(r.num_experts)])
        # a later pass of a gated loop: the gate's [H, D] weight and [H] bias (LayerSpec.loop_global)
        self.loop_gate = ((load("loop_gate", required=True).astype(np.float32),
                           load("loop_gate", "bias", required=True).astype(np.float32))
                          if self.layer.loop_global is not None else None)
        # a query bottleneck (Step3): q narrows, q_inter_norm norms, q_up widens to the heads
        wide = getattr(spec, "query_bottleneck", 0) and "q" in own
        self.q_up = make_linear(load("q_up", required=True)) if wide else None
        self.q_inter_norm = norm("q_inter_norm") if wide else None

    def _qk_norm(self, role: str, load, norm):
        """The layer's q or k norm, or None (no q/k norms here, or optional ones the weights lack)."""
        s = self.spec
        if not s.qk_norm or not self.layer.qk_norm or (s.qk_norm_optional and load(role) is None):
            return None
        return norm(role) if s.qk_norm_affine else Norm("rms", s.norm_eps, None, None)

    def read_order(self) -> list[tuple]:
        qkv = tuple(p for p in (self.q, self.k, self.v) if p is not None)
        wide = [(self.q_up,)] if self.q_up is not None else []
        return [qkv] + wide + ([(self.g,)] if self.g is not None else []) + [(self.o,)]

    def rope_tables(self, positions: np.ndarray, tables: dict) -> tuple:
        """This layer's RoPE cos/sin at ``positions``, computed once per forward call (``tables``
        is keyed by the Rope object: layers with the same rotation share it)."""
        rope = self.layer.rope
        if id(rope) not in tables:
            tables[id(rope)] = rope.cos_sin(positions, int(positions[-1]) + 1)
        return tables[id(rope)]

    def __call__(self, x: np.ndarray, cache, positions: np.ndarray, bias, tables: dict) -> np.ndarray:
        """x float32 [T, hidden_size] (normed) -> float32 [T, hidden_size]; stores this layer's keys
        and values for ``positions`` in ``cache``."""
        s, T = self.spec, x.shape[0]
        if self.source is not None:
            return self._shared(x, cache, positions, tables)
        if self.v_experts is not None:  # values from the value experts
            q, k = self.project(("q", "k"), x)
            v = self.v_experts(x)
        elif self.v is None:  # values are the key projection, before the key norm
            q, k = self.project(("q", "k"), x)
            v = k.copy()  # k is normed and rotated in place below
        else:
            q, k, v = self.project(("q", "k", "v"), x)
        H, KV, D, Dv = self.shape
        gate_in = None
        if self.q_up is not None:  # the query bottleneck: [T, share_q_dim] -> normed -> [T, H * D]
            q = self.q_up(self.q_inter_norm(q))
        if s.attn_gate_in_q:  # per head: D query rows, then D gate rows (Qwen3-Next's q_proj)
            qg = q.reshape(T, H, 2, D)
            q, gate_in = np.ascontiguousarray(qg[:, :, 0]).reshape(T, H * D), qg[:, :, 1].reshape(T, H * D)
        if s.mup is not None and s.mup.key != 1.0:  # Falcon-H1's key_multiplier
            k = k * np.float32(s.mup.key)
        if s.qk_norm == "proj" and self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if s.clip_qkv is not None:  # after whole-projection norms (OLMoE clamps the normed q/k)
            q, k, v = (np.clip(t, -s.clip_qkv, s.clip_qkv) for t in (q, k, v))
        if T == 1:  # decoding: [1, heads * D] is already [heads, 1, D] in memory
            q, k, v = q.reshape(H, 1, D), k.reshape(KV, 1, D), v.reshape(KV, 1, Dv)
        else:
            q = np.ascontiguousarray(q.reshape(T, H, D).transpose(1, 0, 2))
            k = np.ascontiguousarray(k.reshape(T, KV, D).transpose(1, 0, 2))
            v = v.reshape(T, KV, Dv).transpose(1, 0, 2)
        if s.value_scale != 1.0:
            v = v * np.float32(s.value_scale)
        if self.v_norm is not None:  # a weightless RMS norm over each value head
            v = self.v_norm(np.ascontiguousarray(v))
        head_norm = s.qk_norm == "head" and self.q_norm is not None
        if head_norm and not s.qk_norm_after_rope:
            q, k = self.q_norm(q), self.k_norm(k)
        rope = self.layer.rope
        if rope is not None:
            rope.apply_pair(q, k, *self.rope_tables(positions, tables))
        if head_norm and s.qk_norm_after_rope:
            q, k = self.q_norm(q), self.k_norm(k)
        if s.query_temperature is not None and self.layer.query_temperature:
            q = q * query_temperature(positions, *s.query_temperature)
        keys, values = cache.append(self.i, k, v)
        return self._attend(x, q, keys, values, tables.get(MASK_POSITIONS, positions), bias, gate_in, cache)

    def _attend(self, x, q, keys, values, positions, bias=None, gate_in=None, cache=None) -> np.ndarray:
        """Queries float32 [H, T, D] over the visible keys/values (on a later pass of a gated loop, mixed
        with the first pass's: ``_loop_mix``, which reads ``cache``), through the output gate (``g(x)``,
        or ``gate_in`` [T, H * D], the gate rows split from ``q``) and ``o``."""
        s, T = self.spec, x.shape[0]
        H, _, _, Dv = self.shape
        out = attention(q, keys, values, positions, scale=s.attn_scale, window=self.layer.sliding_window,
                        softcap=s.attn_softcap, bias=bias, sinks=self.sinks, chunk=self.layer.attention_chunk)
        if self.loop_gate is not None:
            out = self._loop_mix(q, out, cache, positions, bias)
        out = out.reshape(1, H * Dv) if T == 1 else out.transpose(1, 0, 2).reshape(T, H * Dv)
        if self.g is not None or gate_in is not None:  # act(g(x)) scales each head's (or element's) output
            gate = GATES[s.attn_gate](self.g(x) if gate_in is None else gate_in)
            out = (out.reshape(T, H, Dv) * gate[:, :, None]).reshape(T, H * Dv) if s.attn_gate_per_head else out * gate
        return self.o(out)

    def _loop_mix(self, q: np.ndarray, local: np.ndarray, cache, positions: np.ndarray, bias) -> np.ndarray:
        """A later pass's attention in a gated loop (``LayerSpec.loop_global``): g * global + (1 - g) * local
        per head, where ``local`` float32 [H, T, Dv] is this pass's attention over its own keys (within
        its window), global the same queries over the first pass's keys and values of this stored layer
        (causal, every earlier position), and g = sigmoid(W_h . q_h + b_h) of each rotated query head
        (seed 002's IQuest-LoopCoder; W [H, D] and b [H] are the layer's ``loop_gate``)."""
        s = self.spec
        end = int(positions[-1]) + 1
        gk, gv = cache.buffers(self.layer.loop_global, end)
        glob = attention(q, gk[:, :end], gv[:, :end], positions, scale=s.attn_scale, softcap=s.attn_softcap,
                         bias=bias, sinks=self.sinks)
        w, b = self.loop_gate
        g = sigmoid(np.einsum("htd,hd->ht", q, w) + b[:, None]).astype(np.float32)[:, :, None]
        return g * glob + (np.float32(1) - g) * local

    def _shared(self, x: np.ndarray, cache, positions: np.ndarray, tables: dict) -> np.ndarray:
        """A layer without keys and values of its own (``LayerSpec.kv_source``): its normed, rotated
        queries attend over what the source layer, run earlier in this call, cached up to now."""
        T = x.shape[0]
        H, _, D, _ = self.shape
        q = self.q(x)
        if self.q_up is not None:
            q = self.q_up(self.q_inter_norm(q))
        q = q.reshape(H, 1, D) if T == 1 else np.ascontiguousarray(q.reshape(T, H, D).transpose(1, 0, 2))
        if self.q_norm is not None:
            q = self.q_norm(q)
        if self.layer.rope is not None:
            cos, sin = self.rope_tables(positions, tables)
            q = self.layer.rope.apply(np.ascontiguousarray(q), cos, sin)
        end = int(positions[-1]) + 1
        keys, values = cache.buffers(self.source, end)
        return self._attend(x, q, keys[:, :end], values[:, :end], positions)
