"""GGUF files of the wrapped decoders by llama.cpp's own converter (issue 16): MiniMax-M3's ``minimax-m3``.

One tiny MiniMax-M3 checkpoint (built as its multimodal wrapper by transformers, every weight redrawn, the
routers' selection biases too; the decoder saved text-only in the hub's spellings: MiniMaxM3SparseForCausalLM,
sparse_attention_config, moe_layer_freq, rotary_dim) goes through the pinned convert_hf_to_gguf.py once, at F32.
The file must give transformers' logits (1e-3; measured below 1e-6), its cached decoding and 16 greedy tokens;
llama.cpp's own runtime on the same file its top-1 token at every position of a 32-token prompt long enough for
the sparse layers to drop blocks; and the file quantized by llama.cpp to Q8_0 llama.cpp's top-1 but near-ties.

What llama.cpp's minimax-m3 fixes that the checkpoint could say otherwise: SWIGLU_OAI's limit 7.0 and alpha 1.702
(the converter stores neither; the checkpoint here uses them), the sparse layers are those from
leading_dense_block_count on (the routed ones; the converter does not store sparse_attention_freq), and one
index head per key/value head. Its loader also sizes the shared expert as expert_feed_forward_length times
expert_shared_count, so the checkpoint's shared_intermediate_size equals intermediate_size.

dots3_note (dots3note) is not read yet (no GGUF case here; its architecture stays unsupported). Found so far: the
pinned converter writes test_parity_mla_b's tiny case once swa_q_lora_rank equals q_lora_rank (it refuses two
query ranks), swa_qk_rope_head_dim and scoring_func are stated; the file carries per-layer head counts,
*_swa latent widths, sliding_window_pattern, indexer.types, attn_gate, attn_k_norm (the rotated key's norm),
attn_k_b / attn_v_b, but no rope.freq_base when the checkpoint's rope_parameters are per layer type (llama.cpp
then rotates the full layers at 10000); dots3note.cpp rotates the index query and key by halves (NEOX), where
Transformers rotates Dots3-Note's indexer by adjacent pairs.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from ster_py.errors import SterError
from ster_py.load import load_model
from test_parity_wrapped import M3_PREFIX, M3_TEXT, M3_VISION, PROMPT, VOCAB, _reference, _text_only, _wrapper
from test_parity_wrapped import check_decoder
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)
from tiny import rel_err

LONG_PROMPT = np.random.RandomState(3).randint(3, VOCAB, size=32).tolist()
#: MiniMax-M3 as llama.cpp's minimax-m3 runs it: its fixed SWIGLU_OAI limit, the shared expert as wide as a routed one.
M3_GGUF_TEXT = dict(M3_TEXT, swiglu_limit=7.0, shared_intermediate_size=M3_TEXT["intermediate_size"])
#: The GGUF architectures of this module (case -> model_type, config, legacy keys), for the every-architecture
#: checks (tests/test_parity_moe.py) and tests/test_convert.py, where ster convert refuses them.
GGUF_CASES = {"minimax_m3": ("minimax_m3_vl_text",
                             {k: v for k, v in M3_GGUF_TEXT.items() if not k.endswith("_token_id")}, {})}


def _hub_config(text) -> None:
    """The text-only checkpoint's config.json in the hub's spellings, which llama.cpp's converter reads."""
    config = json.loads((text / "config.json").read_text())
    for key in ("model_type", "layer_types", "mlp_layer_types", *(k for k in config if k.startswith("index_"))):
        config.pop(key, None)
    config.update(architectures=["MiniMaxM3SparseForCausalLM"], hidden_act="swigluoai", moe_layer_freq=[0, 1, 1],
                  use_gemma_norm=True, use_qk_norm=True, qk_norm_type="per_head", scoring_func="sigmoid",
                  n_shared_experts=1, attention_output_gate=False,
                  rotary_dim=int(M3_TEXT["head_dim"] * M3_TEXT["partial_rotary_factor"]),
                  sparse_attention_config=dict(
                      sparse_attention_freq=[0, 1, 1], sparse_num_index_heads=M3_TEXT["index_n_heads"],
                      sparse_index_dim=M3_TEXT["index_head_dim"], sparse_block_size=M3_TEXT["index_block_size"],
                      sparse_topk_blocks=M3_TEXT["index_topk_blocks"],
                      sparse_local_block=M3_TEXT["index_local_blocks"], sparse_score_type="max",
                      sparse_disable_index_value=1, sparse_init_block=0))
    (text / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def m3_gguf(tmp_path_factory):
    """(transformers model, the converted f32 .gguf, transformers' logits on PROMPT)."""
    import torch

    from llamacpp_convert import PREFIX, extract_converter

    root = tmp_path_factory.mktemp("m3_gguf")
    model = _wrapper(root / "wrapped", "minimax_m3_vl", "minimax_m3_vl_text", M3_GGUF_TEXT, M3_VISION,
                     projector_hidden_size=32)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.1)
    model.save_pretrained(root / "wrapped")
    text = _text_only(root / "wrapped", root / "text", M3_PREFIX, stem="")
    _hub_config(text)
    extract_converter(root)
    out = root / "m3.gguf"
    r = subprocess.run([sys.executable, str(root / "convert.py"), str(root / PREFIX), "f32", f"{text}::{out}"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"llama.cpp's convert_hf_to_gguf.py failed: {r.stderr[-2000:]}", pytrace=False)
    return model, out, _reference(model, PROMPT)


def test_minimax_m3_gguf_from_llamacpps_converter_matches_transformers(m3_gguf):
    """The file alone: the leading dense layer attends densely, the routed ones through the index branch
    (norms stored as 1 + w by the converter), SWIGLU_OAI at llama.cpp's fixed limit; logits, cache and greedy
    tokens as transformers', every tensor read."""
    model, path, ref = m3_gguf
    loaded = check_decoder(path, model, ref)
    spec = loaded.spec
    assert spec.extra["gguf_architecture"] == "minimax-m3" and not spec.norm_unit_offset
    assert [(layer.mixer, layer.ffn) for layer in spec.layers] == [("attention", "dense"), ("block_sparse", "moe"),
                                                                   ("block_sparse", "moe")]
    assert (spec.block_sparse.index_dim, spec.block_sparse.block_size, spec.block_sparse.topk_blocks,
            spec.block_sparse.local_blocks) == (16, 2, 3, 2)
    assert spec.ffn_glu == spec.moe.glu == "oai" and spec.ffn_limit == spec.moe.limit == 7.0
    assert {layer.rope.rotary_dim for layer in spec.layers} == {8}


def test_minimax_m3_gguf_against_llamacpp(m3_gguf):
    """llama.cpp's runtime on the same file, 32 positions (the sparse layers drop blocks from the fourth block
    on): logits within 5e-3 (measured 1.2e-3), the same top-1 at every position; the same weights attended
    densely are far from llama.cpp's (its block choice is the one compared)."""
    from dataclasses import replace

    from ster_py import llamacpp
    from ster_py.decoder.model import Decoder

    _, path, _ = m3_gguf
    (theirs,) = llamacpp.logits(path, [LONG_PROMPT])
    theirs = theirs[:, :VOCAB]
    loaded = load_model(str(path))
    ours = loaded.decoder.forward(LONG_PROMPT)
    assert rel_err(ours, theirs) < 5e-3
    assert (ours.argmax(1) == theirs.argmax(1)).all()
    dense = replace(loaded.spec, layers=tuple(replace(layer, mixer="attention") for layer in loaded.spec.layers))
    assert rel_err(Decoder(dense, loaded.decoder.weights).forward(LONG_PROMPT), theirs) > 0.1


def test_minimax_m3_q8_0_gguf_gives_llamacpps_top1(m3_gguf, tmp_path):
    """Quantized by llama.cpp's quantizer to Q8_0: ster computes what the blocks define (the file dequantized,
    within 1e-4), and gives llama.cpp's top-1 at every position but near-ties (its own top two closer than
    three times the rms difference of the two implementations' logits, as test_parity_gemma3n.py)."""
    from ster_py import llamacpp
    from ster_py.decoder.model import Decoder
    from ster_py.gguf.reader import GGUFFile
    from ster_py.weights import GGUFWeights

    _, path, _ = m3_gguf
    q = llamacpp.quantize(path, tmp_path / "m3-Q8_0.gguf", "Q8_0")
    model = load_model(str(q))
    ours = model.decoder.forward(LONG_PROMPT)
    exact = Decoder(model.spec, GGUFWeights(GGUFFile(q), "f32", qk_heads=None, quantized=False)).forward(LONG_PROMPT)
    assert rel_err(ours, exact) < 1e-4
    (ref,) = llamacpp.logits(q, [LONG_PROMPT])
    ref = ref[:, :VOCAB]
    assert rel_err(ours, ref) < 0.15
    mine, theirs = ours.argmax(1), ref.argmax(1)
    rows = np.arange(len(mine))
    margin = ref[rows, theirs] - ref[rows, mine]
    noise = np.sqrt(2 * np.mean((ours - ref) ** 2))
    assert np.all((mine == theirs) | (margin <= 3 * noise)), (np.nonzero(mine != theirs), margin, noise)
    assert (mine == theirs).mean() >= 0.8


def _meta(path):
    from ster_py.gguf.reader import GGUFFile

    f = GGUFFile(path)
    return dict(f.metadata), {n: t.shape for n, t in f.tensors.items()}


@pytest.mark.parametrize("change, message", [
    ({"minimax-m3.attention.indexer.head_count": 4}, "one index head per key/value head"),
    ({"minimax-m3.attention.indexer.local_blocks": 5}, "local_blocks"),
    ({"minimax-m3.attention.indexer.block_size": 0}, "block_size must be a whole number of at least 1"),
    ({"minimax-m3.leading_dense_block_count": 4}, "leading_dense_block_count"),
])
def test_minimax_m3_gguf_metadata_refusals(m3_gguf, change, message):
    """Index metadata llama.cpp's graph could not run (or would divide by) is refused by name."""
    from ster_py.gguf.config import spec_from_gguf

    meta, tensors = _meta(m3_gguf[1])
    with pytest.raises(SterError, match=message):
        spec_from_gguf({**meta, **change}, str(m3_gguf[1]), tensors=tensors)


def test_minimax_m3_gguf_sparse_layers_follow_leading_dense_block_count(m3_gguf):
    """As minimax-m3.cpp: the layers from leading_dense_block_count on are the sparse ones."""
    from ster_py.gguf.config import spec_from_gguf

    meta, tensors = _meta(m3_gguf[1])
    spec = spec_from_gguf({**meta, "minimax-m3.leading_dense_block_count": 2}, "m3.gguf", tensors=tensors)
    assert [layer.mixer for layer in spec.layers] == ["attention", "attention", "block_sparse"]
