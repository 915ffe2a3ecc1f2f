"""Eager calls against torch.compile, default mode and mode="reduce-overhead" (CUDA graphs), on the
article's shapes (B=4, H=8, D=64, bf16, N = 512..4096, causal and not), for flashtriton and for
PyTorch's SDPA (cuDNN on the H200) compiled the same way; forward, and forward + backward (GPU only).

Every (provider, way of calling) of one shape and mode is timed once per round, three rounds
interleaved, and the median kept (triton.testing.do_bench medians inside each). A compiled forward
runs under torch.no_grad() like the eager one, so it too has nothing to differentiate.

    PYTHONPATH=src python benchmarks/compiled.py [--out DIR] [--seqlens 512,1024]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing

from flashtriton import flash_attention
from flashtriton.tools.bench import environment, warm_up_gpu

ROUNDS = 3
WAYS = ("eager", "compiled", "reduce-overhead")
PROVIDERS = {
    "flashtriton": lambda q, k, v, causal: flash_attention(q, k, v, is_causal=causal),
    "sdpa": lambda q, k, v, causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
}


def _callable(provider: str, way: str, causal: bool):
    fn = PROVIDERS[provider]
    if way == "eager":
        return fn
    compiled = torch.compile(fn, fullgraph=True, dynamic=False, mode="reduce-overhead" if way != "compiled" else None)
    if way == "compiled":
        return compiled

    def replayed(q, k, v, causal):  # a new step for CUDA graph trees: the previous outputs are dropped
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(q, k, v, causal)
    return replayed


def _timer(provider: str, way: str, mode: str, seqlen: int, causal: bool):
    """A function that times one call (ms, do_bench's median) each time it is called."""
    q, k, v = (torch.randn(4, 8, seqlen, 64, device="cuda", dtype=torch.bfloat16, requires_grad=mode != "fwd")
               for _ in range(3))
    fn = _callable(provider, way, causal)
    if mode == "fwd":
        def call():
            with torch.no_grad():
                return fn(q, k, v, causal)
    else:
        do = torch.randn_like(q)

        def call():
            fn(q, k, v, causal).backward(do)
    for _ in range(3):  # compile, record the graphs, settle
        call()
    torch.cuda.synchronize()
    return lambda: triton.testing.do_bench(call, warmup=25, rep=100, grad_to_none=[q, k, v] if mode != "fwd" else None,
                                           return_mode="median")


def run(seqlens: list[int], modes: list[str]) -> list[dict]:
    rows = []
    for mode in modes:
        for seqlen in seqlens:
            for causal in (False, True):
                timers = {(p, w): _timer(p, w, mode, seqlen, causal) for p in PROVIDERS for w in WAYS}
                times = {key: [] for key in timers}
                for _ in range(ROUNDS):
                    for key, timer in timers.items():
                        times[key].append(timer())
                for (provider, way), ms in times.items():
                    median = statistics.median(ms)
                    rows.append(dict(mode=mode, seqlen=seqlen, causal=causal, provider=provider, way=way, ms=median,
                                     spread=(max(ms) - min(ms)) / median))
                print(mode, seqlen, "causal" if causal else "full",
                      {f"{p}/{w}": round(statistics.median(t), 4) for (p, w), t in times.items()}, flush=True)
                torch._dynamo.reset()
    return rows


def table(rows: list[dict]) -> str:
    ms = {(r["mode"], r["seqlen"], r["causal"], r["provider"], r["way"]): r["ms"] for r in rows}
    lines = ["| mode | N | causal | ours eager | ours compiled | ours reduce-overhead | SDPA eager | SDPA compiled | "
             "SDPA reduce-overhead | ours compiled / eager | ours / SDPA, reduce-overhead |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode, seqlen, causal in sorted({key[:3] for key in ms}, key=lambda key: (key[0] != "fwd", key[1], key[2])):
        ours = [ms[(mode, seqlen, causal, "flashtriton", way)] for way in WAYS]
        sdpa = [ms[(mode, seqlen, causal, "sdpa", way)] for way in WAYS]
        cells = [f"{t:.3f}" for t in (*ours, *sdpa)]
        # ms ratios: above 1 means ours takes longer
        lines.append(f"| {mode} | {seqlen} | {'yes' if causal else 'no'} | {' | '.join(cells)} | "
                     f"{ours[1] / ours[0]:.2f} | {ours[2] / sdpa[2]:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/h200"))
    parser.add_argument("--seqlens", default="512,1024,2048,4096")
    parser.add_argument("--modes", default="fwd,fwd_bwd")
    args = parser.parse_args()
    warm_up_gpu()
    rows = run([int(n) for n in args.seqlens.split(",")], args.modes.split(","))
    meta = environment()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compiled.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    text = (f"# Eager and torch.compile on {meta.get('gpu')}\ntorch {meta.get('torch')}, triton {meta.get('triton')}, "
            f"commit {meta.get('commit')}.\n\nB=4, H=8, D=64, bf16, milliseconds (do_bench medians, median of {ROUNDS} "
            "interleaved rounds); ratios of milliseconds, above 1 means ours takes longer. "
            "`benchmarks/compiled.py`.\n\n" + table(rows) + "\n")
    (args.out / "compiled.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
