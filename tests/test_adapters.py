"""LoRA adapters: ``ster tune merge`` and ``generate --adapter`` against PEFT.

Oracle: PEFT's ``get_peft_model`` on a tiny transformers checkpoint, random LoRA
factors, ``save_pretrained`` (the adapter ster reads) and ``merge_and_unload``
(the merged weights ster must reproduce). Merged directories are loaded back by
transformers; files are read with the safetensors library.
"""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from ster_py.adapters import apply_adapter, load_adapter_for, read_adapter
from ster_py.errors import SterError
from ster_py.load import load_model
from ster_py.tune.merge import merge_adapter
from tiny import make_checkpoint, reference_greedy, reference_logits, rel_err

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SHORT = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "gate_proj": "gate", "up_proj": "up",
         "down_proj": "down"}
IDS = [5, 9, 17, 33, 65, 3, 40, 41]
PROMPT = " ".join(f"w{i}" for i in IDS)


def ster(*args):
    return subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=300)


def peft_case(root: Path, *, dtype: str = "f32", rslora: bool = False, r: int = 4, alpha: int = 8,
              model_type: str = "llama", targets=TARGETS, **overrides):
    """A tiny checkpoint, a PEFT adapter with random factors, and PEFT's merged state dict."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    base_dir, adapter_dir = root / "base", root / "adapter"
    make_checkpoint(base_dir, model_type, dtype=None if dtype == "f32" else torch_dtype, **overrides)
    base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch_dtype, attn_implementation="eager")
    pm = get_peft_model(base, LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), use_rslora=rslora,
                                         lora_dropout=0.0, fan_in_fan_out=model_type == "gpt2"))
    torch.manual_seed(7)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * 0.2)
    pm.eval()
    pm.save_pretrained(str(adapter_dir))
    with torch.no_grad():
        adapted_logits = pm(torch.tensor([IDS])).logits[0].float().numpy()
    merged = pm.merge_and_unload()
    state = {k: v.detach().clone() for k, v in merged.state_dict().items()}
    return base_dir, adapter_dir, state, adapted_logits, merged.float().eval()


def as_numpy(t) -> np.ndarray:
    import torch

    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def ster_layout_from_peft(adapter_dir: Path, out: Path, model: str, **sidecar) -> Path:
    """Rewrite PEFT's factors in Ster's layout (NAME.lora.safetensors + NAME.lora.json)."""
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    tensors = {}
    for k, v in load_file(str(adapter_dir / "adapter_model.safetensors")).items():
        parts = k.split(".")
        layer, target, ab = int(parts[parts.index("layers") + 1]), SHORT[parts[-3]], parts[-2]
        tensors[f"layers.{layer}.{target}.{'a' if ab == 'lora_A' else 'b'}"] = v
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "mine.lora.safetensors"))
    doc = {"model": model, "model_revision": None, "rank": cfg["r"], "alpha": cfg["lora_alpha"],
           "targets": list(SHORT.values()), "layers": [0, 1, 2], "hidden_size": 64, **sidecar}
    (out / "mine.lora.json").write_text(json.dumps(doc))
    return out / "mine.lora.json"


@pytest.fixture(scope="module")
def f32_case(tmp_path_factory):
    return peft_case(tmp_path_factory.mktemp("f32"))


def check_against_peft(out: Path, state, *, bf16: bool, base: Path | None = None, targets=TARGETS,
                       n_expected: int = 21):
    n_merged = 0
    with safe_open(str(out / "model.safetensors"), framework="numpy") as f:
        if base is not None:  # the merged checkpoint holds exactly the base's tensors
            with safe_open(str(base / "model.safetensors"), framework="numpy") as b:
                assert sorted(f.keys()) == sorted(b.keys())
        for name in f.keys():
            # transformers 5 names GPT-NeoX's head lm_head in memory and embed_out on disk
            ref = as_numpy(state[name if name in state else {"embed_out.weight": "lm_head.weight"}[name]])
            ours = f.get_tensor(name)
            assert ours.dtype == ref.dtype and ours.shape == ref.shape, name
            if any(name.endswith(f".{t}.weight") for t in targets):
                n_merged += 1
                if bf16:  # one unit in the last place: adjacent bfloat16 bit patterns (same sign here)
                    a, b = ours.view(np.int16).astype(np.int32), ref.view(np.int16).astype(np.int32)
                    assert np.abs(a - b).max() <= 1, name
                else:
                    assert np.abs(ours - ref).max() <= 1e-6, name
            else:
                assert np.array_equal(ours.view(np.uint8), ref.view(np.uint8)), name  # copied bit for bit
    assert n_merged == n_expected


def test_merge_peft_adapter_equals_peft_f32(f32_case, tmp_path):
    base_dir, adapter_dir, state, _, _ = f32_case
    out = tmp_path / "merged"
    r = ster("tune", "merge", "--model", str(base_dir), "--adapter", str(adapter_dir), "--output", str(out), "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    check_against_peft(out, state, bf16=False, base=base_dir)
    assert report == json.loads((out / "ster-merge.json").read_text())
    assert report["rank"] == 4 and report["alpha"] == 8 and report["scale"] == 2.0 and report["dtype"] == "F32"
    assert report["targets"] == ["q", "k", "v", "o", "gate", "up", "down"] and report["layers"] == [0, 1, 2]
    assert report["hidden_size"] == 64 and report["merged_tensors"] == 21
    assert report["total_tensors"] == report["merged_tensors"] + report["copied_tensors"] == len(state)
    assert report["parameters"] == sum(t.numel() for t in state.values())
    # every row is named in merge_adapter's docstring (adapter_layout, rslora and warnings were not)
    assert [k for k in report if not re.search(rf"\b{k}\b", merge_adapter.__doc__.split("Returns:")[1])] == []
    assert sorted(p.name for p in out.iterdir()) == sorted(report["files"])
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= set(report["files"])
    assert (out / "config.json").read_bytes() == (base_dir / "config.json").read_bytes()


def test_peft_adapter_naming_a_hub_id_applies_to_a_local_copy_with_a_warning(f32_case, tmp_path):
    """PEFT's base_model_name_or_path is what its trainer loaded (often a Hub id) while the same weights run
    from a local directory: a different name is a warning, not a refusal (shapes are still checked)."""
    import shutil

    base_dir, adapter_dir, state, _, _ = f32_case
    hub = tmp_path / "hub-adapter"
    shutil.copytree(adapter_dir, hub)
    cfg = json.loads((hub / "adapter_config.json").read_text())
    (hub / "adapter_config.json").write_text(json.dumps({**cfg, "base_model_name_or_path": "org/tiny-llama"}))
    r = ster("tune", "merge", "--model", str(base_dir), "--adapter", str(hub), "--output", str(tmp_path / "m"), "-q")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""   # -q: no report (as convert -q); the warning still prints
    assert "warning: adapter" in r.stderr and "names its base model 'org/tiny-llama'" in r.stderr
    check_against_peft(tmp_path / "m", state, bf16=False, base=base_dir)
    report = json.loads((tmp_path / "m" / "ster-merge.json").read_text())
    assert len(report["warnings"]) == 1 and "org/tiny-llama" in report["warnings"][0]
    r = ster("generate", "--model", str(base_dir), "--adapter", str(hub), "-p", "w5 w6", "--max-new-tokens", "2",
             "--chat-template", "off", "--json", "-q")
    assert r.returncode == 0, r.stderr
    assert any("org/tiny-llama" in w for w in json.loads(r.stdout)["warnings"]) and "warning: adapter" in r.stderr
    # a PEFT adapter whose factors do not fit is still refused
    (hub / "adapter_config.json").write_text(json.dumps({**cfg, "base_model_name_or_path": "org/tiny-llama",
                                                          "r": cfg["r"] * 2}))
    r = ster("tune", "merge", "--model", str(base_dir), "--adapter", str(hub), "--output", str(tmp_path / "n"), "-q")
    assert r.returncode == 1 and "error:" in r.stderr and not (tmp_path / "n").exists()


def test_merge_rslora_and_bf16_equal_peft(tmp_path):
    base_dir, adapter_dir, state, _, _ = peft_case(tmp_path / "rs", rslora=True, r=4, alpha=6)
    report = merge_adapter(str(base_dir), str(adapter_dir), tmp_path / "rs-out")
    assert report["scale"] == pytest.approx(6 / math.sqrt(4)) and report["rslora"]
    check_against_peft(tmp_path / "rs-out", state, bf16=False)

    base_dir, adapter_dir, state, _, _ = peft_case(tmp_path / "bf", dtype="bf16")
    report = merge_adapter(str(base_dir), str(adapter_dir), tmp_path / "bf-out")
    assert report["dtype"] == "BF16"
    check_against_peft(tmp_path / "bf-out", state, bf16=True)


def test_ster_layout_merges_like_peft(f32_case, tmp_path):
    base_dir, adapter_dir, state, _, _ = f32_case
    side = ster_layout_from_peft(adapter_dir, tmp_path / "ad", str(base_dir))
    report = merge_adapter(str(base_dir), str(side), tmp_path / "out")
    assert report["adapter_layout"] == "ster"
    check_against_peft(tmp_path / "out", state, bf16=False)


FUSED = {  # families whose projections are stored fused or inputs-first: PEFT adapts the stored module
    "phi3": (["qkv_proj", "o_proj", "gate_up_proj", "down_proj"], {}),
    "gpt2": (["c_attn", "c_proj", "c_fc"], {"n_positions": 64}),
    "gpt_neox": (["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"], {"num_key_value_heads": None}),
}


@pytest.mark.parametrize("family", list(FUSED))
def test_fused_and_inputs_first_projections_merge_and_apply_like_peft(family, tmp_path):
    targets, overrides = FUSED[family]
    base_dir, adapter_dir, state, adapted_logits, _ = peft_case(tmp_path / "c", model_type=family, targets=targets,
                                                                **overrides)
    report = merge_adapter(str(base_dir), str(adapter_dir), tmp_path / "m")
    check_against_peft(tmp_path / "m", state, bf16=False, base=base_dir, targets=targets, n_expected=12)
    assert report["merged_tensors"] == 12
    merged = load_model(str(tmp_path / "m")).decoder.forward(IDS)
    assert rel_err(merged, adapted_logits) < 1e-4
    loaded = load_model(str(base_dir))
    apply_adapter(loaded, load_adapter_for(str(adapter_dir), loaded))
    assert rel_err(loaded.decoder.forward(IDS), adapted_logits) < 1e-4


def test_ster_layout_q_k_v_merge_into_phi3_fused_rows(tmp_path):
    """Ster's adapters name q, k, v, gate, up: a merge puts each delta in its rows of the fused tensor."""
    targets, _ = FUSED["phi3"]
    base_dir, adapter_dir, state, _, _ = peft_case(tmp_path / "c", model_type="phi3", targets=targets)
    loaded = load_model(str(base_dir))
    ad = load_adapter_for(str(adapter_dir), loaded)  # PEFT's fused factors, split by role
    assert sorted({t for _, t in ad.factors}) == ["down", "gate", "k", "o", "q", "up", "v"]
    tensors = {}
    for (layer, role), (a, b) in ad.factors.items():
        tensors[f"layers.{layer}.{role}.a"], tensors[f"layers.{layer}.{role}.b"] = a, b
    (tmp_path / "ad").mkdir()
    save_file(tensors, str(tmp_path / "ad" / "phi.lora.safetensors"))
    (tmp_path / "ad" / "phi.lora.json").write_text(json.dumps({
        "model": str(base_dir), "rank": 4, "alpha": 8, "targets": ["q", "k", "v", "o", "gate", "up", "down"],
        "layers": [0, 1, 2], "hidden_size": 64}))
    merge_adapter(str(base_dir), str(tmp_path / "ad" / "phi.lora.json"), tmp_path / "m")
    check_against_peft(tmp_path / "m", state, bf16=False, base=base_dir, targets=targets, n_expected=12)


def test_the_readmes_ster_adapter_layout_loads_and_merges_as_it_says(tmp_path):
    """README's `ster tune merge` describes ster's own adapter (a new user found no schema for it): its example
    NAME.lora.json and the tensor names and shapes it gives, built on a tiny checkpoint (the example's model,
    width and no more changed), are read by --adapter and merged as the README says, weight + alpha / rank * b @ a."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    m = re.search(r"^ {6}(\{\"model\": .*?\})$", readme[readme.index("### `ster tune merge`"):], re.S | re.M)
    example = json.loads(m.group(1))
    assert set(example) == {"model", "model_revision", "rank", "alpha", "targets", "layers", "hidden_size"}
    base_dir = tmp_path / "base"
    make_checkpoint(base_dir, "llama")
    doc = {**example, "model": str(base_dir), "hidden_size": 64}
    rank, heads, kv_heads, head_dim, hidden = doc["rank"], 4, 2, 16, 64   # tiny.SMALL
    out = {"q": heads * head_dim, "v": kv_heads * head_dim}               # the README's [out, in] of q and v
    rng = np.random.default_rng(0)
    tensors = {}
    for n in doc["layers"]:
        for role in doc["targets"]:
            tensors[f"layers.{n}.{role}.a"] = (rng.standard_normal((rank, hidden)) * 0.1).astype(np.float32)
            tensors[f"layers.{n}.{role}.b"] = (rng.standard_normal((out[role], rank)) * 0.1).astype(np.float32)
    (tmp_path / "ad").mkdir()
    save_file(tensors, str(tmp_path / "ad" / "NAME.lora.safetensors"))
    (tmp_path / "ad" / "NAME.lora.json").write_text(json.dumps(doc))
    loaded = load_model(str(base_dir))
    ad = load_adapter_for(str(tmp_path / "ad" / "NAME"), loaded)
    assert sorted(ad.factors) == [(n, r) for n in doc["layers"] for r in sorted(doc["targets"])]
    merge_adapter(str(base_dir), str(tmp_path / "ad" / "NAME.lora.json"), tmp_path / "m")
    base, merged = load_file(str(base_dir / "model.safetensors")), load_file(str(tmp_path / "m" / "model.safetensors"))
    proj = {"q": "q_proj", "v": "v_proj"}
    for n in doc["layers"]:
        for role in doc["targets"]:
            name = f"model.layers.{n}.self_attn.{proj[role]}.weight"
            delta = doc["alpha"] / rank * tensors[f"layers.{n}.{role}.b"] @ tensors[f"layers.{n}.{role}.a"]
            assert np.abs(merged[name] - (base[name] + delta)).max() < 1e-5, name


def test_merged_dir_loads_in_transformers_and_ster_with_equal_logits(f32_case, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    base_dir, adapter_dir, _, adapted_logits, _ = f32_case
    merge_adapter(str(base_dir), str(adapter_dir), tmp_path / "m")
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "m"), dtype=torch.float32,
                                              attn_implementation="eager").eval()
    hf_logits, _ = reference_logits(hf, IDS)
    assert rel_err(hf_logits, adapted_logits) < 1e-5  # the merged checkpoint is PEFT's adapted model
    ours = load_model(str(tmp_path / "m")).decoder.forward(IDS)
    assert rel_err(ours, hf_logits) < 1e-5


def test_generate_adapter_equals_merged_model(f32_case, tmp_path):
    base_dir, adapter_dir, _, adapted_logits, merged_model = f32_case
    merge_adapter(str(base_dir), str(adapter_dir), tmp_path / "m")
    side = ster_layout_from_peft(adapter_dir, tmp_path / "ad", str(base_dir))
    for adapter in (str(adapter_dir), str(side)):  # PEFT's layout and Ster's
        loaded = load_model(str(base_dir))
        base_logits = loaded.decoder.forward(IDS)  # groups q/k/v and gate/up before the adapter wraps them
        apply_adapter(loaded, load_adapter_for(adapter, loaded))
        logits = loaded.decoder.forward(IDS)
        assert rel_err(logits, adapted_logits) < 1e-5  # PEFT's unmerged adapted model
        assert rel_err(base_logits, adapted_logits) > 1e-3  # the adapter changes something
    merged = load_model(str(tmp_path / "m")).decoder.forward(IDS)
    assert rel_err(logits, merged) < 1e-5
    # a library caller may give the path itself (it was an AttributeError), not anything else
    loaded = load_model(str(base_dir))
    assert apply_adapter(loaded, Path(adapter_dir)).rank > 0
    assert rel_err(loaded.decoder.forward(IDS), adapted_logits) < 1e-5
    with pytest.raises(SterError, match="takes a LoraAdapter"):
        apply_adapter(loaded, {"rank": 2})

    expected = reference_greedy(merged_model, IDS, 10)
    stop = expected.index(2) + 1 if 2 in expected else 10
    runs = [ster("generate", "--model", str(base_dir), "--prompt", PROMPT, "--max-new-tokens", "10", "--json",
                 "--adapter", str(adapter_dir)),
            ster("generate", "--model", str(tmp_path / "m"), "--prompt", PROMPT, "--max-new-tokens", "10", "--json")]
    for r in runs:
        assert r.returncode == 0, r.stderr
    with_adapter, from_merged = (json.loads(r.stdout)["ids"] for r in runs)
    assert with_adapter == from_merged == expected[:stop]


def test_sharded_output_loads_like_single_file(f32_case, tmp_path):
    base_dir, adapter_dir, state, _, _ = f32_case
    report = merge_adapter(str(base_dir), str(adapter_dir), tmp_path / "sh", max_shard_bytes=40_000)
    shards = sorted(p.name for p in (tmp_path / "sh").glob("model-*.safetensors"))
    assert len(shards) > 1 and "model.safetensors.index.json" in report["files"]
    index = json.loads((tmp_path / "sh" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(state) - ({"lm_head.weight"} - set(index["weight_map"]))
    merge_adapter(str(base_dir), str(adapter_dir), tmp_path / "one")
    assert rel_err(load_model(str(tmp_path / "sh")).decoder.forward(IDS),
                   load_model(str(tmp_path / "one")).decoder.forward(IDS)) == 0.0


def test_failed_merge_leaves_no_output_directory(f32_case, tmp_path, monkeypatch):
    import ster_py.tune.merge as merge_mod

    base_dir, adapter_dir, _, _, _ = f32_case
    real = merge_mod.write_safetensors

    def fail_midway(path, specs, arrays, metadata=None):
        def some():
            for k, a in enumerate(arrays):
                if k == 5:
                    raise OSError("No space left on device")
                yield a
        real(path, specs, some(), metadata)

    monkeypatch.setattr(merge_mod, "write_safetensors", fail_midway)
    with pytest.raises((OSError, SterError)):  # atomic_directory may word a full disk as "cannot write ..."
        merge_adapter(str(base_dir), str(adapter_dir), tmp_path / "out")
    assert list(tmp_path.iterdir()) == []  # neither the output nor its temporary sibling


@pytest.mark.parametrize("config, adapted", [
    ({"target_modules": ["q_proj", "down_proj"], "layers_to_transform": [0, 2]},
     {(0, "q"), (0, "down"), (2, "q"), (2, "down")}),
    ({"target_modules": ["v_proj", "gate_proj"], "layers_to_transform": 1, "layers_pattern": "layers"},
     {(1, "v"), (1, "gate")}),
    ({"target_modules": r"model\.layers\.1\.self_attn\.(k|o)_proj"}, {(1, "k"), (1, "o")}),
    ({"target_modules": ["model.layers.2.mlp.up_proj", "o_proj"], "layers_to_transform": [0],
      "exclude_modules": ["self_attn.q_proj"]}, {(0, "o"), (2, "up")}),
], ids=["layers", "one-layer-pattern", "regex", "full-name-exclude"])
def test_peft_config_selects_modules_as_peft_does(f32_case, tmp_path, config, adapted):
    """target_modules, layers_to_transform, layers_pattern and exclude_modules were ignored: ster applied and
    merged every factor in the file. PEFT adapts only the modules its config targets and ignores the file's
    other tensors (the file here holds all 21): ster's run-time adapter and merge give PeftModel's logits and
    merged weights, and say that the other factors are ignored."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base_dir, adapter_dir, _, _, _ = f32_case
    d = _peft_copy(adapter_dir, tmp_path / "sel", config)
    hf = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32, attn_implementation="eager")
    pm = PeftModel.from_pretrained(hf, str(d)).eval()
    with torch.no_grad():
        want = pm(torch.tensor([IDS])).logits[0].float().numpy()
    state = {k: v.detach().clone() for k, v in pm.merge_and_unload().state_dict().items()}
    loaded = load_model(str(base_dir))
    base_logits = loaded.decoder.forward(IDS)
    ad = load_adapter_for(str(d), loaded)
    assert set(ad.factors) == adapted
    assert any("its config does not adapt" in n and "ignored, as PEFT" in n for n in ad.notes), ad.notes
    apply_adapter(loaded, ad)
    got = loaded.decoder.forward(IDS)
    assert rel_err(got, want) < 1e-5 and rel_err(base_logits, want) > 1e-4
    report = merge_adapter(str(base_dir), str(d), tmp_path / "m")
    assert report["merged_tensors"] == len(adapted) and report["warnings"]
    check_against_peft(tmp_path / "m", state, bf16=False, base=base_dir, n_expected=21)
    assert rel_err(load_model(str(tmp_path / "m")).decoder.forward(IDS), want) < 1e-5


@pytest.mark.parametrize("config, words", [
    ({"target_modules": None}, "has no target_modules: PEFT would adapt its default modules"),
    ({"target_modules": 5}, "target_modules must be a string or a list of strings, got '5'"),
    ({"target_modules": "q_proj(", "layers_to_transform": None}, "target_modules 'q_proj\\(' is not a valid regular"),
    ({"target_modules": ".*q_proj", "layers_to_transform": [0]}, "cannot be used with a target_modules regex"),
    ({"layers_to_transform": "0"}, "layers_to_transform must be a layer number or a list of them, got '0'"),
    ({"layers_to_transform": [0], "layers_pattern": {"a": 1}}, "layers_pattern must be a string or a list"),
    ({"layers_pattern": "layers"}, "layers_pattern is given without layers_to_transform"),
    ({"layers_to_transform": [7]}, "holds no LoRA factors of a module its config adapts"),
    # regexes a backtracking match can take hours on (they were run as given); these three match fast, but
    # "(.*.*.*.*.*.*.*.*.*.*.*)*X" (test_peft_regexes_that_backtrack_for_hours_are_refused) never ended
    ({"target_modules": "(?:.*_proj)+", "layers_to_transform": None}, "holds a repetition inside a repetition"),
    ({"target_modules": "(?:q_|k_|v_)+proj", "layers_to_transform": None}, "holds alternatives inside a repetition"),
    ({"exclude_modules": ".*.*.*.*.*gate_proj"}, "exclude_modules .* holds 5 repetitions"),
])
def test_peft_selection_fields_are_checked(f32_case, tmp_path, config, words):
    base_dir, adapter_dir, _, _, _ = f32_case
    d = _peft_copy(adapter_dir, tmp_path / "bad", config)
    _refused(tmp_path, base_dir, d, words)
    r = ster("generate", "--model", str(base_dir), "--adapter", str(d), "-p", "w5", "--max-new-tokens", "1", "-q")
    assert r.returncode == 1 and r.stderr.startswith("error: PEFT adapter") and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("pattern, words", [
    ("(.*.*.*.*.*.*.*.*.*.*.*)*X", "a repetition inside a repetition"),   # ran for hours on model.layers.0...
    ("(?:a|aa)*X", "alternatives inside a repetition"),
    (".*.*.*.*.*.*.*.*.*X", "9 repetitions"),
    (r"(model)\.\1", "a back-reference"),
])
def test_peft_regexes_that_backtrack_for_hours_are_refused(pattern, words):
    from ster_py.adapters import _regex

    with pytest.raises(SterError, match=f"target_modules .* holds {words}.*, which can take hours"):
        _regex(pattern, "target_modules", "PEFT adapter x")
    for fine in (r".*\.(q_proj|k_proj|v_proj)", r"^(?!.*vision_tower).*(q_proj|v_proj)",
                 ".*decoder.*(SelfAttention|EncDecAttention).*(q|k|v|o)$", r"(?:^|.*?\.)layers\.(?P<idx>\d+)\."):
        assert _regex(fine, "target_modules", "PEFT adapter x").pattern == fine


@pytest.mark.parametrize("targets, module", [(["q_proj", "lm_head"], "lm_head"),
                                              (["v_proj", "embed_tokens"], "model.embed_tokens")])
def test_peft_adapter_of_the_head_or_embeddings_names_the_module(tmp_path, targets, module):
    """A PEFT adapter targeting lm_head or embed_tokens, saved with PEFT's defaults (which save the module's whole
    weight beside its factors, and an embedding's factors as lora_embedding_A/B), was refused as "tensor
    '...base_layer.weight' is not a LoRA factor": the module ster cannot adapt is now named, as it is when
    the file holds only lm_head's lora_A/lora_B."""
    _, adapter_dir, _, _, _ = peft_case(tmp_path, targets=targets)
    with safe_open(str(adapter_dir / "adapter_model.safetensors"), framework="numpy") as f:
        assert any(k.endswith((".base_layer.weight", ".lora_embedding_A")) for k in f.keys())  # PEFT's defaults
    _refused(tmp_path, tmp_path / "base", adapter_dir,
             rf"tensor 'base_model\.model\.{re.escape(module)}\.[a-z_AB.]+' is a (full copy of the weight|LoRA "
             rf"factor of the embedding).* of module 'base_model\.model\.{re.escape(module)}', which is not a "
             r"projection ster can adapt \(projections: model\.layers\.\{i\}\.self_attn\.q_proj, .*\); train "
             "the adapter without that module in target_modules$")


def test_library_calls_given_none_say_what_to_pass(f32_case, tmp_path):
    """merge_adapter and load_adapter_for given None (an unset variable in a script) raised TypeError or
    AttributeError; each is a SterError naming what to pass, and nothing is written."""
    base_dir, adapter_dir, _, _, _ = f32_case
    out = tmp_path / "out"
    cases = [
        (lambda: merge_adapter(None, str(adapter_dir), out), r"no model given \(--model is None\); pass a local"),
        (lambda: merge_adapter(str(base_dir), None, out),
         r"merge_adapter takes as adapter the adapter's path \(NAME\.lora\.json, or a PEFT adapter directory\), a "
         r"str or pathlib\.Path; got None"),
        (lambda: merge_adapter(str(base_dir), str(adapter_dir), None),
         r"merge_adapter takes as output the path of the directory to create, a str or pathlib\.Path; got None"),
        (lambda: load_adapter_for(None, load_model(str(base_dir))),
         r"load_adapter_for takes the adapter's path \(NAME\.lora\.json, or a PEFT adapter directory\)"),
        (lambda: load_adapter_for(str(adapter_dir), None), "load_adapter_for takes the model load_model returns"),
    ]
    for call, words in cases:
        with pytest.raises(SterError, match=words):
            call()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("overrides, words", [
    ({"num_hidden_layers": 1}, "adapts layer 1, but this model has layers 0..0"),
    ({"hidden_size": 128}, "layer 0 down maps 96 -> 64, but the model's down projection maps 96 -> 128"),
])
def test_apply_adapter_checks_an_adapter_loaded_for_another_model(f32_case, tmp_path, overrides, words):
    """apply_adapter(model, adapter) with an adapter load_adapter_for had checked against another model applied
    it unchecked: fewer layers were an IndexError after layer 0 had already been wrapped (the model changed), another
    width failed in the next forward pass with numpy's matmul error. The fit is checked first; nothing changes."""
    base_dir, adapter_dir, _, _, _ = f32_case
    ad = load_adapter_for(str(adapter_dir), load_model(str(base_dir)))
    make_checkpoint(tmp_path / "other", "llama", seed=3, **overrides)
    other = load_model(str(tmp_path / "other"))
    before = other.decoder.forward(IDS)
    with pytest.raises(SterError, match=words):
        apply_adapter(other, ad)
    assert other.decoder.revision == 0 and not other.notes
    assert np.array_equal(other.decoder.forward(IDS), before)
    with pytest.raises(SterError, match="^apply_adapter takes the model load_model returns as loaded, got None$"):
        apply_adapter(None, ad)


def test_merge_adapter_given_a_loaded_model_names_what_to_pass(f32_case, tmp_path):
    """merge_adapter(load_model(...), ...) said 'no model given (--model is LoadedModel(...' with the whole
    configuration in the message; it now asks for the model's name or path."""
    base_dir, adapter_dir, _, _, _ = f32_case
    with pytest.raises(SterError, match=r"^a loaded model was given where its name is read; pass the model's name "
                                        rf"or path \('{base_dir}': loaded.resolved.model\)$"):
        merge_adapter(load_model(str(base_dir)), str(adapter_dir), tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def _refused(tmp_path, model, adapter, words):
    out = tmp_path / "never"
    with pytest.raises(SterError, match=words):
        merge_adapter(str(model), str(adapter), out)
    assert not out.exists()


def test_merge_to_gguf_refuses_an_unconvertible_base_before_merging(f32_case, tmp_path, monkeypatch):
    """The tiny base's WordLevel tokenizer has no GGUF form. The refusal came from the conversion after the
    merge, naming the temporary merged copy (``.m.gguf.XXXX.merge/merged/tokenizer.json``, gone once the
    command ended); it now comes before any merge work and names the base's own tokenizer.json."""
    import ster_py.tune.merge as merge_mod
    from ster_py.tune.merge import merge_adapter_to_gguf

    base_dir, adapter_dir, _, _, _ = f32_case
    out = tmp_path / "m.gguf"
    r = ster("tune", "merge", "--model", str(base_dir), "--adapter", str(adapter_dir), "--output", str(out))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"error: {base_dir / 'tokenizer.json'}: a WordLevel tokenizer cannot be written")
    assert ".merge" not in r.stderr and list(tmp_path.iterdir()) == []
    monkeypatch.setattr(merge_mod, "merge_adapter", lambda *a, **k: pytest.fail("merged before the refusal"))
    with pytest.raises(SterError, match="WordLevel tokenizer cannot be written"):
        merge_adapter_to_gguf(str(base_dir), str(adapter_dir), out)
    assert list(tmp_path.iterdir()) == []


def test_merge_refusals(f32_case, tmp_path):
    base_dir, adapter_dir, _, _, _ = f32_case
    # Another model.
    other = ster_layout_from_peft(adapter_dir, tmp_path / "other", "org/another-model")
    _refused(tmp_path, base_dir, other, "made for model 'org/another-model'")
    # Width mismatch: the sidecar says so, or the factors do.
    wide = ster_layout_from_peft(adapter_dir, tmp_path / "wide", str(base_dir), hidden_size=128)
    _refused(tmp_path, base_dir, wide, "hidden_size 128.*64")
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    narrow = tmp_path / "narrow"
    narrow.mkdir()
    (narrow / "adapter_config.json").write_text(json.dumps(cfg))
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": np.zeros((4, 32), np.float32),
               "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": np.zeros((64, 4), np.float32)},
              str(narrow / "adapter_model.safetensors"))
    _refused(tmp_path, base_dir, narrow, "maps 32 -> 64.*64 -> 64")
    # A reward artifact.
    (tmp_path / "judge.reward.json").write_text(json.dumps({"format": "ster.reward", "model": str(base_dir)}))
    _refused(tmp_path, base_dir, tmp_path / "judge.reward.json", "reward artifact")
    # Other PEFT methods and LoRA variants, by name.
    for changes, words in (({"peft_type": "LOHA"}, "is LOHA"), ({"use_dora": True}, "DoRA")):
        d = tmp_path / f"peft-{words.split()[-1]}"
        d.mkdir()
        (d / "adapter_config.json").write_text(json.dumps({**cfg, **changes}))
        (d / "adapter_model.safetensors").write_bytes((adapter_dir / "adapter_model.safetensors").read_bytes())
        _refused(tmp_path, base_dir, d, words)
    # A GGUF base (the file is never read: the refusal comes first).
    (tmp_path / "base.gguf").write_bytes(b"GGUF")
    _refused(tmp_path, tmp_path / "base.gguf", adapter_dir, "refuses a GGUF base")
    # Existing output.
    (tmp_path / "exists").mkdir()
    with pytest.raises(SterError, match="already exists"):
        merge_adapter(str(base_dir), str(adapter_dir), tmp_path / "exists")


def test_shards_naming_one_tensor_twice_are_refused(f32_case, tmp_path):
    base_dir, adapter_dir, _, _, _ = f32_case
    dup = tmp_path / "dup"
    dup.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (dup / name).write_bytes((base_dir / name).read_bytes())
    tensors = load_file(str(base_dir / "model.safetensors"))
    names = sorted(tensors)
    save_file({n: tensors[n] for n in names[:10]}, str(dup / "model-00001-of-00002.safetensors"))
    save_file({n: tensors[n] for n in names[9:]}, str(dup / "model-00002-of-00002.safetensors"))
    _refused(tmp_path, dup, adapter_dir, f"{names[9]}.*stored twice")


def test_cli_refusal_is_one_line(f32_case, tmp_path):
    base_dir, adapter_dir, _, _, _ = f32_case
    (tmp_path / "base.gguf").write_bytes(b"GGUF")
    r = ster("tune", "merge", "--model", str(tmp_path / "base.gguf"), "--adapter", str(adapter_dir),
             "--output", str(tmp_path / "o"))
    assert r.returncode == 1 and r.stderr.startswith("error:") and "Traceback" not in r.stderr
    assert "GGUF base" in r.stderr and not (tmp_path / "o").exists()


@pytest.mark.real
def test_adapter_on_quantized_gguf_matches_its_f32_copy(smollm2_gguf, smollm2_hf, tmp_path, quantized_tiles_off):
    """A run-time LoRA wraps quantized projections too: on SmolLM2's GGUF it changes the logits
    exactly as on the f32 copy transformers made of the same file (same weights, dequantized; the GGUF's
    prompt on the float32 tile, conftest.quantized_tiles_off)."""
    from ster_py.prompt import encode_prompt

    rng = np.random.RandomState(3)
    tensors = {}
    for layer in (0, 15, 29):
        for role, (out, inp) in {"q": (576, 576), "v": (192, 576), "down": (576, 1536)}.items():
            tensors[f"layers.{layer}.{role}.a"] = (rng.standard_normal((8, inp)) * 0.05).astype(np.float32)
            tensors[f"layers.{layer}.{role}.b"] = (rng.standard_normal((out, 8)) * 0.05).astype(np.float32)
    results = []
    for model in (smollm2_gguf, smollm2_hf):
        d = tmp_path / Path(model).name
        d.mkdir()
        save_file(tensors, str(d / "x.lora.safetensors"))
        (d / "x.lora.json").write_text(json.dumps({"model": str(model), "rank": 8, "alpha": 16,
                                                   "targets": ["q", "v", "down"], "layers": [0, 15, 29],
                                                   "hidden_size": 576}))
        loaded = load_model(str(model))
        ids = encode_prompt(loaded.tokenizer, "The capital of France is", chat_template="off").ids
        plain = loaded.decoder.forward(ids)
        apply_adapter(loaded, load_adapter_for(str(d / "x.lora.json"), loaded))
        results.append((plain, loaded.decoder.forward(ids)))
    (g_plain, g_lora), (h_plain, h_lora) = results
    assert rel_err(g_lora - g_plain, h_lora - h_plain) < 1e-3 and rel_err(g_lora, g_plain) > 1e-3
    assert rel_err(g_lora, h_lora) < 1e-4


def _peft_copy(adapter_dir: Path, dest: Path, config=None, tensors=None) -> Path:
    """A copy of a PEFT adapter directory with its config's fields replaced and/or its tensors rewritten."""
    dest.mkdir(parents=True)
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    (dest / "adapter_config.json").write_text(json.dumps({**cfg, **(config or {})}))
    save_file(tensors if tensors is not None else load_file(str(adapter_dir / "adapter_model.safetensors")),
              str(dest / "adapter_model.safetensors"))
    return dest


def test_merge_refuses_weights_that_overflow_their_dtype(f32_case, tmp_path, monkeypatch):
    """A float16 weight stops at 65504: lora_alpha 4e6 makes the merged q/v weights infinite. PEFT's own
    safe_merge refuses the merge too; ster refuses it by tensor name and leaves nothing at --output."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base_dir, adapter_dir, _, _, _ = f32_case
    f16 = tmp_path / "f16"
    make_checkpoint(f16, "llama", dtype=torch.float16)
    big = _peft_copy(adapter_dir, tmp_path / "big", {"lora_alpha": 4e6, "base_model_name_or_path": str(f16)})
    hf = AutoModelForCausalLM.from_pretrained(str(f16), dtype=torch.float16)
    with pytest.raises(ValueError, match="NaNs detected"):  # PEFT checks isfinite under that message
        PeftModel.from_pretrained(hf, str(big)).merge_and_unload(safe_merge=True)
    _refused(tmp_path, f16, big, r"into 'model\.layers\.0\.mlp\.down_proj\.weight' gives non-finite weights: "
                                 r"the merged values overflow F16 .*scale \(1e\+06\) or factors are too large")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big", "f16"]  # no temporary sibling either
    gguf = tmp_path / "m.gguf"
    # the tiny base's WordLevel tokenizer has no GGUF form, a refusal that now comes first: skipped to reach the merge
    import ster_py.convert as convert_mod
    from ster_py.tune.merge import merge_adapter_to_gguf

    monkeypatch.setattr(convert_mod, "check_convertible", lambda resolved: None)
    with pytest.raises(SterError, match="^merging adapter"):
        merge_adapter_to_gguf(str(f16), str(big), gguf)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big", "f16"]
    # the same adapter at its trained alpha merges into the float16 base
    fine = _peft_copy(adapter_dir, tmp_path / "fine", {"base_model_name_or_path": str(f16)})
    assert merge_adapter(str(f16), str(fine), tmp_path / "ok")["dtype"] == "F16"


def test_delta_overflowing_float32_is_refused_for_merge_and_generate(f32_case, tmp_path):
    """Finite factors of 1e19 with alpha 4 make B @ A infinite in float32: refused on reading the adapter, so
    before a merge writes anything and before generate applies it."""
    base_dir, adapter_dir, _, _, _ = f32_case
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    q = "base_model.model.model.layers.1.self_attn.q_proj.lora_{}.weight"
    tensors[q.format("A")] = np.full_like(tensors[q.format("A")], 1e19)
    tensors[q.format("B")] = np.full_like(tensors[q.format("B")], 1e19)
    huge = _peft_copy(adapter_dir, tmp_path / "huge", {"lora_alpha": 4}, tensors)
    words = r"the delta of layer 1 q \(scale 1 \* B @ A, largest \|A\| 1e\+19, \|B\| 1e\+19\) overflows float32"
    _refused(tmp_path, base_dir, huge, words)
    loaded = load_model(str(base_dir))
    with pytest.raises(SterError, match=words):
        load_adapter_for(str(huge), loaded)
    r = ster("generate", "--model", str(base_dir), "--adapter", str(huge), "-p", "w5", "--max-new-tokens", "1",
             "--chat-template", "off", "-q")
    assert r.returncode == 1 and r.stderr.startswith("error: adapter") and "overflows float32" in r.stderr
    assert "Traceback" not in r.stderr and "Warning" not in r.stderr


def test_activations_an_adapter_overflows_are_one_error_line(f32_case, tmp_path):
    """lora_alpha 1e39 (a scale of 2.5e38, within float32, and a delta that fits it) overflows the activations:
    generate printed numpy's 'RuntimeWarning: overflow encountered in multiply' and the code line above its
    error. Now the error line alone (the logits are not finite)."""
    base_dir, adapter_dir, _, _, _ = f32_case
    huge = _peft_copy(adapter_dir, tmp_path / "huge", {"lora_alpha": 1e39})
    r = ster("generate", "--model", str(base_dir), "--adapter", str(huge), "-p", "w5 w6", "--max-new-tokens", "2",
             "--chat-template", "off", "-q")
    assert r.returncode == 1 and r.stderr.startswith("error: the model produced non-finite logits"), r.stderr
    assert r.stderr.count("\n") == 1 and "Warning" not in r.stderr, r.stderr


@pytest.mark.parametrize("dtype", ["complex64", "int64", "bool"])
def test_factors_that_are_not_floating_point_are_refused(f32_case, tmp_path, dtype):
    base_dir, adapter_dir, _, _, _ = f32_case
    tensors = {k: v.astype(dtype) for k, v in load_file(str(adapter_dir / "adapter_model.safetensors")).items()}
    bad = _peft_copy(adapter_dir, tmp_path / "bad", tensors=tensors)
    st = {"complex64": "C64", "int64": "I64", "bool": "BOOL"}[dtype]
    _refused(tmp_path, base_dir, bad, f"is stored as {st}; LoRA factors must be floating point")
    side = ster_layout_from_peft(bad, tmp_path / "ster", str(base_dir))  # Ster's layout too
    _refused(tmp_path, base_dir, side, f"is stored as {st}; LoRA factors must be floating point")


def test_float64_and_half_factors_are_accepted(f32_case, tmp_path):
    """PEFT saves factors in float32 or the model's float type: float64 factors of the same values merge as
    PEFT's float32 ones did, float16 and bfloat16 ones are read too."""
    base_dir, adapter_dir, state, _, _ = f32_case
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    wide = _peft_copy(adapter_dir, tmp_path / "f64", tensors={k: v.astype(np.float64) for k, v in tensors.items()})
    merge_adapter(str(base_dir), str(wide), tmp_path / "m64")
    check_against_peft(tmp_path / "m64", state, bf16=False, base=base_dir)
    loaded = load_model(str(base_dir))
    for dt in (np.float16, ml_dtypes.bfloat16):
        half = _peft_copy(adapter_dir, tmp_path / np.dtype(dt).name, tensors={k: v.astype(dt) for k, v in
                                                                            tensors.items()})
        assert len(load_adapter_for(str(half), loaded).factors) == 21


def test_two_factors_for_one_projection_are_refused(f32_case, tmp_path):
    """A second adapter name in one file ("lora_A.other.weight") used to replace the default one silently."""
    base_dir, adapter_dir, _, _, _ = f32_case
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    k = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    two = _peft_copy(adapter_dir, tmp_path / "two",
                     tensors={**tensors, k.replace(".weight", ".other.weight"): tensors[k] * 100})
    _refused(tmp_path, base_dir, two, r"tensors '.*q_proj\.lora_A(\.other)?\.weight' and '.*q_proj\.lora_A"
                                      r"(\.other)?\.weight' are both the lora_A of layer 0 q; a file must hold one")
    # Ster's layout: q and q_proj name one projection
    side = ster_layout_from_peft(adapter_dir, tmp_path / "ster", str(base_dir))
    weights = side.with_name("mine.lora.safetensors")
    st = load_file(str(weights))
    save_file({**st, "layers.0.q_proj.a": st["layers.0.q.a"] * 100}, str(weights))
    _refused(tmp_path, base_dir, side, r"are both the \.a factor of layer 0 q")


@pytest.mark.parametrize("key, value", [("use_rslora", "false"), ("use_rslora", 1), ("use_dora", "false"),
                                        ("fan_in_fan_out", 0), ("lora_bias", "no")])
def test_peft_switches_must_be_json_booleans(f32_case, tmp_path, key, value):
    """PEFT reads these switches by truthiness: "false" (a string) would mean rsLoRA, scale 4 instead of 2."""
    from ster_py.adapters import check_adapter_early

    base_dir, adapter_dir, _, _, _ = f32_case
    bad = _peft_copy(adapter_dir, tmp_path / "bad", {key: value})
    words = f"{key} must be true or false \\(a JSON boolean\\), got {str(value)!r}"
    _refused(tmp_path, base_dir, bad, words)
    with pytest.raises(SterError, match=words):  # the early check (a GGUF model, a preset) too
        check_adapter_early(str(bad), None, None)


def test_ster_sidecar_rslora_must_be_a_json_boolean(f32_case, tmp_path):
    base_dir, adapter_dir, _, _, _ = f32_case
    side = ster_layout_from_peft(adapter_dir, tmp_path / "ad", str(base_dir), rslora="false")
    _refused(tmp_path, base_dir, side, "rslora must be true or false")


@pytest.mark.parametrize("key, value", [("base_model_name_or_path", 0), ("revision", ["main"])])
def test_peft_base_model_and_revision_must_be_strings(f32_case, tmp_path, key, value):
    """A number as the base model's name ended generate and merge in a TypeError traceback (s18 fuzzing)."""
    from ster_py.adapters import load_adapter_for
    from ster_py.load import load_model

    base_dir, adapter_dir, _, _, _ = f32_case
    bad = _peft_copy(adapter_dir, tmp_path / "bad", {key: value})
    words = f"{key} must be a string or null"
    _refused(tmp_path, base_dir, bad, words)
    with pytest.raises(SterError, match=words):
        load_adapter_for(str(bad), load_model(str(base_dir)))


@pytest.mark.parametrize("key, value", [("model", 0), ("model_revision", 5)])
def test_ster_sidecar_model_and_revision_must_be_strings(f32_case, tmp_path, key, value):
    base_dir, adapter_dir, _, _, _ = f32_case
    side = ster_layout_from_peft(adapter_dir, tmp_path / "ad", **{"model": str(base_dir), key: value})
    _refused(tmp_path, base_dir, side, f"{key} must be a string or null")


@pytest.mark.parametrize("key, value, words", [
    ("targets", 5, "targets must be a list of projection names"),          # was a TypeError traceback
    ("targets", [["q_proj"]], "targets must be a list of projection names"),  # was a TypeError traceback
    ("targets", "qkvo", "targets must be a list of projection names"),     # passed as targets q, k, v, o
    ("layers", 5, "layers must be a list of layer numbers"),               # was a TypeError traceback
    ("layers", "012", "layers must be a list of layer numbers"),           # was a TypeError traceback
    ("layers", [True, 1, 2], "layers must be a list of layer numbers"),    # passed, true as layer 1
    ("hidden_size", "64", "hidden_size must be a positive integer"),       # "made for 64, but this model's is 64"
])
def test_ster_sidecar_targets_layers_and_width_are_checked_before_use(f32_case, tmp_path, key, value, words):
    base_dir, adapter_dir, _, _, _ = f32_case
    side = ster_layout_from_peft(adapter_dir, tmp_path / "ad", str(base_dir), **{key: value})
    _refused(tmp_path, base_dir, side, words)
    r = ster("tune", "merge", "--model", str(base_dir), "--adapter", str(side), "--output", str(tmp_path / "m"))
    assert r.returncode == 1 and r.stderr.startswith("error: adapter sidecar") and "Traceback" not in r.stderr


def test_alpha_zero_merges_with_a_warning(f32_case, tmp_path):
    """lora_alpha 0 is legal (scale 0) but makes the adapter a no-op: merged, with a warning in the report."""
    base_dir, adapter_dir, _, _, _ = f32_case
    zero = _peft_copy(adapter_dir, tmp_path / "zero", {"lora_alpha": 0})
    report = merge_adapter(str(base_dir), str(zero), tmp_path / "m")
    assert report["scale"] == 0.0 and len(report["warnings"]) == 1
    assert "has lora_alpha 0, so its scale is 0 and it changes nothing" in report["warnings"][0]
    merged, base = load_file(str(tmp_path / "m" / "model.safetensors")), load_file(str(base_dir / "model.safetensors"))
    assert all(np.array_equal(merged[n], base[n]) for n in base)
    r = ster("generate", "--model", str(base_dir), "--adapter", str(zero), "-p", "w5", "--max-new-tokens", "1",
             "--chat-template", "off", "-q")
    assert r.returncode == 0 and "warning: adapter" in r.stderr and "lora_alpha 0" in r.stderr


def test_a_base_model_name_no_path_can_be_is_a_name(f32_case, tmp_path):
    """A base_model_name_or_path too long to be a file name (over 255 bytes) ended generate --adapter and
    tune merge in OSError 'File name too long' (s18's adapter fuzzing): it is a name, like a Hub id, so the
    adapter applies with the different-name warning; a steering vector naming such a model is refused by name."""
    from ster_py.adapters import load_adapter_for
    from ster_py.artifacts import check_model
    from ster_py.load import load_model
    from ster_py.resolve import resolve

    base_dir, adapter_dir, _, _, _ = f32_case
    long = "q" * 5000
    named = _peft_copy(adapter_dir, tmp_path / "long", {"base_model_name_or_path": long})
    loaded = load_model(str(base_dir))
    assert any("names its base model" in n for n in load_adapter_for(str(named), loaded).notes)
    report = merge_adapter(str(base_dir), str(named), tmp_path / "merged")
    assert len(report["warnings"]) == 1
    with pytest.raises(SterError, match="was made for model"):
        check_model(tmp_path / "v.json", "steering vector", "/" + long, None, resolve(str(base_dir)))


def test_an_adapter_path_that_is_a_fifo_or_a_device_says_so(tmp_path):
    """--adapter naming a FIFO or a device was "not a LoRA adapter" (or "does not exist" as a NAME prefix), and a
    PEFT directory whose weights file is a FIFO had its weights "missing": each now says what the path is, as
    files.read_regular says for other files, before any weight is read."""
    import os

    make_checkpoint(tmp_path / "m", "llama")
    os.mkfifo(tmp_path / "pipe")
    os.mkfifo(tmp_path / "named.lora.json")
    (tmp_path / "peft").mkdir()
    (tmp_path / "peft" / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}))
    os.mkfifo(tmp_path / "peft" / "adapter_model.safetensors")
    (tmp_path / "peft2").mkdir()
    os.mkfifo(tmp_path / "peft2" / "adapter_config.json")
    cases = {tmp_path / "pipe": f"--adapter {tmp_path / 'pipe'} is a FIFO (named pipe), not a regular file",
             tmp_path / "named.lora.json": f"--adapter {tmp_path / 'named.lora.json'} is a FIFO (named pipe), not a "
                                          "regular file",
             tmp_path / "named": f"{tmp_path / 'named.lora.json'}: not a regular file",
             Path("/dev/null"): "--adapter /dev/null is a character device, not a regular file",
             tmp_path / "peft": f"adapter weights {tmp_path / 'peft' / 'adapter_model.safetensors'} are a FIFO (named "
                                "pipe), not a regular file",
             tmp_path / "peft2": f"{tmp_path / 'peft2' / 'adapter_config.json'}: not a regular file"}
    for adapter, words in cases.items():
        r = ster("generate", "--model", str(tmp_path / "m"), "-q", "-p", "w10", "--adapter", str(adapter))
        assert r.returncode == 1 and len(r.stderr.splitlines()) == 1 and words in r.stderr, (adapter, r.stderr)


@pytest.mark.parametrize("command", [["generate", "--prompt", PROMPT, "--max-new-tokens", "2"], ["chat"], ["serve"],
                                     ["tune", "merge", "--output", "merged"]])
def test_an_empty_adapter_is_refused_not_read_as_the_current_directory(f32_case, command):
    """`--adapter "$ADAPTER"` with the variable unset was Path("") = the current directory: run there, generate
    applied the adapter it held without a word (and tune merge merged it). Now "--adapter is empty" before
    anything loads."""
    base_dir, adapter_dir, *_ = f32_case
    r = subprocess.run([sys.executable, "-c", "from ster_py.cli import main; main()", *command,
                        "--model", str(base_dir), "--adapter", ""], input="w5\n", cwd=adapter_dir,
                       capture_output=True, text=True, timeout=120)   # serve, given the adapter, serves on
    assert r.returncode == 1 and r.stderr.startswith("error: --adapter is empty; give a path"), r.stderr
    assert len(r.stderr.splitlines()) == 1 and not (adapter_dir / "merged").exists()
    with pytest.raises(SterError, match="--adapter is empty"):   # the library's own check
        read_adapter("", None)
