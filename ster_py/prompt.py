"""Turn the user's prompt into token ids, through the model's chat template or raw.

Shared by generate, capture and parity so the three see the same ids for the
same flags.
"""
from __future__ import annotations

import re
import weakref
from dataclasses import dataclass

from .chat import DEFAULT_MAX_CHARS, build_messages, check_surrogates
from .errors import ContextFull, SterError
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


#: Texts up to this many characters are tokenized whole (the exact count; cheap). Longer ones are
#: counted in pieces of about this size first (``refuse_if_too_long``).
PIECE_CHARS = 1 << 16
#: A non-space character followed by a space: where a long prompt is cut into pieces.
_WORD_END = re.compile(r"\S\s")


def refuse_if_too_long(tokenizer: Tokenizer, text: str, context: float | None, *, add_special_tokens: bool,
                       what: str = "the prompt") -> None:
    """Refuse a text far too long for ``context`` tokens without tokenizing all of it.

    Why not a bound on characters: no count of characters or UTF-8 bytes proves a text too
    long for every tokenizer. A normalizer may delete or shrink text (``Replace`` to "",
    ``Strip``, NFKC composing three jamo into one syllable), a pre-tokenizer may drop it
    (``WhitespaceSplit``), and a model may cover an unbounded run with one id (WordLevel's
    unknown word, BPE/Unigram ``fuse_unk`` runs): "x" * 10**7 can be one token. So the only
    proof is the count itself, and the tokenizer must be run.

    What is bounded instead is the work: a text longer than ``PIECE_CHARS`` is tokenized in
    pieces of about that size, cut where a whitespace follows a non-whitespace character, and
    counting stops once the pieces' ids pass ``2 * context + 8`` -- the cost is that of about
    twice the context, whatever the text's size. The pieces' count is not the whole text's
    (a cut may change the ids next to it: a prefix space, a merge across it, special tokens
    added per piece), hence the margin: for the whole text to fit, the cuts would have to
    halve the count, while a cut at a pre-token boundary (the regex pre-tokenizers of
    byte-level BPE split there) changes at most the ids next to it. A text that passes is
    tokenized whole and its exact count checked by ``generate.generate``.

    Args:
        tokenizer: the model's tokenizer.
        text: the prompt text (rendered, if a template applies), str.
        context: the positions it may fill (tokens); None or infinity: no check.
        add_special_tokens: as the caller will encode the text.
        what: how the error names the text.
    Raises:
        ContextFull: the text is far longer than ``context`` tokens.
    """
    if context is None or context == float("inf") or len(text) <= PIECE_CHARS:
        return
    budget, count, start = 2 * int(context) + 8, 0, 0
    while start < len(text) and count <= budget:
        end = min(start + PIECE_CHARS, len(text))
        if end < len(text):   # cut before the next whitespace that follows a non-whitespace character
            m = _WORD_END.search(text, end - 1, min(end + PIECE_CHARS, len(text)))
            end = m.start() + 1 if m is not None else min(end + PIECE_CHARS, len(text))
        count += len(tokenizer.encode(text[start:end], add_special_tokens=add_special_tokens and start == 0))
        start = end
    if count > budget:
        counted = f"about {count:,} tokens" if start >= len(text) else \
            f"its first {start:,} characters alone are {count:,} tokens"
        raise ContextFull(f"{what} is {len(text):,} characters, far more than the context of {int(context):,} "
                          f"tokens holds ({counted}); shorten it")


def check_prompt_text(text: str, what: str = "--prompt", *, templated: bool = True) -> None:
    """Refuse a prompt that is empty or only whitespace, before anything is loaded.

    Through a chat template an empty user turn still renders, and the model answers a
    blank message; as raw text it encodes to nothing (or BOS alone). Neither is a
    request anyone means, so both template modes refuse it.

    Args:
        templated: False for a command that sends its prompts as raw text and has no
            ``--chat-template`` (parity): the message then does not point to that option.

    Raises:
        SterError: naming ``what`` (the option or prompt the text came from); a ``text`` that is not a
            str (a library caller's number or None).
    """
    if not isinstance(text, str):
        raise SterError(f"{what} must be text (a str), got {type(text).__name__}")
    if not text.strip():
        kind = "empty" if not text else "only whitespace"
        wanted = ("the text the model should answer (or, with --chat-template off, continue)" if templated
                  else "the text the model should continue")
        raise SterError(f"{what} is {kind}; give {wanted}")


def encode_prompt(tokenizer: Tokenizer, prompt: str, *, system: str | None = None,
                  chat_template: str = "auto", context: int | None = None) -> Prompt:
    """Encode ``prompt`` (and an optional system prompt) for generation.

    With a template (mode "auto" and the model has one) the messages are rendered
    with an assistant generation prompt and encoded without adding special tokens,
    as Transformers' ``apply_chat_template(tokenize=True)`` does (the template
    writes BOS itself). Raw text is encoded with the tokenizer's own BOS rule.

    With ``context`` (the model's positions, ``prompt_context(spec)``), a text far longer
    than the context is refused after tokenizing about twice the context's worth of it
    (``refuse_if_too_long``), and the template is stopped once its text passes
    ``context x`` the longest token's characters (a template that runs away): a gigantic
    prompt costs no more tokenizing time or memory than a long one (the exact count is
    still checked by ``generate``).

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
        if not isinstance(system, str):
            raise SterError(f"the system prompt must be text (a str), got {type(system).__name__}")
        check_surrogates(system, "the system prompt")
    limit, why = DEFAULT_MAX_CHARS, None
    if context is not None:
        # the template's own text (what it adds around the messages) is bounded by the context:
        # a template that runs away stops early; the user's texts are judged by their tokens
        limit = min(len(prompt) + len(system or "") + context * longest_token_chars(tokenizer), DEFAULT_MAX_CHARS)
        why = (f"the prompt's text and the model's context of {context} tokens, each at most "
               f"{longest_token_chars(tokenizer)} characters")
    template = tokenizer.chat_template if chat_template == "auto" else None
    if template is None:
        if system is not None:
            raise SterError("--system needs a chat template, and this run has none "
                            f"({'--chat-template off' if chat_template == 'off' else 'the model ships no template'}); "
                            "put the instructions in --prompt instead")
        refuse_if_too_long(tokenizer, prompt, context, add_special_tokens=True)
        return Prompt(prompt, tokenizer.encode(prompt, add_special_tokens=True),
                      "off" if chat_template == "off" else "absent")
    text = tokenizer.render_chat(build_messages(prompt, system), add_generation_prompt=True, max_chars=limit,
                                 max_chars_reason=why)
    refuse_if_too_long(tokenizer, text, context, add_special_tokens=False)
    return Prompt(text, tokenizer.encode(text, add_special_tokens=False), "applied")
