"""Chat templates: render a conversation into a prompt string.

Model repositories ship their prompt format as a Jinja template (Hugging Face's
``chat_template``, or ``tokenizer.chat_template`` in a GGUF file). It is
untrusted code, so it runs in Jinja's immutable sandbox, in the environment
Hugging Face's ``apply_chat_template`` gives it (facts taken from
transformers/utils/chat_template_utils.py, transformers 5.x):

- ``trim_blocks=True`` and ``lstrip_blocks=True``; the ``loopcontrols``
  extension (``{% break %}``, ``{% continue %}``);
- globals ``raise_exception(message)``, ``strftime_now(format)`` (local time),
  ``namespace`` (refusing underscore-prefixed names) and ``dict`` (a call and
  ``dict.fromkeys``, nothing else of the type);
- a ``tojson`` filter laid out like Python's ``json.dumps`` with
  ``ensure_ascii=False`` by default (Jinja's own escapes HTML characters);
- a ``{% generation %}...{% endgeneration %}`` block tag (transformers uses it
  to mark assistant tokens for training masks); here it renders its body;
- Python's own methods on strings, lists and dicts, minus what the immutable
  sandbox forbids (``list.append``, ``dict.update``, dunder attributes...).

Variables: ``messages``, ``tools``, ``documents``, ``add_generation_prompt``,
the special-token strings (``bos_token``, ``eos_token``, ...) and any extra
keyword (``enable_thinking``, ...). Undefined variables render as empty text,
as in transformers (Jinja's default ``Undefined``).

Budgets (ours, not transformers'): a hostile or broken template must not hang
the process or eat its memory. Every loop step, call, filter and intercepted
operator checks a wall-clock deadline (``time_limit``, default 10 s, or
$STER_CHAT_TIME_LIMIT). Every text the template builds (``*``, ``+``, ``~``,
``%``, string methods and filters that pad, repeat, replace or join, captured
blocks, the output) is capped at ``max_chars`` characters, every list at
``MAX_ITEMS`` items and every integer at ``MAX_INT_BITS`` bits, checked *before*
the allocation where the size can be known in advance. Values are also weighed
(how long their text would be, memoized per render) where they are built
(literals, calls, filters) and where they become text, so a value nested in
itself n times cannot make a 2**n-character string. Jinja's sandbox already
caps ``range()`` at 100000 items. Real templates render ordinary conversations
in milliseconds, far inside every budget.
"""
from __future__ import annotations

import contextvars
import functools
import inspect
import json
import numbers
import os
import re
import string
import time
import traceback
from dataclasses import dataclass, replace
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.filters
import jinja2.nodes
import jinja2.runtime
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from .errors import SterError, TemplateError
from .files import expand_user, user_path

__all__ = ["render_chat", "check_surrogates", "build_messages", "compile_template", "check_messages", "check_tools", "ModelTemplate",
           "load_model_template", "NOW_ENV", "TIME_LIMIT_ENV", "DEFAULT_TIME_LIMIT", "DEFAULT_MAX_CHARS",
           "MAX_ITEMS"]

#: Environment variable pinning ``strftime_now`` (ISO-8601, e.g. ``2026-10-18T09:30:00``),
#: used when ``render_chat`` gets no ``now`` argument. For reproducible prompts and tests.
NOW_ENV = "STER_CHAT_NOW"

#: Wall-clock seconds one render may take before it is stopped (the slowest of llama.cpp's
#: 70 templates, Gemma 4's, needs about 2 s for a 600-message conversation on one core).
DEFAULT_TIME_LIMIT = 10.0
#: Environment variable overriding DEFAULT_TIME_LIMIT (seconds) when render_chat gets no time_limit.
TIME_LIMIT_ENV = "STER_CHAT_TIME_LIMIT"
#: Longest text (characters) a template may build or output: 32 Mi, about 8 M tokens,
#: beyond any context window.
DEFAULT_MAX_CHARS = 1 << 25
#: Longest list a template may build by repetition or addition.
MAX_ITEMS = 1 << 20
#: Largest integer (bits) a template may build with ``*`` or ``**``.
MAX_INT_BITS = 1 << 16

#: Longest chat template (characters) compiled, whatever its source (file, tokenizer_config.json,
#: GGUF metadata): real ones are at most ~100 k; compiling costs time and memory per character.
MAX_TEMPLATE_CHARS = 1 << 20
#: Address space (bytes) one render may add to the process: compile and render run in a forked
#: child under this limit and a kill at its time limit (+ ``_KILL_GRACE`` s), so a single C-level
#: call (``|sort``, ``|urlize``, a compile of thousands of blocks) cannot overrun the budgets.
MAX_RENDER_MEMORY = 2 << 30
_KILL_GRACE = 2.0

# The name Jinja gives a template compiled from a string; tracebacks carry it as the
# file name of the frames that run template code, which is how a line is found.
_TEMPLATE_FILENAME = "<template>"


class _RaisedByTemplate(jinja2.TemplateError):
    """What ``raise_exception`` raises, so the template's own message is kept apart."""


class _OverBudget(Exception):
    """A render went over its time or size budget.

    Not a TypeError/LookupError/AttributeError: Jinja swallows those in places
    (attribute lookup, ``loop.length``), and a budget stop must never be swallowed.
    """


# ------------------------------------------------------------------ budgets

@dataclass
class _Budget:
    deadline: float | None  # time.monotonic() value; None outside a render (compile-time folding)
    time_limit: float
    max_chars: int
    # id(container) -> (container, text weight), for this render. The sandbox forbids
    # changing lists and dicts, so a weight stays true; holding the object keeps its id.
    weights: dict | None = None
    # Why max_chars is what it is, when a caller derived it (e.g. from a model's context).
    why: str | None = None


_DEFAULT_BUDGET = _Budget(None, DEFAULT_TIME_LIMIT, DEFAULT_MAX_CHARS)
_BUDGET: contextvars.ContextVar[_Budget] = contextvars.ContextVar("ster_chat_budget", default=_DEFAULT_BUDGET)


def _tick() -> _Budget:
    budget = _BUDGET.get()
    if budget.deadline is not None and time.monotonic() > budget.deadline:
        raise _OverBudget(
            f"the template ran longer than its time budget ({budget.time_limit:g} s) and was stopped "
            "(a template that loops without end or a hostile one; real templates take milliseconds)"
        )
    return budget


def _too_long(what: str, size: int, limit: int, unit: str = "characters") -> _OverBudget:
    budget = _BUDGET.get()
    why = budget.why if unit == "characters" and limit == budget.max_chars else None
    exc = _OverBudget(f"the template tried to build {what} of {size} {unit}, over its budget of {limit} {unit}"
                      + (f" ({why})" if why else ""))
    exc.why = why
    return exc


def _check_text(size: int, what: str = "a text") -> None:
    limit = _BUDGET.get().max_chars
    if size > limit:
        raise _too_long(what, size, limit)


def _check_items(size: int) -> None:
    if size > MAX_ITEMS:
        raise _too_long("a list", size, MAX_ITEMS, "items")


def _weight(value: Any, memo: dict, limit: int, fresh: dict | None = None) -> int:
    """About how many characters ``str(value)`` has, without building it.

    Lists, tuples and dicts are weighed once per render (``memo``, by id: the sandbox
    keeps them unchanged), namespaces once per call (``fresh``: they change), so a
    value holding the same big value twice, built up n times, costs n steps to weigh
    although its text is 2**n long; the walk stops counting past ``limit``.
    """
    fresh = {} if fresh is None else fresh
    if isinstance(value, str):
        return len(value) + 2
    if value is None or isinstance(value, (bool, float)):
        return 8
    if isinstance(value, int):
        return value.bit_length() // 3 + 2
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        hit = memo.get(id(value))
        if hit is not None:
            return hit[1]
        total = 2
        for item in (value.items() if isinstance(value, dict) else value):
            total += _weight(item, memo, limit, fresh) + 2
            if total > limit:
                break
        memo[id(value)] = (value, total)
        return total
    if isinstance(value, jinja2.utils.Namespace):
        hit = fresh.get(id(value))
        if hit is not None:
            return hit
        fresh[id(value)] = limit + 1  # a namespace inside itself: its text never ends
        try:
            attrs = dict(object.__getattribute__(value, "_Namespace__attrs"))
        except AttributeError:
            attrs = {}
        fresh[id(value)] = 16 + _weight(attrs, {}, limit, fresh)
        return fresh[id(value)]
    return 64  # functions, macros, undefined...: short reprs


def _check_weight(value: Any, what: str = "a text") -> Any:
    """Refuse ``value`` if turning it into text (output, ``~``, ``%``, filters) would
    exceed the text budget; returns it unchanged."""
    if isinstance(value, str):
        _check_text(len(value), what)
        return value
    budget = _BUDGET.get()
    memo = budget.weights if budget.weights is not None else {}
    weight = _weight(value, memo, budget.max_chars)
    if weight > budget.max_chars:
        raise _too_long(what, weight, budget.max_chars)
    return value


def _check_sized(value: Any) -> Any:
    """Refuse a just-built str, list or dict over budget (for operations that at most
    double a size, and for list/dict literals)."""
    if isinstance(value, str):
        _check_text(len(value))
    elif isinstance(value, (list, tuple, dict)):
        _check_items(len(value))
        _check_weight(value, "a list with a text form")
    elif isinstance(value, jinja2.utils.Namespace):
        _check_weight(value, "a namespace with a text form")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_repeat(seq: Any, times: Any) -> None:
    """``seq * times`` for a str/list/tuple and an int, checked before it allocates."""
    if not _is_int(times) and not isinstance(times, bool):
        return
    n = max(int(times), 0)
    if isinstance(seq, str):
        _check_text(len(seq) * n)
    elif isinstance(seq, (list, tuple)):
        _check_items(len(seq) * n)
        budget = _BUDGET.get()
        memo = budget.weights if budget.weights is not None else {}
        _check_text(_weight(seq, memo, budget.max_chars) * n, "a list with a text form")


def _check_int_bits(bits: int) -> None:
    if bits > MAX_INT_BITS:
        raise _too_long("an integer", bits, MAX_INT_BITS, "bits")


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[a-zA-Z%]")


def _format_bound(fmt: str, widths: int, values: list) -> None:
    """Refuse a formatted text that could exceed the text budget: the format's own text, plus
    every field's width or precision, plus the text of the value each field prints."""
    budget = _BUDGET.get()
    memo = budget.weights if budget.weights is not None else {}
    total = len(fmt) + widths
    for value in values:
        total += _weight(value, memo, budget.max_chars)
        if total > budget.max_chars:
            break
    _check_text(total, "a formatted text")


def _field_value(name: str, args: tuple, kwargs: dict, auto: int) -> Any:
    """The argument a str.format field prints (the whole argument when it indexes into it)."""
    head = re.match(r"[^.\[]*", name).group(0)
    if head == "":
        return args[auto] if auto < len(args) else None
    if head.isdecimal():   # as str.format reads a field: "{²}" is a key, not an index
        return args[int(head)] if int(head) < len(args) else None
    return kwargs.get(head)


def _check_percent_format(fmt: str, args: Any) -> None:
    """``fmt % args``: refuse field widths or precisions, or fields, that add up over the text budget."""
    limit = _BUDGET.get().max_chars
    star, widths = False, 0
    specs = _PERCENT_SPEC.findall(fmt)
    for width, precision in specs:
        for value in (width, precision):
            if value == "*":
                star = True
            elif value:
                if int(value) > limit:
                    raise _too_long("a formatted field", int(value), limit)
                widths += int(value)
    if star:
        for value in args if isinstance(args, tuple) else (args,):
            if _is_int(value):
                if abs(value) > limit:
                    raise _too_long("a formatted field", abs(value), limit)
                widths += abs(value)
    _check_weight(args, "a formatted text")
    if isinstance(args, dict):  # %(name)s fields: each prints one value
        values = [args.get(key) for key in re.findall(r"%\(([^)]*)\)", fmt)]
    else:  # one value per field, in order (a lone argument may be printed once)
        values = list(args) if isinstance(args, tuple) else [args]
    _format_bound(fmt, widths, values)


def _check_brace_format(fmt: str, args: tuple, kwargs: dict) -> None:
    """``fmt.format(...)``: refuse a width or precision over the text budget, literal or nested."""
    limit = _BUDGET.get().max_chars
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # malformed: str.format raises the same error itself
    widths, values, auto = 0, [], 0
    for _, name, spec, _ in fields:
        if name is not None:
            values.append(_field_value(name, args, kwargs, auto))
            auto += name == "" or name[0] in ".["
        if not spec:
            continue
        if "{" in spec:  # the width comes from an argument
            for value in (*args, *kwargs.values()):
                if _is_int(value):
                    if abs(value) > limit:
                        raise _too_long("a formatted field", abs(value), limit)
                    widths += abs(value)
        for digits in re.findall(r"\d+", spec):
            if int(digits) > limit:
                raise _too_long("a formatted field", int(digits), limit)
            widths += int(digits)
    _check_weight(args, "a formatted text")
    _check_weight(kwargs, "a formatted text")
    _format_bound(fmt, widths, values)


def _replace_size(s: str, old: str, new: str, count: Any = -1) -> int:
    n = len(s) + 1 if old == "" else s.count(old)
    if _is_int(count) and count >= 0:
        n = min(n, count)
    return len(s) + n * (len(new) - len(old))


def _materialize_join(sep: str, items: Any) -> list:
    """A list of ``items`` after checking that ``sep.join`` of them fits the budget."""
    _tick()
    items = list(items)
    _check_items(len(items))
    _check_text(len(sep) * max(len(items) - 1, 0))
    _check_weight(items)
    return items


def _check_str_method(method: Any, args: tuple, kwargs: dict) -> tuple:
    """Size checks for the str methods that can amplify a text; returns the (possibly
    materialized) positional arguments to call with."""
    owner = getattr(method, "__self__", None)
    name = getattr(method, "__name__", None)
    if name in ("format", "format_map") and hasattr(method, "__wrapped__"):
        owner = getattr(method.__wrapped__, "__self__", None)  # the sandbox's wrapped str.format
        if isinstance(owner, str):
            if name == "format_map" and args and isinstance(args[0], dict):
                _check_brace_format(owner, (), args[0])
            else:
                _check_brace_format(owner, args, kwargs)
        return args
    if not isinstance(owner, str):
        return args
    limit = _BUDGET.get().max_chars
    if name in ("ljust", "rjust", "center", "zfill"):
        width = args[0] if args else kwargs.get("width")
        if _is_int(width) and width > limit:
            raise _too_long(f"a text with str.{name}", width, limit)
    elif name == "expandtabs":
        tabsize = args[0] if args else kwargs.get("tabsize", 8)
        if _is_int(tabsize):
            _check_text(len(owner) + owner.count("\t") * max(tabsize, 0))
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        _check_text(_replace_size(owner, args[0], args[1], args[2] if len(args) > 2 else kwargs.get("count", -1)))
    elif name == "translate" and args and isinstance(args[0], dict):
        longest = max((len(v) for v in args[0].values() if isinstance(v, str)), default=1)
        _check_text(len(owner) * max(longest, 1))
    elif name == "join" and args:
        return (_materialize_join(owner, args[0]), *args[1:])
    return args


# --------------------------------------------------------------- filters

def _guard_filter(original, check=None, weigh_args=False):
    """``original`` (a Jinja filter) with budget checks: ``weigh_args`` weighs its
    arguments first (for filters that turn them into text), ``check(bound_arguments)``
    runs before it and may rewrite arguments, and a str/list/dict result is checked.
    The wrapper keeps the filter's pass_context/environment marker."""

    signature = inspect.signature(original)
    # Jinja's async-capable filters take an eval context their signature does not show.
    lead = int(hasattr(original, "jinja_pass_arg") and not hasattr(inspect.unwrap(original), "jinja_pass_arg"))

    @functools.wraps(original)
    def guarded(*args, **kwargs):
        _tick()
        if weigh_args:
            for value in (*args[lead:], *kwargs.values()):
                _check_weight(value)
        if check is not None:
            try:
                bound = signature.bind(*args[lead:], **kwargs)
                bound.apply_defaults()
            except TypeError:
                pass  # the filter raises its own argument error below
            else:
                check(bound.arguments)
                args, kwargs = (*args[:lead], *bound.args), bound.kwargs
        return _check_sized(original(*args, **kwargs))

    return guarded


def _check_center(a):
    if _is_int(a.get("width")) and a["width"] > _BUDGET.get().max_chars:
        raise _too_long("a text with |center", a["width"], _BUDGET.get().max_chars)


def _check_indent(a):
    text, width = a.get("s"), a.get("width")
    text = text if isinstance(text, str) else str(text)
    pad = len(width) if isinstance(width, str) else (max(width, 0) if _is_int(width) else 0)
    _check_text(len(text) + pad * (text.count("\n") + 1), "an indented text")


def _check_replace(a):
    s, old, new = a.get("s"), a.get("old"), a.get("new")
    if isinstance(s, str) and isinstance(old, str) and isinstance(new, str):
        count = a.get("count")
        _check_text(_replace_size(s, old, new, -1 if count is None else count))


def _check_format(a):
    if isinstance(a.get("value"), str):
        args = a.get("args", ())
        _check_percent_format(a["value"], args if len(args) != 1 else args[0])


def _check_join(a):
    a["value"] = _materialize_join(a.get("d", "") if isinstance(a.get("d"), str) else "", a.get("value", ()))


def _check_count(key):
    def check(a):
        if _is_int(a.get(key)):
            _check_items(a[key])
    return check


def _check_wordwrap(a):
    s, width, wrap = a.get("s"), a.get("width"), a.get("wrapstring")
    if isinstance(s, str) and isinstance(wrap, str) and _is_int(width):
        breaks = min(len(s), len(s) // max(width, 1) + s.count(" ") + s.count("-") + s.count("\n") + 1)
        _check_text(len(s) + breaks * len(wrap), "a wrapped text")


def _check_list(a):
    if isinstance(a.get("value"), str):
        _check_items(len(a["value"]))


@jinja2.pass_environment
def _sum(environment, iterable, attribute=None, start=0):
    """Jinja's ``sum`` filter, folding step by step so each ``+`` is size-checked and timed."""
    if attribute is not None:
        iterable = map(jinja2.filters.make_attrgetter(environment, attribute), iterable)
    total = start
    for item in iterable:
        _tick()
        total = _check_sized(total + item)
    return total


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Python's json.dumps layout (", " and ": " separators, key order kept), which
    # is what the templates were written and tested against.
    _tick()
    if (_is_int(indent) and indent > 1024) or (isinstance(indent, str) and len(indent) > 1024):
        raise _too_long("a JSON indent", indent if _is_int(indent) else len(indent), 1024)
    _check_weight(value, "a JSON text")
    if indent is not None:  # every line is indented by its depth: a deep value multiplies the indent
        step = indent if _is_int(indent) else len(indent) if isinstance(indent, str) else 0
        lines, depth = _lines_and_depth(value)
        _check_text(lines * max(step, 0) * depth, "an indented JSON text")
    return _check_sized(json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                                   sort_keys=sort_keys))


def _lines_and_depth(value: Any, depth: int = 1, memo: dict | None = None) -> tuple[int, int]:
    """(lines, deepest nesting) of ``json.dumps(value, indent=...)``, counting a shared
    container once per occurrence only as far as its first walk (memo) reaches."""
    memo = {} if memo is None else memo
    if not isinstance(value, (list, tuple, dict)):
        return 1, depth
    hit = memo.get(id(value))
    if hit is not None:
        return hit[1], hit[2] + depth
    if depth > 10_000:
        raise _too_long("an indented JSON text", depth, 10_000, "levels")
    _tick()
    lines, deepest = 2, depth
    for item in (value.values() if isinstance(value, dict) else value):
        n, d = _lines_and_depth(item, depth + 1, memo)
        lines, deepest = lines + n, max(deepest, d)
        if lines > 1 << 40:
            break
    memo[id(value)] = (value, lines, deepest - depth)
    return lines, deepest


# Where ``title`` may cut a text: just after a character its word split treats as a delimiter.
_TITLE_DELIMITER = re.compile(r"[-\s({\[<]")
_TITLE_CHUNK = 1 << 16


def _title(s):
    """Jinja's ``title`` filter, run on pieces of a long text so its per-word list stays small.

    Cutting right after a delimiter character gives the same words (a delimiter run
    cut in two stays delimiters, which title leaves unchanged), so the result is
    exactly Jinja's; one call on a 32 M-character text would hold a list of 16 M words.
    """
    if not isinstance(s, str) or len(s) <= _TITLE_CHUNK:
        return jinja2.filters.do_title(s)
    parts, start = [], 0
    while start < len(s):
        _tick()
        end = start + _TITLE_CHUNK
        if end < len(s):
            cut = _TITLE_DELIMITER.search(s, end)
            end = cut.end() if cut else len(s)
        parts.append(jinja2.filters.do_title(s[start:end]))
        start = end
    return "".join(parts)


_FILTER_CHECKS = {
    "center": _check_center,
    "indent": _check_indent,
    "replace": _check_replace,
    "format": _check_format,
    "join": _check_join,
    "slice": _check_count("slices"),
    "batch": _check_count("linecount"),
    "wordwrap": _check_wordwrap,
    "list": _check_list,
}
# Filters that turn their input into text: their arguments are weighed first.
_TEXT_FILTERS = ("string", "pprint", "trim", "upper", "lower", "title", "capitalize", "truncate", "striptags",
                 "urlize", "escape", "e", "forceescape", "safe", "wordcount", "urlencode", "xmlattr", "int", "float")


# ------------------------------------------------------------- environment

def _raise_exception(message):
    raise _RaisedByTemplate(str(message))


def _no_lipsum(*args, **kwargs):
    # Jinja's lipsum() builds random text in one native call, out of reach of the time
    # and size budgets; no real chat template uses it (none of llama.cpp's 70 does).
    raise jinja2.exceptions.SecurityError("lipsum() is not available in chat templates (it makes random text of "
                                          "any size, outside the render budgets)")


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}body{% endgeneration %}`` renders ``body`` unchanged.

    transformers records the span of the body to build assistant-token masks;
    a runtime has no use for the span but must still parse templates that use it.
    The body is a call block, as in transformers, so its scoping is the same.
    """

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller):
        return caller()


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


class _DictFactory:
    """The ``dict`` global: ``dict(...)`` and ``dict.fromkeys(...)``, and no way to the type itself."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


# The clock strftime_now reads during one render (pinned or real), set by render_chat.
_CLOCK: contextvars.ContextVar[datetime | None] = contextvars.ContextVar("ster_chat_clock", default=None)


def _strftime_now(fmt):
    _tick()
    if isinstance(fmt, str) and len(fmt) > 1024:  # real templates pass "%d %b %Y"
        raise _too_long("a strftime_now format", len(fmt), 1024)
    clock = _CLOCK.get()
    return (clock if clock is not None else datetime.now()).strftime(fmt)


def _guard_call(name: str, *args: jinja2.nodes.Expr) -> jinja2.nodes.Call:
    # EnvironmentAttribute compiles to ``environment.<name>``: a template cannot shadow it.
    call = jinja2.nodes.Call(jinja2.nodes.EnvironmentAttribute(name), list(args), [], None, None)
    return call.set_lineno(args[0].lineno) if args else call


class _Guards(NodeTransformer):
    """Rewrites a parsed template so loops and ``~`` go through the budget checks."""

    def visit_For(self, node):
        self.generic_visit(node)
        node.iter = _guard_call("ster_iterate", node.iter)
        return node

    def visit_Concat(self, node):
        self.generic_visit(node)
        return _guard_call("ster_concat", *node.nodes)

    # List, tuple and dict literals: a template can nest a value in itself over and over.
    def visit_List(self, node):
        self.generic_visit(node)
        return _guard_call("ster_sized", node)

    visit_Dict = visit_List

    def visit_Tuple(self, node):
        self.generic_visit(node)
        return _guard_call("ster_sized", node) if node.ctx == "load" else node


class _ChatSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox with Hugging Face's chat environment and our budgets."""

    # Operators that can allocate without bound; the rest stay native (and foldable).
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self):
        super().__init__(trim_blocks=True, lstrip_blocks=True,
                         extensions=[jinja2.ext.loopcontrols, _GenerationTag])
        for name, original in list(self.filters.items()):
            self.filters[name] = _guard_filter(original, _FILTER_CHECKS.get(name),
                                               weigh_args=name in _TEXT_FILTERS or name in _FILTER_CHECKS)
        self.finalize = _check_weight  # every {{ value }} is weighed before it becomes text
        self.filters["sum"] = _sum
        self.filters["title"] = _guard_filter(_title, weigh_args=True)
        self.filters["tojson"] = _tojson
        self.globals["raise_exception"] = _raise_exception
        self.globals["lipsum"] = _no_lipsum
        self.globals["namespace"] = _Namespace
        self.globals["strftime_now"] = _strftime_now
        self.globals["dict"] = _DictFactory()

    def _parse(self, source, name, filename):
        return _Guards().visit(super()._parse(source, name, filename))

    # Compiled templates join every buffer (output, macros, captured blocks) with this.
    def concat(self, parts):  # type: ignore[override]
        total, kept = 0, []
        for part in parts:
            total += len(part)
            _check_text(total, "an output")
            kept.append(part)
        # No time check here: it would fire between template frames, without a line to
        # name; the loops and calls that produce the parts check the clock themselves.
        return "".join(kept)

    def ster_iterate(self, iterable):
        return _counted(iter(iterable))

    def ster_sized(self, value):
        _tick()
        return _check_sized(value)

    @jinja2.pass_eval_context
    def ster_concat(self, eval_ctx, *parts):
        """``a ~ b ~ ...``: weighed before it is joined, then joined as Jinja joins it."""
        _tick()
        _check_weight(parts)
        join = jinja2.runtime.markup_join if eval_ctx.autoescape else jinja2.runtime.str_join
        return join(parts)

    def call_binop(self, context, operator, left, right):
        _tick()
        if operator == "*":
            _check_repeat(left, right)
            _check_repeat(right, left)
            if _is_int(left) and _is_int(right):
                _check_int_bits(abs(left).bit_length() + abs(right).bit_length())
        elif operator == "**" and _is_int(left) and _is_int(right) and right > 0 and abs(left) > 1:
            _check_int_bits(right * abs(left).bit_length())
        elif operator == "%" and isinstance(left, str):
            _check_percent_format(left, right)
        result = self.binop_table[operator](left, right)
        return _check_sized(result) if operator == "+" else result

    def call(self, context, obj, /, *args, **kwargs):  # type: ignore[override]
        _tick()
        args = _check_str_method(obj, args, kwargs)
        return _check_sized(super().call(context, obj, *args, **kwargs))


def _counted(iterator):
    for item in iterator:
        _tick()
        yield item


@lru_cache(maxsize=1)
def _environment() -> _ChatSandbox:
    return _ChatSandbox()


@lru_cache(maxsize=32)
def _compile(template: str) -> jinja2.Template:
    return _environment().from_string(template)


# ------------------------------------------------------------------ errors

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


def _error(source: str, exc: BaseException, what: str) -> TemplateError:
    line = _template_line(exc)
    where = f"chat template {source}" + (f", line {line}" if line else "")
    detail = str(exc).rstrip(". ")
    if isinstance(exc, _RaisedByTemplate):
        return TemplateError(f"{where} refused the conversation: {detail}", detail, line)
    if isinstance(exc, jinja2.TemplateSyntaxError):
        return TemplateError(f"{where}: syntax error: {detail}. The template is not valid Jinja; "
                             "fix it or use another one.", f"syntax error: {detail}", line)
    if isinstance(exc, _OverBudget) and getattr(exc, "why", None):
        return TemplateError(f"{where}: over budget: {detail}. The prompt could not fit; shorten the conversation "
                             "or use another template.", f"over budget: {detail}", line)
    if isinstance(exc, _OverBudget):
        return TemplateError(f"{where}: over budget: {detail}. Use another template, or raise the budget "
                             f"(${TIME_LIMIT_ENV}, or render_chat's time_limit / max_chars) if the conversation "
                             "really is that large.", f"over budget: {detail}", line)
    return TemplateError(
        f"{where}: {what}: {detail}. The template cannot render this conversation; "
        "check the messages' roles and fields, or use another template.", f"{what}: {detail}", line)


def compile_template(template: str, *, source: str = "(inline)") -> jinja2.Template:
    """Compile a chat template in the sandboxed environment (cached per text).

    Raises:
        SterError: the template is not valid Jinja ("chat template SOURCE, line N: syntax error: ..."),
            is longer than ``MAX_TEMPLATE_CHARS``, or nests deeper than Python can compile.
    """
    if not isinstance(template, str):
        raise SterError(f"chat template {source} is a {type(template).__name__}, not text")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise SterError(f"chat template {source} is {len(template)} characters long; ster compiles templates of "
                        f"at most {MAX_TEMPLATE_CHARS} (real ones are a few thousand). Use another template")
    try:
        return _compile(template)
    except jinja2.TemplateSyntaxError as exc:
        raise _error(source, exc, "syntax error") from None
    except (RecursionError, SyntaxError, MemoryError, OverflowError, ValueError) as exc:
        # Python's own compiler refuses what Jinja generates for deep nesting: 21 nested
        # for loops ("too many statically nested blocks"), 99 nested ifs (indentation).
        raise SterError(f"chat template {source} is too deeply nested to compile ({type(exc).__name__}: "
                        f"{str(exc)[:200]}); real templates nest a few levels. Use another template") from None


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
            f"cannot read the pinned clock {text!r} (from {'--now' if now is not None else NOW_ENV}); "
            "give an ISO-8601 date-time such as 2026-10-18T09:30:00"
        ) from None


def _resolve_time_limit(time_limit: float | None) -> float:
    if time_limit is not None:
        return float(time_limit)
    text = os.environ.get(TIME_LIMIT_ENV)
    if not text:
        return DEFAULT_TIME_LIMIT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise SterError(f"{TIME_LIMIT_ENV}={text!r} is not a positive number of seconds; unset it or give e.g. 30")
    return value


def _normalize_messages(messages: list[dict]) -> list[dict]:
    """Copy messages the way transformers' apply_chat_template prepares them.

    Keys whose value is None are dropped (OpenAI-style ``content: None`` would
    otherwise render as the text "None"), and a message's reasoning given as
    ``reasoning_content``, ``thinking`` or ``reasoning`` is also exposed as
    ``reasoning_content`` and ``thinking``, the names templates read.
    """
    if not isinstance(messages, (list, tuple)):
        raise SterError(f"chat messages must be a list of dicts, got a {type(messages).__name__}")
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


# ------------------------------------------------------------------ render

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
    time_limit: float | None = None,
    max_chars: int = DEFAULT_MAX_CHARS,
    max_chars_reason: str | None = None,
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
        time_limit: wall-clock seconds the render may take; default: the
            environment variable STER_CHAT_TIME_LIMIT, else 10.
        max_chars: longest text, in characters, the template may build or output
            (default 32 Mi).
        max_chars_reason: where a caller's ``max_chars`` comes from (e.g. "the model's
            context ..."), shown when a render goes over it.
        **extra: more template variables (``enable_thinking``, ``pad_token``...).

    Returns:
        The prompt text, exactly as the template produced it (to be encoded by
        ``Tokenizer.encode`` without adding special tokens).

    Raises:
        SterError: a syntax error, an undefined value used in an operation,
            a sandbox violation (``lipsum()`` among them), the template's own
            ``raise_exception``, a render over its time or size budget, or an
            output holding a lone surrogate (U+D800..U+DFFF, e.g. from an unpaired
            JSON ``\\ud800`` escape: no UTF-8 text can hold it, so no tokenizer
            can read it); the message names ``source`` and the template line.

    Compilation and rendering run in a forked child process (POSIX) under an address-space
    limit of ``MAX_RENDER_MEMORY`` more than this process holds, killed at ``time_limit`` +
    2 s: the checks above stop a render between operations, this stops one inside a single
    call. The child hands back the text or the SterError.

    Source of the conventions: transformers ``render_jinja_template`` /
    ``_compile_jinja_template`` (utils/chat_template_utils.py).
    """
    if not isinstance(template, str):
        raise SterError(f"chat template {source} is a {type(template).__name__}, not text")
    if len(template) > MAX_TEMPLATE_CHARS:
        compile_template(template, source=source)  # raises the size refusal
    clock = _resolve_now(now)
    time_limit = _resolve_time_limit(time_limit)
    args = dict(add_generation_prompt=add_generation_prompt, bos_token=bos_token, eos_token=eos_token, tools=tools,
                documents=documents, now=clock, source=source, time_limit=time_limit, max_chars=max_chars,
                max_chars_reason=max_chars_reason, **extra)
    if _ISOLATE and hasattr(os, "fork"):
        return _in_child(lambda: _render_here(template, messages, **args), time_limit + _KILL_GRACE, source)
    return _render_here(template, messages, **args)


def _render_here(template, messages, *, add_generation_prompt, bos_token, eos_token, tools, documents, now,
                 source, time_limit, max_chars, max_chars_reason, **extra) -> str:
    """``render_chat`` in this process (the in-process budgets only)."""
    compiled = compile_template(template, source=source)
    clock = now
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
    clock_token = _CLOCK.set(clock)
    budget_token = _BUDGET.set(_Budget(time.monotonic() + time_limit, time_limit, max_chars, {}, max_chars_reason))
    try:
        text = compiled.render(**context)
    except _RaisedByTemplate as exc:
        raise _error(source, exc, "raised") from None
    except _OverBudget as exc:
        raise _error(source, exc, "over budget") from None
    except jinja2.UndefinedError as exc:
        raise _error(source, exc, "undefined value") from None
    except jinja2.exceptions.SecurityError as exc:
        raise _error(source, exc, "sandbox refused an operation") from None
    except jinja2.TemplateError as exc:
        raise _error(source, exc, "render error") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError, OverflowError,
            ArithmeticError, RecursionError, MemoryError, NameError, AssertionError, UnicodeError,
            StopIteration, LookupError) as exc:
        # Python errors from operations the template performs (e.g. "a" + 1).
        raise _error(source, exc, type(exc).__name__) from None
    finally:
        _BUDGET.reset(budget_token)
        _CLOCK.reset(clock_token)
    check_surrogates(text, f"chat template {source} rendered a text that")
    return text


#: Run compile + render in a forked child (see ``render_chat``); tests may turn it off.
_ISOLATE = os.environ.get("STER_CHAT_ISOLATE", "1") != "0"


def _address_space() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _in_child(work, seconds: float, source: str) -> str:
    """``work()`` (returns str or raises SterError) in a forked child under a memory limit,
    killed after ``seconds``; its text or its SterError, raised here."""
    import pickle
    import resource
    import select
    import signal

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        status = 0
        try:
            os.close(read_fd)
            held = _address_space()
            if held is not None:
                soft, hard = resource.getrlimit(resource.RLIMIT_AS)
                cap = held + MAX_RENDER_MEMORY
                if soft != resource.RLIM_INFINITY:
                    cap = min(cap, soft)
                resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
            try:
                result = ("ok", work())
            except SterError as exc:   # a TemplateError's parts cross too (an exception's own pickle drops them)
                result = ("error", (str(exc), getattr(exc, "problem", None), getattr(exc, "line", None)))
            except MemoryError:
                result = ("error", (f"chat template {source}: over budget: the render needed more than "
                                    f"{MAX_RENDER_MEMORY >> 20} MiB of memory and was stopped. Use another template",
                                    None, None))
            except BaseException:  # noqa: BLE001 - a bug: hand the traceback to the parent
                result = ("bug", traceback.format_exc())
            try:
                data = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
            except MemoryError:
                data = pickle.dumps(("error", (f"chat template {source}: over budget: the render's result did not "
                                               "fit in memory. Use another template", None, None)))
            with os.fdopen(write_fd, "wb") as out:
                out.write(data)
        except BaseException:  # noqa: BLE001
            status = 1
        finally:
            os._exit(status)
    os.close(write_fd)
    chunks, deadline, killed = [], time.monotonic() + seconds, False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                killed = True
                break
            ready, _, _ = select.select([read_fd], [], [], left)
            if ready:
                chunk = os.read(read_fd, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
    finally:
        os.close(read_fd)
        _, status = os.waitpid(pid, 0)
    if killed:
        raise SterError(f"chat template {source}: over budget: the template ran longer than its time budget "
                        f"({seconds - _KILL_GRACE:g} s) inside a single operation and was stopped. Use another "
                        f"template, or raise the budget (${TIME_LIMIT_ENV}) if the conversation really is that large")
    try:
        kind, value = pickle.loads(b"".join(chunks))
    except Exception:  # noqa: BLE001 - the child died before it could answer
        why = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit status {os.WEXITSTATUS(status)}"
        raise SterError(f"chat template {source}: the render stopped without a result ({why}), likely out of "
                        f"memory (limit {MAX_RENDER_MEMORY >> 20} MiB). Use another template") from None
    if kind == "ok":
        return value
    if kind == "error":
        message, problem, line = value
        raise SterError(message) if problem is None else TemplateError(message, problem, line)
    raise RuntimeError(f"chat template rendering failed inside its child process:\n{value}")


_SURROGATE = re.compile("[\ud800-\udfff]")


def check_surrogates(text: str, what: str) -> None:
    """Refuse ``text`` holding a lone surrogate code point (U+D800..U+DFFF).

    Python strings can hold one (JSON's unpaired ``\\ud800`` escape, non-UTF-8 bytes in
    command-line arguments), but UTF-8 cannot encode it, so a tokenizer or a UTF-8
    output would fail on it later. ``what`` starts the message ("the prompt").

    Raises:
        SterError: naming the code point and its character offset.
    """
    if text.isascii():
        return
    found = _SURROGATE.search(text)
    if found:
        raise SterError(f"{what} holds the lone surrogate U+{ord(found.group()):04X} at character {found.start()}, "
                        "which UTF-8 cannot encode (an unpaired JSON \\ud800-style escape, or bytes that are not "
                        "UTF-8 in an argument); give real characters")


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


# ------------------------------------------------------- conversations from users

def check_messages(messages: Any, where: str = "messages") -> list[dict]:
    """Validate a conversation given by a user (e.g. a JSON file) before rendering it.

    A conversation is a non-empty list of objects, each with a string ``role``
    and a ``content`` that is text, a list of content parts, or null; an
    assistant message carrying ``tool_calls`` (a list) may omit ``content``.
    Other keys (``reasoning_content``, ``tool_call_id``, ``name``...) pass through.

    Returns:
        ``messages``, unchanged.

    Raises:
        SterError: naming ``where`` and the first offending message.
    """
    shape = 'a JSON list of messages such as [{"role": "user", "content": "Hello"}]'
    if not isinstance(messages, list):
        raise SterError(f"{where}: expected {shape}, got a {_json_type(messages)}")
    if not messages:
        raise SterError(f"{where}: the conversation is empty; give at least one message ({shape})")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise SterError(f"{where}: message {i} is a {_json_type(message)}, not an object; expected {shape}")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise SterError(f"{where}: message {i} has no \"role\" text (such as \"user\", \"assistant\", "
                            "\"system\" or \"tool\")")
        calls = message.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise SterError(f"{where}: message {i} has \"tool_calls\" that is a {_json_type(calls)}, not a list")
        if "content" not in message and calls is None:
            raise SterError(f"{where}: message {i} ({role}) has no \"content\"; give its text, a list of "
                            "content parts, or null with \"tool_calls\"")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise SterError(f"{where}: message {i} ({role}) has \"content\" that is a {_json_type(content)}; "
                            "give text or a list of content parts")
    return messages


def check_tools(tools: Any, where: str = "tools") -> list[dict]:
    """Validate tool declarations given by a user: a list of JSON-schema objects, each
    ``{"type": "function", "function": {"name": ..., ...}}`` (or a bare function schema).

    Raises:
        SterError: naming ``where`` and the first offending entry.
    """
    shape = 'a JSON list such as [{"type": "function", "function": {"name": "f", "parameters": {...}}}]'
    if not isinstance(tools, list):
        raise SterError(f"{where}: expected {shape}, got a {_json_type(tools)}")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise SterError(f"{where}: tool {i} is a {_json_type(tool)}, not an object; expected {shape}")
        function = tool.get("function", tool)
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise SterError(f"{where}: tool {i} has no function name; expected {shape}")
    return tools


def _json_type(value: Any) -> str:
    names = {dict: "JSON object", list: "JSON list", str: "string", bool: "boolean", int: "number",
             float: "number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


# ---------------------------------------------------------- a model's template

@dataclass(frozen=True)
class ModelTemplate:
    """A model's chat templates and the special-token texts its template may print.

    Attributes:
        templates: name -> Jinja text; ``"default"`` is the model's main template
            (transformers' ``chat_template``), others are named ones (``"tool_use"``...).
        bos_token, eos_token: texts, or None when the model has no such token.
        special_tokens: the other named special tokens (``unk_token``, ``pad_token``...),
            passed to the template as transformers passes its ``special_tokens_map``.
        source: where they came from, for messages.
    """

    templates: dict
    bos_token: str | None
    eos_token: str | None
    special_tokens: dict
    source: str

    def pick(self, name: str | None = None, tools: list | None = None) -> tuple[str, str]:
        """``(template text, label for errors)``: ``name`` if given, else ``"tool_use"``
        when tools are given and the model has one, else the default (transformers' choice).

        Raises:
            SterError: no template of that name, or none at all.
        """
        if name is not None:
            if name not in self.templates:
                raise SterError(f"{self.source} has no chat template named {name!r}; available: "
                                f"{', '.join(sorted(self.templates)) or 'none'}")
            return self.templates[name], f"{name!r} of {self.source}"
        if tools is not None and "tool_use" in self.templates:
            return self.templates["tool_use"], f"'tool_use' of {self.source}"
        if "default" not in self.templates:
            if self.templates:   # named ones only ({"tool_use": ...}): "has no chat template" said there was none
                raise SterError(f"{self.source} has no default chat template, only named ones: "
                                f"{', '.join(sorted(self.templates))}; choose one with --template-name NAME, or give "
                                "one with --template FILE")
            raise SterError(f"{self.source} has no chat template; give one with --template FILE "
                            "(a base model has none: prompt it with raw text instead)")
        return self.templates["default"], f"'default' of {self.source}"


def load_model_template(model: str, revision: str | None = None, *, progress=None) -> ModelTemplate:
    """Read a model's chat templates and special-token texts without mapping any weight.

    Args:
        model: a ``.gguf`` file (its ``tokenizer.chat_template`` and
            ``tokenizer.chat_template.<name>`` metadata, and the texts of
            ``tokenizer.ggml.{bos,eos,unknown,padding}_token_id``); a Hugging Face
            directory with tokenizer.json (read as ``Tokenizer.from_dir`` reads it,
            so exactly what ``generate`` renders with); a directory holding one
            .gguf; a preset name (its GGUF is fetched or found in the cache); or a
            Hugging Face Hub id, through ``load.load_tokenizer`` (resolved and
            downloaded as for running).
        revision: Hub revision, for a Hub id.
        progress: optional ``progress(event, done, total)`` callback for downloads.

    Raises:
        SterError: nothing readable there, an unreadable file, or any refusal of
            ``load_tokenizer`` for a Hub id.
    """
    path = user_path(model, "the model path")   # (a name too long to be a path: an error line, not OSError's)
    if path.is_file():
        if path.suffix != ".gguf":
            raise SterError(f"{model} is a file but not a .gguf file; give a .gguf file or a model directory "
                            "(to use a template file, pass it with --template)")
        return _gguf_template(path)
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            from .tokenizer import Tokenizer

            tok = Tokenizer.from_dir(path)
            return ModelTemplate(dict(tok.chat_templates), tok.bos_token, tok.eos_token, dict(tok.special_tokens),
                                 str(path))
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return _gguf_template(ggufs[0])
        raise SterError(f"{model} holds neither tokenizer.json nor exactly one .gguf file "
                        f"({len(ggufs)} found); give the model's directory or its .gguf file")
    from .presets import PRESETS, fetch_preset

    if model in PRESETS:  # messages name the preset, not its file in the cache
        return replace(_gguf_template(fetch_preset(model, progress)), source=model)
    from .load import load_tokenizer

    tok = load_tokenizer(model, revision, progress=progress)  # refuses a path that names nothing
    return ModelTemplate(dict(tok.chat_templates), tok.bos_token, tok.eos_token, dict(tok.special_tokens),
                         tok.source)


def surely_lacks_chat_template(model: str) -> bool:
    """True when a local ``model`` certainly has no default chat template, told from its metadata or
    tokenizer_config.json alone (no tokenizer built, no weight mapped), so that ``ster chat`` refuses a base
    model before loading it.

    ``model`` as ``load_model_template`` takes it. Only what is cheap to read is looked at: a .gguf file, a
    directory holding tokenizer.json (its chat_template.jinja, additional_chat_templates/ and
    tokenizer_config.json, as ``Tokenizer.from_dir`` reads them) or one .gguf, and a preset already in the
    cache. Anything else (a Hub id, a preset not fetched yet, another tokenizer format, an unreadable file)
    gives False: the load that follows tells what is wrong, or the template it finds.
    """
    from .presets import PRESETS, cached_path

    path = expand_user(model, "model")
    try:
        if not path.exists() and model in PRESETS:
            path = cached_path(model)
        if path.is_file() and path.suffix == ".gguf":
            return "default" not in _gguf_template(path).templates
        if path.is_dir() and (path / "tokenizer.json").is_file():
            from .tokenizer import _read_chat_templates, _read_json_object

            templates, error = _read_chat_templates(path, _read_json_object(path / "tokenizer_config.json"))
            return error is None and "default" not in templates
        if path.is_dir():
            ggufs = sorted(path.glob("*.gguf"))
            return len(ggufs) == 1 and "default" not in _gguf_template(ggufs[0]).templates
    except (SterError, OSError):   # (a name too long to be a path: the load that follows says so)
        pass
    return False


def _gguf_template(path: Path) -> ModelTemplate:
    from .gguf.reader import open_gguf

    with open_gguf(path, allow_unsupported=True) as gguf:
        meta = gguf.metadata
        tokens = meta.get("tokenizer.ggml.tokens")
        tokens = tokens if isinstance(tokens, list) else []

        def text(key: str) -> str | None:
            index = meta.get(key)
            if isinstance(index, numbers.Integral) and not isinstance(index, bool) and 0 <= index < len(tokens):
                return tokens[int(index)]
            return None

        templates = {}
        for key, value in meta.items():
            if key == "tokenizer.chat_template" and isinstance(value, str) and value:
                templates["default"] = value
            elif key.startswith("tokenizer.chat_template.") and isinstance(value, str) and value:
                templates[key.removeprefix("tokenizer.chat_template.")] = value
        special = {name: text(f"tokenizer.ggml.{key}_token_id") for name, key in
                   (("unk_token", "unknown"), ("pad_token", "padding"))}
        return ModelTemplate(templates, text("tokenizer.ggml.bos_token_id"), text("tokenizer.ggml.eos_token_id"),
                             {k: v for k, v in special.items() if v is not None}, str(path))
