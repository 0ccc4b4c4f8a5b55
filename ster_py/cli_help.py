"""How ``ster --help`` reads: value names like a CLI's, not Python type names.

typer labels every option with its Python annotation (``--model <str>``,
``--var <list[str]>``, ``--help <bool>``) and writes a required argument as a set
(``{ids}...``). The command and group classes here give each option a value name
(``--model MODEL``, ``--threads N``, ``--var NAME=VALUE``), leave switches
without one, write the usage line as CLIs do (``IDS...``, ``[MODEL]``), and list a
group's commands with their whole first paragraph (wrapped, never cut).

Help is typer's plain (click) layout rather than its rich panels: at 80 columns
the panels' seven columns leave the descriptions a third of the width and cut
long words ("tokenizer_config…", "--no-enable-thin…"); the plain layout wraps
descriptions under long option names and cuts nothing.
Presentation, and one check: an option or argument that takes a path (annotated ``Path``, or named FILE or
ADAPTER) refuses an empty value (``files.check_path_name``) before its command runs, since ``Path("")`` is the
current directory. Parsing is otherwise typer's, unchanged.
"""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import typer
from typer._click.core import Context
from typer._click.formatting import HelpFormatter
from typer.core import TyperCommand, TyperGroup

from .files import check_path_name

#: Value names by long option (or argument name), saying what the value is; an option not listed here
#: (and given no ``metavar=``) is named from its type: choices as ``a|b|c``, numbers as ``N`` / ``X``, a
#: path as ``FILE``, anything else as ``VALUE`` (never a type name such as TEXT, INTEGER or PATH).
METAVARS = {
    "--model": "MODEL", "model": "MODEL", "--revision": "REV", "--prompt": "PROMPT", "--prompts": "FILE",
    "--system": "PROMPT", "--max-new-tokens": "N", "--temperature": "T", "--top-p": "P", "--top-k": "K",
    "--seed": "N", "--threads": "N", "--vector": "FILE", "--strength": "X", "--adapter": "ADAPTER",
    "--output": "FILE", "--layers": "LAYERS", "--tolerance": "TOL", "--positive": "CAPTURE",
    "--negative": "CAPTURE", "--trait": "NAME", "--text": "STRING", "--file": "FILE", "ids": "IDS",
    "--template": "FILE", "--template-name": "NAME", "--messages": "FILE", "--tools": "FILE",
    "--bos-token": "TOKEN", "--eos-token": "TOKEN", "--var": "NAME=VALUE", "--now": "ISO-TIME", "--device": "DEVICE",
    "--kv-cache": "f32|f16", "--prompt-file": "FILE", "--stop": "STRING", "--draft": "MODEL",
    "--host": "ADDRESS", "--name": "NAME", "--model-hint": "NAME",
}

#: typer validates through pydantic and passes its error text on ("Value error, 'x' is not
#: one of ..."); the prefix names pydantic's error class, not anything the user typed.
_PYDANTIC_PREFIX = "Value error, "

#: The usage error class of the click copy typer carries (typer exports only its subclass BadParameter).
_UsageError = typer.BadParameter.__base__


def _value_name(param) -> str:
    """The value name shown after an option (empty for a switch)."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return ""
    long = [o for o in param.opts if o.startswith("--")]
    key = long[0] if long else param.name
    if key in METAVARS:
        return METAVARS[key]
    choices = getattr(getattr(param, "type", None), "choices", None)
    desc = getattr(param, "type_descriptor", None)
    if choices is None and desc is not None and getattr(desc, "is_choice", False):
        choices = desc.choices
    if choices:
        return "|".join(str(getattr(c, "value", c)) for c in choices)
    annotation = getattr(desc, "annotation", None)
    return {int: "N", float: "X", Path: "FILE"}.get(annotation, "VALUE")


def _given(param, args: list[str]) -> str | None:
    """The text given for option ``param`` in ``args`` (its last use: ``--opt VALUE`` or ``--opt=VALUE``)."""
    opts = set(getattr(param, "opts", ()) or ()) | set(getattr(param, "secondary_opts", ()) or ())
    found = None
    for i, a in enumerate(args):
        if a == "--":
            break
        if a in opts and i + 1 < len(args):
            found = args[i + 1]
        elif "=" in a and a.split("=", 1)[0] in opts:
            found = a.split("=", 1)[1]
    return None if found is None else found[:40]


def _refuse_empty(param) -> None:
    """Make ``param`` (one taking a path) refuse an empty value as ``check_path_name`` does, naming its option.

    Raises (when parsed):
        SterError: "--adapter is empty; ..." (``--adapter "$ADAPTER"`` with the variable unset).
    """
    process = param.process_value
    long = [o for o in param.opts if o.startswith("--")]
    name = long[0] if long else f"the {param.metavar} argument"

    def process_value(ctx, value):
        if isinstance(value, str) and not value:
            check_path_name(value, name)
        return process(ctx, value)

    param.process_value = process_value


#: A bracketed note click appends to an option's help: ``[default: no-parse-special]``, ``[required]``.
_NOTE = re.compile(r"\[(?:default|env var|required)[^\[\]]*\]")
#: Stand-ins for a note's spaces and hyphens while the text is wrapped (no wrapper breaks at them).
_KEEP = {" ": "\x00", "-": "\x01"}


class _Formatter(HelpFormatter):
    """click's help formatter, except that a bracketed note (``[default: no-parse-special]``) is never
    broken across lines: it moves whole to the next line when it does not fit."""

    def write_dl(self, rows, col_max: int = 30, col_spacing: int = 2) -> None:
        def keep(text: str) -> str:
            return _NOTE.sub(lambda m: m.group(0).translate(str.maketrans(_KEEP)), text)

        start = len(self.buffer)
        super().write_dl([(first, keep(second)) for first, second in rows], col_max, col_spacing)
        back = str.maketrans({v: k for k, v in _KEEP.items()})
        self.buffer[start:] = [piece.translate(back) for piece in self.buffer[start:]]


class _Context(Context):
    formatter_class = _Formatter


class _Tidy:
    """Mixed into typer's command and group classes (see the module docstring)."""

    context_class = _Context

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for p in params:
            if getattr(p, "_ster_tidy", False):
                continue
            p._ster_tidy = True
            if p.param_type_name == "argument":
                if p.metavar is None:
                    p.metavar = METAVARS.get(p.name, p.name.upper())
                # the name column already shows it; typer would add its Python type beside it
                p.display_type_rich = lambda ctx: None
            elif p.metavar is None:
                p.metavar = _value_name(p)
            desc = getattr(p, "type_descriptor", None)
            if getattr(desc, "annotation", None) is Path or p.metavar in ("FILE", "ADAPTER"):
                _refuse_empty(p)
        return params

    def parse_args(self, ctx, args):
        given = list(args)  # click's parser consumes ``args``
        try:
            return super().parse_args(ctx, args)
        except typer.BadParameter as e:
            if isinstance(e.message, str) and e.message.startswith(_PYDANTIC_PREFIX):
                e.message = e.message[len(_PYDANTIC_PREFIX):]
            if isinstance(e.message, str):
                for start, kind in (("Input should be a valid number", "a number"),
                                    ("Input should be a valid integer", "an integer")):
                    if e.message.startswith(start):  # pydantic's words for a value that does not parse
                        value = _given(e.param, given)
                        e.message = f"{value!r} is not {kind}" if value is not None else f"it is not {kind}"
            raise
        except _UsageError as e:
            # click's parser raises "Option '-m' requires an argument." without the context, and click prints
            # the Usage line only for an error that has one: give it this command's, as every other usage error has
            if e.ctx is None:
                e.ctx = ctx
            raise

    def collect_usage_pieces(self, ctx) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for p in self.get_params(ctx):
            if p.param_type_name != "argument":
                continue
            name = p.metavar + ("..." if p.nargs != 1 and not p.metavar.endswith("...") else "")
            pieces.append(name if p.required else f"[{name}]")
        sub = getattr(self, "subcommand_metavar", None)
        return pieces + ([sub] if sub else [])

    def format_commands(self, ctx, formatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, summary(cmd)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def summary(cmd) -> str:
    """A command's one-line summary: its short help, else the first paragraph of its help, whole."""
    text = cmd.short_help or cmd.help or ""
    return " ".join(inspect.cleandoc(text).split("\n\n")[0].split())


class SterCommand(_Tidy, TyperCommand):
    """A typer command whose help names values like a CLI (see the module docstring)."""


class SterGroup(_Tidy, TyperGroup):
    """A typer group whose help names values like a CLI (see the module docstring)."""


class SterTyper(typer.Typer):
    """``typer.Typer`` building :class:`SterGroup` and :class:`SterCommand`."""

    def __init__(self, **kwargs):
        kwargs.setdefault("cls", SterGroup)
        kwargs.setdefault("rich_markup_mode", None)
        super().__init__(**kwargs)

    def command(self, *args, **kwargs):
        kwargs.setdefault("cls", SterCommand)
        return super().command(*args, **kwargs)
