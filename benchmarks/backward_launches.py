"""Where the library's backward spends its GPU time, on an sm_90 GPU: each kernel of one backward
(FLASHTRITON_BACKWARD=gluon: the statistics launch, which also zeroes dQ's float32 buffer, the Gluon
dK/dV/dQ kernel, dQ's un-permute or cast) by torch.profiler, microseconds per call over five calls, beside
the whole backward's `do_bench` median and cuDNN's; and the same backward with the buffer zeroed by a fill
of its own before the statistics launch, as before entry 109 (`gluon_zeroing_apart`, its kernels in
`kernels_us_zeroing_apart`). One JSON line per shape. docs/performance.md, entries 80 and 109.

    PYTHONPATH=src python benchmarks/backward_launches.py [--shapes 0,1]
"""

from unittest import mock

import torch
from torch.profiler import ProfilerActivity, profile

import ab_runs
from flashtriton.cache import CACHE
from flashtriton.launch import backward as backward_launchers
from flashtriton.launch import gluon_backward
from flashtriton.launch.backward import attention_backward
from flashtriton.launch.forward import attention_forward

CALLS = 5
# (batch, heads, N, head dim, causal): the paper suite's D = 64 causal row at N = 4096, cs336's, D = 128;
# then D = 256 (the kernel's form there, launch/gluon_backward.py: splits_columns)
SHAPES = [(4, 32, 4096, 64, True), (1, 16, 16384, 64, True), (4, 16, 4096, 128, False),
          (4, 16, 2048, 256, True), (4, 16, 2048, 256, False)]


def kernel_times(fn) -> dict[str, float]:
    """Each GPU kernel's time in µs per call of `fn` (its name cut to 60 characters)."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    return {event.key[:60]: round(event.self_device_time_total / CALLS, 1) for event in prof.key_averages()
            if event.self_device_time_total > 0}


def own_plans(fn, zeroing_apart: bool = False):
    """`fn` with recorded plans of its own (so that each form replays its own launches), and with
    `zeroing_apart` dQ's buffer made by torch.zeros and a statistics launch that does not zero it."""
    plans = {}
    accumulator, statistics = gluon_backward.dq_accumulator, backward_launchers.statistics_launch

    def zeroed(*args, **kwargs):
        return accumulator(*args, **{**kwargs, "zeroed": True})

    def statistics_alone(o, do, lse, lse2, delta, varlen, kernel, zeros=None):
        return statistics(o, do, lse, lse2, delta, varlen, kernel)

    def run():
        with mock.patch.object(CACHE, "plans", plans):
            if not zeroing_apart:
                return fn()
            with (mock.patch.object(gluon_backward, "dq_accumulator", zeroed),
                  mock.patch.object(backward_launchers, "statistics_launch", statistics_alone)):
                return fn()
    return run


def race(batch: int, heads: int, n: int, head_dim: int, causal: bool) -> dict:
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = head_dim ** -0.5
    o, lse = attention_forward(q, k, v, causal, scale)
    backward = ab_runs.on_path(gluon_backward.BACKWARD_PATH_VARIABLE, "gluon",
                               lambda: attention_backward(do, q, k, v, o, lse, causal, scale))
    fused, apart = own_plans(backward), own_plans(backward, zeroing_apart=True)
    same = all(torch.equal(a, b) for a, b in zip(fused()[1:], apart()[1:], strict=True))  # dK, dV: one writer each
    dq_gap = (fused()[0].float() - apart()[0].float()).abs().max().item()  # dQ: atomic sums, order varies
    # (the fused form again, last in each round: its gap to the first is what a place in the round is worth)
    providers = {"gluon": fused, "gluon_zeroing_apart": apart, "gluon_again": fused,
                 "cudnn": ab_runs.cudnn_backward(q, k, v, do, causal)}
    flops = 2.5 * 4 * batch * heads * n * n * head_dim / (2 if causal else 1)
    return ab_runs.shape_line(batch, heads, n, head_dim, causal, flops, ab_runs.timed_rounds(providers, 5),
                              kernels_us=kernel_times(fused), kernels_us_zeroing_apart=kernel_times(apart),
                              dkdv_equal=same, dq_largest_gap=dq_gap)


if __name__ == "__main__":
    ab_runs.main(race, SHAPES, __doc__.split("\n\n")[0])
