"""State-space families (issue 15, part A) against transformers, their kernels against numpy,
and llama.cpp's GGUF files of them.

Kernels: the short causal convolution, Mamba's selective scan and Mamba-2's multi-head scan
(``ster_py._kernels.scan``) against their numpy references on random shapes and odd lengths,
at 1 and 2 threads, in one call and carried across calls; the references against the
functions transformers runs.

Families: each case is a checkpoint made here with transformers (hidden 64, 4 or 5 layers
mixing the family's layer kinds, state sizes small but above one, every weight redrawn,
``tiny.build_checkpoint``), checked on a 16-token prompt (longer than every convolution):
logits within 1e-4 of transformers; the prompt split into two prefill calls, and fed token by
token, give the same logits and leave the same recurrent state as one call; the same 16 greedy
tokens as transformers decoding through its own cache; no stored tensor left unread. Then the
refusals seed 002 names for these families, steering and capture on a hybrid, and adapters
refused on state-space layers.

GGUF: the same kinds of model converted by llama.cpp's own convert_hf_to_gguf.py at F32 match
transformers within 1e-3 and llama.cpp's F32 logits within 1e-3; quantized by llama.cpp to Q8_0
and Q4_K_M, ster computes exactly what the quantized weights define and gives llama.cpp's
top-1 token at every position of a 32-token prompt but near-ties.

Note: transformers 5.24's causal-LM classes of mamba, falcon_mamba, mamba2 and bamba drop a
cache passed as ``past_key_values`` (decoding then restarts from nothing); the references here
pass it as ``cache``, which every family takes.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ster_py.decoder import conv as conv_mod
from ster_py.decoder import mamba as mamba_mod
from ster_py.decoder import mamba2 as mamba2_mod
from ster_py.decoder._fast import scan as scan_kernels
from ster_py.errors import SterError
from ster_py.families import FAMILIES, gate
from ster_py.generate import Sampling, generate
from ster_py.load import load_model
from tiny import build_checkpoint as build
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)
from tiny import reference_logits, rel_err

# the dequantized model's sums for a GGUF's prompt (conftest.quantized_tiles_off)
pytestmark = pytest.mark.usefixtures("quantized_tiles_off")

VOCAB = 128
PROMPT = np.random.RandomState(1).randint(3, VOCAB, size=16).tolist()
SPLIT = 9

# ----------------------------------------------------------------------------- kernels

needs_kernels = pytest.mark.skipif(scan_kernels is None, reason="ster_py._kernels.scan is not built")


@pytest.fixture(params=["simd", "portable"])
def simd(request):
    """Each kernel test runs the AVX2/FMA loops (where the CPU has them) and the portable ones."""
    scan_kernels.set_simd(request.param == "simd")
    yield request.param
    scan_kernels.set_simd(True)


def _rows(rng, T, C, wide=0):
    """float32 [T, C] whose rows are contiguous but strided (a column slice of a wider array) when wide."""
    a = rng.standard_normal((T, C + wide)).astype(np.float32)
    return a[:, wide // 2: wide // 2 + C] if wide else a


@needs_kernels
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("T,C,K,wide,bias,silu", [(1, 5, 4, 0, True, True), (7, 33, 4, 3, False, True),
                                                  (23, 130, 3, 0, True, False), (2, 64, 5, 7, True, True),
                                                  (13, 1, 2, 0, False, True), (9, 257, 1, 0, True, True)])
def test_causal_conv1d_kernel_equals_reference(T, C, K, wide, bias, silu, threads, simd):
    rng = np.random.default_rng(T * 100 + C)
    w = rng.standard_normal((C, K)).astype(np.float32)
    b = rng.standard_normal(C).astype(np.float32) if bias else None
    x = _rows(rng, T, C, wide)
    state = rng.standard_normal((K - 1, C)).astype(np.float32)
    ref, ref_state = conv_mod.causal_conv1d_reference(x, w, b, state, silu)
    out = np.empty((T, C), np.float32)
    mine = state.copy()
    scan_kernels.causal_conv1d(x, w, b, mine, out, silu, threads)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(mine, ref_state)
    # carried across calls: the prompt in two pieces and token by token equal it whole
    for cuts in ([T // 2], list(range(1, T))):
        st, pieces = state.copy(), []
        for a, z in zip([0] + cuts, cuts + [T]):
            o = np.empty((z - a, C), np.float32)
            scan_kernels.causal_conv1d(x[a:z], w, b, st, o, silu, threads)
            pieces.append(o)
        np.testing.assert_allclose(np.concatenate(pieces), ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(st, ref_state)


def _scan_inputs(rng, T, Dn, N, wide):
    x = _rows(rng, T, Dn, wide)
    dt = _rows(rng, T, Dn, wide) * np.float32(0.7)
    dt_bias = rng.standard_normal(Dn).astype(np.float32) * np.float32(0.5)
    A = -np.exp(rng.standard_normal((Dn, N)).astype(np.float32) * np.float32(0.5))
    B, C = _rows(rng, T, N, wide), _rows(rng, T, N, wide)
    D = rng.standard_normal(Dn).astype(np.float32)
    z = _rows(rng, T, Dn, wide)
    state = rng.standard_normal((Dn, N)).astype(np.float32)
    return x, dt, dt_bias, A, B, C, D, z, state


@needs_kernels
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("T,Dn,N,wide,gated", [(1, 8, 3, 0, True), (17, 37, 5, 3, True), (31, 96, 16, 0, False),
                                               (5, 1, 1, 0, True), (3, 130, 7, 2, True)])
def test_selective_scan_kernel_equals_reference(T, Dn, N, wide, gated, threads, simd):
    rng = np.random.default_rng(T * 1000 + Dn)
    x, dt, dt_bias, A, B, C, D, z, state = _scan_inputs(rng, T, Dn, N, wide)
    z = z if gated else None
    dt[0, 0] = 30.0  # softplus is the identity above 20
    ref, ref_state = mamba_mod.selective_scan_reference(x, dt, dt_bias, A, B, C, D, z, state)
    for cuts in ([], [T // 2 or 1] if T > 1 else [], list(range(1, T))):
        st, pieces = state.copy(), []
        for a, e in zip([0] + cuts, cuts + [T]):
            out = np.empty((e - a, Dn), np.float32)
            scan_kernels.selective_scan(x[a:e], dt[a:e], dt_bias, A, B[a:e], C[a:e], D,
                                        None if z is None else z[a:e], st, out, threads)
            pieces.append(out)
        np.testing.assert_allclose(np.concatenate(pieces), ref, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(st, ref_state, rtol=2e-5, atol=2e-5)


@needs_kernels
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("T,H,P,N,G,wide,limit", [(1, 4, 8, 3, 2, 0, None), (19, 6, 5, 7, 3, 4, (0.05, 0.4)),
                                                  (33, 8, 16, 16, 1, 0, None), (4, 3, 1, 1, 1, 1, (0.0, math.inf)),
                                                  (11, 16, 3, 5, 4, 0, (-math.inf, 0.2))])
def test_multihead_scan_kernel_equals_reference(T, H, P, N, G, wide, limit, threads, simd):
    rng = np.random.default_rng(T * 7 + H)
    x = _rows(rng, T, H * P, wide)
    dt = _rows(rng, T, H, wide)
    dt[0, 0] = 25.0
    dt_bias = rng.standard_normal(H).astype(np.float32) * np.float32(0.5)
    A = -np.exp(rng.standard_normal(H).astype(np.float32) * np.float32(0.5))
    B, C = _rows(rng, T, G * N, wide), _rows(rng, T, G * N, wide)
    D = rng.standard_normal(H).astype(np.float32)
    state = rng.standard_normal((H, P, N)).astype(np.float32)
    lo, hi = limit if limit is not None else (-math.inf, math.inf)
    ref, ref_state = mamba2_mod.multihead_scan_reference(x, dt, dt_bias, A, B, C, D, state, lo, hi)
    for cuts in ([], [T // 2] if T > 1 else [], list(range(1, T))):
        st, pieces = state.copy(), []
        for a, e in zip([0] + cuts, cuts + [T]):
            out = np.empty((e - a, H * P), np.float32)
            scan_kernels.multihead_scan(x[a:e], dt[a:e], dt_bias, A, B[a:e], C[a:e], D, st, out, lo, hi, threads)
            pieces.append(out)
        np.testing.assert_allclose(np.concatenate(pieces), ref, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(st, ref_state, rtol=2e-5, atol=2e-5)


def test_references_equal_the_functions_transformers_runs():
    """The numpy references against transformers' own torch fallbacks: the depthwise conv1d
    (from zeros), Mamba's ``mamba_selective_scan`` and Mamba-2's chunked ``mamba2_chunk_scan``."""
    import torch
    import torch.nn.functional as F
    from transformers.models.mamba.modeling_mamba import mamba_selective_scan
    from transformers.models.mamba2.modeling_mamba2 import mamba2_chunk_scan

    rng = np.random.default_rng(0)
    T, C, K = 13, 24, 4
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((T, C), (C, K), (C,)))
    ref = F.silu(F.conv1d(torch.tensor(x.T[None]), torch.tensor(w[:, None, :]), torch.tensor(b), padding=K - 1,
                          groups=C)[..., :T])[0].numpy().T
    ours, _ = conv_mod.causal_conv1d_reference(x, w, b, np.zeros((K - 1, C), np.float32), True)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)

    T, Dn, N = 11, 12, 5
    x, dt, dt_bias, A, B, Cm, D, z, _ = _scan_inputs(rng, T, Dn, N, 0)
    t = torch.tensor
    ref = mamba_selective_scan(t(x.T[None]), t(dt.T[None]), t(A), t(B.T[None]), t(Cm.T[None]), D=t(D), z=t(z.T[None]),
                               delta_bias=t(dt_bias), delta_softplus=True)[0].numpy().T
    ours, _ = mamba_mod.selective_scan_reference(x, dt, dt_bias, A, B, Cm, D, z, np.zeros((Dn, N), np.float32))
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-5)

    T, H, P, N, G = 21, 6, 4, 5, 3
    x = rng.standard_normal((T, H * P)).astype(np.float32)
    dt = rng.standard_normal((T, H)).astype(np.float32)
    dt_bias = rng.standard_normal(H).astype(np.float32)
    A = -np.exp(rng.standard_normal(H).astype(np.float32))
    B, Cm = (rng.standard_normal((T, G * N)).astype(np.float32) for _ in range(2))
    D = rng.standard_normal(H).astype(np.float32)
    state = rng.standard_normal((H, P, N)).astype(np.float32)
    ref, final = mamba2_chunk_scan(t(x.reshape(1, T, H, P)), t(dt[None]), t(A), t(B.reshape(1, T, G, N)),
                                   t(Cm.reshape(1, T, G, N)), chunk_size=8, D=t(D), dt_bias=t(dt_bias),
                                   initial_states=t(state[None]), dt_softplus=True, dt_limit=(0.1, 1.5),
                                   return_final_states=True)
    ours, ours_final = mamba2_mod.multihead_scan_reference(x, dt, dt_bias, A, B, Cm, D, state, 0.1, 1.5)
    np.testing.assert_allclose(ours, ref[0].reshape(T, H * P).numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours_final, final[0].numpy(), rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- families

MAMBA = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, state_size=8, conv_kernel=4, expand=2)
MAMBA2 = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, state_size=8, conv_kernel=4, expand=2,
              num_heads=8, head_dim=16, n_groups=2)
ATTN = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=64)
SCAN2 = dict(mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=4)

CASES = {
    "mamba": ("mamba", dict(MAMBA)),
    "mamba-biases-rank3-untied": ("mamba", dict(MAMBA, use_bias=True, use_conv_bias=False, time_step_rank=3,
                                                conv_kernel=3, state_size=5, tie_word_embeddings=False)),
    "falcon_mamba": ("falcon_mamba", dict(MAMBA, mixer_rms_eps=1e-3)),
    "mamba2": ("mamba2", dict(MAMBA2)),
    "mamba2-one-group-bias-tied": ("mamba2", dict(MAMBA2, n_groups=1, num_heads=4, head_dim=32, conv_kernel=3,
                                                  use_bias=True, tie_word_embeddings=True)),
    "jamba": ("jamba", dict(ATTN, num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1,
                            expert_layer_period=2, expert_layer_offset=0, num_experts=4, num_experts_per_tok=2,
                            mamba_d_state=8, mamba_d_conv=4, mamba_expand=2)),
    "jamba-period3-proj-bias-rank5": ("jamba", dict(ATTN, num_hidden_layers=5, attn_layer_period=3, attn_layer_offset=2,
                                                    expert_layer_period=2, expert_layer_offset=1, num_experts=3,
                                                    num_experts_per_tok=2, mamba_d_state=6, mamba_d_conv=3,
                                                    mamba_expand=2, mamba_dt_rank=5, mamba_proj_bias=True,
                                                    mamba_conv_bias=False)),
    "bamba": ("bamba", dict(ATTN, num_hidden_layers=4, attn_layer_indices=[1, 3], **SCAN2)),
    "bamba-biases-one-group": ("bamba", dict(ATTN, num_hidden_layers=4, attn_layer_indices=[2], **dict(
        SCAN2, mamba_n_groups=1, mamba_n_heads=4, mamba_d_head=32), attention_bias=True, mlp_bias=True,
        mamba_proj_bias=True)),
    "granitemoehybrid-rope-experts": ("granitemoehybrid", dict(
        ATTN, num_hidden_layers=4, layer_types=["mamba", "attention", "mamba", "mamba"], position_embedding_type="rope",
        num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=48, embedding_multiplier=1.5,
        residual_multiplier=0.7, attention_multiplier=0.2, logits_scaling=2.0, **SCAN2)),
    "granitemoehybrid-share-and-router-keys-unread": ("granitemoehybrid", dict(  # whole heads; Granite's router
        ATTN, num_hidden_layers=4, layer_types=["mamba", "attention", "mamba", "attention"],
        position_embedding_type="rope", num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=48,
        partial_rotary_factor=0.5, routed_scaling_factor=2.5, scoring_func="sigmoid", swiglu_limit=0.2, **SCAN2)),
    "granitemoehybrid-nope-dense": ("granitemoehybrid", dict(
        ATTN, num_hidden_layers=4, layer_types=["attention", "mamba", "mamba", "attention"],
        position_embedding_type="nope", num_local_experts=0, shared_intermediate_size=80, **SCAN2)),
    "nemotron_h": ("nemotron_h", dict(ATTN, hybrid_override_pattern="M*M-E", head_dim=16, mamba_num_heads=8,
                                      mamba_head_dim=16, n_groups=2, ssm_state_size=8, conv_kernel=4,
                                      n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                      moe_shared_expert_intermediate_size=48)),
    "nemotron_h-latent-groups-scaled": ("nemotron_h", dict(
        ATTN, hybrid_override_pattern="ME*-M", head_dim=16, mamba_num_heads=4, mamba_head_dim=32, n_groups=1,
        ssm_state_size=6, conv_kernel=3, n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=24,
        moe_shared_expert_intermediate_size=40, moe_latent_size=32, n_group=2, topk_group=1,
        routed_scaling_factor=1.5, norm_topk_prob=False, time_step_min=0.3)),
    # Transformers' NemotronH ties no weights: its lm_head is read whatever tie_word_embeddings says
    "nemotron_h-tied-in-name-only": ("nemotron_h", dict(
        ATTN, hybrid_override_pattern="M*-E", head_dim=16, mamba_num_heads=8, mamba_head_dim=16, n_groups=2,
        ssm_state_size=8, conv_kernel=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=48, tie_word_embeddings=True)),
    "falcon_h1": ("falcon_h1", dict(ATTN, num_hidden_layers=4, mamba_d_ssm=128, mamba_rms_norm=True,
                                    mamba_norm_before_gate=False, embedding_multiplier=1.3, lm_head_multiplier=0.7,
                                    attention_in_multiplier=0.8, attention_out_multiplier=1.2, key_multiplier=0.6,
                                    ssm_in_multiplier=1.1, ssm_out_multiplier=0.9,
                                    ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 0.7], mlp_multipliers=[1.4, 0.6],
                                    **SCAN2)),
    "falcon_h1-no-scan-norm-biases": ("falcon_h1", dict(ATTN, num_hidden_layers=4, mamba_d_ssm=None, mamba_expand=2,
                                                        mamba_rms_norm=False, attention_bias=True,
                                                        projectors_bias=True, mamba_proj_bias=True, **dict(
                                                            SCAN2, mamba_n_heads=4, mamba_d_head=32))),
}
# Where transformers 5.24's cached decoding departs from its own prefill, the greedy reference is its
# prefill over the growing sequence: its single-token scan step leaves the step unclamped where its
# prefill clamps it (time_step_limit, Nemotron-H's time_step_min), and BambaModel numbers the positions
# of every call from 0 (it never reads the cache's length), so its cached attention rotates wrongly.
PREFILL_GREEDY = {"nemotron_h-latent-groups-scaled", "mamba2-limited", "bamba", "bamba-biases-one-group"}
CASES["mamba2-limited"] = ("mamba2", dict(MAMBA2, time_step_limit=(0.4, 0.9)))
# Transformers' Mamba and Mamba-2 norms take layer_norm_epsilon only
CASES["mamba-eps-under-rms-norm-eps"] = ("mamba", dict(MAMBA, rms_norm_eps=0.1))
CASES["mamba2-eps-under-norm-eps"] = ("mamba2", dict(MAMBA2, norm_eps=0.1))


def reference_greedy(model, ids, n: int) -> list[int]:
    """transformers' greedy continuation of ``ids`` through its own cache (passed as ``cache``)."""
    import torch

    out, past, feed = [], None, list(ids)
    with torch.no_grad():
        for _ in range(n):
            res = model(torch.tensor([feed]), cache=past, use_cache=True)
            past = res.past_key_values
            feed = [int(res.logits[0, -1].argmax())]
            out.append(feed[0])
    return out


def reference_greedy_prefill(model, ids, n: int) -> list[int]:
    """transformers' greedy continuation by a whole forward pass over the sequence each step."""
    seq = list(ids)
    for _ in range(n):
        seq.append(int(reference_logits(model, seq)[0][-1].argmax()))
    return seq[len(ids):]


def _states(cache, spec) -> list[np.ndarray]:
    return [cache.slot(i)[name] for i, layer in enumerate(spec.layers) if cache.slot(i) is not None
            for name in cache.slot(i).names()]


def check_ssm(path, ref_model, greedy=reference_greedy):
    """The family checks of the module docstring; returns the loaded model."""
    ref_logits, ref_hidden = reference_logits(ref_model, PROMPT)
    model = load_model(str(path))
    dec = model.decoder
    hidden: list = []
    whole = dec.new_cache()
    logits = dec.forward(PROMPT, whole, hidden_states=hidden)
    err = rel_err(logits, ref_logits)
    assert err < 1e-4, f"logits rel err {err:.2e}"
    assert len(hidden) == len(ref_hidden)
    if model.spec.model_type in ("mamba", "falcon_mamba", "mamba2"):
        # transformers' Mamba models list each layer's output, then the final norm's (no embedding)
        pairs = zip(hidden[1:], ref_hidden[:-1])
    else:  # the embedding, then each layer's output but the last's, which transformers lists normed
        pairs = zip(hidden[:-1], ref_hidden[:-1])
    for ours_h, ref_h in pairs:
        assert rel_err(ours_h, ref_h) < 1e-4

    split = dec.new_cache()
    pieces = np.concatenate([dec.forward(PROMPT[:SPLIT], split), dec.forward(PROMPT[SPLIT:], split)])
    steps = dec.new_cache()
    one_by_one = np.concatenate([dec.forward([t], steps) for t in PROMPT])
    for other, cache in ((pieces, split), (one_by_one, steps)):
        assert rel_err(other, logits) < 1e-5
        assert cache.length == whole.length == len(PROMPT)
        for a, b in zip(_states(cache, model.spec), _states(whole, model.spec)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert whole.nbytes_fixed() == model.spec.state_bytes() > 0

    ours = generate(dec, PROMPT, Sampling(max_new_tokens=16)).ids
    assert ours == greedy(ref_model, PROMPT, 16)
    assert dec._weights.unused_tensors(model.spec) == []
    return model


@pytest.mark.parametrize("case", list(CASES))
def test_family_matches_transformers(case, tmp_path):
    model_type, config = CASES[case]
    ref_model = build(tmp_path, model_type, config)
    model = check_ssm(tmp_path, ref_model, reference_greedy_prefill if case in PREFILL_GREEDY else reference_greedy)
    assert model.spec.ssm is not None
    mixers = {layer.mixer for layer in model.spec.layers}
    assert mixers & {"mamba", "mamba2", "hybrid"}
    if model_type not in ("mamba", "falcon_mamba", "mamba2", "falcon_h1"):
        assert len(mixers) > 1, mixers  # hybrids mix layer kinds
    if case in ("mamba2-limited", "nemotron_h-latent-groups-scaled"):  # the step's clamp is exercised
        from dataclasses import replace

        from ster_py.decoder.model import Decoder

        unclamped = replace(model.spec, ssm=replace(model.spec.ssm, dt_min=-math.inf, dt_max=math.inf))
        logits = Decoder(unclamped, model.decoder.weights).forward(PROMPT)
        assert rel_err(logits, reference_logits(ref_model, PROMPT)[0]) > 1e-3


def test_every_ssm_family_has_a_case():
    # (the other recurrent mixers' families have their own modules: test_parity_ssm_b1)
    import test_parity_remote_c  # group R2's Nemotron Puzzle

    ours = {name for name, f in FAMILIES.items() if f.recurrent in ("mamba", "mamba2") and f.hybrid_mixer == "hybrid"}
    assert ours == {model_type for model_type, _ in CASES.values()} | {
        m for m, _ in test_parity_remote_c.CASES.values() if FAMILIES[m].recurrent}


def test_layer_kinds_and_state_shapes_from_the_config(tmp_path):
    """The layer kinds each family's config names, the scan's sizes and the state slots' shapes."""
    expect = {
        "jamba": ([("mamba", "moe"), ("attention", "dense"), ("mamba", "moe"), ("attention", "dense")],
                  {"conv": (3, 128), "ssm": (128, 8)}),
        "nemotron_h": ([("mamba2", "none"), ("attention", "none"), ("mamba2", "none"), ("none", "dense"),
                        ("none", "moe")], {"conv": (3, 128 + 2 * 2 * 8), "ssm": (8, 16, 8)}),
        "granitemoehybrid-nope-dense": ([("attention", "dense"), ("mamba2", "dense"), ("mamba2", "dense"),
                                         ("attention", "dense")], {"conv": (3, 128 + 2 * 2 * 8), "ssm": (8, 16, 8)}),
        "falcon_h1": ([("hybrid", "dense")] * 4, {"conv": (3, 128 + 2 * 2 * 8), "ssm": (8, 16, 8)}),
    }
    for case, (kinds, shapes) in expect.items():
        build(tmp_path / case, *CASES[case])
        model = load_model(str(tmp_path / case))
        assert [(layer.mixer, layer.ffn) for layer in model.spec.layers] == kinds
        cache = model.decoder.new_cache()
        for i, layer in enumerate(model.spec.layers):
            slot = cache.slot(i)
            if layer.mixer in ("mamba", "mamba2", "hybrid"):
                assert {n: slot[n].shape for n in slot.names()} == shapes
            else:
                assert slot is None
        assert cache.nbytes_fixed() == 4 * sum(math.prod(s) for s in shapes.values()) * sum(
            layer.mixer in ("mamba", "mamba2", "hybrid") for layer in model.spec.layers)
    # attention rotates only where the family's attention does
    model = load_model(str(tmp_path / "falcon_h1"))
    assert all(layer.rope is not None for layer in model.spec.layers)
    assert all(layer.rope is None for layer in load_model(str(tmp_path / "jamba")).spec.layers)


def test_inspect_reports_state_bytes_per_sequence(tmp_path):
    from ster_py.inspect import inspect_model

    build(tmp_path, *CASES["jamba"])
    info = inspect_model(str(tmp_path))
    model = load_model(str(tmp_path))
    assert info["state_bytes_per_sequence"] == model.decoder.new_cache().nbytes_fixed() == 2 * 4 * (3 * 128 + 128 * 8)
    # keys and values only on the two attention layers (2 kv heads of 16, f32)
    assert info["kv_bytes_per_position"] == 2 * 4 * 2 * 2 * 16
    assert info["dimensions"]["scan_layers"] == 2 and info["dimensions"]["ssm_state_size"] == 8
    # the state does not grow with the context
    cache = model.decoder.new_cache()
    before = cache.nbytes_fixed()
    model.decoder.forward(PROMPT, cache)
    assert cache.nbytes_fixed() == before


def test_time_step_limit_infinity_reads_as_unstated(tmp_path):
    """Seed 002: Infinity (bare, as Python writes it, or Transformers 5's tagged form) is unstated."""
    build(tmp_path, *CASES["mamba2"])
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["time_step_limit"][1] == {"__float__": "Infinity"}  # as transformers wrote it
    assert load_model(str(tmp_path)).spec.ssm.dt_max == math.inf
    config["time_step_limit"] = [math.nan, math.inf]  # json writes them bare: NaN, Infinity
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert "[NaN, Infinity]" in (tmp_path / "config.json").read_text()
    spec = load_model(str(tmp_path)).spec.ssm
    assert (spec.dt_min, spec.dt_max) == (-math.inf, math.inf)


SCAN_HYBRID = dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=4, mamba_n_heads=8, mamba_d_head=16)
REFUSED = {  # model_type, config, what the message names
    "jamba-attn-offset": ("jamba", dict(num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=2),
                          "attn_layer_offset"),
    "jamba-expert-offset": ("jamba", dict(num_hidden_layers=4, expert_layer_period=2, expert_layer_offset=3),
                            "expert_layer_offset"),
    "mamba2-width": ("mamba2", dict(hidden_size=64, expand=2, num_heads=8, head_dim=8), "num_heads \\* head_dim"),
    "bamba-width": ("bamba", dict(SCAN_HYBRID, mamba_d_head=8), "mamba_n_heads \\* mamba_d_head"),
    "granite-no-layer-types": ("granitemoehybrid", dict(SCAN_HYBRID, shared_intermediate_size=32),
                               "without layer_types"),
    "granite-layer-type": ("granitemoehybrid", dict(SCAN_HYBRID, shared_intermediate_size=32,
                                                    layer_types=["mamba", "attention", "conv", "mamba"]),
                           "layer type other than mamba or attention"),
    "granite-no-shared": ("granitemoehybrid", dict(SCAN_HYBRID, layer_types=["mamba"] * 4), "shared_intermediate_size"),
    "granite-position": ("granitemoehybrid", dict(SCAN_HYBRID, layer_types=["mamba"] * 4, shared_intermediate_size=32,
                                                  position_embedding_type="alibi"), "position_embedding_type"),
    "nemotron-length": ("nemotron_h", dict(hybrid_override_pattern="M*M-", num_hidden_layers=5), "length"),
    "nemotron-letter": ("nemotron_h", dict(hybrid_override_pattern="M*X-"), "letter"),
    "falcon_h1-attn-indices": ("falcon_h1", dict(SCAN_HYBRID, attn_layer_indices=[1]), "attn_layer_indices"),
    "falcon_h1-no-mlp": ("falcon_h1", dict(SCAN_HYBRID, mamba_use_mlp=False), "mamba_use_mlp"),
    "falcon_h1-norm-before-gate": ("falcon_h1", dict(SCAN_HYBRID, mamba_rms_norm=True, mamba_norm_before_gate=True),
                                   "mamba_norm_before_gate"),
    "falcon_h1-projectors-bias": ("falcon_h1", dict(SCAN_HYBRID, projectors_bias=True, mamba_proj_bias=False),
                                  "projectors_bias"),
    "falcon_h1-width": ("falcon_h1", dict(SCAN_HYBRID, mamba_d_ssm=96), "mamba_d_ssm"),
    "falcon_h1-ssm-multipliers": ("falcon_h1", dict(SCAN_HYBRID, ssm_multipliers=[1.0, 1.0, 1.0]), "ssm_multipliers"),
    "falcon_h1-mlp-multipliers": ("falcon_h1", dict(SCAN_HYBRID, mlp_multipliers=[1.0, "x"]), "mlp_multipliers"),
}


@pytest.mark.parametrize("key", list(REFUSED))
def test_refused_configurations(key, tmp_path):
    model_type, config, match = REFUSED[key]
    with pytest.raises(SterError, match=match):
        gate({"model_type": model_type, **config}, tmp_path / "config.json")


def test_refusal_comes_before_any_weight_and_other_scan_activations_are_refused(tmp_path):
    """A refused config is refused by load_model with weights that are not even there; a scan whose
    convolution activation is not SiLU is refused when the spec is read."""
    from tiny import write_tokenizer

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "falcon_h1", "mamba_use_mlp": False}))
    write_tokenizer(tmp_path)
    with pytest.raises(SterError, match="mamba_use_mlp"):
        load_model(str(tmp_path))
    build(tmp_path / "m", *CASES["mamba"])
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps(dict(config, hidden_act="gelu")))
    with pytest.raises(SterError, match="activation 'gelu'"):
        load_model(str(tmp_path / "m"))


def _write_adapter(d, model_path, target, inp, out):
    from safetensors.numpy import save_file

    d.mkdir()
    save_file({f"layers.0.{target}.a": np.zeros((2, inp), np.float32),
               f"layers.0.{target}.b": np.zeros((out, 2), np.float32)}, str(d / "a.lora.safetensors"))
    (d / "a.lora.json").write_text(json.dumps({"model": str(model_path), "model_revision": None, "rank": 2,
                                               "alpha": 2, "targets": [target], "layers": [0], "hidden_size": 64}))
    return d / "a.lora.json"


def test_adapters_refused_on_state_space_layers(tmp_path):
    """Seed 002: adapter training on state-space families is refused (their scan layers have no
    attention or feed-forward projection); Granite 4.0's dense shared_mlp takes gate/up/down."""
    from ster_py.adapters import load_adapter_for

    for case, target, out in (("jamba", "q", 64), ("mamba", "gate", 96), ("falcon_h1", "up", 96)):
        build(tmp_path / case, *CASES[case])
        loaded = load_model(str(tmp_path / case))
        with pytest.raises(SterError, match="state-space"):
            load_adapter_for(_write_adapter(tmp_path / f"{case}-a", tmp_path / case, target, 64, out), loaded)
    build(tmp_path / "g", *CASES["granitemoehybrid-nope-dense"])
    loaded = load_model(str(tmp_path / "g"))
    load_adapter_for(_write_adapter(tmp_path / "g-up", tmp_path / "g", "up", 64, 80), loaded)
    with pytest.raises(SterError, match="feed-forward projections"):
        load_adapter_for(_write_adapter(tmp_path / "g-q", tmp_path / "g", "q", 64, 64), loaded)


def test_steering_and_capture_on_a_hybrid_model(tmp_path):
    """The residual stream between blocks is the same object whatever the mixer: a steering vector
    on Jamba equals transformers with forward hooks adding it (prefill logits and 10 greedy tokens
    through both caches), and captured hidden states are transformers' own."""
    import torch

    from ster_py.capture import capture
    from ster_py.steering import SteeringVector, steering_hook
    from test_steering import unit_directions

    model_type, config = CASES["jamba"]
    ref = build(tmp_path, model_type, config)
    loaded = load_model(str(tmp_path))
    dirs = unit_directions([0, 2])
    strength = 2.5

    def adder(vec):
        add = torch.tensor(vec) * strength
        return lambda mod, args, out: (out[0] + add,) + out[1:] if isinstance(out, tuple) else out + add

    handles = [ref.model.layers[i].register_forward_hook(adder(v)) for i, v in dirs.items()]
    try:
        expected, past, feed, first = [], None, PROMPT[:6], None
        with torch.no_grad():
            for _ in range(10):
                res = ref(torch.tensor([feed]), cache=past, use_cache=True)
                first = res.logits[0].numpy() if first is None else first
                past, feed = res.past_key_values, [int(res.logits[0, -1].argmax())]
                expected.append(feed[0])
    finally:
        for h in handles:
            h.remove()
    hook = steering_hook(SteeringVector(str(tmp_path), None, 64, "test", "manual", dirs), strength)
    assert rel_err(loaded.decoder.forward(PROMPT[:6], layer_hook=hook), first) < 1e-4
    assert generate(loaded.decoder, PROMPT[:6], Sampling(max_new_tokens=10), stop_ids=(), layer_hook=hook).ids == expected
    assert expected != reference_greedy(ref, PROMPT[:6], 10)  # the steering changed the continuation

    _, ref_hidden = reference_logits(ref, PROMPT)
    cap = capture(loaded, [" ".join(f"w{i}" for i in PROMPT)], [0, 1], "all", chat_template="off")
    assert cap.meta["prompts"][0]["token_ids"] == PROMPT
    for layer in (0, 1):  # after a scan layer and after an attention layer
        assert rel_err(cap.rows(layer), ref_hidden[layer + 1][-len(PROMPT):]) < 1e-5


# ----------------------------------------------------------------------------- GGUF, via llama.cpp
#
# llama.cpp's converter on the same kinds of model, 256 wide so that the products really are
# Q4_K (llama.cpp falls back to other types for other widths). Weights are scaled by 0.25 (as the
# MoE suite's wide models) and routers made decisive (``_wide``), so that quantization leaves
# each routing choice where it was. Nemotron-H converts as nemotron_h_moe with routed layers and as
# nemotron_h without: the converter takes any config naming num_experts_per_tok for nemotron_h_moe
# (where it mistakes the '-' layers for scans), and Transformers 5's config class names it by
# default, so the dense case's converter is not shown the MoE keys (a config.json written before
# them, as the dense Nemotron-H checkpoints on the hub are); both configs state the hub's
# hybrid_override_pattern, the form in which the converter knows '-' layers. Granite 4.0 is
# converted without rotation: llama.cpp's converter switches rotation off for every hybrid.

WIDE = dict(vocab_size=VOCAB, hidden_size=256, max_position_embeddings=64)
WIDE_ATTN = dict(WIDE, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
WIDE_SCAN2 = dict(mamba_n_heads=8, mamba_d_head=64, mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=4)
_NO_MOE_KEYS = ("num_experts_per_tok", "n_routed_experts", "moe_intermediate_size", "n_group", "topk_group",
                "moe_shared_expert_intermediate_size")
GGUF_CASES = {  # name: (model_type, config, legacy config.json keys)
    "mamba": ("mamba", dict(WIDE, num_hidden_layers=3, state_size=8, conv_kernel=4, expand=2), {}),
    "mamba2": ("mamba2", dict(WIDE, num_hidden_layers=3, state_size=8, conv_kernel=4, expand=2, num_heads=8,
                              head_dim=64, n_groups=2), {}),
    "jamba": ("jamba", dict(WIDE_ATTN, num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1,
                            expert_layer_period=2, expert_layer_offset=0, num_experts=4, num_experts_per_tok=2,
                            mamba_d_state=8, mamba_d_conv=4, mamba_expand=2), {}),
    "granitehybrid": ("granitemoehybrid", dict(WIDE_ATTN, num_hidden_layers=4, position_embedding_type="nope",
                                               layer_types=["mamba", "attention", "mamba", "mamba"],
                                               num_local_experts=4, num_experts_per_tok=2,
                                               shared_intermediate_size=256, residual_multiplier=0.8,
                                               embedding_multiplier=1.5, logits_scaling=2.0, **WIDE_SCAN2),
                      {"layer_types": ["mamba", "attention", "mamba", "mamba"]}),
    "nemotron_h": ("nemotron_h", dict(WIDE_ATTN, hybrid_override_pattern="M*M-", head_dim=64, mamba_num_heads=8,
                                      mamba_head_dim=64, n_groups=2, ssm_state_size=8, conv_kernel=4),
                   {"_llamacpp_drop_keys": list(_NO_MOE_KEYS), "hybrid_override_pattern": "M*M-"}),
    "nemotron_h_moe": ("nemotron_h", dict(WIDE_ATTN, hybrid_override_pattern="M*ME", head_dim=64, mamba_num_heads=8,
                                          mamba_head_dim=64, n_groups=2, ssm_state_size=8, conv_kernel=4,
                                          n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=256,
                                          moe_shared_expert_intermediate_size=256),
                       {"hybrid_override_pattern": "M*ME"}),
    "falcon-h1": ("falcon_h1", dict(WIDE_ATTN, num_hidden_layers=3, mamba_d_ssm=512, mamba_rms_norm=True,
                                    mamba_norm_before_gate=False, embedding_multiplier=1.3, lm_head_multiplier=0.7,
                                    attention_in_multiplier=0.8, attention_out_multiplier=1.2, key_multiplier=0.6,
                                    ssm_in_multiplier=1.1, ssm_out_multiplier=0.9,
                                    ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 0.7], mlp_multipliers=[1.4, 0.6],
                                    **WIDE_SCAN2), {"head_dim": 64}),
}
LONG_PROMPT = np.random.RandomState(3).randint(3, VOCAB, size=32).tolist()
# Each family's router weight in transformers' module names.
ROUTERS = ("feed_forward.router.weight", "router.layer.weight", "mixer.gate.weight")


def _wide(path, model_type, config):
    """``tiny.build_checkpoint`` with 2-D weights scaled by 0.25 and decisive routing (token t's
    embedding carries strong features at experts t mod E and 3t + 1 mod E, which the routers read;
    as ``test_parity_moe._wide``)."""
    import torch

    model = build(path, model_type, config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim > 1 and "norm" not in name and "conv1d" not in name:
                p.mul_(0.25)
        routers = [p for name, p in model.named_parameters() if name.endswith(ROUTERS) and p.ndim == 2]
        if routers:
            n = routers[0].shape[0]
            emb = model.get_input_embeddings().weight
            sigma = float(emb.std())
            emb[:, :n] = 0.0
            for t in range(emb.shape[0]):
                emb[t, t % n] += 12 * sigma
                emb[t, (3 * t + 1) % n] += 8 * sigma
            for p in routers:
                p.mul_(0.02)
                p[:, :n] += torch.eye(n) * 2.0
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="module")
def ssm_gguf(tmp_path_factory):
    """name -> (converted F32 .gguf, transformers model) for every case of GGUF_CASES."""
    from llamacpp_convert import convert_cases

    return convert_cases(tmp_path_factory.mktemp("llama_cpp_ssm"), GGUF_CASES, _wide)


@pytest.mark.parametrize("name", list(GGUF_CASES))
def test_gguf_matches_transformers(name, ssm_gguf):
    from ster_py import llamacpp
    from ster_py.gguf.reader import GGUFFile

    path, ref_model = ssm_gguf[name]
    assert GGUFFile(path).architecture == name  # the architecture llama.cpp's converter chose
    model = load_model(str(path))
    assert model.spec.ssm is not None
    ours = model.decoder.forward(PROMPT)
    err = rel_err(ours, reference_logits(ref_model, PROMPT)[0])
    assert err < 1e-3, f"logits rel err {err:.2e}"
    (ref,) = llamacpp.logits(path, [PROMPT])  # and llama.cpp reads the file as ster does
    assert rel_err(ours, ref[:, :ours.shape[1]]) < 1e-3
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:SPLIT], cache), model.decoder.forward(PROMPT[SPLIT:], cache)])
    assert rel_err(pieces, ours) < 1e-5
    assert model.decoder._weights.unused_tensors(model.spec) == []


@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_K_M"])
@pytest.mark.parametrize("name", list(GGUF_CASES))
def test_quantized_gguf_gives_llamacpps_top1(name, ftype, ssm_gguf, tmp_path):
    from ster_py import llamacpp
    from ster_py.decoder.model import Decoder
    from ster_py.decoder.qlinear import QuantTensor
    from ster_py.gguf.reader import GGUFFile
    from ster_py.weights import GGUFWeights

    path, _ = ssm_gguf[name]
    q = llamacpp.quantize(path, tmp_path / f"{name}-{ftype}.gguf", ftype)
    model = load_model(str(q))
    scans = [m for m in (getattr(layer.mixer, "scan", layer.mixer) for layer in model.decoder.layers)
             if hasattr(m, "in_proj")]
    want = {"Q8_0"} if ftype == "Q8_0" else {"Q4_K", "Q5_K", "Q6_K"}
    assert scans and all(type(s.in_proj.weight) is QuantTensor and s.in_proj.weight.type_name in want
                         for s in scans)  # kept in their blocks
    ours = model.decoder.forward(LONG_PROMPT)
    # ster computes what the quantized weights define: the same as those weights dequantized, in f32
    spec = model.spec
    qk = (spec.num_attention_heads, spec.num_key_value_heads) if FAMILIES[spec.model_type].gguf_qk_permuted else None
    exact = Decoder(spec, GGUFWeights(GGUFFile(q), "f32", qk_heads=qk, quantized=False)).forward(LONG_PROMPT)
    assert rel_err(ours, exact) < 1e-4
    (ref,) = llamacpp.logits(q, [LONG_PROMPT])
    ref = ref[:, :ours.shape[1]]
    # llama.cpp's products round each activation row to 8 bits (q8_0 / q8_K blocks) and its F16 step
    # weights round the step to half precision; through 3-4 layers of random weights that moves its
    # logits by 1-10 % from the exact ones (measured 0.4-10 %, Jamba's Q4_K_M the most).
    assert rel_err(ours, ref) < 0.15
    # Top-1: the same token at every position, except where llama.cpp's own top two are closer than
    # twice the two implementations' rms difference over the prompt.
    mine, theirs = ours.argmax(1), ref.argmax(1)
    rows = np.arange(len(mine))
    margin = ref[rows, theirs] - ref[rows, mine]
    noise = np.sqrt(np.mean((ours - ref) ** 2))
    assert np.all((mine == theirs) | (margin <= 2 * noise)), (np.nonzero(mine != theirs), margin, noise)
    assert (mine == theirs).sum() >= len(mine) - 3
    # decoding token by token through the recurrent state gives the whole prompt's logits
    cache = model.decoder.new_cache()
    steps = np.concatenate([model.decoder.forward([t], cache) for t in LONG_PROMPT])
    assert np.abs(steps - ours).max() <= 1e-3 * np.abs(ours).max()


def test_every_ssm_gguf_architecture_has_a_case():
    from ster_py.families import FAMILIES_BY_GGUF_ARCH

    declared = {arch for arch, f in FAMILIES_BY_GGUF_ARCH.items() if f.recurrent in ("mamba", "mamba2")}
    assert declared == set(GGUF_CASES)


def test_gguf_per_layer_arrays_choose_the_layers(ssm_gguf):
    """head_count_kv (and Nemotron-H's feed_forward_length) arrays decide each layer's mixer, as
    llama.cpp's graph does; Granite 4.0's file switches rotation off."""
    kinds = {name: [(layer.mixer, layer.ffn) for layer in load_model(str(ssm_gguf[name][0])).spec.layers]
             for name in ("jamba", "granitehybrid", "nemotron_h", "nemotron_h_moe")}
    assert kinds["jamba"] == [("mamba", "moe"), ("attention", "dense"), ("mamba", "moe"), ("attention", "dense")]
    assert kinds["granitehybrid"] == [("mamba2", "moe"), ("attention", "moe"), ("mamba2", "moe"), ("mamba2", "moe")]
    assert kinds["nemotron_h"] == [("mamba2", "none"), ("attention", "none"), ("mamba2", "none"), ("none", "dense")]
    assert kinds["nemotron_h_moe"] == [("mamba2", "none"), ("attention", "none"), ("mamba2", "none"), ("none", "moe")]
    assert all(layer.rope is None for layer in load_model(str(ssm_gguf["granitehybrid"][0])).spec.layers)
