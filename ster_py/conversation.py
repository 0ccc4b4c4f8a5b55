"""One model answering conversations: render the messages, generate with a prompt cache, parse the reply.

Shared by ``ster chat`` (one conversation, turn after turn) and ``ster serve`` (one request at a time).
A ``Session`` holds the loaded model, its reply format (``reply.detect_format`` on the chat template and
the vocabulary) and one ``PromptCache``: consecutive prompts that share a prefix (a conversation's
history, a server's shared system prompt) prefill only what follows it, and the reply equals a cold
run's (``prefix`` says where that holds bit for bit).

``Session.reply(messages, sampling, ...)`` renders the messages with the template (tools and the
thinking switch passed to it), runs ``generate.generate``, cuts the text at the first stop string
(not part of the output, as llama.cpp and OpenAI do), and parses it into text, thinking and tool-call
events as they stream. The result is a ``Reply``.
"""
from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from typing import Callable, Iterable

from .decoder.model import check_callbacks, check_layer_hook
from .errors import SterError
from .generate import Generation, Sampling, generate
from .prefix import PromptCache
from .reply import Event, ReplyFormat, ReplyParser, blocks_of, detect_format

#: Longest stop string, in characters (a guard on requests).
MAX_STOP_CHARS = 256
#: Most stop strings per request (OpenAI allows 4; llama.cpp more).
MAX_STOPS = 16


def check_stops(stops: Iterable[str], where: str = "--stop") -> tuple[str, ...]:
    """Stop strings as given (one text alone counts as one stop string, not as its characters),
    refused when empty, too long or too many.

    Raises:
        SterError: an empty string, one over ``MAX_STOP_CHARS`` characters, or more than ``MAX_STOPS``.
    """
    try:
        out = (stops,) if isinstance(stops, str) else tuple(stops)
    except TypeError:   # a library caller's stops=5
        raise SterError(f"{where}: stop strings are texts (one, or a list of them), got {stops!r}") from None
    if len(out) > MAX_STOPS:
        raise SterError(f"{where}: at most {MAX_STOPS} stop strings, got {len(out)}")
    for s in out:
        if not isinstance(s, str) or not s:
            raise SterError(f"{where}: a stop string must be a non-empty text")
        if len(s) > MAX_STOP_CHARS:
            raise SterError(f"{where}: a stop string is {len(s)} characters, more than {MAX_STOP_CHARS}")
    return out


class StopStrings:
    """Cuts a streamed text at the first of ``stops``: ``feed(piece)`` returns the text that is
    safe to show (text that may begin a stop string is held back) and whether a stop string
    ended the text; ``flush()`` returns what was held back at the end."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.held = ""
        self.stopped = False

    def feed(self, piece: str) -> tuple[str, bool]:
        if not self.stops:
            return piece, False
        text = self.held + piece
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.held, self.stopped = "", True
            return text[:cut], True
        keep = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), keep, -1):
                if text.endswith(s[:n]):
                    keep = n
                    break
        self.held = text[len(text) - keep:]
        return text[:len(text) - keep], False

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


@dataclass
class Reply:
    """What one turn produced.

    Attributes:
        prompt_text, prompt_ids: the rendered prompt and its ids.
        generation: ``generate``'s result (ids, stop reason, timings, reused/prefilled counts).
        events: the parsed reply in order (``reply.Event``: text, thinking, tool_call, error).
        finish_reason: OpenAI's word: "stop" (an end token or stop string), "length" (the token
            limit or the context), "tool_calls" (the reply called a tool), "cancelled" (the caller
            stopped it).
        reasoning_tokens: new tokens generated inside a reasoning block.
        logprobs: with ``sampling.logprobs``, the entries (``Generation.logprobs``) of the new tokens whose
            text is in the reply's content: not the end token, nor tokens cut off at a stop string, nor
            reasoning (its markers included) or tool-call tokens. Each entry also has ``offset``: where the
            token's piece (``Tokenizer.token_bytes``) begins in the decoded reply, in characters (a token
            inside a multi-byte character: that character's; a space the decoder drops at the reply's
            start is not counted).
    """

    prompt_text: str
    prompt_ids: list[int]
    generation: Generation
    events: list[Event] = field(default_factory=list)
    finish_reason: str = "stop"
    reasoning_tokens: int = 0
    logprobs: list[dict] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if e.kind == "text")

    @property
    def thinking(self) -> str:
        return "".join(e.text for e in self.events if e.kind == "thinking")

    @property
    def tool_calls(self) -> list[dict]:
        return [e.call for e in self.events if e.kind == "tool_call"]

    @property
    def blocks(self) -> list[dict]:
        return blocks_of(self.events)


# Said wherever a conversation meets a model without a chat template (a base model).
NO_TEMPLATE = ("the model has no chat template, so it cannot hold a conversation; use "
               "`ster generate --prompt TEXT`, which continues a raw text on a model without a template, or give "
               "a template with --chat-template-file FILE")


#: The CLI's advice where a chat template has no thinking switch (``--thinking`` on or off given).
THINKING_AUTO = "use --thinking auto (the default)"


class Session:
    """A loaded model ready for conversations (see the module docstring).

    Args:
        loaded: a ``load.LoadedModel``.
        kv_cache: "f32" or "f16" (``generate.kv_cache_dtype``).
        ctx_size: positions a prompt and its reply may fill (default: the model's).
        draft, n_draft: a ``speculative.Drafter`` and its proposals per round (``generate.generate``).

    Raises:
        SterError: ``loaded`` not a loaded model; an unknown ``kv_cache``; a ``ctx_size`` that is not a whole
            number from 1 to the model's context; a ``draft`` that is not a drafter (``speculative.load_drafter``).
    """

    def __init__(self, loaded, *, kv_cache: str = "f32", ctx_size: int | None = None, draft=None,
                 n_draft: int | None = None):
        from .generate import context_limit, kv_cache_dtype

        if not all(hasattr(loaded, name) for name in ("decoder", "tokenizer", "spec")):
            raise SterError(f"Session takes a loaded model (load_model(...)), got {type(loaded).__name__}")
        if draft is not None and not callable(getattr(draft, "propose", None)):   # else an AttributeError mid-reply
            raise SterError(f"Session's draft takes a drafter (speculative.load_drafter(model, loaded)), got "
                            f"{type(draft).__name__}")
        self.loaded = loaded
        self.draft, self.n_draft = draft, n_draft  # a speculative.Drafter (greedy replies only)
        self.kv_cache = kv_cache
        self.ctx_size = ctx_size
        context_limit(loaded.spec, ctx_size)  # a ctx_size above the model's is refused now
        self.cache = PromptCache(loaded.decoder, kv_cache_dtype(kv_cache))
        tok = loaded.tokenizer
        #: why the model's chat template cannot be read (a template file not UTF-8, a malformed chat_template in
        #: tokenizer_config.json), None when it can: raw text still runs; what needs the template raises it
        self.template_error: str | None = None
        try:
            self.template = tok.chat_template
        except SterError as e:
            self.template, self.template_error = None, str(e)
        vocab = tok.tk.get_vocab(with_added_tokens=True) if self.template else None
        self.format = detect_format(self.template, vocab)
        self.stop_ids = loaded.stop_ids()

    # ------------------------------------------------------------------ prompts

    def render(self, messages: list[dict], *, tools: list[dict] | None = None, thinking: bool | None = None,
               add_generation_prompt: bool = True) -> str:
        """The prompt text of ``messages`` through the model's chat template.

        Args:
            tools: JSON tool schemas for the template (refused when it never reads ``tools``).
            thinking: the template's thinking switch (None: the template's default).
            add_generation_prompt: end with the opening of the assistant's turn (False: the conversation as
                it stands, as ``prepare`` renders it).

        Raises:
            SterError: the model has no chat template; ``thinking`` given but the template cannot
                switch it; a template error.
        """
        self.require_template()
        self.check_tools(tools)
        extra = {}
        if thinking is not None:
            extra[self.check_thinking(thinking)] = thinking
        return self.loaded.tokenizer.render_chat(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                                 **extra)

    def require_template(self) -> None:
        """Raise SterError unless the model has a usable chat template: ``NO_TEMPLATE`` for a base model,
        ``template_error`` for a template that cannot be read."""
        if self.template_error is not None:
            raise SterError(self.template_error)
        if self.template is None:
            raise SterError(NO_TEMPLATE)

    def check_thinking(self, thinking: bool | None, advice: str = "leave thinking unset") -> str | None:
        """The name of the chat template's thinking switch (``enable_thinking`` or ``thinking``) that
        ``thinking`` sets; None for ``thinking`` None (the template's default).

        Args:
            advice: what the error tells the caller to do instead (the CLI: ``--thinking auto``).

        Raises:
            SterError: ``thinking`` given but the template has no such switch; ``thinking`` not a bool (a
                template reads the text "off" as true).
        """
        if thinking is None:
            return None
        if not isinstance(thinking, bool):
            raise SterError(f"thinking must be True, False or None (the template's default), got {thinking!r}")
        switch = self.format.thinking_switch
        if switch is None:
            raise SterError("this model's chat template has no thinking switch (neither enable_thinking nor "
                            f"thinking); {advice}")
        return switch

    def check_tools(self, tools: list[dict] | None) -> list[dict] | None:
        """``tools``, refused when there are some and the chat template never reads its ``tools``
        variable (they would not reach the model, and no call could be asked for).

        Raises:
            SterError: tools given to such a template; ``tools`` that are not a list of tool schemas
                (``chat.check_tools``, as the server and ``--tools`` check them).
        """
        if tools is not None:
            from .chat import check_tools

            check_tools(tools, "tools")   # a caller's "x" or [5] reached the template (its tojson of each character)
        if tools and not self.format.takes_tools:
            raise SterError("this model's chat template never reads tools, so they would not reach the model; "
                            "send no tools, or use a model whose chat template takes them")
        return tools

    @staticmethod
    def checked(messages: list[dict]) -> list[dict]:
        """``messages`` (OpenAI-shaped) as ``reply`` and ``prepare`` give them to the template, as ``ster serve``
        does: checked (``chat.check_messages``), text parts joined, an assistant's null content beside
        ``tool_calls`` made "" (``server_request.template_messages``).

        Raises:
            SterError: not a non-empty list of role/content objects; a content part other than text; null
                content elsewhere.
        """
        from .chat import check_messages
        from .server_request import template_messages

        return template_messages(check_messages(messages, "messages"))

    def encode(self, text: str) -> list[int]:
        """Ids of a rendered prompt (the template writes any BOS itself)."""
        return self.loaded.tokenizer.encode(text, add_special_tokens=False)

    def prompt(self, messages: list[dict], *, tools: list[dict] | None = None, thinking: bool | None = None,
               raw: str | None = None) -> tuple[str, list[int]]:
        """(text, ids) of the prompt ``reply`` would decode: ``messages`` through the template, or ``raw`` with
        the tokenizer's own BOS rule. It holds no state: a server builds it before a request's turn.
        ``tools`` and ``thinking`` as ``render``'s.

        Raises:
            ContextFull: the prompt is longer than the context (``prompt.refuse_if_too_long`` before
                tokenizing it whole, ``generate.check_prompt_fits`` after); SterError: as ``render``, and
                messages ``chat.check_messages`` refuses (not a non-empty list of role/content objects).
        """
        from .generate import check_prompt_fits, context_limit
        from .prompt import refuse_if_too_long

        context = context_limit(self.loaded.spec, self.ctx_size)
        if raw is None:
            messages = self.checked(messages)   # a library caller's [] or None: an error, not a reply to nothing
            text = self.render(messages, tools=tools, thinking=thinking)
            refuse_if_too_long(self.loaded.tokenizer, text, context, add_special_tokens=False)
            ids = self.encode(text)
        else:
            refuse_if_too_long(self.loaded.tokenizer, raw, context, add_special_tokens=True)
            text, ids = raw, self.loaded.tokenizer.encode(raw, add_special_tokens=True)
        check_prompt_fits(len(ids), self.loaded.spec, self.ctx_size)
        return text, ids

    def prepare(self, messages: list[dict], *, layer_hook=None, key=None, thinking: bool | None = None,
                cancelled: Callable[[], bool] | None = None, progress=None) -> int:
        """Prefill a conversation's history ahead of its next turn (``PromptCache.extend``): the
        messages as rendered without a generation prompt. Returns the tokens computed; 0 when
        the template cannot render a conversation ending there. ``thinking``, ``cancelled`` and ``progress`` as
        ``reply``'s; ``layer_hook`` and ``key`` too: the next reply reuses the prefilled positions only under
        an equal ``key`` (a hook without one is computed afresh each call).

        Raises:
            SterError: ``messages`` that ``chat.check_messages`` refuses (not a non-empty list of role/content
                objects).
            Cancelled: ``cancelled()`` returned True between the decoder's layers (``PromptCache.extend``:
                the cache keeps what it held before).
        """
        messages = self.checked(messages)   # a caller's "hi" or None: an error, not 0 tokens prefilled
        try:
            text = self.render(messages, thinking=thinking, add_generation_prompt=False)
        except SterError:
            return 0
        return self.cache.extend(self.encode(text), layer_hook=layer_hook, key=key, cancelled=cancelled,
                                 progress=progress)

    # ------------------------------------------------------------------ a turn

    def reply(self, messages: list[dict], sampling: Sampling, *, tools: list[dict] | None = None,
              thinking: bool | None = None, stops: tuple[str, ...] = (), layer_hook=None, key=None,
              on_event: Callable[[Event], None] | None = None,
              cancelled: Callable[[], bool] | None = None, raw: str | None = None,
              on_logprobs: Callable[[dict], None] | None = None,
              prompt: tuple[str, list[int]] | None = None, progress=None) -> Reply:
        """Answer ``messages`` (OpenAI-shaped dicts).

        Args:
            sampling: decoding settings.
            tools: JSON tool schemas passed to the template; tool calls are parsed only with tools.
            thinking: the template's thinking switch (None: the template's default).
            stops: stop strings (checked by ``check_stops``; one text alone is one stop string); the
                text ends before the first one.
            layer_hook, key: a steering hook and what it is (``PromptCache``: positions computed
                under another key are not reused).
            on_event: called with each parsed event as the reply streams.
            cancelled: polled between the decoder's layers during the prompt's prefill and after each
                token; True stops the reply (finish_reason "cancelled").
            on_logprobs: with ``sampling.logprobs``, called with the logprobs entry
                (``generate.generate``'s, with ``offset``) of each new token whose text is in the reply's
                content, before that text's events are passed on (``Reply.logprobs``).
            raw: a text to continue instead (no template, the tokenizer's own BOS rule, the reply
                read as plain text); ``messages`` is then unused.
            prompt: ``self.prompt(messages, tools=..., thinking=..., raw=...)`` of these arguments, when the
                caller built it already (it is not built again).
            progress: optional ``progress(f"prefill {n}", done, total)`` after each layer of the prompt's
                prefill, n the tokens computed (``PromptCache.prefill``).

        Raises:
            SterError: as ``render`` and ``generate.generate`` (a prompt longer than the context...);
                stop strings ``check_stops`` refuses; a callback that is not callable, ``raw`` not a str,
                ``prompt`` not the (text, ids) pair ``prompt`` returns; a steering vector's ``layer_hook`` naming
                a layer past the model's last (``check_layer_hook``).
        """
        from .tokenizer import StreamDecoder

        check_callbacks("Session.reply", layer_hook=layer_hook, on_event=on_event, cancelled=cancelled,
                        on_logprobs=on_logprobs, progress=progress)   # else a TypeError mid-reply
        check_layer_hook("Session.reply", layer_hook, self.loaded.spec)   # a steering vector's layer past the model
        if raw is not None and not isinstance(raw, str):
            raise SterError(f"Session.reply's raw must be the text to continue (a str) or None, got "
                            f"{type(raw).__name__}")
        if prompt is not None and not (isinstance(prompt, tuple) and len(prompt) == 2 and isinstance(prompt[0], str)):
            raise SterError(f"Session.reply's prompt must be the (text, ids) pair Session.prompt returns, got "
                            f"{type(prompt).__name__}")
        text, ids = prompt if prompt is not None else self.prompt(messages, tools=tools, thinking=thinking, raw=raw)
        if raw is None:
            parser = ReplyParser(self.format, thinking=self.format.starts_thinking(text), tools=bool(tools))
        else:
            parser = ReplyParser(ReplyFormat(), tools=False)
        stream = StreamDecoder(self.loaded.tokenizer)
        cut = StopStrings(check_stops(stops, "stops"))
        events: list[Event] = []
        state = {"reasoning": 0, "cancelled": False, "fed": 0, "shown": 0, "chars": 0, "strip": None, "head": ""}
        entries: list[dict] = []   # the new tokens' logprobs entries
        starts: list[int] = []     # where each new token's text begins in the decoded reply
        counts: list[int] = []     # the characters the pieces before each new token make (see Reply.logprobs)
        passed: list[bool] = []    # for each token whose text passed the stop strings: is it content?
        shown: list[dict] = []     # the entries of the content tokens among those
        pieces = codecs.getincrementaldecoder("utf-8")("replace")
        tok = self.loaded.tokenizer

        def settle(decoded: str) -> None:
            """Once the reply's text begins: does its decoder drop the space its first piece begins with?"""
            if state["strip"] is None and decoded:
                state["strip"] = int(state["head"].startswith(" ") and not decoded.startswith(" "))

        def show(piece: str, content: bool) -> None:
            """Count ``piece`` as shown, then pass on the entries of the content tokens whose text it reaches."""
            state["shown"] += len(piece)
            while len(passed) < min(len(starts), len(entries)) and starts[len(passed)] < state["shown"]:
                passed.append(content)
                if content:
                    k = len(passed) - 1
                    shown.append({**entries[k], "offset": max(0, counts[k] - (state["strip"] or 0))})
                    if on_logprobs is not None:
                        on_logprobs(shown[-1])

        def emit(evs: list[Event]) -> None:
            for e in evs:
                if events and events[-1].kind == e.kind and e.kind in ("text", "thinking"):
                    events[-1] = Event(e.kind, events[-1].text + e.text)
                else:
                    events.append(Event(e.kind, e.text, e.call))
                if on_event is not None:
                    on_event(e)

        def on_token(token: int) -> bool:
            decoded = stream.feed(token)
            starts.append(state["fed"])
            state["fed"] += len(decoded)
            if entries:  # logprobs asked for: the pieces' character counts
                counts.append(state["chars"])
                text = pieces.decode(tok.token_bytes(token))
                state["chars"] += len(text)
                if state["strip"] is None:
                    state["head"] += text
                settle(decoded)
            piece, stopped = cut.feed(decoded)
            was_text = parser.in_text
            evs = parser.feed(piece) if piece else []
            show(piece, was_text and parser.in_content)
            emit(evs)
            if parser.in_thinking:
                state["reasoning"] += 1
            if stopped:
                return True
            if cancelled is not None and cancelled():
                state["cancelled"] = True
                return True
            return False

        gen = generate(self.loaded.decoder, ids, sampling, self.stop_ids, on_token=on_token, on_logprobs=entries.append,
                       layer_hook=layer_hook, kv_cache=self.kv_cache, cache=self.cache, cache_key=key,
                       ctx_size=self.ctx_size, draft=self.draft, n_draft=self.n_draft, cancelled=cancelled,
                       progress=progress)
        if gen.stop_reason == "cancelled":  # during the prefill
            state["cancelled"] = True
        if not cut.stopped:
            flushed = stream.flush()
            settle(flushed)
            tail, _ = cut.feed(flushed)
            tail += cut.flush()
            was_text = parser.in_text
            evs = parser.feed(tail)
            show(tail, was_text and parser.in_content)
            emit(evs)
        emit(parser.finish())
        out = Reply(text, ids, gen, events, reasoning_tokens=state["reasoning"], logprobs=shown)
        if state["cancelled"]:
            out.finish_reason = "cancelled"
        elif any(e.kind == "tool_call" for e in events):
            out.finish_reason = "tool_calls"
        elif gen.stop_reason in ("length", "context"):
            out.finish_reason = "length"
        return out
