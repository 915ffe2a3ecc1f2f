"""Eager calls against torch.compile, default mode and mode="reduce-overhead" (CUDA graphs), on the
article's shapes (B=4, H=8, D=64, bf16, N = 512..4096, causal and not; --shape picks others), for flashtriton and for
PyTorch's SDPA (cuDNN on the H200) compiled the same way; forward, and forward + backward (GPU only).

Two timings of each (provider, way of calling): `do_bench`, triton.testing.do_bench's median, which
flushes the L2 cache before each call, so that a call's host time shows only where it outlasts that
flush; and `loop`, back-to-back calls (a model's layers run so), wall time per call of 50 calls after
a synchronize, median of 5: whichever of the host and the GPU is slower sets it. Each is taken once
per round, three rounds interleaved over the (provider, way) pairs, and the median kept. A forward
runs under torch.no_grad(); forward + backward is the backward of (attention(q, k, v) * dO).sum(), a
scalar loss as in training (CUDA graph trees replay a backward from a scalar loss; from a
non-scalar output with a gradient they raised "accessing tensor output of CUDAGraphs that has been
overwritten" for SDPA as well as ours).

    PYTHONPATH=src python benchmarks/compiled.py [--out DIR] [--seqlens 512,1024] [--shape B,H,D] [--name STEM]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing

from flashtriton import flash_attention, launch
from flashtriton.tools.bench import environment, warm_up_gpu

ROUNDS = 3
WAYS = ("eager", "compiled", "reduce-overhead")
PROVIDERS = {
    "flashtriton": lambda q, k, v, causal: flash_attention(q, k, v, is_causal=causal),
    "sdpa": lambda q, k, v, causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
}


def _step(provider: str, way: str, mode: str, causal: bool, do: torch.Tensor):
    """One call of the provider the given way: a forward, or a forward and backward of a scalar loss."""
    fn = PROVIDERS[provider]
    if mode == "fwd":
        def body(q, k, v):
            return fn(q, k, v, causal)
    else:
        def body(q, k, v):
            return (fn(q, k, v, causal) * do).sum()
    if way != "eager":
        body = torch.compile(body, fullgraph=True, dynamic=False, mode="reduce-overhead" if way != "compiled" else None)

    def step(q, k, v):
        if way == "reduce-overhead":  # a new step for CUDA graph trees: the previous outputs may be reused
            torch.compiler.cudagraph_mark_step_begin()
        if mode == "fwd":
            with torch.no_grad():
                return body(q, k, v)
        body(q, k, v).backward()
    return step


def _timers(provider: str, way: str, mode: str, shape: tuple[int, int, int], seqlen: int, causal: bool):
    """Two functions, each timing one call (ms) when called: do_bench's median, and the loop's. `shape`:
    (B, H, D)."""
    batch, heads, head_dim = shape
    q, k, v = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16,
                           requires_grad=mode != "fwd")
               for _ in range(3))
    step = _step(provider, way, mode, causal, torch.randn_like(q))

    def call():
        step(q, k, v)
        if mode != "fwd":  # as a training step's zero_grad(set_to_none=True): the graphs own their outputs
            q.grad = k.grad = v.grad = None
    for _ in range(3):  # compile, record the graphs, settle
        call()
    torch.cuda.synchronize()

    def do_bench():
        return triton.testing.do_bench(call, warmup=25, rep=100, grad_to_none=[q, k, v] if mode != "fwd" else None,
                                       return_mode="median")

    def loop(calls: int = 50) -> float:
        per_call = []
        for _ in range(5):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                call()
            torch.cuda.synchronize()
            per_call.append((time.perf_counter() - start) / calls * 1e3)
        return statistics.median(per_call)
    choice = launch.last_choice("forward") if provider == "flashtriton" else None
    return do_bench, loop, None if choice is None else f"{choice}{' (replayed)' if choice.replayed else ''}"


def run(shape: tuple[int, int, int], seqlens: list[int], modes: list[str]) -> list[dict]:
    rows = []
    for mode in modes:
        for seqlen in seqlens:
            for causal in (False, True):
                timers = {(p, w): _timers(p, w, mode, shape, seqlen, causal) for p in PROVIDERS for w in WAYS}
                times = {key: ([], []) for key in timers}
                for _ in range(ROUNDS):
                    for key, (do_bench, loop, _) in timers.items():
                        times[key][0].append(do_bench())
                        times[key][1].append(loop())
                for (provider, way), (bench_ms, loop_ms) in times.items():
                    rows.append(dict(mode=mode, seqlen=seqlen, causal=causal, provider=provider, way=way,
                                     ms=statistics.median(bench_ms), loop_ms=statistics.median(loop_ms),
                                     forward_tiles=timers[(provider, way)][2],
                                     spread=(max(bench_ms) - min(bench_ms)) / statistics.median(bench_ms)))
                print(mode, seqlen, "causal" if causal else "full",
                      {f"{p}/{w}": (round(statistics.median(a), 4), round(statistics.median(b), 4))
                       for (p, w), (a, b) in times.items()}, flush=True)
                torch._dynamo.reset()
    return rows


def table(rows: list[dict], metric: str) -> str:
    ms = {(r["mode"], r["seqlen"], r["causal"], r["provider"], r["way"]): r[metric] for r in rows}
    lines = ["| mode | N | causal | ours eager | ours compiled | ours reduce-overhead | SDPA eager | SDPA compiled | "
             "SDPA reduce-overhead | ours compiled / eager | ours / SDPA, reduce-overhead |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode, seqlen, causal in sorted({key[:3] for key in ms}, key=lambda key: (key[0] != "fwd", key[1], key[2])):
        ours = [ms[(mode, seqlen, causal, "flashtriton", way)] for way in WAYS]
        sdpa = [ms[(mode, seqlen, causal, "sdpa", way)] for way in WAYS]
        cells = [f"{t:.3f}" for t in (*ours, *sdpa)]
        lines.append(f"| {mode} | {seqlen} | {'yes' if causal else 'no'} | {' | '.join(cells)} | "
                     f"{ours[1] / ours[0]:.2f} | {ours[2] / sdpa[2]:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/h200"))
    parser.add_argument("--seqlens", default="512,1024,2048,4096")
    parser.add_argument("--modes", default="fwd,fwd_bwd")
    parser.add_argument("--shape", default="4,8,64", help="B,H,D (default: the article's)")
    parser.add_argument("--name", default="compiled", help="the results' file stem")
    args = parser.parse_args()
    batch, heads, head_dim = (int(x) for x in args.shape.split(","))
    warm_up_gpu()
    rows = run((batch, heads, head_dim), [int(n) for n in args.seqlens.split(",")], args.modes.split(","))
    meta = environment()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(dict(meta=meta, shape=[batch, heads, head_dim], rows=rows),
                                                          indent=1))
    text = (f"# Eager and torch.compile on {meta.get('gpu')}\ntorch {meta.get('torch')}, triton {meta.get('triton')}, "
            f"commit {meta.get('commit')}.\n\nB={batch}, H={heads}, D={head_dim}, bf16, milliseconds per call, "
            f"median of {ROUNDS} "
            "interleaved rounds; ratios of milliseconds, above 1 means ours takes longer. "
            "`benchmarks/compiled.py` (its docstring says how each is timed).\n\n"
            "## Back-to-back calls (`loop`)\n\n" + table(rows, "loop_ms") + "\n\n"
            "## `triton.testing.do_bench` (L2 flushed before each call)\n\n" + table(rows, "ms") + "\n")
    (args.out / f"{args.name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
