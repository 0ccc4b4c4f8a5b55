"""Chat templates: render a conversation into a prompt string.

Model repositories ship their prompt format as a Jinja template (Hugging Face's
``chat_template``, or ``tokenizer.chat_template`` in a GGUF file). It is
untrusted code, so it runs in Jinja's immutable sandbox, in the environment
Hugging Face's ``apply_chat_template`` gives it (facts taken from
transformers/utils/chat_template_utils.py, transformers 5.x):

- ``trim_blocks=True`` and ``lstrip_blocks=True``; the ``loopcontrols``
  extension (``{% break %}``, ``{% continue %}``);
- globals ``raise_exception(message)``, ``strftime_now(format)`` (local time)
  and ``namespace`` (refusing underscore-prefixed names);
- a ``tojson`` filter laid out like Python's ``json.dumps`` with
  ``ensure_ascii=False`` by default (Jinja's own escapes HTML characters);
- a ``{% generation %}...{% endgeneration %}`` block tag (transformers uses it
  to mark assistant tokens for training masks); here it renders its body.

Variables: ``messages``, ``tools``, ``documents``, ``add_generation_prompt``,
the special-token strings (``bos_token``, ``eos_token``, ...) and any extra
keyword (``enable_thinking``, ...). Undefined variables render as empty text,
as in transformers (Jinja's default ``Undefined``).
"""
from __future__ import annotations

import contextvars
import json
import os
import traceback
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import SterError

__all__ = ["render_chat", "build_messages", "compile_template", "NOW_ENV"]

#: Environment variable pinning ``strftime_now`` (ISO-8601, e.g. ``2026-10-18T09:30:00``),
#: used when ``render_chat`` gets no ``now`` argument. For reproducible prompts and tests.
NOW_ENV = "STER_CHAT_NOW"

# The name Jinja gives a template compiled from a string; tracebacks carry it as the
# file name of the frames that run template code, which is how a line is found.
_TEMPLATE_FILENAME = "<template>"


class _RaisedByTemplate(jinja2.TemplateError):
    """What ``raise_exception`` raises, so the template's own message is kept apart."""


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}body{% endgeneration %}`` renders ``body`` unchanged.

    transformers records the span of the body to build assistant-token masks;
    a runtime has no use for the span but must still parse templates that use it.
    """

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        # A scope keeps assignments inside the block local, as a call block would.
        return jinja2.nodes.Scope(body).set_lineno(lineno)


class _Namespace(jinja2.utils.Namespace):
    """Jinja's ``namespace()`` that refuses attributes starting with ``_``.

    The sandbox already hides dunder attributes from reads; refusing to store
    them keeps a template from planting one (transformers does the same).
    """

    def __init__(*args, **kwargs):  # noqa: N805 - Jinja's Namespace takes ``self`` this way
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._refuse_private(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._refuse_private(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _refuse_private(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"a chat template may not store the underscore-prefixed attribute {name!r} on a namespace"
            )


# The clock strftime_now reads during one render (pinned or real), set by render_chat.
_CLOCK: contextvars.ContextVar[datetime | None] = contextvars.ContextVar("ster_chat_clock", default=None)


def _strftime_now(fmt):
    clock = _CLOCK.get()
    return (clock if clock is not None else datetime.now()).strftime(fmt)


def _raise_exception(message):
    raise _RaisedByTemplate(str(message))


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Python's json.dumps layout (", " and ": " separators, key order kept), which
    # is what the templates were written and tested against.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=32)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationTag],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["namespace"] = _Namespace
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def _template_line(exc: BaseException) -> int | None:
    """The template line an exception was raised at, from Jinja's rewritten traceback."""
    lineno = getattr(exc, "lineno", None)  # syntax errors carry it
    if lineno:
        return lineno
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == _TEMPLATE_FILENAME:
            line = frame.lineno  # the innermost template frame wins
    return line


def _error(source: str, exc: BaseException, what: str) -> SterError:
    line = _template_line(exc)
    where = f"chat template {source}" + (f", line {line}" if line else "")
    detail = str(exc).rstrip(". ")
    if isinstance(exc, _RaisedByTemplate):
        return SterError(f"{where} refused the conversation: {detail}")
    if isinstance(exc, jinja2.TemplateSyntaxError):
        return SterError(f"{where}: syntax error: {detail}. The template is not valid Jinja; fix it or use another one.")
    return SterError(
        f"{where}: {what}: {detail}. The template cannot render this conversation; "
        "check the messages' roles and fields, or use another template."
    )


def compile_template(template: str, *, source: str = "(inline)") -> jinja2.Template:
    """Compile a chat template in the sandboxed environment (cached per text).

    Raises:
        SterError: the template is not valid Jinja ("chat template SOURCE, line N: syntax error: ...").
    """
    try:
        return _compile(template)
    except jinja2.TemplateSyntaxError as exc:
        raise _error(source, exc, "syntax error") from None


def _resolve_now(now: datetime | str | None) -> datetime:
    if isinstance(now, datetime):
        return now
    text = now if now is not None else os.environ.get(NOW_ENV)
    if not text:
        return datetime.now()
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise SterError(
            f"cannot read the pinned clock {text!r} (from {'now=' if now is not None else NOW_ENV}); "
            "give an ISO-8601 date-time such as 2026-10-18T09:30:00"
        ) from None


def _normalize_messages(messages: list[dict]) -> list[dict]:
    """Copy messages the way transformers' apply_chat_template prepares them.

    Keys whose value is None are dropped (OpenAI-style ``content: None`` would
    otherwise render as the text "None"), and a message's reasoning given as
    ``reasoning_content``, ``thinking`` or ``reasoning`` is also exposed as
    ``reasoning_content`` and ``thinking``, the names templates read.
    """
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise SterError(
                f"chat message {i} is a {type(message).__name__}, not a dict; "
                'give each message as {"role": ..., "content": ...}'
            )
        message = {key: value for key, value in message.items() if value is not None}
        reasoning = next(
            (message[k] for k in ("reasoning_content", "thinking", "reasoning") if k in message), None
        )
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def render_chat(
    template: str,
    messages: list[dict],
    *,
    add_generation_prompt: bool = True,
    bos_token: str | None = None,
    eos_token: str | None = None,
    tools: list[dict] | None = None,
    documents: list[dict] | None = None,
    now: datetime | str | None = None,
    source: str = "(inline)",
    **extra: Any,
) -> str:
    """Render ``messages`` with a Hugging Face-style Jinja chat template.

    Args:
        template: the Jinja source (tokenizer_config.json ``chat_template``,
            chat_template.jinja, or GGUF ``tokenizer.chat_template``).
        messages: OpenAI-shaped dicts (``role``, ``content``, optional
            ``tool_calls``, ``reasoning_content``...). Not modified.
        add_generation_prompt: end with the header of an assistant turn.
        bos_token, eos_token: the special-token texts the template may print;
            None leaves the variable undefined (renders as ""), as transformers
            does for a tokenizer without that token.
        tools: JSON-schema tool descriptions, passed as is (``None`` stays None:
            templates test ``tools is not none``).
        documents: retrieval documents, for templates that read them.
        now: the clock ``strftime_now`` reads (a datetime or ISO-8601 text);
            default: the environment variable STER_CHAT_NOW, else local time.
        source: a name for the template in error messages (file, GGUF key).
        **extra: more template variables (``enable_thinking``, ``pad_token``...).

    Returns:
        The prompt text, to be encoded by ``Tokenizer.encode``.

    Raises:
        SterError: a syntax error, an undefined value used in an operation,
            a sandbox violation, or the template's own ``raise_exception``; the
            message names ``source`` and the template line.

    Source of the conventions: transformers ``render_jinja_template`` /
    ``_compile_jinja_template`` (utils/chat_template_utils.py).
    """
    compiled = compile_template(template, source=source)
    clock = _resolve_now(now)
    context: dict[str, Any] = {}
    if bos_token is not None:
        context["bos_token"] = bos_token
    if eos_token is not None:
        context["eos_token"] = eos_token
    context.update(extra)
    context.update(
        messages=_normalize_messages(messages),
        tools=tools,
        documents=documents,
        add_generation_prompt=add_generation_prompt,
    )
    token = _CLOCK.set(clock)
    try:
        return compiled.render(**context)
    except _RaisedByTemplate as exc:
        raise _error(source, exc, "raised") from None
    except jinja2.UndefinedError as exc:
        raise _error(source, exc, "undefined value") from None
    except jinja2.exceptions.SecurityError as exc:
        raise _error(source, exc, "sandbox refused an operation") from None
    except jinja2.TemplateError as exc:
        raise _error(source, exc, "render error") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError, OverflowError,
            ArithmeticError, RecursionError, MemoryError, NameError, AssertionError, UnicodeError) as exc:
        # Python errors from operations the template performs (e.g. "a" + 1).
        raise _error(source, exc, type(exc).__name__) from None
    finally:
        _CLOCK.reset(token)


def build_messages(prompt: str, system: str | None = None) -> list[dict]:
    """The message list for a single user turn, with an optional system prompt.

    Returns:
        ``[{"role": "system", "content": system}, {"role": "user", "content": prompt}]``
        (the system message only when ``system`` is given).
    """
    messages = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": prompt})
    return messages
