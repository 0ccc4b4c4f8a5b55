"""Gemma 4's text decoders (gemma4_text, gemma4_unified_text; issue 16) against transformers 5.24.

Each case is a tiny checkpoint made here with transformers (hidden 64, 5 layers mixing sliding and
full attention, every weight redrawn, each layer's ``layer_scalar`` drawn away from one), checked on
a 16-token prompt: logits within 1e-4 of transformers (f32); the prompt in two pieces through the
cache gives the whole pass's logits (and transformers' own split); the same 16 greedy tokens as
transformers; no stored tensor left unread. Between them the cases cover what seed 002 lists:
norms scaling by the weight itself, unscaled scores, the weightless value norm, the per-layer
output scale, full-attention layers with their own head width, key/value heads and proportional
rotation (a share of the pairs turning), attention_k_eq_v, shared key/value layers
(num_kv_shared_layers), the E models' per-layer inputs, the final soft-cap and attention biases.
The same decoders inside their wrappers (gemma4, gemma4_unified: text_config, weights below
model.language_model, a vision tower beside them that is never read) give the wrapper's logits.
Then the configurations seed 002 refuses, before any weight is read.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from ster_py.errors import SterError
from ster_py.families import gate
from ster_py.generate import Sampling, generate
from ster_py.load import load_model
from tiny import build_checkpoint, reference_greedy, reference_logits, reference_split_logits, rel_err
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)

VOCAB = 128
PROMPT = np.random.RandomState(4).randint(3, VOCAB, size=16).tolist()
SPLIT = 9
S, F = "sliding_attention", "full_attention"

_BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=5, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, global_head_dim=32, max_position_embeddings=256, sliding_window=5,
             layer_types=[S, F, S, S, F])
# The E models' shape: per-layer inputs, full-attention values from their keys with one key/value head,
# the last two layers reusing the keys and values of layers 2 (sliding) and 1 (full).
E_MODEL = dict(_BASE, attention_k_eq_v=True, num_global_key_value_heads=1, num_kv_shared_layers=2,
               hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB, final_logit_softcapping=3.0)
# Without per-layer inputs or sharing; value projections on every layer, attention biases, half the
# full-attention pairs turning at a scaled base, a last layer listed as sliding (Transformers makes it full).
PLAIN = dict(_BASE, hidden_size_per_layer_input=0, attention_bias=True, layer_types=[S, S, F, S, S],
             rope_parameters={S: {"rope_type": "default", "rope_theta": 100.0},
                              F: {"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                  "factor": 2.0}})
UNIFIED = dict(_BASE, attention_k_eq_v=True, num_global_key_value_heads=1, num_kv_shared_layers=1,
               layer_types=[F, S, S, F, S])

CASES = {
    "gemma4_text-e": ("gemma4_text", E_MODEL),
    "gemma4_text-plain": ("gemma4_text", PLAIN),
    "gemma4_unified_text": ("gemma4_unified_text", UNIFIED),
}


def _scale_layers(model) -> None:
    """Each layer's layer_scalar (a buffer left at one) drawn in [0.5, 1.5], so that it matters."""
    import torch

    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))


def _build(path, model_type, config):
    model = build_checkpoint(path, model_type, config)
    _scale_layers(model)
    model.save_pretrained(path)
    return model


def _check(path, ref_model, greedy=True):
    """ster's logits, split pass and greedy tokens against ``ref_model`` (transformers, f32)."""
    model = load_model(str(path))
    dec = model.decoder
    ref, _ = reference_logits(ref_model, PROMPT)
    whole = dec.forward(PROMPT)
    assert rel_err(whole, ref) < 1e-4
    cache = dec.new_cache()
    split = np.concatenate([dec.forward(PROMPT[:SPLIT], cache), dec.forward(PROMPT[SPLIT:], cache)])
    assert rel_err(split, whole) < 1e-5
    assert rel_err(split, reference_split_logits(ref_model, PROMPT, SPLIT)) < 1e-4
    if greedy:
        ours = generate(dec, PROMPT, Sampling(max_new_tokens=16)).ids
        assert ours == reference_greedy(ref_model, PROMPT, 16)
    assert dec._weights.unused_tensors(model.spec) == []
    return model


@pytest.mark.parametrize("case", list(CASES))
def test_family_matches_transformers(case, tmp_path):
    model_type, config = CASES[case]
    _check(tmp_path, _build(tmp_path, model_type, config))


def test_e_model_spec_reads_what_the_config_says(tmp_path):
    """The E model's layers as the spec reads them: widths, key/value heads, sharing, rotations."""
    _build(tmp_path, "gemma4_text", E_MODEL)
    spec = load_model(str(tmp_path)).spec
    assert [spec.attention_shape(i) for i in range(5)] == [(4, 2, 16, 16), (4, 1, 32, 32), (4, 2, 16, 16),
                                                         (4, 2, 16, 16), (4, 1, 32, 32)]
    assert [layer.kv_source for layer in spec.layers] == [None, None, None, 2, 1]
    assert [layer.v_from_k for layer in spec.layers] == [False, True, False, False, True]
    assert [layer.sliding_window for layer in spec.layers] == [5, None, 5, 5, None]
    full = spec.layers[1].rope
    assert full.rotary_dim == 32 and np.count_nonzero(full.inv_freq) == 4  # 0.25 of the 16 pairs turn
    assert spec.attn_scale == 1.0 and not spec.norm_unit_offset and spec.value_norm and spec.layer_scalar
    assert spec.per_layer_input == 8 and spec.adapters == "ffn"
    # shared layers cache nothing of their own
    assert [spec.cache_width(i) for i in range(5)] == [64, 64, 64, 0, 0]


def test_plain_case_forces_the_last_layer_full(tmp_path):
    _build(tmp_path, "gemma4_text", PLAIN)
    spec = load_model(str(tmp_path)).spec
    assert [layer.sliding_window is None for layer in spec.layers] == [False, False, True, False, True]
    assert spec.layers[2].rope.rotary_dim == 32 and np.count_nonzero(spec.layers[2].rope.inv_freq) == 8


# ----------------------------------------------------------------------------- wrappers

def _wrapper(path, wrapper: str, text_type: str, text: dict):
    """A tiny ``wrapper`` checkpoint (Gemma4ForConditionalGeneration or its unified kin) around ``text``,
    with a tiny vision side (Gemma 4's tower, the unified model's patch embedder); returns the wrapper model (transformers, f32, eval)."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    torch.manual_seed(0)
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=8)
    text_cfg = AutoConfig.for_model(text_type, bos_token_id=1, eos_token_id=2, pad_token_id=0, **text)
    vis_type = {"gemma4": "gemma4_vision", "gemma4_unified": "gemma4_unified_vision"}[wrapper]
    kwargs = dict(text_config=text_cfg.to_dict(), vision_config=AutoConfig.for_model(vis_type, **vision).to_dict())
    if wrapper == "gemma4":
        kwargs["audio_config"] = None
    cfg = AutoConfig.for_model(wrapper, bos_token_id=1, eos_token_id=2, pad_token_id=0, **kwargs)
    model = AutoModelForImageTextToText.from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn_like(p)
            if "norm" in name and name.endswith("weight") and p.ndim == 1:
                p.copy_(noise * 0.3 + 1.0)
            elif p.ndim > 1:
                p.copy_(noise * 0.15)
            else:
                p.copy_(noise * 0.1)
    _scale_layers(model)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    from tiny import write_tokenizer
    write_tokenizer(path, VOCAB)
    return model


@pytest.mark.parametrize("wrapper, text_type, text", [("gemma4", "gemma4_text", E_MODEL),
                                                       ("gemma4_unified", "gemma4_unified_text", UNIFIED)])
def test_wrapper_runs_its_text_decoder(wrapper, text_type, text, tmp_path):
    ref = _wrapper(tmp_path, wrapper, text_type, text)
    stored = json.loads((tmp_path / "config.json").read_text())
    assert stored["model_type"] == wrapper
    from safetensors import safe_open
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert any(n.startswith("model.language_model.layers.") for n in names)
    assert any(not n.startswith("model.language_model.") for n in names)  # the vision side, never read
    model = _check(tmp_path, ref, greedy=False)
    assert model.spec.model_type == text_type
    assert model.spec.names["q"].startswith("model.language_model.layers.")


# ----------------------------------------------------------------------------- refusals

def _config(**changes) -> dict:
    c = {"model_type": "gemma4_text", **E_MODEL, "rope_parameters": {
        S: {"rope_type": "default", "rope_theta": 10000.0},
        F: {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.25}}}
    c.update(changes)
    return {k: v for k, v in c.items() if v is not None}


REFUSED = {
    "bidirectional": (dict(use_bidirectional_attention="all"), "use_bidirectional_attention"),
    "double-wide": (dict(use_double_wide_mlp=True), "use_double_wide_mlp"),
    "moe": (dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=16), "enable_moe_block"),
    "no-global-head-dim": (dict(global_head_dim=None), "global_head_dim"),
    "no-layer-types": (dict(layer_types=None), "layer_types"),
    # a top-level share: Transformers' Gemma 4 rotated otherwise than ster did (logits rel err 0.70-0.87)
    "top-level-partial-rotary": (dict(partial_rotary_factor=0.5), "top-level partial_rotary_factor"),
    "no-sliding-base": (dict(rope_parameters={F: {"rope_type": "default", "rope_theta": 1e6}}), "sliding_attention"),
    "scaled-sliding": (dict(rope_parameters={S: {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0},
                                             F: {"rope_type": "default", "rope_theta": 1e6}}), "scaled"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_before_any_weight(case, tmp_path):
    changes, words = REFUSED[case]
    with pytest.raises(SterError, match=words):
        gate(_config(**changes), tmp_path / "config.json")


@pytest.mark.parametrize("text_type, wrapper", [("gemma4_text", "gemma4"), ("gemma4_unified_text", "gemma4_unified")])
def test_top_level_partial_rotary_factor_is_refused_in_every_gemma4_form(text_type, wrapper, tmp_path):
    from ster_py.families import unwrap

    text = _config(model_type=text_type, partial_rotary_factor=0.5)
    for config in (text, {"model_type": wrapper, "text_config": text}):
        with pytest.raises(SterError, match="top-level partial_rotary_factor"):
            gate(unwrap(config, tmp_path / "config.json")[0], tmp_path / "config.json")


def test_wrapper_without_text_config_is_refused(tmp_path):
    from ster_py.families import unwrap

    for wrapper in ("gemma4", "gemma4_unified"):
        with pytest.raises(SterError, match="without a text_config"):
            unwrap({"model_type": wrapper, "vision_config": {}}, tmp_path / "config.json")


def test_sharing_without_an_earlier_layer_of_the_kind_is_refused(tmp_path):
    """Layer 4 (full) would reuse an earlier full-attention layer, but layers 0..2 all slide."""
    from ster_py.config import spec_from_config
    from ster_py.families import FAMILIES

    config = _config(layer_types=[S, S, S, S, F], num_kv_shared_layers=2)
    with pytest.raises(SterError, match="none of layers 0..2"):
        spec_from_config(config, FAMILIES["gemma4_text"], "config.json")
