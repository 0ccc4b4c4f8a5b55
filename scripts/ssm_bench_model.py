"""Build the synthetic state-space models scripts/bench.py measures (issue 15).

Also a Qwen3.5-0.8B-shaped hybrid (``qwen3_5_text``: 18 gated delta nets, 6 gated attention
layers; sizes in CONFIGS), cached as qwen3.5-0.8b-shape-Q4_K_M.gguf beside the others.

Mamba-130M- and Mamba-2-130M-shaped decoders with random weights (transformers' own
initialisation, which sets A_log, D and the step's bias as Mamba does): hidden 768, 24
layers, vocabulary 32,000; Mamba: d_inner 1536, d_state 16, d_conv 4, step rank 48;
Mamba-2: 24 heads of 64, d_state 128, one group, d_conv 4. Each is saved by transformers,
converted to GGUF F16 by llama.cpp's own convert_hf_to_gguf.py (from the pinned
llama-cpp-python sdist, with the tests' minimal vocabulary) and quantized to Q4_K_M by
llama.cpp's quantizer (run out of process by ``ster_py.llamacpp``). Cached at:

    $STER_FIXTURES (or ~/.cache/ster-fixtures)/ssm-bench/{mamba,mamba2}-130m-Q4_K_M.gguf

    python scripts/ssm_bench_model.py mamba2      # prints the path (builds it once)
    python scripts/bench.py "$(python scripts/ssm_bench_model.py mamba2)" --prompt-ids random
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMON = dict(vocab_size=32000, hidden_size=768, num_hidden_layers=24, conv_kernel=4, expand=2,
              bos_token_id=1, eos_token_id=2)
CONFIGS = {"mamba": dict(COMMON, state_size=16, time_step_rank=48, tie_word_embeddings=True),
           "mamba2": dict(COMMON, state_size=128, num_heads=24, head_dim=64, n_groups=1,
                          tie_word_embeddings=False),
           # Qwen3.5-0.8B's shape (seed 000: 6 of 24 layers attend with 2 key/value heads of 256; the
           # gated delta nets' 16 heads of 128 make its 20.2 MB recurrent state), vocabulary 248,320
           "qwen3_5_text": dict(vocab_size=248320, hidden_size=1024, num_hidden_layers=24, intermediate_size=3584,
                                num_attention_heads=8, num_key_value_heads=2, head_dim=256,
                                full_attention_interval=4, linear_num_key_heads=16, linear_num_value_heads=16,
                                linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                                max_position_embeddings=4096, tie_word_embeddings=True,
                                bos_token_id=1, eos_token_id=2)}
NAMES = {"mamba": "mamba-130m", "mamba2": "mamba2-130m", "qwen3_5_text": "qwen3.5-0.8b-shape"}


def bench_dir() -> Path:
    return Path(os.environ.get("STER_FIXTURES") or Path.home() / ".cache" / "ster-fixtures").expanduser() / "ssm-bench"


def build(kind: str = "mamba2", ftype: str = "Q4_K_M") -> Path:
    """Path of the quantized model of ``kind`` ("mamba" or "mamba2"), built on first call."""
    config, name = CONFIGS[kind], NAMES[kind]
    out = bench_dir() / f"{name}-{ftype}.gguf"
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
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **config))
        model.save_pretrained(tmp / "hf")
        saved = json.loads((tmp / "hf" / "config.json").read_text())
        (tmp / "hf" / "config.json").write_text(json.dumps(dict(saved, _llamacpp_args=["--no-mtp"])))
        write_tokenizer(tmp / "hf", config["vocab_size"])
        del model
        llama_cpp_dir = extract_converter(tmp)
        f16 = tmp / f"{name}-F16.gguf"
        r = subprocess.run([sys.executable, str(tmp / "convert.py"), str(llama_cpp_dir), "f16",
                            f"{tmp / 'hf'}::{f16}"], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"llama.cpp's converter failed:\n{r.stderr[-2000:]}")
        part = tmp / out.name
        llamacpp.quantize(f16, part, ftype)
        part.rename(out)  # complete files only
    (out.parent / f"{name}.json").write_text(json.dumps(config, indent=1))
    return out


if __name__ == "__main__":
    print(build(*sys.argv[1:]))
