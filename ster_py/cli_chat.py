"""``ster chat``: an interactive conversation in the terminal (``ster serve`` is in cli_serve.py).

Registered on ``ster_py.cli.app`` when cli.py imports this module (at its end). The library does the
work (``conversation.Session``); this command reads options and draws.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from .cli import (MODEL_HELP, PRECISION_HELP, QUIET_HELP, REPEAT_PENALTY_HELP, THINKING_HELP, THREADS_HELP, _STREAM,
                  Precision, Thinking,
                  _check_device, _model_or_default, _use_threads, _write, app, err, flag, no_color, plural, progress_bar,
                  show_warnings, thinking_value)
from .errors import ContextFull, SterError


def save_conversation(messages: list[dict], path: Path) -> None:
    """Write ``messages`` (OpenAI-shaped dicts) as a JSON array at ``path``, atomically (chat's ``/save``).

    An earlier save of this conversation at ``path`` (a JSON array of messages that is a prefix of ``messages``)
    is replaced; any other existing file is kept, including a messages list of another conversation.

    Raises:
        SterError: ``path`` is a directory, or exists and is not a JSON array of messages (each an object with a
            string ``role``), or holds another conversation (its messages are not a prefix of ``messages``);
            "cannot write PATH: ..." when its directory cannot take the file. Nothing is written then.
    """
    from .artifacts import atomic_outputs
    from .files import read_regular

    if path.is_dir():
        raise SterError(f"/save {path}: that is a directory; give a file name (for example chat.json)")
    if os.path.lexists(path):
        try:
            doc = json.loads(read_regular(path, "conversation").decode("utf-8"))
        except (SterError, UnicodeDecodeError, ValueError, RecursionError):
            doc = None
        if not (isinstance(doc, list) and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in doc)):
            raise SterError(f"/save {path}: that file exists and is not a saved conversation; give another name or "
                            "move that file")
        if doc != messages[:len(doc)]:
            raise SterError(f"{path} holds another conversation ({plural(len(doc), 'message')}); /save to a new "
                            "name")
    with atomic_outputs(path) as (tmp,):
        tmp.write_text(json.dumps(messages, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


CHAT_COMMANDS = """commands:
  /system TEXT            set the system prompt (starts the conversation over)
  /reset                  forget the conversation (the system prompt stays)
  /save FILE              write the conversation as JSON messages
  /vector FILE STRENGTH   steer from now on (/vector off: stop steering)
  /help                   this list
  /quit                   leave (Ctrl-D too); Ctrl-C stops an answer and keeps the session"""


def _sampling(max_new_tokens, temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed):
    from .generate import Sampling

    s = Sampling(max_new_tokens, temperature, top_k, top_p, seed, min_p=min_p, repeat_penalty=repeat_penalty,
                 repeat_last_n=repeat_last_n)
    s.validate()
    return s


def _load(model, revision, precision, quiet):
    from .load import load_model

    with progress_bar(enabled=not quiet) as progress:
        loaded = load_model(_model_or_default(model), revision, precision=precision.value, progress=progress)
    show_warnings(loaded)
    return loaded


def _steer(loaded, path: Path, strength: float):
    """(hook, key) of a steering vector file at ``strength`` for ``loaded``."""
    from .steering import check_vector_for, read_vector, steering_hook

    vec = read_vector(path)
    check_vector_for(vec, loaded, path)
    return steering_hook(vec, strength), (str(Path(path).resolve()), float(strength))


@app.command()
def chat(
    model: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    revision: Optional[str] = typer.Option(None, help="Hub branch, tag or commit (default main)."),
    system: Optional[str] = typer.Option(None, help="System prompt."),
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
    precision: Precision = typer.Option(Precision.auto, help=PRECISION_HELP),
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
    from .conversation import NO_TEMPLATE, Session
    from .generate import kv_cache_dtype

    _check_device(device)
    kv_cache_dtype(kv_cache)
    _use_threads(threads)
    sampling = _sampling(max_new_tokens, temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed)
    if vector is not None:
        from .steering import read_vector

        read_vector(vector)  # a malformed vector is refused before any weight is read
    from .speculative import check_draft_options

    check_draft_options(draft, draft_max, sampling)  # before any weight is read
    from .chat import surely_lacks_chat_template

    if surely_lacks_chat_template(_model_or_default(model)):  # a base model, told before it loads
        raise SterError(NO_TEMPLATE)
    loaded = _load(model, revision, precision, quiet)
    drafter = None
    if draft is not None:
        from .speculative import load_drafter

        drafter = load_drafter(draft, loaded, precision=precision.value)
    session = Session(loaded, kv_cache=kv_cache, ctx_size=ctx_size, draft=drafter, n_draft=draft_max)
    think = thinking_value(thinking)
    if session.template is None:
        raise SterError(NO_TEMPLATE)
    if think is not None:
        session.render([{"role": "user", "content": "x"}], thinking=think)  # refuses a template without a switch
    hook, key = _steer(loaded, vector, strength) if vector is not None else (None, None)
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:  # not on every platform
        pass
    styled = sys.stdout.isatty() and not no_color()
    messages: list[dict] = [] if system is None else [{"role": "system", "content": system}]
    if not quiet:
        err.print(f"[dim]chatting with {escape(loaded.resolved.model)}; /help for commands, Ctrl-D to leave[/]",
                  highlight=False)
    try:
        _converse(session, loaded, messages, sampling, think, hook, key, styled, show_thinking, quiet)
    finally:
        # Piped, stdin's lines are not echoed: the prompt's line (or an answer cut by an error) would stay
        # open, and the shell's next prompt would follow the last answer on its line.
        if _STREAM["open"]:
            _write("\n")


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


def turn_summary(reply) -> str:
    """The dim line after an answer: prompt tokens reused and prefilled, new tokens, why it stopped, speed."""
    gen = reply.generation
    rate = gen.decode_tokens_per_second
    why = 'interrupted' if reply.finish_reason == 'cancelled' else gen.stop_reason
    return (f"prompt {plural(len(reply.prompt_ids), 'token')} (reused {gen.reused:,}, prefilled {gen.prefilled:,}), "
            f"{plural(len(gen.ids), 'new token')} ({why})" + (f", {rate:.1f} tok/s" if rate else ""))


def _converse(session, loaded, messages, sampling, think, hook, key, styled, show_thinking, quiet) -> None:
    """The read-answer loop of ``ster chat`` (see ``chat``); returns on /quit, /exit or end of input."""
    dim, bold, reset = ("\x1b[2m", "\x1b[1m", "\x1b[0m") if styled else ("", "", "")
    # Prompts only for a person at a terminal: piped input gets none, so stdout carries the answers alone.
    # A terminal echoes the user's Enter, which closes the prompt's line; with stdout piped the prompt goes
    # to stderr, the terminal's.
    typed = sys.stdin.isatty()
    prompt = (f"{bold}> {reset}" if styled else "> ") if typed else ""
    to_stdout = typed and sys.stdout.isatty()

    def note(text: str) -> None:
        """A command's reply: beside the answers at a terminal, on stderr when stdout is piped."""
        if to_stdout:
            _write(text)
        else:
            sys.stderr.write(text)
            sys.stderr.flush()

    while True:
        try:
            if prompt and not to_stdout:
                sys.stderr.write(prompt)
                sys.stderr.flush()
            line = input(prompt if to_stdout else "")
        except EOFError:
            if to_stdout:  # Ctrl-D on the prompt's line
                _write("\n")
            elif typed:
                sys.stderr.write("\n")
            return
        except KeyboardInterrupt:
            if to_stdout:
                _write("\n")
            elif typed:
                sys.stderr.write("\n")
            continue
        if not line.strip():
            continue
        if line.startswith("/"):
            word, _, rest = line.strip().partition(" ")
            rest = rest.strip()
            try:
                if word in ("/quit", "/exit"):
                    return
                if word == "/help":
                    note(CHAT_COMMANDS + "\n")
                elif word == "/reset":
                    messages = [m for m in messages if m["role"] == "system"]
                    note("(conversation cleared)\n")
                elif word == "/system":
                    if not rest:
                        raise SterError("/system needs the text of the system prompt")
                    messages = [{"role": "system", "content": rest}]
                    note("(system prompt set; conversation cleared)\n")
                elif word == "/save":
                    if not rest:
                        raise SterError("/save needs a file name")
                    save_conversation(messages, Path(rest))
                    note(f"(saved {len(messages)} messages to {rest})\n")
                elif word == "/vector":
                    parts = rest.split()
                    if parts == ["off"]:
                        hook, key = None, None
                        note("(steering off)\n")
                    elif len(parts) == 2:
                        try:
                            value = float(parts[1])
                        except ValueError:
                            raise SterError(f"/vector: the strength must be a number, got {parts[1]!r}") from None
                        hook, key = _steer(loaded, Path(parts[0]), value)
                        note(f"(steering with {parts[0]} at {value:g})\n")
                    else:
                        raise SterError("/vector needs FILE STRENGTH (or off)")
                else:
                    raise SterError(f"unknown command {word}; /help lists them")
            except (SterError, OSError) as e:
                err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
            continue
        messages.append({"role": "user", "content": line})
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
            reply = session.reply(messages, sampling, thinking=think, layer_hook=hook, key=key,
                                  on_event=on_event, cancelled=lambda: interrupted["flag"])
        except SterError as e:
            if isinstance(e, ContextFull):  # the history is in the prompt: "shorten it" is no help here
                e = SterError(context_full_advice(session, messages))
            messages.pop()
            if _STREAM["open"]:  # an answer cut short: the error and the next prompt start on their own lines
                _write("\n")
            err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
            continue
        finally:
            signal.signal(signal.SIGINT, previous)
        _write("\n")
        messages.append({"role": "assistant", "content": reply.text})
        if not quiet:
            err.print(f"[dim]{escape(turn_summary(reply))}[/]", highlight=False)
        session.prepare(messages, layer_hook=hook, key=key, thinking=think)
