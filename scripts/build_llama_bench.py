"""Build llama.cpp's own ``llama-bench`` (and its shared ``libllama``) for this CPU, without AMX.

The reference engine of ``scripts/bench.py --reference llama-bench``. llama-cpp-python's
wheel is a portable AVX2 build, and its native build crashes on hosts with AMX tiles; this
builds the same pinned llama.cpp sources (the ones llama-cpp-python 0.3.36 vendors) with
every x86 feature the host has that ggml can use *except* AMX, named one by one
(``GGML_NATIVE=OFF``, so ``-march=native`` cannot switch AMX on behind our back):

    host flag (/proc/cpuinfo)      ggml CMake option
    sse4_2, avx, avx2, fma, f16c   GGML_SSE42, GGML_AVX, GGML_AVX2, GGML_FMA, GGML_F16C
    bmi2                           GGML_BMI2
    avx_vnni                       GGML_AVX_VNNI
    avx512f + cd + vl + dq + bw    GGML_AVX512
    avx512vbmi, avx512_vnni, _bf16  GGML_AVX512_VBMI / GGML_AVX512_VNNI / GGML_AVX512_BF16
    amx_*                          GGML_AMX_TILE / _INT8 / _BF16 always OFF

Usage (the build takes 5-15 minutes on two cores; run it outside the repository):

    python scripts/build_llama_bench.py --sdist /work/tmp/sdist/llama_cpp_python-0.3.36.tar.gz \\
        --out /work/tmp/llama-bench-build
    python scripts/build_llama_bench.py --src /path/to/llama.cpp --out DIR --print-flags   # flags only

It prints the directory holding ``llama-bench`` and ``libllama.so`` (``DIR/build/bin``);
give it to ``scripts/bench.py --llama-bench DIR/build/bin``. A ``ster-build.json`` beside
them records the sources, the options and the host's CPU model. Nothing in the
repository is written.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

# (host flags that must all be present, ggml option)
FEATURES = (
    (("sse4_2",), "GGML_SSE42"),
    (("avx",), "GGML_AVX"),
    (("avx2",), "GGML_AVX2"),
    (("fma",), "GGML_FMA"),
    (("f16c",), "GGML_F16C"),
    (("bmi2",), "GGML_BMI2"),
    (("avx_vnni",), "GGML_AVX_VNNI"),
    (("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"), "GGML_AVX512"),
    (("avx512f", "avx512vbmi"), "GGML_AVX512_VBMI"),
    (("avx512f", "avx512_vnni"), "GGML_AVX512_VNNI"),
    (("avx512f", "avx512_bf16"), "GGML_AVX512_BF16"),
)
# What an AVX2-only x86-64 CPU (Haswell to Zen 3) offers ggml.
AVX2_ERA = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"})
ALWAYS_OFF = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16", "GGML_NATIVE", "GGML_CPU_ALL_VARIANTS",
              "GGML_BACKEND_DL", "LLAMA_CURL", "LLAMA_BUILD_TESTS", "LLAMA_BUILD_EXAMPLES", "LLAMA_BUILD_SERVER",
              "LLAMA_BUILD_APP", "GGML_CUDA", "GGML_VULKAN", "GGML_METAL", "GGML_BLAS", "LLAMA_OPENSSL")


def cpu_info() -> tuple[str, set[str]]:
    """(model name, flag set) of this host from /proc/cpuinfo ('' and {} elsewhere)."""
    model, flags = platform.processor() or "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model.strip():
                model = value.strip()
            elif key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    return model, flags


def cmake_options(flags: set[str]) -> dict[str, str]:
    """ggml/llama CMake -D options for a host with ``flags`` (AMX and native tuning off)."""
    opts = {name: "ON" if all(f in flags for f in need) else "OFF" for need, name in FEATURES}
    opts.update({name: "OFF" for name in ALWAYS_OFF})
    opts.update(BUILD_SHARED_LIBS="ON", LLAMA_BUILD_TOOLS="ON", LLAMA_BUILD_COMMON="ON", GGML_OPENMP="ON",
                CMAKE_BUILD_TYPE="Release")
    return opts


def _sources(args) -> Path:
    """The llama.cpp source tree: --src, or the sdist's vendor/llama.cpp unpacked into --out."""
    if args.src:
        return Path(args.src).resolve()
    out = Path(args.out).resolve()
    with tarfile.open(args.sdist) as tar:
        top = tar.getmembers()[0].name.split("/")[0]
        src = out / top / "vendor" / "llama.cpp"
        stamp = out / top / ".unpacked"   # written last: an interrupted unpacking is redone
        if not stamp.is_file():
            shutil.rmtree(out / top, ignore_errors=True)
            members = [m for m in tar.getmembers() if m.name.startswith(f"{top}/vendor/llama.cpp/")]
            tar.extractall(out, members=members, filter="data")
            stamp.write_text(str(Path(args.sdist).resolve()))
    return src


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--sdist", help="llama-cpp-python sdist (.tar.gz) whose vendor/llama.cpp is built")
    where.add_argument("--src", help="an unpacked llama.cpp source tree")
    p.add_argument("--out", required=True, help="work directory (sources unpacked and built here)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--print-flags", action="store_true", help="print the CMake options and stop")
    p.add_argument("--as-avx2", action="store_true",
                   help="use only the AVX2-era features (SSE4.2, AVX, AVX2, FMA, F16C, BMI2) even on an AVX-512 "
                        "host: llama.cpp as it runs on an AVX2-only CPU, next to ster at STER_SIMD_LEVEL=avx2")
    args = p.parse_args()

    model, flags = cpu_info()
    if args.as_avx2:
        flags &= AVX2_ERA
    opts = cmake_options(flags)
    print(f"CPU: {model}")
    print("options: " + " ".join(f"-D{k}={v}" for k, v in sorted(opts.items())), flush=True)
    if args.print_flags:
        return
    if shutil.which("cmake") is None:
        sys.exit("cmake is not on PATH (pip install cmake, or your system's package)")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    src = _sources(args)
    build = Path(args.out).resolve() / "build"
    subprocess.run(["cmake", "-S", str(src), "-B", str(build)] + [f"-D{k}={v}" for k, v in opts.items()],
                   check=True)
    subprocess.run(["cmake", "--build", str(build), "--target", "llama-bench", "llama", "-j", str(args.jobs)],
                   check=True)
    bindir = build / "bin"
    if not (bindir / "llama-bench").is_file():
        sys.exit(f"the build finished without {bindir / 'llama-bench'}")
    (bindir / "ster-build.json").write_text(json.dumps(
        {"sources": str(src), "sdist": args.sdist, "cpu": model, "as_avx2": args.as_avx2, "cmake_options": opts,
         "host_flags_used": sorted(f for need, _ in FEATURES for f in need if f in flags)}, indent=1))
    print(bindir)


if __name__ == "__main__":
    main()
