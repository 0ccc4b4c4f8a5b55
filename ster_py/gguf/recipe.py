"""Which GGML type each tensor of a GGUF file gets, as llama.cpp decides it.

Two of llama.cpp's tools decide types, and ``ster convert`` follows each where it applies:

- its converter (``convert_hf_to_gguf.py``, ``ModelBase.prepare_tensors``) writes F32, F16 or BF16
  files: 1-D tensors, norms, expert routers (``ffn_gate_inp``, ``ffn_gate_inp_shexp``) and learned
  positions (``position_embd``) stay F32, every other weight takes the file's type;
- its quantizer (``src/llama-quant.cpp``: ``tensor_allows_quantization``, ``llama_tensor_get_type``,
  ``tensor_type_fallback``) writes the block types: only 2-D and 3-D ``*weight`` tensors other than
  norms, routers and learned positions are quantized; a file type's mix then moves some tensors to
  other types (``Q4_K_M``: the output, and the token embedding when it doubles as the output, to
  Q6_K; ``attn_v`` / ``attn_qkv`` and ``ffn_down`` of the layers ``use_more_bits`` picks to Q6_K;
  eight-expert models' ``attn_v`` and ``attn_k`` to Q8_0; ...); a row that does not fit a type's
  blocks falls back (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, else F16).

The quantizer counts ``attn_v``-like tensors and ``ffn_down`` tensors in the order its loader
sorts them (by layer number, then by name), and takes a dense model's ``ffn_down`` layer from that
count; ``choose_types`` sorts the same way.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..errors import SterError
from .quantize import fallback_type


@dataclass(frozen=True)
class FileType:
    """One ``--type``: the base GGML type, llama.cpp's ``general.file_type`` number (``llama_ftype``),
    and whether llama.cpp's mix rules apply (``pure``: every quantizable tensor takes the base type,
    as ``llama-quantize --pure`` does)."""

    name: str
    base: str
    ftype: int
    pure: bool = False

    @property
    def quantized(self) -> bool:
        return self.base not in ("F32", "F16", "BF16")


FILE_TYPES: dict[str, FileType] = {t.name: t for t in (
    FileType("f32", "F32", 0), FileType("f16", "F16", 1), FileType("bf16", "BF16", 32),
    FileType("q8_0", "Q8_0", 7), FileType("q4_0", "Q4_0", 2), FileType("q4_1", "Q4_1", 3),
    FileType("q5_0", "Q5_0", 8), FileType("q5_1", "Q5_1", 9),
    FileType("q4_k", "Q4_K", 14, pure=True), FileType("q5_k", "Q5_K", 16, pure=True), FileType("q6_k", "Q6_K", 18),
    FileType("q4_k_m", "Q4_K", 15), FileType("q5_k_m", "Q5_K", 17),
)}


def close_file_types(name: str) -> list[str]:
    """The ``--type`` names a mistyped ``name`` most likely meant (at most two; empty when none is close):
    the one equal to it once ``_``/``-`` are dropped (``q4km`` -> ``q4_k_m``), else difflib's closest."""
    import difflib

    key = str(name).lower()
    bare = {n.replace("_", ""): n for n in FILE_TYPES}
    if key.replace("_", "").replace("-", "") in bare:
        return [bare[key.replace("_", "").replace("-", "")]]
    return difflib.get_close_matches(key, list(FILE_TYPES), n=2, cutoff=0.6)


def file_type(name: str) -> FileType:
    """The ``FileType`` of a ``--type`` name (any case).

    Raises:
        SterError: an unknown name; the message lists the names and a close one ("did you mean q4_k_m?").
    """
    t = FILE_TYPES.get(str(name).lower())
    if t is None:
        near = close_file_types(name)
        hint = f"; did you mean {' or '.join(near)}?" if near else ""
        raise SterError(f"unknown --type {name!r}; use one of {', '.join(FILE_TYPES)}{hint}")
    return t


# Tensors the converter always writes as F32 (besides 1-D tensors and norms).
_F32_ALWAYS = re.compile(r"(^|\.)(ffn_gate_inp|ffn_gate_inp_shexp)\.weight$|^position_embd\.weight$|"
                         r"^token_types\.weight$")


def converter_keeps_f32(name: str, n_dims: int) -> bool:
    """llama.cpp's converter writes this tensor as F32 whatever the file type."""
    return n_dims <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight") or bool(_F32_ALWAYS.search(name))


def quantizer_allows(name: str, n_dims: int) -> bool:
    """llama.cpp's quantizer may change this tensor's type (``tensor_allows_quantization`` for the
    tensors of the architectures ster writes)."""
    return (n_dims >= 2 and name.endswith("weight") and "_norm.weight" not in name
            and "ffn_gate_inp.weight" not in name and name not in ("position_embd.weight", "token_types.weight"))


def _category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name == "token_embd.weight":
        return "token_embd"
    for key, cat in (("attn_qkv.weight", "attn_v"), ("attn_kv_b.weight", "attn_v"), ("attn_v.weight", "attn_v"),
                     ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"),
                     ("attn_output.weight", "attn_output"), ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"),
                     ("ffn_down", "ffn_down")):
        if key in name:
            return cat
    return "other"


def _layer_of(name: str) -> int:
    m = re.match(r"blk\.(\d+)\.", name)
    return int(m.group(1)) if m else -1


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of layers that get more bits in the _M mixes: the first and last eighth,
    and every third layer between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


@dataclass(frozen=True)
class ModelFacts:
    """What llama.cpp's mix rules read about the model: architecture, layer count, expert count,
    attention heads and key/value heads."""

    arch: str
    n_layers: int
    n_expert: int = 0
    n_head: int = 1
    n_head_kv: int = 1


def choose_types(tensors: Sequence[tuple[str, tuple[int, ...]]], ftype: FileType, facts: ModelFacts,
                 source_types: Mapping[str, str] | None = None) -> dict[str, str]:
    """The GGML type of every tensor of a file of type ``ftype``.

    Args:
        tensors: (GGUF name, numpy shape) of every tensor to write.
        ftype: the file type.
        facts: the model facts the mixes read.
        source_types: when re-quantizing a GGUF, each tensor's type there: tensors the quantizer
            does not touch keep it (from a checkpoint they are F32, as the converter writes them).

    Returns:
        name -> type name.
    """
    out: dict[str, str] = {}
    if not ftype.quantized:
        for name, shape in tensors:
            if source_types is not None:
                out[name] = ftype.base if quantizer_allows(name, len(shape)) else source_types[name]
            else:
                out[name] = "F32" if converter_keeps_f32(name, len(shape)) else ftype.base
        return out
    tied = not any(name == "output.weight" for name, _ in tensors)
    n_attn_v = sum(1 for name, _ in tensors if _category(name) == "attn_v")
    counts = {"attn_v": 0, "ffn_down": 0}
    order = sorted(tensors, key=lambda t: (_layer_of(t[0]), t[0]))  # llama.cpp's loader order
    for name, shape in order:
        if not quantizer_allows(name, len(shape)):
            out[name] = source_types[name] if source_types is not None else "F32"
            continue
        new = ftype.base
        if not ftype.pure:
            new = _mix(name, shape, new, ftype, facts, tied, n_attn_v, counts)
        out[name] = fallback_type(new, int(shape[-1]))
    return out


def _mix(name: str, shape: tuple[int, ...], new: str, ftype: FileType, facts: ModelFacts, tied: bool,
         n_attn_v: int, counts: dict) -> str:
    """``llama_tensor_get_type_impl`` for the file types ster writes (Q4_0 ... Q8_0, Q6_K, Q4_K_M, Q5_K_M)."""
    cat = _category(name)
    falcon = facts.arch == "falcon"
    eight = facts.n_expert == 8
    if cat == "output" or (tied and cat == "token_embd"):
        from .quants import ggml_type

        if falcon or shape[-1] % ggml_type(new).block_size:
            return "Q8_0"
        return new if new == "Q8_0" else "Q6_K"
    if cat == "attn_v":
        i = counts["attn_v"]
        counts["attn_v"] += 1
        if ftype.name in ("q4_k_m", "q5_k_m") and use_more_bits(i, n_attn_v):
            new = "Q6_K"
        # llama.cpp's 70B Llama shares each attn_v among 8 heads: Q4_K becomes Q5_K there.
        if (facts.arch == "llama" and facts.n_layers == 80 and facts.n_head != facts.n_head_kv
                and new in ("Q3_K", "Q4_K")):
            new = "Q5_K"
        return "Q8_0" if eight else new
    if cat == "attn_k":
        return "Q8_0" if eight else new
    if cat == "ffn_down":
        i_count = counts["ffn_down"]
        counts["ffn_down"] += 1
        layer = _layer_of(name) if facts.n_expert > 1 else i_count
        n = facts.n_layers
        if ftype.name == "q4_k_m":
            if falcon:
                return "Q6_K" if layer < n // 16 else ("Q5_K" if use_more_bits(layer, n) else "Q4_K")
            return "Q6_K" if use_more_bits(layer, n) else new
        if ftype.name == "q5_k_m" and use_more_bits(layer, n):
            return "Q6_K"
        return new
    if cat == "attn_output" and not falcon and eight and ftype.name == "q4_k_m":
        return "Q5_K"
    return new
