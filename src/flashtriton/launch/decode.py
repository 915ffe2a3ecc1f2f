"""The decode launcher: attention of a few query tokens per sequence against a KV cache, contiguous or
paged, with split-KV (kernels/decode.py); and the in-place append of new keys and values to the cache.

Layouts (the public API checked them): q (B, Hq, Nq, D); a contiguous cache (B_cache, Hkv, Nmax, D) or a
paged one (num_blocks, Hkv, block_size, D), any strides whose last is 1 (flash_attn's (B, N, H, D) is a
transpose away).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from .. import _interpreter
from ..cache import CACHE
from ..kernels.decode import attn_decode_combine_kernel, attn_decode_kernel
from . import replay
from .arguments import COMPILE_OPTIONS, LOG2E, band, cdiv, input_precision, next_power_of_2, score_mods, sm_count
from .descriptors import descriptor, tma_strides
from .forward import attention_forward, empty_in_order
from .replay import Recorded
from .runner import LaunchSpec, run
from .tiles import TileConfig, block_d

# Split-KV heuristic (docs/performance.md, entries 40 and 42): enough programs for PROGRAMS_PER_SM on every
# SM (the default tiles' shared memory lets three run at once), the split count rounded up to a power of
# two (the H200 A/B measured 3 splits slower than 2 and 4), but no split shorter than MIN_TILES_PER_SPLIT
# key tiles (its partial's write and merge would cost more than its keys), and at most MAX_SPLITS. A paged
# cache whose blocks are shorter than a key tile takes twice the splits: each key row's address then
# waits on its own block-table load, and the H200 A/B of entry 44 measured one split at 0.73-0.89x of the
# contiguous cache's speed and two at 0.89-0.98x, on 512-2048 programs. The 32-key tiles such blocks now
# take at D = 128 (decode_tiles) were fastest at the plain count (entry 64), so they do not double it.
PROGRAMS_PER_SM = 3
MIN_TILES_PER_SPLIT = 2
MAX_SPLITS = 128
# Blocks shorter than this many keys take decode_tiles' 32-key tiles at 64 < D <= 128 (bf16, fp16), where
# each program's share of a sequence holds at least SHORT_TILES_FROM_KEYS keys; shorter shares keep the
# 64-key tiles (block 16 on the H200, entry 64: 128 keys a program took 1.28-1.31x the contiguous cache's
# time in 32-key tiles, 1.10-1.11x in 64-key ones; from 512 keys, 32-key tiles took 1.02-1.06x).
PAGED_KEY_TILE_FROM = 64
SHORT_TILES_FROM_KEYS = 512
# A call with at least this many query tokens per sequence on a contiguous cache (not FP8) without
# cache_batch_idx or left padding (a chunked prefill) runs the dense forward kernel (DensePrefill), with
# each sequence's key count when the lengths are a tensor: its TMA tiles and unmasked interior beat the
# decode kernel's once the query tile is full (at Nq 512 on the H200: 673 against 265 TFLOP/s, entry 64).
DENSE_FROM_QUERIES = 128
# Calls reading at least this many bytes of K and V take their tiles through TMA (decode_uses_tma). The
# H200 A/B of entry 63: 2.3-2.9% faster on 537-1074 MB of short sequences (1024 keys), even on long ones,
# 5% slower on 33 MB; what lies between was not measured and keeps pointers.
TMA_FROM_BYTES = 256 << 20
# The merge takes one warp per this many partial elements (splits x padded head dim) of a row, at most
# 128 a thread: fewer warps left it faster on the H200 (one warp for 8 splits at D = 128: 69.5 against
# 71.9 µs with four, entry 65), and more elements a thread spill registers.
MERGE_ELEMENTS_PER_WARP = 4096


def decode_tiles(rows: int, head_dim: int, fp8: bool = False, masked: bool = False, page_size: int = 0) -> TileConfig:
    """A row tile that holds the group's query heads times the query tokens (16 at least, tl.dot's
    minimum; 64 at most, larger groups take several tiles) and a key tile of 16 KB of K at D <= 128 (the
    H200 sweep of docs/performance.md, "Decoding": two stages, four warps). An FP8 cache (`fp8`) gathers
    V's bytes into registers, which leaves fewer programs per SM, so it keeps more bytes in flight in each:
    key tiles twice as long (16 KB of K at D = 128, as bf16's) in three stages (entry 62). At D = 64 with one
    16-row tile and no mask (`masked`: a causal or window mask in the kernel), 128 keys under a cap of 128
    registers instead let four programs share an SM where two did: 1.08-1.09x on the H200; the same at
    D = 128 won one row and lost another (entry 63). Under the cap, Triton 3.9 spills the masked forms and
    larger row tiles, so those keep the longer tile. A paged bf16 or fp16 cache at 64 < D <= 128 whose
    blocks (`page_size`, 0 for a contiguous cache) are shorter than the 64-key tile takes 32-key tiles
    in four stages: each row's address waits on its block-table entry, and shorter tiles, more of them in
    flight, hide that wait (block 16: from 1.09-1.25x the contiguous cache's time to 1.02-1.06x at one
    split, entry 64)."""
    block_m = max(16, min(next_power_of_2(rows), 64))
    if fp8 and head_dim <= 64 and block_m == 16 and not masked:
        return TileConfig(16, 128, num_warps=4, num_stages=3, max_registers=128)
    if fp8 and head_dim <= 128:
        return TileConfig(block_m, 256 if head_dim <= 64 else 128, num_warps=4, num_stages=3)
    if 64 < head_dim <= 128 and 0 < page_size < PAGED_KEY_TILE_FROM:
        return TileConfig(block_m, 32, num_warps=4, num_stages=4)
    if head_dim <= 128:
        return TileConfig(block_m, 128 if head_dim <= 64 else 64, num_warps=4, num_stages=2)
    return TileConfig(block_m, 32, num_warps=4, num_stages=3)


def merge_warps(block_s: int, block_d: int) -> int:
    """The merge kernel's warps for a row of `block_s` partials of `block_d` columns (powers of two)."""
    return min(8, max(1, block_s * block_d // MERGE_ELEMENTS_PER_WARP))


def decode_splits(programs: int, max_keys: int, block_n: int, sms: int, gathered: bool = False) -> int:
    """How many programs share one sequence's keys, for `programs` (batch x KV heads x row tiles), the
    longest sequence's `max_keys` and the GPU's `sms`; `gathered`: a paged cache's blocks are shorter
    than a key tile of PAGED_KEY_TILE_FROM keys or more (see the constants above)."""
    wanted = next_power_of_2(cdiv(PROGRAMS_PER_SM * sms, max(programs, 1))) * (2 if gathered else 1)
    return max(1, min(wanted, cdiv(cdiv(max_keys, block_n), MIN_TILES_PER_SPLIT), MAX_SPLITS))


def decode_uses_tma(kv_bytes: int, page_size: int, block_n: int, fp8: bool) -> bool:
    """Whether a call whose sequences hold `kv_bytes` of K and V (at most) reads its tiles through TMA
    rather than pointers, where its cache allows it (contiguous, or blocks of whole key tiles: TMA on
    sm_90 has no row gather). Small calls keep pointers (TMA_FROM_BYTES), and so do FP8 caches: through
    TMA, V needs no byte gather, yet they took 13-26% longer on the H200 (entry 63)."""
    return kv_bytes >= TMA_FROM_BYTES and page_size % block_n == 0 and not fp8


class DecodeGeometry(NamedTuple):
    """A decode call's tiles, split count, padded head dim, grid and the merge's split block (a power of
    two >= splits)."""
    tiles: TileConfig
    splits: int
    block_d: int
    grid: tuple[int, int, int]
    block_s: int


@functools.lru_cache(maxsize=4096)
def decode_geometry(batch: int, heads_q: int, heads_kv: int, seqlen_q: int, head_dim: int, max_keys: int,
                    page_size: int, sms: int, num_splits: int = 0, tiles: TileConfig | None = None,
                    fp8: bool = False, masked: bool = False) -> DecodeGeometry:
    """The launch's shape for a call with these sizes (`max_keys`: the longest sequence's keys, or the
    cache's capacity; `page_size` 0 for a contiguous cache; `fp8`: an FP8 cache; `masked`: the kernel
    applies a causal or window mask) on a GPU of `sms` SMs;
    `num_splits` and `tiles` force what they name (0, None: decode_splits, decode_tiles). Memoised: a
    decoding loop asks for the same one in every layer."""
    group = heads_q // heads_kv

    def plan(tiles: TileConfig) -> tuple[TileConfig, int, int]:
        m_tiles = cdiv(group * seqlen_q, tiles.block_m)
        return tiles, m_tiles, num_splits or decode_splits(
            batch * heads_kv * m_tiles, max_keys, tiles.block_n, sms,
            0 < page_size < tiles.block_n and tiles.block_n >= PAGED_KEY_TILE_FROM)
    forced = tiles is not None
    tiles, m_tiles, splits = plan(tiles or decode_tiles(group * seqlen_q, head_dim, fp8, masked, page_size))
    if not forced and tiles.block_n < PAGED_KEY_TILE_FROM and cdiv(max_keys, splits) < SHORT_TILES_FROM_KEYS:
        # a program's few keys in 32-key tiles leave its pipeline mostly filling and draining
        tiles, m_tiles, splits = plan(decode_tiles(group * seqlen_q, head_dim, fp8, masked))
    return DecodeGeometry(tiles, splits, block_d(head_dim), (splits, heads_kv * m_tiles, batch),
                          next_power_of_2(splits))


def append_to_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    cache_seqlens: torch.Tensor | int, block_table: torch.Tensor | None,
                    cache_batch_idx: torch.Tensor | None, k_descale: torch.Tensor | None = None,
                    v_descale: torch.Tensor | None = None) -> None:
    """Write k, v (B, Hkv, N_new, D) into the caches in place at positions cache_seqlens[b] + [0, N_new) of
    each sequence b (through the block table when paged). The caller checked that they fit. An FP8 cache
    takes k / k_descale and v / v_descale (float32, one element or (B, Hkv); None for 1), saturated to
    e4m3's largest value and rounded to nearest."""
    batch, _, new, _ = k.shape
    positions = torch.arange(new, device=k.device)[None, :] + (
        cache_seqlens[:, None].long() if isinstance(cache_seqlens, torch.Tensor) else cache_seqlens)
    if block_table is not None:
        page_size = k_cache.shape[2]
        rows = block_table.gather(1, positions // page_size).long()
        cols = positions % page_size
    else:
        rows = (torch.arange(batch, device=k.device) if cache_batch_idx is None else cache_batch_idx.long())
        rows = rows[:, None].expand(batch, new)
        cols = positions
    # (rows, cols) index dims 0 and 2 of the cache; seen as (.., N, H, D) they are adjacent, and the
    # indexed result is (B, N_new, H, D), as k.transpose(1, 2) is.
    for cache, x, factor in ((k_cache, k, k_descale), (v_cache, v, v_descale)):
        if cache.dtype == torch.float8_e4m3fn:
            largest = torch.finfo(cache.dtype).max
            x = x.float()
            if factor is not None:
                x = x / (factor.reshape(()) if factor.numel() == 1 else factor[:, :, None, None])
            x = x.clamp(-largest, largest)
        cache.transpose(1, 2)[rows, cols] = x.transpose(1, 2).to(cache.dtype)


def _descale_strides(factor: torch.Tensor | None) -> tuple[int, int]:
    """The kernel's (batch, KV head) strides of an FP8 descale factor: 0 for one per tensor (or None)."""
    return (0, 0) if factor is None or factor.numel() == 1 else factor.stride()


class DecodeCall:
    """A decode call's host side, fixed by the shapes, strides, dtypes, alignments and options it was
    prepared for (prepare_decode): the outputs' sizes, the split count, both launches' scalars and
    constexprs, and the plan key its launches replay under (None: not replayable). `launch` runs it on a
    call's tensors. The KV-cache API keeps one per call signature, so that a decoding loop's layers only
    allocate their outputs and launch (docs/performance.md, entry 51): once its plan is recorded, the call
    keeps its recorded launches (`launches`), and later calls replay them with its own scalars and grid
    without looking the plan up."""

    __slots__ = ("sizes", "splits", "block_d", "grid", "scalars", "combine_scalars", "meta", "config",
                 "combine_meta", "key", "return_lse", "tma", "launches")

    def __init__(self, sizes: tuple[int, int, int], splits: int, block_d: int, grid: tuple[int, int, int],
                 scalars: tuple, combine_scalars: tuple, meta: dict, config: dict, combine_meta: dict,
                 key: tuple | None, return_lse: bool, tma: tuple | None = None) -> None:
        self.sizes, self.splits, self.block_d, self.grid = sizes, splits, block_d, grid  # sizes: (B, Hq, Nq)
        self.scalars, self.combine_scalars = scalars, combine_scalars
        self.meta, self.config, self.combine_meta = meta, config, combine_meta
        self.key, self.return_lse = key, return_lse
        self.tma = tma  # (K's descriptor strides, V's, the box) when the tiles come through TMA, else None
        self.launches: tuple[Recorded, ...] | None = None

    def decode_tensors(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, outs: tuple,
                       seqlens: torch.Tensor | None, cache_batch_idx: torch.Tensor | None,
                       cache_leftpad: torch.Tensor | None, block_table: torch.Tensor | None,
                       alibi_slopes: torch.Tensor | None, k_descale: torch.Tensor | None,
                       v_descale: torch.Tensor | None) -> tuple:
        """The decode kernel's tensor arguments in signature order: `outs` (o and lse, or with splits the
        partials), the call's tensors, and K's and V's descriptors when prepared for TMA (else None)."""
        descs = (None, None)
        if self.tma is not None:
            k_strides, v_strides, box = self.tma
            descs = (descriptor(k_cache, k_strides, box), descriptor(v_cache, v_strides, box))
        return (q, k_cache, v_cache, *outs, seqlens, cache_batch_idx, cache_leftpad, block_table, alibi_slopes,
                k_descale, v_descale, *descs)

    def launch(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seqlens: torch.Tensor | None,
               cache_batch_idx: torch.Tensor | None, cache_leftpad: torch.Tensor | None,
               block_table: torch.Tensor | None, alibi_slopes: torch.Tensor | None,
               k_descale: torch.Tensor | None = None,
               v_descale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(o like q, lse (B, Hq, Nq) float32, or None when prepared without return_lse) for tensors laid
        out as the prepared call's; `seqlens` None when the lengths were an int; `k_descale`, `v_descale`
        an FP8 cache's float32 factors (one element or (B, Hkv)), or None, as prepared."""
        o = empty_in_order(q)
        lse = q.new_empty(self.sizes, dtype=torch.float32) if self.return_lse else None
        if o.numel() == 0:
            return o, lse
        outs = (o, lse)
        if self.splits > 1:
            outs = (q.new_empty((*self.sizes, self.splits, self.block_d), dtype=torch.float32),
                    q.new_empty((*self.sizes, self.splits), dtype=torch.float32))
        decode_tensors = self.decode_tensors(q, k_cache, v_cache, outs, seqlens, cache_batch_idx, cache_leftpad,
                                             block_table, alibi_slopes, k_descale, v_descale)
        combine_tensors = (*outs, o, lse)
        key = self.key
        if key is not None and replay.replayable(q.device):
            device, stream = replay.current_device_and_stream()
            if device == key[0]:
                if self.launches is None:
                    plan = CACHE.plans.get(key)  # recorded by an earlier call with this plan key
                    if plan is not None:
                        self.launches = tuple(launch.recorded for launch in plan.launches.values())
                if self.launches is not None:
                    self.launches[0].replay(decode_tensors, stream, self.scalars, self.grid)
                    if self.splits > 1:
                        self.launches[1].replay(combine_tensors, stream, self.combine_scalars)
                    return o, lse
            else:
                key = None  # launched on another device than prepared for: no record
        else:
            key = None
        _interpreter.prepare(q.device)
        grid, (batch, heads_q, seqlen_q) = self.grid, self.sizes
        specs = [LaunchSpec("decode", attn_decode_kernel, lambda meta: grid, decode_tensors, (), self.scalars,
                            self.meta, self.config)]
        if self.splits > 1:
            specs.append(LaunchSpec("combine", attn_decode_combine_kernel, lambda meta: (seqlen_q, heads_q, batch),
                                    combine_tensors, (), self.combine_scalars, self.combine_meta,
                                    dict(num_warps=merge_warps(self.combine_meta["BLOCK_S"], self.block_d))))
        run("decode", key, specs, ())
        return o, lse


class DensePrefill:
    """A chunked prefill (DENSE_FROM_QUERIES queries or more per sequence on a contiguous cache) that runs
    the dense forward kernel: on the cache's first `keys` keys for an int length, or on all of it with the
    lengths tensor as each sequence's key count. `launch` takes DecodeCall.launch's arguments."""

    __slots__ = ("is_causal", "scale", "window", "softcap", "keys", "return_lse")

    def __init__(self, is_causal: bool, scale: float, window: tuple[int, int], softcap: float, keys: int | None,
                 return_lse: bool) -> None:
        self.is_causal, self.scale, self.window, self.softcap = is_causal, scale, window, softcap
        self.keys, self.return_lse = keys, return_lse

    def launch(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seqlens: torch.Tensor | None,
               cache_batch_idx: None, cache_leftpad: None, block_table: None, alibi_slopes: torch.Tensor | None,
               k_descale: None = None, v_descale: None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.keys is not None:
            k_cache, v_cache = k_cache[:, :, :self.keys], v_cache[:, :, :self.keys]
        o, lse = attention_forward(q, k_cache, v_cache, self.is_causal, self.scale, window=self.window,
                                   softcap=self.softcap, alibi_slopes=alibi_slopes, seqused_k=seqlens)
        return o, lse if self.return_lse else None


def prepare_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   cache_seqlens: torch.Tensor | int, scale: float, *, is_causal: bool = False,
                   window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                   alibi_slopes: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
                   cache_batch_idx: torch.Tensor | None = None, cache_leftpad: torch.Tensor | None = None,
                   num_splits: int = 0, tiles: TileConfig | None = None, return_lse: bool = True,
                   k_descale: torch.Tensor | None = None, v_descale: torch.Tensor | None = None,
                   tma: bool | None = None) -> DecodeCall | DensePrefill:
    """The DecodeCall of attention_decode with these arguments: everything but the tensors' contents and
    addresses (beyond their 16-byte alignment). Without `return_lse` its launch allocates and writes no
    logsumexp (a decoding step through the public API wants o alone). `k_descale`, `v_descale`: an FP8
    cache's factors (their layouts; the launches take the tensors). `tma` forces the tiles through tensor
    descriptors (True) or pointers (False); None: decode_uses_tma, where the cache's layout allows. A
    chunked prefill (DENSE_FROM_QUERIES) prepares the dense forward instead (DensePrefill), unless a split
    count, tiles or the tiles' path are forced."""
    batch, heads_q, seqlen_q, head_dim = q.shape
    paged = block_table is not None
    page_size = k_cache.shape[2] if paged else 0
    capacity = block_table.shape[1] * page_size if paged else k_cache.shape[2]
    max_keys = min(cache_seqlens, capacity) if isinstance(cache_seqlens, int) else capacity
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if (seqlen_q >= DENSE_FROM_QUERIES and not paged and not fp8 and cache_batch_idx is None
            and cache_leftpad is None and k_cache.shape[0] == batch and not num_splits and tiles is None
            and tma is None):
        return DensePrefill(is_causal, scale, tuple(window), softcap,
                            None if isinstance(cache_seqlens, torch.Tensor) else max_keys, return_lse)
    mask_left, mask_right, window_left, window_right = band(is_causal, window)
    # One query token sits at its sequence's end: no key lies right of it, so a causal mask or a window's
    # right side hides nothing and the kernel needs no right mask (a decoding step's usual call).
    mask_right = mask_right and seqlen_q > 1
    tiles, splits, bd, grid, block_s = decode_geometry(batch, heads_q, k_cache.shape[1], seqlen_q, head_dim,
                                                       max_keys, page_size, sm_count(q), num_splits, tiles, fp8,
                                                       mask_left or mask_right)
    strides = tma_strides(k_cache, v_cache) if page_size % tiles.block_n == 0 else None
    if tma is None:
        kv_bytes = 2 * batch * k_cache.shape[1] * max_keys * head_dim * k_cache.element_size()
        tma = strides is not None and decode_uses_tma(kv_bytes, page_size, tiles.block_n, fp8)
    elif tma and strides is None:
        raise ValueError(f"tma=True needs a cache that TMA can read: 16-byte aligned strides and base, on sm_90 or "
                         f"later, and blocks of whole key tiles (block size {page_size}, key tile {tiles.block_n}); "
                         f"pass tma=None to let the launcher choose")
    box = [1, 1, tiles.block_n, bd]
    seqlens = cache_seqlens if isinstance(cache_seqlens, torch.Tensor) else None
    cache_seqlen = 0 if seqlens is not None else cache_seqlens  # the kernel's length for every sequence
    softcap_scale, softcap_log2, stride_alibi_b = score_mods(scale, softcap, alibi_slopes)
    o_strides = empty_in_order(q).stride()[:3]  # the layout launch() allocates o in
    scalars = (*q.stride()[:3], *k_cache.stride()[:3], *v_cache.stride()[:3], *o_strides,
               0 if block_table is None else block_table.stride(0), heads_q, seqlen_q,
               cache_seqlen, capacity,
               window_left, window_right, scale * LOG2E, softcap_scale, softcap_log2, stride_alibi_b,
               *_descale_strides(k_descale), *_descale_strides(v_descale), splits)
    combine_scalars = (*o_strides, heads_q, seqlen_q, splits)
    key = None
    if replay.replayable(q.device):
        # A decoding loop's cache grows (a longer cache tensor, or a larger int length, every step): its
        # length, strides and split count are kept out of the key as values, and in it as Triton
        # specialises them, so that each step replays the plan and passes its own (replay.int_specialization).
        varying = (*k_cache.stride()[:3], *v_cache.stride()[:3], cache_seqlen, capacity, splits)
        cache_layout = (k_cache.dtype, v_cache.dtype, k_cache.shape[1], k_cache.shape[3], paged and k_cache.shape[2],
                        k_cache.data_ptr() % 16 == 0, v_cache.data_ptr() % 16 == 0, tma)
        key = replay.plan_key(replay.current_device_and_stream()[0],
                              (q, seqlens, cache_batch_idx, cache_leftpad, block_table, alibi_slopes, k_descale,
                               v_descale),
                              "decode", cache_layout, replay.int_specialization(varying), splits > 1, block_s,
                              is_causal, scale, tuple(window), softcap, tiles, return_lse)
    meta = dict(GROUP_SIZE=heads_q // k_cache.shape[1], HEAD_DIM=head_dim, BLOCK_D=bd, BLOCK_M=tiles.block_m,
                BLOCK_N=tiles.block_n,
                SPLIT=splits > 1, MASK_LEFT=mask_left, MASK_RIGHT=mask_right,
                INPUT_PRECISION=input_precision(q.dtype), PAGED=paged, PAGE_SIZE=k_cache.shape[2] if paged else 1,
                SOFTCAP=softcap > 0, ALIBI=alibi_slopes is not None)
    return DecodeCall((batch, heads_q, seqlen_q), splits, bd, grid, scalars, combine_scalars, meta,
                      dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages, maxnreg=tiles.max_registers,
                           **COMPILE_OPTIONS),
                      dict(HEAD_DIM=head_dim, BLOCK_D=bd, BLOCK_S=block_s), key, return_lse,
                      (*strides, box) if tma else None)


def attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     cache_seqlens: torch.Tensor | int, scale: float, *, is_causal: bool = False,
                     window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                     alibi_slopes: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
                     cache_batch_idx: torch.Tensor | None = None, cache_leftpad: torch.Tensor | None = None,
                     num_splits: int = 0, tiles: TileConfig | None = None, k_descale: torch.Tensor | None = None,
                     v_descale: torch.Tensor | None = None,
                     tma: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """o like q and lse (B, Hq, Nq) float32 of q against each sequence's first cache_seqlens[b] cached
    keys (all in the cache already); `num_splits` > 0 forces the split count, 0 takes decode_splits;
    `tiles` forces (BLOCK_M, BLOCK_N, warps, stages), None takes decode_tiles (sweeps and tests);
    `k_descale`, `v_descale`: an FP8 cache's float32 factors, one element or (B, Hkv), or None for 1;
    `tma` forces the tiles' path (prepare_decode)."""
    call = prepare_decode(q, k_cache, v_cache, cache_seqlens, scale, is_causal=is_causal, window=window,
                          softcap=softcap, alibi_slopes=alibi_slopes, block_table=block_table,
                          cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad, num_splits=num_splits,
                          tiles=tiles, k_descale=k_descale, v_descale=v_descale, tma=tma)
    return call.launch(q, k_cache, v_cache, cache_seqlens if isinstance(cache_seqlens, torch.Tensor) else None,
                       cache_batch_idx, cache_leftpad, block_table, alibi_slopes, k_descale, v_descale)
