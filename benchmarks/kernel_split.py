"""Where a backward's time goes as the sequence grows at a fixed B * N (GPU only): our backward split into
its kernels, next to the peers' backward, all in one process and interleaved round by round, so that the
clocks' drift (the H200 slows by up to ~10% as it warms) hits every line alike.

Lines per case:
- "ours": the whole backward through the launchers (autotuned, as a user's call);
- "ours D+dQ" and "ours D+dK/dV": the same with only dq, or only dk and dv, wanted (the preprocess runs in
  both); their difference from "ours" is the other kernel's time;
- "ours preprocess alone": the preprocess kernel (D = rowsum(dO * O) and L * log2 e) by itself, launched as
  the backward does;
- "flashtriton", "sdpa_flash", "sdpa_cudnn", "flex": the backward through autograd, as the suites time it
  (ours included: its difference from "ours" is the autograd path's).

TFLOP/s count the backward's FLOPs as bench.py does (2.5x the forward's; the visible half when causal).

    PYTHONPATH=src python benchmarks/kernel_split.py --case 1,16,16384,128,causal [--case ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from pathlib import Path

import torch

from ab_backward import interleaved_times, parse_case  # this folder is on the path when run as a script
from flashtriton import ops
from flashtriton.bench import Shape, _time, provider_timer, warm_up_gpu
from flashtriton.testing import make_qkv


def ours(do, q, k, v, o, lse, causal: bool, needs):
    scale = q.shape[-1] ** -0.5
    return lambda: ops.attention_backward(do, q, k, v, o, lse, causal, scale, autotune=True, needs=needs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", required=True, help="B,H,N,D[,causal]")
    parser.add_argument("--peers", default="flashtriton,sdpa_flash,sdpa_cudnn,flex")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--name", default="kernel_split")
    args = parser.parse_args()
    warm_up_gpu()
    rows = []
    for case in args.case:
        batch, heads, seqlen, head_dim, causal = parse_case(case)
        shape = Shape(batch, heads, heads, seqlen, seqlen, head_dim, causal)
        q, k, v = make_qkv(batch, heads, heads, seqlen, seqlen, head_dim, torch.bfloat16, "cuda")
        o, lse = ops.attention_forward(q.detach(), k.detach(), v.detach(), shape.causal, head_dim ** -0.5)
        do = torch.randn_like(o)
        plain = [x.detach() for x in (q, k, v)]
        calls = {"ours": ours(do, *plain, o, lse, shape.causal, (True, True, True)),
                 "ours D+dQ": ours(do, *plain, o, lse, shape.causal, (True, False, False)),
                 "ours D+dK/dV": ours(do, *plain, o, lse, shape.causal, (False, True, True)),
                 "ours preprocess alone": functools.partial(ops.backward_stats, o, do, lse)}
        for call in calls.values():  # autotune and compile outside the timed rounds
            call()
        # each a function that times one call, as the suites do (bench.provider_timer for the peers)
        timers = {name: functools.partial(_time, call) for name, call in calls.items()}
        for name in filter(None, args.peers.split(",")):
            timers[name] = provider_timer(name, shape, "bwd", q, k, v)
        times = interleaved_times(list(timers.values()), args.rounds, timer=lambda timed: timed())
        ms = {name: statistics.median(t) for name, t in zip(timers, times, strict=True)}
        ms["dQ alone (ours - D+dK/dV)"] = ms["ours"] - ms["ours D+dK/dV"]
        ms["dK/dV alone (ours - D+dQ)"] = ms["ours"] - ms["ours D+dQ"]
        flops = shape.flops("bwd")
        print(f"{shape} [{ops.last_backward_choice()}]", flush=True)
        for name, value in ms.items():
            part = name.startswith(("dQ", "dK", "ours preprocess alone"))
            share = f"{value / ms['ours']:6.1%} of ours" if part else f"{flops / value / 1e9:6.0f} TFLOP/s"
            print(f"  {name:28s} {value:8.3f} ms  {share}", flush=True)
        rows.append(dict(case=case, ms=ms, all_ms=dict(zip(timers, times, strict=True)),
                         tiles=ops.last_backward_choice()))
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{args.name}.json").write_text(json.dumps(
                dict(gpu=torch.cuda.get_device_name(), rows=rows), indent=1))
        del q, k, v, o, lse, do, plain, calls, timers
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
