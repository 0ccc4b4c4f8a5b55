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
from tiny import reference_logits, rel_err

VOCAB = 128
LLAMA = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
_FSF = ["full_attention", "sliding_attention", "full_attention"]
EXPERTS = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)

CASES = {
    "mixtral": ("mixtral", dict(LLAMA, num_local_experts=6, num_experts_per_tok=2)),
    "mixtral-window-top3": ("mixtral", dict(LLAMA, num_local_experts=5, num_experts_per_tok=3, sliding_window=5)),
    "qwen2_moe-shared-dense-layer": ("qwen2_moe", dict(LLAMA, **EXPERTS, shared_expert_intermediate_size=48,
                                                       mlp_only_layers=[1])),
    "qwen2_moe-renorm-step2": ("qwen2_moe", dict(LLAMA, **EXPERTS, shared_expert_intermediate_size=40,
                                                 norm_topk_prob=True, decoder_sparse_step=2)),
    "qwen3_moe": ("qwen3_moe", dict(LLAMA, **EXPERTS, head_dim=16)),
    "qwen3_moe-renorm-dense-layer": ("qwen3_moe", dict(LLAMA, **dict(EXPERTS, num_experts_per_tok=3), head_dim=16,
                                                       norm_topk_prob=True, mlp_only_layers=[0])),
    "olmoe": ("olmoe", dict(LLAMA, num_experts=8, num_experts_per_tok=2)),
    "olmoe-clip-renorm": ("olmoe", dict(LLAMA, num_experts=6, num_experts_per_tok=3, clip_qkv=0.3,
                                        norm_topk_prob=True)),
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


@pytest.mark.parametrize("case", list(CASES))
def test_family_matches_transformers(case, tmp_path):
    model_type, config = CASES[case]
    ref_model = build(tmp_path, model_type, config)
    model = _check(tmp_path, ref_model)
    assert model.spec.moe is not None and "moe" in [layer.ffn for layer in model.spec.layers]


def test_every_moe_family_has_a_case():
    moe = {name for name, f in FAMILIES.items() if f.moe}
    assert moe == {model_type for model_type, _ in CASES.values()}


def test_layers_choose_dense_or_routed_from_the_config(tmp_path):
    build(tmp_path / "q", "qwen2_moe", CASES["qwen2_moe-shared-dense-layer"][1])
    assert [layer.ffn for layer in load_model(str(tmp_path / "q")).spec.layers] == ["moe", "dense", "moe"]
    build(tmp_path / "s", "qwen2_moe", CASES["qwen2_moe-renorm-step2"][1])
    spec = load_model(str(tmp_path / "s")).spec
    assert [layer.ffn for layer in spec.layers] == ["dense", "moe", "dense"]
    assert spec.moe.router.renormalize and spec.moe.shared_gated and spec.moe.shared_size == 40


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
