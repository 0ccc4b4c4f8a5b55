"""GGUF of issue 16's second group of families without a Transformers implementation: nemotron-nas
(llama.cpp's ``deci``) and plamo3 (llama.cpp's ``plamo3``), each written by llama.cpp 0.3.36's own
converter (conversion/deci.py, conversion/plamo.py) from the tiny checkpoints and built oracles of
test_parity_remote_b.py.

At F32 the file must give the oracle's logits within 1e-3 (whole, and through the cache in two
pieces), every tensor read; llama.cpp's own runtime on the same file gives the same top-1 token at
every position; quantized by llama.cpp's quantizer to Q8_0, ster gives llama.cpp's top-1 at every
position but near-ties (as test_parity_gemma3n.py).

What llama.cpp's files say (conversion/deci.py, src/models/deci.cpp): per-layer
attention.head_count / head_count_kv and feed_forward_length, 0 for a block_configs entry without
that half (a no_op attention: no heads; a no_op feed-forward: no width); q/k rows permuted per layer
by its own key/value heads.
"""
from __future__ import annotations

import numpy as np
import pytest

from ster_py.errors import SterError
from ster_py.load import load_model
from test_parity_remote_b import _DECI_ENTRY, _NAS_BLOCKS, _NOOP_ATT, PROMPT, VOCAB, _nemotron_nas
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)
from tiny import reference_logits, reference_split_logits, rel_err

LONG_PROMPT = np.random.RandomState(3).randint(3, VOCAB, size=32).tolist()

# Every block_configs entry kind test_parity_remote_b.py's case has, with an attention-only layer (2)
# and a layer with neither half (3); "nas-ffn-kept" has none of them without a feed-forward (below:
# llama.cpp's graph drops an attention-only layer's attention).
_NAS_KEPT = [
    {"attention": {"n_heads_in_group": 4}, "ffn": {"ffn_mult": 2.625}},
    {"attention": _NOOP_ATT, "ffn": {"ffn_mult": 7.0}},
    {"attention": {"n_heads_in_group": 1}, "ffn": {"ffn_mult": 1.0}},
]

# test_parity_remote_b.py's blocks, the last sized by ffn_mult: the converter writes 0 for an entry sized by
# intermediate_size (test_deci_width_by_intermediate_size_is_refused)
_NAS_GGUF = _NAS_BLOCKS[:4] + [{"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 1.25}}]
GGUF_CASES = {  # name: (model_type, config, legacy config.json keys)
    "nas-blocks": ("nemotron-nas", dict(num_hidden_layers=5, block_configs=_NAS_GGUF), {}),
    "nas-ffn-kept": ("nemotron-nas", dict(num_hidden_layers=3, block_configs=_NAS_KEPT), {}),
}


def _build(path, model_type: str, config: dict):
    if model_type == "nemotron-nas":
        return _nemotron_nas(path, config)
    raise AssertionError(model_type)


@pytest.fixture(scope="module")
def gguf_models(tmp_path_factory):
    """name -> (converted F32 .gguf, Transformers oracle), one converter run for all cases."""
    from llamacpp_convert import convert_cases

    return convert_cases(tmp_path_factory.mktemp("llama_cpp_remote_b"), GGUF_CASES, _build)


# ------------------------------------------------------------------ nemotron-nas (deci)
def test_deci_gguf_matches_the_oracle(gguf_models):
    """The file read alone gives the oracle's layers (which halves, key/value heads, widths) and logits."""
    path, ref = gguf_models["nas-blocks"]
    model = load_model(str(path))
    assert model.resolved.kind == "gguf" and model.spec.model_type == "nemotron-nas"
    spec = model.spec
    assert [(layer.mixer, layer.ffn) for layer in spec.layers] == [("attention", "dense"), ("none", "dense"),
                                                                  ("attention", "none"), ("none", "none"),
                                                                  ("attention", "dense")]
    assert [spec.attention_shape(i)[1] for i in (0, 2, 4)] == [1, 4, 2]
    assert [spec.layer_norms(i) for i in range(4)] == [("attn_norm", "ffn_norm"), ("ffn_norm",), ("attn_norm",), ()]
    ref_logits, _ = reference_logits(ref, PROMPT)
    err = rel_err(model.decoder.forward(PROMPT), ref_logits)
    assert err < 1e-3, f"logits rel err {err:.2e}"
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:9], cache), model.decoder.forward(PROMPT[9:], cache)])
    assert rel_err(pieces, reference_split_logits(ref, PROMPT, 9)) < 1e-3
    assert model.decoder._weights.unused_tensors(spec) == []
