"""Dequantization: the Cython kernels and the numpy reference against gguf-py (the oracle).

Every comparison is bit-exact (float32 bit patterns), on random blocks of each supported
type and, marked `real`, on every tensor of the two real GGUF files.
"""
import zlib

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from ster_py.errors import SterError
from ster_py.gguf import quants
from ster_py.gguf.reader import GGUFFile

SUPPORTED = quants.SUPPORTED_TYPE_NAMES
# Types gguf-py can quantize (we feed it real numbers); the others get random bytes whose
# f16 scale fields are overwritten with finite values at these byte offsets in the block.
GGUF_PY_QUANTIZES = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4"}
F16_SCALE_OFFSETS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
                     "IQ4_NL": (0,), "IQ4_XS": (0,)}


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def assert_bit_exact(ours: np.ndarray, oracle: np.ndarray, what: str) -> None:
    assert ours.dtype == np.float32 and ours.shape == oracle.shape, (what, ours.shape, oracle.shape)
    diff = np.flatnonzero(bits(ours) != bits(oracle))
    assert diff.size == 0, f"{what}: {diff.size} values differ, first at flat index {diff[0]}: " \
                           f"{ours.reshape(-1)[diff[0]]!r} vs {oracle.reshape(-1)[diff[0]]!r}"


def random_raw(name: str, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    """Raw bytes of a tensor of ``name`` and numpy ``shape``, as a uint8 array [rows, row_bytes]."""
    t = quants.ggml_type(name)
    n_rows, n_cols = int(np.prod(shape[:-1])), shape[-1]
    if name in GGUF_PY_QUANTIZES:
        # Weights over many magnitudes, plus an all-zero row (scale 0 paths).
        x = (rng.standard_normal((n_rows, n_cols)) * 10.0 ** rng.integers(-4, 3, (n_rows, 1))).astype(np.float32)
        x[0] = 0
        if name == "F32":
            return x.view(np.uint8)
        if name == "F16":
            return x.astype(np.float16).view(np.uint8)
        return gguf.quants.quantize(x, QT[name])
    raw = rng.integers(0, 256, (n_rows * n_cols // t.block_size, t.type_size), dtype=np.uint8)
    scales = (rng.standard_normal((raw.shape[0], 1)) * 10.0 ** rng.integers(-5, 1, (raw.shape[0], 1)))
    for off in F16_SCALE_OFFSETS[name]:
        raw[:, off:off + 2] = scales.astype(np.float16).view(np.uint8)
        scales = -scales[::-1]  # a different (but finite) value for the min field
    return raw.reshape(n_rows, -1)


def oracle(raw: np.ndarray, name: str, shape: tuple) -> np.ndarray:
    return gguf.quants.dequantize(raw, QT[name]).reshape(shape).astype(np.float32, copy=False)


@pytest.mark.parametrize("name", SUPPORTED)
@pytest.mark.parametrize("shape", [(7, 512), (3, 2, 256), (1024,)])
def test_random_blocks_match_gguf_py(name, shape):
    rng = np.random.default_rng(zlib.crc32(f"{name}{shape}".encode()))
    raw = random_raw(name, shape, rng)
    want = oracle(raw, name, shape)
    assert np.isfinite(want).all()
    assert_bit_exact(quants.dequantize(raw, QT[name], shape), want, f"{name} kernel")
    assert_bit_exact(quants.dequantize_reference(raw, QT[name], shape), want, f"{name} reference")


@pytest.mark.parametrize("name", SUPPORTED)
def test_kernel_matches_reference_and_threads_agree(name):
    # Big enough for many chunks, so prange really splits the work.
    rng = np.random.default_rng(7)
    shape = (64, 4096)
    raw = random_raw(name, shape, rng)
    ref = quants.dequantize_reference(raw, name, shape)
    for n_threads in (None, 1, 2):
        assert_bit_exact(quants.dequantize(raw, name, shape, n_threads=n_threads), ref, f"{name} threads={n_threads}")


def test_f16_bf16_special_values():
    # Every half-precision bit pattern: zeros, subnormals, normals, infinities, NaNs.
    everything = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    raw = everything.view(np.uint8)
    ours = quants.dequantize(raw, "F16", (65536,))
    want = everything.view(np.float16).astype(np.float32)
    finite = np.isfinite(want)
    assert_bit_exact(ours[finite], want[finite], "F16 finite")
    assert np.array_equal(np.isinf(ours), np.isinf(want)) and np.array_equal(np.isnan(ours), np.isnan(want))
    assert np.array_equal(np.signbit(ours), np.signbit(want))
    # BF16 is the top half of a float32: exact for every pattern, NaN payloads included.
    assert_bit_exact(quants.dequantize(raw, "BF16", (65536,)), oracle(raw, "BF16", (65536,)), "BF16 all patterns")


def test_mxfp4_every_scale_exponent():
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 256, (256, 17), dtype=np.uint8)
    raw[:, 0] = np.arange(256)  # E8M0 exponents 0..255 (0 and 1 land in the subnormals)
    with np.errstate(over="ignore"):
        want = oracle(raw, "MXFP4", (256, 32))
        ref = quants.dequantize_reference(raw, "MXFP4", (256, 32))
    assert_bit_exact(quants.dequantize(raw, "MXFP4", (256, 32)), want, "MXFP4 kernel")
    assert_bit_exact(ref, want, "MXFP4 reference")


def test_type_table_matches_gguf_py():
    for tid, t in quants.GGML_TYPES.items():
        assert QT(tid).name == t.name
        assert gguf.GGML_QUANT_SIZES[QT(tid)] == (t.block_size, t.type_size), t.name
    assert set(SUPPORTED) == {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
                              "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4"}
    from ster_py._kernels import quants as kernels
    assert set(kernels.supported_type_ids()) == {quants.GGML_TYPE_IDS[n] for n in SUPPORTED}
    for name in SUPPORTED:  # the kernel's own geometry table agrees with the Python one
        t = quants.ggml_type(name)
        assert kernels.block_geometry(t.id) == (t.block_size, t.type_size)


@pytest.mark.parametrize("name", SUPPORTED)
def test_row_bytes_matches_gguf_py(name):
    t = quants.ggml_type(name)
    n_cols = 4 * t.block_size
    assert quants.row_bytes(name, n_cols) == gguf.quants.quant_shape_to_byte_shape((n_cols,), QT[name])[0]
    if t.block_size > 1:
        with pytest.raises(SterError, match="whole number"):
            quants.row_bytes(name, n_cols + 1)


@pytest.mark.parametrize("name", ["IQ2_XXS", "IQ3_S", "IQ1_M", "TQ1_0", "TQ2_0", "Q8_K", "I32", "F64", "NVFP4"])
def test_unsupported_types_are_refused(name):
    t = quants.ggml_type(name)
    raw = np.zeros(t.type_size * 2, np.uint8)
    with pytest.raises(SterError, match=name):
        quants.dequantize(raw, name, (2 * t.block_size,))
    with pytest.raises(SterError, match=name):
        quants.dequantize_reference(raw, name, (2 * t.block_size,))


def test_bad_arguments():
    with pytest.raises(SterError, match="unknown GGML type id 99"):
        quants.dequantize(np.zeros(4, np.uint8), 99, (1,))
    with pytest.raises(SterError, match="needs 68 bytes, got 67"):
        quants.dequantize(np.zeros(67, np.uint8), "Q8_0", (2, 32))
    with pytest.raises(SterError, match="whole number"):
        quants.dequantize(np.zeros(34, np.uint8), "Q8_0", (1, 33))
    with pytest.raises(SterError, match="uint8"):
        quants.dequantize(np.zeros(34, np.int8), "Q8_0", (32,))
    assert quants.dequantize(np.zeros(0, np.uint8), "Q4_K", (0, 256)).shape == (0, 256)


# -- the real files: every tensor, against gguf-py and against the reference ------------------

def _check_file(path):
    f = GGUFFile(path)
    rows_per_chunk = 4096
    for name in f.tensor_names():
        t = f.tensor(name)
        rows = t.raw_rows
        flat_shape = (rows.shape[0], t.shape[-1])
        for start in range(0, rows.shape[0], rows_per_chunk):
            chunk = rows[start:start + rows_per_chunk]
            shape = (chunk.shape[0], t.shape[-1])
            want = oracle(chunk, t.type_name, shape)
            assert_bit_exact(quants.dequantize(chunk, t.ggml_type, shape), want, f"{name} rows {start}+")
            assert_bit_exact(quants.dequantize_reference(chunk, t.ggml_type, shape), want, f"{name} reference")
        if rows.shape[0] <= rows_per_chunk:  # the tensor-level API on the whole thing, in its own shape
            assert_bit_exact(t.dequantize(), oracle(rows, t.type_name, flat_shape).reshape(t.shape), name)
    return f


@pytest.mark.real
def test_every_tensor_of_smollm2(smollm2_gguf):
    f = _check_file(smollm2_gguf)
    assert {t.type_name for t in f.tensors.values()} == {"Q4_1", "Q8_0", "F32"}


@pytest.mark.real
def test_every_tensor_of_gemma3(gemma3_gguf):
    f = _check_file(gemma3_gguf)
    assert {t.type_name for t in f.tensors.values()} == {"Q5_0", "Q4_K", "Q6_K", "Q8_0", "F32"}
