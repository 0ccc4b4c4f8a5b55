"""llama.cpp's SentencePiece BPE session (``tokenizer.ggml.model`` = "llama") on the ``sentencepiece`` library.

A SentencePiece GGUF stores pieces and scores, not merges. ``tokenizers`` can only
run BPE from a ranked merge list, and the list a big vocabulary implies is large
(Gemma 3's 262,144 pieces make 514,847 merges): deriving and building it took
1.4-2.4 s and ~400 MB, more than llama.cpp needs to load the whole file. The
``sentencepiece`` library merges by piece score natively; handed the pieces as a
model in memory it is ready in ~0.05 s.

What runs where (the behaviour is llama.cpp's ``llm_tokenizer_spm_session`` in
``src/llama-vocab.cpp``, the reference the tests compare against):

- the text is first cut at added tokens (control and unknown ones when special
  texts are parsed, user-defined ones always; leftmost-longest, with the tokens'
  lstrip/rstrip): a small ``tokenizers`` model that holds only the added tokens
  finds the cuts, so they follow the same rules as every other GGUF vocabulary
  (llama.cpp cuts the longest token text first wherever it is: the two differ
  only where two added tokens' texts overlap in the text); with special texts not
  parsed, that model holds only the user-defined tokens, as llama.cpp looks for
  no other;
- each text run between them gets a leading ▁ (``add_space_prefix``) and its spaces
  written as ▁, then ``sentencepiece`` merges adjacent symbols best score first (ties:
  leftmost), and a character left without a piece becomes its UTF-8 ``<0xHH>``
  byte tokens (those the vocabulary has: llama.cpp looks each up by its text, so
  a vocabulary with only some of the 256 still uses them). Every piece of the
  vocabulary is a merge target, as in llama.cpp
  (the model is given all pieces as NORMAL, only the unknown token as UNKNOWN);
- decoding is done here from the token texts (▁ to space, byte tokens to bytes, one
  leading space dropped with ``add_space_prefix``), as the ``tokenizers`` decoder
  chain it replaces did.

``SentencePieceBPE`` offers the part of ``tokenizers.Tokenizer``'s interface that
ster uses (``encode(...).ids``, ``decode``, vocabulary look-ups, added tokens,
``encode_special_tokens``), so ``ster_py.tokenizer.Tokenizer`` wraps it unchanged.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np
import tokenizers
from tokenizers import AddedToken, models

from ster_py.errors import SterError

__all__ = ["SentencePieceBPE", "placeholder_pieces", "sentencepiece_model_proto"]

SPACE_MARK = "\u2581"

# sentencepiece_model.proto: ModelProto.pieces = 1, .trainer_spec = 2, .normalizer_spec = 3;
# SentencePiece.piece = 1 (string), .score = 2 (float), .type = 3 (enum NORMAL = 1, UNKNOWN = 2).
_NORMAL, _UNKNOWN, _BYTE = 1, 2, 6
# TrainerSpec: model_type (3) = BPE (2), byte_fallback (35) = true or false.
_TRAINER_SPEC = {True: bytes([0x18, 0x02, 0x98, 0x02, 0x01]), False: bytes([0x18, 0x02])}
# NormalizerSpec: name (1) "identity", add_dummy_prefix (3), remove_extra_whitespaces (4) and
# escape_whitespaces (5) all false: the text arrives already escaped, nothing else may change it.
_NORMALIZER_SPEC = b"\x0a\x08identity" + bytes([0x18, 0x00, 0x20, 0x00, 0x28, 0x00])
#: Pieces whose text bytes are placed in one numpy scatter (bounds its index arrays).
_SCATTER_PIECES = 1 << 15
#: A piece's UTF-8 length must fit a two-byte varint (the caller bounds pieces at 1,024 characters).
_MAX_PIECE_BYTES = (1 << 14) - 16

# tokenizers' ByteFallback decoder takes a six-character token "<0x" + two hex digits + ">"
# (Rust's u8::from_str_radix, which also reads a leading '+').
_BYTE_TOKEN = re.compile(r"<0x(?:[0-9A-Fa-f]{2}|\+[0-9A-Fa-f])>\Z")


def _varint2(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Protobuf varints of values < 2**14: (size 1 or 2, first byte, second byte)."""
    size = 1 + (values >= 0x80)
    first = np.where(values >= 0x80, (values & 0x7F) | 0x80, values)
    return size, first, values >> 7


def sentencepiece_model_proto(pieces: Sequence[str], scores: np.ndarray, unk_id: int | None,
                              vocab: Mapping[str, int] | None = None) -> bytes:
    """A serialized sentencepiece ``ModelProto`` (BPE, byte fallback, identity normalizer).

    Args:
        pieces: the vocabulary, one non-empty text per id (n pieces).
        scores: float32-convertible [n], each piece's merge score (higher merges first).
        unk_id: the piece that is UNKNOWN; None appends a placeholder UNKNOWN piece at id n
            (sentencepiece needs one; ``SentencePieceBPE`` drops that id from its output).
        vocab: text -> id of ``pieces`` when the caller has it (saves building it here).

    Pieces past the n given (``placeholder_pieces`` lists them): the UNKNOWN placeholder, then, when
    the vocabulary holds some but not all of the 256 ``<0xHH>`` byte pieces, the missing ones typed
    BYTE in byte order (sentencepiece falls back to bytes only with all 256; llama.cpp looks each one
    up by its text, so the present ones must still be used).

    Returns:
        bytes for ``sentencepiece.SentencePieceProcessor(model_proto=...)``.

    Raises:
        SterError: a piece longer than the format here allows (~16 KB of UTF-8).

    Built with numpy, without per-piece Python work (Gemma 3's vocabulary in ~0.1 s).
    """
    texts = list(pieces)
    index = vocab if vocab is not None else dict(zip(texts, range(len(texts))))
    types = np.full(len(texts), _NORMAL, dtype=np.uint8)
    score32 = np.asarray(scores, dtype=np.float32)[: len(texts)]
    if unk_id is not None:
        types[unk_id] = _UNKNOWN
    extra = placeholder_pieces(index, unk_id)
    texts += [text for text, _ in extra]
    types = np.append(types, np.array([kind for _, kind in extra], dtype=np.uint8))
    score32 = np.append(score32, np.zeros(len(extra), dtype=np.float32))
    # sentencepiece falls back to bytes only with all 256 <0xHH> pieces typed BYTE (which it then
    # never forms by merging; llama.cpp could, from pieces such as "<0" and "x41>", which no real
    # vocabulary holds).
    byte_ids = [index.get(f"<0x{b:02X}>") for b in range(256)]
    byte_fallback = any(i is not None for i in byte_ids)
    if byte_fallback:
        types[[i for i in byte_ids if i is not None]] = _BYTE
    n = len(texts)
    try:
        flat = np.frombuffer("".join(texts).encode("utf-8"), dtype=np.uint8)
    except UnicodeEncodeError as e:
        raise SterError(f"a SentencePiece piece is not valid Unicode ({e.reason}); the tokenizer.ggml.tokens "
                        "given are corrupt") from None
    blen = _utf8_lengths(texts, flat)
    if n and int(blen.max()) > _MAX_PIECE_BYTES:
        i = int(blen.argmax())
        raise SterError(f"tokenizer.ggml.tokens[{i}] is {int(blen[i])} bytes long; ster refuses SentencePiece "
                        f"pieces over {_MAX_PIECE_BYTES} bytes. The file is corrupt or crafted; re-convert the model")
    # One piece: 0x0A len(body) body, body = 0x0A len(text) text 0x15 f32 0x18 type.
    vsize, v0, v1 = _varint2(blen)
    body = 1 + vsize + blen + 7
    bsize, b0, b1 = _varint2(body)
    total = 1 + bsize + body
    start = np.cumsum(total) - total
    trainer = _TRAINER_SPEC[byte_fallback]
    specs = bytes([0x12, len(trainer)]) + trainer + bytes([0x1A, len(_NORMALIZER_SPEC)]) + _NORMALIZER_SPEC
    out = np.empty(int(total.sum()) + len(specs), dtype=np.uint8)
    out[start] = 0x0A
    out[start + 1] = b0
    two = bsize == 2
    out[start[two] + 2] = b1[two]
    p = start + 1 + bsize
    out[p] = 0x0A
    out[p + 1] = v0
    two = vsize == 2
    out[p[two] + 2] = v1[two]
    q = p + 1 + vsize  # the text's first byte
    src = np.cumsum(blen) - blen
    # Text bytes are scattered a chunk of pieces at a time: one int64 index per byte of the whole
    # vocabulary would be 8x its UTF-8 size three times over (1.5 GB for 64 MB of crafted pieces).
    for a in range(0, n, _SCATTER_PIECES):
        b = min(a + _SCATTER_PIECES, n)
        lo, hi = int(src[a]), int(src[b - 1] + blen[b - 1])
        if hi > lo:
            out[np.repeat(q[a:b] - src[a:b], blen[a:b]) + np.arange(lo, hi)] = flat[lo:hi]
    r = q + blen
    out[r] = 0x15
    out[r[:, None] + np.arange(1, 5)] = score32.astype("<f4").view(np.uint8).reshape(n, 4)
    out[r + 5] = 0x18
    out[r + 6] = types
    out[int(total.sum()):] = np.frombuffer(specs, dtype=np.uint8)
    return out.tobytes()


def placeholder_pieces(vocab: Mapping[str, int], unk_id: int | None) -> list[tuple[str, int]]:
    """(text, sentencepiece type) of the pieces ``sentencepiece_model_proto`` appends after the vocabulary.

    The UNKNOWN placeholder when ``unk_id`` is None (a text not in ``vocab``), then the ``<0xHH>`` byte
    pieces missing from a vocabulary that holds some of them, typed BYTE, in byte order.
    """
    extra: list[tuple[str, int]] = []
    if unk_id is None:
        placeholder = "<unk>"
        while placeholder in vocab:
            placeholder = "<" + placeholder + ">"
        extra.append((placeholder, _UNKNOWN))
    missing = [f"<0x{b:02X}>" for b in range(256) if f"<0x{b:02X}>" not in vocab]
    if len(missing) < 256:
        extra += [(text, _BYTE) for text in missing]
    return extra


def _utf8_lengths(texts: Sequence[str], flat: np.ndarray) -> np.ndarray:
    """int64 [len(texts)]: each text's UTF-8 length in bytes, given ``flat``, the UTF-8 bytes of all of
    them joined: a text ends where its last character does, and characters start at the bytes that are
    not continuation bytes (10xxxxxx). No per-text encode, and one int64 per character at most."""
    chars = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    starts = np.append(np.flatnonzero((flat & 0xC0) != 0x80), flat.size)
    ends = starts[np.cumsum(chars)]
    return np.diff(ends, prepend=0)


@dataclass(frozen=True)
class _Encoding:
    """What ``tokenizers.Encoding`` offers that ster reads: the ids and their token texts."""

    ids: list[int]
    _texts: Sequence[str]

    @property
    def tokens(self) -> list[str]:
        return [self._texts[i] for i in self.ids]


class SentencePieceBPE:
    """A SentencePiece BPE vocabulary tokenized as llama.cpp does, with ``tokenizers.Tokenizer``'s interface.

    Args:
        tokens: the n token texts, distinct and non-empty; ids are their positions.
        scores: float [n], merge scores.
        unk_id: the unknown token's id, or None (a character without a piece or byte token is then dropped,
            as ``tokenizers``' BPE without an unknown token does).
        add_space_prefix: put ▁ in front of every text run (llama.cpp's ``add_space_prefix``); decoding then
            drops one leading space.
        special: control/unknown token ids, cut out of the text unless ``encode_special_tokens``;
            skipped by ``decode(..., skip_special_tokens=True)``.
        plain: user-defined token ids, always cut out of the text.
        lstrip, rstrip: ids of added tokens that swallow the white space before/after them.
        vocab: text -> id of ``tokens`` when the caller has it (kept, not copied).

    Raises:
        SterError: the ``sentencepiece`` library refuses the pieces (the message says why).
    """

    def __init__(self, tokens: Sequence[str], scores: np.ndarray, unk_id: int | None, add_space_prefix: bool,
                 special: Iterable[int] = (), plain: Iterable[int] = (), lstrip: Iterable[int] = (),
                 rstrip: Iterable[int] = (), vocab: Mapping[str, int] | None = None):
        import sentencepiece

        self._tokens = list(tokens)
        self._n = len(self._tokens)
        self._vocab = vocab if vocab is not None else dict(zip(self._tokens, range(self._n)))
        self._prefix = SPACE_MARK if add_space_prefix else ""
        self._strip_space = add_space_prefix
        self._sp = sentencepiece.SentencePieceProcessor()
        # Ids sentencepiece may give past the vocabulary (see ``placeholder_pieces``) -> the ids they stand
        # for: none for the unknown placeholder; for a missing byte piece, llama.cpp's second look-up (the
        # byte as a one-character text), else the unknown token (where llama.cpp aborts), else none.
        self._extra: dict[int, tuple[int, ...]] = {}
        for j, (text, kind) in enumerate(placeholder_pieces(self._vocab, unk_id), start=self._n):
            byte = int(text[3:5], 16) if kind == _BYTE else None
            if byte is not None and byte < 0x80 and chr(byte) in self._vocab:
                self._extra[j] = (self._vocab[chr(byte)],)
            else:
                self._extra[j] = (unk_id,) if byte is not None and unk_id is not None else ()
        try:
            self._sp.LoadFromSerializedProto(sentencepiece_model_proto(self._tokens, scores, unk_id, self._vocab))
        except (RuntimeError, OSError) as e:
            raise SterError(f"the sentencepiece library refused this GGUF's vocabulary ({e}); the tokenizer.ggml.* "
                            "metadata is corrupt or crafted, re-convert the model") from None
        #: (BOS id or None, EOS id or None) that ``encode(..., add_special_tokens=True)`` puts around the ids
        self.ends: tuple[int | None, int | None] = (None, None)
        self._special = frozenset(int(i) for i in special)
        plain = frozenset(int(i) for i in plain) - self._special
        lstrip, rstrip = frozenset(lstrip), frozenset(rstrip)
        self._added = {i: AddedToken(self._tokens[i], special=i in self._special, normalized=False,
                                     lstrip=i in lstrip, rstrip=i in rstrip)
                       for i in sorted(self._special | plain)}
        # With special texts not parsed, llama.cpp does not look for control/unknown tokens at all, so a
        # user-defined token overlapping one is still cut: a second splitter holds only the user-defined ones
        # (tokenizers' ``encode_special_tokens`` would match the control token and then read it as text).
        self._splitter, self._split_ids = self._added_token_splitter(self._added.values())
        self._plain_splitter, self._plain_split_ids = self._added_token_splitter(
            t for t in self._added.values() if not t.special)
        self._encode_special = False

    # ------------------------------------------------------------------ added tokens

    def _added_token_splitter(self, added: Iterable[AddedToken]) -> tuple[tokenizers.Tokenizer, dict[int, int]]:
        """A ``tokenizers`` model holding only the ``added`` tokens: encoding a text with it gives those
        tokens' spans (its ids, mapped to vocabulary ids by the returned dict) and every run between them
        as id 0."""
        run = "[text]"
        while run in self._vocab:
            run = "[" + run + "]"
        splitter = tokenizers.Tokenizer(models.WordLevel({run: 0}, unk_token=run))
        added = list(added)
        specials = [t for t in added if t.special]
        plain = [t for t in added if not t.special]
        if specials:
            splitter.add_special_tokens(specials)
        if plain:
            splitter.add_tokens(plain)
        return splitter, {splitter.token_to_id(t.content): self._vocab[t.content] for t in added}

    @property
    def encode_special_tokens(self) -> bool:
        """True: special (control/unknown) token texts in the text are tokenized as plain text."""
        return self._encode_special

    @encode_special_tokens.setter
    def encode_special_tokens(self, value: bool) -> None:
        self._encode_special = bool(value)

    def get_added_tokens_decoder(self) -> dict[int, AddedToken]:
        """id -> ``AddedToken`` for the control, unknown and user-defined tokens."""
        return dict(self._added)

    # ------------------------------------------------------------------ vocabulary

    def get_vocab(self, with_added_tokens: bool = True) -> dict[str, int]:
        """text -> id for every token (added tokens are vocabulary tokens here)."""
        return dict(self._vocab)

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        return self._n

    def id_to_token(self, token_id: int) -> str | None:
        return self._tokens[token_id] if 0 <= token_id < self._n else None

    def token_to_id(self, token: str) -> int | None:
        return self._vocab.get(token)

    # ------------------------------------------------------------------ encode / decode

    def encode(self, text: str, add_special_tokens: bool = True) -> _Encoding:
        """Token ids of ``text`` (valid Unicode, no lone surrogates); BOS/EOS per ``ends`` when
        ``add_special_tokens``."""
        return self.encode_batch([text], add_special_tokens)[0]

    def encode_batch(self, texts: Iterable[str], add_special_tokens: bool = True) -> list[_Encoding]:
        """``encode`` of each text; the added-token cuts and the merges each run once for the batch."""
        texts = list(texts)
        splitter, split_ids = ((self._plain_splitter, self._plain_split_ids) if self._encode_special
                               else (self._splitter, self._split_ids))
        found = splitter.encode_batch(texts, add_special_tokens=False) if texts else []
        runs = [self._prefix + text[a:b].replace(" ", SPACE_MARK)
                for text, enc in zip(texts, found) if text for i, (a, b) in zip(enc.ids, enc.offsets) if i == 0]
        pieces = iter(self._sp.encode(runs) if runs else ())
        bos, eos = self.ends if add_special_tokens else (None, None)
        out = []
        for text, enc in zip(texts, found):
            ids: list[int] = [bos] if bos is not None else []
            for i in (enc.ids if text else ()):
                if i == 0:
                    ids.extend(next(pieces))
                else:
                    ids.append(split_ids[i])
            if ids and max(ids) >= self._n:  # placeholder pieces (see ``_extra``)
                ids = [k for i in ids for k in ((i,) if i < self._n else self._extra[i])]
            if eos is not None:
                ids.append(eos)
            out.append(_Encoding(ids, self._tokens))
        return out

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``: ▁ read as a space, runs of byte tokens as UTF-8 (a run that is not valid
        UTF-8 gives one U+FFFD per byte), one leading space dropped with ``add_space_prefix``; ids
        outside the vocabulary are skipped (``tokenizers``' decoder chain Replace, ByteFallback,
        Fuse, Strip). Special tokens are skipped unless asked for, as ``tokenizers.Tokenizer.decode`` does."""
        out: list[str] = []
        pending = bytearray()
        for i in ids:
            i = int(i)
            if not 0 <= i < self._n or (skip_special_tokens and i in self._special):
                continue
            text = self._tokens[i].replace(SPACE_MARK, " ")
            if len(text) == 6 and _BYTE_TOKEN.match(text):
                pending.append(int(text[3:5].lstrip("+"), 16))
                continue
            if pending:
                out.append(_bytes_text(pending))
                pending.clear()
            out.append(text)
        if pending:
            out.append(_bytes_text(pending))
        joined = "".join(out)
        return joined[1:] if self._strip_space and joined.startswith(" ") else joined

    def decode_batch(self, sequences: Iterable[Iterable[int]], skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in sequences]


def _bytes_text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * len(data)
