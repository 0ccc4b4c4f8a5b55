"""CLI commands beside generate: parity, capture, vector caa, tune merge.

Registered on ``ster_py.cli.app`` when cli.py imports this module (at its end).
Thin like the rest of the CLI: parse, call the library, render with rich.
"""
from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from .capture import LAYER_HELP
from .cli import (BARE_ARGUMENT, MODEL_HELP, QUANTIZE_HELP, QUIET_HELP, THREADS_HELP, ChatTemplate, Precision, Quantize,
                  _check_device, _model_or_default, _use_threads, app, err, flag, out, print_report, progress_bar,
                  refuse_bare_argument, show_warnings, tune_app, vector_app, version_fields, warn)
from .errors import SterError, terminal_text



class Reference(str, Enum):
    transformers = "transformers"
    llamacpp = "llama.cpp"


class Position(str, Enum):
    last = "last"
    mean = "mean"
    all = "all"


PROMPTS_HELP = "A file of prompts: one per line, or one JSON string / {\"prompt\": ...} per line for .jsonl."


@app.command(context_settings=BARE_ARGUMENT)   # `ster parity "a prompt"` gets advice, not "extra argument"
def parity(
    ctx: typer.Context,
    model: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    prompt: Optional[str] = typer.Option(None, "--prompt", "-p", help="One prompt (default: two built-in ones)."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help=PROMPTS_HELP),
    revision: Optional[str] = typer.Option(None, help="Hub branch, tag or commit (Hub ids only)."),
    precision: Precision = typer.Option(Precision.f32, help="Our stored weight dtype; the reference runs in f32."),
    quantize: Optional[Quantize] = typer.Option(None, "--quantize", help=QUANTIZE_HELP + " The report is then the "
                                           "quantized model's logit error against the float32 reference."),
    reference: Reference = typer.Option(Reference.transformers, help="transformers (same directory, or the same "
                                        "GGUF via gguf_file=) or llama.cpp (llama-cpp-python on the GGUF)."),
    tolerance: Optional[float] = typer.Option(
        None, help="Largest relative logit error ||ours - ref|| / ||ref|| that passes; also the threshold for the "
        "first divergent layer. Default: 1e-4 against transformers, 0.1 against llama.cpp (which rounds "
        "activations to 8 bits inside its quantized products); with --quantize, q8_0 0.1, q4_0 0.8, q4_k 0.3 "
        "(about three times the error llama.cpp's own files of that type show); with a --precision that rounds "
        "the stored weights (a float32 checkpoint as f16 or bf16), f16 4e-3, bf16 2e-2."),
    threads: Optional[int] = typer.Option(None, "--threads", help=THREADS_HELP),
    as_json: bool = flag(False, "--json", help="Print one JSON document."),
    quiet: bool = flag(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Compare our forward pass with a reference implementation on the same token ids.

    Exits with status 1 when any prompt's relative logit error is above --tolerance.
    """
    from .capture import read_prompts
    from .load import load_model
    from .parity import DEFAULT_PROMPTS, run_parity

    refuse_bare_argument(ctx, "parity takes a prompt with --prompt (-p) or a file of them with --prompts, and the "
                              "model with --model (-m), e.g. ster parity -p \"The capital of France is\"")
    _use_threads(threads)
    texts = (list(DEFAULT_PROMPTS) if prompt is None and prompts is None
             else read_prompts(prompt, prompts, templated=False))   # parity runs raw text: no --chat-template
    with progress_bar(enabled=not quiet) as progress:
        loaded = load_model(_model_or_default(model), revision, precision=precision.value, progress=progress,
                            quantize=quantize.value if quantize is not None else None)
        show_warnings(loaded)
        report = run_parity(loaded, texts, reference=reference.value, tolerance=tolerance, progress=progress)
    tolerance = report.tolerance   # the reference's default when none was given
    if as_json:
        print(json.dumps({**version_fields(), **report.to_json()}, ensure_ascii=False, indent=2))
    else:
        out.print(parity_table(report, tolerance))
        for p in report.prompts:
            if p.layers and p.first_divergent_layer is not None:
                for line in layer_error_lines(p):
                    out.print(f"[dim]{escape(line)}[/]", soft_wrap=True)
    if not report.passed:
        worst = max(report.prompts, key=lambda p: p.rel_error)
        lines = parity_failed_lines(worst.rel_error, tolerance, worst.first_divergent_layer)
        head = lines[0][len("parity failed:"):]
        err.print(f"[bold red]parity failed:[/]{escape(head)}", highlight=False)
        for line in lines[1:]:
            err.print(escape(line), highlight=False)
        raise typer.Exit(1)


def parity_failed_lines(rel_error: float, tolerance: float, layer: Optional[int],
                        width: Optional[int] = None) -> list[str]:
    """The closing "parity failed: ..." message of ``ster parity`` as lines of at most ``width`` columns
    (default: the error console's; 80 when piped): one line when it fits, else broken after the ``;``
    with the first divergent layer on an indented second line."""
    width = width or err.width
    first = f"parity failed: relative logit error {rel_error:.3e} > tolerance {tolerance:g}"
    if layer is None:
        return [first]
    where = f"first divergent layer {layer}"
    return [f"{first}; {where}"] if len(first) + 2 + len(where) <= width else [first + ";", "  " + where]


def layer_error_lines(p, width: Optional[int] = None) -> list[str]:
    """The per-layer relative errors of one prompt as lines of at most ``width`` columns (default: the
    console's; 80 when piped), broken between "layer: error" pairs, never inside one; the lines after
    the first are indented by two spaces. A pair longer than the width stands alone on its line."""
    width = width or out.width
    short = p.prompt.replace("\n", "\\n")
    short = short if len(short) <= 30 else short[:27] + "..."
    pairs = [f"{e.layer}: {e.rel_error:.1e}" for e in p.layers]
    lines, line = [], f"per-layer relative error ({short}):"
    for k, pair in enumerate(pairs):
        piece = pair + ("," if k < len(pairs) - 1 else "")
        if len(line) + 1 + len(piece) > width and line.strip():
            lines.append(line)
            line = "  " + piece
        else:
            line += " " + piece
    return lines + [line]


def parity_table(report, tolerance: float, width: Optional[int] = None) -> str:
    """The per-prompt table of ``ster parity`` as rich markup: the numbers never cut, one-word
    column names (``rel-err``, ``max-abs``, ``mean-cos``) one space apart, the prompt last (newlines
    shown as ``\\n``), every cut one ending with ``...``, to what ``width`` (default: the console's;
    80 when piped) leaves, one line each, no trailing spaces.

    Columns: tokens; rel-err (||ours - ref|| / ||ref|| of the logits); max-abs; mean-cos;
    top-1 (agreement of the greedy token); diverges (the first layer whose hidden-state error
    passes the tolerance, ``no`` when none does, ``-`` without per-layer data); result.
    """
    names = ("tokens", "rel-err", "max-abs", "mean-cos", "top-1", "diverges", "result")
    rows = []
    for p in report.prompts:
        first = "-" if p.layers is None else ("no" if p.first_divergent_layer is None
                                              else f"layer {p.first_divergent_layer}")
        rows.append((f"{len(p.ids):,}", f"{p.rel_error:.2e}", f"{p.max_abs_error:.2e}", f"{p.mean_cosine:.6f}",
                     f"{p.top1_agreement:.0%}", first, "pass" if p.passed else "FAIL"))
    widths = [max([len(name)] + [len(r[i]) for r in rows]) for i, name in enumerate(names)]
    quoted = [p.prompt.replace("\n", "\\n") for p in report.prompts]
    # the prompt gets what the console width leaves (at least 12)
    room = min(max((width or out.width) - sum(widths) - len(widths), 12), max(map(len, quoted), default=0))

    def line(cells: tuple, prompt: str, result: str) -> str:
        parts = [c.rjust(w) for c, w in zip(cells[:-1], widths)] + [result + " " * (widths[-1] - len(cells[-1]))]
        return (" ".join(parts) + " " + prompt).rstrip()

    ours = report.precision + (f", --quantize {report.quantize}" if report.quantize else "")
    lines = [escape(f"ster vs {report.reference} ({ours}, tolerance {tolerance:g})"),
             "[bold]" + line(names, "prompt", "result") + "[/]"]
    for p, row, text in zip(report.prompts, rows, quoted):
        result = f"[green]{row[-1]}[/]" if p.passed else f"[red]{row[-1]}[/]"
        text = text if len(text) <= room else text[:room - 3] + "..."
        lines.append(line(row, escape(text), result))
    return "\n".join(lines)


@app.command()
def capture(
    output: Path = typer.Option(..., "--output", "-o", help="The .safetensors file to write; its JSON sidecar "
                                "(same name, .json) is written beside it. An earlier capture there is "
                                "replaced; any other file is refused."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    prompt: Optional[str] = typer.Option(None, "--prompt", "-p", help="One prompt."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help=PROMPTS_HELP),
    layers: str = typer.Option("all", help="all | N | a..b (inclusive) | a,b,c. " + LAYER_HELP),
    position: Position = typer.Option(Position.last, help="last: the last prompt token; mean: the mean over all "
                                      "prompt tokens; all: every token."),
    chat_template: ChatTemplate = typer.Option(ChatTemplate.auto, help="auto: wrap each prompt in the model's "
                                               "chat template when it has one; off: raw text."),
    system: Optional[str] = typer.Option(None, help="System prompt (needs a chat template)."),
    vector: Optional[Path] = typer.Option(None, help="Steering vector JSON (from `ster vector caa`) added while "
                                          "the prompts run, as `ster generate --vector` adds it: the states are "
                                          "the steered model's (recorded in the sidecar as steering)."),
    strength: Optional[float] = typer.Option(None, help="Multiplier for --vector (default 1.0)."),
    revision: Optional[str] = typer.Option(None, help="Hub branch, tag or commit (Hub ids only)."),
    precision: Precision = typer.Option(Precision.f32, help="Stored weight dtype; compute is f32."),
    device: str = typer.Option("cpu", help="Only cpu is available."),
    threads: Optional[int] = typer.Option(None, "--threads", help=THREADS_HELP),
    as_json: bool = flag(False, "--json", help="Print one JSON document."),
    quiet: bool = flag(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Capture the residual stream after chosen layers for each prompt (safetensors + JSON sidecar); with
    --vector, of the steered model."""
    from .capture import (capture as run, capture_tensors, check_capture_output, format_layers, parse_layers,
                          read_prompts, save_capture)
    from .load import load_model

    _check_device(device)
    _use_threads(threads)
    texts = read_prompts(prompt, prompts)
    check_capture_output(output)   # before the model runs
    if strength is not None and vector is None:
        raise SterError("--strength needs --vector (a steering vector file)")
    steer = None
    if vector is not None:   # a malformed vector, or one made for another model, costs no weight read
        from .steering import check_vector_fit, read_vector

        steer = read_vector(vector)
    with progress_bar(enabled=not quiet) as progress:
        loaded = load_model(_model_or_default(model), revision, precision=precision.value, progress=progress,
                            check=None if steer is None else lambda r, spec: check_vector_fit(steer, r, spec, vector))
        show_warnings(loaded)
        chosen = parse_layers(layers, loaded.spec.num_hidden_layers)
        cap = run(loaded, texts, chosen, position.value, chat_template=chat_template.value, system=system,
                  vector=steer, strength=1.0 if strength is None else strength,
                  vector_path=None if vector is None else str(vector), progress=progress)
    written = save_capture(cap, output)
    if as_json:   # the files written and what the sidecar says of them (its prompts counted, not repeated)
        meta = cap.meta
        print(json.dumps({**version_fields(), "output": str(written[0]), "sidecar": str(written[1]),
                          **{k: meta[k] for k in ("model", "model_revision", "precision", "hidden_size", "layers",
                                                  "position", "chat_template", "steering")},
                          "prompt_count": len(meta["prompts"]),
                          "tensors": {name: list(a.shape) for name, a in capture_tensors(cap).items()},
                          "warnings": loaded.warnings}, ensure_ascii=False, indent=2))
        return
    if quiet:
        return
    steered = "" if steer is None else f", steered at strength {cap.meta['steering']['strength']:g}"
    err.print(f"[dim]{len(texts)} prompt(s), layers {format_layers(chosen)}, position "
              f"{position.value}, chat template {cap.meta['chat_template']}{steered}: wrote "
              f"{escape(', '.join(map(str, written)))}[/]")


def say_vector(vec, output: Path, what: str = "steering vector") -> None:
    """The one line on stderr after ``vector caa`` / ``pca`` wrote ``vec`` to ``output``. The model name comes from
    the captures' sidecars: terminal escapes in it (or in the path) are shown, not obeyed."""
    from .capture import format_layers

    err.print(f"[dim]{what} for {escape(terminal_text(str(vec.model)))}: layers "
              f"{format_layers(vec.directions)}; wrote {escape(terminal_text(str(output)))}[/]")


def build_vector(build, positive: Path, negative: Path, output: Path, trait: str, layers: Optional[str],
                 as_json: bool):
    """``vector caa`` and ``vector pca``: the vector ``build`` (``steering.caa`` or ``pca``) makes of two capture
    files at ``layers`` (text, None: every shared layer), written to ``output`` (checked before the captures are
    read); ``as_json``: its document printed, the file written and what it holds but the directions (``layers``
    names the ones it covers). Returns the vector."""
    from .capture import load_capture, parse_layers
    from .steering import check_vector_output, write_vector

    check_vector_output(output)  # before reading the captures
    pos, neg = load_capture(positive), load_capture(negative)
    chosen = None if layers is None else parse_layers(layers, int(pos.meta["num_hidden_layers"]))
    vec = build(pos, neg, trait=trait, layers=chosen, sources=(str(positive), str(negative)))
    write_vector(vec, output)
    if as_json:
        print(json.dumps({**version_fields(), "output": str(output), "model": vec.model,
                          "model_revision": vec.model_revision, "hidden_size": vec.hidden_size, "method": vec.method,
                          "trait": vec.trait, "layers": sorted(vec.directions), "metadata": vec.metadata},
                         ensure_ascii=False, indent=2))
    return vec


@vector_app.command("caa")
def vector_caa(
    positive: Path = typer.Option(..., help="Capture of prompts showing the trait (from `ster capture`)."),
    negative: Path = typer.Option(..., help="Capture of contrasting prompts, same model, layers and position."),
    output: Path = typer.Option(..., "--output", "-o", help="The steering vector JSON file to write."),
    trait: str = typer.Option("", help="A name for what the vector steers toward (recorded)."),
    layers: Optional[str] = typer.Option(None, help="Subset of the captured layers: N | a..b | a,b,c "
                                         "(default: every layer both captures hold)."),
    as_json: bool = flag(False, "--json", help="Print one JSON document."),
    quiet: bool = flag(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Build a steering vector from two captures (contrastive activation addition).

    Per layer, the direction is the normalized difference between the mean positive and the
    mean negative activation.
    """
    from .steering import caa

    vec = build_vector(caa, positive, negative, output, trait, layers, as_json)
    if not quiet and not as_json:
        say_vector(vec, output)


@tune_app.command("merge")
def tune_merge(
    adapter: str = typer.Option(..., "--adapter", "-a", help="Ster's NAME.lora.json (or .lora.safetensors) or a "
                                "PEFT adapter directory (adapter_config.json + adapter_model.safetensors)."),
    output: Path = typer.Option(..., "--output", "-o", metavar="DIR|FILE.gguf", help="New directory for the merged "
                                "checkpoint, or a new "
                                "FILE.gguf: the merged model written as GGUF (as `ster convert` writes it)."),
    model: str = typer.Option(..., "--model", "-m", help="The base model: a safetensors checkpoint directory or "
                              "Hub id (a GGUF base is refused, so there is no default)."),
    revision: Optional[str] = typer.Option(None, help="Hub branch, tag or commit (Hub ids only)."),
    type_: str = typer.Option("f16", "--type", "-t", metavar="TYPE",
                              help="GGUF file type when --output ends in .gguf (see `ster "
                              "convert --help`)."),
    as_json: bool = flag(False, "--json", help="Print the report as one JSON document."),
    quiet: bool = flag(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Fold a LoRA adapter into the weights: W + (alpha / rank) * B @ A, written as a new checkpoint (or GGUF)."""
    from .tune.merge import merge_adapter, merge_adapter_to_gguf

    with progress_bar(enabled=not quiet) as progress:
        if output.suffix.lower() == ".gguf":   # as convert reads the name: x.GGUF is a GGUF file, not a directory
            report = merge_adapter_to_gguf(model, adapter, output, type_name=type_, revision=revision,
                                           progress=progress)
        else:
            report = merge_adapter(model, adapter, output, revision=revision, progress=progress)
    gguf = report.get("gguf")
    if as_json:
        print(json.dumps(report, indent=2))  # it records ster_version itself
    elif not quiet:  # a GGUF's conversion in the same table, as `ster convert` prints it (it was a dict's repr)
        from .cli_export import CONVERSION_NOTES

        shown = {k: v for k, v in report.items() if k not in ("gguf", "warnings")}
        print_report({**shown, **{k: v for k, v in (gguf or {}).items() if k not in shown}}, skip=CONVERSION_NOTES)
    warn(report["warnings"])
    if gguf is not None:
        from .cli_export import warn_conversion

        warn_conversion(gguf)
