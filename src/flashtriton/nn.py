"""`flashtriton.nn.Attention`: a multi-head attention layer over flashtriton's kernels, (B, N, E) in and out."""

from __future__ import annotations

import torch
from torch import nn

from .flash_attn_interface import flash_attn_func, flash_attn_varlen_func
from .validation import check_dropout, check_flags, check_softcap, check_window

__all__ = ["Attention"]


class Attention(nn.Module):
    """Multi-head self- or cross-attention: projections, then attention (flash_attn_interface's functions,
    whose layouts the projections give without a copy), then the output projection.

        layer = flashtriton.nn.Attention(1024, num_heads=16, num_kv_heads=4, is_causal=True).cuda().bfloat16()
        y = layer(x)                                  # x, y: (B, N, 1024)
        y = layer(x, context)                         # cross-attention: keys and values from context (B, M, 1024)
        y = layer(packed, cu_seqlens=cu, max_seqlen=n) # a packed batch: packed, y (total, 1024)

    Args:
        embed_dim: E, the width of the input and output.
        num_heads: query heads Hq.
        num_kv_heads: key/value heads Hkv (grouped-query attention; 1 is multi-query); default Hq.
        head_dim: D; default E // Hq.
        is_causal: causal mask, aligned to the bottom-right corner as in `flash_attention`.
        window_size: (left, right) sliding window, -1 unbounded.
        softcap: > 0 caps the scores (Gemma 2).
        dropout: the probability of dropping an attention probability, in training mode only.
        scale: the softmax scale; default 1 / sqrt(D).
        bias: whether the projections have biases.
        device, dtype: of the parameters.

    Parameters: `q_proj` (E -> Hq D), `kv_proj` (E -> 2 Hkv D, keys then values, one matmul for both),
    `out_proj` (Hq D -> E). Attention itself has no parameters.
    """

    def __init__(self, embed_dim: int, num_heads: int, num_kv_heads: int | None = None, head_dim: int | None = None,
                 *, is_causal: bool = False, window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                 dropout: float = 0.0, scale: float | None = None, bias: bool = False,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads), ("num_kv_heads", num_kv_heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        if head_dim is None:
            if embed_dim % num_heads:
                raise ValueError(f"embed_dim ({embed_dim}) is not a multiple of num_heads ({num_heads}); pass "
                                 "head_dim explicitly")
            head_dim = embed_dim // num_heads
        check_flags(is_causal=is_causal, bias=bias)
        self.embed_dim, self.num_heads, self.num_kv_heads, self.head_dim = embed_dim, num_heads, num_kv_heads, head_dim
        self.is_causal, self.window_size = is_causal, check_window(window_size)
        self.softcap, self.dropout, self.scale = check_softcap(softcap), check_dropout(dropout), scale
        factory = dict(device=device, dtype=dtype)
        self.q_proj = nn.Linear(embed_dim, num_heads * head_dim, bias=bias, **factory)
        self.kv_proj = nn.Linear(embed_dim, 2 * num_kv_heads * head_dim, bias=bias, **factory)
        self.out_proj = nn.Linear(num_heads * head_dim, embed_dim, bias=bias, **factory)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, is_causal={self.is_causal}, window_size={self.window_size}, "
                f"softcap={self.softcap}, dropout={self.dropout}")

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None, *,
                cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None) -> torch.Tensor:
        """x (B, N, E), or (total, E) packed with `cu_seqlens` (int32 (batch + 1,)) and `max_seqlen`; keys
        and values from `context` (B, M, E) when given, else from x. Returns x's shape."""
        packed = cu_seqlens is not None
        if packed and context is not None:
            raise NotImplementedError("cross-attention (context) on a packed batch (cu_seqlens) is not supported; "
                                      "call flashtriton.flash_attention_varlen with the two batches' cu_seqlens")
        if packed and max_seqlen is None:
            raise ValueError("a packed batch (cu_seqlens) needs max_seqlen, the longest sequence's length")
        want = 2 if packed else 3
        source = x if context is None else context
        for name, t in (("x", x), ("context", source)):
            if not isinstance(t, torch.Tensor) or t.dim() != want or t.shape[-1] != self.embed_dim:
                layout = "(total, E)" if packed else "(B, N, E)"
                raise ValueError(f"{name} must be {layout} with E = {self.embed_dim}, got "
                                 f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        lead = x.shape[:-1]
        q = self.q_proj(x).unflatten(-1, (self.num_heads, self.head_dim))
        k, v = self.kv_proj(source).unflatten(-1, (2, self.num_kv_heads, self.head_dim)).unbind(-3)
        # flash_attn's layouts are the projections' own: (B, N, H, D), or (total, H, D) packed
        options = dict(causal=self.is_causal, softmax_scale=self.scale, window_size=self.window_size,
                       softcap=self.softcap, dropout_p=self.dropout if self.training else 0.0)
        if packed:
            o = flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **options)
        else:
            o = flash_attn_func(q, k, v, **options)
        return self.out_proj(o.reshape(*lead, self.num_heads * self.head_dim))
