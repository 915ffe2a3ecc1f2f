"""flashtriton: FlashAttention-2 for PyTorch, written in Triton.

    flash_attention(q, k, v, is_causal=False, scale=None, return_lse=False,     # (B, H, N, D)
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None)
    flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,  # packed (total, H, D)
                           max_seqlen_k, ...)
    flash_attention_fp8(q, k, v, is_causal=False, q_descale=None, ...)         # float8 e4m3 inputs, forward only
    flash_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, k=None,    # decoding against a KV cache,
                                 v=None, block_table=None, ...)                # contiguous or paged
    FlashAttentionTriton.apply(Q, K, V, is_causal=False)                        # (..., N, d), the article's API
    scaled_dot_product_attention(query, key, value, attn_mask=None, ...)        # torch's SDPA, same semantics
    with sdpa_override(): model(x)                                              # routes F.scaled_dot_product_attention
    FlashAttentionPytorch.apply(Q, K, V, is_causal=False)                       # the same algorithm in PyTorch
    attention_ref(q, k, v, is_causal=False)                                     # plain attention, the oracle

Beside them: `flashtriton.flash_attn_interface` (flash_attn's functions), `flashtriton.nn.Attention`
(a layer), `flashtriton.integrations.transformers` (a Hugging Face attention backend).

The names load torch and the kernels on first use, so that `python -m flashtriton --help` and
`flashtriton.__version__` answer at once. Triton reads TRITON_INTERPRET when the kernels are defined:
set it before the first use of one of these names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.2.0"  # the one place the version is written (pyproject.toml reads it)

_EXPORTS = {
    "flash_attention": ".api",
    "flash_attention_varlen": ".api",
    "flash_attention_fp8": ".api",
    "FlashAttentionTriton": ".api",
    "flash_attention_with_kvcache": ".kvcache",
    "scaled_dot_product_attention": ".sdpa",
    "sdpa_override": ".sdpa",
    "FlashAttentionPytorch": ".reference",
    "attention_ref": ".reference",
}
__all__ = [*_EXPORTS, "__version__"]

if TYPE_CHECKING:  # what __getattr__ hands out, for type checkers and editors
    from .api import (  # noqa: F401
        FlashAttentionTriton,  # noqa: F401
        flash_attention,
        flash_attention_fp8,
        flash_attention_varlen,
    )
    from .kvcache import flash_attention_with_kvcache  # noqa: F401
    from .reference import FlashAttentionPytorch, attention_ref  # noqa: F401
    from .sdpa import scaled_dot_product_attention, sdpa_override  # noqa: F401


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'flashtriton' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
