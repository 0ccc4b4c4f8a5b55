"""The family table: the one place model families are listed.

Every ``model_type`` of Ster's supported list is known here (``KNOWN_MODEL_TYPES``);
the ones the generic decoder runs have a ``FamilySpec`` in ``FAMILIES``. A spec is
data: which config keys the family reads, which norms wrap its sublayers, how it
places sliding windows and rotations, and the names its tensors carry in a
Hugging Face checkpoint and in a llama.cpp GGUF file. ``config.py`` turns a spec
plus a config into the normalised ``ModelSpec`` the decoder reads; the decoder
never looks at a family name.

``gate()`` is the architecture gate: it runs on the parsed config before any
weight is mapped.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from .errors import SterError

# Ster's list of supported model_type values (seed 002, "Architecture gate"), in its order.
KNOWN_MODEL_TYPES: tuple[str, ...] = (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi", "phi3",
    "granite", "granitemoe", "stablelm", "starcoder2", "cohere", "cohere2", "nemotron", "olmo",
    "olmo2", "olmo3", "olmoe", "exaone4", "internlm3", "seed_oss", "arcee", "ernie4_5", "minicpm",
    "orion", "glm", "glm4", "gpt_neox", "gptj", "smollm3", "gpt2", "gpt_bigcode", "opt", "bloom",
    "falcon", "mpt", "deepseek_v2", "deepseek_v3", "minicpm3", "mamba", "falcon_mamba", "glm4_moe",
    "internlm2", "exaone", "jamba", "hunyuan_v1_dense", "mamba2", "bamba", "gpt_oss", "lfm2",
    "ernie4_5_moe", "dbrx", "phimoe", "hunyuan_v1_moe", "telechat", "lfm2_moe", "granitemoehybrid",
    "nemotron_h", "jais2", "bailing_moe", "TeleFLM", "falcon_h1", "qwen3_next", "kimi_linear",
    "minimax_m2", "step3_text", "minimax_text_01", "minimax", "zamba2", "gemma", "gemma2",
    "gemma3_text", "gemma4_text", "gemma4_unified_text", "mimo", "mellum", "flex_olmo",
    "granite_swa", "granitemoe_swa", "granitemoeshared", "glm4_moe_lite", "iquestcoder",
    "hyperclovax", "vaultgemma", "apertus", "exaone_moe", "solar", "step1", "telechat3",
    "param2moe", "PanguEmbedded", "olmo_hybrid", "hy_v3", "nanbeige", "iquestloopcoder",
    "nemotron-nas", "deepseek_v32", "glm_moe_dsa", "axk1", "bailing_hybrid", "mimo_v2_flash",
    "mimo_v2", "step3p5", "k2_horizon", "pangu_ultra_moe", "longcat_flash", "sarvam_moe",
    "sarvam_mla", "cohere2_moe", "deepseek", "ministral3", "llama4_text", "qwen3_5_text",
    "qwen3_5_moe_text", "afmoe", "nemotron_h_puzzle", "chatglm", "laguna", "longcat_flash_ngram",
    "muse_glimmer_text", "plamo3", "gemma3n_text", "hrm_text", "inkling_text", "deepseek_v4",
    "glm5_next_text", "hy_v4", "minimax_m3_vl_text", "dots3_note",
)

# Per-layer tensor roles the decoder asks for, with their Hugging Face names for the
# Llama layout. ``{i}`` is the layer index. Families override only what differs; see
# ``decoder/layout.py`` for the roles that are read fused (``qkv``, ``gate_up``), per head
# (a name holding ``{h}``), as plain parameters (``act``) or as whole tensor names (``sinks``,
# the routers' selection biases and the experts).
LLAMA_NAMES: Mapping[str, str] = {
    "embed": "model.embed_tokens",
    "final_norm": "model.norm",
    "head": "lm_head",
    "attn_norm": "model.layers.{i}.input_layernorm",
    "ffn_norm": "model.layers.{i}.post_attention_layernorm",
    "q": "model.layers.{i}.self_attn.q_proj",
    "k": "model.layers.{i}.self_attn.k_proj",
    "v": "model.layers.{i}.self_attn.v_proj",
    "o": "model.layers.{i}.self_attn.o_proj",
    "q_norm": "model.layers.{i}.self_attn.q_norm",
    "k_norm": "model.layers.{i}.self_attn.k_norm",
    "gate": "model.layers.{i}.mlp.gate_proj",
    "up": "model.layers.{i}.mlp.up_proj",
    "down": "model.layers.{i}.mlp.down_proj",
}


def _with(base: Mapping[str, str], **roles: str | None) -> Mapping[str, str]:
    """``base`` with roles replaced (a None value removes the role)."""
    out = dict(base)
    for role, name in roles.items():
        if name is None:
            out.pop(role, None)
        else:
            out[role] = name
    return out


# Mistral's own format (params.json + consolidated*.safetensors): the reference code's names; w1 is the gate,
# w3 the up projection, w2 the down one.
MISTRAL_FORMAT_NAMES = {
    "embed": "tok_embeddings", "final_norm": "norm", "head": "output",
    "attn_norm": "layers.{i}.attention_norm", "ffn_norm": "layers.{i}.ffn_norm",
    "q": "layers.{i}.attention.wq", "k": "layers.{i}.attention.wk", "v": "layers.{i}.attention.wv",
    "o": "layers.{i}.attention.wo", "gate": "layers.{i}.feed_forward.w1", "up": "layers.{i}.feed_forward.w3",
    "down": "layers.{i}.feed_forward.w2",
}

# Gemma 2 and 3 wrap both sublayers in norms: the Llama name "post_attention_layernorm"
# is the norm *after* attention there, and the FFN's input norm has its own name.
GEMMA2_NAMES = _with(LLAMA_NAMES, attn_post_norm="model.layers.{i}.post_attention_layernorm",
                     ffn_norm="model.layers.{i}.pre_feedforward_layernorm",
                     ffn_post_norm="model.layers.{i}.post_feedforward_layernorm")
_L = "model.layers.{i}."
PLAIN_MLP_NAMES = _with(LLAMA_NAMES, gate=None)
OLMO2_NAMES = _with(LLAMA_NAMES, attn_post_norm=_L + "post_attention_layernorm",
                    ffn_post_norm=_L + "post_feedforward_layernorm")
PHI3_NAMES = _with(LLAMA_NAMES, q=None, k=None, v=None, gate=None, up=None,
                   qkv=_L + "self_attn.qkv_proj", gate_up=_L + "mlp.gate_up_proj")
PHI_NAMES = _with(LLAMA_NAMES, final_norm="model.final_layernorm", o=_L + "self_attn.dense",
                  q_norm=_L + "self_attn.q_layernorm", k_norm=_L + "self_attn.k_layernorm", gate=None,
                  up=_L + "mlp.fc1", down=_L + "mlp.fc2", ffn_norm=None)
STABLELM_NAMES = _with(LLAMA_NAMES, q_norm=_L + "self_attn.q_layernorm.norms.{h}",
                       k_norm=_L + "self_attn.k_layernorm.norms.{h}")
STARCODER2_NAMES = _with(LLAMA_NAMES, gate=None, up=_L + "mlp.c_fc", down=_L + "mlp.c_proj")
GLM_NAMES = _with(LLAMA_NAMES, gate=None, up=None, gate_up=_L + "mlp.gate_up_proj")
GLM4_NAMES = _with(GLM_NAMES, attn_post_norm=_L + "post_self_attn_layernorm",
                   ffn_post_norm=_L + "post_mlp_layernorm")
HUNYUAN_NAMES = _with(LLAMA_NAMES, q_norm=_L + "self_attn.query_layernorm", k_norm=_L + "self_attn.key_layernorm")
HYPERCLOVAX_NAMES = _with(LLAMA_NAMES, attn_post_norm=_L + "post_norm1", ffn_post_norm=_L + "post_norm2")
APERTUS_NAMES = _with(LLAMA_NAMES, attn_norm=_L + "attention_layernorm", ffn_norm=_L + "feedforward_layernorm",
                      gate=None, act=_L + "mlp.act_fn")
# HRM-Text: two stacks ({stack}: L_module, H_module) of layers without norm weights; the attention's output
# gate rows lead its fused gqkv_proj; the low stack's first state is the stored vector z_L_init.
_HRM = "model.{stack}.layers.{i}."
HRM_TEXT_NAMES = {"embed": "model.embed_tokens", "head": "lm_head", "qkv": _HRM + "attn.gqkv_proj",
                  "o": _HRM + "attn.o_proj", "gate_up": _HRM + "mlp.gate_up_proj", "down": _HRM + "mlp.down_proj",
                  "loop_init": "model.z_L_init#"}
# llama.cpp's hrm_text: the low stack in blocks 0..n-1, the high stack in n..2n-1 (LayerSpec.stored), the gate
# rows split out as attn_gate, z_L_init as hrm.z_l_init (no .weight suffix).
GGUF_HRM_TEXT_NAMES = {"embed": "token_embd", "head": "output", "q": "blk.{i}.attn_q", "k": "blk.{i}.attn_k",
                       "v": "blk.{i}.attn_v", "g": "blk.{i}.attn_gate", "o": "blk.{i}.attn_output",
                       "gate": "blk.{i}.ffn_gate", "up": "blk.{i}.ffn_up", "down": "blk.{i}.ffn_down",
                       "loop_init": "hrm.z_l_init#"}
# Routed feed-forwards. Expert roles name whole tensors ({e}: the expert); see decoder/layout.py.
_M = _L + "mlp."
QWEN_MOE_NAMES = _with(LLAMA_NAMES, gate=None, up=None, down=None, router=_M + "gate",
                       exp_gate=_M + "experts.{e}.gate_proj.weight", exp_up=_M + "experts.{e}.up_proj.weight",
                       exp_down=_M + "experts.{e}.down_proj.weight")
# Dense layers beside routed ones keep the Llama names of gate/up/down.
QWEN_MOE_DENSE_NAMES = _with(QWEN_MOE_NAMES, gate=_M + "gate_proj", up=_M + "up_proj", down=_M + "down_proj")
QWEN2_MOE_NAMES = _with(QWEN_MOE_DENSE_NAMES, shexp_gate=_M + "shared_expert.gate_proj",
                        shexp_up=_M + "shared_expert.up_proj", shexp_down=_M + "shared_expert.down_proj",
                        shexp_gate_inp=_M + "shared_expert_gate")
# DeepSeek-V3-style routers (sigmoid scores, a selection-only bias) beside shared experts (group H2).
GLM4_MOE_NAMES = _with(QWEN_MOE_DENSE_NAMES, router_select_bias=_M + "gate.e_score_correction_bias",
                       shexp_gate=_M + "shared_experts.gate_proj", shexp_up=_M + "shared_experts.up_proj",
                       shexp_down=_M + "shared_experts.down_proj")
EXAONE_MOE_NAMES = _with(GLM4_MOE_NAMES, router_select_bias=_M + "e_score_correction_bias")
SARVAM_MOE_NAMES = _with(GLM4_MOE_NAMES, embed="model.word_embeddings", q=None, k=None, v=None,
                         qkv=_L + "attention.query_key_value", o=_L + "attention.dense",
                         q_norm=_L + "attention.query_layernorm", k_norm=_L + "attention.key_layernorm",
                         router_select_bias=_M + "gate.expert_bias")
HY_V3_NAMES = _with(GLM4_MOE_NAMES, router=_M + "router.gate", router_select_bias=_M + "expert_bias",
                    shexp_gate=_M + "shared_mlp.gate_proj", shexp_up=_M + "shared_mlp.up_proj",
                    shexp_down=_M + "shared_mlp.down_proj")
ERNIE_MOE_NAMES = _with(GLM4_MOE_NAMES, router_select_bias=_M + "moe_statics.e_score_correction_bias")
HUNYUAN_MOE_NAMES = _with(QWEN_MOE_NAMES, q_norm=_L + "self_attn.query_layernorm",
                          k_norm=_L + "self_attn.key_layernorm", router=_M + "gate.wg",
                          shexp_gate=_M + "shared_mlp.gate_proj", shexp_up=_M + "shared_mlp.up_proj",
                          shexp_down=_M + "shared_mlp.down_proj")
# FlexOlmo: OLMo 2's post-norm block around OLMoE's experts.
FLEX_OLMO_NAMES = _with(QWEN_MOE_NAMES, attn_post_norm=_L + "post_attention_layernorm",
                        ffn_post_norm=_L + "post_feedforward_layernorm")
_SM = _L + "block_sparse_moe."
MIXTRAL_NAMES = _with(LLAMA_NAMES, gate=None, up=None, down=None, router=_SM + "gate",
                      exp_gate=_SM + "experts.{e}.w1.weight", exp_up=_SM + "experts.{e}.w3.weight",
                      exp_down=_SM + "experts.{e}.w2.weight")
# GraniteMoE: every expert's gate and up rows stacked in input_linear [E, 2 * size, hidden], downs in
# output_linear [E, hidden, size]; the shared expert (GraniteMoE-Shared) fuses its gate and up the same way.
GRANITEMOE_NAMES = _with(LLAMA_NAMES, gate=None, up=None, down=None, router=_SM + "router.layer",
                         exp_gate_up=_SM + "input_linear.weight", exp_down=_SM + "output_linear.weight")
GRANITEMOE_SHARED_NAMES = _with(GRANITEMOE_NAMES, shexp_gate_up=_L + "shared_mlp.input_linear",
                                shexp_down=_L + "shared_mlp.output_linear")
# GraniteMoE-SWA as Transformers 5 saves it: the same stacks under Transformers 5's expert names.
GRANITEMOE_SWA_NAMES = _with(GRANITEMOE_SHARED_NAMES, router=_SM + "router",
                             sinks=_L + "self_attn.sinks",
                             exp_gate_up=_SM + "experts.gate_up_proj", exp_down=_SM + "experts.down_proj")
# DBRX: everything below transformer.; each layer's experts stacked by rows [E * size, hidden] in w1
# (gate), v1 (up) and w2 (down, stored [size, hidden] per expert: inputs first).
_X = "transformer.blocks.{i}."
DBRX_NAMES: Mapping[str, str] = {
    "embed": "transformer.wte", "final_norm": "transformer.norm_f", "head": "lm_head",
    "attn_norm": _X + "norm_attn_norm.norm_1", "ffn_norm": _X + "norm_attn_norm.norm_2",
    "qkv": _X + "norm_attn_norm.attn.Wqkv", "o": _X + "norm_attn_norm.attn.out_proj",
    "router": _X + "ffn.router.layer", "exp_gate": _X + "ffn.experts.mlp.w1", "exp_up": _X + "ffn.experts.mlp.v1",
    "exp_down": _X + "ffn.experts.mlp.w2",
}
# gpt-oss: stacked experts stored inputs-first with their biases, gate and up interleaved (layout.py).
GPT_OSS_NAMES = _with(LLAMA_NAMES, gate=None, up=None, down=None, sinks=_L + "self_attn.sinks",
                      router=_M + "router",
                      exp_gate_up=_M + "experts.gate_up_proj", exp_gate_up_bias=_M + "experts.gate_up_proj_bias",
                      exp_down=_M + "experts.down_proj", exp_down_bias=_M + "experts.down_proj_bias")
# Cohere 2 MoE: one input norm (parallel block); experts stored one module each, as Transformers saves them.
COHERE2_MOE_NAMES = _with(QWEN_MOE_DENSE_NAMES, ffn_norm=None, shexp_gate=_M + "shared_experts.gate_proj",
                          shexp_up=_M + "shared_experts.up_proj", shexp_down=_M + "shared_experts.down_proj")
# AFMoE: sandwich norms, a gated attention output, a router module with a selection bias beside it.
AFMOE_NAMES = _with(QWEN_MOE_DENSE_NAMES, attn_post_norm=_L + "post_attention_layernorm",
                    ffn_norm=_L + "pre_mlp_layernorm", ffn_post_norm=_L + "post_mlp_layernorm",
                    g=_L + "self_attn.gate_proj", router=_M + "router.gate",
                    router_select_bias=_M + "expert_bias", shexp_gate=_M + "shared_experts.gate_proj",
                    shexp_up=_M + "shared_experts.up_proj", shexp_down=_M + "shared_experts.down_proj")
# Llama 4's text decoder: feed_forward.* for the dense MLP, the router, stacked experts stored
# inputs-first ([E, hidden, 2 * size]: gate columns, then up) and the shared expert.
_F = _L + "feed_forward."
LLAMA4_NAMES = _with(LLAMA_NAMES, gate=_F + "gate_proj", up=_F + "up_proj", down=_F + "down_proj",
                     router=_F + "router", exp_gate_up=_F + "experts.gate_up_proj", exp_down=_F + "experts.down_proj",
                     shexp_gate=_F + "shared_expert.gate_proj", shexp_up=_F + "shared_expert.up_proj",
                     shexp_down=_F + "shared_expert.down_proj")
MIMO_V2_NAMES = _with(QWEN_MOE_DENSE_NAMES, router_select_bias=_M + "gate.e_score_correction_bias",
                      sinks=_L + "self_attn.attention_sink_bias")
LAGUNA_NAMES = _with(QWEN_MOE_DENSE_NAMES, router_select_bias=_M + "experts.e_score_correction_bias",
                     shexp_gate=_M + "shared_expert.gate_proj", shexp_up=_M + "shared_expert.up_proj",
                     shexp_down=_M + "shared_expert.down_proj", g=_L + "self_attn.g_proj", sinks=_L + "self_attn.sink")
STEP3P5_NAMES = _with(LLAMA_NAMES, router=_L + "moe.gate", router_select_bias=_L + "moe.router_bias",
                      exp_gate=_L + "moe.gate_proj.weight", exp_up=_L + "moe.up_proj.weight",
                      exp_down=_L + "moe.down_proj.weight", shexp_gate=_L + "share_expert.gate_proj",
                      shexp_up=_L + "share_expert.up_proj", shexp_down=_L + "share_expert.down_proj",
                      g=_L + "self_attn.g_proj")
MINIMAX_M2_NAMES = _with(MIXTRAL_NAMES, router_select_bias=_SM + "e_score_correction_bias")
# InternLM2: Llama's block under its own names; wqkv holds each key/value group's queries, key and
# value in turn (fused_qkv "grouped").
_IL = "model.layers.{i}."
INTERNLM2_NAMES: Mapping[str, str] = {
    "embed": "model.tok_embeddings", "final_norm": "model.norm", "head": "output",
    "attn_norm": _IL + "attention_norm", "ffn_norm": _IL + "ffn_norm", "qkv": _IL + "attention.wqkv",
    "o": _IL + "attention.wo", "gate": _IL + "feed_forward.w1", "up": _IL + "feed_forward.w3",
    "down": _IL + "feed_forward.w2",
}
# openPangu-Embedded under sandwich_norm: the norm after attention keeps Llama's post_attention_layernorm name.
PANGU_SANDWICH_NAMES = _with(LLAMA_NAMES, attn_post_norm=_L + "post_attention_layernorm",
                             ffn_norm=_L + "pre_mlp_layernorm", ffn_post_norm=_L + "post_mlp_layernorm")
# TeleChat2 / TeleChat2.5: Llama's block below transformer.; keys and values in one key_value matrix
# whose rows hold, per key/value head, its key and then its value (layout's fused "kv").
_T = "transformer.h.{i}."
TELECHAT_NAMES: Mapping[str, str] = {
    "embed": "transformer.word_embeddings", "final_norm": "transformer.ln_f", "head": "lm_head",
    "attn_norm": _T + "input_layernorm", "ffn_norm": _T + "post_attention_layernorm",
    "q": _T + "self_attention.query", "kv": _T + "self_attention.key_value", "o": _T + "self_attention.dense",
    "gate": _T + "mlp.gate_proj", "up": _T + "mlp.up_proj", "down": _T + "mlp.down_proj",
}
# PLaMo 3: Llama's block under model.layers.layers.{i} with sandwich norms (pre_/post_ mixer and mlp norms),
# q, k and v stacked in mixer.qkv_proj, gate rows above up rows in mlp.gate_up_proj.
_P3 = "model.layers.layers.{i}."
PLAMO3_NAMES: Mapping[str, str] = {
    "embed": "model.embed_tokens", "final_norm": "model.norm", "head": "lm_head",
    "attn_norm": _P3 + "pre_mixer_norm", "attn_post_norm": _P3 + "post_mixer_norm",
    "ffn_norm": _P3 + "pre_mlp_norm", "ffn_post_norm": _P3 + "post_mlp_norm",
    "qkv": _P3 + "mixer.qkv_proj", "o": _P3 + "mixer.o_proj", "q_norm": _P3 + "mixer.q_norm",
    "k_norm": _P3 + "mixer.k_norm", "gate_up": _P3 + "mlp.gate_up_proj", "down": _P3 + "mlp.down_proj",
}
# K2-Horizon: Qwen-MoE's names with the router's selection bias stored as mlp.gate.bias, shared experts under
# mlp.shared_experts, an output gate at self_attn.gate_proj and MoVA's value experts (self_attn.v_experts.{e},
# chosen by self_attn.v_router).
K2_HORIZON_NAMES = _with(QWEN_MOE_DENSE_NAMES, router_select_bias=_M + "gate.bias",
                         shexp_gate=_M + "shared_experts.gate_proj", shexp_up=_M + "shared_experts.up_proj",
                         shexp_down=_M + "shared_experts.down_proj", g=_L + "self_attn.gate_proj",
                         v_router=_L + "self_attn.v_router", v_router_select_bias=_L + "self_attn.v_router.bias",
                         v_exp=_L + "self_attn.v_experts.{k}")
# DeepSeek-MoE (model_type deepseek): Qwen-MoE's names, shared experts under mlp.shared_experts, no selection bias.
DEEPSEEK_MOE_NAMES = _with(GLM4_MOE_NAMES, router_select_bias=None)
_H = "transformer.h.{i}."
GPT2_NAMES: Mapping[str, str] = {
    "embed": "transformer.wte", "pos_embed": "transformer.wpe", "final_norm": "transformer.ln_f", "head": "lm_head",
    "attn_norm": _H + "ln_1", "ffn_norm": _H + "ln_2", "qkv": _H + "attn.c_attn", "o": _H + "attn.c_proj",
    "up": _H + "mlp.c_fc", "down": _H + "mlp.c_proj",
}
GPTJ_NAMES: Mapping[str, str] = {
    "embed": "transformer.wte", "final_norm": "transformer.ln_f", "head": "lm_head", "attn_norm": _H + "ln_1",
    "q": _H + "attn.q_proj", "k": _H + "attn.k_proj", "v": _H + "attn.v_proj", "o": _H + "attn.out_proj",
    "up": _H + "mlp.fc_in", "down": _H + "mlp.fc_out",
}
EXAONE_NAMES: Mapping[str, str] = {
    "embed": "transformer.wte", "final_norm": "transformer.ln_f", "head": "lm_head",
    "attn_norm": _H + "ln_1", "ffn_norm": _H + "ln_2", "q": _H + "attn.attention.q_proj",
    "k": _H + "attn.attention.k_proj", "v": _H + "attn.attention.v_proj", "o": _H + "attn.attention.out_proj",
    "gate": _H + "mlp.c_fc_0", "up": _H + "mlp.c_fc_1", "down": _H + "mlp.c_proj",
}
BLOOM_NAMES: Mapping[str, str] = {
    "embed": "transformer.word_embeddings", "embed_norm": "transformer.word_embeddings_layernorm",
    "final_norm": "transformer.ln_f", "head": "lm_head", "attn_norm": _H + "input_layernorm",
    "ffn_norm": _H + "post_attention_layernorm", "qkv": _H + "self_attention.query_key_value",
    "o": _H + "self_attention.dense", "up": _H + "mlp.dense_h_to_4h", "down": _H + "mlp.dense_4h_to_h",
}
FALCON_NAMES = _with(BLOOM_NAMES, embed_norm=None)
FALCON_NEW_NAMES = _with(FALCON_NAMES, attn_norm=_H + "ln_attn", ffn_norm=_H + "ln_mlp")


def _neox_head_dim_differs(c: Mapping) -> bool:
    """GPT-NeoX's config states a head_dim that is not hidden_size // num_attention_heads."""
    hd, d, h = c.get("head_dim"), c.get("hidden_size"), c.get("num_attention_heads")
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (hd, d, h))
    return ints and h > 0 and hd != d // h


_N = "gpt_neox.layers.{i}."
GPT_NEOX_NAMES: Mapping[str, str] = {
    "embed": "gpt_neox.embed_in", "final_norm": "gpt_neox.final_layer_norm", "head": "embed_out",
    "attn_norm": _N + "input_layernorm", "ffn_norm": _N + "post_attention_layernorm",
    "qkv": _N + "attention.query_key_value", "o": _N + "attention.dense",
    "up": _N + "mlp.dense_h_to_4h", "down": _N + "mlp.dense_4h_to_h",
}
_D = "model.decoder.layers.{i}."
OPT_NAMES: Mapping[str, str] = {
    "embed": "model.decoder.embed_tokens", "pos_embed": "model.decoder.embed_positions",
    "final_norm": "model.decoder.final_layer_norm", "head": "lm_head",
    "attn_norm": _D + "self_attn_layer_norm", "ffn_norm": _D + "final_layer_norm",
    "q": _D + "self_attn.q_proj", "k": _D + "self_attn.k_proj", "v": _D + "self_attn.v_proj",
    "o": _D + "self_attn.out_proj", "up": _D + "fc1", "down": _D + "fc2",
}
_B = "transformer.blocks.{i}."
MPT_NAMES: Mapping[str, str] = {
    "embed": "transformer.wte", "final_norm": "transformer.norm_f", "head": "lm_head",
    "attn_norm": _B + "norm_1", "ffn_norm": _B + "norm_2", "qkv": _B + "attn.Wqkv", "o": _B + "attn.out_proj",
    "up": _B + "ffn.up_proj", "down": _B + "ffn.down_proj",
}

# llama.cpp's GGUF tensor names for the same roles (src/llama-arch.cpp's LLM_TENSOR_* table).
GGUF_NAMES: Mapping[str, str] = {
    "embed": "token_embd",
    "final_norm": "output_norm",
    "head": "output",
    "attn_norm": "blk.{i}.attn_norm",
    "attn_post_norm": "blk.{i}.post_attention_norm",
    "ffn_norm": "blk.{i}.ffn_norm",
    "ffn_post_norm": "blk.{i}.post_ffw_norm",
    "q": "blk.{i}.attn_q",
    "k": "blk.{i}.attn_k",
    "v": "blk.{i}.attn_v",
    "o": "blk.{i}.attn_output",
    "q_norm": "blk.{i}.attn_q_norm",
    "k_norm": "blk.{i}.attn_k_norm",
    "gate": "blk.{i}.ffn_gate",
    "up": "blk.{i}.ffn_up",
    "down": "blk.{i}.ffn_down",
    "qkv": "blk.{i}.attn_qkv",  # read when a file fuses q, k and v (llama.cpp's create_tensor_qkv)
    # Routed layers: the router (ffn_gate_inp), its selection bias (exp_probs_b), the experts as
    # [n_expert, rows, cols] stacks (ffn_*_exps, whole names) and the shared expert (ffn_*_shexp,
    # gated by ffn_gate_inp_shexp). Read only on layers whose LayerSpec.ffn is "moe".
    "router": "blk.{i}.ffn_gate_inp", "router_select_bias": "blk.{i}.exp_probs_b.bias",
    "exp_gate": "blk.{i}.ffn_gate_exps.weight", "exp_up": "blk.{i}.ffn_up_exps.weight",
    "exp_down": "blk.{i}.ffn_down_exps.weight", "exp_gate_bias": "blk.{i}.ffn_gate_exps.bias",
    "exp_up_bias": "blk.{i}.ffn_up_exps.bias", "exp_down_bias": "blk.{i}.ffn_down_exps.bias",
    "shexp_gate": "blk.{i}.ffn_gate_shexp", "shexp_up": "blk.{i}.ffn_up_shexp",
    "shexp_down": "blk.{i}.ffn_down_shexp", "shexp_gate_inp": "blk.{i}.ffn_gate_inp_shexp",
    # Attention extras: per-head sinks (a whole name, gpt-oss) and the output gate (AFMoE's attn_gate).
    "sinks": "blk.{i}.attn_sinks.weight", "g": "blk.{i}.attn_gate",
}
GGUF_PLAIN_MLP_NAMES = _with(GGUF_NAMES, gate=None)
# llama.cpp's plamo3: q, k, v fused in attn_qkv, gate rows above up rows in ffn_up, and the post-sublayer norms
# under whole names without a suffix (its loader's tn(LLM_TENSOR_ATTN_POST_NORM, i); "#": stored without one).
GGUF_PLAMO3_NAMES = _with(GGUF_NAMES, q=None, k=None, v=None, gate=None, up=None, gate_up="blk.{i}.ffn_up",
                          attn_post_norm=("blk.{i}.post_attention_norm#", "blk.{i}.post_attention_norm"),
                          ffn_post_norm=("blk.{i}.post_ffw_norm#", "blk.{i}.post_ffw_norm"))
# gpt-oss: the norm before the feed-forward is stored as post_attention_norm (llama.cpp's attn_post_norm).
GGUF_GPT_OSS_NAMES = _with(GGUF_NAMES, ffn_norm="blk.{i}.post_attention_norm")
GGUF_PHI3_NAMES = _with(GGUF_NAMES, q=None, k=None, v=None, gate=None, up=None, gate_up="blk.{i}.ffn_up")
GGUF_LEARNED_POS_NAMES = _with(GGUF_PLAIN_MLP_NAMES, pos_embed="position_embd")
GGUF_BLOOM_NAMES = _with(GGUF_PLAIN_MLP_NAMES, embed_norm="token_embd_norm")
# llama.cpp's Falcon: attention reads attn_norm_2 when the file has it (Falcon-40B's ln_attn), else
# attn_norm; the feed-forward reads attn_norm (ln_mlp, or the one shared norm).
GGUF_FALCON_NAMES = _with(GGUF_PLAIN_MLP_NAMES, attn_norm=("blk.{i}.attn_norm_2", "blk.{i}.attn_norm"),
                          ffn_norm="blk.{i}.attn_norm")
# llama.cpp's granite_swa (GraniteMoE-SWA): per-head sinks, each layer's expert gate and up kept fused in
# ffn_gate_up_exps and the shared expert's in ffn_up_shexp (gate rows first, as Transformers stores them).
GGUF_GRANITE_SWA_NAMES = _with(GGUF_NAMES, sinks="blk.{i}.attn_sinks.weight", exp_gate=None, exp_up=None,
                               exp_gate_up="blk.{i}.ffn_gate_up_exps.weight", shexp_gate=None, shexp_up=None,
                               shexp_gate_up="blk.{i}.ffn_up_shexp")
# llama.cpp's state-space tensors (src/llama-arch.cpp): ssm_a holds -exp(A_log), Mamba-2's ssm_dt
# only its bias (dt_bias), ssm_norm the gated norm as [groups, d_inner / groups].
GGUF_SSM_NAMES = _with(GGUF_NAMES, ssm_in="blk.{i}.ssm_in", ssm_conv="blk.{i}.ssm_conv1d", ssm_x="blk.{i}.ssm_x",
                       ssm_dt="blk.{i}.ssm_dt", ssm_dt_bias="blk.{i}.ssm_dt.bias", ssm_a="blk.{i}.ssm_a",
                       ssm_d="blk.{i}.ssm_d", ssm_norm="blk.{i}.ssm_norm", ssm_out="blk.{i}.ssm_out",
                       ssm_dt_norm="blk.{i}.ssm_dt_norm", ssm_b_norm="blk.{i}.ssm_b_norm",
                       ssm_c_norm="blk.{i}.ssm_c_norm")

# Config keys a family reads for each normalised field, first found wins. A family's
# ``keys`` replaces the list of the fields it names (``()``: never read, use the default).
DEFAULT_KEYS: Mapping[str, tuple[str, ...]] = {
    "vocab_size": ("vocab_size",),
    "hidden_size": ("hidden_size",),
    "intermediate_size": ("intermediate_size",),
    "num_hidden_layers": ("num_hidden_layers",),
    "num_attention_heads": ("num_attention_heads",),
    "num_key_value_heads": ("num_key_value_heads",),
    "head_dim": ("head_dim",),
    "max_position_embeddings": ("max_position_embeddings",),
    "norm_eps": ("rms_norm_eps", "layer_norm_eps", "norm_epsilon", "norm_eps", "layer_norm_epsilon"),
    "rope_theta": ("rope_theta",),
    "partial_rotary_factor": ("partial_rotary_factor",),
    "rotary_dim": (),  # rotated width of a head, when a family states it absolutely (GPT-J)
    "v_head_dim": (),  # width of a value head, when a family's differs from its keys' (MiMo-V2-Flash)
    "act": ("hidden_act", "hidden_activation"),
    # Mixture-of-experts (read only by families with ``moe``; see ``config.moe_spec``).
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"),
    "num_experts_per_tok": ("num_experts_per_tok", "moe_top_k"),
    "moe_intermediate_size": ("moe_intermediate_size",),
    "shared_intermediate_size": ("shared_expert_intermediate_size", "shared_intermediate_size"),
    "n_shared_experts": ("n_shared_experts", "num_shared_experts"),
    "norm_topk_prob": ("norm_topk_prob",),
    "routed_scaling_factor": ("routed_scaling_factor",),
    "n_group": ("n_group",),
    "topk_group": ("topk_group",),
    "scoring_func": ("scoring_func",),
    "topk_method": ("topk_method",),
    "swiglu_limit": ("swiglu_limit",),
    "router_jitter_noise": ("router_jitter_noise",),  # SparseMixer's closeness bound (PhiMoE)
    "renorm_min": (),  # a floor under the renormalising sum (ERNIE 4.5's moe_norm_min)
    "swiglu_alpha": ("swiglu_alpha",),
    "router_logit_softcap": (),  # a cap on the router's logits (Laguna's moe_router_logit_softcapping)
    "router_sink": (),  # shared experts the router scores beside the routed ones (Inkling's n_shared_experts)
    "logits_kept": (),  # the logits scored, of a head padded past them (Inkling's unpadded_vocab_size)
    # Multi-head latent attention (read only by families with ``latent``; see ``config.latent_spec``).
    "kv_lora_rank": ("kv_lora_rank",),
    "q_lora_rank": ("q_lora_rank",),
    "qk_nope_head_dim": ("qk_nope_head_dim",),
    "qk_rope_head_dim": ("qk_rope_head_dim",),
    "moe_latent_size": (),  # the routed experts' latent width (Nemotron-H's moe_latent_size)
    "identity_experts": (),  # experts returning their input, beside the routed ones (LongCat-Flash)
    # DeepSeek Sparse Attention's indexer (read only by families with ``indexer``; ``config.indexer_spec``).
    "index_n_heads": ("index_n_heads",), "index_head_dim": ("index_head_dim",), "index_topk": ("index_topk",),
    "index_kpool": ("index_kpool",), "index_kpool_always_select_tail": ("index_kpool_always_select_tail",),
    # Hyper-connections' residual streams (read only by families with ``streams``; ``config.streams_spec``).
    "hc_mult": ("hc_mult",), "hc_eps": ("hc_eps",), "hc_magnitude": ("hc_magnitude",),
    "hc_sinkhorn_iters": ("hc_sinkhorn_iters",),
    # State-space scans (read only by families with ``recurrent``; see ``config.ssm_spec``).
    "ssm_state_size": (), "ssm_conv_kernel": (), "ssm_expand": (), "ssm_inner_size": (), "ssm_dt_rank": (),
    "ssm_num_heads": (), "ssm_head_dim": (), "ssm_groups": (), "ssm_dt_limit": ("time_step_limit",),
    "ssm_norm_eps": (), "ssm_bcdt_eps": (), "ssm_act": (),
    # Delta-rule linear attention (read only by families whose ``recurrent`` is gated_delta or kda;
    # see ``config.delta_spec``).
    "delta_k_heads": (), "delta_k_dim": (), "delta_v_heads": (), "delta_v_dim": (), "delta_conv_kernel": (),
    "delta_norm_eps": (), "delta_beta_double": (), "delta_lower_bound": (),
    # Per-layer inputs (Gemma 4's E models): their width, and the rows of their table.
    "per_layer_input": (), "per_layer_vocab": (),
}
# GPT-style spellings, read where Llama's are missing (seed 002, "Families with their own tensor paths").
GPT_KEYS: Mapping[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "n_embed"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "num_key_value_heads": (),  # multi-head attention: as many key/value heads as heads
    "head_dim": (),
    "max_position_embeddings": ("max_position_embeddings", "n_positions"),
    "intermediate_size": ("n_inner",),
    "act": ("activation_function",),
}


@dataclass(frozen=True)
class Variant:
    """Field changes a family takes when ``when(config)`` holds (applied in order, later wins)."""

    when: Callable[[Mapping], bool]
    changes: Mapping[str, Any]


@dataclass(frozen=True)
class Refusal:
    """A configuration the decoder does not run: ``why`` is said when ``when(config)`` holds."""

    when: Callable[[Mapping], bool]
    why: str


def _lookup(config: Mapping, key: str, sub: str | None) -> Any:
    """``config[key]``, or ``config[sub][key]`` when ``sub`` is given; None when absent."""
    c = config.get(sub) or {} if sub else config
    return c.get(key) if isinstance(c, Mapping) else None


def flag(key: str, default: bool = False, *, sub: str | None = None) -> Callable[[Mapping], bool]:
    """Predicate: the config's boolean ``key`` (inside the object ``sub`` if given) is true."""
    def when(config: Mapping) -> bool:
        value = _lookup(config, key, sub)
        return bool(default if value is None else value)
    return when


def unset(key: str, default: bool = True) -> Callable[[Mapping], bool]:
    """Predicate: the config's boolean ``key`` (``default`` when absent) is false."""
    is_set = flag(key, default)
    return lambda config: not is_set(config)


def stated(key: str, *, sub: str | None = None, unless: Any = None) -> Callable[[Mapping], bool]:
    """Predicate: ``key`` is present with a value other than None / false / ``unless``."""
    def when(config: Mapping) -> bool:
        value = _lookup(config, key, sub)
        return value is not None and value is not False and value != unless
    return when


@dataclass(frozen=True)
class FamilySpec:
    """What one family adds to the generic decoder, as data.

    Attributes:
        model_type: the config.json ``model_type``.
        gguf_arch: llama.cpp's ``general.architecture`` for this family, if it has one.
        gguf_qk_permuted: llama.cpp's converter reorders q/k rows of this architecture for its
            adjacent-pair rotation (``LlamaModel.permute``); loading undoes it.
        keys: normalised field -> config keys read for it (see ``DEFAULT_KEYS``); a dotted key
            reads inside an object of the config (DBRX's ``attn_config.kv_n_heads``).
        fixed: normalised field -> value the family fixes whatever the config says.
        norm: ``"rms"`` or ``"layer"``.
        norm_unit_offset: norm weights are stored as ``w`` and applied as ``1 + w`` (Gemma, Nemotron).
        norm_affine: norms carry a weight (False: OLMo's parameter-free LayerNorm).
        norms: which of the four sublayer norms the block has: ``attn_norm`` / ``ffn_norm``
            before each sublayer, ``attn_post_norm`` / ``ffn_post_norm`` over its output.
        parallel: attention and feed-forward read the same residual and add to it together;
            the feed-forward reads ``ffn_norm`` of it, or attention's normed input without one.
        qk_norm: ``None``, ``"head"`` (norm over each head's query/key, Qwen3, Gemma 3; the
            weight may be per head, Cohere, StableLM) or ``"proj"`` (over the whole projection, OLMo 2).
        qk_norm_after_rope: the q/k norms apply to the rotated query/key (HunYuan).
        qk_norm_optional: the q/k norms apply only when the weights hold them (llama.cpp reads
            StableLM's and Command R's by presence; their GGUF metadata does not say).
        embed_scale_sqrt_hidden: multiply embeddings by sqrt(hidden_size) (Gemma).
        embed_norm: a norm over the embeddings (BLOOM's word_embeddings_layernorm).
        positions: ``"rope"``, ``"learned"`` (a table added to the embeddings, row
            ``position_offset`` for position 0), ``"alibi"`` (a per-head linear score bias) or
            ``"none"`` (no position signal: Jamba's and Nemotron-H's attention, state-space models).
        alibi_scaled: the ALiBi bias is added before the scores' 1/sqrt(head_dim) scale (Falcon).
        alibi_bf16: the ALiBi bias is computed in bfloat16, as the family's reference does (Falcon).
        norm_offsets: sublayer norm role -> a number added to its stored weight in place of
            ``norm_unit_offset``'s one (PLaMo 3's post_mixer_norm 1/5, post_mlp_norm 5 ** -1.5).
        value_experts_keys: config keys of (the value experts' count, those chosen per token): the routed
            layers take their values from value experts (K2-Horizon's MoVA; ``config.value_router_spec``).
        norm_groups_key: config key of the number of equal groups the hidden-width RMS norms normalise
            apart (K2-Horizon's layernorm_num_groups).
        alibi_sqrt: the ALiBi bias is -slope * sqrt(distance), the distance measured from each query's
            absolute position (Step1), rather than slope * key position.
        rope_interleaved: rotary pairs are adjacent (GPT-J, Cohere, GLM) rather than halves.
        rope_layers: which layers rotate: ``"all"``, ``"sliding"`` (only sliding-window layers,
            Cohere 2), ``"sliding_or_dense"`` (those and the dense feed-forward layers, Cohere 2 MoE)
            or ``"sliding_if_windowed"`` (only sliding layers once the model has any, EXAONE 4).
        default_act: activation when the config names none.
        sliding: how per-layer sliding windows are placed when the config has no
            ``layer_types``: ``"none"``, ``"all"`` (every layer when ``sliding_window`` is set),
            ``"never"`` (no window, not even on the layers ``layer_types`` marks sliding: the family's
            Transformers attention has none),
            ``"qwen2"`` (``use_sliding_window`` from ``max_window_layers`` on),
            ``"qwen2_moe"`` (``use_sliding_window`` on layers 0, 2, 4, ... below ``max_window_layers``),
            ``"switched"`` (every layer when ``use_sliding_window`` is on, Qwen3 MoE),
            ``"even"`` (layers 0, 2, 4, ...), ``"pattern"`` (all but every
            ``sliding_window_pattern``-th layer), ``"pattern_first"`` (all but layers 0, p, 2p, ...),
            ``"prefix_pattern"`` (``"pattern"`` over the first ``first_k_dense_replace`` layers with
            period ``prefix_dense_sliding_window_pattern``, then over the rest, Cohere 2 MoE).
        rope_whole_head: rotation turns every channel of a head, whatever ``partial_rotary_factor`` /
            ``rotary_dim`` say (Transformers' default tables for the family never read them); another rope
            type with a share other than 1 is refused.
        sliding_pattern: the pattern period when the config states none.
        sliding_pattern_key: the config key of the pattern period (AFMoE: global_attn_every_n_layers).
        local_rope_key: config key of the rotary base for sliding layers (Gemma 3).
        no_rope_key: config key of a per-layer list where 0 switches rotation off (SmolLM3).
        layer_rope_key: config key of a per-layer rotary base, 0 for no rotation (Granite SWA).
        attn_scale_key: config key whose value s sets the score scale to s**-0.5 (Gemma 2/3).
        attn_multiplier_key: config key whose value is the score scale itself (Granite).
        attn_unscaled: scores are not scaled at all.
        attn_softcap_key / final_softcap_key: config keys of the soft-caps (Gemma 2).
        embed_multiplier_key / residual_multiplier_key: config keys of scales on the embeddings
            and on each sublayer's output (Granite).
        logit_scale_key: config key of a factor on the logits; ``logit_scale_divides``: the
            logits are divided by it instead (Granite's logits_scaling).
        clip_qkv_key: config key of a bound the query/key/value projections are clamped to.
        query_temperature: Llama 4's position-dependent query scale: ``"rope_parameters"`` (from
            llama_4_scaling_beta, on every layer, Ministral 3) or ``"unrotated_layers"`` (from
            attn_temperature_tuning, attn_scale and floor_scale, on the layers that do not rotate,
            Llama 4's text decoder).
        qk_norm_layers: which layers apply the q/k norms: ``"all"`` or ``"rotated"`` (Llama 4).
        qk_norm_affine: the q/k norms carry weights (False: weightless RMS norms, Llama 4's L2 norm).
        chunk_key: config key of the chunk of chunked attention (Llama 4's attention_chunk_size),
            whose layers are the ``chunked_attention`` ones of ``layer_types`` (else the rotating ones).
        config_defaults: config keys -> the value Transformers' config class gives them when a
            config.json leaves them out (read as if stated).
        decoder_prefix: the prefix a wrapper's tensors of this decoder sit below (``stored_under``);
            tensors outside it belong to the wrapper's other towers.
        sinks: a learned per-head attention sink (``sinks`` role: the whole tensor name) on every
            layer (True), or only on ``"sliding"`` or ``"full"`` attention layers.
        value_scale_key: config key of a factor on every value (MiMo-V2-Flash).
        attn_gate: ``"sigmoid"`` or ``"softplus"`` of the ``g`` projection scales each head's
            attention output (``attn_gate_per_head``) or each of its elements.
        expert_limit_keys: config keys of per-layer lists of the routed and the shared experts'
            SwiGLU clamps (0 or null: none; Step 3.5's swiglu_limits, swiglu_limits_shared).
        unread: name prefixes of stored tensors the forward never reads (multi-token-prediction
            modules; the ``num_nextn_predict_layers`` layers after the last are added from the config).
        normalize: rewrites the family's own config spellings (its hub config.json, or defaults
            Transformers derives from other keys) into the keys ``config.py`` reads (``layer_types``,
            ``mlp_layer_types``, ``rope_parameters`` per layer type, ``per_layer_config``, ...);
            applied before variants, refusals and fields are read.
        ffn_mult_key / ffn_mult: the feed-forward width as a multiple of hidden_size when the
            config states no width (``ffn_mult_key`` names the multiple's key).
        fused_qkv: how a fused ``qkv`` tensor's rows are laid out: ``"concat"`` (all queries,
            keys, values) or ``"grouped"`` (per key/value head: its queries, key, value).
        inputs_first: linear weights are stored [in, out] (GPT-2's Conv1D).
        root: prefix a checkpoint saved from the base model leaves off its names.
        tie_default: whether the head is tied to the embedding when the config does not say.
        head_untied: the head is never the embedding, whatever tie_word_embeddings says (Transformers' model
            for the family ties no weights).
        names: role -> Hugging Face tensor name prefix (``.weight`` / ``.bias`` appended).
        gguf_names: role -> llama.cpp tensor name prefix (a tuple lists alternatives, first found wins).
        variants: config-driven changes to these fields (``Variant``).
        refusals: configurations refused before any weight is read (``Refusal``; they see the
            config after ``normalize``).
        gguf_config: llama.cpp metadata key (after ``{arch}.``) -> the config.json key it
            stands for; the GGUF path reads the family's variants and scales through it.
        gguf_changes: fields llama.cpp reads differently for this architecture.
        gguf_refusals: ``Refusal``s over that renamed metadata, for GGUF files.
        defaults: normalised field -> value when the config states none under ``keys``
            (Transformers' config defaults, where they differ from the Llama ones).
        moe: the family routes its feed-forward through experts on the layers its config
            marks (``config.moe_layer_flags``); the router and expert sizes are read under
            ``keys`` (``DEFAULT_KEYS``' mixture-of-experts fields) and ``fixed``.
        moe_defaults: values of those fields when the config states none (Transformers'
            config defaults for the family).
        moe_fields: ``RouterSpec`` / ``MoESpec`` fields the family fixes in code
            (``on_input``, ``glu``, ``renorm_eps``, ``group_rank``, ...).
        shared_gated: the shared experts' output is gated by ``sigmoid(shexp_gate_inp(x))``.
        expert_inputs_first / expert_gate_up_interleaved: expert storage (``ModelSpec``).
        latent: every layer mixes by multi-head latent attention (``decoder/latent.py``), its ranks and
            head widths read under ``DEFAULT_KEYS``' latent fields (``config.latent_spec``).
        latent_rescale: the latent bottlenecks' normed outputs are multiplied by sqrt(hidden_size / rank)
            (``LatentSpec.q_scale`` / ``kv_scale``; LongCat-Flash, Dots3-Note).
        latent_k_rope_norm: the shared rotated key part passes an RMS norm before it rotates
            (``LatentSpec.k_rope_norm``, Dots3-Note).
        latent_model_eps: the bottleneck norms take the model's epsilon, not Transformers' fixed 1e-6.
        shortcut_pairs: each stored layer holds two of ster's layers (``ModelSpec.layers_per_stored``;
            names use ``{half}``), every layer has a dense feed-forward, and the model's routed one reads
            the first layer's feed-forward input and joins the stream at the end of the second
            (``LayerSpec.shortcut``; LongCat-Flash).
        indexer: the latent layers have DeepSeek Sparse Attention's indexer (``decoder/indexer.py``), sized
            by ``index_n_heads``, ``index_head_dim`` and ``index_topk`` (``config.indexer_spec``), each layer's
            kind from ``indexer_types`` (``config.indexer_kinds``); the mapping holds the ``IndexerSpec``
            fields the family fixes in code (``interleaved``, ``rope_last``, ``norm_eps``: a number or
            ``"model"``, the model's epsilon).
        routed_norms: the sublayer norms of the routed layers, when they differ from ``norms``
            (A.X-K1 norms the routed feed-forward's output: ``ffn_post_norm``).
        unconfirmed: no reference implementation here (the family's modelling code lives only in its
            Hub repositories): its math is tested against a Transformers model it equals with its
            extras neutral, and each extra against a reference written from seed 002's words;
            ``ster families`` says so until a real checkpoint or its remote code has confirmed it.
        dense_unread: tensor name prefixes (with ``{i}``) a checkpoint stores on its dense layers that
            the forward never reads (A.X-K1's post_mlp_layernorm, used on routed layers only).
        recurrent: the recurrent mixer (``"mamba"``, ``"mamba2"``, ``"gated_delta"`` or ``"kda"``) of
            the layers its ``layer_types`` (written by ``normalize``) call ``linear_attention``; such a
            family's layer_types may also say ``hybrid`` (attention and the scan side by side), ``mlp``
            and ``moe`` (a layer that is only a feed-forward). A scan's sizes are read under the
            ``ssm_*`` keys (``config.ssm_spec``), a delta rule's under ``delta_*`` (``config.delta_spec``).
        recurrent_norms: the sublayer norms of the ``recurrent`` layers, when they differ from
            ``norms`` (OLMo Hybrid: pre-norm delta-net layers beside post-norm attention layers).
        attn_gate_in_q: each attention head's ``q`` rows are followed by as many output-gate rows
            (Qwen3-Next, Qwen3.5), multiplied in by ``attn_gate``.
        ffn_layers: which layers have a feed-forward: ``"all"``, ``"none"`` (Mamba) or ``"typed"``
            (only the ``mlp`` and ``moe`` layers of layer_types, Nemotron-H).
        ssm_bcdt_norm: Mamba's step, B and C are RMS-normed, ``"weighted"`` or ``"plain"`` (``SSMSpec``).
        ssm_gated_norm: Mamba-2's output passes its grouped, gated RMS norm.
        mup: Falcon-H1's muP multipliers are read (``config.mup_scales``).
        gguf_folded: llama.cpp's converter folds the family's multipliers (muP, embedding, head)
            into the weights, so a GGUF's weights carry them.
        adapters: the adapter targets the family takes: ``"all"``, ``"ffn"`` or ``"none"``.
        reference_hidden: how Transformers lists ``output_hidden_states`` for the family (for
            ``ster parity``): ``"embedding"`` (the embedding, then each layer's output, the last
            one normed), ``"embedding_unnormed"`` (the same, the last one before the final norm:
            Gemma 3n's, whose entries are AltUp's first copy) or ``"layers"`` (Mamba's: each layer's
            output, then the final norm's).
        hybrid_mixer: the mixer of the layers ``layer_types`` calls ``hybrid`` (``"hybrid"``:
            attention and the scan side by side, Falcon-H1; ``"shared_hybrid"``: a shared
            transformer block then the scan, Zamba2).
        sublayer_scales: MiniMax's join: mixer kind (``"attention"``, the family's ``recurrent``)
            or ``"ffn"`` -> the config keys of (alpha, beta): each sublayer adds as
            residual * alpha + output * beta (``LayerSpec.residual``; a key left out: 1).
        residual_normed: with ``sublayer_scales``, the residual is the sublayer's normed input:
            True, False, or the config key saying so (``postnorm``, false when absent).
        shared_block: the hybrid layers share transformer blocks (``SharedBlockSpec``, read by
            ``config.shared_block_spec``).
        k_eq_v_key: config key that, when true, gives the full-attention layers no value
            projection: their values are their key projections before the key norm (Gemma 4's
            attention_k_eq_v; ``LayerSpec.v_from_k``).
        kv_shared_key: config key of n: the last n layers reuse the keys and values of the last
            earlier layer of their kind (Gemma 4's num_kv_shared_layers; ``config.kv_sources``).
        value_norm: each value head passes a weightless RMS norm (Gemma 4).
        layer_scalar: each layer's output is multiplied by its ``layer_scalar`` tensor (Gemma 4).
        looped: the stored layers run ``loops`` times (read under ``keys``), each pass its own executed
            layers with their own cache slots (``config.looped_layers``, ``decoder/loops.py``).
        loop_norm: the final norm closes every pass but the last (the last gets it anyway), unless the
            config key ``loop_norm_skip_key`` is true (Nanbeige's skip_loop_final_norm).
        loop_gated: on every later pass, attention is the gated mix of a global half over the first
            pass's keys and values and a local half within ``loop_window`` (IQuest-LoopCoder).
        loop_stacks: (low, high): with ``looped``, two stacks stored under these ``{stack}`` names run in
            cycles: ``loops`` cycles of ``inner_loops`` passes of the low stack and one of the high
            (HRM-Text; ``config.looped_layers``).
        prefix_lm_key: config key (true when absent) under which a prompt read whole from position zero
            attends both ways within itself (``ModelSpec.prefix_lm``).
        compressed: every layer runs DeepSeek-V4's compressed attention (``config.compressed_spec``,
            ``decoder/compressed.py``), its kind from ``_compress_kinds`` and its hash routing from
            ``_hash_layers`` (the family's ``normalize`` writes both).
        ffn_limit: the dense feed-forwards are clamped by ``swiglu_limit`` too (``ModelSpec.ffn_limit``).
        streams: the residual is ``hc_mult`` streams joined by hyper-connections (``config.streams_spec``,
            ``decoder/streams.py``): what the family fixes in code (``hc_sinkhorn_iters``, ``post_eps``:
            ``"hc_eps"`` or a number, ``head``: ``"weighted"`` / ``"mean"``, ``hc_magnitude``); {} for
            the config's keys alone.
        embed_norm_affine: the embedding norm (``embed_norm``) carries a weight (False: weightless,
            Muse Glimmer's).
        final_norm_unit_offset: the final norm's weight is applied as stored (False) or as 1 + w (True)
            whatever ``norm_unit_offset`` says of the others (None: as they are; Muse Glimmer: False).
        block_sparse: the layers ``normalize`` lists in ``_block_sparse_layers`` run MiniMax Sparse
            Attention (``decoder/block_sparse.py``), sized by ``index_head_dim``, ``index_block_size``,
            ``index_topk_blocks`` and ``index_local_blocks`` (``config.block_sparse_spec``).
        ffn_glu: the dense feed-forwards' gated unit: ``"standard"`` or ``"oai"`` (gpt-oss's clamped unit,
            clamp ``swiglu_limit``, sharpness ``swiglu_alpha``: MiniMax-M3's swigluoai).
        relative: every layer attends with Inkling's relative-position bias and residual short convolutions
            (``decoder/relative.py``; sizes from ``d_rel``, ``rel_extent``, ``conv_kernel_size``,
            ``log_scaling_n_floor``, ``log_scaling_alpha``), and each feed-forward's output passes one too.
        gate_up_interleaved: a fused dense ``gate_up`` stores gate and up rows alternately (Inkling's w13_dn).
        post_norm_eps_key: config key of the epsilon of the two output norms (``attn_post_norm``,
            ``ffn_post_norm``) when it differs from the model's (Muse Glimmer's post_norm_eps).
        query_bottleneck_key: config key of the query bottleneck's width (Step3's share_q_dim): each query
            is ``q_up(q_inter_norm(q(x)))`` (``ModelSpec.query_bottleneck``).
        ngram: hashed n-gram embeddings beside the token embedding (``config.ngram_spec``; the ``ngram_table``
            and ``ngram_proj`` roles, ``{k}`` the table index; LongCat-Flash-Lite).
        altup: the stream travels as AltUp's copies, as many as ``altup_num_inputs`` says
            (``ModelSpec.altup``; Gemma 3n). laurel: each layer has Laurel's low-rank residual
            (``ModelSpec.laurel``). ffn_sparsity_key: the config key listing each layer's activation
            sparsity (``LayerSpec.ffn_sparsity``). per_layer_clamp: ids past the per-layer table read
            its row 0 (``ModelSpec.per_layer_clamp``).
    """

    model_type: str
    gguf_arch: str | None = None
    gguf_qk_permuted: bool = False
    keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    fixed: Mapping[str, Any] = field(default_factory=dict)
    norm: str = "rms"
    norm_unit_offset: bool = False
    norm_affine: bool = True
    norms: tuple[str, ...] = ("attn_norm", "ffn_norm")
    parallel: bool = False
    qk_norm: str | None = None
    qk_norm_after_rope: bool = False
    qk_norm_optional: bool = False
    embed_scale_sqrt_hidden: bool = False
    embed_norm: bool = False
    positions: str = "rope"
    position_offset: int = 0
    alibi_scaled: bool = False
    alibi_bf16: bool = False
    alibi_sqrt: bool = False
    norm_offsets: Mapping[str, float] = field(default_factory=dict)
    norm_groups_key: str | None = None
    value_experts_keys: tuple[str, str] | None = None
    rope_interleaved: bool = False
    rope_layers: str = "all"
    default_act: str = "silu"
    sliding: str = "none"
    rope_whole_head: bool = False
    sliding_pattern: int = 6
    sliding_pattern_key: str = "sliding_window_pattern"
    local_rope_key: str | None = None
    no_rope_key: str | None = None
    layer_rope_key: str | None = None
    attn_scale_key: str | None = None
    attn_multiplier_key: str | None = None
    attn_unscaled: bool = False
    attn_softcap_key: str | None = None
    final_softcap_key: str | None = None
    embed_multiplier_key: str | None = None
    residual_multiplier_key: str | None = None
    logit_scale_key: str | None = None
    logit_scale_divides: bool = False
    clip_qkv_key: str | None = None
    query_temperature: str | None = None
    qk_norm_layers: str = "all"
    qk_norm_affine: bool = True
    chunk_key: str | None = None
    config_defaults: Mapping[str, Any] = field(default_factory=dict)
    decoder_prefix: str | None = None
    sinks: bool | str = False
    value_scale_key: str | None = None
    attn_gate: str | None = None
    attn_gate_per_head: bool = True
    expert_limit_keys: tuple[str, str] | None = None
    normalize: Callable[[Mapping], Mapping] | None = None
    unread: tuple[str, ...] = ()
    ffn_mult_key: str | None = None
    ffn_mult: int | None = None
    fused_qkv: str | None = None
    inputs_first: bool = False
    root: str | None = None
    tie_default: bool = False
    head_untied: bool = False
    names: Mapping[str, str] = field(default_factory=lambda: LLAMA_NAMES)
    gguf_names: Mapping[str, str] = field(default_factory=lambda: GGUF_NAMES)
    variants: tuple[Variant, ...] = ()
    refusals: tuple[Refusal, ...] = ()
    gguf_config: Mapping[str, str] = field(default_factory=dict)
    gguf_changes: Mapping[str, Any] = field(default_factory=dict)
    gguf_refusals: tuple[Refusal, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)
    moe: bool = False
    moe_defaults: Mapping[str, Any] = field(default_factory=dict)
    moe_fields: Mapping[str, Any] = field(default_factory=dict)
    shared_gated: bool = False
    expert_inputs_first: tuple[str, ...] = ()
    expert_gate_up_interleaved: bool = False
    latent: bool = False
    latent_rescale: bool = False
    latent_k_rope_norm: bool = False
    latent_model_eps: bool = False
    shortcut_pairs: bool = False
    indexer: Mapping[str, Any] | None = None
    routed_norms: tuple[str, ...] | None = None
    dense_unread: tuple[str, ...] = ()
    unconfirmed: bool = False
    recurrent: str | None = None
    recurrent_norms: tuple[str, ...] | None = None
    attn_gate_in_q: bool = False
    ffn_layers: str = "all"
    ssm_bcdt_norm: str | None = None
    ssm_gated_norm: bool = True
    mup: bool = False
    gguf_folded: bool = False
    adapters: str = "all"
    reference_hidden: str = "embedding"
    hybrid_mixer: str = "hybrid"
    sublayer_scales: Mapping[str, tuple[str, str]] | None = None
    residual_normed: bool | str = False
    shared_block: bool = False
    k_eq_v_key: str | None = None
    kv_shared_key: str | None = None
    value_norm: bool = False
    layer_scalar: bool = False
    looped: bool = False
    loop_norm: bool = False
    loop_norm_skip_key: str | None = None
    loop_gated: bool = False
    loop_stacks: tuple[str, str] | None = None
    prefix_lm_key: str | None = None
    streams: Mapping[str, Any] | None = None
    compressed: bool = False
    ffn_limit: bool = False
    embed_norm_affine: bool = True
    final_norm_unit_offset: bool | None = None
    post_norm_eps_key: str | None = None
    block_sparse: bool = False
    ffn_glu: str = "standard"
    relative: bool = False
    gate_up_interleaved: bool = False
    query_bottleneck_key: str | None = None
    ngram: bool = False
    altup: bool = False
    laurel: bool = False
    ffn_sparsity_key: str | None = None
    per_layer_clamp: bool = False

    def stored_under(self, prefix: str) -> "FamilySpec":
        """This family as a wrapper stores it: every tensor name below ``prefix`` (``tensor_names``)."""
        return replace(self, decoder_prefix=prefix)

    def tensor_names(self) -> Mapping[str, Any]:
        """``names``, below ``decoder_prefix`` when the family is a wrapper's text decoder. A prefix that
        stands for a stem of the decoder's own names (``WRAPPER_STEMS``: Gemma 4's
        ``model.language_model.`` for ``model.``) replaces that stem, and names without it (the head)
        stay as they are."""
        p = self.decoder_prefix
        if not p:
            return self.names
        stem = WRAPPER_STEMS.get(p, "")

        def under(n: str) -> str:
            return p + n if not stem else (p + n[len(stem):] if n.startswith(stem) else n)
        return {role: under(n) if isinstance(n, str) else tuple(map(under, n)) for role, n in self.names.items()}

    def for_config(self, config: Mapping) -> "FamilySpec":
        """This family with the variants ``config`` switches on applied."""
        out = self
        for v in self.variants:
            if v.when(config):
                out = replace(out, **v.changes)
        return out


_GEMMA = dict(norm_unit_offset=True, embed_scale_sqrt_hidden=True, default_act="gelu_pytorch_tanh",
              tie_default=True)
# Transformers reads the normalization epsilon of these families under one key only (1e-5 when absent).
_EPS = {key: dict(keys={"norm_eps": (key,)}, config_defaults={key: 1e-5})
        for key in ("layer_norm_eps", "norm_epsilon", "norm_eps")}
# Gemma 2 and later run hidden_activation only (hidden_act, which their configs also carry, is not read).
_GEMMA2 = dict(_GEMMA, keys={"act": ("hidden_activation",)},
               norms=("attn_norm", "attn_post_norm", "ffn_norm", "ffn_post_norm"),
               names=GEMMA2_NAMES, attn_scale_key="query_pre_attn_scalar",
               attn_softcap_key="attn_logit_softcapping", final_softcap_key="final_logit_softcapping")
_GRANITE = dict(embed_multiplier_key="embedding_multiplier", residual_multiplier_key="residual_multiplier",
                attn_multiplier_key="attention_multiplier", logit_scale_key="logits_scaling")
_GRANITE_GGUF = {"attention.scale": "attention_multiplier", "embedding_scale": "embedding_multiplier",
                 "residual_scale": "residual_multiplier", "logit_scale": "logits_scaling"}
_PARALLEL_GGUF = {"use_parallel_residual": "use_parallel_residual"}
_QK_NORM_IF_PRESENT = {"qk_norm": "head", "qk_norm_optional": True}
_OLMO2 = dict(norms=("attn_post_norm", "ffn_post_norm"), qk_norm="proj", names=OLMO2_NAMES)
_SANDWICH = ("attn_norm", "attn_post_norm", "ffn_norm", "ffn_post_norm")
_FALCON_NEW_1LN = (lambda c: bool(c.get("new_decoder_architecture")) and c.get("num_ln_in_parallel_attn") == 1)


def _layer_list(config: Mapping, key: str, n: int) -> list | None:
    """``config[key]`` when it is a list of at least ``n`` entries, cut to ``n`` (the hub configs of
    Step 3.5 append the multi-token-prediction layers' entries), else None."""
    v = config.get(key)
    return v[:n] if isinstance(v, list) and len(v) >= n else None


def _n_layers(config: Mapping) -> int:
    n = config.get("num_hidden_layers")
    return n if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 4096 else 0


def _teleflm_mup_stated(config: Mapping) -> bool:
    values = [config.get(k) for k in ("input_mult", "output_mult", "mup_scale_factor")]
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values) and values[2] != 0


def _teleflm_config(config: Mapping) -> Mapping:
    """Tele-FLM's muP scales (under use_mup) as the embedding and logit factors config.py reads."""
    c = dict(config)
    if c.get("use_mup") and _teleflm_mup_stated(c):
        c["teleflm_embed_scale"] = c["input_mult"]
        c["teleflm_logit_scale"] = c["output_mult"] / c["mup_scale_factor"]
    return c


def _deci_blocks(config: Mapping) -> list | None:
    """DeciLM's ``block_configs`` when it is a list of objects each with ``attention`` and ``ffn`` objects."""
    blocks = config.get("block_configs")
    if not isinstance(blocks, list) or not all(
            isinstance(b, Mapping) and isinstance(b.get("attention"), Mapping) and isinstance(b.get("ffn"), Mapping)
            for b in blocks):
        return None
    return blocks


def _deci_ffn_width(ffn: Mapping, hidden: Any) -> Any:
    """A DeciLM feed-forward's width: the entry's intermediate_size, else int(2 * ffn_mult * hidden / 3)
    rounded up to a multiple of 256 (seed 002; DeciLM's _ffn_mult_to_intermediate_size)."""
    if ffn.get("intermediate_size") is not None:
        return ffn["intermediate_size"]
    mult = ffn.get("ffn_mult")
    if isinstance(mult, bool) or not isinstance(mult, (int, float)) or not 0 < mult < 1e6 \
            or isinstance(hidden, bool) or not isinstance(hidden, int) or hidden <= 0:
        return None
    width = int(2 * mult * hidden / 3)
    return width + (-width) % 256


def _deci_config(config: Mapping) -> Mapping:
    """DeciLM's ``block_configs`` (one entry per layer) in the keys config.py reads: each attending
    layer's key/value heads (num_attention_heads / n_heads_in_group) in ``per_layer_config``, and
    ``layer_halves``: per layer, whether it has its attention and its feed-forward (no_op: neither the
    half nor its norm) and that feed-forward's width; intermediate_size, which DeciLM's configs leave
    null, is the first feed-forward's."""
    blocks = _deci_blocks(config)
    if blocks is None:
        return config
    c = dict(config)
    heads = c.get("num_attention_heads")
    per_layer, halves = {}, []
    for i, b in enumerate(blocks):
        att, ffn = b["attention"], b["ffn"]
        group = att.get("n_heads_in_group")
        if not att.get("no_op") and isinstance(group, int) and not isinstance(group, bool) and group > 0 \
                and isinstance(heads, int) and heads % group == 0:
            per_layer[str(i)] = {"num_key_value_heads": heads // group}
        halves.append({"attention": not att.get("no_op"), "ffn": not ffn.get("no_op"),
                       "intermediate_size": None if ffn.get("no_op") else _deci_ffn_width(ffn, c.get("hidden_size"))})
    c.setdefault("per_layer_config", per_layer)
    c["layer_halves"] = halves
    if c.get("intermediate_size") is None:  # the model's width: the first feed-forward's (each layer has its own)
        c["intermediate_size"] = next((h["intermediate_size"] for h in halves if h["intermediate_size"]), 1)
    return c


def _deci_refused(why: str):
    """Predicate over DeciLM's block_configs entries: ``why(attention, ffn, config)`` holds for one of them."""
    def when(config: Mapping) -> bool:
        return any(why(b["attention"], b["ffn"], config) for b in _deci_blocks(config) or ())
    return when


def _deci_attention_unsized(att: Mapping, ffn: Mapping, config: Mapping) -> bool:
    group, heads = att.get("n_heads_in_group"), config.get("num_attention_heads")
    return not att.get("no_op") and (isinstance(group, bool) or not isinstance(group, int) or group <= 0
                                     or not isinstance(heads, int) or heads % group != 0)


_DECI_REFUSALS = (
    Refusal(lambda c: _deci_blocks(c) is None or len(_deci_blocks(c)) != _n_layers(c),
            "a config without block_configs (one object with attention and ffn per layer, num_hidden_layers of "
            "them) is not supported"),
    Refusal(_deci_refused(lambda a, f, c: bool(a.get("replace_with_linear")) or bool(f.get("replace_with_linear"))),
            "a block replaced by a linear layer (replace_with_linear) is not supported"),
    Refusal(_deci_refused(lambda a, f, c: a.get("sparsify") is not None or f.get("sparsify") is not None),
            "sparsified blocks (sparsify) are not supported"),
    Refusal(_deci_refused(lambda a, f, c: a.get("window_length") is not None),
            "attention through a window (block_configs' window_length) is not supported"),
    Refusal(_deci_refused(lambda a, f, c: bool(a.get("num_sink_tokens"))),
            "attention sink tokens (num_sink_tokens) are not supported"),
    Refusal(_deci_refused(lambda a, f, c: f.get("hidden_act") is not None
                          and f.get("hidden_act") != c.get("hidden_act", "silu")),
            "a layer's hidden_act other than the model's is not supported"),
    Refusal(_deci_refused(_deci_attention_unsized),
            "an attention entry without an n_heads_in_group that divides num_attention_heads is not supported"),
    Refusal(_deci_refused(lambda a, f, c: not f.get("no_op") and _deci_ffn_width(f, c.get("hidden_size")) is None),
            "a feed-forward entry without a positive ffn_mult or intermediate_size is not supported"),
)


def _plamo3_config(config: Mapping) -> Mapping:
    """PLaMo 3's spellings in the keys config.py reads: window_size as sliding_window, head width from
    hidden_size_per_head where head_dim is absent, and the full-attention layers' YaRN (when
    rope_scaling_factor is not one) over initial_context_length positions with the band 32 to 1
    unrounded (truncate false), as modeling_plamo.py builds it; the sliding layers rotate at
    rope_local_theta (FamilySpec.local_rope_key)."""
    c = dict(config)
    if c.get("sliding_window") is None and c.get("window_size") is not None:
        c["sliding_window"] = c["window_size"]
    if c.get("head_dim") is None and c.get("hidden_size_per_head") is not None:
        c["head_dim"] = c["hidden_size_per_head"]
    factor = c.get("rope_scaling_factor", 1)
    if c.get("rope_parameters") is None and c.get("rope_scaling") is None and factor not in (None, 1, 1.0):
        c["rope_scaling"] = {"rope_type": "yarn", "factor": factor,
                             "original_max_position_embeddings": c.get("initial_context_length"),
                             "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
    return c


def _k2_horizon_config(config: Mapping) -> Mapping:
    """K2-Horizon's router spellings in the keys config.py reads: router_score_func as scoring_func, and
    under moe_gate_bias the selection by scores plus mlp.gate.bias (noaux_tc without groups)."""
    c = dict(config)
    c.setdefault("scoring_func", c.get("router_score_func") or "softmax")
    c.setdefault("topk_method", "noaux_tc" if c.get("moe_gate_bias") else "greedy")
    return c


def _telechat3_config(config: Mapping) -> Mapping:
    """TeleChat3's rope type telechat3-yarn as the YaRN it is, with its temperature: 0.07 * ln(factor) + 1
    where YaRN's is 0.1 * ln(factor) + 1 (seed 002), stated as YaRN's attention_factor."""
    import math

    c = dict(config)
    for key in ("rope_parameters", "rope_scaling"):
        rope = c.get(key)
        if not isinstance(rope, Mapping) or (rope.get("rope_type") or rope.get("type")) != "telechat3-yarn":
            continue
        rope = {k: v for k, v in rope.items() if k != "type"}
        factor = rope.get("factor")
        if rope.get("attention_factor") is None and isinstance(factor, (int, float)) and not isinstance(factor, bool):
            rope["attention_factor"] = 0.07 * math.log(factor) + 1.0 if factor > 1 else 1.0
        c[key] = dict(rope, rope_type="yarn")
    return c


def _solar_config(config: Mapping) -> Mapping:
    """Solar Pro's block skip connections as ``residual_skips`` (config.ResidualSkip): the stream kept
    before the layers bskcn_1 (bskcn_2) list is mixed back before the layers bskcn_3 (bskcn_4) list,
    with the inference weight, the second entry of bskcn_tv (seed 002)."""
    c = dict(config)
    tv = c.get("bskcn_tv")
    if any(c.get(f"bskcn_{k}") for k in (1, 2, 3, 4)):
        weight = tv[1] if isinstance(tv, list) and len(tv) == 2 else tv
        c["residual_skips"] = [{"keep": c.get(f"bskcn_{a}") or [], "mix": c.get(f"bskcn_{b}") or [], "weight": weight}
                               for a, b in ((1, 3), (2, 4))]
    return c


def _hrm_text_config(config: Mapping) -> Mapping:
    """HRM-Text's stack length (num_layers_per_stack, else num_hidden_layers: Transformers rewrites
    num_hidden_layers to every pass's count) as num_hidden_layers, and its embedding_scale, 1 /
    initializer_range when unstated (Transformers' HrmTextConfig)."""
    c = dict(config)
    if c.get("num_layers_per_stack") is not None:
        c["num_hidden_layers"] = c["num_layers_per_stack"]
    if c.get("embedding_scale") is None:
        r = c.get("initializer_range", 0.02)
        if isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0:
            c["embedding_scale"] = 1.0 / r
    return c


def _deepseek_moe_config(config: Mapping) -> Mapping:
    """DeepSeek-MoE's layer plan as ``mlp_layer_types``: layer i routes when n_routed_experts is stated,
    i >= first_k_dense_replace and moe_layer_freq divides i (DeepseekConfig's defaults: 0 and 1)."""
    c, n = dict(config), _n_layers(config)
    k, freq = c.get("first_k_dense_replace") or 0, c.get("moe_layer_freq") or 1
    counts = all(isinstance(x, int) and not isinstance(x, bool) for x in (k, freq)) and k >= 0 and freq > 0
    if n and counts and c.get("mlp_layer_types") is None:
        routed = c.get("n_routed_experts") is not None
        c["mlp_layer_types"] = ["sparse" if routed and i >= k and i % freq == 0 else "dense" for i in range(n)]
    return c


def _mimo_v2_config(config: Mapping) -> Mapping:
    """MiMo-V2-Flash's hub spellings (and Transformers' defaults for what they leave out) as
    ``layer_types``, ``mlp_layer_types``, per-type ``rope_parameters`` and the sliding layers'
    key/value head count in ``per_layer_config``."""
    c, n = dict(config), _n_layers(config)
    c.setdefault("rms_norm_eps", c.get("layernorm_epsilon", 1e-5))  # Transformers' default for the family
    if c.get("layer_types") is None:
        pattern = _layer_list(c, "hybrid_layer_pattern", n)
        c["layer_types"] = (["sliding_attention" if p else "full_attention" for p in pattern] if pattern is not None
                            else ["full_attention" if i == 0 or (i + 1) % 6 == 0 else "sliding_attention"
                                  for i in range(n)])
    if c.get("mlp_layer_types") is None:
        freq = _layer_list(c, "moe_layer_freq", n)
        c["mlp_layer_types"] = (["sparse" if f else "dense" for f in freq] if freq is not None
                                else ["dense"] + ["sparse"] * (n - 1))
    if c.get("sliding_window_size") is not None and isinstance(c["sliding_window_size"], int):
        c["sliding_window"] = c["sliding_window_size"] + 1  # the window leaves out the query itself
    rp = c.get("rope_parameters")
    if not (isinstance(rp, Mapping) and "full_attention" in rp):
        share = c.get("partial_rotary_factor", 0.334)
        rp = {"full_attention": {"rope_type": "default", "rope_theta": c.get("rope_theta", 5_000_000.0)},
              "sliding_attention": {"rope_type": "default", "rope_theta": c.get("swa_rope_theta", 10_000.0)}}
        rp = {k: dict(v, partial_rotary_factor=share) for k, v in rp.items()}
    c["rope_parameters"] = {k: dict(v, partial_rotary_factor=v.get("partial_rotary_factor", 0.334))
                            if isinstance(v, Mapping) else v for k, v in rp.items()}
    if "attention_value_scale" not in c:
        c["attention_value_scale"] = 0.707
    kv = c.get("num_key_value_heads")
    swa_kv = c.get("swa_num_key_value_heads", 2 * kv if isinstance(kv, int) and not isinstance(kv, bool) else None)
    if c.get("per_layer_config") is None and swa_kv is not None and isinstance(c["layer_types"], list):
        c["per_layer_config"] = {i: {"num_key_value_heads": swa_kv}
                                 for i, t in enumerate(c["layer_types"]) if t == "sliding_attention"}
    return c


def _laguna_config(config: Mapping) -> Mapping:
    """Laguna's defaults that Transformers derives when a config leaves them out: full attention,
    the first layer dense, and one rotation per layer type (the full layers' over half of each head)."""
    c, n = dict(config), _n_layers(config)
    if c.get("layer_types") is None:
        c["layer_types"] = ["full_attention"] * n
    if c.get("mlp_layer_types") is None:
        c["mlp_layer_types"] = ["dense"] + ["sparse"] * (n - 1)
    if c.get("rope_parameters") is None:
        c["rope_parameters"] = {
            "full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}}
    return c


_STEP_LISTS = ("layer_types", "swiglu_limits", "swiglu_limits_shared", "use_rope_layers", "rope_theta",
               "partial_rotary_factors")


def _step3p5_config(config: Mapping) -> Mapping:
    """Step 3.5's hub spellings as the keys config.py reads: per-layer lists cut to num_hidden_layers
    (the rest are multi-token-prediction layers), ``mlp_layer_types`` from ``moe_layers_enum`` (by
    default, layers from the fourth on route), the sliding layers' head counts from
    ``num_sliding_attention_heads`` or ``attention_other_setting`` into ``per_layer_config``, and
    one rope parameter set per layer type from the per-layer ``rope_theta`` / ``partial_rotary_factors``
    (a kind's first layer, as Transformers takes it) with ``rope_scaling`` on full attention only."""
    c, n = dict(config), _n_layers(config)
    c.setdefault("rms_norm_eps", 1e-5)  # Transformers' default for the family
    for key in _STEP_LISTS:
        cut = _layer_list(c, key, n)
        if cut is not None:
            c[key] = cut
    if c.get("layer_types") is None:
        c["layer_types"] = ["full_attention"] * n
    types = c["layer_types"] if isinstance(c["layer_types"], list) and all(
        isinstance(t, str) for t in c["layer_types"]) else []
    if c.get("mlp_layer_types") is None:
        enum = c.get("moe_layers_enum")
        items = enum.split(",") if isinstance(enum, str) else enum if isinstance(enum, list) else None
        routed = ({int(x) for x in items if str(x).strip().isdecimal()} if items is not None else set(range(3, n)))
        c["mlp_layer_types"] = ["sparse" if i in routed else "dense" for i in range(n)]
    if c.get("per_layer_config") is None:
        other = c.get("attention_other_setting") if isinstance(c.get("attention_other_setting"), Mapping) else {}
        own = {k: v for k, v in (("num_attention_heads", c.get("num_sliding_attention_heads",
                                                                other.get("num_attention_heads"))),
                                 ("num_key_value_heads", other.get("num_attention_groups"))) if v is not None}
        c["per_layer_config"] = {i: own for i, t in enumerate(types) if t == "sliding_attention" and own}
    rp = c.get("rope_parameters")
    if not (isinstance(rp, Mapping) and all(isinstance(rp.get(t), Mapping) for t in set(types))):
        thetas, shares = c.get("rope_theta", 10000.0), c.get("partial_rotary_factors")
        rp = {}
        per_layer = {k: isinstance(v, list) and len(v) == len(types) for k, v in (("t", thetas), ("s", shares))}
        for t in set(types):
            i = types.index(t)
            rp[t] = {"rope_type": "default", "rope_theta": thetas[i] if per_layer["t"] else thetas}
            if per_layer["s"]:
                rp[t]["partial_rotary_factor"] = shares[i]
        if isinstance(c.get("rope_scaling"), Mapping) and "full_attention" in rp:
            rp["full_attention"].update(c["rope_scaling"])
        c["rope_parameters"] = rp
    return c


def _step3p5_kind_disagrees(c: Mapping) -> bool:
    """A layer kind whose layers list different rotary bases or shares (Transformers takes the first;
    ``c`` is normalised by ``_step3p5_config``, as ``gate`` does before refusals)."""
    types = c["layer_types"] if isinstance(c["layer_types"], list) else []
    for key in ("rope_theta", "partial_rotary_factors"):
        values = c.get(key)
        if isinstance(values, list) and len(values) == len(types):
            seen: dict[str, str] = {}
            for v, t in zip(values, map(repr, types)):
                if seen.setdefault(t, repr(v)) != repr(v):
                    return True
    return False


def _step3p5_clamped_dense(c: Mapping) -> bool:
    """A dense layer with a SwiGLU clamp (Transformers reads swiglu_limits_shared there; ``c`` normalised)."""
    limits, kinds = c.get("swiglu_limits_shared"), c.get("mlp_layer_types")
    return (isinstance(limits, list) and isinstance(kinds, list)
            and any(kind == "dense" and limit for kind, limit in zip(kinds, limits)))


def _differs(key: str, other: str) -> Callable[[Mapping], bool]:
    """Predicate: ``key`` is stated and differs from ``other`` (MiMo's sliding-window sizes)."""
    return lambda c: c.get(key) is not None and c.get(key) != c.get(other)


def _mpt_alibi_heads_not_power_of_two(config: Mapping) -> bool:
    heads = config.get("n_heads")
    return flag("alibi", True, sub="attn_config")(config) and isinstance(heads, int) and heads & (heads - 1) != 0


def _values(config: Mapping, key: str) -> list:
    """``config[key]`` as a list: [] when absent, its entries when stated per layer, else [value]."""
    v = config.get(key)
    return [] if v is None else list(v) if isinstance(v, list) else [v]


# Transformers' DeepSeek-V3 router as GLM-4.5's family runs it whatever the config says: sigmoid scores,
# e_score_correction_bias to choose, groups ranked by their best two, DeepSeek's 1e-20 in the
# renormalising sum, routed_scaling_factor with or without renormalisation.
_V3_ROUTER = dict(fixed={"scoring_func": "sigmoid", "topk_method": "noaux_tc"}, moe_fields={"renorm_eps": 1e-20})


def _granite_swa_bases_unsupported(config: Mapping) -> bool:
    """Full-attention layers must rotate by rope_theta and sliding layers by one shared base (or 0)."""
    thetas, types = config.get("layer_rope_theta"), config.get("layer_types")
    if not isinstance(thetas, list):
        return False
    if not isinstance(types, list):
        types = ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(len(thetas))]
    rp = config.get("rope_parameters")
    base = (rp.get("rope_theta") if isinstance(rp, Mapping) else None) or config.get("rope_theta", 10000.0)
    sliding = {t for t, kind in zip(thetas, types) if kind == "sliding_attention" and t}
    return len(sliding) > 1 or any(t and t != base for t, kind in zip(thetas, types) if kind != "sliding_attention")


_GRANITE_SWA_BASES = Refusal(_granite_swa_bases_unsupported,
                             "a layer_rope_theta that does not rotate full-attention layers by rope_theta "
                             "and every sliding layer by one base (or 0) is not supported")
# GraniteMoE's experts are intermediate_size wide; its router softmaxes the top-k logits (the same
# weights as a softmax over all experts renormalised over the chosen ones).
_GRANITEMOE = dict(_GRANITE, logit_scale_divides=True, moe=True, fixed={"norm_topk_prob": True},
                   keys={"moe_intermediate_size": ("intermediate_size",), "shared_intermediate_size": ()})
# ... with a shared expert shared_intermediate_size wide beside them (none when 0).
_GRANITEMOE_SHARED = dict(_GRANITEMOE, keys={"moe_intermediate_size": ("intermediate_size",)})
_GRANITEMOE_GGUF = dict(gguf_arch="granitemoe", gguf_qk_permuted=True, gguf_config=_GRANITE_GGUF)


# DBRX reads its settings inside attn_config and ffn_config (beside any top-level spelling).
_DBRX_KEYS = {"hidden_size": ("d_model",), "num_attention_heads": ("n_heads",), "num_hidden_layers": ("n_layers",),
              "max_position_embeddings": ("max_seq_len",), "head_dim": (),
              "num_key_value_heads": ("attn_config.kv_n_heads", "num_key_value_heads"),
              "rope_theta": ("rope_theta", "attn_config.rope_theta"),
              "intermediate_size": ("ffn_config.ffn_hidden_size",),
              "act": ("ffn_config.ffn_act_fn.name",),
              "num_experts": ("ffn_config.moe_num_experts",), "num_experts_per_tok": ("ffn_config.moe_top_k",),
              "moe_intermediate_size": ("ffn_config.ffn_hidden_size",),
              "norm_topk_prob": ("ffn_config.moe_normalize_expert_weights",),
              "shared_intermediate_size": (), "n_shared_experts": ()}


def _dbrx_unnormalised(config: Mapping) -> bool:
    """moe_normalize_expert_weights stated as null: the chosen weights are used as the softmax gives them."""
    ffn = config.get("ffn_config")
    key = "moe_normalize_expert_weights"
    return isinstance(ffn, Mapping) and key in ffn and ffn[key] is None


def _dbrx_other_power(config: Mapping) -> bool:
    """A p-norm other than p = 1 (a sum, the chosen weights being positive) divides the chosen weights."""
    p = _lookup(config, "moe_normalize_expert_weights", "ffn_config")
    return p is not None and (isinstance(p, bool) or p != 1)


def _phimoe_rope_unsupported(config: Mapping) -> bool:
    """PhiMoE multiplies any scaled rotation by short_mscale / long_mscale; ster does so for LongRoPE."""
    rp = config.get("rope_parameters") or config.get("rope_scaling")
    kind = (rp.get("rope_type") or rp.get("type")) if isinstance(rp, Mapping) else None
    return kind not in (None, "default", "longrope")


# ---- group MLA: multi-head latent attention (the DeepSeek-V2 line), names, readers and refusals.
# The latent roles (decoder/latent.py): q_a -> q_a_norm -> q_b (or one q), kv_a (kv_a_proj_with_mqa),
# kv_a_norm, kv_b, and llama.cpp's per-head split of kv_b into k_b [H, r, nope] and v_b [H, v, r].
_SA = _L + "self_attn."
LATENT_NAMES = dict(q_a=_SA + "q_a_proj", q_a_norm=_SA + "q_a_layernorm", q_b=_SA + "q_b_proj",
                    kv_a=_SA + "kv_a_proj_with_mqa", kv_a_norm=_SA + "kv_a_layernorm", kv_b=_SA + "kv_b_proj")
# DeepSeek's feed-forward keeps GLM-4.5's names (mlp.gate, its e_score_correction_bias, mlp.experts.{e},
# mlp.shared_experts, and the dense layers' mlp.gate_proj / up_proj / down_proj).
DEEPSEEK_NAMES = _with(GLM4_MOE_NAMES, k=None, v=None, **LATENT_NAMES)
# A.X-K1 norms each routed layer's feed-forward output: post_mlp_layernorm at the layer (its releases,
# and Transformers' writer), or below mlp where Transformers' own module keeps it.
AXK1_NAMES = _with(DEEPSEEK_NAMES, ffn_post_norm=(_L + "post_mlp_layernorm", _L + "mlp.post_mlp_layernorm"))
MINICPM3_NAMES = _with(LLAMA_NAMES, k=None, v=None, **LATENT_NAMES)
GGUF_LATENT_NAMES = _with(GGUF_NAMES, k=None, v=None, q_a="blk.{i}.attn_q_a", q_a_norm="blk.{i}.attn_q_a_norm",
                          q_b="blk.{i}.attn_q_b", kv_a="blk.{i}.attn_kv_a_mqa", kv_a_norm="blk.{i}.attn_kv_a_norm",
                          kv_b="blk.{i}.attn_kv_b", k_b="blk.{i}.attn_k_b", v_b="blk.{i}.attn_v_b")
# Every latent family reads its head widths from the latent keys: head_dim and num_key_value_heads
# are not its (a Sarvam hub config's head_dim is kv_lora_rank + qk_rope_head_dim, for vLLM).
_LATENT_KEYS = {"v_head_dim": ("v_head_dim",), "head_dim": (), "num_key_value_heads": ()}
_LATENT = dict(latent=True, rope_interleaved=True, gguf_names=GGUF_LATENT_NAMES)
# Transformers' DeepSeek-V3 router (DeepseekV3TopkRouter; GLM-4.7-Flash's, A.X-K1's and Sarvam-105B's are
# the same class): sigmoid scores, e_score_correction_bias to choose, groups ranked by their best two,
# renormalised under norm_topk_prob with DeepSeek's 1e-20, always times routed_scaling_factor.
_V3_LATENT = dict(_LATENT, moe=True, names=DEEPSEEK_NAMES, **_V3_ROUTER,
                  variants=(Variant(unset("rope_interleave"), {"rope_interleaved": False}),))
_V3_LATENT_DEFAULTS = {"kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                       "v_head_dim": 128, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
                       "moe_intermediate_size": 2048, "n_group": 8, "topk_group": 4, "norm_topk_prob": True,
                       "routed_scaling_factor": 2.5, "first_k_dense_replace": 3}


def _stated_other(key: str, *allowed) -> Callable[[Mapping], bool]:
    """Predicate: ``key`` is stated (not null) with a value outside ``allowed``."""
    return lambda c: c.get(key) is not None and c.get(key) not in allowed


_MOE_LAYER_FREQ = Refusal(_stated_other("moe_layer_freq", 1),
                          "a moe_layer_freq other than 1 is not supported (Transformers routes every layer from "
                          "first_k_dense_replace on, so its weights would not be this checkpoint's)")


def _deepseek_yarn(config: Mapping) -> Mapping:
    """A rope block of type ``deepseek_yarn`` (DeepSeek's remote code; Sarvam-105B) read as the YaRN it is."""
    c = dict(config)
    for key in ("rope_scaling", "rope_parameters"):
        rp = c.get(key)
        if isinstance(rp, Mapping) and "deepseek_yarn" in (rp.get("type"), rp.get("rope_type")):
            c[key] = {**{k: v for k, v in rp.items() if k != "type"}, "rope_type": "yarn"}
    return c


def _axk1_config(config: Mapping) -> Mapping:
    """A.X-K1's dense and routed layers as Transformers' AXK1Config derives them when the config lists no
    mlp_layer_types: routed from first_k_dense_replace (1 when left out) on, every moe_layer_freq-th (1)."""
    c, n = dict(config), _n_layers(config)
    if c.get("mlp_layer_types") is None:
        k, freq = c.get("first_k_dense_replace"), c.get("moe_layer_freq")
        k = 1 if k is None else k
        freq = 1 if freq is None else freq
        if isinstance(k, int) and isinstance(freq, int) and not isinstance(k, bool) and not isinstance(freq, bool) \
                and freq > 0:
            c["mlp_layer_types"] = ["sparse" if i >= k and i % freq == 0 else "dense" for i in range(n)]
    return c


def _minicpm3_config(config: Mapping) -> Mapping:
    """MiniCPM3's muP scales as the keys config.py reads (MiniCPM3Config's derived values): each
    sublayer's output times ``residual_multiplier`` = scale_depth / sqrt(num_hidden_layers), the logits
    divided by ``logits_scaling`` = hidden_size / dim_model_base; a null scale_depth is sqrt(layers)
    (a unit scale), a null dim_model_base is hidden_size, a null v_head_dim is hidden_size / heads."""
    c, n = dict(config), _n_layers(config)
    hidden, heads = c.get("hidden_size"), c.get("num_attention_heads")
    sizes = all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (hidden, heads))
    if c.get("v_head_dim") is None and sizes:
        c["v_head_dim"] = hidden // heads
    depth, base = c.get("scale_depth"), c.get("dim_model_base")
    if n and depth is None:
        depth = n ** 0.5
    if isinstance(depth, (int, float)) and not isinstance(depth, bool) and n:
        c["residual_multiplier"] = depth / n ** 0.5
    base = hidden if base is None else base
    if isinstance(base, (int, float)) and not isinstance(base, bool) and base and sizes:
        c["logits_scaling"] = hidden / base
    return c




# ----------------------------------------------------------------------------- state-space families
# group SSM (issue 15, part A): Mamba, Falcon-Mamba, Mamba-2, Jamba, Bamba, Granite 4.0 (granitemoehybrid),
# Nemotron-H, Falcon-H1. Each family's normalize writes ``layer_types`` in Transformers 5's words
# (linear_attention: the family's scan; full_attention; hybrid: both side by side; mlp / moe: a
# feed-forward-only layer) and, where layers route, ``mlp_layer_types``.

_B = "backbone.layers.{i}."
_MX = _B + "mixer."
# Mamba (and Falcon-Mamba): everything below backbone, one norm and one mixer per layer.
MAMBA_NAMES: Mapping[str, str] = {
    "embed": ("backbone.embeddings", "backbone.embedding"), "final_norm": "backbone.norm_f", "head": "lm_head",
    "attn_norm": _B + "norm", "ssm_in": _MX + "in_proj", "ssm_conv": _MX + "conv1d", "ssm_x": _MX + "x_proj",
    "ssm_dt": _MX + "dt_proj", "ssm_a_log": _MX + "A_log", "ssm_d": _MX + "D", "ssm_out": _MX + "out_proj",
}
MAMBA2_NAMES = _with(MAMBA_NAMES, ssm_x=None, ssm_dt=None, ssm_dt_bias=_MX + "dt_bias", ssm_norm=_MX + "norm")
_MB = _L + "mamba."
_JAMBA_SCAN = dict(ssm_in=_MB + "in_proj", ssm_conv=_MB + "conv1d", ssm_x=_MB + "x_proj", ssm_dt=_MB + "dt_proj",
                   ssm_a_log=_MB + "A_log", ssm_d=_MB + "D", ssm_out=_MB + "out_proj",
                   ssm_dt_norm=_MB + "dt_layernorm", ssm_b_norm=_MB + "b_layernorm", ssm_c_norm=_MB + "c_layernorm")
_MAMBA2_SCAN = dict(ssm_in=_MB + "in_proj", ssm_conv=_MB + "conv1d", ssm_dt_bias=_MB + "dt_bias",
                    ssm_a_log=_MB + "A_log", ssm_d=_MB + "D", ssm_norm=_MB + "norm", ssm_out=_MB + "out_proj")
_FF = _L + "feed_forward."
# Jamba: Llama's attention, a Mamba mixer (mamba.*), pre_ff_layernorm, feed_forward (router, experts.{e}).
JAMBA_NAMES = _with(LLAMA_NAMES, final_norm="model.final_layernorm", ffn_norm=_L + "pre_ff_layernorm",
                    gate=_FF + "gate_proj", up=_FF + "up_proj", down=_FF + "down_proj", router=_FF + "router",
                    exp_gate=_FF + "experts.{e}.gate_proj.weight", exp_up=_FF + "experts.{e}.up_proj.weight",
                    exp_down=_FF + "experts.{e}.down_proj.weight", **_JAMBA_SCAN)
BAMBA_NAMES = _with(JAMBA_NAMES, router=None, exp_gate=None, exp_up=None, exp_down=None, ssm_x=None, ssm_dt=None,
                    ssm_dt_norm=None, ssm_b_norm=None, ssm_c_norm=None, **_MAMBA2_SCAN)
# Granite 4.0: GraniteMoE-Shared's experts and shared_mlp after a Mamba-2 or attention mixer.
GRANITE_HYBRID_NAMES = _with(GRANITEMOE_SHARED_NAMES, final_norm="model.norm", **_MAMBA2_SCAN)
GRANITE_HYBRID_DENSE_NAMES = _with(GRANITE_HYBRID_NAMES, router=None, exp_gate_up=None, exp_down=None,
                                   shexp_gate_up=None, shexp_down=None, gate_up=_L + "shared_mlp.input_linear",
                                   down=_L + "shared_mlp.output_linear")
# Nemotron-H: one norm per layer before its one mixer; a feed-forward layer's norm is the same tensor.
NEMOTRON_H_NAMES = {
    "embed": "backbone.embeddings", "final_norm": "backbone.norm_f", "head": "lm_head",
    "attn_norm": _B + "norm", "ffn_norm": _B + "norm",
    "q": _MX + "q_proj", "k": _MX + "k_proj", "v": _MX + "v_proj", "o": _MX + "o_proj",
    "up": _MX + "up_proj", "down": _MX + "down_proj",
    "router": _MX + "gate", "router_select_bias": _MX + "gate.e_score_correction_bias",
    "exp_up": _MX + "experts.{e}.up_proj.weight", "exp_down": _MX + "experts.{e}.down_proj.weight",
    "shexp_up": _MX + "shared_experts.up_proj", "shexp_down": _MX + "shared_experts.down_proj",
    "moe_latent_in": _MX + "fc1_latent_proj", "moe_latent_out": _MX + "fc2_latent_proj",
    **{k: v.replace("backbone.layers.{i}.mixer.", _MX) for k, v in MAMBA2_NAMES.items() if k.startswith("ssm_")},
}
FALCON_H1_NAMES = _with(BAMBA_NAMES, gate=_FF + "gate_proj")
GGUF_JAMBA_NAMES = GGUF_SSM_NAMES
GGUF_NEMOTRON_H_NAMES = _with(GGUF_SSM_NAMES, ffn_norm="blk.{i}.attn_norm", gate=None, exp_gate=None, shexp_gate=None,
                              moe_latent_in="blk.{i}.ffn_latent_down", moe_latent_out="blk.{i}.ffn_latent_up")
# llama.cpp's Falcon-H1 stores the pre-feed-forward norm as blk.N.ffn_norm (no .weight suffix).
GGUF_FALCON_H1_NAMES = _with(GGUF_SSM_NAMES, ffn_norm=("blk.{i}.ffn_norm#", "blk.{i}.ffn_norm"))

_INF_TAG = "__float__"


def _unstated_floats(v):
    """A value with Transformers' tagged floats ({"__float__": "Infinity"}) and non-finite numbers as None
    (seed 002: configs written with Infinity, -Infinity or NaN are read with those values as unstated)."""
    if isinstance(v, Mapping) and set(v) == {_INF_TAG}:
        return None
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return None
    if isinstance(v, list):
        return [_unstated_floats(x) for x in v]
    return v


def _scan_config(config: Mapping, n: int | None = None) -> dict:
    """The config with its time_step_limit's non-finite bounds unstated and, when ``n`` layers are
    given, every layer of the family's scan (layer_types: linear_attention)."""
    c = dict(config)
    if "time_step_limit" in c:
        c["time_step_limit"] = _unstated_floats(c["time_step_limit"])
    if n is not None and c.get("layer_types") is None:
        c["layer_types"] = ["linear_attention"] * n
    return c


def _period_types(c: Mapping, n: int, key: str, default_period: int, default_offset: int, on: str, off: str):
    period, offset = c.get(f"{key}_period", default_period), c.get(f"{key}_offset", default_offset)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (period, offset)) or period <= 0:
        return None
    return [on if i % period == offset else off for i in range(n)]


def _jamba_config(config: Mapping) -> Mapping:
    """Jamba's layer kinds from its periods (Transformers' layers_block_type and layers_num_experts):
    attention on every attn_layer_period-th layer from attn_layer_offset, routed experts on every
    expert_layer_period-th from expert_layer_offset when num_experts is above one."""
    c, n = _scan_config(config), _n_layers(config)
    types = _period_types(c, n, "attn_layer", 8, 4, "full_attention", "linear_attention")
    if c.get("layer_types") is None and types is not None:
        c["layer_types"] = types
    experts = c.get("num_experts", c.get("num_local_experts", 16))
    routed = _period_types(c, n, "expert_layer", 2, 1, "sparse", "dense")
    if c.get("mlp_layer_types") is None and routed is not None:
        c["mlp_layer_types"] = routed if isinstance(experts, int) and experts > 1 else ["dense"] * n
    return c


def _offset_past_period(kind: str) -> Callable[[Mapping], bool]:
    def when(c: Mapping) -> bool:
        p, o = c.get(f"{kind}_layer_period"), c.get(f"{kind}_layer_offset")
        return isinstance(p, int) and isinstance(o, int) and not 0 <= o < p
    return when


def _bamba_config(config: Mapping) -> Mapping:
    """Bamba's attention layers from attn_layer_indices, and its rotation over attn_rotary_emb
    components of each head (Transformers fixes half of each head when it is not stated)."""
    c, n = _scan_config(config), _n_layers(config)
    indices = c.get("attn_layer_indices") or []
    if c.get("layer_types") is None and isinstance(indices, list):
        c["layer_types"] = ["full_attention" if i in indices else "linear_attention" for i in range(n)]
    rp = dict(c.get("rope_parameters") or {"rope_type": "default", "rope_theta": c.get("rope_theta", 10000.0)})
    rot, heads, hidden = c.get("attn_rotary_emb"), c.get("num_attention_heads"), c.get("hidden_size")
    head_dim = c.get("head_dim") or (hidden // heads if isinstance(hidden, int) and isinstance(heads, int)
                                     and heads > 0 else None)
    if isinstance(rot, int) and not isinstance(rot, bool) and isinstance(head_dim, int) and head_dim > 0:
        rp["partial_rotary_factor"] = rot / head_dim
    rp.setdefault("partial_rotary_factor", 0.5)
    c["rope_parameters"] = rp
    return c


_LEGACY_LAYER_TYPES = {"mamba": "linear_attention", "attention": "full_attention"}


def _granite_hybrid_config(config: Mapping) -> Mapping:
    """Granite 4.0's layer_types in Transformers 5's words, every layer routed when it has experts."""
    c, n = _scan_config(config), _n_layers(config)
    if isinstance(c.get("layer_types"), list):
        c["layer_types"] = [_LEGACY_LAYER_TYPES.get(t, t) for t in c["layer_types"]]
    experts = c.get("num_local_experts", 8)
    if c.get("mlp_layer_types") is None and isinstance(experts, int) and experts > 0:
        c["mlp_layer_types"] = ["sparse"] * n
    return c


def _granite_hybrid_unrotated(c: Mapping) -> bool:
    """Granite 4.0's attention rotates only under position_embedding_type rope; in a GGUF file,
    llama.cpp's switch is rope.scaling.finetuned (its converter writes it false for hybrids)."""
    if "rope_scaling_finetuned" in c:
        return c["rope_scaling_finetuned"] is False
    return c.get("position_embedding_type") != "rope"


def _granite_hybrid_layer_types_unsupported(c: Mapping) -> bool:
    types = c.get("layer_types")
    return not isinstance(types, list) or any(t not in ("linear_attention", "full_attention") for t in types)


_NEMOTRON_LETTERS = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
_NEMOTRON_TYPES = {"mamba": "linear_attention", "attention": "full_attention", **{v: v for v in _NEMOTRON_LETTERS.values()}}


def _nemotron_h_config(config: Mapping) -> Mapping:
    """Nemotron-H's layer kinds from hybrid_override_pattern (M, *, -, E) or, as Transformers 5 saves
    them, layers_block_type; its Mamba-2 keys' other spellings; the step's floor at time_step_min
    (Transformers clamps to [time_step_min, inf) whatever time_step_limit says)."""
    c = _scan_config(config)
    pattern, listed = c.get("hybrid_override_pattern"), c.get("layers_block_type")
    types = None
    if isinstance(pattern, str):
        types = [_NEMOTRON_LETTERS.get(ch, f"letter {ch!r}") for ch in pattern]
    elif isinstance(listed, list):
        types = [_NEMOTRON_TYPES.get(t, f"type {t!r}") if isinstance(t, str) else repr(t) for t in listed]
    if types is not None and c.get("layer_types") is None:
        c["layer_types"] = types
    if c.get("num_hidden_layers") is None and types is not None:
        c["num_hidden_layers"] = len(types)
    low = c.get("time_step_min", 0.001)
    c["time_step_limit"] = [low if isinstance(low, (int, float)) and not isinstance(low, bool) else 0.001, None]
    return c


def _nemotron_h_pattern_wrong(c: Mapping) -> bool:
    types = c.get("layer_types")
    return (not isinstance(types, list) or len(types) != c.get("num_hidden_layers")
            or any(t not in _NEMOTRON_TYPES.values() for t in types))


def _falcon_h1_config(config: Mapping) -> Mapping:
    """Falcon-H1: attention and the scan side by side on every layer."""
    c, n = _scan_config(config), _n_layers(config)
    if c.get("layer_types") is None:
        c["layer_types"] = ["hybrid"] * n
    return c


def _numbers(key: str, n: int) -> Callable[[Mapping], bool]:
    """Predicate: ``key`` is stated and is not a list of ``n`` finite numbers."""
    def when(c: Mapping) -> bool:
        v = c.get(key)
        return v is not None and not (isinstance(v, list) and len(v) == n and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf") for x in v))
    return when


def _mamba2_width_mismatch(inner_key: str | None, expand_key: str, heads_key: str, head_key: str,
                           expand_default: int = 2, inner_default=None) -> Callable[[Mapping], bool]:
    """Predicate: the scan's width (``inner_key``, else expand * hidden_size) is not its heads' total."""
    def when(c: Mapping) -> bool:
        inner = c.get(inner_key, inner_default) if inner_key else None
        hidden, expand, heads, head = c.get("hidden_size"), c.get(expand_key, expand_default), c.get(heads_key), c.get(head_key)
        if inner is None and isinstance(hidden, int) and isinstance(expand, int):
            inner = expand * hidden
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (inner, heads)) or heads <= 0:
            return False
        if head in (None, "auto"):
            return inner % heads != 0
        return isinstance(head, int) and head * heads != inner
    return when


_SSM_ADAPTERS = dict(adapters="none")
_MAMBA_KEYS = {"ssm_state_size": ("state_size",), "ssm_conv_kernel": ("conv_kernel",), "ssm_expand": ("expand",),
               "ssm_inner_size": ("intermediate_size",), "ssm_dt_rank": ("time_step_rank",),
               "ssm_act": ("hidden_act",), "head_dim": (), "norm_eps": ("layer_norm_epsilon",)}
# (Transformers' Mamba, Falcon-Mamba and Mamba-2 read their norms' epsilon from layer_norm_epsilon only.)
_MAMBA_DEFAULTS = {"ssm_state_size": 16, "ssm_conv_kernel": 4, "ssm_expand": 2, "ssm_dt_rank": "auto",
                   "norm_eps": 1e-5, "max_position_embeddings": 1 << 20}
_MAMBA = dict(recurrent="mamba", ffn_layers="none", norms=("attn_norm",), positions="none", names=MAMBA_NAMES,
              keys=_MAMBA_KEYS, fixed={"num_attention_heads": 1, "num_key_value_heads": 1}, defaults=_MAMBA_DEFAULTS,
              tie_default=True, normalize=lambda c: _scan_config(c, _n_layers(c)), gguf_arch="mamba",
              gguf_names=GGUF_SSM_NAMES, reference_hidden="layers", **_SSM_ADAPTERS)
# Bamba's and Granite 4.0's Mamba-2 keys (mamba_d_head "auto": the width over the heads).
_MAMBA2_HYBRID_KEYS = {"ssm_state_size": ("mamba_d_state",), "ssm_conv_kernel": ("mamba_d_conv",),
                       "ssm_expand": ("mamba_expand",), "ssm_num_heads": ("mamba_n_heads",),
                       "ssm_head_dim": ("mamba_d_head",), "ssm_groups": ("mamba_n_groups",), "ssm_act": ("hidden_act",)}
_MAMBA2_HYBRID_DEFAULTS = {"ssm_state_size": 256, "ssm_conv_kernel": 4, "ssm_expand": 2, "ssm_num_heads": 128,
                           "ssm_head_dim": "auto", "ssm_groups": 1}
_BAMBA_WIDTH = Refusal(_mamba2_width_mismatch(None, "mamba_expand", "mamba_n_heads", "mamba_d_head"),
                       "a Mamba-2 width (mamba_expand * hidden_size) other than its heads' total "
                       "(mamba_n_heads * mamba_d_head) is not supported")


# ---- group MLA-B (issue 14, part B): the latent-attention descendants' names, readers and refusals.
# DeepSeek Sparse Attention's indexer below self_attn.indexer (decoder/indexer.py), as Transformers and
# DeepSeek's releases name it, and as llama.cpp's converter writes it (blk.N.indexer.*).
DSA_NAMES = dict(idx_q_b=_SA + "indexer.wq_b", idx_k=_SA + "indexer.wk", idx_k_norm=_SA + "indexer.k_norm",
                 idx_w=_SA + "indexer.weights_proj")
DEEPSEEK_DSA_NAMES = _with(DEEPSEEK_NAMES, **DSA_NAMES)
GGUF_DSA_NAMES = _with(GGUF_LATENT_NAMES, idx_q_b="blk.{i}.indexer.attn_q_b", idx_k="blk.{i}.indexer.attn_k",
                       idx_k_norm="blk.{i}.indexer.k_norm", idx_w="blk.{i}.indexer.proj")
_V3_REFUSALS = (Refusal(_stated_other("scoring_func", "sigmoid"),
                        "a scoring_func other than sigmoid is not supported (Transformers' router for this family "
                        "scores by sigmoid whatever it says)"),
                Refusal(_stated_other("topk_method", "noaux_tc"),
                        "a topk_method other than noaux_tc is not supported (Transformers' router for this family "
                        "chooses by noaux_tc whatever it says)"))
# The main attention of DeepSeek-V3.2 and GLM-5 rotates adjacent pairs whatever rope_interleave says.
_ROPE_PAIRS = Refusal(lambda c: c.get("rope_interleave") is False,
                      "rope_interleave: false is not supported (Transformers rotates this family's latent attention "
                      "by adjacent pairs whatever it says)")


def _indexer_pairs(interleaved: bool) -> Refusal:
    """The indexer's rotation is fixed per family in Transformers; a config saying otherwise is refused."""
    return Refusal(lambda c: c.get("indexer_rope_interleave") is not None
                   and bool(c["indexer_rope_interleave"]) != interleaved,
                   f"indexer_rope_interleave: {str(not interleaved).lower()} is not supported (Transformers' indexer "
                   f"for this family rotates {'adjacent pairs' if interleaved else 'halves'} whatever it says)")



# Dots3-Note: DeepSeek-V3.2's block with a second latent attention on its sliding-window layers.
DOTS3_NAMES = _with(DEEPSEEK_DSA_NAMES, g=_SA + "g_proj", k_rope_norm=_SA + "k_rope_only_layernorm")
#: llama.cpp's dots3note tensors (conversion/dots3.py, src/models/dots3note.cpp): the head-wise gate and the
#: rotated key part's norm.
GGUF_DOTS3_NAMES = _with(GGUF_DSA_NAMES, g="blk.{i}.attn_gate", k_rope_norm="blk.{i}.attn_k_norm")
#: Dots3NoteTextConfig's defaults for the sliding-window layers' latent (its swa_* keys).
_DOTS3_SWA = {"num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 1024, "kv_lora_rank": 1024,
              "head_dim": 256, "qk_nope_head_dim": 192, "v_head_dim": 128}


def _dots3_config(config: Mapping) -> Mapping:
    """Dots3-Note's spellings as Transformers' Dots3NoteTextConfig reads them (its defaults included), in
    ster's terms: ``mlp_layer_types`` from first_k_dense_replace / moe_layer_freq; ``layer_types`` (the
    release's full_attention layers are indexed under use_dsa, the default; without the list, every layer
    but 0, 1 and each 4k+1 slides under use_sliding_window) as full / sliding layers with their indexer
    kind in ``indexer_types``; the sliding layers' latent and heads from the swa_* keys in
    ``per_layer_config``; ``sliding_window`` from sliding_window_size; one plain rotation per layer kind,
    rope_theta and swa_rope_theta; the shared experts' width shared_experts_intermediate_size (or
    moe_shared_expert_intermediate_size) times n_shared_experts."""
    c, n = dict(config), _n_layers(config)
    if c.get("mlp_layer_types") is None and n:
        k, freq = c.get("first_k_dense_replace", 1), c.get("moe_layer_freq", 1)
        if isinstance(k, int) and (isinstance(freq, list) or isinstance(freq, int) and freq > 0):
            c["mlp_layer_types"] = ["sparse" if i >= k and (bool(freq[i]) if isinstance(freq, list) and i < len(freq)
                                                            else isinstance(freq, int) and i % freq == 0) else "dense"
                                    for i in range(n)]
    c.pop("first_k_dense_replace", None)
    c.pop("moe_layer_freq", None)
    shared = c.get("shared_experts_intermediate_size", c.get("moe_shared_expert_intermediate_size", 1536))
    n_shared = c.get("n_shared_experts", 1)
    if isinstance(shared, int) and isinstance(n_shared, int):
        c["shared_intermediate_size"] = shared * n_shared
    if c.get("sliding_window") is None:
        c["sliding_window"] = c.get("sliding_window_size", 512)
    use_dsa = c.get("use_dsa", None if "per_layer_config" in c else True)
    types = c.get("layer_types")
    if types is None and n:
        full = "full_attention" if use_dsa is False else "indexed_attention"
        types = [full if not c.get("use_sliding_window", True) or i < 2 or i % 4 == 1 else "sliding_attention"
                 for i in range(n)]
    if isinstance(types, list):
        if use_dsa is not None:
            old, new = ("full_attention", "indexed_attention") if use_dsa else ("indexed_attention", "full_attention")
            types = [new if t == old else t for t in types]
        c["indexer_types"] = ["full" if t == "indexed_attention" else "none" for t in types]
        c["layer_types"] = ["full_attention" if t == "indexed_attention" else t for t in types]
        if c.get("per_layer_config") is None:
            swa = {k: c.get(f"swa_{k}", v) for k, v in _DOTS3_SWA.items()}
            if isinstance(swa["head_dim"], int) and isinstance(swa["qk_nope_head_dim"], int):
                swa["qk_rope_head_dim"] = c.get("swa_qk_rope_head_dim", swa["head_dim"] - swa["qk_nope_head_dim"])
            c["per_layer_config"] = {str(i): swa for i, t in enumerate(types) if t == "sliding_attention"}
    if _dots3_rope_scaled(c):
        return c  # left as stated, for the gate's refusal
    rp = c.get("rope_parameters")
    theta = c.get("rope_theta", 80_000_000.0)
    if isinstance(rp, Mapping) and any(k in rp for k in ("indexed_attention", "full_attention", "sliding_attention")):
        full = rp.get("indexed_attention") or rp.get("full_attention") or {}
        theta = full.get("rope_theta", theta) if isinstance(full, Mapping) else theta
        swa = rp.get("sliding_attention") or {}
        swa_theta = swa.get("rope_theta", 50_000.0) if isinstance(swa, Mapping) else 50_000.0
    else:
        swa_theta = c.get("swa_rope_theta", 50_000.0)
    c["rope_parameters"] = {"full_attention": {"rope_type": "default", "rope_theta": theta},
                            "sliding_attention": {"rope_type": "default", "rope_theta": swa_theta}}
    c.pop("rope_scaling", None)
    return c


def _dots3_rope_scaled(config: Mapping) -> bool:
    """A rotation other than the plain one, stated in rope_scaling or in any of rope_parameters' sets."""
    sets = [config.get("rope_scaling")]
    rp = config.get("rope_parameters")
    if isinstance(rp, Mapping):
        sets += list(rp.values()) if all(isinstance(v, Mapping) for v in rp.values()) and rp else [rp]
    return any(isinstance(p, Mapping) and p.get("rope_type", p.get("type", "default")) not in ("default", None)
               for p in sets)


def _dots3_rope_widths_differ(config: Mapping) -> bool:
    """The sliding layers' rotated width (swa_qk_rope_head_dim, else swa_head_dim - swa_qk_nope_head_dim, or
    per_layer_config's) differs from qk_rope_head_dim."""
    rope = config.get("qk_rope_head_dim", 64)
    if config.get("swa_qk_rope_head_dim") is not None:
        return config["swa_qk_rope_head_dim"] != rope
    head, nope = config.get("swa_head_dim"), config.get("swa_qk_nope_head_dim")
    if isinstance(head, int) and isinstance(nope, int):
        return head - nope != rope
    layers = config.get("per_layer_config")
    return isinstance(layers, Mapping) and any(isinstance(e, Mapping) and e.get("qk_rope_head_dim") not in (None, rope)
                                               for e in layers.values())


_DOTS3_REFUSALS = (
    Refusal(lambda c: any(c.get(k) not in (None, "headwise") for k in ("attention_gate_type", "swa_attention_gate_type")),
            "an attention_gate_type or swa_attention_gate_type other than headwise is not supported (Transformers "
            "gates each head's output by one sigmoid)"),
    Refusal(_dots3_rope_widths_differ,
            "sliding-window layers rotating another width than the full-attention ones (swa_qk_rope_head_dim other "
            "than qk_rope_head_dim) are not supported"),
    Refusal(lambda c: c.get("apply_mla_qkv_lora_rescale") is False,
            "apply_mla_qkv_lora_rescale: false is not supported (Transformers rescales the latent bottlenecks by "
            "sqrt(hidden_size / rank) whatever it says)"),
    Refusal(_dots3_rope_scaled,
            "a rope_scaling or rope type other than the plain rotation is not supported for dots3_note (vLLM "
            "rotates by the plain base whatever it states; Transformers would scale)"),
)


# LongCat-Flash: two latent-attention halves per stored layer, their dense feed-forwards (mlps.{half}) and
# the shortcut-connected experts (mlp.router.classifier, mlp.experts) with identity experts.
_LH = _L + "self_attn.{half}."
LONGCAT_NAMES = _with(DEEPSEEK_NAMES, attn_norm=_L + "input_layernorm.{half}",
                      ffn_norm=_L + "post_attention_layernorm.{half}", q=_LH + "q_proj", q_a=_LH + "q_a_proj",
                      q_a_norm=_LH + "q_a_layernorm", q_b=_LH + "q_b_proj", kv_a=_LH + "kv_a_proj_with_mqa",
                      kv_a_norm=_LH + "kv_a_layernorm", kv_b=_LH + "kv_b_proj", o=_LH + "o_proj",
                      gate=_L + "mlps.{half}.gate_proj", up=_L + "mlps.{half}.up_proj",
                      down=_L + "mlps.{half}.down_proj", router=_M + "router.classifier",
                      router_select_bias=_M + "router.e_score_correction_bias", shexp_gate=None, shexp_up=None,
                      shexp_down=None)


def _longcat_config(config: Mapping) -> Mapping:
    """LongCat-Flash's stored layers counted as ster's (two each: ``num_hidden_layers``), every one with a
    dense feed-forward (``mlp_layer_types``; the routed one is the shortcut, ``FamilySpec.shortcut_pairs``)."""
    c = dict(config)
    n = c.get("num_layers")
    if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 2048:
        c["num_hidden_layers"] = 2 * n
        c["mlp_layer_types"] = ["dense"] * (2 * n)
    return c


_LONGCAT_REFUSALS = (
    Refusal(lambda c: c.get("head_dim", 64) != c.get("qk_rope_head_dim", 64),
            "a head_dim other than qk_rope_head_dim is not supported (Transformers sizes LongCat-Flash's rotation "
            "tables by head_dim and rotates qk_rope_head_dim components with them)"),
    Refusal(lambda c: c.get("qk_head_dim") is not None
            and c["qk_head_dim"] != c.get("qk_nope_head_dim", 128) + c.get("qk_rope_head_dim", 64),
            "a qk_head_dim other than qk_nope_head_dim + qk_rope_head_dim is not supported"),
    Refusal(lambda c: "q_lora_rank" in c and c["q_lora_rank"] is None,
            "q_lora_rank: null is not supported (LongCat-Flash always projects its queries through the latent)"),
    Refusal(lambda c: c.get("mla_scale_q_lora") is False or c.get("mla_scale_kv_lora") is False,
            "mla_scale_q_lora / mla_scale_kv_lora: false is not supported (Transformers scales both latents by "
            "sqrt(hidden_size / rank) whatever they say)"),
    Refusal(lambda c: bool(c.get("router_bias")),
            "router_bias: true is not supported (Transformers' LongCat-Flash router stores the classifier's bias but "
            "scores without it, so which of the two the weights were trained with is unclear)"),
)

def _glm_dsa_config(config: Mapping) -> Mapping:
    """GLM-5's indexed and shared layers as Transformers' GlmMoeDsaConfig derives ``indexer_types`` when a
    config lists none: from ``index_topk_pattern`` (F: full, S: shared), else a layer i is full when
    max(i - offset + 1, 0) is a multiple of ``index_topk_freq`` (1), offset ``index_skip_topk_offset`` (2)."""
    c, n = dict(config), _n_layers(config)
    if c.get("indexer_types") is None:
        pattern = c.get("index_topk_pattern")
        if isinstance(pattern, str):
            c["indexer_types"] = [{"F": "full", "S": "shared"}.get(ch, ch) for ch in pattern]
        elif isinstance(pattern, list):
            c["indexer_types"] = list(pattern)
        else:
            freq, offset = c.get("index_topk_freq", 1), c.get("index_skip_topk_offset", 2)
            if isinstance(freq, int) and isinstance(offset, int) and not isinstance(freq, bool) \
                    and not isinstance(offset, bool):
                freq = max(freq, 1)
                c["indexer_types"] = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
    return c

# ----------------------------------------------------------------------------- delta-rule families
# group SSM-B2 (issue 15, part B2): the gated delta net (Qwen3-Next, Qwen3.5, OLMo Hybrid) and Kimi
# Delta Attention (Kimi-Linear). Each family's normalize writes layer_types in Transformers 5's words
# (linear_attention: the family's delta-rule mixer; full_attention).

_LA = _L + "linear_attn."
_DELTA_COMMON = dict(lin_conv=_LA + "conv1d", lin_dt_bias=_LA + "dt_bias", lin_a_log=_LA + "A_log",
                     lin_norm=_LA + "norm")
# Qwen3-Next: in_proj_qkvz / in_proj_ba grouped per key head; Qwen2-MoE's experts and gated shared expert.
QWEN3_NEXT_NAMES = _with(QWEN2_MOE_NAMES, lin_qkvz=_LA + "in_proj_qkvz", lin_ba=_LA + "in_proj_ba",
                         lin_out=_LA + "out_proj", **_DELTA_COMMON)
# Qwen3.5: every query, key, value in in_proj_qkv; the gate, b and a apart.
_QWEN35_LINEAR = dict(lin_qkv=_LA + "in_proj_qkv", lin_z=_LA + "in_proj_z", lin_b=_LA + "in_proj_b",
                      lin_a=_LA + "in_proj_a", lin_out=_LA + "out_proj", **_DELTA_COMMON)
QWEN35_NAMES = _with(LLAMA_NAMES, **_QWEN35_LINEAR)
QWEN35_MOE_NAMES = _with(QWEN2_MOE_NAMES, **_QWEN35_LINEAR)
# OLMo Hybrid: OLMo 3's post-norm attention layers; pre-norm delta-net layers with separate projections
# (OLMo-core's names attention_layer_norm / feedforward_layer_norm, which Transformers renames to
# input_layernorm / post_attention_layernorm, are read too),
# g_proj the output gate, o_norm the gated norm, one conv1d or OLMo-core's q/k/v_conv1d.
OLMO_HYBRID_NAMES = _with(OLMO2_NAMES, attn_norm=(_L + "input_layernorm", _L + "attention_layer_norm"),
                          attn_post_norm=(_L + "post_attention_layernorm", _L + "feedforward_layer_norm"),
                          ffn_norm=(_L + "post_attention_layernorm", _L + "feedforward_layer_norm"),
                          lin_q=_LA + "q_proj", lin_k=_LA + "k_proj", lin_v=_LA + "v_proj", lin_a=_LA + "a_proj",
                          lin_b=_LA + "b_proj", lin_z=_LA + "g_proj", lin_out=_LA + "o_proj",
                          lin_q_conv=_LA + "q_conv1d", lin_k_conv=_LA + "k_conv1d", lin_v_conv=_LA + "v_conv1d",
                          **dict(_DELTA_COMMON, lin_norm=_LA + "o_norm"))
# Kimi-Linear as its release stores it (and Transformers 5 writes it back): routed layers below
# block_sparse_moe (gate, its e_score_correction_bias, experts.{e}.w1/w3/w2, shared_experts), the dense
# ones below mlp (block_sparse_moe too when Transformers writes them), and the KDA layers' q/k/v_conv1d
# and forget gate (f_a_proj, f_b_proj, dt_bias, A_log) beside their projections.
_KSA, _KMOE = _L + "self_attn.", _L + "block_sparse_moe."
KIMI_LINEAR_NAMES = _with(
    DEEPSEEK_NAMES, gate=(_M + "gate_proj", _KMOE + "gate_proj"), up=(_M + "up_proj", _KMOE + "up_proj"),
    down=(_M + "down_proj", _KMOE + "down_proj"), router=_KMOE + "gate",
    router_select_bias=_KMOE + "gate.e_score_correction_bias",
    exp_gate=_KMOE + "experts.{e}.w1.weight", exp_up=_KMOE + "experts.{e}.w3.weight",
    exp_down=_KMOE + "experts.{e}.w2.weight", shexp_gate=_KMOE + "shared_experts.gate_proj",
    shexp_up=_KMOE + "shared_experts.up_proj", shexp_down=_KMOE + "shared_experts.down_proj",
    lin_q=_KSA + "q_proj", lin_k=_KSA + "k_proj", lin_v=_KSA + "v_proj", lin_b=_KSA + "b_proj",
    lin_q_conv=_KSA + "q_conv1d", lin_k_conv=_KSA + "k_conv1d", lin_v_conv=_KSA + "v_conv1d",
    lin_f_a=_KSA + "f_a_proj", lin_f_b=_KSA + "f_b_proj", lin_dt_bias=_KSA + "dt_bias", lin_a_log=_KSA + "A_log",
    lin_g_a=_KSA + "g_a_proj", lin_g_b=_KSA + "g_b_proj", lin_norm=_KSA + "o_norm", lin_out=_KSA + "o_proj")

# llama.cpp's names (its converter: qwen.py, kimi_linear.py). Qwen3-Next's in_proj_qkvz is written as
# attn_qkv + attn_gate, its in_proj_ba kept whole (ssm_ba); ssm_a holds -exp(A_log); the norms are stored
# as 1 + w, post_attention_layernorm as post_attention_norm; attention's gate stays in attn_q's rows.
_GGUF_DELTA = dict(lin_qkv="blk.{i}.attn_qkv", lin_z="blk.{i}.attn_gate", lin_conv="blk.{i}.ssm_conv1d",
                   lin_dt_bias="blk.{i}.ssm_dt.bias", lin_ssm_a="blk.{i}.ssm_a", lin_norm="blk.{i}.ssm_norm",
                   lin_out="blk.{i}.ssm_out")
GGUF_QWEN3NEXT_NAMES = _with(GGUF_NAMES, ffn_norm="blk.{i}.post_attention_norm", g=None, qkv=None,
                             lin_ba="blk.{i}.ssm_ba", **_GGUF_DELTA)
GGUF_QWEN35_NAMES = _with(GGUF_QWEN3NEXT_NAMES, lin_ba=None, lin_b="blk.{i}.ssm_beta", lin_a="blk.{i}.ssm_alpha")
GGUF_KIMI_LINEAR_NAMES = _with(GGUF_LATENT_NAMES, lin_q="blk.{i}.attn_q", lin_k="blk.{i}.attn_k",
                               lin_v="blk.{i}.attn_v", lin_q_conv="blk.{i}.ssm_conv1d_q",
                               lin_k_conv="blk.{i}.ssm_conv1d_k", lin_v_conv="blk.{i}.ssm_conv1d_v",
                               lin_f_a="blk.{i}.ssm_f_a", lin_f_b="blk.{i}.ssm_f_b", lin_b="blk.{i}.ssm_beta",
                               lin_ssm_a="blk.{i}.ssm_a", lin_dt_bias="blk.{i}.ssm_dt.bias",
                               lin_g_a="blk.{i}.ssm_g_a", lin_g_b="blk.{i}.ssm_g_b", lin_norm="blk.{i}.ssm_norm",
                               lin_out="blk.{i}.attn_output")

_QWEN_DELTA_KEYS = {"delta_k_heads": ("linear_num_key_heads",), "delta_v_heads": ("linear_num_value_heads",),
                    "delta_k_dim": ("linear_key_head_dim",), "delta_v_dim": ("linear_value_head_dim",),
                    "delta_conv_kernel": ("linear_conv_kernel_dim",), "ssm_act": ("hidden_act",)}
_QWEN_LINEAR_SIZES = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                      "linear_value_head_dim", "linear_conv_kernel_dim")


def _interval_types(c: Mapping, n: int) -> list[str] | None:
    """Qwen3-Next's layer kinds from full_attention_interval p: every p-th layer attends."""
    p = c.get("full_attention_interval")
    if isinstance(p, bool) or not isinstance(p, int) or p <= 0:
        return None
    return ["linear_attention" if (i + 1) % p else "full_attention" for i in range(n)]


def _qwen_delta_config(config: Mapping) -> Mapping:
    """Qwen3-Next's and Qwen3.5's layer kinds (layer_types, else full_attention_interval); Qwen3.5-MoE
    routes every layer."""
    c, n = dict(config), _n_layers(config)
    if c.get("layer_types") is None:
        types = _interval_types(c, n)
        if types is not None:
            c["layer_types"] = types
    if c.get("model_type") == "qwen3_5_moe_text" and c.get("mlp_layer_types") is None:
        c["mlp_layer_types"] = ["sparse"] * n
    return c


def _qwen_layer_types_wrong(c: Mapping) -> bool:
    types = c.get("layer_types")
    return isinstance(types, list) and any(t not in ("linear_attention", "full_attention") for t in types)


_QWEN_DELTA_REFUSALS = (
    Refusal(lambda c: c.get("layer_types") is None,
            "a config without layer_types or full_attention_interval (which layers attend) is not supported"),
    Refusal(_qwen_layer_types_wrong,
            "a layer type other than linear_attention and full_attention in layer_types is not supported"),
    Refusal(lambda c: any(c.get(k) is None for k in _QWEN_LINEAR_SIZES),
            "a config without every linear-attention size (" + ", ".join(_QWEN_LINEAR_SIZES) + ") is not supported"),
)
_QWEN_DELTA = dict(recurrent="gated_delta", norm_unit_offset=True, qk_norm="head", attn_gate="sigmoid",
                   attn_gate_per_head=False, attn_gate_in_q=True, normalize=_qwen_delta_config, unread=("mtp.",),
                   keys=_QWEN_DELTA_KEYS, config_defaults={"partial_rotary_factor": 0.25},
                   refusals=_QWEN_DELTA_REFUSALS, adapters="none")
# Qwen3.5 follows attn_output_gate (on by default); Transformers 5.24 gates whatever it says.
_QWEN35_VARIANTS = (Variant(lambda c: c.get("attn_output_gate") is False,
                            {"attn_gate": None, "attn_gate_in_q": False}),)


def _olmo_hybrid_config(config: Mapping) -> Mapping:
    """OLMo Hybrid's defaults as Transformers' OlmoHybridConfig derives them: every fourth layer from the
    fourth attends (the last one when none would), linear-attention heads as many as the attention
    heads, keys 0.75 * hidden / heads wide, values twice that; a rope_parameters whose rope_theta is
    null leaves attention unrotated (``_unrotated``)."""
    c, n = dict(config), _n_layers(config)
    if c.get("layer_types") is None and n:
        types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(n)]
        if "full_attention" not in types:
            types[-1] = "full_attention"
        c["layer_types"] = types
    heads, hidden = c.get("num_attention_heads"), c.get("hidden_size")
    for key in ("linear_num_key_heads", "linear_num_value_heads"):
        if c.get(key) is None:
            c[key] = heads
    hk = c.get("linear_num_key_heads")
    if c.get("linear_key_head_dim") is None and all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                                     for v in (hk, hidden)):
        c["linear_key_head_dim"] = int(0.75 * hidden / hk)
    if c.get("linear_value_head_dim") is None and isinstance(c.get("linear_key_head_dim"), int):
        c["linear_value_head_dim"] = 2 * c["linear_key_head_dim"]
    rp = c.get("rope_parameters")
    if isinstance(rp, Mapping) and "rope_theta" in rp and rp["rope_theta"] is None:
        c["rope_parameters"] = {**rp, "rope_theta": 10000.0}
        c["_unrotated"] = True
    return c


def _kimi_linear_config(config: Mapping) -> Mapping:
    """Kimi-Linear's layer kinds from linear_attn_config's kda_layers (counted from one; the others attend),
    when the config lists no layer_types."""
    c, n = dict(config), _n_layers(config)
    lac = c.get("linear_attn_config")
    kda = lac.get("kda_layers") if isinstance(lac, Mapping) else None
    if c.get("layer_types") is None and isinstance(kda, list):
        c["layer_types"] = ["linear_attention" if i + 1 in kda else "full_attention" for i in range(n)]
    return c


def _kda_layers_outside(c: Mapping) -> bool:
    lac, n = c.get("linear_attn_config"), _n_layers(c)
    kda = lac.get("kda_layers") if isinstance(lac, Mapping) else None
    return kda is not None and (not isinstance(kda, list) or any(
        isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= n for x in kda))


_KDA_SIZES = ("num_heads", "head_dim", "short_conv_kernel_size")
_KIMI_KEYS = dict(_LATENT_KEYS, **{
    "num_experts_per_tok": ("num_experts_per_tok", "num_experts_per_token"),
    "norm_topk_prob": ("norm_topk_prob", "moe_renormalize"), "n_group": ("n_group", "num_expert_group"),
    "max_position_embeddings": ("max_position_embeddings", "model_max_length"),
    "delta_k_heads": ("linear_attn_config.num_heads", "linear_num_heads"),
    "delta_v_heads": ("linear_attn_config.num_heads", "linear_num_heads"),
    "delta_k_dim": ("linear_attn_config.head_dim", "linear_head_dim"),
    "delta_v_dim": ("linear_attn_config.head_dim", "linear_head_dim"),
    "delta_conv_kernel": ("linear_attn_config.short_conv_kernel_size", "linear_conv_kernel_dim"),
    "ssm_act": ("hidden_act",)})
_KIMI_REFUSALS = (
    Refusal(lambda c: c.get("kv_lora_rank") is None,
            "a config without kv_lora_rank (its latent-attention layers' rank) is not supported"),
    Refusal(lambda c: not isinstance(c.get("linear_attn_config"), Mapping),
            "a config without linear_attn_config (its Kimi Delta Attention layers) is not supported"),
    Refusal(lambda c: isinstance(c.get("linear_attn_config"), Mapping)
            and any(c["linear_attn_config"].get(k) is None for k in _KDA_SIZES),
            "a linear_attn_config without " + ", ".join(_KDA_SIZES) + " is not supported"),
    Refusal(_kda_layers_outside, "a linear_attn_config kda_layers entry outside layers 1..num_hidden_layers "
            "(counted from one) is not supported"),
    Refusal(_stated_other("moe_router_activation_func", "sigmoid"),
            "a moe_router_activation_func other than sigmoid is not supported (Transformers' Kimi-Linear router "
            "scores by sigmoid)"),
    Refusal(lambda c: c.get("mla_use_nope") is False,
            "mla_use_nope false is not supported (Transformers' Kimi-Linear never rotates its latent attention)"),
    Refusal(lambda c: c.get("use_grouped_topk") is False and (c.get("num_expert_group") or 1) > 1,
            "use_grouped_topk false with num_expert_group above one is not supported (Transformers' "
            "Kimi-Linear router groups whatever it says)"),
    Refusal(lambda c: isinstance(c.get("linear_attn_config"), Mapping) and any(
        c["linear_attn_config"].get(k) not in (None, False) for k in ("gate_lower_bound", "use_full_rank_gate")),
            "a linear_attn_config gate_lower_bound or use_full_rank_gate is not supported for kimi_linear "
            "(Transformers' Kimi-Linear reads neither: they are Kimi-K3's)"),
)


# ----------------------------------------------------------------------------- group SSM-B1
# Issue 15, part B1: LFM2's gated short convolution (lfm2, lfm2_moe), MiniMax's lightning attention
# (minimax as Transformers spells it, minimax_text_01 as MiniMax's own checkpoints do) and Zamba2's
# shared transformer blocks (zamba2).

# LFM2: operator_norm before the mixer (a short convolution under conv.*, or attention with per-head
# q_layernorm / k_layernorm and out_proj), ffn_norm before feed_forward.w1 / w3 / w2; embedding_norm is
# the final norm.
LFM2_NAMES = _with(LLAMA_NAMES, final_norm="model.embedding_norm", attn_norm=_L + "operator_norm",
                   ffn_norm=_L + "ffn_norm", o=_L + "self_attn.out_proj", q_norm=_L + "self_attn.q_layernorm",
                   k_norm=_L + "self_attn.k_layernorm", gate=_L + "feed_forward.w1", up=_L + "feed_forward.w3",
                   down=_L + "feed_forward.w2", ssm_in=_L + "conv.in_proj", ssm_conv=_L + "conv.conv",
                   ssm_out=_L + "conv.out_proj")
_LF = _L + "feed_forward."
LFM2_MOE_NAMES = _with(LFM2_NAMES, router=_LF + "gate", router_select_bias=_LF + "expert_bias",
                       exp_gate=_LF + "experts.{e}.w1.weight", exp_up=_LF + "experts.{e}.w3.weight",
                       exp_down=_LF + "experts.{e}.w2.weight")
# llama.cpp's lfm2 / lfm2moe: the final norm is token_embd_norm, the convolution's tensors shortconv.*.
GGUF_LFM2_NAMES = _with(GGUF_NAMES, final_norm="token_embd_norm", ssm_in="blk.{i}.shortconv.in_proj",
                        ssm_conv="blk.{i}.shortconv.conv", ssm_out="blk.{i}.shortconv.out_proj")


def _lfm2_config(config: Mapping) -> Mapping:
    """LFM2's hub spellings as Transformers reads them: block_ff_dim and tie_embedding win over
    intermediate_size and tie_word_embeddings; the feed-forward width shrunk to two thirds, then
    (when block_ffn_dim_multiplier is stated) scaled and rounded up to block_multiple_of under
    block_auto_adjust_ff_dim (``Lfm2MLP``; written back with the adjustment switched off);
    layer_types from full_attn_idxs (none stated: every layer attends), a convolution layer
    ("conv") being the family's scan (linear_attention)."""
    c = dict(config)
    if c.get("block_ff_dim") is not None:
        c["intermediate_size"] = c.pop("block_ff_dim")
    width, mult, multiple = c.get("intermediate_size"), c.get("block_ffn_dim_multiplier", 1.0), c.get(
        "block_multiple_of", 256)
    if c.get("block_auto_adjust_ff_dim", True) and isinstance(width, int) and not isinstance(width, bool):
        width = int(2 * width / 3)
        if isinstance(mult, (int, float)) and not isinstance(mult, bool) and isinstance(multiple, int) and multiple > 0:
            width = int(mult * width)
            width = multiple * ((width + multiple - 1) // multiple)
        c["intermediate_size"], c["block_auto_adjust_ff_dim"] = width, False
    return _lfm2_moe_config(c)


def _lfm2_moe_config(config: Mapping) -> Mapping:
    """LFM2-MoE's layer_types (as LFM2's, from full_attn_idxs when absent) and tie_embedding; its
    dense feed-forwards are intermediate_size wide as stated (``Lfm2MoeMLP``)."""
    c, n = dict(config), _n_layers(config)
    if "tie_embedding" in c:
        c["tie_word_embeddings"] = c.pop("tie_embedding")
    if c.get("layer_types") is None:
        idxs = c.get("full_attn_idxs")
        idxs = idxs if isinstance(idxs, list) else list(range(n))
        c["layer_types"] = ["full_attention" if i in idxs else "conv" for i in range(n)]
    if isinstance(c["layer_types"], list):
        c["layer_types"] = ["linear_attention" if t == "conv" else t for t in c["layer_types"]]
    return c


def _lfm2_layer_types_wrong(c: Mapping) -> bool:
    types = c.get("layer_types")
    return not isinstance(types, list) or any(t not in ("linear_attention", "full_attention") for t in types)


_LFM2_LAYER_TYPES = Refusal(_lfm2_layer_types_wrong, "a layer type other than conv and full_attention in layer_types "
                            "is not supported")
# Transformers' LFM2 feed-forwards run SiLU whatever hidden_act says: no activation key is read; its norms'
# epsilon is norm_eps only.
_LFM2 = dict(recurrent="shortconv", qk_norm="head", names=LFM2_NAMES, normalize=_lfm2_config, tie_default=True,
             adapters="none", keys={"ssm_conv_kernel": ("conv_L_cache",), "act": (), "norm_eps": ("norm_eps",)},
             defaults={"ssm_conv_kernel": 3, "rope_theta": 1_000_000.0, "norm_eps": 1e-5},
             gguf_names=GGUF_LFM2_NAMES)

# MiniMax-Text-01: Mixtral's names; lightning layers hold self_attn.qkv_proj, output_gate, norm, out_proj.
MINIMAX_NAMES = _with(MIXTRAL_NAMES, ssm_in=_L + "self_attn.qkv_proj", ssm_gate=_L + "self_attn.output_gate",
                      ssm_norm=_L + "self_attn.norm", ssm_out=_L + "self_attn.out_proj")
# llama.cpp's minimax-01: the lightning layers' qkv, gate, norm (attn_norm_2) and output.
GGUF_MINIMAX_NAMES = _with(GGUF_NAMES, ssm_in="blk.{i}.attn_qkv", ssm_gate="blk.{i}.attn_gate",
                           ssm_norm="blk.{i}.attn_norm_2", ssm_out="blk.{i}.attn_output")
# Transformers' names of the (alpha, beta) of each sublayer's join, by mixer.
_MINIMAX_SCALES = {"attention": ("full_attn_alpha_factor", "full_attn_beta_factor"),
                   "lightning": ("linear_attn_alpha_factor", "linear_attn_beta_factor"),
                   "ffn": ("mlp_alpha_factor", "mlp_beta_factor")}
# MiniMax's own config names for them (MiniMaxText01Config).
_MINIMAX_HUB_SCALES = {"layernorm_full_attention_alpha": "full_attn_alpha_factor",
                       "layernorm_full_attention_beta": "full_attn_beta_factor",
                       "layernorm_linear_attention_alpha": "linear_attn_alpha_factor",
                       "layernorm_linear_attention_beta": "linear_attn_beta_factor",
                       "layernorm_mlp_alpha": "mlp_alpha_factor", "layernorm_mlp_beta": "mlp_beta_factor"}


def _minimax_config(config: Mapping) -> Mapping:
    """Transformers' MiniMax rotates every dimension of each head: its rotary embedding is built over
    head_dim whatever rotary_dim or partial_rotary_factor say, so neither is read here (MiniMax's own
    minimax_text_01 config rotates rotary_dim, as llama.cpp's minimax-01 does)."""
    c = dict(config)
    c.pop("rotary_dim", None)
    c.pop("partial_rotary_factor", None)
    rp = c.get("rope_parameters")
    if isinstance(rp, Mapping) and "partial_rotary_factor" in rp:
        c["rope_parameters"] = {k: v for k, v in rp.items() if k != "partial_rotary_factor"}
    return c


def _minimax_hub_config(config: Mapping) -> Mapping:
    """MiniMax's own spellings (minimax_text_01) as Transformers' minimax reads them: attn_type_list
    (0 lightning, 1 full attention) as layer_types, layernorm_*_alpha / beta as the join's factors."""
    c = dict(config)
    kinds = c.get("attn_type_list")
    if c.get("layer_types") is None and isinstance(kinds, list):
        c["layer_types"] = [{0: "linear_attention", 1: "full_attention"}.get(k, f"attn_type {k!r}")
                            if isinstance(k, int) and not isinstance(k, bool) else repr(k) for k in kinds]
    for hub, ours in _MINIMAX_HUB_SCALES.items():
        if c.get(ours) is None and c.get(hub) is not None:
            c[ours] = c[hub]
    return c


def _minimax_layer_types_wrong(c: Mapping) -> bool:
    types = c.get("layer_types")
    return isinstance(types, list) and any(t not in ("linear_attention", "full_attention") for t in types)


_MINIMAX_REFUSALS = (
    Refusal(lambda c: c.get("layer_types") is None, "a config without attn_type_list or layer_types (which layers "
            "run lightning attention) is not supported"),
    Refusal(_minimax_layer_types_wrong, "a layer kind other than lightning (linear_attention, attn_type 0) and full "
            "attention (full_attention, attn_type 1) is not supported"),
    Refusal(lambda c: bool(c.get("shared_intermediate_size")), "shared experts (shared_intermediate_size above 0) are "
            "not supported"),
    Refusal(lambda c: c.get("sliding_window") is not None, "a sliding window on the full-attention layers "
            "(sliding_window) is not supported"),
)
_MINIMAX = dict(recurrent="lightning", moe=True, names=MINIMAX_NAMES, adapters="none", sublayer_scales=_MINIMAX_SCALES,
                keys={"moe_intermediate_size": ("intermediate_size",), "shared_intermediate_size": (),
                      "n_shared_experts": (), "ssm_act": ("hidden_act",)},
                fixed={"norm_topk_prob": True, "scoring_func": "softmax", "topk_method": "greedy"},
                defaults={"rope_theta": 1_000_000.0, "norm_eps": 1e-5, "ssm_norm_eps": 1e-6},
                moe_defaults={"num_experts": 8, "num_experts_per_tok": 2}, refusals=_MINIMAX_REFUSALS)

# Zamba2: Mamba-2 layers (mamba.*, input_layernorm); a hybrid layer's scan under mamba_decoder.*, its
# projection linear, and the shared block under shared_transformer.* of the first hybrid layer running it.
_ZM, _ZD, _ZS = _L + "mamba.", _L + "mamba_decoder.", _L + "shared_transformer."
ZAMBA2_NAMES: Mapping[str, Any] = {
    "embed": "model.embed_tokens", "final_norm": "model.final_layernorm", "head": "lm_head",
    "attn_norm": (_L + "input_layernorm", _ZD + "input_layernorm"),
    **{role: (_ZM + name, _ZD + "mamba." + name) for role, name in (
        ("ssm_in", "in_proj"), ("ssm_conv", "conv1d"), ("ssm_dt_bias", "dt_bias"), ("ssm_a_log", "A_log"),
        ("ssm_d", "D"), ("ssm_norm", "norm"), ("ssm_out", "out_proj"))},
    "sb_attn_norm": _ZS + "input_layernorm", "sb_ffn_norm": _ZS + "pre_ff_layernorm",
    "sb_q": _ZS + "self_attn.q_proj", "sb_k": _ZS + "self_attn.k_proj", "sb_v": _ZS + "self_attn.v_proj",
    "sb_o": _ZS + "self_attn.o_proj", "sb_gate_up": _ZS + "feed_forward.gate_up_proj",
    "sb_down": _ZS + "feed_forward.down_proj", "sb_linear": _L + "linear",
    "sb_gate_up_a": _ZS + "feed_forward.gate_up_proj_adapter_list.{k}.0",
    "sb_gate_up_b": _ZS + "feed_forward.gate_up_proj_adapter_list.{k}.1",
    **{f"sb_{r}_{p}": _ZS + f"self_attn.linear_{r}_adapter_list.{{k}}.{n}" for r in "qkv" for p, n in (("a", 0), ("b", 1))},
}
_ZAMBA2_TYPES = {"mamba": "linear_attention", "linear_attention": "linear_attention", "hybrid": "hybrid"}


def _zamba2_config(config: Mapping) -> Mapping:
    """Zamba2 as Transformers' Zamba2Config derives it: layer_types from layers_block_type (mamba
    written linear_attention), the attention's head width 2 * hidden_size / heads whatever the config
    says, scores scaled by the square root of half of it, the scan's head width its width over the heads,
    the step clamped below at time_step_min, the head tied to the embeddings (a config that unties it is
    refused: Transformers 5 then ties neither the head nor the repeated shared blocks)."""
    c = _scan_config(config)
    listed = c.get("layers_block_type")
    if c.get("layer_types") is None and isinstance(listed, list):
        c["layer_types"] = [_ZAMBA2_TYPES.get(t, f"type {t!r}") if isinstance(t, str) else repr(t) for t in listed]
    hidden, heads = c.get("hidden_size"), c.get("num_attention_heads")
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (hidden, heads)):
        c["attention_head_dim"] = 2 * hidden // heads
        c["_attention_score_width"] = c["attention_head_dim"] / 2
    low = c.get("time_step_min", 0.001)
    c["time_step_limit"] = [low if isinstance(low, (int, float)) and not isinstance(low, bool) else 0.001, None]
    if c.get("tie_word_embeddings") is not False:
        c["tie_word_embeddings"] = True
    return c


def _zamba2_layer_types_wrong(c: Mapping) -> bool:
    types = c.get("layer_types")
    return not isinstance(types, list) or any(t not in ("linear_attention", "hybrid") for t in types)


_ZAMBA2_REFUSALS = (
    Refusal(lambda c: c.get("layers_block_type") is None and c.get("layer_types") is None,
            "a config without layers_block_type (which layers run the shared block) is not supported"),
    Refusal(_zamba2_layer_types_wrong, "a layer kind other than mamba and hybrid in layers_block_type is not supported"),
    Refusal(lambda c: c.get("num_mem_blocks") is None, "a config without num_mem_blocks (how many shared blocks) "
            "is not supported"),
    Refusal(lambda c: c.get("tie_word_embeddings") is False,
            "tie_word_embeddings false (Transformers then ties neither the head nor the shared blocks: every "
            "hybrid layer its own weights) is not supported"),
    Refusal(lambda c: not c.get("adapter_rank"), "shared blocks with adapters but no adapter_rank are not supported"),
    Refusal(lambda c: bool(c.get("add_bias_linear")), "biases on the linear layers (add_bias_linear) are not "
            "supported"),
    # Transformers' key and value adapters are as wide as the queries: it runs them only without grouped heads
    Refusal(lambda c: bool(c.get("use_shared_attention_adapter"))
            and c.get("num_key_value_heads") not in (None, c.get("num_attention_heads")),
            "attention adapters (use_shared_attention_adapter) with num_key_value_heads other than "
            "num_attention_heads are not supported"),
)


# ---- g4: Gemma 4's text decoders (gemma4_text, gemma4_unified_text)
# Gemma 3's sandwich with weight-itself norms, a layer_scalar per layer and, on the E models, the
# per-layer inputs (decoder/model.py, PerLayerInputs) and their gate, projection and norm per layer.
GEMMA4_NAMES = _with(GEMMA2_NAMES, layer_scalar=_L + "layer_scalar", per_layer_gate=_L + "per_layer_input_gate",
                     per_layer_proj=_L + "per_layer_projection", per_layer_post_norm=_L + "post_per_layer_input_norm",
                     per_layer_embed="model.embed_tokens_per_layer",
                     per_layer_model_proj="model.per_layer_model_projection",
                     per_layer_proj_norm="model.per_layer_projection_norm")


def _gemma4_config(config: Mapping) -> Mapping:
    """Gemma 4's config as Transformers' ``Gemma4TextConfig.__post_init__`` completes it: the last
    layer attends fully whatever ``layer_types`` says, and a hub config's ``global_head_dim`` (and,
    under attention_k_eq_v, ``num_global_key_value_heads``) becomes the full-attention layers'
    ``per_layer_config``."""
    out = dict(config)
    types = out.get("layer_types")
    if isinstance(types, list) and types and types[-1] != "full_attention":
        out["layer_types"] = types[:-1] + ["full_attention"]
    types = out.get("layer_types")
    ghd = out.get("global_head_dim")
    if "per_layer_config" not in out and ghd is not None and isinstance(types, list):
        own = {"head_dim": ghd}
        if out.get("attention_k_eq_v") and out.get("num_global_key_value_heads") is not None:
            own["num_key_value_heads"] = out["num_global_key_value_heads"]
        out["per_layer_config"] = {str(i): dict(own) for i, t in enumerate(types) if t == "full_attention"}
    return out


def _gemma4_sliding_rope(c: Mapping):
    rp = c.get("rope_parameters")
    return rp.get("sliding_attention") if isinstance(rp, Mapping) else None


_GEMMA4_REFUSALS = (
    Refusal(lambda c: c.get("use_bidirectional_attention") == "all",
            "use_bidirectional_attention: \"all\" (every token attends both ways) is not supported"),
    Refusal(flag("use_double_wide_mlp"), "use_double_wide_mlp is not supported"),
    Refusal(flag("enable_moe_block"), "Gemma 4's mixture-of-experts block (enable_moe_block) is not supported yet"),
    Refusal(lambda c: not isinstance(c.get("layer_types"), list),
            "a Gemma 4 config without layer_types (which layers slide) is not supported"),
    Refusal(lambda c: c.get("per_layer_config") is None,
            "a Gemma 4 config without global_head_dim (the full-attention head width) is not supported"),
    Refusal(lambda c: not isinstance(_gemma4_sliding_rope(c), Mapping)
            or _gemma4_sliding_rope(c).get("rope_theta") is None,
            "a Gemma 4 config without a sliding_attention rotation base (rope_parameters) is not supported"),
    Refusal(lambda c: isinstance(_gemma4_sliding_rope(c), Mapping)
            and (_gemma4_sliding_rope(c).get("rope_type") or "default") != "default",
            "a scaled sliding_attention rotation is not supported"),
    Refusal(lambda c: c.get("partial_rotary_factor") is not None,
            "a top-level partial_rotary_factor is not supported (ster and Transformers' Gemma 4 rotate "
            "differently under it; remove it from config.json and give the rotated share per layer type, as "
            "rope_parameters.full_attention.partial_rotary_factor or .sliding_attention)"),
)
# Norms scale by their weight itself, scores are not scaled, values pass a weightless norm.
_GEMMA4 = dict(norms=_SANDWICH, names=GEMMA4_NAMES, qk_norm="head", embed_scale_sqrt_hidden=True,
               default_act="gelu_pytorch_tanh", tie_default=True, attn_unscaled=True,
               final_softcap_key="final_logit_softcapping", value_norm=True, layer_scalar=True,
               k_eq_v_key="attention_k_eq_v", kv_shared_key="num_kv_shared_layers", adapters="ffn",
               normalize=_gemma4_config, refusals=_GEMMA4_REFUSALS)
_GEMMA4_ACT = {"act": ("hidden_activation",)}  # Gemma 3n's and 4's text MLPs run hidden_activation only
# llama.cpp's names for Gemma 4 (src/models/gemma4.cpp): Gemma 3's sandwich, the layer scalar as
# layer_output_scale, the per-layer inputs' gate, projection and norm per layer and their table,
# projection and norm per model. Which layer slides, its head width and rotation, which layers reuse
# another's keys and values, and which take their values from their keys are read by gguf/config.py
# (LLAMA_CPP_SWA_ROPE, LLAMA_CPP_KV_SHARED).
GGUF_GEMMA4_NAMES = _with(GGUF_NAMES, layer_scalar="blk.{i}.layer_output_scale.weight", per_layer_gate="blk.{i}.inp_gate",
                          per_layer_proj="blk.{i}.proj", per_layer_post_norm="blk.{i}.post_norm",
                          per_layer_embed="per_layer_token_embd", per_layer_model_proj="per_layer_model_proj",
                          per_layer_proj_norm="per_layer_proj_norm")
# Transformers' Gemma4TextConfig defaults for keys a config.json may leave out.
_GEMMA4_DEFAULTS = {"sliding_window": 512, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6}



# ---- group HC (issue 14, hyper-connections): several residual streams joined by hyper-connections
# (decoder/streams.py). The roles name whole tensors; a name the release spells and the one Transformers'
# writer spells (its hy_v4 renames undone in reverse) are both listed.
def _hc_names(layer: Mapping[str, tuple[str, ...]], head: tuple[str, ...]) -> dict:
    """The hyper-connection roles: ``layer[part]`` lists the module names of a layer's attention ("attn") and
    feed-forward ("ffn") hyper-connection, whose tensors are fn / base / scale (or hc_fn / hc_base / hc_scale);
    ``head`` the stems of the head's fn / base / scale tensors."""
    out = {}
    for part, stems in layer.items():
        for p in ("fn", "base", "scale"):
            out[f"hc_{part}_{p}"] = tuple(stem.replace("{p}", p) for stem in stems)
    for p in ("fn", "base", "scale"):
        out[f"hc_head_{p}"] = tuple(stem.replace("{p}", p) for stem in head)
    return out


# HY V4: Transformers' module names (attn_hc.fn, self_attn.gate_proj, self_attn.sinks), the release's
# (hc_attn_layer.hc_pre.hc_fn, learnable_sink_param, linear_gate) and Transformers' writer's
# (hc_pre.hc_attn_layer.hc_fn, mlp.linear_gate: its `.linear_gate -> .gate_proj` rename reversed on every gate).
_HY_HC = {"attn": (_L + "attn_hc.{p}", _L + "hc_pre.hc_attn_layer.hc_{p}", _L + "hc_attn_layer.hc_pre.hc_{p}",
                   _L + "hc_attn_layer.hc_{p}"),
          "ffn": (_L + "ffn_hc.{p}", _L + "hc_pre.hc_mlp_layer.hc_{p}", _L + "hc_mlp_layer.hc_pre.hc_{p}",
                  _L + "hc_mlp_layer.hc_{p}")}
HY_V4_NAMES = _with(DEEPSEEK_DSA_NAMES, gate=(_M + "gate_proj", _M + "linear_gate"),
                    shexp_gate=(_M + "shared_experts.gate_proj", _M + "shared_experts.linear_gate"),
                    g=(_SA + "gate_proj", _SA + "linear_gate"), sinks=(_SA + "sinks", _SA + "learnable_sink_param"),
                    **_hc_names(_HY_HC, ("model.hc_head.hc_{p}", "model.hc_head.hc_head_{p}",
                                         "model.hc_pre.hc_head.hc_head_{p}")))
# ... and as llama.cpp's converter writes them (conversion/hy_v4.py): DeepSeek Sparse Attention's names, kv_b split
# per head (attn_k_b / attn_v_b), the hyper-connections as whole names (blk.N.hc_attn_fn.weight, output_hc_fn.weight).
GGUF_HY_V4_NAMES = _with(GGUF_DSA_NAMES, **{f"hc_{part}_{p}": f"blk.{{i}}.hc_{part}_{p}.weight"
                                             for part in ("attn", "ffn") for p in ("fn", "base", "scale")},
                         **{f"hc_head_{p}": f"output_hc_{p}.weight" for p in ("fn", "base", "scale")})
#: HYV4Config's defaults (the release's config may leave any of them out).
_HY_V4_DEFAULTS = {"vocab_size": 120832, "hidden_size": 2816, "intermediate_size": 6912, "moe_intermediate_size": 768,
                   "num_hidden_layers": 34, "num_attention_heads": 32, "max_position_embeddings": 262144,
                   "rms_norm_eps": 1e-5, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
                   "routed_scaling_factor": 2.827, "norm_topk_prob": True, "n_group": 1, "topk_group": 1,
                   "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
                   "v_head_dim": 256, "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 16, "hc_mult": 4,
                   "hc_magnitude": 2.0, "hc_eps": 1e-6, "swiglu_limit": 10.0}


def _hy_v4_config(config: Mapping) -> Mapping:
    """HY V4's layer kinds as HYV4Config derives them when the config lists none: the first layer dense
    (mlp_layer_types), every layer indexed, an indexer of its own on layer 0 and each 4k + 1 (indexer_types)."""
    c, n = dict(config), _n_layers(config)
    if c.get("mlp_layer_types") is None:
        c["mlp_layer_types"] = ["dense"] * min(1, n) + ["sparse"] * max(n - 1, 0)
    if c.get("layer_types") is None:
        c["layer_types"] = ["indexed_attention"] * n
    if c.get("indexer_types") is None:
        c["indexer_types"] = ["full" if i == 0 or (i - 1) % 4 == 0 else "shared" for i in range(n)]
    return c


def _stated_false(key: str) -> Callable[[Mapping], bool]:
    return lambda c: c.get(key) is False


# What Transformers' HYV4 fixes in code: a config stating otherwise describes weights it cannot run.
_HY_V4_REFUSALS = (
    Refusal(_stated_false("enable_ihc"), "enable_ihc: false (one residual stream) is not supported (Transformers' "
                                         "HY V4 always keeps hc_mult streams)"),
    Refusal(_stated_false("gated_mla"), "gated_mla: false is not supported (Transformers' HY V4 always gates the "
                                        "attention output)"),
    Refusal(_stated_false("learnable_sink"), "learnable_sink: false is not supported (Transformers' HY V4 always "
                                             "has a sink per head)"),
    Refusal(_stated_other("gating_type", "elementwise"), "a gating_type other than elementwise is not supported"),
    Refusal(lambda c: bool(c.get("soft_logits_capping")),
            "soft_logits_capping is not supported (vLLM caps the logits, Transformers' HY V4 never does; the two "
            "references disagree)"),
    Refusal(lambda c: isinstance(c.get("swiglu_limit"), (int, float)) and c["swiglu_limit"] <= 0,
            "a swiglu_limit of 0 or less is not supported (Transformers clamps the routed experts to it, zeroing "
            "them, where its documentation and vLLM leave them unclamped)"),
    _MOE_LAYER_FREQ,
)



# What ster has not checked against llama.cpp's hy-v4.cpp (tests/test_parity_hc_gguf.py): its rotation scaled
# (the graph's score scale takes no YaRN term) and files of full attention only (no indexer keys: no
# indexer_top_k, the graph's other branch).
_HY_V4_GGUF_REFUSALS = (
    Refusal(_stated_other("_rope_scaling", "none"), "rope scaling (rope.scaling.type other than none) is not "
                                                    "supported (not checked against llama.cpp's hy_v4 graph)"),
    Refusal(lambda c: not c.get("_index_topk"), "a file without DeepSeek Sparse Attention (no "
                                                "attention.indexer.top_k: full attention on every layer) is not "
                                                "supported (not checked against llama.cpp's hy_v4 graph)"),
)


# DeepSeek-V4: Transformers' module names, and DeepSeek's own layout (embed, head, layers.{i}.attn.wq_a,
# ffn.experts.{e}.w1, hc_attn_fn; what Transformers' writer produces, below model. or not: ``root``).
def _v4(module: str, own: str) -> tuple[str, str]:
    return (_L + module, _L + own)


DEEPSEEK_V4_NAMES = {
    "embed": ("model.embed_tokens", "model.embed"), "final_norm": "model.norm", "head": ("lm_head", "head"),
    "attn_norm": _v4("input_layernorm", "attn_norm"), "ffn_norm": _v4("post_attention_layernorm", "ffn_norm"),
    "q_a": _v4("self_attn.q_a_proj", "attn.wq_a"), "q_a_norm": _v4("self_attn.q_a_norm", "attn.q_norm"),
    "q_b": _v4("self_attn.q_b_proj", "attn.wq_b"), "ckv": _v4("self_attn.kv_proj", "attn.wkv"),
    "ckv_norm": _v4("self_attn.kv_norm", "attn.norm"), "o_a": _v4("self_attn.o_a_proj", "attn.wo_a"),
    "o_b": _v4("self_attn.o_b_proj", "attn.wo_b"), "sinks": _v4("self_attn.sinks", "attn.attn_sink"),
    "cmp_kv": _v4("self_attn.compressor.kv_proj", "attn.compressor.wkv"),
    "cmp_gate": _v4("self_attn.compressor.gate_proj", "attn.compressor.wgate"),
    "cmp_bias": _v4("self_attn.compressor.position_bias", "attn.compressor.ape"),
    "cmp_norm": _v4("self_attn.compressor.kv_norm", "attn.compressor.norm"),
    "icmp_kv": _v4("self_attn.compressor.indexer.kv_proj", "attn.indexer.compressor.wkv"),
    "icmp_gate": _v4("self_attn.compressor.indexer.gate_proj", "attn.indexer.compressor.wgate"),
    "icmp_bias": _v4("self_attn.compressor.indexer.position_bias", "attn.indexer.compressor.ape"),
    "icmp_norm": _v4("self_attn.compressor.indexer.kv_norm", "attn.indexer.compressor.norm"),
    "idx_q_b": _v4("self_attn.compressor.indexer.q_b_proj", "attn.indexer.wq_b"),
    "idx_w": _v4("self_attn.compressor.indexer.scorer.weights_proj", "attn.indexer.weights_proj"),
    # (a name ending in # is the weight alone: DeepSeek's ffn.gate.bias is the selection bias, not the router's)
    "router": (_L + "mlp.gate.weight#", _L + "ffn.gate.weight#"),
    "router_select_bias": _v4("mlp.gate.e_score_correction_bias", "ffn.gate.bias"),
    "router_hash": _v4("mlp.gate.tid2eid", "ffn.gate.tid2eid"),
    "exp_gate": _L + "ffn.experts.{e}.w1.weight", "exp_up": _L + "ffn.experts.{e}.w3.weight",
    "exp_down": _L + "ffn.experts.{e}.w2.weight",
    "shexp_gate": _v4("mlp.shared_experts.gate_proj", "ffn.shared_experts.w1"),
    "shexp_up": _v4("mlp.shared_experts.up_proj", "ffn.shared_experts.w3"),
    "shexp_down": _v4("mlp.shared_experts.down_proj", "ffn.shared_experts.w2"),
    **_hc_names({"attn": (_L + "attn_hc.{p}", _L + "hc_attn_{p}"), "ffn": (_L + "ffn_hc.{p}", _L + "hc_ffn_{p}")},
                ("model.hc_head.hc_{p}", "model.hc_head_{p}")),
}
# (group DS4) DeepSeek-V4 as llama.cpp's converter writes it (conversion/deepseek.py): the compressor and indexer
# under attn_compressor_* / indexer_compressor_* / indexer.*, the experts as [n_expert, out, in] stacks, the hash
# layers' table as I32 ffn_gate_tid2eid, the hyper-connections as whole names (output_hc_* at the head).
_W = ".weight"
GGUF_DEEPSEEK_V4_NAMES = _with(
    GGUF_NAMES, q=None, k=None, v=None, o=None, q_a="blk.{i}.attn_q_a", q_a_norm="blk.{i}.attn_q_a_norm",
    q_b="blk.{i}.attn_q_b", ckv="blk.{i}.attn_kv", ckv_norm="blk.{i}.attn_kv_a_norm", o_a="blk.{i}.attn_output_a",
    o_b="blk.{i}.attn_output_b", sinks="blk.{i}.attn_sinks" + _W, cmp_kv="blk.{i}.attn_compressor_kv",
    cmp_gate="blk.{i}.attn_compressor_gate", cmp_bias="blk.{i}.attn_compressor_ape" + _W,
    cmp_norm="blk.{i}.attn_compressor_norm", icmp_kv="blk.{i}.indexer_compressor_kv",
    icmp_gate="blk.{i}.indexer_compressor_gate", icmp_bias="blk.{i}.indexer_compressor_ape" + _W,
    icmp_norm="blk.{i}.indexer_compressor_norm", idx_q_b="blk.{i}.indexer.attn_q_b", idx_w="blk.{i}.indexer.proj",
    router_hash="blk.{i}.ffn_gate_tid2eid" + _W,
    **{f"hc_{part}_{p}": f"blk.{{i}}.hc_{part}_{p}" + _W for part in ("attn", "ffn") for p in ("fn", "base", "scale")},
    **{f"hc_head_{p}": f"output_hc_{p}" + _W for p in ("fn", "base", "scale")})
_V4_KINDS = {"sliding_attention": None, "compressed_sparse_attention": "sparse", "heavily_compressed_attention": "heavy"}
_V4_RATIO_KINDS = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
_DEEPSEEK_V4_DEFAULTS = {"vocab_size": 129280, "hidden_size": 4096, "moe_intermediate_size": 2048,
                         "num_hidden_layers": 43, "num_attention_heads": 64, "head_dim": 512, "q_lora_rank": 1024,
                         "num_experts_per_tok": 6, "n_routed_experts": 256, "routed_scaling_factor": 1.5,
                         "max_position_embeddings": 1048576, "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
                         "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "swiglu_limit": 10.0,
                         "sliding_window": 128, "o_groups": 8, "o_lora_rank": 1024, "index_n_heads": 64,
                         "index_head_dim": 128, "index_topk": 512, "rms_norm_eps": 1e-6}


def _deepseek_v4_config(config: Mapping) -> Mapping:
    """DeepSeek-V4's keys as Transformers' DeepseekV4Config reads them (legacy spellings included), in ster's
    terms: each layer's compression (``_compress_kinds``: None, "sparse", "heavy") from layer_types or
    compress_ratios (0, 4, 128), else two heavy layers then sparse and heavy by turns; the hash layers
    (``_hash_layers``) from mlp_layer_types, else the first num_hash_layers (3); the sliding layers' rotation
    (rope_parameters: rope_theta) and the compressed ones' (``_compress_rope``: compress_rope_theta, with a
    YaRN block of magnitude one when stated); one shared expert as wide as a routed one."""
    c, n = dict(config), _n_layers(config)
    rates = dict(c.get("compress_rates") or {}) if isinstance(c.get("compress_rates", {}) or {}, Mapping) else {}
    for legacy, kind in (("compress_rate_csa", "compressed_sparse_attention"),
                         ("compress_rate_hca", "heavily_compressed_attention")):
        if c.get(legacy) is not None:
            rates[kind] = c[legacy]
    c["compress_rates"] = rates
    types = c.get("layer_types")
    if types is None and isinstance(c.get("compress_ratios"), list):
        types = [_V4_RATIO_KINDS.get(r, r) for r in c["compress_ratios"]]
    if types is None:
        types = ["heavily_compressed_attention"] * min(n, 2) + [
            "compressed_sparse_attention" if i % 2 else "heavily_compressed_attention" for i in range(max(n - 2, 0))]
    if isinstance(types, list):
        c["_layer_kinds"] = list(types[:n])
        c["_compress_kinds"] = [_V4_KINDS.get(t) for t in types[:n]]
    c.pop("layer_types", None)
    mlp = c.get("mlp_layer_types")
    if mlp is None:
        k = c.get("num_hash_layers", 3)
        k = k if isinstance(k, int) and not isinstance(k, bool) else 3
        mlp = ["hash_moe"] * min(n, k) + ["moe"] * max(0, n - k)
    if isinstance(mlp, list):
        c["_mlp_kinds"] = list(mlp[:n])
        c["_hash_layers"] = [t == "hash_moe" for t in mlp[:n]]
    c.pop("mlp_layer_types", None)
    if c.get("partial_rotary_factor") is None and c.get("qk_rope_head_dim") is None:
        c["partial_rotary_factor"] = 64 / 512
    rp = c.get("rope_parameters") or c.get("rope_scaling") or {}
    rp = rp if isinstance(rp, Mapping) else {}
    if isinstance(rp.get("main"), Mapping) and isinstance(rp.get("compress"), Mapping):
        main, compress = dict(rp["main"]), dict(rp["compress"])
    else:
        main = {"rope_type": "default", "rope_theta": c.get("rope_theta", 10000.0)}
        compress = {**{k: v for k, v in rp.items() if k not in ("main", "compress", "rope_theta")},
                    "rope_theta": c.get("compress_rope_theta", 160000.0)}
        compress.setdefault("rope_type", compress.pop("type", "default"))
        if compress["rope_type"] == "yarn":
            compress.setdefault("attention_factor", 1.0)
    c["rope_parameters"], c["_compress_rope"] = main, compress
    c.pop("rope_scaling", None)
    if c.get("moe_intermediate_size") is not None:  # Transformers' one shared expert: a routed expert's width
        c["intermediate_size"] = c["shared_intermediate_size"] = c["moe_intermediate_size"]
    return c


def _v4_kinds_wrong(c: Mapping) -> bool:
    n = _n_layers(c)
    kinds, mlp = c.get("_layer_kinds"), c.get("_mlp_kinds")
    return (not isinstance(kinds, list) or len(kinds) != n or any(t not in _V4_KINDS for t in kinds)
            or not isinstance(mlp, list) or len(mlp) != n or any(t not in ("hash_moe", "moe") for t in mlp))


_DEEPSEEK_V4_REFUSALS = (
    Refusal(_v4_kinds_wrong, "layer_types (or compress_ratios) and mlp_layer_types must list num_hidden_layers "
                             "entries of sliding_attention / compressed_sparse_attention / heavily_compressed_attention "
                             "(0 / 4 / 128) and hash_moe / moe"),
    Refusal(_stated_other("scoring_func", "sqrtsoftplus"),
            "a scoring_func other than sqrtsoftplus is not supported (DeepSeek-V4's router)"),
    Refusal(lambda c: isinstance(c.get("swiglu_limit"), (int, float)) and c["swiglu_limit"] <= 0,
            "a swiglu_limit of 0 or less is not supported (Transformers clamps every SwiGLU to it)"),
    Refusal(lambda c: bool(c.get("mlp_bias")) or bool(c.get("attention_bias")),
            "mlp_bias / attention_bias is not supported (DeepSeek-V4's projections have no biases)"),
)



# GLM-5-Next (its text decoder, also below model.language_model of the glm5_next wrapper): latent attention
# without rotation behind a pooled indexer, Kimi Delta Attention, Sinkhorn hyper-connections averaged at the
# head. Kimi-Linear's delta-rule names as Transformers' writer spells them and its module names beside them.
_G5 = _SA
GLM5_NEXT_NAMES = _with(
    DEEPSEEK_DSA_NAMES, idx_pool_gate=_G5 + "indexer.index_kpool_compress_gate",
    idx_pool_ape=_G5 + "indexer.index_kpool_compress_ape",
    lin_q=_G5 + "q_proj", lin_k=_G5 + "k_proj", lin_v=_G5 + "v_proj", lin_b=_G5 + "b_proj",
    lin_conv=_G5 + "conv1d", lin_q_conv=_G5 + "q_conv1d", lin_k_conv=_G5 + "k_conv1d", lin_v_conv=_G5 + "v_conv1d",
    lin_f_a=(_G5 + "f_a_proj", _G5 + "forget_gate.f_a_proj"), lin_f_b=(_G5 + "f_b_proj", _G5 + "forget_gate.f_b_proj"),
    lin_dt_bias=(_G5 + "dt_bias", _G5 + "forget_gate.dt_bias"), lin_a_log=(_G5 + "A_log", _G5 + "forget_gate.A_log"),
    lin_g_a=_G5 + "g_a_proj", lin_g_b=_G5 + "g_b_proj", lin_norm=_G5 + "o_norm", lin_out=_G5 + "o_proj",
    **_hc_names({"attn": (_L + "attn_hc.{p}", _L + "hc_attn_{p}"), "ffn": (_L + "ffn_hc.{p}", _L + "hc_ffn_{p}")}, ()))
for _p in ("fn", "base", "scale"):
    GLM5_NEXT_NAMES.pop(f"hc_head_{_p}")
# ... and as llama.cpp's converter writes them (conversion/glm.py, GLM-5-Next): Kimi-Linear's delta-rule names,
# DeepSeek Sparse Attention's indexer with the pool's gate and position terms (indexer_compressor_gate / _ape),
# kv_b split per head (attn_k_b / attn_v_b), the hyper-connections as whole names (blk.N.hc_attn_fn.weight); no
# head hyper-connection (the streams are averaged).
GGUF_GLM5_NEXT_NAMES = _with(GGUF_KIMI_LINEAR_NAMES, idx_q_b="blk.{i}.indexer.attn_q_b", idx_k="blk.{i}.indexer.attn_k",
                             idx_k_norm="blk.{i}.indexer.k_norm", idx_w="blk.{i}.indexer.proj",
                             idx_pool_gate="blk.{i}.indexer_compressor_gate.weight",
                             idx_pool_ape="blk.{i}.indexer_compressor_ape.weight",
                             **{f"hc_{part}_{p}": f"blk.{{i}}.hc_{part}_{p}.weight"
                                for part in ("attn", "ffn") for p in ("fn", "base", "scale")})
_GLM5_NEXT_KEYS = dict(_LATENT_KEYS, **{
    "delta_k_heads": ("linear_num_heads",), "delta_v_heads": ("linear_num_heads",),
    "delta_k_dim": ("linear_head_dim",), "delta_v_dim": ("linear_head_dim",),
    "delta_conv_kernel": ("linear_conv_kernel_dim",), "delta_lower_bound": ("linear_lower_bound",),
    "ssm_act": ("hidden_act",)})
#: Glm5NextTextConfig's defaults.
_GLM5_NEXT_DEFAULTS = {"vocab_size": 154880, "hidden_size": 4096, "intermediate_size": 12288,
                       "moe_intermediate_size": 2048, "num_hidden_layers": 45, "num_attention_heads": 64,
                       "n_shared_experts": 1, "n_routed_experts": 288, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
                       "q_lora_rank": 1536, "qk_rope_head_dim": 0, "v_head_dim": 256, "qk_nope_head_dim": 256,
                       "n_group": 1, "topk_group": 1, "num_experts_per_tok": 8, "norm_topk_prob": True,
                       "max_position_embeddings": 1048576, "rms_norm_eps": 1e-5, "index_topk": 2048,
                       "index_head_dim": 128, "index_n_heads": 32, "swiglu_limit": 10.0, "linear_head_dim": 128,
                       "linear_num_heads": 64, "linear_conv_kernel_dim": 4, "linear_lower_bound": -5.0, "hc_mult": 4,
                       "hc_eps": 1e-6, "hc_sinkhorn_iters": 20, "index_kpool": 16,
                       "index_kpool_always_select_tail": True}


def _glm5_next_config(config: Mapping) -> Mapping:
    """GLM-5-Next's keys as Glm5NextTextConfig reads them: the first three layers dense (mlp_layer_types), Kimi
    Delta Attention on all but each fourth layer (layer_types; full_attention read as indexed_attention),
    indexer_types as GLM-5's, and linear_attn_config's num_heads, head_dim, short_conv_kernel_size and
    gate_lower_bound (-5 under safe_gate when it states none)."""
    c, n = dict(_glm_dsa_config(config)), _n_layers(config)
    if c.get("mlp_layer_types") is None:
        c["mlp_layer_types"] = ["dense"] * min(3, n) + ["sparse"] * max(n - 3, 0)
    types = c.get("layer_types")
    if types is None:
        types = ["linear_attention" if i % 4 != 3 else "indexed_attention" for i in range(n)]
    if isinstance(types, list):
        c["layer_types"] = ["indexed_attention" if t == "full_attention" else t for t in types]
    lac = c.get("linear_attn_config")
    if isinstance(lac, Mapping):
        for key, own in (("head_dim", "linear_head_dim"), ("num_heads", "linear_num_heads"),
                         ("short_conv_kernel_size", "linear_conv_kernel_dim"), ("gate_lower_bound", "linear_lower_bound")):
            if key in lac:
                c[own] = lac[key]
        if lac.get("safe_gate", True) and c.get("linear_lower_bound") is None:
            c["linear_lower_bound"] = -5.0
    return c


_GLM5_NEXT_REFUSALS = (
    Refusal(lambda c: c.get("qk_rope_head_dim") not in (None, 0),
            "a qk_rope_head_dim other than 0 is not supported (GLM-5-Next's attention takes its positions from the "
            "causal order alone)"),
    Refusal(lambda c: c.get("index_kpool_always_select_tail") is False,
            "index_kpool_always_select_tail: false is not supported (Transformers then leaves a query whose pool has "
            "not closed with no key, and attends to every position, later ones included)"),
    Refusal(lambda c: isinstance(c.get("swiglu_limit"), (int, float)) and c["swiglu_limit"] <= 0,
            "a swiglu_limit of 0 or less is not supported (Transformers clamps every SwiGLU to it)"),
    _MOE_LAYER_FREQ,
)
# (group GDS) glm5-next files ster refuses by name: the graph's branch without the tail (llama.cpp appends no
# unfinished pool, Transformers then attends everywhere) was not checked against either.
_GLM5_NEXT_GGUF_REFUSALS = (
    Refusal(lambda c: c.get("index_kpool_always_select_tail") is False,
            "attention.indexer.kpool_select_tail false is not supported (not checked against llama.cpp's graph)"),
)
# ---- group R2 (issue 16): openPangu-Ultra-MoE, Nemotron Puzzle, Step3's text decoder, Ling 2.5 / 3.0,
# LongCat-Flash-Lite: names and readers.
# openPangu-Ultra-MoE's config spellings -> the DeepSeek-V3 keys config.py reads (seed 002).
_PANGU_ULTRA_KEYS = (("attention_q_lora_dim", "q_lora_rank"), ("attention_kv_lora_dim", "kv_lora_rank"),
                     ("attention_qk_dim", "qk_nope_head_dim"), ("attention_qk_rope_dim", "qk_rope_head_dim"),
                     ("attention_v_dim", "v_head_dim"), ("num_routed_experts", "n_routed_experts"),
                     ("num_shared_experts", "n_shared_experts"), ("num_dense_layers", "first_k_dense_replace"))


def _pangu_ultra_config(config: Mapping) -> Mapping:
    """openPangu-Ultra-MoE's own key names read as DeepSeek-V3's (its spelling wins where both are stated)."""
    c = dict(config)
    for own, theirs in _PANGU_ULTRA_KEYS:
        if c.get(own) is not None:
            c[theirs] = c[own]
    return c


# DeepSeek-V3's names with no selection bias; under sandwich_norm post_attention_layernorm is the
# attention's output norm and the feed-forward reads pre_mlp_layernorm.
PANGU_ULTRA_NAMES = _with(DEEPSEEK_NAMES, router_select_bias=None)
PANGU_ULTRA_SANDWICH_NAMES = _with(PANGU_ULTRA_NAMES, attn_post_norm=_L + "post_attention_layernorm",
                                   ffn_norm=_L + "pre_mlp_layernorm", ffn_post_norm=_L + "post_mlp_layernorm")


# Nemotron Puzzle: Nemotron-H's names below model. rather than backbone.
NEMOTRON_PUZZLE_NAMES = {role: n.replace("backbone.", "model.") for role, n in NEMOTRON_H_NAMES.items()}


def _nemotron_puzzle_config(config: Mapping) -> Mapping:
    """Nemotron Puzzle's block_configs (one object per layer: block_type and, on moe layers,
    num_experts_per_tok and moe_intermediate_size) as layers_block_type where that is left out and as
    ``moe_layer_shapes`` (config.py), the first moe layer's shape standing for the model's; then
    Nemotron-H's reading."""
    c = dict(config)
    blocks = c.get("block_configs")
    if isinstance(blocks, list) and all(isinstance(b, Mapping) for b in blocks):
        if c.get("layers_block_type") is None:
            c["layers_block_type"] = [b.get("block_type") for b in blocks]
        shapes = {i: {k: b.get(k) for k in ("num_experts_per_tok", "moe_intermediate_size")}
                  for i, b in enumerate(blocks) if b.get("block_type") == "moe"}
        if shapes:
            c["moe_layer_shapes"] = shapes
            first = shapes[min(shapes)]
            for k, v in first.items():
                if c.get(k) is None:
                    c[k] = v
    return _nemotron_h_config(c)


def _nemotron_puzzle_blocks_wrong(c: Mapping) -> bool:
    """block_configs absent, not one object per layer, or naming other kinds than layers_block_type."""
    blocks, types = c.get("block_configs"), c.get("layers_block_type")
    return (not isinstance(blocks, list) or not isinstance(types, list) or len(blocks) != len(types)
            or any(not isinstance(b, Mapping) or b.get("block_type") != t for b, t in zip(blocks, types)))


# Step3's text decoder: Step 3.5's expert layout (moe.gate_proj / up_proj / down_proj stacked per layer,
# moe.gate, share_expert) without a selection bias, and a query bottleneck (q_proj -> inter_norm -> wq).
STEP3_NAMES = _with(STEP3P5_NAMES, router_select_bias=None, g=None, q_up=_L + "self_attn.wq",
                    q_inter_norm=_L + "self_attn.inter_norm")


def _step3_routed_layers(config: Mapping) -> list | None:
    """moe_layers_enum as a list of layer indices (a comma-separated string, as the hub configs state it,
    or a list), every layer but the first when absent; None when an entry is not a whole number."""
    enum, n = config.get("moe_layers_enum"), _n_layers(config)
    if enum is None:
        return list(range(1, n))
    items = enum.strip().split(",") if isinstance(enum, str) else list(enum) if isinstance(enum, (list, tuple)) else None
    if items is None:
        return None
    out = []
    for x in items:
        if isinstance(x, str) and x.strip().lstrip("-").isdecimal():   # what int() reads ("²" is a digit)
            x = int(x.strip())
        if isinstance(x, bool) or not isinstance(x, int):
            return None
        out.append(x)
    return out


def _step3_config(config: Mapping) -> Mapping:
    """Step3's routed layers (moe_layers_enum) as ``mlp_layer_types``."""
    c, n = dict(config), _n_layers(config)
    routed = _step3_routed_layers(c)
    if c.get("mlp_layer_types") is None and routed is not None and n and all(0 <= i < n for i in routed):
        c["mlp_layer_types"] = ["sparse" if i in routed else "dense" for i in range(n)]
    return c


def _step3_enum_wrong(c: Mapping) -> bool:
    routed, n = _step3_routed_layers(c), _n_layers(c)
    return routed is None or any(not 0 <= i < n for i in routed)


# Ling 3.0 (bailing_hybrid): both attentions under attention.: DeepSeek's latent attention (dense output,
# g_proj a head-wise gate) and Kimi Delta Attention with full-rank f_proj / g_proj; Ling 2.0's experts.
_BA = _L + "attention."
BAILING_HYBRID_NAMES = _with(
    DEEPSEEK_NAMES, embed="model.word_embeddings", q=_BA + "q_proj", q_a=_BA + "q_a_proj",
    q_a_norm=_BA + "q_a_layernorm", q_b=_BA + "q_b_proj", kv_a=_BA + "kv_a_proj_with_mqa",
    kv_a_norm=_BA + "kv_a_layernorm", kv_b=_BA + "kv_b_proj", o=_BA + "dense", g=_BA + "g_proj",
    router_select_bias=_M + "gate.expert_bias",
    lin_q=_BA + "q_proj", lin_k=_BA + "k_proj", lin_v=_BA + "v_proj", lin_b=_BA + "b_proj",
    lin_q_conv=_BA + "q_conv1d", lin_k_conv=_BA + "k_conv1d", lin_v_conv=_BA + "v_conv1d", lin_f=_BA + "f_proj",
    lin_g=_BA + "g_proj", lin_dt_bias=_BA + "dt_bias", lin_a_log=_BA + "A_log", lin_norm=_BA + "o_norm",
    lin_out=_BA + "dense")


# llama.cpp's bailingmoe3 files (conversion/bailingmoe3.py): the Kimi names of kimi-linear with the full-rank
# gates in ssm_f_a / ssm_g_a, exp(A_log) (not its negative) in ssm_a, the latent layers' head gate in attn_gate.
GGUF_BAILING_HYBRID_NAMES = _with(GGUF_KIMI_LINEAR_NAMES, lin_f="blk.{i}.ssm_f_a", lin_g="blk.{i}.ssm_g_a",
                                  lin_f_a=None, lin_f_b=None, lin_g_a=None, lin_g_b=None, lin_ssm_a=None,
                                  lin_exp_a="blk.{i}.ssm_a", g="blk.{i}.attn_gate")


# Ling 2.5 (bailing_hybrid without Kimi Delta Attention): the same latent layers without a head gate, and
# lightning attention under attention.: query_key_value (query, key, value heads in turn), query_layernorm /
# key_layernorm, g_proj (the output gate), g_norm (the grouped read-out norm), dense.
LING25_NAMES = _with(BAILING_HYBRID_NAMES, g=None, ssm_in=_BA + "query_key_value", ssm_q_norm=_BA + "query_layernorm",
                     ssm_k_norm=_BA + "key_layernorm", ssm_gate=_BA + "g_proj", ssm_norm=_BA + "g_norm",
                     ssm_out=_BA + "dense", **{role: None for role in (
                         "lin_q", "lin_k", "lin_v", "lin_b", "lin_q_conv", "lin_k_conv", "lin_v_conv", "lin_f",
                         "lin_g", "lin_dt_bias", "lin_a_log", "lin_norm", "lin_out")})
# The release's BailingMoeV2_5Config defaults of the keys only Ling 2.5 reads (inclusionAI's Ring-V2.5).
_LING25_DEFAULTS = {"use_qk_norm": True, "linear_silu": False, "group_norm_size": 4, "partial_rotary_factor": 0.5,
                    "layer_group_size": 5}


def _ling3(c: Mapping) -> bool:
    """Ling 3.0 (Kimi Delta Attention): BailingMoeV3ForCausalLM, or any config stating short_conv_kernel_size."""
    archs = c.get("architectures")
    return (isinstance(archs, list) and "BailingMoeV3ForCausalLM" in archs) or c.get("short_conv_kernel_size") is not None


def _group_size(c: Mapping) -> int | None:
    g = c.get("layer_group_size", 6 if _ling3(c) else _LING25_DEFAULTS["layer_group_size"])
    return g if isinstance(g, int) and not isinstance(g, bool) and g > 0 else None


def _bailing_hybrid_config(config: Mapping) -> Mapping:
    """Ling 3.0's layer kinds (seed 002): Kimi Delta Attention on every layer that neither closes a
    layer_group_size group nor follows the last whole group, latent attention on the others; the safe
    gate's bound (kda_lower_bound, -5 when left out) under kda_safe_gate (on by default); the per-layer
    SwiGLU clamp lists cut to num_hidden_layers (the rest are multi-token-prediction layers)."""
    c, n = dict(config), _n_layers(config)
    g = _group_size(c)
    if not _ling3(c):  # Ling 2.5: lightning attention's extras (decoder/lightning.py), the release's defaults
        c = {**_LING25_DEFAULTS, **c}
        c["_lightning"] = dict(qkv_layout="concat", silu=bool(c["linear_silu"]), qk_norm=bool(c["use_qk_norm"]),
                               q_scaled=True, slope_eps=0.0, slopes="alibi", slope_layer_offset=-1,
                               norm_groups=c["group_norm_size"],
                               rope_dim=_ling25_rope_dim(c))
    if c.get("layer_types") is None and g is not None:
        whole = n // g * g
        c["layer_types"] = ["full_attention" if (i + 1) % g == 0 or i >= whole else "linear_attention"
                            for i in range(n)]
    if c.get("kda_safe_gate", True):
        bound = c.get("kda_lower_bound")
        c["_kda_lower_bound"] = -5.0 if bound is None else bound
    for key in ("expert_swiglu_limit_list", "share_expert_swiglu_limit_list"):
        if isinstance(c.get(key), list) and n and len(c[key]) > n:
            c[key] = c[key][:n]
    return c


def _ling25_head_dim(c: Mapping):
    heads, hidden = c.get("num_attention_heads"), c.get("hidden_size")
    d = c.get("head_dim")
    if d is None and isinstance(heads, int) and isinstance(hidden, int) and heads > 0:
        d = hidden // heads
    return d


def _ling25_rope_dim(c: Mapping):
    """The leading channels of each lightning head that rotate: head_dim x partial_rotary_factor (None when
    either is not a number)."""
    d, f = _ling25_head_dim(c), c.get("partial_rotary_factor")
    if isinstance(f, float) and not (math.isfinite(f) and 0 < f <= 1):
        raise SterError(f"config.json: partial_rotary_factor is {f}; it is the rotated fraction of each head, a "
                        "number in (0, 1]: fix config.json")
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (d, f))
    return int(d * f) if ok else None


def _ling25_rope_differs(c: Mapping) -> bool:
    return not _ling3(c) and _ling25_rope_dim(c) != c.get("qk_rope_head_dim")


def _ling25_kv_heads_differ(c: Mapping) -> bool:
    kv = c.get("num_kv_heads_for_linear_attn")
    return not _ling3(c) and kv is not None and kv != c.get("num_attention_heads")


_BAILING_HYBRID_KEYS = dict(_LATENT_KEYS, **{
    "num_experts": ("num_experts", "num_local_experts"),
    "num_experts_per_tok": ("num_experts_per_tok", "num_experts_per_token"),
    "norm_topk_prob": ("norm_topk_prob", "moe_renormalize"), "n_group": ("n_group", "num_expert_group"),
    "n_shared_experts": ("num_shared_experts", "n_shared_experts"),
    "shared_intermediate_size": ("moe_shared_expert_intermediate_size",),
    "max_position_embeddings": ("max_position_embeddings", "model_max_length"),
    "delta_k_heads": ("linear_num_heads", "num_attention_heads"),
    "delta_v_heads": ("linear_num_heads", "num_attention_heads"),
    "delta_k_dim": ("linear_head_dim", "head_dim"), "delta_v_dim": ("linear_head_dim", "head_dim"),
    "delta_conv_kernel": ("short_conv_kernel_size", "linear_conv_kernel_dim"),
    "delta_lower_bound": ("_kda_lower_bound",), "ssm_act": ("hidden_act",)})
# Ling 2.5's lightning layers: the attention's heads of head_dim (not the latent's widths), the read-out
# norm at the model's epsilon; the latent layers rotate all of qk_rope_head_dim (partial_rotary_factor is the
# lightning heads' share).
_LING25_KEYS = dict(_BAILING_HYBRID_KEYS, head_dim=("head_dim",), partial_rotary_factor=(),
                    ssm_norm_eps=("rms_norm_eps",))
_BAILING_HYBRID_REFUSALS = (
    Refusal(_ling25_rope_differs, "Ling 2.5 lightning heads that rotate a different width (head_dim x "
            "partial_rotary_factor) than the latent heads (qk_rope_head_dim) are not supported"),
    Refusal(_ling25_kv_heads_differ, "Ling 2.5 lightning attention with num_kv_heads_for_linear_attn other than "
            "num_attention_heads is not supported"),
    Refusal(lambda c: _group_size(c) is None, "a layer_group_size that is not a positive integer is not supported"),
    Refusal(lambda c: c.get("no_kda_lora") is False or bool(c.get("use_kda_lora")),
            "factored Kimi projections (no_kda_lora false, or use_kda_lora) are not supported"),
    Refusal(flag("use_nGPT"), "use_nGPT is not supported"),
    Refusal(flag("value_norm"), "value_norm is not supported"),
    Refusal(flag("up_proj_norm"), "up_proj_norm is not supported"),
    Refusal(flag("use_mla_nope"), "use_mla_nope is not supported"),
    Refusal(_stated_other("gated_attention_proj_granularity_type", "head_wise"),
            "a gated_attention_proj_granularity_type other than head_wise is not supported"),
    Refusal(_stated_other("score_function", "sigmoid"), "a router score_function other than sigmoid is not supported"),
    Refusal(_stated_other("scoring_func", "sigmoid"), "a router scoring_func other than sigmoid is not supported"),
)



# ---- g3n: Gemma 3n's text decoder (gemma3n_text), issue 16
# Gemma 4's attention (weight-itself q/k norms, the weightless value norm, unscaled scores, shared
# key/value layers) and per-layer inputs, plus AltUp's copies of the stream (decoder/altup.py), Laurel's
# low-rank residual and the feed-forward's activation sparsity. Names: Transformers' Gemma3nTextModel.
GEMMA3N_NAMES = _with(GEMMA4_NAMES, layer_scalar=None,
                      altup_router=_L + "altup.modality_router", altup_router_norm=_L + "altup.router_norm",
                      altup_predict=_L + "altup.prediction_coefs",
                      altup_correct=_L + "altup.correction_coefs",
                      altup_output_scale=_L + "altup.correct_output_scale",
                      laurel_left=_L + "laurel.linear_left", laurel_right=_L + "laurel.linear_right",
                      laurel_norm=_L + "laurel.post_laurel_norm",
                      altup_in="model.altup_projections.{k}", altup_out="model.altup_unembed_projections.{k}")
# llama.cpp's names (src/models/gemma3n.cpp, gguf-py): each AltUp projection set stacked in one
# [n - 1, hidden, hidden] tensor, the per-layer tensors as Gemma 4's.
GGUF_GEMMA3N_NAMES = _with(GGUF_GEMMA4_NAMES, layer_scalar=None,
                           altup_router="blk.{i}.altup_router", altup_router_norm="blk.{i}.altup_router_norm",
                           altup_predict="blk.{i}.altup_predict_coef", altup_correct="blk.{i}.altup_correct_coef",
                           altup_output_scale="blk.{i}.altup_correct_scale.weight",
                           laurel_left="blk.{i}.laurel_l", laurel_right="blk.{i}.laurel_r",
                           laurel_norm="blk.{i}.laurel_post_norm", altup_in="altup_proj", altup_out="altup_unembd_proj")
_S3N, _F3N = "sliding_attention", "full_attention"


def _gemma3n_config(config: Mapping) -> Mapping:
    """Gemma 3n's config as Transformers' ``Gemma3nTextConfig`` completes it: one intermediate_size
    stated per layer read as the model's when all agree, layer_types defaulting to every fifth layer
    attending fully, activation_sparsity_pattern defaulting to 0.95 on the first ten layers (of more
    than ten), and a hub config's rope_theta / rope_local_base_freq / rope_scaling as the two layer
    kinds' rope_parameters."""
    out = dict(config)
    size, n = out.get("intermediate_size"), out.get("num_hidden_layers")
    if isinstance(size, list) and size and all(v == size[0] for v in size):
        out["intermediate_size"] = size[0]
    counted = isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 100_000
    if out.get("layer_types") is None and counted:
        out["layer_types"] = [_F3N if (i + 1) % 5 == 0 else _S3N for i in range(n)]
    if out.get("activation_sparsity_pattern") is None and counted:
        sparse = 10 if n > 10 else 0
        out["activation_sparsity_pattern"] = [0.95] * sparse + [0.0] * (n - sparse)
    if not isinstance(out.get("rope_parameters"), Mapping):
        full = {"rope_type": "default", **(out.get("rope_scaling") or {})}
        full.setdefault("rope_theta", out.get("rope_theta") or 1_000_000.0)
        out["rope_parameters"] = {_F3N: full, _S3N: {"rope_type": "default",
                                                     "rope_theta": out.get("rope_local_base_freq") or 10_000.0}}
    return out


def _gemma3n_rope(c: Mapping, kind: str):
    rp = c.get("rope_parameters")
    return rp.get(kind) if isinstance(rp, Mapping) else None


_GEMMA3N_REFUSALS = (
    Refusal(lambda c: isinstance(c.get("intermediate_size"), list),
            "feed-forward widths that differ between layers (an intermediate_size list) are not supported"),
    Refusal(lambda c: c.get("altup_active_idx", 0) != 0,
            "an AltUp active copy other than the first (altup_active_idx) is not supported"),
    Refusal(lambda c: not isinstance(_gemma3n_rope(c, _S3N), Mapping)
            or (_gemma3n_rope(c, _S3N).get("rope_type") or "default") != "default",
            "a scaled sliding_attention rotation is not supported"),
    Refusal(lambda c: not c.get("hidden_size_per_layer_input", 256),
            "a Gemma 3n config without per-layer inputs (hidden_size_per_layer_input 0) is not supported"),
)
# ---- group GLM (issue 16): ChatGLM2, ChatGLM3 and GLM-4-9B (model_type chatglm), below transformer.
_CG = "transformer.encoder.layers.{i}."
CHATGLM_NAMES: Mapping[str, str] = {
    "embed": "transformer.embedding.word_embeddings", "final_norm": "transformer.encoder.final_layernorm",
    "head": "transformer.output_layer", "attn_norm": _CG + "input_layernorm",
    "ffn_norm": _CG + "post_attention_layernorm", "qkv": _CG + "self_attention.query_key_value",
    "o": _CG + "self_attention.dense", "gate_up": _CG + "mlp.dense_h_to_4h", "down": _CG + "mlp.dense_4h_to_h",
}
# ChatGLMConfig's defaults for the switches and sizes a config.json may leave out (its remote code).
CHATGLM_DEFAULTS: Mapping[str, Any] = {
    "kv_channels": 128, "layernorm_epsilon": 1e-5, "rmsnorm": True, "apply_residual_connection_post_layernorm": False,
    "post_layer_norm": True, "add_bias_linear": False, "add_qkv_bias": False, "multi_query_attention": False,
    "multi_query_group_num": 1, "rope_ratio": 1, "original_rope": True, "seq_length": 2048,
}


def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _chatglm_config(config: Mapping) -> Mapping:
    """ChatGLM's spellings as the keys config.py reads (seed 002): key/value heads are
    multi_query_group_num under multi_query_attention and one per head otherwise; the first half of
    each kv_channels-wide head rotates at base 10000 * rope_ratio (the remote code's fixed base;
    a stated rope_theta or rope_scaling is not read by it, so not here either)."""
    c = dict(config)
    heads = c.get("num_attention_heads")
    c["num_key_value_heads"] = c.get("multi_query_group_num") if c.get("multi_query_attention") else heads
    ratio = c.get("rope_ratio", 1)
    c.pop("rope_scaling", None)
    c["rope_parameters"] = {"rope_type": "default",
                            "rope_theta": 10000.0 * float(ratio) if _positive_number(ratio) else 10000.0}
    c["partial_rotary_factor"] = 0.5
    return c


# ---- group WRAP (issue 16): the wrapped decoders with a Transformers implementation
def _global_theta(config: Mapping) -> float:
    """The model-wide rotary base: rope_parameters.rope_theta, else rope_theta, else 10000."""
    rp = config.get("rope_parameters")
    theta = (rp.get("rope_theta") if isinstance(rp, Mapping) else None) or config.get("rope_theta")
    return float(theta) if isinstance(theta, (int, float)) and not isinstance(theta, bool) else 10000.0


def _muse_glimmer_config(config: Mapping) -> Mapping:
    """Muse Glimmer's defaults as Transformers' MuseGlimmerTextConfig derives them, and its query scale.

    Without ``layer_types`` / ``layer_rope_theta``, every 4th layer counted back from the last attends
    fully and does not rotate, the others slide and rotate by rope_theta. The query's multiplier after its
    weightless norm is ``scale_query_by`` (the native schema; divided by sqrt(head_dim) when it is at least
    that) or ``qk_scale_factor``; with the scores' 1/sqrt(head_dim) it is written as the score scale
    ``_muse_attn_scale`` (a factor on q is one on q.k: rotation is linear)."""
    import math

    c = dict(config)
    n = _n_layers(c)
    nope = [(n - 1 - i) % 4 == 0 for i in range(n)]
    if c.get("layer_types") is None and n:
        c["layer_types"] = ["full_attention" if f else "sliding_attention" for f in nope]
    if c.get("layer_rope_theta") is None and n:
        c["layer_rope_theta"] = [0 if f else _global_theta(c) for f in nope]
    hd = c.get("head_dim")
    if not (isinstance(hd, int) and not isinstance(hd, bool) and hd > 0):
        heads, hidden = c.get("num_attention_heads"), c.get("hidden_size")
        hd = hidden // heads if isinstance(heads, int) and isinstance(hidden, int) and heads > 0 else 0
    if hd > 0:
        factor = c.get("scale_query_by")
        if _number(factor):
            factor = factor / math.sqrt(hd) if factor >= math.sqrt(hd) else factor
        else:
            factor = c.get("qk_scale_factor", 3.87)
        if c.get("use_qk_norm") is False:
            factor = 1.0
        if _number(factor):
            c["_muse_attn_scale"] = float(factor) / math.sqrt(hd)
    return c


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _layer_bases_unlike_rope_theta(config: Mapping) -> bool:
    """A layer_rope_theta with a non-zero base other than rope_theta (Transformers 5.24 rotates every
    non-zero layer by rope_theta itself, whatever base the list gives)."""
    thetas = config.get("layer_rope_theta")
    return isinstance(thetas, list) and any(t and t != _global_theta(config) for t in thetas)


MUSE_GLIMMER_NAMES = _with(GEMMA2_NAMES, g=_L + "self_attn.gate_proj")
_MUSE_GLIMMER = FamilySpec(
    "muse_glimmer_text", norms=_SANDWICH, names=MUSE_GLIMMER_NAMES, norm_unit_offset=True, final_norm_unit_offset=False,
    embed_norm=True, embed_norm_affine=False, post_norm_eps_key="post_norm_eps", qk_norm="head",
    qk_norm_affine=False, attn_multiplier_key="_muse_attn_scale", attn_gate="sigmoid", attn_gate_per_head=False,
    layer_rope_key="layer_rope_theta", logit_scale_key="output_multiplier",
    final_softcap_key="final_logit_softcapping", normalize=_muse_glimmer_config,
    # llama.cpp's muse-glimmer: the converter undoes the halves rotation's row order (NORM rope), writes the
    # query scale as the q norm's weight (k norm: ones) and the norms' offsets folded; the graph rotates the
    # sliding layers only, by rope.freq_base, and its output norms take 1e-8 (gguf/config.py)
    gguf_arch="muse-glimmer", gguf_qk_permuted=True, gguf_config={"logit_scale": "output_multiplier"},
    gguf_changes={"qk_norm_affine": True, "attn_multiplier_key": None, "rope_layers": "sliding",
                  "layer_rope_key": None},
    config_defaults={"rms_norm_eps": 1e-5, "post_norm_eps": 1e-8, "sliding_window": 2048, "head_dim": 128,
                     "final_logit_softcapping": 20.0, "output_multiplier": 0.19611613513818404,
                     "qk_scale_factor": 3.87, "hidden_activation": "silu"},
    variants=(Variant(lambda c: c.get("use_qk_norm") is False, {"qk_norm": None}),
              Variant(lambda c: c.get("use_attn_output_gate") is False, {"attn_gate": None})),
    refusals=(Refusal(_layer_bases_unlike_rope_theta,
                      "a layer_rope_theta with a non-zero base other than rope_theta is not supported "
                      "(Transformers 5.24 rotates every such layer by rope_theta)"),
              Refusal(stated("attention_bias"), "attention_bias is not supported")))



# MiniMax-M3's decoder as its hub checkpoints store it (vLLM's MiniMaxM3SparseForCausalLM layout, which
# Transformers' minimax_m3_vl conversion mapping reads): experts one module each under block_sparse_moe,
# the index branch beside the attention's projections.
MINIMAX_M3_NAMES = _with(LLAMA_NAMES, router=_SM + "gate", router_select_bias=_SM + "e_score_correction_bias",
                         exp_gate=_SM + "experts.{e}.w1.weight", exp_up=_SM + "experts.{e}.w3.weight",
                         exp_down=_SM + "experts.{e}.w2.weight", shexp_gate=_SM + "shared_experts.gate_proj",
                         shexp_up=_SM + "shared_experts.up_proj", shexp_down=_SM + "shared_experts.down_proj",
                         index_q=_L + "self_attn.index_q_proj", index_k=_L + "self_attn.index_k_proj",
                         index_q_norm=_L + "self_attn.index_q_norm", index_k_norm=_L + "self_attn.index_k_norm")
# sparse_attention_config's spellings -> the flat keys Transformers' MiniMaxM3VLTextConfig reads (they win).
_M3_SPARSE_KEYS = {"index_n_heads": "sparse_num_index_heads", "index_head_dim": "sparse_index_dim",
                   "index_block_size": "sparse_block_size", "index_topk_blocks": "sparse_topk_blocks",
                   "index_local_blocks": "sparse_local_block"}
_M3_LAYER_TYPES = ("full_attention", "minimax_m3_sparse")


def _m3_sparse(config: Mapping) -> Mapping:
    sparse = config.get("sparse_attention_config")
    return sparse if isinstance(sparse, Mapping) else {}


def _minimax_m3_config(config: Mapping) -> Mapping:
    """MiniMax-M3's decoder as Transformers' MiniMaxM3VLTextConfig reads it: the index branch's sizes from
    ``sparse_attention_config``, ``layer_types`` from its ``sparse_attention_freq`` (else every layer dense
    attention), ``mlp_layer_types`` from ``moe_layer_freq`` (else every layer routed), a
    ``rope_parameters.partial_rotary_factor`` read as the rotated share. The sparse layers are written as
    ``_block_sparse_layers`` (their attention as ``full_attention``); swigluoai is the experts' own unit
    (the ``oai`` gated unit), read with silu as the activation."""
    c = dict(config)
    sparse = _m3_sparse(c)
    for flat, legacy in _M3_SPARSE_KEYS.items():
        if legacy in sparse:
            c[flat] = sparse[legacy]
    n = _n_layers(c)
    types = c.get("layer_types")
    if types is None and isinstance(sparse.get("sparse_attention_freq"), list):
        types = ["minimax_m3_sparse" if f else "full_attention" for f in sparse["sparse_attention_freq"]]
    if types is None:
        types = ["full_attention"] * n
    c["_m3_layer_types"] = types
    if isinstance(types, list):
        c["_block_sparse_layers"] = [t == "minimax_m3_sparse" for t in types]
        c["layer_types"] = ["full_attention"] * len(types)
    if c.get("mlp_layer_types") is None:
        freq = c.get("moe_layer_freq")
        c["mlp_layer_types"] = (["sparse" if f else "dense" for f in freq] if isinstance(freq, list)
                                else ["sparse"] * n)
    rp = c.get("rope_parameters")
    if isinstance(rp, Mapping) and rp.get("partial_rotary_factor") is not None:
        c.setdefault("partial_rotary_factor", rp["partial_rotary_factor"])
    c["_m3_hidden_act"] = c.get("hidden_act")
    c["hidden_act"] = "silu"
    return c


def _m3_index_value_enabled(config: Mapping) -> bool:
    """sparse_disable_index_value 0 (or a list with 0) on a layer that runs sparse attention."""
    v = _m3_sparse(config).get("sparse_disable_index_value", config.get("sparse_disable_index_value"))
    flags = config.get("_block_sparse_layers") or []
    if isinstance(v, list):
        return any(on and not d for on, d in zip(flags, v))
    return v is not None and not v and any(flags)


def _m3_index_too_narrow(config: Mapping) -> bool:
    """An index head narrower than the rotated share of a head (Transformers would rotate it by a table cut
    short mid-way)."""
    d, hd, p = config.get("index_head_dim"), config.get("head_dim"), config.get("partial_rotary_factor") or 1.0
    return (any(config.get("_block_sparse_layers") or []) and _number(d) and _number(hd) and _number(p)
            and d < int(hd * p))


def _m3_refusal(key: str, why: str, bad: Callable[[Any], bool]) -> Refusal:
    """Refused when ``key`` (top-level, else in sparse_attention_config) is stated with a value ``bad`` holds for."""
    def when(config: Mapping) -> bool:
        v = config.get(key, _m3_sparse(config).get(key))
        return v is not None and bad(v)
    return Refusal(when, why)


_MINIMAX_M3 = FamilySpec(
    "minimax_m3_vl_text", names=MINIMAX_M3_NAMES, norm_unit_offset=True, qk_norm="head", moe=True,
    block_sparse=True, ffn_glu="oai", normalize=_minimax_m3_config,
    # llama.cpp's minimax-m3 (conversion/minimax.py): every norm stored as 1 + w, the index branch below
    # blk.N.indexer. (gguf/config.py: LLAMA_CPP_BLOCK_SPARSE)
    gguf_arch="minimax-m3",
    gguf_names=_with(GGUF_NAMES, index_q="blk.{i}.indexer.q_proj", index_k="blk.{i}.indexer.k_proj",
                     index_q_norm="blk.{i}.indexer.q_norm", index_k_norm="blk.{i}.indexer.k_norm"),
    keys={"intermediate_size": ("dense_intermediate_size",), "moe_intermediate_size": ("intermediate_size",),
          "n_shared_experts": ()},
    fixed={"scoring_func": "sigmoid", "norm_topk_prob": True},
    moe_fields={"select_bias": True, "glu": "oai"},
    config_defaults={"rms_norm_eps": 1e-6, "head_dim": 128, "rope_theta": 5000000.0, "intermediate_size": 3072,
                     "dense_intermediate_size": 12288, "shared_intermediate_size": 3072,
                     "routed_scaling_factor": 2.0, "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
                     "num_local_experts": 128, "num_experts_per_tok": 4, "index_n_heads": 4, "index_head_dim": 128,
                     "index_block_size": 128, "index_topk_blocks": 16, "index_local_blocks": 1},
    refusals=(
        Refusal(lambda c: c.get("_m3_hidden_act") not in (None, "swigluoai", "silu"),
                "a hidden_act other than swigluoai is not supported"),
        Refusal(lambda c: not isinstance(c.get("_m3_layer_types"), list)
                or any(t not in _M3_LAYER_TYPES for t in c["_m3_layer_types"]),
                "layer_types other than full_attention and minimax_m3_sparse are not supported"),
        _m3_refusal("attention_output_gate", "attention_output_gate is not supported", bool),
        _m3_refusal("use_gemma_norm", "use_gemma_norm false is not supported", lambda v: v is False),
        _m3_refusal("use_qk_norm", "use_qk_norm false is not supported", lambda v: v is False),
        _m3_refusal("qk_norm_type", "a qk_norm_type other than per_head is not supported", lambda v: v != "per_head"),
        _m3_refusal("scoring_func", "a scoring_func other than sigmoid is not supported", lambda v: v != "sigmoid"),
        _m3_refusal("sparse_score_type", "a sparse_score_type other than max is not supported", lambda v: v != "max"),
        _m3_refusal("sparse_init_block", "leading sparse_init_block blocks are not supported", bool),
        _m3_refusal("n_shared_experts", "n_shared_experts other than 1 is not supported (Transformers runs one "
                    "shared expert of shared_intermediate_size)", lambda v: v != 1),
        Refusal(_m3_index_value_enabled, "an enabled index value branch (sparse_disable_index_value 0 on a sparse "
                "layer) is not supported"),
        Refusal(lambda c: any(c.get("_block_sparse_layers") or [])
                and c.get("index_n_heads") != c.get("num_key_value_heads"),
                "index heads other than one per key-value head (index_n_heads / sparse_num_index_heads) are not "
                "supported"),
        Refusal(_m3_index_too_narrow, "an index head narrower than the rotated share of a head is not supported")))



# Inkling as Thinking Machines stores it below model.llm (Transformers' inkling_mm_model conversion mapping
# reads these names): attn.w*_*, the short convolutions' weights [channels, 1, taps], dense gate and up rows
# interleaved in w13_dn, stacked experts (gate and up rows interleaved per expert) and shared experts.
_K = "model.llm.layers.{i}."
INKLING_NAMES: Mapping[str, str] = {
    "embed": "model.llm.embed", "embed_norm": "model.llm.embed_norm", "final_norm": "model.llm.norm",
    "head": "model.llm.unembed", "attn_norm": _K + "attn_norm", "ffn_norm": _K + "mlp_norm",
    "q": _K + "attn.wq_du", "k": _K + "attn.wk_dv", "v": _K + "attn.wv_dv", "o": _K + "attn.wo_ud",
    "rel_r": _K + "attn.wr_du", "rel_profiles": _K + "attn.rel_logits_proj.proj", "q_norm": _K + "attn.q_norm",
    "k_norm": _K + "attn.k_norm", "k_conv": _K + "attn.k_sconv", "v_conv": _K + "attn.v_sconv",
    "attn_out_conv": _K + "attn_sconv", "ffn_out_conv": _K + "mlp_sconv",
    "gate_up": _K + "mlp.w13_dn", "down": _K + "mlp.w2_md", "ffn_scale": _K + "mlp.global_scale",
    "router": _K + "mlp.gate", "router_select_bias": _K + "mlp.gate.bias", "router_scale": _K + "mlp.gate.global_scale",
    "exp_gate_up": _K + "mlp.experts.w13_weight", "exp_down": _K + "mlp.experts.w2_weight",
    "sink_gate_up": _K + "mlp.shared_experts.shared_w13_weight", "sink_down": _K + "mlp.shared_experts.shared_w2_weight",
}


def _inkling_config(config: Mapping) -> Mapping:
    """Inkling's config as Transformers' InklingTextConfig reads it: ``layer_types`` from ``local_layer_ids``
    (else every layer but each 6th slides), written as sliding_attention / full_attention with the sliding
    layers' swa_* head shapes in ``per_layer_config`` and their window as ``sliding_window``;
    ``mlp_layer_types`` from ``dense_mlp_idx`` (the layers before it dense, else every layer routed);
    Thinking Machines' ``dense_intermediate_size`` (the dense width; ``intermediate_size`` is then the
    experts') and ``sconv_kernel_size``."""
    c = dict(config)
    n = _n_layers(c)
    if c.get("dense_intermediate_size") is not None:
        c["moe_intermediate_size"] = c.get("intermediate_size")
        c["intermediate_size"] = c["dense_intermediate_size"]
    if c.get("sconv_kernel_size") is not None:
        c["conv_kernel_size"] = c["sconv_kernel_size"]
    types = c.get("layer_types")
    if types is None:
        local = c.get("local_layer_ids")
        local = set(local) if isinstance(local, list) else {i for i in range(n) if (i + 1) % 6}
        types = ["hybrid_sliding" if i in local else "hybrid" for i in range(n)]
    c["_inkling_layer_types"] = types
    if isinstance(types, list):
        c["layer_types"] = ["sliding_attention" if t == "hybrid_sliding" else "full_attention" for t in types]
        swa = {k: c.get(f"swa_{k}") for k in ("num_attention_heads", "num_key_value_heads", "head_dim")}
        swa = {k: v for k, v in swa.items() if v is not None}
        if swa:
            c["per_layer_config"] = {str(i): swa for i, t in enumerate(types) if t == "hybrid_sliding"}
    if c.get("sliding_window_size") is not None:
        c["sliding_window"] = c["sliding_window_size"]
    if c.get("mlp_layer_types") is None:
        first = c.get("dense_mlp_idx", 0)
        first = first if isinstance(first, int) and not isinstance(first, bool) else 0
        c["mlp_layer_types"] = ["dense" if i < first else "sparse" for i in range(n)]
    return c


_INKLING = FamilySpec(
    "inkling_text", names=INKLING_NAMES, positions="none", qk_norm="head", embed_norm=True, relative=True,
    gate_up_interleaved=True, moe=True, expert_gate_up_interleaved=True, logit_scale_key="logits_mup_width_multiplier",
    logit_scale_divides=True, adapters="none", normalize=_inkling_config,
    keys={"num_experts": ("n_routed_experts",), "routed_scaling_factor": ("route_scale",), "n_shared_experts": (),
          "shared_intermediate_size": (), "router_sink": ("n_shared_experts",),
          "logits_kept": ("unpadded_vocab_size",)},
    fixed={"scoring_func": "sigmoid"},
    moe_fields={"select_bias": True},
    config_defaults={"rms_norm_eps": 1e-6, "head_dim": 128, "swa_num_attention_heads": 64,
                     "swa_num_key_value_heads": 16, "swa_head_dim": 128, "sliding_window_size": 512, "d_rel": 16,
                     "rel_extent": 1024, "log_scaling_alpha": 0.1, "conv_kernel_size": 4, "intermediate_size": 24576,
                     "moe_intermediate_size": 3072, "n_routed_experts": 256, "num_experts_per_tok": 6,
                     "n_shared_experts": 2, "route_scale": 8.0, "logits_mup_width_multiplier": 24.0},
    refusals=(Refusal(lambda c: not isinstance(c.get("_inkling_layer_types"), list)
                      or any(t not in ("hybrid", "hybrid_sliding") for t in c["_inkling_layer_types"]),
                      "layer_types other than hybrid and hybrid_sliding are not supported"),
              Refusal(lambda c: c.get("shared_expert_sink") is False,
                      "shared_expert_sink false is not supported (Transformers' router always scores the shared "
                      "experts)"),
              Refusal(lambda c: not (isinstance(c.get("n_shared_experts", 2), int) and c.get("n_shared_experts", 2) >= 1),
                      "n_shared_experts below 1 is not supported"),
              Refusal(lambda c: not _inkling_unpadded_ok(c),
                      "unpadded_vocab_size must be an integer in 1..vocab_size (the logits kept of the padded "
                      "vocabulary)"),
              Refusal(lambda c: isinstance(c.get("local_layer_ids"), list) and not all(
                  isinstance(i, int) and not isinstance(i, bool) and 0 <= i < _n_layers(c) for i in c["local_layer_ids"]),
                      "local_layer_ids must list layer indices in 0..num_hidden_layers-1")))


def _inkling_unpadded_ok(c: Mapping) -> bool:
    kept, vocab = c.get("unpadded_vocab_size"), c.get("vocab_size")
    if kept is None:
        return True
    return (isinstance(kept, int) and not isinstance(kept, bool) and isinstance(vocab, int)
            and not isinstance(vocab, bool) and 0 < kept <= vocab)


FAMILIES: dict[str, FamilySpec] = {
    f.model_type: f
    for f in (
        FamilySpec("llama", sliding="never", rope_whole_head=True, gguf_arch="llama", gguf_qk_permuted=True),
        FamilySpec("mistral", rope_whole_head=True, gguf_arch="llama", gguf_qk_permuted=True, sliding="all",
                   # Mistral's own format (params.json, read by mistral_format.py): its names, adjacent pairs
                   variants=(Variant(flag("mistral_format"), {"names": MISTRAL_FORMAT_NAMES,
                                                              "rope_interleaved": True}),)),
        FamilySpec("qwen2", rope_whole_head=True, gguf_arch="qwen2", sliding="qwen2"),
        FamilySpec("qwen3", rope_whole_head=True, gguf_arch="qwen3", sliding="qwen2", qk_norm="head"),
        FamilySpec("phi", sliding="never", **_EPS["layer_norm_eps"],
                   norm="layer", parallel=True, norms=("attn_norm",), default_act="gelu_new",
                   names=PHI_NAMES, variants=(Variant(flag("qk_layernorm"), {"qk_norm": "head"}),),
                   gguf_arch="phi2", gguf_names=GGUF_PLAIN_MLP_NAMES),
        FamilySpec("phi3", sliding="all", fused_qkv="concat", names=PHI3_NAMES,
                   config_defaults={"original_max_position_embeddings": 4096},  # Transformers' Phi3Config
                   # llama.cpp switches Phi-3's sliding window off ("Phi SWA is currently disabled")
                   gguf_arch="phi3", gguf_names=GGUF_PHI3_NAMES, gguf_changes={"sliding": "none"},
                   gguf_config={"rope.scaling.attn_factor": "longrope_attention_factor"},
                   gguf_refusals=(Refusal(stated("longrope_attention_factor"),
                                          "LongRoPE (rope_factors_long / rope_factors_short) is not supported"),)),
        FamilySpec("granite", sliding="never", rope_whole_head=True,
                   **_GRANITE, logit_scale_divides=True, gguf_arch="granite", gguf_qk_permuted=True,
                   gguf_config=_GRANITE_GGUF),
        FamilySpec("stablelm", sliding="never", **_EPS["layer_norm_eps"],
                   norm="layer", names=STABLELM_NAMES, gguf_arch="stablelm", gguf_config=_PARALLEL_GGUF,
                   gguf_changes=_QK_NORM_IF_PRESENT,
                   variants=(Variant(flag("use_parallel_residual"), {"parallel": True, "norms": ("attn_norm",)}),
                             Variant(flag("qk_layernorm"), {"qk_norm": "head"}))),
        FamilySpec("starcoder2", rope_whole_head=True, **_EPS["norm_epsilon"],
                   norm="layer", sliding="all", default_act="gelu_pytorch_tanh",
                   names=STARCODER2_NAMES, tie_default=True, gguf_arch="starcoder2", gguf_names=GGUF_PLAIN_MLP_NAMES,
                   gguf_changes={"sliding": "none"}),  # llama.cpp's starcoder2 has no sliding window
        FamilySpec("cohere", sliding="never", **_EPS["layer_norm_eps"], rope_whole_head=True,
                   norm="layer", parallel=True, norms=("attn_norm",), rope_interleaved=True,
                   logit_scale_key="logit_scale", tie_default=True, gguf_arch="command-r",
                   gguf_config={"logit_scale": "logit_scale"}, gguf_changes=_QK_NORM_IF_PRESENT,
                   variants=(Variant(flag("use_qk_norm"), {"qk_norm": "head"}),)),
        FamilySpec("cohere2", **_EPS["layer_norm_eps"], rope_whole_head=True,
                   norm="layer", parallel=True, norms=("attn_norm",), rope_interleaved=True,
                   logit_scale_key="logit_scale", tie_default=True, sliding="pattern", sliding_pattern=4,
                   rope_layers="sliding", gguf_arch="cohere2", gguf_config={"logit_scale": "logit_scale"}),
        FamilySpec("nemotron", sliding="never", **_EPS["norm_eps"],
                   norm="layer", norm_unit_offset=True, default_act="relu2", names=PLAIN_MLP_NAMES,
                   gguf_arch="nemotron", gguf_names=GGUF_PLAIN_MLP_NAMES),
        FamilySpec("olmo", sliding="never", rope_whole_head=True,
                   norm="layer", norm_affine=False, fixed={"norm_eps": 1e-5}, clip_qkv_key="clip_qkv",
                   gguf_arch="olmo", gguf_qk_permuted=True, gguf_config={"attention.clamp_kqv": "clip_qkv"}),
        FamilySpec("olmo2", sliding="never", rope_whole_head=True, **_OLMO2, gguf_arch="olmo2"),
        FamilySpec("olmo3", rope_whole_head=True, **_OLMO2, sliding="pattern", sliding_pattern=4, gguf_arch="olmo2"),
        FamilySpec("exaone4", rope_whole_head=True,
                   norms=("attn_post_norm", "ffn_post_norm"), qk_norm="head", names=OLMO2_NAMES,
                   sliding="pattern", sliding_pattern=4, rope_layers="sliding_if_windowed", gguf_arch="exaone4"),
        FamilySpec("internlm3", sliding="never", rope_whole_head=True,
                   gguf_arch="llama"),  # llama.cpp converts InternLM3 to its llama architecture
        FamilySpec("seed_oss", sliding="never", rope_whole_head=True, gguf_arch="seed_oss",
                   gguf_names=_with(GGUF_NAMES, ffn_norm="blk.{i}.post_attention_norm")),
        FamilySpec("arcee", sliding="never", rope_whole_head=True,
                   default_act="relu2", names=PLAIN_MLP_NAMES, gguf_arch="arcee", gguf_qk_permuted=True,
                   gguf_names=GGUF_PLAIN_MLP_NAMES),
        FamilySpec("ernie4_5", sliding="never", rope_whole_head=True,
                   rope_interleaved=True, tie_default=True, gguf_arch="ernie4_5"),
        FamilySpec("glm", sliding="never", rope_interleaved=True, names=GLM_NAMES, gguf_arch="chatglm",
                   gguf_names=_with(GGUF_NAMES, gate=None, up=None, gate_up="blk.{i}.ffn_up")),
        FamilySpec("glm4", sliding="never", rope_interleaved=True, norms=_SANDWICH, names=GLM4_NAMES, gguf_arch="glm4",
                   gguf_names=_with(GGUF_NAMES, gate=None, up=None, gate_up="blk.{i}.ffn_up",
                                    attn_post_norm="blk.{i}.post_attention_norm",
                                    ffn_post_norm="blk.{i}.post_ffw_norm")),
        FamilySpec("gpt_neox", sliding="never", norm="layer", parallel=True, fused_qkv="grouped", default_act="gelu",
                   root="gpt_neox.", names=GPT_NEOX_NAMES, gguf_arch="gptneox", gguf_names=GGUF_PLAIN_MLP_NAMES,
                   gguf_config=_PARALLEL_GGUF,
                   config_defaults={"layer_norm_eps": 1e-5},
                   keys={"num_key_value_heads": (), "head_dim": (), "norm_eps": ("layer_norm_eps",),
                         "partial_rotary_factor": ("partial_rotary_factor", "rotary_pct"),
                         "rope_theta": ("rope_theta", "rotary_emb_base")},
                   variants=(Variant(unset("use_parallel_residual"), {"parallel": False}),),
                   refusals=(Refusal(_neox_head_dim_differs,
                                     "a head_dim other than hidden_size / num_attention_heads is not supported "
                                     "(Transformers' GPT-NeoX splits its heads by hidden_size / num_attention_heads "
                                     "but sizes its rotation by head_dim; remove head_dim from config.json or set "
                                     "it to hidden_size / num_attention_heads)"),)),
        FamilySpec("gptj", sliding="never", norm="layer", parallel=True, norms=("attn_norm",), rope_interleaved=True,
                   default_act="gelu_new", root="transformer.", names=GPTJ_NAMES,
                   keys=dict(GPT_KEYS, rope_theta=("rope_theta", "rotary_emb_base"), rotary_dim=("rotary_dim",)),
                   ffn_mult=4,
                   refusals=(Refusal(lambda c: not isinstance(c.get("rotary_dim"), int),
                                     "a GPT-J config without an integer rotary_dim is not supported"),)),
        FamilySpec("smollm3", rope_whole_head=True,
                   gguf_arch="smollm3", gguf_qk_permuted=True, sliding="qwen2", no_rope_key="no_rope_layers",
                   tie_default=True),
        FamilySpec("gpt2", sliding="never",
                   norm="layer", positions="learned", default_act="gelu_new", fused_qkv="concat",
                   inputs_first=True, root="transformer.", names=GPT2_NAMES, keys=GPT_KEYS, ffn_mult=4,
                   tie_default=True, gguf_arch="gpt2", gguf_names=GGUF_LEARNED_POS_NAMES,
                   variants=(Variant(unset("scale_attn_weights"), {"attn_unscaled": True}),),
                   refusals=(Refusal(flag("scale_attn_by_inverse_layer_idx"),
                                     "scale_attn_by_inverse_layer_idx (scores divided by the layer number) "
                                     "is not supported"),)),
        FamilySpec("gpt_bigcode", sliding="never", norm="layer", positions="learned", default_act="gelu_pytorch_tanh",
                   fused_qkv="grouped", root="transformer.", names=GPT2_NAMES, keys=GPT_KEYS, ffn_mult=4,
                   tie_default=True, gguf_arch="starcoder", gguf_names=GGUF_LEARNED_POS_NAMES,
                   variants=(Variant(flag("multi_query", True), {"fixed": {"num_key_value_heads": 1}}),
                             Variant(unset("scale_attn_weights"), {"attn_unscaled": True}))),
        FamilySpec("opt", sliding="never", norm="layer", positions="learned", position_offset=2, default_act="relu",
                   root="model.", names=OPT_NAMES, tie_default=True, fixed={"norm_eps": 1e-5},
                   keys={"num_key_value_heads": (), "head_dim": (), "intermediate_size": ("ffn_dim",),
                         "act": ("activation_function",)},
                   variants=(Variant(unset("layer_norm_elementwise_affine"),
                                     {"norm_affine": False}),),
                   refusals=(Refusal(unset("do_layer_norm_before"),
                                     "OPT's post-norm blocks (do_layer_norm_before: false) are not supported"),
                             Refusal(lambda c: c.get("word_embed_proj_dim") not in (None, c.get("hidden_size")),
                                     "an OPT word_embed_proj_dim unlike hidden_size (project_in/project_out) "
                                     "is not supported"),
                             Refusal(flag("_remove_final_layer_norm"),
                                     "an OPT checkpoint without its final layer norm is not supported"))),
        FamilySpec("bloom", sliding="never",
                   norm="layer", positions="alibi", embed_norm=True, default_act="gelu_pytorch_tanh",
                   fused_qkv="grouped", root="transformer.", names=BLOOM_NAMES, ffn_mult=4, tie_default=True,
                   gguf_arch="bloom", gguf_names=GGUF_BLOOM_NAMES,
                   keys={"hidden_size": ("hidden_size", "n_embed"),
                         "num_hidden_layers": ("num_hidden_layers", "n_layer"),
                         "num_attention_heads": ("num_attention_heads", "n_head"), "num_key_value_heads": (),
                         "head_dim": (), "intermediate_size": ()},
                   refusals=(Refusal(flag("apply_residual_connection_post_layernorm"),
                                     "apply_residual_connection_post_layernorm (the residual taken after the "
                                     "norm) is not supported"),)),
        FamilySpec("falcon", sliding="never",
                   norm="layer", default_act="gelu", fused_qkv="grouped", root="transformer.",
                   names=FALCON_NAMES, ffn_mult=4, tie_default=True, alibi_scaled=True, alibi_bf16=True,
                   gguf_arch="falcon", gguf_names=GGUF_PLAIN_MLP_NAMES,
                   gguf_changes={"parallel": True, "norms": ("attn_norm", "ffn_norm"), "positions": "rope",
                                 "gguf_names": GGUF_FALCON_NAMES},
                   keys={"num_key_value_heads": (), "head_dim": (), "intermediate_size": ("ffn_hidden_size",),
                         "act": ("activation",)},
                   variants=(Variant(flag("parallel_attn", True), {"parallel": True, "norms": ("attn_norm",)}),
                             Variant(flag("multi_query", True), {"fixed": {"num_key_value_heads": 1}}),
                             Variant(flag("new_decoder_architecture"),
                                     {"parallel": True, "norms": ("attn_norm", "ffn_norm"), "names": FALCON_NEW_NAMES,
                                      "fixed": {}, "keys": {"num_key_value_heads": ("num_kv_heads",), "head_dim": (),
                                                            "intermediate_size": ("ffn_hidden_size",),
                                                            "act": ("activation",)}}),
                             Variant(_FALCON_NEW_1LN, {"norms": ("attn_norm",), "names": FALCON_NAMES}),
                             Variant(flag("alibi"), {"positions": "alibi"})),
                   refusals=(Refusal(lambda c: flag("new_decoder_architecture")(c) and unset("parallel_attn")(c),
                                     "Falcon's new decoder architecture without parallel_attn is not supported"),)),
        FamilySpec("mpt", norm="layer", positions="alibi", default_act="gelu", fused_qkv="concat",
                   root="transformer.", names=MPT_NAMES, ffn_mult_key="expansion_ratio", ffn_mult=4, tie_default=True,
                   gguf_arch="mpt", gguf_names=GGUF_PLAIN_MLP_NAMES, gguf_changes={"clip_qkv_key": "clip_qkv"},
                   gguf_config={"attention.clamp_kqv": "clip_qkv", "attention.max_alibi_bias": "alibi_bias_max"},
                   keys={"hidden_size": ("d_model",), "num_hidden_layers": ("n_layers",),
                         "num_attention_heads": ("n_heads",), "num_key_value_heads": (), "head_dim": (),
                         "intermediate_size": (), "max_position_embeddings": ("max_seq_len",), "act": ()},
                   refusals=(Refusal(lambda c: not flag("alibi", True, sub="attn_config")(c),
                                     "MPT with learned positions (attn_config.alibi: false) is not supported"),
                             Refusal(flag("qk_ln", sub="attn_config"), "MPT's attn_config.qk_ln is not supported"),
                             Refusal(stated("clip_qkv", sub="attn_config"),
                                     "MPT's attn_config.clip_qkv is not supported"),
                             Refusal(stated("softmax_scale", sub="attn_config"),
                                     "MPT's attn_config.softmax_scale is not supported"),
                             Refusal(stated("attn_type", sub="attn_config", unless="multihead_attention"),
                                     "an MPT attn_config.attn_type other than multihead_attention is not supported"),
                             Refusal(stated("alibi_bias_max", sub="attn_config", unless=8),
                                     "an MPT attn_config.alibi_bias_max other than 8 is not supported"),
                             Refusal(stated("logit_scale"), "MPT's logit_scale is not supported"),
                             Refusal(_mpt_alibi_heads_not_power_of_two,
                                     "MPT's ALiBi over a head count that is not a power of two is not supported"))),
        FamilySpec("exaone", sliding="never", rope_whole_head=True,
                   names=EXAONE_NAMES, root="transformer.", gguf_arch="exaone",
                   keys={"num_hidden_layers": ("num_hidden_layers", "num_layers"),
                         "act": ("hidden_act", "activation_function")}),
        FamilySpec("hunyuan_v1_dense", sliding="never", qk_norm="head", qk_norm_after_rope=True, names=HUNYUAN_NAMES,
                   gguf_arch="hunyuan-dense",
                   variants=(Variant(unset("use_qk_norm"), {"qk_norm": None}),)),
        FamilySpec("jais2", sliding="never", **_EPS["layer_norm_eps"], rope_whole_head=True,
                   norm="layer", default_act="relu2", names=PLAIN_MLP_NAMES, gguf_arch="jais2",
                   gguf_names=GGUF_PLAIN_MLP_NAMES),
        FamilySpec("gemma", sliding="never", rope_whole_head=True, gguf_arch="gemma", **_GEMMA),
        FamilySpec("gemma2", rope_whole_head=True, gguf_arch="gemma2", sliding="even", **_GEMMA2),
        # Transformers' Gemma 3 attention never reads attn_logit_softcapping (q/k norms replaced the cap)
        FamilySpec("gemma3_text", rope_whole_head=True, gguf_arch="gemma3", sliding="pattern", qk_norm="head",
                   local_rope_key="rope_local_base_freq", **dict(_GEMMA2, attn_softcap_key=None)),
        FamilySpec("granite_swa", rope_whole_head=True,
                   **_GRANITE, logit_scale_divides=True, sinks=True, sliding="pattern_first",
                   sliding_pattern=4, layer_rope_key="layer_rope_theta", tie_default=True,
                   names=_with(LLAMA_NAMES, sinks=_L + "self_attn.sinks"),
                   refusals=(_GRANITE_SWA_BASES,)),
        FamilySpec("iquestcoder", rope_whole_head=True, sliding="qwen2", clip_qkv_key="clip_qkv"),
        FamilySpec("hyperclovax", sliding="never", rope_whole_head=True,
                   **_GRANITE, norms=_SANDWICH, names=HYPERCLOVAX_NAMES,
                   variants=(Variant(unset("use_post_norm"),
                                     {"norms": ("attn_norm", "ffn_norm")}),)),
        FamilySpec("vaultgemma", rope_whole_head=True,
                   sliding="even", **dict(_GEMMA2, norms=("attn_norm", "ffn_norm"))),
        FamilySpec("apertus", sliding="never", qk_norm="head", names=APERTUS_NAMES, default_act="xielu"),
        FamilySpec("ministral3", sliding="all", query_temperature="rope_parameters",
                   refusals=(Refusal(stated("layer_types"),
                                     "layer_types (which layers slide) is not supported (Transformers' Ministral3 "
                                     "does not place its sliding windows by it, and ster's would differ; remove "
                                     "layer_types from config.json)"),)),
        FamilySpec("mixtral", rope_whole_head=True, gguf_arch="llama", gguf_qk_permuted=True, sliding="all", moe=True,
                   names=MIXTRAL_NAMES, fixed={"norm_topk_prob": True},
                   keys={"moe_intermediate_size": ("intermediate_size",)}),
        FamilySpec("qwen2_moe", gguf_arch="qwen2moe", sliding="qwen2_moe", moe=True, shared_gated=True,
                   rope_whole_head=True,
                   names=QWEN2_MOE_NAMES, config_defaults={"max_window_layers": 28}),
        FamilySpec("qwen3_moe", gguf_arch="qwen3moe", sliding="switched", qk_norm="head", moe=True,
                   rope_whole_head=True,
                   names=QWEN_MOE_DENSE_NAMES),
        # ---- H1: GraniteMoE, GraniteMoE-Shared, GraniteMoE-SWA, DBRX, PhiMoE
        # llama.cpp converts GraniteMoE and GraniteMoE-Shared to granitemoe (the shared expert read by
        # presence) and GraniteMoE-SWA to granite_swa, through its Llama converter (q/k rows reordered)
        FamilySpec("granitemoe", rope_whole_head=True, names=GRANITEMOE_NAMES, **_GRANITEMOE, **_GRANITEMOE_GGUF),
        FamilySpec("granitemoeshared", names=GRANITEMOE_SHARED_NAMES, **_GRANITEMOE_SHARED, **_GRANITEMOE_GGUF,
                   rope_whole_head=True),
        FamilySpec("granitemoe_swa", names=GRANITEMOE_SWA_NAMES, sinks=True, sliding="pattern_first",
                   **dict(_GRANITEMOE_GGUF, gguf_arch="granite_swa", gguf_names=GGUF_GRANITE_SWA_NAMES),
                   sliding_pattern=4, layer_rope_key="layer_rope_theta", refusals=(_GRANITE_SWA_BASES,),
                   **_GRANITEMOE_SHARED),
        FamilySpec("dbrx", norm="layer", fused_qkv="concat", root="transformer.", moe=True, names=DBRX_NAMES,
                   rope_whole_head=True,
                   expert_inputs_first=("exp_down",), clip_qkv_key="attn_config.clip_qkv",
                   # llama.cpp's dbrx: the FFN's norm is attn_output_norm, q/k/v clamped by attention.clamp_kqv
                   gguf_arch="dbrx", gguf_names=_with(GGUF_NAMES, ffn_norm="blk.{i}.attn_output_norm"),
                   gguf_config={"attention.clamp_kqv": "clip_qkv"}, gguf_changes={"clip_qkv_key": "clip_qkv"},
                   fixed={"norm_eps": 1e-5}, keys=_DBRX_KEYS,
                   defaults={"num_key_value_heads": 1, "intermediate_size": 3584, "moe_intermediate_size": 3584,
                             "num_experts": 4, "num_experts_per_tok": 1, "norm_topk_prob": True},
                   variants=(Variant(_dbrx_unnormalised, {"fixed": {"norm_eps": 1e-5, "norm_topk_prob": False}}),),
                   refusals=(Refusal(_dbrx_other_power, "DBRX's ffn_config.moe_normalize_expert_weights other "
                                     "than 1 (a p-norm of the chosen weights) is not supported"),)),
        # llama.cpp runs phimoe through its Phi-3 graph: RMS norms (their stored biases added), a softmax
        # router renormalised over the two chosen (LLAMA_CPP_MOE), no sliding window; unlike Transformers'
        # LayerNorms and SparseMixer. A GGUF file means what llama.cpp computes.
        FamilySpec("phimoe", norm="layer", sliding="all", moe=True, names=MIXTRAL_NAMES, gguf_arch="phimoe",
                   rope_whole_head=True,
                   gguf_changes={"norm": "rms", "sliding": "none"},
                   gguf_config={"rope.scaling.attn_factor": "longrope_attention_factor"},
                   gguf_refusals=(Refusal(stated("longrope_attention_factor"),
                                          "LongRoPE (rope_factors_long / rope_factors_short) is not supported"),),
                   fixed={"scoring_func": "sparsemixer"}, keys={"moe_intermediate_size": ("intermediate_size",)},
                   defaults={"norm_eps": 1e-5, "rope_theta": 1e6, "num_experts": 16, "num_experts_per_tok": 2},
                   refusals=(Refusal(lambda c: c.get("num_experts_per_tok", 2) != 2,
                                     "PhiMoE with other than two experts per token (num_experts_per_tok) is not "
                                     "supported: its SparseMixer router chooses two"),
                             Refusal(lambda c: c.get("router_jitter_noise") is None,
                                     "a PhiMoE config without router_jitter_noise (SparseMixer's bound) is not "
                                     "supported"),
                             Refusal(_phimoe_rope_unsupported,
                                     "PhiMoE's short_mscale / long_mscale on a rope type other than longrope "
                                     "is not supported"))),
        # --- group H3: gpt_oss, llama4_text, afmoe, cohere2_moe
        FamilySpec("gpt_oss", sliding="even", sinks=True, moe=True, names=GPT_OSS_NAMES,
                   keys={"moe_intermediate_size": ("intermediate_size",)}, fixed={"norm_topk_prob": True},
                   moe_defaults={"swiglu_limit": 7.0}, moe_fields={"glu": "oai"},
                   config_defaults={"sliding_window": 128},
                   expert_inputs_first=("exp_gate_up", "exp_down"), expert_gate_up_interleaved=True,
                   # llama.cpp's converter splits gate/up and writes every expert [out, in] (F32 from a
                   # float checkpoint, MXFP4 from an MXFP4 one); its graph fixes the router and the unit
                   # in code (gguf/config.py LLAMA_CPP_MOE)
                   gguf_arch="gpt-oss", gguf_names=GGUF_GPT_OSS_NAMES),
        FamilySpec("cohere2_moe", norm="layer", parallel=True, norms=("attn_norm",), rope_interleaved=True,
                   rope_whole_head=True,
                   logit_scale_key="logit_scale", tie_default=True, sliding="prefix_pattern", sliding_pattern=4,
                   rope_layers="sliding", moe=True, names=COHERE2_MOE_NAMES, gguf_arch="cohere2moe",
                   gguf_config={"logit_scale": "logit_scale", "attention.layer_norm_rms_epsilon": "rms_norm_eps"},
                   # llama.cpp (src/models/cohere2moe.cpp) rotates the sliding layers and the leading dense
                   # ones, whatever prefix_dense_sliding_window_pattern was; without a per-layer pattern in
                   # the file all but layers 0, 4, 8, ... slide (load_swa_pattern(4, dense_first))
                   gguf_changes={"rope_layers": "sliding_or_dense", "sliding": "pattern_first"},
                   keys={"intermediate_size": ("prefix_dense_intermediate_size", "intermediate_size"),
                         "moe_intermediate_size": ("intermediate_size",), "scoring_func": ("expert_selection_fn",)},
                   moe_defaults={"norm_topk_prob": True}, moe_fields={"shared_average": True},
                   config_defaults={"logit_scale": 0.0625, "sliding_window": 4096},
                   variants=(Variant(stated("rms_norm_eps"), {"norm": "rms"}),
                             # softmax over the chosen logits: the softmax over all, renormalised
                             Variant(lambda c: c.get("expert_selection_fn") != "sigmoid",
                                     {"fixed": {"norm_topk_prob": True}}),
                             Variant(lambda c: c.get("shared_expert_combination_strategy") == "sum",
                                     {"moe_fields": {}}),
                             Variant(lambda c: c.get("prefix_dense_sliding_window_pattern", 1) == 1,
                                     {"rope_layers": "sliding_or_dense"})),
                   refusals=(Refusal(flag("use_qk_norm"), "Cohere 2 MoE's use_qk_norm is not supported"),
                             Refusal(unset("use_gated_activation"),
                                     "Cohere 2 MoE without use_gated_activation (a plain MLP) is not supported"),
                             Refusal(lambda c: c.get("shared_expert_combination_strategy") not in
                                     (None, "average", "sum"),
                                     "a shared_expert_combination_strategy other than 'average' or 'sum' "
                                     "is not supported"))),
        FamilySpec("afmoe", norms=_SANDWICH, qk_norm="head", attn_gate="sigmoid", attn_gate_per_head=False,
                   rope_whole_head=True,
                   rope_layers="sliding", sliding="pattern", sliding_pattern=4, moe=True, names=AFMOE_NAMES,
                   gguf_arch="afmoe",
                   # llama.cpp (src/models/afmoe.cpp) always scales the embeddings by sqrt(hidden_size) and
                   # routes as the file says (gating function, expert_weights_norm, expert_weights_scale)
                   gguf_changes={"embed_scale_sqrt_hidden": True, "moe_fields": {}},
                   sliding_pattern_key="global_attn_every_n_layers",
                   keys={"routed_scaling_factor": ("route_scale",), "scoring_func": ()},
                   # Transformers' AfmoeTokenChoiceRouter: sigmoid scores, a selection-only bias, always
                   # renormalised (+1e-20), times route_scale
                   fixed={"norm_topk_prob": True},
                   moe_fields={"scoring": "sigmoid", "select_bias": True, "renorm_eps": 1e-20},
                   config_defaults={"sliding_window": 1024, "num_dense_layers": 1, "num_shared_experts": 2},
                   variants=(Variant(flag("mup_enabled"), {"embed_scale_sqrt_hidden": True}),),
                   refusals=(Refusal(stated("score_func", unless="sigmoid"),
                                     "an afmoe score_func other than sigmoid (Transformers scores by sigmoid "
                                     "whatever it says) is not supported"),
                             Refusal(lambda c: c.get("route_norm") is False,
                                     "afmoe's route_norm false (Transformers always renormalises) is not supported"),
                             Refusal(lambda c: "sliding_window" in c and c["sliding_window"] is None,
                                     "an afmoe sliding_window of null is not supported"))),
        FamilySpec("llama4_text", rope_interleaved=True, no_rope_key="no_rope_layers", chunk_key="attention_chunk_size",
                   qk_norm="head", qk_norm_after_rope=True, qk_norm_layers="rotated", qk_norm_affine=False,
                   query_temperature="unrotated_layers", moe=True, names=LLAMA4_NAMES, gguf_arch="llama4",
                   # llama.cpp fixes the chunk, the temperature, the unrotated layers in code (gguf/config.py
                   # LLAMA_CPP_CHUNKED); a file without chunked attention it cannot run (its graph asserts)
                   gguf_config={"attention.sliding_window": "sliding_window"},
                   gguf_refusals=(Refusal(lambda c: c.get("sliding_window") == 0,
                                          "Llama 4 without chunked attention (attention.sliding_window 0, "
                                          "all layers full attention) is not supported"),),
                   keys={"intermediate_size": ("intermediate_size_mlp",),
                         "moe_intermediate_size": ("intermediate_size",),
                         "shared_intermediate_size": ("intermediate_size",), "norm_topk_prob": (),
                         "scoring_func": (), "topk_method": ()},
                   # Llama4Router: sigmoid of the chosen logits, each expert reading its weight times x
                   moe_fields={"scoring": "sigmoid", "on_input": True}, expert_inputs_first=("exp_gate_up", "exp_down"),
                   config_defaults={"intermediate_size_mlp": 16384, "num_local_experts": 16, "num_experts_per_tok": 1,
                                    "interleave_moe_layer_step": 1, "no_rope_layer_interval": 4,
                                    "attention_chunk_size": 8192, "use_qk_norm": True,
                                    "attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1},
                   variants=(Variant(unset("use_qk_norm"), {"qk_norm": None}),)),
        FamilySpec("olmoe", qk_norm="proj", clip_qkv_key="clip_qkv", moe=True, names=QWEN_MOE_NAMES,
                   rope_whole_head=True,
                   keys={"moe_intermediate_size": ("intermediate_size",)},
                   gguf_arch="olmoe", gguf_changes={"clip_qkv_key": None}),  # llama.cpp's olmoe never clamps
        # group H2: DeepSeek-V3-style routers with shared experts, and ERNIE 4.5 / HunYuan's softmax routers
        # llama.cpp's glm4moe applies q/k norms when the file holds them; its FFN norm is post_attention_norm
        FamilySpec("glm4_moe", qk_norm="head", moe=True, names=GLM4_MOE_NAMES, **_V3_ROUTER, gguf_arch="glm4moe",
                   gguf_changes=_QK_NORM_IF_PRESENT,
                   gguf_names=_with(GGUF_NAMES, ffn_norm="blk.{i}.post_attention_norm"),
                   variants=(Variant(unset("use_qk_norm", False), {"qk_norm": None}),),
                   moe_defaults={"num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 1408,
                                 "n_shared_experts": 1, "norm_topk_prob": True, "routed_scaling_factor": 1.0},
                   config_defaults={"partial_rotary_factor": 0.5, "first_k_dense_replace": 1}),
        # llama.cpp converts Sarvam MoE to bailingmoe2 (Ling 2.0's architecture, which this family then reads)
        FamilySpec("sarvam_moe", qk_norm="head", moe=True, fused_qkv="concat", names=SARVAM_MOE_NAMES, **_V3_ROUTER,
                   gguf_arch="bailingmoe2",
                   variants=(Variant(unset("use_qk_norm"), {"qk_norm": None}),),
                   moe_defaults={"num_experts": 128, "num_experts_per_tok": 6, "moe_intermediate_size": 1024,
                                 "n_shared_experts": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5},
                   config_defaults={"first_k_dense_replace": 1, "head_dim": 64},
                   refusals=(Refusal(stated("score_function", unless="sigmoid"),
                                     "a router score_function other than sigmoid is not supported"),
                             Refusal(unset("moe_router_enable_expert_bias"),
                                     "a router without its selection bias (moe_router_enable_expert_bias: false) "
                                     "is not supported"),
                             Refusal(flag("use_bias"), "a bias on attention.dense (use_bias) is not supported"))),
        FamilySpec("exaone_moe", qk_norm="head", sliding="pattern", sliding_pattern=4, gguf_arch="exaone-moe",
                   rope_whole_head=True,
                   rope_layers="sliding_if_windowed", moe=True, names=EXAONE_MOE_NAMES, **_V3_ROUTER,
                   moe_defaults={"num_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 1024,
                                 "n_shared_experts": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5},
                   config_defaults={"first_k_dense_replace": 1, "sliding_window": 4096}),
        # Transformers' HY V3 router always renormalises and reads neither route_norm, n_group nor
        # first_k_dense_replace (its dense layers come from mlp_layer_types, else only the first).
        # llama.cpp's hy_v3 names the selection bias exp_probs_b (no .bias)
        FamilySpec("hy_v3", rope_whole_head=True, qk_norm="head", moe=True, names=HY_V3_NAMES, gguf_arch="hy_v3",
                   gguf_names=_with(GGUF_NAMES, router_select_bias="blk.{i}.exp_probs_b"),
                   fixed={**_V3_ROUTER["fixed"], "n_group": 1, "norm_topk_prob": True},
                   moe_fields=_V3_ROUTER["moe_fields"],
                   keys={"routed_scaling_factor": ("router_scaling_factor",),
                         "moe_intermediate_size": ("moe_intermediate_size", "expert_hidden_dim")},
                   moe_defaults={"num_experts": 192, "num_experts_per_tok": 8, "moe_intermediate_size": 1536,
                                 "n_shared_experts": 1, "routed_scaling_factor": 2.826},
                   config_defaults={"first_k_dense_replace": 1},
                   refusals=(Refusal(unset("route_norm"), "unrenormalised routing weights (route_norm: false) "
                                                          "are not supported"),
                             Refusal(unset("moe_router_use_sigmoid"), "a softmax router (moe_router_use_sigmoid: "
                                                                      "false) is not supported"),
                             Refusal(unset("moe_router_enable_expert_bias"),
                                     "a router without its selection bias (moe_router_enable_expert_bias: false) "
                                     "is not supported"),
                             Refusal(unset("qk_norm"), "attention without its query/key norms (qk_norm: false) "
                                                       "is not supported"),
                             Refusal(lambda c: c.get("mlp_layer_types") is None
                                     and c.get("first_k_dense_replace", 1) != 1,
                                     "a first_k_dense_replace other than 1 without mlp_layer_types is not "
                                     "supported (Transformers keeps only the first layer dense); state "
                                     "mlp_layer_types"))),
        FamilySpec("ernie4_5_moe", rope_interleaved=True, tie_default=True, moe=True, names=ERNIE_MOE_NAMES,
                   rope_whole_head=True,
                   gguf_arch="ernie4_5-moe",
                   keys={"num_experts": ("moe_num_experts",), "num_experts_per_tok": ("moe_k",),
                         "n_shared_experts": ("moe_num_shared_experts",), "renorm_min": ("moe_norm_min",),
                         "routed_scaling_factor": ()},
                   fixed={"scoring_func": "softmax", "topk_method": "noaux_tc", "n_group": 1, "norm_topk_prob": True},
                   moe_defaults={"num_experts": 64, "num_experts_per_tok": 6, "moe_intermediate_size": 1536,
                                 "n_shared_experts": 2, "renorm_min": 1e-12},
                   config_defaults={"moe_layer_start_index": 1, "moe_layer_end_index": -1, "moe_layer_interval": 1}),
        # Transformers' HunYuan MoE routes every layer, with experts and the shared MLP intermediate_size wide.
        FamilySpec("hunyuan_v1_moe", qk_norm="head", qk_norm_after_rope=True, moe=True, names=HUNYUAN_MOE_NAMES,
                   rope_whole_head=True,
                   gguf_arch="hunyuan-moe",
                   keys={"num_experts_per_tok": ("moe_topk",), "moe_intermediate_size": ("intermediate_size",),
                         "shared_intermediate_size": ("intermediate_size",), "routed_scaling_factor": ()},
                   fixed={"scoring_func": "softmax", "topk_method": "greedy", "norm_topk_prob": True},
                   moe_defaults={"num_experts": 1, "num_experts_per_tok": 1},
                   refusals=(Refusal(flag("use_cla"), "cross-layer attention (use_cla) is not supported"),
                             Refusal(flag("use_mla"), "latent attention (use_mla) is not supported"),
                             Refusal(unset("use_qk_norm"), "attention without its query/key norms (use_qk_norm: "
                                                           "false) is not supported"),
                             Refusal(unset("use_mixed_mlp_moe"), "routed layers without the shared MLP "
                                                                 "(use_mixed_mlp_moe: false) are not supported"),
                             Refusal(lambda c: any(_values(c, "moe_layer_num_skipped")),
                                     "dense leading layers (moe_layer_num_skipped above 0) are not supported"),
                             Refusal(lambda c: any(v != 1 for v in _values(c, "num_shared_expert")),
                                     "a num_shared_expert other than 1 is not supported"),
                             Refusal(lambda c: any(v != c.get("intermediate_size")
                                                   for v in _values(c, "moe_intermediate_size")),
                                     "experts of a moe_intermediate_size other than intermediate_size are not "
                                     "supported (Transformers builds them intermediate_size wide)"))),
        # group H4
        FamilySpec("flex_olmo", rope_whole_head=True, **dict(_OLMO2, names=FLEX_OLMO_NAMES), moe=True,
                   moe_defaults={"num_experts": 7, "num_experts_per_tok": 5},
                   keys={"moe_intermediate_size": ("intermediate_size",)}),
        # llama.cpp's mellum places sliding layers by the file's pattern, else three of every four.
        FamilySpec("mellum", qk_norm="head", moe=True, names=QWEN_MOE_DENSE_NAMES, unread=("mtp.",),
                   gguf_arch="mellum", gguf_changes={"sliding": "pattern", "sliding_pattern": 4},
                   moe_defaults={"num_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 896,
                                 "norm_topk_prob": True}),
        # llama.cpp's mimo2 reads a layer's sinks when the file holds them, whatever kind the layer is.
        FamilySpec("mimo_v2_flash", moe=True, names=MIMO_V2_NAMES, sinks="sliding", unread=("model.mtp.",),
                   gguf_arch="mimo2", gguf_names=_with(GGUF_NAMES, sinks="blk.{i}.attn_sinks.weight"),
                   gguf_config={"attention.value_scale": "attention_value_scale"}, gguf_changes={"sinks": True},
                   value_scale_key="attention_value_scale", normalize=_mimo_v2_config,
                   keys={"v_head_dim": ("v_head_dim",)},
                   fixed={"scoring_func": "sigmoid", "topk_method": "noaux_tc"},
                   moe_defaults={"num_experts": 256, "num_experts_per_tok": 8, "norm_topk_prob": True},
                   moe_fields={"renorm_eps": 1e-20},
                   variants=(Variant(unset("add_swa_attention_sink_bias"), {"sinks": False}),
                             Variant(flag("add_full_attention_sink_bias"), {"sinks": "full"}),
                             Variant(lambda c: flag("add_swa_attention_sink_bias", True)(c)
                                     and flag("add_full_attention_sink_bias")(c), {"sinks": True}),
                             Variant(lambda c: c.get("attention_projection_layout") == "fused_qkv",
                                     {"names": _with(MIMO_V2_NAMES, q=None, k=None, v=None,
                                                     qkv=_L + "self_attn.qkv_proj"), "fused_qkv": "concat"})),
                   refusals=(Refusal(_differs("swa_num_attention_heads", "num_attention_heads"),
                                     "sliding-window layers with their own query head count (swa_num_attention_heads) "
                                     "are not supported"),
                             Refusal(_differs("swa_head_dim", "head_dim"),
                                     "sliding-window layers with their own head width (swa_head_dim) are not "
                                     "supported"),
                             Refusal(_differs("swa_v_head_dim", "v_head_dim"),
                                     "sliding-window layers with their own value head width (swa_v_head_dim) are "
                                     "not supported"))),
        # llama.cpp's laguna: no sinks, no router soft-cap; without a pattern in the file the first of every
        # four layers attends fully (load_swa_pattern(4, dense_first)); the gate's width says its kind.
        FamilySpec("laguna", qk_norm="head", moe=True, names=LAGUNA_NAMES, attn_gate="softplus",
                   normalize=_laguna_config, gguf_arch="laguna", gguf_names=_with(GGUF_NAMES, g="blk.{i}.attn_gate"),
                   gguf_changes={"sliding": "pattern_first", "sliding_pattern": 4},
                   keys={"routed_scaling_factor": ("moe_routed_scaling_factor",),
                         "router_logit_softcap": ("moe_router_logit_softcapping",)},
                   fixed={"scoring_func": "sigmoid", "norm_topk_prob": True},
                   moe_defaults={"num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
                                 "shared_intermediate_size": 512},
                   moe_fields={"select_bias": True},
                   variants=(Variant(lambda c: c.get("gating", True) not in (True, "per-head"),
                                     {"attn_gate_per_head": False}),
                             Variant(flag("swa_attention_sink_enabled"), {"sinks": "sliding"})),
                   refusals=(Refusal(flag("moe_apply_router_weight_on_input"),
                                     "moe_apply_router_weight_on_input (router weights on the experts' input), "
                                     "which Transformers does not implement either, is not supported"),)),
        # llama.cpp's step35 reads the q/k norms and the head-wise gate when the file holds them.
        FamilySpec("step3p5", norm_unit_offset=True, qk_norm="head", attn_gate="sigmoid", moe=True,
                   gguf_arch="step35", gguf_names=_with(GGUF_NAMES, g="blk.{i}.attn_gate"),
                   gguf_changes={"qk_norm_optional": True},
                   names=STEP3P5_NAMES, attn_scale_key="query_pre_attn_scalar", no_rope_key="use_rope_layers",
                   normalize=_step3p5_config, expert_limit_keys=("swiglu_limits", "swiglu_limits_shared"),
                   keys={"num_key_value_heads": ("num_key_value_heads", "num_attention_groups"), "act": (),
                         "num_experts": ("n_routed_experts", "moe_num_experts", "num_local_experts"),
                         "num_experts_per_tok": ("num_experts_per_tok", "moe_top_k"),
                         "shared_intermediate_size": ("share_expert_dim",),
                         "routed_scaling_factor": ("moe_router_scaling_factor",),
                         "scoring_func": ("moe_router_activation",), "norm_topk_prob": ("norm_expert_weight",)},
                   moe_defaults={"num_experts": 288, "num_experts_per_tok": 8, "moe_intermediate_size": 1280,
                                 "shared_intermediate_size": 1280, "norm_topk_prob": True, "scoring_func": "sigmoid"},
                   moe_fields={"select_bias": True, "clamp_act": True},
                   variants=(Variant(unset("use_head_wise_attn_gate"), {"attn_gate": None}),),
                   refusals=(Refusal(_step3p5_kind_disagrees, "a layer kind whose layers list different rotary "
                                     "bases or shares (rope_theta, partial_rotary_factors) is not supported"),
                             Refusal(lambda c: isinstance(c.get("yarn_only_types"), list)
                                     and "sliding_attention" in c["yarn_only_types"],
                                     "rotation scaling on sliding-window layers (yarn_only_types) is not supported"),
                             Refusal(_step3p5_clamped_dense, "a SwiGLU clamp on a dense layer "
                                     "(swiglu_limits_shared) is not supported"),
                             Refusal(flag("use_bidirectional_attention"),
                                     "bidirectional attention (use_bidirectional_attention) is not supported"))),
        FamilySpec("minimax_m2", qk_norm="proj", moe=True, names=MINIMAX_M2_NAMES, gguf_arch="minimax-m2",
                   gguf_config={"expert_gating_func": "expert_gating_func"},
                   gguf_refusals=(Refusal(lambda c: c.get("expert_gating_func") is None,
                                          "a router without expert_gating_func (llama.cpp's minimax-m2 graph has no "
                                          "default and stops) is not supported"),),
                   keys={"moe_intermediate_size": ("intermediate_size",), "rotary_dim": ("rotary_dim",)},
                   fixed={"scoring_func": "sigmoid", "norm_topk_prob": True},
                   moe_defaults={"num_experts": 256, "num_experts_per_tok": 8},
                   moe_fields={"select_bias": True},
                   variants=(Variant(unset("use_qk_norm"), {"qk_norm": None}),
                             Variant(lambda c: c.get("qk_norm_type") == "per_head", {"qk_norm": "head"}),
                             Variant(unset("use_routing_bias"), {"moe_fields": {}})),
                   refusals=(Refusal(lambda c: isinstance(c.get("attn_type_list"), list) and 0 in c["attn_type_list"],
                                     "lightning-attention layers (attn_type_list entries 0) are not supported"),
                             Refusal(lambda c: bool(c.get("shared_intermediate_size")),
                                     "shared experts (shared_intermediate_size above zero) are not supported"),
                             Refusal(lambda c: c.get("qk_norm_type") not in (None, "per_layer", "per_head"),
                                     "a qk_norm_type other than per_layer or per_head is not supported"),
                             Refusal(lambda c: c.get("scoring_func") not in (None, "sigmoid"),
                                     "a scoring_func other than sigmoid is not supported"))),
        # ---- group MLA: multi-head latent attention (DeepSeek-V2 line), DeepSeek's routers
        # Transformers' DeepSeek-V2 router: softmax scores, greedy or group_limited_greedy (groups ranked by
        # their best expert), never renormalised, always times routed_scaling_factor (whatever norm_topk_prob
        # says: seed 002 renormalises under it instead of scaling; Transformers is the oracle here).
        FamilySpec("deepseek_v2", gguf_arch="deepseek2", moe=True, names=DEEPSEEK_NAMES, keys=_LATENT_KEYS,
                   fixed={"scoring_func": "softmax", "norm_topk_prob": False}, **_LATENT,
                   config_defaults={"kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
                                    "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 64,
                                    "n_shared_experts": 2, "moe_intermediate_size": 1407, "first_k_dense_replace": 0,
                                    "routed_scaling_factor": 1.0, "topk_method": "greedy"},
                   refusals=(Refusal(_stated_other("topk_method", "greedy", "group_limited_greedy"),
                                     "a DeepSeek-V2 topk_method other than greedy or group_limited_greedy is not "
                                     "supported (Transformers' DeepSeek-V2 router has no other)"),
                             Refusal(_stated_other("scoring_func", "softmax"),
                                     "a DeepSeek-V2 scoring_func other than softmax is not supported "
                                     "(Transformers' DeepSeek-V2 router scores by softmax whatever it says)"),
                             _MOE_LAYER_FREQ)),
        # DeepSeek-V3 and Kimi-K2 (model_type kimi_k2 is read as deepseek_v3, as Transformers reads it).
        FamilySpec("deepseek_v3", gguf_arch="deepseek2", keys=_LATENT_KEYS, config_defaults=dict(_V3_LATENT_DEFAULTS),
                   **_V3_LATENT,
                   refusals=(Refusal(_stated_other("scoring_func", "sigmoid"),
                                     "a DeepSeek-V3 scoring_func other than sigmoid is not supported "
                                     "(Transformers' DeepSeek-V3 router scores by sigmoid whatever it says)"),
                             Refusal(_stated_other("topk_method", "noaux_tc"),
                                     "a DeepSeek-V3 topk_method other than noaux_tc is not supported "
                                     "(Transformers' DeepSeek-V3 router chooses by noaux_tc whatever it says)"),
                             _MOE_LAYER_FREQ)),
        FamilySpec("minicpm3", gguf_arch="minicpm3", names=MINICPM3_NAMES, keys=_LATENT_KEYS, tie_default=True,
                   normalize=_minicpm3_config, embed_multiplier_key="scale_emb",
                   residual_multiplier_key="residual_multiplier", logit_scale_key="logits_scaling",
                   logit_scale_divides=True, **dict(_LATENT, rope_interleaved=False),
                   config_defaults={"kv_lora_rank": 256, "q_lora_rank": 768, "qk_nope_head_dim": 64,
                                    "qk_rope_head_dim": 32, "scale_emb": 12, "scale_depth": 1.4,
                                    "dim_model_base": 256, "rms_norm_eps": 1e-5}),
        # GLM-4.7-Flash: the first layer dense unless mlp_layer_types says otherwise (Transformers' default).
        FamilySpec("glm4_moe_lite", gguf_arch="deepseek2", keys=_LATENT_KEYS, **_V3_LATENT,
                   config_defaults=dict(_V3_LATENT_DEFAULTS, q_lora_rank=768, qk_nope_head_dim=192, v_head_dim=256,
                                        n_routed_experts=64, num_experts_per_tok=4, moe_intermediate_size=1536,
                                        n_group=1, topk_group=1, routed_scaling_factor=1.8, first_k_dense_replace=1,
                                        rms_norm_eps=1e-5),
                   refusals=(Refusal(lambda c: c.get("mlp_layer_types") is None
                                     and c.get("first_k_dense_replace", 1) != 1,
                                     "a first_k_dense_replace other than 1 without mlp_layer_types is not "
                                     "supported (Transformers keeps only the first layer dense); state "
                                     "mlp_layer_types"),
                             Refusal(_stated_other("scoring_func", "sigmoid"),
                                     "a scoring_func other than sigmoid is not supported (Transformers' "
                                     "GLM-4.7-Flash router scores by sigmoid whatever it says)"))),
        # A.X-K1: DeepSeek-V3 with post_mlp_layernorm over each routed feed-forward's output; its releases
        # route without a selection bias (topk_method none), which Transformers reads as a zero bias, groups
        # still ranked by their best two (seed 002 ranks them by their best expert; Transformers is the oracle).
        FamilySpec("axk1", keys=_LATENT_KEYS, normalize=_axk1_config,
                   routed_norms=("attn_norm", "ffn_norm", "ffn_post_norm"),
                   dense_unread=(_L + "post_mlp_layernorm", _L + "mlp.post_mlp_layernorm"),
                   **dict(_V3_LATENT, names=AXK1_NAMES, moe_fields={**_V3_ROUTER["moe_fields"],
                                                                     "select_bias_optional": True}),
                   config_defaults=dict(_V3_LATENT_DEFAULTS, n_routed_experts=192),
                   refusals=(Refusal(lambda c: "q_lora_rank" in c and c["q_lora_rank"] is None,
                                     "A.X-K1 without a query bottleneck (q_lora_rank null) is not supported "
                                     "(Transformers' A.X-K1 attention always has one)"),
                             Refusal(_stated_other("scoring_func", "sigmoid"),
                                     "a scoring_func other than sigmoid is not supported (Transformers' "
                                     "A.X-K1 router scores by sigmoid whatever it says)"))),
        # Sarvam-105B: Transformers runs it as DeepSeek-V3 (SarvamMLAConfig reads num_experts and
        # num_shared_experts, and a deepseek_yarn rope block as YaRN).
        FamilySpec("sarvam_mla", normalize=_deepseek_yarn, **_V3_LATENT,
                   keys=dict(_LATENT_KEYS, num_experts=("num_experts", "n_routed_experts"),
                             n_shared_experts=("num_shared_experts", "n_shared_experts")),
                   config_defaults={k: v for k, v in dict(_V3_LATENT_DEFAULTS, q_lora_rank=None, n_group=1,
                                                          topk_group=1, first_k_dense_replace=1).items()
                                    if k not in ("n_routed_experts", "n_shared_experts")},
                   moe_defaults={"num_experts": 128, "n_shared_experts": 1},
                   refusals=(Refusal(_stated_other("score_function", "sigmoid"),
                                     "a router score_function other than sigmoid is not supported (Transformers "
                                     "scores Sarvam-105B's experts by sigmoid)"),
                             Refusal(unset("moe_router_enable_expert_bias"),
                                     "a router without its selection bias (moe_router_enable_expert_bias: false) "
                                     "is not supported"),
                             Refusal(lambda c: c.get("moe_shared_expert_intermediate_size") is not None
                                     and c["moe_shared_expert_intermediate_size"]
                                     != (c.get("moe_intermediate_size") or 2048)
                                     * (c.get("num_shared_experts", c.get("n_shared_experts")) or 1),
                                     "shared experts of a moe_shared_expert_intermediate_size other than "
                                     "moe_intermediate_size times their count are not supported (Transformers "
                                     "builds them that wide)"),
                             _MOE_LAYER_FREQ)),
        # group SSM (issue 15, part A): state-space scans and their hybrids
        FamilySpec("mamba", **_MAMBA),
        FamilySpec("falcon_mamba", **dict(_MAMBA, keys=dict(_MAMBA_KEYS, ssm_bcdt_eps=("mixer_rms_eps",)),
                                          defaults=dict(_MAMBA_DEFAULTS, ssm_bcdt_eps=1e-6)),
                   ssm_bcdt_norm="plain"),
        FamilySpec("mamba2", **dict(_MAMBA, recurrent="mamba2", names=MAMBA2_NAMES, gguf_arch="mamba2", tie_default=False,
                                    keys={"ssm_state_size": ("state_size",), "ssm_conv_kernel": ("conv_kernel",),
                                          "ssm_expand": ("expand",), "ssm_num_heads": ("num_heads",),
                                          "ssm_head_dim": ("head_dim",), "ssm_groups": ("n_groups",),
                                          "ssm_act": ("hidden_act",), "head_dim": (), "intermediate_size": (),
                                          "norm_eps": ("layer_norm_epsilon",)},
                                    defaults={"ssm_state_size": 128, "ssm_conv_kernel": 4, "ssm_expand": 2,
                                              "ssm_num_heads": 128, "ssm_head_dim": 64, "ssm_groups": 8,
                                              "norm_eps": 1e-5, "max_position_embeddings": 1 << 20}),
                   ffn_mult_key="expand", ffn_mult=2,
                   refusals=(Refusal(_mamba2_width_mismatch(None, "expand", "num_heads", "head_dim"),
                                     "a Mamba-2 width (expand * hidden_size) other than its heads' total "
                                     "(num_heads * head_dim) is not supported"),)),
        FamilySpec("jamba", recurrent="mamba", ssm_bcdt_norm="weighted", positions="none", moe=True, names=JAMBA_NAMES,
                   normalize=_jamba_config, **_SSM_ADAPTERS,
                   keys={"ssm_state_size": ("mamba_d_state",), "ssm_conv_kernel": ("mamba_d_conv",),
                         "ssm_expand": ("mamba_expand",), "ssm_dt_rank": ("mamba_dt_rank",), "ssm_act": ("hidden_act",),
                         "ssm_bcdt_eps": ("rms_norm_eps",), "num_experts": ("num_experts", "num_local_experts"),
                         "moe_intermediate_size": ("intermediate_size",), "shared_intermediate_size": (),
                         "n_shared_experts": ()},
                   defaults={"ssm_state_size": 16, "ssm_conv_kernel": 4, "ssm_expand": 2, "ssm_dt_rank": "auto",
                             "ssm_bcdt_eps": 1e-6, "norm_eps": 1e-6},
                   fixed={"norm_topk_prob": False, "scoring_func": "softmax", "topk_method": "greedy"},
                   moe_defaults={"num_experts": 16, "num_experts_per_tok": 2},
                   variants=(Variant(lambda c: c.get("mlp_layer_types") is not None and "sparse" not in c["mlp_layer_types"],
                                     {"moe": False}),),
                   refusals=(Refusal(_offset_past_period("attn"), "an attn_layer_offset that is not below "
                                     "attn_layer_period (Transformers refuses it too) is not supported"),
                             Refusal(_offset_past_period("expert"), "an expert_layer_offset that is not below "
                                     "expert_layer_period (Transformers refuses it too) is not supported")),
                   gguf_arch="jamba", gguf_names=GGUF_JAMBA_NAMES),
        FamilySpec("bamba", recurrent="mamba2", names=BAMBA_NAMES, norms=("attn_norm", "ffn_norm"), normalize=_bamba_config,
                   keys=_MAMBA2_HYBRID_KEYS, defaults=dict(_MAMBA2_HYBRID_DEFAULTS, norm_eps=1e-5),
                   refusals=(_BAMBA_WIDTH,), **_SSM_ADAPTERS),
        FamilySpec("granitemoehybrid", rope_whole_head=True,
                   **dict(_GRANITEMOE_SHARED, keys=dict(_GRANITEMOE_SHARED["keys"], **_MAMBA2_HYBRID_KEYS)),
                   recurrent="mamba2", names=GRANITE_HYBRID_NAMES, normalize=_granite_hybrid_config, adapters="ffn",
                   defaults=dict(_MAMBA2_HYBRID_DEFAULTS, norm_eps=1e-6),
                   variants=(Variant(lambda c: c.get("num_local_experts", 8) == 0,
                                     {"moe": False, "names": GRANITE_HYBRID_DENSE_NAMES,
                                      "keys": dict(_GRANITEMOE_SHARED["keys"], **_MAMBA2_HYBRID_KEYS,
                                                   intermediate_size=("shared_intermediate_size",))}),
                             Variant(_granite_hybrid_unrotated, {"positions": "none"})),
                   refusals=(Refusal(lambda c: c.get("layer_types") is None,
                                     "a config without layer_types (which layers scan and which attend) is not "
                                     "supported"),
                             Refusal(_granite_hybrid_layer_types_unsupported,
                                     "a layer type other than mamba or attention in layer_types is not supported"),
                             Refusal(lambda c: c.get("shared_intermediate_size") is None,
                                     "a config without shared_intermediate_size (the shared_mlp's width) is not "
                                     "supported"),
                             Refusal(lambda c: c.get("position_embedding_type") not in (None, "rope", "nope"),
                                     "a position_embedding_type other than rope or nope is not supported"),
                             _BAMBA_WIDTH),
                   gguf_arch="granitehybrid", gguf_qk_permuted=True, gguf_names=GGUF_SSM_NAMES,
                   gguf_config=dict(_GRANITE_GGUF, **{"rope.scaling.finetuned": "rope_scaling_finetuned"})),
        FamilySpec("nemotron_h", recurrent="mamba2", ffn_layers="typed", positions="none", moe=True,
                   names=NEMOTRON_H_NAMES, normalize=_nemotron_h_config, default_act="relu2", **_SSM_ADAPTERS,
                   head_untied=True,
                   keys={"ssm_state_size": ("ssm_state_size", "mamba_d_state"),
                         "ssm_conv_kernel": ("conv_kernel", "mamba_d_conv"), "ssm_num_heads": ("mamba_num_heads",),
                         "ssm_head_dim": ("mamba_head_dim",), "ssm_groups": ("n_groups", "mamba_n_groups"),
                         "ssm_act": ("mamba_hidden_act",), "act": ("mlp_hidden_act",),
                         "head_dim": ("head_dim", "attention_head_dim"),
                         "norm_eps": ("layer_norm_epsilon", "rms_norm_eps"),
                         "shared_intermediate_size": ("moe_shared_expert_intermediate_size",),
                         "n_shared_experts": (), "moe_latent_size": ("moe_latent_size",)},
                   defaults={"ssm_state_size": 128, "ssm_conv_kernel": 4, "ssm_num_heads": 128, "ssm_head_dim": 64,
                             "ssm_groups": 8, "norm_eps": 1e-5},
                   fixed={"scoring_func": "sigmoid", "topk_method": "noaux_tc"}, moe_fields={"renorm_eps": 1e-20},
                   moe_defaults={"num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True},
                   variants=(Variant(lambda c: "moe" not in (c.get("layer_types") or []), {"moe": False}),),
                   refusals=(Refusal(_nemotron_h_pattern_wrong,
                                     "a hybrid_override_pattern (or layers_block_type) whose length is not "
                                     "num_hidden_layers, or with a letter other than M, *, - and E, is not supported"),),
                   gguf_arch="nemotron_h", gguf_names=GGUF_NEMOTRON_H_NAMES),
        FamilySpec("falcon_h1", recurrent="mamba2", mup=True, gguf_folded=True, names=FALCON_H1_NAMES,
                   rope_whole_head=True,
                   norms=("attn_norm", "ffn_norm"), normalize=_falcon_h1_config, ssm_gated_norm=False, **_SSM_ADAPTERS,
                   embed_multiplier_key="embedding_multiplier", logit_scale_key="lm_head_multiplier",
                   keys=dict(_MAMBA2_HYBRID_KEYS, ssm_inner_size=("mamba_d_ssm",)),
                   defaults=dict(_MAMBA2_HYBRID_DEFAULTS, norm_eps=1e-5),
                   config_defaults={"mamba_d_ssm": 1024, "mamba_rms_norm": False, "mamba_norm_before_gate": True},
                   variants=(Variant(flag("mamba_rms_norm"), {"ssm_gated_norm": True}),),
                   refusals=(Refusal(lambda c: bool(c.get("attn_layer_indices")),
                                     "attention on only some layers (attn_layer_indices) is not supported"),
                             Refusal(unset("mamba_use_mlp"), "layers without their feed-forward (mamba_use_mlp: "
                                     "false) are not supported"),
                             Refusal(lambda c: bool(c.get("mamba_rms_norm")) and bool(c.get("mamba_norm_before_gate")),
                                     "the scan's norm before its gate (mamba_norm_before_gate) is not supported"),
                             Refusal(lambda c: bool(c.get("projectors_bias", False)) != bool(c.get("mamba_proj_bias", False)),
                                     "a projectors_bias unlike mamba_proj_bias is not supported"),
                             Refusal(_mamba2_width_mismatch("mamba_d_ssm", "mamba_expand", "mamba_n_heads",
                                                            "mamba_d_head"),
                                     "a scan width (mamba_d_ssm) other than its heads' total (mamba_n_heads * "
                                     "mamba_d_head) is not supported"),
                             Refusal(_numbers("ssm_multipliers", 5), "ssm_multipliers that are not five numbers "
                                     "(gate, stream, B, C, step) are not supported"),
                             Refusal(_numbers("mlp_multipliers", 2), "mlp_multipliers that are not two numbers "
                                     "(gate, down) are not supported")),
                   gguf_arch="falcon-h1", gguf_names=GGUF_FALCON_H1_NAMES,
                   gguf_changes={"embed_multiplier_key": None, "logit_scale_key": None, "mup": False}),
        # ---- group MLA-B (issue 14, part B): the latent-attention descendants
        # DeepSeek-V3.2: DeepSeek-V3 with DeepSeek Sparse Attention on every layer; its indexer rotates the
        # first qk_rope_head_dim components of each head by halves (Transformers' DeepseekV32Indexer).
        FamilySpec("deepseek_v32", gguf_arch="deepseek32", keys=_LATENT_KEYS,
                   config_defaults=dict(_V3_LATENT_DEFAULTS, index_topk=2048, index_head_dim=128, index_n_heads=64),
                   indexer={"interleaved": False},
                   **dict(_V3_LATENT, names=DEEPSEEK_DSA_NAMES, gguf_names=GGUF_DSA_NAMES, variants=()),
                   refusals=_V3_REFUSALS + (_ROPE_PAIRS, _indexer_pairs(False), _MOE_LAYER_FREQ)),
        # GLM-5: the same with an indexer rotating adjacent pairs and shared layers (indexer_types) that reuse
        # the last indexed layer's choice (Transformers' GlmMoeDsaAttention).
        FamilySpec("glm_moe_dsa", gguf_arch="glm-dsa", keys=_LATENT_KEYS, normalize=_glm_dsa_config,
                   config_defaults=dict(_V3_LATENT_DEFAULTS, q_lora_rank=2048, qk_nope_head_dim=192, v_head_dim=256,
                                        n_group=1, topk_group=1, rms_norm_eps=1e-5, index_topk=2048,
                                        index_head_dim=128, index_n_heads=32),
                   indexer={"interleaved": True},
                   **dict(_V3_LATENT, names=DEEPSEEK_DSA_NAMES, gguf_names=GGUF_DSA_NAMES, variants=()),
                   refusals=_V3_REFUSALS + (_ROPE_PAIRS, _indexer_pairs(True), _MOE_LAYER_FREQ)),
        # Dots3-Note (vLLM's reading, Transformers' Dots3NoteTextConfig): DeepSeek-V3.2's block, its sliding
        # layers with a latent attention of their own (per_layer_config), every latent scaled and gated.
        FamilySpec("dots3_note", keys=_LATENT_KEYS, normalize=_dots3_config,
                   config_defaults=dict(_V3_LATENT_DEFAULTS, vocab_size=152064, hidden_size=5120,
                                        intermediate_size=13824, moe_intermediate_size=1536, num_hidden_layers=46,
                                        num_attention_heads=128, q_lora_rank=1024, n_group=1, topk_group=1,
                                        routed_scaling_factor=1.0, rms_norm_eps=1e-5, max_position_embeddings=524288,
                                        first_k_dense_replace=1,
                                        index_topk=2048, index_head_dim=128, index_n_heads=64),
                   indexer={"interleaved": True}, latent_rescale=True, latent_k_rope_norm=True,
                   latent_model_eps=True, attn_gate="sigmoid", attn_gate_per_head=True, adapters="ffn",
                   unread=("vision_encoder.", "audio_encoder.", "audio_adapter.", "model.mtp."),
                   **dict(_V3_LATENT, names=DOTS3_NAMES, gguf_names=GGUF_DOTS3_NAMES, variants=()),
                   refusals=_V3_REFUSALS + (_indexer_pairs(True),) + _DOTS3_REFUSALS,
                   # group DOTS: llama.cpp's dots3note. Its converter folds the bottlenecks' sqrt(hidden / rank)
                   # into their norms' weights (apply_mla_qkv_lora_rescale), so the file's norms apply as they are.
                   gguf_arch="dots3note", gguf_changes={"latent_rescale": False}),
        # LongCat-Flash: each stored layer runs as two latent-attention layers with dense feed-forwards;
        # softmax-routed experts (identity ones among them) read the first's feed-forward input and join
        # the stream after the second.
        FamilySpec("longcat_flash", normalize=_longcat_config, latent_rescale=True, shortcut_pairs=True,
                   keys=dict(_LATENT_KEYS, intermediate_size=("ffn_hidden_size",),
                             moe_intermediate_size=("expert_ffn_hidden_size",), num_experts_per_tok=("moe_topk",),
                             num_experts=("n_routed_experts",), identity_experts=("zero_expert_num",)),
                   config_defaults={"vocab_size": 131072, "hidden_size": 6144, "num_layers": 28,
                                    "num_attention_heads": 64, "ffn_hidden_size": 12288, "q_lora_rank": 1536,
                                    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                                    "v_head_dim": 128, "moe_topk": 12, "n_routed_experts": 512,
                                    "zero_expert_num": 256, "expert_ffn_hidden_size": 2048,
                                    "routed_scaling_factor": 6.0, "rms_norm_eps": 1e-5,
                                    "max_position_embeddings": 131072},
                   adapters="none", unread=("model.mtp.",),
                   **dict(_LATENT, moe=True, names=LONGCAT_NAMES,
                          fixed={"scoring_func": "softmax", "topk_method": "noaux_tc", "n_group": 1, "topk_group": 1,
                                 "norm_topk_prob": False}),
                   refusals=_LONGCAT_REFUSALS),
        # group SSM-B1 (issue 15, part B1): short convolutions, lightning attention, shared blocks
        FamilySpec("lfm2", **_LFM2, gguf_arch="lfm2", refusals=(_LFM2_LAYER_TYPES,)),
        FamilySpec("lfm2_moe", rope_whole_head=True,
                   **dict(_LFM2, keys=dict(_LFM2["keys"], num_experts=("num_experts",)),
                                      names=LFM2_MOE_NAMES, normalize=_lfm2_moe_config), moe=True, gguf_arch="lfm2moe",
                   fixed={"scoring_func": "sigmoid", "topk_method": "noaux_tc"}, moe_fields={"renorm_eps": 1e-6},
                   moe_defaults={"num_experts": 32, "num_experts_per_tok": 4, "norm_topk_prob": True},
                   variants=(Variant(unset("use_expert_bias"), {"fixed": {"scoring_func": "sigmoid",
                                                                          "topk_method": "greedy"}}),),
                   refusals=(_LFM2_LAYER_TYPES,)),
        FamilySpec("minimax", **_MINIMAX, normalize=_minimax_config, residual_normed=True),
        FamilySpec("minimax_text_01", **dict(_MINIMAX, normalize=_minimax_hub_config,
                                             keys=dict(_MINIMAX["keys"], rotary_dim=("rotary_dim",))),
                   residual_normed="postnorm",
                   gguf_arch="minimax-01", gguf_names=GGUF_MINIMAX_NAMES),
        FamilySpec("zamba2", recurrent="mamba2", hybrid_mixer="shared_hybrid", shared_block=True, ffn_layers="none",
                   norms=("attn_norm",), positions="none", names=ZAMBA2_NAMES, normalize=_zamba2_config,
                   adapters="none", tie_default=True, default_act="gelu", ffn_mult=4, reference_hidden="embedding",
                   attn_scale_key="_attention_score_width",
                   keys={"ssm_state_size": ("mamba_d_state",), "ssm_conv_kernel": ("mamba_d_conv",),
                         "ssm_expand": ("mamba_expand",), "ssm_num_heads": ("n_mamba_heads",), "ssm_head_dim": (),
                         "ssm_groups": ("mamba_ngroups",), "head_dim": ("attention_head_dim",),
                         "shared_blocks": ("num_mem_blocks",), "adapter_rank": ("adapter_rank",),
                         "shared_attention_adapters": ("use_shared_attention_adapter",)},
                   defaults={"ssm_state_size": 64, "ssm_conv_kernel": 4, "ssm_expand": 2, "ssm_num_heads": 8,
                             "ssm_head_dim": "auto", "ssm_groups": 1, "ssm_norm_eps": 1e-5, "norm_eps": 1e-5},
                   variants=(Variant(flag("use_mem_rope"), {"positions": "rope"}),),
                   refusals=_ZAMBA2_REFUSALS + (Refusal(_mamba2_width_mismatch(None, "mamba_expand", "n_mamba_heads",
                                                                               "mamba_headdim"),
                                                        "a Mamba-2 width (mamba_expand * hidden_size) other than its "
                                                        "heads' total (n_mamba_heads * mamba_headdim) is not supported"),)),
        # ---- g4: Gemma 4
        FamilySpec("gemma4_text", **_GEMMA4, gguf_arch="gemma4", gguf_names=GGUF_GEMMA4_NAMES,
                   # Gemma 4's routed block: llama.cpp's own router (gemma4.cpp), not ster's
                   gguf_config={"expert_count": "num_experts"},
                   gguf_refusals=(Refusal(stated("num_experts"),
                                          "Gemma 4's mixture-of-experts block (expert_count) is not supported yet"),),
                   keys={"per_layer_input": ("hidden_size_per_layer_input",),
                         "per_layer_vocab": ("vocab_size_per_layer_input",), **_GEMMA4_ACT},
                   config_defaults={**_GEMMA4_DEFAULTS, "hidden_size_per_layer_input": 256,
                                    "vocab_size_per_layer_input": 262144}),
        FamilySpec("gemma4_unified_text", **_GEMMA4, keys=_GEMMA4_ACT,
                   config_defaults={**_GEMMA4_DEFAULTS, "sliding_window": 1024, "max_position_embeddings": 262144}),
        # ---- group G16A (issue 16): families without a Transformers implementation, on the decoder's
        # existing parts. Each is tested against a Transformers model of the same math (tests/test_parity_remote.py).
        # MiniCPM: Llama's block with muP scales (MiniCPMConfig's defaults: scale_emb, scale_depth and
        # dim_model_base 1, tied head); llama.cpp's converter writes the three as embedding_scale,
        # residual_scale (scale_depth / sqrt(layers)) and logit_scale (hidden_size / dim_model_base).
        FamilySpec("minicpm", tie_default=True, normalize=_minicpm3_config, embed_multiplier_key="scale_emb",
                   residual_multiplier_key="residual_multiplier", logit_scale_key="logits_scaling",
                   logit_scale_divides=True, unconfirmed=True,
                   config_defaults={"scale_emb": 1, "scale_depth": 1, "dim_model_base": 1},
                   refusals=(Refusal(lambda c: bool(c.get("num_experts")),
                                     "MiniCPM's mixture of experts (num_experts) is not supported"),
                             Refusal(stated("sparse_config"),
                                     "MiniCPM 4's sparse attention (sparse_config) is not supported"),
                             Refusal(lambda c: c.get("use_mup") is False,
                                     "MiniCPM without its muP scales (use_mup: false) is not supported")),
                   gguf_arch="minicpm", gguf_qk_permuted=True,
                   gguf_config={"embedding_scale": "scale_emb", "residual_scale": "residual_multiplier",
                                "logit_scale": "logits_scaling"}),
        # Orion: Llama's block with LayerNorms that carry a bias (their epsilon under rms_norm_eps).
        FamilySpec("orion", norm="layer", unconfirmed=True, gguf_arch="orion"),
        # InternLM2: Llama's block under InternLM2's names (biases, under its config's bias, read as stored).
        FamilySpec("internlm2", names=INTERNLM2_NAMES, fused_qkv="grouped", unconfirmed=True,
                   gguf_arch="internlm2", gguf_qk_permuted=True),
        # MiMo: Qwen2 beside next-token-prediction layers (model.mtp_layers) a forward never reads.
        FamilySpec("mimo", sliding="qwen2", unread=("model.mtp_layers.",), unconfirmed=True),
        # DeepSeek-MoE: Llama's attention (halves) and DeepSeek's first router: softmax scores, the top
        # num_experts_per_tok renormalised only under norm_topk_prob (with DeepSeek's 1e-20), never scaled,
        # beside n_shared_experts shared experts (moe_intermediate_size each, one SwiGLU of their total width).
        # llama.cpp's deepseek graph never renormalises and routes every layer after the leading dense ones.
        FamilySpec("deepseek", moe=True, names=DEEPSEEK_MOE_NAMES, normalize=_deepseek_moe_config, unconfirmed=True,
                   fixed={"scoring_func": "softmax", "topk_method": "greedy", "routed_scaling_factor": 1.0},
                   moe_fields={"renorm_eps": 1e-20}, config_defaults={"norm_topk_prob": False},
                   variants=(Variant(lambda c: c.get("n_routed_experts") is None, {"moe": False}),),
                   refusals=(Refusal(_stated_other("scoring_func", "softmax"),
                                     "a DeepSeek-MoE scoring_func other than softmax is not supported"),
                             Refusal(_stated_other("topk_method", "greedy"),
                                     "a DeepSeek-MoE topk_method other than greedy is not supported")),
                   gguf_arch="deepseek", gguf_qk_permuted=True),
        # Ling 1.x and 2.0 (bailing_moe): Sarvam-30B's block under Bailing's names (the same ones). Ling 2.0
        # (score_function sigmoid) routes as Sarvam does, always renormalised; Ling 1.x (no score_function)
        # scores by softmax, chooses the top k without groups or bias, renormalises under norm_topk_prob and
        # never scales.
        FamilySpec("bailing_moe", qk_norm="head", moe=True, fused_qkv="concat", names=SARVAM_MOE_NAMES,
                   unconfirmed=True, fixed=dict(_V3_ROUTER["fixed"], norm_topk_prob=True),
                   moe_fields=_V3_ROUTER["moe_fields"],
                   moe_defaults={"n_shared_experts": 0, "norm_topk_prob": True, "routed_scaling_factor": 1.0},
                   config_defaults={"first_k_dense_replace": 0},
                   variants=(Variant(unset("use_qk_norm", False), {"qk_norm": None}),
                             Variant(lambda c: c.get("score_function") is None,
                                     {"fixed": {"scoring_func": "softmax", "topk_method": "greedy",
                                                "routed_scaling_factor": 1.0},
                                      "moe_fields": {"renorm_eps": 1e-20},
                                      "names": _with(SARVAM_MOE_NAMES, router_select_bias=None)})),
                   refusals=(Refusal(stated("score_function", unless="sigmoid"),
                                     "a router score_function other than sigmoid (Ling 2.0) or none (Ling 1.x) is "
                                     "not supported"),
                             Refusal(lambda c: c.get("score_function") == "sigmoid"
                                     and c.get("moe_router_enable_expert_bias") is False,
                                     "a Ling 2.0 router without its selection bias (moe_router_enable_expert_bias: "
                                     "false) is not supported"),
                             Refusal(flag("use_bias"), "a bias on attention.dense (use_bias) is not supported"),
                             Refusal(flag("norm_head"), "a normalised head (norm_head) is not supported"),
                             Refusal(flag("norm_softmax"), "norm_softmax is not supported")),
                   gguf_arch="bailingmoe", gguf_qk_permuted=True),  # llama.cpp's Ling 1.x (bailingmoe.cpp)
        # openPangu-Embedded: Llama's block with biases (read as stored), sandwich norms under sandwich_norm.
        FamilySpec("PanguEmbedded", unconfirmed=True, gguf_arch="pangu-embedded",
                   variants=(Variant(flag("sandwich_norm"), {"norms": _SANDWICH, "names": PANGU_SANDWICH_NAMES}),)),
        # Tele-FLM: Llama's block; under use_mup the embeddings times input_mult and the logits times
        # output_mult / mup_scale_factor (normalize writes the two scales config.py reads).
        FamilySpec("TeleFLM", unconfirmed=True, normalize=_teleflm_config, embed_multiplier_key="teleflm_embed_scale",
                   logit_scale_key="teleflm_logit_scale",
                   refusals=(Refusal(lambda c: bool(c.get("use_mup")) and not _teleflm_mup_stated(c),
                                     "use_mup without numbers for input_mult, output_mult and a non-zero "
                                     "mup_scale_factor is not supported"),)),
        # Solar Pro: Llama's block with block skip connections (normalize writes them as residual_skips).
        FamilySpec("solar", normalize=_solar_config, unconfirmed=True),
        # TeleChat3: Llama with attention and MLP biases (read as stored) and its own YaRN (normalize).
        FamilySpec("telechat3", normalize=_telechat3_config, unconfirmed=True),
        # ---- group SSM-B2: delta-rule linear attention (issue 15, part B2)
        # Qwen3-Next: Qwen3-MoE's block, every norm an offset from one, gated attention (q_proj's gate rows),
        # gated delta nets on the linear_attention layers, Qwen2-MoE's experts with a gated shared expert.
        FamilySpec("qwen3_next", **dict(_QWEN_DELTA, config_defaults={"partial_rotary_factor": 0.25,
                                                                      "norm_topk_prob": True}),
                   moe=True, shared_gated=True, names=QWEN3_NEXT_NAMES,
                   gguf_arch="qwen3next", gguf_names=GGUF_QWEN3NEXT_NAMES,
                   moe_defaults={"num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512},
                   variants=(Variant(lambda c: c.get("num_experts", 512) == 0, {"moe": False}),)),
        # Qwen3.5 (dense) and Qwen3.5-MoE: Qwen3-Next with in_proj_qkv / z / b / a (also below
        # model.language_model of the qwen3_5 / qwen3_5_moe wrappers: WRAPPERS).
        FamilySpec("qwen3_5_text", **_QWEN_DELTA, names=QWEN35_NAMES,
                   variants=_QWEN35_VARIANTS, gguf_arch="qwen35", gguf_names=GGUF_QWEN35_NAMES),
        FamilySpec("qwen3_5_moe_text", **dict(_QWEN_DELTA, refusals=_QWEN_DELTA_REFUSALS + (
            Refusal(lambda c: c.get("norm_topk_prob") is False,
                    "norm_topk_prob false is not supported (Transformers' Qwen3.5-MoE router always renormalises)"),)),
                   moe=True, shared_gated=True, names=QWEN35_MOE_NAMES,
                   fixed={"norm_topk_prob": True}, variants=_QWEN35_VARIANTS,
                   gguf_arch="qwen35moe", gguf_names=GGUF_QWEN35_NAMES,
                   moe_defaults={"num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
                                 "shared_intermediate_size": 512}),
        # OLMo Hybrid: OLMo 3's post-norm attention layers, pre-norm gated delta nets elsewhere.
        FamilySpec("olmo_hybrid", **dict(_OLMO2, names=OLMO_HYBRID_NAMES), recurrent="gated_delta",
                   recurrent_norms=("attn_norm", "ffn_norm"), normalize=_olmo_hybrid_config, adapters="none",
                   keys=dict(_QWEN_DELTA_KEYS, delta_beta_double=("linear_allow_neg_eigval",)),
                   fixed={"delta_norm_eps": 1e-5}, config_defaults={"linear_allow_neg_eigval": True,
                                                                    "linear_conv_kernel_dim": 4},
                   variants=(Variant(lambda c: bool(c.get("_unrotated")), {"positions": "none"}),)),
        # Kimi-Linear: Kimi Delta Attention on linear_attn_config.kda_layers, unrotated latent attention on the
        # rest, DeepSeek-V3's router (sigmoid, e_score_correction_bias, groups) beside shared experts.
        FamilySpec("kimi_linear", **dict(_V3_LATENT, names=KIMI_LINEAR_NAMES, variants=(),
                                         gguf_names=GGUF_KIMI_LINEAR_NAMES), keys=_KIMI_KEYS, gguf_arch="kimi-linear",
                   recurrent="kda", positions="none", normalize=_kimi_linear_config, adapters="none", head_untied=True,
                   config_defaults={"first_k_dense_replace": 1, "rms_norm_eps": 1e-5},
                   moe_defaults={"num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 1024},
                   refusals=_KIMI_REFUSALS),
        # ---- group R1 (issue 16, families without a Transformers implementation, second part)
        # TeleChat2 / TeleChat2.5: Llama's block under TeleChat's names and spellings (biases on
        # self_attention.dense and mlp.down_proj, read as stored).
        FamilySpec("telechat", names=TELECHAT_NAMES, unconfirmed=True,
                   keys={"num_attention_heads": ("n_head", "num_attention_heads"),
                         "num_hidden_layers": ("n_layer", "num_hidden_layers"),
                         "intermediate_size": ("ffn_hidden_size", "intermediate_size"),
                         "max_position_embeddings": ("seq_length", "max_position_embeddings")},
                   refusals=(Refusal(flag("apply_residual_connection_post_layernorm"),
                                     "adding the residual after the norm (apply_residual_connection_post_layernorm) "
                                     "is not supported"),
                             Refusal(flag("embed_layernorm"),
                                     "a norm over the embeddings (embed_layernorm) is not supported"))),
        # Nemotron-NAS (DeciLM: Llama-3.3-Nemotron Super and Ultra): Llama's block, each layer after its own
        # block_configs entry (key/value heads, feed-forward width, no_op halves); normalize writes them.
        # GGUF: llama.cpp's deci (per-layer head counts and feed-forward widths, 0 where a half is absent).
        FamilySpec("nemotron-nas", normalize=_deci_config, unconfirmed=True, adapters="none",
                   refusals=_DECI_REFUSALS, gguf_arch="deci", gguf_qk_permuted=True),
        # Step1 (Step-Audio's language model): Llama's block with num_attention_groups key/value heads, no
        # rotation, and ALiBi's slopes times -sqrt(distance) added to the scaled scores.
        FamilySpec("step1", positions="alibi", alibi_sqrt=True, unconfirmed=True,
                   keys={"num_key_value_heads": ("num_attention_groups", "num_key_value_heads"),
                         "max_position_embeddings": ("max_seq_len", "max_position_embeddings")}),
        # PLaMo 3: sandwich norms (pre-sublayer and final norms offsets from one, post-sublayer ones from 1/5
        # and 5 ** -1.5), per-head q/k norms before the rotation, every sliding_window_pattern-th layer full.
        FamilySpec("plamo3", names=PLAMO3_NAMES, normalize=_plamo3_config, unconfirmed=True, norms=_SANDWICH,
                   norm_unit_offset=True, norm_offsets={"attn_post_norm": 1 / 5, "ffn_post_norm": 5 ** -1.5},
                   qk_norm="head", fused_qkv="concat", sliding="pattern", sliding_pattern=8,
                   local_rope_key="rope_local_theta", tie_default=True,
                   variants=(Variant(flag("scale_embedding"), {"embed_scale_sqrt_hidden": True}),),
                   refusals=(Refusal(stated("linear_type", unless="normal"),
                                     "a linear_type other than normal is not supported"),),
                   # GGUF: llama.cpp's plamo3 (its graph never scales the embeddings; the file does not say)
                   gguf_arch="plamo3", gguf_names=GGUF_PLAMO3_NAMES),
        # K2-Horizon: Llama's block (biases read as stored), Qwen-MoE's choice of routed layers (mlp_only_layers,
        # decoder_sparse_step) under router_score_func scores, mlp.gate.bias choosing under moe_gate_bias,
        # renormalised under norm_topk_prob, scaled by router_scaling_factor, beside shared experts.
        FamilySpec("k2_horizon", moe=True, norm_groups_key="layernorm_num_groups",
                   value_experts_keys=("mova_num_experts", "mova_num_experts_per_tok"), names=K2_HORIZON_NAMES,
                   normalize=_k2_horizon_config, unconfirmed=True,
                   keys={"routed_scaling_factor": ("router_scaling_factor",)},
                   moe_fields={"renorm_eps": 1e-20}, moe_defaults={"norm_topk_prob": False},
                   variants=(Variant(lambda c: c.get("attention_gate_func") == "silu",
                                     {"attn_gate": "silu", "attn_gate_per_head": False}),
                             Variant(lambda c: c.get("attention_gate_func") == "softplus",
                                     {"attn_gate": "softplus2", "attn_gate_per_head": False})),
                   refusals=(Refusal(lambda c: c.get("attention_gate_func") not in (None, "silu", "softplus"),
                                     "an attention_gate_func other than silu or softplus is not supported"),
                             Refusal(lambda c: c.get("rope_head_dim") is not None and c.get("rope_head_dim") != (
                                         c.get("head_dim") or (c.get("hidden_size") or 0) // max(
                                             1, c.get("num_attention_heads") or 1)),
                                     "a rotation narrower than the head (rope_head_dim) is not supported"),
                             Refusal(flag("query_key_norm"), "query/key norms (query_key_norm) are not supported"),
)),
        # ---- group LOOP: looped decoders (issue 16): stored layers run more than once, each pass its own
        # executed layers (cache slots, steering and capture indices); adapters refused (one adapter would
        # correct every pass of its layer). No Transformers implementation: unconfirmed.
        # Nanbeige: Llama's block (per-head q_layernorm / k_layernorm under qk_layernorm) run num_loops
        # times, the final norm closing every pass unless skip_loop_final_norm.
        FamilySpec("nanbeige", unconfirmed=True, looped=True, loop_norm=True, loop_norm_skip_key="skip_loop_final_norm",
                   gguf_arch="nanbeige", gguf_qk_permuted=True,  # llama.cpp's nanbeige.cpp: its stored blocks
                   gguf_config={"num_loops": "num_loops", "skip_loop_final_norm": "skip_loop_final_norm"},
                   keys={"loops": ("num_loops",)}, defaults={"loops": 1}, adapters="none", qk_norm="head",
                   names=_with(LLAMA_NAMES, q_norm=_L + "self_attn.q_layernorm", k_norm=_L + "self_attn.k_layernorm"),
                   variants=(Variant(unset("qk_layernorm", False), {"qk_norm": None}),),
                   refusals=(Refusal(lambda c: c.get("emb_neighbor_num") is not None or bool(c.get("insert_ngram_layer_idx"))
                                     or bool(c.get("ngram_insert_all_layers")),
                                     "Nanbeige's n-gram embeddings (emb_neighbor_num, insert_ngram_layer_idx, "
                                     "ngram_insert_all_layers) are not supported"),
                             Refusal(lambda c: any(c.get(k) for k in ("enable_hyper_connection", "enable_mhc",
                                                                      "enable_h_res_identity")),
                                     "Nanbeige's hyper-connections (enable_hyper_connection, enable_mhc) are not "
                                     "supported"),
                             Refusal(lambda c: bool(c.get("enable_double_loop_split")) or bool(c.get("loop_middle_layers")),
                                     "Nanbeige's split loops (enable_double_loop_split, loop_middle_layers) are not "
                                     "supported"),
                             Refusal(flag("loop_share_kv"), "Nanbeige's shared loop caches (loop_share_kv) are not "
                                     "supported"),
                             Refusal(flag("enable_depth_attention"), "Nanbeige's depth attention "
                                     "(enable_depth_attention) is not supported"))),
        # IQuest-LoopCoder: Llama's block run loop_num times; on every later pass each layer's attention is
        # g * global (the first pass's keys and values) + (1 - g) * local (its own, within loop_window_size),
        # g from model.gate_projections.{i} on each rotated query head. (loop_num 2 and loop_window_size 64
        # when unstated: the defaults the family's serving code takes.)
        FamilySpec("iquestloopcoder", unconfirmed=True, looped=True, loop_gated=True, adapters="none",
                   keys={"loops": ("loop_num",), "loop_window": ("loop_window_size",)},
                   defaults={"loops": 2, "loop_window": 64},
                   names=_with(LLAMA_NAMES, loop_gate="model.gate_projections.{i}")),
        # HRM-Text: two stacks of Llama layers (model.L_module, model.H_module) run in cycles (config.looped_layers);
        # gqkv_proj holds the sigmoid output gate's rows then q, k, v; a fused gate_up_proj; every norm an RMS
        # norm without scale; the embedding times embedding_scale; a prompt attends both ways under prefix_lm.
        FamilySpec("hrm_text", looped=True, loop_stacks=("L_module", "H_module"), prefix_lm_key="prefix_lm",
                   norm_affine=False, fused_qkv="gate_concat", attn_gate="sigmoid", attn_gate_per_head=False,
                   embed_multiplier_key="embedding_scale", adapters="none", normalize=_hrm_text_config,
                   keys={"loops": ("H_cycles",), "inner_loops": ("L_cycles",), "num_key_value_heads": ()},
                   config_defaults={"head_dim": 128, "H_cycles": 2, "L_cycles": 3, "prefix_lm": True},
                   names=HRM_TEXT_NAMES, gguf_arch="hrm_text", gguf_names=GGUF_HRM_TEXT_NAMES,
                   gguf_config={"hrm.layers_per_stack": "num_layers_per_stack", "hrm.h_cycles": "H_cycles",
                                "hrm.l_cycles": "L_cycles", "embedding_scale": "embedding_scale"},
                   # llama.cpp's hrm-text.cpp runs every prompt causally (its prefix-LM is not implemented)
                   gguf_changes={"prefix_lm_key": None},
                   refusals=(Refusal(flag("attention_bias"), "attention biases (attention_bias) are not supported"),
                             Refusal(flag("mlp_bias"), "feed-forward biases (mlp_bias) are not supported"))),
        # ---- group R2 (issue 16; issue 15 for bailing_hybrid), tests/test_parity_remote_c.py
        # openPangu-Ultra-MoE: DeepSeek-V3's latent attention (adjacent pairs) under its own key names, a
        # sigmoid router without selection bias or groups (renormalised, norm_topk_prob true by default,
        # times routed_scaling_factor), sandwich norms under sandwich_norm.
        FamilySpec("pangu_ultra_moe", keys=_LATENT_KEYS, normalize=_pangu_ultra_config, unconfirmed=True,
                   **dict(_V3_LATENT, names=PANGU_ULTRA_NAMES,
                          fixed={"scoring_func": "sigmoid", "topk_method": "greedy"},
                          variants=(Variant(flag("sandwich_norm"), {"norms": _SANDWICH,
                                                                    "names": PANGU_ULTRA_SANDWICH_NAMES}),)),
                   config_defaults={"norm_topk_prob": True}),
        # Step3's text decoder (also from the text_config of a step3_vl checkpoint, its text weights at the
        # root: WRAPPERS): a query bottleneck (q_proj to share_q_dim, inter_norm, wq), num_attention_groups
        # key/value heads, softmax-routed experts on the moe_layers_enum layers (renormalised under
        # norm_expert_weight) beside a shared expert share_expert_dim wide.
        FamilySpec("step3_text", moe=True, names=STEP3_NAMES, normalize=_step3_config, unconfirmed=True,
                   query_bottleneck_key="share_q_dim",
                   unread=("vision_model.", "vit_downsampler", "vit_large_projector"),
                   keys={"num_key_value_heads": ("num_attention_groups",),
                         "max_position_embeddings": ("max_position_embedding", "max_seq_len",
                                                     "max_position_embeddings"),
                         "num_experts": ("moe_num_experts",), "num_experts_per_tok": ("moe_top_k",),
                         "shared_intermediate_size": ("share_expert_dim",), "norm_topk_prob": ("norm_expert_weight",),
                         "n_shared_experts": ()},
                   fixed={"scoring_func": "softmax", "topk_method": "greedy"},
                   config_defaults={"rms_norm_eps": 1e-5, "rope_theta": 500000.0, "norm_expert_weight": False,
                                    "num_attention_groups": 1, "head_dim": 256},
                   refusals=(Refusal(lambda c: c.get("share_q_dim") is None,
                                     "a config without share_q_dim (the query bottleneck's width) is not supported"),
                             Refusal(_step3_enum_wrong, "a moe_layers_enum entry that names no layer (whole numbers "
                                     "from 0 to num_hidden_layers - 1) is not supported"))),
        # Ling 3.0 (bailing_hybrid, Transformers' BailingHybrid): Kimi Delta Attention (full-rank f_proj and
        # g_proj, the safe gate) and head-gated latent attention by layer_group_size, Ling 2.0's router and
        # experts, Step 3.5's per-layer clamps. Ling 2.5: lightning attention (MiniMax's recurrence with Ling's
        # extras) on the linear layers, tests/test_parity_ling25.py.
        # Ling 2.5 (a config that is not Ling 3.0's): lightning attention on the linear layers
        # (decoder/lightning.py, its extras from _bailing_hybrid_config), latent layers without a gate
        FamilySpec("bailing_hybrid", **dict(_V3_LATENT, names=BAILING_HYBRID_NAMES,
                                            gguf_names=GGUF_BAILING_HYBRID_NAMES, variants=(
                                                *_V3_LATENT["variants"], Variant(lambda c: not _ling3(c), {
                                                    "recurrent": "lightning", "names": LING25_NAMES,
                                                    "attn_gate": None, "keys": _LING25_KEYS,
                                                    "head_untied": False})),
                                            moe_fields={**_V3_ROUTER["moe_fields"], "clamp_act": True}),
                   keys=_BAILING_HYBRID_KEYS, recurrent="kda", normalize=_bailing_hybrid_config, adapters="none",
                   head_untied=True,
                   attn_gate="sigmoid", attn_gate_per_head=True,
                   expert_limit_keys=("expert_swiglu_limit_list", "share_expert_swiglu_limit_list"),
                   # Transformers' BailingHybridConfig defaults (fields with two spellings: under defaults)
                   config_defaults={"kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128,
                                    "qk_rope_head_dim": 64, "v_head_dim": 128, "head_dim": 128, "topk_group": 4,
                                    "routed_scaling_factor": 2.5, "first_k_dense_replace": 2, "rms_norm_eps": 1e-6,
                                    "rope_theta": 6_000_000.0, "intermediate_size": 6144},
                   defaults={"max_position_embeddings": 262144},
                   moe_defaults={"num_experts": 512, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                                 "n_group": 8, "norm_topk_prob": True, "n_shared_experts": 1},
                   refusals=_BAILING_HYBRID_REFUSALS,
                   # Ling 2.5 (a config that is not Ling 3.0's): lightning attention on the linear layers
                   # (decoder/lightning.py, its extras from _bailing_hybrid_config), latent layers without a gate
                   # llama.cpp's bailingmoe3: its converter writes safe gates only (kda.safe_gate,
                   # kda.gate_lower_bound: _gguf_delta); its graph rotates adjacent pairs (LLAMA_ROPE_TYPE_NORM)
                   gguf_arch="bailingmoe3",
                   gguf_changes={"rope_interleaved": True}),
        # ---- g3n: Gemma 3n (issue 16)
        FamilySpec("gemma3n_text", gguf_arch="gemma3n", gguf_names=GGUF_GEMMA3N_NAMES, norms=_SANDWICH,
                   names=GEMMA3N_NAMES, qk_norm="head", embed_scale_sqrt_hidden=True, default_act="gelu_pytorch_tanh", tie_default=True, attn_unscaled=True,
                   final_softcap_key="final_logit_softcapping", value_norm=True, kv_shared_key="num_kv_shared_layers",
                   adapters="ffn", altup=True, laurel=True, ffn_sparsity_key="activation_sparsity_pattern",
                   per_layer_clamp=True, normalize=_gemma3n_config, refusals=_GEMMA3N_REFUSALS,
                   reference_hidden="embedding_unnormed",
                   keys={"per_layer_input": ("hidden_size_per_layer_input",),
                         "per_layer_vocab": ("vocab_size_per_layer_input",), **_GEMMA4_ACT},
                   config_defaults={"sliding_window": 512, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
                                    "num_kv_shared_layers": 15, "hidden_size_per_layer_input": 256,
                                    "vocab_size_per_layer_input": 262144, "final_logit_softcapping": 30.0}),
        # ---- group GLM (issue 16): ChatGLM2, ChatGLM3 and GLM-4-9B (tests/test_chatglm.py). GLM's block
        # (fused gate/up with gate rows first, the first half of each head rotated by adjacent pairs) below
        # transformer.; query, key and value in one query_key_value, all queries then the groups' keys and
        # values under multi_query_attention, each head's query, key and value in turn otherwise (its
        # remote code views the rows as [heads, 3 * kv_channels]). Biases are read as stored (add_qkv_bias,
        # add_bias_linear).
        FamilySpec("chatglm", names=CHATGLM_NAMES, fused_qkv="concat", rope_interleaved=True, unconfirmed=True,
                   normalize=_chatglm_config, config_defaults=CHATGLM_DEFAULTS,
                   keys={"vocab_size": ("padded_vocab_size", "vocab_size"), "intermediate_size": ("ffn_hidden_size",),
                         "num_hidden_layers": ("num_layers",), "head_dim": ("kv_channels",),
                         "norm_eps": ("layernorm_epsilon",), "max_position_embeddings": ("seq_length",),
                         "act": ()},
                   variants=(Variant(unset("rmsnorm"), {"norm": "layer"}),
                             Variant(unset("original_rope"), {"rope_interleaved": False}),
                             Variant(unset("multi_query_attention", False), {"fused_qkv": "grouped"})),
                   refusals=(Refusal(flag("apply_residual_connection_post_layernorm"),
                                     "a residual taken after the norm (apply_residual_connection_post_layernorm) "
                                     "is not supported"),
                             Refusal(unset("post_layer_norm"),
                                     "a model without its final norm (post_layer_norm: false) is not supported"),
                             Refusal(lambda c: c.get("position_encoding_2d") is not None
                                     or c.get("inner_hidden_size") is not None,
                                     "the first ChatGLM-6B's block (2D positions, position_encoding_2d / "
                                     "inner_hidden_size) is not supported; ster runs ChatGLM2, ChatGLM3 and GLM-4"),
                             Refusal(lambda c: not _positive_number(c.get("rope_ratio", 1)),
                                     "a rope_ratio that is not a positive number is not supported"),
                             Refusal(lambda c: bool(c.get("multi_query_attention")) and (
                                 isinstance(c.get("multi_query_group_num"), bool)
                                 or not isinstance(c.get("multi_query_group_num"), int)
                                 or c.get("multi_query_group_num") <= 0),
                                     "multi_query_attention without a positive integer multi_query_group_num "
                                     "is not supported"))),
        # ---- group WRAP (issue 16): Muse Glimmer (also below model.language_model of muse_glimmer: WRAPPERS)
        _MUSE_GLIMMER,
        # ---- group WRAP: MiniMax-M3's decoder (also below language_model. of minimax_m3_vl: WRAPPERS)
        _MINIMAX_M3,
        # ---- group WRAP: Inkling's decoder (below model.llm, also of inkling_mm_model: WRAPPERS)
        _INKLING,
        # ---- group HC (issue 14, hyper-connections)
        # HY V4 (Transformers' HYV4ForCausalLM): DeepSeek-V3.2's latent attention and indexer (rotating halves,
        # the indexer its last qk_rope_head_dim components), a sink per head, an elementwise sigmoid gate, and
        # hc_mult streams joined by independent hyper-connections; routed experts clamped by swiglu_limit.
        FamilySpec("hy_v4", keys=_LATENT_KEYS, normalize=_hy_v4_config, config_defaults=dict(_HY_V4_DEFAULTS),
                   indexer={"interleaved": False, "rope_last": True, "norm_eps": "model"},
                   streams={"post_eps": "hc_eps"}, sinks=True, attn_gate="sigmoid", attn_gate_per_head=False,
                   adapters="none", unread=("model.mtp_layers.",),
                   **dict(_V3_LATENT, names=HY_V4_NAMES, rope_interleaved=False, variants=(), gguf_names=GGUF_HY_V4_NAMES,
                          moe_fields={**_V3_ROUTER["moe_fields"], "shared_limit": None}),
                   refusals=_HY_V4_REFUSALS,
                   # llama.cpp's hy_v4 (src/models/hy-v4.cpp): the converter keeps the rows as they are and the
                   # graph rotates adjacent pairs (LLAMA_ROPE_TYPE_NORM), the latent attention's and the indexer's
                   # (gguf/config.py's LLAMA_CPP_INDEXER); the streams from the hyper_connection keys.
                   gguf_arch="hy_v4", gguf_changes={"rope_interleaved": True},
                   gguf_config={"hyper_connection.count": "hc_mult", "hyper_connection.epsilon": "hc_eps",
                                "hyper_connection.magnitude": "hc_magnitude", "rope.scaling.type": "_rope_scaling",
                                "attention.indexer.top_k": "_index_topk"},
                   gguf_refusals=_HY_V4_GGUF_REFUSALS),
        # DeepSeek-V4 (Transformers' DeepseekV4ForCausalLM): hc_mult streams joined by Sinkhorn-normalised
        # hyper-connections; compressed attention (sliding window, compressed entries, Lightning Indexer) on every
        # layer; sqrtsoftplus-routed experts, hashed on the first layers, beside one shared expert, all clamped.
        FamilySpec("deepseek_v4", moe=True, compressed=True, normalize=_deepseek_v4_config, root="model.",
                   names=DEEPSEEK_V4_NAMES, config_defaults=dict(_DEEPSEEK_V4_DEFAULTS),
                   keys={"num_key_value_heads": (), "sliding_window": ("sliding_window",), "o_groups": ("o_groups",),
                         "o_lora_rank": ("o_lora_rank",), "num_experts": ("n_routed_experts",)},
                   fixed={"scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": True,
                          "n_group": 1, "topk_group": 1},
                   moe_fields={"renorm_eps": 1e-20}, streams={"hc_magnitude": 2.0, "hc_sinkhorn_iters": "model"},
                   adapters="none", unread=("mtp.", "model.mtp."), refusals=_DEEPSEEK_V4_REFUSALS,
                   # (group DS4) llama.cpp's deepseek4 (src/models/deepseek4.cpp): its metadata names every key of
                   # the config (gguf/config.py's deepseek4_config); experts in the map as stored (MXFP4)
                   gguf_arch="deepseek4", gguf_names=GGUF_DEEPSEEK_V4_NAMES),
        # GLM-5-Next's text decoder (Transformers' Glm5NextTextModel, below model.language_model of glm5_next).
        FamilySpec("glm5_next_text", keys=_GLM5_NEXT_KEYS, normalize=_glm5_next_config, recurrent="kda",
                   positions="none", config_defaults=dict(_GLM5_NEXT_DEFAULTS),
                   indexer={"interleaved": True, "kpool": "model"}, ffn_limit=True,
                   streams={"hc_magnitude": 2.0, "hc_sinkhorn_iters": "model", "head": "mean"}, adapters="none",
                   **dict(_V3_LATENT, names=GLM5_NEXT_NAMES, variants=(), gguf_names=GGUF_GLM5_NEXT_NAMES,
                          moe_fields={**_V3_ROUTER["moe_fields"]}),
                   refusals=_GLM5_NEXT_REFUSALS,
                   # (group GDS) llama.cpp's glm5-next (src/models/glm5-next.cpp): KDA where head_count_kv[i] is 0,
                   # the streams, the pooled indexer and the kda gate bound from the file; every gated
                   # feed-forward (dense ones too) clamped by ggml_swiglu_clamp (gguf/config.py)
                   gguf_arch="glm5-next",
                   gguf_config={"hyper_connection.count": "hc_mult", "hyper_connection.epsilon": "hc_eps",
                                "hyper_connection.sinkhorn_iterations": "hc_sinkhorn_iters",
                                "attention.indexer.kpool": "index_kpool",
                                "attention.indexer.kpool_select_tail": "index_kpool_always_select_tail"},
                   gguf_refusals=_GLM5_NEXT_GGUF_REFUSALS),
    )
}
# Families that are another family's spec under their own model_type (group G16A): MiMo-V2.5 is read as
# MiMo-V2-Flash (seed 002 describes them as one), Param2-MoE as Ling 2.0's block (Sarvam-30B's here).
# Their GGUF files, where llama.cpp writes any, carry the other family's architecture.
for _alias, _of in (("mimo_v2", "mimo_v2_flash"), ("param2moe", "sarvam_moe")):
    FAMILIES[_alias] = replace(FAMILIES[_of], model_type=_alias, unconfirmed=True, gguf_arch=None)
# Router and expert settings (DEFAULT_KEYS spellings) that Transformers' implementation of a family never
# reads: the keys are not read for it (a config stating one, as DeepSeek-style or gpt-oss-style configs do,
# would otherwise rescale, rescore, group or clamp its routed experts). Fields -> families.
_RSF = ("routed_scaling_factor",)
_ROUTER = ("topk_method", "n_group", "topk_group")
_CLAMP = ("swiglu_limit", "swiglu_alpha")
_UNREAD_ROUTER_KEYS: Mapping[tuple[str, ...], tuple[str, ...]] = {
    _RSF + ("scoring_func",) + _ROUTER + _CLAMP: (
        "dbrx", "flex_olmo", "granitemoe", "granitemoe_swa", "granitemoehybrid", "granitemoeshared", "mellum",
        "mixtral", "olmoe", "qwen2_moe", "qwen3_5_moe_text", "qwen3_moe", "qwen3_next"),
    _RSF + _ROUTER + _CLAMP: ("cohere2_moe", "minimax_m2", "phimoe"),
    _ROUTER + _CLAMP: ("afmoe", "laguna"),
    _RSF + ("scoring_func",) + _ROUTER: ("gpt_oss",),
    _RSF + _ROUTER[1:] + _CLAMP: ("jamba", "llama4_text", "minimax", "minimax_text_01"),
    _ROUTER[1:] + _CLAMP: ("hunyuan_v1_moe", "lfm2_moe"),
    _ROUTER[2:] + _CLAMP: ("ernie4_5_moe", "hy_v3"),
    _CLAMP: ("axk1", "bailing_hybrid", "deepseek_v2", "deepseek_v3", "deepseek_v32", "dots3_note", "exaone_moe",
             "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "kimi_linear", "longcat_flash", "mimo_v2_flash", "nemotron_h"),
    _CLAMP[1:]: ("deepseek_v4", "hy_v4"),
}
for _fields, _names in _UNREAD_ROUTER_KEYS.items():
    for _name in _names:
        FAMILIES[_name] = replace(FAMILIES[_name], keys={**FAMILIES[_name].keys, **dict.fromkeys(_fields, ())})
# group R2 (issue 16): LongCat-Flash-Lite is LongCat-Flash with hashed n-gram embeddings beside the token
# embedding (decoder/ngram.py), its tables and projections below model.ngram_embeddings.
FAMILIES["longcat_flash_ngram"] = replace(
    FAMILIES["longcat_flash"], model_type="longcat_flash_ngram", unconfirmed=True, ngram=True,
    names=_with(FAMILIES["longcat_flash"].names,
                embed=("model.ngram_embeddings.word_embeddings", "model.embed_tokens"),
                ngram_table="model.ngram_embeddings.embedders.{k}", ngram_proj="model.ngram_embeddings.post_projs.{k}"),
    config_defaults={**FAMILIES["longcat_flash"].config_defaults, "emb_neighbor_num": 4, "emb_split_num": 4,
                     "ngram_vocab_size_ratio": 78})
# group R2 (issue 16): Nemotron Puzzle is Nemotron-H below model., its layers in layers_block_type (mamba,
# attention, mlp, moe) and each moe layer's top-k and expert width in block_configs (config.py gives those
# layers their own MoESpec). llama.cpp converts it as nemotron_h_moe (per-layer expert_used_count and
# expert_feed_forward_length), which FAMILIES_BY_GGUF_ARCH reads as Nemotron-H (tests/test_parity_remote_c_gguf.py).
FAMILIES["nemotron_h_puzzle"] = replace(
    FAMILIES["nemotron_h"], model_type="nemotron_h_puzzle", names=NEMOTRON_PUZZLE_NAMES, unconfirmed=True,
    normalize=_nemotron_puzzle_config, gguf_arch="nemotron_h_moe",
    refusals=FAMILIES["nemotron_h"].refusals + (
        Refusal(_nemotron_puzzle_blocks_wrong, "a block_configs that does not list one object per layer, each "
                "with the block_type layers_block_type gives that layer, is not supported"),))

FAMILIES_BY_GGUF_ARCH: dict[str, FamilySpec] = {}
for _f in FAMILIES.values():
    if _f.gguf_arch and _f.gguf_arch not in FAMILIES_BY_GGUF_ARCH:
        FAMILIES_BY_GGUF_ARCH[_f.gguf_arch] = _f
# llama.cpp's converter writes Nemotron-H with routed layers as its own architecture, read the same way.
FAMILIES_BY_GGUF_ARCH["nemotron_h_moe"] = FAMILIES["nemotron_h"]


# Multimodal checkpoints whose text decoder ster runs: the wrapper's model_type -> (the decoder's
# model_type when its text_config leaves it out, the prefix the decoder's tensors sit below). The
# towers beside the decoder (vision, projector) are never read.
WRAPPERS: Mapping[str, tuple[str, str]] = {"llama4": ("llama4_text", "language_model."),
                                           "gemma4": ("gemma4_text", "model.language_model."),
                                           "gemma4_unified": ("gemma4_unified_text", "model.language_model."),
                                           # group SSM-B2: Qwen3.5's decoders sit below model.language_model
                                           "qwen3_5": ("qwen3_5_text", "model.language_model."),
                                           "qwen3_5_moe": ("qwen3_5_moe_text", "model.language_model."),
                                           # group WRAP: Muse Glimmer's decoder, its head at the root
                                           "muse_glimmer": ("muse_glimmer_text", "model.language_model."),
                                           "minimax_m3_vl": ("minimax_m3_vl_text", "language_model."),
                                           "inkling_mm_model": ("inkling_text", "model.llm."),
                                           # group R2: Step3-VL keeps its text decoder's weights at the root
                                           "step3_vl": ("step3_text", ""),
                                           # group g3n: Gemma 3n's decoder beside its vision and audio towers
                                           "gemma3n": ("gemma3n_text", "model.language_model."),
                                           # group HC: GLM-5-Next's decoder below model.language_model
                                           "glm5_next": ("glm5_next_text", "model.language_model.")}
# A wrapper prefix that replaces a stem of the decoder's names rather than going before them:
# Gemma 4's and Qwen3.5's wrappers keep the text model's layers at model.language_model.layers (not
# below model.), the head at the root.
WRAPPER_STEMS: Mapping[str, str] = {"model.language_model.": "model.",
                                    # Inkling's decoder names already sit below model.llm (its own layout)
                                    "model.llm.": "model.llm."}
# What a text_config may leave to the wrapper's config (architectures: what the checkpoint says it is).
_FROM_WRAPPER = ("eos_token_id", "bos_token_id", "tie_word_embeddings", "quantization_config", "architectures")


# model_type values of remote-code configs that name another family's architecture: read as that family
# (Kimi-K2's config.json says kimi_k2 for DeepseekV3ForCausalLM, as Transformers' Kimi-K2.5 reads it).
MODEL_TYPE_ALIASES: Mapping[str, str] = {"kimi_k2": "deepseek_v3"}
# Configs that leave model_type out and name an architecture ster reads as a family: MiniMax-M3's decoder as
# vLLM's MiniMaxM3SparseForCausalLM (group WRAP), LongCat-Flash-Lite's (group R2).
ARCHITECTURE_MODEL_TYPES: Mapping[str, str] = {"MiniMaxM3SparseForCausalLM": "minimax_m3_vl_text",
                                               "LongcatFlashNgramForCausalLM": "longcat_flash_ngram"}


def unwrap(config: Mapping, config_path: Path | str) -> tuple[Mapping, str | None]:
    """A wrapper config's text decoder: (its config, the prefix of its tensors); (config, None) otherwise.

    A ``model_type`` listed in ``MODEL_TYPE_ALIASES`` is read as the family it stands for; a config without
    one that names an architecture ``ARCHITECTURE_MODEL_TYPES`` lists, as that architecture's family.

    The decoder's config is the wrapper's ``text_config``, with ``eos_token_id``, ``bos_token_id``,
    ``tie_word_embeddings``, ``quantization_config`` and ``architectures`` taken from the wrapper
    where it leaves them out.

    A text_config's own ``model_type`` must be the wrapper's decoder: one naming another family ster knows
    is refused; one ster does not know is read as the wrapper's decoder (``wrapper_text_type_note`` warns).

    Raises:
        SterError: a wrapper config without a ``text_config`` object; a text_config naming another family.
    """
    wrapper = config.get("model_type")
    if "model_type" not in config:  # a config naming only its architecture (vLLM's spelling)
        arch = config.get("architectures")
        named = [ARCHITECTURE_MODEL_TYPES[a] for a in arch if a in ARCHITECTURE_MODEL_TYPES] \
            if isinstance(arch, list) and all(isinstance(a, str) for a in arch) else []
        if named:
            return {**config, "model_type": named[0]}, None
    if isinstance(wrapper, str) and wrapper in MODEL_TYPE_ALIASES:
        return {**config, "model_type": MODEL_TYPE_ALIASES[wrapper]}, None
    if not isinstance(wrapper, str) or wrapper not in WRAPPERS:
        return config, None
    text = config.get("text_config")
    if not isinstance(text, Mapping):
        raise SterError(f"model architecture {wrapper!r} in {config_path} is not supported without a text_config "
                        f"object: ster runs the text decoder a {wrapper} config describes there")
    inner_type, prefix = WRAPPERS[wrapper]
    named = text.get("model_type")
    if named is not None and named != inner_type and wrapper_text_type_note(config, config_path) is None:
        # The checkpoint says what it is twice: a known wrapper stores its own decoder's tensors, so a
        # text_config naming another family would run that family's math on them (most of them unread).
        raise SterError(f"{config_path}: model_type {wrapper!r} is a multimodal checkpoint whose text decoder is "
                        f"{inner_type!r}, but its text_config.model_type says {named!r}, another family; the two "
                        f"cannot both be right: set text_config.model_type to {inner_type!r} (or remove it) if the "
                        f"weights are {wrapper}'s, or use the {named} checkpoint itself")
    inner = {**text, "model_type": inner_type}
    for key in _FROM_WRAPPER:
        if inner.get(key) is None and config.get(key) is not None:
            inner[key] = config[key]
    return inner, prefix


def wrapper_text_type_note(config: Mapping, config_path: Path | str) -> str | None:
    """The warning for a known wrapper whose ``text_config.model_type`` is no model_type ster knows (another
    spelling, a newer name): the wrapper's own decoder is read (``unwrap``), and the user is told so.
    None for every other config, including a text_config naming another known family (``unwrap`` refuses it)."""
    wrapper = config.get("model_type")
    if not isinstance(wrapper, str) or wrapper not in WRAPPERS or not isinstance(config.get("text_config"), Mapping):
        return None
    named = config["text_config"].get("model_type")
    inner_type = WRAPPERS[wrapper][0]
    known = set(KNOWN_MODEL_TYPES) | set(WRAPPERS) | set(MODEL_TYPE_ALIASES)
    if named is None or named == inner_type or (isinstance(named, str) and named in known):
        return None
    from .decoder.rope import brief_value

    return (f"{config_path}: text_config.model_type {brief_value(named)} is not a model_type ster knows; read as "
            f"{inner_type!r}, the text decoder of a {wrapper!r} checkpoint")


def implemented_model_types() -> list[str]:
    """The model_type values the decoder runs, in the order of ``KNOWN_MODEL_TYPES``."""
    return [m for m in KNOWN_MODEL_TYPES if m in FAMILIES]


def gate(config: Mapping, config_path: Path | str) -> FamilySpec:
    """The architecture gate: refuse what the decoder cannot run, before any weight is mapped.

    Args:
        config: the parsed config.json (a JSON object).
        config_path: where it was read from, for messages.

    Returns:
        The family's ``FamilySpec``.

    Raises:
        SterError: ``model_type`` missing, null or not in Ster's list (the message names the
            whole list); a listed family this build does not implement yet (names it and the
            implemented ones); a ``quantization_config`` (quantized checkpoints are not run);
            a configuration the family refuses (its ``refusals``, e.g. GPT-2's
            scale_attn_by_inverse_layer_idx, OPT's post-norm blocks, MPT's qk_ln); a value
            ``validate.check_config`` refuses (a switch that is not a boolean, a size beyond its bound).
    """
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in KNOWN_MODEL_TYPES:
        shown = "missing" if "model_type" not in config else ("null" if model_type is None else repr(model_type))
        raise SterError(
            f"model architecture {shown} in {config_path} is not supported: ster knows the "
            f"model_type values {', '.join(KNOWN_MODEL_TYPES)}; use a Hugging Face checkpoint "
            "whose config.json names one of them"
        )
    if model_type not in FAMILIES:
        raise SterError(
            f"model architecture {model_type!r} ({config_path}) is a known family that this build "
            f"of ster does not run yet; the families it runs are: {', '.join(implemented_model_types())}"
        )
    if config.get("quantization_config") is not None:
        method = config["quantization_config"]
        method = method.get("quant_method", "unknown") if isinstance(method, dict) else "unknown"
        raise SterError(
            f"{config_path} declares a quantization_config (method {method!r}): ster runs "
            "unquantized safetensors checkpoints (f32/f16/bf16) and llama.cpp GGUF files; "
            "use the full-precision checkpoint or a GGUF of the model"
        )
    from .validate import check_config

    check_config(config, str(config_path))  # switches that must be booleans, sizes the kernels take as C ints
    family = FAMILIES[model_type]
    if family.normalize is not None:
        config = family.normalize(config)
    for refusal in family.refusals:
        if refusal.when(config):
            raise SterError(f"{config_path}: {refusal.why} for model_type {model_type!r}; "
                            "ster refuses this configuration before reading any weight")
    return family
