"""A/B of the backward's launch choices in one process (GPU only), interleaved so that clock drift
between runs cannot pose as a gain (the suites of separate runs move 2-3% on their own):

- "order": the dK/dV kernel's causal launch order (groups of heads that share the L2, each head's
  longest key tile first) against the old one (head by head: the same code with groups of one head);
- "tma": at D=128 causal, dK/dV's 64 x 128 tile on TMA descriptors against block pointers (dQ fixed).

Each variant is timed `--rounds` times in turn with `triton.testing.do_bench` (median); the report is
the median over rounds, and B / A as a speedup.

    PYTHONPATH=src python benchmarks/ab_backward.py [--out DIR] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import triton.testing

from flashtriton import ops
from flashtriton.testing import make_qkv
from flashtriton.tuning import TileConfig

SHAPES = [  # (B, H, N, D), all causal: where the launch order matters
    (1, 16, 16384, 64),  # cs336
    (4, 32, 4096, 64), (16, 32, 1024, 64),
    (8, 16, 2048, 128), (4, 16, 4096, 128), (2, 16, 8192, 128),
]


def _backward(q, k, v, o, lse, do, **kwargs):
    return lambda: ops.attention_backward(do, q, k, v, o, lse, True, q.shape[-1] ** -0.5, **kwargs)


def _with_dkdv_groups_of_one(fn, q):
    """fn with the dK/dV launch's head groups forced to one head (the order before the change); the
    dK/dV launcher passes `q` as its streamed tensor, the dQ launcher `k`."""
    original = ops._heads_per_group

    def groups(streamed, heads_per_stream, causal_order):
        return 1 if streamed is q else original(streamed, heads_per_stream, causal_order)

    def run():
        ops._heads_per_group = groups
        try:
            return fn()
        finally:
            ops._heads_per_group = original
    return run


def interleaved_times(calls, rounds: int, timer=None, **bench_kwargs) -> list[list[float]]:
    """Every time of each call: `rounds` rounds of `timer(call)` (default: `triton.testing.do_bench` with
    `bench_kwargs`, in ms), the calls in turn in each, so that a drift of the clocks hits all alike."""
    timer = timer or (lambda call: triton.testing.do_bench(call, **bench_kwargs))
    times = [[] for _ in calls]
    for _ in range(rounds):
        for call, call_times in zip(calls, times, strict=True):
            call_times.append(timer(call))
    return times


def parse_case(text: str) -> tuple[int, int, int, int, bool]:
    """"B,H,N,D" or "B,H,N,D,causal" -> (B, H, N, D, causal): the scripts' --case."""
    *dims, causal = text.split(",") if text.endswith("causal") else (*text.split(","), "")
    batch, heads, seqlen, head_dim = map(int, dims)
    return batch, heads, seqlen, head_dim, causal == "causal"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for batch, heads, seqlen, head_dim in SHAPES:
        q, k, v = make_qkv(batch, heads, heads, seqlen, seqlen, head_dim, torch.bfloat16, "cuda",
                           requires_grad=False)
        o, lse = ops.attention_forward(q, k, v, True, head_dim ** -0.5)
        do = torch.randn_like(o)
        new = _backward(q, k, v, o, lse, do, autotune=True)
        old = _with_dkdv_groups_of_one(new, q)
        variants = {"order": (old, new)}
        if head_dim == 128:
            dq_cfg = TileConfig(128, 64, 8, 3, True)
            variants["tma"] = (_backward(q, k, v, o, lse, do, configs=(TileConfig(64, 128, 8, 3), dq_cfg)),
                               _backward(q, k, v, o, lse, do, configs=(TileConfig(64, 128, 8, 3, True), dq_cfg)))
        for name, (a, b) in variants.items():
            a(), b()  # compile and autotune outside the timing
            times_a, times_b = interleaved_times((a, b), args.rounds)
            ta, tb = statistics.median(times_a), statistics.median(times_b)
            rows.append(dict(shape=[batch, heads, seqlen, head_dim], ab=name, a_ms=ta, b_ms=tb, speedup=ta / tb,
                             a_all=times_a, b_all=times_b, choice=ops.last_backward_choice()))
            print(f"B{batch} H{heads} N{seqlen} D{head_dim} {name:5s}  A {ta:.3f} ms  B {tb:.3f} ms  "
                  f"B/A speedup {ta / tb:.3f}  ({ops.last_backward_choice()})", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ab_backward.json").write_text(json.dumps(
            dict(gpu=torch.cuda.get_device_name(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
