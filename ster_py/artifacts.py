"""Files ster writes and reads beside models: atomic writes, a streaming safetensors
writer, artifact sniffing and the "made for this model?" check.

Shared by capture, steering, adapters and tune merge so that every artifact is
written the same way (temporary name, then one rename: a failure leaves nothing
half-written) and every refusal names the path and the mismatch.

Safetensors layout (huggingface/safetensors, docs "Format"): an 8-byte
little-endian header length, a JSON header ``{name: {dtype, shape,
data_offsets: [begin, end]}, "__metadata__": {str: str}}`` padded with spaces to
a multiple of 8 bytes, then the tensors' bytes, C order, little-endian.
"""
from __future__ import annotations

import functools
import json
import os
import struct
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import ml_dtypes
import numpy as np

from .errors import SterError
from .files import signals_held, sync_to_disk, temporary, write_error

# numpy dtype -> safetensors dtype string.
ST_DTYPES: dict[np.dtype, str] = {
    np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
    np.dtype(ml_dtypes.bfloat16): "BF16", np.dtype(np.int64): "I64", np.dtype(np.int32): "I32",
    np.dtype(np.int16): "I16", np.dtype(np.int8): "I8", np.dtype(np.uint64): "U64",
    np.dtype(np.uint32): "U32", np.dtype(np.uint16): "U16", np.dtype(np.uint8): "U8",
    np.dtype(np.bool_): "BOOL", np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3",
    np.dtype(ml_dtypes.float8_e5m2): "F8_E5M2",
}


def st_dtype(dtype) -> str:
    """numpy dtype -> safetensors dtype name. Raises SterError for a dtype safetensors lacks."""
    try:
        return ST_DTYPES[np.dtype(dtype)]
    except KeyError:
        raise SterError(f"dtype {np.dtype(dtype)} cannot be stored in safetensors") from None


def safetensors_header(specs: Iterable[tuple[str, np.dtype, tuple[int, ...]]],
                       metadata: Mapping[str, str] | None = None) -> tuple[bytes, list[int]]:
    """The header bytes (length prefix included) for tensors given as (name, dtype, shape),
    and each tensor's byte size, in the given order."""
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    sizes, offset = [], 0
    for name, dtype, shape in specs:
        if name in header:
            raise SterError(f"tensor name {name!r} appears twice in one safetensors file")
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        header[name] = {"dtype": st_dtype(dtype), "shape": [int(s) for s in shape],
                        "data_offsets": [offset, offset + size]}
        sizes.append(size)
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, sizes


def write_safetensors(path: Path, specs: list[tuple[str, np.dtype, tuple[int, ...]]], arrays: Iterable[np.ndarray],
                      metadata: Mapping[str, str] | None = None) -> None:
    """Write a safetensors file tensor by tensor (only one array in memory at a time).

    Args:
        path: destination (written in place; callers write into a temporary location).
        specs: (name, dtype, shape) for every tensor, in file order.
        arrays: the tensors in the same order (a generator is fine); each must match its spec.
        metadata: optional string map stored as ``__metadata__``.

    Raises:
        SterError: an array whose dtype or shape differs from its spec, or too few arrays.
        OSError: the file cannot be written (a full disk: ``atomic_outputs`` / ``atomic_directory``, which
            callers write through, turn it into one "cannot write" SterError).
    """
    head, sizes = safetensors_header(specs, metadata)
    it = iter(arrays)
    with open(path, "wb") as f:
        f.write(head)
        for (name, dtype, shape), size in zip(specs, sizes):
            a = next(it, None)
            if a is None:
                raise SterError(f"internal: no data for tensor {name!r}")
            if a.dtype != np.dtype(dtype) or tuple(a.shape) != tuple(shape):
                raise SterError(f"internal: tensor {name!r} is {a.dtype}{list(a.shape)}, "
                                f"expected {np.dtype(dtype)}{list(shape)}")
            # f.write, not ndarray.tofile: tofile passes small arrays through a C stdio buffer whose failed flush
            # (ENOSPC) numpy never reports, leaving a short file that looks written. x86/arm are little-endian.
            f.write(memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_folder(path: Path) -> None:
    """The one check of an output path every writing command makes: refuse an output whose folder
    does not exist (nothing is created for it), or that is a symbolic link.

    A mistyped folder (``--output ~/vecs/a.gguf`` with no ``~/vecs``) is far likelier than a wish
    for a new one, and a folder made silently hides the typo; the user makes it with ``mkdir``.
    A link (dangling or not) is refused: outputs are written to a temporary file renamed onto the
    name, which would replace the link itself, and following it would write wherever it points.
    Call before any work is done for the output (the commands call it before reading weights).

    Raises:
        SterError: "folder X does not exist; create it first ..." (or "X is not a folder"), or
            "PATH is a symbolic link ...".
    """
    if os.path.islink(path):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        state = "" if os.path.exists(path) else ", a dangling one"
        raise SterError(f"cannot write {path}: it is a symbolic link{state} (to {target[:200]}); ster neither "
                        "replaces a link nor writes through it: give the real path, or remove the link")
    parent = Path(path).parent  # the folder the writer uses, as given
    if parent.is_dir():
        return
    if os.path.lexists(parent):
        raise SterError(f"cannot write {path}: {parent} is not a folder")
    raise SterError(f"cannot write {path}: folder {parent} does not exist; create it first (mkdir -p {parent}) "
                    "or give another path")


@contextmanager
def atomic_outputs(*paths: Path) -> Iterator[list[Path]]:
    """Yield temporary paths beside ``paths``; on success rename each onto its target.

    On any exception the temporaries are removed and nothing at ``paths`` changes,
    so a failed run leaves no partial file. The temporaries are flushed to the disk (``sync_to_disk``)
    before the renames.

    Raises:
        SterError: a target's folder does not exist (``check_folder``: no folder is created), or cannot be
            written (``writing``); an ``OSError`` of the body (a full disk) or of the flush, as one
            "cannot write PATH: ...; nothing was written" (``files.write_error``).
    """
    with ExitStack() as stack:
        temps = []
        for p in paths:
            check_folder(p)
            with signals_held():   # made and put on the stack in one step (files.temporary)
                temps.append(stack.enter_context(temporary(p.parent, f".{p.name}.", ".tmp", directory=False,
                                                           target=p)))
        try:
            yield temps
            for tmp in temps:
                sync_to_disk(tmp)
        except OSError as e:
            raise write_error(" and ".join(str(p) for p in paths), e, temps) from None
        mode = 0o666 & ~_umask()  # mkstemp makes 0600; outputs get the usual permissions
        for tmp, p in zip(temps, paths):
            with writing(p):
                os.chmod(tmp, mode)
                os.replace(tmp, p)


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn an OSError of creating, or renaming onto, the output ``path`` into one SterError.

    Raises:
        SterError: "cannot write PATH: <reason>..." (an unwritable or missing directory, a read-only file system,
            a full disk (``files.write_error``), a name that is a directory, ...).
    """
    try:
        yield
    except OSError as e:
        if isinstance(e, IsADirectoryError) or Path(path).is_dir():
            raise SterError(f"cannot write {path}: it is a directory; give a file name") from None
        raise write_error(path, e) from None


@contextmanager
def atomic_directory(target: Path, shown_as: Path | None = None) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``target``; rename it to ``target`` on success.

    Its files are flushed to the disk (``sync_to_disk``) before the rename. ``shown_as``: the output a
    write error names when ``target`` is a step towards it (default ``target``).

    Raises:
        SterError: ``target`` already exists (nothing is overwritten); its parent folder does not exist
            (``check_folder``: only ``target`` itself is created); an ``OSError`` of the body (a full disk)
            or of the flush, as one "cannot write TARGET: ...; nothing was written" (``files.write_error``).
    """
    target = Path(target)
    if target.exists():
        raise SterError(f"{target} already exists; choose a new --output directory or remove it first")
    check_folder(target)
    with temporary(target.parent, f".{target.name}.", ".tmp", target=target) as tmp:
        try:
            yield tmp
            sync_to_disk(tmp)
        except OSError as e:
            raise write_error(shown_as or target, e, [tmp]) from None
        if target.exists():
            raise SterError(f"{target} appeared while writing; nothing was overwritten")
        with writing(target):
            os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; a new directory gets the usual permissions
            os.rename(tmp, target)


class _DuplicateKey(Exception):
    """A JSON object naming one key twice (its text, cut to 40 characters, is the message)."""


def _unique_keys(pairs: list) -> dict:
    """``json.loads``' object hook: the object, refusing a key given twice (``json`` keeps the last)."""
    doc = dict(pairs)
    if len(doc) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(json.dumps(key)[:40])
            seen.add(key)
    return doc


def read_json(path: Path, what: str) -> dict:
    """Parse a JSON object from ``path``; SterError naming ``what`` and the path otherwise."""
    from .files import read_regular

    if not os.path.lexists(path):
        raise SterError(f"{what} {path} does not exist")
    raw = read_regular(path, what)
    if raw[:4] == b"GGUF":  # a llama.cpp file (a control vector from `ster vector export`, or a model)
        raise SterError(f"{what} {path} is a GGUF file, not JSON; give the JSON file ster wrote (a steering vector "
                        "from `ster vector caa` / `pca`, not its llama.cpp export)")
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except UnicodeDecodeError:
        raise SterError(f"{what} {path} is not readable JSON: it is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise SterError(f"{what} {path} is not readable JSON ({e.msg} at line {e.lineno}, column {e.colno})") \
            from None
    except _DuplicateKey as e:
        raise SterError(f"{what} {path} names the key {e} twice in one object; a JSON reader keeps one of "
                        "them silently, so fix the file (or make it again)") from None
    except ValueError as e:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise SterError(f"{what} {path} is not readable JSON ({e})") from None
    except RecursionError:  # the parser recurses once per level of nesting
        raise SterError(f"{what} {path} is not readable JSON: it is nested too deeply (thousands of levels)") \
            from None
    if not isinstance(doc, dict):
        raise SterError(f"{what} {path} is not a JSON object")
    return doc


STEERING_FORMAT = "ster.steering"
CAPTURE_FORMAT = "ster.capture"
LORA_FORMAT = "ster.lora"


def sniff(doc: Mapping, path: Path) -> str:
    """Which kind of artifact a parsed JSON document is.

    Returns one of "steering", "capture", "lora" (Ster's adapter sidecar), "peft"
    (PEFT's adapter_config.json), "reward" or "unknown". Used to refuse an artifact
    passed to the wrong flag with a message that says which flag it belongs to.
    """
    fmt = str(doc.get("format", ""))
    name = Path(path).name
    if "reward" in fmt or "reward" in str(doc.get("kind", "")) or ".reward." in name or "reward_head" in doc:
        return "reward"
    if fmt == STEERING_FORMAT or ("directions" in doc and "method" in doc):
        return "steering"
    if fmt == CAPTURE_FORMAT:
        return "capture"
    if "peft_type" in doc:
        return "peft"
    if fmt == LORA_FORMAT or name.endswith(".lora.json") or {"rank", "alpha", "targets"} <= set(doc):
        return "lora"
    return "unknown"


KIND_WORDS = {
    "steering": "a steering vector (pass it with --vector)",
    "capture": "a capture sidecar (build a vector from it with `ster vector caa`)",
    "lora": "a LoRA adapter sidecar (pass it with --adapter)",
    "peft": "a PEFT adapter config (pass its directory with --adapter)",
    "reward": "a reward artifact (a scoring head, not a LoRA adapter or a steering vector)",
    "unknown": "not a ster artifact",
}


def _as_path(s: str) -> Path | None:
    """The existing file or directory a model name denotes, resolved; None for a name that is none (a
    Hub id), including one no path can be: too long for the file system, or holding a NUL (an artifact's
    ``model`` comes from a file a user was handed)."""
    try:
        p = Path(s).expanduser()
        return p.resolve() if p.exists() else None
    except (OSError, ValueError, RuntimeError):   # ENAMETOOLONG, EACCES; embedded NUL; a ~user that is none
        return None


def _sha256_of(path: Path) -> str:
    """``sha256:<hex>`` of a file's bytes (remembered for the file's size and modification time, so that a
    run that checks an artifact and then writes one hashes a large GGUF once)."""
    st = os.stat(path)
    return _sha256_cached(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def _is_content_hash(revision: str | None) -> bool:
    return bool(revision) and revision.startswith("sha256:")


def content_revision(resolved) -> str | None:
    """What an artifact records as its ``model_revision``: the model's own (a Hub commit, a preset's
    ``sha256:`` pin), or, for a local GGUF file (which has none), the file's SHA-256 as ``sha256:<hex>``:
    its content identity, so that the artifact fits a byte-identical copy at another path (``check_model``).
    A local checkpoint directory has no content identity: None.

    Raises:
        SterError: the GGUF file cannot be read.
    """
    if resolved.model_revision is None and resolved.kind == "gguf" and resolved.gguf_file is not None:
        try:
            return _sha256_of(Path(resolved.gguf_file))
        except OSError as e:
            raise SterError(f"cannot read {resolved.gguf_file}: {e.strerror or e}") from None
    return resolved.model_revision


def _same_gguf_content(claimed: str, claimed_revision: str | None, resolved) -> bool:
    """True when the artifact's model and the loaded one are the same GGUF file by content, whatever their
    paths: the artifact's revision is a content hash (a preset's pin, or a local GGUF file's hash from
    ``content_revision``) equal to the loaded file's, or, for an artifact without one, the file its ``model``
    names has the loaded file's bytes (a preset and its path, a copy of a file). A preset not fetched yet
    (``gguf_file`` None) is known by its pin, its ``model_revision``; a file of another size is never hashed."""
    mine = resolved.gguf_file
    pin = resolved.model_revision if _is_content_hash(resolved.model_revision) else None
    if resolved.kind != "gguf" or (mine is None and pin is None):
        return False
    try:
        if _is_content_hash(claimed_revision):
            return claimed_revision == (pin if mine is None else _sha256_of(Path(mine)))
        theirs = _as_path(claimed)
        if theirs is None or not theirs.is_file():
            return False
        # a file of another size is another file: no need to hash (a 40 GB GGUF took minutes to refuse)
        if mine is not None and theirs.stat().st_size != Path(mine).stat().st_size:
            return False
        return _sha256_of(theirs) == (pin or _sha256_of(Path(mine)))
    except OSError:   # a file this user cannot read is not shown to be the same
        return False


def model_identity(resolved) -> str:
    """What an artifact records as its ``model``: the --model string, made absolute when
    it names a local file or directory (so the artifact still matches from another
    working directory)."""
    local = _as_path(resolved.model)
    return str(local) if local is not None else resolved.model


def check_model(path: Path, what: str, claimed: str | None, claimed_revision: str | None, resolved, *,
                hint: bool = False) -> str | None:
    """Refuse an artifact made for another model.

    The artifact's ``model`` matches when it is the same string as the loaded
    ``--model``, both name the same existing file or directory, or both are the same
    GGUF file by SHA-256 (a preset name and that file's path, a copy of a file at another path:
    ``_same_gguf_content``). When both sides carry a
    revision, they must be equal.

    Args:
        path: the artifact (named in the message).
        what: "steering vector", "adapter", ...
        claimed, claimed_revision: the model and model_revision the artifact records.
        resolved: the loaded model's ``Resolved``.
        hint: ``claimed`` names the model only loosely (PEFT's ``base_model_name_or_path``: the Hub id
            or path its trainer loaded, while the same weights are often run from a local copy); a
            different name is then returned as a note instead of refused (the caller's shape
            checks still refuse what does not fit).

    Returns:
        None, or with ``hint`` the note on a different name.

    Raises:
        SterError: a different model or revision, naming both.
    """
    if claimed is None:
        return None
    same = claimed == resolved.model
    if not same:
        mine = {p for p in (_as_path(resolved.model), Path(resolved.root).resolve(),
                            Path(resolved.gguf_file).resolve() if resolved.gguf_file else None) if p is not None}
        theirs = _as_path(claimed)
        same = theirs is not None and theirs in mine
    if not same:
        same = _same_gguf_content(claimed, claimed_revision, resolved)
        if same:
            return None  # the same file under another name (a preset and its path): revisions say nothing more
    if not same and hint:
        return (f"{what} {path} names its base model {claimed!r}, and this run loads {resolved.model!r}: it is "
                f"applied because its shapes fit; make sure this is the same model")
    if not same:
        raise SterError(f"{what} {path} was made for model {claimed!r}, but this run loads {resolved.model!r}; "
                        f"use it with {claimed!r} or make a new one for this model")
    rev = resolved.model_revision
    if claimed_revision is not None and rev is not None and claimed_revision != rev:
        # a preset (rev: its pin) has one version: no --revision selects another (an artifact's may be an
        # older ster's, which recorded the --revision given with a preset as it was)
        advice = ("make a new one" if rev.startswith("sha256:")
                  else f"pass --revision {claimed_revision} or make a new one")
        raise SterError(f"{what} {path} was made for {claimed!r} at revision {claimed_revision}, but this run "
                        f"loads revision {rev}; {advice}")
    return None
