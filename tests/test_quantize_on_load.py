"""Quantize on load (``--quantize``) and the block quantizers it runs.

- The quantizers (``ster_py.gguf.quantize``: Q8_0, Q4_0, Q5_0, Q4_K) against llama.cpp's
  own (``ggml_quantize_chunk`` of the pinned llama-cpp-python's libggml-base, run in a
  child process; gguf-py's for Q4_0 and Q5_0, whose ties llama.cpp's C code rounds otherwise):
  the numpy references give the same bytes on random matrices with the
  cases their branches meet (blocks of zeros and signed zeros, ties, constant and one-signed
  blocks, tiny and huge scales), and the Cython kernels give the references' bytes on 1 and
  2 threads, at every SIMD level (the AVX2 Q4_K search and the portable one).
- A tiny Llama checkpoint quantized on load holds, matrix for matrix, the blocks llama.cpp
  writes into its Q8_0 / Q4_0 / Q4_K_S files of the same weights (converted by llama.cpp's
  own converter, quantized by its own quantizer), wherever both chose the same type; and its
  logit error against Transformers' float32 forward pass is no larger than that of
  llama.cpp running its own file.
- ``ster parity --quantize`` reports the error; refusals: a GGUF, an unknown kind, a matrix
  with inf/NaN.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from ster_py._kernels import qmatmul
from ster_py.errors import SterError
from ster_py.gguf import quantize as Q
from ster_py.gguf import quants

from tiny import build_checkpoint, one_torch_thread, reference_logits, rel_err  # noqa: F401  (autouse fixture)

ORACLE = r'''
import ctypes, os, sys
import numpy as np
import llama_cpp
lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
f = lib.ggml_quantize_chunk
f.restype = ctypes.c_size_t
f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
              ctypes.c_void_p]
data = dict(np.load(sys.argv[1]))
out = {}
for key, x in data.items():
    type_id, row_bytes = (int(v) for v in key.split("_")[1:3])
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.zeros((x.shape[0], row_bytes), np.uint8)
    n = f(type_id, x.ctypes.data, y.ctypes.data, 0, x.shape[0], x.shape[1], None)
    assert n == y.size, (key, n, y.size)
    out[key] = y
np.savez(sys.argv[2], **out)
'''


def llama_cpp_blocks(tmp_path, cases: dict) -> dict:
    """name -> (type name, float32 [rows, K]) -> llama.cpp's blocks (ggml_quantize_chunk), in a child."""
    arrays = {}
    for name, (type_name, x) in cases.items():
        t = quants.ggml_type(type_name)
        arrays[f"{name}_{t.id}_{x.shape[1] // t.block_size * t.type_size}"] = x
    np.savez(tmp_path / "in.npz", **arrays)
    (tmp_path / "oracle.py").write_text(ORACLE)
    r = subprocess.run([sys.executable, str(tmp_path / "oracle.py"), str(tmp_path / "in.npz"),
                        str(tmp_path / "out.npz")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = np.load(tmp_path / "out.npz")
    return {k.split("_")[0]: got[k] for k in got.files}


def hard_matrix(rng, rows: int, cols: int) -> np.ndarray:
    """Random rows at spread scales plus the cases the quantizers branch on."""
    x = (rng.standard_normal((rows, cols)) * 10.0 ** rng.uniform(-6, 3, (rows, 1))).astype(np.float32)
    x[0] = 0.0                                    # blocks of zeros
    x[1] = -0.0                                   # of negative zeros
    x[2, :cols // 2] = 0.0
    x[3] = np.round(x[3] * 4) / 4                 # ties between magnitudes and in rounding
    x[4] = np.abs(x[4])                           # one-signed blocks (the min clamps at 0)
    x[5] = -np.abs(x[5])
    x[6] = 0.7                                    # constant blocks
    x[7] = np.tile(np.array([1.0, -1.0], np.float32), cols // 2)   # equal magnitudes, both signs
    x[8] = (rng.standard_normal(cols) * 1e-30).astype(np.float32)  # f16 scales underflow
    x[9] = (rng.standard_normal(cols) * 3e4).astype(np.float32)    # large scales
    x[10] = rng.integers(-8, 8, cols).astype(np.float32)           # already on the grid
    return x


#: The instruction-set levels this CPU runs (the Q4_K search has a portable and an AVX2 form).
LEVELS = qmatmul.SIMD_LEVELS[:qmatmul.SIMD_LEVELS.index(qmatmul.cpu_simd_level()) + 1]
#: The block types --quantize makes (with Q4_K's fallback Q5_0).
ON_LOAD_TYPES = ("Q8_0", "Q4_0", "Q5_0", "Q4_K")


def test_quantizers_equal_llama_cpp(tmp_path):
    rng = np.random.default_rng(21)
    cases = {f"{t.replace('_', '')}x{n}": (t, hard_matrix(rng, 48, 512)) for t in ON_LOAD_TYPES for n in range(2)}
    want = llama_cpp_blocks(tmp_path, cases)
    import gguf.quants

    for name, (type_name, x) in cases.items():
        ref = Q.quantize_reference(x, type_name)
        assert ref.shape == want[name].shape, name
        if type_name in ("Q4_0", "Q5_0"):
            # gguf-py's legacy quantizers (what llama.cpp's converter writes with) and llama.cpp's C ones
            # round some of the crafted ties differently (16-24 bytes of these matrices); ster follows
            # gguf-py, the oracle issue 20 names for the legacy types, and equals llama.cpp's C elsewhere.
            oracle = gguf.quants.quantize(x, getattr(gguf.GGMLQuantizationType, type_name)).reshape(ref.shape)
            assert int((oracle != want[name]).sum()) <= 32, name
        else:
            oracle = want[name]
        bad = np.argwhere(ref != oracle)
        assert bad.size == 0, f"{name}: {len(bad)} bytes differ from the oracle's, first at row/byte {bad[0]}"
        for level in LEVELS:
            qmatmul.set_simd_level(level)
            for threads in (1, 2):
                np.testing.assert_array_equal(Q.quantize(x, type_name, n_threads=threads), ref,
                                              err_msg=f"{name} {level} {threads} threads")
    qmatmul.set_simd(True)


def test_quantized_blocks_dequantize_close():
    """What the blocks hold (decoded by gguf-py) is within each type's step of the input."""
    import gguf

    rng = np.random.default_rng(4)
    x = rng.standard_normal((16, 512)).astype(np.float32)
    for type_name, tol in (("Q8_0", 0.01), ("Q5_0", 0.05), ("Q4_0", 0.1), ("Q4_K", 0.1)):
        blocks = Q.quantize(x, type_name)
        back = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[type_name]).reshape(x.shape)
        assert rel_err(back, x) < tol, type_name


def test_quantize_refuses_what_it_cannot_take():
    from ster_py.decoder.qlinear import block_type_for, quantize_matrix

    with pytest.raises(SterError, match="layer 0 q holds inf or NaN"):
        quantize_matrix(np.array([[np.nan] * 32], np.float32), "Q8_0", "layer 0 q")
    with pytest.raises(SterError):   # rows of 64 are not whole 256-weight blocks
        Q.quantize(np.ones((2, 64), np.float32), "Q4_K")
    with pytest.raises(SterError, match="no quantizer|cannot write"):
        Q.quantize(np.ones((2, 256), np.float32), "IQ2_XXS")
    assert Q.fallback_type("Q4_K", 576) == "Q5_0" and Q.fallback_type("Q8_0", 40) == "F16"
    assert block_type_for("q4_k", 512) == "Q4_K" and block_type_for("q4_k", 576) == "Q5_0"
    assert block_type_for("q8_0", 40) is None


# ---------------------------------------------------------------------------- on load, against llama.cpp

# Rows of 256 (hidden) and 512 (feed-forward) inputs: Q4_K fits every matrix.
LLAMA = dict(vocab_size=128, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, max_position_embeddings=256, rms_norm_eps=1e-5,
             tie_word_embeddings=False)
PROMPT = [1, 17, 40, 99, 5, 63, 121, 8, 30, 77, 2, 90]
# --quantize kind -> llama.cpp's file type of the same blocks
FILE_TYPES = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_k": "Q4_K_S"}
ROLES = {"attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o", "ffn_gate": "gate", "ffn_up": "up",
         "ffn_down": "down"}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from llamacpp_convert import convert_cases

    root = tmp_path_factory.mktemp("quantize")
    out = convert_cases(root, {"llama": ("llama", LLAMA, {})}, build_checkpoint)
    path, model = out["llama"]
    return root / "hf" / "llama", path, model


@pytest.mark.parametrize("kind", list(FILE_TYPES))
def test_quantize_on_load_equals_llama_cpp_files(kind, converted, tmp_path):
    from ster_py import llamacpp
    from ster_py.decoder.qlinear import QuantTensor
    from ster_py.gguf.reader import GGUFFile
    from ster_py.load import load_model
    from ster_py.parity import transformers_reference  # noqa: F401  (the reference is the model itself here)
    from ster_py.weights import unpermute_qk

    hf, f32_gguf, model = converted
    qfile = llamacpp.quantize(f32_gguf, tmp_path / f"{kind}.gguf", FILE_TYPES[kind])
    ours = load_model(str(hf), quantize=kind)
    assert ours.quantize == kind
    compared = 0
    with GGUFFile(qfile) as g:
        for i in range(LLAMA["num_hidden_layers"]):
            for gname, role in ROLES.items():
                t = g.tensors[f"blk.{i}.{gname}.weight"]
                mine = getattr(ours.decoder.layers[i], role).weight
                assert isinstance(mine, QuantTensor), (i, role)
                if t.type_name != mine.type_name:
                    continue   # llama.cpp's mix chose another type for this one (Q4_K_S: some Q5_K)
                theirs = QuantTensor(t)
                if role in ("q", "k"):   # llama.cpp reorders q/k rows; blocks stay within rows
                    theirs = unpermute_qk(theirs, LLAMA["num_attention_heads"] if role == "q"
                                          else LLAMA["num_key_value_heads"])
                np.testing.assert_array_equal(mine._raw, theirs._raw[theirs._order] if theirs._order is not None
                                              else theirs._raw, err_msg=f"layer {i} {role} {t.type_name}")
                compared += 1
        assert compared >= 8, compared
    # logit error against float32: ours no larger than llama.cpp's on its own file
    ref, _ = reference_logits(model, PROMPT)
    mine_err = rel_err(ours.decoder.forward(PROMPT), ref)
    theirs_err = rel_err(llamacpp.logits(qfile, [PROMPT])[0], ref)
    assert 0 < mine_err <= theirs_err, (kind, mine_err, theirs_err)


def test_parity_reports_quantized_error(converted):
    hf, f32_gguf, _ = converted
    r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", "parity", "--model", str(hf),
                        "--prompt", "w5 w6 w7 w8 w9", "--quantize", "q8_0", "--tolerance", "0.05", "--json",
                        "--threads", "2"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["quantize"] == "q8_0" and doc["precision"] == "f32" and doc["passed"]
    assert 0 < doc["prompts"][0]["rel_error"] < 0.05
    # without --tolerance, a quantized model is judged against its type's default (not float32's 1e-4)
    r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", "parity", "--model", str(hf),
                        "--prompt", "w5 w6 w7 w8 w9", "--quantize", "q8_0", "--json", "--threads", "2", "-q"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["tolerance"] == 0.1 and doc["passed"]
    r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", "generate", "--model",
                        str(f32_gguf), "--prompt", "hi", "--quantize", "q4_k"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1 and r.stderr.startswith("error: --quantize applies to safetensors") \
        and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", "generate", "--model",
                        str(hf), "--prompt", "hi", "--quantize", "q3_k"], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "q8_0|q4_0|q4_k" in r.stderr.replace("'", "").replace(", ", "|")
