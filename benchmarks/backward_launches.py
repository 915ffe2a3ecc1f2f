"""Where the library's backward spends its GPU time, on an sm_90 GPU: each kernel of one backward
(FLASHTRITON_BACKWARD=gluon: zeroing dQ's float32 buffer, the statistics launch, the Gluon dK/dV/dQ kernel,
dQ's un-permute) by torch.profiler, microseconds per call over five calls, beside the whole backward's
`do_bench` median and cuDNN's. One JSON line per shape. docs/performance.md, entry 80.

    PYTHONPATH=src python benchmarks/backward_launches.py [--shapes 0,1]
"""

import torch
from torch.profiler import ProfilerActivity, profile

import ab_runs
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


def race(batch: int, heads: int, n: int, head_dim: int, causal: bool) -> dict:
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = head_dim ** -0.5
    o, lse = attention_forward(q, k, v, causal, scale)
    backward = ab_runs.on_path(gluon_backward.BACKWARD_PATH_VARIABLE, "gluon",
                               lambda: attention_backward(do, q, k, v, o, lse, causal, scale))
    providers = {"gluon": backward, "cudnn": ab_runs.cudnn_backward(q, k, v, do, causal)}
    flops = 2.5 * 4 * batch * heads * n * n * head_dim / (2 if causal else 1)
    return ab_runs.shape_line(batch, heads, n, head_dim, causal, flops, ab_runs.timed_rounds(providers, 5),
                              kernels_us=kernel_times(backward))


if __name__ == "__main__":
    ab_runs.main(race, SHAPES, __doc__.split("\n\n")[0])
