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

GLM-5-Next (``glm5-next``, conversion/glm.py and src/models/glm5-next.cpp; group GDS, the block at the end). The
converter reads release-only config keys (``linear_attn_config``, ``mla_use_nope``, ``first_k_dense_replace``) that
Transformers 5.24's config does not write; each case's config.json gets them with the values that mean what its
Transformers config means (``g5_release_keys``); the tensor names are Transformers' own. llama.cpp's loader asserts
4 streams and as many delta-rule heads as attention heads, so the case has those. The F32 file is checked against
Transformers' GLM-5-Next and against llama.cpp's runtime (logits within 1e-3, top-1 at every position), with its
clamps biting.
Where llama.cpp and Transformers differ, the file is read as llama.cpp runs it: the latent bottleneck norms take
the model's RMS epsilon (Transformers: 1e-6), every gated feed-forward is clamped by ``ggml_swiglu_clamp`` under
``swiglu_clamp_shexp`` (the dense layers' too, as Transformers clamps them by swiglu_limit); on the cases the two
agree within 2e-6. llama.cpp's Q8_0 and Q4_K_M of a 256-wide case give llama.cpp's top-1 at every position of a
32-token prompt (measured: logits 2.6 % and 3.9 % from llama.cpp's, its 8-bit activations' rounding; with
test_parity_mla._decisive's outlying routing features, Q4_K_M's was 5.3 %). A layer whose indexer is shared
after a delta-rule layer reuses the last full layer's choice in llama.cpp, where Transformers 5.24 stops ("Shared
DSA layers require top-k indices from a previous full indexer layer"): no case has one.

Not here: DeepSeek-V4 (``deepseek4``, conversion/deepseek.py), which the pinned converter writes too; ster refuses
its files by architecture until they are checked. Found so far (from the converter and deepseek4.cpp, not run): the
converter maps only the release's names (embed, layers.N.attn.wq_a, ffn.experts.E.w1, hc_attn_fn, hc_head_fn) and
requires every routed expert as MXFP4 (w1/w2/w3 packed uint8 [rows, cols/2] beside an E8M0 ``.scale`` [rows,
cols/32]), so a tiny checkpoint needs its experts drawn on the MXFP4 grid and packed; it reads compress_ratios,
compress_rope_theta, num_hash_layers, hc_eps, swiglu_limit, n_shared_experts and scoring_func (sqrtsoftplus, which
the loader requires) from config.json; the hash layers' tid2eid is written as I32; llama.cpp's graph asserts 4
streams and knows only compression ratios 4 (with the indexer) and 128, so a case needs a prompt past 128 tokens
for a heavily compressed entry to close.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from ster_py.errors import SterError
from ster_py.gguf.reader import GGUFFile
from ster_py.load import load_model
from test_parity_dense import PROMPT
from test_parity_hc import CASES as HC_CASES
from test_parity_hc import _RELEASE, G5_TEXT, G5_VISION, _pool_margins
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


# ----------------------------------------------------------------------------- GLM-5-Next (group GDS)
# llama.cpp's glm5-next (conversion/glm.py, src/models/glm5-next.cpp). Its loader asserts 4 streams and as many
# delta-rule heads as attention heads, and runs the dense layers first (leading_dense_block_count): the case is
# test_parity_hc's GLM-5-Next with those and a clamp that bites (dense, shared and routed feed-forwards). The
# converter reads release-only config keys Transformers 5.24's config does not write (g5_release_keys).
G5_GGUF_TEXT = dict(G5_TEXT, hc_mult=4, linear_num_heads=4, swiglu_limit=0.5)
# 256 wide (every projection in Q8_0 / Q4_K blocks but the delta rule's low-rank gates), routing decisive
# (_decisive_spread); an index_topk of 32 keeps every pool of the 32-token prompt (the F32 case tests the
# choice: a random indexer's pool scores lie within a few percent somewhere, where llama.cpp's 8-bit activations may
# choose another pool than ster)
G5_QUANT_TEXT = dict(G5_TEXT, hidden_size=256, intermediate_size=256, num_hidden_layers=3, kv_lora_rank=256,
                     q_lora_rank=256, qk_nope_head_dim=64, v_head_dim=64, moe_intermediate_size=256, index_head_dim=64,
                     index_topk=32,
                     linear_num_heads=4, linear_head_dim=64, linear_conv_kernel_dim=4, hc_mult=4,
                     layer_types=["linear_attention", "indexed_attention", "linear_attention"],
                     mlp_layer_types=["dense", "sparse", "sparse"])


def g5_release_keys(text: dict) -> dict:
    """The release's config keys conversion/glm.py reads, meaning what Transformers' ``text`` config means:
    linear_attn_config (the delta rule's heads, width, taps and gate bound), mla_use_nope (no rotated part), and
    first_k_dense_replace (the leading dense layers of mlp_layer_types, which must all come first)."""
    kinds = text["mlp_layer_types"]
    lead = kinds.index("sparse")
    assert set(kinds[lead:]) == {"sparse"} and text["qk_rope_head_dim"] == 0
    return {"linear_attn_config": {"num_heads": text["linear_num_heads"], "head_dim": text["linear_head_dim"],
                                   "short_conv_kernel_size": text["linear_conv_kernel_dim"],
                                   "gate_lower_bound": text.get("linear_lower_bound", -5.0), "safe_gate": True},
            "mla_use_nope": True, "first_k_dense_replace": lead}


G5_GGUF_CASES = {  # name: (model_type, config, release config.json keys)
    "glm5_next": ("glm5_next", dict(text_config=G5_GGUF_TEXT, vision_config=G5_VISION), g5_release_keys(G5_GGUF_TEXT)),
}
G5_QUANT_CASES = {
    "q-glm5_next": ("glm5_next", dict(text_config=G5_QUANT_TEXT, vision_config=G5_VISION),
                    g5_release_keys(G5_QUANT_TEXT)),
}


@pytest.fixture(scope="module")
def g5_converted(tmp_path_factory):
    """name -> (converted F32 .gguf, transformers model) for G5_GGUF_CASES and G5_QUANT_CASES (one converter run)."""
    from llamacpp_convert import convert_cases

    def make(path, model_type, config):
        return (_decisive_spread if path.name in G5_QUANT_CASES else build)(path, model_type, config)

    return convert_cases(tmp_path_factory.mktemp("llama_cpp_g5"), {**G5_GGUF_CASES, **G5_QUANT_CASES}, make)


def test_glm5_next_gguf_matches_transformers_and_llamacpp(g5_converted):
    """The F32 file: logits within 1e-3 of Transformers' GLM-5-Next, whole, in two pieces and token by token;
    every tensor read; the checkpoint's layer kinds, pools, streams and clamps; llama.cpp's own logits within 1e-3
    with its top-1 at every position; no pool choice resting on a near-tie."""
    from ster_py import llamacpp
    from ster_py.config import spec_from_config
    from ster_py.families import FAMILIES

    path, ref_model = g5_converted["glm5_next"]
    model = load_model(str(path))
    assert model.resolved.kind == "gguf" and model.spec.extra["gguf_architecture"] == "glm5-next"
    ref_logits, _ = reference_logits(ref_model, PROMPT)
    ours = model.decoder.forward(PROMPT)
    assert rel_err(ours, ref_logits) < 1e-3, rel_err(ours, ref_logits)
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:9], cache), model.decoder.forward(PROMPT[9:], cache)])
    assert rel_err(pieces, reference_split_logits(ref_model, PROMPT, 9)) < 1e-3
    cache = model.decoder.new_cache()
    steps = np.concatenate([model.decoder.forward([t], cache) for t in PROMPT])
    assert rel_err(steps, ref_logits) < 1e-3
    assert model.decoder._weights.unused_tensors(model.spec) == []
    gaps = _pool_margins(model, PROMPT)
    assert gaps and min(gaps) > 1e-4, "a pool choice rests on (nearly) equal scores: pick another case"

    source = spec_from_config(dict(G5_GGUF_TEXT, model_type="glm5_next_text"), FAMILIES["glm5_next_text"])
    assert [(layer.mixer, layer.ffn, layer.indexer) for layer in model.spec.layers] == [
        (layer.mixer, layer.ffn, layer.indexer) for layer in source.layers]
    s, t = model.spec, source
    assert (s.streams.n, s.streams.sinkhorn_iters, s.streams.head, s.streams.eps) == (
        t.streams.n, t.streams.sinkhorn_iters, t.streams.head, pytest.approx(t.streams.eps))
    assert (s.indexer.kpool, s.indexer.tail, s.indexer.topk) == (t.indexer.kpool, t.indexer.tail, t.indexer.topk)
    assert s.delta.safe_gate and s.delta.lower_bound == t.delta.lower_bound and s.delta.l2_eps == t.delta.l2_eps
    routed = [layer.moe for layer in s.layers if layer.ffn == "moe"]
    assert s.ffn_limit == pytest.approx(0.5) and all(
        m.limit == pytest.approx(0.5) and m.shared_limit == pytest.approx(0.5) and not m.clamp_act for m in routed)

    (theirs,) = llamacpp.logits(path, [PROMPT])
    theirs = theirs[:, :ours.shape[1]]
    assert rel_err(ours, theirs) < 1e-3, rel_err(ours, theirs)
    assert np.array_equal(ours.argmax(1), theirs.argmax(1))


def test_glm5_next_gguf_clamps_bite(g5_converted):
    """The case's clamps change its logits, the dense layer's and the experts' (else the case would not test
    llama.cpp's clamps)."""
    from dataclasses import replace

    from ster_py.decoder.model import Decoder

    path, _ = g5_converted["glm5_next"]
    model = load_model(str(path))
    ours = model.decoder.forward(PROMPT)
    spec = model.spec
    dense_free = replace(spec, ffn_limit=None)
    routed_free = replace(spec, layers=tuple(
        replace(layer, moe=replace(layer.moe, limit=None, shared_limit=None)) if layer.ffn == "moe" else layer
        for layer in spec.layers))
    for other in (dense_free, routed_free):
        assert rel_err(Decoder(other, model.decoder._weights).forward(PROMPT), ours) > 1e-3


@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_K_M"])
def test_glm5_next_quantized_gives_llamacpps_top1(ftype, g5_converted, tmp_path):
    """llama.cpp's Q8_0 / Q4_K_M of the wide file, run by ster (projections and experts kept in their blocks) and by
    llama.cpp: logits within 5 %, llama.cpp's top-1 token at every position of a 32-token prompt but near-ties,
    token-by-token decoding equal to the whole prompt."""
    from ster_py import llamacpp
    from ster_py.decoder.qlinear import QuantLinear

    path, _ = g5_converted["q-glm5_next"]
    q = llamacpp.quantize(path, tmp_path / f"glm5_next-{ftype}.gguf", ftype)
    model = load_model(str(q))
    mixer = model.decoder.layers[1].mixer  # (llama.cpp's quantizer keeps attn_kv_a_mqa and the indexer in F32)
    assert type(mixer.o) is QuantLinear and type(mixer.q_b) is QuantLinear
    types = {n: t.type_name for n, t in GGUFFile(str(q)).tensors.items()}
    assert types["blk.1.ffn_up_exps.weight"] in ({"Q8_0"} if ftype == "Q8_0" else {"Q4_K", "Q5_K", "Q6_K"})
    ours = model.decoder.forward(LONG_PROMPT)
    (ref,) = llamacpp.logits(q, [LONG_PROMPT])
    ref = ref[:, :ours.shape[1]]
    check_llamacpp_top1(ours, ref)
    check_token_steps(model, LONG_PROMPT, ours)


@pytest.mark.parametrize("extra, match", [
    ({"glm5-next.attention.indexer.kpool_select_tail": False}, "kpool_select_tail false"),
    ({"glm5-next.attention.indexer.kpool": 3}, "must be at least 2 and divide"),
    ({"glm5-next.rope.dimension_count": 8}, "rope.dimension_count must be 0"),
    ({"glm5-next.swiglu_clamp_shexp": [0.5, 0.0, 0.5, 0.5]}, None)])
def test_glm5_next_gguf_metadata_checks(extra, match, g5_converted):
    """A glm5-next file without the tail pool, with pools that do not divide top_k, or with a rotated part is
    refused by name from its metadata; dense layers' clamps come from swiglu_clamp_shexp (layer 0's here)."""
    from ster_py.gguf.config import spec_from_gguf

    path, _ = g5_converted["glm5_next"]
    f = GGUFFile(str(path))
    meta, tensors = {**f.metadata, **extra}, {n: t.shape for n, t in f.tensors.items()}
    if match is None:
        assert spec_from_gguf(meta, "x.gguf", tensors=tensors).ffn_limit == 0.5
        meta["glm5-next.swiglu_clamp_shexp"] = [0.0, 0.5, 0.5, 0.5]
        assert spec_from_gguf(meta, "x.gguf", tensors=tensors).ffn_limit is None
        return
    with pytest.raises(SterError, match=match):
        spec_from_gguf(meta, "x.gguf", tensors=tensors)


def _decisive_spread(path, model_type, config, width: int = 4):
    """``test_parity_mla._decisive`` with each routing feature spread over ``width`` columns of the residual
    stream at 1 / width of its strength (the routers read their sum, so the margins are the same): no
    activation holds an outlier, which would coarsen llama.cpp's 8-bit quantization of every activation in its
    block (Q8_K's blocks are 256 wide: a whole row here) and move its logits several percent from ster's."""
    import torch

    model = build(path, model_type, config)
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name, p in params.items():
            if p.ndim > 1 and "norm" not in name:
                p.mul_(0.25)
        routers = [p for name, p in params.items() if name.endswith("mlp.gate.weight") and p.ndim == 2]
        n = routers[0].shape[0]
        cols = n * width
        emb = model.get_input_embeddings().weight
        sigma = float(emb.std())
        emb[:, :cols] = 0.0
        for t in range(emb.shape[0]):
            for e, strength in ((t % n, 12), ((3 * t + 1) % n, 8)):
                emb[t, e * width:(e + 1) * width] += strength / width * sigma
        for p in routers:
            p.mul_(0.02)
            for e in range(n):
                p[e, e * width:(e + 1) * width] += 2.0
        for name, p in params.items():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p[:cols] = 0.0
            elif name.endswith("experts.down_proj"):  # stacked [experts, hidden, width]
                p[:, :cols] = 0.0
    model.save_pretrained(path)
    return model
