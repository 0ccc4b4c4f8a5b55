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
from ster_py.families import FAMILIES
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
