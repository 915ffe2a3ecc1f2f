"""The FP8 forward (flash_attention_fp8 on the Gluon kernel) beside the bf16 forward and cuDNN's, on an sm_90
GPU: TFLOP/s (do_bench medians of interleaved rounds) and each one's RMSE and largest error against the
float64 attention of the same (dequantized) inputs. Inputs: standard normal, quantized per tensor to
e4m3 (scale = max |x| / 448); bf16 and cuDNN take those dequantized values in bf16. One JSON line per
shape. docs/performance.md, entry 59.

    PYTHONPATH=src python benchmarks/fp8_forward.py [--shapes 0,2] [--base FILE [--base-options default]]

`fp8` is flash_attention_fp8 without L, which takes FP8_WITHOUT_LSE_OPTIONS (sums_by_mma too, entry 103);
`fp8_vcol` the same call as `fp8` with V's keys contiguous (a transposed copy of V made once, outside the
timing, as a KV cache would hold it): V read as it is and K loaded interleaved, no copy (entry 123).
The kernel alone also runs, `fp8_kernel` (the library's flags for calls that return L; V^T and the descale
table made once, outside the timing), and with each flag turned over from the library's FP8 setting
(gluon_kernel_ab.flags_turned_over: the sets FP8 takes): O's rescale skipped where the maxima held,
`fp8_kernel_lazy` (lazy_rescale, kernels/gluon_rescale.py), the rows' sums by the tensor cores,
`fp8_kernel_sums` (sums_by_mma), O through pointers instead of TMA stores, `fp8_kernel_no_ostore` (o_by_tma
off), K and V not paired in one stage, `fp8_kernel_no_paired` (paired_stages off), P rounded to e4m3 as
2^8 P, `fp8_kernel_scaled` (scaled_p), and every flag FP8 takes (all but lazy_rescale: launch/gluon_forward.py's
FP8_ALL_FLAGS), `fp8_kernel_all`;
last in each round `fp8_kernel` again, `fp8_kernel_again`, whose gap to the first says what a provider's
place in the round is worth (entry 92).
With --base (an earlier commit's kernels/gluon_forward.py, made as gluon_kernel_ab.py's docstring says), the
earlier kernel alone too, `fp8_kernel_base`, given the current launcher's arguments (without flags, or
with --base-options default the library's FP8 ones, as `fp8_kernel` runs); and at D = 64 this
tree's kernel with two softmax warpgroups instead of three, `fp8_kernel_2wg`. With --stages 3, the
library's kernel with three stages too, `fp8_kernel_s3`.
"""

import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import ab_runs
from flashtriton import flash_attention, flash_attention_fp8
from flashtriton.launch import gluon_forward
from flashtriton.reference import attention_ref
from gluon_kernel_ab import base_arguments, flags_turned_over, load_kernel

ROUNDS = 5
# (batch, heads, N, head dim, causal): the paper suite's 16k tokens per batch at D = 128, and D = 64
SHAPES = [(4, 16, 4096, 128, False), (4, 16, 4096, 128, True), (2, 16, 8192, 128, False), (1, 16, 16384, 128, True),
          (4, 32, 4096, 64, False), (1, 16, 16384, 64, True),
          # D = 256, which auto takes in FP8 since entry 108 (before it, without FLASHTRITON_FORWARD=gluon the
          # `fp8` provider there was flash_attention on the e4m3 values); the `fp8_kernel` ones are the kernel
          (4, 16, 4096, 256, False), (2, 16, 8192, 256, True)]


def _errors(o: torch.Tensor, o64: torch.Tensor) -> dict:
    diff = o.double() - o64
    return dict(rmse=float(f"{diff.pow(2).mean().sqrt().item():.2e}"), max=float(f"{diff.abs().max().item():.2e}"))


def _kernel_alone(kernel_fn, q8, k8, v8, causal: bool, descales, warpgroups: int | None = None,
                  options: gluon_forward.ForwardOptions | None = None,
                  stages: int = gluon_forward.NUM_STAGES) -> callable:
    """The FP8 kernel `kernel_fn` (this tree's or an earlier file's) launched with this launcher's arguments
    on inputs prepared once: V^T, the (3, B, Hkv) descale table, the outputs;
    `warpgroups`, `options` (ForwardOptions) and `stages` as gluon_forward_launch takes them (warpgroups
    None: its rule)."""
    batch, heads_kv = k8.shape[:2]
    vt = gluon_forward.fp8_values_operand(v8)
    descale = torch.stack([d.reshape(()) for d in descales]).reshape(3, 1, 1).expand(3, batch, heads_kv).contiguous()
    o = torch.empty(q8.shape, device=q8.device, dtype=torch.bfloat16)
    lse = torch.empty(q8.shape[:3], device=q8.device)
    kernel, grid, args, kwargs = gluon_forward.gluon_forward_launch(q8, k8, vt, o, lse, causal, q8.shape[-1] ** -0.5,
                                                                    overlap=True, descale=descale,
                                                                    warpgroups=warpgroups, options=options,
                                                                    stages=stages)
    args = base_arguments(kernel_fn, kernel, args)

    def run():
        kernel_fn[grid](*args, **kwargs)
        return o
    return run


def race(batch: int, heads: int, n: int, head_dim: int, causal: bool, base=None, skip: tuple = (),
         base_options: gluon_forward.ForwardOptions | None = None, three_stages: bool = False) -> dict:
    torch.manual_seed(0)
    exact = [torch.randn(batch, heads, n, head_dim, device="cuda") for _ in range(3)]
    descales = [x.abs().amax().reshape(1) / 448 for x in exact]
    q8, k8, v8 = ((x / d).to(torch.float8_e4m3fn) for x, d in zip(exact, descales, strict=True))
    q, k, v = (x8.float() * d for x8, d in zip((q8, k8, v8), descales, strict=True))  # what the FP8 inputs hold
    qb, kb, vb = (x.to(torch.bfloat16) for x in (q, k, v))
    qd, kd, vd = descales
    v8_keys_contiguous = v8.transpose(2, 3).contiguous().transpose(2, 3)
    providers = {
        "fp8": lambda: flash_attention_fp8(q8, k8, v8, is_causal=causal, q_descale=qd, k_descale=kd, v_descale=vd),
        "fp8_vcol": lambda: flash_attention_fp8(q8, k8, v8_keys_contiguous, is_causal=causal, q_descale=qd,
                                                k_descale=kd, v_descale=vd),
        "bf16": lambda: flash_attention(qb, kb, vb, is_causal=causal),
        "cudnn": lambda: F.scaled_dot_product_attention(qb, kb, vb, is_causal=causal),
    }
    from flashtriton.kernels.gluon_forward import attn_fwd_gluon_kernel
    providers["fp8_kernel"] = _kernel_alone(attn_fwd_gluon_kernel, q8, k8, v8, causal, descales)
    for name, options in flags_turned_over(gluon_forward.FP8_DEFAULT_OPTIONS, head_dim, fp8=True).items():
        providers[f"fp8_kernel_{name}"] = _kernel_alone(attn_fwd_gluon_kernel, q8, k8, v8, causal, descales,
                                                        options=options)
    if three_stages:
        providers["fp8_kernel_s3"] = _kernel_alone(attn_fwd_gluon_kernel, q8, k8, v8, causal, descales,
                                                   options=gluon_forward.FP8_DEFAULT_OPTIONS, stages=3)
    if base is not None:
        providers["fp8_kernel_base"] = _kernel_alone(base, q8, k8, v8, causal, descales,
                                                     options=base_options or gluon_forward.ForwardOptions())
        if head_dim == 64:  # two softmax warpgroups: 240 registers each, where three spill P (entry 85)
            providers["fp8_kernel_2wg"] = _kernel_alone(attn_fwd_gluon_kernel, q8, k8, v8, causal, descales, 2)
    providers = {name: fn for name, fn in providers.items() if name not in skip}
    if "fp8_kernel" in providers:  # once more, last in each round: what the first place is worth
        providers["fp8_kernel_again"] = providers["fp8_kernel"]
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=None, help="indices into SHAPES (default: all)")
    parser.add_argument("--base", default=None, help="an earlier commit's kernels/gluon_forward.py")
    parser.add_argument("--skip", default="", help="providers to leave out, e.g. fp8_kernel_ostore,fp8_kernel_all")
    parser.add_argument("--base-options", choices=("none", "default"), default="none",
                        help="the earlier kernel's flags: none, or the library's FP8 defaults")
    parser.add_argument("--stages", type=int, choices=(2, 3), default=2,
                        help="3: also the library's kernel with three stages")
    cli = parser.parse_args()
    base_options = gluon_forward.FP8_DEFAULT_OPTIONS if cli.base_options == "default" else None
    earlier = None if cli.base is None else load_kernel(cli.base, "attn_fwd_gluon_kernel")
    for shape in SHAPES if cli.shapes is None else [SHAPES[int(i)] for i in cli.shapes.split(",")]:
        print(json.dumps(race(*shape, base=earlier, skip=tuple(cli.skip.split(",")), base_options=base_options,
                              three_stages=cli.stages == 3)), flush=True)
