"""Families whose modelling code lives only in their Hub repositories (issue 16, "without a
Transformers oracle"), against Transformers models of the same math.

The oracle is built, not assumed: each case builds a tiny random Transformers model whose
computation is the family's (Granite's embedding, residual and logit multipliers are MiniCPM's
muP scales; StableLM with its whole head rotated and no q/k/v bias is Orion's LayerNorm block;
Llama with attention biases is InternLM2 once q, k and v are packed into wqkv; Qwen2 is MiMo once
its next-token-prediction layers are ignored), writes the checkpoint in the family's own layout
and config spellings (seed 002), and checks ster on that directory against the Transformers
model: logits of a 16-token prompt within 1e-4 (f32), the same through the KV cache in two
pieces, 16 equal greedy tokens, no stored tensor left unread. The GGUF cases run llama.cpp's
own converter (from the pinned sdist) on the family-layout directory, which exercises the
converter's reading of the family's spellings as well.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ster_py.errors import SterError
from ster_py.families import FAMILIES, gate
from ster_py.load import load_model
from tiny import check_against, rewrite_checkpoint
from tiny import build_checkpoint
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)
from tiny import reference_logits, reference_split_logits, rel_err

VOCAB = 128
PROMPT = np.random.RandomState(5).randint(3, VOCAB, size=16).tolist()
LLAMA = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)




# ------------------------------------------------------------------ MiniCPM (Granite's multipliers)
def _minicpm(path, config: dict):
    """MiniCPM's scale_emb, scale_depth and dim_model_base as Granite's embedding_multiplier,
    residual_multiplier (scale_depth / sqrt(layers)) and logits_scaling (hidden / dim_model_base)."""
    c = dict(LLAMA, **config)
    scale_emb, scale_depth, base = c.pop("scale_emb", 1), c.pop("scale_depth", 1), c.pop("dim_model_base", 1)
    tied_by_default = c.pop("tied_by_default", False)
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    model = build_checkpoint(path, "granite", dict(
        c, embedding_multiplier=scale_emb, residual_multiplier=scale_depth / math.sqrt(c["num_hidden_layers"]),
        logits_scaling=c["hidden_size"] / base, attention_multiplier=head_dim ** -0.5,
        tie_word_embeddings=tied_by_default or c.get("tie_word_embeddings", False)))
    own = {"model_type": "minicpm", "architectures": ["MiniCPMForCausalLM"], "scale_emb": scale_emb,
           "scale_depth": scale_depth, "dim_model_base": base}
    rewrite_checkpoint(path, own, drop=("embedding_multiplier", "residual_multiplier", "logits_scaling",
                              "attention_multiplier") + (("tie_word_embeddings",) if tied_by_default else ()))
    return model


# ------------------------------------------------------------------ Orion (StableLM, whole head rotated)
def _orion(path, config: dict):
    c = dict(LLAMA, **config)
    eps = c.pop("rms_norm_eps", 1e-5)
    model = build_checkpoint(path, "stablelm", dict(c, partial_rotary_factor=1.0, use_qkv_bias=False,
                                                    use_parallel_residual=False, qk_layernorm=False,
                                                    layer_norm_eps=eps))
    # Orion's config states its LayerNorms' epsilon under rms_norm_eps.
    rewrite_checkpoint(path, {"model_type": "orion", "architectures": ["OrionForCausalLM"], "rms_norm_eps": eps},
             drop=("layer_norm_eps", "partial_rotary_factor", "use_qkv_bias", "use_parallel_residual",
                   "qk_layernorm"))
    return model


# ------------------------------------------------------------------ InternLM2 (Llama, packed wqkv)
def _pack_wqkv(q, k, v, heads: int, kv_heads: int):
    """InternLM2's wqkv rows (seed 002): for each key/value group, its queries, its key, its value."""
    per = heads // kv_heads
    qg = q.reshape(kv_heads, per, -1, *q.shape[1:])
    kg = k.reshape(kv_heads, 1, -1, *k.shape[1:])
    vg = v.reshape(kv_heads, 1, -1, *v.shape[1:])
    return np.concatenate([qg, kg, vg], axis=1).reshape(-1, *q.shape[1:])


def _internlm2(path, config: dict):
    c = dict(LLAMA, **config)
    bias = c.pop("bias", False)
    model = build_checkpoint(path, "llama", dict(c, attention_bias=bias))
    heads, kv = c["num_attention_heads"], c["num_key_value_heads"]

    def rename(state: dict) -> dict:
        out = {}
        for name, t in state.items():
            if ".self_attn.q_proj." in name:
                kind = name.rsplit(".", 1)[1]
                base = name.split(".self_attn.")[0]
                get = lambda p: state[f"{base}.self_attn.{p}_proj.{kind}"]  # noqa: E731
                out[f"{base}.attention.wqkv.{kind}"] = _pack_wqkv(get("q"), get("k"), get("v"), heads, kv)
                continue
            if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
                continue
            for a, b in ((".self_attn.o_proj.", ".attention.wo."), (".mlp.gate_proj.", ".feed_forward.w1."),
                         (".mlp.up_proj.", ".feed_forward.w3."), (".mlp.down_proj.", ".feed_forward.w2."),
                         (".input_layernorm.", ".attention_norm."), (".post_attention_layernorm.", ".ffn_norm."),
                         ("model.embed_tokens.", "model.tok_embeddings."), ("lm_head.", "output.")):
                name = name.replace(a, b)
            out[name] = t
        return out

    rewrite_checkpoint(path, {"model_type": "internlm2", "architectures": ["InternLM2ForCausalLM"], "bias": bias},
             drop=("attention_bias", "mlp_bias", "head_dim"), tensors=rename)
    return model


# ------------------------------------------------------------------ MiMo (Qwen2 + unread MTP layers)
def _mimo(path, config: dict):
    c = dict(LLAMA, **config)
    model = build_checkpoint(path, "qwen2", c)
    rng = np.random.RandomState(3)

    def add_mtp(state: dict) -> dict:
        # One next-token-prediction layer as MiMo stores it (model.mtp_layers.0.*): a forward never reads it.
        d = c["hidden_size"]
        extra = {"model.mtp_layers.0.input_proj.weight": (d, 2 * d), "model.mtp_layers.0.token_layernorm.weight": (d,),
                 "model.mtp_layers.0.self_attn.q_proj.weight": (d, d), "model.mtp_layers.0.final_layernorm.weight": (d,)}
        return {**state, **{k: rng.randn(*s).astype(np.float32) for k, s in extra.items()}}

    rewrite_checkpoint(path, {"model_type": "mimo", "architectures": ["MiMoForCausalLM"], "num_nextn_predict_layers": 1},
             tensors=add_mtp)
    return model


# ------------------------------------------------------------------ softmax routers (Qwen3-MoE's block)
def _swap_in_softmax_moe(model, routed: list[bool], hidden: int, experts: int, top_k: int, size: int,
                         n_shared: int | None, renorm: bool) -> None:
    """Replace the feed-forward of each ``routed`` layer of a Transformers model by Transformers'
    Qwen3-MoE sparse block (softmax over every expert, the top k, renormalised under ``renorm``: the
    router of DeepSeek-MoE and Ling 1.x) plus, as seed 002 says, the shared experts' SwiGLU
    (Transformers' LlamaMLP, ``n_shared * size`` wide) added to its output; then redraw every weight."""
    import torch
    from transformers import LlamaConfig, Qwen3MoeConfig
    from transformers.models.llama.modeling_llama import LlamaMLP
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    moe_config = Qwen3MoeConfig(hidden_size=hidden, num_experts=experts, num_experts_per_tok=top_k,
                                moe_intermediate_size=size, norm_topk_prob=renorm, hidden_act="silu")

    class SoftmaxMoE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.routed = Qwen3MoeSparseMoeBlock(moe_config)
            self.shared = LlamaMLP(LlamaConfig(hidden_size=hidden, intermediate_size=size * n_shared)) \
                if n_shared else None

        def forward(self, x):
            return self.routed(x) + (self.shared(x) if self.shared is not None else 0)

    for i, layer in enumerate(model.model.layers):
        if routed[i]:
            layer.mlp = SoftmaxMoE()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn_like(p) * 0.3 + 1.0)
            else:
                p.copy_(torch.randn_like(p) * (0.15 if p.ndim > 1 else 0.1))
    model.eval()


def _save_softmax_moe(model, path, experts: int, size: int, config: dict, rename=None) -> None:
    """Save ``model`` (after ``_swap_in_softmax_moe``) with one module per expert (mlp.experts.{e}.*),
    the router at mlp.gate and the shared experts at mlp.shared_experts (then ``rename`` applied to the
    whole dict of tensors, if given), and ``config`` as config.json."""
    from safetensors.torch import save_file

    from tiny import write_tokenizer

    out = {}
    for name, t in model.state_dict().items():
        t = t.detach().contiguous()
        if ".mlp.routed.experts.gate_up_proj" in name:
            base = name.split(".routed.")[0]
            for e in range(experts):
                out[f"{base}.experts.{e}.gate_proj.weight"] = t[e, :size].contiguous()
                out[f"{base}.experts.{e}.up_proj.weight"] = t[e, size:].contiguous()
        elif ".mlp.routed.experts.down_proj" in name:
            base = name.split(".routed.")[0]
            for e in range(experts):
                out[f"{base}.experts.{e}.down_proj.weight"] = t[e].contiguous()
        else:
            out[name.replace(".mlp.routed.gate.", ".mlp.gate.").replace(".mlp.shared.", ".mlp.shared_experts.")] = t
    if rename is not None:
        out = rename(out)
    path.mkdir(parents=True, exist_ok=True)
    save_file(out, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config))
    write_tokenizer(path, VOCAB)


# ------------------------------------------------------------------ DeepSeek-MoE (Llama + softmax router)
def _deepseek(path, config: dict):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    c = dict(LLAMA, **config)
    n, k, freq = c["num_hidden_layers"], c.get("first_k_dense_replace", 0), c.get("moe_layer_freq", 1)
    experts, top_k, size = c["n_routed_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]
    n_shared, renorm = c.get("n_shared_experts"), c.get("norm_topk_prob", False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{key: c[key] for key in LLAMA}, attention_bias=c.get("attention_bias", False),
                                         bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                         attn_implementation="eager"))
    _swap_in_softmax_moe(model, [i >= k and i % freq == 0 for i in range(n)], c["hidden_size"], experts, top_k, size,
                         n_shared, renorm)
    _save_softmax_moe(model, path, experts, size, {key: c[key] for key in LLAMA} | {
        "model_type": "deepseek", "architectures": ["DeepseekForCausalLM"], "n_routed_experts": experts,
        "num_experts_per_tok": top_k, "moe_intermediate_size": size, "n_shared_experts": n_shared,
        "first_k_dense_replace": k, "moe_layer_freq": freq, "norm_topk_prob": renorm, "scoring_func": "softmax",
        "rms_norm_eps": model.config.rms_norm_eps, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "attention_bias": c.get("attention_bias", False), "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2})
    return model


# ------------------------------------------------------------------ Ling (bailing_moe): Sarvam-30B's block
_LING_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "num_shared_experts", "use_qkv_bias",
              "use_qk_norm", "first_k_dense_replace", "n_group", "topk_group", "routed_scaling_factor", "head_dim",
              "norm_topk_prob", "partial_rotary_factor")


def _bailing(path, config: dict):
    """Ling 2.0 (score_function sigmoid): Transformers' sarvam_moe, Ling 2.0 under Sarvam's name. Ling 1.x:
    the same attention with the softmax router swapped in."""
    import torch

    c = dict(LLAMA, **config)
    ling2 = c.get("score_function") == "sigmoid"
    sarvam = {key: v for key, v in c.items() if key != "score_function"}
    if not ling2:
        sarvam = dict(sarvam, use_qk_norm=False, norm_topk_prob=c.get("norm_topk_prob", True))
    model = build_checkpoint(path, "sarvam_moe", dict(sarvam, first_k_dense_replace=c.get("first_k_dense_replace", 0)))
    own = {key: c[key] for key in LLAMA} | {key: c[key] for key in _LING_KEYS if key in c} | {
        "model_type": "bailing_moe", "rms_norm_eps": model.config.rms_norm_eps, "tie_word_embeddings": False,
        "rope_theta": model.config.rope_parameters["rope_theta"], "hidden_act": "silu", "bos_token_id": 1,
        "eos_token_id": 2, "first_k_dense_replace": c.get("first_k_dense_replace", 0)}
    if ling2:
        (path / "config.json").write_text(json.dumps(own | {
            "architectures": ["BailingMoeV2ForCausalLM"], "score_function": "sigmoid",
            "moe_router_enable_expert_bias": True, "routed_scaling_factor": model.config.routed_scaling_factor}))
        return model
    torch.manual_seed(1)
    k = c.get("first_k_dense_replace", 0)
    _swap_in_softmax_moe(model, [i >= k for i in range(c["num_hidden_layers"])], c["hidden_size"], c["num_experts"],
                         c["num_experts_per_tok"], c["moe_intermediate_size"], c.get("num_shared_experts"),
                         c.get("norm_topk_prob", True))
    _save_softmax_moe(model, path, c["num_experts"], c["moe_intermediate_size"],
                      own | {"architectures": ["BailingMoeForCausalLM"], "norm_topk_prob": c.get("norm_topk_prob", True),
                             "num_shared_experts": c.get("num_shared_experts", 0)}, rename=_ling_names)
    return model


def _ling_names(state: dict) -> dict:
    """Transformers' in-memory Sarvam names as Ling stores them (what sarvam_moe's save does): q, k and
    v stacked in attention.query_key_value, attention.dense, model.word_embeddings."""
    import torch

    out = {}
    for name, t in state.items():
        if ".self_attn.q_proj." in name:
            base, kind = name.split(".self_attn.")[0], name.rsplit(".", 1)[1]
            out[f"{base}.attention.query_key_value.{kind}"] = torch.cat(
                [state[f"{base}.self_attn.{p}_proj.{kind}"] for p in "qkv"]).contiguous()
        elif ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            continue
        else:
            out[name.replace(".self_attn.o_proj.", ".attention.dense.").replace("model.embed_tokens.",
                                                                               "model.word_embeddings.")] = t
    return out


# ------------------------------------------------------------------ openPangu-Embedded (HyperCLOVA X's norms)
def _pangu(path, config: dict):
    """sandwich_norm: HyperCLOVA X with its multipliers neutral (Granite's block with post_norm1 and
    post_norm2 over each sublayer's output); without it, Llama. Biases on every attention projection
    and the MLP."""
    c = dict(LLAMA, **config)
    sandwich = c.pop("sandwich_norm", False)
    if not sandwich:
        model = build_checkpoint(path, "llama", dict(c, attention_bias=True, mlp_bias=True))
        rewrite_checkpoint(path, {"model_type": "PanguEmbedded", "architectures": ["PanguEmbeddedForCausalLM"]},
                 drop=("attention_bias", "mlp_bias"))
        return model
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    model = build_checkpoint(path, "hyperclovax", dict(c, attention_bias=True, mlp_bias=True, use_post_norm=True,
                                                       embedding_multiplier=1.0, residual_multiplier=1.0,
                                                       logits_scaling=1.0, attention_multiplier=head_dim ** -0.5))

    def rename(state: dict) -> dict:
        swap = ((".post_attention_layernorm.", ".pre_mlp_layernorm."), (".post_norm1.", ".post_attention_layernorm."),
                (".post_norm2.", ".post_mlp_layernorm."))
        out = {}
        for name, t in state.items():
            for a, b in swap:
                if a in name:
                    name = name.replace(a, b)
                    break
            out[name] = t
        return out

    rewrite_checkpoint(path, {"model_type": "PanguEmbedded", "architectures": ["PanguEmbeddedForCausalLM"], "sandwich_norm": True},
             drop=("embedding_multiplier", "residual_multiplier", "logits_scaling", "attention_multiplier",
                   "use_post_norm", "attention_bias", "mlp_bias"), tensors=rename)
    return model


# ------------------------------------------------------------------ Tele-FLM (Granite's multipliers)
def _teleflm(path, config: dict):
    c = dict(LLAMA, **config)
    mup = {k: c.pop(k) for k in ("use_mup", "input_mult", "output_mult", "mup_scale_factor") if k in c}
    on = mup.get("use_mup", False)
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    model = build_checkpoint(path, "granite", dict(
        c, embedding_multiplier=mup["input_mult"] if on else 1.0, residual_multiplier=1.0,
        logits_scaling=mup["mup_scale_factor"] / mup["output_mult"] if on else 1.0,
        attention_multiplier=head_dim ** -0.5))
    rewrite_checkpoint(path, {"model_type": "TeleFLM", "architectures": ["TeleFLMForCausalLM"], **mup},
             drop=("embedding_multiplier", "residual_multiplier", "logits_scaling", "attention_multiplier"))
    return model


# ------------------------------------------------------------------ another family's math under its own name
def _renamed(of: str, case: str):
    """``of``'s Transformers model (the parity case ``case`` of test_parity_moe.py) saved as ``model_type``."""
    def build_it(path, config: dict):
        import test_parity_moe

        model = build_checkpoint(path, of, dict(test_parity_moe.CASES[case][1]))
        rewrite_checkpoint(path, {"model_type": config["model_type"]})
        return model
    return build_it


# ------------------------------------------------------------------ TeleChat3 (Llama's YaRN, its temperature)
def _telechat3(path, config: dict):
    """Llama with both biases and YaRN whose attention_factor is stated as 0.07 * ln(factor) + 1; saved
    with TeleChat3's telechat3-yarn rope type, which leaves the factor implied."""
    c = dict(LLAMA, **config)
    factor, original = c.pop("factor"), c.pop("original_max_position_embeddings")
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": factor,
            "original_max_position_embeddings": original, "attention_factor": 0.07 * math.log(factor) + 1.0}
    model = build_checkpoint(path, "llama", dict(c, attention_bias=True, mlp_bias=True, rope_parameters=rope))
    rewrite_checkpoint(path, {"model_type": "telechat3", "architectures": ["TeleChat3ForCausalLM"], "rope_theta": 10000.0,
                    "rope_scaling": {"type": "telechat3-yarn", "factor": factor,
                                     "original_max_position_embeddings": original}},
             drop=("rope_parameters",))
    return model


# ------------------------------------------------------------------ Solar Pro (Llama + block skips)
def _solar(path, config: dict):
    """Transformers' Llama with each decoder layer wrapped by the block skip connections as seed 002
    words them: before a layer of bskcn_1 (bskcn_2) the stream is kept, before a layer of bskcn_3
    (bskcn_4) it becomes w * kept + (1 - w) * stream, w = bskcn_tv[1]; keeping comes first."""
    import torch

    c = dict(LLAMA, **config)
    skips = {k: c.pop(f"bskcn_{k}") for k in (1, 2, 3, 4)}
    tv = c.pop("bskcn_tv")
    model = build_checkpoint(path, "llama", c)
    kept: dict = {}

    class Skip(torch.nn.Module):
        def __init__(self, layer, i):
            super().__init__()
            self.layer, self.i = layer, i

        def forward(self, hidden_states, *args, **kwargs):
            for slot in (1, 2):
                if self.i in skips[slot]:
                    kept[slot] = hidden_states
            for slot, src in ((3, 1), (4, 2)):
                if self.i in skips[slot]:
                    hidden_states = tv[1] * kept[src] + (1 - tv[1]) * hidden_states
            return self.layer(hidden_states, *args, **kwargs)

    model.model.layers = torch.nn.ModuleList([Skip(layer, i) for i, layer in enumerate(model.model.layers)])
    rewrite_checkpoint(path, {"model_type": "solar", "architectures": ["SolarForCausalLM"], "bskcn_tv": tv,
                    **{f"bskcn_{k}": v for k, v in skips.items()}})
    return model


BUILD = {"solar": _solar, "mimo_v2": _renamed("mimo_v2_flash", "mimo_v2_flash"),
         "param2moe": _renamed("sarvam_moe", "sarvam_moe-qkv-bias-groups"), "telechat3": _telechat3,
         "PanguEmbedded": _pangu, "TeleFLM": _teleflm, "minicpm": _minicpm, "orion": _orion, "internlm2": _internlm2, "mimo": _mimo, "deepseek": _deepseek,
         "bailing_moe": _bailing}
_LING = dict(head_dim=16, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24)
_DEEPSEEK = dict(n_routed_experts=6, num_experts_per_tok=2, moe_intermediate_size=32)

CASES = {
    "minicpm": ("minicpm", dict(scale_emb=12, scale_depth=1.4, dim_model_base=16)),
    "minicpm-defaults-tied": ("minicpm", dict(tied_by_default=True)),
    "minicpm-gqa-rope-base": ("minicpm", dict(scale_emb=3, scale_depth=2.0, dim_model_base=32, rope_theta=500.0)),
    "orion": ("orion", dict(rms_norm_eps=1e-5)),
    "internlm2": ("internlm2", dict(bias=False)),
    "internlm2-bias-mha": ("internlm2", dict(bias=True, num_key_value_heads=4)),
    "internlm2-bias-gqa": ("internlm2", dict(bias=True)),
    "mimo": ("mimo", {}),
    "deepseek": ("deepseek", dict(_DEEPSEEK, n_shared_experts=2, first_k_dense_replace=1)),
    "deepseek-renorm-freq-bias": ("deepseek", dict(_DEEPSEEK, n_shared_experts=1, norm_topk_prob=True, moe_layer_freq=2,
                                                   attention_bias=True, num_hidden_layers=4)),
    "deepseek-no-shared": ("deepseek", dict(_DEEPSEEK, num_experts_per_tok=3)),
    "mimo_v2": ("mimo_v2", {"model_type": "mimo_v2"}),
    "param2moe": ("param2moe", {"model_type": "param2moe"}),
    "solar-skips": ("solar", dict(num_hidden_layers=6, bskcn_1=[1], bskcn_2=[2], bskcn_3=[3], bskcn_4=[5],
                                  bskcn_tv=[0.9, 0.7])),
    "solar-shared-layer": ("solar", dict(num_hidden_layers=5, bskcn_1=[0], bskcn_2=[2], bskcn_3=[2], bskcn_4=[4],
                                         bskcn_tv=[0.5, 0.3])),
    "telechat3-yarn": ("telechat3", dict(factor=4.0, original_max_position_embeddings=8)),
    "pangu": ("PanguEmbedded", {}),
    "pangu-sandwich": ("PanguEmbedded", dict(sandwich_norm=True)),
    "teleflm": ("TeleFLM", {}),
    "teleflm-mup": ("TeleFLM", dict(use_mup=True, input_mult=3.0, output_mult=2.0, mup_scale_factor=8.0)),
    "ling2-groups-qk-norm-bias": ("bailing_moe", dict(_LING, score_function="sigmoid", use_qk_norm=True,
                                                      use_qkv_bias=True, n_group=2, topk_group=1, num_shared_experts=1,
                                                      first_k_dense_replace=1, routed_scaling_factor=2.0)),
    "ling1-softmax-renorm-partial": ("bailing_moe", dict(_LING, num_shared_experts=2, use_qkv_bias=True,
                                                         partial_rotary_factor=0.5)),
    "ling1-no-renorm-dense-first": ("bailing_moe", dict(_LING, norm_topk_prob=False, first_k_dense_replace=1,
                                                        num_experts_per_tok=3)),
}


def build(path, model_type: str, config: dict):
    return BUILD[model_type](path, config)


@pytest.mark.parametrize("case", list(CASES))
def test_family_matches_its_oracle(case, tmp_path):
    model_type, config = CASES[case]
    ref = build(tmp_path, model_type, config)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == model_type
    model = load_model(str(tmp_path))
    assert model.spec.model_type == model_type
    check_against(model, ref, PROMPT)


def test_minicpm_scales_are_read(tmp_path):
    """The case above would pass with the scales ignored only if they were 1: check the spec carries them."""
    build(tmp_path, "minicpm", CASES["minicpm"][1])
    spec = load_model(str(tmp_path)).spec
    assert spec.embed_scale == pytest.approx(12) and spec.residual_scale == pytest.approx(1.4 / math.sqrt(3))


def test_these_families_say_they_have_no_reference_here():
    from typer.testing import CliRunner

    from ster_py.cli import app

    rows = json.loads(CliRunner().invoke(app, ["families", "--json"]).stdout)
    notes = {r["model_type"]: r["note"] for r in rows}
    for model_type in BUILD:
        assert FAMILIES[model_type].unconfirmed and notes[model_type] == "no reference implementation here"
    assert notes["llama"] == ""


@pytest.mark.parametrize("model_type,config,match", [
    ("minicpm", {"num_experts": 8}, "mixture of experts"),
    ("minicpm", {"sparse_config": {"kernel_size": 32}}, "sparse attention"),
    ("minicpm", {"use_mup": False}, "use_mup"),
    ("bailing_moe", {"score_function": "softmax2"}, "score_function"),
    ("bailing_moe", {"score_function": "sigmoid", "moe_router_enable_expert_bias": False}, "selection bias"),
    ("bailing_moe", {"use_bias": True}, "use_bias"),
    ("bailing_moe", {"norm_head": True}, "norm_head"),
    ("deepseek", {"scoring_func": "sigmoid"}, "scoring_func"),
    ("solar", {"bskcn_1": [2], "bskcn_3": [1], "bskcn_tv": [0.9, 0.7]}, "before any layer keeps"),
    ("solar", {"bskcn_1": [9], "bskcn_3": [2], "bskcn_tv": [0.9, 0.7]}, "layer indices below 3"),
    ("TeleFLM", {"use_mup": True, "input_mult": 2.0, "output_mult": 1.0}, "use_mup"),
    ("TeleFLM", {"use_mup": True, "input_mult": 2.0, "output_mult": 1.0, "mup_scale_factor": 0}, "use_mup"),
])
def test_refusals(model_type, config, match):
    """Refused by the gate or by the config reader, in either case before any weight is read."""
    from ster_py.config import spec_from_config

    config = {"model_type": model_type, **LLAMA, **config}
    with pytest.raises(SterError, match=match):
        spec_from_config(config, gate(config, "config.json"), "config.json")


# ------------------------------------------------------------------ GGUF, by llama.cpp's own converter
GGUF_CASES = {  # name: (model_type, config, legacy config.json keys)
    "minicpm": ("minicpm", dict(scale_emb=12, scale_depth=1.4, dim_model_base=16), {}),
    "orion": ("orion", dict(rms_norm_eps=1e-5), {}),
    "internlm2": ("internlm2", dict(bias=False), {}),
    "deepseek": ("deepseek", dict(_DEEPSEEK, n_shared_experts=2, first_k_dense_replace=1), {}),
    # (llama.cpp 0.3.36 cannot map a Ling 1.x dense layer's feed-forward: every layer routes here)
    "bailingmoe": ("bailing_moe", dict(_LING, num_shared_experts=1), {}),
    "pangu-embedded": ("PanguEmbedded", {}, {}),
}


@pytest.fixture(scope="module")
def gguf_models(tmp_path_factory):
    from llamacpp_convert import convert_cases

    return convert_cases(tmp_path_factory.mktemp("llama_cpp"), GGUF_CASES, build)


@pytest.mark.parametrize("name", list(GGUF_CASES))
def test_gguf_matches_the_oracle(name, gguf_models):
    path, ref = gguf_models[name]
    model = load_model(str(path))
    assert model.resolved.kind == "gguf" and model.spec.model_type == GGUF_CASES[name][0]
    err = rel_err(model.decoder.forward(PROMPT), reference_logits(ref, PROMPT)[0])
    assert err < 1e-3, f"logits rel err {err:.2e}"
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:9], cache), model.decoder.forward(PROMPT[9:], cache)])
    assert rel_err(pieces, reference_split_logits(ref, PROMPT, 9)) < 1e-3
    assert model.decoder._weights.unused_tensors(model.spec) == []
