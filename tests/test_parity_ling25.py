"""bailing_hybrid's Ling 2.5 (issues 15 and 16): lightning attention beside latent attention, against a built oracle.

Transformers has no Ling 2.5 (its BailingHybrid is Ling 3.0), so the oracle is built as tests/test_parity_remote.py
builds one for a family without a Transformers implementation: Transformers' BailingHybrid supplies the latent
layers (their head gate held open: g_proj replaced by a constant 30, whose sigmoid is 1.0 in float32), Ling 2.0's
router and experts, norms and head, all saved by Transformers in Ling's names; each linear layer is Transformers'
``MiniMaxLightningAttention`` (its chunked prefill, read-out norm, sigmoid output gate, out_proj) with Ling 2.5's
extras wired in from seed 002's words:

- its slopes are those of the release's code (inclusionAI's modeling_bailing_moe_v2_5.py, and every port of
  it: vLLM, SGLang, MLX): Lightning Attention-2's ALiBi series (for a power-of-two head count MiniMax's
  2 ** (-8 / heads) to the powers 1..heads, which seed 002 names) scaled by 1 - (layer - 1) / (layers - 1)
  + 1e-5, where seed 002 writes 1 - layer / (layers - 1) + 1e-5 (the weights were trained with the
  release's), the decay tables rebuilt from them by the module's own ``decay_factors``;
- between qkv_proj and the recurrence (the module's ``act_fn``): SiLU under linear_silu, each head's query and
  key through Transformers' ``LlamaRMSNorm`` under use_qk_norm, their leading head_dim x partial_rotary_factor
  channels rotated by halves with Transformers' Llama ``apply_rotary_pos_emb`` at the model's own cos/sin
  (BailingHybrid's rotation, qk_rope_head_dim wide, the width seed 002 requires both to share), the query
  times head_dim ** -0.5;
- the read-out norm over group_norm_size equal groups (Llama's RMS norm over each group, then g_norm's weight).

The checkpoint is rewritten in the release's layout (attention.query_key_value holding every query head, then
every key head, then every value head; query_layernorm, key_layernorm, g_proj, g_norm, dense) with a
BailingMoeV2_5ForCausalLM config.json. ster must give the oracle's logits of a 16-token prompt within 1e-4 (f32),
the same logits and recurrent states through its cache in two pieces and token by token, the oracle's 16 greedy
tokens (the oracle recomputing the whole sequence each step), and read every stored tensor.

llama.cpp's pinned converter has no Ling 2.5 (conversion/__init__.py maps only BailingMoeV3 to bailingmoe3), so
there is no GGUF case.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from ster_py.errors import SterError
from ster_py.families import gate
from ster_py.generate import Sampling, generate
from ster_py.load import load_model
from tiny import build_checkpoint, rel_err, rewrite_checkpoint
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)

VOCAB = 128
PROMPT = np.random.RandomState(5).randint(3, VOCAB, size=16).tolist()
SPLIT = 9
LING25 = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2, n_group=2,
              topk_group=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
              v_head_dim=12, qk_nope_head_dim=8, head_dim=16, layer_group_size=2, max_position_embeddings=64,
              rope_theta=10000.0)
# The Ling-2.5-only keys a case states (None: left out, the release's defaults apply).
EXTRAS = ("use_qk_norm", "linear_silu", "group_norm_size", "partial_rotary_factor")
CASES = {
    # MiniMax's own read-out: SiLU, no q/k norms, one norm group
    "silu-one-group": dict(use_qk_norm=False, linear_silu=True, group_norm_size=1),
    # the release's defaults: q/k norms, no SiLU, four norm groups, half of each head rotating
    "release-defaults-mtp": dict(mtp=True),
    "five-layers-six-heads-q-lora-two-groups-shared-2-eps-half": dict(
        num_hidden_layers=5, num_attention_heads=6, num_key_value_heads=6, q_lora_rank=24, use_qk_norm=True,
        linear_silu=True, group_norm_size=2,
        num_shared_experts=2, routed_scaling_factor=1.5, rms_norm_eps=0.5, use_qkv_bias=True, use_bias=True),
}
_RELEASE = {"use_qk_norm": True, "linear_silu": False, "group_norm_size": 4, "partial_rotary_factor": 0.5,
            "use_qkv_bias": False, "use_bias": False}
# Keys of a case that are not BailingHybrid's: Ling 2.5's biases (use_qkv_bias: the latent layers' q_a / kv_a /
# dense and the lightning query_key_value; use_bias: the lightning dense) and a multi-token-prediction layer.
_OWN_KEYS = ("use_qkv_bias", "use_bias", "mtp")


def layer_kinds(n: int, group: int) -> list[str]:
    """Seed 002: latent attention on every layer_group_size-th layer and after the last whole group, linear
    attention on the others."""
    return ["full_attention" if (i + 1) % group == 0 or i >= n // group * group else "linear_attention"
            for i in range(n)]


def ling25_slopes(heads: int, layer: int, layers: int) -> np.ndarray:
    """The release's slopes: for p the head count rounded down to a power of two, 2 ** (-8 / p) to the powers
    1..p, then (past p heads) 2 ** (-8 / 2p) to the odd powers 1, 3, 5, ...; times
    1 - (layer - 1) / (layers - 1) + 1e-5."""
    p = 2 ** int(np.floor(np.log2(heads)))
    base = [(2.0 ** (-8.0 / p)) ** k for k in range(1, p + 1)]
    base += [(2.0 ** (-8.0 / (2 * p))) ** k for k in range(1, 2 * p, 2)][:heads - p]
    return np.asarray(base) * (1 - (layer - 1) / (layers - 1) + 1e-5)


class _Open:
    """A head gate held open: its logits are 30 (sigmoid 1.0 in float32) whatever the input."""

    def __new__(cls, heads: int):
        import torch

        class Open(torch.nn.Module):
            def forward(self, x):
                return torch.full((*x.shape[:-1], heads), 30.0, dtype=x.dtype)

        return Open()


def _lightning_oracle(config, layer: int, extras: dict, rng):
    """Transformers' MiniMaxLightningAttention with Ling 2.5's extras (module docstring), random weights."""
    import torch
    from transformers import MiniMaxConfig
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb
    from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention

    H, D, n = config.num_attention_heads, extras["head_dim"], config.num_hidden_layers
    eps, groups, rope = config.rms_norm_eps, extras["group_norm_size"], int(D * extras["partial_rotary_factor"])
    mm_cfg = MiniMaxConfig(hidden_size=config.hidden_size, num_attention_heads=H, head_dim=D, num_hidden_layers=n,
                           layer_types=["linear_attention"] * n, block_size=5, hidden_act="silu")
    mm = MiniMaxLightningAttention(mm_cfg, layer).eval()
    mm.qkv_proj = torch.nn.Linear(config.hidden_size, 3 * H * D, bias=extras["use_qkv_bias"])
    mm.out_proj = torch.nn.Linear(H * D, config.hidden_size, bias=extras["use_bias"])
    slope = torch.tensor(ling25_slopes(H, layer, n), dtype=torch.float32)[:, None, None]
    q_decay, k_decay, diag = mm.decay_factors(slope)
    mm.slope_rate, mm.query_decay, mm.key_decay, mm.diagonal_decay = slope, q_decay, k_decay, diag
    q_norm, k_norm, group_norm = LlamaRMSNorm(D, eps=eps), LlamaRMSNorm(D, eps=eps), LlamaRMSNorm(H * D // groups, eps)
    with torch.no_grad():
        for lin in (mm.qkv_proj, mm.output_gate, mm.out_proj):
            lin.weight.copy_(torch.from_numpy(rng.randn(*lin.weight.shape).astype(np.float32) * 0.15))
            if lin.bias is not None:
                lin.bias.copy_(torch.from_numpy(rng.randn(*lin.bias.shape).astype(np.float32) * 0.1))
        for w in (mm.norm.weight, q_norm.weight, k_norm.weight):
            w.copy_(torch.from_numpy(rng.randn(*w.shape).astype(np.float32) * 0.3 + 1.0))
    tables = {}

    def act(qkv):  # [B, T, H * 3D], head after head: q_h, k_h, v_h
        B, T = qkv.shape[:2]
        if extras["linear_silu"]:
            qkv = torch.nn.functional.silu(qkv)
        q, k, v = qkv.view(B, T, H, 3, D).unbind(3)
        if extras["use_qk_norm"]:
            q, k = q_norm(q), k_norm(k)
        cos, sin = tables["cos_sin"]
        assert cos.shape[-1] == rope
        q_rot, k_rot = apply_rotary_pos_emb(q[..., :rope], k[..., :rope], cos, sin, unsqueeze_dim=2)
        q = torch.cat([q_rot, q[..., rope:]], -1) * D ** -0.5
        k = torch.cat([k_rot, k[..., rope:]], -1)
        return torch.stack([q, k, v], 3).reshape(B, T, H * 3 * D)

    class GroupNorm(torch.nn.Module):
        def __init__(self, weight):
            super().__init__()
            self.weight = weight

        def forward(self, o):
            shape = o.shape
            return group_norm(o.view(*shape[:-1], groups, -1)).view(shape) * self.weight

    with torch.no_grad():
        group_norm.weight.fill_(1.0)
    class Act(torch.nn.Module):
        def forward(self, qkv):
            return act(qkv)

    mm.act_fn, norm_w = Act(), mm.norm.weight
    mm.norm = GroupNorm(norm_w)

    class LingLightning(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mm, self.q_norm, self.k_norm = mm, q_norm, k_norm

        def forward(self, hidden_states, cache=None, attention_mask=None, position_embeddings=None, **kwargs):
            tables["cos_sin"] = position_embeddings
            return self.mm(hidden_states, position_embeddings, None)[0]

    return LingLightning()


def _qkv_concat(w: np.ndarray, H: int, D: int) -> np.ndarray:
    """MiniMax's qkv rows (head after head: q_h, k_h, v_h) as Ling 2.5's (all q heads, all k heads, all v)."""
    return np.ascontiguousarray(w.reshape(H, 3, D, -1).transpose(1, 0, 2, 3).reshape(3 * H * D, -1))


def build_ling25(path, case: dict):
    """The oracle (module docstring) and its checkpoint in Ling 2.5's layout at ``path``."""
    import torch

    c = dict(LING25, **{k: v for k, v in case.items() if k not in EXTRAS + _OWN_KEYS})
    c["attention_bias"] = case.get("use_qkv_bias", False)  # the latent layers' q_a / kv_a / dense biases
    extras = {k: case.get(k, _RELEASE[k]) for k in EXTRAS + ("use_qkv_bias", "use_bias")}
    extras["head_dim"] = c["head_dim"]
    n, g = c["num_hidden_layers"], c["layer_group_size"]
    kinds = layer_kinds(n, g)
    model = build_checkpoint(path, "bailing_hybrid", dict(c, short_conv_kernel_size=3, layer_types=kinds))
    rng = np.random.RandomState(11)
    H, D = c["num_attention_heads"], c["head_dim"]
    for i, layer in enumerate(model.model.layers):
        if kinds[i] == "linear_attention":
            layer.self_attn = _lightning_oracle(model.config, i, extras, rng)
        else:
            layer.self_attn.g_proj = _Open(H)

    def tensors(state: dict) -> dict:
        out = {}
        for name, t in state.items():
            parts = name.split(".")
            if parts[:2] == ["model", "layers"] and parts[3] == "attention":
                i = int(parts[2])
                if kinds[i] == "linear_attention" or parts[4] == "g_proj":
                    continue  # Ling 3.0's delta-rule tensors; the latent head gate Ling 2.5 has not
            out[name] = t
        for i, kind in enumerate(kinds):
            if kind != "linear_attention":
                continue
            att, p = model.model.layers[i].self_attn, f"model.layers.{i}.attention."
            mm = att.mm
            out[p + "query_key_value.weight"] = _qkv_concat(mm.qkv_proj.weight.detach().numpy(), H, D)
            out[p + "g_proj.weight"] = mm.output_gate.weight.detach().numpy()
            out[p + "g_norm.weight"] = mm.norm.weight.detach().numpy()
            out[p + "dense.weight"] = mm.out_proj.weight.detach().numpy()
            if extras["use_qkv_bias"]:
                out[p + "query_key_value.bias"] = _qkv_concat(mm.qkv_proj.bias.detach().numpy()[:, None], H, D)[:, 0]
            if extras["use_bias"]:
                out[p + "dense.bias"] = mm.out_proj.bias.detach().numpy()
            if extras["use_qk_norm"]:
                out[p + "query_layernorm.weight"] = att.q_norm.weight.detach().numpy()
                out[p + "key_layernorm.weight"] = att.k_norm.weight.detach().numpy()
        return {k: np.ascontiguousarray(v) for k, v in out.items()}

    saved = json.loads((path / "config.json").read_text())
    drop = [k for k in saved if k.startswith(("linear_", "kda_")) or k in (
        "layer_types", "mlp_layer_types", "short_conv_kernel_size", "qk_head_dim", "rope_parameters",
        "num_local_experts", "architectures", "num_mtp_layers", "attention_bias")]
    own = dict(architectures=["BailingMoeV2_5ForCausalLM"], head_dim=D, num_experts=c["num_local_experts"],
               rope_theta=c["rope_theta"], **{k: case[k] for k in EXTRAS + ("use_qkv_bias", "use_bias") if k in case})
    if case.get("mtp"):  # a multi-token-prediction layer after the last, which a forward never reads
        own["num_nextn_predict_layers"] = 1
        mtp = tensors
        tensors = lambda state: dict(mtp(state), **{  # noqa: E731
            f"model.layers.{n}.{name}.weight": np.ones(c["hidden_size"], np.float32) for name in ("enorm", "hnorm")})
    rewrite_checkpoint(path, own, drop=tuple(drop), tensors=tensors)
    model.kinds = kinds
    return model


def _oracle_logits(model, ids) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([list(ids)]), use_cache=False).logits[0].float().numpy()


@pytest.fixture(scope="module", params=list(CASES))
def built(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    ref = build_ling25(path, CASES[request.param])
    return request.param, path, ref, load_model(str(path))


def test_logits_cache_and_greedy_match_the_oracle(built):
    case, path, ref, model = built
    dec = model.decoder
    want = _oracle_logits(ref, PROMPT)
    whole = dec.new_cache()
    logits = dec.forward(PROMPT, whole)
    err = rel_err(logits, want)
    assert err < 1e-4, f"logits rel err {err:.2e}"
    split, steps = dec.new_cache(), dec.new_cache()
    pieces = np.concatenate([dec.forward(PROMPT[:SPLIT], split), dec.forward(PROMPT[SPLIT:], split)])
    one_by_one = np.concatenate([dec.forward([t], steps) for t in PROMPT])
    for other, cache in ((pieces, split), (one_by_one, steps)):
        assert rel_err(other, logits) < 1e-5
        for i, layer in enumerate(model.spec.layers):
            if layer.mixer == "lightning":
                a, b = cache.slot(i)["kv"], whole.slot(i)["kv"]
                assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max()
    theirs, seq = [], list(PROMPT)
    for _ in range(16):
        theirs.append(int(_oracle_logits(ref, seq)[-1].argmax()))
        seq.append(theirs[-1])
    assert generate(dec, PROMPT, Sampling(max_new_tokens=16)).ids == theirs
    assert dec._weights.unused_tensors(model.spec) == []


def test_layers_and_lightning_extras_are_read(built):
    case, path, ref, model = built
    spec, extras = model.spec, {**_RELEASE, **CASES[case]}
    assert len(spec.layers) == ref.config.num_hidden_layers
    assert [layer.mixer for layer in spec.layers] == [
        "latent" if k == "full_attention" else "lightning" for k in ref.kinds]
    s = spec.ssm
    assert (s.kind, s.qkv_layout, s.q_scaled, s.slope_eps, s.slopes, s.slope_layer_offset) == (
        "lightning", "concat", True, 0.0, "alibi", -1)
    assert (s.qk_norm, s.qkv_silu, s.norm_groups) == (extras["use_qk_norm"], extras["linear_silu"],
                                                        extras["group_norm_size"])
    assert s.rope.rotary_dim == int(LING25["head_dim"] * extras["partial_rotary_factor"]) and not s.rope.interleaved
    assert spec.latent.qk_rope_head_dim == LING25["qk_rope_head_dim"]
    assert model.decoder.new_cache().nbytes_fixed() == spec.state_bytes() > 0


def test_each_extra_is_needed_for_the_match(built):
    """The match above is not MiniMax's lightning attention by accident: switching any one of Ling 2.5's extras
    back to MiniMax's way (in ster's spec, the same weights) moves the logits away from the oracle."""
    from dataclasses import replace

    from ster_py.decoder.model import Decoder

    case, path, ref, model = built
    want, s = _oracle_logits(ref, PROMPT), model.spec.ssm
    changes = [dict(qkv_layout="per_head"), dict(rope=None), dict(qkv_silu=not s.qkv_silu),
               dict(slope_layer_offset=0)]
    changes += [dict(slopes="minimax")] if s.num_heads & (s.num_heads - 1) else []  # not a power of two
    # the query's scale reaches the logits only through the read-out norm's epsilon (the norm undoes the rest):
    # the case with a large epsilon shows it
    changes += [dict(q_scaled=False)] if s.norm_eps >= 0.5 else []
    changes += [dict(norm_groups=1)] if s.norm_groups > 1 else []
    changes += [dict(qk_norm=False)] if s.qk_norm else []
    for change in changes:
        spec = replace(model.spec, ssm=replace(s, **change))
        err = rel_err(Decoder(spec, model.decoder._weights).forward(PROMPT), want)
        assert err > 1e-3, (change, err)


_BASE = {"model_type": "bailing_hybrid", "architectures": ["BailingMoeV2_5ForCausalLM"],
         **{k: v for k, v in LING25.items()}, "num_experts": 8}


@pytest.mark.parametrize("config,match", [
    (dict(_BASE, partial_rotary_factor=1.0), "different width"),
    (dict(_BASE, qk_rope_head_dim=4), "different width"),
    (dict(_BASE, num_kv_heads_for_linear_attn=2), "num_kv_heads_for_linear_attn"),
    (dict(_BASE, group_norm_size=3), "group_norm_size"),
    (dict(_BASE, use_nGPT=True), "use_nGPT"),
    (dict(_BASE, linear_silu="false"), "linear_silu must be true or false"),
    (dict(_BASE, use_qk_norm=1), "use_qk_norm must be true or false"),
    (dict(_BASE, group_norm_size="4"), "group_norm_size"),
    (dict(_BASE, partial_rotary_factor="half"), "different width"),
    (dict(_BASE, group_norm_size=0), "group_norm_size"),
])
def test_refusals(config, match):
    """Refused by the gate or by the config reader, before any weight is read."""
    from ster_py.config import spec_from_config

    with pytest.raises(SterError, match=match):
        spec_from_config(config, gate(config, "config.json"), "config.json")


def test_inspect_reports_the_lightning_state(built):
    """ster inspect: the lightning layers' [heads, D, D] states per sequence, the latent layers' bytes per
    position."""
    from ster_py.inspect import inspect_model

    case, path, ref, model = built
    info = inspect_model(str(path))
    s, dims = model.spec.ssm, info["dimensions"]
    lightning = sum(1 for k in ref.kinds if k == "linear_attention")
    assert (dims["scan"], dims["scan_layers"], dims["ssm_heads"], dims["ssm_head_dim"]) == (
        "lightning", lightning, s.num_heads, s.d_state)
    assert info["state_bytes_per_sequence"] == lightning * s.num_heads * s.d_state ** 2 * 4
    assert info["kv_bytes_per_position"] > 0


def test_parity_against_transformers_refuses_ling25(built):
    """`ster parity --reference transformers` names what Transformers lacks instead of running Ling 3.0's class on
    a Ling 2.5 checkpoint."""
    from ster_py.parity import transformers_reference
    from ster_py.resolve import resolve

    case, path, ref, model = built
    with pytest.raises(SterError, match="Ling 2.5"):
        transformers_reference(resolve(str(path)))


def test_convert_refuses_ling25(built, tmp_path):
    """ster convert does not write Ling 2.5 (llama.cpp has no architecture for it): refused by its layer kinds,
    no file left."""
    from ster_py.convert import convert_model

    case, path, ref, model = built
    with pytest.raises(SterError, match="does not write model_type 'bailing_hybrid'"):
        convert_model(str(path), tmp_path / "x.gguf", "f16")
    assert not (tmp_path / "x.gguf").exists()
