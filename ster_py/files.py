"""Reading small untrusted files (JSON beside a model, sidecars) without trusting the path, and
the one message for a failing write.

A config.json may be a symlink to /dev/zero (never ends) or a FIFO (``open`` blocks
forever); a regular file may be gigabytes. ``read_bounded`` (which ``read_regular`` and
``cli_text.read_input_file`` share) opens without blocking, checks the kind and size on the open
descriptor (a path checked with ``os.stat`` first can be swapped for a FIFO before ``open``), then
reads at most ``limit + 1`` bytes, so neither memory nor time is spent before the check.

Writing: every output goes through ``artifacts.atomic_outputs`` / ``atomic_directory`` (a
temporary name, then a rename); ``write_error`` is the message they give for an ``OSError`` (a
full disk, a quota, an I/O error) and ``sync_to_disk`` the flush they make before the rename.
Every temporary they (and the merge and preset fetches) make comes from ``temporary``, which makes
it and takes charge of its removal in one step that Ctrl-C cannot split.
"""
from __future__ import annotations

import errno
import os
import shutil
import signal
import stat
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from .errors import SterError

#: config.json, generation_config.json, tokenizer_config.json...: real ones are kilobytes
#: (a few MB with a long label map); the biggest model.safetensors.index.json files are ~10 MB.
MAX_JSON_FILE_BYTES = 64 << 20


class NotRegularFile(Exception):
    """``read_bounded``: the path is a directory (``directory``) or a pipe, device or socket."""

    def __init__(self, directory: bool):
        super().__init__("a directory" if directory else "not a regular file")
        self.directory = directory


class FileTooLarge(Exception):
    """``read_bounded``: the file holds more than the limit (``size``: its size when opened, or None when
    it grew past the limit while being read)."""

    def __init__(self, size: int | None):
        super().__init__("too large")
        self.size = size


def read_bounded(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes (symlinks followed).

    Opened with O_NONBLOCK (a FIFO opens at once instead of waiting for a writer) and O_NOCTTY, then
    checked with ``fstat`` on the descriptor: the file read is the file checked, whatever the path
    becomes meanwhile. Only a regular file is read (with O_NONBLOCK cleared), at most ``limit + 1`` bytes.

    Raises:
        NotRegularFile: a directory, pipe, device or socket.
        FileTooLarge: over ``limit`` bytes when opened, or grown past it while being read.
        OSError: it cannot be opened or read (missing, no permission...).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(stat.S_ISDIR(info.st_mode))
        if info.st_size > limit:
            raise FileTooLarge(info.st_size)
        os.set_blocking(fd, True)
        handle = os.fdopen(fd, "rb")   # closes fd from here on
    except BaseException:
        os.close(fd)
        raise
    with handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(None)
    return data


def read_regular(path: str | os.PathLike, what: str, limit: int = MAX_JSON_FILE_BYTES) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes (symlinks followed), read by
    ``read_bounded``.

    Raises:
        SterError: "failed to read [WHAT ]PATH: ..." (``what`` may be empty) when it is missing or unreadable, not a
            regular file (pipe, device, directory), or larger than ``limit``.
    """
    what = f"{what} " if what else ""
    try:
        return read_bounded(path, limit)
    except NotRegularFile:
        raise SterError(f"failed to read {what}{path}: not a regular file (a pipe, device or directory); "
                        "replace it with the real file") from None
    except FileTooLarge as e:
        if e.size is None:
            raise SterError(f"failed to read {what}{path}: it grew past {limit} bytes while being read") from None
        raise SterError(f"failed to read {what}{path}: it is {e.size} bytes, over ster's limit of "
                        f"{limit} for it (real ones are far smaller)") from None
    except OSError as error:
        raise SterError(f"failed to read {what}{path}: {error.strerror or error}") from None


def file_kind(path: str | os.PathLike) -> str | None:
    """What ``path`` is when it exists and is not a regular file (symlinks followed): "a directory",
    "a FIFO (named pipe)", "a character device", "a block device" or "a socket"; None for a regular file
    or a path that does not exist (or cannot be looked at). For a message that says what was given instead of
    calling it missing."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    for test, words in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return None


#: POSIX limits every Linux file system ster writes to uses (NAME_MAX, PATH_MAX), in bytes.
NAME_MAX = 255
PATH_MAX = 4096


def expand_user(text: str | os.PathLike, what: str) -> Path:
    """``Path(text)`` with a leading ``~`` or ``~name`` made the home folder, as a shell does.

    Raises:
        SterError: ``~name`` names no user here (pathlib raises RuntimeError, which ended commands
            given ``--model ~nosuchuser/x`` in a traceback).
    """
    try:
        return Path(text).expanduser()
    except RuntimeError:
        raise SterError(f"{what} {str(text)!r}: its ~ names no home folder here; give the full path") from None


def user_path(text: str | os.PathLike, what: str) -> Path:
    """A path the user typed, ready to be looked at: ``check_path_name``, then ``expand_user``.

    Raises:
        SterError: as those two (a name too long to be a path or holding a NUL byte, a ``~name`` of no user).
    """
    check_path_name(text, what)
    return expand_user(text, what)


def shown_value(value) -> str:
    """A library caller's wrong argument for an error message: ``None``, ``int 5``, ``dict {...}`` (60 characters
    at most)."""
    if value is None:
        return "None"
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def check_path_arg(value, func: str, expected: str) -> None:
    """Refuse a library function's path argument that is not a path (None, a number, a dict).

    Raises:
        SterError: "FUNC takes EXPECTED, a str or pathlib.Path; got None" (once a TypeError from ``Path``)."""
    if not isinstance(value, (str, os.PathLike)):
        raise SterError(f"{func} takes {expected}, a str or pathlib.Path; got {shown_value(value)}")


def check_path_name(path: str | os.PathLike, what: str) -> None:
    """Refuse a path the operating system cannot name, before it is looked at.

    ``os.stat`` on a name of more than ``NAME_MAX`` bytes raises ``OSError`` (ENAMETOOLONG), which
    ``pathlib``'s ``exists``/``is_dir`` pass on; this turns it into a message naming the option.

    Args:
        path: the path as given (str or os.PathLike).
        what: the option or role for the message, e.g. ``"--output"``.

    Raises:
        SterError: not a str, bytes or os.PathLike (a library caller's None, once a TypeError); an empty path
            (``Path("")`` is the current directory: ``--adapter "$UNSET"`` applied whatever adapter was there); a component over ``NAME_MAX`` bytes or the whole over ``PATH_MAX`` bytes (UTF-8); a
            NUL byte (no path holds one: ``os.stat`` and ``open`` raise ValueError, which no caller expects; a
            command line cannot carry one, but a line piped into ``ster chat`` can).
    """
    if not isinstance(path, (str, bytes, os.PathLike)):  # a library caller's None or number: not a TypeError
        raise SterError(f"{what} must be a path (a str or pathlib.Path), got {shown_value(path)}")
    raw = os.fsencode(path)
    if not raw:
        raise SterError(f"{what} is empty; give a path (an unset shell variable gives an empty value; "
                        ". names the current directory)")
    shown = os.fsdecode(raw[:60]) + ("..." if len(raw) > 60 else "")
    if b"\0" in raw:
        raise SterError(f"cannot use {what} {shown}: a path cannot hold a NUL byte; give the file's name")
    longest = max((len(part) for part in raw.split(b"/")), default=0)
    if longest > NAME_MAX or len(raw) > PATH_MAX:
        raise SterError(f"cannot use {what} {shown}: File name too long (a name may hold at most {NAME_MAX} "
                        f"bytes, a path {PATH_MAX}); choose a shorter name")


#: What to do about a failed write, by errno (nothing is added for the others).
_WRITE_ADVICE = {
    errno.ENOSPC: "free space or choose another place",
    errno.EDQUOT: "free space (the disk quota is used up) or choose another place",
    errno.EFBIG: "choose a file system that holds larger files, or raise the file size limit (ulimit -f)",
    errno.EROFS: "choose another place",
    errno.EACCES: "choose a folder you can write to",
    errno.EPERM: "choose a folder you can write to",
    errno.EIO: "the disk or file system failed: check it, or choose another place",
}


def write_error(target: str | os.PathLike, error: OSError,
                inside: Sequence[str | os.PathLike] | None = None) -> SterError:
    """The one ``SterError`` for an ``OSError`` met while writing the output ``target``.

    "cannot write TARGET: REASON[ (FILE)][; ADVICE]; nothing was written": the callers
    (``artifacts.atomic_outputs``, ``atomic_directory``, ``writing``) remove their temporaries, so
    the last words hold.

    Args:
        target: the output as the user named it (or several, joined by the caller).
        error: the ``OSError`` (``strerror`` is used when it has one).
        inside: the temporaries being written; an error about another file only (a weight being read)
            names that file. None: never name one (the error is about ``target``).
    """
    reason = error.strerror or str(error) or type(error).__name__
    where = ""
    # a copy's error carries the source as filename and the destination as filename2 (shutil.copyfile)
    names = [os.fsdecode(n) for n in (error.filename, error.filename2) if isinstance(n, (str, bytes, os.PathLike))]
    if inside is not None and names and not any(_within(n, t) for n in names for t in inside):
        where = f" ({names[0]})"
    advice = _WRITE_ADVICE.get(error.errno)
    return SterError(f"cannot write {target}: {reason}{where}{'; ' + advice if advice else ''}; nothing was written")


def _within(name: str, folder: str | os.PathLike) -> bool:
    """``name`` is ``folder`` or a path below it (compared as absolute paths, links not followed)."""
    name, folder = os.path.abspath(name), os.path.abspath(folder)
    return name == folder or name.startswith(folder.rstrip(os.sep) + os.sep)


def sync_to_disk(path: str | os.PathLike) -> None:
    """Flush ``path`` (a file, or every file below a directory and the directory) to the disk.

    Called on a temporary before it is renamed into place: a write the kernel accepted can still
    fail on its way to the disk (delayed allocation on a full disk, an I/O error, a network file
    system's quota), and ``fsync`` is where that is reported; a crash after the rename then cannot
    leave the name pointing at data never written. Symbolic links are not followed.

    Raises:
        OSError: the flush failed (the callers turn it into ``write_error``).
    """
    if not os.path.isdir(path) or os.path.islink(path):
        _fsync(path)
        return
    for folder, _, names in os.walk(path):
        for name in names:
            file = os.path.join(folder, name)
            if not os.path.islink(file):
                _fsync(file)
    _fsync(path)  # its entries: the names written into it


def _fsync(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends: one that arrives meanwhile is acted on right after
    (its handler as it was, or its default action). Python runs signal handlers in the main thread
    whichever thread the kernel picks, so the handlers are swapped rather than the thread's signal
    mask blocked; in other threads, which no handler interrupts, nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    before = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            before[sig] = signal.signal(sig, lambda signum, frame: arrived.append(signum))
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)   # None: set outside Python
        for sig in dict.fromkeys(arrived):
            handler = before[sig]
            if callable(handler):
                handler(sig, None)          # Python's KeyboardInterrupt, or ster's own handler
            elif handler == signal.SIG_DFL:
                signal.raise_signal(sig)    # the default action: the process ends as it would have


@contextmanager
def temporary(folder: str | os.PathLike, prefix: str, suffix: str = "", *, directory: bool = True,
              target: str | os.PathLike | None = None) -> Iterator[Path]:
    """A new temporary directory (or empty file, mode 0600) in ``folder``, removed when the block
    ends if it is still there (the block may have renamed it into place).

    It is made, and this function put in charge of removing it, with SIGINT and SIGTERM held: a
    Ctrl-C landing between the two left an empty ``.NAME.xxxx.tmp`` folder beside an interrupted
    output. Use it in a ``with`` statement (no Python code runs between its making and the block);
    through an ``ExitStack``, enter it inside ``signals_held``.

    Raises:
        SterError: the temporary cannot be made, as ``write_error(target, ...)`` when ``target`` (the
            output it stands for) is given.
        OSError: the same, when no ``target`` is given.
    """
    path = None
    try:
        with signals_held():
            try:
                if directory:
                    path = Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=folder))
                else:
                    fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=folder)
                    os.close(fd)
                    path = Path(name)
            except OSError as e:
                if target is None:
                    raise
                raise write_error(target, e) from None
        yield path
    finally:
        if path is not None:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            elif os.path.lexists(path):
                try:
                    path.unlink()
                except OSError:
                    pass
