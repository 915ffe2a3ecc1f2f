"""The Gluon backward (FLASHTRITON_BACKWARD=gluon) against the Triton one, on an sm_90 GPU: the whole
backward on each path ("gluon": the statistics launch, then dK, dV and dQ from one loop, dQ added into a
zeroed float32 buffer by TMA reductions and cast; "gluon_det": under torch.use_deterministic_algorithms,
the Gluon dK/dV kernel and the Triton dQ kernel), the dK/dV part alone (the statistics launch and dK/dV: no
dQ), and cuDNN's backward beside them. Providers in
interleaved rounds, `do_bench` medians, bf16; prints one JSON line per shape: TFLOP/s (the backward's
2.5x the forward's FLOPs; the dK/dV part's rate on the same count, so its figures compare between paths
only) and each path's largest dQ, dK and dV error against SDPA's gradients in float32.
docs/performance.md, entry 57.

    PYTHONPATH=src python benchmarks/gluon_backward_ab.py [--shapes 0,2]
"""

import torch

import ab_runs
from flashtriton.launch import gluon_backward
from flashtriton.launch.backward import attention_backward
from flashtriton.launch.forward import attention_forward

ROUNDS = 5
# (batch, heads, N, head dim, causal): the paper suite's shapes at N = 4096, cs336's, and from index 8 the
# shorter ones around gluon_backward_selected's bounds
SHAPES = [(4, 16, 4096, 128, False), (4, 16, 4096, 128, True), (1, 16, 16384, 128, True), (4, 32, 4096, 64, False),
          (4, 32, 4096, 64, True), (1, 16, 16384, 64, True), (16, 16, 1024, 128, True), (8, 16, 2048, 128, False),
          (8, 16, 2048, 128, True), (16, 16, 1024, 128, False), (32, 16, 512, 128, False), (8, 16, 2048, 64, False),
          (16, 16, 1024, 64, False), (2, 16, 8192, 64, True), (8, 16, 2048, 64, True)]


def on_path(path: str, fn):
    """fn with FLASHTRITON_BACKWARD set to `path` while it runs."""
    return ab_runs.on_path(gluon_backward.BACKWARD_PATH_VARIABLE, path, fn)


def race(batch: int, heads: int, n: int, head_dim: int, causal: bool) -> dict:
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = head_dim ** -0.5
    o, lse = attention_forward(q, k, v, causal, scale)

    def backward(needs=(True, True, True)):
        return attention_backward(do, q, k, v, o, lse, causal, scale, needs=needs)

    def deterministic():
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            return backward()
        finally:
            torch.use_deterministic_algorithms(False)
    providers = {"triton": on_path("triton", backward), "gluon": on_path("gluon", backward),
                 "triton_dkdv": on_path("triton", lambda: backward((False, True, True))),
                 "gluon_det": on_path("gluon", deterministic),
                 "gluon_dkdv": on_path("gluon", lambda: backward((False, True, True))),
                 "cudnn": ab_runs.cudnn_backward(q, k, v, do, causal)}
    grads = ab_runs.float32_gradients(q, k, v, do, causal)
    errors = {}
    for path in ("triton", "gluon", "gluon_det"):
        dq, dk, dv = providers[path]()
        errors[path] = {name: ab_runs.largest_error(g, r)
                        for name, g, r in zip(("dq", "dk", "dv"), (dq, dk, dv), grads, strict=True)}
    flops = 2.5 * 4 * batch * heads * n * n * head_dim / (2 if causal else 1)
    return ab_runs.shape_line(batch, heads, n, head_dim, causal, flops, ab_runs.timed_rounds(providers, ROUNDS),
                              err=errors)


if __name__ == "__main__":
    ab_runs.main(race, SHAPES, __doc__.split("\n\n")[0])
