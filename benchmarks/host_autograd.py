"""What autograd adds to a forward + backward (GPU only), in one process, interleaved round by round:

- "launchers": ops.attention_forward then ops.attention_backward, no autograd;
- "bare Function": the same two calls inside a minimal torch.autograd.Function;
- "flash_attention": the public API (checks, views, the no-second-derivative guard) through autograd;
- "SDPA": F.scaled_dot_product_attention through autograd, for scale.

On a tiny shape the GPU keeps up, so the per-call times are host time (calls in a loop, one sync at the
end); on cs336's shape they are `triton.testing.do_bench` medians, where any extra GPU work shows.

    PYTHONPATH=src python benchmarks/host_autograd.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing

from ab_backward import interleaved_times  # this folder is on the path when run as a script
from flashtriton import flash_attention, ops
from flashtriton.testing import make_qkv
from host_overhead import fwd_bwd, per_call_us


class Bare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal):
        o, lse = ops.attention_forward(q, k, v, causal, q.shape[-1] ** -0.5)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal = causal
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        return *ops.attention_backward(do, q, k, v, o, lse, ctx.causal, q.shape[-1] ** -0.5), None


def calls(q, k, v, do, causal: bool) -> dict:
    plain = [x.detach() for x in (q, k, v)]

    def launchers():
        o, lse = ops.attention_forward(*plain, causal, q.shape[-1] ** -0.5)
        ops.attention_backward(do, *plain, o, lse, causal, q.shape[-1] ** -0.5)

    return {"launchers": launchers,
            "bare Function": fwd_bwd(lambda q, k, v: Bare.apply(q, k, v, causal), q, k, v, do),
            "flash_attention": fwd_bwd(lambda q, k, v: flash_attention(q, k, v, is_causal=causal), q, k, v, do),
            "SDPA": fwd_bwd(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), q, k, v, do)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results = {}

    def bench_ms(fn):
        return triton.testing.do_bench(fn, warmup=10, rep=100)
    cases = {"tiny (1, 2, 128, 64), µs of host time per call": ((1, 2, 2, 128, 128, 64), False, per_call_us),
             "cs336 (1, 16, 16384, 64, causal), do_bench ms": ((1, 16, 16, 16384, 16384, 64), True, bench_ms)}
    for name, (shape, causal, timer) in cases.items():
        q, k, v = make_qkv(*shape, torch.bfloat16, "cuda")
        do = torch.randn_like(q)
        fns = calls(q, k, v, do, causal)
        for fn in fns.values():  # compile and autotune outside the timed rounds
            fn()
        times = dict(zip(fns, interleaved_times(list(fns.values()), args.rounds, timer=timer), strict=True))
        results[name] = {label: statistics.median(t) for label, t in times.items()}
        print(name, flush=True)
        for label, t in results[name].items():
            print(f"  {label:16s} {t:9.3f}   (rounds: {', '.join(f'{x:.3f}' for x in times[label])})", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "host_autograd.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
