"""FP8 KV-cache decode tiles, raced: Nsight Compute found the default FP8 loop (208 registers, two
programs per SM) waiting on its own instructions rather than on memory (docs/performance.md, entry 63),
so these trade key-tile length, stages and a register cap for programs per SM, through pointers and
through TMA. CUDA-graph µs, median of ROUNDS interleaved rounds, the bf16 cache beside them.

    PYTHONPATH=src python benchmarks/fp8_decode_tiles.py [--shapes 0,2]
"""

import torch

from ab_runs import fp8_cache, main, timed_rounds
from flashtriton import launch
from flashtriton.launch.tiles import TileConfig

ROUNDS = 3
SHAPES = [(64, 32, 8, 8192, 128), (8, 32, 32, 32768, 128), (64, 32, 8, 8192, 64), (8, 32, 32, 32768, 64)]
# (name, key tile, stages, register cap, TMA), per head dim; the first is decode_tiles' choice
CONFIGS = {128: [("default", 128, 3, None, False), ("ptr64x3r128", 64, 3, 128, False),
                 ("ptr64x4r128", 64, 4, 128, False), ("tma64x2", 64, 2, None, True), ("tma64x3", 64, 3, None, True),
                 ("tma128x2r128", 128, 2, 128, True)],
           64: [("default", 256, 3, None, False), ("ptr128x3r128", 128, 3, 128, False),
                ("ptr128x4r128", 128, 4, 128, False), ("tma128x2", 128, 2, None, True),
                ("tma128x3", 128, 3, None, True)]}


def race(batch, heads_q, heads_kv, seqlen_k, head_dim) -> dict:
    torch.manual_seed(0)
    q = torch.randn(batch, heads_q, 1, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(batch, heads_kv, seqlen_k, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k8, v8, k_descale, v_descale = fp8_cache(k, v)
    lengths = torch.full((batch,), seqlen_k, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()  # do_bench_cudagraph's side stream does not wait for the inputs

    def fp8(block_n, stages, cap, tma):
        tiles = TileConfig(16, block_n, num_warps=4, num_stages=stages, max_registers=cap)
        return lambda: launch.attention_decode(q, k8, v8, lengths, head_dim ** -0.5, k_descale=k_descale,
                                               v_descale=v_descale, tiles=tiles, tma=tma)[0]
    providers = {"bf16": lambda: launch.attention_decode(q, k, v, lengths, head_dim ** -0.5)[0]}
    providers |= {name: fp8(*config) for name, *config in CONFIGS[head_dim]}
    with torch.no_grad():
        reference = providers["default"]()
        same = {name: torch.equal(fn(), reference) for name, fn in providers.items() if name != "bf16"}
        ms = timed_rounds(providers, ROUNDS, graphs=True)
    return dict(shape=f"B{batch} H{heads_q}/{heads_kv} Nk{seqlen_k} D{head_dim}",
                us={name: round(t * 1e3, 1) for name, t in ms.items()},
                vs_bf16={name: round(ms["bf16"] / t, 3) for name, t in ms.items()}, same_as_default=same)


if __name__ == "__main__":
    main(race, SHAPES, __doc__)
