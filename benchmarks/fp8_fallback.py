"""flash_attention_fp8 where its kernel does not run (FLASHTRITON_FORWARD=triton stands in for a GPU or
release without it), on a GPU: the e4m3 values go to the bf16 forward as they are, q's and k's descales
multiplying q or k and v's multiplying O on the device, with one factor per tensor (`fallback_per_tensor`)
or one per (batch, KV head) (`fallback_per_head`). Both beside the FP8 kernel and the bf16 forward on the
same values, that forward also on the Triton kernels alone (`bf16_triton`: what the fallback runs,
without its conversions and its descales); providers in interleaved rounds, do_bench medians, one JSON
line per shape (TFLOP/s). docs/performance.md, entries 102, 130, 139 and 141.

    PYTHONPATH=src python benchmarks/fp8_fallback.py [--shapes 0,1]
"""

import torch

import ab_runs
from flashtriton import flash_attention, flash_attention_fp8

ROUNDS = 3
# (batch, heads, N, head dim, causal)
SHAPES = [(4, 16, 4096, 128, False), (4, 16, 4096, 128, True), (4, 32, 4096, 64, False)]


def race(batch: int, heads: int, n: int, head_dim: int, causal: bool) -> dict:
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda").to(torch.float8_e4m3fn) for _ in range(3))
    per_tensor = [torch.ones(1, device="cuda") for _ in range(3)]
    per_head = [torch.ones(batch, heads, device="cuda") for _ in range(3)]

    def fp8(descales, path):
        q_descale, k_descale, v_descale = descales
        return ab_runs.on_path("FLASHTRITON_FORWARD", path, lambda: flash_attention_fp8(
            q, k, v, is_causal=causal, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale))
    q16, k16, v16 = (x.to(torch.bfloat16) for x in (q, k, v))
    providers = {"kernel": fp8(per_tensor, "auto"), "fallback_per_tensor": fp8(per_tensor, "triton"),
                 "fallback_per_head": fp8(per_head, "triton"),
                 "bf16": lambda: flash_attention(q16, k16, v16, is_causal=causal),
                 "bf16_triton": ab_runs.on_path("FLASHTRITON_FORWARD", "triton",
                                                lambda: flash_attention(q16, k16, v16, is_causal=causal))}
    ms = ab_runs.timed_rounds(providers, ROUNDS)
    flops = 4 * batch * heads * n * n * head_dim / (2 if causal else 1)
    return ab_runs.shape_line(batch, heads, n, head_dim, causal, flops, ms)


if __name__ == "__main__":
    ab_runs.main(race, SHAPES, __doc__.splitlines()[0])
