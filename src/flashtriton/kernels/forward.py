"""FlashAttention-2 forward kernel.

One program per (query tile, query head, batch). The program loads its query tile once, streams the
key/value tiles of its head through an online softmax, and writes O and the logsumexp L once:

    m = -inf, l = 0, acc = 0                      (fp32, one per query row)
    for each visible key tile K_j, V_j:
        s   = q @ K_j^T                            (scaled inside the exp2 below)
        m'  = max(m, rowmax(s) * scale * log2(e))
        p   = exp2(s * scale * log2(e) - m')      (one FMA per score: the scale is folded in)
        l   = l * exp2(m - m') + rowsum(p)
        acc = acc * exp2(m - m') + p @ V_j
        m   = m'
    O = acc / l,  L = (m + log2(l)) * ln(2)

Supported: any seqlen_q and seqlen_k (ragged last tiles are masked, interior tiles are not), causal
masks and sliding windows aligned bottom-right (kernels/common.py; tiles outside the band are skipped),
head dims up to 256 (padded to a power of two when needed), GQA/MQA (query head h reads key/value head
h // GROUP_SIZE), fp16/bf16/fp32 inputs with fp32 accumulation.
Rows that see no key give O = 0 and L = -inf.

Tiles arrive through masked pointer loads, or with USE_TMA through tensor descriptors (Hopper's TMA copy
engine); WARP_SPECIALIZE lets the compiler give the unmasked loop's loads to a producer warp group;
QK_AHEAD (experimental, off by default) issues the next tile's q @ K^T before this tile's softmax.
"""

import triton
import triton.language as tl

from .common import (
    LN2,
    LOG2E,
    SEQLEN_ARGS,
    column_pointers,
    dropout_keep,
    key_tiles_for_query_tile,
    load_rows,
    modified_scores,
    program_tile,
    sequence_bounds,
    softmax_update,
    store_tile,
    visible_keys,
)


@triton.jit
def _fwd_inner(
    acc, l_i, m_i, q,
    k_ptrs, v_ptrs, stride_kn, stride_vn, desc_k, desc_v, off_b, off_hkv,
    start, end, offs_m, seqlen_k, band_lo, band_hi, qk_scale_log2,
    diag, softcap_scale, softcap_log2, alibi_log2, seed, bh, dropout_p,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    MASKED: tl.constexpr, MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    USE_TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
    DROPOUT: tl.constexpr, KEY_COUNTS: tl.constexpr = False,
):
    for start_n in tl.range(start, end, BLOCK_N, warp_specialize=WARP_SPECIALIZE and not MASKED):
        k = load_rows(k_ptrs, stride_kn, seqlen_k, desc_k, off_b, off_hkv, start_n, BLOCK_N, HEAD_DIM, BLOCK_D,
                      MASKED, not EVEN_D, USE_TMA)
        qk = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)  # [BLOCK_M, BLOCK_N]
        score_scale = qk_scale_log2
        if SOFTCAP or ALIBI:  # scores in log2 units already: the softmax step scales by 1
            qk, _ = modified_scores(qk, offs_m[:, None], start_n + tl.arange(0, BLOCK_N)[None, :], diag,
                                    qk_scale_log2, softcap_scale, softcap_log2, alibi_log2, SOFTCAP, ALIBI)
            score_scale = 1.0
        if MASKED:
            visible = visible_keys(offs_m, start_n + tl.arange(0, BLOCK_N), seqlen_k, band_lo, band_hi,
                                   MASK_LEFT, MASK_RIGHT)
            qk = tl.where(visible, qk, float("-inf"))
        p, alpha, l_i, m_new = softmax_update(l_i, m_i, qk, score_scale, MASKED)
        if DROPOUT:  # l keeps every probability; only the product with V drops some (rescaled at the end)
            p = tl.where(dropout_keep(seed, bh, offs_m[:, None], start_n + tl.arange(0, BLOCK_N)[None, :],
                                      dropout_p), p, 0.0)
        v = load_rows(v_ptrs, stride_vn, seqlen_k, desc_v, off_b, off_hkv, start_n, BLOCK_N, HEAD_DIM, BLOCK_D,
                      MASKED, not EVEN_D, USE_TMA)
        if MASKED and USE_TMA and KEY_COUNTS:
            # TMA zero-fills past the tensor's edge only: a padded cache's rows past the sequence's keys may
            # hold anything, NaN included, which a product with p = 0 would keep
            v = tl.where((start_n + tl.arange(0, BLOCK_N) < seqlen_k)[:, None], v, 0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=INPUT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fwd_inner_qk_ahead(
    acc, l_i, m_i, q,
    k_ptrs, v_ptrs, stride_kn, stride_vn, seqlen_k, desc_k, desc_v, off_b, off_hkv,
    start, end, qk_scale_log2,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
):
    """The unmasked loop with the next tile's q @ k^T issued before this tile's softmax, so that the
    tensor cores can work on it while the softmax runs (on Hopper the product is an asynchronous wgmma,
    waited for only where its result is used, one iteration later). Holds two score tiles in registers."""
    if start < end:
        k = load_rows(k_ptrs, stride_kn, seqlen_k, desc_k, off_b, off_hkv, start, BLOCK_N, HEAD_DIM, BLOCK_D,
                      False, not EVEN_D, USE_TMA)
        qk = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)
        for start_n in tl.range(start, end - BLOCK_N, BLOCK_N):
            k = load_rows(k_ptrs, stride_kn, seqlen_k, desc_k, off_b, off_hkv, start_n + BLOCK_N, BLOCK_N,
                          HEAD_DIM, BLOCK_D, False, not EVEN_D, USE_TMA)
            qk_next = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)
            p, alpha, l_i, m_new = softmax_update(l_i, m_i, qk, qk_scale_log2, False)
            v = load_rows(v_ptrs, stride_vn, seqlen_k, desc_v, off_b, off_hkv, start_n, BLOCK_N, HEAD_DIM, BLOCK_D,
                          False, not EVEN_D, USE_TMA)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=INPUT_PRECISION)
            m_i = m_new
            qk = qk_next
        p, alpha, l_i, m_new = softmax_update(l_i, m_i, qk, qk_scale_log2, False)
        v = load_rows(v_ptrs, stride_vn, seqlen_k, desc_v, off_b, off_hkv, end - BLOCK_N, BLOCK_N, HEAD_DIM,
                      BLOCK_D, False, not EVEN_D, USE_TMA)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=INPUT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=SEQLEN_ARGS + ["window_left", "window_right", "heads_per_group", "tuning_seqlen",
                                             "stride_alibi_b"])
def attn_fwd_kernel(
    # pointers, and (B, H, N, D) tensor descriptors when USE_TMA (else None); ALIBI_SLOPES (B or 1, Hq)
    # float32 when ALIBI (else None); CU_SEQLENS_Q/K (B + 1,) int32 when VARLEN (else None); SEED, one
    # int64, Philox's key when DROPOUT (else None); SEQUSED_K (B,) int32, how many of each sequence's
    # keys are in use in a padded K and V (a KV cache), or None for all of them
    Q, K, V, O, LSE, ALIBI_SLOPES, CU_SEQLENS_Q, CU_SEQLENS_K, SEED, SEQUSED_K,
    desc_q, desc_k, desc_v, desc_o,
    # strides (the last dim of every tensor is contiguous); LSE is a contiguous (B, Hq, seqlen_q)
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om,
    # sizes: with VARLEN, seqlen_q and seqlen_k are the packed totals (each sequence's own come from
    # CU_SEQLENS_*), and the batch strides are 0
    num_heads_q, seqlen_q, seqlen_k,
    window_left, window_right,  # the band's widths left and right of the diagonal, used under MASK_*
    qk_scale_log2,  # softmax scale * log2(e)
    softcap_scale, softcap_log2,  # scale / softcap and softcap * log2(e), used under SOFTCAP
    stride_alibi_b,  # 0 when every batch shares the slopes
    dropout_p,  # used under DROPOUT
    heads_per_group,  # causal launch order: (batch, head) pairs that share the L2 (see program_tile)
    tuning_seqlen,  # the autotuner's key (a power of two >= both lengths); the kernel ignores it
    # meta-parameters
    GROUP_SIZE: tl.constexpr,  # query heads per key/value head (1 unless GQA/MQA)
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr,  # the band is bounded on that side (causal: right)
    INPUT_PRECISION: tl.constexpr,
    USE_TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
    QK_AHEAD: tl.constexpr = False,  # issue the next tile's q @ k^T before this tile's softmax
    SOFTCAP: tl.constexpr = False,  # scores become softcap * tanh(s / softcap)
    ALIBI: tl.constexpr = False,  # scores get -slope * |i + Nk - Nq - j| (one slope per query head)
    VARLEN: tl.constexpr = False,  # a packed batch of variable-length sequences (LSE is (Hq, total_q))
    DROPOUT: tl.constexpr = False,  # drop probabilities with probability dropout_p, rescale the rest
):
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    # Causal-like bands (bounded on the right only) have query tiles whose work grows with their index.
    off_b, off_hq, pid_m = program_tile(MASK_RIGHT and not MASK_LEFT, heads_per_group)
    off_hkv = off_hq // GROUP_SIZE
    start_m = pid_m * BLOCK_M
    # int64 before multiplying by strides: batch * head offsets can pass 2**31 elements.
    b64, hq64, hkv64 = off_b.to(tl.int64), off_hq.to(tl.int64), off_hkv.to(tl.int64)
    q_start, seqlen_q, k_start, seqlen_k, lse_row = sequence_bounds(b64, hq64, num_heads_q, seqlen_q, seqlen_k,
                                                                    CU_SEQLENS_Q, CU_SEQLENS_K, VARLEN)
    if VARLEN:
        if start_m >= seqlen_q:  # the grid covers the longest sequence
            return
    KEY_COUNTS: tl.constexpr = SEQUSED_K is not None
    if KEY_COUNTS:  # the causal diagonal and the band sit at each sequence's own last key
        seqlen_k = tl.minimum(tl.load(SEQUSED_K + off_b), seqlen_k)

    q_ptrs = column_pointers(Q + b64 * stride_qb + hq64 * stride_qh + q_start * stride_qm, BLOCK_D)
    k_ptrs = column_pointers(K + b64 * stride_kb + hkv64 * stride_kh + k_start * stride_kn, BLOCK_D)
    v_ptrs = column_pointers(V + b64 * stride_vb + hkv64 * stride_vh + k_start * stride_vn, BLOCK_D)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    band_lo = seqlen_k - seqlen_q - window_left
    band_hi = seqlen_k - seqlen_q + window_right
    alibi_log2 = 0.0
    if ALIBI:
        alibi_log2 = tl.load(ALIBI_SLOPES + b64 * stride_alibi_b + hq64) * LOG2E
    diag = seqlen_k - seqlen_q
    seed = 0
    bh = off_b * num_heads_q + off_hq  # the dropout mask's third Philox counter
    if DROPOUT:
        seed = tl.load(SEED)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    q = load_rows(q_ptrs, stride_qm, seqlen_q, desc_q, off_b, off_hq, start_m, BLOCK_M, HEAD_DIM, BLOCK_D, True,
                  not EVEN_D, USE_TMA)

    start, unmasked_start, unmasked_end, end = key_tiles_for_query_tile(
        start_m, seqlen_k, band_lo, band_hi, BLOCK_M, BLOCK_N, MASK_LEFT, MASK_RIGHT)
    if MASK_LEFT:  # the band's left edge
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, desc_k, desc_v,
                                   off_b, off_hkv,
                                   start, unmasked_start, offs_m, seqlen_k, band_lo, band_hi, qk_scale_log2,
                                   diag, softcap_scale, softcap_log2, alibi_log2, seed, bh, dropout_p,
                                   BLOCK_N, HEAD_DIM, BLOCK_D, EVEN_D, True, MASK_LEFT, MASK_RIGHT, INPUT_PRECISION,
                                   USE_TMA, WARP_SPECIALIZE, SOFTCAP, ALIBI, DROPOUT, KEY_COUNTS)
    if QK_AHEAD and not SOFTCAP and not ALIBI and not DROPOUT:
        acc, l_i, m_i = _fwd_inner_qk_ahead(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, seqlen_k,
                                            desc_k, desc_v, off_b, off_hkv,
                                            unmasked_start, unmasked_end, qk_scale_log2,
                                            BLOCK_N, HEAD_DIM, BLOCK_D, EVEN_D, INPUT_PRECISION, USE_TMA)
    else:
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, desc_k, desc_v,
                                   off_b, off_hkv,
                                   unmasked_start, unmasked_end, offs_m, seqlen_k, band_lo, band_hi,
                                   qk_scale_log2, diag, softcap_scale, softcap_log2, alibi_log2, seed, bh, dropout_p,
                                   BLOCK_N, HEAD_DIM, BLOCK_D, EVEN_D, False, MASK_LEFT, MASK_RIGHT,
                                   INPUT_PRECISION, USE_TMA, WARP_SPECIALIZE, SOFTCAP, ALIBI, DROPOUT)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, desc_k, desc_v,
                                   off_b, off_hkv,
                               unmasked_end, end, offs_m, seqlen_k, band_lo, band_hi, qk_scale_log2,
                               diag, softcap_scale, softcap_log2, alibi_log2, seed, bh, dropout_p,
                               BLOCK_N, HEAD_DIM, BLOCK_D, EVEN_D, True, MASK_LEFT, MASK_RIGHT, INPUT_PRECISION,
                               USE_TMA, WARP_SPECIALIZE, SOFTCAP, ALIBI, DROPOUT, KEY_COUNTS)

    # Rows that saw no key (l = 0): O = 0 and L = -inf, not 0/0. One division per row, then a multiply per
    # value: a division per value compiles to a multiply, a select and a subnormal rescale each.
    no_key = l_i == 0.0
    l_safe = tl.where(no_key, 1.0, l_i)
    if DROPOUT:  # kept probabilities are scaled by 1 / (1 - p); L is the full softmax's
        o = (acc * (1.0 / (l_safe * (1.0 - dropout_p)))[:, None]).to(O.dtype.element_ty)
    else:
        o = (acc * (1.0 / l_safe)[:, None]).to(O.dtype.element_ty)
    lse = tl.where(no_key, float("-inf"), (m_i + tl.log2(l_safe)) * LN2)

    if USE_TMA:  # the copy engine clips rows and columns past the edges
        desc_o.store([off_b, off_hq, start_m, 0], o.reshape(1, 1, BLOCK_M, BLOCK_D))
    else:
        o_ptrs = column_pointers(O + b64 * stride_ob + hq64 * stride_oh + q_start * stride_om, BLOCK_D)
        store_tile(o_ptrs, o, start_m, stride_om, seqlen_q, BLOCK_M, HEAD_DIM, BLOCK_D)
    lse_ptr = LSE + lse_row + offs_m
    tl.store(lse_ptr, lse, mask=offs_m < seqlen_q)
