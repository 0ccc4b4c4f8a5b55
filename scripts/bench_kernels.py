"""Decode row-dot throughput of the quantized kernels, per GGML type (a benchmark, not a test).

    python scripts/bench_kernels.py                          # this tree's build, every type
    python scripts/bench_kernels.py --against /path/to/other/tree Q4_K Q6_K
    python scripts/bench_kernels.py --levels avx2,avx512_vnni Q4_0 Q8_0 BF16   # instruction sets
    python scripts/bench_kernels.py --tokens 512 --levels avx2,avx512 Q4_K BF16  # mat-mat (prefill)
    python scripts/bench_kernels.py --layouts Q4_1 Q8_0 Q4_K     # rows in place vs 16-row interleaved

For each type: a random [rows, cols] matrix (gguf-py quantizes the legacy types, the rest
are random blocks with finite scales, as in tests/test_qmatmul.py), one token's product
repeated, best of several rounds, in billions of weights per second. With ``--against``,
the other tree's built ``qmatmul`` runs in the same process, the two alternating round by
round (this machine's speed drifts too much for separate runs to compare), and the
speed ratio ours / theirs is printed with the largest relative difference of the outputs.
With ``--levels A,B``, this build runs at instruction-set level A and B (names of
``qmatmul.SIMD_LEVELS``, capped at what the CPU runs) in the same way, B / A printed. With
``--layouts``, A is the matrix with its rows in place and B its 16-row interleaved copy
(``cython/ster_il16.h``; the types that have one), at the CPU's level (or STER_SIMD_LEVEL's).
BF16 and F16 are 16-bit float rows (safetensors weights used as stored). ``--tokens T``
times the T-token product (decoded panels and the register tile) instead of one token,
in GFLOP/s.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))  # this tree's ster_py (QUANT_TYPES), not whichever is installed


HALF = ("BF16", "F16")
HALF_IDS = {"BF16": 30, "F16": 1}   # GGML type ids of 16-bit float rows


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
    p.add_argument("--cols", type=int, default=2048, help="a multiple of the types' block size (256 for K-quants)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--against", type=Path, help="another source tree with built kernels (paired A/B)")
    p.add_argument("--levels", help="two instruction-set levels of this build to compare, e.g. avx2,avx512_vnni")
    p.add_argument("--tokens", type=int, default=1, help="tokens per product (1: decode row dots)")
    p.add_argument("--layouts", action="store_true", help="rows in place (A) vs the interleaved copy (B)")
    args = p.parse_args()
    kinds = tuple(QUANT_TYPES) + HALF
    bad = [t for t in args.types if t not in kinds]
    if bad:
        p.error(f"unknown type(s) {', '.join(bad)}; choose from {', '.join(kinds)}")
    if sum(map(bool, (args.against, args.levels, args.layouts))) > 1:
        p.error("--against, --levels and --layouts compare different things; give one")
    from test_qmatmul import random_blocks  # the tests' generator of valid random blocks

    from ster_py.gguf import quants

    # A whole number of every chosen type's blocks per row: 32 for the legacy types (SmolLM2's
    # hidden_size 576 is no multiple of 256), 256 for the K-quants; 32 for the 16-bit rows' tiles.
    block = max(32 if t in HALF else quants.ggml_type(t).block_size for t in args.types)
    if args.rows < 1 or args.cols < block or args.cols % block or args.threads < 1 or args.rounds < 1:
        p.error(f"--rows, --threads and --rounds must be at least 1, --cols a positive multiple of {block} "
                f"(the block size of {', '.join(args.types)})")

    ours = _load_qmatmul(ROOT, "ours")
    mods = [ours] + ([_load_qmatmul(args.against, "theirs")] if args.against else [])
    levels = [None]
    if args.levels:
        levels = args.levels.split(",")
        if len(levels) != 2 or any(lv not in ours.SIMD_LEVELS for lv in levels):
            p.error(f"--levels takes two of {', '.join(ours.SIMD_LEVELS)}")
        mods = [ours, ours]
        print("levels: " + " vs ".join(ours.set_simd_level(lv) for lv in levels) + f" (CPU: {ours.cpu_simd_level()})")
    if args.layouts:
        mods = [ours, ours]
        print(f"layouts: rows in place vs interleaved, at {ours.simd_level()}")
    for m in mods:
        m.set_threads(args.threads)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.tokens, args.cols)).astype(np.float32)
    n = args.rows * args.cols
    reps = 20 if args.tokens == 1 else 1
    for name in args.types:
        if name in HALF:
            dtype = ml_dtypes.bfloat16 if name == "BF16" else np.float16
            w = (rng.standard_normal((args.rows, args.cols)) * 0.05).astype(dtype)
            raw, type_id = w.view(np.uint8).reshape(args.rows, -1), HALF_IDS[name]
        else:
            raw, type_id = np.ascontiguousarray(random_blocks(name, args.rows, args.cols, rng)), quants.ggml_type(name).id
        if args.layouts:
            mats = [ours.QMatrix(raw, type_id, args.cols, None, False), ours.QMatrix(raw, type_id, args.cols)]
        else:
            mats = [m.QMatrix(raw, type_id, args.cols, None) for m in mods]
        outs = [np.empty((args.tokens, args.rows), np.float32) for _ in mods]
        best = [float("inf")] * len(mods)
        for _ in range(args.rounds):
            for i, (mat, out) in enumerate(zip(mats, outs)):
                if levels[0] is not None:
                    ours.set_simd_level(levels[i])
                t = time.perf_counter()
                for _ in range(reps):
                    mat.matmul(x, out)
                best[i] = min(best[i], (time.perf_counter() - t) / reps)
        unit, scale = ("Gweights/s", 1.0) if args.tokens == 1 else ("GFLOP/s", 2.0 * args.tokens)
        line = f"{name:7s} {scale * n / best[0] / 1e9:7.2f} {unit}"
        if len(mods) == 2:
            diff = float(np.abs(outs[0] - outs[1]).max() / max(np.abs(outs[1]).max(), 1e-30))
            ab = bool(args.levels or args.layouts)
            tag = "B" if ab else "theirs"
            line += (f"  {tag} {scale * n / best[1] / 1e9:7.2f}  {'B/A' if ab else 'ours/theirs'} "
                     f"{(best[0] / best[1]) if ab else (best[1] / best[0]):5.2f}  max rel diff {diff:.1e}")
        print(line)


if __name__ == "__main__":
    main()
