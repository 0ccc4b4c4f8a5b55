"""Turn the user's prompt into token ids, through the model's chat template or raw.

Shared by generate, capture and parity so the three see the same ids for the
same flags.
"""
from __future__ import annotations

from dataclasses import dataclass

from .chat import build_messages
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


def encode_prompt(tokenizer: Tokenizer, prompt: str, *, system: str | None = None,
                  chat_template: str = "auto") -> Prompt:
    """Encode ``prompt`` (and an optional system prompt) for generation.

    With a template (mode "auto" and the model has one) the messages are rendered
    with an assistant generation prompt and encoded without adding special tokens,
    as Transformers' ``apply_chat_template(tokenize=True)`` does (the template
    writes BOS itself). Raw text is encoded with the tokenizer's own BOS rule.

    Raises:
        SterError: an unknown mode; ``system`` without a template to place it in;
            a template error.
    """
    if chat_template not in CHAT_TEMPLATE_MODES:
        raise SterError(f"--chat-template must be one of {', '.join(CHAT_TEMPLATE_MODES)}, got {chat_template!r}")
    template = tokenizer.chat_template if chat_template == "auto" else None
    if template is None:
        if system is not None:
            raise SterError("--system needs a chat template, and this run has none "
                            f"({'--chat-template off' if chat_template == 'off' else 'the model ships no template'}); "
                            "put the instructions in --prompt instead")
        return Prompt(prompt, tokenizer.encode(prompt, add_special_tokens=True),
                      "off" if chat_template == "off" else "absent")
    text = tokenizer.render_chat(build_messages(prompt, system), add_generation_prompt=True)
    return Prompt(text, tokenizer.encode(text, add_special_tokens=False), "applied")
