"""Numerical safety: no NaN or inf in outputs or gradients for any valid input, however extreme, and the
autograd corners (gradients for some inputs only, no double backward)."""

import pytest
import torch

from conftest import DEVICE, ON_GPU
from flashtriton import attention_ref, flash_attention, flash_attention_varlen
from flashtriton.testing import bounded
from helpers import packed_qkv

N = 300 if ON_GPU else 45


def _run(q, k, v, do_scale=1.0, **kwargs):
    o, lse = flash_attention(q, k, v, return_lse=True, **kwargs)
    do = torch.randn_like(o) * do_scale
    grads = torch.autograd.grad(o, (q, k, v), do)
    for name, x in (("O", o), ("dQ", grads[0]), ("dK", grads[1]), ("dV", grads[2])):
        assert torch.isfinite(x).all(), f"{name} has NaN or inf"
    assert not torch.isnan(lse).any() and not torch.isposinf(lse).any()
    return o, lse, grads, do


def _leaves(*tensors):
    return tuple(t.detach().requires_grad_() for t in tensors)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_huge_scores_stay_finite_and_exact(dtype, is_causal):
    """Scores of magnitude ~1e4 (a softmax that is one-hot to many digits): online-softmax rescaling must
    neither overflow nor produce inf - inf, and O and L keep the usual bound. The gradients get one more
    term: the backward recomputes P = exp(s - L) from L stored in float32, as FlashAttention does, and
    at |L| ~ 1e4 one rounding of L (and of the scaled score) moves P by a relative ~|L| 2^-24 each. So a
    gradient may be off by a few of those times its natural size: |dV| for dV, and scale max|dP| max|K|
    (times P's largest column sum, for dK) for dQ and dK, whose true value is ~0 here."""
    q, k, v = (torch.randn(1, 2, N, 16, device=DEVICE, dtype=torch.float32) for _ in range(3))
    scale = 1e4 / (q @ k.transpose(-1, -2)).abs().amax().item()  # scaled scores of either sign reach 1e4
    q, k, v = _leaves(*(x.to(dtype) for x in (q, k, v)))
    o, lse, grads, do = _run(q, k, v, is_causal=is_causal, scale=scale)
    assert lse.abs().max() > 1e3  # the scores really are huge

    q64, k64, v64 = _leaves(*(x.double() for x in (q, k, v)))
    o64, lse64, p64 = attention_ref(q64, k64, v64, is_causal=is_causal, scale=scale, return_probs=True)
    ref_grads = torch.autograd.grad(o64, (q64, k64, v64), do.double())
    low_o, low_lse = attention_ref(q, k, v, is_causal=is_causal, scale=scale, upcast=False)
    low_grads = torch.autograd.grad(low_o, (q, k, v), do)
    checks = [bounded("O", o, o64, low_o, dtype), bounded("L", lse, lse64, low_lse, dtype)]
    rel_p = 4 * lse64.abs().max().item() * 2.0**-24
    dp = (do.double() @ v64.detach().transpose(-1, -2)).abs().max().item()
    natural = [scale * dp * k64.abs().max().item(),
               scale * dp * q64.abs().max().item() * p64.sum(-2).max().item(),
               ref_grads[2].abs().max().item()]
    for name, g, ref, low, size in zip(("dQ", "dK", "dV"), grads, ref_grads, low_grads, natural, strict=True):
        checks.append(bounded(name, g, ref, low, dtype, extra=rel_p * size))
    failed = [str(c) for c in checks if not c.ok]
    assert not failed, "; ".join(failed)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_extreme_input_values(dtype):
    """Inputs near the top of what a float32 dot product of them can hold (fp16: its maximum, 6.5e4; bf16:
    1e18, whose products of 16 terms stay below float32's 3.4e38), with a scale that keeps the scores
    ~1: O is a convex combination of V rows, so it fits the dtype too. The backward rounds
    dS = P * (dO V^T - D) to the input dtype for the tensor cores, as FlashAttention-2 does, so in fp16
    dO is scaled to keep dO V^T inside fp16's range (with dO ~ N(0, 1) it passes 6.5e4 for some draws)."""
    top = torch.finfo(dtype).max if dtype == torch.float16 else 1e18
    q, k, v = (torch.randn(1, 2, N, 16, device=DEVICE) for _ in range(3))
    q, k, v = _leaves(*((x / x.abs().max() * top * 0.9).to(dtype) for x in (q, k, v)))
    scale = 1.0 / (float(top) ** 2 * 16)  # |scores| <= ~1
    o, lse, grads, do = _run(q, k, v, do_scale=1.0 / float(top), scale=scale, is_causal=True)
    ref_o, _ = attention_ref(q, k, v, scale=scale, is_causal=True)
    rel = ((o.double() - ref_o.double()).abs().max() / ref_o.double().abs().max()).item()
    assert rel < 4 * torch.finfo(dtype).eps


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_all_equal_scores_average_the_values(dtype):
    """q = 0: every score is 0, the softmax is uniform, O is the mean of the visible V rows."""
    q = torch.zeros(1, 2, N, 32, device=DEVICE, dtype=dtype, requires_grad=True)
    k, v = _leaves(*(torch.randn(1, 2, N, 32, device=DEVICE, dtype=dtype) for _ in range(2)))
    o, lse, grads, do = _run(q, k, v, is_causal=True)
    counts = torch.arange(1, N + 1, device=DEVICE, dtype=torch.float64)[:, None]
    mean = v.double().cumsum(-2) / counts
    assert (o.double() - mean).abs().max() < 8 * torch.finfo(dtype).eps * v.double().abs().max()
    assert torch.allclose(lse.double(), counts.log().squeeze(-1).expand_as(lse), atol=1e-5)


def test_one_query_one_key():
    q, k, v = _leaves(*(torch.randn(1, 1, 1, 8, device=DEVICE, dtype=torch.bfloat16) for _ in range(3)))
    o, lse, grads, _ = _run(q, k, v)
    assert torch.equal(o, v)  # one key: P = 1 exactly
    assert grads[1].abs().max() < 1e-2  # dK = scale * dS^T q with dS ~ 0 (see testing.backward_rounding_slack)


@pytest.mark.parametrize("kwargs", [dict(is_causal=True), dict(window_size=(0, 0)), dict(window_size=(2, 0))])
def test_rows_without_keys_are_zero_not_nan(kwargs):
    """Nq > Nk causal leaves the first rows without keys; a window can too. O = 0, L = -inf, no NaN in any
    gradient, and those rows' dQ is exactly 0."""
    q, k, v = _leaves(*(torch.randn(1, 2, n, 16, device=DEVICE, dtype=torch.float16) for n in (20, 7, 7)))
    if "window_size" in kwargs:
        q = _leaves(torch.randn(1, 2, 40, 16, device=DEVICE, dtype=torch.float16))[0]
        k, v = _leaves(*(torch.randn(1, 2, 3, 16, device=DEVICE, dtype=torch.float16) for _ in range(2)))
    o, lse, grads, _ = _run(q, k, v, **kwargs)
    empty = torch.isneginf(lse)
    assert empty.any()
    assert (o[empty] == 0).all() and (grads[0][empty] == 0).all()


def test_empty_packed_sequences_only():
    """A packed batch whose sequences are all empty, and one with empty sequences between others."""
    for lengths in ([0, 0], [0, 9, 0, 4, 0]):
        q, k, v, cu_q, cu_k = packed_qkv(lengths, lengths, 2, 1, 16, torch.bfloat16)
        o = flash_attention_varlen(q, k, v, cu_q, cu_k, max(lengths), max(lengths), is_causal=True)
        grads = torch.autograd.grad(o, (q, k, v), torch.randn_like(o), allow_unused=True)
        assert torch.isfinite(o).all()
        assert all(g is None or torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("wanted", [(True, False, False), (False, True, False), (False, False, True),
                                    (False, True, True), (True, True, True)], ids=str)
def test_gradients_for_some_inputs_only(wanted):
    """Only the inputs that require grad get one (the backward then skips the kernel nobody needs), and
    they equal the gradients of a call where all three require grad."""
    base = [torch.randn(1, 4, 33, 16, device=DEVICE, dtype=torch.bfloat16) for _ in range(3)]
    base[1], base[2] = base[1][:, :2], base[2][:, :2]  # GQA
    do = torch.randn_like(base[0])
    full = _leaves(*base)
    expected = torch.autograd.grad(flash_attention(*full, is_causal=True), full, do)
    some = [x.detach().requires_grad_(w) for x, w in zip(base, wanted, strict=True)]
    o = flash_attention(*some, is_causal=True)
    o.backward(do)
    for x, w, e in zip(some, wanted, expected, strict=True):
        assert (x.grad is not None) == w
        if w:
            assert torch.equal(x.grad, e)


def test_double_backward_is_a_clear_error():
    q, k, v = _leaves(*(torch.randn(1, 1, 9, 16, device=DEVICE) for _ in range(3)))
    o = flash_attention(q, k, v)
    (dq,) = torch.autograd.grad(o.sum(), q, create_graph=True)  # first derivatives with a graph: allowed
    with pytest.raises(NotImplementedError, match="no second derivative .*create_graph=True"):
        torch.autograd.grad(dq.sum(), q)
    q, k, v, cu_q, cu_k = packed_qkv([3, 5], [4, 4], 2, 2, 16, torch.float32)
    o = flash_attention_varlen(q, k, v, cu_q, cu_k, 5, 4)
    (dk,) = torch.autograd.grad(o.sum(), k, create_graph=True)
    with pytest.raises(NotImplementedError, match="no second derivative"):
        torch.autograd.grad(dk.sum(), k)
