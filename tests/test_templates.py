"""llama.cpp's 70 real chat templates, rendered by ster and by transformers.

The templates are llama.cpp's ``models/templates/*.jinja`` as shipped in the
pinned llama-cpp-python 0.3.36 sdist (fetched with pip into the fixture cache,
SHA-256 checked, never committed). The oracle is transformers'
``apply_chat_template(..., tokenize=False)`` on a minimal fast tokenizer whose
only special tokens are the BOS/EOS texts ster is given, so both sides see the
same variables; the date ``strftime_now`` reads is pinned on both sides.

For every template and every conversation case the rendered texts must be
equal, and where transformers raises, ster must refuse with a SterError that
names the template (and carries the template's own message for
``raise_exception``).
"""
from __future__ import annotations

import copy
import functools
import hashlib
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import jinja2
import pytest

from ster_py.chat import render_chat
from ster_py.errors import SterError

_SDIST = "llama_cpp_python-0.3.36.tar.gz"
_SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
_MEMBER = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/"

# Every template in that directory of the pinned sdist (the fixture checks the set is exact).
TEMPLATE_NAMES = [
    "Apertus-8B-Instruct", "Apriel-1.6-15b-Thinker-fixed", "Bielik-11B-v3.0-Instruct", "ByteDance-Seed-OSS",
    "Cohere2MoE", "CohereForAI-c4ai-command-r-plus-tool_use", "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
    "GLM-4.6", "GLM-4.7-Flash", "GigaChat3-10B-A1.8B", "GigaChat3.1-10B-A1.8B", "HuggingFaceTB-SmolLM3-3B",
    "Kimi-K2-Instruct", "Kimi-K2-Thinking", "Kimi-K3", "LFM2-8B-A1B", "LFM2.5-8B-A1B", "LFM2.5-Instruct",
    "MiMo-VL", "MiniMax-M1", "MiniMax-M2", "MiniMax-M3", "Mistral-Small-3.2-24B-Instruct-2506",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "NVIDIA-Nemotron-Nano-v2", "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "Qwen-QwQ-32B", "Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B",
    "Qwen3-Coder", "Qwen3.5-4B", "Reka-Edge", "Spark2.5", "StepFun3.5-Flash",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
    "deepseek-ai-DeepSeek-V3.1", "deepseek-ai-DeepSeek-V3.2", "deepseek-ai-DeepSeek-V4-Flash-0731",
    "deepseek-ai-DeepSeek-V4", "fireworks-ai-llama-3-firefunction-v2", "google-gemma-2-2b-it",
    "google-gemma-4-31B-it-interleaved", "google-gemma-4-31B-it", "ibm-granite-granite-3.3-2B-Instruct",
    "ibm-granite-granite-4.0", "ibm-granite-granite-4.1", "inclusionai-ling-3.0-flash", "llama-cpp-deepseek-r1",
    "llama-cpp-rwkv-world", "meetkai-functionary-medium-v3.1", "meetkai-functionary-medium-v3.2",
    "meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.2-3B-Instruct", "meta-llama-Llama-3.3-70B-Instruct",
    "microsoft-Phi-3.5-mini-instruct", "mistralai-Ministral-3-14B-Reasoning-2512",
    "mistralai-Mistral-Nemo-Instruct-2407", "moonshotai-Kimi-K2", "muse-glimmer", "openai-gpt-oss-120b",
    "openbmb-MiniCPM5-1B", "poolside-Laguna-S-2.1", "poolside-Laguna-XS-2.1", "poolside-Laguna-XS.2",
    "tencent-Hy3", "unsloth-Apriel-1.5", "unsloth-mistral-Devstral-Small-2507", "upstage-Solar-Open-100B",
]

BOS, EOS = "<s>", "</s>"
from tiny import PINNED  # noqa: E402

# Non-ASCII and HTML-special characters, so tojson's ensure_ascii and escaping show.
TOOLS = [{"type": "function", "function": {
    "name": "get_weather",
    "description": "Current weather in a city — «métrique» <b>&</b>",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"},
                                  "unit": {"type": "string", "enum": ["°C", "°F"]}},
                   "required": ["city"]},
}}]
CALL_ID = "call12345"  # nine alphanumerics: Mistral's templates insist on that shape


def _tool_call(arguments):
    return [{"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]


USER = {"role": "user", "content": "Hello! Qu'est-ce que «ster»? 🤖"}
TOOL_TURNS = [
    {"role": "user", "content": "What is the weather in Zürich?"},
    {"role": "assistant", "content": "", "tool_calls": _tool_call({"city": "Zürich", "unit": "°C"})},
    {"role": "tool", "tool_call_id": CALL_ID, "name": "get_weather", "content": '{"temp": 21, "sky": "clear"}'},
]

# case -> (messages, add_generation_prompt, extra template variables)
CASES = {
    "user": ([USER], True, {}),
    "system_user": ([{"role": "system", "content": "You are terse."}, USER], True, {}),
    "three_turns": ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, how can I help?"},
                     {"role": "user", "content": "Tell me a joke."}], True, {}),
    "history_no_generation_prompt": ([{"role": "user", "content": "Hi"},
                                      {"role": "assistant", "content": "Hello, how can I help?"}], False, {}),
    "thinking_on": ([USER], True, {"enable_thinking": True}),
    "thinking_off": ([USER], True, {"enable_thinking": False}),
    "reasoning_in_history": ([{"role": "user", "content": "2+2?"},
                              {"role": "assistant", "content": "4", "reasoning_content": "Two plus two is four."},
                              {"role": "user", "content": "And 3+3?"}], True, {}),
    "tools": ([USER], True, {"tools": TOOLS}),
    "tool_call_and_result": (TOOL_TURNS, True, {"tools": TOOLS}),
    "tool_call_json_arguments": ([TOOL_TURNS[0], {**TOOL_TURNS[1], "tool_calls": _tool_call(
        '{"city": "Zürich", "unit": "°C"}')}, TOOL_TURNS[2]], True, {"tools": TOOLS}),
}


def _fixtures_dir() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    try:
        from real_models import fixtures_dir
    finally:
        sys.path.pop(0)
    return fixtures_dir()


@pytest.fixture(scope="session")
def templates_dir(tmp_path_factory) -> Path:
    """llama.cpp's models/templates/*.jinja from the pinned llama-cpp-python sdist.

    Fetched with pip into the fixture cache on first use (the same sdist and cache
    as the tokenizer vectors); a fetch that fails fails the test.
    """
    target = _fixtures_dir() / "llama-cpp-templates-0.3.36"
    if not all((target / f"{name}.jinja").is_file() for name in TEMPLATE_NAMES):
        sdist = _fixtures_dir() / "sdist" / _SDIST
        if not sdist.is_file():
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python", "-q",
                   "-d", str(sdist.parent), "llama-cpp-python==0.3.36"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0 or not sdist.is_file():
                pytest.fail(f"cannot fetch {_SDIST} with pip: {done.stderr[-500:]}", pytrace=False)
        digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
        if digest != _SDIST_SHA256:
            pytest.fail(f"{sdist} has SHA-256 {digest}, expected {_SDIST_SHA256}; delete it to refetch",
                        pytrace=False)
        staging = tmp_path_factory.mktemp("llama-templates")
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                rest = member.name[len(_MEMBER):]
                if member.name.startswith(_MEMBER) and member.isfile() and rest.endswith(".jinja") and "/" not in rest:
                    (staging / rest).write_bytes(tar.extractfile(member).read())
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(staging, target, dirs_exist_ok=True)
    found = sorted(p.stem for p in target.glob("*.jinja"))
    assert found == sorted(TEMPLATE_NAMES), "the sdist's template set differs from TEMPLATE_NAMES"
    return target


@functools.lru_cache(maxsize=None)
def _source(directory: Path, name: str) -> str:
    return (directory / f"{name}.jinja").read_text(encoding="utf-8")


# Rendered in this process (conftest.chat_in_process): these tests compare the rendering itself.
pytestmark = pytest.mark.usefixtures("chat_in_process")


@functools.lru_cache(maxsize=1)
def _hf_tokenizer():
    """A transformers fast tokenizer whose special tokens are exactly BOS and EOS."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({BOS: 0, EOS: 1}, unk_token=EOS))
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=BOS, eos_token=EOS)
    assert hf.special_tokens_map == {"bos_token": BOS, "eos_token": EOS}
    return hf


def oracle(template: str, messages, add_generation_prompt: bool, extra: dict) -> str:
    return _hf_tokenizer().apply_chat_template(copy.deepcopy(messages), chat_template=template, tokenize=False,
                                               add_generation_prompt=add_generation_prompt, **copy.deepcopy(extra))


def ours(template: str, name: str, messages, add_generation_prompt: bool, extra: dict) -> str:
    return render_chat(template, messages, add_generation_prompt=add_generation_prompt, bos_token=BOS,
                       eos_token=EOS, now=PINNED, source=f"{name}.jinja", **extra)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", TEMPLATE_NAMES)
def test_template_matches_transformers(templates_dir, pinned_clock, name, case):
    template = _source(templates_dir, name)
    messages, add_generation_prompt, extra = CASES[case]
    snapshot = copy.deepcopy(messages)
    try:
        expected = oracle(template, messages, add_generation_prompt, extra)
    except Exception as exc:  # transformers refuses this conversation: so must we
        with pytest.raises(SterError) as info:
            ours(template, name, messages, add_generation_prompt, extra)
        message = str(info.value)
        assert f"chat template {name}.jinja" in message
        if isinstance(exc, jinja2.TemplateError) and not isinstance(exc, jinja2.TemplateSyntaxError):
            assert str(exc).rstrip(". ") in message  # the template's own words (raise_exception, undefined)
        if not isinstance(exc, jinja2.TemplateSyntaxError):
            assert ", line " in message
    else:
        assert ours(template, name, messages, add_generation_prompt, extra) == expected
    assert messages == snapshot  # rendering never edits the caller's messages


def test_thinking_cases_reach_templates_that_read_them(templates_dir):
    """enable_thinking changes the prompt of the templates that read it (so the
    thinking cases above are not vacuous for them)."""
    readers = [n for n in TEMPLATE_NAMES if "enable_thinking" in _source(templates_dir, n)]
    assert len(readers) >= 20
    changed = 0
    for name in readers:
        template = _source(templates_dir, name)
        try:
            on = ours(template, name, [USER], True, {"enable_thinking": True})
            off = ours(template, name, [USER], True, {"enable_thinking": False})
        except SterError:
            continue
        changed += on != off
    assert changed >= len(readers) - 3  # 25 of 26 with transformers 5.24 and llama-cpp-python 0.3.36
