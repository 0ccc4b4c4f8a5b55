"""The generic decoder: embeddings -> blocks -> final norm -> head.

One class runs every family. What differs between families arrives as data in
the ``ModelSpec`` (which norms wrap a sublayer, how heads are normed, rotation
and window per layer, position biases, soft-caps, scales); how a family stores
its tensors (fused, transposed, per head) is undone at load by ``layout.Layout``.
This file never names a family.

A block is composed per layer from data: norms (which of the four, ``spec.layer_norms(i)``), a
mixer (``LayerSpec.mixer``: ``MIXERS``: attention, latent attention, Mamba's or Mamba-2's scan,
attention and a scan side by side, a gated delta net, Kimi Delta Attention, or none) and a feed-forward
(``LayerSpec.ffn``: ``"dense"``, ``ffn.DenseFFN``; ``"moe"``, ``moe.MoE``; or ``"none"``),
joined sequentially or in parallel. It computes (each norm only where listed,
r = residual_scale)::

    h = h + r * attn_post_norm(mixer(attn_norm(h)))
    h = h + r * ffn_post_norm(ffn(ffn_norm(h)))

which is Llama's pre-norm block, Gemma 2/3's sandwich, or OLMo 2's post-norm block; a
parallel block (GPT-J, GPT-NeoX, Phi-2, Cohere, Falcon) adds both sublayers to the same
residual, the feed-forward reading ``ffn_norm(h)``, or the mixer's normed input without one.
Compute is float32; weights keep their stored dtype (f32, f16 or bf16) until used.

A looped model (``ModelSpec.loop``, ``loops.py``) runs its executed layers in passes that join through
running states; its layers are every pass's, each reading its stored layer's weights.
"""
from __future__ import annotations

import math
from dataclasses import replace
from importlib import import_module
from typing import Callable, Protocol

import numpy as np

from ..config import ModelSpec
from ..errors import Cancelled, SterError
from .activations import ACT_FNS
from .attention import MASK_POSITIONS
from .cache import KVCache
from .ffn import DenseFFN
from .heap import keep_freed_arrays
from .layout import Layout
from .linear import Linear, make_linear
from .norms import Norm
from .positions import alibi_bias, alibi_sqrt_bias
from .qlinear import QuantLinear
from .step import layer_step


class WeightSource(Protocol):
    """Named tensors of a checkpoint: ``get(name)`` returns an array, or None when absent."""

    def get(self, name: str) -> np.ndarray | None: ...


#: ``layer_hook(i, h) -> h``, called with the residual stream after layer i. A hook may declare what it acts on
#: (``steering.steering_hook``'s do): ``layers``, the layer numbers, and ``width``, the stream's width it expects;
#: ``check_layer_hook`` refuses one that does not fit the model before any work.
LayerHook = Callable[[int, np.ndarray], np.ndarray]


_UNBUILT = object()
#: ``LayerSpec.mixer`` -> the part that mixes tokens on such a layer, built as
#: ``cls(spec, i, load, norm)``; a mixer that keeps state other than keys and values
#: gives the cache its slot (``new_slot(dtype)``, see ``cache.KVCache``), and one whose
#: ``KV`` is true keeps keys and values too. A mixer whose ``OWN_NORMS`` lists a sublayer norm
#: builds and applies that norm itself (the block leaves it out). ``"none"``: the layer is only a
#: feed-forward. Named by (module, class) and imported by ``mixer_class`` when a model has such a
#: layer, so that a model imports only its own mixers (a dense model's load skips the rest).
MIXERS = {"attention": ("attention", "Attention"), "latent": ("latent", "LatentAttention"),
          "mamba": ("mamba", "Mamba"), "mamba2": ("mamba2", "Mamba2"), "hybrid": ("hybrid", "Hybrid"),
          "shortconv": ("shortconv", "ShortConv"), "lightning": ("lightning", "Lightning"),
          "shared_hybrid": ("shared_block", "SharedHybrid"), "gated_delta": ("delta", "GatedDeltaNet"),
          "kda": ("kda", "KimiDeltaAttention"), "block_sparse": ("block_sparse", "BlockSparseAttention"),
          "relative": ("relative", "RelativeAttention"), "compressed": ("compressed", "CompressedAttention")}


def mixer_class(kind: str) -> type | None:
    """The part class of ``LayerSpec.mixer`` ``kind`` (``MIXERS``), imported on first use; None for
    ``"none"`` (a layer that is only a feed-forward) or a kind no part implements."""
    where = MIXERS.get(kind)
    return None if where is None else getattr(import_module(f"{__package__}.{where[0]}"), where[1])


def build_ffn(spec: ModelSpec, i: int, layout: Layout, load, kind: str | None = None):
    """Layer ``i``'s feed-forward, of the kind its ``LayerSpec.ffn`` names (or ``kind``): a
    ``DenseFFN``, a routed ``MoE`` or None."""
    kind = kind or spec.layers[i].ffn
    if kind == "none":
        return None
    if kind == "dense":
        gate = load("gate")
        act = None
        if spec.hidden_act == "xielu":
            from .xielu import XIELU

            act = XIELU(*(load("act", p, required=True) for p in ("alpha_p", "alpha_n", "beta", "eps")))
        mup = spec.mup
        scale = load("ffn_scale", "") if "ffn_scale" in spec.names else None  # Inkling's mlp.global_scale
        out_scale = mup.ffn_down if mup else float(np.asarray(scale).reshape(-1)[0]) if scale is not None else 1.0
        return DenseFFN(make_linear(gate, load("gate", "bias")) if gate is not None else None,
                        make_linear(load("up", required=True), load("up", "bias")),
                        make_linear(load("down", required=True), load("down", "bias")), spec.hidden_act, act,
                        gate_scale=mup.ffn_gate if mup else 1.0, out_scale=out_scale,
                        glu=spec.ffn_glu, limit=spec.ffn_limit, alpha=spec.ffn_alpha,
                        sparsity=spec.layers[i].ffn_sparsity, sparsity_ddof=spec.sparsity_ddof)
    from .moe import MoE, identity

    m = spec.layers[i].moe or spec.moe

    def ffn(parts, limit):
        gate, up, down = (make_linear(w, b) if w is not None else None for w, b in parts)
        return DenseFFN(gate, up, down, m.act, glu=m.glu, limit=limit, alpha=m.alpha, clamp_act=m.clamp_act)

    experts = [ffn(parts, m.limit) for parts in layout.experts(i)] + [identity] * m.identity_experts
    if m.router.sink:  # shared experts the router weighs beside the chosen ones (RouterSpec.sink)
        experts += [ffn(parts, m.limit) for parts in layout.sink_experts(i, m.router.sink)]
    scale = load("router_scale", "") if "router_scale" in spec.names else None  # a stored factor on the weights
    if scale is not None:
        m = replace(m, router=replace(m.router, scale=m.router.scale * float(np.asarray(scale).reshape(-1)[0])))
    shared = shared_gate = latent = None
    if m.shared_size:
        gated = any(r in spec.names for r in ("shexp_gate", "shexp_gate_up"))  # Nemotron-H's have no gate
        shared = ffn([(load(r, required=True), load(r, "bias")) if gated or r != "shexp_gate" else (None, None)
                      for r in ("shexp_gate", "shexp_up", "shexp_down")], m.shared_limit)
        if m.shared_gated:  # [1, hidden] (llama.cpp's converter stores it as a vector)
            gate = load("shexp_gate_inp", required=True)
            shared_gate = make_linear(gate.reshape(1, -1) if gate.ndim == 1 else gate)
    select_bias = (layout.get("router_select_bias", i, "", required=not m.select_bias_optional)
                   if m.router.select_bias else None)  # absent and optional: chosen by the scores alone
    if m.latent_size:
        latent = tuple(make_linear(load(r, required=True), load(r, "bias")) for r in ("moe_latent_in", "moe_latent_out"))
    # a selection bias stored as the router's own bias (Inkling's mlp.gate.bias) is not a bias on its logits
    bias_is_select = m.router.select_bias and spec.names.get("router_select_bias") == f'{spec.names.get("router")}.bias'
    router_bias = None if bias_is_select else load("router", "bias")
    moe = MoE(m, make_linear(load("router", required=True), router_bias), select_bias, experts,
              shared, shared_gate, latent)
    if m.router.hashed:  # DeepSeek-V4's hash layers: the token's row of tid2eid chooses
        table = np.asarray(load("router_hash", "", required=True))
        if table.shape != (spec.vocab_size, m.router.top_k):
            raise SterError(f"layer {i}'s hash routing table has shape {list(table.shape)}; the configuration "
                            f"implies [{spec.vocab_size}, {m.router.top_k}]: the weights and the config disagree")
        if table.dtype.kind == "f" and not (np.isfinite(table).all() and (table == np.round(table)).all()):
            raise SterError(f"layer {i}'s hash routing table holds values that are not whole numbers (NaN, infinite "
                            "or fractional); expert ids are integers (stored as I32): the checkpoint is damaged")
        if table.size and (table.min() < 0 or table.max() >= m.router.num_experts):
            raise SterError(f"layer {i}'s hash routing table holds expert ids {int(table.min())}..{int(table.max())}, "
                            f"outside 0..{m.router.num_experts - 1} (the config's expert count): the weights and "
                            "the config disagree")
        ordered = np.sort(table, axis=1)
        if (ordered[:, 1:] == ordered[:, :-1]).any():
            raise SterError(f"layer {i}'s hash routing table names one expert twice for a token; the checkpoint is "
                            "damaged or not this model's")
        moe.hash_table = table.astype(np.int64)
    return moe


#: The sublayer norms, over the hidden width (``ModelSpec.norm_groups`` applies to them and the final norm).
SUBLAYER_NORMS = ("attn_norm", "attn_post_norm", "ffn_norm", "ffn_post_norm")

#: The key of a forward call's ``tables`` under which a ``shortcut="open"`` layer holds its routed
#: feed-forward's output for the ``"close"`` layer after it (``LayerSpec.shortcut``).
SHORTCUT = "block.shortcut"


class _Layer:
    """One block: its norms, its mixer (``MIXERS``, or none), its feed-forward (dense, routed or
    none), joined sequentially or in parallel (see the module docstring). A block without a
    mixer adds ``ffn(ffn_norm(h))`` to the stream.

    The parts' projections read as the block's own attributes (``layer.q``, ``layer.gate``:
    what adapters and the fused step use); setting one through the block replaces it in
    its part and drops the block's fused step.
    """

    def __init__(self, spec: ModelSpec, i: int, layout: Layout):
        d = self.__dict__  # set directly: __setattr__ below is for changes after load
        d.update(i=i, spec=spec, layer=spec.layers[i], _step=_UNBUILT, _residual_scale=np.float32(spec.residual_scale))

        def load(role, kind="weight", required=False, layer=None, slot=None):
            # layer: another layer's tensor (a block shared between layers); slot: fills a name's {k}
            return layout.get(role, i if layer is None else layer, kind, required, slot=slot)

        def norm(role):
            offset = spec.norm_offset(role)
            eps = (spec.post_norm_eps if spec.post_norm_eps is not None and role in ("attn_post_norm", "ffn_post_norm")
                   else spec.norm_eps)
            return Norm(spec.norm, eps, load(role, required=spec.norm_affine), load(role, "bias"),
                        spec.norm_unit_offset and offset is None, offset or 0.0,
                        spec.norm_groups if role in SUBLAYER_NORMS else 1)  # (q/k norms are a head wide)

        cls = mixer_class(self.layer.mixer)
        own = getattr(cls, "OWN_NORMS", ())
        d["norms"] = {role: norm(role) for role in spec.layer_norms(i) if role not in own}
        d["mixer"] = cls(spec, i, load, norm) if cls is not None else None
        d["ffn"] = build_ffn(spec, i, layout, load)
        d["ffn_conv"] = (np.ascontiguousarray(np.asarray(load("ffn_out_conv", required=True), np.float32)
                                              .reshape(spec.hidden_size, -1)) if spec.ffn_out_conv else None)
        d["shortcut"] = build_ffn(spec, i, layout, load, "moe") if self.layer.shortcut == "open" else None
        # Gemma 4: a per-layer input joins after the block, then the block's output is scaled
        d["per_layer"] = ((make_linear(load("per_layer_gate", required=True)),
                           make_linear(load("per_layer_proj", required=True)), norm("per_layer_post_norm"))
                          if spec.per_layer_input else None)
        d["scalar"] = (np.float32(load("layer_scalar", "", required=True).reshape(-1)[0])
                       if spec.layer_scalar else None)
        # hyper-connections before the mixer and the feed-forward (ModelSpec.streams, decoder/streams.py)
        if spec.streams is not None:
            from .streams import HyperConnection
        if spec.altup is not None or spec.laurel:
            from .altup import AltUp, Laurel
        d["hc"] = (tuple(HyperConnection(spec.streams, *(load(f"hc_{part}_{p}", "", required=True)
                                                         for p in ("fn", "base", "scale")))
                         for part in ("attn", "ffn")) if spec.streams is not None else None)
        # Gemma 3n: AltUp's prediction and correction around the block, Laurel's residual inside it
        d["altup"] = (AltUp(spec.altup, spec.hidden_size, make_linear(load("altup_router", required=True)),
                            norm("altup_router_norm"), load("altup_predict", required=True),
                            load("altup_correct", required=True),
                            load("altup_output_scale", "", required=spec.altup.correct_scale))
                      if spec.altup is not None else None)
        d["laurel"] = (Laurel(make_linear(load("laurel_left", required=True)),
                              make_linear(load("laurel_right", required=True)), norm("laurel_norm"))
                       if spec.laurel else None)

    def _owner(self, name: str):
        d = self.__dict__
        for part in (d.get("mixer"), d.get("ffn")):
            if part is not None and name in part.ROLES:
                return part
        return None

    def __getattr__(self, name):  # only reached when the block itself has no such attribute
        part = self._owner(name)
        if part is None:
            raise AttributeError(name)
        return getattr(part, name)

    def __setattr__(self, name, value):
        # Adapters replace projections after load: the part drops the groups built from them,
        # and the fused step (which points into the projections, norm weights, biases and
        # sinks) is dropped on any attribute set here. Values changed inside those arrays reach
        # both paths; replacing an object held inside another (an entry of ``norms``, a
        # ``Norm.weight``, a ``QuantLinear.bias``) is not seen: set the block's attribute again.
        part = self._owner(name)
        if part is not None:
            setattr(part, name, value)  # the part drops the groups built from the old projection
        else:
            object.__setattr__(self, name, value)
        if name not in ("_step",):
            object.__setattr__(self, "_step", _UNBUILT)

    def decode_step(self):
        """This block's fused one-token step (``step.layer_step``; built on first use, again
        after a projection is replaced), or None when the block does not qualify."""
        if self._step is _UNBUILT:
            object.__setattr__(self, "_step", layer_step(self))
        return self._step

    def step_one(self, fused, h: np.ndarray, cache: KVCache, positions: np.ndarray, tables: dict) -> np.ndarray:
        """``__call__`` for one token through ``fused`` (this block's ``decode_step()``)."""
        p = int(positions[0])
        keys, values = cache.buffers(self.i, p + 1)
        cos, sin = self.mixer.rope_tables(positions, tables) if self.layer.rope is not None else (None, None)
        return fused(h, keys, values, p, cos, sin)

    def __call__(self, h: np.ndarray, cache: KVCache, positions: np.ndarray, bias=None,
                 tables: dict | None = None) -> np.ndarray:
        """One block on h float32 [T, hidden_size]; ``tables`` shares RoPE cos/sin between
        the layers of one forward call (keyed by the Rope object) and carries the per-layer
        inputs (``"per_layer"``, float32 [T, layers, width], ``PerLayerInputs``).

        With per-layer inputs (Gemma 4's ``Gemma4TextDecoderLayer``), the block's output h then
        adds post_norm(proj(act(gate(h)) * input_i)); with a layer scalar, the result is multiplied by it.

        Under AltUp (``ModelSpec.altup``; Gemma 3n's ``Gemma3nTextDecoderLayer``), h is the first of
        the stream's copies and ``tables["altup"]`` holds the others (float32 [T, hidden] each): all are
        predicted, the block runs on the first prediction, all are corrected by its change, and the
        per-layer input, gated by the first corrected copy, joins every copy but the first."""
        if self.altup is not None:
            return self._altup_call(h, cache, positions, bias, tables)
        if self.per_layer is None and self.scalar is None:
            return self._block(h, cache, positions, bias, tables)
        h = self._block(h, cache, positions, bias, tables)
        if self.per_layer is not None:
            gate, proj, post = self.per_layer
            g = ACT_FNS[self.spec.hidden_act](gate(h)) * tables["per_layer"][:, self.i, :]
            h = h + post(proj(np.ascontiguousarray(g, dtype=np.float32)))
        return h * self.scalar if self.scalar is not None else h

    def _altup_call(self, h, cache, positions, bias, tables) -> np.ndarray:
        """``__call__`` under AltUp: returns the first corrected copy, the others into ``tables``."""
        predicted = self.altup.predict([h] + tables["altup"])
        corrected = self.altup.correct(predicted, self._block(predicted[0], cache, positions, bias, tables))
        if self.per_layer is not None:
            gate, proj, post = self.per_layer
            g = ACT_FNS[self.spec.hidden_act](gate(self.altup.scaled_first(corrected[0])))
            g = g * tables["per_layer"][:, self.i, :]
            joined = post(proj(np.ascontiguousarray(g, dtype=np.float32)))
            corrected[1:] = [c + joined for c in corrected[1:]]
        tables["altup"] = corrected[1:]
        return corrected[0] * self.scalar if self.scalar is not None else corrected[0]

    def _block(self, h: np.ndarray, cache: KVCache, positions: np.ndarray, bias=None,
               tables: dict | None = None) -> np.ndarray:
        """The block itself (norms, mixer, feed-forward, join)."""
        n, r = self.norms, self._residual_scale
        if self.hc is not None:
            return self._streams_block(h, cache, positions, bias, tables)
        if self.layer.residual is not None:
            return self._scaled_join(h, cache, positions, bias, tables)
        if self.mixer is None:  # a feed-forward-only layer (Nemotron-H's)
            if self.ffn is None:  # neither half (DeciLM's no_op attention and feed-forward)
                return h
            m = self.ffn(n["ffn_norm"](h) if "ffn_norm" in n else h)
            return h + (m * r if r != 1 else m)
        tables = {} if tables is None else tables
        x = n["attn_norm"](h) if "attn_norm" in n else h
        a = self.mixer(x, cache, positions, bias, tables)
        a = n["attn_post_norm"](a) if "attn_post_norm" in n else a
        if self.ffn is None:
            return h + (a * r if r != 1 else a)
        if not self.spec.parallel:
            h = h + (a * r if r != 1 else a)
            if self.laurel is not None:  # Laurel's residual of the normed input joins, the sum / sqrt(2)
                h = (h + self.laurel(x)) * np.float32(2.0 ** -0.5)
            x = h
        f = n["ffn_norm"](h) if "ffn_norm" in n else x
        m = self.ffn(f)
        if self.ffn_conv is not None:  # a residual short convolution over the feed-forward's outputs
            from .relative import residual_conv

            m = residual_conv(m, self.ffn_conv, cache.slot(self.i)["ffn_out"])
        m = n["ffn_post_norm"](m) if "ffn_post_norm" in n else m
        if self.spec.parallel:
            m = a + m
        if self.shortcut is not None:  # the routed feed-forward that joins the stream a layer later
            tables[SHORTCUT] = self.shortcut(f)
        out = h + (m * r if r != 1 else m)
        if self.layer.shortcut == "close":
            out = out + tables.pop(SHORTCUT)
        return out

    def _streams_block(self, h, cache, positions, bias, tables) -> np.ndarray:
        """The block over hyper-connected streams h float32 [T, n, hidden] (``ModelSpec.streams``;
        Transformers' ``DeepseekV4DecoderLayer`` / ``HYV4DecoderLayer``): each sublayer reads the streams
        collapsed by its hyper-connection and its output is spread back over them (``HyperConnection.join``)."""
        from .streams import HyperConnection

        n, (attn_hc, ffn_hc) = self.norms, self.hc
        tables = {} if tables is None else tables
        x, post, comb = attn_hc(h)
        a = self.mixer(n["attn_norm"](x) if "attn_norm" in n else x, cache, positions, bias, tables)
        a = n["attn_post_norm"](a) if "attn_post_norm" in n else a
        h = HyperConnection.join(h, a, post, comb)
        x, post, comb = ffn_hc(h)
        x = n["ffn_norm"](x) if "ffn_norm" in n else x
        m = self.ffn(x, tables["tokens"]) if getattr(self.ffn, "hash_table", None) is not None else self.ffn(x)
        m = n["ffn_post_norm"](m) if "ffn_post_norm" in n else m
        return HyperConnection.join(h, m, post, comb)

    def _scaled_join(self, h, cache, positions, bias, tables) -> np.ndarray:
        """MiniMax's block (``LayerSpec.residual`` = (a1, b1, a2, b2)): each sublayer joins its
        residual as residual * a + output * b, the residual being the sublayer's normed input
        when ``ModelSpec.residual_normed`` (Transformers' ``MiniMaxDecoderLayer``), else its input."""
        n, (a1, b1, a2, b2) = self.norms, self.layer.residual
        x = n["attn_norm"](h) if "attn_norm" in n else h
        a = self.mixer(x, cache, positions, bias, {} if tables is None else tables)
        h = (x if self.spec.residual_normed else h) * np.float32(a1) + a * np.float32(b1)
        x = n["ffn_norm"](h) if "ffn_norm" in n else h
        m = self.ffn(x)
        return (x if self.spec.residual_normed else h) * np.float32(a2) + m * np.float32(b2)


class PerLayerInputs:
    """Gemma 4's per-layer inputs (the E models' per-layer embeddings, ``ModelSpec.per_layer_input``
    = P wide, over L layers), as Transformers' ``Gemma4TextModel.get_per_layer_inputs`` and
    ``project_per_layer_inputs`` compute them: the token's row of ``per_layer_embed`` [V', L * P]
    times sqrt(P), plus ``per_layer_proj_norm`` (an RMS norm over each layer's P) of the scaled
    embeddings through ``per_layer_model_proj`` [L * P, hidden] times hidden ** -0.5, the sum
    times 2 ** -0.5.

    Args:
        spec: the ``ModelSpec``.
        table: float [per_layer_vocab, L * P]; proj: the projection (a linear); norm: the ``Norm``.
    """

    def __init__(self, spec: ModelSpec, table, proj, norm):
        self.spec, self.table, self.proj, self.norm = spec, table, proj, norm

    def __call__(self, ids: np.ndarray, embedded: np.ndarray) -> np.ndarray:
        """ids int [T], embedded float32 [T, hidden] (the scaled embeddings) -> float32 [T, L, P].

        Raises:
            SterError: a token id past the per-layer table's rows (unless ``per_layer_clamp``: such
                ids read row 0, as Transformers' ``Gemma3nTextModel.get_per_layer_inputs`` does)."""
        s = self.spec
        L, P = s.num_hidden_layers, s.per_layer_input
        if s.per_layer_clamp:
            ids = np.where(ids < self.table.shape[0], ids, 0)
        elif ids.size and ids.max() >= self.table.shape[0]:
            raise SterError(f"token id {int(ids.max())} is past the {self.table.shape[0]} rows of the per-layer "
                            "embedding table")
        tok = np.asarray(self.table[ids], dtype=np.float32).reshape(-1, L, P) * np.float32(math.sqrt(P))
        ctx = (self.proj(embedded) * np.float32(s.hidden_size ** -0.5)).reshape(-1, L, P)
        return (self.norm(np.ascontiguousarray(ctx)) + tok) * np.float32(2.0 ** -0.5)


def _altup_projections(layout: Layout, role: str, n: int) -> list:
    """AltUp's n projections of ``role`` (each [hidden, hidden]): one tensor each (``{k}`` in the
    name, Transformers' altup_projections.k) or one stack [n, hidden, hidden] (llama.cpp's altup_proj).

    Raises:
        SterError: a projection missing, or a stack that does not hold n of them."""
    stacked = layout.get(role, None, "weight") if "{k}" not in layout.spec.names[role] else None
    if stacked is None:
        return [make_linear(layout.get(role, None, "weight", True, slot=k)) for k in range(n)]
    if len(stacked.shape) != 3 or stacked.shape[0] != n:
        raise SterError(f"the checkpoint's {layout.spec.names[role]!r} has shape {list(stacked.shape)}, but the "
                        f"configuration implies {n} stacked [hidden, hidden] projections")
    return [make_linear(stacked[k]) for k in range(n)]


def check_callbacks(func: str, **callbacks) -> None:
    """Refuse a library caller's callback argument (``layer_hook=5``) that is neither None nor callable, before
    any work: it would be a TypeError ('not callable') once first called, after a prompt's prefill for some.

    Raises:
        SterError: "FUNC's NAME must be a function or None, got TYPE".
    """
    for name, value in callbacks.items():
        if value is not None and not callable(value):
            raise SterError(f"{func}'s {name} must be a function or None, got {type(value).__name__}")


def check_layer_hook(func: str, layer_hook, spec) -> None:
    """Refuse a ``layer_hook`` that declares the layers it acts on (``layer_hook.layers``, as a steering vector's
    hook does) when one is past the model's last layer, or its ``width`` when it is not the model's
    ``hidden_size``: such a layer is never reached, so the hook would change nothing, silently.

    Raises:
        SterError: "the steering vector (FUNC's layer_hook) names layer N, but this model has layers 0..L-1" or
            "... is W wide, but this model's hidden_size is H".
    """
    layers, width = getattr(layer_hook, "layers", None), getattr(layer_hook, "width", None)
    if layers is None and width is None:   # a hook that declares nothing (any function) is not checked
        return
    n = spec.num_hidden_layers
    bad = sorted(i for i in (layers or ()) if not 0 <= i < n)
    if bad:
        raise SterError(f"the steering vector ({func}'s layer_hook) names layer {bad[-1]}, but this model has layers "
                        f"0..{n - 1}; use a vector made for this model")
    if width is not None and width != spec.hidden_size:
        raise SterError(f"the steering vector ({func}'s layer_hook) is {width} wide, but this model's hidden_size is "
                        f"{spec.hidden_size}; use a vector made for this model")


def as_token_ids(ids, *, empty_ok: bool = False) -> np.ndarray:
    """``ids`` (whole numbers: any iterable, or an integer array) as int64 [T].

    Raises:
        SterError: a text (it must be encoded first), values that are not whole numbers (floats,
            booleans, objects: numpy would truncate or refuse them further in), an array of more than
            one dimension (a batch), or no ids unless ``empty_ok``. Ranges are checked where the
            vocabulary is known (``embed_tokens``).
    """
    if isinstance(ids, (str, bytes)):
        raise SterError("token ids are whole numbers, not a text; encode the text first (tokenizer.encode)")
    try:
        arr = np.asarray(ids if isinstance(ids, np.ndarray) else list(ids))   # a set or a generator too
    except (TypeError, ValueError) as e:
        raise SterError(f"token ids must be a flat sequence of whole numbers ({e})") from None
    if arr.ndim > 1:   # a batch [B, T] read as one prompt would run its rows one after another
        raise SterError(f"token ids must be a flat sequence of whole numbers, got an array of shape "
                        f"{list(arr.shape)}; pass one prompt's ids (ids[0] of a batch of one)")
    if arr.size == 0:
        if not empty_ok:
            raise SterError("no token ids given: at least one is needed")
        return np.zeros(0, np.int64)
    if arr.dtype.kind not in "iu":
        shown = next((v for v in arr.reshape(-1).tolist() if isinstance(v, bool) or not isinstance(v, int)), arr.dtype)
        raise SterError(f"token ids must be whole numbers, got {shown!r}")
    return arr.astype(np.int64, copy=False).reshape(-1)


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
        keep_freed_arrays()   # a prompt's megabyte-sized results reuse freed memory, not fresh pages (heap.py)
        self.spec = spec
        self._weights = weights
        # bumped by whatever changes the weights in place (adapters.apply_adapter): a PromptCache reuses
        # only positions computed at the revision it holds
        self.revision = 0
        # one-token calls run qualifying blocks through their fused step (``step.py``);
        # False keeps every block in Python (tests compare the two)
        self.fuse_decode = True
        layout = Layout(spec, weights)

        def top(role, kind="weight", required=False):
            return layout.get(role, None, kind, required)

        self.embed = top("embed", required=True)
        self.pos_embed = top("pos_embed", required=True) if spec.positions == "learned" else None
        def norm(role, offset=spec.norm_unit_offset):
            return Norm(spec.norm, spec.norm_eps, top(role, required=spec.norm_affine), top(role, "bias"), offset,
                        groups=spec.norm_groups if role == "final_norm" else 1)

        # a weightless embedding norm (embed_norm_affine False) reads no tensor
        self.embed_norm = ((norm("embed_norm") if spec.embed_norm_affine else Norm(spec.norm, spec.norm_eps, None, None))
                           if spec.embed_norm else None)
        self.per_layer = (PerLayerInputs(spec, top("per_layer_embed", required=True),
                                         make_linear(top("per_layer_model_proj", required=True)),
                                         norm("per_layer_proj_norm"))
                          if spec.per_layer_input else None)
        g = getattr(spec, "ngram", None)  # hashed n-gram embeddings beside the token's (decoder/ngram.py)
        if g is not None:
            from .ngram import NgramEmbedding
        self.ngram = (NgramEmbedding(g, [layout.get("ngram_table", None, "weight", True, slot=j) for j in range(g.tables)],
                                     [layout.get("ngram_proj", None, "weight", True, slot=j) for j in range(g.tables)])
                      if g is not None else None)
        self.layers = [_Layer(spec, i, layout) for i in range(spec.num_hidden_layers)]
        # a looped model's later streams start from a stored vector (decoder/loops.py), else zeros
        self.loop_init = None
        if spec.loop is not None and spec.loop.states > 1:
            init = top(spec.loop.init, required=True) if spec.loop.init else None
            self.loop_init = (np.zeros(spec.hidden_size, np.float32) if init is None
                              else np.asarray(init, np.float32).reshape(spec.hidden_size))
        # AltUp: the projections that make the extra copies of the stream and bring them back
        self.altup = (tuple(_altup_projections(layout, role, spec.altup.num_inputs - 1)
                            for role in ("altup_in", "altup_out"))
                      if spec.altup is not None else None)
        self.final_norm = norm("final_norm", spec.norm_unit_offset if spec.final_norm_unit_offset is None
                               else spec.final_norm_unit_offset)
        st = spec.streams
        if st is not None:
            from .streams import HyperHead
        self.hc_head = (None if st is None else HyperHead(st) if st.head == "mean"
                        else HyperHead(st, *(top(f"hc_head_{p}", "", required=True) for p in ("fn", "base", "scale"))))
        head = top("head", required=spec.head_required and not spec.tie_word_embeddings)
        if spec.tie_word_embeddings and not stored_head_differs(head, self.embed):
            # Transformers ties the head to the embedding unless the checkpoint stores a head that differs
            head = None
        self.head = make_linear(head if head is not None else self.embed, top("head", "bias"))
        self._link_read_ahead()

    def _link_read_ahead(self) -> None:
        """Tell each quantized matrix which ones a decode step multiplies next (q/k/v, o,
        gate/up, down, the next layer's q/k/v, ..., the head), so the thread pool's idle
        helpers prefetch them while the caller runs the small ops in between."""
        groups = []
        for layer in self.layers:
            for part in (layer.mixer, layer.ffn):
                groups += part.read_order() if part is not None else []
        groups.append((self.head,))
        mats = [tuple(p._m for p in g if isinstance(p, QuantLinear)) for g in groups]
        for here, ahead in zip(mats, mats[1:]):
            for m in here:
                m.set_read_ahead(ahead)

    def _skip(self, i: int, h: np.ndarray, kept: list) -> np.ndarray:
        """Block skip connections before layer ``i`` (``ModelSpec.residual_skips``): each stream kept
        here is stored in ``kept``, then each mixed here becomes weight * kept + (1 - weight) * h."""
        skips = self.spec.residual_skips
        for j, skip in enumerate(skips):
            if i in skip.keep:
                kept[j] = h
        for j, skip in enumerate(skips):
            if i in skip.mix:
                w = np.float32(skip.weight)
                h = w * kept[j] + (np.float32(1) - w) * h
        return h

    @property
    def weights(self) -> WeightSource:
        """The weight source the decoder was built from."""
        return self._weights

    def quantize(self, kind: str, progress=None) -> dict[str, int]:
        """Replace float projections by GGML blocks made from them, in place (``--quantize``).

        Every block part's projections (its ``ROLES``: attention q/k/v/o, a dense
        feed-forward's gate/up/down) and the output head that hold a float matrix (float32,
        or float16 / bfloat16 as stored) become ``QuantLinear`` over blocks of
        ``qlinear.block_type_for(kind, in_features)`` (the head: ``qlinear.HEAD_TYPE[kind]``);
        rows that fit no block type stay as they are. Other weights (embedding rows, norms,
        routed experts, latent and state-space projections, routers) are not touched.

        Args:
            kind: ``q8_0``, ``q4_0`` or ``q4_k`` (``qlinear.QUANTIZE_TYPES``).
            progress: optional ``progress(event, done, total)``, event "quantize", per matrix.

        Returns:
            matrices quantized per block type ({"Q4_K": 30, "Q5_0": 150, ...}; a stored matrix that
            several passes of a looped model run counts once).

        Raises:
            SterError: an unknown kind, or a matrix with inf/NaN weights.
        """
        from .qlinear import HEAD_TYPE, QUANTIZE_TYPES, QuantTensor, block_type_for, is_half, quantize_matrix

        if kind not in QUANTIZE_TYPES:
            raise SterError(f"--quantize must be one of {', '.join(QUANTIZE_TYPES)}, got {kind!r}")
        jobs = []   # (owner, role, projection, block type)
        for layer in self.layers:
            for part in (layer.mixer, layer.ffn):
                for role in (part.ROLES if part is not None else ()):
                    jobs.append((layer, role, getattr(part, role, None), None))
        jobs.append((self, "head", self.head, HEAD_TYPE[kind]))
        counts: dict[str, int] = {}
        todo = [(o, r, p, t) for o, r, p, t in jobs
                if type(p) is Linear or (type(p) is QuantLinear and is_half(p.weight))]
        # a stored matrix run by several passes (one array, decoder/layout.py) is quantized once; the
        # array is kept beside its blocks so that its id is not reused while this runs
        done: dict[tuple, tuple] = {}
        for n, (owner, role, p, t) in enumerate(todo):
            t = block_type_for(t or kind, p.in_features)
            if t is not None:
                where = f"layer {owner.i} {role}" if owner is not self else "the output head"
                key = (id(p.weight), t)
                if key not in done:
                    blocks = quantize_matrix(p.weight, t, where)
                    done[key] = (p.weight, QuantTensor.from_blocks(blocks, t, p.in_features, where))
                    counts[t] = counts.get(t, 0) + 1
                setattr(owner, role, QuantLinear(done[key][1], p.bias))
            if progress:
                progress("quantize", n + 1, len(todo))
        self._link_read_ahead()
        return counts

    def new_cache(self, dtype=np.float32) -> KVCache:
        """An empty cache for this model: keys and values as ``dtype`` for the layers whose mixer
        attends (``KV``), and the slot each mixer that keeps its own state makes
        (``mixer.new_slot(dtype)``: a recurrent state, float32) (see ``KVCache``)."""
        s = self.spec
        shapes = [s.attention_shape(i)[1:] if getattr(layer.mixer, "KV", False) else (0, 0, 0)
                  for i, layer in enumerate(self.layers)]
        slots = [layer.mixer.new_slot(dtype) if hasattr(layer.mixer, "new_slot") else None for layer in self.layers]
        return KVCache(s.num_hidden_layers, s.num_key_value_heads, s.head_dim, dtype=dtype, layer_shapes=shapes,
                       slots=slots, keep_tokens=self.ngram is not None)

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
                layer_hook: LayerHook | None = None, last_only: bool = False,
                bidirectional: bool = False, normed: list | None = None,
                cancelled: Callable[[], bool] | None = None,
                on_layer: Callable[[int, int], None] | None = None) -> np.ndarray:
        """Run the decoder on new tokens.

        Args:
            ids: int [T] token ids that follow what ``cache`` holds.
            cache: the KV cache (None: a fresh one, discarded after the call).
            hidden_states: if a list is given, it receives float32 [T, hidden_size] arrays:
                the embedding output, then the residual stream after each layer
                (Transformers' ``output_hidden_states`` order, without the final norm; under
                AltUp, the stream's first copy); a looped model's: after each executed layer,
                every pass's (without the norms that close passes); with hyper-connections
                (``ModelSpec.streams``) the streams' mean.
            layer_hook: called as ``h = layer_hook(i, h)`` after layer ``i`` (steering); what
                it returns is taken as float32 [T, hidden_size]. With hyper-connections it is given
                the streams' mean, and what it adds to it is added to every stream.
            last_only: compute logits for the last position only.
            bidirectional: a prompt of a prefix-LM model (``ModelSpec.prefix_lm``) read whole from position
                zero (``cache`` empty): its tokens attend both ways within it (a generated prompt, as
                Transformers' HRM-Text does with token_type_ids of ones); ignored otherwise.
            normed: if a list is given, it receives the final norm's output, float32 [T, hidden_size]
                (or [1, hidden_size] with ``last_only``): the head's input, which a drafter reading
                the model's state takes (``ster_py.speculative``).
            cancelled: polled before each layer; True raises ``Cancelled`` (a long prompt's prefill
                stops within one layer's time: a layer over thousands of positions takes about a
                second on two cores). The arithmetic is the same as without it. The cache's committed
                length is unchanged then (the staged rows are dropped), but a slot that keeps its own
                state (``KVCache.slot``) may hold part of the call: ``PromptCache.prefill`` starts
                such a cache afresh.
            on_layer: called as ``on_layer(done, total)`` after each layer runs: layers run so far
                and in all (a looped model's passes count each layer they run), a long prompt's
                prefill progress (``PromptCache.prefill``).

        Returns:
            float32 logits [T, vocab_size] (or [1, vocab_size] with ``last_only``).

        Raises:
            SterError: no ids, ids that are not whole numbers (``as_token_ids``), a token id outside
                the vocabulary, or (learned positions) a position past the model's table; a callback
                that is not callable (``check_callbacks``); a ``layer_hook`` declaring a layer or width
                the model does not have (``check_layer_hook``).
            Cancelled: ``cancelled()`` returned True.
        """
        s = self.spec
        check_callbacks("Decoder.forward", layer_hook=layer_hook, cancelled=cancelled, on_layer=on_layer)
        check_layer_hook("Decoder.forward", layer_hook, s)
        cache = cache if cache is not None else self.new_cache()
        ids = as_token_ids(ids)
        positions = np.arange(cache.length, cache.length + ids.shape[0])
        h = self._embed(ids, positions)
        if self.ngram is not None:  # the n-grams read the tokens before these (kept by the cache)
            h = self.ngram(ids, cache.tokens()[-(self.ngram.spec.neighbors - 1):], h)
            cache.store_tokens(ids)
        bias = (None if s.alibi_slopes is None
                else alibi_sqrt_bias(s.alibi_slopes, positions, int(positions[-1]) + 1) if s.alibi_sqrt
                else alibi_bias(s.alibi_slopes, int(positions[-1]) + 1, scale=s.alibi_scale, bf16=s.alibi_bf16))
        if hidden_states is not None:
            hidden_states.append(h)
        # RoPE cos/sin per Rope object, computed once per call; "embeddings": the stream before the first
        # layer (a shared block reads it beside the residual stream, Zamba2)
        tables: dict = {"embeddings": h, "tokens": ids}
        if self.per_layer is not None:
            tables["per_layer"] = self.per_layer(ids, h)
        if bidirectional and s.prefix_lm and cache.length == 0:  # every query sees the whole prompt
            tables[MASK_POSITIONS] = np.full(ids.shape[0], ids.shape[0] - 1)
        if self.altup is not None:  # the stream's extra copies travel beside h, the first copy
            from .altup import collapse, expand

            h, *tables["altup"] = expand(h, self.altup[0])
        # the fused step stores keys itself: only into this class's cache, not a subclass's
        fuse = (self.fuse_decode and ids.shape[0] == 1 and bias is None and type(cache) is KVCache
                and MASK_POSITIONS not in tables
                and cache.length + 1 <= np.iinfo(np.int32).max)
        kept: list = [None] * len(s.residual_skips)
        if s.streams is not None:  # every stream starts as the embedding (decoder/streams.py)
            h = np.ascontiguousarray(np.repeat(h[:, None, :], s.streams.n, axis=1))

        runs = {"done": 0, "total": len(self.layers) if s.loop is None
                else sum(len(self.layers[p.start:p.stop]) for p in s.loop.passes)}

        def run(layers, h):
            for layer in layers:
                if cancelled is not None and cancelled():
                    raise Cancelled()
                if s.residual_skips:
                    h = self._skip(layer.i, h, kept)
                fused = layer.decode_step() if fuse else None
                if fused is not None:
                    h = layer.step_one(fused, h, cache, positions, tables)
                else:
                    h = layer(h, cache, positions, bias, tables)
                if on_layer is not None:
                    runs["done"] += 1
                    on_layer(runs["done"], runs["total"])
                if s.streams is not None:
                    if layer_hook is not None:  # the hook sees the streams' mean; what it adds, every stream gets
                        mean = h.mean(axis=1)
                        h = h + (np.asarray(layer_hook(layer.i, mean.copy()), np.float32) - mean)[:, None, :]
                    if hidden_states is not None:
                        hidden_states.append(h.mean(axis=1))
                    continue
                if layer_hook is not None:  # the stream stays float32 [T, hidden] whatever the hook returns
                    h = np.ascontiguousarray(layer_hook(layer.i, h), dtype=np.float32)
                if hidden_states is not None:
                    hidden_states.append(h)
            return h

        if s.loop is None:
            h = run(self.layers, h)
        else:  # passes over the stored layers (decoder/loops.py): each reads the states summed, replaces one
            states = [h] + [np.broadcast_to(self.loop_init, h.shape) for _ in range(s.loop.states - 1)]
            for p in s.loop.passes:
                x = states[0] if len(states) == 1 else np.ascontiguousarray(sum(states[1:], states[0]),
                                                                            dtype=np.float32)
                x = run(self.layers[p.start:p.stop], x)
                states[p.state] = self.final_norm(x) if p.norm else x
            h = states[0]
        cache.advance(ids.shape[0])
        if self.hc_head is not None:
            h = self.hc_head(h)
        if self.altup is not None:
            h = collapse([c[-1:] if last_only else c for c in [h] + tables["altup"]], self.altup[1])
        elif last_only:
            h = h[-1:]
        h = self.final_norm(h)
        if normed is not None:
            normed.append(h)
        logits = self.head(h)
        if s.logit_scale != 1.0:
            logits = logits * np.float32(s.logit_scale)
        if s.final_softcap:
            logits = np.tanh(logits / np.float32(s.final_softcap)) * np.float32(s.final_softcap)
        if s.logits_kept and s.logits_kept < logits.shape[-1]:  # a head padded past the vocabulary it scores
            logits = np.ascontiguousarray(logits[:, :s.logits_kept])
        return logits


def stored_head_differs(head, embed) -> bool:
    """Whether a checkpoint whose config says tie_word_embeddings stores a head (a plain array) that is not the
    embedding's copy: Transformers 5 then runs that head untied, and so do the decoder and ``ster convert``
    (which writes it as output.weight). Quantized or absent heads never differ."""
    return (isinstance(head, np.ndarray) and isinstance(embed, np.ndarray)
            and (head.shape != embed.shape or not np.array_equal(head, embed)))
