"""dQ's float32 accumulator in wgmma's register order, and the kernel that puts it back in place (issue 21).

The Gluon backward (gluon_backward.py) stages each compute warpgroup's share of a query block's dQ in
shared memory before a TMA reduction adds it into a float32 buffer. Laid out like dQ, the staging tile
takes 8-byte stores with 2-way bank conflicts (docs/performance.md, entry 71). FlashAttention-3 and -4
store the accumulator in its registers' own order instead (16 bytes per thread at a time, no conflicts)
and reduce it into a buffer of the same order, which a later pass puts back in place. Here a share of
`rows` x `cols` is one chunk of rows * cols floats; fragment_bits says which row or column bit each bit of
a float's offset in the chunk is, and dq_from_fragments_kernel reads chunks and writes dQ.

wgmma's m64nNk16 accumulator (one warpgroup, four warps) gives lane l of warp w the rows 16 w + l / 4 and
16 w + l / 4 + 8, and the columns 8 n + 2 (l % 4) and the next, its registers ordered (64-row block, n,
+8 row, +1 column). Offset = 512 c + 4 t + j for register 4 c + j of thread t = 32 w + l: each thread's
four consecutive registers are 16 consecutive bytes, and a warp's 32 threads 512 consecutive bytes.
"""

import triton
import triton.language as tl


@triton.constexpr_function
def fragment_bits(rows: int, cols: int) -> list[tuple[int, int]]:
    """For each bit of a float's offset in a (rows, cols) chunk, lowest first: (0, b) for bit b of its row,
    (1, b) for bit b of its column. rows a multiple of 64, cols of 8, both powers of two."""
    bits = [(1, 0), (0, 3), (1, 1), (1, 2), (0, 0), (0, 1), (0, 2), (0, 4), (0, 5)]
    bits += [(1, 3 + i) for i in range((cols // 8).bit_length() - 1)]
    bits += [(0, 6 + i) for i in range((rows // 64).bit_length() - 1)]
    return bits


@triton.constexpr_function
def fragment_permutation(rows, cols):
    """A chunk reshaped to one axis of 2 per offset bit, highest first: its axes in the order (row bits,
    highest first, then column bits, highest first), which reshapes to the (rows, cols) tile."""
    bits = fragment_bits(rows, cols)
    axis = {bit: len(bits) - 1 - i for i, bit in enumerate(bits)}  # offset bit i is axis len - 1 - i
    row_bits = [(0, b) for b in reversed(range(rows.bit_length() - 1))]
    col_bits = [(1, b) for b in reversed(range(cols.bit_length() - 1))]
    return [axis[bit] for bit in row_bits + col_bits]


@triton.jit
def dq_from_fragments_kernel(
    ACC, DQ, stride_b, stride_h, stride_n, heads, num_m, seqlen_q, scale,
    ROWS: tl.constexpr, COLS: tl.constexpr, WARPGROUPS: tl.constexpr, SPLIT_ROWS: tl.constexpr,
):
    """One program per chunk of ACC, float32 (B * H * num_m, WARPGROUPS, ROWS, COLS) contiguous: warpgroup
    g's share of query block m's dQ, in fragment_bits's order, times `scale` (the softmax scale, which the
    Gluon kernel leaves out of its per-block sums), goes to DQ (B, H, N, D; strides given) in DQ's dtype.
    A share is ROWS rows of the block from row g * ROWS with all of D (SPLIT_ROWS), or all the block's rows
    with columns g * COLS on; rows past seqlen_q are dropped."""
    pid = tl.program_id(0)
    wg = pid % WARPGROUPS
    block = pid // WARPGROUPS
    m = block % num_m
    b = block // num_m // heads
    h = block // num_m % heads
    tl.static_assert(ROWS * COLS == 4096, "a share is 4096 floats: 12 offset bits")
    x = tl.load(ACC + pid.to(tl.int64) * (ROWS * COLS) + tl.arange(0, ROWS * COLS))
    x = tl.reshape(x, [2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2])  # an axis per offset bit, highest first
    p: tl.constexpr = fragment_permutation(ROWS, COLS)  # (spelt out: the compiler takes a literal tuple)
    x = tl.permute(x, (p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11]))
    x = tl.reshape(x, [ROWS, COLS])
    if SPLIT_ROWS:
        rows = (m * WARPGROUPS + wg) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, COLS)
    else:
        rows = m * ROWS + tl.arange(0, ROWS)
        cols = wg * COLS + tl.arange(0, COLS)
    out = DQ + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
    tl.store(out + rows.to(tl.int64)[:, None] * stride_n + cols[None, :], (x * scale).to(DQ.dtype.element_ty),
             mask=rows[:, None] < seqlen_q)
