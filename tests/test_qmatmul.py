"""Quantized products and fused decoder ops against their references.

- Every GGML type the kernels multiply: ``x @ W^T`` from the blocks in place equals
  gguf-py's dequantization (the oracle) multiplied in float64, within the float32
  rounding bound of a K-term dot product, for odd row counts, one and several tokens,
  1 and 2 threads, every instruction-set level this CPU runs (portable, AVX2, AVX-512,
  AVX512_VNNI, AVX512_BF16, AMX: each forced with the ones above it off), and an output-row
  order. On AMX's tiles (several tokens, ``set_bf16_inputs`` on) the reference multiplies the
  inputs and gguf-py's weights rounded to bfloat16, as the tiles do. The SIMD row dots (one token) quantize the input to int16 per 32-block first;
  their reference multiplies the same quantized input (``qmatmul.quantize_activations``),
  which is itself checked against its definition. Q4_0 / Q4_1 / Q8_0 / Q4_K matrices of 16 rows
  or more run from their interleaved copy (16 rows per vector): the same bounds, and the
  bits of the rows in place wherever the row layout is read back.
- The fused norms, RoPE and attention equal their numpy definitions.
- ``real``: both GGUF files, kept quantized, give logits within relative error 1e-3 of
  the same model dequantized to float32 at load (1e-2 for a prompt on AMX's tiles), and the
  same greedy tokens.
"""
import contextlib
import gc
import mmap
import os
import threading
import time
import zlib

import gguf
import ml_dtypes
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from ster_py._kernels import ops, qmatmul
from ster_py.decoder import attention as attention_mod
from ster_py.decoder.norms import layer_norm, layer_norm_reference, rms_norm, rms_norm_reference
from ster_py.decoder.qlinear import QUANT_TYPES, QuantLinear, QuantStack, QuantTensor, reference_matmul, set_threads
from ster_py.decoder.rope import make_rope
from ster_py.errors import SterError
from ster_py.gguf import quants
from ster_py.gguf.reader import GGUFFile
from ster_py.weights import GGUFWeights, unpermute_qk

U = 2.0 ** -24  # float32 unit roundoff
GGUF_PY_QUANTIZES = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4"}
# f16 scale fields (byte offsets in a block) of the types gguf-py cannot quantize: random
# bytes elsewhere are valid codes, these are overwritten with finite scales.
F16_FIELDS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
              "IQ4_NL": (0,), "IQ4_XS": (0,)}


#: The instruction-set levels of the kernels this CPU runs, lowest first (the tests force each).
LEVELS = qmatmul.SIMD_LEVELS[:qmatmul.SIMD_LEVELS.index(qmatmul.cpu_simd_level()) + 1]


@pytest.fixture(autouse=True)
def _restore_kernel_settings():
    yield
    qmatmul.set_simd(True)
    ops.set_simd(True)
    qmatmul.set_threads(2)
    ops.set_threads(2)
    qmatmul.set_int16_activations(True)
    qmatmul.set_interleave(True)


def quantized_input(x: np.ndarray) -> np.ndarray:
    """float64 dx * q: the input the int16 row dots multiply."""
    q, dx = qmatmul.quantize_activations(np.ascontiguousarray(x, dtype=np.float32))
    return q.astype(np.float64) * np.repeat(dx.astype(np.float64), 32, axis=1)


def random_blocks(name: str, rows: int, cols: int, rng) -> np.ndarray:
    """uint8 [rows, row_bytes] of a GGML type: gguf-py quantizes random weights where it can."""
    t = quants.ggml_type(name)
    if name in GGUF_PY_QUANTIZES:
        w = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 2.0, (rows, 1))).astype(np.float32)
        return gguf.quants.quantize(w, QT[name]).reshape(rows, -1)
    raw = rng.integers(0, 256, (rows * cols // t.block_size, t.type_size), dtype=np.uint8)
    for off in F16_FIELDS[name]:
        raw[:, off:off + 2] = rng.uniform(-0.05, 0.05, (raw.shape[0], 1)).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def oracle_weights(raw: np.ndarray, name: str, rows: int, cols: int) -> np.ndarray:
    return gguf.quants.dequantize(raw, QT[name]).reshape(rows, cols).astype(np.float64)


def rounding_bound(x: np.ndarray, w: np.ndarray, block: int) -> np.ndarray:
    """(4 sqrt(K) + 8) u sum_k |x_k| max|w of k's block|: the float32 rounding of a K-term dot
    product (rounding errors add like a random walk; 4 sigma), with each weight replaced by its
    block's largest magnitude because offset terms m * sum(x) are summed apart from the codes.
    A single wrong code in a row already exceeds it."""
    rows, cols = w.shape
    wmax = np.abs(w).reshape(rows, cols // block, block).max(-1).repeat(block, axis=1)
    return (4 * np.sqrt(cols) + 8) * U * (np.abs(x).astype(np.float64) @ wmax.T) + 1e-30


class _Tensor:
    """The few GGUFTensor attributes QuantTensor reads, over a raw array."""

    def __init__(self, raw, name, shape):
        t = quants.ggml_type(name)
        self.name, self.ggml_type, self.type_name, self.shape = f"test.{name}", t.id, t.name, shape
        self.raw_rows, self.row_bytes, self.raw = raw, raw.shape[1], raw.reshape(-1)

    def dequantize(self):
        return quants.dequantize(self.raw, self.ggml_type, self.shape)


def bf16_rounded(a: np.ndarray) -> np.ndarray:
    """a rounded to bfloat16 (nearest even, by ml_dtypes), as float64."""
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def tiles_round(level: str) -> bool:
    """Whether decoded panels run on AMX's tiles at ``level``: inputs and decoded weights rounded to
    bfloat16 (``qmatmul.set_bf16_inputs``, on by default at amx_bf16)."""
    return level == "amx_bf16" and qmatmul.bf16_inputs()


def check_every_path(name: str, raw: np.ndarray, rows: int, cols: int, rng) -> None:
    """x @ W^T of the blocks ``raw`` [rows, row_bytes] against gguf-py's dequantization in
    float64, for 1, 5 and 13 tokens, every SIMD level with int16 and float inputs, the
    portable path, 1 and 2 threads, and every product (chosen by T, row dots, decoded panels).
    At amx_bf16 the decoded panels' reference multiplies the inputs and gguf-py's weights rounded
    to bfloat16 (``tiles_round``)."""
    block = quants.ggml_type(name).block_size
    w = oracle_weights(raw, name, rows, cols)
    wr = bf16_rounded(w)
    m = qmatmul.QMatrix(raw, quants.ggml_type(name).id, cols)
    for T in (1, 5, 13):
        x = rng.standard_normal((T, cols)).astype(np.float32)
        want = x.astype(np.float64) @ w.T
        want16 = quantized_input(x) @ w.T
        bound = rounding_bound(x, w, block)
        want_tiles, bound_tiles = bf16_rounded(x) @ wr.T, rounding_bound(bf16_rounded(x), wr, block)
        for level, int16 in [(lv, i16) for lv in LEVELS for i16 in ((True, False) if lv != "portable" else (True,))]:
            simd = qmatmul.set_simd_level(level) != "portable"
            qmatmul.set_int16_activations(int16)
            for threads in (1, 2):
                qmatmul.set_threads(threads)
                outs = {}
                for force in (0, 1, 2, 3):  # by T, row dots, decoded panels, few rows (row dots per weight row)
                    out = outs[force] = np.full((T, rows), np.nan, np.float32)
                    m.matmul(x, out, force)
                    rowdots = force in (1, 3) or (force == 0 and T == 1)
                    ref, bnd = (want16 if (simd and int16 and rowdots) else want), bound
                    if not rowdots and tiles_round(level):
                        ref, bnd = want_tiles, bound_tiles
                    excess = np.abs(out - ref) / bnd
                    assert excess.max() <= 1.0, (name, T, level, int16, threads, force, excess.max())
                # the few-row product is each row's one-token product, bit for bit
                np.testing.assert_array_equal(outs[3], outs[1])


@pytest.mark.parametrize("name", QUANT_TYPES)
def test_kernels_match_gguf_py_every_type(name):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    block = quants.ggml_type(name).block_size
    rows, cols = 37, 3 * block if block == 256 else 17 * block  # odd block counts (the kernels pair blocks)
    check_every_path(name, random_blocks(name, rows, cols, rng), rows, cols, rng)


def test_mxfp4_every_code_and_a_wide_range_of_scales():
    """gguf-py's MXFP4 quantizer never emits code 8 (-0) and keeps the scales of these weights
    within a few octaves of 1; random blocks take every code, and the rows' E8M0 exponents span
    scales 2^-64 .. 2^61 (ggml's halved convention), varying by a few octaves block to block
    within a row (so that every block of a row still counts)."""
    rng = np.random.default_rng(39)
    rows, cols = 37, 17 * 32
    raw = rng.integers(0, 256, (rows, cols // 32, 17), dtype=np.uint8)
    base = np.linspace(67, 186, rows).round().astype(int)[:, None]
    raw[:, :, 0] = base + rng.integers(-3, 4, (rows, cols // 32))
    assert raw[:, :, 0].min() == 64 and raw[:, :, 0].max() == 189
    assert set(np.unique(raw[:, :, 1:] & 15)) == set(np.unique(raw[:, :, 1:] >> 4)) == set(range(16))
    check_every_path("MXFP4", raw.reshape(rows, -1), rows, cols, rng)


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4"])
def test_paired_row_dots_equal_single_rows(name):
    """The legacy types' (and MXFP4's) decode takes rows two at a time, or for Q4_0 / Q4_1 from 16
    rows on sixteen at a time in their interleaved layout; each row's result must be the bits
    its kernel gives that row alone (the same summation order), whatever rows share the
    computation: odd block and row counts, a row order, 1 and 2 threads (which split the rows
    unevenly, cutting interleaved groups), and for interleaved rows, 16 copies of the row."""
    rng = np.random.default_rng(5)
    t = quants.ggml_type(name)
    for rows, nblocks in ((9, 3), (17, 17), (2, 1), (45, 5)):
        cols = nblocks * t.block_size
        raw = random_blocks(name, rows, cols, rng)
        order = rng.permutation(rows).astype(np.int32)
        x = rng.standard_normal((1, cols)).astype(np.float32)
        for threads in (1, 2):
            qmatmul.set_threads(threads)
            for rows_order in (None, order):
                whole = np.empty((1, rows), np.float32)
                m = qmatmul.QMatrix(raw, t.id, cols, rows_order)
                assert m.interleaved == (rows >= 16 and name in ("Q4_0", "Q4_1") and qmatmul.simd_available())
                m.matmul(x, whole)
                copies = 16 if m.interleaved else 1
                for r in range(rows):
                    alone = np.empty((1, copies), np.float32)
                    src = r if rows_order is None else int(rows_order[r])
                    qmatmul.QMatrix(raw[[src] * copies], t.id, cols).matmul(x, alone)
                    assert (alone[0].view(np.uint32) == whole[0, r:r + 1].view(np.uint32)).all(), \
                        (name, rows, nblocks, threads, r)


@pytest.mark.parametrize("name", ["Q4_1", "Q6_K"])
def test_large_matrices_split_over_threads(name):
    # Enough rows and tokens that both threads get several tasks (and partial ones).
    rng = np.random.default_rng(11)
    rows, cols = 301, 512
    raw = random_blocks(name, rows, cols, rng)
    w = oracle_weights(raw, name, rows, cols)
    m = qmatmul.QMatrix(raw, quants.ggml_type(name).id, cols)
    x = rng.standard_normal((40, cols)).astype(np.float32)
    block = quants.ggml_type(name).block_size
    bound = rounding_bound(x, w, block)
    want = x.astype(np.float64) @ w.T
    want16 = quantized_input(x) @ w.T if qmatmul.simd_available() else want
    panels = ((bf16_rounded(x) @ bf16_rounded(w).T, rounding_bound(bf16_rounded(x), bf16_rounded(w), block))
              if tiles_round(qmatmul.simd_level()) else (want, bound))
    for threads in (1, 2):
        qmatmul.set_threads(threads)
        for force, (ref, b) in ((1, (want16, bound)), (2, panels)):
            out = np.empty((40, rows), np.float32)
            m.matmul(x, out, force)
            assert (np.abs(out - ref) / b).max() <= 1.0


@pytest.mark.parametrize("name", ["Q5_0", "Q4_K", "BF16"])
def test_avx512_tile_gives_the_avx2_tile_bits(name):
    """Both prefill register tiles sum each output in one FMA chain in input order, so the
    AVX-512 tile (two 16-row panels at once, a lone last one with its second half masked) must
    give every output the AVX2 tile's bits: for a last panel that is full or partial, a matrix
    of one panel, tokens that fill the tile or not, and 1 or 2 threads (which cut the rows into
    tasks differently at each level)."""
    if "avx512" not in LEVELS:
        pytest.skip("the 32-output tile is the AVX-512 level's; this CPU has no AVX-512")
    rng = np.random.default_rng(17)
    for rows in (80, 72, 16, 9):
        if name == "BF16":
            cols = 600
            w = rng.standard_normal((rows, cols)).astype(ml_dtypes.bfloat16)
            raw, type_id = w.view(np.uint8).reshape(rows, -1), 30
        else:
            t = quants.ggml_type(name)
            cols = 3 * t.block_size if t.block_size == 256 else 19 * t.block_size
            raw, type_id = random_blocks(name, rows, cols, rng), t.id
        m = qmatmul.QMatrix(raw, type_id, cols)
        for T in (13, 24):
            x = rng.standard_normal((T, cols)).astype(np.float32)
            outs = {}
            for level in ("avx2", "avx512"):
                qmatmul.set_simd_level(level)
                for threads in (1, 2):
                    qmatmul.set_threads(threads)
                    out = outs[level, threads] = np.empty((T, rows), np.float32)
                    m.matmul(x, out, 2)
            for key, out in outs.items():
                np.testing.assert_array_equal(out.view(np.uint32), outs["avx2", 1].view(np.uint32),
                                              err_msg=f"{name} rows {rows} T {T} {key}")


def test_f32_matmul_is_row_exact_within_rounding_of_float64():
    """``qmatmul.f32_matmul`` (float32 weights copied into the decoded-panel tile) against float64 numpy: within
    the float32 rounding bound at every level, 1 and 2 threads, odd shapes (a partial last panel, K not a
    multiple of 256, a one-row product); each output's bits do not depend on the rows beside it; the AVX-512
    tile gives the AVX2 tile's bits; bad arrays are a ValueError."""
    rng = np.random.default_rng(23)
    for rows, cols in ((77, 300), (16, 256), (9, 40)):
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        x = rng.standard_normal((29, cols)).astype(np.float32)
        want = x.astype(np.float64) @ w.T.astype(np.float64)
        bound = rounding_bound(x, w, 1)
        outs = {}
        for level in LEVELS:
            qmatmul.set_simd_level(level)
            for threads in (1, 2):
                qmatmul.set_threads(threads)
                out = outs[level, threads] = np.full((29, rows), np.nan, np.float32)
                qmatmul.f32_matmul(x, w, out)
                assert (np.abs(out - want) / bound).max() <= 1.0, (rows, cols, level, threads)
                part = np.full((12, rows), np.nan, np.float32)
                qmatmul.f32_matmul(np.ascontiguousarray(x[17:]), w, part)   # the same rows, others beside them
                np.testing.assert_array_equal(part.view(np.uint32), out[17:].view(np.uint32))
                one = np.full((1, rows), np.nan, np.float32)
                qmatmul.f32_matmul(np.ascontiguousarray(x[5:6]), w, one)
                np.testing.assert_array_equal(one.view(np.uint32), out[5:6].view(np.uint32))
        if "avx512" in LEVELS:
            np.testing.assert_array_equal(outs["avx512", 2].view(np.uint32), outs["avx2", 1].view(np.uint32))
    out = np.empty((29, 9), np.float32)
    for bad in ((x.astype(np.float64), w, out), (x, w.T, out), (x, w, out[:, :5]), (x, w, out.T)):
        with pytest.raises(ValueError, match="f32_matmul"):
            qmatmul.f32_matmul(*bad)


@pytest.mark.parametrize("int16", [True, False])
def test_matvec_group_equals_products_one_by_one(int16):
    """q/k/v-style groups of mixed types: one job gives each product's own result, bit for bit,
    with or without a row order, at 1 and 2 threads and every SIMD level."""
    qmatmul.set_int16_activations(int16)
    rng = np.random.default_rng(7)
    cols = 512
    mats = []
    for name, rows in (("Q4_K", 384), ("Q6_K", 129), ("Q8_0", 131), ("Q4_1", 300)):
        raw = random_blocks(name, rows, cols, rng)
        order = rng.permutation(rows) if name == "Q6_K" else None
        mats.append(qmatmul.QMatrix(raw, quants.ggml_type(name).id, cols, order))
    x = rng.standard_normal((1, cols)).astype(np.float32)
    for level, threads in [(lv, t) for lv in LEVELS for t in (1, 2)]:
        qmatmul.set_simd_level(level)
        qmatmul.set_threads(threads)
        for n in (2, 3, 4):
            group = tuple(mats[:n])
            outs = tuple(np.full((1, m.n_rows), np.nan, np.float32) for m in group)
            qmatmul.matvec_group(group, x, outs)
            for m, got in zip(group, outs):
                want = np.empty((1, m.n_rows), np.float32)
                m.matmul(x, want)
                np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError):
        qmatmul.matvec_group(tuple(mats[:2]), x, (np.empty((1, 3), np.float32), np.empty((1, 129), np.float32)))
    with pytest.raises(ValueError):
        qmatmul.matvec_group(tuple(mats[:2]), np.ones((2, cols), np.float32), (np.empty((1, 384), np.float32),) * 2)


def test_read_ahead_hints_change_no_result():
    """Helpers prefetch the matrices named by set_read_ahead while they wait: products (one
    token and several, alone and grouped) are bit for bit those without hints."""
    rng = np.random.default_rng(11)
    cols = 256
    mats = [qmatmul.QMatrix(random_blocks(name, rows, cols, rng), quants.ggml_type(name).id, cols)
            for name, rows in (("Q4_1", 300), ("Q8_0", 200), ("Q6_K", 257))]
    x1 = rng.standard_normal((1, cols)).astype(np.float32)
    x5 = rng.standard_normal((5, cols)).astype(np.float32)

    def run():
        outs = []
        for m in mats:
            for x in (x1, x5):
                y = np.empty((x.shape[0], m.n_rows), np.float32)
                m.matmul(x, y)
                outs.append(y)
        grouped = tuple(np.empty((1, m.n_rows), np.float32) for m in mats)
        qmatmul.matvec_group(tuple(mats), x1, grouped)
        return outs + list(grouped)

    qmatmul.set_threads(2)
    plain = run()
    for here, ahead in zip(mats, mats[1:] + mats[:1]):
        here.set_read_ahead((ahead, ahead))
    for _ in range(3):
        for got, want in zip(run(), plain):
            np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError):
        mats[0].set_read_ahead(tuple(mats) * 2)
    with pytest.raises(TypeError):
        mats[0].set_read_ahead(("not a matrix",))
    mats[0].set_read_ahead(())


@pytest.mark.parametrize("simd", [True, False])
@pytest.mark.parametrize("act", ["silu", "gelu_pytorch_tanh"])
def test_gated_activation_matches_numpy(simd, act):
    from ster_py.decoder.activations import ACT_FNS
    from ster_py.decoder.ffn import gated

    ops.set_simd(simd)
    rng = np.random.default_rng(3)
    g = (rng.standard_normal((3, 203)) * rng.choice([0.01, 1.0, 30.0], (3, 203))).astype(np.float32)
    g[0, :6] = [0.0, -0.0, 100.0, -100.0, 1e-30, -1e-30]
    u = rng.standard_normal((3, 203)).astype(np.float32)
    want = ACT_FNS[act](g.astype(np.float64)) * u
    got = gated(act, g.copy(), u)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-9)  # tails below 1e-9 differ in how they reach 0


_TORCH_ACTIVATIONS = {  # the oracle of each name in activations.ACT_FNS and GATES
    "silu": lambda t, F: F.silu(t), "gelu": lambda t, F: F.gelu(t),
    "gelu_pytorch_tanh": lambda t, F: F.gelu(t, approximate="tanh"), "relu2": lambda t, F: F.relu(t) ** 2,
    "relu": lambda t, F: F.relu(t), "sigmoid": lambda t, F: t.sigmoid(), "softplus": lambda t, F: F.softplus(t),
    "softplus2": lambda t, F: F.softplus(t, beta=float(np.log(2.0))),
    "softmax": lambda t, F: F.softmax(t.reshape(-1, 7), dim=-1).reshape(-1),
}


@pytest.mark.parametrize("name", sorted(_TORCH_ACTIVATIONS))
def test_activations_match_torch_without_warnings(name):
    """The one definition of each activation (and of softmax, rows of 7) agrees with torch's on float32, extremes included (exp(-x)
    beyond float32's range gives the limit, with no overflow warning reaching a user's terminal)."""
    import warnings

    torch = pytest.importorskip("torch")
    from ster_py.decoder.activations import ACT_FNS, GATES

    from ster_py.decoder.activations import softmax

    fn = ACT_FNS.get(name) or GATES.get(name) or (lambda v: softmax(v.reshape(-1, 7)).reshape(-1))
    x = np.concatenate([np.linspace(-30, 30, 2004), [-1e4, -200.0, -89.0, -88.0, 88.0, 89.0, 200.0, 1e4, 0.0, -0.0,
                                                     1e-30, -1e-30]]).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = fn(x)
    assert got.dtype == np.float32
    want = _TORCH_ACTIVATIONS[name](torch.from_numpy(x), torch.nn.functional).numpy()
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


def test_int16_activations_follow_their_definition():
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((3, 128)) * 10.0 ** rng.integers(-6, 4, (3, 128))).astype(np.float32)
    x[1, :32] = 0  # an all-zero block: scale 0
    q, dx = qmatmul.quantize_activations(x)
    amax = np.abs(x).reshape(3, 4, 32).max(-1)
    np.testing.assert_array_equal(dx, (amax / np.float32(32767)).astype(np.float32))
    # The definition, in float32: q = round-half-even(x * (32767 / amax)).
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(32767) / amax, np.float32(0)).astype(np.float32)
    want = np.rint(x.reshape(3, 4, 32) * inv[..., None]).reshape(3, 128)
    np.testing.assert_array_equal(q, want.astype(np.int16))
    assert np.abs(q.astype(np.int32)).max() <= 32767
    # q is x / dx rounded to nearest: within half a step (plus float32 slack).
    step = np.repeat(dx, 32, axis=1).astype(np.float64)
    err = np.abs(q * step - x)
    assert (err <= step * (0.5 + 1e-3)).all()
    assert (q[1, :32] == 0).all()
    with pytest.raises(ValueError):
        qmatmul.quantize_activations(np.full((1, 32), np.inf, np.float32))


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0", "Q4_K"])
def test_interleaved_rows_give_the_row_layout_results(name):
    """Q4_0 / Q4_1 / Q8_0 / Q4_K matrices of 16 rows or more run from a copy in 16-row groups
    (ster_il16.h). The float-input row dots and the decoded panels read each row back in
    the file layout: the same bits as the rows left in place. The int16 row dots (16 rows per
    vector) agree with gguf-py's dequantized weights to float32 rounding, at every level; rows
    cut off by the last group, a row order and both thread counts included."""
    rng = np.random.default_rng(zlib.crc32(name.encode()) + 1)
    t = quants.ggml_type(name)
    for rows, nblocks in ((16, 1), (45, 17), (300, 8)):
        cols = nblocks * t.block_size
        raw = random_blocks(name, rows, cols, rng)
        order = rng.permutation(rows).astype(np.int32)
        for rows_order in (None, order):
            w = oracle_weights(raw if rows_order is None else raw[rows_order], name, rows, cols)
            il = qmatmul.QMatrix(raw, t.id, cols, rows_order)
            flat = qmatmul.QMatrix(raw, t.id, cols, rows_order, False)
            assert il.interleaved == qmatmul.simd_available() and not flat.interleaved
            for T in (1, 4):
                x = rng.standard_normal((T, cols)).astype(np.float32)
                bound = rounding_bound(x, w, t.block_size)
                want16 = quantized_input(x) @ w.T
                for level in LEVELS:
                    qmatmul.set_simd_level(level)
                    for threads in (1, 2):
                        qmatmul.set_threads(threads)
                        for int16 in (True, False):
                            qmatmul.set_int16_activations(int16)
                            for force in (1, 2, 3):
                                a = np.full((T, rows), np.nan, np.float32)
                                b = np.full((T, rows), np.nan, np.float32)
                                il.matmul(x, a, force)
                                flat.matmul(x, b, force)
                                if force == 2 or not int16 or level == "portable":
                                    np.testing.assert_array_equal(a, b)
                                else:
                                    assert (np.abs(a - want16) / bound).max() <= 1.0, (rows, level, threads, force)
    # NaN inputs reach every output (the int16 path hands such inputs to the float one)
    raw = random_blocks(name, 45, 2 * t.block_size, rng)
    x = rng.standard_normal((1, 2 * t.block_size)).astype(np.float32)
    x[0, 5] = np.nan
    out = np.zeros((1, 45), np.float32)
    qmatmul.QMatrix(raw, t.id, 2 * t.block_size).matmul(x, out)
    assert np.isnan(out).all()


def test_interleaving_is_for_its_types_and_sizes():
    rng = np.random.default_rng(8)
    for name, rows, want in (("Q4_1", 15, False), ("Q4_1", 16, True), ("Q4_K", 16, True), ("Q6_K", 64, False),
                             ("Q5_0", 64, False)):
        cols = quants.ggml_type(name).block_size * 2
        m = qmatmul.QMatrix(random_blocks(name, rows, cols, rng), quants.ggml_type(name).id, cols)
        assert m.interleaved == (want and qmatmul.simd_available()), name
    qmatmul.set_interleave(False)
    try:
        assert not qmatmul.QMatrix(random_blocks("Q8_0", 32, 64, rng), quants.ggml_type("Q8_0").id, 64).interleaved
    finally:
        qmatmul.set_interleave(True)


def _resident_kib(addr: int) -> int:
    """Rss (KiB) of the mapping of this process that holds address ``addr`` (/proc/self/smaps)."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo <= addr < hi
        elif inside and head == "Rss:":
            return int(line.split()[1])
    raise AssertionError("no mapping holds the address")


def _child_exit_code(pid: int, timeout: float) -> int | None:
    """The exit code of forked child ``pid``, or None if it has not ended within ``timeout``
    seconds (it is then killed)."""
    deadline = time.monotonic() + timeout
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        return None
    return os.waitstatus_to_exitcode(done[1])


@contextlib.contextmanager
def _file_rows(raw: np.ndarray, path):
    """``raw`` written to ``path`` and mapped back read-only: a uint8 view of its shape, as a GGUF
    tensor is seen (the block deletes every view of it and every matrix on it before it ends,
    so the mapping can close)."""
    raw.tofile(path)
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        yield np.frombuffer(mapped, np.uint8).reshape(raw.shape)
    finally:
        mapped.close()


@pytest.mark.skipif(not qmatmul.simd_available() or not os.path.exists("/proc/self/smaps"),
                    reason="the interleaved copy needs AVX2; resident pages are read from Linux's /proc")
def test_interleaved_copy_releases_the_file_pages(tmp_path):
    """A matrix read from a file mapping (``release``): once copied by its first product, the
    mapping's pages leave the resident set (the copy and the file are not both held), and what
    the mapping reads afterwards (an embedding's rows) is still the file's bytes."""
    rng = np.random.default_rng(9)
    rows, cols = 2048, 1024
    raw = random_blocks("Q8_0", rows, cols, rng)
    with _file_rows(raw, tmp_path / "w.bin") as view:
        assert int(view.sum(dtype=np.int64)) == int(raw.sum(dtype=np.int64))  # every page resident
        before = _resident_kib(view.ctypes.data)
        assert before >= raw.nbytes // 1024 - 8
        m = qmatmul.QMatrix(view, quants.ggml_type("Q8_0").id, cols, None, None, True)
        x = rng.standard_normal((1, cols)).astype(np.float32)
        out = np.empty((1, rows), np.float32)
        m.matmul(x, out)
        assert _resident_kib(view.ctypes.data) <= 8  # at most the pages the tensor shares with others
        np.testing.assert_array_equal(view, raw)
        flat = np.empty((1, rows), np.float32)
        qmatmul.QMatrix(raw, quants.ggml_type("Q8_0").id, cols, None, False).matmul(x, flat)
        w = oracle_weights(raw, "Q8_0", rows, cols)
        assert (np.abs(out - quantized_input(x) @ w.T) / rounding_bound(x, w, 32)).max() <= 1.0
        del view, m


def test_prompt_products_do_not_wait_for_the_interleaved_copy(tmp_path):
    """Before a matrix's interleaved copy exists, decoded panels (a prompt's products) read the
    rows where they are instead of waiting for it: the same bits as from the copy and as from
    a matrix never interleaved. The first one-token product then makes the copy, and the file
    pages the panels mapped again are released once more."""
    rng = np.random.default_rng(21)
    rows, cols = 256, 1024
    raw = random_blocks("Q8_0", rows, cols, rng)
    tid = quants.ggml_type("Q8_0").id
    x = rng.standard_normal((5, cols)).astype(np.float32)
    flat = np.empty((5, rows), np.float32)
    qmatmul.QMatrix(raw, tid, cols, None, False).matmul(x, flat)
    with _file_rows(raw, tmp_path / "w.bin") as view:
        queued = qmatmul.set_background_copies(False)   # the copy waits for the first one-token product
        try:
            m = qmatmul.QMatrix(view, tid, cols, None, True, True)
        finally:
            qmatmul.set_background_copies(queued)
        assert m.copy_pending
        before = np.empty((5, rows), np.float32)
        m.matmul(x, before)                       # the copy was never started: the file's rows
        assert m.interleaved and _resident_kib(view.ctypes.data) >= raw.nbytes // 1024 - 8
        m.matmul(x[:1], np.empty((1, rows), np.float32))   # makes the copy, releases the pages
        assert not m.copy_pending and _resident_kib(view.ctypes.data) <= 8
        after = np.empty((5, rows), np.float32)
        m.matmul(x, after)
        np.testing.assert_array_equal(before.view(np.uint32), flat.view(np.uint32))
        np.testing.assert_array_equal(after.view(np.uint32), flat.view(np.uint32))
        del view, m


def test_background_copies_survive_collection_fork_and_long_row_orders(tmp_path):
    """Matrices are copied by a background thread. A matrix collected in a
    reference cycle while its copy runs does not crash the process (the job holds what it
    reads and writes); a child forked while another thread makes a copy makes it again
    itself; with a row order longer than the file mapping it reads (repeated rows), released
    pages stay within that mapping."""
    rng = np.random.default_rng(12)
    tid = quants.ggml_type("Q8_0").id
    zeros = np.zeros((8192, 4352), np.uint8)      # 35 MB of Q8_0 blocks: a background copy
    for _ in range(30):
        m = qmatmul.QMatrix(zeros, tid, 4096)
        m.set_read_ahead((m,))                     # a cycle: only the collector frees it
        del m
        gc.collect(0)   # the young generation holds the cycle (a full collection in the suite's heap: ~0.5 s)
    raw = random_blocks("Q8_0", 2048, 4096, rng)   # 8.9 MB
    x = rng.standard_normal((1, 4096)).astype(np.float32)
    w = oracle_weights(raw, "Q8_0", 2048, 4096)
    want = quantized_input(x) @ w.T
    bound = rounding_bound(x, w, 32)
    mats = [qmatmul.QMatrix(raw, tid, 4096) for _ in range(3)]
    busy = threading.Thread(target=lambda: mats[-1].matmul(x, np.empty((1, 2048), np.float32)))
    busy.start()
    pid = os.fork()
    if pid == 0:  # the child: the copy the parent's thread was making is made here
        out = np.empty((1, 2048), np.float32)
        mats[-1].matmul(x, out)
        os._exit(0 if (np.abs(out - want) / bound).max() <= 1.0 else 3)
    busy.join()
    assert _child_exit_code(pid, 60) == 0
    # a row order of 4096 rows over a 16-row file mapping, released after the copy
    with _file_rows(raw[:16], tmp_path / "w.bin") as view:
        order = np.arange(4096, dtype=np.int32) % 16
        m = qmatmul.QMatrix(view, tid, 4096, order, None, True)
        out = np.empty((1, 4096), np.float32)
        m.matmul(x, out)
        assert (np.abs(out - want[:, order]) / bound[:, order]).max() <= 1.0
        np.testing.assert_array_equal(view, raw[:16])
        del view, m


def test_a_child_forked_beside_an_idle_copier_makes_copies():
    """Forked while the background copier waits for work (a loaded model's usual state), a child
    that builds matrices and multiplies by them finishes with the right results (it used to
    wait forever: the condition the copier waited on was inherited with that waiter counted);
    release is refused on memory the caller may write (dropping its pages would zero it)."""
    rng = np.random.default_rng(34)
    tid = quants.ggml_type("Q8_0").id
    raw = random_blocks("Q8_0", 64, 256, rng)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    want = np.empty((1, 64), np.float32)
    m = qmatmul.QMatrix(raw, tid, 256)
    deadline = time.monotonic() + 10
    while m.copy_pending and time.monotonic() < deadline:   # made by the copier
        time.sleep(0.01)
    m.matmul(x, want)
    for _ in range(5):   # the wait for a copier that is not there hung ~half of the children
        time.sleep(0.2)  # the copier is back waiting for work
        pid = os.fork()
        if pid == 0:
            ok = True
            for _ in range(3):
                out = np.empty((1, 64), np.float32)
                qmatmul.QMatrix(raw.copy(), tid, 256).matmul(x, out)
                ok &= bool(np.array_equal(out.view(np.uint32), want.view(np.uint32)))
            os._exit(0 if ok else 3)
        assert _child_exit_code(pid, 30) == 0
    with pytest.raises(ValueError, match="read-only file mapping"):
        qmatmul.QMatrix(raw, tid, 256, None, None, True)


def test_copies_made_by_several_threads_are_the_copy_one_thread_makes(tmp_path):
    """A one-token product that needs a copy the background thread is making joins it (slices of
    about 4 MB, each copied by one thread): its products then give the bits of a copy made by
    one thread alone, for a 35 MB matrix read from a file mapping (its pages released slice by
    slice) and under a row order."""
    rng = np.random.default_rng(33)
    tid = quants.ggml_type("Q8_0").id
    rows, cols = 8192, 4096
    raw = rng.integers(-127, 128, (rows * cols // 32, 34), dtype=np.int8).view(np.uint8)
    raw[:, 0:2] = rng.uniform(-0.05, 0.05, (raw.shape[0], 1)).astype(np.float16).view(np.uint8)
    raw = raw.reshape(rows, -1)
    order = rng.permutation(rows).astype(np.int32)
    x = rng.standard_normal((1, cols)).astype(np.float32)
    queued = qmatmul.set_background_copies(False)
    try:
        alone = [qmatmul.QMatrix(raw, tid, cols, o) for o in (None, order)]
    finally:
        qmatmul.set_background_copies(queued)
    want = []
    for m in alone:
        want.append(np.empty((1, rows), np.float32))
        m.matmul(x, want[-1])
    with _file_rows(raw, tmp_path / "w.bin") as view:
        for _ in range(3):
            for src, m_order, w in ((view, None, want[0]), (raw, order, want[1])):
                m = qmatmul.QMatrix(src, tid, cols, m_order, None, src is view)
                assert m.interleaved == qmatmul.simd_available()
                out = np.empty((1, rows), np.float32)
                m.matmul(x, out)        # joins the worker's copy (or makes it, if still queued)
                assert not m.copy_pending
                np.testing.assert_array_equal(out.view(np.uint32), w.view(np.uint32))
                del m
        np.testing.assert_array_equal(view, raw)
        del view


def test_non_finite_inputs_propagate():
    rng = np.random.default_rng(6)
    raw = random_blocks("Q4_0", 5, 64, rng)
    m = qmatmul.QMatrix(raw, quants.ggml_type("Q4_0").id, 64)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    x[0, 3] = np.nan
    out = np.zeros((1, 5), np.float32)
    m.matmul(x, out)
    assert np.isnan(out).all()


def test_products_refuse_swapped_overlapping_and_non_integer_inputs():
    """Arrays numpy calls float32 but stored in the other byte order, an output that overlaps the
    input (the kernels read one while writing the other) and a row order of floats are refused
    with a ValueError, before anything is computed; the same arrays in order are accepted."""
    rng = np.random.default_rng(21)
    w = rng.standard_normal((64, 64)).astype(np.float16)
    raw = w.view(np.uint8).reshape(64, -1)
    m = qmatmul.QMatrix(raw, 1, 64)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    out = np.empty((5, 64), np.float32)
    for bad_x, bad_out in ((x.astype(">f4"), out), (x, np.empty((5, 64), ">f4"))):
        with pytest.raises(ValueError, match="byte order"):
            m.matmul(bad_x, bad_out)
        with pytest.raises(ValueError, match="byte order"):
            qmatmul.matvec_group((m,), bad_x[:1], (bad_out[:1],))
    buf = x.copy()
    for force in (0, 1, 2):
        with pytest.raises(ValueError, match="overlap"):
            m.matmul(buf, buf, force)
    np.testing.assert_array_equal(buf, x)   # refused before anything was written
    with pytest.raises(ValueError, match="overlap"):
        qmatmul.matvec_group((m,), buf[:1], (buf[:1],))
    with pytest.raises(ValueError, match="integers"):
        qmatmul.QMatrix(raw, 1, 64, np.array([0.9, 2.99]))
    m.matmul(x, out, 2)   # in order, apart: fine
    assert np.isfinite(out).all()


def test_row_order_permutes_outputs_without_copying():
    rng = np.random.default_rng(3)
    rows, cols = 48, 256
    raw = random_blocks("Q4_K", rows, cols, rng)
    w = oracle_weights(raw, "Q4_K", rows, cols)
    qt = QuantTensor(_Tensor(raw, "Q4_K", (rows, cols)))
    heads = 3
    perm = unpermute_qk(qt, heads)
    assert isinstance(perm, QuantTensor) and perm.shape == (rows, cols)
    dense_perm = unpermute_qk(w, heads)
    np.testing.assert_array_equal(np.asarray(perm), dense_perm.astype(np.float32))
    x = rng.standard_normal((3, cols)).astype(np.float32)
    # The module's own numpy reference agrees with the gguf-py oracle.
    np.testing.assert_allclose(reference_matmul(x, perm), x.astype(np.float64) @ dense_perm.T, rtol=1e-12, atol=1e-12)
    for T in (1, 3):
        got = QuantLinear(perm)(x[:T])
        xin = quantized_input(x[:T]) if T == 1 and qmatmul.simd_available() else x[:T].astype(np.float64)
        wref = dense_perm
        if T > 1 and tiles_round(qmatmul.simd_level()):   # decoded panels on AMX's tiles
            xin, wref = bf16_rounded(xin), bf16_rounded(dense_perm)
        bound = rounding_bound(xin, wref, 256)
        assert (np.abs(got - xin @ wref.T) / bound).max() <= 1.0
    # Slices are row views too; integer indexing decodes only the asked rows.
    part = perm[5:17]
    assert isinstance(part, QuantTensor) and part.shape == (12, cols)
    np.testing.assert_array_equal(np.asarray(part), dense_perm[5:17].astype(np.float32))
    np.testing.assert_array_equal(perm[[2, 40, 2]], dense_perm[[2, 40, 2]].astype(np.float32))
    np.testing.assert_array_equal(perm[7], dense_perm[7].astype(np.float32))
    np.testing.assert_array_equal(perm.rows([-1]), dense_perm[[-1]].astype(np.float32))  # one id: its own path
    for bad in ([rows], [-rows - 1], [0, rows], [2**64 - 1]):
        with pytest.raises(SterError):
            perm.rows(bad)


def test_quant_linear_bias_and_vector_input():
    rng = np.random.default_rng(5)
    raw = random_blocks("Q8_0", 9, 64, rng)
    w = oracle_weights(raw, "Q8_0", 9, 64)
    bias = rng.standard_normal(9).astype(np.float32)
    lin = QuantLinear(QuantTensor(_Tensor(raw, "Q8_0", (9, 64))), bias)
    x = rng.standard_normal(64).astype(np.float32)
    got = lin(x)
    assert got.shape == (9,) and got.dtype == np.float32
    xq = quantized_input(x[None])[0] if qmatmul.simd_available() else x.astype(np.float64)
    bound = rounding_bound(x[None], w, 32)[0] + 4 * U * np.abs(bias)
    assert (np.abs(got - (xq @ w.T + bias)) <= bound).all()


def test_set_threads_refuses_zero():
    with pytest.raises(SterError):
        set_threads(0)


@pytest.mark.parametrize("n", [2.5, True, "abc", "2", None, 1025])
def test_set_threads_refuses_what_is_not_a_thread_count(n):
    """set_threads is the library's front door (ster_py.set_threads): 2.5 ran on 2 threads and True on 1
    without a word, "abc" and None were a ValueError and a TypeError."""
    with pytest.raises(SterError, match="--threads must be a whole number from 1 to 1024"):
        set_threads(n)


def test_gguf_weights_keep_matrices_quantized(tmp_path):
    rng = np.random.default_rng(9)
    path = tmp_path / "w.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    q_raw = random_blocks("Q4_0", 8, 64, rng)
    writer.add_tensor("blk.0.attn_q.weight", q_raw, raw_dtype=QT.Q4_0)
    writer.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(64).astype(np.float32))
    writer.add_tensor("blk.0.ffn_up.weight", rng.standard_normal((4, 64)).astype(np.float16))
    # MXFP4 (gpt-oss's experts): a matrix and a [3 experts, 8, 64] stack stay in their blocks
    mx_raw = random_blocks("MXFP4", 5, 64, rng)
    mx_stack = random_blocks("MXFP4", 3 * 8, 64, rng)
    writer.add_tensor("blk.0.attn_output.weight", mx_raw, raw_dtype=QT.MXFP4)
    writer.add_tensor("blk.0.ffn_gate_exps.weight", mx_stack.reshape(3, 8, -1), raw_dtype=QT.MXFP4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    g = GGUFFile(path)
    quantized = GGUFWeights(g, "f32", qk_heads=(2, 2))
    dense = GGUFWeights(g, "f32", qk_heads=(2, 2), quantized=False)
    q = quantized.get("blk.0.attn_q.weight")
    assert isinstance(q, QuantTensor) and q.shape == (8, 64)
    want = unpermute_qk(oracle_weights(q_raw, "Q4_0", 8, 64), 2).astype(np.float32)
    np.testing.assert_array_equal(dense.get("blk.0.attn_q.weight"), want)
    np.testing.assert_array_equal(np.asarray(q), want)
    for name in ("blk.0.attn_norm.weight", "blk.0.ffn_up.weight"):
        a, b = quantized.get(name), dense.get(name)
        assert isinstance(a, np.ndarray) and a.dtype == np.float32
        np.testing.assert_array_equal(a, b)
    mx = quantized.get("blk.0.attn_output.weight")
    assert isinstance(mx, QuantTensor) and mx.shape == (5, 64)
    np.testing.assert_array_equal(np.asarray(mx), oracle_weights(mx_raw, "MXFP4", 5, 64).astype(np.float32))
    stack = quantized.get("blk.0.ffn_gate_exps.weight")
    assert isinstance(stack, QuantStack) and stack.shape == (3, 8, 64)
    want = oracle_weights(mx_stack, "MXFP4", 24, 64).reshape(3, 8, 64)
    np.testing.assert_array_equal(dense.get("blk.0.ffn_gate_exps.weight"), want.astype(np.float32))
    x = rng.standard_normal((1, 64)).astype(np.float32)
    for e in range(3):
        got = QuantLinear(stack[e])(x)
        assert np.abs(got - x.astype(np.float64) @ want[e].T).max() <= 1e-3 * np.abs(x @ want[e].T).max()


# --- fused ops ---------------------------------------------------------------------------


@pytest.mark.parametrize("simd", [True, False])
def test_norms_match_numpy(simd):
    ops.set_simd(simd)
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((2, 5, 77)) * 3).astype(np.float32)
    w = rng.standard_normal(77).astype(np.float32)
    b = rng.standard_normal(77).astype(np.float32)
    for weight in (w, None):
        got = rms_norm(x, weight, 1e-6)
        np.testing.assert_allclose(got, rms_norm_reference(x, weight, 1e-6), rtol=2e-6, atol=1e-6)
        got = layer_norm(x, weight, b, 1e-5)
        np.testing.assert_allclose(got, layer_norm_reference(x, weight, b, 1e-5), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_matches_numpy(interleaved):
    rng = np.random.default_rng(2)
    rope = make_rope({"rope_theta": 10000.0, "partial_rotary_factor": 0.5}, head_dim=32,
                     max_position_embeddings=64, interleaved=interleaved)
    x = rng.standard_normal((3, 6, 32)).astype(np.float32)
    cos, sin = rope.cos_sin(np.arange(10, 16), 16)
    want = rope.apply_reference(x.copy(), cos, sin)
    got = x.copy()
    assert rope.apply(got, cos, sin) is got
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    keys = rng.standard_normal((2, 6, 32)).astype(np.float32)  # fewer key heads, one call for both
    want_k = rope.apply_reference(keys.copy(), cos, sin)
    q2, k2 = x.copy(), keys.copy()
    rope.apply_pair(q2, k2, cos, sin)
    np.testing.assert_allclose(q2, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(k2, want_k, rtol=1e-6, atol=1e-6)


def _attention_case(rng, H, KV, T, S, D, cached, kv_dtype=np.float32):
    q = rng.standard_normal((H, T, D)).astype(np.float32)
    buf_k = rng.standard_normal((KV, S + 7, D)).astype(kv_dtype)
    buf_v = rng.standard_normal((KV, S + 7, D)).astype(kv_dtype)
    k, v = buf_k[:, :S], buf_v[:, :S]  # cache views: strided in the position axis
    positions = np.arange(S - T, S) if cached else np.arange(T)
    return q, k, v, positions


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("simd", [True, False])
@pytest.mark.parametrize("D", [64, 12, 256, 40])
def test_attention_matches_numpy(simd, D, kv_dtype):
    # float16 keys/values (a float16 KV cache): the oracle is the float32 definition on
    # their float32 values (widening is exact), within the float32 tolerance
    ops.set_simd(simd)
    rng = np.random.default_rng(D)
    # (1, 700) and (1, 513): one decoded row over a long cache, where two threads split the
    # keys of each head group into parts merged afterwards (3 groups: 2 parts each, as with
    # 1 group); (1, 200) with D = 256: too few keys to split, two threads take two heads each.
    for H, KV, T, S, cached in ((6, 2, 1, 37, True), (6, 2, 9, 9, False), (6, 2, 5, 40, True),
                                (6, 3, 1, 700, True), (4, 1, 1, 513, True), (4, 1, 1, 200, True)):
        q, k, v, positions = _attention_case(rng, H, KV, T, S, D, cached, kv_dtype)
        k32, v32 = k.astype(np.float32), v.astype(np.float32)
        cases = [dict(), dict(window=4), dict(window=300), dict(softcap=5.0),
                 dict(sinks=rng.standard_normal(H).astype(np.float32)),
                 dict(sinks=np.full(H, 30.0, np.float32)),  # a sink that outweighs every key
                 dict(bias=rng.standard_normal((H, T, S)).astype(np.float32)),
                 dict(bias=rng.standard_normal((H, 1, S)).astype(np.float32), window=7),
                 dict(bias=rng.standard_normal((T, S)).astype(np.float32))]
        if cached and S > 64:   # -inf bias over whole blocks of keys (the kernel's blocks see no key)
            masked = rng.standard_normal((H, T, S)).astype(np.float32)
            masked[..., :40] = masked[..., S // 2:S // 2 + 40] = -np.inf
            cases.append(dict(bias=masked))
        for extra in cases:
            for threads in (1, 2):
                ops.set_threads(threads)
                got = attention_mod.attention(q, k, v, positions, scale=D ** -0.5, **extra)
                want = attention_mod.attention_reference(q, k32, v32, positions, scale=D ** -0.5, **extra)
                assert got.dtype == np.float32
                np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=str((T, S, extra)))


@pytest.mark.parametrize("simd", [True, False])
def test_attention_float16_values_widen_exactly(simd):
    # Every float16 bit pattern (zeros, subnormals, normals, infinities, NaNs) as a value
    # row: under a window of 1, query row t attends to key t alone (weight exactly 1), so
    # the output is the kernel's float32 reading of value row t, compared with numpy's
    # float16 -> float32 cast bit for bit (NaN positions must match).
    ops.set_simd(simd)
    rng = np.random.default_rng(16)
    D = 64
    v = np.arange(2 ** 16, dtype=np.uint16).view(np.float16).reshape(1, -1, D)
    S = v.shape[1]
    k = rng.standard_normal((1, S, D)).astype(np.float16)
    q = rng.standard_normal((2, S, D)).astype(np.float32)
    for threads in (1, 2):
        ops.set_threads(threads)
        got = attention_mod.attention(q, k, v, np.arange(S), scale=D ** -0.5, window=1)
        want = np.broadcast_to(v.astype(np.float32), got.shape)
        np.testing.assert_array_equal(got, want)
        assert np.array_equal(np.isnan(got), np.isnan(want))


@pytest.mark.parametrize("simd", [True, False])
def test_attention_float16_subnormal_keys(simd):
    # keys that are all float16 subnormals (or zeros), queries large enough to give scores
    # of order 1: a mis-widened subnormal would change every score
    ops.set_simd(simd)
    rng = np.random.default_rng(17)
    H, KV, S, D = 4, 2, 300, 64
    bits = rng.integers(0, 1024, (KV, S, D)).astype(np.uint16) | (rng.integers(0, 2, (KV, S, D)) << 15).astype(np.uint16)
    k = bits.view(np.float16)
    assert np.all(np.abs(k.astype(np.float32)) < 2.0 ** -14)
    v = rng.standard_normal((KV, S, D)).astype(np.float16)
    q = (rng.standard_normal((H, 2, D)) * 2.0 ** 20).astype(np.float32)
    positions = np.array([S - 2, S - 1])
    got = attention_mod.attention(q, k, v, positions, scale=D ** -0.5)
    want = attention_mod.attention_reference(q, k.astype(np.float32), v.astype(np.float32), positions, scale=D ** -0.5)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_attention_mixed_key_value_dtypes_fall_back():
    # float16 keys with float32 values: not a cache layout; the numpy definition answers
    rng = np.random.default_rng(18)
    q, k, v, positions = _attention_case(rng, 4, 2, 2, 20, 16, True)
    k16 = k.astype(np.float16)
    assert ops.attention(q, k16, v, positions, 0.25, 0, 0.0, None, None) is None
    got = attention_mod.attention(q, k16, v, positions, scale=0.25)
    want = attention_mod.attention_reference(q, k16.astype(np.float32), v, positions, scale=0.25)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_attention_takes_views_and_other_position_dtypes():
    # the kernel copies a non-contiguous q and converts int32 positions / float64 sinks itself
    rng = np.random.default_rng(5)
    q, k, v, positions = _attention_case(rng, 4, 2, 3, 20, 16, True)
    qt = np.ascontiguousarray(q.transpose(1, 0, 2)).transpose(1, 0, 2)  # [H, T, D] view, not C-contiguous
    sinks = rng.standard_normal(4)
    got = attention_mod.attention(qt, k, v, positions.astype(np.int32), scale=0.25, sinks=sinks)
    want = attention_mod.attention_reference(q, k, v, positions, scale=0.25, sinks=sinks.astype(np.float32))
    assert got.dtype == np.float32 and got.shape == q.shape
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("simd", [True, False])
@pytest.mark.parametrize("where", ["q_nan", "k_nan", "q_inf", "q_ninf", "k_inf", "v_nan"])
def test_attention_non_finite_inputs_match_the_reference(simd, where):
    """A NaN or infinite query or key gives NaN rows where the numpy definition does (the
    AVX2 path's max and exp clamps would otherwise turn them into finite weights)."""
    ops.set_simd(simd)
    ops.set_threads(2)
    rng = np.random.default_rng(11)
    # the last two split each row's keys over the threads and merge the parts
    for S, G, KV, D in ((5, 1, 2, 16), (33, 2, 2, 16), (300, 4, 2, 16), (2048, 2, 1, 64), (2048, 1, 2, 64)):
        q = rng.standard_normal((KV * G, 1, D)).astype(np.float32)
        k, v = (rng.standard_normal((KV, S, D)).astype(np.float32) for _ in range(2))
        target, index, value = {"q_nan": (q, (q.shape[0] - 1, 0, 3), np.nan), "k_nan": (k, (0, 2, 5), np.nan),
                                "q_inf": (q, (0, 0, 0), np.inf), "q_ninf": (q, (0, 0, 0), -np.inf),
                                "k_inf": (k, (KV - 1, 3, 0), np.inf), "v_nan": (v, (KV - 1, 1, 1), np.nan)}[where]
        target[index] = value
        if where == "k_inf":   # a positive product with the infinite key: a +inf score
            q[:, 0, 0] = np.abs(q[:, 0, 0]) + 0.1
        pos = np.array([S - 1])
        got = ops.attention(q, k, v, pos, 0.25, 0, 0.0, None, None)
        with np.errstate(invalid="ignore"):
            want = attention_mod.attention_reference(q, k, v, pos, scale=0.25)
        assert np.isnan(want).any()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), atol=1e-5)


def test_attention_falls_back_for_float64():
    rng = np.random.default_rng(4)
    q, k, v, positions = _attention_case(rng, 2, 1, 3, 3, 8, False)
    got = attention_mod.attention(q.astype(np.float64), k, v, positions, scale=0.3)
    want = attention_mod.attention_reference(q.astype(np.float64), k, v, positions, scale=0.3)
    np.testing.assert_array_equal(got, want)


# --- whole models (real GGUF files) ------------------------------------------------------


def _quantized_and_dense(path):
    from ster_py.decoder.model import Decoder
    from ster_py.load import load_model

    m = load_model(str(path))
    w = m.decoder._weights
    assert isinstance(w, GGUFWeights) and w.quantized
    dense = Decoder(m.spec, GGUFWeights(GGUFFile(w.path), "f32", qk_heads=w.qk_heads, rename=w.rename,
                                        quantized=False))
    assert isinstance(m.decoder.layers[0].q.weight, QuantTensor)
    assert not isinstance(dense.layers[0].q.weight, QuantTensor)
    return m, dense


def _rel_err(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


def _check_model(path, prompts):
    """Prefill (decoded panels) and one decode step (fused row dots) within 1e-3 of the dequantized model
    on float32 inputs; on AMX's tiles (inputs and decoded weights rounded to bfloat16, the default there)
    the prefill within 1e-2; the same 32 greedy tokens either way."""
    from ster_py.generate import Sampling, generate

    m, dense = _quantized_and_dense(path)
    for ids in prompts:
        for tiles in ((False, True) if tiles_round(qmatmul.simd_level()) else (False,)):
            was = qmatmul.set_bf16_inputs(tiles)
            try:
                cq, cd = m.decoder.new_cache(), dense.new_cache()
                rounded = qmatmul.bf16_rounded_products()
                a, b = m.decoder.forward(ids, cq), dense.forward(ids, cd)
                assert _rel_err(a, b) < (1e-2 if tiles else 1e-3), tiles
                assert (qmatmul.bf16_rounded_products() > rounded) == tiles
                a, b = m.decoder.forward([ids[-1]], cq), dense.forward([ids[-1]], cd)
                assert _rel_err(a, b) < (1e-2 if tiles else 1e-3), tiles
                stops = m.stop_ids()
                got = generate(m.decoder, ids, Sampling(max_new_tokens=32), stops)
                want = generate(dense, ids, Sampling(max_new_tokens=32), stops)
                assert got.ids == want.ids and len(got.ids) > 0, tiles
            finally:
                qmatmul.set_bf16_inputs(was)


@pytest.mark.real
def test_smollm2_quantized_matches_dequantized(smollm2_gguf):
    from ster_py.load import load_model
    from ster_py.prompt import encode_prompt

    tok = load_model(str(smollm2_gguf)).tokenizer
    chat = encode_prompt(tok, "What is the capital of France?").ids
    raw = tok.encode("The three primary colours are", add_special_tokens=True)
    _check_model(smollm2_gguf, [chat, raw])


@pytest.mark.real
def test_gemma3_quantized_matches_dequantized(gemma3_gguf):
    from ster_py.load import load_model

    tok = load_model(str(gemma3_gguf)).tokenizer
    _check_model(gemma3_gguf, [tok.encode("The three primary colours are", add_special_tokens=True)])


def test_safetensors_weights_are_mapped_views(tmp_path):
    import ml_dtypes
    from safetensors.numpy import save_file

    from ster_py.weights import SafetensorsWeights

    rng = np.random.default_rng(12)
    tensors = {"a": rng.standard_normal((3, 5)).astype(np.float32),
               "b": rng.standard_normal(7).astype(np.float16),
               "c": rng.standard_normal((2, 2)).astype(ml_dtypes.bfloat16),
               "ids": np.arange(4, dtype=np.int64)}
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    w = SafetensorsWeights([path], "f32")
    a = w.get("a")
    np.testing.assert_array_equal(a, tensors["a"])
    assert not a.flags.owndata  # a view of the map, not a copy
    a[0, 0] = 123.0  # copy-on-write: the file is untouched
    assert SafetensorsWeights([path], "f32").get("a")[0, 0] == tensors["a"][0, 0]
    np.testing.assert_array_equal(w.get("b"), tensors["b"].astype(np.float32))
    np.testing.assert_array_equal(w.get("c"), tensors["c"].astype(np.float32))
    assert w.get("missing") is None
    with pytest.raises(SterError, match="stored as I64"):  # an integer tensor is never used as a weight
        w.get("ids")
    half = SafetensorsWeights([path], "f16").get("b")
    assert half.dtype == np.float16 and not half.flags.owndata
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(path.read_bytes()[:40])
    with pytest.raises(SterError, match="failed to map"):
        SafetensorsWeights([bad])


def test_built_kernels_are_from_these_sources():
    import types

    from ster_py._kernels import SOURCE_VERSION, check_built

    for module in (qmatmul, ops):
        assert module.SOURCE_VERSION == SOURCE_VERSION, module.__name__  # rebuild after changing a .pyx
        check_built(module)
    with pytest.raises(ImportError, match="rebuild"):
        check_built(types.ModuleType("ster_py._kernels.stale"))


def test_few_rows_product_limits_and_switch():
    """force=3 takes 2..16 rows (each equal to its one-token product); ``qlinear.few_rows`` switches
    QuantLinear to it for that many rows only, and prefill keeps the decoded panels outside it."""
    import ml_dtypes

    from ster_py.decoder.qlinear import few_rows

    rng = np.random.default_rng(5)
    w = rng.standard_normal((40, 64)).astype(ml_dtypes.bfloat16)
    lin = QuantLinear(w)
    x = rng.standard_normal((17, 64)).astype(np.float32)
    rowdots, panels = np.empty((17, 40), np.float32), np.empty((17, 40), np.float32)
    lin._m.matmul(x, rowdots, 1)
    lin._m.matmul(x, panels, 2)
    out = np.empty((16, 40), np.float32)
    lin._m.matmul(x[:16], out, 3)
    np.testing.assert_array_equal(out, rowdots[:16])
    with pytest.raises(ValueError, match="at most 16 rows"):
        lin._m.matmul(x, np.empty((17, 40), np.float32), 3)
    assert not np.array_equal(rowdots, panels)  # the two paths round differently: the switch is visible
    with few_rows(8):
        np.testing.assert_array_equal(lin(x[:8]), rowdots[:8])
        np.testing.assert_array_equal(lin(x[:9]), panels[:9])  # above the limit: panels
    np.testing.assert_array_equal(lin(x[:8]), panels[:8])
