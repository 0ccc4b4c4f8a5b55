"""The ``ster`` command line on tiny checkpoints: streaming, --json, and refusals.

Refusals must exit non-zero with one ``error:`` line and no traceback, and load
nothing: the tests make weight reading fail loudly if it is attempted.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from ster_py.errors import SterError
from ster_py.load import load_model
from tiny import make_checkpoint, reference_greedy


def ster(*args, env=None):
    return subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    model = make_checkpoint(path, "llama")
    return path, model


def test_generate_json_matches_transformers(tiny_llama):
    path, model = tiny_llama
    r = ster("generate", "--model", str(path), "--prompt", "w5 w6 w7 w8", "--max-new-tokens", "8", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["prompt_ids"] == [5, 6, 7, 8] and doc["chat_template"] == "absent"
    expected = reference_greedy(model, [5, 6, 7, 8], 8)
    stop = expected.index(2) + 1 if 2 in expected else 8  # id 2 is </s>, the EOS
    assert doc["ids"] == expected[:stop]
    assert doc["usage"] == {"prompt_tokens": 4, "new_tokens": len(doc["ids"])}
    assert doc["model_revision"] is None and doc["precision"] == "auto" and doc["quantize"] is None


def test_generate_streams_text_and_summary(tiny_llama):
    path, _ = tiny_llama
    r = ster("generate", "--model", str(path), "--prompt", "w5 w6", "--max-new-tokens", "5")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and all(w.startswith("w") for w in r.stdout.split())
    assert "prompt tokens" in r.stderr and "decode" in r.stderr
    assert "no chat template" in r.stderr


def test_summary_leaves_out_phases_that_did_not_run(tiny_llama):
    path, _ = tiny_llama
    r = ster("generate", "--model", str(path), "--prompt", "w5 w6", "--max-new-tokens", "0")
    assert r.returncode == 0, r.stderr
    assert "0 new tokens" in r.stderr and "tok/s" not in r.stderr


def test_sampling_is_reproducible_with_a_seed(tiny_llama):
    path, _ = tiny_llama
    args = ["generate", "--model", str(path), "--prompt", "w9", "--max-new-tokens", "12", "--temperature", "1.5",
            "--top-k", "50", "--top-p", "0.95", "--seed", "7", "--json"]
    a, b = json.loads(ster(*args).stdout), json.loads(ster(*args).stdout)
    assert a["ids"] == b["ids"]


@pytest.mark.parametrize("args, words", [
    (["--device", "cuda"], ["--device cuda", "CPU"]),
    (["--device", "metal"], ["--device metal"]),
    (["--top-p", "0"], ["--top-p"]),
    (["--temperature", "-1"], ["--temperature"]),
    (["--system", "be brief"], ["--system", "chat template"]),
    (["--threads", "0"], ["--threads"]),
    (["--threads", "2147483648"], ["--threads", "1 to 1024"]),
    (["--threads", "99999999999999999999999"], ["--threads"]),
])
def test_bad_flags_are_refused_cleanly(tiny_llama, args, words):
    path, _ = tiny_llama
    r = ster("generate", "--model", str(path), "--prompt", "w5", *args)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and r.stderr.startswith("error:")
    for w in words:
        assert w in r.stderr


def test_refused_architecture_loads_nothing(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "plamo2"}))
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"not read")
    r = ster("generate", "--model", str(tmp_path), "--prompt", "hi")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "'plamo2'" in r.stderr and "gemma3_text" in r.stderr


def test_every_known_family_runs_and_an_unknown_one_names_them(tmp_path):
    from ster_py.families import FAMILIES, KNOWN_MODEL_TYPES

    assert [m for m in KNOWN_MODEL_TYPES if m not in FAMILIES] == []  # the whole gate runs (issue 16)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "plamo2"}))
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"not read")
    r = ster("inspect", str(tmp_path))
    assert r.returncode == 1 and "'plamo2'" in r.stderr and "llama, mistral, mixtral, qwen2" in r.stderr


def test_missing_tensor_is_named(tmp_path):
    from safetensors.numpy import load_file, save_file

    make_checkpoint(tmp_path, "llama")
    tensors = load_file(str(tmp_path / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(SterError, match="model.layers.1.mlp.up_proj.weight"):
        load_model(str(tmp_path))


def test_shape_mismatch_names_both_shapes(tmp_path):
    from safetensors.numpy import load_file, save_file

    make_checkpoint(tmp_path, "qwen3")
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors["model.layers.0.self_attn.k_proj.weight"] = np.zeros((8, 64), np.float32)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(SterError, match=r"k_proj.weight.*\[8, 64\].*\[32, 64\]"):
        load_model(str(tmp_path))


def test_quantization_config_is_refused_before_weights(tmp_path):
    make_checkpoint(tmp_path, "llama")
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").write_bytes(b"corrupt: proves nothing reads it")
    with pytest.raises(SterError, match="quantization_config.*gptq"):
        load_model(str(tmp_path))


def test_inspect_json(tiny_llama):
    path, model = tiny_llama
    r = ster("inspect", str(path), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["family"] == "llama" and info["dimensions"]["num_hidden_layers"] == 3
    assert info["parameters"] == sum(p.numel() for p in model.state_dict().values())


def test_inspect_describes_a_checkpoint_without_its_tokenizer(tiny_llama, tmp_path):
    """`ster inspect DIR` of a checkpoint without tokenizer.json failed with "error: tokenizer is missing", though
    inspect reads headers: it describes the rest now, its tokenizer null (- in the table) and a warning saying it
    is missing and that ster needs it to run the model, with status 0; running the model is still refused."""
    import shutil

    path, model = tiny_llama
    bare = tmp_path / "bare"
    shutil.copytree(path, bare)
    (bare / "tokenizer.json").unlink()
    r = ster("inspect", str(bare), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["tokenizer"] is None and info["chat_template"] is False and info["family"] == "llama"
    assert info["parameters"] == sum(p.numel() for p in model.state_dict().values())
    (warning,) = [w for w in info["warnings"] if "tokenizer" in w]
    assert warning.startswith(f"tokenizer is missing: {bare / 'tokenizer.json'}") and "to run the model" in warning
    assert r.stderr.count("warning: tokenizer is missing") == 1 and "error" not in r.stderr, r.stderr
    r = ster("inspect", str(bare))
    assert r.returncode == 0 and "warning: tokenizer is missing" in r.stderr, r.stderr
    assert [line.split() for line in r.stdout.splitlines() if line.startswith("tokenizer ")] == [["tokenizer", "-"]]
    r = ster("generate", "--model", str(bare), "--prompt", "w5", "--max-new-tokens", "1")
    assert r.returncode == 1 and r.stderr.startswith("error: tokenizer is missing"), r.stderr


def test_generate_json_says_whether_inputs_were_rounded_to_bf16(tmp_path, tiny_llama):
    """``bf16_inputs`` in generate --json: true for a bf16 checkpoint's prompt on a CPU with AVX512_BF16
    (``qmatmul.bf16_inputs``), false with STER_BF16_INPUTS=0 and for a float32 checkpoint."""
    import os

    import torch

    from ster_py._kernels import qmatmul

    make_checkpoint(tmp_path, "llama", dtype=torch.bfloat16)
    args = ("--prompt", "w5 w6 w7 w8", "--max-new-tokens", "2", "--json", "--precision", "auto")
    for path, env, want in ((tmp_path, {}, qmatmul.bf16_inputs()), (tmp_path, {"STER_BF16_INPUTS": "0"}, False),
                            (tiny_llama[0], {}, False)):
        r = ster("generate", "--model", str(path), *args, env={**os.environ, **env})
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["bf16_inputs"] is want, (path, env)


def test_more_threads_than_cores_is_a_warning(tiny_llama):
    """--threads (or $STER_THREADS) above the cores this process may use runs, with a warning naming both."""
    import os

    cores = len(os.sched_getaffinity(0))
    path, _ = tiny_llama
    args = ("generate", "--model", str(path), "--prompt", "w5", "--max-new-tokens", "1", "-q")
    r = ster(*args, "--threads", str(cores + 1))
    assert r.returncode == 0 and f"warning: {cores + 1} threads on {cores} core(s)" in r.stderr, r.stderr
    r = ster(*args, env={**os.environ, "STER_THREADS": str(cores + 3)})
    assert r.returncode == 0 and f"warning: {cores + 3} threads" in r.stderr, r.stderr
    r = ster(*args, "--threads", str(cores))
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr


def test_piped_tables_are_plain_text():
    """README: piped, the tables are plain text (no box-drawing characters)."""
    for command in ("families", "presets"):
        r = ster(command)
        assert r.returncode == 0 and ("model_type" if command == "families" else "name") in r.stdout
        assert not any(0x2500 <= ord(c) <= 0x257F for c in r.stdout), command


def test_families_json_lists_every_model_type():
    from ster_py.families import KNOWN_MODEL_TYPES

    rows = json.loads(ster("families", "--json").stdout)
    assert [r["model_type"] for r in rows] == list(KNOWN_MODEL_TYPES)
    assert {r["model_type"] for r in rows if r["runs"]} == {
        "llama", "mistral", "qwen2", "qwen3", "smollm3", "gemma", "gemma2", "gemma3_text",
        # dense families of issue 6 (tests/test_parity_dense.py)
        "phi", "phi3", "gpt2", "gpt_neox", "stablelm", "starcoder2", "granite", "cohere", "cohere2", "olmo",
        "olmo2", "olmo3", "nemotron", "gptj", "gpt_bigcode", "opt", "bloom", "falcon", "mpt", "internlm3",
        "exaone4", "exaone", "seed_oss", "arcee", "ernie4_5", "glm", "glm4", "hunyuan_v1_dense", "granite_swa",
        "hyperclovax", "iquestcoder", "jais2", "vaultgemma", "apertus", "ministral3",
        # mixture-of-experts families of issue 13 (tests/test_parity_moe.py)
        "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "granitemoe", "granitemoeshared", "granitemoe_swa", "dbrx",
        "phimoe", "glm4_moe", "sarvam_moe", "exaone_moe", "hy_v3", "ernie4_5_moe", "hunyuan_v1_moe", "gpt_oss",
        "llama4_text", "afmoe", "cohere2_moe", "flex_olmo", "mellum", "minimax_m2", "mimo_v2_flash", "laguna",
        "step3p5",
        # latent-attention families of issue 14 (tests/test_parity_mla.py)
        "deepseek_v2", "deepseek_v3", "minicpm3", "glm4_moe_lite", "axk1", "sarvam_mla",
        # their descendants, issue 14 part B (tests/test_parity_mla_b.py)
        "deepseek_v32", "glm_moe_dsa", "dots3_note", "longcat_flash",
        # state-space families of issue 15, part A (tests/test_parity_ssm.py)
        "mamba", "falcon_mamba", "mamba2", "jamba", "bamba", "granitemoehybrid", "nemotron_h", "falcon_h1",
        # delta-rule families of issue 15, part B2 (tests/test_parity_ssm_b2.py)
        "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "olmo_hybrid", "kimi_linear",
        # short convolutions, lightning attention and shared blocks of issue 15, part B1 (tests/test_parity_ssm_b1.py)
        "lfm2", "lfm2_moe", "minimax", "minimax_text_01", "zamba2",
        # Gemma 4's text decoders of issue 16 (tests/test_parity_gemma4.py)
        "gemma4_text", "gemma4_unified_text",
        # Gemma 3n's text decoder of issue 16 (tests/test_parity_gemma3n.py)
        "gemma3n_text",
        # families without a Transformers implementation, issue 16 (tests/test_parity_remote.py)
        "minicpm", "orion", "internlm2", "mimo", "deepseek", "bailing_moe", "PanguEmbedded", "TeleFLM", "mimo_v2", "param2moe", "telechat3", "solar",
        # their second part, issue 16 group R1 (tests/test_parity_remote_b.py)
        "telechat", "nemotron-nas", "step1", "plamo3", "k2_horizon",
        # families of group R2, issue 16 (tests/test_parity_remote_c.py)
        "pangu_ultra_moe", "nemotron_h_puzzle", "step3_text", "bailing_hybrid", "longcat_flash_ngram",
        # group GLM of issue 16: ChatGLM2/3 and GLM-4-9B (tests/test_chatglm.py)
        "chatglm",
        # the wrapped decoders of issue 16 (tests/test_parity_wrapped.py)
        "muse_glimmer_text", "minimax_m3_vl_text", "inkling_text",
        # looped decoders of issue 16 (tests/test_parity_loops.py)
        "nanbeige", "iquestloopcoder", "hrm_text",
        # hyper-connection families, issue 14's remainder (tests/test_parity_hc.py)
        "hy_v4", "deepseek_v4", "glm5_next_text"}


@pytest.mark.real
def test_threads_flag_changes_speed_not_tokens(smollm2_gguf):
    """--threads 1 and 2 on the quantized kernels: each output row is one thread's dot product,
    so the tokens are the same whatever the split."""
    runs = [json.loads(ster("generate", "--model", str(smollm2_gguf), "--prompt", "Name three colours.",
                            "--max-new-tokens", "12", "--threads", n, "--json").stdout)["ids"] for n in ("1", "2")]
    assert runs[0] == runs[1] and len(runs[0]) > 0


@pytest.mark.real
def test_an_answer_cut_inside_a_character_ends_before_it(smollm2_gguf):
    """`generate -p "Write 5 emoji" --max-new-tokens 20` ended its text in U+FFFD ('🌟🌟🌟🌟🌟🌟\ufffd'), in --json
    and on stdout: the 20th token is inside a 🌟. The cut character's first bytes are left out of both."""
    args = ("generate", "--model", str(smollm2_gguf), "-p", "Write 5 emoji", "--max-new-tokens", "20", "-q")
    r = ster(*args, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    tok = load_model(str(smollm2_gguf)).tokenizer
    assert tok.decode(doc["ids"]).endswith("\ufffd"), doc["ids"]   # the answer is cut inside a character
    assert doc["text"] == tok.decode(doc["ids"])[:-1] and not doc["text"].endswith("\ufffd")
    streamed = ster(*args)
    assert streamed.returncode == 0 and streamed.stdout == doc["text"] + "\n", streamed.stdout[-20:]


@pytest.mark.real
def test_inspect_counts_quantized_matrices_as_stored(smollm2_gguf):
    """GGUF matrices stay quantized in the map: the resident estimate is about the file, not
    the f32 size of its parameters; -m works as on the other commands."""
    r = ster("inspect", "-m", str(smollm2_gguf), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert 0.9 * info["file_bytes"] <= info["resident_bytes"] <= info["file_bytes"]
    assert info["resident_bytes"] < info["parameters"]  # under one byte per weight
    both = ster("inspect", str(smollm2_gguf), "-m", "other-model")
    assert both.returncode == 1 and "two models given" in both.stderr


@pytest.mark.parametrize("name,value", [("STER_SIMD_LEVEL", "avx9000"), ("STER_INTERLEAVE", "maybe"),
                                        ("STER_BF16_INPUTS", "off")])
def test_unknown_kernel_settings_are_refused_by_the_cli(tiny_llama, name, value):
    """The kernels would ignore these values (no cap; interleaving on): the CLI says so instead."""
    import os

    path, _ = tiny_llama
    r = ster("generate", "--model", str(path), "--prompt", "w5", "--max-new-tokens", "1", env={**os.environ, name: value})
    assert r.returncode == 1 and r.stderr.startswith("error:") and name in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    ok = ster("generate", "--model", str(path), "--prompt", "w5", "--max-new-tokens", "1",
              env={**os.environ, name: "AVX2" if name == "STER_SIMD_LEVEL" else "0"})
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("name,value", [("STER_SIMD_LEVEL", "avx9000"), ("STER_INTERLEAVE", "maybe"),
                                        ("STER_F32_PANELS", "yes"), ("STER_BF16_INPUTS", "false"),
                                        ("STER_THREADS", "abc"), ("STER_THREADS", "0")])
def test_unknown_kernel_settings_are_refused_by_load_model(tiny_llama, monkeypatch, name, value):
    """The library read STER_BF16_INPUTS=false (or off, or 2) as on, and STER_THREADS=abc as every core;
    load_model now refuses what the CLI refuses."""
    path, _ = tiny_llama
    monkeypatch.setenv(name, value)
    with pytest.raises(SterError, match=f"^{name} must be "):
        load_model(str(path))


@pytest.mark.parametrize("value", ["abc", "0", "-5", "1.5", "99999999999999999999"])
def test_bad_ster_threads_is_refused_by_the_cli(tiny_llama, value):
    import os

    path, _ = tiny_llama
    r = ster("generate", "--model", str(path), "--prompt", "w5", "--max-new-tokens", "1",
             env={**os.environ, "STER_THREADS": value})
    assert r.returncode == 1 and r.stderr.startswith("error:") and "STER_THREADS" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_tokenize_a_model_name_too_long_to_be_a_path_is_an_error_line():
    """load_tokenizer stat()ed the name first: OSError ENAMETOOLONG, a traceback (files.user_path now checks it,
    as resolve and template render do)."""
    from ster_py.errors import SterError
    from ster_py.load import load_tokenizer

    with pytest.raises(SterError, match="cannot use the model path a+\\.\\.\\.: File name too long"):
        load_tokenizer("a" * 5000)


def test_every_progress_event_has_a_label_and_a_unit():
    """A new user saw perplexity's bar without a count: its event had no entry. Every event the library
    reports (``progress("NAME", ...)`` in ster_py) is named, and counted in its unit, unless it has no amount."""
    import re
    from pathlib import Path

    from ster_py.cli import PROGRESS_EVENTS

    root = Path(__file__).resolve().parents[1] / "ster_py"
    events = {m for p in root.rglob("*.py") for m in re.findall(r'progress\("([^"]+)"', p.read_text())}
    assert events and events <= set(PROGRESS_EVENTS), sorted(events - set(PROGRESS_EVENTS))
    assert all(unit for event, (label, unit) in PROGRESS_EVENTS.items() if event != "loading the reference")


@pytest.mark.parametrize("module", ["cli_tools", "cli_export", "cli_chat", "cli_serve", "cli_template"])
def test_every_command_module_imports_first(module):
    """The command modules register on cli's app and take its shared parts from cli alone: imported before cli (a
    test selection can do that), cli_tools and cli_chat each ended in a circular ImportError."""
    r = subprocess.run([sys.executable, "-c", f"import ster_py.{module}, ster_py.cli; "
                        "print(sorted(c.name or c.callback.__name__ for c in ster_py.cli.app.registered_commands))"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "'serve'" in r.stdout and "'convert'" in r.stdout and "'chat'" in r.stdout


@pytest.mark.parametrize("args, option", [
    (["chat", "-m", "MODEL", "--messages", ""], "--messages"),
    (["template", "render", "-m", "MODEL", "--messages", ""], "--messages"),
    (["template", "render", "-m", "MODEL", "--messages", "-", "--tools", ""], "--tools"),
    (["generate", "-m", "MODEL", "-p", "w5", "--tools", ""], "--tools"),
    (["generate", "-m", "MODEL", "--prompt-file", ""], "--prompt-file"),
    (["tokenize", "-m", "MODEL", "--file", ""], "--file"),
    (["capture", "-m", "MODEL", "-p", "w5", "--output", ""], "--output"),
    (["vector", "export", "", "--output", "v.gguf"], "the VECTOR argument"),
])
def test_an_empty_path_is_refused_not_read_as_the_current_directory(tiny_llama, tmp_path, args, option):
    """``--messages ""`` said "the messages file . is a directory": an unset shell variable became the current
    directory. Every option taking a path now refuses an empty value in one place (cli_help), naming it."""
    args = [str(tiny_llama[0]) if a == "MODEL" else a for a in args]
    r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", *args],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, input="[]")
    assert r.returncode == 1 and r.stderr == f"error: {option} is empty; give a path (an unset shell variable " \
        "gives an empty value; . names the current directory)\n", r.stderr
    assert list(tmp_path.iterdir()) == []


def test_every_path_option_refuses_an_empty_value():
    """Each option or argument annotated Path, or named FILE or ADAPTER, in every command."""
    from pathlib import Path

    import typer
    from typer._click.core import Context

    from ster_py.cli import app
    from ster_py.errors import SterError

    def commands(group):
        for sub in group.commands.values():
            yield from commands(sub) if hasattr(sub, "commands") else [sub]

    seen = []
    for cmd in commands(typer.main.get_command(app)):
        for p in cmd.get_params(Context(cmd)):
            desc = getattr(p, "type_descriptor", None)
            if getattr(desc, "annotation", None) is Path or p.metavar in ("FILE", "ADAPTER"):
                seen.append(p.name)
                with pytest.raises(SterError, match="is empty; give a path"):
                    p.process_value(Context(cmd), "")
    assert {"adapter", "messages", "tools", "output", "vector", "prompt_file", "positive"} <= set(seen)


def test_a_bare_prompt_or_a_model_option_on_convert_is_understood(tiny_llama, tmp_path):
    """`ster generate "a question"` said only "Got unexpected extra argument(s)"; now it says to use --prompt.
    `ster convert -m MODEL` was "No such option: -m" although every other command takes -m."""
    path, _ = tiny_llama
    r = ster("generate", "What is the capital?", "--model", str(path))   # a usage error: status 2, as click's
    assert r.returncode == 2 and "--prompt (-p)" in r.stderr and "Usage: " in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    # (the tiny checkpoint's word-level tokenizer has no GGUF form: the refusal says -m was read as the model)
    r = ster("convert", "-m", str(path), "-o", str(tmp_path / "t.gguf"), "-q")
    assert r.returncode == 1 and "WordLevel tokenizer" in r.stderr and str(path) in r.stderr, r.stderr
    r = ster("convert", "-o", str(tmp_path / "none.gguf"))
    assert r.returncode == 1 and "no model given" in r.stderr and not (tmp_path / "none.gguf").exists()


@pytest.mark.parametrize("command, words", [
    ("tokenize", "tokenize takes the text with --text (-t) or a file with --file (-f)"),
    ("chat", "chat reads your messages as you type them (or piped:"),
    ("parity", "parity takes a prompt with --prompt (-p) or a file of them with --prompts"),
])
def test_a_bare_text_on_tokenize_chat_or_parity_is_understood(tiny_llama, command, words):
    """`ster tokenize "Hello world"` (as `ster detokenize 1 2` takes its ids), `ster chat "a question"` and `ster
    parity "a prompt"` said only click's "Got unexpected extra argument(s) (Hello world)"; like generate's, their
    usage error (status 2) now says how to give the text, before any model is read."""
    path, _ = tiny_llama
    r = ster(command, "Hello world", "--model", str(path))
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == "", r.stderr
    assert r.stderr.startswith(f"Usage: ster {command} [OPTIONS]"), r.stderr
    assert f"Error: unexpected argument 'Hello world': {words}" in r.stderr, r.stderr


def test_readmes_errors_section_gives_each_choice_option_its_exit_status(tiny_llama, tmp_path):
    """README's "Errors" listed a ``--thinking`` value among the bad values that get one ``error:`` line and exit
    status 1, but ``--thinking`` is a choice option: ``--thinking maybe`` is a usage error (exit 2). Each option the
    section names on either side is run with a bad value and exits as the section says."""
    from pathlib import Path
    import re

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    errors = readme.split("\n## Errors\n", 1)[1]
    one_line = errors.split("is printed as one `error:` line", 1)[0]
    usage = errors.split("outside the choices `--help` lists for", 1)[1].split("gets the usage message", 1)[0]
    exit_1 = re.findall(r"`(--[a-z-]+)` value", one_line)
    exit_2 = re.findall(r"`(--[a-z-]+)`", usage)
    assert "--kv-cache" in exit_1 and "--thinking" in exit_2 and not set(exit_1) & set(exit_2), (exit_1, exit_2)
    model = str(tiny_llama[0])
    runs = {"--position": ["capture", "-m", model, "--prompt", "hi", "-o", str(tmp_path / "c.safetensors")],
            "--reference": ["parity", "-m", model, "--prompt", "hi"],
            "--type": ["convert", model, "-o", str(tmp_path / "m.gguf")]}
    for option, status in [*((o, 1) for o in exit_1), *((o, 2) for o in exit_2)]:
        args = runs.get(option, ["generate", "-m", model, "--prompt", "hi", "--max-new-tokens", "1"])
        r = ster(*args, option, "maybe")
        assert r.returncode == status, (option, r.returncode, r.stderr)
        if status == 1:
            assert r.stderr.count("error:") == 1 and "Traceback" not in r.stderr, r.stderr
    assert not list(tmp_path.iterdir())


def test_a_phase_that_computed_nothing_has_no_rate(tiny_llama):
    """``generate --json --max-new-tokens 1`` reported ``"decode_tokens_per_second": 0.0``: the one new token comes
    from the prefill, so no decode step ran and there is no rate. It is null in JSON, and left out of the summary
    line (generate's, and chat's, which share ``rate_texts``); so is the prefill's when the whole prompt was reused."""
    from ster_py.cli import rate_texts
    from ster_py.generate import Generation

    path, _ = tiny_llama
    r = ster("generate", "--model", str(path), "--prompt", "w5 w6", "--max-new-tokens", "1", "--json")
    assert r.returncode == 0, r.stderr
    timings = json.loads(r.stdout)["timings"]
    assert timings["decode_tokens_per_second"] is None and timings["prefill_tokens_per_second"] > 0, timings
    one = Generation(prompt_ids=[5, 6], ids=[7], prefill_seconds=0.01, decode_seconds=1e-6, prefilled=2)
    assert one.decode_tokens_per_second is None and rate_texts(one) == ["prefill 200.0 tok/s"]
    reused = Generation(prompt_ids=[5, 6], ids=[7, 8, 9], prefill_seconds=1e-6, decode_seconds=0.5, reused=2)
    assert reused.prefill_tokens_per_second is None and rate_texts(reused) == ["decode 4.0 tok/s"]
    r = ster("generate", "--model", str(path), "--prompt", "w5 w6", "--max-new-tokens", "1")
    assert r.returncode == 0 and "1 new token" in r.stderr and "decode" not in r.stderr, r.stderr


def test_a_revision_with_a_preset_or_a_local_path_is_refused(tiny_llama, tmp_path):
    """``ster inspect --revision v1`` (the default preset) printed ``model_revision v1`` instead of the preset's
    ``sha256:`` pin, as did generate, convert and parity, and ``-m local --revision v1``; captures made so gave
    vectors later runs refused. A --revision applies to Hub ids only: with a preset or a local path it is one
    error line, exit 1, nothing printed on stdout, loaded or written."""
    from ster_py.presets import DEFAULT_PRESET, PRESETS

    path = str(tiny_llama[0])
    out = tmp_path / "c.safetensors"
    pin = f"sha256:{PRESETS[DEFAULT_PRESET].sha256}"
    for args, what in [(["inspect"], f"{DEFAULT_PRESET} is a preset, pinned as {pin}"),
                       (["generate", "-p", "hi", "--json"], f"{DEFAULT_PRESET} is a preset"),
                       (["generate", "-m", path, "-p", "hi", "--json"], f"{path} is a local directory"),
                       (["capture", "-m", path, "-p", "hi", "-o", str(out)], f"{path} is a local directory"),
                       (["convert", path, "-o", str(tmp_path / "m.gguf")], f"{path} is a local directory")]:
        r = ster(*args, "--revision", "v1")
        assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr, (args, r.stderr)
        assert r.stderr.startswith("error: --revision 'v1' applies to Hugging Face Hub ids only, and " + what), r.stderr
        assert r.stderr.count("\n") == 1, r.stderr
    assert not list(tmp_path.iterdir())
