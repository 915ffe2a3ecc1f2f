"""V in the FP8 Gluon forward's layout: V^T with its keys relabeled in every 32 (launch/gluon_forward.py,
fp8_values_operand, says why). A transpose, memory-bound; PyTorch's strided byte copy runs it at a
tenth of the bandwidth (docs/performance.md, entry 60)."""

import triton
import triton.language as tl


@triton.jit
def fp8_values_kernel(V, VT, stride_vb, stride_vh, stride_vn, stride_vd, heads, seqlen_k, padded_k, head_dim,
                      BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    """VT[b, h, d, c] = V[b, h, key(c), d] as bytes, 0 past seqlen_k; VT is (B, H, D, padded_k)
    contiguous. Column c = 32x + 16h + 4t + 2n + j holds key 32x + 16h + 8n + 2t + j (BLOCK_K a multiple
    of 32)."""
    bh = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    dims = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    within = cols % 32
    keys = cols - within + (within & 16) + ((within >> 1) & 1) * 8 + ((within >> 2) & 3) * 2 + (within & 1)
    batch, head = bh // heads, bh % heads
    src = V + batch.to(tl.int64) * stride_vb + head.to(tl.int64) * stride_vh
    tile = tl.load(src + keys.to(tl.int64)[:, None] * stride_vn + dims[None, :] * stride_vd,
                   mask=(keys[:, None] < seqlen_k) & (dims[None, :] < head_dim), other=0)
    dst = VT + bh.to(tl.int64) * head_dim * padded_k
    tl.store(dst + dims.to(tl.int64)[:, None] * padded_k + cols[None, :], tl.trans(tile),
             mask=(dims[:, None] < head_dim) & (cols[None, :] < padded_k))
