"""One flashtriton backward for Nsight Compute to profile (docs/performance.md, entries 71 and 81): three
warm-up calls, then a forward outside the profiled range and the backward inside it. The range is the
process's (cudaProfilerStart/Stop), not an NVTX range: autograd runs the backward on its own device
thread, where a range pushed by this one is not seen. With --peers, FlashAttention-4's backward and cuDNN's
follow in the same range, on the same inputs, through the bench's providers (FLASHTRITON_FA4_SITE names the
site directory FA4's wheels were unpacked into).

    FLASHTRITON_BACKWARD=gluon PYTHONPATH=src ncu --clock-control none --profile-from-start off \\
        --set full --import-source yes -o bwd python benchmarks/ncu_backward.py [--shape 1,16,16384,64] \\
        [--no-causal] [--peers]

The default shape is cs336's: B1 H16 N16384 D64 causal, bf16.
"""

import argparse
import sys

import torch

from flashtriton.launch import last_choice
from flashtriton.tools.bench import PROVIDERS, Shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="1,16,16384,64", help="B,H,N,D")
    parser.add_argument("--no-causal", dest="causal", action="store_false")
    parser.add_argument("--peers", action="store_true", help="also FA4's backward and cuDNN's, in the same range")
    args = parser.parse_args()
    batch, heads, seqlen, head_dim = (int(x) for x in args.shape.split(","))
    shape = Shape(batch, heads, heads, seqlen, seqlen, head_dim, args.causal)
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    do = torch.randn_like(q)
    # the bench's providers (tools/bench.py), so that each peer runs here as the suites time it
    providers = [PROVIDERS[name] for name in ["flashtriton"] + (["fa4", "sdpa_cudnn"] if args.peers else [])]
    outputs = []
    for provider in providers:
        with provider.context():
            for _ in range(3):
                provider.run(q, k, v, shape).backward(do)
            outputs.append(provider.run(q, k, v, shape))
    torch.cuda.synchronize()
    print("backward ran", last_choice("backward"), file=sys.stderr)
    torch.cuda.profiler.start()
    for o in outputs:
        o.backward(do)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
