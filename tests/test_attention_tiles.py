"""Prefill attention in tiles (cython/ster_attn_tile.h, ``ops._attend_tiled``) against the numpy
definition (``attention_reference`` in ster_py/decoder/attention.py).

From ``ops.set_tile_min_rows`` query rows (default 2: every prompt call) on a SIMD level, attention runs several query
rows of one key/value group per item against blocks of a transposed key copy. Every case
here runs at each SIMD level this CPU has (AVX2, AVX-512; forced with
``ops.set_simd_level``), with 1 and 2 threads, and checks through ``ops.tile_calls`` that the
tiled path is the one that ran. Sizes are chosen to be awkward: row counts that are not a
multiple of the tile's rows, head dims that are not a multiple of the vector width (the AVX2
instance takes multiples of 8 only, the others run row by row there), windows that cut a
block, cached keys before the first query, a single key, float16 caches, soft-capping,
sinks, biases (with -inf over whole blocks) and non-finite inputs.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from ster_py._kernels import ops, qmatmul
from ster_py.decoder import attention as attention_mod

#: ops levels (1 AVX2, 2 AVX-512) this CPU runs.
TILE_LEVELS = [lv for lv in (1, 2) if lv <= min(qmatmul.SIMD_LEVELS.index(qmatmul.cpu_simd_level()), 2)]


@pytest.fixture(autouse=True)
def _restore():
    yield
    ops.set_simd(True)
    ops.set_threads(2)
    ops.set_tile_min_rows(2)


def _run(level, threads, q, k, v, positions, tiled=True, **kw):
    """The kernel's answer at a level; asserts that it ran in tiles when it should."""
    assert ops.set_simd_level(level) == level
    ops.set_threads(threads)
    before = ops.tile_calls()
    got = attention_mod.attention(q, k, v, positions, **kw)
    tiled = tiled and (level == 2 or q.shape[2] % 8 == 0)
    assert ops.tile_calls() - before == (1 if tiled else 0)
    return got


def _check(level, q, k, v, positions, tol=2e-5, **kw):
    want = attention_mod.attention_reference(q, k.astype(np.float32), v.astype(np.float32), positions, **kw)
    for threads in (1, 2):
        got = _run(level, threads, q, k, v, positions, **kw)
        assert got.dtype == np.float32 and got.shape == q.shape
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=str((level, threads, q.shape, k.shape, kw)))


# (H, KV, T, S, D): G = H / KV query heads per key/value head; S > T: cached keys first
SHAPES = [(9, 3, 37, 37, 64),    # SmolLM2's grouping, 37 rows: not a multiple of 4 (AVX-512) or 2 (AVX2)
          (4, 1, 20, 50, 40),    # one group, D % 16 == 8
          (8, 2, 17, 17, 8),     # G = 4, the smallest D
          (6, 2, 9, 100, 24),    # 91 cached keys
          (3, 3, 13, 13, 256),   # G = 1: rows only; long rows
          (10, 2, 11, 70, 16),   # G = 5: a divisor of G that does not fill the tile
          (4, 2, 8, 8, 12),      # D = 12: AVX-512 masks; AVX2 runs row by row
          (2, 1, 12, 33, 36)]    # D = 36 (32 + 4)


@pytest.mark.parametrize("level", TILE_LEVELS)
@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_tiles_match_numpy(level, kv_dtype, shape):
    H, KV, T, S, D = shape
    rng = np.random.default_rng(H * 1000 + T * 10 + D)
    q = rng.standard_normal((H, T, D)).astype(np.float32)
    # cache views: strided in the position axis
    k = rng.standard_normal((KV, S + 5, D)).astype(kv_dtype)[:, :S]
    v = rng.standard_normal((KV, S + 5, D)).astype(kv_dtype)[:, :S]
    positions = np.arange(S - T, S)
    masked = rng.standard_normal((H, T, S)).astype(np.float32)
    masked[..., 1:S // 3] = -np.inf   # whole blocks masked for every row where S is long (key 0 stays)
    masked[..., S // 2:S // 2 + 3] = -np.inf
    cases = [dict(), dict(window=1), dict(window=5), dict(window=33), dict(softcap=5.0), dict(softcap=0.5),
             dict(sinks=rng.standard_normal(H).astype(np.float32)),
             dict(sinks=np.full(H, 30.0, np.float32)),   # a sink that outweighs every key
             dict(bias=rng.standard_normal((H, T, S)).astype(np.float32)),
             dict(bias=rng.standard_normal((H, 1, S)).astype(np.float32), window=7),
             dict(bias=rng.standard_normal((T, S)).astype(np.float32)),
             dict(bias=masked), dict(softcap=3.0, window=6, sinks=rng.standard_normal(H).astype(np.float32))]
    for kw in cases:
        _check(level, q, k, v, positions, scale=D ** -0.5, **kw)


@pytest.mark.parametrize("level", TILE_LEVELS)
def test_a_row_does_not_depend_on_how_the_prompt_was_cut(level):
    """A prompt cache reuses keys bit for bit (ster_py/prefix.py): a position's output must be the
    same whether its row came in one call with the whole prompt or in a later call of 2+ rows (the
    default tile threshold sends both through the tiles)."""
    rng = np.random.default_rng(11)
    H, KV, S, D = 9, 3, 41, 64
    q = rng.standard_normal((H, S, D)).astype(np.float32)
    k, v = (rng.standard_normal((KV, S, D)).astype(np.float32) for _ in range(2))
    assert ops.set_simd_level(level) == level
    whole = attention_mod.attention(q, k, v, np.arange(S), scale=D ** -0.5)
    for start in (0, 10, 25, 27, 39):
        for stop in (start + 2, start + 13, S):
            if stop > S:
                continue
            part = attention_mod.attention(q[:, start:stop], k[:, :stop], v[:, :stop], np.arange(start, stop),
                                           scale=D ** -0.5)
            np.testing.assert_array_equal(part, whole[:, start:stop], err_msg=str((start, stop)))


@pytest.mark.parametrize("level", TILE_LEVELS)
def test_tiles_odd_positions(level):
    """Rows that see one key (all at position 0), positions past the cache (clipped to its
    keys), rows out of order, and positions that repeat."""
    rng = np.random.default_rng(3)
    H, KV, D = 6, 2, 32
    for S, positions in ((1, np.zeros(9, np.int64)), (5, np.arange(10, 19)),
                         (40, rng.permutation(40)[:23]), (30, np.repeat(np.arange(5, 30, 5), 2))):
        T = len(positions)
        q = rng.standard_normal((H, T, D)).astype(np.float32)
        k, v = (rng.standard_normal((KV, S, D)).astype(np.float32) for _ in range(2))
        for kw in (dict(), dict(window=3), dict(sinks=rng.standard_normal(H).astype(np.float32))):
            if "window" in kw and positions.max() >= S + 2:   # rows that see no key: the reference's 0/0
                continue
            _check(level, q, k, v, positions, scale=0.3, **kw)


@pytest.mark.parametrize("level", TILE_LEVELS)
def test_tiles_long_prompt(level):
    """A 300-row prompt over 300 keys (several blocks and row tiles per thread), Gemma-style
    sliding window and soft-cap."""
    rng = np.random.default_rng(4)
    H, KV, T, D = 4, 1, 300, 64
    q = rng.standard_normal((H, T, D)).astype(np.float32)
    k, v = (rng.standard_normal((KV, T, D)).astype(np.float32) for _ in range(2))
    for kw in (dict(), dict(window=64, softcap=20.0)):
        _check(level, q, k, v, np.arange(T), scale=D ** -0.5, **kw)


@pytest.mark.parametrize("level", TILE_LEVELS)
@pytest.mark.parametrize("where", ["q_nan", "k_nan", "q_inf", "q_ninf", "k_inf", "v_nan"])
def test_tiles_non_finite_inputs_match_the_reference(level, where):
    """A NaN or infinite query, key or value gives NaN rows exactly where the numpy definition
    does (the max and exp clamps would otherwise turn them into finite weights)."""
    rng = np.random.default_rng(11)
    for S, G, KV, D in ((12, 1, 2, 16), (45, 3, 1, 64), (70, 2, 2, 32)):
        T = S
        q = rng.standard_normal((KV * G, T, D)).astype(np.float32)
        k, v = (rng.standard_normal((KV, S, D)).astype(np.float32) for _ in range(2))
        target, index, value = {"q_nan": (q, (q.shape[0] - 1, T - 2, 3), np.nan), "k_nan": (k, (0, 2, 5), np.nan),
                                "q_inf": (q, (0, T - 1, 0), np.inf), "q_ninf": (q, (0, 4, 0), -np.inf),
                                "k_inf": (k, (KV - 1, 3, 0), np.inf), "v_nan": (v, (KV - 1, 1, 1), np.nan)}[where]
        target[index] = value
        if where == "k_inf":   # positive products with the infinite key: +inf scores
            q[:, :, 0] = np.abs(q[:, :, 0]) + 0.1
        with np.errstate(invalid="ignore"):
            want = attention_mod.attention_reference(q, k, v, np.arange(T), scale=0.25)
        assert np.isnan(want).any()
        for threads in (1, 2):
            # a non-finite value runs row by row (the tiles would multiply it by the 0 weight
            # of rows that do not see it)
            got = _run(level, threads, q, k, v, np.arange(T), tiled=where != "v_nan", scale=0.25)
            if where == "v_nan":   # rows before the NaN value's key do not read it (the reference's 0 * NaN)
                assert np.isfinite(got[:, :index[1]]).all()
            first = index[1] if where == "v_nan" else 0
            np.testing.assert_array_equal(np.isnan(got[:, first:]), np.isnan(want[:, first:]))
            np.testing.assert_allclose(np.nan_to_num(got[:, first:]), np.nan_to_num(want[:, first:]), atol=1e-5)


def test_rows_below_the_tile_threshold_and_portable_level_do_not_tile():
    # One query row (a decode step) is below the default threshold of 2 rows.
    rng = np.random.default_rng(5)
    q = rng.standard_normal((4, 1, 16)).astype(np.float32)
    k, v = (rng.standard_normal((2, 7, 16)).astype(np.float32) for _ in range(2))
    want = attention_mod.attention_reference(q, k, v, np.array([6]), scale=0.25)
    for level in [0] + TILE_LEVELS:
        ops.set_simd_level(level)
        before = ops.tile_calls()
        np.testing.assert_allclose(attention_mod.attention(q, k, v, np.array([6]), scale=0.25), want,
                                   rtol=2e-5, atol=2e-5)
        assert ops.tile_calls() == before
    ops.set_simd(True)
    q8 = rng.standard_normal((4, 8, 16)).astype(np.float32)
    k8, v8 = (rng.standard_normal((2, 8, 16)).astype(np.float32) for _ in range(2))
    ops.set_simd_level(0)
    before = ops.tile_calls()
    got = attention_mod.attention(q8, k8, v8, np.arange(8), scale=0.25)
    assert ops.tile_calls() == before
    np.testing.assert_allclose(got, attention_mod.attention_reference(q8, k8, v8, np.arange(8), scale=0.25),
                               rtol=2e-5, atol=2e-5)


@pytest.mark.skipif(2 not in TILE_LEVELS, reason="no AVX-512 here (CPU or $STER_SIMD_LEVEL): nothing to cap")
def test_simd_level_env_caps_the_tiles_at_avx2():
    """$STER_SIMD_LEVEL=avx2 on an AVX-512 CPU: the AVX2 tiles run (level 1)."""
    code = "from ster_py._kernels import ops; print(ops.simd_level())"
    env = dict(os.environ, STER_SIMD_LEVEL="avx2")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "1"
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, STER_SIMD_LEVEL="portable"), cwd=root,
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"
