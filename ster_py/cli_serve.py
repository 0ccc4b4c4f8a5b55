"""``ster serve``: the OpenAI-compatible HTTP server (the app is ``ster_py.server``).

Registered on ``ster_py.cli.app`` when cli.py imports this module (at its end). The library does the
work (``conversation.Session``; ``server``); this command reads options, binds the socket and runs uvicorn.
"""
from __future__ import annotations

from typing import List, Optional

import typer

from .cli import MODEL_HELP, PRECISION_HELP, QUIET_HELP, THREADS_HELP, Precision, _check_device, _model_or_default, \
    _use_threads, app, flag
from .cli_chat import _load
from .errors import SterError


@app.command()
def serve(
    model: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    revision: Optional[str] = typer.Option(None, help="Hub branch, tag or commit (default main)."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (default: this machine only)."),
    port: int = typer.Option(8080, help="TCP port."),
    vector: List[str] = typer.Option([], "--vector", metavar="NAME=FILE", help="A steering vector requests may name "
                                     "(\"steering\": {\"vector\": NAME, \"strength\": X}); repeatable."),
    max_tokens: int = typer.Option(256, help="max_tokens of a request that gives none."),
    name: Optional[str] = typer.Option(None, "--name", help="The model id /v1/models lists (default: the model "
                                       "as given)."),
    precision: Precision = typer.Option(Precision.auto, help=PRECISION_HELP),
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
    quiet: bool = flag(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Serve the model over HTTP with OpenAI's API (/v1/chat/completions, /v1/completions, /v1/models);
    one request generates at a time, the others wait their turn."""
    from .conversation import Session
    from .generate import kv_cache_dtype
    from .server import Server, build_app
    from .steering import check_vector_for, read_vector

    _check_device(device)
    kv_cache_dtype(kv_cache)
    _use_threads(threads)
    if not 0 <= port <= 65535:
        raise SterError(f"--port must be 0 to 65535, got {port}")
    if max_tokens < 0:
        raise SterError(f"--max-tokens must be 0 or more, got {max_tokens}")
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
    loaded = _load(model, revision, precision, quiet)
    for vname, (vec, path) in vectors.items():
        check_vector_for(vec, loaded, path)
    drafter = None
    if draft is not None:
        from .speculative import load_drafter

        drafter = load_drafter(draft, loaded, precision=precision.value)
    session = Session(loaded, kv_cache=kv_cache, ctx_size=ctx_size, draft=drafter, n_draft=draft_max)
    server = Server(session, name or _model_or_default(model), {k: v for k, (v, _) in vectors.items()}, max_tokens)
    import socket

    import uvicorn

    try:
        sock = socket.create_server((host, port))
    except OSError as e:
        raise SterError(f"cannot listen on {host}:{port}: {e.strerror or e}; choose another --port or --host") from None
    bound = sock.getsockname()[1]
    # One start line, on stdout (scripts read the address from its third word: --port 0 picks a free port)
    print(f"listening on http://{host}:{bound}" + ("" if quiet else
          " (OpenAI API at /v1" + ("; greedy requests only: --draft" if drafter is not None else "")
          + "; Ctrl-C stops)"),
          flush=True)
    config = uvicorn.Config(build_app(server), log_level="warning" if not quiet else "error", access_log=False,
                            timeout_graceful_shutdown=1)
    uvicorn.Server(config).run(sockets=[sock])
