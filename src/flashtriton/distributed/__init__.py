"""Context parallelism over torch.distributed: one long sequence sharded across ranks.

- `ring_attention`: ring attention, K/V blocks passed around the ranks, partial outputs merged exactly
  through their logsumexp; the zigzag layout (layout.py) balances causal work, the contiguous one is
  there for inputs already split that way.
- `ulysses_attention`: all-to-all from sequence shards to head shards, the whole sequence's attention on
  each rank's heads, and back (DeepSpeed Ulysses); every flag of `flash_attention`.
- `zigzag_shard`, `zigzag_unshard`, `contiguous_shard`, `contiguous_unshard`: the layouts.
- `zigzag_ring_flash_attn_func`, `ring_flash_attn_func`: ring-flash-attn's functions, (B, N, H, D).

The process group is an argument everywhere (default: the world). Every call first agrees with the other
ranks on shapes and options, so that a bad input on one rank raises a ValueError on all of them instead
of leaving the others waiting in a collective.
"""

from .layout import contiguous_shard, contiguous_unshard, zigzag_shard, zigzag_unshard
from .ring import ring_attention, ring_flash_attn_func, zigzag_ring_flash_attn_func
from .ulysses import ulysses_attention

__all__ = ["contiguous_shard", "contiguous_unshard", "ring_attention", "ring_flash_attn_func", "ulysses_attention",
           "zigzag_ring_flash_attn_func", "zigzag_shard", "zigzag_unshard"]
