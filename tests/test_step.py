"""The fused decode step (ster_py/decoder/step.py, ``ops.LayerStep``) against the Python block.

The step runs the kernels of ``_Layer.__call__`` in the same order with the same float32
arithmetic, so on one token its logits and the keys/values it stores must equal the
Python block's bit for bit. The Python block is the one the parity suites check against
transformers; the real-model tests (test_real_models.py, test_qmatmul.py) decode through
the step and compare greedy tokens with transformers. Tiny random checkpoints of the
families whose block features differ (biases, q/k norms per head, over the projection and
after RoPE, sandwich and post-only norms, sliding windows, soft-caps, sinks, float16
cache) get their projections quantized to Q8_0 by gguf-py, so that every block qualifies.
"""
import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from ster_py._kernels import ops
from ster_py.decoder.qlinear import QuantLinear, QuantTensor
from ster_py.decoder.step import layer_step
from ster_py.gguf import quants
from ster_py.load import load_model
from tiny import make_checkpoint, one_torch_thread  # noqa: F401  (autouse fixture)

ROLES = ("q", "k", "v", "o", "gate", "up", "down")
PROMPT = [5, 17, 33, 2, 90, 41, 7]
DECODED = [12, 99, 3, 64, 27, 8, 110, 45, 19]   # longer than the windows below


class _Tensor:
    """The GGUFTensor attributes QuantTensor reads, over gguf-py's Q8_0 blocks of a matrix."""

    def __init__(self, w: np.ndarray, name: str):
        t = quants.ggml_type("Q8_0")
        self.raw_rows = gguf.quants.quantize(w.astype(np.float32), QT.Q8_0)
        self.name, self.ggml_type, self.type_name, self.shape = name, t.id, t.name, w.shape
        self.row_bytes, self.raw = self.raw_rows.shape[1], self.raw_rows.reshape(-1)

    def dequantize(self):
        return quants.dequantize(self.raw, self.ggml_type, self.shape)


def _quantize(decoder) -> None:
    for layer in decoder.layers:
        for role in ROLES:
            p = getattr(layer, role)
            if p is None:   # no gate (a plain feed-forward)
                continue
            w = np.asarray(p.weight, dtype=np.float32)
            setattr(layer, role, QuantLinear(QuantTensor(_Tensor(w, f"{role}.{layer.i}")), p.bias))


def _run(decoder, fuse: bool, kv_dtype):
    decoder.fuse_decode = fuse
    cache = decoder.new_cache(kv_dtype)
    logits = [decoder.forward(np.array(PROMPT), cache)]
    logits += [decoder.forward(np.array([t]), cache) for t in DECODED]
    n = cache.length
    return np.concatenate(logits), [(k[:, :n].copy(), v[:, :n].copy()) for k, v in zip(cache._k, cache._v)]


def _compare(decoder, kv_dtype=np.float32):
    assert all(layer.decode_step() is not None for layer in decoder.layers)
    want, want_kv = _run(decoder, False, kv_dtype)
    got, got_kv = _run(decoder, True, kv_dtype)
    assert np.isfinite(want).all()
    np.testing.assert_array_equal(got, want)
    for (gk, gv), (wk, wv) in zip(got_kv, want_kv):
        np.testing.assert_array_equal(gk, wk)
        np.testing.assert_array_equal(gv, wv)


FAMILIES = {
    "llama": {},
    "qwen2": {},                                              # q/k/v biases
    "qwen3": {},                                              # q/k RMSNorm per head
    "olmo2": {},                                              # q/k norm over the projection, post-norms only
    "hunyuan_v1_dense": {},                                   # q/k norm after RoPE
    "gemma2": dict(sliding_window=4, attn_logit_softcapping=20.0, final_logit_softcapping=30.0),
    "gemma3_text": dict(sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
}


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_fused_step_equals_python_block(tmp_path, model_type):
    make_checkpoint(tmp_path / model_type, model_type, **FAMILIES[model_type])
    decoder = load_model(str(tmp_path / model_type)).decoder
    _quantize(decoder)
    _compare(decoder)


@pytest.mark.parametrize("simd", [True, False])
def test_fused_step_float16_cache(tmp_path, simd):
    ops.set_simd(simd)
    try:
        make_checkpoint(tmp_path / "g", "gemma3_text", sliding_window=4)
        decoder = load_model(str(tmp_path / "g")).decoder
        _quantize(decoder)
        _compare(decoder, np.float16)
    finally:
        ops.set_simd(True)


def test_fused_step_with_sinks_and_residual_scale(tmp_path):
    make_checkpoint(tmp_path / "l", "llama")
    decoder = load_model(str(tmp_path / "l")).decoder
    _quantize(decoder)
    rng = np.random.default_rng(3)
    for layer in decoder.layers:   # the Python block reads its own _residual_scale; so must the step
        layer.sinks = rng.standard_normal(decoder.spec.num_attention_heads).astype(np.float32)
        layer._residual_scale = np.float32(0.75)
    _compare(decoder)


def test_blocks_that_do_not_qualify_keep_the_python_path(tmp_path):
    make_checkpoint(tmp_path / "l", "llama")
    decoder = load_model(str(tmp_path / "l")).decoder
    assert all(layer.decode_step() is None for layer in decoder.layers)   # dense projections
    _quantize(decoder)
    assert all(layer.decode_step() is not None for layer in decoder.layers)
    # replacing a projection (as an adapter does) drops that block's step
    layer = decoder.layers[1]
    layer.o = lambda x, inner=layer.o: inner(x) * np.float32(1.5)
    assert layer.decode_step() is None and decoder.layers[0].decode_step() is not None
    want, _ = _run(decoder, False, np.float32)
    got, _ = _run(decoder, True, np.float32)
    np.testing.assert_array_equal(got, want)


def test_changed_sinks_and_hooks_of_any_dtype_keep_the_paths_equal(tmp_path):
    make_checkpoint(tmp_path / "l", "llama")
    decoder = load_model(str(tmp_path / "l")).decoder
    _quantize(decoder)
    _run(decoder, True, np.float32)                  # steps built
    for layer in decoder.layers:                     # a new array: the step is rebuilt with it
        layer.sinks = np.full(decoder.spec.num_attention_heads, 2.0, np.float32)
    _compare(decoder)
    shift = np.linspace(-1, 1, decoder.spec.hidden_size)
    for hook in (lambda i, h: h.astype(np.float64) + shift, lambda i, h: (h + np.float16(0.5)).astype(np.float16),
                 lambda i, h: (h * 1.5).tolist()):
        out = []
        for fuse in (False, True):
            decoder.fuse_decode = fuse
            cache = decoder.new_cache()
            steps = [decoder.forward(np.array(PROMPT), cache, layer_hook=hook)]
            steps += [decoder.forward(np.array([t]), cache, layer_hook=hook) for t in DECODED[:3]]
            out.append(np.concatenate(steps))
        np.testing.assert_array_equal(out[1], out[0])


def test_step_is_initialised_once_and_takes_integer_positions(tmp_path):
    make_checkpoint(tmp_path / "l", "llama")
    decoder = load_model(str(tmp_path / "l")).decoder
    _quantize(decoder)
    s = decoder.spec
    mats = tuple(getattr(decoder.layers[0], r)._m for r in ROLES)
    kw = dict(num_heads=s.num_attention_heads, num_kv_heads=s.num_key_value_heads, head_dim=s.head_dim, eps=1e-6,
              qk_norm=0, qk_norm_after_rope=False, rotary_dim=0, interleaved=False, scale=1.0, window=0,
              softcap=0.0, sinks=None, act=0, residual_scale=1.0)
    step = ops.LayerStep(mats, (None,) * 7, {"attn_norm": np.ones(s.hidden_size, np.float32)}, **kw)
    with pytest.raises(TypeError, match="once"):   # re-initialising would leave pointers to freed arrays
        step.__init__(mats, (None,) * 7, {"attn_norm": np.ones(s.hidden_size + 1, np.float32)}, **kw)
    h = np.ones((1, s.hidden_size), np.float32)
    k = np.zeros((s.num_key_value_heads, 4, s.head_dim), np.float32)
    with pytest.raises(TypeError):
        step(h, k, k.copy(), 1.9, None, None)
    with pytest.raises(TypeError, match="not initialised"):
        ops.LayerStep.__new__(ops.LayerStep)(h, k, k.copy(), 0, None, None)
    broken = ops.LayerStep.__new__(ops.LayerStep)
    with pytest.raises(ValueError):
        broken.__init__(mats, (None,) * 7, {"attn_norm": np.ones(3, np.float32)}, **kw)
    with pytest.raises(TypeError, match="not initialised"):
        broken(h, k, k.copy(), 0, None, None)
    with pytest.raises(TypeError):
        ops.float_to_half(None, None)


def test_parallel_layer_norm_family_does_not_qualify(tmp_path):
    make_checkpoint(tmp_path / "p", "phi", partial_rotary_factor=0.5)
    decoder = load_model(str(tmp_path / "p")).decoder
    _quantize(decoder)
    assert all(layer_step(layer) is None for layer in decoder.layers)


def test_step_refuses_inputs_that_do_not_fit(tmp_path):
    make_checkpoint(tmp_path / "l", "llama")
    decoder = load_model(str(tmp_path / "l")).decoder
    _quantize(decoder)
    step = decoder.layers[0].decode_step()
    s = decoder.spec
    h = np.zeros((1, s.hidden_size), np.float32)
    k = np.zeros((s.num_key_value_heads, 4, s.head_dim), np.float32)
    cos = sin = np.ones(s.head_dim // 2, np.float32)
    for bad in (lambda: step(h[:, :-1], k, k.copy(), 0, cos, sin),          # wrong width
                lambda: step(h.astype(np.float64), k, k.copy(), 0, cos, sin),
                lambda: step(h, k, k.copy(), 4, cos, sin),                     # position past capacity
                lambda: step(h, k, k.copy(), -1, cos, sin),
                lambda: step(h, k, k.astype(np.float16), 0, cos, sin),         # mixed cache dtypes
                lambda: step(h, k[:1], k[:1].copy(), 0, cos, sin),             # wrong head count
                lambda: step(h, k, k.copy(), 0, cos[:-1], sin)):               # short rope table
        with pytest.raises(ValueError):
            bad()
    mats = tuple(getattr(decoder.layers[0], r)._m for r in ROLES)
    with pytest.raises(ValueError, match="seven"):
        ops.LayerStep(mats[:6], (None,) * 6, {}, num_heads=s.num_attention_heads, num_kv_heads=s.num_key_value_heads,
                      head_dim=s.head_dim, eps=1e-6, qk_norm=0, qk_norm_after_rope=False, rotary_dim=0,
                      interleaved=False, scale=1.0, window=0, softcap=0.0, sinks=None, act=0, residual_scale=1.0)
    with pytest.raises(ValueError, match="q is"):
        ops.LayerStep(mats, (None,) * 7, {}, num_heads=s.num_attention_heads * 2,
                      num_kv_heads=s.num_key_value_heads, head_dim=s.head_dim, eps=1e-6, qk_norm=0,
                      qk_norm_after_rope=False, rotary_dim=0, interleaved=False, scale=1.0, window=0, softcap=0.0,
                      sinks=None, act=0, residual_scale=1.0)


def _half_cases() -> np.ndarray:
    rng = np.random.default_rng(0)
    bits = np.concatenate([
        rng.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32),
        np.arange(0x33000000, 0x38900000, 997, dtype=np.uint32),     # float16 subnormals and the normal edge
        np.arange(0x477FD000, 0x47801000, 7, dtype=np.uint32),       # around the largest float16 and overflow
        np.array([0, 0x7F800000, 0x7FC00000, 0x7F800001, 0x477FF000, 0x477FEFFF, 0x33000000, 0x33000001],
                 dtype=np.uint32)])
    return np.concatenate([bits, bits | 0x80000000]).view(np.float32)


@pytest.mark.parametrize("simd", [True, False])
def test_float_to_half_rounds_as_numpy(simd):
    x = _half_cases()
    out = np.empty(x.shape, np.uint16)
    ops.float_to_half(x, out, simd)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    nan = np.isnan(x)
    np.testing.assert_array_equal(out[~nan], want[~nan].view(np.uint16))
    assert np.isnan(out[nan].view(np.float16)).all()


# ----------------------------------------------------------------------------- routed blocks (MoE decode)

MOE_FAMILIES = {
    # plain top-k over SiLU experts, one dense layer among routed ones
    "qwen3_moe": dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                      mlp_only_layers=[1]),
    # shared experts gated by a sigmoid: the routed experts in the kernel, the rest in Python
    "qwen2_moe": dict(num_experts=5, num_experts_per_tok=3, moe_intermediate_size=32,
                      shared_expert_intermediate_size=64),
}


def _quantize_moe(decoder) -> None:
    """Every projection Q8_0: attention and dense feed-forwards as ``_quantize`` does, and each
    routed expert's (and the shared experts') gate/up/down."""
    from ster_py.decoder.moe import MoE

    for layer in decoder.layers:
        roles = ROLES[:4] if isinstance(layer.ffn, MoE) else ROLES
        for role in roles:
            p = getattr(layer, role)
            w = np.asarray(p.weight, dtype=np.float32)
            setattr(layer, role, QuantLinear(QuantTensor(_Tensor(w, f"{role}.{layer.i}")), p.bias))
        if isinstance(layer.ffn, MoE):
            for j, f in enumerate(layer.ffn.experts + ([layer.ffn.shared] if layer.ffn.shared else [])):
                for role in ("gate", "up", "down"):
                    p = getattr(f, role)
                    w = np.asarray(p.weight, dtype=np.float32)
                    setattr(f, role, QuantLinear(QuantTensor(_Tensor(w, f"{role}.{layer.i}.{j}")), p.bias))
            layer.ffn.experts = list(layer.ffn.experts)   # drops the kernel's view of the old experts


@pytest.mark.parametrize("model_type", sorted(MOE_FAMILIES))
def test_fused_step_of_routed_blocks_equals_python_block(tmp_path, model_type):
    from ster_py.decoder.moe import MoE

    make_checkpoint(tmp_path / model_type, model_type, **MOE_FAMILIES[model_type])
    decoder = load_model(str(tmp_path / model_type)).decoder
    _quantize_moe(decoder)
    routed = [layer for layer in decoder.layers if isinstance(layer.ffn, MoE)]
    assert all(layer.decode_step() is not None for layer in decoder.layers)
    for layer in routed:   # the Python loops over experts (prompt and decode)
        layer.ffn._fused = False
    want, want_kv = _run(decoder, False, np.float32)
    for layer in routed:   # the experts' kernels: grouped prompt, one call per decoded token
        layer.ffn._fused = None
    assert routed and all(layer.ffn._fused_experts() for layer in routed)
    got, got_kv = _run(decoder, True, np.float32)
    assert np.isfinite(want).all()
    np.testing.assert_array_equal(got, want)
    for (gk, gv), (wk, wv) in zip(got_kv, want_kv):
        np.testing.assert_array_equal(gk, wk)
        np.testing.assert_array_equal(gv, wv)
    _compare(decoder)   # the step against the Python block, both with the kernels


def test_moe_experts_kernel_equals_the_python_loop_and_refuses_misfits(tmp_path):
    from ster_py.decoder.moe import MoE

    make_checkpoint(tmp_path / "q", "qwen3_moe", **MOE_FAMILIES["qwen3_moe"])
    decoder = load_model(str(tmp_path / "q")).decoder
    _quantize_moe(decoder)
    moe = decoder.layers[0].ffn
    assert isinstance(moe, MoE)
    gates, ups, downs, act = moe._fused_experts()
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, decoder.spec.hidden_size)).astype(np.float32)
    # any count of chosen experts, in any order (more than eight: two jobs each; repeats add twice)
    for ids in ([3, 0], [5], [1, 2, 4, 0, 5, 3], [0, 1, 2, 3, 4, 5, 0, 1, 2, 3]):
        w = rng.random(len(ids)).astype(np.float32)
        want = np.zeros_like(x)
        for e, we in zip(ids, w):
            want += moe.experts[e](x) * we
        got = np.full_like(x, np.nan)
        ops.moe_experts(x, np.array(ids), w, gates, ups, downs, act, got)
        np.testing.assert_array_equal(got, want)
    out = np.empty_like(x)
    for bad in (lambda: ops.moe_experts(x, np.array([6]), np.ones(1, np.float32), gates, ups, downs, act, out),
                lambda: ops.moe_experts(x, np.array([0, 1]), np.ones(1, np.float32), gates, ups, downs, act, out),
                lambda: ops.moe_experts(x[:, :-1], np.array([0]), np.ones(1, np.float32), gates, ups, downs, act,
                                        out),
                lambda: ops.moe_experts(x, np.array([0]), np.ones(1, np.float32), gates, downs, ups, act, out),
                lambda: ops.moe_experts(x, np.array([0]), np.ones(1, np.float32), gates, ups, downs, 2, out),
                lambda: ops.moe_experts(x, np.array([0]), np.ones(1, np.float32), gates, ups, (None,) * 6, act,
                                        out)):
        with pytest.raises(ValueError):
            bad()
