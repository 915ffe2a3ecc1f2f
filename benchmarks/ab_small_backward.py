"""Our backward at the paper suite's small causal shapes, this tree against another copy of the package,
each timed by its own suite timer (`bench.provider_timer`: `flash_attention`, then `o.backward(dO)`
through autograd, what the result files hold), with flex's timer alongside as a reference (GPU only). The
timers take turns, round after round, so that a drift of the clocks or of the host hits all alike. At
these sizes one backward is well under a millisecond of GPU time and our host path (autograd,
descriptors, launches) is of the same order, so the rounds show how far the host moves a row.

    mkdir -p ab_base && git archive 698da17 src/flashtriton | tar -x -C ab_base --strip-components=1
    PYTHONPATH=src python benchmarks/ab_small_backward.py --package base=ab_base [--rounds 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
from pathlib import Path

import torch

from ab_backward import interleaved_times  # this folder is on the path when run as a script
from ab_dkdv import load_package
from flashtriton import bench

SHAPES = [(16, 32, 1024, 64), (16, 16, 1024, 128), (8, 16, 2048, 128)]  # (B, H, N, D), causal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", required=True, help="NAME=DIR: the copy of the package in DIR/flashtriton")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    name, folder = args.package.split("=")
    load_package(f"flashtriton_{name}", Path(folder))
    benches = {"this tree": bench, name: importlib.import_module(f"flashtriton_{name}.bench")}
    rows = []
    for batch, heads, seqlen, head_dim in SHAPES:
        q, k, v = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        timers = {}
        for label, package_bench in benches.items():
            shape = package_bench.Shape(batch, heads, heads, seqlen, seqlen, head_dim, True)
            timers[label] = package_bench.provider_timer("flashtriton", shape, "bwd", q, k, v)
        shape = bench.Shape(batch, heads, heads, seqlen, seqlen, head_dim, True)
        timers["flex"] = bench.provider_timer("flex", shape, "bwd", q, k, v)
        times = interleaved_times(list(timers.values()), args.rounds, timer=lambda timer: timer())
        print(f"B{batch} H{heads} N{seqlen} D{head_dim} causal, backward", flush=True)
        for label, all_ms in zip(timers, times, strict=True):
            ms = statistics.median(all_ms)
            rows.append(dict(shape=[batch, heads, seqlen, head_dim], provider=label, ms=ms, all_ms=all_ms))
            print(f"  {label:12s} {ms:.3f} ms  rounds {' '.join(f'{t:.3f}' for t in all_ms)}", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ab_small_backward.json").write_text(json.dumps(dict(gpu=torch.cuda.get_device_name(), rows=rows),
                                                           indent=1))


if __name__ == "__main__":
    main()
