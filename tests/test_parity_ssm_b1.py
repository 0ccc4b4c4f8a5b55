"""Short convolutions, lightning attention and shared blocks (issue 15, part B1) against
transformers, their kernels against numpy, and llama.cpp's GGUF files of them.

Kernels: lightning attention's recurrence (``ster_py._kernels.lightning``) against its numpy
reference on random shapes and odd lengths, at 1 and 2 threads, the AVX2 and the portable loop,
in one call and carried across calls; the references against the torch modules transformers runs
(``MiniMaxLightningAttention``'s block-by-block prefill over several blocks, ``Lfm2ShortConv``).

Families (lfm2, lfm2_moe, minimax, minimax_text_01, zamba2): each case is a checkpoint made here
with transformers (hidden 64, 4 or 5 layers mixing the family's layer kinds, states above one,
every weight redrawn, ``tiny.build_checkpoint``), checked on a 16-token prompt (longer than every
convolution): logits within 1e-4 of transformers; the prompt split into two prefill calls, and fed
token by token, give the same logits and leave the same recurrent state as one call; the same 16
greedy tokens as transformers; no stored tensor left unread. Then the refusals seed 002 names for
these families, the layer kinds and state sizes read from the configs, adapters refused, steering
and capture on LFM2.

GGUF: the same kinds of model converted by llama.cpp's own convert_hf_to_gguf.py (lfm2, lfm2moe,
minimax-01) at F32 match transformers within 1e-3 and llama.cpp's F32 logits within 1e-3;
quantized by llama.cpp to Q8_0 and Q4_K_M, ster computes exactly what the quantized weights define
and gives llama.cpp's top-1 token at every position of a 32-token prompt but near-ties.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ster_py.decoder import lightning as lightning_mod
from ster_py.decoder import shortconv as shortconv_mod
from ster_py.decoder._fast import lightning as lightning_kernels
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
B1_MIXERS = ("shortconv", "lightning", "shared_hybrid")

# ----------------------------------------------------------------------------- kernels

needs_kernels = pytest.mark.skipif(lightning_kernels is None, reason="ster_py._kernels.lightning is not built")


@pytest.fixture(params=["simd", "portable"])
def simd(request):
    """Each kernel test runs the AVX2/FMA loop (where the CPU has it) and the portable one."""
    lightning_kernels.set_simd(request.param == "simd")
    yield request.param
    lightning_kernels.set_simd(True)


def _rows(rng, T, C, wide=0):
    """float32 [T, C] whose rows are contiguous but strided (a column slice of a wider array) when wide."""
    a = rng.standard_normal((T, C + wide)).astype(np.float32)
    return a[:, wide // 2: wide // 2 + C] if wide else a


@needs_kernels
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("T,H,D,wide", [(1, 4, 8, 0), (17, 3, 13, 3), (31, 8, 16, 0), (5, 1, 1, 0), (9, 6, 33, 2)])
def test_lightning_kernel_equals_reference(T, H, D, wide, threads, simd):
    rng = np.random.default_rng(T * 31 + H * D)
    q, k, v = (_rows(rng, T, H * D, wide) * np.float32(0.5) for _ in range(3))
    decay = np.exp(-rng.uniform(0.01, 0.9, H)).astype(np.float32)
    state = rng.standard_normal((H, D, D)).astype(np.float32)
    ref, ref_state = lightning_mod.lightning_scan_reference(q, k, v, decay, state)
    for cuts in ([], [T // 2] if T > 1 else [], list(range(1, T))):
        st, pieces = state.copy(), []
        for a, e in zip([0] + cuts, cuts + [T]):
            out = np.empty((e - a, H * D), np.float32)
            lightning_kernels.lightning_scan(q[a:e], k[a:e], v[a:e], decay, st, out, threads)
            pieces.append(out)
        np.testing.assert_allclose(np.concatenate(pieces), ref, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(st, ref_state, rtol=2e-5, atol=2e-5)


@needs_kernels
def test_lightning_kernel_refuses_bad_arrays():
    q = np.zeros((3, 8), np.float32)
    state = np.zeros((2, 4, 4), np.float32)
    out = np.empty((3, 8), np.float32)
    with pytest.raises(ValueError, match="decay"):
        lightning_kernels.lightning_scan(q, q, q, np.zeros(3, np.float32), state, out)
    with pytest.raises(ValueError, match="state"):
        lightning_kernels.lightning_scan(q, q, q, np.zeros(2, np.float32), np.zeros((2, 4, 3), np.float32), out)
    with pytest.raises(ValueError, match="same rows"):
        lightning_kernels.lightning_scan(q, q[:2], q, np.zeros(2, np.float32), state, out)


class _Slot:
    """A cache holding one layer's recurrent state (what a mixer reads through ``cache.slot(i)``)."""

    def __init__(self, i, slot):
        self.i, self._slot = i, slot

    def slot(self, i):
        assert i == self.i
        return self._slot


def _module_loader(module, names: dict):
    """``load(role, kind, required)`` over a torch module's parameters (role -> parameter stem)."""
    params = {k: v.detach().numpy() for k, v in module.named_parameters()}

    def load(role, kind="weight", required=False, **_):
        t = params.get(f"{names[role]}.{kind}") if role in names else None
        assert t is not None or not required, role
        return t
    return load


def test_lightning_mixer_equals_transformers_block_prefill():
    """Transformers' MiniMaxLightningAttention computes its prefill block by block (an intra-block
    product with diagonal decays plus the carried state); ours is the token recurrence. Over three
    blocks (block_size 5, 13 tokens) and with the carried state, the outputs agree, layer by layer
    (the decay rates depend on the layer's place)."""
    import torch
    from transformers import AutoConfig
    from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention

    from ster_py.config import spec_from_config
    from ster_py.decoder.cache import RecurrentState

    cfg = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=5, head_dim=8,
               block_size=5, vocab_size=VOCAB, intermediate_size=16, num_local_experts=2,
               layer_types=["linear_attention"] * 5)
    config = AutoConfig.for_model("minimax", **cfg)
    spec = spec_from_config({"model_type": "minimax", **cfg}, FAMILIES["minimax"])
    torch.manual_seed(0)
    x = torch.randn(1, 13, 32)
    for layer in (0, 2, 4):
        ref = MiniMaxLightningAttention(config, layer).eval()
        with torch.no_grad():
            for name, p in ref.named_parameters():
                p.copy_(torch.randn_like(p) * (0.3 if p.ndim > 1 else 1.0))
            want, _ = ref(x, position_embeddings=None, attention_mask=None)
        ours = lightning_mod.Lightning(spec, layer, _module_loader(ref, {
            "ssm_in": "qkv_proj", "ssm_gate": "output_gate", "ssm_norm": "norm", "ssm_out": "out_proj"}), None)
        cache = _Slot(layer, RecurrentState(spec.ssm.state_shapes()))
        got = np.concatenate([ours(x[0, :6].numpy(), cache, None), ours(x[0, 6:].numpy(), cache, None)])
        assert rel_err(got, want[0].numpy()) < 1e-5, layer


def test_shortconv_reference_equals_transformers_module():
    """LFM2's gated short convolution (numpy reference and the kernel path) against
    Transformers' Lfm2ShortConv, from zeros and carried across two calls."""
    import torch
    from transformers import AutoConfig
    from transformers.models.lfm2.modeling_lfm2 import Lfm2ShortConv

    from ster_py.config import spec_from_config
    from ster_py.decoder.cache import RecurrentState

    cfg = dict(hidden_size=24, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
               conv_L_cache=4, conv_bias=True, full_attn_idxs=[1], intermediate_size=48)
    config = AutoConfig.for_model("lfm2", **cfg)
    ref = Lfm2ShortConv(config, 0).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
        x = torch.randn(1, 11, 24)
        want = ref(x)[0].numpy()
    spec = spec_from_config({"model_type": "lfm2", **cfg}, FAMILIES["lfm2"])
    load = _module_loader(ref, {"ssm_in": "in_proj", "ssm_conv": "conv", "ssm_out": "out_proj"})
    mixer = shortconv_mod.ShortConv(spec, 0, load, None)
    cache = _Slot(0, RecurrentState(spec.ssm.state_shapes()))
    got = np.concatenate([mixer(x[0, :5].numpy(), cache, None), mixer(x[0, 5:].numpy(), cache, None)])
    assert rel_err(got, want) < 1e-5
    bcx = mixer.in_proj(x[0].numpy())
    y, state = shortconv_mod.shortconv_reference(bcx, mixer.conv_w, mixer.conv_b, np.zeros((3, 24), np.float32))
    assert rel_err(mixer.out_proj(y), want) < 1e-5
    np.testing.assert_allclose(state, cache.slot(0)["conv"], rtol=1e-6, atol=1e-6)


def test_lightning_decay_is_transformers_slope_rate():
    """The decay rates against the buffer transformers keeps (slope_rate), and llama.cpp's variant
    (no 1e-5 in the divisor) within 1e-5 of it."""
    from transformers import AutoConfig
    from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention

    for heads, layers in ((4, 5), (6, 3), (64, 80)):
        config = AutoConfig.for_model("minimax", hidden_size=heads * 8, num_attention_heads=heads, head_dim=8,
                                      num_key_value_heads=heads, num_hidden_layers=layers, block_size=4)
        for i in (0, layers // 2, layers - 1):
            rate = MiniMaxLightningAttention(config, i).slope_rate.reshape(-1).numpy()
            np.testing.assert_allclose(lightning_mod.lightning_decay(heads, i, layers), np.exp(-rate), rtol=1e-6)
            np.testing.assert_allclose(lightning_mod.lightning_decay(heads, i, layers, 0.0), np.exp(-rate), rtol=1e-5)


# ----------------------------------------------------------------------------- families

ATTN = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
LFM2 = dict(ATTN, intermediate_size=96, num_hidden_layers=4, full_attn_idxs=[1, 3], conv_L_cache=3)
MINIMAX = dict(ATTN, intermediate_size=32, num_hidden_layers=4, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
               full_attn_alpha_factor=1.3, full_attn_beta_factor=0.8, linear_attn_alpha_factor=0.7,
               linear_attn_beta_factor=1.2, mlp_alpha_factor=1.1, mlp_beta_factor=0.9)
ZAMBA2 = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, max_position_embeddings=64, mamba_d_state=8,
              n_mamba_heads=8, mamba_ngroups=2, mamba_d_conv=4, adapter_rank=4)

CASES = {
    "lfm2": ("lfm2", dict(LFM2)),
    "lfm2-conv4-bias-untied-rounded": ("lfm2", dict(LFM2, num_hidden_layers=5, full_attn_idxs=[0, 3], conv_L_cache=4,
                                                    conv_bias=True, tie_word_embeddings=False, num_key_value_heads=1,
                                                    block_ffn_dim_multiplier=1.5, block_multiple_of=32)),
    "lfm2-layer-types-unadjusted": ("lfm2", dict(LFM2, layer_types=["conv", "conv", "full_attention", "conv"],
                                                 block_auto_adjust_ff_dim=False, norm_eps=1e-4)),
    "lfm2_moe": ("lfm2_moe", dict(ATTN, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
                                  layer_types=["conv", "full_attention", "conv", "conv"], num_dense_layers=1,
                                  num_experts=4, num_experts_per_tok=2, routed_scaling_factor=1.5)),
    "lfm2_moe-no-bias-unnormed": ("lfm2_moe", dict(ATTN, intermediate_size=80, moe_intermediate_size=24,
                                                   num_hidden_layers=4, layer_types=["full_attention", "conv", "conv",
                                                                                     "full_attention"],
                                                   num_dense_layers=2, num_experts=6, num_experts_per_tok=3,
                                                   use_expert_bias=False, norm_topk_prob=False, conv_L_cache=2)),
    # Transformers' LFM2 feed-forwards (dense and experts) run SiLU whatever hidden_act says, and its norms
    # take norm_eps only
    "lfm2_moe-act-and-eps-unread": ("lfm2_moe", dict(ATTN, intermediate_size=96, moe_intermediate_size=32,
                                                     num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"],
                                                     num_dense_layers=1, num_experts=4, num_experts_per_tok=2,
                                                     hidden_act="gelu", rms_norm_eps=0.1)),
    "minimax": ("minimax", dict(MINIMAX)),
    "minimax-lightning-first-one-kv-head": ("minimax", dict(
        MINIMAX, num_hidden_layers=5, num_key_value_heads=1, num_experts_per_tok=1, num_local_experts=3,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention", "full_attention"])),
    "zamba2": ("zamba2", dict(ZAMBA2, num_hidden_layers=4, layers_block_type=["mamba", "hybrid", "mamba", "hybrid"],
                              num_mem_blocks=1, num_key_value_heads=2)),
    "zamba2-two-blocks-adapters-rope": ("zamba2", dict(
        ZAMBA2, num_hidden_layers=5, layers_block_type=["hybrid", "mamba", "hybrid", "hybrid", "mamba"],
        num_mem_blocks=2, use_shared_attention_adapter=True, use_mem_rope=True, intermediate_size=96, mamba_ngroups=1, n_mamba_heads=4, time_step_min=0.05)),
}
# Where transformers 5.24's cached decoding departs from its own prefill, the greedy reference is its
# prefill over the growing sequence: Zamba2's single-token scan step leaves the step unclamped where its
# prefill clamps it at time_step_min (as Nemotron-H's, test_parity_ssm), and MiniMaxCache counts the
# positions it holds from layer 0 only, so a model whose first layer is a lightning layer decodes every
# token at position 0 (test_transformers_minimax_cache_loses_positions_after_a_lightning_first_layer).
PREFILL_GREEDY = {"zamba2", "zamba2-two-blocks-adapters-rope", "minimax-lightning-first-one-kv-head"}


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
    return [cache.slot(i)[name] for i in range(spec.num_hidden_layers) if cache.slot(i) is not None
            for name in cache.slot(i).names()]


def check_family(path, ref_model, greedy=reference_greedy):
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
    for ours_h, ref_h in zip(hidden[:-1], ref_hidden[:-1]):  # transformers lists the last one normed
        assert rel_err(ours_h, ref_h) < 1e-4

    split = dec.new_cache()
    pieces = np.concatenate([dec.forward(PROMPT[:SPLIT], split), dec.forward(PROMPT[SPLIT:], split)])
    steps = dec.new_cache()
    one_by_one = np.concatenate([dec.forward([t], steps) for t in PROMPT])
    for other, cache in ((pieces, split), (one_by_one, steps)):
        # (float32 products of another row count round otherwise: up to 1.24e-5 through Zamba2's two
        # shared blocks on OpenBLAS's Haswell/Zen kernels, measured on an AMD EPYC)
        assert rel_err(other, logits) < 3e-5
        assert cache.length == whole.length == len(PROMPT)
        for a, b in zip(_states(cache, model.spec), _states(whole, model.spec)):
            # float32 rounding of different summation orders, relative to the state's scale
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5 * max(1.0, float(np.abs(b).max())))
    assert whole.nbytes_fixed() == model.spec.state_bytes() > 0

    ours = generate(dec, PROMPT, Sampling(max_new_tokens=16)).ids
    assert ours == greedy(ref_model, PROMPT, 16)
    assert dec._weights.unused_tensors(model.spec) == []
    return model


@pytest.mark.parametrize("case", list(CASES))
def test_family_matches_transformers(case, tmp_path):
    model_type, config = CASES[case]
    ref_model = build(tmp_path, model_type, config)
    model = check_family(tmp_path, ref_model, reference_greedy_prefill if case in PREFILL_GREEDY else reference_greedy)
    mixers = {layer.mixer for layer in model.spec.layers}
    assert mixers & set(B1_MIXERS) and len(mixers) > 1, mixers  # every case mixes layer kinds


def test_transformers_minimax_cache_loses_positions_after_a_lightning_first_layer(tmp_path):
    """Why that case's greedy reference is transformers' prefill: after a 16-token prompt its cache says
    it holds 0 positions when layer 0 is a lightning layer (16 when it attends), and its cached
    continuation differs from its own prefill's, which ster's equals."""
    import torch

    ref = build(tmp_path, *CASES["minimax-lightning-first-one-kv-head"])
    with torch.no_grad():
        assert ref(torch.tensor([PROMPT]), use_cache=True).past_key_values.get_seq_length() == 0
    assert reference_greedy(ref, PROMPT, 16) != reference_greedy_prefill(ref, PROMPT, 16)
    ref = build(tmp_path / "full-first", *CASES["minimax"])
    with torch.no_grad():
        assert ref(torch.tensor([PROMPT]), use_cache=True).past_key_values.get_seq_length() == len(PROMPT)


def test_every_b1_family_has_a_case():
    ours = {name for name, f in FAMILIES.items() if f.recurrent in ("shortconv", "lightning")
            or f.hybrid_mixer == "shared_hybrid"}
    assert ours == {model_type for model_type, _ in CASES.values()} | {"minimax_text_01"}


def _hub_minimax(path, config: dict, model_type="minimax"):
    """A transformers MiniMax checkpoint rewritten as MiniMax's own release spells it: model_type
    minimax_text_01, MiniMaxText01ForCausalLM, attn_type_list (0 lightning, 1 full attention), the
    join's factors as layernorm_*_alpha / beta, postnorm, rotary_dim; the same tensor names."""
    ref = build(path, model_type, config)
    saved = json.loads((path / "config.json").read_text())
    hub = {k: v for k, v in saved.items() if k not in ("layer_types", "rope_parameters") and not k.endswith("_factor")}
    hub.update(model_type="minimax_text_01", architectures=["MiniMaxText01ForCausalLM"], postnorm=True,
               attn_type_list=[int(t == "full_attention") for t in saved["layer_types"]],
               rope_theta=saved["rope_parameters"]["rope_theta"], rotary_dim=saved["head_dim"],
               shared_intermediate_size=0)
    for kind, ours in (("full_attention", "full_attn"), ("linear_attention", "linear_attn"), ("mlp", "mlp")):
        hub[f"layernorm_{kind}_alpha"] = saved[f"{ours}_alpha_factor"]
        hub[f"layernorm_{kind}_beta"] = saved[f"{ours}_beta_factor"]
    (path / "config.json").write_text(json.dumps(hub))
    _drop_decay_tables(path)
    return ref


def _drop_decay_tables(path):
    """MiniMax's release stores no lightning decay tables (Transformers' MiniMax saves its buffers)."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    save_file({k: v for k, v in tensors.items() if not k.endswith(("_decay", ".slope_rate"))},
              str(path / "model.safetensors"), metadata={"format": "pt"})


def test_minimax_text_01_as_minimax_releases_it(tmp_path):
    """MiniMax's own config spellings run the same model: transformers' MiniMax saved with the
    hub's config (attn_type_list, layernorm_*_alpha / beta, postnorm, rotary_dim) matches it."""
    ref = _hub_minimax(tmp_path, dict(MINIMAX))
    model = check_family(tmp_path, ref)
    assert model.spec.model_type == "minimax_text_01" and model.spec.residual_normed
    assert [layer.mixer for layer in model.spec.layers] == ["attention", "lightning"] * 2
    assert model.spec.layers[1].residual == (0.7, 1.2, 1.1, 0.9)
    # postnorm false: each sublayer's residual is its input, not its normed input
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(config, postnorm=False)))
    other = load_model(str(tmp_path))
    assert not other.spec.residual_normed
    assert rel_err(other.decoder.forward(PROMPT), reference_logits(ref, PROMPT)[0]) > 1e-2


def test_minimax_rotates_what_each_spelling_says(tmp_path):
    """Transformers' MiniMax rotates every dimension of each head whatever rotary_dim says (ster reads
    model_type minimax so); MiniMax's own minimax_text_01 config rotates rotary_dim (as llama.cpp
    does: see the GGUF case minimax-01-partial-rotary)."""
    ref = build(tmp_path, "minimax", dict(MINIMAX, rotary_dim=8))
    from transformers.models.minimax.modeling_minimax import MiniMaxRotaryEmbedding

    assert MiniMaxRotaryEmbedding(ref.config).inv_freq.shape[0] == 8  # head_dim 16: all of it
    model = load_model(str(tmp_path))
    assert all(layer.rope.rotary_dim == 16 for layer in model.spec.layers if layer.rope is not None)
    assert rel_err(model.decoder.forward(PROMPT), reference_logits(ref, PROMPT)[0]) < 1e-4
    _hub_minimax(tmp_path / "hub", dict(MINIMAX))
    config = json.loads((tmp_path / "hub" / "config.json").read_text())
    (tmp_path / "hub" / "config.json").write_text(json.dumps(dict(config, rotary_dim=8)))
    spec = load_model(str(tmp_path / "hub")).spec
    assert {layer.rope.rotary_dim for layer in spec.layers if layer.rope is not None} == {8}


def test_layer_kinds_and_state_shapes_from_the_config(tmp_path):
    """The layer kinds each family's config names, and the state slots' shapes and bytes."""
    expect = {
        "lfm2": ([("shortconv", "dense"), ("attention", "dense"), ("shortconv", "dense"), ("attention", "dense")],
                 {"conv": (2, 64)}),
        "lfm2_moe": ([("shortconv", "dense"), ("attention", "moe"), ("shortconv", "moe"), ("shortconv", "moe")],
                     {"conv": (2, 64)}),
        "minimax": ([("attention", "moe"), ("lightning", "moe")] * 2, {"kv": (4, 16, 16)}),
        "zamba2": ([("mamba2", "none"), ("shared_hybrid", "none")] * 2, {"conv": (3, 128 + 2 * 2 * 8), "ssm": (8, 16, 8)}),
    }
    for case, (kinds, shapes) in expect.items():
        build(tmp_path / case, *CASES[case])
        model = load_model(str(tmp_path / case))
        assert [(layer.mixer, layer.ffn) for layer in model.spec.layers] == kinds
        cache = model.decoder.new_cache()
        recurrent = [i for i, layer in enumerate(model.spec.layers) if layer.mixer in B1_MIXERS + ("mamba2",)]
        for i in range(model.spec.num_hidden_layers):
            slot = cache.slot(i)
            assert (slot is not None) == (i in recurrent)
            if slot is not None:
                assert {n: slot[n].shape for n in slot.names()} == shapes
        assert cache.nbytes_fixed() == 4 * sum(math.prod(s) for s in shapes.values()) * len(recurrent)
        before = cache.nbytes_fixed()
        model.decoder.forward(PROMPT, cache)
        assert cache.nbytes_fixed() == before  # the state does not grow with the context
    zamba = load_model(str(tmp_path / "zamba2")).spec
    assert zamba.head_dim == 32 and zamba.attn_scale == pytest.approx(16 ** -0.5)  # 2 * 64 / 4 wide, sqrt(16)
    assert all(layer.rope is None for layer in zamba.layers)  # use_mem_rope false
    assert zamba.tie_word_embeddings


def test_lfm2_feed_forward_width_as_transformers_derives_it(tmp_path):
    """block_ff_dim shrunk to two thirds, scaled and rounded up to block_multiple_of (Lfm2MLP), read
    from a hub-style config (block_ff_dim, tie_embedding)."""
    from ster_py.config import spec_from_config

    base = dict(LFM2, model_type="lfm2")
    for extra, width in ((dict(block_ff_dim=96), 256), (dict(block_ff_dim=300, block_multiple_of=64), 256),
                         (dict(block_ff_dim=300, block_ffn_dim_multiplier=1.5, block_multiple_of=8), 304),
                         (dict(block_ff_dim=300, block_ffn_dim_multiplier=None), 200),
                         (dict(block_ff_dim=300, block_auto_adjust_ff_dim=False), 300)):
        spec = spec_from_config(dict(base, **extra), FAMILIES["lfm2"])
        assert spec.intermediate_size == width, extra
    assert not spec_from_config(dict(base, tie_embedding=False), FAMILIES["lfm2"]).tie_word_embeddings


def test_inspect_reports_state_bytes_per_sequence(tmp_path):
    from ster_py.inspect import inspect_model

    build(tmp_path, *CASES["minimax"])
    info = inspect_model(str(tmp_path))
    assert info["state_bytes_per_sequence"] == 2 * 4 * 4 * 16 * 16  # two lightning layers, [4, 16, 16] each
    assert info["kv_bytes_per_position"] == 2 * 4 * 2 * 2 * 16  # two attention layers, 2 kv heads of 16
    assert info["dimensions"]["scan_layers"] == 2 and info["dimensions"]["scan"] == "lightning"


SCAN = dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=4)
REFUSED = {  # model_type, config, what the message names
    "lfm2-layer-kind": ("lfm2", dict(SCAN, layer_types=["conv", "sliding_attention", "conv", "conv"]), "layer type"),
    "lfm2_moe-layer-kind": ("lfm2_moe", dict(SCAN, layer_types=["conv", "mamba", "conv", "conv"]), "layer type"),
    "minimax-no-layer-kinds": ("minimax_text_01", dict(SCAN), "attn_type_list or layer_types"),
    "minimax-layer-kind": ("minimax_text_01", dict(SCAN, attn_type_list=[0, 1, 2, 0]), "layer kind"),
    "minimax-layer-kind-t5": ("minimax", dict(SCAN, layer_types=["linear_attention", "sliding_attention"] * 2),
                              "layer kind"),
    "minimax-shared-experts": ("minimax_text_01", dict(SCAN, attn_type_list=[0, 1] * 2, shared_intermediate_size=64),
                               "shared experts"),
    "minimax-sliding": ("minimax", dict(SCAN, layer_types=["linear_attention", "full_attention"] * 2,
                                        sliding_window=8), "sliding_window"),
    "zamba2-no-block-types": ("zamba2", dict(SCAN, num_mem_blocks=1, adapter_rank=4), "layers_block_type"),
    "zamba2-layer-kind": ("zamba2", dict(SCAN, layers_block_type=["mamba", "attention", "mamba", "hybrid"],
                                         num_mem_blocks=1, adapter_rank=4), "layer kind"),
    "zamba2-no-blocks": ("zamba2", dict(SCAN, layers_block_type=["mamba", "hybrid"] * 2, adapter_rank=4),
                         "num_mem_blocks"),
    "zamba2-no-adapter-rank": ("zamba2", dict(SCAN, layers_block_type=["mamba", "hybrid"] * 2, num_mem_blocks=1,
                                              adapter_rank=None), "adapter_rank"),
    "zamba2-width": ("zamba2", dict(SCAN, layers_block_type=["mamba", "hybrid"] * 2, num_mem_blocks=1, adapter_rank=4,
                                    n_mamba_heads=8, mamba_headdim=8), "n_mamba_heads \\* mamba_headdim"),
    "zamba2-adapters-gqa": ("zamba2", dict(SCAN, layers_block_type=["mamba", "hybrid"] * 2, num_mem_blocks=1,
                                           adapter_rank=4, use_shared_attention_adapter=True, num_key_value_heads=2),
                            "num_key_value_heads"),
    "zamba2-biases": ("zamba2", dict(SCAN, layers_block_type=["mamba", "hybrid"] * 2, num_mem_blocks=1, adapter_rank=4,
                                     add_bias_linear=True), "add_bias_linear"),
    "zamba2-untied": ("zamba2", dict(SCAN, layers_block_type=["mamba", "hybrid"] * 2, num_mem_blocks=1, adapter_rank=4,
                                     tie_word_embeddings=False), "tie_word_embeddings false"),
}


@pytest.mark.parametrize("key", list(REFUSED))
def test_refused_configurations(key, tmp_path):
    model_type, config, match = REFUSED[key]
    with pytest.raises(SterError, match=match):
        gate({"model_type": model_type, **config}, tmp_path / "config.json")


def test_refusals_come_before_any_weight_and_other_activations_are_refused(tmp_path):
    """A refused config is refused by load_model with weights that are not even there; lightning
    attention whose activation is not SiLU is refused when the spec is read; so is a selection bias
    whose length is not the expert count, naming the tensor, when the layer loads."""
    from safetensors.numpy import load_file, save_file

    from tiny import write_tokenizer

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "zamba2", "layers_block_type": ["mamba"] * 2,
                                                      "adapter_rank": 4}))
    write_tokenizer(tmp_path)
    with pytest.raises(SterError, match="num_mem_blocks"):
        load_model(str(tmp_path))
    build(tmp_path / "m", *CASES["minimax"])
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps(dict(config, hidden_act="gelu")))
    with pytest.raises(SterError, match="activation 'gelu'"):
        load_model(str(tmp_path / "m"))
    build(tmp_path / "e", *CASES["lfm2_moe"])
    tensors = load_file(str(tmp_path / "e" / "model.safetensors"))
    tensors["model.layers.2.feed_forward.expert_bias"] = np.zeros(5, np.float32)
    save_file(tensors, str(tmp_path / "e" / "model.safetensors"))
    with pytest.raises(SterError, match="model.layers.2.feed_forward.expert_bias"):
        load_model(str(tmp_path / "e"))


def _write_adapter(d, model_path, target, inp, out):
    from safetensors.numpy import save_file

    d.mkdir()
    save_file({f"layers.1.{target}.a": np.zeros((2, inp), np.float32),
               f"layers.1.{target}.b": np.zeros((out, 2), np.float32)}, str(d / "a.lora.safetensors"))
    (d / "a.lora.json").write_text(json.dumps({"model": str(model_path), "model_revision": None, "rank": 2,
                                               "alpha": 2, "targets": [target], "layers": [1], "hidden_size": 64}))
    return d / "a.lora.json"


def test_adapters_refused(tmp_path):
    """Seed 002: adapter training on LFM2, MiniMax-Text-01 and Zamba2 is refused, even on their
    attention layers' projections."""
    from ster_py.adapters import load_adapter_for

    for case, target, out in (("lfm2", "q", 64), ("lfm2_moe", "gate", 96), ("minimax", "q", 64), ("zamba2", "o", 64)):
        build(tmp_path / case, *CASES[case])
        loaded = load_model(str(tmp_path / case))
        with pytest.raises(SterError, match="state-space"):
            load_adapter_for(_write_adapter(tmp_path / f"{case}-a", tmp_path / case, target, 64, out), loaded)


def test_steering_and_capture_on_lfm2(tmp_path):
    """The residual stream between blocks is the same whatever the mixer: a steering vector on LFM2
    equals transformers with forward hooks adding it (prefill logits and 10 greedy tokens through both
    caches), and captured hidden states are transformers' own."""
    import torch

    from ster_py.capture import capture
    from ster_py.steering import SteeringVector, steering_hook
    from test_steering import unit_directions

    ref = build(tmp_path, *CASES["lfm2"])
    loaded = load_model(str(tmp_path))
    dirs = unit_directions([0, 1])
    strength = 12.0

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
    for layer in (0, 1):  # after a convolution layer and after an attention layer
        assert rel_err(cap.rows(layer), ref_hidden[layer + 1][-len(PROMPT):]) < 1e-5


# ----------------------------------------------------------------------------- GGUF, via llama.cpp
#
# llama.cpp's converter on the same kinds of model, 256 wide so that the products really are Q4_K
# (llama.cpp falls back to other types for other widths), weights scaled by 0.25 and routers made
# decisive (``_wide``), as test_parity_ssm's. MiniMax is converted from MiniMax's own layout
# (MiniMaxText01ForCausalLM, the architecture the converter takes) with one alpha for every sublayer
# and betas of 1 (the converter refuses anything else), 8 layers: llama.cpp's loader makes every
# eighth layer full attention (the converter writes no per-layer flags). Its partial-rotation case
# has no transformers oracle (Transformers 5.24 rotates whole heads), so llama.cpp's F32 logits are
# its reference.

WIDE = dict(vocab_size=VOCAB, hidden_size=256, max_position_embeddings=64, num_attention_heads=4,
            num_key_value_heads=2)
MINIMAX_WIDE = dict(WIDE, intermediate_size=256, num_hidden_layers=8, head_dim=64, num_local_experts=4,
                    num_experts_per_tok=2, layer_types=["linear_attention"] * 7 + ["full_attention"],
                    **{f"{k}_alpha_factor": 1.7 for k in ("full_attn", "linear_attn", "mlp")})
GGUF_CASES = {  # name: (model_type, config, legacy config.json keys)
    "lfm2": ("lfm2", dict(WIDE, intermediate_size=384, num_hidden_layers=4, full_attn_idxs=[1, 3], conv_L_cache=3,
                          block_multiple_of=64), {}),
    "lfm2moe": ("lfm2_moe", dict(WIDE, intermediate_size=256, moe_intermediate_size=256, num_hidden_layers=4,
                                 layer_types=["conv", "full_attention", "conv", "conv"], num_dense_layers=1,
                                 num_experts=4, num_experts_per_tok=2), {}),
    "minimax-01": ("minimax_text_01", dict(MINIMAX_WIDE), {}),
    "minimax-01-partial-rotary": ("minimax_text_01", dict(MINIMAX_WIDE, rotary_dim=32), {}),
}
LLAMA_CPP_ONLY = {"minimax-01-partial-rotary"}  # no transformers oracle (see above)
LONG_PROMPT = np.random.RandomState(3).randint(3, VOCAB, size=32).tolist()
ROUTERS = ("feed_forward.gate.weight", "mlp.gate.weight")


def _wide(path, model_type, config):
    """The checkpoint with 2-D weights scaled by 0.25 and decisive routing (token t's embedding
    carries strong features at experts t mod E and 3t + 1 mod E, which the routers read; as
    test_parity_ssm's ``_wide``); MiniMax saved in its own layout."""
    import torch

    config = dict(config)
    rotary = config.pop("rotary_dim", None)
    hub = model_type == "minimax_text_01"
    model = _hub_minimax(path, config) if hub else build(path, model_type, config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim > 1 and "norm" not in name and "conv" not in name:
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
    hub_config = (path / "config.json").read_text() if hub else None
    model.save_pretrained(path)
    if hub:  # the hub's config, its rotary width, and the index llama.cpp's MiniMax converter reads
        (path / "config.json").write_text(json.dumps(dict(json.loads(hub_config), rotary_dim=rotary or 64)))
        _drop_decay_tables(path)
        from safetensors import safe_open

        with safe_open(str(path / "model.safetensors"), "np") as f:
            index = {"metadata": {}, "weight_map": {k: "model.safetensors" for k in f.keys()}}
        (path / "model.safetensors.index.json").write_text(json.dumps(index))
    return model


@pytest.fixture(scope="module")
def b1_gguf(tmp_path_factory):
    """name -> (converted F32 .gguf, transformers model) for every case of GGUF_CASES."""
    from llamacpp_convert import convert_cases

    return convert_cases(tmp_path_factory.mktemp("llama_cpp_b1"), GGUF_CASES, _wide)


@pytest.mark.parametrize("name", list(GGUF_CASES))
def test_gguf_matches_transformers(name, b1_gguf):
    from ster_py import llamacpp
    from ster_py.gguf.reader import GGUFFile

    path, ref_model = b1_gguf[name]
    assert GGUFFile(path).architecture == name.replace("-partial-rotary", "")  # the converter's architecture
    model = load_model(str(path))
    assert model.spec.ssm is not None
    ours = model.decoder.forward(PROMPT)
    if name not in LLAMA_CPP_ONLY:
        err = rel_err(ours, reference_logits(ref_model, PROMPT)[0])
        assert err < 1e-3, f"logits rel err {err:.2e}"
    (ref,) = llamacpp.logits(path, [PROMPT])  # and llama.cpp reads the file as ster does
    assert rel_err(ours, ref[:, :ours.shape[1]]) < 1e-3
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:SPLIT], cache), model.decoder.forward(PROMPT[SPLIT:], cache)])
    assert rel_err(pieces, ours) < 1e-5
    assert model.decoder._weights.unused_tensors(model.spec) == []


@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_K_M"])
@pytest.mark.parametrize("name", [n for n in GGUF_CASES if n not in LLAMA_CPP_ONLY])
def test_quantized_gguf_gives_llamacpps_top1(name, ftype, b1_gguf, tmp_path):
    from ster_py import llamacpp
    from ster_py.decoder.model import Decoder
    from ster_py.decoder.qlinear import QuantTensor
    from ster_py.gguf.reader import GGUFFile
    from ster_py.weights import GGUFWeights

    path, _ = b1_gguf[name]
    q = llamacpp.quantize(path, tmp_path / f"{name}-{ftype}.gguf", ftype)
    model = load_model(str(q))
    mixers = [layer.mixer for layer in model.decoder.layers if layer.layer.mixer in B1_MIXERS]
    want = {"Q8_0"} if ftype == "Q8_0" else {"Q4_K", "Q5_K", "Q6_K"}
    projections = [getattr(m, "in_proj", None) or m.qkv for m in mixers]
    assert mixers and all(type(p.weight) is QuantTensor and p.weight.type_name in want for p in projections)
    ours = model.decoder.forward(LONG_PROMPT)
    # ster computes what the quantized weights define: the same as those weights dequantized, in f32
    exact = Decoder(model.spec, GGUFWeights(GGUFFile(q), "f32", quantized=False)).forward(LONG_PROMPT)
    assert rel_err(ours, exact) < 1e-4
    (ref,) = llamacpp.logits(q, [LONG_PROMPT])
    ref = ref[:, :ours.shape[1]]
    # llama.cpp's products round each activation row to 8 bits (q8_0 / q8_K blocks). These random models
    # amplify any rounding about tenfold (llama.cpp's own Q8_0 logits lie 3-5 % from its F32 ones, its
    # Q4_K_M 24-31 %), so the two sides differ by 2-4 % at Q8_0 and 4-8 % at Q4_K_M (measured; LFM2-MoE's
    # Q4_K_M the most, evenly over the positions): test_parity_ssm's bound.
    assert rel_err(ours, ref) < 0.15
    # Top-1: the same token at every position, except where llama.cpp's own top two are closer than three
    # standard deviations of a difference of two logits (sqrt(2) times the rms difference the two
    # implementations show over the prompt), the bound test_parity_moe uses: a random model ties somewhere
    # in 32 positions, and neither side's arithmetic can settle such a tie.
    mine, theirs = ours.argmax(1), ref.argmax(1)
    rows = np.arange(len(mine))
    margin = ref[rows, theirs] - ref[rows, mine]
    noise = np.sqrt(2 * np.mean((ours - ref) ** 2))
    assert np.all((mine == theirs) | (margin <= 3 * noise)), (np.nonzero(mine != theirs), margin, noise)
    assert (mine == theirs).mean() >= 0.8  # and most positions are no near-tie at all
    # decoding token by token through the recurrent state gives the whole prompt's logits
    cache = model.decoder.new_cache()
    steps = np.concatenate([model.decoder.forward([t], cache) for t in LONG_PROMPT])
    assert np.abs(steps - ours).max() <= 1e-3 * np.abs(ours).max()


def test_every_b1_gguf_architecture_has_a_case():
    from ster_py.families import FAMILIES_BY_GGUF_ARCH

    declared = {arch for arch, f in FAMILIES_BY_GGUF_ARCH.items() if f.recurrent in ("shortconv", "lightning")}
    assert declared == {name for name in GGUF_CASES if name not in LLAMA_CPP_ONLY}


def test_gguf_per_layer_metadata_chooses_the_layers(b1_gguf):
    """head_count_kv arrays (0: a convolution) decide LFM2's layers, every eighth layer attends in a
    minimax-01 file without per-layer flags, and its join is residual_scale times the normed input."""
    kinds = {name: [(layer.mixer, layer.ffn) for layer in load_model(str(b1_gguf[name][0])).spec.layers]
             for name in ("lfm2", "lfm2moe", "minimax-01")}
    assert kinds["lfm2"] == [("shortconv", "dense"), ("attention", "dense")] * 2
    assert kinds["lfm2moe"] == [("shortconv", "dense"), ("attention", "moe"), ("shortconv", "moe"), ("shortconv", "moe")]
    assert kinds["minimax-01"] == [("lightning", "moe")] * 7 + [("attention", "moe")]
    spec = load_model(str(b1_gguf["minimax-01"][0])).spec
    assert spec.residual_normed and {layer.residual for layer in spec.layers} == {(np.float32(1.7), 1.0, np.float32(1.7), 1.0)}
    assert spec.ssm.slope_eps == 0.0 and spec.ssm.norm_eps == spec.norm_eps
    partial = load_model(str(b1_gguf["minimax-01-partial-rotary"][0])).spec
    assert partial.layers[7].rope.rotary_dim == 32


def _spec_with(path, **changes):
    """The ModelSpec llama.cpp's metadata of ``path`` gives with keys changed (None removes a key)."""
    from ster_py.gguf.config import spec_from_gguf
    from ster_py.gguf.reader import GGUFFile

    g = GGUFFile(path)
    meta = dict(g.metadata)
    for key, value in changes.items():
        meta.pop(key, None) if value is None else meta.__setitem__(key, value)
    tensors = {n: t.shape for n, t in g.tensors.items()}
    return spec_from_gguf(meta, str(path), vocab_size=VOCAB, tensors=tensors,
                          has_output="output.weight" in tensors)


def test_gguf_recurrent_layer_metadata_and_its_refusals(b1_gguf):
    """minimax-01.cpp's loader: per-layer attention.recurrent_layers flags when the file has them,
    else full_attention_interval (8 when absent); malformed values and LFM2's missing or absurd
    shortconv.l_cache are refused naming the key."""
    mm = b1_gguf["minimax-01"][0]
    flags = [True, False] * 4
    spec = _spec_with(mm, **{"minimax-01.attention.recurrent_layers": np.array(flags)})
    assert [layer.mixer for layer in spec.layers] == ["lightning" if f else "attention" for f in flags]
    spec = _spec_with(mm, **{"minimax-01.full_attention_interval": 3})
    assert [layer.mixer for layer in spec.layers] == ["lightning", "lightning", "attention"] * 2 + ["lightning"] * 2
    for bad, match in (([True] * 5, "recurrent_layers must hold one flag per layer"), ("yes", "recurrent_layers")):
        with pytest.raises(SterError, match=match):
            _spec_with(mm, **{"minimax-01.attention.recurrent_layers": bad})
    with pytest.raises(SterError, match="full_attention_interval must be a positive integer"):
        _spec_with(mm, **{"minimax-01.full_attention_interval": 0})
    lfm = b1_gguf["lfm2"][0]
    assert _spec_with(lfm).ssm.d_conv == 3
    for bad in (None, 1, 5000, 2.5):
        with pytest.raises(SterError, match="lfm2.shortconv.l_cache must be an integer in 2..1024"):
            _spec_with(lfm, **{"lfm2.shortconv.l_cache": bad})
