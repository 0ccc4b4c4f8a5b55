"""What quantization costs: perplexity and KL divergence of ster's quantizations against the F16 file.

    python scripts/quant_quality.py [--text FILE] [--ctx 512] [--model DIR] [--out DIR]

Converts the model (default: the SmolLM2-135M-Instruct Hugging Face copy the tests build, see
scripts/real_models.py) with ``ster convert`` to F16, Q8_0, Q6_K, Q4_K_M and Q4_0 and prints a Markdown
table: ster's perplexity of each file on the text (llama-perplexity's windows), llama.cpp's perplexity of the
same file (its own computation, through llama-cpp-python), and ster's KL divergence, RMS Δp and top-1 agreement
of each quantization against the F16 file. The default text is the GNU GPL version 3
(/usr/share/common-licenses/GPL-3 on Debian and Ubuntu).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

TYPES = ("f16", "q8_0", "q6_k", "q4_k_m", "q4_0")


def main() -> None:
    from ster_py import llamacpp
    from ster_py.convert import convert_model
    from ster_py.load import load_model
    from ster_py.perplexity import perplexity

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--model", default=None, help="checkpoint directory (default: SmolLM2's HF copy)")
    ap.add_argument("--out", default="/tmp/ster-quant-quality")
    args = ap.parse_args()
    if args.model is None:
        sys.path.insert(0, str(_ROOT / "scripts"))
        import real_models

        args.model = str(real_models.hf_path(real_models.SMOLLM2))
    text = Path(args.text).read_text(encoding="utf-8")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for t in TYPES:
        path = out / f"model-{t}.gguf"
        if not path.exists():
            convert_model(args.model, path, t)
        files[t] = path
    reference = load_model(str(files["f16"]))
    rows = []
    for t in TYPES:
        t0 = time.perf_counter()
        model = reference if t == "f16" else load_model(str(files[t]))
        r = perplexity(model, text, args.ctx, reference=None if t == "f16" else reference)
        lc = llamacpp.perplexity(files[t], text, args.ctx)
        rows.append((t, files[t].stat().st_size, r, lc["ppl"]))
        print(f"{t}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    r0 = rows[0][2]
    print(f"Text: {args.text} ({r0['text_tokens']} tokens), {r0['chunks']} windows of {args.ctx}, "
          f"{r0['tokens']} scored tokens.\n")
    print("| type | size (MiB) | PPL (ster) | PPL (llama.cpp) | mean KLD vs F16 | RMS Δp | same top token |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for t, size, r, lc in rows:
        kld = "-" if t == "f16" else f"{r['kld_mean']:.5f} ± {r['kld_uncertainty']:.5f}"
        dp = "-" if t == "f16" else f"{100 * r['dp_rms']:.2f} %"
        top = "-" if t == "f16" else f"{100 * r['same_top']:.2f} %"
        print(f"| {t.upper()} | {size / 2**20:.1f} | {r['ppl']:.4f} ± {r['ppl_uncertainty']:.4f} | {lc:.4f} | "
              f"{kld} | {dp} | {top} |")


if __name__ == "__main__":
    main()
