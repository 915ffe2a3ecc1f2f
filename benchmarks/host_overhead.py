"""Where the host time of one small forward call, and of one small backward, goes (GPU only).

The kernel of a tiny problem takes a few microseconds, so the GPU keeps up and the CPU time per call is
the host path alone. Each line peels off one layer: the public API, the launcher, Triton's launch of
the same compiled kernel with the arguments already built, and an empty kernel (Triton's floor).
Also times the 256 MB cache flush that `triton.testing.do_bench` runs before every timed call: an eager
time only shows the part of the host path that outlasts that flush.

The backward lines time `launch.attention_backward` (three launches: D, dK/dV, dQ) with static tiles and
with the autotuners, and a forward + backward through autograd against SDPA's; a second profile covers
that forward + backward. Our calls replay their recorded launches after the first (launch/replay.py); each is
timed again with every launch through Triton's own path (docs/performance.md, "Host time").

    PYTHONPATH=src python benchmarks/host_overhead.py [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import pstats
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

from flashtriton import flash_attention, launch
from flashtriton.cache import CACHE
from flashtriton.launch import TileConfig
from flashtriton.testing import make_qkv


@triton.jit
def _empty_kernel(x):
    pass


def per_call_us(fn, calls: int = 3000) -> float:
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def captured_launch(config: TileConfig | None, q, k, v):
    """The exact kernel[grid](*args, **kwargs) that attention_forward makes, as a replayable closure."""
    kernel, seen = launch.DEFAULT_KERNELS.forward, {}

    class Recorder:
        def __getitem__(self, grid):
            def record(*args, **kwargs):
                seen.update(grid=grid, args=args, kwargs=kwargs)
                return kernel[grid](*args, **kwargs)
            return record

    CACHE.replays = False  # the stand-in is no compiled kernel to record (and a replay would skip it)
    try:
        launch.attention_forward(q, k, v, False, 0.125, config, kernels=launch.Kernels(forward=Recorder()))
    finally:
        CACHE.replays = True
    return lambda: kernel[seen["grid"]](*seen["args"], **seen["kwargs"])


def flush_us() -> float:
    cache = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(20):
        start.record()
        cache.zero_()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def fwd_bwd(attention, q, k, v, do):
    def call():
        for x in (q, k, v):
            x.grad = None
        attention(q, k, v).backward(do)
    return call


def profile(fn, calls: int = 2000) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    return text.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    q, k, v = make_qkv(1, 2, 2, 128, 128, 64, torch.bfloat16, "cuda")
    tma = TileConfig(128, 64, num_warps=4, num_stages=3, use_tma=True)
    block_ptr = TileConfig(128, 64, num_warps=4, num_stages=3)
    x = torch.empty(16, device="cuda")
    cases = {
        "F.scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(q, k, v),
        "flash_attention (no grad)": lambda: flash_attention(q, k, v),
        "launch.attention_forward (block pointers)": lambda: launch.attention_forward(q, k, v, False, 0.125, block_ptr),
        "launch.attention_forward (TMA)": lambda: launch.attention_forward(q, k, v, False, 0.125, tma),
        "launch.attention_forward (autotuned)": lambda: launch.attention_forward(q, k, v, False, 0.125, autotune=True),
        "kernel[grid](...) only (block pointers)": captured_launch(block_ptr, q, k, v),
        "kernel[grid](...) only (TMA)": captured_launch(tma, q, k, v),
        "torch.empty_like + torch.empty": lambda: (torch.empty_like(q), torch.empty((1, 2, 128), device="cuda")),
        "empty Triton kernel, 1 argument": lambda: _empty_kernel[(1,)](x),
    }
    with torch.no_grad():
        results = {name: per_call_us(fn) for name, fn in cases.items()}
        results["do_bench's 256 MB flush (GPU time)"] = flush_us()
        forward_profile = profile(lambda: flash_attention(q, k, v))

        o, lse = launch.attention_forward(q, k, v, False, 0.125)
        do = torch.randn_like(o)
        backward = {
            "static block pointers": (TileConfig(64, 64, 4, 3), TileConfig(128, 64, 8, 3)),
            "static TMA": (TileConfig(64, 64, 4, 3, True), TileConfig(128, 64, 8, 3, True)),
        }
        for name, configs in backward.items():
            cases[f"launch.attention_backward ({name})"] = (
                lambda configs=configs: launch.attention_backward(do, q, k, v, o, lse, False, 0.125, configs, False))
        cases["launch.attention_backward (autotuned)"] = (
            lambda: launch.attention_backward(do, q, k, v, o, lse, False, 0.125, autotune=True))
        for name in [n for n in cases if n.startswith("launch.attention_backward")]:
            results[name] = per_call_us(cases[name])
    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
    cases["flash_attention forward + backward (autograd)"] = fwd_bwd(flash_attention, qg, kg, vg, do)
    results["flash_attention forward + backward (autograd)"] = per_call_us(cases[
        "flash_attention forward + backward (autograd)"])
    fwd_bwd_profile = profile(fwd_bwd(flash_attention, qg, kg, vg, do))
    # The same calls with every launch through Triton's JITFunction.run (no recorded launches replayed).
    CACHE.replays = False
    for name in [n for n in cases if n.startswith(("flash_attention", "launch."))]:
        with torch.no_grad() if "autograd" not in name else contextlib.nullcontext():
            results[f"{name}, every launch through Triton"] = per_call_us(cases[name])
    CACHE.replays = True
    results["SDPA forward + backward (autograd)"] = per_call_us(fwd_bwd(F.scaled_dot_product_attention, qg, kg, vg,
                                                                        do))

    lines = ["| what | µs per call |", "|---|---|"] + [f"| {n} | {t:.1f} |" for n, t in results.items()]
    table = "\n".join(lines)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "host_overhead.json").write_text(json.dumps(results, indent=1))
        (args.out / "host_overhead_profile.txt").write_text(forward_profile)
        (args.out / "host_overhead_fwd_bwd_profile.txt").write_text(fwd_bwd_profile)
    print(fwd_bwd_profile[:6000])
    print(table)


if __name__ == "__main__":
    main()
