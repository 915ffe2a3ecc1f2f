"""Paged block 16 at the launcher's rule against the same keys in a contiguous cache, CUDA-graph µs, 5
interleaved rounds, on the decode suite's block-16 rows (32/8, D = 128; docs/performance.md, entry 64;
guards/decode_page16_check_1797692.jsonl).

    PYTHONPATH=src python benchmarks/decode_page16_check.py [--shapes 0,3]
"""

import torch

from ab_runs import main, timed_rounds
from decode_page16_small import contiguous_copy
from flashtriton import launch
from flashtriton.tools.decode_bench import DecodeShape, _inputs

SHAPES = [(8, 1024), (1, 8192), (1, 1024), (8, 8192), (1, 32768), (64, 1024), (256, 1024), (8, 131072),
          (1, 131072)]  # (B, Nk)


def race(batch, seqlen_k) -> dict:
    torch.manual_seed(0)
    q, k, v, table = _inputs(DecodeShape(batch, 32, 8, seqlen_k, 128, layout="paged16"))
    lengths = torch.full((batch,), seqlen_k, dtype=torch.int32, device="cuda")
    kc, vc = contiguous_copy(k, v, table, batch, 8, seqlen_k)
    torch.cuda.synchronize()  # do_bench_cudagraph's side stream does not wait for the inputs
    providers = {"paged16": lambda: launch.attention_decode(q, k, v, lengths, 128 ** -0.5, block_table=table)[0],
                 "contiguous": lambda: launch.attention_decode(q, kc, vc, lengths, 128 ** -0.5)[0]}
    with torch.no_grad():
        ms = timed_rounds(providers, 5, graphs=True)
    return dict(shape=f"B{batch} Nk{seqlen_k}", us={n: round(t * 1e3, 2) for n, t in ms.items()},
                ratio=round(ms["paged16"] / ms["contiguous"], 4))


if __name__ == "__main__":
    main(race, SHAPES, __doc__)
