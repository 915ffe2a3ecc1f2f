"""Decoding against a KV cache: a few query tokens per sequence, many cached keys (flash-decoding).

With Nq = 1 the forward kernel (forward.py) gives one program per (query head, batch) and streams every
key through it: most of the GPU idles, and the query heads of a GQA group each read the same K/V again.
Decoding does almost no arithmetic per byte, so its limit is HBM bandwidth, and two changes reach it:

- GQA packing: a program takes every query head that shares one K/V head, and every query token, as the
  rows of one tile (row r = token r // GROUP_SIZE of head r % GROUP_SIZE), so that each K/V element is
  read once per group;
- split-KV: the keys of a sequence are split over num_splits programs (grid axis 0). Each writes a
  partial O (normalised, fp32) and its logsumexp; `attn_decode_combine_kernel` merges them exactly:

      L = log2(sum_s 2^L_s),   O = sum_s 2^(L_s - L) O_s          (L_s in log2 units)

The cache is contiguous, (B_cache, Hkv, Nmax, D) in strides (any layout), with CACHE_BATCH_IDX mapping a
sequence to its cache row; or PAGED, (num_blocks, Hkv, PAGE_SIZE, D), where BLOCK_TABLE[b, j] holds the
block of sequence b's keys [j * PAGE_SIZE, (j + 1) * PAGE_SIZE). Sequence b has CACHE_SEQLENS[b] keys
(or `cache_seqlen` for all; at most what the cache holds), starting at CACHE_LEFTPAD[b] (left padding).
Its Nq queries are its last Nq positions: query i sits at position seqlen - Nq + i, and the causal mask
and the window are aligned there (bottom-right, as everywhere in this library). Rows that see no key
give O = 0 and L = -inf. An FP8 cache (e4m3, with K_DESCALE and V_DESCALE) is widened tile by tile to
q's dtype, or to fp16 for a bf16 q (scaled into fp16's range by a power of two): the kernel then reads
half the bytes, and the factors scale the scores and the output in fp32.
"""

import triton
import triton.language as tl

from .common import LN2, LOG2E, load_desc_rows, modified_scores, softmax_update


@triton.jit
def _row_pages(BLOCK_TABLE, block_row, start_n, end, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """The block of each key row [start_n, start_n + BLOCK_N) of a paged cache whose blocks are shorter
    than a key tile; 0 for rows past `end`, whose entries (maybe past the table) are not read."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    return tl.load(BLOCK_TABLE + block_row + offs_n // PAGE_SIZE, mask=offs_n < end, other=0).to(tl.int64)


@triton.jit
def _key_offsets(BLOCK_TABLE, block_row, cache_row, start_n, row_pages, stride_kb, stride_kn, stride_vb, stride_vn,
                 BLOCK_N: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """64-bit element offsets of the tile's key rows [start_n, start_n + BLOCK_N) in K and V: one block
    table entry per tile when a tile lies within a block (PAGE_SIZE a multiple of BLOCK_N), else
    `row_pages` (_row_pages, loaded a tile ahead); in a contiguous cache, rows of the sequence's cache row."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    if PAGED:
        if PAGE_SIZE % BLOCK_N == 0:
            page = tl.load(BLOCK_TABLE + block_row + start_n // PAGE_SIZE).to(tl.int64)
        else:
            page = row_pages
        rows = (offs_n % PAGE_SIZE).to(tl.int64)
        return page * stride_kb + rows * stride_kn, page * stride_vb + rows * stride_vn
    rows = offs_n.to(tl.int64)
    return cache_row * stride_kb + rows * stride_kn, cache_row * stride_vb + rows * stride_vn


@triton.jit
def _tile_origin(BLOCK_TABLE, block_row, cache_row, start_n, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """The (cache row or block, row within it) of key row `start_n` of a contiguous cache, or of a paged
    one whose blocks hold whole key tiles: where a tensor descriptor's tile starts (32-bit coordinates)."""
    if PAGED:
        return tl.load(BLOCK_TABLE + block_row + start_n // PAGE_SIZE), start_n % PAGE_SIZE
    return cache_row.to(tl.int32), start_n


@triton.jit(do_not_specialize=["seqlen_q", "cache_seqlen", "window_left", "window_right", "stride_alibi_b",
                               "capacity"])
def attn_decode_kernel(
    # Q (B, Hq, Nq, D); K, V the cache; O (B, Hq, Nq, D) and LSE (B, Hq, Nq) or None without SPLIT, else the
    # partials O_PART (B, Hq, Nq, num_splits, BLOCK_D) and LSE_PART (B, Hq, Nq, num_splits), fp32 and
    # contiguous. CACHE_SEQLENS, CACHE_BATCH_IDX, CACHE_LEFTPAD (B,) int32, BLOCK_TABLE (B, max_blocks)
    # int32, ALIBI_SLOPES (B or 1, Hq) float32: None where not used. K_DESCALE, V_DESCALE: an FP8 cache's
    # float32 factors per (batch, KV head) at strides (stride_kdb, stride_kdh) and (stride_vdb, stride_vdh),
    # 0 for one per tensor (the attention is that of K * k_descale and V * v_descale), or None for 1.
    # DESC_K, DESC_V: (cache rows or blocks, Hkv, rows, D) tensor descriptors of K and V with [1, 1, BLOCK_N,
    # BLOCK_D] boxes, or None to read the tiles through pointers (launch/decode.py says when).
    Q, K, V, O, LSE, CACHE_SEQLENS, CACHE_BATCH_IDX, CACHE_LEFTPAD, BLOCK_TABLE, ALIBI_SLOPES, K_DESCALE, V_DESCALE,
    DESC_K, DESC_V,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,  # (cache row or block, head, row within it)
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om,
    stride_btb,
    num_heads_q, seqlen_q,
    cache_seqlen,  # every sequence's key count when CACHE_SEQLENS is None
    capacity,  # the keys a sequence's cache can hold: Nmax, or the block table's width x PAGE_SIZE
    window_left, window_right,
    qk_scale_log2, softcap_scale, softcap_log2, stride_alibi_b,
    stride_kdb, stride_kdh, stride_vdb, stride_vdh,
    num_splits,  # programs along the keys (grid axis 0)
    GROUP_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,  # SPLIT: num_splits > 1
    MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    PAGED: tl.constexpr = False, PAGE_SIZE: tl.constexpr = 1,
    SOFTCAP: tl.constexpr = False, ALIBI: tl.constexpr = False,
):
    split = tl.program_id(0)
    m_tiles = tl.cdiv(seqlen_q * GROUP_SIZE, BLOCK_M)
    off_hkv = tl.program_id(1) // m_tiles
    start_m = (tl.program_id(1) % m_tiles) * BLOCK_M
    off_b = tl.program_id(2)
    b64 = off_b.to(tl.int64)

    # The tile's rows: (query token, query head of the group).
    offs_r = start_m + tl.arange(0, BLOCK_M)
    token = offs_r // GROUP_SIZE
    head = off_hkv * GROUP_SIZE + offs_r % GROUP_SIZE
    row_in = offs_r < seqlen_q * GROUP_SIZE
    offs_d = tl.arange(0, BLOCK_D)
    d_in = offs_d < HEAD_DIM

    seqlen_k = cache_seqlen
    if CACHE_SEQLENS is not None:
        seqlen_k = tl.load(CACHE_SEQLENS + off_b)
    first_key = 0
    if CACHE_LEFTPAD is not None:
        first_key = tl.load(CACHE_LEFTPAD + off_b)
    cache_row = b64
    if CACHE_BATCH_IDX is not None:
        cache_row = tl.load(CACHE_BATCH_IDX + off_b).to(tl.int64)
    # Never read past the block table or the cache, whatever the lengths say: the host checks them only
    # where it can read them (not under CUDA-graph capture), and a length still being written by another
    # stream is garbage.
    seqlen_k = tl.minimum(seqlen_k, capacity)
    position = seqlen_k - seqlen_q + token  # each query's own position among the keys

    # The keys this tile's rows may see, then this program's share of them, in whole key tiles.
    lo = first_key
    hi = seqlen_k
    if MASK_LEFT:
        lo = tl.maximum(lo, seqlen_k - seqlen_q + start_m // GROUP_SIZE - window_left)
    if MASK_RIGHT:
        last_token = tl.minimum(start_m + BLOCK_M - 1, seqlen_q * GROUP_SIZE - 1) // GROUP_SIZE
        hi = tl.minimum(hi, seqlen_k - seqlen_q + last_token + window_right + 1)
    lo = (tl.maximum(lo, 0) // BLOCK_N) * BLOCK_N
    tiles_per_split = tl.cdiv(tl.cdiv(tl.maximum(hi - lo, 0), BLOCK_N), num_splits)
    start = lo + split * tiles_per_split * BLOCK_N
    end = tl.minimum(hi, start + tiles_per_split * BLOCK_N)

    q_ptrs = (Q + b64 * stride_qb + head.to(tl.int64)[:, None] * stride_qh + token.to(tl.int64)[:, None] * stride_qm
              + offs_d[None, :])
    q = tl.load(q_ptrs, mask=row_in[:, None] & d_in[None, :], other=0.0)
    k_base = K + off_hkv.to(tl.int64) * stride_kh + offs_d[None, :]
    v_base = V + off_hkv.to(tl.int64) * stride_vh + offs_d[None, :]
    block_row = b64 * stride_btb
    alibi_log2 = 0.0
    if ALIBI:
        alibi_log2 = (tl.load(ALIBI_SLOPES + b64 * stride_alibi_b + head, mask=row_in, other=0.0) * LOG2E)[:, None]

    k_descale = 1.0
    v_descale = 1.0
    if K_DESCALE is not None:  # per (batch, KV head), folded into the scores in fp32
        k_descale = tl.load(K_DESCALE + b64 * stride_kdb + off_hkv * stride_kdh)
    if V_DESCALE is not None:  # and into the output
        v_descale = tl.load(V_DESCALE + b64 * stride_vdb + off_hkv * stride_vdh)
    FP8: tl.constexpr = K.dtype.element_ty == tl.float8e4nv
    if FP8 and q.dtype == tl.bfloat16:
        # The products run in fp16, which holds every e4m3 value exactly and takes one conversion per two
        # (bf16 takes three per two, and the conversion unit, not memory, bounded the loop:
        # docs/performance.md, entry 62). q is scaled by a power of two that puts its largest element in
        # [2^14, 2^15), so that none overflows fp16 and its bf16 bits are kept; the scores take it back.
        # (fp16 and float32 queries keep their own dtype.)
        q32 = q.to(tl.float32)
        q_scale = tl.exp2(14.0 - tl.floor(tl.log2(tl.maximum(tl.max(tl.abs(q32)), 1e-30))))
        q = (q32 * q_scale).to(tl.float16)
        k_descale = k_descale / q_scale

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # Blocks shorter than a key tile: each row's address waits on its block-table entry, so the entries
    # of the next tile are loaded while this one streams (docs/performance.md, entry 49).
    GATHERED: tl.constexpr = PAGED and PAGE_SIZE % BLOCK_N != 0
    USE_TMA: tl.constexpr = DESC_K is not None
    next_pages = tl.zeros([BLOCK_N], dtype=tl.int64)
    if GATHERED:
        next_pages = _row_pages(BLOCK_TABLE, block_row, start, end, BLOCK_N, PAGE_SIZE)
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        key_in = (offs_n < end) & (offs_n >= first_key)
        row_pages = next_pages
        if GATHERED:
            next_pages = _row_pages(BLOCK_TABLE, block_row, start_n + BLOCK_N, end, BLOCK_N, PAGE_SIZE)
        if USE_TMA:
            tile_b, tile_n = _tile_origin(BLOCK_TABLE, block_row, cache_row, start_n, PAGED, PAGE_SIZE)
            k = load_desc_rows(DESC_K, tile_b, off_hkv, tile_n, BLOCK_N, BLOCK_D)
        else:
            k_offsets, v_offsets = _key_offsets(BLOCK_TABLE, block_row, cache_row, start_n, row_pages, stride_kb,
                                                stride_kn, stride_vb, stride_vn, BLOCK_N, PAGED, PAGE_SIZE)
            kv_mask = key_in[:, None] & d_in[None, :]
            k = tl.load(k_base + k_offsets[:, None], mask=kv_mask, other=0.0)
        # An FP8 cache's tiles are widened in registers: half the bytes from memory, where
        # decoding spends its time
        k = k.to(q.dtype)
        qk = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)
        if FP8:
            qk = qk * k_descale
        score_scale = qk_scale_log2
        if SOFTCAP or ALIBI:
            qk, _ = modified_scores(qk, position[:, None], offs_n[None, :], 0, qk_scale_log2, softcap_scale,
                                    softcap_log2, alibi_log2, SOFTCAP, ALIBI)
            score_scale = 1.0
        visible = key_in[None, :] & row_in[:, None]
        if MASK_RIGHT:
            visible = visible & (offs_n[None, :] <= position[:, None] + window_right)
        if MASK_LEFT:
            visible = visible & (offs_n[None, :] >= position[:, None] - window_left)
        qk = tl.where(visible, qk, float("-inf"))
        p, alpha, l_i, m_new = softmax_update(l_i, m_i, qk, score_scale, True)
        if USE_TMA:
            # The cache past a sequence's length (or before its left padding) may hold anything, NaN
            # included, and a product with p = 0 would keep a NaN: those rows are zeroed here, as the
            # pointer loads' mask does.
            v = tl.where(key_in[:, None], load_desc_rows(DESC_V, tile_b, off_hkv, tile_n, BLOCK_N, BLOCK_D), 0.0)
        else:
            v = tl.load(v_base + v_offsets[:, None], mask=kv_mask, other=0.0)
        v = v.to(q.dtype)
        acc = tl.dot(p.to(q.dtype), v, acc * alpha[:, None], input_precision=INPUT_PRECISION)
        m_i = m_new

    no_key = l_i == 0.0
    l_safe = tl.where(no_key, 1.0, l_i)
    o = acc * (1.0 / l_safe)[:, None]  # a division per row, not per value
    if V_DESCALE is not None:
        o = o * v_descale
    lse2 = tl.where(no_key, float("-inf"), m_i + tl.log2(l_safe))  # log2 units
    row = (b64 * num_heads_q + head) * seqlen_q + token  # (b, head, token) in a contiguous (B, Hq, Nq)
    if not SPLIT:
        o_ptrs = (O + b64 * stride_ob + head.to(tl.int64)[:, None] * stride_oh
                  + token.to(tl.int64)[:, None] * stride_om + offs_d[None, :])
        tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_in[:, None] & d_in[None, :])
        if LSE is not None:
            tl.store(LSE + row, lse2 * LN2, mask=row_in)
    else:
        part = row.to(tl.int64) * num_splits + split
        tl.store(O + part[:, None] * BLOCK_D + offs_d[None, :], o, mask=row_in[:, None])
        tl.store(LSE + part, lse2, mask=row_in)


@triton.jit
def attn_decode_combine_kernel(
    O_PART, LSE_PART, O, LSE,  # partials as attn_decode_kernel writes them; O (B, Hq, Nq, D), LSE (B, Hq, Nq) or None
    stride_ob, stride_oh, stride_om,
    num_heads_q, seqlen_q, num_splits,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,  # BLOCK_S: a power of 2 >= num_splits
):
    """One program per (query token, query head, batch): the exact merge of its num_splits partials."""
    token, head, off_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    row = (off_b.to(tl.int64) * num_heads_q + head) * seqlen_q + token
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    lse_s = tl.load(LSE_PART + row * num_splits + offs_s, mask=offs_s < num_splits, other=float("-inf"))
    lse_max = tl.max(lse_s, 0)
    shift = tl.where(lse_max == float("-inf"), 0.0, lse_max)  # every split empty: weights 0, not NaN
    weight = tl.exp2(lse_s - shift)
    total = tl.sum(weight, 0)
    o_s = tl.load(O_PART + (row * num_splits + offs_s)[:, None] * BLOCK_D + offs_d[None, :],
                  mask=(offs_s < num_splits)[:, None], other=0.0)
    total_safe = tl.where(total == 0.0, 1.0, total)
    o = tl.sum(o_s * weight[:, None], 0) / total_safe
    o_ptrs = O + off_b.to(tl.int64) * stride_ob + head.to(tl.int64) * stride_oh + token.to(tl.int64) * stride_om
    tl.store(o_ptrs + offs_d, o.to(O.dtype.element_ty), mask=offs_d < HEAD_DIM)
    if LSE is not None:
        tl.store(LSE + row, tl.where(total == 0.0, float("-inf"), (shift + tl.log2(total_safe)) * LN2))
