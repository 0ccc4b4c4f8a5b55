"""Bad input found by adversarial testing: each gives a SterError naming the problem."""
from __future__ import annotations

import json
import re

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
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 0}}, "rope_theta must be a finite number above 0"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 0}}, "factor"),
    ({"rms_norm_eps": -1}, "epsilon"),
    ({"rms_norm_eps": [1]}, "invalid model config"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": "abc"}}, "invalid model config"),
    ({"partial_rotary_factor": 2.0}, "rotary width"),
    # Transformers reads rope_scaling over rope_parameters: a pair that disagrees is refused, not read either way
    ({"rope_scaling": {"type": "linear", "factor": 4.0}}, "rope_scaling and rope_parameters disagree on 'type'"),
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
    with pytest.raises(SterError, match="longer than the context of 256 positions"):
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


# --------------------------------------------------------------------------- sizes bounded where they are read

def _peak_bytes(fn) -> tuple[int, BaseException | None]:
    """Peak Python allocation while ``fn()`` runs, and what it raised."""
    import tracemalloc

    tracemalloc.start()
    raised = None
    try:
        fn()
    except Exception as e:  # noqa: BLE001 (the caller checks what was raised)
        raised = e
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, raised


LLAMA_CONFIG = dict(model_type="llama", vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256)


@pytest.mark.parametrize("model_type, changes, key", [
    ("llama", {"num_hidden_layers": 10 ** 6}, "num_hidden_layers"),
    ("llama", {"num_hidden_layers": 10 ** 9}, "num_hidden_layers"),
    ("bloom", {"num_attention_heads": 10 ** 6, "hidden_size": 10 ** 6}, "num_attention_heads / n_head"),  # ALiBi
    ("llama", {"head_dim": 10 ** 7}, "head_dim"),  # the rotary table is head_dim / 2 long
])
def test_huge_counts_are_refused_before_anything_is_allocated(model_type, changes, key):
    from ster_py.config import spec_from_config
    from ster_py.families import FAMILIES

    config = dict(LLAMA_CONFIG, model_type=model_type, **changes)
    peak, raised = _peak_bytes(lambda: spec_from_config(config, FAMILIES[model_type]))
    assert isinstance(raised, SterError) and key in str(raised) and "in 1.." in str(raised), raised
    assert peak < 4 << 20, f"{peak} bytes allocated before the refusal"


def test_huge_gguf_block_count_is_refused_before_anything_is_allocated(tmp_path):
    import gguf

    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in (("block_count", 10 ** 6), ("embedding_length", 64), ("attention.head_count", 4),
                       ("feed_forward_length", 96), ("context_length", 256)):
        w.add_uint32(f"llama.{key}", value)
    w.add_tensor("token_embd.weight", np.zeros((128, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    from ster_py.inspect import inspect_model

    for run in (lambda: load_model(str(path)), lambda: inspect_model(str(path))):
        # once untraced first: the modules a first call imports are not what the bound is about
        with pytest.raises(SterError):
            run()
        peak, raised = _peak_bytes(run)
        assert isinstance(raised, SterError) and "llama.block_count" in str(raised), raised
        assert peak < 4 << 20, f"{peak} bytes allocated before the refusal"


@pytest.mark.parametrize("layer_types, words", [
    (["full_attention"] * 2, "one entry per layer"),
    ("full_attention", "one entry per layer"),
    (["full_attention", "chunked_attention", "full_attention"], "'chunked_attention' is not supported"),
])
def test_layer_types_must_match_the_layers(llama_dir, tmp_path, layer_types, words):
    # transformers refuses a layer_types list of the wrong length (PreTrainedConfig.validate_layer_type).
    path = _with_config(llama_dir, tmp_path / "m", layer_types=layer_types, sliding_window=4)
    with pytest.raises(SterError, match=words):
        load_model(str(path))


# --------------------------------------------------------------------------- scales

@pytest.mark.parametrize("model_type, changes, words", [
    ("granite", {"residual_multiplier": 0}, "residual scale"),
    ("granite", {"residual_multiplier": -0.2}, "residual scale"),
    ("granite", {"logits_scaling": 0}, "logit scale"),
    ("granite", {"logits_scaling": -8}, "logit scale"),
    ("cohere", {"logit_scale": -0.0625}, "logit scale"),
    ("olmo", {"clip_qkv": 0}, "clip_qkv"),
    ("olmo", {"clip_qkv": -8.0}, "clip_qkv"),
    # s18 fuzzing: 0 ran with head_dim in its place; -4 was shown as a complex attention scale
    ("gemma2", {"query_pre_attn_scalar": 0}, "query_pre_attn_scalar must be a number above 0 .*got 0$"),
    ("gemma2", {"query_pre_attn_scalar": -4}, "query_pre_attn_scalar must be a number above 0 .*got -4$"),
])
def test_scales_must_be_positive(model_type, changes, words):
    from ster_py.config import spec_from_config
    from ster_py.families import FAMILIES
    from ster_py.validate import check_spec, interpret

    config = dict(LLAMA_CONFIG, model_type=model_type, **changes)
    with pytest.raises(SterError, match=words):
        check_spec(interpret("config.json", spec_from_config, config, FAMILIES[model_type]), "config.json")


# --------------------------------------------------------------------------- weights

def _rewrite(path, change):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("dtype, stored", [(np.int32, "I32"), (np.int64, "I64"), (np.bool_, "BOOL"),
                                           (np.int8, "I8"), (np.uint8, "U8")])
def test_non_float_weight_is_refused_by_name(llama_dir, tmp_path, dtype, stored):
    path = _with_config(llama_dir, tmp_path / "m")
    name = "model.layers.1.mlp.down_proj.weight"

    def to_ints(tensors):
        tensors[name] = (tensors[name] * 100).astype(dtype)

    _rewrite(path, to_ints)
    with pytest.raises(SterError, match=rf"tensor '{name}' in .* is stored as {stored}.*floating-point"):
        load_model(str(path))


def test_unused_tensors_are_reported(llama_dir, tmp_path):
    from ster_py.weights import unused_tensor_warnings

    path = _with_config(llama_dir, tmp_path / "m", tie_word_embeddings=True)
    extra = ["model.layers.0.mlp.extra_proj.weight", "model.layers.7.self_attn.q_proj.weight"]

    def add(tensors):
        for name in extra:
            tensors[name] = np.ones((4, 4), np.float32)
        tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(8, np.float32)  # a saved buffer
        assert "lm_head.weight" in tensors  # stored, but tied: the embedding is the head

    _rewrite(path, add)
    model = load_model(str(path))
    weights = model.decoder._weights
    assert weights.unused_tensors(model.spec) == sorted(extra)
    (warning,) = unused_tensor_warnings(model.spec, weights)
    assert "2 tensor(s)" in warning and all(name in warning for name in extra)
    assert model.warnings == [warning]
    # the CLI shows it on stderr and in --json, and still runs
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", "generate", "-m", str(path),
                        "-p", "w5", "--max-new-tokens", "2", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "warning:" in r.stderr and "extra_proj" in r.stderr
    assert json.loads(r.stdout)["warnings"] == [warning]


def test_a_complete_checkpoint_has_no_unused_tensors(llama_dir):
    from ster_py.weights import unused_tensor_warnings

    model = load_model(str(llama_dir))
    assert unused_tensor_warnings(model.spec, model.decoder.weights) == [] and model.warnings == []


# --------------------------------------------------------------------------- --model

@pytest.mark.parametrize("model", ["", "   "])
def test_empty_model_is_refused_without_the_network(model, monkeypatch):
    from ster_py.resolve import resolve

    monkeypatch.setitem(__import__("sys").modules, "huggingface_hub", None)  # any Hub use would fail loudly
    with pytest.raises(SterError, match="no model given"):
        resolve(model)


@pytest.mark.parametrize("kwargs, words", [
    ({"revision": 5}, r"^revision must be a text \(a branch, tag or commit\) or None, got 5$"),
    ({"check": 5}, r"^check must be a function check\(resolved, spec\), got int$"),
])
def test_load_model_refuses_a_revision_or_check_of_the_wrong_type(kwargs, words, monkeypatch):
    """load_model(path, revision=5) recorded the number as model_revision, so the captures and vectors made from
    the model were refused later (model_revision must be a string); check=5 was a TypeError ('not callable')."""
    from ster_py.load import load_model

    monkeypatch.setitem(__import__("sys").modules, "huggingface_hub", None)   # refused before any lookup
    with pytest.raises(SterError, match=words):
        load_model("/nonexistent/model", **kwargs)
    if "revision" in kwargs:   # load_tokenizer and merge_adapter resolve the model as load_model does
        from ster_py.load import load_tokenizer

        with pytest.raises(SterError, match=words):
            load_tokenizer("org/some-model", **kwargs)


def test_cli_empty_model_is_refused_not_the_default_preset(tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, HF_HUB_OFFLINE="1", HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", "generate", "-m", "",
                        "-p", "hi", "--max-new-tokens", "1"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode != 0 and "no model given" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == ""


# config and template side (round 2)

_LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
          "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 128,
          "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2}


def _spec_of(config, source="config.json"):
    """What inspect and load_model do with a config.json before any weight: check, gate, build, check."""
    from ster_py import families
    from ster_py.config import spec_from_config
    from ster_py.validate import check_config, check_spec, interpret

    check_config(config, source)
    family = interpret(source, families.gate, config, source)
    return check_spec(interpret(source, spec_from_config, config, family, source), source)


def _bounded(fn, *args, **kwargs):
    """Run ``fn`` and return (result or exception, peak traced bytes): refusals must not allocate first."""
    import tracemalloc

    tracemalloc.start()
    try:
        try:
            out = fn(*args, **kwargs)
        except SterError as exc:
            out = exc
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("changes, words", [
    ({"partial_rotary_factor": 10_000_000}, "partial_rotary_factor must give a rotary width within the head"),
    ({"model_type": "phi", "partial_rotary_factor": 1e7, "layer_norm_eps": 1e-5}, "partial_rotary_factor"),
    ({"model_type": "gpt_neox", "rotary_pct": 1e7, "layer_norm_eps": 1e-5, "num_key_value_heads": 4},
     "rotary_pct"),
    ({"model_type": "gptj", "rotary_dim": 1_000_000_000, "n_embd": 64, "n_head": 4, "n_layer": 2,
      "n_positions": 128, "layer_norm_epsilon": 1e-5}, "rotary_dim must be an integer in 1..head_dim"),
    ({"partial_rotary_factor": "abc"}, "partial_rotary_factor"),
])
def test_huge_rotary_width_is_refused_before_any_table(changes, words):
    out, peak = _bounded(_spec_of, {**_LLAMA, **changes})
    assert isinstance(out, SterError) and words in str(out), out
    assert peak < 4 << 20, f"{peak} bytes traced before the refusal"


def _gguf_meta(**changes):
    meta = {"general.architecture": "llama", "llama.embedding_length": 64, "llama.block_count": 2,
            "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2, "llama.context_length": 128,
            "llama.feed_forward_length": 128, "llama.attention.layer_norm_rms_epsilon": 1e-6,
            "llama.rope.freq_base": 10000.0, "tokenizer.ggml.tokens": [f"t{i}" for i in range(256)]}
    meta.update({f"llama.{k.replace('__', '.')}": v for k, v in changes.items()})
    return meta


@pytest.mark.parametrize("changes, words", [
    ({"rope__dimension_count": 1 << 30}, "llama.rope.dimension_count is 1073741824, above the limit"),
    ({"rope__dimension_count": 14}, "llama.rope.dimension_count (14) must be even and at most the head width 16"),
    ({"rope__dimension_count": 15}, "llama.rope.dimension_count (15) must be even"),
    ({"attention__key_length": 8, "rope__dimension_count": 16}, "attention.key_length"),
    ({"rope__freq_base": -1.0}, "llama.rope.freq_base must be a finite number above 0"),
    # one width per layer is read when all agree (llama.cpp's gemma3n writes them so); others are named
    ({"feed_forward_length": np.array([128, 256])}, "llama.feed_forward_length lists different widths per layer"),
    ({"feed_forward_length": np.array([128, 128, 128])}, "llama.feed_forward_length must be a whole number or one "
                                                          "per layer (2), got a list of 3 values"),
    # head counts may be stated per layer (llama.cpp's get_key_or_arr), one per layer of block_count
    ({"attention__head_count_kv": [2, 2, 2]}, "llama.attention.head_count_kv must list a count in 1..4096 for "
                                              "each of the 2 layers"),
    # s18 fuzzing: a float window was truncated by int() (2.5 ran as 2) or, at 1e30, overflowed the attention
    # kernel's C long in a traceback; sizes are whole numbers (llama.cpp reads them as integers)
    ({"attention__sliding_window": 2.5}, "llama.attention.sliding_window must be a whole number, got 2.5"),
    ({"attention__sliding_window": 1e30}, "llama.attention.sliding_window must be a whole number, got 1e+30"),
    ({"block_count": 2.0}, "llama.block_count must be a whole number, got 2.0"),
    ({"context_length": True}, "llama.context_length must be a whole number, got True"),
])
def test_gguf_rotary_and_per_layer_metadata_are_named(changes, words):
    from ster_py.gguf.config import spec_from_gguf
    from ster_py.validate import check_spec, interpret

    if changes.get("rope__dimension_count") == 14:  # a valid narrower width is accepted
        spec = check_spec(spec_from_gguf(_gguf_meta(**changes), "m.gguf"), "m.gguf")
        assert spec.layers[0].rope.rotary_dim == 14
        return
    out, peak = _bounded(lambda: check_spec(interpret("m.gguf", spec_from_gguf, _gguf_meta(**changes), "m.gguf"),
                                            "m.gguf"))
    assert isinstance(out, SterError) and words in str(out) and "\n" not in str(out), out
    assert "rope_theta" not in str(out)
    assert peak < 4 << 20


@pytest.mark.parametrize("rope, words", [
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
      "original_max_position_embeddings": 64}, "high_freq_factor (1) above low_freq_factor (1)"),
    ({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0] * 8,
      "original_max_position_embeddings": 64}, "short_factor must list one factor per rotary pair (8), got 1"),
    ({"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [1.0],
      "original_max_position_embeddings": 64}, "long_factor must list one factor per rotary pair (8), got 1"),
    ({"rope_type": "default", "rope_theta": -5.0}, "rope_theta must be a finite number above 0"),
    ({"rope_type": "dynamic", "factor": -2}, "factor must be a finite number above 0"),
])
def test_rope_parameters_are_checked_by_name(rope, words):
    import warnings

    config = {**_LLAMA, "rope_parameters": {"rope_theta": 10000.0, **rope}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's divide-by-zero warnings were the old symptom
        with pytest.raises(SterError, match=re.escape(words)):
            _spec_of(config)


def test_odd_head_dim_names_head_dim_not_rope_theta():
    with pytest.raises(SterError, match=r"rotary width 3 \(head_dim 3") as info:
        _spec_of({**_LLAMA, "head_dim": 3})
    assert "rope_theta" not in str(info.value)


@pytest.mark.parametrize("key, value", [
    ("eos_token_id", [float("inf"), "a", {"x": 1}]), ("eos_token_id", 10 ** 26), ("eos_token_id", True),
    ("bos_token_id", "1"), ("bos_token_id", [1]), ("pad_token_id", {"x": 1}), ("eos_token_id", [2, None]),
])
def test_config_token_ids_of_the_wrong_type_are_refused(llama_dir, tmp_path, key, value):
    from ster_py.inspect import inspect_model

    with pytest.raises(SterError, match=key):
        _spec_of({**_LLAMA, key: value})
    path = tmp_path / "m"
    import shutil

    shutil.copytree(llama_dir, path)
    cfg = json.loads((path / "config.json").read_text())
    cfg[key] = value
    (path / "config.json").write_text(json.dumps(cfg))
    for run in (inspect_model, load_model):  # inspect and generate agree
        with pytest.raises(SterError, match=f"{key} must be a token id"):
            run(str(path))


def test_config_token_id_lists_and_null_are_accepted():
    spec = _spec_of({**_LLAMA, "eos_token_id": [2, 3], "pad_token_id": None, "bos_token_id": None})
    assert spec.eos_token_ids == (2, 3)


_DEEP = "[" * 100_000 + "]" * 100_000


def test_deeply_nested_json_is_refused_everywhere(tmp_path):
    from ster_py.artifacts import read_json
    from ster_py.cli_template import _read_json, _variables
    from ster_py.resolve import read_config

    deep = tmp_path / "deep.json"
    deep.write_text(_DEEP)
    for read in (lambda: read_config(deep), lambda: read_json(deep, "steering vector"),
                 lambda: _read_json(str(deep), "messages"), lambda: _variables(["x=" + "[" * 5000 + "]" * 5000])):
        with pytest.raises(SterError, match="nested too deeply"):
            read()


def test_numbers_too_long_for_python_and_repeated_keys(tmp_path):
    """A JSON integer of 5,000 digits (past Python's conversion limit) is one SterError in every JSON reader (a
    traceback in template render's --messages and --var); ster's own artifacts also refuse a key given twice in
    one object, which json would keep the last of in silence ("0" and "0" of a vector's directions)."""
    from ster_py.artifacts import read_json
    from ster_py.cli_template import _read_json, _variables
    from ster_py.resolve import read_config

    huge = tmp_path / "huge.json"
    huge.write_text('{"a": 1' + "0" * 5000 + "}")
    for read in (lambda: read_config(huge), lambda: read_json(huge, "steering vector"),
                 lambda: _read_json(str(huge), "messages"), lambda: _variables(["x=" + huge.read_text()])):
        with pytest.raises(SterError, match="4300 digits"):
            read()
    twice = tmp_path / "twice.json"
    twice.write_text('{"directions": {"0": [1.0], "0": [2.0]}}')
    with pytest.raises(SterError, match='names the key "0" twice'):
        read_json(twice, "steering vector")


def test_template_render_cli_refuses_deep_json_and_surrogates(tmp_path):
    from typer.testing import CliRunner

    from ster_py.cli import app

    template = tmp_path / "t.j2"
    template.write_text("{{ messages[0].content }}{{ x }}")
    deep, surrogate, plain = tmp_path / "deep.json", tmp_path / "s.json", tmp_path / "ok.json"
    deep.write_text(_DEEP)
    surrogate.write_text('[{"role": "user", "content": "\\ud800"}]')
    plain.write_text('[{"role": "user", "content": "hi"}]')
    for args, words in ([["--messages", str(deep)], "nested too deeply"],
                        [["--messages", str(surrogate)], "lone surrogate U+D800"],
                        [["--messages", str(plain), "--var", 'x="\\udc80"'], "lone surrogate U+DC80"],
                        [["--messages", str(plain), "--tools", str(deep)], "nested too deeply"]):
        r = CliRunner().invoke(app, ["template", "render", "--template", str(template), *args])
        assert isinstance(r.exception, SterError) and words in str(r.exception), (args, r.exception)


def test_lipsum_is_refused_not_run():
    with pytest.raises(SterError, match=r"lipsum\(\) is not available"):
        render_chat("{{ lipsum(2000000, html=false, min=1000, max=1001) }}", [{"role": "user", "content": "x"}],
                    time_limit=60)


def test_lone_surrogates_in_rendered_text_are_refused():
    with pytest.raises(SterError, match=r"lone surrogate U\+D800 at character 3"):
        render_chat("{{ 'ab ' ~ messages[0].content }}", [{"role": "user", "content": "\ud800"}])
    # A pair is a real character: kept.
    pair = json.loads('"\\ud83d\\ude00"')
    assert render_chat("{{ messages[0].content }}", [{"role": "user", "content": pair}]) == "\N{GRINNING FACE}"


def test_prompt_is_bounded_by_the_context_before_tokenizing(llama_dir):
    from ster_py.prompt import PIECE_CHARS, encode_prompt, longest_token_chars
    from ster_py.tokenizer import Tokenizer

    def max_prompt_chars_of(tok, context):  # the bound used before: context x the longest token
        return max(context * longest_token_chars(tok), PIECE_CHARS)

    tok = Tokenizer(Tokenizer.from_dir(llama_dir).tk, chat_template="{{ 'a' * 30000000 }}")
    out, peak = _bounded(encode_prompt, tok, "hi", context=64)
    assert isinstance(out, SterError) and "over its budget" in str(out) and "context of 64 tokens" in str(out), out
    assert peak < 8 << 20
    # Raw text: no character count proves a text too long (here "a" * N is one unknown word, one
    # token): it is refused by its tokens, counted in pieces (s9-left), and a text that fits is never refused.
    long_word = "a" * (max_prompt_chars_of(tok, 64) + 1)
    fits = encode_prompt(tok, long_word, chat_template="off", context=64)
    assert fits.ids == tok.encode(long_word) and len(fits.ids) <= 64
    longest = max(tok.tk.get_vocab(with_added_tokens=True), key=len)
    assert len(longest) == longest_token_chars(tok)
    with pytest.raises(SterError, match="lone surrogate"):
        encode_prompt(tok, "x\udc80", chat_template="off", context=64)


def test_title_filter_matches_jinja_and_works_in_pieces(monkeypatch):
    import random

    import jinja2.filters

    import ster_py.chat as chat

    monkeypatch.setattr(chat, "_TITLE_CHUNK", 7)  # cut often: every cut must keep Jinja's words
    rng = random.Random(0)
    for _ in range(2000):
        text = "".join(rng.choice("aB -(\t\n{[<xÉé\u00a0ßǆ") for _ in range(rng.randint(0, 60)))
        assert chat._title(text) == jinja2.filters.do_title(text), repr(text)
    monkeypatch.undo()
    monkeypatch.setattr(chat, "_ISOLATE", False)  # measure the in-process filter itself (tracemalloc sees no child)
    out, peak = _bounded(render_chat, "{{ ('a ' * 1000000) | title }}", [{"role": "user", "content": "x"}],
                         time_limit=120)  # tracemalloc slows it several times
    assert out == "A " * 1000000
    assert peak < 24 << 20, peak  # Jinja's one-shot title holds a list of a million words (~60 MB)


# ----------------------------------------------------------------------------------------------------
# tokenizer-side inputs (round 2)
# Crafted tokenizer metadata and files, and user input files: each is a one-line SterError, never a
# Rust panic, an abort, a traceback or a huge allocation.

def _t5_meta(charsmap: bytes) -> dict:
    return {"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": ["<pad>", "</s>", "<unk>", "\u2581a", "b"],
            "tokenizer.ggml.scores": np.array([0.0, 0.0, 0.0, -1.0, -2.0], dtype=np.float32),
            "tokenizer.ggml.token_type": np.array([3, 3, 2, 1, 1], dtype=np.int32),
            "tokenizer.ggml.precompiled_charsmap": np.frombuffer(charsmap, dtype=np.uint8)}


@pytest.mark.parametrize("charsmap, words", [
    # The trie size says 2**31-1 bytes: tokenizers would allocate 4 GB (and abort) before comparing.
    (b"\xff\xff\xff\x7f" + bytes(20), "trie size 2147483647 does not fit"),
    (b"\x06\x00\x00\x00" + bytes(8), "trie size 6 does not fit"),  # not whole 4-byte units
    (b"\x01\x02", "too short"),
    # A size that fits, but a trie unit pointing far outside: tokenizers panics (a BaseException).
    (b"\x04\x00\x00\x00\x01\x02\x03\x04\x00\x00\x00", "not a SentencePiece character map"),
])
def test_gguf_crafted_charsmap_is_a_ster_error(charsmap, words):
    from ster_py.gguf.tokenizer import tokenizer_from_gguf_metadata

    with pytest.raises(SterError, match="precompiled_charsmap") as info:
        tokenizer_from_gguf_metadata(_t5_meta(charsmap))
    assert words in str(info.value)


def _unigram_dir(tmp_path, normalizer):
    import tokenizers
    from tokenizers import models

    tk = tokenizers.Tokenizer(models.Unigram([("<unk>", 0.0), ("h", -1.0), ("i", -1.0), ("hi", -0.5)], unk_id=0,
                                             byte_fallback=False))
    doc = json.loads(tk.to_str())
    doc["normalizer"] = normalizer
    (tmp_path / "tokenizer.json").write_text(json.dumps(doc))
    return tmp_path


@pytest.mark.parametrize("charsmap", ["/////w==", "AAAAgAEC", "not base64!"])
def test_tokenizer_json_crafted_precompiled_charsmap_is_a_ster_error(tmp_path, charsmap):
    from ster_py.tokenizer import Tokenizer

    # "/////w==" makes tokenizers panic ("Cannot parse precompiled_charsmap"), "AAAAgAEC" claims a 2 GB trie.
    path = _unigram_dir(tmp_path, {"type": "Sequence", "normalizers": [
        {"type": "Precompiled", "precompiled_charsmap": charsmap}]})
    with pytest.raises(SterError, match="tokenizer.json"):
        Tokenizer.from_dir(path)


def test_tokenizer_json_charsmap_with_a_bad_trie_link_is_refused_before_tokenizers(tmp_path, monkeypatch):
    import base64

    import ster_py.gguf.tokenizer as gt
    from ster_py.tokenizer import Tokenizer

    # Its size fits, but the root unit links far outside the trie: tokenizers would panic at encode.
    data = base64.b64encode(b"\x04\x00\x00\x00\x01\x02\x03\x04\x00\x00\x00").decode()
    path = _unigram_dir(tmp_path, {"type": "Precompiled", "precompiled_charsmap": data})
    with pytest.raises(SterError, match="a trie link points outside the trie"):
        Tokenizer.from_dir(path)
    # Without the walk, the panic at encode is still a SterError (a Rust panic is a BaseException).
    monkeypatch.setattr(gt, "_trie_problem", lambda *a: None)
    with pytest.raises(SterError, match="the tokenizer failed"):
        Tokenizer.from_dir(path).encode("ab")


def test_gguf_vocabulary_size_is_bounded():
    from ster_py.gguf import tokenizer as gt

    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": [str(i) for i in range(gt.MAX_GGUF_TOKENS + 1)]}
    out, peak = _bounded(gt.tokenizer_from_gguf_metadata, meta)
    assert isinstance(out, SterError) and "refuses more than 1048576" in str(out), out
    assert peak < 1 << 20  # refused before the vocabulary is copied
    meta["tokenizer.ggml.tokens"] = ["x" * 1000] * (gt.MAX_GGUF_VOCAB_CHARS // 1000 + 1)
    with pytest.raises(SterError, match="characters of token text"):
        gt.tokenizer_from_gguf_metadata(meta)


def test_gguf_sentencepiece_vocabulary_of_many_splits_builds_and_encodes():
    # Every two- and three-letter string as a piece: ~1,100 pieces whose merge list had 1,108 pairs
    # (a list ster once had to bound); sentencepiece merges by score without one.
    import itertools

    from ster_py.gguf import tokenizer as gt

    letters = "abcdefghijklmnopqrstuvwxyz"
    tokens = ["<unk>", "<s>", "</s>", *letters, *("".join(p) for p in itertools.product(letters, repeat=2)),
              *("".join(p) for p in itertools.product(letters[:6], repeat=3))]
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": -np.arange(len(tokens), dtype=np.float32),
            "tokenizer.ggml.add_space_prefix": False}
    tk = gt.tokenizer_from_gguf_metadata(meta).tokenizer
    ids = tk.encode("abcdef" * 20_000, add_special_tokens=False).ids
    assert tk.decode(ids) == "abcdef" * 20_000
    assert tk.encode("abc", add_special_tokens=False).tokens == ["abc"]
    assert tk.encode("abz", add_special_tokens=False).tokens == ["ab", "z"]  # "ab" outscores "bz"; no "abz"


def _spm_meta(**extra) -> dict:
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "a", "b", "ab"],
            "tokenizer.ggml.scores": np.array([0, 0, 0, -1, -2, -3], dtype=np.float32), **extra}


@pytest.mark.parametrize("key, value", [
    ("eot_token_id", "2"), ("eot_token_id", 1.5), ("eos_token_id", np.array([1, 2])), ("seperator_token_id", "x"),
    ("bos_token_id", True),
])
def test_gguf_special_id_of_wrong_type_names_the_key(key, value):
    from ster_py.gguf.tokenizer import tokenizer_from_gguf_metadata

    with pytest.raises(SterError, match=f"tokenizer.ggml.{key} must be an integer token id"):
        tokenizer_from_gguf_metadata(_spm_meta(**{f"tokenizer.ggml.{key}": value}))
    # np.uint32 (what a reader may give) and out-of-range ints (ignored, as llama.cpp does) are fine.
    parts = tokenizer_from_gguf_metadata(_spm_meta(**{"tokenizer.ggml.eot_token_id": np.uint32(2),
                                                      "tokenizer.ggml.padding_token_id": 99}))
    assert parts.eos_token_ids == {2} and parts.pad_token_id is None


@pytest.mark.parametrize("bos", [99999, 2**32 - 1])
def test_gguf_special_id_outside_the_vocabulary_warns_and_keeps_the_default_as_llamacpp(bos, tmp_path):
    """llama.cpp (llama-vocab.cpp, load_vocab) ignores an out-of-range tokenizer.ggml.bos_token_id with a
    warning and keeps its default id (1 for SentencePiece): the oracle's ids with BOS added, and a visible note."""
    import gguf

    from ster_py import llamacpp
    from ster_py.gguf.reader import GGUFFile
    from ster_py.gguf.tokenizer import tokenizer_from_gguf_metadata

    path = tmp_path / "vocab.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64), w.add_embedding_length(8), w.add_block_count(1), w.add_feed_forward_length(8)
    w.add_head_count(1), w.add_layer_norm_rms_eps(1e-5), w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>", "\u2581a", "\u2581b", "a", "b", "\u2581"])
    w.add_token_scores([0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0]), w.add_token_types([2, 3, 3, 1, 1, 1, 1, 1])
    w.add_uint32("tokenizer.ggml.bos_token_id", bos), w.add_eos_token_id(2), w.add_add_bos_token(True)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    parts = tokenizer_from_gguf_metadata(dict(GGUFFile(str(path), allow_unsupported=True).metadata),
                                         for_generation=False)
    tok = parts.to_tokenizer()
    want = llamacpp.tokenize(path, ["a b"], add_special=True)[0]
    assert want[0] == 1 and tok.encode("a b", add_special_tokens=True) == want
    assert len(tok.notes) == 1 and f"tokenizer.ggml.bos_token_id = {bos} is outside the vocabulary" in tok.notes[0]


@pytest.mark.parametrize("key, value", [
    ("add_space_prefix", "false"), ("add_bos_token", "no"), ("add_eos_token", 0), ("remove_extra_whitespaces", 1),
])
def test_gguf_string_boolean_is_refused(key, value):
    from ster_py.gguf.tokenizer import tokenizer_from_gguf_metadata

    with pytest.raises(SterError, match=f"tokenizer.ggml.{key} must be a boolean"):
        meta = _spm_meta(**{f"tokenizer.ggml.{key}": value})
        if key == "remove_extra_whitespaces":
            meta = {**_t5_meta(b""), f"tokenizer.ggml.{key}": value}
            del meta["tokenizer.ggml.precompiled_charsmap"]
        tokenizer_from_gguf_metadata(meta)
    assert tokenizer_from_gguf_metadata(_spm_meta(**{"tokenizer.ggml.add_space_prefix": np.bool_(False)})
                                        ).add_space_prefix is False


def test_wordpiece_string_boolean_is_refused():
    from ster_py.gguf.tokenizer import tokenizer_from_gguf_metadata

    bert = {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["[PAD]", "[UNK]", "\u2581a"],
            "tokenizer.ggml.token_type": np.array([3, 2, 1], dtype=np.int32), "tokenizer.ggml.unknown_token_id": 1,
            "tokenizer.ggml.add_sep_token": False, "tokenizer.ggml.add_bos_token": False,
            "tokenizer.ggml.normalizer.lowercase": "no"}
    with pytest.raises(SterError, match="normalizer.lowercase must be a boolean"):
        tokenizer_from_gguf_metadata(bert, for_generation=False)


def _hf_copy(llama_dir, dst, **files):
    import shutil

    shutil.copytree(llama_dir, dst)
    for name, content in files.items():
        name = name.replace("__", ".")
        (dst / name).write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return dst


@pytest.mark.parametrize("files, words", [
    ({"tokenizer_config__json": ["a", "b"]}, "tokenizer_config.json: it holds a JSON list, not an object"),
    ({"tokenizer_config__json": {"added_tokens_decoder": {"abc": {"content": "<x>"}}}},
     "added_tokens_decoder has the key 'abc'"),
    ({"tokenizer_config__json": {"added_tokens_decoder": ["x"]}}, "added_tokens_decoder is a list"),
    ({"tokenizer_config__json": {"bos_token": {"content": 5}}}, "bos_token.content is int"),
    ({"special_tokens_map__json": {"eos_token": {"content": None}}}, "special_tokens_map.json: eos_token.content"),
    ({"special_tokens_map__json": "text"}, "special_tokens_map.json: it holds a JSON str"),
    ({"generation_config__json": [1, 2]}, "generation_config.json: it holds a JSON list"),
    # s18 fuzzing: these eos ids were dropped in silence (generation ran past the end token)
    ({"generation_config__json": {"eos_token_id": "2"}}, 'eos_token_id must be a token id (an integer) or a list '
                                                         'of them, got "2"'),
    ({"generation_config__json": {"eos_token_id": [2, [3]]}}, "eos_token_id must be a token id"),
    ({"generation_config__json": {"eos_token_id": 2.5}}, "eos_token_id must be a token id"),
    ({"config__json": {"text_config": {"eos_token_id": True}}}, "text_config.eos_token_id must be a token id"),
])
def test_malformed_files_beside_tokenizer_json(llama_dir, tmp_path, files, words):
    from ster_py.tokenizer import Tokenizer

    with pytest.raises(SterError, match="failed to load tokenizer") as info:
        Tokenizer.from_dir(_hf_copy(llama_dir, tmp_path / "m", **files))
    assert words in str(info.value)


def test_non_utf8_chat_template_fails_only_when_a_template_is_wanted(llama_dir, tmp_path):
    from ster_py.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(_hf_copy(llama_dir, tmp_path / "m", chat_template__jinja=b"\xff\xfe{{ x }}"))
    assert tok.encode("hello", add_special_tokens=False) == Tokenizer.from_dir(llama_dir).encode(
        "hello", add_special_tokens=False)
    with pytest.raises(SterError, match="chat_template.jinja is not UTF-8"):
        tok.render_chat([{"role": "user", "content": "hi"}])


def test_malformed_chat_template_field_is_one_error_line_when_the_template_is_used(llama_dir, tmp_path):
    """chat_template 5 in tokenizer_config.json ran `ster generate` on the raw prompt, as if the model had no
    template; now one error line names the file and the field, and --chat-template off still runs raw text."""
    cfg = json.loads((llama_dir / "tokenizer_config.json").read_text())
    m = _hf_copy(llama_dir, tmp_path / "m", tokenizer_config__json={**cfg, "chat_template": 5})
    _one_error_line(_ster("generate", "-m", str(m), "-p", "w5", "--max-new-tokens", "1", "-q"),
                    f"{m / 'tokenizer_config.json'}: chat_template is a number 5, not a Jinja template")
    _one_error_line(_ster("chat", "-m", str(m), "-q", stdin="hi\n"), "chat_template is a number 5")
    done = _ster("generate", "-m", str(m), "-p", "w5", "--max-new-tokens", "1", "-q", "--chat-template", "off")
    assert done.returncode == 0, done.stderr
    done = _ster("inspect", str(m), "--json")  # inspect shows the problem as a warning instead of failing on it
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["chat_template"] is False and any("chat_template is a number 5" in w for w in doc["warnings"]), doc


def _ster(*args, stdin=None):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=120, input=stdin)


def _one_error_line(done, words):
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], done.stderr


def test_input_files_must_be_regular_and_bounded(llama_dir, tmp_path):
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    messages = tmp_path / "m.json"
    messages.write_text('[{"role": "user", "content": "hi"}]')
    # A FIFO with no writer would block open() forever; /dev/zero would never end.
    _one_error_line(_ster("tokenize", "-m", str(llama_dir), "--file", str(fifo)), "is not a regular file")
    _one_error_line(_ster("tokenize", "-m", str(llama_dir), "--file", "/dev/zero"), "is not a regular file")
    _one_error_line(_ster("template", "render", "--template", str(fifo), "--messages", str(messages)),
                    "template file")
    _one_error_line(_ster("template", "render", "--template", str(messages), "--messages", str(fifo)),
                    "messages file")
    _one_error_line(_ster("template", "render", "-m", str(llama_dir), "--messages", str(messages), "--tools",
                          "/dev/zero"), "tools file")
    _one_error_line(_ster("template", "render", "--template", str(messages), "--messages", "-",
                          stdin="[" + " " * (9 << 20) + "]"), "larger than 8388608 bytes")


def test_read_input_file_size_bound(tmp_path):
    from ster_py.cli_text import read_input_file

    path = tmp_path / "t.txt"
    path.write_bytes(b"x" * 101)
    assert read_input_file(path, "text file", 101) == b"x" * 101
    out, peak = _bounded(read_input_file, path, "text file", 100)
    assert isinstance(out, SterError) and "larger than 100 bytes" in str(out)
    with pytest.raises(SterError, match="not found"):
        read_input_file(tmp_path / "missing", "text file", 100)


@pytest.mark.parametrize("reader", ["read_input_file", "read_regular"])
def test_a_path_swapped_for_a_fifo_after_its_check_does_not_block(tmp_path, monkeypatch, reader):
    """A path that is a regular file when looked at and a FIFO when opened (swapped in between): the reader
    checks the open descriptor, so it refuses at once instead of blocking in open() for a writer."""
    import os
    import threading

    from ster_py import cli_text, files

    regular, fifo = tmp_path / "regular", tmp_path / "fifo"
    regular.write_bytes(b"hi")
    os.mkfifo(fifo)
    real_stat = os.stat
    # the swap lands right after any look at the path: stat sees the regular file
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: real_stat(regular if str(p) == str(fifo) else p, *a, **k))
    read = (lambda: cli_text.read_input_file(fifo, "file", 100)) if reader == "read_input_file" else \
        (lambda: files.read_regular(fifo, "conversation", 100))
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(_raised(read)), daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():   # blocked in open(): give it a writer that ends at once, so the thread ends
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(10)
    monkeypatch.undo()
    assert outcome and isinstance(outcome[0], SterError) and "not a regular file" in str(outcome[0]), outcome


def _raised(call):
    try:
        return call()
    except Exception as e:  # noqa: BLE001 - the test looks at what it was
        return e


def test_detokenize_ids_are_ascii_decimal():
    from ster_py.cli_text import _parse_ids

    assert _parse_ids(["1,2", "[3 4]", "-0"], 10) == [1, 2, 3, 4, 0]
    for bad in ["\u0661\u0662", "1_000", "+5", "--1", "0x1", "1.0"]:
        with pytest.raises(SterError, match="is not a token id"):
            _parse_ids([bad], 10)
    for nothing in [[""], [","], ["[]"]]:
        with pytest.raises(SterError, match="no token ids given"):
            _parse_ids(nothing, 10)
    with pytest.raises(SterError) as info:
        _parse_ids(["9" * 5000], 10)
    assert len(str(info.value)) < 200 and "5000 digits" in str(info.value)
    with pytest.raises(SterError, match="outside this vocabulary"):
        _parse_ids(["-1"], 10)


# --------------------------------------------------------------------------- lead: round-2 wiring


def test_deeply_nested_json_in_weights_index_and_prompts_is_refused(llama_dir, tmp_path):
    from ster_py.capture import read_prompts

    deep = "[" * 100000 + "]" * 100000
    path = _with_config(llama_dir, tmp_path / "m")
    header = deep.encode()
    (path / "bad.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(SterError, match="nested too deeply"):
        load_model(str(path))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(deep + "\n")
    with pytest.raises(SterError, match="line 1 is not JSON"):
        read_prompts(None, prompts)


def test_generate_refuses_a_template_that_renders_past_the_context_before_tokenizing(llama_dir, tmp_path):
    """A chat template that writes a gigantic prompt is stopped while rendering (the bound is
    context x the longest token text), not after tokenizing it."""
    import subprocess
    import sys
    import time

    path = _with_config(llama_dir, tmp_path / "m", max_position_embeddings=64)
    cfg = json.loads((path / "tokenizer_config.json").read_text()) if (path / "tokenizer_config.json").exists() else {}
    cfg["chat_template"] = "{{ 'w5 ' * 3000000 }}"
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", "generate", "-m", str(path),
                        "-p", "hi", "--max-new-tokens", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and r.stderr.startswith("error:") and "Traceback" not in r.stderr, r.stderr
    assert "over budget" in r.stderr and "context of 64" in r.stderr
    assert time.perf_counter() - t < 30


# Issue 17/23 (breaker3): a Unigram vocabulary of long pieces makes tokenizers' trie take ~350 bytes per piece
# character and abort the process; the pieces are bounded (total and each) before the tokenizer is built.

_LONG = [f"{i:05d}" + "x" * 1000 for i in range(4300)]  # 4.3 M characters, each piece 1005


def test_gguf_unigram_vocabulary_characters_are_bounded():
    from ster_py.gguf.tokenizer import MAX_UNIGRAM_CHARS, tokenizer_from_gguf_metadata

    assert sum(map(len, _LONG)) > MAX_UNIGRAM_CHARS
    meta = _t5_meta(b"")
    del meta["tokenizer.ggml.precompiled_charsmap"]
    n = len(_LONG) + 5
    meta.update({"tokenizer.ggml.tokens": meta["tokenizer.ggml.tokens"] + _LONG,
                 "tokenizer.ggml.scores": np.full(n, -3.0, dtype=np.float32),
                 "tokenizer.ggml.token_type": np.array([3, 3, 2] + [1] * (n - 3), dtype=np.int32)})
    with pytest.raises(SterError, match=r"tokenizer.ggml.tokens: its 4305 pieces hold \d+ characters"):
        tokenizer_from_gguf_metadata(meta)
    meta["tokenizer.ggml.tokens"] = meta["tokenizer.ggml.tokens"][:6] + ["y" * 1025] + meta["tokenizer.ggml.tokens"][7:]
    with pytest.raises(SterError, match="piece 6 holds 1025 characters"):
        tokenizer_from_gguf_metadata(meta)


def _plamo_rows(extra):
    rows = [["<|plamo:unk|>", 0.0, "UNKNOWN"]] + [[f"<0x{b:02X}>", 0.0, "BYTE"] for b in range(256)]
    return rows + extra


def test_plamo_jsonl_long_pieces_huge_scores_and_surrogates_are_refused(tmp_path):
    from ster_py.plamo_tokenizer import build, read_jsonl

    def write(rows):
        path = tmp_path / "tokenizer.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path

    pieces, scores, kinds = read_jsonl(write(_plamo_rows([[p, -5.0, "NORMAL"] for p in _LONG])))
    with pytest.raises(SterError, match="failed to build PLaMo's tokenizer: its 4557 pieces hold"):
        build(pieces, scores, kinds, 0)
    with pytest.raises(SterError, match="line 258's score 1e\\+308 is out of range"):
        read_jsonl(write(_plamo_rows([["zz", 1e308, "NORMAL"]])))
    with pytest.raises(SterError, match="line 258's piece holds a lone surrogate"):
        read_jsonl(write(_plamo_rows([["\ud800", 0.0, "NORMAL"]])))  # json.dumps writes "\ud800" escaped


def test_tokenizer_json_unigram_vocabulary_characters_are_bounded(tmp_path):
    from ster_py.tokenizer import Tokenizer

    path = _unigram_dir(tmp_path, None)
    doc = json.loads((path / "tokenizer.json").read_text())
    doc["model"]["vocab"] += [[p, -5.0] for p in _LONG]
    (path / "tokenizer.json").write_text(json.dumps(doc))
    with pytest.raises(SterError, match="tokenizer.json: its 4304 pieces hold"):
        Tokenizer.from_dir(path)


# Issue 17/23 (breaker3): config values whose error lines carried Python exception names (ValueError,
# OverflowError, TypeError from the gate's catch-all) are checked by name.

@pytest.mark.parametrize("changes, words", [
    ({"rope_scaling": [1]}, "rope_scaling is \\[1\\], not an object of rope parameters"),
    ({"rms_norm_eps": "abc"}, "rms_norm_eps / .* must be a number .*got 'abc'"),  # also Mistral's norm_eps
])
def test_config_values_of_the_wrong_kind_are_named(llama_dir, changes, words):
    config = {**json.loads((llama_dir / "config.json").read_text()), **changes}
    config.pop("rope_parameters", None)
    with pytest.raises(SterError, match=words) as info:
        _spec_of(config)
    assert not re.search(r"(Value|Type|Overflow)Error", str(info.value))


# s18 breaker (mutation fuzzing): a rope_parameters that is not an object ran with the default
# rotation (rope_theta 10000), a per-type list of pairs was read as an object, and a per-type
# number or null ended in a TypeError's words.
@pytest.mark.parametrize("rope, words", [
    (-1, "rope_parameters is -1, not an object"), ("x", "rope_parameters is x, not an object"),
    ([1], "rope_parameters is \\[1\\], not an object"),
    ({"full_attention": [["rope_theta", 5e5]]}, "rope_parameters.full_attention is \\[\\['rope_theta'"),
    ({"full_attention": {"rope_theta": 5e5}, "sliding_attention": None}, "rope_parameters.sliding_attention is None"),
    ({"full_attention": {"rope_theta": 5e5}, "sliding_attention": 5}, "rope_parameters.sliding_attention is 5"),
])
def test_rope_parameters_that_are_not_objects_are_refused(llama_dir, rope, words):
    config = {**json.loads((llama_dir / "config.json").read_text()), "rope_parameters": rope}
    with pytest.raises(SterError, match=words) as info:
        _spec_of(config)
    assert not re.search(r"(Value|Type|Overflow)Error", str(info.value))


@pytest.mark.parametrize("factor", [float("nan"), float("inf"), -0.5])
def test_ling25_partial_rotary_factor_must_be_a_fraction(factor):
    from test_parity_ling25 import _BASE

    with pytest.raises(SterError, match="partial_rotary_factor is .*a number in \\(0, 1\\]") as info:
        _spec_of(dict(_BASE, partial_rotary_factor=factor))
    assert not re.search(r"(Value|Type|Overflow)Error", str(info.value))


# Issue 17/23 (breaker3): a config that says the head is not tied, without the head tensor, ran with the embedding
# as its head; it is refused naming the tensor, in the Transformers and the Mistral format (whose params.json
# unties by default). A config silent on tying keeps the fallback.

def _drop_head(src, dst, config_changes, drop_key=False):
    from safetensors.numpy import load_file, save_file

    path = _with_config(src, dst, **config_changes)
    cfg = json.loads((path / "config.json").read_text())
    if drop_key:
        cfg.pop("tie_word_embeddings", None)
        (path / "config.json").write_text(json.dumps(cfg))
    state = load_file(str(path / "model.safetensors"))
    state.pop("lm_head.weight", None)
    save_file(state, str(path / "model.safetensors"))
    return path


def test_missing_untied_head_is_refused_by_name(llama_dir, tmp_path):
    from test_mistral_params import _to_mistral_format
    from ster_py.resolve import resolve

    hf = _drop_head(llama_dir, tmp_path / "hf", {"tie_word_embeddings": False})
    with pytest.raises(SterError, match="no tensor 'lm_head.weight'.*tie_word_embeddings is false.*config.json"):
        load_model(str(hf))
    silent = _drop_head(llama_dir, tmp_path / "silent", {}, drop_key=True)
    assert load_model(str(silent)).decoder.head is not None  # the family's default (untied) falls back as before

    cfg = json.loads((llama_dir / "config.json").read_text())
    cfg.setdefault("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    mt = tmp_path / "mt"
    _to_mistral_format(llama_dir, mt, cfg)
    from safetensors.numpy import load_file, save_file
    state = load_file(str(mt / "consolidated.safetensors"))
    del state["output.weight"]
    save_file(state, str(mt / "consolidated.safetensors"))
    assert "tied_embeddings" not in json.loads((mt / "params.json").read_text())
    resolve(str(mt))
    with pytest.raises(SterError, match="no tensor 'output.weight'.*tie_word_embeddings is false.*params.json"):
        load_model(str(mt))
