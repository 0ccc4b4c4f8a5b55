"""Decode row-dot throughput of the quantized kernels, per GGML type (a benchmark, not a test).

    python scripts/bench_kernels.py                          # this tree's build, every type
    python scripts/bench_kernels.py --against /path/to/other/tree Q4_K Q6_K

For each type: a random [rows, cols] matrix (gguf-py quantizes the legacy types, the rest
are random blocks with finite scales, as in tests/test_qmatmul.py), one token's product
repeated, best of several rounds, in billions of weights per second. With ``--against``,
the other tree's built ``qmatmul`` runs in the same process, the two alternating round by
round (this machine's speed drifts too much for separate runs to compare), and the
speed ratio ours / theirs is printed with the largest relative difference of the outputs.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))  # this tree's ster_py (QUANT_TYPES), not whichever is installed


def _load_qmatmul(tree: Path, tag: str):
    """The ``qmatmul`` extension built in ``tree`` under its own module name."""
    found = sorted((tree / "ster_py" / "_kernels").glob("qmatmul*.so"))
    if not found:
        raise SystemExit(f"no built qmatmul in {tree}: run `python setup.py build_ext --inplace` there")
    spec = importlib.util.spec_from_file_location(f"{tag}.qmatmul", found[0])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    from ster_py.decoder.qlinear import QUANT_TYPES

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("types", nargs="*", default=list(QUANT_TYPES))
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--cols", type=int, default=2048, help="a multiple of 256")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--against", type=Path, help="another source tree with built kernels (paired A/B)")
    args = p.parse_args()
    bad = [t for t in args.types if t not in QUANT_TYPES]
    if bad:
        p.error(f"unknown type(s) {', '.join(bad)}; choose from {', '.join(QUANT_TYPES)}")
    if args.rows < 1 or args.cols < 256 or args.cols % 256 or args.threads < 1 or args.rounds < 1:
        p.error("--rows, --threads and --rounds must be at least 1, --cols a positive multiple of 256")

    from test_qmatmul import random_blocks  # the tests' generator of valid random blocks

    from ster_py.gguf import quants

    mods = [_load_qmatmul(ROOT, "ours")] + ([_load_qmatmul(args.against, "theirs")] if args.against else [])
    for m in mods:
        m.set_threads(args.threads)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, args.cols)).astype(np.float32)
    n = args.rows * args.cols
    for name in args.types:
        raw = np.ascontiguousarray(random_blocks(name, args.rows, args.cols, rng))
        mats = [m.QMatrix(raw, quants.ggml_type(name).id, args.cols, None) for m in mods]
        outs = [np.empty((1, args.rows), np.float32) for _ in mods]
        best = [float("inf")] * len(mods)
        for _ in range(args.rounds):
            for i, (mat, out) in enumerate(zip(mats, outs)):
                t = time.perf_counter()
                for _ in range(20):
                    mat.matmul(x, out)
                best[i] = min(best[i], (time.perf_counter() - t) / 20)
        line = f"{name:7s} {n / best[0] / 1e9:6.2f} Gweights/s"
        if args.against:
            diff = float(np.abs(outs[0] - outs[1]).max() / max(np.abs(outs[1]).max(), 1e-30))
            line += f"  theirs {n / best[1] / 1e9:6.2f}  ours/theirs {best[1] / best[0]:5.2f}  max rel diff {diff:.1e}"
        print(line)


if __name__ == "__main__":
    main()
