"""Eager time of small Gluon forwards at D = 128 (with --backward: whole backwards on the Gluon path,
FLASHTRITON_BACKWARD=gluon) on an sm_90 GPU: a repeated call replaying its recorded launches (the
default) against the same call through Triton's launch path (CACHE.replays = False), with the CUDA-graph
time (the GPU's alone) beside. Interleaved rounds, `do_bench` medians; prints one JSON line per shape. The
provider measured first in a round reads a few percent slower on GPU-bound shapes, so `--order` swaps the
two. docs/performance.md, entries 67 and 69.

    PYTHONPATH=src python benchmarks/gluon_host.py [--order triton_first] [--backward]
"""

import argparse
import json
import statistics
from unittest import mock

import torch
from triton.testing import do_bench, do_bench_cudagraph

import ab_runs
from flashtriton.cache import CACHE
from flashtriton.launch import gluon_backward, gluon_forward
from flashtriton.launch.backward import attention_backward

SHAPES = [(32, 16, 512, False), (16, 16, 1024, True), (1, 16, 1024, False), (4, 16, 4096, False)]


def race(batch: int, heads: int, n: int, causal: bool, order: str, rounds: int, backward: bool) -> dict:
    """One shape's medians, ms: replayed, through Triton's launch path, and from a CUDA graph."""
    q, k, v, do = (torch.randn(batch, heads, n, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    o, lse = gluon_forward.attention_forward_gluon(q, k, v, causal, 128 ** -0.5)
    torch.cuda.synchronize()

    if backward:
        replayed = ab_runs.on_path(gluon_backward.BACKWARD_PATH_VARIABLE, "gluon",
                                   lambda: attention_backward(do, q, k, v, o, lse, causal, 128 ** -0.5))
    else:
        def replayed():
            return gluon_forward.attention_forward_gluon(q, k, v, causal, 128 ** -0.5)

    providers = {"replayed": replayed,
                 "triton_launch": ab_runs.inside(lambda: mock.patch.object(CACHE, "replays", False), replayed)}
    if order == "triton_first":
        providers = dict(reversed(providers.items()))
    for fn in providers.values():
        fn()  # compile, and record the launch the replayed calls reuse
    times = {name: [] for name in (*providers, "graph")}
    for _ in range(rounds):
        for name, fn in providers.items():
            times[name].append(do_bench(fn, warmup=10, rep=40))
        times["graph"].append(do_bench_cudagraph(replayed, rep=30))
    return dict(shape=f"B{batch} H{heads} N{n} D128 {'causal' if causal else 'full'}", order=order,
                mode="bwd" if backward else "fwd",
                ms={name: round(statistics.median(t), 4) for name, t in times.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--order", choices=("replayed_first", "triton_first"), default="replayed_first")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backward", action="store_true", help="whole backwards instead of forwards")
    args = parser.parse_args()
    for batch, heads, n, causal in SHAPES:
        print(json.dumps(race(batch, heads, n, causal, args.order, args.rounds, args.backward)), flush=True)


if __name__ == "__main__":
    main()
