"""One flashtriton backward for Nsight Compute to profile (docs/performance.md, entries 71 and 81): three
warm-up calls, then a forward outside the profiled range and the backward inside it. The range is the
process's (cudaProfilerStart/Stop), not an NVTX range: autograd runs the backward on its own device
thread, where a range pushed by this one is not seen. With --peers, FlashAttention-4's backward and cuDNN's
follow in the same range, on the same inputs (FLASHTRITON_FA4_SITE names the site directory FA4's wheels
were unpacked into, as for the bench's `fa4` provider).

    FLASHTRITON_BACKWARD=gluon PYTHONPATH=src ncu --clock-control none --profile-from-start off \\
        --set full --import-source yes -o bwd python benchmarks/ncu_backward.py [--shape 1,16,16384,64] \\
        [--no-causal] [--peers]

The default shape is cs336's: B1 H16 N16384 D64 causal, bf16.
"""

import argparse
import os
import site
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashtriton
from flashtriton.launch import last_choice


def fa4_attention():
    """FlashAttention-4's flash_attn_func on (B, H, N, D) tensors, from the site FLASHTRITON_FA4_SITE names."""
    site.addsitedir(os.environ["FLASHTRITON_FA4_SITE"])
    from flash_attn.cute import flash_attn_func

    def attention(q, k, v, is_causal):
        out = flash_attn_func(*(x.transpose(1, 2) for x in (q, k, v)), causal=is_causal)
        return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)
    return attention


def cudnn_attention(q, k, v, is_causal):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="1,16,16384,64", help="B,H,N,D")
    parser.add_argument("--no-causal", dest="causal", action="store_false")
    parser.add_argument("--peers", action="store_true", help="also FA4's backward and cuDNN's, in the same range")
    args = parser.parse_args()
    batch, heads, seqlen, head_dim = (int(x) for x in args.shape.split(","))
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    do = torch.randn_like(q)
    attentions = [flashtriton.flash_attention] + ([fa4_attention(), cudnn_attention] if args.peers else [])
    outputs = []
    for attention in attentions:
        for _ in range(3):
            attention(q, k, v, is_causal=args.causal).backward(do)
        outputs.append(attention(q, k, v, is_causal=args.causal))
    torch.cuda.synchronize()
    print("backward ran", last_choice("backward"), file=sys.stderr)
    torch.cuda.profiler.start()
    for o in outputs:
        o.backward(do)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
