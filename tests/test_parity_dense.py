"""The dense families of issue 6, each against transformers on tiny random checkpoints.

Each case builds a checkpoint with transformers from a config written in the family's
own key spellings (small dims, 3 layers, the family's optional flags switched on in at
least one variant), loads the saved directory with ster and checks: logits of a 16-token
prompt within relative error 1e-4 of transformers (f32); the same when the prompt is fed
in two pieces through the KV cache, against transformers fed the same way; and the same
16 greedy tokens. Norm weights and every bias are randomised so that none is a no-op.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from ster_py.errors import SterError
from ster_py.families import FAMILIES, FAMILIES_BY_GGUF_ARCH, gate
from ster_py.generate import Sampling, generate
from ster_py.load import load_model
from tiny import build_checkpoint as build
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)
from tiny import reference_greedy, reference_logits, reference_split_logits, rel_err, write_tokenizer

VOCAB = 128
PROMPT = np.random.RandomState(1).randint(3, VOCAB, size=16).tolist()
LLAMA = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
GPT = dict(vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4, n_positions=64)
LAYERS_SWS = ["sliding_attention", "full_attention", "sliding_attention"]
def _config(path) -> dict:
    return json.loads((path / "config.json").read_text())


_LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
             "original_max_position_embeddings": 8, "short_factor": [1.0, 1.2, 1.5, 2.0],
             "long_factor": [1.0, 2.0, 4.0, 8.0]}
_GRANITE_MULT = dict(embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=3.0)

CASES = {
    "phi3": ("phi3", dict(LLAMA)),
    "phi3-longrope-partial-window": ("phi3", dict(LLAMA, rope_parameters=_LONGROPE, sliding_window=5)),
    "phi": ("phi", dict(LLAMA, num_key_value_heads=4)),
    "phi-qk-layernorm-gqa": ("phi", dict(LLAMA, qk_layernorm=True)),
    "gpt2": ("gpt2", dict(GPT)),
    "gpt2-unscaled-untied": ("gpt2", dict(GPT, scale_attn_weights=False, n_inner=96, tie_word_embeddings=False)),
    "gpt_neox": ("gpt_neox", dict(LLAMA, num_key_value_heads=None)),
    "gpt_neox-sequential": ("gpt_neox", dict(LLAMA, num_key_value_heads=None, use_parallel_residual=False,
                                             rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                                              "partial_rotary_factor": 0.5})),
    "stablelm": ("stablelm", dict(LLAMA)),
    "stablelm-parallel-qk-norm-bias": ("stablelm", dict(LLAMA, use_parallel_residual=True, qk_layernorm=True,
                                                        use_qkv_bias=True)),
    "starcoder2-window": ("starcoder2", dict(LLAMA, sliding_window=5)),
    "granite": ("granite", dict(LLAMA, **_GRANITE_MULT, attention_bias=True, mlp_bias=True)),
    "cohere": ("cohere", dict(LLAMA)),
    "cohere-qk-norm": ("cohere", dict(LLAMA, use_qk_norm=True, logit_scale=0.5, tie_word_embeddings=False)),
    "cohere2": ("cohere2", dict(LLAMA, sliding_window=5, layer_types=LAYERS_SWS)),
    # Transformers rotates whole heads in these families whatever partial_rotary_factor says
    "cohere2-share-ignored": ("cohere2", dict(LLAMA, sliding_window=5, layer_types=LAYERS_SWS,
                                              partial_rotary_factor=0.5)),
    "olmo2-share-ignored": ("olmo2", dict(LLAMA, partial_rotary_factor=0.5)),
    # An epsilon or activation under a key Transformers does not read for the family (EPS_KEYS, ACT_KEYS)
    "phi-eps-under-rms-norm-eps": ("phi", dict(LLAMA, num_key_value_heads=4, rms_norm_eps=0.1)),
    "starcoder2-eps-under-layer-norm-eps": ("starcoder2", dict(LLAMA, layer_norm_eps=0.1)),
    "vaultgemma-act-named-relu2": ("vaultgemma", dict(LLAMA, head_dim=16, hidden_act="relu2")),
    "olmo-clip": ("olmo", dict(LLAMA, clip_qkv=0.1)),
    "olmo2": ("olmo2", dict(LLAMA)),
    "olmo3-window": ("olmo3", dict(LLAMA, sliding_window=5, layer_types=LAYERS_SWS)),
    "nemotron": ("nemotron", dict(LLAMA, mlp_bias=True, attention_bias=True)),
    "gptj": ("gptj", dict(GPT, rotary_dim=8)),
    "gpt_bigcode-mqa": ("gpt_bigcode", dict(GPT)),
    "gpt_bigcode-mha": ("gpt_bigcode", dict(GPT, multi_query=False)),
    "opt": ("opt", dict(LLAMA, num_key_value_heads=None, ffn_dim=96, word_embed_proj_dim=64)),
    "opt-no-affine-relu": ("opt", dict(LLAMA, num_key_value_heads=None, ffn_dim=96, word_embed_proj_dim=64,
                                       layer_norm_elementwise_affine=False, enable_bias=False)),
    "bloom": ("bloom", dict(vocab_size=VOCAB, hidden_size=64, n_layer=3, n_head=4)),
    "bloom-6-heads": ("bloom", dict(vocab_size=VOCAB, hidden_size=48, n_layer=3, n_head=6)),
    "falcon-mqa-parallel": ("falcon", dict(LLAMA, num_key_value_heads=None, ffn_hidden_size=96)),
    "falcon-new-arch-2ln-bias": ("falcon", dict(LLAMA, num_key_value_heads=None, new_decoder_architecture=True,
                                                num_kv_heads=2, bias=True, ffn_hidden_size=96)),
    "falcon-new-arch-1ln": ("falcon", dict(LLAMA, num_key_value_heads=None, new_decoder_architecture=True,
                                           num_kv_heads=2, num_ln_in_parallel_attn=1)),
    "falcon-mha-sequential": ("falcon", dict(LLAMA, num_key_value_heads=None, multi_query=False,
                                             parallel_attn=False)),
    "mpt": ("mpt", dict(vocab_size=VOCAB, d_model=64, n_heads=4, n_layers=3, max_seq_len=64, expansion_ratio=4)),
    "internlm3-biases": ("internlm3", dict(LLAMA, head_dim=16, qkv_bias=True, bias=True)),
    "exaone4-window": ("exaone4", dict(LLAMA, sliding_window=5, layer_types=LAYERS_SWS)),
    "exaone4-global": ("exaone4", dict(LLAMA, sliding_window=None, layer_types=["full_attention"] * 3)),
    "exaone": ("exaone", dict(LLAMA)),
    "seed_oss-biases": ("seed_oss", dict(LLAMA, head_dim=16, attention_bias=True, attention_out_bias=True,
                                         mlp_bias=True)),
    "arcee": ("arcee", dict(LLAMA, head_dim=16)),
    "ernie4_5-bias": ("ernie4_5", dict(LLAMA, head_dim=16, use_bias=True)),
    "glm": ("glm", dict(LLAMA, head_dim=16)),
    "glm4": ("glm4", dict(LLAMA, head_dim=16)),
    "hunyuan_v1_dense-alpha": ("hunyuan_v1_dense", dict(LLAMA, head_dim=16, attention_bias=True, rope_parameters={
        "rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 50.0, "factor": 1.0})),
    "granite_swa": ("granite_swa", dict(LLAMA, **_GRANITE_MULT, sliding_window=5,
                                        layer_types=["full_attention", "sliding_attention", "sliding_attention"],
                                        layer_rope_theta=[10000.0, 500.0, 0.0])),
    "hyperclovax": ("hyperclovax", dict(LLAMA, head_dim=16, **_GRANITE_MULT)),
    "hyperclovax-no-post-norm": ("hyperclovax", dict(LLAMA, head_dim=16, use_post_norm=False)),
    "iquestcoder-mlp-bias": ("iquestcoder", dict(LLAMA, head_dim=16, mlp_bias=True)),
    "jais2": ("jais2", dict(LLAMA, head_dim=16)),
    "vaultgemma-window": ("vaultgemma", dict(LLAMA, head_dim=16, sliding_window=5, query_pre_attn_scalar=24,
                                             attn_logit_softcapping=3.0, final_logit_softcapping=5.0)),
    "apertus": ("apertus", dict(LLAMA)),
    "ministral3-temperature": ("ministral3", dict(LLAMA, head_dim=16, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 4,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1})),
}
# Falcon's ALiBi: transformers' eager path adds the bias twice (once in the mask, once in the
# scores); its SDPA path adds it once, as Falcon's own code does, so that path is the oracle.
ATTN = {"falcon-alibi": "sdpa"}
# 16 heads: the first head count whose slopes (2 ** -0.5 k) are not exact in bfloat16.
CASES["falcon-alibi"] = ("falcon", dict(LLAMA, num_attention_heads=16, num_key_value_heads=None, alibi=True,
                                        multi_query=False))


def _check(path, ref_model):
    ref_logits, ref_hidden = reference_logits(ref_model, PROMPT)
    model = load_model(str(path))
    hidden: list = []
    logits = model.decoder.forward(PROMPT, hidden_states=hidden)
    err = rel_err(logits, ref_logits)
    assert err < 1e-4, f"logits rel err {err:.2e}"
    assert len(hidden) == len(ref_hidden) and rel_err(hidden[0], ref_hidden[0]) < 1e-5

    cache = model.decoder.new_cache()
    pieces = [model.decoder.forward(PROMPT[:9], cache), model.decoder.forward(PROMPT[9:], cache)]
    split_err = rel_err(np.concatenate(pieces), reference_split_logits(ref_model, PROMPT, 9))
    assert split_err < 1e-4, f"cached split rel err {split_err:.2e}"

    ours = generate(model.decoder, PROMPT, Sampling(max_new_tokens=16)).ids
    assert ours == reference_greedy(ref_model, PROMPT, 16)
    # Every tensor transformers saved is read or known to be harmless: no false "unused" warning.
    assert model.decoder._weights.unused_tensors(model.spec) == []
    return model


@pytest.mark.parametrize("case", list(CASES))
def test_family_matches_transformers(case, tmp_path):
    model_type, config = CASES[case]
    ref_model = build(tmp_path, model_type, config, attn=ATTN.get(case, "eager"))
    _check(tmp_path, ref_model)


def test_every_landed_family_has_a_case():
    """No family is registered without a parity case above (or in test_parity_families.py)."""
    import test_parity_gemma4
    import test_parity_hc
    import test_parity_mla
    import test_parity_mla_b
    import test_parity_moe
    import test_parity_remote
    import test_parity_remote_b
    import test_parity_remote_c
    import test_parity_ssm
    import test_parity_ssm_b1
    import test_parity_ssm_b2

    foundation = {"llama", "mistral", "qwen2", "qwen3", "smollm3", "gemma", "gemma2", "gemma3_text"}
    tested = {model_type for model_type, _ in CASES.values()}
    tested |= {model_type for model_type, _ in test_parity_moe.CASES.values()}
    tested |= {model_type for model_type, _ in test_parity_mla.CASES.values()}
    tested |= {model_type for model_type, _ in test_parity_mla_b.CASES.values()}
    tested |= {model_type for model_type, _ in test_parity_mla_b.LONGCAT_CASES.values()}
    tested |= {model_type for model_type, _ in test_parity_ssm.CASES.values()}
    tested |= {model_type for model_type, _ in test_parity_ssm_b1.CASES.values()}
    tested.add("minimax_text_01")  # test_parity_ssm_b1.test_minimax_text_01_as_minimax_releases_it
    tested |= {model_type for model_type, _ in test_parity_gemma4.CASES.values()}
    tested |= {model_type for model_type, _ in test_parity_ssm_b2.CASES.values()}
    tested |= {model_type for model_type, _ in test_parity_remote.CASES.values()}
    tested |= {model_type for model_type, _ in test_parity_hc.CASES.values()}
    tested |= {"deepseek_v4"} if test_parity_hc.V4_CASES else set()
    tested |= {"glm5_next_text"} if test_parity_hc.G5_CASES else set()
    tested |= {model_type for model_type, _ in test_parity_remote_b.CASES.values()}
    tested |= {"step1"} if test_parity_remote_b.STEP1_CASES else set()  # its own test there (a bias-masked oracle)
    tested |= {model_type for model_type, _ in test_parity_remote_c.CASES.values()}  # group R2
    tested |= {model_type for model_type, _ in test_parity_remote_c.HYBRID_CASES.values()}
    tested.add("chatglm")  # tests/test_chatglm.py (its own equivalence and per-feature cases)
    tested |= {"muse_glimmer_text", "minimax_m3_vl_text", "inkling_text"}  # tests/test_parity_wrapped.py
    tested.add("gemma3n_text")  # tests/test_parity_gemma3n.py
    tested |= {"nanbeige", "iquestloopcoder", "hrm_text"}  # tests/test_parity_loops.py
    assert set(FAMILIES) == foundation | tested


def test_variants_switch_on_what_they_claim(tmp_path):
    """The spec of a few variants shows the feature the case is there to exercise."""
    build(tmp_path / "f", "falcon", CASES["falcon-new-arch-2ln-bias"][1])
    spec = load_model(str(tmp_path / "f")).spec
    assert spec.parallel and spec.num_key_value_heads == 2 and spec.norms == ("attn_norm", "ffn_norm")
    build(tmp_path / "g", "granite_swa", CASES["granite_swa"][1])
    spec = load_model(str(tmp_path / "g")).spec
    assert [layer.sliding_window for layer in spec.layers] == [None, 5, 5] and spec.sinks
    assert spec.layers[2].rope is None and spec.layers[0].rope.inv_freq[1] != spec.layers[1].rope.inv_freq[1]
    build(tmp_path / "c", "cohere2", CASES["cohere2"][1])
    assert [layer.rope is None for layer in load_model(str(tmp_path / "c")).spec.layers] == [False, True, False]
    build(tmp_path / "o", "olmo", CASES["olmo-clip"][1])
    assert load_model(str(tmp_path / "o")).spec.clip_qkv == 0.1


def test_gpt2_saved_from_the_base_model_loads(tmp_path):
    """GPT-2 weights saved without the ``transformer.`` prefix (GPT2Model) load the same way."""
    ref_model = build(tmp_path / "full", "gpt2", dict(GPT))
    ref_model.transformer.save_pretrained(tmp_path / "base")
    write_tokenizer(tmp_path / "base", VOCAB)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "base" / "model.safetensors"), "np") as f:
        assert "h.0.attn.c_attn.weight" in f.keys()
    ref_logits, _ = reference_logits(ref_model, PROMPT)
    assert rel_err(load_model(str(tmp_path / "base")).decoder.forward(PROMPT), ref_logits) < 1e-4


def test_gpt_neox_config_in_legacy_spelling(tmp_path):
    """A Transformers 4-era GPT-NeoX config (rotary_pct, rotary_emb_base) reads as its rope_parameters twin."""
    ref_model = build(tmp_path, "gpt_neox", CASES["gpt_neox-sequential"][1])
    cfg = _config(tmp_path)
    rp = cfg.pop("rope_parameters")
    cfg.update(rotary_pct=rp["partial_rotary_factor"], rotary_emb_base=rp["rope_theta"])
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    ref_logits, _ = reference_logits(ref_model, PROMPT)
    assert rel_err(load_model(str(tmp_path)).decoder.forward(PROMPT), ref_logits) < 1e-4


WHOLE_HEAD = ("llama", "mistral", "qwen2", "qwen3", "smollm3", "gemma", "gemma2", "gemma3_text", "granite",
              "starcoder2", "cohere", "cohere2", "olmo", "olmo2", "olmo3", "exaone4", "internlm3", "seed_oss", "arcee",
              "ernie4_5", "exaone", "granite_swa", "iquestcoder", "hyperclovax", "jais2", "vaultgemma")


@pytest.mark.parametrize("model_type", WHOLE_HEAD)
def test_whole_head_families_drop_a_share(model_type):
    """Transformers' default tables for these families never read partial_rotary_factor (top level or in
    rope_parameters) and rotate all of each head; ster drops the share (the other rope types refuse it)."""
    from ster_py.config import spec_from_config

    for share in ({"partial_rotary_factor": 0.5},
                  {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}):
        cfg = dict(LLAMA, model_type=model_type, head_dim=16, sliding_window=5, layer_types=LAYERS_SWS, **share)
        spec = spec_from_config(cfg, FAMILIES[model_type])
        assert {layer.rope.rotary_dim for layer in spec.layers if layer.rope is not None} == {16}


NO_WINDOW = ("llama", "gemma", "phi", "granite", "stablelm", "cohere", "nemotron", "olmo", "olmo2", "internlm3",
             "seed_oss", "arcee", "ernie4_5", "glm", "glm4", "exaone", "jais2", "apertus", "hyperclovax", "gpt_neox",
             "gptj", "gpt2", "bloom", "gpt_bigcode", "opt", "falcon", "hunyuan_v1_dense")


@pytest.mark.parametrize("model_type", NO_WINDOW)
def test_families_without_windows_ignore_layer_types(model_type):
    """These families' Transformers attention has no sliding window: a config's sliding_window and the
    layers its layer_types marks sliding_attention attend to every earlier position."""
    from ster_py.config import spec_from_config

    cfg = dict(LLAMA, model_type=model_type, head_dim=16, sliding_window=5, layer_types=LAYERS_SWS, ffn_dim=96)
    assert [layer.sliding_window for layer in spec_from_config(cfg, FAMILIES[model_type]).layers] == [None] * 3


def test_olmo2_with_sliding_layer_types_matches_transformers_whole_prompt(tmp_path):
    """The whole-prompt logits only: Transformers' cache keeps a window on the layers layer_types marks sliding
    while its attention has none, so its own cached decoding fails past the window."""
    ref_model = build(tmp_path, "olmo2", dict(LLAMA, sliding_window=5, layer_types=LAYERS_SWS))
    err = rel_err(load_model(str(tmp_path)).decoder.forward(PROMPT), reference_logits(ref_model, PROMPT)[0])
    assert err < 1e-4, f"logits rel err {err:.2e}"


EPS_KEYS = {"phi": "layer_norm_eps", "stablelm": "layer_norm_eps", "starcoder2": "norm_epsilon",
            "cohere": "layer_norm_eps", "cohere2": "layer_norm_eps", "nemotron": "norm_eps", "gpt_neox": "layer_norm_eps",
            "jais2": "layer_norm_eps"}
ACT_KEYS = {"gemma2": "hidden_activation", "gemma3_text": "hidden_activation", "vaultgemma": "hidden_activation",
            "gemma4_text": "hidden_activation", "gemma4_unified_text": "hidden_activation",
            "gemma3n_text": "hidden_activation"}


@pytest.mark.parametrize("model_type", list(EPS_KEYS) + list(ACT_KEYS))
def test_epsilon_and_activation_come_from_the_key_transformers_reads(model_type):
    """Each of these families' Transformers config reads its normalization epsilon (1e-5 when absent) or its
    activation under one key; the other spellings a config may also carry are not read."""
    from ster_py.config import spec_from_config

    eps = ("rms_norm_eps", "layer_norm_eps", "norm_epsilon", "norm_eps", "layer_norm_epsilon")
    cfg = dict(LLAMA, model_type=model_type, head_dim=16, sliding_window=5, layer_types=LAYERS_SWS,
               hidden_act="relu2", hidden_activation="gelu", num_kv_shared_layers=0,
               **{k: 0.1 * (i + 1) for i, k in enumerate(eps)})
    spec = spec_from_config(cfg, FAMILIES[model_type])
    if model_type in EPS_KEYS:
        assert spec.norm_eps == cfg[EPS_KEYS[model_type]]
        bare = {k: v for k, v in cfg.items() if k not in eps}
        assert spec_from_config(bare, FAMILIES[model_type]).norm_eps == 1e-5
    else:
        assert spec.hidden_act == cfg[ACT_KEYS[model_type]]


REFUSED = {
    "gpt2": ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
    "opt": ({"do_layer_norm_before": False}, "do_layer_norm_before"),
    "opt ": ({"hidden_size": 64, "word_embed_proj_dim": 32}, "word_embed_proj_dim"),
    "bloom": ({"apply_residual_connection_post_layernorm": True}, "apply_residual_connection_post_layernorm"),
    "mpt": ({"attn_config": {"qk_ln": True}}, "qk_ln"),
    "mpt ": ({"attn_config": {"clip_qkv": 8.0}}, "clip_qkv"),
    "mpt  ": ({"attn_config": {"softmax_scale": 0.1}}, "softmax_scale"),
    "mpt   ": ({"attn_config": {"attn_type": "multiquery_attention"}}, "attn_type"),
    "mpt    ": ({"attn_config": {"alibi_bias_max": 16}}, "alibi_bias_max"),
    "mpt     ": ({"n_heads": 6, "attn_config": {"alibi": True}}, "power of two"),
    "mpt      ": ({"attn_config": {"alibi": False}}, "learned positions"),
    "falcon": ({"new_decoder_architecture": True, "parallel_attn": False}, "parallel_attn"),
    "gptj": ({"rotary_dim": None}, "rotary_dim"),
    # Transformers' GPT-NeoX sizes its rotation by head_dim, its heads by hidden_size / num_attention_heads
    "gpt_neox": ({"hidden_size": 64, "num_attention_heads": 4, "head_dim": 32}, "head_dim other than"),
    # Transformers' Ministral3 does not place its windows by layer_types (ster slid as they said)
    "ministral3": ({"sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
    "granite_swa": ({"rope_theta": 10000.0, "layer_types": ["full_attention", "sliding_attention"],
                     "layer_rope_theta": [5000.0, 10000.0]}, "layer_rope_theta"),
    "granite_swa ": ({"rope_theta": 10000.0, "layer_types": ["sliding_attention", "sliding_attention"],
                      "layer_rope_theta": [10000.0, 500.0]}, "layer_rope_theta"),
}


@pytest.mark.parametrize("key", list(REFUSED))
def test_refused_configurations(key, tmp_path):
    """What seed 002 refuses for a family is refused by the gate, naming the feature."""
    extra, match = REFUSED[key]
    with pytest.raises(SterError, match=match):
        gate({"model_type": key.strip(), **extra}, tmp_path / "config.json")


def test_refusal_comes_before_any_weight(tmp_path):
    build(tmp_path, "gpt2", dict(GPT))
    cfg = _config(tmp_path)
    cfg["scale_attn_by_inverse_layer_idx"] = True
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").write_bytes(b"corrupt: proves nothing reads it")
    with pytest.raises(SterError, match="scale_attn_by_inverse_layer_idx"):
        load_model(str(tmp_path))


def test_gpt_neox_head_dim_of_the_heads_and_ministral3_without_layer_types_pass_the_gate(tmp_path):
    assert gate({"model_type": "gpt_neox", "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16},
                tmp_path / "config.json").model_type == "gpt_neox"
    assert gate({"model_type": "ministral3", "sliding_window": 4}, tmp_path / "config.json").model_type == "ministral3"


def test_accepted_granite_swa_bases_pass_the_gate(tmp_path):
    ok = {"model_type": "granite_swa", "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
          "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
          "layer_rope_theta": [10000.0, 500.0, 0.0]}
    assert gate(ok, tmp_path / "config.json").model_type == "granite_swa"


# --------------------------------------------------------------------------- GGUF, via llama.cpp's converter
#
# Each case is a tiny checkpoint converted by llama.cpp's own convert_hf_to_gguf.py (from the
# llama-cpp-python sdist, run in one subprocess for all cases); ster loads the bare .gguf and its
# logits must be within 1e-3 of transformers on the checkpoint (the GGUF bar), whole and
# through the KV cache. The converter's vocabulary step is replaced by a minimal SentencePiece-style
# vocabulary (the tiny checkpoints' word-level tokenizer is none it knows); weights and
# hyper-parameters go through the converter untouched. ``legacy`` keys are written into
# config.json for converters that still read Transformers 4 spellings.

_SWS4 = ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]
GGUF_CASES = {  # name: (model_type, config, legacy config.json keys)
    "phi2": ("phi", dict(LLAMA, num_key_value_heads=4, intermediate_size=256), {}),
    "phi3": ("phi3", dict(LLAMA), {}),
    "gpt2": ("gpt2", dict(GPT), {"n_ctx": 64}),
    "gptneox": ("gpt_neox", dict(LLAMA, num_key_value_heads=None), {"rotary_pct": 0.25}),
    "gptneox-sequential": ("gpt_neox", dict(LLAMA, num_key_value_heads=None, use_parallel_residual=False),
                           {"rotary_pct": 0.25}),
    "stablelm": ("stablelm", dict(LLAMA), {}),
    "stablelm-parallel": ("stablelm", dict(LLAMA, use_parallel_residual=True), {}),
    "starcoder2": ("starcoder2", dict(LLAMA), {}),
    "granite": ("granite", dict(LLAMA, **_GRANITE_MULT, mlp_bias=True), {}),
    "command-r": ("cohere", dict(LLAMA), {}),
    "command-r-qk-norm": ("cohere", dict(LLAMA, use_qk_norm=True), {}),  # read by presence, as llama.cpp does
    "cohere2": ("cohere2", dict(LLAMA, num_hidden_layers=4, sliding_window=5, layer_types=_SWS4), {"rotary_pct": 1.0}),
    "olmo": ("olmo", dict(LLAMA, clip_qkv=0.1), {}),
    "olmo2": ("olmo2", dict(LLAMA), {}),
    "olmo3-window": ("olmo3", dict(LLAMA, sliding_window=5, layer_types=LAYERS_SWS), {}),
    "nemotron": ("nemotron", dict(LLAMA, mlp_bias=True, attention_bias=True), {}),
    "starcoder": ("gpt_bigcode", dict(GPT), {}),
    "bloom": ("bloom", dict(vocab_size=VOCAB, hidden_size=48, n_layer=3, n_head=6), {}),
    "falcon-1ln": ("falcon", dict(LLAMA, num_key_value_heads=None, new_decoder_architecture=True, num_kv_heads=2,
                                  num_ln_in_parallel_attn=1), {}),
    "falcon-2ln": ("falcon", dict(LLAMA, num_key_value_heads=None, new_decoder_architecture=True, num_kv_heads=2), {}),
    "mpt": ("mpt", dict(vocab_size=VOCAB, d_model=64, n_heads=4, n_layers=3, max_seq_len=64),
            {"architectures": ["MPTForCausalLM"]}),
    "exaone4-window": ("exaone4", dict(LLAMA, sliding_window=5, layer_types=LAYERS_SWS), {}),
    "exaone": ("exaone", dict(LLAMA), {"architectures": ["ExaoneForCausalLM"], "activation_function": "silu",
                                       "num_layers": 3, "layer_norm_epsilon": 1e-5, "rope_theta": 500000.0}),
    "internlm3": ("internlm3", dict(LLAMA, head_dim=16), {"architectures": ["InternLM3ForCausalLM"]}),
    "seed_oss": ("seed_oss", dict(LLAMA, head_dim=16, attention_bias=True, attention_out_bias=True, mlp_bias=True), {}),
    "arcee": ("arcee", dict(LLAMA, head_dim=16), {}),
    "ernie4_5": ("ernie4_5", dict(LLAMA, head_dim=16, use_bias=True), {}),
    # The converter writes ChatGLM's layernorm_epsilon (1e-5 when absent), not GLM's rms_norm_eps.
    "chatglm": ("glm", dict(LLAMA, head_dim=16, rms_norm_eps=1e-5), {}),
    "glm4": ("glm4", dict(LLAMA, head_dim=16), {}),
    "hunyuan-dense": ("hunyuan_v1_dense", dict(LLAMA, head_dim=16), {}),
    "jais2": ("jais2", dict(LLAMA, head_dim=16), {}),
}

@pytest.fixture(scope="module")
def gguf_models(tmp_path_factory):
    """name -> (converted .gguf path, transformers model), for every case of GGUF_CASES."""
    from llamacpp_convert import convert_cases

    return convert_cases(tmp_path_factory.mktemp("llama_cpp"), GGUF_CASES, build)


@pytest.mark.parametrize("name", list(GGUF_CASES))
def test_gguf_matches_transformers(name, gguf_models):
    path, ref_model = gguf_models[name]
    model = load_model(str(path))
    assert model.resolved.kind == "gguf" and model.spec.model_type == FAMILIES_BY_GGUF_ARCH[
        model.spec.extra["gguf_architecture"]].model_type
    ref_logits, _ = reference_logits(ref_model, PROMPT)
    err = rel_err(model.decoder.forward(PROMPT), ref_logits)
    assert err < 1e-3, f"logits rel err {err:.2e}"
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:9], cache), model.decoder.forward(PROMPT[9:], cache)])
    split_err = rel_err(pieces, reference_split_logits(ref_model, PROMPT, 9))
    assert split_err < 1e-3, f"cached split rel err {split_err:.2e}"
    assert model.decoder._weights.unused_tensors(model.spec) == []


@pytest.mark.parametrize("name", list(GGUF_CASES))
def test_gguf_dir_matches_transformers(name, gguf_models, tmp_path):
    """config.json + tokenizer.json + the converted .gguf: the config decides the model (its
    variants, e.g. Falcon's two norms or StableLM's per-head q/k norms), the GGUF holds the weights
    under llama.cpp's names and layout."""
    import shutil

    path, ref_model = gguf_models[name]
    hf = path.parent / "hf" / name
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf / f, tmp_path / f)
    (tmp_path / "model.gguf").symlink_to(path)
    model = load_model(str(tmp_path))
    assert model.resolved.kind == "gguf_dir"
    err = rel_err(model.decoder.forward(PROMPT), reference_logits(ref_model, PROMPT)[0])
    assert err < 1e-3, f"logits rel err {err:.2e}"
    assert model.decoder._weights.unused_tensors(model.spec) == []


def test_gguf_dir_of_another_architecture_is_refused(gguf_models, tmp_path):
    import shutil

    path, _ = gguf_models["olmo2"]
    for f in ("config.json", "tokenizer.json"):
        shutil.copy(path.parent / "hf" / "olmo" / f, tmp_path / f)
    (tmp_path / "model.gguf").symlink_to(path)
    with pytest.raises(SterError, match="GGUF of architecture 'olmo2'.*describes a 'olmo' model"):
        load_model(str(tmp_path))


def test_every_gguf_architecture_has_a_case():
    """Each GGUF architecture a dense family of issue 6 declares is loaded above from a converted file."""
    foundation = {"llama", "qwen2", "qwen3", "smollm3", "gemma", "gemma2", "gemma3"}
    converted = {FAMILIES[model_type].gguf_arch for model_type, _, _ in GGUF_CASES.values()}
    # MoE: test_parity_moe; latent attention: test_parity_mla; state-space families: test_parity_ssm;
    # Gemma 4: test_parity_gemma4_gguf; the families without a Transformers implementation: test_parity_remote;
    # the looped decoders: test_parity_loops; Gemma 3n: test_parity_gemma3n; nemotron-nas and plamo3:
    # test_parity_remote_b_gguf
    from test_parity_gemma3n import GGUF_CASES as GEMMA3N_CASES
    from test_parity_gemma4_gguf import GGUF_CASES as GEMMA4_CASES
    from test_parity_loops import GGUF_CASES as LOOP_CASES
    from test_parity_remote import GGUF_CASES as REMOTE_CASES
    from test_parity_remote_b_gguf import GGUF_CASES as REMOTE_B_CASES  # nemotron-nas's deci, plamo3
    from test_parity_wrapped import GGUF_CASES as WRAPPED_CASES  # Muse Glimmer's, from its wrapper
    from test_parity_gemma3n import GGUF_CASES as GEMMA3N_CASES

    others = {FAMILIES[model_type].gguf_arch for model_type, _, _ in (*GEMMA4_CASES.values(), *REMOTE_CASES.values(),
                                                                      *WRAPPED_CASES.values(), *LOOP_CASES.values(),
                                                                      *GEMMA3N_CASES.values(),
                                                                      *REMOTE_B_CASES.values())}
    declared = {f.gguf_arch for f in FAMILIES.values()
                if f.gguf_arch and not f.moe and not f.latent and not f.recurrent}
    assert declared == foundation | converted | (others & declared)


def test_phi3_longrope_gguf_is_refused(tmp_path):
    """A Phi-3 GGUF with LongRoPE factors is refused by name (the factors live in tensors ster does not read)."""
    from ster_py.gguf.config import spec_from_gguf

    meta = {"general.architecture": "phi3", "phi3.embedding_length": 64, "phi3.block_count": 1,
            "phi3.attention.head_count": 4, "phi3.feed_forward_length": 96, "phi3.rope.scaling.attn_factor": 1.19}
    with pytest.raises(SterError, match="LongRoPE"):
        spec_from_gguf(meta, str(tmp_path / "x.gguf"), vocab_size=VOCAB)
