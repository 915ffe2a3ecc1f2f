"""Dropout's Philox key, and the mask of the probabilities a call kept (a testing aid, `return_attn_probs`)."""

from __future__ import annotations

import torch

from .. import _interpreter
from .arguments import COMPILE_OPTIONS, cdiv
from .kernel_set import DEFAULT_KERNELS, Kernels


def new_dropout_seed(device: torch.device) -> torch.Tensor:
    """A Philox key drawn from torch's generator for `device` (so torch.manual_seed reproduces a run),
    left on the device: the kernels load it, and nothing waits for it on the host."""
    return torch.randint(0, 2**62, (1,), device=device, dtype=torch.int64)


def dropout_mask(seed: torch.Tensor, batch: int, heads: int, seqlen_q: int, seqlen_k: int, dropout_p: float,
                 kernels: Kernels = DEFAULT_KERNELS) -> torch.Tensor:
    """The boolean (B, Hq, Nq, Nk) mask of kept probabilities that the attention kernels draw for `seed`."""
    _interpreter.prepare(seed.device)
    keep = torch.empty((batch, heads, seqlen_q, seqlen_k), device=seed.device, dtype=torch.int8)
    if keep.numel():
        kernels.dropout_mask[(cdiv(seqlen_q, 32), cdiv(seqlen_k, 32), batch * heads)](
            seed, keep, heads, seqlen_q, seqlen_k, dropout_p, BLOCK_M=32, BLOCK_N=32, **COMPILE_OPTIONS)
    return keep.bool()
