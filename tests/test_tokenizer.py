"""ster_py.tokenizer against transformers' AutoTokenizer on the same directory.

Two tiny tokenizers are trained here with the tokenizers library:
- "sp": SentencePiece-style BPE with <0xHH> byte fallback, a ▁ normalizer, a
  Replace/ByteFallback/Fuse/Strip decoder and a post-processor adding <s>
  (the Llama 2 / Gemma layout);
- "bl": GPT-2 byte-level BPE with ChatML specials and no BOS (the SmolLM2 layout).
transformers 5 (TokenizersBackend) is the oracle for ids, text, special ids and
file precedence; the real SmolLM2 and Gemma 3 tokenizers are checked the same way.
"""
from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer as BackendTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from ster_py.errors import SterError
from ster_py.tokenizer import StreamDecoder, Tokenizer

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Héllo wörld, ça va très bien! Naïve café.",
    "中文分词测试，你好世界。日本語のテキスト。",
    "emoji 🤖🎉 party 🎉 🤖 time",
    "def f(x):\n    return x * 2\n\n",
    "Ελληνικά και русский текст.",
] * 4

TEXTS = [
    "Hello world",
    "The lazy fox, héllo 中文 🤖!",
    "  leading spaces and\ttabs\n\nnewlines  ",
    "unseen: ☃ ∑ 𝔘 ǅ",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<|im_start|>user\nhi<|im_end|>\n",
    "",
    " ",
]

SP_SPECIALS = ["<unk>", "<s>", "</s>", "<start_of_turn>", "<end_of_turn>"]
BL_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

SP_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n"
    "{{ m.content | trim }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
BL_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def sp_backend(post_processor: bool = True) -> BackendTokenizer:
    """SentencePiece-style BPE with byte fallback (ids: specials, 256 bytes, learned pieces)."""
    trainer_tk = BackendTokenizer(models.BPE(unk_token="<unk>"))
    trainer_tk.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer_tk.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=260, show_progress=False))
    learned = json.loads(trainer_tk.to_str())["model"]
    vocab = {tok: i for i, tok in enumerate(SP_SPECIALS)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for tok in sorted(learned["vocab"], key=learned["vocab"].get):
        vocab.setdefault(tok, len(vocab))
    tk = BackendTokenizer(
        models.BPE(vocab=vocab, merges=[tuple(m) for m in learned["merges"]], unk_token="<unk>",
                   byte_fallback=True, fuse_unk=True)
    )
    tk.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tk.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SP_SPECIALS])
    if post_processor:
        tk.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])]
        )
    return tk


def bl_backend() -> BackendTokenizer:
    """GPT-2 byte-level BPE with ChatML specials first (ids 0..2)."""
    tk = BackendTokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420, show_progress=False, special_tokens=BL_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tk.train_from_iterator(CORPUS, trainer)
    return tk


def write_dir(path: Path, kind: str, *, config: dict | None = None, tk: BackendTokenizer | None = None) -> Path:
    """A Hugging Face tokenizer directory: tokenizer.json, tokenizer_config.json (+ generation/model config for sp)."""
    path.mkdir(parents=True, exist_ok=True)
    if kind == "sp":
        (tk or sp_backend()).save(str(path / "tokenizer.json"))
        cfg = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "chat_template": SP_TEMPLATE}
        (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 4], "bos_token_id": 1}))
        (path / "config.json").write_text(json.dumps({"model_type": "llama", "eos_token_id": 2}))
    else:
        (tk or bl_backend()).save(str(path / "tokenizer.json"))
        cfg = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>",
               "pad_token": "<|im_end|>", "chat_template": BL_TEMPLATE}
    cfg.update(tokenizer_class="PreTrainedTokenizerFast", clean_up_tokenization_spaces=False)
    cfg.update(config or {})
    (path / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False))
    return path


def hf_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="module", params=["sp", "bl"])
def pair(request, tmp_path_factory):
    """(ours, transformers') tokenizer of the same tiny directory."""
    path = write_dir(tmp_path_factory.mktemp(request.param), request.param)
    return Tokenizer.from_dir(path), hf_tokenizer(path)


def random_ids(rng: random.Random, tok: Tokenizer, n: int) -> list[int]:
    """Random ids, half of them byte tokens or learned multi-byte pieces when the vocabulary has them."""
    byte_ids = sorted(tok.byte_token_ids)
    multibyte = [i for i in range(tok.vocab_size) if any(ord(c) > 127 for c in tok.decode([i]))]
    pools = [list(range(tok.vocab_size))] + [p for p in (byte_ids, multibyte) if p]
    return [rng.choice(rng.choice(pools)) for _ in range(n)]


# ------------------------------------------------------------------ encode/decode


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_matches_transformers(pair, add_special_tokens):
    ours, hf = pair
    for text in TEXTS:
        expected = hf(text, add_special_tokens=add_special_tokens)["input_ids"]
        assert ours.encode(text, add_special_tokens=add_special_tokens) == expected, text


def test_text_starting_with_bos_gets_one_bos(pair):
    """A rendered template that prints BOS: one BOS, as apply_chat_template(tokenize=True) gives."""
    ours, hf = pair
    for text in TEXTS:
        text = hf.bos_token + text
        # apply_chat_template tokenizes its rendered text with add_special_tokens=False
        assert ours.encode(text) == hf(text, add_special_tokens=False)["input_ids"]
    if ours._post_processor_adds_bos:  # the case the rule exists for: plain transformers doubles it
        assert hf(hf.bos_token + "hi")["input_ids"][:2] == [hf.bos_token_id] * 2
        assert ours.encode(hf.bos_token + "hi")[:2] != [ours.bos_token_id] * 2


def test_decode_matches_transformers(pair):
    ours, hf = pair
    rng = random.Random(0)
    for n in range(1, 60):
        ids = random_ids(rng, ours, n)
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("ids, words", [
    ([1.7], r"^decode: token ids must be whole numbers, got '1.7' \(float\)$"),   # was decoded as id 1
    ([True], r"got 'True' \(bool\)$"),                                            # was decoded as id 1
    ("12", r"^decode takes token ids \(a list of whole numbers\), got str$"),     # was ids 1 and 2
    (None, r"got NoneType$"),                                                       # was a TypeError
])
def test_decode_refuses_ids_that_are_not_whole_numbers(pair, ids, words):
    ours, _ = pair
    with pytest.raises(SterError, match=words):
        ours.decode(ids)
    with pytest.raises(SterError, match=words.replace("decode", "decode_complete")):
        ours.decode_complete(ids)
    with pytest.raises(SterError, match="^token_to_id takes a token's text \\(str\\), got int$"):   # a TypeError
        ours.token_to_id(5)
    import numpy as np

    assert ours.decode(np.array([3, 4], np.int32)) == ours.decode([3, 4])   # numpy integers still read


def test_render_chat_refuses_tools_that_are_not_tool_schemas(tmp_path):
    """Tokenizer.render_chat(tools="x") (and encode_chat) gave the template a string as its tools; the library's
    tools are now checked as the server's and --tools are."""
    tok = Tokenizer.from_dir(write_dir(tmp_path, "bl"))
    messages = [{"role": "user", "content": "hi"}]
    for tools, words in (("x", "got a string$"), ([5], "tool 0 is a number, not an object")):
        with pytest.raises(SterError, match=f"^tools: .*{words}"):
            tok.render_chat(messages, tools=tools, template="{{ tools }}")
        with pytest.raises(SterError, match=f"^tools: .*{words}"):
            tok.encode_chat(messages, tools=tools, template="{{ tools }}")
    assert tok.render_chat(messages, tools=[{"type": "function", "function": {"name": "f"}}],
                           template="{{ tools[0].function.name }}") == "f"


def test_vocabulary_matches_transformers(pair):
    ours, hf = pair
    assert ours.vocab_size == len(hf)
    assert ours.bos_token_id == hf.bos_token_id
    assert ours.eos_token_id == hf.eos_token_id
    assert (ours.bos_token, ours.eos_token) == (hf.bos_token, hf.eos_token)
    ids = list(range(ours.vocab_size))
    tokens = hf.convert_ids_to_tokens(ids)
    assert [ours.id_to_token(i) for i in ids] == tokens
    assert [ours.token_to_id(t) for t in tokens] == hf.convert_tokens_to_ids(tokens)
    assert ours.token_to_id("not-a-token-here") is None


def test_end_of_generation_ids(tmp_path):
    from transformers import GenerationConfig

    sp_dir = write_dir(tmp_path / "sp", "sp")
    sp = Tokenizer.from_dir(sp_dir)
    gen = GenerationConfig.from_pretrained(str(sp_dir))
    hf = hf_tokenizer(sp_dir)
    # generation_config's ids, the tokenizer's EOS, and <end_of_turn> (a special in the vocabulary)
    assert sp.eos_token_ids == set(gen.eos_token_id) | {hf.eos_token_id, hf.convert_tokens_to_ids("<end_of_turn>")}
    assert sp.eos_token_ids == {2, 4}

    bl_dir = write_dir(tmp_path / "bl", "bl")
    bl, hf = Tokenizer.from_dir(bl_dir), hf_tokenizer(bl_dir)
    assert bl.eos_token_ids == {hf.eos_token_id, hf.convert_tokens_to_ids("<|endoftext|>")}

    # config.json alone (no generation_config.json), list form, nested text_config
    (sp_dir / "generation_config.json").unlink()
    (sp_dir / "config.json").write_text(json.dumps({"text_config": {"eos_token_id": [2, 106]}, "eos_token_id": 3}))
    assert Tokenizer.from_dir(sp_dir).eos_token_ids == {2, 3, 4, 106}


# ------------------------------------------------------------------ files and precedence


def test_chat_template_file_takes_precedence(tmp_path):
    path = write_dir(tmp_path / "d", "bl")
    (path / "chat_template.jinja").write_text("FILE {{ messages[0].content }}")
    ours, hf = Tokenizer.from_dir(path), hf_tokenizer(path)
    assert ours.chat_template == hf.chat_template == "FILE {{ messages[0].content }}"

    (path / "additional_chat_templates").mkdir()
    (path / "additional_chat_templates" / "tool_use.jinja").write_text("TOOLS {{ tools | tojson }}")
    ours, hf = Tokenizer.from_dir(path), hf_tokenizer(path)
    assert ours.chat_templates == hf.chat_template  # a dict of named templates in transformers
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert ours.get_chat_template(tools=tools) == hf.get_chat_template(tools=tools)
    assert ours.get_chat_template() == hf.get_chat_template()


def test_named_chat_templates_in_config(tmp_path):
    templates = [{"name": "default", "template": "D"}, {"name": "rag", "template": "R {{ documents }}"}]
    path = write_dir(tmp_path / "d", "bl", config={"chat_template": templates})
    ours, hf = Tokenizer.from_dir(path), hf_tokenizer(path)
    assert ours.chat_templates == hf.chat_template
    assert ours.get_chat_template("rag") == hf.get_chat_template("rag")
    with pytest.raises(SterError, match="no chat template named 'nope'"):
        ours.get_chat_template("nope")


def test_named_chat_templates_as_an_object_read_as_transformers_does(tmp_path):
    templates = {"default": "D {{ messages[0].content }}", "rag": "R {{ documents }}"}
    path = write_dir(tmp_path / "d", "bl", config={"chat_template": templates})
    ours, hf = Tokenizer.from_dir(path), hf_tokenizer(path)
    assert ours.chat_templates == hf.chat_template == templates
    messages = [{"role": "user", "content": "hi"}]
    assert ours.render_chat(messages) == hf.apply_chat_template(messages, tokenize=False) == "D hi"


@pytest.mark.parametrize("value, words", [
    (5, "chat_template is a number 5, not a Jinja template"),
    ({"default": "D", "tool_use": ["x"]}, "chat_template 'tool_use' is a list, not a Jinja template"),
    ([{"name": "default", "template": "D"}, {"name": "rag"}], "chat_template entry 2 is not"),
    (["{{ messages }}"], "chat_template entry 1 is not"),
    (True, "chat_template is true, not"),
])
def test_malformed_chat_template_is_an_error_when_a_template_is_wanted(tmp_path, value, words):
    """A number, a list entry without name/template, ... was read as "no chat template": prompts ran as raw text.
    The tokenizer still loads (raw text, --chat-template off), as with an unreadable chat_template.jinja; asking
    for the template is an error naming the file and the field."""
    path = write_dir(tmp_path / "d", "bl", config={"chat_template": value})
    ours = Tokenizer.from_dir(path)
    assert ours.encode("hello world") == Tokenizer.from_dir(write_dir(tmp_path / "ok", "bl")).encode("hello world")
    for want in (lambda: ours.chat_template, lambda: ours.render_chat([{"role": "user", "content": "hi"}])):
        with pytest.raises(SterError, match=re.escape(f"{path / 'tokenizer_config.json'}: {words}")):
            want()


def test_load_tokenizer_given_none_says_what_to_pass():
    """load_tokenizer(None) was a TypeError from os.fsencode."""
    from ster_py.load import load_tokenizer

    for value in (None, 5, " "):
        with pytest.raises(SterError, match=r"^no model given \(--model is .*\); pass a local directory, a \.gguf "
                                            "file, a preset name or a Hugging Face Hub id$"):
            load_tokenizer(value)


def test_no_chat_template(tmp_path):
    path = write_dir(tmp_path / "d", "bl", config={"chat_template": None})
    ours, hf = Tokenizer.from_dir(path), hf_tokenizer(path)
    assert ours.chat_template is None and hf.chat_template is None
    with pytest.raises(SterError, match="has no chat template"):
        ours.render_chat([{"role": "user", "content": "hi"}])


def test_added_tokens_from_config(tmp_path):
    """tokenizer_config.json's added_tokens_decoder and named specials that tokenizer.json lacks."""
    tk = sp_backend()
    n = tk.get_vocab_size()
    config = {
        "added_tokens_decoder": {
            str(n): {"content": "<tool_call>", "special": True, "lstrip": False, "rstrip": False,
                     "normalized": False, "single_word": False},
            str(n + 1): {"content": "[OUT]", "special": False, "lstrip": False, "rstrip": False,
                         "normalized": False, "single_word": False},
        },
        "pad_token": "<pad>",  # in neither file: added as a special token
        "additional_special_tokens": ["<extra_sp>"],
    }
    path = write_dir(tmp_path / "d", "sp", config=config, tk=tk)
    ours, hf = Tokenizer.from_dir(path), hf_tokenizer(path)
    assert ours.vocab_size == len(hf)
    text = "call <tool_call>f[OUT] now<pad><extra_sp>"
    assert ours.encode(text) == hf(text)["input_ids"]
    ids = ours.encode(text)
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    assert ours.special_tokens["pad_token"] == hf.pad_token


def test_special_tokens_map_json(tmp_path):
    """special_tokens_map.json is read when tokenizer_config.json has no added_tokens_decoder."""
    path = write_dir(tmp_path / "d", "sp", config={"eos_token": None})
    (path / "special_tokens_map.json").write_text(json.dumps(
        {"eos_token": {"content": "<end_of_turn>", "lstrip": False, "rstrip": False, "normalized": False,
                       "single_word": False}, "bos_token": "<s>"}
    ))
    ours, hf = Tokenizer.from_dir(path), hf_tokenizer(path)
    assert (ours.bos_token, ours.eos_token) == (hf.bos_token, hf.eos_token) == ("<s>", "<end_of_turn>")
    assert ours.eos_token_id == hf.eos_token_id


@pytest.mark.parametrize("with_post_processor", [True, False])
@pytest.mark.parametrize("add_bos_token", [True, False])
def test_add_bos_token_follows_transformers(tmp_path, with_post_processor, add_bos_token):
    """transformers 5 lets tokenizer.json's post-processor decide, whatever add_bos_token says."""
    path = write_dir(tmp_path / "d", "sp", config={"add_bos_token": add_bos_token, "add_eos_token": True},
                     tk=sp_backend(post_processor=with_post_processor))
    ours, hf = Tokenizer.from_dir(path), hf_tokenizer(path)
    for text in TEXTS:
        assert ours.encode(text) == hf(text)["input_ids"], text


def test_explicit_add_bos_add_eos(tmp_path):
    """The GGUF-path constructor: a backend without post-processor, BOS added by the wrapper.

    Oracle: transformers on the same vocabulary with a post-processor that adds <s>.
    """
    hf = hf_tokenizer(write_dir(tmp_path / "d", "sp"))
    ours = Tokenizer(sp_backend(post_processor=False), bos_token="<s>", eos_token="</s>", add_bos=True)
    for text in TEXTS:
        assert ours.encode(text) == hf(text)["input_ids"]
        assert ours.encode(text, add_special_tokens=False) == hf(text, add_special_tokens=False)["input_ids"]
        assert ours.encode("<s>" + text) == hf("<s>" + text, add_special_tokens=False)["input_ids"]
    with_eos = Tokenizer(sp_backend(post_processor=False), bos_token="<s>", eos_token="</s>", add_bos=False,
                         add_eos=True)
    assert with_eos.encode("Hello") == hf("Hello", add_special_tokens=False)["input_ids"] + [hf.eos_token_id]
    assert Tokenizer(sp_backend(), bos_token="<s>", eos_token_ids=[7]).eos_token_ids == {7, 4}
    with pytest.raises(SterError, match="not in the vocabulary"):
        Tokenizer(sp_backend(), bos_token="<nope>", add_bos=True)


def test_load_errors(tmp_path):
    with pytest.raises(SterError, match=r"failed to load tokenizer .*tokenizer\.json: file not found"):
        Tokenizer.from_dir(tmp_path / "missing")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    with pytest.raises(SterError, match=r"failed to load tokenizer .*broken.tokenizer\.json: "):
        Tokenizer.from_dir(broken)
    bad_config = write_dir(tmp_path / "bad_config", "bl")
    (bad_config / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(SterError, match=r"failed to load tokenizer .*tokenizer_config\.json: "):
        Tokenizer.from_dir(bad_config)
    # the tokenizer.json file itself is accepted as the path, and reads the files beside it
    good = write_dir(tmp_path / "good", "bl")
    by_file, by_dir = Tokenizer.from_dir(good / "tokenizer.json"), Tokenizer.from_dir(good)
    assert (by_file.chat_template, by_file.encode(TEXTS[1])) == (by_dir.chat_template, by_dir.encode(TEXTS[1]))


# ------------------------------------------------------------------ streaming


def stream(tok: Tokenizer, ids: list[int], skip: bool = False) -> list[str]:
    decoder = StreamDecoder(tok, skip_special_tokens=skip)
    return [decoder.feed(i) for i in ids] + [decoder.flush()]


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("stream")
    return Tokenizer.from_dir(write_dir(base / "sp", "sp")), Tokenizer.from_dir(write_dir(base / "bl", "bl"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), which=st.sampled_from([0, 1]), skip=st.booleans())
def test_stream_concatenation_equals_decode(tiny_pair, data, which, skip):
    tok = tiny_pair[which]
    seed = data.draw(st.integers(0, 2**32 - 1))
    n = data.draw(st.integers(0, 40))
    ids = random_ids(random.Random(seed), tok, n)
    pieces = stream(tok, ids, skip)
    assert "".join(pieces) == tok.decode_complete(ids, skip_special_tokens=skip)
    # a piece handed out before the end never stops inside a character
    assert not any(p.endswith("\ufffd") for p in pieces[:-1])
    # decode_complete differs from decode only where decode ends in U+FFFD
    if not tok.decode(ids, skip_special_tokens=skip).endswith("\ufffd"):
        assert tok.decode_complete(ids, skip_special_tokens=skip) == tok.decode(ids, skip_special_tokens=skip)


def single_byte_ids(tok: Tokenizer) -> dict[int, int]:
    """byte -> the id of a token that is that byte alone (a byte-fallback or byte-level alphabet token)."""
    found: dict[int, int] = {}
    for i in range(tok.vocab_size):
        piece = tok.token_bytes(i)
        if len(piece) == 1 and i not in tok.tk.get_added_tokens_decoder():
            found.setdefault(piece[0], i)
    return found


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), which=st.sampled_from([0, 1]), char=st.sampled_from("é€中🤖𝔘"))
def test_a_character_cut_at_the_end_is_left_out(tiny_pair, data, which, char):
    """A reply cut inside a multi-byte character (--max-new-tokens, the context, max_tokens) ended in U+FFFD:
    the cut character's first bytes are left out, by decode_complete and by the stream's flush alike."""
    tok = tiny_pair[which]
    ids = random_ids(random.Random(data.draw(st.integers(0, 2**32 - 1))), tok, data.draw(st.integers(0, 20)))
    if tok.decode(ids).endswith("\ufffd"):   # random ids may end in a cut character of their own
        ids += tok.encode(" fox", add_special_tokens=False)
    raw = char.encode("utf-8")
    cut = [single_byte_ids(tok)[b] for b in raw[: data.draw(st.integers(1, len(raw) - 1))]]
    assert tok.decode(ids + cut).endswith("\ufffd")   # what the reply used to end in
    assert tok.decode_complete(ids + cut) == tok.decode(ids)
    assert "".join(stream(tok, ids + cut)) == tok.decode(ids)
    # whole, the character stays; a U+FFFD the text itself holds (a stray byte, a character cut mid-text) stays
    assert tok.decode_complete(ids + cut + [single_byte_ids(tok)[b] for b in raw[len(cut):]]).endswith(char)
    stray = ids + [single_byte_ids(tok)[0x82]]
    assert tok.decode_complete(stray) == tok.decode(stray) and tok.decode(stray).endswith("\ufffd")
    middle = ids + cut + tok.encode(" fox", add_special_tokens=False)
    assert tok.decode_complete(middle) == tok.decode(middle) and "\ufffd" in tok.decode(middle)


def test_a_cut_inside_a_token_drops_its_one_replacement_character(tiny_pair):
    """A byte-level token can hold a character's first bytes after whole ones (a word and the lead byte of
    a character): its decode ends in one U+FFFD for them, which goes; the rest of the token stays."""
    bl = tiny_pair[1]
    ends = [i for i in range(bl.vocab_size) if len(bl.token_bytes(i)) > 1 and bl.token_bytes(i)[-1] >= 0xC2
            and "\ufffd" not in bl.token_bytes(i)[:-1].decode("utf-8", "replace")]
    assert ends, "the byte-level vocabulary has a token ending in a character's lead byte"
    for i in ends:
        head = bl.token_bytes(i)[:-1].decode("utf-8")
        assert bl.decode([i]) == head + "\ufffd" and bl.decode_complete([i]) == head
        then = [i, single_byte_ids(bl)[0x41]]   # an "A" after it: the U+FFFD is in the middle and stays
        assert bl.decode_complete(then) == bl.decode(then) == head + "\ufffdA"


@pytest.mark.real
def test_smollm2_emoji_cut_by_the_token_limit(smollm2_gguf):
    """`ster generate -p "Write 5 emoji" --max-new-tokens 20` gave '🌟🌟🌟🌟🌟🌟\ufffd': its 20 ids end in the
    first two of 🌟's three tokens."""
    from ster_py.load import load_model

    tok = load_model(str(smollm2_gguf)).tokenizer
    star = tok.encode("🌟", add_special_tokens=False)
    assert len(star) == 3 and tok.decode(star * 6 + star[:2]) == "🌟" * 6 + "\ufffd"
    assert tok.decode_complete(star * 6 + star[:2]) == "🌟" * 6
    assert "".join(stream(tok, star * 6 + star[:2])) == "🌟" * 6
    assert tok.decode_complete(star * 6 + star[:2] + [tok.token_to_id("<|im_end|>")], skip_special_tokens=True) \
        == "🌟" * 6


def test_stream_emits_as_it_goes(tiny_pair):
    """Text comes out token by token, not all at flush; multi-byte characters come out whole."""
    for tok in tiny_pair:
        for text in TEXTS[:4] + ["🤖🎉 ☃ 中文 𝔘"]:
            ids = tok.encode(text, add_special_tokens=False)
            pieces = stream(tok, ids)
            assert "".join(pieces) == tok.decode(ids)
            # only what the last token completes may wait for flush (byte-fallback runs wait one token)
            assert len(pieces[-1]) <= len(tok.decode(ids[-4:]))
            assert sum(1 for p in pieces if p) >= len(ids) // 4


def test_stream_byte_fallback_run_is_held(tiny_pair):
    """<0xE2><0x82><0xAC> is '€', but a 4th byte turns the whole run into U+FFFD: nothing leaks early."""
    sp = tiny_pair[0]
    run = [sp.token_to_id(f"<0x{b:02X}>") for b in (0xE2, 0x82, 0xAC, 0xFF)]
    word = sp.encode("fox", add_special_tokens=False)
    decoder = sp.stream_decoder()
    out = [decoder.feed(i) for i in word + run + word] + [decoder.flush()]
    assert "".join(out) == sp.decode(word + run + word)
    assert "€" not in "".join(out)


def test_token_bytes_are_the_raw_bytes_of_a_partial_character(tiny_pair):
    """A token that is part of a multi-byte character has its own bytes (OpenAI's logprobs ``bytes``), not
    the UTF-8 of the U+FFFD it decodes to: a byte-fallback token and a byte-level BPE token; the pieces
    joined are the decoded text (but for the space a SentencePiece decoder strips at the start)."""
    sp, bl = tiny_pair
    assert sp.token_bytes(sp.token_to_id("<0xE2>")) == b"\xe2" and sp.decode([sp.token_to_id("<0xE2>")]) == "\ufffd"
    for tok in (sp, bl):
        word = tok.encode(" fox", add_special_tokens=False)
        joined, text = b"".join(tok.token_bytes(i) for i in word), tok.decode(word).encode("utf-8")
        assert joined == text or (tok is sp and joined == b" " + text)
    euro = bl.encode("€", add_special_tokens=False)   # three bytes, no merge: one token each
    assert len(euro) > 1 and all(bl.decode([i]) == "\ufffd" for i in euro)
    assert b"".join(bl.token_bytes(i) for i in euro) == "€".encode("utf-8")


def test_token_bytes_keep_the_space_of_a_word_initial_piece(pair):
    """Each token's piece is its own, as transformers spells it (``convert_ids_to_tokens``): ▁ read as a
    space, ``<0xXX>`` as that byte, a byte-level spelling through GPT-2's byte map, an added token its
    text. A SentencePiece decoder's Strip (and Metaspace's prepend "first") drop a space at a text's
    start only: decoding one token alone lost the space of every word-initial ▁ token (b"world" for
    ``▁world``). The pieces of a text joined are its bytes, but for the first space."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    ours, theirs = pair
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    added = set(theirs.added_tokens_decoder)

    def expected(i: int) -> bytes:
        spelling = theirs.convert_ids_to_tokens(i)
        if i in added:
            return spelling.encode("utf-8")
        if isinstance(ours.tk.decoder, decoders.ByteLevel):
            return bytes(byte_of[c] for c in spelling)
        if len(spelling) == 6 and spelling.startswith("<0x"):
            return bytes([int(spelling[3:5], 16)])
        return spelling.replace("▁", " ").encode("utf-8")

    assert [ours.token_bytes(i) for i in range(ours.vocab_size)] == [expected(i) for i in range(ours.vocab_size)]
    for text in TEXTS + ["Hello world again", "€ ☃ 中文"]:
        ids = ours.encode(text, add_special_tokens=False)
        joined, decoded = b"".join(ours.token_bytes(i) for i in ids), ours.decode(ids).encode("utf-8")
        assert joined == decoded or joined == b" " + decoded, text
        assert [ours.token_text(i) for i in ids] == [ours.token_bytes(i).decode("utf-8", "replace") for i in ids]
    mark = "Ġ" if isinstance(ours.tk.decoder, decoders.ByteLevel) else "▁"
    word = next(i for i in range(ours.vocab_size)
                if ours.id_to_token(i).startswith(mark) and ours.id_to_token(i)[1:].isascii() and len(ours.id_to_token(i)) > 2)
    assert ours.token_text(word) == " " + ours.id_to_token(word)[1:]


# ------------------------------------------------------------------ real tokenizers

REAL_TEXTS = TEXTS + [
    "Résumé: naïve façade — “quotes” and ‘apostrophes’… 1234567890",
    "Здравствуй, мир! مرحبا بالعالم שלום עולם नमस्ते दुनिया",
    "<bos>already has bos",
    "   \n\n\t indented code:\n    for i in range(10):\n        print(i)",
]


@pytest.mark.real
@pytest.mark.parametrize("fixture", ["smollm2_hf", "gemma3_hf"])
def test_real_tokenizer_matches_transformers(request, fixture):
    path = request.getfixturevalue(fixture)
    ours, hf = Tokenizer.from_dir(path), hf_tokenizer(path)
    assert ours.vocab_size == len(hf)
    assert (ours.bos_token_id, ours.eos_token_id) == (hf.bos_token_id, hf.eos_token_id)
    for text in REAL_TEXTS:
        ids = hf(text)["input_ids"]
        if ours._starts_with_bos(text):
            ids = hf(text, add_special_tokens=False)["input_ids"]
        assert ours.encode(text) == ids, text
        assert ours.encode(text, add_special_tokens=False) == hf(text, add_special_tokens=False)["input_ids"]
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
        assert "".join(stream(ours, ids)) == hf.decode(ids)
    rng = random.Random(1)
    for _ in range(200):
        ids = [rng.randrange(ours.vocab_size) for _ in range(rng.randrange(1, 30))]
        for skip in (False, True):
            whole = hf.decode(ids, skip_special_tokens=skip)
            assert "".join(stream(ours, ids, skip=skip)) == ours.decode_complete(ids, skip_special_tokens=skip)
            # less a character cut at the end (decode_complete), the text is transformers'
            if not whole.endswith("\ufffd"):
                assert ours.decode_complete(ids, skip_special_tokens=skip) == whole
    # the end-of-turn token of each family stops generation
    end_of_turn = {"smollm2_hf": "<|im_end|>", "gemma3_hf": "<end_of_turn>"}[fixture]
    assert hf.convert_tokens_to_ids(end_of_turn) in ours.eos_token_ids
    assert hf.eos_token_id in ours.eos_token_ids


@pytest.mark.parametrize("template", ["{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} {% endfor %}",
                                      "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} "
                                      "{% endfor %}"])
def test_encode_chat_adds_no_special_tokens_of_its_own(pair, template):
    """``encode_chat`` encodes the rendered conversation as transformers' apply_chat_template(tokenize=True)
    does: the template writes BOS or not, the tokenizer adds none (the "sp" tokenizer's post-processor would
    add one; encode_chat did, giving a BOS the template never printed)."""
    ours, hf = pair
    messages = [{"role": "user", "content": "hello world"}]
    want = hf.apply_chat_template(messages, chat_template=template, tokenize=True)["input_ids"]
    assert ours.encode_chat(messages, template=template) == want


def test_bad_ids_and_texts_are_errors_not_backend_exceptions(pair):
    """id_to_token(-1) is None as its docstring says (the backend raised OverflowError), decode of a
    negative id a SterError (OverflowError), of an id past 2**32 no text as any unknown id; encode of
    None or bytes a SterError (AttributeError)."""
    ours, hf = pair
    assert ours.id_to_token(-1) is None and ours.id_to_token(2**40) is None
    assert ours.decode([5, 2**40]) == ours.decode([5]) == hf.decode([5])
    with pytest.raises(SterError, match="0 or more"):
        ours.decode([5, -1])
    for bad in (None, b"hi"):
        with pytest.raises(SterError, match="encode takes a text"):
            ours.encode(bad)
