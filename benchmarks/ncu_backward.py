"""One flashtriton backward for Nsight Compute to profile (docs/performance.md, entry 71): three warm-up
calls, then a forward outside the profiled range and the backward inside it. The range is the process's
(cudaProfilerStart/Stop), not an NVTX range: autograd runs the backward on its own device thread, where
a range pushed by this one is not seen.

    FLASHTRITON_BACKWARD=gluon PYTHONPATH=src ncu --clock-control none --profile-from-start off \\
        --set full --import-source yes -o bwd python benchmarks/ncu_backward.py [--shape 1,16,16384,64] [--no-causal]

The default shape is cs336's: B1 H16 N16384 D64 causal, bf16.
"""

import argparse
import sys

import torch

import flashtriton
from flashtriton.launch import last_choice


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="1,16,16384,64", help="B,H,N,D")
    parser.add_argument("--no-causal", dest="causal", action="store_false")
    args = parser.parse_args()
    batch, heads, seqlen, head_dim = (int(x) for x in args.shape.split(","))
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    do = torch.randn_like(q)
    for _ in range(3):
        flashtriton.flash_attention(q, k, v, is_causal=args.causal).backward(do)
    o = flashtriton.flash_attention(q, k, v, is_causal=args.causal)
    torch.cuda.synchronize()
    print("backward ran", last_choice("backward"), file=sys.stderr)
    torch.cuda.profiler.start()
    o.backward(do)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
