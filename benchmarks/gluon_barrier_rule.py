"""Where Triton's Gluon puts the warpgroup barriers (BAR.SYNC) of a ring's consumer loop, offline (no GPU):
a minimal warp-specialised kernel (a 1-warp TMA loader filling a ring of A and B tiles, one 4-warp
warpgroup that waits for each stage, multiplies it by wgmma and hands it back) compiled for sm_90 in six
forms, with the loop's barriers counted per stage in its SASS. The kernels are compiled, never launched.

Triton 3.6's barrier analysis counts an mbarrier wait as a read and a write of its barrier, and an arrive as
a write: a wait after a wait on the same array of barriers (the ring's stage is a run-time index, so two
stages are not told apart), or after any arrive, gets a barrier across the partition's warps, and so does
an arrive, which one thread issues for all. Named barriers (`bar.arrive`, kernels/gluon_barriers.py) are
inline assembly, which the analysis does not see. docs/performance.md, entry 116, reads the forward's loop
(two barriers per key block) against this.

    PYTHONPATH=src python benchmarks/gluon_barrier_rule.py
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from flashtriton.kernels.gluon_barriers import named_barrier_arrive
from flashtriton.kernels.gluon_releases import tma_load
from flashtriton.tools.inspect import innermost_wgmma_loop_opcodes, offline_sass

BLOCK_M, BLOCK_N, BLOCK_K, KEYS = 128, 128, 64, 1024
NAMED_RELEASE = gl.constexpr(15)  # the named barrier's id (kernels/gluon_barriers.py counts down from 15)
# form: (the consumer's release: "none", "mbarrier" or "named"; two rings, one per stage parity, with the
# loop unrolled by two so that each wait names its ring statically)
FORMS = {"one ring, no release": ("none", False), "one ring, mbarrier arrive": ("mbarrier", False),
         "one ring, named-barrier arrive": ("named", False), "two rings, no release": ("none", True),
         "two rings, mbarrier arrive": ("mbarrier", True), "two rings, named-barrier arrive": ("named", True)}


@gluon.jit
def _loader(a_desc, b_desc, a_bufs, b_bufs, ready, num_k):
    """Fills stage i % 2 of the ring with A's and B's K-slice i (no wait for a free stage, and `ready` for
    either ring: only the consumer's code is counted)."""
    for i in range(num_k):
        stage = i % 2
        bar = ready.index(stage)
        mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
        tma_load(a_desc, [0, i * a_desc.block_type.shape[1]], bar, a_bufs.index(stage))
        tma_load(b_desc, [i * b_desc.block_type.shape[0], 0], bar, b_bufs.index(stage))


@gluon.jit
def _stage(a_buf, b_buf, ready, phase, empty, acc, RELEASE: gl.constexpr):
    """One stage: wait for its copy, multiply, wait for the product, hand the stage back."""
    mbarrier.wait(ready, phase)
    acc = warpgroup_mma(a_buf, b_buf, acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    if RELEASE == "mbarrier":
        mbarrier.arrive(empty)
    if RELEASE == "named":
        named_barrier_arrive(NAMED_RELEASE, 160)
    return acc


@gluon.jit
def _consumer(a_bufs, b_bufs, ready, ready_odd, empty, c_ptr, num_k, RELEASE: gl.constexpr,
              TWO_RINGS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                     instr_shape=[16, BLOCK_N, 16])
    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout)
    if TWO_RINGS:
        for i in range(num_k // 2):
            acc = _stage(a_bufs.index(0), b_bufs.index(0), ready.index(0), i & 1, empty.index(0), acc, RELEASE)
            acc = _stage(a_bufs.index(1), b_bufs.index(1), ready_odd.index(0), i & 1, empty.index(1), acc, RELEASE)
    else:
        for i in range(num_k):
            stage = i % 2
            acc = _stage(a_bufs.index(stage), b_bufs.index(stage), ready.index(stage), (i // 2) & 1,
                         empty.index(stage), acc, RELEASE)
    rows = gl.arange(0, BLOCK_M, gl.SliceLayout(1, layout))
    cols = gl.arange(0, BLOCK_N, gl.SliceLayout(0, layout))
    gl.store(c_ptr + rows[:, None] * BLOCK_N + cols[None, :], acc)


@gluon.jit
def ring_kernel(a_desc, b_desc, c_ptr, num_k, RELEASE: gl.constexpr, TWO_RINGS: gl.constexpr):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[1]
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [2, BLOCK_M, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [2, BLOCK_K, BLOCK_N], b_desc.layout)
    # With TWO_RINGS, stage 1's barrier is an allocation of its own (ready_odd); else both are in `ready`.
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ready_odd = gl.allocate_shared_memory(gl.int64, [1 if TWO_RINGS else 2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for stage in gl.static_range(2):
        mbarrier.init(ready.index(stage), count=1)
        mbarrier.init(empty.index(stage), count=1)
    mbarrier.init(ready_odd.index(0), count=1)
    gl.warp_specialize([(_consumer, (a_bufs, b_bufs, ready, ready_odd, empty, c_ptr, num_k, RELEASE, TWO_RINGS,
                                     BLOCK_M, BLOCK_N)),
                        (_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, num_k))], [1], [24])


def barriers_per_stage(release: str, two_rings: bool) -> float:
    """BAR.SYNCs in the consumer's loop (the one innermost loop that issues wgmma) per ring stage it consumes."""
    a = torch.randn(BLOCK_M, KEYS, dtype=torch.bfloat16)
    b = torch.randn(KEYS, BLOCK_N, dtype=torch.bfloat16)
    a_desc = TensorDescriptor.from_tensor(a, [BLOCK_M, BLOCK_K],
                                          gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], gl.bfloat16))
    b_desc = TensorDescriptor.from_tensor(b, [BLOCK_K, BLOCK_N],
                                          gl.NVMMASharedLayout.get_default_for([BLOCK_K, BLOCK_N], gl.bfloat16))
    sass = offline_sass(ring_kernel, (1, ), (a_desc, b_desc, torch.empty(BLOCK_M, BLOCK_N), KEYS // BLOCK_K),
                        dict(RELEASE=release, TWO_RINGS=two_rings, num_warps=4))
    opcodes = innermost_wgmma_loop_opcodes(sass.splitlines())
    return sum(opcode.startswith("BAR.SYNC") for opcode in opcodes) / (2 if two_rings else 1)


def main() -> None:
    for name, (release, two_rings) in FORMS.items():
        print(f"{name:34s} {barriers_per_stage(release, two_rings):.1f} BAR.SYNC per stage", flush=True)


if __name__ == "__main__":
    main()
