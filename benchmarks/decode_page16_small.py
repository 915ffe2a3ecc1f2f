"""Paged block 16 where a program's share of a sequence is short: key tiles of 64, 32 and 16 keys at
forced split counts, beside the same keys in a contiguous cache; CUDA-graph µs, 3 interleaved rounds
(32/8, D = 128; docs/performance.md, entry 64; guards/decode_page16_small_1097615.jsonl).

    PYTHONPATH=src python benchmarks/decode_page16_small.py [--shapes 0,3]
"""

import torch

from ab_runs import main, timed_rounds
from flashtriton import launch
from flashtriton.launch.tiles import TileConfig
from flashtriton.tools.decode_bench import DecodeShape, _inputs

TILES = {"64x2": TileConfig(16, 64, num_warps=4, num_stages=2), "32x4": TileConfig(16, 32, num_warps=4, num_stages=4),
         "32x2": TileConfig(16, 32, num_warps=4, num_stages=2), "16x4": TileConfig(16, 16, num_warps=4, num_stages=4)}
SHAPES = [(8, 1024), (1, 8192), (1, 1024), (8, 8192), (1, 32768)]  # (B, Nk)


def contiguous_copy(k, v, table, batch, heads_kv, seqlen_k):
    """The paged cache's keys and values in a contiguous (B, Hkv, Nk, D) cache."""
    return (x[table.long()].permute(0, 2, 1, 3, 4).reshape(batch, heads_kv, seqlen_k, x.shape[-1]).contiguous()
            for x in (k, v))


def block16_calls(batch, seqlen_k) -> tuple[dict, tuple]:
    """({"paged16": the launcher's rule on a block-16 cache, "contiguous": the same keys contiguous}, and
    (q, k, v, lengths, table)), 32/8 heads at D = 128, the inputs ready on the GPU."""
    torch.manual_seed(0)
    q, k, v, table = _inputs(DecodeShape(batch, 32, 8, seqlen_k, 128, layout="paged16"))
    lengths = torch.full((batch,), seqlen_k, dtype=torch.int32, device="cuda")
    kc, vc = contiguous_copy(k, v, table, batch, 8, seqlen_k)
    torch.cuda.synchronize()  # do_bench_cudagraph's side stream does not wait for the inputs
    return ({"paged16": lambda: launch.attention_decode(q, k, v, lengths, 128 ** -0.5, block_table=table)[0],
             "contiguous": lambda: launch.attention_decode(q, kc, vc, lengths, 128 ** -0.5)[0]},
            (q, k, v, lengths, table))


def race(batch, seqlen_k) -> dict:
    providers, (q, k, v, lengths, table) = block16_calls(batch, seqlen_k)
    providers = {"rule": providers["paged16"], "contiguous": providers["contiguous"]}
    for name, tiles in TILES.items():
        for splits in (2, 4, 8, 16, 32, 64):
            if splits * 2 * tiles.block_n <= seqlen_k:
                providers[f"{name} s{splits}"] = (
                    lambda tiles=tiles, splits=splits: launch.attention_decode(
                        q, k, v, lengths, 128 ** -0.5, block_table=table, tiles=tiles, num_splits=splits)[0])
    with torch.no_grad():
        ms = timed_rounds(providers, 3, graphs=True)
    return dict(shape=f"B{batch} Nk{seqlen_k}", us={n: round(t * 1e3, 2) for n, t in ms.items()})


if __name__ == "__main__":
    main(race, SHAPES, __doc__)
