"""The forward in Gluon for Hopper (sm_90): FlashAttention-3's structure, written with the pieces Triton's
tl.dot hides (issue 21; launch/gluon_forward.py launches it).

The Triton forward (forward.py) leaves the softmax between its two matrix products exposed: the tensor
cores idle while a warpgroup computes exp2 (docs/performance.md, entry 13). Hopper lets the work be split
by role instead, each role a partition of warps with its own registers:

- the load partition (4 warps, 24 registers each) issues TMA copies: Q once, then K and V block by
  block into two rings of NUM_STAGES shared-memory stages, each stage guarded by mbarriers (k_ready,
  v_ready: the bytes have landed; k_empty, v_empty: every softmax warpgroup is done with it). K and V
  are released apart, K as soon as its Q K^T has run, and K of block j + 1 is loaded before V of block
  j, which is needed later (FlashAttention-3's order): the loads run further ahead of the products;
- WARPGROUPS softmax partitions (4 warps each: two with 240 registers, or three with 160, FA3's tile at
  D = 64) own 64 query rows each of a tile's 128 or 192: per
  key block, S = Q K^T by an asynchronous wgmma from shared memory, the online softmax in registers,
  then O += P V with P kept in registers as the wgmma's A operand (no trip through shared memory). One
  warpgroup's softmax runs while another's wgmma uses the tensor cores; with OVERLAP (the form the
  launcher runs) each warpgroup issues block j's Q K^T and block j-1's P V together. The softmax of
  block j is written between the waits for the two, as FlashAttention-3 has it, but ptxas waits for
  both first (docs/performance.md, entry 83: held under P V, it ran slower);
- a program loops over tiles of 128 query rows (program p takes p, p + P, ...): with one program per SM
  (the launcher's choice, unless a causal call's heads are long: launch/gluon_forward.py) a tile's last
  products and its stores overlap the next tile's first loads, the barriers' phases running on across
  tiles; with one program per tile the loop runs once.

Semantics are the Triton forward's: O, and L = logsumexp in natural-log units; causal masks align to the
bottom-right corner (query i sees keys <= i + Nk - Nq); rows that see no key give O = 0 and L = -inf; Nq
and Nk of any size (TMA zero-fills past each (batch, head)'s rows, and keys past Nk are masked); GQA.
With SEQUSED_K, sequence b uses only its first SEQUSED_K[b] keys of a padded K and V (a KV cache's
chunked prefill), its causal diagonal at its own last key. TMA cannot zero-fill the rows past such a
count, and V's rows there may hold anything (NaN times a zero probability is NaN), so the block that
would cross the count is loaded ending at it instead, overlapping the block before; the overlapped
keys are masked, and no row past the count is ever read.

Tensors are read through 4-D TMA descriptors over (B, H, N, D) with a (1, 1, rows, D) box, so any layout
whose last dim is contiguous works, (B, N, H, D) included. One exception: an FP8 call whose V^T comes with
its keys in their own order (a V with contiguous keys, read as it is) gives K a 5-D descriptor that lands
each block's keys interleaved as P's relabeling needs them (KEYS_INTERLEAVED, _copy_block).

Five changes are flags of the kernel (the launcher's ForwardOptions; DEFAULT_OPTIONS and FP8_DEFAULT_OPTIONS
name those the library runs, raced on the H200; docs/performance.md, entries 86, 87, 89-92 and 99):
LAZY_RESCALE, rows keep a stale max within 2^8 and a warp whose rows all kept theirs skips O's rescale
(gluon_rescale.py); SUMS_BY_MMA, each row's sum of P by the tensor cores beside P V (_issue_pv); an o_desc, O
written by TMA stores from shared memory (_store_tile) instead of through pointers (on by default in FP8);
PAIRED_STAGES (on by default), K of block j + 1 and V of block j in one stage of the rings, released together
(_load_partition); and in FP8, SCALED_P, P made 2^8 times larger before its rounding to e4m3
(_online_softmax). Three more were raced, found no faster, and removed (docs/performance.md, entries 115-122
and 126): each warpgroup of a causal tile stopping at its own last key block, the stages handed back through
named barriers, and in FP8 V^T made in shared memory by the loader's warps.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .gluon_masks import columns_at_most, key_of_column
from .gluon_releases import reinterpret, thread_barrier, tma_load, tma_store
from .gluon_rescale import keep_max, rescale_where_needed

LN2 = gl.constexpr(0.6931471805599453)
# SCALED_P's factor on P, in log2 units: P <= 2^8 = 256, within e4m3's largest finite value (448)
P_LOG2_SCALE = gl.constexpr(8.0)


@gluon.jit
def _program_tile(r, IS_CAUSAL: gl.constexpr):
    """This program's work item in round r of a grid of P programs: tile r * P + p for program p, or with a
    causal mask, r * P + P - 1 - p in odd rounds. A zigzag: causal tiles differ in length, and taking p in
    every round gave program p the same place in each head whenever P was a multiple of a head's count of
    tiles (132 programs, 22 tiles of 192 rows at 4096 queries), so some programs took only the longest
    tiles; the zigzag pairs a long tile with a short one."""
    p = gl.program_id(0)
    programs = gl.num_programs(0)
    if IS_CAUSAL:
        if r % 2 == 1:
            p = programs - 1 - p
    return r * programs + p


@gluon.jit
def _tile(tile, num_m_blocks, num_heads, seqlen_q, seqlen_k, SEQUSED_K, IS_CAUSAL: gl.constexpr,
          TILE_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """Work item `tile` -> (batch, head, batch * heads + head, first query row, the sequence's keys, key
    blocks to visit). Tiles go head by head, so that the programs running at once share their heads' K and
    V in L2; within a head, causal tiles go longest first, so that the short ones fill the end of the
    run. Causal tiles are counted up from the last query row: when TILE_M does not divide Nq, the tile
    that overhangs is the first, which sees the fewest keys, not the last, which sees them all (its first
    row is then negative: TMA reads zeros there and the stores skip those rows)."""
    bh = tile // num_m_blocks
    m_block = tile % num_m_blocks
    first_row = m_block * TILE_M
    if IS_CAUSAL:
        first_row = seqlen_q - (m_block + 1) * TILE_M
    keys = seqlen_k
    if SEQUSED_K is not None:
        keys = gl.load(SEQUSED_K + bh // num_heads)
    hi = keys
    if IS_CAUSAL:
        hi = gl.minimum(hi, first_row + TILE_M + keys - seqlen_q)
    return bh // num_heads, bh % num_heads, bh, first_row, keys, gl.cdiv(gl.maximum(hi, 0), BLOCK_N)


@gluon.jit
def _block_start(j, keys, BLOCK_N: gl.constexpr, SHIFTED: gl.constexpr):
    """Key block j's first key: j * BLOCK_N, or with SHIFTED (a count of `keys` on a padded K and V) the
    block that would cross the count ends at it instead (it starts before 0, TMA filling zeros, when the
    count is shorter than a block)."""
    start = j * BLOCK_N
    if SHIFTED:
        start = gl.minimum(start, keys - BLOCK_N)
    return start


@gluon.jit
def _copy_block(desc, smem, ready, stage, off_b, off_hkv, block, keys, k_map, SHIFTED: gl.constexpr,
                TRANSPOSED: gl.constexpr = False):
    """Key block `block` of K or V (its first key: _block_start's) into its ring's `stage`, arriving on
    `ready` when the bytes have landed. TRANSPOSED: the tensor is V^T, (B, Hkv, D, Nk), keys last (FP8,
    launch/gluon_forward.py's fp8_values_operand). A 5-D `desc` is K's interleaved (FP8 with V's keys
    contiguous: launch/gluon_forward.py, interleaved_keys_map), its box (BLOCK_N / 16, 2, 4, 2, D) over
    16-key groups counted across the (batch, head) rows; `k_map` = (groups per batch, groups per head, head's
    offset in the last dim) places a (batch, head) there (ignored for 4-D descriptors)."""
    BLOCK_N: gl.constexpr = smem.type.shape[4] if TRANSPOSED else smem.type.shape[3]
    # _block_start's, inline: called from the load partition with the constant block 0, Triton 3.6 failed
    # to compile it ("value defined outside the region")
    start = block * BLOCK_N
    if SHIFTED:
        start = gl.minimum(start, keys - BLOCK_N)
    mbarrier.expect(ready.index(stage), desc.block_type.nbytes)
    if len(desc.block_type.shape) == 5:
        groups_b, groups_h, inner_h = k_map
        tma_load(desc, [off_b * groups_b + off_hkv * groups_h + start // 16, 0, 0, 0, off_hkv * inner_h],
                 ready.index(stage), smem.index(stage).reshape(desc.block_type.shape))
    elif TRANSPOSED:
        tma_load(desc, [off_b, off_hkv, 0, start], ready.index(stage), smem.index(stage))
    else:
        tma_load(desc, [off_b, off_hkv, start, 0], ready.index(stage), smem.index(stage))


@gluon.jit
def _claim_stage(empty, count, NUM_STAGES: gl.constexpr):
    """The ring's stage count % NUM_STAGES (`count`: the ring's fills so far, over every tile of the program),
    once every softmax partition has released its previous fill. A fresh mbarrier counts as having
    completed the phase before its first, so the first pass through the ring does not wait."""
    stage = count % NUM_STAGES
    mbarrier.wait(empty.index(stage), ((count // NUM_STAGES) & 1) ^ 1)
    return stage


@gluon.jit
def _load_block(desc, smem, ready, empty, off_b, off_hkv, block, count, keys, k_map, SHIFTED: gl.constexpr):
    """K's block: _copy_block into the stage _claim_stage gives for the ring's fill `count`."""
    stage = _claim_stage(empty, count, smem.type.shape[0])
    _copy_block(desc, smem, ready, stage, off_b, off_hkv, block, keys, k_map, SHIFTED)


@gluon.jit
def _load_partition(loads, IS_CAUSAL: gl.constexpr, FP8: gl.constexpr, PAIRED: gl.constexpr):
    """For each of the program's tiles: Q's 64-row slices (one per softmax warpgroup) once every
    warpgroup is done with the previous tile's, then K of block j + 1 before V of block j (in FP8 V^T,
    copied before the kernel); with PAIRED the two into one stage of both rings, whose K barrier (k_empty)
    releases both. `loads`: the kernel's arguments this partition takes (the flags come apart: in a tuple
    the kernel names, a flag becomes a run-time value, and both sides of each `if` on it would be
    compiled)."""
    (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, num_tiles,
     rounds, num_m_blocks, num_heads, group, seqlen_q, seqlen_k, SEQUSED_K, k_map) = loads
    WARPGROUPS: gl.constexpr = q_smem.type.shape[0]
    BLOCK_M: gl.constexpr = q_smem.type.shape[3]
    BLOCK_N: gl.constexpr = k_smem.type.shape[3]
    NUM_STAGES: gl.constexpr = k_smem.type.shape[0]
    SHIFTED: gl.constexpr = SEQUSED_K is not None
    fills = 0  # blocks loaded into each ring so far (with PAIRED: stages filled, one more per tile)
    tiles_done = 0
    for r in range(rounds):
        tile = _program_tile(r, IS_CAUSAL)
        if tile < num_tiles:
            off_b, off_h, bh, first_row, keys, n_blocks = _tile(tile, num_m_blocks, num_heads, seqlen_q, seqlen_k,
                                                                SEQUSED_K, IS_CAUSAL, WARPGROUPS * BLOCK_M, BLOCK_N)
            off_hkv = off_h // group
            if n_blocks > 0:  # the first K does not wait on Q's stage
                _load_block(k_desc, k_smem, k_ready, k_empty, off_b, off_hkv, 0, fills, keys, k_map, SHIFTED)
                if PAIRED:  # the tile's first stage holds no V: its V barrier completes a phase without bytes
                    mbarrier.arrive(v_ready.index(fills % NUM_STAGES), count=1)
            mbarrier.wait(q_empty, (tiles_done & 1) ^ 1)
            mbarrier.expect(q_ready, WARPGROUPS * q_desc.block_type.nbytes)
            for wg in gl.static_range(WARPGROUPS):
                tma_load(q_desc, [off_b, off_h, first_row + wg * BLOCK_M, 0], q_ready, q_smem.index(wg))
            for j in range(n_blocks):
                if PAIRED:  # K of block j + 1 and V of block j share a stage, released once (k_empty)
                    stage = _claim_stage(k_empty, fills + j + 1, NUM_STAGES)
                    if j + 1 < n_blocks:
                        _copy_block(k_desc, k_smem, k_ready, stage, off_b, off_hkv, j + 1, keys, k_map, SHIFTED)
                    else:  # the tile's last stage holds no K
                        mbarrier.arrive(k_ready.index(stage), count=1)
                else:
                    if j + 1 < n_blocks:
                        _load_block(k_desc, k_smem, k_ready, k_empty, off_b, off_hkv, j + 1, fills + j + 1, keys,
                                    k_map, SHIFTED)
                    stage = _claim_stage(v_empty, fills + j, NUM_STAGES)
                _copy_block(v_desc, v_smem, v_ready, stage, off_b, off_hkv, j, keys, k_map, SHIFTED, FP8)
            fills += n_blocks
            if PAIRED:
                if n_blocks > 0:
                    fills += 1
            tiles_done += 1


@gluon.jit
def _online_softmax(qk, j, m_i, l_i, last_key, first_visible_end, seqlen_k, qk_scale_log2,
                    IS_CAUSAL: gl.constexpr, SHIFTED: gl.constexpr, LAZY_RESCALE: gl.constexpr,
                    SUMS_BY_MMA: gl.constexpr = False, SCALED_P: gl.constexpr = False,
                    KEYS_INTERLEAVED: gl.constexpr = False):
    """Key block j's scores (fp32, unscaled) -> (P, the factor that rescales what came before, the
    running max and sum). Only the block past Nk and, causal, the blocks that cross the diagonal are
    masked: the others skip the comparisons in the softmax's critical path. SHIFTED: the block that
    crosses Nk was loaded ending at it (_block_start), and its keys before j * BLOCK_N, the previous
    block's, are masked too. LAZY_RESCALE: a row keeps its max while the block's is not far above it
    (gluon_rescale.py); its factor is then exactly 1. SUMS_BY_MMA: the sum is not taken here but by the
    tensor cores (_attend), and l_i comes back as it went in. SCALED_P: P and its sum come out 2^P_LOG2_SCALE
    times the probabilities (the running max stays unscaled; _attend takes the scale out of L).
    KEYS_INTERLEAVED: K was loaded interleaved, column c holding key key_of_column(c) (FP8, gluon_masks.py)."""
    BLOCK_N: gl.constexpr = qk.type.shape[1]
    block_end = (j + 1) * BLOCK_N
    partial = block_end > seqlen_k
    if IS_CAUSAL:
        partial = partial | (block_end - 1 > first_visible_end)
    if partial:
        start = _block_start(j, seqlen_k, BLOCK_N, SHIFTED)
        cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, qk.type.layout))  # keys from `start`
        if KEYS_INTERLEAVED:  # (never SHIFTED: the launcher refuses key counts with it)
            keys = key_of_column(cols)[None, :]
            if IS_CAUSAL:
                visible = keys <= (last_key - start)[:, None]
            else:
                visible = keys < seqlen_k - start
        elif IS_CAUSAL:
            visible = columns_at_most(cols, last_key - start)
            if SHIFTED:
                visible = visible & (cols[None, :] >= j * BLOCK_N - start)
        elif SHIFTED:  # (the block ends at Nk)
            visible = cols[None, :] >= j * BLOCK_N - start
        else:
            visible = cols[None, :] < seqlen_k - start
        qk = gl.where(visible, qk, float("-inf"))
    # The scale is folded into the exp2's argument: one FMA per score instead of a multiply and a subtract.
    m_new = gl.maximum(m_i, gl.max(qk, 1) * qk_scale_log2)
    if LAZY_RESCALE:
        m_new = keep_max(m_i, m_new)
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet: no NaN
    p_max = m_safe
    if SCALED_P:  # (one subtraction per row, not per score)
        p_max = m_safe - P_LOG2_SCALE
    # P's exp2 before alpha's: ptxas schedules the block by this order, and this is the one the H200 timed
    # (docs/performance.md, entry 118)
    p = gl.exp2(qk * qk_scale_log2 - p_max[:, None])
    alpha = gl.exp2(m_i - m_safe)
    if SUMS_BY_MMA:
        return p, alpha, m_new, l_i
    return p, alpha, m_new, l_i * alpha + gl.sum(p, 1)


@gluon.jit
def _probabilities_operand(p, dtype: gl.constexpr, p_layout: gl.constexpr, FP8: gl.constexpr):
    """P (fp32, wgmma's accumulator layout) in the layout of P V's A operand: in `dtype`, or in FP8 still in
    fp32 (_pv_operand rounds it). In FP8 each thread's accumulator holds keys 2t, 2t+1, 8+2t, 9+2t (t = lane
    % 4) of every 16, where the A operand wants 4t..4t+3 of every 32: rather than trade bytes across lanes,
    the keys are relabeled in each 32, and V^T's keys were permuted alike on the host (fp8_values_operand),
    which leaves P V unchanged."""
    if FP8:
        M: gl.constexpr = p.type.shape[0]
        N: gl.constexpr = p.type.shape[1]
        # key 16h + 8n + 2t + j becomes operand column 16h + 4t + 2n + j
        p = p.reshape([M, N // 32, 2, 2, 4, 2]).permute((0, 1, 2, 4, 3, 5)).reshape([M, N])
    else:
        p = p.to(dtype)
    return gl.convert_layout(p, p_layout)


@gluon.jit
def _pv_operand(p_op, FP8: gl.constexpr):
    """P as P V's A operand where the wgmma is issued. In FP8 it is rounded to e4m3 here, not where the
    softmax made it: Triton holds an 8-bit tensor one byte per register, so an e4m3 P carried from one
    iteration of the key loop to the next was unpacked after its rounding and packed again for the wgmma,
    byte by byte (about 190 instructions per block and warp, docs/performance.md entry 85)."""
    if FP8:
        p_op = p_op.to(gl.float8e4nv)
    return p_op


@gluon.jit
def _values(v_smem, stage, FP8: gl.constexpr):
    """V's block in ring stage `stage` as the B operand of P V, (BLOCK_N, D). In FP8 the ring holds V^T
    tiles, read here transposed: wgmma takes 8-bit operands with the reduced dim (the keys) contiguous."""
    tile = v_smem.index(stage).reshape([v_smem.type.shape[3], v_smem.type.shape[4]])
    if FP8:
        tile = tile.permute((1, 0))
    return tile


@gluon.jit
def _issue_pv(p_op, v_smem, stage, acc, block_sums, ones, FP8: gl.constexpr, SUMS_BY_MMA: gl.constexpr):
    """O += P V, asynchronously, P in registers; with SUMS_BY_MMA also each row's sum of this block's P, as P
    times a (BLOCK_N, 8) tile of ones: a thin product beside P V instead of 64 dependent adds and a quad
    shuffle per row and block in the softmax (the sums are then of the rounded P that P V multiplies). The
    block's sums start from zero (`block_sums`' values are not read) and the caller adds them to the row's
    total in fp32: e4m3 products accumulate in the tensor cores with about 14 bits kept, so a running total
    carried through them lost the low bits of every later block (docs/performance.md, entry 98)."""
    p_op = _pv_operand(p_op, FP8)
    acc = warpgroup_mma(p_op, _values(v_smem, stage, FP8), acc, is_async=True)
    if SUMS_BY_MMA:
        sum_operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=block_sums.type.layout,
                                                         k_width=4 if FP8 else 2)
        block_sums = warpgroup_mma(gl.convert_layout(p_op, sum_operand), ones, block_sums, use_acc=False,
                                   is_async=True)
    return acc, block_sums


@gluon.jit
def _attend(q, k_smem, v_smem, ones_smem, q_empty, k_ready, v_ready, k_empty, v_empty, turns, rows0, seqlen_q,
            seqlen_k, n_blocks, qk_scale_log2, v_descale, fills, turn, WG: gl.constexpr, WARPGROUPS: gl.constexpr,
            IS_CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, FP8: gl.constexpr,
            SHIFTED: gl.constexpr, LAZY_RESCALE: gl.constexpr, SUMS_BY_MMA: gl.constexpr,
            PAIRED_STAGES: gl.constexpr, SCALED_P: gl.constexpr, KEYS_INTERLEAVED: gl.constexpr = False):
    """One warpgroup's 64 query rows from `rows0` (Q in shared memory, `q`) against its tile's n_blocks key
    blocks: returns O (fp32, normalised, in wgmma's accumulator layout), L (natural-log units, -inf where a row
    saw no key), the rings' fills and the turns taken so far. With OVERLAP, block j's
    Q K^T is issued with block j-1's P V, K's stage is released once Q K^T has run, and the softmax of
    block j is written before the wait for P V (FlashAttention-3's intra-warpgroup pipelining); ptxas
    puts that wait first, so here the softmax follows both products (module docstring). Without OVERLAP,
    each block's two products and softmax run in turn. With PINGPONG (OVERLAP only), the warpgroups take
    turns, in a cycle, to issue their products (`turns`: mbarrier i lets warpgroup i issue), so that one's
    softmax runs while another's products hold the tensor cores (FlashAttention-3's inter-warpgroup
    ping-pong). WG is this warpgroup's index of WARPGROUPS. FP8: Q, K and V^T in float8 e4m3, P rounded to
    it for P V, O multiplied by `v_descale` (the scores' descales are in qk_scale_log2). SHIFTED:
    `seqlen_k` is this sequence's count of keys on a padded K and V (_block_start). LAZY_RESCALE: rows
    keep their max within gluon_rescale.RESCALE_THRESHOLD, and in the overlapped loop a warp whose rows all
    kept theirs skips O's rescale. SUMS_BY_MMA (OVERLAP only; ignored without): the rows' sums of P by the
    tensor cores (_issue_pv), against `ones_smem`, a (8, BLOCK_N) tile of ones. PAIRED_STAGES (OVERLAP
    only): block j's K and block j-1's V share a stage (_load_partition), released by one arrive on k_empty
    once both products have run; a tile takes n_blocks + 1 stages. SCALED_P (FP8 without LAZY_RESCALE): P
    rounded to e4m3 as 2^8 P, in [0, 256], so that a broad row's small probabilities, below e4m3's smallest
    normal (2^-6), keep their three bits instead of falling on the subnormals' 2^-9 grid; O is a ratio of
    sums of P and does not change, and L takes the 8 back out. KEYS_INTERLEAVED (FP8): K's stages hold each
    block's keys interleaved (_online_softmax), V^T's in their own order. A stage goes back to the loader by
    one thread's arrive on its k_empty or v_empty barrier, before which Gluon puts a barrier across the
    warpgroup's four warps."""
    # Warpgroup 0's turn t waits for the last warpgroup's turn t - 1, the others' for the previous one's
    # turn t; a fresh mbarrier passes a wait on phase 1, so warpgroup 0's first turn goes first.
    FIRST: gl.constexpr = 1 if WG == 0 else 0
    NEXT: gl.constexpr = (WG + 1) % WARPGROUPS
    NUM_STAGES: gl.constexpr = k_smem.type.shape[0]
    BLOCK_M: gl.constexpr = q.type.shape[0]
    HEAD_DIM: gl.constexpr = q.type.shape[1]
    BLOCK_N: gl.constexpr = k_smem.type.shape[3]
    dtype: gl.constexpr = q.dtype
    # wgmma's accumulator layouts (one warpgroup, m64 instructions, each reducing 32 bytes of K: 16
    # elements, 32 in FP8), and P as the A operand of P V (4 bytes of K per register either way).
    INSTR_K: gl.constexpr = 32 if FP8 else 16
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, INSTR_K])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, INSTR_K])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4 if FP8 else 2)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

    rows = rows0 + gl.arange(0, BLOCK_M, layout=s_rows)
    # row i's last visible key: the causal mask's diagonal, or the last key where that lies past it
    last_key = gl.minimum(rows + (seqlen_k - seqlen_q), seqlen_k - 1)
    first_visible_end = rows0 + (seqlen_k - seqlen_q)  # the first row's
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=s_rows)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=s_rows)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    no_scores = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    SUMS: gl.constexpr = SUMS_BY_MMA and OVERLAP
    # each row's sum of P in all 8 columns (SUMS), the product of P and ones; else unused
    l_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, 8, INSTR_K])
    sums = gl.zeros([BLOCK_M, 8], gl.float32, layout=l_layout)
    block_sums = sums  # the previous block's sums, by the tensor cores
    ones = ones_smem.permute((1, 0)) if SUMS else None
    PAIRED: gl.constexpr = PAIRED_STAGES and OVERLAP
    V_SHIFT: gl.constexpr = 1 if PAIRED else 0  # block i's V is in stage fills + i + V_SHIFT
    v_free = k_empty if PAIRED else v_empty  # the barrier that releases a V stage
    used = n_blocks  # the stages this tile takes
    if OVERLAP:
        if n_blocks > 0:
            mbarrier.wait(k_ready.index(fills % NUM_STAGES), (fills // NUM_STAGES) & 1)
            if PINGPONG:
                mbarrier.wait(turns.index(WG), (turn & 1) ^ FIRST)
            qk = warpgroup_mma(q, k_smem.index(fills % NUM_STAGES).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)),
                               no_scores, use_acc=False, is_async=True)
            if PINGPONG:
                mbarrier.arrive(turns.index(NEXT), count=1)
            qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk, ))
            mbarrier.arrive(k_empty.index(fills % NUM_STAGES), count=1)  # (with PAIRED, the stage holds no V)
            p, alpha, m_i, l_i = _online_softmax(qk, 0, m_i, l_i, last_key, first_visible_end, seqlen_k,
                                                 qk_scale_log2, IS_CAUSAL, SHIFTED, LAZY_RESCALE, SUMS, SCALED_P,
                                                 KEYS_INTERLEAVED)
            p_op = _probabilities_operand(p, dtype, p_layout, FP8)
            for j in range(1, n_blocks):
                stage = (fills + j) % NUM_STAGES
                prev = (fills + j - 1 + V_SHIFT) % NUM_STAGES
                mbarrier.wait(k_ready.index(stage), ((fills + j) // NUM_STAGES) & 1)
                mbarrier.wait(v_ready.index(prev), ((fills + j - 1 + V_SHIFT) // NUM_STAGES) & 1)
                if PINGPONG:
                    mbarrier.wait(turns.index(WG), ((turn + j) & 1) ^ FIRST)
                qk = warpgroup_mma(q, k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), no_scores,
                                   use_acc=False, is_async=True)
                acc, block_sums = _issue_pv(p_op, v_smem, prev, acc, block_sums, ones, FP8, SUMS)
                if PINGPONG:
                    mbarrier.arrive(turns.index(NEXT), count=1)
                # this block's scores; P V (and the sums) may run on
                qk = warpgroup_mma_wait(num_outstanding=2 if SUMS else 1, deps=(qk, ))
                if not PAIRED:
                    mbarrier.arrive(k_empty.index(stage), count=1)
                p, alpha, m_i, l_i = _online_softmax(qk, j, m_i, l_i, last_key, first_visible_end, seqlen_k,
                                                     qk_scale_log2, IS_CAUSAL, SHIFTED, LAZY_RESCALE, SUMS, SCALED_P,
                                                     KEYS_INTERLEAVED)
                acc, block_sums = warpgroup_mma_wait(num_outstanding=0, deps=(acc, block_sums))
                mbarrier.arrive(v_free.index(prev), count=1)
                if LAZY_RESCALE:
                    acc = rescale_where_needed(acc, gl.convert_layout(alpha, o_rows))
                else:
                    acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
                if SUMS:
                    sums = (sums + block_sums) * gl.convert_layout(alpha, gl.SliceLayout(1, l_layout))[:, None]
                p_op = _probabilities_operand(p, dtype, p_layout, FP8)
            mbarrier.arrive(q_empty, count=1)  # the tile's last Q K^T has run: the loader may bring the next Q
            last = (fills + n_blocks - 1 + V_SHIFT) % NUM_STAGES
            mbarrier.wait(v_ready.index(last), ((fills + n_blocks - 1 + V_SHIFT) // NUM_STAGES) & 1)
            if PINGPONG:
                mbarrier.wait(turns.index(WG), ((turn + n_blocks) & 1) ^ FIRST)
            acc, block_sums = _issue_pv(p_op, v_smem, last, acc, block_sums, ones, FP8, SUMS)
            if PINGPONG:
                mbarrier.arrive(turns.index(NEXT), count=1)
            acc, block_sums = warpgroup_mma_wait(num_outstanding=0, deps=(acc, block_sums))
            if SUMS:
                sums = sums + block_sums
            mbarrier.arrive(v_free.index(last), count=1)
            turn += n_blocks + 1
            used = n_blocks + V_SHIFT
        else:
            mbarrier.arrive(q_empty, count=1)
    else:
        for j in range(n_blocks):
            stage = (fills + j) % NUM_STAGES
            phase = ((fills + j) // NUM_STAGES) & 1
            mbarrier.wait(k_ready.index(stage), phase)
            qk = warpgroup_mma(q, k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), no_scores,
                               use_acc=False, is_async=True)
            qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk, ))
            mbarrier.arrive(k_empty.index(stage), count=1)
            p, alpha, m_i, l_i = _online_softmax(qk, j, m_i, l_i, last_key, first_visible_end, seqlen_k,
                                                 qk_scale_log2, IS_CAUSAL, SHIFTED, LAZY_RESCALE,
                                                 SCALED_P=SCALED_P, KEYS_INTERLEAVED=KEYS_INTERLEAVED)
            acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
            mbarrier.wait(v_ready.index(stage), phase)
            p_op = _probabilities_operand(p, dtype, p_layout, FP8)
            acc = warpgroup_mma(_pv_operand(p_op, FP8), _values(v_smem, stage, FP8), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            mbarrier.arrive(v_empty.index(stage), count=1)
        mbarrier.arrive(q_empty, count=1)

    if SUMS:
        l_i = gl.convert_layout(gl.max(sums, 1), s_rows)
    no_key = l_i == 0.0
    l_safe = gl.where(no_key, 1.0, l_i)
    # one division per row, then a multiply per value: dividing each value compiled to a multiply, a select
    # and a rescale of subnormal quotients per value (docs/performance.md, entry 89)
    if FP8:
        o = acc * (v_descale / gl.convert_layout(l_safe, o_rows))[:, None]
    else:
        o = acc * (1.0 / gl.convert_layout(l_safe, o_rows))[:, None]
    if SCALED_P:
        m_i = m_i - P_LOG2_SCALE
    lse = gl.where(no_key, float("-inf"), (m_i + gl.log2(l_safe)) * LN2)
    return o, lse, fills + used, turn


@gluon.jit
def _ones_tile(dtype: gl.constexpr, BLOCK_N: gl.constexpr):
    """An (8, BLOCK_N) tile of ones in shared memory, the B operand of SUMS_BY_MMA's rows' sums (_issue_pv reads
    it transposed, keys contiguous), written by the calling warps and fenced for the tensor cores' reads.
    In FP8 the tile is written as bytes, 0x38 (e4m3's 1.0), and read as e4m3: Triton 3.6's ptxas (12.8)
    packed the rounded 1.0 pair into each 32-bit word beside the upper half of an unrelated register (R0 in
    this kernel's SASS), not beside itself, so half the ones were not 1 (docs/performance.md, entry 97)."""
    fill: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    ones_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([8, BLOCK_N], dtype)
    if dtype == gl.float8e4nv:
        e4m3_ones = gl.full([8, BLOCK_N], 0x38, gl.int8, layout=fill)
        ones_smem = reinterpret(gl.allocate_shared_memory(gl.int8, [8, BLOCK_N], ones_layout, e4m3_ones), dtype,
                                [8, BLOCK_N], ones_layout)
    else:
        ones_smem = gl.allocate_shared_memory(dtype, [8, BLOCK_N], ones_layout,
                                              gl.full([8, BLOCK_N], 1.0, gl.float32, layout=fill).to(dtype))
    fence_async_shared()
    return ones_smem


@gluon.jit
def _store_rows(o, O, o_base, stride_om, rows0, seqlen_q):
    """O's 64 rows from `rows0` through pointers (O like q, `stride_om` between rows), those outside 0..seqlen_q
    - 1 masked off."""
    BLOCK_M: gl.constexpr = o.type.shape[0]
    HEAD_DIM: gl.constexpr = o.type.shape[1]
    rows_o = rows0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o.type.layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o.type.layout))
    gl.store(O + o_base + rows_o.to(gl.int64)[:, None] * stride_om + cols[None, :], o.to(O.dtype.element_ty),
             mask=(rows_o[:, None] >= 0) & (rows_o[:, None] < seqlen_q))


@gluon.jit
def _store_tile(o, lse, O, LSE, o_desc, o_stage, o_base, lse_base, stride_om, off_b, off_h, rows0, seqlen_q):
    """O's and L's 64 rows from `rows0` (rows outside 0..seqlen_q - 1 are not written). O by a TMA store
    from `o_stage` (this warpgroup's shared-memory tile) when there is an `o_desc`, FlashAttention-3's
    epilogue: the tile leaves as one bulk copy while the warpgroup goes on to the next, and TMA drops the
    rows past Nq, where the pointer stores take 16 bytes per row and instruction and a mask. A causal
    tile that overhangs row 0 (_tile) stores through pointers: a TMA store at a negative row stopped the
    kernel with an illegal instruction on the H200 (docs/performance.md, entry 92). L through pointers."""
    BLOCK_M: gl.constexpr = o.type.shape[0]
    HEAD_DIM: gl.constexpr = o.type.shape[1]
    if o_desc is not None:
        if rows0 >= 0:
            tma.store_wait(pendings=0)  # the previous tile's O has left the staging tile
            o_stage.reshape([BLOCK_M, HEAD_DIM]).store(o.to(o_stage.dtype))
            fence_async_shared()
            tma_store(o_desc, [off_b, off_h, rows0, 0], o_stage)
        else:
            _store_rows(o, O, o_base, stride_om, rows0, seqlen_q)
    else:
        _store_rows(o, O, o_base, stride_om, rows0, seqlen_q)
    rows = rows0 + gl.arange(0, BLOCK_M, layout=lse.type.layout)
    gl.store(LSE + lse_base + rows, lse, mask=(rows >= 0) & (rows < seqlen_q))


@gluon.jit
def _softmax_partition(shared, WG: gl.constexpr, IS_CAUSAL: gl.constexpr, OVERLAP: gl.constexpr,
                       PINGPONG: gl.constexpr, FP8: gl.constexpr, LAZY_RESCALE: gl.constexpr,
                       SUMS_BY_MMA: gl.constexpr, PAIRED_STAGES: gl.constexpr, SCALED_P: gl.constexpr,
                       KEYS_INTERLEAVED: gl.constexpr):
    """Softmax warpgroup WG: the WG-th 64 query rows of each of the program's tiles. `shared`: the
    arguments every softmax warpgroup takes (the kernel's)."""
    (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turns, O, LSE, stride_ob, stride_oh,
     stride_om, num_tiles, rounds, num_m_blocks, num_heads, group, seqlen_q, seqlen_k, qk_scale_log2, DESCALE,
     SEQUSED_K, ones_smem, o_desc, o_smem) = shared
    WARPGROUPS: gl.constexpr = q_smem.type.shape[0]
    BLOCK_M: gl.constexpr = q_smem.type.shape[3]
    HEAD_DIM: gl.constexpr = q_smem.type.shape[4]
    BLOCK_N: gl.constexpr = k_smem.type.shape[3]
    SHIFTED: gl.constexpr = SEQUSED_K is not None
    q = q_smem.index(WG).reshape([BLOCK_M, HEAD_DIM])
    fills = 0
    turn = 0
    tiles_done = 0
    for r in range(rounds):
        tile = _program_tile(r, IS_CAUSAL)
        if tile < num_tiles:
            off_b, off_h, bh, first_row, keys, n_blocks = _tile(tile, num_m_blocks, num_heads, seqlen_q, seqlen_k,
                                                                SEQUSED_K, IS_CAUSAL, WARPGROUPS * BLOCK_M, BLOCK_N)
            o_base = off_b.to(gl.int64) * stride_ob + off_h.to(gl.int64) * stride_oh
            tile_scale = qk_scale_log2
            v_descale = 1.0
            if FP8:  # DESCALE: float32 (3, B, Hkv), Q's, K's and V's factor per (batch, KV head)
                kv_head = off_b * (num_heads // group) + off_h // group
                kv_heads = num_tiles // num_m_blocks // group  # B x Hkv
                tile_scale = qk_scale_log2 * gl.load(DESCALE + kv_head) * gl.load(DESCALE + kv_heads + kv_head)
                v_descale = gl.load(DESCALE + 2 * kv_heads + kv_head)
            mbarrier.wait(q_ready, tiles_done & 1)
            rows0 = first_row + WG * BLOCK_M
            o, lse, fills, turn = _attend(q, k_smem, v_smem, ones_smem, q_empty, k_ready, v_ready, k_empty, v_empty,
                                          turns, rows0, seqlen_q, keys, n_blocks, tile_scale, v_descale, fills, turn,
                                          WG, WARPGROUPS, IS_CAUSAL, OVERLAP, PINGPONG, FP8, SHIFTED, LAZY_RESCALE,
                                          SUMS_BY_MMA, PAIRED_STAGES, SCALED_P, KEYS_INTERLEAVED)
            _store_tile(o, lse, O, LSE, o_desc, o_smem.index(WG), o_base, bh.to(gl.int64) * seqlen_q, stride_om,
                        off_b, off_h, rows0, seqlen_q)
            tiles_done += 1
    if o_desc is not None:
        tma.store_wait(pendings=0)  # the last tile's O has left shared memory before the program ends


@gluon.jit
def attn_fwd_gluon_kernel(
    # O like q (strides given), LSE (B, Hq, Nq) float32 contiguous; DESCALE (FP8 only) float32 (3, B, Hkv);
    # SEQUSED_K (B,) int32 or None; q_desc (B, Hq, Nq, D), k_desc and v_desc (B, Hkv, Nk, D): TMA
    # descriptors with a (1, 1, rows, D) box (FP8: v_desc over V^T (B, Hkv, D, Nk), a (1, 1, D, BLOCK_N)
    # box; with V^T's keys in their own order, k_desc 5-D, K interleaved: _copy_block, and k_groups_b,
    # k_groups_h and k_inner_h place a (batch, head) in it); o_desc (or None) over O (B, Hq, Nq, D) with a
    # (1, 1, 64, D) box: O leaves by TMA stores. Tensors before descriptors, as launch/replay.py replays a
    # recorded launch.
    O, LSE, DESCALE, SEQUSED_K, q_desc, k_desc, v_desc, o_desc,
    stride_ob, stride_oh, stride_om,
    num_heads, group, seqlen_q, seqlen_k, num_m_blocks, num_tiles, rounds,
    k_groups_b, k_groups_h, k_inner_h,
    qk_scale_log2,
    WARPGROUPS: gl.constexpr, NUM_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, OVERLAP: gl.constexpr,
    PINGPONG: gl.constexpr, SOFTMAX_REGS: gl.constexpr, FP8: gl.constexpr, LAZY_RESCALE: gl.constexpr,
    SUMS_BY_MMA: gl.constexpr, PAIRED_STAGES: gl.constexpr, SCALED_P: gl.constexpr,
):
    """Program p takes tiles p, p + P, p + 2P, ... (`rounds` = cdiv(num_tiles, P) of them: passed in, since
    derived in each partition it spilled the causal three-warpgroup form, docs/performance.md entry 81) of the
    num_tiles = batch x heads x num_m_blocks (WARPGROUPS x 64 query rows each) for a grid of P programs:
    persistent when P is the SM count, one tile each when P = num_tiles. WARPGROUPS softmax warpgroups (2
    or 3) share each key block. FP8: float8 e4m3 Q, K and V, each with its factor per (batch, KV head) in
    DESCALE, FlashAttention-3's q/k/v_descale; O in O's dtype. SEQUSED_K: each sequence's count of keys
    on a padded K and V (see the module docstring). LAZY_RESCALE: O rescaled only where a row's max grew by
    more than gluon_rescale.RESCALE_THRESHOLD. SUMS_BY_MMA (with OVERLAP): each row's sum of P by the tensor
    cores, P times ones (_issue_pv). PAIRED_STAGES (with OVERLAP): K of block j + 1 and V of block j share a
    stage and its release (_load_partition). SCALED_P (FP8 without LAZY_RESCALE): P rounded to e4m3 as 2^8 P
    (_attend)."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]  # per softmax warpgroup
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[3]
    dtype: gl.constexpr = q_desc.dtype
    # a 5-D K descriptor loads each block's keys interleaved (_copy_block); its stages are the 4-D ones reshaped
    KEYS_INTERLEAVED: gl.constexpr = len(k_desc.block_type.shape) == 5
    if KEYS_INTERLEAVED:
        BLOCK_N: gl.constexpr = k_desc.block_type.shape[0] * 16
        k_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, 1, BLOCK_N, HEAD_DIM], dtype)
    else:
        BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
        k_layout: gl.constexpr = k_desc.layout

    q_smem = gl.allocate_shared_memory(dtype, [WARPGROUPS, 1, 1, BLOCK_M, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, 1, BLOCK_N, HEAD_DIM], k_layout)
    V_ROWS: gl.constexpr = v_desc.block_type.shape[2]  # BLOCK_N keys, or in FP8 (V^T) the D dims
    V_COLS: gl.constexpr = v_desc.block_type.shape[3]
    v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, 1, V_ROWS, V_COLS], v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [WARPGROUPS, 1], mbarrier.MBarrierLayout())
    ones_smem = q_smem  # unused without SUMS_BY_MMA (a stand-in: Gluon's tuples cannot hold None)
    o_smem = q_smem  # likewise without o_desc
    if o_desc is not None:  # each softmax warpgroup's O on its way out by TMA
        o_smem = gl.allocate_shared_memory(o_desc.dtype, [WARPGROUPS, 1, 1, BLOCK_M, HEAD_DIM], o_desc.layout)
    if SUMS_BY_MMA:
        ones_smem = _ones_tile(dtype, BLOCK_N)
    mbarrier.init(q_ready, count=1)
    mbarrier.init(q_empty, count=WARPGROUPS)  # released once every softmax partition is done with it
    for wg in gl.static_range(WARPGROUPS):
        mbarrier.init(turns.index(wg), count=1)
    for stage in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(stage), count=1)
        mbarrier.init(v_ready.index(stage), count=1)
        mbarrier.init(k_empty.index(stage), count=WARPGROUPS)
        mbarrier.init(v_empty.index(stage), count=WARPGROUPS)

    # The default partition (the kernel's num_warps = 4) loads; the workers compute. Gluon gives the
    # loader what the softmax partitions' SOFTMAX_REGS leave of the register file. Triton 3.6 takes the
    # partitions as a literal list (a tuple variable cannot hold the functions, and a comprehension over
    # the warpgroups does not compile), so each count spells its list out, over tuples of the arguments.
    loads = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
             num_tiles, rounds, num_m_blocks, num_heads, group, seqlen_q, seqlen_k, SEQUSED_K,
             (k_groups_b, k_groups_h, k_inner_h))
    shared = (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turns, O, LSE, stride_ob,
              stride_oh, stride_om, num_tiles, rounds, num_m_blocks, num_heads, group, seqlen_q, seqlen_k,
              qk_scale_log2, DESCALE, SEQUSED_K, ones_smem, o_desc, o_smem)
    if SUMS_BY_MMA:
        thread_barrier()  # every warp's share of the ones written before any partition reads them
    if WARPGROUPS == 3:
        gl.warp_specialize([(_load_partition, (loads, IS_CAUSAL, FP8, PAIRED_STAGES)),
                            (_softmax_partition, (shared, 0, IS_CAUSAL, OVERLAP, PINGPONG, FP8, LAZY_RESCALE,
                                                  SUMS_BY_MMA, PAIRED_STAGES, SCALED_P, KEYS_INTERLEAVED)),
                            (_softmax_partition, (shared, 1, IS_CAUSAL, OVERLAP, PINGPONG, FP8, LAZY_RESCALE,
                                                  SUMS_BY_MMA, PAIRED_STAGES, SCALED_P, KEYS_INTERLEAVED)),
                            (_softmax_partition, (shared, 2, IS_CAUSAL, OVERLAP, PINGPONG, FP8, LAZY_RESCALE,
                                                  SUMS_BY_MMA, PAIRED_STAGES, SCALED_P, KEYS_INTERLEAVED))],
                           [4, 4, 4], [SOFTMAX_REGS, SOFTMAX_REGS, SOFTMAX_REGS])
    else:
        gl.warp_specialize([(_load_partition, (loads, IS_CAUSAL, FP8, PAIRED_STAGES)),
                            (_softmax_partition, (shared, 0, IS_CAUSAL, OVERLAP, PINGPONG, FP8, LAZY_RESCALE,
                                                  SUMS_BY_MMA, PAIRED_STAGES, SCALED_P, KEYS_INTERLEAVED)),
                            (_softmax_partition, (shared, 1, IS_CAUSAL, OVERLAP, PINGPONG, FP8, LAZY_RESCALE,
                                                  SUMS_BY_MMA, PAIRED_STAGES, SCALED_P, KEYS_INTERLEAVED))],
                           [4, 4], [SOFTMAX_REGS, SOFTMAX_REGS])

    mbarrier.invalidate(q_ready)
    mbarrier.invalidate(q_empty)
    for wg in gl.static_range(WARPGROUPS):
        mbarrier.invalidate(turns.index(wg))
    for stage in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(k_ready.index(stage))
        mbarrier.invalidate(v_ready.index(stage))
        mbarrier.invalidate(k_empty.index(stage))
        mbarrier.invalidate(v_empty.index(stage))


# The same kernel, not specialised on the key count, for Nk = 1 (the launcher's choice): specialised there,
# the mask made most of P one value, and ptxas 12.8 packed that e4m3 P with halves of unrelated registers
# (docs/performance.md, entry 105). Elsewhere Nk's divisibility by 16 is worth keeping: without it the
# FP8 kernel grew and the D = 64 bf16 forward spilled.
attn_fwd_gluon_kernel_any_keys = gluon.jit(do_not_specialize=["seqlen_k"])(attn_fwd_gluon_kernel.fn)
