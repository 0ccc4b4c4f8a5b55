"""The GGUF writer against gguf-py's reader (the oracle for GGUF bytes) and ster's own reader."""
from __future__ import annotations

import numpy as np
import pytest

from ster_py.errors import SterError
from ster_py.gguf.quantize import quantize
from ster_py.gguf.writer import TensorEntry, Typed, write_gguf

META = {
    "general.architecture": "llama",
    "general.name": "tiny ünïcode",
    "llama.block_count": 3,
    "llama.rope.freq_base": 10000.5,
    "llama.attention.layer_norm_rms_epsilon": 1e-5,
    "some.flag": True,
    "some.negative": -7,
    "some.big": 2**40,
    "some.u8": Typed("uint8", 200),
    "some.f64": Typed("float64", 1.0 / 3.0),
    "tokenizer.ggml.tokens": ["a", "b", "ü", ""],
    "tokenizer.ggml.token_type": Typed("array of int32", np.array([1, 3, 4, 6], np.int32)),
    "tokenizer.ggml.scores": [0.0, -1.5, 2.25, -3.0],
    "pattern": [True, False, True],
    "ids": Typed("array of uint32", [1, 2, 3]),
}
GGUF_PY_TYPES = {"llama.block_count": "UINT32", "llama.rope.freq_base": "FLOAT32", "some.flag": "BOOL",
                 "some.negative": "INT32", "some.big": "UINT64", "some.u8": "UINT8", "some.f64": "FLOAT64",
                 "general.name": "STRING"}


def _entries(rng):
    arrays = {"token_embd.weight": (rng.standard_normal((5, 64)).astype(np.float32), "F16"),
              "blk.0.attn_q.weight": (rng.standard_normal((64, 64)).astype(np.float32), "Q8_0"),
              "blk.0.ffn_down.weight": (rng.standard_normal((64, 256)).astype(np.float32), "Q4_K"),
              "output_norm.weight": (rng.standard_normal(64).astype(np.float32), "F32"),
              "odd.weight": (rng.standard_normal((3, 7)).astype(np.float32), "F32")}
    return arrays, [TensorEntry(n, a.shape, t, lambda a=a, t=t: quantize(a, t)) for n, (a, t) in arrays.items()]


@pytest.mark.parametrize("alignment", [32, 64])
def test_gguf_py_reads_what_we_write(alignment, tmp_path):
    from gguf import GGUFReader

    from ster_py.gguf.reader import GGUFFile

    arrays, entries = _entries(np.random.default_rng(0))
    path = write_gguf(tmp_path / "t.gguf", META, entries, alignment=alignment)
    r = GGUFReader(path)
    assert r.alignment == alignment
    fields = {f.name: f for f in r.fields.values()}
    for key, value in META.items():
        got = fields[key].contents()
        want = value.value if isinstance(value, Typed) else value
        if isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-7)
        elif isinstance(want, np.ndarray) or (isinstance(want, list) and want and isinstance(want[0], float)):
            assert np.allclose(got, want)
        else:
            assert got == (list(want) if isinstance(want, (list, np.ndarray)) else want), key
    for key, t in GGUF_PY_TYPES.items():
        assert fields[key].types[0].name == t, key
    assert fields["tokenizer.ggml.token_type"].types[-1].name == "INT32"
    assert ("general.alignment" in fields) == (alignment != 32)
    ours = GGUFFile(path)
    for t in r.tensors:
        a, ty = arrays[t.name]
        assert t.tensor_type.name == ty and tuple(int(d) for d in reversed(t.shape)) == a.shape
        assert t.data_offset % alignment == 0
        assert np.array_equal(np.asarray(t.data).reshape(-1).view(np.uint8), quantize(a, ty).reshape(-1))
        assert np.array_equal(ours.tensor(t.name).raw, quantize(a, ty).reshape(-1))
    assert ours.metadata_types["some.negative"] == "int32" and ours.metadata["some.big"] == 2**40


def test_a_failed_write_leaves_nothing(tmp_path):
    def boom():
        raise SterError("the quantizer failed")

    target = tmp_path / "out.gguf"
    target.write_bytes(b"old")
    with pytest.raises(SterError, match="quantizer failed"):
        write_gguf(target, META, [TensorEntry("a.weight", (4,), "F32", boom)])
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.gguf"]


@pytest.mark.parametrize("entries, alignment, match", [
    ([TensorEntry("a", (4,), "F32", lambda: np.zeros(4, np.float32))] * 2, 32, "written twice"),
    ([TensorEntry("x" * 64, (4,), "F32", lambda: np.zeros(4, np.float32))], 32, "63 bytes"),
    ([TensorEntry("a", (2, 48), "Q4_0", lambda: np.zeros(4, np.uint8))], 32, "whole number"),
    ([TensorEntry("a", (4,), "F32", lambda: np.zeros(3, np.float32))], 32, "produced 12 bytes"),
    ([], 48, "power of two"),
])
def test_refusals(entries, alignment, match, tmp_path):
    with pytest.raises(SterError, match=match):
        write_gguf(tmp_path / "x.gguf", {"general.architecture": "llama"}, entries, alignment=alignment)
    assert not (tmp_path / "x.gguf").exists()


def test_values_that_do_not_fit_are_refused(tmp_path):
    for value in (Typed("uint8", 300), Typed("array of uint16", [-1]), object()):
        with pytest.raises(SterError):
            write_gguf(tmp_path / "x.gguf", {"k": value}, [])


@pytest.mark.parametrize("value", ["x\ud800", ["a", "\udcff"]])
def test_text_utf8_cannot_encode_is_refused_naming_the_key(value, tmp_path):
    """A lone surrogate (a JSON "\\ud800" escape in a model's files) was a UnicodeEncodeError traceback."""
    with pytest.raises(SterError, match="GGUF metadata k cannot be written: its text holds the lone surrogate U\\+D"):
        write_gguf(tmp_path / "x.gguf", {"general.architecture": "llama", "k": value}, [])
    assert list(tmp_path.iterdir()) == []
