"""Issue 17: hostile inputs, one test per class of failure found by fuzzing.

Each input must end in one SterError (the CLI: one ``error:`` line, exit 1, no
traceback), and be refused before memory or time is spent on it.
"""
from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

from ster_py.errors import SterError
from tiny import make_checkpoint


def ster(*args, timeout=120):
    return subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=timeout)


def assert_clean_refusal(r, words):
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and r.stderr.startswith("error:"), r.stderr[-2000:]
    assert words in r.stderr, r.stderr[-2000:]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    make_checkpoint(path, "llama", num_hidden_layers=1)
    return path


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _read_st(path):
    raw = path.read_bytes()
    (n,) = struct.unpack_from("<Q", raw)
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write_st(path, header: str | dict, data: bytes):
    text = header if isinstance(header, str) else json.dumps(header)
    blob = text.encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


# ------------------------------------------------------------------ safetensors headers

def test_inspect_turns_safetensors_header_errors_into_ster_errors_and_agrees_with_loading(llama_dir, tmp_path):
    from ster_py.inspect import inspect_model
    from ster_py.load import load_model

    path = _copy(llama_dir, tmp_path / "m")
    header, data = _read_st(path / "model.safetensors")
    name = next(k for k in header if k != "__metadata__")
    header[name]["data_offsets"][1] += 4  # runs past the end / disagrees with the shape
    _write_st(path / "model.safetensors", header, data)
    with pytest.raises(SterError, match="model.safetensors"):
        inspect_model(str(path))
    assert_clean_refusal(ster("inspect", str(path)), "model.safetensors")

    # Two tensors on the same bytes: the safetensors library (inspect) refuses them, so loading must too.
    header, data = _read_st(llama_dir / "model.safetensors")
    a, b = (k for k in header if k != "__metadata__" and header[k]["shape"] == header["model.norm.weight"]["shape"]
            and k != "model.norm.weight"), "model.norm.weight"
    b_name = b
    a_name = next(a)
    header[a_name]["data_offsets"] = list(header[b_name]["data_offsets"])
    _write_st(path / "model.safetensors", header, data)
    with pytest.raises(SterError, match="overlap"):
        inspect_model(str(path))
    with pytest.raises(SterError, match="overlap"):
        load_model(str(path))


@pytest.mark.parametrize("field, value", [
    ("shape", "[Infinity]"), ("shape", "[1e400]"), ("shape", f"[{2**63}]"), ("shape", f"[{2**64 + 16}]"),
    ("data_offsets", f"[0, {2**63}]"), ("data_offsets", "[0, Infinity]"), ("data_offsets", "[-Infinity, 0]"),
    ("shape", f"[{2**32}, {2**32}]"),  # the int64 product wraps to 0: must not pass as an empty tensor
    ("shape", "[1.5]"), ("shape", "[true]"),
    ("shape", "[" + ", ".join(["0"] + ["1"] * 64) + "]"),  # an empty tensor of 65 dimensions: numpy allows 64
])
def test_safetensors_header_numbers_out_of_range_are_ster_errors(llama_dir, tmp_path, field, value):
    from ster_py.inspect import inspect_model
    from ster_py.load import load_model

    path = _copy(llama_dir, tmp_path / "m")
    header, data = _read_st(path / "model.safetensors")
    entry = {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
    entry[field] = "@@"
    text = json.dumps({**header, "zz.extra": entry}).replace('"@@"', value)
    _write_st(path / "model.safetensors", text, data)
    for fn in (load_model, inspect_model):
        with pytest.raises(SterError, match="zz.extra"):
            fn(str(path))


@pytest.mark.parametrize("metadata", ['null', '{"a": "x"}', '{"a": 1}', '{"a": null}', '"text"', '[]',
                                      '{"a": {"b": "c"}}'])
def test_safetensors_metadata_is_read_as_the_safetensors_library_reads_it(llama_dir, tmp_path, metadata):
    # The oracle: the safetensors library accepts __metadata__ only as null or an object of strings.
    from safetensors.numpy import load_file

    from ster_py.load import load_model

    path = _copy(llama_dir, tmp_path / "m")
    header, data = _read_st(path / "model.safetensors")
    header.pop("__metadata__", None)
    text = json.dumps({"__metadata__": "@@", **header}).replace('"@@"', metadata)
    _write_st(path / "model.safetensors", text, data)
    try:
        load_file(str(path / "model.safetensors"))
        library_reads = True
    except Exception:
        library_reads = False
    if library_reads:
        load_model(str(path))
    else:
        with pytest.raises(SterError, match="__metadata__"):
            load_model(str(path))
        assert_clean_refusal(ster("inspect", str(path)), "__metadata__")


# ------------------------------------------------------------------ GGUF q/k un-permutation

@pytest.mark.parametrize("shape", [(6, 8), (4, 8, 8), (12, 8)])
def test_gguf_qk_rows_that_do_not_split_into_heads_are_refused(tmp_path, shape):
    import gguf

    from ster_py.gguf.reader import GGUFFile
    from ster_py.weights import GGUFWeights, unpermute_qk

    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    w.add_tensor("blk.0.attn_q.weight", np.ones(shape, dtype=np.float32))
    w.add_tensor("blk.0.attn_k.weight", np.ones((16, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    weights = GGUFWeights(GGUFFile(tmp_path / "m.gguf"), qk_heads=(4, 2))
    assert weights.get("blk.0.attn_k.weight").shape == (16, 8)  # 2 heads of 4 pairs: fine
    with pytest.raises(SterError, match="attn_q.weight.*heads of rotary pairs"):
        weights.get("blk.0.attn_q.weight")
    with pytest.raises(SterError, match="heads of rotary pairs"):
        unpermute_qk(np.ones(shape, dtype=np.float32), 4)


@pytest.mark.parametrize("n", [280, 301])
def test_gguf_token_list_that_disagrees_with_the_embedding_is_refused(tmp_path, n):
    """Fewer tokens than token_embd rows ran and printed nothing for the ids past the list; more
    reached rows the embedding lacks. llama.cpp refuses both (it sizes token_embd by the list)."""
    from export_helpers import write_bpe_tokenizer
    from gguf_craft import ARRAY, F32, I32, STRING, edit_metadata

    from ster_py.convert import convert_model
    from ster_py.gguf.reader import GGUFFile
    from ster_py.inspect import inspect_model
    from ster_py.load import load_model, load_tokenizer

    make_checkpoint(tmp_path / "m", "llama", num_hidden_layers=1, vocab_size=300)
    write_bpe_tokenizer(tmp_path / "m", 300)  # (byte-level BPE needs 259 ids at least)
    good = tmp_path / "good.gguf"
    convert_model(str(tmp_path / "m"), good, "f32")
    tokens = GGUFFile(good).metadata["tokenizer.ggml.tokens"]
    assert len(tokens) == 300
    tokens = (tokens + [f"x{i}" for i in range(300, n)])[:n]
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(edit_metadata(good.read_bytes(), {"tokenizer.ggml.tokens": (ARRAY, tokens, STRING),
                                                      "tokenizer.ggml.scores": (ARRAY, [0.0] * n, F32),
                                                      "tokenizer.ggml.token_type": (ARRAY, [1] * n, I32)}))
    for fn in (load_model, inspect_model):
        with pytest.raises(SterError, match=f"tokenizer.ggml.tokens holds {n} tokens, but token_embd.weight has 300"):
            fn(str(bad))
    assert_clean_refusal(ster("generate", "-m", str(bad), "-p", "hi", "--max-new-tokens", "1"), "token_embd.weight")
    assert load_tokenizer(str(bad)).vocab_size == n  # tokenizing reads no weights: still allowed


# ------------------------------------------------------------------ tokenizer.json that multiplies text

def child(code: str, memory: int = 3 << 30, timeout: float = 120):
    """Run ``code`` in a child Python under an address-space limit: a crash there fails the
    test instead of taking the test run down."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    return subprocess.run([sys.executable, "-"], input=code, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=limit)


@pytest.mark.parametrize("part", ["normalizer", "decoder"])
def test_tokenizer_json_that_multiplies_the_text_is_refused(llama_dir, tmp_path, part):
    path = _copy(llama_dir, tmp_path / "m")
    doc = json.loads((path / "tokenizer.json").read_text())
    steps = [{"type": "Replace", "pattern": {"String": "h" if part == "normalizer" else "w"}, "content": "hh"}] * 40
    doc[part] = {"type": "Sequence", ("normalizers" if part == "normalizer" else "decoders"): steps}
    (path / "tokenizer.json").write_text(json.dumps(doc))
    r = child(f"""
from ster_py.tokenizer import Tokenizer
from ster_py.errors import SterError
try:
    t = Tokenizer.from_dir({str(path)!r})
    print(len(t.encode("hello w5")), len(t.decode([5, 6])))
except SterError as e:
    print("SterError:", e)
""")
    assert r.returncode == 0, (r.returncode, r.stderr[-1000:])
    assert r.stdout.startswith("SterError:") and "Replace steps can make a text" in r.stdout, r.stdout
    # A real tokenizer's Replace (" " -> "\u2581", one character for one) still loads.
    doc[part][("normalizers" if part == "normalizer" else "decoders")] = [
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]
    (path / "tokenizer.json").write_text(json.dumps(doc))
    from ster_py.tokenizer import Tokenizer

    Tokenizer.from_dir(path)


# ------------------------------------------------------------------ special files in a checkpoint

@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json"])
@pytest.mark.parametrize("kind", ["dev_zero", "fifo"])
def test_config_and_index_that_are_special_files_are_refused(llama_dir, tmp_path, name, kind):
    import os

    path = _copy(llama_dir, tmp_path / "m")
    target = path / name
    target.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero")
    r = child(f"""
from ster_py.load import load_model
from ster_py.errors import SterError
try:
    load_model({str(path)!r})
    print("loaded")
except SterError as e:
    print("SterError:", e)
""", memory=2 << 30, timeout=60)
    assert r.returncode == 0, (r.returncode, r.stderr[-1000:])
    assert r.stdout.startswith("SterError:") and "not a regular file" in r.stdout, r.stdout


# ------------------------------------------------------------------ chat templates

_MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("template", [
    "{% for a in [1] %}" * 21 + "x" + "{% endfor %}" * 21,  # Python: "too many statically nested blocks"
    "{% if true %}" * 99 + "x" + "{% endif %}" * 99,        # Python: "too many levels of indentation"
], ids=["for21", "if99"])
def test_deeply_nested_template_blocks_are_ster_errors(template):
    from ster_py.chat import render_chat

    with pytest.raises(SterError, match="too deeply nested to compile"):
        render_chat(template, _MESSAGES)


def test_a_format_field_of_other_digits_fails_as_python_formats_it():
    """'{²}'.format(1): the budget check read '²' as an index (str.isdigit) and int() raised, so the template
    failed with ster's own 'ValueError: invalid literal for int()'; str.format reads it as a key (KeyError), as
    transformers' renderer does, and reads '{٣}' (a decimal digit) as index 3."""
    from ster_py.chat import render_chat

    with pytest.raises(SterError, match="KeyError: '\u00b2'"):
        render_chat("{{ '{\u00b2}'.format(1) }}", _MESSAGES)
    assert render_chat("{{ '{\u0663}'.format(1, 2, 3, 4) }}", _MESSAGES) == "4"


@pytest.mark.parametrize("config", [{"per_layer_config": {"\u00b2": {"num_attention_heads": 4}}},
                                    {"model_type": "step3_text", "moe_layers_enum": "1,\u00b2", "share_q_dim": 32}])
def test_layer_numbers_of_other_digits_in_a_config_are_named(tmp_path, config):
    """A config key or list entry '²' (str.isdigit() is true of it) reached int(): 'invalid model config ...:
    ValueError: invalid literal for int()'. It is now refused (or left out) as any other non-number."""
    import json

    from tiny import make_checkpoint

    from ster_py.load import load_model

    make_checkpoint(tmp_path / "m", "llama")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**cfg, **config}))
    try:
        load_model(str(tmp_path / "m"))
    except SterError as e:
        assert "ValueError" not in str(e) and "invalid literal" not in str(e), e


@pytest.mark.parametrize("template", [
    "{{ '{0:33554431}{0:33554431}'.format(1) }}",   # each width within the budget, their sum not
    "{{ '%33554431d%33554431d' % (1, 2) }}",
    "{{ '%33554431d%33554431d'|format(1, 2) }}",
    "{{ '{0}{0}{0}{0}'.format('x' * 10000000) }}",  # one argument printed four times
    "{% set ns = namespace(v=1) %}{% for i in range(500) %}{% set ns.v = [ns.v] %}{% endfor %}"
    "{{ ns.v|tojson(indent=1000) }}",               # 500 levels x 1000 spaces on every line
    "{{ strftime_now('%Y' * 5000000) }}",           # a 10 M-character format
], ids=["brace-widths", "percent-widths", "format-filter", "brace-repeat", "tojson-indent", "strftime"])
def test_template_text_budget_holds_inside_formatting_calls(monkeypatch, template):
    import tracemalloc

    import ster_py.chat as chat

    monkeypatch.setattr(chat, "_ISOLATE", False)  # the in-process checks themselves, measured
    tracemalloc.start()
    try:
        with pytest.raises(SterError, match="over budget"):
            chat.render_chat(template, _MESSAGES, time_limit=60)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 48 << 20, peak  # refused before the text is built (each is 40 M characters or more)


@pytest.mark.parametrize("template", [
    "{{ ('a' * 3000000)|wordwrap(1) }}",
    "{{ ('www.a.com ' * 3000000)|urlize }}",
    "{{ (range(100000)|list * 10)|sort|sort(reverse=true)|sort|sort(reverse=true)|sort|length }}",
    "{% if x %}{% endif %}" * 45000,  # 0.9 MB: compiling alone takes longer than the limit
], ids=["wordwrap", "urlize", "sort", "compile"])
def test_template_time_limit_holds_inside_a_single_call_and_compilation(template):
    import time

    from ster_py.chat import render_chat

    start = time.monotonic()
    r = child(f"""
from ster_py.chat import render_chat
from ster_py.errors import SterError
try:
    render_chat({template!r}, [{{"role": "user", "content": "hi"}}], time_limit=0.5)
    print("rendered")
except SterError as e:
    print("SterError:", e)
""", timeout=60)
    elapsed = time.monotonic() - start
    assert r.returncode == 0 and r.stdout.startswith("SterError:") and "time budget" in r.stdout, \
        (r.stdout[-500:], r.stderr[-1000:])
    assert elapsed < 15, elapsed  # 0.5 s + the kill grace + starting Python


def test_template_size_is_bounded_whatever_its_source(llama_dir, tmp_path):
    from ster_py.chat import MAX_TEMPLATE_CHARS, render_chat
    from ster_py.tokenizer import Tokenizer

    big = "x" * (MAX_TEMPLATE_CHARS + 1)
    with pytest.raises(SterError, match="characters long"):
        render_chat(big, _MESSAGES)
    path = _copy(llama_dir, tmp_path / "m")
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": big}))
    tok = Tokenizer.from_dir(path)
    with pytest.raises(SterError, match="characters long"):
        render_chat(tok.chat_template, _MESSAGES)


# ------------------------------------------------------------------ GGUF nested arrays

def test_gguf_of_nested_empty_arrays_is_refused_before_its_objects_are_built(tmp_path):
    import tracemalloc

    from gguf_craft import ARRAY, U8, Craft

    from ster_py.gguf.reader import GGUFFile

    count = 200_000  # 2.4 MB of 12-byte empty arrays: ~90 MB of Python objects when read
    raw = struct.pack("<IQ", ARRAY, count) + struct.pack("<IQ", U8, 0) * count
    path = tmp_path / "nested.gguf"
    path.write_bytes(Craft().add_kv("x.nested", ARRAY, raw=raw).build())
    tracemalloc.start()
    try:
        with pytest.raises(SterError, match="arrays inside arrays"):
            GGUFFile(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak


# ------------------------------------------------------------------ error lines

def test_error_lines_do_not_echo_unbounded_values(llama_dir, tmp_path):
    from ster_py.load import load_model

    path = _copy(llama_dir, tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "q" * 10_000_000}))
    with pytest.raises(SterError) as caught:
        load_model(str(path))
    message = str(caught.value)
    assert len(message) < 3000 and "characters cut" in message, len(message)
    r = ster("inspect", str(path))
    assert_clean_refusal(r, "characters cut")
    assert len(r.stderr) < 3000, len(r.stderr)


# ------------------------------------------------------------------ the fuzzers, a small fixed sample

def test_fuzz_smoke_run_has_no_traceback_signal_timeout_or_memory_outcome(tmp_path):
    """scripts/fuzz.py on 75 fixed-seed cases of each kind (the full run: runbook/fuzzing.md)."""
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "fuzz.py"
    out = tmp_path / "counts.json"
    r = subprocess.run([sys.executable, str(script), "--cases", "75", "--seed", "17", "--jobs", "2",
                        "--findings", str(tmp_path / "findings"), "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    counts = json.loads(out.read_text())
    assert set(counts) == {"gguf", "safetensors", "checkpoint", "template", "adapter"}, r.stderr[-2000:]
    for kind, c in counts.items():
        assert sum(c[o] for o in ("ok", "refused", "traceback", "memory", "signal", "timeout")) == 75, (kind, c)
        assert c["traceback"] == c["memory"] == c["signal"] == c["timeout"] == 0, (kind, c["examples"])
        assert c["refused"] > 0, (kind, c)  # the mutators reach the refusals
    assert sum(c["ok"] for c in counts.values()) > 0  # and some inputs still load
    assert r.returncode == 0, r.stdout[-2000:]


# ------------------------------------------------------------------ s7-fixb: issue 17's second round

def test_serve_bounds_json_depth_without_recursion_and_names_the_param():
    from ster_py.server_request import MAX_JSON_DEPTH, RequestError, json_depth, normalize_messages, sampling_of

    assert json_depth(b"[" * 100_000 + b"]" * 100_000) == 100_000
    assert json_depth(b'{"a": "[[[[{{{", "b": [[1], {"c": "]]]\\"["}]}') == 3   # brackets inside strings not counted
    assert json_depth(b"5") == 0
    # a tool call's arguments nested past the bound stay the text they were (no RecursionError)
    deep = "[" * 100_000 + "]" * 100_000
    calls = normalize_messages([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": deep}}]}])
    assert calls[0]["tool_calls"][0]["function"]["arguments"] == deep
    assert MAX_JSON_DEPTH >= 32
    for body, param, words in [({"max_tokens": -1}, "max_tokens", "max_tokens must be 0 or more, got -1"),
                               ({"seed": 2**63}, "seed", "seed must be in 0..2**63-1"),
                               ({"top_p": 0.0}, "top_p", "top_p must be in (0, 1]"),
                               ({"min_p": 2.0}, "min_p", "min_p must be in [0, 1]"),
                               ({"repeat_penalty": 0.0}, "repeat_penalty", "repeat_penalty must be")]:
        with pytest.raises(RequestError) as caught:
            sampling_of(body, 16)
        assert caught.value.param == param and str(caught.value).startswith(words), (body, str(caught.value))


@pytest.mark.parametrize("config, key", [
    ({"model_type": "mistral", "sliding_window": 10**30}, "sliding_window"),
    ({"model_type": "muse_glimmer", "text_config": {"sliding_window": 10**30}}, "text_config.sliding_window"),
    ({"model_type": "inkling_text", "sliding_window_size": 2**40}, "sliding_window_size"),
    ({"model_type": "inkling_text", "conv_kernel_size": 10**6}, "conv_kernel_size"),
    ({"model_type": "inkling_text", "d_rel": 2**31}, "d_rel"),
    ({"model_type": "minimax_m3_vl_text", "index_head_dim": 10**20}, "index_head_dim"),
    ({"model_type": "llama", "num_key_value_heads": -(2**63)}, "num_key_value_heads"),
])
def test_config_integers_read_into_c_are_bounded_by_name(config, key):
    from ster_py.validate import check_config

    with pytest.raises(SterError, match=f"{re.escape(key)} is .* beyond the limit of"):
        check_config(config, "config.json")


def test_huge_sliding_window_is_refused_by_inspect_and_load(llama_dir, tmp_path):
    """Was: inspect exits 0, generate dies with OverflowError inside the attention kernel."""
    from ster_py.load import load_model

    path = _copy(llama_dir, tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "mistral", "sliding_window": 10**30}))
    with pytest.raises(SterError, match="sliding_window is"):
        load_model(str(path))
    assert_clean_refusal(ster("inspect", str(path)), "sliding_window is")


# Issue 17/23 (breaker3): a name longer than NAME_MAX made pathlib's stat raise OSError (Errno 36) out of every
# output check and the model resolver; each is one SterError naming the option, before anything is looked at.

def test_file_names_over_name_max_are_refused_by_option(tmp_path):
    from ster_py.capture import check_capture_output
    from ster_py.convert import convert_model
    from ster_py.resolve import resolve
    from ster_py.steering import check_control_vector_output, check_vector_output

    long = str(tmp_path / ("a" * 300))
    with pytest.raises(OSError):  # the failure the check stands in front of
        (tmp_path / ("a" * 300)).exists()
    for call, what in ((lambda: check_capture_output(long + ".safetensors"), "--output"),
                       (lambda: check_vector_output(long + ".json"), "--output"),
                       (lambda: check_control_vector_output(long + ".gguf"), "--output"),
                       (lambda: convert_model(str(tmp_path), long + ".gguf", "q8_0"), "--output"),
                       (lambda: resolve(long), "the model path")):
        with pytest.raises(SterError, match=f"cannot use {what} .*File name too long"):
            call()
    assert list(tmp_path.iterdir()) == []


# Issue 17/23 (breaker3): errors about the drafter name it (--draft), not the target's --model.

def test_drafter_errors_name_the_drafter(tmp_path):
    from types import SimpleNamespace

    from ster_py.speculative import load_drafter
    from ster_py.steering import SteeringVector, export_control_vector

    with pytest.raises(SterError, match="no drafter given \\(--draft is ''\\)"):
        load_drafter("", None)
    cv = tmp_path / "cv.gguf"
    # a unit direction: export_control_vector checks the vector as steering_hook does (bbe5a18)
    export_control_vector(SteeringVector("m", None, 8, "t", "caa", {1: np.full(8, 8 ** -0.5, np.float32)}), cv)
    with pytest.raises(SterError, match=f"\\(--draft {re.escape(str(cv))}\\): .*is not a model: it is a llama.cpp control"):
        load_drafter(str(cv), None)
    with pytest.raises(SterError, match="--draft .*absent"):
        load_drafter(str(tmp_path / "absent"), SimpleNamespace(tokenizer=None, spec=None))  # fails before both


# ------------------------------------------------------------------ s9-left: the attacker's leftovers

def _stub_server(vocab: int = 128):
    from types import SimpleNamespace

    from ster_py.server import Server

    loaded = SimpleNamespace(decoder=SimpleNamespace(spec=SimpleNamespace(vocab_size=vocab)),
                             tokenizer=SimpleNamespace(source="/models/stub"))
    return Server(SimpleNamespace(draft=None, loaded=loaded, template="{{ messages }}",
                                  prompt=lambda messages, **kw: ("w5", [5])), "stub")


USER = [{"role": "user", "content": "w5"}]


@pytest.mark.parametrize("body, param, words", [
    ({"logit_bias": {"128": 1}}, "logit_bias", 'key "128" is not a token id of this model (0 to 127)'),
    ({"logit_bias": {"-1": 1}}, "logit_bias", 'key "-1" is not a token id'),
    ({"logit_bias": {"x": 1}}, "logit_bias", 'key "x" is not a token id'),
    ({"logit_bias": {"9" * 40: 1}}, "logit_bias", "is not a token id"),
    ({"logit_bias": {"5": "high"}}, "logit_bias", 'bias of id 5 must be a finite number in -100..100, got "high"'),
    ({"logit_bias": {"5": 100.5}}, "logit_bias", "got 100.5"),
    ({"logit_bias": {"5": True}}, "logit_bias", "got true"),
    ({"logit_bias": [5]}, "logit_bias", "logit_bias must be an object"),
    ({"response_format": {"type": "json_object"}}, "response_format", 'response_format "json_object" is not supported'),
    ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format", "not supported"),
    ({"response_format": "json"}, "response_format", "not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "w5"},
                                                {"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages", 'message 0 has a content part of type "image_url"; only text parts'),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}, "messages",
     '"input_audio"'),
])
def test_serve_refuses_bad_logit_bias_and_unsupported_formats_and_parts(body, param, words):
    """Out-of-range or non-numeric logit_bias entries, response_format other than text and
    non-text content parts are refused with the field named (were ignored)."""
    from ster_py.server_request import RequestError

    server = _stub_server()
    with pytest.raises(RequestError) as caught:
        server.parse({"messages": USER, **body}, chat=True)
    assert caught.value.param == param and words in str(caught.value) and caught.value.status == 400, str(caught.value)
    # a request without the bad field passes
    args = server.parse({"messages": USER, "response_format": {"type": "text"}, "logit_bias": {"5": -100, "127": 2.5},
                         **({"messages": [{"role": "user", "content": [{"type": "text", "text": "w5"}]}]}
                            if param != "messages" else {})}, chat=True)
    assert args["sampling"].logit_bias == ((5, -100.0), (127, 2.5))


def test_logit_bias_steers_generation_as_transformers_sequence_bias(llama_dir):
    """ster's logit_bias against transformers' SequenceBiasLogitsProcessor (applied before the
    repetition penalty in both), greedy."""
    import torch
    from transformers import AutoModelForCausalLM

    from ster_py.generate import Sampling, generate
    from ster_py.load import load_model

    loaded = load_model(str(llama_dir))
    hf = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).eval()
    prompt = [1, 17, 33, 48]
    plain = generate(loaded.decoder, prompt, Sampling(max_new_tokens=6)).ids
    bias = ((plain[0], -100.0), (plain[1], -7.5), (40, 3.0), (41, 2.0))
    sampling = Sampling(max_new_tokens=6, repeat_penalty=1.3, logit_bias=bias)
    got = generate(loaded.decoder, prompt, sampling).ids
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, repetition_penalty=1.3,
                           sequence_bias={(t,): b for t, b in bias}, eos_token_id=None,
                           pad_token_id=0)[0, len(prompt):].tolist()
    assert got == want and got[0] != plain[0]
    with pytest.raises(SterError, match="past the model's"):
        generate(loaded.decoder, prompt, Sampling(max_new_tokens=1, logit_bias=((10**6, 1.0),)))


def test_a_huge_prompt_is_refused_after_tokenizing_about_twice_the_context(llama_dir, monkeypatch):
    """A 9 MB prompt (generate's encode_prompt and chat/serve's Session.reply) is refused after a
    bounded part of it is tokenized (was: all of it, 1.5 GB and 7 s); a long text that fits (one
    unknown word of 200k characters: one token) is not refused by its length."""
    from ster_py.conversation import Session
    from ster_py.generate import Sampling
    from ster_py.load import load_model
    from ster_py.prompt import PIECE_CHARS, encode_prompt
    from ster_py.tokenizer import Tokenizer

    loaded = load_model(str(llama_dir))
    loaded.tokenizer = Tokenizer(loaded.tokenizer.tk, chat_template="{% for m in messages %}{{ m.content }} "
                                 "{% endfor %}w5")
    seen = []
    original = Tokenizer._backend_encode

    def counting(self, text, add_special_tokens):
        seen.append(len(text))
        return original(self, text, add_special_tokens)

    monkeypatch.setattr(Tokenizer, "_backend_encode", counting)
    huge = "w7 w8 " * (9_000_000 // 6)
    context = loaded.spec.max_position_embeddings
    for call in (lambda: encode_prompt(loaded.tokenizer, huge, chat_template="off", context=context),
                 lambda: encode_prompt(loaded.tokenizer, huge, context=context),
                 lambda: Session(loaded).reply([{"role": "user", "content": huge}], Sampling(max_new_tokens=1)),
                 lambda: Session(loaded).reply([], Sampling(max_new_tokens=1), raw=huge)):
        seen.clear()
        with pytest.raises(SterError, match=f"is 9,000,00[0-9] characters, far more than the context of {context:,} tokens"):
            call()
        assert 0 < sum(seen) <= 2 * PIECE_CHARS, seen
    word = "q" * 200_000   # not in the vocabulary: one <unk>
    assert Session(loaded).reply([], Sampling(max_new_tokens=1), raw=word).prompt_ids == loaded.tokenizer.encode(word)
    assert encode_prompt(loaded.tokenizer, word, chat_template="off", context=context).ids == \
        loaded.tokenizer.encode(word)


@pytest.mark.parametrize("failure, kind, words", [
    # (a prompt longer than the context is refused before the 200: test_serve.py)
    (SterError("the prompt cache holds float16 keys and values, not f32's"), "invalid_request_error",
     "the prompt cache holds"),
    (MemoryError("out of memory"), "server_error", "internal error: MemoryError: out of memory"),
])
def test_a_stream_that_fails_after_its_headers_ends_with_an_sse_error_event(failure, kind, words):
    """A streamed request that fails once the 200 and the first chunks are sent gets OpenAI's
    error event (``data: {"error": {...}}``) as its last event, no ``[DONE]``; the official
    client raises it."""
    import http.client
    import socket
    import threading
    import time

    import openai
    import uvicorn

    from ster_py.reply import Event
    from ster_py.server import build_app

    server = _stub_server()

    def reply(messages, sampling, *, on_event=None, **kw):
        on_event(Event("text", "w9"))
        raise failure

    server.session.reply = reply
    sock = socket.create_server(("127.0.0.1", 0))
    srv = uvicorn.Server(uvicorn.Config(build_app(server), log_level="error"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not srv.started:
            time.sleep(0.02)
        base = f"http://127.0.0.1:{sock.getsockname()[1]}"
        conn = http.client.HTTPConnection("127.0.0.1", sock.getsockname()[1], timeout=30)
        conn.request("POST", "/v1/chat/completions", body=json.dumps({"messages": USER, "stream": True}),
                     headers={"content-type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200 and r.getheader("content-type").startswith("text/event-stream")
        events = [e for e in r.read().decode().split("\n\n") if e]
        conn.close()
        assert all(e.startswith("data: ") for e in events) and "[DONE]" not in events[-1]
        chunks = [json.loads(e.removeprefix("data: ")) for e in events]
        assert chunks[1]["choices"][0]["delta"] == {"content": "w9"}          # the answer began...
        err = chunks[-1]["error"]                                             # ...and the error ends it
        assert set(chunks[-1]) == {"error"} and err["type"] == kind and words in err["message"], chunks[-1]
        client = openai.OpenAI(base_url=base + "/v1", api_key="-", max_retries=0, timeout=30)
        with pytest.raises(openai.APIError, match=words.split(":")[0]):
            for _ in client.chat.completions.create(model="stub", messages=USER, stream=True):
                pass
    finally:
        srv.should_exit = True
        thread.join(timeout=30)
