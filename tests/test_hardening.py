"""Bad input found by adversarial testing: each gives a SterError naming the problem."""
from __future__ import annotations

import json

import numpy as np
import pytest

from ster_py.chat import render_chat
from ster_py.errors import SterError
from ster_py.generate import Sampling, generate
from ster_py.load import load_model
from tiny import make_checkpoint


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    make_checkpoint(path, "llama")
    return path


def _with_config(src, dst, **changes):
    import shutil

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("changes, words", [
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 0}}, "rotary frequencies"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 0}}, "factor"),
    ({"rms_norm_eps": -1}, "epsilon"),
    ({"rms_norm_eps": [1]}, "invalid model config"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": "abc"}}, "invalid model config"),
    ({"partial_rotary_factor": 2.0}, "rotary width"),
])
def test_bad_config_values_are_refused(llama_dir, tmp_path, changes, words):
    path = _with_config(llama_dir, tmp_path / "m", **changes)
    with pytest.raises(SterError, match=words):
        load_model(str(path))


def test_nan_weights_are_refused_at_generation(llama_dir, tmp_path):
    from safetensors.numpy import load_file, save_file

    path = _with_config(llama_dir, tmp_path / "m")
    tensors = load_file(str(path / "model.safetensors"))
    tensors["model.norm.weight"][:] = np.nan
    save_file(tensors, str(path / "model.safetensors"))
    model = load_model(str(path))
    with pytest.raises(SterError, match="non-finite logits"):
        generate(model.decoder, [5, 6], Sampling(max_new_tokens=3))


def test_prompt_longer_than_the_context_is_refused(llama_dir):
    model = load_model(str(llama_dir))
    with pytest.raises(SterError, match="longer than the model's context of 256"):
        generate(model.decoder, [5] * 300, Sampling(max_new_tokens=1))


def test_generation_stops_at_the_context(llama_dir):
    model = load_model(str(llama_dir))
    out = generate(model.decoder, [5] * 250, Sampling(max_new_tokens=50))
    assert out.stop_reason in ("context", "stop_token") and len(out.ids) <= 7


@pytest.mark.parametrize("sampling", [Sampling(seed=-1), Sampling(temperature=float("inf")),
                                      Sampling(temperature=float("nan"))])
def test_sampling_ranges(sampling):
    with pytest.raises(SterError):
        sampling.validate()


@pytest.mark.parametrize("template", ["{{ 1e308 * 10 }}{{ (10 ** 400) | float }}", "{{ [1] * 10 ** 10 }}",
                                      "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}"])
def test_template_failures_are_ster_errors(template):
    with pytest.raises(SterError):
        render_chat(template, [{"role": "user", "content": "hi"}])


def test_invalid_unicode_prompt(llama_dir):
    model = load_model(str(llama_dir))
    with pytest.raises(SterError, match="not valid Unicode"):
        model.tokenizer.encode("w3 \udcff")
