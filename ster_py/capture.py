"""Capture the residual stream after chosen decoder layers, for every prompt.

Layer numbering: layer ``i`` (0-based) is the residual stream right after decoder
layer ``i`` runs, before the next layer (and, for the last layer, before the final
norm). It equals Transformers' ``output_hidden_states[i + 1]`` for every layer but
the last, whose Transformers entry has the final norm applied. The embedding
output is not a layer. Steering adds its vector at the same place, so a capture
and a steering vector name layers the same way.

File layout (written atomically): ``NAME.safetensors`` holds float32 tensors

- position ``last`` or ``mean``: ``layers.{i}`` [n_prompts, hidden_size]
- position ``all``: ``layers.{i}.prompt.{p}`` [prompt p's tokens, hidden_size]

and ``NAME.json`` (the sidecar, also stored in the safetensors ``__metadata__``
under ``ster``) records the writing ster_version, model, model_revision (a local GGUF file's SHA-256,
``artifacts.content_revision``, so that a vector made from it fits a copy at another path), precision,
hidden_size, layers,
position rule, chat template mode, the steering the prompts ran under (``steering``: null, or the vector's
trait, method, layers, strength and file), and each prompt's text and token ids.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .artifacts import (CAPTURE_FORMAT, atomic_outputs, check_folder, content_revision, model_identity, read_json,
                        sniff, write_safetensors)
from .decoder.model import check_callbacks
from .decoder.qlinear import float_activations
from .errors import SterError
from .files import FileTooLarge, NotRegularFile, check_path_arg, check_path_name, read_bounded
from .prompt import Prompt, check_prompt_text, encode_prompt, prompt_context
from .steering import check_model_fields, json_value

POSITIONS = ("last", "mean", "all")
LAYER_HELP = ("Layer i (0-based) is the residual stream after decoder layer i, before the next layer; "
              "0 is the output of the first decoder layer (not the embeddings) and the last layer is taken "
              "before the final norm. Layer i equals transformers' hidden_states[i + 1] (except the last, "
              "which transformers returns after the final norm).")
SCHEMA_VERSION = 1
#: ``--prompts`` reads at most this many bytes (as ``tokenize --file``); prompts are encoded and run one by one.
MAX_PROMPTS_FILE_BYTES = 16 << 20

Progress = Callable[[str, int, "int | None"], None]


def format_layers(layers) -> str:
    """Layer indices as the CLI prints them: ``0..29 (30)`` when contiguous, else ``0,4,9 (3)``."""
    chosen = sorted(layers)
    if not chosen:
        return "none (0)"
    contiguous = len(chosen) > 1 and chosen == list(range(chosen[0], chosen[-1] + 1))
    shown = f"{chosen[0]}..{chosen[-1]}" if contiguous else ",".join(map(str, chosen))
    return f"{shown} ({len(chosen)})"


def parse_layers(text: str, num_layers: int) -> list[int]:
    """Parse a layer selection: ``all``, ``N``, ``a..b`` (inclusive) or ``a,b,c``.

    Returns sorted unique 0-based layer indices.

    Raises:
        SterError: malformed text (an empty item, as in ``1,,2``, named by its position), or an index
            outside 0..num_layers-1.
    """
    t = str(text).strip()

    def number(item: str) -> int:   # ASCII digits only: int() also took "1_0" as 10, "+1" and other scripts' digits
        item = item.strip()
        if not (item.removeprefix("-").isascii() and item.removeprefix("-").isdecimal()):
            raise ValueError(item)
        return int(item)

    try:
        if t == "all":
            out = list(range(num_layers))
        elif ".." in t:
            a, b = t.split("..", 1)
            lo, hi = number(a), number(b)
            if lo > hi:
                raise SterError(f"--layers {t}: the range is empty ({lo} > {hi}); write low..high")
            for end in (lo, hi):  # before the range is built: 0..10**20 would not fit in memory
                if not 0 <= end < num_layers:
                    raise SterError(f"--layers {t}: layer {end} does not exist; this model has layers "
                                    f"0..{num_layers - 1}")
            out = list(range(lo, hi + 1))
        else:
            items = t.split(",")
            empty = next((k for k, x in enumerate(items, 1) if not x.strip()), None)
            if empty is not None and t:  # "1,,2" selected 1 and 2 in silence; "" selects nothing, said below
                raise SterError(f"--layers {t!r}: item {empty} is empty; separate layer numbers by one comma, "
                                "as in 1,2,3")
            out = [number(x) for x in items if x.strip()]
    except ValueError:
        raise SterError(f"--layers {t!r} is not understood; use all, N, a..b (inclusive) or a,b,c") from None
    if not out:
        raise SterError(f"--layers {t!r} selects no layer")
    bad = [i for i in out if not 0 <= i < num_layers]
    if bad:
        raise SterError(f"--layers {t}: layer {bad[0]} does not exist; this model has layers 0..{num_layers - 1}")
    return sorted(set(out))


def read_prompts(prompt: str | None, prompts_file: str | Path | None, *, templated: bool = True) -> list[str]:
    """The prompts of a run: ``--prompt`` alone, or ``--prompts FILE``.

    FILE is a text file with one prompt per line (blank lines skipped), or, when it
    ends in .jsonl, one JSON string or ``{"prompt": ...}`` object per line. ``templated``
    False: the command sends raw text (parity), as ``check_prompt_text`` takes it.

    Raises:
        SterError: both or neither given, an empty --prompt, an unreadable file (missing, not a regular file,
            over ``MAX_PROMPTS_FILE_BYTES``, not UTF-8), or no prompt in it.
    """
    if (prompt is None) == (prompts_file is None):
        raise SterError("give exactly one of --prompt TEXT or --prompts FILE")
    if prompt is not None:
        check_prompt_text(prompt, templated=templated)
        return [prompt]
    path = Path(prompts_file)
    try:  # bounded: /dev/zero or a FIFO was read without end, a binary file was a UnicodeDecodeError traceback
        lines = read_bounded(path, MAX_PROMPTS_FILE_BYTES).decode("utf-8").splitlines()
    except NotRegularFile as e:
        raise SterError(f"--prompts {path} is {e}; give a text file of prompts") from None
    except FileTooLarge:
        raise SterError(f"--prompts {path} is larger than {MAX_PROMPTS_FILE_BYTES >> 20} MiB, ster's limit for it; "
                        "split the prompts into smaller files") from None
    except UnicodeDecodeError as e:
        raise SterError(f"--prompts {path} is not UTF-8 text (invalid byte at offset {e.start}); "
                        "convert it to UTF-8") from None
    except OSError as e:
        raise SterError(f"cannot read --prompts {path}: {e.strerror or e}") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                item = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as e:
                raise SterError(f"{path} line {n} is not JSON: {e if isinstance(e, ValueError) else 'nested too deeply'}") from None
            item = item.get("prompt") if isinstance(item, dict) else item
            if not isinstance(item, str):
                raise SterError(f"{path} line {n}: expected a string or an object with a \"prompt\" string")
            out.append(item)
        else:
            out.append(line)
    if not out:
        raise SterError(f"--prompts {path} holds no prompt")
    return out


@dataclass
class Capture:
    """Captured states. ``states[layer]`` is float32 [n_prompts, hidden] (last/mean) or a list
    of float32 [T_p, hidden] arrays (all). ``meta`` is the sidecar document."""

    meta: dict
    states: dict[int, np.ndarray | list[np.ndarray]] = field(default_factory=dict)

    @property
    def layers(self) -> list[int]:
        return list(self.meta["layers"])

    def rows(self, layer: int) -> np.ndarray:
        """float32 [N, hidden]: one row per prompt (last/mean) or per token of every prompt (all)."""
        s = self.states[layer]
        return np.concatenate(s, axis=0) if isinstance(s, list) else s


def capture(loaded, prompts: Sequence[str], layers: Sequence[int], position: str = "last", *,
            chat_template: str = "auto", system: str | None = None, vector=None, strength: float = 1.0,
            vector_path: str | None = None, layer_hook=None, progress: Progress | None = None) -> Capture:
    """Run each prompt through ``loaded.decoder`` and keep the residual stream at ``layers``.

    Args:
        loaded: a ``LoadedModel``.
        prompts: user texts; each is encoded as ``generate`` would (``encode_prompt``).
        layers: 0-based layer indices (see the module docstring for the numbering).
        position: "last" (the last prompt token, where generation starts), "mean" (the
            mean over every prompt token, template tokens included) or "all". A mean includes the
            first token, whose state is the same in every prompt that starts with BOS or the chat
            template and, on SmolLM2 and Gemma 3 (an attention sink), 5 to 170 times the others' norm:
            means of prompts of different lengths differ largely by it (README, ``ster capture``).
        chat_template: "auto" (each prompt the user message of the model's chat template, which adds the
            assistant's generation prompt, when the model has one) or "off" (the raw text, special-token texts
            read as those tokens), as for generate.
        system: a system prompt placed before each prompt by the chat template (None: the template's
            default); refused without a template.
        vector: a ``SteeringVector`` (``caa``, ``pca``, ``read_vector``) added at ``strength`` while the prompts
            run, as ``generate --vector`` adds it: the states after its layers (and every later one) are the
            steered model's. Checked against the model first (``check_vector_for``). The sidecar records it under
            ``steering`` (trait, method, layers, strength, ``vector_path`` when given).
        strength: the vector's multiplier (a finite number).
        vector_path: the vector's file, named in messages and recorded (optional).
        layer_hook: instead of a vector, any ``h = layer_hook(i, h)`` as ``Decoder.forward`` takes (the sidecar
            records ``{"layer_hook": true}``: nothing else is known of it).
        progress: optional ``progress("capture", done, total)`` callback.

    Raises:
        SterError: ``loaded`` not a loaded model; an unknown position rule; no prompt, or a prompt that is
            not text; no layer, a layer out of range, not a whole number
            or given twice (a capture holds one array per layer and prompt: ``save_capture`` and
            ``load_capture`` refuse anything else); or a prompt error; a vector that does not fit the model
            (another model, width or layers), a strength that is not a finite number, or both a vector and a
            layer_hook; a ``progress`` or ``layer_hook`` that is neither None nor callable (``check_callbacks``).
    """
    if not all(hasattr(loaded, name) for name in ("decoder", "tokenizer", "spec")):
        raise SterError(f"capture takes a loaded model (load_model(...)), got {type(loaded).__name__}")
    check_callbacks("capture", progress=progress, layer_hook=layer_hook)
    if position not in POSITIONS:
        raise SterError(f"--position must be one of {', '.join(POSITIONS)}, got {position!r}")
    if isinstance(prompts, str):
        raise SterError("prompts must be a list of texts, not one string; pass [text] for one prompt")
    if prompts is not None and not hasattr(prompts, "__iter__"):
        raise SterError(f"prompts must be a list of texts, got {type(prompts).__name__}")
    prompts = list(() if prompts is None else prompts)
    if not prompts:
        raise SterError("no prompt given; a capture needs at least one prompt")
    if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):   # None, 5, "all": not layer numbers
        raise SterError(f"layers must be a list of layer numbers such as [4, 8], got {str(layers)[:60]!r}")
    layers = list(layers)
    if not layers:
        raise SterError("no layer given; name at least one layer to capture")
    n_layers = loaded.spec.num_hidden_layers
    for i in layers:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise SterError(f"layer {i!r} is not a layer number; give whole numbers 0..{n_layers - 1}")
        if not 0 <= i < n_layers:
            raise SterError(f"layer {i} does not exist; this model has layers 0..{n_layers - 1}")
    if len(set(layers)) != len(layers):
        twice = next(i for n, i in enumerate(layers) if i in layers[:n])
        raise SterError(f"layer {twice} is given twice; name each layer once")
    layers = [int(i) for i in layers]
    hook, steering = _steering(loaded, vector, strength, vector_path, layer_hook)
    context = prompt_context(loaded.spec)
    encoded: list[Prompt] = [encode_prompt(loaded.tokenizer, p, system=system, chat_template=chat_template,
                                           context=context)
                             for p in prompts]
    per_layer: dict[int, list[np.ndarray]] = {i: [] for i in layers}
    for n, p in enumerate(encoded):
        if not p.ids:
            if p.chat_template == "applied":  # the prompt had text: "give a non-empty prompt" blamed the user
                raise SterError(f"prompt {n} encodes to no tokens: the model's chat template rendered it as no "
                                "text; fix the template, or capture the raw text with --chat-template off")
            raise SterError(f"prompt {n} encodes to no tokens; give a non-empty prompt")
        hidden: list[np.ndarray] = []
        # Float inputs to every product (as parity): the int16 / bfloat16 roundings of a product's inputs are
        # generation's speed trades, and a captured state must not depend on the prompt's length or the CPU.
        with float_activations():
            loaded.decoder.forward(p.ids, hidden_states=hidden, layer_hook=hook, last_only=True)
        for i in layers:
            h = hidden[i + 1]  # hidden[0] is the embedding output
            if not np.isfinite(h).all():  # saved, it was refused only by vector caa / pca, which said "capture again"
                raise SterError(f"prompt {n}: the residual stream after layer {i} holds NaN or infinity, which no "
                                "direction can be built from: the model's weights or configuration hold non-finite "
                                "or out-of-range values (with --precision f16, try f32 or bf16)")
            if position == "last":
                h = h[-1]
            elif position == "mean":
                h = h.astype(np.float64).mean(axis=0).astype(np.float32)
            per_layer[i].append(np.ascontiguousarray(h, dtype=np.float32))
        if progress:
            progress("capture", n + 1, len(encoded))
    states = {i: (v if position == "all" else np.stack(v)) for i, v in per_layer.items()}
    modes = {p.chat_template for p in encoded}
    from . import __version__

    meta = {
        "format": CAPTURE_FORMAT, "schema_version": SCHEMA_VERSION, "ster_version": __version__,
        "model": model_identity(loaded.resolved), "model_revision": content_revision(loaded.resolved),
        "model_type": loaded.spec.model_type, "precision": loaded.precision,
        "hidden_size": loaded.spec.hidden_size, "num_hidden_layers": n_layers,
        "layers": list(layers), "layer_numbering": LAYER_HELP, "position": position,
        "chat_template": modes.pop() if len(modes) == 1 else "mixed", "steering": steering,
        "prompts": [{"text": t, "token_ids": p.ids, "chat_template": p.chat_template}
                    for t, p in zip(prompts, encoded)],
    }
    return Capture(meta, states)


def _steering(loaded, vector, strength, vector_path, layer_hook):
    """capture's hook (None: unsteered) and its sidecar's ``steering`` record (None, or what the run added)."""
    if vector is None:
        return layer_hook, (None if layer_hook is None else {"layer_hook": True})
    from .steering import check_vector_for, steering_hook

    if layer_hook is not None:
        raise SterError("give capture a steering vector or a layer_hook, not both")
    hook = steering_hook(vector, strength)   # refuses what is not a vector, and a bad strength
    check_vector_for(vector, loaded, vector_path or "given to capture")
    return hook, {"vector_path": None if vector_path is None else str(vector_path), "trait": vector.trait,
                  "method": vector.method, "layers": sorted(int(i) for i in vector.directions),
                  "strength": float(strength)}


def _tensor_names(meta: dict) -> list[tuple[str, int, int | None]]:
    """(tensor name, layer, prompt index or None) in file order."""
    if meta["position"] == "all":
        return [(f"layers.{i}.prompt.{p}", i, p) for i in meta["layers"] for p in range(len(meta["prompts"]))]
    return [(f"layers.{i}", i, None) for i in meta["layers"]]


def capture_tensors(cap: Capture) -> dict[str, np.ndarray]:
    """The tensors ``save_capture`` writes, by name in file order: ``layers.I`` [n_prompts, hidden] (position last
    or mean) or ``layers.I.prompt.P`` [T_P, hidden] (all)."""
    return {name: cap.states[i][p] if p is not None else cap.states[i] for name, i, p in _tensor_names(cap.meta)}


def sidecar_path(path: Path) -> Path:
    """NAME.safetensors -> NAME.json (any other name: the name + .json)."""
    path = Path(path)
    return path.with_suffix(".json") if path.suffix == ".safetensors" else path.with_name(path.name + ".json")


def check_capture_output(path: str | Path) -> None:
    """Refuse an output that would overwrite anything but an earlier capture.

    A capture replaces an earlier capture at the same name, but never another file: the
    sidecar name (NAME.json) may already hold something else (a prompts or chat file).

    Raises:
        SterError: ``path`` does not end in .safetensors; the sidecar exists and is not a capture
            sidecar; or ``path`` exists without a capture sidecar beside it; its folder does not exist.
    """
    check_path_name(path, "--output")
    path = Path(path)
    if path.suffix == ".json":
        raise SterError(f"--output {path}: give the .safetensors name; the JSON sidecar is written beside it")
    if path.suffix != ".safetensors":
        raise SterError(f"--output {path}: a capture is written as safetensors; name it "
                        f"{path.with_suffix('.safetensors').name if path.suffix else path.name + '.safetensors'}")
    check_folder(path)
    side = sidecar_path(path)
    check_folder(side)
    if side.exists():
        try:
            doc = json.loads(side.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            doc = None
        if not (isinstance(doc, dict) and doc.get("format") == CAPTURE_FORMAT):
            raise SterError(f"--output {path} would overwrite {side}, which is not a capture sidecar; "
                            "choose another --output name or move that file")
    elif path.exists():
        raise SterError(f"--output {path} exists and is not a capture (no sidecar {side.name} beside it); "
                        "choose another --output name or move that file")


def save_capture(cap: Capture, path: str | Path) -> list[Path]:
    """Write ``cap`` as ``path`` (safetensors) and its JSON sidecar, atomically.

    Returns the two paths written. Raises SterError as ``check_capture_output`` does, and for what
    ``load_capture`` would refuse to read back (``check_sidecar``, ``check_states``), ``cap`` not a ``Capture``
    or ``path`` not a path; nothing is written then.
    """
    if not isinstance(cap, Capture):   # was an AttributeError ('NoneType' object has no attribute 'meta')
        raise SterError(f"save_capture takes a Capture (capture or load_capture), got {type(cap).__name__}")
    check_path_arg(path, "save_capture", "the capture's output path (NAME.safetensors)")
    check_sidecar(cap.meta, "the capture to save")
    check_states(cap, "the capture to save")
    path = Path(path)
    check_capture_output(path)
    side = sidecar_path(path)
    tensors = capture_tensors(cap)
    arrays = list(tensors.values())
    specs = [(n, np.dtype(np.float32), a.shape) for n, a in tensors.items()]
    text = json.dumps(cap.meta, ensure_ascii=False, indent=1)
    with atomic_outputs(path, side) as (tmp_tensors, tmp_side):
        write_safetensors(tmp_tensors, specs, arrays, metadata={"ster": json.dumps(cap.meta, ensure_ascii=False)})
        tmp_side.write_text(text + "\n", encoding="utf-8")
    return [path, side]


RECAPTURE = "capture again with `ster capture`"


def _positive_int(meta: dict, key: str, where: str) -> int:
    value = meta[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SterError(f"{where}: {key} must be a positive integer, got {json_value(value)}; {RECAPTURE}")
    return value


def check_sidecar(meta: dict, where: str) -> None:
    """Refuse a capture sidecar (or an in-memory ``Capture.meta``) that vector building cannot trust.

    Checks the fields the readers use: ``position`` (one of POSITIONS), ``hidden_size`` and
    ``num_hidden_layers`` (positive integers), ``layers`` (a non-empty list of distinct layer numbers
    below num_hidden_layers), ``prompts`` (a non-empty list of objects), ``steering`` (an object or null, when
    present), ``model`` and ``model_revision`` (a string or null).

    Args:
        meta: the parsed sidecar.
        where: how the messages name it ("capture sidecar PATH").

    Raises:
        SterError (naming ``where`` and the field): a missing field or one of the wrong type or range.
    """
    for key in ("position", "hidden_size", "num_hidden_layers", "layers", "prompts"):
        if key not in meta:
            raise SterError(f"{where} lacks the field {key!r}; {RECAPTURE}")
    if meta["position"] not in POSITIONS:
        raise SterError(f"{where}: position must be one of {', '.join(POSITIONS)}, got {json_value(meta['position'])}; "
                        f"{RECAPTURE}")
    _positive_int(meta, "hidden_size", where)
    n_layers = _positive_int(meta, "num_hidden_layers", where)
    layers = meta["layers"]
    if not isinstance(layers, list) or not layers:
        raise SterError(f"{where}: layers must be a non-empty list of layer numbers, got {json_value(layers)}; "
                        f"{RECAPTURE}")
    seen = set()
    for i in layers:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_layers:
            raise SterError(f"{where}: layers holds {json_value(i)}, not a layer number 0..{n_layers - 1} "
                            f"(num_hidden_layers is {n_layers}); {RECAPTURE}")
        if i in seen:  # its tensor would be read twice, the second replacing the first
            raise SterError(f"{where}: layers lists layer {i} twice; {RECAPTURE}")
        seen.add(i)
    prompts = meta["prompts"]
    if not isinstance(prompts, list) or not prompts or not all(isinstance(x, dict) for x in prompts):
        raise SterError(f"{where}: prompts must be a non-empty list of objects (one per prompt); {RECAPTURE}")
    steering = meta.get("steering")   # "abc" read as unsteered: "different steering (positive unsteered, negative unsteered)"
    if steering is not None and not isinstance(steering, dict):
        raise SterError(f"{where}: steering must be an object (what the capture added) or null (unsteered), got "
                        f"{json_value(steering)}; {RECAPTURE}")
    check_model_fields(meta, where, RECAPTURE)


def check_states(cap: Capture, where: str) -> None:
    """Refuse captured states that do not match their sidecar or are not finite.

    ``cap.meta`` must have passed :func:`check_sidecar`. Each listed layer must hold, for position
    ``last``/``mean``, one [prompts, hidden_size] array, for ``all`` one [tokens, hidden_size] array per
    prompt; every value must be finite (a NaN row would be averaged into a NaN direction, and numpy's SVD
    never returns on NaN or infinity).

    Raises:
        SterError (naming ``where``, the tensor and, for a non-finite value, the row): a missing layer, a
            wrong shape or count, a NaN or infinity.
    """
    meta = cap.meta
    width, n_prompts, every = meta["hidden_size"], len(meta["prompts"]), meta["position"] == "all"
    for i in meta["layers"]:
        s = cap.states.get(i)
        if s is None:
            raise SterError(f"{where} holds no states for layer {i}, which its sidecar lists; {RECAPTURE}")
        if every != isinstance(s, list) or (every and len(s) != n_prompts):
            raise SterError(f"{where}: layer {i} does not hold one array per prompt as position "
                            f"{meta['position']!r} says; {RECAPTURE}")
        for p, t in enumerate(s if every else [s]):
            name = f"layers.{i}.prompt.{p}" if every else f"layers.{i}"
            rows = "tokens" if every else f"prompts ({n_prompts})"
            t = np.asarray(t)
            if t.ndim != 2 or t.shape[1] != width or not t.shape[0] or (not every and t.shape[0] != n_prompts):
                raise SterError(f"{where}: {name} has shape {list(t.shape)}, but a capture's {name} is "
                                f"[{rows}, hidden_size {width}]; {RECAPTURE}")
            finite = np.isfinite(t).all(axis=1)
            if not finite.all():
                row = int(np.flatnonzero(~finite)[0])
                which = f"row {row} (token {row} of prompt {p})" if every else f"row {row} (prompt {row})"
                raise SterError(f"{where}: {name} {which} holds NaN or infinity, which no direction can be built "
                                f"from; {RECAPTURE} (leave that prompt out if it happens again)")


def load_capture(path: str | Path) -> Capture:
    """Read a capture written by :func:`save_capture` (give the .safetensors or the .json).

    Raises:
        SterError: missing files, another kind of artifact, an unknown schema version, a sidecar
            field missing or malformed (:func:`check_sidecar`), tensors that are not floats or
            disagree with the sidecar, or hold NaN or infinity (:func:`check_states`).
    """
    from safetensors import safe_open

    check_path_arg(path, "load_capture", "the path of a capture (NAME.safetensors or its NAME.json)")
    given = path = Path(path)
    if path.suffix == ".json":
        side, path = path, path.with_suffix(".safetensors")
    else:
        side = sidecar_path(path)
    if not side.exists() and not side.is_symlink():  # name what was given, not only the sidecar it implies
        written = "`ster capture --output NAME.safetensors` writes NAME.safetensors and its sidecar NAME.json"
        if not path.exists() and not path.is_symlink():
            raise SterError(f"capture {given} does not exist; {written}")
        if path.suffix != ".safetensors":  # a prompts file, a vector... given where a capture belongs
            raise SterError(f"{given} is not a capture; {written}")
    meta = read_json(side, "capture sidecar")
    kind = sniff(meta, side)
    if kind != "capture":
        from .artifacts import KIND_WORDS

        raise SterError(f"{side} is {KIND_WORDS[kind]}, not a capture written by `ster capture`")
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise SterError(f"capture {side} has schema_version {meta.get('schema_version')!r}; "
                        f"this ster reads version {SCHEMA_VERSION}")
    check_sidecar(meta, f"capture sidecar {side}")  # the tensor names below come from its fields
    if not path.is_file():
        raise SterError(f"capture tensors {path} are missing (the sidecar {side} is there)")
    cap = Capture(meta)
    try:
        with safe_open(str(path), framework="numpy") as f:
            for name, i, p in _tensor_names(meta):
                if name not in f.keys():
                    raise SterError(f"capture {path} lacks tensor {name!r} that its sidecar lists")
                t = f.get_tensor(name)
                if t.dtype.kind != "f":
                    raise SterError(f"capture {path}: {name} holds {t.dtype} values, not floats; {RECAPTURE}")
                with np.errstate(over="ignore"):  # a float64 beyond float32's range: refused as infinity below
                    t = t.astype(np.float32, copy=False)
                if p is None:
                    cap.states[i] = t
                else:
                    cap.states.setdefault(i, []).append(t)
    except SterError:
        raise
    except Exception as e:  # safetensors raises several types for a damaged file
        raise SterError(f"capture {path} is not a readable safetensors file: {e}") from None
    check_states(cap, f"capture {path}")
    return cap
