"""Inputs and error bounds shared by the tests (and imported by the benchmark's correctness check)."""

from __future__ import annotations

import torch

from flashtriton import attention_ref

EPS = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7, torch.float32: 2.0**-23}


def make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype, device, requires_grad=True):
    """Fresh random (B, H, N, D) inputs, never zeros."""
    def rand(h, n):
        return torch.randn(batch, h, n, head_dim, dtype=dtype, device=device).requires_grad_(requires_grad)
    return rand(heads_q, seqlen_q), rand(heads_kv, seqlen_k), rand(heads_kv, seqlen_k)


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def assert_bounded(name, out, ref, low, dtype, factor=2.0):
    """The kernel's error against the float64 reference is at most `factor` times the error of a plain
    PyTorch attention in the same low precision, plus one rounding of the output (an ulp at its scale)."""
    assert out.shape == ref.shape, f"{name}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    assert not torch.isnan(out).any(), f"{name}: NaN in output"
    slack = EPS[dtype] * (ref.double().abs().max().item() if ref.numel() else 0.0)
    err, base = max_err(out, ref), max_err(low, ref)
    assert err <= factor * base + slack + 1e-5, f"{name}: error {err:.3e} > {factor} x {base:.3e} + {slack:.3e}"


def check_against_reference(fn, q, k, v, is_causal, scale=None):
    """Run `fn(q, k, v) -> (o, lse)` forward and backward; bound O, L, dQ, dK, dV against float64."""
    o, lse = fn(q, k, v)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)

    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    o64, lse64 = attention_ref(q64, k64, v64, is_causal=is_causal, scale=scale)
    ref_grads = torch.autograd.grad(o64, (q64, k64, v64), do.double())
    low_o, low_lse = attention_ref(q, k, v, is_causal=is_causal, scale=scale, upcast=False)
    low_grads = torch.autograd.grad(low_o, (q, k, v), do)

    assert_bounded("O", o, o64, low_o, q.dtype)
    finite = torch.isfinite(lse64)
    assert torch.equal(torch.isneginf(lse), ~finite), "L must be -inf exactly for rows that see no key"
    assert_bounded("L", lse[finite], lse64[finite], low_lse[finite], q.dtype)
    for name, g, ref, low in zip(("dQ", "dK", "dV"), grads, ref_grads, low_grads, strict=True):
        assert_bounded(name, g, ref, low, q.dtype)
