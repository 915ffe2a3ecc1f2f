# ruff: noqa
# The scratch script that device call 7 of NOTES entry 38 ran from the repository root (ab_base/ as in
# run1.sh; output in diag_small2.log), kept as it ran; benchmarks/ab_paths.py is the maintained version.
"""Scratch: the suite's own timer for our backward, this tree against 698da17, at the small causal rows."""
import statistics
import sys

sys.path.insert(0, "benchmarks")
import torch

from ab_backward import interleaved_times
from ab_dkdv import load_package
from flashtriton import bench

base_ops = load_package("flashtriton_base", __import__("pathlib").Path("ab_base"))
base_bench = sys.modules.get("flashtriton_base.bench") or __import__("importlib").import_module("flashtriton_base.bench")
for B, H, N, D in ((16, 32, 1024, 64), (16, 16, 1024, 128), (8, 16, 2048, 128)):
    timers = {}
    for name, mod in (("new", bench), ("base", base_bench)):
        shape = mod.Shape(B, H, H, N, N, D, True)
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        for mode in ("bwd", "fwd_bwd"):
            for prov in (("flashtriton", "flex") if name == "new" else ("flashtriton",)):
                timers[f"{name} {prov} {mode}"] = mod.provider_timer(prov, shape, mode, q, k, v)
    times = interleaved_times(list(timers.values()), 3, timer=lambda t: t())
    print(f"B{B} H{H} N{N} D{D} causal", flush=True)
    for name, t in zip(timers, times):
        print(f"  {name:28s} {statistics.median(t):.3f} ms  rounds {['%.3f' % x for x in t]}", flush=True)
