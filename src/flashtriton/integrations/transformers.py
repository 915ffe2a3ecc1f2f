"""A Hugging Face transformers (5.x) attention backend: `attn_implementation="FlashTriton"`.

    import flashtriton.integrations.transformers   # registers "FlashTriton" (or call register())
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="FlashTriton")

The name is capitalised on purpose: transformers takes every implementation name that contains the
lowercase "flash" for a flash_attn build, and tries to import it from flash_attn or the Hugging Face
Hub (`is_flash_attention_requested`), so `"flashtriton"` fails there with "Could not find the
currently requested flash attention implementation".

Importing this module registers the backend with transformers' `AttentionInterface`, and its mask
builder (`padding_mask`) under the same name with `AttentionMaskInterface`, so that a model hands the
backend what it hands flash_attn: a 2-D padding mask (batch, keys), or None when nothing is padded;
against a static cache the mask comes padded to the cache's length (one shape for every step). The
backend then runs, per layer:

- generation's decoding steps (at most DECODE_QUERIES new tokens, nothing to differentiate):
  `flash_attention_with_kvcache` (split-KV, GQA heads packed) against the keys transformers passes,
  with left padding as `cache_leftpad` (a mask that pads elsewhere takes the packed path below). A
  static cache (`cache_implementation="static"`) passes its whole preallocated length: with a mask, each
  row's kept keys [first, newest token] are the call's left padding and length; without one the newest
  position id + 1 counts each sequence's written keys, on the GPU (a longer chunk against a cache, a
  static cache's prefill, takes the same call). Both have no branch on the GPU's values under
  torch.compile, so generate()'s compiled decoding step (static cache) is one graph;
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
from transformers.masking_utils import AttentionMaskInterface

from ..api import flash_attention, flash_attention_varlen
from ..cache import CACHE, remember
from ..kvcache import flash_attention_with_kvcache
from ..validation import mark_kvcache_checked

NAME = "FlashTriton"  # not "flashtriton": see the module docstring
DECODE_QUERIES = 16  # calls with at most this many new tokens per sequence take the KV-cache kernel

__all__ = ["NAME", "attention_forward", "padding_mask", "register"]


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


def _per_step(sources: tuple, tag: tuple, compute):
    """compute(), remembered for the tensors `sources` (a mask, position ids; None entries are skipped)
    while they live unmodified (CACHE.per_step): every layer of a decoding step gets the same ones, so a
    value that needs a read back to the host is read once per step, and the tensors it gives are the same
    objects in every layer, which lets check_kvcache skip its own read back after the first. A read per
    layer would stop the host from running ahead of the GPU. Nothing is remembered while torch.compile
    traces."""
    if torch.compiler.is_compiling():
        return compute()
    sources = tuple([x for x in sources if x is not None])
    key = (tuple(map(id, sources)), tag)
    seen = CACHE.per_step.get(key)
    if (seen is not None and all(ref() is x for ref, x in zip(seen[0], sources, strict=True))
            and seen[1] == tuple([x._version for x in sources])):
        return seen[2]
    value = compute()
    remember(CACHE.per_step, key, (tuple(weakref.ref(x) for x in sources), tuple([x._version for x in sources]),
                                   value))
    return value


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
    return _per_step((position_ids,), ("written keys", batch, seqlen_k), compute)


def padding_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                 mask_function=None, attention_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor | None:
    """The mask builder registered with the backend: transformers' flash one, the 2-D padding mask (B,
    kv_length) sliced from the right (a sliding-window cache keeps the last keys), or None when nothing is
    padded; with two changes for compiled decoding. Against a static cache kv_length is the cache's whole
    preallocated length and the mask covers only the tokens seen so far, a length that grows every step, so
    a compiled decoding step would be compiled again for each: for a decoding step (at most DECODE_QUERIES
    queries, no gradient) that mask is padded with False to kv_length, one shape for every step. The
    backend finds each row's written keys from the position ids (_kept_run). And under torch.compile the
    mask is returned as it is, never None: "is anything padded" would be a branch on the GPU's values."""
    if attention_mask is None:
        return None
    mask = attention_mask[:, -kv_length:]
    if mask.shape[-1] < kv_length:
        if q_length <= DECODE_QUERIES and not torch.is_grad_enabled():
            mask = torch.nn.functional.pad(mask, (0, kv_length - mask.shape[-1]), value=False)
        return mask
    if torch.compiler.is_compiling() or not mask.all():
        return mask
    return None


def _kept_run(mask: torch.Tensor, position_ids: torch.Tensor | None, seqlen_q: int, key: torch.Tensor):
    """(first, end): int32 (B,) each, the keys [first, end) that each row of `mask` (B, Nk) keeps (of `key`,
    (B, Hkv, Nk, D)), when they are one run (eagerly, end is None when every row's is Nk: the call's int
    length); else None. The queries are the last Nq slots before end (a query left of first is padding:
    the kernel gives it 0, as the packed path does). first is the first kept key; end is first + the last
    query's position id + 1 (with left padding only, a row's position ids count its kept tokens), which
    also holds for a static cache's mask that padding_mask padded with its unwritten slots. Without
    position ids ((B or 1, Nq)) end is Nk, so a static cache needs a model that passes them
    (transformers' Llama-family models do). Eagerly the check is one read back to the host per step
    (_per_step); under torch.compile it is an assertion on the GPU, so that a compiled decoding step has
    no branch on the GPU's values (without position ids there, None: the packed path, a graph break)."""
    positioned = position_ids is not None and position_ids.dim() == 2 and position_ids.shape[-1] == seqlen_q
    if torch.compiler.is_compiling() and not positioned:
        return None  # no run to assert on the GPU: the packed path takes the call (a graph break)

    def compute():
        kept = mask.bool()
        batch, seqlen_k = kept.shape
        first = kept.int().argmax(-1)
        if positioned:
            end = (first + position_ids[:, -1] + 1).clamp(0, seqlen_k).expand(batch)
        else:
            end = torch.full_like(first, seqlen_k)
        slots = torch.arange(seqlen_k, device=mask.device)
        ok = (((slots >= first[:, None]) & (slots < end[:, None])) == kept).all()
        first, end = first.to(torch.int32), end.to(torch.int32)
        if torch.compiler.is_compiling():
            torch._assert_async(ok, "flashtriton's compiled decoding step needs each row's kept keys to be one run "
                                    "(left padding only) that ends at its last query")
            return first, end
        ok, full = torch.stack([ok, (end == seqlen_k).all()]).tolist()  # one read back for both
        if not ok:
            return None
        # Every row's run ending at Nk (a dynamic cache): the int length, the cheaper call.
        end = None if full else end
        mark_kvcache_checked(end, key, cache_leftpad=first)
        return first, end
    return _per_step((mask, position_ids), ("kept run", seqlen_q, key.shape[2]), compute)


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
    inference = (not dropout and kwargs.get("cu_seq_lens_q") is None and key.stride(-1) == 1
                 and not (torch.is_grad_enabled() and query.requires_grad))
    if attention_mask is not None and seqlen_q <= DECODE_QUERIES and (inference or not torch.is_grad_enabled()):
        # A decoding step with padding: each row's kept keys as cache_leftpad and length. The mask may span a
        # static cache's unwritten slots (padding_mask): with dropout, the packed path gets the written part.
        run = _kept_run(attention_mask, kwargs.get("position_ids"), seqlen_q, key)
        if run is not None and inference:
            return _decode(query, key, value, options, leftpad=run[0], lengths=run[1]), None
        if run is not None and run[1] is not None:  # (None: the keys end at Nk, nothing to cut)
            seen = int(run[1].max())
            attention_mask, key, value = attention_mask[:, :seen], key[:, :, :seen], value[:, :, :seen]
    if attention_mask is not None and key.shape[2] > attention_mask.shape[-1]:
        # A static cache's mask that covers the tokens seen so far (a prefill's): the slots past them are not
        # written yet (transformers' flash path slices them off the same way).
        key, value = (x[:, :, :attention_mask.shape[-1]] for x in (key, value))
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    packed = (None if cu_q is not None or attention_mask is not None
              else _packed_from_positions(kwargs.get("position_ids"), batch, seqlen_q))
    inference = inference and packed is None
    if inference and seqlen_q <= DECODE_QUERIES and attention_mask is None:
        return _decode(query, key, value, options, lengths=_written_keys(kwargs.get("position_ids"), key)), None
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
    AttentionMaskInterface.register(name, padding_mask)
    return name


register()
