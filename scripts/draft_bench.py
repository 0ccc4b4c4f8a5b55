"""Measure speculative decoding (``generate --draft``) on a synthetic target/drafter pair (issue 16).

A benchmark, not a test: it prints figures and checks only that both runs give the same ids.

The pair: a Llama-shaped target with random weights (``--hidden`` 512, ``--layers`` 12, hidden/64 heads
of 64, half as many key/value heads, feed-forward 3 x hidden, vocabulary 8,000, ``--dtype`` safetensors read as stored:
bfloat16 by default), whose layers from
``--keep`` on have their output projections (o_proj, down_proj) scaled by ``--damp``; the drafter
is the target cut after its first ``--keep`` layers (the same embedding, layers, final norm and
head). ``--damp`` sets how often the two agree: 0 would make them equal, 1 leaves the deep layers
at full strength (the drafter then rarely agrees). Real drafters are trained to agree, which this
imitates without training.

Per round, alternating: plain greedy decoding of ``--new-tokens`` ids after a ``--prompt-tokens``
random prompt, then the same with the drafter at each ``--draft-max``. Printed: the median decode
seconds of each, the speed-up (plain / drafted), drafted and accepted counts and the acceptance
rate, the CPU and the load average at the start and after each round.

    python scripts/draft_bench.py --threads 2 --rounds 3
    python scripts/draft_bench.py --threads 2 --layers 20 --keep 1 --damp 0   # target ~9x the drafter, always agreeing
    python scripts/draft_bench.py --damp 1.0     # a drafter that rarely agrees: the overhead
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build(out: Path, layers: int, keep: int, damp: float, dtype: str = "bfloat16", hidden: int = 512) -> tuple[Path, Path]:
    """Write the target and the drafter checkpoints under ``out``; return their directories."""
    sys.path.insert(0, str(ROOT / "tests"))
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tiny import write_tokenizer

    cfg = dict(vocab_size=8000, hidden_size=hidden, intermediate_size=3 * hidden, num_attention_heads=hidden // 64,
               num_key_value_heads=hidden // 128, head_dim=64, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2,
               tie_word_embeddings=False)
    torch.manual_seed(0)
    target = LlamaForCausalLM(LlamaConfig(num_hidden_layers=layers, **cfg)).eval()
    with torch.no_grad():
        for i in range(keep, layers):
            target.model.layers[i].self_attn.o_proj.weight.mul_(damp)
            target.model.layers[i].mlp.down_proj.weight.mul_(damp)
    drafter = LlamaForCausalLM(LlamaConfig(num_hidden_layers=keep, **cfg)).eval()
    drafter.load_state_dict({k: v for k, v in target.state_dict().items()
                             if not k.startswith("model.layers.") or int(k.split(".")[2]) < keep})
    paths = out / "target", out / "drafter"
    for model, path in zip((target, drafter), paths):
        model.to(getattr(torch, dtype)).save_pretrained(path)
        write_tokenizer(path, cfg["vocab_size"])
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--keep", type=int, default=2, help="the drafter's layers (the target's first ones)")
    ap.add_argument("--damp", type=float, default=0.1, help="scale of the deeper layers' output projections")
    ap.add_argument("--draft-max", default="2,4,8", help="comma-separated proposals per round to measure")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--hidden", type=int, default=512, help="width (heads of 64, feed-forward 3x, a multiple of 128)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                    help="the checkpoints' weights, read as stored (bfloat16/float16: the Cython products)")
    ap.add_argument("--quantize", default=None, help="quantize both models' projections at load: q8_0, q4_0 or q4_k")
    a = ap.parse_args()
    if a.threads:
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(a.threads)
    sys.path.insert(0, str(ROOT))
    import numpy as np

    from ster_py.decoder.qlinear import get_threads, set_threads
    from ster_py.generate import Sampling, generate
    from ster_py.load import load_model
    from ster_py.speculative import ModelDrafter

    set_threads(a.threads or get_threads())  # ster's pool, and numpy's BLAS/OpenMP pools (threadpoolctl)
    with tempfile.TemporaryDirectory() as tmp:
        t_dir, d_dir = build(Path(tmp), a.layers, a.keep, a.damp, a.dtype, a.hidden)
        target, drafter = (load_model(str(p), precision="auto", quantize=a.quantize) for p in (t_dir, d_dir))
        prompt = np.random.RandomState(0).randint(3, 8000, size=a.prompt_tokens).tolist()
        sampling = Sampling(max_new_tokens=a.new_tokens)
        ks = [int(k) for k in a.draft_max.split(",")]
        generate(target.decoder, prompt, Sampling(max_new_tokens=4))  # warm the kernels and the maps
        loads = [os.getloadavg()[0]]
        plain_s: list[float] = []
        runs: dict[int, list] = {k: [] for k in ks}
        for _ in range(a.rounds):
            plain = generate(target.decoder, prompt, sampling)
            plain_s.append(plain.decode_seconds)
            for k in ks:
                g = generate(target.decoder, prompt, sampling, draft=ModelDrafter(drafter.decoder, 8000), n_draft=k)
                if g.ids != plain.ids:
                    sys.exit(f"draft-max {k}: the ids differ from plain greedy decoding")
                runs[k].append(g)
            loads.append(os.getloadavg()[0])
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    base = statistics.median(plain_s)
    print(f"CPU: {cpu}; threads: {a.threads or 'default'}; load average (1 min) at the start and after each round: "
          + " | ".join(f"{x:.2f}" for x in loads))
    print(f"target {a.layers} layers ({a.dtype}, quantize {a.quantize}), drafter its first {a.keep}, deeper outputs "
          f"x {a.damp}; prompt {a.prompt_tokens}, "
          f"{a.new_tokens} new ids, {a.rounds} rounds (medians)")
    print(f"plain greedy: decode {base:.3f} s ({(a.new_tokens - 1) / base:.1f} tok/s)")
    for k in ks:
        s = statistics.median(g.decode_seconds for g in runs[k])
        g = runs[k][0]
        print(f"--draft-max {k}: decode {s:.3f} s, speed-up {base / s:.2f}x; accepted {g.accepted} of {g.drafted} "
              f"drafted ({g.acceptance_rate:.0%}); {(len(g.ids) - 1) / max(1, g.draft_rounds):.2f} ids per target call")


if __name__ == "__main__":
    main()
