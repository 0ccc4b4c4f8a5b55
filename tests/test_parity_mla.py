"""Latent-attention families (the DeepSeek-V2 line) against transformers and llama.cpp on tiny checkpoints.

Each case is a checkpoint made here with transformers (small ranks, 3 or more layers, dense and
routed layers, every router option and rotation switched on in some case), every weight redrawn
(``tiny.build_checkpoint``). Checked like the other families (``test_parity_dense._check``): logits
within 1e-4 of transformers (f32), the same through the cache in two pieces, the same 16 greedy
tokens, no stored tensor left unread; and here also the prompt decoded token by token (each token
attending the absorbed way, over the cached latent) against transformers' whole-prompt logits, and
prompts attended the absorbed way too. DeepSeek-V2's router is checked against transformers' own
router module. The GGUF section converts tiny checkpoints with llama.cpp's own converter: F32
against transformers within 1e-3, Q8_0 / Q4_K_M quantizations (llama.cpp's quantizer) against
llama.cpp's logits, with files whose kv_b is stored whole (llama.cpp's older converter, rewritten
here with gguf-py) as well as split per head (attn_k_b / attn_v_b).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from ster_py.config import spec_from_config
from ster_py.decoder.moe import RouterSpec, route
from ster_py.errors import SterError
from ster_py.families import FAMILIES, gate
from ster_py.load import load_model
from test_parity_dense import PROMPT, _check
from tiny import check_llamacpp_top1, check_token_steps
from tiny import build_checkpoint as build
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)
from tiny import reference_logits, reference_split_logits, rel_err

# the dequantized model's sums for a GGUF's prompt (conftest.quantized_tiles_off)
pytestmark = pytest.mark.usefixtures("quantized_tiles_off")

VOCAB = 128
MLA = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
           num_key_value_heads=4, max_position_embeddings=64, kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8,
           qk_rope_head_dim=4, v_head_dim=12)
EXPERTS = dict(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
# DeepSeek-V2's own YaRN block (mscale = mscale_all_dim), and one whose tables are scaled too (mscale differs).
_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
         "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1}
_YARN_RATIO = dict(_YARN, mscale=1.0, mscale_all_dim=0.8)
# Short factors up to 8 positions, long ones past them: the 16-token prompt uses the long table.
_LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 8,
             "short_factor": [1.0, 1.2, 1.5, 2.0], "long_factor": [1.0, 2.0, 4.0, 8.0]}

CASES = {
    "deepseek_v2": ("deepseek_v2", dict(MLA, **EXPERTS, first_k_dense_replace=1)),
    "deepseek_v2-lite-groups-scale-yarn-bias": ("deepseek_v2", dict(
        MLA, **dict(EXPERTS, num_experts_per_tok=3), q_lora_rank=None, topk_method="group_limited_greedy",
        n_group=4, topk_group=2, routed_scaling_factor=2.0, n_shared_experts=1, first_k_dense_replace=0,
        attention_bias=True, rope_parameters=_YARN)),
    "deepseek_v3": ("deepseek_v3", dict(MLA, **EXPERTS, n_group=2, topk_group=1, first_k_dense_replace=1)),
    "deepseek_v3-halves-no-renorm-yarn-ratio": ("deepseek_v3", dict(
        MLA, **EXPERTS, num_hidden_layers=4, rope_interleave=False, norm_topk_prob=False, n_group=4, topk_group=2,
        routed_scaling_factor=1.5, n_shared_experts=2, first_k_dense_replace=2, rope_parameters=_YARN_RATIO)),
    "deepseek_v3-no-q-lora-one-group": ("deepseek_v3", dict(MLA, **dict(EXPERTS, num_experts_per_tok=3),
                                                            q_lora_rank=None, n_group=1, topk_group=1,
                                                            first_k_dense_replace=0, qk_rope_head_dim=8)),
    "minicpm3": ("minicpm3", dict(MLA, v_head_dim=None)),
    "minicpm3-no-q-lora-scales-longrope": ("minicpm3", dict(
        MLA, q_lora_rank=None, qk_rope_head_dim=8, scale_emb=2.5, scale_depth=2.0, dim_model_base=32,
        tie_word_embeddings=False, rope_parameters=_LONGROPE)),
    "glm4_moe_lite": ("glm4_moe_lite", dict(MLA, **EXPERTS, n_group=2, topk_group=1)),
    "glm4_moe_lite-layer-types-bias-no-renorm": ("glm4_moe_lite", dict(
        MLA, **EXPERTS, mlp_layer_types=["sparse", "dense", "sparse"], attention_bias=True, norm_topk_prob=False,
        routed_scaling_factor=2.2, n_shared_experts=2)),
    "axk1": ("axk1", dict(MLA, **EXPERTS, n_group=4, topk_group=2)),
    "axk1-freq-2": ("axk1", dict(MLA, **EXPERTS, num_hidden_layers=5, n_group=2, topk_group=1,
                                 first_k_dense_replace=1, moe_layer_freq=2)),
    "sarvam_mla": ("sarvam_mla", dict(MLA, **EXPERTS, q_lora_rank=None, rope_parameters=_YARN)),
    "sarvam_mla-groups-q-lora": ("sarvam_mla", dict(MLA, **EXPERTS, q_lora_rank=24, n_group=2, topk_group=1,
                                                    first_k_dense_replace=0, norm_topk_prob=False)),
}


def reference_steps(model, ids) -> np.ndarray:
    """transformers' logits float32 [T, vocab] for ``ids`` fed one token at a time through its cache."""
    import torch

    out, past = [], None
    with torch.no_grad():
        for t in ids:
            res = model(torch.tensor([[int(t)]]), past_key_values=past, use_cache=True)
            past = res.past_key_values
            out.append(res.logits[0].float().numpy())
    return np.concatenate(out)


def _decode_checks(model, ref_model):
    """A prompt decoded token by token from the cache (absorbed attention) against transformers decoding
    the same way and, but where LongRoPE switches tables with the length, against its whole-prompt
    logits; the prompt attended the absorbed way at once, against the whole-prompt logits."""
    ref_logits, _ = reference_logits(ref_model, PROMPT)
    cache = model.decoder.new_cache()
    steps = np.concatenate([model.decoder.forward([t], cache) for t in PROMPT])
    assert rel_err(steps, reference_steps(ref_model, PROMPT)) < 1e-4
    if model.spec.layers[0].rope.long_inv_freq is None:
        assert rel_err(steps, ref_logits) < 1e-4
    for layer in model.decoder.layers:
        layer.mixer.absorb_prompts = True
    try:
        assert rel_err(model.decoder.forward(PROMPT), ref_logits) < 1e-4
    finally:
        for layer in model.decoder.layers:
            layer.mixer.absorb_prompts = False


@pytest.mark.parametrize("case", list(CASES))
def test_family_matches_transformers(case, tmp_path):
    model_type, config = CASES[case]
    ref_model = build(tmp_path, model_type, config)
    model = _check(tmp_path, ref_model)
    assert model.spec.latent is not None and {layer.mixer for layer in model.spec.layers} == {"latent"}
    _decode_checks(model, ref_model)


def test_every_latent_family_has_a_case():
    """Part A's families here, part B's (the descendants) in test_parity_mla_b, the hyper-connected ones in
    test_parity_hc."""
    import test_parity_hc
    import test_parity_mla_b
    import test_parity_remote_c  # group R2's latent families without a Transformers implementation

    latent = {name for name, f in FAMILIES.items() if f.latent and not f.recurrent}  # kimi_linear: test_parity_ssm_b2
    assert latent == {model_type for model_type, _ in list(CASES.values()) + list(test_parity_mla_b.CASES.values())
                      + list(test_parity_mla_b.LONGCAT_CASES.values())
                      + [(m, c) for m, c in test_parity_remote_c.CASES.values() if FAMILIES[m].latent]
                      + list(test_parity_hc.CASES.values())}


def test_specs_show_what_the_cases_switch_on(tmp_path):
    """The readings the cases are there to exercise, as the spec shows them."""
    def spec(case):
        model_type, config = CASES[case]
        return spec_from_config(dict(config, model_type=model_type), FAMILIES[model_type])

    v2 = spec("deepseek_v2-lite-groups-scale-yarn-bias")
    r = v2.moe.router
    assert (r.scoring, r.n_group, r.topk_group, r.group_rank, r.renormalize, r.scale, r.select_bias) == (
        "softmax", 4, 2, "max", False, 2.0, False)
    assert v2.latent.q_lora_rank is None and [layer.ffn for layer in v2.layers] == ["moe"] * 3
    # scores sharpened by mscale(4, 0.707) ** 2; the tables keep their magnitude (mscale = mscale_all_dim)
    m = 0.1 * 0.707 * np.log(4.0) + 1.0
    assert np.isclose(v2.attn_scale, 12 ** -0.5 * m * m) and np.isclose(v2.layers[0].rope.attention_factor, 1.0)
    assert v2.layers[0].rope.interleaved and v2.layers[0].rope.rotary_dim == 4
    v3 = spec("deepseek_v3-halves-no-renorm-yarn-ratio")
    r = v3.moe.router
    assert (r.scoring, r.select_bias, r.group_rank, r.renormalize, r.scale) == ("sigmoid", True, "top2", False, 1.5)
    assert not v3.layers[0].rope.interleaved and [layer.ffn for layer in v3.layers] == ["dense"] * 2 + ["moe"] * 2
    ratio = (0.1 * 1.0 * np.log(4.0) + 1.0) / (0.1 * 0.8 * np.log(4.0) + 1.0)
    assert np.isclose(v3.layers[0].rope.attention_factor, ratio)
    cpm = spec("minicpm3-no-q-lora-scales-longrope")
    assert (cpm.embed_scale, cpm.residual_scale, cpm.logit_scale) == (2.5, 2.0 / 3 ** 0.5, 32 / 64)
    assert cpm.latent.v_head_dim == 12 and spec("minicpm3").latent.v_head_dim == 64 // 4
    axk1 = spec("axk1-freq-2")
    assert [layer.ffn for layer in axk1.layers] == ["dense", "dense", "moe", "dense", "moe"]
    assert [len(axk1.layer_norms(i)) for i in range(5)] == [2, 2, 3, 2, 3] and axk1.moe.select_bias_optional


def test_axk1_without_a_selection_bias(tmp_path):
    """A.X-K1's releases store no e_score_correction_bias (topk_method none): it routes by the sigmoid
    scores alone, as Transformers does with the bias left at zero; its dense layers' stored
    post_mlp_layernorm is never read and not reported unused."""
    import torch
    from safetensors.numpy import load_file, save_file

    ref_model = build(tmp_path, *CASES["axk1"])
    tensors = load_file(str(tmp_path / "model.safetensors"))
    for name in [n for n in tensors if n.endswith("e_score_correction_bias")]:
        del tensors[name]
    tensors["model.layers.0.post_mlp_layernorm.weight"] = np.ones(64, np.float32)  # as the releases keep it
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with torch.no_grad():
        for name, b in ref_model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.zero_()
    model = _check(tmp_path, ref_model)
    assert model.decoder.layers[1].ffn.select_bias is None


def test_sarvam_mla_hub_config(tmp_path):
    """Sarvam-105B's own config.json spelling (num_experts, num_shared_experts, a deepseek_yarn rope block
    beside rope_theta, head_dim = kv_lora_rank + qk_rope_head_dim) gives transformers' logits."""
    config = dict(MLA, **EXPERTS, q_lora_rank=None, first_k_dense_replace=1, rope_parameters=_YARN)
    ref_model = build(tmp_path, "sarvam_mla", config)
    cfg = json.loads((tmp_path / "config.json").read_text())
    for key in ("rope_parameters", "n_routed_experts", "n_shared_experts", "head_dim"):
        cfg.pop(key, None)
    cfg.update(num_experts=8, num_shared_experts=1, head_dim=16 + 4, rope_theta=10000.0,
               rope_scaling={k: v for k, v in dict(_YARN, type="deepseek_yarn").items()
                             if k not in ("rope_type", "rope_theta")},
               score_function="sigmoid", moe_router_enable_expert_bias=True, moe_layer_freq=1,
               moe_shared_expert_intermediate_size=32)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = load_model(str(tmp_path))
    assert model.spec.moe.router.num_experts == 8 and model.spec.head_dim == 12
    assert rel_err(model.decoder.forward(PROMPT), reference_logits(ref_model, PROMPT)[0]) < 1e-4


def test_kimi_k2_config_is_deepseek_v3(tmp_path):
    """Kimi-K2's config.json names model_type kimi_k2 for DeepseekV3ForCausalLM: read as deepseek_v3
    (as Transformers' Kimi-K2.5 reads its text config); its FP8 release declares a quantization_config
    and is refused before any weight is read."""
    ref_model = build(tmp_path, *CASES["deepseek_v3"])
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, model_type="kimi_k2")))
    model = load_model(str(tmp_path))
    assert model.spec.model_type == "deepseek_v3"
    assert rel_err(model.decoder.forward(PROMPT), reference_logits(ref_model, PROMPT)[0]) < 1e-4
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, model_type="kimi_k2", quantization_config={
        "quant_method": "fp8", "fmt": "e4m3"})))
    (tmp_path / "model.safetensors").write_bytes(b"corrupt: proves nothing reads it")
    with pytest.raises(SterError, match="quantization_config.*fp8"):
        load_model(str(tmp_path))


# ----------------------------------------------------------------------------- the router


@pytest.mark.parametrize("method,n_group,topk_group,top_k", [("greedy", None, None, 3),
                                                              ("group_limited_greedy", 4, 2, 3),
                                                              ("group_limited_greedy", 8, 3, 2)])
def test_route_equals_deepseek_v2_router(method, n_group, topk_group, top_k):
    """Softmax scores, greedy or group-limited choice (groups ranked by their best expert), weights
    times routed_scaling_factor and never renormalised: transformers' DeepseekV2TopkRouter."""
    import torch
    from transformers import AutoConfig
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    torch.manual_seed(0)
    cfg = AutoConfig.for_model("deepseek_v2", hidden_size=32, num_attention_heads=4, n_routed_experts=16,
                               num_experts_per_tok=top_k, topk_method=method, n_group=n_group, topk_group=topk_group,
                               routed_scaling_factor=16.0, norm_topk_prob=True)
    router = DeepseekV2TopkRouter(cfg)
    with torch.no_grad():
        router.weight.copy_(torch.randn_like(router.weight))
        logits, ref_w, ref_ids = router(torch.randn(40, 32))
    spec = spec_from_config(dict(MLA, **dict(EXPERTS, n_routed_experts=16, num_experts_per_tok=top_k),
                                 model_type="deepseek_v2", topk_method=method, n_group=n_group,
                                 topk_group=topk_group, routed_scaling_factor=16.0, norm_topk_prob=True),
                            FAMILIES["deepseek_v2"]).moe.router
    ids, w = route(spec, logits.numpy())
    ref_ids, ref_w = ref_ids.numpy(), ref_w.numpy()
    order, mine = np.argsort(ref_ids, axis=1), np.argsort(ids, axis=1)
    assert np.array_equal(np.take_along_axis(ids, mine, 1), np.take_along_axis(ref_ids, order, 1))
    np.testing.assert_allclose(np.take_along_axis(w, mine, 1), np.take_along_axis(ref_w, order, 1), rtol=1e-6)


def test_route_without_a_selection_bias_is_a_zero_bias():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((30, 8)).astype(np.float32)
    spec = RouterSpec(8, 2, scoring="sigmoid", select_bias=True, n_group=4, topk_group=2, group_rank="top2",
                      renormalize=True, renorm_eps=1e-20, scale=2.5)
    ids, w = route(spec, logits, None)
    ids0, w0 = route(spec, logits, np.zeros(8, np.float32))
    assert np.array_equal(ids, ids0) and np.array_equal(w, w0)


# ----------------------------------------------------------------------------- the cache


def test_cache_holds_the_latent(tmp_path):
    """Per position and layer the cache holds r + rope numbers (the normed latent and the rotated key
    part), not H * (qk + v) expanded ones; ster inspect reports both; a float16 cache holds half and
    decodes within float16 rounding of the float32 one."""
    from ster_py.decoder.latent import LatentSlot
    from ster_py.inspect import inspect_model

    model_type, config = CASES["deepseek_v3"]
    build(tmp_path, model_type, config)
    model = load_model(str(tmp_path))
    L, H, r, rope, qk, v = 3, 4, 16, 4, 12, 12
    cache = model.decoder.new_cache()
    assert all(isinstance(cache.slot(i), LatentSlot) for i in range(L))
    assert cache.nbytes_per_position() == 4 * L * (r + rope)
    model.decoder.forward(PROMPT, cache)
    held = [cache.slot(i).rows for i in range(L)]
    assert all(rows.shape[1] == r + rope and rows.shape[0] >= len(PROMPT) for rows in held)
    assert sum(cache._k[i].nbytes + cache._v[i].nbytes for i in range(L)) == 0  # no expanded keys kept
    info = inspect_model(str(tmp_path))
    assert info["kv_bytes_per_position"] == 4 * L * (r + rope)
    assert info["kv_bytes_per_position_expanded"] == 4 * L * H * (qk + v)
    half = model.decoder.new_cache(np.float16)
    assert half.nbytes_per_position() == 2 * L * (r + rope)
    ours = np.concatenate([model.decoder.forward(PROMPT[:9], half)] +
                          [model.decoder.forward([t], half) for t in PROMPT[9:]])
    assert rel_err(ours, model.decoder.forward(PROMPT)) < 2e-3


# ----------------------------------------------------------------------------- refusals and adapters

MLA_REFUSED = {
    "v2-noaux": ("deepseek_v2", dict(topk_method="noaux_tc"), "topk_method other than greedy"),
    "v2-sigmoid": ("deepseek_v2", dict(scoring_func="sigmoid"), "scoring_func other than softmax"),
    "v2-freq": ("deepseek_v2", dict(moe_layer_freq=2), "moe_layer_freq"),
    "v3-softmax": ("deepseek_v3", dict(scoring_func="softmax"), "scoring_func other than sigmoid"),
    "v3-greedy": ("deepseek_v3", dict(topk_method="greedy"), "topk_method other than noaux_tc"),
    "v3-freq": ("deepseek_v3", dict(moe_layer_freq=3), "moe_layer_freq"),
    "kimi-fp8": ("kimi_k2", dict(quantization_config={"quant_method": "fp8"}), "quantization_config"),
    "glm-lite-first-k": ("glm4_moe_lite", dict(first_k_dense_replace=2), "first_k_dense_replace"),
    "glm-lite-softmax": ("glm4_moe_lite", dict(scoring_func="softmax"), "scoring_func"),
    "axk1-no-q-lora": ("axk1", dict(q_lora_rank=None), "q_lora_rank"),
    "sarvam-softmax": ("sarvam_mla", dict(score_function="softmax"), "score_function"),
    "sarvam-no-bias": ("sarvam_mla", dict(moe_router_enable_expert_bias=False), "moe_router_enable_expert_bias"),
    "sarvam-freq": ("sarvam_mla", dict(moe_layer_freq=2), "moe_layer_freq"),
    "sarvam-shared-width": ("sarvam_mla", dict(moe_intermediate_size=32, num_shared_experts=1,
                                               moe_shared_expert_intermediate_size=64),
                            "moe_shared_expert_intermediate_size"),
}


@pytest.mark.parametrize("key", list(MLA_REFUSED))
def test_refused_configurations(key, tmp_path):
    from ster_py.families import unwrap

    model_type, extra, match = MLA_REFUSED[key]
    with pytest.raises(SterError, match=match):
        gate(unwrap({"model_type": model_type, **extra}, tmp_path / "config.json")[0], tmp_path / "config.json")


def test_accepted_configs_pass_the_gate(tmp_path):
    ok = [("deepseek_v2", dict(topk_method="group_limited_greedy", scoring_func="softmax", moe_layer_freq=1)),
          ("deepseek_v3", dict(scoring_func="sigmoid", topk_method="noaux_tc")),
          ("glm4_moe_lite", dict(first_k_dense_replace=2, mlp_layer_types=["dense", "dense", "sparse"])),
          ("axk1", dict(topk_method="none", q_lora_rank=16)),
          ("sarvam_mla", dict(score_function="sigmoid", moe_intermediate_size=32, num_shared_experts=2,
                              moe_shared_expert_intermediate_size=64))]
    for model_type, extra in ok:
        assert gate({"model_type": model_type, **extra}, tmp_path / "config.json").model_type == model_type


def test_rotating_less_than_the_rope_part_is_refused():
    config = dict(MLA, **EXPERTS, model_type="deepseek_v3",
                  rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5})
    with pytest.raises(SterError, match="qk_rope_head_dim"):
        spec_from_config(config, FAMILIES["deepseek_v3"])


def test_refusal_comes_before_any_weight(tmp_path):
    build(tmp_path, *CASES["deepseek_v3"])
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, scoring_func="softmax")))
    (tmp_path / "model.safetensors").write_bytes(b"corrupt: proves nothing reads it")
    with pytest.raises(SterError, match="scoring_func"):
        load_model(str(tmp_path))


@pytest.mark.parametrize("case,target,allowed", [("deepseek_v3", "o", True), ("deepseek_v3", "q", False),
                                                 ("deepseek_v3", "k", False),
                                                 ("deepseek_v3-no-q-lora-one-group", "q", True),
                                                 ("minicpm3", "v", False), ("minicpm3", "gate", True)])
def test_adapters_on_latent_attention(case, target, allowed, tmp_path):
    """Seed 002: adapters on latent attention sit on the output projection, and on the query when it has
    no bottleneck; a dense feed-forward (MiniCPM3) still takes them. An allowed adapter changes the logits
    as LoRA does: base + scale * B A x on that projection."""
    from pathlib import Path

    from ster_py.adapters import LoraAdapter, apply_adapter, check_adapter_for, projection_shapes

    model_type, config = CASES[case]
    build(tmp_path, model_type, config)
    model = load_model(str(tmp_path))
    out, inp = projection_shapes(model.spec)[target]
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((2, inp)) * 0.1).astype(np.float32), (rng.standard_normal((out, 2)) * 0.1).astype(
        np.float32)
    ad = LoraAdapter(Path("a.lora.safetensors"), "ster", None, None, 2, 4.0, False, 64, {(1, target): (a, b)})
    first = model.decoder.layers[0]
    if not allowed:
        with pytest.raises(SterError, match="latent attention takes adapters on"):
            check_adapter_for(ad, None, model.spec, lambda role: getattr(first, role, None) is not None)
        return
    check_adapter_for(ad, None, model.spec, lambda role: getattr(first, role, None) is not None)
    before = model.decoder.forward(PROMPT)
    base = getattr(model.decoder.layers[1], target)
    apply_adapter(model, ad)
    x = rng.standard_normal((3, inp)).astype(np.float32)
    np.testing.assert_allclose(getattr(model.decoder.layers[1], target)(x), base(x) + ad.scale * (x @ a.T) @ b.T,
                               rtol=1e-5, atol=1e-6)
    assert rel_err(model.decoder.forward(PROMPT), before) > 1e-4


# ----------------------------------------------------------------------------- GGUF, via llama.cpp
#
# Tiny checkpoints converted by llama.cpp's own convert_hf_to_gguf.py: at F32 they match transformers
# within 1e-3 (whole, through the cache in two pieces and token by token, every tensor read). The
# converter splits kv_b per head (attn_k_b, attn_v_b); "legacy" copies rewrite a converted file the way
# llama.cpp's older converter wrote it (attn_kv_b whole, no key_length_mla), which llama.cpp still loads.
# The WIDE cases are quantized by llama.cpp's quantizer (Q8_0, Q4_K_M) and checked against llama.cpp's
# own logits; their widths are multiples of 256 where llama.cpp's K-quants need it. llama.cpp reads
# q_lora_rank from every deepseek2 file but those of 26, 27 or 48 layers, so the cases without a query
# bottleneck are checked against transformers only.

GGUF_CASES = {  # name: (model_type, config, legacy config.json keys)
    # (llama.cpp ranks expert groups by their best two, DeepSeek-V2's Transformers router by their best
    # one: the V2 cases with groups are checked against llama.cpp, below, not against transformers)
    "deepseek2-v2": ("deepseek_v2", dict(MLA, **EXPERTS, first_k_dense_replace=1, routed_scaling_factor=2.0,
                                         n_shared_experts=1), {}),
    "deepseek2-v2-lite-yarn": ("deepseek_v2", dict(MLA, **EXPERTS, q_lora_rank=None, first_k_dense_replace=1,
                                                   rope_parameters=_YARN), {}),
    "deepseek2-v3": ("deepseek_v3", dict(MLA, **EXPERTS, n_group=2, topk_group=1, first_k_dense_replace=1),
                     {"scoring_func": "sigmoid"}),
    "deepseek2-v3-no-renorm-yarn": ("deepseek_v3", dict(MLA, **EXPERTS, norm_topk_prob=False, n_shared_experts=2,
                                                        n_group=4, topk_group=2,
                                                        first_k_dense_replace=2, num_hidden_layers=4,
                                                        routed_scaling_factor=1.5, rope_parameters=_YARN),
                                    {"scoring_func": "sigmoid"}),
    "deepseek2-glm4-lite": ("glm4_moe_lite", dict(MLA, **EXPERTS, n_group=2, topk_group=1),
                            {"scoring_func": "sigmoid"}),
    "minicpm3": ("minicpm3", dict(MLA, v_head_dim=None), {}),
    "minicpm3-longrope": ("minicpm3", dict(MLA, v_head_dim=None, qk_rope_head_dim=8, rope_parameters=dict(
        _LONGROPE, original_max_position_embeddings=64)), {}),
}
WIDE = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=64, kv_lora_rank=256, q_lora_rank=256,
            qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=64)
WIDE_EXPERTS = dict(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=256)
QUANT_CASES = {
    "q-deepseek2-v3": ("deepseek_v3", dict(WIDE, **WIDE_EXPERTS, n_group=2, topk_group=1, first_k_dense_replace=1),
                       {"scoring_func": "sigmoid"}),
    "q-deepseek2-v2-groups": ("deepseek_v2", dict(WIDE, **WIDE_EXPERTS, first_k_dense_replace=1,
                                                  topk_method="group_limited_greedy", n_group=4, topk_group=2,
                                                  routed_scaling_factor=2.0), {}),
    "q-minicpm3": ("minicpm3", dict(WIDE, v_head_dim=None), {}),
}
LONG_PROMPT = np.random.RandomState(3).randint(3, VOCAB, size=32).tolist()


def legacy_gguf(src, dst) -> None:
    """Rewrite a converted deepseek2 file as llama.cpp's older converter wrote it: each layer's kv_b
    whole (attn_kv_b [H * (nope + v), r], rebuilt from attn_k_b [H, r, nope] and attn_v_b [H, v, r]),
    head widths in attention.key_length / value_length, no key_length_mla / value_length_mla, one
    key/value head per head. Written with gguf-py; F32 files only."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = "deepseek2"
    writer = gguf.GGUFWriter(str(dst), arch)
    fields = {f.name: f for f in reader.fields.values()}
    qk = int(fields[f"{arch}.attention.key_length_mla"].contents())
    v = int(fields[f"{arch}.attention.value_length_mla"].contents())
    replaced = {f"{arch}.attention.key_length": qk, f"{arch}.attention.value_length": v,
                f"{arch}.attention.head_count_kv": int(fields[f"{arch}.attention.head_count"].contents())}
    for name, f in fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name.endswith("_length_mla"):
            continue
        vtype = f.types[0]
        value = replaced.get(name, f.contents())
        writer.add_key_value(name, value, vtype, sub_type=f.types[1] if vtype == gguf.GGUFValueType.ARRAY else None)
    tensors = {t.name: t for t in reader.tensors}
    for name, t in tensors.items():
        assert t.tensor_type == gguf.GGMLQuantizationType.F32
        if name.endswith("attn_v_b.weight"):
            continue
        data = np.array(t.data)
        if name.endswith("attn_k_b.weight"):
            k_b = data  # [H, r, nope]
            v_b = np.array(tensors[name.replace("attn_k_b", "attn_v_b")].data)  # [H, v, r]
            data = np.concatenate([np.concatenate([k_b[h].T, v_b[h]]) for h in range(k_b.shape[0])])
            name = name.replace("attn_k_b", "attn_kv_b")
        writer.add_tensor(name, np.ascontiguousarray(data, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def mla_gguf(tmp_path_factory):
    """name -> (converted F32 .gguf, transformers model) for GGUF_CASES and QUANT_CASES, plus a legacy
    (attn_kv_b whole) copy of each deepseek2 file under name + "-legacy"."""
    from llamacpp_convert import convert_cases

    def make(path, model_type, config):
        return (_decisive if path.name in QUANT_CASES else build)(path, model_type, config)

    out = convert_cases(tmp_path_factory.mktemp("llama_cpp_mla"), {**GGUF_CASES, **QUANT_CASES}, make)
    for name, (path, ref) in list(out.items()):
        if name.startswith(("deepseek2", "q-deepseek2")):
            legacy = path.with_name(f"{name}-legacy.gguf")
            legacy_gguf(path, legacy)
            out[f"{name}-legacy"] = (legacy, ref)
    return out


def _decisive(path, model_type, config):
    """``tiny.build_checkpoint`` with 256-wide layers' weights scaled by 0.25 and, on routed models, routing
    made decisive (``test_parity_moe._wide``'s idea): token t's embedding carries a strong feature at
    expert (t mod E) and a weaker one at ((3t + 1) mod E), the routers read those features, and no
    sublayer writes to their columns of the residual stream (the rows of every o_proj and down_proj
    there are zero), so every layer routes by them. Random routing has near-ties somewhere in a
    32-token prompt, where llama.cpp's 8-bit activations may choose another expert than ster."""
    import torch

    model = build(path, model_type, config)
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name, p in params.items():
            if p.ndim > 1 and "norm" not in name:
                p.mul_(0.25)
        routers = [p for name, p in params.items() if name.endswith("mlp.gate.weight") and p.ndim == 2]
        if routers:
            n = routers[0].shape[0]
            emb = model.get_input_embeddings().weight
            sigma = float(emb.std())
            emb[:, :n] = 0.0
            for t in range(emb.shape[0]):
                emb[t, t % n] += 12 * sigma
                emb[t, (3 * t + 1) % n] += 8 * sigma
            for p in routers:
                p.mul_(0.02)
                p[:, :n] += torch.eye(n) * 2.0
            for name, p in params.items():
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    p[:n] = 0.0
                elif name.endswith("experts.down_proj"):  # stacked [experts, hidden, width]
                    p[:, :n] = 0.0
    model.save_pretrained(path)
    return model


F32_NAMES = list(GGUF_CASES) + [f"{n}-legacy" for n in GGUF_CASES if n.startswith("deepseek2")]


@pytest.mark.parametrize("name", F32_NAMES)
def test_gguf_matches_transformers(name, mla_gguf):
    from ster_py.gguf.reader import GGUFFile

    path, ref_model = mla_gguf[name]
    tensors = GGUFFile(path).tensors
    assert ("blk.0.attn_kv_b.weight" in tensors) == (name.endswith("-legacy") or name.startswith("minicpm3"))
    model = load_model(str(path))
    assert model.resolved.kind == "gguf" and model.spec.latent is not None
    ref_logits, _ = reference_logits(ref_model, PROMPT)
    err = rel_err(model.decoder.forward(PROMPT), ref_logits)
    assert err < 1e-3, f"logits rel err {err:.2e}"
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:9], cache), model.decoder.forward(PROMPT[9:], cache)])
    assert rel_err(pieces, reference_split_logits(ref_model, PROMPT, 9)) < 1e-3
    cache = model.decoder.new_cache()
    steps = np.concatenate([model.decoder.forward([t], cache) for t in PROMPT])
    assert rel_err(steps, ref_logits) < 1e-3
    assert model.decoder._weights.unused_tensors(model.spec) == []


@pytest.mark.parametrize("name", [n for n in GGUF_CASES if n.startswith("deepseek2-v3")] + ["minicpm3"])
def test_gguf_dir_matches_transformers(name, mla_gguf, tmp_path):
    """config.json + tokenizer.json + the converted .gguf: the config decides the model, the file holds
    the weights under llama.cpp's names (DeepSeek's kv_b split per head, MiniCPM3's whole)."""
    import shutil

    path, ref_model = mla_gguf[name]
    hf = path.parent / "hf" / name
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf / f, tmp_path / f)
    (tmp_path / "model.gguf").symlink_to(path)
    model = load_model(str(tmp_path))
    assert model.resolved.kind == "gguf_dir"
    assert rel_err(model.decoder.forward(PROMPT), reference_logits(ref_model, PROMPT)[0]) < 1e-3
    assert model.decoder._weights.unused_tensors(model.spec) == []


@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_K_M"])
@pytest.mark.parametrize("name", list(QUANT_CASES) + [f"{n}-legacy" for n in QUANT_CASES if "deepseek2" in n])
def test_quantized_gguf_gives_llamacpps_logits(name, ftype, mla_gguf, tmp_path):
    """llama.cpp's Q8_0 / Q4_K_M of the file, run by ster (experts and projections kept in their blocks)
    and by llama.cpp: logits within 5 %, llama.cpp's top-1 token at every position of a 32-token prompt
    but near-ties, and token-by-token decoding (absorbed, over the cached latent) equal to the whole
    prompt."""
    from ster_py import llamacpp
    from ster_py.decoder.qlinear import QuantLinear, QuantTensor
    from ster_py.gguf.reader import GGUFFile

    path, _ = mla_gguf[name]
    q = llamacpp.quantize(path, tmp_path / f"{name}-{ftype}.gguf", ftype)
    types = {n: t.type_name for n, t in GGUFFile(q).tensors.items()}
    model = load_model(str(q))
    mixer = model.decoder.layers[1].mixer
    assert type(mixer.o) is QuantLinear and type(mixer.kv_a) is QuantLinear
    if "blk.1.attn_k_b.weight" in types:  # split per head and quantized: every call absorbs, blocks kept
        assert mixer.expand is None and all(type(p) is QuantLinear for p in mixer.k_up.parts + mixer.v_up.parts)
    else:  # kv_b whole: prompts expand through it, quantized
        assert type(mixer.expand) is QuantLinear
    if model.spec.moe is not None:
        assert types["blk.1.ffn_up_exps.weight"] in ({"Q8_0"} if ftype == "Q8_0" else {"Q4_K", "Q5_K", "Q6_K"})
        assert all(type(e.gate.weight) is QuantTensor for e in model.decoder.layers[1].ffn.experts)
    ours = model.decoder.forward(LONG_PROMPT)
    (ref,) = llamacpp.logits(q, [LONG_PROMPT])
    ref = ref[:, :ours.shape[1]]
    check_llamacpp_top1(ours, ref)  # a routing flip would move a whole row far more than a near-tie
    check_token_steps(model, LONG_PROMPT, ours)


def test_every_latent_gguf_architecture_has_a_case():
    import test_parity_hc_gguf  # the hyper-connection families' files
    import test_parity_mla_b
    import test_parity_wrapped_gguf  # Dots3-Note's dots3note

    converted = {FAMILIES[model_type].gguf_arch
                 for model_type, _, _ in list(GGUF_CASES.values()) + list(test_parity_mla_b.GGUF_CASES.values())
                 + list(test_parity_hc_gguf.GGUF_CASES.values())
                 + list(test_parity_wrapped_gguf.GGUF_CASES.values())}
    assert {f.gguf_arch for f in FAMILIES.values() if f.latent and f.gguf_arch and not f.recurrent} <= converted


def test_gguf_glm_lite_files_without_a_gating_func_score_by_sigmoid():
    """llama.cpp reads a deepseek2 file without expert_gating_func as softmax (DeepSeek-V2's files before
    the key), but as sigmoid when it has GLM-4.7-Flash's shape (47 or 48 layers, 154880 tokens)."""
    from ster_py.gguf.config import _gguf_moe

    family = FAMILIES["deepseek_v2"]
    for layers, vocab, scoring in ((47, 154880, "sigmoid"), (48, 154880, "sigmoid"), (47, 102400, "softmax"),
                                   (27, 154880, "softmax")):
        meta = {"deepseek2.expert_count": 8, "deepseek2.expert_used_count": 2, "deepseek2.vocab_size": vocab}
        tensors = {f"blk.{i}.ffn_gate_inp.weight": (8, 64) for i in range(1, layers)}
        _, moe = _gguf_moe(meta, "deepseek2", family, tensors, layers, 96, "x.gguf")
        assert moe.router.scoring == scoring


@pytest.mark.parametrize("case", ["axk1", "deepseek_v3"])
def test_experts_stacked_as_transformers_5_keeps_them(case, tmp_path):
    """Seed 002 (A.X-K1): experts saved stacked in mlp.experts.gate_up_proj ([experts, 2 * width, hidden],
    gate rows first) and mlp.experts.down_proj, as Transformers 5's own modules hold them, load in a
    family that otherwise names one module per expert."""
    from safetensors.torch import save_file

    ref_model = build(tmp_path, *CASES[case])
    state = {k: v.contiguous() for k, v in ref_model.state_dict().items()}
    assert "model.layers.1.mlp.experts.gate_up_proj" in state and state[
        "model.layers.1.mlp.experts.gate_up_proj"].ndim == 3
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    model = load_model(str(tmp_path))
    assert rel_err(model.decoder.forward(PROMPT), reference_logits(ref_model, PROMPT)[0]) < 1e-4
    assert model.decoder._weights.unused_tensors(model.spec) == []
