"""``ster serve``: an OpenAI-compatible HTTP server for one model (Starlette on uvicorn).

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions`` (messages through the chat template;
``stream`` as server-sent events; ``tools`` parsed into ``tool_calls``; reasoning into
``reasoning_content``), ``POST /v1/completions`` (a raw text continued). One model per process, and
one request generates at a time: the others wait in arrival order (a lock), so a server on a
machine's cores never runs two models' worth of threads. Consecutive requests reuse the prompt
cache's shared prefix (``conversation.Session``); ``usage.prompt_tokens_details.cached_tokens``
says how many prompt tokens were reused.

Extensions to OpenAI's request: ``steering: {"vector": NAME, "strength": X}`` names a vector loaded
at start (``--vector NAME=FILE``), applied to this request only; ``top_k``, ``min_p``,
``repeat_penalty``; ``thinking`` (or ``chat_template_kwargs.enable_thinking``) sets the template's
thinking switch. ``logprobs``/``top_logprobs`` follow OpenAI's shape (natural logarithms of the
model's own distribution).

Errors have OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``: 400 for a request
that is not JSON or breaks a rule, 404 for an unknown path, 405 for a wrong method. A client that
disconnects while its reply streams stops the generation at the next piece of text the server
fails to send it (a request waiting for its turn notices when its turn comes).
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import re
import threading
import time
import uuid
from typing import Any

from .errors import SterError
from .generate import MAX_LOGPROBS, Sampling

#: Largest request body read, in bytes (a conversation's text; refused above with 413).
MAX_BODY_BYTES = 8 << 20
#: The deepest nesting of arrays/objects a request body may have (OpenAI tool schemas nest a few
#: tens of levels; Python's parser and the chat templates recurse once per level).
MAX_JSON_DEPTH = 64


class RequestError(Exception):
    """A request the server refuses: HTTP status, message, and the parameter at fault."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


#: The largest magnitude of a JSON number a request field may hold: every field's range lies far inside it, and
#: Python reads integers of any length, which float() would overflow.
_MAX_MAGNITUDE = 2**63


def _shown(value) -> str:
    """A request value for a message: its JSON, cut to 40 characters."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _number(body: dict, name: str, default, *, kind=float, low=None, high=None):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, int) and abs(value) > _MAX_MAGNITUDE) or (kind is int and not float(value).is_integer()):
        what = "an integer" if kind is int else "a number"
        raise RequestError(f"{name} must be {what} of at most 2**63 in magnitude, got {_shown(value)}"
                           if isinstance(value, int) and not isinstance(value, bool) else
                           f"{name} must be {what}, got {_shown(value)}", name)
    if isinstance(value, float) and not math.isfinite(value):
        raise RequestError(f"{name} must be finite", name)
    value = kind(value)
    if (low is not None and value < low) or (high is not None and value > high):
        if high is None:
            raise RequestError(f"{name} must be {low} or more, got {value}", name)
        raise RequestError(f"{name} must be in [{low}, {high}], got {value}", name)
    return value


def json_depth(raw: bytes) -> int:
    """The deepest nesting of ``[``/``{`` in a JSON text ``raw`` (brackets inside strings not
    counted), computed without recursion so that it is safe on any input.

    Args:
        raw: the JSON text, bytes (UTF-8).
    Returns:
        int, 0 for a scalar.
    """
    import numpy as np

    text = re.sub(rb'"(?:[^"\\]|\\.)*"?', b"", raw)
    b = np.frombuffer(text, dtype=np.uint8)
    step = np.isin(b, (ord("["), ord("{"))).astype(np.int64) - np.isin(b, (ord("]"), ord("}")))
    return int(np.cumsum(step).max(initial=0))


def sampling_of(body: dict, default_max_tokens: int) -> Sampling:
    """Sampling settings from a request body (OpenAI's names and ster's extensions).

    Raises:
        RequestError: a value of the wrong type or out of its range.
    """
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = _number({"max_tokens": max_tokens}, "max_tokens", default_max_tokens, kind=int, low=0)
    logprobs = None
    if body.get("logprobs") not in (None, False):
        if body.get("logprobs") is not True and not isinstance(body.get("logprobs"), int):
            raise RequestError("logprobs must be a boolean", "logprobs")
        logprobs = _number(body, "top_logprobs", 0, kind=int, low=0, high=MAX_LOGPROBS)
        if isinstance(body.get("logprobs"), int) and not isinstance(body.get("logprobs"), bool):
            logprobs = _number(body, "logprobs", 0, kind=int, low=0, high=MAX_LOGPROBS)  # /v1/completions' form
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise RequestError(f"seed must be in 0..2**63-1, got {_shown(seed)}", "seed")
    s = Sampling(max_new_tokens=max_tokens, temperature=_number(body, "temperature", 0.0, low=0.0, high=100.0),
                 top_k=_number(body, "top_k", 0, kind=int, low=0), top_p=_number(body, "top_p", 1.0),
                 seed=seed, min_p=_number(body, "min_p", 0.0), repeat_penalty=_number(body, "repeat_penalty", 1.0),
                 logprobs=logprobs)
    try:
        s.validate()
    except SterError as e:
        # "--top-p must ..." -> "top_p must ...", param "top_p"
        option, _, rest = str(e).removeprefix("--").partition(" ")
        name = option.replace("-", "_")
        name = {"max_new_tokens": "max_tokens", "logprobs": "top_logprobs"}.get(name, name)
        raise RequestError(f"{name} {rest}", name) from None
    return s


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
            raise RequestError(f"unrecognized request field {_shown(name)}"
                               + (f" (it belongs to {other})" if other else "")
                               + f"; {'chat' if chat else 'text'} completions read "
                               + ", ".join(sorted(known)),
                               name[:40])
    for name, (neutral, advice) in _DEFAULT_ONLY.items():
        value = body.get(name)
        if value is not None and name in known and not neutral(value):
            raise RequestError(f"{name} {_shown(value)} is not supported: {advice}", name)
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        extra = sorted(set(kwargs) - {"enable_thinking"}) if isinstance(kwargs, dict) else None
        if extra is None or extra:
            raise RequestError("chat_template_kwargs: only enable_thinking is read"
                               + (f", not {_shown(extra[0])}" if extra else " (send an object)"),
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
        for part in parts:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"messages: message {i} has a content part of type "
                                   f"{json.dumps(kind)[:60]}; only text parts ({{\"type\": \"text\", \"text\": "
                                   f"...}}) are supported (the model reads text only)", "messages")


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


def normalize_messages(messages: list[dict]) -> list[dict]:
    """OpenAI messages as chat templates read them: content given as a list of text parts becomes their
    texts joined by newlines (most templates add ``content`` to a string; ``check_unsupported`` refused
    any other part), and an assistant's tool call ``arguments`` given as a JSON text becomes the object
    it holds (templates write it with ``tojson``)."""
    out = []
    for m in messages:
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


class Server:
    """The state behind the app: the session, the vectors, the one-at-a-time lock.

    Args:
        session: a ``conversation.Session``.
        model_name: the id ``/v1/models`` lists and replies name.
        vectors: name -> ``steering.SteeringVector`` (loaded and checked at start).
        max_tokens: the default ``max_tokens`` of a request that gives none.
    """

    def __init__(self, session, model_name: str, vectors: dict | None = None, max_tokens: int = 256):
        self.session = session
        self.model_name = model_name
        self.vectors = dict(vectors or {})
        self.max_tokens = max_tokens
        self.lock = threading.Lock()
        self.created = int(time.time())
        self.served = 0

    # ------------------------------------------------------------------ a request

    def steering(self, body: dict):
        """(hook, key) of a request's ``steering`` extension, or (None, None)."""
        from .steering import steering_hook

        spec = body.get("steering")
        if spec is None:
            return None, None
        if not isinstance(spec, dict) or not isinstance(spec.get("vector"), str):
            raise RequestError('steering must be an object {"vector": NAME, "strength": X}', "steering")
        name = spec["vector"]
        if name not in self.vectors:
            have = ", ".join(sorted(self.vectors)) or "none (start the server with --vector NAME=FILE)"
            raise RequestError(f"steering: no vector named {name!r}; loaded: {have}", "steering.vector")
        try:
            strength = _number(spec, "strength", 1.0)
        except RequestError as e:
            raise RequestError(f"steering.{e}", "steering.strength") from None
        try:
            return steering_hook(self.vectors[name], strength), (name, strength)
        except SterError as e:
            raise RequestError(str(e).replace("--strength", "steering.strength"), "steering.strength") from None

    def parse(self, body: Any, chat: bool) -> dict:
        """The generation arguments of a request body.

        Raises:
            RequestError: anything wrong with it.
        """
        from .chat import check_messages, check_tools

        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise RequestError("model must be a string", "model")
        n = body.get("n", 1)
        if n is not None and (type(n) is not int or n != 1):
            raise RequestError(f"n must be 1 (one choice per request), got {_shown(n)}", "n")
        if not isinstance(body.get("stream", False), bool):
            raise RequestError("stream must be a boolean", "stream")
        check_unsupported(body, chat)
        args: dict = {"sampling": sampling_of(body, self.max_tokens), "stops": stops_of(body)}
        args["sampling"] = dataclasses.replace(
            args["sampling"], logit_bias=logit_bias_of(body, self.session.loaded.decoder.spec.vocab_size))
        if self.session.draft is not None and args["sampling"].temperature != 0:
            raise RequestError("temperature must be 0: this server decodes speculatively with a drafter (ster serve "
                               "--draft), whose output is greedy decoding's; omit temperature or send 0, or serve "
                               "without --draft to sample", "temperature")
        args["layer_hook"], args["key"] = self.steering(body)
        if chat:
            try:
                args["messages"] = normalize_messages(check_messages(body.get("messages"), "messages"))
                tools = body.get("tools")
                if tools is not None and tools != [] and body.get("tool_choice") != "none":
                    args["tools"] = self.session.check_tools(check_tools(tools, "tools"))
            except SterError as e:
                raise RequestError(str(e), "messages" if str(e).startswith("messages") else "tools") from None
            thinking = body.get("thinking", (body.get("chat_template_kwargs") or {}).get("enable_thinking")
                                if isinstance(body.get("chat_template_kwargs"), dict) else None)
            if thinking is not None and not isinstance(thinking, bool):
                raise RequestError("thinking must be a boolean", "thinking")
            args["thinking"] = thinking
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            if not isinstance(prompt, str) or not prompt:
                raise RequestError("prompt must be a non-empty string", "prompt")
            args["raw"], args["messages"] = prompt, []
        return args

    def run(self, args: dict, on_event=None, cancelled=None):
        """Generate one reply, waiting for the lock; None when cancelled before its turn.

        Raises:
            RequestError: a request the model refuses (a prompt longer than the context...).
        """
        with self.lock:
            if cancelled is not None and cancelled():
                return None
            try:
                reply = self.session.reply(args.pop("messages"), args.pop("sampling"), on_event=on_event,
                                           cancelled=cancelled, **args)
            except SterError as e:
                raise RequestError(str(e)) from None
            self.served += 1
            return reply

    # ------------------------------------------------------------------ shapes

    def usage(self, reply) -> dict:
        gen = reply.generation
        completion = len(gen.ids)
        out = {"prompt_tokens": len(reply.prompt_ids), "completion_tokens": completion,
               "total_tokens": len(reply.prompt_ids) + completion,
               "prompt_tokens_details": {"cached_tokens": gen.reused}}
        if self.session.format.reasons:
            out["completion_tokens_details"] = {"reasoning_tokens": reply.reasoning_tokens}
        if self.session.draft is not None:  # ster's extension: the drafter's proposals and the accepted ones
            out["draft_tokens_details"] = {"drafted": gen.drafted, "accepted": gen.accepted}
        return out

    def logprobs(self, reply, chat: bool) -> dict | None:
        """A reply's ``logprobs`` in its endpoint's shape, or None when none were asked for: chat's
        ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}``, or the completions'
        ``{"tokens", "token_logprobs", "top_logprobs": [{text: logprob}], "text_offset"}`` (offsets in
        characters of the prompt and completion, the first at the prompt's length)."""
        gen = reply.generation
        if reply.generation is None or not gen.logprobs:
            return None
        tok = self.session.loaded.tokenizer

        def text(i: int) -> str:
            return tok.decode([i], skip_special_tokens=False)

        if not chat:
            tokens = [text(e["id"]) for e in gen.logprobs]
            offsets = [len(reply.prompt_text) + sum(map(len, tokens[:k])) for k in range(len(tokens))]
            return {"tokens": tokens, "token_logprobs": [e["logprob"] for e in gen.logprobs],
                    "top_logprobs": [{text(i): lp for i, lp in e["top"]} for e in gen.logprobs],
                    "text_offset": offsets}

        def entry(i: int, lp: float) -> dict:
            piece = text(i)
            return {"token": piece, "logprob": lp, "bytes": list(piece.encode("utf-8"))}

        return {"content": [{**entry(e["id"], e["logprob"]), "top_logprobs": [entry(i, lp) for i, lp in e["top"]]}
                            for e in gen.logprobs]}


def _tool_call(call: dict, index: int | None = None) -> dict:
    out = {"id": call["id"], "type": "function",
           "function": {"name": call["name"], "arguments": json.dumps(call["arguments"], ensure_ascii=False)}}
    return out if index is None else {"index": index, **out}


def _finish(reason: str) -> str:
    return "stop" if reason == "cancelled" else reason


def build_app(server: Server):
    """The Starlette application serving ``server``."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    def fail(err: RequestError) -> JSONResponse:
        return JSONResponse(error_body(str(err), param=err.param), status_code=err.status)

    async def read_body(request: Request) -> Any:
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
            raise RequestError(f"the request body is {int(size)} bytes, more than {MAX_BODY_BYTES}", status=413)
        raw = b""
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_BODY_BYTES:
                raise RequestError(f"the request body is more than {MAX_BODY_BYTES} bytes", status=413)
        if json_depth(raw) > MAX_JSON_DEPTH:
            raise RequestError(f"the request body nests arrays/objects more than {MAX_JSON_DEPTH} deep")
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise RequestError(f"the request body is not valid JSON ({e})") from None

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": server.model_name, "object": "model",
                                                         "created": server.created, "owned_by": "ster"}]})

    async def completions(request: Request, chat: bool):
        try:
            body = await read_body(request)
            args = server.parse(body, chat)
        except RequestError as e:
            return fail(e)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        if body.get("stream"):
            include_usage = isinstance(body.get("stream_options"), dict) and body["stream_options"].get("include_usage")
            return StreamingResponse(_stream(args, rid, created, obj, chat, bool(include_usage)),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        from starlette.concurrency import run_in_threadpool
        from starlette.responses import Response

        # A client that goes away stops its generation (and frees the lock) as a streamed one does: polled
        # here, since only the event loop can read the connection.
        gone = threading.Event()

        async def watch() -> None:
            while not gone.is_set():
                if await request.is_disconnected():
                    gone.set()
                    return
                await asyncio.sleep(0.2)

        watcher = asyncio.ensure_future(watch())
        try:
            reply = await run_in_threadpool(server.run, args, None, gone.is_set)
        except RequestError as e:
            return fail(e)
        finally:
            stopped = gone.is_set()
            gone.set()
            watcher.cancel()
        if reply is None or stopped:  # nobody is listening
            return Response(status_code=499)
        usage = server.usage(reply)
        if chat:
            message: dict = {"role": "assistant", "content": reply.text if reply.text or not reply.tool_calls else None}
            if reply.thinking:
                message["reasoning_content"] = reply.thinking
            if reply.tool_calls:
                message["tool_calls"] = [_tool_call(c) for c in reply.tool_calls]
            errors = [e.text for e in reply.events if e.kind == "error"]
            if errors:
                message["content"] = (message["content"] or "") + "".join(f"\n[{m}]" for m in errors)
            choice = {"index": 0, "message": message, "logprobs": server.logprobs(reply, True),
                      "finish_reason": _finish(reply.finish_reason)}
        else:
            choice = {"index": 0, "text": reply.text, "logprobs": server.logprobs(reply, False),
                      "finish_reason": _finish(reply.finish_reason)}
        return JSONResponse({"id": rid, "object": obj, "created": created, "model": server.model_name,
                             "choices": [choice], "usage": usage})

    async def _stream(args, rid, created, obj, chat, include_usage):
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        gone = threading.Event()
        obj_chunk = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta_or_text, finish=None, usage=None, logprobs=None) -> str:
            if chat:
                choice = {"index": 0, "delta": delta_or_text, "logprobs": logprobs, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta_or_text, "logprobs": logprobs, "finish_reason": finish}
            doc = {"id": rid, "object": obj_chunk, "created": created, "model": server.model_name,
                   "choices": [] if usage is not None else [choice]}
            if usage is not None:
                doc["usage"] = usage
            return "data: " + json.dumps(doc, ensure_ascii=False) + "\n\n"

        calls = {"n": 0}

        def on_event(e) -> None:
            if chat:
                if e.kind == "text":
                    data = chunk({"content": e.text})
                elif e.kind == "thinking":
                    data = chunk({"reasoning_content": e.text})
                elif e.kind == "tool_call":
                    data = chunk({"tool_calls": [_tool_call(e.call, calls["n"])]})
                    calls["n"] += 1
                else:
                    data = chunk({"content": f"\n[{e.text}]"})
            else:
                data = chunk(e.text)
            loop.call_soon_threadsafe(queue.put_nowait, data)

        def work() -> None:
            try:
                reply = server.run(args, on_event=on_event, cancelled=gone.is_set)
                if reply is None:
                    loop.call_soon_threadsafe(queue.put_nowait, None)
                    return
                end = [chunk({} if chat else "", _finish(reply.finish_reason), logprobs=server.logprobs(reply, chat))]
                if include_usage:
                    end.append(chunk(None, usage=server.usage(reply)))
                end.append("data: [DONE]\n\n")
                for data in end:
                    loop.call_soon_threadsafe(queue.put_nowait, data)
            except RequestError as e:
                loop.call_soon_threadsafe(queue.put_nowait, "data: " + json.dumps(error_body(str(e))) + "\n\n")
            except Exception as e:  # noqa: BLE001 - the stream must end; the message says what failed
                loop.call_soon_threadsafe(queue.put_nowait, "data: " + json.dumps(
                    error_body(f"internal error: {type(e).__name__}: {e}", "server_error")) + "\n\n")
            loop.call_soon_threadsafe(queue.put_nowait, None)

        thread = threading.Thread(target=work, daemon=True)
        try:
            if chat:
                yield chunk({"role": "assistant", "content": ""})
            thread.start()
            while True:
                data = await queue.get()
                if data is None:
                    break
                yield data
        finally:  # the client went away (the response was cancelled) or the stream ended
            gone.set()

    async def chat_completions(request: Request):
        return await completions(request, True)

    async def text_completions(request: Request):
        return await completions(request, False)

    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        text = {404: f"no such endpoint: {request.method} {request.url.path}",
                405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, str(exc.detail))
        return JSONResponse(error_body(text, kind), status_code=exc.status_code)

    routes = [Route("/v1/models", models, methods=["GET"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/completions", text_completions, methods=["POST"])]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})
