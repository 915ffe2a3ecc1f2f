"""A/B/C... of forward tile configs in one process (GPU only), interleaved round by round as in
ab_dkdv.py, so that a drift of the clocks hits every config alike. Each config builds its own tensor
descriptors (the static path), so TMA configs of any tile can be compared; the report is each config's
median over rounds and its speedup over the first.

    PYTHONPATH=src python benchmarks/ab_forward.py --case 1,16,16384,64,causal \\
        --variant 128,64,4,3,tma --variant 64,128,4,2,tma [--out DIR --name NAME]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from pathlib import Path

import torch

from ab_backward import interleaved_times, parse_case  # this folder is on the path when run as a script
from ab_dkdv import tile
from flashtriton import ops
from flashtriton.bench import Shape
from flashtriton.testing import make_qkv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", required=True, help="B,H,N,D[,causal]")
    parser.add_argument("--variant", action="append", required=True, help="BLOCK_M,BLOCK_N,warps,stages[,tma]")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--name", default="ab_forward")
    args = parser.parse_args()
    configs = [tile(v) for v in args.variant]
    rows = []
    for case in args.case:
        batch, heads, seqlen, head_dim, causal = parse_case(case)
        shape = Shape(batch, heads, heads, seqlen, seqlen, head_dim, causal)
        q, k, v = make_qkv(batch, heads, heads, seqlen, seqlen, head_dim, torch.bfloat16, "cuda",
                           requires_grad=False)
        calls = [functools.partial(ops.attention_forward, q, k, v, shape.causal, head_dim ** -0.5, cfg)
                 for cfg in configs]
        outputs = [call()[0] for call in calls]  # compile outside the timed rounds
        times = interleaved_times(calls, args.rounds, warmup=10, rep=50)
        first = statistics.median(times[0])
        print(f"B{batch} H{heads} N{seqlen} D{head_dim} causal={shape.causal}", flush=True)
        for cfg, out, all_ms in zip(configs, outputs, times, strict=True):
            ms = statistics.median(all_ms)
            diff = (out.float() - outputs[0].float()).abs().max().item()
            rows.append(dict(case=case, config=cfg.name, ms=ms, speedup=first / ms,
                             tflops=shape.flops("fwd") / ms / 1e9, max_abs_diff=diff, all_ms=all_ms))
            print(f"  {cfg.name:22s} {ms:8.3f} ms  {shape.flops('fwd') / ms / 1e9:5.0f} TFLOP/s  x{first / ms:.3f}"
                  f"  O differs {diff:.1e}", flush=True)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{args.name}.json").write_text(json.dumps(
                dict(gpu=torch.cuda.get_device_name(), variants=args.variant, rows=rows), indent=1))
        del q, k, v, outputs, calls


if __name__ == "__main__":
    main()
