"""Paged block 16 at the launcher's rule against the same keys in a contiguous cache, CUDA-graph µs, 5
interleaved rounds, on the decode suite's block-16 rows (32/8, D = 128; docs/performance.md, entry 64;
guards/decode_page16_check_1797692.jsonl).

    PYTHONPATH=src python benchmarks/decode_page16_check.py [--shapes 0,3]
"""

import torch

from ab_runs import main, timed_rounds
from decode_page16_small import block16_calls

SHAPES = [(8, 1024), (1, 8192), (1, 1024), (8, 8192), (1, 32768), (64, 1024), (256, 1024), (8, 131072),
          (1, 131072)]  # (B, Nk)


def race(batch, seqlen_k) -> dict:
    providers, _ = block16_calls(batch, seqlen_k)
    with torch.no_grad():
        ms = timed_rounds(providers, 5, graphs=True)
    return dict(shape=f"B{batch} Nk{seqlen_k}", us={n: round(t * 1e3, 2) for n, t in ms.items()},
                ratio=round(ms["paged16"] / ms["contiguous"], 4))


if __name__ == "__main__":
    main(race, SHAPES, __doc__)
