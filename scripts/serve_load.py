"""A bounded load test of ``ster serve``: N requests from C concurrent clients (the official openai
client), each a short chat completion; prints throughput and latency percentiles as a Markdown row.

    python scripts/serve_load.py --model smollm2-135m-instruct-q4_1 --requests 200 --clients 8 --max-tokens 16

Starts the server on 127.0.0.1 (a free port) as a child process and stops it at the end. Fails (exit 1)
when a request fails or the whole run exceeds --time-limit seconds.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--time-limit", type=float, default=900)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    import openai

    cmd = [sys.executable, "-c", "from ster_py.cli import main; main()", "serve", "--model", a.model, "--port", "0",
           "-q", "--name", "m"] + (["--threads", str(a.threads)] if a.threads else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if not line.startswith("listening on "):
            print("the server did not start", file=sys.stderr)
            return 1
        client = openai.OpenAI(base_url=line.split()[2] + "/v1", api_key="unused", max_retries=0, timeout=a.time_limit)
        questions = ["What is the capital of France?", "Name a primary colour.", "What is 2 + 2?",
                     "Say hello in Spanish.", "What do bees make?", "Which planet is the largest?",
                     "What is ice made of?", "How many legs does a spider have?"]
        latencies, tokens = [], []

        def one(i: int):
            t0 = time.perf_counter()
            r = client.chat.completions.create(model="m", max_tokens=a.max_tokens,
                                               messages=[{"role": "user", "content": questions[i % len(questions)]}])
            latencies.append(time.perf_counter() - t0)
            tokens.append(r.usage.completion_tokens)
            return r.choices[0].message.content

        t0 = time.perf_counter()
        with ThreadPoolExecutor(a.clients) as pool:
            answers = list(pool.map(one, range(a.requests)))
        wall = time.perf_counter() - t0
        if len(answers) != a.requests or wall > a.time_limit:
            print(f"failed: {len(answers)} answers in {wall:.0f} s", file=sys.stderr)
            return 1
        q = statistics.quantiles(latencies, n=20)
        print(f"| {a.model} | {cpu_name()} | {a.requests} | {a.clients} | {a.max_tokens} | {wall:.1f} | "
              f"{a.requests / wall:.2f} | {sum(tokens) / wall:.1f} | {statistics.median(latencies):.2f} | {q[18]:.2f} |")
        return 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
