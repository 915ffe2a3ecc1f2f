"""Dropout inside the kernels: Philox keyed by a draw from torch's generator, the same mask regenerated
in the backward. Checked for reproducibility, the kept fraction, and O, L and all gradients against the
float64 reference that applies the kernels' own mask."""

import pytest
import torch

from conftest import DEVICE, ON_GPU
from flashtriton import attention_ref, flash_attention, launch
from flashtriton.testing import bounded
from helpers import make_qkv

SIZES = [(70, 53), (53, 70), (1, 17)] if not ON_GPU else [(700, 530), (530, 700), (1, 170)]
BATCH = 2 if ON_GPU else 1  # the interpreter runs every program in Python: one sequence is enough on CPU


def test_same_seed_same_output_other_seed_other_mask():
    q, k, v = make_qkv(BATCH, 4, 2, 64, 80, 32, torch.bfloat16, DEVICE)
    do = torch.randn(q.shape, device=DEVICE, dtype=q.dtype)
    runs = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        o = flash_attention(q, k, v, dropout_p=0.25)
        runs.append((o, *torch.autograd.grad(o, (q, k, v), do)))
    assert all(torch.equal(a, b) for a, b in zip(runs[0], runs[1], strict=True))  # bitwise, gradients too
    assert not torch.equal(runs[0][0], runs[2][0])


@pytest.mark.parametrize("dropout_p", [0.1, 0.5, 0.9])
def test_kept_fraction_and_probabilities(dropout_p):
    torch.manual_seed(0)
    q, k, v = make_qkv(2, 2, 2, 96, 96, 16, torch.float32, DEVICE, requires_grad=False)
    o, lse, probs = flash_attention(q, k, v, dropout_p=dropout_p, return_lse=True, return_attn_probs=True)
    kept = (probs > 0).float().mean().item()
    assert abs(kept - (1 - dropout_p)) < 0.02  # 36,864 draws: 5 standard deviations is below 0.015
    # each kept probability is the softmax's, scaled by 1 / (1 - p); the output is probs @ v
    full = torch.softmax(q @ k.transpose(-1, -2) * 16 ** -0.5, dim=-1)
    assert torch.allclose(probs[probs > 0], (full / (1 - dropout_p))[probs > 0], rtol=1e-4, atol=1e-6)
    assert torch.allclose(o, probs @ v, atol=1e-4)
    _, lse_plain = flash_attention(q, k, v, return_lse=True)
    assert torch.equal(lse, lse_plain)  # L is the full softmax's, as the backward needs


@pytest.mark.parametrize("is_causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (6, 9))],
                         ids=["full", "causal", "window"])
def test_dropout_matches_reference_with_the_kernels_mask(is_causal, window):
    for seqlen_q, seqlen_k in SIZES:
        q, k, v = make_qkv(BATCH, 4, 2, seqlen_q, seqlen_k, 32, torch.bfloat16, DEVICE)
        torch.manual_seed(3)
        o, lse = flash_attention(q, k, v, is_causal=is_causal, window_size=window, dropout_p=0.3, return_lse=True)
        torch.manual_seed(3)  # the same draw: the seed the call used
        mask = launch.dropout_mask(launch.new_dropout_seed(q.device), BATCH, 4, seqlen_q, seqlen_k, 0.3)
        do = torch.randn_like(o)
        grads = torch.autograd.grad(o, (q, k, v), do)
        q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
        kw = dict(is_causal=is_causal, window_size=window, dropout_p=0.3, dropout_mask=mask)
        o64, lse64 = attention_ref(q64, k64, v64, **kw)
        ref_grads = torch.autograd.grad(o64, (q64, k64, v64), do.double())
        low_o, low_lse = attention_ref(q, k, v, upcast=False, **kw)
        low_grads = torch.autograd.grad(low_o, (q, k, v), do)
        finite = torch.isfinite(lse64)
        checks = [bounded("O", o, o64, low_o, q.dtype), bounded("L", lse[finite], lse64[finite], low_lse[finite],
                                                                 q.dtype)]
        checks += [bounded(n, g, r, lo, q.dtype)
                   for n, g, r, lo in zip(("dQ", "dK", "dV"), grads, ref_grads, low_grads, strict=True)]
        failed = [str(c) for c in checks if not c.ok]
        assert not failed, f"{seqlen_q}x{seqlen_k}: " + "; ".join(failed)


@pytest.mark.parametrize("bad,error", [(1.0, ValueError), (-0.1, ValueError), ("0.1", TypeError), (True, TypeError)])
def test_bad_dropout_is_a_clear_error(bad, error):
    q, k, v = make_qkv(1, 1, 1, 8, 8, 16, torch.float32, DEVICE, requires_grad=False)
    with pytest.raises(error, match="dropout_p"):
        flash_attention(q, k, v, dropout_p=bad)
