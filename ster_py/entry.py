"""The ``ster`` console script: imports the CLI (typer, rich, numpy: about a second) under a Ctrl-C guard.

Ctrl-C while the imports run would otherwise print a KeyboardInterrupt traceback from inside a
library; here it is "interrupted" on stderr and exit status 130, as during a command
(``ster_py.cli.main``).
"""
from __future__ import annotations

import sys


def main() -> None:
    """Run ``ster``; Ctrl-C before the CLI is imported exits 130 with "interrupted" on stderr."""
    try:
        from .cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise SystemExit(130) from None
    run()


if __name__ == "__main__":
    main()
