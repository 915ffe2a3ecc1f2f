"""The FP8 Gluon forward at small shapes, launched many times into NaN-filled outputs, two input sets in
turn (so that shared memory left by one launch holds the other set's values, which a kernel reading a
stage before its copy landed would then take): per shape, mask and flag set, how many launches left O or
L wrong. With --kernel, a variant kernel file (made as gluon_kernel_ab.py's docstring says) beside this
tree's kernel, on the same arguments. With --api, flash_attention_fp8 instead, with L and without (each
call's own flags), the allocator's small blocks filled with NaN before each call. docs/performance.md,
entries 104-105: O wrong at Nq = Nk = 1, ptxas packing P's e4m3 pairs beside unrelated registers.

    cd benchmarks && PYTHONPATH=../src python fp8_small_shapes.py [--iters 40] [--head-dim 128] [--kernel FILE]
        [--shapes 0,3] [--options default,none] [--api]
"""

import argparse

import torch

from flashtriton.api import descale_table, flash_attention_fp8
from flashtriton.launch import gluon_forward
from flashtriton.reference import attention_ref
from gluon_kernel_ab import base_arguments, load_kernel

SHAPES = [(1, 1), (1, 17), (17, 1), (17, 63), (130, 97)]  # (Nq, Nk), batch 2, 4 query heads, 2 KV heads
OPTIONS = {"none": gluon_forward.ForwardOptions(), "paired": gluon_forward.ForwardOptions(paired_stages=True),
           "ostore": gluon_forward.ForwardOptions(o_by_tma=True), "default": gluon_forward.FP8_DEFAULT_OPTIONS,
           "without_lse": gluon_forward.FP8_WITHOUT_LSE_OPTIONS}


def _quantized(shape: tuple, spread: float) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(shape, device="cuda") * spread
    descale = x.abs().amax().reshape(1) / 448
    return (x / descale).to(torch.float8_e4m3fn), descale


def inputs(seqlen_q: int, seqlen_k: int, head_dim: int, causal: bool, seed: int) -> tuple:
    """q8, k8, v8, the (3, B, Hkv) descale table, and the float32 attention of what they stand for: (O, L)."""
    torch.manual_seed(seed)
    (q8, qd), (k8, kd), (v8, vd) = (_quantized((2, heads, n, head_dim), spread)
                                    for heads, n, spread in ((4, seqlen_q, 1), (2, seqlen_k, 2), (2, seqlen_k, 3)))
    o, lse = attention_ref(*(x.float() * d for x, d in ((q8, qd), (k8, kd), (v8, vd))), is_causal=causal,
                           upcast=False)
    return q8, k8, v8, descale_table((qd, kd, vd), 2, 2, "cuda"), o, lse


def _wrong(o: torch.Tensor, o_ref: torch.Tensor, lse: torch.Tensor | None = None,
           lse_ref: torch.Tensor | None = None) -> tuple[bool, bool]:
    """Whether O is off by more than 0.3 (or NaN), and L by more than 0.1 where a row sees a key."""
    o_wrong = (o.float() - o_ref).abs().nan_to_num(1e9).max().item() > 0.3
    if lse is None:
        return o_wrong, False
    seen = torch.isfinite(lse_ref)
    return o_wrong, bool(seen.any()) and (lse[seen] - lse_ref[seen]).abs().nan_to_num(1e9).max().item() > 0.1


def wrong_launches(kernel_fn, case_pair: list, causal: bool, options, iters: int) -> tuple[int, int]:
    """How many of `iters` launches of `kernel_fn` (None: the kernel gluon_forward_launch picks), the two cases
    in turn, left O or L wrong (_wrong)."""
    wrong_o = wrong_l = 0
    for i in range(iters):
        q8, k8, v8, descale, o_ref, lse_ref = case_pair[i % 2]
        vt = gluon_forward.fp8_values_operand(v8)
        o = torch.full(q8.shape, float("nan"), device="cuda", dtype=torch.bfloat16)
        lse = torch.full(q8.shape[:3], float("nan"), device="cuda")
        kernel, grid, args, kwargs = gluon_forward.gluon_forward_launch(
            q8, k8, vt, o, lse, causal, q8.shape[-1] ** -0.5, overlap=True, descale=descale, options=options)
        if kernel_fn is None:  # the launcher's own choice
            kernel[grid](*args, **kwargs)
        else:
            kernel_fn[grid](*base_arguments(kernel_fn, kernel, args), **kwargs)
        o_wrong, lse_wrong = _wrong(o, o_ref, lse, lse_ref)
        wrong_o, wrong_l = wrong_o + o_wrong, wrong_l + lse_wrong
    return wrong_o, wrong_l


def wrong_api_calls(case_pair: list, causal: bool, iters: int) -> tuple[int, int, int]:
    """How many of `iters` flash_attention_fp8 calls (the two cases in turn) left O or L wrong (_wrong)
    with L, and O without L; before each pair of calls, 64 blocks of O's size
    filled with NaN and freed, so that an O the kernel did not write shows."""
    wrong_o = wrong_l = wrong_alone = 0
    for i in range(iters):
        q8, k8, v8, descale, o_ref, lse_ref = case_pair[i % 2]
        factors = {name: descale[j, 0, 0].reshape(1) for j, name in enumerate(("q_descale", "k_descale", "v_descale"))}
        poison = [torch.full(q8.shape, float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(64)]
        del poison
        o, lse = flash_attention_fp8(q8, k8, v8, is_causal=causal, return_lse=True, **factors)
        alone = flash_attention_fp8(q8, k8, v8, is_causal=causal, **factors)
        o_wrong, lse_wrong = _wrong(o, o_ref, lse, lse_ref)
        wrong_o, wrong_l, wrong_alone = wrong_o + o_wrong, wrong_l + lse_wrong, wrong_alone + _wrong(alone, o_ref)[0]
    return wrong_o, wrong_l, wrong_alone


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--kernel", default=None, help="a variant kernels/gluon_forward.py to run beside this tree's")
    parser.add_argument("--shapes", default=None, help="indices into SHAPES (default: all)")
    parser.add_argument("--options", default=",".join(OPTIONS), help="OPTIONS' names")
    parser.add_argument("--api", action="store_true", help="flash_attention_fp8's calls instead of the kernel's")
    cli = parser.parse_args()
    kernels = {"": None}  # the kernel gluon_forward_launch picks
    if cli.kernel is not None:
        kernels["variant "] = load_kernel(cli.kernel, "attn_fwd_gluon_kernel")
    picked = {name: OPTIONS[name] for name in cli.options.split(",")}
    for seqlen_q, seqlen_k in SHAPES if cli.shapes is None else [SHAPES[int(i)] for i in cli.shapes.split(",")]:
        for causal in (False, True):
            pair = [inputs(seqlen_q, seqlen_k, cli.head_dim, causal, seed) for seed in (1, 2)]
            if cli.api:
                o, lse, alone = wrong_api_calls(pair, causal, cli.iters)
                print(f"D{cli.head_dim} Nq {seqlen_q} Nk {seqlen_k} {'causal' if causal else 'full'}, of {cli.iters}: "
                      f"with L O {o} L {lse}; without L O {alone}", flush=True)
                continue
            counts = [f"{label}{name} O {o} L {lse}" for name, options in picked.items()
                      for label, kernel_fn in kernels.items()
                      for o, lse in [wrong_launches(kernel_fn, pair, causal, options, cli.iters)]]
            print(f"D{cli.head_dim} Nq {seqlen_q} Nk {seqlen_k} {'causal' if causal else 'full'}, of {cli.iters}: "
                  + "; ".join(counts), flush=True)
