"""16-bit float weights used as stored, and the thread bound.

- The bf16 / f16 row kernels (``QuantLinear`` over a float16 / bfloat16 array) against
  their numpy reference (the weights widened exactly, multiplied in float64), within the
  float32 rounding bound of a K-term dot product: one and several tokens, row dots and
  decoded panels, 1 and 2 threads, row lengths with and without a vector tail, at every
  instruction-set level this CPU runs (portable, AVX2, AVX-512, AVX512_BF16), each forced
  with the ones above it off. The AVX512_BF16 row dots multiply the input split in two
  bfloat16 halves; their reference multiplies that split (``qmatmul.split_bf16``), itself
  checked against its definition with ml_dtypes. The AVX512_BF16 panels (several tokens)
  multiply the inputs rounded to bfloat16 (``qmatmul.set_bf16_inputs``, on by default on AMD's AVX512_BF16 cores and where AMX's tiles run them).
- A checkpoint saved in bf16 (and one in f16) by transformers runs with ``precision="auto"``:
  its matrices stay views of the file, every projection is a 16-bit ``QuantLinear``, the
  fused decode step takes every block, and logits match transformers on the same weights.
- ``set_threads`` bounds numpy's BLAS pool (threadpoolctl) and tells child processes.
"""
import numpy as np
import pytest

import ml_dtypes
from ster_py._kernels import qmatmul
from ster_py.decoder.qlinear import QuantLinear, float_activations, reference_matmul, set_threads
from ster_py.errors import SterError

from tiny import make_checkpoint, one_torch_thread, reference_logits  # noqa: F401  (autouse fixture)

U = 2.0 ** -24
LEVELS = qmatmul.SIMD_LEVELS[:qmatmul.SIMD_LEVELS.index(qmatmul.cpu_simd_level()) + 1]
BF16_LEVELS = ("avx512_bf16", "amx_bf16")   # the levels with bfloat16 products (and AMX's tiles at the second)
HALF = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}


@pytest.fixture(autouse=True)
def _restore():
    yield
    qmatmul.set_simd(True)
    qmatmul.set_threads(2)


def bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(4 sqrt(K) + 8) u sum_k |x_k w_k|: float32 rounding of a K-term dot product (as in test_qmatmul)."""
    K = w.shape[1]
    return (4 * np.sqrt(K) + 8) * U * (np.abs(x).astype(np.float64) @ np.abs(w.astype(np.float64)).T) + 1e-30


def split_input(x: np.ndarray) -> np.ndarray:
    """float64 hi + lo per row: the input the AVX512_BF16 row dots multiply."""
    return np.stack([np.sum(qmatmul.split_bf16(np.ascontiguousarray(r)), axis=0, dtype=np.float64) for r in x])


@pytest.mark.parametrize("kind", ["bf16", "f16"])
@pytest.mark.parametrize("cols", [16, 35, 64, 577, 1024])
def test_half_rows_match_numpy_every_level(kind, cols):
    rng = np.random.default_rng(cols)
    rows = 37
    w = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 2.0, (rows, 1))).astype(HALF[kind])
    lin = QuantLinear(w)
    for T in (1, 5, 13):
        x = rng.standard_normal((T, cols)).astype(np.float32)
        want = reference_matmul(x, w)
        want_split = split_input(x) @ w.astype(np.float64).T
        xr = x.astype(ml_dtypes.bfloat16).astype(np.float32)   # the vdpbf16ps tile's inputs
        want_round, b_round = reference_matmul(xr, w), bound(xr, w)
        b = bound(x, w)
        for level in LEVELS:
            qmatmul.set_simd_level(level)
            for threads in (1, 2):
                qmatmul.set_threads(threads)
                outs = {}
                for force in (0, 1, 2, 3):  # by T, row dots, decoded panels, few rows
                    out = outs[force] = np.full((T, rows), np.nan, np.float32)
                    lin._m.matmul(x, out, force)
                    rowdots = force in (1, 3) or (force == 0 and T == 1)
                    ref, bb = want, b
                    if kind == "bf16" and level in BF16_LEVELS:
                        ref, bb = (want_split, b) if rowdots else (want_round, b_round) if qmatmul.bf16_inputs() else (want, b)
                    excess = np.abs(out - ref) / bb
                    assert excess.max() <= 1.0, (kind, cols, T, level, threads, force, excess.max())
                np.testing.assert_array_equal(outs[3], outs[1])  # each row's one-token product


def test_bf16_input_tile_follows_its_definition():
    """With ``set_bf16_inputs`` on at AVX512_BF16, a bfloat16 matrix's several-token products
    (decoded panels and routed experts) multiply the inputs rounded to bfloat16 (nearest even,
    as ml_dtypes rounds) by vdpbf16ps: equal to that rounded product within the float32 bound,
    the same bits at 1 and 2 threads and whatever the tiling (odd rows of inputs, a lone or
    partial last panel, token counts that fill the 12-token tile or not); one-token products
    and lower levels keep the float32 inputs; off, the float32 tile serves. At amx_bf16 the rows
    whose length is a multiple of 32 run on AMX's tiles (16 x 16 blocks, partial in tokens and
    outputs, sums carried over 256-input chunks) and the others on vdpbf16ps, under the same bound;
    each level is checked with the one above it off."""
    if "avx512_bf16" not in LEVELS:
        pytest.skip("the vdpbf16ps tile runs only on a CPU with AVX512_BF16; this one has none")
    for level in [lv for lv in BF16_LEVELS if lv in LEVELS]:
        _check_bf16_input_tile(level)


def _check_bf16_input_tile(level):
    rng = np.random.default_rng(5)
    try:
        qmatmul.set_bf16_inputs(True)
        qmatmul.set_simd_level(level)
        for rows, cols in ((80, 600), (37, 577), (16, 33), (9, 1024), (80, 576), (33, 1536)):
            w = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 2.0, (rows, 1))).astype(ml_dtypes.bfloat16)
            m = QuantLinear(w)._m
            for T in (2, 13, 24, 40):
                x = rng.standard_normal((T, cols)).astype(np.float32)
                xr = x.astype(ml_dtypes.bfloat16)
                want, want32 = reference_matmul(xr.astype(np.float32), w), reference_matmul(x, w)
                b = bound(xr.astype(np.float32), w)
                outs = []
                for threads in (1, 2):
                    qmatmul.set_threads(threads)
                    out = np.full((T, rows), np.nan, np.float32)
                    m.matmul(x, out, 2)
                    assert (np.abs(out - want) / b).max() <= 1.0, (level, rows, cols, T, threads)
                    outs.append(out)
                np.testing.assert_array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
                assert np.abs(outs[0] - want32).max() > 0        # the inputs really were rounded
                qmatmul.set_simd_level("avx512_vnni")            # below the level: float32 inputs
                out = np.empty((T, rows), np.float32)
                m.matmul(x, out, 2)
                assert (np.abs(out - want32) / bound(x, w)).max() <= 1.0
                qmatmul.set_simd_level(level)
        # routed experts: the rows of each expert on the same tile (one expert has no rows)
        ws = [rng.standard_normal((48, 96)).astype(ml_dtypes.bfloat16) for _ in range(3)]   # 96: AMX's tiles
        x = rng.standard_normal((20, 96)).astype(np.float32)
        offsets = np.array([0, 7, 7, 20])
        y = np.full((20, 48), np.nan, np.float32)
        qmatmul.expert_matmul((tuple(QuantLinear(w)._m for w in ws),), x, offsets, (y,))
        for e in (0, 2):
            a, z = offsets[e], offsets[e + 1]
            xr = x[a:z].astype(ml_dtypes.bfloat16).astype(np.float32)
            assert (np.abs(y[a:z] - reference_matmul(xr, ws[e])) / bound(xr, ws[e])).max() <= 1.0
        qmatmul.set_bf16_inputs(False)
        w = ws[0]
        out = np.empty((20, 48), np.float32)
        QuantLinear(w)._m.matmul(x, out, 2)
        assert (np.abs(out - reference_matmul(x, w)) / bound(x, w)).max() <= 1.0
    finally:
        qmatmul.set_bf16_inputs(qmatmul.BF16_INPUTS_DEFAULT)
        qmatmul.set_simd(True)


def test_bf16_inputs_env_turns_the_rounding_off():
    """$STER_BF16_INPUTS=0 starts a process with the bfloat16 rounding off (A/B runs) and =1 with it on wherever
    the CPU has AVX512_BF16; unset, it is on where bfloat16 products outrun the float32 tile: AMD's cores and
    AMX's tiles, not Intel's without (the vendor read here from /proc/cpuinfo, not from the kernels' own check);
    any other value as unset.
    ``float_activations`` turns it off and restores it."""
    import os
    import subprocess
    import sys

    code = ("from ster_py._kernels import qmatmul; from ster_py.decoder.qlinear import float_activations\n"
            "a = qmatmul.bf16_inputs()\nwith float_activations(): b = qmatmul.bf16_inputs()\n"
            "print(a, b, qmatmul.bf16_inputs())")
    has = qmatmul.cpu_simd_level() in BF16_LEVELS
    with open("/proc/cpuinfo") as f:
        amd = any(line.split(":")[-1].strip() == "AuthenticAMD" for line in f if line.startswith("vendor_id"))
    fast = has and (amd or qmatmul.cpu_simd_level() == "amx_bf16")
    # a value check_kernel_env refuses is the default here (the library read "false", "off" and "2" as on)
    for value, want in (("0", "False False False"), ("1", f"{has} False {has}"), (None, f"{fast} False {fast}"),
                        ("false", f"{fast} False {fast}"), ("off", f"{fast} False {fast}"),
                        ("2", f"{fast} False {fast}")):
        env = {k: v for k, v in os.environ.items() if k != "STER_BF16_INPUTS"}
        if value is not None:
            env["STER_BF16_INPUTS"] = value
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.strip() == want, (value, r.stdout)


def test_bf16_split_follows_its_definition():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(300) * 10.0 ** rng.integers(-30, 30, 300)).astype(np.float32)
    x[:6] = [0.0, -0.0, 1.0, -3.0e38, 1e-40, 65504.0]
    hi, lo = qmatmul.split_bf16(x)
    want_hi = x.astype(ml_dtypes.bfloat16).astype(np.float32)   # round to nearest even
    want_lo = (x - want_hi).astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(hi, want_hi)
    np.testing.assert_array_equal(lo, want_lo)
    normal = np.abs(x) >= 2.0 ** -100
    assert (np.abs(x[normal].astype(np.float64) - hi[normal] - lo[normal]) <= 2.0 ** -16 * np.abs(x[normal])).all()
    assert qmatmul.split_bf16(np.array([1.0, np.inf], np.float32)) is None
    assert qmatmul.split_bf16(np.array([np.nan], np.float32)) is None


@pytest.mark.parametrize("kind", ["bf16", "f16"])
def test_half_rows_propagate_non_finite_inputs(kind):
    """inf and NaN inputs give what float32 arithmetic gives (the bf16 split is skipped for them)."""
    w = np.ones((3, 64), HALF[kind])
    w[1] = -1
    for level in LEVELS:
        qmatmul.set_simd_level(level)
        x = np.zeros((1, 64), np.float32)
        x[0, 5] = np.inf
        out = QuantLinear(w)(x)
        assert out[0, 0] == np.inf and out[0, 1] == -np.inf, level
        x[0, 6] = np.nan
        assert np.isnan(QuantLinear(w)(x)).all(), level


def test_quant_linear_refuses_other_weights():
    with pytest.raises(SterError, match="float16/bfloat16"):
        QuantLinear(np.ones((4, 8), np.float64))


@pytest.mark.parametrize("kind", ["bf16", "f16"])
def test_half_checkpoint_runs_as_stored(tmp_path, kind):
    """A transformers checkpoint saved in bf16 / f16, loaded with precision 'auto': its
    projections read the file's pages (no float32 copy), every block takes the fused decode
    step, and logits match transformers (which widens the same weights to float32)."""
    import torch

    from ster_py.generate import Sampling, generate
    from ster_py.load import load_model

    dtype = torch.bfloat16 if kind == "bf16" else torch.float16
    model = make_checkpoint(tmp_path, "llama", dtype=dtype, hidden_size=64, intermediate_size=96)
    m = load_model(str(tmp_path), precision="auto")
    d = m.decoder
    for layer in d.layers:
        for role in ("q", "k", "v", "o", "gate", "up", "down"):
            p = getattr(layer, role)
            assert type(p) is QuantLinear and p.weight.dtype == HALF[kind], (layer.i, role)
            assert not p.weight.flags.owndata  # a view of the memory map
        assert layer.decode_step() is not None
    ids = [1, 5, 9, 33, 7, 100, 64, 3]
    ref, _ = reference_logits(model, ids)
    with float_activations():   # the model's math: every product on float32 inputs
        ours = d.forward(ids)
    assert np.linalg.norm(ours - ref) / np.linalg.norm(ref) < 1e-5
    # generation's default: where the CPU has AVX512_BF16, a bf16 prompt's products round their inputs to
    # bfloat16 (as transformers' bf16 and llama.cpp's BF16 do); still well within bf16's own error
    err = np.linalg.norm(d.forward(ids) - ref) / np.linalg.norm(ref)
    assert err < (2e-2 if kind == "bf16" and qmatmul.bf16_inputs() else 1e-5), err
    # greedy decoding: the fused step and the Python blocks give the same tokens and logits
    fused = generate(d, ids, Sampling(max_new_tokens=6), stop_ids=())
    d.fuse_decode = False
    plain = generate(d, ids, Sampling(max_new_tokens=6), stop_ids=())
    assert fused.ids == plain.ids


def test_front_door_float_activations_gives_float32_math(tmp_path):
    """load_model's docstring said "Compute is always float32", yet a bf16 model's prompt rounds its products'
    inputs to bfloat16 where the CPU multiplies those fast (~1e-2 relative on real models' logits), and the
    switch that turns generation's roundings off was not in the front door. ``ster_py.float_activations()``
    is: inside it a bf16 checkpoint at precision auto gives the logits of the same weights held as float32."""
    import ster_py
    from ster_py.load import load_model

    assert ster_py.float_activations is float_activations and "float_activations" in ster_py.__all__
    make_checkpoint(tmp_path, "llama", dtype=__import__("torch").bfloat16, hidden_size=64, intermediate_size=96)
    ids = [1, 5, 9, 33, 7, 100, 64, 3]
    want = load_model(str(tmp_path), precision="f32").decoder.forward(ids)
    stored = load_model(str(tmp_path), precision="auto")
    with ster_py.float_activations():
        got = stored.decoder.forward(ids)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5
    assert "float_activations" in load_model.__doc__ and "Compute is always float32" not in load_model.__doc__


def test_precision_auto_keeps_stored_dtypes(tmp_path):
    from ster_py.inspect import inspect_model
    from ster_py.weights import SafetensorsWeights, resident_dtype

    make_checkpoint(tmp_path, "llama", dtype=__import__("torch").bfloat16)
    files = list(tmp_path.glob("*.safetensors"))
    w = SafetensorsWeights(files, "auto")
    t = w.get("model.layers.0.self_attn.q_proj.weight")
    assert t.dtype == ml_dtypes.bfloat16 and not t.flags.owndata
    assert resident_dtype("auto", np.float64) == np.float32 and resident_dtype("f16", ml_dtypes.bfloat16) == np.float16
    info = inspect_model(str(tmp_path), precision="auto")
    assert info["resident_bytes"] == 2 * info["parameters"]
    assert inspect_model(str(tmp_path), precision="f32")["resident_bytes"] == 4 * info["parameters"]


def test_set_threads_bounds_blas_and_children(monkeypatch):
    from threadpoolctl import threadpool_info

    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    try:
        set_threads(1)
        blas = [p for p in threadpool_info() if p["user_api"] == "blas"]
        assert blas and all(p["num_threads"] == 1 for p in blas)
        import os

        assert os.environ["OPENBLAS_NUM_THREADS"] == "1" and os.environ["OMP_NUM_THREADS"] == "1"
        assert qmatmul.get_threads() == 1
    finally:
        set_threads(2)
    # with float32 products on ster's pool (qlinear.pool_blas), OpenBLAS itself runs one thread per call
    from ster_py.decoder import qlinear

    for p in threadpool_info():
        if p["user_api"] == "blas":
            assert p["num_threads"] == (1 if qlinear.POOL_BLAS and p["prefix"] == qlinear._POOL_BLAS_PREFIX else 2)


def test_simd_level_env_caps_every_kernel_module():
    """$STER_SIMD_LEVEL makes this CPU take a lower machine's paths (how the suite is run as on
    an AVX2-only or a portable CPU): qmatmul's levels stop there, and at portable the AVX2 paths
    of ops, scan and lightning are off too."""
    import subprocess
    import sys

    code = ("from ster_py._kernels import qmatmul, ops, scan, lightning; import numpy as np\n"
            "ops.set_simd(True); scan.set_simd(True); lightning.set_simd(True)\n"
            "print(qmatmul.cpu_simd_level(), qmatmul.simd_level(), qmatmul.set_simd_level('avx512_bf16'), "
            "ops.simd_enabled(), scan.simd_enabled(), lightning.simd_enabled())")
    # the CPU's own top level (this process's may be capped by $STER_SIMD_LEVEL)
    env = {k: v for k, v in __import__("os").environ.items() if k != "STER_SIMD_LEVEL"}
    want_top = subprocess.run([sys.executable, "-c", "from ster_py._kernels import qmatmul; "
                               "print(qmatmul.cpu_simd_level())"], capture_output=True, text=True, timeout=120,
                              env=env).stdout.strip()
    for cap in ("portable", "avx2", "avx512"):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           env={**__import__("os").environ, "STER_SIMD_LEVEL": cap})
        assert r.returncode == 0, r.stderr[-2000:]
        got = min(qmatmul.SIMD_LEVELS.index(cap), qmatmul.SIMD_LEVELS.index(want_top))
        assert r.stdout.split() == [qmatmul.SIMD_LEVELS[got]] * 3 + [str(got > 0)] * 3, (cap, r.stdout)
