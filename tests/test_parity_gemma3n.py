"""Gemma 3n's text decoder (gemma3n_text; issue 16, group g3n) against transformers 5.24.

Two tiny checkpoints made here with transformers (hidden 64, 5 layers, every weight redrawn):
- ``E``: three AltUp copies, Laurel, activation sparsity on the first two layers (0.9, 0.6), the last
  two layers reusing earlier layers' keys and values, a per-layer table smaller than the vocabulary
  (ids past it read row 0, as Transformers does), sliding and full layers at their own bases, a
  final soft-cap;
- ``HUB``: two copies without correct_output_scale, no sharing, no sparsity, and config.json rewritten
  in the hub's spelling (rope_theta / rope_local_base_freq, no layer_types: every fifth layer full).
Each: logits within 1e-4 of transformers (f32) on a 16-token prompt, the prompt in two pieces through
the cache equal to the whole pass and to transformers' own split, 16 equal greedy tokens, no stored
tensor left unread. Then: each feature switched off in ster moves the logits away from transformers'
(the oracle sees every one of them); the hidden states ster captures are AltUp's first copy
(transformers' output_hidden_states, and ``ster parity`` layer by layer); the activation sparsity
against Transformers' own ``Gemma3nTextMLP._gaussian_topk``; the decoder inside its ``gemma3n``
wrapper; the configurations refused before any weight is read.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from ster_py.config import spec_from_config
from ster_py.errors import SterError
from ster_py.families import FAMILIES, gate
from ster_py.generate import Sampling, generate
from ster_py.load import load_model
from tiny import build_checkpoint, reference_greedy, reference_logits, reference_split_logits, rel_err
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)

# the dequantized model's sums for a GGUF's prompt (conftest.quantized_tiles_off)
pytestmark = pytest.mark.usefixtures("quantized_tiles_off")

VOCAB = 128
PROMPT = np.random.RandomState(4).randint(3, VOCAB, size=16).tolist()
SPLIT = 9
S, F = "sliding_attention", "full_attention"
PER_LAYER_VOCAB = 100  # below VOCAB: the prompt's ids past it read the table's row 0

_BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=5, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=256, sliding_window=5,
             hidden_size_per_layer_input=8, laurel_rank=6, final_logit_softcapping=3.0)
E = dict(_BASE, layer_types=[S, F, S, S, F], num_kv_shared_layers=2, vocab_size_per_layer_input=PER_LAYER_VOCAB,
         altup_num_inputs=3, activation_sparsity_pattern=[0.9, 0.6, 0.0, 0.0, 0.0],
         rope_parameters={S: {"rope_type": "default", "rope_theta": 100.0},
                          F: {"rope_type": "default", "rope_theta": 10000.0}})
HUB = dict(_BASE, num_kv_shared_layers=0, vocab_size_per_layer_input=VOCAB, altup_num_inputs=2,
           altup_correct_scale=False, activation_sparsity_pattern=[0.0] * 5,
           rope_parameters={S: {"rope_type": "default", "rope_theta": 50.0},
                            F: {"rope_type": "default", "rope_theta": 5000.0}})


def _hub_spelling(path) -> None:
    """config.json as the hub's releases spell it: one base per layer kind, no layer_types."""
    c = json.loads((path / "config.json").read_text())
    assert c["layer_types"] == [S, S, S, S, F]  # Transformers' default, which ster must rebuild
    rp = c.pop("rope_parameters")
    c.update(rope_theta=rp[F]["rope_theta"], rope_local_base_freq=rp[S]["rope_theta"], rope_scaling=None)
    del c["layer_types"]
    (path / "config.json").write_text(json.dumps(c, indent=1))


@pytest.fixture(scope="module")
def e_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma3n_e")
    return path, build_checkpoint(path, "gemma3n_text", E)


@pytest.fixture(scope="module")
def hub_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma3n_hub")
    ref = build_checkpoint(path, "gemma3n_text", HUB)
    _hub_spelling(path)
    return path, ref


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


def test_e_model_matches_transformers(e_model):
    path, ref = e_model
    assert max(PROMPT) >= PER_LAYER_VOCAB  # the clamp to row 0 is on the path
    spec = _check(path, ref).spec
    assert spec.altup.num_inputs == 3 and spec.altup.correct_scale and spec.laurel and spec.per_layer_clamp
    assert [layer.ffn_sparsity for layer in spec.layers] == [0.9, 0.6, 0.0, 0.0, 0.0]
    assert [layer.kv_source for layer in spec.layers] == [None, None, None, 2, 1]
    assert [layer.sliding_window for layer in spec.layers] == [5, None, 5, 5, None]
    assert spec.attn_scale == 1.0 and spec.value_norm and spec.per_layer_input == 8 and spec.adapters == "ffn"


def test_hub_spelling_matches_transformers(hub_model):
    path, ref = hub_model
    spec = _check(path, ref).spec
    assert spec.altup.num_inputs == 2 and not spec.altup.correct_scale
    assert [layer.sliding_window is None for layer in spec.layers] == [False, False, False, False, True]
    assert [layer.kv_source for layer in spec.layers] == [None] * 5
    assert spec.intermediate_size == 96  # Transformers saves it once per layer


def _switch_off(dec, feature: str) -> None:
    for layer in dec.layers:
        if feature == "sparsity":
            layer.ffn.sparsity = 0.0
        elif feature == "laurel":
            layer.laurel = None
        elif feature == "altup_prediction":
            layer.altup.prediction = np.zeros_like(layer.altup.prediction)
        elif feature == "altup_correction":
            layer.altup.correction = np.zeros_like(layer.altup.correction)
        elif feature == "correct_output_scale":
            layer.altup.output_scale = np.ones_like(layer.altup.output_scale)
        elif feature == "per_layer_input":
            layer.per_layer = None
    if feature == "altup_unembed":  # copies brought back without their projections
        dec.altup = (dec.altup[0], [lambda x: x] * len(dec.altup[1]))


@pytest.mark.parametrize("feature", ["sparsity", "laurel", "altup_prediction", "altup_correction",
                                     "correct_output_scale", "per_layer_input", "altup_unembed"])
def test_each_feature_is_seen_by_the_oracle(e_model, feature):
    """Switched off in ster, each feature moves the logits well away from transformers' (so the
    1e-4 agreement above checks it)."""
    path, ref_model = e_model
    dec = load_model(str(path)).decoder
    ref, _ = reference_logits(ref_model, PROMPT)
    assert rel_err(dec.forward(PROMPT), ref) < 1e-4
    _switch_off(dec, feature)
    assert rel_err(dec.forward(PROMPT), ref) > 1e-3


def test_captured_hidden_states_are_the_first_copy(e_model):
    """Capture and steering see AltUp's first copy: transformers' output_hidden_states (the embedding,
    then each layer's first copy, the last one before the final norm), and ``ster parity`` layer by layer."""
    from ster_py.parity import compare

    path, ref_model = e_model
    loaded = load_model(str(path))
    ref_logits, ref_hidden = reference_logits(ref_model, PROMPT)
    hidden: list = []
    loaded.decoder.forward(PROMPT, hidden_states=hidden)
    assert len(hidden) == len(ref_hidden) == 6
    for ours, theirs in zip(hidden, ref_hidden):
        assert ours.shape == (16, 64) and rel_err(ours, theirs) < 1e-4
    result = compare(loaded, "tiny", PROMPT, lambda ids: reference_logits(ref_model, ids), 1e-4)
    assert result.passed and len(result.layers) == 5 and result.first_divergent_layer is None


@pytest.mark.parametrize("sparsity", [0.95, 0.6, 0.3])
def test_gaussian_top_matches_transformers(sparsity):
    import torch
    from transformers import Gemma3nTextConfig
    from transformers.models.gemma3n.modeling_gemma3n import Gemma3nTextMLP

    from ster_py.decoder.ffn import gaussian_top

    cfg = Gemma3nTextConfig(hidden_size=8, intermediate_size=40, num_hidden_layers=1, num_attention_heads=1,
                            num_key_value_heads=1, head_dim=8, activation_sparsity_pattern=[sparsity],
                            num_kv_shared_layers=0, layer_types=[F])
    x = np.random.RandomState(1).randn(6, 40).astype(np.float32) * 3
    ref = Gemma3nTextMLP(cfg, 0)._gaussian_topk(torch.from_numpy(x)).numpy()
    ours = gaussian_top(x, sparsity)
    assert np.abs(ours - ref).max() < 1e-5
    assert 0 < np.count_nonzero(ours) < ours.size


# ----------------------------------------------------------------------------- wrapper

def test_wrapper_runs_its_text_decoder(e_model, tmp_path):
    """The decoder stored as a gemma3n checkpoint stores it: the text config as text_config, its tensors
    below model.language_model, the head tied, towers beside it (never read). Transformers' wrapper
    needs timm for its vision tower (not installed here), so the checkpoint is the text model's own
    weights renamed as Gemma3nForConditionalGeneration names them, and the oracle is the text model."""
    import torch
    from safetensors.torch import load_file, save_file

    path, ref_model = e_model
    text = json.loads((path / "config.json").read_text())
    text.pop("architectures", None)
    config = {"model_type": "gemma3n", "architectures": ["Gemma3nForConditionalGeneration"],
              "text_config": text, "vision_config": {"model_type": "gemma3n_vision"},
              "audio_config": {"model_type": "gemma3n_audio"}, "eos_token_id": 2}
    state = {("model.language_model." + n.removeprefix("model.")) if n.startswith("model.") else n: t
             for n, t in load_file(str(path / "model.safetensors")).items()}
    state.pop("lm_head.weight", None)
    state["model.embed_vision.embedding.weight"] = torch.zeros(4, 64)
    state["model.audio_tower.subsample_conv_projection.input_proj_linear.weight"] = torch.zeros(8, 8)
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps(config))
    for f in path.iterdir():
        if f.name.startswith("tokenizer"):
            shutil.copy(f, tmp_path / f.name)
    model = _check(tmp_path, ref_model, greedy=False)
    assert model.spec.model_type == "gemma3n_text"
    assert model.spec.names["altup_in"].startswith("model.language_model.altup_projections")


# ----------------------------------------------------------------------------- refusals

def _config(**changes) -> dict:
    c = {"model_type": "gemma3n_text", **E}
    c.update(changes)
    return {k: v for k, v in c.items() if v is not None}


REFUSED = {
    "active-idx": (dict(altup_active_idx=1), "altup_active_idx"),
    "widths-per-layer": (dict(intermediate_size=[96, 96, 128, 96, 96]), "intermediate_size list"),
    "scaled-sliding": (dict(rope_parameters={S: {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0},
                                             F: {"rope_type": "default", "rope_theta": 1e6}}), "scaled"),
    "no-per-layer-inputs": (dict(hidden_size_per_layer_input=0), "hidden_size_per_layer_input"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_before_any_weight(case, tmp_path):
    changes, words = REFUSED[case]
    with pytest.raises(SterError, match=words):
        gate(_config(**changes), tmp_path / "config.json")


INVALID = {
    "altup-inputs": (dict(altup_num_inputs=0), "altup_num_inputs"),
    "altup-scale": (dict(altup_correct_scale="yes"), "altup_correct_scale"),
    "sparsity-length": (dict(activation_sparsity_pattern=[0.9, 0.0]), "activation_sparsity_pattern"),
    "sparsity-one": (dict(activation_sparsity_pattern=[1.0, 0, 0, 0, 0]), "activation_sparsity_pattern"),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_config_named(case):
    changes, words = INVALID[case]
    config = _config(**changes)
    family = gate(config, "config.json")
    with pytest.raises(SterError, match=words):
        spec_from_config(config, family, "config.json")


def test_uniform_widths_per_layer_read_as_one():
    spec = spec_from_config(_config(intermediate_size=[96] * 5), FAMILIES["gemma3n_text"], "config.json")
    assert spec.intermediate_size == 96


# ----------------------------------------------------------------------------- GGUF (llama.cpp's gemma3n)
# Two checkpoints stored as the hub stores them (_build_hub_layout), converted by llama.cpp 0.3.36's own
# converter at F32 (it takes only 4 AltUp copies):
# - "e": E's shape with 4 copies: sparsity 0.9 / 0.6 on two layers, the last two layers reusing keys and
#   values (of 1, sliding, and 2, full), a per-layer width of 8; against transformers;
# - "llama": the shape llama.cpp's gemma3n fixes in code whatever the file says (src/models/gemma3n.cpp,
#   llama-hparams.h: per-layer inputs 256 wide, Laurel rank 64, the first 10 layers sparse at 0.95, layers
#   from 20 on reusing keys and values, a final soft-cap of 30), so that llama.cpp is an oracle too.
GGUF_CASES = {
    "e": ("gemma3n_text", dict(E, altup_num_inputs=4, layer_types=[S, S, F, S, F], vocab_size_per_layer_input=VOCAB),
          {}),
    "llama": ("gemma3n_text", dict(_BASE, hidden_size_per_layer_input=256, laurel_rank=64, altup_num_inputs=4,
                                   layer_types=[S, S, F, S, F], num_kv_shared_layers=0,
                                   vocab_size_per_layer_input=VOCAB, final_logit_softcapping=30.0,
                                   activation_sparsity_pattern=[0.95] * 5,
                                   rope_parameters=E["rope_parameters"]), {}),
}
LONG_PROMPT = np.random.RandomState(3).randint(3, VOCAB, size=32).tolist()


def _build_hub_layout(path, model_type, config):
    """The checkpoint as the hub's releases store it: the layers that reuse another's keys and values
    keep k_proj, v_proj and k_norm, which Transformers ignores (llama.cpp requires them)."""
    import torch
    from safetensors.torch import load_file, save_file

    model = build_checkpoint(path, model_type, config)
    state = load_file(str(path / "model.safetensors"))
    g = torch.Generator().manual_seed(11)
    kv, d, hidden = config["num_key_value_heads"], config["head_dim"], config["hidden_size"]
    n = config["num_hidden_layers"]
    for i in range(n - config["num_kv_shared_layers"] if config["num_kv_shared_layers"] else n, n):
        stem = f"model.layers.{i}.self_attn."
        for proj in ("k_proj", "v_proj"):
            state[stem + proj + ".weight"] = torch.randn(kv * d, hidden, generator=g) * 0.15
        state[stem + "k_norm.weight"] = 1 + torch.randn(d, generator=g) * 0.3
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    return model


@pytest.fixture(scope="module")
def gemma3n_gguf(tmp_path_factory):
    """name -> (converted F32 .gguf, transformers model) for every case of GGUF_CASES."""
    from llamacpp_convert import convert_cases

    return convert_cases(tmp_path_factory.mktemp("llama_cpp_gemma3n"), GGUF_CASES, _build_hub_layout)


@pytest.mark.parametrize("name", list(GGUF_CASES))
def test_gguf_matches_transformers(name, gemma3n_gguf):
    """The file read back is the checkpoint's model: with the activation sparsity's cut-off taken as
    Transformers takes it (population std; the file runs llama.cpp's sample std, below), transformers'
    logits within 1e-4."""
    from dataclasses import replace

    from ster_py.decoder.model import Decoder

    path, ref_model = gemma3n_gguf[name]
    model, hf_model = load_model(str(path)), load_model(str(path.parent / "hf" / name))
    spec, hf = model.spec, hf_model.spec
    assert spec.sparsity_ddof == 1 and hf.sparsity_ddof == 0
    # the hub's layout: the reusing layers' own keys and values are stored, never read
    assert rel_err(hf_model.decoder.forward(PROMPT), reference_logits(ref_model, PROMPT)[0]) < 1e-4
    assert hf_model.decoder._weights.unused_tensors(hf) == []
    assert [(layer.sliding_window, layer.kv_source, round(layer.ffn_sparsity, 6)) for layer in spec.layers] == \
        [(layer.sliding_window, layer.kv_source, layer.ffn_sparsity) for layer in hf.layers]
    assert (spec.altup, spec.laurel, spec.per_layer_input, spec.per_layer_vocab, spec.final_softcap) == \
        (hf.altup, hf.laurel, hf.per_layer_input, hf.per_layer_vocab, hf.final_softcap)
    dec = Decoder(replace(spec, sparsity_ddof=0), model.decoder.weights)
    ours = dec.forward(PROMPT)
    assert rel_err(ours, reference_logits(ref_model, PROMPT)[0]) < 1e-4
    cache = dec.new_cache()
    pieces = np.concatenate([dec.forward(PROMPT[:SPLIT], cache), dec.forward(PROMPT[SPLIT:], cache)])
    assert rel_err(pieces, ours) < 1e-5
    assert rel_err(pieces, reference_split_logits(ref_model, PROMPT, SPLIT)) < 1e-4
    assert model.decoder.weights.unused_tensors(spec) == []


def test_gguf_e_file_layers(gemma3n_gguf):
    spec = load_model(str(gemma3n_gguf["e"][0])).spec
    assert [layer.kv_source for layer in spec.layers] == [None, None, None, 1, 2]
    assert [round(layer.ffn_sparsity, 6) for layer in spec.layers] == [0.9, 0.6, 0.0, 0.0, 0.0]
    assert spec.altup.num_inputs == 4 and spec.per_layer_input == 8


def test_gguf_against_llamacpp(gemma3n_gguf):
    """llama.cpp on the same file: logits within 5e-3, the same top-1 token at every position of a
    32-token prompt, the prompt token by token through the cache as the whole. The one computation in
    which llama.cpp's gemma3n differs from Transformers', recorded here (fails when llama.cpp changes):
    its gaussian_topk takes the sample std (n - 1), which a GGUF file runs with; with Transformers'
    population std the logits are more than 1e-2 from llama.cpp's."""
    from dataclasses import replace

    from ster_py import llamacpp
    from ster_py.decoder.model import Decoder

    path = gemma3n_gguf["llama"][0]
    (theirs,) = llamacpp.logits(path, [LONG_PROMPT])
    theirs = theirs[:, :VOCAB]
    model = load_model(str(path))
    ours = model.decoder.forward(LONG_PROMPT)
    assert rel_err(ours, theirs) < 5e-3
    assert (ours.argmax(1) == theirs.argmax(1)).all()
    cache = model.decoder.new_cache()
    steps = np.concatenate([model.decoder.forward([t], cache) for t in LONG_PROMPT])
    assert rel_err(steps, ours) < 1e-5
    population = Decoder(replace(model.spec, sparsity_ddof=0), model.decoder.weights).forward(LONG_PROMPT)
    assert rel_err(population, theirs) > 1e-2


def test_q8_0_gguf_gives_llamacpps_top1(gemma3n_gguf, tmp_path):
    """The llama case quantized by llama.cpp's quantizer to Q8_0: ster keeps the matrices in their blocks
    and computes what they define (the same weights dequantized, within 1e-4); llama.cpp's logits, which
    round each activation row to 8 bits in its products, within 15 % (measured 10 %), and its top-1 token
    at every position but near-ties (its own top two closer than three times the rms difference of the
    two implementations' logits, taken for a difference of two logits; as test_parity_gemma4_gguf.py).
    (Q4_K_M, measured: 12 %, and one position past that rule: not asserted.)"""
    from ster_py import llamacpp
    from ster_py.decoder.model import Decoder
    from ster_py.decoder.qlinear import QuantTensor
    from ster_py.gguf.reader import GGUFFile
    from ster_py.weights import GGUFWeights

    q = llamacpp.quantize(gemma3n_gguf["llama"][0], tmp_path / "llama-Q8_0.gguf", "Q8_0")
    model = load_model(str(q))
    assert all(type(layer.ffn.gate.weight) is QuantTensor for layer in model.decoder.layers)
    ours = model.decoder.forward(LONG_PROMPT)
    exact = Decoder(model.spec, GGUFWeights(GGUFFile(q), "f32", qk_heads=None, quantized=False)).forward(LONG_PROMPT)
    assert rel_err(ours, exact) < 1e-4
    (ref,) = llamacpp.logits(q, [LONG_PROMPT])
    ref = ref[:, :VOCAB]
    assert rel_err(ours, ref) < 0.15
    mine, theirs = ours.argmax(1), ref.argmax(1)
    rows = np.arange(len(mine))
    margin = ref[rows, theirs] - ref[rows, mine]
    noise = np.sqrt(2 * np.mean((ours - ref) ** 2))
    assert np.all((mine == theirs) | (margin <= 3 * noise)), (np.nonzero(mine != theirs), margin, noise)
    assert (mine == theirs).mean() >= 0.8


def _gguf_spec(path, **meta_changes):
    from ster_py.gguf.config import spec_from_gguf
    from ster_py.gguf.reader import GGUFFile

    g = GGUFFile(path)
    meta = {**g.metadata, **meta_changes}
    return spec_from_gguf(meta, str(path), vocab_size=VOCAB, has_output="output.weight" in g.tensors,
                          tensors={n: t.shape for n, t in g.tensors.items()})


GGUF_REFUSED = {
    "active-idx": ({"gemma3n.altup.active_idx": 1}, "active_idx"),
    "altup-inputs": ({"gemma3n.altup.num_inputs": 0}, "altup.num_inputs"),
    "sparsity-length": ({"gemma3n.activation_sparsity_scale": [1.0, 2.0]}, "activation_sparsity_scale"),
    "widths": ({"gemma3n.feed_forward_length": [96] * 4 + [128]}, "different widths"),
}


@pytest.mark.parametrize("case", list(GGUF_REFUSED))
def test_gguf_refused_by_name(case, gemma3n_gguf):
    changes, words = GGUF_REFUSED[case]
    with pytest.raises(SterError, match=words):
        _gguf_spec(gemma3n_gguf["e"][0], **changes)
    _gguf_spec(gemma3n_gguf["e"][0])  # the file itself reads
