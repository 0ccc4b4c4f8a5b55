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

from ..config import LayerSpec, ModelSpec, _Reader, family_fields, moe_spec, sliding_layers, yarn_mscale
from ..decoder.latent import LatentSpec
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
    # MiniCPM3 (src/models/minicpm3.cpp): its muP scales are constants of the graph, not metadata:
    # embeddings times 12, each sublayer's output times 1.4 / sqrt(layers), logits times 256 / hidden.
    "minicpm3.scale_emb": 12.0,
    "minicpm3.scale_depth": 1.4,
    "minicpm3.dim_model_base": 256,
}

GGUF_ROPE_SCALING = {"none": "default", "linear": "linear", "yarn": "yarn"}

# Mixture-of-experts metadata (after ``{arch}.``) -> the config.json key it stands for.
GGUF_MOE_KEYS = {
    "expert_count": "num_experts", "expert_used_count": "num_experts_per_tok",
    "expert_feed_forward_length": "moe_intermediate_size",
    "expert_shared_feed_forward_length": "shared_intermediate_size", "expert_shared_count": "n_shared_experts",
    "expert_weights_scale": "routed_scaling_factor", "expert_weights_norm": "norm_topk_prob",
    "expert_group_count": "n_group", "expert_group_used_count": "topk_group",
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
}
# What llama.cpp's loader assumes when a file leaves expert_gating_func out (src/models/deepseek2.cpp:
# softmax, the DeepSeek-V2 files before the key; sigmoid for GLM-4.7-Flash, told by its 47 or 48 layers
# and 154880 tokens).
LLAMA_CPP_GATING_DEFAULT = {"deepseek2": "softmax"}
GLM_LITE_SHAPE = {"layers": (47, 48), "vocab": 154880}


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
    if gating is None and arch in LLAMA_CPP_GATING_DEFAULT:
        vocab = len(meta.get("tokenizer.ggml.tokens") or ()) or meta.get(f"{arch}.vocab_size")
        glm_lite = n_layers in GLM_LITE_SHAPE["layers"] and vocab == GLM_LITE_SHAPE["vocab"]
        config["scoring_func"] = "sigmoid" if glm_lite else LLAMA_CPP_GATING_DEFAULT[arch]
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


def _gguf_latent(meta: Mapping, arch: str, hidden: int, heads: int, eps: float, path: str) -> LatentSpec:
    """The latent attention of a ``deepseek2`` / ``minicpm3`` file, as llama.cpp's loader reads it.

    ``attention.kv_lora_rank``, the optional ``attention.q_lora_rank`` (absent: one ``attn_q``), the
    rotated width ``rope.dimension_count``; head widths from ``attention.key_length_mla`` /
    ``value_length_mla`` when the file stores kv_b split per head (``attn_k_b`` / ``attn_v_b``), else
    ``attention.key_length`` / ``value_length`` (each ``embedding_length / head_count`` when absent).
    The bottleneck norms take the model's epsilon, as llama.cpp's graph does.

    Raises:
        SterError: a missing or invalid width, a rotated width not below the query/key head's.
    """
    def g(key, default=None):
        return _get(meta, f"{arch}.{key}", int, path, default)

    rope = g("rope.dimension_count")
    if meta.get(f"{arch}.attention.key_length_mla") is not None or meta.get(f"{arch}.attention.value_length_mla"):
        qk, v = g("attention.key_length_mla"), g("attention.value_length_mla")
    else:
        qk, v = g("attention.key_length", hidden // heads), g("attention.value_length", hidden // heads)
    if rope % 2 or rope >= qk:
        raise SterError(f"{path}: GGUF metadata {arch}.rope.dimension_count ({rope}) must be even and below the "
                        f"query/key head width {qk}, whose rest is the position-free part")
    q_rank = meta.get(f"{arch}.attention.q_lora_rank")
    return LatentSpec(kv_lora_rank=g("attention.kv_lora_rank"), q_lora_rank=g("attention.q_lora_rank") if q_rank
                      else None, qk_nope_head_dim=qk - rope, qk_rope_head_dim=rope, v_head_dim=v, norm_eps=eps)


def _deepseek2_yarn(meta: Mapping, arch: str, params: dict, qk_head_dim: int, path: str) -> float:
    """llama.cpp's YaRN for ``deepseek2`` (src/llama-context.cpp, src/models/deepseek2.cpp): fills in the
    rotation's attention factor and returns the softmax scale.

    ``rope.scaling.yarn_log_multiplier`` is 0.1 * mscale_all_dim. With it, llama.cpp takes mscale equal to
    mscale_all_dim, so the tables keep their magnitude; without it they are scaled by YaRN's
    ``yarn_mscale(factor)``; either way times ``rope.scaling.attn_factor``. The scores are scaled by
    (that factor * (1 + 0.1 * mscale_all_dim * ln factor)) ** 2 / sqrt(qk_head_dim).
    """
    factor = params["factor"]
    log_mul = meta.get(f"{arch}.rope.scaling.yarn_log_multiplier")
    m_all = 0.0 if log_mul is None else _get(meta, f"{arch}.rope.scaling.yarn_log_multiplier", float, path) / 0.1
    attn = _get(meta, f"{arch}.rope.scaling.attn_factor", float, path, 1.0, positive=True)
    ratio = (1.0 if log_mul is not None else yarn_mscale(factor)) * attn
    params["attention_factor"] = ratio
    for key, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
        if meta.get(f"{arch}.rope.scaling.{key}") is not None:
            params[name] = _get(meta, f"{arch}.rope.scaling.{key}", float, path, positive=True)
    ext = meta.get(f"{arch}.rope.scaling.yarn_ext_factor")
    if ext is not None and _get(meta, f"{arch}.rope.scaling.yarn_ext_factor", float, path) != 1.0:
        raise SterError(f"{path}: a YaRN extrapolation factor other than 1 ({arch}.rope.scaling.yarn_ext_factor) "
                        "is not supported")
    return (ratio * (1.0 + 0.1 * m_all * math.log(factor))) ** 2 / math.sqrt(qk_head_dim)


def spec_from_gguf(meta: Mapping, path: str, *, rope_freqs: np.ndarray | None = None,
                   vocab_size: int | None = None, has_output: bool = True,
                   tensors: Mapping[str, tuple] | None = None,
                   rope_factors: tuple[np.ndarray, np.ndarray] | None = None) -> ModelSpec:
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
        rope_factors: the optional (``rope_factors_short``, ``rope_factors_long``) tensors, float32
            [rotary_dim // 2] each: LongRoPE's per-pair divisors (MiniCPM3), the long ones past
            ``rope.scaling.original_context_length`` (else ``context_length``) positions.

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
    heads = g("attention.head_count", int)
    eps_key = "attention.layer_norm_rms_epsilon" if family.norm == "rms" else "attention.layer_norm_epsilon"
    eps = g(eps_key, float, 1e-6)
    latent = _gguf_latent(meta, arch, hidden, heads, eps, path) if family.latent else None
    if latent is not None:  # expanded, one key/value head per head; only the rope part rotates
        kv_heads, head_dim, rotary_dim = heads, latent.qk_head_dim, latent.qk_rope_head_dim
        rope_width = rotary_dim
    else:
        kv_heads = g("attention.head_count_kv", int, heads)
        head_dim = g("attention.key_length", int, hidden // heads)
        if heads % kv_heads:
            raise SterError(f"{path}: attention.head_count ({heads}) is not a multiple of head_count_kv ({kv_heads})")
        # The rotated width sizes the frequency tables: bounded by the head before any is built.
        rotary_dim = g("rope.dimension_count", int, head_dim)
        if rotary_dim > head_dim or rotary_dim % 2:
            raise SterError(f"{path}: GGUF metadata {arch}.rope.dimension_count ({rotary_dim}) must be even and at "
                            f"most the head width {head_dim} ({arch}.attention.key_length, else embedding_length / "
                            "head_count)")
        rope_width = head_dim
    max_pos = g("context_length", int, 2048)

    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in GGUF_ROPE_SCALING:
        raise SterError(f"{path}: rope scaling {scaling!r} is not supported; supported: {', '.join(GGUF_ROPE_SCALING)}")
    if latent is not None and scaling not in ("none", "yarn"):
        raise SterError(f"{path}: rope scaling {scaling!r} on latent attention is not supported; supported: "
                        "none, yarn")
    params = {"rope_type": GGUF_ROPE_SCALING[scaling],
              "rope_theta": g("rope.freq_base", float, 10000.0, positive=True)}
    if scaling != "none":
        params["factor"] = g("rope.scaling.factor", float, positive=True)
        params["original_max_position_embeddings"] = g("rope.scaling.original_context_length", int, max_pos)
    scale = None
    if latent is not None:
        scale = (_deepseek2_yarn(meta, arch, params, head_dim, path) if scaling == "yarn" and arch == "deepseek2"
                 else head_dim ** -0.5)

    def make(p):
        return make_rope(p, head_dim=rope_width, max_position_embeddings=max_pos,
                         partial_rotary_factor=rotary_dim / rope_width, interleaved=family.rope_interleaved,
                         where=path, partial_keys=f"{arch}.rope.dimension_count")

    full = make(params)
    if rope_factors is not None:  # LongRoPE from the file (MiniCPM3): per-pair divisors, short and long
        short, long = (np.asarray(f, np.float64).reshape(-1) for f in rope_factors)
        if short.shape != full.inv_freq.shape or long.shape != full.inv_freq.shape:
            raise SterError(f"{path}: rope_factors_short / rope_factors_long hold {short.size} / {long.size} "
                            f"factors, expected one per rotary pair ({full.inv_freq.size})")
        if not (np.all(np.isfinite(short)) and np.all(np.isfinite(long)) and np.all(short > 0) and np.all(long > 0)):
            raise SterError(f"{path}: rope_factors_short / rope_factors_long must hold finite numbers above 0")
        full = replace(full, inv_freq=full.inv_freq / short, long_inv_freq=full.inv_freq / long,
                       long_from=g("rope.scaling.original_context_length", int, max_pos))
    if rope_freqs is not None:
        if rope_freqs.shape != full.inv_freq.shape:
            raise SterError(f"{path}: rope_freqs has shape {rope_freqs.shape}, expected {full.inv_freq.shape}")
        full = replace(full, inv_freq=full.inv_freq / rope_freqs.astype(np.float64))

    # A model whose every layer routes may state only the experts' width.
    dense_width = g("feed_forward_length", int) if meta.get(f"{arch}.feed_forward_length") is not None else None
    routed, moe = _gguf_moe(meta, arch, family, tensors or {}, n_layers, dense_width or 0, path)
    if dense_width is None and moe is None:
        dense_width = g("feed_forward_length", int)  # missing: refused naming the key
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
        layers.append(LayerSpec(sliding_window=int(window) if sliding[i] else None, rope=rope,
                                ffn="moe" if routed[i] else "dense",
                                mixer="latent" if latent is not None else "attention",
                                v_head_dim=latent.v_head_dim if latent and latent.v_head_dim != head_dim else None))

    if arch == "minicpm3":  # the scales llama.cpp's graph fixes, as the config keys the family reads
        config.update(scale_emb=LLAMA_CPP_FIXED["minicpm3.scale_emb"],
                      residual_multiplier=LLAMA_CPP_FIXED["minicpm3.scale_depth"] / math.sqrt(n_layers),
                      logits_scaling=hidden / LLAMA_CPP_FIXED["minicpm3.dim_model_base"])
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
        latent=latent,
        **fields,
    )
