"""LoRA adapters: read Ster's and PEFT's layouts, check them against a model, apply at run time.

LoRA (Hu et al. 2021): a projection W [out, in] gains ``scale * B @ A`` with
A [rank, in], B [out, rank]; ``scale = alpha / rank``, or ``alpha / sqrt(rank)``
under rank-stabilised LoRA (rsLoRA, Kalajdzievski 2023; PEFT's ``use_rslora``).

Layouts accepted:

- Ster: ``NAME.lora.safetensors`` with ``layers.{layer}.{target}.a`` [rank, in] and
  ``layers.{layer}.{target}.b`` [out, rank], and ``NAME.lora.json`` with model,
  model_revision, rank, alpha, targets, layers, hidden_size (optional ``rslora``).
  Targets are q, k, v, o, gate, up, down (q_proj ... down_proj are accepted too).
- PEFT: a directory with ``adapter_config.json`` (peft_type LORA) and
  ``adapter_model.safetensors`` whose keys are
  ``base_model.model.<module>.lora_A.weight`` / ``lora_B.weight`` (PEFT's
  ``get_peft_model_state_dict`` naming), plain LoRA or rsLoRA. A LoRA on a fused
  module (Phi-3's qkv_proj and gate_up_proj, GPT-2's c_attn, GPT-NeoX's
  query_key_value) is split by role: each role keeps the rows of B the decoder's
  split gives it, and shares A. As PEFT, only the modules the config targets are
  adapted (``target_modules``, ``layers_to_transform``, ``layers_pattern``,
  ``exclude_modules``: :func:`peft_targeting`); the file's factors of other modules
  are ignored, with a note. Other PEFT methods
  and LoRA variants that change the math (DoRA, trained biases, PiSSA-style
  initialisations that rewrite the base, per-module rank patterns, ...) are
  refused by name.

Run-time application wraps the decoder's projections (``layer.q`` ... ``layer.down``)
with :class:`LoraLinear`; the decoder itself is unchanged.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from .artifacts import KIND_WORDS, check_model, read_json, sniff
from .errors import SterError
from .files import check_path_arg, check_path_name, file_kind, shown_value
from .steering import check_model_fields

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
ALIASES = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "gate_proj": "gate",
           "up_proj": "up", "down_proj": "down", **{t: t for t in TARGETS}}
PEFT_WEIGHTS = ("adapter_model.safetensors",)
# LoraConfig fields whose non-default value changes what the adapter computes.
PEFT_UNSUPPORTED = {
    "use_dora": "DoRA (use_dora)", "lora_bias": "LoRA biases (lora_bias)", "fan_in_fan_out": "fan_in_fan_out",
    "modules_to_save": "modules_to_save (fully trained modules)", "rank_pattern": "per-module rank_pattern",
    "alpha_pattern": "per-module alpha_pattern", "layer_replication": "layer_replication",
    "trainable_token_indices": "trainable_token_indices", "target_parameters": "target_parameters",
    "use_qalora": "QALoRA (use_qalora)", "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
    "use_bdlora": "use_bdlora", "arrow_config": "Arrow routing (arrow_config)", "kasa_config": "kasa_config",
    "velora_config": "velora_config", "monteclora_config": "MonteCLoRA (monteclora_config)",
    "megatron_config": "megatron_config",
}
# LoraConfig's boolean switches that change the math, read as JSON booleans only: PEFT tests them by truthiness,
# so a hand-written "false" (a string) would silently mean true.
PEFT_SWITCHES = ("use_rslora", "use_dora", "fan_in_fan_out", "lora_bias", "use_qalora")
# The safetensors dtypes PEFT and ster save factors in (PEFT keeps adapter weights in float32 by default, or in
# the model's float type); anything else (integers, booleans, complex numbers, float8) is not a trained LoRA.
FACTOR_DTYPES = ("F32", "F16", "BF16", "F64")
# Tensors PEFT saves for a LoRA of an embedding or of the output head: an embedding's factors, and (its
# save_embedding_layers default for such an adapter) the module's whole weight beside its factors.
PEFT_OTHER_TENSOR = re.compile(r"(.+)\.(lora_embedding_[AB](?:\.[A-Za-z0-9_]+)?|base_layer\.weight)")


@dataclass
class LoraAdapter:
    """A LoRA adapter in memory.

    ``factors[(layer, target)] = (A float32 [rank, in], B float32 [out, rank])``; the
    delta of that projection is ``scale * B @ A``.
    """

    path: Path
    layout: str  # "ster" | "peft"
    model: str | None
    model_revision: str | None
    rank: int
    alpha: float
    rslora: bool
    hidden_size: int | None
    factors: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    #: what the user should see about the fit (a PEFT adapter naming another base model), one line each
    notes: list[str] = field(default_factory=list)

    @property
    def scale(self) -> float:
        return self.alpha / math.sqrt(self.rank) if self.rslora else self.alpha / self.rank

    @property
    def targets(self) -> list[str]:
        return [t for t in TARGETS if any(k[1] == t for k in self.factors)]

    @property
    def layers(self) -> list[int]:
        return sorted({k[0] for k in self.factors})

    def delta(self, layer: int, target: str) -> np.ndarray:
        """float32 [out, in]: scale * B @ A, accumulated in float32."""
        a, b = self.factors[(layer, target)]
        return (b @ a) * np.float32(self.scale)


def _locate(path: Path) -> tuple[str, Path, Path]:
    """(layout, JSON file, weights file) for an adapter given as a file, a NAME prefix or a directory."""
    p = Path(path)
    if p.is_dir():
        if (p / "adapter_config.json").exists():  # a FIFO there too: read_json says what it is
            return "peft", p / "adapter_config.json", p / PEFT_WEIGHTS[0]
        loras = sorted(p.glob("*.lora.json"))
        if len(loras) == 1:
            return "ster", loras[0], loras[0].with_name(loras[0].name[: -len(".json")] + ".safetensors")
        raise SterError(f"--adapter {p} is a directory without adapter_config.json (PEFT) or one NAME.lora.json "
                        "(Ster); pass the adapter directory or its .lora.json file")
    if (kind := file_kind(p)) is not None:   # a FIFO, a device: said so, not called missing or "not an adapter"
        raise SterError(f"--adapter {p} is {kind}, not a regular file; pass the adapter's .lora.json file or its "
                        "directory")
    name = p.name
    if ".reward." in name:
        raise SterError(f"--adapter {p} is {KIND_WORDS['reward']}; only LoRA adapters can be applied or merged")
    if name == "adapter_config.json":
        return "peft", p, p.with_name(PEFT_WEIGHTS[0])
    if name == "adapter_model.safetensors":
        return "peft", p.with_name("adapter_config.json"), p
    if name.endswith(".lora.json"):
        return "ster", p, p.with_name(name[: -len(".json")] + ".safetensors")
    if name.endswith(".lora.safetensors"):
        return "ster", p.with_name(name[: -len(".safetensors")] + ".json"), p
    if not p.exists() and Path(str(p) + ".lora.json").exists():
        return "ster", Path(str(p) + ".lora.json"), Path(str(p) + ".lora.safetensors")
    if p.suffix == ".json" and p.is_file():
        return "json", p, p  # sniffed below: say what it is rather than "not an adapter"
    if not p.exists():
        raise SterError(f"--adapter {p} does not exist")
    raise SterError(f"--adapter {p} is not a LoRA adapter: expected NAME.lora.json / NAME.lora.safetensors "
                    "(Ster) or a directory with adapter_config.json (PEFT)")


def _load_tensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of an adapter's safetensors file; refuses a factor that is not floating point by its header,
    before reading it (a complex one would lose its imaginary part to a mere warning, an integer one be widened)."""
    from safetensors import safe_open

    if not path.is_file():
        kind = file_kind(path)
        raise SterError(f"adapter weights {path} are missing" if kind is None else
                        f"adapter weights {path} are {kind}, not a regular file; put the safetensors file there")
    try:
        with safe_open(str(path), framework="numpy") as f:
            for k in f.keys():
                dtype = f.get_slice(k).get_dtype()
                if dtype not in FACTOR_DTYPES:
                    raise SterError(f"adapter weights {path}: tensor {k!r} is stored as {dtype}; LoRA factors must "
                                    f"be floating point ({', '.join(FACTOR_DTYPES)}, as PEFT and ster save them); "
                                    "save the adapter's factors as float32")
            return {k: f.get_tensor(k) for k in f.keys()}
    except SterError:
        raise
    except Exception as e:  # safetensors raises several types for a damaged file
        raise SterError(f"adapter weights {path} are not a readable safetensors file: {e}") from None


def _switch(doc: dict, key: str, where: str) -> bool:
    """A boolean switch of an adapter's JSON (absent or null: off).

    Raises:
        SterError: "WHERE: KEY must be true or false (a JSON boolean), got ..." for a string, a number, ...
    """
    value = doc.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise SterError(f"{where}: {key} must be true or false (a JSON boolean), got {str(value)[:40]!r}; "
                        "fix the adapter's JSON file")
    return value


def _peft_switches(cfg: dict, config_path: Path) -> dict[str, bool]:
    """PEFT_SWITCHES of an adapter_config.json, each refused unless a JSON boolean (or absent)."""
    return {key: _switch(cfg, key, f"PEFT adapter {config_path}") for key in PEFT_SWITCHES}


def _put_factor(pairs: dict, key: tuple[int, str], side: str, name: str, t: np.ndarray, weights: Path,
                what: str) -> None:
    """Record tensor ``name`` as factor ``side`` of ``key``; a second tensor for the same factor is refused."""
    slot = pairs.setdefault(key, {})
    if side in slot:  # e.g. "...q_proj.lora_A.weight" and "...q_proj.lora_A.other.weight": two adapters' factors
        raise SterError(f"adapter weights {weights}: tensors {slot[side][0]!r} and {name!r} are both the {what} of "
                        f"layer {key[0]} {key[1]}; a file must hold one adapter (PEFT's save_pretrained writes "
                        "each named adapter to its own directory), so keep one of them")
    slot[side] = (name, t)


def _check_factor(path: Path, where: str, a: np.ndarray, b: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray]:
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] != rank or b.shape[1] != rank:
        raise SterError(f"adapter {path}: {where} has factors A {list(a.shape)} and B {list(b.shape)}; "
                        f"expected A [rank={rank}, in] and B [out, rank={rank}]")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise SterError(f"adapter {path}: {where} holds non-finite values (NaN or infinity)")
    a, b = a.astype(np.float32), b.astype(np.float32)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):  # float64 values beyond float32's range
        raise SterError(f"adapter {path}: {where} holds values beyond float32's range (the type the adapter is "
                        "applied and merged in)")
    return a, b


def _check_deltas(ad: LoraAdapter) -> None:
    """Refuse an adapter whose delta ``scale * B @ A`` (float32) is not finite for some projection.

    Each |(B @ A)[i, j]| is at most sum_k max_i |B[i, k]| * max_j |A[k, j]|; a delta this bound keeps well inside
    float32 is finite without being computed (every real adapter), otherwise the delta itself is computed.

    Raises:
        SterError: naming the projection, the scale and the largest factors.
    """
    limit, scale = float(np.finfo(np.float32).max), abs(ad.scale)
    for (layer, target), (a, b) in sorted(ad.factors.items()):
        if a.size == 0 or b.size == 0:
            continue  # an empty product is zeros; its shape is refused against the model
        bound = float(np.abs(b).max(axis=0).astype(np.float64) @ np.abs(a).max(axis=1).astype(np.float64))
        # B @ A must fit as well as its scaled value; half the range leaves room for float32's rounding
        if bound * max(scale, 1.0) < limit / 2:
            continue
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused by name just below
            if np.isfinite(ad.delta(layer, target)).all():
                continue
        raise SterError(f"adapter {ad.path}: the delta of layer {layer} {target} (scale {ad.scale:g} * B @ A, "
                        f"largest |A| {float(np.abs(a).max()):g}, |B| {float(np.abs(b).max()):g}) overflows "
                        "float32, the type it is applied and merged in: the adapter's scale or factors are too "
                        "large; real adapters have small factors and an alpha near their rank")


def _check_alpha(alpha, rank: int, rslora: bool, where: str) -> float:
    """``alpha`` as a float, checked before any weight is read: a finite number whose scale (alpha / rank, or
    alpha / sqrt(rank) with rsLoRA) fits in float32, the type the delta is computed in.

    Raises:
        SterError: "WHERE must be a finite number, got ..." (a string, a bool, NaN, infinity, an integer too large
            for a float) or "... overflows float32" (alpha 1e39: the merged weights would be infinite).
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise SterError(f"{where} must be a finite number, got {str(alpha)[:40]!r}")
    try:
        value = float(alpha)
    except OverflowError:  # an integer beyond float64
        value = math.inf
    if not math.isfinite(value):
        raise SterError(f"{where} must be a finite number, got {str(alpha)[:40]}")
    scale = value / math.sqrt(rank) if rslora else value / rank
    if abs(scale) > float(np.finfo(np.float32).max):
        raise SterError(f"{where} {value:g} gives a LoRA scale of {scale:g}, which overflows float32 (the type the "
                        "weights are merged in); real adapters use an alpha near their rank")
    return value


def _read_ster(side: Path, weights: Path) -> LoraAdapter:
    doc = read_json(side, "adapter sidecar")
    for key in ("rank", "alpha", "targets", "layers", "hidden_size"):
        if key not in doc:
            raise SterError(f"adapter sidecar {side} lacks the field {key!r}")
    rank, alpha = doc["rank"], doc["alpha"]
    if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
        raise SterError(f"adapter sidecar {side}: rank must be a positive integer, got {rank!r}")
    check_model_fields(doc, f"adapter sidecar {side}", "fix the adapter's JSON file")  # (compared as paths)
    rslora = _switch(doc, "rslora", f"adapter sidecar {side}")
    alpha = _check_alpha(alpha, rank, rslora, f"adapter sidecar {side}: alpha")
    # Their shapes before their use: a number as targets or layers was a TypeError traceback, the text "qv"
    # passed as targets q and v, true as layer 1, and hidden_size "64" refused as "made for 64, this model's 64".
    if not isinstance(doc["targets"], list) or not all(isinstance(t, str) for t in doc["targets"]):
        raise SterError(f"adapter sidecar {side}: targets must be a list of projection names ({', '.join(TARGETS)}), "
                        f"got {str(doc['targets'])[:40]!r}")
    if not isinstance(doc["layers"], list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                      for i in doc["layers"]):
        raise SterError(f"adapter sidecar {side}: layers must be a list of layer numbers, got "
                        f"{str(doc['layers'])[:40]!r}")
    width = doc["hidden_size"]
    if isinstance(width, bool) or not isinstance(width, int) or width <= 0:
        raise SterError(f"adapter sidecar {side}: hidden_size must be a positive integer, got {str(width)[:40]!r}")
    targets = []
    for t in doc["targets"]:
        if t not in ALIASES:
            raise SterError(f"adapter sidecar {side}: target {t!r} is not one of {', '.join(TARGETS)}")
        targets.append(ALIASES[t])
    tensors = _load_tensors(weights)
    ad = LoraAdapter(side, "ster", doc.get("model"), doc.get("model_revision"), rank, float(alpha),
                     rslora, doc["hidden_size"])
    pattern = re.compile(r"layers\.(\d+)\.([a-z_]+)\.(a|b)")
    pairs: dict[tuple[int, str], dict[str, tuple[str, np.ndarray]]] = {}
    for name, t in tensors.items():
        m = pattern.fullmatch(name)
        if not m or m.group(2) not in ALIASES:
            raise SterError(f"adapter {weights}: tensor {name!r} is not layers.{{layer}}.{{target}}.a or .b")
        # q and q_proj name one projection
        _put_factor(pairs, (int(m.group(1)), ALIASES[m.group(2)]), m.group(3), name, t, weights,
                    f".{m.group(3)} factor")
    for (layer, target), ab in sorted(pairs.items()):
        if set(ab) != {"a", "b"}:
            raise SterError(f"adapter {weights}: layers.{layer}.{target} has only its .{next(iter(ab))} factor")
        if target not in targets or layer not in doc["layers"]:
            raise SterError(f"adapter {weights}: layers.{layer}.{target} is not among the sidecar's targets "
                            f"{doc['targets']} and layers {doc['layers']}")
        ad.factors[(layer, target)] = _check_factor(weights, f"layers.{layer}.{target}", ab["a"][1], ab["b"][1],
                                                    rank)
    if not ad.factors:
        raise SterError(f"adapter {weights} holds no LoRA factors")
    return ad


class WeightMap:
    """Where each adaptable projection of a model is stored, in the Hugging Face layout.

    A decoder role (q, k, v, o, gate, up, down) is stored under its own tensor, or as
    rows of a fused one (``qkv``: concatenated or grouped per key/value head;
    ``gate_up``: gate rows then up rows), possibly inputs-first ([in, out], GPT-2's
    Conv1D), possibly without the family's root prefix. ``decoder/layout.py`` splits
    these at load; this map places a LoRA delta back row by row (the same row order).

    Args:
        spec: a ``ModelSpec`` (dimensions).
        names, fused_qkv, inputs_first, root: the Hugging Face storage description
            (``ModelSpec`` fields of a config.json-loaded model, or the family's).
    """

    def __init__(self, spec, names: Mapping[str, str], fused_qkv: str | None = None, inputs_first: bool = False,
                 root: str | None = None):
        self.spec, self.names, self.fused_qkv = spec, dict(names), fused_qkv
        self.inputs_first, self.root = inputs_first, root

    @classmethod
    def of_spec(cls, spec) -> "WeightMap":
        """The map of a model loaded from config.json (its spec carries the storage description)."""
        return cls(spec, spec.names, getattr(spec, "fused_qkv", None), getattr(spec, "inputs_first", False),
                   getattr(spec, "root", None))

    def stored(self, role: str) -> str | None:
        """The tensor role holding ``role``: itself, "qkv", "gate_up", or None (the model lacks it)."""
        if role in self.names:
            return role
        if role in ("q", "k", "v") and "qkv" in self.names:
            return "qkv"
        if role in ("gate", "up") and "gate_up" in self.names:
            return "gate_up"
        return None

    def rows(self, role: str) -> np.ndarray | None:
        """Row indices of ``role`` inside its fused tensor ([out, in] orientation), None when unfused."""
        s, stored = self.spec, self.stored(role)
        if stored == "gate_up":
            f = s.intermediate_size
            return np.arange(0, f) if role == "gate" else np.arange(f, 2 * f)
        if stored != "qkv":
            return None
        h, kv, d = s.num_attention_heads, s.num_key_value_heads, s.head_dim
        if self.fused_qkv == "grouped":  # per key/value head: its queries, its key, its value
            g = h // kv
            ar = np.arange(kv * (g + 2) * d).reshape(kv, g + 2, d)
            part = {"q": ar[:, :g], "k": ar[:, g], "v": ar[:, g + 1]}[role]
            return part.reshape(-1)
        start = {"q": 0, "k": h * d, "v": (h + kv) * d}[role]
        return np.arange(start, start + (h if role == "q" else kv) * d)

    def tensor_name(self, stored: str, layer: int) -> str:
        return f"{self.names[stored].format(i=layer, h='{h}')}.weight"

    def module_regexes(self) -> list[tuple[re.Pattern, str]]:
        """Regexes matching a PEFT module path to its stored role (the layer is group 1 or 2)."""
        out = []
        for stored in TARGETS + ("qkv", "gate_up"):
            template = self.names.get(stored)
            if not template or "{i}" not in template:
                continue
            if self.root and template.startswith(self.root):
                bare_template = template[len(self.root):]
            else:
                bare_template = template.split(".", 1)[1]
            full, bare = (re.escape(t).replace(re.escape("{i}"), r"(\d+)") for t in (template, bare_template))
            # PEFT wraps the task model (…ForCausalLM) or the bare base model; accept both roots.
            out.append((re.compile(r"(?:base_model\.model\.)?(?:" + full + "|" + bare + ")"), stored))
        return out

    def split(self, stored: str, b: np.ndarray) -> dict[str, np.ndarray]:
        """A fused module's LoRA B [rows, rank] -> each role's rows (their A is shared)."""
        if stored not in ("qkv", "gate_up"):
            return {stored: b}
        roles = ("q", "k", "v") if stored == "qkv" else ("gate", "up")
        total = sum(len(self.rows(r)) for r in roles)
        if b.shape[0] != total:
            raise SterError(f"a LoRA factor B on the fused {stored} projection has {b.shape[0]} rows; "
                            f"the model's has {total}")
        return {r: b[self.rows(r)] for r in roles}


def _strings(value, key: str, where: str, *, allow_str: bool = True) -> list[str] | str | None:
    """A PEFT config field that is a string, a list of strings, or absent/null (None).

    Raises:
        SterError: "WHERE: KEY must be ..., got ..." for a number, a dict, a list holding a non-string.
    """
    if value is None or (allow_str and isinstance(value, str)):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise SterError(f"{where}: {key} must be {'a string or ' if allow_str else ''}a list of strings, got "
                    f"{str(value)[:40]!r}; fix adapter_config.json")


#: Repetitions (``*``, ``+``, ``{m,n}``) a config's regex may hold: each one in sequence multiplies the ways a
#: backtracking match can split a module name (``.*.*.*.*.*.*.*.*X`` took hours on ``model.layers.0.self_attn.q_proj``).
#: PEFT's own patterns use one or two (``.*\.(q_proj|v_proj)``, ``^(?!.*vision).*(q_proj|v_proj)``).
MAX_REGEX_REPEATS = 4


def _regex_hazard(parsed) -> str | None:
    """What makes a parsed regex (``re._parser``'s items) take exponential or high-polynomial time to fail on a
    module name, or None: a repetition or an alternation inside a repetition (``(a+)+``, ``(a|a)*``), a
    back-reference, or more than ``MAX_REGEX_REPEATS`` repetitions."""
    repeats = 0

    def walk(items, in_repeat: bool) -> str | None:
        nonlocal repeats
        for op, av in items:
            name = str(op)
            if name.endswith("REPEAT"):   # MAX_REPEAT, MIN_REPEAT, POSSESSIVE_REPEAT: (min, max, items)
                if av[1] > 1:
                    if in_repeat:
                        return "a repetition inside a repetition, as (a+)+"
                    repeats += 1
                found = walk(av[2], in_repeat or av[1] > 1)
            elif name == "BRANCH":
                if in_repeat:
                    return "alternatives inside a repetition, as (a|ab)*"
                found = next((f for f in (walk(b, in_repeat) for b in av[1]) if f), None)
            elif name in ("SUBPATTERN", "ASSERT", "ASSERT_NOT"):
                found = walk(av[-1], in_repeat)
            elif name == "ATOMIC_GROUP":
                found = walk(av, in_repeat)
            elif name.startswith("GROUPREF"):
                return "a back-reference"
            else:
                found = None
            if found:
                return found
        return None

    found = walk(parsed, False)
    if found is None and repeats > MAX_REGEX_REPEATS:
        found = f"{repeats} repetitions (*, +, {{m,n}}; at most {MAX_REGEX_REPEATS})"
    return found


def _regex(pattern: str, key: str, where: str) -> re.Pattern:
    """``pattern`` compiled, once it is known to match a module name in little time (an adapter's config is a file
    ster did not write: it is matched against every module of the model, with Python's backtracking ``re``)."""
    try:
        compiled = re.compile(pattern)
        try:
            from re import _parser as sre_parse   # Python 3.11+
        except ImportError:   # pragma: no cover - Python 3.10
            import sre_parse
        hazard = _regex_hazard(sre_parse.parse(pattern))
    except re.error as e:
        raise SterError(f"{where}: {key} {pattern[:60]!r} is not a valid regular expression ({e}); "
                        "fix adapter_config.json") from None
    if hazard is not None:
        raise SterError(f"{where}: {key} {pattern[:60]!r} holds {hazard}, which can take hours to match a module name; "
                        "ster runs simpler ones: give the module names as a list, or a regex without it")
    return compiled


def peft_targeting(cfg: dict, config_path: Path) -> Callable[[str], bool]:
    """Which modules a PEFT LoRA config adapts, as PEFT decides (``check_target_module_exists``).

    The returned ``targeted(key)`` takes a module path of the adapted model as PEFT names it
    (``model.layers.0.self_attn.q_proj``: a factor's key without ``base_model.model.`` and
    ``.lora_A.weight``). PEFT's rules: ``exclude_modules`` (a regex matched whole, or names matched
    whole or as the path's last components) wins; ``target_modules`` a string is a regex matched
    whole ("all-linear": every projection); a list names modules matched whole or as the path's last
    components, and then ``layers_to_transform`` (an int or a list of ints) keeps only the modules of
    those layers, the layer index being the first number after ``layers_pattern`` (default: the first
    numbered component after another one). A module matched whole by a list entry is not filtered by layer.

    Raises:
        SterError (naming the file and field): target_modules absent (PEFT would choose the model type's
            default modules, not the file's); a field of the wrong type or an invalid regex; combinations
            PEFT's LoraConfig refuses (layers_to_transform or layers_pattern with a string target_modules,
            layers_pattern without layers_to_transform).
    """
    where = f"PEFT adapter {config_path}"
    targets = _strings(cfg.get("target_modules"), "target_modules", where)
    if targets is None:
        raise SterError(f"{where} has no target_modules: PEFT would adapt its default modules for the model type, "
                        "whatever the file holds; list the adapted modules in adapter_config.json, for example "
                        '"target_modules": ["q_proj", "v_proj"]')
    excludes = _strings(cfg.get("exclude_modules"), "exclude_modules", where)
    patterns = _strings(cfg.get("layers_pattern"), "layers_pattern", where)
    layers = cfg.get("layers_to_transform")
    if not (layers is None or (isinstance(layers, int) and not isinstance(layers, bool)) or
            (isinstance(layers, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in layers))):
        raise SterError(f"{where}: layers_to_transform must be a layer number or a list of them, got "
                        f"{str(layers)[:40]!r}; fix adapter_config.json")
    if isinstance(targets, str) and (layers is not None or patterns is not None):  # as LoraConfig refuses it
        raise SterError(f"{where}: layers_to_transform and layers_pattern cannot be used with a target_modules "
                        "regex (a string), as PEFT refuses; give target_modules as a list of module names")
    if patterns and layers is None:
        raise SterError(f"{where}: layers_pattern is given without layers_to_transform, as PEFT refuses; "
                        "give the layers to adapt in layers_to_transform")
    target_rx = (None if not isinstance(targets, str) or targets.lower() == "all-linear"
                 else _regex(targets, "target_modules", where))
    exclude_rx = _regex(excludes, "exclude_modules", where) if isinstance(excludes, str) and excludes else None
    if isinstance(patterns, str):
        patterns = [patterns]
    layer_rxs = ([_regex(rf"(?:^|.*?\.){p}\.(?P<idx>\d+)\.", "layers_pattern", where) for p in patterns]
                 if patterns else [re.compile(r".*?\.[^.]*\.(?P<idx>\d+)\.")])
    by_layer = layers is not None and (layers != [] if isinstance(layers, list) else True)

    def targeted(key: str) -> bool:
        if exclude_rx is not None:
            if exclude_rx.fullmatch(key):
                return False
        elif excludes and (key in excludes or any(key.endswith(f".{e}") for e in excludes)):
            return False
        if isinstance(targets, str):
            return target_rx is None or target_rx.fullmatch(key) is not None
        if key in targets:
            return True
        if not any(key.endswith(f".{t}") for t in targets):
            return False
        if not by_layer:
            return True
        match = next((m for m in (rx.match(key) for rx in layer_rxs) if m is not None), None)
        if match is None:
            return False
        return int(match.group("idx")) == layers if isinstance(layers, int) else int(match.group("idx")) in layers

    return targeted



def _read_peft(config_path: Path, weights: Path, wmap: WeightMap) -> LoraAdapter:
    cfg = read_json(config_path, "PEFT adapter config")
    ptype = str(cfg.get("peft_type", "")).upper()
    if ptype != "LORA":
        raise SterError(f"PEFT adapter {config_path} is {ptype or 'of no peft_type'}; ster applies and merges "
                        "plain LoRA and rsLoRA adapters only")
    switches = _peft_switches(cfg, config_path)
    for key, what in PEFT_UNSUPPORTED.items():
        if key == "fan_in_fan_out" and wmap.inputs_first:
            continue  # PEFT's flag for [in, out] (Conv1D) weights: the factors keep their orientation
        if cfg.get(key) not in (None, False, {}, [], "none"):
            raise SterError(f"PEFT adapter {config_path} uses {what}, which ster does not support; "
                            "plain LoRA and rsLoRA are supported")
    if cfg.get("bias", "none") != "none":
        raise SterError(f"PEFT adapter {config_path} trains biases (bias={cfg['bias']!r}), which ster does not "
                        "support; plain LoRA and rsLoRA are supported")
    init = cfg.get("init_lora_weights", True)
    if isinstance(init, str) and init != "gaussian":
        raise SterError(f"PEFT adapter {config_path} was initialised with {init!r}, which rewrites the base "
                        "weights; convert it to a plain LoRA with PEFT first")
    for key in ("loftq_config", "eva_config", "corda_config", "lora_ga_config"):
        if cfg.get(key):
            raise SterError(f"PEFT adapter {config_path} uses {key}, which ster does not support")
    rank, alpha = cfg.get("r"), cfg.get("lora_alpha")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
        raise SterError(f"PEFT adapter {config_path}: r must be a positive integer, got {rank!r}")
    # A number here ended in a TypeError where the base model's name is compared as a path.
    check_model_fields(cfg, f"PEFT adapter {config_path}", "fix adapter_config.json",
                       keys=("base_model_name_or_path", "revision"))
    alpha = _check_alpha(alpha, rank, switches["use_rslora"], f"PEFT adapter {config_path}: lora_alpha")
    targeted = peft_targeting(cfg, config_path)
    tensors = _load_tensors(weights)
    ad = LoraAdapter(config_path, "peft", cfg.get("base_model_name_or_path"), cfg.get("revision"), rank,
                     float(alpha), switches["use_rslora"], None)
    regexes = wmap.module_regexes()
    pairs: dict[tuple[int, str], dict[str, tuple[str, np.ndarray]]] = {}
    suffix = re.compile(r"(.+)\.lora_([AB])(?:\.[A-Za-z0-9_]+)?\.weight")
    ignored: list[str] = []
    known = ", ".join(wmap.names[t] for t in TARGETS + ("qkv", "gate_up") if t in wmap.names)
    for name, t in tensors.items():
        m = suffix.fullmatch(name)
        if not m:
            # PEFT's own tensors of a module ster cannot adapt (an adapter targeting the embeddings or the
            # output head): name that module, as a LoRA factor of it is named below
            other = PEFT_OTHER_TENSOR.fullmatch(name)
            if other:
                what = ("a full copy of the weight (PEFT saves it beside a LoRA of the embeddings or the output "
                        "head)" if other.group(2) == "base_layer.weight" else "a LoRA factor of the embedding")
                raise SterError(f"PEFT adapter {weights}: tensor {name!r} is {what} of module {other.group(1)!r}, "
                                "which is not a projection ster can adapt "
                                f"(projections: {known}); train the adapter without that module in target_modules")
            raise SterError(f"PEFT adapter {weights}: tensor {name!r} is not a LoRA factor "
                            "(lora_A / lora_B); only plain LoRA on linear projections is supported")
        module = m.group(1)
        # PEFT adapts only the modules its config targets and ignores the file's other tensors: so does ster
        if not targeted(module[len("base_model.model."):] if module.startswith("base_model.model.") else module):
            ignored.append(module)
            continue
        for rx, target in regexes:
            mm = rx.fullmatch(module)
            if mm:
                layer = int(next(g for g in mm.groups() if g is not None))
                # an adapter name in the key ("lora_A.other.weight") or a module matched with and without the
                # root prefix must not silently replace a factor already read
                _put_factor(pairs, (layer, target), m.group(2), name, t, weights, f"lora_{m.group(2)}")
                break
        else:
            raise SterError(f"PEFT adapter {weights}: module {module!r} is not a projection ster can adapt "
                            f"(projections: {known})")
    for (layer, stored), ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise SterError(f"PEFT adapter {weights}: layer {layer} {stored} has only its lora_{next(iter(ab))}")
        a, b = _check_factor(weights, f"layer {layer} {stored}", ab["A"][1], ab["B"][1], rank)
        for role, rows in wmap.split(stored, b).items():  # a fused module: one LoRA per role, A shared
            ad.factors[(layer, role)] = (a, np.ascontiguousarray(rows))
    if ignored:
        shown = sorted(set(ignored))
        ad.notes.append(f"PEFT adapter {weights} holds factors of {len(shown)} module(s) that its config does not "
                        f"adapt ({shown[0]!r}{', ...' if len(shown) > 1 else ''}; see target_modules, "
                        "layers_to_transform, exclude_modules in adapter_config.json); they are ignored, as PEFT "
                        "ignores them")
    if not ad.factors:
        raise SterError(f"PEFT adapter {weights} holds no LoRA factors" + (
            " of a module its config adapts (target_modules, layers_to_transform, layers_pattern, exclude_modules "
            "in adapter_config.json)" if ignored else ""))
    return ad


def read_adapter(path: str | Path, wmap: WeightMap) -> LoraAdapter:
    """Read a LoRA adapter in Ster's or PEFT's layout.

    Args:
        path: NAME.lora.json, NAME.lora.safetensors, NAME (prefix), a directory holding
            one of these, a PEFT adapter directory, or its adapter_config.json.
        wmap: the model's Hugging Face storage (:class:`WeightMap`), which maps PEFT module
            paths to (layer, role) and splits fused modules' factors by role.

    Raises:
        SterError (naming the path): a steering vector, capture or reward artifact instead of
            an adapter; an unsupported PEFT method or option; a switch (use_rslora, rslora, use_dora,
            ...) that is not a JSON boolean; missing or malformed factors; factors that are not
            floating point, or two for one projection (two adapters in one file); non-finite
            values; a delta (scale * B @ A) that overflows float32.
    """
    layout, side, weights, _ = _open(path)
    ad = _read_peft(side, weights, wmap) if layout == "peft" else _read_ster(side, weights)
    _check_deltas(ad)
    if ad.alpha == 0:  # legal, and a merge of it is a copy: worth a warning, not a refusal
        key = "lora_alpha" if layout == "peft" else "alpha"
        ad.notes.append(f"adapter {side} has {key} 0, so its scale is 0 and it changes nothing (the result is the "
                        f"base model); set {key} to the value it was trained with")
    return ad


def _open(path: str | Path) -> tuple[str, Path, Path, dict]:
    """(layout, JSON file, weights file, the JSON document) of an adapter; refuses other artifacts (and an empty
    path, which ``Path`` would read as the current directory)."""
    check_path_name(path, "--adapter")
    layout, side, weights = _locate(Path(path))
    doc = read_json(side, "adapter file")
    kind = sniff(doc, side)
    if layout == "json" or kind in ("steering", "capture", "reward", "unknown"):
        raise SterError(f"--adapter {side} is {KIND_WORDS[kind]}, not a LoRA adapter")
    return layout, side, weights, doc


def check_adapter_early(path: str | Path, resolved, spec) -> LoraAdapter | None:
    """Refuse an adapter that cannot fit a model before the model's weights are downloaded or mapped.

    Use it as ``load_model(..., check=...)``. For a safetensors model (``spec`` from its
    config.json) the adapter is read and checked whole (:func:`check_adapter_for`, the
    model's projections from its storage map, as ``tune merge`` does) and returned; apply
    it after loading. Otherwise (a GGUF, whose storage map comes from the loaded model, or a
    preset not fetched yet, ``spec`` None) only what its JSON records is checked: the model
    and revision it was made for and, with ``spec``, its hidden_size; None is returned and
    :func:`load_adapter_for` reads it after loading.

    Raises:
        SterError (naming the path): as :func:`read_adapter` and :func:`check_adapter_for`.
    """
    if spec is not None and resolved.kind == "safetensors":
        wmap = WeightMap.of_spec(spec)
        ad = read_adapter(path, wmap)
        check_adapter_for(ad, resolved, spec, lambda role: wmap.stored(role) is not None)
        return ad
    layout, side, _, doc = _open(path)
    if layout == "peft":
        peft_targeting(doc, side)  # its fields' types, before the model is loaded
        model, revision, width = doc.get("base_model_name_or_path"), doc.get("revision"), None
        rank, alpha, where = doc.get("r"), doc.get("lora_alpha"), "lora_alpha"
        rslora = _peft_switches(doc, side)["use_rslora"]
    else:
        model, revision, width = doc.get("model"), doc.get("model_revision"), doc.get("hidden_size")
        rank, alpha, where = doc.get("rank"), doc.get("alpha"), "alpha"
        rslora = _switch(doc, "rslora", f"adapter sidecar {side}")
    if isinstance(rank, int) and not isinstance(rank, bool) and rank > 0:  # the rank itself is checked on reading
        _check_alpha(alpha, rank, rslora, f"adapter {side}: {where}")
    check_model(side, "adapter", model if isinstance(model, str) else None,
                revision if isinstance(revision, str) else None, resolved, hint=layout == "peft")
    if spec is not None and isinstance(width, int) and not isinstance(width, bool) and width != spec.hidden_size:
        raise SterError(f"adapter {side} was made for hidden_size {width}, but this model's is {spec.hidden_size}")
    return None


def projection_shapes(spec) -> dict[str, tuple[int, int]]:
    """target -> (out, in) of that projection for a ``ModelSpec``."""
    d, f = spec.hidden_size, spec.intermediate_size
    q, kv = spec.num_attention_heads * spec.head_dim, spec.num_key_value_heads * spec.head_dim
    o = spec.num_attention_heads * spec.latent.v_head_dim if getattr(spec, "latent", None) is not None else q
    return {"q": (q, d), "k": (kv, d), "v": (kv, d), "o": (d, o), "gate": (f, d), "up": (f, d), "down": (d, f)}


def _own_attention_shapes(spec) -> bool:
    """Whether some layer's attention is not the model's standard shape (``ModelSpec.attention_shape``)."""
    std = (spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim, spec.head_dim)
    return any(spec.attention_shape(i) != std for i in range(spec.num_hidden_layers))


def check_adapter_for(ad: LoraAdapter, resolved, spec, has_role: Callable[[str], bool]) -> None:
    """Refuse ``ad`` for a model it does not fit.

    Args:
        has_role: whether the model has the projection of a role (a plain feed-forward has no gate).

    Raises:
        SterError (naming the path): made for another model or revision; another hidden width;
            a layer the model lacks; a role the model lacks (gate on a plain feed-forward); a
            feed-forward target on a mixture-of-experts family (its experts are not adapted,
            seed 002); an attention target on a model whose layers have their own head counts
            or widths (MiMo-V2-Flash, seed 002); on latent attention, a target other than o, or q
            without a query bottleneck (seed 002); any adapter on a state-space family, or an
            attention target on one that takes feed-forward adapters only (Granite 4.0, seed 002); q on a
            model whose queries pass a bottleneck (Step3, seed 002); any
            adapter on a family with hyper-connected residual streams (seed 002); a
            factor whose shape does not fit the projection.
    """
    note = check_model(ad.path, "adapter", ad.model, ad.model_revision, resolved, hint=ad.layout == "peft")
    if note is not None and note not in ad.notes:
        ad.notes.append(note)
    if getattr(spec, "loop", None) is not None:
        raise SterError(f"adapter {ad.path} cannot be used: {spec.model_type} runs its stored layers on several "
                        "passes, so one adapter on a stored layer would correct every pass of it; ster refuses "
                        "adapters on looped models (steering and capture work on them, per executed layer)")
    if spec.adapters == "none" and spec.ssm is None and spec.delta is None and any(
            layer.intermediate_size is not None or layer.mixer == "none" for layer in spec.layers):
        raise SterError(f"adapter {ad.path} cannot be used: {spec.model_type}'s layers differ in shape (their own "
                        "key/value heads and feed-forward widths, halves left out), so no projection has one shape "
                        "on every layer, and ster refuses adapters on it (steering and capture work on it)")
    if spec.adapters == "none" and getattr(spec, "streams", None) is not None:
        raise SterError(f"adapter {ad.path} cannot be used: {spec.model_type} keeps several residual streams joined "
                        "by hyper-connections, and ster refuses adapters on such families (seed 002; steering and "
                        "capture work on them, on the streams' mean)")
    if spec.adapters == "none":
        raise SterError(f"adapter {ad.path} cannot be used: {spec.model_type} is a state-space model, whose scan "
                        "layers have no attention or feed-forward projection to adapt, and ster refuses adapters on "
                        "state-space families (steering and capture work on them)")
    if ad.hidden_size is not None and ad.hidden_size != spec.hidden_size:
        raise SterError(f"adapter {ad.path} was made for hidden_size {ad.hidden_size}, but this model's is "
                        f"{spec.hidden_size}")
    shapes = projection_shapes(spec)
    n = spec.num_hidden_layers
    for (layer, target), (a, b) in sorted(ad.factors.items()):
        if layer >= n:
            raise SterError(f"adapter {ad.path} adapts layer {layer}, but this model has layers 0..{n - 1}")
        if spec.moe is not None and target in ("gate", "up", "down"):
            raise SterError(f"adapter {ad.path} targets {target}, but {spec.model_type} routes its feed-forward "
                            "through experts, which ster does not adapt; adapt the attention projections "
                            "(q, k, v, o) only")
        if target in ("q", "k", "v", "o") and spec.adapters == "ffn":
            raise SterError(f"adapter {ad.path} targets {target}, but {spec.model_type} mixes most layers with a "
                            "state-space scan and ster adapts only its feed-forward projections (gate, up, down)")
        if target == "q" and getattr(spec, "query_bottleneck", 0):  # seed 002: wq reads the bottleneck
            raise SterError(f"adapter {ad.path} targets q, but {spec.model_type}'s queries pass a bottleneck "
                            "(q_proj, inter_norm, wq): wq reads the bottleneck, not the hidden state, so ster does "
                            "not adapt q there; adapt k, v, o or the feed-forward projections")
        latent = getattr(spec, "latent", None)
        if latent is not None and target in ("q", "k", "v"):  # seed 002: o, and q without a bottleneck
            if target != "q" or latent.q_lora_rank is not None:
                where = "o only" if latent.q_lora_rank is not None else "o and q (it has no query bottleneck)"
                raise SterError(f"adapter {ad.path} targets {target}, but {spec.model_type}'s latent attention "
                                f"takes adapters on {where}; its keys and values come from a shared latent")
        elif latent is None and target in ("q", "k", "v", "o") and _own_attention_shapes(spec):
            raise SterError(f"adapter {ad.path} targets {target}, but {spec.model_type}'s attention layers differ "
                            "in head counts or widths (or its values are not as wide as its keys), which ster does "
                            "not adapt; adapt the feed-forward projections (gate, up, down) only")
        if target == "v" and any(getattr(layer, "value_experts", False) for layer in spec.layers):
            raise SterError(f"adapter {ad.path} targets v, but {spec.model_type}'s routed layers take their values "
                            "from value experts (MoVA), which ster does not adapt; adapt q, k, o or the dense "
                            "feed-forward projections")
        if not has_role(target):
            what = "feed-forward has no gate projection" if target == "gate" else f"has no {target} projection"
            raise SterError(f"adapter {ad.path} targets {target}, but this {spec.model_type} model's {what}")
        out, inp = shapes[target]
        if a.shape[1] != inp or b.shape[0] != out:
            raise SterError(f"adapter {ad.path}: layer {layer} {target} maps {a.shape[1]} -> {b.shape[0]}, but the "
                            f"model's {target} projection maps {inp} -> {out} (hidden_size {spec.hidden_size}); "
                            "the adapter was made for another model width")


class LoraLinear:
    """``base(x) + scale * (x @ A^T) @ B^T``: a frozen LoRA around any projection callable.

    x float32 [T, in] -> float32 [T, out]. Computing through the rank keeps the
    cost at rank * (in + out) per row instead of materialising B @ A.
    """

    def __init__(self, base, a: np.ndarray, b: np.ndarray, scale: float):
        self.base, self.a_t, self.b_t = base, np.ascontiguousarray(a.T), np.ascontiguousarray(b.T)
        self.scale = np.float32(scale)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        # an activation past float32 (a huge alpha with finite factors) is left to the logits' check, whose
        # error names it; numpy's RuntimeWarning would print two more lines around that error
        with np.errstate(over="ignore", invalid="ignore"):
            return self.base(x) + ((x @ self.a_t) @ self.b_t) * self.scale

    def __getattr__(self, name):  # expose the wrapped projection's attributes (weight, shapes)
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)


def weight_map_of(loaded) -> WeightMap:
    """The Hugging Face storage map of a loaded model (for a GGUF, its family's or its config's)."""
    from .families import FAMILIES

    if loaded.resolved.kind == "safetensors":
        return WeightMap.of_spec(loaded.spec)
    if loaded.resolved.config is not None:  # a GGUF beside its base model's config.json
        from .config import spec_from_config

        return WeightMap.of_spec(spec_from_config(loaded.resolved.config, loaded.resolved.family,
                                                  str(loaded.resolved.config_path)))
    family = FAMILIES[loaded.spec.model_type]
    return WeightMap(loaded.spec, family.names, family.fused_qkv, family.inputs_first, family.root)


ADAPTER_PATH = "the adapter's path (NAME.lora.json, or a PEFT adapter directory)"


def load_adapter_for(path: str | Path, loaded) -> LoraAdapter:
    """Read the adapter at ``path`` and check it fits ``loaded`` (see :func:`check_adapter_for`).

    Args:
        path: as for :func:`read_adapter`.
        loaded: the model, as ``load_model`` returns it.

    Raises:
        SterError: as :func:`read_adapter` and :func:`check_adapter_for`; ``path`` not a path or ``loaded`` not a
            loaded model (None, say), naming what to pass.
    """
    check_path_arg(path, "load_adapter_for", ADAPTER_PATH)
    check_loaded(loaded, "load_adapter_for")
    ad = read_adapter(path, weight_map_of(loaded))
    check_fit(ad, loaded)
    return ad


def check_loaded(loaded, func: str) -> None:
    """Refuse a ``loaded`` that is not what ``load_model`` returns (None, a path). Raises SterError naming ``func``."""
    if not all(hasattr(loaded, k) for k in ("decoder", "spec", "resolved", "tokenizer")):
        raise SterError(f"{func} takes the model load_model returns as loaded, got {shown_value(loaded)}")


def check_fit(ad: LoraAdapter, loaded) -> None:
    """:func:`check_adapter_for` against a loaded model (its decoder says which projections it has)."""
    first = loaded.decoder.layers[0]
    check_adapter_for(ad, loaded.resolved, loaded.spec, lambda role: getattr(first, role, None) is not None)


def apply_adapter(loaded, ad: LoraAdapter | str | Path) -> LoraAdapter:
    """Wrap ``loaded.decoder``'s projections so every forward pass adds the adapter's delta.

    ``ad`` is a :class:`LoraAdapter` from :func:`load_adapter_for`, or the path to give it; either way its
    fit to ``loaded`` is checked first (an adapter loaded for another model), and a refusal changes nothing.
    Applying twice stacks. The adapter's ``notes`` join ``loaded.warnings``. Prompt caches
    of this decoder start afresh at their next call (``Decoder.revision``): their positions were
    computed without the adapter. Returns the adapter applied.

    Raises:
        SterError: as ``load_adapter_for``, for a path or an adapter object (another width, a layer the model
            lacks, factors that do not fit its projections); ``ad`` neither an adapter nor a path; ``loaded``
            not a loaded model.
    """
    check_loaded(loaded, "apply_adapter")
    if isinstance(ad, (str, os.PathLike)):
        ad = load_adapter_for(ad, loaded)
    if not isinstance(ad, LoraAdapter):
        raise SterError(f"apply_adapter takes a LoraAdapter (load_adapter_for) or its path, got {type(ad).__name__}")
    check_fit(ad, loaded)   # an adapter loaded for another model: its factors would break or silently skew this one
    loaded.notes.extend(note for note in ad.notes if note not in loaded.notes)
    loaded.decoder.revision += 1
    for (layer, target), (a, b) in ad.factors.items():
        obj = loaded.decoder.layers[layer]
        setattr(obj, target, LoraLinear(getattr(obj, target), a, b, ad.scale))
    return ad
