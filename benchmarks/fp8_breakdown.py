"""Where the FP8 forward's time goes on an sm_90 GPU, beside the whole call: V's copy into the kernel's
layout, the descale table, and the kernel alone in each grid (persistent, one program per tile) and with
key blocks of 128 or 256; the bf16 Gluon kernel on the same shape for scale. One JSON line per
shape (ms, and TFLOP/s of the attention's FLOPs, which mean nothing for the copies). docs/performance.md,
entry 60.

    PYTHONPATH=src python benchmarks/fp8_breakdown.py [--shapes 0,2]
"""

import torch

import ab_runs
from flashtriton import flash_attention_fp8
from flashtriton.api import descale_table
from flashtriton.launch import gluon_forward
from flashtriton.launch.arguments import sm_count

ROUNDS = 3
SHAPES = [(4, 16, 4096, 128, False), (4, 16, 4096, 128, True), (2, 16, 8192, 128, True), (1, 16, 16384, 128, True),
          (4, 32, 4096, 64, False), (1, 16, 16384, 64, True)]


def race(batch: int, heads: int, n: int, head_dim: int, causal: bool) -> dict:
    torch.manual_seed(0)
    exact = [torch.randn(batch, heads, n, head_dim, device="cuda") for _ in range(3)]
    descales = [x.abs().amax().reshape(1) / 448 for x in exact]
    q8, k8, v8 = ((x / d).to(torch.float8_e4m3fn) for x, d in zip(exact, descales, strict=True))
    qb, kb, vb = (x.to(torch.bfloat16) for x in exact)
    vt = gluon_forward.fp8_values_operand(v8)
    table = descale_table(tuple(descales), batch, heads, q8.device)
    o = torch.empty(batch, heads, n, head_dim, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(batch, heads, n, device="cuda")
    tiles = batch * heads * -(-n // (gluon_forward.WARPGROUPS[head_dim] * gluon_forward.BLOCK_M))

    def kernel(grid=None, warpgroups=None, fp8=True, block_n=None):
        args = (q8, k8, vt) if fp8 else (qb, kb, vb)
        launch, default_grid, params, options = gluon_forward.gluon_forward_launch(
            *args, o, lse, causal, head_dim ** -0.5, overlap=True, warpgroups=warpgroups, block_n=block_n,
            descale=table if fp8 else None)
        return lambda: launch[grid or default_grid](*params, **options)
    providers = {
        "call": lambda: flash_attention_fp8(q8, k8, v8, is_causal=causal, q_descale=descales[0],
                                            k_descale=descales[1], v_descale=descales[2]),
        "values_copy": lambda: gluon_forward.fp8_values_operand(v8),
        "descale_table": lambda: descale_table(tuple(descales), batch, heads, q8.device),
        "kernel": kernel(),
        "kernel_persistent": kernel((min(tiles, sm_count(q8)), )),
        "kernel_per_tile": kernel((tiles, )),
        "bf16_kernel": kernel(fp8=False),
    }
    # Half as many blocks, so half the per-block rescales and waits (FA3 takes 224 keys in FP8 at D = 128), with
    # two softmax warpgroups (three do not fit at D = 64; at D = 128 they lost, entry 60). Offline: 48 bytes of
    # stack at D = 128, none at D = 64.
    providers["kernel_256_keys"] = kernel(block_n=256, warpgroups=2)
    # 256-key blocks must give the 128-key kernel's O (the same sums, in another order)
    providers["kernel"]()
    o128 = o.clone()
    providers["kernel_256_keys"]()
    check = float(f"{(o.float() - o128.float()).abs().max().item():.2e}")
    ms = ab_runs.timed_rounds(providers, ROUNDS)
    flops = 4 * batch * heads * n * n * head_dim / (2 if causal else 1)
    return ab_runs.shape_line(batch, heads, n, head_dim, causal, flops, ms, max_diff_256_keys=check)


if __name__ == "__main__":
    ab_runs.main(race, SHAPES, __doc__.split("\n\n")[0])
