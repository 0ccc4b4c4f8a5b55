"""A model imports only the parts it runs.

The mixers and feed-forwards other than attention and the dense one (routed experts, latent and
state-space mixers, hyper-connections, AltUp...) are imported where a configuration or a block
builds one (``decoder/model.py``'s ``mixer_class``, the spec readers in ``config.py`` and
``gguf/config.py``): creating their modules and dataclasses took ~20 ms of every load of a dense model.
Likewise ml_dtypes (bfloat16, float8), ~4 ms to import, only where a tensor or the precision needs it.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from ster_py.decoder.model import MIXERS, mixer_class
from ster_py.decoder.parts import Part

#: The modules of parts a dense attention model never builds.
OPTIONAL = ("altup", "block_sparse", "compressed", "delta", "hybrid", "indexer", "kda", "latent", "lightning",
            "loops", "mamba", "mamba2", "moe", "mova", "ngram", "relative", "shared_block", "shortconv", "ssm",
            "streams", "xielu")


@pytest.mark.parametrize("kind", sorted(MIXERS))
def test_every_mixer_kind_names_a_part(kind):
    cls = mixer_class(kind)
    assert isinstance(cls, type) and issubclass(cls, Part) and cls.__name__ == MIXERS[kind][1]


def test_none_is_no_mixer():
    assert mixer_class("none") is None


@pytest.mark.real
def test_a_dense_model_imports_no_other_part(smollm2_gguf):
    code = ("import sys\nfrom ster_py.generate import Sampling, generate\nfrom ster_py.load import load_model\n"
            "m = load_model(sys.argv[1])\n"
            "generate(m.decoder, m.tokenizer.encode('Hello'), Sampling(max_new_tokens=2), stop_ids=())\n"
            "print(' '.join(sorted(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code, str(smollm2_gguf)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = set(proc.stdout.split())
    assert {"ster_py.decoder.attention", "ster_py.decoder.ffn", "ster_py.gguf.tokenizer"} <= loaded
    assert not {f"ster_py.decoder.{m}" for m in OPTIONAL} & loaded
    assert "ster_py.gguf.sentencepiece_bpe" not in loaded  # (a BPE vocabulary)
    assert "ml_dtypes" not in loaded  # (no bfloat16 or float8 tensor: weights.py imports it for those)
