"""The generation loop's own checks (the decoder is faked: these are about the loop)."""
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
