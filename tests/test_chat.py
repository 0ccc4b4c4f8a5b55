"""ster_py.chat against transformers' apply_chat_template(..., tokenize=False).

Inline templates exercise each convention of Hugging Face's Jinja environment
(trim/lstrip, loop controls, raise_exception, tojson, namespace, strftime_now,
the generation tag, Python string methods); the real SmolLM2 template comes from
its GGUF file. The oracle renders through a transformers tokenizer loaded from
a tiny directory (tests/test_tokenizer.py builds it), so both sides see the same
special tokens.
"""
from __future__ import annotations

from datetime import datetime

import jinja2
import pytest

from ster_py.chat import NOW_ENV, TIME_LIMIT_ENV, build_messages, render_chat
from ster_py.errors import SterError
from ster_py.tokenizer import Tokenizer
from test_tokenizer import hf_tokenizer, write_dir

from tiny import PINNED  # noqa: E402

CONVERSATIONS = {
    "plain": [{"role": "user", "content": "Hello there"}],
    "system": [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "Hi <b>&</b> ünïcode 🤖"}],
    "multi": [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": " two ", "reasoning_content": "thought"},
        {"role": "user", "content": "three"},
        {"role": "assistant", "content": "four"},
        {"role": "user", "content": "five"},
    ],
    "tool": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "°C"}}}
        ]},
        {"role": "tool", "name": "get_weather", "content": '{"temp": 21}'},
    ],
}

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather — «quoted»",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["°C", "°F"]}},
                   "required": ["city"]},
}}]

# Each template leans on one convention; all of them are rendered for every conversation.
TEMPLATES = {
    "trim_lstrip": """{{ bos_token }}
{% for message in messages %}
    {% if message.role == 'system' %}
        <<SYS>>{{ message.content }}<</SYS>>
    {% else %}
        [{{ message.role }}] {{ message.content }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
    [assistant]
{% endif %}
""",
    "loop_controls": """{% for m in messages %}
{% if m.role == 'system' %}{% continue %}{% endif %}
{% if loop.index > 4 %}{% break %}{% endif %}
{{ loop.index }}:{{ m.role }}={{ m.content }};{% if loop.last %}END{% endif %}
{% endfor %}""",
    "tojson": """{% if tools is not none %}TOOLS {{ tools | tojson }}
INDENTED {{ tools | tojson(indent=2) }}
SORTED {{ tools[0].function.parameters | tojson(sort_keys=True) }}
COMPACT {{ tools[0].function.parameters | tojson(separators=(',', ':')) }}
ASCII {{ tools[0].function.description | tojson(ensure_ascii=True) }}
{% endif %}{% for m in messages %}{{ m | tojson }}
{% endfor %}""",
    "namespace": """{% set ns = namespace(last='', count=0, sys=false) %}
{% for m in messages %}{% set ns.count = ns.count + 1 %}{% set ns.last = m.role %}
{% if m.role == 'system' %}{% set ns.sys = true %}{% endif %}{% endfor %}
count={{ ns.count }} last={{ ns.last }} sys={{ ns.sys }}""",
    "strftime": """Today is {{ strftime_now('%d %B %Y') }} ({{ strftime_now('%Y-%m-%d %H:%M:%S') }}).
{% for m in messages %}{{ m.role }}: {{ m.content }}
{% endfor %}""",
    "string_methods": """{% for m in messages %}{% if m.content is string %}
{{ m.role.upper() }}|{{ m.content.strip() }}|{{ m.content.startswith('H') }}|{{ m.content.split(' ') | length }}|{{ m.content | trim | replace('e', 'E') }}|{{ m.content[:3] }}
{% endif %}{% endfor %}""",
    "generation_tag": """{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}<a>{{ m.content }}</a>{% endgeneration %}
{% else %}<{{ m.role }}>{{ m.content }}
{% endif %}{% endfor %}""",
    "fields": """{% for m in messages %}{{ m.role }}:{{ m.content if m.content is defined else 'NO CONTENT' }}
{% if m.reasoning_content is defined %}[think]{{ m.reasoning_content }}/{{ m.thinking }}[/think]
{% endif %}{% if m.tool_calls is defined %}{% for c in m.tool_calls %}CALL {{ c.function.name }} {{ c.function.arguments | tojson }}
{% endfor %}{% endif %}{% endfor %}{{ eos_token }}{{ pad_token }}{{ unk_token }}
{%- if enable_thinking is defined and not enable_thinking %}<no_think>{% endif %}""",
    "dict_items": """{% for m in messages %}{% for k, v in m | dictsort %}{{ k }}={{ v }} {% endfor %}
{% endfor %}{{ undefined_variable }}|{{ messages | map(attribute='role') | join(',') }}""",
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(ours, transformers') tokenizer of the ChatML byte-level tiny directory."""
    path = write_dir(tmp_path_factory.mktemp("chat"), "bl")
    return Tokenizer.from_dir(path), hf_tokenizer(path)


def oracle(hf, template, messages, **kwargs):
    return hf.apply_chat_template(messages, chat_template=template, tokenize=False, **kwargs)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_inline_templates_match_transformers(tiny, pinned_clock, name, conversation, add_generation_prompt):
    ours, hf = tiny
    template, messages = TEMPLATES[name], CONVERSATIONS[conversation]
    tools = TOOLS if conversation == "tool" else None
    extra = {"enable_thinking": False} if conversation == "multi" else {}
    expected = oracle(hf, template, messages, add_generation_prompt=add_generation_prompt, tools=tools, **extra)
    got = ours.render_chat(messages, template=template, add_generation_prompt=add_generation_prompt, tools=tools,
                           now=pinned_clock, **extra)
    assert got == expected
    # the module-level function with the special tokens passed by hand renders the same
    specials = {k: v for k, v in hf.special_tokens_map.items() if k not in ("bos_token", "eos_token")}
    assert render_chat(template, messages, add_generation_prompt=add_generation_prompt, bos_token=hf.bos_token,
                       eos_token=hf.eos_token, tools=tools, now=pinned_clock, **specials, **extra) == expected


def test_messages_are_not_modified(tiny):
    ours, _ = tiny
    messages = [dict(m) for m in CONVERSATIONS["tool"]]
    ours.render_chat(messages, template=TEMPLATES["fields"])
    assert messages == CONVERSATIONS["tool"]


def test_model_template_matches_transformers(tiny):
    ours, hf = tiny
    for messages in CONVERSATIONS.values():
        messages = [m for m in messages if m.get("content")]
        for agp in (True, False):
            assert ours.render_chat(messages, add_generation_prompt=agp) == hf.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=agp)
            assert ours.encode_chat(messages, add_generation_prompt=agp) == hf.apply_chat_template(
                messages, tokenize=True, add_generation_prompt=agp)["input_ids"]


def test_strftime_now_pinned_by_environment(monkeypatch):
    monkeypatch.setenv(NOW_ENV, "2026-10-18T09:30:05")
    template = "{{ strftime_now('%Y-%m-%d %H:%M:%S') }}"
    assert render_chat(template, []) == PINNED.strftime("%Y-%m-%d %H:%M:%S")
    assert render_chat(template, [], now="2001-02-03T04:05:06") == "2001-02-03 04:05:06"
    monkeypatch.setenv(NOW_ENV, "yesterday")
    with pytest.raises(SterError, match="ISO-8601"):
        render_chat(template, [])
    monkeypatch.delenv(NOW_ENV)
    before = datetime.now().replace(microsecond=0)
    got = datetime.strptime(render_chat(template, []), "%Y-%m-%d %H:%M:%S")
    assert before <= got <= datetime.now()


# ------------------------------------------------------------------ errors


def hf_error(hf, template, messages):
    with pytest.raises(Exception) as info:
        oracle(hf, template, messages, add_generation_prompt=True)
    return info.value


def test_raise_exception(tiny):
    ours, hf = tiny
    template = ("{% for m in messages %}\n{% if m.role not in ['user', 'assistant'] %}\n"
                "{{ raise_exception('Only user and assistant roles are supported!') }}\n{% endif %}\n{% endfor %}")
    messages = CONVERSATIONS["system"]
    err = hf_error(hf, template, messages)
    assert isinstance(err, jinja2.TemplateError)
    with pytest.raises(SterError) as info:
        ours.render_chat(messages, template=template)
    assert str(err) in str(info.value)
    assert "line 3" in str(info.value)  # the raise_exception call
    assert ours.render_chat(CONVERSATIONS["plain"], template=template) == oracle(hf, template, CONVERSATIONS["plain"])


def test_syntax_error_names_source_and_line(tiny):
    ours, hf = tiny
    template = "{% for m in messages %}\n{{ m.content }}\n{% if %}\n{% endfor %}"
    err = hf_error(hf, template, CONVERSATIONS["plain"])
    assert isinstance(err, jinja2.TemplateSyntaxError)
    with pytest.raises(SterError) as info:
        render_chat(template, CONVERSATIONS["plain"], source="tokenizer.chat_template of x.gguf")
    assert f"chat template tokenizer.chat_template of x.gguf, line {err.lineno}: syntax error" in str(info.value)


def test_undefined_attribute_error(tiny):
    ours, hf = tiny
    template = "ok\n{{ messages[0].content }}\n{{ settings.language.upper() }}"
    err = hf_error(hf, template, CONVERSATIONS["plain"])
    assert isinstance(err, jinja2.UndefinedError)
    with pytest.raises(SterError, match=r"line 3: undefined value: 'settings' is undefined"):
        render_chat(template, CONVERSATIONS["plain"])


@pytest.mark.parametrize("template", [
    "{% set ns = namespace(_private=1) %}",
    "{% set ns = namespace() %}{% set ns._x = 1 %}",
    "{{ messages.append({'role': 'user'}) }}",
    "{{ messages[0].update({'a': 1}) }}",
    "{{ ''.__class__.__mro__ }}",
])
def test_sandbox_refusals(tiny, template):
    ours, hf = tiny
    err = hf_error(hf, template, CONVERSATIONS["plain"])
    assert isinstance(err, jinja2.exceptions.SecurityError) or "underscore" in str(err) or isinstance(
        err, jinja2.UndefinedError)
    with pytest.raises(SterError, match="chat template"):
        render_chat(template, CONVERSATIONS["plain"])


def test_python_error_in_template(tiny):
    ours, hf = tiny
    template = "{{ messages[0].content + 1 }}"
    err = hf_error(hf, template, CONVERSATIONS["plain"])
    assert isinstance(err, TypeError)
    with pytest.raises(SterError, match="line 1: TypeError"):
        render_chat(template, CONVERSATIONS["plain"])


def test_build_messages(tiny):
    _, hf = tiny
    assert build_messages("hi") == [{"role": "user", "content": "hi"}]
    assert build_messages("hi", system="S") == [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    assert render_chat(hf.chat_template, build_messages("hi", "S")) == hf.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}], tokenize=False,
        add_generation_prompt=True)


# ------------------------------------------------------------------ real templates

GEMMA_STYLE_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


def smollm2_gguf_template(path) -> str:
    from tiny import gguf_py_reader

    return gguf_py_reader(path).fields["tokenizer.chat_template"].contents()


@pytest.mark.real
def test_smollm2_gguf_template(smollm2_gguf, smollm2_hf):
    """The template stored in the SmolLM2 GGUF, rendered and tokenized as transformers does."""
    template = smollm2_gguf_template(smollm2_gguf)
    assert "<|im_start|>" in template
    ours, hf = Tokenizer.from_dir(smollm2_hf), hf_tokenizer(smollm2_hf)
    for messages in CONVERSATIONS.values():
        messages = [m for m in messages if m.get("content")]
        for agp in (True, False):
            expected = oracle(hf, template, messages, add_generation_prompt=agp)
            assert render_chat(template, messages, add_generation_prompt=agp, bos_token=hf.bos_token,
                               eos_token=hf.eos_token, source="tokenizer.chat_template") == expected
            assert ours.render_chat(messages, template=template, add_generation_prompt=agp) == expected
            ids = hf.apply_chat_template(messages, chat_template=template, tokenize=True,
                                         add_generation_prompt=agp)["input_ids"]
            assert ours.encode(expected) == ids
            assert ours.encode_chat(messages, template=template, add_generation_prompt=agp) == ids
    if hf.chat_template is not None:  # a checkpoint directory carries the same template
        assert ours.chat_template == hf.chat_template
        msgs = build_messages("What is 2+2?", system="Answer in one word.")
        assert ours.encode_chat(msgs) == hf.apply_chat_template(msgs, tokenize=True,
                                                                add_generation_prompt=True)["input_ids"]


@pytest.mark.real
def test_gemma_template_single_bos(gemma3_hf):
    """A template that prints <bos>, with Gemma's tokenizer that also adds one: a single BOS,
    as apply_chat_template(tokenize=True) gives."""
    ours, hf = Tokenizer.from_dir(gemma3_hf), hf_tokenizer(gemma3_hf)
    for messages in CONVERSATIONS.values():
        messages = [m for m in messages if m.get("content")]
        expected = hf.apply_chat_template(messages, chat_template=GEMMA_STYLE_TEMPLATE, tokenize=True,
                                          add_generation_prompt=True)["input_ids"]
        got = ours.encode_chat(messages, template=GEMMA_STYLE_TEMPLATE)
        assert got == expected
        assert got[0] == hf.bos_token_id and got[1] != hf.bos_token_id
        text = ours.render_chat(messages, template=GEMMA_STYLE_TEMPLATE)
        assert text == oracle(hf, GEMMA_STYLE_TEMPLATE, messages, add_generation_prompt=True)


# ------------------------------------------------------------------ budgets

# Operations the budget checks intercept, at ordinary sizes: the results must stay
# exactly transformers' (the checks refuse only absurd sizes).
GUARDED_BUT_ORDINARY = {
    "repeat": "{{ 'ab' * 3 }}|{{ 3 * 'ab' }}|{{ [1, 2] * 2 }}|{{ 2 ** 10 }}|{{ 7 * 6 }}|{{ 2.5 * 2 }}",
    "add": "{{ 'a' + 'b' }}|{{ [1] + [2] }}|{{ 1 + 2 }}|{{ messages[0].content ~ '!' ~ 3 }}",
    "percent": "{{ '%5s|%-4d|%.2f|%*d' % ('a', 7, 3.14159, 4, 9) }}|{{ 7 % 3 }}|{{ '%s' | format('x') }}",
    "str_methods": "{{ 'a'.ljust(4) }}|{{ 'a'.center(5, '*') }}|{{ '7'.zfill(3) }}|{{ 'a\tb'.expandtabs(4) }}|"
                   "{{ 'a b c'.replace(' ', '--') }}|{{ 'abc'.replace('', '.') }}|{{ ', '.join(['x', 'y']) }}|"
                   "{{ '{:>6}|{:.3}|{:{w}}'.format('r', 'abcdef', 'q', w=3) }}|{{ '{a}'.format_map({'a': 1}) }}",
    "filters": "{{ 'x' | center(7) }}|{{ 'a\nb' | indent(3, true) }}|{{ 'a\nb' | indent('> ') }}|"
               "{{ 'aXa' | replace('a', 'bb') }}|{{ 'aaa' | replace('a', 'b', 2) }}|{{ [1, 2, 3] | join('-') }}|"
               "{{ messages | join(',', attribute='role') }}|{{ [1, 2, 3] | slice(2) | list }}|"
               "{{ [1, 2, 3] | batch(2, 0) | list }}|{{ [[1], [2, 3]] | sum(start=[]) }}|{{ [1, 2] | sum }}|"
               "{{ messages | sum(attribute='n', start=10) }}",
    "tojson": "{{ {'b': 1, 'a': [1, 2]} | tojson(indent=2) }}|{{ {'b': 1, 'a': 'é'} | tojson(sort_keys=True) }}|"
              "{{ 'é' | tojson(ensure_ascii=True) }}|{{ {'a': 1} | tojson(separators=(',', ':')) }}",
    "dict_global": "{{ dict(a=1, b=2) | tojson }}|{{ dict.fromkeys(['x', 'y'], 0) | tojson }}|"
                   "{{ dict([('k', 'v')]).k }}",
    "loops_and_macros": "{% macro row(m) %}[{{ m.role }}]{% endmacro %}{% set captured %}{% for m in messages %}"
                        "{{ row(m) }}{% endfor %}{% endset %}{{ captured }}|{% for i in range(3) recursive %}"
                        "{{ i }}{% endfor %}|{% for k, v in {'a': 1}.items() %}{{ k }}={{ v }}{% endfor %}|"
                        "{% for m in messages if m.role == 'user' %}{{ loop.index }}/{{ loop.length }}"
                        "{% else %}none{% endfor %}",
    "generation_scope": "{% set x = 'outer' %}{% for m in messages %}{% generation %}{% set x = 'inner' %}"
                        "{{ x }}:{{ loop.index }}{% endgeneration %}{% endfor %}|{{ x }}",
}


@pytest.mark.parametrize("name", sorted(GUARDED_BUT_ORDINARY))
def test_guarded_operations_match_transformers(tiny, name):
    _, hf = tiny
    template = GUARDED_BUT_ORDINARY[name]
    messages = [{"role": "user", "content": "hi", "n": 1}, {"role": "assistant", "content": "yo", "n": 2}]
    expected = oracle(hf, template, messages, add_generation_prompt=False)
    assert render_chat(template, messages, add_generation_prompt=False, bos_token=hf.bos_token,
                       eos_token=hf.eos_token) == expected


# Hostile templates: each would run for hours or allocate gigabytes without a budget.
OVER_SIZE = {
    "str_times_huge": ("{{ 'a' * 10**10 }}", "a text of 10000000000 characters"),
    "literal_times_huge": ("{{ 'a' * 10000000000 }}", "a text of 10000000000 characters"),
    "list_times_huge": ("{{ [0] * 10**9 }}", "a list of 1000000000 items"),
    "doubling_concat": ("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                        "{% endfor %}", "over its budget of 33554432 characters"),
    "doubling_plus": ("{% set ns = namespace(s=[0]) %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
                      "{% endfor %}", "over its budget of 1048576 items"),
    "huge_power": ("{{ 10 ** 1000000 }}", "an integer of"),
    "squaring": ("{% set ns = namespace(x=3) %}{% for i in range(64) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
                 "an integer of"),
    "ljust": ("{{ 'a'.ljust(10**10) }}", "str.ljust"),
    "center_filter": ("{{ 'a' | center(10000000000) }}", "|center"),
    "indent_filter": ("{{ 'a\nb' | indent(10**10) }}", "an indented text"),
    "replace_amplifies": ("{{ ('x' * 10**7) | replace('', 'yyyy') }}", "characters"),
    "replace_method": ("{{ ('x' * 10**7).replace('', 'yyyy') }}", "characters"),
    "percent_width": ("{{ '%10000000000s' % 'a' }}", "a formatted field"),
    "percent_star": ("{{ '%*s' % (10**10, 'a') }}", "a formatted field"),
    "format_width": ("{{ '{:>10000000000}'.format('a') }}", "a formatted field"),
    "format_nested_width": ("{{ '{:>{w}}'.format('a', w=10**10) }}", "a formatted field"),
    "join_huge": ("{{ ''.join(['x' * 10**7] * 100) }}", "a list with a text form of"),
    "join_filter_huge": ("{{ (['x' * 10**7] * 100) | join }}", "a list with a text form of"),
    "join_input_huge": ("{{ ''.join([messages[0].content] * 4) }}", "a list with a text form of"),
    "nested_doubling": ("{% set ns = namespace(l=['x']) %}{% for i in range(80) %}{% set ns.l = [ns.l, ns.l] %}"
                        "{% endfor %}{{ ns.l == [1] }}", "a list with a text form of"),
    "nested_doubling_dict": ("{% set ns = namespace(d={}) %}{% for i in range(80) %}{% set ns.d = {'a': ns.d, "
                             "'b': ns.d} %}{% endfor %}", "a list with a text form of"),
    "nested_doubling_call": ("{% set ns = namespace(d={}) %}{% for i in range(80) %}{% set ns.d = dict(a=ns.d, "
                             "b=ns.d) %}{% endfor %}", "a list with a text form of"),
    "nested_doubling_namespace": ("{% set h = namespace(n=1) %}{% for i in range(80) %}{% set h.n = namespace("
                                  "a=h.n, b=h.n) %}{% endfor %}", "a namespace with a text form of"),
    "nested_doubling_filter": ("{% set ns = namespace(l=1) %}{% for i in range(80) %}{% set ns.l = [ns.l] | "
                               "batch(2, ns.l) | list %}{% endfor %}", "a list with a text form of"),
    "batch_fill_output": ("{{ [1] | batch(1000000, 'x' * 100) | list }}", "a list with a text form of"),
    "shared_values_call": ("{{ dict.fromkeys(range(100000), 'x' * 1000) }}", "a list with a text form of"),
    "translate": ("{{ ('a' * 10**6).translate({97: 'b' * 1000}) }}", "characters"),
    "wordwrap": ("{{ ('a ' * 10**6) | wordwrap(1, wrapstring='x' * 1000) }}", "a wrapped text"),
    "slice_huge": ("{{ [1] | slice(10**9) | list }}", "a list of 1000000000 items"),
    "batch_fill_huge": ("{{ [1] | batch(10**9, 0) | list }}", "a list of 1000000000 items"),
    "tojson_indent": ("{{ {'a': 1} | tojson(indent=10**9) }}", "a JSON indent"),
    "macro_output": ("{% macro m() %}{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}{% endmacro %}"
                     "{% set y = m() %}", "an output of"),
    "output": ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "an output of"),
}


# Turning a value into text: the input holds one 1 MB text 50 times (cheap to hold,
# 50 MB once written out), so only the point where it becomes text can refuse it.
SHARED_INPUT = [{"role": "user", "content": "x" * 10**6}] * 50
OVER_SIZE_AS_TEXT = {
    "output": ("{{ messages }}", "a text of"),
    "concat": ("{{ 'a' ~ messages }}", "a text of"),
    "percent": ("{{ '%s' % messages }}", "a formatted text of"),
    "format": ("{{ '{}'.format(messages) }}", "a formatted text of"),
    "string_filter": ("{{ messages | string | length }}", "a text of"),
    "tojson": ("{{ messages | tojson | length }}", "a JSON text of"),
    "join": ("{{ messages | map(attribute='content') | join | length }}", "a text of"),
}


@pytest.mark.parametrize("name", sorted(OVER_SIZE_AS_TEXT))
def test_text_budget_refuses(name):
    template, words = OVER_SIZE_AS_TEXT[name]
    with pytest.raises(SterError) as info:
        render_chat(template, SHARED_INPUT, source="hostile.jinja")
    message = str(info.value)
    assert message.startswith("chat template hostile.jinja, line 1") and words in message


@pytest.mark.parametrize("name", sorted(OVER_SIZE))
def test_size_budget_refuses(name):
    template, words = OVER_SIZE[name]
    with pytest.raises(SterError) as info:
        render_chat(template, [{"role": "user", "content": "x" * 10**7}], source="hostile.jinja")
    message = str(info.value)
    assert message.startswith("chat template hostile.jinja") and "over budget" in message and words in message


OVER_TIME = {
    "nested_ranges": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "nested_ranges_text": "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "captured_loops": "{% set y %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                      "{% endfor %}{% endset %}",
    "macro_fanout": "{% macro f(n) %}{% if n < 60 %}{{ f(n + 1) }}{{ f(n + 1) }}{% endif %}{% endmacro %}{{ f(0) }}",
    "quadratic_sum": "{{ range(100000) | map('string') | map('list') | sum(start=[]) | length }}"
                     "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
}


@pytest.mark.parametrize("name", sorted(OVER_TIME))
def test_time_budget_refuses(name):
    with pytest.raises(SterError, match=r"chat template hostile.jinja, line 1: over budget: the template ran "
                                        r"longer than its time budget \(0.3 s\)"):
        render_chat(OVER_TIME[name], [], source="hostile.jinja", time_limit=0.3)


def test_time_limit_from_environment(monkeypatch):
    monkeypatch.setenv(TIME_LIMIT_ENV, "0.2")
    with pytest.raises(SterError, match=r"time budget \(0.2 s\)"):
        render_chat(OVER_TIME["nested_ranges"], [])
    assert render_chat("{{ 1 }}", []) == "1"
    monkeypatch.setenv(TIME_LIMIT_ENV, "soon")
    with pytest.raises(SterError, match="STER_CHAT_TIME_LIMIT='soon' is not a positive number"):
        render_chat("{{ 1 }}", [])


def test_budgets_are_parameters():
    """The limits are the caller's to raise: the same render passes with a larger budget."""
    template = "{{ 'ab' * 1000 }}"
    with pytest.raises(SterError, match="over its budget of 100 characters"):
        render_chat(template, [], max_chars=100)
    assert render_chat(template, [], max_chars=10_000) == "ab" * 1000


def test_huge_range_refused_like_transformers(tiny):
    _, hf = tiny
    template = "{% for i in range(10**9) %}{% endfor %}"
    err = hf_error(hf, template, CONVERSATIONS["plain"])
    assert isinstance(err, OverflowError)
    with pytest.raises(SterError, match="line 1: OverflowError: Range too big"):
        render_chat(template, CONVERSATIONS["plain"])


# ------------------------------------------------------------- errors and lines

LINE_ERRORS = {
    # template, line of the fault (counted by hand from the text), words of the message
    "in_macro": ("{% macro show(m) %}\n{{ m.content }}\n{{ m.content + 1 }}\n{% endmacro %}\n"
                 "{% for m in messages %}{{ show(m) }}{% endfor %}", 3, "TypeError"),
    "in_loop_body": ("{% for m in messages %}\n{{ m.role }}\n\n{{ m.content.no_such_method() }}\n{% endfor %}", 4,
                     "undefined value"),
    "filter_error": ("ok\n\n{{ messages | join(1, 2, 3, 4) }}", 3, "TypeError"),
    "raise_in_branch": ("{% if messages | length > 0 %}\n\n\n{{ raise_exception('no thanks') }}\n{% endif %}", 4,
                        "refused the conversation: no thanks"),
    "iterate_none": ("line one\n{% for t in tools %}{{ t }}{% endfor %}", 2, "'NoneType' object is not iterable"),
    "budget_in_loop": ("a\nb\n{% for i in range(10) %}{{ 'x' * 10**10 }}{% endfor %}", 3, "over budget"),
    "syntax": ("{% for m in messages %}\n{{ m.content }}\n{% endfor\n", 3, "syntax error"),
    "unknown_filter": ("a\n{{ messages | from_json }}", 2, "No filter named 'from_json'"),
}


@pytest.mark.parametrize("name", sorted(LINE_ERRORS))
def test_errors_name_template_and_line(tiny, name):
    """Each fault is refused by transformers too; ster names the template and the line."""
    _, hf = tiny
    template, line, words = LINE_ERRORS[name]
    if name != "budget_in_loop":  # transformers would allocate 10 GB here
        hf_error(hf, template, CONVERSATIONS["plain"])
    with pytest.raises(SterError) as info:
        render_chat(template, CONVERSATIONS["plain"], source="my.jinja")
    assert str(info.value).startswith(f"chat template my.jinja, line {line}")
    assert words in str(info.value)


def test_a_model_name_too_long_to_be_a_path_is_an_error_line_in_chat_and_template_render():
    """ster chat's early template check and template render stat()ed a 5,000-character --model: OSError
    ENAMETOOLONG, a traceback (the breaker's finding); the load that follows (chat) or the render itself says so."""
    from ster_py.chat import load_model_template, surely_lacks_chat_template

    assert surely_lacks_chat_template("a" * 5000) is False
    with pytest.raises(SterError, match="File name too long"):
        load_model_template("a" * 5000)
