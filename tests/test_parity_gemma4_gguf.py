"""Gemma 4's GGUF (llama.cpp's ``gemma4`` architecture, issue 16) from the file alone.

Tiny gemma4_text checkpoints (the shapes of test_parity_gemma4.py's cases, 256 wide so that the
products really are Q4_K) converted by llama.cpp 0.3.36's own converter at F32 must match
transformers within 1e-3, and the prompt in two pieces through the cache the whole pass; the layers
read from the file (head widths and key/value heads per layer, which layers slide, share keys and
values or take values from keys) are those the checkpoint's config.json gives. Quantized by
llama.cpp's quantizer to Q8_0 and Q4_K_M they give llama.cpp's top-1 token at every position of a
32-token prompt but near-ties. Then what ster refuses in such a file, before any weight is read.

What the file says and llama.cpp reads (src/models/gemma4.cpp, llama-model.cpp): the sliding layers'
own head width (attention.key_length_swa), rotated width (rope.dimension_count_swa) and base
(rope.freq_base_swa); the full layers' proportional rotation as ``rope_freqs`` (factor 1e30 on the
pairs that do not turn); attention.head_count_kv per layer; attention.shared_kv_layers, the last n
layers reusing the cache of layer first - 2 (sliding) or first - 1 (full); no attn_v: values from keys;
the per-layer inputs; layer_output_scale.
"""
from __future__ import annotations

import numpy as np
import pytest

from ster_py.errors import SterError
from ster_py.load import load_model
from test_parity_gemma4 import F, PROMPT, S, SPLIT, VOCAB, _build
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)
from tiny import reference_logits, reference_split_logits, rel_err

# the dequantized model's sums for a GGUF's prompt (conftest.quantized_tiles_off)
pytestmark = pytest.mark.usefixtures("quantized_tiles_off")

LONG_PROMPT = np.random.RandomState(3).randint(3, VOCAB, size=32).tolist()
WIDE = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=256, num_hidden_layers=5, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, global_head_dim=128, max_position_embeddings=256, sliding_window=5)
# The E models' shape. llama.cpp's cache reuse takes the last two layers before the shared ones to be
# sliding then full (as in every Gemma 4 E model), so the layers are placed that way here.
E_MODEL = dict(WIDE, layer_types=[S, S, F, S, F], attention_k_eq_v=True, num_global_key_value_heads=1,
               num_kv_shared_layers=2, hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB,
               final_logit_softcapping=3.0)
# Values projected on every layer, no sharing nor per-layer inputs; half the full layers' pairs turn, a
# sliding base of its own; a last layer listed as sliding (Transformers and the converter make it full).
# (No attention biases, which llama.cpp's gemma4 does not read, and no rotation factor, which its
# converter does not write for "proportional".)
PLAIN = dict(WIDE, hidden_size_per_layer_input=0, layer_types=[S, S, F, S, S],
             rope_parameters={S: {"rope_type": "default", "rope_theta": 100.0},
                              F: {"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}})
GGUF_CASES = {"e": ("gemma4_text", E_MODEL, {}), "plain": ("gemma4_text", PLAIN, {})}


@pytest.fixture(scope="module")
def gemma4_gguf(tmp_path_factory):
    """name -> (converted F32 .gguf, transformers model) for every case of GGUF_CASES."""
    from llamacpp_convert import convert_cases

    return convert_cases(tmp_path_factory.mktemp("llama_cpp_gemma4"), GGUF_CASES, _build)


def _layers(spec) -> list[tuple]:
    # (a layer that reuses another's cache projects no values: its v_from_k means nothing)
    return [(spec.attention_shape(i), layer.kv_source, layer.v_from_k and layer.kv_source is None,
             layer.sliding_window, spec.cache_width(i),
             None if layer.rope is None else (layer.rope.rotary_dim, int(np.sum(layer.rope.inv_freq > 1e-20))))
            for i, layer in enumerate(spec.layers)]


@pytest.mark.parametrize("name", list(GGUF_CASES))
def test_gguf_matches_transformers(name, gemma4_gguf):
    path, ref_model = gemma4_gguf[name]
    model = load_model(str(path))
    spec = model.spec
    hf = load_model(str(path.parent / "hf" / name)).spec
    assert _layers(spec) == _layers(hf)
    assert (spec.per_layer_input, spec.per_layer_vocab, spec.embed_scale, spec.final_softcap) == \
        (hf.per_layer_input, hf.per_layer_vocab, hf.embed_scale, hf.final_softcap)
    dec = model.decoder
    ours = dec.forward(PROMPT)
    err = rel_err(ours, reference_logits(ref_model, PROMPT)[0])
    assert err < 1e-3, f"logits rel err {err:.2e}"
    cache = dec.new_cache()
    pieces = np.concatenate([dec.forward(PROMPT[:SPLIT], cache), dec.forward(PROMPT[SPLIT:], cache)])
    assert rel_err(pieces, ours) < 1e-5
    assert rel_err(pieces, reference_split_logits(ref_model, PROMPT, SPLIT)) < 1e-3
    assert dec._weights.unused_tensors(spec) == []


def test_e_file_layers(gemma4_gguf):
    """The E case as the file states it: layers 3 and 4 reuse layers 1 (sliding) and 2 (full); layer 2
    has no attn_v; the sliding layers 64 wide with 2 key/value heads, the full ones 128 wide with 1."""
    spec = load_model(str(gemma4_gguf["e"][0])).spec
    assert [layer.kv_source for layer in spec.layers] == [None, None, None, 1, 2]
    assert [layer.v_from_k for layer in spec.layers] == [False, False, True, False, False]
    assert [spec.attention_shape(i) for i in range(5)] == [(4, 2, 64, 64), (4, 2, 64, 64), (4, 1, 128, 128),
                                                         (4, 2, 64, 64), (4, 1, 128, 128)]


# Quantized against llama.cpp: the E case. On the plain case llama.cpp's own F32 logits already differ
# from Transformers' (and ster's, which match Transformers within 1e-3) by 10 % (measured; not
# explained yet: neither the sliding base, the full layers' base, the rotated pairs nor the window moves
# it, and it is there from position 0, where no rotation or window acts; the E case's full layers, which
# take values from keys, agree, so the full layers' own value projection is the suspect), so llama.cpp
# is no oracle for that file; see test_plain_case_llamacpp_disagreement.
QUANTIZED = ["e"]


@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_K_M"])
@pytest.mark.parametrize("name", QUANTIZED)
def test_quantized_gguf_gives_llamacpps_top1(name, ftype, gemma4_gguf, tmp_path):
    from ster_py import llamacpp
    from ster_py.decoder.model import Decoder
    from ster_py.decoder.qlinear import QuantTensor, float_activations
    from ster_py.gguf.reader import GGUFFile
    from ster_py.weights import GGUFWeights

    path, _ = gemma4_gguf[name]
    q = llamacpp.quantize(path, tmp_path / f"{name}-{ftype}.gguf", ftype)
    model = load_model(str(q))
    want = {"Q8_0"} if ftype == "Q8_0" else {"Q4_K", "Q5_K", "Q6_K"}
    gates = [layer.ffn.gate.weight for layer in model.decoder.layers]
    assert all(type(w) is QuantTensor and w.type_name in want for w in gates)  # kept in their blocks
    ours = model.decoder.forward(LONG_PROMPT)
    # ster computes what the quantized weights define: the same as those weights dequantized, in f32
    exact = Decoder(model.spec, GGUFWeights(GGUFFile(q), "f32", qk_heads=None, quantized=False)).forward(LONG_PROMPT)
    assert rel_err(ours, exact) < 1e-4
    (ref,) = llamacpp.logits(q, [LONG_PROMPT])
    ref = ref[:, :ours.shape[1]]
    # llama.cpp rounds each activation row to 8 bits (q8_0 / q8_K blocks) in its quantized products and
    # takes GELU from a half-precision table; through unscaled scores that moves its logits from the
    # exact ones (measured 4.6 % at Q8_0, 6.1 % at Q4_K_M; the state-space suite sees up to 10 %)
    assert rel_err(ours, ref) < 0.1
    # Top-1: the same token at every position, except where llama.cpp's own top two are closer than
    # three times the rms difference of the two implementations' logits, taken for a difference of two
    # logits (as tests/test_parity_moe.py's quantized test).
    mine, theirs = ours.argmax(1), ref.argmax(1)
    rows = np.arange(len(mine))
    margin = ref[rows, theirs] - ref[rows, mine]
    noise = np.sqrt(2 * np.mean((ours - ref) ** 2))
    assert np.all((mine == theirs) | (margin <= 3 * noise)), (np.nonzero(mine != theirs), margin, noise)
    assert (mine == theirs).mean() >= 0.8
    # One token at a time over the cache: on float inputs, the prompt's logits (measured 7e-6 / 1.3e-5 of
    # the largest, Q8_0 / Q4_K_M); as generation runs them, each product's input rounded to int16 per
    # 32-block, which this random model's layers amplify to 8e-4 / 1.3e-3 (the Q4_K kernel's 16-row
    # layout and the row layout differ only in float32 summation order, 4e-7 per product, yet give
    # 1.3e-3 and 8e-4 here: the spread is the model's, not the kernel's)
    with float_activations():
        cache = model.decoder.new_cache()
        steps = np.concatenate([model.decoder.forward([t], cache) for t in LONG_PROMPT])
    assert np.abs(steps - ours).max() <= 1e-4 * np.abs(ours).max()
    cache = model.decoder.new_cache()
    steps = np.concatenate([model.decoder.forward([t], cache) for t in LONG_PROMPT])
    assert np.abs(steps - ours).max() <= 3e-3 * np.abs(ours).max()


def test_plain_case_llamacpp_disagreement(gemma4_gguf):
    """Recorded, not hidden: on the plain case (values projected on every layer, no per-layer inputs,
    no soft-cap) llama.cpp's F32 logits are another function than Transformers' model, which ster
    matches (test_gguf_matches_transformers); on the E case they agree. Fails when llama.cpp changes."""
    from ster_py import llamacpp

    for name, far in (("e", False), ("plain", True)):
        path, ref_model = gemma4_gguf[name]
        ours = load_model(str(path)).decoder.forward(LONG_PROMPT)
        (theirs,) = llamacpp.logits(path, [LONG_PROMPT])
        err = rel_err(ours, theirs[:, :ours.shape[1]])
        assert (err > 0.05) if far else (err < 5e-3), (name, err)


# ----------------------------------------------------------------------------- refusals

def _spec(path, **meta_changes):
    from ster_py.gguf.config import spec_from_gguf
    from ster_py.gguf.reader import GGUFFile

    g = GGUFFile(path)
    meta = {**g.metadata, **meta_changes}
    return spec_from_gguf(meta, str(path), rope_freqs=g.tensor("rope_freqs.weight").dequantize(),
                          vocab_size=VOCAB, has_output="output.weight" in g.tensors,
                          tensors={n: t.shape for n, t in g.tensors.items()})


REFUSED = {
    # layer 3 (sliding) would attend over layer 1's cache, layer 4 (full) over layer 2's: reversed kinds
    "sharing-across-kinds": (dict(**{"gemma4.attention.sliding_window_pattern": [True, False, True, True, False]}),
                             "reuse the keys and values of layer 1, a full-attention layer"),
    "sharing-everything": ({"gemma4.attention.shared_kv_layers": 4}, "shared_kv_layers must be"),
    "moe": ({"gemma4.expert_count": 4, "gemma4.expert_used_count": 2}, "mixture-of-experts"),
    "rotating-too-wide": ({"gemma4.rope.dimension_count_swa": 96}, "dimension_count_swa"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_by_name(case, gemma4_gguf):
    changes, words = REFUSED[case]
    with pytest.raises(SterError, match=words):
        _spec(gemma4_gguf["e"][0], **changes)
    _spec(gemma4_gguf["e"][0])  # the file itself reads
