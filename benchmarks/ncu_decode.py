"""Decoding calls inside the NVTX range "prof", one each, for Nsight Compute to profile (the warm-up calls
run outside the range; kernels appear in the order below):

    PYTHONPATH=src ncu --clock-control none --nvtx --nvtx-include "prof/" --set full --csv --page raw \\
        python benchmarks/ncu_decode.py [--case fp8|gaps] > ncu_decode.csv

`fp8` (entry 63): B64, 32 query heads over 8 KV heads, 8192 keys, D = 128, one query token, a contiguous
cache (one split: one kernel per call), against a bf16 cache, an FP8 cache (pointer loads, the default)
and the FP8 cache through TMA: where the FP8 cache's loop spends its time.

`gaps` (entry 64): the rows still short of issue 20's targets, ours beside cuDNN (SDPA's backend), and
paged block 16 beside block 64 and the contiguous cache: per shape, in order, the calls GAP_CALLS names.
"""

import argparse

import torch

from ab_runs import cudnn, fp8_cache
from flashtriton import launch
from flashtriton.tools.decode_bench import DecodeShape, _inputs

BATCH, HEADS_Q, HEADS_KV, KEYS, HEAD_DIM = 64, 32, 8, 8192, 128
# (B, Hq, Hkv, Nk, layout): for contiguous rows ours at the split rule then each forced split count, then
# cuDNN; for paged rows ours alone.
GAP_CALLS = [((8, 32, 32, 8192, "contiguous"), (0, 3, 4)), ((8, 32, 32, 32768, "contiguous"), (0,)),
             ((1, 32, 8, 131072, "contiguous"), (0,)), ((64, 32, 8, 8192, "contiguous"), (0,)),
             ((64, 32, 8, 1024, "contiguous"), (0,)), ((64, 32, 8, 1024, "paged16"), (0, 4)),
             ((64, 32, 8, 1024, "paged64"), (0,))]


def fp8_calls() -> list:
    q = torch.randn(BATCH, HEADS_Q, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(BATCH, HEADS_KV, KEYS, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k8, v8, k_descale, v_descale = fp8_cache(k, v)
    lengths = torch.full((BATCH,), KEYS, dtype=torch.int32, device="cuda")
    return [lambda: launch.attention_decode(q, k, v, lengths, HEAD_DIM ** -0.5),
            lambda: launch.attention_decode(q, k8, v8, lengths, HEAD_DIM ** -0.5, k_descale=k_descale,
                                            v_descale=v_descale, tma=False),
            lambda: launch.attention_decode(q, k8, v8, lengths, HEAD_DIM ** -0.5, k_descale=k_descale,
                                            v_descale=v_descale, tma=True)]


def gap_calls() -> list:
    calls = []
    for (batch, heads_q, heads_kv, seqlen_k, layout), splits in GAP_CALLS:
        shape = DecodeShape(batch, heads_q, heads_kv, seqlen_k, HEAD_DIM, layout=layout)
        q, k, v, table = _inputs(shape)
        lengths = torch.full((batch,), seqlen_k, dtype=torch.int32, device="cuda")
        for count in splits:
            calls.append(lambda q=q, k=k, v=v, table=table, lengths=lengths, count=count: launch.attention_decode(
                q, k, v, lengths, HEAD_DIM ** -0.5, block_table=table, num_splits=count))
        if table is None:
            calls.append(cudnn(q, k, v))
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--case", choices=("fp8", "gaps"), default="fp8")
    torch.manual_seed(0)
    calls = fp8_calls() if parser.parse_args().case == "fp8" else gap_calls()
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
