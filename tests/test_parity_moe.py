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

from ster_py.decoder.moe import RouterSpec, route
from ster_py.errors import SterError
from ster_py.families import FAMILIES, gate
from ster_py.load import load_model
from test_parity_dense import _check
from tiny import build_checkpoint as build
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)

VOCAB = 128
LLAMA = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
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
