"""``ster tune merge``: fold a LoRA adapter into a checkpoint's weights.

Each adapted projection W [out, in] becomes ``W + scale * B @ A``: the delta is
accumulated in float32, added to W widened to float32, and the sum is cast back
to W's stored dtype (one rounding, where PEFT's ``merge_and_unload`` rounds the
delta to the base dtype and then adds in it: the two agree within one unit in the
last place of a bfloat16/float16 weight, and exactly up to float32 rounding for
float32 weights). Fused projections (Phi-3's qkv_proj and gate_up_proj, GPT-2's
c_attn, GPT-NeoX's query_key_value) take each role's delta in that role's rows, in
the order ``decoder/layout.py`` splits them; inputs-first weights (GPT-2's Conv1D,
[in, out]) take the transposed delta. Every other tensor is copied bit for bit.

The output directory is written as a temporary sibling and renamed at the end,
so a failure leaves nothing behind. It holds ``model.safetensors`` (or
``model-0000k-of-0000n.safetensors`` shards with ``model.safetensors.index.json``
when larger than ``max_shard_bytes``), the source's config.json and tokenizer
files, and ``ster-merge.json``, the report.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import ml_dtypes
import numpy as np

from .. import __version__
from ..adapters import WeightMap, check_adapter_for, read_adapter
from ..artifacts import ST_DTYPES, atomic_directory, check_folder, write_safetensors
from ..errors import SterError
from ..files import check_path_arg, temporary

Progress = Callable[[str, int, "int | None"], None]
DEFAULT_MAX_SHARD_BYTES = 5 * 2**30  # Transformers' save_pretrained default is 5 GB too
COPIED_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "chat_template.jinja", "chat_template.json", "tokenizer.model",
                "vocab.json", "merges.txt", "added_tokens.json")
REPORT = "ster-merge.json"
_NP_DTYPES = {v: k for k, v in ST_DTYPES.items()}


def _index_checkpoint(files) -> dict[str, tuple[Path, str, tuple[int, ...]]]:
    """name -> (file, safetensors dtype, shape), reading only headers.

    Raises:
        SterError: an unreadable file, or one tensor name in two shards.
    """
    from safetensors import safe_open

    where: dict[str, tuple[Path, str, tuple[int, ...]]] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="numpy") as f:
                for name in f.keys():
                    s = f.get_slice(name)
                    if name in where:
                        raise SterError(f"tensor {name!r} is stored twice: in {where[name][0]} and in {path}; "
                                        "the checkpoint's shards overlap, remove the stray shard before merging")
                    where[name] = (Path(path), s.get_dtype(), tuple(s.get_shape()))
        except SterError:
            raise
        except Exception as e:  # safetensors raises several types for a bad header
            raise SterError(f"failed to read weight file {path}: {e}") from None
    return where


def _shards(names: list[str], sizes: dict[str, int], limit: int) -> list[list[str]]:
    groups: list[list[str]] = [[]]
    used = 0
    for n in names:
        if groups[-1] and used + sizes[n] > limit:
            groups.append([])
            used = 0
        groups[-1].append(n)
        used += sizes[n]
    return groups


def merge_adapter(model: str, adapter: str | Path, output: str | Path, *, revision: str | None = None,
                  max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, progress: Progress | None = None,
                  shown_as: str | Path | None = None) -> dict:
    """Merge ``adapter`` into ``model`` and write the result to the new directory ``output``.

    Args:
        model: the base's name or path, as ``--model`` takes it (str or os.PathLike): a local safetensors
            checkpoint directory or Hub id (a GGUF base is refused). Not ``load_model``'s result: the merge
            reads and rewrites the checkpoint's stored tensors.
        adapter: the adapter's path (str or os.PathLike), as ``--adapter`` takes it: Ster's NAME.lora.json
            (beside NAME.lora.safetensors) or a PEFT adapter directory. Not ``load_adapter_for``'s result.
        output: the directory to create; it must not exist.
        revision: as for every command (recorded, or selects the Hub commit).
        max_shard_bytes: write several shards when the weights are larger than this.
        progress: optional ``progress("merge", done, total)`` callback (tensors).
        shown_as: the output a write error names (``merge_adapter_to_gguf``'s .gguf file, whose merged
            checkpoint ``output`` is a temporary step); default ``output``.

    Returns:
        The report: ster_version (the writer's), model, model_revision, adapter, adapter_layout ("peft" or
        "ster"), output, rank, alpha, scale, rslora, targets, layers, hidden_size, merged_tensors,
        copied_tensors, total_tensors, parameters, dtype, files, warnings (what the merge said, one line each).

    Raises:
        SterError: a GGUF base; a reward artifact, a steering vector or an unsupported PEFT
            method as the adapter; an adapter for another model, another width, or a
            projection the checkpoint lacks; shards naming one tensor twice; an existing
            ``output``; a merged tensor that is not finite in its stored dtype where the base's was
            (the adapter's scale or factors overflow it: a float16 weight stops at 65504); ``model``,
            ``adapter`` or ``output`` None (or not text or a path), naming what to pass; an ``output`` named
            *.gguf (``merge_adapter_to_gguf`` writes that).
    """
    from ..adapters import ADAPTER_PATH
    from ..config import spec_from_config
    from ..resolve import model_text, resolve

    model_text(model)  # None: said before the adapter and the output are looked at
    check_path_arg(adapter, "merge_adapter", f"as adapter {ADAPTER_PATH}")
    check_path_arg(output, "merge_adapter", "as output the path of the directory to create")
    output = Path(output)
    if output.suffix.lower() == ".gguf":   # it wrote a checkpoint directory under the GGUF file's name
        raise SterError(f"--output {output} is named as a GGUF file, but merge_adapter writes a checkpoint "
                        "directory; call merge_adapter_to_gguf for one GGUF file (as ster tune merge -o FILE.gguf "
                        "does), or name the directory otherwise")
    if output.exists():
        raise SterError(f"--output {output} already exists; choose a new directory or remove it first")
    check_folder(output)  # a mistyped folder is refused before the base model is resolved

    def fit(resolved, check: bool = True):
        """(spec, storage map, adapter) once the base's config is known; refuses before any weight is read."""
        if resolved.kind != "safetensors":
            where = resolved.gguf_file or f"preset {resolved.model}"
            raise SterError(f"ster tune merge refuses a GGUF base ({where}): a merge writes the base's tensors "
                            "back and a GGUF's are quantized; merge into the safetensors checkpoint instead")
        if (resolved.config or {}).get("mistral_format"):
            raise SterError(f"ster tune merge does not write Mistral's own format yet ({resolved.config_path}: "
                            "params.json, consolidated weights, query/key rows for adjacent-pair rotation); merge "
                            "into the Transformers-format checkpoint of the same model (config.json, "
                            "model*.safetensors)")
        spec = spec_from_config(resolved.config, resolved.family, str(resolved.config_path))
        wmap = WeightMap.of_spec(spec)
        ad = read_adapter(adapter, wmap)
        if check:
            check_adapter_for(ad, resolved, spec, lambda role: wmap.stored(role) is not None)
        return spec, wmap, ad

    # A Hub base (or a preset, refused) is checked before its weights are downloaded.
    resolved = resolve(model, revision, progress=progress, before_weights=fit)
    spec, wmap, ad = fit(resolved, check=False)
    index = _index_checkpoint(resolved.weight_files)
    check_adapter_for(ad, resolved, spec, lambda role: wmap.stored(role) is not None)

    def stored_name(stored: str, layer: int) -> str:
        name = wmap.tensor_name(stored, layer)
        if name not in index and wmap.root and name.startswith(wmap.root):
            name = name[len(wmap.root):]  # saved from the base model, without the root prefix
        if name not in index:
            raise SterError(f"adapter {ad.path} adapts {wmap.tensor_name(stored, layer)}, which the checkpoint "
                            "does not hold")
        return name

    # stored tensor name -> [(layer, role, rows in that tensor or None)]
    targets: dict[str, list[tuple[int, str, np.ndarray | None]]] = {}
    for layer, role in sorted(ad.factors):
        targets.setdefault(stored_name(wmap.stored(role), layer), []).append((layer, role, wmap.rows(role)))
    for name, (_, st, _) in index.items():
        if st not in _NP_DTYPES:
            raise SterError(f"tensor {name!r} is stored as {st}, which ster cannot read back; nothing was written")
        if name in targets and st not in ("F64", "F32", "F16", "BF16"):
            raise SterError(f"tensor {name!r} is stored as {st}; only floating-point weights can be merged")

    for name, parts in targets.items():  # every delta fits its tensor, checked before anything is written
        shape = index[name][2][::-1] if wmap.inputs_first else index[name][2]
        for layer, role, rows in parts:
            a, b = ad.factors[(layer, role)]
            fits = len(shape) == 2 and shape[1] == a.shape[1] and (
                shape[0] == b.shape[0] if rows is None else shape[0] > rows.max() and len(rows) == b.shape[0])
            if not fits:
                raise SterError(f"tensor {name!r} has shape {list(index[name][2])}, which does not fit the {role} "
                                f"delta [{b.shape[0]}, {a.shape[1]}] of layer {layer}; the checkpoint and its "
                                "config disagree")

    order = sorted(index)
    sizes = {n: int(np.prod(index[n][2], dtype=np.int64)) * _NP_DTYPES[index[n][1]].itemsize for n in order}
    groups = _shards(order, sizes, max_shard_bytes)
    shard_names = (["model.safetensors"] if len(groups) == 1 else
                   [f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors" for k in range(len(groups))])
    handles: dict[Path, object] = {}

    def tensor(name: str) -> np.ndarray:
        from safetensors import safe_open

        path = index[name][0]
        if path not in handles:
            handles[path] = safe_open(str(path), framework="numpy")
        w = handles[path].get_tensor(name)
        if name not in targets:
            return w
        merged = (w.T if wmap.inputs_first else w).astype(np.float32)  # [out, in], a fresh f32 copy
        with np.errstate(over="ignore"):  # an overflow is refused by name just below, not warned about
            for layer, role, rows in targets[name]:
                delta = ad.delta(layer, role)
                if rows is None:
                    merged += delta
                else:
                    merged[rows] += delta
            wide, merged = merged, merged.astype(w.dtype)
        check_finite(name, w, wide, merged)
        return np.ascontiguousarray(merged.T) if wmap.inputs_first else merged

    def check_finite(name: str, w: np.ndarray, wide: np.ndarray, merged: np.ndarray) -> None:
        """Refuse a merged tensor with non-finite values where the base's were finite: the sum overflowed float32
        or the stored dtype (f16 stops at 65504). Raised while writing, so the temporary output is removed."""
        if np.isfinite(merged).all():
            return
        base = (w.T if wmap.inputs_first else w).astype(np.float32)
        if not (np.isfinite(merged) | ~np.isfinite(base)).all():
            st = index[name][1]
            biggest = float(np.abs(wide[np.isfinite(wide)]).max(initial=0.0))
            reach = f", they reach {biggest:g}" if np.isfinite(wide).all() else ""
            raise SterError(f"merging adapter {ad.path} into {name!r} gives non-finite weights: the merged values "
                            f"overflow {st} (largest {float(ml_dtypes.finfo(w.dtype).max):g}{reach}), so the "
                            f"adapter's scale ({ad.scale:g}) or factors are too large for it; nothing was written. "
                            "Real adapters have small factors and an alpha near their rank")

    done = 0
    report_files = []
    with atomic_directory(output, shown_as) as tmp:
        for shard, group in zip(shard_names, groups):
            specs = [(n, _NP_DTYPES[index[n][1]], index[n][2]) for n in group]

            def arrays(group=group):
                nonlocal done
                for n in group:
                    yield tensor(n)
                    done += 1
                    if progress:
                        progress("merge", done, len(order))

            write_safetensors(tmp / shard, specs, arrays(), metadata={"format": "pt"})
            report_files.append(shard)
        if len(groups) > 1:
            weight_map = {n: shard for shard, group in zip(shard_names, groups) for n in group}
            (tmp / "model.safetensors.index.json").write_text(json.dumps(
                {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}, indent=2) + "\n")
            report_files.append("model.safetensors.index.json")
        for fname in COPIED_FILES:
            src = Path(resolved.root) / fname
            if src.is_file():
                shutil.copyfile(src, tmp / fname)
                report_files.append(fname)
        dtypes = sorted({index[n][1] for n in order})
        report = {
            "ster_version": __version__, "model": resolved.model, "model_revision": resolved.model_revision, "adapter": str(adapter),
            "adapter_layout": ad.layout, "output": str(output), "rank": ad.rank, "alpha": ad.alpha,
            "scale": ad.scale, "rslora": ad.rslora, "targets": ad.targets, "layers": ad.layers,
            "hidden_size": spec.hidden_size, "merged_tensors": len(targets),
            "copied_tensors": len(order) - len(targets),
            "total_tensors": len(order), "parameters": int(sum(np.prod(index[n][2], dtype=np.int64) for n in order)),
            "dtype": dtypes[0] if len(dtypes) == 1 else dtypes, "files": report_files + [REPORT],
            "warnings": list(ad.notes),
        }
        (tmp / REPORT).write_text(json.dumps(report, indent=2) + "\n")
    return report


def merge_adapter_to_gguf(model: str, adapter: str | Path, output: str | Path, *, type_name: str = "f16",
                          revision: str | None = None, progress: Progress | None = None) -> dict:
    """Merge ``adapter`` into ``model`` and write the merged model as one GGUF file (``ster convert``'s writer).

    The merged checkpoint is written to a temporary directory beside ``output`` (``merge_adapter``), converted
    to ``output`` at ``type_name`` (``convert.convert_model``: llama.cpp's names, metadata and type rules) and
    removed; nothing is left at ``output`` if either step fails.

    Returns:
        The merge report, its ``dtype`` (the merged checkpoint's, converted from) as ``merged_dtype`` beside the
        file's ``type``, with the conversion's report under ``"gguf"`` (``output`` is the .gguf file).

    Raises:
        SterError: anything ``merge_adapter`` or ``convert_model`` refuses; an existing ``output``.
    """
    from ..convert import check_convertible, convert_model
    from ..gguf.recipe import file_type
    from ..resolve import resolve

    file_type(type_name)  # an unknown type is refused before any merge work
    output = Path(output)
    if output.exists():
        raise SterError(f"--output {output} already exists; choose a new file name or remove it first")
    check_folder(output)
    # A base the conversion would refuse (its tokenizer, its architecture) is refused before the merge's work,
    # naming its own files: found by the conversion, the refusal named the temporary merged copy, then removed.
    base = resolve(model, revision, progress=progress, weights=False)
    if base.kind == "safetensors" and not (base.config or {}).get("mistral_format"):  # else merge_adapter refuses
        check_convertible(base)
    # an unwritable directory: one "cannot write" error
    with temporary(output.parent, f".{output.name}.", ".merge", target=output) as tmp:
        merged = tmp / "merged"
        report = merge_adapter(model, adapter, merged, revision=revision, progress=progress, shown_as=output)
        gguf = convert_model(str(merged), output, type_name, progress=progress)
    gguf["model"] = report["model"]
    # "dtype" F32 beside an f16 file misled: the merged checkpoint's dtype is what the conversion read
    merged = {k: v for k, v in report.items() if k not in ("dtype", "files", "warnings")}
    return {**merged, "output": str(output), "merged_dtype": report["dtype"], "type": gguf["type"],
            "files": [output.name], "warnings": report["warnings"], "gguf": gguf}
