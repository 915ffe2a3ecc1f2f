"""Ulysses (DeepSpeed's sequence parallelism): an all-to-all turns each rank's positions of every head
into every position of its share of the heads, each rank runs the whole sequence's attention on those
heads, and a second all-to-all turns the output back. The attention is a plain `flash_attention` call,
so every flag works; the heads must divide among the ranks, and the layout is the contiguous one (rank r
holds positions [r n, (r + 1) n)), so that the gathered positions are in order."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..api import flash_attention
from ..validation import check_flags, check_inputs
from .collectives import AllToAll, agree


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
                      scale: float | None = None, window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                      alibi_slopes: torch.Tensor | None = None, group=None, return_lse: bool = False):
    """Exact attention of a sequence sharded contiguously over the ranks of `group` (default: the world).

    Args:
        q: (B, Hq, n, D), this rank's n positions (`contiguous_shard` of the whole q).
        k, v: (B, Hkv, n, D). Hq and Hkv must both be multiples of the world size.
        is_causal, scale, window_size, softcap: as in `flash_attention`, over the global positions.
        alibi_slopes: (Hq,) or (B, Hq) float32, every head's slope, the same on every rank (each rank
            takes its heads' share).
        return_lse: also return this rank's rows of the logsumexp, (B, Hq, n) float32.

    Returns:
        o (B, Hq, n, D); with `return_lse`, (o, lse). Differentiable in q, k, v.
    """
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    error, signature = None, None
    try:
        check_inputs(q, k, v, is_causal=is_causal)
        check_flags(return_lse=return_lse)
        for name, heads in (("q", q.shape[1]), ("k and v", k.shape[1])):
            if heads % world:
                raise ValueError(f"ulysses_attention gives each of the {world} ranks an equal share of the heads, and "
                                 f"{name} have {heads}; use ring_attention, which shards the sequence alone")
        signature = (tuple(q.shape), tuple(k.shape), tuple(v.shape), str(q.dtype), bool(is_causal), scale,
                     tuple(window_size), softcap, alibi_slopes is not None)
    except (ValueError, TypeError, NotImplementedError, RuntimeError) as caught:
        error = caught
    agree(group, "ulysses_attention", signature, error)
    q_heads, k_heads, v_heads = (AllToAll.apply(x, group, True) for x in (q, k, v))
    if alibi_slopes is not None:
        share = q.shape[1] // world
        alibi_slopes = alibi_slopes[..., rank * share:(rank + 1) * share]
    o, lse = flash_attention(q_heads, k_heads, v_heads, is_causal=is_causal, scale=scale, window_size=window_size,
                             softcap=softcap, alibi_slopes=alibi_slopes, return_lse=True)
    o = AllToAll.apply(o, group, False)
    if not return_lse:
        return o
    return o, AllToAll.apply(lse[..., None], group, False)[..., 0]
