"""The FP8 forward (flash_attention_fp8 on the Gluon kernel) beside the bf16 forward and cuDNN's, on an sm_90
GPU: TFLOP/s (do_bench medians of interleaved rounds) and each one's RMSE and largest error against the
float64 attention of the same (dequantized) inputs. Inputs: standard normal, quantized per tensor to
e4m3 (scale = max |x| / 448); bf16 and cuDNN take those dequantized values in bf16. One JSON line per
shape. docs/performance.md, entry 59.

    PYTHONPATH=src python benchmarks/fp8_forward.py [--shapes 0,2]
"""


import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import ab_runs
from flashtriton import flash_attention, flash_attention_fp8
from flashtriton.launch import gluon_forward
from flashtriton.reference import attention_ref

ROUNDS = 5
# (batch, heads, N, head dim, causal): the paper suite's 16k tokens per batch at D = 128, and D = 64
SHAPES = [(4, 16, 4096, 128, False), (4, 16, 4096, 128, True), (2, 16, 8192, 128, False), (1, 16, 16384, 128, True),
          (4, 32, 4096, 64, False), (1, 16, 16384, 64, True)]


def _errors(o: torch.Tensor, o64: torch.Tensor) -> dict:
    diff = o.double() - o64
    return dict(rmse=float(f"{diff.pow(2).mean().sqrt().item():.2e}"), max=float(f"{diff.abs().max().item():.2e}"))


def race(batch: int, heads: int, n: int, head_dim: int, causal: bool) -> dict:
    torch.manual_seed(0)
    exact = [torch.randn(batch, heads, n, head_dim, device="cuda") for _ in range(3)]
    descales = [x.abs().amax().reshape(1) / 448 for x in exact]
    q8, k8, v8 = ((x / d).to(torch.float8_e4m3fn) for x, d in zip(exact, descales, strict=True))
    q, k, v = (x8.float() * d for x8, d in zip((q8, k8, v8), descales, strict=True))  # what the FP8 inputs hold
    qb, kb, vb = (x.to(torch.bfloat16) for x in (q, k, v))
    qd, kd, vd = descales
    providers = {
        "fp8": lambda: flash_attention_fp8(q8, k8, v8, is_causal=causal, q_descale=qd, k_descale=kd, v_descale=vd),
        "bf16": lambda: flash_attention(qb, kb, vb, is_causal=causal),
        "cudnn": lambda: F.scaled_dot_product_attention(qb, kb, vb, is_causal=causal),
    }
    # V's copy into the kernel's layout alone, part of fp8's time (its TFLOP/s are not a rate of anything)
    timed = dict(providers, fp8_values=lambda: gluon_forward.fp8_values_operand(v8))
    errors = {}
    if batch * heads * n * n <= 2 ** 31:  # the float64 reference's scores must fit the GPU
        o64 = attention_ref(q.double(), k.double(), v.double(), is_causal=causal)[0]
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            errors = {name: _errors(fn(), o64) for name, fn in providers.items()}
        del o64
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ms = ab_runs.timed_rounds(timed, ROUNDS)
    flops = 4 * batch * heads * n * n * head_dim / (2 if causal else 1)
    return ab_runs.shape_line(batch, heads, n, head_dim, causal, flops, ms, err=errors)


if __name__ == "__main__":
    ab_runs.main(race, SHAPES, __doc__.split("\n\n")[0])
