"""Steering vectors: the artifact, refusals, ``ster vector caa`` and ``generate --vector``.

Oracles: transformers with forward hooks that add strength x direction to the
output of the same decoder layers (every position, prefill and each cached
decode step), and transformers' hidden states for the CAA difference of means.
The real-model test (SmolLM2) checks the direction of the effect with a
measurable criterion: the log-probability margin of a positive-side sentence
over a negative-side one, teacher-forced after a neutral prompt.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

from ster_py.adapters import load_adapter_for
from ster_py.errors import SterError
from ster_py.load import load_model
from ster_py.steering import SteeringVector, caa, check_vector_for, read_vector, steering_hook, write_vector
from tiny import make_checkpoint, rel_err

PROMPT_IDS = [5, 9, 17, 33, 65, 3]
PROMPT = " ".join(f"w{i}" for i in PROMPT_IDS)


def ster(*args):
    return subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    return path, make_checkpoint(path, "llama")


def unit_directions(layers, width=64, seed=0):
    rng = np.random.RandomState(seed)
    out = {}
    for i in layers:
        v = rng.standard_normal(width)
        out[i] = (v / np.linalg.norm(v)).astype(np.float32)
    return out


def hooked_greedy(model, ids, directions, strength, n):
    """transformers' greedy continuation with strength * direction added after each given layer."""
    import torch

    def adder(vec):
        add = torch.tensor(vec) * strength

        def hook(mod, args, out):
            if isinstance(out, tuple):
                return (out[0] + add,) + out[1:]
            return out + add
        return hook

    handles = [model.model.layers[i].register_forward_hook(adder(v)) for i, v in directions.items()]
    try:
        out, past, feed, first = [], None, list(ids), None
        with torch.no_grad():
            for _ in range(n):
                res = model(torch.tensor([feed]), past_key_values=past, use_cache=True)
                first = res.logits[0].numpy() if first is None else first
                past, feed = res.past_key_values, [int(res.logits[0, -1].argmax())]
                out.append(feed[0])
    finally:
        for h in handles:
            h.remove()
    return out, first


def test_steering_hook_matches_transformers_hooks(tiny, tmp_path):
    path, model = tiny
    dirs = unit_directions([0, 2])
    vec = SteeringVector(str(path), None, 64, "test", "manual", dirs)
    write_vector(vec, tmp_path / "v.json")
    expected, ref_prefill = hooked_greedy(model, PROMPT_IDS, dirs, 2.5, 10)
    plain, _ = hooked_greedy(model, PROMPT_IDS, {}, 0.0, 10)
    assert expected != plain  # the oracle's steering does change the continuation

    loaded = load_model(str(path))
    prefill = loaded.decoder.forward(PROMPT_IDS, layer_hook=steering_hook(read_vector(tmp_path / "v.json"), 2.5))
    assert rel_err(prefill, ref_prefill) < 1e-4

    r = ster("generate", "--model", str(path), "--prompt", PROMPT, "--max-new-tokens", "10", "--json",
             "--vector", str(tmp_path / "v.json"), "--strength", "2.5")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    stop = expected.index(2) + 1 if 2 in expected else 10  # id 2 is </s>
    assert doc["ids"] == expected[:stop]
    assert doc["vector"] == {"path": str(tmp_path / "v.json"), "strength": 2.5}


@pytest.mark.parametrize("change, words", [
    ({"directions": {1: list(np.eye(4)[0])}}, None),
    ({"directions": {"1": np.eye(4, dtype=np.float32)[0]}}, "layer '1' \\(a string\\) is not a layer number"),
    ({"directions": {1: np.array([np.nan, 1, 0, 0])}}, "layer 1 holds non-finite values"),
    ({"directions": {1: np.eye(4, dtype=complex)[0]}}, "layer 1 is not a list of real numbers"),
    ({"directions": {1: [1.0, 0.0, 0.0]}}, "layer 1 has 3 values, but hidden_size is 4"),
    ({"directions": {}}, "directions must be a non-empty object"),
    ({"trait": 5}, "trait must be a string, got 5"),
])
def test_steering_hook_checks_a_vector_built_in_memory(change, words):
    """steering_hook(vec, k) with a hand-built vector: directions as lists were a TypeError, a layer "1" a
    TypeError, a NaN direction was reported as "overflows float32", complex values printed a ComplexWarning.
    The vector is checked as read_vector checks a file, and refused with a SterError saying what is wrong."""
    fields = {"model": "m", "model_revision": None, "hidden_size": 4, "trait": "t", "method": "caa",
              "directions": {1: np.eye(4, dtype=np.float32)[0]}, **change}
    vec = SteeringVector(**fields)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # complex values: numpy's ComplexWarning
        if words is None:
            hook = steering_hook(vec, 2.0)
            assert hook.layers == (1,) and hook(1, np.zeros((1, 4), np.float32)).tolist() == [[2.0, 0, 0, 0]]
        else:
            with pytest.raises(SterError, match="^steering vector given to steering_hook: " + words):
                steering_hook(vec, 2.0)


def test_strength_zero_is_exactly_unsteered(tiny, tmp_path):
    path, _ = tiny
    loaded = load_model(str(path))
    vec = SteeringVector(str(path), None, 64, "test", "manual", unit_directions([0, 1, 2]))
    plain = loaded.decoder.forward(PROMPT_IDS)
    zero = loaded.decoder.forward(PROMPT_IDS, layer_hook=steering_hook(vec, 0.0))
    assert np.array_equal(plain, zero)


def test_strength_that_overflows_float32_is_refused(tiny):
    path, _ = tiny
    vec = SteeringVector(str(path), None, 64, "test", "manual", unit_directions([0, 1, 2]))
    with pytest.raises(SterError, match="overflows float32"):
        steering_hook(vec, 1e39)  # finite in Python, inf once times a unit direction in float32
    steering_hook(vec, 1e30)  # large but representable: accepted (the run may still overflow later)


def test_vector_caa_is_the_normalized_difference_of_means(tiny, tmp_path):
    import torch

    path, model = tiny
    pos, neg = ["w5 w6 w7", "w8 w9 w10 w11"], ["w50 w51", "w60 w61 w62", "w70"]
    (tmp_path / "pos.txt").write_text("\n".join(pos))
    (tmp_path / "neg.txt").write_text("\n".join(neg))
    for side in ("pos", "neg"):
        r = ster("capture", "--model", str(path), "--prompts", str(tmp_path / f"{side}.txt"), "--layers", "0,1",
                 "--position", "last", "--output", str(tmp_path / f"{side}.safetensors"))
        assert r.returncode == 0, r.stderr
    r = ster("vector", "caa", "--positive", str(tmp_path / "pos.safetensors"), "--negative",
             str(tmp_path / "neg.safetensors"), "--output", str(tmp_path / "v.json"), "--trait", "low ids")
    assert r.returncode == 0, r.stderr
    vec = read_vector(tmp_path / "v.json")
    assert vec.model == str(path) and vec.method == "caa" and vec.trait == "low ids"
    assert sorted(vec.directions) == [0, 1]

    def last_states(prompts, layer):
        rows = []
        for p in prompts:
            with torch.no_grad():
                hs = model(torch.tensor([[int(w[1:]) for w in p.split()]]), output_hidden_states=True).hidden_states
            rows.append(hs[layer + 1][0, -1].numpy().astype(np.float64))
        return np.mean(rows, axis=0)

    for layer in (0, 1):
        d = last_states(pos, layer) - last_states(neg, layer)
        assert rel_err(vec.directions[layer], d / np.linalg.norm(d)) < 1e-4
        assert vec.metadata["difference_norms"][str(layer)] == pytest.approx(np.linalg.norm(d), rel=1e-4)


def _artifact(tmp_path, name="v.json", **changes):
    doc = SteeringVector("m", None, 4, "t", "caa", {1: np.array([1, 0, 0, 0], np.float32)}).to_json()
    doc.update(changes)
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


@pytest.mark.parametrize("changes, words", [
    ({"schema_version": 2}, "schema_version 2"),
    ({"format": "other.tool"}, "format 'other.tool'"),
    ({"directions": {"1": [float("nan"), 0, 0, 0]}}, "non-finite"),
    ({"directions": {"1": [1, 0, 0]}}, "3 values, but hidden_size is 4"),
    ({"directions": {"1": [2, 0, 0, 0]}}, "unit vectors"),
    ({"directions": {"one": [1, 0, 0, 0]}}, "not a non-negative integer"),
    # int() accepts what str.isdigit() does not promise: "²" fails, 5,000 digits pass its limit; "00" and "0" would
    # name one layer, the last silently winning
    ({"directions": {"\u00b2": [1, 0, 0, 0]}}, "layer key '\u00b2' is not a non-negative integer"),
    ({"directions": {"\u0661": [1, 0, 0, 0]}}, "layer key '\u0661' is not a non-negative integer"),
    ({"directions": {"9" * 5000: [1, 0, 0, 0]}}, "layer key '9{50}'... is not a non-negative integer"),
    ({"directions": {"0": [1, 0, 0, 0], "00": [0, 1, 0, 0]}}, "layer key '00' is not .*no leading zero"),
    ({"directions": {"1": [10 ** 400, 0, 0, 0]}}, "layer 1 holds a number beyond float range"),
    # no model has such a layer; `vector export` wrote controlvector.layer_count 1e9 for it
    ({"directions": {"999999999": [1, 0, 0, 0]}}, "layer 999999999 is past any model ster runs \(at most 4096"),
    ({"directions": {"4096": [1, 0, 0, 0]}}, "layer 4096 is past any model"),
    ({"metadata": "abc"}, "metadata must be an object, got 'abc' \\(a string\\)"),
    ({"metadata": 5}, "metadata must be an object, got 5"),
    ({"metadata": [[1, 2, 3]]}, "metadata must be an object"),
    ({"model": {"a": 1}}, "model must be a string or null, got \\{'a': 1\\} \\(an object\\)"),
    ({"model_revision": [1]}, "model_revision must be a string or null"),
    ({"method": {"x": 1}}, "method must be a string"),
    ({"trait": 5}, "trait must be a string"),
    # a JSON "\ud800" escape: ster capture --vector recorded it and died in a UnicodeEncodeError writing its sidecar
    ({"trait": "\ud800calm"}, "trait holds the lone surrogate U\\+D800 at character 0"),
    ({"model": "m\udfff"}, "model holds the lone surrogate U\\+DFFF"),
])
def test_malformed_vectors_are_refused_naming_the_path(tmp_path, changes, words):
    p = _artifact(tmp_path, **changes)
    with pytest.raises(SterError, match=words) as e:
        read_vector(p)
    assert str(p) in str(e.value)


def test_malformed_vector_is_one_error_line_in_generate(tiny, tmp_path):
    path, _ = tiny
    for i, changes in enumerate(({"directions": {"\u00b2": [1, 0, 0, 0]}}, {"metadata": "abc"},
                                 {"model": {"a": 1}})):
        p = _artifact(tmp_path, f"v{i}.json", **changes)
        r = ster("generate", "--model", str(path), "--prompt", PROMPT, "--vector", str(p))
        assert r.returncode == 1 and r.stderr.startswith("error:") and "Traceback" not in r.stderr, r.stderr
        assert str(p) in r.stderr


def test_caa_refuses_non_finite_states_instead_of_calling_them_the_same_mean():
    from ster_py.capture import Capture

    rng = np.random.default_rng(0)
    meta = {"model": "m", "model_revision": None, "hidden_size": 4, "num_hidden_layers": 2, "layers": [0, 1],
            "position": "last", "prompts": [{"text": "a"}, {"text": "b"}]}
    pos = Capture(dict(meta), {i: rng.standard_normal((2, 4)).astype(np.float32) for i in (0, 1)})
    neg = Capture(dict(meta), {i: rng.standard_normal((2, 4)).astype(np.float32) for i in (0, 1)})
    for bad in (np.nan, np.inf):
        pos.states[1][1, 2] = bad
        with pytest.raises(SterError, match=r"positive capture p.safetensors: layers.1 row 1 \(prompt 1\) holds NaN"):
            caa(pos, neg, sources=("p.safetensors", "n.safetensors"))


def test_vector_for_another_model_width_or_layer_is_refused(tiny, tmp_path):
    path, _ = tiny
    loaded = load_model(str(path))
    # a Hub model's commit (a local path takes no --revision): the revision check compares with it
    loaded.resolved = dataclasses.replace(loaded.resolved, model_revision="r1")
    ok = SteeringVector(str(path), "r1", 64, "t", "caa", unit_directions([1]))
    check_vector_for(ok, loaded, "v.json")
    cases = [
        (SteeringVector("org/other-model", None, 64, "t", "caa", unit_directions([1])),
         "made for model 'org/other-model'"),
        (SteeringVector(str(path), "r2", 64, "t", "caa", unit_directions([1])), "revision r2"),
        (SteeringVector(str(path), None, 32, "t", "caa", unit_directions([1], 32)), "32 wide.*hidden_size is 64"),
        (SteeringVector(str(path), None, 64, "t", "caa", unit_directions([5])), "names layer 5.*0..2"),
    ]
    for vec, words in cases:
        with pytest.raises(SterError, match=words) as e:
            check_vector_for(vec, loaded, "some/v.json")
        assert "some/v.json" in str(e.value)


def test_adapter_and_vector_flags_refuse_each_others_artifacts(tiny, tmp_path):
    path, _ = tiny
    side = tmp_path / "a.lora.json"
    side.write_text(json.dumps({"model": str(path), "rank": 2, "alpha": 4, "targets": ["q"], "layers": [0],
                                "hidden_size": 64}))
    with pytest.raises(SterError, match="LoRA adapter sidecar.*--adapter"):
        read_vector(side)
    vec = write_vector(SteeringVector(str(path), None, 64, "t", "caa", unit_directions([1])), tmp_path / "v.json")
    with pytest.raises(SterError, match="steering vector.*--vector"):
        load_adapter_for(vec, load_model(str(path)))
    # Through the CLI: one error line, no traceback, the path named.
    r = ster("generate", "--model", str(path), "--prompt", PROMPT, "--vector", str(side))
    assert r.returncode == 1 and r.stderr.startswith("error:") and "Traceback" not in r.stderr
    assert str(side) in r.stderr and "--adapter" in r.stderr
    r = ster("generate", "--model", str(path), "--prompt", PROMPT, "--adapter", str(vec))
    assert r.returncode == 1 and str(vec) in r.stderr and "--vector" in r.stderr


POSITIVE = ["I love my dog, he is the best puppy.", "Dogs are loyal and playful pets.",
            "My dog barks at the mailman every day.", "Let's take the dog for a walk in the park."]
NEGATIVE = ["I love my car, it is the best vehicle.", "Cars are fast and useful machines.",
            "My car makes noise every morning.", "Let's take the car for a drive in the city."]
NEUTRAL = "Write one sentence about your favorite thing."


@pytest.mark.real
def test_caa_steers_smollm2_toward_the_positive_prompts(smollm2_gguf, tmp_path):
    """Prompts to steered generation with the tool alone; then the direction, measured.

    Criterion: after the neutral prompt (chat template applied), the teacher-forced
    log-probability of "My favorite thing is my dog." minus that of "... my car." must
    grow by more than 1 nat under steering (measured: -0.2 -> +2.8 nats at strength 8;
    the greedy reply turns from cheese to "a gentle giant, a cat").
    """
    from ster_py.prompt import encode_prompt

    model = str(smollm2_gguf)
    for side, prompts in (("pos", POSITIVE), ("neg", NEGATIVE)):
        (tmp_path / f"{side}.txt").write_text("\n".join(prompts))
        r = ster("capture", "--model", model, "--prompts", str(tmp_path / f"{side}.txt"), "--layers", "6..10",
                 "--position", "mean", "--output", str(tmp_path / f"{side}.safetensors"))
        assert r.returncode == 0, r.stderr
    r = ster("vector", "caa", "--positive", str(tmp_path / "pos.safetensors"), "--negative",
             str(tmp_path / "neg.safetensors"), "--output", str(tmp_path / "dogs.json"), "--trait", "dogs")
    assert r.returncode == 0, r.stderr

    def run(*extra):
        res = ster("generate", "--model", model, "--prompt", NEUTRAL, "--max-new-tokens", "12", "--json", *extra)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)["ids"]

    plain = run()
    assert run("--vector", str(tmp_path / "dogs.json"), "--strength", "0") == plain
    steered = run("--vector", str(tmp_path / "dogs.json"), "--strength", "8")
    assert steered != plain

    loaded = load_model(model)
    prompt = encode_prompt(loaded.tokenizer, NEUTRAL).ids
    hook = steering_hook(read_vector(tmp_path / "dogs.json"), 8.0)

    def logprob(text, layer_hook):
        cont = loaded.tokenizer.encode(text, add_special_tokens=False)
        z = loaded.decoder.forward(prompt + cont, layer_hook=layer_hook).astype(np.float64)
        z = z - z.max(1, keepdims=True)
        z = z - np.log(np.exp(z).sum(1, keepdims=True))
        return sum(z[len(prompt) - 1 + k, t] for k, t in enumerate(cont))

    def margin(layer_hook):
        return logprob("My favorite thing is my dog.", layer_hook) - logprob("My favorite thing is my car.", layer_hook)

    assert margin(hook) - margin(None) > 1.0


@pytest.mark.real
def test_vector_made_on_a_preset_fits_the_same_file_by_path(smollm2_gguf):
    """A preset and its GGUF given by path are one model: matched by the file's SHA-256."""
    from ster_py.presets import PRESETS

    preset = "smollm2-135m-instruct-q4_1"
    loaded = load_model(str(smollm2_gguf))
    width = loaded.spec.hidden_size
    vec = SteeringVector(preset, "sha256:" + PRESETS[preset].sha256, width, "t", "caa",
                         unit_directions([1], width))
    check_vector_for(vec, loaded, "v.json")
    other = SteeringVector(preset, "sha256:" + "0" * 64, width, "t", "caa", unit_directions([1], width))
    with pytest.raises(SterError, match=f"made for model '{preset}'"):
        check_vector_for(other, loaded, "v.json")


def test_captures_record_local_models_by_absolute_path(tiny, tmp_path, monkeypatch):
    """A capture made with a relative --model still matches its model from another directory;
    outputs get the usual permissions (umask), not a temporary file's 0600."""
    import os

    path, _ = tiny
    monkeypatch.chdir(path.parent)
    out = tmp_path / "c.safetensors"
    r = ster("capture", "-m", path.name, "-p", "w5 w6", "--layers", "1", "-o", str(out))
    assert r.returncode == 0, r.stderr
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["model"] == str(path.resolve())
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~mask


def test_a_model_file_of_another_size_is_not_hashed(tmp_path, monkeypatch):
    """A vector naming a local file as its model is matched with a preset by SHA-256 only when the file has the
    loaded GGUF's size: one made for a 40 GB GGUF, tried with the default preset, was hashed whole first."""
    from ster_py import artifacts
    from ster_py.resolve import resolve

    loaded = tmp_path / "m.gguf"
    loaded.write_bytes(b"GGUF" + bytes(60))
    big = tmp_path / "big.gguf"
    with open(big, "wb") as f:
        f.truncate(1 << 30)   # sparse: 1 GiB that takes no disk
    resolved = dataclasses.replace(resolve(str(loaded)), model_revision="sha256:" + "0" * 64)   # as a preset's

    def no_hash(path):
        raise AssertionError(f"{path} was hashed")

    monkeypatch.setattr(artifacts, "_sha256_of", no_hash)
    assert not artifacts._same_gguf_content(str(big), None, resolved)


@pytest.mark.parametrize("method", ["caa", "pca"])
def test_vector_caa_shows_a_model_name_with_terminal_escapes_and_does_not_send_them(tiny, tmp_path, method):
    """The model name comes from the captures' sidecars: ESC sequences in it were written to the terminal raw
    (by caa once, and by pca until both printed their line through one function)."""
    path, _ = tiny
    (tmp_path / "pos.txt").write_text("w5 w6\n")
    (tmp_path / "neg.txt").write_text("w50 w51\n")
    for side in ("pos", "neg"):
        r = ster("capture", "--model", str(path), "--prompts", str(tmp_path / f"{side}.txt"), "--layers", "0",
                 "--output", str(tmp_path / f"{side}.safetensors"))
        assert r.returncode == 0, r.stderr
        sidecar = tmp_path / f"{side}.json"
        doc = json.loads(sidecar.read_text())
        sidecar.write_text(json.dumps({**doc, "model": "\x1b[31mRED\x1b]0;title\x07"}))
    r = ster("vector", method, "--positive", str(tmp_path / "pos.safetensors"), "--negative",
             str(tmp_path / "neg.safetensors"), "--output", str(tmp_path / "v.json"))
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stderr and "\\x1b[31mRED" in r.stderr


@pytest.mark.parametrize("method", ["caa", "pca"])
def test_a_trait_or_capture_name_utf8_cannot_encode_is_one_error_and_nothing_written(tiny, tmp_path, method):
    """--trait $'\\xff' (and a capture file named in bytes that are not UTF-8, recorded as the vector's source) reached
    write_vector as a lone surrogate: a UnicodeEncodeError traceback from inside the temporary file's write."""
    import os

    path, _ = tiny
    (tmp_path / "p.txt").write_text("w5 w6\nw7 w8\n")
    (tmp_path / "n.txt").write_text("w50 w51\nw52 w53\n")
    caps = {side: os.path.join(os.fsencode(tmp_path), b"%s\xff.safetensors" % side.encode()) for side in ("p", "n")}
    for side, cap in caps.items():
        r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", "capture", "--model",
                            str(path), "--prompts", str(tmp_path / f"{side}.txt"), "--layers", "0", "-o", cap],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
    out = tmp_path / "v.json"
    write_vector(SteeringVector(str(path), None, 64, "kept", "caa", unit_directions([1])), out)
    kept = out.read_bytes()
    for args in (["--trait", b"\xff"], []):
        r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", "vector", method,
                            "--positive", caps["p"], "--negative", caps["n"], "-o", str(out), *args],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith("error: the steering vector for") and "lone surrogate U+DCFF" in r.stderr, r.stderr
        assert out.read_bytes() == kept and sorted(p.name for p in tmp_path.iterdir() if "v.json" in p.name) == ["v.json"]
    with pytest.raises(SterError, match="lone surrogate U\\+DCFF"):
        write_vector(SteeringVector(str(path), None, 64, "\udcff", "caa", unit_directions([1])), tmp_path / "w.json")
    assert not (tmp_path / "w.json").exists()


def test_library_misuse_of_vectors_is_a_sterror_not_a_numpy_error(tiny, tmp_path):
    """Library calls the CLI never makes: a vector of another width reached Decoder.forward and failed in a
    numpy broadcast; a strength given as text was a TypeError; layers=1 for caa a TypeError; arrays for
    captures an AttributeError; write_vector wrote directions read_vector then refused (not unit)."""
    from ster_py.capture import capture

    path, _ = tiny
    loaded = load_model(str(path))
    wide = SteeringVector(str(path), None, 80, "test", "manual", {0: np.eye(80, dtype=np.float32)[0]})
    with pytest.raises(SterError, match="is 80 wide, but this model's hidden_size is 64"):   # before the prefill
        loaded.decoder.forward(PROMPT_IDS, layer_hook=steering_hook(wide, 1.0))
    with pytest.raises(SterError, match="80 wide and this model's residual stream 64"):   # the hook itself
        steering_hook(wide, 1.0)(0, np.zeros((1, 64), np.float32))
    vec = SteeringVector(str(path), None, 64, "test", "manual", unit_directions([0, 1]))
    with pytest.raises(SterError, match="finite number"):
        steering_hook(vec, "4")
    with pytest.raises(SterError, match="takes a SteeringVector"):
        steering_hook(vec.directions, 1.0)
    pos, neg = capture(loaded, ["w5 w6"], [0, 1]), capture(loaded, ["w50 w51"], [0, 1])
    with pytest.raises(SterError, match="layers must be a list"):
        caa(pos, neg, layers=1)
    assert sorted(caa(pos, neg, layers=np.array([1])).directions) == [1]
    with pytest.raises(SterError, match="not a Capture"):
        caa(pos.rows(0), neg.rows(0))
    long = SteeringVector(str(path), None, 64, "test", "manual", {0: np.full(64, 0.5, np.float32)})
    with pytest.raises(SterError, match="norm 4; directions must be unit"):
        write_vector(long, tmp_path / "v.json")
    assert not (tmp_path / "v.json").exists()
    write_vector(vec, tmp_path / "v.json")
    assert sorted(read_vector(tmp_path / "v.json").directions) == [0, 1]


@pytest.mark.parametrize("build", ["caa", "pca"])
def test_caa_and_pca_refuse_a_trait_or_sources_that_are_not_text(tiny, build):
    """caa(pos, neg, sources=5) was a TypeError, and caa(..., trait=5) built a vector write_vector then refused;
    pca likewise. Both are refused up front."""
    from ster_py import steering
    from ster_py.capture import capture

    path, _ = tiny
    loaded = load_model(str(path))
    pos, neg = capture(loaded, ["w5 w6"], [1]), capture(loaded, ["w50 w51"], [1])
    build = getattr(steering, build)
    with pytest.raises(SterError, match="trait must be text .*got 5$"):
        build(pos, neg, trait=5)
    for sources in (5, ("p",), ("p", None), "pn"):
        with pytest.raises(SterError, match="sources must be a pair of texts"):
            build(pos, neg, sources=sources)
    assert build(pos, neg, trait="t", sources=["p", "n"]).metadata["negative"] == "n"


def test_write_vector_takes_a_json_name_only(tiny, tmp_path):
    """write_vector(v, "x.txt") wrote a steering vector under a name that is not .json; it is refused with the name
    to use, and nothing is written. read_vector reads what write_vector writes."""
    path, _ = tiny
    vec = SteeringVector(str(path), None, 64, "test", "manual", unit_directions([0]))
    for name, advice in (("x.txt", "x.json"), ("x", "x.json"), ("x.safetensors", "x.json")):
        with pytest.raises(SterError, match=f"a steering vector is a JSON file named NAME.json; name it {advice}$"):
            write_vector(vec, tmp_path / name)
    assert list(tmp_path.iterdir()) == []
    assert sorted(read_vector(write_vector(vec, tmp_path / "x.json")).directions) == [0]


@pytest.mark.parametrize("change, words", [
    ({"directions": {-1: np.eye(64, dtype=np.float32)[0]}}, "layer key '-1' is not a non-negative integer"),
    ({"directions": {}}, "directions must be a non-empty object"),
    ({"trait": 5}, "trait must be a string, got 5"),
    ({"method": None}, "method must be a string, got None"),
    ({"metadata": {"norm": float("nan")}}, "cannot be written as JSON: Out of range float"),
    ({"metadata": {"when": object()}}, "cannot be written as JSON: Object of type object"),
])
def test_write_vector_refuses_what_read_vector_refuses(tmp_path, change, words):
    """write_vector wrote files read_vector then refused (a layer -1, no directions, a trait that is not text),
    metadata with NaN as a JSON file only Python reads, and failed with json's TypeError on an object in its
    metadata: each is now a SterError, and nothing is written."""
    fields = {"model": "m", "model_revision": None, "hidden_size": 64, "trait": "t", "method": "caa",
              "directions": unit_directions([0]), **change}
    with pytest.raises(SterError, match=words):
        write_vector(SteeringVector(**fields), tmp_path / "v.json")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("vec, path, words", [
    (None, "v.json", "^write_vector takes a SteeringVector .*got NoneType$"),
    ({"0": [1.0]}, "v.json", "got dict$"),
    ("ok", None, "^write_vector takes the steering vector's output path .*got None$"),
])
def test_write_vector_given_no_vector_or_path_says_what_to_pass(tmp_path, vec, path, words):
    """write_vector(None, path) was an AttributeError and write_vector(vec, None) pathlib's TypeError."""
    vec = SteeringVector("m", None, 64, "t", "caa", unit_directions([0])) if vec == "ok" else vec
    with pytest.raises(SterError, match=words):
        write_vector(vec, path if path is None else tmp_path / path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value, shown", [(None, "None"), (5, "int 5")])
def test_read_vector_given_no_path_says_what_to_pass(value, shown):
    """read_vector(None) was a TypeError from pathlib."""
    with pytest.raises(SterError, match=f"^read_vector takes the path of a steering vector's .json file, a str or "
                                        f"pathlib.Path; got {shown}$"):
        read_vector(value)


def test_a_vector_for_a_gguf_file_fits_a_copy_of_it_at_another_path(tmp_path):
    """A vector made with ``-m smol.gguf`` was refused for a byte-identical copy at another path ("was made for
    model '/.../smol.gguf', but this run loads 'sub/copy.gguf'"). A capture of a local GGUF file records its
    SHA-256 as model_revision, and a vector whose revision is that hash fits the file wherever it lies, the
    original gone too; one naming a file, without a hash, fits a copy of that file. A file of other bytes and a
    copied checkpoint directory (no content identity) are still refused."""
    import shutil

    from export_helpers import tiny_bpe_checkpoint
    from ster_py.capture import capture
    from ster_py.convert import convert_model

    path = tmp_path / "bpe"   # ster writes a GGUF vocabulary from a BPE tokenizer, not the word-level one
    tiny_bpe_checkpoint(path, "llama", dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                            num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                            max_position_embeddings=64))
    original, other = tmp_path / "smol.gguf", tmp_path / "other.gguf"
    convert_model(str(path), original, "f16")
    convert_model(str(path), other, "q8_0")
    (tmp_path / "sub").mkdir()
    copy = tmp_path / "sub" / "copy.gguf"
    shutil.copyfile(original, copy)
    made = load_model(str(original))
    vec = caa(capture(made, ["w5 w6 w7"], [0, 1]), capture(made, ["w50 w51"], [0, 1]))
    assert vec.model == str(original) and vec.model_revision.startswith("sha256:")
    write_vector(vec, tmp_path / "v.json")
    unhashed = SteeringVector(str(original), None, 64, "t", "caa", unit_directions([1]))
    check_vector_for(unhashed, load_model(str(copy)), "old.json")
    with pytest.raises(SterError, match=f"was made for model '{original}', but this run loads '{other}'"):
        check_vector_for(unhashed, load_model(str(other)), "old.json")
    original.unlink()
    r = ster("generate", "-m", str(copy), "--vector", str(tmp_path / "v.json"), "--strength", "2", "-p", PROMPT,
             "--max-new-tokens", "2", "-q")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    r = ster("generate", "-m", str(other), "--vector", str(tmp_path / "v.json"), "-p", PROMPT, "--max-new-tokens", "2")
    assert r.returncode == 1 and f"was made for model '{original}', but this run loads '{other}'" in r.stderr, r.stderr
    shutil.copytree(path, tmp_path / "dir-copy")
    with pytest.raises(SterError, match="was made for model"):
        check_vector_for(SteeringVector(str(path), None, 64, "t", "caa", unit_directions([1])),
                         load_model(str(tmp_path / "dir-copy")), "v.json")


def test_a_vector_layer_past_the_model_is_refused_where_the_hook_meets_it(tiny):
    """``steering_hook(vector, strength)`` skipped the vector's layers the model does not have (layer 5 on a
    3-layer model): the hook is never called there, so the steering silently did nothing. The library's
    generate, Session.reply, capture (a layer_hook) and Decoder.forward refuse such a hook before any work,
    and one of another width; a vector that fits still steers."""
    from ster_py import Session
    from ster_py.capture import capture
    from ster_py.generate import Sampling, generate

    path, _ = tiny
    loaded = load_model(str(path))
    past = steering_hook(SteeringVector(str(path), None, 64, "t", "caa", unit_directions([1, 5])), 4.0)
    wide = steering_hook(SteeringVector(str(path), None, 32, "t", "caa", unit_directions([1], 32)), 4.0)
    assert past.layers == (1, 5) and past.width == 64
    calls = {
        "generate": lambda hook: generate(loaded.decoder, PROMPT_IDS, Sampling(max_new_tokens=2), layer_hook=hook),
        "Session.reply": lambda hook: Session(loaded).reply([{"role": "user", "content": PROMPT}],
                                                            Sampling(max_new_tokens=2), layer_hook=hook),
        "Decoder.forward": lambda hook: loaded.decoder.forward(PROMPT_IDS, layer_hook=hook),
        "capture": lambda hook: capture(loaded, [PROMPT], [0], chat_template="off", layer_hook=hook),
    }
    for name, call in calls.items():
        with pytest.raises(SterError, match=r"the steering vector \(.*'s layer_hook\) names layer 5, but this model "
                                            r"has layers 0\.\.2; use a vector made for this model"):
            call(past)
        with pytest.raises(SterError, match=r"is 32 wide, but this model's hidden_size is 64"):
            call(wide)
    fits = steering_hook(SteeringVector(str(path), None, 64, "t", "caa", unit_directions([1])), 4.0)
    steered = generate(loaded.decoder, PROMPT_IDS, Sampling(max_new_tokens=4), layer_hook=fits).ids
    assert steered and len(steered) <= 4


def test_vector_caa_json_is_what_it_wrote(tiny, tmp_path):
    """``ster vector caa --json``: one document on stdout (no summary line on stderr) naming the file written and
    what the vector file holds but its directions (the layers they cover instead); an error under --json is the
    usual one line on stderr, nothing on stdout, nothing written."""
    from ster_py import __version__

    path, _ = tiny
    (tmp_path / "pos.txt").write_text("w5 w6 w7\nw8 w9\n")
    (tmp_path / "neg.txt").write_text("w50 w51\nw60 w61 w62\n")
    for side in ("pos", "neg"):
        r = ster("capture", "--model", str(path), "--prompts", str(tmp_path / f"{side}.txt"), "--layers", "0..2",
                 "--output", str(tmp_path / f"{side}.safetensors"), "-q")
        assert r.returncode == 0, r.stderr
    captures = ["--positive", str(tmp_path / "pos.safetensors"), "--negative", str(tmp_path / "neg.safetensors")]
    out = tmp_path / "v.json"
    r = ster("vector", "caa", *captures, "--output", str(out), "--trait", "low ids", "--layers", "1,2", "--json")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    doc, written = json.loads(r.stdout), json.loads(out.read_text())
    assert doc == {"ster_version": __version__, "output": str(out), "model": written["model"],
                   "model_revision": written["model_revision"], "hidden_size": written["hidden_size"],
                   "method": "caa", "trait": "low ids", "layers": [1, 2], "metadata": written["metadata"]}
    assert sorted(written["directions"]) == ["1", "2"] and doc["model"] == str(path)
    assert sorted(doc["metadata"]["difference_norms"]) == ["1", "2"] and doc["metadata"]["positive_prompts"] == 2

    r = ster("vector", "caa", *captures, "--output", str(tmp_path / "w.json"), "--layers", "7", "--json")
    assert r.returncode == 1 and r.stdout == "" and r.stderr.startswith("error:"), (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "w.json").exists()
