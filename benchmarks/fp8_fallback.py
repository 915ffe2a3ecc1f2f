"""flash_attention_fp8 where its kernel does not run (FLASHTRITON_FORWARD=triton stands in for a GPU or
release without it), on a GPU: the e4m3 values go to the bf16 forward as they are, with one factor per
tensor (`fallback_per_tensor`: q's and k's folded into the scale on the host) or one per (batch, KV head)
(`fallback_per_head`: q's and k's multiplying q or k on the device); v's multiply O. Both beside the FP8
kernel and the bf16 forward on the same values, that forward also on the Triton kernels alone
(`bf16_triton`: what the fallback runs, without its conversions and its descales); providers in
interleaved rounds, do_bench medians, one JSON line per shape (TFLOP/s), with the largest difference of
each fallback's O from the per-tensor one's. With --base (an earlier commit's api.py, `git show
<commit>:src/flashtriton/api.py > api_base.py`), that api's flash_attention_fp8 on the same path too, per
tensor (`fallback_per_tensor_base`).
docs/performance.md, entries 102, 130, 139 and 141.

    PYTHONPATH=src python benchmarks/fp8_fallback.py [--shapes 0,1] [--base FILE]
"""

import torch

import ab_runs
from flashtriton import flash_attention, flash_attention_fp8

ROUNDS = 3
# (batch, heads, N, head dim, causal)
SHAPES = [(4, 16, 4096, 128, False), (4, 16, 4096, 128, True), (4, 32, 4096, 64, False)]


def race(batch: int, heads: int, n: int, head_dim: int, causal: bool, base=None) -> dict:
    """`base`: an earlier api module, whose flash_attention_fp8 races too."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda").to(torch.float8_e4m3fn) for _ in range(3))
    per_tensor = [torch.full((1,), 0.5 + i, device="cuda") for i in range(3)]  # (not 1: a product to apply)
    per_head = [torch.full((batch, heads), 0.5 + i, device="cuda") for i in range(3)]

    def fp8(descales, path, fn=flash_attention_fp8):
        q_descale, k_descale, v_descale = descales
        return ab_runs.on_path("FLASHTRITON_FORWARD", path, lambda: fn(
            q, k, v, is_causal=causal, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale))
    q16, k16, v16 = (x.to(torch.bfloat16) for x in (q, k, v))
    fallbacks = {"fallback_per_tensor": fp8(per_tensor, "triton"), "fallback_per_head": fp8(per_head, "triton")}
    if base is not None:
        fallbacks["fallback_per_tensor_base"] = fp8(per_tensor, "triton", base.flash_attention_fp8)
    first = fallbacks["fallback_per_tensor"]().float()
    differences = {name: ab_runs.largest_error(fn(), first) for name, fn in fallbacks.items()}
    providers = {"kernel": fp8(per_tensor, "auto"), **fallbacks,
                 "bf16": lambda: flash_attention(q16, k16, v16, is_causal=causal),
                 "bf16_triton": ab_runs.on_path("FLASHTRITON_FORWARD", "triton",
                                                lambda: flash_attention(q16, k16, v16, is_causal=causal))}
    ms = ab_runs.timed_rounds(providers, ROUNDS)
    flops = 4 * batch * heads * n * n * head_dim / (2 if causal else 1)
    return ab_runs.shape_line(batch, heads, n, head_dim, causal, flops, ms, differences=differences)


if __name__ == "__main__":
    ab_runs.main(race, SHAPES, __doc__.splitlines()[0],
                 load_base=lambda path: ab_runs.load_module(path, "flashtriton.api_base"))
