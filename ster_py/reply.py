"""A model's reply as ordered blocks: text, thinking and tool calls, parsed from its markup.

A model that reasons or calls tools writes markup its chat template taught it: a
``<think>...</think>`` block, Gemma 4's ``<|channel>thought ...<channel|>`` channel, or one of
five tool-call syntaxes. ``detect_format`` reads which from the template text and the
vocabulary alone (never from a family name), following the rules of the local engine in
seed 000 ("Reasoning", "Tool calls"); ``ReplyParser`` turns the streamed text of a reply into
events, in order:

- ``text``: what the user reads;
- ``thinking``: the text between the reasoning markers (a close marker with no open one is
  dropped; a reply whose prompt ends inside an open block starts in thinking);
- ``tool_call``: a call buffered whole and parsed into a name and an arguments object;
- ``error``: ``malformed tool call: <body>``, after which the stream goes on.

Markers are matched on text, so a marker the vocabulary spells as several tokens works as a
single control token does, and a marker split across two streamed pieces is held back until
it is complete. Whitespace next to a marker is dropped (the newline after ``<think>``, the
blank line after ``</think>``); a reply without markers comes out unchanged.

Tool-call syntaxes, in detection order:

``gemma4``
    ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>``: when the template holds
    ``<|tool_call>`` and the vocabulary has both markers.
``xml`` (Qwen 3.5, Qwen3-Coder)
    ``<tool_call>`` around ``<function=NAME>`` and one ``<parameter=KEY>`` per argument, the
    value between the newline after the opening tag and the one before the closing tag, read
    as JSON when it is valid JSON and as text otherwise: when the template holds
    ``<tool_call>``, ``</tool_call>``, ``<function=`` and ``<parameter=``.
``tagged_json`` (Qwen 2.5, Qwen 3, Hermes)
    ``<tool_call>`` around one JSON call object or a list of them: when the template holds
    ``<tool_call>``; without ``</tool_call>`` in the template the call runs to the end of the
    reply.
``granite`` (Granite 3)
    ``<|tool_call|>`` (or the plain ``<tool_call>`` such models also write) and a JSON list to
    the end of the reply; a closing ``<|/tool_call|>`` is read only when the template holds
    it: when the template holds ``<|tool_call|>``.
``bare_json`` (Llama 3.x)
    a reply that is one ``{"name": ..., "parameters": ...}`` object, optionally after
    ``<|python_tag|>``; any other ``<|python_tag|>`` body is a call to ``python`` with a
    ``code`` argument: when the template holds ``tool_calls`` and ``"parameters"``.

A JSON call object names its function with ``name``, a string ``function``, or the nested
OpenAI shape ``{"type": "function", "function": {"name", "arguments"}}``; its arguments are
``arguments`` or ``parameters`` (the nested object's first, then beside it), an object, null,
or a string holding an object. No arguments means none, except in a bare-JSON reply, where
it means the reply is text. An empty list, a missing name, or arguments that are not an
object make a malformed call.
"""
from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any, Collection, Iterable

__all__ = ["ReplyFormat", "detect_format", "ReplyParser", "Event", "blocks_of", "template_variables",
           "TOOL_SYNTAXES"]

TOOL_SYNTAXES = ("gemma4", "xml", "tagged_json", "granite", "bare_json")

THINK = ("<think>", "</think>")
CHANNEL = ("<|channel>", "<channel|>")
CHANNEL_HEADER = "thought"
GEMMA4_CALL = ("<|tool_call>", "<tool_call|>")
GEMMA4_STRING = '<|"|>'
TAGGED = ("<tool_call>", "</tool_call>")
GRANITE = ("<|tool_call|>", "<|/tool_call|>")
PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ReplyFormat:
    """How a model's replies mark reasoning and tool calls (see the module docstring).

    Attributes:
        think: (open, close) reasoning markers, or None.
        think_header: a word dropped, with the whitespace after it, right after the open
            marker (Gemma 4's ``thought``), or "".
        thinking_switch: the template variable that turns reasoning on and off
            (``enable_thinking`` or ``thinking``), or None when the template reads neither.
        tools: one of ``TOOL_SYNTAXES``, or None (replies are plain text).
        tool_close: the closing marker of a tagged call, or None (the call runs to the end).
        takes_tools: the template reads a ``tools`` variable (declared tools reach the model).
    """

    think: tuple[str, str] | None = None
    think_header: str = ""
    thinking_switch: str | None = None
    tools: str | None = None
    tool_close: str | None = None
    takes_tools: bool = False

    @property
    def reasons(self) -> bool:
        return self.think is not None

    def starts_thinking(self, prompt: str) -> bool:
        """Whether a rendered prompt ends inside an open reasoning block (the reply then starts
        in thinking): its last open marker comes after its last close marker."""
        if self.think is None:
            return False
        opened = prompt.rfind(self.think[0])
        return opened >= 0 and opened > prompt.rfind(self.think[1])

    def describe(self) -> dict:
        """A JSON-ready summary (``ster generate --json``'s ``reply_format``)."""
        return {"reasoning": None if self.think is None else list(self.think),
                "thinking_switch": self.thinking_switch, "tool_syntax": self.tools,
                "takes_tools": self.takes_tools}


def template_variables(template: str) -> frozenset[str]:
    """The variables a Jinja template reads from its caller (free names, not the ones it sets).

    A template that does not parse reads nothing as far as this is concerned (rendering it
    reports the syntax error).
    """
    import jinja2
    import jinja2.meta

    try:
        env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
        env.add_extension(_generation_tag())
        return frozenset(jinja2.meta.find_undeclared_variables(env.parse(template)))
    except jinja2.TemplateError:
        return frozenset()


def _generation_tag():
    from .chat import _GenerationTag

    return _GenerationTag


def detect_format(template: str | None, vocabulary: Collection[str] | None = None) -> ReplyFormat:
    """The reply format a chat template teaches, read from its text and the vocabulary.

    Args:
        template: the Jinja chat template, or None (no template: plain text).
        vocabulary: the model's token texts (added tokens included), or None when unknown
            (markers the template writes are then taken as present).

    Returns:
        a ``ReplyFormat``; plain text (no reasoning, no tools) when nothing is detected.
    """
    if not template:
        return ReplyFormat()

    def has(*tokens: str) -> bool:
        return vocabulary is None or all(t in vocabulary for t in tokens)

    variables = template_variables(template)
    think, header = None, ""
    if CHANNEL[0] in template and has(*CHANNEL):
        think, header = CHANNEL, CHANNEL_HEADER
    elif THINK[0] in template or THINK[1] in template:
        think = THINK
    switch = next((v for v in ("enable_thinking", "thinking") if v in variables), None)
    tools, close = None, None
    if GEMMA4_CALL[0] in template and has(*GEMMA4_CALL):
        tools, close = "gemma4", GEMMA4_CALL[1]
    elif all(m in template for m in (TAGGED[0], TAGGED[1], "<function=", "<parameter=")):
        tools, close = "xml", TAGGED[1]
    elif TAGGED[0] in template:
        tools, close = "tagged_json", TAGGED[1] if TAGGED[1] in template else None
    elif GRANITE[0] in template:
        tools, close = "granite", GRANITE[1] if GRANITE[1] in template else None
    elif "tool_calls" in template and '"parameters"' in template:
        tools = "bare_json"
    return ReplyFormat(think=think, think_header=header, thinking_switch=switch, tools=tools,
                       tool_close=close, takes_tools="tools" in variables)


# ------------------------------------------------------------------------- events


@dataclass
class Event:
    """One item of a parsed reply: ``kind`` is "text", "thinking", "tool_call" or "error".

    ``text`` holds the text of text and thinking events and the message of an error;
    ``call`` a tool call's ``{"id", "name", "arguments"}`` (arguments: a dict).
    """

    kind: str
    text: str = ""
    call: dict | None = None


def new_call_id() -> str:
    """A fresh tool call id (``call_`` and 24 hex digits; the engine makes them, not the model)."""
    return "call_" + secrets.token_hex(12)


def blocks_of(events: Iterable[Event]) -> list[dict]:
    """Ordered blocks from events: neighbouring text (or thinking) events joined into one
    ``{"type": "text"|"thinking", "text"}`` block; each call a ``{"type": "tool_call", "id",
    "name", "arguments"}`` block and each error an ``{"type": "error", "message"}`` block."""
    out: list[dict] = []
    for e in events:
        if e.kind in ("text", "thinking"):
            if not e.text:
                continue
            if out and out[-1]["type"] == e.kind:
                out[-1]["text"] += e.text
            else:
                out.append({"type": e.kind, "text": e.text})
        elif e.kind == "tool_call":
            out.append({"type": "tool_call", **e.call})
        else:
            out.append({"type": "error", "message": e.text})
    return out


# ------------------------------------------------------------------------- the parser

_TEXT, _THINK, _CALL, _BARE = "text", "thinking", "call", "bare"


class ReplyParser:
    """Streaming parser of one reply: ``feed(text)`` and, at the end, ``finish()``; each returns
    the ``Event`` list that piece settled.

    Args:
        fmt: the reply format (``detect_format``).
        thinking: the reply starts inside a reasoning block (``fmt.starts_thinking(prompt)``).
        tools: parse tool calls (False: the syntax's markers are plain text).
    """

    def __init__(self, fmt: ReplyFormat, *, thinking: bool = False, tools: bool = True):
        self.fmt = fmt
        self._buf = ""
        self._state = _THINK if thinking and fmt.think else _TEXT
        self._header = False  # a think header may still come (right after the open marker)
        self._body = ""  # a call's body so far
        self._opener = ""
        self._syntax = fmt.tools if tools else None
        self._seen_text = False  # any non-whitespace text yet (bare JSON reads only a whole reply)
        self._held_ws = {"text": "", "thinking": ""}
        self._lstrip = thinking  # drop whitespace at the start of the next block
        self._out: list[Event] = []

    @property
    def in_thinking(self) -> bool:
        """The reply is inside a reasoning block now (what was fed so far)."""
        return self._state == _THINK

    @property
    def in_text(self) -> bool:
        """The reply is in its text now: not inside a reasoning block or a tool call."""
        return self._state == _TEXT

    @property
    def in_content(self) -> bool:
        """``in_text``, and past the white space a marker's end drops (``</think>\\n\\n``): what is fed now
        is the reply's content."""
        return self._state == _TEXT and not self._lstrip

    # -- emission with whitespace trimmed next to markers

    def _emit(self, kind: str, text: str) -> None:
        if not text:
            return
        if self._lstrip:
            text = text.lstrip()
            if not text:
                return
            self._lstrip = False
        body = text.rstrip()
        tail = text[len(body):]
        if body:
            held = self._held_ws[kind]
            self._held_ws[kind] = ""
            self._push(kind, held + body)
            if kind == "text":
                self._seen_text = True
        self._held_ws[kind] += tail

    def _push(self, kind: str, text: str) -> None:
        if self._out and self._out[-1].kind == kind:
            self._out[-1].text += text
        else:
            self._out.append(Event(kind, text))

    def _marker(self) -> None:
        """A marker was met: whitespace held before it is dropped, and after it skipped."""
        self._held_ws = {"text": "", "thinking": ""}
        self._lstrip = True

    def _take(self) -> list[Event]:
        out, self._out = self._out, []
        return out

    # -- markers each state watches for

    def _text_markers(self) -> list[str]:
        marks = []
        if self.fmt.think:
            marks += list(self.fmt.think)
        syntax = self._syntax
        if syntax == "gemma4":
            marks.append(GEMMA4_CALL[0])
        elif syntax in ("xml", "tagged_json"):
            marks.append(TAGGED[0])
        elif syntax == "granite":
            marks += [GRANITE[0], TAGGED[0]]
        elif syntax == "bare_json":
            marks.append(PYTHON_TAG)
        return marks

    def feed(self, text: str) -> list[Event]:
        """Parse more of the reply; returns the events it settled (text that may begin a marker
        is held until the next piece or ``finish``)."""
        self._buf += text
        self._run(final=False)
        return self._take()

    def finish(self) -> list[Event]:
        """End of the reply: flush held text, close an open call (parsing it) or thinking block."""
        self._run(final=True)
        if self._state in (_CALL, _BARE):
            self._close_call(self._body + self._buf, final=True)
            self._buf = ""
        elif self._buf:
            self._emit(self._state if self._state == _THINK else "text", self._buf)
            self._buf = ""
        if self._state != _THINK:
            held = self._held_ws["text"]
            if held:
                self._push("text", held)
        self._held_ws = {"text": "", "thinking": ""}
        self._state = _TEXT
        return self._take()

    def _run(self, final: bool) -> None:
        while self._buf:
            if self._state == _TEXT:
                if not self._step_text(final):
                    return
            elif self._state == _THINK:
                if not self._step_think(final):
                    return
            elif self._state == _CALL:
                if not self._step_call(final):
                    return
            else:  # _BARE: the whole reply is buffered
                self._body += self._buf
                self._buf = ""
                return

    def _step_text(self, final: bool) -> bool:
        buf = self._buf
        if (self._syntax == "bare_json" and not self._seen_text and not self._held_ws["text"]
                and buf.lstrip()[:1] == "{"):
            self._state, self._body, self._opener = _BARE, "", ""
            self._lstrip = False
            return True
        marks = self._text_markers()
        found, at = None, len(buf)
        for m in marks:
            i = buf.find(m)
            if 0 <= i < at or (i == at and found is not None and len(m) > len(found)):
                found, at = m, i
        if found is None:
            keep = 0 if final else _partial_suffix(buf, marks)
            # bare JSON: text that is only whitespace so far may still open a JSON reply
            if self._syntax == "bare_json" and not self._seen_text and not final and not buf.strip():
                keep = len(buf)
            self._emit("text", buf[:len(buf) - keep])
            self._buf = buf[len(buf) - keep:]
            return False
        self._emit("text", buf[:at])
        self._buf = buf[at + len(found):]
        if self.fmt.think and found == self.fmt.think[0]:
            self._state, self._header = _THINK, bool(self.fmt.think_header)
            self._marker()
        elif self.fmt.think and found == self.fmt.think[1]:
            pass  # a close marker with no open one is dropped
        else:
            self._state, self._body, self._opener = _CALL, "", found
            self._marker()
        return True

    def _step_think(self, final: bool) -> bool:
        if self._header:
            head = self.fmt.think_header
            if len(self._buf) < len(head) and head.startswith(self._buf) and not final:
                return False
            if self._buf.startswith(head):
                self._buf = self._buf[len(head):]
            self._header = False
        close = self.fmt.think[1]
        i = self._buf.find(close)
        if i < 0:
            keep = 0 if final else _partial_suffix(self._buf, [close])
            self._emit("thinking", self._buf[:len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep:]
            return False
        self._emit("thinking", self._buf[:i])
        self._buf = self._buf[i + len(close):]
        self._state = _TEXT
        self._marker()
        return True

    def _close_marker(self) -> str | None:
        if self._syntax == "gemma4":
            return GEMMA4_CALL[1]
        if self._syntax in ("xml", "tagged_json", "granite"):
            return self.fmt.tool_close
        return None  # bare JSON after <|python_tag|>: to the end

    def _step_call(self, final: bool) -> bool:
        close = self._close_marker()
        if close is None:
            self._body += self._buf
            self._buf = ""
            return False
        i = self._buf.find(close)
        if i < 0:
            keep = 0 if final else _partial_suffix(self._buf, [close])
            self._body += self._buf[:len(self._buf) - keep]
            self._buf = self._buf[len(self._buf) - keep:]
            return False
        body = self._body + self._buf[:i]
        self._buf = self._buf[i + len(close):]
        self._close_call(body, final=False)
        self._state = _TEXT
        self._marker()
        return True

    def _close_call(self, body: str, final: bool) -> None:
        syntax, opener = self._syntax, self._opener
        if self._state == _BARE:
            calls = _bare_json_calls(body)
            if calls == _NOT_A_CALL:  # the reply is text
                self._state = _TEXT
                self._emit("text", body)
                return
        elif syntax == "bare_json":  # after <|python_tag|>
            calls = _bare_json_calls(body)
            if calls == _NOT_A_CALL:
                calls = [{"name": "python", "arguments": {"code": body.strip()}}]
        elif syntax == "gemma4":
            calls = _gemma4_call(body)
        elif syntax == "xml" and opener == TAGGED[0]:
            calls = _xml_calls(body)
        else:  # tagged JSON, or Granite's list
            calls = _json_calls(body)
        if not calls:
            shown = (opener + body + ((self._close_marker() or "") if not final else "")).strip()
            self._out.append(Event("error", f"malformed tool call: {shown}"))
            return
        for call in calls:
            self._out.append(Event("tool_call", call={"id": new_call_id(), **call}))


def _partial_suffix(buf: str, marks: list[str]) -> int:
    """Length of the longest end of ``buf`` that is a proper start of one of ``marks``."""
    best = 0
    for m in marks:
        for n in range(min(len(m) - 1, len(buf)), best, -1):
            if buf.endswith(m[:n]):
                best = n
                break
    return best


# ------------------------------------------------------------------- call bodies


_NOT_A_CALL = "not a call"


def _call_from_object(obj: Any, *, bare: bool = False) -> dict | str | None:
    """``{"name", "arguments"}`` from a JSON call object in any shape the module docstring
    lists; None when it is malformed; ``_NOT_A_CALL`` when, in a bare-JSON reply (``bare``),
    the object is no call at all (no name, or no arguments)."""
    if not isinstance(obj, dict):
        return _NOT_A_CALL if bare else None
    inner = obj.get("function")
    name = None
    if isinstance(inner, dict):
        name = inner.get("name")
    elif isinstance(inner, str):
        name = inner
    if name is None:
        name = obj.get("name")
    if not isinstance(name, str) or not name:
        return _NOT_A_CALL if bare and name is None else None
    missing = object()
    args: Any = missing
    for holder in ((inner,) if isinstance(inner, dict) else ()) + (obj,):
        for key in ("arguments", "parameters"):
            if key in holder:
                args = holder[key]
                break
        if args is not missing:
            break
    if args is missing:
        if bare:
            return _NOT_A_CALL
        args = {}
    if args is None:
        args = {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return {"name": name, "arguments": args}


def _json_calls(body: str) -> list[dict] | None:
    """Tagged JSON: one call object or a list of them (None when malformed)."""
    try:
        value = json.loads(body.strip())
    except ValueError:
        return None
    items = value if isinstance(value, list) else [value]
    if not items:
        return None
    calls = [_call_from_object(item) for item in items]
    return None if any(not isinstance(c, dict) for c in calls) else calls


def _bare_json_calls(body: str) -> list[dict] | str | None:
    """A bare-JSON reply: one call object; ``_NOT_A_CALL`` when the body is not JSON or names
    no call, None when it is a malformed call."""
    try:
        value = json.loads(body.strip())
    except ValueError:
        return _NOT_A_CALL
    call = _call_from_object(value, bare=True)
    return call if call in (None, _NOT_A_CALL) else [call]


_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


def _xml_value(raw: str) -> Any:
    value = raw[1:] if raw.startswith("\n") else raw
    value = value[:-1] if value.endswith("\n") else value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _xml_calls(body: str) -> list[dict] | None:
    """Qwen 3.5's XML: ``<function=NAME>`` and ``<parameter=KEY>`` elements (None when malformed)."""
    calls, end = [], 0
    for fn in _FUNCTION.finditer(body):
        if body[end:fn.start()].strip():
            return None
        end = fn.end()
        inner, args, last = fn.group(2), {}, 0
        for p in _PARAMETER.finditer(inner):
            if inner[last:p.start()].strip():
                return None
            last = p.end()
            args[p.group(1).strip()] = _xml_value(p.group(2))
        if inner[last:].strip():
            return None
        calls.append({"name": fn.group(1).strip(), "arguments": args})
    if not calls or body[end:].strip():
        return None
    return calls


class _Gemma4Reader:
    """Gemma 4's argument syntax: ``key:value`` pairs, strings between ``<|"|>`` marks, bare
    numbers, ``true``/``false``, ``{...}`` objects and ``[...]`` lists."""

    def __init__(self, text: str):
        self.s, self.i = text, 0

    def fail(self):
        raise ValueError(self.s[self.i:self.i + 20])

    def string(self) -> str:
        end = self.s.find(GEMMA4_STRING, self.i + len(GEMMA4_STRING))
        if end < 0:
            self.fail()
        value = self.s[self.i + len(GEMMA4_STRING):end]
        self.i = end + len(GEMMA4_STRING)
        return value

    def key(self) -> str:
        if self.s.startswith(GEMMA4_STRING, self.i):
            return self.string()
        end = self.s.find(":", self.i)
        if end < 0:
            self.fail()
        key = self.s[self.i:end].strip()
        self.i = end
        if not key:
            self.fail()
        return key

    def value(self) -> Any:
        s = self.s
        if s.startswith(GEMMA4_STRING, self.i):
            return self.string()
        if s.startswith("{", self.i):
            return self.mapping()
        if s.startswith("[", self.i):
            self.i += 1
            items = []
            while not s.startswith("]", self.i):
                items.append(self.value())
                if s.startswith(",", self.i):
                    self.i += 1
                elif not s.startswith("]", self.i):
                    self.fail()
            self.i += 1
            return items
        m = re.compile(r"[^,}\]]*").match(s, self.i)
        word = m.group().strip()
        self.i = m.end()
        if not word:
            self.fail()
        lowered = {"true": True, "false": False, "null": None, "none": None}
        if word.lower() in lowered:
            return lowered[word.lower()]
        try:
            return json.loads(word)
        except ValueError:
            return word

    def mapping(self) -> dict:
        s = self.s
        if not s.startswith("{", self.i):
            self.fail()
        self.i += 1
        out = {}
        while not s.startswith("}", self.i):
            key = self.key()
            if not s.startswith(":", self.i):
                self.fail()
            self.i += 1
            out[key] = self.value()
            if s.startswith(",", self.i):
                self.i += 1
            elif not s.startswith("}", self.i):
                self.fail()
        self.i += 1
        return out


def _gemma4_call(body: str) -> list[dict] | None:
    """``call:NAME{args}`` (None when malformed)."""
    m = re.match(r"\s*call:([^{\s]+)", body)
    if not m:
        return None
    reader = _Gemma4Reader(body)
    reader.i = m.end()
    try:
        args = reader.mapping()
    except (ValueError, IndexError):
        return None
    if body[reader.i:].strip():
        return None
    return [{"name": m.group(1), "arguments": args}]
