"""Families of group R2 (issue 16; issue 15 for bailing_hybrid) against Transformers models of the same math.

Families without a Transformers implementation (marked ``unconfirmed``) are tested as
tests/test_parity_remote.py tests its families: a tiny random Transformers model whose computation
is the family's once its extras are neutral is saved in the family's own layout and config spellings
(seed 002), each extra is switched on in the oracle by wiring Transformers' own modules the way seed
002 words it, and ster on that directory must give the oracle's logits of a 16-token prompt within
1e-4 (f32), the same through its cache in two pieces, 16 equal greedy tokens, no stored tensor left
unread.

- pangu_ultra_moe: Transformers' DeepSeek-V3 (adjacent-pair rotation, one expert group, its selection
  bias zero and left out of the checkpoint); under sandwich_norm each layer's attention and
  feed-forward outputs pass new RMS norms (post_attention_layernorm, post_mlp_layernorm) and the
  feed-forward reads DeepSeek's second norm, stored as pre_mlp_layernorm.
- nemotron_h_puzzle: Transformers' Nemotron-H whose later routed layers are Transformers' own
  NemotronHMoE built at each layer's top-k and expert width (block_configs), saved below model.
  (Nemotron-H's moe_latent_size is tested in test_parity_ssm.py and in one case here.)
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from ster_py.errors import SterError
from ster_py.families import FAMILIES, gate
from ster_py.generate import Sampling, generate
from ster_py.load import load_model
from tiny import build_checkpoint
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)
from tiny import reference_greedy, reference_logits, reference_split_logits, rel_err

VOCAB = 128
PROMPT = np.random.RandomState(5).randint(3, VOCAB, size=16).tolist()


def _rewrite(path, config: dict, drop: tuple[str, ...] = (), tensors=None) -> None:
    """Replace config.json by the family's own (``config`` over the saved one, ``drop`` removed)
    and, with ``tensors`` (a function of the saved state dict), the weights by its result."""
    saved = json.loads((path / "config.json").read_text())
    for key in drop:
        saved.pop(key, None)
    saved.update(config)
    (path / "config.json").write_text(json.dumps(saved))
    if tensors is not None:
        from safetensors.numpy import load_file, save_file

        state = load_file(str(path / "model.safetensors"))
        save_file(tensors(state), str(path / "model.safetensors"), metadata={"format": "pt"})


def _output_normed(module, norm):
    """``module`` whose output (the first item of a tuple output) passes ``norm``."""
    import torch

    class OutputNormed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.norm = module, norm

        def forward(self, *args, **kwargs):
            out = self.inner(*args, **kwargs)
            return (self.norm(out[0]),) + tuple(out[1:]) if isinstance(out, tuple) else self.norm(out)

    return OutputNormed()


def _random_norm(d: int, eps: float, rng):
    """An RMS norm (Transformers' Llama one, the same math as DeepSeek's) with a random weight near one."""
    import torch
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(d, eps=eps)
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(rng.randn(d).astype(np.float32) * 0.3 + 1.0))
    return norm


# ------------------------------------------------------------------ openPangu-Ultra-MoE (DeepSeek-V3)
MLA = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
           num_key_value_heads=4, max_position_embeddings=64, kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8,
           qk_rope_head_dim=4, v_head_dim=12, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
# DeepSeek-V3's key -> openPangu-Ultra-MoE's spelling of it (seed 002).
_PANGU_KEYS = {"q_lora_rank": "attention_q_lora_dim", "kv_lora_rank": "attention_kv_lora_dim",
               "qk_nope_head_dim": "attention_qk_dim", "qk_rope_head_dim": "attention_qk_rope_dim",
               "v_head_dim": "attention_v_dim", "n_routed_experts": "num_routed_experts",
               "n_shared_experts": "num_shared_experts", "first_k_dense_replace": "num_dense_layers"}


def _pangu_ultra(path, config: dict):
    import torch

    c = dict(MLA, **config)
    sandwich = c.pop("sandwich_norm", False)
    state_renorm = "norm_topk_prob" in c  # left out: the family's default (true) must apply
    model = build_checkpoint(path, "deepseek_v3", dict(c, n_group=1, topk_group=1, rope_interleave=True))
    with torch.no_grad():  # Pangu's router has no selection bias: Transformers' zero bias is the same
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.zero_()
    added = {}
    if sandwich:
        rng = np.random.RandomState(7)
        eps = model.config.rms_norm_eps
        for i, layer in enumerate(model.model.layers):
            post_attn, post_mlp = _random_norm(c["hidden_size"], eps, rng), _random_norm(c["hidden_size"], eps, rng)
            layer.self_attn = _output_normed(layer.self_attn, post_attn)
            layer.mlp = _output_normed(layer.mlp, post_mlp)
            added[f"model.layers.{i}.post_attention_layernorm.weight"] = post_attn.weight.detach().numpy().copy()
            added[f"model.layers.{i}.post_mlp_layernorm.weight"] = post_mlp.weight.detach().numpy().copy()

    def tensors(state: dict) -> dict:
        out = {}
        for name, t in state.items():
            if name.endswith("e_score_correction_bias"):
                continue
            if sandwich and ".post_attention_layernorm." in name:
                name = name.replace(".post_attention_layernorm.", ".pre_mlp_layernorm.")
            out[name] = t
        return {**out, **added}

    saved = json.loads((path / "config.json").read_text())
    own = {"model_type": "pangu_ultra_moe", "architectures": ["PanguUltraMoEForCausalLM"],
           "rope_theta": saved["rope_parameters"]["rope_theta"], "sandwich_norm": sandwich,
           **{theirs: saved[ours] for ours, theirs in _PANGU_KEYS.items()}}
    drop = tuple(_PANGU_KEYS) + ("n_group", "topk_group", "rope_interleave", "rope_parameters", "head_dim",
                                 "qk_head_dim", "num_nextn_predict_layers") + (() if state_renorm else ("norm_topk_prob",))
    _rewrite(path, own, drop=drop, tensors=tensors)
    model.eval()
    return model


# ------------------------------------------------------------------ Nemotron Puzzle (Nemotron-H, per-layer experts)
NEMOTRON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=64, head_dim=16, mamba_num_heads=8, mamba_head_dim=16, n_groups=2,
                ssm_state_size=8, conv_kernel=4, n_routed_experts=6, moe_shared_expert_intermediate_size=48)
_PUZZLE_KIND = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


def _nemotron_puzzle(path, config: dict):
    """Transformers' Nemotron-H with the pattern's first E layer at (top_k, size) = shapes[0] and each
    later one's mixer replaced by Transformers' NemotronHMoE built at its own shape (seed 002: each moe
    layer's num_experts_per_tok and moe_intermediate_size in block_configs), saved below model. with
    layers_block_type and block_configs in place of the pattern and the model-wide expert shape."""
    import copy

    import torch
    from safetensors.torch import save_file
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMoE

    c = dict(NEMOTRON, **config)
    pattern, shapes = c.pop("pattern"), list(c.pop("shapes"))
    k0, f0 = shapes[0]
    model = build_checkpoint(path, "nemotron_h", dict(c, hybrid_override_pattern=pattern, num_experts_per_tok=k0,
                                                     moe_intermediate_size=f0))
    routed = [i for i, ch in enumerate(pattern) if ch == "E"]
    torch.manual_seed(11)
    for i, (k, f) in zip(routed[1:], shapes[1:]):
        cfg = copy.deepcopy(model.config)
        cfg.num_experts_per_tok, cfg.moe_intermediate_size = k, f
        mixer = NemotronHMoE(cfg, layer_idx=i)
        with torch.no_grad():
            for p in mixer.parameters():
                p.copy_(torch.randn_like(p) * 0.15)
            for name, b in mixer.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    b.copy_(torch.randn_like(b) * 0.1)
        model.model.layers[i].mixer = mixer.eval()
    model.save_pretrained(path)
    from safetensors.torch import load_file

    state = load_file(str(path / "model.safetensors"))
    state = {(("model." + n[len("backbone."):]) if n.startswith("backbone.") else n): t.contiguous()
             for n, t in state.items()}
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    kinds = [_PUZZLE_KIND[ch] for ch in pattern]
    blocks, it = [], iter(shapes)
    for kind in kinds:
        block = {"block_type": kind}
        if kind == "moe":
            k, f = next(it)
            block.update(num_experts_per_tok=k, moe_intermediate_size=f)
        blocks.append(block)
    _rewrite(path, {"model_type": "nemotron_h_puzzle", "architectures": ["NemotronHPuzzleForCausalLM"],
                    "layers_block_type": kinds, "block_configs": blocks},
             drop=("hybrid_override_pattern", "num_experts_per_tok", "moe_intermediate_size", "mtp_layers_block_type"))
    return model


BUILD = {"pangu_ultra_moe": _pangu_ultra, "nemotron_h_puzzle": _nemotron_puzzle}
CASES = {
    "pangu_ultra_moe": ("pangu_ultra_moe", dict(first_k_dense_replace=1, routed_scaling_factor=2.5)),
    "pangu_ultra_moe-sandwich-shared-2": ("pangu_ultra_moe", dict(sandwich_norm=True, first_k_dense_replace=1,
                                                                   n_shared_experts=2, routed_scaling_factor=1.5)),
    "pangu_ultra_moe-sandwich-no-renorm-no-q-lora": ("pangu_ultra_moe", dict(
        sandwich_norm=True, norm_topk_prob=False, q_lora_rank=None, first_k_dense_replace=0, num_experts_per_tok=3,
        qk_rope_head_dim=8)),
    "nemotron_h_puzzle": ("nemotron_h_puzzle", dict(pattern="ME*-E", shapes=[(2, 32), (3, 24)])),
    "nemotron_h_puzzle-latent-three-shapes": ("nemotron_h_puzzle", dict(
        pattern="EM*EE", shapes=[(3, 24), (1, 40), (2, 16)], moe_latent_size=32, n_group=2, topk_group=1,
        routed_scaling_factor=1.5)),
}


def build(path, model_type: str, config: dict):
    return BUILD[model_type](path, config)


def _check(path, ref, model_type: str):
    assert json.loads((path / "config.json").read_text())["model_type"] == model_type
    model = load_model(str(path))
    assert model.spec.model_type == model_type
    ref_logits, _ = reference_logits(ref, PROMPT)
    err = rel_err(model.decoder.forward(PROMPT), ref_logits)
    assert err < 1e-4, f"logits rel err {err:.2e}"
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:9], cache), model.decoder.forward(PROMPT[9:], cache)])
    assert rel_err(pieces, reference_split_logits(ref, PROMPT, 9)) < 1e-4
    assert generate(model.decoder, PROMPT, Sampling(max_new_tokens=16)).ids == reference_greedy(ref, PROMPT, 16)
    assert model.decoder._weights.unused_tensors(model.spec) == []
    return model


@pytest.mark.parametrize("case", list(CASES))
def test_family_matches_its_oracle(case, tmp_path):
    model_type, config = CASES[case]
    _check(tmp_path, build(tmp_path, model_type, config), model_type)


def test_pangu_ultra_router_reads_the_family_defaults(tmp_path):
    """The default case leaves norm_topk_prob out (renormalised, as Pangu's config class says) and the
    router has no selection bias nor groups."""
    build(tmp_path, *CASES["pangu_ultra_moe"])
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "norm_topk_prob" not in saved and "q_lora_rank" not in saved and saved["attention_q_lora_dim"] == 24
    spec = load_model(str(tmp_path)).spec
    router = spec.moe.router
    assert [layer.ffn for layer in spec.layers] == ["dense", "moe", "moe"]
    assert router.renormalize and not router.select_bias and router.n_group == 1 and router.scale == 2.5


def test_nemotron_puzzle_layers_take_their_block_configs(tmp_path):
    build(tmp_path, *CASES["nemotron_h_puzzle-latent-three-shapes"])
    spec = load_model(str(tmp_path)).spec
    assert [(layer.mixer, layer.ffn) for layer in spec.layers] == [
        ("none", "moe"), ("mamba2", "none"), ("attention", "none"), ("none", "moe"), ("none", "moe")]
    shapes = [((layer.moe or spec.moe).router.top_k, (layer.moe or spec.moe).expert_size)
              for layer in spec.layers if layer.ffn == "moe"]
    assert shapes == [(3, 24), (1, 40), (2, 16)] and spec.moe.latent_size == 32


_PUZZLE_BASE = {"model_type": "nemotron_h_puzzle", **NEMOTRON, "num_hidden_layers": 2,
                "layers_block_type": ["mamba", "moe"],
                "block_configs": [{"block_type": "mamba"},
                                  {"block_type": "moe", "num_experts_per_tok": 2, "moe_intermediate_size": 32}]}


@pytest.mark.parametrize("config,match", [
    (dict(_PUZZLE_BASE, layers_block_type=["mamba", "moe", "mlp"]), "layers_block_type"),
    (dict(_PUZZLE_BASE, layers_block_type=["mamba", "conv"], block_configs=[
        {"block_type": "mamba"}, {"block_type": "conv"}]), "letter other than"),
    (dict(_PUZZLE_BASE, block_configs=[{"block_type": "mamba"}]), "block_configs"),
    (dict(_PUZZLE_BASE, block_configs=[{"block_type": "mamba"}, {"block_type": "mlp"}]), "block_configs"),
    (dict(_PUZZLE_BASE, block_configs=[{"block_type": "mamba"}, {"block_type": "moe", "num_experts_per_tok": 9,
                                                                 "moe_intermediate_size": 32}]), "num_experts_per_tok"),
    (dict(_PUZZLE_BASE, block_configs=[{"block_type": "mamba"}, {"block_type": "moe", "num_experts_per_tok": 2}]),
     "moe_intermediate_size"),
])
def test_refusals(config, match):
    """Refused by the gate or by the config reader, in either case before any weight is read."""
    from ster_py.config import spec_from_config

    with pytest.raises(SterError, match=match):
        spec_from_config(config, gate(config, "config.json"), "config.json")


def test_these_families_say_they_have_no_reference_here():
    from typer.testing import CliRunner

    from ster_py.cli import app

    rows = json.loads(CliRunner().invoke(app, ["families", "--json"]).stdout)
    notes = {r["model_type"]: (r["runs"], r["note"]) for r in rows}
    for model_type in BUILD:
        assert FAMILIES[model_type].unconfirmed and notes[model_type] == (True, "no reference implementation here")
