"""Describe a model without running it: architecture, dimensions, tokenizer, tensors, memory.

Only headers are read (config.json, GGUF metadata and tensor table, safetensors
headers); no weight is dequantized.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from .config import spec_from_config
from .errors import SterError
from .resolve import resolve
from .weights import precision_dtype


def _spec_dims(spec) -> dict[str, Any]:
    return {
        "vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size, "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads, "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim, "max_position_embeddings": spec.max_position_embeddings,
        "sliding_window_layers": sum(1 for layer in spec.layers if layer.sliding_window),
        "tie_word_embeddings": spec.tie_word_embeddings,
    }


def inspect_model(model: str, revision: str | None = None, *, precision: str = "f32", progress=None) -> dict:
    """A JSON-ready description of ``model``.

    Keys: model, model_revision, kind, architecture, family, dimensions, tokenizer,
    chat_template (bool), tensors (count per stored type), parameters, file_bytes,
    resident_bytes (weights held at ``precision`` once loaded), kv_bytes_per_position (f32
    keys and values over all layers).

    Raises:
        SterError: whatever resolution or header validation refuses.
    """
    itemsize = precision_dtype(precision).itemsize
    r = resolve(model, revision, progress=progress)
    info: dict[str, Any] = {"model": model, "model_revision": r.model_revision, "kind": r.kind}
    if r.kind == "gguf":
        from .gguf.config import spec_from_gguf
        from .gguf.reader import GGUFFile
        from .gguf.tokenizer import tokenizer_from_gguf_metadata

        g = GGUFFile(r.gguf_file, allow_unsupported=True)
        if "token_embd.weight" not in g.tensors:
            raise SterError(f"{r.gguf_file} holds no model weights (no token_embd.weight)")
        spec = spec_from_gguf(g.metadata, str(r.gguf_file), vocab_size=g.tensor("token_embd.weight").shape[0],
                              has_output="output.weight" in g.tensors)
        parts = tokenizer_from_gguf_metadata(g.metadata)
        info.update(architecture=g.architecture, family=spec.model_type,
                    tokenizer=f"gguf:{g.metadata.get('tokenizer.ggml.model')}"
                              f"/{g.metadata.get('tokenizer.ggml.pre', '-')}",
                    chat_template=parts.chat_template is not None)
        tensors = list(g.tensors.values())
        info["tensors"] = dict(Counter(t.type_name for t in tensors))
        n_params = sum(t.n_elements for t in tensors)
        info["file_bytes"] = g.file_size
    else:
        from safetensors import safe_open

        from .tokenizer import Tokenizer

        spec = spec_from_config(r.config, r.family, str(r.config_path))
        tok = Tokenizer.from_dir(r.root)
        model_kind = type(tok.tk.model).__name__
        info.update(architecture=r.config.get("architectures", [None])[0] if r.config.get("architectures") else None,
                    family=r.family.model_type, tokenizer=f"tokenizer.json:{model_kind}",
                    chat_template=tok.chat_template is not None)
        types: Counter = Counter()
        n_params = 0
        for f in r.weight_files:
            with safe_open(str(f), framework="numpy") as h:
                for name in h.keys():
                    sl = h.get_slice(name)
                    types[sl.get_dtype()] += 1
                    n = 1
                    for d in sl.get_shape():
                        n *= d
                    n_params += n
        info["tensors"] = dict(types)
        info["file_bytes"] = sum(f.stat().st_size for f in r.weight_files)
    info["dimensions"] = _spec_dims(spec)
    info["parameters"] = n_params
    info["precision"] = precision
    info["resident_bytes"] = n_params * itemsize
    info["kv_bytes_per_position"] = 2 * spec.num_hidden_layers * spec.num_key_value_heads * spec.head_dim * 4
    return info
