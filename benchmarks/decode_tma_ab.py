"""The decode kernel's tiles through TMA descriptors against pointer loads (launch/decode.py's
decode_uses_tma), CUDA-graph ms in interleaved rounds, with cuDNN on the bf16 contiguous rows and the FP8
cache (e4m3, per-tensor descales) on the rows that name it. docs/performance.md, entry 63.

    PYTHONPATH=src python benchmarks/decode_tma_ab.py [--shapes 0,3]
"""

import torch

from ab_runs import cudnn, fp8_cache, main, timed_rounds
from flashtriton import launch
from flashtriton.launch.tiles import TileConfig
from flashtriton.tools.decode_bench import DecodeShape, _inputs

ROUNDS = 5
# (B, Hq, Hkv, Nk, D, layout, fp8): the large rows that trailed cuDNN, small ones, paged blocks of whole
# key tiles, and the FP8 cache.
SHAPES = [(8, 32, 32, 131072, 128, "contiguous", False), (1, 32, 32, 131072, 128, "contiguous", False),
          (8, 32, 32, 32768, 128, "contiguous", False), (64, 32, 8, 8192, 128, "contiguous", False),
          (256, 32, 8, 8192, 128, "contiguous", False), (8, 32, 32, 131072, 64, "contiguous", False),
          (256, 32, 8, 1024, 64, "contiguous", False), (64, 32, 32, 1024, 64, "contiguous", False),
          (64, 32, 32, 1024, 128, "contiguous", False), (8, 32, 8, 1024, 128, "contiguous", False),
          (1, 32, 8, 8192, 128, "contiguous", False), (64, 32, 8, 8192, 128, "paged64", False),
          (64, 32, 8, 8192, 128, "contiguous", True), (8, 32, 32, 32768, 128, "contiguous", True),
          (64, 32, 8, 8192, 64, "contiguous", True), (64, 32, 8, 8192, 128, "paged64", True)]
# An FP8 cache's tiles with TMA at half the key tile of decode_tiles (its V then needs no byte gather,
# so the registers that asked for longer tiles are freed), which lets 64-key blocks take TMA at D = 128.
HALF_TILES = {128: TileConfig(16, 64, num_warps=4, num_stages=3), 64: TileConfig(16, 128, num_warps=4, num_stages=3)}


def race(batch, heads_q, heads_kv, seqlen_k, head_dim, layout, fp8) -> dict:
    shape = DecodeShape(batch, heads_q, heads_kv, seqlen_k, head_dim, layout=layout)
    torch.manual_seed(0)
    q, k, v, table = _inputs(shape)
    k_descale = v_descale = None
    if fp8:
        k, v, k_descale, v_descale = fp8_cache(k, v)
    lengths = torch.full((batch,), seqlen_k, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()  # do_bench_cudagraph's side stream does not wait for the inputs

    def ours(tma, tiles=None):
        return lambda: launch.attention_decode(q, k, v, lengths, head_dim ** -0.5, block_table=table, tma=tma,
                                               k_descale=k_descale, v_descale=v_descale, tiles=tiles)[0]
    providers = {"pointers": ours(False), "tma": ours(True)}
    if layout == "paged64" and fp8:  # 128-key tiles span two blocks: only the half tiles can take TMA
        providers = {"pointers": ours(False), "tma": ours(True, HALF_TILES[head_dim])}
    elif fp8:
        providers["tma_half_tiles"] = ours(True, HALF_TILES[head_dim])
    if layout == "contiguous" and not fp8:
        providers["cudnn"] = cudnn(q, k, v)
    with torch.no_grad():
        same = torch.equal(providers["pointers"](), providers["tma"]())
        ms = timed_rounds(providers, ROUNDS, graphs=True)
    kv_bytes = 2 * batch * heads_kv * seqlen_k * head_dim * (1 if fp8 else 2)
    return dict(shape=f"B{batch} H{heads_q}/{heads_kv} Nk{seqlen_k} D{head_dim} {layout}{' fp8' if fp8 else ''}",
                us={name: round(t * 1e3, 1) for name, t in ms.items()},
                tb_s={name: round(kv_bytes / t / 1e9, 2) for name, t in ms.items()},
                tma_vs_pointers=round(ms["pointers"] / ms["tma"], 4),
                tma_vs_cudnn=round(ms["cudnn"] / ms["tma"], 4) if "cudnn" in ms else None, bitwise_equal=same)


if __name__ == "__main__":
    main(race, SHAPES, __doc__)
