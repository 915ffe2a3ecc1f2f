"""The public functional API: check the inputs, then run the autograd layer (autograd.py), or, with
nothing to differentiate, the forward's launcher alone."""

from __future__ import annotations

import torch

from .autograd import FlashAttention, FlashAttentionVarlen, checked_options, outputs
from .launch import Varlen, attention_forward, attention_probs
from .validation import check_flags, check_inputs, check_varlen, last_dim_contiguous


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    return_attn_probs: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Exact softmax attention, `softmax(q @ k^T * scale) @ v`, without materialising the scores.

    Args:
        q: (B, Hq, Nq, D) queries.
        k: (B, Hkv, Nk, D) keys; Hq must be a multiple of Hkv (Hkv < Hq is grouped-query attention:
            query head h uses key/value head h // (Hq // Hkv)).
        v: (B, Hkv, Nk, D) values.
        is_causal: mask aligned to the bottom-right corner, as in flash_attn >= 2.1: query i sees key j
            iff j <= i + Nk - Nq. With Nq > Nk the first Nq - Nk queries see no key; their output is 0::

                Nq = 2, Nk = 4      Nq = 4, Nk = 2
                q0  x x x .         q0  . .
                q1  x x x x         q1  . .
                                    q2  x .
                                    q3  x x

        scale: softmax scale; defaults to 1 / sqrt(D).
        return_lse: also return the logsumexp of each query row's scaled scores.
        window_size: (left, right) sliding window, aligned like the causal mask: query i sees key j iff
            i + Nk - Nq - left <= j <= i + Nk - Nq + right; -1 leaves a side unbounded. With is_causal
            the band is the intersection (right becomes 0). Key tiles outside the band are skipped::

                Nq = Nk = 5, window_size=(2, 0)     Nq = Nk = 5, window_size=(1, 1)
                q0  x . . . .                       q0  x x . . .
                q1  x x . . .                       q1  x x x . .
                q2  x x x . .                       q2  . x x x .
                q3  . x x x .                       q3  . . x x x
                q4  . . x x x                       q4  . . . x x

        softcap: > 0 replaces each scaled score s by softcap * tanh(s / softcap) (Gemma 2, Grok), with its
            exact gradient; 0 turns it off.
        alibi_slopes: float32 (Hq,) or (B, Hq): ALiBi, each score (i, j) of query head h gets
            -slope[h] * |i + Nk - Nq - j| (after the softcap). The slopes carry no gradient.
        dropout_p: in [0, 1): each attention probability is dropped with this probability and the kept
            ones scaled by 1 / (1 - dropout_p), as nn.functional.dropout would on the softmax. The mask comes
            from Philox in the kernels, keyed by a draw from torch's generator for q's device (so
            torch.manual_seed reproduces a run); the backward regenerates it.
        return_attn_probs: also return the (B, Hq, Nq, Nk) float32 probabilities after dropout (0 where
            dropped): a testing aid that materialises them, for small sizes only.

    Returns:
        o: (B, Hq, Nq, D), q's dtype; and with `return_lse`, lse: (B, Hq, Nq) float32, natural log,
        -inf for rows that see no key; and with `return_attn_probs`, the probabilities, last.

    q, k and v must share a dtype (float16, bfloat16 or float32) and a device, and have head dims up to
    256. float32 dot products use TF32 when PyTorch's float32 matmuls do
    (`torch.backends.cuda.matmul.fp32_precision`, or the legacy `allow_tf32`). Any strides work; a tensor
    whose last dim is not contiguous is copied once. The flash_attn layout (B, N, H, D) is supported
    without a copy by passing `x.transpose(1, 2)`. Differentiable in q, k and v; the backward is
    deterministic.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if isinstance(x, torch.Tensor) and x.dim() != 4:
            raise ValueError(
                f"{name} must have 4 dims (batch, heads, seqlen, head_dim), got shape {tuple(x.shape)}; "
                "for the flash_attn layout (batch, seqlen, heads, head_dim) pass x.transpose(1, 2)")
    check_flags(return_lse=return_lse, return_attn_probs=return_attn_probs)
    check_inputs(q, k, v, is_causal=is_causal)
    options = checked_options(q, scale, window_size, softcap, alibi_slopes, dropout_p)
    q, k, v = last_dim_contiguous(q), last_dim_contiguous(k), last_dim_contiguous(v)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return FlashAttention.apply(q, k, v, is_causal, options, return_lse, return_attn_probs)
    # Nothing to differentiate: skip the autograd machinery, which costs the host about as much as the checks.
    o, lse = attention_forward(q, k, v, is_causal, **options)
    return outputs(o, lse, return_lse, attention_probs(q, k, is_causal, options) if return_attn_probs else None)


def flash_attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`flash_attention` on a packed batch of variable-length sequences, as flash_attn's varlen API lays
    it out: no padding, each sequence attends only within itself.

    Args:
        q: (total_q, Hq, D), the batch's queries one sequence after another.
        k, v: (total_k, Hkv, D); Hq a multiple of Hkv (GQA).
        cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,) on q's device, the cumulative lengths: sequence b
            is rows cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q and cu_seqlens_k[b]:cu_seqlens_k[b + 1] of k
            and v. Zero-length sequences are allowed.
        max_seqlen_q, max_seqlen_k: the longest sequence's lengths (they size the grid).
        is_causal, scale, window_size, softcap, alibi_slopes, dropout_p: as in `flash_attention`, per
            sequence (masks aligned to each sequence's bottom-right corner; ALiBi slopes (Hq,) or
            (batch, Hq)).
        return_lse: also return the logsumexp, (Hq, total_q) float32.

    Returns:
        o: (total_q, Hq, D); with `return_lse`, (o, lse). The lengths are checked on the host, so that a
        wrong length is an error rather than silent garbage: one small copy of each cu_seqlens tensor,
        remembered while that tensor lives and is not written in place through torch (its version
        counter), so that later calls with it do not wait for the GPU. Inside CUDA graph capture, where
        no copy to the host is allowed, only their dtype, shape and device are checked.
    """
    check_flags(return_lse=return_lse)
    check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=is_causal)
    options = checked_options(q, scale, window_size, softcap, alibi_slopes, dropout_p, batch=len(cu_seqlens_q) - 1)
    # The kernels index cu_seqlens with unit stride: a strided view is copied (once, a few bytes).
    varlen = Varlen(cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), int(max_seqlen_q), int(max_seqlen_k))
    q, k, v = last_dim_contiguous(q), last_dim_contiguous(k), last_dim_contiguous(v)
    return FlashAttentionVarlen.apply(q, k, v, varlen, is_causal, options, return_lse)
