"""The product sums_by_mma runs in FP8, alone (docs/performance.md, entry 92): A (64, 128) float8 e4m3 from
registers, as P V's A operand (k_width 4), times B^T where B (N, 128) e4m3 sits in shared memory keys
contiguous, as the kernel's ones tile, into a (64, N) float32 accumulator; one warpgroup, one program. Run
with B = ones (the rows' sums) and with B random (which also checks B's addressing), N = 8, 16 and 128
(P V's width), against torch in float32 on the same e4m3 values; and the same in bf16 (k_width 2), where
sums_by_mma is right. Prints one line per case; on a machine without an sm_90 GPU, compiles each case for
sm_90 only.

    PYTHONPATH=src python benchmarks/fp8_thin_wgmma_probe.py
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

M, K = 64, 128


@gluon.jit
def thin_product_kernel(A, B, C, N: gl.constexpr, K: gl.constexpr, K_WIDTH: gl.constexpr,
                        INSTR_K: gl.constexpr):
    M: gl.constexpr = 64
    blocked: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows = gl.arange(0, M, layout=gl.SliceLayout(1, blocked))
    cols = gl.arange(0, K, layout=gl.SliceLayout(0, blocked))
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, N, INSTR_K])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=K_WIDTH)
    a = gl.convert_layout(gl.load(A + rows[:, None] * K + cols[None, :]), a_layout)
    b_rows = gl.arange(0, N, layout=gl.SliceLayout(1, blocked))
    b = gl.load(B + b_rows[:, None] * K + cols[None, :])
    b_smem = gl.allocate_shared_memory(B.dtype.element_ty, [N, K],
                                       gl.NVMMASharedLayout.get_default_for([N, K], B.dtype.element_ty), b)
    fence_async_shared()
    gl.thread_barrier()
    acc = gl.zeros([M, N], gl.float32, layout=acc_layout)
    acc = warpgroup_mma(a, b_smem.permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    out_rows = gl.arange(0, M, layout=gl.SliceLayout(1, acc_layout))
    out_cols = gl.arange(0, N, layout=gl.SliceLayout(0, acc_layout))
    gl.store(C + out_rows[:, None] * N + out_cols[None, :], acc)


def case(dtype: torch.dtype, n: int, ones: bool, device: str) -> str:
    torch.manual_seed(n)
    a = torch.rand(M, K, device=device).to(dtype)  # probabilities in [0, 1), as P
    b = (torch.ones(n, K, device=device) if ones else torch.randn(n, K, device=device)).to(dtype)
    c = torch.full((M, n), float("nan"), device=device)
    fp8 = dtype == torch.float8_e4m3fn
    args = (a, b, c, n, K, 4 if fp8 else 2, 32 if fp8 else 16)
    name = f"{str(dtype).split('.')[-1]} N={n} B={'ones' if ones else 'random'}"
    if device != "cuda":
        from flashtriton.tools import inspect

        inspect.offline_sass(thin_product_kernel, (1, ), args, dict(num_warps=4))
        return f"{name}: compiled for sm_90"
    thin_product_kernel[(1, )](*args, num_warps=4)
    expected = a.float() @ b.float().T
    error = (c - expected).abs().max().item()
    return f"{name}: max error {error:.3g} (|expected| up to {expected.abs().max().item():.3g}) -> " \
           f"{'OK' if error <= 1e-3 * max(1.0, expected.abs().max().item()) else 'WRONG'}"


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for dtype in (torch.float8_e4m3fn, torch.bfloat16):
        for n in (8, 16, 128):
            for ones in (True, False):
                print(case(dtype, n, ones, device), flush=True)


if __name__ == "__main__":
    main()
