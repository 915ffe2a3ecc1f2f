"""Chunked prefill with a lengths tensor through the decode kernel at forced tiles, beside the same call through
the library's route (since f1af9cd the dense forward, with key counts), the call with an int length and the
dense causal forward at N = 4096: eager ms, 3 interleaved rounds, TFLOP/s on the causal pairs (B4, 32/8 heads,
Nq 512 against Nk 16384, D = 128, bf16; docs/performance.md, entry 64; guards/prefill_tiles_1797692.json).

    PYTHONPATH=src python benchmarks/prefill_tiles.py
"""

import json

import torch

from ab_runs import timed_rounds
from flashtriton import launch
from flashtriton.api import flash_attention
from flashtriton.kvcache import flash_attention_with_kvcache
from flashtriton.launch.tiles import TileConfig

TILES = {"64x64w4s2": None, "128x64w8s2": TileConfig(128, 64, num_warps=8, num_stages=2),
         "128x64w8s3": TileConfig(128, 64, num_warps=8, num_stages=3),
         "128x128w8s2": TileConfig(128, 128, num_warps=8, num_stages=2),
         "64x64w4s3": TileConfig(64, 64, num_warps=4, num_stages=3)}


def main() -> None:
    torch.manual_seed(0)
    q = torch.randn(4, 32, 512, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(4, 8, 16384, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lengths = torch.full((4,), 16384, dtype=torch.int32, device="cuda")
    qd, kd, vd = (torch.randn(4, 32, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    providers = {name: (lambda tiles=tiles: launch.attention_decode(q, k, v, lengths, 128 ** -0.5, is_causal=True,
                                                                    tiles=tiles)[0])
                 for name, tiles in TILES.items()}
    providers["int length (dense path)"] = lambda: flash_attention_with_kvcache(q, k, v, 16384, is_causal=True)
    providers["lengths tensor (dense path)"] = lambda: flash_attention_with_kvcache(q, k, v, lengths, is_causal=True)
    providers["dense N4096"] = lambda: flash_attention(qd, kd, vd, is_causal=True)
    with torch.no_grad():
        ref = providers["int length (dense path)"]().float()
        err = {name: round((fn().float() - ref).abs().max().item(), 4) for name, fn in providers.items()
               if "dense" not in name}
        ms = timed_rounds(providers, 3)
    flops = 4.0 * 4 * 32 * (512 * 16384 - 512 * 511 // 2) * 128
    dense = 4.0 * 4 * 32 * (4096 * 4097 // 2) * 128
    print(json.dumps(dict(err=err, ms={n: round(t, 4) for n, t in ms.items()},
                          tflops={n: round((dense if n == "dense N4096" else flops) / t / 1e9, 1)
                                  for n, t in ms.items()})))


if __name__ == "__main__":
    main()
