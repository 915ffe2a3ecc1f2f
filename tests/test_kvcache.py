"""Attention against a KV cache (flash_attention_with_kvcache, flash_attn_with_kvcache): contiguous and
paged caches (permuted, non-contiguous block tables), ragged lengths from 0 to the full cache, Nq = 1, 4,
17, GQA and MQA, every flag, split-KV, the append, left padding; each sequence checked against the float64
reference on its own keys, bounded by plain attention's error in the same precision. Cache positions a
call must not read hold NaN."""

import math

import pytest
import torch

import flashtriton.flash_attn_interface as fai
from conftest import DEVICE, ON_GPU
from flashtriton import flash_attention_with_kvcache, launch
from flashtriton.reference import attention_ref
from flashtriton.testing import bounded

CAPACITY = 130 if not ON_GPU else 1100  # a contiguous cache's positions per sequence
E4M3 = torch.float8_e4m3fn


def _lengths(capacity: int, batch: int = 4) -> list[int]:
    """Ragged lengths with 0 and the full cache among them."""
    base = [0, 17, 63, capacity] if not ON_GPU else [0, 170, 1000, capacity]
    return (base * batch)[:batch]


def _cache(batch, heads_kv, capacity, head_dim, dtype, lengths, leftpad=None):
    """A logical (B, Hkv, capacity, D) cache with random keys and values at the positions in use and NaN
    elsewhere."""
    k, v = (torch.randn(batch, heads_kv, capacity, head_dim, device=DEVICE, dtype=dtype) for _ in range(2))
    for b, length in enumerate(lengths):
        start = 0 if leftpad is None else leftpad[b]
        for x in (k, v):
            x[b, :, length:] = float("nan")
            x[b, :, :start] = float("nan")
    return k, v


def _paged(k, v, block_size):
    """The logical cache in blocks of `block_size`, scattered over a pool with spare blocks through a
    random permutation: (k_pages, v_pages, block_table). Unused blocks hold NaN."""
    batch, heads_kv, capacity, head_dim = k.shape
    per_seq = capacity // block_size
    pool = batch * per_seq + 3
    table = torch.randperm(pool, device=DEVICE)[:batch * per_seq].view(batch, per_seq).to(torch.int32)
    pages = []
    for x in (k, v):
        paged = torch.full((pool, heads_kv, block_size, head_dim), float("nan"), device=DEVICE, dtype=x.dtype)
        for b in range(batch):
            for j in range(per_seq):
                paged[table[b, j]] = x[b, :, j * block_size:(j + 1) * block_size]
        pages.append(paged)
    return pages[0], pages[1], table


def _reference(q, k, v, lengths, upcast, leftpad=None, alibi_slopes=None, **kwargs):
    """Each sequence against its own keys, positions [leftpad, length) of the logical cache."""
    outs, lses = [], []
    for b, length in enumerate(lengths):
        start = 0 if leftpad is None else leftpad[b]
        qs, ks, vs = q[b:b + 1], k[b:b + 1, :, start:length], v[b:b + 1, :, start:length]
        slopes = None if alibi_slopes is None else alibi_slopes[b] if alibi_slopes.dim() == 2 else alibi_slopes
        o, lse = attention_ref(qs, ks, vs, upcast=upcast, alibi_slopes=slopes, **kwargs)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def _check(o, lse, q, k, v, lengths, factor=2.0, **kwargs):
    o64, lse64 = _reference(q, k, v, lengths, True, **kwargs)
    low_o, low_lse = _reference(q, k, v, lengths, False, **kwargs)
    finite = torch.isfinite(lse64)
    checks = [bounded("O", o, o64, low_o, q.dtype, factor),
              bounded("L", lse[finite], lse64[finite], low_lse[finite], q.dtype, factor)]
    failed = [str(c) for c in checks if not c.ok]
    if not torch.equal(torch.isneginf(lse), ~finite):
        failed.append("L is -inf on other rows than those that see no key")
    assert not failed, failed


VARIANTS = {"full": dict(), "causal": dict(is_causal=True), "window": dict(window_size=(7, 3)),
            "causal+softcap+alibi": dict(is_causal=True, softcap=4.0, alibi=True)}
LAYOUTS = ["contiguous", "paged16", "paged64", "paged256"]


def _run(layout, q, k, v, lengths, num_splits, kwargs):
    """flash_attention_with_kvcache on the logical cache laid out as `layout`."""
    lengths_t = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    with torch.no_grad():
        if layout == "contiguous":
            return flash_attention_with_kvcache(q, k, v, lengths_t, num_splits=num_splits, return_lse=True, **kwargs)
        k_pages, v_pages, table = _paged(k, v, int(layout.removeprefix("paged")))
        return flash_attention_with_kvcache(q, k_pages, v_pages, lengths_t, block_table=table, num_splits=num_splits,
                                            return_lse=True, **kwargs)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("seqlen_q", [1, 4, 17])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_kvcache_matches_reference(layout, seqlen_q, variant):
    """GQA 4/2, split over 2 programs (the merge) for Nq = 1 and 17, one for Nq = 4."""
    kwargs = dict(VARIANTS[variant])
    block = 1 if layout == "contiguous" else int(layout.removeprefix("paged"))
    capacity = math.ceil(CAPACITY / block) * block
    lengths = _lengths(capacity)
    q = torch.randn(4, 4, seqlen_q, 32, device=DEVICE, dtype=torch.bfloat16)
    k, v = _cache(4, 2, capacity, 32, torch.bfloat16, lengths)
    if kwargs.pop("alibi", False):
        kwargs["alibi_slopes"] = torch.rand(4, 4, device=DEVICE)
    o, lse = _run(layout, q, k, v, lengths, 1 if seqlen_q == 4 else 2, kwargs)
    assert o.shape == q.shape and lse.shape == q.shape[:3] and lse.dtype == torch.float32
    _check(o, lse, q, k, v, lengths, **kwargs)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_chunked_prefill_with_lengths_runs_the_dense_forward(variant):
    """DENSE_FROM_QUERIES queries or more against a contiguous cache with per-sequence lengths (0, fewer
    keys than queries, the full cache; NaN past each) run the dense forward with a key count per sequence
    (on the CPU through TMA tiles, whose rows past a length the kernel zeroes): the float64 reference's
    result, and the decode kernel's, which a forced split count keeps."""
    from flashtriton.cache import CACHE
    from flashtriton.launch.decode import DENSE_FROM_QUERIES
    kwargs = dict(VARIANTS[variant])
    lengths = [0, 100, 190, 200]
    q = torch.randn(4, 4, DENSE_FROM_QUERIES + 2, 32, device=DEVICE, dtype=torch.bfloat16)
    k, v = _cache(4, 2, 200, 32, torch.bfloat16, lengths)
    if kwargs.pop("alibi", False):
        kwargs["alibi_slopes"] = torch.rand(4, 4, device=DEVICE)
    CACHE.last.clear()
    o, lse = _run("contiguous", q, k, v, lengths, 0, kwargs)
    assert "forward" in CACHE.last  # the dense forward ran
    _check(o, lse, q, k, v, lengths, **kwargs)
    CACHE.last.clear()
    by_decode = _run("contiguous", q, k, v, lengths, 1, kwargs)
    assert "forward" not in CACHE.last
    torch.testing.assert_close(o.float(), by_decode[0].float(), atol=2e-2, rtol=0)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("layout", ["contiguous", "paged16"])
def test_a_repeated_call_launches_what_the_first_prepared(monkeypatch, layout, variant):
    """A call with an earlier call's signature (kvcache._signature) skips the layout checks and launches
    the DecodeCall that call prepared: the same result bit for bit, on other tensors of that layout too.
    New index values are still checked: lengths past the cache raise on the remembered signature."""
    import flashtriton.kvcache as kvcache
    kwargs = dict(VARIANTS[variant])
    block = 1 if layout == "contiguous" else 16
    capacity = math.ceil(CAPACITY / block) * block
    lengths = _lengths(capacity)
    q = torch.randn(4, 4, 2, 32, device=DEVICE, dtype=torch.bfloat16)
    k, v = _cache(4, 2, capacity, 32, torch.bfloat16, lengths)
    if kwargs.pop("alibi", False):
        kwargs["alibi_slopes"] = torch.rand(4, 8, device=DEVICE)[:, ::2]  # a strided view: copied by both paths
    first = _run(layout, q, k, v, lengths, 2, kwargs)
    checks = []
    monkeypatch.setattr(kvcache, "check_kvcache", lambda *a, **kw: checks.append(1))
    again = _run(layout, q.clone(), k.clone(), v.clone(), lengths, 2, kwargs)  # _run pages them the same way
    assert not checks  # the signature was remembered: no layout checks
    for got, want in zip(again, first, strict=True):
        assert torch.equal(got, want)
    monkeypatch.undo()
    too_long = [capacity + 1] + lengths[1:]
    with pytest.raises(ValueError, match="cache_seqlens must be in"):
        _run(layout, q, k, v, too_long, 2, kwargs)


@pytest.mark.parametrize("num_splits", [0, 1, 5])
@pytest.mark.parametrize("heads_q,heads_kv,head_dim,dtype", [(4, 1, 32, torch.float16), (2, 2, 40, torch.float32),
                                                             (8, 2, 64, torch.bfloat16)],
                         ids=["MQA-fp16", "MHA-D40-fp32", "GQA4-bf16"])
@pytest.mark.parametrize("layout", ["contiguous", "paged16"])
def test_kvcache_heads_dtypes_splits(layout, heads_q, heads_kv, head_dim, dtype, num_splits):
    """Split counts agree (0: the heuristic), with MQA, MHA with a padded head dim, and float32."""
    block = 1 if layout == "contiguous" else 16
    capacity = math.ceil(CAPACITY / block) * block
    lengths = _lengths(capacity, batch=3)[::-1]
    q = torch.randn(3, heads_q, 2, head_dim, device=DEVICE, dtype=dtype)
    k, v = _cache(3, heads_kv, capacity, head_dim, dtype, lengths)
    o, lse = _run(layout, q, k, v, lengths, num_splits, dict(is_causal=True))
    _check(o, lse, q, k, v, lengths, is_causal=True)


@pytest.mark.parametrize("layout", ["contiguous", "paged16"])
@pytest.mark.parametrize("new", [1, 4])
def test_append_then_attend(layout, new):
    """k, v written at cache_seqlens in place, then attended: the cache equals one appended by hand, and
    the output equals a call on that cache without the append (bitwise) and the reference."""
    block = 1 if layout == "contiguous" else 16
    capacity = math.ceil(CAPACITY / block) * block
    lengths = [0, 5, capacity - new]
    total = [n + new for n in lengths]
    q = torch.randn(3, 4, new, 32, device=DEVICE, dtype=torch.bfloat16)
    k_new, v_new = (torch.randn(3, 2, new, 32, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    k, v = _cache(3, 2, capacity, 32, torch.bfloat16, lengths)
    by_hand = [x.clone() for x in (k, v)]
    for b, n in enumerate(lengths):
        by_hand[0][b, :, n:n + new] = k_new[b]
        by_hand[1][b, :, n:n + new] = v_new[b]
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    with torch.no_grad():
        if layout == "contiguous":
            # the cache rows in another order than the batch: cache_batch_idx maps them
            order = torch.tensor([2, 0, 1], device=DEVICE)
            k_cache, v_cache = torch.empty_like(k), torch.empty_like(v)
            k_cache[order], v_cache[order] = k, v
            idx = order.to(torch.int32)
            o, lse = flash_attention_with_kvcache(q, k_cache, v_cache, seqlens, k_new, v_new, cache_batch_idx=idx,
                                                  is_causal=True, return_lse=True)
            assert torch.equal(k_cache[order].nan_to_num(), by_hand[0].nan_to_num())
            assert torch.equal(v_cache[order].nan_to_num(), by_hand[1].nan_to_num())
            again = flash_attention_with_kvcache(q, k_cache, v_cache, seqlens + new, cache_batch_idx=idx,
                                                 is_causal=True)
        else:
            k_pages, v_pages, table = _paged(k, v, block)
            o, lse = flash_attention_with_kvcache(q, k_pages, v_pages, seqlens, k_new, v_new, block_table=table,
                                                  is_causal=True, return_lse=True)
            hand_k, hand_v, _ = _paged(*by_hand, block)
            for b in range(3):  # compare through the table: block j of sequence b
                for j in range(table.shape[1]):
                    page = table[b, j]
                    assert torch.equal(k_pages[page].nan_to_num(), by_hand[0][b, :, j * block:(j + 1) * block]
                                       .nan_to_num())
                    assert torch.equal(v_pages[page].nan_to_num(), by_hand[1][b, :, j * block:(j + 1) * block]
                                       .nan_to_num())
            again = flash_attention_with_kvcache(q, k_pages, v_pages, seqlens + new, block_table=table, is_causal=True)
    assert torch.equal(o, again)
    _check(o, lse, q, *by_hand, total, is_causal=True)


def test_int_lengths_and_leftpad():
    """One int for every sequence's length, and left padding: sequence b's keys start at leftpad[b]."""
    lengths = [CAPACITY] * 3
    leftpad = [0, 9, CAPACITY]
    q = torch.randn(3, 4, 3, 32, device=DEVICE, dtype=torch.bfloat16)
    k, v = _cache(3, 2, CAPACITY, 32, torch.bfloat16, lengths, leftpad)
    pad = torch.tensor(leftpad, dtype=torch.int32, device=DEVICE)
    with torch.no_grad():
        o, lse = flash_attention_with_kvcache(q, k, v, CAPACITY, cache_leftpad=pad, is_causal=True, num_splits=3,
                                              return_lse=True)
    _check(o, lse, q, k, v, lengths, leftpad=leftpad, is_causal=True)


@pytest.mark.parametrize("lengths_as", ["tensor", "int"])
def test_lengths_past_the_cache_read_only_the_cache(lengths_as):
    """The kernel never reads past a contiguous cache, whatever the lengths say (the host checks them only
    where it can read them: not under CUDA-graph capture, nor while another stream is still writing them).
    The cache is a view into a longer buffer whose tail holds NaN, so a read past its end would show."""
    capacity, head_dim = 40, 32
    q = torch.randn(2, 4, 1, head_dim, device=DEVICE, dtype=torch.bfloat16)
    k_buffer, v_buffer = (torch.randn(2, 2, capacity + 24, head_dim, device=DEVICE, dtype=torch.bfloat16)
                          for _ in range(2))
    for x in (k_buffer, v_buffer):
        x[:, :, capacity:] = float("nan")
    k, v = k_buffer[:, :, :capacity], v_buffer[:, :, :capacity]
    past = _seqlens(capacity + 20, 7) if lengths_as == "tensor" else capacity + 20
    full = _seqlens(capacity, 7) if lengths_as == "tensor" else capacity
    for splits in (1, 3):
        o, lse = launch.attention_decode(q, k, v, past, 0.2, num_splits=splits)
        expected, expected_lse = launch.attention_decode(q, k, v, full, 0.2, num_splits=splits)
        assert torch.equal(o, expected) and torch.equal(lse, expected_lse)


@pytest.mark.parametrize("variant", ["full", "causal", "window", "causal+softcap+alibi"])
@pytest.mark.parametrize("seqlen_q", [1, 4])
@pytest.mark.parametrize("layout", ["contiguous", "paged256"])
def test_tma_tiles_match_reference(layout, seqlen_q, variant):
    """The tiles through tensor descriptors (taken by large calls, forced here): the same results as the
    reference on ragged lengths with 0 and the full cache, left padding and NaN everywhere a sequence does
    not reach, so that an unmasked row of V would show; and bitwise those of the pointer loads."""
    kwargs = dict(VARIANTS[variant])
    capacity = 256 if layout == "paged256" else CAPACITY
    lengths = _lengths(capacity)
    leftpad = [0, 5, 0, 9]
    q = torch.randn(4, 4, seqlen_q, 32, device=DEVICE, dtype=torch.bfloat16)
    k, v = _cache(4, 2, capacity, 32, torch.bfloat16, lengths, leftpad)
    slopes = torch.rand(4, 4, device=DEVICE) if kwargs.pop("alibi", False) else None
    lengths_t = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    pad = torch.tensor(leftpad, dtype=torch.int32, device=DEVICE)
    logical, table = (k, v), None
    if layout != "contiguous":
        k, v, table = _paged(k, v, 256)
    args = dict(is_causal=kwargs.get("is_causal", False), window=kwargs.get("window_size", (-1, -1)),
                softcap=kwargs.get("softcap", 0.0), alibi_slopes=slopes, block_table=table, cache_leftpad=pad)
    for splits in (1, 3):
        o, lse = launch.attention_decode(q, k, v, lengths_t, 32 ** -0.5, num_splits=splits, tma=True, **args)
        by_pointers = launch.attention_decode(q, k, v, lengths_t, 32 ** -0.5, num_splits=splits, tma=False, **args)
        assert torch.equal(o, by_pointers[0]) and torch.equal(lse, by_pointers[1])
    _check(o, lse, q, *logical, lengths, leftpad=leftpad, alibi_slopes=slopes, **kwargs)


def test_tma_rule_and_its_refusal():
    """Large calls on caches TMA can read take descriptors; blocks shorter than a key tile and FP8 caches
    keep pointers, and forcing TMA there is an error that says why."""
    uses = launch.decode.decode_uses_tma
    big = launch.decode.TMA_FROM_BYTES
    assert uses(big, 0, 64, False) and uses(big, 256, 64, False) and uses(big, 64, 64, False)
    assert not uses(big - 1, 0, 64, False) and not uses(big, 16, 64, False) and not uses(big, 0, 64, True)
    q = torch.randn(1, 2, 1, 32, device=DEVICE, dtype=torch.bfloat16)
    k, v = _cache(1, 1, 64, 32, torch.bfloat16, [64])
    k_pages, v_pages, table = _paged(k, v, 16)
    with pytest.raises(ValueError, match="tma=True needs a cache that TMA can read.*block size 16"):
        launch.attention_decode(q, k_pages, v_pages, 64, 0.2, block_table=table, tma=True)


def test_fp8_tiles_and_the_one_token_mask():
    """An FP8 cache at D = 64 with one 16-row tile and no mask takes 128-key tiles under a 128-register cap
    (four programs per SM on the H200); masked kernels keep the uncapped tile, which Triton 3.9 does not
    spill. One query token needs no right mask: causal or not, it sees every key of its sequence."""
    tiles = launch.decode.decode_tiles
    assert tiles(4, 64, True) == launch.decode.TileConfig(16, 128, num_warps=4, num_stages=3, max_registers=128)
    assert tiles(4, 64, True, masked=True).max_registers is None and tiles(32, 64, True).max_registers is None
    assert tiles(4, 128, True).max_registers is None and tiles(4, 64).max_registers is None
    q = torch.randn(2, 8, 1, 64, device=DEVICE, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 64, 64, device=DEVICE).to(E4M3) for _ in range(2))
    for window, mask_left in (((-1, -1), False), ((16, 3), True)):
        call = launch.decode.prepare_decode(q, k, v, 64, 0.125, is_causal=True, window=window)
        assert not call.meta["MASK_RIGHT"] and call.meta["MASK_LEFT"] == mask_left
        assert (call.config["maxnreg"] == 128) == (not mask_left)
    call = launch.decode.prepare_decode(q.expand(2, 8, 2, 64), k, v, 64, 0.125, is_causal=True)
    assert call.meta["MASK_RIGHT"]


def test_empty_sequences_give_zero():
    q = torch.randn(2, 4, 2, 32, device=DEVICE, dtype=torch.float16)
    k, v = _cache(2, 2, 64, 32, torch.float16, [0, 0])
    with torch.no_grad():
        for splits in (1, 3):
            o, lse = flash_attention_with_kvcache(q, k, v, torch.zeros(2, dtype=torch.int32, device=DEVICE),
                                                  num_splits=splits, return_lse=True)
            assert torch.equal(o, torch.zeros_like(o)) and bool(torch.isneginf(lse).all())


@pytest.mark.parametrize("paged", [False, True])
def test_flash_attn_with_kvcache_layout(paged):
    """flash_attn's (B, N, H, D) function equals flashtriton's on the transposed views, appends included."""
    lengths = [3, 40]
    q = torch.randn(2, 1, 4, 32, device=DEVICE, dtype=torch.bfloat16)  # (B, Nq, Hq, D)
    k_new, v_new = (torch.randn(2, 1, 2, 32, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    k, v = _cache(2, 2, 64, 32, torch.bfloat16, lengths)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    table = None
    if paged:
        k, v, table = _paged(k, v, 16)
    ours_k, ours_v = k.clone(), v.clone()
    with torch.no_grad():
        out, lse = fai.flash_attn_with_kvcache(q, k.transpose(1, 2), v.transpose(1, 2), k_new, v_new,
                                               cache_seqlens=seqlens, block_table=table, causal=True,
                                               return_softmax_lse=True)
        o2, lse2 = flash_attention_with_kvcache(q.transpose(1, 2), ours_k, ours_v, seqlens, k_new.transpose(1, 2),
                                                v_new.transpose(1, 2), block_table=table, is_causal=True,
                                                return_lse=True)
    assert out.shape == q.shape and lse.shape == (2, 4, 1)
    assert torch.equal(out, o2.transpose(1, 2)) and torch.equal(lse, lse2)
    assert torch.equal(k.nan_to_num(), ours_k.nan_to_num())


def test_flash_attn_with_kvcache_signature():
    import inspect
    names = [p.name for p in inspect.signature(fai.flash_attn_with_kvcache).parameters.values()]
    assert names == ["q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin", "cache_seqlens",
                     "cache_batch_idx", "cache_leftpad", "block_table", "softmax_scale", "causal", "window_size",
                     "softcap", "rotary_interleaved", "alibi_slopes", "num_splits", "return_softmax_lse",
                     "q_descale", "k_descale", "v_descale"]  # the last three FlashAttention-3's, keywords only
    kinds = {p.name: p.kind for p in inspect.signature(fai.flash_attn_with_kvcache).parameters.values()}
    assert {kinds[name] for name in names[-3:]} == {inspect.Parameter.KEYWORD_ONLY}


def test_split_heuristic():
    """Few programs and long sequences split; many programs, or short sequences, do not."""
    splits = launch.decode.decode_splits  # on a 132-SM GPU: 3 programs per SM, a power of two, 2 key tiles at least
    assert splits(programs=8, max_keys=1024, block_n=64, sms=132) == 8  # 16 tiles: 2 each
    assert splits(programs=8, max_keys=131072, block_n=128, sms=132) == 64  # 50, rounded up
    assert splits(programs=32, max_keys=131072, block_n=64, sms=132) == 16  # 13, rounded up
    assert splits(programs=256, max_keys=8192, block_n=64, sms=132) == 2
    assert splits(programs=64, max_keys=32768, block_n=128, sms=132) == 8
    assert splits(programs=512, max_keys=131072, block_n=64, sms=132) == 1
    assert splits(programs=8, max_keys=100, block_n=64, sms=132) == 1
    assert splits(programs=1, max_keys=10**7, block_n=64, sms=132) == launch.decode.MAX_SPLITS
    # pages shorter than a key tile: twice the splits, under the same caps
    assert splits(programs=512, max_keys=8192, block_n=64, sms=132, gathered=True) == 2
    assert splits(programs=64, max_keys=131072, block_n=64, sms=132, gathered=True) == 16
    assert splits(programs=512, max_keys=64, block_n=64, sms=132, gathered=True) == 1
    assert splits(programs=1, max_keys=10**7, block_n=64, sms=132, gathered=True) == launch.decode.MAX_SPLITS


@pytest.mark.parametrize("layout", ["paged16", "paged64"])
def test_short_blocks_take_short_tiles(layout):
    """At D = 128, a bf16 cache in blocks shorter than 64 keys takes 32-key tiles in four stages at the
    plain split count; blocks of whole 64-key tiles, D = 64 and FP8 caches keep their tiles. Either way
    the result matches the float64 reference (blocks permuted, NaN past every length)."""
    tiles, geometry = launch.decode.decode_tiles, launch.decode.decode_geometry
    assert tiles(4, 128, page_size=16) == launch.decode.TileConfig(16, 32, num_warps=4, num_stages=4)
    assert tiles(4, 128, page_size=64).block_n == tiles(4, 128).block_n == 64
    assert tiles(4, 64, page_size=16) == tiles(4, 64) and tiles(4, 128, True, page_size=16) == tiles(4, 128, True)
    assert geometry(64, 32, 8, 1, 128, 1024, 16, 132).splits == 1  # 512 programs: no split, not two
    assert geometry(8, 32, 8, 1, 128, 8192, 16, 132).splits == 8
    # 128 keys a program (8 splits of 1024): the 64-key tiles
    assert geometry(8, 32, 8, 1, 128, 1024, 16, 132).tiles == tiles(4, 128)
    capacity = math.ceil(CAPACITY / 64) * 64
    lengths = _lengths(capacity)
    q = torch.randn(4, 8, 2, 128, device=DEVICE, dtype=torch.bfloat16)
    k, v = _cache(4, 2, capacity, 128, torch.bfloat16, lengths)
    o, lse = _run(layout, q, k, v, lengths, 0, dict(is_causal=True))
    _check(o, lse, q, k, v, lengths, is_causal=True)


def _errors_case():
    q = torch.randn(2, 4, 1, 32, device=DEVICE, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 64, 32, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    pages = torch.randn(6, 2, 16, 32, device=DEVICE, dtype=torch.bfloat16)
    table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32, device=DEVICE)
    return q, k, v, pages, table


def _seqlens(*values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


ERRORS = {
    "seqlens past the cache": (lambda q, k, v, p, t: flash_attention_with_kvcache(q, k, v, _seqlens(3, 65)),
                               ValueError, "cache_seqlens must be in"),
    "int seqlens past the cache": (lambda q, k, v, p, t: flash_attention_with_kvcache(q, k, v, 65),
                                   ValueError, "does not fit"),
    "append past the cache": (lambda q, k, v, p, t: flash_attention_with_kvcache(
        q, k, v, _seqlens(3, 63), k[:, :, :2], v[:, :, :2]), ValueError, "less the 2 appended"),
    "block table out of range": (lambda q, k, v, p, t: flash_attention_with_kvcache(
        q, p, p, _seqlens(3, 40), block_table=t + 1), ValueError, "block_table's entries"),
    "block table dtype": (lambda q, k, v, p, t: flash_attention_with_kvcache(
        q, p, p, _seqlens(3, 40), block_table=t.long()), TypeError, "block_table must be an int32"),
    "seqlens dtype": (lambda q, k, v, p, t: flash_attention_with_kvcache(q, k, v, _seqlens(3, 4).long()),
                      TypeError, "cache_seqlens must be an int32"),
    "cache dtype": (lambda q, k, v, p, t: flash_attention_with_kvcache(q, k.half(), v.half(), 3),
                    TypeError, "dtype"),
    "new k without v": (lambda q, k, v, p, t: flash_attention_with_kvcache(q, k, v, 3, k[:, :, :1]),
                        ValueError, "together"),
    "new k shape": (lambda q, k, v, p, t: flash_attention_with_kvcache(q, k, v, 3, k[:1, :, :1], v[:1, :, :1]),
                    ValueError, "new entries to append"),
    "cache batch without idx": (lambda q, k, v, p, t: flash_attention_with_kvcache(q, k[:1], v[:1], 3),
                                ValueError, "cache_batch_idx"),
    "cache_batch_idx out of range": (lambda q, k, v, p, t: flash_attention_with_kvcache(
        q, k, v, 3, cache_batch_idx=_seqlens(0, 2)), ValueError, "cache_batch_idx must index"),
    "leftpad with paging": (lambda q, k, v, p, t: flash_attention_with_kvcache(
        q, p, p, 3, block_table=t, cache_leftpad=_seqlens(0, 0)), NotImplementedError, "cache_leftpad"),
    "leftpad past length": (lambda q, k, v, p, t: flash_attention_with_kvcache(
        q, k, v, _seqlens(3, 4), cache_leftpad=_seqlens(0, 9)), ValueError, "cache_leftpad must be in"),
    "num_splits": (lambda q, k, v, p, t: flash_attention_with_kvcache(q, k, v, 3, num_splits=-1),
                   ValueError, "num_splits"),
    "gradients": (lambda q, k, v, p, t: flash_attention_with_kvcache(q.requires_grad_(), k, v, 3),
                  NotImplementedError, "no backward"),
    "rotary": (lambda q, k, v, p, t: fai.flash_attn_with_kvcache(q.transpose(1, 2), k, v, rotary_cos=q),
               NotImplementedError, "rotary"),
    "3-d cache": (lambda q, k, v, p, t: flash_attention_with_kvcache(q, k[0], v[0], 3), ValueError, "4 dims"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_kvcache_errors(case):
    """Each bad call raises, also right after good calls on the same tensors (whose checks are then
    remembered by signature: kvcache._signature)."""
    fn, error, match = ERRORS[case]
    q, k, v, pages, table = _errors_case()
    flash_attention_with_kvcache(q, k, v, 3)
    flash_attention_with_kvcache(q, pages, pages, _seqlens(3, 40), block_table=table)
    with pytest.raises(error, match=match):
        fn(q, k, v, pages, table)


def test_layout_checks_run_once_per_signature(monkeypatch):
    """A decoding loop's calls with one signature (shapes, strides, dtypes, devices, options) run the
    layout checks once (kvcache._signature), and so do those whose contiguous cache only grows
    (kvcache._growth_family); another dim, inner stride, option or kind of length runs them again."""
    import flashtriton.validation as validation
    runs = []
    checks = validation._check_kvcache_layout
    monkeypatch.setattr(validation, "_check_kvcache_layout", lambda *a: runs.append(1) or checks(*a))
    q, k, v, pages, table = _errors_case()
    for _ in range(3):
        flash_attention_with_kvcache(q, k, v, _seqlens(3, 40))
    assert len(runs) == 1
    flash_attention_with_kvcache(q, k[:, :, :50], v[:, :, :50], _seqlens(3, 40))  # a shorter cache: same family
    flash_attention_with_kvcache(q, torch.cat([k, k], 2)[:, :, :60], v[:, :, :60], _seqlens(3, 40))  # outer strides
    assert len(runs) == 1
    flash_attention_with_kvcache(q, k, v, 7)  # an int length
    flash_attention_with_kvcache(q, k, v, 9)
    assert len(runs) == 2
    flash_attention_with_kvcache(q, k.transpose(1, 2).contiguous().transpose(1, 2), v, 7)  # (B, N, H, D) in memory
    flash_attention_with_kvcache(q, k, v, 7, is_causal=True)
    flash_attention_with_kvcache(q, pages, pages, 7, block_table=table)  # paged: by signature only
    flash_attention_with_kvcache(q, pages[:5], pages[:5], 7, block_table=table[:, :2])
    assert len(runs) == 6
    with pytest.raises(TypeError, match="is_causal must be True or False"):
        flash_attention_with_kvcache(q, k, v, 7, is_causal=1)  # equal to True, but not a bool


@pytest.mark.parametrize("lengths_as", ["tensor", "int"])
def test_a_growing_cache_runs_the_layout_checks_once(monkeypatch, lengths_as):
    """A decoding loop whose contiguous cache grows every step (a new, longer tensor, as transformers'
    DynamicCache makes) runs the layout checks on its first step only (kvcache._growth_family), and gives
    what a call on a fresh signature gives. What growth can break is still checked: K and V of different
    lengths, an int length past the cache."""
    import flashtriton.validation as validation
    from flashtriton.cache import reset
    runs = []
    checks = validation._check_kvcache_layout
    monkeypatch.setattr(validation, "_check_kvcache_layout", lambda *a: runs.append(1) or checks(*a))
    q = torch.randn(2, 4, 1, 32, device=DEVICE, dtype=torch.bfloat16)
    full_k, full_v = (torch.randn(2, 2, 70, 32, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    steps = []
    with torch.no_grad():
        for n in (40, 41, 57):
            k, v = full_k[:, :, :n].contiguous(), full_v[:, :, :n].contiguous()
            lengths = n if lengths_as == "int" else _seqlens(n, n - 3)
            steps.append((flash_attention_with_kvcache(q, k, v, lengths, is_causal=True), k, v, lengths))
        assert len(runs) == 1
        short_v, long_k = full_v[:, :, :60].contiguous(), full_k[:, :, :61].contiguous()
        with pytest.raises(ValueError, match="k_cache and v_cache must have the same shape"):
            flash_attention_with_kvcache(q, long_k, short_v, 30 if lengths_as == "int" else _seqlens(30, 30),
                                         is_causal=True)
        if lengths_as == "int":
            with pytest.raises(ValueError, match="does not fit the cache"):
                flash_attention_with_kvcache(q, long_k, full_v[:, :, :61].contiguous(), 62, is_causal=True)
        assert len(runs) == 1  # those were the family's own checks
        reset()
        for o, k, v, lengths in steps:  # each step on its own, fully checked
            assert torch.equal(o, flash_attention_with_kvcache(q, k, v, lengths, is_causal=True))
            reset()
    assert len(runs) == 4


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("heads_kv,capacity", [(2, 2048), (8, 32768)], ids=["pointers", "tma"])
def test_cuda_graph_decode_step(heads_kv, capacity):
    """A decode step (append one token, attend) captured once and replayed with the lengths advanced in
    place, as serving engines run decode, equals eager calls; a small cache, and one large enough for
    the tiles to come through TMA descriptors (encoded once, at capture)."""
    batch = 4
    kv_bytes = 2 * batch * heads_kv * capacity * 128 * 2
    assert launch.decode.decode_uses_tma(kv_bytes, 0, 64, False) == (capacity > 2048)
    q = torch.randn(batch, 4 * heads_kv, 1, 128, device="cuda", dtype=torch.bfloat16)
    k_new, v_new = (torch.randn(batch, heads_kv, 1, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(batch, heads_kv, capacity, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    seqlens = torch.tensor([0, 100, capacity // 2, capacity - 48], dtype=torch.int32, device="cuda")
    with torch.no_grad():
        def step():
            return flash_attention_with_kvcache(q, k, v, seqlens, k_new, v_new, is_causal=True)
        step()  # compile and record before capture
        seqlens += 1
        eager_k, eager_v = k.clone(), v.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        for _ in range(3):
            graph.replay()
            expected = flash_attention_with_kvcache(q, eager_k, eager_v, seqlens.clone(), k_new, v_new, is_causal=True)
            torch.cuda.synchronize()
            assert torch.equal(out, expected)
            seqlens += 1
        assert torch.equal(k[:, :, :capacity - 1], eager_k[:, :, :capacity - 1])


def test_decode_op_routes_a_chunked_prefill_and_passes_opcheck():
    """Inside the flashtriton::decode op (what torch.compile calls) a chunked prefill, with per-sequence
    lengths or an int length, takes the dense forward too: opcheck passes (its fake output matches the
    real one's layout), and the result is the decode kernel's."""
    from flashtriton import ops
    from flashtriton.cache import CACHE
    from flashtriton.launch.decode import DENSE_FROM_QUERIES
    q = torch.randn(2, 4, DENSE_FROM_QUERIES, 32, device=DEVICE, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 160, 32, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    seqlens = torch.tensor([100, 160], dtype=torch.int32, device=DEVICE)
    torch.library.opcheck(ops.decode, (q, k, v, seqlens, 0, None, None, None, True, 0.2, -1, -1, 0.0, None, 0, None,
                                       None))
    torch.library.opcheck(ops.decode, (q, k, v, None, 150, None, None, None, True, 0.2, -1, -1, 0.0, None, 0, None,
                                       None))  # an int length: the first 150 keys
    CACHE.last.clear()
    o, lse = ops.decode(q, k, v, seqlens, 0, None, None, None, True, 0.2, -1, -1, 0.0, None, 0, None, None)
    assert "forward" in CACHE.last
    by_decode = ops.decode(q, k, v, seqlens, 0, None, None, None, True, 0.2, -1, -1, 0.0, None, 1, None, None)
    torch.testing.assert_close(o.float(), by_decode[0].float(), atol=2e-2, rtol=0)
    torch.testing.assert_close(lse, by_decode[1], atol=1e-3, rtol=0)


def test_decode_op_opcheck_and_compile():
    """The flashtriton::decode op passes opcheck, and a decode step (append, attend) compiles with
    fullgraph=True and no graph break, giving the eager result."""
    from flashtriton import ops
    q = torch.randn(2, 4, 2, 32, device=DEVICE, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 64, 32, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    seqlens = torch.tensor([5, 40], dtype=torch.int32, device=DEVICE)
    torch.library.opcheck(ops.decode, (q, k, v, seqlens, 0, None, None, None, True, 0.2, -1, -1, 0.0, None, 2, None,
                                       None))
    torch.library.opcheck(ops.decode, (q, k, v, None, 33, None, None, None, False, 0.2, 3, 0, 0.0, None, 1, None,
                                       None))
    k8, v8 = (x.to(E4M3) for x in (k, v))
    k_descale, v_descale = torch.rand(2, 2, device=DEVICE) + 0.5, torch.rand(1, device=DEVICE) + 0.5
    # (test_schema compares the inputs before and after with arithmetic PyTorch has no float8 CPU kernel for)
    torch.library.opcheck(ops.decode, (q, k8, v8, seqlens, 0, None, None, None, True, 0.2, -1, -1, 0.0, None, 2,
                                       k_descale, v_descale),
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    k_new, v_new = (torch.randn(2, 2, 2, 32, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))

    def step(q, k_cache, v_cache, k_new, v_new, seqlens):
        return flash_attention_with_kvcache(q, k_cache, v_cache, seqlens, k_new, v_new, is_causal=True)
    caches = [(k.clone(), v.clone()) for _ in range(2)]
    with torch.no_grad():
        eager = step(q, *caches[0], k_new, v_new, seqlens)
        explain = torch._dynamo.explain(step)(q, *caches[1], k_new, v_new, seqlens)
        assert explain.graph_break_count == 0, explain.break_reasons
        compiled_caches = (k.clone(), v.clone())
        compiled = torch.compile(step, fullgraph=True, backend="inductor" if ON_GPU else "aot_eager")(
            q, *compiled_caches, k_new, v_new, seqlens)
    assert torch.equal(compiled, eager)
    assert torch.equal(compiled_caches[0], caches[0][0]) and torch.equal(compiled_caches[1], caches[0][1])


@pytest.mark.usefixtures("replays_through_the_interpreter")
@pytest.mark.parametrize("lengths_as", ["int", "tensor"])
def test_a_growing_cache_replays_one_plan(monkeypatch, lengths_as):
    """A decoding loop whose cache grows every step (a new, longer contiguous cache tensor, as
    transformers' DynamicCache makes; or one cache with a larger length) replays the first step's
    launches with each step's length, strides and split count, bit for bit what Triton's launch gives."""
    from flashtriton.cache import CACHE
    from flashtriton.launch import replay
    replays, original = [], replay.Recorded.replay
    monkeypatch.setattr(replay.Recorded, "replay", lambda self, *a: replays.append(1) or original(self, *a))
    q = torch.randn(2, 4, 1, 32, device=DEVICE, dtype=torch.bfloat16)
    full_k, full_v = (torch.randn(2, 2, 96, 32, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    steps = (33, 34, 35, 47, 48, 49) if lengths_as == "int" else (33, 34, 35, 47)
    got, want = [], []
    for replays_on, out in ((True, got), (False, want)):
        monkeypatch.setattr(CACHE, "replays", replays_on)
        for n in steps:
            k, v = full_k[:, :, :n].contiguous(), full_v[:, :, :n].contiguous()
            lengths = n if lengths_as == "int" else torch.full((2,), n, dtype=torch.int32, device=DEVICE)
            out.append(launch.attention_decode(q, k, v, lengths, 0.2, num_splits=2 if n < 40 else 3))
    for (o, lse), (o_want, lse_want) in zip(got, want, strict=True):
        assert torch.equal(o, o_want) and torch.equal(lse, lse_want)
    # Plans differ only where Triton specialises differently: 16 dividing the int length (48), the split count.
    plans = 3 if lengths_as == "int" else 2
    assert len(CACHE.plans) == plans and len(replays) == 2 * (len(steps) - plans)


def test_lengths_marked_checked_skip_the_read_back(monkeypatch):
    """Lengths a caller built in range (the transformers backend's, from position ids) and marked are not
    read back to the host, which would wait for the GPU; any other lengths tensor is."""
    from flashtriton.validation import mark_kvcache_checked
    torch.manual_seed(0)
    q = torch.randn(2, 4, 1, 32, device=DEVICE, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 40, 32, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    lengths = _seqlens(40, 17)
    mark_kvcache_checked(lengths, k)

    def read_back(self):
        raise AssertionError("read back to the host")
    monkeypatch.setattr(torch.Tensor, "tolist", read_back)
    o = flash_attention_with_kvcache(q, k, v, lengths)
    with pytest.raises(AssertionError, match="read back"):
        flash_attention_with_kvcache(q, k, v, lengths.clone())
    monkeypatch.undo()
    for b, n in enumerate((40, 17)):
        ref, _ = attention_ref(q[b:b + 1].double(), k[b:b + 1, :, :n].double(), v[b:b + 1, :, :n].double())
        torch.testing.assert_close(o[b:b + 1].double(), ref, atol=2e-2, rtol=0)


def _quantized_cache(k, v, per_head, powers_of_two):
    """The logical cache in e4m3 with its descales, (k8, v8, k_descale, v_descale, k, v dequantized in k's
    dtype): per (batch, KV head) or per tensor, scaled to e4m3's range. Powers of two keep the dequantized
    values exact in bf16, so that the reference sees what the cache holds. NaN stays NaN."""
    factors = []
    for x in (k, v):
        amax = x.nan_to_num().abs().float().amax(dim=(2, 3) if per_head else (0, 1, 2, 3), keepdim=True) / 448
        factors.append(torch.exp2(torch.log2(amax).ceil()) if powers_of_two else amax)
    k8, v8 = ((x.float() / f).to(E4M3) for x, f in zip((k, v), factors, strict=True))
    dequantized = [(x8.float() * f).to(k.dtype) for x8, f in zip((k8, v8), factors, strict=True)]
    descales = [f.reshape(f.shape[:2]) if per_head else f.reshape(1) for f in factors]
    return k8, v8, *descales, *dequantized


@pytest.mark.parametrize("layout", ["contiguous", "paged16", "paged64"])
@pytest.mark.parametrize("seqlen_q", [1, 4])
@pytest.mark.parametrize("dtype,per_head", [(torch.bfloat16, True), (torch.float32, False)], ids=["bf16-per-head",
                                                                                                  "fp32-per-tensor"])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_fp8_cache_matches_reference(layout, seqlen_q, dtype, per_head, num_splits):
    """An FP8 cache (k_descale, v_descale): GQA 4/2, causal, ragged lengths with 0 and the full cache,
    against the float64 attention of the dequantized cache, bounded by plain attention's error on it in
    q's dtype. bf16 with per-head power-of-two factors (its dequantized cache is exact in bf16), float32
    with a per-tensor factor of any value."""
    block = 1 if layout == "contiguous" else int(layout.removeprefix("paged"))
    capacity = math.ceil(CAPACITY / block) * block
    lengths = _lengths(capacity)
    q = torch.randn(4, 4, seqlen_q, 32, device=DEVICE, dtype=dtype)
    k, v = _cache(4, 2, capacity, 32, dtype, lengths)
    k8, v8, k_descale, v_descale, k_dq, v_dq = _quantized_cache(k * 3, v, per_head,
                                                                powers_of_two=dtype != torch.float32)
    o, lse = _run(layout, q, k8, v8, lengths, num_splits, dict(is_causal=True, k_descale=k_descale,
                                                               v_descale=v_descale))
    assert o.dtype == dtype and lse.dtype == torch.float32
    _check(o, lse, q, k_dq, v_dq, lengths, is_causal=True)


@pytest.mark.parametrize("layout", ["contiguous", "paged16"])
def test_fp8_cache_mixed_descales(layout):
    """k_descale per (batch, KV head) as a strided view, v_descale one per tensor, or None (1): the kernel
    reads each factor at its own strides."""
    capacity = math.ceil(CAPACITY / 16) * 16
    lengths = _lengths(capacity)
    q = torch.randn(4, 4, 1, 32, device=DEVICE, dtype=torch.bfloat16)
    k, v = _cache(4, 2, capacity, 32, torch.bfloat16, lengths)
    k8, _, k_descale, _, k_dq, _ = _quantized_cache(k, v, True, powers_of_two=True)
    _, v8, _, v_descale, _, v_dq = _quantized_cache(k, v, False, powers_of_two=True)
    k_strided = k_descale.t().contiguous().t()  # (B, Hkv) at strides (1, B)
    o, lse = _run(layout, q, k8, v8, lengths, 2, dict(k_descale=k_strided, v_descale=v_descale))
    _check(o, lse, q, k_dq, v_dq, lengths)
    v_plain = v.nan_to_num().clamp(-448, 448).to(E4M3)  # V held unscaled: v_descale None
    o, lse = _run(layout, q, k8, v_plain, lengths, 2, dict(k_descale=k_strided))
    _check(o, lse, q, k_dq, v_plain.to(torch.bfloat16), lengths)


@pytest.mark.parametrize("magnitude", [1e-6, 1e5])
def test_fp8_cache_bf16_query_magnitudes(magnitude):
    """A bf16 q against an FP8 cache runs its products in fp16 (kernels/decode.py): queries far below
    fp16's smallest normal and far past its largest are scaled into its range, not flushed or overflowed."""
    lengths = _lengths(CAPACITY)
    q = torch.randn(4, 4, 2, 32, device=DEVICE, dtype=torch.bfloat16) * magnitude
    k, v = _cache(4, 2, CAPACITY, 32, torch.bfloat16, lengths)
    k8, v8, k_descale, v_descale, k_dq, v_dq = _quantized_cache(k, v, True, powers_of_two=True)
    o, lse = _run("contiguous", q, k8, v8, lengths, 1, dict(k_descale=k_descale, v_descale=v_descale))
    assert torch.isfinite(o).all()
    _check(o, lse, q, k_dq, v_dq, lengths)


@pytest.mark.parametrize("layout", ["contiguous", "paged16"])
def test_fp8_cache_append_quantizes(layout):
    """New k, v in q's dtype are written as k / k_descale in e4m3, saturated at 448 (one value past the
    range lands there, not at NaN), and attended: the output equals a call on the cache appended by hand."""
    block = 1 if layout == "contiguous" else 16
    capacity = math.ceil(CAPACITY / block) * block
    lengths, new = [0, 5, capacity - 2], 2
    q = torch.randn(3, 4, new, 32, device=DEVICE, dtype=torch.bfloat16)
    k_new, v_new = (torch.randn(3, 2, new, 32, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    k_new[0, 0, 0, 0] = 1e4  # past 448 * k_descale
    k, v = _cache(3, 2, capacity, 32, torch.bfloat16, lengths)
    k8, v8, k_descale, v_descale, _, _ = _quantized_cache(k, v, per_head=True, powers_of_two=False)
    by_hand = [x.clone() for x in (k8, v8)]
    for b, n in enumerate(lengths):
        for x, x_new, d in ((by_hand[0], k_new, k_descale), (by_hand[1], v_new, v_descale)):
            x[b, :, n:n + new] = (x_new[b].float() / d[b][:, None, None]).clamp(-448, 448).to(E4M3)
    assert by_hand[0][0, 0, 0, 0].float() == 448
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    scales = dict(k_descale=k_descale, v_descale=v_descale, is_causal=True)
    with torch.no_grad():
        if layout == "contiguous":
            o = flash_attention_with_kvcache(q, k8, v8, seqlens, k_new, v_new, **scales)
            for got, want in zip((k8, v8), by_hand, strict=True):
                assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
            again = flash_attention_with_kvcache(q, *by_hand, seqlens + new, **scales)
        else:
            k_pages, v_pages, table = _paged(k8, v8, block)
            o = flash_attention_with_kvcache(q, k_pages, v_pages, seqlens, k_new, v_new, block_table=table, **scales)
            hand_pages = _paged(*by_hand, block)
            again = flash_attention_with_kvcache(q, k_pages, v_pages, seqlens + new, block_table=table, **scales)
            by_table = flash_attention_with_kvcache(q, hand_pages[0], hand_pages[1], seqlens + new,
                                                    block_table=hand_pages[2], **scales)
            assert torch.equal(again, by_table)
    assert torch.equal(o, again)


@pytest.mark.usefixtures("replays_through_the_interpreter")
def test_fp8_cache_descales_are_values_not_signature():
    """A call with a remembered signature (kvcache._signature), whose launch replays the recorded plan, still
    reads its own descales: doubling v_descale doubles O, and k_descale scales the scores as the scale
    does."""
    q = torch.randn(2, 4, 1, 32, device=DEVICE, dtype=torch.bfloat16)
    k8, v8 = (torch.randn(2, 2, 64, 32, device=DEVICE).to(E4M3) for _ in range(2))
    one, two = (torch.full((1,), x, device=DEVICE) for x in (1.0, 2.0))
    with torch.no_grad():
        base = flash_attention_with_kvcache(q, k8, v8, 40, k_descale=one, v_descale=one)
        doubled = flash_attention_with_kvcache(q, k8, v8, 40, k_descale=one, v_descale=two)
        sharper = flash_attention_with_kvcache(q, k8, v8, 40, k_descale=two, v_descale=one)
        by_scale = flash_attention_with_kvcache(q, k8, v8, 40, k_descale=one, v_descale=one, scale=2 * 32 ** -0.5)
    torch.testing.assert_close(doubled, 2 * base, rtol=0, atol=0)
    torch.testing.assert_close(sharper, by_scale, rtol=1e-2, atol=1e-2)


FP8_ERRORS = {
    "fp8 new k": (lambda q, k8, s: flash_attention_with_kvcache(q, k8, k8, 3, k8[:, :, :1], k8[:, :, :1]),
                  TypeError, "come in q's dtype"),
    "descale on a bf16 cache": (lambda q, k8, s: flash_attention_with_kvcache(
        q, k8.bfloat16(), k8.bfloat16(), 3, k_descale=s), ValueError, "leave them None"),
    "descale shape": (lambda q, k8, s: flash_attention_with_kvcache(
        q, k8, k8, 3, v_descale=torch.ones(3, device=DEVICE)), ValueError, r"v_descale .* shape \(2, 2\)"),
    "descale dtype": (lambda q, k8, s: flash_attention_with_kvcache(q, k8, k8, 3, k_descale=s.double()),
                      TypeError, "k_descale must be a float32"),
    "v_cache not fp8": (lambda q, k8, s: flash_attention_with_kvcache(q, k8, k8.bfloat16(), 3),
                        TypeError, "float8_e4m3fn in both"),
    "fp8 q": (lambda q, k8, s: flash_attention_with_kvcache(q.to(E4M3), k8, k8, 3), TypeError, "q has dtype"),
    "flash_attn q_descale": (lambda q, k8, s: fai.flash_attn_with_kvcache(
        q.transpose(1, 2), k8.transpose(1, 2), k8.transpose(1, 2), cache_seqlens=3, q_descale=s),
        NotImplementedError, "q_descale"),
}


@pytest.mark.parametrize("case", list(FP8_ERRORS))
def test_fp8_cache_errors(case):
    fn, error, match = FP8_ERRORS[case]
    q = torch.randn(2, 4, 1, 32, device=DEVICE, dtype=torch.bfloat16)
    k8 = torch.randn(2, 2, 64, 32, device=DEVICE).to(E4M3)
    with pytest.raises(error, match=match):
        fn(q, k8, torch.ones(1, device=DEVICE))


def test_fp8_cache_step_compiles():
    """A decode step on an FP8 cache (quantizing append, attend) compiles with fullgraph=True and gives the
    eager result, cache bytes included."""
    q = torch.randn(2, 4, 1, 32, device=DEVICE, dtype=torch.bfloat16)
    k8, v8 = (torch.randn(2, 2, 64, 32, device=DEVICE).to(E4M3) for _ in range(2))
    k_new, v_new = (torch.randn(2, 2, 1, 32, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    k_descale, v_descale = torch.rand(2, 2, device=DEVICE) + 0.5, torch.full((1,), 0.25, device=DEVICE)
    seqlens = torch.tensor([5, 40], dtype=torch.int32, device=DEVICE)

    def step(q, k_cache, v_cache, k_new, v_new, seqlens):
        return flash_attention_with_kvcache(q, k_cache, v_cache, seqlens, k_new, v_new, is_causal=True,
                                            k_descale=k_descale, v_descale=v_descale)
    eager_caches, compiled_caches = [(k8.clone(), v8.clone()) for _ in range(2)]
    with torch.no_grad():
        eager = step(q, *eager_caches, k_new, v_new, seqlens)
        compiled = torch.compile(step, fullgraph=True, backend="inductor" if ON_GPU else "aot_eager")(
            q, *compiled_caches, k_new, v_new, seqlens)
    assert torch.equal(compiled, eager)
    for got, want in zip(compiled_caches, eager_caches, strict=True):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_flash_attn_with_kvcache_fp8_cache():
    """flash_attn's layout with FlashAttention-3's keywords: the same result as flashtriton's function."""
    q = torch.randn(2, 4, 1, 32, device=DEVICE, dtype=torch.bfloat16)
    k8, v8 = (torch.randn(2, 2, 64, 32, device=DEVICE).to(E4M3) for _ in range(2))
    k_descale, v_descale = torch.rand(2, 2, device=DEVICE) + 0.5, torch.full((1,), 0.25, device=DEVICE)
    seqlens = torch.tensor([5, 40], dtype=torch.int32, device=DEVICE)
    with torch.no_grad():
        ours = flash_attention_with_kvcache(q, k8, v8, seqlens, is_causal=True, k_descale=k_descale,
                                            v_descale=v_descale)
        theirs = fai.flash_attn_with_kvcache(q.transpose(1, 2), k8.transpose(1, 2), v8.transpose(1, 2),
                                             cache_seqlens=seqlens, causal=True, k_descale=k_descale,
                                             v_descale=v_descale)
    assert torch.equal(theirs.transpose(1, 2), ours)
