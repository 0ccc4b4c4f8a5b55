"""Build the synthetic latent-attention model scripts/bench.py measures (issue 14).

DeepSeek-V2-Lite's shape (its config.json: hidden 2048, 27 layers, 16 heads, kv_lora_rank 512, no
query bottleneck, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, the first layer dense
10,944 wide, the others routed to 6 experts 1,408 wide beside 2 shared ones, greedy softmax routing,
its YaRN rotation, vocabulary 102,400) with random weights (transformers' own initialisation), except
that each routed layer holds 8 experts instead of 64. A decoded token reads the same weights either
way (6 routed and 2 shared experts per layer, every projection of the attention, the head), so decode
work is V2-Lite's, while the file is 1.6 GB instead of 10 (and the model can be built in 23 GB of
memory). It is saved by transformers in bfloat16, converted to GGUF F16 by llama.cpp's own
convert_hf_to_gguf.py (the pinned llama-cpp-python sdist, with the tests' minimal vocabulary; the
converter splits kv_b per head, attn_k_b / attn_v_b) and quantized to Q4_K_M by llama.cpp's own
quantizer (``llama_model_quantize``, out of process through ``ster_py.llamacpp``). The result is
cached:

    $STER_FIXTURES (or ~/.cache/ster-fixtures)/mla-bench/deepseek2-lite-shape-Q4_K_M.gguf

    python scripts/mla_bench_model.py            # prints the path (builds it once, ~15 min on 2 cores)
    python scripts/bench.py "$(python scripts/mla_bench_model.py)" --prompt-ids random --threads 2

With 27 layers llama.cpp reads the file as DeepSeek-V2-Lite (no query bottleneck), as it reads the
real one.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = dict(vocab_size=102400, hidden_size=2048, intermediate_size=10944, num_hidden_layers=27,
              num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=None,
              qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=8, n_shared_experts=2,
              num_experts_per_tok=6, moe_intermediate_size=1408, first_k_dense_replace=1, topk_method="greedy",
              routed_scaling_factor=1.0, norm_topk_prob=False, max_position_embeddings=163840, rms_norm_eps=1e-6,
              rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                               "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
                               "mscale": 0.707, "mscale_all_dim": 0.707},
              bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
NAME = "deepseek2-lite-shape"


def bench_dir() -> Path:
    return Path(os.environ.get("STER_FIXTURES") or Path.home() / ".cache" / "ster-fixtures").expanduser() / "mla-bench"


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
        cfg = AutoConfig.for_model("deepseek_v2", **CONFIG)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
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
        llamacpp.quantize(f16, part, ftype, timeout=7200)  # 6 GB of F16 on a shared 2-core machine
        part.rename(out)  # complete files only
    (out.parent / f"{NAME}.json").write_text(json.dumps(CONFIG, indent=1))
    return out


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else "Q4_K_M"))
