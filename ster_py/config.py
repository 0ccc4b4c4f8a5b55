"""Normalise a model's configuration into the ``ModelSpec`` the decoder reads.

``spec_from_config`` reads a Hugging Face config.json (Transformers 4 or 5 shape)
through the family's ``FamilySpec``; the GGUF path builds the same ``ModelSpec``
from file metadata (``gguf/config.py``). The decoder reads only ``ModelSpec``,
never a raw config key.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from .decoder.rope import Rope, make_rope
from .errors import SterError
from .families import FamilySpec

NORM_EPS_KEYS = ("rms_norm_eps", "layer_norm_eps", "norm_epsilon", "norm_eps", "layer_norm_epsilon")
ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh", "gelu_new", "gelu_fast", "gelu_tanh", "relu2", "relu")


@dataclass(frozen=True)
class LayerSpec:
    """What varies from layer to layer: its attention window and its rotation.

    ``sliding_window`` counts the key positions a query sees, itself included
    (None: all earlier positions). ``rope`` is None on layers that do not rotate.
    """

    sliding_window: int | None
    rope: Rope | None


@dataclass(frozen=True)
class ModelSpec:
    """The normalised description of a decoder, independent of where it came from.

    Dimensions use Transformers' names. ``names`` maps each tensor role the decoder
    asks for (``embed``, ``q``, ``attn_norm``, ...) to the tensor name prefix in the
    weight source (Hugging Face or llama.cpp names).
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    norm: str
    norm_eps: float
    norm_unit_offset: bool
    norms: tuple[str, ...]
    qk_norm: str | None
    hidden_act: str
    embed_scale: float
    attn_scale: float
    attn_softcap: float | None
    final_softcap: float | None
    tie_word_embeddings: bool
    layers: tuple[LayerSpec, ...]
    names: Mapping[str, str]
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)


def _first(config: Mapping, keys: tuple[str, ...], default=None):
    for k in keys:
        if config.get(k) is not None:
            return config[k]
    return default


def _int(config: Mapping, key: str, config_name: str, default=None) -> int:
    v = config.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise SterError(f"invalid model config {config_name}: {key} must be a positive integer, got {v!r}")
    return v


def _rope_params(config: Mapping) -> tuple[dict, dict | None]:
    """The (full-attention, sliding-attention or None) rope parameter sets of a config.

    Transformers 5 writes ``rope_parameters`` (flat, or one object per layer type);
    Transformers 4 wrote ``rope_theta`` plus an optional ``rope_scaling``.
    """
    rp = config.get("rope_parameters")
    if isinstance(rp, Mapping) and ("full_attention" in rp or "sliding_attention" in rp):
        full = dict(rp.get("full_attention") or rp.get("sliding_attention"))
        sliding = dict(rp["sliding_attention"]) if "sliding_attention" in rp else None
        return full, sliding
    if isinstance(rp, Mapping):
        return dict(rp), None
    params = dict(config.get("rope_scaling") or {})
    if "rope_type" not in params and "type" in params:
        params["rope_type"] = params.pop("type")
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    return params, None


def _sliding_layers(config: Mapping, family: FamilySpec, n_layers: int) -> list[bool]:
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and len(layer_types) == n_layers:
        return [t == "sliding_attention" for t in layer_types]
    if config.get("sliding_window") is None:
        return [False] * n_layers
    rule = family.sliding
    if rule == "all":
        return [True] * n_layers
    if rule == "qwen2":
        on = bool(config.get("use_sliding_window", False))
        first = config.get("max_window_layers", n_layers)
        return [on and i >= first for i in range(n_layers)]
    if rule == "even":
        return [i % 2 == 0 for i in range(n_layers)]
    if rule == "pattern":
        pattern = config.get("sliding_window_pattern") or config.get("_sliding_window_pattern") or 6
        return [(i + 1) % pattern != 0 for i in range(n_layers)]
    return [False] * n_layers


def spec_from_config(config: Mapping, family: FamilySpec, config_name: str = "config.json") -> ModelSpec:
    """Build the ``ModelSpec`` of a Hugging Face config.json.

    Args:
        config: the parsed JSON object (already through ``families.gate``).
        family: the family's spec.
        config_name: the file's path, for messages.

    Raises:
        SterError: a missing or invalid dimension, an unsupported activation or rope type.
    """
    hidden = _int(config, "hidden_size", config_name)
    heads = _int(config, "num_attention_heads", config_name)
    kv_heads = _int(config, "num_key_value_heads", config_name, heads) if config.get(
        "num_key_value_heads") is not None else heads
    head_dim = config.get("head_dim") or hidden // heads
    n_layers = _int(config, "num_hidden_layers", config_name)
    if heads % kv_heads:
        raise SterError(f"invalid model config {config_name}: num_attention_heads ({heads}) is not a "
                        f"multiple of num_key_value_heads ({kv_heads})")
    act = _first(config, family.act_keys, family.default_act)
    if act not in ACTIVATIONS:
        raise SterError(f"invalid model config {config_name}: activation {act!r} is not supported; "
                        f"supported: {', '.join(ACTIVATIONS)}")
    max_pos = config.get("max_position_embeddings", 2048)
    partial = float(config.get("partial_rotary_factor", 1.0))

    full_params, sliding_params = _rope_params(config)
    if family.local_rope_key and config.get(family.local_rope_key) is not None:
        sliding_params = {"rope_type": "default", "rope_theta": config[family.local_rope_key]}
    full_rope = make_rope(full_params, head_dim=head_dim, max_position_embeddings=max_pos,
                          partial_rotary_factor=partial)
    sliding_rope = full_rope if sliding_params is None else make_rope(
        sliding_params, head_dim=head_dim, max_position_embeddings=max_pos, partial_rotary_factor=partial)

    no_rope = config.get(family.no_rope_key) if family.no_rope_key else None
    window = config.get("sliding_window")
    layers = []
    for i, sliding in enumerate(_sliding_layers(config, family, n_layers)):
        rope = sliding_rope if sliding else full_rope
        if no_rope is not None and i < len(no_rope) and not no_rope[i]:
            rope = None
        layers.append(LayerSpec(sliding_window=window if sliding else None, rope=rope))

    scalar = config.get(family.attn_scale_key) if family.attn_scale_key else None
    eos = config.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())
    return ModelSpec(
        model_type=config["model_type"],
        vocab_size=_int(config, "vocab_size", config_name),
        hidden_size=hidden,
        intermediate_size=_int(config, "intermediate_size", config_name),
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_pos,
        norm=family.norm,
        norm_eps=float(_first(config, NORM_EPS_KEYS, 1e-6)),
        norm_unit_offset=family.norm_unit_offset,
        norms=family.norms,
        qk_norm=family.qk_norm,
        hidden_act=act,
        embed_scale=math.sqrt(hidden) if family.embed_scale_sqrt_hidden else 1.0,
        attn_scale=(scalar if scalar else head_dim) ** -0.5,
        attn_softcap=config.get(family.attn_softcap_key) if family.attn_softcap_key else None,
        final_softcap=config.get(family.final_softcap_key) if family.final_softcap_key else None,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", family.tie_default)),
        layers=tuple(layers),
        names=family.names,
        bos_token_id=config.get("bos_token_id"),
        eos_token_ids=eos_ids,
    )
