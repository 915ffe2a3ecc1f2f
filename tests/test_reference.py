"""The tiled PyTorch FlashAttention-2 (forward and backward) against the plain float64 attention."""

import pytest
import torch

from flashtriton import FlashAttentionPytorch, attention_ref
from helpers import check_against_reference

SEQLENS = [(1, 1), (17, 17), (63, 97), (97, 63), (130, 130), (70, 25)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("tiles", [(16, 16), (32, 16), (16, 64)], ids=lambda t: f"Bq{t[0]}-Bk{t[1]}")
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS, ids=[f"Nq{a}-Nk{b}" for a, b in SEQLENS])
def test_tiled_pytorch_matches_reference(seqlen_q, seqlen_k, is_causal, tiles, dtype):
    shape_q, shape_k = (2, 3, seqlen_q, 24), (2, 3, seqlen_k, 24)
    q = torch.randn(shape_q, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(shape_k, dtype=dtype, requires_grad=True) for _ in range(2))

    def fn(q, k, v):
        o = FlashAttentionPytorch.apply(q, k, v, is_causal, None, *tiles)
        return o, o.grad_fn.saved_tensors[4]

    check_against_reference(fn, q, k, v, is_causal)


def test_article_shape_and_saved_tensors():
    Q, K, V = (torch.randn(4, 33, 16, requires_grad=True) for _ in range(3))  # the article's (batch, N, d)
    O = FlashAttentionPytorch.apply(Q, K, V, True)
    saved = O.grad_fn.saved_tensors
    assert len(saved) == 5 and saved[4].shape == Q.shape[:-1] and saved[4].dtype == torch.float32
    assert [s.shape for s in saved[:4]] == [Q.shape, K.shape, V.shape, O.shape]


def test_reference_handles_rows_without_keys():
    q = torch.randn(1, 1, 6, 8, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, 1, 2, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    o, lse = attention_ref(q, k, v, is_causal=True)
    assert torch.all(o[..., :4, :] == 0) and torch.all(torch.isneginf(lse[..., :4]))
    grads = torch.autograd.grad(o.sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)
    assert torch.all(grads[0][..., :4, :] == 0)
    # The last two rows see keys 0 and 0..1: compare with an explicit softmax.
    s = (q[..., 4:, :] @ k.transpose(-1, -2)) / 8**0.5
    s[..., 0, 1] = float("-inf")
    torch.testing.assert_close(o[..., 4:, :], torch.softmax(s, -1) @ v)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_references_taken_a_few_batches_at_a_time_check_the_same(monkeypatch, is_causal):
    """testing.compare_with_reference takes its float64 and low-precision references a few batch elements at
    a time (REFERENCE_SCORES), so that a long GPU test's float64 graph fits: one element at a time it reports
    the same errors as with the whole batch at once and bounds within 5% (the bf16 attention that sets them
    is a max over elements whose products the BLAS blocks apart in another order: CI's CPU moved one by
    2.2e-4, this machine's by less than 1e-4), alibi slopes per batch included, and a
    bf16 function that is off by more than its bound still fails."""
    from flashtriton import testing

    q = torch.randn(3, 2, 17, 16, dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(3, 2, 30, 16, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    slopes = torch.rand(3, 2)

    def plain(q, k, v):
        return attention_ref(q, k, v, is_causal=is_causal, upcast=False, alibi_slopes=slopes)

    def run(fn):
        torch.manual_seed(0)
        return testing.compare_with_reference(fn, q, k, v, is_causal, alibi_slopes=slopes)
    whole = run(plain)
    monkeypatch.setattr(testing, "REFERENCE_SCORES", 1)
    chunked = run(plain)
    assert [c.name for c in chunked] == [c.name for c in whole] and all(c.ok for c in chunked), chunked
    for a, b in zip(chunked, whole, strict=True):
        assert a.err == pytest.approx(b.err, rel=1e-6, abs=1e-12) and a.allowed == pytest.approx(b.allowed, rel=0.05)

    def off(q, k, v):  # the last batch element's O off by 10%: past twice bf16 attention's error
        o, lse = plain(q, k, v)
        return torch.cat([o[:-1], o[-1:] * 1.1]), lse
    assert not next(c for c in run(off) if c.name == "O").ok
