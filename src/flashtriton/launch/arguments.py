"""The scalar arguments every attention kernel takes, computed on the host from the tensors and options.

These run on every call's host path (replays aside), so they stay plain: tuples, no views, no Triton
helpers (triton.cdiv alone costs ~5 µs a call).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

LOG2E = math.log2(math.e)
# The compile options every launch names rather than leaving to Triton's defaults: the kernels count on
# FMA contraction (the softmax's scale folds into exp2's FMA), which Triton 3.9 warns its default turns
# off in 3.10. Under Triton 3.6-3.9 naming it compiles the same code.
COMPILE_OPTIONS = {"enable_fp_fusion": True}


class Varlen(NamedTuple):
    """A packed batch of variable-length sequences: sequence b is rows cu_seqlens_q[b]:cu_seqlens_q[b + 1]
    of q (and likewise for k, v), at most max_seqlen_q (max_seqlen_k) long. The launchers then take q as
    the (1, Hq, total_q, D) view of the packed (total_q, Hq, D) tensor, and lse is (1, Hq, total_q)."""
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): triton.next_power_of_2 in plain Python, which the
    host path of every decoding step calls; Triton's is a constexpr function, several µs a call."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _fp32_matmul_uses_tf32() -> bool:
    """PyTorch's own setting for float32 matmuls. Read through `fp32_precision` where it exists: reading
    the legacy `allow_tf32` raises once a program has set the new API."""
    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", None)
    if precision is None:
        return bool(matmul.allow_tf32)
    if precision == "none":  # inherits the global setting
        precision = getattr(torch.backends, "fp32_precision", "ieee")
    return precision == "tf32"


def input_precision(dtype: torch.dtype) -> str:
    """tl.dot's input_precision: float32 follows PyTorch's matmul setting; 16-bit inputs ignore it."""
    if dtype == torch.float32 and not _fp32_matmul_uses_tf32():
        return "ieee"
    return "tf32"


@functools.cache
def cuda_properties(index: int):
    return torch.cuda.get_device_properties(index)


def sm_count(x: torch.Tensor) -> int:
    """The SMs of x's GPU; an H200's 132 off the GPU (the interpreter, offline compiles), where the grids
    are sized as there."""
    return cuda_properties(x.get_device()).multi_processor_count if x.is_cuda else 132


def band(is_causal: bool, window: tuple[int, int]) -> tuple[bool, bool, int, int]:
    """(MASK_LEFT, MASK_RIGHT, window_left, window_right) for the kernels. Query i sees key j iff
    i + d - left <= j <= i + d + right with d = Nk - Nq, a side with -1 being unbounded; causal caps the
    right side at 0 (the band is the intersection of both masks)."""
    left, right = window
    if is_causal:
        right = 0 if right < 0 else min(right, 0)
    return left >= 0, right >= 0, max(left, 0), max(right, 0)


def score_mods(scale: float, softcap: float, alibi_slopes: torch.Tensor | None) -> tuple[float, float, int]:
    """The kernels' (softcap_scale, softcap_log2, stride_alibi_b): scores become softcap * tanh(s / softcap),
    computed as softcap_log2 * tanh(q.k * softcap_scale) in exp2's units; ALiBi slopes of shape (Hq,) are
    shared by every batch (stride 0)."""
    stride_b = 0 if alibi_slopes is None or alibi_slopes.dim() == 1 else alibi_slopes.stride(0)
    if softcap > 0:
        return scale / softcap, softcap * LOG2E, stride_b
    return 0.0, 0.0, stride_b


def variant_flags(is_causal: bool, window: tuple[int, int], softcap: float, alibi_slopes: torch.Tensor | None,
                  varlen: Varlen | None, dropout_p: float) -> tuple[dict, int, int, bool]:
    """The kernels' variant flags (constexprs), the band's two widths, and whether the launch takes the
    causal order (a band bounded on the right only). Flags that are off stay out of the dict: the kernels
    default them to False."""
    mask_left, mask_right, window_left, window_right = band(is_causal, window)
    flags = dict(MASK_LEFT=mask_left, MASK_RIGHT=mask_right, SOFTCAP=softcap > 0, ALIBI=alibi_slopes is not None)
    if varlen is not None:
        flags["VARLEN"] = True
    if dropout_p > 0:
        flags["DROPOUT"] = True
    return flags, window_left, window_right, mask_right and not mask_left


def plain_call(window: tuple[int, int], softcap: float, alibi_slopes: torch.Tensor | None, varlen: Varlen | None,
               dropout_p: float) -> bool:
    """Whether a call sets no variant (no window, softcap, ALiBi, packed batch or dropout): the calls the
    Gluon kernels take, which implement the plain causal or full mask only."""
    return (tuple(window) == (-1, -1) and not softcap and alibi_slopes is None and varlen is None
            and not dropout_p)


def heads_per_group(streamed: torch.Tensor, heads_per_stream: float, causal_order: bool) -> int:
    """How many (batch, head) pairs a causal launch groups together (kernels/common.py: program_tile): as
    many as have the tiles they stream fit in three quarters of the L2. Each pair streams two tensors
    shaped like `streamed`'s heads (K and V for the forward and dQ; Q and dO for dK/dV), shared by
    `heads_per_stream` pairs (the query heads of a GQA group share K and V; a dK/dV program streams Q and
    dO of its whole group: 1 / group size). Other launches (not `causal_order`: no band, or one bounded on
    the left) ignore it."""
    if not causal_order:
        return 1
    l2_bytes = cuda_properties(streamed.device.index).L2_cache_size if streamed.device.type == "cuda" else 50 * 2**20
    per_head = max(1, int(2 * streamed.shape[2] * streamed.shape[3] * streamed.element_size() / heads_per_stream))
    return max(1, 3 * l2_bytes // 4 // per_head)


def grid_dims(q: torch.Tensor, k: torch.Tensor, varlen: Varlen | None) -> tuple[int, int, int]:
    """(batch, query length, key length) the grid covers: a packed batch has one grid slice per
    sequence, as long as the longest."""
    if varlen is None:
        return q.shape[0], q.shape[2], k.shape[2]
    return len(varlen.cu_seqlens_q) - 1, varlen.max_seqlen_q, varlen.max_seqlen_k


def bhr_strides(*tensors: torch.Tensor, varlen: Varlen | None = None) -> tuple[int, ...]:
    """Each tensor's (batch, head, row) strides; a packed batch's are (0, head, row): each program finds
    its sequence's first row in cu_seqlens."""
    strides: tuple[int, ...] = ()
    for t in tensors:  # a loop, not a generator: this runs on every call's host path
        strides += t.stride()[:3] if varlen is None else (0, t.stride(1), t.stride(2))
    return strides


def variant_pointers(alibi_slopes: torch.Tensor | None, varlen: Varlen | None,
                     dropout_seed: torch.Tensor | None) -> tuple:
    """The variants' tensor arguments, None where off: ALiBi's slopes, the packed batch's cu_seqlens,
    dropout's Philox key."""
    if varlen is None:
        return alibi_slopes, None, None, dropout_seed
    return alibi_slopes, varlen.cu_seqlens_q, varlen.cu_seqlens_k, dropout_seed
