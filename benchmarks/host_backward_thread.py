"""Where the host time that autograd adds to our backward goes (GPU only; NOTES entry 37 left ~300 µs
per forward + backward unexplained on the GPU host, against 60 µs on a CPU-only machine).

On a GPU, autograd runs a backward on its own device thread. Each call of `o.backward(dO)` on a tiny shape
(the GPU keeps up, so these are host times) is split by clock stamps into:
- handoff in: from the call to the first line of our Function's backward;
- body: our backward (`ops.attention_backward`), as it runs on autograd's thread;
- handoff out: from its last line to the call's return.
The same body called on the main thread gives the body's cost without the thread, and
`torch.autograd.set_multithreading_enabled(False)` runs autograd's backward on the calling thread. Then
the body is profiled on each thread (host_backward_loop's profile), and the paper suite's D=128 causal
N=1024 row is timed the suite's way (`do_bench`, eager) with the thread and without it.

    PYTHONPATH=src python benchmarks/host_backward_thread.py [--out DIR]
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

from flashtriton import flash_attention, ops
from flashtriton.testing import make_qkv
from host_autograd import Bare  # this folder is on the path when run as a script
from host_backward_loop import profile_our_backward

STAMPS: list[tuple[float, float]] = []


class Stamped(Bare):
    """host_autograd's bare Function, whose backward records when it starts and ends."""

    @staticmethod
    def backward(ctx, do):
        start = time.perf_counter()
        grads = Bare.backward(ctx, do)
        STAMPS.append((start, time.perf_counter()))
        return grads


def split_calls(o, do, calls: int) -> dict:
    """Median µs of the three parts of `o.backward(do)`."""
    for _ in range(50):
        o.backward(do, retain_graph=True)
    torch.cuda.synchronize()
    STAMPS.clear()
    outer = []
    for _ in range(calls):
        before = time.perf_counter()
        o.backward(do, retain_graph=True)
        outer.append((before, time.perf_counter()))
    torch.cuda.synchronize()
    parts = {"handoff in": [s - b for (b, _), (s, _) in zip(outer, STAMPS, strict=True)],
             "body": [e - s for s, e in STAMPS],
             "handoff out": [a - e for (_, a), (_, e) in zip(outer, STAMPS, strict=True)],
             "whole call": [a - b for b, a in outer]}
    return {name: statistics.median(values) * 1e6 for name, values in parts.items()}


def direct_body_us(q, k, v, o, lse, do, causal: bool, calls: int) -> float:
    times = []
    for i in range(calls + 50):
        start = time.perf_counter()
        ops.attention_backward(do, q, k, v, o, lse, causal, q.shape[-1] ** -0.5)
        if i >= 50:
            times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    results: dict = {}
    q, k, v = make_qkv(1, 2, 2, 128, 128, 64, torch.bfloat16, "cuda")
    do = torch.randn_like(q)
    o = Stamped.apply(q, k, v, True)
    plain = [x.detach() for x in (q, k, v)]
    o_plain, lse = ops.attention_forward(*plain, True, 64 ** -0.5)
    for multithreading in (True, False, True, False):  # twice each, alternating
        with torch.autograd.set_multithreading_enabled(multithreading):
            label = "autograd, device thread" if multithreading else "autograd, calling thread"
            results.setdefault(label, []).append(split_calls(o, do, args.calls))
        results.setdefault("direct call, main thread", []).append(
            {"body": direct_body_us(*plain, o_plain, lse, do, True, args.calls)})
    print("tiny shape (1, 2, 128, 64) causal, µs per backward (medians of calls; two rounds)")
    for label, rounds in results.items():
        print(f"  {label}")
        for part in rounds[0]:
            print(f"    {part:12s} " + "  ".join(f"{r[part]:8.1f}" for r in rounds))

    # The body's profile on each thread: the same calls, so the same functions, at whatever cost each thread pays.
    profiles = {}
    for label, multithreading in (("device thread", True), ("calling thread", False)):
        with torch.autograd.set_multithreading_enabled(multithreading):
            profiles[label] = profile_our_backward(o, do, 500)
        print(f"\nprofile of the body on the {label} (500 calls)")
        print("\n".join(profiles[label].splitlines()[:40]))

    # The suite's eager timing at a host-bound row: the same backward with and without the device thread.
    suite = {}
    for head_dim, batch, heads in ((128, 16, 16), (64, 16, 32)):
        q, k, v = make_qkv(batch, heads, heads, 1024, 1024, head_dim, torch.bfloat16, "cuda")
        do = torch.randn_like(q)
        fns = {}
        o_api = flash_attention(q, k, v, is_causal=True)
        o_sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        for label, out, multithreading in (("flash_attention, device thread", o_api, True),
                                           ("flash_attention, calling thread", o_api, False),
                                           ("SDPA, device thread", o_sdpa, True)):
            def run(out=out, multithreading=multithreading, do=do, inputs=(q, k, v)):
                with torch.autograd.set_multithreading_enabled(multithreading):
                    return triton.testing.do_bench(lambda: out.backward(do, retain_graph=True), warmup=25, rep=100,
                                                   grad_to_none=list(inputs), return_mode="median")
            fns[label] = run
        rounds = {label: [] for label in fns}
        for _ in range(5):
            for label, fn in fns.items():
                rounds[label].append(fn())
        key = f"B{batch} H{heads} N1024 D{head_dim} causal, do_bench ms"
        suite[key] = {label: dict(median=statistics.median(t), rounds=t) for label, t in rounds.items()}
        print(f"\n{key}")
        for label, t in rounds.items():
            print(f"  {label:34s} {statistics.median(t):.3f}   ({' '.join(f'{x:.3f}' for x in t)})")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "host_backward_thread.json").write_text(json.dumps(dict(tiny=results, suite=suite), indent=1))
        for label, text in profiles.items():
            (args.out / f"host_backward_profile_{label.replace(' ', '_')}.txt").write_text(text)


if __name__ == "__main__":
    main()
