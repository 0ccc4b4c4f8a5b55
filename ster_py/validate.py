"""Checks on a built ``ModelSpec`` before any weight is read.

Configuration files are untrusted input: a value of the wrong type, NaN, zero or
negative can survive the spelling-specific readers and only show up as NaN logits
(and a greedy run of token 0) much later. These checks look at the normalised spec,
whatever file or key spelling it came from, and refuse with the field's name.
"""
from __future__ import annotations

import math
from typing import Callable, TypeVar

import numpy as np

from .config import MAX_DIM, MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS, ModelSpec
from .decoder.rope import brief_value
from .errors import SterError

T = TypeVar("T")

# Python errors that mean "this configuration value is not what it should be".
CONFIG_ERRORS = (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError,
                 OverflowError, RecursionError)


def interpret(source: str, build: Callable[..., T], *args, **kwargs) -> T:
    """Run ``build`` on an untrusted configuration; a Python error becomes a SterError naming ``source``."""
    try:
        return build(*args, **kwargs)
    except SterError:
        raise
    except CONFIG_ERRORS as e:
        raise SterError(f"invalid model config {source}: {type(e).__name__}: {e}") from None


# config.json keys that must be JSON booleans when present ("false" as a string is truthy in Python).
BOOLEAN_KEYS = ("tie_word_embeddings", "use_sliding_window", "attention_bias", "mlp_bias", "use_qkv_bias",
                "use_parallel_residual", "qk_layernorm", "use_qk_norm", "parallel_attn", "bias", "multi_query",
                "new_decoder_architecture", "alibi", "use_bias", "use_post_norm", "rope_interleave",
                "linear_silu",  # Ling 2.5's lightning attention
                # ChatGLM's switches (its remote code's ChatGLMConfig)
                "multi_query_attention", "rmsnorm", "original_rope", "post_layer_norm", "add_bias_linear",
                "add_qkv_bias", "apply_residual_connection_post_layernorm", "apply_query_key_layer_scaling",
                "attention_softmax_in_fp32", "fp32_residual_connection")


# config.json special-token ids: an integer id, a list of them (eos_token_id of chat models), or null.
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def _check_token_ids(config, source: str, prefix: str = "") -> None:
    for key in TOKEN_ID_KEYS:
        value = config.get(key)
        # pad_token_id -1 ("none") appears in released configs; ster never reads pad ids.
        low = -1 if key == "pad_token_id" else 0
        listed = isinstance(value, list) and key == "eos_token_id"  # only EOS comes as a list (chat models)
        for v in value if listed else [value]:
            if v is None and not listed:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v < MAX_DIM:
                shown = brief_value(v)
                raise SterError(f"invalid model config {source}: {prefix}{key} must be a token id (an integer in "
                                f"0..{MAX_DIM - 1}){' or a list of them' if key == 'eos_token_id' else ''}, "
                                f"got {shown}")


# config.json integer sizes that reach the kernels as C integers (windows, head counts and widths,
# ranks, convolution taps), whatever family reads them: a value above its bound (far above any
# released model; the same bounds as GGUF_SIZE_KEYS') is refused by name before a spec is built.
CONFIG_INT_LIMITS = {
    **{k: MAX_DIM for k in ("sliding_window", "sliding_window_size", "window_size", "attention_window_size",
                            "kv_lora_rank", "q_lora_rank", "rel_extent", "max_position_embeddings",
                            "original_max_position_embeddings", "index_topk", "block_size", "chunk_size",
                            "attention_chunk_size", "moe_intermediate_size", "dense_intermediate_size",
                            "shared_intermediate_size", "unpadded_vocab_size", "max_window_layers")},
    **{k: MAX_HEADS for k in ("num_attention_heads", "num_key_value_heads", "index_n_heads",
                              "swa_num_attention_heads", "swa_num_key_value_heads", "num_sliding_attention_heads",
                              "linear_num_key_heads", "linear_num_value_heads", "n_heads", "n_head", "n_kv_heads",
                              "multi_query_group_num", "num_experts_per_tok")},
    **{k: MAX_HEAD_DIM for k in ("head_dim", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "qk_head_dim",
                                 "index_head_dim", "rope_head_dim", "swa_head_dim",
                                 "linear_key_head_dim", "linear_value_head_dim", "d_rel", "kv_channels",
                                 "swa_qk_rope_head_dim", "swa_qk_nope_head_dim")},
    **{k: 1024 for k in ("conv_kernel_size", "sconv_kernel_size", "short_conv_kernel_size", "conv_kernel",
                         "conv_L_cache", "d_conv", "linear_conv_kernel_dim")},
}


def _check_int_limits(config, source: str, prefix: str = "") -> None:
    for key, limit in CONFIG_INT_LIMITS.items():
        v = config.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > limit:
            raise SterError(f"invalid model config {source}: {prefix}{key} is {brief_value(v)}, beyond the limit of "
                            f"{limit} (far above any released model); the config is corrupt or not one ster can run")


def check_config(config, source: str) -> None:
    """Type checks on raw config.json values that the family readers coerce, and upper bounds on
    the integer sizes the kernels take as C integers (``CONFIG_INT_LIMITS``). Raises SterError."""
    _check_int_limits(config, source)
    if isinstance(config.get("text_config"), dict):
        _check_int_limits(config["text_config"], source, "text_config.")
    for key in BOOLEAN_KEYS:
        if key in config and config[key] is not None and not isinstance(config[key], bool):
            raise SterError(f"invalid model config {source}: {key} must be true or false, "
                            f"got {brief_value(config[key])}")
    _check_token_ids(config, source)
    if isinstance(config.get("text_config"), dict):  # the tokenizer reads its eos_token_id too
        _check_token_ids(config["text_config"], source, "text_config.")


def _positive_finite(value, name: str, source: str, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        raise SterError(f"invalid model config {source}: {name} must be a finite number above 0, got {value!r}")


SIZE_LIMITS = {"vocab_size": MAX_DIM, "hidden_size": MAX_DIM, "intermediate_size": MAX_DIM,
               "num_hidden_layers": MAX_LAYERS, "num_attention_heads": MAX_HEADS, "num_key_value_heads": MAX_HEADS,
               "head_dim": MAX_HEAD_DIM, "max_position_embeddings": MAX_DIM}

# llama.cpp metadata keys (after ``{arch}.``) of the same sizes, checked before a spec is built from them.
GGUF_SIZE_KEYS = {"block_count": MAX_LAYERS, "attention.head_count": MAX_HEADS,
                  "attention.head_count_kv": MAX_HEADS, "attention.key_length": MAX_HEAD_DIM,
                  "attention.value_length": MAX_HEAD_DIM, "rope.dimension_count": MAX_HEAD_DIM,
                  "embedding_length": MAX_DIM, "feed_forward_length": MAX_DIM, "context_length": MAX_DIM,
                  "vocab_size": MAX_DIM, "attention.sliding_window": MAX_DIM,
                  "rope.scaling.original_context_length": MAX_DIM, "attention.q_lora_rank": MAX_DIM,
                  "attention.kv_lora_rank": MAX_DIM, "attention.key_length_mla": MAX_HEAD_DIM,
                  "attention.value_length_mla": MAX_HEAD_DIM, "ssm.inner_size": MAX_DIM,
                  "ssm.state_size": MAX_DIM, "ssm.conv_kernel": 1024, "ssm.time_step_rank": MAX_DIM,
                  "ssm.group_count": MAX_DIM}


def check_gguf_sizes(meta, source: str) -> None:
    """Refuse GGUF size metadata beyond ``SIZE_LIMITS`` before per-layer tables are built from it.

    A size that is a number but not an integer (a float, a boolean: llama.cpp reads these keys as
    integers and refuses other types) is refused by name; one of another kind (a per-layer array) is
    left to the spec builder, which names it. Raises SterError.
    """
    arch = meta.get("general.architecture")
    for key, limit in GGUF_SIZE_KEYS.items():
        v = meta.get(f"{arch}.{key}")
        # (a float sliding_window was truncated by int(), or, at 1e30, overflowed the attention kernel's C long)
        if isinstance(v, (float, np.floating, bool, np.bool_)):
            raise SterError(f"{source}: GGUF metadata {arch}.{key} must be a whole number, got {brief_value(v)}; "
                            "the file is corrupt or not a model ster can run")
        if isinstance(v, (int, np.integer)) and v > limit:
            raise SterError(f"{source}: GGUF metadata {arch}.{key} is {int(v)}, above the limit of {limit}; "
                            "the file is corrupt or not a model ster can run")


def check_spec(spec: ModelSpec, source: str) -> ModelSpec:
    """Refuse a spec whose numbers cannot give finite logits. Returns ``spec``.

    Raises:
        SterError: naming the field: sizes out of range, non-positive or non-finite norm
            epsilon, scales (attention, embedding, residual, logit), soft-caps, clip_qkv or
            rotary frequencies, a bad sliding window, a
            non-boolean ``tie_word_embeddings``.
    """
    for name, limit in SIZE_LIMITS.items():
        v = getattr(spec, name)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 < v <= limit:
            raise SterError(f"invalid model config {source}: {name} must be an integer in 1..{limit}, got {v!r}")
    _positive_finite(spec.norm_eps, "the norm epsilon", source)
    _positive_finite(spec.attn_scale, "the attention scale (query_pre_attn_scalar / head_dim)", source)
    _positive_finite(spec.embed_scale, "the embedding scale", source)
    _positive_finite(spec.attn_softcap, "attn_logit_softcapping", source, allow_none=True)
    _positive_finite(spec.final_softcap, "final_logit_softcapping", source, allow_none=True)
    # Granite's multipliers, Command R's logit_scale: zero, negative or NaN silently wrecks every logit.
    _positive_finite(spec.residual_scale, "the residual scale (residual_multiplier)", source)
    _positive_finite(spec.logit_scale, "the logit scale (logit_scale / logits_scaling)", source)
    _positive_finite(spec.clip_qkv, "clip_qkv (the q/k/v clamp bound)", source, allow_none=True)
    _positive_finite(spec.value_scale, "the value scale (attention_value_scale)", source)
    _positive_finite(spec.post_norm_eps, "post_norm_eps (the output norms' epsilon)", source, allow_none=True)
    _positive_finite(spec.ffn_limit, "swiglu_limit (the gated unit's clamp)", source, allow_none=True)
    for moe in {id(m): m for m in [spec.moe, *(layer.moe for layer in spec.layers)] if m is not None}.values():
        _positive_finite(moe.limit, "swiglu_limit (the experts' clamp)", source, allow_none=True)
        _positive_finite(moe.shared_limit, "the shared experts' swiglu_limit", source, allow_none=True)
    if not isinstance(spec.tie_word_embeddings, bool):
        raise SterError(f"invalid model config {source}: tie_word_embeddings must be true or false, "
                        f"got {spec.tie_word_embeddings!r}")
    for i, layer in enumerate(spec.layers):
        w = layer.sliding_window
        if w is not None and (isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w <= 0):
            raise SterError(f"invalid model config {source}: sliding_window must be a positive integer, got {w!r}")
        rope = layer.rope
        if rope is None:
            continue
        tables = [rope.inv_freq] + ([rope.long_inv_freq] if rope.long_inv_freq is not None else [])
        for table in tables:
            table = np.asarray(table, dtype=np.float64)
            # zero: a pair that does not turn (a proportional rotation's unrotated share)
            if (table.shape != (rope.rotary_dim // 2,) or not np.all(np.isfinite(table)) or np.any(table < 0)
                    or not np.any(table > 0)):
                raise SterError(f"invalid model config {source}: layer {i}'s rotary frequencies are not finite "
                                "and positive (check rope_theta and the rope scaling factors)")
        width = spec.attention_shape(i)[2]  # the layer's own head width (Gemma 4's full-attention layers)
        if not 0 < rope.rotary_dim <= width or rope.rotary_dim % 2:
            raise SterError(f"invalid model config {source}: the rotary width {rope.rotary_dim} must be even and "
                            f"within head_dim {width} (check partial_rotary_factor / rotary_dim)")
        _positive_finite(rope.attention_factor, "the rope attention factor", source)
    return spec
