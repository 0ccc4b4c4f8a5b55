"""Logit error of ``--quantize`` on a real checkpoint, next to llama.cpp's own files of the same weights.

For a preset (scripts/real_models.py: its Hugging Face f32 copy), on a few English prompts:

- the reference: transformers' float32 logits at every position;
- ster ``load_model(dir, quantize=q8_0 | q4_0 | q4_k)`` on that checkpoint;
- llama.cpp: its converter (convert_hf_to_gguf.py of the pinned sources) writes the checkpoint as
  an F32 GGUF, its quantizer (``llamacpp.quantize``) makes Q8_0, Q4_0 and Q4_K_S / Q4_K_M files of
  it, and llama.cpp evaluates them (``llamacpp.logits``, its own CPU kernels).

Printed per engine and type: relative error ||ours - ref|| / ||ref|| over all positions' logits
and the share of positions whose argmax equals the reference's. A measurement, not a test.

    python scripts/quantize_error.py smollm2-135m-instruct-q4_1 [--work /tmp/qerr]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

PROMPTS = ("The history of astronomy is a long story of people looking up at the night sky.",
           "def fibonacci(n):\n    if n < 2:\n        return n\n",
           "Water boils at a lower temperature on a mountain because the air pressure is")
CONVERTER = Path("/work/tmp/llama_cpp_python-0.3.36/vendor/llama.cpp")


def rel(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - ref) / np.linalg.norm(ref))


def main() -> None:
    import real_models

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("preset")
    p.add_argument("--work", default="/tmp/ster-quantize-error")
    p.add_argument("--llama-cpp-src", default=str(CONVERTER), help="llama.cpp sources (convert_hf_to_gguf.py)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ster_py import llamacpp
    from ster_py.decoder.qlinear import set_threads
    from ster_py.load import load_model

    torch.set_num_threads(args.threads)
    set_threads(args.threads)
    hf = real_models.hf_path(args.preset)
    work = Path(args.work) / args.preset
    work.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(hf)
    prompts = [tok(t, add_special_tokens=True)["input_ids"] for t in PROMPTS]
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    with torch.inference_mode():
        refs = [model(torch.tensor([ids])).logits[0].double().numpy() for ids in prompts]
    del model

    f32 = work / "f32.gguf"
    if not f32.is_file():
        src = Path(args.llama_cpp_src)
        subprocess.run([sys.executable, str(src / "convert_hf_to_gguf.py"), str(hf), "--outtype", "f32",
                        "--outfile", str(f32)], check=True, env={"PYTHONPATH": str(src / "gguf-py"),
                                                                "PATH": "/usr/bin:/bin"})

    def score(name: str, outs: list) -> dict:
        err = rel(np.concatenate(outs), np.concatenate(refs))
        agree = float(np.mean(np.concatenate([o.argmax(-1) == r.argmax(-1) for o, r in zip(outs, refs)])))
        print(f"{name:28s} rel error {err:.5f}   argmax agreement {agree:.3f}", flush=True)
        return {"name": name, "rel_error": err, "argmax_agreement": agree}

    rows = [score("llama.cpp F32 (converted)", llamacpp.logits(f32, prompts, threads=args.threads))]
    for ftype in ("Q8_0", "Q4_0", "Q4_K_S", "Q4_K_M"):
        q = work / f"{ftype}.gguf"
        if not q.is_file():
            llamacpp.quantize(f32, q, ftype, threads=args.threads)
        rows.append(score(f"llama.cpp {ftype}", llamacpp.logits(q, prompts, threads=args.threads)))
    for kind in ("q8_0", "q4_0", "q4_k"):
        m = load_model(str(hf), quantize=kind)
        rows.append(score(f"ster --quantize {kind}", [m.decoder.forward(ids) for ids in prompts]))
    m = load_model(str(hf))
    rows.append(score("ster f32", [m.decoder.forward(ids) for ids in prompts]))
    (work / "quantize_error.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
