"""PLaMo's own tokenizer (``tokenizer.jsonl``) as a ``tokenizers`` Unigram model.

PLaMo 2 and PLaMo 3 checkpoints ship ``tokenizer.jsonl`` instead of tokenizer.json: one JSON row
``[piece, score, kind, ...]`` per token id, kind one of NORMAL, CONTROL, UNKNOWN, BYTE (and, in
files other tools wrote, USER_DEFINED or UNUSED). PLaMo's remote-code tokenizer
(``tokenization_plamo.py``) and llama.cpp's ``plamo2`` vocabulary (``src/llama-vocab.cpp``,
``llm_tokenizer_plamo2``) split a text into the pieces whose summed score is highest, scores taken
to 1e-4 (they compare ``round(score * 1e4)`` as integers); a character no piece covers costs
1000 (``UNKNOWN_SCORE`` -1e7 / 1e4) and is spelled as its UTF-8 ``<0xXX>`` byte tokens; byte pieces
are not matched in text. That is a Unigram model with byte fallback (seed 002), which this module
builds with the ``tokenizers`` library so that the rest of ster reads it as it reads a tokenizer.json:

- scores are rounded to 1e-4 as PLaMo's code rounds them;
- ``tokenizers`` charges an uncovered character the lowest score of the vocabulary minus 10, so the
  byte pieces get ``BYTE_SCORE`` (-990) and no piece is scored below it: an uncovered character then
  costs exactly 1000, as in PLaMo's code. (A piece scored below -990 is raised to it; a spelled-out
  ``<0xXX>`` in a text is split as text unless one of its characters has no piece.)
- CONTROL and UNKNOWN pieces are special tokens (cut out of the text first);
- from the directory only (PLaMo's Python tokenizer, not llama.cpp's): a ``<|plamo:...|>`` marker
  and the stretches ``break_around_repeated_chars_threshold`` (that many equal characters in a row)
  and ``break_around_consecutive_spaces_threshold`` (that many spaces) of tokenizer_config.json are
  split off before the search, and BOS / EOS are added under ``add_bos_token`` / ``add_eos_token``.

Ties between equally scored splits may resolve differently from PLaMo's and llama.cpp's code.

The file is untrusted: its kind and size are checked before it is read, and every row's types and
lengths before any is used; the 256 byte pieces must all be present.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors

from .errors import SterError
from .files import read_regular

#: Real files are a few MB (PLaMo 2's 100,000 rows: about 4 MB).
MAX_JSONL_BYTES = 64 << 20
MAX_PIECES = 1 << 21
MAX_PIECE_CHARS = 1024
#: Scores are log-probabilities (PLaMo 2's lie in -30..0); a bound keeps ``round(score * 1e4)`` finite.
MAX_ABS_SCORE = 1e30
#: The kinds a row may name (llama.cpp's token types by name).
KINDS = ("NORMAL", "CONTROL", "UNKNOWN", "BYTE", "USER_DEFINED", "UNUSED")
#: The score given to byte pieces and the floor of every other: tokenizers' unknown cost is the
#: lowest score minus 10, which makes it PLaMo's 1000.
BYTE_SCORE = -990.0
#: PLaMo's marker pattern (tokenization_plamo.py isolates every match before the search).
PLAMO_MARKER = r"<\|plamo:[^|\s]{0,64}\|>"


def read_jsonl(path: str | Path) -> tuple[list[str], list[float], list[str]]:
    """The rows of a ``tokenizer.jsonl``: (pieces, scores, kinds), indexed by token id.

    Args:
        path: the file; each non-blank line a JSON array ``[piece (str), score (number), kind (str), ...]``
            (kind NORMAL when absent; further entries ignored, as PLaMo's code ignores them).

    Returns:
        (list[str], list[float], list[str]) of n rows each.

    Raises:
        SterError: not a regular file or over ``MAX_JSONL_BYTES``; a row that is not such an array, a piece
            empty or over ``MAX_PIECE_CHARS`` characters, a score not a finite number, an unknown kind, a
            BYTE row not spelled ``<0xXX>``; a piece listed twice; a byte of the 256 without its piece.
    """
    where = f"failed to load tokenizer {path}"
    data = read_regular(path, "", MAX_JSONL_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SterError(f"{where}: it is not UTF-8 text ({error.reason} at byte {error.start}); "
                        "re-download it") from None
    lines = [(n, line) for n, line in enumerate(text.split("\n"), 1) if line.strip()]
    if not lines or len(lines) > MAX_PIECES:
        raise SterError(f"{where}: it holds {len(lines)} rows, not a PLaMo vocabulary of 256..{MAX_PIECES} pieces; "
                        "re-download it")
    pieces: list[str] = []
    scores: list[float] = []
    kinds: list[str] = []
    bad = "is not a [piece, score, kind] row of PLaMo's tokenizer.jsonl; re-download it"
    for n, line in lines:
        if len(line) > 4 * MAX_PIECE_CHARS + 4096:
            raise SterError(f"{where}: line {n} is {len(line)} characters long; {bad}")
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            raise SterError(f"{where}: line {n} is not JSON; {bad}") from None
        if not isinstance(row, list) or len(row) < 2:
            raise SterError(f"{where}: line {n} {bad}")
        piece, score = row[0], row[1]
        kind = row[2] if len(row) > 2 else "NORMAL"
        if not isinstance(piece, str) or not 0 < len(piece) <= MAX_PIECE_CHARS:
            raise SterError(f"{where}: line {n}'s piece is not a string of 1..{MAX_PIECE_CHARS} characters; {bad}")
        if any("\ud800" <= c <= "\udfff" for c in piece):
            raise SterError(f"{where}: line {n}'s piece holds a lone surrogate (not a Unicode character); {bad}")
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            raise SterError(f"{where}: line {n}'s score {str(score)[:40]!r} is not a finite number; {bad}")
        if abs(score) > MAX_ABS_SCORE:
            raise SterError(f"{where}: line {n}'s score {score:g} is out of range (a log-probability, "
                            f"|score| <= {MAX_ABS_SCORE:g}); {bad}")
        if kind not in KINDS:
            raise SterError(f"{where}: line {n}'s kind {str(kind)[:40]!r} is none of {', '.join(KINDS)}; {bad}")
        if kind == "BYTE" and _byte_of(piece) is None:
            raise SterError(f"{where}: line {n} is a BYTE row whose piece {piece[:40]!r} is not <0xXX>; {bad}")
        pieces.append(piece)
        scores.append(float(score))
        kinds.append(kind)
    if len(set(pieces)) != len(pieces):
        seen: set[str] = set()
        twice = next(p for p in pieces if p in seen or seen.add(p))  # type: ignore[func-returns-value]
        raise SterError(f"{where}: the piece {twice[:40]!r} is listed twice; re-download it")
    _byte_ids(pieces, kinds, where)
    return pieces, scores, kinds


def _byte_of(piece: str) -> int | None:
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        digits = piece[3:5]
        if all(c in "0123456789abcdefABCDEF" for c in digits):
            return int(digits, 16)
    return None


def _byte_ids(pieces: Sequence[str], kinds: Sequence[str], where: str) -> list[int]:
    ids = [-1] * 256
    for i, (piece, kind) in enumerate(zip(pieces, kinds)):
        if kind == "BYTE":
            ids[_byte_of(piece)] = i  # type: ignore[index]
    if -1 in ids:
        raise SterError(f"{where}: the byte <0x{ids.index(-1):02X}> has no BYTE piece, so a character without "
                        "a piece could not be spelled; re-download it")
    return ids


def build(pieces: Sequence[str], scores: Sequence[float], kinds: Sequence[str], unk_id: int, *,
          specials: Sequence[int] = (), marker: bool = False, repeated_chars: int | None = None,
          consecutive_spaces: int | None = None) -> tokenizers.Tokenizer:
    """A ``tokenizers.Tokenizer`` that splits as PLaMo's tokenizer and llama.cpp's ``plamo2`` do.

    Args:
        pieces, scores, kinds: the vocabulary (``read_jsonl``'s rows, or a GGUF's tokens, scores and types
            spelled as kinds); ids are the list positions.
        unk_id: the unknown piece's id (never emitted: uncovered characters become byte tokens).
        specials: ids added as special tokens (cut out of the text before the search).
        marker: isolate every ``<|plamo:...|>`` text before the search (PLaMo's own code).
        repeated_chars, consecutive_spaces: PLaMo's break-around thresholds (None: off); a run of at
            least that many equal characters / spaces is split off and tokenized on its own.

    Raises:
        SterError: fewer than 256 byte pieces, pieces over ``check_unigram_pieces``' bounds, or a
            threshold that is not a positive integer.
    """
    from .gguf.tokenizer import check_unigram_pieces

    where = "failed to build PLaMo's tokenizer"
    check_unigram_pieces(pieces, where)
    _byte_ids(pieces, kinds, where)
    lattice = [BYTE_SCORE if k == "BYTE" else max(round(s * 1e4) / 1e4, BYTE_SCORE) for s, k in zip(scores, kinds)]
    tk = tokenizers.Tokenizer(models.Unigram(list(zip(pieces, lattice)), unk_id=unk_id, byte_fallback=True))
    tk.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    cuts = [PLAMO_MARKER] if marker else []
    for name, value, pattern in (("break_around_repeated_chars_threshold", repeated_chars, r"(.)\1{%d,}"),
                                 ("break_around_consecutive_spaces_threshold", consecutive_spaces, " {%d,}")):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 16:
            raise SterError(f"{where}: tokenizer_config.json's {name} is {str(value)[:40]!r}, not a count of "
                            "1..65536; fix the file")
        cuts.append(pattern % (value - 1 if "(.)" in pattern else value))
    if cuts:
        # One alternation, as PLaMo's code matches it (the marker first, in a pass of its own).
        steps = [pre_tokenizers.Split(Regex(PLAMO_MARKER), behavior="isolated")] if marker else []
        rest = [c for c in cuts if c != PLAMO_MARKER]
        if rest:
            steps.append(pre_tokenizers.Split(Regex("|".join(rest)), behavior="isolated"))
        tk.pre_tokenizer = pre_tokenizers.Sequence(steps)
    if specials:
        tk.add_special_tokens([AddedToken(pieces[i], special=True, normalized=False) for i in sorted(specials)])
    return tk


def from_jsonl(path: Path, config: Mapping[str, Any], config_file: Path) -> tokenizers.Tokenizer:
    """The tokenizer of a checkpoint that ships ``tokenizer.jsonl`` instead of tokenizer.json.

    Args:
        path: the ``tokenizer.jsonl``.
        config: tokenizer_config.json's object ({} when absent): ``unk_token``, ``bos_token``,
            ``eos_token``, ``add_bos_token``, ``add_eos_token`` (PLaMo's default: neither added),
            ``break_around_repeated_chars_threshold``, ``break_around_consecutive_spaces_threshold``.
        config_file: its path, for messages.

    Raises:
        SterError: a file ``read_jsonl`` refuses; no unknown piece (no UNKNOWN row and no ``unk_token`` in
            the vocabulary); a BOS/EOS to be added that the vocabulary lacks; a bad threshold.
    """
    pieces, scores, kinds = read_jsonl(path)
    index = {p: i for i, p in enumerate(pieces)}
    unk = next((i for i, k in enumerate(kinds) if k == "UNKNOWN"), None)
    if unk is None:
        unk = index.get(_text(config.get("unk_token", "<|plamo:unk|>")) or "")
    if unk is None:
        raise SterError(f"failed to load tokenizer {path}: it has no UNKNOWN row and tokenizer_config.json's "
                        "unk_token is not one of its pieces; re-download the tokenizer files")
    specials = [i for i, k in enumerate(kinds) if k in ("CONTROL", "UNKNOWN")]
    tk = build(pieces, scores, kinds, unk, specials=specials, marker=True,
               repeated_chars=config.get("break_around_repeated_chars_threshold"),
               consecutive_spaces=config.get("break_around_consecutive_spaces_threshold"))
    ends = []
    for flag, key, default in (("add_bos_token", "bos_token", "<|plamo:bos|>"),
                               ("add_eos_token", "eos_token", "<|plamo:eos|>")):
        if config.get(flag) is not True:
            continue
        text = _text(config.get(key, default))
        if text not in index:
            raise SterError(f"failed to load tokenizer {config_file}: {flag} is true but its {key} {str(text)[:40]!r} "
                            f"is not a piece of {path}; fix the file")
        ends.append((key, text))
    if ends:
        head = [t for k, t in ends if k == "bos_token"]
        tail = [t for k, t in ends if k == "eos_token"]
        names = {t: f"T{n}" for n, t in enumerate(head + tail)}
        single = [names[t] for t in head] + ["$A"] + [names[t] for t in tail]
        pair = single + [f"{names[t]}:1" for t in head] + ["$B:1"] + [f"{names[t]}:1" for t in tail]
        tk.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=[
            {"id": names[t], "ids": [index[t]], "tokens": [t]} for t in head + tail])
    return tk


def _text(value: Any) -> str | None:
    """A token named in tokenizer_config.json: a string or an ``{"content": ...}`` object."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None
