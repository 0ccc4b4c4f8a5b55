"""What a new user meets first (issue 23): empty prompts, misspelt presets, artifacts checked
before weights are fetched, progress, --help, --version, inspect and parity output, -q, NO_COLOR.

Oracles: the library's own data (the JSON documents, the report, the ModelSpec, the package
metadata in pyproject.toml) against what the CLI prints; the refusal tests make the step
that must not happen (a network call, a weight download, a preset fetch) fail loudly.
"""
from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ster_py.errors import SterError
from tiny import make_checkpoint, sigint_as_at_a_terminal

SGR = re.compile(rb"\x1b\[[0-9;]*m")  # a colour / bold / dim escape sequence
TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|> {{ m.content }} {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


MAIN = "from ster_py.cli import main; main()"


def ster(*args, env=None, **kwargs):
    full = None if env is None else {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", *args],
                          capture_output=True, text=True, env=full, timeout=300, **kwargs)


def on_a_terminal(*args, env=None, stdout_pipe=False, code=MAIN) -> tuple[int, bytes, bytes]:
    """Run ster (``code``) with stderr (and stdout unless ``stdout_pipe``) on a pseudo-terminal.

    Returns (status, what the terminal received, what the stdout pipe received)."""
    master, slave = pty.openpty()
    full = {**os.environ, "COLUMNS": "100", "LINES": "40", **(env or {})}
    for var in ("NO_COLOR", "FORCE_COLOR", "TERM"):
        if var not in (env or {}):
            full.pop(var, None)
    full["TERM"] = (env or {}).get("TERM", "xterm-256color")
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdin=slave,
                            stdout=subprocess.PIPE if stdout_pipe else slave, stderr=slave, env=full)
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    piped = proc.stdout.read() if stdout_pipe else b""
    proc.wait(timeout=60)
    os.close(master)
    return proc.returncode, seen, piped


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    make_checkpoint(path, "llama")
    return path


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory):
    """The tiny llama with a chat template in tokenizer_config.json."""
    path = tmp_path_factory.mktemp("llama_chat")
    make_checkpoint(path, "llama")
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = TEMPLATE
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return path


# --------------------------------------------------------------------------- empty prompt


@pytest.mark.parametrize("mode", ["auto", "off"])
@pytest.mark.parametrize("text, word", [("", "empty"), ("  \n", "only whitespace")])
def test_empty_prompt_is_refused_in_both_template_modes(tiny_chat, mode, text, word):
    r = ster("generate", "--model", str(tiny_chat), "--prompt", text, "--chat-template", mode, "--max-new-tokens", "2")
    assert r.returncode == 1 and r.stdout == "", r.stderr
    assert r.stderr.startswith(f"error: --prompt is {word}") and "Traceback" not in r.stderr


def test_empty_prompt_is_refused_by_the_library_and_capture(tiny_chat, tmp_path):
    """The template would render an empty user turn; encode_prompt refuses it as it refuses raw text."""
    from ster_py.load import load_tokenizer
    from ster_py.prompt import encode_prompt

    tok = load_tokenizer(str(tiny_chat))
    assert encode_prompt(tok, "w5 w6").chat_template == "applied"  # the template is there and used
    for mode in ("auto", "off"):
        with pytest.raises(SterError, match="the prompt is empty"):
            encode_prompt(tok, "", chat_template=mode)
    r = ster("capture", "--model", str(tiny_chat), "--prompt", "", "--output", str(tmp_path / "c.safetensors"))
    assert r.returncode == 1 and "--prompt is empty" in r.stderr and not (tmp_path / "c.safetensors").exists()


# --------------------------------------------------------------------------- misspelt preset


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt fails the test."""
    import socket

    def refuse(*args, **kwargs):
        raise AssertionError("the network was used")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.mark.parametrize("name, meant", [
    ("smollm2-135m-instruct-q4", "smollm2-135m-instruct-q4_1"),
    ("SmolLM2-135M-Instruct-Q4_1", "smollm2-135m-instruct-q4_1"),
    ("smollm2", "smollm2-135m-instruct-q4_1"),
    ("gemma3-270m", "gemma3-270m-q4_k_m"),
    ("gemma-3-270m-q4_k_m", "gemma3-270m-q4_k_m"),
])
def test_a_misspelt_preset_is_named_before_the_network(no_network, name, meant):
    from ster_py.load import load_tokenizer
    from ster_py.resolve import resolve

    with pytest.raises(SterError) as e:
        resolve(name)
    assert str(e.value).startswith(f"no preset {name}; did you mean {meant}?")
    with pytest.raises(SterError, match="did you mean"):
        load_tokenizer(name)


def test_hub_ids_are_not_taken_for_presets():
    from ster_py.presets import PRESETS, close_presets

    for hub_id in ("HuggingFaceTB/SmolLM2-135M-Instruct", "google/gemma-3-270m", "gpt2", "distilgpt2",
                   "bert-base-uncased", "Qwen/Qwen3-0.6B", "smollm2-135m-instruct-q4_1/x"):
        assert close_presets(hub_id) == [], hub_id
    assert all(close_presets(p) == [p] for p in PRESETS)


def test_cli_names_the_preset_without_reaching_the_hub(tmp_path):
    # An endpoint nothing listens on: reaching for the Hub would end in a connection error instead.
    r = ster("generate", "-m", "smollm2-135m-instruct-q4", "-p", "hi",
             env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path)})
    assert r.returncode == 1
    assert r.stderr.strip() == ("error: no preset smollm2-135m-instruct-q4; did you mean smollm2-135m-instruct-q4_1? "
                                "(`ster presets` lists them; a Hugging Face Hub id is written owner/name)")


# --------------------------------------------------------------------------- artifacts before weights


def vector_for(model: str | None, hidden: int, layers=(0,), revision=None):
    from ster_py.steering import SteeringVector

    rng = np.random.default_rng(0)
    dirs = {}
    for i in layers:
        v = rng.standard_normal(hidden).astype(np.float32)
        dirs[i] = v / np.linalg.norm(v)
    return SteeringVector(model, revision, hidden, "test", "caa", dirs)


def write_ster_adapter(path: Path, model: str, hidden: int, layer: int, out: int) -> Path:
    """A Ster-layout LoRA on layer ``layer``'s q projection ([out, hidden])."""
    from safetensors.numpy import save_file

    rank = 2
    rng = np.random.default_rng(1)
    save_file({f"layers.{layer}.q.a": rng.standard_normal((rank, hidden)).astype(np.float32),
               f"layers.{layer}.q.b": rng.standard_normal((out, rank)).astype(np.float32)},
              str(path.with_name(path.name[: -len(".json")] + ".safetensors")))
    path.write_text(json.dumps({"format": "ster.lora", "model": model, "model_revision": None, "rank": rank,
                                "alpha": 4, "targets": ["q"], "layers": [layer], "hidden_size": hidden}))
    return path


@pytest.fixture
def hub(tiny, tmp_path, monkeypatch):
    """The tiny checkpoint served as Hub repository org/tiny; records every file fetched."""
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.hf_api import RepoSibling

    files = {p.name: p.read_bytes() for p in tiny.iterdir() if p.is_file()}
    sha = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "snapshots" / sha
    fetched: list[str] = []

    def model_info(api, repo_id, **kwargs):
        return SimpleNamespace(id=repo_id, sha=sha,
                               siblings=[RepoSibling(rfilename=n, size=len(b)) for n, b in files.items()])

    def download(repo_id, filename, *, revision=None, tqdm_class=None, **kwargs):
        fetched.append(filename)
        data = files[filename]
        if tqdm_class is not None:  # report the bytes in chunks, as huggingface_hub's http_get does
            bar = tqdm_class(total=len(data), initial=0)
            for start in range(0, len(data), 4096):
                bar.update(len(data[start:start + 4096]))
            bar.close()
        (snapshot / filename).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / filename).write_bytes(data)
        return str(snapshot / filename)

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    return SimpleNamespace(fetched=fetched, sha=sha, files=files)


def test_vector_for_another_model_or_width_is_refused_before_hub_weights(hub, tiny):
    from ster_py.load import load_model
    from ster_py.steering import check_vector_fit

    spec_hidden = json.loads((tiny / "config.json").read_text())["hidden_size"]
    cases = [(vector_for("org/other", spec_hidden), "was made for model 'org/other'"),
             (vector_for("org/tiny", spec_hidden + 8), f"this model's hidden_size is {spec_hidden}"),
             (vector_for("org/tiny", spec_hidden, layers=(7,)), "this model has layers 0..2")]
    for vec, words in cases:
        hub.fetched.clear()
        with pytest.raises(SterError, match=re.escape(words)):
            load_model("org/tiny", check=lambda r, s: check_vector_fit(vec, r, s, "v.json"))
        assert "config.json" in hub.fetched and "model.safetensors" not in hub.fetched, hub.fetched
    hub.fetched.clear()  # a vector that fits lets the weights come and the model load
    good = vector_for("org/tiny", spec_hidden, layers=(0, 2))
    loaded = load_model("org/tiny", check=lambda r, s: check_vector_fit(good, r, s, "v.json"))
    assert "model.safetensors" in hub.fetched and loaded.spec.hidden_size == spec_hidden


def test_adapter_that_cannot_fit_is_refused_before_hub_weights(hub, tiny, tmp_path):
    from ster_py.adapters import check_adapter_early
    from ster_py.load import load_model

    cfg = json.loads((tiny / "config.json").read_text())
    d, q = cfg["hidden_size"], cfg["num_attention_heads"] * cfg["head_dim"]
    cases = [(write_ster_adapter(tmp_path / "wide.lora.json", "org/tiny", d + 8, 0, q), "hidden_size"),
             (write_ster_adapter(tmp_path / "deep.lora.json", "org/tiny", d, 5, q), "layers 0..2"),
             (write_ster_adapter(tmp_path / "other.lora.json", "org/other", d, 0, q), "'org/other'")]
    for path, words in cases:
        hub.fetched.clear()
        with pytest.raises(SterError, match=re.escape(words)):
            load_model("org/tiny", check=lambda r, s: check_adapter_early(path, r, s))
        assert "config.json" in hub.fetched and "model.safetensors" not in hub.fetched, hub.fetched
    ok = write_ster_adapter(tmp_path / "ok.lora.json", "org/tiny", d, 1, q)
    got = []
    load_model("org/tiny", check=lambda r, s: got.append(check_adapter_early(ok, r, s)))
    assert got[0].layers == [1] and got[0].targets == ["q"]  # read whole against the config, for reuse


def test_vector_for_another_preset_is_refused_before_the_preset_is_fetched(monkeypatch, tmp_path):
    from ster_py import presets
    from ster_py.load import load_model
    from ster_py.steering import check_vector_fit

    monkeypatch.setenv("STER_PRESET_CACHE", str(tmp_path / "presets"))

    def fetch(name, progress=None, **kwargs):
        raise SterError(f"fetch {name}")

    monkeypatch.setattr(presets, "fetch_preset", fetch)
    smol = presets.PRESETS["smollm2-135m-instruct-q4_1"]
    other = vector_for(smol.name, 576, revision=f"sha256:{smol.sha256}")
    with pytest.raises(SterError, match="was made for model 'smollm2-135m-instruct-q4_1'"):
        load_model("gemma3-270m-q4_k_m", check=lambda r, s: check_vector_fit(other, r, s, "v.json"))
    # made for the same pinned bytes under another name (the file's path, recorded with the pin): let through
    same = vector_for("/somewhere/SmolLM2-135M-Instruct.Q4_1.gguf", 576, revision=f"sha256:{smol.sha256}")
    with pytest.raises(SterError, match="fetch smollm2-135m-instruct-q4_1"):
        load_model(smol.name, check=lambda r, s: check_vector_fit(same, r, s, "v.json"))


def test_merge_refuses_before_the_base_weights_are_fetched(hub, tiny, tmp_path, monkeypatch):
    from ster_py import presets
    from ster_py.tune.merge import merge_adapter

    cfg = json.loads((tiny / "config.json").read_text())
    d, q = cfg["hidden_size"], cfg["num_attention_heads"] * cfg["head_dim"]
    wide = write_ster_adapter(tmp_path / "wide.lora.json", "org/tiny", d + 8, 0, q)
    with pytest.raises(SterError, match="hidden_size"):
        merge_adapter("org/tiny", wide, tmp_path / "out")
    assert "config.json" in hub.fetched and "model.safetensors" not in hub.fetched, hub.fetched
    ok = write_ster_adapter(tmp_path / "ok.lora.json", "org/tiny", d, 0, q)
    report = merge_adapter("org/tiny", ok, tmp_path / "out")  # a fitting adapter: the weights come
    assert "model.safetensors" in hub.fetched and report["merged_tensors"] == 1

    def fetch(name, progress=None, **kwargs):
        raise AssertionError("the preset was fetched")

    monkeypatch.setattr(presets, "fetch_preset", fetch)
    with pytest.raises(SterError, match="refuses a GGUF base"):
        merge_adapter("gemma3-270m-q4_k_m", ok, tmp_path / "out2")


def test_cli_refuses_the_vector_before_fetching_the_preset(tmp_path):
    """Nothing can be fetched (no Hub, no PyPI); the refusal must come before the attempt."""
    from ster_py.presets import PRESETS
    from ster_py.steering import write_vector

    smol = PRESETS["smollm2-135m-instruct-q4_1"]
    write_vector(vector_for(smol.name, 576, revision=f"sha256:{smol.sha256}"), tmp_path / "v.json")
    env = {"STER_PRESET_CACHE": str(tmp_path / "presets"), "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1",
           "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_RETRIES": "0", "PIP_TIMEOUT": "1"}
    r = ster("generate", "-m", "gemma3-270m-q4_k_m", "-p", "hi", "--vector", str(tmp_path / "v.json"), env=env)
    assert r.returncode == 1, r.stderr
    assert "was made for model 'smollm2-135m-instruct-q4_1'" in r.stderr and "could not fetch" not in r.stderr
    assert not (tmp_path / "presets" / "gemma3-270m-q4_k_m").exists()


def test_cli_refuses_a_local_adapter_for_another_width_before_mapping(tiny, tmp_path):
    cfg = json.loads((tiny / "config.json").read_text())
    path = write_ster_adapter(tmp_path / "a.lora.json", None, cfg["hidden_size"] + 8, 0, 64)
    r = ster("generate", "-m", str(tiny), "-p", "w5", "--adapter", str(path), "--max-new-tokens", "1")
    assert r.returncode == 1 and f"this model's is {cfg['hidden_size']}" in r.stderr, r.stderr


# --------------------------------------------------------------------------- progress


def test_every_library_progress_event_is_labelled_with_its_unit():
    from ster_py.cli import progress_event

    units = {"verify": "bytes", "hub": "bytes", "extract": "bytes", "download model.safetensors": "bytes",
             "downloaded weights": "bytes", "pip": "bytes", "map weights": "files", "capture": "prompts",
             "parity": "prompts", "merge": "tensors", "loading the reference": None}
    for event, unit in units.items():
        assert progress_event(event)[2] == unit, event
    assert progress_event("download model.safetensors")[:2] == ("download", "downloading model.safetensors")


def test_amounts_read_as_bytes_with_a_rate_or_as_counts():
    from rich.filesize import decimal

    from ster_py.cli import amount

    assert amount(12_500_000, 98_362_432, "bytes", 3_100_000) == \
        f"{decimal(12_500_000)}/{decimal(98_362_432)}, {decimal(3_100_000)}/s"
    assert amount(4096, None, "bytes") == decimal(4096)
    assert amount(1, 4, "wheels") == "1/4 wheels" and amount(1234, None, "prompts") == "1,234/? prompts"
    assert amount(0, None, None) == ""


def test_hub_bytes_are_reported_as_each_file_arrives(hub):
    from ster_py.resolve import resolve

    events = []
    resolve("org/tiny", progress=lambda *e: events.append(e))
    weights = [e for e in events if e[0] == "download model.safetensors"]
    size = len(hub.files["model.safetensors"])
    assert [e[1] for e in weights] == [0] + list(range(4096, size, 4096)) + [size]
    assert all(e[2] == size for e in weights) and events[-1] == ("downloaded weights", size, size)


def test_xet_counts_a_file_once_over_its_two_bars():
    from ster_py.resolve import _quiet_tqdm

    events = []
    cls = _quiet_tqdm(lambda *e: events.append(e), "download w", 100, 1100)
    reconstruction, transfer = cls(total=1000), cls(total=1000)
    for _ in range(4):
        reconstruction.update(250)
        transfer.update(250)
    assert events[-1] == ("download w", 1100, 1100) and max(e[1] for e in events) == 1100


def test_progress_rows_on_a_terminal_name_their_units(tiny):
    status, seen, _ = on_a_terminal("generate", "-m", str(tiny), "-p", "w5 w6", "--max-new-tokens", "2")
    text = SGR.sub(b"", seen).decode()
    assert status == 0 and "mapping weight files" in text and "1/1 files" in text
    assert "bytes" not in text and "0/?" not in text


# A long prompt's prefill on the tiny model: each layer over 100 positions or more sleeps 0.4 s first, so the
# 200-token prompt's three layers take 1.2 s (its progress is drawn from the second layer on) and a short one's
# no time at all.
SLOW = ("import time\nfrom ster_py.decoder import model\ncall = model._Layer.__call__\n"
        "def slow(self, h, *a):\n    time.sleep(0.4 if h.shape[0] >= 100 else 0)\n    return call(self, h, *a)\n"
        "model._Layer.__call__ = slow\n" + MAIN)
LONG = " ".join(f"w{3 + i % 120}" for i in range(200))
PREFILLING = re.compile(r"prefilling ([\d,]+) tokens .*?(\d)/3 layers")


def test_a_prefill_label_counts_its_tokens_and_layers():
    from ster_py.cli import progress_event

    assert progress_event("prefill 6031") == ("prefill", "prefilling 6,031 tokens", "layers")
    assert progress_event("prefill 1")[1] == "prefilling 1 token"


@pytest.mark.parametrize("json_", [False, True])
def test_a_long_prompt_shows_its_prefill_on_a_terminal_only(tiny, tmp_path, json_):
    """A 6,031-token prompt showed nothing for 25 s between the loading bar and the first token (and
    --json nothing at all). On a terminal its prefill is now drawn on stderr, per layer, and removed before
    the answer; a short prompt's never is (no flicker); on a pipe stderr says nothing more than before."""
    (tmp_path / "long.txt").write_text(LONG)
    args = ["generate", "-m", str(tiny), "--prompt-file", str(tmp_path / "long.txt"), "--max-new-tokens", "3",
            *(["--json"] if json_ else [])]
    status, seen, _ = on_a_terminal(*args, code=SLOW)
    text = SGR.sub(b"", seen).decode()
    assert status == 0, text
    found = PREFILLING.findall(text)
    assert found and {n for n, _ in found} == {"200"} and "2" in {d for _, d in found}, text
    answer = text.rsplit("layers", 1)[1]   # the display was cleared (erase line) before the answer came
    assert "\x1b[2K" in answer and "prefilling" not in answer
    if json_:
        assert json.loads(answer[answer.index("{"):].replace("\r\n", "\n"))["usage"]["prompt_tokens"] == 200
    else:
        assert "200 prompt tokens" in answer
    status, seen, _ = on_a_terminal("generate", "-m", str(tiny), "-p", "w5 w6", "--max-new-tokens", "2", code=SLOW)
    assert status == 0 and b"prefilling" not in seen
    status, seen, _ = on_a_terminal(*args, "-q", code=SLOW)
    assert status == 0 and b"prefilling" not in seen
    r = subprocess.run([sys.executable, "-c", SLOW, *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "prefill" not in r.stderr.replace("; prefill ", ""), r.stderr
    assert r.stderr.splitlines()[0].startswith("note: the model has no chat template")
    assert len(r.stderr.splitlines()) == (1 if json_ else 2), r.stderr


def test_a_long_chat_message_shows_its_prefill_on_a_terminal(tiny_chat, tmp_path):
    """``/file`` of 3,031 tokens in ``ster chat``: 5 s of silence. Its prefill is drawn as generate's is."""
    pexpect = pytest.importorskip("pexpect")
    (tmp_path / "half.txt").write_text(LONG)
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    child = pexpect.spawn(sys.executable, ["-c", SLOW, "chat", "-m", str(tiny_chat), "--max-new-tokens", "2"],
                          env={**env, "TERM": "xterm-256color", "COLUMNS": "120"}, encoding="utf-8", timeout=120,
                          dimensions=(40, 120), preexec_fn=sigint_as_at_a_terminal)
    child.expect("> ")
    child.sendline(f"/file {tmp_path / 'half.txt'}")
    child.expect(r"prompt (\d+) tokens")
    shown = SGR.sub(b"", child.before.encode()).decode()
    found = PREFILLING.findall(shown)
    assert found and {n for n, _ in found} == {child.match.group(1)}, shown
    child.expect("> ")
    child.sendline("w7")    # a short message: nothing drawn
    child.expect(r"prompt (\d+) tokens")
    assert "prefilling" not in child.before
    child.expect("> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


# --------------------------------------------------------------------------- help


def all_commands():
    import typer

    from ster_py.cli import app

    root = typer.main.get_command(app)
    stack = [((), root)]
    while stack:
        path, cmd = stack.pop()
        yield path, cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            stack.append((path + (name,), sub))


def help_text(path) -> str:
    from typer.testing import CliRunner

    from ster_py.cli import app

    r = CliRunner().invoke(app, [*path, "--help"], terminal_width=80, prog_name="ster", color=False)
    assert r.exit_code == 0, r.output
    return r.output


def test_help_reads_like_a_cli():
    from ster_py.cli_help import summary

    paths = [p for p, _ in all_commands()]
    assert ("generate",) in paths and ("vector", "caa") in paths and ("template", "render") in paths
    for path, cmd in all_commands():
        text = help_text(path)
        where = " ".join(path) or "ster"
        assert not re.search(r"<(bool|str|int|float|path|list\[[^>]*\])>", text), (where, text)
        usage = text.splitlines()[0]
        assert usage.startswith("Usage: ster") and "{" not in usage, usage
        assert all(len(line) <= 80 for line in text.splitlines()), where
        assert "…" not in text, where
        if hasattr(cmd, "commands"):  # a group lists each command with its whole first paragraph
            listing = " ".join(text.split("Commands:", 1)[1].split())
            for name, sub in cmd.commands.items():
                assert f"{name} {summary(sub)}" in listing, (where, name)
                assert summary(sub).endswith("."), (where, name)
    assert "Usage: ster detokenize [OPTIONS] IDS..." in help_text(("detokenize",))
    assert "--var NAME=VALUE" in help_text(("template", "render"))
    gen = help_text(("generate",))
    assert "-m, --model MODEL" in gen and "--threads N" in gen and "--precision auto|f32|f16|bf16" in gen
    assert "--quantize q8_0|q4_0|q4_k" in gen
    assert re.search(r"^  --json {2,}Print", gen, re.M) and re.search(r"^  --help {2,}Show", gen, re.M)


# --------------------------------------------------------------------------- version


def test_version_flag_and_fields(tiny, tmp_path):
    import tomllib

    from ster_py import __version__

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    assert project["version"] == __version__
    r = ster("--version")
    assert r.returncode == 0 and r.stdout == f"ster {__version__}\n"
    docs = [json.loads(ster("generate", "-m", str(tiny), "-p", "w5", "--max-new-tokens", "1", "--json").stdout),
            json.loads(ster("inspect", str(tiny), "--json").stdout),
            json.loads(ster("tokenize", "-m", str(tiny), "-t", "w5", "--json").stdout),
            json.loads(ster("detokenize", "-m", str(tiny), "5", "--json").stdout)]
    assert [d["ster_version"] for d in docs] == [__version__] * 4
    for name, text in (("pos", "w5 w6"), ("neg", "w9 w10")):
        r = ster("capture", "-m", str(tiny), "-p", text, "--layers", "0", "-o", str(tmp_path / f"{name}.safetensors"))
        assert r.returncode == 0, r.stderr
        assert json.loads((tmp_path / f"{name}.json").read_text())["ster_version"] == __version__
    r = ster("vector", "caa", "--positive", str(tmp_path / "pos.json"), "--negative", str(tmp_path / "neg.json"),
             "-o", str(tmp_path / "v.json"))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "v.json").read_text())["ster_version"] == __version__


def test_vector_records_the_version(tmp_path):
    from ster_py import __version__
    from ster_py.steering import read_vector, write_vector

    write_vector(vector_for("m", 8), tmp_path / "v.json")
    assert json.loads((tmp_path / "v.json").read_text())["ster_version"] == __version__
    assert read_vector(tmp_path / "v.json").hidden_size == 8  # still read back


# --------------------------------------------------------------------------- inspect, parity


def test_inspect_prints_yes_no_and_separated_counts(tiny):
    info = json.loads(ster("inspect", str(tiny), "--json").stdout)
    r = ster("inspect", str(tiny))
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines)
    row = {line.split()[0]: line.split(None, 1)[1] for line in lines if not line.startswith(" ") and " " in line}
    # a value too long for the line (a SHA-256 revision) is printed whole on the next one, never split
    for i, line in enumerate(lines):
        if line and " " not in line:
            assert lines[i + 1].startswith("  ") and " " not in lines[i + 1].strip()
            assert str(info[line]) == lines[i + 1].strip()
    assert row["chat_template"] == ("yes" if info["chat_template"] else "no")
    assert row["parameters"].startswith(f"{info['parameters']:,}") and "," in row["parameters"]
    assert f"vocab_size={info['dimensions']['vocab_size']:,}" in r.stdout
    assert f"tie_word_embeddings={'yes' if info['dimensions']['tie_word_embeddings'] else 'no'}" in r.stdout
    assert "True" not in r.stdout and "False" not in r.stdout


def test_parity_table_keeps_every_number_and_fits_80_columns():
    from rich.console import Console

    import ster_py.cli  # noqa: F401  (cli_tools is imported by cli, its commands' home)
    from ster_py.cli_tools import parity_table
    from ster_py.parity import ParityReport, PromptParity

    report = ParityReport("m", None, "f32", "transformers", 1e-4)
    report.prompts = [
        PromptParity("The capital of France is " * 6, list(range(1234)), 4.1e-5, 2.25e-3, 0.99999987, 1.0, True,
                     [], None),
        PromptParity("def f(n):\n    return n", [1, 2, 3], 0.123, 15.5, 0.875, 0.333, False, [], 17),
        PromptParity("short", [1], 1e-7, 1e-6, 1.0, 1.0, True, None, None),
    ]
    sink = io.StringIO()
    Console(file=sink, width=80, color_system=None).print(parity_table(report, 1e-4, width=80))
    lines = sink.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    body = [line for line in lines if line.strip() and not line.lstrip().startswith(("ster vs", "tokens"))]
    assert len(body) == 3  # one line per prompt: nothing wrapped
    for p, line in zip(report.prompts, body):
        for cell in (f"{len(p.ids):,}", f"{p.rel_error:.2e}", f"{p.max_abs_error:.2e}", f"{p.mean_cosine:.6f}",
                     f"{p.top1_agreement:.0%}", "pass" if p.passed else "FAIL"):
            assert cell in line, (cell, line)
    assert "layer 17" in body[1] and " no " in body[0] and "short" in body[2]
    assert "The capital of France" in body[0] and body[0].endswith("...")


# --------------------------------------------------------------------------- -q, NO_COLOR


def test_quiet_silences_the_stats_line(tiny):
    loud = ster("generate", "-m", str(tiny), "-p", "w5 w6", "--max-new-tokens", "2")
    quiet = ster("generate", "-m", str(tiny), "-p", "w5 w6", "--max-new-tokens", "2", "-q")
    assert loud.returncode == quiet.returncode == 0
    assert "prompt tokens" in loud.stderr and quiet.stderr == "" and quiet.stdout == loud.stdout
    tok = ster("tokenize", "-m", str(tiny), "-t", "w5 w6", "-q")
    assert tok.returncode == 0 and tok.stderr == "" and tok.stdout.split() == ["5", "6"]


def test_no_color_turns_off_every_style_on_a_terminal(tiny):
    args = ("generate", "-m", str(tiny), "-p", "w5 w6", "--max-new-tokens", "2")
    status, styled, _ = on_a_terminal(*args)
    assert status == 0 and SGR.search(styled)  # the check can see styles when there are some
    status, plain, _ = on_a_terminal(*args, env={"NO_COLOR": "1"})
    assert status == 0 and b"prompt tokens" in plain and not SGR.search(plain), plain[-400:]
    status, seen, _ = on_a_terminal("generate", "--help", env={"NO_COLOR": "1"})
    assert status == 0 and b"--prompt" in seen and not SGR.search(seen)


def test_stdout_that_is_not_a_terminal_gets_no_styles(tiny):
    status, _, piped = on_a_terminal("inspect", str(tiny), stdout_pipe=True)
    assert status == 0 and b"chat_template" in piped and not SGR.search(piped)


# --------------------------------------------------------------------------- small frictions


@pytest.mark.parametrize("args, option", [
    (("generate", "--precision", "fp8"), "--precision"), (("generate", "--quantize", "q3"), "--quantize"),
    (("generate", "--chat-template", "yes"), "--chat-template"), (("capture", "--position", "first"), "--position"),
])
def test_a_bad_choice_is_one_line_in_the_clis_words(tiny, args, option):
    """click's usage error (exit 2), with no pydantic class name in it."""
    r = ster(*args, "-m", str(tiny), "-p", "w5")
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert last.startswith(f"Error: Invalid value for '{option}': ") and "is not one of" in last, last
    assert "Value error" not in r.stderr


def test_zero_new_tokens_leave_stdout_empty(tiny):
    r = ster("generate", "-m", str(tiny), "-p", "w5 w6", "--max-new-tokens", "0")
    assert r.returncode == 0 and r.stdout == "" and "0 new tokens" in r.stderr
    two = ster("generate", "-m", str(tiny), "-p", "w5 w6", "--max-new-tokens", "2", "-q")
    assert two.returncode == 0 and two.stdout.endswith("\n") and two.stdout.strip()


def test_capture_output_must_be_named_safetensors(tiny, tmp_path):
    for name, hint in (("c.npy", "c.safetensors"), ("c", "c.safetensors")):
        r = ster("capture", "-m", str(tiny), "-p", "w5 w6", "-o", str(tmp_path / name))
        assert r.returncode == 1 and f"name it {hint}" in r.stderr and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_vector_output_never_overwrites_another_file(tiny, tmp_path):
    for side, text in (("pos", "w5 w6 w7"), ("neg", "w9 w10 w11")):
        r = ster("capture", "-m", str(tiny), "-p", text, "--layers", "0", "-o", str(tmp_path / f"{side}.safetensors"))
        assert r.returncode == 0, r.stderr
    caa = ("vector", "caa", "--positive", str(tmp_path / "pos.safetensors"), "--negative",
           str(tmp_path / "neg.safetensors"), "-q", "-o")
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": true}')
    r = ster(*caa, str(notes))
    assert r.returncode == 1 and "is not a steering vector" in r.stderr and notes.read_text() == '{"mine": true}'
    r = ster(*caa, str(tmp_path))
    assert r.returncode == 1 and "is a directory" in r.stderr
    # a breaker's finding: a .safetensors name was written, then refused by --vector
    r = ster(*caa, str(tmp_path / "v.safetensors"))
    assert r.returncode == 1 and "name it v.json" in r.stderr and not (tmp_path / "v.safetensors").exists()
    out = tmp_path / "v.json"
    assert ster(*caa, str(out)).returncode == 0
    first = out.read_text()
    assert ster(*caa, str(out)).returncode == 0 and out.read_text() == first  # an earlier vector is replaced


def test_inspect_keeps_a_long_revision_whole_on_its_own_line(monkeypatch):
    from typer.testing import CliRunner

    import ster_py.cli as cli
    import ster_py.inspect as inspect_module

    sha = "sha256:" + "0123456789abcdef" * 4
    monkeypatch.setattr(inspect_module, "inspect_model", lambda *a, **k: {"model": "m", "model_revision": sha,
                                                                          "kind": "gguf"})
    r = CliRunner().invoke(cli.app, ["inspect", "x"], terminal_width=80, prog_name="ster", color=False)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[1] == "model_revision" and lines[2] == "  " + sha and all(len(x) <= 80 for x in lines)


# --------------------------------------------------------------------------- issues 17 and 23: follow-ups (s7-fixa)


def cli(*args, input=None):
    """Run the CLI in-process; returns click's Result (SterError as ``exception``; stderr kept apart)."""
    from typer.testing import CliRunner

    from ster_py.cli import app

    return CliRunner().invoke(app, [str(a) for a in args], input=input, terminal_width=200)


@pytest.fixture(scope="module")
def captures(tiny, tmp_path_factory):
    """Two captures of every layer of the tiny llama, and the CAA vector between them."""
    root = tmp_path_factory.mktemp("captures")
    for side, text in (("pos", "w5 w6 w7"), ("neg", "w9 w10 w11")):
        r = cli("capture", "-m", tiny, "-p", text, "-q", "-o", root / f"{side}.safetensors")
        assert r.exit_code == 0, r.exception
    r = cli("vector", "caa", "--positive", root / "pos.safetensors", "--negative", root / "neg.safetensors",
            "-o", root / "v.json")
    assert r.exit_code == 0, r.exception
    return root


def test_vector_commands_print_layers_as_capture_does(captures, tiny, tmp_path):
    n = json.loads((tiny / "config.json").read_text())["num_hidden_layers"]
    r = cli("vector", "caa", "--positive", captures / "pos.safetensors", "--negative", captures / "neg.safetensors",
            "-o", tmp_path / "c.json")
    assert r.exit_code == 0 and f"layers 0..{n - 1} ({n});" in r.stderr and "[" not in r.stderr, r.stderr
    r = cli("vector", "pca", "--positive", captures / "pos.safetensors", "--negative", captures / "neg.safetensors",
            "-o", tmp_path / "p.json")
    assert r.exit_code == 0 and f"layers 0..{n - 1} ({n});" in r.stderr and "(pca, 1 pair)" in r.stderr, r.stderr
    r = cli("vector", "export", captures / "v.json", "-o", tmp_path / "x.gguf")
    assert r.exit_code == 0, r.exception
    lines = r.stderr.splitlines()  # the warning comes before the line that says what was written
    assert lines[0].startswith("warning: layer 0") and lines[-1].startswith(f"control vector: layers 1..{n - 1} "
                                                                           f"({n - 1}) at"), lines


def test_vector_export_never_overwrites_another_file(captures, tmp_path):
    from ster_py.gguf.reader import GGUFFile
    from ster_py.gguf.writer import TensorEntry, write_gguf

    vector = captures / "v.json"
    before = {p.name: p.read_bytes() for p in captures.iterdir()}
    for target, words in ((vector, "name it v.gguf"), (captures / "pos.safetensors", "name it pos.gguf"),
                          (tmp_path, "is a directory")):
        r = cli("vector", "export", vector, "-o", target)
        assert isinstance(r.exception, SterError) and words in str(r.exception), (target, r.exception)
    not_gguf, model = tmp_path / "notes.gguf", tmp_path / "model.gguf"
    not_gguf.write_text('{"mine": true}')
    write_gguf(model, {"general.architecture": "llama"},
               [TensorEntry("token_embd.weight", (4,), "F32", lambda: np.zeros(4, np.float32).view(np.uint8))])
    kept = model.read_bytes()
    for target in (not_gguf, model):
        r = cli("vector", "export", vector, "-o", target)
        assert isinstance(r.exception, SterError) and "is not a control-vector GGUF" in str(r.exception)
    assert not_gguf.read_text() == '{"mine": true}' and model.read_bytes() == kept
    assert {p.name: p.read_bytes() for p in captures.iterdir()} == before
    out = tmp_path / "cv.gguf"
    assert cli("vector", "export", vector, "-o", out, "-q").exit_code == 0
    assert cli("vector", "export", vector, "-o", out, "-q", "--strength", "2").exit_code == 0  # replaces our own
    assert GGUFFile(out).metadata["general.architecture"] == "controlvector"


@pytest.mark.parametrize("layers", ["0..99999999999999999999", "99999999999999999999", "0..100000000000",
                                    "-99999999999999999999..1"])
def test_huge_layer_numbers_are_named_not_overflowed(captures, tiny, tmp_path, layers):
    from ster_py.capture import parse_layers

    with pytest.raises(SterError, match=r"does not exist; this model has layers 0\.\.2"):
        parse_layers(layers, 3)
    for args in (("capture", "-m", tiny, "-p", "w5", "-o", tmp_path / "c.safetensors"),
                 ("vector", "caa", "--positive", captures / "pos.safetensors", "--negative",
                  captures / "neg.safetensors", "-o", tmp_path / "v.json")):
        r = cli(*args, "--layers", layers)
        assert isinstance(r.exception, SterError) and "does not exist; this model has layers 0.." in str(r.exception)


def test_unwritable_output_directories_are_one_error(captures, tiny, tmp_path):
    """The temporary file beside an output cannot be made (no permission, no such directory, a read-only
    file system): one "cannot write" error, from the one place every atomic output goes through."""
    from ster_py.artifacts import atomic_directory, atomic_outputs

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root writes anywhere: a file where the directory should be
            locked.chmod(0o700)
            locked.rmdir()
            locked.write_text("a file")
        for make in (lambda: atomic_outputs(locked / "x.json"), lambda: atomic_directory(locked / "d")):
            with pytest.raises(SterError, match=r"^cannot write .*locked/"):
                with make():
                    pass
        hidden = json.loads((tiny / "config.json").read_text())["hidden_size"]
        adapter = write_ster_adapter(tmp_path / "a.lora.json", str(tiny), hidden, 0, hidden)
        for args in (("capture", "-m", tiny, "-p", "w5", "-o", locked / "c.safetensors"),
                     ("vector", "caa", "--positive", captures / "pos.safetensors", "--negative",
                      captures / "neg.safetensors", "-o", locked / "v.json"),
                     ("tune", "merge", "--adapter", adapter, "-m", tiny, "-o", locked / "merged"),
                     ("tune", "merge", "--adapter", adapter, "-m", tiny, "-o", locked / "merged.gguf")):
            r = cli(*args)
            assert isinstance(r.exception, SterError) and str(r.exception).startswith("cannot write "), r.exception
    finally:
        if locked.is_dir():
            locked.chmod(0o700)


def test_counts_are_singular_for_one(tiny):
    r = cli("tokenize", "-m", tiny, "--text", "w5")
    assert r.exit_code == 0 and r.stderr.strip().endswith("1 token"), r.stderr
    r = cli("generate", "-m", tiny, "-p", "w5", "--max-new-tokens", "1", "--chat-template", "off")
    assert r.exit_code == 0 and "1 prompt token, 1 new token (" in r.stderr, r.stderr


def test_chat_save_keeps_other_files_and_names_a_directory(tiny_chat, tmp_path):
    from ster_py.cli_chat import save_conversation

    turn = [{"role": "user", "content": "w5"}]
    notes, saved = tmp_path / "notes.json", tmp_path / "chat.json"
    notes.write_text('{"mine": true}')
    with pytest.raises(SterError, match="is not a saved conversation"):
        save_conversation(turn, notes)
    with pytest.raises(SterError, match="is a directory"):
        save_conversation(turn, tmp_path)
    save_conversation(turn, saved)
    save_conversation(turn * 2, saved)  # an earlier conversation is replaced
    assert json.loads(saved.read_text()) == turn * 2 and notes.read_text() == '{"mine": true}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.json", "notes.json"]  # no temporary left
    r = cli("chat", "-m", tiny_chat, "-q", "--max-new-tokens", "1", input=f"/save {notes}\n/save {tmp_path}\n")
    assert r.exit_code == 1, r.exception   # piped input some of whose lines failed
    assert "is not a saved conversation" in r.stderr and "is a directory" in r.stderr and "Errno" not in r.stderr
    assert notes.read_text() == '{"mine": true}'


@pytest.mark.parametrize("alpha, words", [("NaN", "must be a finite number"), ("Infinity", "must be a finite number"),
                                          ("1" + "0" * 400, "must be a finite number"),
                                          ("1e39", "overflows float32"), ('"8"', "must be a finite number")],
                         ids=["nan", "inf", "10**400", "1e39", "string"])
def test_lora_alpha_must_be_finite_and_fit_float32(tiny, tmp_path, alpha, words):
    """PEFT's adapter_config.json and ster's sidecar, through `generate --adapter` and `tune merge`: refused
    when the adapter is read, with nothing written."""
    hidden = json.loads((tiny / "config.json").read_text())["hidden_size"]
    side = write_ster_adapter(tmp_path / "a.lora.json", str(tiny), hidden, 0, hidden)
    side.write_text(side.read_text().replace('"alpha": 4', f'"alpha": {alpha}'))
    peft = tmp_path / "peft"
    peft.mkdir()
    (peft / "adapter_config.json").write_text(
        f'{{"peft_type": "LORA", "r": 2, "lora_alpha": {alpha}, "target_modules": ["q_proj"], '
        f'"base_model_name_or_path": "{tiny}"}}')
    (peft / "adapter_model.safetensors").write_bytes((side.with_name("a.lora.safetensors")).read_bytes())
    for adapter, name in ((side, "alpha"), (peft, "lora_alpha")):
        r = cli("generate", "-m", tiny, "-p", "w5", "--max-new-tokens", "1", "--adapter", adapter)
        assert isinstance(r.exception, SterError) and f": {name} " in str(r.exception), r.exception
        assert words in str(r.exception), r.exception
        r = cli("tune", "merge", "--adapter", adapter, "-m", tiny, "-o", tmp_path / "merged")
        assert isinstance(r.exception, SterError) and words in str(r.exception), r.exception
    assert not (tmp_path / "merged").exists()


def test_deeply_nested_tools_file_is_refused(tiny_chat, tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 5000 + "]" * 5000)
    r = cli("generate", "-m", tiny_chat, "-p", "w5", "--max-new-tokens", "1", "--tools", deep)
    assert isinstance(r.exception, SterError) and "nested too deeply" in str(r.exception), r.exception


def test_ctrl_c_while_the_cli_imports_is_one_word(tmp_path):
    """The console script (pyproject's [project.scripts]) imports the CLI under a Ctrl-C guard: a
    KeyboardInterrupt raised by the import of typer stands for Ctrl-C pressed in the first second."""
    import tomllib

    script = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["scripts"]["ster"]
    module, _, func = script.partition(":")
    code = ("import sys\n"
            "class Interrupt:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'typer':\n"
            "            raise KeyboardInterrupt\n"
            "sys.meta_path.insert(0, Interrupt())\n"
            f"from {module} import {func}\n{func}()\n")
    r = subprocess.run([sys.executable, "-c", code, "generate", "-p", "hi"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 130 and r.stderr == "interrupted\n" and r.stdout == "", r


@pytest.mark.parametrize("sig, status, word", [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated")])
def test_ctrl_c_during_a_streamed_answer_closes_the_line(tiny, tmp_path, sig, status, word):
    """Ctrl-C ends the half-written streamed line with a newline before "interrupted"; SIGTERM (the console
    script's handler, ster_py.entry) left it unfinished before "terminated", and now closes it too."""
    import shutil
    import signal
    import time

    long = tmp_path / "long"
    shutil.copytree(tiny, long)
    cfg = json.loads((long / "config.json").read_text())
    (long / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 1 << 17}))
    # PYTHONFAULTHANDLER: should the child still outlive the interrupt, SIGABRT makes it print every thread's
    # stack into the failure.
    proc = subprocess.Popen([sys.executable, "-c", "from ster_py.entry import main; main()", "generate", "-m",
                             str(long), "-p", "w5 w6", "--chat-template", "off", "--max-new-tokens", str(1 << 16)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONFAULTHANDLER": "1"},
                            preexec_fn=sigint_as_at_a_terminal)
    first = proc.stdout.read(1)  # the answer is streaming
    time.sleep(0.2)
    proc.send_signal(getattr(signal, sig))
    try:
        rest, errors = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        rest, errors = proc.communicate(timeout=60)
        pytest.fail(f"ster generate outlived {sig} by 60 s; its threads when aborted:\n{errors.decode()[-6000:]}")
    assert proc.returncode == status and first and (first + rest).endswith(b"\n"), (proc.returncode, rest[-40:])
    assert errors.decode().endswith(f"{word}\n") and b"Traceback" not in errors, errors


@pytest.mark.parametrize("args, words", [(["--temperature", "abc"], "'abc' is not a number"),
                                         (["--max-new-tokens", "1.5"], "'1.5' is not an integer"),
                                         (["--top-k=x"], "'x' is not an integer")])
def test_unparsable_numbers_are_said_plainly(tiny, args, words):
    r = cli("generate", "-m", tiny, "-p", "w5", *args)
    assert r.exit_code == 2 and words in r.stderr and "Input should be" not in r.stderr, r.stderr


def test_perplexity_takes_the_model_as_the_other_commands_do(tiny, tmp_path, monkeypatch):
    """-m/--model or the argument, the two agreeing; without either, the default preset (as generate)."""
    import ster_py.load
    from ster_py.presets import DEFAULT_PRESET

    text = tmp_path / "t.txt"
    text.write_text("w5 w6 w7 w8 w9 w10 " * 8)
    docs = []
    for how in (["-m", tiny], [tiny], [tiny, "--model", tiny]):
        r = cli("perplexity", *how, "-f", text, "--ctx", "16", "--json", "-q")
        assert r.exit_code == 0, r.exception
        docs.append(json.loads(r.stdout))
    assert docs[0]["ppl"] == docs[1]["ppl"] == docs[2]["ppl"] and docs[0]["model"] == str(tiny)
    r = cli("perplexity", tiny, "-m", tmp_path, "-f", text)
    assert isinstance(r.exception, SterError) and "two models given" in str(r.exception)
    asked = []

    def no_fetch(model, *a, **k):
        asked.append(model)
        raise SterError("not fetched in this test")

    monkeypatch.setattr(ster_py.load, "load_model", no_fetch)
    r = cli("perplexity", "-f", text)
    assert asked == [DEFAULT_PRESET] and "not fetched" in str(r.exception)


def test_a_vector_that_is_not_json_is_named_plainly(tmp_path):
    from ster_py.steering import read_vector

    gguf = tmp_path / "happy.gguf.json"  # any name: the bytes say what it is
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(range(256)))
    with pytest.raises(SterError, match="is a GGUF file, not JSON; give the JSON file ster wrote"):
        read_vector(gguf)
    text = tmp_path / "notes.json"
    text.write_text("not json")
    with pytest.raises(SterError, match=r"is not readable JSON \(Expecting value at line 1, column 1\)"):
        read_vector(text)
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xfe\xff\x00")
    with pytest.raises(SterError, match="it is not UTF-8 text"):
        read_vector(binary)


def test_perplexity_counts_read_in_the_singular():
    from ster_py.perplexity import windows

    with pytest.raises(SterError, match="the text tokenizes to 1 token; "):
        windows([5], 8, None)
    with pytest.raises(SterError, match="the text tokenizes to 3 tokens; "):
        windows([5, 6, 7], 8, None)


# --------------------------------------------------------------------------- issue 23, second pass (s8-first)
# Oracles: the file system (nothing created, nothing written), click's own usage line for the other usage
# errors, the checkpoint's config.json (layer count, width), Transformers on the same weights (wrappers,
# the default model's one-token parity), and ster's own float path for the parity measure.


def _no_new_files(root: Path, before: set) -> None:
    assert {p.relative_to(root) for p in root.rglob("*")} == before


def test_outputs_in_a_missing_folder_are_refused_and_nothing_is_made(captures, tiny, tmp_path):
    """A mistyped folder is one error naming it, before any work; no folder and no file appear."""
    from ster_py.artifacts import atomic_directory, atomic_outputs

    missing = tmp_path / "vecs"
    hidden = json.loads((tiny / "config.json").read_text())["hidden_size"]
    adapter = write_ster_adapter(tmp_path / "a.lora.json", str(tiny), hidden, 0, hidden)
    before = {p.relative_to(tmp_path) for p in tmp_path.rglob("*")}
    for make in (lambda: atomic_outputs(missing / "x.json"), lambda: atomic_directory(missing / "d")):
        with pytest.raises(SterError, match=f"folder {re.escape(str(missing))} does not exist; create it first"):
            with make():
                pass
    for args in (("capture", "-m", tiny, "-p", "w5", "-o", missing / "c.safetensors"),
                 ("vector", "caa", "--positive", captures / "pos.safetensors", "--negative",
                  captures / "neg.safetensors", "-o", missing / "v.json"),
                 ("vector", "pca", "--positive", captures / "pos.safetensors", "--negative",
                  captures / "neg.safetensors", "-o", missing / "v.json"),
                 ("vector", "export", captures / "v.json", "-o", missing / "v.gguf"),
                 ("convert", tiny, "-o", missing / "m.gguf"),
                 ("tune", "merge", "--adapter", adapter, "-m", tiny, "-o", missing / "merged"),
                 ("tune", "merge", "--adapter", adapter, "-m", tiny, "-o", missing / "merged.gguf")):
        r = cli(*args)
        assert isinstance(r.exception, SterError), (args, r.exception, r.output)
        assert f"folder {missing} does not exist; create it first" in str(r.exception), r.exception
    r = cli("chat", "-m", tiny_chat_dir(tiny, tmp_path / "chatdir"), "-q", input=f"/save {missing / 'c.json'}\n")
    assert r.exit_code == 1 and f"folder {missing} does not exist; create it first" in r.stderr, r.stderr
    assert not missing.exists()
    _no_new_files(tmp_path, before | {p.relative_to(tmp_path) for p in (tmp_path / "chatdir").rglob("*")}
                  | {Path("chatdir")})


def tiny_chat_dir(tiny: Path, path: Path) -> Path:
    """A copy of the tiny llama with a chat template (what `ster chat` needs)."""
    import shutil

    shutil.copytree(tiny, path)
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": TEMPLATE}))
    return path


def test_an_existing_folder_still_takes_the_output(tiny, tmp_path):
    (tmp_path / "vecs").mkdir()
    r = cli("capture", "-m", tiny, "-p", "w5", "-q", "-o", tmp_path / "vecs" / "c.safetensors")
    assert r.exit_code == 0, r.exception
    assert sorted(p.name for p in (tmp_path / "vecs").iterdir()) == ["c.json", "c.safetensors"]


def test_parity_measures_a_one_token_prompt_as_a_longer_one(tiny):
    """A one-token forward goes down the decode path, which rounds the inputs of block-quantized products to
    int16; parity runs the float path whatever the length. Position 0 of a longer prompt (float path, causal:
    it does not see the later tokens) is the oracle for the one-token prompt's logits."""
    from ster_py._kernels import qmatmul
    from ster_py.decoder.qlinear import float_activations
    from ster_py.load import load_model
    from ster_py.parity import run_parity

    loaded = load_model(str(tiny), quantize="q8_0")  # block-quantized projections, as a GGUF's
    ids = loaded.tokenizer.encode("w5", add_special_tokens=True)
    assert len(ids) == 1
    with float_activations():   # the float path parity runs (no bfloat16 tiles on an AMX CPU either)
        longer = loaded.decoder.forward(ids + [9, 10, 11])[:1]

    def reference(got):
        assert list(got) == ids
        return longer, None

    report = run_parity(loaded, ["w5"], reference_fn=reference, tolerance=1e-4)
    assert report.prompts[0].rel_error < 1e-6, report.prompts[0]
    qmatmul.set_int16_activations(True)
    rounded = loaded.decoder.forward(ids)  # the decode path outside parity: this test can fail
    assert np.linalg.norm(rounded - longer) / np.linalg.norm(longer) > 1e-6


@pytest.mark.real
def test_default_model_passes_parity_on_a_one_token_prompt(smollm2_gguf, smollm2_hf):
    """`ster parity -p x` on the default model (SmolLM2-135M Q4_1) against Transformers' reading of the same
    GGUF (the session fixture's saved copy): 1.5e-4 before, when the one token took the int16 decode path."""
    from ster_py.load import load_model
    from ster_py.parity import run_parity, transformers_reference
    from ster_py.resolve import resolve

    reference = transformers_reference(resolve(str(smollm2_hf), weights=False))
    report = run_parity(load_model(str(smollm2_gguf)), ["x"], tolerance=1e-4, reference_fn=reference)
    assert report.passed and report.prompts[0].rel_error < 2e-5, report.prompts[0]


def test_per_layer_errors_break_between_pairs(tiny):
    """Every line fits 80 columns and holds whole "layer: error" pairs; all pairs are there, in order."""
    import ster_py.cli  # noqa: F401  (cli_tools is imported by cli, its commands' home)
    from ster_py.cli_tools import layer_error_lines

    p = SimpleNamespace(prompt="The capital\nof France is Paris and more words",
                        layers=[SimpleNamespace(layer=i, rel_error=1.234e-4 * (i + 1) ** 3) for i in range(40)])
    lines = layer_error_lines(p, 80)
    pair = r"\d+: \d\.\de[-+]\d\d"
    assert len(lines) > 3 and all(len(line) <= 80 for line in lines), lines
    assert lines[0].startswith("per-layer relative error (The capital\\nof France is P...): 0: "), lines[0]
    for line in lines[1:]:
        assert re.fullmatch(rf"  {pair}(, {pair})*,?", line), line
    found = re.findall(pair, " ".join(lines))
    assert found == [f"{e.layer}: {e.rel_error:.1e}" for e in p.layers]
    r = cli("parity", "-m", tiny, "-p", "w5 w6 w7", "--tolerance", "0", "-q")  # every layer "diverges"
    assert r.exit_code == 1, r.exception
    shown = [line for line in r.stdout.splitlines() if line.startswith(("per-layer", "  "))]
    n = json.loads((tiny / "config.json").read_text())["num_hidden_layers"]
    assert shown and all(len(line) <= 80 for line in shown), r.stdout
    assert [int(k) for k in re.findall(r"(\d+): \d\.\de", " ".join(shown))] == list(range(n)), shown


def test_an_option_missing_its_value_prints_the_usage_line():
    for args, usage in ((("generate", "-m"), "Usage: ster generate [OPTIONS]"),
                        (("capture", "--layers"), "Usage: ster capture [OPTIONS]"),
                        (("vector", "caa", "--positive"), "Usage: ster vector caa [OPTIONS]")):
        r = cli(*args)
        assert r.exit_code == 2, r.output
        assert usage in r.output and "requires an argument" in r.output, r.output
        assert f"Try 'ster {' '.join(args[:-1])} --help' for help." in r.output, r.output


def test_no_value_name_is_a_type_name():
    """Every option of every command names its value as what it takes (no TEXT, INTEGER, FLOAT, PATH ...)."""
    for path, _ in all_commands():
        text = help_text(path)
        where = " ".join(path) or "ster"
        for line in text.splitlines():
            assert not re.search(r"\b(TEXT|INTEGER|FLOAT|PATH|FILENAME|BOOLEAN|DIRECTORY)\b", line), (where, line)
            assert not re.search(r"<(bool|str|int|float|path|list)", line), (where, line)
    assert "--draft MODEL" in help_text(("generate",)) and "--adapter ADAPTER" in help_text(("generate",))
    assert "--reference MODEL" in help_text(("perplexity",))
    assert "--reference transformers|llama.cpp" in help_text(("parity",))
    merge = help_text(("tune", "merge"))
    assert "-t, --type TYPE" in merge and "-o, --output DIR|FILE.gguf" in merge


def test_piped_chat_ends_with_a_newline(tiny, tmp_path):
    """Piped input: stdout holds the answers alone, one line each (no "> " prompts: s9-left), ending with
    a newline; the answers are greedy decoding's through the template."""
    from ster_py.conversation import Session
    from ster_py.generate import Sampling
    from ster_py.load import load_model

    chat = tiny_chat_dir(tiny, tmp_path / "chat")
    session = Session(load_model(str(chat)))
    first = session.reply([{"role": "user", "content": "w5"}], Sampling(max_new_tokens=2)).text
    second = session.reply([{"role": "user", "content": "w5"}, {"role": "assistant", "content": first},
                            {"role": "user", "content": "w9"}], Sampling(max_new_tokens=2)).text
    for stdin, want in (("w5\n/quit\n", first + "\n"), ("w5\n", first + "\n"), ("w5", first + "\n"),
                        ("/quit\n", ""), ("w5\n\nw9\n", first + "\n" + second + "\n")):
        r = cli("chat", "-m", chat, "-q", "--max-new-tokens", "2", input=stdin)
        assert r.exit_code == 0, r.exception
        assert r.stdout == want and ">" not in r.stderr, (stdin, r.stdout, r.stderr)
    # Replies to commands go to stderr (newuser s10): stdout still holds the answers alone.
    saved = tmp_path / "c.json"
    r = cli("chat", "-m", chat, "-q", "--max-new-tokens", "2", input=f"/help\n/reset\nw5\n/save {saved}\n")
    assert r.exit_code == 0, r.exception
    assert r.stdout == first + "\n", r.stdout
    assert "/save FILE" in r.stderr and "(conversation cleared)" in r.stderr and "saved 2 messages" in r.stderr


def test_inspect_names_a_control_vector(captures, tiny, tmp_path):
    config = json.loads((tiny / "config.json").read_text())
    n, hidden = config["num_hidden_layers"], config["hidden_size"]
    r = cli("vector", "export", captures / "v.json", "-o", tmp_path / "v.gguf")
    assert r.exit_code == 0, r.exception
    words = (f"is not a model: it is a llama.cpp control vector (as `ster vector export` writes) for {n - 1} "
             f"layers (1..{n - 1}) of hidden size {hidden}, made for a 'llama' model")
    r = cli("generate", "-m", tmp_path / "v.gguf", "-p", "w5")
    assert isinstance(r.exception, SterError) and words in str(r.exception), r.exception
    assert "--control-vector" in str(r.exception)
    # inspect describes it (s9-left: `--json` printed an error line, not JSON), read back with gguf-py
    import gguf

    reader = gguf.GGUFReader(str(tmp_path / "v.gguf"))
    layers = sorted(int(t.name.split(".")[1]) for t in reader.tensors)
    widths = {int(t.shape[0]) for t in reader.tensors}
    r = cli("inspect", tmp_path / "v.gguf", "--json", "-q")
    assert r.exit_code == 0, r.exception
    doc = json.loads(r.stdout)
    assert doc["kind"] == "control_vector" and doc["layers"] == layers == list(range(1, n))
    assert widths == {hidden} and doc["hidden_size"] == hidden and doc["model_hint"] == "llama"
    assert doc["file_bytes"] == (tmp_path / "v.gguf").stat().st_size and doc["note"].startswith("not a model")
    r = cli("inspect", tmp_path / "v.gguf", "-q")
    assert r.exit_code == 0 and "control_vector" in r.stdout and "not a model" in r.stdout, (r.exception, r.stdout)


# ------------------------------------------------------------- a wrapper whose text_config names another family

Q35_TEXT = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, layer_types=["linear_attention", "full_attention"],
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
                bos_token_id=1, eos_token_id=2, pad_token_id=0)


@pytest.fixture(scope="module")
def qwen3_5_wrapped(tmp_path_factory):
    """A tiny qwen3_5 multimodal checkpoint (Transformers' Qwen3_5ForConditionalGeneration) and its model."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from tiny import write_tokenizer

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("qwen3_5")
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=14,
                  temporal_patch_size=2, spatial_merge_size=2, in_channels=3)
    cfg = AutoConfig.for_model("qwen3_5", text_config=dict(Q35_TEXT, model_type="qwen3_5_text"),
                               vision_config=vision)
    model = AutoModelForImageTextToText.from_config(cfg, attn_implementation="eager").eval()
    model.save_pretrained(path)
    write_tokenizer(path, 128)
    return path, model


def _retyped(src: Path, dst: Path, text_type) -> Path:
    import shutil

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["text_config"]["model_type"] = text_type
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_every_wrappers_text_type_is_the_one_transformers_writes():
    """The refusal below never meets a config Transformers wrote: its text_config names our decoder."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from ster_py.families import WRAPPERS

    checked = 0
    for wrapper, (text_type, _) in WRAPPERS.items():
        if wrapper in CONFIG_MAPPING_NAMES:
            assert AutoConfig.for_model(wrapper).text_config.model_type == text_type, wrapper
            checked += 1
    assert checked >= 8


@pytest.mark.parametrize("other", ["qwen3", "llama", "qwen3_5_moe_text", "gemma4"])
def test_a_wrapper_naming_another_family_is_refused_before_weights(qwen3_5_wrapped, tmp_path, other):
    path = _retyped(qwen3_5_wrapped[0], tmp_path / "m", other)
    (path / "model.safetensors").write_bytes(b"not read: the refusal comes first")
    for args in (("inspect", path), ("generate", "-m", path, "-p", "w5")):
        r = cli(*args)
        assert isinstance(r.exception, SterError), r.exception
        assert (f"model_type 'qwen3_5' is a multimodal checkpoint whose text decoder is 'qwen3_5_text', but its "
                f"text_config.model_type says '{other}', another family") in str(r.exception), r.exception


def test_a_wrapper_with_an_unknown_text_type_runs_its_decoder_with_a_warning(qwen3_5_wrapped, tmp_path):
    import torch

    from ster_py.load import load_model

    src, model = qwen3_5_wrapped
    ids = [5, 9, 17, 33, 60]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    plain = load_model(str(src))
    assert plain.warnings == []
    odd = load_model(str(_retyped(src, tmp_path / "m", "qwen3_5_text_v2")))
    assert odd.spec.model_type == "qwen3_5_text"
    assert len(odd.warnings) == 1 and "text_config.model_type 'qwen3_5_text_v2' is not a model_type ster knows; " \
        "read as 'qwen3_5_text', the text decoder of a 'qwen3_5' checkpoint" in odd.warnings[0], odd.warnings
    for loaded in (plain, odd):
        ours = loaded.decoder.forward(ids)
        assert np.linalg.norm(ours - ref) / np.linalg.norm(ref) < 1e-4
    r = cli("generate", "-m", tmp_path / "m", "-p", "w5", "--max-new-tokens", "1", "--chat-template", "off")
    assert r.exit_code == 0 and "warning: " in r.stderr and "qwen3_5_text_v2" in r.stderr, r.stderr


# --------------------------------------------------------------------------- issue 23: newuser3's report (s8-nu)


def test_chat_save_refuses_a_messages_file_of_another_conversation(tiny_chat, tmp_path):
    """newuser3 #1: a messages list that is not an earlier save of this conversation stays as it was."""
    theirs = tmp_path / "chat.json"
    text = '[{"role":"user","content":"Hi"}]\n'
    theirs.write_text(text)
    r = cli("chat", "-m", tiny_chat, "-q", "--max-new-tokens", "1", input=f"/save {theirs}\nw5\n/save {theirs}\n")
    assert r.exit_code == 1, r.exception   # piped input some of whose lines failed
    assert r.stderr.count(f"{theirs} holds another conversation (1 message); /save to a new name") == 2, r.stderr
    assert theirs.read_text() == text and sorted(p.name for p in tmp_path.iterdir()) == ["chat.json"]
    ours = tmp_path / "ours.json"  # an earlier save of this conversation is replaced as it grows
    r = cli("chat", "-m", tiny_chat, "-q", "--max-new-tokens", "1", input=f"/save {ours}\nw5\n/save {ours}\n"
                                                                           f"w6\n/save {ours}\n")
    assert r.exit_code == 0 and "holds another" not in r.stderr, r.stderr
    saved = json.loads(ours.read_text())
    assert [m["role"] for m in saved] == ["user", "assistant", "user", "assistant"] and saved[0]["content"] == "w5"


def test_parity_failure_line_and_table_fit_80_columns(tiny):
    """newuser3 #2 and #5: the closing "parity failed" line wraps within 80 columns; the header's column
    names are one word each; no trailing spaces; a cut prompt ends with ..., a whole one as it is."""
    import ster_py.cli  # noqa: F401  (cli_tools is imported by cli, its commands' home)
    from ster_py.cli_tools import parity_failed_lines

    long = "w5 w6 w7 " * 12
    r = cli("parity", "-m", tiny, "-p", "w5 w6", "--tolerance", "0", "-q")  # every layer "diverges"
    assert r.exit_code == 1, r.exception
    failed = r.stderr.splitlines()
    assert failed[0].startswith("parity failed: relative logit error ") and failed[1] == "  first divergent layer 0"
    assert all(len(x) <= 80 for x in failed), failed
    assert parity_failed_lines(1.444e-6, 1e-7, 0, 80) == [
        "parity failed: relative logit error 1.444e-06 > tolerance 1e-07;", "  first divergent layer 0"]
    assert parity_failed_lines(1.444e-6, 1e-7, 0, 100) == [
        "parity failed: relative logit error 1.444e-06 > tolerance 1e-07; first divergent layer 0"]
    assert parity_failed_lines(1.444e-6, 1e-7, None, 40) == [
        "parity failed: relative logit error 1.444e-06 > tolerance 1e-07"]
    r = cli("parity", "-m", tiny, "-p", long.strip(), "-q")
    assert r.exit_code == 0, r.exception
    lines = r.stdout.splitlines()
    assert lines[1].split() == ["tokens", "rel-err", "max-abs", "mean-cos", "top-1", "diverges", "result", "prompt"]
    assert all(len(x) <= 80 and x == x.rstrip() for x in lines), lines
    assert lines[2].endswith("...") and " w5 w6 w7" in lines[2], lines
    r = cli("parity", "-m", tiny, "-p", "w5 w6", "-q")
    assert r.exit_code == 0 and re.search(r" pass +w5 w6$", r.stdout.splitlines()[2]), r.stdout


def test_convert_type_outside_the_choices_is_a_usage_error(tmp_path):
    """newuser3 #4: as --precision f8 is: Usage, exit 2, the choices named, and the close one suggested;
    nothing is read (the model does not exist) and nothing written."""
    from ster_py.gguf.recipe import FILE_TYPES, file_type

    for value, hint in (("q4km", "; did you mean q4_k_m?"), ("Q8-0", "; did you mean q8_0?"), ("zz", "")):
        r = cli("convert", tmp_path / "missing", "-o", tmp_path / "o.gguf", "-t", value)
        assert r.exit_code == 2 and "Usage: " in r.output, r.output
        message = " ".join(r.output.split())  # click may wrap it
        assert f"'{value}' is not one of " in message and all(f"'{n}'" in message for n in FILE_TYPES), message
        assert message.endswith(f"'q5_k_m'{hint}") or hint and hint in message, message
        assert ("did you mean" in message) == bool(hint), message
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(SterError, match=r"unknown --type 'q4km'; use one of .*; did you mean q4_k_m\?"):
        file_type("q4km")
    assert file_type("Q4_K_M") is FILE_TYPES["q4_k_m"]


def test_convert_report_has_no_padding_and_the_whole_sha(tmp_path, monkeypatch):
    """newuser3 #2: the report prints as `ster inspect` does: no trailing spaces, nothing cut with an ellipsis,
    the model's revision (a sha256, as a Hub preset's is) whole on a line of its own."""
    import ster_py.convert as convert_module
    from export_helpers import tiny_bpe_checkpoint

    tiny = tmp_path / "bpe"  # a tiny llama with a tokenizer ster writes to GGUF
    tiny_bpe_checkpoint(tiny, "llama", dict(vocab_size=320, hidden_size=64, intermediate_size=128,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    r = cli("convert", tiny, "-o", tmp_path / "t.gguf", "-t", "q8_0", "--json", "-q")
    assert r.exit_code == 0, r.exception
    report = json.loads(r.stdout)
    assert "model_revision" in report  # a local directory has none; a preset's is the GGUF's sha256
    sha = "sha256:" + "b179c9523d0e6a0f" * 4
    monkeypatch.setattr(convert_module, "convert_model", lambda *a, **k: {**report, "model_revision": sha})
    r = cli("convert", tiny, "-o", tmp_path / "u.gguf", "-t", "q8_0")
    assert r.exit_code == 0, r.exception
    lines = r.stdout.splitlines()
    assert all(line == line.rstrip() and len(line) <= 80 for line in lines), lines
    assert "…" not in r.stdout and lines[lines.index("model_revision") + 1] == "  " + sha, lines
    assert re.search(r"^architecture +llama$", r.stdout, re.M) and f"{report['bytes']:,} bytes" in r.stdout


def test_help_keeps_each_default_whole():
    """newuser3 #3: `[default: no-parse-special]` was split after `no-`; `[default:` ended a line."""
    seen = 0
    for path, _ in all_commands():
        text = help_text(path)
        for line in text.splitlines():
            assert not line.rstrip().endswith(("[default:", "no-")), (path, line)
            for note in re.findall(r"\[default:[^\]]*(?:\]|$)", line):
                assert note.endswith("]"), (path, line)
                seen += 1
        assert all(len(line) <= 80 for line in text.splitlines()), path
    assert "[default: no-parse-special]" in help_text(("tokenize",))
    assert "[default: generation-prompt]" in help_text(("template", "render"))
    assert seen > 20


def test_a_missing_drafter_is_named_as_the_drafter(tiny, tmp_path, monkeypatch):
    """newuser3 #8: `--draft nonexist.gguf` said what a missing `-m` says; now it names --draft, before any
    weight is read (generate and chat check it with the other draft options)."""
    import ster_py.load as load_module

    def no_load(*a, **k):
        raise AssertionError("a weight was read before the drafter was checked")

    missing = tmp_path / "nonexist.gguf"
    with monkeypatch.context() as m:
        m.setattr(load_module, "load_model", no_load)
        for command in (("generate", "-p", "w5"), ("chat",)):
            r = cli(*command, "-m", tiny, "--draft", missing, input="w5\n")
            assert isinstance(r.exception, SterError), r.exception
            assert str(r.exception) == f"no such file or directory: {missing} (given as the drafter, --draft)"
    r = cli("generate", "-m", missing, "-p", "w5")  # the model's own message is unchanged
    assert isinstance(r.exception, SterError) and str(r.exception) == f"no such file or directory: {missing}"
    empty = tmp_path / "empty"  # found, but not a model: refused while the drafter loads, named as the drafter
    empty.mkdir()
    r = cli("generate", "-m", tiny, "-p", "w5", "--draft", empty, "--chat-template", "off")
    assert isinstance(r.exception, SterError) and str(r.exception).startswith(f"the drafter (--draft {empty}): ")


def test_self_drafting_counts_no_proposal_past_the_stop(tiny, tmp_path):
    """newuser3 #9: the model as its own drafter accepts every proposal it verified; those past the stop token
    (the drafter runs on past the end of the answer) are neither drafted nor rejected."""
    import shutil

    args = ("-p", "w5 w6", "--chat-template", "off", "--max-new-tokens", "12", "--json", "-q")
    r = cli("generate", "-m", tiny, *args)
    assert r.exit_code == 0, r.exception
    ids = json.loads(r.stdout)["ids"]
    stop = next(i for i in range(3, len(ids)) if ids[i] not in ids[:i])  # a stop token mid-answer
    model = tmp_path / "stops"
    shutil.copytree(tiny, model)
    for name in ("config.json", "generation_config.json"):
        doc = json.loads((model / name).read_text())
        (model / name).write_text(json.dumps({**doc, "eos_token_id": ids[stop]}))
    r = cli("generate", "-m", model, *args, "--draft", model, "--draft-max", "8")
    assert r.exit_code == 0, r.exception
    doc = json.loads(r.stdout)
    assert doc["ids"] == ids[:stop + 1] and doc["stop_reason"] == "stop_token", doc
    # the first id comes from the prefill; the first round's 8 proposals run past the stop
    assert stop < 8 and doc["draft"]["drafted"] == doc["draft"]["accepted"] == stop, doc["draft"]
    r = cli("generate", "-m", model, *args[:-2], "--draft", model, "--draft-max", "8")
    assert r.exit_code == 0 and f"{stop} of {stop} drafted tokens accepted" in r.stderr, r.stderr


def test_readme_shows_capture_layers_as_optional_and_names_device():
    """newuser3 #6 and #12: the README's capture synopsis brackets --layers (it defaults to all layers, as
    --help says), and --device, which --help shows on generate, chat, serve and capture, is in the README."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    synopsis = readme[readme.index("    ster capture "):]
    synopsis = synopsis[:synopsis.index("\n\n")]
    assert "[--layers all|N|a..b|a,b,c]" in synopsis and " --layers" not in synopsis.replace("[--layers", ""), synopsis
    assert "[default: all]" in " ".join(help_text(("capture",)).split())
    for path in (("generate",), ("chat",), ("serve",), ("capture",)):
        assert "--device DEVICE" in help_text(path), path
    assert "`--device cpu` (on `generate`, `chat`, `serve` and `capture`)" in " ".join(readme.split())


@pytest.mark.parametrize("command", ["generate", "chat", "serve", "parity", "capture", "vector caa", "vector pca",
                                     "vector export", "convert", "perplexity", "tune merge", "template render",
                                     "tokenize", "detokenize"])
def test_readme_synopses_name_every_option_of_help(command):
    """newuser (sixteenth session) #7: the README's generate and chat synopses left out options their --help
    lists (chat: --repeat-last-n, --precision, --draft; generate: --vector, --adapter, --revision...); the
    seventeenth session's found parity's --quantize / --threads and perplexity's --precision / --revision
    missing, so every command's synopsis is held to its --help."""
    import re

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    synopsis = readme[readme.index(f"    ster {command} "):]
    synopsis = synopsis[:synopsis.index("\n\n")]
    shown = set(re.findall(r"--[a-z][a-z-]*", synopsis)) | {long for short, long in (("-q", "--quiet"), ("-m", "--model"))
                                                              if re.search(rf"(?<![\w-]){short}[] ]", synopsis)}
    # the options --help lists: an option's line starts with two spaces and its names (the texts' mentions of
    # other options, e.g. llama.cpp's, are continuation lines, indented further)
    listed = {name for line in help_text(tuple(command.split())).splitlines() if re.match(r"  (-\w, )?--", line)
              for name in re.findall(r"--[a-z][a-z-]*", line.split("  ")[1])} - {"--help"}
    listed = {name for name in listed if name.replace("--no-", "--") not in shown}   # a switch's pair: either name
    assert listed <= shown, (command, sorted(listed - shown))


# --------------------------------------------------------------------------- s9-left: the attacker's leftovers


def test_outputs_that_are_symbolic_links_are_refused_by_every_writer(captures, tiny, tmp_path):
    """``-o LINK`` (dangling, or to a file of the right kind) is one error from the one output check
    (``artifacts.check_folder``) of every writing command: the link is neither replaced nor
    written through (``vector caa -o`` replaced a dangling link)."""
    import os
    import shutil

    from ster_py.artifacts import atomic_directory, atomic_outputs

    hidden = json.loads((tiny / "config.json").read_text())["hidden_size"]
    adapter = write_ster_adapter(tmp_path / "a.lora.json", str(tiny), hidden, 0, hidden)
    shutil.copy(captures / "v.json", tmp_path / "old.json")
    links = {}
    for name in ("c.safetensors", "c.json", "v.json", "v.gguf", "m.gguf", "merged", "merged.gguf", "chat.json"):
        links[name] = tmp_path / ("link-" + name)
        os.symlink(tmp_path / "nowhere" / name, links[name])     # dangling
    live = tmp_path / "live.json"
    os.symlink(tmp_path / "old.json", live)                      # to an earlier vector
    before = {p.relative_to(tmp_path) for p in tmp_path.rglob("*")}
    for make in (lambda: atomic_outputs(links["v.json"]), lambda: atomic_directory(links["merged"])):
        with pytest.raises(SterError, match="is a symbolic link, a dangling one"):
            with make():
                pass
    pair = ("--positive", captures / "pos.safetensors", "--negative", captures / "neg.safetensors")
    for args, link in ((("capture", "-m", tiny, "-p", "w5", "-o"), links["c.safetensors"]),
                       (("vector", "caa", *pair, "-o"), links["v.json"]),
                       (("vector", "caa", *pair, "-o"), live),
                       (("vector", "pca", *pair, "-o"), links["v.json"]),
                       (("vector", "export", captures / "v.json", "-o"), links["v.gguf"]),
                       (("convert", tiny, "-o"), links["m.gguf"]),
                       (("tune", "merge", "--adapter", adapter, "-m", tiny, "-o"), links["merged"]),
                       (("tune", "merge", "--adapter", adapter, "-m", tiny, "-o"), links["merged.gguf"])):
        r = cli(*args, link)
        assert isinstance(r.exception, SterError), (args, r.exception, r.output)
        assert f"cannot write {link}: it is a symbolic link" in str(r.exception), (args, r.exception)
    # the capture's sidecar name is checked too
    side_link = tmp_path / "side.json"
    os.symlink(tmp_path / "nowhere" / "side.json", side_link)
    r = cli("capture", "-m", tiny, "-p", "w5", "-o", tmp_path / "side.safetensors")
    assert isinstance(r.exception, SterError) and f"cannot write {side_link}: it is a symbolic link" in \
        str(r.exception), r.exception
    os.unlink(side_link)
    r = cli("chat", "-m", tiny_chat_dir(tiny, tmp_path / "chatdir"), "-q", input=f"/save {links['chat.json']}\n")
    assert r.exit_code == 1 and "/save" in r.stderr and str(links["chat.json"]) in r.stderr, r.stderr
    for link in [*links.values(), live]:
        assert link.is_symlink()
    assert not (tmp_path / "nowhere").exists() and (tmp_path / "old.json").read_bytes() == \
        (captures / "v.json").read_bytes()
    _no_new_files(tmp_path, before | {p.relative_to(tmp_path) for p in (tmp_path / "chatdir").rglob("*")}
                  | {Path("chatdir")})


def test_serve_prints_one_start_line(tiny):
    """``ster serve`` says it started in one line on stdout, the address as its third word (was two lines:
    one on stderr, one on stdout); -q keeps the address alone."""
    import signal
    import subprocess
    import sys

    for quiet in ((), ("-q",)):
        proc = subprocess.Popen([sys.executable, "-c", "from ster_py.cli import main; main()", "serve", "-m",
                                 str(tiny), "--port", "0", "--name", "tiny", *quiet],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=sigint_as_at_a_terminal)
        try:
            line = proc.stdout.readline()
            assert line.startswith("listening on http://127.0.0.1:"), (line, proc.stderr.read())
            url = line.split()[2]
            from urllib.request import urlopen

            assert json.loads(urlopen(url + "/v1/models", timeout=30).read())["data"][0]["id"] == "tiny"
        finally:
            proc.send_signal(signal.SIGINT)
            rest, stderr = proc.communicate(timeout=30)
        assert rest == "" and "http://" not in stderr, (rest, stderr)
        assert (line.strip() == f"listening on {url}") == bool(quiet), line
        if not quiet:
            assert line.rstrip("\n").endswith(" (OpenAI API at /v1; Ctrl-C stops)") and len(line) < 80, line


def test_the_front_doors_functions_document_every_argument():
    """The front door's functions (``help(ster_py)``, README "As a library") name each of their arguments in
    their docstrings: capture's ``system`` (a system prompt, refused without a template) was missing, and so were
    Session.render's tools, thinking and add_generation_prompt, Session.prompt's tools and thinking, and
    Session.prepare's layer_hook, key and thinking."""
    import inspect
    import re

    import ster_py
    from ster_py.capture import capture
    from ster_py.generate import generate

    funcs = [capture, generate] + [f for f in (getattr(ster_py, n) for n in ster_py._LAZY) if inspect.isfunction(f)]
    funcs += [ster_py.Session, ster_py.Session.render, ster_py.Session.prompt, ster_py.Session.prepare,
              ster_py.Session.reply]
    assert len(funcs) >= 17
    missing = {f.__qualname__: [p for p in inspect.signature(f).parameters
                                if p != "self" and not re.search(rf"\b{p}\b", inspect.getdoc(f) or "")] for f in funcs}
    assert not {name: args for name, args in missing.items() if args}


def test_documented_argument_names_are_the_functions_own():
    """README "As a library" and ``help(ster_py)`` wrote ``merge_adapter(base, adapter_path, output)`` and explained
    ``base`` and ``adapter_path`` by name, but the function's parameters are ``model`` and ``adapter``: a caller who
    took the documented names, ``merge_adapter(base=..., adapter_path=...)``, got a TypeError. README's
    ``use_chat_template(text, name)`` likewise: its second argument is ``source``, the name errors give the
    template (a file's path), not a template name such as "default"."""
    import inspect

    import ster_py
    from ster_py.tokenizer import Tokenizer

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for func, texts in ((ster_py.merge_adapter, {"README.md": readme, "help(ster_py)": ster_py.__doc__}),
                        (Tokenizer.use_chat_template, {"README.md": readme})):
        real = [p for p in inspect.signature(func).parameters if p != "self"]
        for where, text in texts.items():
            shown = re.findall(rf"{func.__name__}\(([^)]*)\)", text)
            assert shown and all([a.strip() for a in args.split(",")] == real[:len(args.split(","))]
                                 for args in shown), (where, shown, real)


def test_the_readmes_prepare_call_runs_after_the_example():
    """README "As a library" wrote ``chat.prepare(messages + [reply_message])``, a name the example never defines
    (a new user could not tell what goes there: ``reply`` has no message attribute). The call as printed now runs
    with the example's own names and gives prepare the conversation with the answer appended, as ster chat does."""
    from types import SimpleNamespace

    from ster_py.chat import check_messages

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    call = re.search(r"`(chat\.prepare\(.*?\))`", readme, re.S).group(1)
    given = []
    chat = SimpleNamespace(prepare=lambda history: given.append(check_messages(history, "messages")))
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    eval(call, {"chat": chat, "messages": messages, "reply": SimpleNamespace(text="The capital of France is Paris.")})
    assert given == [messages + [{"role": "assistant", "content": "The capital of France is Paris."}]]


def test_the_readmes_gguf_architecture_column_is_the_families():
    """README "What runs" gave "-" (no GGUF) in its GGUF architecture column for sixteen families ster reads from
    llama.cpp's files and `ster families` lists with their architecture (gpt_oss's gpt-oss, dbrx, granitemoe,
    gemma4, ...; tests/test_parity_moe.py runs their GGUFs), while the README's own convert paragraph says it writes
    gpt-oss, granitemoe and dbrx. Every family's architecture is now in its row (a family on several rows, as
    bailing_hybrid's Ling 3.0 and 2.5, in one of them), and a row naming one has a family that has one."""
    from ster_py.families import FAMILIES

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## What runs")[1].split("## Command reference")[0]
    named: dict[str, set] = {}
    rows = 0
    for line in section.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) < 3 or cells[0].startswith("family") or set(cells[0]) <= set("-"):
            continue
        types = [t for t in re.split(r"[,\s]+", re.sub(r"\(.*?\)", "", cells[0])) if t in FAMILIES]
        archs = {a.strip() for a in re.sub(r"\(.*?\)", "", cells[1]).split(",")} - {"-", ""}
        assert not archs or any(FAMILIES[t].gguf_arch for t in types), line[:100]
        for t in types:   # (gemma4_assistant, a drafter, is no family)
            named.setdefault(t, set()).update(archs)
        rows += 1
    assert rows > 100 and len(named) > 100
    wrong = {t: (sorted(archs), FAMILIES[t].gguf_arch) for t, archs in named.items()
             if FAMILIES[t].gguf_arch and FAMILIES[t].gguf_arch not in archs}
    assert not wrong


def test_every_ster_variable_the_package_reads_is_in_the_readme():
    """STER_PRESET_CACHE (named by the error for a preset cache that cannot be used: "set STER_PRESET_CACHE to
    another folder") and STER_WHEELHOUSE (a folder of the preset wheels, for an offline fetch) were read but in no
    README line, so a new user told to set one could not find what it does."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    package = Path(__file__).resolve().parents[1] / "ster_py"
    read = {name for f in package.rglob("*.py") for name in re.findall(r"\bSTER_[A-Z0-9_]*[A-Z0-9]\b", f.read_text())}
    internal = {"STER_CHAT_ISOLATE",   # the template sandbox's off switch, for ster's own tests
                "STER_CHAT_NOW",       # the clock `ster template render --now` pins; its --help names it
                "STER_POOL_BLAS"}      # a measuring switch runbook/performance.md describes
    assert {"STER_PRESET_CACHE", "STER_WHEELHOUSE", "STER_THREADS"} <= read
    assert sorted(n for n in read - internal if n not in readme) == []


def test_the_serve_examples_count_of_commands_is_the_caa_examples():
    """README's serve example said `ster vector caa` below "makes it [calm.json] in four commands"; the example
    takes five (two printf, two captures, the caa itself)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    words = {"three": 3, "four": 4, "five": 5, "six": 6}
    said = re.search(r"`ster vector caa` below makes it in (\w+) commands", readme).group(1)
    example = readme.split("### `ster vector caa`")[1].split("### ")[0]
    lines = [line.strip() for line in example.splitlines() if line.strip().startswith("$ ")]
    upto = next(i for i, line in enumerate(lines) if line.startswith("$ ster vector caa")) + 1
    assert words[said] == upto, (said, lines[:upto])


def test_the_serve_example_says_how_to_get_its_client():
    """README's serve example runs `python -c 'import openai; ...'`, a package `pip install .` does not install
    (only the test extra has it): a new user following it got ModuleNotFoundError. The README says to install it,
    and the package is indeed not among ster's own requirements."""
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    serve = readme.split("### `ster serve`")[1].split("### ")[0]
    assert "import openai" in serve and "`pip install openai`" in serve
    deps = re.search(r"^dependencies = \[(.*?)\]", (root / "pyproject.toml").read_text(), re.S | re.M).group(1)
    assert "openai" not in deps


def test_dir_of_the_package_lists_each_front_door_name_once():
    """``dir(ster_py)`` listed ``Sampling``, ``Session`` and ``load_model`` twice once they were used: a lazy
    name, once imported, is a module global as well as a ``_LAZY`` key. Each name is listed once, used or not."""
    import ster_py

    for _ in range(2):
        names = dir(ster_py)
        assert len(names) == len(set(names)) and set(ster_py._LAZY) <= set(names), names
        from ster_py import Sampling, Session, load_model  # noqa: F401  (binds them as globals)


@pytest.mark.real
def test_the_readmes_library_example_runs_as_printed(smollm2_gguf):
    """README.md's "As a library" example, run as printed (the preset's file in place of its name): the
    front door's names import, the answer is the one its comment shows, and the steered generation runs.
    Also: ``import ster_py`` alone imports none of the modules behind those names (the CLI's start stays light)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## As a library", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert 'load_model("smollm2-135m-instruct-q4_1")' in code
    code = code.replace('"smollm2-135m-instruct-q4_1"', repr(str(smollm2_gguf)))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0] == "The capital of France is Paris." and len(lines) >= 2 and lines[1].strip(), r.stdout
    light = subprocess.run([sys.executable, "-c", "import sys, ster_py; print(sorted(m for m in sys.modules "
                            "if m.startswith('ster_py.') and m != 'ster_py.errors'))"],
                           capture_output=True, text=True, timeout=120)
    assert light.stdout.strip() == "[]", light.stdout
