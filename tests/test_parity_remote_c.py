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
- step3_text: Transformers' Llama whose q_proj is a Linear to share_q_dim, Llama's RMS norm and a
  Linear to the heads (wq), and whose moe_layers_enum layers take Transformers' Qwen3-MoE sparse block
  (softmax, top k, renormalised under norm_expert_weight) plus Llama's MLP as the shared expert; saved
  under Step3's names (experts stacked under moe), also inside a step3_vl config with a vision tower.
- longcat_flash_ngram: Transformers' LongCat-Flash saved as LongCat-Flash-Lite with zero n-gram tables
  (the stored token embedding scaled by 1 + k (n - 1), which the average divides back); with random
  tables, against LongCat-Flash given as inputs_embeds the embedding a numpy reference of the seed's
  hash computes (``ngram_embeddings_reference``), on a prompt holding an end-of-sequence token.

bailing_hybrid (Ling 3.0) has a Transformers implementation (BailingHybrid): its tiny random
checkpoints are checked as test_parity_ssm_b2 checks the delta-rule families (logits, hidden states,
prefill in pieces and token by token with the same recurrent state, 16 greedy tokens through
Transformers' cache), with the layer kinds seed 002 states given to Transformers (a group's last layer
and every layer after the last whole group attend; Transformers' own default makes the trailing layers
linear) and the config rewritten in the release's spelling; Step 3.5's per-layer clamps (which
BailingHybrid lacks) are checked against its experts with the clamp written here from the seed's words.
Ling 2.5 (lightning attention) is tested in tests/test_parity_ling25.py.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from ster_py.errors import SterError
from ster_py.families import FAMILIES, gate
from ster_py.load import load_model
from tiny import check_against, rewrite_checkpoint
from tiny import build_checkpoint
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)
from tiny import rel_err

VOCAB = 128
PROMPT = np.random.RandomState(5).randint(3, VOCAB, size=16).tolist()




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
    rewrite_checkpoint(path, own, drop=drop, tensors=tensors)
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
    rewrite_checkpoint(path, {"model_type": "nemotron_h_puzzle", "architectures": ["NemotronHPuzzleForCausalLM"],
                    "layers_block_type": kinds, "block_configs": blocks},
             drop=("hybrid_override_pattern", "num_experts_per_tok", "moe_intermediate_size", "mtp_layers_block_type"))
    return model


# ------------------------------------------------------------------ Step3's text decoder (Llama + bottleneck + experts)
STEP3 = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             head_dim=16, max_position_embeddings=64, share_q_dim=24, moe_num_experts=6, moe_top_k=2,
             moe_intermediate_size=32, share_expert_dim=40)


def _step3_modules(hidden: int, heads: int, head_dim: int, share_q: int, eps: float, experts: int, top_k: int,
                   size: int, shared: int, renorm: bool):
    """Seed 002's Step3 parts from Transformers' modules: the query as wq(inter_norm(q_proj(x))) (two
    Linears around Llama's RMS norm), and a routed feed-forward as Transformers' Qwen3-MoE sparse block
    (softmax over every expert, the top k, renormalised under ``renorm``) plus Llama's MLP as the
    shared expert, ``shared`` wide."""
    import torch
    from transformers import LlamaConfig, Qwen3MoeConfig
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    class Query(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.narrow = torch.nn.Linear(hidden, share_q, bias=False)
            self.inter_norm = LlamaRMSNorm(share_q, eps=eps)
            self.wq = torch.nn.Linear(share_q, heads * head_dim, bias=False)

        def forward(self, x):
            return self.wq(self.inter_norm(self.narrow(x)))

    moe_config = Qwen3MoeConfig(hidden_size=hidden, num_experts=experts, num_experts_per_tok=top_k,
                                moe_intermediate_size=size, norm_topk_prob=renorm, hidden_act="silu")

    class Routed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.routed = Qwen3MoeSparseMoeBlock(moe_config)
            self.shared = LlamaMLP(LlamaConfig(hidden_size=hidden, intermediate_size=shared))

        def forward(self, x):
            return self.routed(x) + self.shared(x)

    return Query, Routed


def _step3(path, config: dict):
    """Llama with every query through the bottleneck and the routed layers' MLP swapped (``_step3_modules``),
    every weight redrawn, saved under Step3's names and config spellings (experts stacked under moe)."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from tiny import write_tokenizer

    c = dict(STEP3, **config)
    wrapped, vision = c.pop("wrapped", False), c.pop("vision", False)
    n, groups = c["num_hidden_layers"], c.get("num_attention_groups", 1)
    enum, renorm = c.get("moe_layers_enum"), c.get("norm_expert_weight", False)
    routed = ([int(x) for x in enum.split(",")] if isinstance(enum, str) else list(enum)) if enum is not None \
        else list(range(1, n))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"], num_hidden_layers=n,
        num_attention_heads=c["num_attention_heads"], num_key_value_heads=groups, head_dim=c["head_dim"],
        max_position_embeddings=c["max_position_embeddings"], rms_norm_eps=1e-5, rope_theta=500000.0,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, attn_implementation="eager"))
    Query, Routed = _step3_modules(c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["share_q_dim"], 1e-5,
                                   c["moe_num_experts"], c["moe_top_k"], c["moe_intermediate_size"],
                                   c["share_expert_dim"], renorm)
    for i, layer in enumerate(model.model.layers):
        layer.self_attn.q_proj = Query()
        if i in routed:
            layer.mlp = Routed()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.3 + 1.0 if "norm" in name else torch.randn_like(p) * 0.15)
    model.eval()

    f, out = c["moe_intermediate_size"], {}
    for name, t in model.state_dict().items():
        t = t.detach().contiguous()
        stem = name.split(".mlp.")[0]
        if ".self_attn.q_proj." in name:
            name = name.replace("q_proj.narrow.", "q_proj.").replace("q_proj.inter_norm.", "inter_norm.")
            name = name.replace("q_proj.wq.", "wq.")
        elif ".mlp.routed.experts.gate_up_proj" in name:
            out[stem + ".moe.gate_proj.weight"], out[stem + ".moe.up_proj.weight"] = t[:, :f].contiguous(), \
                t[:, f:].contiguous()
            continue
        elif ".mlp.routed.experts.down_proj" in name:
            name = stem + ".moe.down_proj.weight"
        elif ".mlp.routed.gate." in name:
            name = name.replace(".mlp.routed.gate.", ".moe.gate.")
        elif ".mlp.shared." in name:
            name = name.replace(".mlp.shared.", ".share_expert.")
        out[name] = t
    if vision:  # a vision tower and projector beside the decoder, as a Step3-VL checkpoint stores them
        g = torch.Generator().manual_seed(3)
        out.update({"vision_model.embeddings.patch_embedding.weight": torch.randn(8, 3, 2, 2, generator=g),
                    "vit_downsampler.weight": torch.randn(8, 8, 2, 2, generator=g),
                    "vit_large_projector.weight": torch.randn(64, 16, generator=g)})
    path.mkdir(parents=True, exist_ok=True)
    save_file(out, str(path / "model.safetensors"), metadata={"format": "pt"})
    text = {k: c[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                              "num_attention_heads", "head_dim", "share_q_dim", "moe_num_experts", "moe_top_k",
                              "moe_intermediate_size", "share_expert_dim")}
    text |= {"num_attention_groups": groups, "max_position_embedding": c["max_position_embeddings"],
             "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "bos_token_id": 1, "eos_token_id": 2}
    text |= {k: c[k] for k in ("moe_layers_enum", "norm_expert_weight") if k in c}
    own = ({"model_type": "step3_vl", "architectures": ["Step3VLForConditionalGeneration"],
            "text_config": dict(text, model_type="step3_text"), "vision_config": {"hidden_size": 8}} if wrapped
           else dict(text, model_type="step3_text", architectures=["Step3TextForCausalLM"]))
    (path / "config.json").write_text(json.dumps(own))
    write_tokenizer(path, VOCAB)
    return model


# ------------------------------------------------------------------ Ling 3.0 (bailing_hybrid: Transformers directly)
LING3 = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2, n_group=2,
             topk_group=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=4,
             v_head_dim=12, qk_nope_head_dim=8, head_dim=16, short_conv_kernel_size=3, layer_group_size=2,
             max_position_embeddings=64)
# Transformers' spellings (its attribute_map) -> the release's
_LING3_HUB = {"moe_renormalize": "norm_topk_prob", "num_expert_group": "n_group",
              "num_experts_per_token": "num_experts_per_tok", "model_max_length": "max_position_embeddings"}


def _ling3_layer_types(n: int, group: int) -> list[str]:
    """Seed 002's layer kinds (written here from its words): latent attention on every layer that closes a
    group of ``group`` or follows the last whole group, Kimi Delta Attention on the others."""
    return ["full_attention" if (i + 1) % group == 0 or i >= n // group * group else "linear_attention"
            for i in range(n)]


def _bailing_hybrid(path, config: dict):
    """Transformers' BailingHybrid (Ling 3.0) given the seed's layer kinds; saved by Transformers (Ling's
    names) and, unless ``as_saved``, its config.json rewritten in the release's spelling (no layer_types,
    head_dim the linear heads' width, BailingMoeV3ForCausalLM)."""
    c = dict(LING3, **config)
    as_saved = c.pop("as_saved", False)
    limits = {k: c.pop(k) for k in ("expert_swiglu_limit_list", "share_expert_swiglu_limit_list") if k in c}
    c["layer_types"] = _ling3_layer_types(c["num_hidden_layers"], c["layer_group_size"])
    model = build_checkpoint(path, "bailing_hybrid", c)
    if limits:
        n = c["num_hidden_layers"]
        _clamp_experts(model, *(limits.get(k, [0.0] * n) for k in ("expert_swiglu_limit_list",
                                                                    "share_expert_swiglu_limit_list")))
        rewrite_checkpoint(path, limits)  # the lists as a release states them, one entry per MTP layer more
    if as_saved:
        return model
    saved = json.loads((path / "config.json").read_text())
    hub = {_LING3_HUB.get(k, k): v for k, v in saved.items()}
    for key in ("layer_types", "mlp_layer_types", "linear_head_dim", "linear_num_heads", "linear_conv_kernel_dim",
                "qk_head_dim", "rope_parameters", "num_local_experts"):
        hub.pop(key, None)
    hub.update(architectures=["BailingMoeV3ForCausalLM"], head_dim=c["head_dim"], num_experts=c["num_local_experts"],
               no_kda_lora=True, gated_attention_proj_granularity_type="head_wise")
    (path / "config.json").write_text(json.dumps(hub))
    return model


def _clamp_experts(model, routed_limits: list, shared_limits: list) -> None:
    """Seed 002's Step 3.5 clamp on each routed layer of a Transformers DeepSeek-V3-style model (written here
    from its words): where a layer's entry is not zero, the routed (``routed_limits``) or shared
    (``shared_limits``) experts compute min(silu(gate), limit) * clamp(up, -limit, limit)."""
    import types

    import torch

    def unit(gate, up, limit):
        act = torch.nn.functional.silu(gate)
        return act * up if not limit else torch.clamp(act, max=limit) * torch.clamp(up, -limit, limit)

    def experts_forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        for e in range(self.num_experts):
            token, slot = torch.where(top_k_index == e)
            if token.numel() == 0:
                continue
            gate, up = torch.nn.functional.linear(hidden_states[token], self.gate_up_proj[e]).chunk(2, dim=-1)
            y = torch.nn.functional.linear(unit(gate, up, self.limit), self.down_proj[e])
            out.index_add_(0, token, y * top_k_weights[token, slot, None])
        return out

    def shared_forward(self, x):
        return self.down_proj(unit(self.gate_proj(x), self.up_proj(x), self.limit))

    for i, layer in enumerate(model.model.layers):
        if not hasattr(layer.mlp, "experts"):
            continue
        layer.mlp.experts.limit, layer.mlp.shared_experts.limit = routed_limits[i], shared_limits[i]
        layer.mlp.experts.forward = types.MethodType(experts_forward, layer.mlp.experts)
        layer.mlp.shared_experts.forward = types.MethodType(shared_forward, layer.mlp.shared_experts)


# ------------------------------------------------------------------ LongCat-Flash-Lite (LongCat-Flash + n-grams)
NGRAM = dict(emb_neighbor_num=3, emb_split_num=2, ngram_vocab_size_ratio=0.5)


def _ngram_table_rows(vocab: int, ratio: float, n: int, k: int) -> list[int]:
    """Seed 002: table index (order - 2) * k + j is ratio * vocab + 2 * index + 1 rows tall."""
    return [int(ratio * vocab + 2 * i + 1) for i in range(k * (n - 1))]


def ngram_embeddings_reference(ids: list[int], word, tables, projs, vocab: int, n: int, k: int, eos: set) -> np.ndarray:
    """The n-gram embedding as seed 002 words it, one position at a time (independent of ster's code):
    for order o in 2..n and split j (table i = (o - 2) * k + j, R rows), the token and the o - 1 before it
    hash to (token + sum_d previous_d * (vocab^d mod R)) mod R, a token before the start of its run (a run
    restarts after each eos) counting as zero; the token embedding and every table row's projection are
    averaged. float64 [T, hidden]."""
    out = []
    for p, tok in enumerate(ids):
        start = 0
        for q in range(p):
            if ids[q] in eos:
                start = q + 1
        acc = np.asarray(word[tok], np.float64).copy()
        for o in range(2, n + 1):
            for j in range(k):
                i = (o - 2) * k + j
                R = tables[i].shape[0]
                h = tok
                for d in range(1, o):
                    prev = ids[p - d] if p - d >= start else 0
                    h += prev * ((vocab ** d) % R)
                acc += projs[i].astype(np.float64) @ tables[i][h % R].astype(np.float64)
        out.append(acc / (1 + k * (n - 1)))
    return np.stack(out)


def _longcat_ngram(path, config: dict):
    """Transformers' LongCat-Flash (test_parity_mla_b's tiny case) saved as LongCat-Flash-Lite: the token
    embedding below model.ngram_embeddings, n-gram tables and projections beside it. With ``zero_tables``
    the tables are zero, so the embedding is the token's divided by 1 + k (n - 1): the stored token
    embedding is Transformers' times that. Otherwise the returned oracle's embedding is
    ``ngram_embeddings_reference`` (the model is given it as inputs_embeds; ``.ngram`` holds the tables)."""
    import test_parity_mla_b

    c = dict(config)
    zero, no_type = c.pop("zero_tables", False), c.pop("leave_model_type_out", False)
    ngram = {key: c.pop(key, v) for key, v in NGRAM.items()}
    model = build_checkpoint(path, "longcat_flash", dict(test_parity_mla_b.LONGCAT, **c))
    n, k, ratio = ngram["emb_neighbor_num"], ngram["emb_split_num"], ngram["ngram_vocab_size_ratio"]
    hidden, count = model.config.hidden_size, k * (n - 1)
    rng = np.random.RandomState(9)
    rows = _ngram_table_rows(VOCAB, ratio, n, k)
    tables = [np.zeros((r, hidden // count), np.float32) if zero else
              (rng.randn(r, hidden // count) * 0.5).astype(np.float32) for r in rows]
    projs = [(rng.randn(hidden, hidden // count) * 0.3).astype(np.float32) for _ in rows]

    def tensors(state: dict) -> dict:
        out = {name: t for name, t in state.items() if name != "model.embed_tokens.weight"}
        word = state["model.embed_tokens.weight"] * np.float32(1 + count if zero else 1)
        out["model.ngram_embeddings.word_embeddings.weight"] = word
        for i, (t, pr) in enumerate(zip(tables, projs)):
            out[f"model.ngram_embeddings.embedders.{i}.weight"] = t
            out[f"model.ngram_embeddings.post_projs.{i}.weight"] = pr
        return out

    own = {"architectures": ["LongcatFlashNgramForCausalLM"], **ngram, "eos_token_id": 2}
    if not no_type:
        own["model_type"] = "longcat_flash_ngram"
    rewrite_checkpoint(path, own, drop=("model_type",) if no_type else (), tensors=tensors)
    word = model.model.embed_tokens.weight.detach().numpy()
    model.ngram = dict(word=word, tables=tables, projs=projs, n=n, k=k)
    return model


BUILD = {"pangu_ultra_moe": _pangu_ultra, "nemotron_h_puzzle": _nemotron_puzzle, "step3_text": _step3,
         "bailing_hybrid": _bailing_hybrid, "longcat_flash_ngram": _longcat_ngram}
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
    "step3_text": ("step3_text", {}),
    "step3_text-enum-renorm-groups": ("step3_text", dict(num_hidden_layers=4, moe_layers_enum="0,2",
                                                         norm_expert_weight=True, num_attention_groups=2, moe_top_k=3)),
    "step3_text-in-step3_vl": ("step3_text", dict(wrapped=True, vision=True, moe_layers_enum="1")),
    "longcat_flash_ngram-zero-tables": ("longcat_flash_ngram", dict(zero_tables=True)),
    "longcat_flash_ngram-zero-tables-no-model-type": ("longcat_flash_ngram", dict(
        zero_tables=True, leave_model_type_out=True, emb_neighbor_num=4, emb_split_num=1, ngram_vocab_size_ratio=2)),
}
# Families with a Transformers implementation: checked as the delta-rule families are (test_parity_ssm_b2.check_delta).
HYBRID_CASES = {
    "bailing_hybrid": ("bailing_hybrid", {}),
    "bailing_hybrid-trailing-q-lora-unsafe-gate": ("bailing_hybrid", dict(
        num_hidden_layers=5, q_lora_rank=24, kda_safe_gate=False, num_shared_experts=2, routed_scaling_factor=1.5)),
    # Transformers' BailingHybrid ties no weights: its lm_head is read whatever tie_word_embeddings says
    "bailing_hybrid-tied-in-name-only": ("bailing_hybrid", dict(tie_word_embeddings=True)),
    "bailing_hybrid-clamps": ("bailing_hybrid", dict(
        expert_swiglu_limit_list=[0.0, 0.4, 0.0, 0.3, 7.0], share_expert_swiglu_limit_list=[0.0, 0.0, 0.35, 0.5, 7.0])),
    "bailing_hybrid-as-saved-bound-no-renorm-group3": ("bailing_hybrid", dict(
        as_saved=True, num_hidden_layers=6, layer_group_size=3, kda_lower_bound=-3.0, norm_topk_prob=False,
        first_k_dense_replace=0, n_group=1, topk_group=1, num_experts_per_tok=3, short_conv_kernel_size=4)),
}


def build(path, model_type: str, config: dict):
    return BUILD[model_type](path, config)


def _check(path, ref, model_type: str):
    saved = json.loads((path / "config.json").read_text())
    assert saved.get("text_config", saved).get("model_type", model_type) == model_type
    assert "model_type" in saved or saved["architectures"] == ["LongcatFlashNgramForCausalLM"]
    model = load_model(str(path))
    assert model.spec.model_type == model_type
    check_against(model, ref, PROMPT)
    return model


@pytest.mark.parametrize("case", list(CASES))
def test_family_matches_its_oracle(case, tmp_path):
    model_type, config = CASES[case]
    _check(tmp_path, build(tmp_path, model_type, config), model_type)


@pytest.mark.parametrize("case", list(HYBRID_CASES))
def test_hybrid_family_matches_transformers(case, tmp_path):
    from test_parity_ssm_b2 import check_delta

    model_type, config = HYBRID_CASES[case]
    ref = build(tmp_path, model_type, config)
    model = check_delta(tmp_path, ref)
    assert model.spec.model_type == model_type
    n, g = ref.config.num_hidden_layers, ref.config.layer_group_size
    assert [layer.mixer for layer in model.spec.layers] == [
        "latent" if t == "full_attention" else "kda" for t in _ling3_layer_types(n, g)]


@pytest.mark.parametrize("ngram", [NGRAM, dict(emb_neighbor_num=4, emb_split_num=3, ngram_vocab_size_ratio=0.3)])
def test_longcat_ngram_tables_against_the_seed(ngram, tmp_path):
    """Non-zero n-gram tables: ster's logits against Transformers' LongCat-Flash given the embedding
    ``ngram_embeddings_reference`` computes from the seed's words, on a prompt with an end-of-sequence
    token inside (a run restarts after it); the same through the cache in pieces and token by token (the
    cache keeps the tokens the n-grams read), and 16 greedy tokens decoded through ster's cache against
    the oracle's whole-sequence passes."""
    import torch

    ref = build(tmp_path, "longcat_flash_ngram", dict(ngram))
    g = ref.ngram
    prompt = list(PROMPT)
    prompt[6] = 2  # eos: the tokens after it start a new run

    def ref_logits(ids):
        e = ngram_embeddings_reference(ids, g["word"], g["tables"], g["projs"], VOCAB, g["n"], g["k"], {2})
        with torch.no_grad():
            return ref(inputs_embeds=torch.tensor(e[None], dtype=torch.float32)).logits[0].numpy()

    model = load_model(str(tmp_path))
    assert model.spec.model_type == "longcat_flash_ngram" and model.spec.ngram.tables == g["k"] * (g["n"] - 1)
    want = ref_logits(prompt)
    err = rel_err(model.decoder.forward(prompt), want)
    assert err < 1e-4, f"logits rel err {err:.2e}"
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(prompt[:5], cache), model.decoder.forward(prompt[5:8], cache)]
                            + [model.decoder.forward([t], cache) for t in prompt[8:]])
    assert rel_err(pieces, want) < 1e-4
    ours, theirs, seq = [], [], list(prompt)
    cache = model.decoder.new_cache()
    logits = model.decoder.forward(prompt, cache)
    for _ in range(16):
        t = int(logits[-1].argmax())
        ours.append(t)
        logits = model.decoder.forward([t], cache)
        theirs.append(int(ref_logits(seq)[-1].argmax()))
        seq.append(theirs[-1])
    assert ours == theirs
    assert model.decoder._weights.unused_tensors(model.spec) == []


def test_longcat_ngram_rows_match_the_seed_hash():
    """ster's table rows (decoder/ngram.py) against the seed's hash written here, for context split anywhere."""
    from ster_py.decoder.ngram import NgramSpec, ngram_rows

    rng = np.random.RandomState(2)
    vocab, n, k = 1000, 4, 3
    rows = _ngram_table_rows(vocab, 0.7, n, k)
    spec = NgramSpec(neighbors=n, splits=k, rows=tuple(rows), width=1, vocab_size=vocab, eos=(2, 5))
    ids = rng.randint(0, vocab, size=40).tolist()
    ids[7] = ids[19] = 2
    ids[20] = 5
    want = np.zeros((k * (n - 1), len(ids)), np.int64)
    for p, tok in enumerate(ids):
        start = max([q + 1 for q in range(p) if ids[q] in (2, 5)], default=0)
        for o in range(2, n + 1):
            for j in range(k):
                i = (o - 2) * k + j
                h = tok + sum((ids[p - d] if p - d >= start else 0) * (vocab ** d % rows[i]) for d in range(1, o))
                want[i, p] = h % rows[i]
    for split in (0, 1, 3, 8, 20, 21, 39):
        got = ngram_rows(spec, np.asarray(ids[:split]), np.asarray(ids[split:]))
        np.testing.assert_array_equal(got, want[:, split:])


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


_STEP3_BASE = {"model_type": "step3_text", **STEP3}
_LING3_BASE = {"model_type": "bailing_hybrid", **{k: v for k, v in LING3.items() if k != "num_local_experts"},
               "num_experts": 8}


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
    ({k: v for k, v in _STEP3_BASE.items() if k != "share_q_dim"}, "share_q_dim"),
    (dict(_STEP3_BASE, moe_layers_enum="1,3"), "moe_layers_enum"),
    (dict(_STEP3_BASE, moe_layers_enum="1,x"), "moe_layers_enum"),
    (dict(_STEP3_BASE, moe_layers_enum=[-1]), "moe_layers_enum"),
    # without short_conv_kernel_size the config is Ling 2.5's (tests/test_parity_ling25.py): its lightning heads
    # (head_dim 16, half rotating) and latent heads (qk_rope_head_dim 4) rotate different widths
    ({k: v for k, v in _LING3_BASE.items() if k != "short_conv_kernel_size"}, "different width"),
    (dict(_LING3_BASE, no_kda_lora=False), "factored Kimi projections"),
    (dict(_LING3_BASE, use_kda_lora=True), "factored Kimi projections"),
    (dict(_LING3_BASE, use_nGPT=True), "use_nGPT"),
    (dict(_LING3_BASE, value_norm=True), "value_norm"),
    (dict(_LING3_BASE, up_proj_norm=True), "up_proj_norm"),
    (dict(_LING3_BASE, use_mla_nope=True), "use_mla_nope"),
    (dict(_LING3_BASE, gated_attention_proj_granularity_type="element_wise"), "granularity"),
    (dict(_LING3_BASE, layer_group_size=0), "layer_group_size"),
    (dict(_LING3_BASE, kda_lower_bound=1.0), "lower bound"),
])
def test_refusals(config, match):
    """Refused by the gate or by the config reader, in either case before any weight is read."""
    from ster_py.config import spec_from_config

    with pytest.raises(SterError, match=match):
        spec_from_config(config, gate(config, "config.json"), "config.json")


@pytest.mark.parametrize("target,allowed", [("q", False), ("k", True), ("o", True)])
def test_step3_adapters_skip_the_query(target, allowed, tmp_path):
    """Seed 002: an adapter on query is refused (wq reads the bottleneck); k and o take one, as LoRA does."""
    from pathlib import Path

    from ster_py.adapters import LoraAdapter, apply_adapter, check_adapter_for, projection_shapes

    build(tmp_path, *CASES["step3_text"])
    model = load_model(str(tmp_path))
    assert model.spec.query_bottleneck == 24
    rng = np.random.default_rng(0)
    out, inp = projection_shapes(model.spec)[target]
    a, b = (rng.standard_normal((2, inp)) * 0.1).astype(np.float32), (rng.standard_normal((out, 2)) * 0.1).astype(
        np.float32)
    ad = LoraAdapter(Path("a.lora.safetensors"), "ster", None, None, 2, 4.0, False, 64, {(1, target): (a, b)})
    first = model.decoder.layers[0]
    if not allowed:
        with pytest.raises(SterError, match="bottleneck"):
            check_adapter_for(ad, None, model.spec, lambda role: getattr(first, role, None) is not None)
        return
    check_adapter_for(ad, None, model.spec, lambda role: getattr(first, role, None) is not None)
    before = model.decoder.forward(PROMPT)
    apply_adapter(model, ad)
    assert rel_err(model.decoder.forward(PROMPT), before) > 1e-4


def test_these_families_say_they_have_no_reference_here():
    from typer.testing import CliRunner

    from ster_py.cli import app

    rows = json.loads(CliRunner().invoke(app, ["families", "--json"]).stdout)
    notes = {r["model_type"]: (r["runs"], r["note"]) for r in rows}
    for model_type, _ in CASES.values():
        assert FAMILIES[model_type].unconfirmed and notes[model_type] == (True, "no reference implementation here")
    for model_type, _ in HYBRID_CASES.values():  # Transformers implements these
        assert not FAMILIES[model_type].unconfirmed and notes[model_type] == (True, "")
