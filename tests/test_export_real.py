"""Export on the two real models (their Hugging Face copies): ``ster convert``, control vectors, merged adapters,
perplexity, each against llama.cpp.

- Round trip at F16, Q8_0, Q4_0 and Q4_K_M of both models: gguf-py reads the file; F16, Q8_0 and Q4_0 tensors are gguf-py's quantization of the checkpoint's
  tensors byte for byte (their first 4096 rows; F32 ones equal them); the
  conversion reports no difference from the checkpoint; llama.cpp's greedy 32 tokens equal ster's on the F16
  file, and on the quantized files llama.cpp's logits along its greedy path are within parity's llama.cpp
  tolerance (0.1) of ster's with the same top-1 token at >= 90 % of the positions (llama.cpp's 8-bit activations
  part the greedy paths at near-ties, on its own files too; test_quantize shows the quantized files are
  llama.cpp's own quantizer's, byte for byte).
- Tokenizer: llama.cpp tokenizes texts from our F16 files as the checkpoints' tokenizer.json does.
- Q4_K: re-quantizing our SmolLM2 F16 file to Q4_K_M gives llama.cpp's quantizer's types, and reconstruction
  errors within 5 % of llama.cpp's on every Q4_K tensor (in fact the same bytes).
- Control vector: a PCA vector exported with ``ster vector export`` and loaded by llama.cpp gives the 16 greedy
  tokens ``ster generate --vector`` gives, which differ from the unsteered ones.
- Merged adapter: ``tune merge --output FILE.gguf`` runs in llama.cpp with the greedy tokens of the checkpoint
  with that adapter.
- Perplexity: ``ster perplexity`` and llama.cpp's llama-perplexity computation agree within 1e-3 on the F16 file
  and on the exact weights of the Q4_K_M file (see the test for llama.cpp's 8-bit activations).
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest

from ster_py import llamacpp
from ster_py.convert import checkpoint_sources, convert_model
from ster_py.generate import Sampling, generate
from ster_py.gguf.reader import GGUFFile
from tiny import gguf_py_reader

pytestmark = pytest.mark.real

PLAIN = "The three primary colours are"
# a fixed English text (not README.md, which changes with the project)
PERPLEXITY_TEXT = Path(__file__).resolve().parent / "data" / "perplexity.txt"


@pytest.fixture(scope="module")
def hf(smollm2_hf, gemma3_hf):
    return {"smollm2": smollm2_hf, "gemma3": gemma3_hf}


@pytest.fixture(scope="module")
def converted(hf, tmp_path_factory):
    """(model, type) -> (report, path), converted on first use."""
    root = tmp_path_factory.mktemp("export_real")
    cache: dict = {}

    def get(model: str, ftype: str):
        if (model, ftype) not in cache:
            report = convert_model(str(hf[model]), root / f"{model}-{ftype}.gguf", ftype)
            cache[(model, ftype)] = (report, Path(report["output"]))
        return cache[(model, ftype)]

    return get


@functools.lru_cache(maxsize=None)
def _sources(path: str) -> dict:
    from ster_py.config import spec_from_config
    from ster_py.resolve import resolve

    r = resolve(path)
    spec = spec_from_config(r.config, r.family, path)
    return {s.name: s for s in checkpoint_sources(r, spec, r.family, r.config)}


# Both real models at each of the four types.
# Gemma 3 keeps the two whose outcome its shapes change: f16 (262,144-token vocabulary, exact greedy) and
# q4_k_m (640-wide rows fall back from K-quants); its q8_0 and q4_0 run the quantizers SmolLM2's check byte
# for byte against gguf-py (~18 s each in the suite).
ROUND_TRIPS = [("smollm2", t) for t in ("f16", "q8_0", "q4_0", "q4_k_m")] + [("gemma3", t) for t in ("f16", "q4_k_m")]


@pytest.mark.parametrize("model, ftype", ROUND_TRIPS)
def test_round_trip(model, ftype, hf, converted):
    import gguf

    from ster_py.load import load_model

    report, path = converted(model, ftype)
    assert report["differences"] == [] and report["tokenizer_notes"] == []
    reader = gguf_py_reader(path)
    ours = GGUFFile(path)
    assert [(t.name, t.tensor_type.name) for t in reader.tensors] == [(n, t.type_name) for n, t in ours.tensors.items()]
    sources = _sources(str(hf[model]))
    assert set(sources) == set(ours.tensors)
    for n, t in ours.tensors.items():
        if t.type_name in ("F32", "F16", "Q8_0", "Q4_0"):
            x = sources[n].make()
            rows = (x.reshape(-1, x.shape[-1]) if x.ndim > 1 else x.reshape(1, -1))[:4096]  # blocks are row-local:
            want = gguf.quants.quantize(rows, getattr(gguf.GGMLQuantizationType, t.type_name))  # the first rows
            assert np.array_equal(t.raw_rows[:len(rows)], np.ascontiguousarray(want).view(np.uint8)
                                  .reshape(len(rows), -1)), n
    loaded = load_model(str(path), precision="auto")  # as `ster` loads it: F16 rows read as stored
    ids = loaded.tokenizer.encode(PLAIN)
    theirs = llamacpp.greedy(path, ids, 32)
    if ftype == "f16":
        assert generate(loaded.decoder, ids, Sampling(max_new_tokens=32)).ids == theirs
        return
    # Quantized products: llama.cpp rounds activations to 8 bits (ster keeps 16), which moves logits by a few per
    # cent (README, `ster parity --reference llama.cpp`) and lets the two greedy paths part at a near-tie within 32
    # tokens; the same holds for llama.cpp's own files (the preset Q4_1). Along llama.cpp's path ster must stay
    # within parity's llama.cpp tolerance and pick llama.cpp's token almost everywhere.
    seq = ids + theirs[:-1]
    mine = loaded.decoder.forward(seq)
    (ref,) = llamacpp.logits(path, [seq])
    assert np.linalg.norm(mine - ref) / np.linalg.norm(ref) < 0.1
    assert (mine.argmax(1) == ref.argmax(1)).mean() >= 0.9


TEXTS = ["Hello world! It's 12 o'clock.", "  spaced\tout\n\nlines  ", "naïve café, 東京 3.14159 😀",
         "<|im_start|>user\nHi<|im_end|>", "def f(x):\n    return x**2  # comment"]


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_llamacpp_tokenizes_like_the_checkpoint(model, hf, converted):
    from ster_py.tokenizer import Tokenizer

    _, path = converted(model, "f16")
    tok = Tokenizer.from_dir(hf[model])
    want = [tok.encode(t, add_special_tokens=True) for t in TEXTS]
    assert llamacpp.tokenize(path, TEXTS, add_special=True, parse_special=True) == want


@pytest.fixture(scope="module")
def smollm2_q4_k_m(converted):
    """ster's Q4_K_M of ster's SmolLM2 F16 file (re-quantized, as llama-quantize would from that file)."""
    _, f16 = converted("smollm2", "f16")
    return Path(convert_model(str(f16), f16.with_name("smollm2-f16-requantized-q4_k_m.gguf"), "q4_k_m")["output"])


def test_q4_k_within_5_percent_of_llamacpps_quantizer(converted, smollm2_q4_k_m, tmp_path):
    _, f16 = converted("smollm2", "f16")
    theirs = GGUFFile(llamacpp.quantize(f16, tmp_path / "llama.cpp-Q4_K_M.gguf", "Q4_K_M"))
    ours = GGUFFile(smollm2_q4_k_m)
    source = GGUFFile(f16)
    assert {n: t.type_name for n, t in ours.tensors.items()} == {n: t.type_name for n, t in theirs.tensors.items()}
    q4k = [n for n, t in theirs.tensors.items() if t.type_name == "Q4_K"]
    # SmolLM2's ffn_down rows (1536 weights) are whole super-blocks (576-wide rows fall back to Q5_0); the mix
    # keeps the use_more_bits layers' ffn_down at Q6_K
    assert len(q4k) == 16 and all(n.endswith("ffn_down.weight") for n in q4k)
    for n in q4k:
        x = source.tensors[n].dequantize()
        err_ours = np.linalg.norm(ours.tensors[n].dequantize() - x)
        err_theirs = np.linalg.norm(theirs.tensors[n].dequantize() - x)
        assert err_ours <= 1.05 * err_theirs, n
        assert np.array_equal(ours.tensors[n].raw, theirs.tensors[n].raw), n


def test_control_vector_steers_llamacpp_like_ster(converted, tmp_path):
    from ster_py.capture import capture
    from ster_py.load import load_model
    from ster_py.steering import export_control_vector, pca, steering_hook

    _, path = converted("smollm2", "f16")
    model = load_model(str(path), precision="auto")
    happy = ["I love this! What a wonderful, happy day.", "This is fantastic, I am so glad.",
             "Great news, everything is perfect."]
    sad = ["I hate this. What a terrible, sad day.", "This is awful, I am so upset.", "Bad news, everything is ruined."]
    layers = list(range(1, model.spec.num_hidden_layers))  # llama.cpp's control vectors start at layer 1
    vec = pca(capture(model, happy, layers, "last", chat_template="off"),
              capture(model, sad, layers, "last", chat_template="off"))
    export_control_vector(vec, tmp_path / "happy.gguf", strength=4.0)
    ids = model.tokenizer.encode("My day was")
    plain = generate(model.decoder, ids, Sampling(max_new_tokens=16)).ids
    steered = generate(model.decoder, ids, Sampling(max_new_tokens=16), layer_hook=steering_hook(vec, 4.0)).ids
    assert steered != plain
    assert llamacpp.greedy(path, ids, 16, control_vector=tmp_path / "happy.gguf") == steered


def test_merged_adapter_gguf_runs_in_llamacpp_with_the_adapted_models_tokens(hf, tmp_path):
    from safetensors.numpy import save_file

    from ster_py.adapters import apply_adapter, load_adapter_for
    from ster_py.load import load_model
    from ster_py.tune.merge import merge_adapter_to_gguf

    base = load_model(str(hf["smollm2"]))
    s = base.spec
    rng = np.random.default_rng(3)
    shapes = {"q": (s.num_attention_heads * s.head_dim, s.hidden_size),
              "v": (s.num_key_value_heads * s.head_dim, s.hidden_size)}
    tensors = {}
    for i in range(s.num_hidden_layers):
        for t, (out, inp) in shapes.items():
            tensors[f"layers.{i}.{t}.a"] = (rng.standard_normal((4, inp)) * 0.05).astype(np.float32)
            tensors[f"layers.{i}.{t}.b"] = (rng.standard_normal((out, 4)) * 0.05).astype(np.float32)
    save_file(tensors, str(tmp_path / "ad.lora.safetensors"))
    (tmp_path / "ad.lora.json").write_text(json.dumps({
        "model": str(hf["smollm2"]), "model_revision": None, "rank": 4, "alpha": 8, "targets": ["q", "v"],
        "layers": list(range(s.num_hidden_layers)), "hidden_size": s.hidden_size}))
    ids = base.tokenizer.encode(PLAIN)
    plain = generate(base.decoder, ids, Sampling(max_new_tokens=32)).ids
    apply_adapter(base, load_adapter_for(str(tmp_path / "ad.lora.json"), base))
    adapted = generate(base.decoder, ids, Sampling(max_new_tokens=32)).ids
    assert adapted != plain
    out = tmp_path / "merged.gguf"
    report = merge_adapter_to_gguf(str(hf["smollm2"]), tmp_path / "ad.lora.json", out, type_name="f16")
    assert report["merged_tensors"] == 60 and report["gguf"]["differences"] == []
    assert llamacpp.greedy(out, ids, 32) == adapted


def test_perplexity_agrees_with_llamacpp(converted, smollm2_q4_k_m, tmp_path):
    """F16: llama.cpp's computation on the same file agrees within 1e-3. Q4_K_M: ster decodes the blocks inside
    float32 products, so its perplexity is that of the file's exact weights: llama.cpp on the file's float32
    dequantization agrees within 1e-3. llama.cpp on the Q4_K_M file itself rounds each activation row to 8 bits
    first (q8_K / q8_0 dot products); on 252 scored tokens that moved its perplexity by -1.5 % to +0.9 % across
    three texts, hence its 3 % bound. On AMX's tiles (the default on such a CPU: inputs and decoded weights
    rounded to bfloat16, ``qmatmul.set_quantized_tiles``) the Q4_K_M file's perplexity stays within 5e-3 of the
    exact weights' (measured 1.3e-3), and within 1e-3 with the tiles off."""
    from ster_py._kernels import qmatmul
    from ster_py.load import load_model
    from ster_py.perplexity import perplexity

    text = PERPLEXITY_TEXT.read_text(encoding="utf-8")
    _, f16 = converted("smollm2", "f16")
    exact = Path(convert_model(str(smollm2_q4_k_m), tmp_path / "q4_k_m-dequantized.gguf", "f32")["output"])
    ours = {path: perplexity(load_model(str(path), precision="auto"), text, 128, max_chunks=4) for path in (f16, smollm2_q4_k_m)}
    tiles = qmatmul.simd_level() == "amx_bf16" and qmatmul.bf16_inputs()
    checks = [(ours[f16], f16, f16, 1e-3), (ours[smollm2_q4_k_m], smollm2_q4_k_m, exact, 5e-3 if tiles else 1e-3),
              (ours[smollm2_q4_k_m], smollm2_q4_k_m, None, 0.03)]
    if tiles:
        was = qmatmul.set_quantized_tiles(False)
        try:
            checks.append((perplexity(load_model(str(smollm2_q4_k_m)), text, 128, max_chunks=4), smollm2_q4_k_m, exact,
                           1e-3))
        finally:
            qmatmul.set_quantized_tiles(was)
    for mine, path, reference, bound in checks:
        theirs = llamacpp.perplexity(reference or path, text, 128, max_chunks=4)
        assert mine["tokens"] == len(theirs["nll"]) == 4 * 63
        assert abs(mine["ppl"] / theirs["ppl"] - 1) < bound, (path.name, reference, mine["ppl"], theirs["ppl"])
