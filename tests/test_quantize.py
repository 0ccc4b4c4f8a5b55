"""ster's quantizers against their oracles.

- The Cython kernels give the numpy reference's bytes for every type ster writes.
- Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (and F16, BF16) give gguf-py's bytes (gguf-py's ``quants.quantize``).
- Every type decodes through gguf-py's dequantizer to ster's own decoding (the layout is GGML's).
- Re-quantizing an F16 GGUF gives llama.cpp's own quantizer's file (``llama_model_quantize``, no importance
  matrix), tensor by tensor: the same type for every tensor (the _M mixes, the output and tied-embedding
  rules, the fallbacks for rows that do not fit a block) and the same bytes, K-quants included.
"""
from __future__ import annotations

import numpy as np
import pytest

from ster_py.gguf.quantize import QUANTIZED_TYPES, quantize, quantize_reference, to_bf16_bits

LEGACY = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")


def _tensor(rows: int = 12, cols: int = 512, seed: int = 0) -> np.ndarray:
    """Random rows of different scales plus the awkward blocks: zeros, negative zeros, a constant, one sign,
    tiny values, a single outlier, huge values."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 3.0, (rows, 1))).astype(np.float32)
    x[1, :256] = 0.0
    x[2, :256] = -0.0
    x[3, 32:96] = 1.5
    x[4, :256] = np.abs(x[4, :256])
    x[5, :64] = 1e-20
    x[6, 100] = 40.0
    x[7, 256:] *= 1e4
    return x


@pytest.mark.parametrize("type_name", QUANTIZED_TYPES)
def test_kernel_equals_numpy_reference(type_name):
    x = _tensor()
    got, ref = quantize(x, type_name), quantize_reference(x, type_name)
    assert got.shape == ref.shape and got.dtype == np.uint8
    assert np.array_equal(got, ref), f"{(got != ref).sum()} bytes differ"
    assert np.array_equal(quantize(x, type_name, n_threads=1), got)  # the bytes do not depend on threads


@pytest.mark.parametrize("type_name", LEGACY)
def test_legacy_types_equal_gguf_py(type_name):
    import gguf

    x = _tensor(seed=1)
    theirs = gguf.quants.quantize(x, getattr(gguf.GGMLQuantizationType, type_name))
    assert np.array_equal(quantize(x, type_name), theirs.reshape(x.shape[0], -1))


def test_float_types_equal_gguf_py():
    import gguf

    x = _tensor(seed=2)
    x[0, :4] = [np.nan, np.inf, -np.inf, 65520.0]  # NaN stays NaN, overflow to inf, as numpy/gguf-py
    assert np.array_equal(quantize(x, "F16").view(np.float16).reshape(x.shape).view(np.uint16),
                          gguf.quants.quantize(x, gguf.GGMLQuantizationType.F16).view(np.uint16))
    assert np.array_equal(quantize(x, "BF16"), gguf.quants.quantize(x, gguf.GGMLQuantizationType.BF16).reshape(12, -1))
    assert np.array_equal(to_bf16_bits(x), gguf.quants.quantize(x, gguf.GGMLQuantizationType.BF16).view(np.uint16))
    assert np.array_equal(quantize(x, "F32").view(np.float32).reshape(x.shape), x, equal_nan=True)


def test_scale_half_conversion_equals_numpy():
    """The kernels' own float -> half (for the block scales) rounds as numpy does: ties to even,
    subnormals, overflow, infinities and NaN."""
    from ster_py._kernels import quantize as k

    rng = np.random.default_rng(3)
    halves = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    finite = np.sort(halves[np.isfinite(halves)])
    mids = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)  # exact ties and near-ties
    x = np.concatenate([halves, mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf)),
                        rng.standard_normal(10000).astype(np.float32) * 10.0 ** rng.integers(-9, 6, 10000),
                        np.array([7e4, -7e4, 65519.99, 65520.0, 1e-8, 3e-8, 2.98e-8, -0.0], np.float32)]).astype(np.float32)
    out = np.empty(x.size, np.uint16)
    k.f32_to_f16_bits(np.ascontiguousarray(x), out)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    assert np.array_equal(out[~nan], want[~nan])
    assert np.isnan(out[nan].view(np.float16)).all()


@pytest.mark.parametrize("type_name", QUANTIZED_TYPES)
def test_gguf_py_decodes_our_blocks(type_name):
    """GGML's block layout: gguf-py's dequantizer reads our bytes as ster's does, and the reconstruction is
    as close as the type allows."""
    import gguf

    from ster_py.gguf.quants import dequantize

    x = _tensor(seed=4)
    raw = quantize(x, type_name)
    ours = dequantize(raw, type_name, x.shape)
    theirs = gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, type_name)).reshape(x.shape)
    assert np.array_equal(ours, theirs)
    bound = {"Q8_0": 0.01, "Q6_K": 0.03, "Q5_0": 0.06, "Q5_1": 0.06, "Q5_K": 0.06}.get(type_name, 0.12)
    assert np.linalg.norm(ours - x) / np.linalg.norm(x) < bound


def test_rows_that_do_not_fit_are_refused():
    from ster_py.errors import SterError

    with pytest.raises(SterError, match="whole number"):
        quantize(np.zeros((2, 96), np.float32), "Q4_K")
    with pytest.raises(SterError, match="cannot write"):
        quantize(np.zeros((2, 32), np.float32), "IQ4_NL")


# ----------------------------------------------------------------------------- against llama.cpp's quantizer

# An 8-layer Llama (untied head, feed-forward rows of 80: Q4_K -> Q5_0 -> F16 fallbacks, and the _M mixes'
# layer choice) and a GPT-2 (tied head, fused biased qkv, learned positions), written at F16 by ster.
RECIPE_CASES = {
    "llama": ("llama", dict(vocab_size=320, hidden_size=256, intermediate_size=80, num_hidden_layers=8,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=64,
                            tie_word_embeddings=False)),
    "gpt2": ("gpt2", dict(vocab_size=320, n_embd=256, n_layer=3, n_head=4, n_positions=64)),
}
FILE_TYPES = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q6_k", "q4_k_m", "q5_k_m")


@pytest.fixture(scope="module")
def f16_files(tmp_path_factory):
    from export_helpers import tiny_bpe_checkpoint

    from ster_py.convert import convert_model

    root = tmp_path_factory.mktemp("recipe")
    out = {}
    for name, (model_type, config) in RECIPE_CASES.items():
        tiny_bpe_checkpoint(root / name, model_type, config)
        out[name] = convert_model(str(root / name), root / f"{name}-f16.gguf", "f16")["output"]
    return out


# ster's q4_k and q5_k are llama-quantize --pure of its Q4_K_S and Q5_K_S (every quantizable tensor in the type).
PURE = {"q4_k": "Q4_K_S", "q5_k": "Q5_K_S"}


@pytest.mark.parametrize("name, ftype", [("llama", t) for t in FILE_TYPES + tuple(PURE)]
                         + [("gpt2", t) for t in ("q8_0", "q4_0", "q4_k_m")])
def test_requantized_gguf_equals_llamacpps(name, ftype, f16_files, tmp_path):
    from ster_py import llamacpp
    from ster_py.convert import convert_model
    from ster_py.gguf.reader import GGUFFile

    src = f16_files[name]
    theirs = GGUFFile(llamacpp.quantize(src, tmp_path / "llama.cpp.gguf", PURE.get(ftype, ftype.upper()),
                                        pure=ftype in PURE))
    report = convert_model(src, tmp_path / "ster.gguf", ftype)
    ours = GGUFFile(report["output"])
    assert list(ours.tensors) == list(GGUFFile(src).tensors)
    assert set(ours.tensors) == set(theirs.tensors)
    types = {n: (ours.tensors[n].type_name, theirs.tensors[n].type_name) for n in ours.tensors}
    assert {n: t for n, t in types.items() if t[0] != t[1]} == {}
    assert len({t for t, _ in types.values()}) > 1  # the mixes and fallbacks are exercised
    differ = [n for n in ours.tensors if not np.array_equal(ours.tensors[n].raw, theirs.tensors[n].raw)]
    assert differ == []
    assert ours.metadata["general.file_type"] == theirs.metadata["general.file_type"]
