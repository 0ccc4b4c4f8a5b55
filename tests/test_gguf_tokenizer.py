"""ster_py.gguf.tokenizer against its oracles.

- Real files (SmolLM2: gpt2/smollm; Gemma 3: SentencePiece): token ids equal
  transformers' GGUF tokenizer (``AutoTokenizer.from_pretrained(dir, gguf_file=...)``)
  on 40 texts, with and without special tokens.
- llama.cpp's own tokenizer test vectors (``models/ggml-vocab-*.gguf`` with their
  ``.inp``/``.out`` files, shipped in the llama-cpp-python 0.3.36 sdist): ids equal
  llama.cpp's for every supported vocabulary there (gpt-2, llama-bpe, qwen2, qwen35,
  starcoder, refact, command-r, mpt, llama-spm, phi-3, gemma-4).
- Every pre-tokenizer name: the built tokenizer splits sample text as Python's
  ``regex`` module does with the same expressions (and as transformers' GGUF table
  does for the names it knows).
- llama.cpp itself (llama-cpp-python), when it is importable.

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
    PRE_TOKENIZER_SPLITS,
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
    return tokenizer_from_gguf_metadata(_read_metadata(path))


@functools.lru_cache(maxsize=None)
def _transformers_tokenizer(path: str):
    from transformers import AutoTokenizer

    p = Path(path)
    return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def real_gguf(request) -> str:
    return str(request.getfixturevalue(f"{request.param}_gguf"))


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
    # Seed 000: eos plus the vocabulary's known end-of-turn / end-of-text tokens.
    smol = _parts(str(smollm2_gguf))
    want = {smol.tokenizer.token_to_id(t) for t in ("<|im_end|>", "<|endoftext|>")}
    assert smol.eos_token == "<|im_end|>" and smol.eos_token_ids == want
    gemma = _parts(str(gemma3_gguf))
    want = {gemma.tokenizer.token_to_id(t) for t in ("<eos>", "<end_of_turn>")}
    assert gemma.eos_token == "<eos>" and gemma.eos_token_ids == want
    assert gemma.chat_template is None  # the Gemma 3 file carries no template


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
    "command-r": True, "mpt": False, "llama-spm": True, "phi-3": True, "gemma-4": True,
}
# Same checks for the files without test vectors (no tokenizer.ggml.pre: the default split).
BUILD_ONLY_VOCABS = {"aquila": False, "gpt-neox": False, "baichuan": True}
REFUSED_VOCABS = {"deepseek-coder": "deepseek-coder", "deepseek-llm": "deepseek-llm", "falcon": "falcon",
                  "bert-bge": "bert"}


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
    # one line of ids (tokenized without BOS, specials parsed) per text.
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
    mismatches = [(t, got, want) for t, want in vectors
                  if (got := parts.tokenizer.encode(t, add_special_tokens=False).ids) != want]
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


@pytest.mark.real
@pytest.mark.parametrize("name", sorted(REFUSED_VOCABS))
def test_unsupported_vocab_files_are_refused_by_name(llama_vocab_dir, name):
    with pytest.raises(SterError, match=f"unsupported .*'{REFUSED_VOCABS[name]}'.*supported: "):
        _parts(str(llama_vocab_dir / f"ggml-vocab-{name}.gguf"))


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

SPLIT_SAMPLES = [
    "Hello world, it's 2024! I'M here: don't stop... 12345678 + 3.14",
    "  multiple   spaces\tand\ttabs\n\nnewlines\r\n end  ",
    "naïve café Ünïcödé ÆØÅ — «quotes» 日本語テキスト 한국어 😀🦙 1️⃣",
    "camelCaseWord HTTPServer getHTTPResponse iPhone McDonald'S O'Neil",
    "def f(x):\n    return [x**2 for x in range(10)]  # comment\n",
    "a\u0301 combining e\u0300 marks: ก้ำ नमस्ते",
    "$100 + 50% = <tag> | ^caret ~tilde `code` @user #hash",
    "١٢٣ arabic digits, ⅷ roman, ²³ superscripts",
]


def _regex_reference_split(patterns: tuple[str, ...], text: str) -> list[str]:
    """llama.cpp's unicode_regex_split, with Python's regex module: each expression in
    turn splits every fragment into its matches and the gaps between them."""
    import regex

    fragments = [text]
    for pattern in patterns:
        compiled = regex.compile(pattern)
        out = []
        for fragment in fragments:
            last = 0
            for m in compiled.finditer(fragment):
                if m.start() > last:
                    out.append(fragment[last:m.start()])
                if m.end() > m.start():
                    out.append(m.group())
                last = m.end()
            if last < len(fragment):
                out.append(fragment[last:])
        fragments = out
    return fragments


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


@pytest.mark.parametrize("pre", sorted(n for n in PRE_TOKENIZER_SPLITS if n != "gemma4"))
def test_byte_level_split_matches_regex(pre):
    pytest.importorskip("regex", reason="the regex module is the reference for the split expressions")
    from tokenizers import decoders

    tk = tokenizer_from_gguf_metadata(_byte_level_meta(pre)).tokenizer
    to_text = decoders.ByteLevel()
    for sample in SPLIT_SAMPLES:
        pieces = [to_text.decode([p]) for p, _ in tk.pre_tokenizer.pre_tokenize_str(sample)]
        assert pieces == _regex_reference_split(PRE_TOKENIZER_SPLITS[pre], sample), (pre, sample)
        # No merges: the ids are the bytes of the text, in order.
        assert tk.decode(tk.encode(sample).ids) == sample


@pytest.mark.parametrize("pre", sorted(PRE_TOKENIZER_SPLITS))
def test_split_pre_tokenizer_matches_regex(pre):
    pytest.importorskip("regex", reason="the regex module is the reference for the split expressions")
    splitter = split_pre_tokenizer(pre)
    for sample in SPLIT_SAMPLES:
        pieces = [p for p, _ in splitter.pre_tokenize_str(sample)]
        assert pieces == _regex_reference_split(PRE_TOKENIZER_SPLITS[pre], sample), (pre, sample)


def test_splits_equal_transformers_table_where_it_has_the_name():
    # transformers' GGUF table spells the same expressions from the reference tokenizer.json
    # files (with (?i:...) contractions, which only differ on exotic case folds).
    from tokenizers import Regex, pre_tokenizers
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS as theirs

    shared = sorted(set(theirs) & set(PRE_TOKENIZER_SPLITS))
    assert {"llama-bpe", "qwen2", "qwen35", "gpt-4o", "dbrx"} <= set(shared)
    for name in shared:
        reference = pre_tokenizers.Split(Regex(theirs[name]), behavior="isolated")
        ours = split_pre_tokenizer(name)
        for sample in SPLIT_SAMPLES:
            assert ours.pre_tokenize_str(sample) == reference.pre_tokenize_str(sample), (name, sample)


def test_pre_tokenizer_table_covers_seed_names():
    # Seed 000's "Pre-tokenizers" list, name by name.
    seed = """llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano smaug-bpe dbrx
        qwen2 deepseek-r1-qwen kormo f2llmv2 megrez stablelm2 hunyuan solar-open qwen35
        gpt-2 phi-2 mpt olmo jais trillion granite-docling exaone4 mellum modern-bert gigachat a.x-4.0 jina-es
        jina-de jina-v2-es jina-v2-de starcoder refact command-r smollm codeshell exaone minerva-7b mellum2
        gpt-4o llama4 kanana2 talkie minimax-m2 gemma4 default""".split()
    assert set(seed) == set(PRE_TOKENIZER_SPLITS)
    groups = [("llama3", "smaug-bpe", "dbrx"), ("qwen2", "stablelm2", "hunyuan", "solar-open", "megrez"),
              ("gpt-2", "jais", "a.x-4.0", "exaone4"), ("starcoder", "smollm", "mellum2"),
              ("gpt-4o", "llama4", "minimax-m2")]
    for group in groups:
        assert len({PRE_TOKENIZER_SPLITS[n] for n in group}) == 1, group


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
    with pytest.raises(SterError, match=r"unsupported pre-tokenizer 'deepseek-v3'.*supported: .*qwen2.*smollm"):
        tokenizer_from_gguf_metadata(_byte_level_meta("deepseek-v3"))
    with pytest.raises(SterError, match="unsupported pre-tokenizer 'nope'"):
        split_pre_tokenizer("nope")


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
    with pytest.raises(SterError, match="token_type must be"):
        tokenizer_from_gguf_metadata(_spm_meta(**{"tokenizer.ggml.token_type": [1, 2]}))


def test_no_end_of_generation_token_is_refused():
    meta = _byte_level_meta("gpt-2")
    del meta["tokenizer.ggml.eos_token_id"]
    meta["tokenizer.ggml.tokens"][-1] = "<|other|>"
    with pytest.raises(SterError, match="no end-of-generation token"):
        tokenizer_from_gguf_metadata(meta)


def test_add_bos_without_bos_id_is_refused():
    meta = _byte_level_meta("gpt-2")
    del meta["tokenizer.ggml.bos_token_id"]
    meta["tokenizer.ggml.add_bos_token"] = True
    with pytest.raises(SterError, match="add_bos_token is true but tokenizer.ggml.bos_token_id is not set"):
        tokenizer_from_gguf_metadata(meta)


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
