"""``ster convert``: write a GGUF file llama.cpp runs, from any model ster runs.

From a checkpoint (a directory or Hub id of config.json + tokenizer.json + safetensors):

1. metadata: ``general.*``, the architecture's keys as llama.cpp's converter writes them and the
   tokenizer (``gguf/export.py``);
2. tensors under llama.cpp's names for the architecture (the family table's ``gguf_names``, as
   llama.cpp reads the architecture: ``gguf_changes``), in llama.cpp's layout: q/k rows permuted for
   adjacent-pair rotation where llama.cpp's converter does it (the inverse of
   ``weights.unpermute_qk``), fused q/k/v or gate/up kept fused where the checkpoint fuses them and
   llama.cpp reads them fused ([q | k | v] and [gate | up]), GPT-2's inputs-first weights transposed,
   per-head q/k norms stacked, norms kept as offsets from one (Gemma, Nemotron) stored as 1 + w,
   experts stacked [n_expert, rows, cols], Llama 3's rotation scaling as ``rope_freqs``;
3. each tensor's type from llama.cpp's rules for the file type (``gguf/recipe.py``), quantized by
   ster's own quantizers (``gguf/quantize.py``).

From a GGUF file (or a "GGUF directory"), the metadata and tensors are kept and each tensor llama.cpp's
quantizer would touch is re-quantized (a tensor already of its new type is copied as is).

The model is read back before anything is written: the metadata, read as ``ster`` reads a GGUF (which
follows llama.cpp's loader), must describe the checkpoint's model; where it cannot (a feature llama.cpp
fixes differently for the architecture) the report lists the difference. The file is written to a
temporary name beside ``output`` and renamed when complete.
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np

from .errors import SterError
from .gguf import quants
from .gguf.quantize import quantize
from .gguf.recipe import FileType, ModelFacts, choose_types, file_type
from .gguf.writer import DEFAULT_ALIGNMENT, TensorEntry, Typed, write_gguf

Progress = Callable[[str, int, "int | None"], None]

#: Per-layer roles written, in file order (experts come after the router).
LAYER_ROLES = ("attn_norm", "q", "k", "v", "qkv", "q_norm", "k_norm", "o", "attn_post_norm", "sinks", "ffn_norm",
               "gate", "up", "gate_up", "down", "router", "router_select_bias", "shexp_gate_inp", "shexp_gate",
               "shexp_up", "shexp_down", "ffn_post_norm")
GLOBAL_FIRST = ("embed", "pos_embed", "embed_norm")
GLOBAL_LAST = ("final_norm", "head")
NORM_ROLES = frozenset({"embed_norm", "final_norm", "attn_norm", "attn_post_norm", "ffn_norm", "ffn_post_norm",
                        "q_norm", "k_norm"})
#: Roles whose name in the table is the whole tensor name (no .weight / .bias appended).
WHOLE_NAMES = frozenset({"router_select_bias", "sinks"})


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's q/k row order for adjacent-pair rotation (``LlamaModel.permute``),
    the inverse of ``weights.unpermute_qk``: each head's rows (half, pair) become (pair, half).
    w: [n_head * head_dim, ...] -> same shape."""
    rows = w.shape[0]
    return np.ascontiguousarray(w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


@dataclasses.dataclass
class _Source:
    """One tensor to write: its GGUF name, numpy shape and a function making it (float32)."""

    name: str
    shape: tuple[int, ...]
    make: Callable[[], np.ndarray]


def _writer_names(gnames, present: Callable[[str], bool], fuse_qkv: bool, fuse_gate_up: bool) -> dict[str, str]:
    """role -> the one GGUF name it is written under. A role the table lists under several names
    (read: first found) is written under the last one that no single-named role takes (Falcon:
    ``attn_norm`` is ``attn_norm_2`` when ``ffn_norm`` writes ``attn_norm``, else ``attn_norm``)."""
    out: dict[str, str] = {}
    taken = {n for r, n in gnames.items() if isinstance(n, str) and present(r)}
    for role, n in gnames.items():
        if role in ("q", "k", "v") and fuse_qkv or role == "qkv" and not fuse_qkv:
            continue
        if role in ("gate", "up") and fuse_gate_up or role == "gate_up" and not fuse_gate_up:
            continue
        if isinstance(n, str):
            out[role] = n
        else:
            free = [x for x in n if x not in taken]
            out[role] = (free or list(n))[-1]
    return out


def checkpoint_sources(resolved, spec, family, config, progress: Progress | None = None) -> list[_Source]:
    """The tensors of a checkpoint under llama.cpp's names, in file order, each made on demand (float32
    numpy arrays in llama.cpp's layout; see the module docstring).

    Args:
        resolved: the ``resolve.Resolved`` checkpoint (its safetensors files are mapped, not read).
        spec: its ``ModelSpec`` (``config.spec_from_config``).
        family: its ``FamilySpec`` (``family.gguf_arch`` set).
        config: its config.json.
        progress: optional ``progress("read tensors", layers done, layers)``.

    Raises:
        SterError: a tensor the family needs is missing or has the wrong shape.
    """
    from .decoder.layout import Layout
    from .decoder.model import stored_head_differs
    from .families import FAMILIES_BY_GGUF_ARCH
    from .weights import SafetensorsWeights

    arch = family.gguf_arch
    gfam = dataclasses.replace(family.for_config(config), **family.gguf_changes)
    gnames = gfam.gguf_names
    hf_names = spec.names
    fuse_qkv = "qkv" in gnames and ("q" not in gnames or "qkv" in hf_names)
    fuse_gate_up = "gate_up" in gnames and ("gate" not in gnames or "gate_up" in hf_names)
    # llama.cpp's adjacent-pair rows: a source stored for the half-split rotation is permuted to them; one
    # already rotating adjacent pairs (Mistral's own format) is written as it is
    permuted = FAMILIES_BY_GGUF_ARCH[arch].gguf_qk_permuted and not family.for_config(config).rope_interleaved
    weights = SafetensorsWeights(resolved.weight_files, "f32")
    layout = Layout(spec, weights)
    offset = spec.norm_unit_offset

    def read(role: str, i: int | None, kind: str) -> np.ndarray | None:
        t = layout.get(role, i, kind)  # a role the checkpoint fuses comes split, as the decoder reads it
        if t is None:
            return None
        t = np.asarray(t, dtype=np.float32)
        if offset and role in NORM_ROLES and kind == "weight":
            t = t + np.float32(1.0)
        if permuted and role in ("q", "k"):
            t = permute_qk(t, spec.attention_shape(i)[0 if role == "q" else 1])
        return t

    def fetch(role: str, i: int | None, kind: str) -> np.ndarray | None:
        if role in ("qkv", "gate_up"):
            parts = [read(r, i, kind) for r in (("q", "k", "v") if role == "qkv" else ("gate", "up"))]
            return None if any(p is None for p in parts) else np.concatenate(parts, axis=0)
        return read(role, i, kind)

    names = _writer_names(gnames, lambda r: layout.get(r, 0, "weight") is not None if r not in WHOLE_NAMES
                          and not r.startswith("exp_") else False, fuse_qkv, fuse_gate_up)
    sources: list[_Source] = []

    def used(role: str) -> bool:
        """A norm or q/k norm the checkpoint's decoder reads (a role may share another's stored name)."""
        if role in ("attn_norm", "attn_post_norm", "ffn_norm", "ffn_post_norm"):
            return role in spec.norms
        if role in ("q_norm", "k_norm"):
            return spec.qk_norm is not None
        if role == "embed_norm":
            return spec.embed_norm
        return True

    def add(role: str, i: int | None) -> None:
        if role not in names or not used(role):
            return
        base = names[role].format(i=i)
        kinds = ("",) if role in WHOLE_NAMES else ("weight", "bias")
        for kind in kinds:
            t = fetch(role, i, kind)  # made once here for its presence and shape, again when written
            if t is None:
                continue
            name = base if not kind else f"{base}.{kind}"
            sources.append(_Source(name, tuple(int(d) for d in t.shape),
                                   lambda role=role, i=i, kind=kind: fetch(role, i, kind)))

    for role in GLOBAL_FIRST:
        add(role, None)
    for i in range(spec.num_hidden_layers):
        for role in LAYER_ROLES:
            add(role, i)
        if spec.layers[i].ffn == "moe":
            sources += _expert_sources(layout, gnames, i)
        if progress:
            progress("read tensors", i + 1, spec.num_hidden_layers)
    for role in GLOBAL_LAST:
        if role == "head" and spec.tie_word_embeddings and not stored_head_differs(fetch("head", None, "weight"),
                                                                                 fetch("embed", None, "weight")):
            continue
        add(role, None)
    return sources


def _expert_sources(layout, gnames, i: int) -> list[_Source]:
    """A routed layer's experts stacked [n_expert, rows, cols] (and biases [n_expert, rows]), made on demand."""
    out = []
    first = layout.experts(i)
    for k, role in enumerate(("exp_gate", "exp_up", "exp_down")):
        for key, j in ((role, 0), (f"{role}_bias", 1)):
            if key not in gnames or first[0][k][j] is None:
                continue
            shape = (len(first), *np.shape(first[0][k][j]))
            out.append(_Source(gnames[key].format(i=i), tuple(int(d) for d in shape),
                               lambda k=k, j=j: np.stack([np.asarray(e[k][j], np.float32) for e in layout.experts(i)])))
    return out


#: What ``ster convert`` cannot write yet, by the mixer a layer uses, with the reason (the GGUF tensors and
#: metadata of these layers are not written, so no file llama.cpp runs could come out).
UNWRITTEN_MIXERS = {
    "latent": "multi-head latent attention (DeepSeek-V2/V3, MiniCPM3, GLM-4 Lite)",
    "mamba": "a Mamba state-space scan",
    "mamba2": "a Mamba-2 state-space scan",
    "hybrid": "attention beside a Mamba-2 state-space scan (Falcon-H1)",
    "none": "a layer without a token mixer (a state-space family's feed-forward-only layers)",
    "shortconv": "a gated short convolution (LFM2)",
    "lightning": "lightning attention (MiniMax-Text-01)",
    "shared_hybrid": "a Mamba-2 state-space scan beside shared transformer blocks (Zamba2)",
    "compressed": "compressed attention (DeepSeek-V4: compressors, Lightning Indexer, MXFP4 experts, an I32 hash "
                  "routing table)",
}


def _family_mixers(family) -> list[str]:
    """The mixers a family's layers may use, from the family alone (for a GGUF source, before its tensors)."""
    if family.latent:
        return ["latent"]
    if family.block_sparse:  # MiniMax Sparse Attention's layers (its leading dense ones attend plainly)
        return ["block_sparse"]
    if family.compressed:  # (group DS4) DeepSeek-V4's deepseek4
        return ["compressed"]
    return [family.recurrent] if family.recurrent else []


_ROUTING = ("the routing metadata its llama.cpp converter writes (gating function, expert weights' scale and "
            "normalisation, expert groups, shared-expert count, leading dense layers)")
#: Mixture-of-experts architectures whose GGUF form ``ster convert`` does not write yet, with what is missing
#: (checked against llama.cpp's converter on tiny checkpoints: these differ from it).
UNWRITTEN_ARCHS = {
    **{arch: _ROUTING for arch in ("glm4moe", "exaone-moe", "hy_v3", "bailingmoe2", "minimax-m2", "hunyuan-moe",
                                   "ernie4_5-moe", "cohere2moe")},
    "llama4": "the interleaved expert layers' step (interleave_moe_layer_step)",
    "afmoe": _ROUTING + " and its attention output gate",
    "granite_swa": "its per-layer sliding-window pattern and fused gate/up experts",
    "mellum": "its per-layer sliding-window pattern",
    "phimoe": "its LayerNorm epsilon and rotation keys as llama.cpp's converter writes them",
    **{arch: "per-layer head counts and windows" for arch in ("laguna", "mimo2", "step35")},
    # Families of remote-code checkpoints added after the converter's tests: refused until their files are
    # compared with llama.cpp's converter as the others are (tests/test_convert.py).
    **{arch: "a check of its metadata and tensors against llama.cpp's converter (not done yet)"
       for arch in ("minicpm", "orion", "internlm2", "deepseek", "bailingmoe", "pangu-embedded")},
    "gemma4": "per-layer head widths and rotations, shared key/value layers and per-layer inputs as llama.cpp's "
              "converter writes them",
    "nanbeige": "a check of its loop metadata against llama.cpp's converter (not done yet)",
    "hrm_text": "its two stacks as one range of blocks, the split attention gate and the stacks' cycle counts as "
                "llama.cpp's converter writes them",
    # group WRAP: read from llama.cpp's converter's files (tests/test_parity_wrapped.py), not written yet
    "muse-glimmer": "the query scale as q-norm weights, the NORM rotation's row order and the sliding pattern as "
                    "llama.cpp's converter writes them",
    # group g3n: Gemma 3n (its GGUF is read, tests/test_parity_gemma3n.py)
    "gemma3n": "AltUp's stacked projections, Laurel, activation sparsity and per-layer inputs as llama.cpp's "
               "converter writes them",
    # group gdp: read from llama.cpp's converter's files (tests/test_parity_remote_b_gguf.py), not written yet
    "deci": "per-layer head counts and feed-forward widths (0 for a block_configs half that is absent) as "
            "llama.cpp's converter writes them",
    "plamo3": "its norms with their offsets folded in, fused q/k/v and gate/up and suffix-less post-norm names as "
              "llama.cpp's converter writes them",
    # group DS4: DeepSeek-V4's GGUF is read (tests/test_parity_hc_gguf.py), not written
    "deepseek4": "its routed experts in MXFP4, the compressors, the hash routing table and the hyper-connections as "
                 "llama.cpp's converter writes them",
}


def _refuse_unwritten_arch(arch: str, what: str, where: str) -> None:
    """SterError when ``arch`` is one of ``UNWRITTEN_ARCHS`` (before any weight is read)."""
    if arch in UNWRITTEN_ARCHS:
        raise SterError(f"{where}: ster convert does not write {what} (GGUF architecture {arch!r}) yet: it lacks "
                        f"{UNWRITTEN_ARCHS[arch]}, so llama.cpp would not build the checkpoint's model. Convert this "
                        "model with llama.cpp's convert_hf_to_gguf.py (ster runs the resulting GGUF)")


def _refuse_unwritten(mixers, what: str, where: str) -> None:
    """SterError when any layer's mixer is one ``ster convert`` does not write (see ``UNWRITTEN_MIXERS``).

    Args:
        mixers: the layers' ``LayerSpec.mixer`` names (or a family's, for a GGUF source).
        what: the model's kind for the message (a model_type or GGUF architecture).
    """
    kinds = [m for m in dict.fromkeys(mixers) if m != "attention"]
    if kinds:
        reasons = "; ".join(UNWRITTEN_MIXERS.get(m, f"a {m!r} mixer") for m in kinds)
        raise SterError(f"{where}: ster convert does not write {what} yet: its layers use {reasons}, whose GGUF "
                        "tensors and metadata ster cannot write; only attention layers (dense or with routed "
                        "experts) are written. Convert this model with llama.cpp's convert_hf_to_gguf.py "
                        "(ster runs the resulting GGUF)")


def _facts_from_spec(arch: str, spec) -> ModelFacts:
    n_expert = spec.moe.router.num_experts if spec.moe is not None else 0
    return ModelFacts(arch, spec.num_hidden_layers, n_expert, spec.num_attention_heads, spec.num_key_value_heads)


def _general(name: str, arch: str, ft: FileType) -> dict:
    return {"general.architecture": arch, "general.type": "model", "general.name": name,
            "general.file_type": Typed("uint32", ft.ftype), "general.quantization_version": Typed("uint32", 2)}


def _model_name(resolved, config) -> str:
    """``general.name``: the last part of the config's ``_name_or_path`` (a Hub id or a directory), else the
    checkpoint directory's name."""
    name = config.get("_name_or_path") if isinstance(config, dict) else None
    if isinstance(name, str) and Path(name.strip()).name:
        return Path(name.strip()).name
    return Path(str(resolved.root)).name or str(resolved.model)


def convert_model(model: str, output: str | os.PathLike, type_name: str = "f16", *, revision: str | None = None,
                  alignment: int = DEFAULT_ALIGNMENT, threads: int | None = None,
                  progress: Progress | None = None) -> dict:
    """Write ``model`` as a GGUF file of type ``type_name`` at ``output``.

    Args:
        model: as for ``load_model``: a checkpoint directory, Hub id, preset, .gguf file or GGUF directory.
        output: the .gguf file to write (it must not exist).
        type_name: a ``recipe.FILE_TYPES`` name: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k,
            q5_k, q6_k, q4_k_m, q5_k_m.
        revision: Hub revision.
        alignment: data alignment of a file written from a checkpoint (a GGUF source keeps its own).
        threads: quantizer threads (None: every core).
        progress: optional ``progress(event, done, total)``.

    Returns:
        The report: ster_version (the writer's), model, model_revision, output, type, architecture, tensors, types (count per
        type), bytes, parameters, differences (how a GGUF runtime's model differs from the
        checkpoint's, empty when none), tokenizer_notes, notes (a GGUF source's tensors written with more bits
        than they have), seconds.

    Raises:
        SterError: an unknown type; an existing output or one not named *.gguf; a model ster cannot run or whose family has no
            llama.cpp architecture; a model with latent attention or state-space layers (``UNWRITTEN_MIXERS``,
            refused before any weight is read, from a checkpoint or a GGUF file); a checkpoint of an architecture
            in ``UNWRITTEN_ARCHS``; a tokenizer GGUF cannot hold; a write error (nothing is left at
            ``output``).
    """
    from .resolve import resolve

    from .files import check_path_name

    ft = file_type(type_name)
    check_path_name(output, "--output")
    output = Path(output)
    if output.exists():
        raise SterError(f"--output {output} already exists; choose a new file name or remove it first")
    if output.suffix.lower() != ".gguf":  # ster (and llama.cpp's tools) recognise a GGUF model by its name
        raise SterError(f"--output {output} does not end in .gguf; name the GGUF file NAME.gguf")
    from .artifacts import check_folder

    check_folder(output)  # before the model is resolved or read
    t0 = time.perf_counter()
    resolved = resolve(model, revision, progress=progress)
    if resolved.kind in ("gguf", "gguf_dir"):
        meta, entries, info = _from_gguf(resolved, ft, threads)
        align = info.pop("alignment")
    else:
        meta, entries, info = _from_checkpoint(resolved, ft, threads, progress)
        align = alignment
    write_gguf(output, meta, entries, alignment=align, progress=progress)
    types = Counter(e.type_name for e in entries)
    from . import __version__

    arch = meta["general.architecture"]
    arch = arch.value if isinstance(arch, Typed) else arch  # a GGUF input keeps its keys typed
    return {"ster_version": __version__, "model": resolved.model, "model_revision": resolved.model_revision,
            "output": str(output),
            "type": ft.name, "architecture": arch, "tensors": len(entries),
            "types": dict(sorted(types.items())), "bytes": output.stat().st_size,
            "parameters": int(sum(int(np.prod(e.shape, dtype=np.int64)) for e in entries)),
            "differences": info.get("differences", []), "tokenizer_notes": info.get("tokenizer_notes", []),
            "notes": info.get("notes", []), "seconds": round(time.perf_counter() - t0, 2)}


def _finite(x: np.ndarray, name: str, where: str) -> np.ndarray:
    """``x``, refused when it holds a NaN or an infinity (any one makes the float64 sum non-finite): converted,
    it was written as is with status 0 (or into a quantized block's scale), a model whose every output is NaN;
    llama-quantize's row validation refuses such data too."""
    if not np.isfinite(x.sum(dtype=np.float64)):
        raise SterError(f"{where}: the weights written as {name} hold NaN or infinity, so the GGUF would compute "
                        "NaN; they are damaged: re-download or re-export them")
    return x


def _entries(sources: list[_Source], types: dict[str, str], shapes: dict[str, tuple], threads,
             where: str) -> list[TensorEntry]:
    def data(src: _Source, t: str):
        return lambda: quantize(_finite(src.make(), src.name, where), t, n_threads=threads)

    return [TensorEntry(s.name, shapes[s.name], types[s.name], data(s, types[s.name])) for s in sources]


def check_convertible(resolved) -> None:
    """Refuse, before any weight is read, a resolved safetensors checkpoint that ``convert_model`` could not
    write as GGUF: an invalid config, an architecture or layer kind without a llama.cpp writer here, a
    tokenizer GGUF cannot hold. ``tune merge --output FILE.gguf`` calls it on the base model, so that
    such a refusal comes before the merge's work and names the base's files, not the merge's temporary copy.

    Raises:
        SterError: what ``convert_model`` would refuse about the checkpoint's config or tokenizer.
    """
    _checkpoint_metadata(resolved)


def _checkpoint_metadata(resolved):
    """(spec, architecture metadata, rope_freqs, tokenizer metadata, tokenizer notes) of a checkpoint, with
    ``check_convertible``'s refusals."""
    from .config import spec_from_config
    from .gguf.export import architecture_metadata, tokenizer_metadata
    from .validate import check_config, check_spec, interpret

    config, family = resolved.config, resolved.family
    where = str(resolved.config_path)
    check_config(config, where)
    spec = check_spec(interpret(where, spec_from_config, config, family, where), where)
    _refuse_unwritten_arch(family.gguf_arch, f"model_type {spec.model_type!r}", where)
    _refuse_unwritten([layer.mixer for layer in spec.layers], f"model_type {spec.model_type!r}", where)
    arch_meta, rope_freqs = architecture_metadata(config, family, spec, where)
    tok_meta, notes = tokenizer_metadata(resolved.root, spec.vocab_size, config)
    return spec, arch_meta, rope_freqs, tok_meta, notes


def _from_checkpoint(resolved, ft: FileType, threads, progress) -> tuple[dict, list[TensorEntry], dict]:
    from .families import FAMILIES_BY_GGUF_ARCH
    from .gguf.export import read_back_differences

    config, family = resolved.config, resolved.family
    where = str(resolved.config_path)
    spec, arch_meta, rope_freqs, tok_meta, notes = _checkpoint_metadata(resolved)  # refusals before any weight
    sources = checkpoint_sources(resolved, spec, family, config, progress)
    if rope_freqs is not None:
        sources.append(_Source("rope_freqs.weight", tuple(rope_freqs.shape), lambda: rope_freqs))
    shapes = {s.name: s.shape for s in sources}
    written = spec
    if spec.tie_word_embeddings and "output.weight" in shapes:
        # a tied config beside a stored head that differs (checkpoint_sources): the model runs the head, untied
        written = dataclasses.replace(written, tie_word_embeddings=False)
    if family.for_config(config).rope_interleaved and FAMILIES_BY_GGUF_ARCH[family.gguf_arch].gguf_qk_permuted:
        # rows written as they are (checkpoint_sources): the adjacent pairs llama.cpp rotates, which a reader
        # of this architecture turns back into halves, so the rotation it reports is the half-split one
        written = dataclasses.replace(written, layers=tuple(
            dataclasses.replace(layer, rope=dataclasses.replace(layer.rope, interleaved=False))
            if layer.rope is not None else layer for layer in spec.layers))
    differences = read_back_differences(written, {"general.architecture": family.gguf_arch, **arch_meta, **tok_meta},
                                        shapes, rope_freqs, where)
    facts = _facts_from_spec(family.gguf_arch, spec)
    types = choose_types([(s.name, shapes[s.name]) for s in sources], ft, facts)
    if "rope_freqs.weight" in types:
        types["rope_freqs.weight"] = "F32"
    meta = {**_general(_model_name(resolved, config), family.gguf_arch, ft), **arch_meta, **tok_meta}
    return meta, _entries(sources, types, shapes, threads, str(resolved.root)), {"differences": differences,
                                                                               "tokenizer_notes": notes}


def check_gguf_model(resolved) -> None:
    """Refuse a GGUF source ster would not run (a tensor the model needs missing or of another shape, a type
    it cannot decode, a tokenizer it cannot build), as ``load_model`` refuses it, so that ``convert`` never
    re-quantizes a damaged file into another one. Its decoder is built and dropped: the matrices stay in the
    file's mapping (no interleaved copy is queued, no weight is dequantized).

    Raises:
        SterError: whatever ``gguf.load.load_gguf_model`` raises.
    """
    from .decoder.qlinear import _kernels
    from .gguf.load import load_gguf_model

    qmatmul = _kernels()
    queued = qmatmul.set_background_copies(False)   # a copy is then made only by a product, which never runs
    try:
        load_gguf_model(resolved, precision="auto")
    finally:
        qmatmul.set_background_copies(queued)


def _from_gguf(resolved, ft: FileType, threads) -> tuple[dict, list[TensorEntry], dict]:
    from .gguf.config import family_for_architecture
    from .gguf.reader import GGUFFile

    path = resolved.gguf_file
    g = GGUFFile(path)
    arch = g.metadata.get("general.architecture")
    family = family_for_architecture(arch, str(path))  # an architecture ster runs
    _refuse_unwritten(_family_mixers(family), f"GGUF architecture {arch!r}", str(path))
    check_gguf_model(resolved)   # a file ster refuses to run is not re-quantized into another one
    meta: dict = {}
    for key, value in g.metadata.items():
        vtype = g.metadata_types[key]
        if vtype.startswith("array of array"):
            raise SterError(f"{path}: metadata {key} is an array of arrays, which ster does not write")
        meta[key] = Typed(vtype, value)
    meta["general.file_type"] = Typed("uint32", ft.ftype)
    meta["general.quantization_version"] = Typed("uint32", 2)

    def num(key, default=0):
        v = g.metadata.get(f"{arch}.{key}", default)
        return int(v) if isinstance(v, (int, np.integer)) else default

    facts = ModelFacts(arch, num("block_count"), num("expert_count"), num("attention.head_count", 1),
                       num("attention.head_count_kv", num("attention.head_count", 1)))
    tensors = list(g.tensors.values())
    types = choose_types([(t.name, t.shape) for t in tensors], ft, facts, {t.name: t.type_name for t in tensors})

    def data(t, new: str):
        if new == t.type_name:
            return lambda: t.raw
        return lambda: quantize(_finite(t.dequantize(), t.name, str(path)), new, n_threads=threads)

    entries = [TensorEntry(t.name, t.shape, types[t.name], data(t, types[t.name])) for t in tensors]
    return meta, entries, {"alignment": g.alignment, "notes": _widening_notes(tensors, types)}


def _bits(type_name: str) -> float:
    """Bits per weight of a GGML type (Q4_1: 5.0, Q8_0: 8.5, F16: 16)."""
    t = quants.ggml_type(type_name)
    return 8 * t.type_size / t.block_size


def _widening_notes(tensors, types: dict[str, str]) -> list[str]:
    """Notes when tensors of a GGUF source are written at a type of more bits than they have, which a user asking
    for a "better" type may expect to be more precise. Written as floats (F32, F16, BF16), they hold the source's
    rounded values: the file grows, its precision does not. Re-quantized to another block type, they are rounded
    again to that type's grid, from values already rounded to the source's: precision drops (two roundings, where
    a conversion of the unquantized checkpoint rounds once)."""
    wider = Counter((t.type_name, types[t.name]) for t in tensors
                    if types[t.name] != t.type_name and _bits(types[t.name]) > _bits(t.type_name))
    floats = {pair: n for pair, n in wider.items() if pair[1] in ("F32", "F16", "BF16")}
    blocks = {pair: n for pair, n in wider.items() if pair not in floats}

    def listed(counts):
        return ", ".join(f"{n} from {old} to {new}" for (old, new), n in sorted(counts.items()))

    notes = []
    if floats:
        notes.append(f"tensors written as floats of more bits than the source file gives them ({listed(floats)}) "
                     "hold its rounded values: the file grows, its precision does not (convert the original "
                     "unquantized checkpoint for a more precise file)")
    if blocks:
        notes.append(f"tensors re-quantized from the source file's blocks to a type of more bits ({listed(blocks)}) "
                     "are rounded again, to the new type's grid: the file grows, but precision is lost, not kept "
                     "(convert the original unquantized checkpoint instead; "
                     "`ster perplexity OUTPUT --reference SOURCE --file TEXT` measures the loss)")
    return notes
