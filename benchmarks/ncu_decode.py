"""One decoding call each against a bf16 cache, an FP8 cache (pointer loads, the default) and the FP8
cache through TMA, inside the NVTX range "prof", for Nsight Compute to say where the FP8 cache's loop
spends its time (docs/performance.md, entries 62-64):

    PYTHONPATH=src ncu --clock-control none --nvtx --nvtx-include "prof/" --set full --csv --page raw \\
        python benchmarks/ncu_decode.py > ncu_decode.csv

Shape: B64, 32 query heads over 8 KV heads, 8192 keys, D = 128, one query token, contiguous cache
(a single split: one kernel per call). The warm-up calls run outside the range.
"""

import torch

from ab_runs import fp8_cache
from flashtriton import launch

BATCH, HEADS_Q, HEADS_KV, KEYS, HEAD_DIM = 64, 32, 8, 8192, 128


def main() -> None:
    torch.manual_seed(0)
    q = torch.randn(BATCH, HEADS_Q, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(BATCH, HEADS_KV, KEYS, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k8, v8, k_descale, v_descale = fp8_cache(k, v)
    lengths = torch.full((BATCH,), KEYS, dtype=torch.int32, device="cuda")
    calls = [lambda: launch.attention_decode(q, k, v, lengths, HEAD_DIM ** -0.5),
             lambda: launch.attention_decode(q, k8, v8, lengths, HEAD_DIM ** -0.5, k_descale=k_descale,
                                             v_descale=v_descale, tma=False),
             lambda: launch.attention_decode(q, k8, v8, lengths, HEAD_DIM ** -0.5, k_descale=k_descale,
                                             v_descale=v_descale, tma=True)]
    with torch.no_grad():
        for call in calls:
            call()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("prof")
        for call in calls:
            call()
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
