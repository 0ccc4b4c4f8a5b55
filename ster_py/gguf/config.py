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
from typing import TYPE_CHECKING, Mapping

import numpy as np

from ..config import (MAX_HEADS, LayerSpec, ModelSpec, _Reader, family_fields, looped_from_gguf, looped_stack,
                      moe_spec, reused_kv_unread, sliding_layers, streams_spec, yarn_mscale)
from ..decoder.kinds import ATTENTION_MIXERS, DELTA_MIXERS
from ..decoder.rope import brief_value, make_rope
from ..errors import SterError
from ..families import FAMILIES_BY_GGUF_ARCH, FamilySpec

if TYPE_CHECKING:  # the parts' specs are imported where the metadata describes one
    from ..decoder.block_sparse import BlockSparseSpec
    from ..decoder.delta import DeltaSpec
    from ..decoder.indexer import IndexerSpec
    from ..decoder.latent import LatentSpec
    from ..decoder.ssm import SSMSpec

# Hyper-parameters llama.cpp sets in src/llama-model.cpp instead of reading them from the file.
LLAMA_CPP_FIXED = {
    # Gemma 3: sliding layers rotate with base 10000 (rope_freq_base_train_swa). Which layers
    # slide (set_swa_pattern) is the family's rule, the same as Transformers' default.
    "gemma3.swa_rope_base": 10000.0,
    # The 27B Gemma 2 / Gemma 3 scale scores by (hidden_size / heads) ** -0.5, identified by depth.
    "gemma2.27b_block_count": 46,
    "gemma3.27b_block_count": 62,
    # MiniCPM3 (src/models/minicpm3.cpp): its muP scales are constants of the graph, not metadata:
    # embeddings times 12, each sublayer's output times 1.4 / sqrt(layers), logits times 256 / hidden.
    "minicpm3.scale_emb": 12.0,
    "minicpm3.scale_depth": 1.4,
    "minicpm3.dim_model_base": 256,
}

# Architectures whose every n-th layer does not rotate: llama-hparams.h's n_no_rope_layer_step (4),
# which src/models/smollm3.cpp, llama4.cpp and afmoe.cpp test as (il + 1) % n != 0.
LLAMA_CPP_NO_ROPE_STEP = {"smollm3": 4, "llama4": 4, "afmoe": 4}
# Llama 4 (src/models/llama4.cpp, load_arch_hparams): chunked attention of 8192 positions on the layers
# of the window pattern (a per-layer sliding_window_pattern in the file, else all but every fourth:
# load_swa_pattern(4)); queries of the layers that do not rotate are multiplied by
# 1 + 0.1 * ln(1 + floor((p + 1) / 8192)) (f_attn_temp_scale, n_attn_temp_floor_scale, f_attn_temp_offset);
# the rotated layers' L2 q/k norms are off for the 128-expert model (use_kq_norm = type != 17B_128E).
LLAMA_CPP_CHUNKED = {"llama4": {"chunk": 8192, "period": 4, "temperature": (0.1, 8192, 1),
                                "no_qk_norm_experts": 128}}

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
    # openai-moe.cpp: a softmax over the chosen logits (SOFTMAX_WEIGHT), and SWIGLU_OAI_MOE's unit with
    # alpha 1.702 and limit 7.0 (llama-graph.cpp), whatever the checkpoint's swiglu_limit was; no
    # expert_weights_scale is read (the weights are never scaled)
    "gpt-oss": {"scoring_func": "softmax", "norm_topk_prob": True, "swiglu_limit": 7.0, "swiglu_alpha": 1.702,
                "routed_scaling_factor": 1.0},
    # llama4.cpp: sigmoid of the chosen logits, never renormalised nor scaled (the weights scale each
    # expert's input: build_moe_ffn's weight_before_ffn)
    "llama4": {"scoring_func": "sigmoid", "norm_topk_prob": False, "routed_scaling_factor": 1.0},
    # granite-moe.cpp (granite.cpp's graph), granite-swa.cpp, dbrx.cpp, phimoe.cpp (phi3.cpp's graph),
    # hunyuan-moe.cpp, ernie4-5-moe.cpp: softmax over all experts, the chosen renormalised, whatever the
    # file says (PhiMoE's SparseMixer and DBRX's moe_normalize_expert_weights are not read)
    **{arch: {"scoring_func": "softmax", "norm_topk_prob": True}
       for arch in ("granitemoe", "granite_swa", "dbrx", "phimoe", "ernie4_5-moe")},
    # ... and hunyuan-moe.cpp builds the experts feed_forward_length wide (None: expert_feed_forward_length
    # is not read)
    "hunyuan-moe": {"scoring_func": "softmax", "norm_topk_prob": True, "moe_intermediate_size": None},
    # group H4
    "mellum": {"norm_topk_prob": True, "scoring_func": "softmax"},  # mellum.cpp: softmax, norm_w true
    "minimax-m2": {"norm_topk_prob": True},  # minimax-m2.cpp: the file's gating function, norm_w true
    "mimo2": {"norm_topk_prob": True, "scoring_func": "sigmoid"},  # mimo2.cpp: sigmoid, norm_w true
    "jamba": {"norm_topk_prob": False},           # jamba.cpp: softmax, norm_w false
    "granitehybrid": {"norm_topk_prob": True},    # granite-hybrid.cpp: softmax, norm_w true
    "nemotron_h_moe": {"scoring_func": "sigmoid"},  # nemotron-h.cpp: sigmoid gating, norm_w from the file
    # group SSM-B2: qwen3next.cpp and qwen35moe.cpp: softmax, norm_w true (whatever norm_topk_prob was);
    # kimi-linear.cpp: the file's gating function, norm_w true
    "qwen3next": {"scoring_func": "softmax", "norm_topk_prob": True},
    "qwen35moe": {"scoring_func": "softmax", "norm_topk_prob": True},
    "kimi-linear": {"norm_topk_prob": True},
    # group WRAP: minimax-m3.cpp: the file's gating function and norm_w; SWIGLU_OAI_MOE's fixed alpha 1.702 and
    # limit 7.0 (llama-graph.cpp; the converter stores no swiglu_limit)
    "minimax-m3": {"swiglu_limit": 7.0, "swiglu_alpha": 1.702},
    # group SSM-B1
    "lfm2moe": {"norm_topk_prob": True},  # lfm2moe.cpp: the file's gating function, norm_w true
    "minimax-01": {"scoring_func": "softmax", "norm_topk_prob": True},  # minimax-01.cpp: softmax, norm_w true
    # deepseek.cpp: softmax over all experts, the chosen never renormalised (norm_w false)
    "deepseek": {"scoring_func": "softmax", "norm_topk_prob": False},
    # bailingmoe.cpp (Ling 1.x): softmax over all experts, renormalised as expert_weights_norm says
    "bailingmoe": {"scoring_func": "softmax"},
}
# build_moe_ffn (llama-graph.cpp) divides renormalised weights by their sum clamped to at least this
# (the smallest normal F16), adding no epsilon.
LLAMA_CPP_RENORM_MIN = 6.103515625e-5
# What llama.cpp assumes when the file leaves expert_gating_func out (glm4-moe.cpp, hy-v3.cpp, afmoe.cpp,
# cohere2moe.cpp, laguna.cpp, step35.cpp: sigmoid); exaone-moe.cpp, bailingmoe2.cpp and bailingmoe3.cpp
# require the key (None).
LLAMA_CPP_GATING_DEFAULT = {"glm4moe": "sigmoid", "hy_v3": "sigmoid", "afmoe": "sigmoid", "cohere2moe": "sigmoid",
                            "deepseek2": "softmax", "glm-dsa": "sigmoid", "deepseek32": None,
                            "laguna": "sigmoid", "step35": "sigmoid", "hy_v4": None,
                            "exaone-moe": None, "bailingmoe2": None, "bailingmoe3": None,
                            "glm5-next": "sigmoid",  # (group GDS) glm5-next.cpp: NONE read as sigmoid
                            "dots3note": None}  # (group DOTS) dots3note.cpp requires the key

# How llama.cpp's graph rotates the sliding-window layers of an architecture, where that is not
# "rope.freq_base_swa, unscaled, over the full layers' width" (src/models/<arch>.cpp):
#   base: the sliding layers' base when the file states no rope.freq_base_swa: a number (the
#         default of hparams.rope_freq_base_train_swa) or "freq_base" (the full layers' base, unscaled);
#   swa_base_read: False when the graph rotates sliding layers by that base whatever the file says
#         (mellum.cpp passes freq_base to both kinds of layer);
#   swa_dims: the sliding layers rotate rope.dimension_count_swa dimensions (default: the full
#         layers' rope.dimension_count, before any halving);
#   full_dims_half: the full layers rotate half of rope.dimension_count (step35.cpp halves n_rot_full).
LLAMA_CPP_SWA_ROPE: dict[str, dict] = {
    "mellum": {"base": "freq_base", "swa_base_read": False},
    "laguna": {"base": "freq_base", "swa_dims": True},
    "mimo2": {"base": 10000.0},
    "step35": {"base": 10000.0, "swa_dims": True, "full_dims_half": True},
    # gemma4.cpp: the sliding layers have their own head width (attention.key_length_swa /
    # value_length_swa, llama-hparams' n_embd_head_k_swa) and rotate rope.dimension_count_swa of it at
    # rope.freq_base_swa (default 10000); rope_freqs applies to the full layers only
    "gemma4": {"base": 10000.0, "swa_dims": True, "swa_width": True},
}
# Architectures whose last layers reuse earlier layers' keys and values (llama-model.cpp's kv-cache
# "reuse" for Gemma 3n / Gemma 4): the metadata key counting them, n. Layer il >= first = block_count - n
# attends over the cache of layer first - 2 if it slides, else of layer first - 1 (first must be >= 2).
LLAMA_CPP_KV_SHARED = {"gemma4": "attention.shared_kv_layers",
                       # gemma3n.cpp fixes the first reusing layer at 20 (Gemma 3n E2B's and E4B's
                       # block_count - shared_kv_layers); ster reads the key the converter writes
                       "gemma3n": "attention.shared_kv_layers"}
# The epsilon llama.cpp's graph fixes for the norms over each sublayer's output (muse-glimmer.cpp's
# post_norm_eps; the converter writes no key for it).
LLAMA_CPP_POST_NORM_EPS = {"muse-glimmer": 1e-8}
# Architectures whose layers with keys but no attn_v take each value from its key projection
# (gemma4.cpp: "if v_proj is not present, use Kcur as Vcur").
LLAMA_CPP_V_FROM_K = ("gemma4",)
# Architectures with per-layer inputs (gemma4.cpp): the width key; the table's rows are its vocabulary.
LLAMA_CPP_PER_LAYER_INPUT = {"gemma4": "embedding_length_per_layer_input",
                             "gemma3n": "embedding_length_per_layer_input"}
# deepseek2.cpp's loader takes a file without expert_gating_func for softmax (the DeepSeek-V2 files
# before the key), except GLM-4.7-Flash, which it tells by its 47 or 48 layers and 154880 tokens.
GLM_LITE_SHAPE = {"layers": (47, 48), "vocab": 154880}
# group MLA-B. DeepSeek Sparse Attention's indexer as llama.cpp's graph runs it (src/models/<arch>.cpp):
#   interleaved: the index query and key rotate adjacent pairs (LLAMA_ROPE_TYPE_NORM), else halves (NEOX),
#         over the first rope.dimension_count components;
#   norm_eps: the key's LayerNorm epsilon (hparams.f_norm_eps: deepseek32.cpp sets 1e-6; glm-dsa.cpp sets
#         none, so it is the zero of the value-initialised hparams);
#   types: which layers index is read from attention.indexer.types (True: full), else every layer does;
#         without the key, glm-dsa.cpp takes every layer of a file whose context_length is below
#         1048576 (GLM-5, 5.1) as full, and GLM-5.2's pattern otherwise (two full, then one in four).
#   (group GHC) hy-v4.cpp: pairs, the model's epsilon ("model": f_norm_eps = f_norm_rms_eps), the last
#         rope.dimension_count components rotating (rope_last: ggml_rope_set_offset past the position-free
#         ones); without attention.indexer.types its loader stops (layer 0 must own an indexer): "required".
LLAMA_CPP_INDEXER = {"deepseek32": {"interleaved": False, "norm_eps": 1e-6, "types": False},
                     "glm-dsa": {"interleaved": True, "norm_eps": 0.0, "types": True},
                     "hy_v4": {"interleaved": True, "norm_eps": "model", "types": "required", "rope_last": True},
                     # (group GDS) glm5-next.cpp: nothing rotates; the key's LayerNorm (with its bias) takes
                     # attention.layer_norm_epsilon (f_norm_eps, 0 when absent); every layer full unless
                     # attention.indexer.types says otherwise ("all"); pools of attention.indexer.kpool
                     # keys, the unfinished one kept under kpool_select_tail (true when absent)
                     "glm5-next": {"interleaved": True, "norm_eps": "layer_norm_epsilon", "types": "all",
                                   "kpool": True},
                     # (group DOTS) dots3note.cpp: halves (LLAMA_ROPE_TYPE_NEOX; Transformers' Dots3-Note indexer
                     # rotates adjacent pairs, the converter permutes nothing), the key's LayerNorm at 1e-6,
                     # attention.indexer.types required, its false layers (the sliding ones) without an indexer
                     # ("unflagged": None; the graph indexes exactly the layers outside sliding_window_pattern)
                     "dots3note": {"interleaved": False, "norm_eps": 1e-6, "types": "required", "unflagged": None}}
# (group DOTS) Latent architectures whose sliding-window layers attend through a latent of their own (dots3note.cpp):
# attention.kv_lora_rank_swa, key_length_mla_swa (their nope + rope width, scored at its inverse square root) and
# value_length_mla_swa; the query rank and the rotated width are the full layers'.
LLAMA_CPP_SWA_LATENT = ("dots3note",)
# Architectures whose routed SwiGLU clamp is ggml_swiglu_clamp (src/llama-graph.cpp's build_moe_ffn): the gate
# at most the limit before silu, up within [-limit, limit] (MoESpec.clamp_act False), not the common clamp.
LLAMA_CPP_CLAMP_GATE = ("hy_v4", "deepseek4", "glm5-next")
# (group GDS) Architectures whose dense feed-forwards are clamped too: build_ffn clamps every gated feed-forward of
# layer i by swiglu_clamp_shexp[i] (ggml_swiglu_clamp for these), the leading dense layers' as well
# (ModelSpec.ffn_limit).
LLAMA_CPP_DENSE_CLAMP = ("glm5-next",)
# (group GDS) Latent architectures whose graph rotates no part of the query/key (rope.dimension_count 0).
LLAMA_CPP_UNROTATED_LATENT = ("glm5-next",)
# (group GDS) The L2 norm's epsilon of the KDA query and key where the graph fixes it (glm5-next.cpp: 1e-6, "Match
# FLA l2 norm"); elsewhere the model's.
LLAMA_CPP_KDA_L2_EPS = {"glm5-next": 1e-6}
GLM_5_2 = {"context": 1048576, "lead": 2, "period": 4}
# Latent architectures whose loader reads rope.scaling.yarn_log_multiplier (TAG_DEEPSEEK2_YARN_LOG_MUL_FIX);
# glm-dsa.cpp's does not (its kq_scale then has no mscale_all_dim term).
LLAMA_CPP_YARN_LOG_MUL = ("deepseek2", "deepseek32")
# How llama.cpp's graph gives each layer of an architecture its mixer (src/models/<arch>.cpp):
# "scan" every layer (mamba.cpp); "kv" a scan where head_count_kv[i] is 0, attention elsewhere
# (jamba.cpp, granite-hybrid.cpp); "nemotron" a scan where head_count_kv[i] and
# feed_forward_length[i] are 0, attention where only the latter is, else a feed-forward alone
# (nemotron-h.cpp); "hybrid" attention and a scan side by side on every layer (falcon-h1.cpp).
# The delta-rule architectures: "recurrent" where attention.recurrent_layers[i] holds (else every layer
# but each full_attention_interval-th, 4 when absent: qwen3next.cpp, qwen35.cpp, qwen35moe.cpp); Kimi-Linear's
# KDA where head_count_kv[i] is 0 ("kv", kimi-linear.cpp).
LLAMA_CPP_LAYERS = {"mamba": "scan", "mamba2": "scan", "jamba": "kv", "granitehybrid": "kv",
                    "nemotron_h": "nemotron", "nemotron_h_moe": "nemotron", "falcon-h1": "hybrid",
                    # group SSM-B1: lfm2.cpp / lfm2moe.cpp convolve where head_count_kv[i] is 0; minimax-01.cpp
                    # runs lightning attention on the layers attention.recurrent_layers flags, else on all but
                    # every full_attention_interval-th (8 when the file states neither)
                    "lfm2": "kv", "lfm2moe": "kv", "minimax-01": "recurrent",
                    # group SSM-B2
                    "qwen3next": "recurrent", "qwen35": "recurrent", "qwen35moe": "recurrent", "kimi-linear": "kv",
                    # group GBL: bailingmoe3.cpp (Ling 3.0) runs KDA where head_count_kv[i] is 0
                    "bailingmoe3": "kv",
                    # group GDS: glm5-next.cpp runs KDA where head_count_kv[i] is 0, latent attention elsewhere
                    "glm5-next": "kv"}
# The interval when a "recurrent" file states neither flags nor interval: 8 in minimax-01.cpp (4 in
# qwen3next.cpp and qwen35.cpp).
LLAMA_CPP_FULL_ATTENTION_INTERVAL = {"minimax-01": 8}
# Architectures whose per-layer attention.head_count and feed_forward_length say which half each layer has
# (src/models/deci.cpp): head_count 0, no attention (nor its norm); feed_forward_length 0, no feed-forward
# (nor its norm); a layer with heads but head_count_kv 0 is DeciLM's linear replacement of attention.
LLAMA_CPP_HALVES = ("deci",)
# minimax-01.cpp joins each sublayer as output + residual_scale * its normed input (the converter
# requires every beta to be 1 and every alpha equal, and stores that alpha as residual_scale).
LLAMA_CPP_SCALED_JOIN = ("minimax-01",)
# Which key head a value head reads in llama.cpp's delta-rule graphs: qwen35.cpp / qwen35moe.cpp repeat the
# key heads tiled (ggml_repeat_4d, the fused op's h % H_k), as their converter reorders the value heads;
# qwen3next.cpp repeats each key head in place (the checkpoint's grouped order).
LLAMA_CPP_KV_MAP = {"qwen3next": "grouped", "qwen35": "tiled", "qwen35moe": "tiled", "kimi-linear": "grouped",
                    "bailingmoe3": "grouped", "glm5-next": "grouped"}

# group WRAP. MiniMax Sparse Attention as minimax-m3.cpp runs it: every layer from
# leading_dense_block_count on (the routed ones) selects blocks with its index branch (indexer.q_proj,
# k_proj, q_norm, k_norm; one index head per key/value group), the leading dense layers attend densely; the
# dense and routed feed-forwards use SWIGLU_OAI_MOE's fixed alpha 1.702 and limit 7.0 (llama-graph.cpp).
LLAMA_CPP_BLOCK_SPARSE = {"minimax-m3": {"swiglu_alpha": 1.702, "swiglu_limit": 7.0}}


def supported_architectures() -> list[str]:
    """GGUF ``general.architecture`` values ster runs."""
    return sorted(FAMILIES_BY_GGUF_ARCH)


def family_for_architecture(arch: object, path: str) -> FamilySpec:
    """The family of a GGUF architecture; SterError naming it and the supported list otherwise."""
    if not isinstance(arch, str) or arch not in FAMILIES_BY_GGUF_ARCH:
        raise SterError(f"{path}: GGUF architecture {arch!r} is not supported; ster runs GGUF files of "
                        f"architecture {', '.join(supported_architectures())}")
    return FAMILIES_BY_GGUF_ARCH[arch]


def _layer_counts(meta: Mapping, arch: str, key: str, default, n_all: int, n_layers: int, path: str) -> list[int]:
    """``{arch}.{key}`` for each of the first ``n_layers`` layers: one value for all, or llama.cpp's
    per-layer array of ``n_all`` entries (``get_key_or_arr``); ``default`` (a list) when absent."""
    value = meta.get(f"{arch}.{key}")
    if value is None and default is not None:
        return list(default)
    if not isinstance(value, (list, tuple, np.ndarray)):
        return [_get(meta, f"{arch}.{key}", int, path)] * n_layers
    if len(value) != n_all or not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
                                      and 0 < v <= MAX_HEADS for v in value):
        raise SterError(f"{path}: GGUF metadata {arch}.{key} must list a count in 1..{MAX_HEADS} for each of the "
                        f"{n_all} layers ({arch}.block_count), got {brief_value(value)}")
    return [int(v) for v in value[:n_layers]]


def _gate_kind(tensors: Mapping[str, tuple], name: str, heads: list[int], v_head_dim: int,
               path: str, skip: frozenset = frozenset()) -> bool | None:
    """The attention output gate as llama.cpp reads it from the file (``laguna.cpp``, ``step35.cpp``):
    None when no layer holds one, else whether it holds one value per head (else one per element),
    told by its width. Every layer but those in ``skip`` (a hybrid's recurrent layers) must hold the same kind.
    """
    kinds = set()
    for i, h in enumerate(heads):
        if i in skip:
            continue
        shape = tensors.get(name.format(i=i) + ".weight")
        if shape is None:
            kinds.add(None)
        elif shape[0] in (h, h * v_head_dim):
            kinds.add(shape[0] == h)
        else:
            raise SterError(f"{path}: {name.format(i=i)}.weight has {shape[0]} rows, neither one per head ({h}) "
                            f"nor one per value element ({h * v_head_dim})")
    if len(kinds) > 1:
        raise SterError(f"{path}: attention output gates on some layers only, or per head on some layers and "
                        "per element on others, are not supported")
    return kinds.pop()


# Expert metadata a file may give one value per layer (NVIDIA Puzzle's nemotron_h_moe: conversion/nemotron.py
# writes each block's top-k and expert width) -> the MoESpec field it sets.
LAYER_MOE_KEYS = {"expert_used_count": "top_k", "expert_feed_forward_length": "expert_size"}


def _layer_moe_shapes(meta: Mapping, arch: str, moe, routed: list[bool], n_layers: int, path: str) -> list:
    """Each layer's routed feed-forward where the file lists ``LAYER_MOE_KEYS`` per layer (llama.cpp's loaders
    read them with get_key_or_arr), else [] (every routed layer is ``moe``).

    Raises:
        SterError: a list of the wrong length, or a routed layer whose count or width is not positive.
    """
    if moe is None or not any(isinstance(meta.get(f"{arch}.{k}"), (list, tuple, np.ndarray)) for k in LAYER_MOE_KEYS):
        return []
    out = []
    for i, r in enumerate(routed):
        if not r:
            out.append(None)
            continue
        top_k, size = moe.router.top_k, moe.expert_size
        for key, field in LAYER_MOE_KEYS.items():
            if isinstance(meta.get(f"{arch}.{key}"), (list, tuple, np.ndarray)):
                v = _layer_values(meta, f"{arch}.{key}", n_layers, path)[i]
                limit = moe.router.num_experts if field == "top_k" else 1 << 24
                if not 0 < v <= limit:
                    raise SterError(f"{path}: GGUF metadata {arch}.{key} gives routed layer {i} {v}; it must be "
                                    f"in 1..{limit}")
                top_k, size = (v, size) if field == "top_k" else (top_k, v)
        out.append(replace(moe, router=replace(moe.router, top_k=top_k), expert_size=size))
    return out


def _layer_clamps(meta: Mapping, arch: str, moe, routed: list[bool], n_all: int, path: str) -> list:
    """Each layer's routed feed-forward with llama.cpp's per-layer SwiGLU clamps (``{arch}.swiglu_clamp_exp``
    on the routed experts, ``swiglu_clamp_shexp`` on the shared ones; 0: none), or [] without them. The
    clamp is llama.cpp's common one (build_moe_ffn / build_ffn in src/llama-graph.cpp): up within
    [-limit, limit], silu(gate) at most limit (``MoESpec.clamp_act``).

    Raises:
        SterError: a list of the wrong length, or a clamp on a dense layer (llama.cpp clamps every
            gated feed-forward of the layer by ``swiglu_clamp_shexp``).
    """
    lists = []
    for key in ("swiglu_clamp_exp", "swiglu_clamp_shexp"):
        v = meta.get(f"{arch}.{key}")
        if v is not None:
            v = list(v) if isinstance(v, (list, tuple, np.ndarray)) else [v] * n_all
            if len(v) != n_all or not all(isinstance(x, (int, float, np.integer, np.floating))
                                          and not isinstance(x, (bool, np.bool_)) and math.isfinite(x) and x >= 0
                                          for x in v):
                raise SterError(f"{path}: GGUF metadata {arch}.{key} must list a bound >= 0 (0: none) for each of "
                                f"the {n_all} layers, got {brief_value(v)}")
        lists.append(v)
    routed_limits, shared_limits = lists
    if routed_limits is None and shared_limits is None:
        return []
    for i, r in enumerate(routed):
        if not r and shared_limits is not None and shared_limits[i] > 1e-6 and arch not in LLAMA_CPP_DENSE_CLAMP:
            raise SterError(f"{path}: a SwiGLU clamp on a dense layer ({arch}.swiglu_clamp_shexp, layer {i}) "
                            "is not supported")
    if moe is None:
        return []

    def bound(values, i):
        return float(values[i]) if values is not None and values[i] > 1e-6 else None  # llama.cpp's eps

    return [replace(moe, limit=bound(routed_limits, i), shared_limit=bound(shared_limits, i),
                    clamp_act=arch not in LLAMA_CPP_CLAMP_GATE) if r else None for i, r in enumerate(routed)]


def _dense_clamp(meta: Mapping, arch: str, routed: list[bool], path: str) -> float | None:
    """The dense layers' SwiGLU clamp of an architecture in ``LLAMA_CPP_DENSE_CLAMP`` (``ModelSpec.ffn_limit``):
    ``swiglu_clamp_shexp[i]`` of each dense layer i (validated by ``_layer_clamps``; 1e-6 or less: none).

    Raises:
        SterError: dense layers with different clamps (ster runs one dense feed-forward unit).
    """
    values = meta.get(f"{arch}.swiglu_clamp_shexp")
    if values is None:
        return None
    values = list(values) if isinstance(values, (list, tuple, np.ndarray)) else [values] * len(routed)
    limits = {float(values[i]) if values[i] > 1e-6 else None for i, r in enumerate(routed) if not r}
    if len(limits) > 1:
        raise SterError(f"{path}: {arch}.swiglu_clamp_shexp gives the dense layers different clamps "
                        f"({brief_value(values)}); ster runs dense feed-forwards of one clamp")
    return limits.pop() if limits else None


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


def _gguf_halves(meta: Mapping, arch: str, tensors: Mapping[str, tuple], n_all: int, n_layers: int,
                 path: str) -> list[tuple[int, int, int]]:
    """Per layer, (query heads, key/value heads, feed-forward width) of a ``LLAMA_CPP_HALVES`` file, as
    llama.cpp's deci loader reads them: ``attention.head_count``, ``head_count_kv`` and
    ``feed_forward_length``, each one value or one per block, 0 where the layer lacks that half.

    Raises:
        SterError: a value that is not a whole number in range or a list of the wrong length; a layer
            with heads but no key/value heads (DeciLM's linear replacement of attention, not supported),
            key/value heads without heads, no attending layer at all, or a half the metadata leaves out
            whose weights the file holds (llama.cpp's converter writes 0 for a feed-forward sized by
            intermediate_size rather than ffn_mult; llama.cpp does not load such a file either).
    """
    def values(key: str, limit: int) -> list[int]:
        v = meta.get(f"{arch}.{key}")
        got = list(v) if isinstance(v, (list, tuple, np.ndarray)) else [v] * n_all
        if len(got) != n_all or any(isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer))
                                    or not 0 <= x <= limit for x in got):
            raise SterError(f"{path}: GGUF metadata {arch}.{key} must be a whole number in 0..{limit} or one per "
                            f"block ({n_all}; 0: the layer has no such half), got {brief_value(v)}")
        return [int(x) for x in got[:n_layers]]

    from ..config import MAX_DIM

    heads, kv, widths = (values("attention.head_count", MAX_HEADS), values("attention.head_count_kv", MAX_HEADS),
                         values("feed_forward_length", MAX_DIM))
    if not any(heads):
        raise SterError(f"{path}: no layer of this {arch} file has attention ({arch}.attention.head_count all 0); "
                        "ster does not run it")
    for i, (h, k, w) in enumerate(zip(heads, kv, widths)):
        if h and not k:
            raise SterError(f"{path}: layer {i} has {h} heads and no key/value heads ({arch}.attention.head_count_kv "
                            "0): DeciLM's linear replacement of attention (replace_with_linear) is not supported")
        if k and not h:
            raise SterError(f"{path}: layer {i} has {k} key/value heads but no query heads ({arch}.attention."
                            "head_count 0)")
        for absent, key, prefix, why in (
                (not h, "attention.head_count", "attn_", "the file does not match its metadata; re-convert the model"),
                (not w, "feed_forward_length", "ffn_",
                 "llama.cpp's converter writes 0 for a DeciLM feed-forward sized by intermediate_size rather than "
                 "ffn_mult, and llama.cpp cannot load the file either. Re-convert with the layer's width in "
                 "feed_forward_length, or load the checkpoint's directory")):
            held = sorted(n for n in tensors if n.startswith(f"blk.{i}.{prefix}"))
            if absent and held:
                raise SterError(f"{path}: layer {i}'s {arch}.{key} is 0 (no such half) but the file holds "
                                f"{held[0]}: {why}")
    return list(zip(heads, kv, widths))


def _gguf_ssm(meta: Mapping, arch: str, family: FamilySpec, tensors: Mapping, n_layers: int, eps: float,
              path: str) -> SSMSpec:
    """The scan of a state-space architecture from its ``ssm.*`` metadata (llama.cpp's
    ``load_arch_hparams``): Mamba's step rank is ``time_step_rank``, Mamba-2's heads are; Mamba's
    step/B/C norms are scale-free under ``ssm.dt_b_c_rms`` and weighted when the file holds
    them (Jamba); Mamba-2's gated norm applies when the file holds ``ssm_norm``. llama.cpp clamps no
    step, and its norms use the model's RMS epsilon. LFM2's short convolution: ``shortconv.l_cache``
    taps over embedding_length channels."""
    from ..decoder.ssm import SSMSpec

    def size(key, default=None, limit=1 << 24):
        v = meta.get(f"{arch}.ssm.{key}", default)
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or not 0 < v <= limit:
            raise SterError(f"{path}: GGUF metadata {arch}.ssm.{key} must be an integer in 1..{limit}, "
                            f"got {brief_value(v)}")
        return int(v)

    if family.recurrent == "shortconv":  # lfm2.cpp: hidden_size channels, shortconv.l_cache taps
        v = meta.get(f"{arch}.shortconv.l_cache")
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or not 1 < v <= 1024:
            raise SterError(f"{path}: GGUF metadata {arch}.shortconv.l_cache must be an integer in 2..1024, "
                            f"got {brief_value(v)}")
        return SSMSpec("shortconv", int(meta[f"{arch}.embedding_length"]), 0, int(v))
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


def _gguf_lightning(heads: int, head_dim: int, eps: float) -> SSMSpec:
    """MiniMax's lightning attention: its heads and head width are the attention's (minimax-01.cpp), its
    read-out norm takes the model's epsilon; no slope offset."""
    from ..decoder.ssm import SSMSpec

    return SSMSpec("lightning", heads * head_dim, head_dim, 1, num_heads=heads, norm_eps=eps, slope_eps=0.0)


def _gguf_delta(meta: Mapping, arch: str, family: FamilySpec, heads: int, eps: float, path: str) -> DeltaSpec:
    """The delta-rule layers of a ``qwen3next`` / ``qwen35`` / ``qwen35moe`` / ``kimi-linear`` file, as
    llama.cpp's loaders read them: the gated delta net's key heads are ``ssm.group_count``, their width
    ``ssm.state_size``, its value heads ``ssm.time_step_rank`` of ``ssm.inner_size`` in all; Kimi's heads
    are the attention's, ``kda.head_dim`` wide; the convolution ``ssm.conv_kernel`` taps. The L2 and
    output norms take the model's RMS epsilon (``build_gdn_l2_norm``, ``build_norm``)."""
    from ..decoder.delta import DeltaSpec

    def size(key, limit=1 << 24):
        v = meta.get(f"{arch}.{key}")
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or not 0 < v <= limit:
            raise SterError(f"{path}: GGUF metadata {arch}.{key} must be an integer in 1..{limit}, "
                            f"got {brief_value(v)}")
        return int(v)

    kernel = size("ssm.conv_kernel", 1024)
    if family.recurrent == "kda":
        d = size("kda.head_dim", MAX_HEADS * 64)
        # the safe gate (lower_bound * sigmoid(...)) where the file states its bound (bailingmoe3.cpp, which
        # takes kda.safe_gate as true when absent and requires a negative bound); Kimi's files state neither
        bound = meta.get(f"{arch}.kda.gate_lower_bound")
        safe = bound is not None and bool(meta.get(f"{arch}.kda.safe_gate", True))
        if safe and (isinstance(bound, (bool, np.bool_)) or not isinstance(bound, (float, int, np.floating, np.integer))
                     or not -1e4 < float(bound) < 0):
            raise SterError(f"{path}: GGUF metadata {arch}.kda.gate_lower_bound must be a negative number, "
                            f"got {brief_value(bound)}")
        return DeltaSpec("kda", heads, d, heads, d, kernel, kv_map=LLAMA_CPP_KV_MAP[arch], norm_eps=eps,
                         l2_eps=LLAMA_CPP_KDA_L2_EPS.get(arch, eps),
                         gate_act="sigmoid", safe_gate=safe, lower_bound=float(bound) if safe else -5.0)
    hk, dk, hv, inner = size("ssm.group_count"), size("ssm.state_size"), size("ssm.time_step_rank"), size("ssm.inner_size")
    if hv % hk or inner % hv:
        raise SterError(f"{path}: {arch}.ssm.time_step_rank ({hv} value heads) must be a multiple of "
                        f"ssm.group_count ({hk} key heads) and divide ssm.inner_size ({inner})")
    return DeltaSpec("gated_delta", hk, dk, hv, inner // hv, kernel, kv_map=LLAMA_CPP_KV_MAP[arch], norm_eps=eps,
                     l2_eps=eps)


# The config.json ``architectures`` an architecture stands for, where a family's variants tell its generations
# apart by it and no metadata key does: llama.cpp's bailingmoe3 is Ling 3.0 (Kimi Delta Attention), never the
# lightning-attention Ling 2.5 that shares its model_type.
ARCH_CLASSES = {"bailingmoe3": ["BailingMoeV3ForCausalLM"]}


def _gguf_config(meta: Mapping, arch: str, family: FamilySpec) -> dict:
    """The metadata a family reads, renamed to the config.json keys it stands for (``gguf_config``)."""
    out = {"architectures": list(ARCH_CLASSES[arch])} if arch in ARCH_CLASSES else {}
    for key, config_key in family.gguf_config.items():
        value = meta.get(f"{arch}.{key}")
        if value is not None:
            out[config_key] = value.item() if isinstance(value, np.generic) else value
    return out


def _sliding_flags(meta: Mapping, arch: str, family: FamilySpec, n_layers: int, path: str,
                   n_all: int | None = None) -> list[bool]:
    """Which layers attend through the sliding window, as llama.cpp places them.

    A per-layer ``sliding_window_pattern`` array in the file wins (OLMo 3, EXAONE 4); a single
    number is the rule's period (PLaMo 3; llama.cpp's ``load_swa_pattern``); otherwise the family's rule applies, which is the pattern llama.cpp fixes in code
    (``set_swa_pattern``: Gemma 2 every other layer, Gemma 3 five of six, Cohere 2 three of four).
    """
    window = meta.get(f"{arch}.attention.sliding_window")
    if not window:
        return [False] * n_layers
    flags = _pattern_array(meta, arch, n_layers, path)
    if flags is not None:
        return flags
    # one period for all layers (load_swa_pattern reads it over the architecture's default; PLaMo 3's converter
    # writes the checkpoint's sliding_window_pattern)
    period = meta.get(f"{arch}.attention.sliding_window_pattern")
    config = {"sliding_window": int(window)}
    if period is not None:
        if isinstance(period, (bool, np.bool_)) or not isinstance(period, (int, np.integer)) or not 0 < period <= 1 << 16:
            raise SterError(f"{path}: GGUF metadata {arch}.attention.sliding_window_pattern must be a positive whole "
                            f"number or one flag per layer, got {brief_value(period)}")
        config["_sliding_window_pattern"] = int(period)
    return sliding_layers(config, family, n_layers, path)


def _pattern_array(meta: Mapping, arch: str, n_layers: int, path: str) -> list[bool] | None:
    """The file's per-layer ``attention.sliding_window_pattern`` (True: the layer's attention is
    windowed or chunked), or None when it states none (or one period for all layers)."""
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if pattern is None or isinstance(pattern, (int, np.integer)):
        return None
    flags = [bool(x) for x in pattern]
    blocks = int(meta.get(f"{arch}.block_count", n_layers))
    if len(flags) not in (n_layers, blocks):  # the blocks run, or those and the prediction blocks
        raise SterError(f"{path}: {arch}.attention.sliding_window_pattern has {len(flags)} entries for "
                        f"{n_layers} layers")
    return flags[:n_layers]


def _rope_flags(meta: Mapping, arch: str, n_layers: int, path: str) -> list[bool]:
    """Which layers rotate: a per-layer ``attention.rope_pattern`` array (True: the layer rotates,
    Granite SWA's no_rope_layers) where the file has one, else every layer (the family's rule applies)."""
    pattern = meta.get(f"{arch}.attention.rope_pattern")
    if pattern is None:
        return [True] * n_layers
    if not isinstance(pattern, (int, np.integer, str)) and len(pattern) == meta.get(f"{arch}.block_count"):
        pattern = pattern[:n_layers]  # the NextN blocks' flags too
    if isinstance(pattern, (int, np.integer, str)) or len(pattern) != n_layers:
        raise SterError(f"{path}: {arch}.attention.rope_pattern must hold one flag per layer ({n_layers}), got "
                        f"{brief_value(pattern)}")
    return [bool(x) for x in pattern]


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
    first = routed.index(True)
    for k in LAYER_MOE_KEYS:  # one value per layer (NVIDIA Puzzle's nemotron_h_moe): the first routed layer's here
        if isinstance(config.get(GGUF_MOE_KEYS[k]), (list, tuple, np.ndarray)):
            config[GGUF_MOE_KEYS[k]] = _layer_values(meta, f"{arch}.{k}", n_layers, path)[first]
    config = {k: v.item() if isinstance(v, np.generic) else v for k, v in config.items()}
    gating = meta.get(f"{arch}.expert_gating_func")
    if gating is None and arch in LLAMA_CPP_GATING_DEFAULT:
        if LLAMA_CPP_GATING_DEFAULT[arch] is None:
            raise SterError(f"{path}: GGUF metadata lacks {arch}.expert_gating_func, which llama.cpp requires "
                            f"for architecture {arch!r}")
        config["scoring_func"] = LLAMA_CPP_GATING_DEFAULT[arch]
        if arch == "deepseek2":
            vocab = len(meta.get("tokenizer.ggml.tokens") or ()) or meta.get(f"{arch}.vocab_size")
            if n_layers in GLM_LITE_SHAPE["layers"] and vocab == GLM_LITE_SHAPE["vocab"]:
                config["scoring_func"] = "sigmoid"
    elif gating is not None:
        if int(gating) not in GGUF_GATING:
            raise SterError(f"{path}: {arch}.expert_gating_func {int(gating)} is not supported; ster reads "
                            f"{', '.join(f'{k} ({v})' for k, v in GGUF_GATING.items())}")
        config["scoring_func"] = GGUF_GATING[int(gating)]
        if int(gating) == 3:
            config["norm_topk_prob"] = True
    config.update(LLAMA_CPP_MOE.get(arch, {}))
    if config.get("routed_scaling_factor") == 0:  # llama.cpp scales only by a factor other than 0 and 1
        del config["routed_scaling_factor"]
    config = {k: v for k, v in config.items() if v is not None}  # None: what llama.cpp does not read
    config.setdefault("moe_intermediate_size", feed_forward_length)
    n_group = config.get("n_group") or 1
    select_bias = any(f"blk.{i}.exp_probs_b{s}" in tensors for i in range(n_layers) for s in (".bias", ""))
    # llama.cpp adds exp_probs_b whenever the file has it and ranks groups by their best two.
    config["topk_method"] = "noaux_tc" if select_bias else ("group_limited_greedy" if n_group > 1 else "greedy")
    shexp = next((tensors[f"blk.{i}.ffn_up_shexp.weight"] for i in range(n_layers)
                  if f"blk.{i}.ffn_up_shexp.weight" in tensors), None)
    if shexp is not None and "shared_intermediate_size" not in config:
        config["shared_intermediate_size"] = int(shexp[0])
    elif shexp is None:
        config["shared_intermediate_size"] = 0
    gated = any(f"blk.{i}.ffn_gate_inp_shexp.weight" in tensors for i in range(n_layers))
    # (moe_latent_size: the experts' latent width, which nemotron-h.cpp reads; no other file states it)
    reader_family = replace(family, keys={"moe_latent_size": ("moe_latent_size",)}, fixed={}, moe_defaults={},
                            shared_gated=gated,
                            moe_fields={**family.moe_fields, "select_bias": select_bias, "group_rank": "top2",
                                        "renorm_eps": 0.0, "renorm_min": LLAMA_CPP_RENORM_MIN})
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
    from ..decoder.latent import LatentSpec

    def g(key, default=None):
        return _get(meta, f"{arch}.{key}", int, path, default)

    # (group GDS) glm5-next's latent attention rotates nothing: rope.dimension_count 0 (glm5-next.cpp asserts it)
    rope = 0 if arch in LLAMA_CPP_UNROTATED_LATENT else g("rope.dimension_count")
    if rope == 0 and meta.get(f"{arch}.rope.dimension_count", 0) != 0:
        raise SterError(f"{path}: GGUF metadata {arch}.rope.dimension_count must be 0 (llama.cpp's {arch} rotates "
                        f"no part of its latent attention), got {brief_value(meta[f'{arch}.rope.dimension_count'])}")
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


def _gguf_swa_latent(meta: Mapping, arch: str, latent: LatentSpec, path: str) -> LatentSpec | None:
    """The sliding-window layers' own latent attention (``LLAMA_CPP_SWA_LATENT``, dots3note.cpp's loader):
    ``attention.kv_lora_rank_swa``, ``key_length_mla_swa`` (nope + rope) and ``value_length_mla_swa``, with
    the full layers' query rank, rotated width and norms; scored at key_length_mla_swa ** -0.5 (dots3note.cpp's
    kq_scale). None when it equals the full layers' latent.

    Raises:
        SterError: a missing or invalid width, a key width not above the rotated width.
    """
    def g(key):
        return _get(meta, f"{arch}.attention.{key}", int, path, positive=True)

    rank, qk, v = g("kv_lora_rank_swa"), g("key_length_mla_swa"), g("value_length_mla_swa")
    if qk <= latent.qk_rope_head_dim:
        raise SterError(f"{path}: GGUF metadata {arch}.attention.key_length_mla_swa ({qk}) must exceed "
                        f"{arch}.rope.dimension_count ({latent.qk_rope_head_dim}), the rotated part it holds")
    own = replace(latent, kv_lora_rank=rank, qk_nope_head_dim=qk - latent.qk_rope_head_dim, v_head_dim=v,
                  attn_scale=qk ** -0.5 if qk != latent.qk_head_dim else None)
    return own if own != latent else None


def _gguf_indexer(meta: Mapping, arch: str, latent: LatentSpec, n_layers: int, max_pos: int,
                  path: str) -> tuple[IndexerSpec, list[str]]:
    """(the indexer, each layer's ``LayerSpec.indexer``) of a DeepSeek Sparse Attention file, as llama.cpp's
    loader reads it (``LLAMA_CPP_INDEXER``): ``attention.indexer.head_count``, ``key_length``, ``top_k``, and
    ``attention.indexer.types`` where the architecture reads it.

    Raises:
        SterError: a missing or invalid count, a rotated width above the index head's, a types array of
            the wrong length or with a shared layer before the first full one.
    """
    from ..decoder.indexer import IndexerSpec
    how = LLAMA_CPP_INDEXER[arch]

    def g(key):
        return _get(meta, f"{arch}.attention.indexer.{key}", int, path)

    norm_eps = how["norm_eps"]
    if norm_eps == "model":
        norm_eps = latent.norm_eps
    elif norm_eps == "layer_norm_epsilon":
        norm_eps = _get(meta, f"{arch}.attention.layer_norm_epsilon", float, path, 0.0)
    pools = {}
    if how.get("kpool"):  # glm5-next.cpp's loader asserts kpool > 1 and top_k a multiple of it
        kpool, topk = g("kpool"), g("top_k")
        if kpool < 2 or topk % kpool:
            raise SterError(f"{path}: {arch}.attention.indexer.kpool ({kpool}) must be at least 2 and divide "
                            f"{arch}.attention.indexer.top_k ({topk}), as llama.cpp requires")
        pools = {"kpool": kpool, "tail": bool(meta.get(f"{arch}.attention.indexer.kpool_select_tail", True))}
    spec = IndexerSpec(n_heads=g("head_count"), head_dim=g("key_length"), topk=g("top_k"),
                       rope_dim=latent.qk_rope_head_dim, interleaved=how["interleaved"], norm_eps=float(norm_eps),
                       rope_last=how.get("rope_last", False), **pools)
    if spec.rope_dim > spec.head_dim:
        raise SterError(f"{path}: {arch}.rope.dimension_count ({spec.rope_dim}) must not exceed "
                        f"{arch}.attention.indexer.key_length ({spec.head_dim})")
    full = [True] * n_layers
    if how["types"]:
        types = meta.get(f"{arch}.attention.indexer.types")
        if types is None and how["types"] == "required":
            raise SterError(f"{path}: GGUF metadata lacks {arch}.attention.indexer.types, which llama.cpp requires "
                            f"for architecture {arch!r} (which layers own an indexer)")
        if types is None and max_pos >= GLM_5_2["context"] and how["types"] is True:
            full = [i < GLM_5_2["lead"] or (i - GLM_5_2["lead"]) % GLM_5_2["period"] == 0 for i in range(n_layers)]
        elif types is not None:
            flags = [types] * n_layers if isinstance(types, (bool, int, np.integer, np.bool_)) else list(types)
            if len(flags) < n_layers:
                raise SterError(f"{path}: {arch}.attention.indexer.types has {len(flags)} entries for {n_layers} "
                                "layers")
            full = [bool(f) for f in flags[:n_layers]]
    if "unflagged" in how:  # the unflagged layers attend without an indexer
        return spec, ["full" if f else how["unflagged"] for f in full]
    if not full[0]:
        raise SterError(f"{path}: {arch}.attention.indexer.types marks layer 0 shared; a shared layer reuses an "
                        "earlier layer's choice, and there is none")
    return spec, ["full" if f else "shared" for f in full]


def _gguf_block_sparse(meta: Mapping, arch: str, kv_heads: int, n_layers: int,
                       path: str) -> tuple[BlockSparseSpec, list[bool]]:
    """(the index branch, each layer's flag) of a MiniMax Sparse Attention file (``LLAMA_CPP_BLOCK_SPARSE``), as
    minimax-m3.cpp's loader reads it: ``attention.indexer.head_count`` (one per key/value head, which its graph
    asserts), ``key_length``, ``top_k`` (blocks kept), ``block_size``, ``local_blocks``; the layers from
    ``leading_dense_block_count`` on are sparse.

    Raises:
        SterError: a missing or non-positive size, an index head count other than head_count_kv, more local
            blocks than blocks kept, a leading dense count beyond block_count.
    """
    from ..decoder.block_sparse import BlockSparseSpec

    def g(key, default=None, low=1):
        value = meta.get(f"{arch}.{key}", default)
        if value is None or isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
                or not low <= value <= MAX_HEADS * 1024:
            raise SterError(f"{path}: GGUF metadata {arch}.{key} must be a whole number of at least {low}, got "
                            f"{brief_value(value)}")
        return int(value)

    heads = g("attention.indexer.head_count")
    if heads != kv_heads:
        raise SterError(f"{path}: {arch}.attention.indexer.head_count ({heads}) must equal "
                        f"{arch}.attention.head_count_kv ({kv_heads}): llama.cpp's {arch} runs one index head per "
                        "key/value head")
    spec = BlockSparseSpec(index_dim=g("attention.indexer.key_length"), block_size=g("attention.indexer.block_size"),
                           topk_blocks=g("attention.indexer.top_k"),
                           local_blocks=g("attention.indexer.local_blocks", low=0))
    if not 0 <= spec.local_blocks <= spec.topk_blocks:
        raise SterError(f"{path}: {arch}.attention.indexer.local_blocks ({spec.local_blocks}) must be between 0 "
                        f"and {arch}.attention.indexer.top_k ({spec.topk_blocks})")
    lead = g("leading_dense_block_count", 0, low=0)
    if lead > n_layers:
        raise SterError(f"{path}: {arch}.leading_dense_block_count ({lead}) must be between 0 and {n_layers}")
    return spec, [i >= lead for i in range(n_layers)]


def _deepseek2_yarn(meta: Mapping, arch: str, params: dict, qk_head_dim: int, path: str) -> float:
    """llama.cpp's YaRN for ``deepseek2`` (src/llama-context.cpp, src/models/deepseek2.cpp): fills in the
    rotation's attention factor and returns the softmax scale.

    ``rope.scaling.yarn_log_multiplier`` is 0.1 * mscale_all_dim. With it, llama.cpp takes mscale equal to
    mscale_all_dim, so the tables keep their magnitude; without it they are scaled by YaRN's
    ``yarn_mscale(factor)``; either way times ``rope.scaling.attn_factor``. The scores are scaled by
    (that factor * (1 + 0.1 * mscale_all_dim * ln factor)) ** 2 / sqrt(qk_head_dim).
    """
    factor = params["factor"]
    log_mul = meta.get(f"{arch}.rope.scaling.yarn_log_multiplier") if arch in LLAMA_CPP_YARN_LOG_MUL else None
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
    tokens = meta.get("tokenizer.ggml.tokens")
    if vocab_size is not None and tokens is not None and len(tokens) != vocab_size:
        # llama.cpp sizes token_embd by the token list and refuses the file; run as is, the head
        # would sample ids the tokenizer cannot print (fewer tokens) or a prompt would reach
        # rows the embedding lacks (more). Converters pad the list ([PADi]) to the rows.
        raise SterError(f"{path}: tokenizer.ggml.tokens holds {len(tokens)} tokens, but token_embd.weight has "
                        f"{vocab_size} rows; the file is damaged or its vocabulary is not this model's "
                        "(llama.cpp refuses it too): download it again or re-convert the model")
    arch = meta.get("general.architecture")
    family = family_for_architecture(arch, path)
    if arch in LLAMA_CPP_VIA_CONFIG:  # (group DS4)
        vocab = vocab_size or len(meta.get("tokenizer.ggml.tokens") or ()) or _get(meta, f"{arch}.vocab_size", int,
                                                                                      path)
        return spec_via_config(meta, arch, family, path, vocab_size=vocab, has_output=has_output)
    config = _gguf_config(meta, arch, family)
    family = replace(family.for_config(config), **family.gguf_changes)
    for refusal in family.gguf_refusals:
        if refusal.when(config):
            raise SterError(f"{path}: {refusal.why} in a GGUF file of architecture {arch!r}")

    def g(key, kind, default=None, positive=False):
        return _get(meta, f"{arch}.{key}", kind, path, default, positive)

    hidden = g("embedding_length", int)
    # llama.cpp counts the multi-token-prediction layers a file may append in block_count
    # (nextn_predict_layers); the forward runs the ones before them.
    n_all = g("block_count", int)
    n_mtp = meta.get(f"{arch}.nextn_predict_layers") or 0
    if isinstance(n_mtp, (bool, np.bool_)) or not isinstance(n_mtp, (int, np.integer)) or not 0 <= n_mtp < n_all:
        raise SterError(f"{path}: GGUF metadata {arch}.nextn_predict_layers must be a whole number below "
                        f"block_count ({n_all}), got {brief_value(n_mtp)}")
    n_layers = n_all - int(n_mtp)
    if family.loop_stacks:  # built over the first stack's blocks, then expanded (config.looped_from_gguf)
        n_all = n_layers = looped_stack(config, family, n_all, path)
    layering = LLAMA_CPP_LAYERS.get(arch)
    kv_list = ff_list = None
    halves = _gguf_halves(meta, arch, tensors or {}, n_all, n_layers, path) if arch in LLAMA_CPP_HALVES else None
    if halves is not None:  # a layer without attention takes the model's counts (it has no weights to size)
        first = next(h for h in halves if h[0])
        layer_heads = [h or first[0] for h, _, _ in halves]
    elif layering is None:
        layer_heads = _layer_counts(meta, arch, "attention.head_count", None, n_all, n_layers, path)
    else:  # state-space architectures: per-layer head and width arrays say which layer is which
        layer_heads = [g("attention.head_count", int) if layering != "scan" else 1] * n_layers
        kv_list = _layer_values(meta, f"{arch}.attention.head_count_kv", n_layers, path, layer_heads[0])
        ff_list = _layer_values(meta, f"{arch}.feed_forward_length", n_layers, path, 0)
    heads = layer_heads[0]
    eps_key = "attention.layer_norm_rms_epsilon" if family.norm == "rms" else "attention.layer_norm_epsilon"
    if family.norm == "rms" and meta.get(f"{arch}.{eps_key}") is None:  # Nemotron-H states only the other
        eps_key = "attention.layer_norm_epsilon"
    eps = g(eps_key, float, 1e-6)
    latent = _gguf_latent(meta, arch, hidden, heads, eps, path) if family.latent else None
    if latent is not None and family.latent_k_rope_norm:  # (group DOTS) the rotated key part's norm
        latent = replace(latent, k_rope_norm=True)
    if latent is not None:  # expanded, one key/value head per head; only the rope part rotates
        layer_kv, head_dim, v_head_dim = list(layer_heads), latent.qk_head_dim, latent.v_head_dim
    elif kv_list is not None:  # state-space architectures: the attention layers' count (others hold 0)
        layer_kv = [next((v for v in kv_list if v), 1)] * n_layers
        head_dim = g("attention.key_length", int, hidden // heads)
        v_head_dim = g("attention.value_length", int, head_dim)
    else:
        layer_kv = ([k or first[1] for _, k, _ in halves] if halves is not None else
                    _layer_counts(meta, arch, "attention.head_count_kv", layer_heads, n_all, n_layers, path))
        head_dim = g("attention.key_length", int, hidden // heads)
        v_head_dim = g("attention.value_length", int, head_dim)
    kv_heads = layer_kv[0]
    for i, (h, kv) in enumerate(zip(layer_heads, layer_kv)):
        if h % kv:
            raise SterError(f"{path}: layer {i}'s attention.head_count ({h}) is not a multiple of its "
                            f"head_count_kv ({kv})")
    swa = LLAMA_CPP_SWA_ROPE.get(arch, {})
    residual = g("residual_scale", float, 1.0) if arch in LLAMA_CPP_SCALED_JOIN else 1.0

    def dims(key, default):  # the rotated width sizes the frequency tables: bounded by the head first
        d = g(key, int, default)
        if d > head_dim or d % 2:
            raise SterError(f"{path}: GGUF metadata {arch}.{key} ({d}) must be even and at most the head width "
                            f"{head_dim} ({arch}.attention.key_length, else embedding_length / head_count)")
        return d

    # the sliding layers' own key / value head widths (None: the model's)
    swa_head = g("attention.key_length_swa", int, head_dim) if swa.get("swa_width") else head_dim
    swa_v_head = g("attention.value_length_swa", int, swa_head) if swa.get("swa_width") else v_head_dim
    if latent is not None:  # only the shared rope part rotates, over its own width
        rotary_dim = swa_dims = rope_width = latent.qk_rope_head_dim
    else:
        rotary_dim, rope_width = dims("rope.dimension_count", head_dim), head_dim
        swa_dims = dims("rope.dimension_count_swa", rotary_dim) if swa.get("swa_dims") else rotary_dim
        if swa_dims > swa_head:
            raise SterError(f"{path}: GGUF metadata {arch}.rope.dimension_count_swa ({swa_dims}) must be at most "
                            f"the sliding layers' head width {swa_head} ({arch}.attention.key_length_swa)")
        if swa.get("full_dims_half"):
            rotary_dim //= 2
            if rotary_dim % 2:
                raise SterError(f"{path}: llama.cpp's {arch} rotates half of {arch}.rope.dimension_count on full "
                                f"attention layers, which must be even ({rotary_dim})")
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
        scale = (_deepseek2_yarn(meta, arch, params, head_dim, path)
                 if scaling == "yarn" and arch in ("deepseek2", "deepseek32", "glm-dsa") else head_dim ** -0.5)

    def make(p, rotated=rotary_dim, width=rope_width):
        return make_rope(p, head_dim=width, max_position_embeddings=max_pos,
                         partial_rotary_factor=rotated / width, interleaved=family.rope_interleaved,
                         where=path, partial_keys=f"{arch}.rope.dimension_count")

    full = make(params) if rope_width else None  # (a latent attention rotating nothing: glm5-next)
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
        if swa.get("swa_dims") and rope_freqs.shape[0] > full.inv_freq.shape[0]:
            rope_freqs = rope_freqs[:full.inv_freq.shape[0]]  # one table for every width: its first entries
        if rope_freqs.shape != full.inv_freq.shape:
            raise SterError(f"{path}: rope_freqs has shape {rope_freqs.shape}, expected {full.inv_freq.shape}")
        full = replace(full, inv_freq=full.inv_freq / rope_freqs.astype(np.float64))

    # A model whose every layer routes may state only the experts' width.
    if halves is not None:  # per layer (0: none), each its own: the model's is the first layer's
        dense_width = next((w for _, _, w in halves if w), hidden)
    elif ff_list is not None:  # per layer (0: none); the layers with one share it
        # (where the experts' widths are listed per layer, a routed layer's entry is its experts' width: Puzzle)
        per_layer_experts = isinstance(meta.get(f"{arch}.expert_feed_forward_length"), (list, tuple, np.ndarray))
        widths = {v for i, v in enumerate(ff_list) if v and not (
            per_layer_experts and f"blk.{i}.ffn_gate_inp.weight" in (tensors or {}))}
        if len(widths) > 1:
            raise SterError(f"{path}: {arch}.feed_forward_length lists different widths per layer "
                            f"({brief_value(ff_list)}); ster runs feed-forwards of one width")
        dense_width = widths.pop() if widths else None
    elif isinstance(meta.get(f"{arch}.feed_forward_length"), (list, tuple, np.ndarray)):
        # one width per layer (Gemma 3n's converter): read when all agree
        widths = set(_layer_values(meta, f"{arch}.feed_forward_length", n_all, path))
        if len(widths) != 1 or not min(widths):
            raise SterError(f"{path}: {arch}.feed_forward_length lists different widths per layer "
                            f"({brief_value(meta[f'{arch}.feed_forward_length'])}); ster runs feed-forwards of one "
                            "width")
        dense_width = widths.pop()
    else:
        dense_width = g("feed_forward_length", int) if meta.get(f"{arch}.feed_forward_length") is not None else None
    routed, moe = _gguf_moe(meta, arch, family, tensors or {}, n_layers, dense_width or 0, path)
    clamps = _layer_clamps(meta, arch, moe, routed, n_all, path)
    shapes = _layer_moe_shapes(meta, arch, moe, routed, n_layers, path)
    if dense_width is None and moe is None:
        dense_width = g("feed_forward_length", int) if layering is None else hidden  # (missing: refused by name)
    window = meta.get(f"{arch}.attention.sliding_window")
    sliding = _sliding_flags(meta, arch, family, n_layers, path, n_all)
    sliding_rope = full
    if meta.get(f"{arch}.rope.freq_base_swa") is not None and swa.get("swa_base_read", True):
        sliding_rope = make({"rope_type": "default", "rope_theta": g("rope.freq_base_swa", float, positive=True)},
                            swa_dims, swa_head)
    elif arch == "gemma3" and window:
        sliding_rope = make({"rope_type": "default", "rope_theta": LLAMA_CPP_FIXED["gemma3.swa_rope_base"]})
    elif swa.get("base") is not None and window:
        base = params["rope_theta"] if swa["base"] == "freq_base" else swa["base"]
        sliding_rope = make({"rope_type": "default", "rope_theta": base}, swa_dims, swa_head)
    chunked = LLAMA_CPP_CHUNKED.get(arch)
    chunks = [None] * n_layers
    temperature = None
    if chunked:
        period = chunked["period"]
        flags = _pattern_array(meta, arch, n_layers, path) or [i % period < period - 1 for i in range(n_layers)]
        chunks = [chunked["chunk"] if f else None for f in flags]
        temperature = chunked["temperature"]
        if moe is not None and moe.router.num_experts == chunked["no_qk_norm_experts"]:
            family = replace(family, qk_norm=None)
    shared = _kv_shared(meta, arch, sliding, n_all, path)
    no_rope_step = LLAMA_CPP_NO_ROPE_STEP.get(arch)
    rotated = _rope_flags(meta, arch, n_layers, path)
    indexer, index_kinds = None, [None] * n_layers
    if family.indexer is not None:
        indexer, index_kinds = _gguf_indexer(meta, arch, latent, n_layers, max_pos, path)
    swa_latent = None
    if arch in LLAMA_CPP_SWA_LATENT:
        swa_latent = _gguf_swa_latent(meta, arch, latent, path)
        if any((kind is None) != flag for kind, flag in zip(index_kinds, sliding)):
            raise SterError(f"{path}: {arch}.attention.indexer.types must flag exactly the layers "
                            f"{arch}.attention.sliding_window_pattern leaves full (llama.cpp's {arch} indexes its "
                            "full-attention layers and no other)")
    recurrent = _recurrent_flags(meta, arch, n_layers, path) if layering == "recurrent" else None
    block_sparse, sparse = None, [False] * n_layers
    if arch in LLAMA_CPP_BLOCK_SPARSE:
        block_sparse, sparse = _gguf_block_sparse(meta, arch, kv_heads, n_layers, path)
    residual_extras, sparsity = _gguf_altup(meta, arch, family, n_layers, path)
    layers = []
    for i in range(n_layers):
        rope = sliding_rope if sliding[i] else full
        # llama.cpp rotates only the sliding layers of these families (Cohere 2 MoE: and its leading dense ones)
        rotates = sliding[i] or (family.rope_layers == "sliding_or_dense" and not routed[i])
        if not rotated[i] or family.positions != "rope" or (family.rope_layers != "all" and window and not rotates):
            rope = None
        if no_rope_step and (i + 1) % no_rope_step == 0:
            rope = None
        mixer, ffn = ("latent" if latent is not None else "attention"), "moe" if routed[i] else "dense"
        if layering == "recurrent":
            mixer = family.recurrent if recurrent[i] else mixer
        elif sparse[i]:
            mixer = "block_sparse"
        elif layering is not None:
            mixer, ffn = _gguf_layer_kind(layering, family, kv_list[i], ff_list[i], routed[i])
            mixer = "latent" if mixer == "attention" and latent is not None else mixer
        if halves is not None:
            mixer, ffn = mixer if halves[i][0] else "none", ffn if halves[i][2] else "none"
        if mixer not in ATTENTION_MIXERS:
            rope = None
        own = {k: v for k, v, model in (("num_attention_heads", layer_heads[i], heads),
                                        ("num_key_value_heads", layer_kv[i], kv_heads),
                                        ("v_head_dim", v_head_dim, head_dim)) if v != model}
        # (a latent layer's key/value heads are its query heads, expanded: llama.cpp's 1 is its MQA form)
        if mixer in ATTENTION_MIXERS and kv_list is not None and kv_list[i] != kv_heads and latent is None:
            own["num_key_value_heads"] = kv_list[i]
        layer_moe = shapes[i] if shapes else moe
        if clamps and clamps[i] is not None:
            layer_moe = replace(layer_moe, limit=clamps[i].limit, shared_limit=clamps[i].shared_limit,
                                clamp_act=clamps[i].clamp_act)
        if layer_moe is not None and layer_moe != moe:
            own["moe"] = layer_moe
        if index_kinds[i] is not None:
            own["indexer"] = index_kinds[i]
        if swa_latent is not None and sliding[i] and mixer == "latent":
            own["latent"] = swa_latent
        if arch in LLAMA_CPP_SCALED_JOIN:
            own["residual"] = (residual, 1.0, residual, 1.0)
        if sliding[i] and swa_head != head_dim:
            own["head_dim"] = swa_head
        if sliding[i] and swa_v_head != (v_head_dim if swa_head == head_dim else swa_head):
            own["v_head_dim"] = swa_v_head
        elif sliding[i] and swa_head != head_dim:
            own.pop("v_head_dim", None)
        if halves is not None:  # each half's norm goes with it; a feed-forward of its own width
            own["norms"] = tuple(n for n in family.norms if (halves[i][0] or not n.startswith("attn"))
                                 and (halves[i][2] or not n.startswith("ffn")))
            if halves[i][2] and halves[i][2] != dense_width:
                own["intermediate_size"] = halves[i][2]
        if sparsity[i]:
            own["ffn_sparsity"] = sparsity[i]
        if shared[i] is not None:
            own["kv_source"] = shared[i]
        elif (arch in LLAMA_CPP_V_FROM_K and tensors is not None
              and f"blk.{i}.attn_v.weight" not in tensors and f"blk.{i}.attn_qkv.weight" not in tensors):
            own["v_from_k"] = True
        # llama.cpp reads a layer's sinks when the file holds them (mimo2.cpp)
        if family.sinks and tensors is not None and "sinks" in family.gguf_names:
            own["sinks"] = family.gguf_names["sinks"].format(i=i) in tensors
        layers.append(LayerSpec(sliding_window=int(window) if sliding[i] else None, rope=rope,
                                ffn=ffn, attention_chunk=chunks[i], mixer=mixer,
                                qk_norm=rope is not None or family.qk_norm_layers == "all",
                                query_temperature=rope is None or family.query_temperature != "unrotated_layers",
                                **own))
    if (layering is not None and family.gguf_qk_permuted and rotary_dim < head_dim
            and any(layer.rope is not None for layer in layers)):
        raise SterError(f"{path}: a GGUF file of architecture {arch!r} whose attention rotates {rotary_dim} of "
                        f"{head_dim} dimensions per head is not supported: llama.cpp rotates adjacent pairs of "
                        "the converter's permuted rows there, which is not the rotation the model was trained with")

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
    if arch in LLAMA_CPP_DENSE_CLAMP:
        fields["ffn_limit"] = _dense_clamp(meta, arch, routed, path)
    # llama.cpp's converter stores norms kept as offsets from one (Gemma, Nemotron) as 1 + w, so they apply as is.
    fields["norm_unit_offset"] = False
    fields["norm_offsets"] = ()  # (and PLaMo 3's other offsets, likewise folded by its converter)
    if arch in LLAMA_CPP_POST_NORM_EPS:
        fields["post_norm_eps"] = LLAMA_CPP_POST_NORM_EPS[arch]
    if arch in LLAMA_CPP_BLOCK_SPARSE:  # the dense feed-forwards' unit, as llama.cpp fixes it
        unit = LLAMA_CPP_BLOCK_SPARSE[arch]
        fields.update(ffn_glu=family.ffn_glu, ffn_limit=unit["swiglu_limit"], ffn_alpha=unit["swiglu_alpha"])
    if family.attn_gate and tensors is not None and "g" in family.gguf_names:
        recurrent = frozenset(i for i, kv in enumerate(kv_list or ()) if kv == 0) if layering == "kv" else frozenset()
        per_head = _gate_kind(tensors, family.gguf_names["g"], layer_heads, v_head_dim, path, recurrent)
        if per_head is None:
            fields["attn_gate"] = None
        else:
            fields["attn_gate_per_head"] = per_head
    spec = ModelSpec(
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
        # multi-token-prediction layers; keys and values of the layers that reuse another's
        unread=tuple(f"blk.{i}." for i in range(n_layers, n_all)) + reused_kv_unread(family.gguf_names, layers),
        fused_qkv="concat",  # llama.cpp's converter reorders every fused qkv to [q | k | v]
        query_temperature=temperature,
        moe=moe,
        latent=latent,
        indexer=indexer,
        block_sparse=block_sparse,
        ssm=(_gguf_lightning(heads, head_dim, eps) if family.recurrent == "lightning"
             else _gguf_ssm(meta, arch, family, tensors or {}, n_layers, eps, path)
             if family.recurrent and family.recurrent not in DELTA_MIXERS else None),
        delta=_gguf_delta(meta, arch, family, heads, eps, path) if family.recurrent in DELTA_MIXERS else None,
        residual_normed=arch in LLAMA_CPP_SCALED_JOIN,
        # hyper-connections (hy-v4.cpp): hyper_connection.count / epsilon / magnitude as the family's config keys
        # (gguf_config), the streams' norm taking the model's epsilon
        streams=(streams_spec(_Reader(dict(config, norm_eps=eps, rms_norm_eps=eps), family, path), family, path)
                 if family.streams is not None else None),
        **_per_layer_input(meta, arch, tensors, path),
        **residual_extras,
        **fields,
    )
    return looped_from_gguf(spec, config, family, path) if family.looped else spec


def _kv_shared(meta: Mapping, arch: str, sliding: list[bool], n_all: int, path: str) -> list[int | None]:
    """Per layer, the earlier layer whose keys and values it attends over (``LLAMA_CPP_KV_SHARED``), or None.

    Raises:
        SterError: a count that leaves fewer than two layers computing keys and values, or a layer
            that would reuse the cache of a layer of the other kind (sliding / full attention), whose
            window and head width differ.
    """
    key = LLAMA_CPP_KV_SHARED.get(arch)
    n = meta.get(f"{arch}.{key}") if key else None
    out: list[int | None] = [None] * len(sliding)
    if not n:
        return out
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or not 0 < n <= n_all - 2:
        raise SterError(f"{path}: GGUF metadata {arch}.{key} must be a whole number leaving at least two of the "
                        f"{n_all} layers their own keys and values, got {brief_value(n)}")
    first = n_all - int(n)
    for i in range(first, len(sliding)):
        src = first - (2 if sliding[i] else 1)
        if sliding[src] != sliding[i]:
            kinds = ("full", "sliding")
            raise SterError(f"{path}: llama.cpp's {arch} makes layer {i} ({kinds[sliding[i]]} attention) reuse the "
                            f"keys and values of layer {src}, a {kinds[sliding[src]]}-attention layer "
                            f"({arch}.{key} = {int(n)}; layers {first - 2} and {first - 1} must slide and attend "
                            "fully); ster does not run this file")
        out[i] = src
    return out


def _gguf_altup(meta: Mapping, arch: str, family: FamilySpec, n_layers: int, path: str) -> tuple[dict, list[float]]:
    """Gemma 3n's residual extras from a file, for a family with ``altup``: (``ModelSpec`` fields
    ``altup``, ``laurel``, ``per_layer_clamp``; each layer's activation sparsity), else ({}, zeros).

    AltUp's copies are ``altup.num_inputs``; the correction scale always applies (gemma3n.cpp, and
    the converter writes no flag). ``activation_sparsity_scale`` holds each layer's normal quantile
    (the converter's ``icdf`` of activation_sparsity_pattern; -inf: dense), read back as the share; its
    cut-off takes the sample std, as gemma3n.cpp does (``ModelSpec.sparsity_ddof``).

    Raises:
        SterError: altup.active_idx other than 0, altup.num_inputs not a whole number in 1..64, or a
            sparsity array that is not one number per layer.
    """
    if not family.altup:
        return {}, [0.0] * n_layers
    from statistics import NormalDist

    from ..config import MAX_ALTUP_INPUTS
    from ..decoder.altup import AltUpSpec

    n = meta.get(f"{arch}.altup.num_inputs", 4)
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or not 0 < n <= MAX_ALTUP_INPUTS:
        raise SterError(f"{path}: GGUF metadata {arch}.altup.num_inputs must be a whole number in "
                        f"1..{MAX_ALTUP_INPUTS}, got {brief_value(n)}")
    active = meta.get(f"{arch}.altup.active_idx", 0)
    if active != 0:
        raise SterError(f"{path}: an AltUp active copy other than the first ({arch}.altup.active_idx = "
                        f"{brief_value(active)}) is not supported")
    scales = meta.get(f"{arch}.activation_sparsity_scale")
    if scales is None:
        sparsity = [0.0] * n_layers
    else:
        values = list(scales) if isinstance(scales, (list, tuple, np.ndarray)) else None
        if values is None or len(values) != n_layers or any(
                isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating))
                or math.isnan(v) or v == math.inf for v in values):
            raise SterError(f"{path}: GGUF metadata {arch}.activation_sparsity_scale must hold one number (or -inf) "
                            f"per layer ({n_layers}), got {brief_value(scales)}")
        sparsity = [0.0 if v == -math.inf else NormalDist().cdf(float(v)) for v in values]
    # gemma3n.cpp's gaussian_topk divides the squared deviations by n - 1 (Transformers: by n)
    return ({"altup": AltUpSpec(num_inputs=int(n), correct_scale=True), "laurel": family.laurel,
             "per_layer_clamp": family.per_layer_clamp, "sparsity_ddof": 1}, sparsity)


def _per_layer_input(meta: Mapping, arch: str, tensors: Mapping | None, path: str) -> dict:
    """``per_layer_input`` and ``per_layer_vocab`` of an architecture with per-layer inputs
    (``LLAMA_CPP_PER_LAYER_INPUT``): the width from the metadata (0: none), the vocabulary from the
    rows of the ``per_layer_token_embd`` table; {} for other architectures."""
    key = LLAMA_CPP_PER_LAYER_INPUT.get(arch)
    if key is None:
        return {}
    width = _layer_values(meta, f"{arch}.{key}", 1, path, 0)[0]
    if not width:
        return {}
    shape = (tensors or {}).get("per_layer_token_embd.weight")
    if shape is None or len(shape) != 2:
        raise SterError(f"{path}: {arch}.{key} is {width}, but the file holds no 2-D per_layer_token_embd table")
    return {"per_layer_input": int(width), "per_layer_vocab": int(shape[0])}


def _recurrent_flags(meta: Mapping, arch: str, n_layers: int, path: str) -> list[bool]:
    """Which layers run the family's recurrent mixer in a ``"recurrent"`` architecture
    (``LLAMA_CPP_LAYERS``), as llama.cpp's loaders read them: ``attention.recurrent_layers`` (one flag
    per block, the prediction blocks' too), else every layer but each ``full_attention_interval``-th
    (counted from one; ``LLAMA_CPP_FULL_ATTENTION_INTERVAL`` when the file states none)."""
    flags = meta.get(f"{arch}.attention.recurrent_layers")
    if flags is not None:
        blocks = int(meta.get(f"{arch}.block_count", n_layers))
        if isinstance(flags, (str, int, np.integer, bool, np.bool_)) or len(flags) not in (n_layers, blocks):
            raise SterError(f"{path}: GGUF metadata {arch}.attention.recurrent_layers must hold one flag per layer "
                            f"({n_layers}), got {brief_value(flags)}")
        return [bool(x) for x in list(flags)[:n_layers]]
    interval = _get(meta, f"{arch}.full_attention_interval", int, path, LLAMA_CPP_FULL_ATTENTION_INTERVAL.get(arch, 4))
    return [(i + 1) % interval != 0 for i in range(n_layers)]


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


# (group DS4) Architectures whose metadata names every hyper-parameter of the family's config.json one to one: the
# file's spec is the family's spec of that config, read under llama.cpp's tensor names (``gguf_layout``). DeepSeek-V4
# (src/models/deepseek4.cpp): per-layer compression ratios 0 / 4 / 128, hash-routed leading layers, 4 streams.
_DEEPSEEK4_KEYS = {  # GGUF key (after "deepseek4.") -> DeepseekV4Config key
    "embedding_length": "hidden_size", "attention.head_count": "num_attention_heads",
    "attention.key_length": "head_dim", "attention.q_lora_rank": "q_lora_rank",
    "rope.dimension_count": "qk_rope_head_dim", "expert_feed_forward_length": "moe_intermediate_size",
    "expert_count": "n_routed_experts", "expert_used_count": "num_experts_per_tok",
    "attention.sliding_window": "sliding_window", "attention.output_group_count": "o_groups",
    "attention.output_lora_rank": "o_lora_rank", "attention.indexer.head_count": "index_n_heads",
    "attention.indexer.key_length": "index_head_dim", "attention.indexer.top_k": "index_topk",
    "hyper_connection.count": "hc_mult", "hyper_connection.sinkhorn_iterations": "hc_sinkhorn_iters",
    "hash_layer_count": "num_hash_layers", "context_length": "max_position_embeddings"}
_DEEPSEEK4_FLOATS = {"rope.freq_base": "rope_theta", "attention.compress_rope_freq_base": "compress_rope_theta",
                     "expert_weights_scale": "routed_scaling_factor", "hyper_connection.epsilon": "hc_eps",
                     "attention.layer_norm_rms_epsilon": "rms_norm_eps"}
#: llama.cpp's expert_gating_func value for sqrtsoftplus (LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS).
LLAMA_CPP_GATING_SQRT_SOFTPLUS = 4


def deepseek4_config(meta: Mapping, arch: str, path: str, *, vocab_size: int, has_output: bool) -> dict:
    """The DeepseekV4Config (config.json keys) a ``deepseek4`` file's metadata states, as deepseek4.cpp's loader
    reads it: the sizes one to one (``_DEEPSEEK4_KEYS``), ``attention.compress_ratios`` per layer (0, 4 or 128),
    one clamp for every expert (``swiglu_clamp_exp`` and ``_shexp`` alike on every layer), sqrtsoftplus routing,
    one shared expert, weights renormalised.

    Raises:
        SterError: a missing or invalid key, or what ster has not checked against llama.cpp's graph (rope
            scaling, several clamps, other routing, unnormalised weights, multi-token-prediction layers).
    """
    def g(key, kind, default=None):
        return _get(meta, f"{arch}.{key}", kind, path, default, positive=kind is not bool)

    def refuse(what):
        return SterError(f"{path}: {what} in a GGUF file of architecture {arch!r} is not supported (not checked "
                         "against llama.cpp's deepseek4 graph)")

    n = g("block_count", int)
    if meta.get(f"{arch}.nextn_predict_layers"):
        raise refuse("nextn_predict_layers (multi-token-prediction layers)")
    if meta.get(f"{arch}.rope.scaling.type", "none") != "none":
        raise refuse(f"rope scaling ({arch}.rope.scaling.type {brief_value(meta[f'{arch}.rope.scaling.type'])})")
    if g("expert_gating_func", int) != LLAMA_CPP_GATING_SQRT_SOFTPLUS:
        raise SterError(f"{path}: {arch}.expert_gating_func must be {LLAMA_CPP_GATING_SQRT_SOFTPLUS} (sqrtsoftplus, "
                        "which llama.cpp's deepseek4 loader requires)")
    if g("expert_shared_count", int) != 1:
        raise refuse(f"{arch}.expert_shared_count other than 1")
    if meta.get(f"{arch}.expert_weights_norm") is not True:
        raise refuse(f"{arch}.expert_weights_norm other than true")
    if g("attention.head_count_kv", int, 1) != 1 or g("attention.value_length", int) != g("attention.key_length", int):
        raise refuse("head_count_kv other than 1 or value_length other than key_length")
    config = {c: g(k, int) for k, c in _DEEPSEEK4_KEYS.items()}
    config.update({c: g(k, float) for k, c in _DEEPSEEK4_FLOATS.items()})
    if config["num_hash_layers"] > n:  # the leading layers that route by the token's table row
        raise SterError(f"{path}: GGUF metadata {arch}.hash_layer_count is {config['num_hash_layers']}, more than "
                        f"the block count ({n}): it counts the leading hash-routed layers (llama.cpp's converter "
                        "writes the config's num_hash_layers); the file is damaged or was not written by it")
    ratios = meta.get(f"{arch}.attention.compress_ratios")
    if (not isinstance(ratios, (list, tuple, np.ndarray)) or len(ratios) < n
            or any(isinstance(r, (bool, np.bool_)) or r not in (0, 4, 128) for r in ratios)):
        raise SterError(f"{path}: GGUF metadata {arch}.attention.compress_ratios must list block_count ({n}) ratios "
                        f"of 0, 4 or 128 (llama.cpp's deepseek4 loader knows no others), got {brief_value(ratios)}")
    clamps = [meta.get(f"{arch}.swiglu_clamp_{k}") for k in ("exp", "shexp")]
    if any(not isinstance(c, (list, tuple, np.ndarray)) or len(c) < n for c in clamps):
        raise SterError(f"{path}: GGUF metadata {arch}.swiglu_clamp_exp and swiglu_clamp_shexp must list block_count "
                        f"({n}) clamps")
    limits = {float(v) for c in clamps for v in list(c)[:n]}
    if len(limits) != 1 or not min(limits) > 0:
        raise refuse(f"clamps that differ by layer or expert kind, or are not above 0 ({sorted(limits)})")
    config.update(model_type="deepseek_v4", vocab_size=int(vocab_size), num_hidden_layers=n,
                  compress_ratios=[int(r) for r in list(ratios)[:n]], swiglu_limit=limits.pop(),
                  scoring_func="sqrtsoftplus", norm_topk_prob=True, n_shared_experts=1,
                  partial_rotary_factor=config["qk_rope_head_dim"] / config["head_dim"],
                  tie_word_embeddings=not has_output, num_nextn_predict_layers=0)
    return config


def spec_via_config(meta: Mapping, arch: str, family: FamilySpec, path: str, *, vocab_size: int,
                    has_output: bool) -> ModelSpec:
    """The spec of a file of an architecture in ``LLAMA_CPP_VIA_CONFIG``: the family's spec of the config.json its
    metadata states (``families.gate`` applied: the family's refusals hold), read under llama.cpp's names."""
    from ..config import spec_from_config
    from ..families import gate
    from .load import gguf_layout

    config = LLAMA_CPP_VIA_CONFIG[arch](meta, arch, path, vocab_size=vocab_size, has_output=has_output)
    gate(config, path)
    spec = gguf_layout(spec_from_config(config, family, path), family, config)
    eos, bos = meta.get("tokenizer.ggml.eos_token_id"), meta.get("tokenizer.ggml.bos_token_id")
    return replace(spec, extra={**spec.extra, "gguf_architecture": arch},
                   bos_token_id=int(bos) if bos is not None else None,
                   eos_token_ids=(int(eos),) if eos is not None else ())


LLAMA_CPP_VIA_CONFIG = {"deepseek4": deepseek4_config}
