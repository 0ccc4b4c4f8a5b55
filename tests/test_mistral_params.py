"""Mistral's own checkpoint format (params.json + consolidated.safetensors, no config.json).

The oracle is Transformers' Mistral: a tiny random checkpoint is written with Transformers, then rewritten
here in Mistral's layout from the reference code's conventions (seed 002; llama.cpp's converter reads the
same): params.json's own key spellings, the original tensor names, and the query and key rows put back in
the order of the adjacent-pair rotation (the inverse of the permutation Transformers' conversion script
applies). ster on the params.json directory must give Transformers' logits on the original within 1e-4
(f32), the same through the cache, and 16 equal greedy tokens.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from ster_py.errors import SterError
from ster_py.load import load_model
from ster_py.resolve import resolve
from tiny import build_checkpoint, check_against
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)

VOCAB = 128
PROMPT = np.random.RandomState(3).randint(3, VOCAB, size=16).tolist()
CONFIG = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=5000.0,
              sliding_window=None, tie_word_embeddings=False)


def _adjacent_pairs(w: np.ndarray, heads: int) -> np.ndarray:
    """Rows of a Transformers q/k projection [heads * d, in] in the reference code's order: each head's
    half-split rows (x_0..x_{d/2-1}, then their partners) interleaved back into adjacent pairs."""
    d = w.shape[0] // heads
    return w.reshape(heads, 2, d // 2, -1).transpose(0, 2, 1, 3).reshape(w.shape)


def _to_mistral_format(hf_dir, out, config: dict, reorder: bool = True) -> None:
    from safetensors.numpy import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    state = load_file(str(hf_dir / "model.safetensors"))
    rename = {"model.embed_tokens.weight": "tok_embeddings.weight", "model.norm.weight": "norm.weight",
              "lm_head.weight": "output.weight"}
    parts = {"input_layernorm": "attention_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk",
             "self_attn.v_proj": "attention.wv", "self_attn.o_proj": "attention.wo", "mlp.gate_proj": "feed_forward.w1",
             "mlp.down_proj": "feed_forward.w2", "mlp.up_proj": "feed_forward.w3"}
    tensors = {}
    for name, t in state.items():
        if name in rename:
            tensors[rename[name]] = t
            continue
        i, rest = name.split(".")[2], name.split(".", 3)[3]
        own, suffix = rest.rsplit(".", 1)
        if own == "self_attn.q_proj" and reorder:
            t = _adjacent_pairs(t, config["num_attention_heads"])
        elif own == "self_attn.k_proj" and reorder:
            t = _adjacent_pairs(t, config["num_key_value_heads"])
        tensors[f"layers.{i}.{parts[own]}.{suffix}"] = np.ascontiguousarray(t)
    save_file(tensors, str(out / "consolidated.safetensors"))
    params = {"dim": config["hidden_size"], "n_layers": config["num_hidden_layers"], "head_dim": config["head_dim"],
              "hidden_dim": config["intermediate_size"], "n_heads": config["num_attention_heads"],
              "n_kv_heads": config["num_key_value_heads"], "norm_eps": config["rms_norm_eps"],
              "vocab_size": config["vocab_size"], "rope_theta": config["rope_theta"], "max_seq_len": 64}
    if config.get("sliding_window"):
        params["sliding_window"] = config["sliding_window"]
    if config.get("tie_word_embeddings"):
        params["tied_embeddings"] = True
        assert "output.weight" not in tensors
    (out / "params.json").write_text(json.dumps(params))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf_dir / name, out / name)


CASES = {"gqa": {}, "sliding": dict(sliding_window=5, num_key_value_heads=4), "tied": dict(tie_word_embeddings=True)}


@pytest.mark.parametrize("case", list(CASES))
def test_params_json_directory_matches_transformers(case, tmp_path):
    config = dict(CONFIG, **CASES[case])
    ref = build_checkpoint(tmp_path / "hf", "mistral", config)
    _to_mistral_format(tmp_path / "hf", tmp_path / "native", config)
    resolved = resolve(str(tmp_path / "native"))
    assert resolved.config["model_type"] == "mistral" and resolved.config_path.name == "params.json"
    assert [p.name for p in resolved.weight_files] == ["consolidated.safetensors"]
    model = load_model(str(tmp_path / "native"))
    assert model.spec.model_type == "mistral"
    check_against(model, ref, PROMPT)
    assert model.tokenizer.eos_token == "</s>"  # tokenizer_config.json's eos_token


def test_rows_left_in_half_split_order_do_not_match(tmp_path):
    """A negative control: the same checkpoint with its q/k rows left in Transformers' order is not what
    ster reads from params.json (it rotates adjacent pairs), so its logits are far from the oracle's."""
    from tiny import reference_logits, rel_err

    ref = build_checkpoint(tmp_path / "hf", "mistral", CONFIG)
    _to_mistral_format(tmp_path / "hf", tmp_path / "native", CONFIG, reorder=False)
    ours = load_model(str(tmp_path / "native")).decoder.forward(PROMPT)
    assert rel_err(ours, reference_logits(ref, PROMPT)[0]) > 1e-2


@pytest.mark.parametrize("extra,match", [
    ({"moe": {"num_experts": 8, "num_experts_per_tok": 2}}, "experts"),
    ({"q_lora_rank": 16, "kv_lora_rank": 8}, "latent attention"),
    ({"yarn": {"factor": 4.0}}, "YaRN"),
    ({"quantization": {"qformat_weight": "fp8_e4m3"}}, "quantized"),
    ({"activation": "gelu"}, "activation 'gelu'"),
    ({"n_heads": 0}, "n_heads is 0"),
])
def test_what_is_not_run_is_refused_before_weights(tmp_path, extra, match):
    (tmp_path / "params.json").write_text(json.dumps({"dim": 64, "n_layers": 2, "n_heads": 4, "hidden_dim": 96,
                                                      "norm_eps": 1e-5, "vocab_size": VOCAB, **extra}))
    (tmp_path / "consolidated.safetensors").write_bytes(b"not read")
    with pytest.raises(SterError, match=match):
        resolve(str(tmp_path))


def test_missing_pieces_are_named(tmp_path):
    (tmp_path / "params.json").write_text(json.dumps({"dim": 64, "n_layers": 2}))
    with pytest.raises(SterError, match="lacks n_heads, hidden_dim, norm_eps, vocab_size"):
        resolve(str(tmp_path))
    (tmp_path / "params.json").write_text(json.dumps({"dim": 64, "n_layers": 2, "n_heads": 4, "hidden_dim": 96,
                                                      "norm_eps": 1e-5, "vocab_size": VOCAB}))
    (tmp_path / "tokenizer.model").write_text("{}")
    with pytest.raises(SterError, match="tokenizer is missing.*tekken.json.*found tokenizer.model.*tokenizer.json"):
        resolve(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(SterError, match="no consolidated.*safetensors weights"):
        resolve(str(tmp_path))


def test_convert_writes_the_rows_llama_cpp_rotates(tmp_path):
    """``ster convert`` of a params.json directory: the q/k rows are already in the adjacent-pair order llama.cpp
    rotates, so they are written as they are (not permuted as a Transformers checkpoint's are); llama.cpp's
    logits on the file and ster's from it equal Transformers' on the original, and the read-back finds no
    difference."""
    from export_helpers import write_bpe_tokenizer

    from ster_py import llamacpp
    from ster_py.convert import convert_model
    from tiny import reference_logits, rel_err

    config = dict(CONFIG, vocab_size=300)  # the byte-level BPE tokenizer convert writes needs 259+ ids
    ref = build_checkpoint(tmp_path / "hf", "mistral", config)
    _to_mistral_format(tmp_path / "hf", tmp_path / "native", config)
    write_bpe_tokenizer(tmp_path / "native", 300)
    report = convert_model(str(tmp_path / "native"), tmp_path / "m.gguf", "f32")
    assert report["differences"] == []
    want = reference_logits(ref, PROMPT)[0]
    assert rel_err(load_model(str(tmp_path / "m.gguf")).decoder.forward(PROMPT), want) < 1e-4
    assert rel_err(llamacpp.logits(tmp_path / "m.gguf", [PROMPT])[0], want) < 1e-3


def test_tune_merge_refuses_the_format_before_reading_weights(tmp_path):
    from ster_py.tune.merge import merge_adapter

    (tmp_path / "params.json").write_text(json.dumps({"dim": 64, "n_layers": 2, "n_heads": 4, "hidden_dim": 96,
                                                      "norm_eps": 1e-5, "vocab_size": VOCAB}))
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "consolidated.safetensors").write_bytes(b"not read")
    with pytest.raises(SterError, match="does not write Mistral's own format yet.*Transformers-format"):
        merge_adapter(str(tmp_path), tmp_path / "no-adapter", tmp_path / "out")


def test_consolidated_weights_beside_a_transformers_config_are_named(tmp_path):
    from tiny import write_tokenizer

    (tmp_path / "config.json").write_text(json.dumps(dict(CONFIG, model_type="mistral")))
    write_tokenizer(tmp_path)
    (tmp_path / "consolidated.safetensors").write_bytes(b"not read")
    with pytest.raises(SterError, match="no safetensors weights.*consolidated.safetensors, Mistral's own format"):
        resolve(str(tmp_path))


def test_vision_tower_beside_the_decoder_is_never_read(tmp_path):
    """A multimodal Mistral checkpoint in this format (params.json's vision_encoder block, the tower's and the
    adapter's tensors in the same file): the text decoder runs as Transformers' and the tower stays unread."""
    from safetensors.numpy import load_file, save_file

    from tiny import reference_logits, rel_err

    ref = build_checkpoint(tmp_path / "hf", "mistral", CONFIG)
    native = tmp_path / "native"
    _to_mistral_format(tmp_path / "hf", native, CONFIG)
    state = load_file(str(native / "consolidated.safetensors"))
    tower = {"vision_encoder.transformer.layers.0.attention.wq.weight": np.ones((8, 8), np.float32),
             "vision_language_adapter.w_in.weight": np.ones((8, 8), np.float32)}
    save_file({**state, **tower}, str(native / "consolidated.safetensors"))
    params = json.loads((native / "params.json").read_text())
    (native / "params.json").write_text(json.dumps({**params, "vision_encoder": {"hidden_size": 8}}))
    model = load_model(str(native))
    assert rel_err(model.decoder.forward(PROMPT), reference_logits(ref, PROMPT)[0]) < 1e-4
    assert sorted(model.decoder._weights.unused_tensors(model.spec)) == sorted(tower)


# ---------------------------------------------------------------- tekken.json (Mistral's own tokenizer file)
# The oracles: the tiktoken library on the same ranks and pattern (ids offset by the special count, as
# mistral_common's Tekkenizer lays them out) and Transformers' own tekken converter
# (transformers.integrations.mistral.convert_tekken_tokenizer) for the special tokens' ids.

#: The split pattern of Mistral's tekken.json files (as llama.cpp's src/llama-vocab.cpp quotes it).
TEKKEN_PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
                  r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN_SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"]
N_SPECIAL = 10  # five named, five <SPECIAL_i> fillers
N_UNUSED = 7  # ranks past default_vocab_size - N_SPECIAL, which the tokenizer must not use
CORPUS = ("The quick brown fox jumps over the lazy dog. def tokenize(text):\n    return [x for x in text]\n"
          "Les élèves ont mangé 12 crêpes à 9h30! 东京和北京 1234567 HTTPServer isUpperCase ünïcödé\n\t\n")
TEXTS = ["Hello world", "  leading and   inner spaces  ", "digits 0123456789 and 3.14159", "def f(x):\n\treturn x**2\n",
         "Les élèves à l'école — naïve façade", "东京 and 北京", "emoji 🦊🐶 and 👍🏽!", "HTTPServer isUpperCase",
         "literal <s> and [INST] stay text", "zqaxw zqbxw", "\n\n\nnewlines\r\n", ""]


def _tekken_ranks() -> list[bytes]:
    """Byte-level BPE ranks trained on CORPUS: the 256 bytes, then each merge's token in merge order."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.train_from_iterator([CORPUS] * 4, trainers.BpeTrainer(
        vocab_size=256 + 160, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    back = {c: b for b, c in bytes_to_unicode().items()}
    ranks = [bytes([b]) for b in range(256)]
    for merge in json.loads(tk.to_str())["model"]["merges"]:
        a, b = merge.split(" ") if isinstance(merge, str) else merge
        token = bytes(back[c] for c in a + b)
        if token not in ranks:
            ranks.append(token)
    return ranks


def _write_tekken(path, ranks: list[bytes], **edit) -> dict:
    import base64

    unused = [b"zq" + bytes([97 + i]) + b"xw" for i in range(N_UNUSED)]  # "zqaxw", ...: in TEXTS
    doc = {"config": {"pattern": TEKKEN_PATTERN, "num_vocab_tokens": len(ranks) + N_UNUSED,
                      "default_vocab_size": len(ranks) + N_SPECIAL, "default_num_special_tokens": N_SPECIAL,
                      "version": "v7"},
           "vocab": [{"rank": i, "token_bytes": base64.b64encode(t).decode(), "token_str": t.decode("utf-8", "replace")}
                     for i, t in enumerate(ranks + unused)],
           "special_tokens": [{"rank": i, "token_str": s, "is_control": True} for i, s in enumerate(TEKKEN_SPECIALS)]}
    doc.update(edit)
    (path / "tekken.json").write_text(json.dumps(doc))
    return doc


@pytest.fixture(scope="module")
def tekken(tmp_path_factory):
    """A Mistral-format checkpoint whose only tokenizer is a tiny tekken.json, its Transformers original, the
    tiktoken encoding of the same ranks and the ranks."""
    import tiktoken

    ranks = _tekken_ranks()
    root = tmp_path_factory.mktemp("tekken")
    config = dict(CONFIG, vocab_size=len(ranks) + N_SPECIAL)
    ref = build_checkpoint(root / "hf", "mistral", config)
    _to_mistral_format(root / "hf", root / "native", config)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (root / "native" / name).unlink()
    _write_tekken(root / "native", ranks)
    enc = tiktoken.Encoding("tekken-tiny", pat_str=TEKKEN_PATTERN,
                            mergeable_ranks={t: i for i, t in enumerate(ranks)}, special_tokens={})
    return root / "native", ref, enc, ranks


def test_tekken_ids_match_tiktoken_and_transformers(tekken):
    from transformers.integrations.mistral import convert_tekken_tokenizer

    from ster_py.tokenizer import Tokenizer

    path, _, enc, ranks = tekken
    tok = Tokenizer.from_dir(path)
    hf = convert_tekken_tokenizer(str(path / "tekken.json"))
    assert tok.vocab_size == len(ranks) + N_SPECIAL == hf.vocab_size  # len(hf) also counts the <pad> it adds
    tok.tk.encode_special_tokens = True  # special texts as plain text, as tiktoken with no specials
    for text in TEXTS + [CORPUS]:
        want = [i + N_SPECIAL for i in enc.encode(text, disallowed_special=())]
        assert tok.encode(text, add_special_tokens=False) == want, text
        assert tok.encode(text, add_special_tokens=True) == [1] + want, text  # <s> first (llama.cpp's add_bos)
        assert tok.decode(want) == text
    tok.tk.encode_special_tokens = False
    for i, s in enumerate(TEKKEN_SPECIALS + [f"<SPECIAL_{i}>" for i in range(5, N_SPECIAL)]):
        assert tok.token_to_id(s) == hf.convert_tokens_to_ids(s) == i
    assert (tok.bos_token, tok.eos_token, tok.bos_token_id, tok.eos_token_id) == ("<s>", "</s>", 1, 2)
    ids = tok.encode("[INST]Hi[/INST]", add_special_tokens=False)
    assert ids == hf.encode("[INST]Hi[/INST]", add_special_tokens=False) and ids[0] == 3 and ids[-1] == 4
    assert tok.decode(ids, skip_special_tokens=True) == "Hi"


def test_tekken_tokenize_cli_and_model_load(tekken, tmp_path):
    import subprocess
    import sys

    path, ref, enc, _ = tekken
    text = "The élèves 🦊 1234 <s>"
    r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", "tokenize", "-m", str(path),
                        "--text", text, "--json", "-q"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ids"] == [1] + [i + N_SPECIAL for i in enc.encode(text, disallowed_special=())]
    resolved = resolve(str(path))
    assert resolved.tokenizer_path.name == "tekken.json"
    from ster_py.load import load_tokenizer

    bare = tmp_path / "bare"  # the tokenizer is read without the weights being present
    bare.mkdir()
    for name in ("params.json", "tekken.json"):
        shutil.copy(path / name, bare / name)
    tok = load_tokenizer(str(bare))
    assert tok.encode(text)[-1] == 1  # "<s>" in the text read as the special token by default
    tok.tk.encode_special_tokens = True  # as the CLI's default --no-parse-special
    assert tok.encode(text) == json.loads(r.stdout)["ids"]
    model = load_model(str(path))
    check_against(model, ref, PROMPT)  # the same logits as with tokenizer.json: the tokenizer changes no weight
    assert model.tokenizer.eos_token == "</s>" and model.tokenizer.bos_token_id == 1


def _bad(doc: dict, **edit) -> dict:
    out = json.loads(json.dumps(doc))
    for key, value in edit.items():
        where, _, field = key.partition("__")
        if field:
            out[where][field] = value
        else:
            out[where] = value
    return out


@pytest.mark.parametrize("edit,match", [
    (dict(vocab="x"), "not a Mistral tekken.json"),
    (dict(special_tokens=None), "no special_tokens list"),
    (dict(config__default_num_special_tokens=-1), "default_num_special_tokens is -1"),
    (dict(config__default_vocab_size=10 ** 9), "default_vocab_size is 1000000000"),
    (dict(config__pattern=""), "config.pattern is not the split regex"),
    (dict(config__pattern="(unclosed"), "not a regex the tokenizers library reads"),
    ("base64", "vocab entry 300 holds no valid base64"),
    ("rank", "vocab entry 300 gives rank 299"),
    ("dup", "a token is listed under two ranks"),
    ("byte", "the single byte 0x41 is not among"),
    ("short", "its vocab lists"),
    ("special", "special_tokens entry 1 gives rank 0"),
])
def test_invalid_tekken_is_refused(tmp_path, edit, match):
    from ster_py.tiktoken_bpe import from_tekken

    ranks = [bytes([b]) for b in range(256)] + [b"ab", b"abc", b"the", b" the"] + [bytes([b, b]) for b in range(40)]
    doc = _write_tekken(tmp_path, ranks)
    if isinstance(edit, dict):
        doc = _bad(doc, **edit)
    elif edit == "base64":
        doc["vocab"][300]["token_bytes"] = "!!not base64"
    elif edit == "rank":
        doc["vocab"][300]["rank"] = 299
    elif edit == "dup":
        doc["vocab"][299]["token_bytes"] = doc["vocab"][298]["token_bytes"]  # both kept
    elif edit == "byte":
        doc["vocab"][0x41]["token_bytes"] = "WlpaWg=="  # b"ZZZZ" in place of b"A"
    elif edit == "short":
        doc["vocab"] = doc["vocab"][:280]
    elif edit == "special":
        doc["special_tokens"][1]["rank"] = 0
    (tmp_path / "tekken.json").write_text(json.dumps(doc))
    with pytest.raises(SterError, match=match):
        from_tekken(tmp_path / "tekken.json")
    (tmp_path / "tekken.json").write_text("{not json")
    with pytest.raises(SterError, match="not valid JSON"):
        from_tekken(tmp_path / "tekken.json")


def test_tekken_checkpoint_converts_for_llama_cpp(tekken, tmp_path):
    """``ster convert`` of the tekken.json checkpoint: llama.cpp's ids on the GGUF equal tiktoken's (plus the
    special offset, <s> first) and its logits Transformers'."""
    from ster_py import llamacpp
    from ster_py.convert import convert_model
    from tiny import reference_logits, rel_err

    path, ref, enc, _ = tekken
    report = convert_model(str(path), tmp_path / "m.gguf", "f32")
    assert report["differences"] == []
    texts = [t for t in TEXTS if t]
    got = llamacpp.tokenize(tmp_path / "m.gguf", texts, add_special=True)
    assert got == [[1] + [i + N_SPECIAL for i in enc.encode(t, disallowed_special=())] for t in texts]
    assert rel_err(llamacpp.logits(tmp_path / "m.gguf", [PROMPT])[0], reference_logits(ref, PROMPT)[0]) < 1e-3
