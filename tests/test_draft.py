"""Speculative decoding with a drafter (issue 16): the output equals plain greedy decoding.

Oracles: transformers' greedy continuation of the tiny target (``reference_greedy``), which plain
greedy decoding by ster must equal first; then speculative decoding must give the same ids with a
drafter that always agrees, one that never agrees (k = 1..8 proposals per round), a random drafter
of another size, and the target itself as its own drafter (every proposal accepted); on a bfloat16
target (the few-row verification products) and on a hybrid target whose recurrent state is
restored after a rejection. Refusals: a drafter of another vocabulary, a temperature above 0
(generate, chat, serve).
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tiny import make_checkpoint, one_torch_thread, reference_greedy  # noqa: F401 (autouse fixture)

from ster_py.errors import SterError
from ster_py.generate import Sampling, generate
from ster_py.load import load_model
from ster_py.speculative import ModelDrafter

PROMPT = [1, 17, 42, 9, 88, 5, 23]
N = 24


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny llama target, a smaller random llama drafter of the same vocabulary, and the target's
    greedy continuation from transformers."""
    root = tmp_path_factory.mktemp("draft")
    ref = make_checkpoint(root / "target", "llama", seed=1)
    make_checkpoint(root / "drafter", "llama", seed=2, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1)
    greedy = reference_greedy(ref, PROMPT, N)
    target = load_model(str(root / "target"))
    drafter = load_model(str(root / "drafter"))
    return root, target, drafter, greedy


class _Scripted:
    """A test drafter that proposes the known greedy continuation (``agree``) or, at every place,
    an id other than it."""

    name = "scripted"

    def __init__(self, greedy: list[int], agree: bool, vocab: int):
        self.greedy, self.agree, self.vocab, self.calls = greedy, agree, vocab, 0

    def propose(self, history, k, hidden, cache):
        self.calls += 1
        done = len(history) - len(PROMPT)
        nxt = self.greedy[done:done + k]
        return list(nxt) if self.agree else [(t + 1) % self.vocab for t in nxt]


def test_plain_greedy_is_the_oracle(pair):
    _, target, _, greedy = pair
    assert generate(target.decoder, PROMPT, Sampling(max_new_tokens=N)).ids == greedy


@pytest.mark.parametrize("n_draft", [1, 4, 16])
def test_random_drafter_gives_greedy_output(pair, n_draft):
    _, target, drafter, greedy = pair
    d = ModelDrafter(drafter.decoder, target.spec.vocab_size)
    g = generate(target.decoder, PROMPT, Sampling(max_new_tokens=N), draft=d, n_draft=n_draft)
    assert g.ids == greedy
    assert 0 < g.drafted and 0 <= g.accepted <= g.drafted


def test_drafter_that_always_agrees(pair):
    _, target, _, greedy = pair
    d = _Scripted(greedy, True, target.spec.vocab_size)
    g = generate(target.decoder, PROMPT, Sampling(max_new_tokens=N), draft=d, n_draft=5)
    assert g.ids == greedy
    assert g.accepted == g.drafted > 0
    # the first id comes from the prefill; each round then emits its 5 proposals and one id more
    assert d.calls == -(-(N - 1) // 6)


def test_drafter_that_never_agrees(pair):
    _, target, _, greedy = pair
    d = _Scripted(greedy, False, target.spec.vocab_size)
    g = generate(target.decoder, PROMPT, Sampling(max_new_tokens=N), draft=d, n_draft=3)
    assert g.ids == greedy
    assert g.accepted == 0 and g.drafted > 0
    assert d.calls == N - 1  # one id per round: the target's own


@pytest.mark.parametrize("agree", [True, False], ids=["agrees", "disagrees"])
@pytest.mark.parametrize("n_draft", range(1, 9))
def test_scripted_drafters_every_round_size(pair, n_draft, agree):
    """k = 1..8 proposals per round, all accepted or all rejected: greedy output, and the rounds a
    verification of k + 1 rows (the few-row products) makes: ceil((N - 1) / (k + 1)) or N - 1."""
    _, target, _, greedy = pair
    d = _Scripted(greedy, agree, target.spec.vocab_size)
    g = generate(target.decoder, PROMPT, Sampling(max_new_tokens=N), draft=d, n_draft=n_draft)
    assert g.ids == greedy
    assert g.accepted == (g.drafted if agree else 0) and g.drafted > 0
    assert g.draft_rounds == (-(-(N - 1) // (n_draft + 1)) if agree else N - 1)
    if not agree:  # proposals per round: one fewer after each rejection, down to one (speculative._rounds)
        assert g.drafted == sum(max(1, n_draft - r) for r in range(N - 1))


@pytest.mark.parametrize("agree", [True, False, None], ids=["agrees", "disagrees", "model"])
def test_bf16_target_verifies_with_few_row_products(pair, agree):
    """The target's weights read as stored in bfloat16 (the Cython products): its verification calls run
    under qlinear.few_rows (each weight row read once for the k + 1 rows), and the output is still that
    model's plain greedy decoding, id for id."""
    from ster_py.decoder import qlinear

    root, _, drafter, _ = pair
    target = load_model(str(root / "target"), precision="bf16")
    assert isinstance(target.decoder.head, qlinear.QuantLinear)
    plain = generate(target.decoder, PROMPT, Sampling(max_new_tokens=N)).ids
    seen = []
    forward = target.decoder.forward

    def spy(ids, *a, **k):
        seen.append((len(ids), qlinear._few_rows))
        return forward(ids, *a, **k)

    target.decoder.forward = spy
    try:
        d = ModelDrafter(drafter.decoder, target.spec.vocab_size) if agree is None else \
            _Scripted(plain, agree, target.spec.vocab_size)
        g = generate(target.decoder, PROMPT, Sampling(max_new_tokens=N), draft=d, n_draft=4)
    finally:
        target.decoder.forward = forward
    assert g.ids == plain
    assert seen[0] == (len(PROMPT), 0)  # the prompt's prefill keeps the panels
    assert all(rows <= 5 and few == 12 for rows, few in seen[1:]) and any(rows > 1 for rows, _ in seen[1:])
    assert qlinear._few_rows == 0


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """A tiny Qwen3.5 target (gated delta-rule layers, whose recurrent state cannot be cut back, beside
    attention layers), loaded, and transformers' greedy continuation."""
    from test_parity_ssm_b2 import CASES
    from tiny import build_checkpoint

    root = tmp_path_factory.mktemp("hybrid")
    model_type, config = CASES["qwen3_5_text"]
    ref = build_checkpoint(root, model_type, config)
    loaded = load_model(str(root))
    return loaded, reference_greedy(ref, PROMPT, N)


@pytest.mark.parametrize("agree, n_draft", [(True, 1), (True, 4), (True, 8), (False, 3), (None, 5)])
def test_hybrid_target_rolls_its_recurrent_state_back(hybrid, agree, n_draft):
    """A target whose cache holds a recurrent state: checkpointed before each verification and, after a
    rejection, restored and advanced over the accepted ids again; the output stays greedy decoding's.
    agree None: a drafter right on every other round (some proposals accepted, then one rejected)."""
    loaded, greedy = hybrid
    assert loaded.decoder.new_cache().has_recurrent_state()
    assert generate(loaded.decoder, PROMPT, Sampling(max_new_tokens=N)).ids == greedy  # the oracle first
    if agree is None:
        class _Half(_Scripted):
            def propose(self, history, k, hidden, cache):
                out = super().propose(history, k, hidden, cache)
                return out if self.calls % 2 else out[:1] + [(t + 1) % self.vocab for t in out[1:]]

        d = _Half(greedy, True, loaded.spec.vocab_size)
    else:
        d = _Scripted(greedy, agree, loaded.spec.vocab_size)
    g = generate(loaded.decoder, PROMPT, Sampling(max_new_tokens=N), draft=d, n_draft=n_draft)
    assert g.ids == greedy
    if agree is None:
        assert 0 < g.accepted < g.drafted
    else:
        assert g.accepted == (g.drafted if agree else 0)


def test_target_as_its_own_drafter_is_always_accepted(pair):
    _, target, _, greedy = pair
    d = ModelDrafter(target.decoder, target.spec.vocab_size)
    g = generate(target.decoder, PROMPT, Sampling(max_new_tokens=N), draft=d, n_draft=4)
    assert g.ids == greedy
    assert g.accepted == g.drafted > 0


def test_stops_and_limits_match_plain_decoding(pair):
    _, target, drafter, greedy = pair
    d = ModelDrafter(drafter.decoder, target.spec.vocab_size)
    stop = greedy[10]
    plain = generate(target.decoder, PROMPT, Sampling(max_new_tokens=N), stop_ids=[stop])
    spec = generate(target.decoder, PROMPT, Sampling(max_new_tokens=N), stop_ids=[stop], draft=d, n_draft=6)
    assert spec.ids == plain.ids and spec.stop_reason == plain.stop_reason == "stop_token"
    ctx = len(PROMPT) + 9
    plain = generate(target.decoder, PROMPT, Sampling(max_new_tokens=N), ctx_size=ctx)
    spec = generate(target.decoder, PROMPT, Sampling(max_new_tokens=N), ctx_size=ctx, draft=_Scripted(
        greedy, True, target.spec.vocab_size), n_draft=4)
    assert spec.ids == plain.ids and spec.stop_reason == plain.stop_reason == "context"
    seen = []
    spec = generate(target.decoder, PROMPT, Sampling(max_new_tokens=N), draft=_Scripted(
        greedy, True, target.spec.vocab_size), n_draft=8, on_token=lambda t: seen.append(t) or len(seen) == 5)
    assert spec.ids == greedy[:5] and spec.stop_reason == "stopped"


def test_repetition_penalty_and_logprobs_follow_the_target(pair):
    _, target, drafter, _ = pair
    s = Sampling(max_new_tokens=N, repeat_penalty=1.3, logprobs=2)
    plain = generate(target.decoder, PROMPT, s)
    spec = generate(target.decoder, PROMPT, s, draft=ModelDrafter(drafter.decoder, target.spec.vocab_size))
    assert spec.ids == plain.ids
    assert [e["id"] for e in spec.logprobs] == plain.ids
    np.testing.assert_allclose([e["logprob"] for e in spec.logprobs], [e["logprob"] for e in plain.logprobs],
                               atol=1e-4)


def test_sampling_is_refused(pair):
    _, target, drafter, _ = pair
    with pytest.raises(SterError, match="--temperature 0"):
        generate(target.decoder, PROMPT, Sampling(max_new_tokens=4, temperature=0.7),
                 draft=ModelDrafter(drafter.decoder, target.spec.vocab_size))


def test_cli_draft_json_counts(pair):
    from typer.testing import CliRunner

    from ster_py.cli import app

    root, _, _, greedy = pair
    text = " ".join(f"w{i}" for i in PROMPT[1:])
    r = CliRunner().invoke(app, ["generate", "-m", str(root / "target"), "--draft", str(root / "drafter"), "-p", text,
                                 "--chat-template", "off", "--max-new-tokens", "12", "--json", "-q"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["prompt_ids"][-len(PROMPT) + 1:] == PROMPT[1:]
    plain = CliRunner().invoke(app, ["generate", "-m", str(root / "target"), "-p", text, "--chat-template", "off",
                                     "--max-new-tokens", "12", "--json", "-q"])
    assert doc["ids"] == json.loads(plain.stdout)["ids"]
    if doc["prompt_ids"] == PROMPT:
        assert doc["ids"] == greedy[:12]
    assert doc["draft"]["model"] == str(root / "drafter")
    assert 0 <= doc["draft"]["accepted"] <= doc["draft"]["drafted"]


def test_cli_refusals(pair, tmp_path):
    from typer.testing import CliRunner

    from ster_py.cli import app

    root = pair[0]
    other = tmp_path / "other"
    make_checkpoint(other, "llama", seed=3, vocab_size=96)
    base = ["generate", "-m", str(root / "target"), "-p", "w3 w4", "--chat-template", "off", "--max-new-tokens", "4"]
    r = CliRunner().invoke(app, base + ["--draft", str(other)])
    assert isinstance(r.exception, SterError) and "does not share the target's vocabulary" in str(r.exception)
    r = CliRunner().invoke(app, base + ["--draft", str(root / "drafter"), "--temperature", "0.8"])
    assert isinstance(r.exception, SterError) and "--temperature 0" in str(r.exception)
    r = CliRunner().invoke(app, base + ["--draft-max", "4"])
    assert isinstance(r.exception, SterError) and "--draft-max needs --draft" in str(r.exception)
    r = CliRunner().invoke(app, ["chat", "-m", str(root / "target"), "--draft-max", "4"])
    assert isinstance(r.exception, SterError) and "--draft-max needs --draft" in str(r.exception)
    r = CliRunner().invoke(app, ["chat", "-m", str(root / "target"), "--draft", str(root / "drafter"),
                                 "--temperature", "0.5"])
    assert isinstance(r.exception, SterError) and "--temperature 0" in str(r.exception)
    # ster serve --draft: the same refusals, before it listens (requests with a temperature: test_serve.py)
    r = CliRunner().invoke(app, ["serve", "-m", str(root / "target"), "--port", "0", "--draft", str(other)])
    assert isinstance(r.exception, SterError) and "does not share the target's vocabulary" in str(r.exception)
    r = CliRunner().invoke(app, ["serve", "-m", str(root / "target"), "--draft-max", "4"])
    assert isinstance(r.exception, SterError) and "--draft-max needs --draft" in str(r.exception)
    r = CliRunner().invoke(app, ["serve", "-m", str(root / "absent"), "--draft", str(root / "drafter"),
                                 "--draft-max", "65"])
    assert isinstance(r.exception, SterError) and "--draft-max must be 1 to 64" in str(r.exception)
    # the console script: one line, exit 1, no traceback
    p = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", *base, "--draft", str(other)],
                       capture_output=True, text=True)
    assert p.returncode == 1 and p.stderr.startswith("error: the drafter") and "Traceback" not in p.stderr


# ----------------------------------------------------------------------------- Gemma 4's assistant
# A tiny gemma4_text target (sliding and full layers with their own head widths, values from keys on
# the full layers, the last two layers reusing layers 2 and 1's keys and values, per-layer inputs) and
# a tiny Gemma4AssistantForCausalLM of another width and depth that reads its state. Oracle: the
# assistant's own forward in transformers, fed the target's shared_kv_states, last hidden state and
# embedding as SinglePositionMultiTokenCandidateGenerator feeds it.

S, F = "sliding_attention", "full_attention"
G4_PROMPT = np.random.RandomState(4).randint(3, 128, size=10).tolist()
G4_TARGET = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=5, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, global_head_dim=32, max_position_embeddings=256,
                 sliding_window=16, layer_types=[S, S, F, S, F], attention_k_eq_v=True, num_global_key_value_heads=1,
                 num_kv_shared_layers=2, hidden_size_per_layer_input=8, vocab_size_per_layer_input=128,
                 final_logit_softcapping=3.0)


def _randomize(model, seed: int) -> None:
    """Every norm weight and layer scalar drawn away from its initial value, so that each matters."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3 + 1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.08)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))


G4_ASSISTANT = dict(vocab_size=128, hidden_size=48, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                    num_key_value_heads=2, head_dim=16, global_head_dim=32, sliding_window=16, layer_types=[F, S, F],
                    hidden_size_per_layer_input=0, vocab_size_per_layer_input=0, attention_k_eq_v=True,
                    num_global_key_value_heads=1, num_kv_shared_layers=3, max_position_embeddings=256,
                    rope_parameters={S: {"rope_type": "default", "rope_theta": 100.0},
                                     F: {"rope_type": "proportional", "rope_theta": 10000.0,
                                         "partial_rotary_factor": 0.5}})


def _build_g4(path, model_type, config):
    """The target (gemma4_text) or its assistant, saved with the tests' tokenizer; returns transformers' model."""
    import torch
    from transformers import AutoConfig, Gemma4AssistantConfig, Gemma4AssistantForCausalLM

    from tiny import build_checkpoint, write_tokenizer

    if model_type == "gemma4_text":
        model = build_checkpoint(path, model_type, config)
        _randomize(model, 11)
    else:
        torch.manual_seed(5)
        text = AutoConfig.for_model("gemma4_text", **config)
        model = Gemma4AssistantForCausalLM(Gemma4AssistantConfig(text_config=text, backbone_hidden_size=64)).eval()
        _randomize(model, 12)
    model.save_pretrained(path)
    write_tokenizer(path, 128)
    return model


@pytest.fixture(scope="module")
def gemma4_pair(tmp_path_factory):
    """(directory, transformers target, transformers assistant, ster's target): the checkpoints under
    DIR/hf/{target,assistant}."""
    root = tmp_path_factory.mktemp("g4draft")
    ref = _build_g4(root / "hf" / "target", "gemma4_text", G4_TARGET)
    assistant = _build_g4(root / "hf" / "assistant", "gemma4_assistant", G4_ASSISTANT)
    return root, ref, assistant, load_model(str(root / "hf" / "target"))


@pytest.fixture(scope="module")
def gemma4_gguf(gemma4_pair):
    """llama.cpp's F32 conversions of the pair's checkpoints: DIR/{target,assistant}.gguf."""
    from llamacpp_convert import extract_converter

    root = gemma4_pair[0]
    conv = extract_converter(root)
    r = subprocess.run([sys.executable, str(root / "convert.py"), str(conv), "f32",
                        *(f"{root / 'hf' / n}::{root / (n + '.gguf')}" for n in ("target", "assistant"))],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"llama.cpp's convert_hf_to_gguf.py failed: {r.stderr[-2000:]}", pytrace=False)
    return root


def test_assistant_steps_match_transformers(gemma4_pair):
    import torch

    from ster_py.speculative import load_drafter

    root, ref, assistant, target = gemma4_pair
    drafter = load_drafter(str(root / "hf" / "assistant"), target)
    assert drafter.kind == "reader" and drafter.reader.sources == [2, 1, 2]
    with torch.no_grad():
        out = ref(torch.tensor([G4_PROMPT]), output_hidden_states=True, return_shared_kv_states=True, use_cache=True)
    cache, normed = target.decoder.new_cache(), []
    logits = target.decoder.forward(G4_PROMPT, cache, normed=normed)
    token = int(out.logits[0, -1].argmax())
    assert token == int(np.argmax(logits[-1]))
    np.testing.assert_allclose(normed[0][-1], out.hidden_states[-1][0, -1].numpy(), rtol=1e-4, atol=1e-5)
    h_ref, h = out.hidden_states[-1][:, -1:], normed[0][-1]
    embed = ref.get_input_embeddings()
    mask = torch.ones(1, len(G4_PROMPT) + 1, dtype=torch.long)
    for step in range(3):
        with torch.no_grad():
            a = assistant(inputs_embeds=torch.cat([embed(torch.tensor([[token]])), h_ref], dim=-1),
                          attention_mask=mask, position_ids=torch.tensor([[len(G4_PROMPT)]]),
                          shared_kv_states=out.shared_kv_states, use_cache=False)
        ours, h = drafter.reader.step(token, h, cache)
        want = a.logits[0, -1].numpy()
        assert np.linalg.norm(ours - want) / np.linalg.norm(want) < 1e-4, step
        np.testing.assert_allclose(h, a.last_hidden_state[0, -1].numpy(), rtol=1e-4, atol=1e-5)
        token, h_ref = int(np.argmax(ours)), a.last_hidden_state
        assert token == int(want.argmax())


def test_assistant_drafts_greedy_output(gemma4_pair):
    from ster_py.speculative import load_drafter

    root, ref, _, target = gemma4_pair
    prompt = G4_PROMPT + G4_PROMPT  # past the sliding window of 16 as it grows
    greedy = reference_greedy(ref, prompt, 20)
    assert generate(target.decoder, prompt, Sampling(max_new_tokens=20)).ids == greedy
    drafter = load_drafter(str(root / "hf" / "assistant"), target)
    for n_draft in (1, 3, 8):
        g = generate(target.decoder, prompt, Sampling(max_new_tokens=20), draft=drafter, n_draft=n_draft)
        assert g.ids == greedy and g.drafted > 0


def test_gguf_assistant_beside_a_gguf_target(gemma4_pair, gemma4_gguf):
    """llama.cpp's gemma4-assistant file drafts as its checkpoint does (same steps over the same
    cache), and beside llama.cpp's gemma4 file of the target gives that file's greedy output."""
    from ster_py.speculative import load_drafter

    root, _, _, target = gemma4_pair
    hf = load_drafter(str(root / "hf" / "assistant"), target)
    gg = load_drafter(str(root / "assistant.gguf"), target)
    assert gg.reader.sources == hf.reader.sources
    cache, normed = target.decoder.new_cache(), []
    token = int(np.argmax(target.decoder.forward(G4_PROMPT, cache, normed=normed)[-1]))
    h1 = h2 = normed[0][-1]
    for _ in range(3):
        (a, h1), (b, h2) = hf.reader.step(token, h1, cache), gg.reader.step(token, h2, cache)
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(h2, h1, rtol=1e-5, atol=1e-5)
        token = int(np.argmax(a))
    gtarget = load_model(str(root / "target.gguf"))
    prompt = G4_PROMPT + G4_PROMPT
    plain = generate(gtarget.decoder, prompt, Sampling(max_new_tokens=20)).ids
    g = generate(gtarget.decoder, prompt, Sampling(max_new_tokens=20), draft=load_drafter(
        str(root / "assistant.gguf"), gtarget), n_draft=4)
    assert g.ids == plain and g.drafted > 0


def test_assistant_beside_another_target_is_refused(gemma4_pair, pair):
    from ster_py.speculative import load_drafter

    root = gemma4_pair[0]
    llama = pair[1]
    with pytest.raises(SterError, match="drafts only for a Gemma 4 model"):
        load_drafter(str(root / "hf" / "assistant"), llama)
