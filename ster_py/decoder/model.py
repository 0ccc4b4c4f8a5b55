"""The generic decoder: embeddings -> blocks -> final norm -> head.

One class runs every family. What differs between families arrives as data in
the ``ModelSpec`` (which norms wrap a sublayer, how heads are normed, rotation
and window per layer, position biases, soft-caps, scales); how a family stores
its tensors (fused, transposed, per head) is undone at load by ``layout.Layout``.
This file never names a family.

A block computes (each norm only where ``spec.norms`` lists it, r = residual_scale)::

    h = h + r * attn_post_norm(attention(attn_norm(h)))
    h = h + r * ffn_post_norm(ffn(ffn_norm(h)))

which is Llama's pre-norm block, Gemma 2/3's sandwich, or OLMo 2's post-norm block; a
parallel block (GPT-J, GPT-NeoX, Phi-2, Cohere, Falcon) adds both sublayers to the same
residual, the feed-forward reading ``ffn_norm(h)``, or attention's normed input without one.
Compute is float32; weights keep their stored dtype (f32, f16 or bf16) until used.
"""
from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from ..config import ModelSpec
from ..errors import SterError
from .attention import attention
from .cache import KVCache
from .ffn import ACT_FNS, gated
from .layout import Layout
from .linear import Projections, make_linear
from .qlinear import QuantLinear
from .norms import layer_norm, rms_norm
from ._fast import ops as _ops
from .positions import alibi_bias, query_temperature
from .step import PROJECTIONS, layer_step
from .xielu import XIELU


class WeightSource(Protocol):
    """Named tensors of a checkpoint: ``get(name)`` returns an array, or None when absent."""

    def get(self, name: str) -> np.ndarray | None: ...


LayerHook = Callable[[int, np.ndarray], np.ndarray]


class _Norm:
    """RMS or Layer norm over the last axis; a 2-D weight [heads, d] norms each head with its own row."""

    def __init__(self, spec: ModelSpec, weight, bias):
        self.spec = spec
        self.weight = None if weight is None else weight.astype(np.float32) + (1.0 if spec.norm_unit_offset else 0.0)
        self.bias = None if bias is None else bias.astype(np.float32)
        if self.weight is not None and self.weight.ndim == 2:  # [heads, d] against x [heads, T, d]
            self.weight = self.weight[:, None, :]
            self.bias = None if self.bias is None else self.bias.reshape(self.weight.shape)
        # RMS over a [d] float32 weight: straight to the kernel (norms.rms_norm's checks, done once)
        self._kernel = (_ops is not None and spec.norm == "rms" and
                        (self.weight is None or (self.weight.ndim == 1 and self.weight.flags.c_contiguous)))
        self._eps = float(spec.norm_eps)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if (self._kernel and x.__class__ is np.ndarray and x.dtype == np.float32 and x.flags.c_contiguous
                and x.ndim >= 2 and x.shape[-1] > 0 and (self.weight is None or self.weight.shape[0] == x.shape[-1])):
            out = np.empty_like(x)
            _ops.rms_norm(x.reshape(-1, x.shape[-1]), self.weight, self._eps, out.reshape(-1, x.shape[-1]))
            return out
        if self.spec.norm == "layer":
            return layer_norm(x, self.weight, self.bias, self.spec.norm_eps)
        return rms_norm(x, self.weight, self.spec.norm_eps)


_PROJECTION_ROLES = frozenset(PROJECTIONS)
_UNBUILT = object()


class _Layer:
    def __init__(self, spec: ModelSpec, i: int, layout: Layout):
        self.i, self.spec, self.layer = i, spec, spec.layers[i]

        def load(role, kind="weight", required=False):
            return layout.get(role, i, kind, required)

        def norm(role):
            return _Norm(spec, load(role, required=spec.norm_affine), load(role, "bias"))

        self.norms = {role: norm(role) for role in spec.norms}
        self.q, self.k, self.v, self.o = (make_linear(load(r, required=True), load(r, "bias"))
                                          for r in ("q", "k", "v", "o"))
        self.q_norm, self.k_norm = (norm(r) if spec.qk_norm and (not spec.qk_norm_optional or load(r) is not None)
                                    else None for r in ("q_norm", "k_norm"))
        self.sinks = load("sinks", "sinks", required=True).astype(np.float32) if spec.sinks else None
        gate = load("gate")
        self.gate = make_linear(gate, load("gate", "bias")) if gate is not None else None
        self.up = make_linear(load("up", required=True), load("up", "bias"))
        self.down = make_linear(load("down", required=True), load("down", "bias"))
        if spec.hidden_act == "xielu":
            self.act = XIELU(*(load("act", p, required=True) for p in ("alpha_p", "alpha_n", "beta", "eps")))
        else:
            self.act = ACT_FNS[spec.hidden_act]
        self._grouped: dict[tuple, Projections] = {}
        self._step = _UNBUILT
        self._residual_scale = np.float32(spec.residual_scale)

    def __setattr__(self, name, value):
        # Adapters replace projections after load: the groups built from them go stale, and
        # the fused step (which points into the projections, norm weights, biases and sinks)
        # on any attribute set here. Values changed inside those arrays reach both paths;
        # replacing an object held inside another (an entry of ``norms``, a ``_Norm.weight``,
        # a ``QuantLinear.bias``) is not seen: set the block's attribute again.
        object.__setattr__(self, name, value)
        if name in _PROJECTION_ROLES and "_grouped" in self.__dict__:
            self._grouped.clear()
        if name not in ("_step", "_grouped"):
            object.__setattr__(self, "_step", _UNBUILT)

    def decode_step(self):
        """This block's fused one-token step (``step.layer_step``; built on first use, again
        after a projection is replaced), or None when the block does not qualify."""
        if self._step is _UNBUILT:
            self._step = layer_step(self)
        return self._step

    def step_one(self, fused, h: np.ndarray, cache: KVCache, positions: np.ndarray, tables: dict) -> np.ndarray:
        """``__call__`` for one token through ``fused`` (this block's ``decode_step()``)."""
        p = int(positions[0])
        keys, values = cache.buffers(self.i, p + 1)
        cos, sin = self._rope_tables(positions, tables) if self.layer.rope is not None else (None, None)
        return fused(h, keys, values, p, cos, sin)

    def _rope_tables(self, positions: np.ndarray, tables: dict) -> tuple:
        """This layer's RoPE cos/sin at ``positions``, computed once per forward call (``tables``
        is keyed by the Rope object: layers with the same rotation share it)."""
        rope = self.layer.rope
        if id(rope) not in tables:
            tables[id(rope)] = rope.cos_sin(positions, int(positions[-1]) + 1)
        return tables[id(rope)]

    def _project(self, roles: tuple, x: np.ndarray) -> tuple:
        """The projections ``roles`` of x, computed together (``Projections``; built on first
        use, again after a projection is replaced)."""
        g = self._grouped.get(roles)
        if g is None:
            g = self._grouped[roles] = Projections(tuple(getattr(self, r) for r in roles))
        return g(x)

    def _attention(self, x: np.ndarray, cache: KVCache, positions: np.ndarray, bias, tables: dict) -> np.ndarray:
        s, T = self.spec, x.shape[0]
        q, k, v = self._project(("q", "k", "v"), x)
        if s.clip_qkv is not None:
            q, k, v = (np.clip(t, -s.clip_qkv, s.clip_qkv) for t in (q, k, v))
        if s.qk_norm == "proj" and self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        H, KV, D = s.num_attention_heads, s.num_key_value_heads, s.head_dim
        if T == 1:  # decoding: [1, heads * D] is already [heads, 1, D] in memory
            q, k, v = q.reshape(H, 1, D), k.reshape(KV, 1, D), v.reshape(KV, 1, D)
        else:
            q = np.ascontiguousarray(q.reshape(T, H, D).transpose(1, 0, 2))
            k = np.ascontiguousarray(k.reshape(T, KV, D).transpose(1, 0, 2))
            v = v.reshape(T, KV, D).transpose(1, 0, 2)
        head_norm = s.qk_norm == "head" and self.q_norm is not None
        if head_norm and not s.qk_norm_after_rope:
            q, k = self.q_norm(q), self.k_norm(k)
        rope = self.layer.rope
        if rope is not None:
            rope.apply_pair(q, k, *self._rope_tables(positions, tables))
        if head_norm and s.qk_norm_after_rope:
            q, k = self.q_norm(q), self.k_norm(k)
        if s.query_temperature is not None:
            q = q * query_temperature(positions, *s.query_temperature)
        keys, values = cache.append(self.i, k, v)
        out = attention(q, keys, values, positions, scale=s.attn_scale, window=self.layer.sliding_window,
                        softcap=s.attn_softcap, bias=bias, sinks=self.sinks)
        return self.o(out.reshape(1, H * D) if T == 1 else out.transpose(1, 0, 2).reshape(T, H * D))

    def _ffn(self, x: np.ndarray) -> np.ndarray:
        if self.gate is not None:
            if self.act.__class__ is XIELU:
                return self.down(self.act(self.gate(x)) * self.up(x))
            return self.down(gated(self.spec.hidden_act, *self._project(("gate", "up"), x)))
        return self.down(self.act(self.up(x)))

    def __call__(self, h: np.ndarray, cache: KVCache, positions: np.ndarray, bias=None,
                 tables: dict | None = None) -> np.ndarray:
        """One block on h float32 [T, hidden_size]; ``tables`` shares RoPE cos/sin between
        the layers of one forward call (keyed by the Rope object)."""
        n, r = self.norms, self._residual_scale
        x = n["attn_norm"](h) if "attn_norm" in n else h
        a = self._attention(x, cache, positions, bias, {} if tables is None else tables)
        a = n["attn_post_norm"](a) if "attn_post_norm" in n else a
        if not self.spec.parallel:
            h = h + (a * r if r != 1 else a)
            x = h
        m = self._ffn(n["ffn_norm"](h) if "ffn_norm" in n else x)
        m = n["ffn_post_norm"](m) if "ffn_post_norm" in n else m
        if self.spec.parallel:
            m = a + m
        return h + (m * r if r != 1 else m)


class Decoder:
    """A decoder-only transformer built from a ``ModelSpec`` and its weights.

    Args:
        spec: the normalised configuration.
        weights: a source of named arrays; names are ``spec.names[role]`` with ``{i}``
            filled in, plus ``.weight`` / ``.bias`` (read through ``layout.Layout``).

    Raises:
        SterError: a required tensor is missing or has the wrong shape.
    """

    def __init__(self, spec: ModelSpec, weights: WeightSource):
        self.spec = spec
        self._weights = weights
        # one-token calls run qualifying blocks through their fused step (``step.py``);
        # False keeps every block in Python (tests compare the two)
        self.fuse_decode = True
        layout = Layout(spec, weights)

        def top(role, kind="weight", required=False):
            return layout.get(role, None, kind, required)

        self.embed = top("embed", required=True)
        self.pos_embed = top("pos_embed", required=True) if spec.positions == "learned" else None
        self.embed_norm = (_Norm(spec, top("embed_norm", required=spec.norm_affine), top("embed_norm", "bias"))
                           if spec.embed_norm else None)
        self.layers = [_Layer(spec, i, layout) for i in range(spec.num_hidden_layers)]
        self.final_norm = _Norm(spec, top("final_norm", required=spec.norm_affine), top("final_norm", "bias"))
        head = None if spec.tie_word_embeddings else top("head")
        self.head = make_linear(head if head is not None else self.embed, top("head", "bias"))
        self._link_read_ahead()

    def _link_read_ahead(self) -> None:
        """Tell each quantized matrix which ones a decode step multiplies next (q/k/v, o,
        gate/up, down, the next layer's q/k/v, ..., the head), so the thread pool's idle
        helpers prefetch them while the caller runs the small ops in between."""
        groups = []
        for layer in self.layers:
            groups += [(layer.q, layer.k, layer.v), (layer.o,),
                       (layer.gate, layer.up) if layer.gate is not None else (layer.up,), (layer.down,)]
        groups.append((self.head,))
        mats = [tuple(p._m for p in g if isinstance(p, QuantLinear)) for g in groups]
        for here, ahead in zip(mats, mats[1:]):
            for m in here:
                m.set_read_ahead(ahead)

    @property
    def weights(self) -> WeightSource:
        """The weight source the decoder was built from."""
        return self._weights

    def new_cache(self, dtype=np.float32) -> KVCache:
        """An empty KV cache for this model, keeping keys and values as ``dtype`` (see ``KVCache``)."""
        s = self.spec
        return KVCache(s.num_hidden_layers, s.num_key_value_heads, s.head_dim, dtype=dtype)

    def embed_tokens(self, ids: np.ndarray) -> np.ndarray:
        """Token ids int [T] -> float32 [T, hidden_size], scaled as the family scales."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.spec.vocab_size):
            raise SterError(f"token id out of range for a vocabulary of {self.spec.vocab_size}")
        h = np.asarray(self.embed[ids], dtype=np.float32)
        if self.spec.embed_scale != 1.0:
            h = h * np.float32(self.spec.embed_scale)
        return h

    def _embed(self, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Token embeddings plus the family's learned positions and embedding norm."""
        h = self.embed_tokens(ids)
        if self.pos_embed is not None:
            rows = positions + self.spec.position_offset
            if rows[-1] >= self.pos_embed.shape[0]:
                learned = self.pos_embed.shape[0] - self.spec.position_offset
                raise SterError(f"position {int(positions[-1])} is past the {learned} positions this model "
                                "learned; use a shorter prompt or fewer new tokens")
            h = h + np.asarray(self.pos_embed[rows], dtype=np.float32)
        return self.embed_norm(h) if self.embed_norm is not None else h

    def forward(self, ids, cache: KVCache | None = None, *, hidden_states: list | None = None,
                layer_hook: LayerHook | None = None, last_only: bool = False) -> np.ndarray:
        """Run the decoder on new tokens.

        Args:
            ids: int [T] token ids that follow what ``cache`` holds.
            cache: the KV cache (None: a fresh one, discarded after the call).
            hidden_states: if a list is given, it receives float32 [T, hidden_size] arrays:
                the embedding output, then the residual stream after each layer
                (Transformers' ``output_hidden_states`` order, without the final norm).
            layer_hook: called as ``h = layer_hook(i, h)`` after layer ``i`` (steering); what
                it returns is taken as float32 [T, hidden_size].
            last_only: compute logits for the last position only.

        Returns:
            float32 logits [T, vocab_size] (or [1, vocab_size] with ``last_only``).

        Raises:
            SterError: a token id outside the vocabulary, or (learned positions) a position
                past the model's table.
        """
        s = self.spec
        cache = cache if cache is not None else self.new_cache()
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        positions = np.arange(cache.length, cache.length + ids.shape[0])
        h = self._embed(ids, positions)
        bias = (alibi_bias(s.alibi_slopes, int(positions[-1]) + 1, scale=s.alibi_scale, bf16=s.alibi_bf16)
                if s.alibi_slopes is not None else None)
        if hidden_states is not None:
            hidden_states.append(h)
        tables: dict = {}  # RoPE cos/sin per Rope object, computed once per call
        # the fused step stores keys itself: only into this class's cache, not a subclass's
        fuse = (self.fuse_decode and ids.shape[0] == 1 and bias is None and type(cache) is KVCache
                and cache.length + 1 <= np.iinfo(np.int32).max)
        for layer in self.layers:
            fused = layer.decode_step() if fuse else None
            if fused is not None:
                h = layer.step_one(fused, h, cache, positions, tables)
            else:
                h = layer(h, cache, positions, bias, tables)
            if layer_hook is not None:  # the stream stays float32 [T, hidden] whatever the hook returns
                h = np.ascontiguousarray(layer_hook(layer.i, h), dtype=np.float32)
            if hidden_states is not None:
                hidden_states.append(h)
        cache.advance(ids.shape[0])
        if last_only:
            h = h[-1:]
        logits = self.head(self.final_norm(h))
        if s.logit_scale != 1.0:
            logits = logits * np.float32(s.logit_scale)
        if s.final_softcap:
            logits = np.tanh(logits / np.float32(s.final_softcap)) * np.float32(s.final_softcap)
        return logits
