"""The public functional API: check the inputs, then run the custom ops (ops.py), which carry the
autograd and torch.compile support, over the launchers (launch/).

- `flash_attention`: (B, H, N, D) tensors.
- `flash_attention_varlen`: a packed batch (total, H, D), as flash_attn's varlen API lays it out.
- `flash_attention_fp8`: float8 e4m3 inputs with descale factors, forward only.
- `FlashAttentionTriton.apply`: the article's interface on (..., N, d), over `flash_attention`.

Everything here runs inside torch.compile's trace too: the checks read shapes, dtypes and flags only
(never tensor values while compiling), so a compiled call guards on what the eager one checks.
"""

from __future__ import annotations

import math

import torch

from . import ops
from .launch import new_dropout_seed
from .launch.gluon_forward import (
    FP8_DEFAULT_OPTIONS,
    FP8_WITHOUT_LSE_OPTIONS,
    fp8_forward_gluon,
    fp8_gluon_selected,
)
from .validation import (
    FP8_OUT_DTYPES,
    check_alibi_slopes,
    check_descale,
    check_dropout,
    check_flags,
    check_inputs,
    check_scale,
    check_softcap,
    check_varlen,
    check_window,
    host_reads_forbidden,
    last_dim_contiguous,
)

NO_WINDOW = (-1, -1)


def op_options(q: torch.Tensor, scale, window_size, softcap, alibi_slopes, dropout_p,
               batch: int | None = None) -> tuple:
    """The public keywords, checked, as the ops' arguments (scale, window_left, window_right, softcap,
    alibi_slopes, dropout_p, dropout_seed). With dropout, the call's Philox key is drawn here, once for
    its forward and backward. `batch` is the number of sequences of a packed q."""
    window = NO_WINDOW if window_size == NO_WINDOW else check_window(window_size)
    softcap = 0.0 if softcap == 0.0 else check_softcap(softcap)
    if alibi_slopes is not None:
        alibi_slopes = check_alibi_slopes(alibi_slopes, q, batch=batch)
    seed = None
    if dropout_p != 0.0:
        dropout_p = check_dropout(dropout_p)
        seed = new_dropout_seed(q.device)
    return check_scale(scale, q.shape[-1]), *window, softcap, alibi_slopes, float(dropout_p), seed


def attention_probs(q: torch.Tensor, k: torch.Tensor, is_causal: bool, options: tuple) -> torch.Tensor:
    """The (B, Hq, Nq, Nk) float32 probabilities a call on 4-D q, k used (after dropout and its
    1 / (1 - p) scaling, 0 where dropped), recomputed with the reference and the kernels' dropout mask.
    `options`: the call's `op_options`."""
    from .reference import attention_ref
    scale, window_left, window_right, softcap, alibi_slopes, dropout_p, seed = options
    q, k = q.float(), k.float()
    keep = None if dropout_p == 0 else ops.dropout_keep(seed, q.shape[0], q.shape[1], q.shape[2], k.shape[2],
                                                        dropout_p)
    _, _, probs = attention_ref(q, k, k, is_causal=is_causal, scale=scale, upcast=False,
                                window_size=(window_left, window_right), softcap=softcap, alibi_slopes=alibi_slopes,
                                dropout_p=dropout_p, dropout_mask=keep, return_probs=True)
    return probs


def outputs(o: torch.Tensor, lse: torch.Tensor, return_lse: bool, probs: torch.Tensor | None):
    """o, or the tuple (o, lse if asked for, the probabilities if asked for)."""
    if not return_lse and probs is None:
        return o
    return (o, *((lse,) if return_lse else ()), *((probs,) if probs is not None else ()))


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
    deterministic: bool = False,
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
        deterministic: a bitwise reproducible backward. Without it (and outside
            torch.use_deterministic_algorithms), where the Gluon backward runs (sm_90, D = 64 and 128; see
            launch/gluon_backward.py) dQ is added up by atomic reductions, whose order varies; the Triton
            backward is deterministic either way.

    Returns:
        o: (B, Hq, Nq, D), q's dtype; and with `return_lse`, lse: (B, Hq, Nq) float32, natural log,
        -inf for rows that see no key; and with `return_attn_probs`, the probabilities, last.

    q, k and v must share a dtype (float16, bfloat16 or float32) and a device, and have head dims up to
    256. float32 dot products use TF32 when PyTorch's float32 matmuls do
    (`torch.backends.cuda.matmul.fp32_precision`, or the legacy `allow_tf32`). Any strides work; a tensor
    whose last dim is not contiguous is copied once. The flash_attn layout (B, N, H, D) is supported
    without a copy by passing `x.transpose(1, 2)`. Differentiable in q, k and v.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if isinstance(x, torch.Tensor) and x.dim() != 4:
            raise ValueError(
                f"{name} must have 4 dims (batch, heads, seqlen, head_dim), got shape {tuple(x.shape)}; "
                "for the flash_attn layout (batch, seqlen, heads, head_dim) pass x.transpose(1, 2)")
    check_flags(return_lse=return_lse, return_attn_probs=return_attn_probs, deterministic=deterministic)
    check_inputs(q, k, v, is_causal=is_causal)
    options = op_options(q, scale, window_size, softcap, alibi_slopes, dropout_p)
    q, k, v = last_dim_contiguous(q), last_dim_contiguous(k), last_dim_contiguous(v)
    o, lse = ops.attention(q, k, v, None, None, 0, 0, is_causal, *options, deterministic=deterministic)
    return outputs(o, lse, return_lse, attention_probs(q, k, is_causal, options) if return_attn_probs else None)


def flash_attention_fp8(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """FP8 attention, forward only (inference), as FlashAttention-3's: q, k and v quantized to float8 e4m3,
    each with a descale factor, so that the attention computed is that of q * q_descale, k * k_descale and
    v * v_descale.

    Args:
        q: (B, Hq, Nq, D), k and v: (B, Hkv, Nk, D), torch.float8_e4m3fn; Hq a multiple of Hkv.
        is_causal, scale: as in `flash_attention` (the scale applies to the descaled scores).
        q_descale, k_descale, v_descale: float32, one element (per tensor) or (B, Hkv) (per batch and KV
            head; q's per the KV head its query head reads); None is 1.
        out_dtype: bfloat16 or float16, the output's.
        return_lse: also return the logsumexp (B, Hq, Nq) float32.

    Returns:
        o: (B, Hq, Nq, D) in out_dtype, laid out like q; with `return_lse`, (o, lse).

    On an sm_90 GPU with D = 64, 128 or 256 (D = 256 run on an H100 only) and
    TMA-aligned strides (launch/gluon_forward.py: fp8_gluon_selected; FLASHTRITON_FORWARD=triton turns it
    off), the Gluon kernel runs with its products in FP8 (wgmma's e4m3 form; the probabilities rounded to
    e4m3 for P V, as FlashAttention-3 does). Without `return_lse` the rows' sums come from the tensor cores
    too (FP8_WITHOUT_LSE_OPTIONS: O as accurate, the kernel faster; L, not returned, less accurate). The
    kernel reads V with its keys contiguous (8-bit wgmma reduces over a contiguous dim), so a row-major v is
    copied into that layout first, 5-8% of the call at 4096 keys. A v whose keys are already contiguous,
    FlashAttention-3's column-major V (e.g. `v_t.transpose(2, 3)` of a (B, Hkv, D, Nk) tensor, as a KV
    cache can keep it), is read as it is where k is (B, Hkv, Nk, D) or (B, Nk, Hkv, D) in memory order and
    Nk is a multiple of 16 (launch/gluon_forward.py, interleaved_keys_map); elsewhere it is copied too.
    Where that kernel does not run, `flash_attention` does, in bf16 on the e4m3 values as they are (exact
    in bf16): q's and k's descales folded into the scale when they are one element each (read on the
    host), else (per-head factors, a CUDA graph being captured, torch.compile tracing) multiplying q or k
    on the device (one bf16 rounding); v's multiply O. The same attention, P rounded to bf16 rather than
    e4m3. No backward: the outputs carry no gradient.
    """
    check_inputs(q, k, v, is_causal=is_causal, fp8=True)
    check_flags(return_lse=return_lse)
    if q.dim() != 4:
        raise ValueError(f"flash_attention_fp8 takes (batch, heads, seqlen, head_dim) tensors, got q of shape "
                         f"{tuple(q.shape)}")
    if out_dtype not in FP8_OUT_DTYPES:
        raise ValueError(f"out_dtype must be torch.bfloat16 or torch.float16, got {out_dtype}")
    batch, heads_kv = k.shape[0], k.shape[1]
    for name, descale in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        check_descale(name, descale, q, heads_kv)
    scale = check_scale(scale, q.shape[-1])
    descale = descale_table((q_descale, k_descale, v_descale), batch, heads_kv, q.device)
    if fp8_gluon_selected(q, k, v):
        options = FP8_DEFAULT_OPTIONS if return_lse else FP8_WITHOUT_LSE_OPTIONS
        o, lse = fp8_forward_gluon(q, k, v, is_causal, scale, descale, out_dtype, options)
    else:
        o, lse = _fp8_without_its_kernel(q, k, v, is_causal, scale, (q_descale, k_descale), descale, out_dtype)
    return (o, lse) if return_lse else o


@torch.no_grad()  # (the outputs carry no gradient: nothing is kept for a backward, conversions included)
def _fp8_without_its_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: float,
                            qk_factors: tuple, descale: torch.Tensor, out_dtype: torch.dtype
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """flash_attention_fp8 where the FP8 kernel does not run, through flash_attention in bf16: (o, lse).
    Every e4m3 value is exact in bf16 (3 mantissa bits, exponents within bf16's), so the inputs go to bf16
    as they are. When q's and k's descales (`qk_factors`) are one number each and the host may read them
    (no CUDA graph being captured, no torch.compile tracing), their product folds into the softmax scale:
    the scores are the FP8 values' exact products, and the read costs less than a pass over q or k
    (docs/performance.md, entry 141). Elsewhere (factors per (batch, KV head), capture, tracing) the product
    multiplies the bf16 copy of whichever of q and k has fewer elements, on the device, rounded once to
    bf16. V's factors (`descale[2]`) multiply O."""
    bf16 = torch.bfloat16
    group = q.shape[1] // k.shape[1]
    q16, k16, v16 = q.to(bf16), k.to(bf16), v.to(bf16)
    scalars = all(d is None or d.numel() == 1 for d in qk_factors)
    folded = 0.0
    if scalars and not host_reads_forbidden(q.device):
        folded = scale * (descale[0, 0, 0] * descale[1, 0, 0]).item()
    if math.isfinite(folded) and folded > 0:  # (a zero, negative or infinite factor: applied as given, below)
        scale = folded
    else:
        product = (descale[0] * descale[1])[:, :, None, None]  # (B, Hkv, 1, 1)
        if q.numel() < k.numel():
            q16.mul_(product.repeat_interleave(group, dim=1))  # each query head by its KV head's factor
        else:
            k16.mul_(product)
    o, lse = flash_attention(q16, k16, v16, is_causal=is_causal, scale=scale, return_lse=True)
    v_factors = descale[2].repeat_interleave(group, dim=1)[:, :, None, None]  # (B, Hq): each head's KV head's
    if out_dtype == bf16:  # in place: a bf16 product is taken in float32 and rounded once, as below
        return o.mul_(v_factors), lse
    return (o.float() * v_factors).to(out_dtype), lse


def descale_table(factors: tuple, batch: int, heads_kv: int, device) -> torch.Tensor:
    """FP8 descale factors as one float32 (len(factors), B, Hkv) tensor, each None (1), one element
    (broadcast) or (B, Hkv): one stack (a kernel or two per call, where a fill per factor cost up to 60 µs
    in launches on the H200)."""
    one = torch.ones(1, device=device) if any(f is None for f in factors) else None
    return torch.stack([(one if f is None else f).reshape(-1).expand(batch * heads_kv) for f in factors]
                       ).view(len(factors), batch, heads_kv)


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
    deterministic: bool = False,
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
        is_causal, scale, window_size, softcap, alibi_slopes, dropout_p, deterministic: as in `flash_attention`, per
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
    check_flags(return_lse=return_lse, deterministic=deterministic)
    check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=is_causal)
    options = op_options(q, scale, window_size, softcap, alibi_slopes, dropout_p, batch=len(cu_seqlens_q) - 1)
    q, k, v = last_dim_contiguous(q), last_dim_contiguous(k), last_dim_contiguous(v)
    # The kernels index cu_seqlens with unit stride: a strided view is copied (once, a few bytes).
    o, lse = ops.attention(q, k, v, cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), max_seqlen_q, max_seqlen_k,
                           is_causal, *options, deterministic=deterministic)
    return (o, lse) if return_lse else o


def _as_4d(x: torch.Tensor) -> torch.Tensor:
    """(..., H, N, D) -> (B, H, N, D), merging extra leading dims into B; (N, D) and (B, N, D) get H = 1."""
    if x.dim() == 2:
        return x[None, None]
    if x.dim() == 3:
        return x[:, None]
    if x.dim() == 4:
        return x
    return x.reshape(-1, *x.shape[-3:])


class FlashAttentionTriton:
    """FlashAttention-2 in Triton, forward and backward: the article's interface.

    `FlashAttentionTriton.apply(Q, K, V, is_causal=False, scale=None, return_lse=False, window_size=(-1, -1),
    softcap=0.0, alibi_slopes=None, dropout_p=0.0, return_attn_probs=False)` returns O, or `(O, L)` with
    `return_lse=True` (L carries no gradient); the rest as in `flash_attention`. Q: (..., Nq, d), K and V:
    (..., Nk, d), with equal leading dims except that a 4-D (or larger) input may have fewer key/value
    heads (dim -3) than query heads (GQA). O: like Q; L: Q.shape[:-1], float32, natural log. The backward
    saves exactly `Q, K, V, O, L` (as views of the 4-D tensors the kernels take).
    """

    @staticmethod
    def apply(Q, K, V, is_causal=False, scale=None, return_lse=False, window_size=NO_WINDOW, softcap=0.0,
              alibi_slopes=None, dropout_p=0.0, return_attn_probs=False):
        check_flags(return_lse=return_lse, return_attn_probs=return_attn_probs)
        check_inputs(Q, K, V, is_causal=is_causal)
        options = op_options(Q, scale, window_size, softcap, alibi_slopes, dropout_p)
        q4, k4, v4 = (_as_4d(last_dim_contiguous(x)) for x in (Q, K, V))
        o4, lse4 = ops.attention(q4, k4, v4, None, None, 0, 0, is_causal, *options)
        O, L = o4.view(Q.shape), lse4.view(Q.shape[:-1])
        return outputs(O, L, return_lse, attention_probs(q4, k4, is_causal, options) if return_attn_probs else None)
