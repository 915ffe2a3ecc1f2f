"""One flashtriton forward for Nsight Compute to profile (docs/performance.md, entry 81): three warm-up calls
outside the profiled range, then one inside it (cudaProfilerStart/Stop, as ncu_backward.py).

    PYTHONPATH=src ncu --clock-control none --profile-from-start off --section SourceCounters \\
        --section WarpStateStats --import-source yes -o fwd python benchmarks/ncu_forward.py \\
        [--shape 1,16,16384,64] [--no-causal]

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
    q, k, v = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with torch.no_grad():
        for _ in range(3):
            flashtriton.flash_attention(q, k, v, is_causal=args.causal)
        torch.cuda.synchronize()
        print("forward ran", last_choice("forward"), file=sys.stderr)
        torch.cuda.profiler.start()
        flashtriton.flash_attention(q, k, v, is_causal=args.causal)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
