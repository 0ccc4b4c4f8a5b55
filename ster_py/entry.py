"""The ``ster`` console script: imports the CLI (typer, rich, numpy: about a second) under a Ctrl-C guard,
and makes SIGTERM unwind as Ctrl-C does.

Ctrl-C while the imports run would otherwise print a KeyboardInterrupt traceback from inside a
library; here it is "interrupted" on stderr and exit status 130, as during a command
(``ster_py.cli.main``).

SIGTERM (``kill``, ``timeout``, a container or service stopping) would by default end the process on
the spot, leaving the temporary file or directory of an output being written (``.out.gguf.XXXX.tmp``).
Here it raises ``SystemExit(143)`` in the main thread instead, so every ``finally`` and context
manager runs (``artifacts.atomic_outputs`` removes its temporaries) and the status is the shell's
128 + 15; "terminated" goes to stderr. ``ster serve`` is unaffected: uvicorn installs its own
handler while it runs, and after its graceful shutdown the command exits 143 with "terminated"
itself (``server.uvicorn_server``).
"""
from __future__ import annotations

import signal
import sys
import threading

#: Exit status after SIGTERM: 128 + the signal's number, as a shell reports a process it killed.
TERMINATED = 128 + signal.SIGTERM


class _Terminated:
    """The SIGTERM handler: ``SystemExit(TERMINATED)`` once; a repeated SIGTERM while unwinding is ignored, so it
    cannot cut short the cleanup the first one started (SIGKILL still ends a stuck process)."""

    def __init__(self) -> None:
        self.received = False

    def __call__(self, signum, frame) -> None:
        if self.received:
            return
        self.received = True
        raise SystemExit(TERMINATED)


def main() -> None:
    """Run ``ster``; Ctrl-C before the CLI is imported exits 130 with "interrupted" on stderr, and SIGTERM at any time
    unwinds (temporaries removed) and exits 143 with "terminated" on stderr."""
    handler = _Terminated()
    previous = None
    # signal.signal works only in the main thread; an inherited SIG_IGN (nohup-like parents) is kept
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        previous = signal.signal(signal.SIGTERM, handler)
    try:
        try:
            from .cli import main as run
        except KeyboardInterrupt:
            sys.stderr.write("interrupted\n")
            raise SystemExit(130) from None
        run()
    finally:
        if handler.received:
            try:
                sys.stderr.write("terminated\n")
                sys.stderr.flush()
            except (OSError, ValueError):  # stderr closed or its reader gone: the status says it
                pass
        if previous is not None:  # a caller in the same process (a test) gets its handler back
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    main()
