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
from ster_py.generate import Sampling, generate
from ster_py.load import load_model
from tiny import build_checkpoint
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)
from tiny import reference_logits, reference_split_logits, reference_greedy, rel_err

VOCAB = 128
PROMPT = np.random.RandomState(5).randint(3, VOCAB, size=16).tolist()
LLAMA = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


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
    _rewrite(path, own, drop=("embedding_multiplier", "residual_multiplier", "logits_scaling",
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
    _rewrite(path, {"model_type": "orion", "architectures": ["OrionForCausalLM"], "rms_norm_eps": eps},
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

    _rewrite(path, {"model_type": "internlm2", "architectures": ["InternLM2ForCausalLM"], "bias": bias},
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

    _rewrite(path, {"model_type": "mimo", "architectures": ["MiMoForCausalLM"], "num_nextn_predict_layers": 1},
             tensors=add_mtp)
    return model


# ------------------------------------------------------------------ DeepSeek-MoE (Llama + Qwen3-MoE's router)
def _deepseek(path, config: dict):
    """Llama whose routed layers run Transformers' Qwen3-MoE sparse block (softmax over every expert,
    the top k, renormalised under norm_topk_prob: DeepSeek-MoE's router) plus, as seed 002 says, the
    shared experts' SwiGLU (Transformers' LlamaMLP, n_shared_experts * moe_intermediate_size wide)
    added to its output; saved under DeepSeek-MoE's names, one module per expert."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig
    from transformers.models.llama.modeling_llama import LlamaMLP
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    from tiny import write_tokenizer

    c = dict(LLAMA, **config)
    n, k, freq = c["num_hidden_layers"], c.get("first_k_dense_replace", 0), c.get("moe_layer_freq", 1)
    experts, top_k, size = c["n_routed_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]
    n_shared, renorm = c.get("n_shared_experts"), c.get("norm_topk_prob", False)
    torch.manual_seed(0)
    llama = {key: c[key] for key in LLAMA}
    model = LlamaForCausalLM(LlamaConfig(**llama, attention_bias=c.get("attention_bias", False),
                                         bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                         attn_implementation="eager"))
    moe_config = Qwen3MoeConfig(hidden_size=c["hidden_size"], num_experts=experts, num_experts_per_tok=top_k,
                                moe_intermediate_size=size, norm_topk_prob=renorm, hidden_act="silu")

    class DeepSeekMoE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.routed = Qwen3MoeSparseMoeBlock(moe_config)
            self.shared = LlamaMLP(LlamaConfig(hidden_size=c["hidden_size"], intermediate_size=size * n_shared)) \
                if n_shared else None

        def forward(self, x):
            return self.routed(x) + (self.shared(x) if self.shared is not None else 0)

    routed = [i >= k and i % freq == 0 for i in range(n)]
    for i in range(n):
        if routed[i]:
            model.model.layers[i].mlp = DeepSeekMoE()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn_like(p) * 0.3 + 1.0)
            else:
                p.copy_(torch.randn_like(p) * (0.15 if p.ndim > 1 else 0.1))
    model.eval()
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
    path.mkdir(parents=True, exist_ok=True)
    save_file(out, str(path / "model.safetensors"), metadata={"format": "pt"})
    own = {key: c[key] for key in LLAMA} | {
        "model_type": "deepseek", "architectures": ["DeepseekForCausalLM"], "n_routed_experts": experts,
        "num_experts_per_tok": top_k, "moe_intermediate_size": size, "n_shared_experts": n_shared,
        "first_k_dense_replace": k, "moe_layer_freq": freq, "norm_topk_prob": renorm, "scoring_func": "softmax",
        "rms_norm_eps": model.config.rms_norm_eps, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "attention_bias": c.get("attention_bias", False), "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2}
    (path / "config.json").write_text(json.dumps(own))
    write_tokenizer(path, VOCAB)
    return model


BUILD = {"minicpm": _minicpm, "orion": _orion, "internlm2": _internlm2, "mimo": _mimo, "deepseek": _deepseek}
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
    ref_logits, _ = reference_logits(ref, PROMPT)
    err = rel_err(model.decoder.forward(PROMPT), ref_logits)
    assert err < 1e-4, f"logits rel err {err:.2e}"
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:9], cache), model.decoder.forward(PROMPT[9:], cache)])
    assert rel_err(pieces, reference_split_logits(ref, PROMPT, 9)) < 1e-4
    assert generate(model.decoder, PROMPT, Sampling(max_new_tokens=16)).ids == reference_greedy(ref, PROMPT, 16)
    assert model.decoder._weights.unused_tensors(model.spec) == []


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
])
def test_refusals(model_type, config, match):
    with pytest.raises(SterError, match=match):
        gate({"model_type": model_type, **LLAMA, **config}, "config.json")


# ------------------------------------------------------------------ GGUF, by llama.cpp's own converter
GGUF_CASES = {  # name: (model_type, config, legacy config.json keys)
    "minicpm": ("minicpm", dict(scale_emb=12, scale_depth=1.4, dim_model_base=16), {}),
    "orion": ("orion", dict(rms_norm_eps=1e-5), {}),
    "internlm2": ("internlm2", dict(bias=False), {}),
    "deepseek": ("deepseek", dict(_DEEPSEEK, n_shared_experts=2, first_k_dense_replace=1), {}),
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
