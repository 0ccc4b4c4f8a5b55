"""chatglm (ChatGLM2, ChatGLM3, GLM-4-9B): a family without a Transformers implementation (issue 16).

The oracle is built, not assumed. A tiny random Transformers ``glm`` model has ChatGLM's math once
its tensors are rewritten into ChatGLM's layout and config spellings (seed 002): q/k/v stacked into
``self_attention.query_key_value`` (all queries then the groups' keys and values under
multi_query_attention; each head's query, key and value in turn otherwise, as ChatGLM's remote code
views the rows), ``mlp.gate_up_proj`` as ``mlp.dense_h_to_4h`` (gate rows above up rows), the rest
renamed below ``transformer.``; GLM's rope_theta is 10000 * rope_ratio and its partial rotation the
first half of each head by adjacent pairs. ster on that directory must give Transformers' logits
(1e-4, f32) and 16 equal greedy tokens.

What that equivalence cannot reach (LayerNorms under rmsnorm false, halves under original_rope false,
biases under add_bias_linear) is checked against ``_reference``, a numpy forward pass written here from
seed 002's words, itself first checked against Transformers on the equivalence case.

The tokenizer part checks GLM-4's tiktoken ``tokenizer.model`` reader against ``tiktoken`` itself.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from ster_py.errors import SterError
from ster_py.families import FAMILIES, gate
from ster_py.generate import Sampling, generate
from ster_py.load import load_model
from tiny import build_checkpoint, write_tokenizer
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)
from tiny import reference_greedy, reference_logits, reference_split_logits, rel_err

VOCAB = 128
PROMPT = np.random.RandomState(7).randint(3, VOCAB, size=16).tolist()
HIDDEN, HEADS, HEAD_DIM, FFN, LAYERS = 64, 4, 16, 96, 2


def _chatglm_config(**over) -> dict:
    """A config.json in ChatGLM's own spellings (GLM-4-9B's keys)."""
    c = {"model_type": "chatglm", "architectures": ["ChatGLMModel"], "num_layers": LAYERS,
         "padded_vocab_size": VOCAB, "hidden_size": HIDDEN, "ffn_hidden_size": FFN, "kv_channels": HEAD_DIM,
         "num_attention_heads": HEADS, "seq_length": 64, "layernorm_epsilon": 1e-5, "rmsnorm": True,
         "add_qkv_bias": True, "add_bias_linear": False, "multi_query_attention": True,
         "multi_query_group_num": 2, "rope_ratio": 1, "original_rope": True, "post_layer_norm": True,
         "apply_residual_connection_post_layernorm": False, "tie_word_embeddings": False,
         "eos_token_id": 2, "pad_token_id": 0}
    c.update(over)
    return c


def _stack_qkv(q, k, v, heads: int, mqa: bool):
    """ChatGLM's query_key_value rows (weight [rows, in] or bias [rows]) from separate q, k, v."""
    if mqa:
        return np.concatenate([q, k, v])
    per = lambda t: t.reshape(heads, 1, -1, *t.shape[1:])  # noqa: E731
    return np.concatenate([per(q), per(k), per(v)], axis=1).reshape(-1, *q.shape[1:])


def _write(path, config: dict, state: dict) -> None:
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    # real checkpoints store the rotation's inv_freq buffer; nothing reads it
    rot = config["kv_channels"] // 2
    state = dict(state, **{"transformer.rotary_pos_emb.inv_freq":
                           (1.0 / 10000 ** (np.arange(0, rot, 2) / rot)).astype(np.float32)})
    save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, str(path / "model.safetensors"),
              metadata={"format": "pt"})
    write_tokenizer(path, VOCAB)


def _from_glm(path, *, mqa: bool, rope_ratio: float):
    """A tiny Transformers GLM model saved in ChatGLM's layout; returns the Transformers model."""
    from safetensors.numpy import load_file

    kv = 2 if mqa else HEADS
    ref = build_checkpoint(path / "glm", "glm", dict(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=kv, head_dim=HEAD_DIM, max_position_embeddings=64,
        rms_norm_eps=1e-5, attention_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0 * rope_ratio, "partial_rotary_factor": 0.5}))
    glm = load_file(str(path / "glm" / "model.safetensors"))
    out = {"transformer.embedding.word_embeddings.weight": glm["model.embed_tokens.weight"],
           "transformer.encoder.final_layernorm.weight": glm["model.norm.weight"],
           "transformer.output_layer.weight": glm["lm_head.weight"]}
    for i in range(LAYERS):
        g, c = f"model.layers.{i}.", f"transformer.encoder.layers.{i}."
        for kind in ("weight", "bias"):
            out[c + f"self_attention.query_key_value.{kind}"] = _stack_qkv(
                *(glm[g + f"self_attn.{p}_proj.{kind}"] for p in "qkv"), HEADS, mqa)
        out[c + "self_attention.dense.weight"] = glm[g + "self_attn.o_proj.weight"]
        out[c + "mlp.dense_h_to_4h.weight"] = glm[g + "mlp.gate_up_proj.weight"]
        out[c + "mlp.dense_4h_to_h.weight"] = glm[g + "mlp.down_proj.weight"]
        out[c + "input_layernorm.weight"] = glm[g + "input_layernorm.weight"]
        out[c + "post_attention_layernorm.weight"] = glm[g + "post_attention_layernorm.weight"]
    config = _chatglm_config(multi_query_attention=mqa, rope_ratio=rope_ratio)
    if not mqa:
        config.pop("multi_query_group_num")
    _write(path / "chatglm", config, out)
    return ref, config, out


# ------------------------------------------------------------------ numpy reference from seed 002's words
def _reference(config: dict, state: dict, ids: list[int]) -> np.ndarray:
    """ChatGLM's logits float64 [T, vocab], written from seed 002 (not from ster's decoder).

    Heads are kv_channels wide, multi_query_group_num key/value groups under multi_query_attention
    (query_key_value: queries, then keys, then values) and one per head otherwise (each head's query,
    key and value in turn); the first half of each head rotates at base 10000 * rope_ratio, by adjacent
    pairs under original_rope and by halves otherwise; RMS norms under rmsnorm, LayerNorms (weight and
    bias) otherwise; dense_h_to_4h holds the gate rows above the up rows (SwiGLU); biases where stored.
    """
    c = config
    heads, d, eps = c["num_attention_heads"], c["kv_channels"], c["layernorm_epsilon"]
    mqa = c.get("multi_query_attention", False)
    kv = c["multi_query_group_num"] if mqa else heads
    s = {k: v.astype(np.float64) for k, v in state.items()}

    def norm(x, name):
        if c.get("rmsnorm", True):
            return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * s[name + ".weight"]
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * s[name + ".weight"] + s[name + ".bias"]

    def linear(x, name):
        y = x @ s[name + ".weight"].T
        return y + s[name + ".bias"] if name + ".bias" in s else y

    t = len(ids)
    rot = d // 2
    inv = (10000.0 * c.get("rope_ratio", 1)) ** (-np.arange(0, rot, 2) / rot)
    ang = np.arange(t)[:, None] * inv[None]  # [T, rot / 2]
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]

    def rope(x):  # [T, n, d]
        r, rest = x[..., :rot], x[..., rot:]
        if c.get("original_rope", True):
            a, b = r[..., 0::2], r[..., 1::2]
            out = np.stack([a * cos - b * sin, b * cos + a * sin], -1).reshape(r.shape)
        else:
            a, b = r[..., :rot // 2], r[..., rot // 2:]
            out = np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)
        return np.concatenate([out, rest], -1)

    x = s["transformer.embedding.word_embeddings.weight"][ids]
    mask = np.triu(np.full((t, t), -np.inf), 1)
    for i in range(c["num_layers"]):
        p = f"transformer.encoder.layers.{i}."
        qkv = linear(norm(x, p + "input_layernorm"), p + "self_attention.query_key_value")
        if mqa:
            q, k, v = np.split(qkv, [heads * d, (heads + kv) * d], -1)
        else:
            q, k, v = np.moveaxis(qkv.reshape(t, heads, 3, d), 2, 0)
        q, k, v = rope(q.reshape(t, heads, d)), rope(k.reshape(t, kv, d)), v.reshape(t, kv, d)
        k, v = np.repeat(k, heads // kv, 1), np.repeat(v, heads // kv, 1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d) + mask
        w = np.exp(scores - scores.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        att = np.einsum("hqk,khd->qhd", w, v).reshape(t, heads * d)
        x = x + linear(att, p + "self_attention.dense")
        y = linear(norm(x, p + "post_attention_layernorm"), p + "mlp.dense_h_to_4h")
        gate_rows, up = np.split(y, 2, -1)
        x = x + linear(gate_rows / (1 + np.exp(-gate_rows)) * up, p + "mlp.dense_4h_to_h")
    return linear(norm(x, "transformer.encoder.final_layernorm"), "transformer.output_layer")


# ------------------------------------------------------------------ equivalence with Transformers' GLM
EQUIV = {"mqa-rope-ratio": dict(mqa=True, rope_ratio=3.0), "mha-grouped-rows": dict(mqa=False, rope_ratio=1.0)}


@pytest.fixture(scope="module", params=list(EQUIV))
def equivalent(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    ref, config, state = _from_glm(path, **EQUIV[request.param])
    return path / "chatglm", ref, config, state


def test_matches_transformers_glm(equivalent):
    path, ref, config, state = equivalent
    model = load_model(str(path))
    assert model.spec.model_type == "chatglm"
    ref_logits, _ = reference_logits(ref, PROMPT)
    err = rel_err(model.decoder.forward(PROMPT), ref_logits)
    assert err < 1e-4, f"logits rel err {err:.2e}"
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:9], cache), model.decoder.forward(PROMPT[9:], cache)])
    assert rel_err(pieces, reference_split_logits(ref, PROMPT, 9)) < 1e-4
    assert generate(model.decoder, PROMPT, Sampling(max_new_tokens=16)).ids == reference_greedy(ref, PROMPT, 16)
    assert model.decoder._weights.unused_tensors(model.spec) == []
    # the numpy reference the per-feature cases use is itself Transformers' forward here
    assert rel_err(_reference(config, state, PROMPT), ref_logits) < 1e-5


# ------------------------------------------------------------------ each extra against the numpy reference
def _random_state(config: dict, seed: int) -> dict:
    rng = np.random.RandomState(seed)
    heads, d = config["num_attention_heads"], config["kv_channels"]
    h, f = config["hidden_size"], config["ffn_hidden_size"]
    kv = config["multi_query_group_num"] if config.get("multi_query_attention") else heads
    rows = (heads + 2 * kv) * d
    layer_norm = not config.get("rmsnorm", True)
    biased = config.get("add_bias_linear", False)

    def w(*shape, scale=0.15):
        return (rng.randn(*shape) * scale).astype(np.float32)

    def norm(name):
        out = {name + ".weight": (1 + w(h, scale=0.3))}
        if layer_norm:
            out[name + ".bias"] = w(h, scale=0.1)
        return out

    s = {"transformer.embedding.word_embeddings.weight": w(VOCAB, h),
         "transformer.output_layer.weight": w(VOCAB, h), **norm("transformer.encoder.final_layernorm")}
    for i in range(config["num_layers"]):
        p = f"transformer.encoder.layers.{i}."
        s.update(norm(p + "input_layernorm"))
        s.update(norm(p + "post_attention_layernorm"))
        s[p + "self_attention.query_key_value.weight"] = w(rows, h)
        if biased or config.get("add_qkv_bias"):
            s[p + "self_attention.query_key_value.bias"] = w(rows, scale=0.1)
        s[p + "self_attention.dense.weight"] = w(h, heads * d)
        s[p + "mlp.dense_h_to_4h.weight"] = w(2 * f, h)
        s[p + "mlp.dense_4h_to_h.weight"] = w(h, f)
        if biased:
            s[p + "self_attention.dense.bias"] = w(h, scale=0.1)
            s[p + "mlp.dense_h_to_4h.bias"] = w(2 * f, scale=0.1)
            s[p + "mlp.dense_4h_to_h.bias"] = w(h, scale=0.1)
    return s


FEATURES = {
    "layernorm": dict(rmsnorm=False),
    "halves": dict(original_rope=False, rope_ratio=2.5),
    "bias-linear": dict(add_bias_linear=True, add_qkv_bias=False),
    "no-bias": dict(add_qkv_bias=False),
    "all-mha": dict(rmsnorm=False, original_rope=False, add_bias_linear=True, multi_query_attention=False,
                    layernorm_epsilon=1e-6),
}


@pytest.mark.parametrize("case", list(FEATURES))
def test_feature_matches_the_seed_reference(case, tmp_path):
    config = _chatglm_config(**FEATURES[case])
    state = _random_state(config, seed=len(case))
    _write(tmp_path, config, state)
    model = load_model(str(tmp_path))
    want = _reference(config, state, PROMPT)
    err = rel_err(model.decoder.forward(PROMPT), want)
    assert err < 1e-5, f"logits rel err {err:.2e}"
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:9], cache), model.decoder.forward(PROMPT[9:], cache)])
    assert rel_err(pieces, want) < 1e-5
    assert model.decoder._weights.unused_tensors(model.spec) == []


def test_switches_reach_the_spec(tmp_path):
    """Each per-feature case differs from the default only if the switch is read: check the spec."""
    from ster_py.config import spec_from_config

    def spec(**over):
        c = _chatglm_config(**over)
        return spec_from_config(c, gate(c, "config.json"), "config.json")

    base = spec()
    assert (base.norm, base.num_key_value_heads, base.head_dim, base.vocab_size) == ("rms", 2, HEAD_DIM, VOCAB)
    assert base.layers[0].rope.rotary_dim == HEAD_DIM // 2 and base.norm_eps == 1e-5
    assert spec(rmsnorm=False).norm == "layer"
    assert spec(multi_query_attention=False).num_key_value_heads == HEADS
    assert spec(multi_query_attention=False).fused_qkv == "grouped" and base.fused_qkv == "concat"
    assert spec(original_rope=False).layers[0].rope.interleaved is False and base.layers[0].rope.interleaved


def test_says_it_has_no_reference_here():
    from typer.testing import CliRunner

    from ster_py.cli import app

    rows = json.loads(CliRunner().invoke(app, ["families", "--json"]).stdout)
    row = next(r for r in rows if r["model_type"] == "chatglm")
    assert FAMILIES["chatglm"].unconfirmed and row["note"] == "no reference implementation here"


@pytest.mark.parametrize("over,match", [
    ({"apply_residual_connection_post_layernorm": True}, "apply_residual_connection_post_layernorm"),
    ({"post_layer_norm": False}, "post_layer_norm"),
    ({"position_encoding_2d": True, "inner_hidden_size": 16384}, "ChatGLM-6B"),
    ({"rope_ratio": -1}, "rope_ratio"),
    ({"multi_query_group_num": 0}, "multi_query_group_num"),
])
def test_refusals(over, match, tmp_path):
    """Refused by the gate, before any weight is read (no weights are written here)."""
    config = _chatglm_config(**over)
    with pytest.raises(SterError, match=match):
        gate(config, "config.json")
    (tmp_path / "config.json").write_text(json.dumps(config))
    write_tokenizer(tmp_path, VOCAB)
    with pytest.raises(SterError, match=match):
        load_model(str(tmp_path))


@pytest.mark.parametrize("key, value", [("multi_query_attention", "false"), ("rmsnorm", "yes"),
                                        ("original_rope", 0), ("add_qkv_bias", "true")])
def test_switches_must_be_booleans(key, value, tmp_path):
    """A string "false" is truthy in Python: a switch that is not a JSON boolean is refused by name (issue 17)."""
    (tmp_path / "config.json").write_text(json.dumps(_chatglm_config(**{key: value})))
    write_tokenizer(tmp_path, VOCAB)
    with pytest.raises(SterError, match=f"{key} must be true or false"):
        load_model(str(tmp_path))


# ------------------------------------------------------------------ tiktoken rank files, against tiktoken
CORPUS = ("The three primary colors are red, blue, and green. What is the capital of France? Paris! "
          "It's 2024; they'll say I'd've done 12345 things.\n\n  def f(x):\n\treturn x ** 2  # square\n"
          "GLM-4 模型 的 中文 分词 测试，北京 是 中国 的 首都。 Ünïcödé naïve café — “quotes” ... "
          "HELLO World DON'T Stop hello world don't stop\r\n") * 3
TEXTS = ["The three primary colors are", "a Parisian Answer", "What is the capital of France? Answer in one word.",
         "DON'T you'LL we'Ve", "  leading spaces and trailing   ", "line\nbreaks\r\n\r\nand\ttabs \n ",
         "numbers 1234567 and 3.14159", "中文分词：北京是首都！", "emoji 🙂👍🏽 and bytes \x00\x7f",
         "café naïve Ünïcödé — “ok”", "def g(y):\n    return y[::-1]\n", "hello world[gMASK]<sop>text<|user|>hi",
         "<|endoftext|>", ""]
# Characters the split patterns treat differently: cases (titlecase ǅ), contractions, digits, every kind of
# space and line break, punctuation, Han, kana, Hangul, combining marks, emoji, a lone control byte.
_ALPHABET = list("aZsStTdDlLmMrReEvV'’ 0123456789  \t\n\r\n.,;:!?-_()[]{}<>/\\\"#@$%^&*+=|~`") + [
    "ǅ", "é", "\u0301", "\u0308", "中", "文", "北", "京", "の", "カ", "한", "글", "🙂", "👍🏽", "\u00a0", "\u3000", "\x00",
    "\x7f", "Ω", "ß", "İ", "\u2028"]


def _random_texts(count: int, seed: int) -> list[str]:
    rng = np.random.RandomState(seed)
    return ["".join(rng.choice(_ALPHABET, size=rng.randint(1, 40))) for _ in range(count)]


GLM_SPECIALS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
                "<|assistant|>", "<|observation|>"]


def _train_ranks(pattern: str, merges: int = 300, extra: tuple[bytes, ...] = ()) -> list[bytes]:
    """A small byte-level BPE rank list learnt from CORPUS (single bytes in a shuffled order first), then
    ``extra`` tokens that no merge reaches (kept whole only when a piece is exactly one of them)."""
    import collections

    import regex

    order = np.random.RandomState(3).permutation(256)
    tokens = [bytes([int(b)]) for b in order]
    known = set(tokens)
    words = collections.Counter(tuple(bytes([b]) for b in piece.encode()) for piece in regex.findall(pattern, CORPUS))
    for _ in range(merges):
        pairs = collections.Counter()
        for word, count in words.items():
            for a, b in zip(word, word[1:]):
                pairs[(a, b)] += count
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        if a + b not in known:
            tokens.append(a + b)
            known.add(a + b)
        merged = collections.Counter()
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return tokens + [t for t in extra if t not in known]


def _write_ranks(path, tokens: list[bytes]) -> None:
    import base64

    path.write_bytes(b"".join(base64.b64encode(t) + b" " + str(i).encode() + b"\n" for i, t in enumerate(tokens)))


def _glm_tokenizer_dir(path, tokens: list[bytes]):
    path.mkdir(parents=True, exist_ok=True)
    _write_ranks(path / "tokenizer.model", tokens)
    n = len(tokens)
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "ChatGLM4Tokenizer", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "added_tokens_decoder": {str(n + i): {"content": t, "special": True, "normalized": False, "lstrip": False,
                                              "rstrip": False, "single_word": False}
                                 for i, t in enumerate(GLM_SPECIALS)}}))
    return {t: n + i for i, t in enumerate(GLM_SPECIALS)}


@pytest.fixture(scope="module")
def glm_ranks():
    from ster_py.tiktoken_bpe import GLM4_PATTERN

    return _train_ranks(GLM4_PATTERN, extra=(b" Parisian", b"Answer", b"\xe4\xb8\xad\xe6\x96\x87\xe5"))


def _tiktoken(tokens: list[bytes], pattern: str, specials: dict[str, int]):
    import tiktoken  # the oracle (the test extra installs it)

    return tiktoken.Encoding("test", pat_str=pattern, mergeable_ranks={t: i for i, t in enumerate(tokens)},
                             special_tokens=specials)


def test_glm4_tokenizer_model_encodes_as_tiktoken(glm_ranks, tmp_path):
    from ster_py.tiktoken_bpe import GLM4_PATTERN
    from ster_py.tokenizer import Tokenizer

    specials = _glm_tokenizer_dir(tmp_path, glm_ranks)
    oracle = _tiktoken(glm_ranks, GLM4_PATTERN, specials)
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.vocab_size == len(glm_ranks) + len(GLM_SPECIALS)
    for piece in (" Parisian", "Answer"):  # pieces that are tokens no merge reaches stay whole
        assert tok.encode(piece, add_special_tokens=False) == [glm_ranks.index(piece.encode())]
    for text in TEXTS + [CORPUS] + _random_texts(300, seed=11):
        want = oracle.encode(text, allowed_special="all")
        assert tok.encode(text, add_special_tokens=False) == want, text
        assert tok.encode(text) == [specials["[gMASK]"], specials["<sop>"]] + want, text
        assert tok.decode(want, skip_special_tokens=False) == oracle.decode(want) == text
    assert tok.eos_token_id == specials["<|endoftext|>"] and specials["<|endoftext|>"] in tok.eos_token_ids


def test_kimi_tiktoken_model_encodes_as_tiktoken(tmp_path):
    from ster_py.tiktoken_bpe import KIMI_PATTERN, KIMI_SPECIAL_COUNT
    from ster_py.tokenizer import Tokenizer

    ranks = _train_ranks(KIMI_PATTERN, merges=200)
    n = len(ranks)
    _write_ranks(tmp_path / "tiktoken.model", ranks)
    named = {n: "[BOS]", n + 1: "[EOS]", n + 4: "<|im_end|>", n + 5: "<|im_user|>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "TikTokenTokenizer", "bos_token": "[BOS]", "eos_token": "[EOS]",
        "added_tokens_decoder": {str(i): {"content": t, "special": True} for i, t in named.items()}}))
    specials = {named.get(i, f"<|reserved_token_{i}|>"): i for i in range(n, n + KIMI_SPECIAL_COUNT)}
    oracle = _tiktoken(ranks, KIMI_PATTERN, specials)
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.vocab_size == n + KIMI_SPECIAL_COUNT
    assert tok.token_to_id(f"<|reserved_token_{n + 2}|>") == n + 2 and tok.token_to_id("<|im_end|>") == n + 4
    mixed = f"CamelCaseWords and HTTPServer 北京欢迎你<|im_user|>x<|reserved_token_{n + 9}|>"
    for text in TEXTS + _random_texts(300, seed=12) + [CORPUS, mixed]:
        want = oracle.encode(text, allowed_special="all")
        assert tok.encode(text, add_special_tokens=False) == want, text
        assert tok.decode(want, skip_special_tokens=False) == text


def test_chatglm_checkpoint_with_only_tokenizer_model_resolves(glm_ranks, tmp_path):
    """A local chatglm directory with tokenizer.model (no tokenizer.json) resolves and loads its tokenizer."""
    from ster_py.resolve import resolve

    config = _chatglm_config(padded_vocab_size=len(glm_ranks) + len(GLM_SPECIALS))
    state = _random_state(config, seed=1)
    state["transformer.embedding.word_embeddings.weight"] = np.zeros((config["padded_vocab_size"], HIDDEN), np.float32)
    state["transformer.output_layer.weight"] = np.zeros((config["padded_vocab_size"], HIDDEN), np.float32)
    _write(tmp_path, config, state)
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "tokenizer_config.json").unlink()
    specials = _glm_tokenizer_dir(tmp_path, glm_ranks)
    assert resolve(str(tmp_path)).tokenizer_path == tmp_path / "tokenizer.model"
    model = load_model(str(tmp_path))
    assert model.tokenizer.encode("Paris")[:2] == [specials["[gMASK]"], specials["<sop>"]]


def test_other_tokenizer_model_is_refused_by_its_class(glm_ranks, tmp_path):
    from ster_py.resolve import resolve

    config = _chatglm_config()
    _write(tmp_path, config, _random_state(config, seed=1))
    (tmp_path / "tokenizer.json").unlink()
    _glm_tokenizer_dir(tmp_path, glm_ranks)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    with pytest.raises(SterError, match="tokenizer is missing.*tokenizer.model, under tokenizer_class "
                                        ".LlamaTokenizer.*ChatGLM4Tokenizer"):
        resolve(str(tmp_path))


@pytest.mark.parametrize("damage,match", [
    (lambda lines: lines[:5] + [b"not-base64!! 5"] + lines[6:], "line 6 holds no valid base64"),
    (lambda lines: lines[:5] + [lines[5].split()[0]] + lines[6:], "line 6 is not"),
    (lambda lines: lines[:5] + [lines[5].split()[0] + b" 7"] + lines[6:], "rank 7"),
    (lambda lines: [lines[0].split()[0] + b" " + str(i).encode() if i == 3 else line
                    for i, line in enumerate(lines)], "two ranks"),
    (lambda lines: [b"YWJj " + str(i).encode() if i == 0 else line for i, line in enumerate(lines)], "single byte"),
    (lambda lines: lines + [b"QUFB" * 400 + b" " + str(len(lines)).encode()], "bytes"),
])
def test_hostile_rank_files_are_refused(damage, match, glm_ranks, tmp_path):
    from ster_py.tokenizer import Tokenizer

    _glm_tokenizer_dir(tmp_path, glm_ranks)
    lines = (tmp_path / "tokenizer.model").read_bytes().split(b"\n")[:-1]
    (tmp_path / "tokenizer.model").write_bytes(b"\n".join(damage(lines)) + b"\n")
    with pytest.raises(SterError, match=match):
        Tokenizer.from_dir(tmp_path)


def test_rank_file_kind_and_size_are_checked_before_reading(tmp_path, monkeypatch):
    import os

    from ster_py import tiktoken_bpe
    from ster_py.tokenizer import Tokenizer

    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "ChatGLM4Tokenizer"}))
    os.mkfifo(tmp_path / "tokenizer.model")  # would block an open() forever
    with pytest.raises(SterError, match="not a regular file"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.model").unlink()
    (tmp_path / "tokenizer.model").write_bytes(b"QQ== 0\n" * 64)
    monkeypatch.setattr(tiktoken_bpe, "MAX_RANK_FILE_BYTES", 100)
    with pytest.raises(SterError, match="over ster's limit"):
        Tokenizer.from_dir(tmp_path)


def test_hub_repository_with_only_tokenizer_model(glm_ranks, tmp_path, monkeypatch):
    """From the Hub: tokenizer.model (with tokenizer_config.json) is fetched in tokenizer.json's place, before
    any weight; under another tokenizer class the repository is refused as having no tokenizer."""
    from test_resolve import FakeRemote, repo_files

    import huggingface_hub
    from huggingface_hub import constants
    from ster_py.resolve import resolve

    _glm_tokenizer_dir(tmp_path / "tok", glm_ranks)
    files = repo_files(config=_chatglm_config())
    del files["tokenizer.json"]
    files["tokenizer.model"] = (tmp_path / "tok" / "tokenizer.model").read_bytes()
    files["tokenizer_config.json"] = (tmp_path / "tok" / "tokenizer_config.json").read_bytes()
    def install(where: str, served: dict) -> FakeRemote:
        fake = FakeRemote(tmp_path / where, served)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(huggingface_hub.HfApi, "model_info",
                            lambda api, repo_id, **kw: fake.model_info(api, repo_id, **kw))
        monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake.hf_hub_download)
        return fake

    fake = install("hub", files)
    r = resolve("org/glm")
    assert r.tokenizer_path.name == "tokenizer.model"
    assert fake.downloads[:3] == ["config.json", "tokenizer.model", "tokenizer_config.json"]
    fake = install("hub2", dict(files, **{"tokenizer_config.json": b'{"tokenizer_class": "LlamaTokenizer"}'}))
    with pytest.raises(SterError, match="tokenizer is missing"):
        resolve("org/glm")
    assert "tokenizer.model" in fake.downloads and not any(n.endswith(".safetensors") for n in fake.downloads)


def test_merges_are_the_ones_transformers_recovers(glm_ranks, tmp_path):
    """Seed 002: the merges are recovered from the ranks as Transformers' TikTokenConverter recovers them."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    from ster_py.tiktoken_bpe import _merges, _spelled, read_ranks

    _write_ranks(tmp_path / "tokenizer.model", glm_ranks)
    vocab, merges = TikTokenConverter().extract_vocab_merges_from_model(str(tmp_path / "tokenizer.model"))
    tokens = read_ranks(tmp_path / "tokenizer.model")
    assert tokens == glm_ranks and len(merges) > 150
    assert {_spelled(t): i for i, t in enumerate(tokens)} == vocab and _merges(tokens) == merges


def test_mutated_rank_files_fail_only_with_ster_errors(glm_ranks, tmp_path):
    """Bounded fuzzing: random byte edits, line drops, swaps and duplicates of a rank file either load (and
    then encode) or raise SterError, never another exception."""
    import random

    from ster_py.tokenizer import Tokenizer

    _glm_tokenizer_dir(tmp_path, glm_ranks)
    seed = (tmp_path / "tokenizer.model").read_bytes()
    rng = random.Random(0)
    outcomes = {"loaded": 0, "refused": 0}
    for _ in range(150):
        data = bytearray(seed)
        lines = bytes(data).split(b"\n")
        kind = rng.randrange(5)
        if kind == 0:
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 1:
            del lines[rng.randrange(len(lines))]
            data = bytearray(b"\n".join(lines))
        elif kind == 2:
            i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
            data = bytearray(b"\n".join(lines))
        elif kind == 3:
            lines.insert(rng.randrange(len(lines)), lines[rng.randrange(len(lines))])
            data = bytearray(b"\n".join(lines))
        else:
            data = data[:rng.randrange(len(data))]
        (tmp_path / "tokenizer.model").write_bytes(bytes(data))
        try:
            tok = Tokenizer.from_dir(tmp_path)
            tok.decode(tok.encode("fuzzed text 123 中文"))
            outcomes["loaded"] += 1
        except SterError:
            outcomes["refused"] += 1
    assert outcomes["refused"] > 50 and outcomes["loaded"] > 0, outcomes
