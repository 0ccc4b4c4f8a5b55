"""llama.cpp (llama-cpp-python) as an oracle, run in a child process.

Why a child process: llama.cpp is native code chosen and compiled for the CPU it was
built on, and some builds die on some CPUs. llama-cpp-python 0.3.36 compiled with its
default ``-march=native`` on a virtual machine that advertises AMX segfaults inside
``ggml_backend_amx_mul_mat`` on its first product; a crash in-process would take
``ster parity`` (or the whole test session) with it, printing no ``error:`` line. Here a
crash ends only the child, and the parent turns it into a ``SterError`` that names the
signal and the fix.

The child also loads the model with llama.cpp's extra buffer types off
(``llama_model_params.use_extra_bufts = false``). Those are the weight repackings
(AMX tiles, the CPU "repack" layouts) llama.cpp picks for the host CPU; without them
llama.cpp multiplies with its ordinary CPU kernels, which is the path every build and
every CPU has in common, and the logits compared against are the same ones whatever
the host.

Protocol: ``python -m ster_py.llamacpp REQUEST.json``; the request names the job
(``logits`` or ``quantize``) and a result path; the child writes the result there (an
``.npz`` of logits, or the quantized file) and exits 0. Its stderr (llama.cpp's log) is
kept and its last lines are quoted when it fails.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import SterError

#: Seconds a child may run before it is stopped (tiny and 135M-parameter models take seconds).
DEFAULT_TIMEOUT = 600.0

#: llama.cpp's ``llama_ftype`` numbers for the quantizations the tests ask for (llama.h).
FTYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10,
          "Q3_K_M": 12, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30,
          "BF16": 32, "MXFP4_MOE": 38}

#: CMake arguments for a build of llama-cpp-python that runs on any x86-64 CPU with AVX2
#: (no ``-march=native``, no AMX, no AVX-512): the README's test command uses them.
PORTABLE_CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"

_INSTALL_HINT = ('install it with: pip install "ster-py[test]" or pip install llama-cpp-python==0.3.36 (it '
                 'compiles llama.cpp from source, so "ster-py[reference]" leaves it out)')


def _missing() -> SterError:
    return SterError(f"`ster parity --reference llama.cpp` needs llama-cpp-python, which is not installed; "
                     f"{_INSTALL_HINT}")


def available() -> bool:
    """Whether llama-cpp-python is installed (looked up, not imported: the child imports it)."""
    import importlib.util

    if "llama_cpp" in sys.modules:  # None there means "not importable" (tests set it so)
        return sys.modules["llama_cpp"] is not None
    return importlib.util.find_spec("llama_cpp") is not None


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _run(request: dict, what: str, timeout: float) -> None:
    """Run the child on ``request``; SterError naming what failed and how to fix it."""
    with tempfile.TemporaryDirectory(prefix="ster-llamacpp-") as tmp:
        req = Path(tmp) / "request.json"
        req.write_text(json.dumps(request))
        try:
            proc = subprocess.run(_command(req), capture_output=True, text=True, timeout=timeout,
                                  env={**os.environ, "PYTHONFAULTHANDLER": ""})
        except subprocess.TimeoutExpired:
            raise SterError(f"llama.cpp did not finish {what} within {timeout:.0f} s; it was stopped") from None
    if proc.returncode == 0:
        return
    tail = "\n".join(line for line in proc.stderr.strip().splitlines()[-6:] if line.strip())
    if proc.returncode < 0:
        raise SterError(
            f"llama.cpp crashed ({_signal_name(proc.returncode)}) while {what}; ster itself is unaffected. "
            "A llama-cpp-python compiled for this CPU can die on instructions the CPU advertises but the machine "
            "does not allow (AMX on some virtual machines); reinstall it for a portable target: "
            f'CMAKE_ARGS="{PORTABLE_CMAKE_ARGS}" pip install --force-reinstall --no-cache-dir --no-deps '
            f"llama-cpp-python==0.3.36" + (f"\nllama.cpp's last words:\n{tail}" if tail else ""))
    if proc.returncode == 3:  # the child's own, worded error (see _child)
        raise SterError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"llama.cpp failed {what}")
    if proc.returncode == 4:
        raise _missing()
    raise SterError(f"llama.cpp failed while {what} (exit status {proc.returncode})"
                    + (f":\n{tail}" if tail else ""))


def _command(request: Path) -> list[str]:
    """The child's command line (a function so tests can stand a crashing child in for it)."""
    return [sys.executable, "-m", "ster_py.llamacpp", str(request)]


def logits(gguf_file: str | os.PathLike, prompts: Sequence[Sequence[int]], *, threads: int | None = None,
           timeout: float = DEFAULT_TIMEOUT) -> list[np.ndarray]:
    """llama.cpp's logits for each prompt, every position: float32 [len(ids), n_vocab] each.

    Each prompt is decoded from an empty cache as one batch (positions 0..T-1, one
    sequence), all positions' logits kept, on llama.cpp's plain CPU kernels
    (``use_extra_bufts`` off) with an F32 key/value cache (llama.cpp's default is F16;
    ster's is F32), in a child process.

    Args:
        gguf_file: the model.
        prompts: token ids per prompt (each non-empty).
        threads: llama.cpp's threads (default: its own default).
        timeout: seconds before the child is stopped.

    Raises:
        SterError: llama-cpp-python is missing; llama.cpp cannot load the file, fails to
            decode, crashes (names the signal and the portable reinstall) or times out.
    """
    if not available():
        raise _missing()
    prompts = [[int(t) for t in p] for p in prompts]
    if not prompts or any(not p for p in prompts):
        raise SterError("llama.cpp needs at least one token per prompt")
    with tempfile.TemporaryDirectory(prefix="ster-llamacpp-out-") as tmp:
        out = Path(tmp) / "logits.npz"
        _run({"job": "logits", "model": str(Path(gguf_file).resolve()), "prompts": prompts, "threads": threads,
              "out": str(out)}, f"evaluating {gguf_file}", timeout)
        with np.load(out) as z:
            return [z[f"p{i}"] for i in range(len(prompts))]


def quantize(src: str | os.PathLike, dst: str | os.PathLike, ftype: str, *, threads: int | None = None,
             timeout: float = DEFAULT_TIMEOUT) -> Path:
    """Quantize the GGUF ``src`` into ``dst`` with llama.cpp's own quantizer (``llama_model_quantize``).

    Args:
        ftype: one of ``FTYPES`` (llama.cpp's mixes: ``Q4_K_M`` keeps some tensors at Q6_K, ...).

    Raises:
        SterError: llama-cpp-python missing, an unknown ``ftype``, or llama.cpp refusing or crashing.
    """
    if ftype not in FTYPES:
        raise SterError(f"unknown llama.cpp file type {ftype!r}; one of {', '.join(FTYPES)}")
    if not available():
        raise _missing()
    dst = Path(dst)
    _run({"job": "quantize", "model": str(Path(src).resolve()), "ftype": FTYPES[ftype], "threads": threads,
          "out": str(dst.resolve())}, f"quantizing {src} to {ftype}", timeout)
    return dst


# ----------------------------------------------------------------------------- the child


def _fail(message: str) -> None:
    print(message, file=sys.stderr)
    sys.exit(3)


def _child_logits(L, req: dict) -> None:
    params = L.llama_model_default_params()
    params.n_gpu_layers = 0
    params.use_extra_bufts = False  # plain CPU kernels: no AMX tiles, no repacked layouts
    model = L.llama_model_load_from_file(req["model"].encode(), params)
    if not model:
        _fail(f"llama.cpp could not load {req['model']} (see its log above)")
    longest = max(len(p) for p in req["prompts"])
    cparams = L.llama_context_default_params()
    cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = max(longest, 8)
    cparams.type_k = cparams.type_v = 0  # GGML_TYPE_F32: keys and values as computed, like ster's default cache
    if req.get("threads"):
        cparams.n_threads = cparams.n_threads_batch = int(req["threads"])
    ctx = L.llama_init_from_model(model, cparams)
    if not ctx:
        _fail(f"llama.cpp could not make a context for {req['model']}")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    batch = L.llama_batch_init(longest, 0, 1)
    out = {}
    for n, ids in enumerate(req["prompts"]):
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        batch.n_tokens = len(ids)
        for i, t in enumerate(ids):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, i, 1, 1
            batch.seq_id[i][0] = 0
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            _fail(f"llama.cpp's llama_decode returned {rc} on prompt {n} of {req['model']}")
        rows = np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(len(ids) * n_vocab,))
        out[f"p{n}"] = rows.reshape(len(ids), n_vocab).astype(np.float32, copy=True)
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    np.savez(req["out"], **out)


def _child_quantize(L, req: dict) -> None:
    params = L.llama_model_quantize_default_params()
    params.ftype = int(req["ftype"])
    if req.get("threads"):
        params.nthread = int(req["threads"])
    rc = L.llama_model_quantize(req["model"].encode(), req["out"].encode(), params)
    if rc != 0:
        _fail(f"llama.cpp's quantizer returned {rc} for {req['model']}")


def _child(request_path: str) -> None:
    req = json.loads(Path(request_path).read_text())
    try:
        import llama_cpp as L
    except ImportError:
        sys.exit(4)
    L.llama_backend_init()
    {"logits": _child_logits, "quantize": _child_quantize}[req["job"]](L, req)


if __name__ == "__main__":
    _child(sys.argv[1])
