"""Dropout's Philox key, and the mask and probabilities a call used (a testing aid, `return_attn_probs`)."""

from __future__ import annotations

import torch

from .. import _interpreter
from .arguments import cdiv
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
            seed, keep, heads, seqlen_q, seqlen_k, dropout_p, BLOCK_M=32, BLOCK_N=32)
    return keep.bool()


def attention_probs(q: torch.Tensor, k: torch.Tensor, is_causal: bool, options: dict) -> torch.Tensor:
    """The (B, Hq, Nq, Nk) float32 probabilities a call on 4-D q, k used (after dropout and its
    1 / (1 - p) scaling, 0 where dropped), recomputed with the reference and the kernels' dropout mask.
    `options`: the call's checked keywords (autograd.checked_options)."""
    from ..reference import attention_ref
    q, k = q.float(), k.float()
    keep = None
    dropout_p = options.get("dropout_p", 0.0)
    if dropout_p > 0:
        keep = dropout_mask(options["dropout_seed"], q.shape[0], q.shape[1], q.shape[2], k.shape[2], dropout_p)
    _, _, probs = attention_ref(q, k, k, is_causal=is_causal, scale=options["scale"], upcast=False,
                                window_size=options.get("window", (-1, -1)), softcap=options.get("softcap", 0.0),
                                alibi_slopes=options.get("alibi_slopes"), dropout_p=dropout_p, dropout_mask=keep,
                                return_probs=True)
    return probs
