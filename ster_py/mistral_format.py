"""Mistral's own checkpoint format: ``params.json`` + ``consolidated*.safetensors`` (no config.json).

Mistral publishes some models (and both formats of others) as the reference implementation stores
them: ``params.json`` spells the hyper-parameters its own way (``dim``, ``n_layers``, ``n_heads``,
``n_kv_heads``, ``head_dim``, ``hidden_dim``, ``norm_eps``, ``rope_theta``, ``vocab_size``,
``sliding_window``, ``tied_embeddings``, ``max_seq_len``), the tensors carry the original names
(``tok_embeddings``, ``layers.{i}.attention.wq``, ``feed_forward.w1`` (gate) / ``w2`` (down) /
``w3`` (up), ``attention_norm``, ``ffn_norm``, ``norm``, ``output``), and the query and key rows are
in the order of the reference code's rotation of adjacent pairs (Transformers' conversion script
permutes them to its half-split rotation; this format does not).

``config_from_params`` puts a dense model's params.json in the Transformers shape as vLLM and
llama.cpp's converter read it (``conversion/mistral.py``, ``MistralModel``): model_type ``mistral``
with ``mistral_format`` set, which makes the family table's variant read Mistral's names and rotate
adjacent pairs (seed 002). What this build does not run is refused by name before any weight is read:
experts (``moe``: Mistral Large 3's latent attention with experts, Mixtral's layout), latent attention
(``q_lora_rank`` / ``kv_lora_rank``), a ``yarn`` rotation or Llama 4's ``llama_4_scaling``, a
``quantization`` block. A ``vision_encoder`` block is ignored: the tower's and the adapter's tensors
(``vision_encoder.*``, ``vision_language_adapter.*``) stay unread beside the text decoder.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from .errors import SterError

PARAMS = "params.json"
#: Mistral's weight files in its own format (seed 002: the consolidated* files).
WEIGHT_PREFIX = "consolidated"

#: params.json key -> Transformers key (vLLM's and llama.cpp's mapping).
KEYS = {"dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
        "n_kv_heads": "num_key_value_heads", "head_dim": "head_dim", "hidden_dim": "intermediate_size",
        "norm_eps": "rms_norm_eps", "vocab_size": "vocab_size", "rope_theta": "rope_theta",
        "sliding_window": "sliding_window", "tied_embeddings": "tie_word_embeddings"}
REQUIRED = ("dim", "n_layers", "n_heads", "hidden_dim", "norm_eps", "vocab_size")

#: params.json blocks this build refuses, with the reason and what to do.
_REFUSED = {
    "moe": "experts (Mistral Large 3's latent attention with routed and shared experts, or Mixtral's layout)",
    "q_lora_rank": "latent attention (Mistral Large 3)",
    "kv_lora_rank": "latent attention (Mistral Large 3)",
    "yarn": "a YaRN rotation block",
    "llama_4_scaling": "Llama 4's query temperature (llama_4_scaling)",
    "quantization": "quantized weights (a quantization block)",
}


def config_from_params(params: Mapping[str, Any], where: str | Path) -> dict:
    """A dense Mistral-format ``params.json`` as the Transformers config ster gates and reads.

    Args:
        params: the parsed params.json (a JSON object).
        where: its path, for messages.

    Returns:
        dict: ``model_type`` ``mistral``, ``mistral_format`` true, the keys of ``KEYS`` renamed
        (``num_key_value_heads`` defaults to ``n_heads``, ``head_dim`` to ``dim / n_heads``, ``rope_theta``
        to 10000 (the reference code's default), ``tie_word_embeddings`` to false), ``hidden_act`` silu,
        ``max_position_embeddings`` from ``max_seq_len`` / ``max_position_embeddings`` (default 128000,
        as llama.cpp's converter).

    Raises:
        SterError: a block this build does not run (``_REFUSED``), a required key missing, a size that is not
            a positive integer, an ``activation`` other than silu.
    """
    for key, what in _REFUSED.items():
        if params.get(key) not in (None, {}, False):
            raise SterError(f"{where} is a checkpoint in Mistral's own format with {what}, which ster does not run "
                            "from this format yet; use the Transformers-format checkpoint of the same model "
                            "(config.json, model*.safetensors) if its repository publishes one")
    missing = [k for k in REQUIRED if k not in params]
    if missing:
        raise SterError(f"invalid Mistral params.json {where}: it lacks {', '.join(missing)}; re-download it")
    for key in ("dim", "n_layers", "n_heads", "hidden_dim", "vocab_size", "n_kv_heads", "head_dim"):
        value = params.get(key)
        if key in params and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise SterError(f"invalid Mistral params.json {where}: {key} is {repr(value)[:40]}, not a positive "
                            "integer; re-download it")
    act = params.get("activation", "silu")
    if act != "silu":
        raise SterError(f"{where}: activation {str(act)[:40]!r} in Mistral's format is not run (only silu)")
    config: dict[str, Any] = {"model_type": "mistral", "mistral_format": True, "architectures": ["MistralForCausalLM"],
                              "hidden_act": "silu", "rope_theta": 10000.0, "tie_word_embeddings": False,
                              "num_key_value_heads": params["n_heads"]}
    for key, name in KEYS.items():
        if params.get(key) is not None:
            config[name] = params[key]
    config.setdefault("head_dim", params["dim"] // params["n_heads"])
    config["max_position_embeddings"] = params.get("max_seq_len") or params.get("max_position_embeddings") or 128_000
    return config


def weight_names(names: list[str]) -> list[str]:
    """The top-level ``consolidated*.safetensors`` files among ``names``, sorted."""
    return sorted(n for n in names if n.startswith(WEIGHT_PREFIX) and n.endswith(".safetensors"))
