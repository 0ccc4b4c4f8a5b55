"""Text <-> token ids, special tokens, stop tokens and streaming detokenization.

The ``tokenizers`` library does the tokenizing; this wrapper adds what a
generation loop needs around it: the BOS/EOS conventions of the model, the
set of end-of-generation ids, the chat template, and a streaming decoder.

Two ways in:
- ``Tokenizer.from_dir(path)``: a Hugging Face checkpoint directory
  (tokenizer.json plus the optional tokenizer_config.json,
  special_tokens_map.json, chat_template.jinja, generation_config.json,
  config.json), read the way transformers 5.x reads it.
- ``Tokenizer(tk, ...)``: a ``tokenizers.Tokenizer`` built elsewhere (the GGUF
  path builds one from ``tokenizer.ggml.*`` metadata) plus the facts the
  metadata gives.
"""
from __future__ import annotations

import base64
import codecs
import json
from pathlib import Path
from typing import Any, Callable, Iterable

import tokenizers
from tokenizers import AddedToken

from .errors import SterError

__all__ = ["Tokenizer", "StreamDecoder", "END_OF_GENERATION_TOKENS"]

#: Vocabulary tokens that end a generation when the vocabulary has them (as added tokens
#: or plain entries): end-of-turn, end-of-message and end-of-text markers of the
#: common chat formats (list from llama.cpp's end-of-generation detection, seed 000).
END_OF_GENERATION_TOKENS = (
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<turn|>",
    "<|tool_response>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",  # DeepSeek's end of sentence (full-width bars)
    "<end_of_utterance>",
)

# transformers' named special tokens (PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES);
# the chat template sees each one that is set, under its name.
_NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")

_REPLACEMENT_CHAR = "\ufffd"


def check_template_text(text, source: str) -> None:
    """Refuse a user's chat template that is not text or is empty (``--chat-template-file``, ``use_chat_template``).

    Raises:
        SterError naming ``source``.
    """
    if not isinstance(text, str) or not text.strip():
        raise SterError(f"the chat template {source} is empty; give a Jinja chat template")



def whole_ids(ids, func: str) -> list[int]:
    """``ids`` (any iterable of whole numbers: ints, numpy integers) as a list of ints.

    Raises:
        SterError naming ``func``: a text or bytes (its characters would be read one by one), something that is not
            iterable (None), or an element that is not a whole number (a float was truncated, True read as 1).
    """
    import numbers

    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise SterError(f"{func} takes token ids (a list of whole numbers), got {type(ids).__name__}")
    out = []
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, numbers.Integral):
            raise SterError(f"{func}: token ids must be whole numbers, got {str(i)[:40]!r} ({type(i).__name__})")
        out.append(int(i))
    return out

class Tokenizer:
    """A ``tokenizers.Tokenizer`` with the model's special-token conventions.

    Args:
        tk: the backend tokenizer (normalizer, pre-tokenizer, model, decoder,
            post-processor, added tokens).
        bos_token, eos_token: the texts of the BOS and EOS tokens, or None.
        add_bos, add_eos: None lets ``tk``'s post-processor decide what
            ``encode(..., add_special_tokens=True)`` adds (tokenizer.json's
            behaviour); True/False make this wrapper add, or not add, BOS/EOS
            itself (GGUF ``tokenizer.ggml.add_bos_token``).
        chat_template: the default Jinja chat template, or None.
        chat_templates: named templates (transformers' ``{"default": ..., "tool_use": ...}``);
            ``chat_template`` is its ``"default"`` entry when not given.
        eos_token_ids: end-of-generation ids known from elsewhere (generation
            config, GGUF eos/eot ids); merged with ``eos_token`` and the
            vocabulary's end-of-turn specials, see ``eos_token_ids``.
        special_tokens: other named special tokens for the chat template
            (``unk_token``, ``pad_token``...).
        source: where it came from, for error messages.

    Raises:
        SterError: add_bos=True without a BOS token in the vocabulary.
    """

    def __init__(
        self,
        tk: tokenizers.Tokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        add_bos: bool | None = None,
        add_eos: bool | None = None,
        chat_template: str | None = None,
        chat_templates: dict[str, str] | None = None,
        eos_token_ids: Iterable[int] | None = None,
        special_tokens: dict[str, str] | None = None,
        source: str = "tokenizer",
    ):
        self.tk = tk
        self.source = source
        self.notes: list[str] = []  # warning lines for the user (LoadedModel.warnings)
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.add_bos = add_bos
        self.add_eos = add_eos
        self._chat_templates: dict[str, str] = dict(chat_templates or {})
        if chat_template is None:
            chat_template = self._chat_templates.get("default")
        elif "default" not in self._chat_templates:
            self._chat_templates["default"] = chat_template
        self._chat_template: str | None = chat_template
        self._template_source: str | None = None   # a --chat-template-file's name (use_chat_template)
        # A template file that cannot be read fails only when a template is wanted, so
        # tokenizing (which needs none) still works.
        self._template_error: str | None = None
        self.special_tokens: dict[str, str] = {
            k: v for k, v in (special_tokens or {}).items() if v is not None and k not in ("bos_token", "eos_token")
        }
        self.bos_token_id: int | None = tk.token_to_id(bos_token) if bos_token is not None else None
        self.eos_token_id: int | None = tk.token_to_id(eos_token) if eos_token is not None else None
        if add_bos and self.bos_token_id is None:
            raise SterError(f"{source}: BOS token {bos_token!r} is to be added but is not in the vocabulary")
        if add_eos and self.eos_token_id is None:
            raise SterError(f"{source}: EOS token {eos_token!r} is to be added but is not in the vocabulary")
        self.eos_token_ids: set[int] = self._end_of_generation_ids(eos_token_ids)
        # Does tk's own post-processor put BOS in front? Decides the no-double-BOS rule below.
        probe = _guarded(lambda: tk.encode("", add_special_tokens=True).ids, f"{source}: the tokenizer failed")
        self._post_processor_adds_bos = (
            self.bos_token_id is not None and len(probe) > 0 and probe[0] == self.bos_token_id
        )
        self._byte_token_ids: frozenset[int] | None = None
        self._piece_rule: Callable[[str], bytes] | None = None  # token_bytes' spelling -> piece
        self._added_texts: dict[int, str] = {}

    @property
    def chat_templates(self) -> dict[str, str]:
        """Named chat templates (``"default"`` among them when the model has one).

        Raises:
            SterError: a template file of the model could not be read (not UTF-8).
        """
        if self._template_error is not None:
            raise SterError(self._template_error)
        return self._chat_templates

    def use_chat_template(self, text: str, source: str) -> None:
        """Replace the model's chat templates (every name) with ``text``, a user's template file
        (``--chat-template-file``); errors while rendering it name ``source``. Call it before a
        ``conversation.Session`` is made over this tokenizer: a Session reads the template once.

        Raises:
            SterError: ``text`` is not a str, or is empty.
        """
        check_template_text(text, source)
        self._chat_templates = {"default": text}
        self._chat_template = text
        self._template_error = None
        self._template_source = source

    @property
    def chat_template(self) -> str | None:
        """The default chat template, or None. Raises SterError as ``chat_templates`` does."""
        if self._template_error is not None:
            raise SterError(self._template_error)
        return self._chat_template

    # ----------------------------------------------------------------- loading

    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        """Load the tokenizer of a Hugging Face checkpoint directory.

        Reads tokenizer.json (required) and, when present:
        - tokenizer_config.json: ``bos_token``, ``eos_token`` and the other named
          special tokens, ``added_tokens_decoder``, ``additional_special_tokens`` /
          ``extra_special_tokens``, ``chat_template`` (a string or a list of
          ``{"name", "template"}``);
        - special_tokens_map.json: named special tokens, used only when
          tokenizer_config.json has no ``added_tokens_decoder`` (transformers'
          legacy rule);
        - chat_template.jinja and additional_chat_templates/*.jinja: when any
          exists they replace tokenizer_config.json's templates (transformers'
          precedence);
        - generation_config.json and config.json (``eos_token_id``, int or list,
          also ``text_config.eos_token_id``): end-of-generation ids.

        Without tokenizer.json, a tiktoken rank file is read (``rank_file_of``: GLM-4's
        tokenizer.model under ChatGLM4Tokenizer, Kimi's tiktoken.model under TikTokenTokenizer;
        ``tiktoken_bpe.from_rank_file``), with the same side files; else PLaMo's tokenizer.jsonl
        (``plamo_tokenizer.from_jsonl``); else Mistral's tekken.json (``tiktoken_bpe.from_tekken``: BOS
        ``<s>``, EOS ``</s>`` from its special tokens unless tokenizer_config.json names others).

        BOS/EOS addition follows tokenizer.json's post-processor:
        tokenizer_config.json's ``add_bos_token``/``add_eos_token`` are ignored
        when tokenizer.json exists, as transformers 5 does
        (``PreTrainedTokenizerBase._from_pretrained`` drops them).

        Args:
            path: the directory, or the tokenizer.json file inside it.

        Raises:
            SterError: "failed to load tokenizer <PATH>: <DETAIL>" when
                tokenizer.json (or the rank file) is missing, unreadable or invalid, or
                a JSON file beside it is malformed.
        """
        path = Path(path)
        directory = path.parent if path.is_file() else path
        tokenizer_file = path if path.is_file() else directory / "tokenizer.json"
        config_file = directory / "tokenizer_config.json"
        rank_file = None if tokenizer_file.is_file() else rank_file_of(directory)
        plamo_file = directory / "tokenizer.jsonl"
        if rank_file is None and not tokenizer_file.is_file() and plamo_file.exists():
            from .plamo_tokenizer import from_jsonl  # PLaMo's own vocabulary

            config = _read_json_object(config_file)
            tk = from_jsonl(plamo_file, config, config_file)
            tokenizer_file = plamo_file
            failed = (f"failed to load tokenizer {plamo_file}", "re-download its tokenizer_config.json.")
        elif rank_file is not None:  # GLM-4's or Kimi's tiktoken ranks (tiktoken_bpe.py)
            from .tiktoken_bpe import from_rank_file

            config = _read_json_object(config_file)
            tk = from_rank_file(rank_file, config.get("tokenizer_class"), config, config_file)
            tokenizer_file = rank_file
            failed = (f"failed to load tokenizer {rank_file}", "re-download its tokenizer_config.json.")
        elif not tokenizer_file.is_file() and (directory / "tekken.json").is_file():  # Mistral's own format
            from .tiktoken_bpe import from_tekken

            tekken = directory / "tekken.json"
            tk = from_tekken(tekken)
            config = _read_json_object(config_file)
            added = {t.content for t in tk.get_added_tokens_decoder().values()}
            for key, text in (("bos_token", "<s>"), ("eos_token", "</s>"), ("unk_token", "<unk>")):
                if text in added:  # Tekkenizer's bos/eos/unk are these special tokens
                    config.setdefault(key, text)
            tokenizer_file = tekken
            failed = (f"failed to load tokenizer {tekken}", "re-download it.")
        else:
            if not tokenizer_file.is_file():
                raise SterError(
                    f"failed to load tokenizer {tokenizer_file}: file not found. "
                    "The model directory needs a tokenizer.json (the Hugging Face fast-tokenizer file)."
                )
            _check_regular_file(tokenizer_file, MAX_TOKENIZER_JSON_BYTES, "tokenizer")
            _check_before_tokenizers(tokenizer_file)
            failed = (f"failed to load tokenizer {tokenizer_file}", "The file is not a tokenizer.json the "
                      "tokenizers library can read; re-download or re-export it.")
            tk = _guarded(lambda: tokenizers.Tokenizer.from_file(str(tokenizer_file)), *failed)
            _check_text_growth(tk, tokenizer_file)
            config = _read_json_object(config_file)
        named: dict[str, Any] = {k: config[k] for k in _NAMED_SPECIAL_TOKENS if config.get(k) is not None}
        if "added_tokens_decoder" not in config:
            legacy_file = directory / "special_tokens_map.json"
            legacy = _read_json_object(legacy_file)
            for k in _NAMED_SPECIAL_TOKENS:
                if legacy.get(k) is not None:
                    named[k] = legacy[k]
                    _token_text(legacy[k], legacy_file, k)
            for key in ("additional_special_tokens", "extra_special_tokens"):
                if isinstance(legacy.get(key), list):
                    config.setdefault(key, legacy[key])
        texts = {k: _token_text(v, config_file, k) for k, v in named.items()}

        _guarded(lambda: _add_missing_tokens(tk, config, named, config_file), *failed)

        templates, template_error = _read_chat_templates(directory, config)
        eos_ids: list[int] = []
        for name in ("generation_config.json", "config.json"):
            data = _read_json_object(directory / name)
            eos_ids += _as_id_list(data.get("eos_token_id"), directory / name, "eos_token_id")
            if isinstance(data.get("text_config"), dict):
                eos_ids += _as_id_list(data["text_config"].get("eos_token_id"), directory / name,
                                       "text_config.eos_token_id")

        tokenizer = cls(
            tk,
            bos_token=texts.get("bos_token"),
            eos_token=texts.get("eos_token"),
            chat_templates=templates,
            eos_token_ids=eos_ids,
            special_tokens=texts,
            source=str(directory),
        )
        tokenizer._template_error = template_error
        return tokenizer

    # ------------------------------------------------------------ vocabulary

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (transformers' ``len(tokenizer)``)."""
        return self.tk.get_vocab_size(with_added_tokens=True)

    def id_to_token(self, token_id: int) -> str | None:
        """The token text of an id (byte-level/▁ spelling, not decoded), or None if out of range."""
        i = int(token_id)
        return self.tk.id_to_token(i) if 0 <= i < 2**32 else None   # the backend's ids are unsigned 32-bit

    def token_to_id(self, token: str) -> int | None:
        """The id of a token text, or None if it is not in the vocabulary. Raises SterError for a ``token`` that
        is not a str."""
        if not isinstance(token, str):
            raise SterError(f"token_to_id takes a token's text (str), got {type(token).__name__}")
        return self.tk.token_to_id(token)

    def _end_of_generation_ids(self, extra: Iterable[int] | None) -> set[int]:
        ids = {int(i) for i in (extra or ())}
        if self.eos_token_id is not None:
            ids.add(self.eos_token_id)
        # the named end-of-turn tokens present in the vocabulary, special or not (seed 000, as
        # llama.cpp's vocabulary loader does)
        found = (self.tk.token_to_id(name) for name in END_OF_GENERATION_TOKENS)
        ids.update(i for i in found if i is not None)
        return ids

    # -------------------------------------------------------------- encoding

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``.

        With ``add_special_tokens`` the model's BOS/EOS are added (tokenizer.json's
        post-processor, or ``add_bos``/``add_eos`` when given), but never a
        second BOS: a text that already starts with the BOS token (a rendered
        chat template that prints ``bos_token``) keeps only its own. So
        ``encode(render_chat(...))`` gives transformers'
        ``apply_chat_template(..., tokenize=True)`` ids for templates that print
        BOS themselves and for tokenizers that add none.

        Returns:
            list[int], token ids in ``[0, vocab_size)``.

        Raises:
            SterError: ``text`` is not a str (bytes must be decoded first).
        """
        if not isinstance(text, str):
            raise SterError(f"encode takes a text (str), got {type(text).__name__}"
                            + ("; decode the bytes first" if isinstance(text, (bytes, bytearray)) else ""))
        if self.add_bos is None and self.add_eos is None:
            ids = self._backend_encode(text, add_special_tokens)
            if (
                add_special_tokens
                and self._post_processor_adds_bos
                and self._starts_with_bos(text)
                and len(ids) >= 2
                and ids[1] == self.bos_token_id
            ):
                ids = ids[1:]
            return ids
        ids = self._backend_encode(text, False)
        if add_special_tokens:
            if self.add_bos and not (ids[:1] == [self.bos_token_id] and self._starts_with_bos(text)):
                ids = [self.bos_token_id] + ids
            if self.add_eos:
                ids = ids + [self.eos_token_id]
        return ids

    def _backend_encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """The backend's ids; text it cannot take (lone surrogates) or a backend failure is a SterError."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise SterError(f"the text to encode is not valid Unicode ({e.reason} at character {e.start}); "
                            "pass UTF-8 text") from None
        try:
            return self.tk.encode(text, add_special_tokens=add_special_tokens).ids
        except Exception as e:  # noqa: BLE001 - tokenizers raises several types for a broken tokenizer.json
            raise SterError(f"{self.source}: the tokenizer failed on this text: {e}") from None
        except BaseException as e:  # a Rust panic inside tokenizers (pyo3 PanicException) is a BaseException
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            raise SterError(f"{self.source}: the tokenizer failed on this text: {e}") from None

    def _starts_with_bos(self, text: str) -> bool:
        return bool(self.bos_token) and text.startswith(self.bos_token)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of token ids (tokenizer.json's decoder; invalid UTF-8 becomes U+FFFD).

        transformers' ``clean_up_tokenization_spaces`` is not applied: it is off
        or ignored (BPE) for the decoder-only models this library runs, and it
        would break streaming (see ``StreamDecoder``). An id the tokenizer does not know (a model's
        padded embedding rows past the vocabulary) gives no text, as in transformers.

        Raises:
            SterError: a negative id (the backend's ids are unsigned: it raised OverflowError); ``ids`` that are
                not whole numbers (a float was truncated, a text's characters read as digits, None a TypeError).
        """
        ids = whole_ids(ids, "decode")
        if ids and min(ids) < 0:
            raise SterError(f"token ids are 0 or more, got {min(ids)}")
        return self.tk.decode([i if i < 2**32 else 2**32 - 1 for i in ids], skip_special_tokens=skip_special_tokens)

    def decode_complete(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """``decode``, less a multi-byte UTF-8 character cut off at the end: the text of a generation that a
        token limit, the context or a cancel ended inside a character (its first bytes only) ends in what
        precedes them, not in the U+FFFD those bytes decode to, as llama.cpp's server sends only complete
        characters. Bytes that are invalid UTF-8 anywhere else (a stray continuation byte, a character cut
        in the middle of the text) stay U+FFFD, as ``decode`` gives them.

        Args:
            ids: token ids (ints); with ``skip_special_tokens``, special tokens are left out before the end
                is looked at (a cut character before a trailing special token is at the end too).

        The bytes at the end are the tokens' own (``token_bytes``); the tokens made of the cut character's
        bytes alone are left out of the decode (a byte-fallback decoder would otherwise turn the whole run
        of byte tokens into U+FFFD), and when the cut begins inside a token, the one U+FFFD its decode
        ends in is dropped.

        Raises:
            SterError: a negative id or ids that are not whole numbers, as ``decode``.
        """
        ids = whole_ids(ids, "decode_complete")
        if skip_special_tokens:
            special = {i for i, t in self.tk.get_added_tokens_decoder().items() if t.special}
            ids = [i for i in ids if i not in special]
        tail, n = b"", 0  # the bytes of the last n tokens: enough to hold the start of a 4-byte character
        while n < len(ids) and len(tail) < 8:
            n += 1
            tail = self.token_bytes(ids[-n]) + tail
        pending = codecs.getincrementaldecoder("utf-8")("replace")
        pending.decode(tail, final=False)
        cut = len(pending.getstate()[0])  # the bytes of an unfinished character at the very end
        if not cut:
            return self.decode(ids, skip_special_tokens=skip_special_tokens)
        while cut and ids and len(self.token_bytes(ids[-1])) <= cut:  # tokens made of the cut bytes alone
            cut -= len(self.token_bytes(ids.pop()))
        text = self.decode(ids, skip_special_tokens=skip_special_tokens)
        return text[:-1] if cut and text.endswith(_REPLACEMENT_CHAR) else text

    def token_bytes(self, token_id: int) -> bytes:
        """One token's own piece (OpenAI's logprobs ``bytes``), as llama.cpp's ``token_to_piece`` gives it
        with ``special`` on: an added (special or user-defined) token's text; a byte-fallback token's byte
        (``<0xE2>`` -> ``b"\\xe2"``); a byte-level BPE spelling's bytes; a SentencePiece piece with ▁ read as a
        space (``▁world`` -> ``b" world"``: the decoder's strip of a leading space applies to a text's start,
        not to a token); a WordPiece continuation without its ``##``, a word-initial piece with a space in
        front (llama.cpp's phantom space). The pieces of a generation joined are its text's bytes (but for
        a space a decoder strips at the very start). An id outside the vocabulary gives b"".

        The rule is read from the backend's decoder (``tokenizers`` decoder JSON: ByteLevel, WordPiece,
        Metaspace, Replace, ByteFallback, BPEDecoder) once, then applied to ``id_to_token``'s spelling.
        """
        i = int(token_id)
        if self._piece_rule is None:
            self._added_texts = {k: t.content for k, t in self.tk.get_added_tokens_decoder().items()}
            self._piece_rule = _piece_rule(self.tk)
        added = self._added_texts.get(i)
        if added is not None:
            return added.encode("utf-8")
        spelling = self.tk.id_to_token(i) if 0 <= i < self.vocab_size else None
        return b"" if spelling is None else self._piece_rule(spelling)

    def token_text(self, token_id: int) -> str:
        """``token_bytes`` as text, bytes that are not UTF-8 (part of a character) as U+FFFD: the logprobs
        ``token`` string of ``ster serve`` and ``ster generate --json``."""
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    def stream_decoder(self, skip_special_tokens: bool = False) -> "StreamDecoder":
        """A fresh incremental detokenizer for one generated sequence."""
        return StreamDecoder(self, skip_special_tokens=skip_special_tokens)

    @property
    def byte_token_ids(self) -> frozenset[int]:
        """Ids of the byte-fallback tokens ``<0x00>``..``<0xFF>`` (SentencePiece-style vocabularies)."""
        if self._byte_token_ids is None:
            found = (self.tk.token_to_id(f"<0x{b:02X}>") for b in range(256))
            self._byte_token_ids = frozenset(i for i in found if i is not None)
        return self._byte_token_ids

    # ------------------------------------------------------------------ chat

    def get_chat_template(self, name: str | None = None, tools: list[dict] | None = None) -> str:
        """The template to render with: ``name`` if given, else ``"tool_use"`` when tools
        are given and the model has one, else the default (transformers' choice).

        Raises:
            SterError: the model has no chat template, or none of that name.
        """
        if name is not None:
            if name not in self.chat_templates:
                raise SterError(
                    f"{self.source} has no chat template named {name!r}; "
                    f"available: {', '.join(sorted(self.chat_templates)) or 'none'}"
                )
            return self.chat_templates[name]
        if tools is not None and "tool_use" in self.chat_templates:
            return self.chat_templates["tool_use"]
        if self.chat_template is None:
            raise SterError(
                f"{self.source} has no chat template, so a conversation cannot be formatted for it; "
                "give a raw prompt instead (a base model), or supply a template"
            )
        return self.chat_template

    def render_chat(
        self,
        messages: list[dict],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        template: str | None = None,
        **extra: Any,
    ) -> str:
        """Render ``messages`` with this model's chat template and special tokens.

        Equals transformers' ``apply_chat_template(messages, tokenize=False,
        add_generation_prompt=..., tools=...)``. ``template`` is a template name
        or Jinja text overriding the model's; ``extra`` goes to the template
        (``enable_thinking=False``, ``now=`` to pin ``strftime_now``...).

        Raises:
            SterError: no chat template, or the template failed (see ``chat.render_chat``); ``tools`` that are not
                a list of tool schemas (``chat.check_tools``).
        """
        if tools is not None:   # "x" or [5] reached the template as they were
            from .chat import check_tools

            check_tools(tools, "tools")
        if template is not None and template in self.chat_templates:
            text, source = self.chat_templates[template], f"{template!r} of {self.source}"
        elif template is not None:
            text, source = template, "(given)"
        else:
            text, source = self.get_chat_template(tools=tools), self._template_source or f"of {self.source}"
        variables = {**self.special_tokens, **extra}
        # jinja2 is imported when a conversation is first rendered, not at every model load.
        from .chat import render_chat

        return render_chat(
            text,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            tools=tools,
            source=source,
            **variables,
        )

    def encode_chat(self, messages: list[dict], *, add_special_tokens: bool = False, **kwargs: Any) -> list[int]:
        """``encode(render_chat(messages, **kwargs), add_special_tokens)``: the prompt ids of a conversation.

        By default the tokenizer adds no special tokens of its own: the template writes BOS if the model
        wants one, as transformers' ``apply_chat_template(tokenize=True)`` and ``prompt.encode_prompt``
        (what ``ster generate`` sends) encode it."""
        return self.encode(self.render_chat(messages, **kwargs), add_special_tokens=add_special_tokens)

    def __repr__(self) -> str:
        return (
            f"Tokenizer(source={self.source!r}, vocab_size={self.vocab_size}, bos={self.bos_token!r}, "
            f"eos={self.eos_token!r}, eos_token_ids={sorted(self.eos_token_ids)})"
        )


class StreamDecoder:
    """Incremental detokenizer: feed generated ids one at a time, get printable text.

    ``feed`` returns the new text (possibly "") once it is settled: never a
    piece ending in a partial UTF-8 character (U+FFFD), and never while a run of
    byte-fallback tokens (``<0xE2>``...) may still continue, because the
    tokenizers ByteFallback decoder judges a run as a whole. ``flush`` returns
    what is held back at the end, less a character cut off by the end of the
    generation (``Tokenizer.decode_complete``). The concatenation of every ``feed``
    and the final ``flush`` equals ``tokenizer.decode_complete(all_ids)``.

    Method: decode a short window of ids twice (without and with the new
    ones) and emit the difference; the window starts at the previous emission
    so decoders that strip a leading space see the same first token both times
    (the technique of text-generation-inference's ``decode_token``).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []  # the window: ids from the previous emission's start
        self._read = 0  # ids[:_read] are already emitted
        # Skipped special tokens vanish before ByteFallback runs, so byte runs on both sides
        # of one join into a single run: hold text at them as at byte tokens.
        self._hold = set(tokenizer.byte_token_ids)
        if skip_special_tokens:
            self._hold |= {i for i, t in tokenizer.tk.get_added_tokens_decoder().items() if t.special}

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.tk.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def feed(self, token_id: int) -> str:
        """Add one id; return the text it completes ("" when nothing is settled yet)."""
        self._ids.append(int(token_id))
        if self._ids[-1] in self._hold:
            return ""
        before = self._decode(self._ids[: self._read])
        after = self._decode(self._ids)
        if len(after) <= len(before) or after.endswith(_REPLACEMENT_CHAR) or not after.startswith(before):
            return ""
        # Slide the window: keep the ids just emitted as context for the next decode.
        self._ids = self._ids[self._read :]
        self._read = len(self._ids)
        return after[len(before) :]

    push = feed  # the name the CLI uses

    def flush(self) -> str:
        """Return the text still held back (end of generation) and reset the window; the first bytes of a
        multi-byte character the generation ended in are left out, not turned into U+FFFD."""
        before = self._decode(self._ids[: self._read])
        after = self.tokenizer.decode_complete(self._ids, skip_special_tokens=self.skip_special_tokens)
        self._ids, self._read = [], 0
        return after[len(before) :] if after.startswith(before) else after


# ------------------------------------------------------------------ helpers

def _piece_rule(tk: Any) -> Callable[[str], bytes]:
    """A vocabulary spelling -> its token's own bytes, by the backend's decoder (``Tokenizer.token_bytes``).

    ``tokenizers``' decoders, per token: ByteLevel maps each character of the GPT-2 byte alphabet back to
    its byte; WordPiece drops the continuation prefix and puts a space before a word-initial piece (as the
    decoder does for every piece but the first, and llama.cpp's WPM pieces are spelled); Metaspace and
    Replace turn ▁ into a space; ByteFallback reads ``<0xXX>`` as that byte; BPEDecoder's end-of-word
    suffix is a space; without a decoder, tokens are joined with spaces (a space before each). Strip and
    Fuse act on a whole text and are left out. The GGUF SentencePiece
    tokenizer (``gguf.sentencepiece_bpe``, no decoder object) decodes as Replace(▁, " ") + ByteFallback.
    """
    import re

    if not hasattr(tk, "decoder"):
        steps = [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"}]
    elif tk.decoder is None:  # tokenizers joins the pieces with spaces
        return lambda spelling: (" " + spelling).encode("utf-8")
    else:
        steps = [json.loads(tk.decoder.__getstate__())]
    flat: list[dict] = []
    while steps:
        step = steps.pop(0)
        if step.get("type") == "Sequence":
            steps = list(step.get("decoders") or []) + steps
        else:
            flat.append(step)
    kinds = [step.get("type") for step in flat]
    if "ByteLevel" in kinds:
        from .tiktoken_bpe import BYTE_OF

        def byte_level(spelling: str) -> bytes:
            return b"".join(bytes([BYTE_OF[c]]) if c in BYTE_OF else c.encode("utf-8") for c in spelling)

        return byte_level
    if "WordPiece" in kinds:
        prefix = flat[kinds.index("WordPiece")].get("prefix", "##")

        def word_piece(spelling: str) -> bytes:
            word = spelling[len(prefix):] if spelling.startswith(prefix) else " " + spelling
            return word.encode("utf-8")

        return word_piece
    byte_token = re.compile(r"<0x([0-9A-Fa-f]{2})>")

    def pieced(spelling: str) -> bytes:
        for step in flat:
            kind = step.get("type")
            if kind == "ByteFallback" and byte_token.fullmatch(spelling):
                return bytes([int(spelling[3:5], 16)])
            if kind == "Metaspace":
                spelling = spelling.replace(step.get("replacement", "\u2581"), " ")
            elif kind == "Replace":
                pattern, content = step.get("pattern") or {}, step.get("content", "")
                if "String" in pattern:
                    spelling = spelling.replace(pattern["String"], content)
                elif "Regex" in pattern:
                    try:
                        spelling = re.sub(pattern["Regex"], content, spelling)
                    except re.error:  # a pattern Python's re does not read: left as spelled
                        pass
            elif kind == "BPEDecoder" and spelling.endswith(step.get("suffix", "</w>")):
                spelling = spelling[: -len(step.get("suffix", "</w>"))] + " "
        return spelling.encode("utf-8")

    return pieced



def _guarded(call, what: str, advice: str = "") -> Any:
    """``call()``, with any failure of the Rust library a SterError: a bare Exception, or a
    Rust panic, which pyo3 raises as PanicException (a BaseException) so ``except Exception``
    misses it. Ctrl-C and exit pass through."""
    try:
        return call()
    except SterError:
        raise
    except BaseException as exc:  # noqa: BLE001 - see the docstring
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise SterError(f"{what}: {exc}" + (f". {advice}" if advice else "")) from None


def _check_before_tokenizers(tokenizer_file: Path) -> None:
    """The checks tokenizer.json gets before tokenizers reads it, on one read of the file, parsed only when it
    mentions what they look at (``Precompiled`` normalizers, a ``Unigram`` model); malformed JSON and unreadable
    files are left to tokenizers to report.

    Raises:
        SterError: what ``_check_precompiled_maps`` or ``_check_unigram_vocab`` raises.
    """
    try:
        raw = tokenizer_file.read_bytes()
    except OSError:
        return
    precompiled, unigram = b'"Precompiled"' in raw, b'"Unigram"' in raw
    if not (precompiled or unigram):
        return
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError):
        return
    if not isinstance(document, dict):
        return
    if precompiled:
        _check_precompiled_maps(document, tokenizer_file)
    if unigram:
        _check_unigram_vocab(document, tokenizer_file)


def _check_unigram_vocab(document: dict, tokenizer_file: Path) -> None:
    """Bound a Unigram tokenizer.json's pieces (``document``, the parsed file) before tokenizers builds its
    trie (about 350 bytes per piece character; ``ster_py.gguf.tokenizer.check_unigram_pieces``).

    Raises:
        SterError: pieces over ``check_unigram_pieces``' bounds.
    """
    from .gguf.tokenizer import check_unigram_pieces

    model = document.get("model")
    if not isinstance(model, dict) or model.get("type") != "Unigram" or not isinstance(model.get("vocab"), list):
        return
    pieces = [row[0] for row in model["vocab"] if isinstance(row, list) and row and isinstance(row[0], str)]
    check_unigram_pieces(pieces, f"failed to load tokenizer {tokenizer_file}")


def _check_precompiled_maps(document: dict, tokenizer_file: Path) -> None:
    """Check every ``Precompiled`` normalizer's character map in tokenizer.json (``document``, the parsed file)
    before tokenizers reads it (a crafted size inside the map aborts the process there)."""
    from .gguf.tokenizer import check_precompiled_charsmap

    found: list[Any] = []

    def walk(node: Any, depth: int) -> None:
        if depth > 64:
            return
        if isinstance(node, dict):
            if node.get("type") == "Precompiled":
                found.append(node.get("precompiled_charsmap"))
            for child in node.values():
                walk(child, depth + 1)
        elif isinstance(node, list):
            for child in node:
                walk(child, depth + 1)

    walk(document.get("normalizer"), 0)
    for value in found:
        if not isinstance(value, str):
            continue  # tokenizers reports a missing or mistyped map
        try:
            data = base64.b64decode(value, validate=True)
        except ValueError:
            raise SterError(f"failed to load tokenizer {tokenizer_file}: a Precompiled normalizer's "
                            "precompiled_charsmap is not base64; re-download or re-export it") from None
        check_precompiled_charsmap(data, f"{tokenizer_file}: the Precompiled normalizer's precompiled_charsmap")


#: Largest tokenizer.json read (Gemma 3's is 33 MB) and largest JSON file beside it.
MAX_TOKENIZER_JSON_BYTES = 256 << 20
MAX_TOKENIZER_SIDE_FILE_BYTES = 64 << 20
#: How many times its normalizer's (or decoder's) Replace steps may lengthen a text at most
#: (real tokenizers: 1, " " -> "▁"; a chain of 40 "h" -> "hh" would make 2**40).
MAX_TEXT_GROWTH = 16


def _check_regular_file(path: Path, limit: int, what: str) -> None:
    """Refuse a path that is not a regular file (a FIFO blocks, /dev/zero never ends) or is
    larger than ``limit`` bytes, before anything reads it."""
    import os
    import stat as stat_module

    try:
        info = os.stat(path)
    except OSError as exc:
        raise SterError(f"failed to load {what} {path}: {exc.strerror or exc}") from None
    if not stat_module.S_ISREG(info.st_mode):
        raise SterError(f"failed to load {what} {path}: not a regular file (a pipe, device or directory)")
    if info.st_size > limit:
        raise SterError(f"failed to load {what} {path}: it is {info.st_size} bytes; ster reads at most {limit} "
                        "bytes for it (real files are far smaller). Re-download or fix it")


def _growth(node: Any, depth: int = 0) -> float:
    """An upper bound on how many times ``node`` (a normalizer or decoder, as tokenizers
    serializes it) lengthens a text through Replace steps; other steps count as 1 (Prepend
    and the like add a constant; NFKC and a checked Precompiled map are bounded by Unicode
    data and do not compound with themselves)."""
    if not isinstance(node, dict) or depth > 64:
        return 1.0
    kind = node.get("type")
    if kind == "Sequence":
        total = 1.0
        for child in node.get("normalizers") or node.get("decoders") or node.get("pretokenizers") or []:
            total *= _growth(child, depth + 1)
        return total
    if kind == "Replace":
        content = node.get("content")
        pattern = node.get("pattern") or {}
        added = len(content) if isinstance(content, str) else 0
        if isinstance(pattern.get("String"), str) and pattern["String"]:
            return max(1.0, added / len(pattern["String"]))
        try:  # a regex that can match the empty string inserts the content between characters
            import re

            empty = re.fullmatch(pattern.get("Regex", ""), "") is not None
        except (re.error, TypeError, RecursionError):
            empty = True
        return 1.0 + added if empty else max(1.0, float(added))
    return 1.0


def _check_text_growth(tk: Any, tokenizer_file: Path) -> None:
    """Refuse a normalizer or decoder whose Replace steps would multiply a text more than
    ``MAX_TEXT_GROWTH`` times (tokenizers would run out of memory and abort the process)."""
    for part in ("normalizer", "decoder"):
        obj = getattr(tk, part, None)
        if obj is None:
            continue
        try:
            node = json.loads(obj.__getstate__())
        except (ValueError, TypeError, AttributeError, RecursionError):
            continue
        growth = _growth(node)
        if growth > MAX_TEXT_GROWTH:
            raise SterError(f"failed to load tokenizer {tokenizer_file}: its {part}'s Replace steps can make a "
                            f"text {growth:.3g} times longer; real tokenizers do not lengthen text (ster refuses "
                            f"over {MAX_TEXT_GROWTH}x). The file is corrupt or crafted; re-download it")


#: Rank files read when a checkpoint has no tokenizer.json: file -> the tokenizer class
#: tokenizer_config.json must name (seed 002, "Local directory").
RANK_FILES = {"tokenizer.model": "ChatGLM4Tokenizer", "tiktoken.model": "TikTokenTokenizer"}


def rank_file_of(directory: Path) -> Path | None:
    """The tiktoken rank file a directory without tokenizer.json is read from, or None.

    ``tokenizer.model`` when tokenizer_config.json names ``ChatGLM4Tokenizer``, ``tiktoken.model`` when it
    names ``TikTokenTokenizer``; None when neither holds (any other tokenizer.model, e.g. SentencePiece's,
    is not read).

    Raises:
        SterError: tokenizer_config.json is unreadable or not a JSON object.
    """
    named = tokenizer_class_of(directory)
    for name, cls in RANK_FILES.items():
        if named == cls and (directory / name).exists():
            return directory / name
    return None


def tokenizer_class_of(directory: Path) -> str | None:
    """tokenizer_config.json's ``tokenizer_class`` (None when absent or not a string).

    Raises:
        SterError: tokenizer_config.json is unreadable or not a JSON object.
    """
    named = _read_json_object(directory / "tokenizer_config.json").get("tokenizer_class")
    return named if isinstance(named, str) else None


def _read_json(path: Path) -> Any:
    if not path.is_file():
        return None
    _check_regular_file(path, MAX_TOKENIZER_SIDE_FILE_BYTES, "tokenizer")
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError, RecursionError) as exc:
        detail = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise SterError(
            f"failed to load tokenizer {path}: {detail}. The file is not valid JSON; re-download or fix it."
        ) from None


def _read_json_object(path: Path) -> dict:
    """A JSON file that must hold an object; {} when the file is absent."""
    data = _read_json(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SterError(f"failed to load tokenizer {path}: it holds a JSON {type(data).__name__}, not an object "
                        "({...}); re-download or fix it")
    return data


def _token_text(value: Any, file: Path | None = None, key: str = "") -> str | None:
    """A special token as text: tokenizer_config.json writes a string or an AddedToken dict.

    Raises:
        SterError (when ``file`` is given): a dict whose ``content`` is not a string.
    """
    if isinstance(value, dict):
        content = value.get("content")
        if not isinstance(content, str) and file is not None:
            raise SterError(f"failed to load tokenizer {file}: {key}.content is {type(content).__name__}, not the "
                            "token's text (a string); fix the file")
        return content if isinstance(content, str) else None
    return value if isinstance(value, str) else None


def _added_token(value: Any, special: bool) -> AddedToken | None:
    if isinstance(value, str):
        # transformers' default for a special token given as text: not normalized, no strip.
        return AddedToken(value, special=special, normalized=not special)
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return AddedToken(
            value["content"],
            single_word=bool(value.get("single_word", False)),
            lstrip=bool(value.get("lstrip", False)),
            rstrip=bool(value.get("rstrip", False)),
            normalized=bool(value.get("normalized", not special)),
            special=bool(value.get("special", special)),
        )
    return None


def _add_missing_tokens(tk: tokenizers.Tokenizer, config: dict, named: dict[str, Any], file: Path) -> None:
    """Register tokens tokenizer_config.json knows but tokenizer.json lacks.

    As transformers' TokenizersBackend.__init__ does: ``added_tokens_decoder``
    entries in id order, then the named and extra special tokens that are not
    yet added tokens (a BOS that is only a model-vocabulary piece becomes a
    special added token, so ``<s>`` in a text is matched as one token).
    """
    present = {t.content for t in tk.get_added_tokens_decoder().values()}
    to_add: list[AddedToken] = []
    decoder = config.get("added_tokens_decoder") or {}
    if not isinstance(decoder, dict):
        raise SterError(f"failed to load tokenizer {file}: added_tokens_decoder is a {type(decoder).__name__}, not "
                        'an object of "id": token entries; fix the file')
    for key in decoder:
        if not (key.isascii() and key.isdigit()):
            raise SterError(f"failed to load tokenizer {file}: added_tokens_decoder has the key {key[:40]!r}, not "
                            "a token id (decimal digits); fix the file")
    for _, value in sorted(decoder.items(), key=lambda kv: int(kv[0])):
        token = _added_token(value, special=bool(isinstance(value, dict) and value.get("special")))
        if token is not None and token.content not in present:
            to_add.append(token)
            present.add(token.content)
    extra = config.get("additional_special_tokens") or config.get("extra_special_tokens") or []
    for value in [*named.values(), *(extra if isinstance(extra, list) else [])]:
        token = _added_token(value, special=True)
        if token is not None and token.content not in present:
            token.special = True
            to_add.append(token)
            present.add(token.content)
    for token in to_add:
        if token.special:
            tk.add_special_tokens([token])
        else:
            tk.add_tokens([token])


#: A chat template file larger than this is refused (real ones are a few to ~100 KB).
MAX_TEMPLATE_FILE_BYTES = 8 << 20


def _read_template_file(file: Path) -> str:
    try:
        size = file.stat().st_size
        if size > MAX_TEMPLATE_FILE_BYTES:
            raise SterError(f"chat template {file} is {size} bytes; ster reads templates of at most "
                            f"{MAX_TEMPLATE_FILE_BYTES} bytes. Fix or remove the file")
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SterError(f"chat template {file} is not UTF-8 text (invalid byte at offset {exc.start}); convert it "
                        "to UTF-8 or remove it") from None
    except OSError as exc:
        raise SterError(f"cannot read the chat template {file}: {exc.strerror or exc}") from None


def _read_chat_templates(directory: Path, config: dict) -> tuple[dict[str, str], str | None]:
    """Chat templates by name, in transformers' precedence (files over tokenizer_config.json),
    and the message of the first template that could not be read (None when all could): a template
    file that is not UTF-8, or a ``chat_template`` in tokenizer_config.json that is neither a string,
    a list of ``{"name": str, "template": str}`` entries nor a ``{name: template}`` object (the three
    forms transformers reads). Like an unreadable file, a malformed field is an error only once a
    template is wanted (``Tokenizer.chat_template``): the tokenizer itself still loads."""
    files: dict[str, str] = {}
    paths = []
    default_file = directory / "chat_template.jinja"
    if default_file.is_file():
        paths.append(("default", default_file))
    extra_dir = directory / "additional_chat_templates"
    if extra_dir.is_dir():
        paths += [(file.name.removesuffix(".jinja"), file) for file in sorted(extra_dir.glob("*.jinja"))
                  if file.is_file()]
    for name, file in paths:
        try:
            files[name] = _read_template_file(file)
        except SterError as exc:
            return {}, str(exc)
    if files:
        return files, None
    value = config.get("chat_template")
    if value is None:
        return {}, None
    if isinstance(value, str):
        return {"default": value}, None
    where = f"{directory / 'tokenizer_config.json'}: chat_template"
    fix = ("; fix or remove the field, or give a template with --chat-template-file (or --chat-template off for raw "
           "text)")
    if isinstance(value, dict):  # transformers' named templates as they are held in memory
        bad = next((k for k, v in value.items() if not isinstance(v, str)), None)
        if bad is None:
            return dict(value), None
        return {}, f"{where} {bad!r} is {_json_kind(value[bad])}, not a Jinja template (a string){fix}"
    if isinstance(value, list):
        templates = {}
        for i, t in enumerate(value, 1):
            if not (isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)):
                return {}, (f"{where} entry {i} is not {{\"name\": ..., \"template\": ...}} with two strings "
                            f"(got {json.dumps(t)[:60]}){fix}")
            templates[t["name"]] = t["template"]
        return templates, None
    return {}, (f"{where} is {_json_kind(value)}, not a Jinja template (a string) or a list of named templates"
                f"{fix}")


def _json_kind(value: Any) -> str:
    """'a number 5', 'true', 'an object', ... for a JSON value in an error message."""
    if isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return f"a number {json.dumps(value)[:40]}"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return "null" if value is None else type(value).__name__


def _as_id_list(value: Any, path: Path, key: str) -> list[int]:
    """An ``eos_token_id``: an id, a list of ids, or null. Anything else ("2", 2.5, [[2]], true) was
    once dropped in silence, and generation ran past the model's end token; now refused by name."""
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            raise SterError(f"failed to load tokenizer {path}: {key} must be a token id (an integer) or a list "
                            f"of them, got {json.dumps(v)[:40]}; fix the file")
    return values
