"""GGUF metadata -> the same ``ModelSpec`` a config.json gives.

Keys are llama.cpp's (``{arch}.block_count``, ``{arch}.embedding_length``,
``{arch}.attention.head_count``, ``{arch}.rope.freq_base`` ...; gguf-py's
``constants.Keys``). Where llama.cpp fixes a hyper-parameter in code rather than
in the file, the same constant is used here and named (``LLAMA_CPP_FIXED``), so
the file alone is enough, as it is for llama.cpp.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping

import numpy as np

from ..config import LayerSpec, ModelSpec, _Reader, family_fields, moe_spec, sliding_layers
from ..decoder.ssm import ATTENTION_MIXERS, SSMSpec
from ..decoder.rope import brief_value, make_rope
from ..errors import SterError
from ..families import FAMILIES_BY_GGUF_ARCH, FamilySpec

# Hyper-parameters llama.cpp sets in src/llama-model.cpp instead of reading them from the file.
LLAMA_CPP_FIXED = {
    # Gemma 3: sliding layers rotate with base 10000 (rope_freq_base_train_swa). Which layers
    # slide (set_swa_pattern) is the family's rule, the same as Transformers' default.
    "gemma3.swa_rope_base": 10000.0,
    # SmolLM3: every fourth layer has no rotation (n_no_rope_layer_step = 4).
    "smollm3.no_rope_step": 4,
    # The 27B Gemma 2 / Gemma 3 scale scores by (hidden_size / heads) ** -0.5, identified by depth.
    "gemma2.27b_block_count": 46,
    "gemma3.27b_block_count": 62,
}

GGUF_ROPE_SCALING = {"none": "default", "linear": "linear", "yarn": "yarn"}

# Mixture-of-experts metadata (after ``{arch}.``) -> the config.json key it stands for.
GGUF_MOE_KEYS = {
    "expert_count": "num_experts", "expert_used_count": "num_experts_per_tok",
    "expert_feed_forward_length": "moe_intermediate_size",
    "expert_shared_feed_forward_length": "shared_intermediate_size", "expert_shared_count": "n_shared_experts",
    "expert_weights_scale": "routed_scaling_factor", "expert_weights_norm": "norm_topk_prob",
    "expert_group_count": "n_group", "expert_group_used_count": "topk_group", "moe_latent_size": "moe_latent_size",
}
# llama.cpp's expert_gating_func values (llama-hparams.h): 1 softmax, 2 sigmoid, 3 softmax over the
# chosen logits (which equals softmax over all, renormalised over the chosen).
GGUF_GATING = {1: "softmax", 2: "sigmoid", 3: "softmax"}
# Routing choices llama.cpp's graph for an architecture makes in code rather than from the file
# (src/models/<arch>.cpp: build_moe_ffn's norm_w argument and gating function).
LLAMA_CPP_MOE: dict[str, dict] = {
    "llama": {"norm_topk_prob": True},
    "qwen2moe": {"norm_topk_prob": False},
    "qwen3moe": {"norm_topk_prob": True},
    "olmoe": {"norm_topk_prob": False},
    "jamba": {"norm_topk_prob": False},           # jamba.cpp: softmax, norm_w false
    "granitehybrid": {"norm_topk_prob": True},    # granite-hybrid.cpp: softmax, norm_w true
    "nemotron_h_moe": {"scoring_func": "sigmoid"},  # nemotron-h.cpp: sigmoid gating, norm_w from the file
}
# How llama.cpp's graph gives each layer of an architecture its mixer (src/models/<arch>.cpp):
# "scan" every layer (mamba.cpp); "kv" a scan where head_count_kv[i] is 0, attention elsewhere
# (jamba.cpp, granite-hybrid.cpp); "nemotron" a scan where head_count_kv[i] and
# feed_forward_length[i] are 0, attention where only the latter is, else a feed-forward alone
# (nemotron-h.cpp); "hybrid" attention and a scan side by side on every layer (falcon-h1.cpp).
LLAMA_CPP_LAYERS = {"mamba": "scan", "mamba2": "scan", "jamba": "kv", "granitehybrid": "kv",
                    "nemotron_h": "nemotron", "nemotron_h_moe": "nemotron", "falcon-h1": "hybrid"}


def supported_architectures() -> list[str]:
    """GGUF ``general.architecture`` values ster runs."""
    return sorted(FAMILIES_BY_GGUF_ARCH)


def family_for_architecture(arch: object, path: str) -> FamilySpec:
    """The family of a GGUF architecture; SterError naming it and the supported list otherwise."""
    if not isinstance(arch, str) or arch not in FAMILIES_BY_GGUF_ARCH:
        raise SterError(f"{path}: GGUF architecture {arch!r} is not supported; ster runs GGUF files of "
                        f"architecture {', '.join(supported_architectures())}")
    return FAMILIES_BY_GGUF_ARCH[arch]


def _get(meta: Mapping, key: str, kind, path: str, default=None, positive: bool = False):
    value = meta.get(key, default)
    if value is None:
        raise SterError(f"{path}: GGUF metadata lacks {key}, which the model needs")
    if isinstance(value, (list, tuple, np.ndarray)):  # llama.cpp's per-layer form of some hyper-parameters
        raise SterError(f"{path}: GGUF metadata {key} is an array of {len(value)} values (one per layer); ster "
                        "reads one value for all layers, so this model is not supported")
    if kind is int:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise SterError(f"{path}: GGUF metadata {key} must be a positive integer, got {brief_value(value)}")
        return int(value)
    if kind is float:
        if (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating))
                or not math.isfinite(value) or (positive and value <= 0)):
            raise SterError(f"{path}: GGUF metadata {key} must be a finite number{' above 0' if positive else ''}, "
                            f"got {brief_value(value)}")
        return float(value)
    return value


def _layer_values(meta: Mapping, key: str, n_layers: int, path: str, default=None) -> list[int] | None:
    """``key``'s whole-number value for each layer: an array of ``n_layers`` (llama.cpp's per-layer
    form), or one value for every layer; None when absent and no default."""
    value = meta.get(key, default)
    if value is None:
        return None
    values = list(value) if isinstance(value, (list, tuple, np.ndarray)) else [value] * n_layers
    if len(values) != n_layers or any(isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer))
                                      or v < 0 for v in values):
        raise SterError(f"{path}: GGUF metadata {key} must be a whole number or one per layer ({n_layers}), "
                        f"got {brief_value(value)}")
    return [int(v) for v in values]


def _gguf_ssm(meta: Mapping, arch: str, family: FamilySpec, tensors: Mapping, n_layers: int, eps: float,
              path: str) -> SSMSpec:
    """The scan of a state-space architecture from its ``ssm.*`` metadata (llama.cpp's
    ``load_arch_hparams``): Mamba's step rank is ``time_step_rank``, Mamba-2's heads are; Mamba's
    step/B/C norms are scale-free under ``ssm.dt_b_c_rms`` and weighted when the file holds
    them (Jamba); Mamba-2's gated norm applies when the file holds ``ssm_norm``. llama.cpp clamps no
    step, and its norms use the model's RMS epsilon."""
    def size(key, default=None, limit=1 << 24):
        v = meta.get(f"{arch}.ssm.{key}", default)
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or not 0 < v <= limit:
            raise SterError(f"{path}: GGUF metadata {arch}.ssm.{key} must be an integer in 1..{limit}, "
                            f"got {brief_value(v)}")
        return int(v)

    k, di, n, r = size("conv_kernel", limit=1024), size("inner_size"), size("state_size"), size("time_step_rank")
    if family.recurrent == "mamba":
        norm = ("plain" if bool(meta.get(f"{arch}.ssm.dt_b_c_rms", False)) else
                "weighted" if any(f"blk.{i}.ssm_dt_norm.weight" in tensors for i in range(n_layers)) else None)
        return SSMSpec("mamba", di, n, k, dt_rank=r, bcdt_norm=norm, bcdt_eps=eps)
    groups = size("group_count", 1)
    if di % r or r % groups:
        raise SterError(f"{path}: {arch}.ssm.inner_size ({di}) must split into time_step_rank ({r}) heads and "
                        f"those into group_count ({groups}) groups")
    gated = any(f"blk.{i}.ssm_norm.weight" in tensors for i in range(n_layers))
    return SSMSpec("mamba2", di, n, k, num_heads=r, n_groups=groups, dt_min=-math.inf, dt_max=math.inf,
                   gated_norm=gated, norm_eps=eps)


def _gguf_config(meta: Mapping, arch: str, family: FamilySpec) -> dict:
    """The metadata a family reads, renamed to the config.json keys it stands for (``gguf_config``)."""
    out = {}
    for key, config_key in family.gguf_config.items():
        value = meta.get(f"{arch}.{key}")
        if value is not None:
            out[config_key] = value.item() if isinstance(value, np.generic) else value
    return out


def _sliding_flags(meta: Mapping, arch: str, family: FamilySpec, n_layers: int, path: str) -> list[bool]:
    """Which layers attend through the sliding window, as llama.cpp places them.

    A per-layer ``sliding_window_pattern`` array in the file wins (OLMo 3, EXAONE 4);
    otherwise the family's rule applies, which is the pattern llama.cpp fixes in code
    (``set_swa_pattern``: Gemma 2 every other layer, Gemma 3 five of six, Cohere 2 three of four).
    """
    window = meta.get(f"{arch}.attention.sliding_window")
    if not window:
        return [False] * n_layers
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if pattern is not None and not isinstance(pattern, (int, np.integer)):
        flags = [bool(x) for x in pattern]
        if len(flags) != n_layers:
            raise SterError(f"{path}: {arch}.attention.sliding_window_pattern has {len(flags)} entries for "
                            f"{n_layers} layers")
        return flags
    return sliding_layers({"sliding_window": int(window)}, family, n_layers, path)


def _gguf_moe(meta: Mapping, arch: str, family: FamilySpec, tensors: Mapping[str, tuple], n_layers: int,
              feed_forward_length: int, path: str):
    """(per-layer routed flags, ``MoESpec`` or None) of a GGUF file.

    A layer routes when the file holds its router (``blk.N.ffn_gate_inp``), which is how
    llama.cpp's loader tells; the counts come from the ``expert_*`` metadata, the shared
    experts' gate and the router's selection bias (``exp_probs_b``) from the tensors
    present, and what llama.cpp fixes per architecture from ``LLAMA_CPP_MOE``.
    """
    routed = [f"blk.{i}.ffn_gate_inp.weight" in tensors for i in range(n_layers)]
    if not any(routed):
        return routed, None
    config = {key: meta[f"{arch}.{k}"] for k, key in GGUF_MOE_KEYS.items() if meta.get(f"{arch}.{k}") is not None}
    config = {k: v.item() if isinstance(v, np.generic) else v for k, v in config.items()}
    config.setdefault("moe_intermediate_size", feed_forward_length)
    gating = meta.get(f"{arch}.expert_gating_func")
    if gating is not None:
        if int(gating) not in GGUF_GATING:
            raise SterError(f"{path}: {arch}.expert_gating_func {int(gating)} is not supported; ster reads "
                            f"{', '.join(f'{k} ({v})' for k, v in GGUF_GATING.items())}")
        config["scoring_func"] = GGUF_GATING[int(gating)]
        if int(gating) == 3:
            config["norm_topk_prob"] = True
    config.update(LLAMA_CPP_MOE.get(arch, {}))
    n_group = config.get("n_group") or 1
    select_bias = any(f"blk.{i}.exp_probs_b.bias" in tensors for i in range(n_layers))
    # llama.cpp adds exp_probs_b whenever the file has it and ranks groups by their best two.
    config["topk_method"] = "noaux_tc" if select_bias else ("group_limited_greedy" if n_group > 1 else "greedy")
    shexp = next((tensors[f"blk.{i}.ffn_up_shexp.weight"] for i in range(n_layers)
                  if f"blk.{i}.ffn_up_shexp.weight" in tensors), None)
    if shexp is not None and "shared_intermediate_size" not in config:
        config["shared_intermediate_size"] = int(shexp[0])
    elif shexp is None:
        config["shared_intermediate_size"] = 0
    gated = any(f"blk.{i}.ffn_gate_inp_shexp.weight" in tensors for i in range(n_layers))
    reader_family = replace(family, keys={}, fixed={}, moe_defaults={}, shared_gated=gated,
                            moe_fields={**family.moe_fields, "select_bias": select_bias, "group_rank": "top2"})
    return routed, moe_spec(_Reader(config, reader_family, path), reader_family, path)


def spec_from_gguf(meta: Mapping, path: str, *, rope_freqs: np.ndarray | None = None,
                   vocab_size: int | None = None, has_output: bool = True,
                   tensors: Mapping[str, tuple] | None = None) -> ModelSpec:
    """Build the ``ModelSpec`` of a GGUF file from its metadata.

    The family's flags come from the family table, switched by the metadata its
    ``gguf_config`` names (as config.json keys would switch them) and adjusted by its
    ``gguf_changes`` where llama.cpp reads the architecture differently.

    Args:
        meta: the file's metadata, key -> value.
        path: the file, for messages.
        rope_freqs: the optional ``rope_freqs`` tensor (Llama 3 scaling stored as per-pair
            divisors of the inverse frequencies), float32 [rotary_dim // 2].
        vocab_size: rows of token_embd (the vocabulary the weights have).
        has_output: the file holds an ``output`` tensor (else the head is tied).
        tensors: the file's tensor names -> shapes (numpy order); mixture-of-experts layers
            and options are read from which tensors are present (``_gguf_moe``).

    Raises:
        SterError: an unsupported architecture, or a missing or invalid hyper-parameter.
    """
    from ..validate import check_gguf_sizes  # (validate imports config; late import)

    check_gguf_sizes(meta, path)  # sizes are bounded before any per-layer table is built
    arch = meta.get("general.architecture")
    family = family_for_architecture(arch, path)
    config = _gguf_config(meta, arch, family)
    family = replace(family.for_config(config), **family.gguf_changes)
    for refusal in family.gguf_refusals:
        if refusal.when(config):
            raise SterError(f"{path}: {refusal.why} in a GGUF file of architecture {arch!r}")

    def g(key, kind, default=None, positive=False):
        return _get(meta, f"{arch}.{key}", kind, path, default, positive)

    hidden = g("embedding_length", int)
    n_layers = g("block_count", int)
    layering = LLAMA_CPP_LAYERS.get(arch)
    kv_list = ff_list = None
    if layering is None:
        heads = g("attention.head_count", int)
        kv_heads = g("attention.head_count_kv", int, heads)
    else:  # state-space architectures: per-layer head and width arrays say which layer is which
        heads = g("attention.head_count", int) if layering != "scan" else 1
        kv_list = _layer_values(meta, f"{arch}.attention.head_count_kv", n_layers, path, heads)
        ff_list = _layer_values(meta, f"{arch}.feed_forward_length", n_layers, path, 0)
        kv_heads = next((v for v in kv_list if v), 1)
    head_dim = g("attention.key_length", int, hidden // heads)
    if heads % kv_heads:
        raise SterError(f"{path}: attention.head_count ({heads}) is not a multiple of head_count_kv ({kv_heads})")
    # The rotated width sizes the frequency tables: bounded by the head before any is built.
    rotary_dim = g("rope.dimension_count", int, head_dim)
    if rotary_dim > head_dim or rotary_dim % 2:
        raise SterError(f"{path}: GGUF metadata {arch}.rope.dimension_count ({rotary_dim}) must be even and at most "
                        f"the head width {head_dim} ({arch}.attention.key_length, else embedding_length / "
                        "head_count)")
    max_pos = g("context_length", int, 2048)
    eps_key = "attention.layer_norm_rms_epsilon" if family.norm == "rms" else "attention.layer_norm_epsilon"
    if family.norm == "rms" and meta.get(f"{arch}.{eps_key}") is None:  # Nemotron-H states only the other
        eps_key = "attention.layer_norm_epsilon"
    eps = g(eps_key, float, 1e-6)

    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in GGUF_ROPE_SCALING:
        raise SterError(f"{path}: rope scaling {scaling!r} is not supported; supported: {', '.join(GGUF_ROPE_SCALING)}")
    params = {"rope_type": GGUF_ROPE_SCALING[scaling],
              "rope_theta": g("rope.freq_base", float, 10000.0, positive=True)}
    if scaling != "none":
        params["factor"] = g("rope.scaling.factor", float, positive=True)
        params["original_max_position_embeddings"] = g("rope.scaling.original_context_length", int, max_pos)

    def make(p):
        return make_rope(p, head_dim=head_dim, max_position_embeddings=max_pos,
                         partial_rotary_factor=rotary_dim / head_dim, interleaved=family.rope_interleaved,
                         where=path, partial_keys=f"{arch}.rope.dimension_count")

    full = make(params)
    if rope_freqs is not None:
        if rope_freqs.shape != full.inv_freq.shape:
            raise SterError(f"{path}: rope_freqs has shape {rope_freqs.shape}, expected {full.inv_freq.shape}")
        full = replace(full, inv_freq=full.inv_freq / rope_freqs.astype(np.float64))

    # A model whose every layer routes may state only the experts' width.
    if ff_list is not None:  # per layer (0: none); the layers with one share it
        widths = {v for v in ff_list if v}
        if len(widths) > 1:
            raise SterError(f"{path}: {arch}.feed_forward_length lists different widths per layer "
                            f"({brief_value(ff_list)}); ster runs feed-forwards of one width")
        dense_width = widths.pop() if widths else None
    else:
        dense_width = g("feed_forward_length", int) if meta.get(f"{arch}.feed_forward_length") is not None else None
    routed, moe = _gguf_moe(meta, arch, family, tensors or {}, n_layers, dense_width or 0, path)
    if dense_width is None and moe is None:
        dense_width = g("feed_forward_length", int) if layering is None else hidden  # (missing: refused by name)
    window = meta.get(f"{arch}.attention.sliding_window")
    sliding = _sliding_flags(meta, arch, family, n_layers, path)
    sliding_rope = full
    if meta.get(f"{arch}.rope.freq_base_swa") is not None:
        sliding_rope = make({"rope_type": "default", "rope_theta": g("rope.freq_base_swa", float, positive=True)})
    elif arch == "gemma3" and window:
        sliding_rope = make({"rope_type": "default", "rope_theta": LLAMA_CPP_FIXED["gemma3.swa_rope_base"]})
    layers = []
    for i in range(n_layers):
        rope = sliding_rope if sliding[i] else full
        if family.positions != "rope" or (family.rope_layers != "all" and window and not sliding[i]):
            rope = None
        if arch == "smollm3" and (i + 1) % LLAMA_CPP_FIXED["smollm3.no_rope_step"] == 0:
            rope = None
        mixer, ffn = "attention", "moe" if routed[i] else "dense"
        if layering is not None:
            mixer, ffn = _gguf_layer_kind(layering, family, kv_list[i], ff_list[i], routed[i])
        own = {}
        if mixer in ATTENTION_MIXERS and kv_list is not None and kv_list[i] != kv_heads:
            own["num_key_value_heads"] = kv_list[i]
        layers.append(LayerSpec(sliding_window=int(window) if sliding[i] else None,
                                rope=rope if mixer in ATTENTION_MIXERS else None, mixer=mixer, ffn=ffn, **own))
    if (layering is not None and family.gguf_qk_permuted and rotary_dim < head_dim
            and any(layer.rope is not None for layer in layers)):
        raise SterError(f"{path}: a GGUF file of architecture {arch!r} whose attention rotates {rotary_dim} of "
                        f"{head_dim} dimensions per head is not supported: llama.cpp rotates adjacent pairs of "
                        "the converter's permuted rows there, which is not the rotation the model was trained with")

    scale = None
    if block := LLAMA_CPP_FIXED.get(f"{arch}.27b_block_count"):
        if n_layers == block:
            scale = (hidden / heads) ** -0.5
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = vocab_size or (len(tokens) if tokens is not None else g("vocab_size", int))
    eos = meta.get("tokenizer.ggml.eos_token_id")
    bos = meta.get("tokenizer.ggml.bos_token_id")
    fields = family_fields(config, family, hidden=hidden, heads=heads, head_dim=head_dim, config_name=path,
                           attn_scale=scale)
    # llama.cpp's converter stores norms kept as offsets from one (Gemma, Nemotron) as 1 + w, so they apply as is.
    fields["norm_unit_offset"] = False
    return ModelSpec(
        model_type=family.model_type,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=dense_width or moe.expert_size,
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_pos,
        norm=family.norm,
        norm_eps=eps,
        hidden_act=family.default_act,
        attn_softcap=meta.get(f"{arch}.attn_logit_softcapping"),
        final_softcap=meta.get(f"{arch}.final_logit_softcapping"),
        tie_word_embeddings=not has_output,
        layers=tuple(layers),
        names=family.gguf_names,
        bos_token_id=int(bos) if bos is not None else None,
        eos_token_ids=(int(eos),) if eos is not None else (),
        extra={"gguf_architecture": arch},
        fused_qkv="concat",  # llama.cpp's converter reorders every fused qkv to [q | k | v]
        moe=moe,
        ssm=_gguf_ssm(meta, arch, family, tensors or {}, n_layers, eps, path) if family.recurrent else None,
        **fields,
    )


def _gguf_layer_kind(layering: str, family: FamilySpec, kv: int, ff: int, routed: bool) -> tuple[str, str]:
    """(mixer, feed-forward) of one layer of a state-space architecture (``LLAMA_CPP_LAYERS``)."""
    ffn = "moe" if routed else "dense"
    if layering == "scan":
        return family.recurrent, "none"
    if layering == "hybrid":
        return "hybrid", ffn
    if layering == "kv":
        return (family.recurrent if kv == 0 else "attention"), ffn
    if ff == 0:  # nemotron: a mixer alone
        return (family.recurrent if kv == 0 else "attention"), "none"
    return "none", ffn
