"""The Triton kernels against the float64 reference: O, L, dQ, dK, dV."""

import pytest
import torch

from conftest import DEVICE, ON_GPU
from flashtriton import FlashAttentionTriton, attention_ref, flash_attention, launch
from flashtriton.cache import CACHE
from flashtriton.launch import TileConfig, attention_forward
from flashtriton.testing import bounded
from helpers import check_against_reference, make_qkv, max_err, with_backward_tiles

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
# Odd sizes on purpose: ragged last tiles, a single row, Nq != Nk both ways.
SEQLENS = [(1, 1), (17, 17), (63, 63), (97, 97), (130, 130), (63, 97), (97, 63), (1, 130), (130, 1), (17, 130)]
if ON_GPU:  # tiles are 128 x 64 there: these cross several of them
    SEQLENS += [(257, 257), (511, 1025), (1025, 511), (1000, 1000), (2048, 2048)]


def _flash(is_causal, scale=None):
    return lambda q, k, v: flash_attention(q, k, v, is_causal=is_causal, scale=scale, return_lse=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS, ids=[f"Nq{a}-Nk{b}" for a, b in SEQLENS])
def test_matches_reference(seqlen_q, seqlen_k, is_causal, dtype):
    q, k, v = make_qkv(2, 2, 2, seqlen_q, seqlen_k, 64 if ON_GPU else 32, dtype, DEVICE)
    check_against_reference(_flash(is_causal), q, k, v, is_causal)


HEAD_DIMS = [16, 32, 64, 128, 256, 40, 59, 1]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=[f"D{d}" for d in HEAD_DIMS])
def test_head_dims(head_dim, is_causal, dtype):
    seqlen_q, seqlen_k = (300, 333) if ON_GPU else (33, 47)
    q, k, v = make_qkv(1, 2, 2, seqlen_q, seqlen_k, head_dim, dtype, DEVICE)
    check_against_reference(_flash(is_causal), q, k, v, is_causal)


@pytest.mark.parametrize("heads_q,heads_kv", [(4, 2), (4, 1), (6, 3)], ids=["GQA-4-2", "MQA-4-1", "GQA-6-3"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_grouped_query_heads(heads_q, heads_kv, is_causal):
    q, k, v = make_qkv(2, heads_q, heads_kv, 45, 61, 32, torch.float16, DEVICE)
    check_against_reference(_flash(is_causal), q, k, v, is_causal)


@pytest.mark.parametrize("heads_per_group", [1, 2, 4], ids=lambda g: f"group{g}")
@pytest.mark.parametrize("heads_q,heads_kv", [(3, 3), (6, 2)], ids=["MHA", "GQA"])
def test_causal_launch_order_covers_every_tile(monkeypatch, heads_q, heads_kv, heads_per_group):
    """Causal launches take (batch, head) pairs in groups that share the L2 (program_tile). The interpreter
    models a 50 MB L2, so small problems fit one group: force small ones, with a short last group (2 x 3
    pairs in groups of 4), so that every kernel must still visit each tile exactly once."""
    for launcher in (launch.forward, launch.backward):
        monkeypatch.setattr(launcher, "heads_per_group", lambda *args: heads_per_group)
    monkeypatch.setattr(CACHE, "replays", False)  # a replayed launch would keep the real grouping
    q, k, v = make_qkv(2, heads_q, heads_kv, 70, 90, 32, torch.float16, DEVICE)
    check_against_reference(_flash(True), q, k, v, True)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_custom_scale(is_causal):
    q, k, v = make_qkv(1, 2, 2, 40, 40, 32, torch.float32, DEVICE)
    check_against_reference(_flash(is_causal, scale=0.3), q, k, v, is_causal, scale=0.3)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_flash_attn_layout_views(is_causal):
    """(B, N, H, D) tensors passed as .transpose(1, 2) views, and q/k/v sliced out of one packed qkv."""
    batch, seqlen, heads, head_dim = 2, 50, 3, 32
    qkv = torch.randn(batch, seqlen, 3, heads, head_dim, device=DEVICE, dtype=torch.bfloat16)
    q, k, v = (qkv[:, :, i].transpose(1, 2).requires_grad_() for i in range(3))
    assert q.stride(-1) == 1 and not q.is_contiguous()
    check_against_reference(_flash(is_causal), q, k, v, is_causal)


def test_last_dim_not_contiguous_is_copied():
    q, k, v = make_qkv(1, 2, 2, 20, 20, 16, torch.float32, DEVICE, requires_grad=False)
    qt = q.transpose(-1, -2).contiguous().transpose(-1, -2).requires_grad_()  # same values, stride(-1) != 1
    assert qt.stride(-1) != 1
    check_against_reference(_flash(False), qt, k.requires_grad_(), v.requires_grad_(), False)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rows_with_no_visible_key(dtype):
    """Causal with Nq > Nk: the first Nq - Nk queries see no key. O = 0, L = -inf, zero gradients, no NaN."""
    seqlen_q, seqlen_k = 70, 25
    q, k, v = make_qkv(2, 2, 2, seqlen_q, seqlen_k, 32, dtype, DEVICE)
    o, lse = flash_attention(q, k, v, is_causal=True, return_lse=True)
    blind = seqlen_q - seqlen_k
    assert torch.all(o[:, :, :blind] == 0)
    assert torch.all(torch.isneginf(lse[:, :, :blind])) and torch.all(torch.isfinite(lse[:, :, blind:]))
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), torch.randn_like(o))
    for g in (dq, dk, dv):
        assert torch.isfinite(g).all()
    assert torch.all(dq[:, :, :blind] == 0)
    check_against_reference(_flash(True), q, k, v, True)


def test_empty_keys_and_queries():
    q, k, v = make_qkv(1, 2, 2, 5, 0, 16, torch.float32, DEVICE)
    o, lse = flash_attention(q, k, v, return_lse=True)
    assert torch.all(o == 0) and torch.all(torch.isneginf(lse))
    dq, = torch.autograd.grad(o.sum(), (q,))
    assert torch.all(dq == 0)
    q, k, v = make_qkv(1, 2, 2, 0, 5, 16, torch.float32, DEVICE)
    o = flash_attention(q, k, v)
    assert o.shape == (1, 2, 0, 16)
    dq, dk, dv = torch.autograd.grad(o.sum(), (q, k, v))
    assert torch.all(dk == 0) and torch.all(dv == 0)


@pytest.mark.parametrize("shape", [(2, 4, 2, 130, 97, 64), (2, 4, 2, 1500, 1100, 64), (1, 8, 8, 8192, 8192, 64),
                                   (2, 8, 4, 4096, 4096, 128), (1, 4, 2, 2048, 2048, 256)],
                         ids=["small", "static-tiles", "autotuned", "gluon-auto", "gluon-d256"])
def test_backward_is_deterministic(shape):
    """With deterministic=True, bitwise identical gradients run after run: on the static tiles and (on a
    GPU, where the problem is large enough) on the autotuned ones, and where auto would take the Gluon
    backward (D = 128 from 2048 keys on sm_90), which then leaves dQ to the Triton kernel; at D = 256 (from
    2048 keys on sm_90) the Gluon form without dQ (DETERMINISTIC_HEAD_DIMS), dQ from the Triton kernel."""
    if shape[3] > 200 and not ON_GPU:
        pytest.skip("GPU sizes")
    q, k, v = make_qkv(*shape, torch.bfloat16, DEVICE)
    do = torch.randn(q.shape, dtype=q.dtype, device=DEVICE)
    runs = [torch.autograd.grad(flash_attention(q, k, v, is_causal=True, deterministic=True), (q, k, v), do)
            for _ in range(3)]
    for later in runs[1:]:
        for a, b in zip(runs[0], later, strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("shape", [(50, 32), (3, 50, 32), (2, 3, 50, 32), (2, 2, 2, 50, 32)],
                         ids=["N-d", "batch-N-d", "B-H-N-D", "5d"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_article_interface(shape, is_causal):
    """FlashAttentionTriton.apply(Q, K, V, is_causal) on (..., N, d); saves exactly Q, K, V, O, L."""
    Q, K, V = (torch.randn(shape, device=DEVICE, dtype=torch.float16, requires_grad=True) for _ in range(3))
    O = FlashAttentionTriton.apply(Q, K, V, is_causal)
    assert O.shape == Q.shape and O.dtype == Q.dtype
    node = O.grad_fn  # past the views, to the forward op's autograd node
    while not hasattr(node, "saved_tensors"):
        node = node.next_functions[0][0]
    saved = node.saved_tensors
    assert len(saved) == 5
    for got, want in zip(saved[:4], (Q, K, V, O), strict=True):
        assert got.numel() == want.numel() and torch.equal(got.reshape(want.shape), want)
    L = saved[4]
    assert L.numel() == Q[..., 0].numel() and L.dtype == torch.float32

    def fn(q, k, v):  # (B', 1, N, d) views in, the article's shape through the kernel
        o, lse = FlashAttentionTriton.apply(q.reshape(shape), k.reshape(shape), v.reshape(shape), is_causal, None, True)
        return o.reshape(q.shape), lse.reshape(q.shape[:-1])

    q4, k4, v4 = (x.detach().reshape(-1, 1, *shape[-2:]).requires_grad_() for x in (Q, K, V))
    check_against_reference(fn, q4, k4, v4, is_causal)


@pytest.fixture
def fp32_matmul_precision():
    """Set torch.backends.cuda.matmul.fp32_precision for one test and restore it."""
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    yield lambda value: setattr(matmul, "fp32_precision", value)
    matmul.fp32_precision = before


@pytest.mark.parametrize("precision", ["ieee", "tf32"])
def test_float32_follows_torch_matmul_precision(precision, fp32_matmul_precision):
    fp32_matmul_precision(precision)
    q, k, v = make_qkv(1, 2, 2, 300 if ON_GPU else 40, 300 if ON_GPU else 40, 64, torch.float32, DEVICE)
    # Triton's TF32 dots are less accurate than cuBLAS's: on the H200 our errors were 2.7x (O) and 6.5x (L)
    # those of the plain attention run through cuBLAS in TF32, hence a wider factor for TF32 only.
    check_against_reference(_flash(False), q, k, v, False, factor=8.0 if precision == "tf32" else 2.0)
    if ON_GPU:  # the interpreter computes every dot in full float32, whatever the setting
        with torch.no_grad():
            err = max_err(flash_attention(q, k, v), attention_ref(q, k, v)[0])
        assert (err > 1e-5) if precision == "tf32" else (err < 1e-5), f"max error {err:.1e} with {precision}"


FWD_CONFIGS = [TileConfig(16, 16), TileConfig(32, 16, use_tma=True),
               TileConfig(16, 32, use_tma=True, warp_specialize=True),
               TileConfig(16, 16, qk_ahead=True), TileConfig(32, 16, use_tma=True, qk_ahead=True)]
if ON_GPU:
    FWD_CONFIGS = [TileConfig(128, 64, 4, 3), TileConfig(64, 128, 4, 2, use_tma=True),
                   TileConfig(128, 128, 8, 2, use_tma=True),
                   TileConfig(128, 64, 8, 3, use_tma=True, warp_specialize=True),
                   TileConfig(128, 64, 8, 3, use_tma=True, qk_ahead=True), TileConfig(128, 64, 4, 3, qk_ahead=True)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("config", FWD_CONFIGS, ids=lambda c: c.name)
def test_forward_tile_configs(config, is_causal, dtype):
    """Every path the forward can take (pointer loads, TMA descriptors, warp specialisation, the
    q @ k^T-ahead loop, tile shapes)."""
    seqlen_q, seqlen_k = (700, 929) if ON_GPU else (70, 93)
    q, k, v = make_qkv(2, 2, 2, seqlen_q, seqlen_k, 64, dtype, DEVICE, requires_grad=False)
    o, lse = attention_forward(q, k, v, is_causal, 0.125, config)
    q64, k64, v64 = (x.double() for x in (q, k, v))
    o64, lse64 = attention_ref(q64, k64, v64, is_causal=is_causal, scale=0.125)
    low_o, low_lse = attention_ref(q, k, v, is_causal=is_causal, scale=0.125, upcast=False)
    for check in (bounded("O", o, o64, low_o, dtype), bounded("L", lse, lse64, low_lse, dtype)):
        assert check.ok, str(check)


# D <= 64 takes the dK/dV kernel's three loops under a causal mask, D = 128 its one loop (every tile masked).
# A register cap (max_registers) is a compile option: the interpreter takes the launch keyword and ignores it.
BWD_CONFIGS = [(TileConfig(16, 32, use_tma=True, max_registers=168), TileConfig(32, 16, use_tma=True), 64),
               (TileConfig(16, 32), TileConfig(32, 16, use_tma=True), 64),
               (TileConfig(16, 32, use_tma=True), TileConfig(32, 16), 128),
               (TileConfig(16, 32), TileConfig(32, 16), 96),
               (TileConfig(16, 128, use_tma=True), TileConfig(32, 16), 32),  # 128 keys per dK/dV tile
               (TileConfig(16, 128), TileConfig(32, 16), 32),
               # D = 256's autotuner candidates beside its static tiles (128 query rows per dQ tile)
               (TileConfig(16, 32, 4, 1), TileConfig(128, 16, 8, 1), 256)]
if ON_GPU:
    BWD_CONFIGS = [(TileConfig(32, 128, 4, 3, use_tma=True), TileConfig(128, 32, 4, 3, use_tma=True), 64),
                   (TileConfig(64, 128, 8, 2, use_tma=True), TileConfig(128, 64, 8, 2), 64),
                   (TileConfig(64, 64, 4, 3, use_tma=True), TileConfig(128, 64, 8, 3, use_tma=True), 64),
                   # D=64's first autotuner candidate, capped so that three blocks share an SM (NOTES 38)
                   (TileConfig(64, 64, 4, 3, use_tma=True, max_registers=168), TileConfig(128, 64, 8, 3, use_tma=True),
                    64),
                   # D=128's autotuner candidates
                   (TileConfig(64, 64, 4, 2, use_tma=True), TileConfig(128, 64, 8, 3, use_tma=True), 128),
                   (TileConfig(64, 128, 8, 3), TileConfig(128, 64, 8, 3, use_tma=True), 128),
                   (TileConfig(64, 64, 4, 2), TileConfig(128, 64, 8, 3), 96),
                   # D = 256's, beside its static tiles
                   (TileConfig(16, 32, 4, 1), TileConfig(128, 16, 8, 1), 256),
                   (TileConfig(16, 32, 4, 1), TileConfig(32, 32, 4, 1), 256)]


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(70, 93), (93, 70)] if not ON_GPU else [(700, 929), (929, 700)])
@pytest.mark.parametrize("configs", BWD_CONFIGS, ids=lambda c: f"{c[0].name}+{c[1].name}-D{c[2]}")
def test_backward_tile_configs(configs, seqlen_q, seqlen_k, is_causal):
    """The backward's data paths (pointer loads, and the TMA loads) with GQA and odd sizes."""
    dkdv_config, dq_config, head_dim = configs
    q, k, v = make_qkv(2, 4, 2, seqlen_q, seqlen_k, head_dim, torch.bfloat16, DEVICE)
    check_against_reference(lambda q, k, v: with_backward_tiles(q, k, v, is_causal, (dkdv_config, dq_config)),
                            q, k, v, is_causal)


def test_inference_path_matches_autograd_path():
    """Without gradients flash_attention skips autograd.Function: same numbers, no graph."""
    q, k, v = make_qkv(1, 2, 2, 37, 41, 32, torch.bfloat16, DEVICE)
    o, lse = flash_attention(q, k, v, is_causal=True, return_lse=True)
    with torch.no_grad():
        o_ng, lse_ng = flash_attention(q, k, v, is_causal=True, return_lse=True)
    o_plain = flash_attention(q.detach(), k.detach(), v.detach(), is_causal=True)
    assert o.grad_fn is not None and o_ng.grad_fn is None and o_plain.grad_fn is None
    assert torch.equal(o, o_ng) and torch.equal(lse, lse_ng) and torch.equal(o_ng, o_plain)


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("seqlen", [1, 17, 97])
def test_backward_statistics_layout_and_values(seqlen, varlen):
    """The preprocess's L * log2 e and D = rowsum(dO * O): lse's shape, each row padded to a multiple of 4
    elements (TMA reads rows 16-byte aligned), float32 sums of the low-precision products; a row that sees
    no key keeps L = -inf."""
    heads, dim = 3, 40
    if varlen:  # two sequences packed: (total, H, D) viewed as (1, H, total, D), LSE (1, H, total)
        lengths = [seqlen, seqlen + 2]
        total = sum(lengths)
        o, do = (torch.randn(total, heads, dim, dtype=torch.bfloat16, device=DEVICE).transpose(0, 1)[None]
                 for _ in range(2))
        lse = torch.randn(1, heads, total, device=DEVICE)
        cu = torch.tensor([0, seqlen, total], dtype=torch.int32, device=DEVICE)
        packed = launch.Varlen(cu, cu, max(lengths), max(lengths))
    else:
        o, do = (torch.randn(2, heads, seqlen, dim, dtype=torch.bfloat16, device=DEVICE) for _ in range(2))
        lse = torch.randn(2, heads, seqlen, device=DEVICE)
        packed = None
    lse[..., 0] = float("-inf")
    lse2, delta = launch.backward_stats(o, do, lse, packed)
    for t in (lse2, delta):
        assert t.shape == lse.shape and t.dtype == torch.float32
        assert t.stride(-1) == 1 and t.stride(-2) % 4 == 0 and t.stride(-2) >= lse.shape[-1]
    torch.testing.assert_close(lse2, lse * 1.4426950408889634, rtol=1e-6, atol=0)
    rowsum = (o.float() * do.float()).sum(-1)
    torch.testing.assert_close(delta, rowsum, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(17, 23), (97, 70)])
def test_backward_never_reads_the_statistics_padding(monkeypatch, seqlen_q, seqlen_k, is_causal):
    """NaN in every padded element of the L and D rows must not reach a gradient: both data paths read
    only a row's seqlen_q elements (TMA zero-fills past the descriptor's shape)."""
    q, k, v = make_qkv(2 if ON_GPU else 1, 4, 2, seqlen_q, seqlen_k, 64, torch.bfloat16, DEVICE, requires_grad=False)
    o, lse = attention_forward(q, k, v, is_causal, 0.125)
    do = torch.randn_like(o)
    configs = [(TileConfig(16, 32, use_tma=True), TileConfig(32, 16, use_tma=True)),
               (TileConfig(16, 32), TileConfig(32, 16))]
    clean = [launch.attention_backward(do, q, k, v, o, lse, is_causal, 0.125, c, autotune=False) for c in configs]
    original = launch.backward.statistics_buffer

    def poisoned(lse):
        lse2, delta = original(lse)
        for t in (lse2, delta):
            rows = t.as_strided((*t.shape[:-1], t.stride(-2)), t.stride())
            rows[..., t.shape[-1]:] = float("nan")
        return lse2, delta
    monkeypatch.setattr(launch.backward, "statistics_buffer", poisoned)
    monkeypatch.setattr(CACHE, "replays", False)  # a replay of the clean calls' launches would skip it
    for c, grads in zip(configs, clean, strict=True):
        for got, want in zip(launch.attention_backward(do, q, k, v, o, lse, is_causal, 0.125, c, autotune=False),
                             grads, strict=True):
            assert torch.equal(got, want), c
