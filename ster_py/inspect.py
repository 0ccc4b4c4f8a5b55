"""Describe a model without running it: architecture, dimensions, tokenizer, tensors, memory.

Only headers are read (config.json, GGUF metadata and tensor table, safetensors
headers); no weight is dequantized.
"""
from __future__ import annotations

import math
import os
from collections import Counter
from typing import Any

import ml_dtypes
import numpy as np

from .config import spec_from_config
from .errors import SterError
from .resolve import resolve
from .validate import check_config, check_spec, interpret
from .weights import precision_dtype, resident_dtype


def _spec_dims(spec) -> dict[str, Any]:
    return {
        "vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size, "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads, "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim, "max_position_embeddings": spec.max_position_embeddings,
        "sliding_window_layers": sum(1 for layer in spec.layers if layer.sliding_window),
        "tie_word_embeddings": spec.tie_word_embeddings,
        **_moe_dims(spec),
        **_ssm_dims(spec),
    }


def _ssm_dims(spec) -> dict[str, Any]:
    """The state-space scan's sizes (models with one only)."""
    if spec.ssm is None:
        return {}
    s = spec.ssm
    from .decoder.kinds import RECURRENT_MIXERS

    out = {"scan_layers": sum(1 for layer in spec.layers if layer.mixer in RECURRENT_MIXERS),
           "attention_layers": sum(1 for i in range(spec.num_hidden_layers) if spec.has_kv(i)),
           "scan": s.kind, "ssm_inner_size": s.d_inner}
    if s.kind != "lightning":
        out["ssm_conv_kernel"] = s.d_conv
    if s.kind == "mamba":
        out.update(ssm_state_size=s.d_state, ssm_dt_rank=s.dt_rank)
    elif s.kind == "mamba2":
        out.update(ssm_state_size=s.d_state, ssm_heads=s.num_heads, ssm_groups=s.n_groups)
    elif s.kind == "lightning":
        out.update(ssm_heads=s.num_heads, ssm_head_dim=s.d_state)
    return out


def _moe_dims(spec) -> dict[str, Any]:
    """The routed feed-forward's sizes (mixture-of-experts models only)."""
    if spec.moe is None:
        return {}
    m = spec.moe
    out = {"routed_layers": sum(1 for layer in spec.layers if layer.ffn == "moe" or layer.shortcut == "open"),
           "num_experts": m.router.num_experts, "num_experts_per_tok": m.router.top_k,
           "moe_intermediate_size": m.expert_size, "shared_expert_size": m.shared_size,
           "router_scoring": m.router.scoring}
    if m.identity_experts:  # LongCat-Flash's: counted in num_experts, without weights
        out["identity_experts"] = m.identity_experts
    return out


def _template_without_tokenizer(root) -> bool:
    """Whether a checkpoint directory without a tokenizer has a default chat template, read as
    ``Tokenizer.from_dir`` reads it (chat_template.jinja, additional_chat_templates/, tokenizer_config.json); a
    file it cannot read counts as none."""
    from .tokenizer import _read_chat_templates, _read_json_object

    try:
        templates, error = _read_chat_templates(root, _read_json_object(root / "tokenizer_config.json"))
    except SterError:
        return False
    return error is None and "default" in templates


_GGUF_FLOATS = {"F16": np.float16, "BF16": ml_dtypes.bfloat16}   # GGUF float types 'auto' keeps


def inspect_model(model: str, revision: str | None = None, *, precision: str = "f32", progress=None) -> dict:
    """A JSON-ready description of ``model``.

    Keys: model, model_revision, kind, architecture, family, dimensions, tokenizer (None for a checkpoint
    directory without one ster reads: a warning says so and what ster needs to run it), chat_template (bool), tensors (count per stored type), parameters, file_bytes,
    resident_bytes (weights held once loaded: GGUF-quantized matrices as stored, every other
    tensor at ``precision``; 'auto' keeps float32/float16/bfloat16 tensors as stored), kv_bytes_per_position (what the f32 cache holds per position over the
    layers that attend: keys and values, or a latent layer's latent and rotated key part), for latent
    attention kv_bytes_per_position_expanded (what expanded keys and values would hold instead), and
    state_bytes_per_sequence (the recurrent state of the state-space layers, float32, whatever the
    context length; 0 without them), and warnings (lines for the user, as ``LoadedModel.warnings`` has them:
    the config's notes and a GGUF special token id outside the vocabulary, which loading ignores).

    Raises:
        SterError: whatever resolution or header validation refuses.
    """
    precision_dtype(precision)  # refuse an unknown precision before resolving
    r = resolve(model, revision, progress=progress, tokenizer=False)   # without one: described, and said
    info: dict[str, Any] = {"model": model, "model_revision": r.model_revision, "kind": r.kind}
    g = None
    if r.gguf_file is not None:
        from .gguf.reader import GGUFFile

        g = GGUFFile(r.gguf_file, allow_unsupported=True)
    if r.kind == "gguf":
        from .gguf.config import spec_from_gguf
        from .gguf.tokenizer import tokenizer_from_gguf_metadata

        from .steering import CONTROL_VECTOR_USE, describe_control_vector

        cv = describe_control_vector(g)
        if cv is not None:  # described, as a model is (``ster inspect --json`` prints JSON for it too)
            info.update(kind="control_vector", architecture="controlvector", layers=cv["layers"],
                        hidden_size=cv["hidden_sizes"][0] if len(cv["hidden_sizes"]) == 1 else cv["hidden_sizes"],
                        model_hint=cv["model_hint"], file_bytes=os.path.getsize(r.gguf_file),
                        note=f"not a model: {CONTROL_VECTOR_USE}")
            return info
        if "token_embd.weight" not in g.tensors:
            raise SterError(f"{r.gguf_file} holds no model weights (no token_embd.weight)")
        path = str(r.gguf_file)
        spec = check_spec(interpret(path, spec_from_gguf, g.metadata, path,
                                    vocab_size=g.tensor("token_embd.weight").shape[0],
                                    has_output="output.weight" in g.tensors,
                                    tensors={n: t.shape for n, t in g.tensors.items()}), path)
        parts = interpret(path, tokenizer_from_gguf_metadata, g.metadata)
        notes = list(parts.notes)
        info.update(architecture=g.architecture, family=spec.model_type,
                    tokenizer=f"gguf:{g.metadata.get('tokenizer.ggml.model')}"
                              f"/{g.metadata.get('tokenizer.ggml.pre', '-')}",
                    chat_template=parts.chat_template is not None)
    else:
        from .tokenizer import Tokenizer

        source = str(r.config_path)
        check_config(r.config, source)
        spec = check_spec(interpret(source, spec_from_config, r.config, r.family, source), source)
        if r.tokenizer_path is None:   # resolve's notes say it is missing and what ster needs to run the model
            tokenizer, notes, has_template = None, [], _template_without_tokenizer(r.root)
        else:
            tok = Tokenizer.from_dir(r.root)
            tokenizer, notes = f"tokenizer.json:{type(tok.tk.model).__name__}", list(tok.notes)
            try:
                has_template = tok.chat_template is not None
            except SterError as e:  # a template file not UTF-8, a malformed chat_template: shown, not fatal here
                has_template = False
                notes.append(str(e))
        architectures = r.config.get("architectures")
        info.update(architecture=architectures[0] if isinstance(architectures, list) and architectures else None,
                    family=r.family.model_type, tokenizer=tokenizer, chat_template=has_template)
    if g is not None:
        tensors = list(g.tensors.values())
        info["tensors"] = dict(Counter(t.type_name for t in tensors))
        n_params = sum(t.n_elements for t in tensors)
        info["file_bytes"] = g.file_size
        from .decoder.qlinear import QUANT_TYPES

        # Quantized matrices and expert stacks stay in their blocks in the memory map; the rest is widened.
        resident = sum(t.nbytes if t.type_name in QUANT_TYPES and len(t.shape) in (2, 3)
                       else t.n_elements * resident_dtype(precision, _GGUF_FLOATS.get(t.type_name, np.float32)).itemsize
                       for t in tensors)
    else:
        from .weights import read_safetensors_header, safetensors_dtypes

        types: Counter = Counter()
        n_params = resident = 0
        for f in r.weight_files:  # the loader's own header check, so inspect refuses what loading refuses
            try:
                _, header = read_safetensors_header(f)
            except (OSError, ValueError, UnicodeDecodeError) as e:
                raise SterError(f"failed to read the safetensors header of {f}: {e}; re-download the file") from None
            for dtype, shape, _, _ in header.values():
                types[dtype] += 1
                n = math.prod(shape)
                n_params += n
                resident += n * resident_dtype(precision, safetensors_dtypes().get(dtype, np.float32)).itemsize
        info["tensors"] = dict(types)
        info["file_bytes"] = sum(f.stat().st_size for f in r.weight_files)
    info["dimensions"] = _spec_dims(spec)
    info["parameters"] = n_params
    info["precision"] = precision
    info["resident_bytes"] = resident
    layers = [i for i in range(spec.num_hidden_layers) if spec.has_kv(i)]
    info["kv_bytes_per_position"] = 4 * sum(map(spec.cache_width, layers))
    if spec.latent is not None:  # what keys and values expanded from the latent would cost instead
        info["kv_bytes_per_position_expanded"] = 4 * sum(kv * (dk + dv) for _, kv, dk, dv in
                                                         map(spec.attention_shape, layers))
    # A recurrent mixer's state (convolution inputs and scan state, float32) does not grow with the context.
    info["state_bytes_per_sequence"] = spec.state_bytes()
    info["warnings"] = [*r.notes, *notes]
    return info
