"""The autograd layer: one Function per entry point, over the launchers (launch/).

- `FlashAttention`: (B, H, N, D) tensors, already checked, with the checked keyword options
  (`checked_options`): what `flash_attention` calls.
- `FlashAttentionVarlen`: a packed batch (total, H, D): what `flash_attention_varlen` calls.
- `FlashAttentionTriton`: the article's interface on (..., N, d), checking its own inputs: a thin
  wrapper that views them as (B, H, N, D) and runs the same forward and backward.

Each saves exactly the tensors the backward reads (Q, K, V, O, L) and runs the backward's launches only
for the gradients autograd asks for. Their gradients carry no graph: a double backward raises.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .launch import TileConfig, Varlen, attention_backward, attention_forward, attention_probs, new_dropout_seed
from .validation import (
    check_alibi_slopes,
    check_dropout,
    check_inputs,
    check_scale,
    check_softcap,
    check_window,
    last_dim_contiguous,
)

NO_WINDOW = (-1, -1)


def checked_options(q: torch.Tensor, scale, window_size, softcap, alibi_slopes, dropout_p,
                    batch: int | None = None) -> dict:
    """The public keywords, checked, as the launchers' keyword arguments; those left at their defaults
    stay out (the launchers' defaults), which keeps the plain call's host path short. With dropout, the
    call's Philox key is drawn here, once for its forward and backward. `batch` is the number of
    sequences of a packed q."""
    options = dict(scale=check_scale(scale, q.shape[-1]))
    if window_size != NO_WINDOW:
        options["window"] = check_window(window_size)
    if softcap != 0.0:
        options["softcap"] = check_softcap(softcap)
    if alibi_slopes is not None:
        options["alibi_slopes"] = check_alibi_slopes(alibi_slopes, q, batch=batch)
    if dropout_p != 0.0:
        options["dropout_p"] = check_dropout(dropout_p)
        options["dropout_seed"] = new_dropout_seed(q.device)
    return options


class Tiles(NamedTuple):
    """Tile choices for tests and tools, as the launchers' keywords: the forward's `config` and `autotune`,
    the backward's `configs` (dK/dV, dQ) and `autotune`. None leaves a choice to the launcher."""
    forward: TileConfig | None = None
    backward: tuple[TileConfig, TileConfig] | None = None
    autotune_forward: bool | None = None
    autotune_backward: bool | None = None


def outputs(o: torch.Tensor, lse: torch.Tensor, return_lse: bool, probs: torch.Tensor | None):
    """o, or the tuple (o, lse if asked for, the probabilities if asked for)."""
    if not return_lse and probs is None:
        return o
    return (o, *((lse,) if return_lse else ()), *((probs,) if probs is not None else ()))


def _differentiable_in_o(ctx, result):
    """`result` (o, or a tuple led by o), with every output but o marked as carrying no gradient."""
    if isinstance(result, tuple):
        ctx.mark_non_differentiable(*result[1:])
    return result


def _forward(ctx, q, k, v, is_causal: bool, options: dict, tiles: Tiles | None, varlen: Varlen | None = None):
    """The forward on (B, H, N, D) views; keeps on ctx what the backward needs besides the saved tensors."""
    extra = {} if varlen is None else {"varlen": varlen}
    if tiles is not None:
        extra.update(config=tiles.forward, autotune=tiles.autotune_forward)
    ctx.is_causal, ctx.options, ctx.tiles, ctx.varlen = is_causal, options, tiles, varlen
    return attention_forward(q, k, v, is_causal, **options, **extra)


def _gradients(ctx, do, q, k, v, o, lse) -> list:
    """dq, dk, dv on (B, H, N, D) views, None where autograd does not want one."""
    extra = {} if ctx.varlen is None else {"varlen": ctx.varlen}
    if ctx.tiles is not None:
        extra.update(configs=ctx.tiles.backward, autotune=ctx.tiles.autotune_backward)
    return list(attention_backward(do, q, k, v, o, lse, ctx.is_causal, **ctx.options, **extra,
                                   needs=tuple(ctx.needs_input_grad[:3])))


class FlashAttention(torch.autograd.Function):
    """`FlashAttention.apply(q, k, v, is_causal, options, return_lse=False, return_attn_probs=False,
    tiles=None)` on checked (B, H, N, D) tensors with unit-stride last dims and `checked_options`; returns
    as `flash_attention` does. Saves exactly q, k, v, o, lse."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal, options, return_lse=False, return_attn_probs=False, tiles=None):
        o, lse = _forward(ctx, q, k, v, is_causal, options, tiles)
        ctx.save_for_backward(q, k, v, o, lse)
        return _differentiable_in_o(ctx, outputs(o, lse, return_lse, attention_probs(q, k, is_causal, options)
                                                 if return_attn_probs else None))

    @staticmethod
    def backward(ctx, do, *_unused):
        q, k, v, o, lse = ctx.saved_tensors
        grads = _gradients(ctx, do, q, k, v, o, lse)
        return *_no_second_derivative(grads, q, k, v), None, None, None, None, None


def _as_4d(x: torch.Tensor) -> torch.Tensor:
    """(..., H, N, D) -> (B, H, N, D), merging extra leading dims into B; (N, D) and (B, N, D) get H = 1."""
    if x.dim() == 2:
        return x[None, None]
    if x.dim() == 3:
        return x[:, None]
    if x.dim() == 4:
        return x
    return x.reshape(-1, *x.shape[-3:])


class FlashAttentionTriton(torch.autograd.Function):
    """FlashAttention-2 in Triton, forward and backward: the article's interface.

    `FlashAttentionTriton.apply(Q, K, V, is_causal=False, scale=None, return_lse=False, window_size=(-1, -1),
    softcap=0.0, alibi_slopes=None, dropout_p=0.0, return_attn_probs=False)` returns O, or `(O, L)` with
    `return_lse=True` (L carries no gradient); the rest as in `flash_attention`. Q: (..., Nq, d), K and V:
    (..., Nk, d), with equal leading dims except that a 4-D (or larger) input may have fewer key/value
    heads (dim -3) than query heads (GQA). O: like Q; L: Q.shape[:-1], float32, natural log. Saves exactly
    `Q, K, V, O, L`.
    """

    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False, scale=None, return_lse=False, window_size=NO_WINDOW,
                softcap=0.0, alibi_slopes=None, dropout_p=0.0, return_attn_probs=False):
        check_inputs(Q, K, V, is_causal=is_causal)
        options = checked_options(Q, scale, window_size, softcap, alibi_slopes, dropout_p)
        Q, K, V = (last_dim_contiguous(x) for x in (Q, K, V))
        q4 = _as_4d(Q)
        o4, lse4 = _forward(ctx, q4, _as_4d(K), _as_4d(V), is_causal, options, None)
        O, L = o4.view(Q.shape), lse4.view(Q.shape[:-1])
        ctx.save_for_backward(Q, K, V, O, L)
        return _differentiable_in_o(ctx, outputs(O, L, return_lse, attention_probs(q4, _as_4d(K), is_causal, options)
                                                 if return_attn_probs else None))

    @staticmethod
    def backward(ctx, dO, *_unused_dL):
        Q, K, V, O, L = ctx.saved_tensors
        q4 = _as_4d(Q)
        grads = _gradients(ctx, _as_4d(dO), q4, _as_4d(K), _as_4d(V), _as_4d(O), L.view(q4.shape[:-1]))
        grads = [None if g is None else g.view(x.shape) for g, x in zip(grads, (Q, K, V), strict=True)]
        return *_no_second_derivative(grads, Q, K, V), *(None,) * 8


def _packed_as_4d(x: torch.Tensor) -> torch.Tensor:
    """(total, H, D) -> the (1, H, total, D) view the launchers take (launch.Varlen)."""
    return x.permute(1, 0, 2)[None]


class FlashAttentionVarlen(torch.autograd.Function):
    """`FlashAttentionVarlen.apply(q, k, v, varlen, is_causal, options, return_lse)` on a checked packed
    batch: q (total_q, Hq, D), k and v (total_k, Hkv, D) with unit-stride last dims, `varlen` a
    launch.Varlen and `options` from `checked_options`; returns o (total_q, Hq, D), and with return_lse
    also lse (Hq, total_q), float32 (no gradient). Saves exactly q, k, v, o, lse."""

    @staticmethod
    def forward(ctx, q, k, v, varlen, is_causal, options, return_lse=False):
        o4, lse4 = _forward(ctx, _packed_as_4d(q), _packed_as_4d(k), _packed_as_4d(v), is_causal, options, None,
                            varlen)
        o, lse = o4[0].permute(1, 0, 2), lse4[0]
        ctx.save_for_backward(q, k, v, o, lse)
        if return_lse:
            ctx.mark_non_differentiable(lse)
            return o, lse
        return o

    @staticmethod
    def backward(ctx, do, *_unused_dlse):
        q, k, v, o, lse = ctx.saved_tensors
        grads = _gradients(ctx, _packed_as_4d(do), *(_packed_as_4d(x) for x in (q, k, v, o)), lse[None])
        grads = [None if g is None else g[0].permute(1, 0, 2) for g in grads]
        return *_no_second_derivative(grads, q, k, v), None, None, None, None


class _NoSecondDerivative(torch.autograd.Function):
    """Passes first-order gradients through; differentiating them again raises. The kernels' gradients
    carry no graph, so without this a double backward would fail with an unrelated-looking message."""

    @staticmethod
    def forward(ctx, anchors, *tensors):  # `anchors` inputs tie the outputs to the graph; the rest pass
        return tuple(g.view_as(g) for g in tensors[anchors:])

    @staticmethod
    def backward(ctx, *_):
        raise NotImplementedError(
            "flash_attention has no second derivative (double backward): compute its gradients without "
            "create_graph=True, or use flashtriton.attention_ref (plain attention) where a second "
            "derivative is needed")


def _no_second_derivative(grads: list, *inputs: torch.Tensor) -> list:
    """`grads` as they are, unless the backward runs with create_graph=True: then tied to the inputs
    through _NoSecondDerivative, so that a second derivative is a clear error."""
    anchors = [x for x in inputs if x.requires_grad]
    if not torch.is_grad_enabled() or not anchors or all(g is None for g in grads):
        return grads
    present = [g for g in grads if g is not None]
    tied = iter(_NoSecondDerivative.apply(len(anchors), *anchors, *present))
    return [None if g is None else next(tied) for g in grads]
