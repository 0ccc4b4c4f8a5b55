"""Families without a Transformers implementation, second part (issue 16): telechat,
nemotron-nas, step1, plamo3, k2_horizon, each against a Transformers model of the same math.

As in ``test_parity_remote.py``, the oracle is built, not assumed: a tiny random Transformers
model whose computation is the family's once its extras are neutral is written in the family's
own layout and config spellings (seed 002), and ster on that directory must give Transformers'
logits within 1e-4 (f32), the same through the cache in two pieces, and 16 equal greedy tokens.
Each extra switched on is then compared with a small reference of that one feature written here
from the seed's words (TeleChat's key_value rows head by head; DeciLM's per-layer block_configs
with no_op halves; Step1's ALiBi by the square root of the distance; PLaMo 3's post-norm offsets;
K2-Horizon's grouped norms, output gates and value experts, as torch modules put into the
Transformers model), not from ster's decoder.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ster_py.errors import SterError
from ster_py.families import FAMILIES, gate
from ster_py.generate import Sampling, generate
from ster_py.load import load_model
from tiny import check_against, rewrite_checkpoint
from tiny import build_checkpoint
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)
from tiny import rel_err

VOCAB = 128
PROMPT = np.random.RandomState(7).randint(3, VOCAB, size=16).tolist()
LLAMA = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)




def _check_against(model, ref) -> None:
    """ster's ``model`` against Transformers' ``ref``: logits whole and in two pieces, 16 greedy tokens,
    every stored tensor read."""
    check_against(model, ref, PROMPT)


# ------------------------------------------------------------------ TeleChat (Llama, key_value by head)
def _pack_key_value(k: np.ndarray, v: np.ndarray, kv_heads: int) -> np.ndarray:
    """TeleChat's self_attention.key_value rows (seed 002): for each key/value head, its key rows then
    its value rows."""
    kh = k.reshape(kv_heads, 1, -1, *k.shape[1:])
    vh = v.reshape(kv_heads, 1, -1, *v.shape[1:])
    return np.concatenate([kh, vh], axis=1).reshape(-1, *k.shape[1:])


def _telechat(path, config: dict):
    """Transformers' Llama with a bias on o_proj and down_proj only (the others zeroed and not saved),
    rewritten under TeleChat's names (transformer.h.{i}, self_attention.query / key_value / dense,
    ln_f) and config spellings (n_head, n_layer, ffn_hidden_size, layer_norm_epsilon, seq_length)."""
    import torch

    c = dict(LLAMA, **config)
    model = build_checkpoint(path, "llama", dict(c, attention_bias=True, mlp_bias=True))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias") and any(f".{r}." in name for r in ("q_proj", "k_proj", "v_proj", "gate_proj",
                                                                          "up_proj")):
                p.zero_()
    kv = c["num_key_value_heads"]

    def rename(state: dict) -> dict:
        out = {}
        for name, t in state.items():
            if name.endswith(".bias") and any(f".{r}." in name for r in ("q_proj", "k_proj", "v_proj", "gate_proj",
                                                                          "up_proj")):
                continue
            if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
                continue
            if ".self_attn.q_proj.weight" in name:
                base = name.split(".self_attn.")[0]
                out[base.replace("model.layers.", "transformer.h.") + ".self_attention.key_value.weight"] = \
                    _pack_key_value(state[f"{base}.self_attn.k_proj.weight"], state[f"{base}.self_attn.v_proj.weight"],
                                    kv)
            for a, b in (("model.layers.", "transformer.h."), (".self_attn.q_proj.", ".self_attention.query."),
                         (".self_attn.o_proj.", ".self_attention.dense."), ("model.embed_tokens.",
                                                                             "transformer.word_embeddings."),
                         ("model.norm.", "transformer.ln_f.")):
                name = name.replace(a, b)
            out[name] = t
        return out

    rewrite_checkpoint(path, {"model_type": "telechat", "architectures": ["TeleChat2ForCausalLM"],
                    "n_head": c["num_attention_heads"],
                    "n_layer": c["num_hidden_layers"], "ffn_hidden_size": c["intermediate_size"],
                    "layer_norm_epsilon": model.config.rms_norm_eps, "seq_length": c["max_position_embeddings"],
                    "apply_residual_connection_post_layernorm": False, "embed_layernorm": False},
             drop=("num_attention_heads", "num_hidden_layers", "intermediate_size", "rms_norm_eps",
                   "max_position_embeddings", "attention_bias", "mlp_bias", "head_dim"), tensors=rename)
    return model


# ------------------------------------------------------------------ Nemotron-NAS (DeciLM's block_configs)
def _deci_width(entry: dict, hidden: int) -> int:
    """Seed 002's feed-forward width: the entry's intermediate_size, else 2 * ffn_mult * hidden / 3 rounded
    up to a multiple of 256 (DeciLM truncates to an integer first)."""
    if entry.get("intermediate_size") is not None:
        return entry["intermediate_size"]
    n = int(2 * entry["ffn_mult"] * hidden / 3)
    return -(-n // 256) * 256


def _nemotron_nas(path, config: dict):
    """Transformers' Llama whose layer i gets its block_configs entry's key/value heads
    (num_attention_heads / n_heads_in_group) and feed-forward width; a no_op half is that half with its
    output projection zeroed (o_proj or down_proj), so it adds nothing to the stream, as seed 002's
    absent half does. Saved with DeciLM's names (Llama's) minus every no_op half's weights and norm."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP

    from tiny import write_tokenizer

    c = dict(LLAMA, **config)
    blocks = c.pop("block_configs")
    c.pop("num_key_value_heads")
    torch.manual_seed(0)
    base = LlamaConfig(**c, bos_token_id=1, eos_token_id=2, pad_token_id=0, attn_implementation="eager")
    model = LlamaForCausalLM(base)
    for i, (layer, b) in enumerate(zip(model.model.layers, blocks)):
        att, ffn = b["attention"], b["ffn"]
        group = att.get("n_heads_in_group") or 1
        own = LlamaConfig(**dict(c, num_key_value_heads=c["num_attention_heads"] // group,
                                 intermediate_size=_deci_width(ffn, c["hidden_size"]) if not ffn.get("no_op") else 8),
                          attn_implementation="eager")
        layer.self_attn = LlamaAttention(own, layer_idx=i)
        layer.mlp = LlamaMLP(own)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn_like(p) * 0.3 + 1.0)
            else:
                p.copy_(torch.randn_like(p) * 0.15)
        for layer, b in zip(model.model.layers, blocks):
            if b["attention"].get("no_op"):
                layer.self_attn.o_proj.weight.zero_()
            if b["ffn"].get("no_op"):
                layer.mlp.down_proj.weight.zero_()
    model.eval()
    state = {}
    for name, t in model.state_dict().items():
        if name.startswith("model.layers."):
            i = int(name.split(".")[2])
            if blocks[i]["attention"].get("no_op") and (".self_attn." in name or ".input_layernorm." in name):
                continue
            if blocks[i]["ffn"].get("no_op") and (".mlp." in name or ".post_attention_layernorm." in name):
                continue
        state[name] = t.detach().contiguous()
    path.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    full = dict(_DECI_ENTRY)
    own_blocks = [{"attention": dict(full["attention"], **b["attention"]), "ffn": dict(full["ffn"], **b["ffn"])}
                  for b in blocks]
    (path / "config.json").write_text(json.dumps({
        **{k: v for k, v in c.items() if k != "intermediate_size"}, "model_type": "nemotron-nas",
        "architectures": ["DeciLMForCausalLM"], "block_configs": own_blocks, "rms_norm_eps": base.rms_norm_eps,
        "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 1,
        "eos_token_id": 2}))
    write_tokenizer(path, VOCAB)
    return model


# An entry as the Nemotron Super configs spell every one (the tests override what they change).
_DECI_ENTRY = {"attention": {"n_heads_in_group": 2, "no_op": False, "num_sink_tokens": None,
                             "replace_with_linear": False, "sparsify": None, "unshifted_sink": False,
                             "use_prefill_window_in_sink_attention": False,
                             "window_length": None},
               "ffn": {"ffn_mult": 1.0, "no_op": False, "replace_with_linear": False, "sparsify": None}}
_NOOP_ATT = {"n_heads_in_group": None, "no_op": True}
_NAS_BLOCKS = [
    {"attention": {"n_heads_in_group": 4}, "ffn": {"ffn_mult": 2.625}},      # one key/value head, 256 wide
    {"attention": _NOOP_ATT, "ffn": {"ffn_mult": 7.0}},                         # feed-forward only, 512 wide
    {"attention": {"n_heads_in_group": 1}, "ffn": {"no_op": True, "ffn_mult": None}},  # attention only, MHA
    {"attention": _NOOP_ATT, "ffn": {"no_op": True, "ffn_mult": None}},         # neither: the stream passes
    {"attention": {"n_heads_in_group": 2}, "ffn": {"intermediate_size": 80, "ffn_mult": None}},
]


# ------------------------------------------------------------------ Step1 (ALiBi by sqrt(distance))
def _alibi_paper_slopes(n: int) -> list[float]:
    """ALiBi's slopes (Press et al., the paper's get_slopes): for a power of two n, 2 ** (-8 i / n) for
    i = 1..n; otherwise those of the power of two below n, then every other slope of twice that."""
    def power_of_two(m: int) -> list[float]:
        return [2.0 ** (-8.0 * i / m) for i in range(1, m + 1)]
    if math.log2(n).is_integer():
        return power_of_two(n)
    below = 2 ** int(math.log2(n))
    return power_of_two(below) + power_of_two(2 * below)[0::2][:n - below]


def step1_bias(heads: int, queries: list[int], keys: int):
    """Seed 002's Step1 position signal as an additive mask float32 [1, heads, T, keys]: -slope * sqrt(q - k)
    for every key at or before the query's absolute position q, -inf after it."""
    import torch

    slopes = torch.tensor(_alibi_paper_slopes(heads), dtype=torch.float64)[:, None, None]
    q = torch.tensor(queries, dtype=torch.float64)[:, None]
    k = torch.arange(keys, dtype=torch.float64)[None, :]
    dist = q - k
    bias = -slopes * torch.sqrt(dist.clamp(min=0))
    return torch.where(dist >= 0, bias, torch.tensor(float("-inf"), dtype=torch.float64)).float()[None]


class _Step1Oracle:
    """Transformers' Llama with its rotation made the identity (cos 1, sin 0) and Step1's bias passed as
    the additive attention mask, which Transformers' eager attention adds to the scaled scores."""

    def __init__(self, model, heads: int):
        import torch

        class NoRotation(torch.nn.Module):
            def forward(self, x, position_ids):
                shape = (*position_ids.shape, model.config.head_dim)
                return torch.ones(shape, dtype=x.dtype), torch.zeros(shape, dtype=x.dtype)

        model.model.rotary_emb = NoRotation()
        self.model, self.heads = model, heads

    def logits(self, ids: list[int]) -> np.ndarray:
        import torch

        with torch.no_grad():
            mask = step1_bias(self.heads, list(range(len(ids))), len(ids))
            return self.model(torch.tensor([ids]), attention_mask=mask).logits[0].numpy()

    def greedy(self, ids: list[int], n: int) -> list[int]:
        out, ids = [], list(ids)
        for _ in range(n):
            out.append(int(self.logits(ids)[-1].argmax()))
            ids.append(out[-1])
        return out


def _step1(path, config: dict):
    """Llama's weights under Step1's config spellings (num_attention_groups, max_seq_len); the oracle is
    ``_Step1Oracle`` around the Transformers model."""
    c = dict(LLAMA, **config)
    model = build_checkpoint(path, "llama", c)
    rewrite_checkpoint(path, {"model_type": "step1", "architectures": ["Step1ForCausalLM"],
                    "num_attention_groups": c["num_key_value_heads"], "max_seq_len": c["max_position_embeddings"]},
             drop=("num_key_value_heads", "max_position_embeddings", "rope_parameters", "rope_theta", "rope_scaling",
                   "head_dim"))
    return _Step1Oracle(model, c["num_attention_heads"])


STEP1_CASES = {"step1-gqa": {}, "step1-six-heads": dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=2)}


@pytest.mark.parametrize("case", list(STEP1_CASES))
def test_step1_matches_llama_with_its_bias(case, tmp_path):
    """Logits within 1e-4 (whole and through the cache in two pieces), 16 equal greedy tokens, every
    tensor read; six heads take the paper's slopes for a head count that is not a power of two."""
    oracle = _step1(tmp_path, STEP1_CASES[case])
    model = load_model(str(tmp_path))
    assert model.spec.model_type == "step1" and all(layer.rope is None for layer in model.spec.layers)
    ref = oracle.logits(PROMPT)
    err = rel_err(model.decoder.forward(PROMPT), ref)
    assert err < 1e-4, f"logits rel err {err:.2e}"
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:9], cache), model.decoder.forward(PROMPT[9:], cache)])
    assert rel_err(pieces, ref) < 1e-4
    assert generate(model.decoder, PROMPT, Sampling(max_new_tokens=16)).ids == oracle.greedy(PROMPT, 16)
    assert model.decoder._weights.unused_tensors(model.spec) == []


def test_step1_bias_is_the_square_root_of_the_distance():
    """ster's bias table against the seed's words for a decode call at positions 5..6 of 7 keys."""
    from ster_py.decoder.positions import alibi_slopes, alibi_sqrt_bias

    ours = alibi_sqrt_bias(alibi_slopes(6), np.array([5, 6]), 7)
    ref = step1_bias(6, [5, 6], 7)[0].numpy()
    seen = np.isfinite(ref)
    np.testing.assert_allclose(ours[seen], ref[seen], rtol=1e-6)
    assert ours[2, 0, 1] == pytest.approx(-(2.0 ** -6) * 2.0)  # head 3, query 5, key 1: -2^-6 * sqrt(4)


# ------------------------------------------------------------------ PLaMo 3 (Gemma 3's block, its own offsets)
PLAMO3_POST_OFFSETS = {"post_mixer_norm": 1 / 5, "post_mlp_norm": 5 ** -1.5}  # seed 002 (modeling_plamo.py)


def _plamo3(path, config: dict):
    """Transformers' Gemma 3 text model (sandwich norms stored as offsets from one, one-row per-head q/k
    norms before the rotation, full attention on every p-th layer with its own rotation, sliding layers at
    their local base, SiLU, scores scaled by head_dim ** -0.5) written in PLaMo 3's layout and spellings:
    each post-sublayer norm re-stored as an offset from its own base (w + 1 - offset), qkv_proj and
    gate_up_proj stacked. Without scale_embedding, Gemma's sqrt(hidden) embedding scale is set to one."""
    import torch

    c = dict(LLAMA, **config)
    p, window, n = c.pop("sliding_window_pattern"), c.pop("window_size"), c["num_hidden_layers"]
    factor, local, scaled = c.pop("rope_scaling_factor", 1), c.pop("rope_local_theta"), c.pop("scale_embedding")
    initial = c.pop("initial_context_length", None)
    full = {"rope_type": "default", "rope_theta": 10000.0} if factor == 1 else {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": float(factor),
        "original_max_position_embeddings": initial,
        "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
    types = ["full_attention" if (i + 1) % p == 0 else "sliding_attention" for i in range(n)]
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    model = build_checkpoint(path, "gemma3_text", dict(
        c, head_dim=head_dim, sliding_window=window, layer_types=types, hidden_activation="silu",
        query_pre_attn_scalar=head_dim, rope_parameters={"full_attention": full, "sliding_attention": {
            "rope_type": "default", "rope_theta": local}}, final_logit_softcapping=None, attn_logit_softcapping=None,
        tie_word_embeddings=True))
    if not scaled:
        with torch.no_grad():
            model.model.embed_tokens.embed_scale.fill_(1.0)

    def rename(state: dict) -> dict:
        out = {}
        for name, t in state.items():
            if not name.startswith("model.layers."):
                out[name] = t
                continue
            i, rest = name.split(".")[2], name.split(".", 3)[3]
            base = f"model.layers.layers.{i}."
            if rest.startswith("self_attn.q_proj."):
                out[base + "mixer.qkv_proj.weight"] = np.concatenate(
                    [state[f"model.layers.{i}.self_attn.{r}_proj.weight"] for r in "qkv"])
            elif rest.startswith("mlp.gate_proj."):
                out[base + "mlp.gate_up_proj.weight"] = np.concatenate(
                    [state[f"model.layers.{i}.mlp.{r}_proj.weight"] for r in ("gate", "up")])
            elif rest.startswith(("self_attn.k_proj.", "self_attn.v_proj.", "mlp.up_proj.")):
                continue
            else:
                for a, b in (("input_layernorm", "pre_mixer_norm"), ("post_attention_layernorm", "post_mixer_norm"),
                             ("pre_feedforward_layernorm", "pre_mlp_norm"),
                             ("post_feedforward_layernorm", "post_mlp_norm"), ("self_attn.", "mixer.")):
                    rest = rest.replace(a, b)
                own = rest.split(".")[0]
                out[base + rest] = t + np.float32(1 - PLAMO3_POST_OFFSETS[own]) if own in PLAMO3_POST_OFFSETS else t
        return out

    saved = json.loads((path / "config.json").read_text())
    plamo = {k: saved[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                   "num_attention_heads", "num_key_value_heads", "rms_norm_eps",
                                   "max_position_embeddings", "bos_token_id", "eos_token_id", "pad_token_id")}
    plamo.update({"model_type": "plamo3", "architectures": ["Plamo3ForCausalLM"], "hidden_size_per_head": head_dim,
                  "window_size": window, "sliding_window_pattern": p, "rope_theta": 10000.0, "rope_local_theta": local,
                  "rope_scaling_factor": factor, "scale_embedding": scaled, "hidden_act": "silu",
                  "linear_type": "normal", "tie_word_embeddings": True})
    if initial is not None:
        plamo["initial_context_length"] = initial
    (path / "config.json").write_text(json.dumps(plamo))
    from safetensors.numpy import load_file, save_file

    save_file(rename(load_file(str(path / "model.safetensors"))), str(path / "model.safetensors"),
              metadata={"format": "pt"})
    return model


# ------------------------------------------------------------------ K2-Horizon (GLM-4.5's / Mixtral's math)
def _k2_torch_extras():
    """Seed 002's K2-Horizon extras as torch modules written here: the grouped RMS norm, the output gate
    and MoVA's value experts."""
    import torch

    class GroupedRMSNorm(torch.nn.Module):
        """Each of ``groups`` equal groups of the hidden width normalised apart, then the stored scale."""

        def __init__(self, weight, eps: float, groups: int):
            super().__init__()
            self.weight, self.eps, self.groups = torch.nn.Parameter(weight.detach().clone()), eps, groups

        def forward(self, x):
            g = x.float().reshape(*x.shape[:-1], self.groups, -1)
            g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * g.reshape(x.shape)

    class GatedOutput(torch.nn.Module):
        """o_proj(attention output * act(gate_proj(x))), x the attention's input (``seen`` by a pre-hook)."""

        def __init__(self, inner, gate, act: str):
            super().__init__()
            self.inner, self.gate_proj, self.act, self.x = inner, gate, act, None

        def forward(self, a):
            g = self.gate_proj(self.x)
            g = torch.nn.functional.silu(g) if self.act == "silu" else torch.log2(1 + torch.pow(2.0, g))
            return self.inner(a * g)

    class ValueExperts(torch.nn.Module):
        """Each value the router-weighted sum of SiLU(expert(x)) over the chosen value experts, chosen and
        weighted as the feed-forward's router does (scores, the bias added to choose, renormalised, scaled)."""

        def __init__(self, d: int, width: int, n: int, k: int, score: str, bias: bool, renorm: bool, scale: float):
            super().__init__()
            self.v_router = torch.nn.Linear(d, n, bias=bias)
            self.v_experts = torch.nn.ModuleList(torch.nn.Linear(d, width, bias=False) for _ in range(n))
            self.k, self.score, self.renorm, self.scale = k, score, renorm, scale

        def forward(self, x):
            logits = torch.nn.functional.linear(x, self.v_router.weight)
            scores = logits.sigmoid() if self.score == "sigmoid" else logits.softmax(-1)
            choose = scores + self.v_router.bias if self.v_router.bias is not None else scores
            chosen = choose.topk(self.k, dim=-1).indices
            w = scores.gather(-1, chosen)
            if self.renorm:
                w = w / (w.sum(-1, keepdim=True) + 1e-20)
            w = w * self.scale
            out = 0
            for j in range(self.k):
                e = chosen[..., j]
                per = torch.stack([torch.nn.functional.silu(ex(x)) for ex in self.v_experts], dim=-2)  # [.., n, width]
                pick = e[..., None, None].expand(*e.shape, 1, per.shape[-1])
                out = out + w[..., j:j + 1] * per.gather(-2, pick)[..., 0, :]
            return out

    return GroupedRMSNorm, GatedOutput, ValueExperts


def _k2_horizon(path, config: dict):
    """With router_score_func sigmoid: Transformers' GLM-4.5 (glm4_moe: sigmoid scores, a selection bias,
    renormalised, scaled, shared experts; whole-head rotation, no q/k norms); with softmax: Mixtral (its
    top-k renormalised, no shared experts). The extras the config switches on (layernorm_num_groups above
    one, attention_gate_func, mova_num_experts) are put in as ``_k2_torch_extras``' modules; the whole model
    is saved in K2-Horizon's layout and spellings."""
    import torch
    from safetensors.torch import save_file

    c = dict(LLAMA, **config)
    groups, gate_act = c.pop("layernorm_num_groups", 1), c.pop("attention_gate_func", None)
    mova_n, mova_k = c.pop("mova_num_experts", None), c.pop("mova_num_experts_per_tok", None)
    score, n, dense = c.pop("router_score_func"), c["num_hidden_layers"], c.pop("mlp_only_layers", [])
    experts, k, size = c.pop("num_experts"), c.pop("num_experts_per_tok"), c.pop("moe_intermediate_size")
    shared, renorm = c.pop("num_shared_experts", 0), c.pop("norm_topk_prob", True)
    scale = c.pop("router_scaling_factor", 1.0)
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    if score == "sigmoid":
        assert dense == list(range(len(dense))), "GLM-4.5 keeps its first layers dense"
        model = build_checkpoint(path, "glm4_moe", dict(
            c, head_dim=head_dim, n_routed_experts=experts, num_experts_per_tok=k, moe_intermediate_size=size,
            n_shared_experts=shared, norm_topk_prob=renorm, routed_scaling_factor=scale,
            first_k_dense_replace=len(dense),
            partial_rotary_factor=1.0, use_qk_norm=False, attention_bias=c.pop("attention_bias", False)))
    else:
        assert not dense and not shared and renorm and scale == 1.0, "Mixtral's router"
        model = build_checkpoint(path, "mixtral", dict(c, head_dim=head_dim, num_local_experts=experts,
                                                       num_experts_per_tok=k, intermediate_size=size))
    eps = model.config.rms_norm_eps
    GroupedRMSNorm, GatedOutput, ValueExperts = _k2_torch_extras()
    torch.manual_seed(5)
    with torch.no_grad():
        routed = [i not in dense for i in range(n)]
        for i, layer in enumerate(model.model.layers):
            if groups > 1:
                for name in ("input_layernorm", "post_attention_layernorm"):
                    setattr(layer, name, GroupedRMSNorm(getattr(layer, name).weight, eps, groups))
            attn = layer.self_attn
            if gate_act is not None:
                gate = torch.nn.Linear(c["hidden_size"], c["num_attention_heads"] * head_dim, bias=False)
                gate.weight.copy_(torch.randn_like(gate.weight) * 0.3)
                attn.o_proj = GatedOutput(attn.o_proj, gate, gate_act)
                attn.register_forward_pre_hook(
                    lambda mod, args, kwargs: setattr(mod.o_proj, "x", kwargs.get("hidden_states", args[0] if args
                                                                                  else None)), with_kwargs=True)
            if mova_n and routed[i]:
                attn.v_proj = ValueExperts(c["hidden_size"], c["num_key_value_heads"] * head_dim, mova_n, mova_k, score,
                                           score == "sigmoid", renorm, scale)
                for p in attn.v_proj.parameters():
                    p.copy_(torch.randn_like(p) * (0.3 if p.ndim > 1 else 0.2))
        if groups > 1:
            model.model.norm = GroupedRMSNorm(model.model.norm.weight, eps, groups)
    model.eval()
    out = {}
    for name, t in model.state_dict().items():
        t = t.detach().contiguous()
        if name.endswith("mlp.experts.gate_up_proj"):
            for e in range(experts):
                out[name.replace("gate_up_proj", f"{e}.gate_proj.weight")] = t[e, :size].contiguous()
                out[name.replace("gate_up_proj", f"{e}.up_proj.weight")] = t[e, size:].contiguous()
            continue
        if name.endswith("mlp.experts.down_proj"):
            for e in range(experts):
                out[name.replace("down_proj", f"{e}.down_proj.weight")] = t[e].contiguous()
            continue
        name = (name.replace("mlp.gate.e_score_correction_bias", "mlp.gate.bias").replace("self_attn.o_proj.inner.",
                "self_attn.o_proj.").replace("self_attn.o_proj.gate_proj.", "self_attn.gate_proj.")
                .replace("self_attn.v_proj.v_", "self_attn.v_"))
        if t.numel() and "rotary" not in name:  # (GLM-4.5 without shared experts keeps them 0 wide)
            out[name] = t
    path.mkdir(parents=True, exist_ok=True)
    save_file(out, str(path / "model.safetensors"), metadata={"format": "pt"})
    own = {key: c[key] for key in LLAMA} | {
        "model_type": "k2_horizon", "architectures": ["K2HorizonForCausalLM"], "head_dim": head_dim,
        "rms_norm_eps": eps, "rope_theta": model.config.rope_parameters["rope_theta"], "hidden_act": "silu",
        "tie_word_embeddings": False, "num_experts": experts, "num_experts_per_tok": k, "moe_intermediate_size": size,
        "num_shared_experts": shared,
        "router_score_func": score, "moe_gate_bias": score == "sigmoid", "norm_topk_prob": renorm,
        "router_scaling_factor": scale, "mlp_only_layers": dense, "decoder_sparse_step": 1,
        "attention_bias": config.get("attention_bias", False), "layernorm_num_groups": groups,
        "bos_token_id": 1, "eos_token_id": 2}
    if gate_act is not None:
        own["attention_gate_func"] = gate_act
    if mova_n:
        own |= {"mova_num_experts": mova_n, "mova_num_experts_per_tok": mova_k}
    (path / "config.json").write_text(json.dumps(own))
    return model


_K2 = dict(head_dim=16, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24)


BUILD = {"telechat": _telechat, "nemotron-nas": _nemotron_nas, "plamo3": _plamo3, "k2_horizon": _k2_horizon}
UNCONFIRMED = tuple(BUILD) + ("step1",)
CASES = {
    "telechat-gqa": ("telechat", {}),
    "telechat-mha": ("telechat", dict(num_key_value_heads=4)),
    "nemotron-nas-blocks": ("nemotron-nas", dict(num_hidden_layers=5, block_configs=_NAS_BLOCKS)),
    "plamo3-yarn-scaled": ("plamo3", dict(num_hidden_layers=4, sliding_window_pattern=2, window_size=5,
                                          rope_local_theta=500.0, rope_scaling_factor=4, initial_context_length=8,
                                          scale_embedding=True)),
    "k2-sigmoid-bias-shared": ("k2_horizon", dict(_K2, router_score_func="sigmoid", num_shared_experts=1,
                                                  mlp_only_layers=[0], router_scaling_factor=1.5, attention_bias=True)),
    "k2-softmax": ("k2_horizon", dict(_K2, router_score_func="softmax")),
    # the extras, each against its module in _k2_torch_extras
    "k2-grouped-norms": ("k2_horizon", dict(_K2, router_score_func="sigmoid", layernorm_num_groups=4,
                                            mlp_only_layers=[0])),
    "k2-gate-silu": ("k2_horizon", dict(_K2, router_score_func="softmax", attention_gate_func="silu")),
    "k2-mova-sigmoid-bias": ("k2_horizon", dict(_K2, router_score_func="sigmoid", mova_num_experts=4,
                                                mova_num_experts_per_tok=2, mlp_only_layers=[0],
                                                router_scaling_factor=1.3, num_shared_experts=1)),
    "k2-mova-softmax-all-extras": ("k2_horizon", dict(_K2, router_score_func="softmax", mova_num_experts=3,
                                                      mova_num_experts_per_tok=2, layernorm_num_groups=2,
                                                      attention_gate_func="silu")),
    "k2-gate-softplus": ("k2_horizon", dict(_K2, router_score_func="sigmoid", attention_gate_func="softplus",
                                            num_shared_experts=1)),
    "plamo3-plain-unscaled": ("plamo3", dict(num_hidden_layers=3, sliding_window_pattern=3, window_size=6,
                                             rope_local_theta=1000.0, scale_embedding=False)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_family_matches_its_oracle(case, tmp_path):
    model_type, config = CASES[case]
    ref = BUILD[model_type](tmp_path, config)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == model_type
    model = load_model(str(tmp_path))
    assert model.spec.model_type == model_type
    _check_against(model, ref)


def test_telechat_key_value_rows_are_split_head_by_head(tmp_path):
    """The key_value split, against seed 002's words: row block 2j of the matrix is head j's key,
    2j + 1 its value (not all keys then all values, which the GQA case above would also catch)."""
    _telechat(tmp_path, {})
    model = load_model(str(tmp_path))
    from safetensors.numpy import load_file

    kv = load_file(str(tmp_path / "model.safetensors"))["transformer.h.1.self_attention.key_value.weight"]
    d = model.spec.head_dim
    blocks = kv.reshape(-1, d, kv.shape[1])  # [2 * kv_heads, d, hidden]
    layer = model.decoder.layers[1]
    np.testing.assert_array_equal(np.asarray(layer.k.weight), blocks[0::2].reshape(-1, kv.shape[1]))
    np.testing.assert_array_equal(np.asarray(layer.v.weight), blocks[1::2].reshape(-1, kv.shape[1]))


@pytest.fixture(scope="module")
def nas_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("nemotron_nas")
    _nemotron_nas(path, dict(num_hidden_layers=5, block_configs=_NAS_BLOCKS))
    return load_model(str(path))


def test_nemotron_nas_layers_follow_their_block_configs(nas_model):
    """Each layer's shape as seed 002 words it (widths by the test's own formula), and a layer with
    neither half leaves the stream as it found it."""
    model = nas_model
    layers = model.spec.layers
    assert [(layer.mixer, layer.ffn) for layer in layers] == [("attention", "dense"), ("none", "dense"),
                                                             ("attention", "none"), ("none", "none"),
                                                             ("attention", "dense")]
    assert [model.spec.attention_shape(i)[1] for i in (0, 2, 4)] == [1, 4, 2]
    widths = [np.asarray(model.decoder.layers[i].down.weight).shape[1] for i in (0, 1, 4)]
    assert widths == [_deci_width({"ffn_mult": 2.625}, 64), _deci_width({"ffn_mult": 7.0}, 64), 80] == [256, 512, 80]
    assert [model.spec.layer_norms(i) for i in range(4)] == [("attn_norm", "ffn_norm"), ("ffn_norm",), ("attn_norm",),
                                                             ()]
    states: list = []
    model.decoder.forward(PROMPT, hidden_states=states)
    np.testing.assert_array_equal(states[4], states[3])  # layer 3's output is its input
    assert not np.allclose(states[3], states[2])


def test_nemotron_nas_refuses_adapters(nas_model):
    """Seed 002: adapter training is refused, since no projection has one shape on every layer."""
    from pathlib import Path

    from ster_py.adapters import LoraAdapter, check_adapter_for

    model = nas_model
    ad = LoraAdapter(Path("a"), "ster", None, None, 2, 4.0, False, 64,
                     {(0, "q"): (np.zeros((2, 64), np.float32), np.zeros((64, 2), np.float32))})
    with pytest.raises(SterError, match="no projection has one shape on every layer"):
        check_adapter_for(ad, model.resolved, model.spec, lambda role: True)


def test_plamo3_post_norms_apply_their_offsets(tmp_path):
    """The offsets against seed 002's words: post_mixer_norm applies its stored w as w + 1/5, post_mlp_norm
    as w + 5 ** -1.5, pre_mixer_norm as 1 + w (a numpy RMS norm here, not ster's)."""
    from safetensors.numpy import load_file

    _plamo3(tmp_path, dict(CASES["plamo3-plain-unscaled"][1]))
    model = load_model(str(tmp_path))
    stored = load_file(str(tmp_path / "model.safetensors"))
    eps = json.loads((tmp_path / "config.json").read_text())["rms_norm_eps"]
    x = np.random.RandomState(1).randn(5, 64).astype(np.float32)
    rms = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + eps)
    for role, name, offset in (("attn_post_norm", "post_mixer_norm", 1 / 5),
                               ("ffn_post_norm", "post_mlp_norm", 5 ** -1.5),
                               ("attn_norm", "pre_mixer_norm", 1.0), ("ffn_norm", "pre_mlp_norm", 1.0)):
        w = stored[f"model.layers.layers.1.{name}.weight"].astype(np.float64)
        np.testing.assert_allclose(model.decoder.layers[1].norms[role](x), rms * (w + offset), rtol=2e-5, atol=1e-6)


def test_value_experts_equal_their_numpy_reference():
    """decoder/mova.py's grouped loop against its per-token float64 definition, sigmoid scores with a
    selection bias, renormalised and scaled (the router of the k2-mova-sigmoid-bias case)."""
    from ster_py.decoder.linear import make_linear
    from ster_py.decoder.moe import RouterSpec
    from ster_py.decoder.mova import ValueExperts, value_experts_reference

    rng = np.random.RandomState(3)
    spec = RouterSpec(num_experts=5, top_k=2, scoring="sigmoid", select_bias=True, renormalize=True,
                      renorm_eps=1e-20, scale=1.3)
    router, bias = rng.randn(5, 16).astype(np.float32), rng.randn(5).astype(np.float32)
    experts = [rng.randn(8, 16).astype(np.float32) for _ in range(5)]
    x = rng.randn(7, 16).astype(np.float32)
    ours = ValueExperts(spec, make_linear(router), bias, [make_linear(w) for w in experts])(x)
    np.testing.assert_allclose(ours, value_experts_reference(spec, router, bias, experts, x), rtol=1e-5, atol=1e-6)


def test_k2_horizon_value_adapters_are_refused(tmp_path):
    """Seed 002: under mova_num_experts no value adapter is trained (an adapter on q still fits)."""
    from pathlib import Path

    from ster_py.adapters import LoraAdapter, check_adapter_for

    _k2_horizon(tmp_path, dict(CASES["k2-mova-sigmoid-bias"][1]))
    model = load_model(str(tmp_path))

    def adapter(target: str, out: int) -> LoraAdapter:
        return LoraAdapter(Path("a"), "ster", None, None, 2, 4.0, False, 64,
                           {(1, target): (np.zeros((2, 64), np.float32), np.zeros((out, 2), np.float32))})
    check_adapter_for(adapter("q", 64), model.resolved, model.spec, lambda role: True)
    with pytest.raises(SterError, match="value experts"):
        check_adapter_for(adapter("v", 32), model.resolved, model.spec, lambda role: True)


def test_telechat_dynamic_rotation_without_alpha_is_the_plain_one():
    """Seed 002: TeleChat's dynamic scaling without an alpha changes the base only past
    max_position_embeddings (seq_length), so within it the rotation is the plain one."""
    from ster_py.config import spec_from_config

    base = {"model_type": "telechat", "vocab_size": VOCAB, "hidden_size": 64, "n_head": 4, "n_layer": 2,
            "ffn_hidden_size": 96, "seq_length": 64}
    plain = spec_from_config(base, gate(base, "config.json")).layers[0].rope
    dynamic = dict(base, rope_scaling={"type": "dynamic", "factor": 2.0})
    rope = spec_from_config(dynamic, gate(dynamic, "config.json")).layers[0].rope
    positions = np.arange(64)
    for a, b in zip(plain.cos_sin(positions, 64), rope.cos_sin(positions, 64)):
        np.testing.assert_array_equal(a, b)


def test_these_families_say_they_have_no_reference_here():
    from typer.testing import CliRunner

    from ster_py.cli import app

    rows = json.loads(CliRunner().invoke(app, ["families", "--json"]).stdout)
    notes = {r["model_type"]: r["note"] for r in rows}
    for model_type in UNCONFIRMED:
        assert FAMILIES[model_type].unconfirmed and notes[model_type] == "no reference implementation here"


@pytest.mark.parametrize("model_type,config,match", [
    ("telechat", {"apply_residual_connection_post_layernorm": True}, "apply_residual_connection_post_layernorm"),
    ("telechat", {"embed_layernorm": True}, "embed_layernorm"),
    ("plamo3", {"linear_type": "fp8"}, "linear_type"),
    ("k2_horizon", dict(_K2, rope_head_dim=8), "rope_head_dim"),
    ("k2_horizon", dict(_K2, query_key_norm=True), "query_key_norm"),
    ("k2_horizon", dict(_K2, attention_gate_func="tanh"), "attention_gate_func"),
    ("k2_horizon", dict(_K2, layernorm_num_groups=5), "layernorm_num_groups"),
    ("k2_horizon", dict(_K2, mova_num_experts=4, mova_num_experts_per_tok=5), "mova_num_experts_per_tok"),
    ("nemotron-nas", {}, "block_configs"),
    ("nemotron-nas", {"block_configs": [_DECI_ENTRY] * 2}, "block_configs"),
    ("nemotron-nas", {"block_configs": [_DECI_ENTRY, _DECI_ENTRY, {**_DECI_ENTRY, "ffn": {
        "ffn_mult": 1.0, "replace_with_linear": True}}]}, "replace_with_linear"),
    ("nemotron-nas", {"block_configs": [_DECI_ENTRY] * 2 + [{**_DECI_ENTRY, "attention": {
        "n_heads_in_group": 2, "sparsify": ["x"]}}]}, "sparsify"),
    ("nemotron-nas", {"block_configs": [_DECI_ENTRY] * 2 + [{**_DECI_ENTRY, "attention": {
        "n_heads_in_group": 2, "window_length": 32}}]}, "window_length"),
    ("nemotron-nas", {"block_configs": [_DECI_ENTRY] * 2 + [{**_DECI_ENTRY, "attention": {
        "n_heads_in_group": 2, "num_sink_tokens": 4}}]}, "num_sink_tokens"),
    ("nemotron-nas", {"block_configs": [_DECI_ENTRY] * 2 + [{**_DECI_ENTRY, "ffn": {
        "ffn_mult": 1.0, "hidden_act": "relu"}}]}, "hidden_act"),
    ("nemotron-nas", {"block_configs": [_DECI_ENTRY] * 2 + [{**_DECI_ENTRY, "attention": {
        "n_heads_in_group": 3}}]}, "n_heads_in_group"),
    ("nemotron-nas", {"block_configs": [_DECI_ENTRY] * 2 + [{**_DECI_ENTRY, "ffn": {"ffn_mult": None}}]},
     "ffn_mult"),
])
def test_refusals(model_type, config, match):
    """Refused by the gate or by the config reader, in either case before any weight is read."""
    from ster_py.config import spec_from_config

    config = {"model_type": model_type, **LLAMA, **config}
    with pytest.raises(SterError, match=match):
        spec_from_config(config, gate(config, "config.json"), "config.json")
