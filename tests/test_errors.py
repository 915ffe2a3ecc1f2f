"""Bad input raises a clear error naming the argument, the value and the fix."""

import pytest
import torch

from conftest import DEVICE
from flashtriton import FlashAttentionPytorch, FlashAttentionTriton, flash_attention


def qkv(shape_q=(1, 2, 8, 16), shape_k=None, dtype=torch.float16, device=DEVICE):
    shape_k = shape_k or shape_q
    return (torch.randn(shape_q, dtype=dtype, device=device), torch.randn(shape_k, dtype=dtype, device=device),
            torch.randn(shape_k, dtype=dtype, device=device))


def test_not_a_tensor():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="k must be a torch.Tensor, got list"):
        flash_attention(q, [1, 2], v)


def test_wrong_rank():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"q must have 4 dims .* got shape \(2, 8, 16\).*transpose"):
        flash_attention(q[0], k, v)
    with pytest.raises(ValueError, match="at least 2 dims"):
        FlashAttentionTriton.apply(q[0, 0, 0], k[0, 0, 0], v[0, 0, 0])


def test_mismatched_shapes():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        flash_attention(q, k, v[:, :, :5])
    with pytest.raises(ValueError, match="head dims differ: q 16, k 8"):
        flash_attention(q, k[..., :8], v[..., :8])
    with pytest.raises(ValueError, match=r"batch dims differ: q \(1,\) vs k \(2,\)"):
        flash_attention(q, k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1))
    q3, k3, v3 = qkv((1, 3, 8, 16), (1, 2, 8, 16))
    with pytest.raises(ValueError, match="q has 3 heads and k/v have 2.*multiple"):
        flash_attention(q3, k3, v3)
    with pytest.raises(ValueError, match=r"leading dims differ: q \(1,\) vs k \(2,\)"):
        FlashAttentionTriton.apply(q[0, :1], k[0], v[0])


def test_grid_limits():
    # expand() makes these huge batches and head counts without memory
    q, k, v = (x.expand(65536, -1, -1, -1) for x in qkv((1, 1, 4, 16)))
    with pytest.raises(ValueError, match="q has 65536 batch .*at most 65535: split the call into chunks"):
        flash_attention(q, k, v)
    q, k, v = (x.expand(1, 70000, -1, -1) for x in qkv((1, 1, 4, 16)))
    with pytest.raises(ValueError, match="q has 70000 heads; .*at most 65535"):
        flash_attention(q, k, v)
    q, k, v = (x.expand(300, 300, -1, -1, -1) for x in qkv((1, 1, 1, 4, 16)))
    with pytest.raises(ValueError, match=r"q has 90000 batch \(the product of the leading dims\)"):
        FlashAttentionTriton.apply(q, k, v)


def test_dtypes():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"k has dtype torch.float32 but q has torch.float16.*k.to\(q.dtype\)"):
        flash_attention(q, k.float(), v)
    with pytest.raises(TypeError, match=r"q has dtype torch.float64; supported are .*q.to\(torch.bfloat16\)"):
        flash_attention(q.double(), k.double(), v.double())
    with pytest.raises(TypeError, match="q has dtype torch.int32"):
        flash_attention(q.int(), k.int(), v.int())


def test_head_dim_limit():
    q, k, v = qkv((1, 1, 4, 300))
    with pytest.raises(NotImplementedError, match="head_dim 300 is not supported; it must be between 1 and 256"):
        flash_attention(q, k, v)


def test_scale_and_flags():
    q, k, v = qkv()
    for bad in (float("nan"), float("inf"), 0.0, -1.0):
        with pytest.raises(ValueError, match="scale must be finite and positive"):
            flash_attention(q, k, v, scale=bad)
    with pytest.raises(TypeError, match="scale must be a float or None, got 'x'"):
        flash_attention(q, k, v, scale="x")
    with pytest.raises(TypeError, match="is_causal must be True or False, got 1"):
        flash_attention(q, k, v, is_causal=1)
    with pytest.raises(TypeError, match="return_lse must be True or False"):
        flash_attention(q, k, v, return_lse="yes")


def test_devices():
    q, k, v = qkv(device="cpu")
    if DEVICE == "cuda":
        with pytest.raises(ValueError, match="k is on cpu but q is on cuda:0"):
            flash_attention(q.cuda(), k, v.cuda())


def test_pytorch_reference_function_checks_too():
    """FlashAttentionPytorch (the readable PyTorch version) takes the same checks, minus the kernels' own
    limits: it runs on any device and head dim."""
    q, k, v = qkv((2, 8, 16), dtype=torch.float32, device="cpu")
    with pytest.raises(TypeError, match="k has dtype torch.float16 but q has torch.float32"):
        FlashAttentionPytorch.apply(q, k.half(), v)
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        FlashAttentionPytorch.apply(q, k, v[:, :3])
    with pytest.raises(ValueError, match="scale must be finite and positive"):
        FlashAttentionPytorch.apply(q, k, v, False, -1.0)
    with pytest.raises(ValueError, match="tile_q must be a positive int"):
        FlashAttentionPytorch.apply(q, k, v, False, None, 0)
    q4, k4, v4 = qkv((1, 4, 8, 16), (1, 2, 8, 16), dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="no GQA"):
        FlashAttentionPytorch.apply(q4, k4, v4)
    big = qkv((1, 3, 300), dtype=torch.float32, device="cpu")  # head dim past the kernels' 256: fine here
    assert FlashAttentionPytorch.apply(*big).shape == (1, 3, 300)
