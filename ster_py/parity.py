"""``ster parity``: our forward pass against a reference implementation on the same token ids.

References:

- ``transformers``: ``AutoModelForCausalLM.from_pretrained`` on the same directory
  (or the same GGUF through ``gguf_file=``, which Transformers dequantizes to
  float32), float32, eager attention. It also returns hidden states, so the
  report names the first layer whose residual stream diverges.
- ``llama.cpp``: llama-cpp-python's logits on the same GGUF file, every position,
  logits only, computed in a child process (``ster_py.llamacpp``: a crash of the
  native library is reported, not fatal).

Metrics per prompt, over every position of its ids (logits float32 [T, vocab]):
relative error ``||ours - ref|| / ||ref||`` (Frobenius), maximum absolute error,
mean over positions of the cosine between the two logit rows, and the share of
positions whose argmax agrees (top-1 agreement).
"""
from __future__ import annotations

import contextlib
import io
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import numpy as np

from .errors import SterError

REFERENCES = ("transformers", "llama.cpp")
#: --tolerance when none is given, per reference: float32 against float32 agrees to ~1e-6; llama.cpp
#: rounds activations to 8 bits inside its quantized products (relative errors of a few 1e-2).
DEFAULT_TOLERANCES = {"transformers": 1e-4, "llama.cpp": 0.1}
#: --tolerance when none is given for a model quantized on load (--quantize), against transformers' float32:
#: about three times the relative logit error llama.cpp's own files of that type show for the same weights
#: (scripts/quantize_error.py on SmolLM2 and Gemma 3: Q8_0 0.023-0.034, Q4_0 0.25-0.27, Q4_K_S 0.09-0.10), since
#: short prompts scatter more than those runs' 45 positions (runbook/performance.md).
QUANTIZED_TOLERANCES = {"q8_0": 0.1, "q4_0": 0.8, "q4_k": 0.3}
#: --tolerance when none is given for a --precision that rounds the stored weights (a float32 checkpoint held
#: as f16 or bf16), against transformers' float32 on the stored weights: about four times the largest error
#: of the two default prompts on SmolLM2-135M and Gemma 3 270M (f16 5e-4 to 1.0e-3, bf16 2.2e-3 to 4.7e-3).
ROUNDED_TOLERANCES = {"f16": 4e-3, "bf16": 2e-2}
DEFAULT_PROMPTS = ("The capital of France is", "def fibonacci(n):\n    if n < 2:\n        return n")

# The reference runs eager attention (exact soft-capping and windows), except where
# transformers' eager path is known wrong: Falcon's adds the ALiBi bias twice (in the mask
# and in the scores), its SDPA path once, as Falcon's own code does.
REFERENCE_ATTENTION = {"falcon": "sdpa"}

Progress = Callable[[str, int, "int | None"], None]
# ids -> (logits float32 [T, vocab], hidden states list of float32 [T, hidden] or None)
Reference = Callable[[Sequence[int]], "tuple[np.ndarray, list[np.ndarray] | None]"]


@dataclass
class LayerError:
    """Relative error of one layer's residual stream (layer i = after decoder layer i)."""

    layer: int
    rel_error: float
    final_norm_applied: bool = False


@dataclass
class PromptParity:
    prompt: str
    ids: list[int]
    rel_error: float
    max_abs_error: float
    mean_cosine: float
    top1_agreement: float
    passed: bool
    layers: list[LayerError] | None = None
    first_divergent_layer: int | None = None


@dataclass
class ParityReport:
    model: str
    model_revision: str | None
    precision: str
    reference: str
    tolerance: float
    prompts: list[PromptParity] = field(default_factory=list)
    #: --quantize kind of our side (its projections in GGML blocks), or None
    quantize: str | None = None

    @property
    def passed(self) -> bool:
        return all(p.passed for p in self.prompts)

    def to_json(self) -> dict:
        d = asdict(self)
        d["passed"] = self.passed
        return d


def _missing(package: str, extra_hint: str, reference: str = "transformers") -> SterError:
    return SterError(f"`ster parity` with the {reference} reference needs {package}, missing here; {extra_hint}")


# Families Transformers runs only as the text model of a multimodal class, with no causal-LM class
# for their own model_type: model_type -> (module, text model class, tensor renames from the hub's
# checkpoint layout to that class's, as Transformers' conversion mapping for the family gives them).
TEXT_MODEL_REFERENCES = {
    "step3p5": ("transformers.models.step3p7.modeling_step3p7", "Step3p7TextModel",
                ((".moe.gate.weight", ".mlp.gate.weight"), (".moe.router_bias", ".mlp.gate.e_score_correction_bias"),
                 (".moe.down_proj.weight", ".mlp.experts.down_proj"), (".share_expert.", ".mlp.shared_experts."))),
}


# Families whose releases state the text decoder's config at the top level under a multimodal model_type
# (which Transformers would build with its image and audio towers): the reference is the text config
# Transformers registers for them and its causal LM, on the same weights (the towers' left unread).
TEXT_CONFIG_REFERENCES = {"dots3_note": "dots3_note_text"}


def _text_model_reference(root, model_type: str, torch, attn: str):
    """A text model of ``TEXT_MODEL_REFERENCES`` with an ``lm_head``, its weights read from the
    checkpoint at ``root`` under the hub's names; called like a causal LM (logits, hidden states).
    A stacked ``moe.gate_proj`` / ``moe.up_proj`` pair becomes the fused ``mlp.experts.gate_up_proj``."""
    import importlib
    from types import SimpleNamespace

    from safetensors.torch import load_file
    from transformers import AutoConfig

    module, cls, renames = TEXT_MODEL_REFERENCES[model_type]
    config = AutoConfig.from_pretrained(str(root))
    config._attn_implementation = attn
    text = getattr(importlib.import_module(module), cls)(config).float().eval()
    head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)
    state: dict = {}
    for file in sorted(root.glob("*.safetensors")):
        state.update(load_file(str(file)))
    for name in [n for n in state if n.endswith(".moe.gate_proj.weight")]:
        stem = name[: -len(".moe.gate_proj.weight")]
        up = state.pop(stem + ".moe.up_proj.weight")
        state[stem + ".mlp.experts.gate_up_proj"] = torch.cat([state.pop(name), up], dim=1)
    head_weight = state.pop("lm_head.weight", None)
    renamed = {}
    for name, t in state.items():
        for old, new in renames:
            name = name.replace(old, new)
        renamed[name.removeprefix("model.")] = t.float()
    text.load_state_dict(renamed, strict=False)
    missing = [n for n in text.state_dict() if n not in renamed and not n.endswith("inv_freq")]
    if missing or head_weight is None:
        raise ValueError(f"the checkpoint lacks {(missing or ['lm_head.weight'])[0]}")
    with torch.no_grad():
        head.weight.copy_(head_weight.float())

    def model(ids, output_hidden_states=False):
        out = text(input_ids=ids, output_hidden_states=output_hidden_states)
        return SimpleNamespace(logits=head(out.last_hidden_state), hidden_states=out.hidden_states)

    return model


# Decoders Transformers runs only inside their multimodal wrapper (group WRAP: checked against those
# wrappers in tests/test_parity_wrapped.py and test_parity_hc.py): text model_type -> (the wrapper's
# model_type, (pattern, replacement) taking a text-only checkpoint's tensor names to the wrapper's (None:
# the same names), the wrapper's other settings for a text-only checkpoint given its text config: towers
# as small as their configs allow, built because the class holds them, never run on text).
_TOWER = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2)
WRAPPED_REFERENCES = {
    "muse_glimmer_text": ("muse_glimmer", (r"^model\.", "model.language_model."),
                          lambda text: dict(vision_config=_TOWER, out_hidden_size=text.get("hidden_size"),
                                            projector_hidden_size=32)),
    "minimax_m3_vl_text": ("minimax_m3_vl", (r"^(?!lm_head\.)", "language_model."),
                           lambda text: dict(vision_config=_TOWER, projector_hidden_size=32)),
    "inkling_text": ("inkling_mm_model", None,
                     lambda text: dict(vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                          patch_size=4), audio_config={})),
    "glm5_next_text": ("glm5_next", (r"^model\.", "model.language_model."),
                       lambda text: dict(vision_config=dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32,
                                                            out_hidden_size=text.get("hidden_size"),
                                                            projection_intermediate_size=32))),
}


def _wrapped_reference(resolved, model_type: str, transformers, kwargs: dict):
    """Transformers' wrapper class (``WRAPPED_REFERENCES``) on the checkpoint at ``resolved.root``: a
    wrapper checkpoint as saved, or a text-only one (the decoder's model_type at the top) inside a
    wrapper config around its text config, its tensors renamed into the wrapper's layout as they are
    read (``from_pretrained``'s ``key_mapping``; the wrapper's own conversion mapping then applies)."""
    from .resolve import read_config

    wrapper, rename, extra = WRAPPED_REFERENCES[model_type]
    cls = transformers.AutoModelForImageTextToText
    if read_config(resolved.config_path).get("model_type") == wrapper:
        return cls.from_pretrained(str(resolved.root), **kwargs)
    text = {k: v for k, v in resolved.config.items() if k != "architectures"}
    config = transformers.AutoConfig.for_model(wrapper, text_config=text, **extra(text))
    mapping = {rename[0]: rename[1]} if rename else None
    return cls.from_pretrained(str(resolved.root), config=config, key_mapping=mapping, **kwargs)


# Configurations of a model_type Transformers implements that its class does not compute: (predicate over
# config.json, what Transformers lacks). bailing_hybrid's class is Ling 3.0; a Ling 2.5 config (lightning
# attention) would build Kimi Delta Attention layers from it (tests/test_parity_ling25.py builds its oracle).
def _ling25(config) -> bool:
    from .families import _ling3

    return not _ling3(config)


UNREFERENCED_VARIANTS = {"bailing_hybrid": (_ling25, "Ling 2.5 (lightning attention): Transformers' bailing_hybrid "
                                                     "is Ling 3.0, with Kimi Delta Attention in those layers")}


def _require_transformers() -> None:
    """Raise SterError (naming what to install) unless torch and transformers import."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise _missing("torch and transformers", 'install them with: pip install ".[reference]" from a '
                       'checkout of ster-py, or pip install torch transformers') from None


def _require_llamacpp(resolved) -> None:
    """Raise SterError unless llama.cpp can be the reference for ``resolved``: a GGUF model, and
    llama-cpp-python installed (looked up, not imported)."""
    from . import llamacpp

    if resolved.gguf_file is None:
        raise SterError(f"--reference llama.cpp needs a GGUF model, and {resolved.model} is a safetensors "
                        "checkpoint; use --reference transformers, or pass the .gguf file")
    llamacpp.require()


def transformers_reference(resolved) -> Reference:
    """A reference that runs Transformers on the model ``resolved`` describes.

    Raises:
        SterError: torch or transformers missing (names the extra to install); a family
            Transformers does not implement; the model cannot be loaded by Transformers.
    """
    _require_transformers()
    import torch
    import transformers

    from .decoder.qlinear import get_threads

    torch.set_num_threads(get_threads())  # --threads bounds torch's pool too
    model_type = (resolved.config or {}).get("model_type")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if resolved.gguf_file is None and model_type not in CONFIG_MAPPING_NAMES:
        # The family's code lives only in its Hub repositories (remote code), which ster never runs.
        raise SterError(f"transformers {transformers.__version__} has no implementation of model_type "
                        f"{model_type!r} to compare against (its modelling code lives in the model's Hub "
                        "repository, which ster does not run); compare a GGUF of the model with "
                        "--reference llama.cpp instead")
    variant = UNREFERENCED_VARIANTS.get(model_type)
    if resolved.gguf_file is None and variant is not None and variant[0](resolved.config or {}):
        raise SterError(f"transformers {transformers.__version__} has no implementation of this {model_type} "
                        f"checkpoint to compare against: {variant[1]}; ster does not run the model's Hub code")
    kwargs = dict(dtype=torch.float32, attn_implementation=REFERENCE_ATTENTION.get(model_type, "eager"))
    if resolved.gguf_file is not None:
        try:
            import gguf  # noqa: F401  (Transformers reads GGUF through gguf-py)
        except ImportError:
            raise _missing("gguf (gguf-py)", 'install it with: pip install gguf, or pip install ".[reference]" '
                           'from a checkout of ster-py') from None
        kwargs["gguf_file"] = resolved.gguf_file.name
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # nothing below the CLI prints; restored right after
    verbosity = hf_logging.get_verbosity()
    if model_type in WRAPPED_REFERENCES:
        hf_logging.set_verbosity_error()  # its load report lists the towers' weights a text-only checkpoint lacks
    try:  # Transformers' GGUF conversion draws its own tqdm bar on stderr: keep it off the terminal
        with contextlib.redirect_stderr(io.StringIO()):
            if model_type in WRAPPED_REFERENCES and resolved.gguf_file is None:
                model = _wrapped_reference(resolved, model_type, transformers, kwargs).eval()
            elif model_type in TEXT_MODEL_REFERENCES and resolved.gguf_file is None:
                model = _text_model_reference(resolved.root, model_type, torch, kwargs["attn_implementation"])
            elif model_type in TEXT_CONFIG_REFERENCES and resolved.gguf_file is None:
                config = {k: v for k, v in resolved.config.items() if k not in ("model_type", "architectures")}
                config = transformers.AutoConfig.for_model(TEXT_CONFIG_REFERENCES[model_type], **config)
                model = transformers.AutoModelForCausalLM.from_pretrained(str(resolved.root), config=config,
                                                                          **kwargs).eval()
            else:
                model = transformers.AutoModelForCausalLM.from_pretrained(str(resolved.root), **kwargs).eval()
    except Exception as e:  # transformers raises many types; the user needs the message
        raise SterError(f"transformers could not load {resolved.model} as the reference: {type(e).__name__}: {e}") \
            from None
    finally:
        if bars:
            hf_logging.enable_progress_bar()
        hf_logging.set_verbosity(verbosity)

    def run(ids):
        with torch.no_grad():
            out = model(torch.tensor([list(ids)]), output_hidden_states=True)
        return out.logits[0].float().numpy(), [h[0].float().numpy() for h in out.hidden_states]

    return run


def llamacpp_reference(resolved, prompts: Sequence[Sequence[int]]) -> Reference:
    """A reference that evaluates ids with llama.cpp (llama-cpp-python) on the GGUF file.

    llama.cpp runs in a child process (``ster_py.llamacpp``): every prompt of ``prompts``
    is evaluated there once, up front, and ``run(ids)`` returns the logits of one of them.
    A crash of llama.cpp becomes a SterError instead of the end of this process.

    Raises:
        SterError: the model is not a GGUF; llama-cpp-python missing; llama.cpp refuses
            the file, crashes or times out; ``run`` asked for ids not in ``prompts``.
    """
    from . import llamacpp

    _require_llamacpp(resolved)
    keys = [tuple(int(t) for t in ids) for ids in prompts]
    results = dict(zip(keys, llamacpp.logits(resolved.gguf_file, keys)))

    def run(ids):
        key = tuple(int(t) for t in ids)
        if key not in results:
            raise SterError("the llama.cpp reference was built for other prompts")
        return results[key], None

    return run


def _rel(ours: np.ndarray, ref: np.ndarray) -> float:
    ref64 = ref.astype(np.float64)
    denom = float(np.linalg.norm(ref64))
    diff = float(np.linalg.norm(ours.astype(np.float64) - ref64))
    return diff / denom if denom else diff


def compare(loaded, prompt: str, ids: Sequence[int], reference: Reference, tolerance: float) -> PromptParity:
    """Run ours and ``reference`` on ``ids`` and measure the differences (see module docstring).

    Hidden states (when the reference gives them) are compared layer by layer: ours are
    the residual stream after each decoder layer; Transformers' last entry has the
    final norm applied, so our final norm is applied to the last layer before comparing
    (Transformers' Mamba models list no embedding: ``FamilySpec.reference_hidden``). With
    hyper-connections (``ModelSpec.streams``) ours is the streams' mean, compared with the mean of
    the reference's streams; the last layer, whose reference entry is after the head's collapse, is
    not compared (the logits are).

    Ours runs with float inputs to every product (``qlinear.float_activations``): the int16 rounding of
    the one-token decode path is a speed trade of generation, not part of the model's math.
    """
    from .decoder.qlinear import float_activations

    hidden: list[np.ndarray] = []
    # Float inputs for every product, whatever the prompt's length. A one-token forward would otherwise take
    # the decode path, which rounds each product's inputs to int16 per 32-block (QuantLinear; tested against
    # its own definition in tests/test_qmatmul.py): on SmolLM2-135M Q4_1 that alone moves the logits of a
    # one-token prompt by 1.5e-4 relative, where the same token inside a longer prompt (float inputs) is
    # within 2e-6 of Transformers' float32 run on the dequantized weights. Parity measures the model's
    # arithmetic, the same for every prompt, so a prompt's length no longer decides what it measures.
    with float_activations():
        ours = loaded.decoder.forward(list(ids), hidden_states=hidden)
    ref, ref_hidden = reference(ids)
    if ref.shape != ours.shape:
        if ref.ndim == 2 and ref.shape[0] == ours.shape[0] and ref.shape[1] > ours.shape[1]:
            ref = ref[:, : ours.shape[1]]  # a reference may pad its head beyond the vocabulary
        else:
            raise SterError(f"the reference returned logits of shape {list(ref.shape)}, ours are "
                            f"{list(ours.shape)}; the two do not describe the same model")
    o64, r64 = ours.astype(np.float64), ref.astype(np.float64)
    cos = (o64 * r64).sum(1) / np.maximum(np.linalg.norm(o64, axis=1) * np.linalg.norm(r64, axis=1), 1e-300)
    rel = _rel(ours, ref)
    result = PromptParity(prompt, list(ids), rel, float(np.abs(o64 - r64).max()), float(cos.mean()),
                          float((ours.argmax(1) == ref.argmax(1)).mean()), rel <= tolerance)
    if ref_hidden is not None:
        from .families import FAMILIES

        n = loaded.spec.num_hidden_layers
        family = FAMILIES.get(loaded.spec.model_type)
        if family is not None and family.reference_hidden == "layers" and len(ref_hidden) == n + 1:
            # Mamba's list: each layer's output, then the final norm's; the same places as the others'
            ref_hidden = [None] + list(ref_hidden[:n - 1]) + [ref_hidden[n]]
        k = loaded.spec.layers_per_stored
        if k > 1 and len(ref_hidden) == n // k + 1:
            # one entry per stored layer (LongCat-Flash): ours after each stored layer's last one; the
            # stream between them is not the reference's (a shortcut is still pending there)
            ref_hidden = [ref_hidden[0]] + [ref_hidden[(i + 1) // k] if (i + 1) % k == 0 else None for i in range(n)]
        if len(ref_hidden) != n + 1:
            raise SterError(f"the reference returned {len(ref_hidden)} hidden states for {n} layers")
        if loaded.spec.streams is not None:
            # hyper-connections: Transformers lists the streams [T, n, hidden], ours is their mean; its last
            # entry is after the head's collapse and the final norm, which no mean of ours is
            ref_hidden = [None if h is None or h.ndim != 3 else h.mean(axis=-2) for h in ref_hidden]
        result.layers = []
        for i in range(n):
            if ref_hidden[i + 1] is None:
                continue
            mine, last = hidden[i + 1], i == n - 1
            if last and not (family is not None and family.reference_hidden == "embedding_unnormed"):
                mine = loaded.decoder.final_norm(mine)
            result.layers.append(LayerError(i, _rel(mine, ref_hidden[i + 1]), last))
        result.first_divergent_layer = next((e.layer for e in result.layers if not e.rel_error <= tolerance), None)
    return result


def run_parity(loaded, prompts: Sequence[str], *, reference: str = "transformers", tolerance: float | None = None,
               reference_fn: Reference | None = None, progress: Progress | None = None) -> ParityReport:
    """Compare ``loaded`` with a reference implementation on each prompt.

    Prompts are encoded as raw text with the tokenizer's BOS rule (no chat template),
    and both sides see exactly those ids.

    Args:
        loaded: a ``LoadedModel``.
        prompts: texts.
        reference: "transformers" or "llama.cpp".
        tolerance: a prompt passes when its relative logit error is at most this; it is also
            the threshold that decides the first divergent layer. None: ``QUANTIZED_TOLERANCES``'
            entry for a model quantized on load, ``ROUNDED_TOLERANCES``' for a precision that rounds
            the stored weights (against transformers), else the reference's ``DEFAULT_TOLERANCES`` entry.
        reference_fn: use this reference instead of building one (tests, reuse).
        progress: optional ``progress(event, done, total)`` callback: ``("loading the
            reference", 0, None)`` once before the reference loads, then ``("parity", done, total)``.

    Raises:
        SterError: unknown reference, missing reference package, a model the reference cannot load.
    """
    from .prompt import encode_prompt, prompt_context

    if reference not in REFERENCES:
        raise SterError(f"--reference must be one of {', '.join(REFERENCES)}, got {reference!r}")
    if tolerance is None:
        quantize = getattr(loaded, "quantize", None)
        rounds = getattr(loaded.decoder.weights, "rounds_weights", lambda: False)()
        if quantize:
            tolerance = QUANTIZED_TOLERANCES.get(quantize, DEFAULT_TOLERANCES[reference])
        elif reference == "transformers" and rounds:   # the reference runs the stored, unrounded weights
            tolerance = ROUNDED_TOLERANCES.get(loaded.precision, DEFAULT_TOLERANCES[reference])
        else:
            tolerance = DEFAULT_TOLERANCES[reference]
    if not tolerance >= 0:
        raise SterError(f"--tolerance must be 0 or more, got {tolerance}")
    context = prompt_context(loaded.spec)
    encoded = [encode_prompt(loaded.tokenizer, p, chat_template="off", context=context) for p in prompts]
    for p in encoded:
        if not p.ids:
            raise SterError(f"the prompt {p.text!r} encodes to no tokens")
    if reference_fn is None:
        # before the progress line: a missing package, or a model the reference cannot take, is said first
        if reference == "transformers":
            _require_transformers()
        else:
            _require_llamacpp(loaded.resolved)
        if progress:  # loading transformers and its copy of the model takes tens of seconds
            progress("loading the reference", 0, None)
        if reference == "transformers":
            reference_fn = transformers_reference(loaded.resolved)
        else:
            reference_fn = llamacpp_reference(loaded.resolved, [p.ids for p in encoded])
    report = ParityReport(loaded.resolved.model, loaded.model_revision, loaded.precision, reference, tolerance,
                          quantize=getattr(loaded, "quantize", None))
    for n, p in enumerate(encoded):
        report.prompts.append(compare(loaded, p.text, p.ids, reference_fn, tolerance))
        if progress:
            progress("parity", n + 1, len(encoded))
    return report
