"""``ster serve``: an OpenAI-compatible HTTP server for one model (Starlette on uvicorn).

Endpoints: ``GET /v1/models`` and ``GET /v1/models/{id}``, ``POST /v1/chat/completions`` (messages
through the chat template; ``stream`` as server-sent events; ``tools`` parsed into ``tool_calls``;
reasoning into ``reasoning_content``), ``POST /v1/completions`` (a raw text continued), ``GET /health``
(``{"status": "ok"}``, as llama.cpp's server: the app is built once the model is loaded). One model per
process, and one request generates at a time: the others wait their turn (a lock), so a server on a
machine's cores never runs two models' worth of threads. At most ``max_queue`` requests wait; one
more gets a 503 with ``Retry-After``. Consecutive requests reuse the prompt cache's shared prefix
(``conversation.Session``); ``usage.prompt_tokens_details.cached_tokens`` says how many prompt tokens
were reused. The ``model`` a request names is not checked (clients send their own defaults): the one
model answers, and replies name it.

Extensions to OpenAI's request: ``steering: {"vector": NAME, "strength": X}`` names a vector loaded
at start (``--vector NAME=FILE``), applied to this request only (``strength`` defaults to 1);
``top_k``, ``min_p``, ``repeat_penalty``; ``thinking`` (or ``chat_template_kwargs.enable_thinking``)
sets the template's thinking switch. ``logprobs``/``top_logprobs`` follow OpenAI's shape (natural
logarithms of the model's own distribution); a streamed reply carries each chunk's tokens' logprobs.

Errors have OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``: 400 for a request
that is not JSON or breaks a rule (or whose Host header is not one host[:port], or that has more than one
Host or Origin header), 403 for a browser page of another origin (or an allowed page's preflight for a
method other than GET or POST) or (on loopback) a Host that is not this machine's, 404 for an unknown
path or model, 405 for a wrong method, 408 for a body that does not arrive in time, 413 for a body
over 8 MiB, 415 for a body not sent as ``application/json``, 503 when the queue is full or the server is stopping. A client that
disconnects stops its generation at the next token (a request waiting for its turn leaves the queue
within a quarter of a second). The bounds against abusive clients (a connection's headers and body
must arrive in time, a body's size, the queue, the connections) are the constants below and
``uvicorn_server``'s; what a body may hold (its fields, their types and ranges, its nesting and item
count, the messages) is checked by ``server_request``.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import threading
import time
import uuid
from typing import Any

from .errors import SterError, terminal_text
from .server_request import (MAX_JSON_DEPTH, MAX_JSON_ITEMS, RequestError, check_ignored_fields, check_unicode,
                             check_unsupported, error_body, json_shape, logit_bias_of, normalize_messages,
                             number_field, sampling_of, shown_value, stops_of, stream_options_of)

#: Largest request body read, in bytes (a conversation's text; refused above with 413).
MAX_BODY_BYTES = 8 << 20
#: Seconds a request's body may take to arrive once its headers have (408 after; a slow client holds
#: a connection no longer). 8 MiB in 30 s is 280 kB/s.
BODY_TIMEOUT = 30.0
#: Seconds a connection may take to send a request's headers, from its opening or the end of its
#: previous reply; it is closed after (uvicorn itself only times out an idle kept-alive connection).
HEADER_TIMEOUT = 10.0
#: Seconds an idle kept-alive connection stays open between requests (uvicorn's timeout_keep_alive).
KEEP_ALIVE_TIMEOUT = 5.0
#: The most bytes of a request line + headers held while they are incomplete (h11's
#: max_incomplete_event_size; uvicorn answers a plain 400 past it).
MAX_HEADER_BYTES = 16 << 10
#: Connections kept open beyond the queue's requests: the one generating, /v1/models polls, idle
#: kept-alive clients (``uvicorn_server``).
SPARE_CONNECTIONS = 64
#: Retry-After (seconds) of a 503: the queue is full or the server is stopping.
RETRY_AFTER = 5
#: How often (seconds) a request waiting for the lock checks whether its client is gone or the server stops.
_WAIT_POLL = 0.25


class Turn:
    """A request's place among those admitted (``Server.admit``): released once, when the request ends,
    or when it never got to run."""

    def __init__(self, server: "Server"):
        self.server, self.released = server, False
        self.started = False   # a streamed reply's worker took charge of releasing it

    def release(self) -> None:
        with self.server._count_lock:
            if not self.released:
                self.released = True
                self.server.admitted -= 1


class Server:
    """The state behind the app: the session, the vectors, the one-at-a-time lock and its queue.

    Args:
        session: a ``conversation.Session``.
        model_name: the id ``/v1/models`` lists and replies name.
        vectors: name -> ``steering.SteeringVector`` (loaded and checked at start).
        max_tokens: the default ``max_tokens`` of a request that gives none.
        max_queue: the most requests waiting while one generates; one more gets a 503.
    """

    def __init__(self, session, model_name: str, vectors: dict | None = None, max_tokens: int = 256,
                 max_queue: int = 64):
        self.session = session
        self.model_name = model_name
        self.vectors = dict(vectors or {})
        self.max_tokens = max_tokens
        self.max_queue = max_queue
        self.lock = threading.Lock()
        self.created = int(time.time())
        self.served = 0
        self.admitted = 0   # requests admitted and not yet done (the one generating and those waiting)
        self._count_lock = threading.Lock()
        #: Set when the server stops (a signal): replies end at their next token, waiting ones leave.
        self.closing = threading.Event()

    # ------------------------------------------------------------------ the queue

    def _busy(self, coming: int) -> RequestError | None:
        """The 503 for one more request when ``coming`` more would count (0: it is counted already)."""
        if self.closing.is_set():
            return RequestError("the server is shutting down; retry on another or after it restarts", status=503,
                                code="server_shutting_down", headers={"Retry-After": str(RETRY_AFTER)})
        if self.admitted + coming > self.max_queue + 1:  # the one generating and max_queue waiting
            if self.max_queue == 0:
                busy = "the server is busy with another request and queues none (ster serve --max-queue 0)"
            else:
                waiting = "1 request is" if self.max_queue == 1 else f"{self.max_queue} requests are"
                busy = f"the server is busy: {waiting} waiting for their turn (ster serve --max-queue)"
            return RequestError(busy + "; retry later", status=503, code="queue_full",
                                headers={"Retry-After": str(RETRY_AFTER)})
        return None

    def check_room(self) -> None:
        """Refuse early (before a body is read) when the queue is full or the server stops.

        Raises:
            RequestError: 503 with Retry-After.
        """
        busy = self._busy(1)
        if busy is not None:
            raise busy

    def admit(self) -> Turn:
        """A place for a parsed request: the one generating and ``max_queue`` waiting fit.

        Raises:
            RequestError: 503 with Retry-After: the queue is full, or the server stops.
        """
        with self._count_lock:
            self.admitted += 1
            busy = self._busy(0)
            if busy is not None:
                self.admitted -= 1
                raise busy
        return Turn(self)

    # ------------------------------------------------------------------ a request

    def steering(self, body: dict):
        """(hook, key) of a request's ``steering`` extension, or (None, None); ``strength`` defaults to 1."""
        from .steering import steering_hook

        spec = body.get("steering")
        if spec is None:
            return None, None
        shape = 'steering must be an object {"vector": NAME, "strength": X} (strength defaults to 1)'
        if not isinstance(spec, dict) or not isinstance(spec.get("vector"), str):
            raise RequestError(shape, "steering")
        extra = sorted(set(spec) - {"vector", "strength"})
        if extra:
            raise RequestError(f"steering: unknown key {shown_value(extra[0])}; {shape}", "steering")
        name = spec["vector"]
        if name not in self.vectors:
            have = ", ".join(sorted(self.vectors)) or "none (start the server with --vector NAME=FILE)"
            raise RequestError(f"steering: no vector named {ascii(name)[:60]}; loaded: {have}", "steering.vector")
        try:
            strength = number_field(spec, "strength", 1.0)
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
        if chat and self.session.template is None:
            raise RequestError("this model has no chat template (a base model), so /v1/chat/completions cannot "
                               "format a conversation for it; send the raw text to /v1/completions as \"prompt\"",
                               "messages")
        check_unicode(body)
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise RequestError("model must be a string", "model")
        n = body.get("n", 1)
        if n is not None and (type(n) is not int or n != 1):
            raise RequestError(f"n must be 1 (one choice per request), got {shown_value(n)}", "n")
        if not isinstance(body.get("stream", False), bool):
            raise RequestError("stream must be a boolean", "stream")
        check_unsupported(body, chat)
        check_ignored_fields(body)
        args: dict = {"sampling": sampling_of(body, self.max_tokens, chat), "stops": stops_of(body)}
        args["sampling"] = dataclasses.replace(
            args["sampling"], logit_bias=logit_bias_of(body, self.session.loaded.decoder.spec.vocab_size))
        if self.session.draft is not None and args["sampling"].temperature != 0:
            raise RequestError("temperature must be 0: this server decodes speculatively with a drafter (ster serve "
                               "--draft), whose output is greedy decoding's; omit temperature or send 0, or serve "
                               "without --draft to sample", "temperature")
        args["layer_hook"], args["key"] = self.steering(body)
        stream_options_of(body)
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
            if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
                raise RequestError(f"prompt: a batch of {len(prompt)} prompts is not supported (one reply per "
                                   "request); send each prompt as a string in a request of its own", "prompt")
            if isinstance(prompt, list) and prompt and all(
                    isinstance(p, int) and not isinstance(p, bool) or isinstance(p, list) for p in prompt):
                raise RequestError("prompt: token-id prompts are not supported; send the text as a string", "prompt")
            if not isinstance(prompt, str) or not prompt:
                raise RequestError("prompt must be a non-empty string", "prompt")
            if not prompt.strip():   # as ster generate and chat refuse it: no text to continue
                raise RequestError("prompt is only whitespace; send the text the model should continue", "prompt")
            args["raw"], args["messages"] = prompt, []
        return args

    def build_prompt(self, args: dict) -> None:
        """Render and tokenize a parsed request's prompt ahead of its turn (``args["prompt"]``, which ``run``
        passes on), so that a prompt the model refuses gets its 400 before a streamed reply's 200.

        Raises:
            RequestError: 400, the prompt is longer than the context (code ``context_length_exceeded``, as
                OpenAI's) or the chat template failed on it.
        """
        from .errors import ContextFull

        try:
            args["prompt"] = self.session.prompt(args["messages"], tools=args.get("tools"),
                                                 thinking=args.get("thinking"), raw=args.get("raw"))
            args["messages"] = []   # they are in the prompt now: a request waiting its turn holds them once
        except ContextFull as e:
            raise RequestError(self.private(str(e)), "prompt" if "raw" in args else "messages",
                               code="context_length_exceeded") from None
        except SterError as e:
            raise RequestError(self.private(str(e))) from None

    def private(self, message: str) -> str:
        """An error message fit for a client: the server's model path (in the tokenizer's and the chat
        template's names) becomes "the model"."""
        source = str(getattr(self.session.loaded.tokenizer, "source", "") or "")
        if not source:
            return message
        return message.replace(f"chat template of {source}", "the model's chat template").replace(source, "the model")

    def run(self, args: dict, on_event=None, cancelled=None, on_logprobs=None):
        """Generate one reply once it has the lock; None when cancelled (or the server stops) before its
        turn. ``on_logprobs`` is called with the logprobs entry of each new token whose text is in the reply,
        before that text is parsed (``Session.reply``'s).

        Raises:
            RequestError: a request the model refuses (a prompt longer than the context...).
        """
        def stop() -> bool:
            return self.closing.is_set() or (cancelled is not None and cancelled())

        while not self.lock.acquire(timeout=_WAIT_POLL):  # a client that leaves the queue frees its place soon
            if stop():
                return None
        try:
            if stop():
                return None
            try:
                reply = self.session.reply(args.pop("messages"), args.pop("sampling"), on_event=on_event,
                                           cancelled=stop, on_logprobs=on_logprobs, **args)
            except SterError as e:
                raise RequestError(self.private(str(e))) from None
            self.served += 1
            return reply
        finally:
            self.lock.release()

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

    def logged_counts(self, reply) -> tuple[int, ...]:
        """What a request's log line counts: prompt and new tokens, and with a drafter the accepted and drafted
        ones (as ``ster generate --draft`` and ``ster chat --draft`` sum them up)."""
        gen = reply.generation
        return (len(reply.prompt_ids), len(gen.ids)) + ((gen.accepted, gen.drafted) if self.session.draft else ())

    def logprobs(self, reply, chat: bool) -> dict | None:
        """A reply's ``logprobs`` in its endpoint's shape, or None when none were asked for
        (``logprobs_of`` over the tokens whose text is in it: not the end token, nor text cut at a stop string)."""
        if reply.generation is None or not reply.logprobs:
            return None
        return self.logprobs_of(reply.logprobs, chat, len(reply.prompt_text))

    def logprobs_of(self, entries: list[dict], chat: bool, offset: int = 0) -> dict | None:
        """Tokens' logprobs entries (``Reply.logprobs``) in an endpoint's shape, or None for none: chat's
        ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}``, or the completions'
        ``{"tokens", "token_logprobs", "top_logprobs": [{key: logprob}], "text_offset"}``. A token's
        ``bytes`` are its own piece (``Tokenizer.token_bytes``: ``▁world`` is b" world"), its ``token`` that
        piece's text (U+FFFD for bytes that are not UTF-8); ``text_offset`` is ``offset`` (the prompt's
        length) plus the entry's character offset in the reply; a ``top_logprobs`` key is ``logprob_key``'s."""
        if not entries:
            return None
        tok = self.session.loaded.tokenizer

        if not chat:
            return {"tokens": [tok.token_text(e["id"]) for e in entries],
                    "token_logprobs": [e["logprob"] for e in entries],
                    "top_logprobs": [top_logprobs_by_key(tok, e["top"]) for e in entries],
                    "text_offset": [offset + e.get("offset", 0) for e in entries]}

        def entry(i: int, lp: float) -> dict:
            return {"token": tok.token_text(i), "logprob": lp, "bytes": list(tok.token_bytes(i))}

        return {"content": [{**entry(e["id"], e["logprob"]), "top_logprobs": [entry(i, lp) for i, lp in e["top"]]}
                            for e in entries]}


def logprob_key(piece: bytes) -> str:
    """A completions ``top_logprobs`` key: the piece's text, or, for bytes that are not UTF-8 (part of a
    character), OpenAI's ``bytes:\\xe3\\x81`` form, so that such alternatives do not all read U+FFFD."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in piece)


def top_logprobs_by_key(tok, top: list[tuple[int, float]]) -> dict[str, float]:
    """``{logprob_key(piece): logprob}`` of (id, logprob) alternatives; of distinct tokens with the same key
    (an added token spelled as a piece is) the higher logprob is kept."""
    out: dict[str, float] = {}
    for i, lp in top:
        key = logprob_key(tok.token_bytes(i))
        if key not in out or lp > out[key]:
            out[key] = lp
    return out


def _tool_call(call: dict, index: int | None = None) -> dict:
    out = {"id": call["id"], "type": "function",
           "function": {"name": call["name"], "arguments": json.dumps(call["arguments"], ensure_ascii=False)}}
    return out if index is None else {"index": index, **out}


def _finish(reason: str) -> str:
    return "stop" if reason == "cancelled" else reason


class _Gone(Exception):
    """The client closed its connection while its request was being read: nobody to answer."""


_CLOSE = {"Connection": "close"}   # a reply sent before the body was read: the connection cannot carry another


#: A Host header's form: one name or IPv4 address, or a bracketed IPv6 address, and an optional port.
_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~-]+)(?::[0-9]{1,5})?")


def _hostname(host: str) -> str:
    """A Host header's name or address without its port: ``[::1]:8080`` -> ``::1``."""
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def is_loopback(host: str) -> bool:
    """True for ``localhost`` (and ``*.localhost``, RFC 6761) and loopback addresses (127.0.0.0/8, ::1)."""
    import ipaddress

    name = host.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


#: An origin's parts: scheme "://" authority, then whatever follows (a path, query or fragment).
_ORIGIN = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)(.*)", re.S)
_DEFAULT_PORT = {"http": 80, "https": 443}


def normalize_origin(text: str) -> str:
    """``text`` as a browser serializes an origin in its ``Origin`` header (RFC 6454 section 6.1):
    ``HTTPS://App.Example:443`` -> ``https://app.example``. The scheme and host are lowercased, the
    scheme's default port (80, 443) is dropped, an IPv6 address is compressed (``[0:0::1]`` -> ``[::1]``).

    Raises:
        SterError: ``text`` is no origin a browser sends (its message says why, without ``text``): not
            http:// or https://, a user name (``user@``), a path (``/`` too), query or fragment, no host, a
            port outside 1-65535, a host not in ASCII (browsers send its punycode: the message gives
            Python's IDNA encoding of it), or a host of other characters.
    """
    import ipaddress

    match = _ORIGIN.fullmatch(text)
    if match is None or match[1].lower() not in _DEFAULT_PORT:
        raise SterError("it is not http:// or https:// followed by a host")
    scheme, authority, rest = match[1].lower(), match[2], match[3]
    if rest:
        raise SterError(f"it has a path, query or fragment ({rest!r}); an origin has no path, not even /")
    if "@" in authority:
        raise SterError(f"it has a user name ({authority.rpartition('@')[0]!r} before @); a browser's Origin never does")
    if authority.startswith("["):
        host, bracket, port = authority[1:].partition("]")
        if not bracket:
            raise SterError("its [IPv6 address] has no closing ]")
        try:
            host = f"[{ipaddress.IPv6Address(host).compressed}]"
        except ValueError:
            raise SterError("its host in brackets is not an IPv6 address") from None
    else:
        host, colon, port = authority.partition(":")
        port = colon + port
    if port[:1] not in ("", ":"):
        raise SterError("it is not host[:port]")
    port = port[1:]
    if not host:
        raise SterError("it has no host")
    if not host.isascii():
        try:
            ascii_form = f" ({scheme}://{host.encode('idna').decode()}" + (f":{port}" if port else "") + \
                ", Python's IDNA encoding of it)"
        except UnicodeError:
            ascii_form = ""
        raise SterError(f"its host is not ASCII; browsers send the punycode (xn--) form: give that{ascii_form}")
    if not re.fullmatch(r"\[[0-9a-f:.]+\]|[A-Za-z0-9._~-]+", host):
        raise SterError(f"its host {host!r} holds characters a host name cannot")
    if port and not (port.isdigit() and port.isascii() and 1 <= int(port) <= 65535):
        raise SterError(f"its port {port!r} is not a number from 1 to 65535")
    port = "" if not port or int(port) == _DEFAULT_PORT[scheme] else f":{int(port)}"
    return f"{scheme}://{host.lower()}{port}"


def _origin_key(text: str) -> str | None:
    """A request's ``Origin`` header normalized (``normalize_origin``) for comparison; None when it is none a
    browser sends (``null``, a page of an opaque origin, among them): it matches no allowed origin."""
    try:
        return normalize_origin(text)
    except SterError:
        return None


def _printable(text: str, limit: int = 200) -> str:
    """``text`` for a log line or a message: what a terminal would act on escaped (a client cannot forge log
    lines or terminal escapes through its path, ``errors.terminal_text``), cut to ``limit``."""
    return terminal_text(text[:limit]) + ("..." if len(text) > limit else "")


def build_app(server: Server, *, loopback: bool = True, allow_origins: tuple[str, ...] = (), log=None):
    """The ASGI application serving ``server``.

    Args:
        loopback: the server listens on a loopback address: a request whose Host header names
            anything but this machine (``localhost``, 127.0.0.0/8, ``[::1]``) is refused (403), so
            that a web page cannot reach it through DNS rebinding.
        allow_origins: origins (``https://app.example``; ``*``: any) whose web pages may call the
            server; CORS headers and preflights answer them. A request with another Origin header
            than the server's own is refused (403): a browser sends one with every cross-site POST.
            Origins are compared as ``normalize_origin`` writes them (``https://App.Example:443`` is
            ``https://app.example``). A preflight that asks for a method other than GET or POST is refused
            (403) in OpenAI's error shape, as a preflight of another origin is.
        log: called with one line per request when it ends (client, method, path, status, prompt and
            new tokens, seconds; status 499 for a client that left before its reply's end, a stream's
            line once its generation stopped); None logs nothing.
    """
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.datastructures import Headers
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    allowed = {o if o == "*" else normalize_origin(o) for o in allow_origins}

    class ErrorResponse(JSONResponse):
        """An error document in ASCII: whatever it quotes of a request encodes."""

        def render(self, content: Any) -> bytes:
            return json.dumps(content, separators=(",", ":")).encode("ascii")

    def fail(err: RequestError) -> Response:
        return ErrorResponse(error_body(str(err), err.kind, err.param, err.code), status_code=err.status,
                             headers=err.headers)

    def refusal(headers: Headers) -> RequestError | None:
        """A request's Host and Origin checked (see ``loopback`` and ``allow_origins``): one of each at most, the
        Host one host[:port]."""
        for name in ("Host", "Origin"):
            if len(headers.getlist(name)) > 1:
                return RequestError(f"the request has {len(headers.getlist(name))} {name} headers; send one",
                                    status=400, code=f"bad_{name.lower()}", headers=_CLOSE)
        host = headers.get("host")
        if host is not None and not _HOST.fullmatch(host):
            return RequestError(f"the Host header {ascii(host)[:80]} is not one host[:port]", status=400,
                                code="bad_host", headers=_CLOSE)
        if loopback and host is not None and not is_loopback(_hostname(host)):
            return RequestError(f"the Host header {ascii(host)[:80]} does not name this machine: the server listens on "
                                "loopback and answers requests to localhost, 127.0.0.1 or [::1] only (a guard against "
                                "DNS rebinding); to serve a network, start it with --host 0.0.0.0", status=403,
                                kind="permission_error", code="host_not_allowed", headers=_CLOSE)
        origin = headers.get("origin")
        key = _origin_key(origin) if origin is not None else None
        own = _origin_key(f"http://{host}") if host is not None else None
        if origin is not None and "*" not in allowed and (key is None or key not in allowed and key != own):
            return RequestError(f"requests from web pages of other origins are refused ({ascii(origin)[:80]}); to let "
                                "that page use this server, start it with --allow-origin ORIGIN", status=403,
                                kind="permission_error", code="origin_not_allowed", headers=_CLOSE)
        return None

    def check_json(request: Request) -> None:
        # A browser page can POST text/plain or a form to any address without asking (no CORS preflight):
        # a JSON body sent as JSON is what a web page cannot send unasked.
        kind = request.headers.get("content-type", "")
        if kind.partition(";")[0].strip().lower() != "application/json":
            raise RequestError(f"send the request body as JSON with the header Content-Type: application/json (got "
                               f"{ascii(kind)[:60] if kind else 'none'}; curl: -H 'Content-Type: application/json')",
                               status=415, headers=_CLOSE)

    async def read_body(request: Request) -> Any:
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
            raise RequestError(f"the request body is {int(size)} bytes, more than {MAX_BODY_BYTES}", status=413,
                               headers=_CLOSE)
        raw = bytearray()

        async def read() -> None:
            async for chunk in request.stream():
                raw.extend(chunk)
                if len(raw) > MAX_BODY_BYTES:
                    raise RequestError(f"the request body is more than {MAX_BODY_BYTES} bytes", status=413,
                                       headers=_CLOSE)

        try:
            await asyncio.wait_for(read(), BODY_TIMEOUT)
        except asyncio.TimeoutError:
            raise RequestError(f"the request body did not arrive within {BODY_TIMEOUT:g} s of its headers; send it "
                               "whole and promptly", status=408, headers=_CLOSE) from None
        except ClientDisconnect:
            raise _Gone() from None
        return await run_in_threadpool(parse_json, bytes(raw))   # 8 MiB take half a second: not on the event loop

    def parse_json(raw: bytes) -> Any:
        depth, items = json_shape(raw)
        if depth > MAX_JSON_DEPTH:
            raise RequestError(f"the request body nests arrays/objects more than {MAX_JSON_DEPTH} deep")
        if items > MAX_JSON_ITEMS:
            raise RequestError(f"the request body holds {items} array elements and object members, more than "
                               f"{MAX_JSON_ITEMS}; send fewer messages, tools or logit_bias entries")
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise RequestError(f"the request body is not valid JSON ({e})") from None

    def model_card() -> dict:
        return {"id": server.model_name, "object": "model", "created": server.created, "owned_by": "ster"}

    async def health(request: Request) -> JSONResponse:
        # llama.cpp's server answers {"status": "ok"} once its model is loaded; this app exists only then
        return JSONResponse({"status": "ok"})

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def model(request: Request) -> Response:
        name = request.path_params["model_id"]
        if name != server.model_name:
            return fail(RequestError(f"the model {ascii(name)[:80]} does not exist: this server serves "
                                     f"{ascii(server.model_name)} (GET /v1/models lists it)", "model", 404,
                                     code="model_not_found"))
        return JSONResponse(model_card())

    def stopping(cut: bool) -> RequestError:
        return RequestError("the server is shutting down" + ("; the reply was cut short" if cut else "")
                            + "; retry after it restarts", status=503, code="server_shutting_down",
                            headers={"Retry-After": str(RETRY_AFTER)})

    async def completions(request: Request, chat: bool):
        try:
            check_json(request)
            server.check_room()   # a full queue is told before the body is read
            body = await read_body(request)
            args = server.parse(body, chat)
            streamed, include_usage = body.get("stream") is True, stream_options_of(body)
            del body   # what waits for its turn is what the reply needs
            await run_in_threadpool(server.build_prompt, args)   # refused here, before a stream's 200
            turn = server.admit()
        except RequestError as e:
            return fail(e)
        except _Gone:
            # Nothing was done for it, and slow clients the connection cap closes would flood the log.
            request.scope["ster.unlogged"] = True
            return Response(status_code=499)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        if streamed:
            # How the stream ends, for the request's log line: its worker (the tokens are counted when it ends)
            # and whether the reply was sent whole.
            request.scope["ster.stream"] = {"worker": None, "ended": False}
            return TurnStream(turn, stream(args, rid, created, obj, chat, include_usage, turn, request.scope),
                              media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

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
            turn.release()
            stopped = gone.is_set()
            gone.set()
            watcher.cancel()
        if reply is not None:
            request.scope["ster.tokens"] = server.logged_counts(reply)
        if stopped:  # nobody is listening
            return Response(status_code=499)
        if reply is None or (reply.finish_reason == "cancelled" and server.closing.is_set()):
            return fail(stopping(reply is not None))
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

    class TurnStream(StreamingResponse):
        """A streamed reply that gives its request's place back if its worker never started (the client
        left before the first chunk); a started worker gives it back when it ends."""

        def __init__(self, turn: Turn, *args, **kw):
            super().__init__(*args, **kw)
            self.turn = turn

        async def __call__(self, scope, receive, send) -> None:
            try:
                await super().__call__(scope, receive, send)
            finally:
                if not self.turn.started:
                    self.turn.release()

    async def stream(args, rid, created, obj, chat, include_usage, turn, scope):
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        gone = threading.Event()
        obj_chunk = "chat.completion.chunk" if chat else "text_completion"
        pending: list[dict] = []          # logprobs entries of the tokens not yet sent (the worker's)
        prompt_length = len(args.get("raw") or "")   # the completions' text_offset counts from the prompt's end

        def put(data) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, data)

        class Last(str):
            """The stream's last event ([DONE] or an error): once it is sent the reply is whole, whatever the
            client does next (an OpenAI client closes the connection on [DONE], which could cancel the stream
            before the worker's end-of-queue arrived and log a whole reply as 499)."""

        def take() -> dict | None:
            """The logprobs of the tokens since the last chunk: each chunk carries its own tokens'."""
            out = server.logprobs_of(pending, chat, prompt_length)
            pending.clear()
            return out

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

        def error_event(err: RequestError) -> str:
            return "data: " + json.dumps(error_body(str(err), err.kind, err.param, err.code)) + "\n\n"

        calls = {"n": 0}

        def on_event(e) -> None:
            if chat:
                if e.kind == "text":
                    delta = {"content": e.text}
                elif e.kind == "thinking":
                    delta = {"reasoning_content": e.text}
                elif e.kind == "tool_call":
                    delta = {"tool_calls": [_tool_call(e.call, calls["n"])]}
                    calls["n"] += 1
                else:
                    delta = {"content": f"\n[{e.text}]"}
                put(chunk(delta, logprobs=take()))
            else:
                put(chunk(e.text, logprobs=take()))

        def work() -> None:
            try:
                reply = server.run(args, on_event=on_event, cancelled=gone.is_set, on_logprobs=pending.append)
                if reply is not None:
                    scope["ster.tokens"] = server.logged_counts(reply)
                if gone.is_set():
                    return
                if reply is None or (reply.finish_reason == "cancelled" and server.closing.is_set()):
                    put(Last(error_event(stopping(reply is not None))))
                    return
                put(chunk({} if chat else "", _finish(reply.finish_reason), logprobs=take()))
                if include_usage:
                    put(chunk(None, usage=server.usage(reply)))
                put(Last("data: [DONE]\n\n"))
            except RequestError as e:
                put(Last(error_event(e)))
            except Exception as e:  # noqa: BLE001 - the stream must end; the message says what failed
                put(Last(error_event(RequestError(server.private(f"internal error: {type(e).__name__}: {e}"),
                                                  status=500))))
            finally:
                turn.release()
                put(None)

        thread = threading.Thread(target=work, daemon=True)
        try:
            if chat:
                yield chunk({"role": "assistant", "content": ""})
            turn.started = True
            thread.start()
            scope["ster.stream"]["worker"] = thread
            while True:
                data = await queue.get()
                if data is None:
                    scope["ster.stream"]["ended"] = True
                    break
                yield data
                if isinstance(data, Last):   # sent: the client has the whole reply
                    scope["ster.stream"]["ended"] = True
        finally:  # the client went away (the response was cancelled) or the stream ended
            gone.set()

    async def chat_completions(request: Request):
        return await completions(request, True)

    async def text_completions(request: Request):
        return await completions(request, False)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        text = {404: f"no such endpoint: {request.method} {_printable(request.url.path, 80)}",
                405: f"{request.method} is not allowed on {_printable(request.url.path, 80)}"}.get(
                    exc.status_code, str(exc.detail))
        return ErrorResponse(error_body(text, kind), status_code=exc.status_code)

    async def internal_error(request: Request, exc: Exception) -> Response:
        return ErrorResponse(error_body(server.private(f"internal error: {type(exc).__name__}: {exc}"),
                                        "server_error"), status_code=500)

    routes = [Route("/health", health, methods=["GET"]),
              Route("/v1/models", models, methods=["GET"]),
              Route("/v1/models/{model_id:path}", model, methods=["GET"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/completions", text_completions, methods=["POST"])]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: internal_error})
    if allow_origins:
        from starlette.middleware.cors import CORSMiddleware

        class CORS(CORSMiddleware):
            """starlette's CORS with origins compared normalized (``normalize_origin``) and a refused preflight
            answered in OpenAI's error shape (starlette's is a plain-text 400 "Disallowed CORS method"), 403 as
            ``refusal`` answers another origin's preflight: the browser asked for a permission it is denied."""

            def is_allowed_origin(self, origin: str) -> bool:
                return self.allow_all_origins or _origin_key(origin) in self.allow_origins

            def preflight_response(self, request_headers: Headers) -> Response:
                response = super().preflight_response(request_headers)
                if response.status_code < 400:
                    return response
                method = request_headers["access-control-request-method"]
                if method not in self.allow_methods:
                    text, code = (f"a web page asked (CORS preflight) to send {ascii(method)[:40]} requests; the "
                                  "server answers GET and POST only"), "method_not_allowed"
                else:  # what starlette refused: "Disallowed CORS headers" ...
                    text, code = f"the CORS preflight is refused: {bytes(response.body).decode()}", "cors_refused"
                headers = {k: v for k, v in response.headers.items() if k not in ("content-type", "content-length")}
                return fail(RequestError(text, status=403, kind="permission_error", code=code, headers=headers))

        app = CORS(app, allow_origins=allowed, allow_methods=["GET", "POST"], allow_headers=["*"],
                   allow_private_network=True, max_age=600)

    async def guarded(scope, receive, send) -> None:
        if scope["type"] == "http":
            refused = refusal(Headers(scope=scope))
            if refused is not None:
                await fail(refused)(scope, receive, send)
                return
        await app(scope, receive, send)

    if log is None:
        return guarded

    async def logged(scope, receive, send) -> None:
        if scope["type"] != "http":
            await guarded(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = ["-"]

        async def sending(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await guarded(scope, receive, sending)
        finally:
            if not scope.get("ster.unlogged"):
                streamed = scope.get("ster.stream")
                if streamed is not None and not streamed["ended"]:   # the client left mid-stream
                    status[0] = 499
                    while streamed["worker"] is not None and streamed["worker"].is_alive():
                        await asyncio.sleep(0.05)   # its generation stops at the next token, and counts them
                tokens = scope.get("ster.tokens")
                client = (scope.get("client") or ("-",))[0]
                log(f"{client} {scope['method']} {_printable(scope['path'])} {status[0]}"
                    + (f" {tokens[0]}+{tokens[1]} tokens" if tokens else "")
                    + (f" ({tokens[2]} of {tokens[3]} drafted token{'' if tokens[3] == 1 else 's'} accepted)"
                       if tokens and len(tokens) == 4 else "")
                    + f" {time.perf_counter() - t0:.2f} s")

    return logged


def uvicorn_server(server: Server, app, *, max_connections: int | None = None, log_level: str = "warning"):
    """A ``uvicorn.Server`` running ``app`` (``build_app(server)``), hardened against slow and many clients,
    whose ``stopped_by`` is the signal that stopped it (None otherwise).

    - A connection must send a request's headers within ``HEADER_TIMEOUT`` s of opening or of its
      previous reply, or it is closed (uvicorn itself waits forever for a request's first byte and,
      after it, for the rest); headers are at most ``MAX_HEADER_BYTES``; an idle kept-alive connection
      closes after ``KEEP_ALIVE_TIMEOUT`` s; a body must arrive within ``BODY_TIMEOUT`` s (the app).
    - At most ``max_connections`` (default: ``server.max_queue + SPARE_CONNECTIONS``) are open: one
      more closes the connection that has waited longest for a request's headers or body, or, when
      none is waiting, is answered 503 and closed, so that slow clients can neither exhaust the
      process's file descriptors nor keep others out. (uvicorn's own ``limit_concurrency`` counts only
      connections that have sent their headers, and keeps the others forever.) The listen backlog, the
      most connections accepted in one turn of the event loop, is the cap too.
    - A signal (SIGINT, SIGTERM) sets ``server.closing``: replies end at their next token (a streamed
      one with an error event), waiting requests leave with a 503, and the server stops without
      cancelling a task. The signal is not raised again after (uvicorn's habit): the caller exits.

    Logging is the caller's (uvicorn's loggers, ``log_config`` None).
    """
    import uvicorn
    from uvicorn.protocols.http.h11_impl import H11Protocol

    cap = max_connections if max_connections is not None else server.max_queue + SPARE_CONNECTIONS
    body = json.dumps(error_body("the server has too many open connections; retry later", "server_error",
                                 code="too_many_connections")).encode()
    busy = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: %d\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n" % (RETRY_AFTER, len(body))) + body

    class Protocol(H11Protocol):
        """uvicorn's h11 protocol with a time limit on a request's headers and a cap on the connections."""

        _timer = None
        _waiting = False   # for a request's headers (at the start, or after a reply)
        _since = 0.0       # when the present wait (for headers, or for a body) began

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._since = self.loop.time()
            self._waiting = True
            if len(self.connections) > cap and not self._evict():
                self._waiting = False
                transport.write(busy)
                transport.close()
                return
            self._arm()

        def _slow(self) -> bool:
            """Waiting for a request's headers or for the rest of its body: where a slow client stays, and a
            working one only passes."""
            if self.transport.is_closing():
                return False
            cycle = self.cycle
            return self._waiting or (cycle is not None and getattr(cycle, "more_body", False)
                                     and not getattr(cycle, "response_started", True))

        def _evict(self) -> bool:
            """Close the other connection that has waited longest for a request's headers or body, if any."""
            idle = [c for c in self.connections if c is not self and isinstance(c, Protocol) and c._slow()]
            if not idle:
                return False
            oldest = min(idle, key=lambda c: c._since)
            oldest._waiting = False
            oldest.transport.close()
            return True

        def _arm(self) -> None:
            self._disarm()
            self._armed_for = self.cycle
            self._timer = self.loop.call_later(HEADER_TIMEOUT, self._too_slow)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _too_slow(self) -> None:
            self._timer = None
            if self.cycle is self._armed_for and not self.transport.is_closing():  # no new request began
                self._waiting = False
                self.transport.close()

        def handle_events(self) -> None:
            super().handle_events()
            if self._timer is not None and self.cycle is not self._armed_for:  # a request's headers came
                self._disarm()
                self._waiting = False
                self._since = self.loop.time()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self._since = self.loop.time()
                self._waiting = True
                self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            self._waiting = False
            super().connection_lost(exc)

    class Uvicorn(uvicorn.Server):
        stopped_by = None

        def handle_exit(self, sig, frame) -> None:
            if self.stopped_by is None:
                self.stopped_by = sig
            server.closing.set()
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets=None) -> None:
            await super().shutdown(sockets)
            getattr(self, "_captured_signals", []).clear()

    # Replies stop at their next token once closing is set; the grace covers a prefill under way.
    config = uvicorn.Config(app, http=Protocol, ws="none", lifespan="off", log_config=None, log_level=log_level,
                            access_log=False, timeout_keep_alive=KEEP_ALIVE_TIMEOUT,
                            h11_max_incomplete_event_size=MAX_HEADER_BYTES, timeout_graceful_shutdown=30,
                            backlog=cap)
    return Uvicorn(config)
