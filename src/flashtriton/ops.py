"""The custom operators: the forward, the backward and dropout's mask as `torch.library` ops, with fake
(meta) implementations and autograd registered on them. `torch.compile` sees each call as one node
whose output shapes, dtypes and strides it knows without running it, so it traces through the public
API with no graph break; CUDA graphs capture the kernels the op launches.

    flashtriton::forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal,
                         scale, window_left, window_right, softcap, alibi_slopes, dropout_p,
                         dropout_seed) -> (o, lse)
    flashtriton::backward(do, q, k, v, o, lse, <the forward's arguments after v>, need_dq,
                          need_dkdv) -> (dq, dk, dv)
    flashtriton::dropout_mask(seed, batch, heads, seqlen_q, seqlen_k, dropout_p) -> keep
    flashtriton::decode(q, k_cache, v_cache, cache_seqlens, cache_seqlen, block_table, cache_batch_idx,
                        cache_leftpad, is_causal, scale, window_left, window_right, softcap, alibi_slopes,
                        num_splits, k_descale, v_descale) -> (o, lse)

A call is dense when cu_seqlens_q is None: q (B, Hq, Nq, D), k and v (B, Hkv, Nk, D), lse (B, Hq, Nq),
and max_seqlen_* are ignored. Otherwise it is a packed batch: q (total_q, Hq, D), k and v (total_k,
Hkv, D), lse (Hq, total_q). The arguments are those the public API checked (api.py); the ops check
nothing again.

The ops are defined through `torch.library.Library`, not `torch.library.custom_op` (the same schemas).
custom_op wraps each implementation in Python (an aliasing check of the outputs on every call), which
cost a compiled forward + backward ~40 µs more per call in a CPU measurement (docs/performance.md entry
43); the fake implementations and autograd are registered the same way either way. Nor are they
`triton_op`s with `wrap_triton`. A triton_op's body is traced so that Inductor can call the Triton
kernels from its own generated code. Our launchers do things no
trace can hold: they replay recorded launch plans through the compiled kernels' own launchers, run
Triton's autotuner with TMA descriptors whose boxes each candidate sets, and read cu_seqlens back
once per tensor. Inductor cannot fuse its own code into a user's Triton kernel either way, so a
triton_op would only save the dispatcher's few microseconds per call, and `mode="reduce-overhead"`
(CUDA graphs) removes those too.

Only traced calls need the ops. Eager calls (`attention`) run the same implementations directly, under a
torch.autograd.Function with the same saved tensors and gradients: the op's own Python autograd layer
cost the H200's host ~150 µs more per call (docs/performance.md, "torch.compile and the custom ops").
"""

from __future__ import annotations

import torch
from torch import Tensor

from .launch import (
    Varlen,
    attention_backward,
    attention_decode,
    attention_forward,
    dropout_mask,
    empty_in_order,
    forward_outputs,
    gradient_outputs,
)

NAMESPACE = "flashtriton"
# The registry of the ops below; registrations live as long as it does.
_LIBRARY = torch.library.Library(NAMESPACE, "DEF")


def _define(name: str, impl, fake):
    """Define flashtriton::<name>, its schema read from `impl`'s type hints as custom_op reads them, with
    one implementation for every device (the launchers dispatch on the tensors' device themselves) and
    its fake implementation; returns the op's overload."""
    _LIBRARY.define(name + torch.library.infer_schema(impl, mutates_args=()))
    _LIBRARY.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_LIBRARY)
    return getattr(getattr(torch.ops, NAMESPACE), name).default


def _packed_as_4d(x: Tensor) -> Tensor:
    """(total, H, D) -> the (1, H, total, D) view the launchers take for a packed batch (launch.Varlen)."""
    return x.permute(1, 0, 2)[None]


def _unpacked(x4: Tensor) -> Tensor:
    """The launchers' (1, H, total, D) or (1, H, total) result, back in the packed layout."""
    return x4[0].permute(1, 0, 2) if x4.dim() == 4 else x4[0]


def _launch_kwargs(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale, window_left,
                   window_right, softcap, alibi_slopes, dropout_p, dropout_seed) -> dict:
    """The op's arguments after the tensors, as the launchers' keywords."""
    varlen = None if cu_seqlens_q is None else Varlen(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    return dict(is_causal=is_causal, scale=scale, window=(window_left, window_right), softcap=softcap,
                alibi_slopes=alibi_slopes, dropout_p=dropout_p, dropout_seed=dropout_seed, varlen=varlen)


def forward_impl(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor | None, cu_seqlens_k: Tensor | None,
                 max_seqlen_q: int, max_seqlen_k: int, is_causal: bool, scale: float, window_left: int,
                 window_right: int, softcap: float, alibi_slopes: Tensor | None, dropout_p: float,
                 dropout_seed: Tensor | None, deterministic: bool) -> tuple[Tensor, Tensor]:
    # (`deterministic` is the backward's: kept with the call's other options for it)
    kwargs = _launch_kwargs(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale, window_left,
                            window_right, softcap, alibi_slopes, dropout_p, dropout_seed)
    if cu_seqlens_q is None:
        return attention_forward(q, k, v, **kwargs)
    o4, lse4 = attention_forward(_packed_as_4d(q), _packed_as_4d(k), _packed_as_4d(v), **kwargs)
    return _unpacked(o4), lse4[0]


def _forward_fake(q, k, v, cu_seqlens_q, *_):
    # The launcher's own allocation, so that the strides are exactly those a real call returns.
    if cu_seqlens_q is None:
        return forward_outputs(q, packed=False)
    o4, lse4 = forward_outputs(_packed_as_4d(q), packed=True)
    return _unpacked(o4), lse4[0]


forward = _define("forward", forward_impl, _forward_fake)


def backward_impl(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, cu_seqlens_q: Tensor | None,
                  cu_seqlens_k: Tensor | None, max_seqlen_q: int, max_seqlen_k: int, is_causal: bool, scale: float,
                  window_left: int, window_right: int, softcap: float, alibi_slopes: Tensor | None, dropout_p: float,
                  dropout_seed: Tensor | None, deterministic: bool, need_dq: bool,
                  need_dkdv: bool) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv; a gradient not asked for (need_dq, need_dkdv) comes back as an empty (0,) tensor,
    since an op returns tensors only. `deterministic`: as attention_backward's."""
    kwargs = _launch_kwargs(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale, window_left,
                            window_right, softcap, alibi_slopes, dropout_p, dropout_seed)
    needs = (need_dq, need_dkdv, need_dkdv)
    if cu_seqlens_q is None:
        grads = attention_backward(do, q, k, v, o, lse, **kwargs, needs=needs, deterministic=deterministic)
    else:
        grads = attention_backward(*(_packed_as_4d(x) for x in (do, q, k, v, o)), lse[None], **kwargs, needs=needs,
                                   deterministic=deterministic)
        grads = tuple(None if g is None else _unpacked(g) for g in grads)
    return tuple(q.new_empty(0) if g is None else g for g in grads)


def _backward_fake(do, q, k, v, o, lse, cu_seqlens_q, *args):
    need_dq, need_dkdv = args[-2:]
    packed = cu_seqlens_q is not None
    grads = gradient_outputs(*((_packed_as_4d(x) for x in (q, k, v)) if packed else (q, k, v)))
    grads = tuple(_unpacked(g) for g in grads) if packed else grads
    return tuple(g if need else q.new_empty(0) for g, need in zip(grads, (need_dq, need_dkdv, need_dkdv), strict=True))


backward = _define("backward", backward_impl, _backward_fake)


def _setup_forward(ctx, inputs, output) -> None:
    q, k, v, cu_q, cu_k, max_q, max_k, is_causal, scale, window_left, window_right, softcap, alibi_slopes, \
        dropout_p, dropout_seed, deterministic = inputs
    o, lse = output
    optional = (cu_q, cu_k, alibi_slopes, dropout_seed)
    # Exactly Q, K, V, O, L, and the variants' tensors only where they are on.
    ctx.save_for_backward(q, k, v, o, lse, *(t for t in optional if t is not None))
    ctx.present = tuple(t is not None for t in optional)
    ctx.scalars = (max_q, max_k, is_causal, scale, window_left, window_right, softcap, dropout_p, deterministic)
    ctx.mark_non_differentiable(lse)


def _gradients(ctx, do, run_backward) -> tuple:
    """The forward's inputs' gradients (None for what autograd does not want), through `run_backward`:
    the backward op, or its implementation."""
    q, k, v, o, lse, *saved = ctx.saved_tensors
    saved = iter(saved)
    cu_q, cu_k, alibi_slopes, dropout_seed = (next(saved) if present else None for present in ctx.present)
    max_q, max_k, is_causal, scale, window_left, window_right, softcap, dropout_p, deterministic = ctx.scalars
    need_dq, need_dk, need_dv = ctx.needs_input_grad[:3]
    dq, dk, dv = run_backward(do, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, is_causal, scale, window_left,
                              window_right, softcap, alibi_slopes, dropout_p, dropout_seed, deterministic, need_dq,
                              need_dk or need_dv)
    return (dq if need_dq else None, dk if need_dk else None, dv if need_dv else None, *(None,) * 13)


def _backward_of_forward(ctx, do, _dlse):
    return _gradients(ctx, do, backward)


def _setup_backward(ctx, inputs, output) -> None:
    pass


def _no_second_derivative(ctx, *_):
    raise NotImplementedError(
        "flash_attention has no second derivative (double backward): compute its gradients without "
        "create_graph=True, or use flashtriton.attention_ref (plain attention) where a second derivative is "
        "needed")


torch.library.register_autograd(f"{NAMESPACE}::forward", _backward_of_forward, setup_context=_setup_forward,
                                lib=_LIBRARY)
torch.library.register_autograd(f"{NAMESPACE}::backward", _no_second_derivative, setup_context=_setup_backward,
                                lib=_LIBRARY)


def _dropout_keep(seed: Tensor, batch: int, heads: int, seqlen_q: int, seqlen_k: int, dropout_p: float) -> Tensor:
    return dropout_mask(seed, batch, heads, seqlen_q, seqlen_k, dropout_p)


def _dropout_keep_fake(seed, batch, heads, seqlen_q, seqlen_k, dropout_p):
    return seed.new_empty((batch, heads, seqlen_q, seqlen_k), dtype=torch.bool)


# The boolean (batch, heads, seqlen_q, seqlen_k) mask of the probabilities a call kept (launch.dropout_mask).
dropout_keep = _define("dropout_mask", _dropout_keep, _dropout_keep_fake)


class _EagerAttention(torch.autograd.Function):
    """The forward op's autograd for eager calls, with the same context and gradients. Measured on the
    H200's host (benchmarks/host_per_call.py), the op's Python autograd layer cost a small forward
    with gradients ~150 µs more than a torch.autograd.Function; only torch.compile needs the op.
    `_EagerAttention.apply(*the forward op's arguments) -> (o, lse)`."""

    @staticmethod
    def forward(ctx, *inputs):
        output = forward_impl(*inputs)
        _setup_forward(ctx, inputs, output)
        return output

    @staticmethod
    def backward(ctx, do, _dlse):
        # With create_graph=True, through the op, whose own autograd makes a second derivative a clear error.
        return _gradients(ctx, do, backward if torch.is_grad_enabled() else backward_impl)


def attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor | None, cu_seqlens_k: Tensor | None,
              max_seqlen_q: int, max_seqlen_k: int, is_causal: bool, *options,
              deterministic: bool = False) -> tuple[Tensor, Tensor]:
    """(o, lse): through the forward op while torch.compile traces; outside it, through the same
    implementation and autograd without the op's dispatch (_EagerAttention), or with nothing to
    differentiate, through the implementation alone. `options`: (scale, window_left, window_right,
    softcap, alibi_slopes, dropout_p, dropout_seed); `deterministic`: the backward's (attention_backward)."""
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, *options, deterministic)
    if torch.compiler.is_compiling():
        return forward(*args)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _EagerAttention.apply(*args)
    return forward_impl(*args)


def _decode_impl(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor | None, cache_seqlen: int,
                 block_table: Tensor | None, cache_batch_idx: Tensor | None, cache_leftpad: Tensor | None,
                 is_causal: bool, scale: float, window_left: int, window_right: int, softcap: float,
                 alibi_slopes: Tensor | None, num_splits: int, k_descale: Tensor | None,
                 v_descale: Tensor | None) -> tuple[Tensor, Tensor]:
    return attention_decode(q, k_cache, v_cache, cache_seqlen if cache_seqlens is None else cache_seqlens, scale,
                            is_causal=is_causal, window=(window_left, window_right), softcap=softcap,
                            alibi_slopes=alibi_slopes, block_table=block_table, cache_batch_idx=cache_batch_idx,
                            cache_leftpad=cache_leftpad, num_splits=num_splits, k_descale=k_descale,
                            v_descale=v_descale)


def _decode_fake(q, *_):
    return empty_in_order(q), q.new_empty(q.shape[:3], dtype=torch.float32)


# Attention of q (B, Hq, Nq, D) against a KV cache (launch.attention_decode), forward only: (o, lse).
# cache_seqlens None means every sequence has cache_seqlen keys; k_descale, v_descale: an FP8 cache's factors.
decode = _define("decode", _decode_impl, _decode_fake)

