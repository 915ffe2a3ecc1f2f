"""Ring attention: each rank keeps its queries and passes its keys and values around the ring, so that
after R steps every query block has met every key block; partial outputs merge exactly through their
logsumexp, in float32:

    L = log(e^L_a + e^L_b),   O = e^(L_a - L) O_a + e^(L_b - L) O_b

The backward passes K and V around again, with an accumulator of their gradients travelling beside
them: each rank adds its queries' share (flashtriton's backward, given the global O and L, gives a block's
exact share), and after R steps every accumulator is back home, complete. The next block's transfer is
started before this block's kernels, so that the two overlap.

Which blocks a step computes, for this rank's queries against the keys that started on rank `src`
(layout.py describes the layouts; causal positions are global ones):

    zigzag, causal:  src == rank: both chunks, causal       (the diagonal)
                     src <  rank: both query chunks against src's early chunk, in full
                     src >  rank: the late query chunk against both of src's chunks, in full
    contiguous, causal: src == rank causal, src < rank in full, src > rank nothing
    not causal: everything against everything, in full

Softcap and GQA are flags of those calls; a sliding window, ALiBi and dropout need positions or masks
across blocks that the kernels do not take yet, and raise NotImplementedError.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import ops
from ..api import op_options
from ..validation import check_flags, check_inputs
from .collectives import Ring, agree

LAYOUTS = ("zigzag", "contiguous")
_ALL = slice(None)


def _blocks(rank: int, src: int, length: int, layout: str, is_causal: bool) -> list[tuple[slice, slice, bool]]:
    """(query rows, key rows, causal) of the calls one step makes, in local positions."""
    if not is_causal:
        return [(_ALL, _ALL, False)]
    if src == rank:
        return [(_ALL, _ALL, True)]
    if layout == "contiguous":
        return [(_ALL, _ALL, False)] if src < rank else []
    half = length // 2
    return [(_ALL, slice(0, half), False)] if src < rank else [(slice(half, None), _ALL, False)]


def _rows(x: torch.Tensor, rows: slice) -> torch.Tensor:
    return x if rows == _ALL else x[:, :, rows].contiguous()


def _merge(out: torch.Tensor, lse: torch.Tensor, rows: slice, o_block: torch.Tensor, lse_block: torch.Tensor) -> None:
    """Fold a block's (o, lse) into the float32 running (out, lse) at `rows`, in place."""
    old = lse[:, :, rows]
    new = torch.logaddexp(old, lse_block)
    shift = torch.where(new == float("-inf"), 0.0, new)  # rows that see nothing yet: weights 0, not NaN
    out[:, :, rows] = (out[:, :, rows] * torch.exp(old - shift)[..., None]
                       + o_block.float() * torch.exp(lse_block - shift)[..., None])
    lse[:, :, rows] = new


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale, softcap, layout, group):
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        ring = Ring(group) if world > 1 else None
        out = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
        lse = torch.full(q.shape[:3], float("-inf"), device=q.device, dtype=torch.float32)
        keys = (k, v)
        for step in range(world):
            src = (rank - step) % world
            pending = ring.start(keys) if step + 1 < world else None  # the next block travels meanwhile
            for rows, cols, causal in _blocks(rank, src, q.shape[2], layout, is_causal):
                o_block, lse_block = ops.attention(_rows(q, rows), keys[0][:, :, cols], keys[1][:, :, cols], None,
                                                   None, 0, 0, causal, scale, -1, -1, softcap, None, 0.0, None)
                _merge(out, lse, rows, o_block, lse_block)
            if pending is not None:
                keys = pending.wait()
        o = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.options = (is_causal, scale, softcap, layout, group)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        is_causal, scale, softcap, layout, group = ctx.options
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        ring = Ring(group) if world > 1 else None
        do = do.contiguous()
        dq = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
        keys = (k, v)
        grads = tuple(torch.zeros(x.shape, device=x.device, dtype=torch.float32) for x in keys)
        for step in range(world):
            src = (rank - step) % world
            pending = ring.start(keys) if step + 1 < world else None
            for rows, cols, causal in _blocks(rank, src, q.shape[2], layout, is_causal):
                dq_block, dk_block, dv_block = ops.backward_impl(
                    _rows(do, rows), _rows(q, rows), keys[0][:, :, cols], keys[1][:, :, cols], _rows(o, rows),
                    lse[:, :, rows].contiguous(), None, None, 0, 0, causal, scale, -1, -1, softcap, None, 0.0, None,
                    True, True)
                dq[:, :, rows] += dq_block
                grads[0][:, :, cols] += dk_block
                grads[1][:, :, cols] += dv_block
            if ring is not None:  # the accumulators follow their keys to the next rank; after R steps, home
                moved = ring.start(grads)
                if pending is not None:
                    keys = pending.wait()
                grads = moved.wait()
        return dq.to(q.dtype), grads[0].to(k.dtype), grads[1].to(v.dtype), None, None, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
                   scale: float | None = None, softcap: float = 0.0, layout: str = "zigzag", group=None,
                   return_lse: bool = False, window_size: tuple[int, int] = (-1, -1),
                   alibi_slopes: torch.Tensor | None = None, dropout_p: float = 0.0):
    """Exact attention of a sequence sharded over the ranks of `group` (default: the world).

    Args:
        q: (B, Hq, n, D), this rank's n positions of the sequence, laid out by `layout` (layout.py:
            `zigzag_shard` of the whole q on every rank; with "zigzag" n must be even).
        k, v: (B, Hkv, n, D), the same positions; Hq a multiple of Hkv.
        is_causal: causal over the global positions of the whole sequence.
        scale, softcap: as in `flash_attention`.
        layout: "zigzag" (balanced causal work) or "contiguous".
        return_lse: also return this rank's rows of the logsumexp, (B, Hq, n) float32.
        window_size, alibi_slopes, dropout_p: not supported yet (NotImplementedError); `ulysses_attention`
            takes them.

    Returns:
        o (B, Hq, n, D) for this rank's positions; with `return_lse`, (o, lse). Differentiable in q, k, v.
    """
    error, signature = None, None
    try:
        check_inputs(q, k, v, is_causal=is_causal)
        check_flags(return_lse=return_lse)
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if layout == "zigzag" and q.shape[2] % 2:
            raise ValueError(f"the zigzag layout holds two equal chunks per rank, so the local length must be even; "
                             f"got {q.shape[2]}: shard the whole sequence with zigzag_shard (its length a multiple "
                             "of 2 x world size)")
        if tuple(window_size) != (-1, -1) or alibi_slopes is not None or dropout_p:
            raise NotImplementedError("ring_attention does not take a sliding window, ALiBi or dropout yet (they need "
                                      "global positions inside the kernels); use ulysses_attention, which takes "
                                      "every flag, when the heads divide among the ranks")
        scale, _, _, softcap, _, _, _ = op_options(q, scale, (-1, -1), softcap, None, 0.0)
        signature = (tuple(q.shape), tuple(k.shape), tuple(v.shape), str(q.dtype), bool(is_causal), scale, softcap,
                     layout)
    except (ValueError, TypeError, NotImplementedError, RuntimeError) as caught:
        error = caught
    agree(group, "ring_attention", signature, error)
    o, lse = _RingAttention.apply(q, k, v, bool(is_causal), scale, softcap, layout, group)
    return (o, lse) if return_lse else o


def _flash_attn_style(layout: str, q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes,
                      return_attn_probs, group):
    o, lse = ring_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                            scale=softmax_scale, layout=layout, group=group, return_lse=True, window_size=window_size,
                            alibi_slopes=alibi_slopes, dropout_p=dropout_p)
    o = o.transpose(1, 2)
    return (o, lse, None) if return_attn_probs else o


def zigzag_ring_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                                alibi_slopes=None, deterministic=False, return_attn_probs=False, group=None):
    """ring-flash-attn's `zigzag_ring_flash_attn_func`: q, k, v (B, n, H, D), this rank's zigzag shard;
    returns o (B, n, H, D), or with return_attn_probs (o, lse (B, H, n), None) as ring-flash-attn does.
    `deterministic` changes nothing (the backward is deterministic)."""
    return _flash_attn_style("zigzag", q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes,
                             return_attn_probs, group)


def ring_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                         alibi_slopes=None, deterministic=False, return_attn_probs=False, group=None):
    """ring-flash-attn's `ring_flash_attn_func`: the contiguous layout (rank r holds chunk r), otherwise as
    `zigzag_ring_flash_attn_func`."""
    return _flash_attn_style("contiguous", q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes,
                             return_attn_probs, group)
