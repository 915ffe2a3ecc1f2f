"""What a timed backward costs when its gradients are added into the last call's instead of dropped, on a
GPU: the bwd mode of the suites (tools/bench.py) timed our backward on one kept graph with q's, k's and
v's gradients set to None before each call, but gave FlashAttention-4's (B, N, H, D) copies of them no
such reset until 5ceb98c, so each timed FA4 backward also ran three read-add-writes of its gradients. Per
shape, interleaved rounds of do_bench medians (L2 flushed): our backward with the gradients dropped
(`bwd`, as the suites time it) and added into the last call's (`bwd_accumulated`, as FA4's was timed),
and the three in-place adds alone (`adds`). One JSON line per shape; docs/performance.md, entry 135.

    PYTHONPATH=src python benchmarks/grad_accumulation.py [--shapes 0,1]
"""

import statistics

import torch
import triton.testing

import ab_runs
from flashtriton import flash_attention

# cs336, then the paper suite's rows of the FA4 table (B = 16384 / N, H = 2048 / D)
SHAPES = [(1, 16, 16384, 64, True), (4, 16, 4096, 128, True), (4, 16, 4096, 128, False),
          (1, 16, 16384, 128, True), (4, 32, 4096, 64, True), (1, 32, 16384, 64, True)]


def race(batch: int, heads: int, n: int, head_dim: int, causal: bool) -> dict:
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    o = flash_attention(q, k, v, is_causal=causal)
    do = torch.randn_like(o)
    grads = [torch.randn_like(x) for x in (q, k, v)]
    news = [torch.randn_like(x) for x in (q, k, v)]

    def adds():
        for g, new in zip(grads, news, strict=True):
            g.add_(new)  # what autograd's AccumulateGrad runs when a leaf already holds a gradient

    def backward():
        o.backward(do, retain_graph=True)
    forms = {"bwd": (backward, [q, k, v]), "bwd_accumulated": (backward, None), "adds": (adds, None)}
    times = {name: [] for name in forms}
    for _ in range(3):
        for name, (fn, to_none) in forms.items():
            times[name].append(triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=to_none,
                                                       return_mode="median"))
    ms = {name: round(statistics.median(t), 4) for name, t in times.items()}
    ms["accumulated_minus_bwd"] = round(ms["bwd_accumulated"] - ms["bwd"], 4)
    return dict(shape=f"B{batch} H{heads} N{n} D{head_dim} {'causal' if causal else 'full'}",
                gpu=torch.cuda.get_device_name(), ms=ms)


if __name__ == "__main__":
    ab_runs.main(race, SHAPES, __doc__.split("\n\n")[0])
