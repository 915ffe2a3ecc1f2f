"""Sliding windows: the band i + Nk - Nq - left <= j <= i + Nk - Nq + right, alone and with the causal
mask, through the forward and both backward kernels. On CPU the interpreter's tiles are 32 queries x 16
keys (forward, dQ) and 32 keys x 16 queries (dK/dV), so bands narrower and wider than a tile, bands that
start or end mid-tile, and rows that see no key are all covered."""

import pytest
import torch
import triton
import triton.language as tl

from conftest import DEVICE, ON_GPU
from flashtriton import flash_attention
from flashtriton.kernels.backward import _band_mask_by_row_t, _band_mask_t
from flashtriton.launch import TileConfig
from flashtriton.reference import _visible
from helpers import check_against_reference, make_qkv, with_backward_tiles

WINDOWS = [(0, 0), (5, 0), (40, 0), (3, 9), (0, 20), (-1, 7), (17, -1), (100, 100)]
SIZES = [(97, 63), (63, 97), (1, 17), (130, 130)] if not ON_GPU else [(1000, 700), (700, 1000), (1, 300)]


def _window(is_causal, window):
    return lambda q, k, v: flash_attention(q, k, v, is_causal=is_causal, window_size=window, return_lse=True)


@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("is_causal", [False, True], ids=["window", "window+causal"])
def test_sliding_window_matches_reference(window, is_causal):
    """O, L, dQ, dK, dV against float64 with GQA, for every size; rows that see no key get O = 0, L = -inf.
    One sequence of 2/1 heads on CPU (the interpreter's time grows with the programs; batch strides are
    the dense tests' concern), two of 4/2 on a GPU."""
    for seqlen_q, seqlen_k in SIZES:
        q, k, v = make_qkv(*((2, 4, 2) if ON_GPU else (1, 2, 1)), seqlen_q, seqlen_k, 32, torch.bfloat16, DEVICE)
        check_against_reference(_window(is_causal, window), q, k, v, is_causal, window_size=window)


@pytest.mark.parametrize("head_dim", [40, 64])
def test_window_with_odd_head_dims_and_float32(head_dim):
    q, k, v = make_qkv(1, 2, 1, 75, 90, head_dim, torch.float32, DEVICE)
    check_against_reference(_window(False, (11, 4)), q, k, v, False, window_size=(11, 4))


@pytest.mark.parametrize("configs", [(TileConfig(16, 32, use_tma=True), TileConfig(32, 16, use_tma=True)),
                                     (TileConfig(16, 32), TileConfig(32, 16)),
                                     (TileConfig(16, 128, use_tma=True), TileConfig(32, 16))],
                         ids=["tma", "pointer-loads", "128-key-tiles"])
def test_window_on_both_backward_data_paths(configs):
    """Pointer loads and TMA loads in the backward kernels, with a band that starts and ends mid-tile."""
    q, k, v = make_qkv(1, 2, 2, 83, 71, 32, torch.float16, DEVICE)
    check_against_reference(lambda q, k, v: with_backward_tiles(q, k, v, True, configs, None, (13, -1)),
                            q, k, v, True, window_size=(13, -1))


@pytest.mark.parametrize("window", [(5, 0), (0, 20)], ids=str)
def test_window_through_the_autotuners(window):
    """The autotuned forward and backward key on the band's two masks."""
    q, k, v = make_qkv(1, 2, 1, 70, 45, 64, torch.float16, DEVICE)
    check_against_reference(lambda q, k, v: with_backward_tiles(q, k, v, False, None, True, window),
                            q, k, v, False, window_size=window)


def test_rows_outside_every_window_are_zero_with_zero_gradients():
    """window (0, 0) with Nq > Nk: query i sees only key i + Nk - Nq, so the first Nq - Nk see nothing."""
    seqlen_q, seqlen_k = 50, 20
    q, k, v = make_qkv(1, 2, 2, seqlen_q, seqlen_k, 32, torch.bfloat16, DEVICE)
    o, lse = flash_attention(q, k, v, window_size=(0, 0), return_lse=True)
    blind = seqlen_q - seqlen_k
    assert torch.all(o[:, :, :blind] == 0) and torch.all(torch.isneginf(lse[:, :, :blind]))
    assert torch.all(torch.isfinite(lse[:, :, blind:]))
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), torch.randn_like(o))
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv)) and torch.all(dq[:, :, :blind] == 0)


def test_reference_band_matches_the_documented_pictures():
    # flash_attention's docstring: Nq = Nk = 5 with (2, 0) and (1, 1)
    left = _visible(5, 5, False, torch.device("cpu"), (2, 0)).int().tolist()
    assert left == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 1, 1, 1, 0], [0, 0, 1, 1, 1]]
    both = _visible(5, 5, False, torch.device("cpu"), (1, 1)).int().tolist()
    assert both == [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 1, 1, 1, 0], [0, 0, 1, 1, 1], [0, 0, 0, 1, 1]]
    # causal and a window: the intersection; (-1, -1) and not causal: no mask at all
    assert torch.equal(_visible(4, 6, True, torch.device("cpu"), (-1, 3)), _visible(4, 6, True, torch.device("cpu")))
    assert _visible(4, 6, False, torch.device("cpu"), (-1, -1)) is None


@pytest.mark.parametrize("bad,error,match", [
    ((1, 2, 3), TypeError, "pair of ints"), ("(1, 2)", TypeError, "pair of ints"), ((1.0, 2), TypeError, "pair"),
    ((True, 2), TypeError, "pair of ints"), ((-2, 0), ValueError, "below -1"), ((4, -5), ValueError, "below -1"),
])
def test_bad_window_size_is_a_clear_error(bad, error, match):
    q, k, v = make_qkv(1, 1, 1, 8, 8, 16, torch.float32, DEVICE, requires_grad=False)
    with pytest.raises(error, match=match):
        flash_attention(q, k, v, window_size=bad)


@triton.jit
def _both_band_masks_kernel(FULL_TILE, BY_ROW, start_m, start_n, band_lo, band_hi, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr, MASK_LEFT: tl.constexpr, MASK_RIGHT: tl.constexpr):
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    ones = tl.full([BLOCK_N, BLOCK_M], 1.0, tl.float32)
    at = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
    tl.store(FULL_TILE + at, _band_mask_t(ones, offs_m, offs_n, band_lo, band_hi, MASK_LEFT, MASK_RIGHT))
    tl.store(BY_ROW + at, _band_mask_by_row_t(ones, start_m, offs_n, band_lo, band_hi, BLOCK_M, MASK_LEFT,
                                              MASK_RIGHT))


@pytest.mark.parametrize("mask_left,mask_right", [(False, True), (True, False), (True, True)],
                         ids=["right", "left", "both"])
def test_the_dkdv_kernel_s_two_mask_forms_agree(mask_left, mask_right):
    """The dK/dV kernel masks its transposed [keys, queries] tiles two ways: over the full tile of indices
    (three loops) or by key row (one loop, NOTES entry 33). Both must be the band: key j visible to
    query i iff i + band_lo <= j <= i + band_hi, for tiles on, above and below it."""
    gen = torch.Generator().manual_seed(0)
    block_m, block_n = 16, 32
    for _ in range(12):
        start_m, start_n = (int(x) * 16 for x in torch.randint(0, 8, (2,), generator=gen))
        band_lo, band_hi = sorted(int(x) for x in torch.randint(-40, 40, (2,), generator=gen))
        full_tile, by_row = (torch.full((block_n, block_m), float("nan"), device=DEVICE) for _ in range(2))
        _both_band_masks_kernel[(1,)](full_tile, by_row, start_m, start_n, band_lo, band_hi, block_m, block_n,
                                      mask_left, mask_right)
        queries = torch.arange(start_m, start_m + block_m, device=DEVICE)[None, :]
        keys = torch.arange(start_n, start_n + block_n, device=DEVICE)[:, None]
        band = torch.ones(block_n, block_m, dtype=torch.bool, device=DEVICE)
        if mask_right:
            band &= keys <= queries + band_hi
        if mask_left:
            band &= keys >= queries + band_lo
        assert torch.equal(full_tile, band.float()), (start_m, start_n, band_lo, band_hi)
        assert torch.equal(by_row, band.float()), (start_m, start_n, band_lo, band_hi)
