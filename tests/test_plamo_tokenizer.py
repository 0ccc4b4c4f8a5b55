"""PLaMo's own tokenizer (tokenizer.jsonl), from the directory and from llama.cpp's ``plamo2`` GGUF vocabulary.

The oracle is llama.cpp 0.3.36: a tiny PLaMo 3 checkpoint (test_parity_remote_b's builder) gets a small
tokenizer.jsonl written here (control pieces, the 256 byte pieces, ASCII, words, Japanese, digits, some
characters left without a piece), and the pinned converter's own vocabulary step (``_set_vocab_plamo``)
writes it to GGUF, padding the vocabulary to the model's. ster's ids from the directory and from the GGUF
must equal llama.cpp's ``llama_tokenize`` on texts with unicode, spaces, digits and characters spelled as
bytes. PLaMo's Python tokenizer also splits off ``<|plamo:...|>`` markers and the break-around stretches of
tokenizer_config.json before its search, which llama.cpp does not: those are checked against llama.cpp's
ids of the pieces cut by the seed's rule, concatenated.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from ster_py.errors import SterError
from ster_py.tokenizer import Tokenizer
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)

CONTROL = ["<|plamo:unk|>", "<|plamo:bos|>", "<|plamo:eos|>", "<|plamo:pad|>", "<|plamo:op|>"]
MISSING = set("~`@é🦙")  # characters with no piece: spelled as their UTF-8 bytes
WORDS = ["the", " the", " a", "he", "ll", "llo", "Hello", " world", "wor", "ld", "12", "123", "00", "  ", "   ",
         "\n", "\n\n", " is", "is", "ing", " test", "test", "日", "本", "日本", "語", "日本語", "こ", "ん", "に", "ち",
         "は", "こん", "にち", "こんにちは", "の", "テ", "キ", "ス", "ト", "テキスト", "ä", "ö", " ä", "ab", "abc",
         "bc", "aa", "aaa"]
MODEL_VOCAB = 448  # more than the pieces: the converter pads with [PADn] rows

TEXTS = ["Hello world", "the 123 0042 numbers 9999", "  leading and   multiple spaces  ", "日本語のテキスト こんにちは",
         "café naïve ä ö", "a llama 🦙 and ~`@ signs", "tabs\tand\nnew\n\nlines\n", "<0x41> is spelled as text",
         "<|plamo:op|>after a control piece", "ｆｕｌｌ width ＡＢＣ", " ", "x", "aaaaaaa bbbb abcabc",
         "Hello<|plamo:eos|>world", "\u00a0non-breaking\u2003em space", "mixed日本English123テキスト"]
TIES = {"aaaaaaa bbbb abcabc"}  # a + aaa + aaa: the pieces' order is a tie


def _rows(seed: int = 0) -> list[list]:
    rng = np.random.RandomState(seed)
    rows = [[t, 0.0, "UNKNOWN" if i == 0 else "CONTROL"] for i, t in enumerate(CONTROL)]
    rows += [[f"<0x{b:02X}>", 0.0, "BYTE"] for b in range(256)]
    chars = [chr(c) for c in range(0x20, 0x7F) if chr(c) not in MISSING]
    for piece in chars + [w for w in WORDS if w not in chars]:
        rows.append([piece, round(float(rng.uniform(-12.0, -1.0)), 4), "NORMAL"])
    return rows


def _write_tokenizer(path, rows, **config) -> None:
    (path / "tokenizer.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                          encoding="utf-8")
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Plamo3Tokenizer", "unk_token": CONTROL[0], "bos_token": CONTROL[1],
        "eos_token": CONTROL[2], "pad_token": CONTROL[3], "add_bos_token": False, "add_eos_token": False,
        **config}))


def _build(path, model_type: str, config: dict):
    from test_parity_remote_b import _plamo3

    model = _plamo3(path, dict(config))
    for name in ("tokenizer.json", "special_tokens_map.json", "chat_template.jinja"):
        (path / name).unlink(missing_ok=True)  # the tiny word-level tokenizer's files: PLaMo's replace them
    _write_tokenizer(path, _rows())
    return model


@pytest.fixture(scope="module")
def plamo(tmp_path_factory):
    """(checkpoint directory, its GGUF from llama.cpp's converter with the converter's own PLaMo vocabulary)."""
    from llamacpp_convert import convert_cases

    cases = {"plamo3-tok": ("plamo3", dict(num_hidden_layers=2, sliding_window_pattern=2, window_size=6,
                                           rope_local_theta=1000.0, scale_embedding=False, vocab_size=MODEL_VOCAB),
                            {"_llamacpp_own_vocab": True})}
    root = tmp_path_factory.mktemp("plamo_tok")
    path, _ = convert_cases(root, cases, _build)["plamo3-tok"]
    return root / "hf" / "plamo3-tok", path


@pytest.fixture(scope="module")
def llama_ids(plamo):
    from ster_py import llamacpp

    return llamacpp.tokenize(plamo[1], TEXTS, parse_special=True)


def _gguf_parts(path):
    from ster_py.gguf.reader import GGUFFile
    from ster_py.gguf.tokenizer import tokenizer_from_gguf_metadata

    return tokenizer_from_gguf_metadata(dict(GGUFFile(str(path), allow_unsupported=True).metadata))


def _score(ids: list[int]) -> int:
    """A split's summed score as PLaMo's code and llama.cpp sum it: integers of 1e-4 (byte tokens excluded:
    both splits spell the same uncovered characters)."""
    rows = _rows()
    return sum(round(rows[i][1] * 1e4) for i in ids if rows[i][2] != "BYTE")


def _check(ids: list[int], want: list[int], text: str) -> None:
    """ster's ids equal llama.cpp's, except on a tie (seed 002: equally scored splits may resolve differently;
    tokenizers keeps the longest last piece, llama.cpp the longest first): then only the texts in TIES may
    differ, and only by the order of equally scored pieces."""
    if text in TIES:
        assert ids != want and sorted(ids) == sorted(want) and _score(ids) == _score(want), text
    else:
        assert ids == want, text


def test_directory_tokenizer_equals_llama_cpp(plamo, llama_ids):
    directory, _ = plamo
    tok = Tokenizer.from_dir(directory)
    assert tok.vocab_size == len(_rows())
    bytes_seen = False
    for text, want in zip(TEXTS, llama_ids):
        ids = tok.encode(text, add_special_tokens=False)
        _check(ids, want, text)
        bytes_seen |= any(tok.id_to_token(i).startswith("<0x") for i in ids)
        assert tok.decode(ids) == text
    assert bytes_seen  # the byte fallback was exercised
    assert tok.encode("Hello") == tok.encode("Hello", add_special_tokens=False)  # add_bos_token false
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)


def test_gguf_plamo2_vocabulary_equals_llama_cpp(plamo, llama_ids):
    from ster_py import llamacpp

    _, gguf = plamo
    parts = _gguf_parts(gguf)
    assert parts.model == "plamo2" and parts.tokenizer.get_vocab_size() == MODEL_VOCAB
    for text, want in zip(TEXTS, llama_ids):
        _check(parts.tokenizer.encode(text, add_special_tokens=False).ids, want, text)
    # with special tokens added: llama.cpp adds none for this vocabulary, nor does ster
    with_special = llamacpp.tokenize(gguf, TEXTS[:3], add_special=True, parse_special=True)
    assert [parts.tokenizer.encode(t).ids for t in TEXTS[:3]] == with_special == llama_ids[:3]
    assert parts.add_bos is False and parts.eos_token_id == 2 and 4 in parts.eos_token_ids  # <|plamo:op|>: eot


def test_models_load_with_the_plamo_tokenizer(plamo, llama_ids):
    from ster_py.load import load_model

    directory, gguf = plamo
    for where in (directory, gguf):
        model = load_model(str(where))
        assert model.spec.model_type == "plamo3"
        assert model.tokenizer.encode(TEXTS[3], add_special_tokens=False) == llama_ids[3], where


def test_bos_added_under_add_bos_token(plamo, llama_ids, tmp_path):
    _write_tokenizer(tmp_path, _rows(), add_bos_token=True)
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.encode(TEXTS[0]) == [1] + llama_ids[0]
    assert tok.encode("<|plamo:bos|>" + TEXTS[0]) == [1] + llama_ids[0]  # never a second BOS


def _cut_and_join(gguf, texts, pattern: str) -> list[list[int]]:
    """llama.cpp's ids of each text cut by ``pattern`` (the matches isolated), concatenated."""
    from ster_py import llamacpp

    pieces = []
    for t in texts:
        cuts = [0] + [i for m in re.finditer(pattern, t) for i in m.span()] + [len(t)]
        pieces.append([t[a:b] for a, b in zip(cuts, cuts[1:]) if b > a])
    flat = [p for ps in pieces for p in ps]
    ids = iter(llamacpp.tokenize(gguf, flat, parse_special=True))
    return [[i for _ in ps for i in next(ids)] for ps in pieces]


def test_break_around_thresholds_and_markers_cut_the_text_first(plamo, tmp_path):
    """tokenizer_config.json's break_around_repeated_chars_threshold (3) and
    break_around_consecutive_spaces_threshold (2), and an unknown <|plamo:...|> marker: each stretch is
    tokenized on its own (seed 002; PLaMo's tokenization_plamo.py), so the ids are llama.cpp's ids of
    the cut pieces."""
    _, gguf = plamo
    _write_tokenizer(tmp_path, _rows(), break_around_repeated_chars_threshold=3,
                     break_around_consecutive_spaces_threshold=2)
    tok = Tokenizer.from_dir(tmp_path)
    # (runs of characters with no longer piece: a run of a's would be a tie, see TIES)
    texts = ["Hellooo zzzz bbbb", "x  y   z", "Hello....world", "say <|plamo:nope|>Hello", "ab  zzz-x"]
    # Python's rule, written from the seed: runs of >= 3 equal characters, or >= 2 spaces
    marker = r"<\|plamo:[^|\s]{0,64}\|>"
    want = _cut_and_join(gguf, texts, r"(?:" + marker + r")|(?:(?P<c>.)(?P=c){2,}| {2,})")
    got = [tok.encode(t, add_special_tokens=False) for t in texts]
    assert got == want
    plain = Tokenizer.from_dir(plamo[0])
    assert [plain.encode(t, add_special_tokens=False) for t in texts] != want  # the cuts matter here


@pytest.mark.parametrize("line,match", [
    ('["a", "x", "NORMAL"]', "score 'x' is not a finite number"),
    ('["a", 1.0, "WEIRD"]', "kind 'WEIRD' is none of"),
    ('{"a": 1}', "is not a \\[piece, score, kind\\] row"),
    ('["", 1.0]', "piece is not a string of 1..1024"),
    ('["<0xZZ>", 0.0, "BYTE"]', "BYTE row whose piece"),
    ('["a", NaN]', "not a finite number"),
    ("[[[[" * 5000, "not JSON|characters long"),
    ('not json', "not JSON"),
])
def test_a_bad_row_is_refused_by_line(tmp_path, line, match):
    rows = _rows()
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows[:300]) + line + "\n"
    (tmp_path / "tokenizer.jsonl").write_text(text, encoding="utf-8")
    with pytest.raises(SterError, match=match):
        Tokenizer.from_dir(tmp_path)


def test_missing_byte_and_duplicate_piece_are_refused(tmp_path):
    rows = _rows()
    _write_tokenizer(tmp_path, [r for r in rows if r[0] != "<0x7F>"])
    with pytest.raises(SterError, match="byte <0x7F> has no BYTE piece"):
        Tokenizer.from_dir(tmp_path)
    _write_tokenizer(tmp_path, rows + [["the", -1.0, "NORMAL"]])
    with pytest.raises(SterError, match="piece 'the' is listed twice"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.jsonl").write_bytes(b"\xff\xfe not utf-8\n")
    with pytest.raises(SterError, match="not UTF-8"):
        Tokenizer.from_dir(tmp_path)


def test_tokenize_command_reads_a_jsonl_only_directory(plamo, llama_ids, tmp_path):
    import subprocess
    import sys

    _write_tokenizer(tmp_path, _rows())
    r = subprocess.run([sys.executable, "-m", "ster_py.entry", "tokenize", "-m", str(tmp_path), "-t", TEXTS[1],
                        "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ids"] == llama_ids[1]
