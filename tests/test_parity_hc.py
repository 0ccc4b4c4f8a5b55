"""Hyper-connection families (issue 14's remainder, group HC) against transformers on tiny checkpoints.

HY V4 (independent hyper-connections over latent attention with DeepSeek Sparse Attention, a sink per
head, an elementwise output gate, clamped routed experts). Each checkpoint is made here with transformers
(``tiny.build_checkpoint``: every weight redrawn, hyper-connection parameters included) and checked as
``test_parity_mla_b`` checks the latent descendants: logits within 1e-4 of transformers (f32), the same
through the cache in two pieces and token by token (absorbed attention), the same 16 greedy tokens, no
stored tensor left unread, no indexer choice resting on a tie. The residual is several streams: ``--layer``
captures their mean (checked against the mean of transformers' hidden streams) and a steering vector is
added to every stream (checked against transformers with a forward hook doing so).

Where seed 002 and Transformers 5.24 disagree, Transformers is the oracle: HY V4's latent attention and its
indexer rotate halves (``rotate_half``), not the adjacent pairs the seed reads from vLLM.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from ster_py.config import spec_from_config
from ster_py.errors import SterError
from ster_py.families import FAMILIES, gate
from ster_py.generate import Sampling, generate
from ster_py.load import load_model
from test_parity_dense import PROMPT
from test_parity_mla import EXPERTS, MLA
from test_parity_mla_b import DSA, _indexer_margins, _steps_and_absorbed
from tiny import build_checkpoint as build
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)
from tiny import reference_greedy, reference_logits, reference_split_logits, rel_err

# HY V4: 3 streams; 16 tokens past an index_topk of 5; layer 0 dense, the others routed (HYV4Config's default
# kinds: indexers of their own on layers 0 and 1, layer 2 shared).
HY = dict(MLA, **EXPERTS, **DSA, hc_mult=3, n_shared_experts=1, routed_scaling_factor=2.0)
CASES = {
    "hy_v4": ("hy_v4", HY),
    # ... 4 layers, 2 streams, another magnitude and epsilon, grouped routing, two shared experts, weights
    # neither renormalised nor scaled by 1, a clamp that bites, explicit layer kinds (dense in the middle).
    "hy_v4-groups-clamp": ("hy_v4", dict(HY, num_hidden_layers=4, hc_mult=2, hc_magnitude=1.5, hc_eps=1e-3,
                                         n_group=2, topk_group=1, n_shared_experts=2, norm_topk_prob=False,
                                         routed_scaling_factor=1.5, swiglu_limit=0.3,
                                         mlp_layer_types=["sparse", "dense", "sparse", "sparse"],
                                         indexer_types=["full", "shared", "full", "shared"])),
}
#: The seed of a case's weights where the first one puts two index scores in a tie (relu's zeros).
SEEDS = {"hy_v4-groups-clamp": 1}


@pytest.fixture(scope="module")
def hy(tmp_path_factory):
    """The first HY V4 case: (path, transformers' model, ster's model), shared by the module's tests."""
    path = tmp_path_factory.mktemp("hy_v4")
    model_type, config = CASES["hy_v4"]
    ref = build(path, model_type, config)
    return path, ref, load_model(str(path))


def _stream_means(ref_hidden: list[np.ndarray]) -> list[np.ndarray]:
    """Transformers' hidden states [T, n, d] (the streams) as their mean [T, d]; [T, d] entries as they are."""
    return [h.mean(axis=-2) if h.ndim == 3 else h for h in ref_hidden]


def _check_streams(path, ref_model):
    """Logits, captured stream means, the cache in two pieces, 16 greedy tokens, every tensor read."""
    ref_logits, ref_hidden = reference_logits(ref_model, PROMPT)
    model = load_model(str(path))
    hidden: list = []
    err = rel_err(model.decoder.forward(PROMPT, hidden_states=hidden), ref_logits)
    assert err < 1e-4, f"logits rel err {err:.2e}"
    n = model.spec.num_hidden_layers
    means = _stream_means(ref_hidden)
    assert ref_hidden[1].ndim == 3 and ref_hidden[1].shape[1] == model.spec.streams.n  # the oracle keeps streams
    assert len(hidden) == n + 1
    for i in range(n):  # transformers' last entry is after the head's collapse and the final norm
        assert rel_err(hidden[i], means[i]) < 1e-4, f"stream mean after layer {i - 1}"
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:9], cache), model.decoder.forward(PROMPT[9:], cache)])
    assert rel_err(pieces, reference_split_logits(ref_model, PROMPT, 9)) < 1e-4
    assert generate(model.decoder, PROMPT, Sampling(max_new_tokens=16)).ids == reference_greedy(ref_model, PROMPT, 16)
    assert model.decoder._weights.unused_tensors(model.spec) == []
    return model


@pytest.mark.parametrize("case", list(CASES))
def test_family_matches_transformers(case, tmp_path, hy):
    if case == "hy_v4":
        path, ref_model, _ = hy
    else:
        path = tmp_path
        model_type, config = CASES[case]
        ref_model = build(path, model_type, config, seed=SEEDS.get(case, 0))
    model = _check_streams(path, ref_model)
    gaps = _indexer_margins(model, PROMPT)
    assert gaps and min(gaps) > 1e-4, "a top-k choice rests on (nearly) equal scores: pick another case"
    _steps_and_absorbed(model, ref_model)


def test_hy_v4_clamp_bites(tmp_path):
    """The clamped case's routed experts do meet their swiglu_limit (else the case would not test it)."""
    spec = spec_from_config(dict(CASES["hy_v4-groups-clamp"][1], model_type="hy_v4"), FAMILIES["hy_v4"])
    assert spec.moe.limit == 0.3 and spec.moe.shared_limit is None
    assert spec.streams.n == 2 and spec.streams.magnitude == 1.5 and spec.streams.post_eps == 1e-3
    assert [layer.ffn for layer in spec.layers] == ["moe", "dense", "moe", "moe"]


def test_steering_adds_to_every_stream(hy):
    """A steering vector at layer 1 is added to every stream: the logits equal transformers' with a forward hook
    adding it to each of layer 1's output streams, and the captured mean moves by exactly the vector."""
    import torch

    _, ref_model, model = hy
    v = np.random.RandomState(3).randn(model.spec.hidden_size).astype(np.float32) * 0.5

    def add(module, args, output):
        return (output[0] + torch.from_numpy(v),) + tuple(output[1:])

    handle = ref_model.model.layers[1].register_forward_hook(add)
    try:
        ref, _ = reference_logits(ref_model, PROMPT)
    finally:
        handle.remove()
    plain, steered = [], []
    model.decoder.forward(PROMPT, hidden_states=plain)
    ours = model.decoder.forward(PROMPT, hidden_states=steered,
                                 layer_hook=lambda i, h: h + v if i == 1 else h)
    err = rel_err(ours, ref)
    assert err < 1e-4, f"steered logits rel err {err:.2e}"
    assert np.abs(steered[2] - plain[2] - v).max() < 1e-5
    unsteered, _ = reference_logits(ref_model, PROMPT)
    assert rel_err(ours, unsteered) > 1e-2  # the vector changes the output


def test_parity_compares_stream_means(hy):
    """``ster parity``'s layer-by-layer comparison reads transformers' streams as their mean."""
    from ster_py.parity import compare

    _, ref_model, model = hy

    def reference(ids):
        return reference_logits(ref_model, ids)

    result = compare(model, "x", PROMPT, reference, 1e-4)
    assert result.passed and result.first_divergent_layer is None
    # every layer but the last, whose reference entry is after the head's collapse and the final norm
    assert [e.layer for e in result.layers] == list(range(model.spec.num_hidden_layers - 1))


# The release's tensor names and Transformers' module names, each read as the writer's (seed 002).
_RELEASE = ((".hc_pre.hc_attn_layer.hc_", ".hc_attn_layer.hc_pre.hc_"), (".hc_pre.hc_mlp_layer.hc_",
            ".hc_mlp_layer.hc_pre.hc_"), ("model.hc_pre.hc_head.", "model.hc_head."))
_MODULES = ((".hc_pre.hc_attn_layer.hc_", ".attn_hc."), (".hc_pre.hc_mlp_layer.hc_", ".ffn_hc."),
            ("model.hc_pre.hc_head.hc_head_", "model.hc_head.hc_"), (".learnable_sink_param", ".sinks"),
            (".linear_gate.", ".gate_proj."))


@pytest.mark.parametrize("renames", [_RELEASE, _MODULES], ids=["release", "modules"])
def test_hy_v4_tensor_spellings(renames, hy, tmp_path):
    from safetensors.numpy import load_file, save_file

    path, _, model = hy
    tensors = load_file(str(path / "model.safetensors"))
    renamed = {}
    for name, t in tensors.items():
        for old, new in renames:
            name = name.replace(old, new)
        renamed[name] = t
    assert renamed.keys() != tensors.keys()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if (path / f).exists():
            (tmp_path / f).write_text((path / f).read_text())
    save_file(renamed, str(tmp_path / "model.safetensors"))
    other = load_model(str(tmp_path))
    assert np.array_equal(other.decoder.forward(PROMPT), model.decoder.forward(PROMPT))
    assert other.decoder._weights.unused_tensors(other.spec) == []


def test_hy_v4_config_defaults():
    """A config leaving out the hyper-connection, indexer and layer-kind keys reads as HYV4Config's defaults."""
    from transformers.models.hy_v4.configuration_hy_v4 import HYV4Config

    small = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
                 max_position_embeddings=64, model_type="hy_v4")
    spec = spec_from_config(small, FAMILIES["hy_v4"])
    ref = HYV4Config(**{k: v for k, v in small.items() if k != "model_type"})
    s = spec.streams
    assert (s.n, s.magnitude, s.eps, s.post_eps, s.sinkhorn_iters, s.head) == (
        ref.hc_mult, ref.hc_magnitude, ref.hc_eps, ref.hc_eps, 0, "weighted")
    assert s.norm_eps == ref.rms_norm_eps
    assert [layer.indexer for layer in spec.layers] == ref.indexer_types
    assert [layer.ffn for layer in spec.layers] == ["dense" if t == "dense" else "moe" for t in ref.mlp_layer_types]
    assert spec.moe.limit == ref.swiglu_limit and spec.moe.router.scale == ref.routed_scaling_factor
    assert spec.moe.shared_size == ref.moe_intermediate_size * ref.n_shared_experts
    assert (spec.indexer.n_heads, spec.indexer.topk, spec.indexer.rope_last) == (ref.index_n_heads, ref.index_topk,
                                                                                  True)
    assert spec.sinks and spec.attn_gate == "sigmoid" and not spec.attn_gate_per_head
    assert not spec.layers[0].rope.interleaved  # Transformers rotates halves (the seed reads vLLM's pairs)


HY_REFUSED = {
    "no-ihc": (dict(enable_ihc=False), "enable_ihc: false"),
    "no-gate": (dict(gated_mla=False), "gated_mla: false"),
    "no-sink": (dict(learnable_sink=False), "learnable_sink: false"),
    "headwise-gate": (dict(gating_type="headwise"), "gating_type other than elementwise"),
    "capping": (dict(soft_logits_capping=True, soft_logits_capping_logits=30.0), "soft_logits_capping"),
    "limit-zero": (dict(swiglu_limit=0), "swiglu_limit of 0 or less"),
}


@pytest.mark.parametrize("case", list(HY_REFUSED))
def test_hy_v4_refusals(case):
    extra, words = HY_REFUSED[case]
    with pytest.raises(SterError, match=words) as e:
        gate(dict(CASES["hy_v4"][1], model_type="hy_v4", **extra), "config.json")
    assert "before reading any weight" in str(e.value)


def test_hy_v4_adapters_refused(hy):
    """Adapters are refused on hyper-connected models (one adapter per projection would not see the streams)."""
    _, _, model = hy
    assert model.spec.adapters == "none"


def test_hy_v4_listed_as_running():
    from ster_py.families import implemented_model_types

    assert "hy_v4" in implemented_model_types()
    json.dumps(sorted(implemented_model_types()))
