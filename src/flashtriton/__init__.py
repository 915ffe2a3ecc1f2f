"""flashtriton: FlashAttention-2 for PyTorch, written in Triton.

    flash_attention(q, k, v, is_causal=False, scale=None, return_lse=False)   # (B, H, N, D)
    FlashAttentionTriton.apply(Q, K, V, is_causal=False)                        # (..., N, d), the article's API
    FlashAttentionPytorch.apply(Q, K, V, is_causal=False)                       # the same algorithm in PyTorch
    attention_ref(q, k, v, is_causal=False)                                     # plain attention, the oracle
"""

from .api import flash_attention
from .ops import FlashAttentionTriton
from .reference import FlashAttentionPytorch, attention_ref

__all__ = ["flash_attention", "FlashAttentionTriton", "FlashAttentionPytorch", "attention_ref"]
__version__ = "0.1.0"
