"""``ster chat`` driven through a pseudo-terminal (pexpect): three turns, each streamed; the second
and third prefill only their new tokens (counted in the summary line), and every answer equals a
cold run of the same conversation (a fresh cache, the whole prompt: ``generate.generate``).

The tiny model is tests/tiny.py's random llama with a chat template written in its word-level
vocabulary (``CHAT_TEMPLATE``), so a turn's text re-encodes to the same ids.
"""
from __future__ import annotations

import json
import os
import re
import sys

import pytest

from ster_py.generate import Sampling, generate
from ster_py.load import load_model
from tiny import make_checkpoint, one_torch_thread, sigint_as_at_a_terminal  # noqa: F401 (autouse fixture)

# system w3, user w4, assistant w5, end of a message w6
CHAT_TEMPLATE = ("{% for m in messages %}{% if m.role == 'system' %}w3 {% elif m.role == 'user' %}w4 "
                 "{% else %}w5 {% endif %}{{ m.content }} w6 {% endfor %}{% if add_generation_prompt %}w5 {% endif %}")
# "1 new token"; both rates named, as generate's summary names them
SUMMARY_HEAD = r"prompt (\d+) tokens \(reused (\d+), prefilled (\d+)\), (\d+) new tokens?"
SUMMARY = re.compile(SUMMARY_HEAD + r" \([^)]*\); prefill [\d.]+ tok/s, decode [\d.]+ tok/s")


def chat_model(path, seed=0):
    """A tiny llama with ``CHAT_TEMPLATE`` in its tokenizer_config.json."""
    make_checkpoint(path, "llama", seed=seed)
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return path


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory):
    return chat_model(tmp_path_factory.mktemp("chat"))


def cold_answer(loaded, messages, n):
    """A cold run: the conversation rendered whole, a fresh cache; the answer's text (special tokens kept,
    as the chat streams them for the reply parser)."""
    text = loaded.tokenizer.render_chat(messages, add_generation_prompt=True)
    ids = loaded.tokenizer.encode(text, add_special_tokens=False)
    gen = generate(loaded.decoder, ids, Sampling(max_new_tokens=n), loaded.stop_ids())
    return loaded.tokenizer.decode([t for t in gen.ids if t not in loaded.stop_ids()], skip_special_tokens=False), ids


def _spawn(*args, env=None):
    import pexpect

    env = dict(os.environ, NO_COLOR="1", COLUMNS="200", **(env or {}))
    return pexpect.spawn(sys.executable, ["-c", "from ster_py.cli import main; main()", *args], env=env,
                         encoding="utf-8", timeout=120, dimensions=(40, 200), preexec_fn=sigint_as_at_a_terminal)


def test_three_turns_reuse_the_history_and_equal_cold_runs(tiny_chat, tmp_path):
    child = _spawn("chat", "--model", str(tiny_chat), "--max-new-tokens", "7", "--system", "w20 w21")
    turns = ["w10 w11 w12", "w13 w14", "w15 w16 w17 w18"]
    counts = []
    for turn in turns:
        child.expect("> ")
        child.sendline(turn)
        child.expect(SUMMARY)
        counts.append(tuple(int(g) for g in child.match.groups()))
        printed = child.before
    saved = tmp_path / "conv.json"
    child.expect("> ")
    child.sendline(f"/save {saved}")
    child.expect("saved 7 messages")
    child.expect("> ")
    child.sendeof()
    child.expect(pytest.importorskip("pexpect").EOF)
    child.close()
    assert child.exitstatus == 0
    messages = json.loads(saved.read_text())
    assert [m["role"] for m in messages] == ["system", "user", "assistant"] * 1 + ["user", "assistant"] * 2
    loaded = load_model(str(tiny_chat))
    history_ids = None
    for k, (prompt_len, reused, prefilled, new) in enumerate(counts):
        upto = 2 + 2 * k   # the system message and the turns so far, up to this user message
        answer, ids = cold_answer(loaded, messages[:upto], 7)
        assert messages[upto]["content"] == answer
        assert prompt_len == len(ids) and reused + prefilled == len(ids)
        if k == 0:
            assert reused == 0
        else:   # the history was prefilled after the last answer: only this turn's tokens are new
            assert reused == len(history_ids) and prefilled == len(ids) - len(history_ids) <= len(turns[k].split()) + 3
        text = loaded.tokenizer.render_chat(messages[:upto + 1], add_generation_prompt=False)
        history_ids = loaded.tokenizer.encode(text, add_special_tokens=False)
    assert messages[-1]["content"] in printed


def test_commands_and_errors_keep_the_session(tiny_chat, tmp_path):
    child = _spawn("chat", "--model", str(tiny_chat), "--max-new-tokens", "3", "-q")
    child.expect("> ")
    child.sendline("/vector")
    child.expect(r"error: /vector needs FILE \[STRENGTH\] \(or off\)")
    child.expect("> ")
    child.sendline(f"/vector {tmp_path / 'missing.json'} 2")
    child.expect("error: ")
    child.expect("> ")
    child.sendline("/nope")
    child.expect("error: unknown command /nope")
    child.expect("> ")
    child.sendline("/help")
    child.expect("/reset")
    child.expect("> ")
    child.sendline("/quit")
    child.expect(pytest.importorskip("pexpect").EOF)
    child.close()
    assert child.exitstatus == 0 and "Traceback" not in child.before


def test_chat_refuses_a_model_without_a_template(tmp_path):
    make_checkpoint(tmp_path / "plain", "llama")
    child = _spawn("chat", "--model", str(tmp_path / "plain"), "-q")
    child.expect(pytest.importorskip("pexpect").EOF)
    child.close()
    assert child.exitstatus == 1 and "no chat template" in child.before and "Traceback" not in child.before


def test_markup_in_commands_and_paths_is_printed_as_text(tiny_chat, tmp_path):
    """rich markup in what the user typed (an unknown /command, a model path) is text, not a crash that loses
    the conversation (a breaker's finding: rich.errors.MarkupError)."""
    import shutil
    import subprocess

    odd = tmp_path / "mk[/b]"
    shutil.copytree(tiny_chat, odd)
    r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", "chat", "--model", str(odd),
                        "--max-new-tokens", "2"], input="/x[/]\n/save nodir[/]/x.json\n/quit\n", capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr   # piped, and two lines failed
    assert f"chatting with {odd}" in r.stderr and "/x[/]" in r.stderr and "nodir[/]" in r.stderr


def test_chat_refuses_a_base_model_before_loading_it(tmp_path):
    """The template is read from tokenizer_config.json alone: the refusal comes before any weight is read
    (the weights here are not even a safetensors file, which a load would refuse first)."""
    plain = tmp_path / "plain"
    make_checkpoint(plain, "llama")
    (plain / "model.safetensors").write_bytes(b"not safetensors")
    child = _spawn("chat", "--model", str(plain), "-q")
    child.expect(pytest.importorskip("pexpect").EOF)
    child.close()
    assert child.exitstatus == 1 and "no chat template" in child.before and "Traceback" not in child.before


def test_surely_lacks_chat_template(tmp_path, smollm2_gguf, gemma3_gguf):
    """True only where the metadata or tokenizer_config.json says so; False where a load must tell."""
    from ster_py.chat import surely_lacks_chat_template

    assert surely_lacks_chat_template(str(gemma3_gguf)) and not surely_lacks_chat_template(str(smollm2_gguf))
    assert surely_lacks_chat_template(str(gemma3_gguf.parent))  # a directory holding one .gguf
    assert surely_lacks_chat_template("gemma3-270m-q4_k_m")  # a preset in the cache (the fixture put it there)
    assert not surely_lacks_chat_template("smollm2-135m-instruct-q4_1")
    plain = tmp_path / "plain"
    make_checkpoint(plain, "llama")
    assert surely_lacks_chat_template(str(plain))
    assert not surely_lacks_chat_template(str(chat_model(tmp_path / "chat")))
    (plain / "tokenizer_config.json").write_text("[not json")  # the load says what is wrong
    assert not surely_lacks_chat_template(str(plain))
    assert not surely_lacks_chat_template("someone/some-model")  # a Hub id: nothing local to read
    assert not surely_lacks_chat_template(str(tmp_path / "missing.gguf"))


def test_ctrl_c_stops_the_answer_and_keeps_the_session(tmp_path):
    """A long context (4096 positions) and no token limit: the answer runs until Ctrl-C stops it."""
    path = tmp_path / "long"
    make_checkpoint(path, "llama", max_position_embeddings=4096, eos_token_id=None)
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps(dict(cfg, chat_template=CHAT_TEMPLATE, eos_token=None)))
    child = _spawn("chat", "--model", str(path), "--max-new-tokens", "100000")
    child.expect("> ")
    child.sendline("w10 w11")
    child.expect(r"w11\r\n")     # the echo
    child.expect(r"w\d+")         # the answer is streaming
    child.sendintr()
    child.expect(SUMMARY_HEAD + r" \(interrupted\)")
    child.expect("> ")
    child.sendline("w12")       # the session goes on
    child.expect(r"w12\r\n")
    child.expect(r"w\d+")
    child.sendintr()
    # a prefill rate; a decode rate only if a decode step ran before the interrupt (the first token is the prefill's)
    child.expect(SUMMARY_HEAD + r" \(interrupted\); prefill [\d.]+ tok/s")
    child.expect("> ")
    child.sendeof()
    child.expect(pytest.importorskip("pexpect").EOF)
    child.close()
    assert child.exitstatus == 0 and "Traceback" not in child.before


@pytest.mark.real
def test_smollm2_three_turns_bit_exact(smollm2_gguf):
    """The real file through the library the chat runs on: the second and third turns prefill only their
    own tokens (the history was prefilled after each answer), and every answer's ids equal a cold run's."""
    from ster_py.conversation import Session

    loaded = load_model(str(smollm2_gguf))
    session = Session(loaded)
    assert not session.format.reasons and session.format.tools is None   # SmolLM2 writes plain text
    messages: list[dict] = []
    history = None
    for k, question in enumerate(["What is the capital of France?", "And of Italy?", "Which one is larger?"]):
        messages.append({"role": "user", "content": question})
        reply = session.reply(messages, Sampling(max_new_tokens=12))
        cold = generate(loaded.decoder, reply.prompt_ids, Sampling(max_new_tokens=12), loaded.stop_ids())
        assert reply.generation.ids == cold.ids and reply.text.strip()
        assert reply.generation.reused == (0 if k == 0 else len(history))
        assert reply.generation.prefilled == len(reply.prompt_ids) - reply.generation.reused
        assert reply.prompt_ids[:reply.generation.reused] == (history or [])[:reply.generation.reused]
        messages.append({"role": "assistant", "content": reply.text})
        session.prepare(messages)
        history = session.cache.ids
    assert "Paris" in messages[1]["content"]


def _piped(*args, stdin: str | bytes, env=None):
    """``ster ARGS`` with ``stdin`` piped in (text as UTF-8, or bytes as they are): (exit status, stdout, stderr)."""
    import subprocess

    r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", *args],
                       input=stdin if isinstance(stdin, bytes) else stdin.encode(), capture_output=True, timeout=120,
                       env=None if env is None else dict(os.environ, **env))
    out, err = r.stdout.decode(errors="backslashreplace"), r.stderr.decode(errors="backslashreplace")
    assert "Traceback" not in err, err
    return r.returncode, out, err


def test_a_base_model_is_advised_generate_as_it_is(tmp_path):
    """A base model advised `ster generate --chat-template off`, which is not needed: generate sends raw text to
    a model without a template."""
    make_checkpoint(tmp_path / "plain", "llama")
    code, _, err = _piped("chat", "--model", str(tmp_path / "plain"), "-q", stdin="hello\n")
    assert code == 1 and "use `ster generate --prompt TEXT`, which continues a raw text on a model without a " \
        "template" in err and "--chat-template off" not in err, err


def test_thinking_without_a_switch_advises_auto(tiny_chat):
    """--thinking on where the template has no switch advised "leave thinking unset", but the option has no
    unset: its default is auto."""
    code, _, err = _piped("chat", "--model", str(tiny_chat), "--thinking", "on", "-q", stdin="hello\n")
    assert code == 1 and "no thinking switch" in err and "; use --thinking auto (the default)" in err, err
    assert "unset" not in err


def test_summary_writes_every_count_with_thousands_separators(tmp_path):
    """A long first turn: the second's summary has four-digit counts, each written 1,234 (the reused and
    prefilled counts were written 1234 beside a prompt of 1,234)."""
    path = tmp_path / "long"
    make_checkpoint(path, "llama", max_position_embeddings=4096)
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps(dict(cfg, chat_template=CHAT_TEMPLATE)))
    first = " ".join(f"w{10 + i % 100}" for i in range(1100))
    status, _, err = _piped("chat", "--model", str(path), "--max-new-tokens", "2", stdin=f"{first}\n{first}\n")
    assert status == 0
    lines = [line for line in err.splitlines() if line.startswith("prompt ")]
    assert re.fullmatch(r"prompt 1,103 tokens \(reused 0, prefilled 1,103\), 2 new tokens \(length\).*", lines[0])
    assert re.fullmatch(r"prompt 2,2\d\d tokens \(reused 1,10\d, prefilled 1,1\d\d\), 2 new tokens \(length\).*",
                        lines[1]), lines


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_a_conversation_past_the_context_says_reset_and_goes_on(tiny_chat, tmp_path):
    """The turn that does not fit is not sent and not kept; the error says what a chat user can do (/reset,
    a larger --ctx-size next time), not 'shorten it' (the history is in the prompt); after /reset the chat goes
    on. A first message longer than the context alone asks for a shorter one (a short one and a huge one, whose
    refusal comes from another place)."""
    saved = tmp_path / "conv.json"
    turn = " ".join(f"w{i}" for i in range(10, 20)) + "\n"
    status, out, err = _piped("chat", "--model", str(tiny_chat), "--max-new-tokens", "30", "-q", "--ctx-size", "120",
                              stdin=turn * 4 + f"/save {saved}\n/reset\nw10\n")
    assert status == 1 and len(out.splitlines()) == 4
    assert _errors(err) == ["error: the conversation has outgrown the context of 120 positions, so this message was "
                            "not sent: /reset to start over (the system prompt stays); next time, a larger --ctx-size "
                            "(the model takes up to 256) holds more"]
    assert [m["role"] for m in json.loads(saved.read_text())] == ["user", "assistant"] * 3
    long_turn = " ".join(f"w{i}" for i in range(10, 40)) + "\n"
    huge_turn = "w10 " * 20000 + "\n"   # refused by a count of its first pieces (prompt.refuse_if_too_long)
    status, out, err = _piped("chat", "--model", str(tiny_chat), "-q", "--ctx-size", "20",
                              stdin=long_turn + huge_turn)
    assert status == 1 and out == "" and len(_errors(err)) == 2
    assert all("this message does not fit the context of 20 positions" in e and "send a shorter one" in e
               for e in _errors(err))


def test_a_block_between_quote_lines_is_one_message(tiny_chat, tmp_path):
    """A line of only \"\"\" opens a message of several lines (a /command among them is text), at a terminal
    (with a "... " prompt) and piped; input that ends inside a block sends nothing and says why."""
    saved, piped = tmp_path / "conv.json", tmp_path / "piped.json"
    child = _spawn("chat", "--model", str(tiny_chat), "--max-new-tokens", "2", "-q")
    child.expect("> ")
    child.sendline('"""')
    for line in ["w10 w11", "/help", '"""']:
        child.expect(r"\.\.\. ")
        child.sendline(line)
    child.expect("> ")
    child.sendline('"""')   # Ctrl-C drops an unfinished block
    child.expect(r"\.\.\. ")
    child.sendline("w12")
    child.expect(r"\.\.\. ")
    child.sendintr()
    child.expect("> ")
    child.sendline(f"/save {saved}")
    child.expect("saved 2 messages")
    child.expect("> ")
    child.sendeof()
    child.expect(pytest.importorskip("pexpect").EOF)
    child.close()
    assert child.exitstatus == 0 and "Traceback" not in child.before
    assert [m["content"] for m in json.loads(saved.read_text())][:1] == ["w10 w11\n/help"]

    status, out, err = _piped("chat", "--model", str(tiny_chat), "--max-new-tokens", "2", "-q",
                              stdin=f'w13\n"""\nw14\n\n  w15\n """ \n/save {piped}\n"""\nw16\n')
    assert status == 1 and len(out.splitlines()) == 2
    assert [m["content"] for m in json.loads(piped.read_text())][::2] == ["w13", "w14\n\n  w15"]
    assert _errors(err) == ['error: the input ended inside a message opened with """, so it was not sent; close '
                            'a message with a line of only """']


def test_file_sends_a_text_file_and_refuses_what_is_not_one(tiny_chat, tmp_path):
    """/file sends a file's text as the message, less one final line break (as --prompt-file); a missing file, a directory, a binary file (bytes that are not
    UTF-8, or NUL bytes), an empty one or one over the bound is one error line, and nothing is sent."""
    from ster_py.chat_files import MAX_MESSAGE_FILE_BYTES

    (tmp_path / "note.txt").write_text("w10 w11\nw12\n")
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    (tmp_path / "utf16.txt").write_bytes("w10".encode("utf-16-le"))
    (tmp_path / "empty.txt").write_text(" \n")
    with open(tmp_path / "huge.txt", "wb") as f:
        f.truncate(MAX_MESSAGE_FILE_BYTES + 1)   # sparse: refused by its size, never read
    saved = tmp_path / "conv.json"
    bad = ["missing.txt", ".", "image.png", "utf16.txt", "empty.txt", "huge.txt", "-", ""]
    stdin = "".join(f"/file {tmp_path / name if name not in ('-', '') else name}\n" for name in bad)
    status, out, err = _piped("chat", "--model", str(tiny_chat), "--max-new-tokens", "2", "-q",
                              stdin=stdin + f"/file {tmp_path / 'note.txt'}\n/save {saved}\n")
    assert status == 1 and len(out.splitlines()) == 1
    assert [m["content"] for m in json.loads(saved.read_text())][:1] == ["w10 w11\nw12"]   # one final "\n" dropped
    errors = _errors(err)
    assert len(errors) == len(bad), err
    for line, words in zip(errors, ["not found", "is a directory", "not UTF-8 text", "NUL bytes", "only whitespace",
                                    "larger than", "reads your messages from stdin", "needs a file name"]):
        assert words in line


def test_load_and_messages_go_on_from_a_saved_conversation(tiny_chat, tmp_path):
    """/load and --messages read what /save wrote; the next answer is a cold run's of the whole history. A bad
    file is one error naming what is wrong and changes nothing (the conversation, then /saved, is the same)."""
    first = tmp_path / "first.json"
    status, _, _ = _piped("chat", "--model", str(tiny_chat), "--max-new-tokens", "3", "-q", "--system", "w20",
                          stdin=f"w10 w11\n/save {first}\n")
    assert status == 0 and len(json.loads(first.read_text())) == 3
    (tmp_path / "object.json").write_text('{"role": "user", "content": "w1"}')
    (tmp_path / "norole.json").write_text('[{"content": "w1"}]')
    (tmp_path / "broken.json").write_text('[{"role": "user",')
    with open(tmp_path / "huge.json", "wb") as f:
        f.truncate((8 << 20) + 1)   # sparse: refused by its size, never read
    bad = {"missing.json": "not found", "object.json": "got a JSON object", "norole.json": 'message 0 has no "role"',
           "broken.json": "not valid JSON", ".": "is a directory", "huge.json": "larger than"}
    second = tmp_path / "second.json"
    stdin = "".join(f"/load {tmp_path / name}\n" for name in bad) + "/load\n/load -\n"
    stdin += f"/save {second}\n/load {first}\nw12\n/save {first}\n"
    status, out, err = _piped("chat", "--model", str(tiny_chat), "--max-new-tokens", "3", "--system", "w21",
                              stdin=stdin)
    assert status == 1 and len(out.splitlines()) == 1
    errors = _errors(err)
    assert len(errors) == len(bad) + 2, err
    for line, words in zip(errors, [*bad.values(), "/load needs a file name", "reads your messages from stdin"]):
        assert words in line
    assert json.loads(second.read_text()) == [{"role": "system", "content": "w21"}]   # untouched by the bad files
    assert "loaded 3 messages" in err
    messages = json.loads(first.read_text())
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    answer, ids = cold_answer(load_model(str(tiny_chat)), messages[:4], 3)
    assert messages[4]["content"] == answer and SUMMARY.search(err).group(1) == str(len(ids))

    status, out, err = _piped("chat", "--model", str(tiny_chat), "--max-new-tokens", "3", "-q",
                              "--messages", str(first), stdin=f"w13\n/save {first}\n")
    assert status == 0 and [m["role"] for m in json.loads(first.read_text())][5:] == ["user", "assistant"]
    (tmp_path / "none.json").write_text("[]\n")   # what /save writes before the first turn
    third = tmp_path / "third.json"
    status, out, err = _piped("chat", "--model", str(tiny_chat), "--max-new-tokens", "3", "--system", "w22",
                              "--messages", str(tmp_path / "none.json"), stdin=f"/save {third}\n/load {third}\n")
    assert status == 0 and "loaded 1 message from" in err and not _errors(err)
    # refused before any model is looked at: the model here does not exist
    for args, words in [(["--messages", str(tmp_path / "norole.json")], 'message 0 has no "role"'),
                        (["--messages", "-"], "reads your messages from stdin"),
                        (["--messages", str(first), "--system", "w2"], "has its own system prompt")]:
        status, _, err = _piped("chat", "--model", str(tmp_path / "nomodel"), *args, stdin="")
        assert status == 1 and len(_errors(err)) == 1 and words in err, err


def _peft_adapter(path, base: str, hidden: int, inner: int, rank: int = 4):
    """A PEFT LoRA directory on every layer's q_proj and down_proj, its factors random (large enough to change the
    answer), made for the model ``base``."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(3)
    tensors = {}
    for layer in range(3):
        for module, width in (("self_attn.q_proj", hidden), ("mlp.down_proj", inner)):
            key = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{key}.lora_A.weight"] = rng.standard_normal((rank, width)).astype(np.float32) * 0.5
            tensors[f"{key}.lora_B.weight"] = rng.standard_normal((hidden, rank)).astype(np.float32) * 0.5
    path.mkdir()
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": ["q_proj", "down_proj"],
        "base_model_name_or_path": base}))
    return path


def test_adapter_answers_as_generate_adapter_does(tiny_chat, tmp_path):
    """chat --adapter loads the model as generate --adapter does: the same greedy answer to the same prompt (not the
    base model's), the same warning (a PEFT adapter naming another base model), and the same refusal of an adapter
    for another width, before the model's weights are read."""
    cfg = json.loads((tiny_chat / "config.json").read_text())
    adapter = _peft_adapter(tmp_path / "peft", "someone/other-model", cfg["hidden_size"], cfg["intermediate_size"])
    common = ["--model", str(tiny_chat), "--max-new-tokens", "8", "-q"]
    status, out, err = _piped("generate", *common, "--adapter", str(adapter), "--json", "-p", "w10 w11", stdin="")
    assert status == 0, err
    expected, warnings = json.loads(out)["text"], [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "someone/other-model" in warnings[0]
    status, out, err = _piped("chat", *common, "--adapter", str(adapter), stdin="w10 w11\n")
    assert status == 0 and out == expected + "\n", (out, expected, err)
    assert [line for line in err.splitlines() if line.startswith("warning:")] == warnings
    status, base, _ = _piped("chat", *common, stdin="w10 w11\n")
    assert status == 0 and base != out   # the adapter changes the answer

    import shutil

    unread = tmp_path / "unread"   # weights a load would refuse: the adapter's refusal comes first
    shutil.copytree(tiny_chat, unread)
    (unread / "model.safetensors").write_bytes(b"not safetensors")
    wide = _peft_adapter(tmp_path / "wide", str(unread), 2 * cfg["hidden_size"], cfg["intermediate_size"])
    errors = []
    for command, stdin in (("generate", ""), ("chat", "w10\n")):
        status, _, err = _piped(command, "--model", str(unread), "-q", "--adapter", str(wide),
                                *(["-p", "w10"] * (command == "generate")), stdin=stdin)
        assert status == 1 and len(_errors(err)) == 1, err
        errors.append(_errors(err)[0])
    assert errors[0] == errors[1] and "made for another model width" in errors[0], errors


def test_hostile_input_lines_are_one_error_each_and_the_session_goes_on(tiny_chat, tmp_path):
    """A tester's piped input: a NUL byte in a /save, /load, /file or /vector path, bytes that are not UTF-8 in a
    /system line, a message or a block, a name of 5,000 characters, ESC sequences in a command or a path. Each is
    one error line (before: tracebacks that lost the session, the whole name printed, escapes sent raw to the
    terminal); ~ is the home folder; the good turn and the /save after them work."""
    long_name = "a" * 5000
    lines = [b"/save a\0b.json", b"/load a\0b.json", b"/file \0", b"/vector a\0b 1", b"/system be \xff nice",
             b"w10 \xff", b'"""', b"w11", b"\xfe", b'"""', b"/save " + long_name.encode(), b"/bogus\x1b[2J",
             b"/save /nonexist\x1b]0;PWNED\x07/x.json", b"w12", b"/save ~/c.json"]
    status, out, err = _piped("chat", "--model", str(tiny_chat), "--max-new-tokens", "2", "-q",
                              stdin=b"\n".join(lines) + b"\n", env={"HOME": str(tmp_path)})
    assert status == 1 and len(out.splitlines()) == 1 and "\x1b" not in err and "\x07" not in err, err
    errors = _errors(err)
    expected = ["cannot use /save a\\x00b.json: a path cannot hold a NUL byte",
                "cannot use /load a\\x00b.json: a path cannot hold a NUL byte",
                "cannot use /file \\x00: a path cannot hold a NUL byte",
                "cannot use /vector a\\x00b: a path cannot hold a NUL byte",
                "this command is not UTF-8 text (the byte 0xFF at character 11), so it was not run",
                "this message is not UTF-8 text (the byte 0xFF at character 4), so it was not sent",
                "this message is not UTF-8 text (the byte 0xFE at character 4), so it was not sent",
                f"cannot use /save {'a' * 60}...: File name too long",
                "unknown command /bogus\\x1b[2J;",
                "cannot write /nonexist\\x1b]0;PWNED\\x07/x.json:"]
    assert len(errors) == len(expected), err
    for line, words in zip(errors, expected):
        assert words in line and len(line) < 300, (line, words)
    assert [m["content"] for m in json.loads((tmp_path / "c.json").read_text())][:1] == ["w12"]   # no system prompt

    # text that is not Unicode from the other ways in: --system's bytes, a saved file's unpaired \\udcff escape
    (tmp_path / "odd.json").write_text('[{"role": "user", "content": "w10 \\udcff"}]')
    for args, stdin, words in [(["--system", b"be \xff"], "", "--system holds the lone surrogate U+DCFF"),
                               (["--messages", str(tmp_path / "odd.json")], "", "message 0 holds the lone surrogate"),
                               ([], f"/load {tmp_path / 'odd.json'}\n/save {tmp_path / 'odd2.json'}\n",
                                "message 0 holds the lone surrogate")]:
        status, _, err = _piped("chat", "--model", str(tiny_chat), "-q", *args, stdin=stdin)
        assert len(_errors(err)) == 1 and words in err, err
    assert json.loads((tmp_path / "odd2.json").read_text()) == []


def test_save_refuses_a_conversation_load_could_not_read_back(tiny_chat, tmp_path):
    """/load and --messages read at most 8 MiB; /save wrote any size. 200,000 short messages (6.4 MB as compact
    JSON, 10 MB as /save's indented JSON) are saved compact, so /save takes what /load took (it refused them);
    a conversation over 8 MiB even compact is one error and nothing written; after /reset it saves."""
    from ster_py.cli_template import MAX_INPUT_FILE_BYTES

    messages = [{"role": "user", "content": "w10"}] * 200_000
    (tmp_path / "many.json").write_text(json.dumps(messages, separators=(",", ":")))
    status, _, err = _piped("chat", "--model", str(tiny_chat), "-q", "--messages", str(tmp_path / "many.json"),
                            stdin=f"/save {tmp_path / 'back.json'}\n/load {tmp_path / 'back.json'}\n")
    assert status == 0 and not _errors(err) and json.loads((tmp_path / "back.json").read_text()) == messages
    messages = [{"role": "user", "content": "w10 " * 1000}] * 2_060   # 8,281,201 bytes compact
    (tmp_path / "most.json").write_text(json.dumps(messages, separators=(",", ":")))
    size = len(json.dumps([{"role": "system", "content": "w11 " * 30_000}, *messages], separators=(",", ":"))) + 1
    assert size > MAX_INPUT_FILE_BYTES
    status, _, err = _piped("chat", "--model", str(tiny_chat), "-q", "--messages", str(tmp_path / "most.json"),
                            "--system", "w11 " * 30_000,
                            stdin=f"/save {tmp_path / 'big.json'}\n/reset\n/save {tmp_path / 'small.json'}\n")
    assert status == 1 and _errors(err) == [f"error: /save {tmp_path / 'big.json'}: the conversation is {size:,} "
                                            f"bytes as JSON, over the {MAX_INPUT_FILE_BYTES:,} that /load and "
                                            "--messages read back, so nothing was written; /reset starts a new one"]
    assert not (tmp_path / "big.json").exists()
    assert json.loads((tmp_path / "small.json").read_text()) == [{"role": "system", "content": "w11 " * 30_000}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["back.json", "many.json", "most.json", "small.json"]


def test_load_refuses_what_the_template_cannot_render_and_normalizes_openai_forms(tmp_path):
    """/load and --messages took conversations the template could not render (null content, a list of numbers,
    an image part, a role it refuses), and every later turn failed on them; now each is one error at load and
    changes nothing. An assistant's null content beside tool_calls (OpenAI's form) is loaded as "", text parts
    as their text; NaN (which /save would write as invalid JSON) is refused."""
    path = chat_model(tmp_path / "strict")
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = ("{% for m in messages %}{% if m.role not in ['system', 'user', 'assistant'] %}"
                            "{{ raise_exception('no role ' + m.role) }}{% endif %}"
                            + CHAT_TEMPLATE[len("{% for m in messages %}"):])
    cfg["chat_template"] = cfg["chat_template"].replace("{{ m.content }}", "{{ m.content | trim }}")
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    files = {"nullc.json": ([{"role": "user", "content": None}], "null content"),
             "numbers.json": ([{"role": "user", "content": [1, 2]}], "content part"),
             "image.json": ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                            "content part"),
             "robot.json": ([{"role": "robot", "content": "w10"}], "cannot render that conversation"),
             "nan.json": ([{"role": "user", "content": "w10", "x": float("nan")}], "NaN or Infinity")}
    for name, (messages, _) in files.items():
        (tmp_path / name).write_text(json.dumps(messages))
    good = [{"role": "user", "content": [{"type": "text", "text": "w10"}, {"type": "text", "text": "w11"}]},
            {"role": "assistant", "content": None, "tool_calls": [call]}]
    (tmp_path / "good.json").write_text(json.dumps(good))
    saved = tmp_path / "saved.json"
    stdin = "".join(f"/load {tmp_path / name}\n" for name in files) + f"/save {saved}\n/load {tmp_path / 'good.json'}\n"
    stdin += f"w12\n/save {tmp_path / 'after.json'}\n"
    status, out, err = _piped("chat", "--model", str(path), "--max-new-tokens", "2", "-q", "--system", "w20",
                              stdin=stdin)
    errors = _errors(err)
    assert status == 1 and len(errors) == len(files), err
    for line, (_, words) in zip(errors, files.values()):
        assert words in line, line
    # the file and the template's own words, not the model's path nor advice to use another template
    assert errors[3] == (f"error: /load {tmp_path / 'robot.json'}: this model's chat template cannot render that "
                         "conversation, so it was not loaded: no role robot (template line 1)")
    assert json.loads(saved.read_text()) == [{"role": "system", "content": "w20"}]   # no bad file changed it
    after = json.loads((tmp_path / "after.json").read_text())
    assert after[0] == {"role": "user", "content": "w10\nw11"} and after[1]["content"] == ""
    assert [m["role"] for m in after] == ["user", "assistant", "user", "assistant"]
    for name, (_, words) in files.items():   # --messages: one error, before any turn
        status, out, err = _piped("chat", "--model", str(path), "-q", "--messages", str(tmp_path / name),
                                  stdin="w10\n")
        assert status == 1 and len(_errors(err)) == 1 and words in err and not out, err
        assert str(path) not in err, err


def test_a_block_over_the_file_bound_is_one_error_and_is_dropped(tiny_chat, tmp_path):
    """A \"\"\" block had no bound (400 MB piped took 1.7 GB, then failed in the template): past /file's bound
    (32 MiB) it is dropped up to its closing line with one error, and the chat goes on."""
    from ster_py.chat_files import MAX_MESSAGE_FILE_BYTES

    saved = tmp_path / "conv.json"
    line = "w10 " * (1 << 18)   # 1 MiB
    big = "\n".join([line] * ((MAX_MESSAGE_FILE_BYTES >> 20) + 1))
    status, out, err = _piped("chat", "--model", str(tiny_chat), "--max-new-tokens", "2", "-q",
                              stdin=f'"""\n{big}\n"""\nw11\n/save {saved}\n')
    assert status == 1 and len(out.splitlines()) == 1
    assert _errors(err) == [f"error: this message is longer than {MAX_MESSAGE_FILE_BYTES:,} bytes (32 MiB, as /file "
                            "reads), so it was not sent; send a shorter one"]
    assert [m["content"] for m in json.loads(saved.read_text())][::2] == ["w11"]


def test_messages_expands_a_leading_tilde(tiny_chat, tmp_path):
    """--messages ~/FILE reads FILE in the home folder, as the README says a FILE takes (it was "not found")."""
    (tmp_path / "conv.json").write_text('[{"role": "user", "content": "w10"}, {"role": "assistant", "content": "w11"}]')
    status, _, err = _piped("chat", "--model", str(tiny_chat), "-q", "--messages", "~/conv.json",
                            stdin=f"/save {tmp_path / 'out.json'}\n", env={"HOME": str(tmp_path)})
    assert status == 0 and not _errors(err), err
    assert len(json.loads((tmp_path / "out.json").read_text())) == 2


def test_piped_input_with_a_failed_line_exits_1_after_going_on(tiny_chat, tmp_path):
    """Piped, a chat whose lines failed (a bad command, a failed /load, a message too long) exited 0, so a script
    could not tell; it now goes on through the input as before, then exits 1. With no error it exits 0; at a
    terminal it exits 0 whatever failed (test_commands_and_errors_keep_the_session)."""
    saved = tmp_path / "conv.json"
    status, out, err = _piped("chat", "--model", str(tiny_chat), "--max-new-tokens", "2", "-q",
                              stdin=f"/nope\n/load {tmp_path / 'missing.json'}\nw10\n/save {saved}\n")
    assert status == 1 and len(_errors(err)) == 2 and len(out.splitlines()) == 1, err
    assert [m["content"] for m in json.loads(saved.read_text())][:1] == ["w10"]   # the lines after them ran
    status, out, err = _piped("chat", "--model", str(tiny_chat), "--max-new-tokens", "2", "-q", "--ctx-size", "8",
                              stdin="w10 w11 w12 w13 w14 w15 w16 w17 w18\n")
    assert status == 1 and len(_errors(err)) == 1 and "does not fit the context" in err
    status, out, err = _piped("chat", "--model", str(tiny_chat), "--max-new-tokens", "2", "-q", stdin="w10\n/help\n")
    assert status == 0 and not _errors(err) and len(out.splitlines()) == 1


def test_messages_says_what_it_loaded_and_save_names_a_dangling_symlink(tiny_chat, tmp_path):
    """--messages printed nothing of what it loaded, where /load says "(loaded 3 messages from ...)": it says
    the same (stderr, not with -q). /save to a symlink whose file is missing said "that file exists and is
    not a saved conversation": it says what the name is, and still writes nothing."""
    conv, link = tmp_path / "conv.json", tmp_path / "link.json"
    conv.write_text(json.dumps([{"role": "user", "content": "w10"}, {"role": "assistant", "content": "w11"},
                                {"role": "user", "content": "w12"}]))
    link.symlink_to(tmp_path / "gone.json")
    status, out, err = _piped("chat", "--model", str(tiny_chat), "--max-new-tokens", "1", "--messages", str(conv),
                              "--system", "w20", stdin=f"/save {link}\n")
    assert f"(loaded 3 messages from {conv}; the next answer reads them all)\n" in err, err
    assert _errors(err) == [f"error: /save {link}: that is a symlink to a missing file ({tmp_path / 'gone.json'}); "
                            "give another name, or remove the link"], err
    assert status == 1 and link.is_symlink() and not (tmp_path / "gone.json").exists()
    status, out, err = _piped("chat", "--model", str(tiny_chat), "--max-new-tokens", "1", "-q",
                              "--messages", str(conv), stdin="")
    assert status == 0 and "loaded" not in err, err


def test_save_goes_back_to_the_file_messages_loaded_under_a_system_prompt(tiny_chat, tmp_path):
    """`ster chat --messages conv.json --system TEXT` then `/save conv.json` said "conv.json holds another
    conversation", though the chat continued that very file (--system put its prompt before the file's messages).
    It is saved there now, the file's messages after the system prompt; another conversation is still refused and
    the file left as it was."""
    conv = tmp_path / "conv.json"
    saved = [{"role": "user", "content": "w10"}, {"role": "assistant", "content": "w11"}]
    conv.write_text(json.dumps(saved))
    status, out, err = _piped("chat", "--model", str(tiny_chat), "--max-new-tokens", "2", "-q", "--messages",
                              str(conv), "--system", "w20", stdin=f"w12\n/save {conv}\n")
    assert status == 0 and not _errors(err), err
    messages = json.loads(conv.read_text())
    assert messages[:3] == [{"role": "system", "content": "w20"}, *saved]
    assert [m["role"] for m in messages[3:]] == ["user", "assistant"] and messages[3]["content"] == "w12"
    before = conv.read_bytes()
    other = tmp_path / "other.json"
    other.write_text(json.dumps([{"role": "user", "content": "w30"}, {"role": "assistant", "content": "w31"}]))
    for args in (["--messages", str(other)], ["--messages", str(other), "--system", "w20"], ["--system", "w20"]):
        status, out, err = _piped("chat", "--model", str(tiny_chat), "--max-new-tokens", "2", "-q", *args,
                                  stdin=f"w12\n/save {conv}\n")
        assert status == 1 and _errors(err) == [f"error: {conv} holds another conversation (5 messages); /save to "
                                                "a new name"], (args, err)
        assert conv.read_bytes() == before


def test_chat_with_a_drafter_counts_the_drafted_tokens_per_turn(tiny_chat, tmp_path):
    """`ster chat --draft MODEL` printed no drafted/accepted counts, where `ster generate --draft` says "34 of 42
    drafted tokens accepted": each turn's summary says it now, as generate's does; without --draft, nothing."""
    drafter = tmp_path / "drafter"
    make_checkpoint(drafter, "llama", seed=5, num_hidden_layers=1)
    args = ("chat", "--model", str(tiny_chat), "--max-new-tokens", "6")
    status, out, err = _piped(*args, "--draft", str(drafter), "--draft-max", "3", stdin="w10 w11\nw12\n")
    assert status == 0, err
    counts = [tuple(map(int, m)) for m in re.findall(r"; prefill [\d.]+ tok/s.*, (\d+) of (\d+) drafted tokens? "
                                                     r"accepted\n", err)]
    assert len(counts) == 2 and len(SUMMARY.findall(err)) == 2, err
    assert all(0 <= accepted <= drafted and drafted > 0 for accepted, drafted in counts), counts
    status, out, err = _piped(*args, stdin="w10 w11\n")
    assert status == 0 and len(SUMMARY.findall(err)) == 1 and "drafted" not in err, err


def test_session_reply_checks_its_stop_strings(tiny_chat):
    """``Session.reply(stops=...)`` as a library call: one text is one stop string (it was read as its
    characters: "w99" cut the reply at its first "w"), and an empty one is refused as ``--stop ""`` is."""
    from ster_py.conversation import Session
    from ster_py.errors import SterError

    loaded = load_model(str(tiny_chat))
    messages = [{"role": "user", "content": "w10 w11"}]
    plain = Session(loaded).reply(messages, Sampling(max_new_tokens=6))
    assert "w" in plain.text and "w99" not in plain.text
    assert Session(loaded).reply(messages, Sampling(max_new_tokens=6), stops="w99").text == plain.text
    first = plain.text.split()[0]
    assert Session(loaded).reply(messages, Sampling(max_new_tokens=6), stops=first).text == plain.text[:plain.text.index(first)]
    with pytest.raises(SterError, match="non-empty"):
        Session(loaded).reply(messages, Sampling(max_new_tokens=6), stops=[""])
    # other library misuse: each was an AttributeError or TypeError, or (no messages) a reply to nothing
    for args, kwargs, words in (((messages, None), {}, "are a Sampling"), ((messages, {"max_new_tokens": 2}), {}, "are a Sampling"),
                                (([], Sampling(max_new_tokens=2)), {}, "conversation is empty"),
                                ((messages, Sampling(max_new_tokens=2)), {"stops": 5}, "stop strings are texts")):
        with pytest.raises(SterError, match=words):
            Session(loaded).reply(*args, **kwargs)
    for wrong in (None, str(tiny_chat)):   # an AttributeError on .spec
        with pytest.raises(SterError, match="Session takes a loaded model"):
            Session(wrong)


@pytest.mark.parametrize("kwargs, words", [
    ({"ctx_size": "64"}, r"^--ctx-size must be a whole number of positions, got '64'$"),   # was a TypeError ('<')
    ({"ctx_size": 5.5}, r"got 5\.5$"),                 # was a context of 5.5 positions
    ({"draft": "a-model"}, r"^Session's draft takes a drafter \(speculative\.load_drafter"),  # was an AttributeError
])                                                                                          # in the first reply
def test_session_refuses_settings_of_the_wrong_type(tiny_chat, kwargs, words):
    from ster_py.conversation import Session
    from ster_py.errors import SterError

    with pytest.raises(SterError, match=words):
        Session(load_model(str(tiny_chat)), **kwargs)


@pytest.mark.parametrize("kwargs, words", [
    ({"raw": 5}, r"^Session\.reply's raw must be the text to continue \(a str\) or None, got int$"),  # len() TypeError
    ({"prompt": 5}, r"^Session\.reply's prompt must be the \(text, ids\) pair Session\.prompt returns, got int$"),
    ({"layer_hook": 5}, r"^Session\.reply's layer_hook must be a function or None, got int$"),  # 'not callable'
    ({"on_event": "print"}, r"on_event must be a function or None, got str$"),
    ({"cancelled": True}, r"cancelled must be a function or None, got bool$"),
    # tools and thinking reached the template unchecked: "x" as the template's tools, "off" as a true switch
    ({"tools": "x"}, r"^tools: expected a JSON list such as .*, got a string$"),
    ({"tools": [5]}, r"^tools: tool 0 is a number, not an object"),
    ({"thinking": "off"}, r"^thinking must be True, False or None \(the template's default\), got 'off'$"),
])
def test_session_reply_refuses_arguments_of_the_wrong_type(tiny_chat, kwargs, words):
    """Each was a TypeError from inside the reply (after the prompt's prefill for the callbacks), or (tools,
    thinking) reached the chat template as they were: the server and --tools check tools, Session did not."""
    from ster_py.conversation import Session
    from ster_py.errors import SterError

    with pytest.raises(SterError, match=words):
        Session(load_model(str(tiny_chat))).reply([{"role": "user", "content": "w5"}], Sampling(max_new_tokens=2),
                                                  **kwargs)


def test_session_reads_content_parts_as_the_server_does(tiny_chat):
    """Session.reply takes OpenAI-shaped messages, but content given as text parts reached the template as a list
    (a template adding content to a string failed: 'can only concatenate str (not "list")'), an image part
    likewise, and a user's null content as None: they are read as ster serve reads them (texts joined by
    newlines; other parts and null content refused by name), in reply and prepare alike."""
    from ster_py.conversation import Session
    from ster_py.errors import SterError

    session = Session(load_model(str(tiny_chat)))
    parts = [{"role": "user", "content": [{"type": "text", "text": "w5"}, {"type": "text", "text": "w6"}]}]
    joined = [{"role": "user", "content": "w5\nw6"}]
    assert session.reply(parts, Sampling(max_new_tokens=3)).prompt_ids == \
        session.reply(joined, Sampling(max_new_tokens=3)).prompt_ids
    for content, words in (([{"type": "image_url", "image_url": {"url": "x"}}],
                            'message 0 has a content part of type "image_url"'),
                           (None, 'message 0 \\("user"\\) has null content')):
        for call in (lambda m: session.reply(m, Sampling(max_new_tokens=1)), session.prepare):
            with pytest.raises(SterError, match=f"^messages: {words}"):
                call([{"role": "user", "content": content}])


def test_decoder_forward_refuses_a_hook_that_is_not_callable(tiny_chat):
    from ster_py.errors import SterError

    decoder = load_model(str(tiny_chat)).decoder
    for kwargs, name in (({"layer_hook": 5}, "layer_hook"), ({"on_layer": "x"}, "on_layer")):
        with pytest.raises(SterError, match=f"^Decoder.forward's {name} must be a function or None"):
            decoder.forward([5, 6], **kwargs)   # was a TypeError after the first layer ran


def test_session_prepare_refuses_what_is_no_conversation(tiny_chat):
    """Session.prepare("hi") or (None) returned 0 (nothing prefilled, no error): the template's refusal was
    taken for a conversation it cannot end there. The messages are checked as reply checks them."""
    from ster_py.conversation import Session
    from ster_py.errors import SterError

    session = Session(load_model(str(tiny_chat)))
    for wrong, words in (("w5", "got a string"), (None, "got a null"), ([], "conversation is empty")):
        with pytest.raises(SterError, match=f"^messages: .*{words}"):
            session.prepare(wrong)
    assert session.prepare([{"role": "user", "content": "w5"}, {"role": "assistant", "content": "w6"}]) > 0


def test_vector_without_a_strength_steers_at_1_as_the_option_does(tiny_chat, tmp_path):
    """``/vector FILE`` needed a strength where ``--vector FILE`` defaults it to 1: it now steers at 1, the answer
    that of ``/vector FILE 1`` and of ``--vector FILE``, and says so; ``/vector FILE S`` still takes S."""
    import numpy as np

    from ster_py.steering import SteeringVector, write_vector

    hidden = json.loads((tiny_chat / "config.json").read_text())["hidden_size"]
    rng = np.random.default_rng(5)
    dirs = {i: rng.standard_normal(hidden) for i in (0, 1)}
    vec = SteeringVector(str(tiny_chat), None, hidden, "t", "caa",
                         {i: (d / np.linalg.norm(d)).astype(np.float32) for i, d in dirs.items()})
    path = tmp_path / "v.json"
    write_vector(vec, path)
    common = ["chat", "--model", str(tiny_chat), "--max-new-tokens", "8", "-q"]
    status, plain, _ = _piped(*common, stdin="w10 w11\n")
    assert status == 0
    status, option, _ = _piped(*common, "--vector", str(path), stdin="w10 w11\n")
    assert status == 0 and option != plain   # the vector changes the answer at strength 1
    status, out, err = _piped(*common, stdin=f"/vector {path}\nw10 w11\n")
    assert status == 0 and out == option, (out, option, err)
    assert f"(steering with {path} at 1)" in err
    status, out, err = _piped(*common, stdin=f"/vector {path} 1\nw10 w11\n/reset\n/vector {path} 0\nw10 w11\n")
    assert status == 0 and out == option + plain, (out, err)
    assert f"(steering with {path} at 0)" in err
    status, _, err = _piped(*common, stdin="/help\n")
    assert status == 0 and "/vector FILE [S]        steer from now on at strength S, default 1" in err, err
