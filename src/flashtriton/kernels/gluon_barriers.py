"""Named barriers between warpgroups of the Gluon kernels (issue 21): the hardware's `bar.sync` and
`bar.arrive` on a barrier id and a count of threads, as FlashAttention-3 meets its warpgroups (here the
backward's two compute warpgroups, once their dS^T is in shared memory, and its ring's stages handed back
to the loader). Triton 3.6's Gluon has mbarriers in shared memory, whose arrive costs a barrier across the
arriving warpgroup's four warps and whose wait polls memory; a named barrier is one instruction. Gluon has
no spelling for it, so it is inline PTX, run once by each of a warpgroup's 128 threads.

Ids: Triton's warp specialisation numbers its partitions' own barriers from 1 (one per partition), so
the ids used here count down from the hardware's last, 15."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _per_thread(value):
    """`value` once in each thread of a 4-warp partition: the operand that makes an inline-asm statement
    run once per thread."""
    return gl.full([128], value, gl.int32, gl.BlockedLayout([1], [32], [4], [0]))


@gluon.jit
def named_barrier_sync(barrier, threads):
    """Wait at named barrier `barrier` until `threads` threads (this warpgroup's 128 among them) have
    arrived or synced on it."""
    gl.inline_asm_elementwise("bar.sync $1, $2;\n\tmov.u32 $0, 0;", "=r,r,r",
                              [_per_thread(barrier), _per_thread(threads)], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def named_barrier_arrive(barrier, threads):
    """Arrive at named barrier `barrier` (counting `threads` threads, this warpgroup's 128 among them) and go
    on without waiting: how a warpgroup hands a buffer back to the partition that syncs there."""
    gl.inline_asm_elementwise("bar.arrive $1, $2;\n\tmov.u32 $0, 0;", "=r,r,r",
                              [_per_thread(barrier), _per_thread(threads)], dtype=gl.int32, is_pure=False, pack=1)
