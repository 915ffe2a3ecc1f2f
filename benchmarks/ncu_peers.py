"""One forward each of flashtriton (its default path), FlashAttention-4 and cuDNN, inside the NVTX range
"prof", for Nsight Compute to profile side by side (docs/performance.md, entry 52):

    FLASHTRITON_FA4_SITE=<site> PYTHONPATH=src ncu --clock-control none --nvtx --nvtx-include "prof/" \\
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy \\
        --section WarpStateStats --section LaunchStats --section InstructionStats --csv --page details \\
        python benchmarks/ncu_peers.py > ncu_peers.csv

FLASHTRITON_FA4_SITE names the site directory that FA4's wheels were unpacked into, as for the bench's
`fa4` provider (../shared/probes/fa4/README.md). Shapes: B4 H16 N4096 D128 bf16, without and with the
causal mask; the warm-up calls run outside the range.
"""

from __future__ import annotations

import functools
import os
import site
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashtriton
from flashtriton.launch import last_choice

SHAPES = [(4, 16, 4096, 128, False), (4, 16, 4096, 128, True)]


def main() -> None:
    site.addsitedir(os.environ["FLASHTRITON_FA4_SITE"])
    from flash_attn.cute import flash_attn_func

    torch.manual_seed(0)
    with torch.no_grad(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for batch, heads, seqlen, head_dim, causal in SHAPES:
            q, k, v = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16)
                       for _ in range(3))
            q_t, k_t, v_t = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # FA4 takes (B, N, H, D)
            calls = [functools.partial(flashtriton.flash_attention, q, k, v, is_causal=causal),
                     functools.partial(flash_attn_func, q_t, k_t, v_t, causal=causal),
                     functools.partial(F.scaled_dot_product_attention, q, k, v, is_causal=causal)]
            for call in calls:
                for _ in range(3):
                    call()
            torch.cuda.synchronize()
            print(batch, heads, seqlen, head_dim, causal, "flashtriton ran", last_choice("forward"), file=sys.stderr)
            for call in calls:
                torch.cuda.nvtx.range_push("prof")
                call()
                torch.cuda.nvtx.range_pop()
            torch.cuda.synchronize()


if __name__ == "__main__":
    main()
