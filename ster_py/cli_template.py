"""CLI command ``ster template render``: print the prompt a model would see.

Registered on ``ster_py.cli.app`` when cli.py imports this module (at its end).
Thin like the rest of the CLI: read the files, call ``ster_py.chat``, write the text.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from .cli_help import SterTyper

from .cli import QUIET_HELP, app, err, flag, progress_bar, version_fields
from .errors import SterError

template_app = SterTyper(help="Chat templates: see the exact prompt a conversation becomes.", no_args_is_help=True)
app.add_typer(template_app, name="template")

# Names --var may not set: they have their own options (or are the conversation itself).
_RESERVED = {"messages": "--messages", "tools": "--tools", "add_generation_prompt": "--no-generation-prompt",
             "enable_thinking": "--enable-thinking/--no-enable-thinking", "bos_token": "--bos-token",
             "eos_token": "--eos-token", "now": "--now", "source": None, "template": "--template",
             "time_limit": None, "max_chars": None}


#: --template, --messages and --tools files are refused above this size (real ones are KBs).
MAX_INPUT_FILE_BYTES = 8 << 20


def _read_input_text(path, what: str) -> str:
    """The UTF-8 text of a --template/--messages/--tools file ("-" is stdin): a regular file
    of at most ``MAX_INPUT_FILE_BYTES`` (no FIFO or device, which would block or never end)."""
    from .cli_text import read_input_file

    data = read_input_file(path, f"{what} file", MAX_INPUT_FILE_BYTES)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SterError(f"the {what} file {'stdin' if str(path) == '-' else path} is not UTF-8 text (invalid byte "
                        f"at offset {exc.start}); convert it to UTF-8") from None


def _read_json(path: str, what: str):
    """The JSON document in ``path`` ("-" is stdin)."""
    text = _read_input_text(path, what)
    path = "stdin" if str(path) == "-" else path   # named as the other messages name it
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SterError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); "
                        f"the {what} file must hold one JSON document") from None
    except ValueError as exc:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise SterError(f"{path} is not valid JSON ({exc}); the {what} file must hold one JSON document") from None
    except RecursionError:  # the parser recurses once per level of nesting
        raise SterError(f"{path}: the {what} JSON is nested too deeply to read (thousands of levels)") from None


def read_messages(path: str, *, empty_ok: bool = False) -> list[dict]:
    """The conversation in a --messages file ("-" is stdin), as ``chat.check_messages`` accepts it.

    Args:
        empty_ok: accept ``[]`` (``ster chat``'s /save writes it for a conversation not begun).

    Raises:
        SterError: as ``_read_json`` (unreadable, too large, not UTF-8, not JSON) and ``check_messages``
            (not a list of messages; the first bad message named).
    """
    from .chat import check_messages

    doc = _read_json(path, "messages")
    if empty_ok and doc == []:
        return doc
    return check_messages(doc, where="stdin" if path == "-" else path)


def _variables(pairs: List[str]) -> dict:
    """``NAME=VALUE`` pairs: VALUE read as JSON when it is JSON (true, 3, "x", {...}), else as text."""
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise SterError(f"--var {pair!r}: expected NAME=VALUE, e.g. --var reasoning_effort=high")
        if name in _RESERVED:
            option = _RESERVED[name]
            raise SterError(f"--var cannot set {name!r}" + (f"; use {option}" if option else ""))
        try:
            out[name] = json.loads(value)
        except json.JSONDecodeError:
            out[name] = value
        except ValueError as exc:  # an integer of more digits than Python converts
            raise SterError(f"--var {name}: the JSON value is not readable ({exc})") from None
        except RecursionError:  # the parser recurses once per level of nesting
            raise SterError(f"--var {name}: the JSON value is nested too deeply to read (thousands of "
                            "levels)") from None
    return out


def _emit(text: str) -> None:
    """Write ``text`` to stdout as UTF-8 bytes, exactly (no newline added, no locale re-encoding).

    Raises:
        SterError: ``text`` holds a lone surrogate (say from --bos-token bytes that are not
            UTF-8), which has no UTF-8 form; nothing is written then.
    """
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SterError(f"the output holds the lone surrogate U+{ord(text[exc.start]):04X} at character "
                        f"{exc.start}, which UTF-8 cannot encode; check the option values and JSON \\u escapes "
                        "(a surrogate must come in a high-low pair)") from None
    try:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None


@template_app.command("render")
def render(
    model: Optional[str] = typer.Option(None, "--model", "-m", help="A .gguf file, a model directory "
                                        "(tokenizer.json + tokenizer_config.json / chat_template.jinja), a "
                                        "directory holding one .gguf, a preset name or a Hub id. Supplies the "
                                        "template and the BOS/EOS texts. No local weight is read."),
    revision: Optional[str] = typer.Option(None, help="Hub branch, tag or commit (Hub ids only)."),
    template: Optional[Path] = typer.Option(None, "--template", "-t", help="A Jinja chat template file; "
                                            "replaces the model's template (the model still gives BOS/EOS)."),
    template_name: Optional[str] = typer.Option(None, "--template-name", help="A named template of the model "
                                                "(e.g. tool_use). Default: tool_use when --tools is given and "
                                                "the model has one, else its default template."),
    messages: str = typer.Option(..., "--messages", help="JSON file (or - for stdin): a list of "
                                 '{"role": ..., "content": ...} messages (tool_calls, reasoning_content... '
                                 "pass through)."),
    tools: Optional[str] = typer.Option(None, "--tools", help="JSON file: a list of tool schemas "
                                        '({"type": "function", "function": {"name": ..., "parameters": ...}}).'),
    enable_thinking: Optional[bool] = flag(None, "--enable-thinking/--no-enable-thinking",
                                                   help="Set the template's enable_thinking variable "
                                                   "(left undefined when neither is given)."),
    generation_prompt: bool = flag(True, "--generation-prompt/--no-generation-prompt",
                                           help="End with the header of an assistant turn (add_generation_prompt)."),
    bos_token: Optional[str] = typer.Option(None, "--bos-token", help="BOS text for the template "
                                            "(default: the model's; empty with --template alone)."),
    eos_token: Optional[str] = typer.Option(None, "--eos-token", help="EOS text for the template "
                                            "(default: the model's; empty with --template alone)."),
    var: List[str] = typer.Option([], "--var", help="Another template variable, NAME=VALUE (VALUE as JSON "
                                  "when it parses, else text), e.g. --var reasoning_effort=high. Repeatable."),
    now: Optional[str] = typer.Option(None, "--now", help="Pin the date strftime_now reads (ISO-8601, e.g. "
                                      "2026-10-18T09:30:00). Default: $STER_CHAT_NOW, else the local time."),
    as_json: bool = flag(False, "--json", help='Print {"text": ..., "template": ..., "bos_token": ..., '
                                 '"eos_token": ...} instead of the bare text.'),
    quiet: bool = flag(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Print the prompt text a conversation becomes under a chat template, exactly.

    The text is written as the template produced it, with no newline added at the
    end (so `| xxd` shows the real last byte); use --json to see it quoted.
    Either --model or --template is required; with --template alone the BOS/EOS
    variables are undefined (render as empty text) unless --bos-token/--eos-token
    give them.
    """
    from .chat import check_tools, load_model_template, render_chat

    if model is None and template is None:
        raise SterError("give --model (its chat template and BOS/EOS texts) or --template FILE, or both")
    if template_name is not None and (model is None or template is not None):
        raise SterError("--template-name picks one of the model's templates: use it with --model and without "
                        "--template")
    extra = _variables(var)
    conversation = read_messages(messages)
    tool_list = check_tools(_read_json(tools, "tools"), where=tools) if tools is not None else None

    bos = eos = None
    special: dict = {}
    if model is not None:
        with progress_bar(enabled=not quiet, what="reading the model's template") as progress:
            owner = load_model_template(model, revision, progress=progress)
        bos, eos, special = owner.bos_token, owner.eos_token, dict(owner.special_tokens)
    if template is not None:
        text = _read_input_text(template, "template")
        source = str(template)
    else:
        text, source = owner.pick(template_name, tool_list)
    bos = bos_token if bos_token is not None else bos
    eos = eos_token if eos_token is not None else eos
    if enable_thinking is not None:
        extra["enable_thinking"] = enable_thinking

    if not quiet:  # what the template leaves out, said rather than dropped in silence
        from .reply import template_variables

        read = template_variables(text)
        given = (["tools"] if tool_list is not None else []) + list(extra)  # extra holds enable_thinking too
        for name in [name for name in given if name not in read]:
            err.print(f"note: the template never reads {name}; the value given does not reach the text",
                      style="dim", highlight=False, markup=False)
    prompt = render_chat(text, conversation, add_generation_prompt=generation_prompt, bos_token=bos,
                         eos_token=eos, tools=tool_list, now=now, source=source, **{**special, **extra})
    if as_json:
        doc = {**version_fields(), "text": prompt, "template": source, "bos_token": bos, "eos_token": eos}
        _emit(json.dumps(doc, ensure_ascii=False, indent=2) + "\n")
    else:
        _emit(prompt)
