"""Reading small untrusted files (JSON beside a model, sidecars) without trusting the path.

A config.json may be a symlink to /dev/zero (never ends) or a FIFO (``open`` blocks
forever); a regular file may be gigabytes. ``read_regular`` checks the kind and size
with ``os.stat`` before opening, then reads at most ``limit + 1`` bytes, so neither
memory nor time is spent before the check.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import SterError

#: config.json, generation_config.json, tokenizer_config.json...: real ones are kilobytes
#: (a few MB with a long label map); the biggest model.safetensors.index.json files are ~10 MB.
MAX_JSON_FILE_BYTES = 64 << 20


def read_regular(path: str | os.PathLike, what: str, limit: int = MAX_JSON_FILE_BYTES) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes (symlinks followed).

    Raises:
        SterError: "failed to read [WHAT ]PATH: ..." (``what`` may be empty) when it is missing or unreadable, not a
            regular file (pipe, device, directory), or larger than ``limit``.
    """
    what = f"{what} " if what else ""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise SterError(f"failed to read {what}{path}: not a regular file (a pipe, device or directory); "
                            "replace it with the real file")
        if info.st_size > limit:
            raise SterError(f"failed to read {what}{path}: it is {info.st_size} bytes, over ster's limit of "
                            f"{limit} for it (real ones are far smaller)")
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as error:
        raise SterError(f"failed to read {what}{path}: {error.strerror or error}") from None
    if len(data) > limit:
        raise SterError(f"failed to read {what}{path}: it grew past {limit} bytes while being read")
    return data


#: POSIX limits every Linux file system ster writes to uses (NAME_MAX, PATH_MAX), in bytes.
NAME_MAX = 255
PATH_MAX = 4096


def check_path_name(path: str | os.PathLike, what: str) -> None:
    """Refuse a path the operating system cannot name, before it is looked at.

    ``os.stat`` on a name of more than ``NAME_MAX`` bytes raises ``OSError`` (ENAMETOOLONG), which
    ``pathlib``'s ``exists``/``is_dir`` pass on; this turns it into a message naming the option.

    Args:
        path: the path as given (str or os.PathLike).
        what: the option or role for the message, e.g. ``"--output"``.

    Raises:
        SterError: a component over ``NAME_MAX`` bytes or the whole over ``PATH_MAX`` bytes (UTF-8).
    """
    raw = os.fsencode(path)
    longest = max((len(part) for part in raw.split(b"/")), default=0)
    if longest > NAME_MAX or len(raw) > PATH_MAX:
        shown = os.fsdecode(raw[:60]) + "..."
        raise SterError(f"cannot use {what} {shown}: File name too long (a name may hold at most {NAME_MAX} "
                        f"bytes, a path {PATH_MAX}); choose a shorter name")
