"""``ster tokenize`` and ``ster detokenize`` through the command line.

Oracles: llama.cpp's tokenizer test vectors (the .out ids of the vocabulary-only
GGUF files, tokenized without BOS and without parsing special texts), llama.cpp
itself (llama-cpp-python, vocab_only) for a real GGUF's ``--parse-special``
behaviour, and transformers' tokenizer for a Hugging Face directory.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from ster_py.errors import SterError
from test_gguf_tokenizer import _vectors, llama_vocab_dir  # noqa: F401  (the fixture is used by name)

TEXT = "Hello <|im_start|>world<|im_end|>\n  naïve café 🦙 3.14"


def ster(*args):
    return subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=600)


def tokenize_json(*args) -> dict:
    """``ster tokenize --json ARGS`` run in this process (the command's own code through Typer's runner;
    a new interpreter per call cost ~1 s of imports, 45 calls here); the command-line tests of exit
    statuses and error lines below keep their own process (``ster``)."""
    from typer.testing import CliRunner

    from ster_py.cli import app

    done = CliRunner().invoke(app, ["tokenize", "--json", *map(str, args)])
    assert done.exit_code == 0, (done.exception, done.stderr)
    return json.loads(done.stdout)


# ------------------------------------------------------------- vocabulary-only GGUF

@pytest.mark.real
def test_vocab_only_gguf_gives_llama_cpp_vector_ids(llama_vocab_dir):
    from ster_py.gguf.reader import GGUFFile

    path = llama_vocab_dir / "ggml-vocab-llama-spm.gguf"
    assert GGUFFile(path).tensor_names() == []  # no weights at all
    for text, want in _vectors(path)[:12]:
        doc = tokenize_json("--model", str(path), "--text", text, "--no-special")
        assert doc["ids"] == want, text
        assert doc["count"] == len(want) and len(doc["tokens"]) == len(want)
    # --special (the default) adds BOS as llama.cpp does for this vocabulary.
    text, want = _vectors(path)[1]
    assert tokenize_json("-m", str(path), "-t", text)["ids"] == [1] + want


#: llama.cpp 0.3.36's models/ folder: every ggml-vocab-*.gguf in it.
LLAMA_CPP_VOCABS = ["aquila", "baichuan", "bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon",
                    "gemma-4", "gpt-2", "gpt-neox", "llama-bpe", "llama-spm", "mpt", "nomic-bert-moe", "phi-3",
                    "qwen2", "qwen35", "refact", "starcoder"]


@pytest.mark.real
@pytest.mark.parametrize("vocab", LLAMA_CPP_VOCABS)
def test_every_vocab_only_gguf_of_llama_cpp_tokenizes(llama_vocab_dir, vocab):
    # Every file of llama.cpp's models/ folder, through the command line, equals llama.cpp
    # (with and without BOS/EOS, special texts left as text).
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is the oracle here")
    path = llama_vocab_dir / f"ggml-vocab-{vocab}.gguf"
    assert sorted(p.name for p in llama_vocab_dir.glob("ggml-vocab-*.gguf")) == [
        f"ggml-vocab-{v}.gguf" for v in LLAMA_CPP_VOCABS]
    model = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    text = "Hello world! It's 3.14159, naïve café 日本語 🦙\n\tdef f(x): return x  # ok"
    for flag, add in (("--special", True), ("--no-special", False)):
        doc = tokenize_json("-m", str(path), "-t", text, flag)
        assert doc["ids"] == model.tokenize(text.encode(), add_bos=add, special=False), (vocab, flag)


@pytest.mark.real
def test_encoder_vocabularies_tokenize_without_a_runnable_family(llama_vocab_dir):
    # bert-bge (architecture bert) and nomic-bert-moe cannot run, but they tokenize.
    path = llama_vocab_dir / "ggml-vocab-bert-bge.gguf"
    for text, want in _vectors(path)[:8]:
        assert tokenize_json("-m", str(path), "-t", text, "--no-special")["ids"] == want, text
    doc = tokenize_json("-m", str(path), "-t", "Hello world")
    assert doc["tokens"] == ["[CLS]", "hello", "world", "[SEP]"]
    doc = tokenize_json("-m", str(llama_vocab_dir / "ggml-vocab-nomic-bert-moe.gguf"), "-t", "Hello world")
    assert doc["tokens"][0] == "<s>" and doc["tokens"][-1] == "</s>"


@pytest.mark.real
def test_plain_output_and_pieces(llama_vocab_dir):
    path = str(llama_vocab_dir / "ggml-vocab-gpt-2.gguf")
    doc = tokenize_json("-m", path, "-t", TEXT)
    done = ster("tokenize", "-m", path, "-t", TEXT)
    assert done.returncode == 0, done.stderr
    assert done.stdout == " ".join(map(str, doc["ids"])) + "\n"
    assert f"{doc['count']} tokens" in done.stderr
    done = ster("tokenize", "-m", path, "-t", TEXT, "--pieces")
    rows = [line.split("\t") for line in done.stdout.splitlines()]
    assert [int(i) for i, _ in rows] == doc["ids"]
    assert [json.loads(p) for _, p in rows] == doc["tokens"]


# ----------------------------------------------------------------- a real GGUF model

@pytest.mark.real
def test_parse_special_on_a_real_gguf_equals_llama_cpp(smollm2_gguf):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is the oracle here")
    model = llama_cpp.Llama(str(smollm2_gguf), vocab_only=True, verbose=False)
    for flags, parse in (([], False), (["--no-parse-special"], False), (["--parse-special"], True)):
        for special, add in (("--special", True), ("--no-special", False)):
            got = tokenize_json("-m", str(smollm2_gguf), "-t", TEXT, special, *flags)["ids"]
            assert got == model.tokenize(TEXT.encode(), add_bos=add, special=parse), (flags, special)
    parsed = tokenize_json("-m", str(smollm2_gguf), "-t", TEXT, "--parse-special")
    assert "<|im_start|>" in parsed["tokens"] and "<|im_end|>" in parsed["tokens"]


@pytest.mark.real
def test_detokenize_round_trip_and_skip_special(smollm2_gguf):
    ids = tokenize_json("-m", str(smollm2_gguf), "-t", TEXT, "--parse-special")["ids"]
    done = ster("detokenize", "-m", str(smollm2_gguf), *map(str, ids))
    assert done.returncode == 0, done.stderr
    assert done.stdout == TEXT + "\n"  # byte-level BPE decodes exactly
    doc = json.loads(ster("detokenize", "-m", str(smollm2_gguf), ",".join(map(str, ids)), "--json",
                          "--skip-special").stdout)
    assert doc["text"] == TEXT.replace("<|im_start|>", "").replace("<|im_end|>", "")
    assert doc["ids"] == ids and doc["count"] == len(ids)


@pytest.mark.real
def test_special_id_outside_the_vocabulary_is_a_warning_without_the_weights_too(smollm2_gguf, tmp_path):
    """A GGUF whose bos_token_id is outside its vocabulary: loading ignores the id with a warning (generate,
    perplexity, capture showed it); tokenize, detokenize and inspect used the default id and said nothing."""
    from gguf_craft import BOOL, U32, edit_metadata

    path = tmp_path / "bad-bos.gguf"
    path.write_bytes(edit_metadata(smollm2_gguf.read_bytes(), {"tokenizer.ggml.bos_token_id": (U32, 10**9),
                                                               "tokenizer.ggml.add_bos_token": (BOOL, True)}))
    note = "tokenizer.ggml.bos_token_id = 1000000000 is outside the vocabulary of 49152 tokens"
    for args in (("tokenize", "-m", path, "-t", "hello", "-q"), ("detokenize", "-m", path, "11", "-q"),
                 ("inspect", path, "-q"), ("inspect", path, "--json", "-q")):
        done = ster(*map(str, args))
        assert done.returncode == 0, (args, done.stderr)
        assert done.stderr.count("warning:") == 1 and note in " ".join(done.stderr.split()), (args, done.stderr)
    assert json.loads(done.stdout)["warnings"] == [
        f"{note}; ignored, using the default id 11 (as llama.cpp does); the GGUF file is inconsistent"]
    assert json.loads(ster("inspect", str(smollm2_gguf), "--json", "-q").stdout)["warnings"] == []


# ------------------------------------------------------------ Hugging Face directory

@pytest.mark.real
def test_hf_directory_equals_transformers(smollm2_hf, tmp_path):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(smollm2_hf))
    # Only the tokenizer files: no config.json, no weights; nothing else is needed.
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (smollm2_hf / name).is_file():
            shutil.copy(smollm2_hf / name, tmp_path / name)
    for model in (str(smollm2_hf), str(tmp_path)):
        assert tokenize_json("-m", model, "-t", TEXT, "--parse-special")["ids"] == reference(TEXT)["input_ids"]
        assert tokenize_json("-m", model, "-t", TEXT)["ids"] == reference(
            TEXT, split_special_tokens=True)["input_ids"]
    ids = reference(TEXT)["input_ids"]
    doc = json.loads(ster("detokenize", "-m", str(tmp_path), "--json", *map(str, ids)).stdout)
    assert doc["text"] == reference.decode(ids)


# ------------------------------------------------------------------ input and errors

@pytest.mark.real
def test_file_input_equals_text_input(llama_vocab_dir, tmp_path):
    path = str(llama_vocab_dir / "ggml-vocab-qwen2.gguf")
    text_file = tmp_path / "in.txt"
    text_file.write_text(TEXT + "\nsecond line\n", encoding="utf-8")
    assert tokenize_json("-m", path, "--file", str(text_file))["ids"] == \
        tokenize_json("-m", path, "--text", TEXT + "\nsecond line\n")["ids"]
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("café".encode("latin-1"))
    done = ster("tokenize", "-m", path, "--file", str(bad))
    assert done.returncode == 1 and "is not UTF-8 text" in done.stderr
    done = ster("tokenize", "-m", path, "--file", str(tmp_path / "missing.txt"))
    assert done.returncode == 1 and "cannot read" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.real
def test_detokenize_refuses_an_empty_item_naming_its_position(llama_vocab_dir):
    """`ster detokenize 1,,2` decoded 1 and 2, skipping the empty item in silence (a lost id in a pasted list)."""
    path = str(llama_vocab_dir / "ggml-vocab-llama-spm.gguf")
    for args, message in ((("1,,2",), "'1,,2': item 2 is empty"), (("5", "1,2,"), "'1,2,': item 4 is empty"),
                          ((",7",), "',7': item 1 is empty"), (("[1, , 2]",), "item 2 is empty")):
        done = ster("detokenize", "-m", path, *args)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith("error:"), (args, done.stderr)
        assert message in lines[0], (args, done.stderr)
    ids = [json.loads(ster("detokenize", "-m", path, "--json", *args).stdout)["ids"]
           for args in (("[1, 2, 3]",), ("1, 2", "3"), ("1 2 3",))]
    assert ids == [[1, 2, 3]] * 3


@pytest.mark.real
def test_detokenize_refuses_an_unbalanced_bracket(llama_vocab_dir):
    """`ster detokenize "[1,2"` decoded 1 and 2: brackets were stripped from either end, any number of them. A list
    is one pair of brackets (tokenize --json's ids; unquoted, `[1 2 3]` arrives as three arguments)."""
    from ster_py.cli_text import _parse_ids

    for args, message in ((("[1,2",), "'[1,2': the '[' is never closed"), (("1,2]",), "'1,2]': a ']' closes no '['"),
                          (("[1", "[2]"), "'[2]': a second '[' before the one of '[1' is closed"),
                          (("[[1]]",), "'[[1]]': a bracket inside the ids")):
        with pytest.raises(SterError, match=re.escape(message)):
            _parse_ids(list(args), 100)
    assert [_parse_ids(args, 100) for args in (["[1,2]"], ["[1", "2", "3]"], ["[1]", "[2]"], ["[", "1", "]"])] == \
        [[1, 2], [1, 2, 3], [1, 2], [1]]
    done = ster("detokenize", "-m", str(llama_vocab_dir / "ggml-vocab-llama-spm.gguf"), "[1,2")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: '[1,2': the '[' is never closed")


def test_errors_are_one_line(llama_vocab_dir, tmp_path):
    from gguf_craft import STRING, edit_metadata

    path = str(llama_vocab_dir / "ggml-vocab-llama-spm.gguf")
    unknown_pre = tmp_path / "unknown-pre.gguf"  # a name llama.cpp 0.3.36 does not know either
    unknown_pre.write_bytes(edit_metadata((llama_vocab_dir / "ggml-vocab-falcon.gguf").read_bytes(),
                                          {"tokenizer.ggml.pre": (STRING, "falcon9")}))
    cases = [
        (("tokenize", "-m", path), "exactly one of --text STRING or --file FILE"),
        (("tokenize", "-m", path, "-t", "a", "-f", path), "exactly one of --text STRING or --file FILE"),
        (("tokenize", "-m", str(tmp_path / "missing.gguf"), "-t", "a"), "no such file or directory"),
        (("detokenize", "-m", path, "1", "x2"), "'x2' is not a token id"),
        (("detokenize", "-m", path, "1", "32000"), "token id 32000 is outside this vocabulary (ids 0..31999)"),
        (("detokenize", "-m", path, "--", "-3"), "token id -3 is outside this vocabulary"),
        (("tokenize", "-m", str(unknown_pre), "-t", "a"), "unsupported pre-tokenizer 'falcon9'"),
    ]
    for args, message in cases:
        done = ster(*args)
        assert done.returncode == 1, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], (args, done.stderr)
