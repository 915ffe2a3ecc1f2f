"""The Gluon kernels' steady loops counted in their SASS, offline (no GPU): instructions per key block and warp
of the forward's overlapped loop (the first softmax warpgroup's), and per query block of the backward's
loops, with the opcodes that fill them and the warpgroup barriers (BAR.SYNC) among them. Each kernel is
compiled for sm_90 as the launcher runs it (B1 H2 N4096); the forward with the library's flags
(DEFAULT_OPTIONS, FP8_DEFAULT_OPTIONS in FP8) unless --options names others ("none": every flag off, as
entries 85-89 counted before paired stages were the default). A loop is the code from a backward branch's
target to that branch; the forward's is the one that holds the first wait for a block's scores. "fast" is
the loop with the predicated branches taken that jump over runs of FMULs only (O's rescale behind its
warp's vote, kernels/gluon_rescale.py): the path a block takes when no row's max grew by much. "unmasked"
is the loop with the branch over the mask taken: the path of a block that is neither past Nk nor across
the causal diagonal, which is most of them (mask_run).

    PYTHONPATH=src python benchmarks/sass_loops.py fwd [--dtype bf16|fp8] [--head-dim 128] [--causal]
        [--options default|none|lazy,sums,ostore,...] [--block-n 256] [--kernel FILE] [--interleaved]
    PYTHONPATH=src python benchmarks/sass_loops.py bwd [--head-dim 64] [--causal]
"""

import argparse
import collections
import re

import torch

from flashtriton.launch import gluon_backward, gluon_forward
from flashtriton.launch.backward import statistics_buffer
from flashtriton.tools.inspect import branched_over, innermost_loops, loops, offline_sass, skippable_fmuls
from gluon_kernel_ab import base_arguments, load_kernel

# the flags by their log names: lazy -> lazy_rescale, ...
OPTIONS = dict(zip(gluon_forward.FLAG_NAMES, gluon_forward.ForwardOptions._fields, strict=True))


def describe(lines: list[str], first: int, last: int, top: int = 14) -> str:
    """A loop's length, its length with the branches over FMUL-only runs taken, and its commonest opcodes."""
    body = lines[first:last + 1]
    skipped = skippable_fmuls(lines, first, last)
    ops = collections.Counter((line.split()[1] if line.startswith("@") else line.split()[0]).split(".")[0]
                              for line in body)
    mix = ", ".join(f"{op} {count}" for op, count in ops.most_common(top))
    barriers = sum("BAR.SYNC" in line for line in body)
    masked = mask_run(lines, first, last)
    unmasked = f", unmasked {len(body) - masked}" if masked else ""
    return f"{len(body)} instructions, fast {len(body) - skipped}{unmasked}, {barriers} BAR.SYNC: {mix}"


def mask_run(lines: list[str], first: int, last: int) -> int:
    """Instructions of lines[first:last + 1] that a predicated branch forward jumps over when the block needs
    no mask: the runs that set scores to -inf (FSEL ... -INF), which a loop with one body for every block
    branches over on blocks that are neither past Nk nor across the diagonal (gluon_forward's
    _online_softmax). 0 if the loop has none."""
    return branched_over(lines, first, last, lambda run: any("FSEL" in line and "-INF" in line for line in run))


def forward_options(names: str, fp8: bool) -> gluon_forward.ForwardOptions:
    """--options: "default" (what the library runs), "none", or flags by their log names."""
    if names == "default":
        return gluon_forward.default_options(overlap=True, fp8=fp8)
    flags = [] if names == "none" else names.split(",")
    unknown = sorted(set(flags) - set(OPTIONS))
    if unknown:
        raise SystemExit(f"--options: unknown flags {unknown}; pick from {', '.join(OPTIONS)}, or default or none")
    return gluon_forward.ForwardOptions(**{OPTIONS[name]: True for name in flags})


def forward(args) -> None:
    fp8 = args.dtype == "fp8"
    options = forward_options(args.options, fp8)
    if fp8:
        q = torch.randn(1, 2, 4096, args.head_dim).to(torch.float8_e4m3fn)
        # V^T, as fp8_values_operand makes it or as a V with contiguous keys is (--interleaved: the same
        # tensor, read in another order)
        v = torch.randn(1, 2, args.head_dim, 4096).to(torch.float8_e4m3fn)
        o = torch.empty(q.shape, dtype=torch.bfloat16)
    else:
        q = v = torch.randn(1, 2, 4096, args.head_dim, dtype=torch.bfloat16)
        o = torch.empty_like(q)
    kernel, grid, launch_args, kwargs = gluon_forward.gluon_forward_launch(
        q, q, v, o, torch.empty(1, 2, 4096), args.causal, args.head_dim ** -0.5, overlap=True,
        descale=torch.ones(3, 1, 2) if fp8 else None, options=options, block_n=args.block_n,
        keys_interleaved=args.interleaved)
    if args.kernel:
        earlier = load_kernel(args.kernel, "attn_fwd_gluon_kernel")
        kernel, launch_args = earlier, base_arguments(earlier, kernel, launch_args)
    sass = offline_sass(kernel, grid, launch_args, kwargs)
    lines = sass.splitlines()
    wait = next((i for i, line in enumerate(lines) if re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x[12]\b", line)), None)
    if wait is None:
        raise SystemExit(f"kernel: {len(lines)} instructions; no overlapped loop: every wgmma is waited for at once "
                         "(ptxas serialised them)")
    first, last = min(((f, t) for f, t in loops(lines) if f <= wait <= t), key=lambda loop: loop[1] - loop[0])
    print(f"kernel: {len(lines)} instructions, flags {options.suffix() or 'none'}; the overlapped loop: "
          f"{describe(lines, first, last)}")


def backward(args) -> None:
    q = torch.randn(1, 2, 4096, args.head_dim, dtype=torch.bfloat16)
    lse2, delta = statistics_buffer(torch.empty(1, 2, 4096))
    split_rows = gluon_backward.split_dq_by_rows(args.head_dim)
    dq_acc = gluon_backward.dq_accumulator(q, gluon_backward.DQ_FRAGMENTS, split_rows=split_rows)
    kernel, grid, launch_args, kwargs = gluon_backward.gluon_dkdv_launch(
        q, q, q, q, lse2, delta, q, q, args.causal, args.head_dim ** -0.5, dq_acc, dq_split_rows=split_rows,
        dq_fragments=gluon_backward.DQ_FRAGMENTS)
    sass = offline_sass(kernel, grid, launch_args, kwargs)
    lines = sass.splitlines()
    print(f"kernel: {len(lines)} instructions")
    # the query-block loops (the outer loops over heads hold them)
    for first, last in innermost_loops(lines):
        print(f"loop at {first}: {describe(lines, first, last)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kernel_kind", choices=["fwd", "bwd"])
    parser.add_argument("--dtype", choices=["bf16", "fp8"], default="bf16", help="fwd only")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--options", default="default",
                        help=f"fwd only: default (the library's flags), none, or some of {', '.join(OPTIONS)}")
    parser.add_argument("--block-n", type=int, default=None, help="fwd only: keys per block (default: the launcher's)")
    parser.add_argument("--kernel", help="fwd only: a kernel file with attn_fwd_gluon_kernel (default: the tree's)")
    parser.add_argument("--interleaved", action="store_true",
                        help="fwd, FP8 only: K loaded interleaved, V^T read in its keys' own order "
                             "(V's keys contiguous)")
    args = parser.parse_args()
    (forward if args.kernel_kind == "fwd" else backward)(args)


if __name__ == "__main__":
    main()
