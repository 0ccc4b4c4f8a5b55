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

DeepSeek-V4 (``deepseek4``, conversion/deepseek.py and src/models/deepseek4.cpp; group DS4, the last block). The
converter maps only the release's names (embed, layers.N.attn.wq_a, attn.kv_norm, hc_head_fn, ...) and requires
every routed expert as MXFP4 (packed e2m1 codes [rows, cols/2] beside E8M0 scales [rows, cols/32]): the tiny
experts are drawn on that grid and packed, so the conversion is lossless and Transformers runs the file's very
numbers. It reads compress_ratios and num_hash_layers from config.json (added: ``ds4_release_keys``). llama.cpp's
loader requires 4 streams, sqrtsoftplus routing and compression ratios 0 / 4 / 128, and its lightning indexer
always applies a Hadamard rotation of at least 64 (index_head_dim 64 here); the case's prompt runs past 128
tokens so the heavy entry closes. The F32 file (experts MXFP4) matches Transformers and, its experts decoded to
F32, llama.cpp's runtime (within 1e-3, top-1 at every position; on the MXFP4 experts themselves llama.cpp's CPU
rounds the activations to Q8_0, ggml_vec_dot_mxfp4_q8_0: measured 2.0 % away, one top-1 flip in 136). llama.cpp's quantizer
does not requantize MXFP4 ("requantizing from type mxfp4 is disabled"): its Q8_0 and Q4_K_M files of a 256-wide
case are made from the decoded copy and give llama.cpp's top-1 at every position of a 32-token prompt but
near-ties (measured: logits 2.4 % and 3.1 % from llama.cpp's; one and two flips, each a near-tie). Where
llama.cpp and Transformers could differ (the clamps, routed and shared, biting at 0.5; the compressors; the hash
routing), they agree on the case.
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

# the dequantized model's sums for a GGUF's prompt (conftest.quantized_tiles_off)
pytestmark = pytest.mark.usefixtures("quantized_tiles_off")
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
        _decisive_routing(model, width, writers=("o_proj.weight", "down_proj.weight"))
    model.save_pretrained(path)
    return model


# ----------------------------------------------------------------------------- DeepSeek-V4 (group DS4)
# llama.cpp's deepseek4 (conversion/deepseek.py, src/models/deepseek4.cpp). Its loader asserts 4 streams and
# sqrtsoftplus routing, and knows only the compression ratios 0 (sliding window only), 4 (compressed sparse, with
# the Lightning Indexer) and 128 (heavily compressed): the case is test_parity_hc's DeepSeek-V4 with those, 4
# streams and a prompt past 128 tokens (the heavy layer's first entry closes at position 127). The converter reads
# only the release's tensor names and its config keys (compress_ratios, num_hash_layers), and every routed expert as
# MXFP4 (packed e2m1 codes beside an E8M0 scale per 32 inputs): the experts are drawn on that grid, so the
# conversion is lossless and Transformers runs the very weights the file holds.
from test_parity_hc import V4, build_v4  # noqa: E402

_V4_RATIO = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
DS4_GGUF = dict(V4, hc_mult=4, max_position_embeddings=256, index_head_dim=64, swiglu_limit=0.5,
                compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128})
DS4_GGUF_CASES = {"deepseek_v4": ("deepseek_v4", DS4_GGUF, {})}
# Every projection in whole Q8_0 blocks and, but attn_output_a and the compressors' ape (rows narrower than 256:
# llama.cpp's Q4_K_M falls back to Q5_0), in whole K-quant blocks; routing decisive (``_decisive_routing``), an
# index_topk keeping every entry of the prompt (the F32 case tests the choice; llama.cpp's 8-bit activations may
# move a near choice)
DS4_QUANT_CASES = {"q-deepseek_v4": ("deepseek_v4", dict(DS4_GGUF, hidden_size=256, q_lora_rank=256, head_dim=32,
                                                         o_lora_rank=256, moe_intermediate_size=256, index_topk=64),
                                     {})}
#: E2M1's values by their 4-bit code (OCP microscaling formats: sign bit, 2 exponent bits, 1 mantissa bit).
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def ds4_release_keys(config: dict) -> dict:
    """The release's config keys conversion/deepseek.py reads, meaning what Transformers' config means: each
    layer's compress_ratios (0 / 4 / 128 by layer kind) and num_hash_layers (the leading hash_moe layers)."""
    mlp = config["mlp_layer_types"]
    hashed = mlp.index("moe")
    assert set(mlp[hashed:]) == {"moe"}
    assert config["compress_rates"] == {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
    return {"compress_ratios": [_V4_RATIO[t] for t in config["layer_types"]], "num_hash_layers": hashed}


def _mxfp4_grid(shape, rng) -> np.ndarray:
    """Random weights [..., cols] exactly representable in MXFP4: e2m1 values times 2^e, e in {-5, -4} per block
    of 32 consecutive inputs (cols a multiple of 32)."""
    *lead, cols = shape
    codes = rng.integers(0, 16, size=(*lead, cols // 32, 32))
    scale = np.exp2(rng.integers(-5, -3, size=(*lead, cols // 32, 1))).astype(np.float32)
    return (E2M1[codes] * scale).reshape(shape)


def mxfp4_pack(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A float matrix [rows, cols] on the MXFP4 grid as the release stores it: codes uint8 [rows, cols/2] (element
    2i in the low nibble, 2i+1 in the high one) and E8M0 biased exponents uint8 [rows, cols/32]. Raises
    AssertionError on a value off the grid."""
    rows, cols = w.shape
    blocks = w.reshape(rows, cols // 32, 32).astype(np.float32)
    exps = np.zeros((rows, cols // 32), np.int64)
    codes = np.zeros(blocks.shape, np.uint8)
    done = np.zeros(exps.shape, bool)
    for e in range(-12, 4):  # each block takes the first exponent whose grid holds it whole
        todo = ~done & (np.abs(blocks).max(-1) <= 6 * 2.0 ** e)
        part = blocks[todo]
        idx = np.abs((part / np.float32(2.0 ** e))[..., None] - E2M1).argmin(-1)
        fits = np.all(E2M1[idx] * np.float32(2.0 ** e) == part, axis=-1)
        idx = np.where(np.signbit(part) & (part != 0), idx | 8, idx & 7)
        where = tuple(i[fits] for i in np.nonzero(todo))
        codes[where], exps[where] = idx[fits], e
        done[where] = True
    if not done.all():
        r, b = np.argwhere(~done)[0]
        raise AssertionError(f"row {r} block {b} is off the MXFP4 grid")
    flat = codes.reshape(rows, cols)
    return (flat[:, 0::2] | (flat[:, 1::2] << 4)).astype(np.uint8), (exps + 127).astype(np.uint8)


def _ds4_release(state: dict) -> dict:
    """Transformers' DeepSeek-V4 state dict in the release's names and layout: no model. prefix, embed / head /
    hc_head_fn, attn.kv_norm, every routed expert MXFP4-packed (weight codes and scale)."""
    out = {}
    for name, t in state.items():
        name = name.removeprefix("model.")
        name = {"embed_tokens.weight": "embed.weight", "lm_head.weight": "head.weight"}.get(name, name)
        name = name.replace("hc_head.hc_", "hc_head_").replace(".attn.norm.", ".attn.kv_norm.")
        if ".ffn.experts." in name:
            packed, scale = mxfp4_pack(t)
            out[name], out[name.removesuffix(".weight") + ".scale"] = packed, scale
        else:
            out[name] = t
    return out


def _positive_index_weights(model, cols: int = 4, strength: float = 3.0):
    """Make every indexer head's weight positive for every token, so that no indexer choice rests on a tie of
    relu's zeros (with weights of either sign the kept entries may score exactly 0, where Transformers, ster and
    llama.cpp each break the tie their own way): the first ``cols`` columns of the residual stream hold a positive
    constant (the embedding's; nothing writes there: those rows of every output projection are zero, and the
    hyper-connections mix streams with positive weights), the norms before attention keep its sign, and the
    indexer's weights_proj reads mostly those columns."""
    emb = model.get_input_embeddings().weight
    emb[:, :cols] = strength * float(emb.std())
    for name, p in model.named_parameters():
        if name.endswith(("o_b_proj.weight", "shared_experts.down_proj.weight")):
            p[:cols] = 0.0
        elif name.endswith("experts.down_proj"):  # stacked [experts, hidden, width]
            p[:, :cols] = 0.0
        elif name.endswith("input_layernorm.weight"):
            p[:cols] = p[:cols].abs()
        elif name.endswith("weights_proj.weight"):
            p.mul_(0.1)
            p[:, :cols] = 1.0


def _decisive_routing(model, width: int = 4,
                      writers: tuple[str, ...] = ("o_b_proj.weight", "shared_experts.down_proj.weight")):
    """A built model made to route decisively, in place: each token's two routing features spread over ``width``
    columns of the residual stream (the matrices named by ``writers`` and the stacked experts write nothing
    there), the routers reading them; every other matrix scaled by 1/4 (a power of two: MXFP4 experts stay on
    their grid)."""
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
        if name.endswith(writers):
            p[:cols] = 0.0
        elif name.endswith("experts.down_proj"):  # stacked [experts, hidden, width]
            p[:, :cols] = 0.0


def build_ds4(path, config, seed: int = 0):
    """``test_parity_hc.build_v4`` with every routed expert redrawn on the MXFP4 grid, then rewritten as the
    release (``_ds4_release``, ``ds4_release_keys``); returns Transformers' model. The quantized case's routing
    is made decisive (``_decisive_routing``: it keeps every entry, no indexer choice), the F32 case's indexer
    (``_positive_index_weights``)."""
    import torch

    from tiny import rewrite_checkpoint

    ref = build_v4(path, config, seed=seed)
    rng = np.random.default_rng(seed + 7)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if ".mlp.experts." in name:
                p.copy_(torch.from_numpy(_mxfp4_grid(tuple(p.shape), rng)))
        (_decisive_routing if path.name in DS4_QUANT_CASES else _positive_index_weights)(ref)
    ref.save_pretrained(path)
    rewrite_checkpoint(path, ds4_release_keys(config), tensors=_ds4_release)
    return ref


@pytest.fixture(scope="module")
def ds4_converted(tmp_path_factory):
    """name -> (converted F32 .gguf, experts MXFP4; transformers model) for the DeepSeek-V4 case."""
    from llamacpp_convert import convert_cases

    return convert_cases(tmp_path_factory.mktemp("llama_cpp_ds4"), {**DS4_GGUF_CASES, **DS4_QUANT_CASES},
                         lambda p, _, c: build_ds4(p, c))


def _rewrite_gguf(src, dst, replace):
    """A copy of the GGUF ``src`` at ``dst`` made by gguf-py: every metadata entry, and every tensor as stored
    (MXFP4 blocks raw) unless ``replace(tensor)`` gives an array to write in its place."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    writer = gguf.GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = f.types[0]
        writer.add_key_value(name, f.contents(), vtype,
                             sub_type=f.types[1] if vtype == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        data = replace(t)
        if data is not None:
            writer.add_tensor(t.name, np.ascontiguousarray(data))
        elif t.tensor_type == gguf.GGMLQuantizationType.MXFP4:
            writer.add_tensor(t.name, np.array(t.data), raw_shape=None, raw_dtype=t.tensor_type)
        else:
            writer.add_tensor(t.name, np.array(t.data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def experts_in_f32(src, dst):
    """A copy of the GGUF ``src`` at ``dst`` with its MXFP4 tensors decoded to F32 by gguf-py (the same numbers:
    llama.cpp then runs every matrix product in float32 rather than against 8-bit activations)."""
    import gguf

    mxfp4 = gguf.GGMLQuantizationType.MXFP4
    return _rewrite_gguf(src, dst, lambda t: gguf.quants.dequantize(np.array(t.data), mxfp4)
                         if t.tensor_type == mxfp4 else None)


#: 136 tokens: the heavily compressed layer's first entry closes at position 127; no indexer choice of the case
#: rests on a near-tie (test_deepseek4_gguf_matches_transformers_and_llamacpp checks).
DS4_PROMPT = [int(t) for t in np.random.default_rng(9).integers(3, 128, 136)]


def test_deepseek4_gguf_matches_transformers_and_llamacpp(ds4_converted, tmp_path):
    """The converter's file (F32, routed experts MXFP4 as it requires): logits within 1e-3 of Transformers over
    136 tokens, whole and through the cache (120 tokens, then one by one past the heavy entry's close); every
    tensor read; the layer kinds, hash layers, streams and clamp of the checkpoint's config; no indexer choice on a
    near-tie. llama.cpp's runtime on the same numbers (the experts decoded to F32, ``experts_in_f32``): logits
    within 1e-3, its top-1 at every position. (On the MXFP4 file itself llama.cpp's CPU multiplies the experts
    against activations rounded to Q8_0 blocks, ggml_vec_dot_mxfp4_q8_0: measured 2.0 % from the exact logits,
    a top-1 flip included; not an F32 comparison.)"""
    from ster_py import llamacpp
    from ster_py.config import spec_from_config
    from ster_py.families import FAMILIES
    from test_parity_hc import _v4_margins

    path, ref_model = ds4_converted["deepseek_v4"]
    types = {n: t.type_name for n, t in GGUFFile(str(path)).tensors.items()}
    assert {types[f"blk.{i}.ffn_{p}_exps.weight"] for i in range(4) for p in ("gate", "up", "down")} == {"MXFP4"}
    assert types["blk.0.ffn_gate_tid2eid.weight"] == "I32"
    model = load_model(str(path))
    assert model.resolved.kind == "gguf" and model.spec.extra["gguf_architecture"] == "deepseek4"
    ref_logits, _ = reference_logits(ref_model, DS4_PROMPT)
    ours = model.decoder.forward(DS4_PROMPT)
    assert rel_err(ours, ref_logits) < 1e-3, rel_err(ours, ref_logits)
    cache = model.decoder.new_cache()
    steps = np.concatenate([model.decoder.forward(DS4_PROMPT[:120], cache)]
                           + [model.decoder.forward([t], cache) for t in DS4_PROMPT[120:]])
    assert rel_err(steps, ref_logits) < 1e-3
    assert model.decoder._weights.unused_tensors(model.spec) == []
    gaps = _v4_margins(model, DS4_PROMPT)
    assert gaps and min(gaps) > 1e-4, "an indexer choice rests on (nearly) equal scores: pick another case"

    source = spec_from_config(dict(DS4_GGUF, model_type="deepseek_v4"), FAMILIES["deepseek_v4"])
    s = model.spec
    assert [(layer.mixer, layer.ffn, layer.compress, layer.moe) for layer in s.layers] == [
        (layer.mixer, layer.ffn, layer.compress, layer.moe) for layer in source.layers]
    from dataclasses import replace
    assert replace(s.streams, eps=1e-6, norm_eps=1e-6) == source.streams  # (the file's epsilons are float32)
    assert s.streams.eps == pytest.approx(1e-6) and s.streams.norm_eps == pytest.approx(1e-6)
    assert s.moe == source.moe
    c, d = s.compressed, source.compressed
    assert replace(c, norm_eps=1e-6, main_rope=None, compress_rope=None) == replace(d, main_rope=None,
                                                                                    compress_rope=None)
    for ours_rope, their_rope in ((c.main_rope, d.main_rope), (c.compress_rope, d.compress_rope)):
        assert np.allclose(ours_rope.inv_freq, their_rope.inv_freq, rtol=1e-6)

    f32 = experts_in_f32(path, tmp_path / "experts-f32.gguf")
    (theirs,) = llamacpp.logits(f32, [DS4_PROMPT])
    theirs = theirs[:, :ours.shape[1]]
    assert rel_err(ours, theirs) < 1e-3, rel_err(ours, theirs)
    assert np.array_equal(ours.argmax(1), theirs.argmax(1))


@pytest.fixture(scope="module")
def ds4_experts_f32(ds4_converted, tmp_path_factory):
    """The wide case's file with its MXFP4 experts decoded to F32 (``experts_in_f32``): what llama.cpp's quantizer
    takes (it does not requantize MXFP4), shared by the Q8_0 and Q4_K_M cases."""
    path, _ = ds4_converted["q-deepseek_v4"]
    return experts_in_f32(path, tmp_path_factory.mktemp("ds4_f32") / "f32.gguf")


def test_deepseek4_q8_0_gives_llamacpps_top1(ds4_converted, ds4_experts_f32, tmp_path):
    """llama.cpp's Q8_0 of the wide case (its quantizer does not requantize MXFP4: the experts decoded to F32
    first, then quantized to Q8_0 like every projection), run by ster (projections and experts kept in their
    blocks) and by llama.cpp: logits within 5 %, llama.cpp's top-1 token at every position of the first 32 tokens and
    of the whole 136-token prompt but near-ties, token-by-token decoding equal to the whole prompt."""
    from ster_py import llamacpp
    from ster_py.decoder.qlinear import QuantLinear

    path, ref_model = ds4_converted["q-deepseek_v4"]
    assert rel_err(load_model(str(path)).decoder.forward(DS4_PROMPT[:40]),
                   reference_logits(ref_model, DS4_PROMPT[:40])[0]) < 1e-3  # the wide case's F32 file
    q = llamacpp.quantize(ds4_experts_f32, tmp_path / "q8_0.gguf", "Q8_0")
    types = {n: t.type_name for n, t in GGUFFile(str(q)).tensors.items()}
    assert types["blk.1.ffn_up_exps.weight"] == types["blk.1.attn_q_b.weight"] == "Q8_0"
    model = load_model(str(q))
    assert type(model.decoder.layers[1].mixer.q_b) is QuantLinear
    ours = model.decoder.forward(DS4_PROMPT)
    (ref,) = llamacpp.logits(q, [DS4_PROMPT])
    ref = ref[:, :ours.shape[1]]
    check_llamacpp_top1(ours[:32], ref[:32])  # a 32-token prompt's logits (causal: the same rows)
    # the whole prompt, past the heavy entry: every disagreement a near-tie, at most 3 per 32 positions (measured:
    # 2.2 % from llama.cpp's logits, its 8-bit activations' rounding; 4 flips of 136, one in the first 32, each
    # llama.cpp's own top two closer than a quarter of the rule's bound)
    check_llamacpp_top1(ours, ref, flips=3 * len(ours) // 32)
    check_token_steps(model, DS4_PROMPT, ours)


def test_deepseek4_q4_k_m_gives_llamacpps_top1(ds4_converted, ds4_experts_f32, tmp_path):
    """llama.cpp's Q4_K_M of the wide case (made from the same F32-experts copy as the Q8_0 case), run by ster
    (projections and experts kept in their blocks) and by llama.cpp: logits within 5 %, llama.cpp's top-1 token at
    every position of a 32-token prompt but near-ties, token-by-token decoding equal to the whole prompt (measured:
    3.1 % from llama.cpp's logits; 2 flips of 32, llama.cpp's own top two closer than a tenth of the rule's
    bound). Every routed expert, projection and indexer matrix in K-quant blocks (the case is 256 wide)."""
    from ster_py import llamacpp
    from ster_py.decoder.qlinear import QuantLinear

    q = llamacpp.quantize(ds4_experts_f32, tmp_path / "q4_k_m.gguf", "Q4_K_M")
    types = {n: t.type_name for n, t in GGUFFile(str(q)).tensors.items()}
    k_quants = {"Q4_K", "Q5_K", "Q6_K"}  # (Q4_K_M keeps some matrices at Q6_K)
    assert {types[f"blk.{i}.ffn_{p}_exps.weight"] for i in range(4) for p in ("gate", "up", "down")} <= k_quants
    assert "Q4_K" in {types["blk.1.ffn_up_exps.weight"], types["blk.1.ffn_gate_exps.weight"]}
    assert {types["blk.1.attn_q_b.weight"], types["blk.1.attn_kv.weight"], types["blk.1.attn_output_b.weight"],
            types["blk.1.indexer.proj.weight"]} <= k_quants
    model = load_model(str(q))
    mixer = model.decoder.layers[1].mixer
    assert type(mixer.q_b) is QuantLinear and mixer.q_b.weight.type_name == types["blk.1.attn_q_b.weight"]
    prompt = DS4_PROMPT[:32]
    ours = model.decoder.forward(prompt)
    (ref,) = llamacpp.logits(q, [prompt])
    ref = ref[:, :ours.shape[1]]
    check_llamacpp_top1(ours, ref)
    check_token_steps(model, prompt, ours)


def test_deepseek4_clamp_bites(ds4_converted):
    """The F32 case's clamp (swiglu_limit 0.5, every expert) changes its logits: the match above tests
    llama.cpp's clamps, routed and shared."""
    from dataclasses import replace

    from ster_py.decoder.model import Decoder

    path, _ = ds4_converted["deepseek_v4"]
    model = load_model(str(path))
    spec = model.spec
    assert spec.moe.limit == 0.5 and spec.moe.shared_limit == 0.5
    free = replace(spec, moe=replace(spec.moe, limit=None, shared_limit=None), layers=tuple(
        replace(layer, moe=replace(layer.moe, limit=None, shared_limit=None)) if layer.moe is not None else layer
        for layer in spec.layers))
    ours = model.decoder.forward(DS4_PROMPT[:40])
    assert rel_err(Decoder(free, model.decoder._weights).forward(DS4_PROMPT[:40]), ours) > 1e-3


@pytest.mark.parametrize("extra, match", [
    ({"deepseek4.attention.compress_ratios": [0, 4, 64, 4]}, "ratios of 0, 4 or 128"),
    ({"deepseek4.attention.compress_ratios": [0, 4]}, "ratios of 0, 4 or 128"),
    ({"deepseek4.expert_gating_func": 2}, "sqrtsoftplus"),
    ({"deepseek4.rope.scaling.type": "yarn"}, "rope scaling"),
    ({"deepseek4.swiglu_clamp_shexp": [0.5, 0.5, 7.0, 0.5]}, "clamps that differ"),
    ({"deepseek4.expert_shared_count": 2}, "expert_shared_count"),
    ({"deepseek4.expert_weights_norm": False}, "expert_weights_norm"),
    ({"deepseek4.nextn_predict_layers": 1}, "multi-token-prediction"),
    ({"deepseek4.hash_layer_count": 5}, "hash_layer_count is 5, more than the block count \\(4\\)"),  # s9-left
    ({"deepseek4.hyper_connection.count": 3}, None)])
def test_deepseek4_gguf_metadata_checks(extra, match, ds4_converted):
    """What llama.cpp's deepseek4 loader refuses, or ster has not checked against its graph, is refused by name
    from the metadata alone; the rest reads as the config it states (3 streams: the family's own reading, which
    llama.cpp's graph would stop on, GGML_ASSERT(hc == 4))."""
    from ster_py.gguf.config import spec_from_gguf

    path, _ = ds4_converted["deepseek_v4"]
    f = GGUFFile(str(path))
    meta, tensors = {**f.metadata, **extra}, {n: t.shape for n, t in f.tensors.items()}
    if match is None:
        assert spec_from_gguf(meta, "x.gguf", tensors=tensors).streams.n == 3
        return
    with pytest.raises(SterError, match=match):
        spec_from_gguf(meta, "x.gguf", tensors=tensors)


def test_i32_integer_tables():
    """I32 tensors read as exact float32 integer tables (the hash routing's expert ids); values float32 cannot
    hold exactly, or a byte count off the shape, are refused."""
    from ster_py.gguf import quants

    table = np.array([[3, 0], [7, 2], [-1, 1 << 24]], np.int32)
    got = quants.integer_table(table.view(np.uint8).reshape(-1), "I32", (3, 2))
    assert got.dtype == np.float32 and np.array_equal(got, table)
    with pytest.raises(SterError, match="2\\*\\*24"):
        quants.integer_table(np.array([1 << 25], np.int32).view(np.uint8), "I32", (1,))
    with pytest.raises(SterError, match="needs 24 bytes"):
        quants.integer_table(table.view(np.uint8).reshape(-1)[:20], "I32", (3, 2))
    with pytest.raises(SterError, match="not an integer table"):
        quants.integer_table(np.zeros(4, np.uint8), "F32", (1,))


def test_deepseek4_gguf_is_not_requantized(tmp_path):
    """ster convert refuses a deepseek4 GGUF source (it would rewrite the I32 table and MXFP4 experts by dense
    rules), from its metadata alone: the file holds no tensor; nothing is written."""
    from ster_py.convert import convert_model
    from ster_py.gguf.writer import Typed, write_gguf

    src = write_gguf(tmp_path / "src.gguf", {"general.architecture": "deepseek4",
                                             "deepseek4.block_count": Typed("uint32", 2)}, [])
    with pytest.raises(SterError, match="does not write GGUF architecture 'deepseek4' yet: .*compressed attention"):
        convert_model(str(src), tmp_path / "x.gguf", "q8_0")
    assert not (tmp_path / "x.gguf").exists()


def test_deepseek4_gguf_dir(ds4_converted, tmp_path):
    """The release's config.json and tokenizer beside the .gguf (a GGUF directory): the config decides the model,
    the file holds the weights under llama.cpp's names; the same logits as the file alone, every tensor read."""
    import shutil

    path, _ = ds4_converted["deepseek_v4"]
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(path.parent / "hf" / "deepseek_v4" / f, tmp_path / f)
    (tmp_path / "model.gguf").symlink_to(path)
    model = load_model(str(tmp_path))
    assert model.resolved.kind == "gguf_dir"
    ids = DS4_PROMPT[:40]
    assert rel_err(model.decoder.forward(ids), load_model(str(path)).decoder.forward(ids)) < 1e-6
    assert model.decoder._weights.unused_tensors(model.spec) == []


# Issue 17/23 (breaker3): a hash routing table that is not whole expert ids (an F32 table holding NaN or 0.5), or ids
# outside the expert count, is refused by name at load, not an IndexError or a silent truncation.

def _with_tid2eid(src, dst, table):
    return _rewrite_gguf(src, dst, lambda t: table(np.array(t.data)) if t.name == "blk.0.ffn_gate_tid2eid.weight"
                         else None)


def _nan_first(t):
    t = t.astype(np.float32)
    t[0, 0] = np.nan
    return t


# s9-left: a table in any type but I32 is refused as llama.cpp's graph would (ggml_get_rows takes and gives I32
# ids; an F32 table's rows would reach its I32-only id checks), whole numbers or not.
@pytest.mark.parametrize("table, match", [
    (_nan_first, "is stored as F32; this table holds expert ids"),
    (lambda t: np.full(t.shape, 0.5, np.float32), "is stored as F32; this table holds expert ids"),
    (lambda t: t.astype(np.float32), "is stored as F32; this table holds expert ids"),  # whole numbers: still F32
    (lambda t: np.full(t.shape, 8, np.int32), "layer 0's hash routing table holds expert ids 8..8, outside 0..7"),
    (lambda t: np.full(t.shape, -1, np.int32), "layer 0's hash routing table holds expert ids -1..-1, outside 0..7"),
    (lambda t: t, None)])   # the converter's own I32 table, rewritten: loads
def test_deepseek4_hash_table_values_are_checked(table, match, ds4_converted, tmp_path):
    path, _ = ds4_converted["deepseek_v4"]
    bad = _with_tid2eid(path, tmp_path / "t.gguf", table)
    if match is None:
        assert GGUFFile(str(bad)).tensors["blk.0.ffn_gate_tid2eid.weight"].type_name == "I32"
        assert load_model(str(bad)).decoder.forward(DS4_PROMPT[:4]).shape[0] == 4
        return
    with pytest.raises(SterError, match=match):
        load_model(str(bad)).decoder.forward(DS4_PROMPT[:4])
