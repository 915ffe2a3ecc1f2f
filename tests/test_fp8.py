"""flash_attention_fp8: float8 e4m3 inputs with descale factors, forward only. Off sm_90 (and on CPU,
through the interpreter) the inputs are dequantized and flash_attention runs; on an sm_90 GPU the Gluon
kernel runs its products in FP8. Both against the float64 attention of the dequantized inputs."""

import pytest
import torch

import flashtriton
from conftest import DEVICE, ON_GPU
from flashtriton.launch import gluon_forward
from flashtriton.reference import attention_ref
from flashtriton.testing import Check, bounded

ON_HOPPER = ON_GPU and torch.cuda.get_device_capability() == (9, 0)
E4M3 = torch.float8_e4m3fn


def _quantized(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, per_head, seed=0):
    """Fresh q, k, v quantized to e4m3 with their descales (one per tensor, or per (batch, KV head)), and
    the float64 tensors they stand for."""
    torch.manual_seed(seed)
    shapes = [(batch, heads_q, seqlen_q, head_dim), (batch, heads_kv, seqlen_k, head_dim),
              (batch, heads_kv, seqlen_k, head_dim)]
    quantized, descales, exact = [], [], []
    for i, shape in enumerate(shapes):
        x = torch.randn(shape, device=DEVICE) * (1 + i)  # three different ranges
        if per_head:
            by_kv_head = x.unflatten(1, (heads_kv, -1)) if i == 0 else x[:, :, None]
            scale = by_kv_head.abs().amax(dim=(2, 3, 4)) / 448  # e4m3's largest finite value
            expanded = scale.repeat_interleave(heads_q // heads_kv, 1) if i == 0 else scale
        else:
            scale = x.abs().amax().reshape(1) / 448
            expanded = scale.expand(batch, x.shape[1])
        q8 = (x / expanded[:, :, None, None]).to(E4M3)
        quantized.append(q8)
        descales.append(scale)
        exact.append(q8.double() * expanded[:, :, None, None].double())
    return quantized, descales, exact


def _plain_fp8_error(exact, is_causal, scale):
    """What plain attention makes in FP8 against the float64 one: scores from the quantized inputs in
    float32, the probabilities rounded to e4m3 for P V, the output rounded to bf16."""
    q, k, v = (x.float() for x in exact)
    group = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(group, 1) for x in (k, v))
    s = q @ k.transpose(-1, -2) * scale
    if is_causal:
        rows, cols = s.shape[-2:]
        s = s.masked_fill(torch.ones(rows, cols, dtype=torch.bool, device=s.device).tril(cols - rows).logical_not(),
                          float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return (p.to(E4M3).float() @ v).to(torch.bfloat16)


def _checks(o, lse, exact, is_causal, scale, low_o):
    """O against the float64 attention of the dequantized inputs (bounded by twice `low_o`'s error), L
    against float32's rounding where a row sees a key, and -inf exactly where none."""
    o64, lse64 = attention_ref(*exact, is_causal=is_causal, scale=scale)
    finite = torch.isfinite(lse64)
    return [bounded("O", o, o64, low_o, torch.bfloat16),
            bounded("L", lse[finite], lse64[finite], lse64[finite].float(), torch.float32, extra=1e-3),
            Check("L=-inf rows", float((torch.isneginf(lse) != ~finite).sum().item()), 0.0, False)]


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 2, 1, 1, 16), (2, 4, 2, 17, 63, 16), (1, 4, 1, 97, 30, 32)])
def test_matches_float64_reference(is_causal, per_head, shape):
    """Off sm_90 (dequantized, then flash_attention in float32): odd sizes, Nq != Nk both ways (causal
    rows that see no key: O = 0, L = -inf), GQA and MQA, per-tensor and per-head descales; O within twice
    float32 attention's error plus one bf16 rounding."""
    (q8, k8, v8), (qd, kd, vd), exact = _quantized(*shape, per_head)
    o, lse = flashtriton.flash_attention_fp8(q8, k8, v8, is_causal=is_causal, q_descale=qd, k_descale=kd,
                                             v_descale=vd, return_lse=True)
    assert o.dtype == torch.bfloat16 and o.shape == q8.shape and lse.shape == q8.shape[:3]
    scale = shape[-1] ** -0.5
    low_o = attention_ref(*(x.float() for x in exact), is_causal=is_causal, scale=scale)[0]
    checks = _checks(o, lse, exact, is_causal, scale, low_o)
    assert all(c.ok for c in checks), checks


def test_descales_scale_what_is_computed():
    """A descale of 2 on v doubles O; on q and k together, the scores' scale."""
    (q8, k8, v8), _, _ = _quantized(1, 2, 2, 9, 9, 16, per_head=False)
    two = torch.full((1,), 2.0, device=DEVICE)
    base = flashtriton.flash_attention_fp8(q8, k8, v8, out_dtype=torch.float16)
    assert base.dtype == torch.float16
    torch.testing.assert_close(flashtriton.flash_attention_fp8(q8, k8, v8, v_descale=two, out_dtype=torch.float16),
                               2 * base, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(flashtriton.flash_attention_fp8(q8, k8, v8, q_descale=two, k_descale=two),
                               flashtriton.flash_attention_fp8(q8, k8, v8, scale=4 * 16 ** -0.5),
                               rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(q=torch.randn(1, 2, 5, 16)), TypeError, "float8_e4m3fn"),
    (dict(q_descale=torch.ones(1, dtype=torch.float64)), TypeError, "q_descale must be a float32"),
    (dict(k_descale=torch.ones(2, 3)), ValueError, r"k_descale .* shape \(1, 2\)"),
    (dict(out_dtype=torch.float32), ValueError, "out_dtype"),
    (dict(is_causal=1), TypeError, "is_causal"),
    (dict(q=torch.randn(2, 5, 16).to(E4M3), k=torch.randn(2, 5, 16).to(E4M3), v=torch.randn(2, 5, 16).to(E4M3)),
     ValueError, "batch, heads, seqlen, head_dim"),
])
def test_errors(kwargs, error, match):
    args = dict(q=torch.randn(1, 2, 5, 16).to(E4M3), k=torch.randn(1, 2, 7, 16).to(E4M3),
                v=torch.randn(1, 2, 7, 16).to(E4M3))
    args.update(kwargs)
    args = {key: value.to(DEVICE) if isinstance(value, torch.Tensor) else value for key, value in args.items()}
    with pytest.raises(error, match=match):
        flashtriton.flash_attention_fp8(args.pop("q"), args.pop("k"), args.pop("v"), **args)


@pytest.mark.skipif(not ON_HOPPER, reason="the FP8 Gluon kernel runs on an sm_90 GPU only")
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 2, 1, 1), (2, 4, 2, 17, 63), (2, 4, 2, 130, 97), (1, 8, 2, 1000, 1100)])
def test_gluon_fp8_matches_float64_reference(monkeypatch, head_dim, is_causal, per_head, shape):
    """On sm_90 the Gluon kernel's FP8 form runs (checked); O within twice plain FP8 attention's error (its
    probabilities rounded to e4m3 for P V, as the kernel's are), L and the rows without keys as above."""
    from flashtriton import api
    calls = []

    def counted(*args):
        calls.append(args[0].dtype)
        return gluon_forward.fp8_forward_gluon(*args)
    monkeypatch.setattr(api, "fp8_forward_gluon", counted)
    monkeypatch.setenv(gluon_forward.FORWARD_PATH_VARIABLE, "gluon")  # (auto waits for this test: FP8_AUTO)
    (q8, k8, v8), (qd, kd, vd), exact = _quantized(*shape, head_dim, per_head)
    o, lse = flashtriton.flash_attention_fp8(q8, k8, v8, is_causal=is_causal, q_descale=qd, k_descale=kd,
                                             v_descale=vd, return_lse=True)
    scale = head_dim ** -0.5
    checks = _checks(o, lse, exact, is_causal, scale, _plain_fp8_error(exact, is_causal, scale))
    assert all(c.ok for c in checks), checks
    assert calls == [E4M3]


@pytest.mark.skipif(not ON_HOPPER, reason="the FP8 Gluon kernel runs on an sm_90 GPU only")
def test_auto_keeps_the_fallback_until_fp8_is_validated(monkeypatch):
    """FLASHTRITON_FORWARD unset: the Gluon FP8 form only with FP8_AUTO (off until its GPU tests have run)."""
    monkeypatch.delenv(gluon_forward.FORWARD_PATH_VARIABLE, raising=False)
    (q8, k8, v8), _, _ = _quantized(1, 2, 2, 256, 256, 128, per_head=False)
    assert gluon_forward.fp8_gluon_selected(q8, k8, v8) == gluon_forward.FP8_AUTO
    monkeypatch.setenv(gluon_forward.FORWARD_PATH_VARIABLE, "gluon")
    assert gluon_forward.fp8_gluon_selected(q8, k8, v8)
