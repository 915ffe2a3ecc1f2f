"""flashtriton: FlashAttention-2 for PyTorch, written in Triton.

    flash_attention(q, k, v, is_causal=False, scale=None, return_lse=False,     # (B, H, N, D)
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None)
    flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,  # packed (total, H, D)
                           max_seqlen_k, ...)
    FlashAttentionTriton.apply(Q, K, V, is_causal=False)                        # (..., N, d), the article's API
    FlashAttentionPytorch.apply(Q, K, V, is_causal=False)                       # the same algorithm in PyTorch
    attention_ref(q, k, v, is_causal=False)                                     # plain attention, the oracle
"""

from .api import flash_attention, flash_attention_varlen
from .autograd import FlashAttentionTriton
from .reference import FlashAttentionPytorch, attention_ref

__all__ = ["flash_attention", "flash_attention_varlen", "FlashAttentionTriton", "FlashAttentionPytorch",
           "attention_ref"]
__version__ = "0.1.0"
