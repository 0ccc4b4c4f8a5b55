"""GGUF files of group R2's families as llama.cpp's converter (the pinned convert_hf_to_gguf.py) writes them.

- bailing_hybrid (Ling 3.0) -> llama.cpp's ``bailingmoe3``: a tiny Transformers BailingHybrid checkpoint
  (tests/test_parity_remote_c.py's builder: Kimi Delta Attention and head-gated latent attention by
  layer_group_size, Ling 2.0's experts, Step 3.5's per-layer clamps on the routed and shared experts),
  rotating adjacent pairs (rope_interleave, which llama.cpp's bailingmoe3 graph always does) and with one
  expert group (llama.cpp's bailingmoe3 graph ranks no groups). The converter reads its config.json as it
  stands: llama.cpp pins Transformers 4.57, which has no bailing_hybrid class (Transformers 5's would hand it
  head_dim rewritten to the rotated width). Converted at F32 without its multi-token-prediction layer
  (--no-mtp), the file must give Transformers' logits within 1e-3 and llama.cpp's own (llama-cpp-python
  0.3.36) too; quantized to Q8_0 by llama.cpp's quantizer, llama.cpp's top-1 token at every position of a
  32-token prompt but near-ties (test_parity_ssm_b2's rule).
- nemotron_h_puzzle -> llama.cpp's ``nemotron_h_moe`` (conversion/nemotron.py, NemotronHPuzzleForCausalLM):
  the same builder's checkpoint (Transformers' Nemotron-H whose routed layers each have their own top-k and
  expert width, latent-width experts, expert groups), which the converter writes with per-layer
  expert_used_count and expert_feed_forward_length; ster reads the file as Nemotron-H, each routed layer
  with its own shape. The same comparisons as Ling 3.0's.
- step3_text: the pinned converter has no class for Step3's text decoder (conversion/step3.py converts
  StepVL's Qwen3-shaped decoder and Step 3.5), so there is no GGUF of it to read.

``ster convert`` keeps refusing both (latent attention, KDA and scan layers are llama.cpp's converter's business:
tests/test_convert.py).
"""
from __future__ import annotations

import numpy as np
import pytest

from ster_py.load import load_model
from test_parity_remote_c import PROMPT, VOCAB, build
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)
from tiny import reference_logits, rel_err

# the dequantized model's sums for a GGUF's prompt (conftest.quantized_tiles_off)
pytestmark = pytest.mark.usefixtures("quantized_tiles_off")

LONG_PROMPT = np.random.RandomState(3).randint(3, VOCAB, size=32).tolist()
SPLIT = 9
# name (llama.cpp's architecture): (model_type, config, config.json keys for the converter)
GGUF_CASES = {
    "bailingmoe3": ("bailing_hybrid", dict(
        num_hidden_layers=5, n_group=1, topk_group=1, rope_interleave=True,
        expert_swiglu_limit_list=[0.0, 0.4, 0.0, 0.3, 7.0], share_expert_swiglu_limit_list=[0.0, 0.0, 0.35, 0.5, 7.0]),
        # the release states these (Transformers' config class has them under other names or derives them)
        {"score_function": "sigmoid", "kda_safe_gate": True, "moe_shared_expert_intermediate_size": 32,
         "_llamacpp_raw_config": True, "_llamacpp_args": ["--no-mtp"]}),
    # each routed block its own top-k and expert width (block_configs), experts in a latent width, groups
    "nemotron_h_moe": ("nemotron_h_puzzle", dict(
        pattern="EM*EE", shapes=[(3, 24), (1, 40), (2, 16)], moe_latent_size=32, n_group=2, topk_group=1,
        routed_scaling_factor=1.5), {}),
}
# Each case's routed layers as (top-k, expert width) and their (routed, shared) SwiGLU clamps, as the config says.
ROUTED = {"bailingmoe3": ([(2, 32)] * 4, [(0.4, None), (None, 0.35), (0.3, 0.5), (7.0, 7.0)]),
          "nemotron_h_moe": ([(3, 24), (1, 40), (2, 16)], [(None, None)] * 3)}
# For the quantized comparison the same checkpoints route every token to all their experts (converted in the
# same run of the converter): a top-k choice flips where rounding reorders two router scores, a jump no two
# implementations agree on (measured on Ling 3.0's model at Q8_0: ster's and llama.cpp's logits 17-20 % apart
# with top-2, 3 % with every expert). Selection (the selection bias, top k) is checked by the F32 files.
QUANT_CASES = {
    "bailingmoe3-every-expert": ("bailing_hybrid", dict(GGUF_CASES["bailingmoe3"][1], num_experts_per_tok=8),
                                 GGUF_CASES["bailingmoe3"][2]),
    "nemotron_h_moe-every-expert": ("nemotron_h_puzzle", dict(GGUF_CASES["nemotron_h_moe"][1],
                                                              shapes=[(6, 24), (6, 40), (6, 16)]), {}),
}


def _aligned(path, model_type, config):
    """The checkpoint of ``build`` with each KDA layer's (Ling 3.0's) keys aligned with its queries
    (test_parity_ssm_b2's ``align_keys``: k_proj and the key channels of the convolution made the query's
    plus 0.3 of their own),
    so that Q8_0's rounding does not swamp the read-out of unrelated random q and k; saved again under the
    config.json the builder wrote."""
    import torch

    model = build(path, model_type, config)
    written = (path / "config.json").read_text()
    kda = [layer.self_attn for layer in model.model.layers if hasattr(getattr(layer, "self_attn", None), "forget_gate")]
    if not kda:
        return model
    with torch.no_grad():
        for attn in kda:
            n = attn.q_proj.weight.shape[0]
            attn.k_proj.weight.copy_(attn.q_proj.weight + 0.3 * attn.k_proj.weight)
            conv = attn.conv1d.weight  # channels [q, k, v]
            conv[n:2 * n] = conv[:n] + 0.3 * conv[n:2 * n]
    model.save_pretrained(path)
    (path / "config.json").write_text(written)
    return model


@pytest.fixture(scope="module")
def r2_gguf(tmp_path_factory):
    """name -> (converted F32 .gguf, transformers model) for every case of GGUF_CASES and QUANT_CASES (one run
    of the converter)."""
    from llamacpp_convert import convert_cases

    return convert_cases(tmp_path_factory.mktemp("llama_cpp_r2"), {**GGUF_CASES, **QUANT_CASES}, _aligned)


@pytest.mark.parametrize("name", list(GGUF_CASES))
def test_gguf_matches_transformers_and_llamacpp(name, r2_gguf):
    from ster_py import llamacpp
    from ster_py.gguf.reader import GGUFFile

    path, ref_model = r2_gguf[name]
    assert GGUFFile(path).architecture == name  # the architecture llama.cpp's converter chose
    model = load_model(str(path))
    hf = load_model(str(path.parent / "hf" / name)).spec
    kinds = [(layer.mixer, layer.ffn) for layer in hf.layers]
    assert [(layer.mixer, layer.ffn) for layer in model.spec.layers] == kinds

    def routed(spec):  # each routed layer's (top-k, expert width, latent width, routed clamp, shared clamp)
        return [(m.router.top_k, m.expert_size, m.latent_size,
                 *(None if b is None else round(b, 6) for b in (m.limit, m.shared_limit)))
                for m in (layer.moe or spec.moe for layer in spec.layers if layer.ffn == "moe")]

    assert routed(model.spec) == routed(hf)
    shapes, clamps = ROUTED[name]
    assert [r[:2] for r in routed(hf)] == shapes and [r[3:] for r in routed(hf)] == clamps
    if name == "bailingmoe3":
        assert {layer.mixer for layer in model.spec.layers} == {"kda", "latent"}
        assert model.spec.delta.safe_gate and model.spec.delta.lower_bound == hf.delta.lower_bound
        assert model.spec.layers[1].rope.interleaved and hf.layers[1].rope.interleaved
        assert model.spec.attn_gate_per_head
    else:
        assert model.spec.moe.latent_size == 32
    ours = model.decoder.forward(PROMPT)
    err = rel_err(ours, reference_logits(ref_model, PROMPT)[0])
    assert err < 1e-3, f"logits rel err {err:.2e}"
    (ref,) = llamacpp.logits(path, [PROMPT])  # and llama.cpp reads the file as ster does
    ref = ref[:, :ours.shape[1]]
    assert rel_err(ours, ref) < 1e-3
    assert (ours.argmax(1) == ref.argmax(1)).all()
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:SPLIT], cache),
                             model.decoder.forward(PROMPT[SPLIT:], cache)])
    assert rel_err(pieces, ours) < 1e-5
    assert model.decoder._weights.unused_tensors(model.spec) == []


@pytest.mark.parametrize("name", list(QUANT_CASES))
def test_q8_0_gguf_gives_llamacpps_top1(name, r2_gguf, tmp_path):
    """llama.cpp's Q8_0 of the file: ster computes what the quantized weights define (against the same
    weights dequantized) and gives llama.cpp's top-1 token at every position of a 32-token prompt but
    near-ties (a top-1 differs only where llama.cpp's own top two are closer than twice the two
    implementations' largest difference at that position, and at no more than a quarter of them)."""
    from ster_py import llamacpp
    from ster_py.decoder.model import Decoder
    from ster_py.gguf.reader import GGUFFile
    from ster_py.weights import GGUFWeights

    path, _ = r2_gguf[name]
    q = llamacpp.quantize(path, tmp_path / f"{name}-Q8_0.gguf", "Q8_0")
    assert "Q8_0" in {t.type_name for t in GGUFFile(q).tensors.values()}
    model = load_model(str(q))
    ours = model.decoder.forward(LONG_PROMPT)
    exact = Decoder(model.spec, GGUFWeights(GGUFFile(q), "f32", quantized=False)).forward(LONG_PROMPT)
    assert rel_err(ours, exact) < 1e-4
    (ref,) = llamacpp.logits(q, [LONG_PROMPT])
    ref = ref[:, :ours.shape[1]]
    assert rel_err(ours, ref) < 0.1  # llama.cpp rounds activations to 8 bits in its quantized products
    mine, theirs = ours.argmax(1), ref.argmax(1)
    rows = np.arange(len(mine))
    margin = ref[rows, theirs] - ref[rows, mine]
    reach = 2 * np.abs(ours - ref).max(axis=1)
    assert np.all((mine == theirs) | (margin <= reach)), (np.nonzero(mine != theirs), margin, reach)
    assert (mine == theirs).sum() >= 3 * len(mine) // 4, (mine, theirs)
    cache = model.decoder.new_cache()
    steps = np.concatenate([model.decoder.forward([t], cache) for t in LONG_PROMPT])
    assert np.abs(steps - ours).max() <= 1e-3 * np.abs(ours).max()


@pytest.mark.parametrize("name, key, value, match", [
    ("bailingmoe3", "kda.gate_lower_bound", 0.5, "kda.gate_lower_bound must be a negative number"),
    ("nemotron_h_moe", "expert_used_count", np.array([3, 0, 0, 7, 2]), "expert_used_count gives routed layer 3 7"),
    ("nemotron_h_moe", "expert_feed_forward_length", np.array([24, 0, 0, 40]), "expert_feed_forward_length"),
])
def test_bad_metadata_is_refused(name, key, value, match, r2_gguf):
    """A bound the safe gate cannot take, a per-layer expert count above the experts, a per-layer list of the
    wrong length: one SterError naming the key."""
    from ster_py.errors import SterError
    from ster_py.gguf.config import spec_from_gguf
    from ster_py.gguf.reader import GGUFFile

    path, _ = r2_gguf[name]
    f = GGUFFile(path)
    meta = dict(f.metadata, **{f"{name}.{key}": value})
    with pytest.raises(SterError, match=match):
        spec_from_gguf(meta, str(path), vocab_size=VOCAB, tensors={n: t.shape for n, t in f.tensors.items()})
