"""CLI commands on text alone: ``ster tokenize`` and ``ster detokenize``.

Registered on ``ster_py.cli.app`` when cli.py imports this module (at its end).
Only the tokenizer is built (``ster_py.load.load_tokenizer``): no weight is
mapped, so a vocabulary-only GGUF works.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import List, Optional

import typer
from .cli import (BARE_ARGUMENT, MODEL_HELP, QUIET_HELP, _model_or_default, _write, app, err, flag, plural,
                  progress_bar, refuse_bare_argument, version_fields, warn)
from .errors import SterError


#: ``tokenize --file`` reads at most this many bytes. tokenizers keeps ~130 bytes per
#: input byte while it encodes (measured: a 6 MB text peaks at ~0.8 GB), so 16 MiB stays
#: near 2 GB; split a larger text and tokenize the parts.
MAX_TEXT_FILE_BYTES = 16 << 20


def read_input_file(path: Path | str, what: str, limit: int) -> bytes:
    """The bytes of a user-given input file ("-" is stdin), refusing what is not a regular
    file (a FIFO would block, /dev/zero never ends) and anything over ``limit`` bytes.

    Raises:
        SterError: missing, unreadable, a directory, not a regular file, or larger than ``limit``.
    """
    too_big = (f"the {what} {path} is larger than {limit} bytes ({limit >> 20} MiB), ster's limit for it; "
               "give a smaller file")
    if str(path) == "-":
        data = sys.stdin.buffer.read(limit + 1)
        if len(data) > limit:
            raise SterError(too_big.replace(f" {path} ", " on stdin "))
        return data
    from .files import FileTooLarge, NotRegularFile, read_bounded
    try:
        return read_bounded(path, limit)
    except NotRegularFile as e:
        if e.directory:
            raise SterError(f"the {what} {path} is a directory; give a file in it") from None
        raise SterError(f"the {what} {path} is not a regular file (a pipe, device or directory); "
                        "save the content to a file and give that") from None
    except FileTooLarge:
        raise SterError(too_big) from None
    except FileNotFoundError:
        raise SterError(f"{what} not found: {path} (cannot read it: no such file)") from None
    except OSError as e:
        raise SterError(f"cannot read the {what} {path}: {e.strerror or e}") from None


def without_final_newline(text: str) -> str:
    """A prompt file's text as the message it stands for: one final line break ("\n" or "\r\n") dropped,
    as llama.cpp's ``-f`` drops it (an editor or ``echo`` ends a file with one; sent, it changes the answer).
    Other whitespace, a second line break included, is the file's text and stays."""
    return text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text


def _read_text(text: Optional[str], file: Optional[Path]) -> str:
    if (text is None) == (file is None):
        raise SterError("give the text to tokenize with exactly one of --text STRING or --file FILE")
    if text is not None:
        return text
    data = read_input_file(file, "text file", MAX_TEXT_FILE_BYTES)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SterError(f"{file} is not UTF-8 text (invalid byte at offset {e.start}); convert it to UTF-8") from None


_ID = re.compile(r"-?[0-9]+")


def _parse_ids(values: List[str], vocab_size: int) -> list[int]:
    """Token ids from arguments: each may hold several, separated by commas or spaces, as a list in one pair of
    brackets or not (``tokenize --json``'s ``[1, 2, 3]``, quoted as one argument or not: ``[1`` ``2`` ``3]``).

    Raises:
        SterError: an empty item between commas (``1,,2``, a comma at an end: once skipped in silence), named by
            its position; a bracket that is not closed (``[1,2``), closes none or opens a second list inside the
            first; an item that is not a whole number; no id at all; an id outside the vocabulary.
    """
    ids, opened = [], None   # opened: the argument whose "[" is not closed yet
    usage = "give ids like `ster detokenize 15496 995`, 15496,995 or [15496, 995]"
    for value in values:
        inner = value.strip()
        if inner.startswith("["):
            if opened is not None:
                raise SterError(f"{inner[:40]!r}: a second '[' before the one of {opened[:40]!r} is closed; {usage}")
            opened, inner = value.strip(), inner[1:]
        if inner.endswith("]"):
            if opened is None:
                raise SterError(f"{inner[:40]!r}: a ']' closes no '['; {usage}")
            opened, inner = None, inner[:-1]
        if "[" in inner or "]" in inner:
            raise SterError(f"{value.strip()[:40]!r}: a bracket inside the ids; {usage}")
        parts = inner.split(",")
        items = []
        for part in parts:
            if not part.strip() and any(p.strip() for p in parts):   # a lone "," is no id at all (below)
                position = len(ids) + len(items) + 1
                raise SterError(f"{value.strip()[:40]!r}: item {position} is empty; separate token ids by one "
                                "comma or by spaces, like `ster detokenize 15496,995`")
            items += part.split()
        for item in items:
            # ASCII digits only: int() would also take "+5", "1_000" and other scripts' digits.
            if not _ID.fullmatch(item):
                shown = item if len(item) <= 24 else item[:20] + "..."
                raise SterError(f"{shown!r} is not a token id; give whole numbers like `ster detokenize 15496 995` "
                                "(or 15496,995)")
            if len(item) > 24:  # no vocabulary is that big; keep the message short
                raise SterError(f"token id {item[:20]}... ({len(item)} digits) is outside this vocabulary "
                                f"(ids 0..{vocab_size - 1})")
            ids.append(int(item))
    if opened is not None:
        raise SterError(f"{opened[:40]!r}: the '[' is never closed; {usage}")
    if not ids:
        raise SterError("no token ids given; give whole numbers like `ster detokenize 15496 995` (or 15496,995)")
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise SterError(f"token id {bad[0]} is outside this vocabulary (ids 0..{vocab_size - 1})"
                        + (f"; {len(bad) - 1} more id(s) are too" if len(bad) > 1 else ""))
    return ids


@app.command(context_settings=BARE_ARGUMENT)   # `ster tokenize "text"` gets advice, not "extra argument"
def tokenize(
    ctx: typer.Context,
    model: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    text: Optional[str] = typer.Option(None, "--text", "-t", help="The text to tokenize."),
    file: Optional[Path] = typer.Option(None, "--file", "-f", help="A UTF-8 file whose whole content is tokenized."),
    special: bool = flag(True, "--special/--no-special", help="Add the model's own special tokens around "
                                 "the text (BOS, EOS, BERT's [CLS]/[SEP]), as a prompt gets them."),
    parse_special: bool = flag(False, "--parse-special/--no-parse-special", help="Read special-token "
                                       "texts in the input (<|im_end|>, <s>) as those tokens (llama.cpp's "
                                       "parse_special, transformers' split_special_tokens=False); by default "
                                       "they are tokenized as plain text."),
    pieces: bool = flag(False, "--pieces", help="Print one id and its vocabulary piece per line."),
    revision: Optional[str] = typer.Option(None, help="Hub branch, tag or commit."),
    as_json: bool = flag(False, "--json", help='Print {"ids": [...], "tokens": [...], "count": n}.'),
    quiet: bool = flag(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Print the token ids of a text (no weights are loaded)."""
    from .load import load_tokenizer

    refuse_bare_argument(ctx, "tokenize takes the text with --text (-t) or a file with --file (-f), e.g. "
                              "ster tokenize -t \"Hello world\"")
    content = _read_text(text, file)
    with progress_bar(enabled=not quiet, what="loading tokenizer") as progress:
        tokenizer = load_tokenizer(_model_or_default(model), revision, progress=progress)
    warn(getattr(tokenizer, "notes", ()))  # a GGUF special token id outside the vocabulary, ignored as loading ignores it
    # tokenizers' encode_special_tokens=True tokenizes special texts as plain text.
    tokenizer.tk.encode_special_tokens = not parse_special
    ids = tokenizer.encode(content, add_special_tokens=special)
    tokens = [tokenizer.id_to_token(i) for i in ids]
    if as_json:
        print(json.dumps({**version_fields(), "ids": ids, "tokens": tokens, "count": len(ids)}, ensure_ascii=False))
        return
    if pieces:  # id <TAB> piece as a JSON string (pieces may hold spaces, tabs, newlines)
        _write("".join(f"{i}\t{json.dumps(piece, ensure_ascii=False)}\n" for i, piece in zip(ids, tokens)))
    else:
        _write(" ".join(map(str, ids)) + "\n")
    if not quiet:
        err.print(f"[dim]{plural(len(ids), 'token')}[/]")


@app.command()
def detokenize(
    ids: List[str] = typer.Argument(..., help="Token ids, as separate arguments or comma-separated."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    skip_special: bool = flag(False, "--skip-special/--no-skip-special", help="Leave special tokens "
                                      "(BOS, EOS, <|im_end|>...) out of the text."),
    revision: Optional[str] = typer.Option(None, help="Hub branch, tag or commit."),
    as_json: bool = flag(False, "--json", help='Print {"text": ..., "ids": [...], "count": n}.'),
    quiet: bool = flag(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Print the text of token ids (no weights are loaded)."""
    from .load import load_tokenizer

    with progress_bar(enabled=not quiet, what="loading tokenizer") as progress:
        tokenizer = load_tokenizer(_model_or_default(model), revision, progress=progress)
    warn(getattr(tokenizer, "notes", ()))  # a GGUF special token id outside the vocabulary, ignored as loading ignores it
    token_ids = _parse_ids(ids, tokenizer.vocab_size)
    text = tokenizer.decode(token_ids, skip_special_tokens=skip_special)
    if as_json:
        print(json.dumps({**version_fields(), "text": text, "ids": token_ids, "count": len(token_ids)},
                         ensure_ascii=False))
        return
    _write(text + "\n")
