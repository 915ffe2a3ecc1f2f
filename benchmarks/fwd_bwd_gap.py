"""Why a forward + backward through autograd can take longer than the forward and the backward timed apart
(the cs336 suite: bench.py's fwd, bwd and fwd_bwd modes), on a GPU: the same call timed as the suite times it
(do_bench medians, L2 flushed, grads to None) in five forms, interleaved:

- `fwd`: the forward under no_grad; `bwd`: the backward alone, again and again on one graph;
- `fwd_bwd`: forward with autograd, then its backward (the suite's fwd_bwd);
- `fwd_grad`: the forward with autograd, its output dropped (what autograd's forward costs);
- `launchers`: attention_forward then attention_backward, the launchers without autograd;

and of `fwd_bwd` and `launchers`, a torch.profiler trace over five calls: each kernel's time per call, and the
GPU's idle time inside a call, the gaps between its kernels, with the kernels on either side of the largest.
One JSON line per shape. docs/performance.md, entry 112.

    PYTHONPATH=src python benchmarks/fwd_bwd_gap.py [--shapes 0,1]
"""

import statistics

import torch
from torch.profiler import ProfilerActivity, profile

import ab_runs
from flashtriton import flash_attention
from flashtriton.launch.backward import attention_backward
from flashtriton.launch.forward import attention_forward
from flashtriton.tools import bench

SHAPES = [(1, 16, 16384, 64, True), (4, 16, 4096, 128, True)]
CALLS = 5


def gaps(fn, grads) -> dict:
    """Kernel times per call and the idle gaps between consecutive kernels, over CALLS calls of `fn`."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            for x in grads:
                x.grad = None
            fn()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    names = [e.name[:50] for e in kernels]
    holes = [(kernels[i + 1].time_range.start - kernels[i].time_range.end, names[i], names[i + 1])
             for i in range(len(kernels) - 1)]
    busy = sum(e.time_range.elapsed_us() for e in kernels) / CALLS
    span = (kernels[-1].time_range.end - kernels[0].time_range.start) / CALLS
    per_kernel = {}
    for e, name in zip(kernels, names, strict=True):
        per_kernel[name] = round(per_kernel.get(name, 0) + e.time_range.elapsed_us() / CALLS, 1)
    largest = sorted(holes, reverse=True)[:6]
    return dict(busy_us=round(busy, 1), span_us=round(span, 1), idle_us=round(span - busy, 1),
                kernels_per_call=len(kernels) / CALLS, kernels_us=per_kernel,
                largest_gaps=[(round(g, 1), a, b) for g, a, b in largest])


def race(batch: int, heads: int, n: int, head_dim: int, causal: bool) -> dict:
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    scale = head_dim ** -0.5
    o = flash_attention(q, k, v, is_causal=causal)
    do = torch.randn_like(o)
    grads = [q, k, v]

    def fwd():
        with torch.no_grad():
            return flash_attention(q, k, v, is_causal=causal)

    def launchers():
        with torch.no_grad():
            out, lse = attention_forward(q, k, v, causal, scale)
            return attention_backward(do, q, k, v, out, lse, causal, scale)
    forms = {"fwd": fwd, "bwd": lambda: o.backward(do, retain_graph=True),
             "fwd_bwd": lambda: flash_attention(q, k, v, is_causal=causal).backward(do),
             "fwd_grad": lambda: flash_attention(q, k, v, is_causal=causal), "launchers": launchers}
    times = {name: [] for name in forms}
    for _ in range(3):
        for name, fn in forms.items():
            times[name].append(bench._time(fn, grads))  # (the suite's own timer)
    ms = {name: round(statistics.median(t), 4) for name, t in times.items()}
    ms["fwd_plus_bwd"] = round(ms["fwd"] + ms["bwd"], 4)
    return dict(shape=f"B{batch} H{heads} N{n} D{head_dim} {'causal' if causal else 'full'}", ms=ms,
                fwd_bwd_profile=gaps(forms["fwd_bwd"], grads), launchers_profile=gaps(launchers, grads),
                bwd_profile=gaps(forms["bwd"], grads))


if __name__ == "__main__":
    ab_runs.main(race, SHAPES, __doc__.split("\n\n")[0])
