"""The Gluon forward at D = 128 on wide key blocks (block_n = WIDE_BLOCK_N, 192 keys: FlashAttention-4's
Hopper tile without a mask) against its 128-key blocks, on an sm_90 GPU, with cuDNN beside them: providers in
interleaved rounds, `do_bench` medians, bf16, the library's flags; one JSON line per shape (TFLOP/s, and each
Gluon output's largest difference from cuDNN's). The causal shapes say whether wide blocks pay where
the diagonal's blocks are masked too (FA4 takes 128 there). docs/performance.md, entry 129.

    PYTHONPATH=src python benchmarks/gluon_wide_ab.py [--shapes 0,1]
"""

import torch

import ab_runs
from flashtriton.launch import gluon_forward

ROUNDS = 5
# (batch, heads, N, head dim, causal): the paper suite's D = 128 rows at 4096 and 16384 keys, and 8192
SHAPES = [(4, 16, 4096, 128, False), (1, 16, 16384, 128, False), (2, 16, 8192, 128, False),
          (4, 16, 4096, 128, True), (1, 16, 16384, 128, True), (8, 16, 2048, 128, False)]


def race(batch: int, heads: int, n: int, head_dim: int, causal: bool) -> dict:
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    scale = head_dim ** -0.5

    def gluon(block_n=None, pingpong=False):
        return lambda: gluon_forward.attention_forward_gluon(q, k, v, causal, scale, True, pingpong,
                                                             block_n=block_n)[0]
    providers = {"n128": gluon(), "n192": gluon(gluon_forward.WIDE_BLOCK_N),
                 "n192_pingpong": gluon(gluon_forward.WIDE_BLOCK_N, True), "cudnn": ab_runs.cudnn(q, k, v, causal)}
    reference = providers["cudnn"]().float()
    errors = {name: float(f"{(fn().float() - reference).abs().max().item():.2e}")
              for name, fn in providers.items() if name != "cudnn"}
    ms = ab_runs.timed_rounds(providers, ROUNDS)
    flops = 4 * batch * heads * n * n * head_dim / (2 if causal else 1)
    return ab_runs.shape_line(batch, heads, n, head_dim, causal, flops, ms, max_diff_from_cudnn=errors)


if __name__ == "__main__":
    ab_runs.main(race, SHAPES, __doc__.splitlines()[0])
