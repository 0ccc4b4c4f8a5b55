"""Latent-attention descendants (issue 14, part B) against transformers and llama.cpp on tiny checkpoints.

DeepSeek-V3.2 and GLM-5 (DeepSeek Sparse Attention's indexer; GLM-5's shared layers), LongCat-Flash (two
halves per stored layer, shortcut-connected experts, identity experts), Dots3-Note (two latent attentions
by layer type), and the hyper-connection families. Each case is a checkpoint made here with transformers
(``tiny.build_checkpoint``: every weight redrawn), checked as ``test_parity_mla`` checks part A's: logits
within 1e-4 of transformers (f32), the same through the cache in two pieces and token by token (the
absorbed way), the same 16 greedy tokens, no stored tensor left unread. The sparse cases run a 16-token
prompt past an ``index_topk`` of 5, so most queries attend to a chosen subset of their keys; a guard
(``_indexer_margins``) asserts no choice rests on two equal scores (an exact tie is broken differently by
torch's top-k and by ours, so a case with one would test nothing but the tie).

The GGUF section converts tiny checkpoints with llama.cpp's own converter: F32 against transformers within
1e-3, and llama.cpp's Q8_0 / Q4_K_M quantizations of 256-wide ones against llama.cpp's own logits (its
top-1 token at every position of a 32-token prompt but near-ties).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from ster_py.config import spec_from_config
from ster_py.decoder.indexer import Indexer, select_top
from ster_py.errors import SterError
from ster_py.families import FAMILIES, gate
from ster_py.generate import Sampling, generate
from ster_py.load import load_model
from test_parity_dense import PROMPT, _check
from test_parity_mla import EXPERTS, MLA, VOCAB, _decisive, reference_steps
from tiny import check_llamacpp_top1, check_token_steps
from tiny import build_checkpoint as build
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)
from tiny import reference_greedy, reference_logits, reference_split_logits, rel_err

# the dequantized model's sums for a GGUF's prompt (conftest.quantized_tiles_off)
pytestmark = pytest.mark.usefixtures("quantized_tiles_off")

# DeepSeek Sparse Attention: 8 index heads of 8 (4 rotated), 5 keys per query once more are visible.
DSA = dict(index_topk=5, index_head_dim=8, index_n_heads=8)

CASES = {
    "deepseek_v32": ("deepseek_v32", dict(MLA, **EXPERTS, **DSA, n_group=2, topk_group=1, first_k_dense_replace=1)),
    "deepseek_v32-no-renorm-scale-bias": ("deepseek_v32", dict(
        MLA, **dict(EXPERTS, num_experts_per_tok=3), **DSA, num_hidden_layers=4, n_group=4, topk_group=2,
        norm_topk_prob=False, routed_scaling_factor=1.5, n_shared_experts=2, first_k_dense_replace=2,
        attention_bias=True)),
    "glm_moe_dsa": ("glm_moe_dsa", dict(MLA, **EXPERTS, **DSA, first_k_dense_replace=1,
                                        indexer_types=["full", "shared", "full"])),
    "glm_moe_dsa-freq-offset": ("glm_moe_dsa", dict(MLA, **EXPERTS, **DSA, num_hidden_layers=5, n_group=2,
                                                    topk_group=1, mlp_layer_types=["dense", "sparse", "dense",
                                                                                   "sparse", "sparse"],
                                                    index_topk_freq=2, index_skip_topk_offset=1)),
    # Dots3-Note: indexed latent layers and sliding-window layers with a latent of their own (2 heads, other
    # ranks and widths, window 4), scaled bottlenecks, the rotated key part normed, gated heads.
    "dots3_note": ("dots3_note", dict(MLA, **EXPERTS, **DSA, num_hidden_layers=5, head_dim=12,
                                      layer_types=["indexed_attention", "sliding_attention", "indexed_attention",
                                                   "sliding_attention", "sliding_attention"],
                                      swa_num_attention_heads=2, swa_num_key_value_heads=2, swa_q_lora_rank=20,
                                      swa_kv_lora_rank=12, swa_head_dim=12, swa_qk_nope_head_dim=8,
                                      swa_v_head_dim=8, sliding_window_size=4, shared_experts_intermediate_size=24,
                                      first_k_dense_replace=1, rope_theta=1000.0, swa_rope_theta=50.0)),
    # ... grouped routing, two shared experts, unnormalised scaled weights, Transformers' default layer kinds.
    "dots3_note-groups": ("dots3_note", dict(MLA, **dict(EXPERTS, num_experts_per_tok=3), **DSA,
                                             num_hidden_layers=6, head_dim=12, n_group=2, topk_group=1,
                                             n_shared_experts=2, norm_topk_prob=False, routed_scaling_factor=1.5,
                                             swa_num_attention_heads=4, swa_num_key_value_heads=4,
                                             swa_q_lora_rank=24, swa_kv_lora_rank=20, swa_head_dim=20,
                                             swa_qk_nope_head_dim=16, swa_v_head_dim=16, sliding_window_size=6,
                                             shared_experts_intermediate_size=16, first_k_dense_replace=2)),
}
# LongCat-Flash: 2 stored layers (4 of ster's), 8 experts and 4 identity experts, 3 chosen per token; one
# case with another scale and as many identity experts as routed ones. head_dim is the rotated width, as Transformers needs.
LONGCAT = dict(vocab_size=VOCAB, hidden_size=64, num_layers=2, num_attention_heads=4, max_position_embeddings=64,
               kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=4, head_dim=4, v_head_dim=12,
               ffn_hidden_size=96, expert_ffn_hidden_size=32, n_routed_experts=8, zero_expert_num=4, moe_topk=3,
               routed_scaling_factor=2.0)
LONGCAT_CASES = {
    "longcat_flash": ("longcat_flash", LONGCAT),
    "longcat_flash-3-scale": ("longcat_flash", dict(LONGCAT, num_layers=3, routed_scaling_factor=0.7,
                                                    zero_expert_num=8)),
}
# Keys of a Dots3-Note case as the release's config.json spells them (Transformers rewrites them when it
# saves): the sliding layers' latent as swa_*, their bases and window, the dense layers' count.
DOTS3_HUB_KEYS = ("swa_num_attention_heads", "swa_num_key_value_heads", "swa_q_lora_rank", "swa_kv_lora_rank",
                  "swa_head_dim", "swa_qk_nope_head_dim", "swa_v_head_dim", "sliding_window_size",
                  "first_k_dense_replace", "rope_theta", "swa_rope_theta", "shared_experts_intermediate_size")


def _indexer_margins(model, ids) -> list[float]:
    """Run ``ids`` through ``model`` and return, for every query of every indexed layer that chooses (more
    visible keys than ``index_topk``), the gap between the last score kept and the first left out,
    relative to the scores' spread: a tie (0) would make the choice depend on tie-breaking."""
    gaps = []
    original = Indexer.choose

    def spy(self, x, q_latent, keys, positions, cos_sin):
        scores = self.scores(x, q_latent, keys, cos_sin)
        k = self.spec.topk
        for t, p in enumerate(positions):
            if p + 1 > k:
                v = np.sort(scores[t, :p + 1])[::-1]
                gaps.append(float(v[k - 1] - v[k]) / (float(np.ptp(v)) + 1e-30))
        return original(self, x, q_latent, keys, positions, cos_sin)

    Indexer.choose = spy
    try:
        model.decoder.forward(ids)
    finally:
        Indexer.choose = original
    return gaps


def _steps_and_absorbed(model, ref_model):
    """Token by token from the cache (absorbed attention) against transformers decoding the same way and
    against its whole-prompt logits; the prompt attended the absorbed way at once."""
    ref_logits, _ = reference_logits(ref_model, PROMPT)
    cache = model.decoder.new_cache()
    steps = np.concatenate([model.decoder.forward([t], cache) for t in PROMPT])
    assert rel_err(steps, reference_steps(ref_model, PROMPT)) < 1e-4
    assert rel_err(steps, ref_logits) < 1e-4
    latent = [layer.mixer for layer in model.decoder.layers if hasattr(layer.mixer, "absorb_prompts")]
    for mixer in latent:
        mixer.absorb_prompts = True
    try:
        assert rel_err(model.decoder.forward(PROMPT), ref_logits) < 1e-4
    finally:
        for mixer in latent:
            mixer.absorb_prompts = False


@pytest.mark.parametrize("case", list(CASES))
def test_family_matches_transformers(case, tmp_path):
    model_type, config = CASES[case]
    ref_model = build(tmp_path, model_type, config)
    model = _check(tmp_path, ref_model)
    if model.spec.indexer is not None:
        gaps = _indexer_margins(model, PROMPT)
        assert gaps and min(gaps) > 1e-4, "a top-k choice rests on (nearly) equal scores: pick another case"
    _steps_and_absorbed(model, ref_model)


@pytest.mark.parametrize("case", list(LONGCAT_CASES))
def test_longcat_matches_transformers(case, tmp_path):
    """LongCat-Flash against transformers: logits within 1e-4, the same through the cache in two pieces and token
    by token (absorbed attention), the same 16 greedy tokens, every stored tensor read but the identity experts'
    gate_up rows. Its stored layers run as twice as many (``--layer``, the cache)."""
    model_type, config = LONGCAT_CASES[case]
    ref_model = build(tmp_path, model_type, config)
    model = load_model(str(tmp_path))
    assert model.spec.num_hidden_layers == 2 * config["num_layers"] and model.spec.layers_per_stored == 2
    assert [layer.shortcut for layer in model.spec.layers[:2]] == ["open", "close"]
    assert model.spec.moe.identity_experts == config["zero_expert_num"]
    ref_logits, _ = reference_logits(ref_model, PROMPT)
    err = rel_err(model.decoder.forward(PROMPT), ref_logits)
    assert err < 1e-4, f"logits rel err {err:.2e}"
    ids, _ = model.decoder.layers[0].shortcut.route(np.random.RandomState(0).randn(64, 64).astype(np.float32))
    assert (ids >= config["n_routed_experts"]).any()  # identity experts are chosen
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:9], cache), model.decoder.forward(PROMPT[9:], cache)])
    assert rel_err(pieces, reference_split_logits(ref_model, PROMPT, 9)) < 1e-4
    assert generate(model.decoder, PROMPT, Sampling(max_new_tokens=16)).ids == reference_greedy(ref_model, PROMPT, 16)
    assert model.decoder._weights.unused_tensors(model.spec) == []
    _steps_and_absorbed(model, ref_model)
    from ster_py.inspect import inspect_model

    dims = inspect_model(str(tmp_path))["dimensions"]
    assert (dims["routed_layers"], dims["identity_experts"]) == (config["num_layers"], config["zero_expert_num"])


def test_dots3_note_release_spelling(tmp_path):
    """The release's config.json (swa_* keys, layer_types naming the indexed layers full_attention, use_dsa,
    sliding_window_size, rope_theta / swa_rope_theta, first_k_dense_replace) reads as Transformers reads it."""
    model_type, config = CASES["dots3_note"]
    ref_model = build(tmp_path, model_type, config)
    hub = {k: v for k, v in config.items() if k != "layer_types"}
    hub.update(model_type="dots3_note", use_dsa=True, bos_token_id=1, eos_token_id=2, pad_token_id=0,
               apply_mla_qkv_lora_rescale=True, attention_gate_type="headwise", swa_attention_gate_type="headwise",
               layer_types=["full_attention" if t == "indexed_attention" else t for t in config["layer_types"]])
    (tmp_path / "config.json").write_text(json.dumps(hub))
    model = load_model(str(tmp_path))
    ref_logits, _ = reference_logits(ref_model, PROMPT)
    assert rel_err(model.decoder.forward(PROMPT), ref_logits) < 1e-4
    spec = model.spec
    assert [layer.indexer for layer in spec.layers] == ["full", None, "full", None, None]
    assert [layer.sliding_window for layer in spec.layers] == [None, 4, None, 4, 4]
    own = spec.layers[1].latent
    assert (own.kv_lora_rank, own.q_lora_rank, own.v_head_dim, spec.attention_shape(1)[0]) == (12, 20, 8, 2)
    assert own.kv_scale == pytest.approx((64 / 12) ** 0.5) and spec.latent.q_scale == pytest.approx((64 / 24) ** 0.5)
    assert spec.layers[1].rope.inv_freq[1] != spec.layers[0].rope.inv_freq[1]  # swa_rope_theta, rope_theta


def test_specs_show_the_indexers():
    """Which layers index, share or attend densely, and how the indexer rotates, as the specs read them."""
    model_type, config = CASES["glm_moe_dsa"]
    spec = spec_from_config(dict(config, model_type=model_type), FAMILIES[model_type])
    assert [layer.indexer for layer in spec.layers] == ["full", "shared", "full"]
    assert len(PROMPT) > spec.indexer.topk and spec.indexer.interleaved and not spec.indexer.rope_last
    v32 = spec_from_config(dict(CASES["deepseek_v32"][1], model_type="deepseek_v32"), FAMILIES["deepseek_v32"])
    assert not v32.indexer.interleaved and [layer.indexer for layer in v32.layers] == ["full"] * 3
    assert v32.indexer.norm_eps == 1e-6 and v32.layers[0].rope.interleaved
    offset = spec_from_config(dict(CASES["glm_moe_dsa-freq-offset"][1], model_type="glm_moe_dsa"),
                              FAMILIES["glm_moe_dsa"])  # full where max(i - 1 + 1, 0) % 2 == 0
    assert [layer.indexer for layer in offset.layers] == ["full", "shared", "full", "shared", "full"]


def test_dense_attention_differs_from_the_choice(tmp_path):
    """Switching the indexers off (every key seen) changes the logits of the sparse case: the test above
    exercises the choice, not only the dense attention."""
    from dataclasses import replace

    ref_model = build(tmp_path, *CASES["deepseek_v32"])
    model = load_model(str(tmp_path))
    ref_logits, _ = reference_logits(ref_model, PROMPT)
    for layer in model.decoder.layers:
        layer.mixer.layer = replace(layer.mixer.layer, indexer=None)
    assert rel_err(model.decoder.forward(PROMPT), ref_logits) > 1e-2


def test_per_head_maps_read_ahead_one_head_at_a_time():
    """Quantized per-head halves of kv_b (llama.cpp's attn_k_b / attn_v_b) are read ahead head by head: a group of
    16 heads would exceed what a quantized matrix reads ahead (at most 4), which failed DeepSeek-V2-Lite's load."""
    from ster_py.decoder.latent import PerHead

    per_head = PerHead.__new__(PerHead)
    per_head.stack, per_head.parts = None, [object() for _ in range(16)]
    groups = per_head.read_order()
    assert [g[0] for g in groups] == per_head.parts and all(len(g) == 1 for g in groups)


def test_select_top_keeps_every_key_up_to_topk():
    scores = np.array([[3, 1, 2, 9, 0], [3, 1, 2, 9, 0], [0, 5, 5, 1, 4]], np.float32)
    assert select_top(scores, np.array([0, 1, 2]), 3) is None  # no query sees more than 3 keys
    keep = select_top(scores, np.array([2, 3, 4]), 2)
    assert keep.tolist() == [[True, False, True, False, False], [True, False, False, True, False],
                             [False, True, True, False, False]]


def test_indexer_keys_are_cached(tmp_path):
    """An indexed layer's slot keeps its index keys (float32, one per position) beside the latent rows;
    ster inspect counts them per position."""
    from ster_py.inspect import inspect_model

    build(tmp_path, *CASES["glm_moe_dsa"])
    model = load_model(str(tmp_path))
    cache = model.decoder.new_cache()
    model.decoder.forward(PROMPT, cache)
    widths = [cache.slot(i).index_width for i in range(3)]
    assert widths == [8, 0, 8]  # the shared layer has no indexer of its own
    assert cache.slot(0).index[:len(PROMPT)].shape == (16, 8)
    per_layer = 4 * (16 + 4)
    assert cache.nbytes_per_position() == 3 * per_layer + 2 * 4 * 8
    assert inspect_model(str(tmp_path))["kv_bytes_per_position"] == cache.nbytes_per_position()


# ----------------------------------------------------------------------------- refusals

REFUSED = {
    "v32-softmax": ("deepseek_v32", dict(scoring_func="softmax"), "scoring_func other than sigmoid"),
    "v32-greedy": ("deepseek_v32", dict(topk_method="greedy"), "topk_method other than noaux_tc"),
    "v32-halves": ("deepseek_v32", dict(rope_interleave=False), "rope_interleave"),
    "v32-indexer-pairs": ("deepseek_v32", dict(indexer_rope_interleave=True), "indexer_rope_interleave"),
    "v32-freq": ("deepseek_v32", dict(moe_layer_freq=2), "moe_layer_freq"),
    "v32-fp8": ("deepseek_v32", dict(quantization_config={"quant_method": "fp8"}), "quantization_config"),
    "glm-dsa-indexer-halves": ("glm_moe_dsa", dict(indexer_rope_interleave=False), "indexer_rope_interleave"),
    "glm-dsa-softmax": ("glm_moe_dsa", dict(scoring_func="softmax"), "scoring_func"),
    "dots3-gate": ("dots3_note", dict(attention_gate_type="elementwise"), "headwise"),
    "dots3-swa-gate": ("dots3_note", dict(swa_attention_gate_type="none"), "headwise"),
    "dots3-rope-widths": ("dots3_note", dict(swa_head_dim=256, swa_qk_nope_head_dim=128), "swa_qk_rope_head_dim"),
    "dots3-rope-width": ("dots3_note", dict(swa_qk_rope_head_dim=32), "swa_qk_rope_head_dim"),
    "dots3-no-rescale": ("dots3_note", dict(apply_mla_qkv_lora_rescale=False), "apply_mla_qkv_lora_rescale"),
    "dots3-yarn": ("dots3_note", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_scaling"),
    "dots3-indexer-halves": ("dots3_note", dict(indexer_rope_interleave=False), "indexer_rope_interleave"),
    "dots3-softmax": ("dots3_note", dict(scoring_func="softmax"), "scoring_func"),
    "longcat-head-dim": ("longcat_flash", dict(head_dim=128), "head_dim other than qk_rope_head_dim"),
    "longcat-qk-head-dim": ("longcat_flash", dict(qk_head_dim=256), "qk_head_dim"),
    "longcat-no-q-lora": ("longcat_flash", dict(q_lora_rank=None), "q_lora_rank"),
    "longcat-no-scale": ("longcat_flash", dict(mla_scale_kv_lora=False), "mla_scale_kv_lora"),
    "longcat-router-bias": ("longcat_flash", dict(router_bias=True), "router_bias"),
}


@pytest.mark.parametrize("key", list(REFUSED))
def test_refused_configurations(key, tmp_path):
    model_type, extra, match = REFUSED[key]
    with pytest.raises(SterError, match=match):
        gate({"model_type": model_type, **extra}, tmp_path / "config.json")


@pytest.mark.parametrize("extra,match", [
    (dict(indexer_types=["shared", "full", "full"]), "before any layer has an indexer"),
    (dict(indexer_types=["full", "full"]), "indexer_types must list"),
    (dict(q_lora_rank=None), "without a query bottleneck"),
    (dict(index_head_dim=2), "must not exceed index_head_dim"),
])
def test_refused_indexer_shapes(extra, match):
    config = dict(CASES["glm_moe_dsa"][1], model_type="glm_moe_dsa", **extra)
    with pytest.raises(SterError, match=match):
        spec_from_config(config, FAMILIES["glm_moe_dsa"])


def test_refusal_comes_before_any_weight(tmp_path):
    build(tmp_path, *CASES["deepseek_v32"])
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, indexer_rope_interleave=True)))
    (tmp_path / "model.safetensors").write_bytes(b"corrupt: proves nothing reads it")
    with pytest.raises(SterError, match="indexer_rope_interleave"):
        load_model(str(tmp_path))


# ----------------------------------------------------------------------------- GGUF, via llama.cpp

GGUF_CASES = {  # name: (model_type, config, legacy config.json keys)
    "deepseek32": ("deepseek_v32", CASES["deepseek_v32"][1], {"scoring_func": "sigmoid"}),
    "glm-dsa": ("glm_moe_dsa", CASES["glm_moe_dsa"][1], {}),
}
WIDE = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=64, kv_lora_rank=256, q_lora_rank=256,
            qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=64)
WIDE_EXPERTS = dict(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=256)
WIDE_DSA = dict(index_topk=8, index_head_dim=64, index_n_heads=4)
QUANT_CASES = {
    "q-deepseek32": ("deepseek_v32", dict(WIDE, **WIDE_EXPERTS, **WIDE_DSA, n_group=2, topk_group=1,
                                          first_k_dense_replace=1), {"scoring_func": "sigmoid"}),
    "q-glm-dsa": ("glm_moe_dsa", dict(WIDE, **WIDE_EXPERTS, **WIDE_DSA, first_k_dense_replace=1,
                                      indexer_types=["full", "shared", "full"]), {}),
}
LONG_PROMPT = np.random.RandomState(3).randint(3, VOCAB, size=32).tolist()


def _decisive_dsa(path, model_type, config, components=None):
    """``test_parity_mla._decisive`` (decisive routing, 256-wide weights scaled by 0.25), plus a decisive
    indexer: every index query and key points along one rotary pair of frequency 10000 ** (-8 / 32)
    (0.1 rad per position), and every index head's weight is positive, so a key's score falls with its
    distance d from the query as relu(cos(0.1 d)) (which stays below its first value up to d = 31): each
    query keeps its 8 nearest keys, the eighth and ninth 7 % of the spread apart. A random indexer's 8th and 9th scores lie within a few percent of each other somewhere
    in a 32-token prompt, where llama.cpp's quantized activations may choose another key than ster.

    The direction comes from a residual-stream column every token's embedding holds at 20 standard
    deviations and no sublayer writes to (its rows of every o_proj and down_proj are zero): q_a reads it into
    the query latent's first component, wq_b, wk and weights_proj read that and it."""
    import torch

    model = _decisive(path, model_type, config)
    col = config["n_routed_experts"]  # the columns before it carry _decisive's routing features
    pair, rope = 4, config["qk_rope_head_dim"]
    a = (2 * pair, 2 * pair + 1) if FAMILIES[model_type].indexer["interleaved"] else (pair, pair + rope // 2)
    a = components or a  # (another rotation's pair: test_parity_hc_gguf)
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb[:, col] = 20 * float(emb.std())
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p[col] = 0.0
            elif name.endswith("experts.down_proj"):
                p[:, col] = 0.0
            elif name.endswith("q_a_proj.weight"):
                p[0] = 0.0
                p[0, col] = 4.0
            elif name.endswith("indexer.wq_b.weight"):
                heads = p.shape[0] // config["index_head_dim"]
                for h in range(heads):
                    p[h * config["index_head_dim"] + a[0], 0] = 8.0
                    p[h * config["index_head_dim"] + a[1], 0] = 0.0
            elif name.endswith("indexer.wk.weight"):
                p[a[0]] = 0.0
                p[a[0], col] = 8.0
                p[a[1]] = 0.0
            elif name.endswith("indexer.weights_proj.weight"):
                p[:, col] = 1.0
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """name -> (converted F32 .gguf, transformers model) for GGUF_CASES and QUANT_CASES."""
    from llamacpp_convert import convert_cases

    def make(path, model_type, config):
        return (_decisive_dsa if path.name in QUANT_CASES else build)(path, model_type, config)

    return convert_cases(tmp_path_factory.mktemp("llama_cpp_mla_b"), {**GGUF_CASES, **QUANT_CASES}, make)


@pytest.mark.parametrize("name", list(GGUF_CASES))
def test_gguf_matches_transformers(name, converted):
    path, ref_model = converted[name]
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
    if model.spec.indexer is not None:
        source = spec_from_config(dict(GGUF_CASES[name][1], model_type=GGUF_CASES[name][0]),
                                  FAMILIES[GGUF_CASES[name][0]])
        assert [layer.indexer for layer in model.spec.layers] == [layer.indexer for layer in source.layers]


@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_K_M"])
@pytest.mark.parametrize("name", list(QUANT_CASES))
def test_quantized_gguf_gives_llamacpps_logits(name, ftype, converted, tmp_path):
    """llama.cpp's Q8_0 / Q4_K_M of the file, run by ster (projections and experts kept in their blocks) and
    by llama.cpp: logits within 5 %, llama.cpp's top-1 token at every position of a 32-token prompt but
    near-ties, and token-by-token decoding equal to the whole prompt."""
    from ster_py import llamacpp
    from ster_py.decoder.qlinear import QuantLinear

    path, _ = converted[name]
    q = llamacpp.quantize(path, tmp_path / f"{name}-{ftype}.gguf", ftype)
    model = load_model(str(q))
    if model.spec.indexer is not None:  # the decisive indexer: the 8th and 9th scores far apart
        assert min(_indexer_margins(model, LONG_PROMPT)) > 0.05
    mixer = model.decoder.layers[1].mixer
    assert type(mixer.o) is QuantLinear and type(mixer.kv_a) is QuantLinear
    ours = model.decoder.forward(LONG_PROMPT)
    (ref,) = llamacpp.logits(q, [LONG_PROMPT])
    ref = ref[:, :ours.shape[1]]
    check_llamacpp_top1(ours, ref)  # a routing flip would move a whole row far more than a near-tie
    check_token_steps(model, LONG_PROMPT, ours)


def test_gguf_glm_dsa_indexer_types_without_the_key():
    """llama.cpp's glm-dsa loader without attention.indexer.types: every layer full below a 1048576-token
    context (GLM-5, 5.1), GLM-5.2's pattern (two full, then every fourth) from there on."""
    from ster_py.decoder.latent import LatentSpec
    from ster_py.gguf.config import _gguf_indexer

    meta = {"glm-dsa.attention.indexer.head_count": 4, "glm-dsa.attention.indexer.key_length": 16,
            "glm-dsa.attention.indexer.top_k": 8}
    latent = LatentSpec(16, 24, 8, 4, 12)
    _, kinds = _gguf_indexer(meta, "glm-dsa", latent, 10, 202752, "x.gguf")
    assert kinds == ["full"] * 10
    _, kinds = _gguf_indexer(meta, "glm-dsa", latent, 10, 1048576, "x.gguf")
    assert kinds == ["full", "full", "full", "shared", "shared", "shared", "full", "shared", "shared", "shared"]
    _, kinds = _gguf_indexer(dict(meta, **{"glm-dsa.attention.indexer.types": [True, False, True]}), "glm-dsa",
                             latent, 3, 64, "x.gguf")
    assert kinds == ["full", "shared", "full"]
    with pytest.raises(SterError, match="marks layer 0 shared"):
        _gguf_indexer(dict(meta, **{"glm-dsa.attention.indexer.types": [False, True, True]}), "glm-dsa", latent,
                      3, 64, "x.gguf")
