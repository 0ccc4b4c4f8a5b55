"""Turn a ``--model`` string into the files a model is made of.

``resolve`` decides where a model lives (a local checkpoint directory, a GGUF
file, or a Hugging Face Hub repository), finds its config, tokenizer and weight
files, and runs the architecture gate (``ster_py.families.gate``) on the
config before any weight is fetched. It never opens or maps a weight file:
it only lists them. It is the only module of ster-py that touches the network.

Behaviour reference: Ster's model resolution (shared/seeds/002, "Local
directory", "Hugging Face Hub", "Refusals").
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ster_py.errors import SterError
from ster_py.files import shown_value, user_path

if TYPE_CHECKING:  # families imports nothing from here; the annotation is for readers
    from ster_py.families import FamilySpec

Progress = Callable[[str, int, "int | None"], None]

CONFIG = "config.json"
TOKENIZER = "tokenizer.json"
#: tiktoken rank files read when there is no tokenizer.json (tokenizer.rank_file_of says under which class).
RANK_FILE_NAMES = ("tokenizer.model", "tiktoken.model")
#: PLaMo's vocabulary, read when there is no tokenizer.json (plamo_tokenizer.py).
PLAMO_TOKENIZER = "tokenizer.jsonl"
# Small files that travel with the tokenizer and config when a repository has them:
# chat template, special tokens and generation defaults are read from them later.
# The index is fetched so that a cache-only (offline) resolution can tell a
# complete sharded checkpoint from an interrupted download.
SIDE_FILES = (
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "model.safetensors.index.json",
)
INDEX = "model.safetensors.index.json"
# Training leftovers that sit beside the weights in some checkpoints.
EXCLUDED_WEIGHT_WORDS = ("optimizer", "training_args")
# Weight formats we do not read, named in refusals so the user knows what was seen.
OTHER_WEIGHT_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".npz")


@dataclass(frozen=True)
class Resolved:
    """Where a model's files are, as decided by :func:`resolve`.

    Attributes:
        model: the ``--model`` string exactly as the user passed it.
        kind: ``"safetensors"`` (config.json + tokenizer.json + top-level
            *.safetensors), ``"gguf"`` (a single GGUF file, everything else
            comes from its metadata) or ``"gguf_dir"`` (config.json +
            tokenizer.json + exactly one .gguf, a llama.cpp fine-tune laid
            beside its base model's config and tokenizer).
        root: the directory holding the files (for a .gguf path, its parent;
            for a Hub model, the cache snapshot directory of the resolved commit).
        config: the parsed config.json, or None for a bare GGUF.
        config_path: path of config.json, or None for a bare GGUF.
        tokenizer_path: path of tokenizer.json, or None for a bare GGUF.
        weight_files: sorted top-level *.safetensors (training leftovers named
            ``optimizer``/``training_args`` excluded), or ``(the .gguf,)``.
        gguf_file: the .gguf file for the two GGUF kinds, else None.
        model_revision: None for a local model; ``sha256:<pin>`` for a preset; for a Hub model the
            resolved 40-hex commit SHA, never a branch name.
        family: the FamilySpec the gate returned for a config.json source, None
            for a bare GGUF (its family comes from the GGUF metadata later).
        notes: warnings about the config (shown with the loaded model's warnings).
    """

    model: str
    kind: str
    root: Path
    config: dict | None
    config_path: Path | None
    tokenizer_path: Path | None
    weight_files: tuple[Path, ...]
    gguf_file: Path | None
    model_revision: str | None
    family: "FamilySpec | None"
    #: warnings about the config the user should see (``families.wrapper_text_type_note``), one line each
    notes: tuple[str, ...] = ()


def model_text(model) -> str:
    """``model`` as the text that names it (an ``os.PathLike``'s path text).

    Raises:
        SterError: None, a number, an empty or blank string: "no model given ...; pass a local directory, a .gguf
            file, a preset name or a Hugging Face Hub id" (an empty ``--model`` is never a request for the default
            preset or the Hub).
    """
    if isinstance(model, os.PathLike):   # a library caller's pathlib.Path: a local path, as its text is
        model = os.fspath(model)
    if hasattr(model, "resolved") and hasattr(model, "decoder"):   # load_model's result (its repr: the whole config)
        raise SterError(f"a loaded model was given where its name is read; pass the model's name or path "
                        f"({model.resolved.model!r}: loaded.resolved.model)")
    if not isinstance(model, str) or not model.strip():
        shown = repr(model) if isinstance(model, str) else shown_value(model)
        raise SterError(f"no model given (--model is {shown}); pass a local directory, a .gguf file, "
                        "a preset name or a Hugging Face Hub id")
    return model


def check_revision(revision) -> None:
    """Refuse a library caller's ``revision`` that is neither None nor a str (``revision=5``): it is recorded as
    ``model_revision``, which captures, vectors and adapters made from the model must hold as text.

    Raises:
        SterError naming the value.
    """
    if revision is not None and not isinstance(revision, str):
        raise SterError(f"revision must be a text (a branch, tag or commit) or None, got {revision!r}")


def check_hub_revision(model: str, revision: str | None, what: str) -> None:
    """Refuse a ``revision`` given with a model that is not a Hub id (``what``: "a preset, pinned as
    sha256:...", "a local GGUF file", "a local directory"): such a model has one version, so a revision
    would select nothing, yet it was recorded as ``model_revision`` in place of the model's own identity,
    and artifacts made under it were refused by later runs.

    Raises:
        SterError naming the revision, the model and what it is.
    """
    if revision is not None:
        raise SterError(f"--revision {revision!r} applies to Hugging Face Hub ids only, and {model} is "
                        f"{what}; leave out --revision")


def resolve(model: str, revision: str | None = None, *, progress: Progress | None = None,
            weights: bool = True, before_weights: Callable[[Resolved], None] | None = None,
            tokenizer: bool = True) -> Resolved:
    """Resolve ``model`` (a string, or an ``os.PathLike`` taken as its path's text) to a :class:`Resolved`
    without reading any weight.

    Order of decisions:

    1. An existing directory is a local checkpoint; the network is never used
       (``huggingface_hub`` is not even imported).
    2. An existing file ending in ``.gguf`` is a bare GGUF model.
    3. A string that looks like a path (starts with ``./``, ``../``, ``/`` or
       ``~``, or ends with ``.gguf``) but names nothing is refused with
       "no such file or directory". Ster sends such strings to the Hub, which
       then fails with a confusing repository error; we refuse them locally.
    4. A preset name (``ster_py.presets.PRESETS``) is fetched or found in the
       cache, verified by SHA-256, and resolved as that GGUF file; its
       ``model_revision`` is ``sha256:<hash>``.
       A name close to a preset's (``presets.close_presets``: another case, a
       prefix, a near spelling; never one holding ``/``) is refused with
       "no preset NAME; did you mean ...?" without touching the network.
    5. Anything else is a Hugging Face Hub model id, resolved at ``revision``
       (default ``"main"``) to a commit SHA. config.json, tokenizer.json and the
       small side files are downloaded first and the architecture gate runs on
       the config; only then are the weight files downloaded. Everything is
       fetched at that SHA, except config.json, fetched at ``revision`` so that
       huggingface_hub records revision -> SHA in its cache for later offline
       runs (a branch that moves in between is refused).
       huggingface_hub's defaults are used untouched, so ``HF_HOME``,
       ``HF_HUB_CACHE``, ``HF_ENDPOINT``, ``HF_TOKEN`` and ``HF_HUB_OFFLINE``
       apply; with ``HF_HUB_OFFLINE=1`` the model is resolved from the local
       cache only.

    The index model.safetensors.index.json is not needed (every top-level
    shard is listed), but when present a shard it names and the directory
    lacks is refused by name.

    Args:
        model: a directory, a .gguf path, or a Hub id such as ``org/name``.
        revision: for a Hub id, a branch, tag or commit (default ``main``); refused (not None) for a
            preset or a local path, which have one version each (``check_hub_revision``).
        weights: False for callers that need only the configuration and tokenizer
            (``ster tokenize``, ``ster template render``): a Hub model's weight files
            are then neither downloaded nor required in the cache, and ``Resolved.weights``
            is empty for it. Local models are resolved as usual (nothing is read).
        tokenizer: False for callers that describe a model without running it (``ster inspect``): a local
            directory without a tokenizer ster reads is then resolved with ``tokenizer_path`` None, and why
            ("tokenizer is missing: ...", what ster needs to run the model) is the last of its ``notes``.
        before_weights: optional ``before_weights(resolved)``, called just before weight
            bytes would be downloaded, so that a caller can refuse what cannot fit the model
            without paying for the download: for a Hub model once its config is read and gated
            (``resolved.weight_files`` is empty then), for a preset before its file is fetched
            or found in the cache (``config`` and ``gguf_file`` are None; ``model_revision`` is
            ``sha256:<pin>``). Not called for local models (no
            download) nor with ``weights=False``; whatever it raises propagates.
        progress: optional ``progress(event, done, total)`` callback, called
            only while downloading from the Hub. ``event`` is
            ``"download <file name>"`` before each file and
            ``"downloaded config"`` / ``"downloaded weights"`` when a phase
            ends; ``done`` and ``total`` count bytes of that phase (``total``
            is None when the Hub did not report every file's size).

    Returns:
        Resolved.

    Raises:
        SterError: for every refusal: a ``revision`` that is not a str (``check_revision``), or one given
            with a preset or a local path (``check_hub_revision``); missing or
            ambiguous files, unreadable
            or invalid config.json, an architecture the gate refuses (raised by
            ``ster_py.families.gate``), a Mistral params.json this build does not run, an
            unreachable/missing/gated repository or revision, a cache that
            lacks the model under ``HF_HUB_OFFLINE``, or a failed download.
    """
    model = model_text(model)
    check_revision(revision)
    path = user_path(model, "the model path")
    if path.is_dir():
        check_hub_revision(model, revision, "a local directory")
        return _resolve_dir(model, path.absolute(), None, tokenizer)
    if path.is_file():
        if path.name.endswith(".gguf"):
            check_hub_revision(model, revision, "a local GGUF file")
            gguf = path.absolute()
            return Resolved(model, "gguf", gguf.parent, None, None, None, (gguf,), gguf, None, None)
        raise SterError(
            f"{model} is a file but not a .gguf file; pass a model directory (config.json, "
            "tokenizer.json, *.safetensors), a .gguf file, or a Hugging Face Hub id"
        )
    if os.path.exists(path):   # a FIFO, a device or a socket: "no such file or directory" said it was not there
        raise SterError(f"{model} is not a regular file or a directory (a pipe, device or socket); pass a model "
                        "directory (config.json, tokenizer.json, *.safetensors), a .gguf file, or a Hugging Face Hub id")
    if _looks_like_path(model) or os.path.lexists(path):
        # lexists without being a file or directory: a dangling symlink.
        raise SterError(f"no such file or directory: {model}")
    from .presets import PRESETS, close_presets, fetch_preset

    near = close_presets(model) if model not in PRESETS else []
    if near:  # refused here, before the Hub is asked about a name that is almost a preset's
        raise SterError(f"no preset {model}; did you mean {' or '.join(near)}? (`ster presets` lists them; "
                        "a Hugging Face Hub id is written owner/name)")
    if model in PRESETS:
        # A preset is a pinned GGUF: fetched (or found in the cache) and verified, then read as a file.
        pin = f"sha256:{PRESETS[model].sha256}"
        check_hub_revision(model, revision, f"a preset, pinned as {pin}")
        if before_weights is not None and weights:
            from .presets import cached_path

            before_weights(Resolved(model, "gguf", cached_path(model).parent, None, None, None, (), None, pin, None))
        gguf = fetch_preset(model, progress)
        return Resolved(model, "gguf", gguf.parent, None, None, None, (gguf,), gguf, pin, None)
    return _resolve_hub(model, revision, progress, weights, before_weights)


def _looks_like_path(model: str) -> bool:
    return model.startswith(("./", "../", "/", "~")) or model.endswith(".gguf")


# --------------------------------------------------------------------------- local


def _resolve_dir(model: str, root: Path, revision: str | None, tokenizer: bool = True) -> Resolved:
    names = _list_dir(root)
    ggufs = sorted(n for n in names if n.endswith(".gguf") and (root / n).is_file())
    if CONFIG not in names:
        if "params.json" in names:
            return _resolve_mistral_dir(model, root, names, revision, tokenizer=tokenizer)
        if len(ggufs) == 1:
            gguf = root / ggufs[0]
            return Resolved(model, "gguf", root, None, None, None, (gguf,), gguf, revision, None)
        if len(ggufs) > 1:
            raise _too_many_ggufs(root, ggufs)
        if "adapter_config.json" in names:  # a PEFT adapter given as the model: "config is missing" did not say so
            raise SterError(
                f"{root} is a LoRA adapter (adapter_config.json, as PEFT saves one), not a model: run its base "
                f"model with --adapter {root} (generate, chat, serve), or merge it into the base with "
                f"`ster tune merge --model BASE --adapter {root} --output DIR`")
        raise SterError(
            f"model config is missing: {root / CONFIG}; a model directory needs config.json, "
            "tokenizer.json and *.safetensors weights (or a single .gguf file)"
        )
    config_path = root / CONFIG
    try:
        tokenizer_path, missing = _require_tokenizer(root, names), None
    except SterError as e:
        if tokenizer:
            raise
        tokenizer_path, missing = None, str(e)
    config = read_config(config_path)
    config, family, notes = _gate(config, config_path)
    notes = _with_missing_tokenizer(notes, missing)
    weights = _safetensors_in(root, names)
    if weights:
        _check_index(root, names)
        return Resolved(model, "safetensors", root, config, config_path, tokenizer_path, weights, None, revision,
                        family, notes)
    if len(ggufs) == 1:
        gguf = root / ggufs[0]
        return Resolved(model, "gguf_dir", root, config, config_path, tokenizer_path, (gguf,), gguf, revision,
                        family, notes)
    if len(ggufs) > 1:
        raise _too_many_ggufs(root, ggufs)
    raise SterError(f"model directory contains no safetensors weights: {root}{_weights_hint(names)}")


def _resolve_mistral_dir(model: str, root: Path, names: list[str], revision: str | None,
                         with_weights: bool = True, tokenizer: bool = True) -> Resolved:
    """A directory in Mistral's own format: params.json (put in the Transformers shape by
    ``mistral_format.config_from_params``, then gated), the consolidated* weights, and a tokenizer.json
    or Mistral's tekken.json beside them (a SentencePiece tokenizer.model alone is refused by name)."""
    from .mistral_format import PARAMS, config_from_params, weight_names
    from .tiktoken_bpe import TEKKEN

    params_path = root / PARAMS
    params = read_config(params_path)
    config = config_from_params(params, params_path)
    tokenizer_name = TOKENIZER if TOKENIZER in names else TEKKEN if TEKKEN in names else None
    missing = None
    if tokenizer_name is None:
        found = [n for n in names if n.startswith("tokenizer.model")]
        hint = (f" (found {', '.join(found)}: ster does not read a SentencePiece tokenizer.model; use the "
                "Transformers-format checkpoint's tokenizer.json, or write one beside params.json, e.g. with "
                "transformers' AutoTokenizer(...).save_pretrained)" if found else "")
        missing = f"tokenizer is missing: {root / TOKENIZER} (or Mistral's {TEKKEN}){hint}"
        if tokenizer:
            raise SterError(missing)
    config, family, notes = _gate(config, params_path)
    notes = _with_missing_tokenizer(notes, missing)
    weights = tuple(root / n for n in weight_names(names) if (root / n).is_file())
    if not weights and with_weights:
        raise SterError(f"model directory {root} in Mistral's own format (params.json) holds no "
                        "consolidated*.safetensors weights; download them")
    return Resolved(model, "safetensors", root, config, params_path,
                    None if tokenizer_name is None else root / tokenizer_name, weights, None, revision, family, notes)


def _with_missing_tokenizer(notes, missing: str | None) -> tuple[str, ...]:
    """``notes`` and, when the tokenizer is ``missing`` (``resolve(tokenizer=False)``), the line saying so."""
    if missing is None:
        return tuple(notes)
    return (*notes, f"{missing}; ster read the rest of the model without it, but needs that tokenizer to run the "
                    "model (generate, chat, serve, tokenize, ...): put the model's tokenizer.json in "
                    "the directory")


def _list_dir(root: Path) -> list[str]:
    try:
        return sorted(os.listdir(root))
    except OSError as error:
        raise SterError(f"failed to list {root}: {error.strerror or error}") from None


def _safetensors_in(root: Path, names: list[str]) -> tuple[Path, ...]:
    """Top-level weight files of ``root``, sorted by name (shards sort in order)."""
    return tuple(root / n for n in sorted(names) if _is_weight_name(n) and (root / n).is_file())


def _is_weight_name(name: str) -> bool:
    """A Transformers-format weight file: Mistral's consolidated* files (its own format, published beside the
    Transformers shards by repositories that carry both) are not."""
    return (name.endswith(".safetensors") and not any(w in name for w in EXCLUDED_WEIGHT_WORDS)
            and not name.startswith("consolidated"))


def _require_tokenizer(root: Path, names: list[str]) -> Path:
    if TOKENIZER in names:
        return root / TOKENIZER
    from .tokenizer import rank_file_of, tokenizer_class_of

    ranks = rank_file_of(root)  # GLM-4's / Kimi's tiktoken ranks under the tokenizer class that reads them
    if ranks is not None:
        return ranks
    if PLAMO_TOKENIZER in names:  # PLaMo's own vocabulary (plamo_tokenizer.py)
        return root / PLAMO_TOKENIZER
    found = [n for n in ("tokenizer.model", "tokenizer.jsonl", "tiktoken.model", "vocab.json") if n in names]
    named = tokenizer_class_of(root) if found else None
    named = f", under tokenizer_class {named[:80]!r}" if named else ""
    hint = (
        f" (found {', '.join(found)}{named}; only a tokenizers-library tokenizer.json is read, or a tiktoken "
        "tokenizer.model / tiktoken.model that tokenizer_config.json names ChatGLM4Tokenizer / TikTokenTokenizer, "
        "or PLaMo's tokenizer.jsonl: use a checkpoint that ships tokenizer.json, or save one with the tokenizers or "
        "transformers library)"
        if found
        else ""
    )
    raise SterError(f"tokenizer is missing: {root / TOKENIZER}{hint}")


def _check_index(root: Path, names: list[str]) -> None:
    """Refuse a sharded checkpoint whose index names a shard that is not there.

    The index is not needed to load (every top-level shard is read), but when it
    is present a missing shard is better reported here, by name, than later as
    a missing tensor. An unreadable index is ignored for the same reason.
    """
    if INDEX not in names:
        return
    from .files import read_regular

    data = read_regular(root / INDEX, "checkpoint index")  # a FIFO or /dev/zero must not block or fill memory
    try:
        weight_map = json.loads(data).get("weight_map")
    except (ValueError, AttributeError, RecursionError):
        return
    if not isinstance(weight_map, dict):
        return
    missing = sorted({str(f) for f in weight_map.values()} - set(names))
    if missing:
        raise SterError(
            f"{root / INDEX} names {len(missing)} weight file(s) missing from {root}: {', '.join(missing)}; "
            "download the missing shards"
        )


def _weights_hint(names: list[str]) -> str:
    ignored = [n for n in names if n.endswith(".safetensors") and not _is_weight_name(n)
               and not n.startswith("consolidated")]
    other = [n for n in names if n.endswith(OTHER_WEIGHT_SUFFIXES)]
    native = [n for n in names if n.startswith("consolidated") and n.endswith(".safetensors")]
    parts = []
    if native:
        parts.append(f"found {', '.join(native)}, Mistral's own format, which is read only from a directory with "
                     "params.json and no config.json")
    if other:
        parts.append(f"found {', '.join(other)}, which is not a format ster reads; convert it to safetensors")
    if ignored:
        parts.append(f"ignored training files {', '.join(ignored)}")
    return f" ({'; '.join(parts)})" if parts else "; add the model's *.safetensors files, or one .gguf file"


def _too_many_ggufs(root: Path, ggufs: list[str]) -> SterError:
    return SterError(
        f"model directory {root} holds {len(ggufs)} .gguf files ({', '.join(ggufs)}); "
        "keep exactly one, or pass the path of the .gguf file to use"
    )


# --------------------------------------------------------------------------- config + gate


def read_config(path: Path) -> dict:
    """Parse a config.json into a dict.

    Raises:
        SterError: "failed to read PATH: DETAIL" when the file cannot be read
            (missing, not a regular file, over 64 MiB);
            "invalid model config PATH: DETAIL" when it is not UTF-8 JSON or
            its top level is not an object.
    """
    from .files import read_regular

    data = read_regular(path, "")
    try:
        config = json.loads(data)
    except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
        raise SterError(f"invalid model config {path}: {error}") from None
    except RecursionError:  # the parser recurses once per level of nesting
        raise SterError(f"invalid model config {path}: its JSON is nested too deeply to read (thousands of "
                        "levels); a real config.json is a few levels deep") from None
    if not isinstance(config, dict):
        raise SterError(f"invalid model config {path}: the top level is a JSON {type(config).__name__}, not an object")
    return config


def _gate(config: dict, config_path: Path) -> tuple[dict, "FamilySpec", tuple[str, ...]]:
    """(the decoder's config, its family, warnings): a multimodal wrapper's config becomes its text
    decoder's (``families.unwrap``), whose tensors the family then names below the wrapper's prefix."""
    # Imported here so that the family table loads only when a config is gated.
    from ster_py import families
    from ster_py.validate import interpret

    # The family's refusal rules read untrusted values: a Python error in one is the config's fault.
    note = interpret(str(config_path), families.wrapper_text_type_note, config, config_path)
    config, prefix = interpret(str(config_path), families.unwrap, config, config_path)
    family = interpret(str(config_path), families.gate, config, config_path)
    return config, family.stored_under(prefix) if prefix else family, (note,) if note else ()


# --------------------------------------------------------------------------- Hub


def _resolve_hub(model: str, revision: str | None, progress: Progress | None, with_weights: bool = True,
                 before_weights: Callable[[Resolved], None] | None = None) -> Resolved:
    import huggingface_hub as hub
    from huggingface_hub import constants

    rev = revision or "main"
    offline = getattr(constants, "is_offline_mode", lambda: constants.HF_HUB_OFFLINE)()
    if offline:
        return _resolve_cache(model, rev, with_weights)
    try:
        api = hub.HfApi()
    except Exception as error:  # noqa: BLE001 - any failure here is reported, none is expected
        raise SterError(f"failed to initialize Hugging Face Hub client: {error}") from None
    try:
        info = api.model_info(model, revision=rev, files_metadata=True)
    except Exception as error:
        if not _is_hub_failure(error):
            raise  # a bug, not a situation the user can act on
        raise SterError(_repository_error(model, rev, error)) from None
    sha = info.sha  # the resolved commit; branch names never reach model_revision
    sizes = {s.rfilename: s.size for s in (info.siblings or [])}
    # Mistral's own format only when the repository publishes no Transformers config (seed 002)
    native = CONFIG not in sizes and "params.json" in sizes
    config_name = "params.json" if native else CONFIG
    if config_name not in sizes:
        raise SterError(f"model config is missing: {model} publishes no config.json at revision {sha}")
    # without tokenizer.json, a tiktoken rank file read under its tokenizer_config.json's class (checked below)
    tekken = "tekken.json" if "tekken.json" in sizes else None  # Mistral's own tokenizer (tiktoken_bpe.py)
    tok_name = TOKENIZER if TOKENIZER in sizes else tekken if native else next(
        (n for n in RANK_FILE_NAMES if n in sizes and "tokenizer_config.json" in sizes),
        PLAMO_TOKENIZER if PLAMO_TOKENIZER in sizes else None)
    if tok_name is None:
        found = [n for n in sorted(sizes) if native and n.startswith("tokenizer.model")]
        hint = (f" (it publishes {', '.join(found)}, which ster does not read; write a tokenizer.json beside "
                "params.json in a local copy, or use the Transformers-format checkpoint)" if found else "")
        raise SterError(f"tokenizer is missing: {model} publishes no tokenizer.json at revision {sha}{hint}")

    small = [config_name, tok_name] + [n for n in SIDE_FILES if n in sizes]
    # config.json is fetched at the user's revision, not the SHA: that is how
    # huggingface_hub records "revision -> commit" in the cache, which a later
    # HF_HUB_OFFLINE run needs to find the snapshot. Its snapshot folder names the
    # commit it came from; the other files are fetched at the SHA itself.
    paths = _download(hub, model, sha, small, sizes, progress, "config", first_at=rev)
    config_path, tokenizer_path = paths[config_name], paths[tok_name]
    if tok_name not in (TOKENIZER, tekken):
        tokenizer_path = _require_tokenizer(tokenizer_path.parent, [tok_name])
    sha = sha or config_path.parent.name  # model_info always states it; the snapshot folder names it too
    if config_path.parent.name != sha:
        raise SterError(
            f"revision {rev} of {model} moved while it was being resolved (from {sha} to "
            f"{config_path.parent.name}); run again, or pass a commit SHA as the revision"
        )
    config = read_config(config_path)
    if native:
        from .mistral_format import config_from_params

        config = config_from_params(config, config_path)
    config, family, notes = _gate(config, config_path)
    if not with_weights:
        return Resolved(model, "safetensors", config_path.parent, config, config_path, tokenizer_path, (), None, sha,
                        family, notes)

    if native:
        from .mistral_format import weight_names

        weights = weight_names([n for n in sizes if "/" not in n])
    else:
        weights = sorted(n for n in sizes if "/" not in n and _is_weight_name(n))
    if not weights:
        other = sorted(n for n in sizes if "/" not in n and n.endswith(OTHER_WEIGHT_SUFFIXES + (".gguf",)))
        hint = f" (it has {', '.join(other)})" if other else ""
        advice = "; download a .gguf file and pass its path" if any(n.endswith(".gguf") for n in other) else ""
        raise SterError(f"model {model} publishes no safetensors weights at revision {sha}{hint}{advice}")
    if before_weights is not None:
        before_weights(Resolved(model, "safetensors", config_path.parent, config, config_path, tokenizer_path, (),
                                None, sha, family, notes))
    paths = _download(hub, model, sha, weights, sizes, progress, "weights")
    files = tuple(paths[n] for n in weights)
    return Resolved(model, "safetensors", config_path.parent, config, config_path, tokenizer_path, files, None, sha,
                    family, notes)


def _download(hub, model: str, sha: str, names: list[str], sizes: dict, progress, phase: str,
              first_at: str | None = None) -> dict[str, Path]:
    """Download ``names`` at commit ``sha`` (the first at ``first_at`` if given) into the
    Hugging Face cache, in order; returns name -> path in the cache snapshot."""
    known = [sizes.get(n) for n in names]
    total = sum(known) if all(s is not None for s in known) else None
    done = 0
    out: dict[str, Path] = {}
    for name, size in zip(names, known):
        if progress is not None:
            progress(f"download {name}", done, total)
        try:
            at = first_at if (first_at and not out) else sha
            bar = _quiet_tqdm(progress, f"download {name}", done, total)
            out[name] = Path(hub.hf_hub_download(model, name, revision=at, tqdm_class=bar))
        except Exception as error:
            if not _is_hub_failure(error):
                raise
            raise SterError(f"failed to download {name} from {model} at {sha}: {_detail(error)}") from None
        done += size or 0
    if progress is not None:
        progress(f"downloaded {phase}", done, total)
    return out


def _quiet_tqdm(progress: Progress | None = None, event: str = "", before: int = 0, total: int | None = None):
    """A progress-bar class for huggingface_hub that never draws.

    Nothing below the CLI prints; huggingface_hub would otherwise draw its own
    bars on stderr. Instead each chunk huggingface_hub counts is reported as
    ``progress(event, before + bytes of this file so far, total)``, so the bytes
    of a phase rise as a file arrives, not only between files. A Xet download
    counts the same bytes on two bars (reconstruction and transfer): the larger
    count is the file's.
    """
    from huggingface_hub.utils import tqdm as hf_tqdm

    counts: list[int] = []

    class Quiet(hf_tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            self.slot = len(counts)
            counts.append(int(kwargs.get("initial") or 0))  # a resumed download starts past 0
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            counts[self.slot] += int(n or 0)
            if progress is not None and n:
                progress(event, before + max(counts), total)
            return super().update(n)

    return Quiet


def _repository_error(model: str, rev: str, error: Exception) -> str:
    from huggingface_hub import constants, errors

    advice = "check the id and revision, or pass a local directory"
    if isinstance(error, errors.HFValidationError):
        return (
            f"{model} is neither an existing local path nor a valid Hugging Face Hub id ({error}); "
            "fix the path or the id"
        )
    if isinstance(error, errors.GatedRepoError):
        why = ("the repository is gated: accept its terms on its Hub page and log in "
               "(hf auth login, or set HF_TOKEN)")
    elif isinstance(error, errors.RepositoryNotFoundError):
        why = "no such repository (or it is private and no token with access is configured)"
    elif isinstance(error, errors.RevisionNotFoundError):
        why = f"no such revision {rev}"
    elif isinstance(error, errors.DisabledRepoError):
        why = "the repository is disabled"
    elif isinstance(error, errors.HfHubHTTPError):
        why = f"the Hub answered {_detail(error)}"
    else:
        why = (f"could not reach {constants.ENDPOINT} ({_detail(error)}); check the network or HF_ENDPOINT, "
               "or set HF_HUB_OFFLINE=1 to use the local cache")
    if "/" not in model:  # a bare name is more often a local directory not made yet than a legacy Hub id
        return (f"no local file or directory named {model} here, and read as a Hugging Face Hub id, revision "
                f"{rev} failed: {why}; {advice}")
    return f"failed to read model repository {model} at revision {rev}: {why}; {advice}"


def _is_hub_failure(error: Exception) -> bool:
    """True for what the Hub, the network or the disk can raise during a download.

    huggingface_hub raises OSError subclasses for HTTP, cache and offline errors,
    its own exception types otherwise, and lets its HTTP stack's transport errors
    (httpx, or requests in older versions) through. Anything else is a bug here.
    """
    root = type(error).__module__.split(".")[0]
    return isinstance(error, OSError) or root in (
        "huggingface_hub", "hf_xet", "httpx", "httpx2", "httpcore", "httpcore2", "requests", "urllib3")


def _detail(error: Exception) -> str:
    # Hub errors are multi-line: a status line ("404 Client Error."), then what was
    # not found and at which URL, then generic advice. The first two lines say it.
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return " ".join(lines[:2]) if lines else type(error).__name__


def _resolve_cache(model: str, rev: str, with_weights: bool = True) -> Resolved:
    """Resolve from the local Hugging Face cache only (``HF_HUB_OFFLINE`` is set)."""
    import huggingface_hub as hub
    from huggingface_hub import constants, errors

    where = f"HF_HUB_OFFLINE is set and the local Hugging Face cache ({constants.HF_HUB_CACHE})"
    todo = "run once with network access to fill the cache, unset HF_HUB_OFFLINE, or pass a local directory"
    try:
        config_path = Path(hub.hf_hub_download(model, CONFIG, revision=rev, local_files_only=True))
    except errors.HFValidationError as error:
        raise SterError(_repository_error(model, rev, error)) from None
    except (OSError, errors.EntryNotFoundError):  # LocalEntryNotFoundError and kin: not cached
        params = hub.try_to_load_from_cache(model, "params.json", revision=rev)
        if isinstance(params, str):  # a snapshot in Mistral's own format
            snapshot = Path(params).parent
            return _resolve_mistral_dir(model, snapshot, _list_dir(snapshot), snapshot.name, with_weights)
        raise SterError(
            f"failed to read model repository {model} at revision {rev}: {where} has no config.json "
            f"for it; {todo}"
        ) from None
    root = config_path.parent  # snapshots/<commit sha>
    names = _list_dir(root)
    try:
        tokenizer_path = _require_tokenizer(root, names)
    except SterError:
        raise SterError(f"tokenizer is missing: {root / TOKENIZER} ({where} lacks it; {todo})") from None
    config = read_config(config_path)
    config, family, notes = _gate(config, config_path)
    if not with_weights:
        return Resolved(model, "safetensors", root, config, config_path, tokenizer_path, (), None, root.name,
                        family, notes)
    weights = _safetensors_in(root, names)
    if not weights:
        raise SterError(
            f"model {model} has no safetensors weights in the local cache at {root}: {where} lacks them; {todo}"
        )
    _check_index(root, names)
    return Resolved(model, "safetensors", root, config, config_path, tokenizer_path, weights, None, root.name,
                    family, notes)
