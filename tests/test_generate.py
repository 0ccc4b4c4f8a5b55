"""The generation loop's own checks (the decoder is faked: these are about the loop)."""
from types import SimpleNamespace

import numpy as np
import pytest

from ster_py.errors import SterError
from ster_py.generate import Sampling, generate


class _Spec:
    layers = ()
    max_position_embeddings = 64


class _Cache:
    length = 0


class _FakeDecoder:
    """Logits of 1000 entries favouring id 3, with one entry replaced by ``bad`` at step ``when``."""

    spec = _Spec()

    def __init__(self, bad, when):
        self.bad, self.when, self.calls = bad, when, 0

    def new_cache(self):
        return _Cache()

    def forward(self, ids, cache, **kw):
        cache.length += len(ids)
        logits = np.zeros((1, 1000), np.float32)
        logits[0, 3] = 5.0
        if self.calls == self.when:
            logits[0, 917] = self.bad
        self.calls += 1
        return logits


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("when", [0, 2])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_one_non_finite_logit_is_refused(bad, when, temperature):
    with pytest.raises(SterError, match="non-finite logits"):
        generate(_FakeDecoder(bad, when), [1, 2], Sampling(max_new_tokens=5, temperature=temperature, seed=0))


def test_finite_logits_generate():
    g = generate(_FakeDecoder(0.0, 99), [1, 2], Sampling(max_new_tokens=4))
    assert g.ids == [3, 3, 3, 3]


@pytest.mark.parametrize("kwargs,field", [({"top_k": 2.5}, "top_k"), ({"max_new_tokens": "3"}, "max_new_tokens"),
                                          ({"temperature": None}, "temperature"), ({"seed": True}, "seed"),
                                          ({"logit_bias": {12: 5.0}}, "logit_bias"),
                                          ({"logit_bias": ((12, "5"),)}, "logit_bias")])
def test_sampling_of_the_wrong_type_is_refused(kwargs, field):
    """A library caller's Sampling field of the wrong type was a TypeError from inside numpy (or, for
    ``seed=True``, a silent seed 1): now a SterError naming the field."""
    with pytest.raises(SterError, match=f"^Sampling.{field} must be"):
        generate(_FakeDecoder(0.0, 99), [1, 2], Sampling(**kwargs))


@pytest.mark.parametrize("bias,message", [(((10**30, 1.0),), "names id 10{30}, past the model's 1000 ids"),
                                          (((1000, 1.0),), "names id 1000, past"),
                                          (((np.int64(-1), 1.0),), "ids must be 0 or more")])
def test_logit_bias_ids_out_of_range_are_refused(bias, message):
    """A library caller's logit_bias id past int64 was numpy's OverflowError, and a numpy integer id
    (np.int64(5), which the type check accepts) was refused as 'ids must be 0 or more'."""
    with pytest.raises(SterError, match=message):
        generate(_FakeDecoder(0.0, 99), [1, 2], Sampling(max_new_tokens=2, logit_bias=bias))
    g = generate(_FakeDecoder(0.0, 99), [1, 2], Sampling(max_new_tokens=2, logit_bias=((np.int64(5), 100.0),)))
    assert g.ids == [5, 5]   # the bias applied: token 5's 0 + 100 beats token 3's 5.0


@pytest.mark.parametrize("kwargs, words", [
    ({"layer_hook": 5}, r"^generate's layer_hook must be a function or None, got int$"),   # 'not callable'
    ({"on_token": "stop"}, r"^generate's on_token must be a function or None, got str$"),
    ({"cancelled": True}, r"^generate's cancelled must be a function or None, got bool$"),
    ({"progress": 1}, r"^generate's progress must be a function or None, got int$"),
    ({"cache": 5}, r"^generate's cache must be a prefix\.PromptCache or None, got int$"),  # AttributeError
])
def test_generate_refuses_callbacks_and_caches_of_the_wrong_type(kwargs, words):
    """Each was a TypeError or AttributeError from inside the run (after the prefill for on_token)."""
    with pytest.raises(SterError, match=words):
        generate(_FakeDecoder(0.0, 99), [1, 2], Sampling(max_new_tokens=2), **kwargs)


@pytest.mark.parametrize("ids,message", [("w10", "not a text"), ([1.7, 2], "whole numbers, got 1.7"),
                                         ([True], "whole numbers, got True"), ([[1, 2], [3]], "flat sequence"),
                                         (np.array([[1, 2], [3, 4]]), r"flat sequence .* shape \[2, 2\]"),
                                         ([[1, 2]], r"shape \[1, 2\]")])
def test_token_ids_that_are_not_whole_numbers_are_refused(ids, message):
    """generate's prompt_ids (and Decoder.forward's ids): a text was int()'s ValueError, floats were
    truncated (1.7 ran as 1), a batch [B, T] ran as one prompt of its rows end to end."""
    with pytest.raises(SterError, match=message):
        generate(_FakeDecoder(0.0, 99), ids, Sampling(max_new_tokens=2))
    with pytest.raises(SterError, match="decoder: pass loaded.decoder"):
        generate(SimpleNamespace(decoder=_FakeDecoder(0.0, 99)), [1, 2], Sampling(max_new_tokens=2))
    assert generate(_FakeDecoder(0.0, 99), np.array([1, 2], np.int32), Sampling(max_new_tokens=2),
                    stop_ids=None).ids == [3, 3]
