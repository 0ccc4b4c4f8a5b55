"""``ster template render`` against transformers' apply_chat_template(..., tokenize=False).

Its stdout bytes must be exactly the oracle's text (no newline added), and every
refusal is one ``error:`` line on stderr with exit status 1 and no traceback.
Most calls run in-process through Typer's test runner (with the console
script's SterError handling reproduced); ``test_as_a_process`` runs the real
console entry point in a subprocess to hold the two paths together.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ster_py.errors import SterError
from test_tokenizer import SP_TEMPLATE, hf_tokenizer, write_dir

# Ends without a newline after the generation prompt, reads bos/eos, tools, enable_thinking
# and a --var, and raises on a role it does not know (line 3).
TEMPLATE = """{{ bos_token }}{% for m in messages %}
{% if m.role not in ['system', 'user', 'assistant', 'tool'] %}
{{ raise_exception('unknown role ' + m.role) }}
{% endif %}
<|{{ m.role }}|>{{ m.content }}{% if m.tool_calls is defined %}{{ m.tool_calls | tojson }}{% endif %}{{ eos_token }}
{% endfor %}
{% if tools is not none %}<|tools|>{{ tools | tojson }}
{% endif %}
{% if enable_thinking is defined %}[thinking={{ enable_thinking }}]{% endif %}
{% if effort is defined %}[effort={{ effort }}]{% endif %}
{% if add_generation_prompt %}<|assistant|>{% endif %}"""

TOOL_TEMPLATE = "TOOLS{{ tools | tojson }}{% for m in messages %}|{{ m.content }}{% endfor %}"

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi ünï 🤖 <b>&</b>"}]
TOOL_TURNS = [
    {"role": "user", "content": "Weather in Zürich?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
    {"role": "tool", "name": "get_weather", "content": '{"temp": 21}'},
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather «now»",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]


def ster_process(*args, stdin: str | None = None):
    env = {k: v for k, v in os.environ.items() if k != "STER_CHAT_NOW"}
    return subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", "template", "render", *args],
                          input=None if stdin is None else stdin.encode(), capture_output=True, env=env, timeout=300)


def ster(*args, stdin: str | None = None):
    """In-process run, shaped like ``subprocess.run``'s result; a SterError becomes what
    ``ster_py.cli.main`` prints for it."""
    from typer.testing import CliRunner

    from ster_py.cli import app

    r = CliRunner(env={"STER_CHAT_NOW": None}).invoke(app, ["template", "render", *args], input=stdin)
    if isinstance(r.exception, SterError):
        return subprocess.CompletedProcess(args, 1, b"", f"error: {r.exception}\n".encode())
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return subprocess.CompletedProcess(args, r.exit_code, r.stdout_bytes, r.stderr_bytes)


def ok(result) -> str:
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode("utf-8")


def refused(result) -> str:
    err = result.stderr.decode()
    assert result.returncode == 1, (result.stdout, err)
    assert err.startswith("error: ") and "Traceback" not in err, err
    return " ".join(err.split())  # rich may wrap long lines


def bare_oracle(template: str, messages, **kwargs) -> str:
    """transformers on a tokenizer with the given special tokens only (none by default)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    specials = {k: kwargs.pop(k) for k in ("bos_token", "eos_token") if k in kwargs}
    backend = Tokenizer(models.WordLevel({"x": 0, **{v: i + 1 for i, v in enumerate(specials.values())}},
                                         unk_token="x"))
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, **specials)
    return hf.apply_chat_template(messages, chat_template=template, tokenize=False, **kwargs)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("template-cmd")
    paths = {}
    for name, doc in (("messages", MESSAGES), ("tool_turns", TOOL_TURNS), ("tools", TOOLS)):
        paths[name] = d / f"{name}.json"
        paths[name].write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    paths["template"] = d / "chat.jinja"
    paths["template"].write_text(TEMPLATE, encoding="utf-8")
    return paths


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny Hugging Face tokenizer directory with a default and a tool_use template."""
    path = write_dir(tmp_path_factory.mktemp("tiny-hf"), "sp")
    # with template files present transformers reads only them, so the default is a file too
    (path / "chat_template.jinja").write_text(SP_TEMPLATE, encoding="utf-8")
    (path / "additional_chat_templates").mkdir()
    (path / "additional_chat_templates" / "tool_use.jinja").write_text(TOOL_TEMPLATE, encoding="utf-8")
    return path


def test_template_alone(files):
    got = ok(ster("--template", str(files["template"]), "--messages", str(files["messages"])))
    assert got == bare_oracle(TEMPLATE, MESSAGES, add_generation_prompt=True)
    assert got.endswith("<|assistant|>")  # nothing added after the template's last character
    got = ok(ster("--template", str(files["template"]), "--messages", str(files["messages"]),
                  "--bos-token", "<B>", "--eos-token", "<E>", "--no-generation-prompt", "--enable-thinking",
                  "--var", "effort=high"))
    assert got == bare_oracle(TEMPLATE, MESSAGES, add_generation_prompt=False, bos_token="<B>", eos_token="<E>",
                              enable_thinking=True, effort="high")


def test_tools_and_tool_calls(files):
    got = ok(ster("-t", str(files["template"]), "--messages", str(files["tool_turns"]), "--tools",
                  str(files["tools"]), "--no-enable-thinking"))
    assert got == bare_oracle(TEMPLATE, TOOL_TURNS, tools=TOOLS, add_generation_prompt=True, enable_thinking=False)
    assert "[thinking=False]" in got and "Zürich" in got  # tojson keeps non-ASCII, as transformers'


def test_what_the_template_never_reads_is_noted(files, tmp_path):
    """Tools, the thinking switch and --var values a template never reads are named on stderr (the
    text is still exactly the template's); -q keeps stderr empty."""
    plain = tmp_path / "plain.jinja"
    plain.write_text("{% for m in messages %}{{ m.content }}|{% endfor %}{{ effort }}")
    args = ("-t", str(plain), "--messages", str(files["messages"]), "--tools", str(files["tools"]),
            "--enable-thinking", "--var", "effort=high", "--var", "mood=calm")
    got = ster(*args)
    assert ok(got) == bare_oracle(plain.read_text(), MESSAGES, tools=TOOLS, add_generation_prompt=True,
                                  enable_thinking=True, effort="high", mood="calm")
    notes = got.stderr.decode()
    assert sorted(line.split()[5] for line in notes.splitlines()) == ["enable_thinking;", "mood;", "tools;"], notes
    assert ster(*args, "-q").stderr == b""


def test_hf_dir_model(hf_dir, files):
    hf = hf_tokenizer(hf_dir)
    got = ok(ster("--model", str(hf_dir), "--messages", str(files["messages"])))
    assert got == hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    got = ok(ster("--model", str(hf_dir), "--messages", str(files["messages"]), "--no-generation-prompt", "--json"))
    doc = json.loads(got)
    assert doc["text"] == hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=False)
    assert (doc["bos_token"], doc["eos_token"]) == (hf.bos_token, hf.eos_token)
    # --tools picks the model's tool_use template, as transformers does
    got = ok(ster("--model", str(hf_dir), "--messages", str(files["messages"]), "--tools", str(files["tools"])))
    assert got == hf.apply_chat_template(MESSAGES, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert got.startswith("TOOLS")
    # --template replaces the model's template; the model still gives BOS/EOS
    got = ok(ster("--model", str(hf_dir), "--template", str(files["template"]), "--messages", str(files["messages"])))
    assert got == hf.apply_chat_template(MESSAGES, chat_template=TEMPLATE, tokenize=False, add_generation_prompt=True)
    assert got.startswith(hf.bos_token)


@pytest.mark.real
def test_gguf_model(smollm2_gguf, files):
    """The template and BOS/EOS texts as gguf-py reads them from the file."""
    from tiny import gguf_py_reader

    reader = gguf_py_reader(smollm2_gguf)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    specials = {name: tokens[reader.fields[f"tokenizer.ggml.{name}_id"].contents()]
                for name in ("bos_token", "eos_token")}
    template = reader.fields["tokenizer.chat_template"].contents()
    got = ok(ster("--model", str(smollm2_gguf), "--messages", str(files["messages"])))
    assert got == bare_oracle(template, MESSAGES, add_generation_prompt=True, **specials)
    assert "<|im_start|>assistant\n" in got


def test_messages_from_stdin(files):
    got = ok(ster("-t", str(files["template"]), "--messages", "-", stdin=json.dumps(MESSAGES)))
    assert got == bare_oracle(TEMPLATE, MESSAGES, add_generation_prompt=True)


@pytest.mark.parametrize("content, expected", [
    ('[{"role": "user", "content": "hi"', "is not valid JSON (Expecting ',' delimiter at line 1, column 34)"),
    ('{"role": "user", "content": "hi"}', "expected a JSON list of messages"),
    ("[]", "the conversation is empty"),
    ('[{"content": "hi"}]', 'message 0 has no "role"'),
    ('[{"role": "user"}]', 'message 0 (user) has no "content"'),
    ('[{"role": "user", "content": 3}]', 'message 0 (user) has "content" that is a number'),
])
def test_bad_messages(tmp_path, files, content, expected):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert expected in refused(ster("-t", str(files["template"]), "--messages", str(bad)))


def test_refusals(tmp_path, files):
    t, m = str(files["template"]), str(files["messages"])
    # the options named as the user typed them (a new user saw "from now=" and "-" here)
    assert "cannot read the pinned clock 'tomorrow' (from --now)" in refused(ster("-t", t, "--messages", m,
                                                                                   "--now", "tomorrow"))
    assert "stdin is not valid JSON" in refused(ster("-t", t, "--messages", "-", stdin="[{"))
    assert "messages file not found: /nonexistent/m.json" in refused(ster("-t", t, "--messages", "/nonexistent/m.json"))
    assert "template file not found" in refused(ster("-t", str(tmp_path / "none.jinja"), "--messages", m))
    assert "give --model" in refused(ster("--messages", m))
    bad_tools = tmp_path / "tools.json"
    bad_tools.write_text('{"name": "f"}')
    assert "expected a JSON list such as" in refused(ster("-t", t, "--messages", m, "--tools", str(bad_tools)))
    assert "--var cannot set 'messages'" in refused(ster("-t", t, "--messages", m, "--var", "messages=[]"))
    # the template's own refusal, with the file and line
    odd = tmp_path / "odd.json"
    odd.write_text('[{"role": "robot", "content": "beep"}]')
    msg = refused(ster("-t", t, "--messages", str(odd)))
    assert f"chat template {t}, line 3 refused the conversation: unknown role robot" in msg
    # a syntax error names the line too
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}\n{{ m.content }\n{% endfor %}")
    assert f"chat template {broken}, line 2: syntax error" in refused(ster("-t", str(broken), "--messages", m))
    # a model without a template says how to give one
    no_template = write_dir(tmp_path / "plain", "sp")
    cfg = json.loads((no_template / "tokenizer_config.json").read_text())
    cfg.pop("chat_template")
    (no_template / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert "has no chat template; give one with --template FILE" in refused(
        ster("--model", str(no_template), "--messages", m))
    # named templates without a default were "no chat template" too, though --template-name reads them
    cfg["chat_template"] = [{"name": "tool_use", "template": "{{ messages[0]['content'] }}"}]
    (no_template / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert "has no default chat template, only named ones: tool_use; choose one with --template-name NAME" in refused(
        ster("--model", str(no_template), "--messages", m))


def test_a_preset_is_named_as_given(files, gemma3_gguf):
    """A preset's refusal names the preset the user typed, not its file in the cache."""
    msg = refused(ster("--model", "gemma3-270m-q4_k_m", "--messages", str(files["messages"])))
    assert msg.startswith("error: gemma3-270m-q4_k_m has no chat template") and str(gemma3_gguf) not in msg


def test_as_a_process(files, tmp_path):
    """The console script itself: exact bytes on stdout, one error line on a refusal."""
    t, m = str(files["template"]), str(files["messages"])
    got = ster_process("-t", t, "--messages", m, "--tools", str(files["tools"]))
    assert ok(got) == bare_oracle(TEMPLATE, MESSAGES, tools=TOOLS, add_generation_prompt=True)
    bad = tmp_path / "bad.json"
    bad.write_text("[1]")
    assert "message 0 is a number, not an object" in refused(ster_process("-t", t, "--messages", str(bad)))
