"""``ster perplexity`` on a tiny model: llama-perplexity's windows and statistics.

The oracle for the windows is llama.cpp itself (``llamacpp.perplexity`` runs llama-perplexity's computation in
llama.cpp): same text, same file, the same perplexity within 1 % (the same to ~1e-4 on an F16 file). The
statistics are checked against a direct numpy computation over whole-window logits (no cache, no batching):
NLL, KL divergence, Δp and top-1 agreement.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from export_helpers import CORPUS as TEXT
from ster_py.errors import SterError
from ster_py.perplexity import perplexity, text_ids, windows
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from export_helpers import tiny_bpe_checkpoint

    from ster_py.convert import convert_model

    root = tmp_path_factory.mktemp("ppl")
    cfg = dict(vocab_size=320, hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=64, max_position_embeddings=128)
    tiny_bpe_checkpoint(root / "m", "llama", cfg, scale=0.25)
    return {t: convert_model(str(root / "m"), root / f"m-{t}.gguf", t)["output"] for t in ("f16", "q4_0")}


def _log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def test_statistics_equal_a_direct_computation(files):
    from ster_py.load import load_model

    model, ref = load_model(files["q4_0"]), load_model(files["f16"])
    n_ctx = 32
    got = perplexity(model, TEXT, n_ctx, reference=ref, max_chunks=3, batch=5)
    ids = text_ids(model.tokenizer, TEXT)
    nll, kld, dp, same = [], [], [], []
    for c in range(3):
        w = ids[c * n_ctx:(c + 1) * n_ctx]  # this vocabulary adds no BOS: windows are the text as is
        lp = _log_softmax(model.decoder.forward(w))[n_ctx // 2:n_ctx - 1]
        rp = _log_softmax(ref.decoder.forward(w))[n_ctx // 2:n_ctx - 1]
        t = np.asarray(w[n_ctx // 2 + 1:])
        rows = np.arange(len(t))
        nll.append(-lp[rows, t])
        kld.append((np.exp(rp) * (rp - lp)).sum(1))
        dp.append(np.exp(lp[rows, t]) - np.exp(rp[rows, t]))
        same.append(lp.argmax(1) == rp.argmax(1))
    nll, kld, dp, same = map(np.concatenate, (nll, kld, dp, same))
    assert got["tokens"] == len(nll) == 3 * (n_ctx // 2 - 1) and got["chunks"] == 3 and not got["add_bos"]
    assert got["ppl"] == pytest.approx(np.exp(nll.mean()), rel=1e-4)
    assert got["kld_mean"] == pytest.approx(kld.mean(), rel=1e-3, abs=1e-7)
    assert got["dp_rms"] == pytest.approx(np.sqrt((dp ** 2).mean()), rel=1e-3)
    assert got["same_top"] == pytest.approx(same.mean())
    assert got["kld_mean"] > 0 and got["reference_ppl"] != got["ppl"]
    itself = perplexity(ref, TEXT, n_ctx, reference=ref, max_chunks=2)
    assert itself["kld_mean"] == pytest.approx(0, abs=1e-12) and itself["same_top"] == 1 and itself["dp_rms"] == 0


@pytest.mark.parametrize("ftype", ["f16", "q4_0"])
def test_perplexity_equals_llamacpps(files, ftype):
    from ster_py import llamacpp
    from ster_py.load import load_model

    path = files[ftype]
    ours = perplexity(load_model(path), TEXT, 64)
    theirs = llamacpp.perplexity(path, TEXT, 64)
    assert theirs["tokens"] == text_ids(load_model(path).tokenizer, TEXT)
    assert ours["tokens"] == len(theirs["nll"]) and ours["chunks"] == theirs["chunks"]
    assert abs(ours["ppl"] / theirs["ppl"] - 1) < (1e-3 if ftype == "f16" else 1e-2)


def test_windows_refusals():
    with pytest.raises(SterError, match="at least 64"):
        windows(list(range(63)), 32, None)
    with pytest.raises(SterError, match="even number"):
        windows(list(range(100)), 31, None)
    w = windows(list(range(100)), 16, 7, max_chunks=2)
    assert len(w) == 2 and w[0][0] == 7 and w[1][0] == 7 and list(w[1][1:]) == list(range(17, 32))


def test_cli_json(files, tmp_path):
    (tmp_path / "t.txt").write_text(TEXT)
    r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", "perplexity", files["q4_0"],
                        "--file", str(tmp_path / "t.txt"), "--ctx", "32", "--chunks", "2", "--reference", files["f16"],
                        "--json", "-q"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    doc = json.loads(r.stdout)
    from ster_py import __version__

    assert doc["ster_version"] == __version__
    assert doc["chunks"] == 2 and doc["tokens"] == 30 and doc["kld_mean"] > 0 and 0 < doc["same_top"] <= 1
    # what the other commands' documents record about the model (a new user's finding: these were missing)
    assert doc["precision"] == "f32" and doc["warnings"] == []
    assert doc["model_revision"] is None and doc["reference_revision"] is None   # local files: no revision
    r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", "perplexity", files["f16"],
                        "--file", str(tmp_path / "t.txt"), "--ctx", "4096"], capture_output=True, text=True, timeout=600)
    # a window past the model's 128 positions is refused as generate's --ctx-size (issue 17: it ran silently)
    assert r.returncode == 1 and r.stderr.startswith("error:") and "Traceback" not in r.stderr
    assert "--ctx 4096 exceeds the model's maximum of 128 positions" in r.stderr, r.stderr
    # --reference "$UNSET" printed the perplexity alone, as if no --reference had been given
    for empty in ("", "  "):
        r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", "perplexity", files["f16"],
                            "--file", str(tmp_path / "t.txt"), "--ctx", "32", "--reference", empty],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith("error: --reference is empty;"), r.stderr


def test_an_unreadable_file_is_named_for_what_it_is(tmp_path):
    """`ster perplexity --file` said "--file X is not a readable file" for a missing file and a directory alike, and
    Python's codec words ("'utf-8' codec can't decode byte 0xd0 in position 24") for a binary one. It reads its text
    as `tokenize --file` does now, each case told apart, before any model is loaded."""
    (tmp_path / "bin.dat").write_bytes(b"text" + bytes([0xD0, 0x20]))
    for given, words in (("nope.txt", "text file not found: {} (cannot read it: no such file)"),
                         (".", "the text file {} is a directory; give a file in it"),
                         ("bin.dat", "--file {} is not UTF-8 text (invalid byte at offset 4); convert it to UTF-8")):
        path = tmp_path / given
        r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", "perplexity",
                            str(tmp_path / "never-read"), "--file", str(path)], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 1 and r.stdout == "" and r.stderr.strip() == "error: " + words.format(path), r.stderr


def test_revision_is_the_models_not_the_references(files, tmp_path, monkeypatch):
    # --revision X was applied to --reference too: a Hub reference was fetched at a branch/tag of the other
    # repository (or failed for lack of it); the reference is read at its own default revision. (A --revision
    # is for Hub ids only, so the model is taken as one here: the revision each load is given is recorded.)
    from typer.testing import CliRunner

    import ster_py.cli as cli
    import ster_py.load as load

    real, asked = load.load_model, []

    def load_model(model, revision=None, **kwargs):
        asked.append((model, revision))
        return real(model, None, **kwargs)

    monkeypatch.setattr(load, "load_model", load_model)
    (tmp_path / "t.txt").write_text(TEXT)
    r = CliRunner().invoke(cli.app, ["perplexity", files["q4_0"], "--file", str(tmp_path / "t.txt"), "--ctx", "32",
                                     "--chunks", "2", "--reference", files["f16"], "--revision", "v1", "--json", "-q"])
    assert r.exit_code == 0, r.output
    assert asked == [(files["q4_0"], "v1"), (files["f16"], None)]


@pytest.mark.parametrize("scale, words", [
    (float("nan"), "the model produced non-finite logits"),        # was "PPL = nan", and NaN in --json (not JSON)
    (1e6, r"the model scores the text at .* nats per token, so its perplexity exp\(.*\) is beyond a float's range"),
])  # 1e6: an OverflowError traceback from math.exp
def test_broken_logits_are_refused_not_printed(files, monkeypatch, scale, words):
    from ster_py.load import load_model

    model, ref = load_model(files["q4_0"]), load_model(files["f16"])
    forward = model.decoder.forward
    monkeypatch.setattr(model.decoder, "forward", lambda *a, **k: forward(*a, **k) * np.float32(scale))
    with pytest.raises(SterError, match=words):
        perplexity(model, TEXT, 32, max_chunks=1)
    with pytest.raises(SterError, match=words.replace("the model", "the reference model")):
        perplexity(ref, TEXT, 32, reference=model, max_chunks=1)


def test_a_reference_that_tokenizes_otherwise_is_shown_where(files, monkeypatch):
    """The refusal said only 'tokenizes the text differently'; it now gives both counts and the pieces from the
    first difference on, so a user sees whether it is the vocabulary or a whitespace rule (a new user's finding)."""
    from ster_py.load import load_model

    model, ref = load_model(files["q4_0"]), load_model(files["f16"])
    ids = text_ids(model.tokenizer, TEXT)
    changed = ids[:5] + [ids[5] + 1] + ids[6:]
    monkeypatch.setattr(ref.tokenizer, "encode", lambda text, add_special_tokens=True: list(changed))
    piece = repr(model.tokenizer.decode([ids[5]], skip_special_tokens=False))
    with pytest.raises(SterError, match=rf"tokenizes the text differently \({len(ids)} tokens against {len(ids)}; "
                                        rf"from token 5: {re.escape(piece)}"):
        perplexity(model, TEXT, 32, reference=ref, max_chunks=1)


@pytest.mark.parametrize("kwargs, words", [
    ({"n_ctx": "64"}, "--ctx must be a whole number, got '64'"),           # was a TypeError ('>' str and int)
    ({"n_ctx": 64.0}, "--ctx must be a whole number, got 64.0"),           # was a TypeError (slice indices)
    ({"n_ctx": None}, "--ctx must be a whole number, got None"),
    ({"n_ctx": True}, "--ctx must be a whole number, got True"),           # was "--ctx True must be an even number"
    ({"max_chunks": "1"}, "--chunks must be a whole number, got '1'"),     # was a TypeError ('<' str and int)
    ({"max_chunks": 1.5}, "--chunks must be a whole number, got 1.5"),     # was a TypeError
    ({"batch": 0}, "batch must be 1 or more, got 0"),                      # was range()'s ValueError
    ({"reference": "m.gguf"}, "reference takes a loaded model .*got str"),  # was an AttributeError ('spec')
    ({"progress": 5}, "progress must be a function or None"),
])
def test_library_arguments_of_the_wrong_kind_are_ster_errors(files, kwargs, words):
    from ster_py.load import load_model

    loaded = load_model(files["f16"])
    kwargs = {"n_ctx": 16, **kwargs}
    with pytest.raises(SterError, match=words):
        perplexity(loaded, TEXT, kwargs.pop("n_ctx"), **kwargs)
    with pytest.raises(SterError, match=r"perplexity takes a loaded model \(load_model\(...\)\), got str"):
        perplexity(files["f16"], TEXT, 16)    # a path where the loaded model belongs: was an AttributeError
    with pytest.raises(SterError, match="--ctx must be a whole number"):
        windows(list(range(64)), "16", None)
