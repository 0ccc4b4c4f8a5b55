"""``ster convert`` and ``ster tune merge --output FILE.gguf`` on tiny checkpoints.

1. Every GGUF architecture ster reads, against llama.cpp's own converter (convert_hf_to_gguf.py) on the same
   tiny checkpoint: the ``{arch}.*`` metadata llama.cpp's converter writes is written with the same values (a
   documented few differ), the tensor names are llama.cpp's and the F32 tensors are bit-equal (q/k permuted,
   qkv and gate/up fused, norms stored as 1 + w, experts stacked, ... as the converter does it); and llama.cpp,
   given our metadata and tensors, builds the model it builds from the converter's file (equal logits). The
   read-back check reports exactly the features llama.cpp cannot take from these configurations.
2. Round trips of three layouts (a Llama: q/k permutation; a Phi-3: fused qkv and gate/up; a GPT-2: inputs-first
   Conv1D weights, learned positions, biases) at F16, Q8_0, Q4_0 and Q4_K_M: gguf-py reads the file; F16, Q8_0
   and Q4_0 tensors are gguf-py's quantization of the checkpoint's tensors byte for byte (F32 ones equal them);
   ster and llama.cpp read the tokenizer alike; llama.cpp's greedy 32 tokens equal ster's on the F16 file,
   and on the quantized files llama.cpp's logits along its greedy path are within 5 % of ster's with the same
   top-1 token but for near-ties (llama.cpp's 8-bit activations, as in test_parity_moe).
3. A merged LoRA adapter written as GGUF is the merged checkpoint converted, and llama.cpp computes the merged
   model from it (the greedy tokens are compared on the real SmolLM2 in test_export_real.py).
4. Refusals on the command line.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ster_py.convert import checkpoint_sources, convert_model
from ster_py.errors import SterError
from ster_py.families import FAMILIES, FAMILIES_BY_GGUF_ARCH
from ster_py.gguf.export import architecture_metadata, read_back_differences
from ster_py.gguf.reader import GGUFFile
from ster_py.gguf.writer import TensorEntry, Typed, write_gguf
from tiny import one_torch_thread  # noqa: F401 (autouse fixture)
from tiny import gguf_py_reader


def ster(*args):
    return subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=600)


# ----------------------------------------------------------------------------- 1. against llama.cpp's converter

def _arch_cases() -> dict:
    import test_parity_dense as dense
    import test_parity_gemma3n as gemma3n
    import test_parity_gemma4_gguf as gemma4
    import test_parity_hc_gguf as hc_gguf
    import test_parity_loops as loops
    import test_parity_moe as moe
    import test_parity_remote as remote
    import test_parity_remote_b_gguf as remote_b
    import test_parity_wrapped as wrapped

    llama = dict(dense.LLAMA)
    cases = dict(dense.GGUF_CASES)
    cases.update({f"moe-{k}": v for k, v in moe.GGUF_CASES.items()})
    cases.update({f"remote-{k}": v for k, v in remote.GGUF_CASES.items()})
    cases.update({f"gemma4-{k}": v for k, v in gemma4.GGUF_CASES.items()})
    cases.update({f"wrapped-{k}": v for k, v in wrapped.GGUF_CASES.items()})
    cases.update({f"gemma3n-{k}": v for k, v in gemma3n.GGUF_CASES.items()})  # group g3n: refused
    cases.update({f"loops-{k}": v for k, v in loops.GGUF_CASES.items()})
    cases.update({f"remote-b-{k}": v for k, v in remote_b.GGUF_CASES.items()})  # group gdp: refused
    cases["hc-deepseek_v4"] = ("deepseek_v4", hc_gguf.DS4_GGUF, {})  # group DS4: refused (read only)
    cases.update({
        "llama": ("llama", dict(llama, head_dim=16), {}),
        "mistral": ("mistral", dict(llama, sliding_window=5), {}),
        "qwen2": ("qwen2", dict(llama), {}),
        "qwen3": ("qwen3", dict(llama, head_dim=16), {}),
        "smollm3": ("smollm3", dict(llama, num_hidden_layers=4), {}),
        "gemma": ("gemma", dict(llama, head_dim=16), {}),
        "gemma2": ("gemma2", dict(llama, head_dim=16, sliding_window=5, query_pre_attn_scalar=24,
                                  attn_logit_softcapping=3.0, final_logit_softcapping=5.0), {}),
        "gemma3": ("gemma3_text", dict(llama, head_dim=16, num_hidden_layers=6, sliding_window=5,
                                       query_pre_attn_scalar=16), {}),
    })
    return cases


def _split_cases():
    from ster_py.convert import UNWRITTEN_ARCHS

    cases = _arch_cases()
    refused = {k: v for k, v in cases.items() if FAMILIES[v[0]].gguf_arch in UNWRITTEN_ARCHS}
    return {k: v for k, v in cases.items() if k not in refused}, refused


# Cases of the architectures ster convert writes, and of the mixture-of-experts ones it refuses.
ARCH_CASES, REFUSED_ARCH_CASES = _split_cases()
# Values the converter writes otherwise, on purpose: Falcon's converter states a 2048-token context whatever
# the config says and BLOOM's its hidden size (ster writes the config's context).
VALUE_DIFFERENCES = {("falcon-1ln", "falcon.context_length"), ("falcon-2ln", "falcon.context_length"),
                     ("bloom", "bloom.context_length")}
# What llama.cpp runs differently from these checkpoints, which the conversion must report.
EXPECTED_DIFFERENCES = {
    "mistral": ["layers 0, 1, 2: sliding window none (the checkpoint: 5)"],  # llama.cpp's llama: no window
    "gemma2": ["attn_scale: the checkpoint has 0.2041241452319315, the GGUF 0.25"],  # query_pre_attn_scalar
}


@pytest.fixture(scope="module")
def arch_files(tmp_path_factory):
    """name -> (llama.cpp's converted F32 file, ster's F32 file of the same checkpoint, differences).

    ster's file holds the converter's tokenizer keys (the tiny checkpoints' word-level vocabulary is no GGUF
    vocabulary; the converter's test driver writes a minimal one) and ster's own metadata and tensors."""
    from llamacpp_convert import convert_cases
    from tiny import build_checkpoint

    from ster_py.config import spec_from_config
    from ster_py.resolve import resolve

    root = tmp_path_factory.mktemp("arch")
    converted = convert_cases(root, ARCH_CASES, build_checkpoint)
    out = {}
    for name, (theirs, _) in converted.items():
        resolved = resolve(str(root / "hf" / name))
        spec = spec_from_config(resolved.config, resolved.family, name)
        meta, freqs = architecture_metadata(resolved.config, resolved.family, spec, name)
        sources = checkpoint_sources(resolved, spec, resolved.family, resolved.config)
        g = GGUFFile(theirs)
        tok = {k: Typed(g.metadata_types[k], v) for k, v in g.metadata.items() if k.startswith("tokenizer.")}
        entries = [TensorEntry(s.name, s.shape, "F32", lambda s=s: s.make().astype(np.float32))
                   for s in sources]
        full = {"general.architecture": resolved.family.gguf_arch, "general.name": g.metadata["general.name"],
                **meta, **tok}
        shapes = {e.name: e.shape for e in entries}
        diffs = read_back_differences(spec, full, shapes, freqs, name)
        ours = write_gguf(root / f"{name}.ster.gguf", full, entries)
        out[name] = (theirs, ours, diffs)
    return out


def _unwritten_cases() -> dict:
    """The GGUF cases of the latent-attention, state-space (and other recurrent-mixer) and block-sparse
    families, which ster convert refuses."""
    import importlib

    out = {}
    for module in ("test_parity_mla", "test_parity_ssm", "test_parity_ssm_b1", "test_parity_wrapped_gguf"):
        try:
            cases = importlib.import_module(module).GGUF_CASES
        except ModuleNotFoundError:
            continue
        out.update({f"{module.rsplit('_', 1)[-1]}-{k}": v for k, v in cases.items()})
    return out


UNWRITTEN_CASES = _unwritten_cases()
#: GGUF architecture -> the layer kind its refusal names (every architecture of a latent or state-space family).
UNWRITTEN_ARCHS = {a: "multi-head latent attention" if f.latent else f.recurrent or "block_sparse" for a, f in
                   sorted(FAMILIES_BY_GGUF_ARCH.items()) if f.latent or f.recurrent or f.block_sparse}
#: A recurrent mixer -> words its refusal must use.
KIND_WORDS = {"mamba": "Mamba state-space", "mamba2": "Mamba-2 state-space", "shortconv": "short convolution",
              "lightning": "lightning attention", "block_sparse": "'block_sparse' mixer"}


def test_every_gguf_architecture_has_a_case():
    """Every architecture ster reads is either converted (and checked against llama.cpp's converter below) or
    refused by a test of its own (``test_unwritten_models_are_refused_before_any_weight``)."""
    from ster_py import convert

    converted = {FAMILIES[model_type].gguf_arch for model_type, _, _ in ARCH_CASES.values()}
    refused = {FAMILIES[model_type].gguf_arch for model_type, _, _ in
               list(UNWRITTEN_CASES.values()) + list(REFUSED_ARCH_CASES.values())}
    assert not converted & refused
    assert converted | refused | set(UNWRITTEN_ARCHS) == set(FAMILIES_BY_GGUF_ARCH)
    assert set(convert.UNWRITTEN_ARCHS) <= refused  # each refused architecture is refused in a test


@pytest.mark.parametrize("name", list(ARCH_CASES))
def test_metadata_and_tensors_are_llamacpp_converters(name, arch_files):
    theirs_path, ours_path, diffs = arch_files[name]
    theirs, ours = GGUFFile(theirs_path), GGUFFile(ours_path)
    arch = theirs.metadata["general.architecture"]
    assert ours.metadata["general.architecture"] == arch
    for key, value in theirs.metadata.items():
        if not key.startswith(f"{arch}."):
            continue
        assert key in ours.metadata, f"{key} missing"
        mine = ours.metadata[key]
        if (name, key) in VALUE_DIFFERENCES:
            assert mine != value
            continue
        if isinstance(value, np.ndarray):
            assert list(mine) == list(value), key
        else:
            assert mine == value and ours.metadata_types[key] == theirs.metadata_types[key], key
    assert list(ours.tensors) and set(ours.tensors) == set(theirs.tensors)
    for n, t in theirs.tensors.items():
        assert ours.tensors[n].shape == t.shape and np.array_equal(ours.tensors[n].dequantize(), t.dequantize()), n
    assert diffs == EXPECTED_DIFFERENCES.get(name, [])


def test_llamacpp_builds_the_converters_model_from_ours(arch_files):
    from ster_py import llamacpp

    prompt = list(np.random.RandomState(5).randint(3, 128, 12))
    names = list(arch_files)
    files = [p for n in names for p in arch_files[n][:2]]
    logits = llamacpp.logits_of_files(files, prompt)
    refused = set()
    for i, name in enumerate(names):
        theirs, ours = logits[2 * i], logits[2 * i + 1]
        if theirs is None:  # llama.cpp refuses the converter's own file: it must refuse ours too
            assert ours is None, name
            refused.add(name)
            continue
        assert ours is not None and np.array_equal(ours, theirs), name
    # llama.cpp's loader refuses tensors the converter writes but it does not read (Command R's q/k norms,
    # ERNIE 4.5's and Seed-OSS's biases), and "<|endoftext|>" missing from the driver's minimal vocabulary for a
    # model named Phi3 (the Phi-3 layout runs in part 2); every other case runs.
    assert refused == {"command-r-qk-norm", "ernie4_5", "seed_oss", "phi3"}


# ----------------------------------------------------------------------------- 2. round trips

WIDE = dict(vocab_size=320, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128)
ROUND_TRIPS = {
    "llama": ("llama", dict(WIDE, head_dim=64)),
    "fused": ("phi3", dict(WIDE)),   # (a name without "phi3": llama.cpp keys vocabulary rules on general.name)
    "gpt2": ("gpt2", dict(vocab_size=320, n_embd=256, n_layer=4, n_head=4, n_positions=128)),
}
PROMPT = "The quick brown fox jumps over"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from export_helpers import tiny_bpe_checkpoint

    root = tmp_path_factory.mktemp("round_trip")
    for name, (model_type, config) in ROUND_TRIPS.items():
        tiny_bpe_checkpoint(root / name, model_type, config, scale=0.25)
    return root


def _source_arrays(path: Path) -> dict[str, np.ndarray]:
    from ster_py.config import spec_from_config
    from ster_py.resolve import resolve

    r = resolve(str(path))
    spec = spec_from_config(r.config, r.family, str(path))
    return {s.name: s.make() for s in checkpoint_sources(r, spec, r.family, r.config)}


@pytest.mark.parametrize("ftype", ["f16", "q8_0", "q4_0", "q4_k_m"])
@pytest.mark.parametrize("name", list(ROUND_TRIPS))
def test_round_trip(name, ftype, checkpoints, tmp_path):
    import gguf

    from ster_py import llamacpp
    from ster_py.generate import Sampling, generate
    from ster_py.load import load_model

    report = convert_model(str(checkpoints / name), tmp_path / f"{name}.gguf", ftype)
    assert report["differences"] == [] and report["tokenizer_notes"] == []
    path = report["output"]
    # (a) gguf-py reads it
    reader = gguf_py_reader(path)
    ours = GGUFFile(path)
    assert [t.name for t in reader.tensors] == list(ours.tensors)
    assert all(t.tensor_type.name == ours.tensors[t.name].type_name for t in reader.tensors)
    assert reader.fields["general.architecture"].contents() == FAMILIES[ROUND_TRIPS[name][0]].gguf_arch
    # (c) the tensors are the checkpoint's, quantized as gguf-py quantizes them
    source = _source_arrays(checkpoints / name)
    assert set(source) == set(ours.tensors)
    checked = 0
    for n, t in ours.tensors.items():
        if t.type_name in ("F32", "F16", "Q8_0", "Q4_0"):
            want = gguf.quants.quantize(source[n].astype(np.float32), getattr(gguf.GGMLQuantizationType, t.type_name))
            assert np.array_equal(t.raw, np.ascontiguousarray(want).reshape(-1).view(np.uint8)), n
            checked += 1
    assert checked and all(t.type_name in ("F32", "F16", "Q8_0", "Q4_0", "Q4_K", "Q6_K") for t in ours.tensors.values())
    # (b) llama.cpp reads the tokenizer as ster does and continues as ster does
    model = load_model(path)
    ids = model.tokenizer.encode(PROMPT)
    assert llamacpp.tokenize(path, [PROMPT], add_special=True) == [ids]
    theirs = llamacpp.greedy(path, ids, 32)
    if ftype == "f16":
        assert generate(model.decoder, ids, Sampling(max_new_tokens=32)).ids == theirs
        return
    seq = ids + theirs[:-1]
    mine = model.decoder.forward(seq)
    (ref,) = llamacpp.logits(path, [seq])
    rel = np.linalg.norm(mine - ref) / np.linalg.norm(ref)
    assert rel < 0.05, rel   # 1-2 % here; a misread block layout scrambles the logits entirely
    # These random models' next-token distributions are flat (top logits a few hundredths apart, where the
    # two implementations differ by ~0.1): most positions, not all, share the top token.
    assert (mine.argmax(1) == ref.argmax(1)).mean() >= 0.75


def test_convert_from_a_gguf_keeps_metadata_and_copies_unchanged_tensors(checkpoints, tmp_path):
    f16 = convert_model(str(checkpoints / "llama"), tmp_path / "a.gguf", "f16")["output"]
    back = convert_model(f16, tmp_path / "b.gguf", "f16")["output"]
    a, b = GGUFFile(f16), GGUFFile(back)
    assert {k: b.metadata_types[k] for k in b.metadata} == {k: a.metadata_types[k] for k in a.metadata}
    assert all(np.array_equal(a.tensors[n].raw, b.tensors[n].raw) for n in a.tensors)


def test_tied_config_beside_a_stored_head_that_differs_writes_the_head(checkpoints, tmp_path):
    """config.json saying tie_word_embeddings: true beside a stored lm_head.weight that differs from the
    embedding: the loaded model runs the stored head (as Transformers 5 does), but convert wrote no
    output.weight, so the GGUF ran the embedding as its head. It now writes the stored head; an equal copy
    is still left out (one table, tied)."""
    import shutil

    from safetensors.numpy import load_file, save_file

    from ster_py.load import load_model

    model = tmp_path / "tied"
    shutil.copytree(checkpoints / "llama", model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(dict(config, tie_word_embeddings=True)))
    weights = load_file(str(model / "model.safetensors"))
    head = weights["lm_head.weight"]
    assert not np.array_equal(head, weights["model.embed_tokens.weight"])
    report = convert_model(str(model), tmp_path / "tied.gguf", "f32")
    assert report["differences"] == []  # the head written: the file runs untied, as the checkpoint does
    path = report["output"]
    tensors = {t.name: t for t in gguf_py_reader(path).tensors}
    assert np.array_equal(np.asarray(tensors["output.weight"].data).reshape(head.shape), head.astype(np.float32))
    ids = [1, 5, 9, 12]
    assert np.allclose(load_model(path).decoder.forward(ids), load_model(str(model)).decoder.forward(ids), atol=1e-5)
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].copy()
    save_file(weights, str(model / "model.safetensors"), metadata={"format": "pt"})
    report = convert_model(str(model), tmp_path / "equal.gguf", "f32")
    assert report["differences"] == []
    path = report["output"]
    assert "output.weight" not in {t.name for t in gguf_py_reader(path).tensors}


def test_a_gguf_written_with_more_bits_says_what_happens_to_its_precision(checkpoints, tmp_path):
    """Re-quantizing a Q4_0 file to Q8_0 (or Q4_1 to Q5_0) rounds the Q4_0 values again to the new grid: the file
    grows and precision drops. The note said they kept the source's rounding (a user measured the Q4_1 preset
    written as Q5_0 and found it worse); it now says they are rounded again, and points at the unquantized
    checkpoint and at perplexity. Written as F16 the values are the source's: that note says precision does not
    grow. To fewer bits, or to the same types, there is no such note."""
    q4 = convert_model(str(checkpoints / "llama"), tmp_path / "q4.gguf", "q4_0")
    assert q4["notes"] == []
    up = convert_model(q4["output"], tmp_path / "up.gguf", "q8_0")
    (note,) = up["notes"]
    moved = sum(1 for name, t in GGUFFile(q4["output"]).tensors.items()
                if t.type_name == "Q4_0" and GGUFFile(up["output"]).tensors[name].type_name == "Q8_0")
    assert f"{moved} from Q4_0 to Q8_0" in note and moved > 0
    assert "rounded again" in note and "precision is lost" in note and "keep" not in note
    assert "unquantized checkpoint" in note and "ster perplexity" in note and "--reference" in note
    assert convert_model(up["output"], tmp_path / "down.gguf", "q4_0")["notes"] == []

    q41 = convert_model(str(checkpoints / "llama"), tmp_path / "q41.gguf", "q4_1")["output"]
    (note,) = convert_model(q41, tmp_path / "q50.gguf", "q5_0")["notes"]
    assert "from Q4_1 to Q5_0" in note and "rounded again" in note

    (note,) = convert_model(q4["output"], tmp_path / "f16.gguf", "f16")["notes"]
    assert "from Q4_0 to F16" in note and "its precision does not" in note and "rounded again" not in note


# ----------------------------------------------------------------------------- 3. merged adapter

def test_merged_adapter_gguf_is_the_merged_checkpoint_in_llamacpp(checkpoints, tmp_path):
    """``tune merge --output FILE.gguf`` writes what merging to a directory and converting it writes, and
    llama.cpp computes the merged model's logits from it (within llama.cpp's own F32 arithmetic, ~1e-3 from
    transformers on these models, against ~1e-1 for the model without the adapter). The greedy tokens are
    compared on the real SmolLM2 (test_export_real.py), whose next-token margins are not random ones."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from ster_py import llamacpp

    base = AutoModelForCausalLM.from_pretrained(str(checkpoints / "llama"), dtype=torch.float32,
                                                attn_implementation="eager")
    seq = list(np.random.RandomState(2).randint(3, 320, 24))
    with torch.no_grad():
        unadapted = base(torch.tensor([seq])).logits[0].numpy()
    pm = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                         lora_dropout=0.0))
    torch.manual_seed(11)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn_like(p) * 0.3)
    pm.save_pretrained(str(tmp_path / "adapter"))
    merged = pm.merge_and_unload().eval()
    with torch.no_grad():
        want = merged(torch.tensor([seq])).logits[0].numpy()
    out = tmp_path / "merged.gguf"
    r = ster("tune", "merge", "--model", str(checkpoints / "llama"), "--adapter", str(tmp_path / "adapter"),
             "--output", str(out), "--type", "f32", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["gguf"]["output"] == str(out) and report["merged_tensors"] == 12
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "merged.gguf"]  # the merged checkpoint is gone
    r = ster("tune", "merge", "--model", str(checkpoints / "llama"), "--adapter", str(tmp_path / "adapter"),
             "--output", str(tmp_path / "dir"))
    assert r.returncode == 0, r.stderr
    direct = GGUFFile(convert_model(str(tmp_path / "dir"), tmp_path / "dir.gguf", "f32")["output"])
    via_merge = GGUFFile(out)
    assert all(np.array_equal(direct.tensors[n].raw, via_merge.tensors[n].raw) for n in direct.tensors)
    (got,) = llamacpp.logits(out, [seq])
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert err < 1e-2 and np.linalg.norm(unadapted - want) / np.linalg.norm(want) > 10 * err


def test_merge_to_gguf_prints_convert_s_table_and_the_type_written(checkpoints, tmp_path):
    """``tune merge --output X.gguf`` printed the conversion as one line of Python reprs (``types={'F16': 30,
    'F32': 9}``, ``differences=[]``) and ``dtype F32`` for an f16 file (a new user's finding): the conversion's
    fields are rows as ``ster convert`` prints them, and the merged checkpoint's dtype is ``merged_dtype``
    beside the file's ``type``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(checkpoints / "llama"), dtype=torch.float32)
    get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"])).save_pretrained(
        str(tmp_path / "adapter"))
    r = ster("tune", "merge", "--model", str(checkpoints / "llama"), "--adapter", str(tmp_path / "adapter"),
             "--output", str(tmp_path / "m.gguf"), "-q")
    assert r.returncode == 0 and r.stdout == "", r.stderr
    r = ster("tune", "merge", "--model", str(checkpoints / "llama"), "--adapter", str(tmp_path / "adapter"),
             "--output", str(tmp_path / "merged.gguf"))
    assert r.returncode == 0, r.stderr
    rows = dict(re.findall(r"^(\w+) +(\S.*)$", r.stdout, re.M))   # a long path alone on the next line is left out
    assert rows["merged_dtype"] == "F32" and rows["type"] == "f16" and "dtype" not in rows
    assert rows["types"] == "F16=30, F32=9" and rows["architecture"] == "llama" and rows["merged_tensors"] == "4"
    assert re.fullmatch(r"[\d,]+ bytes \([\d.]+ MiB\)", rows["bytes"]) and "gguf" not in rows
    assert not re.search(r"[{}\[\]']", r.stdout), r.stdout   # no Python repr left
    doc = json.loads(ster("tune", "merge", "--model", str(checkpoints / "llama"), "--adapter",
                          str(tmp_path / "adapter"), "--output", str(tmp_path / "j.gguf"), "--json").stdout)
    assert doc["merged_dtype"] == "F32" and doc["type"] == "f16" and "dtype" not in doc
    assert doc["gguf"]["types"] == {"F16": 30, "F32": 9}


def test_a_merge_named_as_a_gguf_file_is_a_gguf_file_whatever_its_case(checkpoints, tmp_path):
    """``tune merge -o M.GGUF`` wrote a checkpoint directory named M.GGUF (only a lower-case .gguf chose the GGUF
    writer, while convert takes either), and the library's merge_adapter(..., "m.gguf") wrote a directory under
    that name: the first now writes one GGUF file, the second is refused naming merge_adapter_to_gguf."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from ster_py.tune.merge import merge_adapter

    base = AutoModelForCausalLM.from_pretrained(str(checkpoints / "llama"), dtype=torch.float32)
    get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"])).save_pretrained(
        str(tmp_path / "adapter"))
    out = tmp_path / "M.GGUF"
    r = ster("tune", "merge", "--model", str(checkpoints / "llama"), "--adapter", str(tmp_path / "adapter"),
             "--output", str(out), "-q")
    assert r.returncode == 0, r.stderr
    assert out.is_file() and GGUFFile(out).metadata["general.architecture"] == "llama"
    with pytest.raises(SterError, match=r"is named as a GGUF file, but merge_adapter writes a checkpoint directory; "
                                        r"call merge_adapter_to_gguf"):
        merge_adapter(str(checkpoints / "llama"), str(tmp_path / "adapter"), tmp_path / "m.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["M.GGUF", "adapter"]


# ----------------------------------------------------------------------------- 4. command line

def test_cli_convert_json(checkpoints, tmp_path):
    out = tmp_path / "x.gguf"
    r = ster("convert", str(checkpoints / "gpt2"), "--output", str(out), "--type", "q8_0", "--json", "-q")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    doc = json.loads(r.stdout)
    from ster_py import __version__

    assert doc["ster_version"] == __version__
    assert doc["output"] == str(out) and doc["type"] == "q8_0" and doc["architecture"] == "gpt2"
    assert doc["types"] == {"F32": 35, "Q8_0": 17} and doc["bytes"] == out.stat().st_size
    assert GGUFFile(out).metadata["general.file_type"] == 7


def test_cli_reconvert_gguf_report_is_plain(checkpoints, tmp_path):
    """Issue 23: a GGUF input keeps its metadata typed; the report (JSON and table) shows plain values."""
    from typer.testing import CliRunner

    from ster_py.cli import app

    f16 = convert_model(str(checkpoints / "llama"), tmp_path / "a.gguf", "f16")["output"]
    r = CliRunner().invoke(app, ["convert", f16, "-o", str(tmp_path / "b.gguf"), "-t", "q4_0", "--json", "-q"])
    assert r.exit_code == 0, r.exception
    doc = json.loads(r.stdout)
    assert doc["architecture"] == GGUFFile(f16).metadata["general.architecture"] == "llama"
    assert doc["bytes"] == (tmp_path / "b.gguf").stat().st_size
    r = CliRunner().invoke(app, ["convert", f16, "-o", str(tmp_path / "c.gguf"), "-t", "q4_0"], terminal_width=200)
    assert r.exit_code == 0, r.exception
    size = (tmp_path / "c.gguf").stat().st_size
    assert re.search(r"architecture\s+llama *\n", r.stdout) and "Typed" not in r.stdout
    assert f"{size:,} bytes" in r.stdout


@pytest.mark.parametrize("args, words", [
    (["--type", "q3_k"], "'q3_k' is not one of"),  # a usage error (exit 2), as other choices are
    (["--type", "f16"], "already exists"),
    (["--type", "f16", "--threads", "0"], "--threads must be a whole number from 1 to 1024, got 0"),
])
def test_cli_convert_refusals(args, words, checkpoints, tmp_path):
    out = tmp_path / "exists.gguf"
    out.write_bytes(b"keep me")
    r = ster("convert", str(checkpoints / "llama"), "--output", str(out), *args)
    usage = "is not one of" in words
    assert r.returncode == (2 if usage else 1) and "Traceback" not in r.stderr
    assert r.stderr.startswith("Usage:" if usage else "error:") and words in " ".join(r.stderr.split())
    assert out.read_bytes() == b"keep me"


def test_cli_convert_refuses_an_output_not_named_gguf(checkpoints, tmp_path):
    """ster (and llama.cpp's tools) take a file as GGUF by its name: a .bin would be written but not run."""
    out = tmp_path / "model.bin"
    r = ster("convert", str(checkpoints / "llama"), "--output", str(out), "--type", "f16")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("error:") and "does not end in .gguf" in r.stderr and not out.exists()


@pytest.mark.parametrize("case, words", [
    ("vocab_id_text", 'invalid type: string "abc", expected u32'),   # was a ValueError traceback
    ("vocab_list", "expected a map"),                                 # was an AttributeError traceback
    ("added_without_id", "missing field `id`"),                       # was a KeyError traceback
    ("nested", "recursion limit exceeded"),                           # was a RecursionError traceback
])
def test_malformed_tokenizer_json_is_one_error_line(case, words, checkpoints, tmp_path):
    import shutil

    src = checkpoints / "llama"
    model = tmp_path / case
    shutil.copytree(src, model)
    doc = json.loads((src / "tokenizer.json").read_text())
    if case == "vocab_id_text":
        doc["model"]["vocab"]["zzz"] = "abc"
    elif case == "vocab_list":
        doc["model"]["vocab"] = list(doc["model"]["vocab"].items())
    elif case == "added_without_id":
        del doc["added_tokens"][0]["id"]
    text = json.dumps(doc) if case != "nested" else '{"model": ' + "[" * 100_000 + "]" * 100_000 + "}"
    (model / "tokenizer.json").write_text(text)
    out = tmp_path / "m.gguf"
    r = ster("convert", str(model), "--output", str(out))
    assert r.returncode == 1 and "Traceback" not in r.stderr and not out.exists(), r.stderr
    assert r.stderr.startswith(f"error: failed to load tokenizer {model / 'tokenizer.json'}: ") and words in r.stderr


@pytest.mark.parametrize("file, key", [("tokenizer_config.json", "tokenizer.chat_template"),
                                       ("config.json", "general.name")])
def test_text_utf8_cannot_encode_is_one_error_line(file, key, checkpoints, tmp_path):
    """A "\\ud800" escape in the chat template or in config.json's _name_or_path (GGUF's general.name) reached the
    GGUF writer as a lone surrogate: a UnicodeEncodeError traceback."""
    import shutil

    model = tmp_path / "m"
    shutil.copytree(checkpoints / "llama", model)
    doc = json.loads((model / file).read_text())
    doc.update({"chat_template": "{{ messages[0]['content'] }}{# \ud800 #}"} if file == "tokenizer_config.json"
               else {"_name_or_path": "org/x\ud800"})
    (model / file).write_text(json.dumps(doc))
    out = tmp_path / "m.gguf"
    r = ster("convert", str(model), "--output", str(out))
    assert r.returncode == 1 and "Traceback" not in r.stderr and not out.exists(), r.stderr
    assert r.stderr.startswith(f"error: GGUF metadata {key} cannot be written: its text holds the lone surrogate "
                               "U+D800"), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_weights_holding_nan_are_refused_not_converted(checkpoints, tmp_path):
    """A NaN in a checkpoint's weight was written into the GGUF with status 0 (as F16, or inside a quantized
    block's scale): a file whose every output is NaN. A checkpoint and a GGUF being re-quantized are refused,
    naming the tensor, and nothing is written."""
    import shutil

    from safetensors.numpy import load_file, save_file

    model = tmp_path / "nan"
    shutil.copytree(checkpoints / "llama", model)
    weights = load_file(str(model / "model.safetensors"))
    weights["model.layers.1.mlp.down_proj.weight"][2, 3] = np.nan
    save_file(weights, str(model / "model.safetensors"), metadata={"format": "pt"})
    for ftype in ("f16", "q4_k_m"):
        with pytest.raises(SterError, match=r"the weights written as blk\.1\.ffn_down\.weight hold NaN or infinity"):
            convert_model(str(model), tmp_path / f"m-{ftype}.gguf", ftype)
    f16 = Path(convert_model(str(checkpoints / "llama"), tmp_path / "clean-f16.gguf", "f16")["output"])
    g = GGUFFile(f16)
    start = g.data_offset + g.tensors["blk.0.ffn_up.weight"].offset
    data = bytearray(f16.read_bytes())
    data[start:start + 2] = np.array([np.inf], np.float16).tobytes()
    broken = tmp_path / "broken-f16.gguf"
    broken.write_bytes(bytes(data))
    with pytest.raises(SterError, match=r"the weights written as blk\.0\.ffn_up\.weight hold NaN or infinity"):
        convert_model(str(broken), tmp_path / "m-q8_0.gguf", "q8_0")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken-f16.gguf", "clean-f16.gguf", "nan"]


@pytest.mark.parametrize("change, words", [
    ({"drop": "output_norm.weight"}, "the checkpoint has no tensor 'output_norm.weight'"),
    ({"drop": "token_embd.weight"}, "has no token_embd.weight tensor: it holds no model weights"),
    ({"reshape": "blk.0.attn_norm.weight"}, r"tensor 'blk\.0\.attn_norm\.weight' has shape \[\d+\], but the "
                                            "configuration implies"),
    # a norm stored as I32 was read as floats (its integers) and the model ran
    ({"int32": "blk.0.attn_norm.weight"}, r"tensor 'blk\.0\.attn_norm\.weight' is stored as I32, an integer type "
                                          "llama.cpp uses only for id tables"),
])
def test_a_gguf_ster_refuses_to_run_is_not_reconverted(checkpoints, tmp_path, change, words):
    """convert re-quantized a GGUF whose tensors did not fit its model (a norm of another width or stored as
    integers, a tensor missing, even token_embd.weight) with status 0, writing a file that ster (and llama.cpp) refuse to run;
    it is now refused as load_model refuses it, and nothing is written."""
    import gguf

    f16 = convert_model(str(checkpoints / "llama"), tmp_path / "f16.gguf", "f16")["output"]
    src = GGUFFile(f16)
    broken = tmp_path / "broken.gguf"
    w = gguf.GGUFWriter(str(broken), None)
    for key, value in src.metadata.items():
        vtype = src.metadata_types[key]
        if vtype.startswith("array of "):
            w.add_key_value(key, list(value), gguf.GGUFValueType.ARRAY,
                            sub_type=gguf.GGUFValueType[vtype.removeprefix("array of ").upper()])
        else:
            w.add_key_value(key, value, gguf.GGUFValueType[vtype.upper()])
    for name, t in src.tensors.items():
        if name == change.get("drop"):
            continue
        data = np.asarray(t.dequantize(), np.float32)
        if name == change.get("reshape"):
            data = np.ones(data.shape[-1] + 1, np.float32)
        if name == change.get("int32"):
            data = np.rint(data * 100).astype(np.int32)
        w.add_tensor(name, data)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(SterError, match=words):
        convert_model(str(broken), tmp_path / "out.gguf", "q8_0")
    assert not (tmp_path / "out.gguf").exists()


def test_family_without_a_gguf_architecture_is_refused_before_any_weight(tmp_path):
    from tiny import write_tokenizer

    d = tmp_path / "gptj"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "gptj", "n_embd": 64, "n_layer": 2, "n_head": 4,
                                               "rotary_dim": 8, "vocab_size": 128, "n_positions": 64}))
    write_tokenizer(d)
    (d / "model.safetensors").write_bytes(b"corrupt: proves nothing reads it")
    with pytest.raises(SterError, match="no GGUF architecture for model_type 'gptj'"):
        convert_model(str(tmp_path / "gptj"), tmp_path / "x.gguf", "f16")
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize("name", list(UNWRITTEN_CASES) + list(REFUSED_ARCH_CASES))
def test_unwritten_models_are_refused_before_any_weight(name, tmp_path):
    """Latent attention and state-space layers are not written (their GGUF tensors and metadata are llama.cpp's
    converter's business): the refusal names the layer kind, comes before any weight or the tokenizer is read
    (a corrupt safetensors file and a word-level tokenizer are never reached), and leaves no file."""
    from transformers import AutoConfig

    from tiny import CONFIG_AS_GIVEN, TEXT_CONFIG_TYPES, write_tokenizer

    model_type, config, _ = {**UNWRITTEN_CASES, **REFUSED_ARCH_CASES}[name]
    config = {k: v for k, v in config.items() if k != CONFIG_AS_GIVEN}
    d = tmp_path / "m"
    try:
        AutoConfig.for_model(TEXT_CONFIG_TYPES.get(model_type, model_type), bos_token_id=1, eos_token_id=2,
                             pad_token_id=0, **config).save_pretrained(d)
        if model_type in TEXT_CONFIG_TYPES:  # the release's spelling: the text config under its model_type
            saved = json.loads((d / "config.json").read_text())
            (d / "config.json").write_text(json.dumps(dict(saved, model_type=model_type)))
    except ValueError:  # a model_type only its Hub code knows: the config as its parity module builds it
        import test_parity_remote as remote

        base = remote.LLAMA if name.startswith("remote-") else {}
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"model_type": model_type, **base, **config}))
    write_tokenizer(d)
    (d / "model.safetensors").write_bytes(b"corrupt: proves nothing reads it")
    if name in REFUSED_ARCH_CASES:
        from ster_py.convert import UNWRITTEN_ARCHS

        arch = FAMILIES[model_type].gguf_arch
        match = f"does not write model_type '{model_type}' \\(GGUF architecture '{arch}'\\) yet: it lacks"
        assert UNWRITTEN_ARCHS[arch]
    else:
        family = FAMILIES[model_type]
        kind = ("multi-head latent attention" if family.latent
                else KIND_WORDS[family.recurrent or ("block_sparse" if family.block_sparse else None)])
        match = f"ster convert does not write model_type '{model_type}' yet: .*{kind}"
    with pytest.raises(SterError, match=match):
        convert_model(str(d), tmp_path / "x.gguf", "f16")
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize("arch, kind", list(UNWRITTEN_ARCHS.items()))
def test_latent_and_state_space_ggufs_are_refused(arch, kind, tmp_path):
    """A GGUF source of those architectures is refused too (its tensors are not re-quantized by llama.cpp's
    rules for them here), from its metadata alone: the file holds no tensor at all."""
    src = write_gguf(tmp_path / "src.gguf", {"general.architecture": arch, f"{arch}.block_count": Typed("uint32", 2)},
                     [])
    out = tmp_path / "x.gguf"
    kind = KIND_WORDS.get(kind, kind)
    with pytest.raises(SterError, match=f"does not write GGUF architecture '{arch}' yet: .*{kind}"):
        convert_model(str(src), out, "q8_0")
    assert not out.exists()


def test_latent_gguf_refusal_on_the_command_line(tmp_path):
    src = write_gguf(tmp_path / "src.gguf", {"general.architecture": "deepseek2"}, [])
    out = tmp_path / "x.gguf"
    r = ster("convert", str(src), "--output", str(out), "--type", "q8_0")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("error:") and "multi-head latent attention" in r.stderr and not out.exists()


def test_word_level_tokenizer_is_refused(tmp_path):
    from tiny import make_checkpoint

    make_checkpoint(tmp_path / "m", "llama")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"corrupt: proves nothing reads it")
    with pytest.raises(SterError, match="WordLevel tokenizer cannot be written"):
        convert_model(str(tmp_path / "m"), tmp_path / "x.gguf", "f16")
    assert not (tmp_path / "x.gguf").exists()
