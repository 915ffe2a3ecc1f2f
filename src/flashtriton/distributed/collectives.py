"""The communication the context-parallel functions need: every rank agreeing on a call before any
collective runs, the ring's neighbour exchange, and the all-to-all between sequence and head shards."""

from __future__ import annotations

import torch
import torch.distributed as dist

_ERRORS = {"ValueError": ValueError, "TypeError": TypeError, "NotImplementedError": NotImplementedError}


def agree(group, what: str, signature: tuple, error: Exception | None) -> None:
    """Share this rank's call `signature` (shapes, dtypes, options) and the error its own checks raised
    (or None); raise on every rank if any rank had an error or the signatures differ. A rank that raised
    alone would leave the others waiting in the next collective."""
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, (signature, None if error is None else (type(error).__name__, str(error))),
                           group=group)
    errors = [(rank, failed) for rank, (_, failed) in enumerate(gathered) if failed is not None]
    if errors:
        kind = _ERRORS.get(errors[0][1][0], ValueError)
        raise kind(f"{what}: " + "; ".join(f"rank {rank}: {message}" for rank, (_, message) in errors))
    if any(sig != gathered[0][0] for sig, _ in gathered):
        differ = "; ".join(f"rank {rank}: {sig}" for rank, (sig, _) in enumerate(gathered))
        raise ValueError(f"{what}: the ranks were called with different shapes or options ({differ}); every rank "
                         "must pass its shard of the same call")


class Ring:
    """Neighbour exchange around the group's ring: `start(tensors)` sends them to the next rank and
    receives the previous rank's into new buffers, asynchronously; `wait()` returns those buffers."""

    def __init__(self, group):
        self.group = group
        group = group or dist.group.WORLD  # P2POp takes global ranks; this maps the group's to them
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        self.next, self.prev = (dist.get_global_rank(group, (rank + step) % world) for step in (1, -1))

    def start(self, tensors: tuple[torch.Tensor, ...]) -> _Pending:
        # contiguous buffers: empty_like would copy a view's strides (flash_attn's layout), and
        # point-to-point receives take contiguous tensors only
        received = tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in tensors)
        ops = [dist.P2POp(dist.isend, t.contiguous(), self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, r, self.prev, self.group) for r in received]
        return _Pending(dist.batch_isend_irecv(ops), received)


class _Pending:
    def __init__(self, requests, received):
        self.requests, self.received = requests, received

    def wait(self) -> tuple[torch.Tensor, ...]:
        for request in self.requests:
            request.wait()
        return self.received


def seq_to_heads(x: torch.Tensor, group) -> torch.Tensor:
    """(B, H, n, D), this rank's n positions of every head, to (B, H / R, R n, D): every position of this
    rank's group of heads, the ranks' positions in rank order."""
    world = dist.get_world_size(group)
    batch, heads, n, dim = x.shape
    sent = x.reshape(batch, world, heads // world, n, dim).transpose(0, 1).contiguous()  # [r]: rank r's heads
    got = torch.empty_like(sent)
    dist.all_to_all_single(got, sent, group=group)  # got[r]: rank r's positions of this rank's heads
    return got.permute(1, 2, 0, 3, 4).reshape(batch, heads // world, world * n, dim)


def heads_to_seq(y: torch.Tensor, group) -> torch.Tensor:
    """The inverse of seq_to_heads: (B, H / R, R n, D) back to (B, H, n, D)."""
    world = dist.get_world_size(group)
    batch, heads, length, dim = y.shape
    sent = y.reshape(batch, heads, world, length // world, dim).permute(2, 0, 1, 3, 4).contiguous()
    got = torch.empty_like(sent)
    dist.all_to_all_single(got, sent, group=group)  # got[r]: rank r's heads at this rank's positions
    return got.transpose(0, 1).reshape(batch, world * heads, length // world, dim)


class AllToAll(torch.autograd.Function):
    """`AllToAll.apply(x, group, to_heads)`: seq_to_heads (to_heads True) or heads_to_seq, each the
    other's gradient."""

    @staticmethod
    def forward(ctx, x, group, to_heads):
        ctx.group, ctx.to_heads = group, to_heads
        return (seq_to_heads if to_heads else heads_to_seq)(x, group)

    @staticmethod
    def backward(ctx, grad):
        return (heads_to_seq if ctx.to_heads else seq_to_heads)(grad.contiguous(), ctx.group), None, None
