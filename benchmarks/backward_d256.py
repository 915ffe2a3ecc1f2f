"""The D = 256 backward: the Triton kernels (FLASHTRITON_BACKWARD=triton) on their autotuner's candidates
(`tuned`, what auto runs below AUTO_MIN_KEYS) and on their static tiles (FLASHTRITON_AUTOTUNE=0); the Gluon
kernel's form for D = 256 (FLASHTRITON_BACKWARD=gluon) with dQ by its TMA reductions (`gluon`) and,
deterministic, with the Triton dQ kernel (`gluon_deterministic`); and cuDNN's backward: the backward
alone, do_bench medians of interleaved rounds, and each one's largest gradient difference from cuDNN's
(docs/performance.md, entries 101, 104, 106 and 107).

    PYTHONPATH=src python benchmarks/backward_d256.py [--shapes 0,1]
"""

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import ab_runs
from flashtriton import flash_attention
from flashtriton.tools.bench import environment_variable

ROUNDS = 5
SHAPES = [(4, 16, 2048, 256, True), (2, 16, 4096, 256, True), (4, 16, 2048, 256, False)]


def _backward(q, k, v, do, forward) -> callable:
    """A provider that runs the backward of one forward (made once) again, gradients cleared first."""
    o = forward()

    def run():
        q.grad = k.grad = v.grad = None
        o.backward(do, retain_graph=True)
    return run


def race(batch: int, heads: int, n: int, head_dim: int, causal: bool) -> dict:
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    do = torch.randn_like(q)
    providers = {}
    for name, autotune in (("static", "0"), ("tuned", "1")):  # the variables are read at each call
        with environment_variable("FLASHTRITON_AUTOTUNE", autotune):
            backward = _backward(q, k, v, do, lambda: flash_attention(q, k, v, is_causal=causal))
        providers[name] = ab_runs.on_path("FLASHTRITON_BACKWARD", "triton", ab_runs.inside(
            lambda a=autotune: environment_variable("FLASHTRITON_AUTOTUNE", a), backward))
    for name, deterministic in (("gluon", False), ("gluon_deterministic", True)):  # (the path: read by the backward)
        backward = _backward(q, k, v, do, lambda d=deterministic: flash_attention(q, k, v, is_causal=causal,
                                                                                  deterministic=d))
        providers[name] = ab_runs.on_path("FLASHTRITON_BACKWARD", "gluon", backward)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        providers["cudnn"] = _backward(q, k, v, do, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    grads = {}
    for name, fn in providers.items():
        fn()
        grads[name] = [x.grad.float() for x in (q, k, v)]
    differences = {name: max((a - b).abs().max().item() for a, b in zip(grads[name], grads["cudnn"], strict=True))
                   for name in ("static", "tuned", "gluon", "gluon_deterministic")}
    providers["static_again"] = providers["static"]  # last in each round: what the first place is worth
    ms = ab_runs.timed_rounds(providers, ROUNDS)
    flops = 2.5 * 4 * batch * heads * n * n * head_dim / (2 if causal else 1)
    return ab_runs.shape_line(batch, heads, n, head_dim, causal, flops, ms, max_grad_diff_vs_cudnn=differences)


if __name__ == "__main__":
    ab_runs.main(race, SHAPES, __doc__.split("\n\n")[0])
