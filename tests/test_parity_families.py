"""Every family the decoder runs, against transformers on tiny random checkpoints.

Each case builds a checkpoint with transformers (small dims, 3 layers, every
optional flag of the family switched on in some variant), loads the saved
directory with ster, and checks: logits of a 16-token prompt within relative
error 1e-4 of transformers (f32), the same logits as transformers when the prompt
is fed in two pieces through the KV cache, and the same 16 greedy tokens as transformers'
``generate``.
"""
from __future__ import annotations

import numpy as np
import pytest

from ster_py.decoder.qlinear import float_activations
from ster_py.generate import Sampling, generate
from ster_py.load import load_model
from tiny import make_checkpoint, reference_greedy, reference_logits, reference_split_logits, rel_err, rewrite_checkpoint

PROMPT = np.random.RandomState(0).randint(3, 128, size=16).tolist()

_LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 8}
_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16}
# Transformers 4's spelling: rope_theta beside rope_scaling {"type": ...}.
_LINEAR_V4 = {"rope_parameters": None, "rope_theta": 5000.0, "rope_scaling": {"type": "linear", "factor": 2.0}}
# Short factors up to 8 positions, long ones past them: the 16-token prompt uses the long table.
_LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 8,
             "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 3.5], "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0]}
_DYNAMIC = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}

CASES = {
    "llama": ("llama", {}),
    "llama-llama3-rope": ("llama", {"rope_parameters": _LLAMA3}),
    "llama-linear-rope-v4-config": ("llama", _LINEAR_V4),
    "llama-yarn-rope": ("llama", {"rope_parameters": _YARN}),
    "llama-longrope": ("llama", {"rope_parameters": _LONGROPE, "max_position_embeddings": 64}),
    # dynamic NTK only differs past max_position_embeddings: 12 < 16 prompt positions.
    "llama-dynamic-rope": ("llama", {"rope_parameters": _DYNAMIC, "max_position_embeddings": 12}),
    "llama-biases-tied": ("llama", {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True}),
    "llama-head-dim-mha": ("llama", {"head_dim": 24, "num_key_value_heads": 4}),
    "mistral-window": ("mistral", {"sliding_window": 5}),
    "qwen2": ("qwen2", {}),
    "qwen2-window": ("qwen2", {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 1}),
    "qwen3": ("qwen3", {"head_dim": 32}),
    "qwen3-window-tied": ("qwen3", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1,
                                    "tie_word_embeddings": True}),
    "smollm3": ("smollm3", {"no_rope_layers": [1, 0, 1]}),
    "gemma": ("gemma", {}),
    "gemma-untied": ("gemma", {"tie_word_embeddings": False}),
    "gemma2": ("gemma2", {"sliding_window": 5, "query_pre_attn_scalar": 24,
                          "attn_logit_softcapping": 3.0, "final_logit_softcapping": 5.0}),
    "gemma3_text": ("gemma3_text", {"sliding_window": 5,
                                    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}),
    "gemma3_text-linear-rope": ("gemma3_text", {
        "sliding_window": 6, "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                            "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0}}}),
    # Transformers' Gemma 3 attention never applies attn_logit_softcapping (its final cap it does).
    "gemma3_text-caps": ("gemma3_text", {"sliding_window": 5, "attn_logit_softcapping": 1.0,
                                         "final_logit_softcapping": 5.0}),
    # Transformers' Qwen3 (and the other dense rope_whole_head families) rotates whole heads whatever the share says
    "qwen3-share-ignored": ("qwen3", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                          "partial_rotary_factor": 0.5}}),
    # tie_word_embeddings true beside a stored head that differs: Transformers does not tie them
    "llama-tied-in-config-head-stored": ("llama", {"tie_word_embeddings": False}),
    "llama-llama3-rope-top-level-original-max": ("llama", {"rope_parameters": _LLAMA3}),
    "phi3-longrope-original-max-in-set-only": ("phi3", {"rope_parameters": _LONGROPE, "max_position_embeddings": 64,
                                                        "original_max_position_embeddings": 8}),
}
# Keys written into config.json after Transformers saved it (None: the key removed), the oracle reloaded
# from that file: a top-level original_max_position_embeddings replaces a single llama3 / YaRN / LongRoPE
# set's own (Phi-3's config class supplies 4096 when the key is absent).
WRITTEN = {"llama-tied-in-config-head-stored": {"tie_word_embeddings": True},
           "llama-llama3-rope-top-level-original-max": {"original_max_position_embeddings": 4},
           "phi3-longrope-original-max-in-set-only": {"original_max_position_embeddings": None}}


@pytest.mark.parametrize("case", list(CASES))
def test_family_matches_transformers(case, tmp_path):
    model_type, overrides = CASES[case]
    ref_model = make_checkpoint(tmp_path, model_type, **overrides)
    if case in WRITTEN:
        import torch
        from transformers import AutoModelForCausalLM

        written = WRITTEN[case]
        rewrite_checkpoint(tmp_path, {k: v for k, v in written.items() if v is not None},
                           drop=tuple(k for k, v in written.items() if v is None))
        ref_model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32,
                                                         attn_implementation="eager").eval()
    ref_logits, _ = reference_logits(ref_model, PROMPT)
    model = load_model(str(tmp_path))

    logits = model.decoder.forward(PROMPT)
    assert rel_err(logits, ref_logits) < 1e-4

    cache = model.decoder.new_cache()
    pieces = [model.decoder.forward(PROMPT[:9], cache), model.decoder.forward(PROMPT[9:], cache)]
    # Against transformers fed the same way: dynamic NTK rotates cached keys by the base in
    # force when they were computed, so a split prompt differs from a whole one in both.
    assert rel_err(np.concatenate(pieces), reference_split_logits(ref_model, PROMPT, 9)) < 1e-4

    ours = generate(model.decoder, PROMPT, Sampling(max_new_tokens=16)).ids
    assert ours == reference_greedy(ref_model, PROMPT, 16)


def test_features_are_switched_on(tmp_path):
    """The variants above exercise what they claim: the spec shows windows, scalings and caps."""
    make_checkpoint(tmp_path / "g2", "gemma2", sliding_window=5, attn_logit_softcapping=3.0,
                    final_logit_softcapping=5.0)
    spec = load_model(str(tmp_path / "g2")).spec
    assert [layer.sliding_window for layer in spec.layers] == [5, None, 5]
    assert spec.attn_softcap == 3.0 and spec.final_softcap == 5.0 and spec.norm_unit_offset
    make_checkpoint(tmp_path / "s3", "smollm3", no_rope_layers=[1, 0, 1])
    spec = load_model(str(tmp_path / "s3")).spec
    assert [layer.rope is None for layer in spec.layers] == [False, True, False]
    make_checkpoint(tmp_path / "y", "llama", rope_parameters=_YARN)
    assert load_model(str(tmp_path / "y")).spec.layers[0].rope.attention_factor > 1.0


@pytest.mark.parametrize("precision", ["bf16", "f16"])
def test_half_precision_storage(precision, tmp_path):
    """Weights stored in bf16/f16, compute in f32: equal to transformers f32 on the rounded weights."""
    import torch

    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[precision]
    ref_model = make_checkpoint(tmp_path, "qwen3", dtype=dtype)  # saved at that precision, returned as f32
    ref_logits, _ = reference_logits(ref_model, PROMPT)
    model = load_model(str(tmp_path), precision=precision)
    assert all(t.weight.dtype.itemsize == 2 for t in (model.decoder.layers[0].q, model.decoder.head))
    with float_activations():   # the model's math (generation may round a bf16 prompt's inputs to bf16)
        assert rel_err(model.decoder.forward(PROMPT), ref_logits) < 1e-4
    assert generate(model.decoder, PROMPT, Sampling(max_new_tokens=16)).ids == reference_greedy(ref_model, PROMPT, 16)


def test_f32_checkpoint_rounded_to_bf16_differs_but_stays_close(tmp_path):
    """--precision bf16 on an f32 checkpoint really rounds the weights (and stays near f32)."""
    ref_model = make_checkpoint(tmp_path, "llama")
    ref_logits, _ = reference_logits(ref_model, PROMPT)
    err = rel_err(load_model(str(tmp_path), precision="bf16").decoder.forward(PROMPT), ref_logits)
    assert 1e-5 < err < 5e-2
