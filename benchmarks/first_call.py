"""What the first call costs a user (GPU only): compilation, and for large problems autotuning.

Each case runs in a fresh process with its own Triton cache directory, timing the first and the second
call: first with an empty cache (every kernel compiled, every candidate timed), then again in a new
process on the now-filled cache (compiled kernels and the autotuner's choice are read from disk).

    PYTHONPATH=src python benchmarks/first_call.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CASES = {  # name -> (B, H, N, D, causal)
    "article N=1024 D=64 (static tiles)": (4, 8, 1024, 64, False),
    "paper N=4096 D=64 (autotuned)": (4, 32, 4096, 64, False),
    "paper N=4096 D=128 causal (autotuned)": (4, 16, 4096, 128, True),
}

CHILD = """
import sys, time, torch
from flashtriton import flash_attention
from flashtriton.testing import make_qkv
b, h, n, d, causal = map(int, sys.argv[1:6])
q, k, v = make_qkv(b, h, h, n, n, d, torch.bfloat16, "cuda", requires_grad=False)
torch.cuda.synchronize()
times = []
for _ in range(2):
    start = time.perf_counter()
    flash_attention(q, k, v, is_causal=bool(causal))
    torch.cuda.synchronize()
    times.append(time.perf_counter() - start)
print(times[0], times[1])
"""


def run_case(shape, cache_dir: str) -> tuple[float, float]:
    env = dict(os.environ, TRITON_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", CHILD, *map(str, map(int, shape))], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    return float(out[-2]), float(out[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results = {}
    for name, shape in CASES.items():
        with tempfile.TemporaryDirectory() as cache_dir:
            cold_first, cold_second = run_case(shape, cache_dir)
            warm_first, _ = run_case(shape, cache_dir)
        results[name] = {"empty cache: first call s": cold_first, "second call s": cold_second,
                         "filled cache, new process: first call s": warm_first}
    lines = ["| case | empty cache: 1st call (s) | 2nd call (s) | new process, filled cache: 1st call (s) |",
             "|---|---|---|---|"]
    lines += [f"| {name} | {r['empty cache: first call s']:.2f} | {r['second call s']:.4f} | "
              f"{r['filled cache, new process: first call s']:.2f} |" for name, r in results.items()]
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "first_call.json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
