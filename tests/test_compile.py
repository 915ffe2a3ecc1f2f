"""torch.compile through the custom ops (ops.py): no graph break for any flag, the eager results bit for
bit, one compile across sequence lengths, `torch.library.opcheck` on every op, and CUDA graphs
(mode="reduce-overhead") on a GPU. On the CPU the graphs run through AOTAutograd (backend "aot_eager",
which exercises the fake implementations and the registered autograd) and one case through Inductor."""

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from conftest import DEVICE, ON_GPU
from flashtriton import FlashAttentionTriton, flash_attention, flash_attention_varlen
from helpers import make_qkv, packed_qkv

BACKEND = "inductor" if ON_GPU else "aot_eager"
DTYPE = torch.bfloat16 if ON_GPU else torch.float32


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _slopes(heads):
    return torch.linspace(0.1, 0.7, heads, device=DEVICE)


CASES = {  # name: (heads_q, heads_kv, keywords)
    "plain": (2, 2, {}),
    "causal": (2, 2, dict(is_causal=True)),
    "window": (2, 2, dict(window_size=(5, 2))),
    "softcap-causal": (2, 2, dict(softcap=3.0, is_causal=True)),
    "alibi": (2, 2, dict(alibi_slopes="slopes")),
    "gqa-lse": (4, 2, dict(is_causal=True, return_lse=True)),
    "everything": (4, 1, dict(is_causal=True, window_size=(9, -1), softcap=5.0, alibi_slopes="slopes",
                              return_lse=True, scale=0.3)),
}


def _keywords(kwargs, heads_q):
    return {key: _slopes(heads_q) if value == "slopes" else value for key, value in kwargs.items()}


def _run(fn, inputs, do):
    """fn's outputs and the gradients of its first output along do."""
    out = fn(*inputs)
    first = out[0] if isinstance(out, tuple) else out
    wanted = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    return out, torch.autograd.grad(first, wanted, do)


def _assert_equal(a, b):
    """Equal bit for bit: tensors, or (nested) tuples of them."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), (a - b).abs().max()
        return
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        _assert_equal(x, y)


@pytest.mark.parametrize("case", list(CASES))
def test_dense_compiles_without_graph_breaks_and_matches_eager(case):
    heads_q, heads_kv, kwargs = CASES[case]
    kwargs = _keywords(kwargs, heads_q)
    q, k, v = make_qkv(1, heads_q, heads_kv, 17, 23, 16, DTYPE, DEVICE)

    def attend(q, k, v):
        return flash_attention(q, k, v, **kwargs)

    explained = torch._dynamo.explain(attend)(q, k, v)
    assert explained.graph_break_count == 0, explained.break_reasons
    do = torch.randn(q.shape, device=DEVICE, dtype=DTYPE)
    eager = _run(attend, (q, k, v), do)
    compiled = _run(torch.compile(attend, fullgraph=True, backend=BACKEND), (q, k, v), do)
    _assert_equal(eager, compiled)


def test_varlen_compiles_without_graph_breaks_and_matches_eager():
    q, k, v, cu_q, cu_k = packed_qkv([5, 0, 13], [7, 4, 9], 4, 2, 16, DTYPE)
    slopes = _slopes(4)

    def attend(q, k, v, cu_q, cu_k):
        return flash_attention_varlen(q, k, v, cu_q, cu_k, 13, 9, is_causal=True, window_size=(6, -1), softcap=4.0,
                                      alibi_slopes=slopes, return_lse=True)

    explained = torch._dynamo.explain(attend)(q, k, v, cu_q, cu_k)
    assert explained.graph_break_count == 0, explained.break_reasons
    do = torch.randn(q.shape, device=DEVICE, dtype=DTYPE)
    eager = _run(attend, (q, k, v, cu_q, cu_k), do)
    compiled = _run(torch.compile(attend, fullgraph=True, backend=BACKEND), (q, k, v, cu_q, cu_k), do)
    _assert_equal(eager, compiled)


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "varlen"])
def test_dropout_compiles_and_uses_the_probabilities_it_returns(packed):
    """Dropout's key is drawn inside the graph, so a compiled call draws its own mask (Inductor has its
    own generator): check that O is exactly the returned probabilities times V, that a reseeded call
    repeats itself, and that the backward runs."""
    q, k, v = make_qkv(1, 2, 2, 19, 21, 16, torch.float32, DEVICE)

    def attend(q, k, v):
        return flash_attention(q, k, v, is_causal=True, dropout_p=0.3, return_attn_probs=True)

    if packed:
        q, k, v, cu_q, cu_k = packed_qkv([9, 4], [6, 8], 2, 2, 16, torch.float32)

        def attend(q, k, v):  # noqa: F811
            return flash_attention_varlen(q, k, v, cu_q, cu_k, 9, 8, is_causal=True, dropout_p=0.3)

    compiled = torch.compile(attend, fullgraph=True, backend=BACKEND)
    torch.manual_seed(5)
    first = compiled(q, k, v)
    torch.manual_seed(5)
    again = compiled(q, k, v)
    _assert_equal(first, again)
    o = first if packed else first[0]
    if not packed:
        probs = first[1]
        assert 0 < (probs == 0).float().mean() < 1
        torch.testing.assert_close(o.double(), probs.double() @ v.double(), atol=1e-5, rtol=1e-5)
    grads = torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
    assert all(torch.isfinite(g).all() for g in grads)


def test_article_interface_compiles():
    q, k, v = (torch.randn(2, 17, 16, device=DEVICE, dtype=DTYPE, requires_grad=True) for _ in range(3))

    def attend(q, k, v):
        return FlashAttentionTriton.apply(q, k, v, True)

    do = torch.randn(q.shape, device=DEVICE, dtype=DTYPE)
    eager = _run(attend, (q, k, v), do)
    compiled = _run(torch.compile(attend, fullgraph=True, backend=BACKEND), (q, k, v), do)
    _assert_equal(eager, compiled)


def test_inductor_compiles_forward_and_backward():
    """The whole Inductor pipeline around the ops (on the CPU it generates C++ for the code around them)."""
    q, k, v = make_qkv(1, 2, 1, 17, 23, 16, torch.float32, DEVICE)

    def block(q, k, v):
        return flash_attention(torch.tanh(q), k * 2, v, is_causal=True, softcap=3.0).square().sum(-1)

    eager = _run(block, (q, k, v), torch.ones(1, 2, 17, device=DEVICE))
    compiled = _run(torch.compile(block, fullgraph=True, backend="inductor"), (q, k, v),
                    torch.ones(1, 2, 17, device=DEVICE))
    # Inductor fuses the code around the op in its own order: close, not bitwise.
    for a, b in zip((eager[0], *eager[1]), (compiled[0], *compiled[1]), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_dynamic_lengths_compile_once():
    counter = CompileCounterWithBackend(BACKEND)

    def attend(q, k, v):
        return flash_attention(q, k, v, is_causal=True)

    compiled = torch.compile(attend, dynamic=True, fullgraph=True, backend=counter)
    frames = []
    for seqlen_q, seqlen_k in ((17, 23), (33, 40), (64, 64), (97, 50)):
        q, k, v = make_qkv(1, 2, 2, seqlen_q, seqlen_k, 16, DTYPE, DEVICE)
        do = torch.randn(q.shape, device=DEVICE, dtype=DTYPE)
        _assert_equal(_run(compiled, (q, k, v), do), _run(attend, (q, k, v), do))
        frames.append(counter.frame_count)
    assert frames[0] >= 1 and frames[-1] == frames[0], frames


def test_dynamic_packed_batches_compile_once():
    counter = CompileCounterWithBackend(BACKEND)

    def attend(q, k, v, cu_q, cu_k, max_q, max_k):
        return flash_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=True)

    compiled = torch.compile(attend, dynamic=True, fullgraph=True, backend=counter)
    frames = []
    for lengths in ([3, 5], [7, 2, 4], [9, 9], [1, 30, 2, 6]):
        q, k, v, cu_q, cu_k = packed_qkv(lengths, lengths, 2, 2, 16, DTYPE)
        inputs = (q, k, v, cu_q, cu_k, max(lengths), max(lengths))
        do = torch.randn(q.shape, device=DEVICE, dtype=DTYPE)
        _assert_equal(_run(compiled, inputs, do), _run(attend, inputs, do))
        frames.append(counter.frame_count)
    assert frames[0] >= 1 and frames[-1] == frames[0], frames


def test_bad_input_raises_the_same_error_compiled():
    q, k, v = make_qkv(1, 2, 2, 8, 8, 16, DTYPE, DEVICE)
    for fn in (flash_attention, torch.compile(flash_attention, backend=BACKEND)):
        with pytest.raises(ValueError, match="window_size"):
            fn(q, k, v, window_size=(-3, 0))
        with pytest.raises(ValueError, match="multiple of the key/value heads"):
            fn(q, k[:, :0], v[:, :0])


def _op_arguments(packed: bool, variants: bool, requires_grad: bool):
    """Arguments of flashtriton::forward for opcheck."""
    heads_q, heads_kv = (4, 2)
    if packed:
        q, k, v, cu_q, cu_k = packed_qkv([5, 11], [8, 3], heads_q, heads_kv, 16, DTYPE)
        lengths = (cu_q, cu_k, 11, 8)
    else:
        q, k, v = make_qkv(2, heads_q, heads_kv, 13, 9, 16, DTYPE, DEVICE)
        lengths = (None, None, 0, 0)
    q, k, v = (x.detach().requires_grad_(requires_grad) for x in (q, k, v))
    if variants:
        seed = torch.tensor([1234], device=DEVICE)
        options = (True, 0.3, 6, 1, 2.5, _slopes(heads_q), 0.2, seed, True)
    else:
        options = (False, 0.25, -1, -1, 0.0, None, 0.0, None, False)
    return q, k, v, *lengths, *options


@pytest.mark.parametrize("variants", [False, True], ids=["plain", "variants"])
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "varlen"])
def test_opcheck_forward_and_backward(packed, variants):
    args = _op_arguments(packed, variants, requires_grad=True)
    torch.library.opcheck(torch.ops.flashtriton.forward.default, args)
    q, k, v, *rest = _op_arguments(packed, variants, requires_grad=False)
    o, lse = torch.ops.flashtriton.forward(q, k, v, *rest)
    do = torch.randn_like(o)
    for need_dq, need_dkdv in ((True, True), (False, True), (True, False)):
        torch.library.opcheck(torch.ops.flashtriton.backward.default,
                              (do, q, k, v, o, lse, *rest, need_dq, need_dkdv))


def test_opcheck_dropout_mask():
    torch.library.opcheck(torch.ops.flashtriton.dropout_mask.default,
                          (torch.tensor([77], device=DEVICE), 2, 3, 17, 9, 0.25))


def test_fake_outputs_have_the_real_strides():
    """The fakes allocate through the launchers' own helpers; check against real calls on transposed
    (flash_attn layout) and sliced inputs, whose strides empty_like keeps or drops."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    base = torch.randn(2, 21, 3, 4, 16, device=DEVICE, dtype=DTYPE)  # (B, N, qkv, H, D)
    q, k, v = (base[:, :, i].transpose(1, 2) for i in range(3))
    packed = base[0, :, 0], base[0, :, 1], base[0, :, 2]  # (total, H, D) slices of a qkv-packed tensor
    cu = torch.tensor([0, 9, 21], dtype=torch.int32, device=DEVICE)
    calls = [((q, k, v, None, None, 0, 0), False), ((*packed, cu, cu, 12, 12), True)]
    for tensors, _ in calls:
        real = torch.ops.flashtriton.forward(*tensors, True, 0.25, -1, -1, 0.0, None, 0.0, None, False)
        do = torch.randn_like(real[0])
        real_grads = torch.ops.flashtriton.backward(do, *tensors[:3], *real, *tensors[3:], True, 0.25, -1, -1, 0.0,
                                                    None, 0.0, None, False, True, True)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fakes = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in tensors]
            fake = torch.ops.flashtriton.forward(*fakes, True, 0.25, -1, -1, 0.0, None, 0.0, None, False)
            fake_grads = torch.ops.flashtriton.backward(mode.from_tensor(do), *fakes[:3], *fake, *fakes[3:], True, 0.25,
                                                        -1, -1, 0.0, None, 0.0, None, False, True, True)
        for r, f in zip((*real, *real_grads), (*fake, *fake_grads), strict=True):
            assert (r.shape, r.stride(), r.dtype) == (f.shape, f.stride(), f.dtype)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "varlen"])
def test_reduce_overhead_matches_eager(packed):
    """mode="reduce-overhead": the forward, and a training step's gradients (a scalar loss, as CUDA graph
    trees expect), replayed from CUDA graphs, equal the eager ones bit for bit."""
    if packed:
        q, k, v, cu_q, cu_k = packed_qkv([100, 37, 250], [90, 64, 250], 8, 2, 64, DTYPE)

        def attend(q, k, v):
            return flash_attention_varlen(q, k, v, cu_q, cu_k, 250, 250, is_causal=True)
    else:
        q, k, v = make_qkv(2, 8, 2, 300, 333, 64, DTYPE, DEVICE)

        def attend(q, k, v):
            return flash_attention(q, k, v, is_causal=True, softcap=20.0)

    do = torch.randn(q.shape, device=DEVICE, dtype=DTYPE)

    def loss(q, k, v):
        return (attend(q, k, v).float() * do).sum()

    with torch.no_grad():
        eager_out = attend(q, k, v)
    eager_grads = torch.autograd.grad(loss(q, k, v), (q, k, v))
    forward = torch.compile(attend, mode="reduce-overhead", fullgraph=True)
    step = torch.compile(loss, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):  # warm-up, recording, then replays of the graphs
        torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad():
            _assert_equal(forward(q, k, v), eager_out)
        torch.compiler.cudagraph_mark_step_begin()
        _assert_equal(torch.autograd.grad(step(q, k, v), (q, k, v)), eager_grads)
