"""Reasoning and tool calls parsed from a reply, against llama.cpp's 70 chat templates.

The oracle is each template itself: a conversation whose last assistant message carries a
known tool call (or known reasoning) is rendered, the part the assistant's turn adds is taken
as the model's reply (everything after the prompt the same template renders for the turn
before it), and the parser must give back that call (or reasoning) from the reply alone,
whole or streamed in pieces of any size. The syntax is detected from the template text (no
vocabulary given: the markers the template writes are taken as present), never from a name.

Templates that write their calls in a syntax outside the five of seed 000 are listed with
what the parser gives for them (an error item where the detected syntax's markers open the
call, plain text otherwise), so a change in that behaviour shows here.
"""
from __future__ import annotations

import random

import pytest

from ster_py.chat import render_chat
from ster_py.tokenizer import END_OF_GENERATION_TOKENS
from ster_py.reply import ReplyFormat, ReplyParser, blocks_of, detect_format
from test_templates import BOS, EOS, TEMPLATE_NAMES, TOOL_TURNS, TOOLS, USER, _source, templates_dir  # noqa: F401
from tiny import PINNED

CALL = {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "°C"}}
REASONING = "Two plus two is four."
THINK_TURNS = [{"role": "user", "content": "2+2?"},
               {"role": "assistant", "content": "4", "reasoning_content": REASONING}]

# Templates whose own rendering of a tool call parses back to that call, by syntax.
PARSED = {
    "tagged_json": ["Bielik-11B-v3.0-Instruct", "MiMo-VL", "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
                    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "Qwen-QwQ-32B", "Qwen-Qwen2.5-7B-Instruct",
                    "Qwen-Qwen3-0.6B", "Reka-Edge", "ibm-granite-granite-4.0", "ibm-granite-granite-4.1"],
    "xml": ["NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "Qwen3-Coder", "Qwen3.5-4B", "StepFun3.5-Flash"],
    "gemma4": ["google-gemma-4-31B-it", "google-gemma-4-31B-it-interleaved"],
    "bare_json": ["meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.2-3B-Instruct",
                  "meta-llama-Llama-3.3-70B-Instruct"],
}
# <tool_call> in the template (tagged JSON detected) around another syntax (GLM's <arg_key>/<arg_value>,
# MiniMax's <invoke>): a well-formed call of these models is reported as malformed.
OTHER_SYNTAX = ["GLM-4.6", "GLM-4.7-Flash", "MiniMax-M3", "Spark2.5", "inclusionai-ling-3.0-flash", "poolside-Laguna-S-2.1",
                "poolside-Laguna-XS-2.1", "poolside-Laguna-XS.2"]
# Templates that cannot render this tool-call conversation (transformers refuses it too,
# tests/test_templates.py) or do not write tool calls from the history at all.
NO_CALL_RENDERED = ["CohereForAI-c4ai-command-r-plus-tool_use", "HuggingFaceTB-SmolLM3-3B", "Kimi-K2-Instruct",
                    "Kimi-K2-Thinking", "LFM2-8B-A1B", "LFM2.5-Instruct", "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
                    "fireworks-ai-llama-3-firefunction-v2", "google-gemma-2-2b-it",
                    "ibm-granite-granite-3.3-2B-Instruct", "llama-cpp-deepseek-r1", "llama-cpp-rwkv-world",
                    "meetkai-functionary-medium-v3.2", "microsoft-Phi-3.5-mini-instruct"]
# Templates whose rendered history keeps the reasoning of the last assistant turn as a
# <think> (or Gemma 4 channel) block: the parser must give it back as thinking.
THINKING_RENDERED = ["Bielik-11B-v3.0-Instruct", "GLM-4.6", "GLM-4.7-Flash", "LFM2.5-8B-A1B", "MiniMax-M2",
                     "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "Qwen-Qwen3-0.6B", "Qwen3.5-4B", "Spark2.5",
                     "StepFun3.5-Flash", "inclusionai-ling-3.0-flash", "openbmb-MiniCPM5-1B", "poolside-Laguna-S-2.1",
                     "poolside-Laguna-XS-2.1", "poolside-Laguna-XS.2"]


# Rendered in this process (conftest.chat_in_process): these tests compare the rendering itself.
pytestmark = pytest.mark.usefixtures("chat_in_process")


def render(template: str, messages, add_generation_prompt: bool, **extra) -> str:
    return render_chat(template, messages, add_generation_prompt=add_generation_prompt, bos_token=BOS,
                       eos_token=EOS, now=PINNED, **extra)


def assistant_reply(template: str, messages, **extra) -> tuple[str, str]:
    """(prompt, reply): the prompt the template renders before the last message (with the
    generation prompt), and what the last (assistant) message adds after the longest part the
    two renders share, cut back to a markup boundary (after '>' or a newline) so no marker is
    split between them. The reply ends where the model would stop: at the first end-of-generation
    token text (seed 000's list, and the EOS), which generation never streams."""
    prompt = render(template, messages[:-1], True, **extra)
    full = render(template, messages, False, **extra)
    n = 0
    for a, b in zip(prompt, full):
        if a != b:
            break
        n += 1
    while 0 < n < len(prompt) and prompt[n - 1] not in ">\n":
        n -= 1
    reply = full[n:]
    ends = [i for i in (reply.find(t) for t in (*END_OF_GENERATION_TOKENS, EOS)) if i >= 0]
    return prompt[:n], reply[:min(ends, default=len(reply))]


def parse(fmt: ReplyFormat, text: str, pieces=None, thinking: bool = False) -> list[dict]:
    parser = ReplyParser(fmt, thinking=thinking)
    events = []
    for piece in (pieces if pieces is not None else [text]):
        events += parser.feed(piece)
    events += parser.finish()
    return [{k: v for k, v in b.items() if k != "id"} for b in blocks_of(events)]


def random_pieces(text: str, rng: random.Random) -> list[str]:
    out, i = [], 0
    while i < len(text):
        n = rng.randint(1, 4)
        out.append(text[i:i + n])
        i += n
    return out


def _calls(blocks):
    return [b for b in blocks if b["type"] == "tool_call"]


def test_expectation_lists_cover_each_template_once():
    listed = [n for names in PARSED.values() for n in names] + OTHER_SYNTAX + NO_CALL_RENDERED
    assert len(listed) == len(set(listed))
    assert set(listed) <= set(TEMPLATE_NAMES)


@pytest.mark.parametrize("name", TEMPLATE_NAMES)
def test_tool_calls_parse_back_from_each_templates_own_rendering(templates_dir, name):  # noqa: F811
    template = _source(templates_dir, name)
    fmt = detect_format(template)
    syntax = next((s for s, names in PARSED.items() if name in names), None)
    try:
        prompt, reply = assistant_reply(template, TOOL_TURNS[:2], tools=TOOLS)
    except Exception:  # noqa: BLE001 - the template refuses this conversation
        assert name in NO_CALL_RENDERED
        return
    if "get_weather" not in reply:
        assert name in NO_CALL_RENDERED
        return
    assert name not in NO_CALL_RENDERED
    thinking = fmt.starts_thinking(prompt)
    whole = parse(fmt, reply, thinking=thinking)
    if syntax is not None:
        assert fmt.tools == syntax
        assert _calls(whole) == [{"type": "tool_call", **CALL}], (name, reply)
        assert not [b for b in whole if b["type"] == "error"]
        # whatever text the reply holds is after the call (the end-of-turn markup)
        assert whole[0]["type"] in ("tool_call", "thinking"), whole
    elif name in OTHER_SYNTAX:
        assert fmt.tools == "tagged_json"
        errors = [b for b in whole if b["type"] == "error"]
        assert len(errors) == 1 and errors[0]["message"].startswith("malformed tool call: <tool_call>")
        assert "get_weather" in errors[0]["message"] and not _calls(whole)
    else:
        assert not _calls(whole) and not [b for b in whole if b["type"] == "error"]
        assert "get_weather" in "".join(b.get("text", "") for b in whole)  # the reply is plain text
    # the same reply streamed in pieces of 1 to 4 characters, and one character at a time
    rng = random.Random(name)
    assert parse(fmt, reply, random_pieces(reply, rng), thinking=thinking) == whole
    assert parse(fmt, reply, list(reply), thinking=thinking) == whole


def test_every_syntax_is_exercised_by_a_template(templates_dir):  # noqa: F811
    found = {detect_format(_source(templates_dir, n)).tools for names in PARSED.values() for n in names}
    assert found == {"tagged_json", "xml", "gemma4", "bare_json"}  # Granite's opener: test_granite_* below


@pytest.mark.parametrize("name", TEMPLATE_NAMES)
def test_reasoning_parses_back_from_each_templates_own_rendering(templates_dir, name):  # noqa: F811
    template = _source(templates_dir, name)
    fmt = detect_format(template)
    try:
        prompt, reply = assistant_reply(template, THINK_TURNS)
    except Exception:  # noqa: BLE001 - refused: no reasoning to read back
        assert name not in THINKING_RENDERED
        return
    if REASONING not in reply or fmt.think is None:
        assert name not in THINKING_RENDERED, (fmt, reply)
        return
    assert name in THINKING_RENDERED, (fmt, reply)
    thinking = fmt.starts_thinking(prompt)
    for pieces in (None, list(reply), random_pieces(reply, random.Random(name))):
        blocks = parse(fmt, reply, pieces, thinking=thinking)
        assert blocks[0] == {"type": "thinking", "text": REASONING}, (name, reply)
        assert blocks[1]["type"] == "text" and blocks[1]["text"].startswith("4")


@pytest.mark.parametrize("name", TEMPLATE_NAMES)
def test_thinking_switch_and_starting_state_follow_the_template(templates_dir, name):  # noqa: F811
    """A template that reads enable_thinking/thinking renders a different prompt for on and off;
    a prompt ending inside an open block starts the reply in thinking, and such a block is open
    only when thinking is on (or the template always opens it)."""
    template = _source(templates_dir, name)
    fmt = detect_format(template)
    try:
        on = render(template, [USER], True, enable_thinking=True, thinking=True)
        off = render(template, [USER], True, enable_thinking=False, thinking=False)
    except Exception:  # noqa: BLE001 - this template refuses a plain turn (tests/test_templates.py)
        return
    if fmt.thinking_switch is not None:
        single = render(template, [USER], True, **{fmt.thinking_switch: False})
        assert single == off, "the detected switch alone turns thinking off"
        assert on != off
    if fmt.starts_thinking(off):  # a template that opens the block whatever the switch says
        assert fmt.starts_thinking(on)


@pytest.mark.parametrize("name", TEMPLATE_NAMES)
def test_a_switch_that_changes_the_prompt_is_detected(templates_dir, name):  # noqa: F811
    """Whether or not the template writes <think> markers (Apertus, Command R7B and Kimi K3 mark
    reasoning otherwise), a variable that changes the rendered prompt is the switch --thinking sets."""
    template = _source(templates_dir, name)
    changes = []
    for var in ("enable_thinking", "thinking"):
        try:
            if render(template, [USER], True, **{var: True}) != render(template, [USER], True, **{var: False}):
                changes.append(var)
        except Exception:  # noqa: BLE001 - this template refuses a plain turn (tests/test_templates.py)
            return
    if changes:
        assert detect_format(template).thinking_switch in changes


# ------------------------------------------------------------------ synthetic replies per syntax

TAGGED = ReplyFormat(think=("<think>", "</think>"), tools="tagged_json", tool_close="</tool_call>")
TAGGED_OPEN = ReplyFormat(tools="tagged_json", tool_close=None)
XML = ReplyFormat(think=("<think>", "</think>"), tools="xml", tool_close="</tool_call>")
GEMMA4 = ReplyFormat(think=("<|channel>", "<channel|>"), think_header="thought", tools="gemma4",
                     tool_close="<tool_call|>")
GRANITE = ReplyFormat(think=("<think>", "</think>"), tools="granite", tool_close=None)
GRANITE_CLOSED = ReplyFormat(tools="granite", tool_close="<|/tool_call|>")
BARE = ReplyFormat(tools="bare_json")


@pytest.mark.parametrize("fmt, reply, expected", [
    # tagged JSON: one object, a list, text around, every call-object shape of seed 000
    (TAGGED, '<think>\nhm\n</think>\n\nSure.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
     [("thinking", "hm"), ("text", "Sure."), ("call", "f", {"a": 1})]),
    (TAGGED, '<tool_call>[{"name": "f", "arguments": {}}, {"name": "g", "parameters": {"b": [1, 2]}}]</tool_call>',
     [("call", "f", {}), ("call", "g", {"b": [1, 2]})]),
    (TAGGED, '<tool_call>{"function": "f", "arguments": {"a": "x"}}</tool_call>', [("call", "f", {"a": "x"})]),
    (TAGGED, '<tool_call>{"type": "function", "function": {"name": "f", "arguments": "{\\"a\\": 2}"}}</tool_call>',
     [("call", "f", {"a": 2})]),
    (TAGGED, '<tool_call>{"function": {"name": "f"}, "arguments": {"a": 3}}</tool_call>', [("call", "f", {"a": 3})]),
    (TAGGED, '<tool_call>{"name": "f", "arguments": null}</tool_call>', [("call", "f", {})]),
    (TAGGED, '<tool_call>{"name": "f"}</tool_call>then', [("call", "f", {}), ("text", "then")]),
    (TAGGED, '<tool_call>[]</tool_call>after', [("error", "<tool_call>[]</tool_call>"), ("text", "after")]),
    (TAGGED, '<tool_call>{"arguments": {}}</tool_call>after', [("error", '<tool_call>{"arguments": {}}</tool_call>'),
                                                               ("text", "after")]),
    (TAGGED, '<tool_call>{"name": "f", "arguments": [1]}</tool_call>x', [("error", None), ("text", "x")]),
    (TAGGED, '<tool_call>{"name": "f", "arguments": "not json"}</tool_call>', [("error", None)]),
    (TAGGED, '<tool_call>{"name": "f", "arguments": {</tool_call>\nstill here', [("error", None), ("text", "still here")]),
    (TAGGED, 'a </think> b', [("text", "a  b")]),  # a close marker with no open one is dropped
    (TAGGED, 'a <tool b', [("text", "a <tool b")]),
    (TAGGED_OPEN, 'ok <tool_call>{"name": "f", "arguments": {"a": 1}}', [("text", "ok"), ("call", "f", {"a": 1})]),
    # XML: values as JSON when they are JSON, text otherwise; multi-line text kept
    (XML, '<tool_call>\n<function=f>\n<parameter=n>\n42\n</parameter>\n<parameter=s>\nline 1\nline 2\n</parameter>\n'
          '<parameter=b>\ntrue\n</parameter>\n<parameter=o>\n{"k": [1]}\n</parameter>\n</function>\n</tool_call>',
     [("call", "f", {"n": 42, "s": "line 1\nline 2", "b": True, "o": {"k": [1]}})]),
    (XML, '<tool_call>\n<parameter=a>\n1\n</parameter>\n</tool_call>more', [("error", None), ("text", "more")]),
    (XML, '<tool_call>\n<function=f>\n</function>\njunk</tool_call>', [("error", None)]),
    # Gemma 4: the channel's header word is dropped; strings between <|"|>, nested values
    (GEMMA4, '<|channel>thought\nLet me see.<channel|>The answer.', [("thinking", "Let me see."), ("text", "The answer.")]),
    (GEMMA4, '<|tool_call>call:f{a:<|"|>x, y<|"|>,n:3,b:true,l:[1,<|"|>z<|"|>],o:{k:<|"|>v<|"|>}}<tool_call|>',
     [("call", "f", {"a": "x, y", "n": 3, "b": True, "l": [1, "z"], "o": {"k": "v"}})]),
    (GEMMA4, '<|tool_call>call:f{}<tool_call|><|tool_call>call:g{x:1.5}<tool_call|>',
     [("call", "f", {}), ("call", "g", {"x": 1.5})]),
    (GEMMA4, '<|tool_call>call:f{a:<|"|>x}<tool_call|>after', [("error", None), ("text", "after")]),
    (GEMMA4, '<|tool_call>f{a:1}<tool_call|>', [("error", None)]),
    # Granite: <|tool_call|> or the plain <tool_call>, a JSON list to the end (or to its closer)
    (GRANITE, 'x<|tool_call|>[{"name": "f", "arguments": {"a": 1}}]', [("text", "x"), ("call", "f", {"a": 1})]),
    (GRANITE, '<tool_call>[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]',
     [("call", "f", {}), ("call", "g", {})]),
    (GRANITE, '<|tool_call|>[]', [("error", "<|tool_call|>[]")]),
    (GRANITE_CLOSED, '<|tool_call|>[{"name": "f", "arguments": {}}]<|/tool_call|>done',
     [("call", "f", {}), ("text", "done")]),
    # bare JSON (Llama 3.x): a whole reply; <|python_tag|> bodies
    (BARE, ' {"name": "f", "parameters": {"a": 1}}', [("call", "f", {"a": 1})]),
    (BARE, '{"name": "f", "arguments": {"a": 1}}', [("call", "f", {"a": 1})]),
    (BARE, '{"a": 1} is JSON', [("text", '{"a": 1} is JSON')]),
    (BARE, '{"name": "f"}', [("text", '{"name": "f"}')]),  # no arguments: not a call
    (BARE, '{"name": "f", "parameters": 3}', [("error", None)]),
    (BARE, 'Hello {"name": "f", "parameters": {}}', [("text", 'Hello {"name": "f", "parameters": {}}')]),
    (BARE, '<|python_tag|>{"name": "f", "parameters": {"q": "x"}}', [("call", "f", {"q": "x"})]),
    (BARE, '<|python_tag|>print(1 + 1)', [("call", "python", {"code": "print(1 + 1)"})]),
])
def test_synthetic_replies(fmt, reply, expected):
    rng = random.Random(reply)
    for pieces in (None, list(reply), random_pieces(reply, rng)):
        blocks = parse(fmt, reply, pieces)
        got = []
        for b in blocks:
            if b["type"] == "tool_call":
                got.append(("call", b["name"], b["arguments"]))
            elif b["type"] == "error":
                assert b["message"].startswith("malformed tool call: ")
                got.append(("error", b["message"][len("malformed tool call: "):]))
            else:
                got.append((b["type"], b["text"]))
        want = [(k, got[i][1] if k == "error" and v is None and i < len(got) else v, *rest)
                for i, (k, v, *rest) in enumerate(expected)]
        assert got == want, (reply, pieces)


def test_reply_starting_inside_thinking():
    assert parse(TAGGED, "a\nb\n</think>\n\nanswer", thinking=True) == [
        {"type": "thinking", "text": "a\nb"}, {"type": "text", "text": "answer"}]
    # unclosed at the end: everything was thinking
    assert parse(TAGGED, "still thinking", thinking=True) == [{"type": "thinking", "text": "still thinking"}]


def test_plain_text_comes_out_unchanged():
    text = "  Hello,\n\nworld  <b> { not json\n"
    for fmt in (ReplyFormat(), TAGGED, XML, GEMMA4, GRANITE):
        assert parse(fmt, text, list(text)) == [{"type": "text", "text": text}]


def test_tools_off_leaves_call_markup_as_text():
    reply = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    parser = ReplyParser(TAGGED, tools=False)
    assert blocks_of(parser.feed(reply) + parser.finish()) == [{"type": "text", "text": reply}]


def test_gemma4_needs_both_markers_in_the_vocabulary(templates_dir):  # noqa: F811
    template = _source(templates_dir, "google-gemma-4-31B-it")
    assert detect_format(template, {"<|tool_call>", "<tool_call|>", "<|channel>", "<channel|>"}).tools == "gemma4"
    fmt = detect_format(template, {"<|tool_call>"})
    assert fmt.tools != "gemma4" and fmt.think is None
