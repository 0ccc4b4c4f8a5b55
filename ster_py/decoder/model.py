"""The generic decoder: embeddings -> blocks -> final norm -> head.

One class runs every family. What differs between families arrives as data in
the ``ModelSpec`` (which norms wrap a sublayer, how heads are normed, rotation
and window per layer, soft-caps, scales); this file never names a family.

A block computes (each norm only where ``spec.norms`` lists it)::

    h = h + attn_post_norm(attention(attn_norm(h)))
    h = h + ffn_post_norm(ffn(ffn_norm(h)))

which is Llama's pre-norm block, Gemma 2/3's sandwich, or OLMo 2's post-norm block.
Compute is float32; weights keep their stored dtype (f32, f16 or bf16) until used.
"""
from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from ..config import ModelSpec
from ..errors import SterError
from .attention import attention
from .cache import KVCache
from .ffn import ACT_FNS
from .linear import make_linear
from .norms import layer_norm, rms_norm


class WeightSource(Protocol):
    """Named tensors of a checkpoint: ``get(name)`` returns an array, or None when absent."""

    def get(self, name: str) -> np.ndarray | None: ...


LayerHook = Callable[[int, np.ndarray], np.ndarray]


class _Norm:
    def __init__(self, spec: ModelSpec, weight, bias):
        self.spec, self.weight, self.bias = spec, weight, bias

    def __call__(self, x: np.ndarray) -> np.ndarray:
        s = self.spec
        if s.norm == "layer":
            return layer_norm(x, self.weight, self.bias, s.norm_eps)
        return rms_norm(x, self.weight, s.norm_eps, s.norm_unit_offset)


class _Layer:
    def __init__(self, spec: ModelSpec, i: int, load):
        self.i, self.spec, self.layer = i, spec, spec.layers[i]
        self.norms = {role: _Norm(spec, load(role, "weight", required=True), load(role, "bias"))
                      for role in spec.norms}
        self.q, self.k, self.v, self.o = (make_linear(load(r, "weight", required=True), load(r, "bias"))
                                          for r in ("q", "k", "v", "o"))
        self.q_norm = self.k_norm = None
        if spec.qk_norm:
            self.q_norm = _Norm(spec, load("q_norm", "weight", required=True), None)
            self.k_norm = _Norm(spec, load("k_norm", "weight", required=True), None)
        gate = load("gate", "weight")
        self.gate = make_linear(gate, load("gate", "bias")) if gate is not None else None
        self.up = make_linear(load("up", "weight", required=True), load("up", "bias"))
        self.down = make_linear(load("down", "weight", required=True), load("down", "bias"))
        self.act = ACT_FNS[spec.hidden_act]

    def _attention(self, x: np.ndarray, cache: KVCache, positions: np.ndarray) -> np.ndarray:
        s, T = self.spec, x.shape[0]
        q = self.q(x).reshape(T, s.num_attention_heads, s.head_dim).transpose(1, 0, 2)
        k = self.k(x).reshape(T, s.num_key_value_heads, s.head_dim).transpose(1, 0, 2)
        v = self.v(x).reshape(T, s.num_key_value_heads, s.head_dim).transpose(1, 0, 2)
        if s.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = np.ascontiguousarray(q), np.ascontiguousarray(k)
        rope = self.layer.rope
        if rope is not None:
            cos, sin = rope.cos_sin(positions, int(positions[-1]) + 1)
            rope.apply(q, cos, sin)
            rope.apply(k, cos, sin)
        keys, values = cache.append(self.i, k, v)
        out = attention(q, keys, values, positions, scale=s.attn_scale,
                        window=self.layer.sliding_window, softcap=s.attn_softcap)
        return self.o(out.transpose(1, 0, 2).reshape(T, s.num_attention_heads * s.head_dim))

    def _ffn(self, x: np.ndarray) -> np.ndarray:
        if self.gate is not None:
            return self.down(self.act(self.gate(x)) * self.up(x))
        return self.down(self.act(self.up(x)))

    def __call__(self, h: np.ndarray, cache: KVCache, positions: np.ndarray) -> np.ndarray:
        n = self.norms
        x = n["attn_norm"](h) if "attn_norm" in n else h
        a = self._attention(x, cache, positions)
        h = h + (n["attn_post_norm"](a) if "attn_post_norm" in n else a)
        x = n["ffn_norm"](h) if "ffn_norm" in n else h
        m = self._ffn(x)
        return h + (n["ffn_post_norm"](m) if "ffn_post_norm" in n else m)


def _expected_shapes(spec: ModelSpec) -> dict[tuple[str, str], tuple[int, ...]]:
    """(role, 'weight'|'bias') -> the shape the configuration implies."""
    d, q, kv = spec.hidden_size, spec.num_attention_heads * spec.head_dim, spec.num_key_value_heads * spec.head_dim
    f = spec.intermediate_size
    shapes = {("q", "weight"): (q, d), ("k", "weight"): (kv, d), ("v", "weight"): (kv, d), ("o", "weight"): (d, q),
              ("q", "bias"): (q,), ("k", "bias"): (kv,), ("v", "bias"): (kv,), ("o", "bias"): (d,),
              ("gate", "weight"): (f, d), ("up", "weight"): (f, d), ("down", "weight"): (d, f),
              ("gate", "bias"): (f,), ("up", "bias"): (f,), ("down", "bias"): (d,),
              ("head", "weight"): (spec.vocab_size, d), ("final_norm", "weight"): (d,)}
    for role in ("attn_norm", "attn_post_norm", "ffn_norm", "ffn_post_norm"):
        shapes[(role, "weight")] = (d,)
    norm_width = spec.head_dim if spec.qk_norm == "head" else None
    if norm_width:
        shapes[("q_norm", "weight")] = shapes[("k_norm", "weight")] = (norm_width,)
    return shapes


class Decoder:
    """A decoder-only transformer built from a ``ModelSpec`` and its weights.

    Args:
        spec: the normalised configuration.
        weights: a source of named arrays; names are ``spec.names[role]`` with ``{i}``
            filled in, plus ``.weight`` / ``.bias``.

    Raises:
        SterError: a required tensor is missing or has the wrong shape.
    """

    def __init__(self, spec: ModelSpec, weights: WeightSource):
        self.spec = spec
        self._weights = weights

        expected = _expected_shapes(spec)

        def loader(i):
            def load(role: str, kind: str, required: bool = False):
                name = f"{spec.names[role].format(i=i)}.{kind}"
                t = weights.get(name)
                if t is None:
                    if required:
                        raise SterError(f"the checkpoint has no tensor {name!r}, which a {spec.model_type} "
                                        "model needs; is the config.json from the same checkpoint?")
                    return None
                want = expected.get((role, kind))
                if want is not None and tuple(t.shape) != want:
                    raise SterError(f"tensor {name!r} has shape {list(t.shape)}, but the configuration "
                                    f"implies {list(want)}; the weights and the config disagree")
                return t
            return load

        top = loader(None)
        self.embed = top("embed", "weight", required=True)
        if self.embed.shape != (spec.vocab_size, spec.hidden_size):
            raise SterError(f"tensor {spec.names['embed']}.weight has shape {tuple(self.embed.shape)}, "
                            f"but the config says [{spec.vocab_size}, {spec.hidden_size}]")
        self.layers = [_Layer(spec, i, loader(i)) for i in range(spec.num_hidden_layers)]
        self.final_norm = _Norm(spec, top("final_norm", "weight", required=True), top("final_norm", "bias"))
        head = None if spec.tie_word_embeddings else top("head", "weight")
        self.head = make_linear(head if head is not None else self.embed, top("head", "bias"))

    def new_cache(self) -> KVCache:
        """An empty KV cache for this model."""
        s = self.spec
        return KVCache(s.num_hidden_layers, s.num_key_value_heads, s.head_dim)

    def embed_tokens(self, ids: np.ndarray) -> np.ndarray:
        """Token ids int [T] -> float32 [T, hidden_size], scaled as the family scales."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.spec.vocab_size):
            raise SterError(f"token id out of range for a vocabulary of {self.spec.vocab_size}")
        h = np.asarray(self.embed[ids], dtype=np.float32)
        if self.spec.embed_scale != 1.0:
            h = h * np.float32(self.spec.embed_scale)
        return h

    def forward(self, ids, cache: KVCache | None = None, *, hidden_states: list | None = None,
                layer_hook: LayerHook | None = None, last_only: bool = False) -> np.ndarray:
        """Run the decoder on new tokens.

        Args:
            ids: int [T] token ids that follow what ``cache`` holds.
            cache: the KV cache (None: a fresh one, discarded after the call).
            hidden_states: if a list is given, it receives float32 [T, hidden_size] arrays:
                the embedding output, then the residual stream after each layer
                (Transformers' ``output_hidden_states`` order, without the final norm).
            layer_hook: called as ``h = layer_hook(i, h)`` after layer ``i`` (steering).
            last_only: compute logits for the last position only.

        Returns:
            float32 logits [T, vocab_size] (or [1, vocab_size] with ``last_only``).
        """
        s = self.spec
        cache = cache if cache is not None else self.new_cache()
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        positions = np.arange(cache.length, cache.length + ids.shape[0])
        h = self.embed_tokens(ids)
        if hidden_states is not None:
            hidden_states.append(h)
        for layer in self.layers:
            h = layer(h, cache, positions)
            if layer_hook is not None:
                h = layer_hook(layer.i, h)
            if hidden_states is not None:
                hidden_states.append(h)
        cache.advance(ids.shape[0])
        if last_only:
            h = h[-1:]
        logits = self.head(self.final_norm(h))
        if s.final_softcap:
            logits = np.tanh(logits / np.float32(s.final_softcap)) * np.float32(s.final_softcap)
        return logits
