"""The flash_attn and SDPA interfaces (flash_attn_interface.py, sdpa.py): the same calls through
flashtriton and through the semantics they promise (flash_attn's masks through the float64 reference,
SDPA's through PyTorch's own SDPA in float64), their layouts, return values and errors."""

import inspect
import warnings

import pytest
import torch
import torch.nn.functional as F

import flashtriton
import flashtriton.flash_attn_interface as fai
from conftest import DEVICE
from flashtriton import flash_attention, flash_attention_varlen, launch
from flashtriton.cache import CACHE
from helpers import check_against_reference, failed_checks, make_qkv, packed_qkv, reference_per_sequence

# flash_attn 2.8's signatures (flash_attn/flash_attn_interface.py): names and defaults, in order.
COMMON = [("dropout_p", 0.0), ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
          ("softcap", 0.0), ("alibi_slopes", None), ("deterministic", False), ("return_attn_probs", False)]
VARLEN_LENGTHS = ["cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"]
SIGNATURES = {
    "flash_attn_func": (["q", "k", "v"], COMMON),
    "flash_attn_qkvpacked_func": (["qkv"], COMMON),
    "flash_attn_kvpacked_func": (["q", "kv"], COMMON),
    "flash_attn_varlen_func": (["q", "k", "v", *VARLEN_LENGTHS], [*COMMON, ("block_table", None)]),
    "flash_attn_varlen_qkvpacked_func": (["qkv", "cu_seqlens", "max_seqlen"], COMMON),
    "flash_attn_varlen_kvpacked_func": (["q", "kv", *VARLEN_LENGTHS], COMMON),
}


@pytest.mark.parametrize("name", list(SIGNATURES))
def test_flash_attn_signatures(name):
    required, defaults = SIGNATURES[name]
    params = list(inspect.signature(getattr(fai, name)).parameters.values())
    assert [p.name for p in params] == required + [d for d, _ in defaults]
    assert all(p.default is inspect.Parameter.empty for p in params[:len(required)])
    assert [p.default for p in params[len(required):]] == [value for _, value in defaults]


def _bnhd(q, k, v):
    """flash_attn's (B, N, H, D) leaves holding the values of (B, H, N, D) q, k, v."""
    return [x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v)]


FLASH_CASES = {  # (Nq, Nk, Hq, Hkv, keywords)
    "causal-nq<nk": (17, 63, 2, 2, dict(causal=True)),
    "causal-nq>nk": (63, 17, 2, 1, dict(causal=True)),
    "window": (97, 97, 4, 2, dict(window_size=(13, 4), softmax_scale=0.2)),
    "softcap-alibi": (33, 40, 2, 2, dict(causal=True, softcap=4.0, alibi_slopes="slopes")),
    "single-query": (1, 130, 2, 2, dict(causal=True)),
}


@pytest.mark.parametrize("case", list(FLASH_CASES))
def test_flash_attn_func_against_flash_attn_semantics(case):
    """Bottom-right causal and windows, ALiBi on |i + Nk - Nq - j|: through the float64 reference, O, L
    and gradients bounded like the rest of the suite; and (B, N, H, D) in and out, contiguous."""
    seqlen_q, seqlen_k, heads_q, heads_kv, kwargs = FLASH_CASES[case]
    if kwargs.get("alibi_slopes") == "slopes":
        kwargs = {**kwargs, "alibi_slopes": torch.tensor([0.3, 0.05], device=DEVICE)}
    q, k, v = make_qkv(2, heads_q, heads_kv, seqlen_q, seqlen_k, 32, torch.float16, DEVICE)

    def through_interface(q, k, v):  # (B, H, N, D) in, so that the reference can take them
        out, lse, probs = fai.flash_attn_func(*(x.transpose(1, 2) for x in (q, k, v)), return_attn_probs=True,
                                              **kwargs)
        assert out.shape == (2, seqlen_q, heads_q, 32)  # laid out like q (a transposed view here)
        assert probs.shape == (2, heads_q, seqlen_q, seqlen_k)
        return out.transpose(1, 2), lse

    check_against_reference(through_interface, q, k, v, kwargs.get("causal", False), kwargs.get("softmax_scale"),
                            window_size=kwargs.get("window_size", (-1, -1)), softcap=kwargs.get("softcap", 0.0),
                            alibi_slopes=kwargs.get("alibi_slopes"))


@pytest.mark.parametrize("entry", ["flash_attn_func", "flash_attn_varlen_func", "compiled"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_deterministic_reaches_the_backward(monkeypatch, entry, deterministic):
    """flash_attn's `deterministic` travels with the call to attention_backward (eagerly, packed, and
    through the ops under torch.compile), which picks the backward's form by it."""
    from flashtriton import ops
    seen = []

    def recorded(*args, **kwargs):
        seen.append(kwargs["deterministic"])
        return launch.attention_backward(*args, **kwargs)
    monkeypatch.setattr(ops, "attention_backward", recorded)
    q, k, v = (x.transpose(1, 2) for x in make_qkv(2, 2, 1, 17, 23, 16, torch.float32, DEVICE))
    if entry == "flash_attn_varlen_func":
        cu_q = torch.tensor([0, 17, 34], dtype=torch.int32, device=DEVICE)
        cu_k = torch.tensor([0, 23, 46], dtype=torch.int32, device=DEVICE)
        out = fai.flash_attn_varlen_func(q.reshape(34, 2, 16), k.reshape(46, 1, 16), v.reshape(46, 1, 16), cu_q, cu_k,
                                         17, 23, causal=True, deterministic=deterministic)
    elif entry == "compiled":
        torch._dynamo.reset()
        call = torch.compile(lambda q, k, v: fai.flash_attn_func(q, k, v, causal=True, deterministic=deterministic),
                             backend="aot_eager", fullgraph=True)
        out = call(q, k, v)
    else:
        out = fai.flash_attn_func(q, k, v, causal=True, deterministic=deterministic)
    out.sum().backward()
    assert seen == [deterministic]


def test_flash_attn_func_returns():
    q, k, v = _bnhd(*make_qkv(2, 4, 2, 19, 23, 16, torch.float32, DEVICE))
    out = fai.flash_attn_func(q, k, v, causal=True)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.is_contiguous()
    out2, lse, probs = fai.flash_attn_func(q, k, v, causal=True, return_attn_probs=True, deterministic=True)
    assert torch.equal(out, out2) and lse.shape == (2, 4, 19) and lse.dtype == torch.float32
    assert probs.shape == (2, 4, 19, 23)
    torch.testing.assert_close(probs.sum(-1)[..., 4:], torch.ones(2, 4, 15, device=DEVICE))  # rows 0..3 see no key
    assert torch.equal(out, flash_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                            is_causal=True).transpose(1, 2))


def test_flash_attn_dropout_matches_its_probabilities():
    q, k, v = _bnhd(*make_qkv(1, 2, 2, 21, 21, 16, torch.float32, DEVICE))
    torch.manual_seed(3)
    out, _, probs = fai.flash_attn_func(q, k, v, dropout_p=0.25, causal=True, return_attn_probs=True)
    assert 0 < (probs == 0).float().mean() < 1
    torch.testing.assert_close(out.transpose(1, 2), probs @ v.transpose(1, 2), atol=1e-5, rtol=1e-5)
    torch.manual_seed(3)
    assert torch.equal(out, fai.flash_attn_func(q, k, v, dropout_p=0.25, causal=True))


def test_packed_entry_points_match_flash_attn_func():
    """qkv (B, N, 3, H, D) and kv (B, N, 2, Hkv, D): the same outputs as separate tensors, and the
    gradient of the stacked tensor is the three gradients stacked."""
    qkv = torch.randn(2, 29, 3, 4, 16, device=DEVICE, requires_grad=True)
    do = torch.randn(2, 29, 4, 16, device=DEVICE)
    out = fai.flash_attn_qkvpacked_func(qkv, causal=True, window_size=(7, 0))
    parts = [x.detach().requires_grad_() for x in qkv.unbind(2)]
    expected = fai.flash_attn_func(*parts, causal=True, window_size=(7, 0))
    assert torch.equal(out, expected) and out.is_contiguous()
    (dqkv,) = torch.autograd.grad(out, qkv, do)
    assert torch.equal(dqkv, torch.stack(torch.autograd.grad(expected, parts, do), dim=2))

    q = torch.randn(2, 11, 4, 16, device=DEVICE, requires_grad=True)
    kv = torch.randn(2, 29, 2, 2, 16, device=DEVICE, requires_grad=True)
    out = fai.flash_attn_kvpacked_func(q, kv, causal=True, softcap=2.0)
    assert torch.equal(out, fai.flash_attn_func(q, *kv.unbind(2), causal=True, softcap=2.0))
    dq, dkv = torch.autograd.grad(out, (q, kv), do[:, :11])
    assert dkv.shape == kv.shape and torch.isfinite(dkv).all()


def test_varlen_entry_points():
    q, k, v, cu_q, cu_k = packed_qkv([5, 0, 33, 17], [12, 3, 33, 1], 4, 2, 16, torch.float32)
    out, lse, probs = fai.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 33, 33, causal=True, window_size=(9, -1),
                                                 return_attn_probs=True)
    expected, expected_lse = flash_attention_varlen(q, k, v, cu_q, cu_k, 33, 33, is_causal=True, window_size=(9, -1),
                                                    return_lse=True)
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse) and probs is None
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), do)
    failed = failed_checks(out, lse, grads, (q, k, v), do,
                           lambda q, k, v, upcast: reference_per_sequence(q, k, v, cu_q, cu_k, upcast, is_causal=True,
                                                                          window_size=(9, -1)), packed=True)
    assert not failed, failed

    cu = torch.tensor([0, 7, 20], dtype=torch.int32, device=DEVICE)
    qkv = torch.randn(20, 3, 2, 16, device=DEVICE, requires_grad=True)
    out = fai.flash_attn_varlen_qkvpacked_func(qkv, cu, 13, causal=True)
    assert torch.equal(out, flash_attention_varlen(*qkv.unbind(1), cu, cu, 13, 13, is_causal=True))
    kv = torch.randn(20, 2, 1, 16, device=DEVICE, requires_grad=True)
    out = fai.flash_attn_varlen_kvpacked_func(qkv[:, 0], kv, cu, cu, 13, 13, softmax_scale=0.5)
    assert torch.equal(out, flash_attention_varlen(qkv[:, 0], *kv.unbind(1), cu, cu, 13, 13, scale=0.5))


@pytest.mark.parametrize("call,error,match", [
    (lambda q, cu: fai.flash_attn_varlen_func(q, q, q, cu, cu, 8, 8, block_table=cu), NotImplementedError,
     "block_table"),
    (lambda q, cu: fai.flash_attn_with_kvcache(q, q, q), ValueError, r"4 dims \(batch, seqlen, heads, head_dim\)"),
    (lambda q, cu: fai.flash_attn_func(q, q, q), ValueError, r"4 dims \(batch, seqlen, heads, head_dim\)"),
    (lambda q, cu: fai.flash_attn_func(q[None], q[None], q[None], deterministic=1), TypeError, "deterministic"),
    (lambda q, cu: fai.flash_attn_qkvpacked_func(q[None, :, None].expand(1, 8, 2, 2, 16)), ValueError,
     "with 3 at dim 2"),
    (lambda q, cu: fai.flash_attn_kvpacked_func(q[None], q[None]), ValueError, "5 dims"),
    (lambda q, cu: fai.flash_attn_varlen_qkvpacked_func([q], cu, 8), TypeError, "qkv must be a torch.Tensor"),
    (lambda q, cu: fai.flash_attn_func(q[None], q[None], q[None], window_size=(2,)), TypeError, "window_size"),
])
def test_flash_attn_errors(call, error, match):
    q = torch.randn(8, 2, 16, device=DEVICE)
    cu = torch.tensor([0, 8], dtype=torch.int32, device=DEVICE)
    with pytest.raises(error, match=match):
        call(q, cu)


def _sdpa_reference(q, k, v, **kwargs):
    """PyTorch's SDPA in float64 on the math backend: the semantics, not the speed."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kwargs)


SDPA_CASES = {  # query shape, key shape, keywords
    "causal-square": ((2, 4, 33, 16), (2, 4, 33, 16), dict(is_causal=True)),
    "causal-nq<nk (top-left)": ((2, 4, 17, 16), (2, 4, 63, 16), dict(is_causal=True)),
    "causal-nq>nk (top-left)": ((2, 4, 63, 16), (2, 4, 17, 16), dict(is_causal=True)),
    "gqa-scale": ((1, 6, 40, 32), (1, 2, 50, 32), dict(enable_gqa=True, scale=0.3)),
    "gqa-causal-nq<nk": ((1, 4, 9, 32), (1, 2, 30, 32), dict(enable_gqa=True, is_causal=True)),
    "3d": ((3, 21, 16), (3, 25, 16), {}),
    "5d-causal": ((2, 2, 2, 19, 16), (2, 2, 2, 19, 16), dict(is_causal=True)),
    "single-query": ((2, 2, 1, 16), (2, 2, 97, 16), dict(is_causal=True)),
}


@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_sdpa_against_pytorch(case):
    shape_q, shape_k, kwargs = SDPA_CASES[case]
    q = torch.randn(shape_q, device=DEVICE, requires_grad=True)
    k, v = (torch.randn(shape_k, device=DEVICE, requires_grad=True) for _ in range(2))
    out = flashtriton.scaled_dot_product_attention(q, k, v, **kwargs)
    inputs64 = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = _sdpa_reference(*inputs64, **kwargs)
    assert out.shape == ref.shape and out.dtype == q.dtype
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), do)
    ref_grads = torch.autograd.grad(ref, inputs64, do.double())
    # float32 inputs: the plain float32 attention's error is ~1e-6 here; 1e-4 leaves room for TF32-free sums
    torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=1e-4)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g.double(), r, atol=1e-4, rtol=1e-4)


def test_sdpa_dropout_runs_and_reseeds():
    q, k, v = make_qkv(1, 2, 2, 24, 24, 16, torch.float32, DEVICE)
    torch.manual_seed(8)
    a = flashtriton.scaled_dot_product_attention(q, k, v, dropout_p=0.5, is_causal=True)
    torch.manual_seed(8)
    b = flashtriton.scaled_dot_product_attention(q, k, v, dropout_p=0.5, is_causal=True)
    c = flashtriton.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_sdpa_attn_mask_falls_back_to_pytorch_with_a_warning():
    q, k, v = make_qkv(1, 2, 2, 9, 11, 16, torch.float32, DEVICE, requires_grad=False)
    mask = torch.rand(9, 11, device=DEVICE) > 0.3
    with pytest.warns(UserWarning, match="attn_mask is not supported by the kernels.*PyTorch's"):
        out = flashtriton.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(attn_mask="mask", is_causal=True), ValueError, "attn_mask and is_causal"),
    (dict(heads_kv=1), ValueError, "enable_gqa=True"),
    (dict(value_dim=8), NotImplementedError, "value's head dim 8"),
    (dict(is_causal=1), TypeError, "is_causal must be True or False"),
    (dict(enable_gqa="yes"), TypeError, "enable_gqa"),
])
def test_sdpa_errors(kwargs, error, match):
    kwargs = dict(kwargs)
    heads_kv, value_dim = kwargs.pop("heads_kv", 2), kwargs.pop("value_dim", 16)
    q = torch.randn(1, 2, 5, 16, device=DEVICE)
    k = torch.randn(1, heads_kv, 5, 16, device=DEVICE)
    v = torch.randn(1, heads_kv, 5, value_dim, device=DEVICE)
    if kwargs.get("attn_mask") == "mask":
        kwargs["attn_mask"] = torch.ones(5, 5, dtype=torch.bool, device=DEVICE)
    with pytest.raises(error, match=match):
        flashtriton.scaled_dot_product_attention(q, k, v, **kwargs)


class CausalSelfAttention(torch.nn.Module):
    """nanoGPT's attention block, unchanged: it calls F.scaled_dot_product_attention."""

    def __init__(self, n_embd=32, n_head=4):
        super().__init__()
        self.c_attn, self.c_proj = torch.nn.Linear(n_embd, 3 * n_embd), torch.nn.Linear(n_embd, n_embd)
        self.n_head = n_head

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


def test_sdpa_override_routes_an_unchanged_model():
    torch.manual_seed(0)
    block = CausalSelfAttention().to(DEVICE)
    x = torch.randn(2, 37, 32, device=DEVICE, requires_grad=True)
    plain = block(x)
    plain_grads = torch.autograd.grad(plain.sum(), (x, *block.parameters()))
    CACHE.last.clear()
    with flashtriton.sdpa_override(), warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a supported call must not fall back
        routed = block(x)
        routed_grads = torch.autograd.grad(routed.sum(), (x, *block.parameters()))
    assert launch.last_choice("forward") is not None and launch.last_choice("backward") is not None
    torch.testing.assert_close(routed, plain, atol=1e-5, rtol=1e-5)
    for a, b in zip(routed_grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    CACHE.last.clear()
    block(x)  # outside the context: PyTorch's own SDPA again
    assert launch.last_choice("forward") is None


def test_sdpa_override_falls_back_where_the_kernels_cannot_run():
    q, k, v = (torch.randn(1, 2, 7, 16, device=DEVICE, dtype=torch.float64) for _ in range(3))
    with flashtriton.sdpa_override():
        with pytest.warns(UserWarning, match="dtype torch.float64"):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        mask = torch.ones(7, 7, dtype=torch.bool, device=DEVICE)
        with pytest.warns(UserWarning, match="attn_mask"):
            masked = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert torch.equal(masked, F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask))


def test_sdpa_override_under_torch_compile():
    torch._dynamo.reset()
    block = CausalSelfAttention().to(DEVICE)
    x = torch.randn(1, 19, 32, device=DEVICE)
    with torch.no_grad():
        eager = block(x)
        with flashtriton.sdpa_override():
            routed = block(x)
            compiled = torch.compile(block, fullgraph=True, backend="aot_eager")(x)
    torch._dynamo.reset()
    assert torch.equal(compiled, routed)
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)
