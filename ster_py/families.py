"""The family table: the one place model families are listed.

Every ``model_type`` of Ster's supported list is known here (``KNOWN_MODEL_TYPES``);
the ones the generic decoder runs have a ``FamilySpec`` in ``FAMILIES``. A spec is
data: which config keys the family reads, which norms wrap its sublayers, how it
places sliding windows and rotations, and the names its tensors carry in a
Hugging Face checkpoint and in a llama.cpp GGUF file. ``config.py`` turns a spec
plus a config into the normalised ``ModelSpec`` the decoder reads; the decoder
never looks at a family name.

``gate()`` is the architecture gate: it runs on the parsed config before any
weight is mapped.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from .errors import SterError

# Ster's list of supported model_type values (seed 002, "Architecture gate"), in its order.
KNOWN_MODEL_TYPES: tuple[str, ...] = (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi", "phi3",
    "granite", "granitemoe", "stablelm", "starcoder2", "cohere", "cohere2", "nemotron", "olmo",
    "olmo2", "olmo3", "olmoe", "exaone4", "internlm3", "seed_oss", "arcee", "ernie4_5", "minicpm",
    "orion", "glm", "glm4", "gpt_neox", "gptj", "smollm3", "gpt2", "gpt_bigcode", "opt", "bloom",
    "falcon", "mpt", "deepseek_v2", "deepseek_v3", "minicpm3", "mamba", "falcon_mamba", "glm4_moe",
    "internlm2", "exaone", "jamba", "hunyuan_v1_dense", "mamba2", "bamba", "gpt_oss", "lfm2",
    "ernie4_5_moe", "dbrx", "phimoe", "hunyuan_v1_moe", "telechat", "lfm2_moe", "granitemoehybrid",
    "nemotron_h", "jais2", "bailing_moe", "TeleFLM", "falcon_h1", "qwen3_next", "kimi_linear",
    "minimax_m2", "step3_text", "minimax_text_01", "minimax", "zamba2", "gemma", "gemma2",
    "gemma3_text", "gemma4_text", "gemma4_unified_text", "mimo", "mellum", "flex_olmo",
    "granite_swa", "granitemoe_swa", "granitemoeshared", "glm4_moe_lite", "iquestcoder",
    "hyperclovax", "vaultgemma", "apertus", "exaone_moe", "solar", "step1", "telechat3",
    "param2moe", "PanguEmbedded", "olmo_hybrid", "hy_v3", "nanbeige", "iquestloopcoder",
    "nemotron-nas", "deepseek_v32", "glm_moe_dsa", "axk1", "bailing_hybrid", "mimo_v2_flash",
    "mimo_v2", "step3p5", "k2_horizon", "pangu_ultra_moe", "longcat_flash", "sarvam_moe",
    "sarvam_mla", "cohere2_moe", "deepseek", "ministral3", "llama4_text", "qwen3_5_text",
    "qwen3_5_moe_text", "afmoe", "nemotron_h_puzzle", "chatglm", "laguna", "longcat_flash_ngram",
    "muse_glimmer_text", "plamo3", "gemma3n_text", "hrm_text", "inkling_text", "deepseek_v4",
    "glm5_next_text", "hy_v4", "minimax_m3_vl_text", "dots3_note",
)

# Per-layer tensor roles the decoder asks for, with their Hugging Face names for the
# Llama layout. ``{i}`` is the layer index. Families override only what differs.
LLAMA_NAMES: Mapping[str, str] = {
    "embed": "model.embed_tokens",
    "final_norm": "model.norm",
    "head": "lm_head",
    "attn_norm": "model.layers.{i}.input_layernorm",
    "ffn_norm": "model.layers.{i}.post_attention_layernorm",
    "q": "model.layers.{i}.self_attn.q_proj",
    "k": "model.layers.{i}.self_attn.k_proj",
    "v": "model.layers.{i}.self_attn.v_proj",
    "o": "model.layers.{i}.self_attn.o_proj",
    "q_norm": "model.layers.{i}.self_attn.q_norm",
    "k_norm": "model.layers.{i}.self_attn.k_norm",
    "gate": "model.layers.{i}.mlp.gate_proj",
    "up": "model.layers.{i}.mlp.up_proj",
    "down": "model.layers.{i}.mlp.down_proj",
}

# Gemma 2 and 3 wrap both sublayers in norms: the Llama name "post_attention_layernorm"
# is the norm *after* attention there, and the FFN's input norm has its own name.
GEMMA2_NAMES: Mapping[str, str] = {
    **LLAMA_NAMES,
    "attn_post_norm": "model.layers.{i}.post_attention_layernorm",
    "ffn_norm": "model.layers.{i}.pre_feedforward_layernorm",
    "ffn_post_norm": "model.layers.{i}.post_feedforward_layernorm",
}

# llama.cpp's GGUF tensor names for the same roles (src/llama-arch.cpp's LLM_TENSOR_* table).
GGUF_NAMES: Mapping[str, str] = {
    "embed": "token_embd",
    "final_norm": "output_norm",
    "head": "output",
    "attn_norm": "blk.{i}.attn_norm",
    "attn_post_norm": "blk.{i}.post_attention_norm",
    "ffn_norm": "blk.{i}.ffn_norm",
    "ffn_post_norm": "blk.{i}.post_ffw_norm",
    "q": "blk.{i}.attn_q",
    "k": "blk.{i}.attn_k",
    "v": "blk.{i}.attn_v",
    "o": "blk.{i}.attn_output",
    "q_norm": "blk.{i}.attn_q_norm",
    "k_norm": "blk.{i}.attn_k_norm",
    "gate": "blk.{i}.ffn_gate",
    "up": "blk.{i}.ffn_up",
    "down": "blk.{i}.ffn_down",
}


@dataclass(frozen=True)
class FamilySpec:
    """What one family adds to the generic decoder, as data.

    Attributes:
        model_type: the config.json ``model_type``.
        gguf_arch: llama.cpp's ``general.architecture`` for this family, if it has one.
        gguf_qk_permuted: llama.cpp's converter reorders q/k rows of this architecture for its
            adjacent-pair rotation (``LlamaModel.permute``); loading undoes it.
        norm: ``"rms"`` or ``"layer"``.
        norm_unit_offset: norm weights are stored as ``w`` and applied as ``1 + w`` (Gemma).
        norms: which of the four sublayer norms the block has: ``attn_norm`` / ``ffn_norm``
            before each sublayer, ``attn_post_norm`` / ``ffn_post_norm`` over its output.
        qk_norm: ``None``, ``"head"`` (RMS norm over each head's query/key, Qwen3, Gemma 3)
            or ``"proj"`` (over the whole projection, OLMo 2).
        embed_scale_sqrt_hidden: multiply embeddings by sqrt(hidden_size) (Gemma).
        default_act: activation when the config names none.
        act_keys: config keys naming the activation, first found wins.
        sliding: how per-layer sliding windows are placed when the config has no
            ``layer_types``: ``"none"``, ``"all"`` (every layer when ``sliding_window`` is set),
            ``"qwen2"`` (``use_sliding_window`` from ``max_window_layers`` on),
            ``"even"`` (layers 0, 2, 4, ...), ``"pattern"`` (all but every
            ``sliding_window_pattern``-th layer).
        local_rope_key: config key of the rotary base for sliding layers (Gemma 3).
        no_rope_key: config key of a per-layer list where 0 switches rotation off (SmolLM3).
        attn_scale_key: config key whose value s sets the score scale to s**-0.5 (Gemma 2/3).
        tie_default: whether the head is tied to the embedding when the config does not say.
        names: role -> Hugging Face tensor name prefix (``.weight`` / ``.bias`` appended).
        gguf_names: role -> llama.cpp tensor name prefix.
    """

    model_type: str
    gguf_arch: str | None = None
    gguf_qk_permuted: bool = False
    norm: str = "rms"
    norm_unit_offset: bool = False
    norms: tuple[str, ...] = ("attn_norm", "ffn_norm")
    qk_norm: str | None = None
    embed_scale_sqrt_hidden: bool = False
    default_act: str = "silu"
    act_keys: tuple[str, ...] = ("hidden_act", "hidden_activation")
    sliding: str = "none"
    local_rope_key: str | None = None
    no_rope_key: str | None = None
    attn_scale_key: str | None = None
    attn_softcap_key: str | None = None
    final_softcap_key: str | None = None
    tie_default: bool = False
    names: Mapping[str, str] = field(default_factory=lambda: LLAMA_NAMES)
    gguf_names: Mapping[str, str] = field(default_factory=lambda: GGUF_NAMES)


_GEMMA = dict(norm_unit_offset=True, embed_scale_sqrt_hidden=True, default_act="gelu_pytorch_tanh",
              tie_default=True)
_GEMMA2 = dict(_GEMMA, norms=("attn_norm", "attn_post_norm", "ffn_norm", "ffn_post_norm"),
               names=GEMMA2_NAMES, attn_scale_key="query_pre_attn_scalar",
               attn_softcap_key="attn_logit_softcapping", final_softcap_key="final_logit_softcapping")

FAMILIES: dict[str, FamilySpec] = {
    f.model_type: f
    for f in (
        FamilySpec("llama", gguf_arch="llama", gguf_qk_permuted=True),
        FamilySpec("mistral", gguf_arch="llama", gguf_qk_permuted=True, sliding="all"),
        FamilySpec("qwen2", gguf_arch="qwen2", sliding="qwen2"),
        FamilySpec("qwen3", gguf_arch="qwen3", sliding="qwen2", qk_norm="head"),
        FamilySpec("smollm3", gguf_arch="smollm3", gguf_qk_permuted=True, sliding="qwen2", no_rope_key="no_rope_layers",
                   tie_default=True),
        FamilySpec("gemma", gguf_arch="gemma", **_GEMMA),
        FamilySpec("gemma2", gguf_arch="gemma2", sliding="even", **_GEMMA2),
        FamilySpec("gemma3_text", gguf_arch="gemma3", sliding="pattern", qk_norm="head",
                   local_rope_key="rope_local_base_freq", **_GEMMA2),
    )
}

FAMILIES_BY_GGUF_ARCH: dict[str, FamilySpec] = {}
for _f in FAMILIES.values():
    if _f.gguf_arch and _f.gguf_arch not in FAMILIES_BY_GGUF_ARCH:
        FAMILIES_BY_GGUF_ARCH[_f.gguf_arch] = _f


def implemented_model_types() -> list[str]:
    """The model_type values the decoder runs, in the order of ``KNOWN_MODEL_TYPES``."""
    return [m for m in KNOWN_MODEL_TYPES if m in FAMILIES]


def gate(config: Mapping, config_path: Path | str) -> FamilySpec:
    """The architecture gate: refuse what the decoder cannot run, before any weight is mapped.

    Args:
        config: the parsed config.json (a JSON object).
        config_path: where it was read from, for messages.

    Returns:
        The family's ``FamilySpec``.

    Raises:
        SterError: ``model_type`` missing, null or not in Ster's list (the message names the
            whole list); a listed family this build does not implement yet (names it and the
            implemented ones); a ``quantization_config`` (quantized checkpoints are not run).
    """
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in KNOWN_MODEL_TYPES:
        shown = "missing" if "model_type" not in config else ("null" if model_type is None else repr(model_type))
        raise SterError(
            f"model architecture {shown} in {config_path} is not supported: ster knows the "
            f"model_type values {', '.join(KNOWN_MODEL_TYPES)}; use a Hugging Face checkpoint "
            "whose config.json names one of them"
        )
    if model_type not in FAMILIES:
        raise SterError(
            f"model architecture {model_type!r} ({config_path}) is a known family that this build "
            f"of ster does not run yet; the families it runs are: {', '.join(implemented_model_types())}"
        )
    if config.get("quantization_config") is not None:
        method = config["quantization_config"]
        method = method.get("quant_method", "unknown") if isinstance(method, dict) else "unknown"
        raise SterError(
            f"{config_path} declares a quantization_config (method {method!r}): ster runs "
            "unquantized safetensors checkpoints (f32/f16/bf16) and llama.cpp GGUF files; "
            "use the full-precision checkpoint or a GGUF of the model"
        )
    return FAMILIES[model_type]
