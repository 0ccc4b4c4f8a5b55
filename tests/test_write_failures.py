"""A failing disk and SIGTERM while an output is written: one "error:" line (or exit 143), nothing left behind.

The disk is made to fail without root: a child process runs under a file size limit (``RLIMIT_FSIZE``;
Python ignores SIGXFSZ, so a write past the limit fails with EFBIG as a full disk fails with ENOSPC,
through the same code paths), or an ``OSError`` is raised where the kernel would raise it.
"""
from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ster_py.artifacts import atomic_directory, atomic_outputs, write_safetensors
from ster_py.errors import SterError
from ster_py.files import write_error
from ster_py.steering import SteeringVector, export_control_vector, write_vector
from tiny import make_checkpoint

ENTRY = [sys.executable, "-c", "from ster_py.entry import main; main()"]
NO_SPACE = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _limited(limit: int, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``ster ARGS`` in a child whose files may not grow past ``limit`` bytes."""
    def cap():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    return subprocess.run([*ENTRY, *args], capture_output=True, text=True, timeout=timeout, preexec_fn=cap,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))


def _one_error_line(r: subprocess.CompletedProcess, target: Path) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot write {target}"), r.stderr
    assert "File too large" in lines[0] and lines[0].endswith("nothing was written"), r.stderr
    return lines[0]


def test_write_error_says_what_and_what_to_do():
    assert str(write_error("o/v.gguf", NO_SPACE)) == (
        "cannot write o/v.gguf: No space left on device; free space or choose another place; nothing was written")
    # a copy into the temporary (shutil: filename = source, filename2 = destination) is about the output
    copy = OSError(errno.ENOSPC, "No space left on device", "/models/tokenizer.json", None, "o/.m.x.tmp/tokenizer.json")
    assert "/models" not in str(write_error("o/m", copy, [Path("o/.m.x.tmp")]))
    # an error about another file only (a weight being read) names it
    read = OSError(errno.EIO, os.strerror(errno.EIO), "/models/model.safetensors")
    assert str(write_error("o/m", read, [Path("o/.m.x.tmp")])).startswith(
        "cannot write o/m: Input/output error (/models/model.safetensors); the disk or file system failed")


def test_atomic_outputs_turn_a_full_disk_into_one_error(tmp_path):
    """capture's safetensors and sidecar, a steering vector's JSON: an OSError of the writing body is one
    "cannot write" SterError naming the outputs, and no temporary is left."""
    a, b = tmp_path / "c.safetensors", tmp_path / "c.json"
    with pytest.raises(SterError) as info:
        with atomic_outputs(a, b) as (ta, tb):
            ta.write_bytes(b"partial")
            raise NO_SPACE
    assert str(info.value) == (f"cannot write {a} and {b}: No space left on device; free space or choose another "
                               "place; nothing was written")
    assert list(tmp_path.iterdir()) == []


def test_atomic_directory_turns_a_full_disk_into_one_error(tmp_path):
    """tune merge: copying tokenizer.json into the temporary directory fails as shutil words it."""
    target = tmp_path / "merged"
    with pytest.raises(SterError) as info:
        with atomic_directory(target) as tmp:
            (tmp / "model.safetensors").write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device", "/models/tokenizer.json", None,
                          str(tmp / "tokenizer.json"))
    assert str(info.value) == (f"cannot write {target}: No space left on device; free space or choose another "
                               "place; nothing was written")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_flush_to_disk_publishes_nothing(tmp_path, monkeypatch):
    """A write the kernel accepted can fail on its way to the disk; fsync says so before the rename."""
    def broken(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", broken)
    vec = SteeringVector("m", None, 4, "t", "caa", {0: np.ones(4, np.float32) / 2})
    with pytest.raises(SterError, match=r"^cannot write .*v\.json: Input/output error; the disk"):
        write_vector(vec, tmp_path / "v.json")
    with pytest.raises(SterError, match=r"^cannot write .*merged: Input/output error"):
        with atomic_directory(tmp_path / "merged") as tmp:
            (tmp / "config.json").write_text("{}")
    assert list(tmp_path.iterdir()) == []


def test_write_safetensors_raises_on_a_short_write(tmp_path, monkeypatch):
    """Every tensor goes through the file object's write (ndarray.tofile lost a failed flush of a small array)."""
    written = []

    class Short:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def write(self, data):
            written.append(bytes(data))
            if len(written) == 2:
                raise NO_SPACE
            return len(data)

    monkeypatch.setattr("builtins.open", Short)
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(4, np.float32)]
    with pytest.raises(OSError, match="No space"):
        write_safetensors(tmp_path / "x.safetensors", [("a", np.dtype(np.float32), (2, 3)),
                                                       ("b", np.dtype(np.float32), (4,))], arrays)
    assert written[1] == arrays[0].tobytes()


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tiny llama, a PEFT adapter for it, two captures and a steering vector (its JSON and its GGUF size)."""
    from test_adapters import peft_case

    root = tmp_path_factory.mktemp("writes")
    base, adapter, *_ = peft_case(root / "case")
    for side, prompts in (("pos", ["w5 w6 w7", "w8 w9"]), ("neg", ["w10 w11", "w12 w13 w14"])):
        r = subprocess.run([*ENTRY, "capture", "-m", str(base), *[a for p in prompts for a in ("-p", p)],
                            "--chat-template", "off", "-o", str(root / f"{side}.safetensors"), "-q"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
    rng = np.random.default_rng(0)
    unit = [v / np.linalg.norm(v) for v in rng.standard_normal((3, 64))]
    vec = SteeringVector(str(base), None, 64, "t", "caa", {i: v.astype(np.float32) for i, v in enumerate(unit)})
    vector = write_vector(vec, root / "v.json")
    export_control_vector(vec, root / "v.gguf")
    # a base that converts to GGUF (byte-level BPE): a merge into .gguf refuses the word-level one before it writes
    from export_helpers import write_bpe_tokenizer

    bpe_base, bpe_adapter, *_ = peft_case(root / "bpe", vocab_size=320)
    write_bpe_tokenizer(bpe_base, 320)
    return {"base": base, "adapter": adapter, "root": root, "vector": vector,
            "gguf_size": (root / "v.gguf").stat().st_size, "bpe_base": bpe_base, "bpe_adapter": bpe_adapter}


def test_vector_export_on_a_full_disk_fails_and_leaves_nothing(made, tmp_path):
    """F1: the control vector's tensors are small; ndarray.tofile dropped their failed write and the command
    exited 0 with a truncated GGUF. Each limit falls inside a tensor, past the header."""
    out = tmp_path / "v.gguf"
    size = made["gguf_size"]
    for limit in (size // 2, size - 100):
        _one_error_line(_limited(limit, "vector", "export", str(made["vector"]), "-o", str(out)), out)
        assert list(tmp_path.iterdir()) == [], limit


@pytest.mark.parametrize("command", ["capture", "vector caa", "tune merge", "tune merge gguf"])
def test_a_full_disk_is_one_error_line_for_every_writer(made, tmp_path, command):
    """F11: capture, vector caa and tune merge printed a traceback (convert, already through write_gguf, did not);
    now each says "error: cannot write OUTPUT: ..." and leaves nothing. A merge into a .gguf names that file,
    not the temporary merged checkpoint on its way."""
    base, root = str(made["base"]), made["root"]
    out = tmp_path / {"capture": "c.safetensors", "vector caa": "v.json", "tune merge": "m",
                      "tune merge gguf": "m.gguf"}[command]
    merge = ["tune", "merge", "-m", base, "-a", str(made["adapter"]), "-o", str(out)]
    args = {"capture": ["capture", "-m", base, "-p", "w5 w6", "-o", str(out)],
            "vector caa": ["vector", "caa", "--positive", str(root / "pos.safetensors"),
                           "--negative", str(root / "neg.safetensors"), "-o", str(out)],
            "tune merge": merge,
            "tune merge gguf": ["tune", "merge", "-m", str(made["bpe_base"]), "-a", str(made["bpe_adapter"]),
                                "-o", str(out)]}[command]
    line = _one_error_line(_limited(256, *args, "-q"), out)
    if command == "capture":
        assert line.startswith(f"error: cannot write {out} and {out.with_suffix('.json')}: ")
    else:
        assert line.startswith(f"error: cannot write {out}: "), line
    assert list(tmp_path.iterdir()) == []


SLOW_WRITER = """
import sys, time
from pathlib import Path
import ster_py.cli
from ster_py.artifacts import atomic_outputs

def writer():
    with atomic_outputs(Path(sys.argv[1])) as (tmp,):
        tmp.write_bytes(b"x" * 4096)
        print("writing", flush=True)
        time.sleep(120)

ster_py.cli.main = writer  # what ster_py.entry.main runs
from ster_py.entry import main
main()
"""


def test_sigterm_unwinds_like_ctrl_c_and_removes_the_temporary(tmp_path):
    """F10: SIGTERM killed the process with its temporary file left beside the output; now the temporaries are
    removed, "terminated" is said and the status is 143 (128 + 15)."""
    out = tmp_path / "i.gguf"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "writing\n", proc.stderr.read()
        assert len(list(tmp_path.iterdir())) == 1  # the temporary
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 143 and err == "terminated\n", (proc.returncode, err)
    assert list(tmp_path.iterdir()) == []


def test_a_repeated_sigterm_does_not_cut_the_cleanup_short():
    from ster_py.entry import _Terminated

    handler = _Terminated()
    with pytest.raises(SystemExit) as info:
        handler(signal.SIGTERM, None)
    assert info.value.code == 143
    assert handler(signal.SIGTERM, None) is None


def test_serve_stops_promptly_on_sigterm(tmp_path):
    """uvicorn handles SIGTERM while it serves (graceful shutdown), then raises it again: the entry point's
    handler makes that exit 143 instead of a death by signal."""
    model = tmp_path / "model"
    make_checkpoint(model, "llama")
    proc = subprocess.Popen([*ENTRY, "serve", "-m", str(model), "--port", "0", "-q"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on "), (line, proc.stderr.read() if proc.poll() is not None else "")
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 143 and time.monotonic() - start < 10, (proc.returncode, err)
    assert "Traceback" not in err


@pytest.mark.parametrize("maker", ["mkdtemp", "mkstemp"])
def test_ctrl_c_right_after_a_temporary_is_made_leaves_nothing(tmp_path, monkeypatch, maker):
    """A tester's interrupted `tune merge` once left an empty .NAME.xxxx.tmp folder: the Ctrl-C landed between
    making the temporary and the code that removes it. Here SIGINT arrives the moment it exists."""
    import tempfile

    real = getattr(tempfile, maker)

    def make_then_interrupt(*args, **kwargs):
        made = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)   # the signal has arrived (held, or acted on at the next instruction)
        return made

    monkeypatch.setattr(tempfile, maker, make_then_interrupt)
    # Ctrl-C's own handler, whatever this run inherited (a suite started in the background ignores SIGINT)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            if maker == "mkdtemp":
                with atomic_directory(tmp_path / "out") as d:
                    (d / "f").write_text("x")
            else:
                with atomic_outputs(tmp_path / "out.json") as (tmp,):
                    tmp.write_text("x")
    finally:
        signal.signal(signal.SIGINT, before)
    assert list(tmp_path.iterdir()) == []


# --- standard output that cannot be written ------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat_tiny(tmp_path_factory):
    """A tiny llama with a chat template (``test_chat_cmd.chat_model``)."""
    from test_chat_cmd import chat_model

    return chat_model(tmp_path_factory.mktemp("stdout") / "m")


def _stdout_run(args, stdout, stdin_text="", preexec_fn=None) -> subprocess.CompletedProcess:
    return subprocess.run([*ENTRY, *args], input=stdin_text, stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=300, preexec_fn=preexec_fn, env=dict(os.environ, HF_HUB_OFFLINE="1"))


STDOUT_CASES = {"generate": (["generate", "-p", "w5 w6", "--max-new-tokens", "3", "-q"], ""),
                "generate --json": (["generate", "-p", "w5 w6", "--max-new-tokens", "3", "-q", "--json"], ""),
                "chat": (["chat", "--max-new-tokens", "3", "-q"], "w7 w8\n"),
                "tokenize": (["tokenize", "-t", "w5 w6"], "")}


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("command", list(STDOUT_CASES))
def test_a_full_stdout_is_one_error_line(chat_tiny, command):
    """A tester's `ster chat -q > /dev/full` and `ster generate > /dev/full` ended in an OSError traceback (from
    input's prompt, cli._write, print); now every write to stdout fails as one error line with status 1."""
    args, stdin_text = STDOUT_CASES[command]
    with open("/dev/full", "w") as full:
        r = _stdout_run([*args, "-m", str(chat_tiny)], full, stdin_text)
    assert (r.returncode, r.stderr) == (1, "error: cannot write to standard output: No space left on device\n")


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_a_closed_stdout_is_one_error_line(chat_tiny, command):
    """`ster generate ... >&-` ended in "AttributeError: 'NoneType' object has no attribute 'isatty'" (Python
    leaves sys.stdout None); now the first write says stdout is closed."""
    args, stdin_text = STDOUT_CASES[command]
    r = _stdout_run([*args, "-m", str(chat_tiny)], None, stdin_text, preexec_fn=lambda: os.close(1))
    assert r.returncode == 1 and r.stderr.startswith("error: cannot write to standard output: it is closed; "), \
        r.stderr
    assert len(r.stderr.splitlines()) == 1


def test_a_reader_gone_stays_quiet(chat_tiny):
    """`ster generate ... | head -c 1`: no error and status 0, as before the guard on stdout."""
    proc = subprocess.Popen([*ENTRY, "generate", "-m", str(chat_tiny), "-p", "w5", "--max-new-tokens", "40", "-q",
                             "--temperature", "1", "--seed", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert len(proc.stdout.read(1)) == 1
        proc.stdout.close()
        err = proc.stderr.read()
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert (proc.returncode, err) == (0, b"")
