"""Paged caches with blocks of 16 keys (shorter than a key tile: each row's address comes from its own
block-table entry) under two key tiles and two split counts each, beside the same keys in a contiguous
cache: CUDA-graph µs in interleaved rounds, on every paged row of the decode suite (32/8, D = 128).
docs/performance.md, entry 64.

    PYTHONPATH=src python benchmarks/decode_page16_tiles.py [--shapes 0,3]
"""

import torch

from ab_runs import main, timed_rounds
from decode_page16_small import contiguous_copy
from flashtriton import launch
from flashtriton.launch.arguments import sm_count
from flashtriton.launch.decode import decode_splits
from flashtriton.launch.tiles import TileConfig
from flashtriton.tools.decode_bench import DecodeShape, _inputs

ROUNDS = 3
SHAPES = [(batch, seqlen_k) for batch, lengths in ((1, (1024, 8192, 32768, 131072)), (8, (1024, 8192, 32768, 131072)),
                                                   (64, (1024, 8192, 32768)), (256, (1024, 8192)))
          for seqlen_k in lengths]
TILES = {"64x2": TileConfig(16, 64, num_warps=4, num_stages=2), "32x4": TileConfig(16, 32, num_warps=4, num_stages=4),
         "32x3": TileConfig(16, 32, num_warps=4, num_stages=3)}


def race(batch, seqlen_k) -> dict:
    heads_q, heads_kv = 32, 8
    shape = DecodeShape(batch, heads_q, heads_kv, seqlen_k, 128, layout="paged16")
    torch.manual_seed(0)
    q, k, v, table = _inputs(shape)
    lengths = torch.full((batch,), seqlen_k, dtype=torch.int32, device="cuda")
    kc, vc = contiguous_copy(k, v, table, batch, heads_kv, seqlen_k)
    torch.cuda.synchronize()  # do_bench_cudagraph's side stream does not wait for the inputs
    providers = {"rule": lambda: launch.attention_decode(q, k, v, lengths, 128 ** -0.5, block_table=table)[0]}
    for name, tiles in TILES.items():
        counts = {decode_splits(batch * heads_kv, seqlen_k, tiles.block_n, sm_count(q), gathered)
                  for gathered in (False, True)}
        for count in sorted(counts):
            providers[f"{name} splits {count}"] = (
                lambda tiles=tiles, count=count: launch.attention_decode(q, k, v, lengths, 128 ** -0.5,
                                                                         block_table=table, tiles=tiles,
                                                                         num_splits=count)[0])
    providers["contiguous"] = lambda: launch.attention_decode(q, kc, vc, lengths, 128 ** -0.5)[0]
    with torch.no_grad():
        expected = providers["contiguous"]()
        close = all(bool((fn().float() - expected.float()).abs().max() < 2e-2) for fn in providers.values())
        ms = timed_rounds(providers, ROUNDS, graphs=True)
    return dict(shape=f"B{batch} H{heads_q}/{heads_kv} Nk{seqlen_k} D128 paged16",
                us={name: round(t * 1e3, 1) for name, t in ms.items()},
                vs_contiguous={name: round(t / ms["contiguous"], 4) for name, t in ms.items()}, close=close)


if __name__ == "__main__":
    main(race, SHAPES, __doc__)
