"""The routed experts' batched products (``qmatmul.expert_matmul``) and the grouped prefill
of ``MoE`` built on them, against numpy (float64 on gguf-py's dequantized weights; on AMX's tiles
both rounded to bfloat16 first, as the tiles do) and bit for bit against the per-expert products
they replace.

Token groupings leave experts empty and give some one token (those take the row dots, as a
one-row ``QuantLinear`` does); the expert widths include one that is not a whole number of
16-row panels or 8-float vectors.
"""
import numpy as np
import pytest

from ster_py._kernels import qmatmul
from ster_py.decoder.ffn import DenseFFN
from ster_py.decoder.linear import Linear
from ster_py.decoder.moe import MoE, MoESpec, RouterSpec
from ster_py.decoder.qlinear import QuantLinear, QuantTensor, float_activations
from test_qmatmul import _Tensor, bf16_rounded, oracle_weights, random_blocks, rounding_bound, tiles_round

TYPES = ["Q4_K", "Q6_K", "Q8_0", "Q4_0", "IQ4_XS", "MXFP4"]


def _experts(type_name, n, rows, cols, rng):
    """n QuantTensor [rows, cols] of ``type_name`` and their float64 oracle weights."""
    mats, dense = [], []
    for e in range(n):
        raw = random_blocks(type_name, rows, cols, rng)
        mats.append(QuantTensor(_Tensor(raw, type_name, (rows, cols))))
        dense.append(oracle_weights(raw, type_name, rows, cols))
    return mats, dense


@pytest.mark.parametrize("type_name", TYPES)
def test_expert_matmul_equals_numpy_and_the_per_expert_panels(type_name):
    rng = np.random.default_rng(7)
    K = 256
    gates, gdense = _experts(type_name, 5, 40, K, rng)     # 40 rows: two and a half panels
    ups, udense = _experts(type_name, 5, 40, K, rng)
    counts = np.array([3, 0, 1, 9, 2])                      # an empty expert, a one-token expert
    offsets = np.concatenate([[0], np.cumsum(counts)])
    x = rng.standard_normal((counts.sum(), K)).astype(np.float32)
    g = np.full((x.shape[0], 40), np.nan, np.float32)
    u = np.full_like(g, np.nan)
    qmatmul.expert_matmul((tuple(m.qmatrix() for m in gates), tuple(m.qmatrix() for m in ups)), x, offsets, (g, u))
    for e in range(5):
        a, b = offsets[e], offsets[e + 1]
        for out, mats, dense in ((g, gates, gdense), (u, ups, udense)):
            if b - a < 2:   # skipped below min_tokens: left as they were
                assert np.isnan(out[a:b]).all()
                continue
            xe, we = x[a:b].astype(np.float64), dense[e]
            if tiles_round(qmatmul.simd_level()):   # AMX's tiles: inputs and decoded weights in bfloat16
                xe, we = bf16_rounded(xe), bf16_rounded(we)
            assert (np.abs(out[a:b] - xe @ we.T) <= rounding_bound(xe, we, 32)).all()
            panels = np.empty((b - a, 40), np.float32)
            mats[e].qmatrix().matmul(x[a:b], panels, 2)
            np.testing.assert_array_equal(out[a:b], panels)
    # min_tokens=1 takes the one-token expert through the panels too
    qmatmul.expert_matmul((tuple(m.qmatrix() for m in gates),), x, offsets, (g,), min_tokens=1)
    panels = np.empty((1, 40), np.float32)
    gates[2].qmatrix().matmul(x[3:4], panels, 2)
    np.testing.assert_array_equal(g[3:4], panels)


def test_expert_matmul_refuses_what_does_not_fit():
    rng = np.random.default_rng(1)
    mats = tuple(m.qmatrix() for m in _experts("Q8_0", 3, 32, 64, rng)[0])
    x = np.zeros((4, 64), np.float32)
    y = np.zeros((4, 32), np.float32)
    for bad in (lambda: qmatmul.expert_matmul((mats,), x, np.array([0, 1, 2, 3]), (y,)),     # offsets end short
                lambda: qmatmul.expert_matmul((mats,), x, np.array([0, 3, 1, 4]), (y,)),     # decreasing
                lambda: qmatmul.expert_matmul((mats,), x, np.array([0, 1]), (y,)),           # one per expert
                lambda: qmatmul.expert_matmul((mats,), x[:, :32], np.array([0, 1, 2, 4]), (y,)),
                lambda: qmatmul.expert_matmul((mats,), x, np.array([0, 1, 2, 4]), (y[:, :16],)),
                lambda: qmatmul.expert_matmul((mats, mats[:2]), x, np.array([0, 1, 2, 4]), (y, y)),
                lambda: qmatmul.expert_matmul((mats,), x, np.array([0, 1, 2, 4]), (y,), min_tokens=0)):
        with pytest.raises(ValueError):
            bad()


@pytest.mark.parametrize("type_name,F,on_input", [("Q4_K", 256, False), ("Q8_0", 96, True), ("Q6_K", 256, True)])
def test_grouped_prefill_equals_the_per_expert_loop(type_name, F, on_input):
    """MoE over a prompt: the grouped path (one job per projection for every expert) gives the
    per-expert loop's float32 values bit for bit (F = 96: vectors that straddle experts' rows),
    and both are within float32 rounding of the float64 definition."""
    rng = np.random.default_rng(11)
    E, H, T, k = 9, 256, 6, 3
    mats = {r: _experts(type_name, E, *((F, H) if r != "down" else (H, F)), rng) for r in ("gate", "up", "down")}
    experts = [DenseFFN(*(QuantLinear(mats[r][0][e]) for r in ("gate", "up", "down")), "silu") for e in range(E)]
    spec = MoESpec(RouterSpec(E, k, renormalize=True, on_input=on_input), expert_size=F)
    router = rng.standard_normal((E, H)).astype(np.float32)
    bias = np.zeros(E, np.float32)
    bias[5] = -100.0   # expert 5 is never chosen
    layer = MoE(spec, Linear(router, bias), None, experts)
    x = (rng.standard_normal((T, H)) * 0.1).astype(np.float32)
    ids, _ = layer.route(x)
    counts = np.bincount(ids.reshape(-1), minlength=E)
    assert counts[5] == 0 and counts.max() >= 2 and (counts == 1).any()
    assert layer._fused_experts()
    got = layer(x)
    layer._fused = False
    want = layer(x)
    np.testing.assert_array_equal(got, want)

    ids, w = layer.route(x)
    ref = np.zeros((T, H))
    with float_activations():   # the definition's sums: no int16 or bfloat16 rounding of the inputs
        layer._fused = None
        exact = layer(x)
    for t in range(T):
        for e, we in zip(ids[t], w[t]):
            xe = x[t].astype(np.float64) * (we if on_input else 1.0)
            g, u = xe @ mats["gate"][1][e].T, xe @ mats["up"][1][e].T
            y = (g / (1 + np.exp(-g)) * u) @ mats["down"][1][e].T
            ref[t] += y if on_input else we * y
    assert np.abs(exact - ref).max() <= 1e-4 * np.abs(ref).max()
