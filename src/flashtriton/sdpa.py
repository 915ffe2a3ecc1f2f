"""PyTorch's `scaled_dot_product_attention` interface over flashtriton's kernels, and `sdpa_override`, a
context manager that routes an unchanged model's `F.scaled_dot_product_attention` calls through it.

Two differences from `flash_attention` follow from PyTorch's semantics:

- `is_causal` aligns the mask to the top-left corner, as PyTorch does: query i sees key j iff j <= i,
  whatever Nq and Nk. `flash_attention` (and flash_attn) align it to the bottom-right corner instead,
  j <= i + Nk - Nq, which is what decoding with a KV cache wants. They agree when Nq == Nk::

      Nq = 2, Nk = 4:  SDPA (top-left)   flash_attention (bottom-right)
                       q0  x . . .       q0  x x x .
                       q1  x x . .       q1  x x x x

  Top-left is computed exactly with the same kernels: with Nq <= Nk no query sees a key at or past Nq,
  so the keys are sliced to the first Nq; with Nq > Nk it is the window (unbounded, Nq - Nk) ahead.
- `attn_mask` (a boolean or additive mask of any shape) is not something the kernels can take: a call
  with one runs PyTorch's own SDPA instead, with a warning (once per call site), so that a model keeps
  working and the user learns that this call is not accelerated. So do, under `sdpa_override`, calls
  the kernels cannot run (a CPU tensor without the interpreter, float64, a value head dim unlike the
  query's, a head dim above 256). Called directly, those are errors.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from . import _interpreter
from .api import FlashAttentionTriton
from .validation import MAX_HEAD_DIM, SUPPORTED_DTYPES, check_flags

__all__ = ["scaled_dot_product_attention", "sdpa_override"]


def _fall_back(reason: str, *args, **kwargs) -> torch.Tensor:
    warnings.warn(f"flashtriton: {reason}; this call runs PyTorch's scaled_dot_product_attention instead",
                  stacklevel=3)
    return F.scaled_dot_product_attention(*args, **kwargs)


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> torch.Tensor:
    """`torch.nn.functional.scaled_dot_product_attention`, with the same arguments and semantics.

    Args:
        query: (..., Hq, L, E); key and value: (..., Hkv, S, E), with Hkv == Hq unless `enable_gqa`
            (then Hq a multiple of Hkv). float16, bfloat16 or float32, E <= 256.
        attn_mask: run through PyTorch's SDPA, with a warning (see the module's docstring).
        dropout_p: applied whenever > 0, as PyTorch does (pass 0.0 in evaluation).
        is_causal: top-left aligned (module docstring); not with `attn_mask`.
        scale: defaults to 1 / sqrt(E).

    Returns: (..., Hq, L, E), query's dtype.
    """
    if attn_mask is not None:
        if is_causal:
            raise ValueError("attn_mask and is_causal=True were both given; pass one of them, as PyTorch's "
                             "scaled_dot_product_attention requires")
        return _fall_back("attn_mask is not supported by the kernels", query, key, value, attn_mask=attn_mask,
                          dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa)
    check_flags(is_causal=is_causal, enable_gqa=enable_gqa)
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if value.shape[-1] != query.shape[-1]:
        raise NotImplementedError(f"value's head dim {value.shape[-1]} differs from query's {query.shape[-1]}; the "
                                  "kernels need equal head dims: pad value, or use torch's SDPA")
    if query.dim() >= 4 and key.dim() == query.dim() and key.shape[-3] != query.shape[-3] and not enable_gqa:
        raise ValueError(f"query has {query.shape[-3]} heads and key {key.shape[-3]}; pass enable_gqa=True for "
                         "grouped-query attention, as PyTorch's scaled_dot_product_attention requires")
    seqlen_q, seqlen_k = query.shape[-2], key.shape[-2]
    window = (-1, -1)
    if is_causal and seqlen_q < seqlen_k:  # query i < Nq never sees key j >= Nq: bottom-right on Nq keys
        key, value = key[..., :seqlen_q, :], value[..., :seqlen_q, :]
    elif is_causal and seqlen_q > seqlen_k:  # j <= i is the bottom-right band shifted Nq - Nk ahead
        is_causal, window = False, (-1, seqlen_q - seqlen_k)
    # The article's interface already takes (..., N, E) of any rank and returns O shaped like the query.
    return FlashAttentionTriton.apply(query, key, value, is_causal, scale, window_size=window, dropout_p=dropout_p)


def _kernels_cannot_run(query, key, value) -> str | None:
    """Why the kernels cannot take these inputs, or None."""
    tensors = (query, key, value)
    if not all(isinstance(x, torch.Tensor) for x in tensors):
        return "query, key and value are not all tensors"
    if query.device.type != "cuda" and not _interpreter.is_active():
        return f"the inputs are on {query.device}, and the kernels run on CUDA GPUs"
    if query.dtype not in SUPPORTED_DTYPES or any(x.dtype != query.dtype for x in tensors):
        return f"dtype {query.dtype} (the kernels take float16, bfloat16 or float32, all three alike)"
    if value.shape[-1] != query.shape[-1] or key.shape[-1] != query.shape[-1]:
        return "value's head dim differs from query's"
    if query.shape[-1] > MAX_HEAD_DIM:
        return f"head dim {query.shape[-1]} is above {MAX_HEAD_DIM}"
    return None


def _routed(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    reason = _kernels_cannot_run(query, key, value)
    if reason is not None:
        return _fall_back(reason, query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                          scale=scale, enable_gqa=enable_gqa)
    return scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


class _SDPAOverride(TorchFunctionMode):
    """Intercepts torch.nn.functional.scaled_dot_product_attention through PyTorch's torch-function modes,
    which see every call however the model imported the function; everything else passes through."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return _routed(*args, **kwargs)
        return func(*args, **kwargs)


def sdpa_override() -> TorchFunctionMode:
    """A context manager under which `torch.nn.functional.scaled_dot_product_attention` runs flashtriton's
    `scaled_dot_product_attention` wherever the kernels support the call, and PyTorch's own (with a
    warning once per reason) where they do not::

        with flashtriton.sdpa_override():
            logits = model(tokens)          # a model that calls F.scaled_dot_product_attention
            logits.sum().backward()

    The backward runs flashtriton's kernels too (autograd recorded them). Works under torch.compile
    when entered outside the compiled function."""
    return _SDPAOverride()
