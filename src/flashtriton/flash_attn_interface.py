"""flash_attn's interface (version 2.8) over flashtriton's kernels, so that code written for flash_attn
switches with one line:

    import flashtriton.flash_attn_interface as flash_attn_interface
    from flashtriton.flash_attn_interface import flash_attn_func, flash_attn_varlen_func

The functions take flash_attn's argument names, defaults and (batch, seqlen, heads, head_dim) layout and
return what it returns. The layout is a transposed view of flashtriton's (B, H, N, D), so nothing is
copied; the output is laid out like q, as flash_attn's is: contiguous for a contiguous q, and for the
slices of a stacked qkv. Differences:

- `deterministic=True` asks for a bitwise reproducible backward, as in flash_attn; so does
  torch.use_deterministic_algorithms. Without either, where the Gluon backward runs (sm_90, D = 128) dQ
  is added up by atomic reductions, as flash_attn's default backward adds it.
- `return_attn_probs=True` returns (out, softmax_lse, probs) where probs are the (B, H, Nq, Nk) float32
  probabilities after dropout, 0 where dropped. flash_attn returns its S_dmask, padded to its tiles,
  with dropped entries negative. Both are testing aids; ours materialises them, so keep it small.
- `flash_attn_with_kvcache` takes contiguous and paged caches, but not rotary embeddings inside the call;
  and, as FlashAttention-3's does, an FP8 cache with `k_descale` and `v_descale` (keywords).
- Not supported, each a NotImplementedError: `block_table` (paged KV) in `flash_attn_varlen_func`, and
  `rotary_cos`/`rotary_sin` in `flash_attn_with_kvcache`.

Masks, as in flash_attn >= 2.1: `causal` aligns to the bottom-right corner (query i sees key j iff
j <= i + Nk - Nq); `window_size=(left, right)` bounds that band, -1 unbounded; with causal, right is 0.
"""

from __future__ import annotations

import torch

from .api import flash_attention, flash_attention_varlen
from .kvcache import flash_attention_with_kvcache
from .validation import check_flags

__all__ = ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
           "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache"]


def _check_layout(name: str, x: object, dims: int, shape: str) -> None:
    if isinstance(x, torch.Tensor) and x.dim() != dims:
        raise ValueError(f"{name} must have {dims} dims {shape} in flash_attn's layout, got shape {tuple(x.shape)}")


def _check_packed(name: str, x: object, dims: int, count: int, shape: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    _check_layout(name, x, dims, shape)
    if x.shape[-3] != count:
        raise ValueError(f"{name} must be {shape}, with {count} at dim {x.dim() - 3}; got shape {tuple(x.shape)}")


def _results(o: torch.Tensor, lse: torch.Tensor, probs: torch.Tensor | None, return_attn_probs: bool):
    return (o, lse, probs) if return_attn_probs else o


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """Attention on q (B, Nq, Hq, D), k and v (B, Nk, Hkv, D); Hq a multiple of Hkv (GQA, MQA).

    Args as flash_attn's: `softmax_scale` defaults to 1 / sqrt(D); `alibi_slopes` float32 (Hq,) or
    (B, Hq), a bias of -slope * |i + Nk - Nq - j|; `softcap` > 0 caps the scores (softcap * tanh(s / softcap)).

    Returns out (B, Nq, Hq, D); with `return_attn_probs`, (out, softmax_lse (B, Hq, Nq) float32, probs).
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_layout(name, x, 4, "(batch, seqlen, heads, head_dim)")
    result = flash_attention(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=causal, scale=softmax_scale,
                             return_lse=True, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                             dropout_p=dropout_p, return_attn_probs=return_attn_probs, deterministic=deterministic)
    o, lse, *probs = result
    return _results(o.transpose(1, 2), lse, probs[0] if probs else None, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """`flash_attn_func` on qkv (B, N, 3, H, D) stacked; returns as it does. The gradient comes back as one
    (B, N, 3, H, D) tensor."""
    _check_packed("qkv", qkv, 5, 3, "(batch, seqlen, 3, heads, head_dim)")
    return flash_attn_func(*qkv.unbind(2), dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """`flash_attn_func` on q (B, Nq, Hq, D) and kv (B, Nk, 2, Hkv, D) stacked; returns as it does."""
    _check_packed("kv", kv, 5, 2, "(batch, seqlen, 2, heads, head_dim)")
    return flash_attn_func(q, *kv.unbind(2), dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """Attention on a packed batch: q (total_q, Hq, D), k and v (total_k, Hkv, D), sequence b being rows
    cu_seqlens_q[b]:cu_seqlens_q[b + 1] (int32, (B + 1,)); masks per sequence. Returns out (total_q, Hq, D);
    with `return_attn_probs`, (out, softmax_lse (Hq, total_q) float32, None): the probabilities of a
    packed batch are not materialised."""
    if block_table is not None:
        raise NotImplementedError("block_table (a paged KV cache) is not supported by flash_attn_varlen_func here; "
                                  "pass contiguous k and v")
    if not isinstance(return_attn_probs, bool):
        raise TypeError(f"return_attn_probs must be True or False, got {return_attn_probs!r}")
    o, lse = flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    is_causal=causal, scale=softmax_scale, window_size=window_size, softcap=softcap,
                                    alibi_slopes=alibi_slopes, dropout_p=dropout_p, return_lse=True,
                                    deterministic=deterministic)
    return _results(o, lse, None, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """`flash_attn_varlen_func` on qkv (total, 3, H, D) stacked, one cu_seqlens for queries and keys."""
    _check_packed("qkv", qkv, 4, 3, "(total, 3, heads, head_dim)")
    return flash_attn_varlen_func(*qkv.unbind(1), cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """`flash_attn_varlen_func` on q (total_q, Hq, D) and kv (total_k, 2, Hkv, D) stacked."""
    _check_packed("kv", kv, 4, 2, "(total, 2, heads, head_dim)")
    return flash_attn_varlen_func(q, *kv.unbind(1), cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False, *,
                            q_descale=None, k_descale=None, v_descale=None):
    """Decoding against a KV cache, as flash_attn's: q (B, Nq, Hq, D); k_cache, v_cache (B_cache, Nmax,
    Hkv, D), or with `block_table` (B, max_blocks) int32 paged (num_blocks, block_size, Hkv, D); new k, v
    (B, N_new, Hkv, D) written into the cache in place at `cache_seqlens` (int32 (B,) or an int; None: the
    whole cache is in use) before attending. `causal` aligns each sequence's queries to its own end.
    Returns out (B, Nq, Hq, D), and with `return_softmax_lse` (out, softmax_lse (B, Hq, Nq)).
    `flashtriton.flash_attention_with_kvcache` documents the rest; `num_splits` > 0 forces the split-KV
    count as flash_attn's does. Rotary embeddings inside the call (`rotary_cos`, `rotary_sin`) are not
    supported: apply them to q and k first. `k_descale`, `v_descale` (keywords, as FlashAttention-3's
    function takes them): an FP8 cache's factors, (B, Hkv) or one element; q stays in bf16, fp16 or
    float32, so `q_descale` must be None."""
    if rotary_cos is not None or rotary_sin is not None:
        raise NotImplementedError("rotary_cos/rotary_sin (rotary embedding inside the call) are not supported by "
                                  "flashtriton: apply the rotary embedding to q and k before the call")
    if q_descale is not None:
        raise NotImplementedError("q_descale: flashtriton's KV-cache attention takes q in bf16, fp16 or float32 "
                                  "(only the cache in FP8); pass q dequantized and q_descale=None")
    check_flags(rotary_interleaved=rotary_interleaved)  # ignored without rotary
    _check_layout("q", q, 4, "(batch, seqlen, heads, head_dim)")
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check_layout(name, x, 4, "(batch_cache, seqlen_cache, heads_kv, head_dim) or paged (num_blocks, "
                                  "block_size, heads_kv, head_dim)")
    for name, x in (("k", k), ("v", v)):
        _check_layout(name, x, 4, "(batch, new_tokens, heads_kv, head_dim)")
    if cache_seqlens is None:  # the whole cache holds keys
        if isinstance(k_cache, torch.Tensor):
            cache_seqlens = k_cache.shape[1] * (block_table.shape[1] if isinstance(block_table, torch.Tensor) else 1)
        if k is not None:
            raise ValueError("k and v (new entries to append) need cache_seqlens, the position to write them at")
    o, lse = flash_attention_with_kvcache(
        _heads_first(q), _heads_first(k_cache), _heads_first(v_cache), cache_seqlens, _heads_first(k),
        _heads_first(v), block_table=block_table, cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
        is_causal=causal, scale=softmax_scale, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
        num_splits=num_splits, k_descale=k_descale, v_descale=v_descale, return_lse=True)
    o = o.transpose(1, 2)
    return (o, lse) if return_softmax_lse else o


def _heads_first(x):
    """flash_attn's (B, N, H, D) as flashtriton's (B, H, N, D) view; anything else as it is (checked later)."""
    return x.transpose(1, 2) if isinstance(x, torch.Tensor) and x.dim() == 4 else x
