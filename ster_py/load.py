"""From a ``--model`` string to a runnable model: resolve, gate, normalise, map, build.

``load_model`` is the one entry point every command uses, so the GGUF and
safetensors paths meet here in the same ``LoadedModel``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .config import ModelSpec, spec_from_config
from .decoder.model import Decoder
from .errors import SterError
from .files import user_path
from .resolve import Resolved, model_text, resolve
from .tokenizer import Tokenizer
from .validate import check_config, check_spec, interpret
from .weights import SafetensorsWeights, precision_dtype

Progress = Callable[[str, int, "int | None"], None]


@dataclass
class LoadedModel:
    """A model ready to run: its spec, decoder, tokenizer and where it came from."""

    resolved: Resolved
    spec: ModelSpec
    decoder: Decoder
    tokenizer: Tokenizer
    precision: str
    #: --quantize kind the projections were quantized to as the model loaded, or None
    quantize: str | None = None
    #: notes added after loading (an applied adapter's, ``adapters.apply_adapter``), part of ``warnings``
    notes: list[str] = field(default_factory=list)

    @property
    def model_revision(self) -> str | None:
        return self.resolved.model_revision

    @property
    def warnings(self) -> list[str]:
        """Notes on what was loaded that the user should see (a config the resolver read with a warning,
        ``Resolved.notes``; stored tensors this configuration never reads; a GGUF special token id outside the
        vocabulary, ignored as llama.cpp does), one line each; empty for a consistent checkpoint."""
        from .weights import unused_tensor_warnings

        return [*getattr(self.resolved, "notes", ()), *getattr(self.tokenizer, "notes", ()),
                *unused_tensor_warnings(self.spec, self.decoder.weights), *self.notes]

    def stop_ids(self) -> set[int]:
        """End-of-generation ids: the config's eos_token_id(s) and the tokenizer's end tokens."""
        return set(self.spec.eos_token_ids) | set(self.tokenizer.eos_token_ids)


Check = Callable[[Resolved, "ModelSpec | None"], None]


def load_model(model: str, revision: str | None = None, *, precision: str = "f32",
               progress: Progress | None = None, check: Check | None = None,
               quantize: str | None = None) -> LoadedModel:
    """Resolve ``model`` and build its decoder and tokenizer.

    Args:
        model: a local checkpoint directory, a .gguf file, a directory holding one .gguf,
            a preset name (``ster presets``) or a Hugging Face Hub id.
        revision: Hub revision (branch, tag or commit), for a Hub id only: refused with a preset or a
            local path (``resolve.check_hub_revision``).
        precision: weight dtype in memory, 'f32' | 'f16' | 'bf16', or 'auto': each tensor as
            stored when float32, float16 or bfloat16 (a bf16 checkpoint stays bf16, read in
            place by the 16-bit kernels), float32 otherwise. Compute is float32, but for two speed
            trades of generation, on by default: several-token products round their inputs to bfloat16
            where the CPU multiplies those fast (``qmatmul.set_bf16_inputs``, ``$STER_BF16_INPUTS``; a bf16
            SmolLM2's or Gemma 3's prompt logits move by ~1e-2 relative), and one-token products with
            block-quantized weights round theirs to int16 per 32-block (~2e-4). Inside ``ster_py.float_activations()`` every product takes
            its float32 inputs as they are, as ``capture`` and ``parity`` run: compare with transformers there.
        progress: optional ``progress(event, done, total)`` callback for long steps.
        check: optional ``check(resolved, spec)`` that refuses (raises SterError) what cannot
            fit the model, such as a steering vector or an adapter, as early as the model is
            known and before any weight is downloaded or mapped: a Hub model once its config
            is read (``resolved.weight_files`` still empty); a preset before its file is fetched
            (``spec`` None: only its identity is known), and again with its spec once the file
            is there; a local checkpoint or GGUF once its config or metadata is read.
        quantize: 'q8_0' | 'q4_0' | 'q4_k': quantize a safetensors checkpoint's projections
            to GGML blocks as it loads (``Decoder.quantize``; llama.cpp's quantizers, run by
            the GGUF kernels); the float pages of the file are dropped from memory after.

    Raises:
        SterError: anything the user can fix: a refused model, a missing file, a bad tensor;
            whatever ``check`` raises; ``revision`` not a str (``resolve``), ``check`` not callable;
            ``quantize`` for a GGUF model or of an unknown kind; a kernel
            setting ($STER_THREADS, $STER_SIMD_LEVEL, $STER_INTERLEAVE, $STER_F32_PANELS, $STER_BF16_INPUTS) the kernels
            would not understand (``check_kernel_env``).
    """
    from .decoder.qlinear import QUANTIZE_TYPES, check_kernel_env

    check_kernel_env()  # STER_BF16_INPUTS=false would otherwise pass for a setting (it is the CPU's default)
    precision_dtype(precision)  # refuse a bad precision before touching anything
    if check is not None and not callable(check):
        raise SterError(f"check must be a function check(resolved, spec), got {type(check).__name__}")
    if quantize is not None and quantize not in QUANTIZE_TYPES:
        raise SterError(f"--quantize must be one of {', '.join(QUANTIZE_TYPES)}, got {quantize!r}")
    checked: list[bool] = []

    def before_weights(resolved: Resolved) -> None:  # the Hub's config is in, its weights are not
        spec = None
        if resolved.config is not None:
            spec = _spec_of(resolved)
            checked.append(True)
        check(resolved, spec)

    resolved = resolve(model, revision, progress=progress, before_weights=before_weights if check else None)
    if resolved.kind in ("gguf", "gguf_dir"):
        from .gguf.load import load_gguf_model

        if quantize is not None:
            raise SterError(f"--quantize applies to safetensors checkpoints, and {resolved.model} is a GGUF model, "
                            "whose weights run as they are stored; leave out --quantize, or quantize the "
                            "original checkpoint")
        return load_gguf_model(resolved, precision=precision, progress=progress, check=check)
    spec = _spec_of(resolved)
    if check is not None and not checked:
        check(resolved, spec)
    tokenizer = Tokenizer.from_dir(resolved.root)
    if progress:
        progress("map weights", 0, len(resolved.weight_files))
    weights = SafetensorsWeights(resolved.weight_files, precision)
    decoder = Decoder(spec, weights)
    if progress:
        progress("map weights", len(resolved.weight_files), len(resolved.weight_files))
    if tokenizer.vocab_size > spec.vocab_size:
        raise SterError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary is "
                        f"{spec.vocab_size}; tokenizer.json is not from this checkpoint")
    if quantize is not None:
        decoder.quantize(quantize, progress)
        weights.release_pages()  # the float matrices were read once; what still maps them re-reads on use
    return LoadedModel(resolved, spec, decoder, tokenizer, precision, quantize)


def _spec_of(resolved: Resolved) -> ModelSpec:
    """The checked ``ModelSpec`` of a config.json-backed ``resolved``."""
    source = str(resolved.config_path)
    check_config(resolved.config, source)
    return check_spec(interpret(source, spec_from_config, resolved.config, resolved.family, source), source)


def load_tokenizer(model: str, revision: str | None = None, *, progress: Progress | None = None) -> Tokenizer:
    """Resolve ``model`` and build only its tokenizer (and chat template): no weight is mapped or read.

    A directory with tokenizer.json (or PLaMo's tokenizer.jsonl) is read as it is (no config.json, weights or
    runnable family needed); a .gguf file, or a directory holding one, is
    tokenized from its ``tokenizer.ggml.*`` metadata alone, so a vocabulary-only
    GGUF (no tensors) works and the architecture is never gated. Presets and Hub
    ids go through ``resolve`` without weights (a Hub model is gated; only its
    config, tokenizer and side files are downloaded).

    Args:
        model: as for ``load_model``.
        revision: Hub revision (branch, tag or commit).
        progress: optional ``progress(event, done, total)`` callback for downloads.

    Raises:
        SterError: nothing tokenizable there (missing or unreadable files, an
            unsupported GGUF tokenizer scheme, a malformed vocabulary); ``model`` None, not text or
            blank (``resolve.model_text``).
    """
    model = model_text(model)
    path = user_path(model, "the model path")
    if path.is_dir() and any((path / n).is_file() for n in ("tokenizer.json", "tokenizer.jsonl", "tekken.json")):
        return Tokenizer.from_dir(path)  # tokenizer.json, PLaMo's tokenizer.jsonl or Mistral's tekken.json
    if not (path.is_file() and path.name.endswith(".gguf")):
        resolved = resolve(model, revision, progress=progress, weights=False)
        if resolved.tokenizer_path is not None:
            return Tokenizer.from_dir(resolved.root)
        path = resolved.gguf_file
    from .gguf.reader import GGUFFile
    from .gguf.tokenizer import tokenizer_from_gguf_metadata

    source = str(path)
    # allow_unsupported: tensor types do not matter here; only the header is parsed. The
    # metadata's arrays are views of the file, so the tokenizer is built before it closes.
    with GGUFFile(path, allow_unsupported=True) as gguf:
        parts = interpret(source, tokenizer_from_gguf_metadata, gguf.metadata, for_generation=False)
    return parts.to_tokenizer(source)
