"""Mixture-of-experts families against transformers on tiny random checkpoints.

Each case is a checkpoint made here with transformers (small dims, 3 layers, more experts
than chosen, dense and routed layers mixed where the family has both, each router option
switched on in some case), every weight redrawn (``tiny.build_checkpoint``). Checked like the
dense families: logits within 1e-4 of transformers (f32), the same through the KV cache in
two pieces, the same 16 greedy tokens, and no stored tensor left unread. The router alone is
checked against transformers' own router modules (``test_route_*``).
"""
from __future__ import annotations

import numpy as np
import pytest

from ster_py.config import spec_from_config
from ster_py.decoder.moe import RouterSpec, route
from ster_py.errors import SterError
from ster_py.families import FAMILIES, gate
from ster_py.load import load_model
from test_parity_dense import PROMPT, _check
from tiny import CONFIG_AS_GIVEN
from tiny import build_checkpoint as build
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)
from tiny import reference_logits, rel_err, rewrite_checkpoint

# the dequantized model's sums for a GGUF's prompt (conftest.quantized_tiles_off)
pytestmark = pytest.mark.usefixtures("quantized_tiles_off")

VOCAB = 128
LLAMA = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
_FSF = ["full_attention", "sliding_attention", "full_attention"]
EXPERTS = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)

CASES = {
    "mixtral": ("mixtral", dict(LLAMA, num_local_experts=6, num_experts_per_tok=2)),
    # Transformers' Mixtral (and the other rope_whole_head families) rotates whole heads whatever the share says;
    # its router reads none of DeepSeek's or gpt-oss's settings (families._UNREAD_ROUTER_KEYS)
    "mixtral-share-and-router-keys-unread": ("mixtral", dict(
        LLAMA, num_local_experts=4, num_experts_per_tok=2, partial_rotary_factor=0.5, routed_scaling_factor=2.5,
        scoring_func="sigmoid", topk_method="group_limited_greedy", n_group=2, topk_group=1, swiglu_limit=0.2,
        swiglu_alpha=1.5)),
    "mixtral-window-top3": ("mixtral", dict(LLAMA, num_local_experts=5, num_experts_per_tok=3, sliding_window=5)),
    "qwen2_moe-shared-dense-layer": ("qwen2_moe", dict(LLAMA, **EXPERTS, shared_expert_intermediate_size=48,
                                                       mlp_only_layers=[1])),
    "qwen2_moe-renorm-step2": ("qwen2_moe", dict(LLAMA, **EXPERTS, shared_expert_intermediate_size=40,
                                                 norm_topk_prob=True, decoder_sparse_step=2)),
    "qwen3_moe": ("qwen3_moe", dict(LLAMA, **EXPERTS, head_dim=16)),
    "qwen3_moe-renorm-dense-layer": ("qwen3_moe", dict(LLAMA, **dict(EXPERTS, num_experts_per_tok=3), head_dim=16,
                                                       norm_topk_prob=True, mlp_only_layers=[0])),
    # use_sliding_window: Qwen3 MoE slides every layer (whatever max_window_layers says); Qwen2 MoE's config
    # without layer_types slides layers 0, 2, 4, ... below max_window_layers (WITHOUT_KEYS drops its list)
    "qwen3_moe-window": ("qwen3_moe", dict(LLAMA, **EXPERTS, head_dim=16, use_sliding_window=True, sliding_window=5,
                                           max_window_layers=1)),
    "qwen2_moe-window-no-layer-types": ("qwen2_moe", dict(LLAMA, **EXPERTS, shared_expert_intermediate_size=48,
                                                          use_sliding_window=True, sliding_window=5,
                                                          max_window_layers=2)),
    "olmoe": ("olmoe", dict(LLAMA, num_experts=8, num_experts_per_tok=2)),
    "olmoe-clip-renorm": ("olmoe", dict(LLAMA, num_experts=6, num_experts_per_tok=3, clip_qkv=0.3,
                                        norm_topk_prob=True)),
    # ---- group H2: DeepSeek-V3-style routers (sigmoid, selection bias, groups, scale) and shared experts;
    # ERNIE 4.5's and HunYuan's softmax routers.
    "glm4_moe-qk-norm-bias-groups": ("glm4_moe", dict(LLAMA, head_dim=16, n_routed_experts=8, num_experts_per_tok=3,
                                                      moe_intermediate_size=32, attention_bias=True, use_qk_norm=True,
                                                      n_group=4, topk_group=2, routed_scaling_factor=1.5)),
    "glm4_moe-no-renorm-2-shared": ("glm4_moe", dict(LLAMA, head_dim=16, n_routed_experts=6, num_experts_per_tok=2,
                                                     moe_intermediate_size=24, n_shared_experts=2, norm_topk_prob=False,
                                                     routed_scaling_factor=2.0, first_k_dense_replace=2,
                                                     partial_rotary_factor=0.25)),
    "sarvam_moe-qkv-bias-groups": ("sarvam_moe", dict(LLAMA, head_dim=16, num_experts=8, num_experts_per_tok=2,
                                                      moe_intermediate_size=32, use_qkv_bias=True, n_group=2,
                                                      topk_group=1, num_shared_experts=1)),
    "sarvam_moe-no-qk-norm-no-renorm": ("sarvam_moe", dict(LLAMA, head_dim=16, num_experts=6, num_experts_per_tok=3,
                                                           moe_intermediate_size=24, use_qk_norm=False,
                                                           norm_topk_prob=False, num_shared_experts=2,
                                                           first_k_dense_replace=0)),
    "exaone_moe-window": ("exaone_moe", dict(LLAMA, head_dim=16, **EXPERTS, sliding_window=5,
                                             layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                             mlp_layer_types=["dense", "sparse", "sparse"])),
    "exaone_moe-groups-no-renorm": ("exaone_moe", dict(LLAMA, head_dim=16, **EXPERTS, sliding_window=4,
                                                       layer_types=["full_attention", "full_attention",
                                                                    "sliding_attention"],
                                                       mlp_layer_types=["sparse", "dense", "sparse"],
                                                       n_group=2, topk_group=1, norm_topk_prob=False,
                                                       num_shared_experts=2, routed_scaling_factor=1.3)),
    "hy_v3": ("hy_v3", dict(LLAMA, head_dim=16, **EXPERTS, router_scaling_factor=1.7)),
    "hy_v3-biases-mixed-layers": ("hy_v3", dict(LLAMA, head_dim=16, **dict(EXPERTS, num_experts_per_tok=3),
                                                attention_bias=True, mlp_bias=True, num_shared_experts=2,
                                                mlp_layer_types=["sparse", "dense", "sparse"])),
    "ernie4_5_moe-bias-shared": ("ernie4_5_moe", dict(LLAMA, head_dim=16, moe_num_experts=8, moe_k=2,
                                                      moe_intermediate_size=32, use_bias=True,
                                                      moe_num_shared_experts=2)),
    "ernie4_5_moe-interval-floor": ("ernie4_5_moe", dict(LLAMA, num_hidden_layers=4, head_dim=16, moe_num_experts=6,
                                                         moe_k=3, moe_intermediate_size=24, moe_num_shared_experts=0,
                                                         moe_layer_start_index=0, moe_layer_end_index=2,
                                                         moe_layer_interval=2, moe_norm_min=0.8)),
    "hunyuan_v1_moe-bias": ("hunyuan_v1_moe", dict(LLAMA, head_dim=16, num_experts=8, moe_topk=2,
                                                   attention_bias=True)),
    "hunyuan_v1_moe-alpha-topk-per-layer": ("hunyuan_v1_moe", dict(
        LLAMA, head_dim=16, num_experts=6, moe_topk=[3, 3, 3],
        rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 50.0, "factor": 1.0})),
    # --- group H3
    "gpt_oss": ("gpt_oss", dict(LLAMA, head_dim=16, intermediate_size=32, num_local_experts=6, num_experts_per_tok=2,
                                sliding_window=5)),
    "gpt_oss-clamped-top3-plain-rope": ("gpt_oss", dict(LLAMA, head_dim=16, intermediate_size=24, num_local_experts=5,
                                                        num_experts_per_tok=3, sliding_window=4, swiglu_limit=0.3,
                                                        swiglu_alpha=1.3, attention_bias=False,
                                                        layer_types=["full_attention", "sliding_attention",
                                                                     "sliding_attention"],
                                                        rope_parameters={"rope_type": "default",
                                                                         "rope_theta": 1000.0})),
    "cohere2_moe": ("cohere2_moe", dict(LLAMA, head_dim=16, intermediate_size=32, num_experts=6, num_experts_per_tok=2,
                                        sliding_window=5, layer_types=["sliding_attention", "full_attention",
                                                                       "sliding_attention"],
                                        mlp_layer_types=["sparse", "sparse", "sparse"])),
    "cohere2_moe-sigmoid-shared-dense-rms": ("cohere2_moe", dict(
        LLAMA, num_hidden_layers=4, head_dim=16, intermediate_size=24, num_experts=5, num_experts_per_tok=3,
        expert_selection_fn="sigmoid", norm_topk_prob=False, num_shared_experts=2, prefix_dense_intermediate_size=40,
        rms_norm_eps=1e-5, logit_scale=0.5, tie_word_embeddings=False, sliding_window=4, sliding_window_pattern=2,
        first_k_dense_replace=1)),
    "cohere2_moe-sigmoid-renorm-sum-windowed-prefix": ("cohere2_moe", dict(
        LLAMA, num_hidden_layers=4, head_dim=16, intermediate_size=24, num_experts=6, num_experts_per_tok=2,
        expert_selection_fn="sigmoid", num_shared_experts=1, shared_expert_combination_strategy="sum",
        prefix_dense_intermediate_size=40, sliding_window=4, first_k_dense_replace=2,
        prefix_dense_sliding_window_pattern=2)),
    "afmoe": ("afmoe", dict(LLAMA, head_dim=16, moe_intermediate_size=24, num_experts=6, num_experts_per_tok=2,
                            num_shared_experts=1, num_dense_layers=1, sliding_window=5, global_attn_every_n_layers=2)),
    "afmoe-mup-scaled-top3-all-routed": ("afmoe", dict(LLAMA, num_hidden_layers=4, head_dim=16,
                                                       moe_intermediate_size=16, num_experts=7, num_experts_per_tok=3,
                                                       num_shared_experts=2, num_dense_layers=0, route_scale=2.5,
                                                       mup_enabled=True, sliding_window=4)),
    "llama4_text": ("llama4_text", dict(LLAMA, num_hidden_layers=4, head_dim=16, intermediate_size=24,
                                        intermediate_size_mlp=80, num_local_experts=5, num_experts_per_tok=2,
                                        interleave_moe_layer_step=2, attention_chunk_size=5, floor_scale=4,
                                        attn_scale=0.5)),
    "llama4_text-top1-no-qk-norm-no-tuning-bias-llama3": ("llama4_text", dict(
        LLAMA, num_hidden_layers=3, head_dim=16, intermediate_size=32, intermediate_size_mlp=64, num_local_experts=4,
        num_experts_per_tok=1, moe_layers=[0, 2], no_rope_layers=[1, 0, 1], attention_chunk_size=7,
        use_qk_norm=False, attn_temperature_tuning=False, attention_bias=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    # group H4
    "flex_olmo": ("flex_olmo", dict(LLAMA, num_experts=6, num_experts_per_tok=2)),
    "flex_olmo-renorm-mha": ("flex_olmo", dict(LLAMA, num_key_value_heads=None, num_experts=5, num_experts_per_tok=3,
                                               norm_topk_prob=True)),
    "mellum-window-dense-yarn": ("mellum", dict(LLAMA, **EXPERTS, head_dim=16, sliding_window=5,
                                                layer_types=["sliding_attention", "full_attention",
                                                             "sliding_attention"],
                                                mlp_layer_types=["dense", "sparse", "sparse"], rope_parameters={
        "full_attention": {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0,
                           "original_max_position_embeddings": 16},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}})),
    "mellum-no-renorm": ("mellum", dict(LLAMA, **EXPERTS, head_dim=16, norm_topk_prob=False)),
    "minimax_m2-rotary-dim": ("minimax_m2", dict(LLAMA, head_dim=16, rotary_dim=8, num_local_experts=6,
                                                 num_experts_per_tok=2, intermediate_size=32)),
    "minimax_m2-partial-factor": ("minimax_m2", dict(LLAMA, head_dim=16, num_local_experts=8, num_experts_per_tok=3,
                                                     rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                                                                      "partial_rotary_factor": 0.5})),
    "mimo_v2_flash": ("mimo_v2_flash", dict(LLAMA, num_key_value_heads=1, head_dim=24, v_head_dim=16,
                                            n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                            sliding_window=5, layer_types=_FSF)),
    "mimo_v2_flash-groups-scale-no-renorm": ("mimo_v2_flash", dict(
        LLAMA, head_dim=16, v_head_dim=24, n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
        n_group=4, topk_group=2, norm_topk_prob=False, routed_scaling_factor=2.5, attention_value_scale=1.5,
        sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        mlp_layer_types=["sparse", "dense", "sparse"], rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 50000.0, "partial_rotary_factor": 0.5},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.25}})),
    "laguna-heads-per-layer-window-yarn": ("laguna", dict(
        LLAMA, head_dim=16, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=40, num_attention_heads_per_layer=[4, 8, 4], layer_types=_FSF,
        sliding_window=5, rope_parameters={
            "full_attention": {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0,
                               "original_max_position_embeddings": 16, "partial_rotary_factor": 0.5},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}})),
    "laguna-per-element-gate-softcap-scale": ("laguna", dict(
        LLAMA, head_dim=16, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
        shared_expert_intermediate_size=24, gating="per-element", moe_router_logit_softcapping=0.5,
        moe_routed_scaling_factor=2.0, mlp_layer_types=["sparse", "dense", "sparse"])),
    "step3p5-heads-clamps-yarn": ("step3p5", dict(
        LLAMA, head_dim=16, sliding_window=5, layer_types=_FSF, num_sliding_attention_heads=2,
        mlp_layer_types=["dense", "sparse", "sparse"], n_routed_experts=6, num_experts_per_tok=2,
        moe_intermediate_size=32, share_expert_dim=40, moe_router_scaling_factor=2.0, query_pre_attn_scalar=24,
        swiglu_limits=[0.0, 0.8, None], swiglu_limits_shared=[0.0, None, 0.6], rope_parameters={
            "full_attention": {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0,
                               "original_max_position_embeddings": 16, "partial_rotary_factor": 0.5},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}})),
    "step3p5-hub-config": ("step3p5", {
        **LLAMA, "head_dim": 16, "sliding_window": 4, CONFIG_AS_GIVEN: True, "num_nextn_predict_layers": 1,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "attention_other_setting": {"num_attention_heads": 2, "num_attention_groups": 2}, "moe_layers_enum": "0,2",
        "moe_num_experts": 8, "moe_top_k": 3, "moe_intermediate_size": 24, "share_expert_dim": 24,
        "rope_theta": [500.0, 20000.0, 500.0, 20000.0], "partial_rotary_factors": [1.0, 0.5, 1.0, 0.5],
        "swiglu_limits": [0.7, 0, 0, 0], "swiglu_limits_shared": [0, 0, 0.9, 0]}),
}
# ---- H1: GraniteMoE, GraniteMoE-Shared, GraniteMoE-SWA, DBRX, PhiMoE
_GRANITE_MULT = dict(embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=3.0)
_GRANITE_MOE = dict(LLAMA, intermediate_size=32, num_local_experts=6, num_experts_per_tok=2, **_GRANITE_MULT)
_SWA_LAYERS = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
CASES.update({
    "granitemoe": ("granitemoe", dict(_GRANITE_MOE)),
    "granitemoe-top3-bias-tied": ("granitemoe", dict(_GRANITE_MOE, num_experts_per_tok=3, attention_bias=True,
                                                     tie_word_embeddings=True)),
    "granitemoeshared": ("granitemoeshared", dict(_GRANITE_MOE, shared_intermediate_size=48)),
    "granitemoeshared-no-shared": ("granitemoeshared", dict(_GRANITE_MOE, shared_intermediate_size=0)),
    "granitemoe_swa-shared": ("granitemoe_swa", dict(_GRANITE_MOE, num_hidden_layers=4, shared_intermediate_size=40,
                                                     sliding_window=5, layer_types=_SWA_LAYERS,
                                                     layer_rope_theta=[10000.0, 500.0, 0.0, 10000.0])),
    "granitemoe_swa-default-layers": ("granitemoe_swa", dict(_GRANITE_MOE, num_hidden_layers=4, sliding_window=5,
                                                             num_experts_per_tok=1)),
})
_DBRX = dict(vocab_size=VOCAB, d_model=64, n_heads=4, n_layers=3, max_seq_len=64)
_DBRX_FFN = dict(ffn_hidden_size=32, moe_num_experts=6, moe_top_k=2)
# Transformers 5 rotates DBRX by the top-level rope_parameters it writes, whatever attn_config.rope_theta says
# (which its attention still requires); ster reads attn_config.rope_theta only when the top level states no base.
# Its attention clamps q/k/v with clip_qkv and fails without one, so every case states it.
CASES.update({
    "dbrx-clip": ("dbrx", dict(_DBRX, attn_config=dict(kv_n_heads=2, clip_qkv=0.5, rope_theta=500000),
                               ffn_config=dict(_DBRX_FFN))),
    "dbrx-mha-top3-unnormalised": ("dbrx", dict(_DBRX, rope_parameters={"rope_type": "default", "rope_theta": 500.0},
                                                attn_config=dict(kv_n_heads=4, clip_qkv=8, rope_theta=500.0),
                                                ffn_config=dict(_DBRX_FFN, moe_top_k=3,
                                                                moe_normalize_expert_weights=None))),
})

# PhiMoE: a wide router_jitter_noise so that SparseMixer's softmax spans several experts.
_PHIMOE_ROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 48,
                "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0],
                "long_factor": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
                "short_mscale": 1.2, "long_mscale": 1.4}
CASES.update({
    "phimoe": ("phimoe", dict(LLAMA, num_local_experts=6, router_jitter_noise=0.01)),
    "phimoe-wide-jitter-biases-longrope-window": ("phimoe", dict(
        LLAMA, num_local_experts=5, router_jitter_noise=0.4, attention_bias=True, lm_head_bias=True,
        sliding_window=5, rope_parameters=_PHIMOE_ROPE)),
})


# config.json keys a case removes after saving (a hub config's spelling; Transformers derives the same values)
WITHOUT_KEYS = {"qwen2_moe-window-no-layer-types": ("layer_types",)}


@pytest.mark.parametrize("case", list(CASES))
def test_family_matches_transformers(case, tmp_path):
    model_type, config = CASES[case]
    ref_model = build(tmp_path, model_type, config)
    if case in WITHOUT_KEYS:
        rewrite_checkpoint(tmp_path, {}, drop=WITHOUT_KEYS[case])
    model = _check(tmp_path, ref_model)
    assert model.spec.moe is not None and "moe" in [layer.ffn for layer in model.spec.layers]


def test_every_moe_family_has_a_case():
    import test_parity_remote  # families without a Transformers implementation
    import test_parity_remote_b  # group R1's
    import test_parity_remote_c  # group R2's

    # latent and recurrent ones: test_parity_mla, _ssm; compressed attention (DeepSeek-V4): test_parity_hc
    moe = {name for name, f in FAMILIES.items() if f.moe and not f.latent and not f.recurrent and not f.compressed}
    assert moe == {model_type for model_type, _ in CASES.values()} | {
        model_type for suite in (test_parity_remote, test_parity_remote_b, test_parity_remote_c)
        for model_type, _ in suite.CASES.values()
        if FAMILIES[model_type].moe and not FAMILIES[model_type].latent and not FAMILIES[model_type].recurrent} | {
        "minimax_m3_vl_text", "inkling_text"}  # tests/test_parity_wrapped.py


def test_layers_choose_dense_or_routed_from_the_config(tmp_path):
    build(tmp_path / "q", "qwen2_moe", CASES["qwen2_moe-shared-dense-layer"][1])
    assert [layer.ffn for layer in load_model(str(tmp_path / "q")).spec.layers] == ["moe", "dense", "moe"]
    build(tmp_path / "s", "qwen2_moe", CASES["qwen2_moe-renorm-step2"][1])
    spec = load_model(str(tmp_path / "s")).spec
    assert [layer.ffn for layer in spec.layers] == ["dense", "moe", "dense"]
    assert spec.moe.router.renormalize and spec.moe.shared_gated and spec.moe.shared_size == 40
    # Qwen2 MoE without layer_types or max_window_layers: Transformers' default of 28 bounds the sliding layers
    bare = {k: v for k, v in CASES["qwen2_moe-window-no-layer-types"][1].items() if k != "max_window_layers"}
    spec = spec_from_config(dict(bare, num_hidden_layers=31, model_type="qwen2_moe"), FAMILIES["qwen2_moe"])
    assert [layer.sliding_window for layer in spec.layers] == [5 if i % 2 == 0 and i < 28 else None for i in range(31)]


# ----------------------------------------------------------------------------- the router alone


def _torch_router(kind: str, experts: int, top_k: int, **extra):
    """transformers' own router module of a family, with random weights (and selection bias)."""
    import torch
    from transformers import AutoConfig

    torch.manual_seed(0)
    if kind == "deepseek_v3":
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter as R

        cfg = AutoConfig.for_model("deepseek_v3", hidden_size=32, n_routed_experts=experts,
                                   num_experts_per_tok=top_k, **extra)
        r = R(cfg)
        with torch.no_grad():
            r.weight.copy_(torch.randn_like(r.weight))
            r.e_score_correction_bias.copy_(torch.randn_like(r.e_score_correction_bias) * 0.3)
        return r, cfg
    raise ValueError(kind)


@pytest.mark.parametrize("n_group,topk_group,top_k,norm", [(1, 1, 3, True), (4, 2, 3, True), (8, 3, 2, False),
                                                           (2, 1, 4, True)])
def test_route_equals_deepseek_v3_router(n_group, topk_group, top_k, norm):
    """Sigmoid scores, selection-only bias, groups ranked by their best two, renormalisation
    with DeepSeek's 1e-20, routed_scaling_factor: the same experts and weights as transformers."""
    import torch

    router, cfg = _torch_router("deepseek_v3", 16, top_k, n_group=n_group, topk_group=topk_group,
                                norm_topk_prob=norm, routed_scaling_factor=2.5)
    x = torch.randn(40, 32)
    with torch.no_grad():
        logits, ref_w, ref_ids = router(x)
    spec = RouterSpec(16, top_k, scoring="sigmoid", select_bias=True, n_group=n_group, topk_group=topk_group,
                      group_rank="top2", renormalize=norm, renorm_eps=1e-20, scale=2.5)
    ids, w = route(spec, logits.numpy(), router.e_score_correction_bias.numpy())
    ref_ids, ref_w = ref_ids.numpy(), ref_w.numpy()
    order = np.argsort(ref_ids, axis=1)
    mine = np.argsort(ids, axis=1)
    assert np.array_equal(np.take_along_axis(ids, mine, 1), np.take_along_axis(ref_ids, order, 1))
    np.testing.assert_allclose(np.take_along_axis(w, mine, 1), np.take_along_axis(ref_w, order, 1), rtol=1e-6)


def test_route_softmax_topk_renormalised_equals_softmax_of_the_chosen_logits():
    """gpt-oss softmaxes the top-k logits; Mixtral softmaxes all, keeps the top k and renormalises:
    the same weights (the first as a reference for the second)."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((20, 10)).astype(np.float32)
    ids, w = route(RouterSpec(10, 3, renormalize=True), logits)
    chosen = np.take_along_axis(logits, ids, 1)
    ref = np.exp(chosen - chosen.max(1, keepdims=True))
    np.testing.assert_allclose(w, ref / ref.sum(1, keepdims=True), rtol=1e-5)
    assert np.array_equal(ids[:, 0], logits.argmax(1))


# ----------------------------------------------------------------------------- H1: GraniteMoE, DBRX, PhiMoE


@pytest.mark.parametrize("eps", [0.0, 0.01, 0.3, 2.0])
def test_sparsemixer_equals_phimoe_router(eps):
    """PhiMoE's router outside training: the same two experts, in the same order, and the same
    weights as transformers' PhimoeTopKRouter, on logits that include ties, zeros and rows
    whose best logit is negative (where SparseMixer's divisor is a logit's own magnitude)."""
    import torch
    from transformers import AutoConfig
    from transformers.models.phimoe.modeling_phimoe import PhimoeTopKRouter

    torch.manual_seed(0)
    cfg = AutoConfig.for_model("phimoe", hidden_size=8, num_local_experts=7, router_jitter_noise=eps)
    router = PhimoeTopKRouter(cfg).eval()
    with torch.no_grad():
        router.weight.copy_(torch.eye(7, 8))  # logits = the first 7 inputs
    x = torch.randn(60, 8) * 2
    x[:10, :7] -= 6.0  # every logit negative
    x[10:15, :7] = torch.tensor([1.5, 1.5, 0.0, 0.0, -1.0, 1.5, 0.2])  # ties at the top, zeros
    x[15:18, :7] = 0.0
    with torch.no_grad():
        logits, ref_w, ref_ids = router(x)
    spec = RouterSpec(7, 2, scoring="sparsemixer", jitter_eps=eps)
    ids, w = route(spec, logits.numpy())
    assert np.array_equal(ids, ref_ids.numpy())
    np.testing.assert_allclose(w, ref_w.numpy(), rtol=1e-6)


def test_phimoe_long_rope_uses_the_long_table(tmp_path):
    """Past original_max_position_embeddings PhiMoE rotates by the long factors times long_mscale,
    as Phi-3.5-MoE's own code and Transformers 4 did. Transformers 5.24's PhimoeRotaryEmbedding
    builds its table with ``rope_init_fn(config)``, no sequence length, so it keeps the short
    factors (while switching to long_mscale): the oracle here is transformers with the sequence
    length given back to that call. The prompt is fed whole and in two pieces, the first short."""
    from tiny import reference_logits, reference_split_logits, rel_err
    from test_parity_dense import PROMPT

    model_type, config = CASES["phimoe-wide-jitter-biases-longrope-window"]
    config = dict(config, rope_parameters=dict(_PHIMOE_ROPE, original_max_position_embeddings=8))
    ref = build(tmp_path, model_type, config)
    model = load_model(str(tmp_path))
    ours = model.decoder.forward(PROMPT)
    as_is = reference_logits(ref, PROMPT)[0]
    assert rel_err(ours, as_is) > 1e-3  # the disagreement is real at this length

    rotary = ref.model.rotary_emb
    init = rotary.rope_init_fn

    def with_length(module, args, kwargs):
        n = int(kwargs["position_ids"].max()) + 1
        module.rope_init_fn = lambda cfg, *a, **k: init(cfg, None, n)

    rotary.register_forward_pre_hook(with_length, with_kwargs=True)
    assert rel_err(ours, reference_logits(ref, PROMPT)[0]) < 1e-4
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:5], cache), model.decoder.forward(PROMPT[5:], cache)])
    assert rel_err(pieces, reference_split_logits(ref, PROMPT, 5)) < 1e-4


def test_dbrx_reads_attn_config_and_ffn_config(tmp_path):
    """DBRX's settings come from its attn_config and ffn_config; a Transformers 4-era config (no
    top-level rope_parameters or num_key_value_heads) takes its base from attn_config.rope_theta,
    and Transformers' defaults fill what the objects leave out (kv_n_heads 1, p = 1)."""
    from ster_py.config import spec_from_config
    from test_parity_dense import _config

    build(tmp_path, *CASES["dbrx-clip"])
    spec = load_model(str(tmp_path)).spec
    router = spec.moe.router
    assert (spec.num_key_value_heads, spec.clip_qkv, router.num_experts, router.top_k) == (2, 0.5, 6, 2)
    assert router.renormalize and spec.moe.expert_size == 32 and spec.norm_eps == 1e-5
    cfg = _config(tmp_path)
    legacy = {k: v for k, v in cfg.items() if k not in ("rope_parameters", "num_key_value_heads")}
    legacy["attn_config"] = {"clip_qkv": 8, "rope_theta": 500000}
    legacy["ffn_config"] = {"ffn_hidden_size": 32, "moe_num_experts": 6, "moe_top_k": 2,
                            "ffn_act_fn": {"name": "silu"}}
    spec = spec_from_config(legacy, FAMILIES["dbrx"])
    head_dim = spec.head_dim
    assert spec.num_key_value_heads == 1 and spec.moe.router.renormalize
    np.testing.assert_allclose(spec.layers[0].rope.inv_freq[1], 500000.0 ** (-2 / head_dim))
    legacy["ffn_config"]["moe_normalize_expert_weights"] = None
    assert not spec_from_config(legacy, FAMILIES["dbrx"]).moe.router.renormalize


def test_granite_moe_specs_show_their_features(tmp_path):
    build(tmp_path / "s", *CASES["granitemoe_swa-shared"])
    spec = load_model(str(tmp_path / "s")).spec
    assert [layer.sliding_window for layer in spec.layers] == [None, 5, 5, None] and spec.sinks
    assert spec.layers[2].rope is None and spec.moe.shared_size == 40 and spec.moe.router.renormalize
    assert spec.residual_scale == 0.5 and spec.embed_scale == 2.0 and spec.logit_scale == 1 / 3
    build(tmp_path / "n", *CASES["granitemoeshared-no-shared"])
    assert load_model(str(tmp_path / "n")).spec.moe.shared_size == 0


_MOE_REFUSED = {
    "dbrx": ({"ffn_config": {"moe_normalize_expert_weights": 2.0}}, "moe_normalize_expert_weights"),
    "phimoe": ({"num_experts_per_tok": 3, "router_jitter_noise": 0.01}, "two experts per token"),
    "phimoe ": ({"num_experts_per_tok": 2}, "router_jitter_noise"),
    "phimoe  ": ({"router_jitter_noise": 0.01, "rope_parameters": {"rope_type": "yarn", "factor": 2.0}},
                 "long_mscale"),
    "granitemoe_swa": ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
                        "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
                        "layer_rope_theta": [10000.0, 500.0, 50.0]}, "layer_rope_theta"),
}


@pytest.mark.parametrize("key", list(_MOE_REFUSED))
def test_refused_configurations(key, tmp_path):
    """What seed 002 refuses for these families is refused by the gate, naming the feature."""
    from ster_py.errors import SterError
    from ster_py.families import gate

    extra, match = _MOE_REFUSED[key]
    with pytest.raises(SterError, match=match):
        gate({"model_type": key.strip(), **extra}, tmp_path / "config.json")
    accepted = {"dbrx": {"ffn_config": {"moe_normalize_expert_weights": 1}}, "phimoe": {"router_jitter_noise": 0.01},
                "granitemoe_swa": {}}
    assert gate({"model_type": key.strip(), **accepted[key.strip()]}, tmp_path / "config.json")


# ----------------------------------------------------------------------------- group H3


def _layers(spec) -> list[tuple]:
    return [(layer.sliding_window, layer.rope is not None, layer.ffn) for layer in spec.layers]


@pytest.mark.parametrize("case", ["cohere2_moe-sigmoid-shared-dense-rms",
                                  "cohere2_moe-sigmoid-renorm-sum-windowed-prefix"])
def test_cohere2_moe_layers_from_first_k_dense_replace(case, tmp_path):
    """A config that states first_k_dense_replace instead of layer_types / mlp_layer_types gets the layers
    Transformers derives from it: the dense prefix windowed by prefix_dense_sliding_window_pattern and
    rotated when that is 1, the rest by sliding_window_pattern counted from the prefix's end."""
    import json

    config = CASES[case][1]
    build(tmp_path, "cohere2_moe", config)
    stated = load_model(str(tmp_path)).spec
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["layer_types"], cfg["mlp_layer_types"]
    cfg["first_k_dense_replace"] = config["first_k_dense_replace"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert _layers(load_model(str(tmp_path)).spec) == _layers(stated)
    expected = {"cohere2_moe-sigmoid-shared-dense-rms": [(None, True, "dense"), (4, True, "moe"), (None, False, "moe"),
                                                         (4, True, "moe")],
                "cohere2_moe-sigmoid-renorm-sum-windowed-prefix": [(4, True, "dense"), (None, False, "dense"),
                                                                   (4, True, "moe"), (4, True, "moe")]}
    assert _layers(stated) == expected[case]
    assert stated.moe.shared_average == (case == "cohere2_moe-sigmoid-shared-dense-rms")


@pytest.mark.parametrize("case", ["afmoe", "afmoe-mup-scaled-top3-all-routed", "gpt_oss"])
def test_h3_windows_without_layer_types(case, tmp_path):
    """Without layer_types the sliding layers follow the family's rule, as Transformers' config fills
    them in: AFMoE's every global_attn_every_n_layers-th layer attends fully, gpt-oss alternates."""
    import json

    model_type, config = CASES[case]
    build(tmp_path, model_type, config)
    stated = load_model(str(tmp_path)).spec
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["layer_types"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert _layers(load_model(str(tmp_path)).spec) == _layers(stated)


def test_llama4_layers_without_layer_types(tmp_path):
    """Without no_rope_layers, layer_types and moe_layers, Transformers' defaults decide: every
    no_rope_layer_interval-th layer is unrotated and attends fully (with the query temperature),
    the others attend by chunks and norm q/k; every interleave_moe_layer_step-th layer routes."""
    import json

    build(tmp_path, "llama4_text", CASES["llama4_text"][1])
    stated = load_model(str(tmp_path)).spec
    cfg = json.loads((tmp_path / "config.json").read_text())
    for key in ("layer_types", "no_rope_layers", "moe_layers"):
        del cfg[key]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = load_model(str(tmp_path)).spec

    def layers(spec):
        return [(layer.attention_chunk, layer.rope is None, layer.qk_norm, layer.query_temperature, layer.ffn)
                for layer in spec.layers]

    assert layers(spec) == layers(stated) == [(5, False, True, False, "dense"), (5, False, True, False, "moe"),
                                              (5, False, True, False, "dense"), (None, True, False, True, "moe")]
    assert spec.query_temperature == (0.5, 4, 1) and not spec.qk_norm_affine
    cfg["layer_types"] = ["chunked_attention"] * 4
    cfg["attention_chunk_size"] = None
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    from ster_py.errors import SterError

    with pytest.raises(SterError, match="attention_chunk_size"):
        load_model(str(tmp_path))


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("start,T", [(0, 23), (16, 7), (22, 1), (5, 1)])
def test_chunked_attention_equals_its_reference(start, T, window):
    """The chunked path (the kernel once per chunk, over that chunk's keys) against the masked numpy
    definition, with and without a window and sinks, for prompts across chunks and decoded tokens."""
    from ster_py.decoder.attention import attention, attention_reference

    rng = np.random.default_rng(start + T)
    H, KV, D, S = 4, 2, 8, start + T
    k, v = (rng.standard_normal((KV, S, D)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((H, T, D)).astype(np.float32)
    positions = np.arange(start, S)
    for sinks in (None, rng.standard_normal(H).astype(np.float32)):
        kw = dict(scale=0.3, chunk=5, window=window, sinks=sinks)
        np.testing.assert_allclose(attention(q, k, v, positions, **kw), attention_reference(q, k, v, positions, **kw),
                                   rtol=1e-5, atol=1e-6)
    visible = attention_reference(q, k, v, positions, scale=0.3, chunk=5)
    assert not np.allclose(visible, attention_reference(q, k, v, positions, scale=0.3)) or S <= 5


H3_REFUSED = {
    "cohere2_moe": ({"use_qk_norm": True}, "use_qk_norm"),
    "cohere2_moe ": ({"use_gated_activation": False}, "use_gated_activation"),
    "cohere2_moe  ": ({"shared_expert_combination_strategy": "max"}, "shared_expert_combination_strategy"),
    "gpt_oss": ({"quantization_config": {"quant_method": "mxfp4"}}, "mxfp4"),
    "afmoe": ({"sliding_window": 8, "score_func": "softmax"}, "score_func"),
    "afmoe ": ({"sliding_window": 8, "route_norm": False}, "route_norm"),
    "afmoe  ": ({"sliding_window": None}, "sliding_window"),
}


@pytest.mark.parametrize("key", list(H3_REFUSED))
def test_h3_refused_configurations(key, tmp_path):
    """What seed 002 refuses for these families is refused by the gate, naming the feature."""
    from ster_py.errors import SterError
    from ster_py.families import gate

    extra, match = H3_REFUSED[key]
    with pytest.raises(SterError, match=match):
        gate({"model_type": key.strip(), **extra}, tmp_path / "config.json")


# ----------------------------------------------------------------------------- GGUF, via llama.cpp
#
# The same families converted by llama.cpp's own convert_hf_to_gguf.py at F32 must match
# transformers within 1e-3 (whole and through the cache, every tensor read); quantized by
# llama.cpp's own quantizer to Q8_0 and Q4_K_M they must give llama.cpp's logits within 5 % and
# its top-1 token at every position of a 32-token prompt but near-ties (see the test; llama.cpp,
# run out of process, is the oracle there). Widths are
# multiples of 256 so that the experts really are Q4_K (llama.cpp falls back to other types for
# rows of another width). The configurations follow what llama.cpp's graph for each architecture
# does in code (qwen3moe always renormalises, qwen2moe and olmoe never; tests state the same).

WIDE = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, max_position_embeddings=64)
WIDE_EXPERTS = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256)
# A GGUF_CASES config key (read by _wide, not by transformers): zero the rows of every matrix that
# writes the residual stream's router features and sharpen the routers, so that sigmoid routers
# (whose scores are close for moderate logits) keep a wide margin on every layer, not only the first.
FEATURES_ONLY = "_features_only"
GGUF_CASES = {  # name: (model_type, config, legacy config.json keys)
    "mixtral": ("mixtral", dict(WIDE, num_local_experts=6, num_experts_per_tok=2), {}),
    "qwen2moe": ("qwen2_moe", dict(WIDE, **WIDE_EXPERTS, shared_expert_intermediate_size=256), {}),
    "qwen3moe": ("qwen3_moe", dict(WIDE, **WIDE_EXPERTS, norm_topk_prob=True), {}),
    # llama.cpp's olmoe graph is multi-head only (its k norm is hidden_size wide) and never clamps.
    "olmoe": ("olmoe", dict(WIDE, num_key_value_heads=4, num_experts=8, num_experts_per_tok=2), {}),
    # ---- group G2. gpt-oss: llama.cpp always truncates YaRN's ramp (Transformers' gpt-oss default
    # truncate: false does not) and fixes the unit's limit at 7 and alpha at 1.702.
    "gpt-oss": ("gpt_oss", dict(WIDE, intermediate_size=256, num_local_experts=8, num_experts_per_tok=2,
                                sliding_window=5, rope_parameters={
                                    "rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                                    "beta_slow": 1.0, "original_max_position_embeddings": 4096, "truncate": True}), {}),
    # Llama 4: llama.cpp fixes the chunk (8192), the temperature (0.1, 8192) and the unrotated layers (every
    # fourth) in code; routed layers 1 and 3 beside dense ones, a 4th layer without rotation or q/k norm.
    "llama4": ("llama4_text", dict(WIDE, num_hidden_layers=4, intermediate_size_mlp=512, num_local_experts=8,
                                   num_experts_per_tok=2, interleave_moe_layer_step=2, attention_chunk_size=8192,
                                   floor_scale=8192, attn_scale=0.1), {}),
    # AFMoE: llama.cpp always scales the embeddings (mup) and renormalises only when the file says
    # (route_norm, which Transformers 5 no longer saves); 4 layers, since its full-attention layers
    # are every fourth whatever global_attn_every_n_layers was.
    "afmoe": ("afmoe", dict(WIDE, num_hidden_layers=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
                            num_shared_experts=1, num_dense_layers=1, sliding_window=5, mup_enabled=True,
                            route_scale=1.5), {"route_norm": True}),
    # Cohere 2 MoE: sigmoid router, RMS norms, a leading dense layer (full attention, yet rotated),
    # averaged shared experts, and a multi-token-prediction block counted in block_count (none stored:
    # the main pass never runs it).
    "cohere2moe": ("cohere2_moe", dict(WIDE, prefix_dense_intermediate_size=512, num_experts=8, num_experts_per_tok=2,
                                       num_shared_experts=1, expert_selection_fn="sigmoid", norm_topk_prob=True,
                                       rms_norm_eps=1e-5, sliding_window=5,
                                       layer_types=["full_attention", "sliding_attention", "full_attention"],
                                       mlp_layer_types=["dense", "sparse", "sparse"]), {"num_nextn_predict_layers": 1}),
}
# ---- G1: GraniteMoE (-Shared, -SWA), DBRX, PhiMoE, ERNIE 4.5 MoE, HunYuan MoE, GLM-4.5, EXAONE MoE, HY V3,
# Sarvam MoE. llama.cpp's graphs fix in code what Transformers reads from the config (LLAMA_CPP_MOE);
# each configuration below is one both read alike, and the comments name where they part.
_WIDE_GRANITE = dict(WIDE, num_local_experts=6, num_experts_per_tok=2, embedding_multiplier=2.0,
                     residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=3.0)
GGUF_CASES.update({
    "granitemoe": ("granitemoe", dict(_WIDE_GRANITE), {}),
    "granitemoe-shared": ("granitemoeshared", dict(_WIDE_GRANITE, num_experts_per_tok=3, shared_intermediate_size=256),
                          {}),
    # llama.cpp's granite_swa rotates every layer by rope_theta: layer_rope_theta (per-layer bases, 0 for none)
    # is not converted, so the case leaves Transformers' default (rope_theta on every layer).
    "granite_swa-moe-shared": ("granitemoe_swa", dict(_WIDE_GRANITE, num_hidden_layers=4, shared_intermediate_size=256,
                                                      sliding_window=5, layer_types=_SWA_LAYERS), {}),
    # llama.cpp's dbrx always renormalises (moe_normalize_expert_weights is not converted); its converter
    # reads attn_config.rope_theta, Transformers 5 the top-level rope_parameters: both 10000 here.
    "dbrx": ("dbrx", dict(vocab_size=VOCAB, d_model=256, n_heads=4, n_layers=3, max_seq_len=64,
                          attn_config=dict(kv_n_heads=2, clip_qkv=1.0, rope_theta=10000.0),
                          ffn_config=dict(ffn_hidden_size=256, moe_num_experts=6, moe_top_k=2)), {}),
    # Phi-3.5-MoE's released config names its class PhiMoEForCausalLM (the converter's spelling) and
    # states original_max_position_embeddings. llama.cpp's phimoe needs every bias (attention, norms, head)
    # and attends without the sliding window (LLAMA_CPP_ORACLE).
    "phimoe": ("phimoe", dict(WIDE, num_local_experts=6, router_jitter_noise=0.01, attention_bias=True,
                              lm_head_bias=True, sliding_window=5),
               {"architectures": ["PhiMoEForCausalLM"], "original_max_position_embeddings": 64}),
    # The converter writes the shared experts intermediate_size // num_key_value_heads wide (so
    # ERNIE-4.5-21B-A3B's 12288 // 4 = 2 x 1536): 512 // 2 = 1 x 256 here. llama.cpp's graph has no
    # place for use_bias's feed-forward and head biases (its loader refuses such a file).
    "ernie4_5-moe-shared-dense-first": ("ernie4_5_moe", dict(WIDE, intermediate_size=512, moe_num_experts=8, moe_k=3,
                                                             moe_intermediate_size=256, moe_num_shared_experts=1),
                                        {}),
    # llama.cpp's hunyuan-moe and hy_v3 loaders have no attn_output.bias (a file with one is refused):
    # no attention_bias. The converter reads HunYuan's per-layer lists as released configs state them.
    "hunyuan-moe": ("hunyuan_v1_moe", dict(WIDE, num_experts=8, moe_topk=2),
                    {"moe_topk": [2, 2, 2], "moe_intermediate_size": [256] * 3, "num_shared_expert": [1, 1, 1]}),
    # GLM-4.5 with its NextN block stored after the decoder's (blk.3, never run) and q/k norms. (Sigmoid
    # routers scaled above 1 beside q/k norms make these tiny models amplify llama.cpp's 8-bit activation
    # noise past the quantized test's bounds: the scale is covered by exaone-moe and hy_v3.)
    "glm4moe-qk-norm-nextn": ("glm4_moe", dict(WIDE, n_routed_experts=8, num_experts_per_tok=2,
                                               moe_intermediate_size=256, use_qk_norm=True, num_nextn_predict_layers=1),
                              {}),
    "glm4moe-groups-no-renorm-2-shared-bias": ("glm4_moe", dict(WIDE, n_routed_experts=8, num_experts_per_tok=3,
                                                                moe_intermediate_size=256, n_shared_experts=2,
                                                                n_group=4, topk_group=2, norm_topk_prob=False,
                                                                attention_bias=True, partial_rotary_factor=0.25,
                                                                first_k_dense_replace=2, num_nextn_predict_layers=0),
                                               {}),
    # Transformers' EXAONE MoE config has no scoring function, which llama.cpp's exaone-moe requires
    # (K-EXAONE's released config states sigmoid).
    "exaone-moe-window-groups": ("exaone_moe", dict(WIDE, **WIDE_EXPERTS, sliding_window=5,
                                                    layer_types=["sliding_attention", "full_attention",
                                                                 "sliding_attention"],
                                                    mlp_layer_types=["dense", "sparse", "sparse"], n_group=2,
                                                    topk_group=1, routed_scaling_factor=1.3),
                                 {"scoring_func": "sigmoid"}),
    "hy_v3": ("hy_v3", dict(WIDE, **dict(WIDE_EXPERTS, num_experts_per_tok=3), router_scaling_factor=1.7), {}),
    # Sarvam MoE converts to bailingmoe2 under its released class name and key spellings; llama.cpp's
    # bailingmoe2 multiplies the shared width by the shared count again: one shared expert.
    "bailingmoe2-sarvam-groups": ("sarvam_moe", dict(WIDE, num_experts=8, num_experts_per_tok=2,
                                                     moe_intermediate_size=256, num_shared_experts=1, n_group=4,
                                                     topk_group=2, routed_scaling_factor=1.0),
                                  {"architectures": ["SarvamMoEForCausalLM"], "num_experts": 8, "num_shared_experts": 1,
                                   "score_function": "sigmoid"}),
})
# Where llama.cpp's graph is another function than Transformers' model whatever the configuration,
# the F32 file is checked against llama.cpp: why, per case.
LLAMA_CPP_ORACLE = {
    "phimoe": "llama.cpp runs phimoe through its Phi-3 graph: RMS norms plus their biases, a softmax router "
              "renormalised over the chosen two and no sliding window, where Transformers has LayerNorms, "
              "SparseMixer and the window",
}
# ---- group H4 (mellum, minimax-m2, laguna, mimo2, step35; llama.cpp's converter has no FlexOlmo)
GGUF_CASES.update({
    # llama.cpp's mellum routes every layer and rotates its sliding layers by rope.freq_base unscaled:
    # both kinds share one base here (Transformers would rotate them by their own).
    "mellum-window-yarn": ("mellum", dict(WIDE, **WIDE_EXPERTS, sliding_window=5,
                                          layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                          rope_parameters={
        "full_attention": {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0,
                           "original_max_position_embeddings": 16},
        "sliding_attention": {"rope_type": "default", "rope_theta": 50000.0}}), {}),
    # The converter reads MiniMax's own rotary_dim and scoring_func (Transformers 5 saves neither).
    "minimax-m2-rotary-dim": ("minimax_m2", dict(WIDE, rotary_dim=32, num_local_experts=8, num_experts_per_tok=2,
                                                 **{FEATURES_ONLY: True}),
                              {"rotary_dim": 32, "scoring_func": "sigmoid"}),
    # llama.cpp's laguna places sliding layers as [full, sliding, sliding, sliding, ...] and reads no router
    # soft-cap (its converter writes none), so layer_types follow that pattern and the cap stays off.
    "laguna-heads-per-layer-window-yarn": ("laguna", dict(
        WIDE, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256, shared_expert_intermediate_size=256,
        num_attention_heads_per_layer=[4, 8, 4], layer_types=["full_attention", "sliding_attention",
                                                              "sliding_attention"],
        mlp_layer_types=["sparse"] * 3, sliding_window=5, moe_routed_scaling_factor=1.5, rope_parameters={
            "full_attention": {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0,
                               "original_max_position_embeddings": 16, "partial_rotary_factor": 0.5},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}}, **{FEATURES_ONLY: True}), {}),
    # All layers full (Laguna M.1's shape): llama.cpp would place sliding layers by its own pattern whenever
    # the file states a window, so the converter must see none (Transformers' default is 512).
    "laguna-per-element-gate-full": ("laguna", dict(
        WIDE, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=256, shared_expert_intermediate_size=256,
        gating="per-element", mlp_layer_types=["sparse"] * 3, **{FEATURES_ONLY: True}), {"sliding_window": 0}),
    # The converter reads MiMo's hub spellings (Transformers 5 saves none of them). llama.cpp's mimo2 rotates
    # both kinds of layer over one width (rope.dimension_count), so both rotate half of each head here.
    "mimo2-window-value-width": ("mimo_v2_flash", dict(
        WIDE, num_key_value_heads=1, v_head_dim=32, n_routed_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=256, sliding_window=5, layer_types=_FSF, mlp_layer_types=["sparse"] * 3,
        partial_rotary_factor=0.5,  # as the rotations below (the config class's default is 0.334)
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 50000.0,
                                            "partial_rotary_factor": 0.5},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0,
                                               "partial_rotary_factor": 0.5}}, **{FEATURES_ONLY: True}),
        {"hybrid_layer_pattern": [0, 1, 0], "swa_head_dim": 64, "swa_num_attention_heads": 4, "swa_v_head_dim": 32,
         "swa_num_key_value_heads": 2, "topk_method": "noaux_tc", "swa_rope_theta": 1000.0,
         "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0, "partial_rotary_factor": 0.5}}),
    # The hub's spelling, which the converter reads: it takes rope_theta[0] as the full layers' base and
    # rope_theta[1] as the sliding layers' (so layer 0 is full and layer 1 sliding), requires partial rotary
    # factors of 0.5 on full and 1.0 on sliding layers, and writes expert_weights_norm only from
    # norm_expert_weight (llama.cpp does not renormalise without it; Transformers always does).
    "step35-heads-clamps": ("step3p5", {
        **WIDE, "sliding_window": 5, CONFIG_AS_GIVEN: True, FEATURES_ONLY: True, "num_attention_groups": 2,
        "layer_types": ["full_attention", "sliding_attention", "full_attention"],
        "attention_other_setting": {"num_attention_heads": 8, "num_attention_groups": 2}, "moe_layers_enum": "0,1,2",
        "moe_num_experts": 8, "moe_top_k": 2, "moe_intermediate_size": 256, "share_expert_dim": 256,
        "norm_expert_weight": True, "moe_router_activation": "sigmoid",
        "rope_theta": [20000.0, 500.0, 20000.0], "partial_rotary_factors": [0.5, 1.0, 0.5],
        "swiglu_limits": [0, 0.8, 0], "swiglu_limits_shared": [0, 0, 0.6]}, {}),
})
PROMPT = np.random.RandomState(1).randint(3, VOCAB, size=16).tolist()
LONG_PROMPT = np.random.RandomState(3).randint(3, VOCAB, size=32).tolist()


def _wide(path, model_type, config):
    """Like ``tiny.build_checkpoint`` (std 0.15 * 0.25 for 256-wide layers), with routing made
    decisive: token t's embedding carries a strong feature at expert (t mod E) and a weaker one
    at ((3t + 1) mod E), no sublayer writes into those E residual columns (the rows of every
    output projection there are zero), and the routers read them. Random routing has near-ties
    between the k-th and (k+1)-th expert at some token of every prompt, where llama.cpp's 8-bit
    activations and ster's arithmetic may choose differently and then differ by a whole expert;
    here every choice, in every layer, has a wide margin, the experts stay distinct and random,
    and every expert serves some token."""
    import json

    import torch

    config = dict(config)
    features_only = config.pop(FEATURES_ONLY, False)
    model = build(path, model_type, config)
    inputs_first = FAMILIES[model_type].expert_inputs_first
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim > 1 and "norm" not in name:
                p.mul_(0.25)
        emb = (model if hasattr(model, "get_input_embeddings") else model.model).get_input_embeddings().weight
        n = next(p.shape[0] for name, p in model.named_parameters()
                 if name.endswith(ROUTER_SUFFIXES) and p.ndim == 2)
        sigma = float(emb.std())
        emb[:, :n] = 0.0
        for t in range(emb.shape[0]):
            emb[t, t % n] += 12 * sigma
            emb[t, (3 * t + 1) % n] += 8 * sigma
        for name, p in model.named_parameters():
            if name.endswith(ROUTER_SUFFIXES) and p.ndim == 2:
                p.mul_(0.02)
                p[:, :n] += torch.eye(n) * 2.0
            elif any(w in name for w in RESIDUAL_WRITERS):  # the hidden axis of each writer's output
                axis = (2 if "exp_down" in inputs_first else 1) if p.ndim == 3 else p.ndim - 1 if "_bias" in name else 0
                p.narrow(axis, 0, n).zero_()
        if features_only:  # no sublayer writes the routers' features: every layer routes as layer 0 does
            for name, p in model.named_parameters():
                if p.ndim > 1 and p.shape[-2] == emb.shape[1] and not name.endswith(ROUTER_SUFFIXES):
                    p[..., :n, :] = 0.0
                elif name.endswith(ROUTER_SUFFIXES) and p.ndim == 2:
                    p[:, :n] *= 5.0  # saturated sigmoids for the chosen experts, 0.5 for the others
    if hasattr(model, "save_hub_layout"):  # Step 3.5 (tiny.step3p5_causal_lm), its config.json as built
        model.save_hub_layout(path, json.loads((path / "config.json").read_text()))
    else:
        model.save_pretrained(path)
    if config.get("num_nextn_predict_layers"):
        _add_nextn_blocks(path, config["num_hidden_layers"], config["num_nextn_predict_layers"])
    return model


def _add_nextn_blocks(path, n_layers: int, n_nextn: int) -> None:
    """Store the NextN (multi-token prediction) blocks a config declares, as released GLM-4.5
    checkpoints do after their decoder layers (Transformers neither builds nor saves them): each a
    copy of the last decoder layer plus its eh_proj, enorm, hnorm and shared_head.norm."""
    import torch
    from safetensors.torch import load_file, save_file

    file = path / "model.safetensors"
    tensors = load_file(file)
    last = f"model.layers.{n_layers - 1}."
    d = tensors["model.embed_tokens.weight"].shape[1]
    g = torch.Generator().manual_seed(7)
    for k in range(n_layers, n_layers + n_nextn):
        block = f"model.layers.{k}."
        tensors.update({block + name[len(last):]: t.clone() for name, t in tensors.items() if name.startswith(last)})
        tensors[block + "eh_proj.weight"] = torch.randn(d, 2 * d, generator=g) * 0.05
        for norm in ("enorm", "hnorm", "shared_head.norm"):
            tensors[f"{block}{norm}.weight"] = torch.ones(d)
    save_file(tensors, file, metadata={"format": "pt"})


# The router's weight in each family's transformers module naming.
ROUTER_SUFFIXES = ("block_sparse_moe.gate.weight", "mlp.gate.weight", "mlp.router.weight", "mlp.router.gate.weight",
                   "feed_forward.router.weight", "router.layer.weight", "block_sparse_moe.router.weight",
                   "gate.wg.weight")
# The projections whose output is added to the residual stream (attention's, dense and expert feed-forwards').
RESIDUAL_WRITERS = ("o_proj", "down_proj", ".w2")


@pytest.fixture(scope="module")
def moe_gguf(tmp_path_factory):
    """name -> (converted F32 .gguf, transformers model) for every case of GGUF_CASES."""
    from llamacpp_convert import convert_cases

    return convert_cases(tmp_path_factory.mktemp("llama_cpp_moe"), GGUF_CASES, _wide)


def _config_layers(path, name) -> list[str]:
    """Each layer's feed-forward kind as ster reads the case's config.json (dense or routed)."""
    import json

    from ster_py.config import spec_from_config

    config = json.loads((path.parent / "hf" / name / "config.json").read_text())
    return [layer.ffn for layer in spec_from_config(config, FAMILIES[config["model_type"]]).layers]


@pytest.mark.parametrize("name", list(GGUF_CASES))
def test_gguf_matches_transformers(name, moe_gguf):
    """The F32 file against transformers on the checkpoint it was converted from; where llama.cpp's
    graph computes another function than Transformers' model (``LLAMA_CPP_ORACLE``), against
    llama.cpp on the file (what the file means), Transformers being asserted to differ."""
    from tiny import reference_logits, reference_split_logits, rel_err

    path, ref_model = moe_gguf[name]
    model = load_model(str(path))
    assert model.spec.moe is not None and [layer.ffn for layer in model.spec.layers] == _config_layers(path, name)
    if name not in LLAMA_CPP_ORACLE:  # the file alone gives the layers the checkpoint's config.json gives
        hf = load_model(str(path.parent / "hf" / name)).spec
        assert [_layer_shape(layer) for layer in model.spec.layers] == [_layer_shape(layer) for layer in hf.layers]
        assert (model.spec.query_temperature, model.spec.embed_scale) == (hf.query_temperature, hf.embed_scale)
    ours = model.decoder.forward(PROMPT)
    ref = reference_logits(ref_model, PROMPT)[0]
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:9], cache), model.decoder.forward(PROMPT[9:], cache)])
    if name in LLAMA_CPP_ORACLE:
        from ster_py import llamacpp

        assert rel_err(ours, ref) > 0.05  # Transformers' model is another function
        (ref,) = llamacpp.logits(path, [PROMPT])
        ref = ref[:, :ours.shape[1]]
        assert rel_err(pieces, ours) < 1e-5
    else:
        assert rel_err(pieces, reference_split_logits(ref_model, PROMPT, 9)) < 1e-3
    err = rel_err(ours, ref)
    assert err < 1e-3, f"logits rel err {err:.2e}"
    assert model.decoder._weights.unused_tensors(model.spec) == []


@pytest.mark.parametrize("name", list(GGUF_CASES))
def test_gguf_dir_matches_transformers(name, moe_gguf, tmp_path):
    """config.json + tokenizer.json + the converted .gguf: the config decides the model (PhiMoE's
    LayerNorms and SparseMixer, DBRX's settings in attn_config), the GGUF holds the weights under
    llama.cpp's names and layout (every expert stack [n_expert, out, in])."""
    import shutil

    from tiny import reference_logits, rel_err

    path, ref_model = moe_gguf[name]
    hf = path.parent / "hf" / name
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf / f, tmp_path / f)
    (tmp_path / "model.gguf").symlink_to(path)
    if name in SAVED_CONFIG_DIFFERS:  # write the rotations the model was built with back into config.json
        import json

        cfg = json.loads((tmp_path / "config.json").read_text())
        (tmp_path / "config.json").write_text(json.dumps(dict(cfg, rope_parameters=ref_model.config.rope_parameters)))
    model = load_model(str(tmp_path))
    assert model.resolved.kind == "gguf_dir"
    err = rel_err(model.decoder.forward(PROMPT), reference_logits(ref_model, PROMPT)[0])
    assert err < 1e-3, f"logits rel err {err:.2e}"
    assert model.decoder._weights.unused_tensors(model.spec) == []


# Transformers 5.24 saves MiMo-V2-Flash's per-layer-type rope_parameters as one flat set (the full
# layers'), which its own loader then cannot read: the saved config.json describes another model
# than the one built in memory.
SAVED_CONFIG_DIFFERS = {"mimo2-window-value-width"}


def _layer_shape(layer) -> tuple:
    return (layer.ffn, layer.sliding_window, layer.rope is None, layer.attention_chunk, layer.qk_norm,
            layer.query_temperature)


# llama.cpp's expert types per file type (Q4_K_M keeps some at Q6_K; MXFP4_MOE: experts MXFP4, the rest Q8_0).
EXPERT_TYPES = {"Q8_0": {"Q8_0"}, "Q4_K_M": {"Q4_K", "Q5_K", "Q6_K"}, "MXFP4_MOE": {"MXFP4"}}
QUANTIZED_CASES = [(name, ftype) for name in GGUF_CASES for ftype in ("Q8_0", "Q4_K_M")] + [("gpt-oss", "MXFP4_MOE")]


@pytest.mark.parametrize("name, ftype", QUANTIZED_CASES)
def test_quantized_gguf_gives_llamacpps_top1(name, ftype, moe_gguf, tmp_path):
    from ster_py import llamacpp
    from ster_py.decoder.qlinear import QUANT_TYPES, QuantTensor
    from ster_py.gguf.reader import GGUFFile

    path, _ = moe_gguf[name]
    q = llamacpp.quantize(path, tmp_path / f"{name}-{ftype}.gguf", ftype)
    types = {t.type_name for n, t in GGUFFile(q).tensors.items() if "_exps.weight" in n}
    assert types and types <= EXPERT_TYPES[ftype], types
    model = load_model(str(q))
    experts = next(layer.ffn.experts for layer, spec in zip(model.decoder.layers, model.spec.layers) if spec.ffn == "moe")
    # kept in their blocks where a kernel multiplies the type
    assert all((type(e.gate.weight) is QuantTensor) == (types <= set(QUANT_TYPES)) for e in experts)
    ours = model.decoder.forward(LONG_PROMPT)
    (ref,) = llamacpp.logits(q, [LONG_PROMPT])
    ref = ref[:, :ours.shape[1]]
    rel = np.linalg.norm(ours - ref) / np.linalg.norm(ref)
    assert rel < 0.05, rel   # llama.cpp's 8-bit activations: ~1-4 % on these models
    # Top-1: the same token at every position, except where llama.cpp's own top two are closer
    # than three times the rms difference the two implementations' logits show over the prompt,
    # taken for a difference of two logits (sqrt(2) times that of one; three standard deviations:
    # a random model ties somewhere in 32 positions, and neither side's arithmetic can settle such
    # a tie). A position that differs by more, e.g. a token routed to other experts (a local error
    # several times the prompt's rms), fails.
    mine, theirs = ours.argmax(1), ref.argmax(1)
    rows = np.arange(len(mine))
    margin = ref[rows, theirs] - ref[rows, mine]
    noise = np.sqrt(2 * np.mean((ours - ref) ** 2))
    assert np.all((mine == theirs) | (margin <= 3 * noise)), (np.nonzero(mine != theirs), margin, noise)
    assert (mine == theirs).mean() >= 0.8  # and most positions are no near-tie at all
    # and decoding token by token through the cache gives the same logits as the whole prompt
    cache = model.decoder.new_cache()
    steps = np.concatenate([model.decoder.forward([t], cache) for t in LONG_PROMPT])
    assert np.abs(steps - ours).max() <= 1e-3 * np.abs(ours).max()


def test_llama4_gguf_facts_llamacpp_fixes_in_code(moe_gguf):
    """llama.cpp's llama4 graph switches the L2 q/k norms off for the 128-expert model and cannot run a
    file without chunked attention (sliding_window 0); ster reads the same from the file alone."""
    from ster_py.gguf.config import spec_from_gguf
    from ster_py.gguf.reader import GGUFFile

    path, _ = moe_gguf["llama4"]
    f = GGUFFile(path)
    meta, tensors = dict(f.metadata), {n: t.shape for n, t in f.tensors.items()}
    assert spec_from_gguf(meta, str(path), tensors=tensors).qk_norm == "head"
    assert spec_from_gguf({**meta, "llama4.expert_count": 128}, str(path), tensors=tensors).qk_norm is None
    with pytest.raises(SterError, match="without chunked attention"):
        spec_from_gguf({**meta, "llama4.attention.sliding_window": 0}, str(path), tensors=tensors)


def test_every_moe_gguf_architecture_has_a_case():
    import test_parity_hc_gguf  # group DS4: DeepSeek-V4's deepseek4
    import test_parity_remote  # families without a Transformers implementation
    import test_parity_wrapped_gguf  # MiniMax-M3's minimax-m3

    converted = {FAMILIES[model_type].gguf_arch for model_type, _, _ in
                 list(GGUF_CASES.values()) + list(test_parity_remote.GGUF_CASES.values())
                 + list(test_parity_wrapped_gguf.GGUF_CASES.values())
                 + list(test_parity_hc_gguf.DS4_GGUF_CASES.values())}
    declared = {f.gguf_arch for f in FAMILIES.values()
                if f.moe and f.gguf_arch and not f.latent and not f.recurrent}  # test_parity_mla, _ssm
    assert declared <= converted


def _moe_meta(arch: str, blocks: int = 3, **extra) -> tuple[dict, dict]:
    """Minimal GGUF metadata and tensor shapes of a routed model (every block routes)."""
    meta = {"general.architecture": arch, f"{arch}.block_count": blocks, f"{arch}.embedding_length": 64,
            f"{arch}.attention.head_count": 4, f"{arch}.attention.head_count_kv": 2,
            f"{arch}.feed_forward_length": 96, f"{arch}.expert_count": 8, f"{arch}.expert_used_count": 2,
            **{f"{arch}.{k}": v for k, v in extra.items()}}
    tensors = {f"blk.{i}.ffn_gate_inp.weight": (8, 64) for i in range(blocks)}
    return meta, tensors


def test_gguf_metadata_llama_cpp_reads_for_moe_architectures():
    """What llama.cpp's loaders and graphs read or fix per architecture, from metadata alone."""
    from ster_py.gguf.config import spec_from_gguf

    def spec(arch, tensors_extra=None, **extra):
        meta, tensors = _moe_meta(arch, **extra)
        return spec_from_gguf(meta, "m.gguf", vocab_size=VOCAB, tensors={**tensors, **(tensors_extra or {})})

    # NextN blocks are counted in block_count and never run; per-layer arrays may cover them
    s = spec("granite_swa", blocks=5, nextn_predict_layers=1, **{
        "attention.sliding_window": 4, "attention.sliding_window_pattern": [False, True, True, True, False],
        "attention.rope_pattern": [True, False, True, True, True], "logit_scale": 1.0})
    assert s.num_hidden_layers == 4 and s.unread == ("blk.4.",)
    assert [layer.sliding_window for layer in s.layers] == [None, 4, 4, 4]
    assert [layer.rope is not None for layer in s.layers] == [True, False, True, True]
    # softmax renormalised in code, whatever the file says; glm4moe and hy_v3 default to sigmoid
    assert spec("phimoe", expert_gating_func=2, expert_weights_norm=False).moe.router.scoring == "softmax"
    assert spec("dbrx", expert_weights_norm=False).moe.router.renormalize
    assert spec("glm4moe").moe.router.scoring == "sigmoid" and not spec("glm4moe").moe.router.renormalize
    assert spec("hy_v3", tensors_extra={"blk.1.exp_probs_b": (8,)}).moe.router.select_bias
    # hunyuan-moe builds its experts feed_forward_length wide
    assert spec("hunyuan-moe", expert_feed_forward_length=32).moe.expert_size == 96


GGUF_REFUSED = {
    "exaone-moe": ({}, "expert_gating_func"),
    "bailingmoe2": ({}, "expert_gating_func"),
    "phimoe": ({"rope.scaling.attn_factor": 1.19, "expert_gating_func": 1}, "LongRoPE"),
    "glm4moe": ({"nextn_predict_layers": 3}, "nextn_predict_layers"),
    "granite_swa": ({"attention.rope_pattern": [True, False], "logit_scale": 1.0}, "rope_pattern"),
}


@pytest.mark.parametrize("arch", list(GGUF_REFUSED))
def test_gguf_metadata_ster_cannot_honour_is_refused(arch):
    from ster_py.gguf.config import spec_from_gguf

    extra, match = GGUF_REFUSED[arch]
    meta, tensors = _moe_meta(arch, **extra)
    with pytest.raises(SterError, match=match):
        spec_from_gguf(meta, "m.gguf", vocab_size=VOCAB, tensors=tensors)


# ---- group H4: where llama.cpp reads a converted file otherwise than Transformers runs the checkpoint,
# the GGUF means what llama.cpp computes: ster follows llama.cpp's F32 logits, not Transformers'.
H4_DISAGREEING = {
    # mellum.cpp rotates sliding layers by rope.freq_base, whatever rope.freq_base_swa says
    "mellum-sliding-base": ("mellum", dict(WIDE, **WIDE_EXPERTS, sliding_window=5, layer_types=_FSF,
                                           rope_parameters={"full_attention": {"rope_type": "default",
                                                                               "rope_theta": 50000.0},
                                                            "sliding_attention": {"rope_type": "default",
                                                                                  "rope_theta": 100.0}}), {}),
    # laguna.cpp places sliding layers by its own pattern once the file states a window (Transformers'
    # default of 512 here, over layers Transformers runs all full)
    "laguna-window-all-full": ("laguna", dict(WIDE, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
                                              shared_expert_intermediate_size=256, mlp_layer_types=["sparse"] * 3,
                                              **{FEATURES_ONLY: True}), {}),
    # step35.cpp renormalises the chosen weights only when the file says so (norm_expert_weight absent here)
    "step35-unnormalised": ("step3p5", {
        **WIDE, "sliding_window": 5, CONFIG_AS_GIVEN: True, FEATURES_ONLY: True, "num_attention_groups": 2,
        "layer_types": _FSF, "moe_layers_enum": "0,1,2", "moe_num_experts": 8, "moe_top_k": 2,
        "moe_intermediate_size": 256, "share_expert_dim": 256, "rope_theta": [20000.0, 500.0, 20000.0],
        "partial_rotary_factors": [0.5, 1.0, 0.5]}, {}),
}


@pytest.fixture(scope="module")
def h4_disagreeing(tmp_path_factory):
    from llamacpp_convert import convert_cases

    return convert_cases(tmp_path_factory.mktemp("llama_cpp_h4"), H4_DISAGREEING, _wide)


@pytest.mark.parametrize("name", list(H4_DISAGREEING))
def test_gguf_follows_llamacpp_where_transformers_differs(name, h4_disagreeing):
    from ster_py import llamacpp
    from tiny import reference_logits, rel_err

    path, ref_model = h4_disagreeing[name]
    ours = load_model(str(path)).decoder.forward(PROMPT)
    (theirs,) = llamacpp.logits(path, [PROMPT])
    assert rel_err(ours, theirs[:, :ours.shape[1]]) < 2e-3
    assert rel_err(ours, reference_logits(ref_model, PROMPT)[0]) > 0.05  # the case does disagree


def _h4_file(moe_gguf, name):
    from ster_py.gguf.reader import GGUFFile

    path, _ = moe_gguf[name]
    f = GGUFFile(path)
    return dict(f.metadata), {n: t.shape for n, t in f.tensors.items()}, str(path)


def test_h4_gguf_metadata_refused_by_name(moe_gguf):
    """What llama.cpp would stop on or ster cannot run is refused naming the key."""
    from ster_py.gguf.config import spec_from_gguf

    meta, tensors, path = _h4_file(moe_gguf, "minimax-m2-rotary-dim")
    del meta["minimax-m2.expert_gating_func"]
    with pytest.raises(SterError, match="expert_gating_func"):
        spec_from_gguf(meta, path, tensors=tensors)
    meta, tensors, path = _h4_file(moe_gguf, "step35-heads-clamps")
    del tensors["blk.0.ffn_gate_inp.weight"]  # layer 0 dense, its feed-forward clamped
    meta["step35.swiglu_clamp_shexp"] = np.array([0.5, 0.0, 0.6], np.float32)
    with pytest.raises(SterError, match="dense layer"):
        spec_from_gguf(meta, path, tensors=tensors)
    meta, tensors, path = _h4_file(moe_gguf, "step35-heads-clamps")
    meta["step35.attention.head_count"] = np.array([4, 8], np.int32)
    with pytest.raises(SterError, match="each of the 3 layers"):
        spec_from_gguf(meta, path, tensors=tensors)
    meta, tensors, path = _h4_file(moe_gguf, "laguna-heads-per-layer-window-yarn")
    tensors["blk.1.attn_gate.weight"] = (8 * 64, 256)  # per element on one layer only
    with pytest.raises(SterError, match="per head on some layers"):
        spec_from_gguf(meta, path, tensors=tensors)
    meta, tensors, path = _h4_file(moe_gguf, "mimo2-window-value-width")
    meta["mimo2.nextn_predict_layers"] = 6
    with pytest.raises(SterError, match="nextn_predict_layers"):
        spec_from_gguf(meta, path, tensors=tensors)


def test_h4_gguf_layers_as_llamacpp_reads_them(moe_gguf):
    """The multi-token-prediction layers block_count counts are not run (nor reported unused); a file
    without a sliding pattern places sliding layers by llama.cpp's default pattern; without gate tensors,
    Step 3.5's attention is ungated."""
    from ster_py.gguf.config import spec_from_gguf

    meta, tensors, path = _h4_file(moe_gguf, "mimo2-window-value-width")
    spec = spec_from_gguf(meta, path, tensors=tensors)
    assert meta["mimo2.block_count"] == 6 and spec.num_hidden_layers == 3 and spec.unread == ("blk.3.", "blk.4.",
                                                                                              "blk.5.")
    assert [layer.num_key_value_heads for layer in spec.layers] == [None, 2, None]
    meta, tensors, path = _h4_file(moe_gguf, "mellum-window-yarn")
    del meta["mellum.attention.sliding_window_pattern"]
    meta["mellum.block_count"] = 4
    spec = spec_from_gguf(meta, path, tensors=tensors)
    assert [layer.sliding_window for layer in spec.layers] == [5, 5, 5, None]
    meta["mellum.rope.freq_base_swa"] = 100.0  # read by llama.cpp, never used by its mellum graph
    spec = spec_from_gguf(meta, path, tensors=tensors)
    assert np.isclose(spec.layers[0].rope.inv_freq[1], 50000.0 ** (-2 / 64))  # freq_base, unscaled
    meta, tensors, path = _h4_file(moe_gguf, "step35-heads-clamps")
    assert spec_from_gguf(meta, path, tensors=tensors).attn_gate == "sigmoid"
    for i in range(3):
        del tensors[f"blk.{i}.attn_gate.weight"]
    assert spec_from_gguf(meta, path, tensors=tensors).attn_gate is None


# ----------------------------------------------------------------------------- expert kernels


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                                       "IQ4_NL", "IQ4_XS", "MXFP4"])
def test_quantized_experts_equal_their_numpy_reference(type_name):
    """A routed layer over quantized [n_expert, rows, cols] stacks (as a GGUF holds them) against
    the float64 numpy definition on gguf-py's dequantized weights; the routing leaves experts
    unused (8 experts, 3 tokens x 2 chosen) and decoded tokens take the one-token path."""
    import zlib

    from ster_py.decoder.ffn import DenseFFN
    from ster_py.decoder.linear import Linear
    from ster_py.decoder.moe import MoE, MoESpec
    from ster_py.decoder.qlinear import QuantLinear, QuantStack
    from ster_py.gguf import quants
    from ster_py._kernels import qmatmul
    from test_qmatmul import oracle_weights, random_blocks

    rng = np.random.default_rng(zlib.crc32(type_name.encode()))
    E, H, F = 8, 256, 256
    t = quants.ggml_type(type_name)

    class Stack:  # the GGUFTensor attributes QuantStack reads
        def __init__(self, raw, rows, cols, name):
            self.name, self.ggml_type, self.type_name, self.shape = name, t.id, t.name, (E, rows, cols)
            self.raw_rows, self.row_bytes, self.raw = raw, raw.shape[1], raw.reshape(-1)

    stacks, dense = {}, {}
    for role, rows, cols in (("gate", F, H), ("up", F, H), ("down", H, F)):
        raw = random_blocks(type_name, E * rows, cols, rng)
        stacks[role] = QuantStack(Stack(raw, rows, cols, role))
        dense[role] = oracle_weights(raw, type_name, E * rows, cols).reshape(E, rows, cols) * 0.05
        raw_scaled = None  # noqa: F841 (the 0.05 scale is applied to the input below instead)
    spec = MoESpec(RouterSpec(E, 2, renormalize=True), expert_size=F)
    router_w = rng.standard_normal((E, H)).astype(np.float32)
    experts = [DenseFFN(*(QuantLinear(stacks[r][e]) for r in ("gate", "up", "down")), "silu") for e in range(E)]
    layer = MoE(spec, Linear(router_w), None, experts)
    x = (rng.standard_normal((3, H)) * 0.05).astype(np.float32)

    def reference(x):
        ids, w = route(spec.router, x @ router_w.T)
        out = np.zeros(x.shape, np.float64)
        for tok in range(x.shape[0]):
            for e, wt in zip(ids[tok], w[tok]):
                g = x[tok].astype(np.float64) @ (dense["gate"][e] / 0.05).T
                u = x[tok].astype(np.float64) @ (dense["up"][e] / 0.05).T
                out[tok] += wt * ((g / (1 + np.exp(-g)) * u) @ (dense["down"][e] / 0.05).T)
        return out, ids

    want, ids = reference(x)
    assert len(np.unique(ids)) < E  # some experts get no token
    qmatmul.set_int16_activations(False)
    try:
        got = layer(x)  # prefill: tokens grouped by expert
        steps = np.concatenate([layer(x[i:i + 1]) for i in range(3)])  # decode: one token at a time
    finally:
        qmatmul.set_int16_activations(True)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 2e-4 * scale
    assert np.abs(steps - want).max() <= 2e-4 * scale
# ----------------------------------------------------------------------------- group H2: routers, readers, refusals


@pytest.mark.parametrize("floor", [1e-12, 0.8])
def test_route_equals_ernie4_5_router(floor):
    """Softmax scores, moe_statics' bias added to choose only, weights over their sum raised to at
    least moe_norm_min: the same experts and weights as transformers' ERNIE 4.5 router."""
    import torch
    from transformers import AutoConfig
    from transformers.models.ernie4_5_moe.modeling_ernie4_5_moe import Ernie4_5_MoeTopKRouter

    torch.manual_seed(0)
    cfg = AutoConfig.for_model("ernie4_5_moe", hidden_size=32, moe_num_experts=12, moe_k=4, moe_norm_min=floor)
    router = Ernie4_5_MoeTopKRouter(cfg)
    bias = router.moe_statics.e_score_correction_bias
    with torch.no_grad():
        router.weight.copy_(torch.randn_like(router.weight) * 0.3)  # the 0.8 floor binds on about half
        bias.copy_(torch.randn_like(bias) * 0.05)
        logits, ref_w, ref_ids = router(torch.randn(40, 32))
    spec = RouterSpec(12, 4, select_bias=True, renormalize=True, renorm_min=floor)
    ids, w = route(spec, logits.numpy(), bias.numpy().reshape(-1))
    assert np.array_equal(ids, ref_ids.numpy())  # both sorted by choice score, largest first
    np.testing.assert_allclose(w, ref_w.numpy(), rtol=1e-6)


def _spec(model_type: str, **config):
    from ster_py.config import spec_from_config

    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
    config = {k: v for k, v in {"model_type": model_type, **base, **config}.items() if v is not None}  # None: unstated
    return spec_from_config(config, FAMILIES[model_type])


def test_h2_configs_read_transformers_defaults():
    """What Transformers' config classes fill in when a config.json leaves a key out."""
    glm = _spec("glm4_moe")  # partial_rotary_factor 0.5, first layer dense, renormalised, one shared expert
    assert glm.layers[0].rope.rotary_dim == 8 and [layer.ffn for layer in glm.layers] == ["dense", "moe", "moe"]
    assert glm.moe.router.renormalize and glm.moe.shared_size == 32 and glm.qk_norm is None
    hy = _spec("hy_v3")  # no mlp_layer_types: only the first layer is dense; router_scaling_factor 2.826
    assert [layer.ffn for layer in hy.layers] == ["dense", "moe", "moe"] and hy.moe.router.scale == 2.826
    ernie = _spec("ernie4_5_moe", moe_num_experts=8, moe_k=2)  # routed from layer 1 on, floor 1e-12, 2 shared
    assert [layer.ffn for layer in ernie.layers] == ["dense", "moe", "moe"]
    assert ernie.moe.router.renorm_min == 1e-12 and ernie.moe.shared_size == 64 and ernie.tie_word_embeddings
    sarvam = _spec("sarvam_moe", head_dim=None)  # unstated head_dim is 64 (not hidden / heads); scale 2.5
    assert sarvam.head_dim == 64 and sarvam.moe.router.scale == 2.5 and sarvam.qk_norm == "head"
    exaone = _spec("exaone_moe")  # sliding_window 4096 on all but every fourth layer; first layer dense
    assert [layer.sliding_window for layer in exaone.layers] == [4096] * 3
    hunyuan = _spec("hunyuan_v1_moe", moe_topk=[2, 2, 2], num_experts=[8, 8, 8])  # one value per layer: fine
    assert hunyuan.moe.router.top_k == 2 and hunyuan.moe.expert_size == hunyuan.moe.shared_size == 96


def test_per_layer_moe_counts_that_differ_are_refused():
    with pytest.raises(SterError, match="moe_topk lists different values per layer"):
        _spec("hunyuan_v1_moe", moe_topk=[2, 2, 4])
    with pytest.raises(SterError, match="different values per layer"):
        _spec("hunyuan_v1_moe", num_experts=[8, 6, 8])


H2_REFUSED = {
    "hunyuan-cla": ("hunyuan_v1_moe", dict(use_cla=True), "cross-layer attention"),
    "hunyuan-mla": ("hunyuan_v1_moe", dict(use_mla=True), "latent attention"),
    "hunyuan-no-qk-norm": ("hunyuan_v1_moe", dict(use_qk_norm=False), "use_qk_norm"),
    "hunyuan-no-shared": ("hunyuan_v1_moe", dict(use_mixed_mlp_moe=False), "use_mixed_mlp_moe"),
    "hunyuan-skipped": ("hunyuan_v1_moe", dict(moe_layer_num_skipped=1), "moe_layer_num_skipped"),
    "hunyuan-2-shared": ("hunyuan_v1_moe", dict(num_shared_expert=[2, 2]), "num_shared_expert"),
    "hunyuan-expert-width": ("hunyuan_v1_moe", dict(intermediate_size=96, moe_intermediate_size=[32, 32]),
                             "moe_intermediate_size"),
    "hy_v3-route-norm": ("hy_v3", dict(route_norm=False), "route_norm"),
    "hy_v3-softmax": ("hy_v3", dict(moe_router_use_sigmoid=False), "moe_router_use_sigmoid"),
    "hy_v3-no-bias": ("hy_v3", dict(moe_router_enable_expert_bias=False), "moe_router_enable_expert_bias"),
    "hy_v3-no-qk-norm": ("hy_v3", dict(qk_norm=False), "qk_norm"),
    "hy_v3-first-k": ("hy_v3", dict(first_k_dense_replace=2), "first_k_dense_replace"),
    "sarvam-softmax": ("sarvam_moe", dict(score_function="softmax"), "score_function"),
    "sarvam-no-bias": ("sarvam_moe", dict(moe_router_enable_expert_bias=False), "moe_router_enable_expert_bias"),
    "sarvam-dense-bias": ("sarvam_moe", dict(use_bias=True), "use_bias"),
}


@pytest.mark.parametrize("key", list(H2_REFUSED))
def test_h2_refusals(key, tmp_path):
    model_type, extra, match = H2_REFUSED[key]
    with pytest.raises(SterError, match=match):
        gate({"model_type": model_type, **extra}, tmp_path / "config.json")


def test_h2_accepted_configs_pass_the_gate(tmp_path):
    ok = [("hunyuan_v1_moe", dict(intermediate_size=96, moe_intermediate_size=[96, 96], num_shared_expert=[1, 1],
                                  moe_layer_num_skipped=0, use_mixed_mlp_moe=True, use_qk_norm=True)),
          ("hy_v3", dict(first_k_dense_replace=2, mlp_layer_types=["dense", "dense", "sparse"], route_norm=True)),
          ("sarvam_moe", dict(score_function="sigmoid", moe_router_enable_expert_bias=True, use_bias=False))]
    for model_type, extra in ok:
        assert gate({"model_type": model_type, **extra}, tmp_path / "config.json").model_type == model_type


def test_h2_refusal_comes_before_any_weight(tmp_path):
    import json

    build(tmp_path, "hunyuan_v1_moe", CASES["hunyuan_v1_moe-bias"][1])
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, moe_topk=[2, 3, 2])))
    (tmp_path / "model.safetensors").write_bytes(b"corrupt: proves nothing reads it")
    with pytest.raises(SterError, match="different values per layer"):
        load_model(str(tmp_path))


def test_llama4_wrapper_runs_its_text_decoder(tmp_path):
    """A llama4 checkpoint (Llama4ForConditionalGeneration) runs the llama4_text decoder its text_config
    describes, read from below language_model; its vision tower and projector are never read."""
    from transformers import Llama4Config, Llama4ForConditionalGeneration

    import torch
    from tiny import write_tokenizer

    torch.manual_seed(0)
    text = dict(CASES["llama4_text"][1], bos_token_id=1, eos_token_id=2, pad_token_id=0)
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                  vision_output_dim=32, image_size=28, patch_size=14, projector_input_dim=32, projector_output_dim=32)
    model = Llama4ForConditionalGeneration(Llama4Config(text_config=text, vision_config=vision)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.15 if p.ndim > 1 else 0.1) + (1.0 if "norm" in name else 0.0))
    model.save_pretrained(tmp_path)
    write_tokenizer(tmp_path, VOCAB)
    loaded = _check(tmp_path, model.language_model)  # the wrapper's own forward needs an image in Transformers 5.24
    assert loaded.spec.model_type == "llama4_text" and loaded.spec.names["q"].startswith("language_model.model.")


def test_wrapper_without_text_config_is_refused(tmp_path):
    from ster_py.errors import SterError
    from ster_py.families import unwrap

    with pytest.raises(SterError, match="text_config"):
        unwrap({"model_type": "llama4"}, tmp_path / "config.json")
    inner, prefix = unwrap({"model_type": "llama4", "eos_token_id": 7, "tie_word_embeddings": True,
                            "text_config": {"eos_token_id": None, "hidden_size": 8}}, tmp_path / "config.json")
    assert prefix == "language_model." and inner["model_type"] == "llama4_text"
    assert inner["eos_token_id"] == 7 and inner["tie_word_embeddings"] and inner["hidden_size"] == 8
    from ster_py.families import gate

    quantized = {"model_type": "llama4", "quantization_config": {"quant_method": "fbgemm_fp8"}, "text_config": {}}
    with pytest.raises(SterError, match="fbgemm_fp8"):  # the wrapper's quantization_config reaches the gate
        gate(unwrap(quantized, tmp_path / "config.json")[0], tmp_path / "config.json")
# ----------------------------------------------------------------------------- group H4: refusals and variants

H4_REFUSED = {
    "minimax_m2": ({"attn_type_list": [1, 0, 1]}, "lightning-attention"),
    "minimax_m2 ": ({"shared_intermediate_size": 64}, "shared experts"),
    "minimax_m2  ": ({"qk_norm_type": "per_token"}, "qk_norm_type"),
    "minimax_m2   ": ({"scoring_func": "softmax"}, "scoring_func"),
    "laguna": ({"moe_apply_router_weight_on_input": True}, "moe_apply_router_weight_on_input"),
    "step3p5": ({"num_hidden_layers": 2, "layer_types": ["full_attention"] * 2, "rope_theta": [1e4, 5e5]},
                "different rotary bases"),
    "step3p5 ": ({"num_hidden_layers": 3, "layer_types": _FSF, "partial_rotary_factors": [0.5, 1.0, 1.0]},
                 "different rotary bases or shares"),
    "step3p5  ": ({"yarn_only_types": ["full_attention", "sliding_attention"]}, "yarn_only_types"),
    "step3p5   ": ({"num_hidden_layers": 2, "mlp_layer_types": ["dense", "sparse"], "swiglu_limits_shared": [5, 0]},
                   "dense layer"),
    "step3p5    ": ({"use_bidirectional_attention": True}, "bidirectional"),
    "mimo_v2_flash": ({"num_attention_heads": 8, "swa_num_attention_heads": 4}, "swa_num_attention_heads"),
    "mimo_v2_flash ": ({"head_dim": 192, "swa_head_dim": 128}, "swa_head_dim"),
    "mimo_v2_flash  ": ({"v_head_dim": 128, "swa_v_head_dim": 192}, "swa_v_head_dim"),
}


@pytest.mark.parametrize("key", list(H4_REFUSED))
def test_h4_refused_configurations(key, tmp_path):
    """What seed 002 refuses for these families is refused by the gate, naming the feature."""
    extra, match = H4_REFUSED[key]
    with pytest.raises(SterError, match=match):
        gate({"model_type": key.strip(), **extra}, tmp_path / "config.json")


def test_minimax_m2_config_switches(tmp_path):
    """use_qk_norm false drops the q/k norms, qk_norm_type per_head norms each head, use_routing_bias
    false chooses by the scores alone (MiniMax's own config keys, which Transformers does not read)."""
    cfg = dict(CASES["minimax_m2-rotary-dim"][1], model_type="minimax_m2", rope_parameters={"rope_theta": 1e4})
    base = spec_from_config(cfg, FAMILIES["minimax_m2"])
    assert base.qk_norm == "proj" and base.moe.router.select_bias and base.layers[0].rope.rotary_dim == 8
    assert spec_from_config(dict(cfg, use_qk_norm=False), FAMILIES["minimax_m2"]).qk_norm is None
    assert spec_from_config(dict(cfg, qk_norm_type="per_head"), FAMILIES["minimax_m2"]).qk_norm == "head"
    assert not spec_from_config(dict(cfg, use_routing_bias=False), FAMILIES["minimax_m2"]).moe.router.select_bias


def test_mimo_v2_flash_hub_config_and_fused_qkv(tmp_path):
    """The hub's own spelling (hybrid_layer_pattern, moe_layer_freq, swa_num_key_value_heads, rope_theta /
    swa_rope_theta, sliding_window_size, the sink flags) and q/k/v stacked in qkv_proj under
    attention_projection_layout fused_qkv give transformers' logits on the same weights."""
    import json

    from safetensors.numpy import load_file, save_file

    ref_model = build(tmp_path, "mimo_v2_flash", CASES["mimo_v2_flash"][1])
    cfg = json.loads((tmp_path / "config.json").read_text())
    for key in ("layer_types", "mlp_layer_types", "rope_parameters", "sliding_window"):
        cfg.pop(key)
    cfg.update(hybrid_layer_pattern=[0, 1, 0], moe_layer_freq=[0, 1, 1], swa_num_key_value_heads=2,
               rope_theta=5_000_000.0, swa_rope_theta=10_000.0, partial_rotary_factor=0.334, sliding_window_size=4,
               add_swa_attention_sink_bias=True, add_full_attention_sink_bias=False,
               attention_projection_layout="fused_qkv", swa_head_dim=24, swa_v_head_dim=16)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(str(tmp_path / "model.safetensors"))
    for i in range(3):
        parts = [tensors.pop(f"model.layers.{i}.self_attn.{r}_proj.weight") for r in "qkv"]
        tensors[f"model.layers.{i}.self_attn.qkv_proj.weight"] = np.concatenate(parts)
    tensors["model.mtp.layers.0.enorm.weight"] = np.ones(64, np.float32)  # next-token prediction: never read
    save_file(tensors, str(tmp_path / "model.safetensors"))
    model = load_model(str(tmp_path))
    assert [layer.num_key_value_heads for layer in model.spec.layers] == [None, 2, None]
    assert [model.spec.layer_sinks(i) for i in range(3)] == [False, True, False]
    ref_logits, _ = reference_logits(ref_model, PROMPT)
    assert rel_err(model.decoder.forward(PROMPT), ref_logits) < 1e-4
    assert model.decoder._weights.unused_tensors(model.spec) == []


def test_attention_adapters_refused_where_layers_have_their_own_shape(tmp_path):
    """Seed 002: MiMo-V2-Flash's attention projections take no adapter (its two kinds of layer differ in
    key/value heads); the experts' gate/up/down never do. A standard-shaped MoE model still takes q."""
    from pathlib import Path

    from ster_py.adapters import LoraAdapter, check_adapter_for

    def adapter(target, out, inp):
        return LoraAdapter(Path("a.lora.safetensors"), "ster", None, None, 2, 4.0, False, 64,
                           {(0, target): (np.zeros((2, inp), np.float32), np.zeros((out, 2), np.float32))})

    mimo = spec_from_config(dict(CASES["mimo_v2_flash"][1], model_type="mimo_v2_flash"), FAMILIES["mimo_v2_flash"])
    with pytest.raises(SterError, match="differ in head counts or widths"):
        check_adapter_for(adapter("q", 96, 64), None, mimo, lambda role: True)
    qwen = spec_from_config(dict(CASES["qwen3_moe"][1], model_type="qwen3_moe"), FAMILIES["qwen3_moe"])
    check_adapter_for(adapter("q", 64, 64), None, qwen, lambda role: True)


def test_whole_head_rotation_drops_a_share_and_refuses_one_beside_another_rope_type():
    """Families whose Transformers rotation turns whole heads: partial_rotary_factor is not read with default
    tables; with YaRN's (sized by the share, which Transformers' rotation then cannot apply) it is refused."""
    cfg = dict(CASES["mixtral-share-and-router-keys-unread"][1], model_type="mixtral")
    assert {layer.rope.rotary_dim for layer in spec_from_config(cfg, FAMILIES["mixtral"]).layers} == {16}
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16}
    with pytest.raises(SterError, match=r"partial_rotary_factor 0.5\) with rope type 'yarn'"):
        spec_from_config(dict(cfg, rope_parameters=yarn), FAMILIES["mixtral"])
    assert spec_from_config(dict(cfg, partial_rotary_factor=1.0, rope_parameters=yarn), FAMILIES["mixtral"])


def test_laguna_sliding_sinks_and_defaults():
    """swa_attention_sink_enabled puts a learned sink per head (self_attn.sink) on the sliding layers
    only (seed 002; Transformers' Laguna has none, so no parity case); a config without layer lists
    gets Transformers' defaults: full attention, the first layer dense, half of each head rotated."""
    cfg = dict(CASES["laguna-heads-per-layer-window-yarn"][1], model_type="laguna")
    spec = spec_from_config(dict(cfg, swa_attention_sink_enabled=True), FAMILIES["laguna"])
    assert [spec.layer_sinks(i) for i in range(3)] == [False, True, False] and spec.names["sinks"].endswith(".sink")
    assert [layer.num_attention_heads for layer in spec.layers] == [None, 8, None]
    bare = {k: v for k, v in cfg.items() if k not in ("layer_types", "rope_parameters", "sliding_window")}
    spec = spec_from_config(bare, FAMILIES["laguna"])
    assert [layer.ffn for layer in spec.layers] == ["dense", "moe", "moe"] and not spec.sinks
    assert all(layer.rope.rotary_dim == 8 and layer.sliding_window is None for layer in spec.layers)


def test_step3p5_config_switches():
    """use_rope_layers leaves a layer unrotated and use_head_wise_attn_gate false drops the output gate
    (hub keys Transformers does not read); a dense layer without a clamp passes the gate."""
    cfg = dict(CASES["step3p5-heads-clamps-yarn"][1], model_type="step3p5")
    spec = spec_from_config(dict(cfg, use_rope_layers=[True, False, True, True]), FAMILIES["step3p5"])
    assert [layer.rope is None for layer in spec.layers] == [False, True, False] and spec.attn_gate == "sigmoid"
    assert spec.norm_unit_offset and [layer.num_attention_heads for layer in spec.layers] == [None, 2, None]
    assert [(layer.moe.limit, layer.moe.shared_limit) if layer.moe else None for layer in spec.layers] == [
        None, (0.8, None), (None, 0.6)]
    assert spec_from_config(dict(cfg, use_head_wise_attn_gate=False), FAMILIES["step3p5"]).attn_gate is None
    gate(cfg, "config.json")


def test_step3p5_multi_token_prediction_layers_are_not_unused(tmp_path):
    """The num_nextn_predict_layers layers a Step 3.5 checkpoint stores after its last layer are never
    read, and not reported as unused; a stray tensor elsewhere still is."""
    from safetensors.numpy import load_file, save_file

    build(tmp_path, "step3p5", CASES["step3p5-hub-config"][1])
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors["model.layers.3.eh_proj.weight"] = np.zeros((64, 128), np.float32)
    tensors["model.layers.4.eh_proj.weight"] = np.zeros((64, 128), np.float32)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    model = load_model(str(tmp_path))
    assert model.decoder._weights.unused_tensors(model.spec) == ["model.layers.4.eh_proj.weight"]


def test_kv_cache_sized_per_layer(tmp_path):
    """MiMo-V2-Flash's cache holds each layer's own key/value heads, keys 24 wide and values 16 wide;
    a float16 cache of the same shapes decodes within float16 rounding of the float32 one."""
    build(tmp_path, "mimo_v2_flash", CASES["mimo_v2_flash"][1])
    decoder = load_model(str(tmp_path)).decoder
    cache = decoder.new_cache()
    assert [k.shape[::2] + v.shape[2:] for k, v in zip(cache._k, cache._v)] == [(1, 24, 16), (2, 24, 16), (1, 24, 16)]
    assert cache.nbytes_per_position() == 4 * (1 + 2 + 1) * (24 + 16)
    half = decoder.new_cache(np.float16)
    ours = [decoder.forward(PROMPT[:9], half), decoder.forward(PROMPT[9:], half)]
    ref = decoder.forward(PROMPT)
    assert rel_err(np.concatenate(ours), ref) < 2e-3


# ----------------------------------------------------------------------------- steering, capture, adapters


def test_steering_and_capture_on_a_routed_model(tmp_path):
    """The residual stream between blocks is the same object whatever the feed-forward: a steering
    vector on a routed model equals transformers with forward hooks adding it (prefill logits and
    10 greedy tokens through the cache), and captured hidden states are transformers' own."""
    from ster_py.capture import capture
    from ster_py.steering import SteeringVector, steering_hook
    from test_steering import hooked_greedy, unit_directions
    from tiny import reference_logits, rel_err

    model_type, config = CASES["qwen2_moe-shared-dense-layer"]
    ref = build(tmp_path, model_type, config)
    loaded = load_model(str(tmp_path))
    dirs = unit_directions([0, 2])
    vec = SteeringVector(str(tmp_path), None, 64, "test", "manual", dirs)
    expected, ref_prefill = hooked_greedy(ref, PROMPT[:6], dirs, 2.5, 10)
    hook = steering_hook(vec, 2.5)
    assert rel_err(loaded.decoder.forward(PROMPT[:6], layer_hook=hook), ref_prefill) < 1e-4
    from ster_py.generate import Sampling, generate

    assert generate(loaded.decoder, PROMPT[:6], Sampling(max_new_tokens=10), stop_ids=(),
                    layer_hook=hook).ids == expected
    _, ref_hidden = reference_logits(ref, PROMPT)
    cap = capture(loaded, [" ".join(f"w{i}" for i in PROMPT)], [0, 1], "all", chat_template="off")
    assert cap.meta["prompts"][0]["token_ids"] == PROMPT
    for layer in (0, 1):  # the outputs of layer 0 (routed) and layer 1 (dense)
        assert rel_err(cap.rows(layer), ref_hidden[layer + 1][-len(PROMPT):]) < 1e-5


def test_adapter_on_experts_is_refused(tmp_path):
    """Seed 002: adapters on mixture-of-experts families sit on attention only."""
    import json

    from safetensors.numpy import save_file

    from ster_py.adapters import load_adapter_for
    from ster_py.errors import SterError

    build(tmp_path / "m", *CASES["qwen3_moe"])
    loaded = load_model(str(tmp_path / "m"))
    for target, ok in (("up", False), ("q", True)):
        d = tmp_path / target
        d.mkdir()
        out = 64 if target == "q" else 32
        save_file({f"layers.0.{target}.a": np.zeros((2, 64), np.float32),
                   f"layers.0.{target}.b": np.zeros((out, 2), np.float32)}, str(d / "a.lora.safetensors"))
        (d / "a.lora.json").write_text(json.dumps({"model": str(tmp_path / "m"), "model_revision": None, "rank": 2,
                                                   "alpha": 2, "targets": [target], "layers": [0],
                                                   "hidden_size": 64}))
        if ok:
            load_adapter_for(d / "a.lora.json", loaded)
        else:
            with pytest.raises(SterError, match="routes its feed-forward through experts"):
                load_adapter_for(d / "a.lora.json", loaded)
