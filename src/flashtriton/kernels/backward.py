"""FlashAttention-2 backward kernels.

The forward saved O and the logsumexp L, so each score tile's probabilities can be recomputed as
P = exp(S - L) without the softmax's running state. With D = rowsum(dO * O) (the preprocess kernel):

    dV  = P^T dO
    dP  = dO V^T
    dS  = P * (dP - D)          (the softmax Jacobian, row by row)
    dK  = scale * dS^T Q
    dQ  = scale * dS K

Two kernels split the work so that every output has exactly one writer and the result is deterministic
(no atomics): `attn_bwd_dkdv_kernel` keeps a key/value tile resident and streams the query tiles that see
it (for GQA, of every query head in its group); `attn_bwd_dq_kernel` keeps a query tile resident and
streams the key/value tiles it sees, like the forward. Both skip the tiles outside the visible band
(causal, sliding window) and mask only its edges and the ragged tiles.
"""

import triton
import triton.language as tl

from .common import (
    LOG2E,
    SEQLEN_ARGS,
    column_pointers,
    dropout_keep,
    head_row_offset,
    key_tiles_for_query_tile,
    load_desc_rows,
    load_tile,
    modified_scores,
    program_tile,
    query_tiles_for_key_tile,
    sequence_bounds,
    store_tile,
    visible_keys,
)


@triton.jit(do_not_specialize=["seqlen_q"])
def attn_bwd_preprocess_kernel(
    O, DO, LSE, LSE2, DELTA, CU_SEQLENS_Q,
    stride_ob, stride_oh, stride_om,
    stride_dob, stride_doh, stride_dom,
    num_heads, seqlen_q, stride_stats,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, VARLEN: tl.constexpr = False,
):
    """The per-row statistics the backward's loops stream, each row of a head `stride_stats` apart (a
    multiple of 4, so that TMA can read them): DELTA[b, h, i] = sum_d O[b, h, i, d] * dO[b, h, i, d] in fp32,
    and LSE2 = LSE * log2(e), the logsumexp in the exp2 units of the kernels. LSE is contiguous
    (B, H, seqlen_q), or (H, total_q) for a packed batch (VARLEN, seqlen_q the total); LSE2 and DELTA are
    (B, H, stride_stats) or (H, stride_stats)."""
    off_b, off_h, pid_m = program_tile(False, 1)
    off_b, off_h = off_b.to(tl.int64), off_h.to(tl.int64)
    start_m = pid_m * BLOCK_M
    q_start, seqlen_q, _, _, row = sequence_bounds(off_b, off_h, num_heads, seqlen_q, seqlen_q, CU_SEQLENS_Q,
                                                   CU_SEQLENS_Q, VARLEN)
    stats_row = head_row_offset(off_b, off_h, num_heads, q_start, stride_stats, VARLEN)
    if VARLEN:
        if start_m >= seqlen_q:
            return
    o_ptrs = column_pointers(O + off_b * stride_ob + off_h * stride_oh + q_start * stride_om, BLOCK_D)
    do_ptrs = column_pointers(DO + off_b * stride_dob + off_h * stride_doh + q_start * stride_dom, BLOCK_D)
    o = load_tile(o_ptrs, start_m, stride_om, seqlen_q, BLOCK_M, HEAD_DIM, BLOCK_D, True,
                  HEAD_DIM != BLOCK_D).to(tl.float32)
    do = load_tile(do_ptrs, start_m, stride_dom, seqlen_q, BLOCK_M, HEAD_DIM, BLOCK_D, True,
                   HEAD_DIM != BLOCK_D).to(tl.float32)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    in_range = offs_m < seqlen_q
    tl.store(DELTA + stats_row + offs_m, tl.sum(o * do, axis=1), mask=in_range)
    tl.store(LSE2 + stats_row + offs_m, tl.load(LSE + row + offs_m, mask=in_range) * LOG2E, mask=in_range)


@triton.jit
def _dkdv_inner(
    dk, dv, k, v,
    q_ptrs, do_ptrs, stride_qm, stride_dom, desc_q, desc_do, desc_lse2, desc_delta, off_b, off_hq,
    lse2_ptr, delta_ptr, start, end, offs_n, seqlen_q, band_lo, band_hi,
    qk_scale_log2, diag, softcap_scale, softcap_log2, alibi_log2, seed, bh, dropout_p,
    BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    MASKED: tl.constexpr, ONE_LOOP: tl.constexpr, MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
    DROPOUT: tl.constexpr,
):
    """Accumulate dK and dV of one key tile over query tiles [start, end). Works on transposed tiles
    ([BLOCK_N, BLOCK_M]) so the resident K and V are the left operands. MASKED: every tile takes the
    band's mask and bounds-checked loads; else no mask at all. ONE_LOOP: this loop covers every query
    tile the key tile sees (see the kernel), so the mask is on every tile and must be cheap."""
    for start_m in range(start, end, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        # Rows past seqlen_q load L = D = 0 and dO = 0, so they add nothing.
        if USE_TMA:
            q = load_desc_rows(desc_q, off_b, off_hq, start_m, BLOCK_M, BLOCK_D)
            do = load_desc_rows(desc_do, off_b, off_hq, start_m, BLOCK_M, BLOCK_D)
        else:
            q = load_tile(q_ptrs, start_m, stride_qm, seqlen_q, BLOCK_M, HEAD_DIM, BLOCK_D, MASKED, not EVEN_D)
            do = load_tile(do_ptrs, start_m, stride_dom, seqlen_q, BLOCK_M, HEAD_DIM, BLOCK_D, MASKED, not EVEN_D)
        # L and D: through TMA in the three loops, one copy each where pointer loads are a predicated
        # 4-byte copy per element, and with them ptxas no longer serialises the loops' wgmmas
        # (docs/performance.md); also in the causal one loop (D=128). The one loop without a band keeps
        # pointer loads: through TMA, ptxas serialises it instead.
        if USE_TMA and (not ONE_LOOP or MASK_RIGHT):
            lse2 = desc_lse2.load([off_b, off_hq, start_m]).reshape(BLOCK_M)
            delta = desc_delta.load([off_b, off_hq, start_m]).reshape(BLOCK_M)
        elif MASKED:
            lse2 = tl.load(lse2_ptr + offs_m, mask=offs_m < seqlen_q, other=0.0)
            delta = tl.load(delta_ptr + offs_m, mask=offs_m < seqlen_q, other=0.0)
        else:
            lse2 = tl.load(lse2_ptr + offs_m)
            delta = tl.load(delta_ptr + offs_m)
        qk_t = tl.dot(k, tl.trans(q), input_precision=INPUT_PRECISION)  # [BLOCK_N, BLOCK_M]
        if SOFTCAP or ALIBI:
            s_t, tanh_t = modified_scores(qk_t, offs_m[None, :], offs_n[:, None], diag, qk_scale_log2,
                                          softcap_scale, softcap_log2, alibi_log2, SOFTCAP, ALIBI)
            p_t = tl.exp2(s_t - lse2[None, :])
        else:
            p_t = tl.exp2(qk_t * qk_scale_log2 - lse2[None, :])
        # tl.where, not a multiply: rows that see no key have L = -inf, so exp2 gives inf here. Keys past
        # seqlen_k need no mask: their dK and dV rows are never stored.
        if MASKED and ONE_LOOP:
            p_t = _band_mask_by_row_t(p_t, start_m, offs_n, band_lo, band_hi, BLOCK_M, MASK_LEFT, MASK_RIGHT)
        elif MASKED:  # the three loops' edge tiles: this form compiles to fewer registers there (155 vs 168)
            p_t = _band_mask_t(p_t, offs_m, offs_n, band_lo, band_hi, MASK_LEFT, MASK_RIGHT)
        if DROPOUT:  # the forward's mask (same Philox counters); O used P * keep / (1 - p)
            keep_t = dropout_keep(seed, bh, offs_m[None, :], offs_n[:, None], dropout_p)
            dv = tl.dot((tl.where(keep_t, p_t, 0.0) * (1.0 / (1.0 - dropout_p))).to(do.dtype), do, dv,
                        input_precision=INPUT_PRECISION)
            dp_t = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)  # [BLOCK_N, BLOCK_M]
            dp_t = tl.where(keep_t, dp_t * (1.0 / (1.0 - dropout_p)), 0.0)
        else:
            dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=INPUT_PRECISION)
            dp_t = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)  # [BLOCK_N, BLOCK_M]
        ds_t = p_t * (dp_t - delta[None, :])
        if SOFTCAP:  # d/ds of softcap * tanh(s / softcap)
            ds_t = ds_t * (1.0 - tanh_t * tanh_t)
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=INPUT_PRECISION)
    return dk, dv


@triton.jit
def _band_mask_t(p_t, offs_m, offs_n, band_lo, band_hi, MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr):
    """p_t ([keys, queries]) with 0 where query i does not see key j."""
    if MASK_RIGHT:
        p_t = tl.where(offs_n[:, None] <= offs_m[None, :] + band_hi, p_t, 0.0)
    if MASK_LEFT:
        p_t = tl.where(offs_n[:, None] >= offs_m[None, :] + band_lo, p_t, 0.0)
    return p_t


@triton.jit
def _band_mask_by_row_t(p_t, start_m, offs_n, band_lo, band_hi, BLOCK_M: tl.constexpr, MASK_LEFT: tl.constexpr,
                        MASK_RIGHT: tl.constexpr):
    """_band_mask_t for query rows from start_m, written as each key row's first (and last) visible query,
    compared with the column index. The same mask, but the compiler no longer hoists a full tile of indices
    out of the loop: 30 registers fewer when every tile takes it."""
    cols = tl.arange(0, BLOCK_M)[None, :]
    rel = offs_n - start_m  # [BLOCK_N]: each key against the tile's first query
    if MASK_RIGHT:
        p_t = tl.where(cols >= (rel - band_hi)[:, None], p_t, 0.0)
    if MASK_LEFT:
        p_t = tl.where(cols <= (rel - band_lo)[:, None], p_t, 0.0)
    return p_t


@triton.jit(do_not_specialize=SEQLEN_ARGS + ["window_left", "window_right", "heads_per_group", "tuning_seqlen",
                                             "stride_alibi_b"])
def attn_bwd_dkdv_kernel(
    # pointers; LSE2 (L * log2 e) and DELTA as the preprocess writes them: (B, Hq, stride_stats), or
    # (Hq, stride_stats) with VARLEN; ALIBI_SLOPES, CU_SEQLENS_Q/K and SEED as in the forward
    Q, K, V, DO, LSE2, DELTA, DK, DV, ALIBI_SLOPES, CU_SEQLENS_Q, CU_SEQLENS_K, SEED,
    # (B, H, N, D) tensor descriptors of Q, K, V, dO and (B, H, N) of LSE2, DELTA when USE_TMA (else None)
    desc_q, desc_k, desc_v, desc_do, desc_lse2, desc_delta,
    # strides (the last dim of every tensor is contiguous)
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_dob, stride_doh, stride_dom,
    stride_dkb, stride_dkh, stride_dkn,
    stride_dvb, stride_dvh, stride_dvn,
    # sizes
    num_heads_kv, seqlen_q, seqlen_k, stride_stats,
    window_left, window_right,  # the band around the diagonal (kernels/common.py), used under MASK_*
    scale, qk_scale_log2,
    softcap_scale, softcap_log2, stride_alibi_b,  # the score modifications, as in the forward
    dropout_p,
    heads_per_group,  # causal launch order: (batch, key/value head) pairs that share the L2 (see program_tile)
    tuning_seqlen,  # the autotuner's key (a power of two >= both lengths); the kernel ignores it
    # meta-parameters
    GROUP_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    USE_TMA: tl.constexpr = False,  # loads through the TMA copy engine (descriptors above)
    SOFTCAP: tl.constexpr = False, ALIBI: tl.constexpr = False,  # as in the forward
    VARLEN: tl.constexpr = False, DROPOUT: tl.constexpr = False,  # as in the forward
):
    """One program per (key tile, key/value head, batch): writes dK and dV of that tile."""
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    # The query tiles a key tile sees: one loop over all of them, every tile masked (bounds-checked loads,
    # and the band's mask if any), or three loops (edge, interior, edge) whose interior compiles without
    # any mask. The three loops do less work per tile, but in their PTX the code that zeroes dK and dV for
    # a loop that runs no iteration sits between a wgmma and its wait, and ptxas then serialises every
    # wgmma of the kernel (its advisory C7515). Measured (docs/performance.md, the backward), one loop
    # pays without a band (+4% at D=64, +2% at D=128) and on the causal D=128 tiles (+7-13%), and loses
    # 6-12% on the causal D=64 tile, whose three loops keep three blocks per SM and hide each other's
    # waits. D=256 runs one stage, which is never serialised. The variants keep the three loops: they
    # were not measured, and one loop spills more with them.
    ONE_LOOP: tl.constexpr = (not (SOFTCAP or ALIBI or DROPOUT or VARLEN or MASK_LEFT)
                              and (not MASK_RIGHT or BLOCK_D == 128))
    b32, hkv32, pid_n = program_tile(MASK_RIGHT and not MASK_LEFT, heads_per_group, KEY_TILES=True)
    off_b, off_hkv = b32.to(tl.int64), hkv32.to(tl.int64)  # 64-bit for offsets, 32-bit for descriptors
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    # (the statistics' row is per query head, below: the one returned here would be unused)
    q_start, seqlen_q, k_start, seqlen_k, _ = sequence_bounds(off_b, off_hkv, num_heads_kv, seqlen_q, seqlen_k,
                                                              CU_SEQLENS_Q, CU_SEQLENS_K, VARLEN)
    if VARLEN:
        if start_n >= seqlen_k:  # the grid covers the longest sequence
            return
    band_lo = seqlen_k - seqlen_q - window_left
    band_hi = seqlen_k - seqlen_q + window_right
    diag = seqlen_k - seqlen_q
    seed = 0
    if DROPOUT:
        seed = tl.load(SEED)

    if USE_TMA:
        k = load_desc_rows(desc_k, b32, hkv32, start_n, BLOCK_N, BLOCK_D)
        v = load_desc_rows(desc_v, b32, hkv32, start_n, BLOCK_N, BLOCK_D)
    else:
        k_ptrs = column_pointers(K + off_b * stride_kb + off_hkv * stride_kh + k_start * stride_kn, BLOCK_D)
        v_ptrs = column_pointers(V + off_b * stride_vb + off_hkv * stride_vh + k_start * stride_vn, BLOCK_D)
        k = load_tile(k_ptrs, start_n, stride_kn, seqlen_k, BLOCK_N, HEAD_DIM, BLOCK_D, True, not EVEN_D)  # resident
        v = load_tile(v_ptrs, start_n, stride_vn, seqlen_k, BLOCK_N, HEAD_DIM, BLOCK_D, True, not EVEN_D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    start, unmasked_start, unmasked_end, ragged_start, end = query_tiles_for_key_tile(
        start_n, seqlen_q, band_lo, band_hi, BLOCK_M, BLOCK_N, MASK_LEFT, MASK_RIGHT)
    for g in range(GROUP_SIZE):  # every query head that reads this key/value head
        off_hq = off_hkv * GROUP_SIZE + g
        q_ptrs = column_pointers(Q + off_b * stride_qb + off_hq * stride_qh + q_start * stride_qm, BLOCK_D)
        do_ptrs = column_pointers(DO + off_b * stride_dob + off_hq * stride_doh + q_start * stride_dom, BLOCK_D)
        row = head_row_offset(off_b, off_hq, num_heads_kv * GROUP_SIZE, q_start, stride_stats, VARLEN)
        lse2_ptr = LSE2 + row
        delta_ptr = DELTA + row
        hq32 = off_hq.to(tl.int32)
        alibi_log2 = 0.0
        if ALIBI:
            alibi_log2 = tl.load(ALIBI_SLOPES + off_b * stride_alibi_b + off_hq) * LOG2E
        bh = off_b * num_heads_kv * GROUP_SIZE + off_hq  # the forward's dropout counter
        for part in tl.static_range(1 if ONE_LOOP else 3):  # [start, end), or edge, interior, edge
            if ONE_LOOP:
                lo, hi = start, end
            elif part == 0:
                lo, hi = start, unmasked_start
            elif part == 1:
                lo, hi = unmasked_start, unmasked_end
            else:
                lo, hi = ragged_start, end
            dk, dv = _dkdv_inner(dk, dv, k, v, q_ptrs, do_ptrs, stride_qm, stride_dom, desc_q, desc_do, desc_lse2,
                                 desc_delta, b32, hq32,
                                 lse2_ptr, delta_ptr, lo, hi, offs_n, seqlen_q,
                                 band_lo, band_hi, qk_scale_log2, diag, softcap_scale, softcap_log2, alibi_log2,
                                 seed, bh, dropout_p, BLOCK_M, HEAD_DIM, BLOCK_D, EVEN_D, ONE_LOOP or part != 1,
                                 ONE_LOOP, MASK_LEFT, MASK_RIGHT, INPUT_PRECISION, USE_TMA, SOFTCAP, ALIBI, DROPOUT)

    dk_ptrs = column_pointers(DK + off_b * stride_dkb + off_hkv * stride_dkh + k_start * stride_dkn, BLOCK_D)
    dv_ptrs = column_pointers(DV + off_b * stride_dvb + off_hkv * stride_dvh + k_start * stride_dvn, BLOCK_D)
    store_tile(dk_ptrs, (dk * scale).to(DK.dtype.element_ty), start_n, stride_dkn, seqlen_k, BLOCK_N, HEAD_DIM, BLOCK_D)
    store_tile(dv_ptrs, dv.to(DV.dtype.element_ty), start_n, stride_dvn, seqlen_k, BLOCK_N, HEAD_DIM, BLOCK_D)


@triton.jit
def _dq_inner(
    dq, q, do, lse_log2, delta,
    k_ptrs, v_ptrs, stride_kn, stride_vn, desc_k, desc_v, off_b, off_hkv,
    start, end, offs_m, seqlen_k, band_lo, band_hi, qk_scale_log2,
    diag, softcap_scale, softcap_log2, alibi_log2, seed, bh, dropout_p,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    MASKED: tl.constexpr, MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    USE_TMA: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, DROPOUT: tl.constexpr,
):
    """Accumulate dQ of one query tile over key tiles [start, end)."""
    for start_n in range(start, end, BLOCK_N):
        if USE_TMA:
            k = load_desc_rows(desc_k, off_b, off_hkv, start_n, BLOCK_N, BLOCK_D)
            v = load_desc_rows(desc_v, off_b, off_hkv, start_n, BLOCK_N, BLOCK_D)
        else:
            k = load_tile(k_ptrs, start_n, stride_kn, seqlen_k, BLOCK_N, HEAD_DIM, BLOCK_D, MASKED, not EVEN_D)
            v = load_tile(v_ptrs, start_n, stride_vn, seqlen_k, BLOCK_N, HEAD_DIM, BLOCK_D, MASKED, not EVEN_D)
        qk = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)  # [BLOCK_M, BLOCK_N]
        if SOFTCAP or ALIBI:
            s, tanh_s = modified_scores(qk, offs_m[:, None], start_n + tl.arange(0, BLOCK_N)[None, :], diag,
                                        qk_scale_log2, softcap_scale, softcap_log2, alibi_log2, SOFTCAP, ALIBI)
            p = tl.exp2(s - lse_log2[:, None])
        else:
            p = tl.exp2(qk * qk_scale_log2 - lse_log2[:, None])
        if MASKED:
            visible = visible_keys(offs_m, start_n + tl.arange(0, BLOCK_N), seqlen_k, band_lo, band_hi,
                                   MASK_LEFT, MASK_RIGHT)
            p = tl.where(visible, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)  # [BLOCK_M, BLOCK_N]
        if DROPOUT:
            keep = dropout_keep(seed, bh, offs_m[:, None], start_n + tl.arange(0, BLOCK_N)[None, :], dropout_p)
            dp = tl.where(keep, dp * (1.0 / (1.0 - dropout_p)), 0.0)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            ds = ds * (1.0 - tanh_s * tanh_s)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=INPUT_PRECISION)
    return dq


@triton.jit(do_not_specialize=SEQLEN_ARGS + ["window_left", "window_right", "heads_per_group", "tuning_seqlen",
                                             "stride_alibi_b"])
def attn_bwd_dq_kernel(
    # pointers; LSE2 and DELTA as in the dK/dV kernel; ALIBI_SLOPES, CU_SEQLENS_Q/K and SEED as in the forward
    Q, K, V, DO, LSE2, DELTA, DQ, ALIBI_SLOPES, CU_SEQLENS_Q, CU_SEQLENS_K, SEED,
    # (B, H, N, D) tensor descriptors of Q, K, V, dO when USE_TMA (else None)
    desc_q, desc_k, desc_v, desc_do,
    # strides (the last dim of every tensor is contiguous)
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_dob, stride_doh, stride_dom,
    stride_dqb, stride_dqh, stride_dqm,
    # sizes
    num_heads_q, seqlen_q, seqlen_k, stride_stats,
    window_left, window_right,  # the band around the diagonal, as in the dK/dV kernel
    scale, qk_scale_log2,
    softcap_scale, softcap_log2, stride_alibi_b,  # the score modifications, as in the forward
    dropout_p,
    heads_per_group,  # causal launch order (see program_tile)
    tuning_seqlen,  # the autotuner's key, as in the dK/dV kernel
    # meta-parameters
    GROUP_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    USE_TMA: tl.constexpr = False,  # loads through the TMA copy engine (descriptors above)
    SOFTCAP: tl.constexpr = False, ALIBI: tl.constexpr = False,  # as in the forward
    VARLEN: tl.constexpr = False, DROPOUT: tl.constexpr = False,  # as in the forward
):
    """One program per (query tile, query head, batch): writes dQ of that tile."""
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    off_b, off_hq, pid_m = program_tile(MASK_RIGHT and not MASK_LEFT, heads_per_group)
    b32, hq32 = off_b, off_hq  # descriptor coords
    off_b, off_hq = off_b.to(tl.int64), off_hq.to(tl.int64)
    off_hkv = off_hq // GROUP_SIZE
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q_start, seqlen_q, k_start, seqlen_k, _ = sequence_bounds(off_b, off_hq, num_heads_q, seqlen_q, seqlen_k,
                                                              CU_SEQLENS_Q, CU_SEQLENS_K, VARLEN)
    if VARLEN:
        if start_m >= seqlen_q:  # the grid covers the longest sequence
            return
    row = head_row_offset(off_b, off_hq, num_heads_q, q_start, stride_stats, VARLEN)

    k_ptrs = column_pointers(K + off_b * stride_kb + off_hkv * stride_kh + k_start * stride_kn, BLOCK_D)
    v_ptrs = column_pointers(V + off_b * stride_vb + off_hkv * stride_vh + k_start * stride_vn, BLOCK_D)
    hkv32 = off_hkv.to(tl.int32)
    if USE_TMA:
        q = load_desc_rows(desc_q, b32, hq32, start_m, BLOCK_M, BLOCK_D)
        do = load_desc_rows(desc_do, b32, hq32, start_m, BLOCK_M, BLOCK_D)
    else:
        q_ptrs = column_pointers(Q + off_b * stride_qb + off_hq * stride_qh + q_start * stride_qm, BLOCK_D)
        do_ptrs = column_pointers(DO + off_b * stride_dob + off_hq * stride_doh + q_start * stride_dom, BLOCK_D)
        q = load_tile(q_ptrs, start_m, stride_qm, seqlen_q, BLOCK_M, HEAD_DIM, BLOCK_D, True, not EVEN_D)  # resident
        do = load_tile(do_ptrs, start_m, stride_dom, seqlen_q, BLOCK_M, HEAD_DIM, BLOCK_D, True, not EVEN_D)
    row_in_range = offs_m < seqlen_q
    # Rows past seqlen_q load L = D = 0 (finite) and dO = 0; they are never stored.
    lse_log2 = tl.load(LSE2 + row + offs_m, mask=row_in_range, other=0.0)
    delta = tl.load(DELTA + row + offs_m, mask=row_in_range, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    band_lo = seqlen_k - seqlen_q - window_left
    band_hi = seqlen_k - seqlen_q + window_right
    diag = seqlen_k - seqlen_q
    alibi_log2 = 0.0
    if ALIBI:
        alibi_log2 = tl.load(ALIBI_SLOPES + off_b * stride_alibi_b + off_hq) * LOG2E
    seed = 0
    bh = off_b * num_heads_q + off_hq  # the forward's dropout counter
    if DROPOUT:
        seed = tl.load(SEED)
    start, unmasked_start, unmasked_end, end = key_tiles_for_query_tile(
        start_m, seqlen_k, band_lo, band_hi, BLOCK_M, BLOCK_N, MASK_LEFT, MASK_RIGHT)
    if MASK_LEFT:
        dq = _dq_inner(dq, q, do, lse_log2, delta, k_ptrs, v_ptrs, stride_kn, stride_vn, desc_k, desc_v, b32, hkv32,
                   start, unmasked_start,                        offs_m, seqlen_k, band_lo, band_hi, qk_scale_log2,
                       diag, softcap_scale, softcap_log2, alibi_log2, seed, bh, dropout_p,
                       BLOCK_N, HEAD_DIM, BLOCK_D, EVEN_D, True, MASK_LEFT, MASK_RIGHT, INPUT_PRECISION, USE_TMA,
                       SOFTCAP, ALIBI, DROPOUT)
    dq = _dq_inner(dq, q, do, lse_log2, delta, k_ptrs, v_ptrs, stride_kn, stride_vn, desc_k, desc_v, b32, hkv32,
                   unmasked_start, unmasked_end, offs_m, seqlen_k, band_lo, band_hi, qk_scale_log2,
                   diag, softcap_scale, softcap_log2, alibi_log2, seed, bh, dropout_p,
                   BLOCK_N, HEAD_DIM, BLOCK_D, EVEN_D, False, MASK_LEFT, MASK_RIGHT, INPUT_PRECISION, USE_TMA,
                   SOFTCAP, ALIBI, DROPOUT)
    dq = _dq_inner(dq, q, do, lse_log2, delta, k_ptrs, v_ptrs, stride_kn, stride_vn, desc_k, desc_v, b32, hkv32,
                   unmasked_end, end,                    offs_m, seqlen_k, band_lo, band_hi, qk_scale_log2,
                   diag, softcap_scale, softcap_log2, alibi_log2, seed, bh, dropout_p,
                   BLOCK_N, HEAD_DIM, BLOCK_D, EVEN_D, True, MASK_LEFT, MASK_RIGHT, INPUT_PRECISION, USE_TMA,
                   SOFTCAP, ALIBI, DROPOUT)

    dq_ptrs = column_pointers(DQ + off_b * stride_dqb + off_hq * stride_dqh + q_start * stride_dqm, BLOCK_D)
    store_tile(dq_ptrs, (dq * scale).to(DQ.dtype.element_ty), start_m, stride_dqm, seqlen_q, BLOCK_M, HEAD_DIM, BLOCK_D)
