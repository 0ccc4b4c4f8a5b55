"""``ster capture`` against transformers' hidden states on tiny checkpoints.

Oracle: transformers' ``output_hidden_states`` (entry i + 1 is the residual after
decoder layer i, except the last entry, which has the final norm applied) and,
for the last layer, a forward hook on transformers' last decoder layer, which
sees the residual before the final norm. Files are read back with the
safetensors library, not with our reader.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from safetensors import safe_open

from ster_py.capture import capture, load_capture, parse_layers, save_capture
from ster_py.errors import SterError
from ster_py.load import load_model
from tiny import make_checkpoint, rel_err

PROMPTS = ["w5 w9 w17 w33 w65 w3", "w100 w7 w8", "w11 w12 w13 w14 w15 w16 w17 w18"]
TEMPLATE = ("{% for m in messages %}<s> w{{ 10 + loop.index }} {{ m['content'] }} </s> {% endfor %}"
            "{% if add_generation_prompt %}w99 {% endif %}")


def ster(*args):
    return subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=300)


def oracle_states(model, ids) -> list[np.ndarray]:
    """transformers' residual stream after each decoder layer, float32 [T, hidden] per layer."""
    import torch

    layers = model.model.layers
    last = {}
    handle = layers[-1].register_forward_hook(
        lambda mod, args, out: last.__setitem__("h", (out[0] if isinstance(out, tuple) else out)[0].numpy()))
    with torch.no_grad():
        hs = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    handle.remove()
    return [h[0].numpy() for h in hs[1:-1]] + [last["h"]]


@pytest.fixture(scope="module", params=["llama", "gemma3_text"])
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    extra = {"sliding_window": 4, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]} \
        if request.param == "gemma3_text" else {}
    model = make_checkpoint(path, request.param, **extra)
    ids = [[int(w[1:]) for w in p.split()] for p in PROMPTS]
    return path, model, ids


def test_cli_capture_all_positions_equals_transformers(tiny, tmp_path):
    path, model, ids = tiny
    (tmp_path / "prompts.txt").write_text("\n".join(PROMPTS) + "\n\n")
    out = tmp_path / "acts.safetensors"
    r = ster("capture", "--model", str(path), "--prompts", str(tmp_path / "prompts.txt"), "--layers", "all",
             "--position", "all", "--output", str(out))
    assert r.returncode == 0, r.stderr
    meta = json.loads((tmp_path / "acts.json").read_text())
    assert meta["model"] == str(path) and meta["model_revision"] is None and meta["precision"] == "f32"
    assert meta["layers"] == [0, 1, 2] and meta["position"] == "all" and meta["chat_template"] == "absent"
    assert [p["token_ids"] for p in meta["prompts"]] == ids
    with safe_open(str(out), framework="numpy") as f:
        assert json.loads(f.metadata()["ster"]) == meta
        for p, prompt_ids in enumerate(ids):
            expected = oracle_states(model, prompt_ids)
            for layer in range(3):
                got = f.get_tensor(f"layers.{layer}.prompt.{p}")
                assert got.dtype == np.float32 and got.shape == expected[layer].shape
                assert rel_err(got, expected[layer]) < 1e-4


def test_layer_numbering_matches_hidden_states_index(tiny):
    """Layer i is transformers' hidden_states[i + 1] (checked directly for the layers before the last)."""
    import torch

    path, model, ids = tiny
    cap = capture(load_model(str(path)), [PROMPTS[0]], [0, 1], "all")
    with torch.no_grad():
        hs = model(torch.tensor([ids[0]]), output_hidden_states=True).hidden_states
    for i in (0, 1):
        assert rel_err(cap.states[i][0], hs[i + 1][0].numpy()) < 1e-4


@pytest.mark.parametrize("position", ["last", "mean"])
def test_last_and_mean_positions(tiny, tmp_path, position):
    path, model, ids = tiny
    loaded = load_model(str(path))
    cap = capture(loaded, PROMPTS, parse_layers("1..2", 3), position)
    save_capture(cap, tmp_path / "c.safetensors")
    back = load_capture(tmp_path / "c.safetensors")
    assert back.layers == [1, 2] and back.meta["position"] == position
    for layer in (1, 2):
        rows = back.rows(layer)
        assert rows.shape == (len(PROMPTS), 64)
        for p, prompt_ids in enumerate(ids):
            h = oracle_states(model, prompt_ids)[layer]
            expected = h[-1] if position == "last" else h.astype(np.float64).mean(0)
            assert rel_err(rows[p], expected) < 1e-4


def test_chat_template_applied_matches_transformers_ids(tmp_path):
    from transformers import AutoTokenizer

    make_checkpoint(tmp_path, "llama")
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = TEMPLATE
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    loaded = load_model(str(tmp_path))
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    expected = list(tok.apply_chat_template([{"role": "user", "content": PROMPTS[1]}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False))
    applied = capture(loaded, [PROMPTS[1]], [0], chat_template="auto")
    assert applied.meta["chat_template"] == "applied" and applied.meta["prompts"][0]["token_ids"] == expected
    off = capture(loaded, [PROMPTS[1]], [0], chat_template="off")
    assert off.meta["chat_template"] == "off" and off.meta["prompts"][0]["token_ids"] == [100, 7, 8]


def test_a_template_that_renders_nothing_is_named_not_the_prompt(tiny, tmp_path):
    """A chat template that renders a conversation as no text made capture say "give a non-empty prompt" to a
    user whose prompt had text; the error now names the template and the way around it."""
    import shutil

    shutil.copytree(tiny[0], tmp_path / "m")
    (tmp_path / "m" / "chat_template.jinja").write_text("{% if false %}x{% endif %}")
    loaded = load_model(str(tmp_path / "m"))
    with pytest.raises(SterError, match="chat template rendered it as no text; fix the template, or capture the raw "
                                        "text with --chat-template off"):
        capture(loaded, [PROMPTS[0]], [0])
    assert capture(loaded, [PROMPTS[0]], [0], chat_template="off").meta["chat_template"] == "off"


@pytest.mark.parametrize("text, expected", [("all", [0, 1, 2]), ("1", [1]), ("0..1", [0, 1]), ("2,0", [0, 2])])
def test_parse_layers(text, expected):
    assert parse_layers(text, 3) == expected


@pytest.mark.parametrize("text, words", [("3", "layers 0..2"), ("2..1", "empty"), ("x", "not understood"),
                                         ("-1", "does not exist"), ("1,,2", "'1,,2': item 2 is empty"),
                                         ("0,1,", "item 3 is empty"), (",", "item 1 is empty")])
def test_parse_layers_refusals(text, words):  # "1,,2" selected layers 1 and 2, the empty item skipped in silence
    with pytest.raises(SterError, match=words):
        parse_layers(text, 3)


@pytest.mark.parametrize("text", ["1_0", "+1", "\u0661", "0..\u0661", "0,\uff11", "1..1_0"])
def test_parse_layers_reads_ascii_digits_only(text):
    """int() took "1_0" as layer 10, "+1" and other scripts' digits ("\u0661", Arabic-Indic one) as numbers:
    --layers 1_0 captured layer 10 in silence. As detokenize's ids, a layer number is ASCII digits."""
    with pytest.raises(SterError, match="is not understood"):
        parse_layers(text, 12)


def test_capture_layers_with_an_empty_item_is_one_error_line(tiny, tmp_path):
    r = ster("capture", "-m", str(tiny[0]), "-p", "w5", "--layers", "1,,2", "-o", str(tmp_path / "c.safetensors"))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip() == ("error: --layers '1,,2': item 2 is empty; separate layer numbers by one comma, as in "
                                "1,2,3"), r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("prompts, layers, words", [
    ([PROMPTS[0]], [1, 1], "layer 1 is given twice"),  # was two rows for one prompt, then save_capture failed
    ([PROMPTS[0]], [], "no layer given"),               # was a capture load_capture refuses
    ([], [0], "no prompt given"),                       # was numpy's ValueError from np.stack
    (PROMPTS[0], [0], "not one string"),
    ([PROMPTS[0]], [True], "not a layer number"),
    ([PROMPTS[0]], ["0"], "not a layer number"),        # was a TypeError
    ([5], [0], "^the prompt must be text \\(a str\\), got int$"),           # was an AttributeError ('strip')
    ([PROMPTS[0], None], [0], "got NoneType$"),
    (5, [0], "^prompts must be a list of texts, got int$"),                 # was a TypeError
    ([PROMPTS[0]], None, "^layers must be a list of layer numbers such as \\[4, 8\\], got 'None'$"),  # TypeError
    ([PROMPTS[0]], 1, "^layers must be a list of layer numbers"),
])
def test_library_capture_refuses_what_a_capture_cannot_hold(tiny, prompts, layers, words):
    loaded = load_model(str(tiny[0]))
    with pytest.raises(SterError, match=words):
        capture(loaded, prompts, layers, chat_template="off")


def test_library_capture_of_no_model_or_a_system_prompt_not_text_says_so(tiny):
    """capture(None, ...) was an AttributeError ('spec'), a system prompt of another type a TypeError inside
    the template's check."""
    with pytest.raises(SterError, match="^capture takes a loaded model \\(load_model\\(...\\)\\), got NoneType$"):
        capture(None, [PROMPTS[0]], [0])
    with pytest.raises(SterError, match="^the system prompt must be text \\(a str\\), got int$"):
        capture(load_model(str(tiny[0])), [PROMPTS[0]], [0], system=5)


def test_library_capture_refuses_a_progress_that_is_not_a_function(tiny):
    """capture(..., progress=5) ran the first prompt, then was a TypeError ('int' object is not callable): it is
    refused before any work, as generate refuses its callbacks (check_callbacks)."""
    loaded = load_model(str(tiny[0]))
    with pytest.raises(SterError, match="^capture's progress must be a function or None, got int$"):
        capture(loaded, [PROMPTS[0]], [0], progress=5)
    seen = []
    capture(loaded, [PROMPTS[0]], [0], progress=lambda *a: seen.append(a))
    assert seen == [("capture", 1, 1)]


def test_prompts_file_that_is_not_text_is_one_error_line(tmp_path, monkeypatch):
    """A binary --prompts file was a UnicodeDecodeError traceback; /dev/zero (or a FIFO) was read without end
    until a MemoryError traceback. Each is now a SterError naming the file (capture and parity share the reader)."""
    import ster_py.capture as capture_mod
    from ster_py.capture import read_prompts

    (tmp_path / "binary.txt").write_bytes(b"w5 w6\n\xff\xfe\n")
    (tmp_path / "big.txt").write_text("w5\n" * 20)
    cases = [(tmp_path / "binary.txt", "is not UTF-8 text \\(invalid byte at offset 6\\)"),
             ("/dev/zero", "is not a regular file"), (tmp_path, "is a directory")]
    for path, words in cases:
        with pytest.raises(SterError, match=f"--prompts {path} {words}"):
            read_prompts(None, path)
    monkeypatch.setattr(capture_mod, "MAX_PROMPTS_FILE_BYTES", 50)
    with pytest.raises(SterError, match="is larger than"):
        read_prompts(None, tmp_path / "big.txt")
    r = ster("capture", "--prompts", str(tmp_path / "binary.txt"), "-o", str(tmp_path / "c.safetensors"))
    assert r.returncode == 1 and r.stderr.startswith("error: --prompts") and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "c.safetensors").exists()


def test_non_finite_states_are_refused_at_capture(tiny, tmp_path):
    """A NaN weight made capture save NaN states with status 0; vector caa then refused the file and said to capture
    again. The capture refuses them itself, naming the prompt and the layer, and writes nothing."""
    loaded = load_model(str(tiny[0]))
    layer = loaded.decoder.layers[1]
    # set on the block (not through monkeypatch: the model is this test's own, and the block hands ``o`` to its
    # mixer, whose attribute a newer pytest's undo tried to delete from the block)
    layer.o = lambda x, _o=layer.o: _o(x) * np.float32("nan")
    with pytest.raises(SterError, match="prompt 0: the residual stream after layer 1 holds NaN or infinity"):
        capture(loaded, [PROMPTS[0]], [0, 1, 2], chat_template="off")
    assert capture(loaded, [PROMPTS[0]], [0], chat_template="off").states[0].shape == (1, 64)  # before it: fine


def test_failed_write_leaves_no_file(tiny, tmp_path, monkeypatch):
    import ster_py.capture as capture_mod

    path, _, _ = tiny
    cap = capture(load_model(str(path)), PROMPTS, [0, 1], "last")

    def broken(p, specs, arrays, metadata=None):
        p.write_bytes(b"partial")
        raise SterError("disk full")

    monkeypatch.setattr(capture_mod, "write_safetensors", broken)
    (tmp_path / "out").mkdir()  # outputs never create their folder
    with pytest.raises(SterError, match="disk full"):
        save_capture(cap, tmp_path / "out" / "c.safetensors")
    assert list((tmp_path / "out").iterdir()) == []


def test_output_replaces_an_earlier_capture_but_no_other_file(tiny, tmp_path):
    path, _, _ = tiny
    cap = capture(load_model(str(path)), PROMPTS, [0, 1], "last")
    out = tmp_path / "c.safetensors"
    save_capture(cap, out)
    save_capture(cap, out)                      # an earlier capture: replaced
    assert load_capture(out).layers == [0, 1]
    chat = tmp_path / "chat.json"
    chat.write_text('{"messages": []}')
    with pytest.raises(SterError, match="not a capture sidecar"):
        save_capture(cap, tmp_path / "chat.safetensors")
    assert chat.read_text() == '{"messages": []}' and not (tmp_path / "chat.safetensors").exists()
    other = tmp_path / "weights.safetensors"
    other.write_bytes(b"not ours")
    with pytest.raises(SterError, match="is not a capture"):
        save_capture(cap, other)
    assert other.read_bytes() == b"not ours" and not (tmp_path / "weights.json").exists()
    # the CLI refuses before loading the model
    r = ster("capture", "--model", str(path), "--prompt", "w5 w6", "--output", str(tmp_path / "chat.safetensors"))
    assert r.returncode == 1 and "not a capture sidecar" in r.stderr and "Traceback" not in r.stderr


def test_help_states_the_layer_numbering():
    r = ster("capture", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split()).replace("│ ", "").replace(" │", "")
    for words in ("0-based", "hidden_states[i + 1]", "before the final norm"):
        assert words in text, text


def _saved_capture(tmp_path, position="last", name="c"):
    """A capture written by save_capture without a model: 3 prompts, layers 0 and 1, hidden size 8."""
    from ster_py.capture import Capture

    rng = np.random.default_rng(0)
    meta = {"format": "ster.capture", "schema_version": 1, "model": "m", "model_revision": None, "hidden_size": 8,
            "num_hidden_layers": 3, "layers": [0, 1], "position": position, "chat_template": "off",
            "precision": "f32", "prompts": [{"text": f"p{j}", "token_ids": list(range(j + 2))} for j in range(3)]}
    if position == "all":
        states = {i: [rng.standard_normal((j + 2, 8)).astype(np.float32) for j in range(3)] for i in (0, 1)}
    else:
        states = {i: rng.standard_normal((3, 8)).astype(np.float32) for i in (0, 1)}
    out = tmp_path / f"{name}.safetensors"
    save_capture(Capture(meta, states), out)
    return out


def test_library_save_and_load_refuse_what_is_no_capture_or_path(tmp_path):
    """save_capture(None, p) was an AttributeError ('meta'), load_capture(None) and load_capture(5) TypeErrors
    from Path; a Capture built in memory with a NaN state or a layer its meta does not list was written, and only
    load_capture refused it afterwards."""
    from ster_py.capture import Capture

    with pytest.raises(SterError, match="save_capture takes a Capture .*got NoneType"):
        save_capture(None, tmp_path / "c.safetensors")
    for bad in (None, 5):
        with pytest.raises(SterError, match="load_capture takes the path of a capture"):
            load_capture(bad)
    good = load_capture(_saved_capture(tmp_path))
    with pytest.raises(SterError, match="save_capture takes the capture's output path"):
        save_capture(good, None)
    nan = Capture(good.meta, {i: np.full_like(s, np.nan) for i, s in good.states.items()})
    with pytest.raises(SterError, match="the capture to save: layers.0 row 0 .*NaN"):
        save_capture(nan, tmp_path / "nan.safetensors")
    with pytest.raises(SterError, match="the capture to save holds no states for layer 1"):
        save_capture(Capture(good.meta, {0: good.states[0]}), tmp_path / "part.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json", "c.safetensors"]


def _edit_sidecar(path, change):
    side = path.with_suffix(".json")
    meta = json.loads(side.read_text())
    change(meta)
    side.write_text(json.dumps(meta))


def _edit_tensor(path, name, change):
    from safetensors.numpy import save_file

    with safe_open(str(path), framework="numpy") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    tensors[name] = change(tensors[name])
    save_file(tensors, str(path))


def _set(a, index, value):
    a = a.copy()
    a[index] = value
    return a


@pytest.mark.parametrize("change, words", [
    (lambda m: m.pop("position"), "capture sidecar .*c.json lacks the field 'position'"),
    (lambda m: m.pop("layers"), "capture sidecar .*c.json lacks the field 'layers'"),
    (lambda m: m.update(hidden_size="8"), "hidden_size must be a positive integer, got '8' \\(a string\\)"),
    (lambda m: m.update(num_hidden_layers="abc"), "num_hidden_layers must be a positive integer"),
    (lambda m: m.update(position="zzz"), "position must be one of last, mean, all, got 'zzz'"),
    (lambda m: m.update(layers=5), "layers must be a non-empty list"),
    (lambda m: m.update(layers=[0.5]), "layers holds 0.5 \\(a number\\), not a layer number 0..2"),
    (lambda m: m.update(layers=[0, 3]), "layers holds 3, not a layer number 0..2"),
    (lambda m: m.update(layers=[0, 0]), "layer 0 twice"),
    (lambda m: m.update(prompts=3), "prompts must be a non-empty list of objects"),
    (lambda m: m.update(model={"a": 1}), "model must be a string or null"),
    # read as unsteered: vector caa said "different steering (positive unsteered, negative unsteered)"
    (lambda m: m.update(steering="abc"), "steering must be an object .* or null \\(unsteered\\), got 'abc'"),
    (lambda m: m.update(steering=[1]), "steering must be an object"),
])
def test_malformed_sidecars_are_refused_naming_the_field(tmp_path, change, words):
    path = _saved_capture(tmp_path)
    _edit_sidecar(path, change)
    with pytest.raises(SterError, match=words) as e:
        load_capture(path)
    assert "ster capture" in str(e.value)


@pytest.mark.parametrize("position, name, change, words", [
    ("last", "layers.1", lambda a: a[0], r"layers.1 has shape \[8\], but a capture's layers.1 is \[prompts \(3\), "
                                          r"hidden_size 8\]"),
    ("last", "layers.1", lambda a: a[None], r"layers.1 has shape \[1, 3, 8\]"),
    ("last", "layers.1", lambda a: a[:2], r"layers.1 has shape \[2, 8\]"),
    ("last", "layers.1", lambda a: a[:, :7], r"layers.1 has shape \[3, 7\]"),
    ("last", "layers.1", lambda a: a.astype(np.int32), "layers.1 holds int32 values, not floats"),
    ("last", "layers.1", lambda a: _set(a, (2, 5), np.inf), r"layers.1 row 2 \(prompt 2\) holds NaN or infinity"),
    ("mean", "layers.0", lambda a: _set(a, (0, 0), np.nan), r"layers.0 row 0 \(prompt 0\) holds NaN or infinity"),
    ("last", "layers.0", lambda a: _set(a.astype(np.float64), (1, 1), 1e300),  # infinite as float32
     r"layers.0 row 1 \(prompt 1\) holds NaN or infinity"),
    ("all", "layers.1.prompt.2", lambda a: _set(a, (1, 3), -np.inf),
     r"layers.1.prompt.2 row 1 \(token 1 of prompt 2\) holds NaN or infinity"),
    ("all", "layers.0.prompt.1", lambda a: a[:, None], r"layers.0.prompt.1 has shape \[3, 1, 8\]"),
])
def test_malformed_or_non_finite_states_are_refused_naming_tensor_and_row(tmp_path, position, name, change, words):
    path = _saved_capture(tmp_path, position)
    _edit_tensor(path, name, change)
    with pytest.raises(SterError, match=words) as e:
        load_capture(path)
    assert str(path) in str(e.value)


def test_a_missing_capture_or_a_file_that_is_no_capture_is_named_as_given(tmp_path):
    """`ster vector caa --positive typo.safetensors` said "capture sidecar typo.json does not exist", and
    `--positive calm.txt` (the prompts, not their capture) "capture sidecar calm.txt.json does not exist": both
    named a file the user never gave. Now the path given is named, with what `ster capture` writes; a capture
    whose sidecar alone is gone is still told so."""
    neg = _saved_capture(tmp_path, name="neg")
    prompts = tmp_path / "calm.txt"
    prompts.write_text("Stay calm.\n")
    written = "`ster capture --output NAME.safetensors` writes NAME.safetensors and its sidecar NAME.json"
    for given, words in ((tmp_path / "typo.safetensors", f"capture {tmp_path / 'typo.safetensors'} does not exist"),
                         (tmp_path / "typo.json", f"capture {tmp_path / 'typo.json'} does not exist"),
                         (prompts, f"{prompts} is not a capture")):
        with pytest.raises(SterError) as e:
            load_capture(given)
        assert str(e.value) == f"{words}; {written}"
        r = ster("vector", "caa", "--positive", str(given), "--negative", str(neg), "--output", str(tmp_path / "v.json"))
        assert r.returncode == 1 and r.stderr.strip() == f"error: {words}; {written}", r.stderr
    assert not (tmp_path / "v.json").exists()
    (tmp_path / "neg.json").unlink()
    with pytest.raises(SterError, match="capture sidecar .*neg.json does not exist"):
        load_capture(neg)


def test_cli_vectors_refuse_an_output_not_named_json(tmp_path):
    """`ster vector caa --output v.txt` wrote the vector under that name; --output must be NAME.json (as .safetensors
    was already refused), before the captures are read, and nothing is written."""
    pos, neg = _saved_capture(tmp_path, name="pos"), _saved_capture(tmp_path, name="neg")
    for method, name in (("caa", "v.txt"), ("pca", "v")):
        r = ster("vector", method, "--positive", str(pos), "--negative", str(neg), "--output", str(tmp_path / name))
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip() == (f"error: --output {tmp_path / name}: a steering vector is a JSON file named "
                                    "NAME.json; name it v.json"), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["neg.json", "neg.safetensors", "pos.json",
                                                          "pos.safetensors"]


def test_cli_vectors_refuse_a_capture_holding_infinity(tmp_path):
    """vector pca hung in numpy's SVD on an infinity, and caa called it "the same mean": both now refuse the file
    when reading it, naming it, the tensor and the row, and write nothing."""
    pos, neg = _saved_capture(tmp_path, name="pos"), _saved_capture(tmp_path, name="neg")
    _edit_tensor(pos, "layers.1", lambda a: _set(a, (0, 0), np.inf))
    for method in ("caa", "pca"):
        out = tmp_path / f"{method}.json"
        r = ster("vector", method, "--positive", str(pos), "--negative", str(neg), "--output", str(out))
        assert r.returncode == 1 and r.stderr.startswith("error:") and "Traceback" not in r.stderr, r.stderr
        assert f"{pos}: layers.1 row 0 (prompt 0) holds NaN or infinity" in " ".join(r.stderr.split())
        assert not out.exists()


def test_steered_capture_equals_transformers_with_the_vector_hooked(tiny, tmp_path):
    """capture(vector=..., strength=...) and ``ster capture --vector --strength``: the residual stream of the
    steered model, against transformers with the same directions added by forward hooks on the same decoder
    layers' outputs (the last layer's included); the sidecar records the steering; CAA refuses a steered
    capture against an unsteered one; --strength alone and a vector of another width are refused before the
    model runs."""
    import torch

    from ster_py.steering import SteeringVector, caa, write_vector

    path, model, ids = tiny
    rng = np.random.default_rng(4)
    dirs = {0: rng.standard_normal(64), 2: rng.standard_normal(64)}
    dirs = {i: (d / np.linalg.norm(d)).astype(np.float32) for i, d in dirs.items()}
    vec = SteeringVector(str(path), None, 64, "t", "caa", dirs)
    write_vector(vec, tmp_path / "v.json")
    strength = 3.0

    def adder(d):
        def hook(mod, args, out):
            if isinstance(out, tuple):
                return (out[0] + torch.from_numpy(strength * d),) + tuple(out[1:])
            return out + torch.from_numpy(strength * d)
        return hook

    def keep(i, seen):   # registered after the adders: sees each layer's output as the next layer gets it
        return lambda mod, args, out: seen.__setitem__(i, (out[0] if isinstance(out, tuple) else out)[0].numpy())

    # (not output_hidden_states: transformers records those by hooks of its own, installed at the model's first
    # call, which may run before the adders and see a layer's output unsteered)
    layers = model.model.layers
    expected = []
    for p in ids:
        seen: dict = {}
        handles = [layers[i].register_forward_hook(adder(d)) for i, d in dirs.items()]
        handles += [layer.register_forward_hook(keep(i, seen)) for i, layer in enumerate(layers)]
        try:
            with torch.no_grad():
                model(torch.tensor([p]))
        finally:
            for h in handles:
                h.remove()
        expected.append([seen[i] for i in range(len(layers))])
    loaded = load_model(str(path))
    cap = capture(loaded, PROMPTS, [0, 1, 2], "all", vector=vec, strength=strength, vector_path="v.json")
    assert cap.meta["steering"] == {"vector_path": "v.json", "trait": "t", "method": "caa", "layers": [0, 2],
                                    "strength": 3.0}
    for p in range(len(PROMPTS)):
        for layer in range(3):
            assert rel_err(cap.states[layer][p], expected[p][layer]) < 1e-4, (p, layer)
    plain = capture(loaded, PROMPTS, [1], "all")
    assert plain.meta["steering"] is None
    assert rel_err(plain.states[1][0], expected[0][1]) > 1e-2   # the steering moved the states

    out = tmp_path / "s.safetensors"
    r = ster("capture", "-m", str(path), "--prompts", str(_write_prompts(tmp_path)), "--layers", "0..2",
             "--position", "last", "--vector", str(tmp_path / "v.json"), "--strength", "3", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "steered at strength 3" in r.stderr
    back = load_capture(out)
    assert back.meta["steering"]["strength"] == 3.0 and back.meta["steering"]["layers"] == [0, 2]
    for layer in range(3):
        assert rel_err(back.rows(layer), np.stack([e[layer][-1] for e in expected])) < 1e-4
    unsteered = capture(loaded, PROMPTS, [0, 1, 2], "last")
    with pytest.raises(SterError, match="different steering \\(positive steered by 't' at strength 3"):
        caa(back, unsteered)

    wide = SteeringVector(str(path), None, 32, "t", "caa", {0: np.ones(32, np.float32) / np.sqrt(32)})
    write_vector(wide, tmp_path / "w.json")
    for args, words in ((["--strength", "2"], "--strength needs --vector"),
                        (["--vector", str(tmp_path / "w.json")], "is 32 wide, but this model's hidden_size is 64")):
        r = ster("capture", "-m", str(path), "-p", "w5", "-o", str(tmp_path / "x.safetensors"), *args)
        assert r.returncode == 1 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert not (tmp_path / "x.safetensors").exists()
    with pytest.raises(SterError, match="a steering vector or a layer_hook, not both"):
        capture(loaded, PROMPTS, [0], vector=vec, layer_hook=lambda i, h: h)


def _write_prompts(tmp_path):
    f = tmp_path / "prompts.txt"
    f.write_text("\n".join(PROMPTS) + "\n")
    return f


def test_cli_capture_json_is_what_it_wrote(tiny, tmp_path):
    """``ster capture --json``: one document on stdout (no summary line on stderr) naming the two files written,
    the sidecar's fields as the sidecar holds them, the prompt count and every tensor's shape as the safetensors
    file holds it; an error under --json is the usual one line on stderr, with nothing on stdout."""
    from ster_py import __version__

    path, _, ids = tiny
    out = tmp_path / "c.safetensors"
    r = ster("capture", "-m", str(path), "--prompts", str(_write_prompts(tmp_path)), "--layers", "0,2",
             "--position", "all", "--json", "-o", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert "wrote" not in r.stderr, r.stderr
    side = json.loads(out.with_suffix(".json").read_text())
    assert doc["ster_version"] == __version__
    assert (doc["output"], doc["sidecar"]) == (str(out), str(out.with_suffix(".json")))
    for key in ("model", "model_revision", "precision", "hidden_size", "layers", "position", "chat_template",
                "steering"):
        assert doc[key] == side[key], key
    assert doc["layers"] == [0, 2] and doc["position"] == "all" and doc["prompt_count"] == len(side["prompts"]) == 3
    with safe_open(str(out), "np") as f:
        assert doc["tensors"] == {name: list(f.get_tensor(name).shape) for name in f.keys()}
    assert doc["tensors"]["layers.2.prompt.1"] == [len(ids[1]), side["hidden_size"]]
    assert doc["warnings"] == []

    r = ster("capture", "-m", str(path), "-p", "w5", "--strength", "2", "--json", "-o", str(tmp_path / "x.safetensors"))
    assert r.returncode == 1 and r.stdout == "", r.stdout
    assert r.stderr.strip() == "error: --strength needs --vector (a steering vector file)", r.stderr
    assert not (tmp_path / "x.safetensors").exists()
