"""Attention against a KV cache, for inference: decoding, speculative decoding and chunked prefill.

`flash_attention_with_kvcache` takes flashtriton's (B, H, N, D) layout; `flash_attn_interface.
flash_attn_with_kvcache` is flash_attn 2.8's function over it, in (B, N, H, D).
"""

from __future__ import annotations

import torch

from . import ops
from .api import op_options
from .cache import CACHE, remember
from .launch import append_to_cache
from .launch.arguments import input_precision
from .launch.decode import prepare_decode
from .validation import check_flags, check_grown_kvcache, check_kvcache, check_kvcache_values, last_dim_contiguous


def flash_attention_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor | int,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    *,
    block_table: torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    num_splits: int = 0,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of a few new query tokens per sequence against its cached keys and values, with the new
    keys and values (if given) first written into the cache in place. Forward only: there is no gradient.

    Args:
        q: (B, Hq, Nq, D): each sequence's newest Nq tokens (1 for plain decoding; more for speculative
            decoding or chunked prefill).
        k_cache, v_cache: the cache, contiguous (B_cache, Hkv, Nmax, D), or paged (num_blocks, Hkv,
            block_size, D) with `block_table`; any strides whose last is 1 (flash_attn's (B, N, H, D)
            cache is `k_cache.transpose(1, 2)`). Hq a multiple of Hkv (GQA, MQA). Any block size >= 1.
        cache_seqlens: int32 (B,) or one int: how many keys each sequence has in the cache before the
            append.
        k, v: (B, Hkv, N_new, D) or None: written at positions cache_seqlens[b] .. + N_new of each sequence
            (through its block table when paged) before attending. The call does not update cache_seqlens.
        block_table: int32 (B, max_blocks): block j of sequence b holds its keys [j * block_size,
            (j + 1) * block_size). Entries past a sequence's length are not read.
        cache_batch_idx: int32 (B,): the cache row of each sequence (contiguous cache only); default b.
        cache_leftpad: int32 (B,): each sequence's keys start at this position (left padding; contiguous
            cache only); default 0.
        is_causal: the queries are the sequence's last Nq positions: query i sits at position
            L - Nq + i, with L = cache_seqlens[b] + N_new, and sees keys up to there (bottom-right, as
            `flash_attention`). Without it every query sees all L keys.
        scale, window_size, softcap, alibi_slopes: as in `flash_attention`, with positions as above.
        num_splits: 0 chooses how many programs share a sequence's keys (split-KV; launch/decode.py's
            heuristic); n > 0 forces n. Without it, a call with at least 128 queries per sequence
            (launch/decode.py's DENSE_FROM_QUERIES) on a contiguous cache (not FP8) without
            cache_batch_idx or cache_leftpad, a chunked prefill, runs the dense forward kernel instead.
        k_descale, v_descale: for an FP8 cache (k_cache and v_cache torch.float8_e4m3fn, q in bf16, fp16
            or float32): the cache holds K / k_descale and V / v_descale, and the attention is that of K and
            V. Each float32, one element (per tensor) or (B, Hkv) (per sequence and KV head, as
            FlashAttention-3's), or None for 1. New k, v come in q's dtype and are written divided by them
            (saturated to e4m3's largest value, 448). The kernel reads half the bytes of a bf16 cache and
            widens each tile in registers, to q's dtype, or to fp16 for a bf16 q (which holds every e4m3
            value exactly).
        return_lse: also return the logsumexp (B, Hq, Nq) float32.

    Returns:
        o: (B, Hq, Nq, D), laid out like q; with `return_lse`, (o, lse). A query that sees no key (length
        0, or masked) gives o = 0 and lse = -inf.

    Rotary embeddings are not applied here (flash_attn's rotary_cos/rotary_sin): apply them to q and k
    before the call. The cache values are checked on the host (see validation.check_kvcache), except
    under CUDA graph capture and torch.compile, which both work.
    """
    arguments = (q, k_cache, v_cache, cache_seqlens, k, v, block_table, cache_batch_idx, cache_leftpad, alibi_slopes,
                 is_causal, scale, window_size, softcap, num_splits, return_lse, k_descale, v_descale)
    compiling = torch.compiler.is_compiling()
    signature = None if compiling else _signature(arguments)
    call = None if signature is None else CACHE.kvcache_calls.get(signature)
    if call is None:
        check_flags(is_causal=is_causal, return_lse=return_lse)
        family = None if signature is None else _growth_family(signature)
        if family is not None and family in CACHE.kvcache_families:
            check_grown_kvcache(q, k_cache, v_cache, cache_seqlens, k, cache_batch_idx, cache_leftpad)
        else:
            check_kvcache(q, k_cache, v_cache, cache_seqlens, k, v, block_table, cache_batch_idx, cache_leftpad,
                          is_causal=is_causal, k_descale=k_descale, v_descale=v_descale)
            if family is not None:
                remember(CACHE.kvcache_families, family, True)
        if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
            raise ValueError(f"num_splits must be an int >= 0 (0 chooses), got {num_splits!r}")
        if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in (q, k, v)):
            raise NotImplementedError("flash_attention_with_kvcache has no backward (it is for inference): call it "
                                      "under torch.no_grad(), or use flash_attention for training")
        scale, window_left, window_right, softcap, alibi_slopes, _, _ = op_options(q, scale, window_size, softcap,
                                                                                   alibi_slopes, 0.0)
        if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
            raise ValueError("k_cache and v_cache need a contiguous last dim (stride 1), so that the call can write "
                             "and read them in place; lay the cache out with head_dim last")
    else:
        # A signature seen before passed every check but the index tensors' values.
        check_kvcache_values(q, k_cache, cache_seqlens, k, block_table, cache_batch_idx, cache_leftpad)
        if alibi_slopes is not None:
            alibi_slopes = last_dim_contiguous(alibi_slopes)  # as op_options returned them
    q = last_dim_contiguous(q)
    if k is not None:
        append_to_cache(k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx, k_descale, v_descale)
        cache_seqlens = cache_seqlens + k.shape[2]
    tensor_lengths = isinstance(cache_seqlens, torch.Tensor)
    if compiling:
        o, lse = ops.decode(q, k_cache, v_cache, cache_seqlens if tensor_lengths else None,
                            0 if tensor_lengths else int(cache_seqlens), block_table, cache_batch_idx, cache_leftpad,
                            is_causal, scale, window_left, window_right, softcap, alibi_slopes, num_splits, k_descale,
                            v_descale)
        return (o, lse) if return_lse else o
    if call is None:
        call = prepare_decode(q, k_cache, v_cache, cache_seqlens, scale, is_causal=is_causal,
                              window=(window_left, window_right), softcap=softcap, alibi_slopes=alibi_slopes,
                              block_table=block_table, cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
                              num_splits=num_splits, return_lse=return_lse, k_descale=k_descale, v_descale=v_descale)
        if signature is not None:
            remember(CACHE.kvcache_calls, signature, call)
    o, lse = call.launch(q, k_cache, v_cache, cache_seqlens if tensor_lengths else None, cache_batch_idx,
                         cache_leftpad, block_table, alibi_slopes, k_descale, v_descale)
    return (o, lse) if return_lse else o


def _signature(arguments: tuple) -> tuple | None:
    """Everything a KV-cache call's checks and its prepared launch (launch/decode.py's DecodeCall) depend
    on but the index tensors' values: each tensor's shape, strides, dtype, device, 16-byte alignment and
    whether it requires grad; each other argument's type and value (a tuple's item by item); grad mode,
    and float32's matmul precision. A call with the signature of one that passed its checks skips them
    and launches what that one prepared: the checks and the preparation cost a decoding step's layers
    more host time than their launches. None for an argument of another kind (the call then takes the
    full path, whose checks name it)."""
    signature = [torch.is_grad_enabled()]
    for x in arguments:
        kind = type(x)
        if x is None:
            signature.append(None)
        elif kind is torch.Tensor or isinstance(x, torch.Tensor):
            signature.append((x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16 == 0, x.requires_grad))
        elif kind is int or kind is bool or kind is float:
            signature.append((kind, x))
        elif kind is tuple and all(type(item) is int for item in x):
            signature.append(x)
        else:
            return None
    if isinstance(q := arguments[0], torch.Tensor):
        signature.append(input_precision(q.dtype))
    return tuple(signature)


def _growth_family(signature: tuple) -> tuple | None:
    """A signature (see _signature) with what a growing contiguous cache changes from step to step left
    out: the caches' length (dim 2) and the two outer strides it sets, and an int cache_seqlens' value.
    Calls of one family that passed check_kvcache need only check_grown_kvcache: the other checks do not
    read these. None for a paged cache (its dim 2 is the block size; it does not grow) or arguments the
    checks would reject anyway."""
    k_entry, v_entry, lengths, table = signature[2], signature[3], signature[4], signature[7]
    if table is not None or not all(isinstance(e, tuple) and isinstance(e[0], torch.Size) and len(e[0]) == 4
                                    for e in (k_entry, v_entry)):
        return None
    caches = tuple((shape[0], shape[1], shape[3], stride[2:], *rest) for shape, stride, *rest in (k_entry, v_entry))
    if lengths is not None and lengths[0] is int:
        lengths = int
    return (*signature[:2], *caches, lengths, *signature[5:])
