"""``ster serve``: the OpenAI-compatible HTTP server (the app is ``ster_py.server``).

Registered on ``ster_py.cli.app`` when cli.py imports this module (at its end). The library does the
work (``conversation.Session``; ``server``); this command reads options, binds the socket and runs uvicorn.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from .cli import ADAPTER_HELP, CHAT_TEMPLATE_FILE_HELP, MODEL_HELP, PRECISION_HELP, QUANTIZE_HELP, THREADS_HELP, \
    Precision, Quantize, _check_device, _model_or_default, _use_threads, app, err, flag, load_for_run, read_template_file
from .errors import SterError


@app.command()
def serve(
    model: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    revision: Optional[str] = typer.Option(None, help="Hub branch, tag or commit (default main)."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (default: this machine only; 0.0.0.0: "
                             "every interface, anyone on the network can use it)."),
    port: int = typer.Option(8080, help="TCP port."),
    vector: List[str] = typer.Option([], "--vector", metavar="NAME=FILE", help="A steering vector requests may name "
                                     "(\"steering\": {\"vector\": NAME, \"strength\": X}); repeatable."),
    adapter: Optional[str] = typer.Option(None, help=ADAPTER_HELP),
    max_tokens: int = typer.Option(256, help="max_tokens of a request that gives none."),
    name: Optional[str] = typer.Option(None, "--name", help="The model id /v1/models lists (default: the model "
                                       "as given)."),
    chat_template_file: Optional[Path] = typer.Option(None, "--chat-template-file", metavar="FILE",
                                                      help=CHAT_TEMPLATE_FILE_HELP),
    precision: Precision = typer.Option(Precision.auto, help=PRECISION_HELP),
    quantize: Optional[Quantize] = typer.Option(None, "--quantize", help=QUANTIZE_HELP),
    kv_cache: str = typer.Option("f32", "--kv-cache", help="Key/value cache dtype: f32 or f16."),
    ctx_size: Optional[int] = typer.Option(None, "--ctx-size", help="Positions a request may fill "
                                           "(default: the model's)."),
    device: str = typer.Option("cpu", help="Only cpu is available."),
    threads: Optional[int] = typer.Option(None, "--threads", help=THREADS_HELP),
    draft: Optional[str] = typer.Option(None, "--draft", help="Speculative decoding with this drafter (a smaller "
                                        "model of the same vocabulary, or a Gemma 4 assistant); requests must "
                                        "then decode greedily (temperature 0)."),
    draft_max: Optional[int] = typer.Option(None, "--draft-max", help="With --draft: tokens proposed per round "
                                            "(1 to 64, default 8)."),
    max_queue: int = typer.Option(64, "--max-queue", help="Requests that may wait while one generates; one more "
                                  "gets a 503 with Retry-After."),
    allow_origin: List[str] = typer.Option([], "--allow-origin", metavar="ORIGIN", help="A web page origin "
                                           "(https://app.example; * for any) whose scripts may call the server "
                                           "(CORS); other pages are refused. Repeatable."),
    quiet: bool = flag(False, "--quiet", "-q", help="No progress display, start-up notes or request log on stderr "
                       "(warnings and errors still print)."),
) -> None:
    """Serve the model over HTTP with OpenAI's API (/v1/chat/completions, /v1/completions, /v1/models;
    GET /health answers {"status": "ok"}); one request generates at a time, the others wait their turn. Each request is logged on stderr
    (without -q)."""
    from .conversation import Session
    from .generate import kv_cache_dtype
    from .server import Server, build_app, is_loopback, uvicorn_server
    from .steering import check_vector_for, read_vector

    _check_device(device)
    kv_cache_dtype(kv_cache)
    _use_threads(threads)
    if not 0 <= port <= 65535:
        raise SterError(f"--port must be 0 to 65535, got {port}")
    if not host.strip():  # the socket layer reads "" as every interface, and the start line would say http://:PORT
        raise SterError("--host is empty; give 127.0.0.1 (this machine only) or, to listen on every interface, "
                        "0.0.0.0 (or :: for IPv6) explicitly")
    if max_tokens < 0:
        raise SterError(f"--max-tokens must be 0 or more, got {max_tokens}")
    if max_queue < 0:
        raise SterError(f"--max-queue must be 0 or more, got {max_queue}")
    origins = tuple(_origin(o) for o in allow_origin)
    model_id = _check_name(name, "--name") if name is not None else \
        _check_name(_model_or_default(model), "the model's name (give --name)")
    vectors = {}
    for item in vector:
        vname, eq, path = item.partition("=")
        if not eq or not vname or not path:
            raise SterError(f"--vector takes NAME=FILE, got {item!r}")
        if vname in vectors:
            raise SterError(f"--vector: the name {vname!r} is given twice")
        vectors[vname] = (read_vector(path), path)  # malformed vectors are refused before any weight is read
    from .generate import Sampling
    from .speculative import check_draft_options

    check_draft_options(draft, draft_max, Sampling())  # before any weight is read (requests are checked each)
    template = read_template_file(chat_template_file)
    # as generate and chat load it: the adapter checked before any weight is fetched, then applied to every request
    loaded = load_for_run(model, revision, precision, quiet, quantize=quantize, adapter=adapter, template=template)
    for vname, (vec, path) in vectors.items():
        check_vector_for(vec, loaded, path)
    drafter = None
    if draft is not None:
        from .speculative import load_drafter

        drafter = load_drafter(draft, loaded, precision=precision.value)
    session = Session(loaded, kv_cache=kv_cache, ctx_size=ctx_size, draft=drafter, n_draft=draft_max)
    if session.template_error is not None:  # /v1/chat/completions would need it: refused before serving
        raise SterError(session.template_error)
    server = Server(session, model_id, {k: v for k, (v, _) in vectors.items()}, max_tokens, max_queue=max_queue)
    import signal
    import socket

    try:
        sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except (OSError, UnicodeError) as e:
        raise SterError(f"cannot listen on {host}:{port}: {getattr(e, 'strerror', None) or e}; choose another --port "
                        "or --host") from None
    address, bound = sock.getsockname()[:2]
    local = is_loopback(address)
    shown = f"[{address}]" if ":" in address else address   # what was bound: --host localhost is 127.0.0.1 only
    # One start line, on stdout (scripts read the address from its third word: --port 0 picks a free port)
    print(f"listening on http://{shown}:{bound}" + ("" if quiet else
          " (OpenAI API at /v1" + ("; greedy requests only: --draft" if drafter is not None else "")
          + "; Ctrl-C stops)"),
          flush=True)
    if not local:
        err.print(f"[bold yellow]warning:[/] listening on {escape(host)}, not loopback: anyone who can reach this "
                  f"machine on port {bound} can use the server (it has no authentication)", highlight=False)
    if session.template is None and not quiet:
        err.print("note: the model has no chat template (a base model): /v1/chat/completions refuses requests; "
                  "send raw text to /v1/completions", highlight=False)

    def log_request(line: str) -> None:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()

    _log_to_stderr()
    app = build_app(server, loopback=local, allow_origins=origins, log=None if quiet else log_request)
    runner = uvicorn_server(server, app, log_level="warning" if not quiet else "error")
    runner.run(sockets=[sock])
    if runner.stopped_by == signal.SIGINT:
        raise SystemExit(130)   # ster's main prints "interrupted"
    if runner.stopped_by == signal.SIGTERM:
        from .entry import TERMINATED

        err.print("terminated", highlight=False)
        raise SystemExit(TERMINATED)


def _check_name(text: str, what: str) -> str:
    """``text`` if it is valid Unicode: every reply names the model, and a lone surrogate (a non-UTF-8 byte of an
    argument) cannot be written in one; nor an empty one (``--name "$UNSET"``: replies naming the model "", which
    /v1/models/{id} cannot be asked for)."""
    if not text.strip():
        raise SterError(f"{what} is {'empty' if not text else 'only whitespace'}; give the model id clients will see "
                        "(or leave it out: the model's name)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise SterError(f"{what} {ascii(text)} is not valid UTF-8 text; give a name of valid characters") from None
    return text


def _origin(text: str) -> str:
    """An --allow-origin value: ``*``, or scheme://host[:port] written as a browser sends it in ``Origin``
    (``server.normalize_origin``: ``https://App.Example:443`` -> ``https://app.example``)."""
    from .server import normalize_origin

    if text == "*":
        return text
    try:
        return normalize_origin(text)
    except SterError as e:
        raise SterError(f"--allow-origin takes an origin such as https://app.example or http://localhost:3000 "
                        f"(scheme, host and port, as a browser's Origin header has it), or *; {text!r}: {e}") from None


class _OneLine(logging.Handler):
    """uvicorn's and asyncio's log records on stderr as one line each: never a traceback (the exception's type,
    message and innermost place instead), and the same message at most once per ``EVERY`` seconds, then with
    the count of those left out (a flood of failed accepts or bad requests is not thousands of lines)."""

    EVERY = 10.0

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict = {}   # (logger, message template) -> [time printed, left out since]

    def emit(self, record: logging.LogRecord) -> None:
        import time
        import traceback

        now = time.monotonic()
        key = (record.name, str(record.msg))
        last = self.seen.get(key)
        if last is not None and now - last[0] < self.EVERY:
            last[1] += 1
            return
        more = f" ({last[1]} more like it)" if last is not None and last[1] else ""
        self.seen[key] = [now, 0]
        if len(self.seen) > 1000:   # messages with varying text: forget the old ones
            self.seen = {k: v for k, v in self.seen.items() if now - v[0] < self.EVERY}
        try:
            text = record.getMessage().splitlines()[0] if record.getMessage() else ""
        except Exception:  # noqa: BLE001 - a malformed record must not take the server down
            text = str(record.msg)
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
            text += f": {type(exc).__name__}" + (f": {exc}" if str(exc) else "") + "".join(
                f" ({Path(f.filename).name}:{f.lineno})" for f in where)
        try:
            sys.stderr.write(f"{record.levelname.lower()}: {text[:1000]}{more}\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


def _log_to_stderr() -> None:
    """Route uvicorn's and asyncio's loggers through ``_OneLine`` (and not to the root logger)."""
    handler = _OneLine()
    for logger_name in ("uvicorn", "uvicorn.error", "uvicorn.access", "asyncio"):
        logger = logging.getLogger(logger_name)
        logger.handlers[:] = [handler]
        logger.propagate = False
