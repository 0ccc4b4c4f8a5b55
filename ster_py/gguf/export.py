"""What a GGUF file says about a checkpoint: its architecture metadata and its tokenizer.

``architecture_metadata`` writes the ``{arch}.*`` keys llama.cpp's converter writes for an
architecture (``convert_hf_to_gguf.py``: ``TextModel.set_gguf_parameters`` and each model
class's additions), from the checkpoint's normalised ``ModelSpec`` and its config.json:
sizes, head counts and widths, the rotation (base, scaling, rotated width; Llama 3's band-wise
scaling as the ``rope_freqs`` tensor), norm epsilon, sliding windows (a per-layer pattern where
llama.cpp reads one), soft-caps, the family's scales (the keys ``FamilySpec.gguf_config`` names,
written back from the config keys they stand for) and expert counts.

``read_back_differences`` then reads those keys back exactly as ``ster`` reads a GGUF file
(``gguf/config.py``, which follows llama.cpp's loader, including what llama.cpp fixes in code:
Gemma 2's alternating windows, Phi-3 without a window, ...) and lists every way the model a
GGUF runtime would build differs from the checkpoint's, so a conversion says so instead of
writing a different model silently.

``tokenizer_metadata`` writes ``tokenizer.ggml.*`` from tokenizer.json: byte-level BPE as
``gpt2`` (tokens, merges, token types, and the ``pre`` name whose splitting reproduces the
checkpoint's tokenization on a probe text), SentencePiece-style BPE (``▁`` for spaces, byte
fallback) as ``llama`` (scores ranking the merges), special ids and BOS/EOS flags as the
checkpoint's tokenizer behaves, and the chat template.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..config import ModelSpec, _Reader, _fixed_alpha, _rope_params
from ..errors import SterError
from ..families import FAMILIES_BY_GGUF_ARCH, FamilySpec
from .writer import Typed

# llama_token_type (gguf-py TokenType).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Architectures whose llama.cpp loader reads a per-layer sliding-window pattern from the file
# (their converter writes it); the others place windows by a rule fixed in code.
PATTERN_ARCHS = frozenset({"olmo2", "exaone4"})

# Rope types a GGUF file can state (llama3 through the rope_freqs tensor; HunYuan's "dynamic" with
# alpha is a fixed base).
_ROPE_SCALING = {"default": None, "linear": "linear", "yarn": "yarn", "llama3": None}


def _f32(x: float) -> float:
    return float(np.float32(x))


def rope_metadata(config: Mapping, family: FamilySpec, spec: ModelSpec, where: str) -> tuple[dict, np.ndarray | None]:
    """The rotation keys (after ``{arch}.``) and the optional ``rope_freqs`` tensor (float32 [rotary_dim / 2]).

    Raises:
        SterError: a rotation GGUF cannot state (dynamic NTK, LongRoPE, per-layer bases).
    """
    rotary = next((layer.rope for layer in spec.layers if layer.rope is not None), None)
    if spec.positions != "rope" or rotary is None:
        return {}, None
    cfg = {**family.config_defaults, **config}
    if family.normalize is not None:
        cfg = family.normalize(cfg)
    fam = family.for_config(cfg)
    full, sliding = _rope_params(cfg, _Reader(cfg, fam, where))
    if fam.local_rope_key and cfg.get(fam.local_rope_key) is not None:
        sliding = {"rope_type": "default", "rope_theta": cfg[fam.local_rope_key]}
    full = _fixed_alpha(full, spec.head_dim)
    kind = full.get("rope_type", full.get("type", "default")) or "default"
    if kind not in _ROPE_SCALING:
        raise SterError(f"{where}: rotation scaling {kind!r} cannot be written to GGUF (llama.cpp states "
                        "linear, yarn and Llama 3 scaling); ster convert refuses this model")
    meta: dict[str, Any] = {"rope.dimension_count": int(rotary.rotary_dim),
                            "rope.freq_base": _f32(full.get("rope_theta", 10000.0))}
    if sliding is not None and any(layer.sliding_window for layer in spec.layers):
        meta["rope.freq_base_swa"] = _f32(sliding.get("rope_theta", full.get("rope_theta", 10000.0)))
    scaling = _ROPE_SCALING[kind]
    if scaling is not None:
        meta["rope.scaling.type"] = scaling
        meta["rope.scaling.factor"] = _f32(full["factor"])
        if scaling == "yarn":
            meta["rope.scaling.original_context_length"] = int(full.get("original_max_position_embeddings")
                                                               or spec.max_position_embeddings)
            for key, gkey in (("extrapolation_factor", "rope.scaling.yarn_ext_factor"),
                              ("attention_factor", "rope.scaling.yarn_attn_factor"),
                              ("beta_fast", "rope.scaling.yarn_beta_fast"), ("beta_slow", "rope.scaling.yarn_beta_slow")):
                if full.get(key) is not None:
                    meta[gkey] = _f32(full[key])
    freqs = None
    if kind == "llama3":
        base = float(full.get("rope_theta", 10000.0))
        dim = rotary.rotary_dim
        default = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
        freqs = (default / rotary.inv_freq).astype(np.float32)  # llama.cpp divides each frequency by these
    return meta, freqs


def architecture_metadata(config: Mapping, family: FamilySpec, spec: ModelSpec, where: str
                          ) -> tuple[dict[str, Any], np.ndarray | None]:
    """``{arch}.*`` metadata of a checkpoint (keys with the architecture prefix) and its optional
    ``rope_freqs`` tensor.

    Args:
        config: the checkpoint's config.json (after ``families.unwrap``).
        family: its ``FamilySpec``; ``family.gguf_arch`` names the architecture.
        spec: the normalised ``ModelSpec`` of the checkpoint.
        where: the config's path, for messages.

    Raises:
        SterError: a family without a llama.cpp architecture, or a feature GGUF cannot state.
    """
    arch = family.gguf_arch
    if not arch:
        raise SterError(f"{where}: llama.cpp has no GGUF architecture for model_type {spec.model_type!r}, so ster "
                        "cannot write one; GGUF architectures ster writes: "
                        f"{', '.join(sorted(FAMILIES_BY_GGUF_ARCH))}")
    meta: dict[str, Any] = {
        "context_length": int(spec.max_position_embeddings),
        "embedding_length": int(spec.hidden_size),
        "block_count": int(spec.num_hidden_layers),
        "feed_forward_length": int(spec.intermediate_size),
        "attention.head_count": int(spec.num_attention_heads),
        "attention.head_count_kv": int(spec.num_key_value_heads),
        "attention.key_length": int(spec.head_dim),
        "attention.value_length": int(spec.head_dim),
        "vocab_size": int(spec.vocab_size),
    }
    eps_key = "attention.layer_norm_rms_epsilon" if spec.norm == "rms" else "attention.layer_norm_epsilon"
    meta[eps_key] = _f32(spec.norm_eps)
    rope, freqs = rope_metadata(config, family, spec, where)
    meta.update(rope)
    windows = {layer.sliding_window for layer in spec.layers if layer.sliding_window}
    if windows:
        if len(windows) > 1:
            raise SterError(f"{where}: sliding windows of several sizes ({sorted(windows)}) have no GGUF form")
        meta["attention.sliding_window"] = int(windows.pop())
        if arch in PATTERN_ARCHS:
            meta["attention.sliding_window_pattern"] = [bool(layer.sliding_window) for layer in spec.layers]
    if spec.attn_softcap is not None:
        meta["attn_logit_softcapping"] = _f32(spec.attn_softcap)
    if spec.final_softcap is not None:
        meta["final_logit_softcapping"] = _f32(spec.final_softcap)
    if spec.moe is not None:
        m = spec.moe
        meta["expert_count"] = int(m.router.num_experts)
        meta["expert_used_count"] = int(m.router.top_k)
        meta["expert_feed_forward_length"] = int(m.expert_size)
        if m.shared_size:
            meta["expert_shared_feed_forward_length"] = int(m.shared_size)
    cfg = {**family.config_defaults, **config}
    for gkey, ckey in family.for_config(cfg).gguf_config.items():
        value = cfg.get(ckey)
        if value is None and isinstance(cfg.get("attn_config"), Mapping):  # MPT keeps them in attn_config
            value = cfg["attn_config"].get(ckey)
        if value is None and (arch, gkey) == ("mpt", "attention.max_alibi_bias"):
            value = 8.0  # MPT's default (the gate refuses any other)
        if value is not None:
            meta[gkey] = bool(value) if isinstance(value, bool) else _f32(value)
    for key, value in _ARCH_EXTRAS.get(arch, lambda c, s: {})(cfg, spec).items():
        meta.setdefault(key, value)
    return {f"{arch}.{k}": v for k, v in meta.items()}, freqs


# Keys llama.cpp's converter adds for an architecture beyond the ones above (informational for its
# loader, or its defaults stated): kept so a file reads as the converter's would.
_ARCH_EXTRAS = {
    "phi3": lambda c, s: {"rope.scaling.original_context_length": int(c.get("original_max_position_embeddings")
                                                                      or s.max_position_embeddings),
                          "attention.sliding_window": int(c.get("sliding_window") or 0)},
    "command-r": lambda c, s: {"rope.scaling.type": "none"},
    "cohere2": lambda c, s: {"rope.scaling.type": "none"},
    "nemotron": lambda c, s: {"rope.scaling.type": "none", "attention.layer_norm_rms_epsilon": _f32(s.norm_eps)},
    "exaone": lambda c, s: {"attention.layer_norm_epsilon": _f32(s.norm_eps)},
    "falcon": lambda c, s: {"tensor_data_layout": "jploski"},
}


# ----------------------------------------------------------------------------- read back

def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(float(a), float(b), rel_tol=2e-7, abs_tol=0.0) or (math.isinf(a) and a == b)


def _rope_differs(a, b) -> str | None:
    if (a is None) != (b is None):
        return "no rotation" if b is None else "rotation"
    if a is None:
        return None
    if a.rotary_dim != b.rotary_dim or a.interleaved != b.interleaved:
        return f"rotated width {b.rotary_dim}{' interleaved' if b.interleaved else ''}"
    if (a.dynamic is None) != (b.dynamic is None) or (a.long_inv_freq is None) != (b.long_inv_freq is None):
        return "a scaling that changes with the length"
    if not np.allclose(a.inv_freq, b.inv_freq, rtol=1e-6, atol=0) or not _close(a.attention_factor, b.attention_factor):
        return "other rotation frequencies"
    return None


_SCALARS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "norm", "hidden_act", "tie_word_embeddings", "qk_norm",
            "qk_norm_after_rope", "norm_affine", "parallel", "embed_norm", "positions", "position_offset",
            "sinks", "attn_gate", "value_scale")
_FLOATS = ("norm_eps", "embed_scale", "attn_scale", "attn_softcap", "final_softcap", "residual_scale", "logit_scale",
           "clip_qkv", "alibi_scale")


def read_back_differences(spec: ModelSpec, meta: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]],
                          rope_freqs: np.ndarray | None, where: str) -> list[str]:
    """How the model a GGUF runtime builds from ``meta`` differs from ``spec`` (empty: none).

    ``meta`` is read back by ``gguf.config.spec_from_gguf`` (ster's reader, which follows
    llama.cpp's loader), with the tensors' shapes, and every field the decoder uses is compared:
    sizes, norms, activation, scales (to float32 precision), soft-caps, each layer's window,
    rotation and feed-forward kind, and the router.
    """
    from .config import spec_from_gguf

    plain = {k: (v.value if isinstance(v, Typed) else v) for k, v in meta.items()}
    back = spec_from_gguf(plain, where, rope_freqs=rope_freqs, vocab_size=spec.vocab_size,
                          has_output="output.weight" in tensors, tensors=tensors)
    if back.qk_norm_optional and not any(".attn_q_norm." in n for n in tensors):
        back = dataclasses.replace(back, qk_norm=None)  # read only when present, as llama.cpp does
    back_norms = set(back.norms)

    def stored(role: str) -> str | None:
        entry = back.names.get(role)
        for n in (entry,) if isinstance(entry, str) else tuple(entry or ()):
            if f"{n.format(i=0)}.weight" in tensors:
                return n
        return None

    if {"attn_norm", "ffn_norm"} <= back_norms and stored("attn_norm") is not None and \
            stored("attn_norm") == stored("ffn_norm"):
        back_norms.discard("ffn_norm")  # one norm read by both sublayers (Falcon's single-norm block)
    out = []
    for f in _SCALARS:
        a, b = getattr(spec, f), getattr(back, f)
        if a != b:
            out.append(f"{f}: the checkpoint has {a!r}, the GGUF {b!r}")
    if set(spec.norms) != back_norms:
        out.append(f"norms: the checkpoint has {sorted(spec.norms)}, the GGUF {sorted(back_norms)}")
    for f in _FLOATS:
        a, b = getattr(spec, f), getattr(back, f)
        if not _close(a, b):
            out.append(f"{f}: the checkpoint has {a!r}, the GGUF {b!r}")
    if (spec.alibi_slopes is None) != (back.alibi_slopes is None) or (
            spec.alibi_slopes is not None and not np.allclose(spec.alibi_slopes, back.alibi_slopes, rtol=1e-6)):
        out.append("ALiBi slopes differ")
    if (spec.moe is None) != (back.moe is None):
        out.append("routed experts: " + ("absent from the GGUF" if back.moe is None else "only in the GGUF"))
    elif spec.moe is not None:
        for f in ("expert_size", "shared_size", "shared_gated", "act", "glu"):
            if getattr(spec.moe, f) != getattr(back.moe, f):
                out.append(f"experts' {f}: the checkpoint has {getattr(spec.moe, f)!r}, the GGUF "
                           f"{getattr(back.moe, f)!r}")
        for f in ("num_experts", "top_k", "scoring", "select_bias", "n_group", "topk_group", "renormalize",
                  "on_input"):
            if getattr(spec.moe.router, f) != getattr(back.moe.router, f):
                out.append(f"router {f}: the checkpoint has {getattr(spec.moe.router, f)!r}, the GGUF "
                           f"{getattr(back.moe.router, f)!r}")
        if not _close(spec.moe.router.scale, back.moe.router.scale):
            out.append(f"router scale: the checkpoint has {spec.moe.router.scale}, the GGUF {back.moe.router.scale}")
    layer_notes: dict[str, list[int]] = {}
    for i, (a, b) in enumerate(zip(spec.layers, back.layers)):
        notes = []
        if a.sliding_window != b.sliding_window:
            notes.append(f"sliding window {b.sliding_window or 'none'} (the checkpoint: {a.sliding_window or 'none'})")
        why = _rope_differs(a.rope, b.rope)
        if why:
            notes.append(why)
        if a.ffn != b.ffn:
            notes.append(f"a {b.ffn} feed-forward (the checkpoint: {a.ffn})")
        for n in notes:
            layer_notes.setdefault(n, []).append(i)
    for note, layers in layer_notes.items():
        shown = ", ".join(map(str, layers[:8])) + (" ..." if len(layers) > 8 else "")
        out.append(f"layers {shown}: {note}")
    return out


# ----------------------------------------------------------------------------- tokenizer

# A probe for the pre-tokenizer: whitespace runs, digits of every length, contractions in both cases,
# punctuation runs, accents, CJK, emoji joiners and newlines.
PROBE_TEXT = ("Hello world!  It's 12 o'clock; I'VE 3 cats, 33 dogs and 1234567 ants.\n\n\tTabs\t\tand\n"
              "   spaces    here...   ??!! --==  ``quotes'' \"dq\" don't WON'T we'll\n"
              "naïve café déjà-vu Ærøskøbing ßtraße 東京都で3日 한국어 тест мир 😀👍🏽 👨‍👩‍👧 ∑x² √2 3.14159 "
              "0x1F $100.00 50% a/b\\c https://example.com/a?b=c#d <tag>  \r\n end")


def _tokenizer_json(root: Path) -> dict:
    path = root / "tokenizer.json"
    if not path.is_file() and (root / "tekken.json").is_file():  # Mistral's own format: its tekken.json as BPE
        from ..tiktoken_bpe import from_tekken

        return json.loads(from_tekken(root / "tekken.json").to_str())
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SterError(f"cannot read {path}: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
        raise SterError(f"{path} is not a tokenizer.json (no model object)")
    return doc


def _walk_types(node: Any) -> list[dict]:
    """Every component object of a normalizer / pre-tokenizer / decoder tree."""
    out: list[dict] = []
    if isinstance(node, dict):
        if "type" in node:
            out.append(node)
        for v in node.values():
            if isinstance(v, (dict, list)):
                out += _walk_types(v)
    elif isinstance(node, list):
        for v in node:
            out += _walk_types(v)
    return out


def _merges(model: dict) -> list[str]:
    out = []
    for m in model.get("merges") or []:
        if isinstance(m, str):
            out.append(m)
        elif isinstance(m, (list, tuple)) and len(m) == 2:
            out.append(f"{m[0]} {m[1]}")
        else:
            raise SterError(f"tokenizer.json holds a merge {m!r} that is neither 'a b' nor [a, b]")
    return out


def _looks_special(text: str) -> bool:
    """Added tokens llama.cpp's converter marks as control even when not flagged special."""
    return (text in ("<pad>", "<mask>") or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<unused") and text.endswith(">")))


def tokenizer_metadata(root: str | Path, vocab_size: int, config: Mapping | None = None
                       ) -> tuple[dict[str, Any], list[str]]:
    """``tokenizer.*`` metadata of a checkpoint's tokenizer, and notes on what could not be kept.

    Args:
        root: the checkpoint directory (tokenizer.json, tokenizer_config.json, chat templates).
        vocab_size: rows of the model's embedding; ids the tokenizer lacks become ``[PADi]`` tokens
            of type unused, as llama.cpp's converter writes them.
        config: the config.json (special ids it states are used when the tokenizer names none).

    Returns:
        (metadata, notes): notes say where the GGUF tokenizer and tokenizer.json disagree on the
        probe text (empty when they agree).

    Raises:
        SterError: a tokenizer model GGUF cannot express here (WordPiece, Unigram, word-level),
            a vocabulary larger than the model's, a malformed tokenizer.json.
    """
    from ..tokenizer import Tokenizer
    from .tokenizer import PRE_TOKENIZERS, tokenizer_from_gguf_metadata

    root = Path(root)
    # The tokenizers library reads the file first: what it refuses (ids that are not whole numbers, an added
    # token without an id, a vocabulary that is a list, nesting past its limit) is one error, where the
    # walk below met it as a ValueError, KeyError, AttributeError or RecursionError traceback.
    hf = Tokenizer.from_dir(root)
    doc = _tokenizer_json(root)
    model = doc["model"]
    if model.get("type") != "BPE":
        raise SterError(f"{root / 'tokenizer.json'}: a {model.get('type')} tokenizer cannot be written as a GGUF "
                        "vocabulary by ster (it writes byte-level BPE and SentencePiece-style BPE); convert the "
                        "model with llama.cpp's convert_hf_to_gguf.py")
    vocab = model.get("vocab") or {}
    added = [a for a in doc.get("added_tokens") or [] if isinstance(a, dict)]
    ids = [int(i) for i in vocab.values()] + [int(a["id"]) for a in added]
    n = max([vocab_size] + [i + 1 for i in ids])
    if n > vocab_size:
        raise SterError(f"{root / 'tokenizer.json'} has ids up to {n - 1}, but the model's vocabulary is {vocab_size}; "
                        "the tokenizer is not from this checkpoint")
    tokens: list[str | None] = [None] * n
    types = [UNUSED] * n
    for text, i in vocab.items():
        tokens[int(i)] = text
        types[int(i)] = NORMAL
    components = _walk_types([doc.get("normalizer"), doc.get("pre_tokenizer"), doc.get("decoder")])
    kinds = {c.get("type") for c in components}
    byte_level = "ByteLevel" in kinds
    spm = not byte_level and (bool(model.get("byte_fallback")) or "Metaspace" in kinds or any(
        c.get("type") == "Replace" and c.get("content") in ("\u2581", " ") for c in components))
    if not byte_level and not spm:
        raise SterError(f"{root / 'tokenizer.json'}: a BPE tokenizer that is neither byte-level nor SentencePiece-"
                        "style cannot be written as a GGUF vocabulary by ster")
    for a in added:
        i, text = int(a["id"]), str(a.get("content", ""))
        tokens[i] = text
        types[i] = CONTROL if a.get("special") or _looks_special(text) else USER_DEFINED
    if spm:
        for i, text in enumerate(tokens):
            if text is not None and types[i] == NORMAL and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
                types[i] = BYTE
    for i, text in enumerate(tokens):
        if text is None:
            tokens[i] = f"[PAD{i}]"
    meta: dict[str, Any] = {}
    merges = _merges(model)
    if byte_level:
        meta["tokenizer.ggml.model"] = "gpt2"
        meta["tokenizer.ggml.pre"] = "default"
        meta["tokenizer.ggml.tokens"] = tokens
        meta["tokenizer.ggml.token_type"] = Typed("array of int32", np.asarray(types, np.int32))
        meta["tokenizer.ggml.merges"] = merges
    else:
        index = {t: i for i, t in enumerate(tokens)}
        scores = np.zeros(n, np.float32)
        seen = set()
        for rank, m in enumerate(merges):
            left, _, right = m.partition(" ")
            made = index.get(left + right)
            if made is not None and made not in seen:
                seen.add(made)
                scores[made] = -float(rank)  # llama.cpp merges the pair whose token scores highest
        meta["tokenizer.ggml.model"] = "llama"
        meta["tokenizer.ggml.pre"] = "default"
        meta["tokenizer.ggml.tokens"] = tokens
        meta["tokenizer.ggml.scores"] = Typed("array of float32", scores)
        meta["tokenizer.ggml.token_type"] = Typed("array of int32", np.asarray(types, np.int32))
        prepends = any(c.get("type") == "Prepend" for c in components) or any(
            c.get("type") == "Metaspace" and c.get("prepend_scheme", "always") != "never"
            and c.get("add_prefix_space", True) for c in components)
        meta["tokenizer.ggml.add_space_prefix"] = bool(prepends)

    special = dict(hf.special_tokens, bos_token=hf.bos_token, eos_token=hf.eos_token)
    cfg = dict(config or {})

    def token_id(name: str, config_key: str) -> int | None:
        text = special.get(name)
        if text is not None and hf.token_to_id(text) is not None:
            return int(hf.token_to_id(text))
        v = cfg.get(config_key)
        v = v[0] if isinstance(v, list) and v else v
        return int(v) if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n else None

    for name, config_key, key in (("bos_token", "bos_token_id", "bos_token_id"),
                                  ("eos_token", "eos_token_id", "eos_token_id"),
                                  ("unk_token", "unk_token_id", "unknown_token_id"),
                                  ("pad_token", "pad_token_id", "padding_token_id")):
        tid = token_id(name, config_key)
        if tid is None and name == "unk_token" and model.get("unk_token") in vocab:
            tid = int(vocab[model["unk_token"]])
        if tid is not None:
            meta[f"tokenizer.ggml.{key}"] = tid
    plain = hf.encode("a", add_special_tokens=False)
    full = hf.encode("a", add_special_tokens=True)
    bos, eos = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
    add_bos = bos is not None and full[:1] == [bos] and full[1:len(plain) + 1] == plain
    rest = full[1:] if add_bos else full
    meta["tokenizer.ggml.add_bos_token"] = bool(add_bos)
    meta["tokenizer.ggml.add_eos_token"] = bool(eos is not None and rest == plain + [eos])
    templates = hf.chat_templates
    if templates:
        default = templates.get("default")
        if default is not None:
            meta["tokenizer.chat_template"] = default
        for name, text in templates.items():
            if name != "default":
                meta[f"tokenizer.chat_template.{name}"] = text
        named = [k for k in templates if k != "default"]
        if named:
            meta["tokenizer.chat_templates"] = named

    # Which pre-tokenizer name (byte-level) reproduces tokenizer.json's splitting, judged on the probe.
    want = hf.encode(PROBE_TEXT, add_special_tokens=False)
    notes: list[str] = []
    candidates = ["gpt-2", "smollm", "llama-bpe", "qwen2", "default", "gpt-4o", "qwen35", "stablelm2"]
    if not (root / "tokenizer.json").is_file() and (root / "tekken.json").is_file():
        candidates.insert(0, "tekken")  # Mistral's tekken.json: llama.cpp's converter names its split so
    candidates = [c for c in candidates if c in PRE_TOKENIZERS] if byte_level else ["default"]
    best = None
    for name in candidates:
        trial = dict(meta, **{"tokenizer.ggml.pre": name})
        trial_plain = {k: (v.value if isinstance(v, Typed) else v) for k, v in trial.items()}
        got = tokenizer_from_gguf_metadata(trial_plain, for_generation=False).tokenizer.encode(
            PROBE_TEXT, add_special_tokens=False).ids
        wrong = sum(1 for a, b in zip(got, want) if a != b) + abs(len(got) - len(want))
        if best is None or wrong < best[1]:
            best = (name, wrong)
        if wrong == 0:
            break
    meta["tokenizer.ggml.pre"] = best[0]
    if best[1]:
        notes.append(f"the GGUF tokenizer ({meta['tokenizer.ggml.model']}, pre {best[0]!r}) splits a probe text "
                     f"differently from tokenizer.json ({best[1]} tokens differ)")
    return meta, notes
