"""Hyper-connection families (issue 14's remainder, group HC) against transformers on tiny checkpoints.

GLM-5-Next (Sinkhorn-normalised hyper-connections averaged at the head, over Kimi Delta Attention and
unrotated latent attention behind a pooled indexer; built and run as Transformers runs it, inside its
glm5_next wrapper, text only), DeepSeek-V4 (Sinkhorn-normalised hyper-connections over compressed attention: a sliding window beside
heavily compressed and compressed sparse entries chosen by the Lightning Indexer; sqrtsoftplus routing,
hashed on the first layers) and HY V4 (independent hyper-connections over latent attention with DeepSeek
Sparse Attention, a sink per head, an elementwise output gate, clamped routed experts). Each checkpoint is made here with transformers
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


@pytest.mark.parametrize("family", ["hy_v4", "deepseek_v4", "glm5_next_text"])
def test_adapters_refused(family):
    """Adapters are refused on the hyper-connected families (seed 002), by a message that says why."""
    from pathlib import Path

    from ster_py.adapters import LoraAdapter, check_adapter_for

    config = {"hy_v4": CASES["hy_v4"][1], "deepseek_v4": V4, "glm5_next_text": G5_TEXT}[family]
    spec = spec_from_config(dict(config, model_type=family), FAMILIES[family])
    ad = LoraAdapter(path=Path("lora.safetensors"), layout="ster", model=None, model_revision=None, rank=1, alpha=1.0,
                     rslora=False, hidden_size=spec.hidden_size)
    with pytest.raises(SterError, match="hyper-connections"):
        check_adapter_for(ad, None, spec, lambda role: True)


def test_hy_v4_listed_as_running():
    from ster_py.families import implemented_model_types

    assert "hy_v4" in implemented_model_types()
    json.dumps(sorted(implemented_model_types()))


# ----------------------------------------------------------------------------- DeepSeek-V4
# 4 layers: sliding only, compressed sparse (entries of 2 tokens, 3 kept per query by the indexer), heavily
# compressed (entries of 4), compressed sparse; a window of 6 keys; 3 streams, 5 Sinkhorn rounds; the first layer
# hash-routed. The 16-token prompt closes 8 sparse and 4 heavy entries, so windows, entries and choices all act.
V4 = dict(vocab_size=128, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, head_dim=16, q_lora_rank=24,
          qk_rope_head_dim=8, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2, sliding_window=6,
          compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 4}, o_groups=2,
          o_lora_rank=12, index_n_heads=4, index_head_dim=8, index_topk=3, hc_mult=3, hc_sinkhorn_iters=5,
          max_position_embeddings=64, num_nextn_predict_layers=0,
          layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                       "compressed_sparse_attention"], mlp_layer_types=["hash_moe", "moe", "moe", "moe"])
V4_CASES = {
    "deepseek_v4": V4,
    # ... DeepseekV4Config's default layer kinds (two heavy, then by turns) and legacy keys (compress_rate_csa /
    # _hca, num_hash_layers, qk_rope_head_dim), the compressed layers' YaRN (magnitude one), 2 streams, 4 groups.
    "deepseek_v4-legacy-yarn": dict({k: v for k, v in V4.items() if k not in ("layer_types", "mlp_layer_types",
                                                                             "compress_rates")},
                                    num_hidden_layers=5, compress_rate_csa=2, compress_rate_hca=3, num_hash_layers=2,
                                    hc_mult=2, o_groups=4, o_lora_rank=8, routed_scaling_factor=2.0, swiglu_limit=0.4,
                                    rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32,
                                                     "beta_slow": 1, "original_max_position_embeddings": 16}),
}


def build_v4(path, config, seed: int = 0):
    """A tiny DeepSeek-V4 checkpoint (``build``) whose hash layers' tid2eid rows are drawn at random, distinct
    experts per token (transformers initialises them to zeros: every token to expert 0 twice)."""
    import torch

    ref = build(path, "deepseek_v4", config, seed=seed)
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for layer in ref.model.layers:
            table = getattr(layer.mlp.gate, "tid2eid", None)
            if table is not None:
                rows = [rng.permutation(config["n_routed_experts"])[:table.shape[1]] for _ in range(table.shape[0])]
                table.copy_(torch.tensor(np.stack(rows)))
    ref.save_pretrained(path)
    return ref


def _v4_margins(model, ids) -> list[float]:
    """For every query of every compressed sparse layer that chooses (more visible entries than index_topk): the
    gap between the last indexer score kept and the first left out, relative to the scores' spread."""
    from ster_py.decoder.compressed import CompressedAttention

    gaps, original = [], CompressedAttention._choose

    def spy(self, x, c_q, entries, positions, cos_sin):
        keep = original(self, x, c_q, entries, positions, cos_sin)
        c = self.c
        q = self.idx_q_b(c_q).reshape(x.shape[0], c.index_heads, c.index_dim).transpose(1, 0, 2)
        from ster_py.decoder.compressed import _rotate_tail
        q = _rotate_tail(c.compress_rope, q, *cos_sin).transpose(1, 0, 2)
        w = self.idx_w(x) * np.float32(c.index_heads ** -0.5)
        scores = np.einsum("tn,tne->te", w, np.maximum(q @ entries.T, 0))
        for t, p in enumerate(positions):
            visible = (p + 1) // c.sparse_rate
            if visible > c.index_topk:
                v = np.sort(scores[t, :visible])[::-1]
                gaps.append(float(v[c.index_topk - 1] - v[c.index_topk]) / (float(np.ptp(v)) + 1e-30))
        return keep

    CompressedAttention._choose = spy
    try:
        model.decoder.forward(ids)
    finally:
        CompressedAttention._choose = original
    return gaps


@pytest.fixture(scope="module")
def v4(tmp_path_factory):
    """The first DeepSeek-V4 case: (path, transformers' model, ster's model)."""
    path = tmp_path_factory.mktemp("deepseek_v4")
    ref = build_v4(path, V4_CASES["deepseek_v4"])
    return path, ref, load_model(str(path))


@pytest.mark.parametrize("case", list(V4_CASES))
def test_deepseek_v4_matches_transformers(case, tmp_path, v4):
    """Logits, stream means, the cache in two pieces, 16 greedy tokens (32 positions: entries close while
    decoding), every tensor read; token by token from the cache equals the whole prompt; no indexer tie."""
    from test_parity_mla import reference_steps

    if case == "deepseek_v4":
        path, ref_model, _ = v4
    else:
        path, ref_model = tmp_path, build_v4(tmp_path, V4_CASES[case])
    model = _check_streams(path, ref_model)
    gaps = _v4_margins(model, PROMPT)
    assert gaps and min(gaps) > 1e-4, "an indexer choice rests on (nearly) equal scores: pick another case"
    ref_logits, _ = reference_logits(ref_model, PROMPT)
    cache = model.decoder.new_cache()
    steps = np.concatenate([model.decoder.forward([t], cache) for t in PROMPT])
    assert rel_err(steps, ref_logits) < 1e-4
    assert rel_err(steps, reference_steps(ref_model, PROMPT)) < 1e-4


def test_deepseek_v4_specs():
    """The layer kinds, hash layers, rotations and streams as the specs read them."""
    spec = spec_from_config(dict(V4_CASES["deepseek_v4"], model_type="deepseek_v4"), FAMILIES["deepseek_v4"])
    assert [layer.compress for layer in spec.layers] == [None, "sparse", "heavy", "sparse"]
    assert [layer.moe is not None and layer.moe.router.hashed for layer in spec.layers] == [True, False, False, False]
    assert spec.moe.router.scoring == "sqrtsoftplus" and spec.moe.router.select_bias and spec.moe.limit == 10.0
    assert spec.moe.shared_size == 32 and spec.moe.shared_limit == 10.0
    s, c = spec.streams, spec.compressed
    assert (s.n, s.sinkhorn_iters, s.magnitude, s.post_eps, s.head) == (3, 5, 2.0, 0.0, "weighted")
    assert (c.rope_dim, c.sparse_rate, c.heavy_rate, c.window) == (8, 2, 4, 6)
    assert c.main_rope.interleaved and c.main_rope.inv_freq[1] != c.compress_rope.inv_freq[1]
    assert all(spec.has_kv(i) and spec.cache_width(i) == 16 for i in range(4))  # one key/value row (inspect)
    legacy = spec_from_config(dict(V4_CASES["deepseek_v4-legacy-yarn"], model_type="deepseek_v4"),
                              FAMILIES["deepseek_v4"])
    assert [layer.compress for layer in legacy.layers] == ["heavy", "heavy", "heavy", "sparse", "heavy"]
    assert [(layer.moe or legacy.moe).router.hashed for layer in legacy.layers] == [True, True, False, False, False]
    assert (legacy.compressed.sparse_rate, legacy.compressed.heavy_rate) == (2, 3)
    assert legacy.compressed.compress_rope.attention_factor == 1.0  # YaRN of magnitude one


V4_REFUSED = {
    "kinds": (dict(layer_types=["sliding_attention"] * 3), "layer_types"),
    "ratio": (dict(layer_types=None, compress_ratios=[0, 4, 64, 4]), "layer_types"),
    "scoring": (dict(scoring_func="sigmoid"), "scoring_func other than sqrtsoftplus"),
    "limit": (dict(swiglu_limit=0.0), "swiglu_limit of 0 or less"),
    "bias": (dict(mlp_bias=True), "mlp_bias"),
}


@pytest.mark.parametrize("case", list(V4_REFUSED))
def test_deepseek_v4_refusals(case):
    extra, words = V4_REFUSED[case]
    config = {k: v for k, v in dict(V4_CASES["deepseek_v4"], model_type="deepseek_v4", **extra).items()
              if v is not None}
    with pytest.raises(SterError, match=words):
        gate(config, "config.json")


def test_deepseek_v4_steering_and_capture(v4):
    """A steering vector at layer 2 is added to every stream (transformers with a forward hook doing so)."""
    import torch

    _, ref_model, model = v4
    v = np.random.RandomState(5).randn(model.spec.hidden_size).astype(np.float32) * 0.5

    def add(module, args, output):
        return output + torch.from_numpy(v)

    handle = ref_model.model.layers[2].register_forward_hook(add)
    try:
        ref, _ = reference_logits(ref_model, PROMPT)
    finally:
        handle.remove()
    ours = model.decoder.forward(PROMPT, layer_hook=lambda i, h: h + v if i == 2 else h)
    assert rel_err(ours, ref) < 1e-4


# ----------------------------------------------------------------------------- GLM-5-Next
# 4 layers (delta rule, latent, delta rule, latent), 3 streams; pools of 4 keys, 2 pools (8 keys) kept per query
# beside its own unfinished pool: from position 11 on, queries choose. Inside the glm5_next wrapper (a one-layer
# vision tower beside it, never read), as Transformers runs GLM-5-Next.
G5_TEXT = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=4, max_position_embeddings=64, kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8,
               qk_rope_head_dim=0, v_head_dim=12, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
               index_topk=8, index_head_dim=8, index_n_heads=4, index_kpool=4, hc_mult=3, hc_sinkhorn_iters=4,
               layer_types=["linear_attention", "indexed_attention", "linear_attention", "indexed_attention"],
               mlp_layer_types=["dense", "sparse", "sparse", "sparse"], linear_num_heads=2, linear_head_dim=8,
               linear_conv_kernel_dim=3, pad_token_id=0, bos_token_id=1, eos_token_id=2)
G5_VISION = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32, out_hidden_size=64,
                 projection_intermediate_size=32)
G5_CASES = {
    "glm5_next": G5_TEXT,
    # ... Glm5NextTextConfig's default layer kinds for 5 layers (delta rule but on layer 3, three dense layers),
    # grouped routing, two shared experts, no safe gate (linear_lower_bound null), a clamp that bites, 2 streams,
    # pools of 2 (3 kept) with an indexer on layer 3 only.
    "glm5_next-defaults-groups": dict({k: v for k, v in G5_TEXT.items() if k not in ("layer_types", "mlp_layer_types")},
                                      num_hidden_layers=5, n_group=2, topk_group=1, n_shared_experts=2,
                                      linear_lower_bound=None, swiglu_limit=0.5, hc_mult=2, index_kpool=2,
                                      index_topk=6, norm_topk_prob=False, routed_scaling_factor=1.5),
}


def _pool_margins(model, ids) -> list[float]:
    """For every query of every pooled-indexer layer that chooses: the gap between the last pool score kept and
    the first left out, relative to the scores' spread (a tie would make the choice depend on tie-breaking)."""
    from ster_py.decoder.indexer import Indexer

    gaps, original = [], Indexer.choose

    def spy(self, x, q_latent, keys, positions, cos_sin):
        scores, s = self.scores(x, q_latent, keys, cos_sin), self.spec
        k = s.topk // s.kpool
        for t, p in enumerate(positions):
            closed = (p + 1) // s.kpool
            if closed > k:
                v = np.sort(scores[t, :closed])[::-1]
                gaps.append(float(v[k - 1] - v[k]) / (float(np.ptp(v)) + 1e-30))
        return original(self, x, q_latent, keys, positions, cos_sin)

    Indexer.choose = spy
    try:
        model.decoder.forward(ids)
    finally:
        Indexer.choose = original
    return gaps


@pytest.mark.parametrize("case", list(G5_CASES))
def test_glm5_next_matches_transformers(case, tmp_path):
    """Logits, stream means, the cache in two pieces and token by token (absorbed attention), 16 greedy tokens, every
    tensor of the decoder read (the vision tower never), no pool choice on a tie."""
    ref_model = build(tmp_path, "glm5_next", dict(text_config=G5_CASES[case], vision_config=G5_VISION))
    model = _check_streams(tmp_path, ref_model)
    assert model.spec.model_type == "glm5_next_text" and model.spec.indexer.kpool == G5_CASES[case]["index_kpool"]
    gaps = _pool_margins(model, PROMPT)
    assert gaps and min(gaps) > 1e-4, "a pool choice rests on (nearly) equal scores: pick another case"
    _steps_and_absorbed(model, ref_model)


def test_glm5_next_specs():
    """Layer kinds, the pooled indexer, the clamps and the streams as the specs read them (the defaults case)."""
    spec = spec_from_config(dict(G5_CASES["glm5_next-defaults-groups"], model_type="glm5_next_text"),
                            FAMILIES["glm5_next_text"])
    assert [layer.mixer for layer in spec.layers] == ["kda", "kda", "kda", "latent", "kda"]
    assert [layer.ffn for layer in spec.layers] == ["dense", "dense", "dense", "moe", "moe"]
    assert spec.ffn_limit == 0.5 and spec.moe.limit == 0.5 and spec.moe.shared_limit == 0.5
    assert not spec.delta.safe_gate and all(layer.rope is None for layer in spec.layers)
    assert (spec.indexer.kpool, spec.indexer.tail, spec.indexer.key_width) == (2, True, 16)
    s = spec.streams
    assert (s.n, s.sinkhorn_iters, s.head, s.post_eps) == (2, 4, "mean", 0.0)
    linear = spec_from_config(dict(G5_TEXT, model_type="glm5_next_text", linear_lower_bound=None,
                                   linear_attn_config={"num_heads": 2, "head_dim": 8, "short_conv_kernel_size": 3,
                                                       "safe_gate": True, "gate_lower_bound": -3.0}),
                              FAMILIES["glm5_next_text"])
    assert linear.delta.safe_gate and linear.delta.lower_bound == -3.0


def test_select_pools_against_a_loop():
    """``select_pools`` against a plain loop over queries of the rule Transformers' Glm5NextTextIndexer applies."""
    from ster_py.decoder.indexer import IndexerSpec, select_pools

    rng = np.random.default_rng(0)
    for kpool, topk, tail, S in ((4, 8, True, 19), (3, 3, False, 10), (2, 8, True, 7)):
        spec = IndexerSpec(n_heads=1, head_dim=4, topk=topk, rope_dim=0, kpool=kpool, tail=tail)
        P = S // kpool
        scores = rng.standard_normal((S, P)).astype(np.float32)
        keep = select_pools(scores, np.arange(S), S, spec)
        keep = np.tril(np.ones((S, S), bool)) if keep is None else keep
        for p in range(S):
            closed = (p + 1) // kpool
            best = sorted(range(closed), key=lambda j: -scores[p, j])[:min(topk // kpool, P)]
            want = {t for j in best for t in range(j * kpool, (j + 1) * kpool)}
            if tail:
                want |= set(range((p + 1) - (p + 1) % kpool, p + 1))
            assert set(np.nonzero(keep[p])[0]) == want, (kpool, topk, tail, p)


G5_REFUSED = {
    "rope": (dict(qk_rope_head_dim=4), "qk_rope_head_dim other than 0"),
    "tail": (dict(index_kpool_always_select_tail=False), "index_kpool_always_select_tail: false"),
    "limit": (dict(swiglu_limit=-1.0), "swiglu_limit of 0 or less"),
}


@pytest.mark.parametrize("case", list(G5_REFUSED))
def test_glm5_next_refusals(case):
    extra, words = G5_REFUSED[case]
    with pytest.raises(SterError, match=words):
        gate(dict(G5_TEXT, model_type="glm5_next_text", **extra), "config.json")
