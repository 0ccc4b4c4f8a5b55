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
(``logits``, ``logits_of_files``, ``quantize``, ``greedy``, ``tokenize``, ``pieces`` or ``perplexity``) and a result path; the
child writes the result there (an ``.npz`` of arrays, or the quantized file) and exits 0. Its stderr (llama.cpp's log) is
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
          "Q3_K_M": 12, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18, "IQ4_NL": 25,
          "IQ4_XS": 30, "BF16": 32, "MXFP4_MOE": 38}

#: CMake arguments for a build of llama-cpp-python that runs on any x86-64 CPU with AVX2
#: (no ``-march=native``, no AMX, no AVX-512): the README's test command uses them.
PORTABLE_CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"

_INSTALL_HINT = (f'install it with: CMAKE_ARGS="{PORTABLE_CMAKE_ARGS}" pip install llama-cpp-python==0.3.36 '
                 '(a portable build: a native one can crash on virtual machines that advertise AMX), or the '
                 'same CMAKE_ARGS with pip install ".[test]" from a checkout of ster-py (it compiles llama.cpp '
                 'from source, so the "reference" extra leaves it out)')


def _missing() -> SterError:
    return SterError(f"`ster parity --reference llama.cpp` needs llama-cpp-python, which is missing; "
                     f"{_INSTALL_HINT}")


def available() -> bool:
    """Whether llama-cpp-python is installed (looked up, not imported: the child imports it)."""
    import importlib.util

    if "llama_cpp" in sys.modules:  # None there means "not importable" (tests set it so)
        return sys.modules["llama_cpp"] is not None
    return importlib.util.find_spec("llama_cpp") is not None


def require() -> None:
    """Raise SterError (naming the portable install) unless llama-cpp-python is installed."""
    if not available():
        raise _missing()


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
    if proc.returncode == 5:
        reason = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "no reason given"
        raise SterError(f"llama-cpp-python is installed but does not import ({reason}); reinstall it: "
                        f'CMAKE_ARGS="{PORTABLE_CMAKE_ARGS}" pip install --force-reinstall --no-cache-dir --no-deps '
                        "llama-cpp-python==0.3.36")
    raise SterError(f"llama.cpp failed while {what} (exit status {proc.returncode})"
                    + (f":\n{tail}" if tail else ""))


def _command(request: Path) -> list[str]:
    """The child's command line (a function so tests can stand a crashing child in for it)."""
    return [sys.executable, "-m", "ster_py.llamacpp", str(request)]


def logits(gguf_file: str | os.PathLike, prompts: Sequence[Sequence[int]], *, threads: int | None = None,
           timeout: float = DEFAULT_TIMEOUT, flash_attn: bool | None = None) -> list[np.ndarray]:
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
        flash_attn: llama.cpp's flash attention on (True) or off (False); None: its default
            (auto, on for the CPU), whose kernel rounds the attention's operands to F16.

    Raises:
        SterError: llama-cpp-python is missing; llama.cpp cannot load the file, fails to
            decode, crashes (names the signal and the portable reinstall) or times out.
    """
    require()
    prompts = [[int(t) for t in p] for p in prompts]
    if not prompts or any(not p for p in prompts):
        raise SterError("llama.cpp needs at least one token per prompt")
    with tempfile.TemporaryDirectory(prefix="ster-llamacpp-out-") as tmp:
        out = Path(tmp) / "logits.npz"
        _run({"job": "logits", "model": str(Path(gguf_file).resolve()), "prompts": prompts, "threads": threads,
              "flash_attn": flash_attn, "out": str(out)}, f"evaluating {gguf_file}", timeout)
        with np.load(out) as z:
            return [z[f"p{i}"] for i in range(len(prompts))]


def logits_of_files(gguf_files: Sequence[str | os.PathLike], prompt: Sequence[int], *, threads: int | None = None,
                    timeout: float = DEFAULT_TIMEOUT) -> list[np.ndarray | None]:
    """llama.cpp's logits for one prompt on each of several files, every position: float32 [len(prompt), n_vocab]
    per file, computed as ``logits`` does, all in one child process (one start for many small models). A file
    llama.cpp refuses to load gives None (its loader's reason is in its log).

    Raises:
        SterError: as ``logits`` (a crash, a decode failure).
    """
    require()
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise SterError("llama.cpp needs at least one token per prompt")
    with tempfile.TemporaryDirectory(prefix="ster-llamacpp-out-") as tmp:
        out = Path(tmp) / "logits.npz"
        _run({"job": "logits_of_files", "models": [str(Path(f).resolve()) for f in gguf_files], "prompt": prompt,
              "threads": threads, "out": str(out)}, f"evaluating {len(gguf_files)} files", timeout)
        with np.load(out) as z:
            return [z[f"f{i}"] if f"f{i}" in z else None for i in range(len(gguf_files))]


def quantize(src: str | os.PathLike, dst: str | os.PathLike, ftype: str, *, threads: int | None = None,
             pure: bool = False, timeout: float = DEFAULT_TIMEOUT) -> Path:
    """Quantize the GGUF ``src`` into ``dst`` with llama.cpp's own quantizer (``llama_model_quantize``).

    Args:
        ftype: one of ``FTYPES`` (llama.cpp's mixes: ``Q4_K_M`` keeps some tensors at Q6_K, ...).
        pure: every quantizable tensor in the file type's base type (``llama-quantize --pure``).

    Raises:
        SterError: llama-cpp-python missing, an unknown ``ftype``, or llama.cpp refusing or crashing.
    """
    if ftype not in FTYPES:
        raise SterError(f"unknown llama.cpp file type {ftype!r}; one of {', '.join(FTYPES)}")
    require()
    dst = Path(dst)
    _run({"job": "quantize", "model": str(Path(src).resolve()), "ftype": FTYPES[ftype], "threads": threads,
          "pure": bool(pure), "out": str(dst.resolve())}, f"quantizing {src} to {ftype}", timeout)
    return dst


def greedy(gguf_file: str | os.PathLike, prompt: Sequence[int], n: int, *,
           control_vector: str | os.PathLike | None = None, threads: int | None = None,
           timeout: float = DEFAULT_TIMEOUT) -> list[int]:
    """llama.cpp's greedy continuation: ``n`` tokens, each the argmax of the last position's logits
    (no sampler, no stop token), after the prompt is decoded as one batch; F32 key/value cache and
    plain CPU kernels as in ``logits``.

    Args:
        control_vector: a control-vector GGUF (``direction.{layer}`` tensors, llama.cpp's format):
            read as llama.cpp's ``common_control_vector_load`` reads it (through gguf-py, the
            reference reader) and applied to layers 1 .. n_layer - 1 with ``llama_set_adapter_cvec``
            at scale 1, as ``llama-cli --control-vector FILE`` does.

    Raises:
        SterError: as ``logits``; a control vector llama.cpp's rules refuse.
    """
    require()
    prompt = [int(t) for t in prompt]
    if not prompt or n < 0:
        raise SterError("llama.cpp's greedy decode needs a non-empty prompt and n >= 0")
    with tempfile.TemporaryDirectory(prefix="ster-llamacpp-out-") as tmp:
        out = Path(tmp) / "greedy.npz"
        _run({"job": "greedy", "model": str(Path(gguf_file).resolve()), "prompt": prompt, "n": int(n),
              "control_vector": None if control_vector is None else str(Path(control_vector).resolve()),
              "threads": threads, "out": str(out)}, f"generating with {gguf_file}", timeout)
        with np.load(out) as z:
            return [int(t) for t in z["ids"]]


def tokenize(gguf_file: str | os.PathLike, texts: Sequence[str], *, add_special: bool = False,
             parse_special: bool = False, timeout: float = DEFAULT_TIMEOUT) -> list[list[int]]:
    """llama.cpp's token ids of each text (``llama_tokenize`` with the vocabulary of ``gguf_file``).

    Raises:
        SterError: as ``logits``.
    """
    require()
    with tempfile.TemporaryDirectory(prefix="ster-llamacpp-out-") as tmp:
        out = Path(tmp) / "tokens.npz"
        _run({"job": "tokenize", "model": str(Path(gguf_file).resolve()), "texts": list(texts),
              "add_special": bool(add_special), "parse_special": bool(parse_special), "out": str(out)},
             f"tokenizing with {gguf_file}", timeout)
        with np.load(out) as z:
            return [[int(t) for t in z[f"t{i}"]] for i in range(len(texts))]


def pieces(gguf_file: str | os.PathLike, ids: Sequence[int], *, timeout: float = DEFAULT_TIMEOUT
           ) -> list[bytes]:
    """llama.cpp's piece of each id (``llama_token_to_piece`` with ``special`` on, no ``lstrip``) with the
    vocabulary of ``gguf_file``.

    Raises:
        SterError: as ``logits``.
    """
    require()
    with tempfile.TemporaryDirectory(prefix="ster-llamacpp-out-") as tmp:
        out = Path(tmp) / "pieces.npz"
        _run({"job": "pieces", "model": str(Path(gguf_file).resolve()), "ids": [int(i) for i in ids],
              "out": str(out)}, f"reading the pieces of {gguf_file}", timeout)
        with np.load(out) as z:
            return [bytes(z[f"p{k}"]) for k in range(len(ids))]


def perplexity(gguf_file: str | os.PathLike, text: str, n_ctx: int = 512, *, max_chunks: int | None = None,
               threads: int | None = None, timeout: float = DEFAULT_TIMEOUT) -> dict:
    """llama-perplexity's computation, run by llama.cpp on ``text``.

    As ``tools/perplexity/perplexity.cpp`` does it: the whole text is tokenized with special tokens
    (BOS when the vocabulary adds it); it is cut into ``len // n_ctx`` windows of ``n_ctx`` tokens
    (at most ``max_chunks``), each decoded from an empty cache with its first token replaced by BOS
    when the vocabulary adds one; the logits of positions ``n_ctx / 2 .. n_ctx - 2`` score the next
    token. F32 key/value cache, plain CPU kernels.

    Returns:
        {"ppl", "nll" (float64 per scored token, window by window), "tokens" (the text's ids),
        "n_ctx", "chunks"}.

    Raises:
        SterError: as ``logits``; a text shorter than two windows.
    """
    require()
    with tempfile.TemporaryDirectory(prefix="ster-llamacpp-out-") as tmp:
        out = Path(tmp) / "ppl.npz"
        _run({"job": "perplexity", "model": str(Path(gguf_file).resolve()), "text": text, "n_ctx": int(n_ctx),
              "max_chunks": max_chunks, "threads": threads, "out": str(out)},
             f"computing perplexity with {gguf_file}", timeout)
        with np.load(out) as z:
            nll = z["nll"].astype(np.float64)
            return {"ppl": float(np.exp(nll.mean())), "nll": nll, "tokens": z["tokens"].tolist(),
                    "n_ctx": int(n_ctx), "chunks": int(z["chunks"])}


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
    if req.get("flash_attn") is not None:  # llama_flash_attn_type: 0 disabled, 1 enabled (default -1, auto)
        cparams.flash_attn_type = int(bool(req["flash_attn"]))
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
    params.pure = bool(req.get("pure"))
    if req.get("threads"):
        params.nthread = int(req["threads"])
    rc = L.llama_model_quantize(req["model"].encode(), req["out"].encode(), params)
    if rc != 0:
        _fail(f"llama.cpp's quantizer returned {rc} for {req['model']}")


def _load(L, req: dict, n_ctx: int, n_batch: int | None = None):
    """(model, context) on plain CPU kernels with an F32 key/value cache; fails the child otherwise."""
    params = L.llama_model_default_params()
    params.n_gpu_layers = 0
    params.use_extra_bufts = False
    model = L.llama_model_load_from_file(req["model"].encode(), params)
    if not model:
        _fail(f"llama.cpp could not load {req['model']} (see its log above)")
    cparams = L.llama_context_default_params()
    cparams.n_ctx = max(int(n_ctx), 8)
    cparams.n_batch = cparams.n_ubatch = max(int(n_batch or n_ctx), 8)
    cparams.type_k = cparams.type_v = 0
    if req.get("threads"):
        cparams.n_threads = cparams.n_threads_batch = int(req["threads"])
    ctx = L.llama_init_from_model(model, cparams)
    if not ctx:
        _fail(f"llama.cpp could not make a context for {req['model']}")
    return model, ctx


def _decode(L, ctx, batch, ids, start: int, want) -> None:
    batch.n_tokens = len(ids)
    for i, t in enumerate(ids):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = int(t), start + i, 1, 1 if want(i) else 0
        batch.seq_id[i][0] = 0
    rc = L.llama_decode(ctx, batch)
    if rc != 0:
        _fail(f"llama.cpp's llama_decode returned {rc}")


def _control_vector(path: str, n_embd: int) -> np.ndarray:
    """A control-vector GGUF as llama.cpp's common_control_vector_load_one reads it: tensors
    ``direction.N`` (N >= 1, F32, 1-D, n_embd each) summed into a buffer whose block N - 1 is layer N."""
    from gguf import GGUFReader

    r = GGUFReader(path)
    data = np.zeros(0, np.float32)
    for t in r.tensors:
        head, _, tail = t.name.partition(".")
        if head != "direction" or not tail.isdigit() or int(tail) == 0:
            _fail(f"invalid direction tensor name {t.name!r} in {path}")
        if t.tensor_type.name != "F32" or len(t.shape) != 1 or int(t.n_elements) != n_embd:
            _fail(f"direction tensor {t.name!r} in {path} is not F32 [{n_embd}]")
        layer = int(tail)
        if data.size < n_embd * layer:
            data = np.concatenate([data, np.zeros(n_embd * layer - data.size, np.float32)])
        data[n_embd * (layer - 1):n_embd * layer] += np.asarray(t.data, np.float32)
    return data


def _child_logits_of_files(L, req: dict) -> None:
    prompt, out = req["prompt"], {}
    for n, path in enumerate(req["models"]):
        params = L.llama_model_default_params()
        params.n_gpu_layers = 0
        params.use_extra_bufts = False
        model = L.llama_model_load_from_file(path.encode(), params)
        if not model:
            continue  # llama.cpp refuses the file: no logits for it
        L.llama_model_free(model)
        model, ctx = _load(L, dict(req, model=path), len(prompt))
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
        batch = L.llama_batch_init(len(prompt), 0, 1)
        _decode(L, ctx, batch, prompt, 0, lambda i: True)
        rows = np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(len(prompt) * n_vocab,))
        out[f"f{n}"] = rows.reshape(len(prompt), n_vocab).astype(np.float32, copy=True)
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        L.llama_model_free(model)
    np.savez(req["out"], **out)


def _child_greedy(L, req: dict) -> None:
    prompt, n = req["prompt"], int(req["n"])
    model, ctx = _load(L, req, len(prompt) + n + 1)
    if req.get("control_vector"):
        n_embd = L.llama_model_n_embd(model)
        data = np.ascontiguousarray(_control_vector(req["control_vector"], n_embd))
        import ctypes

        ptr = data.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        if L.llama_set_adapter_cvec(ctx, ptr, data.size, n_embd, 1, L.llama_model_n_layer(model)) != 0:
            _fail("llama.cpp refused the control vector")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    batch = L.llama_batch_init(max(len(prompt), 1), 0, 1)
    _decode(L, ctx, batch, prompt, 0, lambda i: i == len(prompt) - 1)
    out = []
    for step in range(n):
        row = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        token = int(np.argmax(row))
        out.append(token)
        if step + 1 < n:
            _decode(L, ctx, batch, [token], len(prompt) + step, lambda i: True)
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    np.savez(req["out"], ids=np.asarray(out, np.int64))


def _tokens(L, vocab, text: str, add_special: bool, parse_special: bool) -> np.ndarray:
    raw = text.encode("utf-8")
    cap = len(raw) + 8
    buf = (L.llama_token * cap)()
    n = L.llama_tokenize(vocab, raw, len(raw), buf, cap, add_special, parse_special)
    if n < 0:
        cap = -n
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(vocab, raw, len(raw), buf, cap, add_special, parse_special)
    return np.asarray(buf[:n], np.int64)


def _load_vocab(L, path: str):
    """(model, vocabulary) of a GGUF file loaded with ``vocab_only`` (no weights); the model is to be freed."""
    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(path.encode(), params)
    if not model:
        _fail(f"llama.cpp could not load the vocabulary of {path}")
    return model, L.llama_model_get_vocab(model)


def _child_tokenize(L, req: dict) -> None:
    model, vocab = _load_vocab(L, req["model"])
    out = {f"t{i}": _tokens(L, vocab, t, req["add_special"], req["parse_special"]) for i, t in enumerate(req["texts"])}
    L.llama_model_free(model)
    np.savez(req["out"], **out)


def _child_pieces(L, req: dict) -> None:
    import ctypes

    model, vocab = _load_vocab(L, req["model"])
    out = {}
    for k, token in enumerate(req["ids"]):
        buf = ctypes.create_string_buffer(256)
        n = L.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
        out[f"p{k}"] = np.frombuffer(buf.raw[:n], np.uint8)
    L.llama_model_free(model)
    np.savez(req["out"], **out)


def _child_perplexity(L, req: dict) -> None:
    n_ctx = int(req["n_ctx"])
    model, ctx = _load(L, req, n_ctx)
    vocab = L.llama_model_get_vocab(model)
    tokens = _tokens(L, vocab, req["text"], True, False)
    if len(tokens) < 2 * n_ctx:
        _fail(f"the text tokenizes to {len(tokens)} tokens; llama-perplexity needs at least {2 * n_ctx} "
              f"(two windows of --ctx {n_ctx})")
    add_bos = bool(L.llama_vocab_get_add_bos(vocab))
    bos = L.llama_vocab_bos(vocab)
    n_chunks = len(tokens) // n_ctx
    if req.get("max_chunks"):
        n_chunks = min(n_chunks, int(req["max_chunks"]))
    n_vocab = L.llama_vocab_n_tokens(vocab)
    first = n_ctx // 2
    batch = L.llama_batch_init(n_ctx, 0, 1)
    nll = []
    for c in range(n_chunks):
        window = tokens[c * n_ctx:(c + 1) * n_ctx].copy()
        if add_bos:
            window[0] = bos
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        _decode(L, ctx, batch, window.tolist(), 0, lambda i: i >= first)
        rows = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, first), shape=((n_ctx - first) * n_vocab,))
        logits = rows.reshape(n_ctx - first, n_vocab)[:-1].astype(np.float64)
        target = tokens[c * n_ctx + first + 1:(c + 1) * n_ctx]
        top = logits.max(axis=1)
        lse = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
        nll.append(lse - logits[np.arange(len(target)), target])
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    np.savez(req["out"], nll=np.concatenate(nll), tokens=tokens, chunks=np.asarray(n_chunks))


def _child(request_path: str) -> None:
    req = json.loads(Path(request_path).read_text())
    try:
        import llama_cpp as L
    except Exception as e:  # noqa: BLE001 - any failure to import is reported to the parent
        import importlib.util

        if isinstance(e, ImportError) and importlib.util.find_spec("llama_cpp") is None:
            sys.exit(4)
        # Installed but broken (a shared library that does not load, a wrong build): the reason
        # is the last line the parent shows.
        print(f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"[:500],
              file=sys.stderr)
        sys.exit(5)
    L.llama_backend_init()
    jobs = {"logits": _child_logits, "quantize": _child_quantize, "greedy": _child_greedy,
            "logits_of_files": _child_logits_of_files,
            "tokenize": _child_tokenize, "pieces": _child_pieces, "perplexity": _child_perplexity}
    jobs[req["job"]](L, req)


if __name__ == "__main__":
    _child(sys.argv[1])
