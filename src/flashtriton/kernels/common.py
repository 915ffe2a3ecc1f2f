"""Helpers shared by the forward and backward kernels: which tiles a program visits, and masked loads.

Every kernel splits its loop into tiles that need no mask (the interior, compiled without any compare or
`tl.where`) and tiles that do (the edges of the visible band and the ragged last tile). The bounds below
are where that split happens. Masks are bands aligned to the bottom-right corner: query i sees key j iff
i + band_lo <= j <= i + band_hi, with band_hi = (seqlen_k - seqlen_q) + window_right (0 when causal) if
MASK_RIGHT and band_lo = (seqlen_k - seqlen_q) - window_left if MASK_LEFT; a side without its mask is
unbounded. Causal is MASK_RIGHT with window_right = 0; a sliding window sets one or both sides.
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * LOG2E)
LN2 = tl.constexpr(0.6931471805599453)  # log(x) = log2(x) * LN2

# Sequence lengths change from call to call: specialising on them (== 1, divisible by 16) would only
# multiply compilations, since every access along the sequence is bounds-checked anyway.
SEQLEN_ARGS = ["seqlen_q", "seqlen_k"]


@triton.jit
def program_tile(CAUSAL_ORDER: tl.constexpr, heads_per_group, KEY_TILES: tl.constexpr = False):
    """(batch, head, tile along the sequence) of this program, on a grid of (tiles, heads, batch).

    Programs start roughly in launch order (grid axis 0 fastest). Two things decide which order is best:
    - L2 reuse: programs of one head share its K/V (or, for dK/dV, Q/dO). If the programs running at one
      time cover ~100 heads, those tensors outgrow the 50 MB L2 and stream from HBM once per program. So
      tiles run fastest: the resident programs cover one or two heads.
    - Causal balance: causal tiles differ in length (a query tile sees more keys the later it is; a key
      tile is seen by more queries the earlier it is, KEY_TILES). Launched in index order, or even
      longest-first within each head, the long tiles of the last heads start near the end and run alone.
      So causal programs go through heads in groups of `heads_per_group` (as many (batch, head) pairs as
      share the L2) and, within a group, take every head's longest tile first.
    """
    if CAUSAL_ORDER:
        tiles = tl.num_programs(0)
        heads = tl.num_programs(1)
        launch = tl.program_id(0) + tiles * (tl.program_id(1) + heads * tl.program_id(2))
        group = launch // (heads_per_group * tiles)
        first_bh = group * heads_per_group
        group_heads = tl.minimum(heads_per_group, heads * tl.num_programs(2) - first_bh)  # the last is short
        rank = launch - group * heads_per_group * tiles
        bh = first_bh + rank % group_heads
        longest_first = rank // group_heads
        if not KEY_TILES:
            longest_first = tiles - 1 - longest_first
        return bh // heads, bh % heads, longest_first
    return tl.program_id(2), tl.program_id(1), tl.program_id(0)


@triton.jit
def sequence_bounds(off_b, off_h, num_heads, seqlen_q, seqlen_k, CU_SEQLENS_Q, CU_SEQLENS_K, VARLEN: tl.constexpr):
    """(first row in Q, length, first row in K, length, offset of head off_h's first row in LSE) of batch
    element `off_b`. In a packed batch of variable-length sequences (VARLEN) the bounds come from the
    cumulative lengths, seqlen_q is the packed total and LSE is (H, total); otherwise every element starts
    at row 0, the lengths are the arguments and LSE is (B, H, seqlen_q)."""
    if VARLEN:
        q_start = tl.load(CU_SEQLENS_Q + off_b)
        k_start = tl.load(CU_SEQLENS_K + off_b)
        q_len = tl.load(CU_SEQLENS_Q + off_b + 1) - q_start
        k_len = tl.load(CU_SEQLENS_K + off_b + 1) - k_start
        q_start, k_start = q_start.to(tl.int64), k_start.to(tl.int64)
    else:  # plain ints: the compiler folds the offsets away
        q_start, q_len, k_start, k_len = 0, seqlen_q, 0, seqlen_k
    return q_start, q_len, k_start, k_len, head_row_offset(off_b, off_h, num_heads, q_start, seqlen_q, VARLEN)


@triton.jit
def head_row_offset(off_b, off_h, num_heads, q_start, row_stride, VARLEN: tl.constexpr):
    """Offset of head off_h's first row in an array of one value per query row: laid out (B, H, row_stride),
    or (H, row_stride) for a packed batch, whose sequence starts at q_start. LSE has row_stride = seqlen_q
    (the packed total with VARLEN); the backward's statistics (L * log2 e and D) a stride padded for TMA."""
    if VARLEN:
        return off_h * row_stride + q_start
    return (off_b * num_heads + off_h) * row_stride


@triton.jit
def _clamp(x, lo, hi):
    return tl.minimum(tl.maximum(x, lo), hi)


@triton.jit
def key_tiles_for_query_tile(
    start_m, seqlen_k, band_lo, band_hi, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr,
):
    """Key range a query tile [start_m, start_m + BLOCK_M) visits, as three loops: masked tiles
    [start, unmasked_start) (only with MASK_LEFT), whole tiles that every row sees entirely
    [unmasked_start, unmasked_end), masked tiles [unmasked_end, end). Row i sees keys
    [i + band_lo, i + band_hi]; a side without its mask is unbounded."""
    if MASK_RIGHT:
        end = _clamp(start_m + BLOCK_M + band_hi, 0, seqlen_k)  # past the last row's last visible key
        fully_seen = _clamp(start_m + band_hi + 1, 0, seqlen_k)  # keys the tile's first row already sees
    else:
        end = seqlen_k
        fully_seen = seqlen_k
    unmasked_end = (fully_seen // BLOCK_N) * BLOCK_N
    if MASK_LEFT:
        start = (_clamp(start_m + band_lo, 0, seqlen_k) // BLOCK_N) * BLOCK_N  # the first row's first key
        last_row_first = _clamp(start_m + BLOCK_M - 1 + band_lo, 0, seqlen_k)  # the last row's first key
        # A band narrower than a tile has no unmasked tiles: the first loop then runs to the end.
        unmasked_start = tl.minimum(tl.cdiv(last_row_first, BLOCK_N), tl.cdiv(end, BLOCK_N)) * BLOCK_N
        unmasked_end = tl.maximum(unmasked_end, unmasked_start)
    else:
        start = 0
        unmasked_start = 0
    return start, unmasked_start, unmasked_end, end


@triton.jit
def query_tiles_for_key_tile(
    start_n, seqlen_q, band_lo, band_hi, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr,
):
    """Query range a key tile [start_n, start_n + BLOCK_N) is seen by (query i sees key j iff
    i + band_lo <= j <= i + band_hi), as three loops: masked [start, unmasked_start), unmasked
    [unmasked_start, unmasked_end), masked [ragged_start, end). The last loop is the ragged final query
    tile (if any) and the band's far edge when it reaches it."""
    if MASK_LEFT:
        end = _clamp(start_n + BLOCK_N - band_lo, 0, seqlen_q)  # past the last query that sees the tile
        full_end = _clamp(start_n - band_lo + 1, 0, seqlen_q)  # past the last query that sees all of it
    else:
        end = seqlen_q
        full_end = seqlen_q
    unmasked_end = (full_end // BLOCK_M) * BLOCK_M
    if MASK_RIGHT:
        first_row = _clamp(start_n - band_hi, 0, seqlen_q)  # first query that sees key start_n
        full_row = _clamp(start_n + BLOCK_N - 1 - band_hi, 0, seqlen_q)  # first query that sees all keys
        start = (first_row // BLOCK_M) * BLOCK_M
        unmasked_start = tl.minimum(tl.cdiv(full_row, BLOCK_M) * BLOCK_M, unmasked_end)
    else:
        start = 0
        unmasked_start = 0
    ragged_start = tl.maximum(tl.maximum(unmasked_start, unmasked_end), start)
    return start, unmasked_start, unmasked_end, ragged_start, end


@triton.jit
def visible_keys(offs_m, offs_n, seqlen_k, band_lo, band_hi, MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr):
    """[len(offs_m), len(offs_n)] mask of the keys each query row sees: inside the sequence and the band."""
    visible = offs_n[None, :] < seqlen_k
    if MASK_RIGHT:
        visible = visible & (offs_n[None, :] <= offs_m[:, None] + band_hi)
    if MASK_LEFT:
        visible = visible & (offs_n[None, :] >= offs_m[:, None] + band_lo)
    return visible


@triton.jit
def tanh(x):
    """tanh through exp2 (the interpreter and every backend have it). |x| is clipped at 15, where tanh is
    1 to float32 precision, so that exp2 never overflows."""
    x = tl.minimum(tl.maximum(x, -15.0), 15.0)
    return 1.0 - 2.0 / (tl.exp2(x * (2.0 * LOG2E)) + 1.0)


@triton.jit
def modified_scores(qk, rows, cols, diag, qk_scale_log2, softcap_scale, softcap_log2, alibi_log2,
                    SOFTCAP: tl.constexpr, ALIBI: tl.constexpr):
    """Scores in log2 units after the optional score modifications: with SOFTCAP, softcap * tanh(s / softcap)
    of the scaled score s (softcap_scale = scale / softcap, softcap_log2 = softcap * log2(e)); with ALIBI,
    minus slope * |i + diag - j| (alibi_log2 = slope * log2(e)). `rows` and `cols` are the query and key
    indices, shaped to broadcast against qk. Returns (scores, tanh) for the backward's softcap derivative."""
    if SOFTCAP:
        t = tanh(qk * softcap_scale)
        s = t * softcap_log2
    else:
        t = qk
        s = qk * qk_scale_log2
    if ALIBI:
        s = s - alibi_log2 * tl.abs(rows + diag - cols).to(tl.float32)
    return s, t


@triton.jit
def softmax_update(l_i, m_i, qk, qk_scale_log2, MAY_BE_EMPTY: tl.constexpr):
    """One score tile's step of the online softmax: returns (p, alpha, l, m) with p the tile's
    unnormalised probabilities and alpha the factor that rescales the old state to the new running max."""
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale_log2)
    if MAY_BE_EMPTY:
        # A row with no visible key so far still has m = -inf: shift it by 0 so that exp2 gives 0
        # instead of exp2(-inf + inf) = NaN.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_shift = m_new
    p = tl.exp2(qk * qk_scale_log2 - m_shift[:, None])
    alpha = tl.exp2(m_i - m_shift)
    l_i = l_i * alpha + tl.sum(p, 1)
    return p, alpha, l_i, m_new


@triton.jit
def dropout_keep(seed, bh, rows, cols, dropout_p):
    """Which scores survive dropout: a Philox draw for each (query row, key column, batch * heads + head),
    uniform in [0, 1), kept if >= dropout_p. The forward and both backward kernels call it with the same
    counters, so they agree on the mask without storing it. `rows` and `cols` broadcast to the tile."""
    zero = rows * 0 + cols * 0  # every counter at the tile's full shape, or Philox's rounds would mix
    r, _, _, _ = tl.random.philox(seed, rows + zero, cols + zero, bh.to(tl.int32) + zero, zero)  # broadcasts away
    return tl.random.uint_to_uniform_float(r) >= dropout_p


@triton.jit
def column_pointers(base, BLOCK_D: tl.constexpr):
    """[1, BLOCK_D] pointers to the columns of one head's row-major (seqlen, HEAD_DIM) matrix at `base`.
    load_tile and store_tile add a tile's rows as 64-bit offsets (row * stride can pass 2**31 elements),
    as block pointers did: the same loads, and ptxas keeps the wgmmas asynchronous (docs/performance.md)."""
    return base + tl.arange(0, BLOCK_D)[None, :]


@triton.jit
def _tile_mask(start, seqlen, BLOCK_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr):
    """Which elements of rows [start, start + BLOCK_ROWS) lie inside the matrix, along the checked dims."""
    rows_in = (start + tl.arange(0, BLOCK_ROWS))[:, None] < seqlen
    cols_in = tl.arange(0, BLOCK_D)[None, :] < HEAD_DIM
    if CHECK_ROWS and CHECK_COLS:
        mask = rows_in & cols_in
    elif CHECK_ROWS:
        mask = rows_in
    else:
        mask = cols_in
    return mask


@triton.jit
def load_tile(ptrs, start, stride_row, seqlen, BLOCK_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
              BLOCK_D: tl.constexpr, CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr):
    """Rows [start, start + BLOCK_ROWS) through `ptrs` (column_pointers), zero past the matrix's edges along
    the dims that can run past them: the sequence (CHECK_ROWS) and a head dim padded to BLOCK_D
    (CHECK_COLS). Unchecked loads compile without any compare."""
    ptrs = ptrs + (start + tl.arange(0, BLOCK_ROWS)).to(tl.int64)[:, None] * stride_row
    if CHECK_ROWS or CHECK_COLS:
        mask = _tile_mask(start, seqlen, BLOCK_ROWS, HEAD_DIM, BLOCK_D, CHECK_ROWS, CHECK_COLS)
        tile = tl.load(ptrs, mask=mask, other=0.0)
    else:
        tile = tl.load(ptrs)
    return tile


@triton.jit
def store_tile(ptrs, value, start, stride_row, seqlen, BLOCK_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
               BLOCK_D: tl.constexpr):
    """Store `value` into rows [start, start + BLOCK_ROWS) through `ptrs`, clipped at the matrix's edges."""
    mask = _tile_mask(start, seqlen, BLOCK_ROWS, HEAD_DIM, BLOCK_D, True, True)
    tl.store(ptrs + (start + tl.arange(0, BLOCK_ROWS)).to(tl.int64)[:, None] * stride_row, value, mask=mask)


@triton.jit
def load_rows(ptrs, stride_row, seqlen, desc, off_b, off_h, start, BLOCK_ROWS: tl.constexpr,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr,
              USE_TMA: tl.constexpr):
    """Rows [start, start + BLOCK_ROWS) of one head, zero past the tensor's edges.

    With USE_TMA, through a (B, H, N, D) tensor descriptor: Hopper's TMA unit copies the tile into shared
    memory asynchronously and zero-fills what lies out of bounds itself. Otherwise through pointers to
    the head's columns (column_pointers), masked only along the dims that can run past the edge."""
    if USE_TMA:
        tile = load_desc_rows(desc, off_b, off_h, start, BLOCK_ROWS, BLOCK_D)
    else:
        tile = load_tile(ptrs, start, stride_row, seqlen, BLOCK_ROWS, HEAD_DIM, BLOCK_D, CHECK_ROWS, CHECK_COLS)
    return tile


@triton.jit
def load_desc_rows(desc, off_b, off_h, start, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows [start, start + BLOCK_ROWS) of head (off_b, off_h) through a (B, H, N, D) tensor descriptor
    (32-bit coordinates); the TMA unit zero-fills what lies past the edges."""
    return desc.load([off_b, off_h, start, 0]).reshape(BLOCK_ROWS, BLOCK_D)


@triton.jit
def dropout_mask_kernel(SEED, KEEP, num_heads, seqlen_q, seqlen_k, dropout_p,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """KEEP[b, h, i, j] (int8, contiguous (B, H, Nq, Nk)) = the attention kernels' dropout decision: for
    tests and return_attn_probs, at sizes where an (Nq, Nk) matrix per head is fine."""
    off_bh = tl.program_id(2)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    keep = dropout_keep(tl.load(SEED), off_bh, rows, cols, dropout_p)
    ptrs = KEEP + off_bh.to(tl.int64) * seqlen_q * seqlen_k + rows * seqlen_k + cols
    tl.store(ptrs, keep.to(tl.int8), mask=(rows < seqlen_q) & (cols < seqlen_k))
