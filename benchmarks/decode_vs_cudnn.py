"""Decoding calls at the launcher's rule against cuDNN (and the FP8 cache alone), CUDA-graph µs, 5
interleaved rounds, for the tree on PYTHONPATH: run two trees' processes alternately to A/B them, each
against its own cuDNN (docs/performance.md, entry 64; guards/merge_ab_*.jsonl).

    PYTHONPATH=src python benchmarks/decode_vs_cudnn.py [--shapes 0,3]
"""

import torch

from ab_runs import cudnn, fp8_cache, main, timed_rounds
from flashtriton import launch
from flashtriton.tools.decode_bench import DecodeShape, _inputs

# (B, Hq, Hkv, Nk, Nq, FP8 cache): the rows that split, where cuDNN kept 1-3%
SHAPES = [(8, 32, 32, 8192, 1, False), (8, 32, 32, 32768, 1, False), (1, 32, 32, 32768, 1, False),
          (1, 32, 8, 131072, 1, False), (8, 32, 8, 8192, 1, False), (8, 32, 8, 8192, 4, False),
          (1, 32, 32, 131072, 1, False), (8, 32, 32, 131072, 1, False), (1, 32, 8, 1024, 1, False),
          (8, 64, 8, 8192, 1, False), (1, 64, 8, 131072, 1, False), (8, 32, 8, 32768, 1, False),
          (1, 32, 8, 131072, 1, True), (8, 32, 32, 32768, 1, True)]


def race(batch, heads_q, heads_kv, seqlen_k, seqlen_q, fp8) -> dict:
    torch.manual_seed(0)
    q, k, v, _ = _inputs(DecodeShape(batch, heads_q, heads_kv, seqlen_k, 128, seqlen_q=seqlen_q))
    k_descale = v_descale = None
    cache = (k, v)
    if fp8:
        *cache, k_descale, v_descale = fp8_cache(k, v)
    lengths = torch.full((batch,), seqlen_k, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()  # do_bench_cudagraph's side stream does not wait for the inputs
    providers = {"ours": lambda: launch.attention_decode(q, *cache, lengths, 128 ** -0.5, k_descale=k_descale,
                                                         v_descale=v_descale)[0]}
    if not fp8:
        providers["cudnn"] = cudnn(q, k, v)
    with torch.no_grad():
        ms = timed_rounds(providers, 5, graphs=True)
    return dict(shape=f"B{batch} {heads_q}/{heads_kv} Nk{seqlen_k} Nq{seqlen_q}{' fp8' if fp8 else ''}",
                us={n: round(t * 1e3, 2) for n, t in ms.items()})


if __name__ == "__main__":
    main(race, SHAPES, __doc__)
