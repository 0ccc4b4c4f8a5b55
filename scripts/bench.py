"""Benchmark ster against llama.cpp (same GGUF file) or transformers (the Hugging Face copy).

A benchmark, not a test: it prints figures, it asserts nothing. For one model it runs
a prompt of ``--prompt-tokens`` ids (512) and ``--new-tokens`` greedy tokens (128,
end-of-generation ignored) on each engine with the same thread count, alternating
the engines for ``--rounds`` rounds (3) so a change in machine load hits both. Each
run is its own subprocess, so its peak RSS is its own. Printed per engine: load
seconds, prefill tok/s, decode tok/s, peak RSS and (``--show``) the RSS added over the
engine's imported modules (medians over rounds), and the ratio
ster / reference of each median; plus the machine's load average before and after,
and ster's RSS budget (1.15 x file size + KV cache + 150 MB).

    python scripts/bench.py smollm2-135m-instruct-q4_1 --threads 2
    python scripts/bench.py gemma3-270m-q4_k_m --threads 2
    python scripts/bench.py smollm2-135m-instruct-q4_1 --reference transformers
    python scripts/bench.py smollm2-135m-instruct-q4_1 --kv-cache f16
    python scripts/bench.py "$(python scripts/moe_bench_model.py)" --prompt-ids random   # mixture of experts

``--kv-cache f16`` runs ster with a float16 KV cache (``generate(kv_cache="f16")``), as
llama.cpp keeps its own by default; the reference engines are unchanged by it.

MODEL is a preset name (its GGUF and Hugging Face copy come from
scripts/real_models.py) or a .gguf path (then ``--hf-dir`` for transformers).

Requirements: the reference engine is not a ster dependency. llama.cpp:
``pip install llama-cpp-python==0.3.36`` (builds llama.cpp from source, ~5 min on 2
cores; ``--llama-cpp-path DIR`` adds a ``pip install --target DIR`` location to the
worker's path). transformers: ``pip install transformers torch==2.13.0``.

What is timed: prefill = one forward pass over the prompt, keeping the KV cache
(llama.cpp ``Llama.eval``; ster ``Decoder.forward``; transformers ``model(...)``);
decode = the remaining ``new_tokens - 1`` steps of one token each, including the
greedy argmax over the vocabulary (the first new token comes from the prefill).
Load = opening the model until it can run (tokenizer included). The ster and llama-cpp-python
runs time the first prompt after load; llama-bench times its prompt after a warmup run, as
``--show``'s "ster gguf warm" does (a GGUF's interleaved copies are made by then).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT_TEXT = ("The history of astronomy is a long story of people looking up at the night sky and "
               "trying to make sense of what they saw. Ancient farmers tracked the seasons by the stars, "
               "sailors steered by them, and philosophers argued about the nature of the planets. ")


def _peak_rss_mb() -> float:
    """This process's peak resident set, MB (1e6 bytes): Linux's VmHWM, which starts afresh at exec.
    (ru_maxrss does not: a worker started by vfork + exec from a parent that once held a model
    reported the parent's peak as its own.) Elsewhere ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 1e6
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6  # Linux reports KiB


def _rss_mb() -> float:
    """The resident set now (Linux /proc/self/statm; NaN elsewhere). Taken once the engine's
    modules are imported, so that peak minus it is what the model, its tokenizer and the run add
    (the weights' share is compared with the file's size)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return float("nan")
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def _prompt_ids(encode, n: int, vocab_size: int, kind: str = "text") -> list[int]:
    """n prompt ids: the tokenized astronomy text, or (``kind`` "random", for synthetic models
    whose vocabulary is no language) the same seeded random ids for every engine."""
    if kind == "random":
        import numpy as np

        return np.random.default_rng(0).integers(3, vocab_size, n).tolist()
    ids: list[int] = []
    text = PROMPT_TEXT
    while len(ids) < n:
        ids = list(encode(text))
        text += PROMPT_TEXT
    return ids[:n]


# --- workers (one engine, one run, in its own process) ----------------------------------

def run_ster(args) -> dict:
    import numpy as np

    t0 = time.perf_counter()
    from ster_py.decoder.qlinear import set_threads
    from ster_py.generate import Sampling, generate
    from ster_py.load import load_model

    base_rss = _rss_mb()
    set_threads(args.threads)
    if args.float_inputs:
        from ster_py._kernels import qmatmul

        qmatmul.set_bf16_inputs(False)
    m = load_model(args.model, precision=args.precision, quantize=args.quantize)
    load_s = time.perf_counter() - t0
    ids = _prompt_ids(lambda t: m.tokenizer.encode(t, add_special_tokens=False), args.prompt_tokens,
                      m.spec.vocab_size, args.prompt_ids)
    if args.warmup:   # as llama-bench does before its timed runs: the same prompt and one token, untimed
        generate(m.decoder, ids, Sampling(max_new_tokens=1), stop_ids=(), kv_cache=args.kv_cache)
    g = generate(m.decoder, ids, Sampling(max_new_tokens=args.new_tokens), stop_ids=(), kv_cache=args.kv_cache)
    dtype = np.float16 if args.kv_cache == "f16" else np.float32
    kv_bytes = m.decoder.new_cache(dtype).nbytes_per_position() * (len(ids) + args.new_tokens)
    return {"load_s": load_s, "prefill_tok_s": g.prefill_tokens_per_second,
            "decode_tok_s": g.decode_tokens_per_second, "peak_rss_mb": _peak_rss_mb(),
            "added_rss_mb": _peak_rss_mb() - base_rss,
            "kv_mb": kv_bytes / 1e6, "tokens": len(g.ids), "first_ids": g.ids[:8],
            "numpy": np.__version__, "simd": _ster_simd()}


def _ster_simd() -> str:
    from ster_py._kernels import qmatmul

    return qmatmul.simd_level()


def run_llama_cpp(args) -> dict:
    import numpy as np

    t0 = time.perf_counter()
    import llama_cpp

    base_rss = _rss_mb()
    llm = llama_cpp.Llama(model_path=args.model, n_threads=args.threads, n_threads_batch=args.threads,
                          n_ctx=args.prompt_tokens + args.new_tokens + 16, n_batch=args.prompt_tokens,
                          verbose=False)
    load_s = time.perf_counter() - t0
    n_vocab = llm.n_vocab()
    ids = _prompt_ids(lambda t: llm.tokenize(t.encode("utf-8"), add_bos=False), args.prompt_tokens, n_vocab,
                      args.prompt_ids)

    def last_logits():  # the last evaluated position's logits (Llama.scores stays empty here)
        return np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,))

    t0 = time.perf_counter()
    llm.eval(ids)
    prefill_s = time.perf_counter() - t0
    out = [int(np.argmax(last_logits()))]
    t0 = time.perf_counter()
    for _ in range(args.new_tokens - 1):
        llm.eval([out[-1]])
        out.append(int(np.argmax(last_logits())))
    decode_s = time.perf_counter() - t0
    return {"load_s": load_s, "prefill_tok_s": len(ids) / prefill_s,
            "decode_tok_s": (len(out) - 1) / decode_s, "peak_rss_mb": _peak_rss_mb(), "tokens": len(out),
            "added_rss_mb": _peak_rss_mb() - base_rss, "first_ids": out[:8], "llama_cpp": llama_cpp.__version__}


def run_transformers(args) -> dict:
    t0 = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_rss = _rss_mb()
    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16 if args.dtype == "bf16"
                                                 else torch.float32)
    model.eval()
    load_s = time.perf_counter() - t0
    ids = _prompt_ids(lambda t: tok(t, add_special_tokens=False)["input_ids"], args.prompt_tokens,
                      model.config.vocab_size, args.prompt_ids)
    with torch.inference_mode():
        t0 = time.perf_counter()
        res = model(torch.tensor([ids]), use_cache=True)
        prefill_s = time.perf_counter() - t0
        past = res.past_key_values
        out = [int(res.logits[0, -1].argmax())]
        t0 = time.perf_counter()
        for _ in range(args.new_tokens - 1):
            res = model(torch.tensor([[out[-1]]]), past_key_values=past, use_cache=True)
            past = res.past_key_values
            out.append(int(res.logits[0, -1].argmax()))
        decode_s = time.perf_counter() - t0
    return {"load_s": load_s, "prefill_tok_s": len(ids) / prefill_s,
            "decode_tok_s": (len(out) - 1) / decode_s, "peak_rss_mb": _peak_rss_mb(), "tokens": len(out),
            "added_rss_mb": _peak_rss_mb() - base_rss, "first_ids": out[:8], "torch": torch.__version__,
            "dtype": str(model.dtype)}


def run_llama_bench(args) -> dict:
    """llama.cpp's own llama-bench (scripts/build_llama_bench.py, built for this CPU without
    AMX): pp<prompt> and tg<new> in one process, one repetition. It reports no load time."""
    exe = Path(args.llama_bench) / "llama-bench"
    cmd = [str(exe), "-m", args.model, "-t", str(args.threads), "-p", str(args.prompt_tokens),
           "-n", str(args.new_tokens), "-r", "1", "-o", "json"]
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(filter(None, (str(exe.parent),
                                                                         os.environ.get("LD_LIBRARY_PATH")))))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"llama-bench failed: {proc.stderr[-2000:]}")
    rows = json.loads(proc.stdout)
    pp = next(r["avg_ts"] for r in rows if r["n_prompt"] > 0 and r["n_gen"] == 0)
    tg = next(r["avg_ts"] for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0)
    return {"load_s": float("nan"), "prefill_tok_s": pp, "decode_tok_s": tg, "peak_rss_mb": float("nan"),
            "added_rss_mb": float("nan"), "tokens": args.new_tokens, "build": rows[0].get("build_commit"), "cpu": rows[0].get("cpu_info")}


WORKERS = {"ster": run_ster, "llama.cpp": run_llama_cpp, "transformers": run_transformers,
           "llama-bench": run_llama_bench}


# --- driver ------------------------------------------------------------------------------

def _resolve(model: str, reference: str, hf_dir: str | None) -> tuple[str, str]:
    """(GGUF path for ster, the reference engine's model path)."""
    if model.endswith(".gguf") or os.path.sep in model:
        if reference == "transformers" and not hf_dir:
            sys.exit("--reference transformers with a .gguf path needs --hf-dir")
        return model, hf_dir or model
    sys.path.insert(0, str(ROOT / "scripts"))
    import real_models  # fetches and caches the preset's files

    gguf = str(real_models.gguf_path(model))
    return gguf, (hf_dir or str(real_models.hf_path(model))) if reference == "transformers" else gguf


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


BUSY = "import time\nend = time.time() + 3600\nwhile time.time() < end:\n    pass\n"


def _one(engine: str, model: str, args, extra_path: str | None, opts: tuple = (), busy: int = 0) -> dict:
    """One run of ``engine`` in its own process; ``opts`` extra worker flags; ``busy`` spinning
    processes (one core each, ordinary priority) kept running for the whole run."""
    env = dict(os.environ)
    # Both engines get the same thread budget; no BLAS pool may add threads behind it.
    env.update(OPENBLAS_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads),
               MKL_NUM_THREADS=str(args.threads), STER_THREADS=str(args.threads))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), extra_path, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, str(Path(__file__).resolve()), model, "--worker", engine,
           "--threads", str(args.threads), "--prompt-tokens", str(args.prompt_tokens),
           "--new-tokens", str(args.new_tokens), "--kv-cache", args.kv_cache, "--prompt-ids", args.prompt_ids,
           *(["--llama-bench", args.llama_bench] if args.llama_bench else []), *opts]
    spinners = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(busy)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    finally:
        for sp in spinners:
            sp.kill()
            sp.wait()
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"{engine} run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", help="preset name or .gguf path")
    p.add_argument("--reference", choices=("llama.cpp", "transformers"), default="llama.cpp")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--kv-cache", choices=("f32", "f16"), default="f32",
                   help="ster's KV cache dtype (llama.cpp's is f16 either way)")
    p.add_argument("--prompt-ids", choices=("text", "random"), default="text",
                   help="the prompt: tokenized English text, or seeded random ids (synthetic models, e.g. "
                        "scripts/moe_bench_model.py's)")
    p.add_argument("--hf-dir", help="Hugging Face directory for --reference transformers")
    p.add_argument("--llama-cpp-path", help="extra sys.path entry where llama_cpp is installed")
    p.add_argument("--json", help="also write the raw runs and medians to this file")
    p.add_argument("--llama-bench", help="directory of llama-bench (scripts/build_llama_bench.py)")
    p.add_argument("--show", action="store_true",
                   help="the issue's side-by-side table for a preset: transformers f32/bf16, ster on the f32 and "
                        "bf16 checkpoints, --quantize q8_0/q4_k, the GGUF under ster (its f32 KV cache, and "
                        "float16 as llama.cpp keeps it), llama-cpp-python and llama-bench, and ster's decode with one busy core (--busy-configs), alternating rounds")
    p.add_argument("--configs", help="--show: only these labels, comma-separated (e.g. 'ster gguf,llama-bench gguf')")
    p.add_argument("--precision", default="auto", help=argparse.SUPPRESS)
    p.add_argument("--quantize", default=None, help=argparse.SUPPRESS)
    p.add_argument("--dtype", default="f32", help=argparse.SUPPRESS)
    p.add_argument("--float-inputs", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--warmup", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args)), flush=True)
        return
    if args.show:
        return show(args)
    if not args.model:
        p.error("give a model (preset name or .gguf path)")
    gguf, ref_model = _resolve(args.model, args.reference, args.hf_dir)
    before = _loadavg()
    runs: dict[str, list[dict]] = {"ster": [], args.reference: []}
    for r in range(args.rounds):
        order = ["ster", args.reference] if r % 2 == 0 else [args.reference, "ster"]
        for engine in order:
            res = _one(engine, gguf if engine == "ster" else ref_model, args, args.llama_cpp_path)
            runs[engine].append(res)
            print(f"round {r + 1} {engine:12s} load {res['load_s']:6.2f} s  prefill {res['prefill_tok_s']:7.1f} tok/s  "
                  f"decode {res['decode_tok_s']:6.1f} tok/s  peak RSS {res['peak_rss_mb']:6.0f} MB", flush=True)
    after = _loadavg()
    figures = ("load_s", "prefill_tok_s", "decode_tok_s", "peak_rss_mb")
    med = {e: {f: statistics.median(run[f] for run in runs[e]) for f in figures} for e in runs}
    file_mb = os.path.getsize(gguf) / 1e6
    kv_mb = runs["ster"][0]["kv_mb"]
    budget = 1.15 * file_mb + kv_mb + 150
    print(f"\nmodel {args.model}  threads {args.threads}  prompt {args.prompt_tokens}  new {args.new_tokens}  "
          f"rounds {args.rounds}  ster kv-cache {args.kv_cache}  load average before {before}, after {after}")
    print(f"{'':14s}{'load s':>9s}{'prefill tok/s':>15s}{'decode tok/s':>14s}{'peak RSS MB':>13s}")
    for e in runs:
        m = med[e]
        print(f"{e:14s}{m['load_s']:9.2f}{m['prefill_tok_s']:15.1f}{m['decode_tok_s']:14.1f}{m['peak_rss_mb']:13.0f}")
    ratio = {f: med["ster"][f] / med[args.reference][f] for f in figures}
    print(f"{'ster/' + args.reference:14s}{ratio['load_s']:9.2f}{ratio['prefill_tok_s']:15.2f}"
          f"{ratio['decode_tok_s']:14.2f}{ratio['peak_rss_mb']:13.2f}")
    print(f"ster RSS budget: 1.15 x {file_mb:.0f} MB file + {kv_mb:.0f} MB KV cache ({args.kv_cache}) + 150 MB "
          f"= {budget:.0f} MB ({'within' if med['ster']['peak_rss_mb'] <= budget else 'OVER'}; max over rounds "
          f"{max(r['peak_rss_mb'] for r in runs['ster']):.0f} MB)")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "kv_cache": args.kv_cache,
                                               "load_before": before, "load_after": after,
                                               "runs": runs, "median": med, "ratio": ratio,
                                               "rss_budget_mb": budget}, indent=1))


def show_configs(preset: str, llama_bench: str | None) -> list[tuple[str, str, str, tuple, int]]:
    """(label, engine, model path, worker flags, busy processes) of ``--show`` for a preset."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import real_models

    gguf, f32, bf16 = (str(real_models.gguf_path(preset)), str(real_models.hf_path(preset)),
                       str(real_models.hf_bf16_path(preset)))
    configs = [("transformers f32", "transformers", f32, ("--dtype", "f32"), 0),
               ("transformers bf16", "transformers", bf16, ("--dtype", "bf16"), 0),
               ("ster f32", "ster", f32, (), 0),
               ("ster bf16", "ster", bf16, (), 0),
               # the bf16 prompt's products on float32 inputs (no vdpbf16ps tile; what CPUs without AVX512_BF16 run)
               ("ster bf16 f32 inputs", "ster", bf16, ("--float-inputs",), 0),
               ("ster bf16 q8_0", "ster", bf16, ("--quantize", "q8_0"), 0),
               ("ster bf16 q4_k", "ster", bf16, ("--quantize", "q4_k"), 0),
               ("ster gguf", "ster", gguf, (), 0),
               # after one untimed run of the prompt, as llama-bench times (its warmup): the copies exist
               ("ster gguf warm", "ster", gguf, ("--warmup",), 0),
               ("ster gguf f16 kv", "ster", gguf, ("--kv-cache", "f16"), 0),   # llama.cpp's own KV dtype
               # the prompt's products on float32 inputs (no AMX tiles for its blocks: what other CPUs run)
               ("ster gguf f32 inputs", "ster", gguf, ("--float-inputs",), 0),
               ("llama-cpp-python gguf", "llama.cpp", gguf, (), 0),
               ("ster gguf +1 busy", "ster", gguf, (), 1),
               ("ster bf16 +1 busy", "ster", bf16, (), 1)]
    if llama_bench:
        at = [c[0] for c in configs].index("llama-cpp-python gguf") + 1
        configs.insert(at, ("llama-bench gguf", "llama-bench", gguf, (), 0))
    return configs


def show(args) -> None:
    """Every configuration of ``show_configs`` once per round, the order reversed every other
    round; per-round figures as they come, then medians and the ratios the issue asks for."""
    configs = show_configs(args.model, args.llama_bench)
    if args.configs:
        keep = [c.strip() for c in args.configs.split(",")]
        unknown = set(keep) - {c[0] for c in configs}
        if unknown:
            sys.exit(f"unknown --configs {sorted(unknown)}; labels: {', '.join(c[0] for c in configs)}")
        configs = [c for c in configs if c[0] in keep]
    loads = [_loadavg()]
    runs: dict[str, list[dict]] = {c[0]: [] for c in configs}
    for r in range(args.rounds):
        for label, engine, path, opts, busy in (configs if r % 2 == 0 else configs[::-1]):
            res = _one(engine, path, args, args.llama_cpp_path, opts, busy)
            res["loadavg"] = _loadavg()
            runs[label].append(res)
            print(f"round {r + 1} {label:22s} load {res['load_s']:6.2f} s  prefill {res['prefill_tok_s']:7.1f} tok/s  "
                  f"decode {res['decode_tok_s']:6.1f} tok/s  peak RSS {res['peak_rss_mb']:6.0f} MB "
                  f"(+{res['added_rss_mb']:.0f} over the engine's imports)  "
                  f"(loadavg {res['loadavg']})", flush=True)
        loads.append(_loadavg())
    figures = ("load_s", "prefill_tok_s", "decode_tok_s", "peak_rss_mb", "added_rss_mb")
    med = {c: {f: statistics.median(run[f] for run in runs[c]) for f in figures} for c in runs}
    print(f"\nmodel {args.model}  threads {args.threads}  prompt {args.prompt_tokens}  new {args.new_tokens}  "
          f"rounds {args.rounds}  load average at start and after each round: {' | '.join(loads)}")
    print(f"{'':24s}{'load s':>9s}{'prefill tok/s':>15s}{'decode tok/s':>14s}{'peak RSS MB':>13s}{'added MB':>10s}")
    for c in runs:
        m = med[c]
        print(f"{c:24s}{m['load_s']:9.2f}{m['prefill_tok_s']:15.1f}{m['decode_tok_s']:14.1f}{m['peak_rss_mb']:13.0f}"
              f"{m['added_rss_mb']:10.0f}")
    ratios = [("ster f32 / transformers f32", "ster f32", "transformers f32"),
              ("ster bf16 / transformers bf16", "ster bf16", "transformers bf16"),
              ("ster q8_0 / transformers bf16", "ster bf16 q8_0", "transformers bf16"),
              ("ster q4_k / transformers bf16", "ster bf16 q4_k", "transformers bf16"),
              ("ster gguf / llama-cpp-python", "ster gguf", "llama-cpp-python gguf"),
              ("ster gguf / llama-bench", "ster gguf", "llama-bench gguf"),
              ("ster gguf warm / llama-bench", "ster gguf warm", "llama-bench gguf"),
              ("ster gguf f16 kv / llama-bench", "ster gguf f16 kv", "llama-bench gguf"),
              ("ster gguf f32 inputs / llama-bench", "ster gguf f32 inputs", "llama-bench gguf"),
              ("ster gguf busy / quiet", "ster gguf +1 busy", "ster gguf"),
              ("ster bf16 busy / quiet", "ster bf16 +1 busy", "ster bf16")]
    print(f"\n{'ratio (medians)':32s}{'load':>8s}{'prefill':>9s}{'decode':>8s}")
    out_ratios = {}
    for name, a, b in ratios:
        if a in med and b in med:
            q = {f: med[a][f] / med[b][f] for f in ("load_s", "prefill_tok_s", "decode_tok_s")}
            out_ratios[name] = q
            print(f"{name:32s}{q['load_s']:8.2f}{q['prefill_tok_s']:9.2f}{q['decode_tok_s']:8.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "loadavg": loads, "runs": runs, "median": med,
                                               "ratio": out_ratios}, indent=1))


if __name__ == "__main__":
    main()
