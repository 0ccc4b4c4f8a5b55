"""Build a runnable model from a GGUF file, or from a "GGUF directory".

A bare GGUF (``kind == "gguf"``) brings everything: configuration, tokenizer and
chat template come from its metadata. A GGUF directory (``kind == "gguf_dir"``:
config.json + tokenizer.json + one .gguf) takes configuration and tokenizer from
the JSON files and only the weights from the GGUF, read under llama.cpp's names.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..config import MAX_LAYERS, spec_from_config
from ..decoder.model import Decoder
from ..errors import SterError
from ..tokenizer import Tokenizer
from ..weights import GGUFWeights
from .config import spec_from_gguf
from ..validate import check_config, check_spec, interpret
from .reader import GGUFFile
from .tokenizer import tokenizer_from_gguf_metadata


def gguf_layout(spec, family, config):
    """``spec`` (from config.json) with its tensors read under llama.cpp's names and layout.

    The names are those of the family as ``config`` switches it and as llama.cpp reads
    the architecture (``gguf_changes``: Falcon's two-norm blocks read ``attn_norm_2`` /
    ``attn_norm``); a role may list alternatives, first found wins. llama.cpp's converter
    stores every fused qkv as [q | k | v], linear weights as [out, in] (GPT-2's Conv1D
    transposed), experts as separate [n_expert, out, in] gate / up / down stacks (gpt-oss's
    and Llama 4's fused, inputs-first ones split and transposed), no base-model prefix,
    per-head q/k norms as one [heads, head_dim] tensor, and norms kept as offsets from one
    (Gemma, Nemotron) as 1 + w (PLaMo 3's from 1/5 and 5 ** -1.5 as w + those); where it folds a family's multipliers into the weights
    (Falcon-H1's muP, embedding and head multipliers), they are 1 here.
    """
    gguf_family = dataclasses.replace(family.for_config(config), **family.gguf_changes)
    folded = dict(mup=None, embed_scale=1.0, logit_scale=1.0) if family.gguf_folded else {}
    return dataclasses.replace(spec, names=gguf_family.gguf_names, fused_qkv="concat", inputs_first=False,
                               root=None, norm_unit_offset=False, norm_offsets=(), expert_inputs_first=(),
                               expert_gate_up_interleaved=False, **folded)


def load_gguf_model(resolved, *, precision: str = "f32", progress=None, check=None):
    """Load ``resolved`` (kind "gguf" or "gguf_dir") into a ``LoadedModel``.

    ``check(resolved, spec)``, when given, runs once the spec is known and before any
    tensor is mapped (see ``ster_py.load.load_model``).

    Raises:
        SterError: an unsupported architecture or tensor type, a malformed file, a tensor
            the model needs that the file lacks, or shapes that disagree with the config;
            whatever ``check`` raises.
    """
    from ..load import LoadedModel

    path = str(resolved.gguf_file)
    gguf = GGUFFile(resolved.gguf_file)
    meta = gguf.metadata
    names = set(gguf.tensor_names())
    if resolved.kind == "gguf":
        rope_freqs = gguf.tensor("rope_freqs.weight").dequantize() if "rope_freqs.weight" in names else None
        rope_factors = (tuple(gguf.tensor(f"rope_factors_{k}.weight").dequantize() for k in ("short", "long"))
                        if {"rope_factors_short.weight", "rope_factors_long.weight"} <= names else None)
        embd = gguf.tensor("token_embd.weight") if "token_embd.weight" in names else None
        if embd is None:
            from ..steering import refuse_control_vector

            refuse_control_vector(gguf, path)
            raise SterError(f"{path} has no token_embd.weight tensor: it holds no model weights "
                            "(a vocabulary-only GGUF can tokenize but not generate)")
        spec = check_spec(interpret(path, spec_from_gguf, meta, path, rope_freqs=rope_freqs,
                                    rope_factors=rope_factors, vocab_size=embd.shape[0],
                                    has_output="output.weight" in names,
                                    tensors={n: t.shape for n, t in gguf.tensors.items()}), path)
        from ..families import FAMILIES

        family = FAMILIES[spec.model_type]

        def make_tokenizer():
            return interpret(path, tokenizer_from_gguf_metadata, meta).to_tokenizer(path)
    else:
        family = resolved.family
        source = str(resolved.config_path)
        arch = meta.get("general.architecture")
        from ..families import FAMILIES_BY_GGUF_ARCH as _BY_ARCH

        if family.gguf_arch is None or (arch != family.gguf_arch and _BY_ARCH.get(arch) is not family):
            raise SterError(f"{path} is a GGUF of architecture {arch!r}, but {source} describes a "
                            f"{family.model_type!r} model, which llama.cpp converts to "
                            f"{family.gguf_arch or 'no GGUF architecture'}; put the config.json the GGUF was "
                            "converted from beside it, or load the .gguf file alone")
        check_config(resolved.config, source)
        spec = check_spec(interpret(source, spec_from_config, resolved.config, family, source), source)
        spec = gguf_layout(spec, family, resolved.config)
        nextn = meta.get(f"{arch}.nextn_predict_layers")
        if isinstance(nextn, (int, np.integer)) and 0 < nextn <= MAX_LAYERS:  # the file's NextN blocks, after
            n = spec.num_hidden_layers                                  # the decoder's: never read
            spec = dataclasses.replace(spec, unread=spec.unread + tuple(f"blk.{i}." for i in range(n, n + int(nextn))))
        def make_tokenizer():
            return Tokenizer.from_dir(resolved.root)
        # The q/k row order is the converter's, chosen by architecture (InternLM3 goes through llama's).
        from ..families import FAMILIES_BY_GGUF_ARCH

        family = FAMILIES_BY_GGUF_ARCH[arch]
    if check is not None:
        check(resolved, spec)
    qk = (spec.num_attention_heads, spec.num_key_value_heads) if family.gguf_qk_permuted else None
    # (layers with their own counts, DeciLM's: the converter reorders each by its own)
    own = ({i: spec.attention_shape(i)[:2] for i in range(spec.num_hidden_layers) if spec.layers[i].stored is None}
           if qk is not None else {})
    weights = GGUFWeights(gguf, precision, qk_heads=qk, qk_layers={i: c for i, c in own.items() if c != qk})
    decoder = Decoder(spec, weights)
    # The tokenizer last: the quantized matrices' interleaved copies (qmatmul.QMatrix) are made
    # on another thread meanwhile, while building it holds Python's lock on this one.
    return LoadedModel(resolved, spec, decoder, make_tokenizer(), precision)
