"""``ster vector pca`` and ``ster vector export`` (llama.cpp's control-vector GGUF).

- PCA: the direction is the principal eigenvector of DᵀD (numpy's eigh, independently of the SVD the code
  uses) for the pair differences D, signed so that most pairs project positive.
- Export: gguf-py reads the file as llama.cpp's format: ``general.architecture`` controlvector,
  ``controlvector.model_hint``, ``controlvector.layer_count`` (int32), F32 ``direction.N`` = strength x
  direction for N >= 1 (llama.cpp never steers layer 0).
- Effect: llama.cpp loading the file (through the child, as ``common_control_vector_load`` reads it) continues
  a prompt exactly as ``ster generate --vector --strength`` does on the same F32 model, and differently from the
  unsteered model.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ster_py.capture import Capture
from ster_py.errors import SterError
from ster_py.steering import SteeringVector, caa, export_control_vector, pca, write_vector


def ster(*args):
    return subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=600)


def _captures(rng, n_pairs=6, hidden=16, layers=(0, 1, 2), position="last"):
    direction = rng.standard_normal(hidden)
    base = {"model": "m", "model_revision": None, "hidden_size": hidden, "position": position,
            "model_type": "llama", "num_hidden_layers": 4, "layers": list(layers), "chat_template": "off",
            "precision": "f32"}
    neg = {i: rng.standard_normal((n_pairs, hidden)).astype(np.float32) for i in layers}
    pos = {i: (neg[i] + (1 + i) * direction + 0.3 * rng.standard_normal((n_pairs, hidden))).astype(np.float32)
           for i in layers}
    prompts = [{"text": f"p{j}", "token_ids": [j]} for j in range(n_pairs)]
    return (Capture(dict(base, prompts=prompts), pos), Capture(dict(base, prompts=prompts), neg))


def test_pca_is_the_principal_axis_of_the_differences_signed_positive():
    rng = np.random.default_rng(0)
    p, n = _captures(rng)
    vec = pca(p, n, trait="t")
    assert vec.method == "pca" and sorted(vec.directions) == [0, 1, 2]
    for i in (0, 1, 2):
        d = p.rows(i).astype(np.float64) - n.rows(i)
        w, v = np.linalg.eigh(d.T @ d)
        top = v[:, -1]
        got = vec.directions[i].astype(np.float64)
        assert abs(abs(got @ top) - 1) < 1e-5 and abs(np.linalg.norm(got) - 1) < 1e-6
        assert ((d @ got) > 0).sum() > len(d) / 2
        assert vec.metadata["explained"][str(i)] == pytest.approx(w[-1] / w.sum(), rel=1e-6)
    flipped = pca(n, p)  # the sides swapped: the same axis, the other sign
    assert all(np.allclose(flipped.directions[i], -vec.directions[i], atol=1e-6) for i in (0, 1, 2))


@pytest.mark.parametrize("change, match", [
    (lambda p, n: n.meta.update(prompts=n.meta["prompts"][:-1]), "paired prompts"),
    (lambda p, n: (p.meta.update(position="all"), n.meta.update(position="all")), "--position last or mean"),
    (lambda p, n: n.meta.update(model="other"), "disagree on model"),
])
def test_pca_refusals(change, match):
    p, n = _captures(np.random.default_rng(1))
    change(p, n)
    with pytest.raises(SterError, match=match):
        pca(p, n)


@pytest.mark.parametrize("build", [pca, caa])
def test_captures_encoded_with_and_without_the_chat_template_are_refused(build):
    """caa and pca refused captures of different position rules but built a vector from one capture made
    through the chat template and one of raw text (--chat-template off): the states then differ by the
    template (at position last, another token), and on SmolLM2 such a direction was nearly orthogonal (cosine
    0.01 to 0.2) to the one from the same prompts encoded alike. Raw text either way ("off", or "absent": the
    model has no template) is the same encoding."""
    p, n = _captures(np.random.default_rng(6))
    p.meta["chat_template"] = "applied"
    with pytest.raises(SterError, match=r"^the captures encode their prompts differently \(positive through the "
                                        r"chat template, negative as raw text \(chat template off\)\): the "
                                        r"difference would be the template's, not the trait's; capture both sides "
                                        r"with the same --chat-template$"):
        build(p, n)
    n.meta["chat_template"] = "applied"
    assert build(p, n).metadata["chat_template"] == ["applied", "applied"]
    p.meta["chat_template"], n.meta["chat_template"] = "absent", "off"
    assert sorted(build(p, n).directions) == [0, 1, 2]


def test_pca_refuses_a_nan_row_instead_of_dropping_the_pair():
    p, n = _captures(np.random.default_rng(4))
    p.states[2][3, 5] = np.nan  # was dropped with the all-zero rows: a vector from one pair fewer
    with pytest.raises(SterError, match=r"positive capture: layers.2 row 3 \(prompt 3\) holds NaN or infinity"):
        pca(p, n)


def test_pca_refuses_an_infinity_instead_of_hanging():
    """numpy's SVD never returns on an infinity: run in a child, so that a regression fails instead of hanging."""
    code = (f"import numpy as np, sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            "from test_vector_export import _captures\n"
            "from ster_py.errors import SterError; from ster_py.steering import pca\n"
            "p, n = _captures(np.random.default_rng(5)); n.states[0][1, 2] = -np.inf\n"
            "try:\n    pca(p, n)\nexcept SterError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "negative capture: layers.0 row 1 (prompt 1) holds NaN or infinity" in r.stdout


def _vector(hidden=16, layers=(0, 3, 5), seed=2, model_type="llama"):
    rng = np.random.default_rng(seed)
    dirs = {}
    for i in layers:
        v = rng.standard_normal(hidden)
        dirs[i] = (v / np.linalg.norm(v)).astype(np.float32)
    return SteeringVector("m", None, hidden, "t", "caa", dirs, {"model_type": model_type})


def test_export_is_llamacpps_control_vector_format(tmp_path):
    from gguf import GGUFReader

    vec = _vector()
    write_vector(vec, tmp_path / "v.json")
    r = ster("vector", "export", str(tmp_path / "v.json"), "--output", str(tmp_path / "v.gguf"), "--strength", "2.5",
             "--json")
    assert r.returncode == 0, r.stderr
    from ster_py import __version__

    assert json.loads(r.stdout)["layers"] == [3, 5] and "layer 0" in r.stderr
    assert json.loads(r.stdout)["ster_version"] == __version__
    g = GGUFReader(tmp_path / "v.gguf")
    f = {x.name: x for x in g.fields.values()}
    assert f["general.architecture"].contents() == "controlvector"
    assert f["controlvector.model_hint"].contents() == "llama"
    assert f["controlvector.layer_count"].contents() == 2 and f["controlvector.layer_count"].types[0].name == "INT32"
    assert {t.name for t in g.tensors} == {"direction.3", "direction.5"}
    for t in g.tensors:
        assert t.tensor_type.name == "F32" and list(t.shape) == [16]
        assert np.allclose(np.asarray(t.data), 2.5 * vec.directions[int(t.name.split(".")[1])])


def test_inspect_shows_a_control_vectors_model_hint_without_its_escape_sequences(tmp_path):
    # The hint comes from the vector's metadata (a file ster did not write): `ster inspect` printed its ESC raw,
    # so a crafted vector could clear or retitle the terminal of whoever inspects the exported GGUF.
    write_vector(_vector(model_type="llama\x1b[2J\x1b]0;pwned\x07"), tmp_path / "v.json")
    out = tmp_path / "v.gguf"
    assert ster("vector", "export", str(tmp_path / "v.json"), "--output", str(out), "-q").returncode == 0
    r = ster("inspect", str(out))
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout
    assert "llama\\x1b[2J\\x1b]0;pwned\\x07" in r.stdout
    assert json.loads(ster("inspect", str(out), "--json").stdout)["model_hint"] == "llama\x1b[2J\x1b]0;pwned\x07"


def test_a_control_vector_whose_tensor_names_hold_other_digits_is_described_not_a_traceback(tmp_path):
    """A control-vector GGUF with a tensor 'direction.²' (str.isdigit() is true of it, int() refuses it) made
    `ster inspect` and `--model` end in a ValueError traceback; 'direction.٣' was counted as layer 3. Only ASCII
    digits name a layer now: both files are described as holding layer 1 alone."""
    import gguf

    for name, odd in (("sup", "direction.\u00b2"), ("arabic", "direction.\u0663")):
        path = tmp_path / f"{name}.gguf"
        w = gguf.GGUFWriter(str(path), "controlvector")
        w.add_string("controlvector.model_hint", "llama")
        w.add_uint32("controlvector.layer_count", 1)
        w.add_tensor(odd, np.ones(16, np.float32))
        w.add_tensor("direction.1", np.ones(16, np.float32))
        w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
        r = ster("inspect", str(path), "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["layers"] == [1], r.stderr
        r = ster("generate", "-m", str(path), "-p", "hi")
        assert r.returncode == 1 and r.stderr.startswith("error:") and "for 1 layer (1) of hidden size 16" in r.stderr, \
            r.stderr


def test_export_refuses_a_vector_of_layer_0_only(tmp_path):
    with pytest.raises(SterError, match="only layer 0"):
        export_control_vector(_vector(layers=(0,)), tmp_path / "v.gguf")
    with pytest.raises(SterError, match="finite"):
        export_control_vector(_vector(), tmp_path / "v.gguf", strength=float("nan"))
    assert not (tmp_path / "v.gguf").exists()


@pytest.mark.parametrize("vec, kwargs, words", [
    (None, {}, "export_control_vector takes a SteeringVector .*got NoneType"),   # was an AttributeError
    ("v", {"strength": "2"}, "--strength must be a finite number, got '2'"),   # was a TypeError (math.isfinite)
    ("v", {"strength": None}, "--strength must be a finite number, got None"),
    ("v", {"model_hint": 5}, "--model-hint must be text .*got 5"),              # was written as a GGUF integer
    ("v", {"model_hint": "\udcff"}, "--model-hint holds the lone surrogate U\\+DCFF"),   # a UnicodeEncodeError
])
def test_export_refuses_arguments_it_cannot_write(tmp_path, vec, kwargs, words):
    with pytest.raises(SterError, match=words):
        export_control_vector(_vector() if vec == "v" else vec, tmp_path / "v.gguf", **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_cli_export_model_hint_utf8_cannot_encode_is_one_error_line(tmp_path):
    """--model-hint $'\\xff' (an argument in bytes that are not UTF-8) was a UnicodeEncodeError traceback."""
    v = write_vector(_vector(), tmp_path / "v.json")
    r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", "vector", "export", str(v),
                        "--output", str(tmp_path / "v.gguf"), "--model-hint", b"\xff"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and r.stderr.startswith("error: --model-hint holds the lone surrogate U+DCFF"), r.stderr
    assert not (tmp_path / "v.gguf").exists()
    # the hint read from a vector file's metadata: a "\ud800" escape was the same traceback, a number a GGUF integer
    with pytest.raises(SterError, match="metadata model_type .* holds the lone surrogate U\\+D800"):
        export_control_vector(_vector(model_type="\ud800"), tmp_path / "v.gguf")
    assert not (tmp_path / "v.gguf").exists()
    assert export_control_vector(_vector(model_type=5), tmp_path / "v.gguf")["model_hint"] == ""


def test_cli_export_refuses_a_malformed_vector_in_one_line(tmp_path):
    doc = _vector().to_json()
    cases = {"superscript": {"directions": {"\u00b2": doc["directions"]["3"]}}, "metadata": {"metadata": "abc"},
             "leading_zero": {"directions": {"3": doc["directions"]["3"], "03": doc["directions"]["5"]}},
             "huge": {"directions": {"3": [10 ** 400] + doc["directions"]["3"][1:]}}}
    for name, changes in cases.items():
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps({**doc, **changes}))
        out = tmp_path / f"{name}.gguf"
        r = ster("vector", "export", str(p), "--output", str(out))
        assert r.returncode == 1 and r.stderr.startswith("error:") and "Traceback" not in r.stderr, r.stderr
        assert str(p) in " ".join(r.stderr.split()) and not out.exists()


def test_cli_pca_checks_its_output_before_reading_the_captures(tmp_path):
    notes = tmp_path / "notes.json"
    notes.write_text('{"todo": 1}')
    r = ster("vector", "pca", "--positive", str(tmp_path / "none.safetensors"), "--negative",
             str(tmp_path / "none.safetensors"), "--output", str(notes))
    assert r.returncode == 1 and "exists and is not a steering vector" in r.stderr, r.stderr
    assert notes.read_text() == '{"todo": 1}'


def test_cli_pca_from_captures(tmp_path):
    from ster_py.capture import save_capture
    from ster_py.steering import read_vector

    p, n = _captures(np.random.default_rng(3))
    for cap, name in ((p, "pos"), (n, "neg")):
        cap.meta.update(format="ster.capture", schema_version=1, layer_numbering="", model_type="llama")
        save_capture(cap, tmp_path / f"{name}.safetensors")
    r = ster("vector", "pca", "--positive", str(tmp_path / "pos.safetensors"), "--negative",
             str(tmp_path / "neg.safetensors"), "--output", str(tmp_path / "v.json"), "--layers", "1..2", "-q")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    vec = read_vector(tmp_path / "v.json")
    assert vec.method == "pca" and sorted(vec.directions) == [1, 2]
    assert np.allclose(vec.directions[1], pca(p, n, layers=[1]).directions[1])


def test_cli_pca_and_export_json_are_what_they_wrote(tmp_path):
    """``ster vector pca --json`` and ``vector export --json``: one document on stdout (no summary line on stderr),
    its fields what the file written holds (pca: the vector file but its directions; export: the GGUF's layers,
    strength and model_hint); an error under --json is one line on stderr, nothing on stdout, nothing written."""
    from gguf import GGUFReader

    from ster_py import __version__
    from ster_py.capture import save_capture

    p, n = _captures(np.random.default_rng(3))
    for cap, name in ((p, "pos"), (n, "neg")):
        cap.meta.update(format="ster.capture", schema_version=1, layer_numbering="", model_type="llama")
        save_capture(cap, tmp_path / f"{name}.safetensors")
    captures = ["--positive", str(tmp_path / "pos.safetensors"), "--negative", str(tmp_path / "neg.safetensors")]
    out = tmp_path / "v.json"
    r = ster("vector", "pca", *captures, "--output", str(out), "--trait", "t", "--json")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    doc, written = json.loads(r.stdout), json.loads(out.read_text())
    assert doc == {"ster_version": __version__, "output": str(out), "model": "m", "model_revision": None,
                   "hidden_size": 16, "method": "pca", "trait": "t", "layers": [0, 1, 2],
                   "metadata": written["metadata"]}
    assert doc["metadata"]["pairs"] == 6 and sorted(doc["metadata"]["explained"]) == ["0", "1", "2"]

    gguf = tmp_path / "v.gguf"
    r = ster("vector", "export", str(out), "--output", str(gguf), "--strength", "2", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    fields = {x.name: x.contents() for x in GGUFReader(gguf).fields.values() if x.name.startswith("controlvector")}
    tensors = sorted(int(t.name.split(".")[1]) for t in GGUFReader(gguf).tensors)
    assert doc == {"ster_version": __version__, "output": str(gguf), "layers": tensors, "skipped": [0],
                   "strength": 2.0, "model_hint": fields["controlvector.model_hint"]}
    assert tensors == [1, 2] and fields["controlvector.layer_count"] == 2
    assert [line for line in r.stderr.splitlines() if line] == [
        "warning: layer 0 of the vector is left out: llama.cpp's control vectors cannot steer it"], r.stderr

    for args in (["vector", "pca", "--positive", str(tmp_path / "pos.safetensors"), "--negative",
                  str(tmp_path / "missing.safetensors"), "--output", str(tmp_path / "w.json")],
                 ["vector", "export", str(tmp_path / "pos.json"), "--output", str(tmp_path / "w.gguf")]):
        r = ster(*args, "--json")
        assert r.returncode == 1 and r.stdout == "" and r.stderr.startswith("error:"), (args, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr
    assert not (tmp_path / "w.json").exists() and not (tmp_path / "w.gguf").exists()


def test_llamacpp_steers_like_ster(tmp_path):
    """Same F32 file, same vector: llama.cpp's 16 greedy tokens under the control vector equal ster's under
    --vector, which differ from the unsteered ones."""
    from export_helpers import tiny_bpe_checkpoint

    from ster_py import llamacpp
    from ster_py.convert import convert_model
    from ster_py.generate import Sampling, generate
    from ster_py.load import load_model
    from ster_py.steering import steering_hook

    cfg = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, max_position_embeddings=64)
    tiny_bpe_checkpoint(tmp_path / "m", "llama", cfg)
    path = convert_model(str(tmp_path / "m"), tmp_path / "m.gguf", "f32")["output"]
    model = load_model(path)
    ids = model.tokenizer.encode("The quick brown fox")
    vec = _vector(hidden=64, layers=(1, 2, 3), seed=5)
    export_control_vector(vec, tmp_path / "v.gguf", strength=6.0)
    plain = generate(model.decoder, ids, Sampling(max_new_tokens=16)).ids
    steered = generate(model.decoder, ids, Sampling(max_new_tokens=16), layer_hook=steering_hook(vec, 6.0)).ids
    assert steered != plain
    assert llamacpp.greedy(path, ids, 16, control_vector=tmp_path / "v.gguf") == steered
