"""The prompt cache (ster_py/prefix.py): a prompt sharing a prefix with the last one prefills only
the rest, and its logits equal a cold run's (a fresh cache, the whole prompt in one call), and so do
its greedy tokens.

The oracle is the cold run itself, which the parity suites check against transformers. "Equal" is
within 1e-5 of the largest logit: OpenBLAS multiplies matrices this tiny (M*N*K up to about 1e6) with
small-matrix kernels whose sums depend on the row count, so a prompt cut into two calls rounds its
last bits differently (about 1e-7 here); products of real models' sizes are row-exact
(test_real_models.py checks SmolLM2 bit for bit). With a float16 cache such a last-bit difference
in a key can round it to the neighbouring float16 (a relative 1e-3 step), so there the bound is
float16's precision, 1e-3 of the largest logit (whole-model float16 rounding moves logits by 1e-4 to
2e-3 relative, test_kv_cache.py). Cases: a
float llama (a float16 cache too), the same with Q8_0 projections (gguf-py's blocks), a latent
attention MoE (DeepSeek-V2), and a hybrid (Jamba) whose recurrent slots cannot go back: it continues
where its state stands, or falls back to a cold prefill, and answers the same.
"""
from __future__ import annotations

import numpy as np
import pytest

from ster_py.decoder.cache import KVCache
from ster_py.decoder.linear import blas_rows_exact
from ster_py.errors import Cancelled
from ster_py.generate import Sampling, generate
from ster_py.load import load_model
from ster_py.prefix import PromptCache, common_prefix
from tiny import build_checkpoint, make_checkpoint, one_torch_thread  # noqa: F401 (autouse fixture)

rng = np.random.default_rng(7)
BASE = [int(t) for t in rng.integers(3, 128, 40)]
# a conversation: each prompt extends or rewrites the last one
PROMPTS = [BASE[:20], BASE[:33], BASE[:34], BASE[:27] + [9, 9, 9, 9, 9], BASE[:27] + [9, 9, 9, 9, 9, 4],
           BASE[:3], BASE]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    make_checkpoint(path, "llama")
    return load_model(str(path))


def _cold(decoder, ids, kv=np.float32):
    return decoder.forward(ids, decoder.new_cache(kv), last_only=True)[-1]


def _same(got, want, kv=np.float32):
    """Equal logits, up to the last bits of tiny products (module docstring)."""
    bound = 1e-3 if np.dtype(kv) == np.float16 else 1e-5
    np.testing.assert_allclose(got, want, rtol=0, atol=bound * float(np.abs(want).max()))


def _check_conversation(decoder, kv=np.float32, expect_reuse=True):
    cache = PromptCache(decoder, kv)
    last: list[int] = []
    for ids in PROMPTS:
        got = cache.prefill(ids)
        _same(got, _cold(decoder, ids, kv), kv)
        assert cache.reused + cache.prefilled == len(ids)
        if expect_reuse:
            want = min(common_prefix(last, ids), len(ids) - 1)
            want -= 1 if len(ids) - want == 1 and want > 0 else 0   # never a one-token prefill
            assert cache.reused == want
        else:
            assert cache.reused == 0
        last = ids


@pytest.mark.parametrize("kv", [np.float32, np.float16])
def test_float_llama_reuses_exactly(llama, kv):
    _check_conversation(llama.decoder, kv)


def test_quantized_llama_reuses_exactly(tmp_path):
    from test_step import _quantize

    path = tmp_path / "q"
    make_checkpoint(path, "llama", seed=3)
    loaded = load_model(str(path))
    _quantize(loaded.decoder)
    _check_conversation(loaded.decoder)


def test_latent_attention_moe_reuses_exactly(tmp_path):
    from test_parity_mla import CASES

    model_type, config = CASES["deepseek_v2"]
    build_checkpoint(tmp_path / "ds", model_type, config)
    decoder = load_model(str(tmp_path / "ds")).decoder
    # its context is 64 positions: a shorter conversation
    cache = PromptCache(decoder)
    for ids, reused in ((BASE[:20], 0), (BASE[:33], 20), (BASE[:27] + [9, 9, 9], 27)):
        _same(cache.prefill(ids), _cold(decoder, ids))
        assert cache.reused == reused


def test_recurrent_slots_fall_back_to_a_cold_prefill(tmp_path):
    from test_parity_ssm import CASES

    model_type, config = CASES["jamba"]
    build_checkpoint(tmp_path / "jamba", model_type, config)
    decoder = load_model(str(tmp_path / "jamba")).decoder
    cache = PromptCache(decoder)
    # continuing from where the state stands needs no going back; going back to 27 of 33 does
    for ids, reused in ((BASE[:20], 0), (BASE[:33], 20), (BASE[:27] + [9, 9, 9], 0)):
        _same(cache.prefill(ids), _cold(decoder, ids))
        assert cache.reused == reused and cache.prefilled == len(ids) - reused


def test_generate_with_a_prompt_cache_equals_cold_runs(llama):
    """A chat's turns through one cache: each reply equals a cold generate's; decoded positions
    are not reused (the next prompt re-prefills the previous reply)."""
    decoder, sampling = llama.decoder, Sampling(max_new_tokens=6)
    cache = PromptCache(decoder)
    history: list[int] = []
    last: list[int] = []
    for turn in ([5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15]):
        prompt = history + turn
        got = generate(decoder, prompt, sampling, cache=cache)
        want = generate(decoder, prompt, sampling)
        assert got.ids == want.ids and want.reused == 0
        assert got.reused == len(last) and got.prefilled == len(prompt) - got.reused
        history, last = prompt + got.ids, prompt
    # a steering hook is part of the key: another key starts afresh
    hook = lambda i, h: h + 0.5  # noqa: E731
    got = generate(decoder, history + [16, 17], sampling, cache=cache, layer_hook=hook, cache_key=("v", 0.5))
    assert got.reused == 0
    assert got.ids == generate(decoder, history + [16, 17], sampling, layer_hook=hook).ids


def test_rollback_refuses_what_it_cannot_do():
    class NoRollback:
        pass

    class Rolls:
        def __init__(self):
            self.asked = []

        def rollback(self, n):
            self.asked.append(n)
            return True

    cache = KVCache(2, 1, 4)
    cache.length = 5
    assert not cache.rollback(6) and not cache.rollback(-1) and cache.length == 5
    assert cache.rollback(3) and cache.length == 3
    mixed = KVCache(2, 1, 4, slots=[NoRollback(), Rolls()])
    mixed.length = 5
    assert not mixed.rollback(3) and mixed.length == 5
    assert mixed.rollback(5)   # staying put needs nothing
    rolls = KVCache(1, 1, 4, slots=[Rolls()])
    rolls.length = 5
    assert rolls.rollback(2) and rolls.length == 2 and rolls.slot(0).asked == [2]


@pytest.mark.real
@pytest.mark.parametrize("kv", [np.float32, np.float16])
def test_smollm2_reuse_is_bit_exact(smollm2_gguf, smollm2_hf, kv):
    """Real sizes leave OpenBLAS's small-matrix kernels: the quantized GGUF reuses bit for bit in both
    cache dtypes, and so does its float32 safetensors copy where OpenBLAS's kernels are row-exact
    (``blas_rows_exact``: AVX-512 CPUs); on its Haswell/Zen kernels that copy agrees to float32 rounding."""
    for path in (smollm2_gguf, smollm2_hf):
        loaded = load_model(str(path))
        d = loaded.decoder
        ids = loaded.tokenizer.encode("The history of astronomy is a long story of people looking up at the night "
                                      "sky and trying to make sense of what they saw. Ancient farmers tracked the seasons")
        cache = PromptCache(d, kv)
        assert len(ids) > 30
        exact = path == smollm2_gguf or blas_rows_exact()   # float32 rows: bit for bit where the BLAS is
        for n, reused in ((10, 0), (25, 10), (27, 25), (28, 26), (len(ids), 28)):
            got, cold = cache.prefill(ids[:n]), _cold(d, ids[:n], kv)
            if exact:
                np.testing.assert_array_equal(got, cold)
            else:   # OpenBLAS's Haswell/Zen kernels, measured on an AMD EPYC: 1e-6 of the largest logit with
                # float32 keys/values; 1e-4 with float16 ones (a key near a float16 rounding boundary may round
                # the other way: one float16 step, 2^-11 relative)
                bound = 1e-5 if kv == np.float32 else 1e-3
                assert np.abs(got - cold).max() <= bound * np.abs(cold).max()
            assert cache.reused == reused


def _cancel_after(n: int):
    """A ``cancelled`` callback that says True from its (n + 1)-th poll on; ``polls`` counts them."""
    polls = [0]

    def cancelled() -> bool:
        polls[0] += 1
        return polls[0] > n
    return cancelled, polls


def test_a_cancelled_prefill_stops_between_layers_and_leaves_the_cache_consistent(llama):
    """A cancellation during the prefill (a chat's Ctrl-C, a server client gone during a long prompt)
    stops it at the next layer, not after the whole prompt; the run ends with no ids ("cancelled"),
    and the cache keeps what it held before: the next run reuses that and equals a cold run."""
    decoder, sampling = llama.decoder, Sampling(max_new_tokens=5)
    layers = len(decoder.layers)
    assert layers >= 2
    cache = PromptCache(decoder)
    first = generate(decoder, BASE[:20], sampling, cache=cache)
    prompt = BASE + [7, 8, 9]
    cancelled, polls = _cancel_after(1)
    got = generate(decoder, prompt, sampling, cache=cache, cancelled=cancelled)
    assert got.stop_reason == "cancelled" and got.ids == [] and polls[0] == 2   # one layer ran, of several
    assert cache.cache.length == 20 and cache.ids == BASE[:20]
    again = generate(decoder, prompt, sampling, cache=cache)
    cold = generate(decoder, prompt, sampling)
    assert again.ids == cold.ids and again.reused == 20 and again.prefilled == len(prompt) - 20
    # not cancelled: polled once per layer, the same logits as without a callback
    cancelled, polls = _cancel_after(10 ** 9)
    _same(PromptCache(decoder).prefill(prompt, cancelled=cancelled), _cold(decoder, prompt))
    assert polls[0] == layers
    assert generate(decoder, prompt, sampling, cancelled=cancelled).ids == cold.ids
    # cancelled before the first layer: nothing is computed, the cache is as it was
    got = generate(decoder, BASE[:20] + [4, 4], sampling, cache=cache, cancelled=lambda: True)
    assert got.stop_reason == "cancelled" and got.ids == [] and first.ids
    assert generate(decoder, BASE[:20] + [4, 4], sampling, cache=cache).ids == generate(
        decoder, BASE[:20] + [4, 4], sampling).ids


def test_a_cancelled_prefill_drops_a_recurrent_cache(tmp_path):
    """A hybrid's recurrent states are updated in place layer by layer: a cut prefill may have changed
    some, so the cache starts afresh and the next prompt's logits equal a cold run's."""
    from test_parity_ssm import CASES

    model_type, config = CASES["jamba"]
    build_checkpoint(tmp_path / "jamba", model_type, config)
    decoder = load_model(str(tmp_path / "jamba")).decoder
    cache = PromptCache(decoder)
    cache.prefill(BASE[:20])
    cancelled, polls = _cancel_after(1)
    with pytest.raises(Cancelled):
        cache.prefill(BASE[:33], cancelled=cancelled)
    assert polls[0] == 2 and cache.cache is None and cache.ids == []
    _same(cache.prefill(BASE[:33]), _cold(decoder, BASE[:33]))
    assert cache.reused == 0


def test_a_cancelled_extend_stops_between_layers_and_leaves_the_cache_consistent(llama):
    """``extend`` (a chat's history prefilled after an answer) took no ``cancelled``: a Ctrl-C was seen only
    after the whole history. It now stops at the next layer, as ``prefill`` does, and the cache keeps what it
    held before the cut call: the next prompt reuses that and equals a cold run."""
    decoder = llama.decoder
    layers = len(decoder.layers)
    cache = PromptCache(decoder)
    cache.prefill(BASE[:20])
    cancelled, polls = _cancel_after(1)
    with pytest.raises(Cancelled):
        cache.extend(BASE[:33], cancelled=cancelled)
    assert polls[0] == 2 and layers >= 2   # one layer ran, of several
    assert cache.cache.length == 20 and cache.ids == BASE[:20]
    _same(cache.prefill(BASE), _cold(decoder, BASE))
    assert cache.reused == 20
    cancelled, polls = _cancel_after(10 ** 9)   # not cancelled: polled once per layer
    assert cache.extend(BASE + [5, 6, 7], cancelled=cancelled) == 3 and polls[0] == layers
    assert cache.ids == BASE + [5, 6, 7]


def test_a_prefill_reports_its_progress_once_per_layer(llama):
    """A 6,031-token prompt ran 25 s with nothing on screen: the CLI had nothing to draw. The prefill now
    reports ``progress("prefill N", done, total)`` after each layer (N the tokens computed, the reused ones
    not counted), through ``generate``, ``PromptCache.prefill`` and ``extend``, with the same logits."""
    decoder, sampling = llama.decoder, Sampling(max_new_tokens=3)
    layers = len(decoder.layers)
    assert layers >= 2
    seen: list = []
    report = lambda *event: seen.append(event)  # noqa: E731
    cache = PromptCache(decoder)
    _same(cache.prefill(BASE[:20], progress=report), _cold(decoder, BASE[:20]))
    assert seen == [("prefill 20", i, layers) for i in range(1, layers + 1)]
    seen.clear()
    cold = generate(decoder, BASE, sampling)
    assert generate(decoder, BASE, sampling, cache=cache, progress=report).ids == cold.ids   # 20 reused
    assert seen == [("prefill 20", i, layers) for i in range(1, layers + 1)]
    seen.clear()
    assert cache.extend(BASE + [5, 6, 7], progress=report) == 3
    assert seen == [("prefill 3", i, layers) for i in range(1, layers + 1)]


def test_a_hybrid_split_prefill_reports_both_calls_in_one_count(tmp_path):
    """A hybrid prefills up to its checkpoint, then the rest (two forward calls): one bar, not two."""
    from test_parity_ssm import CASES

    model_type, config = CASES["jamba"]
    build_checkpoint(tmp_path / "jamba", model_type, config)
    decoder = load_model(str(tmp_path / "jamba")).decoder
    layers = len(decoder.layers)
    seen: list = []
    PromptCache(decoder).prefill(BASE[:33], checkpoint_at=20, progress=lambda *event: seen.append(event))
    assert seen == [("prefill 33", i, 2 * layers) for i in range(1, 2 * layers + 1)]


def test_positions_of_a_keyless_hook_or_older_weights_are_not_reused(tmp_path, llama):
    """A library caller's hook without a ``cache_key`` (nothing says two such hooks are equal) and an adapter
    applied after a turn (the cached positions were computed without it) both start afresh: the reply
    equals a cold run's, where reusing had answered with the steered or unadapted positions."""
    from ster_py.adapters import LoraAdapter, apply_adapter

    decoder, sampling = llama.decoder, Sampling(max_new_tokens=6)
    prompt, more = [5, 6, 7, 8, 9, 10, 11, 12], [13, 14]
    hook = lambda i, h: h + 0.5  # noqa: E731
    cache = PromptCache(decoder)
    generate(decoder, prompt, sampling, cache=cache, layer_hook=hook)
    got = generate(decoder, prompt + more, sampling, cache=cache)        # after a keyless hook
    assert got.reused == 0 and got.ids == generate(decoder, prompt + more, sampling).ids
    got = generate(decoder, prompt, sampling, cache=cache, layer_hook=hook)
    assert got.reused == 0 and got.ids == generate(decoder, prompt, sampling, layer_hook=hook).ids
    # an adapter applied between two turns, on a model of this test's own (the fixture's stays as it is)
    path = tmp_path / "m"
    make_checkpoint(path, "llama")
    own = load_model(str(path))
    cache = PromptCache(own.decoder)
    generate(own.decoder, prompt, sampling, cache=cache)
    layer = own.decoder.layers[0]
    target = "q"
    width = getattr(layer, target).weight.shape
    r = np.random.default_rng(3)
    ad = LoraAdapter(path=path, layout="ster", model=None, model_revision=None, rank=2, alpha=8.0, rslora=False,
                     hidden_size=None, factors={(0, target): (r.standard_normal((2, width[1])).astype(np.float32),
                                                              r.standard_normal((width[0], 2)).astype(np.float32))})
    apply_adapter(own, ad)
    got = generate(own.decoder, prompt + more, sampling, cache=cache)
    cold = own.decoder.forward(prompt + more, own.decoder.new_cache(), last_only=True)[-1]
    assert got.reused == 0
    assert got.ids == generate(own.decoder, prompt + more, sampling).ids
    _same(cache.prefill(prompt + more), cold)
