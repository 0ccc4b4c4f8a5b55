"""Delta-rule linear attention (issue 15, part B2): the gated delta net (Qwen3-Next, Qwen3.5, OLMo
Hybrid) and Kimi Delta Attention (Kimi-Linear) against transformers, the delta-rule kernel against
its numpy reference, llama.cpp's GGUF files of them, and prompt reuse for hybrids.

Kernel: ``ster_py._kernels.delta.delta_rule`` against ``delta.delta_rule_reference`` on random
shapes and odd lengths (grouped and tiled key heads, one decay per head or per key channel, strided
inputs), at 1 and 2 threads, AVX2 and portable loops, in one call and carried across calls; the
reference against the torch functions transformers runs (``torch_recurrent_gated_delta_rule``,
``torch_chunk_gated_delta_rule``, ``chunk_kimi_delta_attention``), and the Kimi mixer's safe gate
against GLM-5-Next's ``Glm5NextTextLinearAttention``, whose forget gate has it.

Families: a checkpoint made here with transformers (hidden 64, 4 layers mixing both layer kinds,
state sizes small but above one, fewer key heads than value heads where the family allows it,
every weight redrawn, ``tiny.build_checkpoint``), checked as test_parity_ssm checks its families
(``check_ssm``): logits within 1e-4 of transformers on a 16-token prompt longer than every
convolution, hidden states, the prompt in two prefill calls and token by token equal to one call
with the same recurrent state, 16 greedy tokens as transformers decodes through its own cache, no
tensor left unread (the states compared by their largest difference against their largest entry,
1e-5, as float32 products over different lengths round differently). Then the Qwen3.5 wrappers, the switches (attn_output_gate, OLMo's null
rope_theta, its doubled write strength), the refusals seed 002 names, adapters refused, capture.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ster_py.decoder import delta as delta_mod
from ster_py.decoder._fast import delta as delta_kernels
from ster_py.errors import SterError
from ster_py.families import FAMILIES, gate
from ster_py.load import load_model
from ster_py.generate import Sampling, generate
from test_parity_ssm import PROMPT, SPLIT, VOCAB, reference_greedy, reference_greedy_prefill
from tiny import build_checkpoint as build
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)
from tiny import reference_logits, rel_err

# the dequantized model's sums for a GGUF's prompt (conftest.quantized_tiles_off)
pytestmark = pytest.mark.usefixtures("quantized_tiles_off")

# ----------------------------------------------------------------------------- the kernel

needs_kernels = pytest.mark.skipif(delta_kernels is None, reason="ster_py._kernels.delta is not built")


@pytest.fixture(params=["simd", "portable"])
def simd(request):
    """Each kernel test runs the AVX2/FMA loop (where the CPU has it) and the portable one."""
    delta_kernels.set_simd(request.param == "simd")
    yield request.param
    delta_kernels.set_simd(True)


def _rows(rng, T, C, wide=0, scale=1.0):
    """float32 [T, C] whose rows are contiguous but strided (a column slice of a wider array) when wide."""
    a = (rng.standard_normal((T, C + wide)) * scale).astype(np.float32)
    return a[:, wide // 2: wide // 2 + C] if wide else a


def _delta_inputs(rng, T, Hk, Hv, K, V, per_channel, wide):
    q = _rows(rng, T, Hk * K, wide)
    k = _rows(rng, T, Hk * K, wide)
    q, k = delta_mod.l2_heads(q, Hk, 1e-6) * np.float32(K ** -0.5), delta_mod.l2_heads(k, Hk, 1e-6)
    v = _rows(rng, T, Hv * V, wide)
    decay = np.exp(-np.abs(_rows(rng, T, Hv * (K if per_channel else 1), wide, 0.5)))
    beta = delta_mod.sigmoid(_rows(rng, T, Hv, wide)) * np.float32(1.5)
    state = rng.standard_normal((Hv, V, K)).astype(np.float32)
    return q, k, v, decay, beta, state


@needs_kernels
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("T,Hk,Hv,K,V,per_channel,kv_map,wide", [
    (1, 1, 1, 8, 8, False, "grouped", 0), (17, 2, 6, 16, 12, False, "grouped", 3), (9, 2, 6, 16, 12, False, "tiled", 0),
    (23, 4, 4, 33, 7, True, "grouped", 2), (5, 3, 3, 1, 9, True, "grouped", 0), (31, 2, 4, 64, 64, False, "tiled", 1),
    (2, 16, 16, 128, 128, False, "grouped", 0), (11, 1, 3, 9, 130, True, "tiled", 0)])
def test_delta_rule_kernel_equals_reference(T, Hk, Hv, K, V, per_channel, kv_map, wide, threads, simd):
    rng = np.random.default_rng(T * 1000 + Hv * 10 + K)
    q, k, v, decay, beta, state = _delta_inputs(rng, T, Hk, Hv, K, V, per_channel, wide)
    ref, ref_state = delta_mod.delta_rule_reference(q, k, v, decay, beta, state, kv_map)
    for cuts in ([], [T // 2] if T > 1 else [], list(range(1, T))):
        st, pieces = state.copy(), []
        for a, e in zip([0] + cuts, cuts + [T]):
            out = np.empty((e - a, Hv * V), np.float32)
            delta_kernels.delta_rule(q[a:e], k[a:e], v[a:e], decay[a:e], beta[a:e], st, out,
                                     1 if kv_map == "tiled" else 0, threads)
            pieces.append(out)
        np.testing.assert_allclose(np.concatenate(pieces), ref, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(st, ref_state, rtol=2e-5, atol=2e-5)
    if kv_map == "grouped" and Hk != Hv:  # the head map matters: the tiled one reads other keys
        other, _ = delta_mod.delta_rule_reference(q, k, v, decay, beta, state, "tiled")
        assert np.abs(other - ref).max() > 1e-3


@needs_kernels
def test_delta_rule_kernel_refuses_bad_shapes():
    rng = np.random.default_rng(0)
    q, k, v, decay, beta, state = _delta_inputs(rng, 3, 2, 4, 8, 8, False, 0)
    out = np.empty((3, 32), np.float32)
    with pytest.raises(ValueError, match="state"):
        delta_kernels.delta_rule(q, k, v, decay, beta, state[:, :, :4], out)
    with pytest.raises(ValueError, match="value heads"):
        delta_kernels.delta_rule(q, k, v, decay, beta, np.zeros((3, 8, 8), np.float32), np.empty((3, 24), np.float32))
    with pytest.raises(ValueError, match="decay"):
        delta_kernels.delta_rule(q, k, v, decay[:, :3], beta, state, out)
    with pytest.raises(ValueError, match="beta"):
        delta_kernels.delta_rule(q, k, v, decay, beta[:2], state, out)


def test_reference_equals_the_functions_transformers_runs():
    """The numpy delta rule (state kept [V, K] per head) against transformers' own torch fallbacks:
    Qwen3-Next's recurrent and chunked gated delta rules (fewer key heads than value heads, an
    initial state, L2 norms in the kernel) and Kimi's chunked per-channel rule."""
    import torch
    from transformers.models.glm5_next.modeling_glm5_next import chunk_kimi_delta_attention
    from transformers.models.qwen3_next.modeling_qwen3_next import (torch_chunk_gated_delta_rule,
                                                                     torch_recurrent_gated_delta_rule)

    rng = np.random.default_rng(0)
    T, Hk, Hv, K, V = 21, 2, 6, 8, 12
    q, k = (rng.standard_normal((T, Hk, K)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((T, Hv, V)).astype(np.float32)
    g = -np.abs(rng.standard_normal((T, Hv))).astype(np.float32)
    beta = delta_mod.sigmoid(rng.standard_normal((T, Hv)).astype(np.float32))
    state = rng.standard_normal((Hv, K, V)).astype(np.float32)  # transformers' [H, K, V]
    t = torch.tensor
    qn = delta_mod.l2_heads(q.reshape(T, -1), Hk, 1e-6) * np.float32(K ** -0.5)
    kn = delta_mod.l2_heads(k.reshape(T, -1), Hk, 1e-6)
    ours, final = delta_mod.delta_rule_reference(qn, kn, v.reshape(T, -1), np.exp(g), beta,
                                                 state.transpose(0, 2, 1).copy())
    for fn, extra in ((torch_recurrent_gated_delta_rule, {}), (torch_chunk_gated_delta_rule, {"chunk_size": 8})):
        ref, ref_final = fn(t(q[None]), t(k[None]), t(v[None]), g=t(g[None]), beta=t(beta[None]),
                            initial_state=t(state[None]), output_final_state=True, use_qk_l2norm_in_kernel=True,
                            **extra)
        np.testing.assert_allclose(ours, ref[0].reshape(T, -1).numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(final, ref_final[0].numpy().transpose(0, 2, 1), rtol=1e-4, atol=1e-5)

    H, D = 3, 8
    q, k, v = (rng.standard_normal((T, H, D)).astype(np.float32) for _ in range(3))
    g = -np.abs(rng.standard_normal((T, H, D))).astype(np.float32) * np.float32(0.3)
    beta = delta_mod.sigmoid(rng.standard_normal((T, H)).astype(np.float32))
    state = rng.standard_normal((H, D, D)).astype(np.float32)
    ref, ref_final = chunk_kimi_delta_attention(t(q[None]), t(k[None]), t(v[None]), g=t(g[None]), beta=t(beta[None]),
                                                chunk_size=8, initial_state=t(state[None]), output_final_state=True,
                                                use_qk_l2norm_in_kernel=True)
    qn = delta_mod.l2_heads(q.reshape(T, -1), H, 1e-6) * np.float32(D ** -0.5)
    kn = delta_mod.l2_heads(k.reshape(T, -1), H, 1e-6)
    ours, final = delta_mod.delta_rule_reference(qn, kn, v.reshape(T, -1), np.exp(g.reshape(T, -1)), beta,
                                                 state.transpose(0, 2, 1).copy())
    np.testing.assert_allclose(ours, ref[0].reshape(T, -1).numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(final, ref_final[0].numpy().transpose(0, 2, 1), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("lower_bound", [None, -3.0])
def test_kda_mixer_equals_glm5_next_linear_attention(lower_bound):
    """Kimi Delta Attention with and without the safe gate (lower_bound * sigmoid(exp(A_log) * (f +
    dt_bias))) against GLM-5-Next's mixer, the transformers module that has it: a prompt in one call
    and in two, and the state it leaves."""
    import torch
    from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig
    from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextLinearAttention
    from transformers.cache_utils import DynamicCache

    from ster_py.decoder.cache import KVCache
    from ster_py.decoder.delta import DeltaSpec
    from ster_py.decoder.kda import KimiDeltaAttention

    torch.manual_seed(0)
    cfg = Glm5NextTextConfig(hidden_size=32, linear_num_heads=2, linear_head_dim=8, linear_conv_kernel_dim=3,
                             linear_lower_bound=lower_bound, rms_norm_eps=1e-5, num_hidden_layers=1,
                             layer_types=["linear_attention"])
    mod = Glm5NextTextLinearAttention(cfg, 0).eval()
    with torch.no_grad():
        for name, p in mod.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.ndim > 1 else 0.5) + (1.0 if "norm" in name else 0.0))
    x = np.random.default_rng(1).standard_normal((13, 32)).astype(np.float32)
    with torch.no_grad():
        ref = mod(torch.tensor(x[None]))[0].numpy()
    w = {n: p.detach().numpy() for n, p in mod.named_parameters()}
    roles = {"lin_q": "q_proj.weight", "lin_k": "k_proj.weight", "lin_v": "v_proj.weight", "lin_b": "b_proj.weight",
             "lin_conv": "conv1d.weight", "lin_f_a": "forget_gate.f_a_proj.weight",
             "lin_f_b": "forget_gate.f_b_proj.weight", "lin_dt_bias": "forget_gate.dt_bias",
             "lin_a_log": "forget_gate.A_log", "lin_g_a": "g_a_proj.weight", "lin_g_b": "g_b_proj.weight",
             "lin_norm": "o_norm.weight", "lin_out": "o_proj.weight"}

    def load(role, kind="weight", required=False):
        return w.get(roles.get(role)) if kind != "bias" else None

    spec = DeltaSpec("kda", 2, 8, 2, 8, 3, norm_eps=1e-5, gate_act="sigmoid", safe_gate=lower_bound is not None,
                     lower_bound=lower_bound or -5.0)

    class Spec:
        delta = spec

    mixer = KimiDeltaAttention(Spec, 0, load, None)
    for cuts in ([13], [6, 13]):
        cache = KVCache(1, 1, 1, slots=[mixer.new_slot()])
        ours = np.concatenate([mixer(x[a:e], cache, None) for a, e in zip([0] + cuts[:-1], cuts)])
        assert rel_err(ours, ref) < 1e-5
    cache_ref = DynamicCache(config=cfg)
    with torch.no_grad():
        mod(torch.tensor(x[None]), cache=cache_ref)
    final = cache_ref.layers[0].recurrent_states[0][0].numpy()  # [H, K, V]
    np.testing.assert_allclose(cache.slot(0)["ssm"], final.transpose(0, 2, 1), rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- families

ATTN = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=64)
# fewer key heads than value heads (grouped), keys and values of different widths
LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12,
              linear_conv_kernel_dim=4)
QWEN_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)
KIMI = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=4,
            num_hidden_layers=4, kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=4,
            v_head_dim=8, num_experts=4, num_experts_per_token=2, moe_intermediate_size=32, num_shared_experts=1,
            linear_attn_config={"num_heads": 2, "head_dim": 16, "short_conv_kernel_size": 3, "kda_layers": [1, 2, 4],
                                "full_attn_layers": [3]})

CASES = {
    "qwen3_next": ("qwen3_next", dict(ATTN, num_hidden_layers=4, **QWEN_MOE, **LINEAR)),
    "qwen3_next-interval-dense-layer-no-renorm": ("qwen3_next", dict(
        ATTN, num_hidden_layers=4, full_attention_interval=2, mlp_only_layers=[1], norm_topk_prob=False,
        **dict(QWEN_MOE, num_experts=6, num_experts_per_tok=3), **dict(LINEAR, linear_conv_kernel_dim=3))),
    "qwen3_5_text": ("qwen3_5_text", dict(ATTN, num_hidden_layers=4, **LINEAR)),
    "qwen3_5_text-equal-heads-tied": ("qwen3_5_text", dict(
        ATTN, num_hidden_layers=5, tie_word_embeddings=True,
        layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"],
        **dict(LINEAR, linear_num_key_heads=3, linear_num_value_heads=3, linear_value_head_dim=8))),
    "qwen3_5_moe_text": ("qwen3_5_moe_text", dict(ATTN, num_hidden_layers=4, **QWEN_MOE, **LINEAR)),
    "olmo_hybrid": ("olmo_hybrid", dict(ATTN, num_hidden_layers=4, **LINEAR)),
    "olmo_hybrid-defaults-positive-beta": ("olmo_hybrid", dict(ATTN, num_hidden_layers=5, num_key_value_heads=4,
                                                               linear_allow_neg_eigval=False)),
    "kimi_linear": ("kimi_linear", dict(KIMI)),
    "kimi_linear-grouped-router-two-dense": ("kimi_linear", dict(
        KIMI, num_hidden_layers=5, num_experts=8, num_expert_group=2, topk_group=1, routed_scaling_factor=1.5,
        moe_renormalize=False, mlp_layer_types=["dense", "dense", "sparse", "sparse", "sparse"],
        linear_attn_config=dict(KIMI["linear_attn_config"], kda_layers=[1, 3, 4], full_attn_layers=[2, 5]))),
    # Transformers' KimiLinear ties no weights: its lm_head is read whatever tie_word_embeddings says
    "kimi_linear-tied-in-name-only": ("kimi_linear", dict(KIMI, tie_word_embeddings=True)),
}
def _states(cache, spec) -> list[np.ndarray]:
    """The recurrent states of the cache's layers (not the latent layers' rows)."""
    return [cache.slot(i)[name] for i in range(spec.num_hidden_layers) if hasattr(cache.slot(i), "names")
            for name in cache.slot(i).names()]


def check_delta(path, ref_model, greedy=reference_greedy):
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
    for ours_h, ref_h in zip(hidden[:-1], ref_hidden[:-1]):  # the last one transformers lists normed
        assert rel_err(ours_h, ref_h) < 1e-4
    split = dec.new_cache()
    pieces = np.concatenate([dec.forward(PROMPT[:SPLIT], split), dec.forward(PROMPT[SPLIT:], split)])
    steps = dec.new_cache()
    one_by_one = np.concatenate([dec.forward([t], steps) for t in PROMPT])
    for other, cache in ((pieces, split), (one_by_one, steps)):
        assert rel_err(other, logits) < 1e-5
        assert cache.length == whole.length == len(PROMPT)
        for a, b in zip(_states(cache, model.spec), _states(whole, model.spec)):
            # 2e-5: the chunked (prefill) and one-token (recurrent) updates sum in different orders; on an
            # AMD EPYC Zen 5 olmo_hybrid's state moved 1.2e-5 of its largest entry (numpy's exp / log
            # dispatch differs by CPU), 1e-5 had passed elsewhere
            assert np.abs(a - b).max() <= 2e-5 * np.abs(b).max()
    assert whole.nbytes_fixed() == model.spec.state_bytes() > 0
    assert generate(dec, PROMPT, Sampling(max_new_tokens=16)).ids == greedy(ref_model, PROMPT, 16)
    assert dec._weights.unused_tensors(model.spec) == []
    return model


#: Where transformers 5.24's cached decoding is not its own prefill, the greedy reference is its prefill
#: (none so far: its delta-rule caches carry the convolution and the state as its prefill leaves them).
PREFILL_GREEDY: set[str] = set()


@pytest.mark.parametrize("case", list(CASES))
def test_family_matches_transformers(case, tmp_path):
    model_type, config = CASES[case]
    ref_model = build(tmp_path, model_type, config)
    model = check_delta(tmp_path, ref_model, reference_greedy_prefill if case in PREFILL_GREEDY else reference_greedy)
    assert model.spec.delta is not None and model.spec.ssm is None
    mixers = {layer.mixer for layer in model.spec.layers}
    assert mixers & {"gated_delta", "kda"} and len(mixers) > 1, mixers  # hybrids mix layer kinds
    assert model.decoder.new_cache().nbytes_per_position() > 0  # the attention layers keep keys and values


def test_every_delta_family_has_a_case():
    import test_parity_remote_c  # group R2's Ling 3.0

    ours = {name for name, f in FAMILIES.items() if f.recurrent in ("gated_delta", "kda")
            and f.streams is None}  # GLM-5-Next (under hyper-connections): test_parity_hc
    assert ours == {model_type for model_type, _ in CASES.values()} | {
        model_type for model_type, _ in test_parity_remote_c.HYBRID_CASES.values()}


def test_layer_kinds_norms_and_state_shapes(tmp_path):
    """Each family's layer kinds, OLMo Hybrid's per-kind norms, the state slots' shapes ([Hv, V, K]) and
    the bytes ster inspect reports."""
    from ster_py.inspect import inspect_model

    build(tmp_path / "n", *CASES["qwen3_next-interval-dense-layer-no-renorm"])
    spec = load_model(str(tmp_path / "n")).spec
    assert [(layer.mixer, layer.ffn) for layer in spec.layers] == [
        ("gated_delta", "moe"), ("attention", "dense"), ("gated_delta", "moe"), ("attention", "moe")]
    assert all((layer.rope is None) == (layer.mixer != "attention") for layer in spec.layers)
    build(tmp_path / "o", *CASES["olmo_hybrid"])
    model = load_model(str(tmp_path / "o"))
    assert [model.spec.layer_norms(i) for i in range(4)] == [("attn_norm", "ffn_norm")] * 3 + [
        ("attn_post_norm", "ffn_post_norm")]
    assert model.spec.delta.beta_scale == 2.0 and model.spec.delta.norm_eps == 1e-5
    cache = model.decoder.new_cache()
    shapes = {n: cache.slot(0)[n].shape for n in cache.slot(0).names()}
    assert shapes == {"conv": (3, 2 * 16 + 48), "ssm": (4, 12, 8)} and cache.slot(3) is None
    per_layer = 4 * (3 * 80 + 4 * 12 * 8)
    assert cache.nbytes_fixed() == 3 * per_layer
    info = inspect_model(str(tmp_path / "o"))
    assert info["state_bytes_per_sequence"] == 3 * per_layer
    assert info["kv_bytes_per_position"] == 4 * 2 * 2 * 16  # one attention layer, 2 kv heads of 16, f32
    build(tmp_path / "k", *CASES["kimi_linear-grouped-router-two-dense"])
    spec = load_model(str(tmp_path / "k")).spec
    assert [(layer.mixer, layer.ffn) for layer in spec.layers] == [
        ("kda", "dense"), ("latent", "dense"), ("kda", "moe"), ("kda", "moe"), ("latent", "moe")]
    assert all(layer.rope is None for layer in spec.layers)  # Kimi's latent attention does not rotate
    assert spec.moe.router.n_group == 2 and not spec.moe.router.renormalize and spec.moe.router.scale == 1.5


def _wrapped(tmp_path, wrapper: str, text_type: str, text: dict):
    """A qwen3_5 / qwen3_5_moe checkpoint (ForConditionalGeneration) with a tiny vision tower; returns its
    text model (Qwen3_5ForCausalLM-like: the wrapper's language model and head)."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from tiny import write_tokenizer

    torch.manual_seed(0)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=14,
                  temporal_patch_size=2, spatial_merge_size=2, in_channels=3)
    cfg = AutoConfig.for_model(wrapper, text_config=dict(text, model_type=text_type, bos_token_id=1, eos_token_id=2,
                                                         pad_token_id=0), vision_config=vision)
    model = AutoModelForImageTextToText.from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.15 if p.ndim > 1 else 0.1) + (1.0 if name.endswith("norm.weight")
                                                                              and "linear_attn" in name else 0.0))
    model.save_pretrained(tmp_path)
    write_tokenizer(tmp_path, VOCAB)
    return model


@pytest.mark.parametrize("wrapper,text_type,case", [("qwen3_5", "qwen3_5_text", "qwen3_5_text"),
                                                    ("qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5_moe_text")])
def test_qwen3_5_wrappers_run_their_text_decoder(wrapper, text_type, case, tmp_path):
    """A qwen3_5 / qwen3_5_moe checkpoint runs the decoder its text_config describes, read from below
    model.language_model (the head at the root); its vision tower is never read."""
    import torch

    model = _wrapped(tmp_path, wrapper, text_type, CASES[case][1])
    loaded = load_model(str(tmp_path))
    assert loaded.spec.model_type == text_type
    assert loaded.spec.names["lin_qkv"].startswith("model.language_model.layers.")
    assert loaded.spec.names["head"] == "lm_head"
    with torch.no_grad():  # the wrapper's forward on text alone
        ref = model(torch.tensor([PROMPT])).logits[0].numpy()
    assert rel_err(loaded.decoder.forward(PROMPT), ref) < 1e-4
    assert loaded.decoder._weights.unused_tensors(loaded.spec) == []
    names = set(loaded.decoder._weights.names())
    assert any(n.startswith("model.visual.") for n in names)  # there, and not read


def test_qwen3_5_without_attention_output_gate(tmp_path):
    """attn_output_gate false (seed 002): q_proj holds only the queries and attention's output is not
    gated. Transformers 5.24 always gates, so the reference is its model with the gate rows zeroed (a
    gate of sigmoid(0) = 1/2) and ster's checkpoint has o_proj halved instead."""
    import torch
    from safetensors.numpy import load_file, save_file

    model_type, config = CASES["qwen3_5_text"]
    ref_model = build(tmp_path, model_type, config)
    heads, d = config["num_attention_heads"], config["head_dim"]
    with torch.no_grad():
        for layer in ref_model.model.layers:
            if hasattr(layer, "self_attn"):
                q = layer.self_attn.q_proj.weight.view(heads, 2, d, -1)
                q[:, 1] = 0.0
    ref = reference_logits(ref_model, PROMPT)[0]
    tensors = load_file(str(tmp_path / "model.safetensors"))
    for name in list(tensors):
        if name.endswith("self_attn.q_proj.weight"):
            tensors[name] = np.ascontiguousarray(tensors[name].reshape(heads, 2, d, -1)[:, 0].reshape(heads * d, -1))
        if name.endswith("self_attn.o_proj.weight"):
            tensors[name] = tensors[name] * np.float32(0.5)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, attn_output_gate=False)))
    loaded = load_model(str(tmp_path))
    assert loaded.spec.attn_gate is None and not loaded.spec.attn_gate_in_q
    assert rel_err(loaded.decoder.forward(PROMPT), ref) < 1e-4


def test_olmo_hybrid_null_rope_theta_leaves_attention_unrotated(tmp_path):
    """OLMo Hybrid rotates only when rope_parameters states a rope_theta: a null one is no rotation, as
    Transformers reads it (a config without rope_parameters gets its default base, and rotates)."""
    model_type, config = CASES["olmo_hybrid"]
    ref_model = build(tmp_path, model_type, dict(config, rope_parameters={"rope_type": "default", "rope_theta": None}))
    assert ref_model.model.rotary_emb is None
    model = check_delta(tmp_path, ref_model)
    assert all(layer.rope is None for layer in model.spec.layers)


REFUSED = {  # model_type, config, what the message names
    "qwen3_next-no-layer-kinds": ("qwen3_next", dict(num_hidden_layers=4, **LINEAR), "full_attention_interval"),
    "qwen3_next-layer-type": ("qwen3_next", dict(num_hidden_layers=2, layer_types=["linear_attention", "hybrid"],
                                                 **LINEAR), "layer type other than linear_attention"),
    "qwen3_next-size": ("qwen3_next", dict(num_hidden_layers=4, full_attention_interval=4,
                                           **{k: v for k, v in LINEAR.items() if k != "linear_key_head_dim"}),
                        "linear_key_head_dim"),
    "qwen3_5-size": ("qwen3_5_text", dict(layer_types=["full_attention"], linear_num_key_heads=2), "linear-attention size"),
    "qwen3_5_moe-norm": ("qwen3_5_moe_text", dict(layer_types=["full_attention"], norm_topk_prob=False, **LINEAR),
                         "norm_topk_prob false"),
    "kimi-no-rank": ("kimi_linear", {k: v for k, v in KIMI.items() if k != "kv_lora_rank"}, "kv_lora_rank"),
    "kimi-no-linear-config": ("kimi_linear", {k: v for k, v in KIMI.items() if k != "linear_attn_config"},
                              "without linear_attn_config"),
    "kimi-size": ("kimi_linear", dict(KIMI, linear_attn_config={"num_heads": 2, "head_dim": 16, "kda_layers": [1]}),
                  "short_conv_kernel_size"),
    "kimi-layer-outside": ("kimi_linear", dict(KIMI, linear_attn_config=dict(KIMI["linear_attn_config"],
                                                                             kda_layers=[1, 2, 5])), "outside layers"),
    "kimi-layer-zero": ("kimi_linear", dict(KIMI, linear_attn_config=dict(KIMI["linear_attn_config"],
                                                                          kda_layers=[0, 1])), "counted from one"),
    "kimi-router": ("kimi_linear", dict(KIMI, moe_router_activation_func="softmax"), "moe_router_activation_func"),
    "kimi-rope": ("kimi_linear", dict(KIMI, mla_use_nope=False), "mla_use_nope"),
    "kimi-safe-gate": ("kimi_linear", dict(KIMI, linear_attn_config=dict(KIMI["linear_attn_config"],
                                                                         gate_lower_bound=-5.0)), "gate_lower_bound"),
}


@pytest.mark.parametrize("key", list(REFUSED))
def test_refused_configurations(key, tmp_path):
    model_type, config, match = REFUSED[key]
    with pytest.raises(SterError, match=match):
        gate({"model_type": model_type, **config}, tmp_path / "config.json")


def test_refusal_comes_before_any_weight(tmp_path):
    from tiny import write_tokenizer

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "kimi_linear", "num_hidden_layers": 2}))
    write_tokenizer(tmp_path)
    with pytest.raises(SterError, match="kv_lora_rank"):
        load_model(str(tmp_path))


def test_adapters_refused_and_capture_works(tmp_path):
    """Seed 002: adapter training is refused on these families (their linear-attention layers have no
    attention projection to adapt); the residual stream is captured as transformers lists it."""
    from ster_py.adapters import load_adapter_for
    from ster_py.capture import capture
    from test_parity_ssm import _write_adapter

    ref = build(tmp_path / "q", *CASES["qwen3_next-interval-dense-layer-no-renorm"])
    loaded = load_model(str(tmp_path / "q"))
    for target, out in (("up", 96), ("q", 64)):
        with pytest.raises(SterError, match="state-space"):
            load_adapter_for(_write_adapter(tmp_path / f"a-{target}", tmp_path / "q", target, 64, out), loaded)
    _, ref_hidden = reference_logits(ref, PROMPT)
    cap = capture(loaded, [" ".join(f"w{i}" for i in PROMPT)], [0, 1], "all", chat_template="off")
    for layer in (0, 1):  # after a delta-net layer and after an attention layer
        assert rel_err(cap.rows(layer), ref_hidden[layer + 1][-len(PROMPT):]) < 1e-5


# ----------------------------------------------------------------------------- GGUF, via llama.cpp
#
# llama.cpp's converter on the same kinds of model, 256 wide so that the products really are Q4_K, keys
# as wide as values (llama.cpp's delta rule requires it), weights scaled as test_parity_ssm's ``_wide``
# does (its decisive routing names none of these routers: made decisive that way, the embedding's
# router features swamped the normed stream and the quantized files disagreed more), each delta-rule
# layer's keys aligned with its queries (``align_keys``). The Qwen checkpoints have no multi-token-prediction block (converted
# with --no-mtp); Kimi-Linear's is written as its release stores it (dense layers below mlp) with the
# router activation its hub config states (the converter writes expert_gating_func from it, and
# llama.cpp's kimi-linear loader requires that key). llama.cpp's converter writes no OLMo Hybrid file.

WIDE_ATTN = dict(vocab_size=VOCAB, hidden_size=256, max_position_embeddings=64, intermediate_size=256,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64)
WIDE_LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64,
                   linear_conv_kernel_dim=4)
WIDE_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=256, shared_expert_intermediate_size=256)
NO_MTP = {"_llamacpp_args": ["--no-mtp"]}
GGUF_CASES = {  # name: (model_type, config, legacy config.json keys)
    "qwen35": ("qwen3_5_text", dict(WIDE_ATTN, num_hidden_layers=4, **WIDE_LINEAR), NO_MTP),
    "qwen35moe": ("qwen3_5_moe_text", dict(WIDE_ATTN, num_hidden_layers=4, **WIDE_LINEAR, **WIDE_MOE), NO_MTP),
    "qwen3next": ("qwen3_next", dict(WIDE_ATTN, num_hidden_layers=4, full_attention_interval=2, **WIDE_LINEAR,
                                     **WIDE_MOE), NO_MTP),
    "kimi-linear": ("kimi_linear", dict(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=256, num_attention_heads=4, num_key_value_heads=4,
        num_hidden_layers=4, kv_lora_rank=64, q_lora_rank=None, qk_nope_head_dim=32, qk_rope_head_dim=32,
        v_head_dim=64, num_experts=4, num_experts_per_token=2, moe_intermediate_size=256, num_shared_experts=1,
        linear_attn_config={"num_heads": 4, "head_dim": 64, "short_conv_kernel_size": 4, "kda_layers": [1, 2, 4],
                            "full_attn_layers": [3]}),
                    {"first_k_dense_replace": 1, "moe_router_activation_func": "sigmoid"}),
}
LONG_PROMPT = np.random.RandomState(3).randint(3, VOCAB, size=32).tolist()


def kimi_hub_layout(path) -> None:
    """Kimi-Linear's checkpoint as its release stores it: the dense layers' feed-forward below mlp
    (Transformers 5 writes every feed-forward below block_sparse_moe)."""
    from safetensors.numpy import load_file, save_file

    f = path / "model.safetensors"
    tensors = load_file(str(f))
    dense = ("block_sparse_moe.gate_proj.", "block_sparse_moe.up_proj.", "block_sparse_moe.down_proj.")
    save_file({(k.replace("block_sparse_moe.", "mlp.") if any(d in k for d in dense) else k): v
               for k, v in tensors.items()}, str(f), metadata={"format": "pt"})


def align_keys(model, model_type, config) -> None:
    """Each delta-rule layer's key projection (and key convolution) made its query's plus 0.3 of its
    own, so that a query reads the key it came with: of random, unrelated q and k the read-out
    S·q is a cancellation (|k·q| ≈ |k||q|/√K) which the output's RMS norm scales back up, so a weight
    rounded by 0.4 % (Q8_0) moved the logits by 10-37 % (measured) and no top-1 comparison means
    anything; aligned, k·q ≈ |k||q|. Keys still differ from queries (a swap of the two is caught)."""
    import torch

    hk, k_dim = config["linear_num_key_heads"], config["linear_key_head_dim"]
    group = (2 * k_dim + 2 * config["linear_value_head_dim"] * config["linear_num_value_heads"] // hk)
    with torch.no_grad():
        for layer in model.model.layers:
            mixer = getattr(layer, "linear_attn", None)
            if mixer is None:
                continue
            n = hk * k_dim
            conv = mixer.conv1d.weight  # channels [q, k, v] in both layouts
            conv[n:2 * n] = conv[:n] + 0.3 * conv[n:2 * n]
            if model_type == "qwen3_next":  # in_proj_qkvz: per key head [q, k, v, z]
                w = mixer.in_proj_qkvz.weight.view(hk, group, -1)
                w[:, k_dim:2 * k_dim] = w[:, :k_dim] + 0.3 * w[:, k_dim:2 * k_dim]
            else:  # in_proj_qkv: [q, k, v]
                w = mixer.in_proj_qkv.weight
                w[n:2 * n] = w[:n] + 0.3 * w[n:2 * n]


def align_kimi_keys(model, config) -> None:
    """``align_keys`` for Kimi Delta Attention: q_proj / k_proj and the [q, k, v] channels of its convolution."""
    import torch

    lin = config["linear_attn_config"]
    n = lin["num_heads"] * lin["head_dim"]
    with torch.no_grad():
        for layer in model.model.layers:
            attn = layer.self_attn
            if hasattr(attn, "forget_gate"):
                attn.k_proj.weight.copy_(attn.q_proj.weight + 0.3 * attn.k_proj.weight)
                conv = attn.conv1d.weight
                conv[n:2 * n] = conv[:n] + 0.3 * conv[n:2 * n]


def _wide(path, model_type, config):
    from test_parity_ssm import _wide as wide

    model = wide(path, model_type, config)
    if model_type == "kimi_linear":
        align_kimi_keys(model, config)
    else:
        align_keys(model, model_type, config)
    model.save_pretrained(path)
    if model_type == "kimi_linear":
        kimi_hub_layout(path)
    return model


@pytest.fixture(scope="module")
def delta_gguf(tmp_path_factory):
    """name -> (converted F32 .gguf, transformers model) for every case of GGUF_CASES."""
    from llamacpp_convert import convert_cases

    return convert_cases(tmp_path_factory.mktemp("llama_cpp_delta"), GGUF_CASES, _wide)


# For the quantized comparison the Qwen MoE cases route every token to all four experts: a top-2 choice
# flips where rounding reorders two router logits, a jump no implementation can agree on (measured:
# llama.cpp's and ster's logits 15-25 % apart at Q8_0 with top-2, 5-6 % with every expert). Selection and
# llama.cpp's renormalisation are checked by the F32 files above.
QUANT_CASES = {name: (model_type, dict(config, num_experts_per_tok=config["num_experts"]), legacy)
               for name, (model_type, config, legacy) in GGUF_CASES.items() if name in ("qwen35moe", "qwen3next")}


@pytest.fixture(scope="module")
def delta_gguf_quant(tmp_path_factory, delta_gguf):
    """GGUF_CASES as converted for the quantized tests: QUANT_CASES' own conversions, delta_gguf's for the rest."""
    from llamacpp_convert import convert_cases

    return {**delta_gguf, **convert_cases(tmp_path_factory.mktemp("llama_cpp_delta_q"), QUANT_CASES, _wide)}


@pytest.mark.parametrize("name", list(GGUF_CASES))
def test_gguf_matches_transformers(name, delta_gguf):
    from ster_py import llamacpp
    from ster_py.gguf.reader import GGUFFile

    path, ref_model = delta_gguf[name]
    assert GGUFFile(path).architecture == name  # the architecture llama.cpp's converter chose
    model = load_model(str(path))
    assert model.spec.delta is not None
    assert model.spec.delta.kv_map == ("tiled" if name in ("qwen35", "qwen35moe") else "grouped")
    ours = model.decoder.forward(PROMPT)
    err = rel_err(ours, reference_logits(ref_model, PROMPT)[0])
    assert err < 1e-3, f"logits rel err {err:.2e}"
    (ref,) = llamacpp.logits(path, [PROMPT])  # and llama.cpp reads the file as ster does
    assert rel_err(ours, ref[:, :ours.shape[1]]) < 1e-3
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:SPLIT], cache), model.decoder.forward(PROMPT[SPLIT:], cache)])
    assert rel_err(pieces, ours) < 1e-5
    assert model.decoder._weights.unused_tensors(model.spec) == []
    hf = load_model(str(path.parent / "hf" / name)).spec
    assert [(layer.mixer, layer.ffn) for layer in model.spec.layers] == [(layer.mixer, layer.ffn) for layer in hf.layers]


@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_K_M"])
@pytest.mark.parametrize("name", list(GGUF_CASES))
def test_quantized_gguf_gives_llamacpps_top1(name, ftype, delta_gguf_quant, tmp_path):
    """As test_parity_ssm's quantized test: the projections stay in their blocks, ster computes exactly
    what the quantized weights define, gives llama.cpp's top-1 token at every position of a 32-token
    prompt but near-ties (the tiny random models' logits are flat: llama.cpp's 8-bit rounding of the
    activations of some thirty products moves them by 3-8 %, a top-two gap at a few positions), and decodes token by token through the recurrent state
    to the same logits."""
    from ster_py import llamacpp
    from ster_py.decoder.model import Decoder
    from ster_py.decoder.qlinear import QuantTensor
    from ster_py.gguf.reader import GGUFFile
    from ster_py.weights import GGUFWeights

    path, _ = delta_gguf_quant[name]
    q = llamacpp.quantize(path, tmp_path / f"{name}-{ftype}.gguf", ftype)
    model = load_model(str(q))
    mixers = [layer.mixer for layer in model.decoder.layers if layer.layer.mixer in ("gated_delta", "kda")]
    want = {"Q8_0"} if ftype == "Q8_0" else {"Q4_K", "Q5_K", "Q6_K"}
    outs = [m.out_proj for m in mixers]
    assert outs and all(type(o.weight) is QuantTensor and o.weight.type_name in want for o in outs)  # kept in blocks
    ours = model.decoder.forward(LONG_PROMPT)
    exact = Decoder(model.spec, GGUFWeights(GGUFFile(q), "f32", quantized=False)).forward(LONG_PROMPT)
    assert rel_err(ours, exact) < 1e-4
    (ref,) = llamacpp.logits(q, [LONG_PROMPT])
    ref = ref[:, :ours.shape[1]]
    assert rel_err(ours, ref) < 0.15  # llama.cpp rounds activations to 8 bits in its quantized products
    mine, theirs = ours.argmax(1), ref.argmax(1)
    rows = np.arange(len(mine))
    margin = ref[rows, theirs] - ref[rows, mine]
    # a top-1 differs only where llama.cpp's own top two are closer than the two implementations'
    # largest difference at that position can move them (twice it), and at no more than a quarter
    # of the positions
    reach = 2 * np.abs(ours - ref).max(axis=1)
    assert np.all((mine == theirs) | (margin <= reach)), (np.nonzero(mine != theirs), margin, reach)
    assert (mine == theirs).sum() >= 3 * len(mine) // 4, (mine, theirs)
    cache = model.decoder.new_cache()
    steps = np.concatenate([model.decoder.forward([t], cache) for t in LONG_PROMPT])
    assert np.abs(steps - ours).max() <= 1e-3 * np.abs(ours).max()


def test_every_delta_gguf_architecture_has_a_case():
    from ster_py.families import FAMILIES_BY_GGUF_ARCH

    from ster_py.families import FAMILIES
    from test_parity_remote_c_gguf import GGUF_CASES as R2_CASES  # Ling 3.0's bailingmoe3

    declared = {arch for arch, f in FAMILIES_BY_GGUF_ARCH.items() if f.recurrent in ("gated_delta", "kda")}
    r2 = {arch for arch, (model_type, _, _) in R2_CASES.items() if FAMILIES[model_type].recurrent == "kda"}
    from test_parity_hc_gguf import G5_GGUF_CASES  # GLM-5-Next's glm5-next (its text decoder's family)
    g5 = {FAMILIES[f"{model_type}_text"].gguf_arch for model_type, _, _ in G5_GGUF_CASES.values()}
    assert declared == set(GGUF_CASES) | r2 | g5


# ----------------------------------------------------------------------------- prompt reuse (item 5)
#
# A conversation as token ids: END closes each message (a chat template's end-of-turn token, passed
# as a stop id). The first turn's prompt ends in an open assistant header; the follow-up repeats
# the first turn's messages, adds the answer and a new user message.

END = 2
TURN1 = [5, 9, 14, 33, END, 7, 21, 60, 61, 62, END, 40, 41]           # system, user, "assistant:" header
TURN2_TAIL = [70, 71, 72, 73, END, 7, 88, 89, 90, 91, 92, END, 40, 41]  # answer, user, header


def _turn2(first_answer_cut):
    return TURN1[:first_answer_cut] + TURN2_TAIL


@pytest.mark.parametrize("case", ["qwen3_5_text", "kimi_linear"])
def test_prompt_reuse_restarts_from_the_last_message_and_equals_a_cold_run(case, tmp_path):
    """Seed 000's prefix reuse for hybrids: the first call checkpoints after the prompt's last
    end-of-turn token; the follow-up rolls back to it, prefills only what follows, and gives a cold
    run's tokens, its recurrent states and keys/values within float32 rounding of a cold run's."""
    from ster_py.decoder.cache import RecurrentState
    from ster_py.generate import last_turn_end
    from ster_py.prefix import PromptCache

    build(tmp_path, *CASES[case])
    dec = load_model(str(tmp_path)).decoder
    greedy = Sampling(max_new_tokens=8)
    pc = PromptCache(dec)
    first = generate(dec, TURN1, greedy, [END], cache=pc)
    cut = last_turn_end(TURN1, [END])
    assert cut == 11 and pc.cache.checkpoint_length() == cut and first.reused == 0
    assert first.ids == generate(dec, TURN1, greedy, [END]).ids  # checkpointing changes nothing

    prompt2 = _turn2(cut)
    warm = generate(dec, prompt2, greedy, [END], cache=pc)
    assert (warm.reused, warm.prefilled) == (cut, len(prompt2) - cut)  # only what follows the checkpoint
    cut2 = last_turn_end(prompt2, [END])
    assert pc.cache.checkpoint_length() == cut2  # one slot: the new checkpoint replaced the first
    cold = generate(dec, prompt2, greedy, [END])
    assert warm.ids == cold.ids
    # the state the warm run prefilled equals a cold prefill of the same prompt
    warm_cache, cold_cache = pc.cache, dec.new_cache()
    assert warm_cache.rollback(cut2)
    dec.forward(prompt2[:cut2], cold_cache)
    recurrent = [(warm_cache.slot(i), cold_cache.slot(i)) for i in range(len(dec.layers))
                 if isinstance(warm_cache.slot(i), RecurrentState)]
    assert recurrent and warm_cache.length == cold_cache.length == cut2
    for a, b in recurrent:
        for name in a.names():
            assert np.abs(a[name] - b[name]).max() <= 1e-5 * max(np.abs(b[name]).max(), 1e-30)
    tail = prompt2[cut2:] + warm.ids[:-1]
    assert rel_err(dec.forward(tail, warm_cache), dec.forward(tail, cold_cache)) < 1e-5


def test_prompt_reuse_runs_cold_when_the_prompt_or_settings_differ(tmp_path):
    from ster_py.prefix import PromptCache

    build(tmp_path, *CASES["qwen3_5_text"])
    dec = load_model(str(tmp_path)).decoder
    greedy = Sampling(max_new_tokens=4)
    pc = PromptCache(dec)
    generate(dec, TURN1, greedy, [END], cache=pc)
    other = [6] + TURN1[1:]  # another first token: shares nothing with the checkpoint
    assert generate(dec, other, greedy, [END], cache=pc).reused == 0
    assert pc.cache.checkpoint_length() == 11
    short = other[:8] + [99, 98, END, 40]  # shares 8 tokens, fewer than the checkpoint's 11: cold
    assert generate(dec, short, greedy, [END], cache=pc).reused == 0
    assert pc.cache.checkpoint_length() == 11  # short's own last message ends at 11 as well
    steer = generate(dec, short + [5, 6], greedy, [END], cache=pc, layer_hook=lambda i, h: h, cache_key="hook")
    assert steer.reused == 0  # positions computed without the hook are not reused under one
    assert generate(dec, [9, 9, 9], greedy, [END], cache=pc).reused == 0
    assert pc.cache.checkpoint_length() is None  # no end of turn: no checkpoint in the new cache
