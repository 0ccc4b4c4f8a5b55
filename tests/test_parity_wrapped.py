"""The wrapped decoders with a Transformers implementation (issue 16): Muse Glimmer, MiniMax-M3, Inkling.

The oracle is transformers 5.24 itself. Each family is built once per module as its multimodal wrapper
(a tiny vision tower beside the text decoder, the head at the wrapper's root) with every weight redrawn;
the same weights are also written as a text-only checkpoint (the decoder's own model_type, the decoder's
tensors below ``model.``), and both must give the wrapper's logits on text within 1e-4 (f32), the same 16
greedy tokens as its cached decoding, the same logits fed in pieces or token by token, and leave no
decoder tensor unread (the towers are never read). The switches Transformers has no key for (seed 002's
``use_qk_norm`` / ``use_attn_output_gate`` / ``scale_query_by``) are compared with the Transformers model
changed to the same math.
"""
from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from ster_py.errors import SterError
from ster_py.families import FAMILIES, WRAPPERS, gate
from ster_py.generate import Sampling, generate
from ster_py.load import load_model
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)
from tiny import reference_greedy, rel_err, write_tokenizer

VOCAB = 128
PROMPT = np.random.RandomState(1).randint(3, VOCAB, size=16).tolist()
SPLIT = 9
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
            pad_token_id=0)


def _redraw(model, unit_norms=()):
    """Every parameter redrawn (matrices 0.15, vectors 0.3 around zero; names ending in ``unit_norms``
    around one: norms whose weight applies as stored)."""
    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.15 if p.ndim > 1 else 0.3) + (1.0 if name.endswith(unit_norms) else 0.0))


def _wrapper(path: Path, wrapper: str, text_type: str, text: dict, vision: dict, unit_norms=(), **extra):
    """The wrapper model (transformers, f32, eval) saved at ``path``, its tokenizer beside it."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(wrapper, text_config=dict(text, model_type=text_type), vision_config=vision, **extra)
    model = AutoModelForImageTextToText.from_config(cfg, attn_implementation="eager").eval()
    _redraw(model, unit_norms)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    write_tokenizer(path, VOCAB)
    return model


def _text_only(wrapped: Path, path: Path, prefix: str, stem: str = "model.", config_changes: dict | None = None,
               drop: tuple[str, ...] = (), scale: dict | None = None) -> Path:
    """The wrapper's decoder as a text-only checkpoint: its text_config at the top, the tensors below
    ``prefix`` moved below ``stem``, the head kept, the towers left out (``drop``: names left out too;
    ``scale``: name -> factor applied to that tensor)."""
    from safetensors.numpy import load_file, save_file

    path.mkdir(parents=True, exist_ok=True)
    tensors = load_file(str(wrapped / "model.safetensors"))
    out = {}
    for name, t in tensors.items():
        if name.startswith(prefix):
            name = stem + name[len(prefix):]
        elif name != "lm_head.weight":
            continue
        if not name.endswith(drop):
            out[name] = t * np.float32((scale or {}).get(name, 1.0))
    save_file(out, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((wrapped / "config.json").read_text())
    text = dict(config["text_config"], **(config_changes or {}))
    text = {k: v for k, v in text.items() if v is not None or k in ("pad_token_id",)}
    (path / "config.json").write_text(json.dumps(text))
    write_tokenizer(path, VOCAB)
    return path


def _reference(model, ids) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits[0].float().numpy()


def check_decoder(path: Path, ref_model, ref_logits=None, greedy=True):
    """Logits within 1e-4 of the wrapper's, the same in pieces and token by token, 16 greedy tokens equal
    to its cached decoding, every decoder tensor read; returns the loaded model."""
    ref_logits = _reference(ref_model, PROMPT) if ref_logits is None else ref_logits
    model = load_model(str(path))
    dec = model.decoder
    logits = dec.forward(PROMPT)
    err = rel_err(logits, ref_logits)
    assert err < 1e-4, f"logits rel err {err:.2e}"
    split = dec.new_cache()
    pieces = np.concatenate([dec.forward(PROMPT[:SPLIT], split), dec.forward(PROMPT[SPLIT:], split)])
    steps = dec.new_cache()
    one_by_one = np.concatenate([dec.forward([t], steps) for t in PROMPT])
    assert rel_err(pieces, logits) < 1e-5 and rel_err(one_by_one, logits) < 1e-5
    if greedy:
        ours = generate(dec, PROMPT, Sampling(max_new_tokens=16)).ids
        assert ours == reference_greedy(ref_model, PROMPT, 16)
        assert len(set(ours)) > 2  # the continuation is not one token repeated
    assert dec._weights.unused_tensors(model.spec) == []
    return model


# ----------------------------------------------------------------------------- Muse Glimmer

MUSE_TEXT = dict(BASE, num_hidden_layers=3, sliding_window=4, final_logit_softcapping=5.0, output_multiplier=0.7,
                 qk_scale_factor=2.5, post_norm_eps=1e-6, rms_norm_eps=1e-5)
MUSE_VISION = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2)
MUSE_PREFIX = "model.language_model."
#: The GGUF architectures of this group (case -> model_type, config, legacy keys; as the other suites list theirs for
#: tests/test_convert.py, which checks that ster convert refuses them until its files are compared with llama.cpp's).
GGUF_CASES = {"muse_glimmer": ("muse_glimmer_text",
                               {k: v for k, v in MUSE_TEXT.items() if not k.endswith("_token_id")}, {})}


@pytest.fixture(scope="module")
def muse(tmp_path_factory):
    """(wrapper model, wrapped checkpoint, text-only checkpoint, the wrapper's logits on PROMPT)."""
    root = tmp_path_factory.mktemp("muse")
    model = _wrapper(root / "wrapped", "muse_glimmer", "muse_glimmer_text", MUSE_TEXT, MUSE_VISION,
                     unit_norms=("language_model.norm.weight",), out_hidden_size=64, projector_hidden_size=32)
    text = _text_only(root / "wrapped", root / "text", MUSE_PREFIX)
    return model, root / "wrapped", text, _reference(model, PROMPT)


def test_muse_glimmer_text_matches_transformers(muse):
    model, _, text, ref = muse
    loaded = check_decoder(text, model, ref)
    spec = loaded.spec
    assert spec.model_type == "muse_glimmer_text" and spec.decoder_prefix is None
    # Transformers' defaults for 3 layers: the last attends fully and does not rotate, the others slide
    assert [(layer.sliding_window, layer.rope is not None) for layer in spec.layers] == [(4, True), (4, True),
                                                                                         (None, False)]
    assert spec.attn_scale == pytest.approx(2.5 / 4) and spec.post_norm_eps == 1e-6


def test_muse_glimmer_wrapper_runs_its_text_decoder(muse):
    model, wrapped, _, ref = muse
    loaded = check_decoder(wrapped, model, ref)
    assert loaded.spec.model_type == "muse_glimmer_text"
    assert loaded.spec.names["q"].startswith(MUSE_PREFIX + "layers.") and loaded.spec.names["head"] == "lm_head"
    names = set(loaded.decoder._weights.names())
    assert any(n.startswith("model.vision_tower.") for n in names)  # there, and never read


def test_muse_glimmer_native_query_scale(muse, tmp_path):
    """scale_query_by (the native schema) at least sqrt(head_dim) is divided by it: 2.5 * 4 reads as 2.5."""
    model, wrapped, _, ref = muse
    text = _text_only(wrapped, tmp_path, MUSE_PREFIX, config_changes={"qk_scale_factor": None, "scale_query_by": 10.0})
    check_decoder(text, model, ref, greedy=False)


def test_muse_glimmer_without_output_gate(muse, tmp_path):
    """use_attn_output_gate false: Transformers' model with a zero gate_proj (a gate of 1/2 everywhere) is
    ster's without a gate and with o_proj halved."""
    import torch

    model, wrapped, _, _ = muse
    ref_model = copy.deepcopy(model)
    with torch.no_grad():
        for layer in ref_model.model.language_model.layers:
            layer.self_attn.gate_proj.weight.zero_()
    halve = {f"model.layers.{i}.self_attn.o_proj.weight": 0.5 for i in range(MUSE_TEXT["num_hidden_layers"])}
    text = _text_only(wrapped, tmp_path, MUSE_PREFIX, config_changes={"use_attn_output_gate": False},
                      drop=("self_attn.gate_proj.weight",), scale=halve)
    check_decoder(text, ref_model)


def test_muse_glimmer_without_qk_norm(muse, tmp_path):
    """use_qk_norm false: no per-head norm and no query multiplier (Transformers' model with its q/k norm
    made the identity and qk_scale_factor 1)."""
    import torch

    model, wrapped, _, _ = muse
    ref_model = copy.deepcopy(model)
    for layer in ref_model.model.language_model.layers:
        layer.self_attn.qk_norm = torch.nn.Identity()
        layer.self_attn.qk_scale_factor = 1.0
    text = _text_only(wrapped, tmp_path, MUSE_PREFIX, config_changes={"use_qk_norm": False})
    check_decoder(text, ref_model)


def test_muse_glimmer_defaults_follow_transformers_config():
    """Without layer_types / layer_rope_theta, the layer kinds and rotations are those Transformers'
    MuseGlimmerTextConfig derives (every 4th layer back from the last: full and unrotated)."""
    from transformers import AutoConfig

    from ster_py.config import spec_from_config

    config = dict(BASE, model_type="muse_glimmer_text", num_hidden_layers=9, sliding_window=8)
    ref = AutoConfig.for_model(**config)
    spec = spec_from_config(config, FAMILIES["muse_glimmer_text"])
    assert ["sliding_attention" if layer.sliding_window else "full_attention" for layer in spec.layers] \
        == ref.layer_types
    for layer, theta in zip(spec.layers, ref.layer_rope_theta):
        assert (layer.rope is None) == (theta == 0)
        if theta:
            np.testing.assert_allclose(layer.rope.inv_freq, 1.0 / theta ** (np.arange(0, 16, 2) / 16), rtol=1e-12)
    assert spec.final_softcap == ref.final_logit_softcapping and spec.logit_scale == ref.output_multiplier
    assert spec.attn_scale == pytest.approx(ref.qk_scale_factor / math.sqrt(16))
    assert spec.post_norm_eps == ref.post_norm_eps and spec.norm_eps == ref.rms_norm_eps


def test_muse_glimmer_refusals(tmp_path):
    """Bases Transformers would not use are refused before any weight is read (no weights here)."""
    config = dict(BASE, model_type="muse_glimmer_text", num_hidden_layers=2, layer_rope_theta=[10000.0, 5e5])
    with pytest.raises(SterError, match="layer_rope_theta"):
        gate(config, tmp_path / "config.json")
    (tmp_path / "config.json").write_text(json.dumps(config))
    write_tokenizer(tmp_path, VOCAB)
    with pytest.raises(SterError, match="layer_rope_theta"):
        load_model(str(tmp_path))




@pytest.fixture(scope="module")
def muse_gguf(muse, tmp_path_factory):
    """The wrapped Muse Glimmer checkpoint through llama.cpp's own convert_hf_to_gguf.py (f32)."""
    import subprocess
    import sys

    from llamacpp_convert import PREFIX, extract_converter

    root = tmp_path_factory.mktemp("muse_gguf")
    extract_converter(root)
    out = root / "muse.gguf"
    r = subprocess.run([sys.executable, str(root / "convert.py"), str(root / PREFIX), "f32", f"{muse[1]}::{out}"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"llama.cpp's convert_hf_to_gguf.py failed: {r.stderr[-2000:]}", pytrace=False)
    return out


def test_muse_glimmer_gguf_from_llamacpps_converter_matches_transformers(muse, muse_gguf):
    """llama.cpp's muse-glimmer file: the query scale as q-norm weights, the rows reordered for its adjacent-pair
    rotation (undone at load), the sliding layers alone rotating; its output norms at llama.cpp's fixed 1e-8
    (the checkpoint says 1e-6: a difference far below the tolerance)."""
    model, _, _, ref = muse
    loaded = check_decoder(muse_gguf, model, ref)
    spec = loaded.spec
    assert spec.extra["gguf_architecture"] == "muse-glimmer" and spec.qk_norm_affine
    assert spec.attn_scale == pytest.approx(16 ** -0.5) and spec.post_norm_eps == 1e-8
    assert [(layer.sliding_window, layer.rope is not None) for layer in spec.layers] == [(4, True), (4, True),
                                                                                         (None, False)]


# ----------------------------------------------------------------------------- MiniMax-M3

M3_TEXT = dict(BASE, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, dense_intermediate_size=48,
               shared_intermediate_size=24, partial_rotary_factor=0.5, mlp_layer_types=["dense", "sparse", "sparse"],
               layer_types=["full_attention", "minimax_m3_sparse", "minimax_m3_sparse"], index_n_heads=2,
               index_head_dim=16, index_block_size=2, index_topk_blocks=3, index_local_blocks=2, swiglu_limit=0.8,
               routed_scaling_factor=1.5)
M3_VISION = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2)
M3_PREFIX = "language_model."


@pytest.fixture(scope="module")
def minimax_m3(tmp_path_factory):
    """(wrapper model, wrapped checkpoint, text-only checkpoint, the wrapper's logits on PROMPT); the routers'
    selection biases (buffers) drawn too. The checkpoints are in the hub's layout, which Transformers' save
    writes back through its minimax_m3_vl conversion mapping."""
    import torch

    root = tmp_path_factory.mktemp("m3")
    model = _wrapper(root / "wrapped", "minimax_m3_vl", "minimax_m3_vl_text", M3_TEXT, M3_VISION,
                     projector_hidden_size=32)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.1)
    model.save_pretrained(root / "wrapped")
    text = _text_only(root / "wrapped", root / "text", M3_PREFIX, stem="")
    return model, root / "wrapped", text, _reference(model, PROMPT)


def test_minimax_m3_text_matches_transformers(minimax_m3):
    from ster_py.decoder.block_sparse import kept_keys

    model, _, text, ref = minimax_m3
    loaded = check_decoder(text, model, ref)
    spec = loaded.spec
    assert [(layer.mixer, layer.ffn) for layer in spec.layers] == [("attention", "dense"), ("block_sparse", "moe"),
                                                                   ("block_sparse", "moe")]
    assert {layer.rope.rotary_dim for layer in spec.layers} == {8}
    assert spec.ffn_glu == spec.moe.glu == "oai" and spec.ffn_limit == spec.moe.limit == 0.8
    cache = loaded.decoder.new_cache()
    loaded.decoder.forward(PROMPT, cache)
    assert cache.nbytes_per_position() == 4 * (3 * 2 * 2 * 16 + 2 * 16)  # keys, values, and 2 index keys
    from ster_py.inspect import inspect_model

    assert inspect_model(str(text))["kv_bytes_per_position"] == cache.nbytes_per_position()
    # the prompt is long enough for the blocks to be chosen: some visible keys are dropped
    rng = np.random.default_rng(0)
    keep = kept_keys(rng.standard_normal((2, 16, 16)).astype(np.float32),
                     rng.standard_normal((16, 16)).astype(np.float32), np.arange(16), spec.block_sparse)
    visible = np.tril(np.ones((16, 16), bool))
    # from the fourth block on, 3 blocks of 2 keys are kept (the query's own block holds 1 visible key at an
    # even position)
    assert keep is not None and (keep <= visible).all()
    assert (keep.sum(-1)[:, 6:] == np.where(np.arange(6, 16) % 2, 6, 5)).all()
    assert keep[:, np.arange(16), np.arange(16)].all() and keep[:, 15, 12:].all()  # own and local blocks


def test_minimax_m3_sparse_choice_matters(minimax_m3, tmp_path):
    """The same weights with every block kept (index_topk_blocks 64) give other logits: the test above
    checks the choice, not dense attention."""
    model, wrapped, _, ref = minimax_m3
    text = _text_only(wrapped, tmp_path, M3_PREFIX, stem="", config_changes={"index_topk_blocks": 64})
    assert rel_err(load_model(str(text)).decoder.forward(PROMPT), ref) > 1e-3


def test_minimax_m3_wrapper_runs_its_text_decoder(minimax_m3):
    model, wrapped, _, ref = minimax_m3
    loaded = check_decoder(wrapped, model, ref, greedy=False)
    assert loaded.spec.model_type == "minimax_m3_vl_text"
    assert loaded.spec.names["head"] == "language_model.lm_head"
    assert loaded.spec.names["index_q"].startswith("language_model.model.layers.")
    assert any(n.startswith("vision_tower.") for n in loaded.decoder._weights.names())  # there, never read


def test_minimax_m3_named_by_architecture_and_sparse_attention_config(minimax_m3, tmp_path):
    """A config without model_type naming MiniMaxM3SparseForCausalLM, in the hub's spellings
    (sparse_attention_config, moe_layer_freq, swigluoai), is the same model."""
    model, wrapped, _, ref = minimax_m3
    text = _text_only(wrapped, tmp_path, M3_PREFIX, stem="")
    config = json.loads((text / "config.json").read_text())
    for key in ("model_type", "layer_types", "mlp_layer_types", *(k for k in config if k.startswith("index_"))):
        config.pop(key, None)
    config.update(architectures=["MiniMaxM3SparseForCausalLM"], hidden_act="swigluoai", moe_layer_freq=[0, 1, 1],
                  use_gemma_norm=True, use_qk_norm=True, qk_norm_type="per_head", scoring_func="sigmoid",
                  n_shared_experts=1, attention_output_gate=False,
                  sparse_attention_config=dict(sparse_attention_freq=[0, 1, 1], sparse_num_index_heads=2,
                                               sparse_index_dim=16, sparse_block_size=2, sparse_topk_blocks=3,
                                               sparse_local_block=2, sparse_score_type="max",
                                               sparse_disable_index_value=1, sparse_init_block=0))
    (text / "config.json").write_text(json.dumps(config))
    check_decoder(text, model, ref, greedy=False)


@pytest.mark.parametrize("change", [
    {"hidden_act": "gelu"}, {"attention_output_gate": True}, {"use_gemma_norm": False}, {"use_qk_norm": False},
    {"qk_norm_type": "per_layer"}, {"scoring_func": "softmax"}, {"n_shared_experts": 2},
    {"sparse_attention_config": {"sparse_score_type": "mean"}}, {"sparse_attention_config": {"sparse_init_block": 1}},
    {"sparse_attention_config": {"sparse_disable_index_value": 0}}, {"index_n_heads": 1},
    {"index_head_dim": 4}, {"layer_types": ["full_attention", "sliding_attention", "minimax_m3_sparse"]}])
def test_minimax_m3_refusals(change, tmp_path):
    """Each configuration seed 002 refuses by name is refused before any weight is read (none is here)."""
    config = dict(M3_TEXT, model_type="minimax_m3_vl_text", **change)
    (tmp_path / "config.json").write_text(json.dumps(config))
    write_tokenizer(tmp_path, VOCAB)
    with pytest.raises(SterError, match="refuses this configuration before reading any weight"):
        load_model(str(tmp_path))



# ----------------------------------------------------------------------------- Inkling

INK_TEXT = dict(BASE, intermediate_size=48, swa_num_attention_heads=2, swa_num_key_value_heads=1, swa_head_dim=8,
                sliding_window_size=4, d_rel=3, rel_extent=6, log_scaling_n_floor=4, moe_intermediate_size=24,
                n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=2, mlp_layer_types=["dense", "sparse", "sparse"],
                local_layer_ids=[1], route_scale=2.0, logits_mup_width_multiplier=3.0, unpadded_vocab_size=120)
INK_PREFIX = "model.llm."


@pytest.fixture(scope="module")
def inkling(tmp_path_factory):
    """(wrapper model, wrapped checkpoint, text-only checkpoint, the wrapper's logits on PROMPT): Thinking
    Machines' layout below model.llm (Transformers' save writes it back through its conversion mapping),
    norms and global scales drawn around one, the routers' selection biases drawn too."""
    import torch

    root = tmp_path_factory.mktemp("inkling")
    model = _wrapper(root / "wrapped", "inkling_mm_model", "inkling_text", INK_TEXT,
                     dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, patch_size=4),
                     unit_norms=("norm.weight", "global_scale"), audio_config={})
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.1)
    model.save_pretrained(root / "wrapped")
    text = _text_only(root / "wrapped", root / "text", INK_PREFIX, stem=INK_PREFIX)
    return model, root / "wrapped", text, _reference(model, PROMPT)


def test_inkling_text_matches_transformers(inkling):
    model, _, text, ref = inkling
    assert ref.shape == (len(PROMPT), 120)  # the head's padded rows are not scored
    loaded = check_decoder(text, model, ref)
    spec = loaded.spec
    assert [(layer.mixer, layer.ffn, layer.sliding_window) for layer in spec.layers] == [
        ("relative", "dense", None), ("relative", "moe", 4), ("relative", "moe", None)]
    assert spec.attention_shape(1) == (2, 1, 8, 8) and spec.attention_shape(0) == (4, 2, 16, 16)
    assert spec.moe.router.sink == 2 and spec.logits_kept == 120
    cache = loaded.decoder.new_cache()
    # K - 1 = 3 rows of float32 each: the two output convolutions (64 wide), keys' and values' (kv * head_dim)
    assert cache.nbytes_fixed() == 2 * 4 * 3 * (2 * 64 + 2 * 32) + 4 * 3 * (2 * 64 + 2 * 8)
    from ster_py.inspect import inspect_model

    info = inspect_model(str(text))
    assert info["state_bytes_per_sequence"] == cache.nbytes_fixed() == spec.state_bytes()
    assert info["kv_bytes_per_position"] == cache.nbytes_per_position()


def test_inkling_wrapper_runs_its_text_decoder(inkling):
    model, wrapped, _, ref = inkling
    loaded = check_decoder(wrapped, model, ref, greedy=False)
    assert loaded.spec.model_type == "inkling_text" and loaded.spec.names["head"] == "model.llm.unembed"
    assert any(n.startswith("model.visual.") for n in loaded.decoder._weights.names())  # there, never read


def test_inkling_thinking_machines_config_spellings(inkling, tmp_path):
    """Thinking Machines' own config (dense_intermediate_size the dense width, intermediate_size the experts',
    sconv_kernel_size, dense_mlp_idx, local_layer_ids without layer_types) reads as Transformers reads it."""
    model, wrapped, _, ref = inkling
    text = _text_only(wrapped, tmp_path, INK_PREFIX, stem=INK_PREFIX)
    config = json.loads((text / "config.json").read_text())
    for key in ("layer_types", "mlp_layer_types", "moe_intermediate_size", "conv_kernel_size"):
        config.pop(key)
    config.update(dense_intermediate_size=48, intermediate_size=24, sconv_kernel_size=4, dense_mlp_idx=1)
    (text / "config.json").write_text(json.dumps(config))
    check_decoder(text, model, ref, greedy=False)


def test_inkling_pieces_against_their_definitions():
    """The relative bias and the log scaling against a direct loop over the seed's words."""
    from ster_py.decoder.relative import log_scale, relative_bias

    rng = np.random.default_rng(0)
    r = rng.standard_normal((3, 2, 4)).astype(np.float32)
    profiles = rng.standard_normal((4, 5)).astype(np.float32)
    positions = np.array([6, 7, 8])
    bias = relative_bias(r, profiles, positions, 9)
    for h in range(2):
        for t, p in enumerate(positions):
            for j in range(9):
                d = p - j
                want = float(r[t, h] @ profiles[:, d]) if 0 <= d < 5 else 0.0
                assert bias[h, t, j] == pytest.approx(want, abs=1e-6)
    np.testing.assert_allclose(log_scale(np.array([0, 3, 9]), 4, 0.5), [1.0, 1.0, 1 + 0.5 * math.log(10 / 4)],
                               rtol=1e-6)


@pytest.mark.parametrize("change", [{"shared_expert_sink": False}, {"n_shared_experts": 0},
                                    {"layer_types": ["hybrid", "linear", "hybrid"]},
                                    # issue 17: were accepted
                                    {"unpadded_vocab_size": VOCAB + 1}, {"unpadded_vocab_size": 0},
                                    {"local_layer_ids": [3]}, {"local_layer_ids": [-1]}, {"local_layer_ids": ["1"]}])
def test_inkling_refusals(change, tmp_path):
    config = dict(INK_TEXT, model_type="inkling_text", **change)
    (tmp_path / "config.json").write_text(json.dumps(config))
    write_tokenizer(tmp_path, VOCAB)
    with pytest.raises(SterError, match="refuses this configuration before reading any weight") as caught:
        load_model(str(tmp_path))
    assert next(iter(change)) in str(caught.value)


# issue 17: numbers that must be positive, refused by name when the spec is checked (before any weight is read)
@pytest.mark.parametrize("base, model_type, key, value, words", [
    ("MUSE", "muse_glimmer_text", "post_norm_eps", 0.0, "post_norm_eps"),
    ("MUSE", "muse_glimmer_text", "post_norm_eps", -1e-6, "post_norm_eps"),
    ("M3", "minimax_m3_vl_text", "swiglu_limit", 0.0, "swiglu_limit"),
    ("M3", "minimax_m3_vl_text", "swiglu_limit", -7.0, "swiglu_limit"),
])
def test_positive_numbers_of_the_wrapped_families(base, model_type, key, value, words):
    from ster_py.config import spec_from_config
    from ster_py.validate import check_spec

    config = dict(MUSE_TEXT if base == "MUSE" else M3_TEXT, model_type=model_type, **{key: value})
    with pytest.raises(SterError, match=f"{words}.* must be a finite number above 0"):
        check_spec(spec_from_config(config, FAMILIES[model_type]), "config.json")


def test_inkling_refuses_adapters(inkling):
    assert FAMILIES["inkling_text"].adapters == "none"


def test_wrappers_of_this_group_are_registered():
    assert WRAPPERS["muse_glimmer"] == ("muse_glimmer_text", MUSE_PREFIX)
    assert WRAPPERS["minimax_m3_vl"] == ("minimax_m3_vl_text", M3_PREFIX)
    assert WRAPPERS["inkling_mm_model"] == ("inkling_text", INK_PREFIX)


def test_parity_command_has_a_reference_for_the_wrapped_decoders():
    """``ster parity --reference transformers`` builds these decoders' reference from their wrapper class
    (tests/test_parity_cmd.py::test_parity_of_a_wrapped_only_decoder)."""
    from ster_py.parity import WRAPPED_REFERENCES

    assert set(WRAPPED_REFERENCES) == {"muse_glimmer_text", "minimax_m3_vl_text", "inkling_text", "glm5_next_text"}
    assert {v[0] for v in WRAPPED_REFERENCES.values()} <= set(WRAPPERS)


def test_minimax_m3_fused_decode_step_equals_the_python_block(minimax_m3, tmp_path):
    """Quantized, MiniMax-M3's routed layers with dense attention take the fused one-token step (its norms
    are offsets from one, its rotation partial); it must equal the Python block, and the layers it cannot
    take (the oai dense unit, block-sparse attention) keep the Python block."""
    _, wrapped, _, _ = minimax_m3
    text = _text_only(wrapped, tmp_path, M3_PREFIX, stem="",
                      config_changes={"layer_types": ["full_attention", "full_attention", "minimax_m3_sparse"]})
    runs = []
    for fuse in (True, False):
        dec = load_model(str(text)).decoder
        dec.quantize("q8_0")
        dec.fuse_decode = fuse
        cache = dec.new_cache()
        runs.append(np.concatenate([dec.forward([t], cache) for t in PROMPT]))
        if fuse:
            assert [layer.decode_step() is not None for layer in dec.layers] == [False, True, False]
    np.testing.assert_array_equal(runs[0], runs[1])


# ----------------------------------------------------------------------------- issue 17: load-time shapes
def _with_tensor(src: Path, dst: Path, name: str, change) -> Path:
    """A copy of checkpoint ``src`` whose tensor ``name`` is ``change(array)``."""
    import shutil

    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, dst)
    for f in dst.glob("*.safetensors"):
        tensors = load_file(str(f))
        if name in tensors:
            tensors[name] = np.ascontiguousarray(change(tensors[name]))
            save_file(tensors, str(f), metadata={"format": "pt"})
            return dst
    raise AssertionError(f"{name} not in {src}")


@pytest.mark.parametrize("name, change", [
    ("model.language_model.layers.1.self_attn.index_q_proj.weight", lambda t: t[:-1]),
    ("model.language_model.layers.1.self_attn.index_k_proj.weight", lambda t: t[:, :-1]),
    ("model.language_model.layers.2.self_attn.index_q_norm.weight", lambda t: np.concatenate([t, t])),
])
def test_minimax_m3_index_branch_shapes_are_checked_at_load(minimax_m3, tmp_path, name, change):
    text = minimax_m3[2]
    if not any(name in n for n in _tensor_names(text)):
        name = name.replace("model.language_model.", "model.")
    path = _with_tensor(text, tmp_path / "m", name, change)
    with pytest.raises(SterError, match=rf"tensor '{re.escape(name)}' has shape .* but the configuration implies"):
        load_model(str(path))


@pytest.mark.parametrize("name, change", [
    ("model.llm.layers.0.attn.wr_du.weight", lambda t: t[:-1]),
    ("model.llm.layers.1.attn.rel_logits_proj.proj", lambda t: np.concatenate([t, t], axis=1)),  # a sliding layer
    ("model.llm.layers.0.attn.rel_logits_proj.proj", lambda t: t[:-1]),
    ("model.llm.layers.0.attn.k_sconv.weight", lambda t: t[..., :-1]),
    ("model.llm.layers.2.attn.v_sconv.weight", lambda t: t[:-1]),
    ("model.llm.layers.0.attn_sconv.weight", lambda t: np.concatenate([t, t], axis=-1)),
    ("model.llm.layers.1.mlp.gate.global_scale", lambda t: np.concatenate([t, t])),
    ("model.llm.layers.0.mlp.global_scale", lambda t: np.concatenate([t, t])),
])
def test_inkling_relative_and_convolution_shapes_are_checked_at_load(inkling, tmp_path, name, change):
    path = _with_tensor(inkling[2], tmp_path / "m", name, change)
    with pytest.raises(SterError, match=rf"tensor '{re.escape(name)}' has shape .* but the configuration implies"):
        load_model(str(path))


def _tensor_names(path: Path) -> list[str]:
    from safetensors import safe_open

    out = []
    for f in path.glob("*.safetensors"):
        with safe_open(str(f), "np") as h:
            out += list(h.keys())
    return out
