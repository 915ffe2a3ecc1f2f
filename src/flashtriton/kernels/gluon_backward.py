"""The backward in Gluon for Hopper (sm_90), in FlashAttention-3's structure (issue 21;
launch/gluon_backward.py launches it): dK and dV, and with DQ_ATOMIC dQ, from one loop over the queries.

The Triton backward (backward.py) is two kernels, dK/dV and dQ, the second recomputing S and dP, and
like the forward they leave the elementwise work between their matrix products exposed. Here the work is
split by role, as in the Gluon forward (gluon_forward.py):

- the load partition (4 warps) brings each compute warpgroup's K and V once, then streams the query
  side, block by block of BLOCK_M query rows: Q and dO, with the rows' L and D, into a ring of NUM_STAGES
  stages, each guarded by an mbarrier (ready: the bytes have landed) and a named barrier (EMPTY_BARRIER:
  every compute warpgroup is done with them);
- WARPGROUPS compute partitions (4 warps each) own 64 keys each, resident in shared memory, with their
  dK and dV accumulators (64 x D fp32 each) in registers for the whole loop. Per query block, with the
  keys as rows (so that P^T and dS^T come out of the first products as the A operands of the next):
      S^T  = K Q^T           (wgmma, both from shared memory)
      dP^T = V dO^T          (issued right after, asynchronously)
      P^T  = exp2(S^T * scale * log2(e) - L * log2(e))     (L as the backward's statistics launch wrote it)
      dV  += P^T dO          (P^T from registers; runs while dS^T is computed)
      dS^T = P^T * (dP^T - D)                               (D = rowsum(dO * O))
      dK  += dS^T Q          (dS^T from registers)
  then dK * scale and dV are stored once. With DQ_ATOMIC, dS^T also goes to shared memory, and each
  warpgroup computes its share of dQ / scale = dS K over the program's 128 keys (half of D's columns, or
  half of the rows: _dq_products) and adds it into a float32 buffer by a TMA reduction (_add_dq); the pass
  that reads the buffer back into dQ multiplies by the scale.

At D = 256 a warpgroup cannot hold dK and dV of 64 keys (64 x 256 fp32 each: 256 registers per thread), so
the form there (HEAD_DIM > 128: _split_query_block, FlashAttention-3's split at that head dim) gives the
program one tile of 64 keys, which both compute warpgroups share: each computes S^T and dP^T for half of
the block's queries (64 x 32), writes its P^T and dS^T to shared memory, and once both halves are in
(DS_BARRIER) takes half of D's columns of dV and dK over all of the block's queries. With DQ_ATOMIC each
warpgroup adds dQ^T = K^T dS^T for its own queries, staged in the half of dO its dV has read (shared memory
holds no float32 tile of its own beside the 192 KB of K, V and the ring).

Semantics are the Triton backward's: causal masks align to the bottom-right corner; rows past Nq read
zeros for Q, dO, L and D (P = 1 there, but dP = 0 and dO = 0: nothing reaches the gradients), and keys
past Nk are computed but not stored (TMA zero-fills them); a row that saw no key (L = -inf) is masked out
by the causal mask, which is the only way it arises. GQA: a key tile's
program loops over the query heads of its group, so dK and dV have one writer each.
"""

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .dq_fragments import fragment_bits
from .gluon_barriers import named_barrier_arrive, named_barrier_sync
from .gluon_masks import columns_at_least
from .gluon_releases import reinterpret, tma_load, tma_reduce_add

# The named barrier at which both compute warpgroups meet once their dS^T of a block is in shared memory.
DS_BARRIER = gl.constexpr(15)
# The ring's stage s is handed back to the loader at named barrier EMPTY_BARRIER - s.
EMPTY_BARRIER = gl.constexpr(14)
# With DQ_BY_LOADER, compute warpgroup WG hands its staged dQ to the loader at named barrier DQ_FULL_BARRIER - WG,
# and takes the staging tile back at DQ_EMPTY_BARRIER - WG (below the ring's, which take 14 down to 11).
DQ_FULL_BARRIER = gl.constexpr(10)
DQ_EMPTY_BARRIER = gl.constexpr(8)
# The compute partitions the kernel's partition list spells out.
COMPUTE_WARPGROUPS = gl.constexpr(2)


@gluon.jit
def _program_keys(num_n_blocks, num_kv_heads, TILE_N: gl.constexpr):
    """This program's (batch, KV head, first key): programs go key tile by key tile within a head, so that
    the ones running at once share its Q and dO in L2, and causal tiles start with the longest."""
    pid = gl.program_id(0)
    bh = pid // num_n_blocks
    return bh // num_kv_heads, bh % num_kv_heads, (pid % num_n_blocks) * TILE_N


@gluon.jit
def _first_query_block(n_start, seqlen_q, seqlen_k, BLOCK_M: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """The first query block that sees any of the keys from n_start: causal, query i sees key j when
    j <= i + Nk - Nq."""
    if IS_CAUSAL:
        return gl.maximum(n_start - (seqlen_k - seqlen_q), 0) // BLOCK_M
    return n_start * 0


@gluon.jit
def _first_unmasked_query_block(n_end, seqlen_q, seqlen_k, BLOCK_M: gl.constexpr):
    """Causal: the first query block whose first row sees every key before n_end (the later blocks need
    no mask; it may lie past the last block)."""
    return gl.cdiv(gl.maximum(n_end - 1 - (seqlen_k - seqlen_q), 0), BLOCK_M)


@gluon.jit
def _load_partition(loads, IS_CAUSAL: gl.constexpr, DQ_BY_LOADER: gl.constexpr, DQ_FRAGMENTS: gl.constexpr):
    """K and V of every compute warpgroup's 64 keys once, then Q and dO of each query block of each query
    head of the group, with the block's L * log2(e) and D beside them, into the ring. With DQ_BY_LOADER
    also the TMA reductions of each block's dQ, once the compute warpgroups have staged it (_reduce_dq):
    those of block c - 1 right after the loads of block c. `loads`: the kernel's arguments this partition
    takes (the flags come apart: in a tuple the kernel names, a flag becomes a run-time value)."""
    (q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, q_smem, do_smem, k_smem, v_smem, stats_smem, kv_ready,
     ready, num_n_blocks, num_kv_heads, group, seqlen_q, seqlen_k, dq_smem, dq_desc) = loads
    KEY_TILES: gl.constexpr = k_smem.type.shape[0]  # one per compute warpgroup, or one shared (D = 256)
    KEYS: gl.constexpr = k_smem.type.shape[3]
    NUM_STAGES: gl.constexpr = q_smem.type.shape[0]
    BLOCK_M: gl.constexpr = q_smem.type.shape[3]
    DO_COLS: gl.constexpr = do_smem.type.shape[4]
    DO_PARTS: gl.constexpr = q_smem.type.shape[4] // DO_COLS  # dO's column halves at D = 256, else 1
    off_b, off_hkv, n_start = _program_keys(num_n_blocks, num_kv_heads, KEY_TILES * KEYS)
    mbarrier.expect(kv_ready, 2 * KEY_TILES * k_desc.block_type.nbytes)
    for wg in gl.static_range(KEY_TILES):
        tma_load(k_desc, [off_b, off_hkv, n_start + wg * KEYS, 0], kv_ready, k_smem.index(wg))
        tma_load(v_desc, [off_b, off_hkv, n_start + wg * KEYS, 0], kv_ready, v_smem.index(wg))
    m_first = _first_query_block(n_start, seqlen_q, seqlen_k, BLOCK_M, IS_CAUSAL)
    num_m = gl.cdiv(seqlen_q, BLOCK_M)
    count = 0
    HEAD_DIM: gl.constexpr = q_smem.type.shape[4]
    last_h = off_hkv * group  # the previous block's query head and block (DQ_BY_LOADER)
    last_m = m_first
    for i in range(group):
        off_h = off_hkv * group + i
        for m in range(m_first, num_m):
            stage = count % NUM_STAGES
            if count >= NUM_STAGES:  # the stage's previous block is done in every compute warpgroup
                named_barrier_sync(EMPTY_BARRIER - stage, (COMPUTE_WARPGROUPS + 1) * 128)
            mbarrier.expect(ready.index(stage), 2 * q_desc.block_type.nbytes + 2 * lse_desc.block_type.nbytes)
            tma_load(lse_desc, [off_b, off_h, m * BLOCK_M], ready.index(stage), stats_smem.index(2 * stage))
            tma_load(delta_desc, [off_b, off_h, m * BLOCK_M], ready.index(stage), stats_smem.index(2 * stage + 1))
            tma_load(q_desc, [off_b, off_h, m * BLOCK_M, 0], ready.index(stage), q_smem.index(stage))
            for part in gl.static_range(DO_PARTS):
                tma_load(do_desc, [off_b, off_h, m * BLOCK_M, part * DO_COLS], ready.index(stage),
                         do_smem.index(DO_PARTS * stage + part))
            if DQ_BY_LOADER:
                if count > 0:
                    _reduce_dq(dq_smem, dq_desc, off_b, last_h, last_m * BLOCK_M,
                               (off_b * num_kv_heads * group + last_h) * num_m + last_m, True, HEAD_DIM, DQ_FRAGMENTS)
                last_h = off_h
                last_m = m
            count += 1
    if DQ_BY_LOADER:
        if count > 0:  # the last block's, whose staging tiles no block takes back
            _reduce_dq(dq_smem, dq_desc, off_b, last_h, last_m * BLOCK_M,
                       (off_b * num_kv_heads * group + last_h) * num_m + last_m, False, HEAD_DIM, DQ_FRAGMENTS)
    # Meet the compute warpgroups' hand-backs of the last blocks, so that each barrier ends balanced.
    for last in range(gl.maximum(count - NUM_STAGES, 0), count):
        named_barrier_sync(EMPTY_BARRIER - last % NUM_STAGES, (COMPUTE_WARPGROUPS + 1) * 128)


@gluon.jit
def _dq_products(ds_smem, k_smem, buf, WG: gl.constexpr, dq_smem):
    """Issue warpgroup WG's share of one query block's dQ = dS K over the program's keys, each warpgroup's
    dS^T rows in buffer `buf` of ds_smem (read transposed) against its tile of K; the caller has met the
    other warpgroup at DS_BARRIER, so both halves are in. The share is dq_smem's tile (the launcher's
    box): half of D's columns for all the block's rows, or, with 128-row blocks split by rows, half of
    the rows with all of D (FlashAttention-4's split at D = 64: wgmma's N stays 64, not 32).
    Asynchronous: the caller waits."""
    WARPGROUPS: gl.constexpr = k_smem.type.shape[0]
    KEYS: gl.constexpr = k_smem.type.shape[3]
    HEAD_DIM: gl.constexpr = k_smem.type.shape[4]
    DQ_ROWS: gl.constexpr = dq_smem.type.shape[3]
    DQ_COLS: gl.constexpr = dq_smem.type.shape[4]
    SPLIT_ROWS: gl.constexpr = DQ_COLS == HEAD_DIM
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DQ_COLS, 16])
    dq = gl.zeros([DQ_ROWS, DQ_COLS], gl.float32, layout=dq_layout)
    for w in gl.static_range(WARPGROUPS):
        ds = ds_smem.index(buf).slice(w * KEYS, KEYS, dim=0)  # (keys, the block's rows)
        keys = k_smem.index(w).reshape([KEYS, HEAD_DIM])
        if SPLIT_ROWS:
            ds = ds.slice(WG * DQ_ROWS, DQ_ROWS, dim=1)
        else:
            keys = keys.slice(WG * DQ_COLS, DQ_COLS, dim=1)
        dq = warpgroup_mma(ds.permute((1, 0)), keys, dq, use_acc=w > 0, is_async=True)
    return dq


@triton.constexpr_function
def dq_fragment_layout(rows, cols):
    """The shared-memory layout that stores a warpgroup's (rows, cols) float32 wgmma accumulator in its
    registers' own order, 16 bytes per thread at a time (dq_fragments.py): offset bit i is the row or
    column bit fragment_bits names."""
    return gl.SharedLinearLayout([[1 << b, 0] if dim == 0 else [0, 1 << b] for dim, b in fragment_bits(rows, cols)])


@gluon.jit
def _add_dq(dq, dq_smem, dq_desc, off_b, head_q, m_row, chunk, WG: gl.constexpr, HEAD_DIM: gl.constexpr,
            DQ_FRAGMENTS: gl.constexpr):
    """Add warpgroup WG's finished share of dQ / scale (_dq_products) into dQ's float32 buffer for the query
    block from row m_row of query head head_q: staged in shared memory, then a TMA reduction that runs on
    while the next block computes. The softmax scale is left to the pass that reads the buffer back (one
    multiply per element of dQ there, against one per element and query block here: 32 per thread and
    block, on the way from dQ's product to its staging; docs/performance.md entry 88). With DQ_FRAGMENTS
    the buffer holds each (batch, head, block, warpgroup)'s share as one chunk in the accumulator's register
    order (dq_fragment_layout: conflict-free 16-byte stores), which dq_from_fragments_kernel puts back in
    place, the block's being `chunk`; otherwise the buffer is laid out like dQ."""
    tma.store_wait(pendings=0)  # the previous block's reduction has read the staging tile
    _stage_dq(dq, dq_smem.index(WG), DQ_FRAGMENTS)
    fence_async_shared()
    tma_reduce_add(dq_desc, _dq_coordinates(dq_desc, off_b, head_q, m_row, chunk, WG, HEAD_DIM, DQ_FRAGMENTS),
                   dq_smem.index(WG))


@gluon.jit
def _stage_dq(dq, staged, DQ_FRAGMENTS: gl.constexpr):
    """A warpgroup's share of dQ / scale into its staging tile: in the accumulator's register order
    (DQ_FRAGMENTS) or as dQ lies."""
    DQ_ROWS: gl.constexpr = dq.type.shape[0]
    DQ_COLS: gl.constexpr = dq.type.shape[1]
    if DQ_FRAGMENTS:
        reinterpret(staged, gl.float32, [DQ_ROWS, DQ_COLS], dq_fragment_layout(DQ_ROWS, DQ_COLS)).store(dq)
    else:
        staged.reshape([DQ_ROWS, DQ_COLS]).store(dq)


@gluon.jit
def _dq_coordinates(dq_desc, off_b, head_q, m_row, chunk, WG: gl.constexpr, HEAD_DIM: gl.constexpr,
                    DQ_FRAGMENTS: gl.constexpr):
    """Where warpgroup WG's share of the query block from row m_row goes in dQ's float32 buffer (dq_desc's
    box is the share): its chunk's slot, or its rows (split by rows) or columns as dQ lies."""
    DQ_ROWS: gl.constexpr = dq_desc.block_type.shape[2]
    DQ_COLS: gl.constexpr = dq_desc.block_type.shape[3]
    if DQ_FRAGMENTS:
        coordinates = [chunk, WG, 0, 0]
    elif DQ_COLS == HEAD_DIM:  # split by rows
        coordinates = [off_b, head_q, m_row + WG * DQ_ROWS, 0]
    else:
        coordinates = [off_b, head_q, m_row, WG * DQ_COLS]
    return coordinates


@gluon.jit
def _reduce_dq(dq_smem, dq_desc, off_b, head_q, m_row, chunk, HAND_BACK: gl.constexpr, HEAD_DIM: gl.constexpr,
               DQ_FRAGMENTS: gl.constexpr):
    """The loader's part with DQ_BY_LOADER (FlashAttention-3's dQ writer): once each compute warpgroup has
    staged its share of the query block from row m_row of head head_q (dQ's chunk `chunk`) at
    DQ_FULL_BARRIER, add it into dQ's float32 buffer by a TMA reduction; once both have been read, and
    unless this is the program's last block (HAND_BACK), give the staging tiles back at DQ_EMPTY_BARRIER.
    The compute warpgroups then neither issue the reductions nor wait for their reads (docs/performance.md,
    entry 144)."""
    for wg in gl.static_range(COMPUTE_WARPGROUPS):
        named_barrier_sync(DQ_FULL_BARRIER - wg, 2 * 128)
        tma_reduce_add(dq_desc, _dq_coordinates(dq_desc, off_b, head_q, m_row, chunk, wg, HEAD_DIM, DQ_FRAGMENTS),
                       dq_smem.index(wg))
    tma.store_wait(pendings=0)
    if HAND_BACK:
        for wg in gl.static_range(COMPUTE_WARPGROUPS):
            named_barrier_arrive(DQ_EMPTY_BARRIER - wg, 2 * 128)


@gluon.jit
def _landed_block(q_smem, ready, count):
    """The ring's count-th fill once its bytes have landed: (stage, Q as (BLOCK_M, D)); its dO is
    do_smem.index(stage), or at D = 256 the column halves do_smem.index(2 * stage + half)."""
    NUM_STAGES: gl.constexpr = q_smem.type.shape[0]
    BLOCK_M: gl.constexpr = q_smem.type.shape[3]
    HEAD_DIM: gl.constexpr = q_smem.type.shape[4]
    stage = count % NUM_STAGES
    mbarrier.wait(ready.index(stage), (count // NUM_STAGES) & 1)
    return stage, q_smem.index(stage).reshape([BLOCK_M, HEAD_DIM])


@gluon.jit
def _query_block(ring, m, count, off_b, head_q, chunk, k, v, n_wg, dk, dv, WG: gl.constexpr,
                 MASKED: gl.constexpr, DQ_ATOMIC: gl.constexpr, DQ_FRAGMENTS: gl.constexpr,
                 STATS_IN_ACC: gl.constexpr, DELTA_AFTER: gl.constexpr, DQ_BY_LOADER: gl.constexpr):
    """Query block m (the ring's count-th fill, of batch off_b's query head head_q; dQ's chunk `chunk`)
    against warpgroup WG's keys from n_wg: the five products and the elementwise work between them;
    returns dK and dV. MASKED: the block crosses the causal diagonal, and its scores are masked.
    STATS_IN_ACC: the products start from the rows' statistics instead of zeros, S^T's from -L / c (c =
    scale * log2(e)) and dP^T's from -D, so that they return S^T - L / c and dP^T - D: P^T = exp2(c acc),
    one multiply and an exp2 per score, and dS^T = P^T acc, one multiply. DELTA_AFTER (with STATS_IN_ACC): D
    subtracted after dP^T's wait instead, its product from zeros: ptxas makes a product that starts from
    registers written while another is in flight wait for that one, so with D in its accumulator dP^T is
    issued only once S^T is done (docs/performance.md, entry 142). DQ_BY_LOADER: dQ's share staged for the
    loader to reduce (_reduce_dq) instead of reduced here (_add_dq). `ring`: the shared memory, barriers and
    sizes every block reads (_compute_partition's)."""
    (q_smem, do_smem, k_smem, stats_smem, ds_smem, dq_smem, dq_desc, ready, seqlen_q, seqlen_k,
     qk_scale_log2, minus_inv_c) = ring
    WARPGROUPS: gl.constexpr = k_smem.type.shape[0]
    KEYS: gl.constexpr = k_smem.type.shape[3]
    HEAD_DIM: gl.constexpr = k_smem.type.shape[4]
    BLOCK_M: gl.constexpr = q_smem.type.shape[3]
    dtype: gl.constexpr = q_smem.dtype
    # wgmma's accumulator layouts (one warpgroup, m64 instructions): the 64 x BLOCK_M scores and the
    # 64 x D gradients; P^T and dS^T as the A operand of the gradients' products.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dk.type.layout, k_width=2)
    query_cols: gl.constexpr = gl.SliceLayout(0, s_layout)

    stage, q = _landed_block(q_smem, ready, count)
    do = do_smem.index(stage).reshape([BLOCK_M, HEAD_DIM])
    # (made here: a zero tile kept across the loop would hold 32 registers the accumulators need)
    no_scores = gl.zeros([KEYS, BLOCK_M], gl.float32, layout=s_layout)
    # Past Nq TMA gives L = 0 and D = 0, and zero rows of Q and dO: P = 1 there, but dO = 0 and dP = 0,
    # so nothing reaches dV, dK or (clipped) dQ.
    if STATS_IN_ACC:
        # L and D straight into the accumulators' registers, as -L / c and -D: nothing is held across the
        # products, and their reads are off the paths from the products' waits to P^T and dS^T
        lse2 = stats_smem.index(2 * stage).reshape([BLOCK_M]).load(query_cols)
        st = warpgroup_mma(k, q.permute((1, 0)), gl.broadcast(lse2[None, :] * minus_inv_c, no_scores)[0],
                           is_async=True)
        if DELTA_AFTER:
            dpt = warpgroup_mma(v, do.permute((1, 0)), no_scores, use_acc=False, is_async=True)
        else:
            delta = stats_smem.index(2 * stage + 1).reshape([BLOCK_M]).load(query_cols)
            dpt = warpgroup_mma(v, do.permute((1, 0)), gl.broadcast(-delta[None, :], no_scores)[0], is_async=True)
    else:
        st = warpgroup_mma(k, q.permute((1, 0)), no_scores, use_acc=False, is_async=True)
        dpt = warpgroup_mma(v, do.permute((1, 0)), no_scores, use_acc=False, is_async=True)
    st = warpgroup_mma_wait(num_outstanding=1, deps=(st, ))  # S^T; dP^T may still run
    if STATS_IN_ACC:
        pt = gl.exp2(st * qk_scale_log2)
    else:
        # L and D from the ring, read where used: read while the products run, they would hold 32 registers
        # each across them at 128-row blocks, which spilled and ran slower (docs/performance.md, entry 81)
        lse2 = stats_smem.index(2 * stage).reshape([BLOCK_M]).load(query_cols)
        pt = gl.exp2(st * qk_scale_log2 - lse2[None, :])
    if MASKED:
        keys = n_wg + gl.arange(0, KEYS, layout=gl.SliceLayout(1, s_layout))
        first = keys - (seqlen_k - seqlen_q) - m * BLOCK_M  # each key's first visible column of this block
        pt = gl.where(columns_at_least(gl.arange(0, BLOCK_M, layout=query_cols), first), pt, 0.0)
    pt_op = gl.convert_layout(pt.to(dtype), a_layout)
    dv = warpgroup_mma(pt_op, do, dv, is_async=True)
    dpt = warpgroup_mma_wait(num_outstanding=1, deps=(dpt, ))  # dP^T (- D); dV's product may still run
    if not STATS_IN_ACC or DELTA_AFTER:
        delta = stats_smem.index(2 * stage + 1).reshape([BLOCK_M]).load(query_cols)
        dpt = dpt - delta[None, :]
    dst = (pt * dpt).to(dtype)
    dst_op = gl.convert_layout(dst, a_layout)
    if DQ_ATOMIC:
        # dS^T into this warpgroup's rows of the block's buffer (the other warpgroup's products read what
        # it held two blocks ago before that warpgroup reached the last block's barrier); once both halves
        # are in, dQ's products are queued ahead of dK's, so that dQ's trip to the reduction (_add_dq) runs
        # while dK's product does.
        buf = count % 2
        ds_smem.index(buf).slice(WG * KEYS, KEYS, dim=0).store(dst)
        fence_async_shared()
        named_barrier_sync(DS_BARRIER, WARPGROUPS * 128)
        dq = _dq_products(ds_smem, k_smem, buf, WG, dq_smem)
        dk = warpgroup_mma(dst_op, q, dk, is_async=True)
        dq = warpgroup_mma_wait(num_outstanding=1, deps=(dq, ))  # dV's and dQ's; dK's may run on
        if DQ_BY_LOADER:
            if count > 0:  # the loader has read the last block's share out of the staging tile
                named_barrier_sync(DQ_EMPTY_BARRIER - WG, 2 * 128)
            _stage_dq(dq, dq_smem.index(WG), DQ_FRAGMENTS)
            fence_async_shared()
            named_barrier_arrive(DQ_FULL_BARRIER - WG, 2 * 128)
        else:
            _add_dq(dq, dq_smem, dq_desc, off_b, head_q, m * BLOCK_M, chunk, WG, HEAD_DIM, DQ_FRAGMENTS)
    else:
        dk = warpgroup_mma(dst_op, q, dk, is_async=True)
    dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
    # The stage back to the loader through a named barrier: every thread arrives once its own warp is past
    # the wait, with no barrier across the warpgroup first (Gluon's mbarrier.arrive has one).
    named_barrier_arrive(EMPTY_BARRIER - stage, (WARPGROUPS + 1) * 128)
    return dk, dv


@gluon.jit
def _add_dq_chunk(dqt, staging, buf, dq_desc, coord):
    """Stage one chunk of dQ^T / scale (CHUNK columns of D by a warpgroup's COLS query rows, as its product
    left it) transposed into staging tile `buf` and add it into dQ's float32 buffer at `coord` by a TMA
    reduction, once the reduction that last read that tile is done with it (one other may run on)."""
    COLS: gl.constexpr = staging.type.shape[3]
    CHUNK: gl.constexpr = staging.type.shape[4]
    tma.store_wait(pendings=1)
    staged = staging.index(buf)
    staged.reshape([COLS, CHUNK]).permute((1, 0)).store(dqt)
    fence_async_shared()
    tma_reduce_add(dq_desc, coord, staged)


@gluon.jit
def _split_query_block(ring, m, count, off_b, head_q, n_tile, k, v, dk, dv, WG: gl.constexpr, MASKED: gl.constexpr,
                       DQ_ATOMIC: gl.constexpr):
    """Query block m (the ring's count-th fill, of batch off_b's query head head_q) against the program's one
    tile of keys from n_tile, shared by both compute warpgroups (D = 256): warpgroup WG takes the block's
    queries WG * 32 to WG * 32 + 31 for S^T and dP^T, puts its P^T and dS^T in shared memory, and once both
    warpgroups' are in, adds the block into its half of D's columns of dV and dK (dk, dv: 64 x D / 2), over
    all the block's queries: one product per warpgroup's half of P^T (or dS^T) and the rows of dO (or Q)
    it covers. dO comes in column halves, warpgroup WG's dV reading only half WG; with DQ_ATOMIC, once that
    product is done the half holds the warpgroup's dQ on its way to the reductions: dQ^T = K^T dS^T for its
    own 32 queries, in chunks of 64 of D's rows (FlashAttention-3's swapped dQ product at this head dim),
    which needs neither the other warpgroup's dS^T nor shared memory beyond the ring's."""
    (q_smem, do_smem, k_smem, stats_smem, ds_smem, dq_smem, dq_desc, ready, seqlen_q, seqlen_k,
     qk_scale_log2, minus_inv_c) = ring
    KEYS: gl.constexpr = k.type.shape[0]
    HEAD_DIM: gl.constexpr = k.type.shape[1]
    BLOCK_M: gl.constexpr = q_smem.type.shape[3]
    COLS: gl.constexpr = ds_smem.type.shape[2]  # each warpgroup's queries of a block: BLOCK_M / 2
    HALF: gl.constexpr = dk.type.shape[1]  # each warpgroup's columns of dK and dV: D / 2
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, COLS, 16])
    query_cols: gl.constexpr = gl.SliceLayout(0, s_layout)

    stage, q = _landed_block(q_smem, ready, count)
    do_own = do_smem.index(COMPUTE_WARPGROUPS * stage + WG)  # the half dV reads, then dQ's staging
    do_half = do_own.reshape([BLOCK_M, HALF])
    no_scores = gl.zeros([KEYS, COLS], gl.float32, layout=s_layout)
    st = warpgroup_mma(k, q.slice(WG * COLS, COLS, dim=0).permute((1, 0)), no_scores, use_acc=False, is_async=True)
    dpt = no_scores
    for half in gl.static_range(COMPUTE_WARPGROUPS):  # dP^T over D, a column half of dO at a time
        rows_do = do_smem.index(COMPUTE_WARPGROUPS * stage + half).reshape([BLOCK_M, HALF])
        rows_do = rows_do.slice(WG * COLS, COLS, dim=0)
        dpt = warpgroup_mma(v.slice(half * HALF, HALF, dim=1), rows_do.permute((1, 0)), dpt, use_acc=half > 0,
                            is_async=True)
    st = warpgroup_mma_wait(num_outstanding=COMPUTE_WARPGROUPS, deps=(st, ))  # S^T; dP^T may still run
    lse2 = stats_smem.index(2 * stage).reshape([BLOCK_M]).slice(WG * COLS, COLS).load(query_cols)
    pt = gl.exp2(st * qk_scale_log2 - lse2[None, :])
    if MASKED:
        keys = n_tile + gl.arange(0, KEYS, layout=gl.SliceLayout(1, s_layout))
        first = keys - (seqlen_k - seqlen_q) - m * BLOCK_M - WG * COLS  # each key's first visible column
        pt = gl.where(columns_at_least(gl.arange(0, COLS, layout=query_cols), first), pt, 0.0)
    # Buffers 4 * buf + (0: P^T, 2: dS^T) + WG; two sets, alternating by block: a warpgroup writes a set
    # again only once past the next block's barrier, which the other reaches after its products on it.
    buf = count % 2
    ds_smem.index(4 * buf + WG).store(pt.to(dtype))
    dpt = warpgroup_mma_wait(num_outstanding=0, deps=(dpt, ))
    delta = stats_smem.index(2 * stage + 1).reshape([BLOCK_M]).slice(WG * COLS, COLS).load(query_cols)
    ds_smem.index(4 * buf + 2 + WG).store((pt * (dpt - delta[None, :])).to(dtype))
    fence_async_shared()
    named_barrier_sync(DS_BARRIER, COMPUTE_WARPGROUPS * 128)
    for w in gl.static_range(COMPUTE_WARPGROUPS):
        dv = warpgroup_mma(ds_smem.index(4 * buf + w), do_half.slice(w * COLS, COLS, dim=0), dv, is_async=True)
    if DQ_ATOMIC:
        # dQ^T's chunk c = K[:, c]^T dS^T: the first queued between dV's products and dK's, so that its trip to
        # the reduction runs while dK's products do; the staging tiles are the dO half dV has read.
        CHUNK: gl.constexpr = dq_desc.block_type.shape[3]
        gl.static_assert(CHUNK == KEYS, "a chunk of dQ^T starts from no_scores, the (keys, queries) zero tile")
        staging = reinterpret(do_own, gl.float32, [2, 1, 1, COLS, CHUNK], dq_desc.layout)
        row = m * BLOCK_M + WG * COLS
        dst = ds_smem.index(4 * buf + 2 + WG)
        dqt = warpgroup_mma(k.slice(0, CHUNK, dim=1).permute((1, 0)), dst, no_scores, use_acc=False, is_async=True)
    for w in gl.static_range(COMPUTE_WARPGROUPS):
        rows_q = q.slice(w * COLS, COLS, dim=0).slice(WG * HALF, HALF, dim=1)
        dk = warpgroup_mma(ds_smem.index(4 * buf + 2 + w), rows_q, dk, is_async=True)
    if DQ_ATOMIC:
        dqt = warpgroup_mma_wait(num_outstanding=COMPUTE_WARPGROUPS, deps=(dqt, ))  # dV's too; dK's may run
        for c in gl.static_range(1, HEAD_DIM // CHUNK):
            _add_dq_chunk(dqt, staging, (c - 1) % 2, dq_desc, [off_b, head_q, row, (c - 1) * CHUNK])
            dqt = warpgroup_mma(k.slice(c * CHUNK, CHUNK, dim=1).permute((1, 0)), dst, no_scores, use_acc=False,
                                is_async=True)
            dqt = warpgroup_mma_wait(num_outstanding=0, deps=(dqt, ))
        _add_dq_chunk(dqt, staging, (HEAD_DIM // CHUNK - 1) % 2, dq_desc,
                      [off_b, head_q, row, HEAD_DIM - CHUNK])
    dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
    if DQ_ATOMIC:
        tma.store_wait(pendings=0)  # the staging tiles are dO's again once the loader has the stage back
    named_barrier_arrive(EMPTY_BARRIER - stage, (COMPUTE_WARPGROUPS + 1) * 128)
    return dk, dv


@gluon.jit
def _any_query_block(ring, m, count, off_b, head_q, chunk, k, v, n_wg, dk, dv, WG: gl.constexpr,
                     MASKED: gl.constexpr, DQ_ATOMIC: gl.constexpr, DQ_FRAGMENTS: gl.constexpr,
                     STATS_IN_ACC: gl.constexpr, DELTA_AFTER: gl.constexpr, DQ_BY_LOADER: gl.constexpr):
    """Query block m in the kernel's form for the head dim: _split_query_block where the program's one key
    tile is shared (dk holds half of D's columns; STATS_IN_ACC is not taken there), _query_block
    otherwise."""
    if dk.type.shape[1] < k.type.shape[1]:
        dk, dv = _split_query_block(ring, m, count, off_b, head_q, n_wg, k, v, dk, dv, WG, MASKED, DQ_ATOMIC)
    else:
        dk, dv = _query_block(ring, m, count, off_b, head_q, chunk, k, v, n_wg, dk, dv, WG, MASKED, DQ_ATOMIC,
                              DQ_FRAGMENTS, STATS_IN_ACC, DELTA_AFTER, DQ_BY_LOADER)
    return dk, dv


@gluon.jit
def _compute_partition(shared, WG: gl.constexpr, IS_CAUSAL: gl.constexpr, DQ_ATOMIC: gl.constexpr,
                       DQ_FRAGMENTS: gl.constexpr, STATS_IN_ACC: gl.constexpr, DELTA_AFTER: gl.constexpr,
                       DQ_BY_LOADER: gl.constexpr):
    """Compute warpgroup WG: dK and dV of the program's keys WG * 64 to WG * 64 + 63, and with DQ_ATOMIC
    its share of dQ over all the program's keys (_dq_products, _add_dq). `shared`: the arguments every compute
    warpgroup takes (the kernel's)."""
    (q_smem, do_smem, k_smem, v_smem, stats_smem, ds_smem, dq_smem, dq_desc, kv_ready, ready,
     DK, DV, stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn, num_n_blocks, num_kv_heads,
     group, seqlen_q, seqlen_k, scale, qk_scale_log2) = shared
    KEY_TILES: gl.constexpr = k_smem.type.shape[0]
    KEYS: gl.constexpr = k_smem.type.shape[3]
    HEAD_DIM: gl.constexpr = k_smem.type.shape[4]
    BLOCK_M: gl.constexpr = q_smem.type.shape[3]
    dtype: gl.constexpr = q_smem.dtype
    SPLIT: gl.constexpr = KEY_TILES == 1  # D = 256: one key tile, D's columns split (_any_query_block)
    COLUMNS: gl.constexpr = HEAD_DIM // COMPUTE_WARPGROUPS if SPLIT else HEAD_DIM  # of dK and dV, here
    TILE: gl.constexpr = 0 if SPLIT else WG
    g_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, COLUMNS, 16])

    off_b, off_hkv, n_start = _program_keys(num_n_blocks, num_kv_heads, KEY_TILES * KEYS)
    n_wg = n_start + TILE * KEYS
    k = k_smem.index(TILE).reshape([KEYS, HEAD_DIM])
    v = v_smem.index(TILE).reshape([KEYS, HEAD_DIM])
    m_first = _first_query_block(n_start, seqlen_q, seqlen_k, BLOCK_M, IS_CAUSAL)
    num_m = gl.cdiv(seqlen_q, BLOCK_M)
    # Causal: the blocks before m_full cross the diagonal (some of the program's keys are past some of
    # their rows). They run in a loop of their own, so that the loop over the rest carries no mask: the
    # mask's indices held registers that the steady state then spilled (docs/performance.md, entry 75).
    m_full = m_first
    if IS_CAUSAL:
        m_full = _first_unmasked_query_block(n_start + KEY_TILES * KEYS, seqlen_q, seqlen_k, BLOCK_M)
        m_full = gl.minimum(gl.maximum(m_full, m_first), num_m)
    dk = gl.zeros([KEYS, COLUMNS], gl.float32, layout=g_layout)
    dv = gl.zeros([KEYS, COLUMNS], gl.float32, layout=g_layout)
    ring = (q_smem, do_smem, k_smem, stats_smem, ds_smem, dq_smem, dq_desc, ready, seqlen_q, seqlen_k,
            qk_scale_log2, -1.0 / qk_scale_log2)  # (c = scale * log2(e); L over the ring is L * log2(e))
    mbarrier.wait(kv_ready, 0)
    count = 0
    for i in range(group):
        head_q = off_hkv * group + i
        # dQ's chunk of this query head's block 0 (DQ_FRAGMENTS), once per head: per block it spills
        first_chunk = (off_b * num_kv_heads * group + head_q) * num_m
        if IS_CAUSAL:
            for m in range(m_first, m_full):
                dk, dv = _any_query_block(ring, m, count, off_b, head_q, first_chunk + m, k, v, n_wg, dk, dv, WG,
                                          True, DQ_ATOMIC, DQ_FRAGMENTS, STATS_IN_ACC, DELTA_AFTER, DQ_BY_LOADER)
                count += 1
        for m in range(m_full, num_m):
            dk, dv = _any_query_block(ring, m, count, off_b, head_q, first_chunk + m, k, v, n_wg, dk, dv, WG, False,
                                      DQ_ATOMIC, DQ_FRAGMENTS, STATS_IN_ACC, DELTA_AFTER, DQ_BY_LOADER)
            count += 1

    if DQ_ATOMIC and not DQ_BY_LOADER:
        tma.store_wait(pendings=0)  # the last reduction has read its staging tile before the program ends
    rows = n_wg + gl.arange(0, KEYS, layout=gl.SliceLayout(1, g_layout))
    cols = (WG * COLUMNS if SPLIT else 0) + gl.arange(0, COLUMNS, layout=gl.SliceLayout(0, g_layout))
    store = rows[:, None] < seqlen_k
    dk_base = off_b.to(gl.int64) * stride_dkb + off_hkv.to(gl.int64) * stride_dkh
    dv_base = off_b.to(gl.int64) * stride_dvb + off_hkv.to(gl.int64) * stride_dvh
    gl.store(DK + dk_base + rows.to(gl.int64)[:, None] * stride_dkn + cols[None, :], (dk * scale).to(dtype),
             mask=store)
    gl.store(DV + dv_base + rows.to(gl.int64)[:, None] * stride_dvn + cols[None, :], dv.to(dtype), mask=store)


@gluon.jit
def attn_bwd_dkdv_gluon_kernel(
    # DK and DV like k and v (strides given); q_desc and do_desc (B, Hq, Nq, D), k_desc and v_desc (B, Hkv,
    # Nk, D): TMA descriptors with (1, 1, rows, D) boxes; lse_desc and delta_desc over L * log2(e) and
    # rowsum(dO * O), float32 (B, Hq, Nq) with (1, 1, BLOCK_M) boxes; dq_desc (or None): below.
    DK, DV, q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, dq_desc,
    stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
    num_n_blocks, num_kv_heads, group, seqlen_q, seqlen_k,
    scale, qk_scale_log2,
    WARPGROUPS: gl.constexpr, NUM_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, DQ_ATOMIC: gl.constexpr,
    DQ_FRAGMENTS: gl.constexpr, STATS_IN_ACC: gl.constexpr, COMPUTE_REGS: gl.constexpr, DELTA_AFTER: gl.constexpr,
    DQ_BY_LOADER: gl.constexpr,
):
    """One program per (batch, KV head, tile of WARPGROUPS x 64 keys; 64 at D = 256): grid = num_n_blocks x B x
    Hkv. With DQ_ATOMIC, also dQ / scale added into dQ's float32 (B, Hq, Nq, D) buffer (zeroed by the caller;
    dq_desc's box is each warpgroup's share, (1, 1, BLOCK_M, D / 2) or (1, 1, BLOCK_M / 2, D), or at D = 256 a
    chunk of it, (1, 1, BLOCK_M / 2, 64)) by TMA reductions:
    FlashAttention-3's five products per block instead of seven, summed in an order that varies from run
    to run (not bitwise deterministic). With DQ_FRAGMENTS the buffer is (B * Hq * cdiv(Nq, BLOCK_M),
    WARPGROUPS, rows, cols) instead, each share in its registers' order (_add_dq), and dq_desc's box
    (1, 1, rows, cols) unswizzled. STATS_IN_ACC: S^T's and dP^T's products start from -L / c and -D
    (_query_block), or with DELTA_AFTER only S^T's. DQ_BY_LOADER (with DQ_ATOMIC, not at D = 256): the
    loader issues the dQ reductions the compute warpgroups stage (_reduce_dq)."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[3]
    KEYS: gl.constexpr = k_desc.block_type.shape[2]
    dtype: gl.constexpr = q_desc.dtype
    gl.static_assert(WARPGROUPS == COMPUTE_WARPGROUPS, "the partition list below spells out two compute warpgroups")
    SPLIT: gl.constexpr = HEAD_DIM > 128  # one key tile for both compute warpgroups (_split_query_block)
    KEY_TILES: gl.constexpr = 1 if SPLIT else WARPGROUPS
    gl.static_assert(NUM_STAGES <= 4, "the ring's named barriers take ids 14 down to 11, dQ's 10 down to 7 "
                                      "(Triton's are 0-3)")
    gl.static_assert(not DQ_BY_LOADER or (DQ_ATOMIC and not SPLIT), "DQ_BY_LOADER is a form of DQ_ATOMIC "
                                                                     "below D = 256")

    q_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, 1, BLOCK_M, HEAD_DIM], q_desc.layout)
    # dO: at D = 256 in column halves (do_desc's box), each compute warpgroup's dV reading one
    DO_PARTS: gl.constexpr = HEAD_DIM // do_desc.block_type.shape[3]
    do_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES * DO_PARTS, 1, 1, BLOCK_M, HEAD_DIM // DO_PARTS],
                                        do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [KEY_TILES, 1, 1, KEYS, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [KEY_TILES, 1, 1, KEYS, HEAD_DIM], v_desc.layout)
    # For dQ: two buffers of the block's dS^T (both warpgroups' rows), and each warpgroup's float32 tile of
    # dQ on its way to the reduction (token 8 x 8 slots when DQ_ATOMIC is off). At D = 256, two sets of
    # each warpgroup's P^T and dS^T instead (_split_query_block).
    DS_TILES: gl.constexpr = 8 if SPLIT else 2
    DS_ROWS: gl.constexpr = KEYS if SPLIT else (WARPGROUPS * KEYS if DQ_ATOMIC else 8)
    DS_COLS: gl.constexpr = BLOCK_M // WARPGROUPS if SPLIT else (BLOCK_M if DQ_ATOMIC else 8)
    # L * log2(e) and D come through the ring with Q and dO, a stage's pair side by side.
    stats_smem = gl.allocate_shared_memory(gl.float32, [2 * NUM_STAGES, 1, 1, BLOCK_M], lse_desc.layout)
    ds_smem = gl.allocate_shared_memory(dtype, [DS_TILES, DS_ROWS, DS_COLS],
                                        gl.NVMMASharedLayout.get_default_for([DS_ROWS, DS_COLS], dtype))
    if DQ_ATOMIC and not SPLIT:  # (at D = 256 dQ is staged in dO's halves: _split_query_block)
        DQ_BOX: gl.constexpr = dq_desc.block_type.shape
        dq_smem = gl.allocate_shared_memory(gl.float32, [WARPGROUPS, 1, 1, DQ_BOX[2], DQ_BOX[3]], dq_desc.layout)
    else:
        dq_smem = gl.allocate_shared_memory(gl.float32, [WARPGROUPS, 1, 1, 8, 8],
                                            gl.NVMMASharedLayout.get_default_for([1, 1, 8, 8], gl.float32))
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    for stage in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(stage), count=1)

    # The default partition (the kernel's num_warps = 4) loads; the workers compute, with COMPUTE_REGS
    # registers per thread (what they leave goes to the loader). Triton 3.6 takes the partitions as a
    # literal list (gluon_forward.py says why).
    loads = (q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, q_smem, do_smem, k_smem, v_smem, stats_smem,
             kv_ready, ready, num_n_blocks, num_kv_heads, group, seqlen_q, seqlen_k, dq_smem, dq_desc)
    shared = (q_smem, do_smem, k_smem, v_smem, stats_smem, ds_smem, dq_smem, dq_desc, kv_ready, ready,
              DK, DV, stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn, num_n_blocks,
              num_kv_heads, group, seqlen_q, seqlen_k, scale, qk_scale_log2)
    gl.warp_specialize([(_load_partition, (loads, IS_CAUSAL, DQ_BY_LOADER, DQ_FRAGMENTS)),
                        (_compute_partition, (shared, 0, IS_CAUSAL, DQ_ATOMIC, DQ_FRAGMENTS, STATS_IN_ACC,
                                              DELTA_AFTER, DQ_BY_LOADER)),
                        (_compute_partition, (shared, 1, IS_CAUSAL, DQ_ATOMIC, DQ_FRAGMENTS, STATS_IN_ACC,
                                              DELTA_AFTER, DQ_BY_LOADER))],
                       [4, 4], [COMPUTE_REGS, COMPUTE_REGS])

    mbarrier.invalidate(kv_ready)
    for stage in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(ready.index(stage))
