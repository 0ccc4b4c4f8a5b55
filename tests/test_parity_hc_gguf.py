"""GGUF files of the hyper-connection families (issue 14's remainder, group GHC), as llama.cpp's converter writes
them from tiny checkpoints made here with transformers.

HY V4 (``hy_v4``, conversion/hy_v4.py and src/models/hy-v4.cpp of the pinned llama.cpp). The converter reads the
release's tensor names (``hc_attn_layer.hc_pre.hc_fn``, ``model.hc_head.hc_head_fn``, the feed-forwards'
``gate_proj`` beside the attention's ``linear_gate``), so each checkpoint is rewritten in them before conversion
(what Transformers' writer spells is a reversal of its own renames, which the converter does not map).

Where llama.cpp and Transformers disagree, the file is read as llama.cpp's graph runs it: its converter keeps the
query/key rows as they are and hy-v4.cpp rotates adjacent pairs (LLAMA_ROPE_TYPE_NORM, "matching the reference
implementation", as seed 002 reads vLLM), where Transformers 5.24 rotates halves. The F32 file is therefore
checked against Transformers' HY V4 with its ``apply_rotary_pos_emb`` rotating adjacent pairs (the only change;
``pairs_rotation``), and against llama.cpp's own runtime (llama-cpp-python 0.3.36), whose logits it must give
within 1e-3 and top-1 at every position; a test shows the two rotations do differ on the case.

Not here: DeepSeek-V4 (``deepseek4``, conversion/deepseek.py) and GLM-5-Next (``glm5-next``, conversion/glm.py),
which the pinned converter writes too; ster refuses their files by architecture until they are checked.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from ster_py.errors import SterError
from ster_py.load import load_model
from test_parity_dense import PROMPT
from test_parity_hc import CASES as HC_CASES
from test_parity_hc import _RELEASE
from test_parity_mla_b import LONG_PROMPT, WIDE, WIDE_DSA, WIDE_EXPERTS, _decisive_dsa, _indexer_margins
from tiny import check_llamacpp_top1, check_token_steps
from tiny import build_checkpoint as build
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)
from tiny import reference_logits, reference_split_logits, rel_err

# The release spells the feed-forwards' gates gate_proj (only the attention's is linear_gate); Transformers' writer
# turns every gate_proj into linear_gate.
_RELEASE_FFN = ((".mlp.linear_gate.", ".mlp.gate_proj."), (".shared_experts.linear_gate.", ".shared_experts.gate_proj."))

GGUF_CASES = {  # name: (model_type, config, legacy config.json keys)
    # test_parity_hc's first case (3 streams, layer 0 dense, indexers of their own on layers 0 and 1, layer 2
    # shared, 16 tokens past an index_topk of 5) with routed experts clamped hard enough to bite
    "hy_v4": ("hy_v4", dict(HC_CASES["hy_v4"][1], swiglu_limit=0.3), {}),
}
# 256 wide (every projection in Q8_0 blocks), routing and indexer made decisive (test_parity_mla_b._decisive_dsa)
QUANT_CASES = {
    "q-hy_v4": ("hy_v4", dict(WIDE, **WIDE_EXPERTS, **WIDE_DSA, hc_mult=3, n_shared_experts=1,
                              routed_scaling_factor=2.0, swiglu_limit=3.0), {}),
}


def _release_spelling(path):
    """Rewrite the checkpoint at ``path`` in the release's tensor names (the ones llama.cpp's converter maps)."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    renamed = {}
    for name, t in tensors.items():
        for old, new in _RELEASE + _RELEASE_FFN:
            name = name.replace(old, new)
        renamed[name] = t
    save_file(renamed, str(path / "model.safetensors"), metadata={"format": "pt"})


def _positive_index_norms(model, component):
    """Keep the decisive index direction's sign through the norms it passes (random norm weights may flip it on a
    layer, which then keeps the farthest keys, all scoring relu's zero): the query latent's first component and
    the index key's ``component`` get positive weights."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("q_a_layernorm.weight"):
                p[0] = p[0].abs()
            elif name.endswith("indexer.k_norm.weight"):
                p[component] = p[component].abs()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """name -> (converted F32 .gguf, transformers model) for GGUF_CASES and QUANT_CASES (one converter run)."""
    from llamacpp_convert import convert_cases

    def make(path, model_type, config):
        if path.name in QUANT_CASES:  # the index heads' last qk_rope_head_dim components rotate, by pairs
            first = config["index_head_dim"] - config["qk_rope_head_dim"] + 2 * 4
            model = _decisive_dsa(path, model_type, config, components=(first, first + 1))
            _positive_index_norms(model, first)
            model.save_pretrained(path)
        else:
            model = build(path, model_type, config)
        _release_spelling(path)
        return model

    return convert_cases(tmp_path_factory.mktemp("llama_cpp_hc"), {**GGUF_CASES, **QUANT_CASES}, make)


@contextlib.contextmanager
def pairs_rotation():
    """Transformers' HY V4 rotating adjacent pairs (as llama.cpp's hy-v4.cpp does) instead of halves: each query /
    key is reordered evens-then-odds before ``rotate_half`` (the reordering is the same on both sides of every
    dot product, so the scores are those of the pairs rotation; Transformers' DeepSeek-V3 does the same)."""
    from transformers.models.hy_v4 import modeling_hy_v4 as mh

    halves = mh.apply_rotary_pos_emb

    def pairs(q, k, cos, sin, unsqueeze_dim=1):
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)

        def evens_then_odds(x):
            *lead, d = x.shape
            return x.reshape(*lead, d // 2, 2).transpose(-1, -2).reshape(*lead, d)

        q, k = evens_then_odds(q), evens_then_odds(k)
        return q * cos + mh.rotate_half(q) * sin, k * cos + mh.rotate_half(k) * sin

    mh.apply_rotary_pos_emb = pairs
    try:
        yield
    finally:
        mh.apply_rotary_pos_emb = halves


@pytest.mark.parametrize("name", list(GGUF_CASES))
def test_gguf_matches_transformers_and_llamacpp(name, converted):
    """The F32 file: logits within 1e-3 of Transformers rotating pairs, whole, in two pieces and token by token;
    every tensor read; the same layer kinds, streams and clamp as the checkpoint's config; llama.cpp's own logits
    within 1e-3 with its top-1 at every position; no indexer choice resting on a near-tie."""
    from ster_py import llamacpp
    from ster_py.config import spec_from_config
    from ster_py.families import FAMILIES

    path, ref_model = converted[name]
    model = load_model(str(path))
    assert model.resolved.kind == "gguf" and model.spec.streams is not None
    with pairs_rotation():
        ref_logits, _ = reference_logits(ref_model, PROMPT)
        ref_split = reference_split_logits(ref_model, PROMPT, 9)
    ours = model.decoder.forward(PROMPT)
    assert rel_err(ours, ref_logits) < 1e-3, rel_err(ours, ref_logits)
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:9], cache), model.decoder.forward(PROMPT[9:], cache)])
    assert rel_err(pieces, ref_split) < 1e-3
    cache = model.decoder.new_cache()
    steps = np.concatenate([model.decoder.forward([t], cache) for t in PROMPT])
    assert rel_err(steps, ref_logits) < 1e-3
    assert model.decoder._weights.unused_tensors(model.spec) == []
    gaps = _indexer_margins(model, PROMPT)
    assert gaps and min(gaps) > 1e-4, "a top-k choice rests on (nearly) equal scores: pick another case"

    model_type, config, _ = GGUF_CASES[name]
    source = spec_from_config(dict(config, model_type=model_type), FAMILIES[model_type])
    assert [(layer.ffn, layer.indexer) for layer in model.spec.layers] == [
        (layer.ffn, layer.indexer) for layer in source.layers]
    assert model.spec.streams.n == source.streams.n and model.spec.streams.head == source.streams.head
    routed = [layer.moe for layer in model.spec.layers if layer.ffn == "moe"]
    assert routed and all(m.limit == pytest.approx(0.3) and not m.clamp_act and m.shared_limit is None
                          for m in routed)

    (theirs,) = llamacpp.logits(path, [PROMPT])
    theirs = theirs[:, :ours.shape[1]]
    assert rel_err(ours, theirs) < 1e-3, rel_err(ours, theirs)
    assert np.array_equal(ours.argmax(1), theirs.argmax(1))


def test_the_rotations_differ(converted):
    """The case tells the two readings apart: Transformers' own HY V4 (halves) is far from the file's logits."""
    path, ref_model = converted["hy_v4"]
    halves, _ = reference_logits(ref_model, PROMPT)
    assert rel_err(load_model(str(path)).decoder.forward(PROMPT), halves) > 0.1


def test_clamp_bites(converted):
    """The F32 case's routed clamp changes its logits (else the case would not test llama.cpp's clamp)."""
    from dataclasses import replace

    from ster_py.decoder.model import Decoder

    path, _ = converted["hy_v4"]
    model = load_model(str(path))
    layers = tuple(replace(layer, moe=replace(layer.moe, limit=None)) if layer.ffn == "moe" else layer
                   for layer in model.spec.layers)
    unclamped = Decoder(replace(model.spec, layers=layers), model.decoder._weights)
    assert rel_err(unclamped.forward(PROMPT), model.decoder.forward(PROMPT)) > 1e-3


@pytest.mark.parametrize("name", list(QUANT_CASES))
def test_q8_0_gives_llamacpps_top1(name, converted, tmp_path):
    """llama.cpp's Q8_0 of the wide file, run by ster (projections and experts kept in their blocks) and by
    llama.cpp: logits within 5 %, llama.cpp's top-1 token at every position of a 32-token prompt but near-ties,
    token-by-token decoding equal to the whole prompt."""
    from ster_py import llamacpp
    from ster_py.decoder.qlinear import QuantLinear

    path, _ = converted[name]
    q = llamacpp.quantize(path, tmp_path / f"{name}-Q8_0.gguf", "Q8_0")
    model = load_model(str(q))
    assert min(_indexer_margins(model, LONG_PROMPT)) > 0.05  # the decisive indexer: 8th and 9th scores far apart
    mixer = model.decoder.layers[1].mixer
    assert type(mixer.o) is QuantLinear and type(mixer.kv_a) is QuantLinear
    ours = model.decoder.forward(LONG_PROMPT)
    (ref,) = llamacpp.logits(q, [LONG_PROMPT])
    ref = ref[:, :ours.shape[1]]
    check_llamacpp_top1(ours, ref)  # a routing flip would move a whole row far more than a near-tie
    check_token_steps(model, LONG_PROMPT, ours)


def test_gguf_without_indexer_types_is_refused():
    """llama.cpp's hy_v4 loader stops on a file whose indexer states no attention.indexer.types (layer 0 would
    own no indexer); ster refuses it by name, from the metadata alone."""
    from ster_py.decoder.latent import LatentSpec
    from ster_py.gguf.config import _gguf_indexer

    meta = {"hy_v4.attention.indexer.head_count": 4, "hy_v4.attention.indexer.key_length": 16,
            "hy_v4.attention.indexer.top_k": 8}
    latent = LatentSpec(16, 24, 8, 4, 12, norm_eps=1e-5)
    with pytest.raises(SterError, match="indexer.types"):
        _gguf_indexer(meta, "hy_v4", latent, 3, 64, "x.gguf")
    spec, kinds = _gguf_indexer(dict(meta, **{"hy_v4.attention.indexer.types": [True, False, True]}), "hy_v4",
                                latent, 3, 64, "x.gguf")
    assert kinds == ["full", "shared", "full"]
    assert spec.interleaved and spec.rope_last and spec.norm_eps == 1e-5


@pytest.mark.parametrize("extra, match", [({"hy_v4.rope.scaling.type": "yarn"}, "rope scaling"),
                                          ({"hy_v4.attention.indexer.top_k": None}, "without DeepSeek Sparse")])
def test_unchecked_hy_v4_files_are_refused(extra, match):
    """A hy_v4 file with scaled rotation, or without an indexer, is refused by name from its metadata."""
    from ster_py.gguf.config import spec_from_gguf

    meta = {"general.architecture": "hy_v4", "hy_v4.block_count": 3, "hy_v4.embedding_length": 64,
            "hy_v4.attention.head_count": 4, "hy_v4.attention.indexer.top_k": 8}
    meta = {k: v for k, v in dict(meta, **extra).items() if v is not None}
    with pytest.raises(SterError, match=match):
        spec_from_gguf(meta, "x.gguf", vocab_size=128)
