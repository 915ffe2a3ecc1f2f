# ruff: noqa
# The scratch script that device call 5 of NOTES entry 38 ran from the repository root (ab_base/ as in
# run1.sh; output in diag_small.log), kept as it ran; benchmarks/ab_paths.py is the maintained version.
"""Scratch: why the suite's small causal backward rows are slow."""
import statistics
import sys
import time

sys.path.insert(0, "benchmarks")
import torch

from ab_backward import interleaved_times
from ab_dkdv import load_package
from flashtriton import api, ops
from flashtriton.testing import make_qkv
from flashtriton.tuning import TileConfig

base_ops = load_package("flashtriton_base", __import__("pathlib").Path("ab_base"))
base_api = sys.modules["flashtriton_base.api"]
for B, H, N in ((16, 32, 1024), (8, 32, 2048), (1, 16, 16384)):
    q, k, v = make_qkv(B, H, H, N, N, 64, torch.bfloat16, "cuda", requires_grad=True)
    do = torch.randn_like(q)
    calls = {}
    with torch.no_grad():
        o, lse = ops.attention_forward(q, k, v, True, 64 ** -0.5)
    cfg_new = (TileConfig(64, 64, 4, 3, True, max_registers=168), TileConfig(128, 64, 8, 3, True))
    cfg_old = (TileConfig(64, 64, 4, 3, True), TileConfig(128, 64, 8, 3, True))
    calls["base static"] = lambda: base_ops.attention_backward(do, q, k, v, o, lse, True, 0.125, cfg_old, False)
    calls["new static"] = lambda: ops.attention_backward(do, q, k, v, o, lse, True, 0.125, cfg_new, False)
    calls["base autotuned"] = lambda: base_ops.attention_backward(do, q, k, v, o, lse, True, 0.125, None, True)
    calls["new autotuned"] = lambda: ops.attention_backward(do, q, k, v, o, lse, True, 0.125, None, True)
    for name, mod in (("base", base_api), ("new", api)):
        out = mod.flash_attention(q, k, v, is_causal=True)
        calls[f"{name} autograd"] = (lambda out=out: out.backward(do, retain_graph=True))
    for c in calls.values():
        c()
    torch.cuda.synchronize()
    times = interleaved_times(list(calls.values()), 3, warmup=25, rep=100, grad_to_none=[q, k, v])
    print(f"B{B} H{H} N{N} D64 causal bwd", flush=True)
    for name, t in zip(calls, times):
        # host time of one call, GPU left to drain first
        torch.cuda.synchronize(); s = time.perf_counter(); calls[name](); h = time.perf_counter() - s
        torch.cuda.synchronize()
        print(f"  {name:16s} {statistics.median(t):.3f} ms  rounds {['%.3f' % x for x in t]}  host {h*1e6:.0f} us", flush=True)
    print("  picks:", ops.last_backward_choice(), flush=True)
