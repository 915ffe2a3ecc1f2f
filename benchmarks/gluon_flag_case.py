"""One case of the Gluon forward against the float64 reference, in its own process (a kernel that faults
spoils the CUDA context of every later case in a process): a kernel file (or `current`, this tree's), bf16 or
FP8, one ForwardOptions flag (or `none`), D, Nq, Nk and the mask, optionally the softmax warpgroups and the
form. Prints O's and L's largest errors, OK or WRONG, and for a wrong sums_by_mma the first rows' L - L_ref
(docs/performance.md, entry 92). An earlier kernel file is made as gluon_kernel_ab.py's docstring says.

    PYTHONPATH=src python benchmarks/gluon_flag_case.py current fp8 sums_by_mma 128 128 128 0
    PYTHONPATH=src python benchmarks/gluon_flag_case.py current bf16 o_by_tma 64 130 700 1 - 0
"""

import argparse

import torch

from flashtriton.launch import gluon_forward
from flashtriton.reference import attention_ref
from gluon_kernel_ab import base_arguments, load_kernel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kernel", help="a kernels/gluon_forward.py file, or `current`")
    parser.add_argument("dtype", choices=("bf16", "fp8"))
    parser.add_argument("flag", choices=("none", *gluon_forward.ForwardOptions._fields))
    parser.add_argument("head_dim", type=int)
    parser.add_argument("seqlen_q", type=int)
    parser.add_argument("seqlen_k", type=int)
    parser.add_argument("causal", type=int, choices=(0, 1))
    parser.add_argument("warpgroups", nargs="?", default="-", help="2 or 3 (`-`: the launcher's rule)")
    parser.add_argument("overlap", nargs="?", type=int, default=1, choices=(0, 1))
    cli = parser.parse_args()
    torch.manual_seed(0)
    batch, heads, head_dim, causal = 2, 3, cli.head_dim, bool(cli.causal)
    warpgroups = None if cli.warpgroups == "-" else int(cli.warpgroups)
    options = gluon_forward.ForwardOptions(**({} if cli.flag == "none" else {cli.flag: True}))
    q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda")
               for n in (cli.seqlen_q, cli.seqlen_k, cli.seqlen_k))
    lse = torch.full((batch, heads, cli.seqlen_q), float("nan"), device="cuda")
    if cli.dtype == "fp8":
        q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
        q, k, v = (x.float() for x in (q8, k8, v8))  # what the FP8 inputs hold
        o = torch.full(q.shape, float("nan"), device="cuda", dtype=torch.bfloat16)
        kernel, grid, args, kwargs = gluon_forward.gluon_forward_launch(
            q8, k8, gluon_forward.fp8_values_operand(v8), o, lse, causal, head_dim ** -0.5, overlap=bool(cli.overlap),
            descale=torch.ones(3, batch, heads, device="cuda"), warpgroups=warpgroups, options=options)
    else:
        q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))
        o = torch.full_like(q, float("nan"))
        kernel, grid, args, kwargs = gluon_forward.gluon_forward_launch(
            q, k, v, o, lse, causal, head_dim ** -0.5, overlap=bool(cli.overlap), warpgroups=warpgroups,
            options=options)
    run = kernel if cli.kernel == "current" else load_kernel(cli.kernel, "attn_fwd_gluon_kernel")
    run[grid](*base_arguments(run, kernel, args), **kwargs)
    torch.cuda.synchronize()
    o64, lse64 = attention_ref(q.double(), k.double(), v.double(), is_causal=causal)[:2]
    o_error = (o.double() - o64).abs().max().item()
    lse_error = (lse.double() - lse64).abs().nan_to_num(0.0).max().item()
    nans = o.isnan().sum().item()
    ok = o_error < 0.05 and lse_error < 0.01 and nans == 0
    print(f"{cli.kernel} {cli.dtype} {cli.flag} D{head_dim} {cli.seqlen_q}x{cli.seqlen_k} causal={causal} "
          f"warpgroups={warpgroups} overlap={bool(cli.overlap)}: O max {o_error:.3g} L max {lse_error:.3g} "
          f"NaN {nans} -> {'OK' if ok else 'WRONG'}")
    if not ok and cli.flag == "sums_by_mma":
        print("  L - L_ref, first rows:", [f"{x:.3g}" for x in (lse.double() - lse64)[0, 0, :8].tolist()])


if __name__ == "__main__":
    main()
