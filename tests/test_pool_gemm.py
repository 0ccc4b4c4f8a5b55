"""float32 products on ster's pool (``ops.gemm_nt``, used by ``Linear`` once ``set_threads`` found
numpy's OpenBLAS: ``qlinear.pool_blas``) against numpy: the same BLAS routine called per column
chunk: on one thread equal to numpy's own ``x @ w.T`` bit for bit (on more, OpenBLAS's Haswell/Zen
kernels round a column by where it falls in its call, and numpy's call orders the operands its own
way), and always to the float64 product within float32 rounding; a row's result does not depend on
the rows beside it."""
import numpy as np
import pytest

from ster_py._kernels import ops
from ster_py.decoder import qlinear
from ster_py.decoder.linear import MIN_ROWS, Linear, blas_rows_exact
from ster_py.decoder.qlinear import set_threads

pytestmark = pytest.mark.skipif(not (set_threads(2) or qlinear.POOL_BLAS),
                                reason="numpy's BLAS is not an ILP64 pthreads OpenBLAS: Linear uses numpy's matmul")


@pytest.fixture(autouse=True)
def _two_threads():
    yield
    set_threads(2)


@pytest.mark.parametrize("threads", [1, 2])
def test_gemm_nt_equals_numpy(threads):
    set_threads(threads)
    rng = np.random.default_rng(threads)
    for M, N, K in ((512, 1536, 576), (16, 192, 576), (1, 576, 576), (3, 40, 7), (64, 49, 300), (200, 1000, 64)):
        x = rng.standard_normal((M, K), dtype=np.float32)
        w = rng.standard_normal((N, K), dtype=np.float32)
        y = np.empty((M, N), np.float32)
        ops.gemm_nt(x, w, y)
        if threads == 1:   # one call of the same routine (more threads: a call per column chunk, see above)
            np.testing.assert_array_equal(y, x @ w.T)
        ref = x.astype(np.float64) @ w.T.astype(np.float64)
        bound = 2 * K * 2.0 ** -24 * (np.abs(x).astype(np.float64) @ np.abs(w).T.astype(np.float64))
        assert np.all(np.abs(y - ref) <= bound)


def test_gemm_nt_takes_row_strided_views_and_refuses_misfits():
    rng = np.random.default_rng(5)
    big = rng.standard_normal((300, 700), dtype=np.float32)
    x, w = big[:100, :64], big[100:290, 100:164]   # rows at a stride, contiguous within
    out = np.zeros((100, 400), np.float32)
    ops.gemm_nt(x, w, out[:, 10:200])
    np.testing.assert_array_equal(out[:, 10:200], x @ w.T)
    assert not out[:, :10].any() and not out[:, 200:].any()
    with pytest.raises(ValueError):
        ops.gemm_nt(x, w[:, :63], np.empty((100, 190), np.float32))
    with pytest.raises(ValueError):
        ops.gemm_nt(x, w, np.empty((100, 191), np.float32))
    with pytest.raises(ValueError):
        ops.gemm_nt(big[:100, :128:2], w, np.empty((100, 190), np.float32))   # elements not contiguous


@pytest.mark.parametrize("panels", [False, True])
def test_linear_runs_on_the_pool_and_rows_do_not_depend_on_their_neighbours(monkeypatch, panels):
    """On OpenBLAS through the pool (``ops.gemm_nt``), or on the kernels' register tile (``qmatmul.f32_matmul``,
    where ``qlinear.f32_panels`` prefers it), whose rows never depend on their neighbours; one row (a decode
    step) stays on BLAS's vector product either way."""
    from ster_py._kernels import qmatmul
    from ster_py.decoder import linear

    monkeypatch.setattr(linear, "_F32_PANELS", panels)
    monkeypatch.setattr(linear, "_ROWS_EXACT", None)   # probed again on the path this case takes
    rng = np.random.default_rng(6)
    w = rng.standard_normal((1536, 576), dtype=np.float32)
    x = rng.standard_normal((600, 576), dtype=np.float32)
    calls = []
    real = qmatmul.f32_matmul if panels else ops.gemm_nt
    monkeypatch.setattr(qmatmul if panels else ops, "f32_matmul" if panels else "gemm_nt",
                        lambda *a: (calls.append(a[0].shape), real(*a))[1])
    lin = Linear(w)
    full = lin(x)
    assert calls and calls[0] == (600, 576)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    assert np.all(np.abs(full - ref) <= 2 * 576 * 2.0 ** -24 * (np.abs(x).astype(np.float64) @ np.abs(w).T))
    for n in (2, MIN_ROWS - 1, MIN_ROWS, 37, 300):
        if panels or blas_rows_exact():
            np.testing.assert_array_equal(lin(x[:n]), full[:n])
        else:   # OpenBLAS's Haswell/Zen kernels round a row by its place in its tile of rows
            for got, want in ((lin(x[:n]), full[:n]), (lin(x[n:]), full[n:])):
                assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    np.testing.assert_array_equal(lin(x[:1]), x[:1] @ w.T)
