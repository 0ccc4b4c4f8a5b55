"""Turn the user's prompt into token ids, through the model's chat template or raw.

Shared by generate, capture and parity so the three see the same ids for the
same flags.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

from .chat import DEFAULT_MAX_CHARS, build_messages, check_surrogates
from .errors import SterError
from .tokenizer import Tokenizer

CHAT_TEMPLATE_MODES = ("auto", "off")


@dataclass(frozen=True)
class Prompt:
    """The ids the model sees and how they were made.

    ``chat_template`` is "applied", "absent" (auto, but the model has none: raw
    text) or "off" (the user asked for raw text).
    """

    text: str
    ids: list[int]
    chat_template: str


# tokenizer -> the length of its longest token text, computed once per tokenizer.
_LONGEST: "weakref.WeakKeyDictionary[Tokenizer, int]" = weakref.WeakKeyDictionary()


def longest_token_chars(tokenizer: Tokenizer) -> int:
    """Characters in the longest token text of the vocabulary, added tokens included (at least 1)."""
    try:
        return _LONGEST[tokenizer]
    except (KeyError, TypeError):
        pass
    longest = max(map(len, tokenizer.tk.get_vocab(with_added_tokens=True)), default=1) or 1
    try:
        _LONGEST[tokenizer] = longest
    except TypeError:
        pass
    return longest


def prompt_context(spec) -> int | None:
    """The positions a prompt may fill: ``max_position_embeddings``, or None (no limit) when
    a layer rotates with dynamic NTK, which exists to run past it (``generate.generate``'s rule)."""
    if any(layer.rope is not None and layer.rope.dynamic for layer in spec.layers):
        return None
    return spec.max_position_embeddings


def max_prompt_chars(tokenizer: Tokenizer, context: int) -> int:
    """The longest prompt text (characters) that could encode into ``context`` tokens.

    A token covers at most the characters of its own text, and the vocabulary's
    longest text bounds that: byte-level BPE stores one character per byte, and a
    text character is at least one byte; SentencePiece stores its characters (and
    byte-fallback tokens as six-character ``<0xNN>``). So ``context x longest``
    characters can never be refused for a prompt that fits the context. (A tokenizer
    that drops text, such as BERT's whitespace splitting, could pack more; no decoder
    family ster runs has one.) Capped at the renderer's own ``DEFAULT_MAX_CHARS``.
    """
    return min(context * longest_token_chars(tokenizer), DEFAULT_MAX_CHARS)


def check_prompt_text(text: str, what: str = "--prompt") -> None:
    """Refuse a prompt that is empty or only whitespace, before anything is loaded.

    Through a chat template an empty user turn still renders, and the model answers a
    blank message; as raw text it encodes to nothing (or BOS alone). Neither is a
    request anyone means, so both template modes refuse it.

    Raises:
        SterError: naming ``what`` (the option or prompt the text came from).
    """
    if not text.strip():
        kind = "empty" if not text else "only whitespace"
        raise SterError(f"{what} is {kind}; give the text the model should answer (or, with "
                        "--chat-template off, continue)")


def encode_prompt(tokenizer: Tokenizer, prompt: str, *, system: str | None = None,
                  chat_template: str = "auto", context: int | None = None) -> Prompt:
    """Encode ``prompt`` (and an optional system prompt) for generation.

    With a template (mode "auto" and the model has one) the messages are rendered
    with an assistant generation prompt and encoded without adding special tokens,
    as Transformers' ``apply_chat_template(tokenize=True)`` does (the template
    writes BOS itself). Raw text is encoded with the tokenizer's own BOS rule.

    With ``context`` (the model's positions, ``prompt_context(spec)``), a text longer
    than ``max_prompt_chars`` is refused before it is tokenized, and the template is
    stopped as soon as it builds one: a gigantic prompt costs no tokenizing time or
    memory (the token count is still checked by ``generate``).

    Raises:
        SterError: an unknown mode; an empty or whitespace-only prompt (``check_prompt_text``);
            ``system`` without a template to place it in; a template error; a lone surrogate
            in the text; a text that cannot fit ``context``.
    """
    if chat_template not in CHAT_TEMPLATE_MODES:
        raise SterError(f"--chat-template must be one of {', '.join(CHAT_TEMPLATE_MODES)}, got {chat_template!r}")
    check_prompt_text(prompt, "the prompt")
    check_surrogates(prompt, "the prompt")
    if system is not None:
        check_surrogates(system, "the system prompt")
    limit, why = DEFAULT_MAX_CHARS, None
    if context is not None:
        limit = max_prompt_chars(tokenizer, context)
        why = (f"a prompt for the model's context of {context} tokens, each at most "
               f"{longest_token_chars(tokenizer)} characters")
    template = tokenizer.chat_template if chat_template == "auto" else None
    if template is None:
        if system is not None:
            raise SterError("--system needs a chat template, and this run has none "
                            f"({'--chat-template off' if chat_template == 'off' else 'the model ships no template'}); "
                            "put the instructions in --prompt instead")
        _check_length(prompt, limit, why)
        return Prompt(prompt, tokenizer.encode(prompt, add_special_tokens=True),
                      "off" if chat_template == "off" else "absent")
    _check_length(prompt, limit, why)
    text = tokenizer.render_chat(build_messages(prompt, system), add_generation_prompt=True, max_chars=limit,
                                 max_chars_reason=why)
    return Prompt(text, tokenizer.encode(text, add_special_tokens=False), "applied")


def _check_length(text: str, limit: int, why: str | None) -> None:
    if why is not None and len(text) > limit:
        raise SterError(f"the prompt is {len(text)} characters, more than could fit ({limit} characters: {why}); "
                        "shorten it")
