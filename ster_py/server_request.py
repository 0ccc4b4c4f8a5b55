"""What an OpenAI-style request to ``ster serve`` may hold, checked before it is trusted: the fields each
endpoint reads, their types and ranges, the size and nesting of a body, and the messages' shape.

Every check raises ``RequestError`` (an HTTP status, a message saying what to send instead, the field at
fault), which ``server`` answers in OpenAI's error shape; nothing here knows about HTTP or the model beyond
the numbers it is given (the vocabulary size, the default ``max_tokens``).
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

from .errors import SterError
from .generate import MAX_LOGPROBS, Sampling

#: The deepest nesting of arrays/objects a request body may have (OpenAI tool schemas nest a few
#: tens of levels; Python's parser and the chat templates recurse once per level).
MAX_JSON_DEPTH = 64
#: The most items (array elements and object members, an empty array or object counting one) a body
#: may hold. A parsed item costs a Python object of 50 to 250 bytes, so 8 MiB of ``{}`` would be
#: ~200 MB while it waits its turn; a long conversation with tools holds a few thousand.
MAX_JSON_ITEMS = 1 << 16
#: OpenAI's bounds of ``metadata`` (an object of strings) and a bound of ``user`` (a string): both are
#: accepted and change nothing, so they must not be a place to park memory.
METADATA_KEYS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS, USER_CHARS = 16, 64, 512, 256


class RequestError(Exception):
    """A request the server refuses: HTTP status, message, the parameter at fault, and OpenAI's
    error ``type`` / ``code`` (the type defaults to invalid_request_error, server_error from 500 on),
    with extra response ``headers`` (``Retry-After``, ``Connection: close``)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, *, kind: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.param, self.status, self.code, self.headers = param, status, code, dict(headers or {})
        self.kind = kind or ("server_error" if status >= 500 else "invalid_request_error")


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


#: The largest magnitude of a JSON number a request field may hold: every field's range lies far inside it, and
#: Python reads integers of any length, which float() would overflow.
_MAX_MAGNITUDE = 2**63


def shown_value(value) -> str:
    """A request value for a message: its JSON, cut to 40 characters."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def number_field(body: dict, name: str, default, *, kind=float, low=None, high=None):
    value = body.get(name, default)
    if value is None:
        return default
    # An integer field takes JSON integers only, as OpenAI's: 1e300 or 2.0 is a client's mistake (and 1e300
    # would pass as a whole number, past any range).
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, int) and abs(value) > _MAX_MAGNITUDE) or (kind is int and isinstance(value, float)):
        what = "an integer" if kind is int else "a number"
        raise RequestError(f"{name} must be {what} of at most 2**63 in magnitude, got {shown_value(value)}"
                           if isinstance(value, int) and not isinstance(value, bool) else
                           f"{name} must be {what}, got {shown_value(value)}", name)
    if isinstance(value, float) and not math.isfinite(value):
        raise RequestError(f"{name} must be finite", name)
    value = kind(value)
    if (low is not None and value < low) or (high is not None and value > high):
        if high is None:
            raise RequestError(f"{name} must be {low} or more, got {value}", name)
        raise RequestError(f"{name} must be in [{low}, {high}], got {value}", name)
    return value


def json_shape(raw: bytes) -> tuple[int, int]:
    """The deepest nesting of ``[``/``{`` in a JSON text ``raw`` and its number of items (array
    elements and object members, an empty array or object counting one: ``[`` + ``{`` + ``,``),
    brackets and commas inside strings not counted; computed without recursion or parsing, so that
    it is safe and cheap on any input.

    Args:
        raw: the JSON text, bytes (UTF-8).
    Returns:
        (depth int, 0 for a scalar; items int).
    """
    import numpy as np

    text = re.sub(rb'"(?:[^"\\]|\\.)*"?', b"", raw)
    b = np.frombuffer(text, dtype=np.uint8)
    opens = (b == ord("[")) | (b == ord("{"))
    step = opens.view(np.int8) - ((b == ord("]")) | (b == ord("}"))).view(np.int8)
    return int(np.cumsum(step, dtype=np.int32).max(initial=0)), int(np.count_nonzero(opens) + np.count_nonzero(b == ord(",")))


def json_depth(raw: bytes) -> int:
    """The deepest nesting of ``[``/``{`` in a JSON text (``json_shape``'s first number)."""
    return json_shape(raw)[0]


def check_unicode(body: Any) -> None:
    """Refuse a lone UTF-16 surrogate (``"\\ud800"``) anywhere in a parsed body, key or value: JSON's
    escapes can write one, but it is no character, so no reply, template or tokenizer can carry it.

    Raises:
        RequestError: naming the first place (``messages[0].role``, or the key).
    """
    def valid(text: str) -> bool:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True

    def refuse(place: str, where: str) -> RequestError:
        field = re.match(r"[A-Za-z_]+", where)   # the top-level field, when its name is plain
        return RequestError(f"the request holds a lone UTF-16 surrogate (an escape such as \\ud800 that is no "
                            f"character) in {place[:100]}; send valid Unicode text", field and field.group(0)[:40])

    todo: list[tuple[Any, str]] = [(body, "")]
    while todo:
        value, where = todo.pop()
        if isinstance(value, str):
            if not valid(value):
                raise refuse(where or "the body", where)
        elif isinstance(value, dict):
            for key, child in value.items():
                if not valid(key):
                    raise refuse(f"the key {ascii(key)}" + (f" of {where}" if where else ""), where)
                todo.append((child, f"{where}.{key}" if where else key))
        elif isinstance(value, list):
            todo.extend((child, f"{where}[{i}]") for i, child in enumerate(value))


def check_ignored_fields(body: dict) -> None:
    """The fields accepted and unused (``user``, ``metadata``, ``store``, ``service_tier``) in their
    OpenAI types and bounds, so that they cannot park memory while a request waits.

    Raises:
        RequestError: naming the field.
    """
    user = body.get("user")
    if user is not None and not (isinstance(user, str) and len(user) <= USER_CHARS):
        raise RequestError(f"user must be a string of at most {USER_CHARS} characters (an id of the end user), "
                           f"got {shown_value(user)}", "user")
    meta = body.get("metadata")
    if meta is not None:
        shape = (f"metadata must be an object of at most {METADATA_KEYS} string values, keys of at most "
                 f"{METADATA_KEY_CHARS} characters and values of at most {METADATA_VALUE_CHARS} (as OpenAI's)")
        if not isinstance(meta, dict) or len(meta) > METADATA_KEYS:
            raise RequestError(f"{shape}; got {shown_value(meta)}", "metadata")
        for key, value in meta.items():
            if len(key) > METADATA_KEY_CHARS or not isinstance(value, str) or len(value) > METADATA_VALUE_CHARS:
                raise RequestError(f"{shape}; the key {shown_value(key)} holds {shown_value(value)}", "metadata")
    if body.get("store") is not None and not isinstance(body["store"], bool):
        raise RequestError(f"store must be a boolean, got {shown_value(body['store'])}", "store")
    tier = body.get("service_tier")
    if tier is not None and not (isinstance(tier, str) and len(tier) <= 64):
        raise RequestError(f"service_tier must be a string such as \"auto\", got {shown_value(tier)}", "service_tier")


def sampling_of(body: dict, default_max_tokens: int, chat: bool = True) -> Sampling:
    """Sampling settings from a request body (OpenAI's names and ster's extensions). Chat's
    ``logprobs`` is a boolean and ``top_logprobs`` the number of alternatives; the completions'
    ``logprobs`` is that number (or ``true`` with ``top_logprobs``, as chat's).

    Raises:
        RequestError: a value of the wrong type or out of its range, naming the field as sent
            (``max_completion_tokens`` or ``max_tokens``); ``top_logprobs`` without ``logprobs: true``.
    """
    sent = [k for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None]
    if len(sent) == 2 and body["max_tokens"] != body["max_completion_tokens"]:
        raise RequestError("max_tokens and max_completion_tokens differ; send one of them (max_completion_tokens is "
                           "OpenAI's newer name)", "max_tokens")
    limit_name = sent[0] if sent else "max_tokens"
    max_tokens = number_field(body, limit_name, default_max_tokens, kind=int, low=0)
    asked, top = body.get("logprobs"), body.get("top_logprobs")
    if top is not None and asked is not True:
        raise RequestError('top_logprobs needs "logprobs": true' + (
            "" if chat or asked is None or asked is False else f" (here logprobs {shown_value(asked)} already asks for that many "
            "alternatives; send one of them)"), "top_logprobs")
    logprobs = None
    if asked is True:
        logprobs = number_field(body, "top_logprobs", 0, kind=int, low=0, high=MAX_LOGPROBS)
    elif asked is not None and asked is not False:
        if chat:
            raise RequestError(f"logprobs must be true or false on /v1/chat/completions, got {shown_value(asked)}; the "
                               f"number of alternatives per token is top_logprobs (0 to {MAX_LOGPROBS})", "logprobs")
        logprobs = number_field(body, "logprobs", 0, kind=int, low=0, high=MAX_LOGPROBS)  # /v1/completions' form
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise RequestError(f"seed must be in 0..2**63-1, got {shown_value(seed)}", "seed")
    s = Sampling(max_new_tokens=max_tokens, temperature=number_field(body, "temperature", 0.0, low=0.0, high=100.0),
                 top_k=number_field(body, "top_k", 0, kind=int, low=0), top_p=number_field(body, "top_p", 1.0),
                 seed=seed, min_p=number_field(body, "min_p", 0.0), repeat_penalty=number_field(body, "repeat_penalty", 1.0),
                 logprobs=logprobs)
    try:
        s.validate()
    except SterError as e:
        # "--top-p must ..." -> "top_p must ...", param "top_p"
        option, _, rest = str(e).removeprefix("--").partition(" ")
        name = option.replace("-", "_")
        name = {"max_new_tokens": limit_name, "logprobs": "top_logprobs" if asked is True else "logprobs"}.get(name, name)
        raise RequestError(f"{name} {rest}", name) from None
    return s


def stream_options_of(body: dict) -> bool:
    """``include_usage`` of a request's ``stream_options`` (False when absent).

    Raises:
        RequestError: ``stream_options`` without ``"stream": true``, not an object, with a key other than
            include_usage, or an include_usage that is not a boolean.
    """
    options = body.get("stream_options")
    if options is None:
        return False
    if body.get("stream") is not True:
        raise RequestError('stream_options applies to streamed replies only: send "stream": true, or omit '
                           "stream_options", "stream_options")
    if not isinstance(options, dict):
        raise RequestError(f'stream_options must be an object such as {{"include_usage": true}}, got '
                           f"{shown_value(options)}", "stream_options")
    extra = sorted(set(options) - {"include_usage"})
    if extra:
        raise RequestError(f"stream_options: only include_usage is read, not {shown_value(extra[0])}", "stream_options")
    usage = options.get("include_usage")
    if usage is not None and not isinstance(usage, bool):
        raise RequestError(f"stream_options.include_usage must be a boolean, got {shown_value(usage)}", "stream_options")
    return bool(usage)


def logit_bias_of(body: dict, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias``: an object mapping token ids (as strings, or integers) to biases in
    -100..100, added to the logits before sampling.

    Args:
        body: the request body.
        vocab_size: the model's number of ids (logit rows); ids must be below it.
    Returns:
        ((id, bias float), ...) in the request's order; () when absent or null.
    Raises:
        RequestError: not an object, an id that is not a whole number in [0, vocab_size), a bias
            that is not a finite number in [-100, 100]; param ``logit_bias``.
    """
    bias = body.get("logit_bias")
    if bias is None:
        return ()
    if not isinstance(bias, dict):
        raise RequestError('logit_bias must be an object mapping token ids to biases, such as {"50256": -100}',
                           "logit_bias")
    out = []
    for key, value in bias.items():
        shown = json.dumps(key)[:40]
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 19) \
                or int(key) >= vocab_size:
            raise RequestError(f"logit_bias: key {shown} is not a token id of this model (0 to {vocab_size - 1})",
                               "logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100 \
                or not math.isfinite(value):  # the range first: isfinite overflows on a huge integer
            raise RequestError(f"logit_bias: the bias of id {key} must be a finite number in -100..100, got "
                               f"{json.dumps(value)[:40]}", "logit_bias")
        out.append((int(key), float(value)))
    return tuple(out)


#: The request fields each endpoint reads: OpenAI's and ster's extensions (``steering``, ``top_k``, ``min_p``,
#: ``repeat_penalty``, ``thinking``). Any other field is refused, as OpenAI refuses an unrecognized argument.
_COMMON_FIELDS = frozenset({
    "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop", "stream",
    "stream_options", "n", "logprobs", "top_logprobs", "logit_bias", "frequency_penalty", "presence_penalty",
    "user", "steering", "top_k", "min_p", "repeat_penalty"})
CHAT_FIELDS = _COMMON_FIELDS | {"messages", "tools", "tool_choice", "parallel_tool_calls", "response_format",
                                "thinking", "chat_template_kwargs", "metadata", "store", "service_tier"}
COMPLETION_FIELDS = _COMMON_FIELDS | {"prompt", "echo", "suffix", "best_of"}

#: OpenAI fields of which this server honours only the value that changes nothing: name -> (that value's test,
#: what to do instead). null is always taken as the default.
_DEFAULT_ONLY = {
    "frequency_penalty": (lambda v: v == 0 and not isinstance(v, bool),
                          "send 0, or use ster's repeat_penalty (llama.cpp's multiplicative penalty, e.g. 1.1)"),
    "presence_penalty": (lambda v: v == 0 and not isinstance(v, bool),
                         "send 0, or use ster's repeat_penalty (llama.cpp's multiplicative penalty, e.g. 1.1)"),
    "best_of": (lambda v: v == 1 and not isinstance(v, bool), "one sequence is generated per request: send 1"),
    "echo": (lambda v: v is False, "the reply does not repeat the prompt: send false"),
    "suffix": (lambda v: v == "", "text after an insertion point is not supported: continue a prompt instead"),
    "tool_choice": (lambda v: v in ("auto", "none"),
                    'the model decides whether to call a tool: send "auto" (or "none": no tools reach it)'),
    "parallel_tool_calls": (lambda v: v is True, "the reply may call several tools: send true or omit it"),
}


def check_unsupported(body: dict, chat: bool) -> None:
    """Refuse request fields this server cannot honour rather than ignore them: a field the endpoint
    does not read, a value other than the neutral one of ``_DEFAULT_ONLY``'s fields, a
    ``response_format`` other than text, ``chat_template_kwargs`` other than ``enable_thinking``, and
    chat content parts other than text.

    Raises:
        RequestError: naming the field.
    """
    known = CHAT_FIELDS if chat else COMPLETION_FIELDS
    for name in body:
        if name not in known:
            other = ("/v1/completions" if chat else "/v1/chat/completions") \
                if name in (COMPLETION_FIELDS if chat else CHAT_FIELDS) else None
            raise RequestError(f"unrecognized request field {shown_value(name)}"
                               + (f" (it belongs to {other})" if other else "")
                               + f"; {'chat' if chat else 'text'} completions read "
                               + ", ".join(sorted(known)),
                               name[:40])
    for name, (neutral, advice) in _DEFAULT_ONLY.items():
        value = body.get(name)
        if value is not None and name in known and not neutral(value):
            raise RequestError(f"{name} {shown_value(value)} is not supported: {advice}", name)
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        extra = sorted(set(kwargs) - {"enable_thinking"}) if isinstance(kwargs, dict) else None
        if extra is None or extra:
            raise RequestError("chat_template_kwargs: only enable_thinking is read"
                               + (f", not {shown_value(extra[0])}" if extra else " (send an object)"),
                               "chat_template_kwargs")
    fmt = body.get("response_format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind != "text":
            raise RequestError(f"response_format {json.dumps(kind if kind is not None else fmt)[:60]} is not "
                               'supported: this server writes plain text only; omit it or send {"type": "text"}',
                               "response_format")
    if not chat or not isinstance(body.get("messages"), list):
        return
    for i, m in enumerate(body["messages"]):
        parts = m.get("content") if isinstance(m, dict) else None
        if not isinstance(parts, list):
            continue
        for j, part in enumerate(parts):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise RequestError(f"messages: message {i} has a content part of type "
                                   f"{shown_value(kind)}; only text parts ({{\"type\": \"text\", \"text\": "
                                   f"...}}) are supported (the model reads text only)", "messages")
            if not isinstance(part.get("text"), str):
                raise RequestError(f"messages: message {i}'s content part {j} is of type \"text\" but its \"text\" "
                                   + ("is missing" if part.get("text") is None else f"is {shown_value(part['text'])}")
                                   + '; give the text as a string: {"type": "text", "text": "..."}', "messages")


def stops_of(body: dict) -> tuple[str, ...]:
    from .conversation import check_stops

    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list):
        raise RequestError("stop must be a string or a list of strings", "stop")
    try:
        return check_stops(stops, "stop")
    except SterError as e:
        raise RequestError(str(e), "stop") from None


def template_messages(messages: list[dict], where: str = "messages") -> list[dict]:
    """Checked messages (``chat.check_messages``) as the server hands them to a template: content parts other
    than text refused (``check_unsupported``), then ``normalize_messages``. For callers outside a request
    (``Session``, chat's ``/load``): the refusal is a SterError whose message starts with ``where``.

    Raises:
        SterError: a content part other than text; null content but beside an assistant's ``tool_calls``.
    """
    try:
        check_unsupported({"messages": messages}, chat=True)
        return normalize_messages(messages)
    except RequestError as e:
        raise SterError(f"{where}: {str(e).removeprefix('messages: ')}") from None


def normalize_messages(messages: list[dict]) -> list[dict]:
    """OpenAI messages as chat templates read them: content given as a list of text parts becomes their
    texts joined by newlines (most templates add ``content`` to a string; ``check_unsupported`` refused
    any other part), null content of an assistant message with ``tool_calls`` (OpenAI's form) becomes
    "" (templates add it to strings too), and an assistant's tool call ``arguments`` given as a JSON
    text becomes the object it holds (templates write it with ``tojson``).

    Raises:
        RequestError: null (or no) content on any other message.
    """
    out = []
    for i, m in enumerate(messages):
        if m.get("content") is None:
            if m.get("role") != "assistant" or not m.get("tool_calls"):
                raise RequestError(f"messages: message {i} ({shown_value(m.get('role'))}) has null content; give its "
                                   "text (null content is for an assistant message with tool_calls)", "messages")
            m = {**m, "content": ""}
        if isinstance(m.get("content"), list):
            m = {**m, "content": "\n".join(part["text"] for part in m["content"])}
        calls = m.get("tool_calls")
        if isinstance(calls, list):
            fixed = []
            for c in calls:
                if isinstance(c, dict) and isinstance(c.get("function"), dict) and \
                        isinstance(c["function"].get("arguments"), str):
                    args = c["function"]["arguments"]
                    if json_depth(args.encode("utf-8", "replace")) <= MAX_JSON_DEPTH:
                        try:
                            args = json.loads(args)
                        except (ValueError, RecursionError):
                            pass
                    c = {**c, "function": {**c["function"], "arguments": args}}
                fixed.append(c)
            m = {**m, "tool_calls": fixed}
        out.append(m)
    return out
