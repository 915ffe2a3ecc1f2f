"""Packed variable-length batches (flash_attention_varlen): each sequence attends within itself, checked
sequence by sequence against the float64 reference for O, L, dQ, dK, dV, with empty sequences, GQA,
Nq != Nk per sequence, and the other variants."""

import pytest
import torch

from conftest import DEVICE, ON_GPU
from flashtriton import flash_attention_varlen
from flashtriton.testing import bounded
from helpers import packed_qkv as _packed
from helpers import reference_per_sequence as _per_sequence

LENGTHS = (([5, 0, 37, 70, 1, 130], [9, 3, 37, 50, 17, 97]) if not ON_GPU
           else ([500, 0, 1037, 70, 1, 2000], [900, 3, 1037, 1500, 17, 1999]))


@pytest.mark.parametrize("kwargs", [dict(), dict(is_causal=True), dict(window_size=(7, 3)),
                                    dict(is_causal=True, softcap=4.0, alibi=True), dict(is_causal=True, dropout_p=0.2)],
                         ids=["full", "causal", "window", "causal+softcap+alibi", "causal+dropout"])
@pytest.mark.parametrize("heads_q,heads_kv,head_dim", [(4, 2, 32), (2, 2, 40)])
def test_varlen_matches_reference_per_sequence(kwargs, heads_q, heads_kv, head_dim):
    kwargs = dict(kwargs)
    if kwargs.pop("alibi", False):
        kwargs["alibi_slopes"] = torch.rand(len(LENGTHS[0]), heads_q, device=DEVICE)
    q, k, v, cu_q, cu_k = _packed(*LENGTHS, heads_q, heads_kv, head_dim, torch.bfloat16)
    torch.manual_seed(5)
    o, lse = flash_attention_varlen(q, k, v, cu_q, cu_k, max(LENGTHS[0]), max(LENGTHS[1]), return_lse=True,
                                    **kwargs)
    if kwargs.get("dropout_p"):  # the kernels' mask: the same draw of the seed, counters per sequence
        from flashtriton import launch
        torch.manual_seed(5)
        kwargs["dropout_mask"] = launch.dropout_mask(launch.new_dropout_seed(q.device), len(LENGTHS[0]), heads_q,
                                                  max(LENGTHS[0]), max(LENGTHS[1]), kwargs["dropout_p"])
    assert o.shape == q.shape and lse.shape == (heads_q, q.shape[0]) and lse.dtype == torch.float32
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    o64, lse64 = _per_sequence(q64, k64, v64, cu_q, cu_k, True, **kwargs)
    ref_grads = torch.autograd.grad(o64, (q64, k64, v64), do.double())
    low_o, low_lse = _per_sequence(q, k, v, cu_q, cu_k, False, **kwargs)
    low_grads = torch.autograd.grad(low_o, (q, k, v), do)
    finite = torch.isfinite(lse64)
    assert torch.equal(torch.isneginf(lse), ~finite)
    checks = [bounded("O", o, o64, low_o, q.dtype), bounded("L", lse[finite], lse64[finite], low_lse[finite], q.dtype)]
    checks += [bounded(n, g, r, lo, q.dtype) for n, g, r, lo in zip(("dQ", "dK", "dV"), grads, ref_grads, low_grads,
                                                                    strict=True)]
    failed = [str(c) for c in checks if not c.ok]
    assert not failed, "; ".join(failed)


def test_varlen_is_the_padded_batch_without_the_padding():
    """One sequence per batch element, equal lengths: the same numbers as flash_attention on (B, H, N, D)."""
    from flashtriton import flash_attention
    q, k, v, cu_q, cu_k = _packed([33, 33], [21, 21], 2, 2, 16, torch.float32)
    o = flash_attention_varlen(q, k, v, cu_q, cu_k, 33, 21, is_causal=True)
    dense = flash_attention(*(x.detach().view(2, -1, 2, 16).transpose(1, 2) for x in (q, k, v)), is_causal=True)
    assert torch.allclose(o.view(2, 33, 2, 16).transpose(1, 2), dense, atol=1e-5)


@pytest.mark.parametrize("change,error,match", [
    (lambda a: {**a, "cu_seqlens_q": a["cu_seqlens_q"].long()}, TypeError, "1-D int32"),
    (lambda a: {**a, "cu_seqlens_q": a["cu_seqlens_q"].flip(0)}, ValueError, "start at 0"),
    (lambda a: {**a, "cu_seqlens_k": a["cu_seqlens_k"][:-1]}, ValueError, "end at"),
    (lambda a: {**a, "max_seqlen_q": 3}, ValueError, "max_seqlen_q must be an int >= the longest"),
    (lambda a: {**a, "q": a["q"][None]}, ValueError, "3 dims"),
    (lambda a: {**a, "alibi_slopes": torch.ones(5, 2, device=DEVICE)}, ValueError, "alibi_slopes must have shape"),
])
def test_bad_varlen_arguments_are_clear_errors(change, error, match):
    q, k, v, cu_q, cu_k = _packed([4, 6], [5, 5], 2, 2, 16, torch.float32)
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=6, max_seqlen_k=5)
    with pytest.raises(error, match=match):
        flash_attention_varlen(**change(args))


def test_cu_seqlens_are_read_once_per_tensor_version(monkeypatch):
    q, k, v, cu_q, cu_k = _packed([4, 6], [5, 5], 2, 2, 16, torch.float32)
    flash_attention_varlen(q, k, v, cu_q, cu_k, 6, 5)
    reads = []
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: reads.append(1) or list(map(int, self.cpu().numpy())))
    flash_attention_varlen(q, k, v, cu_q, cu_k, 6, 5)
    assert reads == []  # the same, unmodified tensors: remembered
    cu_q[1] = 7  # an in-place write bumps the version: read again, and the bad total is caught
    with pytest.raises(ValueError, match="max_seqlen_q must be an int >= the longest"):
        flash_attention_varlen(q, k, v, cu_q, cu_k, 6, 5)
    assert reads


def test_strided_cu_seqlens_read_like_contiguous_ones():
    q, k, v, cu_q, cu_k = _packed([4, 6, 3], [5, 5, 2], 2, 2, 16, torch.float32)
    o = flash_attention_varlen(q, k, v, cu_q, cu_k, 6, 5, is_causal=True)
    strided_q = torch.stack([cu_q, torch.full_like(cu_q, -7)], dim=1)[:, 0]  # stride 2, junk in between
    strided_k = torch.stack([cu_k, torch.full_like(cu_k, 99)], dim=1)[:, 0]
    assert strided_q.stride(0) == 2
    torch.testing.assert_close(flash_attention_varlen(q, k, v, strided_q, strided_k, 6, 5, is_causal=True), o,
                               rtol=0, atol=0)
