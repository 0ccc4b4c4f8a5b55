"""GGUF of issue 16's second group of families without a Transformers implementation: nemotron-nas
(llama.cpp's ``deci``) and plamo3 (llama.cpp's ``plamo3``), each written by llama.cpp 0.3.36's own
converter (conversion/deci.py, conversion/plamo.py) from the tiny checkpoints and built oracles of
test_parity_remote_b.py.

At F32 the file must give the oracle's logits within 1e-3 (whole, and through the cache in two
pieces), every tensor read; llama.cpp's own runtime on the same file gives the same top-1 token at
every position; quantized by llama.cpp's quantizer to Q8_0, ster gives llama.cpp's top-1 at every
position but near-ties (as test_parity_gemma3n.py).

What llama.cpp's files say (conversion/deci.py, src/models/deci.cpp): per-layer
attention.head_count / head_count_kv and feed_forward_length, 0 for a block_configs entry without
that half (a no_op attention: no heads; a no_op feed-forward: no width); q/k rows permuted per layer
by its own key/value heads.
"""
from __future__ import annotations

import numpy as np
import pytest

from ster_py.errors import SterError
from ster_py.load import load_model
from test_parity_remote_b import _NAS_BLOCKS, _NOOP_ATT, PROMPT, VOCAB, _nemotron_nas, _plamo3
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)
from tiny import reference_logits, reference_split_logits, rel_err

# the dequantized model's sums for a GGUF's prompt (conftest.quantized_tiles_off)
pytestmark = pytest.mark.usefixtures("quantized_tiles_off")

LONG_PROMPT = np.random.RandomState(3).randint(3, VOCAB, size=32).tolist()

# Every block_configs entry kind test_parity_remote_b.py's case has, with an attention-only layer (2)
# and a layer with neither half (3); "nas-ffn-kept" has none of them without a feed-forward (below:
# llama.cpp's graph drops an attention-only layer's attention).
_NAS_KEPT = [
    {"attention": {"n_heads_in_group": 4}, "ffn": {"ffn_mult": 2.625}},
    {"attention": _NOOP_ATT, "ffn": {"ffn_mult": 7.0}},
    {"attention": {"n_heads_in_group": 1}, "ffn": {"ffn_mult": 1.0}},
]

# test_parity_remote_b.py's blocks, the last sized by ffn_mult: the converter writes 0 for an entry sized by
# intermediate_size (test_deci_width_by_intermediate_size_is_refused)
_NAS_GGUF = _NAS_BLOCKS[:4] + [{"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 1.25}}]
GGUF_CASES = {  # name: (model_type, config, legacy config.json keys)
    "nas-blocks": ("nemotron-nas", dict(num_hidden_layers=5, block_configs=_NAS_GGUF), {}),
    "nas-ffn-kept": ("nemotron-nas", dict(num_hidden_layers=3, block_configs=_NAS_KEPT), {}),
    # test_parity_remote_b.py's plamo3 cases (no embedding scale: below)
    "plamo3-plain": ("plamo3", dict(num_hidden_layers=3, sliding_window_pattern=3, window_size=6,
                                    rope_local_theta=1000.0, scale_embedding=False), {}),
    "plamo3-yarn": ("plamo3", dict(num_hidden_layers=4, sliding_window_pattern=2, window_size=5,
                                   rope_local_theta=500.0, rope_scaling_factor=4, initial_context_length=8,
                                   scale_embedding=False), {}),
}


def _build(path, model_type: str, config: dict):
    if model_type == "nemotron-nas":
        return _nemotron_nas(path, config)
    if model_type == "plamo3":
        return _plamo3(path, dict(config))
    raise AssertionError(model_type)


@pytest.fixture(scope="module")
def gguf_models(tmp_path_factory):
    """name -> (converted F32 .gguf, Transformers oracle), one converter run for all cases."""
    from llamacpp_convert import convert_cases

    return convert_cases(tmp_path_factory.mktemp("llama_cpp_remote_b"), GGUF_CASES, _build)


# ------------------------------------------------------------------ nemotron-nas (deci)
def test_deci_gguf_matches_the_oracle(gguf_models):
    """The file read alone gives the oracle's layers (which halves, key/value heads, widths) and logits."""
    path, ref = gguf_models["nas-blocks"]
    model = load_model(str(path))
    assert model.resolved.kind == "gguf" and model.spec.model_type == "nemotron-nas"
    spec = model.spec
    assert [(layer.mixer, layer.ffn) for layer in spec.layers] == [("attention", "dense"), ("none", "dense"),
                                                                  ("attention", "none"), ("none", "none"),
                                                                  ("attention", "dense")]
    assert [spec.attention_shape(i)[1] for i in (0, 2, 4)] == [1, 4, 2]
    assert [spec.layer_norms(i) for i in range(4)] == [("attn_norm", "ffn_norm"), ("ffn_norm",), ("attn_norm",), ()]
    ref_logits, _ = reference_logits(ref, PROMPT)
    err = rel_err(model.decoder.forward(PROMPT), ref_logits)
    assert err < 1e-3, f"logits rel err {err:.2e}"
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:9], cache), model.decoder.forward(PROMPT[9:], cache)])
    assert rel_err(pieces, reference_split_logits(ref, PROMPT, 9)) < 1e-3
    assert model.decoder._weights.unused_tensors(spec) == []


def _near_tie_top1(ours: np.ndarray, ref: np.ndarray) -> None:
    """ster's top-1 is llama.cpp's at every position but near-ties: llama.cpp's own top two closer than three
    times the rms difference of the two implementations' logits, taken for a difference of two logits (the
    rule of test_parity_gemma3n.py / test_parity_gemma4_gguf.py)."""
    mine, theirs = ours.argmax(1), ref.argmax(1)
    rows = np.arange(len(mine))
    margin = ref[rows, theirs] - ref[rows, mine]
    noise = np.sqrt(2 * np.mean((ours - ref) ** 2))
    assert np.all((mine == theirs) | (margin <= 3 * noise)), (np.nonzero(mine != theirs), margin, noise)
    assert (mine == theirs).mean() >= 0.8


def test_deci_gguf_against_llamacpp(gguf_models):
    """llama.cpp's deci.cpp on the same files. Where every attending layer keeps its feed-forward, its logits
    are ster's (and the oracle's) with the same top-1 at every position of a 32-token prompt. On an
    attention-only layer (feed_forward_length 0, heads > 0) its graph skips the rest of the layer before the
    attention's output joins the stream (``if (n_ff == 0) continue;`` ahead of ``inpL = cur``), so the
    attention is dropped: llama.cpp's logits are then ster's with that layer's attention removed, and far from
    the oracle's (recorded here; fails when llama.cpp changes)."""
    import dataclasses

    from ster_py import llamacpp
    from ster_py.decoder.model import Decoder

    kept, blocks = gguf_models["nas-ffn-kept"][0], gguf_models["nas-blocks"][0]
    theirs_kept, theirs_blocks = llamacpp.logits_of_files([kept, blocks], LONG_PROMPT)
    ours = load_model(str(kept)).decoder.forward(LONG_PROMPT)
    assert rel_err(ours, theirs_kept) < 5e-3 and (ours.argmax(1) == theirs_kept.argmax(1)).all()
    model = load_model(str(blocks))
    assert rel_err(model.decoder.forward(LONG_PROMPT), theirs_blocks) > 0.05
    layers = list(model.spec.layers)
    layers[2] = dataclasses.replace(layers[2], mixer="none", rope=None, norms=())
    dropped = Decoder(dataclasses.replace(model.spec, layers=tuple(layers)), model.decoder.weights)
    assert rel_err(dropped.forward(LONG_PROMPT), theirs_blocks) < 5e-3


def test_deci_q8_0_gives_llamacpps_top1(gguf_models, tmp_path):
    """The nas-ffn-kept file quantized by llama.cpp's quantizer to Q8_0: ster keeps the matrices in their blocks
    and computes what they define (the same weights dequantized, within 1e-4); llama.cpp's top-1 at every
    position but near-ties."""
    from ster_py import llamacpp
    from ster_py.decoder.model import Decoder
    from ster_py.decoder.qlinear import QuantTensor
    from ster_py.gguf.reader import GGUFFile
    from ster_py.weights import GGUFWeights

    q = llamacpp.quantize(gguf_models["nas-ffn-kept"][0], tmp_path / "nas-Q8_0.gguf", "Q8_0")
    model = load_model(str(q))
    assert all(type(layer.ffn.gate.weight) is QuantTensor for layer in model.decoder.layers)
    ours = model.decoder.forward(LONG_PROMPT)
    g = GGUFFile(q)
    qk = (model.spec.num_attention_heads, model.spec.num_key_value_heads)
    exact = Decoder(model.spec, GGUFWeights(g, "f32", qk_heads=qk, quantized=False,
                                            qk_layers={i: model.spec.attention_shape(i)[:2] for i in range(3)}))
    assert rel_err(ours, exact.forward(LONG_PROMPT)) < 1e-4
    (ref,) = llamacpp.logits(q, [LONG_PROMPT])
    assert rel_err(ours, ref) < 0.15
    _near_tie_top1(ours, ref[:, :VOCAB])


def _gguf_spec(path, **meta_changes):
    from ster_py.gguf.config import spec_from_gguf
    from ster_py.gguf.reader import GGUFFile

    g = GGUFFile(path)
    meta = {**g.metadata, **meta_changes}
    return spec_from_gguf(meta, str(path), vocab_size=VOCAB, has_output="output.weight" in g.tensors,
                          tensors={n: t.shape for n, t in g.tensors.items()})


DECI_REFUSED = {
    # what the converter writes for test_parity_remote_b.py's last entry ({"intermediate_size": 80, "ffn_mult": None})
    "width-by-intermediate-size": ({"deci.feed_forward_length": np.array([256, 512, 0], np.int32)},
                                   "feed_forward_length is 0 .* holds blk.2.ffn_"),
    "linear-attention": ({"deci.attention.head_count_kv": np.array([1, 0, 0], np.int32)},
                         "linear replacement of attention"),
    "kv-without-heads": ({"deci.attention.head_count": np.array([4, 0, 0], np.int32),
                          "deci.attention.head_count_kv": np.array([1, 0, 4], np.int32)}, "no query heads"),
    "no-attention": ({"deci.attention.head_count": np.array([0, 0, 0], np.int32),
                      "deci.attention.head_count_kv": np.array([0, 0, 0], np.int32)}, "no layer .* has attention"),
    "length": ({"deci.feed_forward_length": np.array([256, 512], np.int32)}, "one per block"),
    "attention-weights": ({"deci.attention.head_count": np.array([4, 0, 0], np.int32),
                           "deci.attention.head_count_kv": np.array([1, 0, 0], np.int32)}, "holds blk.2.attn_"),
}


@pytest.mark.parametrize("case", list(DECI_REFUSED))
def test_deci_refused_by_name(case, gguf_models):
    changes, words = DECI_REFUSED[case]
    with pytest.raises(SterError, match=words):
        _gguf_spec(gguf_models["nas-ffn-kept"][0], **changes)


# ------------------------------------------------------------------ plamo3
PLAMO3 = ("plamo3-plain", "plamo3-yarn")


@pytest.mark.parametrize("name", PLAMO3)
def test_plamo3_gguf_matches_the_oracle(name, gguf_models):
    """The file read alone: which layers slide (the file's sliding_window_pattern), their base
    (rope.freq_base_swa), the norms' offsets folded in by the converter, fused qkv and gate/up."""
    path, ref = gguf_models[name]
    model = load_model(str(path))
    assert model.resolved.kind == "gguf" and model.spec.model_type == "plamo3"
    hf = load_model(str(path.parent / "hf" / name)).spec
    assert [layer.sliding_window for layer in model.spec.layers] == [layer.sliding_window for layer in hf.layers]
    ref_logits, _ = reference_logits(ref, PROMPT)
    err = rel_err(model.decoder.forward(PROMPT), ref_logits)
    assert err < 1e-3, f"logits rel err {err:.2e}"
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:9], cache), model.decoder.forward(PROMPT[9:], cache)])
    assert rel_err(pieces, reference_split_logits(ref, PROMPT, 9)) < 1e-3
    assert model.decoder._weights.unused_tensors(model.spec) == []


def test_plamo3_gguf_against_llamacpp(gguf_models):
    """llama.cpp's plamo3.cpp on both files: logits within 5e-3 of ster's and the same top-1 at every position
    of a 32-token prompt (past the 5- and 6-token windows, and the YaRN case past its 8-position original
    context)."""
    from ster_py import llamacpp

    files = [gguf_models[n][0] for n in PLAMO3]
    for path, theirs in zip(files, llamacpp.logits_of_files(files, LONG_PROMPT)):
        ours = load_model(str(path)).decoder.forward(LONG_PROMPT)
        assert theirs is not None, f"llama.cpp refused {path.name}"
        assert rel_err(ours, theirs[:, :VOCAB]) < 5e-3, path.name
        assert (ours.argmax(1) == theirs[:, :VOCAB].argmax(1)).all(), path.name


def test_plamo3_q8_0_gives_llamacpps_top1(gguf_models, tmp_path):
    """The YaRN file quantized by llama.cpp's quantizer to Q8_0: ster keeps the fused matrices in their blocks
    and computes what they define (within 1e-4 of the same weights dequantized); llama.cpp's top-1 at every
    position but near-ties."""
    from ster_py import llamacpp
    from ster_py.decoder.model import Decoder
    from ster_py.decoder.qlinear import QuantTensor
    from ster_py.gguf.reader import GGUFFile
    from ster_py.weights import GGUFWeights

    q = llamacpp.quantize(gguf_models["plamo3-yarn"][0], tmp_path / "plamo3-Q8_0.gguf", "Q8_0")
    model = load_model(str(q))
    assert all(type(getattr(layer, role).weight) is QuantTensor for layer in model.decoder.layers
               for role in ("q", "k", "v", "o", "gate", "up", "down"))  # the fused rows split in their blocks
    ours = model.decoder.forward(LONG_PROMPT)
    exact = Decoder(model.spec, GGUFWeights(GGUFFile(q), "f32", quantized=False)).forward(LONG_PROMPT)
    assert rel_err(ours, exact) < 1e-4
    (ref,) = llamacpp.logits(q, [LONG_PROMPT])
    assert rel_err(ours, ref[:, :VOCAB]) < 0.15
    _near_tie_top1(ours, ref[:, :VOCAB])


@pytest.mark.parametrize("name", ["nas-blocks", "plamo3-yarn"])
def test_gguf_dir_matches_the_oracle(name, gguf_models, tmp_path):
    """config.json beside the converted .gguf: the config decides the model (DeciLM's block_configs; PLaMo 3's
    offsets, which the converter folded into the stored norms, are not added twice), the file holds the weights
    (q/k rows unpermuted by each layer's own key/value heads)."""
    import shutil

    path, ref = gguf_models[name]
    hf = path.parent / "hf" / name
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if (hf / f).is_file():
            shutil.copy(hf / f, tmp_path / f)
    (tmp_path / "model.gguf").symlink_to(path)
    model = load_model(str(tmp_path))
    assert model.resolved.kind == "gguf_dir"
    err = rel_err(model.decoder.forward(PROMPT), reference_logits(ref, PROMPT)[0])
    assert err < 1e-3, f"logits rel err {err:.2e}"
    assert model.decoder._weights.unused_tensors(model.spec) == []
