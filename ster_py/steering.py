"""Steering vectors: Ster's artifact, the checks before use, the layer hook, and CAA.

Artifact (JSON, one file)::

    {"format": "ster.steering", "schema_version": 1, "ster_version": "0.1.0" (the writer's),
     "model": "...", "model_revision": null | "...", "hidden_size": 576,
     "trait": "...", "method": "caa",
     "directions": {"12": [576 floats, unit L2 norm], ...},   # layer index -> direction
     "metadata": {...}}

Layers are numbered as in ``ster capture`` (layer i = the residual stream after
decoder layer i, 0-based). Steering adds ``strength * direction[i]`` to that
residual stream at every position, in the prefill and in every decode step,
so ``strength`` is in the units of the residual stream (``metadata`` records the
per-layer norms of the raw difference and of the residual to help choose it).

Contrastive activation addition (CAA): Rimsky et al. 2024, "Steering Llama 2
via Contrastive Activation Addition": the direction at a layer is the mean
activation over positive examples minus the mean over negative ones.

PCA of pair differences (as llama.cpp's ``cvector-generator`` and repeng's ``pca_diff``
build control vectors): the direction at a layer is the first principal axis of the
differences positive_j - negative_j of paired prompts (the top right singular vector of
the difference matrix, not centred, as llama.cpp's power iteration on DᵀD finds it), its
sign chosen so that most pairs' positive side projects above its negative side (repeng's
correction; llama.cpp leaves the sign to the iteration).

``export_control_vector`` writes a vector as llama.cpp's control-vector GGUF
(``direction.{layer}`` F32 tensors, ``controlvector.model_hint``, ``controlvector.layer_count``).
llama.cpp adds ``direction.N`` to the output of its layer N (0-based), the place ster's layer N
steers, so the numbers carry over; llama.cpp never steers layer 0, so a vector's layer 0 is left
out (and reported).
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .artifacts import (KIND_WORDS, STEERING_FORMAT, atomic_outputs, check_folder, check_model, read_json,
                        sniff)
from .config import MAX_LAYERS
from .errors import SterError
from .files import check_path_arg, check_path_name

SCHEMA_VERSION = 1
UNIT_TOLERANCE = 1e-3  # directions are stored as unit vectors; JSON floats keep ~1e-16
# A layer key as write_vector writes it: ASCII digits without a leading zero, so that two keys never name one
# layer ("0" and "00" would, the last silently winning) and int() never sees "²" or 5,000 digits.
LAYER_KEY = re.compile(r"0|[1-9][0-9]{0,8}")
REBUILD = "build the vector again with `ster vector caa` or `ster vector pca`"


def json_value(value) -> str:
    """``value`` as a message quotes it, with its JSON type when that is the point: ``'576' (a string)``
    (a long value is cut: it may come from a hostile file)."""
    kinds = {str: "a string", float: "a number", bool: "a boolean", list: "a list", dict: "an object"}
    kind = kinds.get(type(value))
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:50] + "..."
    return f"{shown} ({kind})" if kind else shown


def check_model_fields(doc: dict, where: str, advice: str, keys=("model", "model_revision")) -> None:
    """Refuse an artifact whose ``model`` or ``model_revision`` (PEFT's adapter_config.json: ``keys``
    base_model_name_or_path, revision) is neither a string nor null (what ``artifacts.check_model``
    compares); the message names ``where`` and ends with ``advice``."""
    for key in keys:
        if doc.get(key) is not None and not isinstance(doc[key], str):
            raise SterError(f"{where}: {key} must be a string or null, got {json_value(doc[key])}; {advice}")


@dataclass
class SteeringVector:
    """A steering artifact in memory. ``directions[layer]`` is float32 [hidden_size], unit norm."""

    model: str | None
    model_revision: str | None
    hidden_size: int
    trait: str
    method: str
    directions: dict[int, np.ndarray]
    metadata: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        from . import __version__

        return {"format": STEERING_FORMAT, "schema_version": SCHEMA_VERSION, "ster_version": __version__,
                "model": self.model,
                "model_revision": self.model_revision, "hidden_size": self.hidden_size, "trait": self.trait,
                "method": self.method,
                "directions": {str(i): [float(x) for x in v] for i, v in sorted(self.directions.items())},
                "metadata": self.metadata}


def check_vector_output(path: str | Path) -> None:
    """Refuse an output that would overwrite anything but an earlier steering vector.

    Raises:
        SterError: ``path`` is a directory; its name does not end in .json (a steering vector is a JSON
            file, named so: ``--vector`` and ``read_vector`` refuse a .safetensors name, and an artifact
            named v.txt or v would be taken for something else); an existing file that is not a steering
            vector (a capture sidecar, prompts, an adapter, anything else).
    """
    check_path_name(path, "--output")
    path = Path(path)
    if path.is_dir():
        raise SterError(f"--output {path} is a directory; give the steering vector's file name (NAME.json)")
    if path.suffix.lower() != ".json":  # v.safetensors: read_vector refuses the name, the vector would be unusable
        raise SterError(f"--output {path}: a steering vector is a JSON file named NAME.json; name it "
                        f"{(path.with_suffix('.json') if path.suffix else path.with_name(path.name + '.json')).name}")
    check_folder(path)
    if path.exists():
        try:
            doc = read_json(path, "steering vector")
        except SterError:
            doc = None
        if not (isinstance(doc, dict) and sniff(doc, path) == "steering"):
            raise SterError(f"--output {path} exists and is not a steering vector; choose another --output name "
                            "or move that file")


def check_direction(v: np.ndarray, width: int, where: str, layer) -> None:
    """Refuse a direction that is not ``width`` finite numbers of unit norm (what ``read_vector`` accepts).

    Raises:
        SterError naming ``where`` and ``layer``.
    """
    if v.shape != (width,):
        raise SterError(f"{where}: layer {layer} has {v.size} values, but hidden_size is {width}")
    if not np.isfinite(v).all():
        raise SterError(f"{where}: layer {layer} holds non-finite values (NaN or infinity)")
    norm = float(np.linalg.norm(v.astype(np.float64)))
    if abs(norm - 1.0) > UNIT_TOLERANCE:
        raise SterError(f"{where}: layer {layer} has norm {norm:.6g}; directions must be unit "
                        "vectors (the strength is given with --strength)")


def write_vector(vec: SteeringVector, path: str | Path) -> Path:
    """Write ``vec`` as JSON at ``path`` atomically (temporary file, then rename).

    ``path`` must end in .json; an earlier steering vector at ``path`` is replaced; anything else
    is refused (:func:`check_vector_output`).

    Raises:
        SterError: ``vec`` not a ``SteeringVector`` or ``path`` not a path; ``check_vector_output``'s
            refusals; anything ``read_vector`` would refuse in the file (a direction that is not
            ``hidden_size`` finite numbers of unit norm, a layer that is not a whole number 0 or more,
            no direction at all, a trait or method that is not text, metadata JSON cannot hold such as
            NaN or objects); text UTF-8 cannot encode (a lone surrogate): nothing is written then.
    """
    if not isinstance(vec, SteeringVector):
        raise SterError(f"write_vector takes a SteeringVector (caa, pca or read_vector), got {type(vec).__name__}")
    check_path_arg(path, "write_vector", "the steering vector's output path (NAME.json)")
    path = Path(path)
    for layer, d in sorted(vec.directions.items(), key=lambda item: str(item[0])):
        check_direction(np.asarray(d), vec.hidden_size, f"the steering vector for {path}", layer)
    try:   # strict JSON: a NaN in metadata would be written as NaN, which JSON readers other than Python's refuse
        text = json.dumps(vec.to_json(), ensure_ascii=False, allow_nan=False)
        data = (text + "\n").encode("utf-8")
    except UnicodeEncodeError as e:   # was a traceback once the temporary file was open
        raise SterError(f"the steering vector for {path} cannot be written: its text holds the lone surrogate "
                        f"U+{ord(text[e.start]):04X}, which UTF-8 cannot encode (bytes that are not UTF-8 in an "
                        "argument: the trait or a capture's file name); give real characters") from None
    except (TypeError, ValueError) as e:
        raise SterError(f"the steering vector for {path} cannot be written as JSON: {e}; its metadata must hold "
                        "only text, finite numbers, booleans, null, lists and objects") from None
    vector_from_doc(json.loads(text), path)   # what read_vector would refuse is not written
    check_vector_output(path)
    with atomic_outputs(path) as (tmp,):
        tmp.write_bytes(data)
    return path


def read_vector(path: str | Path) -> SteeringVector:
    """Read and validate a steering artifact: a JSON file, as :func:`write_vector` writes it under a NAME.json
    name (a vector written under another name by an earlier ster is still read; a .safetensors file or a
    directory is refused).

    Raises:
        SterError (naming the path): not JSON; an adapter sidecar, reward or capture
            artifact instead; a wrong format or schema_version; a missing field; a field of the
            wrong type (model / model_revision not a string or null, method or trait not a
            string, metadata not an object); a layer key other than ASCII digits without a
            leading zero (two keys would name one layer); a direction that is not hidden_size
            finite numbers of unit norm; ``path`` None (or not a path).
    """
    check_path_arg(path, "read_vector", "the path of a steering vector's .json file")
    path = Path(path)
    if path.suffix == ".safetensors" or path.is_dir():
        hint = " (a LoRA adapter: pass it with --adapter)" if path.name.endswith(".lora.safetensors") or \
            (path.is_dir() and (path / "adapter_config.json").exists()) else ""
        raise SterError(f"--vector {path} is not a steering vector JSON file{hint}")
    return vector_from_doc(read_json(path, "steering vector"), path)


def vector_from_doc(doc, path: Path) -> SteeringVector:
    """The ``SteeringVector`` a steering artifact's JSON document ``doc`` holds (``read_vector``'s checks;
    ``write_vector`` runs them on what it is about to write). Raises SterError naming ``path``."""
    kind = sniff(doc, path)
    if kind != "steering":
        raise SterError(f"--vector {path} is {KIND_WORDS[kind]}, not a steering vector")
    if doc.get("format") != STEERING_FORMAT:
        raise SterError(f"steering vector {path} has format {doc.get('format')!r}; expected {STEERING_FORMAT!r}")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise SterError(f"steering vector {path} has schema_version {doc.get('schema_version')!r}; "
                        f"this ster reads version {SCHEMA_VERSION}")
    for key in ("hidden_size", "directions", "method"):
        if key not in doc:
            raise SterError(f"steering vector {path} lacks the field {key!r}")
    width = doc["hidden_size"]
    if isinstance(width, bool) or not isinstance(width, int) or width <= 0:
        raise SterError(f"steering vector {path}: hidden_size must be a positive integer, got {json_value(width)}")
    check_model_fields(doc, f"steering vector {path}", REBUILD)
    if not isinstance(doc["method"], str):
        raise SterError(f"steering vector {path}: method must be a string, got {json_value(doc['method'])}; "
                        f"{REBUILD}")
    if doc.get("trait") is not None and not isinstance(doc["trait"], str):
        raise SterError(f"steering vector {path}: trait must be a string, got {json_value(doc['trait'])}; {REBUILD}")
    if doc.get("metadata") is not None and not isinstance(doc["metadata"], dict):
        raise SterError(f"steering vector {path}: metadata must be an object, got {json_value(doc['metadata'])}; "
                        f"{REBUILD}")
    from .chat import check_surrogates

    for key in ("model", "model_revision", "trait", "method"):   # recorded again by capture, generate --json, chat:
        if isinstance(doc.get(key), str):                     # a "\ud800" escape was a UnicodeEncodeError there
            check_surrogates(doc[key], f"steering vector {path}: {key}")
    if not isinstance(doc["directions"], dict) or not doc["directions"]:
        raise SterError(f"steering vector {path}: directions must be a non-empty object of layer -> vector")
    directions = {}
    for key, values in doc["directions"].items():
        if not LAYER_KEY.fullmatch(key):
            raise SterError(f"steering vector {path}: layer key {key[:50]!r}{'...' if len(key) > 50 else ''} is not "
                            "a non-negative integer as ster writes it (ASCII digits, no leading zero, at most 9 "
                            f"digits); {REBUILD}")
        if int(key) >= MAX_LAYERS:   # no model ster runs has it; `vector export` would write a layer count past it
            raise SterError(f"steering vector {path}: layer {key} is past any model ster runs (at most {MAX_LAYERS} "
                            f"layers); {REBUILD}")
        if not isinstance(values, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                   for x in values):
            raise SterError(f"steering vector {path}: layer {key} is not a list of real numbers")
        try:
            v = np.asarray(values, dtype=np.float64)
        except OverflowError:  # an integer beyond float64 (10**400)
            raise SterError(f"steering vector {path}: layer {key} holds a number beyond float range (a direction's "
                            f"values lie in -1..1); {REBUILD}") from None
        check_direction(v, width, f"steering vector {path}", key)
        directions[int(key)] = v.astype(np.float32)
    return SteeringVector(doc.get("model"), doc.get("model_revision"), width, doc.get("trait") or "",
                          doc["method"], directions, doc.get("metadata") or {})


def check_vector_for(vec: SteeringVector, loaded, path: str | Path) -> None:
    """Refuse ``vec`` for ``loaded`` when it was made for another model or width, or names a
    layer the model does not have. Raises SterError naming the path and the mismatch."""
    check_vector_fit(vec, loaded.resolved, loaded.spec, path)


def check_vector_fit(vec: SteeringVector, resolved, spec, path: str | Path) -> None:
    """:func:`check_vector_for` before the model is loaded: against its ``Resolved`` and its
    ``ModelSpec`` from config.json or GGUF metadata (``spec`` None: a preset not fetched yet,
    whose identity alone is checked). Use it as ``load_model(..., check=...)``.

    Raises:
        SterError (naming the path): made for another model or revision; another hidden
            width; a layer the model does not have.
    """
    check_model(Path(path), "steering vector", vec.model, vec.model_revision, resolved)
    if spec is None:
        return
    if vec.hidden_size != spec.hidden_size:
        raise SterError(f"steering vector {path} is {vec.hidden_size} wide, but this model's hidden_size is "
                        f"{spec.hidden_size}")
    n = spec.num_hidden_layers
    bad = [i for i in vec.directions if i >= n]
    if bad:
        raise SterError(f"steering vector {path} names layer {bad[0]}, but this model has layers 0..{n - 1}")


def checked_vector(vec: SteeringVector, where: str) -> SteeringVector:
    """``vec``, built in memory, as ``read_vector`` would read it from a file: ``vector_from_doc``'s checks run on
    its fields (directions: a non-empty dict of layer numbers 0 or more -> ``hidden_size`` finite real numbers of
    unit norm; trait and method text; model and model_revision text or None). Lists and numpy arrays of any real
    dtype are taken; the result holds float32 arrays under int layers. ``metadata`` is not looked at.

    Raises:
        SterError naming ``where`` (a layer that is not an int, such as "1"; complex or non-finite values;
        whatever ``vector_from_doc`` refuses).
    """
    import numbers

    directions, width = vec.directions, vec.hidden_size
    if isinstance(directions, dict):
        for layer in directions:
            if not isinstance(layer, numbers.Integral) or isinstance(layer, bool):
                raise SterError(f"steering vector {where}: layer {json_value(layer)} is not a layer number; "
                                "directions map int layers (0-based) to vectors")
        directions = {str(int(layer)): _plain(values) for layer, values in directions.items()}
    if isinstance(width, numbers.Integral) and not isinstance(width, bool):
        width = int(width)   # numpy's integers too
    doc = {"format": STEERING_FORMAT, "schema_version": SCHEMA_VERSION, "model": vec.model,
           "model_revision": vec.model_revision, "hidden_size": width, "trait": vec.trait, "method": vec.method,
           "directions": directions}
    return vector_from_doc(doc, where)


def _plain(values):
    """A direction's values as JSON would hold them (numpy's numbers as Python's), for ``vector_from_doc``."""
    try:
        return np.asarray(values).tolist()
    except (TypeError, ValueError):   # ragged lists: vector_from_doc says what is wrong
        return values


def _scaled_directions(vec, strength, func: str, where: str = "") -> tuple[SteeringVector, dict[int, np.ndarray]]:
    """``vec`` checked as ``read_vector`` checks a file, and ``strength`` times each of its directions (float32), for
    ``func`` (``steering_hook``, ``export_control_vector``).

    Raises:
        SterError: ``vec`` not a ``SteeringVector`` or one ``checked_vector`` refuses; a strength that is not a
            finite number (``"x"``, None, True), or one whose product with a direction overflows float32.
    """
    import numbers

    if not isinstance(vec, SteeringVector):
        raise SterError(f"{func} takes a SteeringVector (caa, pca or read_vector), got {type(vec).__name__}")
    vec = checked_vector(vec, f"given to {func}")
    if isinstance(strength, bool) or not isinstance(strength, numbers.Real) or not math.isfinite(strength):
        raise SterError(f"--strength must be a finite number, got {strength!r}")
    with np.errstate(over="ignore"):
        adds = {i: (np.float32(strength) * v).astype(np.float32) for i, v in vec.directions.items()}
    if not all(np.isfinite(a).all() for a in adds.values()):
        raise SterError(f"--strength {strength:g} times the vector's directions overflows float32{where}; use a "
                        "smaller strength")
    return vec, adds


def steering_hook(vec: SteeringVector, strength: float):
    """A ``layer_hook(i, h) -> h`` adding ``strength * directions[i]`` to every row of h
    (float32 [T, hidden_size]) after each covered layer; other layers pass unchanged.

    The hook declares the vector's ``layers`` and ``width``, so that ``generate``, ``Session.reply`` and
    ``Decoder.forward`` refuse it before any work for a model without one of those layers or of another
    width (``decoder.model.check_layer_hook``): a layer past the model's last is never reached, and the
    vector would change nothing, silently.

    Raises:
        SterError: ``vec`` not a ``SteeringVector``, or one ``read_vector`` would refuse (:func:`checked_vector`:
            a layer that is not an int, a direction that is not ``hidden_size`` finite real numbers of unit norm,
            a trait or method that is not text); a strength that is not a finite number, or one whose
            product with a direction overflows float32; when the hook runs, a stream of another width
            than the vector's (a vector made for another model).
    """
    vec, adds = _scaled_directions(vec, strength, "steering_hook", " (the residual stream's type)")

    def hook(i: int, h: np.ndarray) -> np.ndarray:
        add = adds.get(i)
        if add is not None and h.shape[-1] != add.shape[0]:
            raise SterError(f"the steering vector is {add.shape[0]} wide and this model's residual stream "
                            f"{h.shape[-1]}: it was made for another model")
        return h if add is None else h + add

    hook.layers = tuple(sorted(adds))
    hook.width = vec.hidden_size
    return hook


def _check_names(trait, sources, method: str) -> None:
    """Refuse a ``trait`` that is not text (``write_vector`` would refuse the vector built) or ``sources`` that are
    not two texts (the capture paths recorded in metadata), before any capture is read."""
    if not isinstance(trait, str):
        raise SterError(f"{method}: trait must be text (what the vector steers toward), got {json_value(trait)}")
    if not (isinstance(sources, (tuple, list)) and len(sources) == 2 and all(isinstance(s, str) for s in sources)):
        raise SterError(f"{method}: sources must be a pair of texts (the positive and negative capture paths), "
                        f"got {json_value(sources)}")


def _check_captures(positive, negative, sources: tuple[str, str], *, states: bool) -> None:
    """Refuse a capture whose sidecar fields (``states`` False) or states (True) are malformed or hold NaN or
    infinity (numpy's SVD never returns on those): ``load_capture`` refuses such files, this covers captures
    built in memory."""
    from .capture import Capture, check_sidecar, check_states

    for cap, side, source in ((positive, "positive", sources[0]), (negative, "negative", sources[1])):
        where = f"the {side} capture" + (f" {source}" if source else "")
        if not isinstance(cap, Capture):
            raise SterError(f"{where} is a {type(cap).__name__}, not a Capture (capture.capture or load_capture)")
        if states:
            check_states(cap, where)
        else:
            check_sidecar(cap.meta, where)


def _check_pair(positive, negative, trait, sources, method: str) -> tuple[dict, dict]:
    """The checks ``caa`` and ``pca`` share, before any state is read: the names (``_check_names``), both
    sidecars (``_check_captures``), one model, revision and width, one position rule, one encoding
    (``_check_same_encoding``) and one steering (``_check_same_steering``). Returns the two sidecars."""
    _check_names(trait, sources, method)
    _check_captures(positive, negative, sources, states=False)
    pm, nm = positive.meta, negative.meta
    for key in ("model", "model_revision", "hidden_size"):
        if pm.get(key) != nm.get(key):
            raise SterError(f"the captures disagree on {key}: positive {pm.get(key)!r}, negative {nm.get(key)!r}; "
                            "capture both sides with the same model")
    if pm.get("position") != nm.get("position"):
        raise SterError(f"the captures use different --position rules (positive {pm.get('position')}, "
                        f"negative {nm.get('position')}); capture both sides the same way")
    _check_same_encoding(pm, nm)
    _check_same_steering(pm, nm)
    return pm, nm


def _check_same_encoding(pm: dict, nm: dict) -> None:
    """Refuse captures whose prompts were encoded differently: one through the model's chat template, the other
    as raw text (``--chat-template``). Their states differ by the template (at position ``last`` another
    token entirely), far more than by the trait: on SmolLM2 such a CAA direction is nearly orthogonal to the
    direction of the same prompts encoded alike. "off" and "absent" (no template) are both raw text."""
    raw = {"off", "absent"}
    a, b = pm.get("chat_template"), nm.get("chat_template")
    if isinstance(a, str) and isinstance(b, str) and a != b and not (a in raw and b in raw):
        shown = {"applied": "through the chat template", "off": "as raw text (chat template off)",
                 "absent": "as raw text (no template)"}
        raise SterError(f"the captures encode their prompts differently (positive {shown.get(a, a)}, negative "
                        f"{shown.get(b, b)}): the difference would be the template's, not the trait's; capture "
                        "both sides with the same --chat-template")


def _check_same_steering(pm: dict, nm: dict) -> None:
    """Refuse captures made under different steering (``capture``'s vector or layer_hook, the sidecar's
    ``steering``; a capture without the field ran unsteered): their difference would hold the steering's
    own effect beside the trait's."""
    a, b = pm.get("steering"), nm.get("steering")
    if a != b:
        def shown(st):
            if not isinstance(st, dict):
                return "unsteered"
            if st.get("layer_hook"):
                return "under a layer_hook"
            name, k = str(st.get("trait") or st.get("vector_path") or "a vector")[:80], st.get("strength")
            shown_k = f"{k:g}" if isinstance(k, (int, float)) and not isinstance(k, bool) else str(k)[:20]
            return f"steered by {name!r} at strength {shown_k}"
        raise SterError(f"the captures ran under different steering (positive {shown(a)}, negative {shown(b)}): "
                        "capture both sides alike")


def _shared_layers(positive, negative, layers) -> list[int]:
    """The layers both captures hold, or ``layers`` of them (whole numbers; SterError otherwise)."""
    import numbers

    common = sorted(set(positive.layers) & set(negative.layers))
    if layers is None:
        return common
    if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__") or not all(
            isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in layers):
        raise SterError(f"layers must be a list of layer numbers, got {str(layers)[:60]}")
    missing = sorted(set(layers) - set(common))
    if missing:
        raise SterError(f"layer {missing[0]} is not in both captures (they share {common})")
    return sorted(set(int(i) for i in layers))


def caa(positive, negative, *, trait: str = "", layers=None, sources: tuple[str, str] = ("", "")) -> SteeringVector:
    """Build a steering vector by contrastive activation addition from two captures.

    Args:
        positive, negative: ``capture.Capture`` objects from the same model (same
            model, model_revision, hidden_size); their common layers are used.
        trait: a free-text name for what the vector steers toward.
        layers: optional subset of layers.
        sources: the two capture paths, recorded in metadata.

    Returns:
        A vector whose direction at layer i is normalize(mean(positive rows) - mean(negative rows)),
        computed in float64. metadata records per layer the raw difference norm and the mean
        residual norm, the position rule and the prompt counts.

    Raises:
        SterError: a trait that is not text, sources that are not two texts; a malformed capture
            (``capture.check_sidecar``, ``check_states``: NaN or infinity among
            its states); captures of different models, widths or position rules, or one encoded through the
            chat template and the other as raw text, or run under
            different steering (``capture``'s vector); no common layer; a zero difference (identical sides).
    """
    pm, nm = _check_pair(positive, negative, trait, sources, "caa")
    common = _shared_layers(positive, negative, layers)
    if not common:
        raise SterError(f"the captures share no layer (positive {positive.layers}, negative {negative.layers})")
    _check_captures(positive, negative, sources, states=True)
    directions, raw, resid = {}, {}, {}
    for i in common:
        p, n = positive.rows(i).astype(np.float64), negative.rows(i).astype(np.float64)
        d = p.mean(axis=0) - n.mean(axis=0)
        norm = float(np.linalg.norm(d))
        if norm == 0.0:
            raise SterError(f"layer {i}: the positive and negative captures have the same mean; "
                            "use prompts that differ in the trait")
        directions[i] = (d / norm).astype(np.float32)
        raw[str(i)] = norm
        resid[str(i)] = float(np.linalg.norm(np.concatenate([p, n]), axis=1).mean())
    meta = {"position": pm.get("position"), "chat_template": [pm.get("chat_template"), nm.get("chat_template")],
            "steering": pm.get("steering"),
            "model_type": pm.get("model_type"),
            "positive": sources[0], "negative": sources[1],
            "positive_prompts": len(pm.get("prompts", [])), "negative_prompts": len(nm.get("prompts", [])),
            "difference_norms": raw, "residual_norms": resid, "precision": pm.get("precision"),
            "layer_numbering": "layer i = residual stream after decoder layer i (0-based), as in ster capture"}
    return SteeringVector(pm.get("model"), pm.get("model_revision"), int(pm["hidden_size"]), trait, "caa",
                          directions, meta)


def pca(positive, negative, *, trait: str = "", layers=None, sources: tuple[str, str] = ("", "")) -> SteeringVector:
    """Build a steering vector by PCA of paired differences from two captures.

    Args:
        positive, negative: ``capture.Capture`` objects of the same model and position rule (``last`` or
            ``mean``: one row per prompt), with as many prompts on each side; prompt j of each side form
            pair j.
        trait, layers, sources: as for ``caa``.

    Returns:
        A vector whose direction at layer i is the unit first principal axis (float64 SVD) of the
        differences positive_j - negative_j (rows with every element within 1e-6 of zero are left out,
        as llama.cpp filters them), signed so that the majority of pairs project positive (ties: the
        mean difference projects positive). metadata records the pair count and, per layer, the share
        of the differences' squared norm the axis explains and the share of pairs on its positive side.

    Raises:
        SterError: a trait that is not text, sources that are not two texts; a malformed capture
            (``capture.check_sidecar``, ``check_states``: NaN or infinity among
            its states); captures of different models, widths or position rules, or one encoded through the
            chat template and the other as raw text, or run under different steering; ``all``-position captures
            (no pairing); unequal prompt counts; no common layer; a layer whose differences are all zero.
    """
    pm, nm = _check_pair(positive, negative, trait, sources, "pca")
    if pm.get("position") == "all":
        raise SterError("PCA pairs prompt j of each side: capture with --position last or mean (one row per prompt), "
                        "not all")
    n_pos, n_neg = len(pm.get("prompts", [])), len(nm.get("prompts", []))
    if n_pos != n_neg or n_pos == 0:
        raise SterError(f"PCA needs paired prompts: the positive capture has {n_pos}, the negative {n_neg}; give "
                        "both sides the same number of prompts, in pair order")
    common = _shared_layers(positive, negative, layers)
    if not common:
        raise SterError(f"the captures share no layer (positive {positive.layers}, negative {negative.layers})")
    _check_captures(positive, negative, sources, states=True)
    directions, explained, agree = {}, {}, {}
    for i in common:
        d = positive.rows(i).astype(np.float64) - negative.rows(i).astype(np.float64)
        d = d[np.abs(d).max(axis=1) > 1e-6]
        if not len(d):
            raise SterError(f"layer {i}: every positive prompt's state equals its negative's; use pairs that differ "
                            "in the trait")
        _, sv, vt = np.linalg.svd(d, full_matrices=False)
        v = vt[0]
        proj = d @ v
        if (proj > 0).sum() < (proj < 0).sum() or ((proj > 0).sum() == (proj < 0).sum() and proj.sum() < 0):
            v, proj = -v, -proj
        directions[i] = (v / np.linalg.norm(v)).astype(np.float32)
        explained[str(i)] = float(sv[0] ** 2 / (sv ** 2).sum())
        agree[str(i)] = float((proj > 0).mean())
    meta = {"position": pm.get("position"), "chat_template": [pm.get("chat_template"), nm.get("chat_template")],
            "steering": pm.get("steering"),
            "model_type": pm.get("model_type"), "positive": sources[0], "negative": sources[1], "pairs": n_pos,
            "explained": explained, "positive_side": agree, "precision": pm.get("precision"),
            "layer_numbering": "layer i = residual stream after decoder layer i (0-based), as in ster capture"}
    return SteeringVector(pm.get("model"), pm.get("model_revision"), int(pm["hidden_size"]), trait, "pca",
                          directions, meta)


def control_vector_hint(vec: SteeringVector) -> str:
    """llama.cpp's ``controlvector.model_hint``: the model's GGUF architecture when the vector records its
    model_type (else the model_type, else empty)."""
    from .families import FAMILIES

    model_type = vec.metadata.get("model_type") if isinstance(vec.metadata, dict) else None
    if not isinstance(model_type, str):   # a file's "model_type": 5 was written as a GGUF integer
        return ""
    family = FAMILIES.get(model_type)
    return (family.gguf_arch if family is not None and family.gguf_arch else model_type) or ""


def check_control_vector_output(path: str | Path) -> None:
    """Refuse a control-vector output that would overwrite anything but an earlier control vector.

    The name must end in ``.gguf`` (llama.cpp's ``--control-vector`` takes a GGUF file); an existing file is
    replaced only when it is a GGUF file whose ``general.architecture`` is ``controlvector``.

    Raises:
        SterError: ``path`` does not end in .gguf, is a directory, or exists and is not a control-vector GGUF
            (the steering vector itself, a capture, a model, anything else).
    """
    from .gguf.reader import GGUFFile

    check_path_name(path, "--output")
    path = Path(path)
    if path.is_dir():
        raise SterError(f"--output {path} is a directory; give the control vector's file name (NAME.gguf)")
    if path.suffix != ".gguf":
        raise SterError(f"--output {path}: a control vector is written as GGUF; name it "
                        f"{path.with_suffix('.gguf').name if path.suffix else path.name + '.gguf'}")
    check_folder(path)
    if os.path.lexists(path):
        try:
            with GGUFFile(path, allow_unsupported=True) as g:
                arch = g.metadata.get("general.architecture")
        except (SterError, OSError, ValueError):
            arch = None
        if arch != "controlvector":
            raise SterError(f"--output {path} exists and is not a control-vector GGUF; choose another --output "
                            "name or move that file")


def describe_control_vector(g) -> dict | None:
    """What a llama.cpp control vector (``general.architecture`` controlvector) holds, or None for any other GGUF.

    Args:
        g: the open ``GGUFFile``.
    Returns:
        {"layers": sorted layer numbers of its ``direction.N`` tensors, "hidden_sizes": sorted widths,
        "model_hint": ``controlvector.model_hint`` or None, "text": one phrase saying all of it}.
    """
    if g.metadata.get("general.architecture") != "controlvector":
        return None
    from .capture import format_layers

    # ASCII digits only: str.isdigit() is also true of "²" (which int() refuses) and "٣" (which it reads as 3)
    numbers = [n.split(".", 1)[1] for n in g.tensors
               if n.startswith("direction.") and re.fullmatch(r"[0-9]{1,9}", n.split(".", 1)[1])]
    layers = sorted(int(k) for k in numbers)
    widths = sorted({int(g.tensors[f"direction.{k}"].shape[-1]) for k in numbers})
    hint = g.metadata.get("controlvector.model_hint")
    hint = str(hint)[:200] if hint is not None else None
    size = (f"of hidden size {widths[0]}" if len(widths) == 1 else
            f"of hidden sizes {', '.join(map(str, widths[:3]))}{', ...' if len(widths) > 3 else ''}" if widths
            else "(no direction.N tensors)")
    shown = f" ({format_layers(layers).rsplit(' (', 1)[0]})" if layers else ""
    text = (f"a llama.cpp control vector (as `ster vector export` writes) for {len(layers)} "
            f"layer{'' if len(layers) == 1 else 's'}{shown} {size}"
            + (f", made for a {hint[:40]!r} model" if hint else ""))
    return {"layers": layers, "hidden_sizes": widths, "model_hint": hint, "text": text}


#: How a control vector is used, said where one is given in place of a model.
CONTROL_VECTOR_USE = ("llama.cpp loads it with --control-vector beside the model, and ster steers with the JSON "
                      "vector it was exported from (ster generate --vector FILE.json)")


def refuse_control_vector(g, path) -> None:
    """Refuse a llama.cpp control vector (``general.architecture`` controlvector) given where a model is wanted,
    saying what the file is: its ``direction.N`` tensors' count, layers and width (``describe_control_vector``).

    Args:
        g: the open ``GGUFFile``; path: the name to show.

    Raises:
        SterError: the file is a control vector (returns quietly for any other GGUF).
    """
    cv = describe_control_vector(g)
    if cv is not None:
        raise SterError(f"{path} is not a model: it is {cv['text']}; {CONTROL_VECTOR_USE}")


def export_control_vector(vec: SteeringVector, path: str | Path, *, strength: float = 1.0,
                          model_hint: str | None = None) -> dict:
    """Write ``vec`` as llama.cpp's control-vector GGUF, atomically.

    Each covered layer N >= 1 becomes the F32 tensor ``direction.N`` = strength * direction (llama.cpp adds it,
    times its own scale, to the output of layer N: loaded at scale 1 it steers as ``ster generate --vector
    --strength`` does). Metadata: ``general.architecture = "controlvector"``, ``controlvector.model_hint`` and
    ``controlvector.layer_count`` (int32, the tensors written), as llama.cpp's cvector-generator writes them.

    Returns:
        {"output", "layers" (written), "skipped" (layer 0, which llama.cpp cannot steer, when present),
        "strength", "model_hint"}.

    Raises:
        SterError: an output that is not a new or earlier control vector's .gguf name
            (:func:`check_control_vector_output`); ``vec`` not a ``SteeringVector`` (or one ``read_vector`` would
            refuse); a strength that is not a finite number or one that overflows float32; a vector covering no
            layer but 0; a ``model_hint`` that is not text UTF-8 can encode.
    """
    from .chat import check_surrogates
    from .gguf.writer import TensorEntry, Typed, write_gguf

    check_control_vector_output(path)
    checked, data = _scaled_directions(vec, strength, "export_control_vector")   # vec keeps the metadata (the hint)
    layers = sorted(i for i in checked.directions if i >= 1)
    if not layers:
        raise SterError("this steering vector covers only layer 0, which llama.cpp's control vectors cannot steer "
                        "(they start after layer 1's input); build it over later layers")
    if model_hint is not None and not isinstance(model_hint, str):   # was written as a GGUF integer
        raise SterError(f"--model-hint must be text (a GGUF architecture name), got {json_value(model_hint)}")
    hint = control_vector_hint(vec) if model_hint is None else model_hint
    # "\udcff" (an argument's bytes, or a vector file's "\ud800" escape) was a UnicodeEncodeError traceback
    check_surrogates(hint, "--model-hint" if model_hint is not None else "the vector's metadata model_type (the "
                     "GGUF's model_hint)")
    meta = {"general.architecture": "controlvector", "controlvector.model_hint": hint,
            "controlvector.layer_count": Typed("int32", len(layers))}
    entries = [TensorEntry(f"direction.{i}", (checked.hidden_size,), "F32", lambda a=data[i]: a.view(np.uint8))
               for i in layers]
    write_gguf(path, meta, entries)
    return {"output": str(path), "layers": layers, "skipped": [0] if 0 in checked.directions else [],
            "strength": strength, "model_hint": hint}
