"""The product sums_by_mma runs in FP8, alone (docs/performance.md, entry 92): A (64, 128) float8 e4m3 from
registers, as P V's A operand (k_width 4), times B^T where B (N, 128) e4m3 sits in shared memory keys
contiguous, as the kernel's ones tile, into a (64, N) float32 accumulator; one warpgroup, one program. Run
with B = ones (the rows' sums) and with B random (which also checks B's addressing), N = 8, 16 and 128
(P V's width), against torch in float32 on the same e4m3 values; and the same in bf16 (k_width 2), where
sums_by_mma is right. Then the kernel's own sequence (paired_products_kernel): a float32 P through
kernels/gluon_forward.py's _probabilities_operand and _issue_pv, P V and the sums issued back to back from
the same e4m3 registers, the ones tile written as the kernel writes it, in one warpgroup or in a worker
partition of gl.warp_specialize (the kernel's ones are written before it, by the default partition);
D = 64 and 128, FP8 and bf16. Prints one line per case; on a machine without an sm_90 GPU, compiles each
case for sm_90 only.

    PYTHONPATH=src python benchmarks/fp8_thin_wgmma_probe.py
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from flashtriton.kernels.gluon_forward import _issue_pv, _ones_tile, _probabilities_operand
from flashtriton.kernels.gluon_releases import thread_barrier

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
    thread_barrier()
    acc = gl.zeros([M, N], gl.float32, layout=acc_layout)
    acc = warpgroup_mma(a, b_smem.permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    out_rows = gl.arange(0, M, layout=gl.SliceLayout(1, acc_layout))
    out_cols = gl.arange(0, N, layout=gl.SliceLayout(0, acc_layout))
    gl.store(C + out_rows[:, None] * N + out_cols[None, :], acc)


@gluon.jit
def _paired_products(P, ACC, SUMS, v_smem, ones_smem, HEAD_DIM: gl.constexpr, FP8: gl.constexpr):
    """P (64, 128) float32 -> P V and P's sums, as one iteration of the kernel's loop issues them."""
    M: gl.constexpr = 64
    N: gl.constexpr = 128
    INSTR_K: gl.constexpr = 32 if FP8 else 16
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, N, INSTR_K])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, INSTR_K])
    l_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, 8, INSTR_K])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4 if FP8 else 2)
    rows = gl.arange(0, M, layout=gl.SliceLayout(1, s_layout))
    cols = gl.arange(0, N, layout=gl.SliceLayout(0, s_layout))
    p = gl.load(P + rows[:, None] * N + cols[None, :])
    p_op = _probabilities_operand(p, v_smem.dtype, p_layout, FP8)
    acc = gl.zeros([M, HEAD_DIM], gl.float32, layout=o_layout)
    sums = gl.zeros([M, 8], gl.float32, layout=l_layout)
    acc, sums = _issue_pv(p_op, v_smem, 0, acc, sums, ones_smem.permute((1, 0)), FP8, True)
    acc, sums = warpgroup_mma_wait(num_outstanding=0, deps=(acc, sums))
    o_rows = gl.arange(0, M, layout=gl.SliceLayout(1, o_layout))
    o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    gl.store(ACC + o_rows[:, None] * HEAD_DIM + o_cols[None, :], acc)
    l_rows = gl.arange(0, M, layout=gl.SliceLayout(1, l_layout))
    l_cols = gl.arange(0, 8, layout=gl.SliceLayout(0, l_layout))
    gl.store(SUMS + l_rows[:, None] * 8 + l_cols[None, :], sums)


@gluon.jit
def _idle(P):
    pass


@gluon.jit
def paired_products_kernel(P, V, ACC, SUMS, HEAD_DIM: gl.constexpr, FP8: gl.constexpr, WS: gl.constexpr):
    """V: the ring's tile as the kernel holds it (FP8: V^T (D, 128) as fp8_values_operand makes it; bf16:
    (128, D)), put in a one-stage ring of the kernel's shape; the ones tile by the kernel's own _ones_tile."""
    N: gl.constexpr = 128
    R: gl.constexpr = HEAD_DIM if FP8 else N
    C: gl.constexpr = N if FP8 else HEAD_DIM
    dtype: gl.constexpr = V.dtype.element_ty
    fill: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    v_rows = gl.arange(0, R, layout=gl.SliceLayout(1, fill))
    v_cols = gl.arange(0, C, layout=gl.SliceLayout(0, fill))
    v = gl.load(V + v_rows[:, None] * C + v_cols[None, :])
    ring_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, 1, R, C], dtype)  # as v_desc's
    v_smem = gl.allocate_shared_memory(dtype, [1, 1, 1, R, C], ring_layout)
    v_smem.index(0).reshape([R, C]).store(v)
    ones_smem = _ones_tile(dtype, N)  # (the fence covers V's stores too)
    thread_barrier()
    if WS:
        gl.warp_specialize([(_idle, (P, )), (_paired_products, (P, ACC, SUMS, v_smem, ones_smem, HEAD_DIM, FP8))],
                           [4], [240])
    else:
        _paired_products(P, ACC, SUMS, v_smem, ones_smem, HEAD_DIM, FP8)


def paired_case(dtype: torch.dtype, head_dim: int, ws: bool, device: str) -> str:
    """The kernel's sequence once: P V and P's sums against torch on the same rounded P."""
    torch.manual_seed(head_dim)
    fp8 = dtype == torch.float8_e4m3fn
    p = torch.rand(64, 128, device=device)  # probabilities in [0, 1)
    v = torch.randn(128, head_dim, device=device).to(dtype)
    if fp8 and device == "cuda":  # V^T with the keys relabeled as the library's (the kernel relabels P alike)
        from flashtriton.launch.gluon_forward import fp8_values_operand

        v_operand = fp8_values_operand(v[None, None])[0, 0].contiguous()
    elif fp8:  # compiled only: the shape is what counts
        v_operand = v.t().contiguous()
    else:
        v_operand = v
    acc = torch.full((64, head_dim), float("nan"), device=device)
    sums = torch.full((64, 8), float("nan"), device=device)
    args = (p, v_operand, acc, sums, head_dim, fp8, ws)
    name = f"kernel sequence {str(dtype).split('.')[-1]} D={head_dim} {'warp-specialised' if ws else 'one warpgroup'}"
    if device != "cuda":
        from flashtriton.tools import inspect

        inspect.offline_sass(paired_products_kernel, (1, ), args, dict(num_warps=4))
        return f"{name}: compiled for sm_90"
    paired_products_kernel[(1, )](*args, num_warps=4)
    rounded = p.to(dtype).float()
    acc_error = (acc - rounded @ v.float()).abs().max().item()
    sums_error = (sums - rounded.sum(1, keepdim=True)).abs().max().item()
    ok = acc_error <= 1e-2 and sums_error <= 1e-3 * rounded.sum(1).max().item()
    return f"{name}: P V max error {acc_error:.3g}, sums max error {sums_error:.3g} (sums up to " \
           f"{rounded.sum(1).max().item():.3g}; first row {sums[0].tolist()}) -> {'OK' if ok else 'WRONG'}"


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
    for dtype in (torch.float8_e4m3fn, torch.bfloat16):
        for head_dim in (64, 128):
            for ws in (False, True):
                print(paired_case(dtype, head_dim, ws, device), flush=True)


if __name__ == "__main__":
    main()
