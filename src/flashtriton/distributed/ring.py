"""Ring attention: each rank keeps its queries and passes its keys and values around the ring, so that
after R steps every query block has met every key block; partial outputs merge exactly through their
logsumexp, in float32:

    L = log(e^L_a + e^L_b),   O = e^(L_a - L) O_a + e^(L_b - L) O_b

The backward passes K and V around again, with an accumulator of their gradients travelling one step
behind them: each rank computes its queries' share (flashtriton's backward, given the global O and L,
gives a block's exact share), then adds it to the accumulator that arrived meanwhile and sends that on;
after R steps every accumulator is back home, complete, and only that last hop is not hidden behind
kernels (it travels in the inputs' dtype, half of float32). The next block's transfer is started before
this block's kernels, so that the two overlap.

Which blocks a step computes, for this rank's queries against the keys that started on rank `src`
(layout.py describes the layouts; causal positions are global ones):

    zigzag, causal:  src == rank: both chunks, causal       (the diagonal)
                     src <  rank: both query chunks against src's early chunk, in full
                     src >  rank: the late query chunk against both of src's chunks, in full
    contiguous, causal: src == rank causal, src < rank in full, src > rank nothing
    not causal: everything against everything, in full

Softcap and GQA are flags of those calls. A sliding window makes one call per pair of chunks that its
band reaches, each with an ordinary window (`_band_calls`). ALiBi (a bias from global positions) and
dropout (a mask independent of the sharding) need more of the kernels, and raise NotImplementedError.
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


def _chunks(rank: int, world: int, length: int, layout: str) -> list[tuple[int, int]]:
    """(local start, global start) of each chunk a rank holds, every chunk `length // 2` long (zigzag)
    or `length` (contiguous)."""
    if layout == "contiguous":
        return [(0, rank * length)]
    half = length // 2
    return [(0, rank * half), (half, (2 * world - 1 - rank) * half)]


def _band_calls(rank: int, src: int, world: int, length: int, layout: str, is_causal: bool,
                window: tuple[int, int]) -> list[tuple[slice, slice, tuple[int, int]]]:
    """(query rows, key rows, window) of the calls one step makes under a sliding window: one per pair of
    chunks that the band reaches. Query a of a chunk starting at global Q0 sees key b of one starting at
    K0 iff lo <= b - a <= hi, lo = d - left, hi = d + right (causal: hi <= d), d = Q0 - K0. A band that
    lies wholly above or below a pair's diagonal is shifted onto it by slicing the rows off that see
    nothing, so that every call's window is an ordinary one (left, right >= 0, -1 unbounded)."""
    left, right = window
    calls = []
    for q_local, q_global in _chunks(rank, world, length, layout):
        for k_local, k_global in _chunks(src, world, length, layout):
            size = length // 2 if layout == "zigzag" else length
            d = q_global - k_global
            lo = -size if left < 0 else d - left
            hi = size if right < 0 else d + right
            if is_causal:
                hi = min(hi, d)
            lo, hi = max(lo, -(size - 1)), min(hi, size - 1)
            if lo > hi:
                continue
            q0, k0, rows = 0, 0, size
            if lo > 0:  # keys [lo, size) for queries [0, size - lo): b' - a in [0, hi - lo]
                k0, rows, lo, hi = lo, size - lo, 0, hi - lo
            elif hi < 0:  # queries [-hi, size) against keys [0, size + hi): b - a' in [lo - hi, 0]
                q0, rows, lo, hi = -hi, size + hi, lo - hi, 0
            band = (-1 if -lo >= rows - 1 else -lo, -1 if hi >= rows - 1 else hi)
            calls.append((slice(q_local + q0, q_local + q0 + rows), slice(k_local + k0, k_local + k0 + rows), band))
    return calls


def _calls(rank: int, src: int, world: int, length: int, layout: str, is_causal: bool,
           window: tuple[int, int]) -> list[tuple[slice, slice, bool, tuple[int, int]]]:
    """(query rows, key rows, causal, window) of one step's calls."""
    if window == (-1, -1):
        return [(rows, cols, causal, window) for rows, cols, causal in _blocks(rank, src, length, layout, is_causal)]
    return [(rows, cols, False, band) for rows, cols, band in
            _band_calls(rank, src, world, length, layout, is_causal, window)]


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


def _zeros(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros(x.shape, device=x.device, dtype=torch.float32)


def _no_rows_yet(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's running (out, lse) before any block: O = 0, L = -inf."""
    return _zeros(q), torch.full(q.shape[:3], float("-inf"), device=q.device, dtype=torch.float32)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale, window, softcap, layout, group, deterministic):
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        ring = Ring(group) if world > 1 else None
        out = lse = None  # the float32 running output and logsumexp, from the first block that covers every row
        keys = (k, v)
        for step in range(world):
            src = (rank - step) % world
            pending = ring.start(keys) if step + 1 < world else None  # the next block travels meanwhile
            for rows, cols, causal, band in _calls(rank, src, world, q.shape[2], layout, is_causal, window):
                o_block, lse_block = ops.attention(_rows(q, rows), keys[0][:, :, cols], keys[1][:, :, cols], None,
                                                   None, 0, 0, causal, scale, *band, softcap, None, 0.0, None)
                if out is None and rows == _ALL:
                    out, lse = o_block.float(), lse_block
                    continue
                if out is None:
                    out, lse = _no_rows_yet(q)
                _merge(out, lse, rows, o_block, lse_block)
            if pending is not None:
                keys = pending.wait()
        if out is None:  # no block at all (an empty shard)
            out, lse = _no_rows_yet(q)
        o = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.options = (is_causal, scale, window, softcap, layout, group, deterministic)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        is_causal, scale, window, softcap, layout, group, deterministic = ctx.options
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        ring = Ring(group) if world > 1 else None
        do = do.contiguous()
        keys = (k, v)
        dq = None  # the float32 accumulator of this rank's queries, from the first block that covers every row
        arriving = None  # the previous rank's accumulator of the keys held now: sent during this step's kernels
        for step in range(world):
            src = (rank - step) % world
            pending = ring.start(keys) if step + 1 < world else None
            shares = []  # (key rows, dk, dv) of this rank's queries against the keys held now
            for rows, cols, causal, band in _calls(rank, src, world, q.shape[2], layout, is_causal, window):
                dq_block, dk_block, dv_block = ops.backward_impl(
                    _rows(do, rows), _rows(q, rows), keys[0][:, :, cols], keys[1][:, :, cols], _rows(o, rows),
                    lse[:, :, rows].contiguous(), None, None, 0, 0, causal, scale, *band, softcap, None, 0.0, None,
                    deterministic, True, True)
                shares.append((cols, dk_block, dv_block))
                if dq is None and rows == _ALL:
                    dq = dq_block.float()
                    continue
                if dq is None:
                    dq = _zeros(q)
                dq[:, :, rows] += dq_block
            grads = _with_shares(None if arriving is None else arriving.wait(), shares, k, v)
            if step + 1 < world:  # the accumulator follows its keys to the next rank, under the next step's kernels
                arriving = ring.start(grads)
                keys = pending.wait()
            elif ring is not None:  # complete now: the last hop takes it home, already in the inputs' dtype
                grads = ring.start((grads[0].to(k.dtype), grads[1].to(v.dtype))).wait()
        if dq is None:
            dq = _zeros(q)
        return dq.to(q.dtype), grads[0].to(k.dtype), grads[1].to(v.dtype), *(None,) * 7


def _with_shares(grads: tuple[torch.Tensor, torch.Tensor] | None, shares: list, k: torch.Tensor, v: torch.Tensor):
    """The keys' float32 accumulators (dk, dv), or new ones where `grads` is None, plus this rank's
    `shares` (key rows, dk, dv), added in place."""
    if grads is None and len(shares) == 1 and shares[0][0] == _ALL:
        return shares[0][1].float(), shares[0][2].float()
    if grads is None:
        grads = (_zeros(k), _zeros(v))
    for cols, dk_block, dv_block in shares:
        grads[0][:, :, cols] += dk_block
        grads[1][:, :, cols] += dv_block
    return grads


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
                   scale: float | None = None, softcap: float = 0.0, layout: str = "zigzag", group=None,
                   return_lse: bool = False, window_size: tuple[int, int] = (-1, -1),
                   alibi_slopes: torch.Tensor | None = None, dropout_p: float = 0.0, deterministic: bool = False):
    """Exact attention of a sequence sharded over the ranks of `group` (default: the world).

    Args:
        q: (B, Hq, n, D), this rank's n positions of the sequence, laid out by `layout` (layout.py:
            `zigzag_shard` of the whole q on every rank; with "zigzag" n must be even).
        k, v: (B, Hkv, n, D), the same positions; Hq a multiple of Hkv.
        is_causal: causal over the global positions of the whole sequence.
        scale, window_size, softcap: as in `flash_attention`, over the global positions.
        layout: "zigzag" (balanced causal work) or "contiguous".
        return_lse: also return this rank's rows of the logsumexp, (B, Hq, n) float32.
        alibi_slopes, dropout_p: not supported yet (NotImplementedError); `ulysses_attention` takes ALiBi.
        deterministic: each block's backward bitwise reproducible (see `flash_attention`).

    Returns:
        o (B, Hq, n, D) for this rank's positions; with `return_lse`, (o, lse). Differentiable in q, k, v.
    """
    error, signature = None, None
    try:
        check_inputs(q, k, v, is_causal=is_causal)
        check_flags(return_lse=return_lse, deterministic=deterministic)
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if layout == "zigzag" and q.shape[2] % 2:
            raise ValueError(f"the zigzag layout holds two equal chunks per rank, so the local length must be even; "
                             f"got {q.shape[2]}: shard the whole sequence with zigzag_shard (its length a multiple "
                             "of 2 x world size)")
        if alibi_slopes is not None or dropout_p:
            raise NotImplementedError("ring_attention does not take ALiBi or dropout yet (ALiBi needs each block's "
                                      "global offset inside the kernels, dropout a mask independent of the "
                                      "sharding); use ulysses_attention for ALiBi, when the heads divide among "
                                      "the ranks")
        scale, window_left, window_right, softcap, _, _, _ = op_options(q, scale, window_size, softcap, None, 0.0)
        window = (window_left, window_right)
        signature = (tuple(q.shape), tuple(k.shape), tuple(v.shape), str(q.dtype), bool(is_causal), scale, window,
                     softcap, layout)
    except (ValueError, TypeError, NotImplementedError, RuntimeError) as caught:
        error = caught
    agree(group, "ring_attention", signature, error)
    o, lse = _RingAttention.apply(q, k, v, bool(is_causal), scale, window, softcap, layout, group, deterministic)
    return (o, lse) if return_lse else o


def _flash_attn_style(layout: str, q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes,
                      deterministic, return_attn_probs, group):
    o, lse = ring_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                            scale=softmax_scale, layout=layout, group=group, return_lse=True, window_size=window_size,
                            alibi_slopes=alibi_slopes, dropout_p=dropout_p, deterministic=deterministic)
    o = o.transpose(1, 2)
    return (o, lse, None) if return_attn_probs else o


def zigzag_ring_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                                alibi_slopes=None, deterministic=False, return_attn_probs=False, group=None):
    """ring-flash-attn's `zigzag_ring_flash_attn_func`: q, k, v (B, n, H, D), this rank's zigzag shard;
    returns o (B, n, H, D), or with return_attn_probs (o, lse (B, H, n), None) as ring-flash-attn does."""
    return _flash_attn_style("zigzag", q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes,
                             deterministic, return_attn_probs, group)


def ring_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                         alibi_slopes=None, deterministic=False, return_attn_probs=False, group=None):
    """ring-flash-attn's `ring_flash_attn_func`: the contiguous layout (rank r holds chunk r), otherwise as
    `zigzag_ring_flash_attn_func`."""
    return _flash_attn_style("contiguous", q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes,
                             deterministic, return_attn_probs, group)
