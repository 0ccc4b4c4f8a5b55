"""tiktoken rank files (GLM-4's ``tokenizer.model``, Kimi's ``tiktoken.model``) as ``tokenizers`` BPE.

Checkpoints that publish no tokenizer.json may ship the rank file tiktoken reads: one
``base64(token bytes) rank`` line per token id. tiktoken splits a text by its pattern, keeps
a piece that is itself a token whole, and merges the rest pair by pair, lowest rank of the
merged bytes first. That is a byte-level BPE whose merges are recovered from the ranks (every
split of a token into two tokens is a merge, ordered by the merged token's rank, as Transformers'
``TikTokenConverter`` recovers them) with ``ignore_merges``, so this module writes it as a
``tokenizers.Tokenizer`` and the rest of ster reads it as it reads a tokenizer.json (seed 002).

The file is untrusted: its kind and size are checked before it is read, every line must be
``<base64> <decimal rank>``, the ranks must be the ids ``0..n-1`` once each, the tokens distinct
and bounded in length, and the 256 single bytes must all be tokens (else a text holding a missing
byte could not be encoded).
"""
from __future__ import annotations

import binascii
from pathlib import Path
from typing import Mapping

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors

from .errors import SterError
from .files import read_regular

#: ChatGLM4Tokenizer's split pattern (GLM-4's tokenization_chatglm.py: cl100k's).
GLM4_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
#: GLM-4 starts every sequence encoded with special tokens with these two (its build_inputs_with_special_tokens).
GLM4_PREFIX = ("[gMASK]", "<sop>")
#: Kimi's TikTokenTokenizer split pattern (Han runs apart; letters split at case changes).
KIMI_PATTERN = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
#: Kimi's special-token ids follow the ranks: this many, named by added_tokens_decoder or reserved.
KIMI_SPECIAL_COUNT = 256

#: Real rank files are a few MB (GLM-4's 151,329 lines: 2.6 MB).
MAX_RANK_FILE_BYTES = 64 << 20
MAX_RANKS = 1 << 21
MAX_TOKEN_BYTES = 1024


def _byte_chars() -> list[str]:
    """GPT-2's byte-to-unicode map: byte b -> the printable character byte-level BPE spells it with."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


_BYTE_CHARS = _byte_chars()
_SPELLING = dict(enumerate(_BYTE_CHARS))  # str.translate table: latin-1 code point -> byte-level character
#: A byte-level BPE spelling's character -> the byte it stands for (``_BYTE_CHARS`` inverted).
BYTE_OF = {c: b for b, c in enumerate(_BYTE_CHARS)}


def _spelled(token: bytes) -> str:
    return token.decode("latin-1").translate(_SPELLING)


def read_ranks(path: str | Path) -> list[bytes]:
    """The tokens of a tiktoken rank file, indexed by rank (the token id).

    Args:
        path: the file (``tokenizer.model`` / ``tiktoken.model``): lines ``<base64> <rank>``.

    Returns:
        list[bytes] of n tokens; token i has rank i.

    Raises:
        SterError: not a regular file, over ``MAX_RANK_FILE_BYTES``, a line not ``<base64> <rank>``,
            ranks that are not 0..n-1 once each, a repeated or over-long token, or one of the 256
            single bytes missing.
    """
    where = f"failed to load tokenizer {path}"
    data = read_regular(path, "", MAX_RANK_FILE_BYTES)
    lines = data.split(b"\n")
    if lines and lines[-1].strip() == b"":
        lines.pop()
    if not lines or len(lines) > MAX_RANKS:
        raise SterError(f"{where}: it holds {len(lines)} lines, not a tiktoken rank file of 256..{MAX_RANKS} "
                        "tokens; re-download it")
    tokens: list[bytes | None] = [None] * len(lines)
    for n, line in enumerate(lines, 1):
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit() or len(parts[1]) > 9:
            raise SterError(f"{where}: line {n} is not '<base64 token> <rank>' (a tiktoken rank file); "
                            "re-download it")
        try:
            token = binascii.a2b_base64(parts[0], strict_mode=True)
        except (binascii.Error, ValueError):
            raise SterError(f"{where}: line {n} holds no valid base64 token; re-download it") from None
        rank = int(parts[1])
        if not token or len(token) > MAX_TOKEN_BYTES:
            raise SterError(f"{where}: line {n} holds a token of {len(token)} bytes (1..{MAX_TOKEN_BYTES} allowed)")
        if rank >= len(lines) or tokens[rank] is not None:
            raise SterError(f"{where}: line {n} gives rank {rank}, but the ranks must be the token ids "
                            f"0..{len(lines) - 1}, each once; re-download it")
        tokens[rank] = token
    _check_byte_level(tokens, where, "is not a token")  # type: ignore[arg-type]
    return tokens  # type: ignore[return-value]


def _check_byte_level(tokens: list[bytes], where: str, absent: str) -> None:
    """Ranked tokens byte-level BPE can use: none listed twice, every single byte among them.

    Raises:
        SterError: naming the file (``where``) and the first missing byte (``absent`` says where it is not).
    """
    if len(set(tokens)) != len(tokens):
        raise SterError(f"{where}: a token is listed under two ranks; re-download it")
    have = {t for t in tokens if len(t) == 1}
    if len(have) != 256:
        missing = next(b for b in range(256) if bytes([b]) not in have)
        raise SterError(f"{where}: the single byte {missing:#04x} {absent}, so byte-level BPE cannot encode "
                        "every text; re-download it")


def _merges(tokens: list[bytes]) -> list[tuple[str, str]]:
    """The merges of a rank list: each split of a token into two tokens, by the token's rank, then by
    the parts' ranks (Transformers' TikTokenConverter's recovery)."""
    rank = {t: i for i, t in enumerate(tokens)}
    spelled = [_spelled(t) for t in tokens]
    get = rank.get
    out: list[tuple[str, str]] = []
    for token in tokens:
        local = []
        for k in range(1, len(token)):
            a = get(token[:k])
            if a is not None:
                b = get(token[k:])
                if b is not None:
                    local.append((a, b))
        if len(local) > 1:
            local.sort()
        out.extend([(spelled[a], spelled[b]) for a, b in local])
    return out


def build(tokens: list[bytes], pattern: str, specials: Mapping[int, str],
          prefix: tuple[str, ...] = ()) -> tokenizers.Tokenizer:
    """A ``tokenizers.Tokenizer`` that encodes as tiktoken does with these ranks and ``pattern``.

    Args:
        tokens: ``read_ranks``' list (token i has id i).
        pattern: the split regex (``GLM4_PATTERN``, ``KIMI_PATTERN``).
        specials: id -> text of the special tokens; their ids must follow the ranks without a gap.
        prefix: special-token texts put before every sequence encoded with special tokens.

    Raises:
        SterError: special ids that do not continue the ranks, or a prefix token that is not a special.
    """
    vocab = {_spelled(t): i for i, t in enumerate(tokens)}
    model = models.BPE(vocab=vocab, merges=_merges(tokens), ignore_merges=True)
    tk = tokenizers.Tokenizer(model)
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    ids = sorted(specials)
    if ids and ids != list(range(len(tokens), len(tokens) + len(ids))):
        raise SterError(f"the special tokens' ids ({ids[0]}..{ids[-1]}, {len(ids)} of them) do not follow the "
                        f"{len(tokens)} ranks without a gap; ster reads only such rank files")
    for i in ids:
        tk.add_special_tokens([AddedToken(specials[i], special=True, normalized=False)])
    got = [tk.token_to_id(s) for s in prefix]
    if any(i is None or i < len(tokens) for i in got):
        raise SterError(f"the special tokens {', '.join(prefix)} that start every sequence are not all among the "
                        "tokenizer's added tokens (tokenizer_config.json's added_tokens_decoder)")
    if prefix:
        template = " ".join(prefix) + " $A"
        tk.post_processor = processors.TemplateProcessing(
            single=template, pair=template + " $B:1", special_tokens=list(zip(prefix, got)))
    return tk


def specials_of(config: Mapping, file: str | Path) -> dict[int, str]:
    """tokenizer_config.json's ``added_tokens_decoder`` as id -> text (entries as strings or objects).

    Raises:
        SterError: a key that is not a decimal id, or an entry without text.
    """
    decoder = config.get("added_tokens_decoder") or {}
    if not isinstance(decoder, Mapping):
        raise SterError(f"failed to load tokenizer {file}: added_tokens_decoder is not an object of "
                        '"id": token entries; fix the file')
    out: dict[int, str] = {}
    for key, value in decoder.items():
        text = value.get("content") if isinstance(value, Mapping) else value
        is_id = isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 9
        if not is_id or not isinstance(text, str):
            raise SterError(f"failed to load tokenizer {file}: added_tokens_decoder entry {str(key)[:40]!r} is not "
                            "a token id with its text; fix the file")
        out[int(key)] = text
    return out


def from_rank_file(path: Path, tokenizer_class: str, config: Mapping, config_file: Path) -> tokenizers.Tokenizer:
    """The tokenizer of a checkpoint that ships a rank file instead of tokenizer.json.

    ``ChatGLM4Tokenizer`` (``tokenizer.model``): GLM-4's pattern, ``added_tokens_decoder``'s specials after
    the ranks, ``[gMASK]<sop>`` first in every sequence encoded with special tokens. ``TikTokenTokenizer``
    (``tiktoken.model``): Kimi's pattern and its 256 special ids after the ranks, those
    ``added_tokens_decoder`` does not name spelled ``<|reserved_token_{id}|>``; nothing added.

    Raises:
        SterError: another tokenizer class, or a file ``read_ranks`` / ``build`` refuses.
    """
    tokens = read_ranks(path)
    named = specials_of(config, config_file)
    if tokenizer_class == "ChatGLM4Tokenizer":
        return build(tokens, GLM4_PATTERN, named, GLM4_PREFIX)
    if tokenizer_class == "TikTokenTokenizer":
        n = len(tokens)
        if any(not n <= i < n + KIMI_SPECIAL_COUNT for i in named):
            raise SterError(f"failed to load tokenizer {config_file}: added_tokens_decoder names ids outside "
                            f"{n}..{n + KIMI_SPECIAL_COUNT - 1}, the special ids after the ranks of {path}")
        specials = {i: named.get(i, f"<|reserved_token_{i}|>") for i in range(n, n + KIMI_SPECIAL_COUNT)}
        return build(tokens, KIMI_PATTERN, specials)
    raise SterError(f"failed to load tokenizer {path}: tokenizer_config.json names the tokenizer class "
                    f"{tokenizer_class!r}; ster reads a rank file only for ChatGLM4Tokenizer (tokenizer.model) and "
                    "TikTokenTokenizer (tiktoken.model). Use a checkpoint that ships tokenizer.json")


# ---------------------------------------------------------------- Mistral's tekken.json

#: Mistral's tokenizer file in its own checkpoint format (Mistral NeMo and later; mistral_common's Tekkenizer).
TEKKEN = "tekken.json"
#: Real tekken.json files are ~15-20 MB (131,072 ranks as base64 and text, plus the special tokens).
MAX_TEKKEN_BYTES = 128 << 20
MAX_SPECIALS = 1 << 16


def read_tekken(path: str | Path) -> tuple[list[bytes], str, list[tuple[str, bool]]]:
    """The parts of a Mistral ``tekken.json``: the ranks kept, the split pattern, the special tokens.

    A tekken.json holds ``vocab`` (objects ``{rank, token_bytes (base64), token_str}``), ``config``
    (``pattern``, ``default_vocab_size``, ``default_num_special_tokens``, ...) and ``special_tokens``
    (objects ``{rank, token_str, is_control}``; an older file without this list is refused, its specials
    being mistral_common's own). mistral_common's Tekkenizer (read by llama.cpp's converter,
    ``gguf-py`` ``MistralVocab``) gives the special tokens ids ``0..n_special-1`` (those the list does not
    name are ``<SPECIAL_{i}>``; n_special defaults to the list's length) and rank r the id ``r + n_special``,
    keeping the first ``default_vocab_size - n_special`` ranks (all when the size is absent), as Transformers'
    ``MistralConverter`` also does.

    Args:
        path: the tekken.json file (untrusted: its kind and size are checked before it is parsed).

    Returns:
        (tokens, pattern, specials): ``tokens[r]`` the bytes of rank r (list[bytes], cut as above),
        ``pattern`` the split regex, ``specials[i]`` = (text, is_control) for id i, ``n_special`` entries.

    Raises:
        SterError: not a regular file, over ``MAX_TEKKEN_BYTES``, not JSON, a missing or mistyped field,
            invalid base64, ranks that are not 0..n-1 once each, a repeated or over-long token, a vocabulary
            smaller than its sizes say, or one of the 256 single bytes missing from the ranks kept.
    """
    import json

    where = f"failed to load tokenizer {path}"
    data = read_regular(path, "", MAX_TEKKEN_BYTES)
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        raise SterError(f"{where}: it is not valid JSON; re-download it") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("vocab"), list) or not isinstance(doc.get("config"), dict):
        raise SterError(f"{where}: it is not a Mistral tekken.json (an object with a 'vocab' list and a 'config' "
                        "object); re-download it")
    config, vocab = doc["config"], doc["vocab"]

    def size(key: str, low: int, high: int) -> int:
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise SterError(f"{where}: config.{key} is {repr(value)[:40]}, not an integer in {low}..{high}; "
                            "re-download it")
        return value

    listed = doc.get("special_tokens")
    if not isinstance(listed, list) or len(listed) > MAX_SPECIALS:
        raise SterError(f"{where}: it has no special_tokens list (an older tekken.json, whose special tokens only "
                        "mistral_common knows), which ster does not read; use the model's tokenizer.json")
    if config.get("default_num_special_tokens") is None:  # mistral_common: as many as listed
        config["default_num_special_tokens"] = len(listed)
    n_special = size("default_num_special_tokens", len(listed), MAX_SPECIALS)
    if config.get("default_vocab_size") is None:  # every rank is used
        config["default_vocab_size"] = len(vocab) + n_special
    total = size("default_vocab_size", n_special + 256, MAX_RANKS + n_special)
    pattern = config.get("pattern")
    if not isinstance(pattern, str) or not pattern or len(pattern) > 4096:
        raise SterError(f"{where}: config.pattern is not the split regex (a non-empty string); re-download it")
    keep = total - n_special
    if len(vocab) < keep or len(vocab) > MAX_RANKS:
        raise SterError(f"{where}: its vocab lists {len(vocab)} tokens, but config.default_vocab_size - "
                        f"default_num_special_tokens = {keep} are used (at most {MAX_RANKS}); re-download it")
    tokens: list[bytes | None] = [None] * len(vocab)
    for n, entry in enumerate(vocab):
        rank = entry.get("rank") if isinstance(entry, dict) else None
        text = entry.get("token_bytes") if isinstance(entry, dict) else None
        if isinstance(rank, bool) or not isinstance(rank, int) or not isinstance(text, str):
            raise SterError(f"{where}: vocab entry {n} is not {{rank: integer, token_bytes: base64 string}}; "
                            "re-download it")
        if not 0 <= rank < len(vocab) or tokens[rank] is not None:
            raise SterError(f"{where}: vocab entry {n} gives rank {rank}, but the ranks must be 0..{len(vocab) - 1}, "
                            "each once; re-download it")
        try:
            token = binascii.a2b_base64(text.encode("ascii"), strict_mode=True)
        except (binascii.Error, ValueError, UnicodeEncodeError):
            raise SterError(f"{where}: vocab entry {n} holds no valid base64 token_bytes; re-download it") from None
        if not token or len(token) > MAX_TOKEN_BYTES:
            raise SterError(f"{where}: vocab entry {n} holds a token of {len(token)} bytes "
                            f"(1..{MAX_TOKEN_BYTES} allowed); re-download it")
        tokens[rank] = token
    kept: list[bytes] = tokens[:keep]  # type: ignore[assignment]
    _check_byte_level(kept, where, f"is not among the {keep} ranks used")
    specials: list[tuple[str, bool] | None] = [None] * n_special
    for n, entry in enumerate(listed):
        rank = entry.get("rank") if isinstance(entry, dict) else None
        text = entry.get("token_str") if isinstance(entry, dict) else None
        control = entry.get("is_control", True) if isinstance(entry, dict) else None
        if (isinstance(rank, bool) or not isinstance(rank, int) or not isinstance(text, str) or not text
                or len(text) > MAX_TOKEN_BYTES or not isinstance(control, bool)):
            raise SterError(f"{where}: special_tokens entry {n} is not {{rank: integer, token_str: text, "
                            "is_control: boolean}; re-download it")
        if not 0 <= rank < len(listed) or specials[rank] is not None:
            raise SterError(f"{where}: special_tokens entry {n} gives rank {rank}, but the special ranks must be "
                            f"0..{len(listed) - 1}, each once; re-download it")
        specials[rank] = (text, control)
    for i in range(len(listed), n_special):  # mistral_common's filler names for the ids the list leaves
        specials[i] = (f"<SPECIAL_{i}>", True)
    if len({s[0] for s in specials}) != n_special:  # type: ignore[index]
        raise SterError(f"{where}: two special tokens have the same text; re-download it")
    return kept, pattern, specials  # type: ignore[return-value]


def from_tekken(path: str | Path) -> tokenizers.Tokenizer:
    """A ``tokenizers.Tokenizer`` that encodes as mistral_common's Tekkenizer (tiktoken with ``read_tekken``'s
    ranks and pattern, ids offset by the special count) and adds ``<s>`` before every sequence encoded with
    special tokens when that token exists (llama.cpp's converter writes ``add_bos`` true for tekken).

    The special tokens are added tokens at their own ids 0..n_special-1 (control tokens special, the others
    plain added tokens), so their text in a prompt (``[INST]``, ``<s>``) is that id, as a chat template needs.
    They are entries of the BPE vocabulary too (tokenizers gives an added token the id its model has for the
    text), as Transformers' ``MistralConverter`` writes them: a rank whose bytes spell a special token's text
    exactly is then encoded as that special (Transformers' conversion does the same).

    Raises:
        SterError: a file ``read_tekken`` refuses, or a pattern the regex engine rejects.
    """
    tokens, pattern, specials = read_tekken(path)
    offset = len(specials)
    vocab = {_spelled(t): i + offset for i, t in enumerate(tokens)}
    vocab.update({text: i for i, (text, _) in enumerate(specials)})
    tk = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=_merges(tokens), ignore_merges=True))
    try:
        split = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    except Exception as error:  # the regex engine's own message
        raise SterError(f"failed to load tokenizer {path}: config.pattern is not a regex the tokenizers library "
                        f"reads ({str(error)[:200]}); re-download it") from None
    tk.pre_tokenizer = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                 use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    for text, control in specials:
        added = AddedToken(text, special=control, normalized=False)
        tk.add_special_tokens([added]) if control else tk.add_tokens([added])
    bos = tk.token_to_id("<s>")
    if bos is not None and bos < offset:
        tk.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B:1",
                                                          special_tokens=[("<s>", bos)])
    return tk
