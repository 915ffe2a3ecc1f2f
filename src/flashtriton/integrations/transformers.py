"""A Hugging Face transformers (5.x) attention backend: `attn_implementation="FlashTriton"`.

    import flashtriton.integrations.transformers   # registers "FlashTriton" (or call register())
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="FlashTriton")

The name is capitalised on purpose: transformers takes every implementation name that contains the
lowercase "flash" for a flash_attn build, and tries to import it from flash_attn or the Hugging Face
Hub (`is_flash_attention_requested`), so `"flashtriton"` fails there with "Could not find the
currently requested flash attention implementation".

Importing this module registers the backend with transformers' `AttentionInterface`, and registers
transformers' own flash-attention mask builder under the same name with `AttentionMaskInterface`, so
that a model hands the backend what it hands flash_attn: a 2-D padding mask (batch, keys), or None
when nothing is padded. The backend then runs, per layer:

- generation's decoding steps (at most DECODE_QUERIES new tokens, nothing to differentiate):
  `flash_attention_with_kvcache` (split-KV, GQA heads packed) against the keys transformers passes,
  with left padding as `cache_leftpad` (a mask that pads elsewhere takes the packed path below). A
  static cache (`cache_implementation="static"`) passes its whole preallocated length: with a mask the
  keys past it are sliced off, without one the newest position id + 1 counts each sequence's written
  keys, on the GPU (a longer chunk against a cache, a static cache's prefill, takes the same call);
- no padding: `flash_attention` on the (B, H, N, D) tensors, causal aligned to the bottom-right
  corner, which is what decoding against a KV cache needs;
- a padding mask: the tokens kept are gathered into a packed batch (`flash_attention_varlen`) and the
  output scattered back, 0 at padded queries (one read of the mask's lengths to the host per layer);
- packed sequences: the `cu_seq_lens_q`/`cu_seq_lens_k`/`max_length_q`/`max_length_k` keywords that
  transformers' `DataCollatorWithFlattening(return_flash_attn_kwargs=True)` produces; or, with batch 1
  and no mask, `position_ids` that restart (read on the host, as transformers' flash path does: under
  torch.compile that is a graph break, so pass the cu_seq_lens keywords there);
- grouped-query heads natively (no repeat of K and V); a layer's `sliding_window` as the window
  (sliding_window - 1, sliding_window - 1), as transformers maps it for flash_attn (a causal layer
  sees its last `sliding_window` keys); `softcap` (Gemma 2) and `scaling` as they are; `dropout`.

Anything else raises NotImplementedError: attention sinks (`s_aux`), a 4-D custom mask, key and value
head dims that differ. `output_attentions=True` returns no weights, with a warning, as transformers'
flash backends do.
"""

from __future__ import annotations

import warnings
import weakref

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

from ..api import flash_attention, flash_attention_varlen
from ..cache import CACHE, remember
from ..kvcache import flash_attention_with_kvcache
from ..validation import mark_kvcache_checked

NAME = "FlashTriton"  # not "flashtriton": see the module docstring
DECODE_QUERIES = 16  # calls with at most this many new tokens per sequence take the KV-cache kernel

__all__ = ["NAME", "attention_forward", "register"]


def _cumulative(lengths: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))


def _packed_from_positions(position_ids: torch.Tensor | None, batch: int, seqlen: int):
    """(cu_seqlens, max_seqlen) of the sequences packed into one row, where position_ids restart; None
    for one sequence per row (batch > 1, a single token, or positions that never restart)."""
    if position_ids is None or batch != 1 or seqlen == 1:
        return None
    positions = position_ids.reshape(-1)
    starts = (positions[1:] <= positions[:-1]).nonzero().flatten() + 1
    if starts.numel() == 0:
        return None
    cu = torch.cat([starts.new_zeros(1), starts, starts.new_full((1,), positions.numel())]).to(torch.int32)
    return cu, int(cu.diff().max())


def _varlen(query, key, value, cu_q, cu_k, max_q, max_k, options):
    """Attention on (B, N, H, D) tensors flattened into one packed batch; returns (B, Nq, H, D)."""
    batch, seqlen_q = query.shape[:2]
    o = flash_attention_varlen(query.reshape(-1, *query.shape[2:]), key.reshape(-1, *key.shape[2:]),
                               value.reshape(-1, *value.shape[2:]), cu_q, cu_k, int(max_q), int(max_k), **options)
    return o.view(batch, seqlen_q, *o.shape[1:])


def _unpadded(query, key, value, mask, options):
    """Attention on (B, N, H, D) tensors of which `mask` (B, Nk), True where kept, marks the keys; the
    queries are the last Nq positions of it. Padded queries get 0."""
    batch, seqlen_q = query.shape[:2]
    mask = mask.bool()
    mask_q = mask[:, -seqlen_q:]
    lengths_k, lengths_q = mask.sum(-1, dtype=torch.int32), mask_q.sum(-1, dtype=torch.int32)
    kept_k, kept_q = mask.flatten().nonzero().flatten(), mask_q.flatten().nonzero().flatten()
    max_q, max_k = torch.stack([lengths_q.max(), lengths_k.max()]).tolist()  # one read back for both
    q = query.reshape(-1, *query.shape[2:]).index_select(0, kept_q)
    k, v = (x.reshape(-1, *x.shape[2:]).index_select(0, kept_k) for x in (key, value))
    o = flash_attention_varlen(q, k, v, _cumulative(lengths_q), _cumulative(lengths_k), max_q, max_k, **options)
    full = o.new_zeros(batch * seqlen_q, *o.shape[1:]).index_copy(0, kept_q, o)
    return full.view(batch, seqlen_q, *o.shape[1:])


def _per_step(source: torch.Tensor, tag: tuple, compute):
    """compute(), remembered for the tensor `source` (a mask, position ids) while it lives unmodified
    (CACHE.per_step): every layer of a decoding step gets the same one, so a value that needs a read back
    to the host is read once per step, and the tensor it gives is the same object in every layer, which
    lets check_kvcache skip its own read back after the first. A read per layer would stop the host from
    running ahead of the GPU. Nothing is remembered while torch.compile traces."""
    if torch.compiler.is_compiling():
        return compute()
    key = (id(source), tag)
    seen = CACHE.per_step.get(key)
    if seen is not None and seen[0]() is source and seen[1] == source._version:
        return seen[2]
    value = compute()
    remember(CACHE.per_step, key, (weakref.ref(source), source._version, value))
    return value


def _left_padding(mask: torch.Tensor, seqlen_q: int) -> torch.Tensor | None:
    """Each row's count of leading padded keys (int32 (B,)) when `mask` (B, Nk) pads on the left only and
    keeps every query; else None. One read back to the host per mask (_per_step)."""
    def compute():
        kept = mask.bool()
        first = kept.int().argmax(-1)  # the first kept key
        left_only = (kept.sum(-1) == kept.shape[1] - first) & kept[:, -seqlen_q:].all(-1)
        return first.to(torch.int32) if bool(left_only.all()) else None
    return _per_step(mask, ("left padding", seqlen_q), compute)


def _written_keys(position_ids: torch.Tensor | None, key: torch.Tensor) -> torch.Tensor | int:
    """How many of the cached keys `key` (B, Hkv, Nk, D) each sequence has written, without a padding mask:
    all Nk in a dynamic cache, but a static cache passes its whole preallocated length, whose slots past
    the newest token are still empty. Without padding the position ids are the cache positions, so the
    newest token's position + 1 counts the written keys: int32 (B,), computed on the GPU and in [0, Nk]
    by construction, so marked as checked (no read back to the host). Nk when there are no position ids,
    or ones that are not one position per token ((B or 1, Nq); multimodal rotary embeddings pass more)."""
    batch, seqlen_k = key.shape[0], key.shape[2]
    if position_ids is None or position_ids.dim() != 2:
        return seqlen_k

    def compute():
        # Two small kernels: newest position + 1, cast to int32 into a (B,) tensor as it is added, then clamped.
        lengths = torch.empty(batch, dtype=torch.int32, device=key.device)
        torch.add(position_ids[:, -1].expand(batch), 1, out=lengths).clamp_(0, seqlen_k)
        if not torch.compiler.is_compiling():
            mark_kvcache_checked(lengths, key)
        return lengths
    return _per_step(position_ids, ("written keys", batch, seqlen_k), compute)


def _decode(query, key, value, options, leftpad=None, lengths=None):
    """A decoding step on (B, H, N, D) tensors: the new tokens' queries against the keys so far (the cache
    transformers passes, new keys included; `lengths` of them per sequence, all by default), through the
    split-KV kernel; returns (B, Nq, H, D)."""
    o = flash_attention_with_kvcache(query, key, value, key.shape[2] if lengths is None else lengths,
                                     cache_leftpad=leftpad, is_causal=options["is_causal"], scale=options["scale"],
                                     window_size=options["window_size"], softcap=options["softcap"])
    return o.transpose(1, 2)


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      sliding_window: int | None = None, softcap: float | None = None, is_causal: bool | None = None,
                      s_aux: torch.Tensor | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query (B, Hq, Nq, D), key and value (B, Hkv, Nk, D);
    returns (output (B, Nq, Hq, D), None)."""
    if s_aux is not None:
        raise NotImplementedError("attention sinks (s_aux) are not supported by flashtriton; use "
                                  "attn_implementation='eager' or 'sdpa' for this model")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise NotImplementedError(f"flashtriton takes a 2-D padding mask (batch, keys) from transformers' flash "
                                  f"mask builder, got a mask of shape {tuple(attention_mask.shape)}; custom 4-D "
                                  "masks need attn_implementation='sdpa' or 'eager'")
    if value.shape[-1] != query.shape[-1]:
        raise NotImplementedError(f"value head dim {value.shape[-1]} differs from the query's {query.shape[-1]}; "
                                  "flashtriton needs them equal")
    if kwargs.get("output_attentions", False):
        warnings.warn("flashtriton does not return attention weights (output_attentions=True); they are None",
                      stacklevel=2)
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    window = (-1, -1) if sliding_window is None else (sliding_window - 1, sliding_window - 1)
    options = dict(is_causal=bool(is_causal), scale=scaling, window_size=window, softcap=softcap or 0.0,
                   dropout_p=float(dropout))
    batch, seqlen_q = query.shape[0], query.shape[2]
    if attention_mask is not None and key.shape[2] > attention_mask.shape[-1]:
        # A static cache: the mask covers the tokens seen so far, and the slots past them are not written
        # yet (transformers' flash path slices them off the same way).
        key, value = (x[:, :, :attention_mask.shape[-1]] for x in (key, value))
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    packed = (None if cu_q is not None or attention_mask is not None
              else _packed_from_positions(kwargs.get("position_ids"), batch, seqlen_q))
    inference = (not dropout and cu_q is None and packed is None and key.stride(-1) == 1
                 and not (torch.is_grad_enabled() and query.requires_grad))
    if inference and seqlen_q <= DECODE_QUERIES:
        if attention_mask is None:
            return _decode(query, key, value, options, lengths=_written_keys(kwargs.get("position_ids"), key)), None
        leftpad = _left_padding(attention_mask, seqlen_q)
        if leftpad is not None:
            return _decode(query, key, value, options, leftpad=leftpad), None
    if inference and attention_mask is None and key.shape[2] > seqlen_q:
        # A longer chunk against a cache (a static one's prefill): the same count of written keys
        lengths = _written_keys(kwargs.get("position_ids"), key)
        if isinstance(lengths, torch.Tensor):
            return _decode(query, key, value, options, lengths=lengths), None
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))  # (B, N, H, D) views
    if attention_mask is not None:
        return _unpadded(q, k, v, attention_mask, options), None
    if cu_q is not None and cu_k is not None:
        return _varlen(q, k, v, cu_q.to(torch.int32), cu_k.to(torch.int32), kwargs["max_length_q"],
                       kwargs["max_length_k"], options), None
    if packed is not None:
        cu, longest = packed
        return _varlen(q, k, v, cu, cu, longest, longest, options), None
    return flash_attention(query, key, value, **options).transpose(1, 2), None


def register(name: str = NAME) -> str:
    """Register the backend (and its mask builder) under `name`; returns the name to pass as
    `attn_implementation`. Done once on import with the default name; registering again is harmless."""
    if not isinstance(name, str) or "flash" in name:
        raise ValueError(f"name {name!r} cannot be registered: transformers takes an implementation name containing "
                         f"'flash' for a flash_attn build and tries to import it; use e.g. {NAME!r}")
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name


register()
