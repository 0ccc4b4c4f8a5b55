"""`ster generate`'s sampling and output options: the repetition penalty and min-p against
transformers' logits processors, log-probabilities against torch's log-softmax, stop strings,
--prompt-file, and the refusals (--logprobs without --json, --thinking where the template has no
switch, --tools without a template)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from ster_py.generate import Sampling, penalize, pick_token, top_logprobs
from test_chat_cmd import chat_model
from tiny import make_checkpoint, one_torch_thread  # noqa: F401 (autouse fixture)


def ster(*args, stdin=None):
    return subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", *args], input=stdin,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory):
    return chat_model(tmp_path_factory.mktemp("gen"))


@pytest.mark.parametrize("penalty, last_n", [(1.3, 64), (0.7, 5), (2.0, -1)])
def test_repetition_penalty_equals_transformers(penalty, last_n):
    from transformers import RepetitionPenaltyLogitsProcessor

    rng = np.random.default_rng(0)
    logits = rng.standard_normal(50).astype(np.float32) * 3
    history = [int(t) for t in rng.integers(0, 50, 30)]
    seen = history if last_n < 0 else history[-last_n:]
    want = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([seen]), torch.tensor(logits)[None])[0].numpy()
    got = penalize(logits, history, Sampling(repeat_penalty=penalty, repeat_last_n=last_n))
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("penalty", [1e-40, 1e-300, 1e40, 1e300])
def test_extreme_repetition_penalties_sample_without_nan(penalty):
    """A penalty beyond float32's range sends the seen logits to +-inf (as float32 arithmetic would, never to
    NaN), and sampling then draws among the ids at +inf: below 1 a seen id, above 1 an unseen one."""
    rng = np.random.default_rng(3)
    logits = rng.standard_normal(50).astype(np.float32) * 3
    logits[:3] = (2.0, -2.0, 0.0)
    history = [0, 1, 2]
    got = penalize(logits, history, Sampling(repeat_penalty=penalty))
    assert not np.isnan(got).any() and got[2] == 0.0
    s = Sampling(temperature=1.0, seed=0, repeat_penalty=penalty)
    draws = {pick_token(got, s, np.random.default_rng(i)) for i in range(50)}
    assert draws == {0} if penalty < 1 else not draws & {0, 1}
    # every logit at -inf: all equally likely rather than NaN probabilities
    assert pick_token(np.full(8, -np.inf, np.float32), s, np.random.default_rng(0)) in range(8)


@pytest.mark.parametrize("min_p", [0.05, 0.3])
def test_min_p_keeps_what_transformers_keeps(min_p):
    from transformers import MinPLogitsWarper

    rng = np.random.default_rng(1)
    logits = rng.standard_normal(40).astype(np.float32) * 2
    kept = np.isfinite(MinPLogitsWarper(min_p, min_tokens_to_keep=1)(None, torch.tensor(logits)[None])[0].numpy())
    s = Sampling(temperature=1.0, min_p=min_p, seed=0)
    draws = {pick_token(logits, s, np.random.default_rng(i)) for i in range(400)}
    assert draws <= set(np.flatnonzero(kept)) and len(draws) > 1


def test_logprobs_equal_log_softmax():
    rng = np.random.default_rng(2)
    logits = rng.standard_normal(30).astype(np.float32) * 4
    want = torch.log_softmax(torch.tensor(logits, dtype=torch.float64), -1).numpy()
    got = top_logprobs(logits, 7, 5)
    assert got["logprob"] == pytest.approx(want[7], abs=1e-9)
    assert [i for i, _ in got["top"]] == list(np.argsort(-want)[:5])
    assert [lp for _, lp in got["top"]] == pytest.approx(list(np.sort(want)[::-1][:5]), abs=1e-9)


def test_stop_string_and_prompt_file(tiny_chat, tmp_path):
    base = json.loads(ster("generate", "--model", str(tiny_chat), "-p", "w10 w11", "--max-new-tokens", "8", "--json",
                           "-q").stdout)
    words = base["text"].split()
    assert len(words) >= 4
    stop = words[2]
    cut = ster("generate", "--model", str(tiny_chat), "--prompt-file", "-", "--max-new-tokens", "8", "--stop", stop,
               "--json", "-q", stdin="w10 w11")
    doc = json.loads(cut.stdout)
    first = base["text"].index(stop)
    assert doc["text"] == base["text"][:first] and doc["stop"] == [stop] and doc["prompt_ids"] == base["prompt_ids"]
    streamed = ster("generate", "--model", str(tiny_chat), "-p", "w10 w11", "--max-new-tokens", "8", "--stop", stop,
                    "-q")
    assert streamed.stdout == base["text"][:first] + "\n"
    lp = json.loads(ster("generate", "--model", str(tiny_chat), "-p", "w10 w11", "--max-new-tokens", "3",
                         "--logprobs", "2", "--json", "-q").stdout)["logprobs"]
    assert len(lp) == 3 and all(e["top"][0]["id"] == e["id"] for e in lp)   # greedy: the most likely id


@pytest.mark.parametrize("text, ids", [("w10 w11\n", [10, 11]), ("w10 w11\r\n", [10, 11]), ("w10 w11", [10, 11]),
                                       ("w10 w11\n\n", [10, 11, 7]), ("w10\nw11\n", [10, 7, 11]),
                                       ("w10 w11\r\n\r\n", [10, 11, 8, 7])])
def test_prompt_file_drops_one_final_line_break(tiny_chat, tmp_path, text, ids):
    """--prompt-file sent the file's final newline (the one ``echo`` writes) as part of the message, so a file
    and --prompt with the same text got different answers; llama.cpp's -f drops it. Exactly one final "\n" or
    "\r\n" is dropped, a file or stdin: a template that spells each line break as a token shows what is sent."""
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages[-1]['content'] | replace('\\r', ' w8 ') | replace('\\n', ' w7 ') }}")
    (tmp_path / "q.txt").write_bytes(text.encode())
    for source, stdin in [(str(tmp_path / "q.txt"), None), ("-", text)]:
        r = ster("generate", "--model", str(tiny_chat), "--prompt-file", source, "--chat-template-file", str(template),
                 "--max-new-tokens", "0", "--json", "-q", stdin=stdin)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["prompt_ids"] == ids, (source, r.stdout)


@pytest.mark.parametrize("args, words", [
    (["--logprobs", "2"], "--logprobs needs --json"),
    (["--thinking", "on"], "no thinking switch"),
    (["--stop", ""], "non-empty"),
    (["--min-p", "2"], "--min-p must be in [0, 1]"),
    (["--repeat-penalty", "0"], "--repeat-penalty must be"),
])
def test_refusals(tiny_chat, args, words):
    r = ster("generate", "--model", str(tiny_chat), "-p", "w10", *args)
    assert r.returncode == 1 and words in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("value", ["on", "off"])
def test_thinking_without_a_switch_advises_auto(tiny_chat, value):
    """--thinking on/off where the template has no switch advised "leave thinking unset"; the option's default,
    what to give instead, is auto."""
    r = ster("generate", "--model", str(tiny_chat), "-p", "w10", "--thinking", value)
    assert r.returncode == 1 and "no thinking switch" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.rstrip().endswith("; use --thinking auto (the default)") and "unset" not in r.stderr


def test_thinking_takes_on_off_auto_as_chat_does(tiny_chat):
    """generate's --thinking is chat's: auto (the default) leaves the template's switch alone."""
    r = ster("generate", "--model", str(tiny_chat), "-p", "w10", "--thinking", "maybe")
    assert r.returncode == 2 and "'maybe' is not one of 'on', 'off', 'auto'" in r.stderr
    plain = ster("generate", "--model", str(tiny_chat), "-p", "w10", "--max-new-tokens", "3", "--json", "-q")
    auto = ster("generate", "--model", str(tiny_chat), "-p", "w10", "--max-new-tokens", "3", "--json", "-q",
                "--thinking", "auto")
    assert auto.returncode == 0 and json.loads(auto.stdout)["ids"] == json.loads(plain.stdout)["ids"]
    assert json.loads(plain.stdout)["thinking"] == json.loads(auto.stdout)["thinking"] == "auto"   # what was asked


def test_prompt_and_file_exclusive_and_tools_need_a_template(tmp_path):
    r = ster("generate", "--model", str(tmp_path), "-p", "w1", "--prompt-file", "-")
    assert r.returncode == 1 and "both --prompt and --prompt-file were given" in r.stderr
    r = ster("generate", "--model", str(tmp_path))
    assert r.returncode == 1 and "give the text with --prompt or --prompt-file" in r.stderr
    make_checkpoint(tmp_path / "plain", "llama")
    (tmp_path / "tools.json").write_text(json.dumps([{"type": "function", "function": {"name": "f"}}]))
    r = ster("generate", "--model", str(tmp_path / "plain"), "-p", "w5", "--tools", str(tmp_path / "tools.json"))
    assert r.returncode == 1 and "--tools needs a chat template" in r.stderr and "Traceback" not in r.stderr


def test_tools_a_template_never_reads_are_refused(tiny_chat, tmp_path):
    """tiny_chat's template has no ``tools`` variable: the tools would be dropped from the prompt. The refusal
    advised "(or give a template that takes them)", an option generate, chat and serve do not have."""
    (tmp_path / "tools.json").write_text(json.dumps([{"type": "function", "function": {"name": "f"}}]))
    r = ster("generate", "--model", str(tiny_chat), "-p", "w5", "--tools", str(tmp_path / "tools.json"))
    assert r.returncode == 1 and "chat template never reads tools" in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.rstrip().endswith("send no tools, or use a model whose chat template takes them"), r.stderr


def test_json_records_the_sampling_and_a_sampled_runs_seed(tiny_chat):
    """--json holds every setting the tokens depend on; a sampled run without --seed records the seed it
    drew, and that seed given back repeats the run token for token."""
    args = ("generate", "--model", str(tiny_chat), "--prompt", "w10 w11", "--max-new-tokens", "12", "--json",
            "--temperature", "1.5", "--top-k", "40")
    first = ster(*args)
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)
    s = doc["sampling"]
    assert s["temperature"] == 1.5 and s["top_k"] == 40 and s["max_new_tokens"] == 12 and isinstance(s["seed"], int)
    again = json.loads(ster(*args, "--seed", str(s["seed"])).stdout)
    assert again["ids"] == doc["ids"] and again["sampling"] == s
    plain = ster(*(a for a in args if a != "--json"), "--seed", str(s["seed"]))
    assert f"seed {s['seed']}" in plain.stderr and plain.stdout.strip() == doc["text"].strip()  # the summary says it
    greedy = json.loads(ster("generate", "--model", str(tiny_chat), "--prompt", "w10", "--max-new-tokens", "2",
                             "--json").stdout)
    assert greedy["sampling"]["seed"] is None and greedy["sampling"]["temperature"] == 0.0


def test_a_chat_template_file_replaces_the_models(tiny_chat, tmp_path):
    """--chat-template-file: generate, chat and serve render with the file's template instead of the model's
    (the template render command could preview a template no command could use); a base model (no template)
    can then chat. A template error names the file; the file is read before the model loads."""
    from ster_py.load import load_model

    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}w7 {{ m.content }} w8 {% endfor %}"
                        "{% if add_generation_prompt %}w9 {% endif %}")
    doc = json.loads(ster("generate", "--model", str(tiny_chat), "-p", "w10 w11", "--max-new-tokens", "3",
                          "--json", "--chat-template-file", str(template)).stdout)
    tok = load_model(str(tiny_chat)).tokenizer
    assert doc["chat_template"] == "applied"
    assert doc["prompt_ids"] == tok.encode("w7 w10 w11 w8 w9 ", add_special_tokens=False)
    # a model without a template: chat works with the file, and says how without it
    base = tmp_path / "base"
    make_checkpoint(base, "llama")
    piped = ster("chat", "--model", str(base), "--max-new-tokens", "2", "--chat-template-file", str(template),
                 stdin="w10\n")
    assert piped.returncode == 0 and "prompt 4 tokens" in piped.stderr, piped.stderr   # w7 w10 w8 w9
    refused = ster("chat", "--model", str(base), stdin="w10\n")
    assert refused.returncode == 1 and "--chat-template-file" in refused.stderr
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }")
    # refused before the model loads: chat and serve started and then failed every message (serve with a 400)
    for args in (("generate", "-p", "w10"), ("chat",), ("serve", "--port", "0")):
        r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", args[0], "--model",
                            str(tiny_chat), "--chat-template-file", str(bad), *args[1:]], input="w10\n",
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and f"chat template {bad}, line 1: syntax error" in r.stderr, (args, r.stderr)
        assert "chatting with" not in r.stderr and "listening" not in r.stdout + r.stderr, (args, r.stderr)
    r = ster("generate", "--model", str(tiny_chat), "-p", "w10", "--chat-template-file", str(tmp_path / "none"))
    assert r.returncode == 1 and "not found" in r.stderr


def test_chat_takes_quantize_as_generate_does(tiny_chat):
    """--quantize on chat (and serve) as on generate: a safetensors checkpoint run on the GGUF kernels; the
    answer equals generate's with the same option (it was 'No such option')."""
    gen = json.loads(ster("generate", "--model", str(tiny_chat), "-p", "w10 w11", "--max-new-tokens", "4", "--json",
                          "--quantize", "q8_0").stdout)
    piped = ster("chat", "--model", str(tiny_chat), "--max-new-tokens", "4", "--quantize", "q8_0", stdin="w10 w11\n")
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.strip() == gen["text"].strip()
    assert ster("serve", "--help").stdout.count("--quantize") == 1


def test_sampling_options_at_temperature_zero_are_noted(tiny_chat):
    """--top-k / --top-p / --min-p / --seed at the default temperature 0 did nothing, silently; a note says so
    (not with -q, not when sampling, not for --repeat-penalty, which greedy decoding applies)."""
    base = ("generate", "--model", str(tiny_chat), "-p", "w10", "--max-new-tokens", "1")
    r = ster(*base, "--top-k", "5", "--seed", "3")
    assert r.returncode == 0 and "note: --top-k, --seed have no effect at --temperature 0" in r.stderr, r.stderr
    assert "no effect" not in ster(*base, "--top-k", "5", "-q").stderr
    assert "no effect" not in ster(*base, "--top-k", "5", "--temperature", "0.7").stderr
    assert "no effect" not in ster(*base, "--repeat-penalty", "1.3").stderr
