"""ring-flash-attn (github.com/zhuzilin/ring-flash-attention, `pip install ring-flash-attn`), the peer of the
`cp` suite, run on flashtriton's kernels.

Its ring functions call FlashAttention-2's private block functions, `_flash_attn_forward` and
`_flash_attn_backward` (flash_attn >= 2.6's signatures), through `from flash_attn.flash_attn_interface import`.
flash_attn is not installed on the H200 machine, and would be another kernel anyway; here those two names
are flashtriton's kernels, so that the suite compares two rings (how each passes K, V and their gradients,
merges blocks, and overlaps its transfers) over the same attention underneath.

The package's `__init__` also imports its varlen and Hugging Face modules (more of flash_attn, transformers),
so `load_zigzag_ring` imports only the modules it needs, from the installed package's directory, with a
`flash_attn` module of these two functions in place while they import.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Callable

import torch

from .. import ops


def _supported(dropout_p, alibi_slopes) -> None:
    """The peer's block calls are the flags flashtriton's ring takes (ring_attention has neither dropout
    nor ALiBi), so that the suite compares like with like."""
    if dropout_p:
        raise NotImplementedError(f"the ring-flash-attn peer takes dropout_p=0, got dropout_p={dropout_p}: "
                                  "compare rings without dropout (ring_attention has none either)")
    if alibi_slopes is not None:
        raise NotImplementedError("the ring-flash-attn peer takes alibi_slopes=None, got a tensor of shape "
                                  f"{tuple(alibi_slopes.shape)}: ring_attention has no ALiBi either "
                                  "(ulysses_attention takes it)")


def _flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, window_size_left=-1, window_size_right=-1,
                        softcap=0.0, alibi_slopes=None, return_softmax=False):
    """flash_attn's block forward on (B, N, H, D) views: (out (B, N, H, D), softmax_lse (B, H, N) float32,
    None, None)."""
    _supported(dropout_p, alibi_slopes)
    o, lse = ops.attention(*(x.transpose(1, 2) for x in (q, k, v)), None, None, 0, 0, causal, softmax_scale,
                           window_size_left, window_size_right, softcap, None, 0.0, None)
    return o.transpose(1, 2), lse, None, None


def _flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal,
                         window_size_left=-1, window_size_right=-1, softcap=0.0, alibi_slopes=None,
                         deterministic=False, rng_state=None):
    """flash_attn's block backward: writes the block's gradients into dq, dk, dv, (B, N, H, D) each."""
    _supported(dropout_p, alibi_slopes)
    grads = ops.backward_impl(*(x.transpose(1, 2) for x in (dout, q, k, v, out)), softmax_lse.contiguous(), None,
                              None, 0, 0, causal, softmax_scale, window_size_left, window_size_right, softcap, None,
                              0.0, None, deterministic, True, True)
    for buffer, grad in zip((dq, dk, dv), grads, strict=True):
        buffer.copy_(grad.transpose(1, 2))


def load_zigzag_ring() -> Callable[..., torch.Tensor] | None:
    """ring-flash-attn's `zigzag_ring_flash_attn_func` over flashtriton's kernels, or None where the package
    is not installed. It takes q, k, v (B, n, H, D), a rank's zigzag shard, as flashtriton's function of
    the same name does."""
    found = importlib.util.find_spec("ring_flash_attn")
    if found is None or not found.submodule_search_locations:
        return None
    interface = types.ModuleType("flash_attn.flash_attn_interface")
    interface._flash_attn_forward, interface._flash_attn_backward = _flash_attn_forward, _flash_attn_backward
    flash_attn = types.ModuleType("flash_attn")
    flash_attn.flash_attn_interface = interface
    package = types.ModuleType("ring_flash_attn")  # its directory, without running its __init__
    package.__path__ = list(found.submodule_search_locations)
    stand_ins = {"flash_attn": flash_attn, "flash_attn.flash_attn_interface": interface, "ring_flash_attn": package}
    names = [*stand_ins, "ring_flash_attn.utils", "ring_flash_attn.zigzag_ring_flash_attn"]
    before = {name: sys.modules.get(name) for name in names}
    sys.modules.update(stand_ins)
    try:
        module = importlib.import_module("ring_flash_attn.zigzag_ring_flash_attn")
    finally:  # the stand-ins leave with the import; the module keeps what it imported
        for name, old in before.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    return module.zigzag_ring_flash_attn_func
