"""CLI commands that write or measure what leaves ster: convert, perplexity, vector export, vector pca.

Registered on ``ster_py.cli.app`` when cli.py imports this module (at its end). Thin: parse, call
the library, render with rich.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from .cli import (MODEL_HELP, MODEL_OPT_HELP, QUIET_HELP, THREADS_HELP, Precision, _use_threads, app, err, flag,
                  one_model, out, plural, print_report, progress_bar, show_warnings, vector_app, version_fields, warn)

TYPE_HELP = ("File type: f32, f16, bf16 (tensor types as llama.cpp's converter writes them), q8_0, q4_0, q4_1, "
             "q5_0, q5_1, q6_k, q4_k_m, q5_k_m (llama.cpp's quantizer mixes: Q4_K_M keeps the output, and "
             "attn_v / ffn_down of some layers, at Q6_K), or q4_k, q5_k (every quantizable tensor in that type, "
             "as llama-quantize --pure).")


def _check_type(value: str) -> str:
    """``--type``'s callback: an unknown name is a usage error (exit 2) naming the choices and a close one."""
    from .gguf.recipe import FILE_TYPES, close_file_types

    if str(value).lower() in FILE_TYPES:
        return value
    near = close_file_types(value)
    hint = f"; did you mean {' or '.join(near)}?" if near else ""
    raise typer.BadParameter(f"{value!r} is not one of {', '.join(repr(n) for n in FILE_TYPES)}{hint}")


@app.command()
def convert(
    model: Optional[str] = typer.Argument(None, help=MODEL_HELP.replace(" Default: the smollm2-135m-instruct-q4_1 preset.",
                                                                       "")),
    model_opt: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_OPT_HELP),
    output: Path = typer.Option(..., "--output", "-o", help="The .gguf file to write (must not exist); written "
                                "to a temporary name beside it and renamed when complete."),
    type_: str = typer.Option("f16", "--type", "-t", metavar="TYPE", help=TYPE_HELP, callback=_check_type),
    revision: Optional[str] = typer.Option(None, help="Hub branch, tag or commit."),
    threads: Optional[int] = typer.Option(None, "--threads", help="Threads for the quantizers (default: $STER_THREADS, else every core)."),
    as_json: bool = flag(False, "--json", help="Print the report as one JSON document."),
    quiet: bool = flag(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Write a model as a GGUF file llama.cpp runs: its metadata keys, tokenizer and tensor names, quantized by
    ster's own quantizers with llama.cpp's type rules. A GGUF input is re-quantized."""
    from .convert import convert_model

    model = one_model(model, model_opt, default=False)   # converting the default preset would be a surprise
    _use_threads(threads)  # checked (1..1024) as every command checks it, before anything is read
    with progress_bar(enabled=not quiet, what="converting") as progress:
        report = convert_model(model, output, type_, revision=revision, threads=threads, progress=progress)
    if as_json:
        print(json.dumps(report, indent=2))  # it records ster_version itself
    elif not quiet:
        print_report(report, skip=CONVERSION_NOTES)
    warn_conversion(report)


#: The fields of ``convert_model``'s report that are warnings, not lines of its table.
CONVERSION_NOTES = ("differences", "tokenizer_notes", "notes")


def warn_conversion(report: dict) -> None:
    """The warnings of a ``convert_model`` report (``ster convert``, ``ster tune merge --output FILE.gguf``)."""
    warn(f"llama.cpp will run this GGUF differently from the checkpoint: {d}" for d in report["differences"])
    warn(report["tokenizer_notes"])
    warn(report["notes"])


@app.command()
def perplexity(
    model: Optional[str] = typer.Argument(None, help=MODEL_HELP),
    model_opt: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_OPT_HELP),
    file: Path = typer.Option(..., "--file", "-f", help="The text to score (UTF-8, at most 16 MiB; - reads stdin)."),
    ctx: int = typer.Option(512, "--ctx", help="Window length in tokens; the second half of each window is scored "
                            "(llama-perplexity's windows)."),
    reference: Optional[str] = typer.Option(None, "--reference", metavar="MODEL",
                                            help="A second model of the same vocabulary (for "
                                            "example the F16 file a quantization came from): adds KL divergence, "
                                            "Δp and top-1 agreement against it."),
    chunks: Optional[int] = typer.Option(None, "--chunks", help="Score at most this many windows."),
    revision: Optional[str] = typer.Option(None, help="Hub branch, tag or commit of MODEL; the --reference model is "
                                            "read at its own default revision."),
    precision: Precision = typer.Option(Precision.f32, help="Stored weight dtype; compute is f32."),
    threads: Optional[int] = typer.Option(None, "--threads", help=THREADS_HELP),
    as_json: bool = flag(False, "--json", help="Print one JSON document."),
    quiet: bool = flag(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Perplexity of a model on a text, over non-overlapping windows as llama.cpp's llama-perplexity computes it;
    with --reference, the KL divergence from the reference model's predictions too."""
    from .errors import SterError
    from .load import load_model
    from .perplexity import perplexity as run

    model = one_model(model, model_opt)
    if reference is not None and not reference.strip():  # "$UNSET": it read as no --reference at all
        raise SterError("--reference is empty; give the reference model (a path, a preset name or a Hub id), "
                        "or leave out --reference")
    _use_threads(threads)
    from .cli_text import MAX_TEXT_FILE_BYTES, read_input_file

    # read as tokenize --file reads its text: a missing file, a directory and a binary file each said
    # "--file X is not a readable file" or Python's codec message
    data = read_input_file(file, "text file", MAX_TEXT_FILE_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SterError(f"--file {file} is not UTF-8 text (invalid byte at offset {e.start}); convert it to UTF-8") \
            from None
    with progress_bar(enabled=not quiet, what="perplexity") as progress:
        loaded = load_model(model, revision, precision=precision.value, progress=progress)
        show_warnings(loaded)
        # --revision names a branch, tag or commit of MODEL: the reference (often another repository, or
        # a local file) is read at its own default revision, not at one that may not exist there
        ref = (load_model(reference, None, precision=precision.value, progress=progress)
               if reference is not None else None)
        result = run(loaded, text, ctx, reference=ref, max_chunks=chunks, progress=progress)
    result = {**version_fields(), "model": loaded.resolved.model, "model_revision": loaded.model_revision,
              "precision": loaded.precision, "reference": reference,
              "reference_revision": ref.model_revision if ref is not None else None, "file": str(file),
              "warnings": loaded.warnings + (ref.warnings if ref is not None else []), **result}
    if as_json:
        print(json.dumps(result, indent=2))
        return
    line = (f"PPL = {result['ppl']:.4f} +/- {result['ppl_uncertainty']:.4f} over {plural(result['tokens'], 'scored token')} "
            f"(the second halves of {plural(result['chunks'], 'window')} of {ctx})")
    out.print(line)
    if ref is not None:
        out.print(f"reference PPL = {result['reference_ppl']:.4f}, ratio {result['ppl_ratio']:.5f}")
        out.print(f"mean KLD = {result['kld_mean']:.6f} +/- {result['kld_uncertainty']:.6f} (median "
                  f"{result['kld_median']:.6f}, 99% {result['kld_99']:.6f}, max {result['kld_max']:.6f})")
        out.print(f"mean Δp = {100 * result['dp_mean']:.3f} +/- {100 * result['dp_uncertainty']:.3f} %, "
                  f"RMS Δp = {100 * result['dp_rms']:.3f} %, same top token {100 * result['same_top']:.2f} %")


@vector_app.command("pca")
def vector_pca(
    positive: Path = typer.Option(..., help="Capture of prompts showing the trait (from `ster capture`, --position "
                                  "last or mean)."),
    negative: Path = typer.Option(..., help="Capture of the contrasting prompts, in the same pair order."),
    output: Path = typer.Option(..., "--output", "-o", help="The steering vector JSON file to write."),
    trait: str = typer.Option("", help="A name for what the vector steers toward (recorded)."),
    layers: Optional[str] = typer.Option(None, help="Subset of the captured layers: N | a..b | a,b,c."),
    as_json: bool = flag(False, "--json", help="Print one JSON document."),
    quiet: bool = flag(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Build a steering vector by PCA of paired differences: per layer, the first principal axis of
    positive_j - negative_j, signed so that the positive prompts project positive."""
    from .cli_tools import build_vector, say_vector
    from .steering import pca

    vec = build_vector(pca, positive, negative, output, trait, layers, as_json)
    if not quiet and not as_json:
        say_vector(vec, output, f"steering vector (pca, {plural(vec.metadata['pairs'], 'pair')})")


@vector_app.command("export")
def vector_export(
    vector: Path = typer.Argument(..., help="Steering vector JSON (from `ster vector caa` or `ster vector pca`)."),
    output: Path = typer.Option(..., "--output", "-o", help="The control-vector .gguf file to write."),
    strength: float = typer.Option(1.0, help="Multiplies every direction (llama.cpp then applies the file at its own "
                                   "scale: --control-vector FILE is scale 1)."),
    model_hint: Optional[str] = typer.Option(None, help="controlvector.model_hint (default: the model's GGUF "
                                             "architecture, from the vector's metadata)."),
    as_json: bool = flag(False, "--json", help="Print the report as one JSON document."),
    quiet: bool = flag(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Write a steering vector as llama.cpp's control-vector GGUF (direction.N tensors; layer N is the output of
    decoder layer N, as in ster; llama.cpp never steers layer 0, so it is left out)."""
    from .capture import format_layers
    from .steering import check_control_vector_output, export_control_vector, read_vector

    check_control_vector_output(output)  # before reading the vector
    vec = read_vector(vector)
    report = export_control_vector(vec, output, strength=strength, model_hint=model_hint)
    if report["skipped"]:
        warn(["layer 0 of the vector is left out: llama.cpp's control vectors cannot steer it"])
    if as_json:
        print(json.dumps({**version_fields(), **report}, indent=2))
    elif not quiet:
        err.print(f"[dim]control vector: layers {format_layers(report['layers'])} at strength {strength:g}; wrote "
                  f"{escape(str(output))}[/]")
