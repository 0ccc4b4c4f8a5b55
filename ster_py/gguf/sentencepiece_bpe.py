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
  finds the cuts, so they follow the same rules as every other GGUF vocabulary;
- each text run between them gets a leading ▁ (``add_space_prefix``) and its spaces
  written as ▁, then ``sentencepiece`` merges adjacent symbols best score first (ties:
  leftmost), and a character left without a piece becomes its UTF-8 ``<0xHH>``
  byte tokens. Every piece of the vocabulary is a merge target, as in llama.cpp
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

__all__ = ["SentencePieceBPE", "sentencepiece_model_proto"]

SPACE_MARK = "\u2581"

# sentencepiece_model.proto: ModelProto.pieces = 1, .trainer_spec = 2, .normalizer_spec = 3;
# SentencePiece.piece = 1 (string), .score = 2 (float), .type = 3 (enum NORMAL = 1, UNKNOWN = 2).
_NORMAL, _UNKNOWN, _BYTE = 1, 2, 6
# TrainerSpec: model_type (3) = BPE (2), byte_fallback (35) = true or false.
_TRAINER_SPEC = {True: bytes([0x18, 0x02, 0x98, 0x02, 0x01]), False: bytes([0x18, 0x02])}
# NormalizerSpec: name (1) "identity", add_dummy_prefix (3), remove_extra_whitespaces (4) and
# escape_whitespaces (5) all false: the text arrives already escaped, nothing else may change it.
_NORMALIZER_SPEC = b"\x0a\x08identity" + bytes([0x18, 0x00, 0x20, 0x00, 0x28, 0x00])
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
    if unk_id is None:
        placeholder = "<unk>"
        while placeholder in index:
            placeholder = "<" + placeholder + ">"
        texts.append(placeholder)
        types = np.append(types, np.uint8(_UNKNOWN))
        score32 = np.append(score32, np.float32(0))
    else:
        types[unk_id] = _UNKNOWN
    # sentencepiece falls back to bytes only with all 256 <0xHH> pieces typed BYTE (which it then
    # never forms by merging; llama.cpp could, from pieces such as "<0" and "x41>", which no real
    # vocabulary holds).
    byte_ids = [index.get(f"<0x{b:02X}>") for b in range(256)]
    byte_fallback = None not in byte_ids
    if byte_fallback:
        types[byte_ids] = _BYTE
    n = len(texts)
    flat = np.frombuffer("".join(texts).encode("utf-8"), dtype=np.uint8)
    blen = _utf8_lengths(texts)
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
    if flat.size:
        src = np.cumsum(blen) - blen
        out[np.repeat(q - src, blen) + np.arange(flat.size)] = flat
    r = q + blen
    out[r] = 0x15
    out[r[:, None] + np.arange(1, 5)] = score32.astype("<f4").view(np.uint8).reshape(n, 4)
    out[r + 5] = 0x18
    out[r + 6] = types
    out[int(total.sum()):] = np.frombuffer(specs, dtype=np.uint8)
    return out.tobytes()


def _utf8_lengths(texts: Sequence[str]) -> np.ndarray:
    """int64 [len(texts)]: each text's UTF-8 length in bytes, from its code points (no per-text encode)."""
    chars = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    points = np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    size = 1 + (points >= 0x80).astype(np.int64) + (points >= 0x800) + (points >= 0x10000)
    ends = np.cumsum(chars)
    total = np.concatenate(([0], np.cumsum(size)))
    return total[ends] - total[ends - chars]


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
        self._splitter, self._split_ids = self._added_token_splitter()

    # ------------------------------------------------------------------ added tokens

    def _added_token_splitter(self) -> tuple[tokenizers.Tokenizer, dict[int, int]]:
        """A ``tokenizers`` model holding only the added tokens: encoding a text with it gives the added
        tokens' spans (its ids) and every run between them as one unknown id (``_RUN``)."""
        run = "[text]"
        while run in self._vocab:
            run = "[" + run + "]"
        splitter = tokenizers.Tokenizer(models.WordLevel({run: 0}, unk_token=run))
        specials = [t for t in self._added.values() if t.special]
        plain = [t for t in self._added.values() if not t.special]
        if specials:
            splitter.add_special_tokens(specials)
        if plain:
            splitter.add_tokens(plain)
        return splitter, {splitter.token_to_id(t.content): i for i, t in self._added.items()}

    @property
    def encode_special_tokens(self) -> bool:
        """True: special (control/unknown) token texts in the text are tokenized as plain text."""
        return self._splitter.encode_special_tokens

    @encode_special_tokens.setter
    def encode_special_tokens(self, value: bool) -> None:
        self._splitter.encode_special_tokens = value

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
        found = self._splitter.encode(text, add_special_tokens=False) if text else None
        ids: list[int] = []
        if found is not None:
            runs = [self._prefix + text[a:b].replace(" ", SPACE_MARK)
                    for i, (a, b) in zip(found.ids, found.offsets) if i == 0]
            pieces = iter(self._sp.encode(runs) if runs else ())
            for i in found.ids:
                if i == 0:
                    ids.extend(next(pieces))
                else:
                    ids.append(self._split_ids[i])
            if self._n in ids:  # the placeholder unknown piece of a vocabulary without one
                ids = [i for i in ids if i != self._n]
        if add_special_tokens:
            bos, eos = self.ends
            ids = ([bos] if bos is not None else []) + ids + ([eos] if eos is not None else [])
        return _Encoding(ids, self._tokens)

    def encode_batch(self, texts: Iterable[str], add_special_tokens: bool = True) -> list[_Encoding]:
        return [self.encode(t, add_special_tokens) for t in texts]

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
