"""How a sequence of N tokens is laid out over R ranks.

Zigzag (ring attention's default): the sequence is cut into 2R equal chunks and rank r holds chunks r
and 2R-1-r, so that under a causal mask every rank has one early chunk (little to attend to) and one late
chunk (much to attend to), and the same work. Contiguous: rank r holds chunk r of R (Ulysses; a causal
ring on it leaves the last rank with R times the work of the first)::

    N = 16 tokens, R = 2        chunk:  0    1    2    3
    zigzag      rank 0 holds  [ 0  ][    ][    ][ 3  ]   tokens 0-3 and 12-15
                rank 1 holds  [    ][ 1  ][ 2  ][    ]   tokens 4-7 and 8-11
    contiguous  rank 0 holds  [ 0       1 ][          ]   tokens 0-7
                rank 1 holds  [           ][ 2      3 ]   tokens 8-15
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _world(group) -> tuple[int, int]:
    return dist.get_world_size(group), dist.get_rank(group)


def _check_divisible(n: int, parts: int, dim: int, layout: str) -> None:
    if n % parts:
        raise ValueError(f"the {layout} layout cuts dim {dim} (length {n}) into {parts} equal chunks, and {parts} "
                         f"does not divide {n}; pad the sequence to a multiple of {parts} (and mask the padding)")


def zigzag_shard(x: torch.Tensor, dim: int = 2, group=None, *, world_size: int | None = None,
                 rank: int | None = None) -> torch.Tensor:
    """This rank's zigzag shard of the whole `x` along `dim` (2: (B, H, N, D)): chunks rank and 2R-1-rank of
    2R, concatenated. `world_size` and `rank` default to the group's."""
    world, me = _world(group) if world_size is None else (world_size, rank)
    _check_divisible(x.shape[dim], 2 * world, dim, "zigzag")
    chunks = x.chunk(2 * world, dim)
    return torch.cat([chunks[me], chunks[2 * world - 1 - me]], dim).contiguous()


def zigzag_unshard(x: torch.Tensor, dim: int = 2, group=None) -> torch.Tensor:
    """The whole tensor from every rank's zigzag shard (an all-gather; every rank gets it)."""
    world, _ = _world(group)
    shards = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(shards, x.contiguous(), group=group)
    chunks = [None] * (2 * world)
    for r, shard in enumerate(shards):
        chunks[r], chunks[2 * world - 1 - r] = shard.chunk(2, dim)
    return torch.cat(chunks, dim)


def contiguous_shard(x: torch.Tensor, dim: int = 2, group=None, *, world_size: int | None = None,
                     rank: int | None = None) -> torch.Tensor:
    """This rank's contiguous shard of the whole `x` along `dim`: chunk rank of R."""
    world, me = _world(group) if world_size is None else (world_size, rank)
    _check_divisible(x.shape[dim], world, dim, "contiguous")
    return x.chunk(world, dim)[me].contiguous()


def contiguous_unshard(x: torch.Tensor, dim: int = 2, group=None) -> torch.Tensor:
    """The whole tensor from every rank's contiguous shard (an all-gather; every rank gets it)."""
    world, _ = _world(group)
    shards = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(shards, x.contiguous(), group=group)
    return torch.cat(shards, dim)
