"""ster_py.gguf.tokenizer against its oracles.

- Real files (SmolLM2: gpt2/smollm; Gemma 3: SentencePiece): token ids equal
  transformers' GGUF tokenizer (``AutoTokenizer.from_pretrained(dir, gguf_file=...)``, as the session
  fixture saved it) on 40 texts, with and without special tokens.
- llama.cpp's own tokenizer test vectors (``models/ggml-vocab-*.gguf`` with their
  ``.inp``/``.out`` files, shipped in the llama-cpp-python 0.3.36 sdist): ids equal
  llama.cpp's for all 14 vocabularies there (gpt-2, llama-bpe, qwen2, qwen35,
  starcoder, refact, command-r, mpt, falcon, deepseek-llm, deepseek-coder, llama-spm,
  phi-3, gemma-4, bert-bge), tokenized as llama.cpp's test-tokenizer-0 does (no BOS,
  special texts not parsed).
- llama.cpp's round-trip test (test-tokenizer-1-spm, the one its CMake runs, on
  llama-spm): every token's text and every code point tokenizes and decodes back.
- WordPiece (bert-bge) also against transformers' BertTokenizerFast over the same
  vocabulary; Unigram (t5) against llama.cpp itself on nomic-bert-moe's real
  250k-piece vocabulary and on a SentencePiece model trained in the test (and
  against sentencepiece wherever llama.cpp agrees with it).
- llama.cpp itself (llama-cpp-python), when it is importable.

Every ``tokenizer.ggml.pre`` name against llama.cpp: tests/test_gguf_pretokenizers.py.

The metadata is read with gguf-py's ``GGUFReader`` (``_read_metadata``), not with
ster's own reader, so a reader bug cannot hide a tokenizer bug here.
"""
from __future__ import annotations

import functools
import hashlib
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from ster_py.errors import SterError
from ster_py.gguf.tokenizer import (
    END_OF_GENERATION_TEXTS,
    PRE_TOKENIZERS,
    split_pre_tokenizer,
    tokenizer_from_gguf_metadata,
)

# ----------------------------------------------------------------------- inputs

TEXTS = [
    "",
    "Hello world",
    " Hello world",
    "Hello, world! How are you?",
    "The quick brown fox jumps over the lazy dog.",
    "naïve café résumé Ångström",
    "Über straße Ærøskøbing",
    "日本語のテキストです。",
    "中文测试，你好世界！",
    "한국어 문장입니다",
    "Привет, мир!",
    "emoji 🦙🚀👍🏽 and 👨‍👩‍👧",
    "😀",
    "1234567890",
    "3.14159 + 2718281828 = 5859",
    " 12 345 6789",
    "a  b   c    d",
    "     leading spaces",
    "trailing spaces   ",
    "   ",
    "\n",
    "line1\nline2\n\nline3\n\n\n",
    "\ttab\t\tdouble tab",
    "mixed \t \n whitespace\r\n",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    '{"key": [1, 2, 3], "nested": {"a": null}}',
    "I'm sure they'll've done it, can't you?",
    "HTTPServer URLs camelCaseWords ALLCAPS",
    "¡¿Qué?! — «quotes» “curly” ‘single’ …",
    "\u00a0non-breaking\u00a0space and zero\u200bwidth",
    "x" * 50,
    # special tokens inside text (each file has one family of them)
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>more",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<end_of_turn> after",
    "<|endoftext|>",
    "<bos>already has a bos",
    "<eos>",
]


# --------------------------------------------------------------- metadata reading

@functools.lru_cache(maxsize=None)
def _read_metadata(path: str) -> dict:
    """GGUF metadata as a plain dict, read with ster's reader (tested against gguf-py in
    test_gguf_reader.py; gguf-py itself takes tens of seconds on a 262k-token vocabulary)."""
    from ster_py.gguf.reader import GGUFFile

    return dict(GGUFFile(path, allow_unsupported=True).metadata)


@functools.lru_cache(maxsize=None)
def _parts(path: str):
    # for_generation=False: the WordPiece vocabulary has no end-of-generation token.
    return tokenizer_from_gguf_metadata(_read_metadata(path), for_generation=False)


def _encode_unparsed(tk, text: str, add_special_tokens: bool = False) -> list[int]:
    """Ids with special-token texts read as plain text (llama.cpp's parse_special=false)."""
    tk.encode_special_tokens = True
    try:
        return tk.encode(text, add_special_tokens=add_special_tokens).ids
    finally:
        tk.encode_special_tokens = False


# GGUF path -> the session fixture's Hugging Face copy of it, whose tokenizer files are transformers' GGUF
# tokenizer (``from_pretrained(dir, gguf_file=...)``) as saved by ``save_pretrained`` when the fixture was built
# (scripts/real_models.build_hf_copy); loading them skips rebuilding it from the 262k-token metadata per run.
_READING: dict[str, Path] = {}


@functools.lru_cache(maxsize=None)
def _transformers_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(_READING[path]))


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def real_gguf(request) -> str:
    path = str(request.getfixturevalue(f"{request.param}_gguf"))
    _READING[path] = request.getfixturevalue(f"{request.param}_hf")
    return path


# ------------------------------------------------------------- real files vs HF

@pytest.mark.real
@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_ids_equal_transformers_gguf_tokenizer(real_gguf, add_special_tokens):
    ours = _parts(real_gguf).tokenizer
    reference = _transformers_tokenizer(real_gguf)
    mismatches = []
    for text in TEXTS:
        got = ours.encode(text, add_special_tokens=add_special_tokens).ids
        want = reference(text, add_special_tokens=add_special_tokens)["input_ids"]
        if got != want:
            mismatches.append((text, got, want))
    assert not mismatches, mismatches


@pytest.mark.real
def test_decode_round_trips(real_gguf):
    # Both files decode exactly: byte-level BPE always, and Gemma 3 has no space prefix to strip.
    tk = _parts(real_gguf).tokenizer
    reference = _transformers_tokenizer(real_gguf)
    for text in TEXTS:
        ids = tk.encode(text, add_special_tokens=False).ids
        assert tk.decode(ids, skip_special_tokens=False) == text
        assert reference.decode(ids) == text


@pytest.mark.real
def test_special_facts_equal_transformers(real_gguf):
    parts = _parts(real_gguf)
    reference = _transformers_tokenizer(real_gguf)
    meta = _read_metadata(real_gguf)
    assert parts.bos_token == reference.bos_token
    assert parts.eos_token == reference.eos_token
    assert parts.bos_token_id == reference.bos_token_id
    assert parts.eos_token_id == reference.eos_token_id
    # transformers applies the file's add_bos_token (both files carry the flag).
    assert parts.add_bos is bool(meta["tokenizer.ggml.add_bos_token"])
    assert (reference("a")["input_ids"][0] == reference.bos_token_id) is parts.add_bos
    assert parts.add_eos is False
    assert parts.chat_template == meta.get("tokenizer.chat_template")
    assert parts.tokenizer.get_vocab_size() == len(meta["tokenizer.ggml.tokens"]) == len(reference)


@pytest.mark.real
def test_end_of_generation_ids_of_the_real_files(smollm2_gguf, gemma3_gguf):
    # llama.cpp's end-of-generation set: eos plus the vocabulary's end-of-turn texts and
    # fill-in-the-middle pad/repo/file-separator tokens (SmolLM2's <reponame>).
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is the oracle here")
    for path, eos in ((smollm2_gguf, "<|im_end|>"), (gemma3_gguf, "<eos>")):
        parts = _parts(str(path))
        model = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
        vocab = llama_cpp.llama_model_get_vocab(model.model)
        want = {i for i in range(llama_cpp.llama_vocab_n_tokens(vocab)) if llama_cpp.llama_vocab_is_eog(vocab, i)}
        assert parts.eos_token == eos and parts.eos_token_ids == want, path
    smol = _parts(str(smollm2_gguf))
    assert {smol.tokenizer.id_to_token(i) for i in smol.eos_token_ids} == {"<|im_end|>", "<|endoftext|>",
                                                                            "<reponame>"}
    assert _parts(str(gemma3_gguf)).chat_template is None  # the Gemma 3 file carries no template


@pytest.mark.real
def test_wrapper_never_doubles_bos(gemma3_gguf):
    parts = _parts(str(gemma3_gguf))
    wrapped = parts.to_tokenizer(source=str(gemma3_gguf))
    bos = parts.bos_token_id
    raw = parts.tokenizer.encode("<bos>hi", add_special_tokens=True).ids
    assert raw[:2] == [bos, bos]  # what a bare post-processor (and llama.cpp) does
    assert wrapped.encode("<bos>hi") == raw[1:]
    assert wrapped.encode("hi") == parts.tokenizer.encode("hi").ids
    assert wrapped.eos_token_ids >= set(parts.eos_token_ids)


# ---------------------------------------------- llama.cpp's tokenizer test vectors

_SDIST = "llama_cpp_python-0.3.36.tar.gz"
_SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
_VOCAB_MEMBER = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/"

# Vocabularies with test vectors whose scheme and pre-tokenizer we implement, and
# whether llama.cpp adds BOS for them (checked with llama-cpp-python 0.3.36:
# tokenize(b"a", add_bos=True) starts with BOS).
VECTOR_VOCABS = {
    "gpt-2": False, "llama-bpe": True, "qwen2": False, "qwen35": False, "starcoder": False, "refact": False,
    "command-r": True, "mpt": False, "falcon": False, "deepseek-llm": True, "deepseek-coder": True,
    "llama-spm": True, "phi-3": True, "gemma-4": True, "bert-bge": True,
}
# Same checks for the files without test vectors (no tokenizer.ggml.pre: the default split).
BUILD_ONLY_VOCABS = {"aquila": False, "gpt-neox": False, "baichuan": True}


@pytest.fixture(scope="session")
def llama_vocab_dir(tmp_path_factory) -> Path:
    """llama.cpp's models/ggml-vocab-* files, from the pinned llama-cpp-python sdist.

    Fetched with pip into the fixture cache on first use; a fetch that fails fails
    the test (as the real-model fixtures do).
    """
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    try:
        from real_models import fixtures_dir
    finally:
        sys.path.pop(0)
    target = fixtures_dir() / "llama-cpp-vocab-0.3.36"
    if (target / "ggml-vocab-gpt-2.gguf.out").is_file():
        return target
    sdist_dir = fixtures_dir() / "sdist"
    sdist = sdist_dir / _SDIST
    if not sdist.is_file():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python", "-q",
               "-d", str(sdist_dir), "llama-cpp-python==0.3.36"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not sdist.is_file():
            pytest.fail(f"cannot fetch {_SDIST} with pip: {done.stderr[-500:]}", pytrace=False)
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != _SDIST_SHA256:
        pytest.fail(f"{sdist} has SHA-256 {digest}, expected {_SDIST_SHA256}; delete it to refetch", pytrace=False)
    staging = tmp_path_factory.mktemp("llama-vocab")
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            name = member.name
            if name.startswith(_VOCAB_MEMBER + "ggml-vocab-") and member.isfile() and "/" not in name[len(_VOCAB_MEMBER):]:
                (staging / Path(name).name).write_bytes(tar.extractfile(member).read())
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        staging.rename(target)
    except OSError:  # another session got there first, or a different filesystem
        if not (target / "ggml-vocab-gpt-2.gguf.out").is_file():
            import shutil

            shutil.copytree(staging, target, dirs_exist_ok=True)
    return target


def _vectors(path: Path) -> list[tuple[str, list[int]]]:
    # llama.cpp's tests/test-tokenizer-0 format: texts separated by "\n__ggml_vocab_test__\n",
    # one line of ids per text: common_tokenize(ctx, text, add_special=false, parse_special=false).
    # Some .inp files end with the separator and some do not; every .out ends with a newline.
    separator = "\n__ggml_vocab_test__\n"
    inp = path.with_name(path.name + ".inp").read_text(encoding="utf-8")
    out = path.with_name(path.name + ".out").read_text(encoding="utf-8")
    texts = (inp[: -len(separator)] if inp.endswith(separator) else inp).split(separator)
    lines = out[:-1].split("\n") if out.endswith("\n") else out.split("\n")
    assert len(texts) == len(lines)
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines)]


@pytest.mark.real
@pytest.mark.parametrize("name", sorted(VECTOR_VOCABS))
def test_ids_equal_llama_cpp_test_vectors(llama_vocab_dir, name):
    path = llama_vocab_dir / f"ggml-vocab-{name}.gguf"
    parts = _parts(str(path))
    vectors = _vectors(path)
    assert len(vectors) >= 40
    mismatches = [(t, got, want) for t, want in vectors if (got := _encode_unparsed(parts.tokenizer, t)) != want]
    assert not mismatches, mismatches[:5]
    assert parts.add_bos is VECTOR_VOCABS[name]
    first = parts.tokenizer.encode("a", add_special_tokens=True).ids[0]
    assert (first == parts.bos_token_id) is VECTOR_VOCABS[name]


@pytest.mark.real
@pytest.mark.parametrize("name", sorted(BUILD_ONLY_VOCABS))
def test_vocab_files_without_vectors_build(llama_vocab_dir, name):
    parts = _parts(str(llama_vocab_dir / f"ggml-vocab-{name}.gguf"))
    assert parts.add_bos is BUILD_ONLY_VOCABS[name]
    assert parts.tokenizer.decode(parts.tokenizer.encode("Hello world 123").ids) == "Hello world 123"


# ------------------------------------------------ llama.cpp's round trip (test-tokenizer-1)

# llama.cpp's CMake runs test-tokenizer-1-spm on llama-spm only (its BPE twin and the
# other vocabularies are commented out there), so that is where it expects the round trip.
# Beyond that, the same checks pass (and are kept) for phi-3 (SentencePiece) and for
# gpt-2 and llama-bpe, two of the vocabularies its disabled BPE lines name.
ROUND_TRIP_VOCABS = ["llama-spm", "phi-3", "gpt-2", "llama-bpe"]


@pytest.mark.real
@pytest.mark.parametrize("name", ROUND_TRIP_VOCABS)
def test_round_trip_as_llama_cpp_test_tokenizer_1(llama_vocab_dir, name):
    """tests/test-tokenizer-1-spm.cpp: (1) every token's text, detokenized with specials
    rendered, tokenizes (no BOS, specials parsed) and detokenizes to the same text;
    (2) every code point outside the surrogates and U+40000..U+E0000 does too, except
    U+2581 (the ▁ that stands for a space). A token that is not whole UTF-8 (a lone byte
    >= 0x80, part of a character) is not text in Python, so (1) leaves those out, as the
    BPE variant of the test does."""
    tk = _parts(str(llama_vocab_dir / f"ggml-vocab-{name}.gguf")).tokenizer
    n = tk.get_vocab_size()
    texts = [tk.decode([i], skip_special_tokens=False) for i in range(n)]
    kept = [t for t in texts if "\ufffd" not in t]
    assert len(kept) >= 0.98 * n  # out: lone high bytes and pieces of multi-byte characters
    back = tk.decode_batch([e.ids for e in tk.encode_batch(kept, add_special_tokens=False)],
                           skip_special_tokens=False)
    assert [(t, b) for t, b in zip(kept, back) if t != b] == []

    chars = [chr(cp) for cp in range(0x110000)
             if not (0xD800 <= cp <= 0xDFFF or 0x40000 <= cp <= 0xE0000 or cp == 0x2581)]
    back = tk.decode_batch([e.ids for e in tk.encode_batch(chars, add_special_tokens=False)],
                           skip_special_tokens=False)
    assert [hex(ord(c)) for c, b in zip(chars, back) if c != b] == []


@pytest.mark.real
def test_vector_texts_decode_back_for_byte_level_vocabs(llama_vocab_dir):
    # Byte-level BPE loses nothing: the .out ids of every text decode to the text itself.
    for name in ("gpt-2", "llama-bpe", "qwen2", "starcoder", "refact", "mpt", "command-r", "qwen35", "falcon",
                 "deepseek-llm", "deepseek-coder"):
        tk = _parts(str(llama_vocab_dir / f"ggml-vocab-{name}.gguf")).tokenizer
        for text, ids in _vectors(llama_vocab_dir / f"ggml-vocab-{name}.gguf"):
            assert tk.decode(ids, skip_special_tokens=False) == text, (name, text)


# --------------------------------------------------------------- WordPiece (bert)

def _hf_wordpiece_vocab(meta: dict) -> list[str]:
    # llama.cpp's converter wrote word-initial pieces as ▁w and continuations ##w as w.
    out = []
    for text, kind in zip(meta["tokenizer.ggml.tokens"], np.asarray(meta["tokenizer.ggml.token_type"]).tolist()):
        out.append(text if kind in (2, 3) else text[1:] if text.startswith("\u2581") else "##" + text)
    return out


@pytest.mark.real
def test_wordpiece_equals_transformers_bert_tokenizer(llama_vocab_dir, tmp_path):
    from transformers import BertTokenizerFast

    path = llama_vocab_dir / "ggml-vocab-bert-bge.gguf"
    (tmp_path / "vocab.txt").write_text("\n".join(_hf_wordpiece_vocab(_read_metadata(str(path)))) + "\n",
                                        encoding="utf-8")
    reference = BertTokenizerFast(str(tmp_path / "vocab.txt"), do_lower_case=True)
    parts = _parts(str(path))
    texts = [t for t, _ in _vectors(path)] + TEXTS + ["[CLS] a [SEP] b [MASK]", "ÀÉÎÕÜ Ñ ç"]
    for text in texts:
        # transformers makes words over 100 characters [UNK]; ster (like llama.cpp) splits them up to 500.
        if any(len(w) > 100 for w in text.split()):
            continue
        assert parts.tokenizer.encode(text).ids == reference(text)["input_ids"], text
        assert _encode_unparsed(parts.tokenizer, text) == reference(text, add_special_tokens=False,
                                                                  split_special_tokens=True)["input_ids"], text
    ids = parts.tokenizer.encode("Hello, world! It is 3.14").ids
    assert parts.tokenizer.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)
    assert (parts.bos_token_id, parts.sep_token_id, parts.add_bos, parts.add_sep) == (101, 102, True, True)


@pytest.mark.real
def test_wordpiece_equals_llama_cpp_with_specials(llama_vocab_dir):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is the oracle here")
    path = str(llama_vocab_dir / "ggml-vocab-bert-bge.gguf")
    model = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    tk = _parts(path).tokenizer
    for text in TEXTS + ["Hello, world! [CLS] x [SEP]"]:
        if any("\uac00" <= c <= "\ud7a3" for c in text):
            # Known difference: llama.cpp drops the vowel and final jamo of decomposed Hangul
            # syllables; ster keeps them, as transformers' BertTokenizerFast does (tested above).
            continue
        for add in (True, False):
            assert tk.encode(text, add_special_tokens=add).ids == model.tokenize(text.encode(), add_bos=add,
                                                                                  special=True), (text, add)
            assert _encode_unparsed(tk, text, add) == model.tokenize(text.encode(), add_bos=add, special=False)


# --------------------------------------------------------------- Unigram (t5)

UNIGRAM_TEXTS = TEXTS + ["  two  spaces  ", "   ", " lead", "trail ",
                         "\ufb01 \u00bd \u2460 \uff28\uff45\uff4c\uff4c\uff4f", "\u3000full width",
                         "zzz unknown qqq", "tab\there\n", "x<extra_id_0>y", "</s> end", "x<mask>y", "caf\u0065\u0301",
                         "line\r\nbreaks\r\n\r\n"]


@pytest.mark.real
def test_unigram_vocab_equals_llama_cpp(llama_vocab_dir):
    """nomic-bert-moe: a real T5-scheme vocabulary (XLM-R's 250k pieces, with a
    precompiled character map). llama.cpp's own tokenizer is the oracle."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is the oracle here (no vectors ship)")
    path = str(llama_vocab_dir / "ggml-vocab-nomic-bert-moe.gguf")
    model = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    parts = _parts(path)
    assert parts.model == "t5"
    tk = parts.tokenizer
    for text in UNIGRAM_TEXTS:
        for add in (True, False):
            assert tk.encode(text, add_special_tokens=add).ids == model.tokenize(text.encode(), add_bos=add,
                                                                                  special=True), (text, add)
            if not any(c in text for c in CONTROL_TEXTS):
                assert _encode_unparsed(tk, text, add) == model.tokenize(text.encode(), add_bos=add,
                                                                         special=False), text


# Known difference: with special texts left unparsed, llama.cpp's Unigram search never
# uses control pieces, while tokenizers' Unigram can pick one whose text appears in the
# input (keeping the unknown-character penalty exact needs them in its lattice).
CONTROL_TEXTS = ("</s>", "<s>", "<pad>", "<mask>", "<unk>")


@functools.lru_cache(maxsize=None)
def _trained_sentencepiece() -> bytes:
    """A SentencePiece Unigram model trained here (nmt_nfkc rules, a user-defined piece)."""
    import io
    import random

    spm = pytest.importorskip("sentencepiece")

    rng = random.Random(0)
    words = ("the quick brown fox jumps over lazy dog na\u00efve caf\u00e9 r\u00e9sum\u00e9 \u00c5ngstr\u00f6m "
             "\u6771\u4eac \u65e5\u672c\u8a9e \ud14d\uc2a4\ud2b8 \u041f\u0440\u0438\u0432\u0435\u0442 \u00bd \u2460 "
             "\ufb01 \uff28\uff45\uff4c\uff4c\uff4f 1234 3.14 don't").split()
    corpus = [t for t in TEXTS if t.strip()] * 3
    corpus += [" ".join(rng.choice(words) for _ in range(rng.randint(1, 12))) for _ in range(3000)]
    proto_bytes = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=proto_bytes, vocab_size=400,
                                   model_type="unigram", hard_vocab_limit=False, num_threads=1,
                                   user_defined_symbols=["<extra_id_0>"], minloglevel=2)
    return proto_bytes.getvalue()


def _trained_unigram(tmp_path: Path, add_space_prefix: bool = True, remove_extra_whitespaces: bool = True):
    """The trained model with these normalizer flags, its GGUF metadata as llama.cpp's T5
    converter writes it, and a vocabulary-only GGUF file of it."""
    spm = pytest.importorskip("sentencepiece")
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(_trained_sentencepiece())
    proto.normalizer_spec.add_dummy_prefix = add_space_prefix
    proto.normalizer_spec.remove_extra_whitespaces = remove_extra_whitespaces
    sp = spm.SentencePieceProcessor(model_proto=proto.SerializeToString())
    n = sp.vocab_size()
    types = [2 if sp.IsUnknown(i) else 3 if sp.IsControl(i) else 5 if sp.IsUnused(i) else 6 if sp.IsByte(i)
             else 4 if proto.pieces[i].type == proto.pieces[i].USER_DEFINED else 1 for i in range(n)]
    tokens = [sp.IdToPiece(i) for i in range(n)]
    scores = [sp.GetScore(i) for i in range(n)]
    spec = proto.normalizer_spec
    meta = {"tokenizer.ggml.model": "t5", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": np.array(scores, dtype=np.float32),
            "tokenizer.ggml.token_type": np.array(types, dtype=np.int32),
            "tokenizer.ggml.add_space_prefix": spec.add_dummy_prefix,
            "tokenizer.ggml.remove_extra_whitespaces": spec.remove_extra_whitespaces,
            "tokenizer.ggml.precompiled_charsmap": np.frombuffer(spec.precompiled_charsmap, dtype=np.uint8),
            "tokenizer.ggml.unknown_token_id": sp.unk_id(), "tokenizer.ggml.bos_token_id": sp.bos_id(),
            "tokenizer.ggml.eos_token_id": sp.eos_id()}
    import gguf

    # A vocabulary-only file llama.cpp loads: a minimal llama header, the T5 tokenizer keys.
    path = tmp_path / "t5-vocab.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_context_length(512)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(64)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("t5")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_add_space_prefix(spec.add_dummy_prefix)
    w.add_remove_extra_whitespaces(spec.remove_extra_whitespaces)
    w.add_precompiled_charsmap(spec.precompiled_charsmap)
    w.add_unk_token_id(sp.unk_id())
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sp, meta, path


@pytest.mark.parametrize("add_space_prefix,remove_extra_whitespaces", [(True, True), (False, False), (True, False),
                                                                     (False, True)])
def test_unigram_equals_llama_cpp_and_sentencepiece(tmp_path, add_space_prefix, remove_extra_whitespaces):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is the oracle here")
    sp, meta, path = _trained_unigram(tmp_path, add_space_prefix, remove_extra_whitespaces)
    parts = tokenizer_from_gguf_metadata(meta)
    assert (parts.model, parts.add_bos, parts.add_eos, parts.add_space_prefix) == ("t5", False, True,
                                                                                  add_space_prefix)
    # The same metadata read back from the written file gives the same tokenizer.
    assert _read_metadata(str(path))["tokenizer.ggml.precompiled_charsmap"].tobytes() == \
        meta["tokenizer.ggml.precompiled_charsmap"].tobytes()
    model = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    tk = parts.tokenizer
    agree_with_spm = 0
    for text in UNIGRAM_TEXTS:
        want = model.tokenize(text.encode(), add_bos=False, special=True)
        assert tk.encode(text, add_special_tokens=False).ids == want, text
        if not any(c in text for c in CONTROL_TEXTS):
            assert _encode_unparsed(tk, text) == model.tokenize(text.encode(), add_bos=False, special=False), text
        assert tk.encode(text).ids == model.tokenize(text.encode(), add_bos=True, special=True), text
        # sentencepiece itself, wherever llama.cpp reproduces it (llama.cpp breaks score ties
        # its own way and restarts the ▁ prefix after a user-defined piece).
        if want == sp.encode(text):
            agree_with_spm += 1
    # With remove_extra_whitespaces but no space prefix llama.cpp still puts ▁ before the
    # first word (its merge mode prepends one to every word); sentencepiece does not.
    # (It decodes that ▁ to a leading space, as llama.cpp's detokenizer does too.)
    if add_space_prefix or not remove_extra_whitespaces:
        assert agree_with_spm >= len(UNIGRAM_TEXTS) - 6
        for text in ("Hello world", "na\u00efve caf\u00e9", "  two  spaces  "):
            ids = tk.encode(text, add_special_tokens=False).ids
            assert tk.decode(ids) == sp.decode(ids)


# ------------------------------------------- SentencePiece BPE on crafted vocabularies

def _crafted_spm(kind: str, seed: int) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece BPE vocabulary (tokens, scores, token types) made to stress the merge order.

    "ties": pieces grown by concatenating pieces, scores drawn from six values (so most merges tie and
    the leftmost pair must win), 256 byte tokens, control and user-defined tokens (▁ runs among them).
    "one-char": "c" * 1..300, the vocabulary whose merge list was largest for its size.
    """
    rng = np.random.default_rng(seed)
    head = ["<unk>", "<s>", "</s>"]
    if kind == "one-char":
        tokens = head + ["\u2581"] + ["c" * k for k in range(1, 301)]
        scores = [0.0] * 3 + [-1.0] + [-float(k % 7) for k in range(1, 301)]
        return tokens, scores, [2, 3, 3] + [1] * 301
    tokens = head + [f"<0x{b:02X}>" for b in range(256)] + ["<start_of_turn>", "<end_of_turn>"]
    types = [2, 3, 3] + [6] * 256 + [3, 3]
    tokens += ["\u2581\u2581", "\u2581\u2581\u2581", "<custom>"]
    types += [4, 4, 4]
    normal = list("abcx\u2581\u00e9\u65e5\n<>")
    seen = set(tokens) | set(normal)
    while len(normal) < 400:
        piece = normal[rng.integers(len(normal))] + normal[rng.integers(len(normal))]
        if len(piece) <= 7 and piece not in seen:
            seen.add(piece)
            normal.append(piece)
    tokens += normal
    types += [1] * len(normal)
    scores = [0.0] * (len(tokens) - len(normal)) + [-float(v) for v in rng.integers(0, 6, size=len(normal))]
    return tokens, scores, types


def _spm_vocab_file(path: Path, tokens, scores, types, add_space_prefix: bool) -> dict:
    """A vocabulary-only "llama" GGUF llama.cpp loads, and the same metadata as a dict."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch="llama")
    for add, value in ((w.add_context_length, 512), (w.add_embedding_length, 64), (w.add_block_count, 1),
                       (w.add_feed_forward_length, 64), (w.add_head_count, 1)):
        add(value)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_add_space_prefix(add_space_prefix)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": np.array(scores, dtype=np.float32),
            "tokenizer.ggml.token_type": np.array(types, dtype=np.int32),
            "tokenizer.ggml.add_space_prefix": add_space_prefix, "tokenizer.ggml.unknown_token_id": 0,
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}


@pytest.mark.parametrize("kind, seed, add_space_prefix", [("ties", 0, True), ("ties", 1, False),
                                                          ("one-char", 0, True)])
def test_sentencepiece_bpe_equals_llama_cpp_on_crafted_vocabularies(tmp_path, kind, seed, add_space_prefix):
    # The merge order (best score first, the leftmost pair among equals), byte fallback, the ▁ prefix of
    # every text run, and added tokens cut out of the raw text, each against llama.cpp's SPM session.
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is the oracle here")
    import random

    tokens, scores, types = _crafted_spm(kind, seed)
    meta = _spm_vocab_file(tmp_path / "spm.gguf", tokens, scores, types, add_space_prefix)
    tk = tokenizer_from_gguf_metadata(meta).tokenizer
    model = llama_cpp.Llama(str(tmp_path / "spm.gguf"), vocab_only=True, verbose=False)
    rng = random.Random(seed)
    if kind == "one-char":
        # (no character outside the vocabulary: without byte tokens llama.cpp aborts on one)
        texts = ["c" * k for k in (1, 2, 3, 7, 64, 299, 300, 301, 1200)] + ["cc cc", " c", "c  c"]
    else:
        alphabet = list("abcx  \u00e9\u65e5\n<>\u2581\u00fc") + ["\U0001f600", "<start_of_turn>", "<end_of_turn>",
                                                             "<custom>", "<s>", "</s>", "<0x41>"]
        texts = ["", " ", "  ", "a", "abc abc", "   x"]
        texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(400)]
    for text in texts:
        raw = text.encode()
        want = model.tokenize(raw, add_bos=False, special=True)
        assert tk.encode(text, add_special_tokens=False).ids == want, text
        assert tk.encode(text).ids == model.tokenize(raw, add_bos=True, special=True), text
        assert _encode_unparsed(tk, text) == model.tokenize(raw, add_bos=False, special=False), text


def test_sentencepiece_library_refusal_is_a_ster_error(monkeypatch):
    # Whatever the sentencepiece library refuses becomes one SterError, not its RuntimeError.
    from ster_py.gguf import sentencepiece_bpe

    monkeypatch.setattr(sentencepiece_bpe, "sentencepiece_model_proto", lambda *a, **k: b"\x0a\x03\x0a\x01")
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "a"],
            "tokenizer.ggml.scores": np.zeros(4, dtype=np.float32)}
    with pytest.raises(SterError, match="sentencepiece library refused this GGUF's vocabulary"):
        tokenizer_from_gguf_metadata(meta)


def test_sentencepiece_model_proto_parses_back():
    # The proto written with numpy reads back with protobuf's own parser: pieces, scores, types, specs.
    pytest.importorskip("google.protobuf")
    from sentencepiece import sentencepiece_model_pb2

    from ster_py.gguf.sentencepiece_bpe import sentencepiece_model_proto

    tokens, scores, _ = _crafted_spm("ties", 2)
    tokens = tokens + ["x" * 200, "\u65e5" * 50, "\x00nul"]  # two-byte length varints, a NUL inside
    scores = scores + [-1.5, 2.25, 0.0]
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(sentencepiece_model_proto(tokens, np.array(scores), unk_id=0))
    assert [p.piece for p in proto.pieces] == tokens
    assert [p.score for p in proto.pieces] == pytest.approx(scores)
    kinds = [p.type for p in proto.pieces]
    assert kinds[0] == proto.pieces[0].UNKNOWN and kinds[3:259] == [proto.pieces[0].BYTE] * 256
    assert set(kinds[259:]) == {proto.pieces[0].NORMAL}  # control/user-defined ones are merge targets too
    assert proto.trainer_spec.model_type == proto.trainer_spec.BPE and proto.trainer_spec.byte_fallback
    spec = proto.normalizer_spec
    assert (spec.add_dummy_prefix, spec.remove_extra_whitespaces, spec.escape_whitespaces) == (False, False, False)
    assert spec.precompiled_charsmap == b""
    # No unknown token: a placeholder is appended (its id is dropped from the output).
    proto.ParseFromString(sentencepiece_model_proto(["a", "b"], np.zeros(2), unk_id=None))
    assert [p.piece for p in proto.pieces] == ["a", "b", "<unk>"] and not proto.trainer_spec.byte_fallback


# ---------------------------- hostile SentencePiece BPE vocabularies (s10-break: found by crafting, fixed)

def _llama_cpp_ids(path: Path, texts, parse_special: bool) -> list[list[int]]:
    """llama.cpp's ids (no BOS) in a child process: a crafted vocabulary may abort it."""
    from ster_py import llamacpp

    if not llamacpp.available():
        pytest.skip("llama-cpp-python is the oracle here")
    return llamacpp.tokenize(path, texts, parse_special=parse_special, timeout=120)


def test_sentencepiece_bpe_nan_score_is_refused():
    # llama.cpp's merge queue compares scores with < and ==, which a NaN breaks (no strict weak order), and
    # sentencepiece orders it otherwise: crafted texts came out differently. Refused, as the Unigram path does.
    tokens, scores, types = _crafted_spm("ties", 0)
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": np.array(scores[:-1] + [float("nan")], dtype=np.float32),
            "tokenizer.ggml.token_type": np.array(types, dtype=np.int32)}
    with pytest.raises(SterError, match=r"tokenizer.ggml.scores\[%d\] is NaN" % (len(tokens) - 1)):
        tokenizer_from_gguf_metadata(meta)
    meta["tokenizer.ggml.scores"] = np.array(scores[:-2] + [float("inf"), float("-inf")], dtype=np.float32)
    assert tokenizer_from_gguf_metadata(meta).tokenizer.encode("abc").ids  # infinities are ordered: kept


def test_sentencepiece_bpe_overlapping_added_tokens_equal_llama_cpp(tmp_path):
    # A user-defined token overlapping a control token ("<s>" / "><", "</s>" / "s>x"): with special texts
    # not parsed, llama.cpp never looks for the control token, so the user-defined one is cut where it
    # starts inside it. (tokenizers matched both and then read the control token as text, hiding it.)
    head = ["<unk>", "<s>", "</s>"]
    tokens = head + [f"<0x{b:02X}>" for b in range(256)] + ["><", "s>x", "\u2581", "a", "<", ">", "s", "x"]
    types = [2, 3, 3] + [6] * 256 + [4, 4] + [1] * 6
    scores = [0.0] * len(tokens)
    _spm_vocab_file(tmp_path / "v.gguf", tokens, scores, types, True)
    tk = tokenizer_from_gguf_metadata(_read_metadata(tmp_path / "v.gguf")).tokenizer
    texts = ["<s><>", "a<s><a", "</s>x", "</s>><", "x<s>x</s>x", "<s>", "><<s>"]
    for parse_special in (True, False):
        want = _llama_cpp_ids(tmp_path / "v.gguf", texts, parse_special)
        tk.encode_special_tokens = not parse_special
        got = [tk.encode(t, add_special_tokens=False).ids for t in texts]
        assert got == want, parse_special


def test_sentencepiece_bpe_partial_byte_tokens_equal_llama_cpp(tmp_path):
    # Only <0x00>..<0x7F>: llama.cpp looks each byte token up by its text, so an ASCII character without
    # a piece still becomes its byte token (sentencepiece falls back to bytes only with all 256).
    head = ["<unk>", "<s>", "</s>"]
    tokens = head + [f"<0x{b:02X}>" for b in range(128)] + ["\u2581", "a", "b", "ab", "\u2581a"]
    types = [2, 3, 3] + [6] * 128 + [1] * 5
    scores = [0.0] * (len(tokens) - 5) + [-1.0, -2.0, -2.0, -3.0, -4.0]
    _spm_vocab_file(tmp_path / "v.gguf", tokens, scores, types, True)
    tk = tokenizer_from_gguf_metadata(_read_metadata(tmp_path / "v.gguf")).tokenizer
    texts = ["hello", "a\x01b", "zz ab", "ab", "\x00", " a\tz"]
    want = _llama_cpp_ids(tmp_path / "v.gguf", texts, True)
    assert [tk.encode(t, add_special_tokens=False).ids for t in texts] == want
    assert [tk.decode(ids) for ids in want] == ["hello", "a\x01b", "zz ab", "ab", "\x00", " a\tz"]


def test_sentencepiece_bpe_token_with_nul_equals_llama_cpp(tmp_path):
    # llama.cpp reads a token text as a C string: "x\0y" is the token "x", and "\0" an empty one (renamed
    # [EMPTY_i]). The sentencepiece library refuses a piece holding NUL, which refused the whole vocabulary.
    head = ["<unk>", "<s>", "</s>"]
    tokens = head + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581", "x\x00y", "\x00", "a", "\u2581a\x00"]
    types = [2, 3, 3] + [6] * 256 + [1] * 5
    _spm_vocab_file(tmp_path / "v.gguf", tokens, [0.0] * len(tokens), types, True)
    parts = tokenizer_from_gguf_metadata(_read_metadata(tmp_path / "v.gguf"))
    texts = ["x", "xy", "a x", "\x00", "x\x00y", " a"]
    assert [parts.tokenizer.encode(t, add_special_tokens=False).ids for t in texts] == _llama_cpp_ids(
        tmp_path / "v.gguf", texts, True)
    assert parts.tokenizer.id_to_token(261) == "[EMPTY_261]"
    tokens[-1] = "a\x00b"  # "a" twice once cut: llama.cpp aborts on the duplicate
    _spm_vocab_file(tmp_path / "d.gguf", tokens, [0.0] * len(tokens), types, True)
    with pytest.raises(SterError, match="duplicate token"):
        tokenizer_from_gguf_metadata(_read_metadata(tmp_path / "d.gguf"))


def test_sentencepiece_model_proto_in_chunks_parses_back():
    # The piece texts are placed a chunk of pieces at a time (bounded index arrays: a crafted 64 MB
    # vocabulary peaked at 1.6 GB): more pieces than one chunk, empty and 4-byte ones at its edges.
    pytest.importorskip("google.protobuf")
    from sentencepiece import sentencepiece_model_pb2

    from ster_py.gguf import sentencepiece_bpe

    n = sentencepiece_bpe._SCATTER_PIECES * 2 + 5
    tokens = [chr(0x10000 + i) * (1 + i % 3) if i % 7 else "\u00e9" * (i % 50) for i in range(n)]
    tokens[sentencepiece_bpe._SCATTER_PIECES - 1: sentencepiece_bpe._SCATTER_PIECES + 1] = ["", "\U0010FFFF" * 30]
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(sentencepiece_bpe.sentencepiece_model_proto(tokens, np.arange(n, dtype=np.float32), 1))
    assert [p.piece for p in proto.pieces][:n] == tokens
    assert [p.score for p in proto.pieces][:n] == list(range(n))


def test_sentencepiece_piece_not_unicode_is_a_ster_error():
    # Metadata given as a dict (the reader never yields one): a lone surrogate was a UnicodeEncodeError.
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "a\udc80"],
            "tokenizer.ggml.scores": np.zeros(4, dtype=np.float32)}
    with pytest.raises(SterError, match="not valid Unicode"):
        tokenizer_from_gguf_metadata(meta)


def test_unigram_and_wordpiece_refusals():
    meta = {"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": ["<pad>", "</s>"],
            "tokenizer.ggml.scores": np.array([0.0, 0.0], dtype=np.float32),
            "tokenizer.ggml.token_type": np.array([3, 3], dtype=np.int32)}
    with pytest.raises(SterError, match="Unigram GGUF has no unknown token"):
        tokenizer_from_gguf_metadata(meta)  # llama.cpp's default unknown id (2) is out of range
    meta["tokenizer.ggml.tokens"] = ["<pad>", "</s>", "<unk>"]
    meta["tokenizer.ggml.scores"] = np.zeros(3, dtype=np.float32)
    meta["tokenizer.ggml.token_type"] = np.array([3, 3, 2], dtype=np.int32)
    meta["tokenizer.ggml.precompiled_charsmap"] = np.array([200, 0, 0, 0, 1, 2], dtype=np.uint8)
    with pytest.raises(SterError, match="precompiled_charsmap is not a SentencePiece character map"):
        tokenizer_from_gguf_metadata(meta)
    bert = {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["[PAD]", "\u2581a", "a"],
            "tokenizer.ggml.token_type": np.array([3, 1, 1], dtype=np.int32)}
    with pytest.raises(SterError, match="WordPiece GGUF has no unknown token"):
        tokenizer_from_gguf_metadata(bert, for_generation=False)


def test_wordpiece_pieces_and_defaults():
    # Word-initial pieces are stored as ▁w, continuations as w (llama.cpp's converter).
    tokens = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                                                "\u2581hello", "\u2581un", "aff", "able", "\u2581,"]
    types = [3] + [1] * 99 + [3, 3, 3, 3, 1, 1, 1, 1, 1]
    meta = {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": np.array(types, dtype=np.int32)}
    parts = tokenizer_from_gguf_metadata(meta, for_generation=False)
    tk = parts.tokenizer
    assert tk.encode("HELLO, unaffable").tokens == ["[CLS]", "hello", ",", "un", "##aff", "##able", "[SEP]"]
    assert tk.encode("unknownword hello").ids == [101, 100, 104, 102]
    # llama.cpp reads [PAD] as a fill-in-the-middle pad (Kimi K2's), which ends a generation.
    assert parts.eos_token_ids == frozenset({0}) and parts.pre is None
    meta["tokenizer.ggml.tokens"] = ["[pad]"] + tokens[1:]
    with pytest.raises(SterError, match="no end-of-generation token"):
        tokenizer_from_gguf_metadata(meta)  # an encoder vocabulary without one cannot end a generation


def test_long_sentencepiece_token_is_refused_quickly():
    # A crafted vocabulary with one 300 000-character token: refused by length, no
    # quadratic search of its splits.
    meta = _spm_meta()
    meta["tokenizer.ggml.tokens"] = meta["tokenizer.ggml.tokens"] + ["a" * 300_000]
    meta["tokenizer.ggml.token_type"] = np.concatenate([meta["tokenizer.ggml.token_type"], [1]])
    meta["tokenizer.ggml.scores"] = np.concatenate([meta["tokenizer.ggml.scores"], [-9.0]]).astype(np.float32)
    with pytest.raises(SterError, match=r"tokens\[266\] is 300000 characters long.*over 1024"):
        tokenizer_from_gguf_metadata(meta)


# -------------------------------------------------------------- llama.cpp itself

@pytest.mark.real
def test_ids_equal_llama_cpp(real_gguf):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (optional oracle; "
                                    "the test vectors above cover llama.cpp without it)")
    model = llama_cpp.Llama(real_gguf, vocab_only=True, verbose=False)
    tk = _parts(real_gguf).tokenizer
    for text in TEXTS:
        for add in (True, False):
            assert tk.encode(text, add_special_tokens=add).ids == model.tokenize(
                text.encode(), add_bos=add, special=True), (text, add)


# ---------------------------------------------------------------- pre-tokenizers

def _byte_level_meta(pre: str) -> dict:
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    byte_tokens = sorted(alphabet)
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": byte_tokens + ["<|endoftext|>"],
        "tokenizer.ggml.token_type": np.array([1] * len(byte_tokens) + [3], dtype=np.int32),
        "tokenizer.ggml.merges": [],
        "tokenizer.ggml.bos_token_id": len(byte_tokens),
        "tokenizer.ggml.eos_token_id": len(byte_tokens),
    }


def test_merges_outside_the_vocabulary_are_dropped():
    # A merge naming or making a token outside the vocabulary, or a line without a cut, can never
    # yield an id: the tokenizer is the one without those lines (llama.cpp skips them the same way).
    meta = _byte_level_meta("gpt-2")
    meta["tokenizer.ggml.tokens"] = meta["tokenizer.ggml.tokens"] + ["ab", "abc", " a"]
    meta["tokenizer.ggml.token_type"] = np.concatenate([meta["tokenizer.ggml.token_type"], [1, 1, 1]])
    clean = ["a b", "ab c"]
    want = tokenizer_from_gguf_metadata({**meta, "tokenizer.ggml.merges": clean}).tokenizer
    for extra in (["a x"], ["ab d"], ["abc"], ["", "a b"], [" a b"], ["q\u0120 b"]):
        got = tokenizer_from_gguf_metadata({**meta, "tokenizer.ggml.merges": clean + extra}).tokenizer
        for text in ("abc", "ab", "xabcd", " a b"):
            assert got.encode(text).ids == want.encode(text).ids, (extra, text)
    assert want.encode("abc").tokens == ["abc"]


def test_merge_lines_cut_in_c_as_in_the_python_reference():
    # The kernel that cuts tokenizer.ggml.merges lines at load equals the reference cut (the first
    # space after the first character, as llama.cpp's loader; the reference's ids are checked against
    # llama.cpp by the vocabulary tests), on lines with leading, doubled, trailing and other spaces.
    from ster_py._kernels.quants import merge_pairs
    from ster_py.gguf.tokenizer import _split_merges

    lines = ["a b", " a b", "  ab", "a  b", "ab", "", " ", "  ", "a ", " a", "\u00e9 \u00fc", "x y z",
             "\u3000 a", "a\u3000b", "\u0120 \u0120\u0120", "\U0001F600 b", "a\tb c", "\x00 a"]
    assert merge_pairs(lines) == _split_merges(lines)
    assert merge_pairs(lines)[:4] == [("a", "b"), (" a", "b"), (" ", "ab"), ("a", " b")]
    with pytest.raises(TypeError):
        merge_pairs(["a b", b"a b"])
    # str subclasses (numpy's str_) are lines on both paths (the kernel refused them, the reference not)
    sub = [np.str_(x) for x in lines]
    assert merge_pairs(sub) == _split_merges(sub) == _split_merges(lines)


@pytest.mark.parametrize("pre", sorted(PRE_TOKENIZERS))
def test_every_name_builds_and_loses_nothing(pre):
    # With no merges the ids are the bytes of the text (or its characters' <0xHH> tokens),
    # whatever the split: decoding gives the text back. (The splits themselves are checked
    # against llama.cpp in test_gguf_pretokenizers.py.)
    meta = _byte_level_meta(pre)
    if not PRE_TOKENIZERS[pre].byte_level:
        meta["tokenizer.ggml.tokens"] = [f"<0x{b:02X}>" for b in range(255)] + ["\u2581", "<|endoftext|>"]
    tk = tokenizer_from_gguf_metadata(meta).tokenizer
    sample = "Hello world, it's 2024! naïve 日本語 😀\n\tx"
    assert tk.decode(tk.encode(sample, add_special_tokens=False).ids) == sample
    assert split_pre_tokenizer(pre).pre_tokenize_str(sample)  # the split alone builds too


def test_pre_tokenizer_table_covers_seed_names():
    # Seed 000's "Pre-tokenizers" list, name by name, is part of llama.cpp's 91.
    seed = """llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano smaug-bpe dbrx
        qwen2 deepseek-r1-qwen kormo f2llmv2 megrez stablelm2 hunyuan solar-open qwen35
        gpt-2 phi-2 mpt olmo jais trillion granite-docling exaone4 mellum modern-bert gigachat a.x-4.0 jina-es
        jina-de jina-v2-es jina-v2-de starcoder refact command-r smollm codeshell exaone minerva-7b mellum2
        gpt-4o llama4 kanana2 talkie minimax-m2 gemma4 default""".split()
    assert set(seed) <= set(PRE_TOKENIZERS) and len(PRE_TOKENIZERS) == 91
    groups = [("llama3", "smaug-bpe", "dbrx", "glm4"), ("qwen2", "stablelm2", "hunyuan", "solar-open", "megrez",
                                                         "grok-2"),
              ("gpt-2", "jais", "a.x-4.0", "exaone4", "roberta-bpe"), ("starcoder", "smollm", "mellum2"),
              ("gpt-4o", "llama4", "minimax-m2"), ("deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"),
              ("bloom", "poro-chat", "gpt3-finnish"), ("tiny_aya", "cohere2moe"),
              ("gemma4", "granite-embed-multi-311m")]
    for group in groups:
        assert len({PRE_TOKENIZERS[n].cuts for n in group}) == 1, group


# ------------------------------------------------------- synthetic metadata rules

def _spm_meta(**overrides) -> dict:
    tokens = ["<unk>", "<s>", "</s>", "\u2581", "a", "b", "\u2581a", "ab", "\u2581ab", "<|im_end|>"]
    tokens += [f"<0x{i:02X}>" for i in range(256)]
    types = [2, 3, 3, 1, 1, 1, 1, 1, 1, 3] + [6] * 256
    scores = [0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0, 0.0] + [0.0] * 256
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": np.array(types, dtype=np.int32),
            "tokenizer.ggml.scores": np.array(scores, dtype=np.float32)}
    meta.update(overrides)
    return meta


def test_unknown_model_is_refused_by_name():
    meta = _byte_level_meta("gpt-2")
    meta["tokenizer.ggml.model"] = "rwkv"
    with pytest.raises(SterError, match=r"unsupported tokenizer model 'rwkv'.*supported: gpt2, llama, gemma4"):
        tokenizer_from_gguf_metadata(meta)


def test_unknown_pre_tokenizer_is_refused_with_the_supported_list():
    with pytest.raises(SterError, match=r"unsupported pre-tokenizer 'qwen9'.*91 names.*deepseek-v3.*qwen2.*smollm"):
        tokenizer_from_gguf_metadata(_byte_level_meta("qwen9"))
    with pytest.raises(SterError, match="unsupported pre-tokenizer 'nope'"):
        split_pre_tokenizer("nope")


@pytest.mark.parametrize("model", ["rwkv", "hybriddna", "none"])  # plamo2: test_plamo_tokenizer.py
def test_other_llama_cpp_tokenizer_models_are_refused_with_the_reason(model):
    meta = _byte_level_meta("default")
    meta["tokenizer.ggml.model"] = model
    with pytest.raises(SterError, match=rf"unsupported tokenizer model '{model}' \(tokenizer.ggml.model\): .+; "
                                        "supported: gpt2, llama, gemma4, whitespace, bert, t5, plamo2"):
        tokenizer_from_gguf_metadata(meta)


def test_missing_pre_uses_default():
    meta = _byte_level_meta("gpt-2")
    del meta["tokenizer.ggml.pre"]
    assert tokenizer_from_gguf_metadata(meta).pre == "default"


def test_malformed_metadata_is_refused():
    meta = _byte_level_meta("gpt-2")
    del meta["tokenizer.ggml.merges"]
    with pytest.raises(SterError, match="no tokenizer.ggml.merges"):
        tokenizer_from_gguf_metadata(meta)
    meta = _spm_meta()
    del meta["tokenizer.ggml.scores"]
    with pytest.raises(SterError, match="no tokenizer.ggml.scores"):
        tokenizer_from_gguf_metadata(meta)
    meta = _spm_meta()
    meta["tokenizer.ggml.tokens"] = list(meta["tokenizer.ggml.tokens"])
    meta["tokenizer.ggml.tokens"][5] = "a"
    with pytest.raises(SterError, match="duplicate token .*'a' has ids 4 and 5"):
        tokenizer_from_gguf_metadata(meta)
    with pytest.raises(SterError, match="no tokenizer.ggml.tokens"):
        tokenizer_from_gguf_metadata({"tokenizer.ggml.model": "gpt2"})
    meta = _spm_meta()
    meta["tokenizer.ggml.tokens"] = [*meta["tokenizer.ggml.tokens"][:3], 7, *meta["tokenizer.ggml.tokens"][4:]]
    with pytest.raises(SterError, match=r"tokenizer.ggml.tokens\[3\] is int, not a string"):
        tokenizer_from_gguf_metadata(meta)
    meta = _byte_level_meta("gpt-2")
    meta["tokenizer.ggml.merges"] = ["a b", b"c d"]
    with pytest.raises(SterError, match=r"tokenizer.ggml.merges\[1\] is not a string"):
        tokenizer_from_gguf_metadata(meta)
    # (a breaker's findings, through the Python API: scalars were raw TypeErrors)
    for key in ("tokenizer.ggml.merges", "tokenizer.ggml.tokens"):
        with pytest.raises(SterError, match=f"{key} must be an array of strings, not int"):
            tokenizer_from_gguf_metadata({**_byte_level_meta("gpt-2"), key: 5})
    with pytest.raises(SterError, match="token_type must be"):
        tokenizer_from_gguf_metadata(_spm_meta(**{"tokenizer.ggml.token_type": [1, 2]}))


def test_no_end_of_generation_token_is_refused():
    # llama.cpp's BPE default EOS is id 11; a vocabulary of fewer tokens has none.
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.merges": [],
            "tokenizer.ggml.tokens": ["a", "b", "<|other|>"]}
    with pytest.raises(SterError, match="no end-of-generation token"):
        tokenizer_from_gguf_metadata(meta)
    # With 12 tokens or more, id 11 is the default EOS (as in llama.cpp; Falcon's <|endoftext|>).
    meta = _byte_level_meta("gpt-2")
    del meta["tokenizer.ggml.eos_token_id"]
    assert tokenizer_from_gguf_metadata(meta).eos_token_ids == {11, len(meta["tokenizer.ggml.tokens"]) - 1}


def test_add_bos_without_bos_id_is_refused():
    # The ChatGLM names have no default BOS (other BPE names default to id 11).
    meta = _byte_level_meta("glm4")
    del meta["tokenizer.ggml.bos_token_id"]
    meta["tokenizer.ggml.add_bos_token"] = True
    with pytest.raises(SterError, match="add_bos_token is true but tokenizer.ggml.bos_token_id is not set"):
        tokenizer_from_gguf_metadata(meta)
    meta["tokenizer.ggml.pre"] = "gpt-2"
    parts = tokenizer_from_gguf_metadata(meta)
    assert parts.bos_token_id == 11 and parts.tokenizer.encode("a").ids[0] == 11


def test_sentencepiece_defaults_and_prefix_space():
    # Unset keys: llama.cpp's SentencePiece defaults (bos 1, eos 2, unk 0, add BOS, prefix space).
    parts = tokenizer_from_gguf_metadata(_spm_meta())
    assert (parts.bos_token, parts.eos_token, parts.add_bos, parts.add_space_prefix) == ("<s>", "</s>", True, True)
    assert parts.eos_token_ids == {2, 9}  # </s> and <|im_end|>
    tk = parts.tokenizer
    assert tk.encode("ab", add_special_tokens=False).tokens == ["\u2581ab"]
    # A text run after a special token gets its own prefix space, as in llama.cpp.
    assert tk.encode("ab</s>ab").tokens == ["<s>", "\u2581ab", "</s>", "\u2581ab"]
    # A character without a token falls back to its UTF-8 bytes.
    assert tk.encode("é", add_special_tokens=False).tokens == ["\u2581", "<0xC3>", "<0xA9>"]
    assert tk.decode(tk.encode("ab é").ids) == "ab é"
    no_prefix = tokenizer_from_gguf_metadata(_spm_meta(**{"tokenizer.ggml.add_space_prefix": False})).tokenizer
    assert no_prefix.encode("ab", add_special_tokens=False).tokens == ["ab"]


def test_flags_from_the_file_win():
    parts = tokenizer_from_gguf_metadata(_spm_meta(**{"tokenizer.ggml.add_bos_token": False,
                                                      "tokenizer.ggml.add_eos_token": True}))
    assert parts.tokenizer.encode("a").tokens == ["\u2581a", "</s>"]
    meta = _byte_level_meta("qwen2")
    assert tokenizer_from_gguf_metadata(meta).add_bos is False
    meta["tokenizer.ggml.pre"] = "llama-bpe"  # the Llama 3 family adds BOS by default
    assert tokenizer_from_gguf_metadata(meta).add_bos is True
    meta["tokenizer.ggml.add_bos_token"] = False
    assert tokenizer_from_gguf_metadata(meta).add_bos is False


def test_end_of_generation_texts_and_ids():
    meta = _byte_level_meta("gpt-2")
    extra = ["<|eot_id|>", "<end_of_turn>", "<|im_start|>"]
    meta["tokenizer.ggml.tokens"] = meta["tokenizer.ggml.tokens"] + extra
    meta["tokenizer.ggml.token_type"] = np.concatenate([meta["tokenizer.ggml.token_type"], [1, 3, 3]])
    meta["tokenizer.ggml.eot_token_id"] = 65  # an eot id counts whatever its text
    parts = tokenizer_from_gguf_metadata(meta)
    vocab = parts.tokenizer.get_vocab()
    assert parts.eos_token_ids == {vocab["<|endoftext|>"], vocab["<|eot_id|>"], vocab["<end_of_turn>"], 65}
    # An end-of-generation text stored as a normal token is still cut out whole, as llama.cpp does.
    assert parts.tokenizer.encode("x<|eot_id|>").tokens == ["x", "<|eot_id|>"]
    assert set(END_OF_GENERATION_TEXTS) >= {"<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|endoftext|>"}


def test_tokenizers_panic_while_building_is_a_ster_error(monkeypatch):
    # A Rust panic (pyo3's PanicException) derives from BaseException, not Exception.
    from ster_py.gguf import tokenizer as gt

    class PanicLike(BaseException):
        pass

    def panic(*args, **kwargs):
        raise PanicLike("index out of bounds")

    monkeypatch.setattr(gt, "_bpe", panic)
    meta = _byte_level_meta("gpt-2")
    with pytest.raises(SterError, match="could not build this GGUF's gpt2 tokenizer"):
        tokenizer_from_gguf_metadata(meta)
    monkeypatch.setattr(gt, "_bpe", lambda *a, **k: 1 / 0)  # a bug here stays a traceback
    with pytest.raises(ZeroDivisionError):
        tokenizer_from_gguf_metadata(meta)


def test_mutated_charsmaps_are_refused_or_work_never_panic():
    # Real character maps (sentencepiece's nmt_nfkc, trained above) pass the trie walk; random
    # byte changes in the trie either are refused by it or give a map tokenizers runs without a
    # Rust panic on any of these texts.
    pytest.importorskip("sentencepiece")
    from sentencepiece import sentencepiece_model_pb2

    from ster_py.gguf.tokenizer import check_precompiled_charsmap

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(_trained_sentencepiece())
    real = proto.normalizer_spec.precompiled_charsmap
    check_precompiled_charsmap(real, "real")
    trie_size = int.from_bytes(real[:4], "little")
    rng = np.random.default_rng(0)
    # Every character of the first planes, so the look-ups cross much of the trie.
    texts = ["".join(map(chr, range(1, 0xD800))), "".join(map(chr, range(0xE000, 0x20000)))]
    refused = 0
    for _ in range(80):
        data = bytearray(real)
        for pos in rng.integers(4, 4 + trie_size, size=2):
            data[pos] = int(rng.integers(0, 256))
        meta = {"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": ["<pad>", "</s>", "<unk>", "\u2581a"],
                "tokenizer.ggml.scores": np.array([0, 0, 0, -1], dtype=np.float32),
                "tokenizer.ggml.token_type": np.array([3, 3, 2, 1], dtype=np.int32),
                "tokenizer.ggml.precompiled_charsmap": np.frombuffer(bytes(data), dtype=np.uint8)}
        try:
            tk = tokenizer_from_gguf_metadata(meta).tokenizer
        except SterError:
            refused += 1
            continue
        for text in texts:
            tk.encode(text)  # a panic here would be a BaseException that fails the test
    assert 0 < refused < 80


#: Token types whose piece llama.cpp's token_to_piece gives (UNUSED ones it gives as nothing).
_PIECE_TYPES = (1, 2, 3, 4, 6)  # NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE


@pytest.mark.real
@pytest.mark.parametrize("name", sorted(VECTOR_VOCABS) + sorted(BUILD_ONLY_VOCABS) + ["nomic-bert-moe"])
def test_token_pieces_equal_llama_cpp_token_to_piece(llama_vocab_dir, name):
    """``Tokenizer.token_bytes`` (the logprobs ``bytes``, and their text the ``token``) against llama.cpp's
    ``llama_token_to_piece`` (special on): the first 300 ids, the last 100 and 1,500 at random. Decoding a
    token alone dropped the space of SentencePiece's word-initial pieces (llama-spm, phi-3, baichuan,
    nomic-bert-moe gave b"world" for ``▁world``) and of WordPiece's (bert-bge). llama.cpp spells a
    byte-level character outside GPT-2's byte map as ``[UNK_BYTE_0x...]``; ster keeps the character."""
    import random

    from ster_py import llamacpp
    from ster_py.load import load_tokenizer

    if not llamacpp.available():
        pytest.skip("llama-cpp-python is not installed")
    path = llama_vocab_dir / f"ggml-vocab-{name}.gguf"
    tok = load_tokenizer(str(path))
    types = np.asarray(_read_metadata(str(path)).get("tokenizer.ggml.token_type", [1] * tok.vocab_size))
    n = tok.vocab_size
    ids = sorted({*range(min(n, 300)), *random.Random(0).sample(range(n), min(n, 1500)), *range(max(0, n - 100), n)})
    ids = [i for i in ids if int(types[i]) in _PIECE_TYPES]
    want = llamacpp.pieces(path, ids)
    bad = [(i, tok.id_to_token(i), tok.token_bytes(i), w) for i, w in zip(ids, want)
           if tok.token_bytes(i) != w and not w.startswith(b"[UNK_BYTE_0x")]
    assert not bad, bad[:5]
    words = tok.encode("Hello world again", add_special_tokens=False)
    assert b"".join(tok.token_bytes(i) for i in words).strip() == b"hello world again" if name == "bert-bge" \
        else b"".join(tok.token_bytes(i) for i in words).lstrip() == b"Hello world again"
