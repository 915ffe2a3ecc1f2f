"""The Gluon forward's tile at D = 128, on an sm_90 GPU: the library's two softmax warpgroups with 128-key
blocks (128 x 128, FlashAttention-3's and -4's tile there) against three warpgroups with 64-key blocks
(192 x 64: at 160 registers a thread holds S of 64 keys beside O, where 128 keys spill; entry 49) in 2, 3
and 4 stages, and two warpgroups with 64-key blocks in 4. Overlapped form, the library's flags, bf16,
providers in interleaved rounds, `do_bench` medians; one JSON line per shape (TFLOP/s, and each output's
largest difference from the library's form). docs/performance.md, entry 131.

    PYTHONPATH=src python benchmarks/gluon_tiles_ab.py [--shapes 0,1]
"""

import torch

import ab_runs
from flashtriton.launch import gluon_forward

ROUNDS = 5
# (batch, heads, N, head dim, causal)
SHAPES = [(4, 16, 4096, 128, False), (4, 16, 4096, 128, True), (1, 16, 16384, 128, True), (2, 16, 8192, 128, False),
          (16, 16, 1024, 128, False), (1, 16, 16384, 128, False)]
# name: (softmax warpgroups, keys per block, stages)
FORMS = {"wg2_n128_s2": (2, 128, 2), "wg3_n64_s2": (3, 64, 2), "wg3_n64_s3": (3, 64, 3), "wg3_n64_s4": (3, 64, 4),
         "wg2_n64_s4": (2, 64, 4)}


def race(batch: int, heads: int, n: int, head_dim: int, causal: bool) -> dict:
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    scale = head_dim ** -0.5
    providers = {name: (lambda wg=wg, keys=keys, stages=stages: gluon_forward.attention_forward_gluon(
        q, k, v, causal, scale, block_n=keys, stages=stages, warpgroups=wg)[0])
        for name, (wg, keys, stages) in FORMS.items()}
    library = providers["wg2_n128_s2"]()
    errors = {name: ab_runs.largest_error(fn(), library) for name, fn in providers.items()}
    flops = 4 * batch * heads * n * n * head_dim / (2 if causal else 1)
    return ab_runs.shape_line(batch, heads, n, head_dim, causal, flops, ab_runs.timed_rounds(providers, ROUNDS),
                              err=errors)


if __name__ == "__main__":
    ab_runs.main(race, SHAPES, __doc__.split("\n\n")[0])
