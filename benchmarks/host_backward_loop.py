"""Host time against GPU time per iteration of `triton.testing.do_bench`'s loop, at the paper suite's
host-bound backward rows (causal, N = 1024), for our backward and the peers (GPU only).

Each iteration is do_bench's: drop the gradients, flush the L2 cache, record an event, `o.backward(dO)`,
record an event. The host's time per iteration is read before the one synchronize at the end (the GPU
queue holds every launch, so the host never waits on it); the GPU's is the events' median, what the
suite reports. Where the host's exceeds the GPU's, the GPU idles and the row measures the host.

Our backward runs twice: replaying its recorded launches (the default), and through Triton's launch
path every time (launch.ENABLED off; NOTES entry 39). Then the body of our backward
(`ops.attention_backward`, on autograd's device thread) is profiled at that shape.

    PYTHONPATH=src python benchmarks/host_backward_loop.py [--out DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time
from pathlib import Path

import torch
import triton

from flashtriton import bench, launch, ops

SHAPES = [(16, 16, 1024, 128), (16, 32, 1024, 64)]  # (B, H, N, D), causal: the suite's host-bound rows
ITERATIONS = 60  # launches stay well inside the GPU's queue, so the host never blocks on it
TRITON_LAUNCHES = "flashtriton, every launch through Triton"  # launch.ENABLED off: no replayed launches


def per_iteration(o, do, inputs) -> tuple[float, float]:
    """(host µs, GPU ms) per do_bench iteration of o.backward(do)."""
    cache = triton.runtime.driver.active.get_empty_cache_for_benchmark()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(ITERATIONS)]
    for _ in range(10):
        o.backward(do, retain_graph=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for begin, end in events:
        for x in inputs:
            x.grad = None
        triton.runtime.driver.active.clear_cache(cache)
        begin.record()
        o.backward(do, retain_graph=True)
        end.record()
    host = (time.perf_counter() - start) / ITERATIONS
    torch.cuda.synchronize()
    return host * 1e6, statistics.median(b.elapsed_time(e) for b, e in events)


def profile_our_backward(o, do, calls: int = 200) -> str:
    profile, inner = cProfile.Profile(), ops.attention_backward

    def profiled(*args, **kwargs):  # runs on autograd's device thread; cProfile follows the thread it is on
        profile.enable()
        try:
            return inner(*args, **kwargs)
        finally:
            profile.disable()
    ops.attention_backward = profiled
    try:
        for _ in range(calls):
            o.backward(do, retain_graph=True)
        torch.cuda.synchronize()
    finally:
        ops.attention_backward = inner
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("cumulative").print_stats(30)
    stats.sort_stats("tottime").print_stats(30)
    return text.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    bench.warm_up_gpu()
    results, profiles = {}, {}
    for batch, heads, seqlen, head_dim in SHAPES:
        key = f"B{batch} H{heads} N{seqlen} D{head_dim} causal"
        shape = bench.Shape(batch, heads, heads, seqlen, seqlen, head_dim, True)
        q, k, v = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        do = torch.randn_like(q)
        outputs = {}
        for name in ("flashtriton", "sdpa_flash", "flex", "sdpa"):
            with bench.PROVIDERS[name].context():
                outputs[name] = bench.PROVIDERS[name].run(q, k, v, shape)
        outputs[TRITON_LAUNCHES] = outputs["flashtriton"]
        rows = {name: [] for name in outputs}
        for _ in range(args.rounds):
            for name, o in outputs.items():
                launch.ENABLED = name != TRITON_LAUNCHES
                with bench.PROVIDERS["flashtriton" if name == TRITON_LAUNCHES else name].context():
                    rows[name].append(per_iteration(o, do, (q, k, v)))
                launch.ENABLED = True
        results[key] = {name: dict(host_us=statistics.median(h for h, _ in r),
                                   gpu_ms=statistics.median(g for _, g in r), rounds=r) for name, r in rows.items()}
        print(f"{key}: per do_bench iteration, host µs / GPU ms (medians of {args.rounds} rounds)")
        for name, row in results[key].items():
            rounds = "  ".join(f"{h:6.0f}/{g:.3f}" for h, g in row["rounds"])
            print(f"  {name:40s} {row['host_us']:7.0f} µs / {row['gpu_ms']:.3f} ms   ({rounds})")
        profiles[key] = profile_our_backward(outputs["flashtriton"], do)
        print("\n".join(profiles[key].splitlines()[:45]))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "host_backward_loop.json").write_text(json.dumps(results, indent=1))
        for key, text in profiles.items():
            (args.out / f"host_backward_loop_profile_{key.split()[3]}.txt").write_text(text)


if __name__ == "__main__":
    main()
