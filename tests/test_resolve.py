"""Tests of ster_py.resolve: local directories, GGUF paths, the Hub and every refusal.

Oracles: the file system itself for local layouts; the real ``huggingface_hub``
client (run in a subprocess so HF_HOME / HF_ENDPOINT / HF_HUB_OFFLINE are read
the way a user sets them) talking to a small fake Hub server for the Hub flow
and its cache; the real ``ster_py.families.gate`` for architecture refusals.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import json
import mmap
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import unquote, urlsplit

import numpy
import pytest

from ster_py.errors import SterError
from ster_py.resolve import Resolved, resolve

REPO_ROOT = Path(__file__).resolve().parents[1]
LLAMA = {"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1}
# Not valid safetensors/GGUF bytes on purpose: if resolve ever parsed a weight it would fail.
WEIGHT_BYTES = b"not a weight file"
SHA = "0123456789abcdef0123456789abcdef01234567"


def write_model(root: Path, config=LLAMA, tokenizer=True, files=("model.safetensors",)) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (root / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    if tokenizer:
        (root / "tokenizer.json").write_text("{}")
    for name in files:
        (root / name).write_bytes(WEIGHT_BYTES)
    return root


# --------------------------------------------------------------------------- guards


@pytest.fixture
def sealed(monkeypatch):
    """No network and no weight reading: any attempt fails the test.

    huggingface_hub is made unimportable, sockets cannot connect, and opening or
    mapping a .safetensors/.gguf file raises.
    """
    def no_network(*args, **kwargs):
        raise AssertionError("network used while resolving a local model")

    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)

    def no_load(*args, **kwargs):
        raise AssertionError("a weight was loaded while resolving")

    real_open = io.open

    def guarded_open(file, mode="r", *args, **kwargs):
        # Writing is the test building its fixture; reading a weight is what must not happen.
        if str(file).endswith((".safetensors", ".gguf")) and not set(mode) & set("wax"):
            no_load()
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded_open)
    monkeypatch.setattr(io, "open", guarded_open)
    monkeypatch.setattr(numpy, "memmap", no_load)
    monkeypatch.setattr(numpy, "load", no_load)
    monkeypatch.setattr(mmap, "mmap", no_load)
    import safetensors
    import safetensors.numpy

    monkeypatch.setattr(safetensors, "safe_open", no_load)
    monkeypatch.setattr(safetensors.numpy, "load_file", no_load)


def test_sealed_guard_really_blocks(sealed, tmp_path):
    # The guard must be able to fail, or the tests that rely on it prove nothing.
    path = tmp_path / "model.safetensors"
    with pytest.raises(AssertionError):
        path.read_bytes()
    with pytest.raises(AssertionError):
        open(path, "rb")
    with pytest.raises(ImportError):
        import huggingface_hub  # noqa: F401
    with pytest.raises(AssertionError):
        socket.create_connection(("127.0.0.1", 9))


# --------------------------------------------------------------------------- local: happy paths


def test_single_file_checkpoint(sealed, tmp_path):
    root = write_model(tmp_path / "m")
    r = resolve(str(root))
    assert isinstance(r, Resolved)
    assert (r.kind, r.root, r.config, r.gguf_file) == ("safetensors", root, LLAMA, None)
    assert r.config_path == root / "config.json"
    assert r.tokenizer_path == root / "tokenizer.json"
    assert r.weight_files == (root / "model.safetensors",)
    assert r.family.model_type == "llama"
    assert r.model_revision is None
    assert r.model == str(root)
    # a library caller's pathlib.Path is that path (it was refused as "no model given")
    assert resolve(root) == r and resolve(root).model == str(root)


def test_a_revision_is_refused_for_what_is_not_a_hub_id(sealed, tmp_path, monkeypatch):
    """A revision given with a local path or a preset was recorded as ``model_revision`` in place of the model's
    identity (a preset's ``sha256:`` pin), so artifacts made under it were refused by later runs; it selects
    nothing there, and is refused before anything is read or fetched, in resolve and in load_model."""
    from ster_py import presets
    from ster_py.load import load_model

    def no_fetch(*args, **kwargs):
        raise AssertionError("a preset was fetched")

    monkeypatch.setattr(presets, "fetch_preset", no_fetch)
    root = write_model(tmp_path / "m")
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    name = presets.DEFAULT_PRESET
    pin = f"sha256:{presets.PRESETS[name].sha256}"
    for model, what in [(str(root), "a local directory"), (str(tmp_path / "x.gguf"), "a local GGUF file"),
                        (name, f"a preset, pinned as {pin}")]:
        for call in (resolve, load_model):
            with pytest.raises(SterError) as e:
                call(model, "v1")
            assert str(e.value) == (f"--revision 'v1' applies to Hugging Face Hub ids only, and {model} is {what}; "
                                    "leave out --revision"), str(e.value)
    assert resolve(str(root)).model_revision is None


def test_sharded_sorted_and_training_files_ignored(sealed, tmp_path):
    shards = ["model-00003-of-00003.safetensors", "model-00001-of-00003.safetensors",
              "model-00002-of-00003.safetensors"]
    root = write_model(tmp_path / "m", files=shards + ["optimizer.safetensors", "training_args.safetensors",
                                                       "pytorch_model.bin"])
    (root / "original").mkdir()
    (root / "original" / "consolidated.safetensors").write_bytes(WEIGHT_BYTES)
    (root / "dir.safetensors").mkdir()  # a directory is not a weight file
    r = resolve(str(root))
    assert r.weight_files == tuple(root / n for n in sorted(shards))


def test_sharded_index_is_not_needed_but_a_missing_shard_it_names_is_refused(sealed, tmp_path):
    root = write_model(tmp_path / "m", files=["model-00001-of-00002.safetensors"])
    assert len(resolve(str(root)).weight_files) == 1  # no index: not consulted
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(SterError) as e:
        resolve(str(root))
    assert "model-00002-of-00002.safetensors" in str(e.value) and str(root) in str(e.value)


def test_relative_and_home_paths(sealed, tmp_path, monkeypatch):
    write_model(tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    assert resolve("m").root == tmp_path / "m"
    assert resolve("./m").root == tmp_path / "m"
    monkeypatch.setenv("HOME", str(tmp_path))
    r = resolve("~/m")
    assert r.root == tmp_path / "m" and r.model == "~/m"


def test_gguf_file(sealed, tmp_path):
    gguf = tmp_path / "tiny.Q8_0.gguf"
    gguf.write_bytes(WEIGHT_BYTES)
    r = resolve(str(gguf))
    assert (r.kind, r.root, r.gguf_file, r.weight_files) == ("gguf", tmp_path, gguf, (gguf,))
    assert (r.config, r.config_path, r.tokenizer_path, r.family, r.model_revision) == (None, None, None, None, None)


def test_directory_with_one_gguf_and_no_config(sealed, tmp_path):
    root = write_model(tmp_path / "m", config=None, tokenizer=False, files=["model.gguf"])
    r = resolve(str(root))
    assert (r.kind, r.gguf_file, r.config, r.family) == ("gguf", root / "model.gguf", None, None)


def test_gguf_dir_beside_config_and_tokenizer(sealed, tmp_path):
    root = write_model(tmp_path / "m", files=["finetune.gguf"])
    r = resolve(str(root))
    assert r.kind == "gguf_dir"
    assert r.weight_files == (root / "finetune.gguf",) and r.gguf_file == root / "finetune.gguf"
    assert r.config == LLAMA and r.tokenizer_path == root / "tokenizer.json"
    assert r.family.model_type == "llama"


def test_safetensors_win_over_a_gguf(sealed, tmp_path):
    root = write_model(tmp_path / "m", files=["model.safetensors", "model.gguf"])
    r = resolve(str(root))
    assert r.kind == "safetensors" and r.gguf_file is None


# --------------------------------------------------------------------------- local: refusals


def refusal(model: str, *, revision=None) -> str:
    with pytest.raises(SterError) as e:
        resolve(model, revision)
    return str(e.value)


def test_failed_to_list(sealed, tmp_path, monkeypatch):
    root = write_model(tmp_path / "m")
    real = os.listdir

    def denied(path="."):
        if Path(path) == root:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "listdir", denied)
    msg = refusal(str(root))
    assert msg.startswith(f"failed to list {root}") and "Permission denied" in msg


def test_config_missing(sealed, tmp_path):
    root = write_model(tmp_path / "m", config=None)
    msg = refusal(str(root))
    assert "model config is missing" in msg and str(root / "config.json") in msg


def test_a_peft_adapter_given_as_the_model_is_named_as_one(sealed, tmp_path):
    """`ster generate -m my-adapter` (PEFT's save_pretrained folder) said "model config is missing:
    my-adapter/config.json; a model directory needs config.json, ...": true, but it did not say the folder is an
    adapter, nor where one goes. It now says so, with --adapter and `ster tune merge`."""
    root = tmp_path / "my-adapter"
    root.mkdir()
    (root / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    (root / "adapter_model.safetensors").write_bytes(b"")
    msg = refusal(str(root))
    assert msg == (f"{root} is a LoRA adapter (adapter_config.json, as PEFT saves one), not a model: run its base "
                   f"model with --adapter {root} (generate, chat, serve), or merge it into the base with "
                   f"`ster tune merge --model BASE --adapter {root} --output DIR`"), msg


def test_mistral_params_json_is_read_as_mistral(sealed, tmp_path):
    """Mistral's own format (tests/test_mistral_params.py runs it against Transformers): an incomplete
    params.json is named, a complete one resolves to mistral with the consolidated weights only."""
    root = write_model(tmp_path / "m", config=None, files=["consolidated.safetensors", "model.safetensors"])
    (root / "params.json").write_text(json.dumps({"dim": 8}))
    msg = refusal(str(root))
    assert "invalid Mistral params.json" in msg and "lacks n_layers" in msg and str(root / "params.json") in msg
    (root / "params.json").write_text(json.dumps(MISTRAL_PARAMS))
    r = resolve(str(root))
    assert (r.config["model_type"], r.config_path, r.weight_files) == ("mistral", root / "params.json",
                                                                         (root / "consolidated.safetensors",))


def test_tokenizer_missing(sealed, tmp_path):
    root = write_model(tmp_path / "m", tokenizer=False)
    msg = refusal(str(root))
    assert msg.startswith("tokenizer is missing") and str(root / "tokenizer.json") in msg


def test_tokenizer_missing_names_the_sentencepiece_file_it_found(sealed, tmp_path):
    root = write_model(tmp_path / "m", tokenizer=False)
    (root / "tokenizer.model").write_bytes(b"sp")
    msg = refusal(str(root))
    assert "tokenizer is missing" in msg and "tokenizer.model" in msg


def test_no_safetensors_weights(sealed, tmp_path):
    root = write_model(tmp_path / "m", files=["pytorch_model.bin", "optimizer.safetensors"])
    msg = refusal(str(root))
    assert "contains no safetensors weights" in msg and str(root) in msg
    assert "pytorch_model.bin" in msg and "optimizer.safetensors" in msg


@pytest.mark.parametrize("with_config", [True, False])
def test_two_ggufs_refused_with_their_count(sealed, tmp_path, with_config):
    root = write_model(tmp_path / "m", config=LLAMA if with_config else None, files=["a.gguf", "b.gguf"])
    msg = refusal(str(root))
    assert "2 .gguf files" in msg and "a.gguf" in msg and "b.gguf" in msg and str(root) in msg


def test_failed_to_read_config(sealed, tmp_path):
    root = write_model(tmp_path / "m", config=None)
    (root / "config.json").mkdir()  # present in the listing, unreadable as a file
    msg = refusal(str(root))
    assert msg.startswith(f"failed to read {root / 'config.json'}: ")
    assert "directory" in msg.lower()


@pytest.mark.parametrize(
    "text, detail",
    [("{not json", "line 1 column 2"), ("[1, 2]", "list"), ('"llama"', "str"), (b"\xff\xfe\x00", "")],
)
def test_invalid_model_config(sealed, tmp_path, text, detail):
    root = write_model(tmp_path / "m", config=None)
    path = root / "config.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    msg = refusal(str(root))
    assert msg.startswith(f"invalid model config {path}: ") and detail in msg


def test_unknown_architecture_refused_before_weights_naming_the_list(sealed, tmp_path):
    # No weights either: the gate speaks first, as on the Hub.
    root = write_model(tmp_path / "m", config={"model_type": "plamo2"}, files=[])
    msg = refusal(str(root))
    assert "plamo2" in msg and str(root / "config.json") in msg
    for listed in ("llama", "qwen3", "gemma3_text", "zamba2", "mixtral"):
        assert listed in msg


@pytest.mark.parametrize("config, word", [({}, "missing"), ({"model_type": None}, "null")])
def test_missing_or_null_model_type(sealed, tmp_path, config, word):
    root = write_model(tmp_path / "m", config=config)
    msg = refusal(str(root))
    assert word in msg and "gemma3_text" in msg


def test_unknown_family_is_refused_naming_the_running_ones(sealed, tmp_path):
    from ster_py.families import FAMILIES, KNOWN_MODEL_TYPES

    assert set(KNOWN_MODEL_TYPES) <= set(FAMILIES)  # every family of the gate runs (issue 16)
    root = write_model(tmp_path / "m", config={"model_type": "plamo2"})
    msg = refusal(str(root))
    assert "'plamo2'" in msg and "llama" in msg


def test_quantized_checkpoint_refused(sealed, tmp_path):
    config = dict(LLAMA, quantization_config={"quant_method": "fp8"})
    root = write_model(tmp_path / "m", config=config)
    msg = refusal(str(root))
    assert "quantization_config" in msg and "fp8" in msg


def test_gate_also_runs_for_gguf_dir(sealed, tmp_path):
    root = write_model(tmp_path / "m", config={"model_type": "plamo2"}, files=["f.gguf"])
    assert "plamo2" in refusal(str(root))


@pytest.mark.parametrize("model", ["./missing", "../missing/dir", "/no/such/dir", "~/no-such-ster-dir", "x.gguf",
                                   "org/model.Q4_K_M.gguf"])
def test_missing_path_is_not_sent_to_the_hub(sealed, tmp_path, monkeypatch, model):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert refusal(model) == f"no such file or directory: {model}"


def test_a_device_or_fifo_is_named_for_what_it_is(sealed, tmp_path):
    """ster inspect /dev/null said "no such file or directory: /dev/null"; a FIFO the same."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for model in ("/dev/null", str(fifo)):
        assert refusal(model).startswith(f"{model} is not a regular file or a directory (a pipe, device or socket)")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert refusal(str(tmp_path / "dangling")) == f"no such file or directory: {tmp_path / 'dangling'}"


def test_an_existing_file_that_is_not_gguf(sealed, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    msg = refusal(str(tmp_path / "config.json"))
    assert str(tmp_path / "config.json") in msg and "not a .gguf file" in msg


def test_empty_model_string(sealed):
    assert "no model given" in refusal("")


# --------------------------------------------------------------------------- Hub: in-process fake


class FakeRemote:
    """Serves a repository from a dict through monkeypatched huggingface_hub calls."""

    def __init__(self, tmp_path: Path, files: dict[str, bytes], sha: str = SHA):
        self.files, self.sha = files, sha
        self.snapshot = tmp_path / "cache" / "snapshots" / sha
        self.calls: list[tuple] = []  # ("info", revision) and ("download", name, revision)

    def model_info(self, api, repo_id, *, revision=None, **kwargs):
        from huggingface_hub.hf_api import RepoSibling

        self.calls.append(("info", revision))
        siblings = [RepoSibling(rfilename=n, size=len(b)) for n, b in self.files.items()]
        return SimpleNamespace(id=repo_id, sha=self.sha, siblings=siblings)

    def hf_hub_download(self, repo_id, filename, *, revision=None, local_files_only=False, **kwargs):
        assert not local_files_only
        self.calls.append(("download", filename, revision))
        if filename not in self.files:
            raise OSError(f"404 Client Error. Entry Not Found for url: {filename}")
        path = self.snapshot / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.files[filename])
        return str(path)

    @property
    def downloads(self) -> list[str]:
        return [c[1] for c in self.calls if c[0] == "download"]


@pytest.fixture
def remote(tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub import constants

    def install(files: dict[str, bytes]) -> FakeRemote:
        fake = FakeRemote(tmp_path, files)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(huggingface_hub.HfApi, "model_info",
                            lambda api, repo_id, **kw: fake.model_info(api, repo_id, **kw))
        monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake.hf_hub_download)
        return fake

    return install


def repo_files(config=LLAMA, weights=("model.safetensors",), extra=()) -> dict[str, bytes]:
    # Distinct contents: the real client skips the GET of a blob it already holds.
    files = {"README.md": b"# card", "config.json": json.dumps(config).encode(),
             "tokenizer.json": b'{"version": "1.0"}', "tokenizer_config.json": b'{"model_max_length": 8}',
             "generation_config.json": b'{"do_sample": false}'}
    files.update({n: WEIGHT_BYTES for n in weights})
    files.update({n: b"x" for n in extra})
    return files


def test_hub_config_and_tokenizer_come_before_weights_all_at_the_resolved_sha(remote):
    shards = ("model-00002-of-00002.safetensors", "model-00001-of-00002.safetensors")
    files = repo_files(weights=shards, extra=("optimizer.safetensors", "original/consolidated.safetensors",
                                              "pytorch_model.bin"))
    fake = remote(files)
    events = []
    r = resolve("org/model", progress=lambda *e: events.append(e))
    assert fake.calls[0] == ("info", "main")
    assert fake.downloads == ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
                              "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    # config.json at the branch (so the cache learns main -> SHA for offline runs), the rest at the SHA.
    assert [c[2] for c in fake.calls if c[0] == "download"] == ["main"] + [SHA] * 5
    assert (r.kind, r.model_revision, r.root, r.family.model_type) == ("safetensors", SHA, fake.snapshot, "llama")
    assert r.weight_files == tuple(fake.snapshot / n for n in sorted(shards))
    assert r.config == LLAMA and r.tokenizer_path == fake.snapshot / "tokenizer.json"
    size = {n: len(b) for n, b in files.items()}
    c, t, tc, g = (size[n] for n in ("config.json", "tokenizer.json", "tokenizer_config.json",
                                     "generation_config.json"))
    small, w = c + t + tc + g, len(WEIGHT_BYTES)
    assert events == [
        ("download config.json", 0, small), ("download tokenizer.json", c, small),
        ("download tokenizer_config.json", c + t, small), ("download generation_config.json", c + t + tc, small),
        ("downloaded config", small, small),
        ("download model-00001-of-00002.safetensors", 0, 2 * w),
        ("download model-00002-of-00002.safetensors", w, 2 * w),
        ("downloaded weights", 2 * w, 2 * w),
    ]


def test_hub_without_weights_downloads_config_and_tokenizer_only(remote, monkeypatch):
    """ster tokenize / template render on a Hub id: the gate runs, no weight file is fetched."""
    from ster_py.load import load_tokenizer
    from ster_py.tokenizer import Tokenizer

    monkeypatch.setattr(Tokenizer, "from_dir", staticmethod(lambda root: ("tokenizer from", root)))
    fake = remote(repo_files())
    r = resolve("org/model", weights=False)
    assert r.weight_files == () and r.tokenizer_path == fake.snapshot / "tokenizer.json"
    assert not any(n.endswith(".safetensors") for n in fake.downloads)
    assert load_tokenizer("org/model") == ("tokenizer from", fake.snapshot)
    assert not any(n.endswith(".safetensors") for n in fake.downloads)


def test_hub_revision_is_passed_through(remote):
    fake = remote(repo_files())
    assert resolve("org/model", "v1.0").model_revision == SHA
    assert fake.calls[0] == ("info", "v1.0") and fake.calls[1] == ("download", "config.json", "v1.0")


def test_hub_revision_that_moves_between_listing_and_download_is_refused(remote):
    fake = remote(repo_files())
    fake.snapshot = fake.snapshot.parent / ("f" * 40)  # the branch now serves another commit
    with pytest.raises(SterError) as e:
        resolve("org/model")
    assert "moved while it was being resolved" in str(e.value) and SHA in str(e.value)
    assert not [n for n in fake.downloads if n.endswith(".safetensors")]


@pytest.mark.parametrize(
    "config, words",
    [({"model_type": "plamo2"}, ["plamo2", "gemma3_text"]),
     (dict(LLAMA, quantization_config={"quant_method": "gptq"}), ["quantization_config", "gptq"])],
)
def test_hub_refused_config_downloads_no_weight(remote, config, words):
    fake = remote(repo_files(config=config, weights=("model-00001-of-00002.safetensors",
                                                     "model-00002-of-00002.safetensors")))
    with pytest.raises(SterError) as e:
        resolve("org/model")
    assert all(w in str(e.value) for w in words)
    assert not [n for n in fake.downloads if n.endswith(".safetensors")]
    assert "config.json" in fake.downloads


def test_hub_invalid_config_json(remote):
    files = repo_files()
    files["config.json"] = b"{oops"
    fake = remote(files)
    with pytest.raises(SterError) as e:
        resolve("org/model")
    assert str(e.value).startswith(f"invalid model config {fake.snapshot / 'config.json'}: ")
    assert "model.safetensors" not in fake.downloads


def test_hub_publishes_no_safetensors(remote):
    files = repo_files(weights=(), extra=("model.Q4_K_M.gguf", "optimizer.safetensors"))
    fake = remote(files)
    with pytest.raises(SterError) as e:
        resolve("org/model")
    msg = str(e.value)
    assert msg.startswith("model org/model publishes no safetensors weights") and SHA in msg
    assert "model.Q4_K_M.gguf" in msg
    assert "optimizer.safetensors" not in fake.downloads


MISTRAL_PARAMS = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "hidden_dim": 96,
                  "norm_eps": 1e-5, "vocab_size": 128}


def test_hub_mistral_format_without_tokenizer_json_refused_before_any_download(remote):
    fake = remote({"params.json": json.dumps(MISTRAL_PARAMS).encode(), "tokenizer.model": b"{}",
                   "consolidated.safetensors": WEIGHT_BYTES})
    with pytest.raises(SterError) as e:
        resolve("mistralai/Some-Model")
    assert "tokenizer is missing" in str(e.value) and "tokenizer.model" in str(e.value)
    assert fake.downloads == []


def test_hub_mistral_format_reads_tekken_json_without_tokenizer_json(remote):
    fake = remote({"params.json": json.dumps(MISTRAL_PARAMS).encode(), "tekken.json": b"{}",
                   "consolidated.safetensors": WEIGHT_BYTES})
    r = resolve("mistralai/Some-Model")
    assert fake.downloads == ["params.json", "tekken.json", "consolidated.safetensors"]
    assert r.tokenizer_path.name == "tekken.json"


def test_hub_mistral_format_downloads_params_then_the_consolidated_weights(remote):
    fake = remote({"params.json": json.dumps(MISTRAL_PARAMS).encode(), "tokenizer.json": b'{"version": "1.0"}',
                   "consolidated.safetensors": WEIGHT_BYTES, "README.md": b"# card"})
    r = resolve("mistralai/Some-Model")
    assert fake.downloads == ["params.json", "tokenizer.json", "consolidated.safetensors"]
    assert (r.config["model_type"], r.config_path.name, r.model_revision) == ("mistral", "params.json", SHA)
    assert r.weight_files == (fake.snapshot / "consolidated.safetensors",)


def test_hub_repository_with_both_formats_is_read_as_transformers(remote):
    fake = remote(repo_files(extra=("params.json", "consolidated.safetensors")))
    r = resolve("org/model")
    assert "consolidated.safetensors" not in fake.downloads and "params.json" not in fake.downloads
    assert r.weight_files == (fake.snapshot / "model.safetensors",)


def test_hub_missing_config_or_tokenizer(remote):
    files = repo_files()
    del files["tokenizer.json"]
    fake = remote(files)
    with pytest.raises(SterError) as e:
        resolve("org/model")
    assert "tokenizer is missing" in str(e.value) and "org/model" in str(e.value)
    assert fake.downloads == []
    files = repo_files()
    del files["config.json"]
    remote(files)
    with pytest.raises(SterError) as e:
        resolve("org/model")
    assert "model config is missing" in str(e.value)


def test_hub_weight_download_failure_names_the_file(remote, monkeypatch):
    fake = remote(repo_files(weights=("model-00001-of-00002.safetensors",)))
    # The listing names a shard the server then fails to deliver.
    fake.files = dict(fake.files)
    real = fake.model_info

    def listing_with_ghost(api, repo_id, **kwargs):
        info = real(api, repo_id, **kwargs)
        from huggingface_hub.hf_api import RepoSibling

        info.siblings.append(RepoSibling(rfilename="model-00002-of-00002.safetensors", size=3))
        return info

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", listing_with_ghost)
    with pytest.raises(SterError) as e:
        resolve("org/model")
    assert str(e.value).startswith("failed to download model-00002-of-00002.safetensors")
    assert "Entry Not Found" in str(e.value)


def test_hub_client_that_cannot_start(monkeypatch):
    import huggingface_hub
    from huggingface_hub import constants

    def broken(self, *args, **kwargs):
        raise OSError("token file unreadable")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.HfApi, "__init__", broken)
    with pytest.raises(SterError) as e:
        resolve("org/model")
    assert str(e.value) == "failed to initialize Hugging Face Hub client: token file unreadable"


def test_hub_invalid_id_is_reported_without_network(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    def no_network(*args, **kwargs):
        raise AssertionError("network used for an invalid id")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    with pytest.raises(SterError) as e:
        resolve("a/b/c")
    assert "neither an existing local path nor a valid Hugging Face Hub id" in str(e.value)


# --------------------------------------------------------------------------- Hub: real client, fake server


class FakeHubServer:
    """A minimal HTTP Hub: the model-info API and /resolve/ downloads, with a request log.

    The real huggingface_hub client talks to it through HF_ENDPOINT, so its URL
    building, HEAD/GET protocol, cache layout and error classes are the ones a
    user gets.
    """

    def __init__(self, repos: dict):
        self.repos, self.log = repos, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self.serve()

            def do_GET(self):
                self.serve()

            def send(self, code, body=b"{}", headers=()):
                self.send_response(code)
                for key, value in headers:
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def serve(self):
                path = unquote(urlsplit(self.path).path)
                server.log.append((self.command, path))
                if path.startswith("/api/models/"):
                    repo, _, rev = path[len("/api/models/"):].partition("/revision/")
                    spec = server.repos.get(repo)
                    if spec is None:
                        return self.send(404, headers=[("X-Error-Code", "RepoNotFound")])
                    if spec.get("gated"):
                        return self.send(403, headers=[("X-Error-Code", "GatedRepo")])
                    if rev not in ("main", spec["sha"]):
                        return self.send(404, headers=[("X-Error-Code", "RevisionNotFound")])
                    siblings = [{"rfilename": n, "size": len(b)} for n, b in spec["files"].items()]
                    body = json.dumps({"id": repo, "sha": spec["sha"], "siblings": siblings}).encode()
                    return self.send(200, body, [("Content-Type", "application/json")])
                parts = path.lstrip("/").split("/")
                if len(parts) >= 5 and parts[2] == "resolve":
                    repo, name = "/".join(parts[:2]), "/".join(parts[4:])
                    spec = server.repos.get(repo)
                    if spec is None or name not in spec["files"]:
                        return self.send(404, headers=[("X-Error-Code", "EntryNotFound")])
                    body = spec["files"][name]
                    etag = '"' + hashlib.sha1(body).hexdigest() + '"'
                    return self.send(200, body, [("X-Repo-Commit", spec["sha"]), ("ETag", etag)])
                self.send(404)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def requests(self, kind: str) -> list[str]:
        """Paths requested under /api/models ("info"), or under /resolve/ ("file", first
        request of each path, HEAD or GET: the client skips the GET of a blob it holds)."""
        if kind == "info":
            return [p for m, p in self.log if p.startswith("/api/models/")]
        return list(dict.fromkeys(p for m, p in self.log if "/resolve/" in p))


RESOLVE_SCRIPT = r"""
import json, sys
from ster_py.errors import SterError
from ster_py.resolve import resolve
out = []
for model, revision in json.loads(sys.argv[1]):
    events = []
    try:
        r = resolve(model, revision, progress=lambda *e: events.append(list(e)))
    except SterError as error:
        out.append({"error": str(error)})
        continue
    out.append({"kind": r.kind, "root": str(r.root), "revision": r.model_revision,
                "weights": [p.name for p in r.weight_files], "config": r.config,
                "tokenizer": str(r.tokenizer_path), "family": r.family.model_type, "events": events,
                "weights_exist": all(p.is_file() for p in r.weight_files)})
print(json.dumps(out))
"""


def run_resolve(cases, *, hf_home: Path, endpoint: str, offline: bool) -> list[dict]:
    """Resolve ``cases`` in a fresh interpreter with the Hub environment a user would set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    env.update(HF_HOME=str(hf_home), HF_ENDPOINT=endpoint, HF_HUB_DISABLE_TELEMETRY="1",
               PYTHONPATH=str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    done = subprocess.run([sys.executable, "-c", RESOLVE_SCRIPT, json.dumps(cases)], env=env, cwd=hf_home.parent,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr  # nothing below the CLI prints, huggingface_hub's bars included
    return json.loads(done.stdout)


@pytest.fixture
def hub_server():
    shards = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    index = {"weight_map": {"a": shards[0], "b": shards[1]}}
    good = repo_files(weights=shards, extra=("optimizer.safetensors",))
    good["model.safetensors.index.json"] = json.dumps(index).encode()
    server = FakeHubServer({
        "org/good": {"sha": "a" * 40, "files": good},
        "org/plamo": {"sha": "b" * 40, "files": repo_files(config={"model_type": "plamo2"})},
        "org/gated": {"sha": "c" * 40, "files": repo_files(), "gated": True},
        "org/noweights": {"sha": "d" * 40, "files": repo_files(weights=(), extra=("pytorch_model.bin",))},
    })
    yield server
    server.close()


def test_real_client_online_then_offline_from_cache(hub_server, tmp_path):
    home = tmp_path / "hf_home"
    cases = [["org/good", None], ["org/plamo", None], ["org/gated", None], ["org/missing", None],
             ["org/good", "no-such-branch"], ["org/noweights", None]]
    good, plamo, gated, missing, bad_rev, noweights = run_resolve(
        cases, hf_home=home, endpoint=hub_server.url, offline=False)

    snapshot = home / "hub" / "models--org--good" / "snapshots" / ("a" * 40)
    assert good["kind"] == "safetensors" and good["revision"] == "a" * 40 and good["family"] == "llama"
    assert good["root"] == str(snapshot) and good["weights_exist"]
    assert good["weights"] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert good["tokenizer"] == str(snapshot / "tokenizer.json") and good["config"] == LLAMA
    assert [e[0] for e in good["events"]][-1] == "downloaded weights"

    files = hub_server.requests("file")
    good_files = [p.rsplit("/", 1)[1] for p in files if p.startswith("/org/good/")]
    assert good_files[:2] == ["config.json", "tokenizer.json"]
    first_weight = min(i for i, n in enumerate(good_files) if n.endswith(".safetensors"))
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= set(good_files[:first_weight])
    assert "optimizer.safetensors" not in good_files
    good_paths = [p for p in files if p.startswith("/org/good/")]
    assert good_paths[0] == "/org/good/resolve/main/config.json"  # records main -> SHA in the cache
    assert all(f"/resolve/{'a' * 40}/" in p for p in good_paths[1:])  # everything else at the SHA

    assert "plamo2" in plamo["error"] and "gemma3_text" in plamo["error"]
    plamo_files = [p for p in files if p.startswith("/org/plamo/")]
    assert plamo_files and not [p for p in plamo_files if p.endswith(".safetensors")]

    assert gated["error"].startswith("failed to read model repository org/gated")
    assert "gated" in gated["error"] and "pass a local directory" in gated["error"]
    assert missing["error"].startswith("failed to read model repository org/missing")
    assert "no such repository" in missing["error"] and "check the id and revision" in missing["error"]
    assert "no such revision no-such-branch" in bad_rev["error"]
    assert noweights["error"].startswith("model org/noweights publishes no safetensors weights")
    assert "pytorch_model.bin" in noweights["error"]

    # Offline: the same answers from the cache alone, and not one request to the server.
    before = len(hub_server.requests("info")) + len(hub_server.requests("file"))
    again, by_sha, bad = run_resolve([["org/good", None], ["org/good", "a" * 40], ["org/good", "v9"]],
                                     hf_home=home, endpoint=hub_server.url, offline=True)
    assert len(hub_server.requests("info")) + len(hub_server.requests("file")) == before
    for r in (again, by_sha):
        assert (r["root"], r["revision"], r["weights"]) == (good["root"], good["revision"], good["weights"])
        assert r["events"] == []
    assert "HF_HUB_OFFLINE" in bad["error"] and "v9" in bad["error"]

    # A shard lost from the cache is named, thanks to the cached index.
    (snapshot / "model-00002-of-00002.safetensors").unlink()
    (lost,) = run_resolve([["org/good", None]], hf_home=home, endpoint=hub_server.url, offline=True)
    assert "model-00002-of-00002.safetensors" in lost["error"]


def test_real_client_unreachable_endpoint(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (r,) = run_resolve([["org/model", None]], hf_home=tmp_path / "hf_home", endpoint=f"http://127.0.0.1:{port}",
                       offline=False)
    msg = r["error"]
    assert msg.startswith("failed to read model repository org/model")
    assert f"127.0.0.1:{port}" in msg and "HF_HUB_OFFLINE=1" in msg
    # a bare name is first of all a local directory that is not there (a merge's output not made yet)
    (r,) = run_resolve([["merged", None]], hf_home=tmp_path / "hf_home", endpoint=f"http://127.0.0.1:{port}",
                       offline=False)
    assert r["error"].startswith("no local file or directory named merged here, and read as a Hugging Face Hub id")


def test_offline_with_empty_hf_home_says_the_cache_lacks_the_repo(tmp_path):
    home = tmp_path / "empty_home"
    home.mkdir()
    # The endpoint is a closed port: reaching it would show up as a different error.
    (r,) = run_resolve([["org/model", None]], hf_home=home, endpoint="http://127.0.0.1:9", offline=True)
    msg = r["error"]
    assert msg.startswith("failed to read model repository org/model")
    assert "HF_HUB_OFFLINE is set" in msg and str(home / "hub") in msg and "no config.json" in msg


# --------------------------------------------------------------------------- real checkpoints (tests/conftest.py)


@pytest.mark.real
@pytest.mark.parametrize("fixture", ["smollm2_hf", "gemma3_hf"])
def test_real_hf_directories(request, fixture):
    from transformers import AutoConfig

    root = Path(request.getfixturevalue(fixture))
    r = resolve(str(root))
    assert r.kind == "safetensors" and r.root == root.absolute()
    assert r.config == json.loads((root / "config.json").read_text())
    assert r.family.model_type == AutoConfig.from_pretrained(root).model_type  # transformers reads it the same
    on_disk = sorted(p.name for p in root.glob("*.safetensors"))
    assert [p.name for p in r.weight_files] == on_disk and on_disk


@pytest.mark.real
@pytest.mark.parametrize("fixture", ["smollm2_gguf", "gemma3_gguf"])
def test_real_gguf_files(request, fixture):
    path = Path(request.getfixturevalue(fixture))
    r = resolve(str(path))
    assert (r.kind, r.gguf_file, r.weight_files, r.config) == ("gguf", path.absolute(), (path.absolute(),), None)


@pytest.mark.parametrize("model", ["", "   ", "\t\n"])
def test_empty_model_is_refused_locally(sealed, model):
    assert refusal(model).startswith("no model given")


@pytest.mark.parametrize("config", [
    {"model_type": "mpt", "attn_config": "multihead"},   # a family rule reads attn_config.<key>
    {"model_type": "mpt", "attn_config": [1, 2]},
])
def test_malformed_config_objects_do_not_crash_the_gate(sealed, tmp_path, config):
    """The gate's refusal rules read untrusted values: a wrong type is a config problem, never a traceback."""
    root = write_model(tmp_path / "m", config=config)
    assert resolve(str(root)).family.model_type == "mpt"


def test_gate_errors_name_the_config(sealed, tmp_path):
    config = {"model_type": "granite_swa", "layer_rope_theta": [[1], 2],
              "layer_types": ["sliding_attention", "full_attention"]}  # a list where a rotary base belongs
    root = write_model(tmp_path / "m", config=config)
    assert refusal(str(root)).startswith(f"invalid model config {root / 'config.json'}: TypeError")


def test_hub_plamo_tokenizer_jsonl_stands_in_for_tokenizer_json(remote):
    files = repo_files()
    del files["tokenizer.json"]
    files["tokenizer.jsonl"] = b'["<|plamo:unk|>", 0.0, "UNKNOWN"]\n'
    fake = remote(files)
    r = resolve("pfnet/some-plamo")
    assert fake.downloads[:3] == ["config.json", "tokenizer.jsonl", "tokenizer_config.json"]
    assert r.tokenizer_path == fake.snapshot / "tokenizer.jsonl"
