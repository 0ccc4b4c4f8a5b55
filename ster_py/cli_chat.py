"""``ster chat``: an interactive conversation in the terminal (``ster serve`` is in cli_serve.py).

Registered on ``ster_py.cli.app`` when cli.py imports this module (at its end). The library does the
work (``conversation.Session``); this command reads options and draws (the files it reads and writes:
``chat_files``).
"""
from __future__ import annotations

import json
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from .cli import (ADAPTER_HELP, BARE_ARGUMENT, CHAT_TEMPLATE_FILE_HELP, MODEL_HELP, PRECISION_HELP, PREFILL_AFTER,
                  QUANTIZE_HELP, QUIET_HELP, REPEAT_PENALTY_HELP, THINKING_HELP, THREADS_HELP, _STREAM, Precision,
                  Quantize, Thinking, _check_device, _model_or_default, _use_threads, _write, app, draft_text, err,
                  error_line, flag, load_for_run, no_color, note_greedy, plural, progress_bar, rate_texts,
                  read_template_file, refuse_bare_argument, thinking_value)
from .chat_files import MAX_MESSAGE_FILE_BYTES, load_conversation, read_message_file, save_conversation
from .errors import SterError, TemplateError, terminal_text
from .files import user_path


#: A line of only this opens a message of several lines; the next such line closes it.
BLOCK = '"""'

CHAT_COMMANDS = f"""commands:
  {BLOCK}                     alone on a line: the lines up to the next {BLOCK} line are one message
  /file FILE              send the text in FILE (less one final line break) as your message
  /system TEXT            set the system prompt (starts the conversation over)
  /reset                  forget the conversation (the system prompt stays)
  /save FILE              write the conversation as JSON messages
  /load FILE              go on from a conversation /save wrote (it replaces this one)
  /vector FILE [S]        steer from now on at strength S, default 1 (/vector off: stop steering)
  /help                   this list
  /quit                   leave (Ctrl-D too); Ctrl-C stops an answer and keeps the session"""


def _sampling(max_new_tokens, temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed):
    from .generate import Sampling

    s = Sampling(max_new_tokens, temperature, top_k, top_p, seed, min_p=min_p, repeat_penalty=repeat_penalty,
                 repeat_last_n=repeat_last_n)
    s.validate()
    return s


def _steer(loaded, path: Path, strength: float):
    """(hook, key) of a steering vector file at ``strength`` for ``loaded``."""
    from .steering import check_vector_for, read_vector, steering_hook

    vec = read_vector(path)
    check_vector_for(vec, loaded, path)
    return steering_hook(vec, strength), (str(Path(path).resolve()), float(strength))


@app.command(context_settings=BARE_ARGUMENT)   # `ster chat "a question"` gets advice, not "extra argument"
def chat(
    ctx: typer.Context,
    model: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    revision: Optional[str] = typer.Option(None, help="Hub branch, tag or commit (default main)."),
    system: Optional[str] = typer.Option(None, help="System prompt."),
    messages_file: Optional[str] = typer.Option(None, "--messages", help="Go on from a conversation /save wrote "
                                                "(a JSON list of {\"role\": ..., \"content\": ...} messages)."),
    max_new_tokens: int = typer.Option(512, help="Stop each answer after this many new tokens."),
    temperature: float = typer.Option(0.0, help="0 means greedy; higher values sample more freely."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling threshold (1 = off)."),
    top_k: int = typer.Option(0, help="Keep only the k most likely tokens (0 = off)."),
    min_p: float = typer.Option(0.0, help="Drop tokens less likely than this times the most likely one (0 = off)."),
    repeat_penalty: float = typer.Option(1.0, help=REPEAT_PENALTY_HELP),
    repeat_last_n: int = typer.Option(64, help="Tokens the repetition penalty looks back over (-1: all)."),
    seed: Optional[int] = typer.Option(None, help="Random seed for sampling."),
    thinking: Thinking = typer.Option(Thinking.auto, help=THINKING_HELP),
    show_thinking: bool = flag(True, "--show-thinking/--hide-thinking", help="Show the model's reasoning, dimmed."),
    vector: Optional[Path] = typer.Option(None, help="Steering vector JSON to start with (also /vector)."),
    strength: float = typer.Option(1.0, help="Steering strength of --vector."),
    adapter: Optional[str] = typer.Option(None, help=ADAPTER_HELP),
    chat_template_file: Optional[Path] = typer.Option(None, "--chat-template-file", metavar="FILE",
                                                      help=CHAT_TEMPLATE_FILE_HELP),
    precision: Precision = typer.Option(Precision.auto, help=PRECISION_HELP),
    quantize: Optional[Quantize] = typer.Option(None, "--quantize", help=QUANTIZE_HELP),
    kv_cache: str = typer.Option("f32", "--kv-cache", help="Key/value cache dtype: f32 or f16."),
    ctx_size: Optional[int] = typer.Option(None, "--ctx-size", help="Positions the conversation may fill "
                                           "(default: the model's)."),
    device: str = typer.Option("cpu", help="Only cpu is available."),
    threads: Optional[int] = typer.Option(None, "--threads", help=THREADS_HELP),
    draft: Optional[str] = typer.Option(None, "--draft", help="Speculative decoding with this drafter (a smaller "
                                        "model of the same vocabulary, or a Gemma 4 assistant); greedy only."),
    draft_max: Optional[int] = typer.Option(None, "--draft-max", help="With --draft: tokens proposed per round "
                                            "(1 to 64, default 8)."),
    quiet: bool = flag(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Talk with a model in the terminal: streamed answers, the history kept (only new tokens are
    prefilled each turn). Type /help for the commands."""
    from .conversation import NO_TEMPLATE, THINKING_AUTO, Session
    from .generate import kv_cache_dtype

    refuse_bare_argument(ctx, "chat reads your messages as you type them (or piped: echo \"What is the capital of "
                              "France?\" | ster chat); for one answer, ster generate -p \"What is the capital of "
                              "France?\"")
    _check_device(device)
    kv_cache_dtype(kv_cache)
    _use_threads(threads)
    sampling = _sampling(max_new_tokens, temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed)
    note_greedy(sampling, quiet)
    steer = None
    if vector is not None:
        from .steering import read_vector

        steer = read_vector(vector)  # a malformed vector is refused before any weight is read
    from .speculative import check_draft_options

    check_draft_options(draft, draft_max, sampling)  # before any weight is read
    messages = _first_messages(system, messages_file)  # a bad file too
    template = read_template_file(chat_template_file)
    from .chat import surely_lacks_chat_template

    if template is None and surely_lacks_chat_template(_model_or_default(model)):  # a base model, told before it loads
        raise SterError(NO_TEMPLATE)
    # as generate loads it: the vector and the adapter checked before any weight is fetched, the adapter applied
    loaded = load_for_run(model, revision, precision, quiet, quantize=quantize, vector=vector, steer=steer,
                          adapter=adapter, template=template)
    drafter = None
    if draft is not None:
        from .speculative import load_drafter

        drafter = load_drafter(draft, loaded, precision=precision.value)
    session = Session(loaded, kv_cache=kv_cache, ctx_size=ctx_size, draft=drafter, n_draft=draft_max)
    think = thinking_value(thinking)
    session.require_template()
    session.check_thinking(think, THINKING_AUTO)  # refuses a template without a switch
    if messages_file is not None:
        check_renders(session, messages, think, f"--messages {messages_file}")
    hook, key = _steer(loaded, vector, strength) if vector is not None else (None, None)
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:  # not on every platform
        pass
    styled = sys.stdout.isatty() and not no_color()
    if not quiet:
        err.print(f"[dim]chatting with {escape(terminal_text(loaded.resolved.model))}; /help for commands, Ctrl-D "
                  "to leave[/]",
                  highlight=False)
        if messages_file is not None:   # as /load says it
            sys.stderr.write(_loaded_note(len(messages) - (system is not None), messages_file))
            sys.stderr.flush()
    state = _State(messages, hook, key)
    try:
        _converse(session, loaded, state, sampling, think, styled, show_thinking, quiet)
    finally:
        # Piped, stdin's lines are not echoed: the prompt's line (or an answer cut by an error) would stay
        # open, and the shell's next prompt would follow the last answer on its line.
        if _STREAM["open"]:
            _write("\n")
    if state.errors and not sys.stdin.isatty():  # a script learns that some of its lines failed
        raise typer.Exit(1)


def _first_messages(system: Optional[str], messages_file: Optional[str]) -> list[dict]:
    """The conversation ``ster chat`` starts from: --messages FILE's, after --system's prompt when given.

    Raises:
        SterError: as ``load_conversation``; --system with a file that has its own system prompt, or holding bytes
            that are not UTF-8 (a lone surrogate, which the template and /save would fail on later).
    """
    from .chat import check_surrogates

    messages = [] if messages_file is None else \
        load_conversation(str(user_path(messages_file, "--messages")), "--messages")   # ~ as a shell expands it
    if system is not None:
        check_surrogates(system, "--system")
        if any(m["role"] == "system" for m in messages):
            raise SterError(f"--messages {messages_file} has its own system prompt; leave out --system (or change "
                            "that message in the file)")
        messages.insert(0, {"role": "system", "content": system})
    return messages


def _loaded_note(count: int, name: str) -> str:
    """What /load and --messages say of the ``count`` messages read from the file ``name``."""
    return f"(loaded {plural(count, 'message')} from {terminal_text(name)}; the next answer reads them all)\n"


def check_renders(session, messages: list[dict], think, what: str) -> None:
    """Refuse a loaded conversation the model's chat template cannot render, as the next turn renders it
    (``messages`` and a user message): once accepted, every turn would fail on it with the same error.

    Raises:
        SterError: "WHAT: this model's chat template cannot render that conversation, so it was not loaded: PROBLEM"
            (``TemplateError.problem``: the file is named, the model's path is not).
    """
    try:
        session.render(messages + [{"role": "user", "content": "x"}], thinking=think)
    except SterError as e:
        # a template's problem alone: its message names the model's path and advises the template's author
        problem = (e.problem + (f" (template line {e.line})" if e.line else "")
                   if isinstance(e, TemplateError) else str(e))
        raise SterError(f"{what}: this model's chat template cannot render that conversation, so it was not "
                        f"loaded: {problem}") from None


def _error(e: Exception, state: _State) -> None:
    """Print a failed line's error; the session goes on (``state.errors`` counts them for the exit status)."""
    error_line(str(e))
    state.errors += 1


def check_utf8(text: str, what: str) -> None:
    """Refuse an input line (or block) that is not UTF-8 text: ``_Input`` reads each byte that is not as a lone
    surrogate (U+DC80..U+DCFF), which the chat template, the tokenizer and /save's UTF-8 file would each fail on
    later (/save in a traceback that lost the session). ``what``: "message" or "command".

    Raises:
        SterError: naming the first such byte and where it is; nothing of the line is sent or run.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(text[e.start])
        found = f"the byte 0x{code - 0xDC00:02X}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        raise SterError(f"this {what} is not UTF-8 text ({found} at character {e.start}), so it was not "
                        f"{'run' if what == 'command' else 'sent'}; give UTF-8 text (a file in another encoding: "
                        "convert it, e.g. with iconv -t UTF-8)") from None


class _Input:
    """The user's lines, typed or piped. Prompts only for a person at a terminal: piped input gets none, so
    stdout carries the answers alone. A terminal echoes the user's Enter, which closes the prompt's line;
    with stdout piped the prompt goes to stderr, the terminal's."""

    def __init__(self, styled: bool):
        self.typed = sys.stdin.isatty()
        if hasattr(sys.stdin, "reconfigure"):  # bytes that do not decode reach check_utf8 (strict: a traceback)
            sys.stdin.reconfigure(errors="surrogateescape")
        bold, reset = ("\x1b[1m", "\x1b[0m") if styled else ("", "")
        self.prompt = f"{bold}> {reset}" if self.typed else ""
        self.more = "... " if self.typed else ""  # inside a block
        self.to_stdout = self.typed and sys.stdout.isatty()

    def note(self, text: str) -> None:
        """A command's reply: beside the answers at a terminal, on stderr when stdout is piped."""
        if self.to_stdout:
            _write(text)
        else:
            sys.stderr.write(text)
            sys.stderr.flush()

    def end_line(self) -> None:
        """Close the prompt's line after Ctrl-C or Ctrl-D (the terminal echoed no Enter)."""
        if self.to_stdout:
            _write("\n")
        elif self.typed:
            sys.stderr.write("\n")

    def line(self, prompt: str) -> Optional[str]:
        """The next line; None at the end of the input (Ctrl-D). KeyboardInterrupt passes on."""
        if prompt and not self.to_stdout:
            sys.stderr.write(prompt)
            sys.stderr.flush()
        try:
            return input(prompt if self.to_stdout else "")
        except EOFError:
            self.end_line()
            return None

    def block(self) -> Optional[str]:
        """The lines after a ``BLOCK`` line up to the next one, joined; None when the input ends first.

        Raises:
            SterError: the lines hold more than ``MAX_MESSAGE_FILE_BYTES`` (UTF-8), /file's bound; the rest up
                to the closing line is read and dropped, keeping nothing.
        """
        lines, size = [], 0
        while (line := self.line(self.more)) is not None:
            if line.strip() == BLOCK:
                if size > MAX_MESSAGE_FILE_BYTES:
                    raise SterError(f"this message is longer than {MAX_MESSAGE_FILE_BYTES:,} bytes "
                                    f"({MAX_MESSAGE_FILE_BYTES >> 20} MiB, as /file reads), so it was not sent; "
                                    "send a shorter one")
                return "\n".join(lines)
            if size <= MAX_MESSAGE_FILE_BYTES:
                size += len(line.encode("utf-8", "surrogateescape")) + 1
                lines.append(line)
                if size > MAX_MESSAGE_FILE_BYTES:
                    lines = []   # too long: dropped up to the closing line
        return None


@dataclass
class _State:
    """What commands change between turns: the conversation, and the steering hook and its key; and how many
    lines failed."""

    messages: list[dict]
    hook: object = None
    key: object = None
    errors: int = 0   # error lines printed: piped input that had some exits 1


def _command(line: str, state: _State, session, think, note) -> Optional[str]:
    """Run a /command (not /quit); returns the text of a message to send (``/file``), else None.

    Raises:
        SterError, OSError: the command failed; ``state`` is unchanged then.
    """
    word, _, rest = line.strip().partition(" ")
    rest = rest.strip()
    if word == "/help":
        note(CHAT_COMMANDS + "\n")
    elif word == "/reset":
        state.messages = [m for m in state.messages if m["role"] == "system"]
        note("(conversation cleared)\n")
    elif word == "/system":
        if not rest:
            raise SterError("/system needs the text of the system prompt")
        state.messages = [{"role": "system", "content": rest}]
        note("(system prompt set; conversation cleared)\n")
    elif word in ("/save", "/load", "/file"):
        if not rest:
            raise SterError(f"{word} needs a file name")
        path = user_path(rest, word)  # ~ as a shell expands it; a NUL byte or a name too long is one error
        if word == "/file":
            return read_message_file(str(path))
        if word == "/save":
            save_conversation(state.messages, path)
            note(f"(saved {plural(len(state.messages), 'message')} to {terminal_text(rest)})\n")
        else:
            messages = load_conversation(str(path), "/load")
            check_renders(session, messages, think, f"/load {rest}")
            state.messages = messages
            note(_loaded_note(len(messages), rest))
    elif word == "/vector":
        parts = rest.split()
        if parts == ["off"]:
            state.hook, state.key = None, None
            note("(steering off)\n")
        elif len(parts) in (1, 2):   # the strength defaults to 1, as --vector's does
            try:
                value = float(parts[1]) if len(parts) == 2 else 1.0
            except ValueError:
                raise SterError(f"/vector: the strength must be a number, got {parts[1]!r}") from None
            state.hook, state.key = _steer(session.loaded, user_path(parts[0], "/vector"), value)
            note(f"(steering with {terminal_text(parts[0])} at {value:g})\n")
        else:
            raise SterError("/vector needs FILE [STRENGTH] (or off)")
    else:
        raise SterError(f"unknown command {word}; /help lists them")
    return None


def context_full_advice(session, messages: list[dict]) -> str:
    """What a chat user can do when ``messages`` (the last one the user's new message) outgrow the context.

    The conversation never fits again (it only grows), so the way on is a shorter history: /reset, or a
    shorter message when the message alone is too long; a larger --ctx-size only in a new session.
    """
    from .generate import context_limit

    context = context_limit(session.loaded.spec, session.ctx_size)
    model = context_limit(session.loaded.spec)
    larger = (f"; next time, a larger --ctx-size (the model takes up to {int(model):,}) holds more"
              if context < model else "")
    if any(m["role"] != "system" for m in messages[:-1]):
        return (f"the conversation has outgrown the context of {int(context):,} positions, so this message was "
                f"not sent: /reset to start over (the system prompt stays){larger}")
    return (f"this message does not fit the context of {int(context):,} positions (with the system prompt, if "
            f"any), so it was not sent: send a shorter one{larger}")


def turn_summary(reply, drafting: bool = False) -> str:
    """The dim line after an answer: prompt tokens reused and prefilled, new tokens, why it stopped, speed, and
    (``drafting``: the session has a drafter) how many drafted tokens were accepted, as generate's summary says."""
    gen = reply.generation
    rates = rate_texts(gen) + ([draft_text(gen)] if drafting else [])
    why = 'interrupted' if reply.finish_reason == 'cancelled' else gen.stop_reason
    return (f"prompt {plural(len(reply.prompt_ids), 'token')} (reused {gen.reused:,}, prefilled {gen.prefilled:,}), "
            f"{plural(len(gen.ids), 'new token')} ({why})" + (f"; {', '.join(rates)}" if rates else ""))


def _converse(session, loaded, state: _State, sampling, think, styled, show_thinking, quiet) -> None:
    """The read-answer loop of ``ster chat`` (see ``chat``); returns on /quit, /exit or end of input."""
    inp = _Input(styled)
    while True:
        try:
            line = inp.line(inp.prompt)
            opened = line is not None and line.strip() == BLOCK
            text = inp.block() if opened else line
        except KeyboardInterrupt:  # at the prompt or inside a block (whose lines are dropped)
            inp.end_line()
            continue
        except SterError as e:   # a block too long
            _error(e, state)
            continue
        if text is None:
            if opened:
                _error(SterError(f"the input ended inside a message opened with {BLOCK}, so it was not sent; "
                                 f"close a message with a line of only {BLOCK}"), state)
            return
        command = not opened and text.startswith("/")  # a block's lines never are one
        try:
            check_utf8(text, "command" if command else "message")
        except SterError as e:
            _error(e, state)
            continue
        if command:
            if text.strip().partition(" ")[0] in ("/quit", "/exit"):
                return
            try:
                text = _command(text, state, session, think, inp.note)
            except (SterError, OSError) as e:
                _error(e, state)
                continue
        if text and text.strip():
            _turn(session, state, text, sampling, think, styled, show_thinking, quiet)


def _turn(session, state: _State, text: str, sampling, think, styled, show_thinking, quiet) -> None:
    """Send ``text`` as the user's message and stream the answer; a failed turn leaves no trace in the history."""
    from .errors import Cancelled, ContextFull

    dim, reset = ("\x1b[2m", "\x1b[0m") if styled else ("", "")
    messages = state.messages + [{"role": "user", "content": text}]
    interrupted = {"flag": False}

    def on_sigint(signum, frame):
        interrupted["flag"] = True

    in_thinking = {"on": False}

    def on_event(e) -> None:
        if e.kind == "thinking":
            if show_thinking:
                _write(dim + e.text + reset)
            in_thinking["on"] = True
            return
        if in_thinking["on"]:
            in_thinking["on"] = False
            if show_thinking:
                _write("\n")
        if e.kind == "text":
            _write(e.text)
        elif e.kind == "tool_call":
            _write(f"[tool call {e.call['name']} {json.dumps(e.call['arguments'], ensure_ascii=False)}]")
        else:
            _write(f"[{e.text}]")

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with progress_bar(enabled=not quiet, what=None, after=PREFILL_AFTER) as progress:  # a long prompt's prefill
            reply = session.reply(messages, sampling, thinking=think, layer_hook=state.hook, key=state.key,
                                  on_event=on_event, cancelled=lambda: interrupted["flag"], progress=progress)
    except SterError as e:
        if _STREAM["open"]:  # an answer cut short: the error and the next prompt start on their own lines
            _write("\n")
        _error(SterError(context_full_advice(session, messages)) if isinstance(e, ContextFull) else e, state)
        return
    finally:
        signal.signal(signal.SIGINT, previous)
    _write("\n")
    state.messages = messages + [{"role": "assistant", "content": reply.text}]
    if not quiet:
        err.print(f"[dim]{escape(turn_summary(reply, session.draft is not None))}[/]", highlight=False)
    interrupted["flag"] = False
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:  # Ctrl-C while the history is prefilled stops that, not the session
        with progress_bar(enabled=not quiet, what=None, after=PREFILL_AFTER) as progress:
            session.prepare(state.messages, layer_hook=state.hook, key=state.key, thinking=think,
                            cancelled=lambda: interrupted["flag"], progress=progress)
    except Cancelled:  # the cache keeps what it held: the next turn prefills the rest
        pass
    finally:
        signal.signal(signal.SIGINT, previous)
