"""Build the synthetic mixture-of-experts model scripts/bench.py measures (issue 13).

A Qwen3-MoE-shaped decoder with random weights (transformers' own initialisation):
hidden 1024, 8 layers, 16 heads of 64 (4 key/value heads), 32 experts of width 512,
4 chosen per token, renormalised, vocabulary 32,000 (about 0.47 B parameters). It is
saved by transformers, converted to GGUF F16 by llama.cpp's own convert_hf_to_gguf.py
(from the pinned llama-cpp-python sdist, with the tests' minimal vocabulary) and
quantized to Q4_K_M by llama.cpp's own quantizer (``llama_model_quantize``, run out of
process by ``ster_py.llamacpp``). The result is cached:

    $STER_FIXTURES (or ~/.cache/ster-fixtures)/moe-bench/qwen3moe-0.5b-Q4_K_M.gguf

    python scripts/moe_bench_model.py            # prints the path (builds it once, ~3 min)
    python scripts/bench.py "$(python scripts/moe_bench_model.py)" --prompt-ids random

Random weights route tokens close to uniformly, which is what the benchmark wants: every
expert's matrices are read, as in a real model over a long prompt.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2048, num_hidden_layers=8,
              num_attention_heads=16, num_key_value_heads=4, head_dim=64, max_position_embeddings=4096,
              num_experts=32, num_experts_per_tok=4, moe_intermediate_size=512, norm_topk_prob=True,
              bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
NAME = "qwen3moe-0.5b"


def bench_dir() -> Path:
    return Path(os.environ.get("STER_FIXTURES") or Path.home() / ".cache" / "ster-fixtures").expanduser() / "moe-bench"


def build(ftype: str = "Q4_K_M") -> Path:
    """Path of the quantized model, built on first call (see the module docstring)."""
    out = bench_dir() / f"{NAME}-{ftype}.gguf"
    if out.is_file():
        return out
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from llamacpp_convert import extract_converter
    from ster_py import llamacpp
    from tiny import write_tokenizer

    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp = Path(tmp)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3_moe", **CONFIG))
        model.save_pretrained(tmp / "hf")
        write_tokenizer(tmp / "hf", CONFIG["vocab_size"])
        del model
        llama_cpp_dir = extract_converter(tmp)
        f16 = tmp / f"{NAME}-F16.gguf"
        r = subprocess.run([sys.executable, str(tmp / "convert.py"), str(llama_cpp_dir), "f16",
                            f"{tmp / 'hf'}::{f16}"], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"llama.cpp's converter failed:\n{r.stderr[-2000:]}")
        part = tmp / out.name
        llamacpp.quantize(f16, part, ftype)
        part.rename(out)  # complete files only
    (out.parent / f"{NAME}.json").write_text(json.dumps(CONFIG, indent=1))
    return out


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else "Q4_K_M"))
