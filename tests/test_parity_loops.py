"""Looped decoders (issue 16, group LOOP): Nanbeige and IQuest-LoopCoder run their stored layers more
than once (seed 002, "Looped models"). Transformers implements neither, so the oracle is built:

- Nanbeige: a Transformers Llama (Qwen3 for the per-head q/k layernorms) of n * loops layers whose
  layer j + k * n holds a copy of layer j's weights, with Transformers' own final norm run after the
  last layer of every pass but the last unless skip_loop_final_norm (seed 002's words), is the looped
  model; the checkpoint stores only the first n layers under Nanbeige's names and config keys. At one
  loop it is plain Llama.
- IQuest-LoopCoder: at one loop, Llama; with the gate shut (g = sigmoid(-30)) and a window longer than
  the prompt, a Transformers Llama of duplicated layers (no norm between passes); with the gate open,
  a numpy reference of the whole forward written here from seed 002's words (global attention over the
  first pass's keys and values, local attention within loop_window_size over the pass's own, mixed by
  g = sigmoid(W_h . q_h + b_h) of each rotated query head).

Each case: logits of a 16-token prompt within 1e-4 (f32), the same through the cache in two pieces, 16
equal greedy tokens, every stored tensor read, one cache slot per executed layer.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from ster_py.decoder.loops import repeated
from ster_py.errors import SterError
from ster_py.families import FAMILIES, gate
from ster_py.generate import Sampling, generate
from ster_py.load import load_model
from tiny import check_against
from tiny import build_checkpoint, rel_err, reference_greedy, reference_logits, reference_split_logits
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)

VOCAB = 128
PROMPT = np.random.RandomState(5).randint(3, VOCAB, size=16).tolist()
LLAMA = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


def _stored_only(path, n: int, config: dict, rename=None, extra=None) -> None:
    """Keep the first ``n`` stored layers of the saved checkpoint (renamed by ``rename``, plus ``extra``
    tensors) and write ``config`` over its config.json."""
    from safetensors.numpy import load_file, save_file

    state = load_file(str(path / "model.safetensors"))
    out = {}
    for name, t in state.items():
        if name.startswith("model.layers.") and int(name.split(".")[2]) >= n:
            continue
        out[rename(name) if rename else name] = t
    out.update(extra or {})
    save_file(out, str(path / "model.safetensors"), metadata={"format": "pt"})
    saved = json.loads((path / "config.json").read_text())
    saved.update(config, num_hidden_layers=n)
    if isinstance(saved.get("layer_types"), list):  # Qwen3 lists one per oracle layer: the stored ones'
        saved["layer_types"] = saved["layer_types"][:n]
    (path / "config.json").write_text(json.dumps(saved))


def _loop_transformers(model, n: int, loops: int, norm_between: bool) -> None:
    """Make ``model`` (n * loops layers) the looped model: layer j + k * n takes layer j's weights, and,
    with ``norm_between``, the model's final norm follows the last layer of each pass but the last."""
    import torch

    layers = model.model.layers
    with torch.no_grad():
        for k in range(1, loops):
            for j in range(n):
                layers[j + k * n].load_state_dict(layers[j].state_dict())
    if norm_between:
        norm = model.model.norm

        class NormAfter(torch.nn.Module):
            def __init__(self, layer):
                super().__init__()
                self.layer = layer

            def forward(self, *args, **kwargs):
                return norm(self.layer(*args, **kwargs))

        for k in range(loops - 1):
            layers[(k + 1) * n - 1] = NormAfter(layers[(k + 1) * n - 1])


# ------------------------------------------------------------------ Nanbeige
def _nanbeige(path, loops: int, qk: bool = False, skip: bool = False):
    n = LLAMA["num_hidden_layers"]
    base = dict(LLAMA, num_hidden_layers=n * loops)
    if qk:  # Qwen3 is Llama with per-head q/k RMS norms before the rotation
        model = build_checkpoint(path, "qwen3", dict(base, head_dim=16))
    else:
        model = build_checkpoint(path, "llama", base)
    _loop_transformers(model, n, loops, norm_between=not skip)

    def rename(name):
        return name.replace(".self_attn.q_norm.", ".self_attn.q_layernorm.").replace(
            ".self_attn.k_norm.", ".self_attn.k_layernorm.")

    own = {"model_type": "nanbeige", "architectures": ["NanbeigeForCausalLM"], "num_loops": loops,
           "skip_loop_final_norm": skip, "qk_layernorm": qk, "loop_loss_weights": [],
           "enable_hyper_connection": False, "enable_depth_attention": False, "loop_share_kv": False}
    _stored_only(path, n, own, rename)
    return model


NANBEIGE = {"nanbeige-one-loop": dict(loops=1), "nanbeige-two-loops": dict(loops=2),
            "nanbeige-three-loops-qk-norm-no-norm-between": dict(loops=3, qk=True, skip=True),
            "nanbeige-two-loops-qk-norm": dict(loops=2, qk=True)}


def _check(model, ref, n_exec: int) -> None:
    """ster against a Transformers oracle: logits, split cache, greedy tokens, tensors, cache slots."""
    assert model.spec.num_hidden_layers == n_exec and len(model.decoder.layers) == n_exec
    check_against(model, ref, PROMPT)


@pytest.mark.parametrize("case", list(NANBEIGE))
def test_nanbeige_matches_its_oracle(case, tmp_path):
    kw = NANBEIGE[case]
    ref = _nanbeige(tmp_path, **kw)
    model = load_model(str(tmp_path))
    assert model.spec.model_type == "nanbeige"
    _check(model, ref, LLAMA["num_hidden_layers"] * kw["loops"])
    # each pass's layers read the stored layers in order; every executed layer has its own cache slot
    assert [layer.stored for layer in model.spec.layers] == list(range(LLAMA["num_hidden_layers"])) * kw["loops"]
    cache = model.decoder.new_cache()
    model.decoder.forward(PROMPT[:3], cache)
    assert cache.nbytes_per_position() == kw["loops"] * 2 * LLAMA["num_hidden_layers"] * 2 * 16 * 4


def test_a_pass_has_its_own_steering_and_capture_layers(tmp_path):
    """A hook on executed layer n + j (the second pass) sees a different stream from one on layer j, and
    hidden states count every pass's layers."""
    _nanbeige(tmp_path, loops=2)
    model = load_model(str(tmp_path))
    seen: dict[int, np.ndarray] = {}
    hidden: list = []

    def hook(i, h):
        seen[i] = h.copy()
        return h

    model.decoder.forward(PROMPT, hidden_states=hidden, layer_hook=hook)
    assert sorted(seen) == [0, 1, 2, 3] and len(hidden) == 5
    assert not np.allclose(seen[0], seen[2])
    # steering one pass's layer changes the output; the other pass's same stored layer is untouched
    base = model.decoder.forward(PROMPT)
    steered = model.decoder.forward(PROMPT, layer_hook=lambda i, h: h + 0.5 if i == 3 else h)
    assert not np.allclose(base, steered)


def test_quantized_passes_share_their_blocks_and_take_the_fused_step(tmp_path):
    """--quantize makes one set of blocks per stored matrix, which every pass reads; decoding through the
    fused one-token step gives the Python blocks' tokens."""
    _nanbeige(tmp_path, loops=2)
    model = load_model(str(tmp_path))
    counts = model.decoder.quantize("q8_0")
    assert sum(counts.values()) == 2 * 7 + 1  # the stored layers' q, k, v, o, gate, up, down and the head
    first, second = model.decoder.layers[0], model.decoder.layers[2]
    assert first.q._m is second.q._m and first.down._m is second.down._m
    assert first.decode_step() is not None and second.decode_step() is not None
    fused = generate(model.decoder, PROMPT, Sampling(max_new_tokens=8)).ids
    model.decoder.fuse_decode = False
    assert generate(model.decoder, PROMPT, Sampling(max_new_tokens=8)).ids == fused


@pytest.mark.parametrize("config,match", [
    ({"emb_neighbor_num": 2}, "n-gram embeddings"),
    ({"insert_ngram_layer_idx": [1]}, "n-gram embeddings"),
    ({"enable_hyper_connection": True}, "hyper-connections"),
    ({"enable_mhc": True}, "hyper-connections"),
    ({"enable_double_loop_split": True}, "split loops"),
    ({"loop_share_kv": True}, "shared loop caches"),
    ({"enable_depth_attention": True}, "depth attention"),
])
def test_nanbeige_refusals(config, match):
    config = {"model_type": "nanbeige", **LLAMA, "num_loops": 2, **config}
    with pytest.raises(SterError, match=match):
        gate(config, "config.json")


def test_adapters_are_refused_on_looped_models(tmp_path):
    from pathlib import Path

    from ster_py.adapters import LoraAdapter, check_adapter_for

    _nanbeige(tmp_path, loops=2)
    model = load_model(str(tmp_path))
    ad = LoraAdapter(path=Path("a.safetensors"), layout="ster", model=None, model_revision=None, rank=2, alpha=2.0,
                     rslora=False, hidden_size=64,
                     factors={(0, "q"): (np.zeros((2, 64), np.float32), np.zeros((64, 2), np.float32))})
    with pytest.raises(SterError, match="looped"):
        check_adapter_for(ad, None, model.spec, lambda role: True)


# ------------------------------------------------------------------ IQuest-LoopCoder
def _iquest_llama(path, loops: int, window: int, gate_bias: float | None = None):
    """loop_num 1: Llama. Otherwise a Transformers Llama of duplicated layers, which is the looped model
    when the gate is shut (``gate_bias`` -30) and the window covers the prompt."""
    n = LLAMA["num_hidden_layers"]
    model = build_checkpoint(path, "llama", dict(LLAMA, num_hidden_layers=n * loops))
    _loop_transformers(model, n, loops, norm_between=False)
    rng = np.random.RandomState(7)
    extra = {}
    if loops > 1:
        for j in range(n):
            extra[f"model.gate_projections.{j}.weight"] = (rng.randn(4, 16) * 0.3).astype(np.float32)
            extra[f"model.gate_projections.{j}.bias"] = np.full(4, gate_bias, np.float32)
    _stored_only(path, n, {"model_type": "iquestloopcoder", "architectures": ["IQuestLoopCoderForCausalLM"],
                           "loop_num": loops, "loop_window_size": window}, extra=extra)
    return model


def test_iquestloopcoder_at_one_loop_is_llama(tmp_path):
    ref = _iquest_llama(tmp_path, loops=1, window=4)
    _check(load_model(str(tmp_path)), ref, LLAMA["num_hidden_layers"])


def test_iquestloopcoder_with_the_gate_shut_is_llama_run_twice(tmp_path):
    ref = _iquest_llama(tmp_path, loops=2, window=64, gate_bias=-30.0)
    _check(load_model(str(tmp_path)), ref, 2 * LLAMA["num_hidden_layers"])


# A numpy reference of IQuest-LoopCoder from seed 002's words (independent of ster's decoder).
def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rotate(x, pos, theta=10000.0):
    """Rotate-half RoPE on x [T, heads, d] at positions pos [T]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
    ang = pos[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1))[:, None], np.sin(np.concatenate([ang, ang], -1))[:, None]
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    return x * cos + np.concatenate([-x2, x1], -1) * sin


def _attend(q, k, v, window=None):
    """q [T, H, d], k/v [T, KV, d]: causal (and windowed: key j seen by query p when p - j < window)."""
    T, H, d = q.shape
    rep = H // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = np.einsum("thd,shd->hts", q, k) / np.sqrt(d)
    p, j = np.arange(T)[:, None], np.arange(T)[None, :]
    ok = j <= p if window is None else (j <= p) & (p - j < window)
    s = np.where(ok[None], s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    return np.einsum("hts,shd->thd", s, v)


def iquest_reference(w: dict, cfg: dict, ids) -> np.ndarray:
    """Logits float64 [T, vocab]: Llama's blocks run loop_num times; on every later pass a layer's
    attention is g * global + (1 - g) * local, global over the first pass's keys and values of the same
    layer, local over the pass's own within loop_window_size, g = sigmoid(W_h . q_h + b_h) per head of
    the rotated query (model.gate_projections.{layer}); the final norm and head at the end."""
    eps, n, H, KV = cfg["rms_norm_eps"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg["hidden_size"] // H
    W = {k: v.astype(np.float64) for k, v in w.items()}
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    h = W["model.embed_tokens.weight"][ids]
    first = {}
    for loop in range(cfg["loop_num"]):
        for i in range(n):
            p = f"model.layers.{i}."
            x = _rms(h, W[p + "input_layernorm.weight"], eps)
            q = _rotate((x @ W[p + "self_attn.q_proj.weight"].T).reshape(T, H, d), pos)
            k = _rotate((x @ W[p + "self_attn.k_proj.weight"].T).reshape(T, KV, d), pos)
            v = (x @ W[p + "self_attn.v_proj.weight"].T).reshape(T, KV, d)
            if loop == 0:
                first[i] = (k, v)
                a = _attend(q, k, v)
            else:
                gw, gb = W[f"model.gate_projections.{i}.weight"], W[f"model.gate_projections.{i}.bias"]
                g = 1 / (1 + np.exp(-(np.einsum("thd,hd->th", q, gw) + gb)))[..., None]
                a = g * _attend(q, *first[i]) + (1 - g) * _attend(q, k, v, cfg["loop_window_size"])
            h = h + a.reshape(T, H * d) @ W[p + "self_attn.o_proj.weight"].T
            x = _rms(h, W[p + "post_attention_layernorm.weight"], eps)
            gate_, up = x @ W[p + "mlp.gate_proj.weight"].T, x @ W[p + "mlp.up_proj.weight"].T
            h = h + (gate_ / (1 + np.exp(-gate_)) * up) @ W[p + "mlp.down_proj.weight"].T
    return _rms(h, W["model.norm.weight"], eps) @ W["lm_head.weight"].T


@pytest.mark.parametrize("loops,window", [(2, 5), (3, 3)])
def test_iquestloopcoder_gate_matches_the_numpy_reference(loops, window, tmp_path):
    from safetensors.numpy import load_file

    _iquest_llama(tmp_path, loops=loops, window=window, gate_bias=0.2)
    weights = load_file(str(tmp_path / "model.safetensors"))
    cfg = json.loads((tmp_path / "config.json").read_text())
    model = load_model(str(tmp_path))
    assert model.spec.num_hidden_layers == loops * LLAMA["num_hidden_layers"]
    ref = iquest_reference(weights, cfg, PROMPT)
    assert rel_err(model.decoder.forward(PROMPT), ref) < 1e-4
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:9], cache), model.decoder.forward(PROMPT[9:], cache)])
    assert rel_err(pieces, ref) < 1e-4
    ids, want = list(PROMPT), []
    for _ in range(16):  # greedy from the reference, every prefix recomputed (the model is causal)
        want.append(int(iquest_reference(weights, cfg, ids + want)[-1].argmax()))
    assert generate(model.decoder, PROMPT, Sampling(max_new_tokens=16)).ids == want
    assert model.decoder._weights.unused_tensors(model.spec) == []
    # the gate matters: shut, the logits differ
    assert rel_err(iquest_reference({**weights, **{f"model.gate_projections.{j}.bias": np.full(4, -30.0)
                                                  for j in range(2)}}, cfg, PROMPT), ref) > 1e-3


def test_these_families_say_they_have_no_reference_here():
    from typer.testing import CliRunner

    from ster_py.cli import app

    rows = json.loads(CliRunner().invoke(app, ["families", "--json"]).stdout)
    notes = {r["model_type"]: r for r in rows}
    for model_type in ("nanbeige", "iquestloopcoder"):
        assert FAMILIES[model_type].unconfirmed and notes[model_type]["note"] == "no reference implementation here"


# ------------------------------------------------------------------ HRM-Text (Transformers' own oracle)
HRM = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
           head_dim=16, max_position_embeddings=64)
HRM_CASES = {"hrm-2x2-prefix-lm": dict(H_cycles=2, L_cycles=2),
             "hrm-1x3-causal": dict(H_cycles=1, L_cycles=3, prefix_lm=False)}


def _hrm_greedy(ref, ids, n: int, prefix_lm: bool) -> list[int]:
    """Transformers' greedy continuation, the prompt marked with token_type_ids of ones under prefix_lm
    (the model card's way: it attends both ways), each decoded token causal through the cache."""
    import torch

    out, past, feed = [], None, list(ids)
    with torch.no_grad():
        for step in range(n):
            kw = {"token_type_ids": torch.ones(1, len(feed), dtype=torch.long)} if prefix_lm and step == 0 else {}
            res = ref(torch.tensor([feed]), past_key_values=past, use_cache=True, **kw)
            past = res.past_key_values
            feed = [int(res.logits[0, -1].argmax())]
            out.append(feed[0])
    return out


@pytest.mark.parametrize("case", list(HRM_CASES))
def test_hrm_text_matches_transformers(case, tmp_path):
    import torch

    kw = HRM_CASES[case]
    ref = build_checkpoint(tmp_path, "hrm_text", dict(HRM, **kw))
    model = load_model(str(tmp_path))
    n_exec = HRM["num_hidden_layers"] * kw["H_cycles"] * (kw["L_cycles"] + 1)  # 2 stacks' passes, own slots
    assert model.spec.num_hidden_layers == n_exec == ref.config.num_hidden_layers
    assert model.spec.prefix_lm == kw.get("prefix_lm", True)
    # passes that score every position are causal
    causal = reference_logits(ref, PROMPT)[0]
    err = rel_err(model.decoder.forward(PROMPT), causal)
    assert err < 1e-4, f"logits rel err {err:.2e}"
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:9], cache), model.decoder.forward(PROMPT[9:], cache)])
    assert rel_err(pieces, reference_split_logits(ref, PROMPT, 9)) < 1e-4
    # a prompt read whole from position zero attends both ways (under prefix_lm)
    with torch.no_grad():
        both = ref(torch.tensor([PROMPT]), token_type_ids=torch.ones(1, len(PROMPT), dtype=torch.long)).logits[0]
    ours = model.decoder.forward(PROMPT, bidirectional=True)
    if model.spec.prefix_lm:
        assert rel_err(ours, both.numpy()) < 1e-4 and rel_err(both.numpy(), causal) > 1e-2
    else:
        assert rel_err(ours, causal) < 1e-4
    assert (generate(model.decoder, PROMPT, Sampling(max_new_tokens=16)).ids
            == _hrm_greedy(ref, PROMPT, 16, model.spec.prefix_lm))
    # a prompt cache reuses nothing of an earlier prompt when prompts attend both ways (a later token changes
    # the earlier ones' keys); its logits are a fresh prompt's
    from ster_py.prefix import PromptCache

    pc = PromptCache(model.decoder)
    pc.prefill(PROMPT[:10])
    last = pc.prefill(PROMPT)
    assert pc.reused == (0 if model.spec.prefix_lm else 10)
    assert rel_err(last[None], ours[-1:]) < 1e-5
    assert model.decoder._weights.unused_tensors(model.spec) == []
    # each pass has its own steering/capture layer: hidden states count every pass's layers
    hidden: list = []
    model.decoder.forward(PROMPT[:4], hidden_states=hidden)
    assert len(hidden) == n_exec + 1
    # the passes of a stack read one array per stored matrix (split from gqkv_proj / gate_up_proj too),
    # quantized once
    n = HRM["num_hidden_layers"]
    first, later = model.decoder.layers[0], model.decoder.layers[n]  # the low stack's first two passes
    assert first.q.weight is later.q.weight and first.gate.weight is later.gate.weight
    model.decoder.quantize("q8_0")
    assert first.q._m is later.q._m and first.up._m is later.up._m


@pytest.mark.parametrize("config,match", [({"attention_bias": True}, "attention_bias"),
                                          ({"mlp_bias": True}, "mlp_bias")])
def test_hrm_text_refusals(config, match):
    with pytest.raises(SterError, match=match):
        gate({"model_type": "hrm_text", **HRM, **config}, "config.json")


# name: (model_type, config, legacy keys); Nanbeige's checkpoint is built by _nanbeige (num_loops from here)
GGUF_CASES = {"hrm": ("hrm_text", dict(HRM, H_cycles=2, L_cycles=2), {}),
              "nanbeige": ("nanbeige", dict(LLAMA, num_loops=2), {})}


def _build_gguf_case(path, model_type: str, config: dict):
    if model_type == "nanbeige":
        return _nanbeige(path, loops=config["num_loops"])
    return build_checkpoint(path, model_type, config)


@pytest.fixture(scope="module")
def gguf_models(tmp_path_factory):
    from llamacpp_convert import convert_cases

    return convert_cases(tmp_path_factory.mktemp("llama_cpp"), GGUF_CASES, _build_gguf_case)


def test_nanbeige_gguf_from_llamacpps_converter(gguf_models):
    """llama.cpp's converter writes Nanbeige as its stored layers plus num_loops (q/k rows permuted as Llama's);
    ster runs the file as the looped oracle, and as llama.cpp itself does (an independent reading of the loop)."""
    from ster_py import llamacpp

    path, ref = gguf_models["nanbeige"]
    model = load_model(str(path))
    assert model.resolved.kind == "gguf" and model.spec.model_type == "nanbeige"
    assert model.spec.num_hidden_layers == 2 * LLAMA["num_hidden_layers"]
    ours = model.decoder.forward(PROMPT)
    assert rel_err(ours, reference_logits(ref, PROMPT)[0]) < 1e-4
    assert generate(model.decoder, PROMPT, Sampling(max_new_tokens=16)).ids == reference_greedy(ref, PROMPT, 16)
    assert model.decoder._weights.unused_tensors(model.spec) == []
    # llama.cpp's kernels stay within ~1e-3 of the float32 math on this checkpoint already at one loop (its
    # plain Llama reading measured 1.0e-3), as for Gemma 4's files (5e-3 there); without the final norm between
    # the passes the logits are 0.6 away: the comparison tells the loop's joins apart
    (theirs,) = llamacpp.logits(path, [PROMPT])
    assert rel_err(ours, theirs) < 5e-3 and (ours.argmax(-1) == theirs.argmax(-1)).all()
    model.decoder.spec = dataclasses.replace(model.spec, loop=repeated(LLAMA["num_hidden_layers"], 2, False))
    assert rel_err(model.decoder.forward(PROMPT), theirs) > 0.05


def test_hrm_text_gguf_from_llamacpps_converter(gguf_models):
    """llama.cpp's converter writes the two stacks as one range of blocks (low, then high) and block_count as
    every pass's layers; ster runs the file as llama.cpp does (causally: its prefix-LM is not implemented)
    and matches Transformers' causal logits and greedy tokens, and llama.cpp's own logits."""
    from ster_py import llamacpp

    path, ref = gguf_models["hrm"]
    model = load_model(str(path))
    assert model.resolved.kind == "gguf" and model.spec.model_type == "hrm_text" and not model.spec.prefix_lm
    n = HRM["num_hidden_layers"]
    assert [layer.stored for layer in model.spec.layers] == ([0, 1] * 2 + [2, 3]) * 2 and model.spec.num_hidden_layers == 6 * n
    ours = model.decoder.forward(PROMPT)
    assert rel_err(ours, reference_logits(ref, PROMPT)[0]) < 1e-4
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(PROMPT[:9], cache), model.decoder.forward(PROMPT[9:], cache)])
    assert rel_err(pieces, reference_split_logits(ref, PROMPT, 9)) < 1e-4
    assert generate(model.decoder, PROMPT, Sampling(max_new_tokens=16)).ids == reference_greedy(ref, PROMPT, 16)
    assert model.decoder._weights.unused_tensors(model.spec) == []
    (theirs,) = llamacpp.logits(path, [PROMPT])
    assert rel_err(ours, theirs) < 1e-3 and (ours.argmax(-1) == theirs.argmax(-1)).all()
