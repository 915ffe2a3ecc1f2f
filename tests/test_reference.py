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
