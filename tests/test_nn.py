"""flashtriton.nn.Attention: projections and attention against the same layer written with the float64
reference, every option, packed batches, cross-attention, training-only dropout, torch.compile, errors."""

import pytest
import torch

from conftest import DEVICE
from flashtriton import attention_ref
from flashtriton.nn import Attention


def _reference_layer(layer: Attention, x, context=None):
    """The layer's forward in float64 through attention_ref: what Attention.forward must compute."""
    src = x if context is None else context
    w = {name: p.double() for name, p in layer.named_parameters()}
    q = (x.double() @ w["q_proj.weight"].T).unflatten(-1, (layer.num_heads, layer.head_dim)).transpose(1, 2)
    kv = (src.double() @ w["kv_proj.weight"].T).unflatten(-1, (2, layer.num_kv_heads, layer.head_dim))
    k, v = (t.transpose(1, 2) for t in kv.unbind(-3))
    o, _ = attention_ref(q, k, v, is_causal=layer.is_causal, scale=layer.scale, window_size=layer.window_size,
                         softcap=layer.softcap)
    return o.transpose(1, 2).flatten(-2) @ w["out_proj.weight"].T


CASES = {
    "mha": dict(num_heads=4),
    "gqa-causal": dict(num_heads=4, num_kv_heads=2, is_causal=True),
    "mqa-window-softcap": dict(num_heads=4, num_kv_heads=1, is_causal=True, window_size=(6, 0), softcap=5.0),
    "head-dim-scale": dict(num_heads=2, head_dim=24, scale=0.1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_attention_layer_against_reference(case):
    torch.manual_seed(0)
    layer = Attention(32, **CASES[case]).to(DEVICE)
    x = torch.randn(2, 23, 32, device=DEVICE, requires_grad=True)
    y = layer(x)
    assert y.shape == x.shape and y.dtype == x.dtype
    x64 = x.detach().double().requires_grad_()
    ref = _reference_layer(layer, x64)
    torch.testing.assert_close(y.double(), ref, atol=1e-5, rtol=1e-5)
    dy = torch.randn_like(y)
    params = list(layer.parameters())
    grads = torch.autograd.grad(y, (x, *params), dy)
    ref_grads = torch.autograd.grad(ref, (x64, *params), dy.double())
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g.double(), r.double(), atol=1e-4, rtol=1e-4)


def test_cross_attention():
    torch.manual_seed(1)
    layer = Attention(32, 4, num_kv_heads=2, bias=True).to(DEVICE)
    for p in layer.parameters():  # the reference layer has no biases
        if p.dim() == 1:
            torch.nn.init.zeros_(p)
    x, context = torch.randn(2, 9, 32, device=DEVICE), torch.randn(2, 30, 32, device=DEVICE)
    torch.testing.assert_close(layer(x, context).double(), _reference_layer(layer, x, context), atol=1e-5, rtol=1e-5)


def test_packed_batch_matches_each_sequence():
    torch.manual_seed(2)
    layer = Attention(32, 4, num_kv_heads=2, is_causal=True).to(DEVICE)
    lengths = [5, 17, 1]
    seqs = [torch.randn(n, 32, device=DEVICE) for n in lengths]
    cu = torch.tensor([0, 5, 22, 23], dtype=torch.int32, device=DEVICE)
    packed = layer(torch.cat(seqs), cu_seqlens=cu, max_seqlen=17)
    assert packed.shape == (23, 32)
    expected = torch.cat([layer(s[None])[0] for s in seqs])
    torch.testing.assert_close(packed, expected, atol=1e-6, rtol=1e-6)


def test_dropout_only_in_training():
    torch.manual_seed(3)
    layer = Attention(32, 4, dropout=0.5, is_causal=True).to(DEVICE)
    x = torch.randn(1, 16, 32, device=DEVICE)
    layer.eval()
    assert torch.equal(layer(x), layer(x))
    torch.testing.assert_close(layer(x).double(), _reference_layer(layer, x), atol=1e-5, rtol=1e-5)
    layer.train()
    torch.manual_seed(4)
    a = layer(x)
    torch.manual_seed(4)
    assert torch.equal(a, layer(x)) and not torch.allclose(a, layer.eval()(x))


def test_layer_compiles_without_graph_breaks():
    torch._dynamo.reset()
    layer = Attention(32, 4, num_kv_heads=2, is_causal=True, softcap=8.0).to(DEVICE)
    x = torch.randn(2, 13, 32, device=DEVICE, requires_grad=True)
    explained = torch._dynamo.explain(layer)(x)
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x), layer(x))
    torch.autograd.grad(compiled(x).sum(), x)
    torch._dynamo.reset()


@pytest.mark.parametrize("make,call,error,match", [
    (dict(embed_dim=30, num_heads=4), None, ValueError, "not a multiple of num_heads"),
    (dict(embed_dim=32, num_heads=4, num_kv_heads=3), None, ValueError, "multiple of num_kv_heads"),
    (dict(embed_dim=32, num_heads=0), None, ValueError, "num_heads must be a positive int"),
    (dict(embed_dim=32, num_heads=4, dropout=1.5), None, ValueError, "dropout_p must be in"),
    (dict(embed_dim=32, num_heads=4, window_size=(3,)), None, TypeError, "window_size"),
    (dict(embed_dim=32, num_heads=4), lambda m, x: m(x[0]), ValueError, r"\(B, N, E\) with E = 32"),
    (dict(embed_dim=32, num_heads=4), lambda m, x: m(x[..., :16]), ValueError, "E = 32"),
    (dict(embed_dim=32, num_heads=4), lambda m, x: m(x[0], cu_seqlens=torch.tensor([0, 7], dtype=torch.int32)),
     ValueError, "needs max_seqlen"),
    (dict(embed_dim=32, num_heads=4), lambda m, x: m(x[0], x[0], cu_seqlens=torch.tensor([0, 7]), max_seqlen=7),
     NotImplementedError, "cross-attention"),
])
def test_errors(make, call, error, match):
    x = torch.randn(1, 7, 32, device=DEVICE)
    with pytest.raises(error, match=match):
        layer = Attention(**make).to(DEVICE)
        call(layer, x)
