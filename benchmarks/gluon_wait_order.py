"""Where ptxas puts the Gluon forward's wait for P V, offline (no GPU): each form is compiled for sm_90 as the
launcher would run it at B1 H16 N4096 (N16384 for D = 64 causal, one program per tile), and in the SASS of its
overlapped key-block loop this counts the exponentials (MUFU.EX2) between the wait for the block's scores
(`WARPGROUP.DEPBAR.LE gsb0, 0x1`) and the wait for the previous block's P V (`... 0x0`), against all the
exponentials before the next products. The kernel writes the softmax between the two waits; ptxas moves the
second one up (docs/performance.md, entry 83). `--kernel FILE` compiles another kernel file with the same
signature instead of the tree's (a variant made with `git show`, as for gluon_kernel_ab.py).

    PYTHONPATH=src python benchmarks/gluon_wait_order.py [--kernel FILE]
"""

import argparse
import re

import torch

from flashtriton.launch import gluon_forward
from flashtriton.tools.inspect import offline_sass
from gluon_kernel_ab import load_kernel

FORMS = [(128, False, 2, False), (128, True, 2, False), (128, False, 2, True), (64, False, 3, False),
         (64, True, 3, False), (64, True, 2, False)]


def wait_order(sass: str) -> tuple[int, int] | None:
    """(exponentials between the steady loop's two waits, exponentials from the first wait to the next
    products) in the first overlapped loop of `sass`, or None where the loop has no such pair of waits."""
    lines = sass.splitlines()
    first = next((i for i, line in enumerate(lines) if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in line), None)
    if first is None:
        return None
    second = next(i for i in range(first + 1, len(lines)) if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in lines[i])
    end = next((i for i in range(first + 1, len(lines)) if re.search(r"\bHGMMA\b", lines[i])), len(lines))
    count = sum(1 for line in lines[first:second] if "MUFU.EX2" in line)
    return count, sum(1 for line in lines[first:end] if "MUFU.EX2" in line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel", help="a kernel file with attn_fwd_gluon_kernel (default: the tree's)")
    args = parser.parse_args()
    kernel_fn = load_kernel(args.kernel, "attn_fwd_gluon_kernel") if args.kernel else None
    print("| D | causal | warpgroups | ping-pong | exp2 before the P V wait / all |")
    print("|---|---|---|---|---|")
    for head_dim, causal, warpgroups, pingpong in FORMS:
        n = 16384 if head_dim == 64 and causal and warpgroups == 3 else 4096
        q = torch.randn(1, 16, n, head_dim, dtype=torch.bfloat16)
        o, lse = torch.empty_like(q), torch.empty(1, 16, n)
        kernel, grid, launch_args, kwargs = gluon_forward.gluon_forward_launch(
            q, q, q, o, lse, causal, head_dim ** -0.5, True, pingpong, warpgroups=warpgroups)
        order = wait_order(offline_sass(kernel_fn or kernel, grid, launch_args, kwargs))
        cell = "no loop" if order is None else f"{order[0]} / {order[1]}"
        print(f"| {head_dim} | {'yes' if causal else 'no'} | {warpgroups} | {'yes' if pingpong else 'no'} | {cell} |")


if __name__ == "__main__":
    main()
