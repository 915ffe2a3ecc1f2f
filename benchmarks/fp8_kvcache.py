"""Decoding against an FP8 KV cache (flash_attention_with_kvcache with k_descale, v_descale) beside the
same cache in bf16, cuDNN on the bf16 one, and the FP8 cache on the tiles a bf16 cache takes, on a GPU:
ms (do_bench medians of interleaved rounds) and the bandwidth each reaches on the bytes it must read (K
and V at their width, plus Q and O), with the FP8 output's largest error against the bf16 cache's.
Per-(batch, KV head) descales. One JSON line per shape. docs/performance.md, entries 61 and 62.

    PYTHONPATH=src python benchmarks/fp8_kvcache.py [--shapes 0,2]
"""

import torch

import ab_runs
from flashtriton import flash_attention_with_kvcache, launch
from flashtriton.launch.decode import decode_tiles

ROUNDS = 5
# (batch, query heads, KV heads, cached keys, head dim, block size or 0 for a contiguous cache)
SHAPES = [(64, 32, 8, 8192, 128, 0), (8, 32, 32, 32768, 128, 0), (256, 32, 8, 8192, 128, 0),
          (64, 32, 8, 8192, 128, 16), (64, 32, 8, 8192, 128, 64), (64, 32, 8, 8192, 64, 0),
          (8, 32, 32, 32768, 64, 0), (8, 32, 8, 8192, 128, 0), (1, 32, 8, 1024, 128, 0)]


def race(batch: int, heads_q: int, heads_kv: int, seqlen_k: int, head_dim: int, block: int) -> dict:
    torch.manual_seed(0)
    q = torch.randn(batch, heads_q, 1, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(batch, heads_kv, seqlen_k, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k_descale, v_descale = (x.abs().amax(dim=(2, 3)).float() / 448 for x in (k, v))
    k8, v8 = ((x.float() / d[:, :, None, None]).to(torch.float8_e4m3fn) for x, d in ((k, k_descale), (v, v_descale)))
    table = None
    if block:  # each sequence's blocks scattered over the pool
        blocks = seqlen_k // block
        table = torch.randperm(batch * blocks, device="cuda").view(batch, blocks).to(torch.int32)
        k, v, k8, v8 = (x.transpose(1, 2).reshape(batch * blocks, block, heads_kv, head_dim).transpose(1, 2)
                        [torch.argsort(table.flatten())].contiguous() for x in (k, v, k8, v8))
    lengths = torch.full((batch,), seqlen_k, dtype=torch.int32, device="cuda")

    def ours(kc, vc, **scales):
        return lambda: flash_attention_with_kvcache(q, kc, vc, lengths, block_table=table, **scales)
    providers = {"bf16": ours(k, v), "fp8": ours(k8, v8, k_descale=k_descale, v_descale=v_descale)}
    # The FP8 cache on the tiles a bf16 cache takes, for the record of what its own tiles buy (entry 62)
    tiles = decode_tiles(heads_q // heads_kv, head_dim)
    providers["fp8_bf16_tiles"] = lambda: launch.attention_decode(q, k8, v8, lengths, head_dim ** -0.5,
                                                                   block_table=table, tiles=tiles,
                                                                   k_descale=k_descale, v_descale=v_descale)[0]
    if not block:
        providers["cudnn"] = ab_runs.cudnn(q, k, v)
    with torch.no_grad():
        err = (providers["fp8"]().float() - providers["bf16"]().float()).abs().max().item()
        tiles_err = (providers["fp8_bf16_tiles"]().float() - providers["fp8"]().float()).abs().max().item()
        ms = ab_runs.timed_rounds(providers, ROUNDS)
    io = 2 * q.numel() * 2
    kv = 2 * batch * heads_kv * seqlen_k * head_dim
    tb_s = {name: round(((kv if name.startswith("fp8") else 2 * kv) + io) / t / 1e9, 2) for name, t in ms.items()}
    return dict(shape=f"B{batch} H{heads_q}/{heads_kv} Nk{seqlen_k} D{head_dim} "
                      f"{f'paged{block}' if block else 'contiguous'}",
                ms={name: round(t, 4) for name, t in ms.items()}, tb_s=tb_s,
                fp8_speedup=round(ms["bf16"] / ms["fp8"], 3), max_err_vs_bf16=float(f"{err:.2e}"),
                bf16_tiles_diff=float(f"{tiles_err:.2e}"))


if __name__ == "__main__":
    ab_runs.main(race, SHAPES, __doc__.split("\n\n")[0])
