"""The weight naming layer: tensor roles -> arrays, with each family's storage quirks undone at load.

The decoder asks for a role of a layer (``q`` of layer 3, ``weight``); this layer finds
it under ``spec.names`` and returns it in the decoder's orientation, so the forward pass
never knows how a family stores its weights:

- a fused ``qkv`` tensor is split into q, k and v. ``concat`` stores all query rows, then
  key rows, then value rows (Phi-3's qkv_proj, GPT-2's c_attn, MPT's Wqkv, every llama.cpp
  attn_qkv); ``gate_concat`` the output gate's rows (``g``) before them (HRM-Text's gqkv_proj); ``grouped`` stores, per key/value head, its queries then its key then its value
  (GPT-NeoX and BLOOM's query_key_value head by head, Falcon's groupings, GPT-BigCode);
- a fused ``kv`` tensor (keys and values only) stores, per key/value head, its key rows then its
  value rows (TeleChat's self_attention.key_value);
- a fused ``gate_up`` tensor is split into gate (first half of the rows) and up (Phi-3, GLM); so is
  a fused ``shexp_gate_up`` of the shared experts (GraniteMoE-Shared's ``shared_mlp.input_linear``);
- ``inputs_first`` weights (GPT-2's Conv1D, [in, out]) are transposed once to [out, in];
- a name holding ``{h}`` is one tensor per head, stacked (StableLM's per-head q/k LayerNorms);
- a name holding ``{k}`` is read with the slot the caller gives (``get(..., slot=k)``: the k-th
  layer's adapter of a block shared between layers, Zamba2);
- a checkpoint saved from the base model, without the family's ``root`` prefix, is read too;
- a role listed under several names is read under the first one the file holds (Falcon GGUF); a
  name ending in ``#`` is stored without a ``.weight`` suffix (llama.cpp's Falcon-H1 ``ffn_norm``);
- routed experts (``experts``) are stored one module per expert (a name holding ``{e}``; a
  checkpoint saved from Transformers 5's modules may hold them stacked instead, read too),
  stacked in one tensor [num_experts, ...] (Transformers 5's ``experts.gate_up_proj``,
  GraniteMoE's ``input_linear``, llama.cpp's ``ffn_gate_exps``), or stacked by rows
  [num_experts * rows, cols] (DBRX); per expert [in, out] where the family stores them so
  (gpt-oss, Llama 4: ``expert_inputs_first``), a fused gate/up split in halves or, when
  ``expert_gate_up_interleaved``, row by row (gpt-oss).

Expert roles (``exp_*``), the router's selection bias and the attention sinks name whole
tensors (their tables give the full name, ``.weight`` included where the file has it);
every other role names a module, to which ``.weight`` / ``.bias`` is appended.

Every array is checked against the shape the configuration implies.
"""
from __future__ import annotations

import numpy as np

from ..errors import SterError

LINEAR_ROLES = ("q", "k", "v", "o", "gate", "up", "down", "qkv", "gate_up", "kv")
FUSED_INTO = {"q": "qkv", "k": "qkv", "v": "qkv", "g": "qkv", "gate": "gate_up", "up": "gate_up",
              "shexp_gate": "shexp_gate_up", "shexp_up": "shexp_gate_up"}
#: Roles of the routed experts' weights and biases (whole tensor names).
EXPERT_ROLES = ("exp_gate", "exp_up", "exp_down", "exp_gate_up")


#: Depthwise convolution weights stored [channels, 1, taps] (PyTorch's Conv1d) or [channels, taps].
CONV_ROLES = ("k_conv", "v_conv", "attn_out_conv", "ffn_out_conv")
#: State-space and delta-rule roles stored in more than one shape of the same size (a convolution as
#: [C, 1, K] or [C, K]; llama.cpp's [H, 1] vectors and [groups, d_inner / groups] norm; Kimi's A_log as
#: [1, 1, H, 1]).
RESHAPED_ROLES = ("ssm_conv", "ssm_a_log", "ssm_a", "ssm_d", "ssm_dt_bias", "ssm_norm",
                  "lin_conv", "lin_a_log", "lin_ssm_a", "lin_exp_a", "lin_dt_bias")


def expected_shapes(spec, i: int | None = None) -> dict[tuple[str, str], tuple[int, ...]]:
    """(role, 'weight'|'bias'|'') -> the shape the configuration implies (for layer ``i``'s own
    attention shape, ``ModelSpec.attention_shape``, when given)."""
    d, f = spec.hidden_size, spec.intermediate_size
    if i is not None and spec.layers[i].intermediate_size is not None:  # a layer's own width (DeciLM)
        f = spec.layers[i].intermediate_size
    h, kv, hd, vd = (spec.attention_shape(i) if i is not None
                     else (spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim, spec.head_dim))
    q, k, v = h * hd, kv * hd, kv * vd
    g = h if spec.attn_gate_per_head else h * vd
    shapes = {("q", "weight"): (q, d), ("k", "weight"): (k, d), ("v", "weight"): (v, d), ("o", "weight"): (d, h * vd),
              ("q", "bias"): (q,), ("k", "bias"): (k,), ("v", "bias"): (v,), ("o", "bias"): (d,),
              ("qkv", "weight"): (q + k + v, d), ("qkv", "bias"): (q + k + v,), ("g", "weight"): (g, d),
              ("kv", "weight"): (k + v, d), ("kv", "bias"): (k + v,),
              ("gate", "weight"): (f, d), ("up", "weight"): (f, d), ("down", "weight"): (d, f),
              ("gate", "bias"): (f,), ("up", "bias"): (f,), ("down", "bias"): (d,),
              ("gate_up", "weight"): (2 * f, d), ("gate_up", "bias"): (2 * f,),
              ("head", "weight"): (spec.vocab_size, d), ("head", "bias"): (spec.vocab_size,),
              ("embed", "weight"): (spec.vocab_size, d), ("sinks", ""): (h,)}
    for role in ("final_norm", "embed_norm", "attn_norm", "attn_post_norm", "ffn_norm", "ffn_post_norm"):
        shapes[(role, "weight")] = shapes[(role, "bias")] = (d,)
    if spec.moe is not None:
        m = spec.moe
        e, s = m.router.num_experts, m.shared_size
        shapes.update({("router", "weight"): (e + m.router.sink, d), ("router", "bias"): (e + m.router.sink,), ("router_select_bias", ""): (e,),
                       ("shexp_gate", "weight"): (s, d), ("shexp_up", "weight"): (s, d),
                       ("shexp_down", "weight"): (d, s), ("shexp_gate_inp", "weight"): (1, d),
                       ("shexp_gate_up", "weight"): (2 * s, d), ("shexp_gate_up", "bias"): (2 * s,)})
        if m.latent_size:
            shapes.update({("moe_latent_in", "weight"): (m.latent_size, d), ("moe_latent_in", "bias"): (m.latent_size,),
                           ("moe_latent_out", "weight"): (d, m.latent_size), ("moe_latent_out", "bias"): (d,)})
    if spec.value_router is not None:  # value experts (decoder/mova.py)
        n = spec.value_router.num_experts
        shapes.update({("v_router", "weight"): (n, d), ("v_router_select_bias", ""): (n,), ("v_exp", "weight"): (v, d)})
    if spec.ssm is not None:
        shapes.update(spec.ssm.tensor_shapes(d))
    if spec.delta is not None:
        shapes.update(spec.delta.tensor_shapes(d))
    g = getattr(spec, "ngram", None)
    if g is not None:  # the n-gram projections (their tables' heights differ: decoder/ngram.py checks them)
        shapes[("ngram_proj", "weight")] = (d, g.width)
    qb = getattr(spec, "query_bottleneck", 0)
    if qb:  # q narrows to the bottleneck, q_inter_norm norms it, q_up widens it to the heads (Step3)
        shapes.update({("q", "weight"): (qb, d), ("q", "bias"): (qb,), ("q_up", "weight"): (q, qb),
                       ("q_inter_norm", "weight"): (qb,), ("q_inter_norm", "bias"): (qb,)})
    if spec.attn_gate_in_q:  # each head's query rows, then its output gate's (Qwen3-Next's q_proj)
        shapes[("q", "weight")], shapes[("q", "bias")] = (2 * q, d), (2 * q,)
    if getattr(spec, "layer_scalar", False):
        shapes[("layer_scalar", "")] = (1,)
    p = getattr(spec, "per_layer_input", 0)
    if p:  # Gemma 4's per-layer inputs (decoder/model.py, PerLayerInputs)
        n = spec.num_hidden_layers
        shapes.update({("per_layer_embed", "weight"): (spec.per_layer_vocab, n * p),
                       ("per_layer_model_proj", "weight"): (n * p, d), ("per_layer_proj_norm", "weight"): (p,),
                       ("per_layer_gate", "weight"): (p, d), ("per_layer_proj", "weight"): (d, p),
                       ("per_layer_post_norm", "weight"): (d,)})
    if getattr(spec, "shared_block", None) is not None:  # Zamba2's shared transformer blocks
        shapes.update(spec.shared_block.tensor_shapes(spec))
    m = spec.latent_of(i) if i is not None and spec.latent is not None else spec.latent
    if m is not None:  # multi-head latent attention (decoder/latent.py), the layer's own where it has one
        r, qr, nope, rope, lv = m.kv_lora_rank, m.q_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
        shapes.update({("kv_a", "weight"): (r + rope, d), ("kv_a", "bias"): (r + rope,), ("kv_a_norm", "weight"): (r,),
                       ("kv_b", "weight"): (h * (nope + lv), r), ("k_b", "weight"): (h, r, nope),
                       ("v_b", "weight"): (h, lv, r), ("k_rope_norm", "weight"): (rope,)})
        if qr is not None:
            shapes.update({("q_a", "weight"): (qr, d), ("q_a", "bias"): (qr,), ("q_a_norm", "weight"): (qr,),
                           ("q_b", "weight"): (q, qr)})
    if spec.indexer is not None:  # DeepSeek Sparse Attention's indexer (decoder/indexer.py)
        x = spec.indexer
        qr = (spec.latent_of(i) if i is not None else spec.latent).q_lora_rank or 0
        shapes.update({("idx_q_b", "weight"): (x.n_heads * x.head_dim, qr), ("idx_k", "weight"): (x.head_dim, d),
                       ("idx_k_norm", "weight"): (x.head_dim,), ("idx_k_norm", "bias"): (x.head_dim,),
                       ("idx_w", "weight"): (x.n_heads, d), ("idx_pool_gate", ""): (x.head_dim, d),
                       ("idx_pool_ape", ""): (x.kpool, x.head_dim)})
    if getattr(spec, "compressed", None) is not None and i is not None:  # DeepSeek-V4 (decoder/compressed.py)
        shapes.update(spec.compressed.tensor_shapes(d, h, spec.layers[i].compress))
    if getattr(spec, "streams", None) is not None:  # hyper-connections (decoder/streams.py)
        shapes.update(spec.streams.tensor_shapes(d))
    if getattr(spec, "loop", None) is not None:  # a gated loop's per-head gate on the rotated query
        shapes[("loop_gate", "weight")], shapes[("loop_gate", "bias")] = (h, hd), (h,)
        shapes[("loop_init", "weight")] = (d,)  # the vector the later streams start from
    if spec.fused_qkv == "gate_concat":  # the output gate's rows, then q, k and v (HRM-Text's gqkv_proj)
        rows = (h if spec.attn_gate_per_head else h * vd) + q + k + v
        shapes[("qkv", "weight")], shapes[("qkv", "bias")] = (rows, d), (rows,)
    if spec.qk_norm == "proj":
        shapes[("q_norm", "weight")], shapes[("k_norm", "weight")] = (q,), (k,)
    bs = getattr(spec, "block_sparse", None)
    if bs is not None:  # MiniMax Sparse Attention's index branch (decoder/block_sparse.py): one query per group
        shapes.update({("index_q", "weight"): (kv * bs.index_dim, d), ("index_k", "weight"): (bs.index_dim, d),
                       ("index_q_norm", "weight"): (bs.index_dim,), ("index_k_norm", "weight"): (bs.index_dim,)})
    rel = getattr(spec, "relative", None)
    if rel is not None:  # Inkling's relative bias and short convolutions (decoder/relative.py)
        window = spec.layers[i].sliding_window if i is not None else None
        K = rel.conv_kernel
        shapes.update({("rel_r", "weight"): (h * rel.d_rel, d), ("rel_profiles", ""): (rel.d_rel, window or rel.rel_extent),
                       ("k_conv", "weight"): (k, 1, K), ("v_conv", "weight"): (v, 1, K),
                       ("attn_out_conv", "weight"): (d, 1, K), ("ffn_out_conv", "weight"): (d, 1, K)})
    if "ffn_scale" in spec.names:  # a stored factor on the dense feed-forward's output (Inkling's mlp.global_scale)
        shapes[("ffn_scale", "")] = (1,)
    if "router_scale" in spec.names:  # a stored factor on the router's weights (Inkling's mlp.gate.global_scale)
        shapes[("router_scale", "")] = (1,)
    return shapes


def _qk_norm_ok(spec, i: int | None, role: str, shape: tuple[int, ...]) -> bool:
    """Per-head q/k norms hold one row [head_dim] or one per head [heads, head_dim]."""
    h, kv, d, _ = spec.attention_shape(i) if i is not None else (spec.num_attention_heads,
                                                                 spec.num_key_value_heads, spec.head_dim, 0)
    return shape in ((d,), (h if role == "q_norm" else kv, d))


class Layout:
    """Role -> array for one model.

    Args:
        spec: the ``ModelSpec`` (names, dimensions, ``fused_qkv``, ``inputs_first``, ``root``).
        weights: a source of named arrays, ``get(name) -> array | None``.
    """

    def __init__(self, spec, weights):
        self.spec, self.weights = spec, weights
        self.expected = expected_shapes(spec)
        self._layer_expected: dict[int, dict] = {}
        # a looped model's passes read the same stored tensors: one array each, shared by its passes
        self._seen: dict | None = {} if getattr(spec, "loop", None) is not None else None

    def _expected(self, i: int | None) -> dict:
        """The shapes of layer ``i`` (its own attention shape), or the model-wide ones."""
        if i is None:
            return self.expected
        if i not in self._layer_expected:
            self._layer_expected[i] = expected_shapes(self.spec, i)
        return self._layer_expected[i]

    def _fetch(self, name: str) -> np.ndarray | None:
        if self._seen is not None and name in self._seen:  # a stored layer read again by a later pass
            return self._seen[name]
        t = self._fetch_stored(name)
        if self._seen is not None:
            self._seen[name] = t
        return t

    def _fetch_stored(self, name: str) -> np.ndarray | None:
        t = self.weights.get(name)
        root = self.spec.root
        if t is None and root and name.startswith(root):
            t = self.weights.get(name[len(root):])
        return t

    def _fill(self, name: str, i: int | None, **kw) -> str:
        """``name`` with layer ``i``'s place: ``{i}`` the stored layer and ``{half}`` the place in it
        (``ModelSpec.layers_per_stored``), or, for an executed layer of a looped model, the stored layer
        it reads (``LayerSpec.stored``) and ``{stack}`` its stack; other fields as ``kw`` gives them."""
        n = self.spec.layers_per_stored
        if i is not None and self.spec.loop is not None:
            layer = self.spec.layers[i]
            i = i if layer.stored is None else layer.stored
            kw.setdefault("stack", layer.stack or "")
        if i is None or n == 1:
            return name.format(i=i, half=0, **kw)
        return name.format(i=i // n, half=i % n, **kw)

    def _names(self, role: str, i: int | None, kind: str, slot: int | None = None) -> list[str]:
        """The names a role may be stored under, first found wins (a table entry may list several).
        ``kind`` "" means the table gives the whole name; ``slot`` fills a name's ``{k}``."""
        entry = self.spec.names[role]
        suffix = f".{kind}" if kind else ""
        k = "{k}" if slot is None else slot
        out = []
        for n in (entry,) if isinstance(entry, str) else entry:
            if n.endswith("#"):  # stored without a suffix: it is the weight (llama.cpp's Falcon-H1 ffn_norm)
                if kind == "weight":
                    out.append(self._fill(n[:-1], i, h="{h}", e="{e}", k=k))
                continue
            out.append(f"{self._fill(n, i, h='{h}', e='{e}', k=k)}{suffix}")
        return out

    def _name(self, role: str, i: int | None, kind: str, slot: int | None = None) -> str:
        names = self._names(role, i, kind, slot)
        return names[0] if names else f"{role} {kind} of layer {i}"

    def _read(self, role: str, i: int | None, kind: str, slot: int | None = None) -> np.ndarray | None:
        """The stored tensor of a role the names table lists, in the decoder's orientation."""
        for name in self._names(role, i, kind, slot):
            t = self._read_name(role, i, kind, name)
            if t is not None:
                return t
        return None

    def _read_name(self, role: str, i: int | None, kind: str, name: str) -> np.ndarray | None:
        if "{h}" in name:
            h, kv, _, _ = self.spec.attention_shape(i)
            heads = h if role == "q_norm" else kv
            parts = [self._fetch(name.format(h=h)) for h in range(heads)]
            t = None if any(p is None for p in parts) else np.stack(parts)
        else:
            t = self._fetch(name)
        if t is not None and self.spec.inputs_first and role in LINEAR_ROLES and kind == "weight":
            t = np.ascontiguousarray(t.T)
        if t is not None:
            self._check(role, i, kind, name, t)
        return t

    def _check(self, role: str, i: int | None, kind: str, name: str, t: np.ndarray) -> None:
        want = self._expected(i).get((role, kind))
        ok = (_qk_norm_ok(self.spec, i, role, tuple(t.shape)) if role in ("q_norm", "k_norm") and want is None
              else want is None or tuple(t.shape) == want
              or (role == "shexp_gate_inp" and tuple(t.shape) == want[1:])  # a vector in GGUF files
              or (role == "router_select_bias" and tuple(t.shape) == (1, *want))  # ERNIE 4.5 keeps [1, E]
              or (role in CONV_ROLES and len(want) == 3 and tuple(t.shape) == (want[0], want[2]))  # [C, K] as [C, 1, K]
              or (role in ("ffn_scale", "router_scale") and tuple(t.shape) == ())  # a scalar as [1]
              or (role in RESHAPED_ROLES and kind != "bias"
                  and int(np.prod(t.shape)) == int(np.prod(want))))
        if not ok:
            d = self.spec.attention_shape(i)[2] if i is not None else self.spec.head_dim
            shown = list(want) if want is not None else f"[{d}] or [heads, {d}]"
            raise SterError(f"tensor {name!r} has shape {list(t.shape)}, but the configuration "
                            f"implies {shown}; the weights and the config disagree")

    def _split(self, fused, fused_role: str, role: str, i: int | None):
        """Rows of ``role`` in a fused tensor (a weight [rows, in] or a bias [rows])."""
        if fused_role == "gate_up" and self.spec.gate_up_interleaved:  # gate and up rows alternate
            return np.ascontiguousarray(fused[0::2] if role.endswith("gate") else fused[1::2])
        if fused_role in ("gate_up", "shexp_gate_up"):
            half = fused.shape[0] // 2
            return fused[:half] if role.endswith("gate") else fused[half:]
        s = self.spec
        h, kv, d, vd = s.attention_shape(i)
        if fused_role == "kv":  # per key/value head: its key rows, then its value rows (TeleChat)
            pairs = fused.reshape(kv, 2, d, *fused.shape[1:])
            return np.ascontiguousarray(pairs[:, 0 if role == "k" else 1].reshape(-1, *fused.shape[1:]))
        if s.fused_qkv == "grouped":  # (values as wide as keys: the families that group have no other)
            g = h // kv
            groups = fused.reshape(kv, g + 2, d, *fused.shape[1:])
            part = {"q": groups[:, :g], "k": groups[:, g], "v": groups[:, g + 1]}[role]
            return np.ascontiguousarray(part.reshape(-1, *fused.shape[1:]))
        g = 0
        if s.fused_qkv == "gate_concat":  # the output gate's rows come first
            g = h if s.attn_gate_per_head else h * vd
            if role == "g":
                return fused[:g]
        if role not in ("q", "k", "v"):
            raise SterError(f"the family of {s.model_type!r} stores no {role!r} rows in its fused attention tensor")
        bounds = {"q": (0, h * d), "k": (h * d, (h + kv) * d), "v": ((h + kv) * d, (h + kv) * d + kv * vd)}[role]
        return fused[g + bounds[0]:g + bounds[1]]

    def _missing(self, name: str, role: str = "") -> str:
        """The message for a required tensor ``name`` the checkpoint lacks, naming what to check: a GGUF's
        own metadata, or the configuration file (config.json, or params.json in the Mistral format)."""
        why = " (tie_word_embeddings is false: the head is not the embedding)" if role == "head" else ""
        if self.spec.extra.get("gguf_architecture"):
            hint = "the GGUF file's metadata and tensors disagree: it is damaged or incomplete"
        else:
            hint = "is the configuration (config.json or params.json) from the same checkpoint?"
        return f"the checkpoint has no tensor {name!r}, which a {self.spec.model_type} model needs{why}; {hint}"

    def get(self, role: str, i: int | None, kind: str, required: bool = False, slot: int | None = None):
        """The array of ``role`` (layer ``i``, or None for model-wide roles) and ``kind``; ``slot``
        fills ``{k}`` in the role's name.

        Returns None when the checkpoint does not hold it and ``required`` is false.

        Raises:
            SterError: a required tensor is missing (named), or a shape disagrees with the config.
        """
        names = self.spec.names
        t = self._read(role, i, kind, slot) if role in names else None
        where = self._name(role, i, kind, slot) if role in names else None
        fused_role = FUSED_INTO.get(role)
        if role in ("k", "v") and "kv" in names and "qkv" not in names:
            fused_role = "kv"
        if t is None and fused_role in names and (role != "g" or self.spec.fused_qkv == "gate_concat"):
            # stored inside a fused tensor (an output gate's rows only where the layout says so)
            where = where or self._name(fused_role, i, kind)
            key = ("split", role, where)
            if self._seen is not None and key in self._seen:  # one array per split for a looped model's passes
                t = self._seen[key]
            else:
                fused = self._read(fused_role, i, kind)
                t = None if fused is None else self._split(fused, fused_role, role, i)
                if self._seen is not None:
                    self._seen[key] = t
        if t is None and required:
            raise SterError(self._missing(where or role, role))
        return t

    def experts(self, i: int) -> list[list[tuple]]:
        """Layer ``i``'s routed experts: per expert, [(gate weight, bias), (up ...), (down ...)],
        each weight [out, in] (an array, or a ``QuantTensor`` row range of a quantized stack; the
        gate None for experts without one), each bias [out] or None. Experts of a model that
        routes in a latent width (``MoESpec.latent_size``) map that width, not hidden_size.

        Raises:
            SterError: an expert tensor is missing or its shape disagrees with the config.
        """
        m = self.spec.layers[i].moe or self.spec.moe  # a layer's own expert width where it has one
        d = m.latent_size or self.spec.hidden_size  # experts working in a latent width read and write it
        n, f = m.router.num_experts - m.identity_experts, m.expert_size
        names = self.spec.names
        stacked = self._transformers5_stack(i)
        if stacked is not None:
            names = {k: v for k, v in names.items() if k not in ("exp_gate", "exp_up")} | stacked
        fused = "exp_gate_up" in names and "exp_gate" not in names
        plain = not fused and "exp_gate" not in names  # experts without a gate (Nemotron-H's)
        want = {"exp_gate": (f, d), "exp_up": (f, d), "exp_down": (d, f), "exp_gate_up": (2 * f, d)}
        per_role = {}
        if plain:
            per_role["exp_gate"] = ([None] * n, None)
        for role in (("exp_gate_up",) if fused else ("exp_up",) if plain else ("exp_gate", "exp_up")) + ("exp_down",):
            per_role[role] = (self._expert_stack(role, i, n, want[role], "weight", required=True, names=names),
                              self._expert_stack(role, i, n, want[role][:1], "bias", names=names))
        if fused:
            w, b = per_role.pop("exp_gate_up")
            for k, role in enumerate(("exp_gate", "exp_up")):
                per_role[role] = ([self._half(x, k) for x in w], None if b is None else [self._half(x, k) for x in b])
        return [[(per_role[r][0][e], None if per_role[r][1] is None else per_role[r][1][e])
                 for r in ("exp_gate", "exp_up", "exp_down")] for e in range(n)]

    def sink_experts(self, i: int, n: int) -> list:
        """Layer ``i``'s ``n`` shared experts that its router weighs (``RouterSpec.sink``), stacked like the
        routed ones under ``sink_gate_up`` [n, 2 * width, hidden] (gate and up as the experts' are) and
        ``sink_down`` [n, hidden, width]: per expert [(gate, None), (up, None), (down, None)]."""
        m = self.spec.moe
        d, f = m.latent_size or self.spec.hidden_size, m.expert_size
        names = {"exp_gate_up": self.spec.names["sink_gate_up"], "exp_down": self.spec.names["sink_down"]}
        gate_up = self._expert_stack("exp_gate_up", i, n, (2 * f, d), "weight", required=True, names=names)
        down = self._expert_stack("exp_down", i, n, (d, f), "weight", required=True, names=names)
        return [[(self._half(gu, 0), None), (self._half(gu, 1), None), (dn, None)] for gu, dn in zip(gate_up, down)]

    def _transformers5_stack(self, i: int) -> dict | None:
        """For a family that names one module per expert (``...experts.{e}.gate_proj.weight``): the names
        of Transformers 5's stacked tensors beside them (``...experts.gate_up_proj`` [experts, 2 * width,
        hidden], gate rows first, and ``...experts.down_proj``) when layer ``i`` stores its experts so
        (a checkpoint saved from Transformers 5's own modules), else None."""
        gate = self.spec.names.get("exp_gate")
        if not isinstance(gate, str) or "experts.{e}." not in gate or "bias" in gate:
            return None
        if self._fetch(self._fill(gate, i, e=0)) is not None:
            return None
        stem = gate.split("experts.{e}.")[0] + "experts."
        if self._fetch(self._fill(f"{stem}gate_up_proj", i)) is None:
            return None
        return {"exp_gate_up": stem + "gate_up_proj", "exp_down": stem + "down_proj"}

    def _half(self, t, k: int):
        """Gate (k = 0) or up (k = 1) rows of one expert's fused [2 * size, ...] tensor."""
        if self.spec.expert_gate_up_interleaved:
            return np.ascontiguousarray(t[k::2])
        half = t.shape[0] // 2
        return t[:half] if k == 0 else t[half:]

    def _expert_stack(self, role: str, i: int, n: int, shape: tuple, kind: str, required: bool = False,
                      names=None):
        """The ``n`` experts' tensors of ``role`` (weights in [out, in]), a list, or None when absent
        (``names``: the role table, the spec's unless given)."""
        entry = (self.spec.names if names is None else names).get(role if kind == "weight" else f"{role}_bias")
        if entry is None:
            if required:
                raise SterError(f"the family of {self.spec.model_type!r} names no tensor for its experts' {role}")
            return None
        name = self._fill(entry, i, e="{e}")
        first = self.spec.expert_inputs_first and role in self.spec.expert_inputs_first and kind == "weight"
        stored = shape[::-1] if first else shape
        if "{e}" in name:
            parts = [self._fetch(name.format(e=e)) for e in range(n)]
            missing = [name.format(e=e) for e, t in zip(range(n), parts) if t is None]
            if missing:
                if required or len(missing) < n:
                    raise SterError(self._missing(missing[0]))
                return None
            for e, t in enumerate(parts):
                self._check_expert(name.format(e=e), t, stored)
        else:
            t = self._fetch(name)
            if t is None:
                if required:
                    raise SterError(self._missing(name))
                return None
            if len(t.shape) == len(stored) and t.shape[0] == n * stored[0]:  # stacked by rows (DBRX)
                t = t.reshape(n, *stored) if isinstance(t, np.ndarray) else t
            extra = self.spec.moe.identity_experts if self.spec.moe is not None else 0
            if extra and tuple(t.shape) == (n + extra, *stored):  # rows for the identity experts, never read
                t = t[:n]  # (Transformers' LongCat-Flash allocates gate_up_proj for every expert)
            self._check_expert(name, t, (n, *stored))
            parts = [t[e] for e in range(n)]
        if first:
            parts = [np.ascontiguousarray(np.asarray(p).T) for p in parts]
        return parts

    def _check_expert(self, name: str, t, want: tuple) -> None:
        if tuple(t.shape) != tuple(want):
            raise SterError(f"tensor {name!r} has shape {list(t.shape)}, but the configuration implies "
                            f"{list(want)}; the weights and the config disagree")
