"""The Gluon backward kernel's launcher (kernels/gluon_backward.py), and which calls it takes.

attention_backward (launch/backward.py) runs the statistics launch as always; for a plain call (no
window, softcap, ALiBi, dropout or packed batch, no forced tiles) that `gluon_backward_selected` accepts,
the Gluon kernel replaces the Triton dK/dV kernel, in the same recorded plan (a repeated call replays it:
gluon_dkdv_spec). The environment variable FLASHTRITON_BACKWARD picks the path: "triton", "gluon" (every
call it supports) or "auto" (the default: the Gluon kernel where it was measured faster,
gluon_backward_selected). Unless the call asks for a deterministic backward (`deterministic=True`, or
torch.use_deterministic_algorithms), the Gluon kernel also computes dQ, added into a float32 buffer by TMA
reductions (not bitwise reproducible, as FlashAttention-2's and -3's default backward); otherwise dQ comes
from the Triton dQ kernel.

Tiles: two compute warpgroups of KEYS = 64 keys each (128 keys per program), query blocks of BLOCK_M rows
(64 at D = 128; 128 at D = 64, FlashAttention-4's tile there), NUM_STAGES = 2 stages of Q and dO (2 x 32 KB
at D = 128, with K and V's 64 KB: 128 KB of shared memory per block; with dQ, two buffers of dS^T and the
float32 tiles on their way to the reduction: 192 KB). At D = 256 the two warpgroups share one tile of 64
keys and split D's columns of dK and dV (the kernel's module docstring): K and V 64 KB, the ring 128 KB
(dO in column halves), P^T and dS^T 32 KB; dQ^T of each warpgroup's own queries staged in the dO half its
dV has read. On an H100 it passed the GPU tests and ran 2.75-3.10x the Triton backward, 0.90-0.94x cuDNN's
(docs/performance.md, entries 106-107; the H200 has not run it yet).
"""

from __future__ import annotations

import torch

from ..kernels.dq_fragments import dq_from_fragments_kernel
from .arguments import COMPILE_OPTIONS, LOG2E, cdiv
from .gluon_forward import gluon_forward_supports, gluon_ran, path_from_environment
from .runner import LaunchSpec

# Query rows per block, by head dim: at D = 64 the products of 64-row blocks are too short to hide the
# softmax between them (docs/performance.md, entry 69); at D = 128, 128 rows would not fit in shared memory.
BLOCK_M = {64: 128, 128: 64, 256: 64}
KEYS = 64
WARPGROUPS = 2
# Head dims where auto takes the kernel's deterministic form (dK and dV alone, dQ from the Triton dQ kernel):
# where it is faster than the Triton backward (at D = 64 and 128 it is not: entry 69).
DETERMINISTIC_HEAD_DIMS = (256, )
# dQ's columns per TMA reduction at D = 256, where each compute warpgroup adds dQ^T = K^T dS^T for its 32
# queries in chunks of 64 of D's rows (wgmma's M).
SPLIT_DQ_CHUNK = 64
NUM_STAGES = 2
# Registers per thread (at launch, each compute thread's after setmaxnreg): the two compute warpgroups hold
# dK and dV (64 x D fp32 each: 64 registers apiece at D = 128) across the loop, S^T and dP^T (64 x 64: 32
# each) per block; the loader's 4 warps keep 24.
REGISTERS = (168, 240)

BACKWARD_PATH_VARIABLE = "FLASHTRITON_BACKWARD"
# Where "auto" takes the Gluon backward (dQ by TMA reductions): AUTO_MIN_KEYS maps (head dim, causal) to the
# fewest keys, from benchmarks/gluon_backward_ab.py and gluon_kernel_ab.py on the H200 (docs/performance.md,
# entries 69, 75 and 82): without a mask 1.07x the Triton backward at D = 128 from 512 keys and at D = 64
# 1.16x at 2048 (0.78x at 1024, before entry 82); causal 1.06x at D = 128 from 1024, and at D = 64 1.12x
# at 4096 and 1.19x at 16384, 1.005x at 2048. At D = 256 (its own form) 2.75-3.10x the Triton backward from
# 2048 keys, causal or not, and without dQ 2.2-2.4x, on an H100 (entries 106-107; shorter calls not measured).
AUTO_MIN_KEYS = {(128, False): 512, (128, True): 1024, (64, False): 2048, (64, True): 4096,
                 (256, False): 2048, (256, True): 2048}
# dQ's float32 buffer in the accumulator's register order (kernels/dq_fragments.py), put back in place by
# dq_from_fragments_kernel, rather than laid out like dQ: conflict-free 16-byte staging stores, 1.05-1.08x
# at D = 128 and at D = 64 without a mask, even at D = 64 causal (docs/performance.md, entry 73).
# attention_backward reads it once per call; False keeps the other order (and the A/B forms that need it:
# other query blocks, dQ split by rows).
DQ_FRAGMENTS = True
# Head dims where S^T's and dP^T's products start from the rows' statistics, -L / (scale * log2(e)) and -D
# (the kernel's STATS_IN_ACC), instead of zeros: L's and D's reads and the subtraction of D leave the paths
# from the products' waits to P^T and dS^T. At D = 128, D alone 1.02-1.03x in two calls on an H100, then L
# too 1.05-1.07x more without a mask and 1.01-1.02x causal; at D = 64 0.96-1.00x, and 0.98-1.00x with the
# statistics launch writing them pre-scaled (docs/performance.md, entries 131-134). The D = 256 form does
# not take it (its dP^T is summed over dO's column halves).
STATS_IN_ACCUMULATORS = (128, )
# dQ's TMA reductions issued by the loader partition, which the compute warpgroups hand each block's staged
# share to through named barriers (the kernel's DQ_BY_LOADER; FlashAttention-3's and -4's dQ writer), rather
# than by each compute warpgroup after two barriers across its own warps. Off until raced on a GPU
# (docs/performance.md, entry 144).
DQ_BY_LOADER = False


def splits_columns(head_dim: int) -> bool:
    """Whether the kernel takes its D = 256 form here (kernels/gluon_backward.py, _split_query_block): one key
    tile shared by both compute warpgroups, D's columns of dK and dV split between them, dO in column
    halves, each warpgroup's dQ^T staged in its half."""
    return head_dim > 128


def dq_in_fragments(head_dim: int) -> bool:
    """Whether attention_backward's dQ buffer is in register order at this head dim: DQ_FRAGMENTS, except in
    the D = 256 form, whose staging goes through dO's swizzled halves as dQ lies (dq_share)."""
    return DQ_FRAGMENTS and not splits_columns(head_dim)


def program_keys(head_dim: int) -> int:
    """Keys per program: KEYS for each compute warpgroup, or at D = 256 one tile of KEYS that they share."""
    return KEYS if splits_columns(head_dim) else WARPGROUPS * KEYS


def backward_path() -> str:
    """The path FLASHTRITON_BACKWARD asks for: "auto" (unset), "triton" or "gluon"."""
    return path_from_environment(BACKWARD_PATH_VARIABLE, "backward")


def gluon_backward_selected(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, is_causal: bool,
                            deterministic: bool = False) -> bool:
    """Whether a plain backward of these (B, H, N, D) tensors runs on the Gluon kernel: on a CUDA device, at
    D = 64, 128 or 256 (BLOCK_M's), where the Gluon forward's conditions (dtype, TMA-aligned strides, sm_90,
    a Triton whose Gluon the kernels compile under) hold for q, k, v and dO: with FLASHTRITON_BACKWARD=gluon
    always; with "auto" (the default) where it was measured faster than the Triton kernels (AUTO_MIN_KEYS),
    under a Triton release the kernels ran on (gluon_ran), and for a `deterministic` backward only where its
    form without dQ (dK and dV, one writer each, beside the Triton dQ kernel) is faster than the Triton
    backward: at DETERMINISTIC_HEAD_DIMS (D = 256)."""
    path = backward_path()
    if q.device.type != "cuda" or path == "triton" or q.shape[-1] not in BLOCK_M:
        return False
    if path == "auto" and ((deterministic and q.shape[-1] not in DETERMINISTIC_HEAD_DIMS) or not gluon_ran()
                           or k.shape[2] < AUTO_MIN_KEYS.get((q.shape[-1], is_causal), float("inf"))):
        return False
    return gluon_forward_supports(q, k, v) and gluon_forward_supports(do, k, v)


def dkdv_form(dq_atomic: bool, split_rows: bool = False, fragments: bool = False) -> str:
    """How the dK/dV kernel's tiles are named after its blocks (gluon_dkdv_spec's `tiles`, inspect's
    reports): "-dq-atomic" with dQ by TMA reductions, then its buffer's form, "-split-rows" and/or
    "-fragments"."""
    return "".join(name for name, on in (("-dq-atomic", dq_atomic), ("-split-rows", split_rows),
                                         ("-fragments", fragments)) if on)


def split_dq_by_rows(head_dim: int, block_m: int | None = None) -> bool:
    """The library's split of a query block's dQ between the compute warpgroups: by rows where each gets 64
    of them (D = 64's 128-row blocks: FlashAttention-4's split there, wgmma at N = 64 over all of D), by
    D's columns otherwise. In register order, rows ran 1.02-1.11x columns on five D = 64 shapes, causal
    or not, in two calls (docs/performance.md, entry 82)."""
    block_m = BLOCK_M[head_dim] if block_m is None else block_m
    return block_m == WARPGROUPS * 64


def dq_share(head_dim: int, block_m: int | None = None, split_rows: bool | None = None) -> tuple[int, int]:
    """(rows, cols) of each compute warpgroup's share of a query block's dQ: all the block's rows and half
    of D, or with `split_rows` half the rows and all of D (None: the library's, split_dq_by_rows). At
    D = 256 always the rows of the warpgroup's own queries (32), added in chunks of SPLIT_DQ_CHUNK columns."""
    block_m = BLOCK_M[head_dim] if block_m is None else block_m
    if splits_columns(head_dim):
        return block_m // WARPGROUPS, head_dim
    split_rows = split_dq_by_rows(head_dim, block_m) if split_rows is None else split_rows
    return (block_m // WARPGROUPS, head_dim) if split_rows else (block_m, head_dim // WARPGROUPS)


def dq_accumulator_shape(q_shape: tuple, fragments: bool, block_m: int | None = None,
                         split_rows: bool | None = None) -> tuple:
    """The shape of the float32 buffer the Gluon kernel adds dQ into, for q of `q_shape` (B, Hq, Nq, D): q's,
    or with `fragments` one chunk per (batch, head, query block, compute warpgroup), (B * Hq * cdiv(Nq,
    block_m), WARPGROUPS, rows, cols), each in the accumulator's register order."""
    if not fragments:
        return tuple(q_shape)
    batch, heads, seqlen_q, head_dim = q_shape
    block_m = BLOCK_M[head_dim] if block_m is None else block_m
    return (batch * heads * cdiv(seqlen_q, block_m), WARPGROUPS, *dq_share(head_dim, block_m, split_rows))


def dq_accumulator(q: torch.Tensor, fragments: bool, block_m: int | None = None,
                   split_rows: bool | None = None) -> torch.Tensor:
    """That buffer (dq_accumulator_shape), zeroed."""
    return torch.zeros(dq_accumulator_shape(q.shape, fragments, block_m, split_rows), device=q.device,
                       dtype=torch.float32)


def dq_fragments_spec(dq: torch.Tensor, dq_acc: torch.Tensor, scale: float) -> LaunchSpec:
    """dq_from_fragments_kernel's launch, which writes dq (B, Hq, Nq, D) in its own dtype from dq_accumulator's
    buffer in register order, times the softmax `scale`, once the Gluon kernel has run: attention_backward
    records it with that kernel, so that a replayed backward puts dQ back in place without a launch through
    Triton. A share with all of D's columns is a split by rows."""
    chunks, _, rows, cols = dq_acc.shape
    batch, heads, seqlen_q, head_dim = dq.shape
    return LaunchSpec("dq_fragments", dq_from_fragments_kernel, lambda meta: (chunks * WARPGROUPS, ), (dq_acc, dq),
                      (), (*dq.stride()[:3], heads, chunks // (batch * heads), seqlen_q, scale),
                      dict(ROWS=rows, COLS=cols, WARPGROUPS=WARPGROUPS, SPLIT_ROWS=cols == head_dim))


def gluon_dkdv_launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, lse2: torch.Tensor,
                      delta: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, is_causal: bool, scale: float,
                      dq_acc: torch.Tensor | None = None, stages: int = NUM_STAGES,
                      block_m: int | None = None, dq_split_rows: bool | None = None,
                      dq_fragments: bool = False, stats_in_acc: bool | None = None,
                      delta_in_acc: bool = True, dq_by_loader: bool | None = None) -> tuple:
    """(kernel, grid, args, kwargs) of the call that writes dk and dv (like k and v) from the statistics
    launch's lse2 (L * log2(e)) and delta (rowsum(dO * O)), float32 (B, Hq, Nq) views with a padded row
    stride: launched through gluon_dkdv_spec, compiled offline by tools/inspect.py. With `dq_acc` (float32
    (B, Hq, Nq, D) contiguous, zeros), the kernel also adds dQ / scale into it by TMA reductions (its
    DQ_ATOMIC form, which attention_backward takes outside torch.use_deterministic_algorithms; the pass that
    reads the buffer back multiplies by the scale: dq_fragments_spec, or attention_backward's copy). `stages`
    and `block_m` (the query rows per block, BLOCK_M[head dim] unless given) are there for A/B runs, and so
    is `dq_split_rows` (None: the library's, split_dq_by_rows): with 128-row blocks each compute warpgroup
    can take half of dQ's rows with all of D (wgmma at N = 64), or half of D's columns for all the rows
    (N = 32 at D = 64). `dq_fragments`: dq_acc is dq_accumulator's buffer in register order (DQ_FRAGMENTS,
    the library's). `stats_in_acc`: S^T's and dP^T's products start from -L / (scale * log2(e)) and -D
    (None: where STATS_IN_ACCUMULATORS has the head dim); with `delta_in_acc` False only S^T's, D then
    subtracted after dP^T's product (an A/B form: docs/performance.md, entry 142). `dq_by_loader`: with
    `dq_acc`, the loader partition issues the dQ reductions that the compute warpgroups stage (the kernel's
    DQ_BY_LOADER; None: DQ_BY_LOADER's, below D = 256)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from ..kernels.gluon_backward import attn_bwd_dkdv_gluon_kernel

    batch, heads, seqlen_q, head_dim = q.shape
    kv_heads, seqlen_k = k.shape[1], k.shape[2]
    element = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16

    def descriptor(x: torch.Tensor, rows: int, cols: int = head_dim):
        box = [1, 1, rows, cols]
        return TensorDescriptor.from_tensor(x, box, gl.NVMMASharedLayout.get_default_for(box, element))
    if lse2.stride(-1) != 1 or delta.stride() != lse2.stride() or lse2.stride(-2) % 4:
        raise ValueError("lse2 and delta must share one layout with contiguous rows 16-byte aligned for TMA "
                         "(backward.statistics_buffer)")
    if head_dim not in BLOCK_M:
        raise ValueError(f"the Gluon backward takes head dims {tuple(BLOCK_M)}, got {head_dim}; the Triton "
                         "kernels take the others (gluon_backward_selected)")
    block_m = BLOCK_M[head_dim] if block_m is None else block_m
    dq_split_rows = split_dq_by_rows(head_dim, block_m) if dq_split_rows is None else dq_split_rows
    rows, cols = dq_share(head_dim, block_m, dq_split_rows)
    if dq_acc is not None and dq_fragments and splits_columns(head_dim):
        raise ValueError(f"dq_fragments must be False at head dim {head_dim}: its dQ is staged as dQ lies "
                         "(dq_in_fragments)")
    if dq_acc is not None:
        wanted = dq_accumulator_shape(q.shape, dq_fragments, block_m, dq_split_rows)
        if dq_acc.dtype != torch.float32 or tuple(dq_acc.shape) != wanted or not dq_acc.is_contiguous():
            raise ValueError(f"dq_acc must be a contiguous float32 tensor of shape {wanted} (dq_accumulator), "
                             f"got {dq_acc.dtype} {tuple(dq_acc.shape)}")
    if block_m not in (64, 128) or (block_m == 128 and head_dim != 64):
        raise ValueError(f"block_m must be 64, or 128 at head dim 64 (shared memory), got {block_m} at head dim "
                         f"{head_dim}")
    if dq_split_rows and block_m != WARPGROUPS * 64:
        raise ValueError(f"dq_split_rows needs {WARPGROUPS * 64}-row query blocks (64 rows per compute "
                         f"warpgroup), got block_m={block_m}")
    if stats_in_acc is None:
        stats_in_acc = head_dim in STATS_IN_ACCUMULATORS
    if stats_in_acc and splits_columns(head_dim):
        raise ValueError(f"stats_in_acc must be False at head dim {head_dim}: that form sums dP^T over dO's "
                         "column halves")
    if dq_by_loader and (dq_acc is None or splits_columns(head_dim)):
        given = "None" if dq_acc is None else "a buffer"
        raise ValueError(f"dq_by_loader needs dq_acc and a head dim up to 128 (got dq_acc={given}, head dim "
                         f"{head_dim}); leave it None for the library's choice")
    if dq_by_loader is None:
        dq_by_loader = DQ_BY_LOADER and dq_acc is not None and not splits_columns(head_dim)
    max_registers, compute_registers = REGISTERS
    num_n_blocks = cdiv(seqlen_k, program_keys(head_dim))
    dq_desc = None
    if dq_acc is not None:  # each compute warpgroup reduces its share
        if dq_fragments:  # a share is one chunk, copied as it lies: no swizzle
            dq_desc = TensorDescriptor.from_tensor(dq_acc, [1, 1, rows, cols], gl.NVMMASharedLayout(
                swizzle_byte_width=0, element_bitwidth=32, rank=4))
        else:  # (at D = 256 a reduction adds SPLIT_DQ_CHUNK of the share's columns)
            box = [1, 1, rows, SPLIT_DQ_CHUNK if splits_columns(head_dim) else cols]
            dq_desc = TensorDescriptor.from_tensor(dq_acc, box, gl.NVMMASharedLayout.get_default_for(box, gl.float32))
    box = [1, 1, block_m]
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3)
    stats_descs = (TensorDescriptor(x, list(x.shape), list(x.stride()), box, layout) for x in (lse2, delta))
    # dO at D = 256 in column halves: each compute warpgroup's dV reads one, then stages its dQ there
    do_cols = head_dim // WARPGROUPS if splits_columns(head_dim) else head_dim
    args = (dk, dv, descriptor(q, block_m), descriptor(k, KEYS), descriptor(v, KEYS), descriptor(do, block_m, do_cols),
            *stats_descs, dq_desc, *dk.stride()[:3], *dv.stride()[:3], num_n_blocks, kv_heads, heads // kv_heads,
            seqlen_q, seqlen_k, scale, scale * LOG2E, WARPGROUPS, stages, is_causal, dq_acc is not None,
            dq_fragments, stats_in_acc, compute_registers, stats_in_acc and not delta_in_acc, dq_by_loader)
    return attn_bwd_dkdv_gluon_kernel, (num_n_blocks * batch * kv_heads, ), args, dict(num_warps=4,
                                                                                       maxnreg=max_registers,
                                                                                       **COMPILE_OPTIONS)


def gluon_dkdv_spec(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, lse2: torch.Tensor,
                    delta: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, is_causal: bool, scale: float,
                    dq_acc: torch.Tensor | None = None, dq_fragments: bool = False) -> LaunchSpec:
    """The Gluon kernel's launch as attention_backward runs it (runner.run, which records it for replay):
    dk and dv are its per-call tensors, and the descriptors over (q, k, v, do, lse2, delta[, dq_acc]) are
    rebuilt on a replay from those sources, in that order."""
    kernel, grid, args, kwargs = gluon_dkdv_launch(q, k, v, do, lse2, delta, dk, dv, is_causal, scale, dq_acc,
                                                   dq_fragments=dq_fragments)
    descriptors = 6 if dq_acc is None else 7  # (without dQ, its None descriptor stays among the scalars)
    block_m = args[2].block_shape[2]  # (Q's box: an A/B run may have asked for other blocks)
    split_rows = dq_acc is not None and args[8].block_shape[3] == q.shape[-1]  # (dQ's box: a share's columns)
    form = dkdv_form(dq_acc is not None, split_rows, dq_fragments)
    tiles = f"gluon-N{KEYS}x{program_keys(q.shape[-1]) // KEYS}-M{block_m}-s{NUM_STAGES}{form}"
    return LaunchSpec("gluon_dkdv", kernel, lambda meta: grid, args[:2], args[2:2 + descriptors],
                      args[2 + descriptors:], {}, kwargs, tiles)
