"""Tensor descriptors for Hopper's TMA copy engine: whether a call's tensors can have them, and making them.

Triton's launcher encodes every descriptor on the host at every launch (~10 µs for four on the H200
machine's CPU). They are made here without TensorDescriptor's __post_init__, which checks again what
`tma_strides` checked, at ~5 µs a descriptor: a backward makes ten.
"""

from __future__ import annotations

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from .arguments import cuda_properties


def _descriptor_strides(t: torch.Tensor) -> list[int]:
    """The strides a (B, H, N, D) descriptor of `t` gets. A dim of size 1 is only ever indexed at 0, so
    an unaligned stride there (a view's leftover) is replaced by the packed one."""
    strides = list(t.stride())
    strides[-1] = 1
    for i in range(len(strides) - 2, -1, -1):
        if t.shape[i] == 1 and (strides[i] * t.element_size()) % 16 != 0:
            strides[i] = strides[i + 1] * t.shape[i + 1]
    return strides


def tma_strides(*tensors: torch.Tensor) -> list[list[int]] | None:
    """Each tensor's descriptor strides if all of them can be read through TMA, else None. TMA needs a
    Hopper GPU (or the interpreter, which emulates it), 16-byte aligned base addresses, 16-byte multiples
    for every stride but the last, and non-empty dims."""
    device = tensors[0].device
    if device.type == "cuda" and cuda_properties(device.index).major < 9:
        return None
    all_strides = []
    for t in tensors:
        strides, size = _descriptor_strides(t), t.element_size()
        if t.numel() == 0 or t.data_ptr() % 16 or any(st * size % 16 for st in strides[:-1]):
            return None
        all_strides.append(strides)
    return all_strides


def descriptor(t: torch.Tensor, strides: list[int], block_shape: list[int],
               shape: list[int] | None = None) -> TensorDescriptor:
    """TensorDescriptor(t, shape (None: t.shape), strides, block_shape, padding="zero") without its
    __post_init__ checks."""
    desc = object.__new__(TensorDescriptor)
    desc.base, desc.shape, desc.strides, desc.block_shape, desc.padding = (
        t, list(t.shape) if shape is None else shape, strides, block_shape, "zero")
    return desc


def attention_descriptors(tensors: tuple, strides: list[list[int]] | None, tile: tuple[int, int] | None,
                          bd: int) -> tuple:
    """(B, H, N, D) descriptors of (q, k, v, o or dO) at tile (BLOCK_M, BLOCK_N): Q's and O's (dO's) boxes
    are one head's [BLOCK_M, bd] rows, K's and V's [BLOCK_N, bd] (the rule that launch/autotune.py's
    WithDescriptorBoxes applies per autotuned launch); Nones without a tile, or without the strides of
    tensors that passed `tma_strides`."""
    if tile is None or strides is None:
        return (None,) * len(tensors)
    block_m, block_n = tile
    return tuple(descriptor(t, st, [1, 1, rows, bd])
                 for t, st, rows in zip(tensors, strides, (block_m, block_n, block_n, block_m), strict=True))


def statistics_descriptors(lse2: torch.Tensor, delta: torch.Tensor, block_m: int) -> tuple:
    """(B, H, N) descriptors of the backward's per-row statistics with [1, 1, BLOCK_M] boxes (their rows
    are padded to 16 bytes for TMA: launch/backward.py)."""
    return tuple(descriptor(t, list(t.stride()), [1, 1, block_m]) for t in (lse2, delta))
