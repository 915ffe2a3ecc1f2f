"""The Gluon operations the kernels use whose names moved between Triton releases, each bound once here
to what the installed Triton spells (issue 21: the Hopper path for the Triton that users' torch brings).

Gluon is experimental and renames as it goes: Triton 3.7 renamed `thread_barrier` to `barrier`; Triton 3.8
renamed the TMA copies (`async_copy_global_to_shared` to `async_load`, `async_copy_shared_to_global` to
`async_store`; 3.9 keeps the old names only to raise) and added `async_atomic_add`, the TMA reduction
that the backward's dQ takes, which before it is reached through the builder (`_reduce_add_builder`);
Triton 3.9 made a shared-memory descriptor's `_reinterpret` public as `reinterpret`.
The kernels call the names below; which release they map to is decided when this module is imported,
by what the Gluon module has, not by version strings.
"""

from triton._C.libtriton import ir
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import tma


@builtin
def _reduce_add_builder(tensor_desc, coord, src, _semantic=None):
    """Add the shared-memory tile `src` into the global tile of `tensor_desc` at `coord`, asynchronously, by
    TMA (cp.reduce.async.bulk.tensor .add), through the builder: Triton 3.6 and 3.7 have the operation, but
    their Gluon spells out only the plain copies. Completion is awaited as a copy's: tma.store_wait."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@builtin
def reinterpret(smem, dtype, shape, layout, _semantic=None):
    """The shared-memory descriptor `smem` seen as another dtype, shape and layout over the same bytes."""
    method = smem.reinterpret if hasattr(smem, "reinterpret") else smem._reinterpret
    return method(dtype, shape, layout, _semantic=_semantic)


# a barrier across the calling partition's warps (the CTA's outside warp_specialize)
thread_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier
# TMA: a tile from global to shared memory, arriving on an mbarrier; a tile from shared to global memory;
# a tile added into global memory (the backward's dQ)
tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global
tma_reduce_add = tma.async_atomic_add if hasattr(tma, "async_atomic_add") else _reduce_add_builder
