"""flash_attention_fp8: float8 e4m3 inputs with descale factors, forward only. Off sm_90 (and on CPU,
through the interpreter) the inputs are dequantized and flash_attention runs; on an sm_90 GPU the Gluon
kernel runs its products in FP8. Both against the float64 attention of the dequantized inputs."""

import pytest
import torch

import flashtriton
from conftest import DEVICE, ON_GPU, replay_through_the_jit_function
from flashtriton.api import descale_table
from flashtriton.launch import gluon_forward, replay
from flashtriton.reference import attention_ref
from flashtriton.testing import Check, bounded

ON_HOPPER = ON_GPU and torch.cuda.get_device_capability() == (9, 0)
E4M3 = torch.float8_e4m3fn


def _quantized(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, per_head, seed=0, growing=False):
    """Fresh q, k, v quantized to e4m3 with their descales (one per tensor, or per (batch, KV head)), and
    the float64 tensors they stand for. `growing`: q's rows and k's key blocks scaled as
    test_gluon.growing_scores scales them, so that the scores' row maxima grow from block to block."""
    torch.manual_seed(seed)
    shapes = [(batch, heads_q, seqlen_q, head_dim), (batch, heads_kv, seqlen_k, head_dim),
              (batch, heads_kv, seqlen_k, head_dim)]
    quantized, descales, exact = [], [], []
    for i, shape in enumerate(shapes):
        x = torch.randn(shape, device=DEVICE) * (1 + i)  # three different ranges
        if growing and i == 0:
            x = x * (0.25 + (torch.arange(seqlen_q, device=DEVICE) % 8) / 4)[:, None]
        elif growing and i == 1:
            x = x * (1 + torch.arange(seqlen_k, device=DEVICE) // gluon_forward.BLOCK_N[head_dim])[:, None]
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


def _plain_fp8_attention(exact, is_causal, scale, quantized=None):
    """Plain attention in FP8, (O, L), the bound for the kernels' errors against the float64 one. Scores from
    the quantized inputs in float32, or, given `quantized` ((q8, k8, v8), their descales) on a GPU, from
    cuBLAS's FP8 matmul with the tensor cores' own accumulation (use_fast_accum), whose partial sums keep
    fewer bits than float32's (about 14, DeepSeek-V3's report, section 3.3.2) as wgmma's do; the
    probabilities rounded to e4m3 for P V, the output rounded to bf16."""
    q, k, v = (x.float() for x in exact)
    group = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(group, 1) for x in (k, v))
    if quantized is None:
        s = q @ k.transpose(-1, -2) * scale
    else:  # each factor back per (batch, query head), as exact holds it: exact / quantized
        (q8, k8, _), (qd, kd, _) = quantized
        factors = [d.expand(q8.shape[0], -1) if d.numel() == 1 else d for d in (qd, kd)]
        factors = [f.repeat_interleave(q8.shape[1] // f.shape[1], 1)[..., None, None] for f in factors]
        s = _fp8_scores(q8, k8, group) * (scale * factors[0] * factors[1])
    if is_causal:
        rows, cols = s.shape[-2:]
        s = s.masked_fill(torch.ones(rows, cols, dtype=torch.bool, device=s.device).tril(cols - rows).logical_not(),
                          float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return (p.to(E4M3).float() @ v).to(torch.bfloat16), torch.logsumexp(s, -1)


def _fp8_scores(q8, k8, group):
    """q8 k8^T per (batch, head) in float32 through torch._scaled_mm (unit scales), as the tensor cores
    accumulate it; rows and columns padded with zeros to multiples of 16, as the matmul needs."""
    batch, heads, seqlen_q, head_dim = q8.shape
    seqlen_k = k8.shape[2]
    pad_q, pad_k = -seqlen_q % 16, -seqlen_k % 16
    one = torch.ones((), device=q8.device)
    s = torch.empty(batch, heads, seqlen_q, seqlen_k, device=q8.device)
    for b in range(batch):
        for h in range(heads):
            a = torch.nn.functional.pad(q8[b, h].view(torch.uint8), (0, 0, 0, pad_q)).view(E4M3)
            kt = torch.nn.functional.pad(k8[b, h // group].view(torch.uint8), (0, 0, 0, pad_k)).view(E4M3)
            s[b, h] = torch._scaled_mm(a, kt.t(), one, one, out_dtype=torch.float32,
                                       use_fast_accum=True)[:seqlen_q, :seqlen_k]
    return s


def _checks(o, lse, exact, is_causal, scale, low, extra_l=0.0):
    """O and L against the float64 attention of the dequantized inputs, each bounded by twice the error of
    `low` (a plain attention's (O, L)), L where a row sees a key (plus `extra_l`); and L = -inf exactly
    where none."""
    o64, lse64 = attention_ref(*exact, is_causal=is_causal, scale=scale)
    finite = torch.isfinite(lse64)
    return [bounded("O", o, o64, low[0], torch.bfloat16),
            bounded("L", lse[finite], lse64[finite], low[1][finite], torch.float32, extra=extra_l),
            Check("L=-inf rows", float((torch.isneginf(lse) != ~finite).sum().item()), 0.0, False)]


def _plain_bf16_attention(exact, is_causal, scale):
    """Plain attention in bf16 on the dequantized inputs rounded to bf16, (O, L): the bound for the path
    without the FP8 kernel, which runs flash_attention in bf16."""
    return attention_ref(*(x.to(torch.bfloat16) for x in exact), is_causal=is_causal, scale=scale, upcast=False)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 2, 1, 1, 16), (2, 4, 2, 17, 63, 16), (1, 4, 1, 97, 30, 32)])
def test_matches_float64_reference(is_causal, per_head, shape):
    """Off sm_90 (flash_attention in bf16 on the e4m3 values, tests below say how the descales apply): odd
    sizes, Nq != Nk both ways (causal rows that see no key: O = 0, L = -inf), GQA and MQA, per-tensor and
    per-head descales; O and L within twice a plain bf16 attention's error."""
    (q8, k8, v8), (qd, kd, vd), exact = _quantized(*shape, per_head)
    o, lse = flashtriton.flash_attention_fp8(q8, k8, v8, is_causal=is_causal, q_descale=qd, k_descale=kd,
                                             v_descale=vd, return_lse=True)
    assert o.dtype == torch.bfloat16 and o.shape == q8.shape and lse.shape == q8.shape[:3]
    scale = shape[-1] ** -0.5
    checks = _checks(o, lse, exact, is_causal, scale, _plain_bf16_attention(exact, is_causal, scale))
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


def _fp8_call(quantized, descales, **kwargs):
    """flash_attention_fp8 on (q8, k8, v8) with their (q, k, v) descales."""
    (q8, k8, v8), (qd, kd, vd) = quantized, descales
    return flashtriton.flash_attention_fp8(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, **kwargs)


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("compiling", [False, True])
def test_without_its_kernel_bf16_for_every_descale(monkeypatch, per_head, compiling):
    """Off the FP8 kernel, flash_attention runs in bf16 for every kind of descale: one q and one k factor
    fold into the scale (read on the host); per-(batch, KV head) factors, or while torch.compile traces
    (no host read there), leave the caller's scale and multiply q or k instead. Within a plain bf16
    attention's bounds."""
    from flashtriton import api
    monkeypatch.setenv(gluon_forward.FORWARD_PATH_VARIABLE, "triton")  # (the kernel's path on sm_90)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    seen = []
    attention = api.flash_attention

    def recorded(q, k, v, **kwargs):
        seen.append((q.dtype, k.dtype, v.dtype, kwargs["scale"]))
        return attention(q, k, v, **kwargs)
    monkeypatch.setattr(api, "flash_attention", recorded)
    quantized, descales, exact = _quantized(2, 4, 2, 17, 63, 16, per_head)
    o, lse = _fp8_call(quantized, descales, is_causal=True, return_lse=True)
    folded = not per_head and not compiling
    qd, kd, _ = descales
    assert [x[:3] for x in seen] == [(torch.bfloat16,) * 3]
    assert seen[0][3] == pytest.approx(16 ** -0.5 * ((qd * kd).item() if folded else 1.0), rel=1e-6)
    checks = _checks(o, lse, exact, True, 16 ** -0.5, _plain_bf16_attention(exact, True, 16 ** -0.5))
    assert all(c.ok for c in checks), checks


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("per_head,seqlen_q,seqlen_k", [(False, 17, 63), (True, 17, 63), (True, 63, 17)])
def test_without_its_kernel_the_factors_are_applied_once_and_nothing_carries_a_gradient(
        monkeypatch, out_dtype, per_head, seqlen_q, seqlen_k):
    """Off the FP8 kernel: one q and one k factor fold into the scale; per-head ones multiply the smaller
    of q and k (here q at 17 queries against 63 keys, k the other way), taken in float32 and rounded once to
    bf16. O is flash_attention's bf16 O times v's factor, rounded once to out_dtype (in bf16 in place,
    bitwise the same). Inputs that require grad give outputs that do not: there is no backward."""
    monkeypatch.setenv(gluon_forward.FORWARD_PATH_VARIABLE, "triton")
    (q8, k8, v8), (qd, kd, vd), _ = _quantized(2, 4, 2, seqlen_q, seqlen_k, 16, per_head=per_head, seed=3)
    q8.requires_grad_()
    o = _fp8_call((q8, k8, v8), (qd, kd, vd), is_causal=True, out_dtype=out_dtype)
    bf16 = torch.bfloat16
    q16, k16, v16 = q8.detach().to(bf16), k8.to(bf16), v8.to(bf16)
    scale = 16 ** -0.5
    factors = (qd * kd).expand(2, 2)[:, :, None, None]
    if not per_head:
        scale *= (qd * kd).item()
    elif seqlen_q < seqlen_k:
        q16 = (q16.float() * factors.repeat_interleave(2, dim=1)).to(bf16)
    else:
        k16 = (k16.float() * factors).to(bf16)
    plain = flashtriton.flash_attention(q16, k16, v16, is_causal=True, scale=scale)
    v_factors = vd.expand(2, 2).repeat_interleave(2, dim=1)[:, :, None, None]
    assert o.dtype == out_dtype and not o.requires_grad
    assert torch.equal(o, (plain.float() * v_factors).to(out_dtype))


def test_without_its_kernel_a_zero_factor_is_taken_as_given(monkeypatch):
    """A zero q descale does not fold into a zero scale (which flash_attention refuses): it zeroes q's or
    k's bf16 copy instead, every score is 0, and O is the mean of V's rows."""
    monkeypatch.setenv(gluon_forward.FORWARD_PATH_VARIABLE, "triton")  # (the kernel's path on sm_90)
    (q8, k8, v8), _, _ = _quantized(1, 2, 2, 9, 9, 16, per_head=False)
    o = flashtriton.flash_attention_fp8(q8, k8, v8, q_descale=torch.zeros(1, device=DEVICE))
    torch.testing.assert_close(o.float(), v8.float().mean(2, keepdim=True).expand_as(o), rtol=1e-2, atol=1e-2)


def test_without_its_kernel_compiles_whole(monkeypatch):
    """Under torch.compile nothing is read on the host, so the call traces whole (fullgraph) and, with
    per-head factors (the eager call's path too), gives the eager O: bit for bit through AOTAutograd on the
    CPU; through Inductor on a GPU, whose fused conversions and products may round differently, within one
    bf16 rounding of O's size."""
    monkeypatch.setenv(gluon_forward.FORWARD_PATH_VARIABLE, "triton")
    torch._dynamo.reset()
    quantized, descales, _ = _quantized(1, 4, 2, 9, 13, 16, per_head=True, seed=4)

    def attend(q8, k8, v8, qd, kd, vd):
        return _fp8_call((q8, k8, v8), (qd, kd, vd), is_causal=True)
    compiled = torch.compile(attend, fullgraph=True, backend="inductor" if ON_GPU else "aot_eager")
    try:
        got, eager = compiled(*quantized, *descales), attend(*quantized, *descales)
    finally:
        torch._dynamo.reset()
    if ON_GPU:
        torch.testing.assert_close(got, eager, rtol=2 ** -8, atol=2 ** -8 * eager.abs().max().item())
    else:
        assert torch.equal(got, eager)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_without_its_kernel_in_a_cuda_graph(monkeypatch):
    """Captured in a CUDA graph (per-head factors, the eager call's path too), the call gives the eager O
    bit for bit, and replayed after the descales are written in place it follows them: they are read on
    the device at each replay."""
    monkeypatch.setenv(gluon_forward.FORWARD_PATH_VARIABLE, "triton")
    quantized, descales, _ = _quantized(2, 4, 2, 17, 63, 16, per_head=True, seed=5)

    def attend():
        return _fp8_call(quantized, descales, is_causal=True)
    eager = attend()  # (compiles and picks the tiles before capture)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = attend()
    graph.replay()
    assert torch.equal(captured, eager)
    for descale in descales:
        descale.mul_(2)
    graph.replay()
    assert torch.equal(captured, attend())
    assert not torch.equal(captured, eager)


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


@pytest.mark.parametrize("seqlen_k", [1, 17, 63, 97, 130])
@pytest.mark.parametrize("head_dim", [16, 64, 256])
@pytest.mark.parametrize("transposed", [False, True])
def test_values_operand_relabels_keys(monkeypatch, seqlen_k, head_dim, transposed):
    """fp8_values_operand (its Triton kernel, interpreted on CPU): V^T padded with zeros to 32 keys, column
    16h + 4t + 2n + j of every 32 holding key 16h + 8n + 2t + j, from a contiguous V or one with D
    outermost; every byte written (uint8 outputs poisoned); and P relabeled as the Gluon kernel relabels
    it, times that V^T, is P V."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        out = empty(*args, **kwargs)
        return out.fill_(0x7F) if out.dtype == torch.uint8 else out  # 0x7F: NaN in e4m3
    monkeypatch.setattr(torch, "empty", poisoned)
    torch.manual_seed(seqlen_k)
    v = torch.randn(2, 3, seqlen_k, head_dim, device=DEVICE)
    if transposed:
        v = torch.randn(head_dim, 2, 3, seqlen_k, device=DEVICE).permute(1, 2, 3, 0)
    v8 = v.to(E4M3)
    vt = gluon_forward.fp8_values_operand(v8)
    padded_k = -(-seqlen_k // 32) * 32
    keys = torch.arange(padded_k).view(-1, 2, 2, 4, 2).permute(0, 1, 3, 2, 4).reshape(-1)  # column -> key
    expected = torch.nn.functional.pad(v8.float(), (0, 0, 0, padded_k - seqlen_k))[:, :, keys.to(DEVICE)]
    assert vt.shape == (2, 3, head_dim, padded_k) and vt.dtype == E4M3
    torch.testing.assert_close(vt.float(), expected.transpose(2, 3), rtol=0, atol=0)
    p = torch.nn.functional.pad(torch.rand(2, 3, 5, seqlen_k, device=DEVICE), (0, padded_k - seqlen_k))
    relabeled = p.unflatten(-1, (-1, 2, 2, 4, 2)).permute(0, 1, 2, 3, 4, 6, 5, 7).flatten(3)
    torch.testing.assert_close(relabeled @ vt.float().transpose(2, 3), p[..., :seqlen_k] @ v8.float())


class _Recording:
    """A kernel stand-in: a launch records (name, grid, args) and runs nothing; `fn` is the real kernel's,
    whose signature a recorded launch reads the constexprs' defaults from (replay.Recorded)."""

    def __init__(self, kernel, calls: list):
        self.fn, self.calls = kernel.fn, calls

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append((self.fn.__name__, tuple(grid) + (1,) * (3 - len(grid)), args))
            return self  # (as the compiled kernel: the interpreter's replay relaunches through the jit function)
        return launch


def _described(x, roles: dict):
    """A launch argument as a replay must reproduce it: a tensor by its role (which of the call's tensors it
    is, by address), shape, strides and dtype; a descriptor by its tensor's role, shape, strides and box."""
    if isinstance(x, torch.Tensor):
        return "tensor", roles.get(x.data_ptr()), tuple(x.shape), x.stride(), x.dtype
    if hasattr(x, "block_shape"):
        return "descriptor", roles.get(x.base.data_ptr()), list(x.shape), list(x.strides), list(x.block_shape)
    return x


@pytest.mark.parametrize("keys_contiguous", [False, True], ids=["v-copied", "v-read-as-it-is"])
def test_a_repeated_fp8_call_replays_its_launches(monkeypatch, replays_through_the_interpreter, keys_contiguous):
    """fp8_forward_gluon records its launches (V's copy where V is copied, then the kernel), and a second call
    with equal shapes, strides and options replays them without building them again: the same kernels, grids
    and arguments as Triton's launch path took, over the second call's own tensors (inputs, outputs, V's
    copy) and descriptors of the same shape, strides and box over them (K's 5-D one where V is read as it
    is). Checked on the arguments with the kernels stubbed: Gluon kernels do not run on CPU (the GPU tests
    check the replayed calls' values)."""
    from flashtriton.launch.runner import last_choice

    calls, built = [], []
    build = gluon_forward.gluon_forward_launch

    def recording_launch(*args, **kwargs):
        kernel, grid, launch_args, launch_kwargs = build(*args, **kwargs)
        built.append(kernel.fn.__name__)
        return _Recording(kernel, calls), grid, launch_args, launch_kwargs
    monkeypatch.setattr(gluon_forward, "gluon_forward_launch", recording_launch)
    monkeypatch.setattr(gluon_forward, "fp8_values_kernel", _Recording(gluon_forward.fp8_values_kernel, calls))
    # The stand-ins are the compiled kernels too: on a GPU as on CPU a replay relaunches through them.
    monkeypatch.setattr(replay.Recorded, "replay", replay_through_the_jit_function)

    def fp8_call(seed):
        calls.clear()
        (q8, k8, v8), descales, _ = _quantized(2, 4, 2, 70, 48, 64, per_head=True, seed=seed)
        if keys_contiguous:
            v8 = v8.transpose(2, 3).contiguous().transpose(2, 3)
        descale = descale_table(tuple(descales), 2, 2, DEVICE)
        o, lse = gluon_forward.fp8_forward_gluon(q8, k8, v8, True, 0.125, descale, torch.bfloat16,
                                                 gluon_forward.FP8_WITHOUT_LSE_OPTIONS)
        tensors = (q8, k8, v8, descale, o, lse)
        roles = {x.data_ptr(): name for name, x in zip("q k v descale o lse".split(), tensors, strict=True)}
        if not keys_contiguous:  # V's copy, made inside the call: the copy's output
            roles[calls[0][2][1].data_ptr()] = "v copy"
        described = [(name, grid, [_described(a, roles) for a in args]) for name, grid, args in calls]
        return described, last_choice("forward")

    launched, choice = fp8_call(0)
    kernels = ["fp8_values_kernel"] * (not keys_contiguous) + ["attn_fwd_gluon_kernel"]
    assert [name for name, _, _ in launched] == kernels
    assert not choice.replayed and built == ["attn_fwd_gluon_kernel"]
    replayed, choice = fp8_call(1)
    tiles = gluon_forward.gluon_tiles(gluon_forward.grid_form(64, True, 48, fp8=True)[1], gluon_forward.BLOCK_N[64])
    assert choice.replayed and str(choice) == f"gluon-fp8-{tiles}-sums-ostore-paired", choice
    assert built == ["attn_fwd_gluon_kernel"]  # (not built again)
    for (name, grid, args), (replay_name, replay_grid, replay_args) in zip(launched, replayed, strict=True):
        assert (replay_name, replay_grid) == (name, grid)
        # the replay passes the constexprs' defaults after the arguments the launch path was given
        assert replay_args[:len(args)] == args, name
    descriptors = [a for a in launched[-1][2] if isinstance(a, tuple) and a[0] == "descriptor"]
    assert [d[1] for d in descriptors] == ["q", "k", "v" if keys_contiguous else "v copy", "o"]
    assert len(descriptors[1][2]) == (5 if keys_contiguous else 4)  # K interleaved by a 5-D box, or not


@pytest.mark.skipif(not ON_HOPPER, reason="the FP8 Gluon kernel runs on an sm_90 GPU only")
@pytest.mark.parametrize("keys_contiguous", [False, True], ids=["v-copied", "v-read-as-it-is"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_gluon_fp8_replayed_call_is_its_own(monkeypatch, keys_contiguous, is_causal):
    """On sm_90 a second FP8 call like the first, with fresh values and descales, replays the first's
    launches (test_a_repeated_fp8_call_replays_its_launches checks their arguments on CPU) and gives its own
    O and L: within twice plain FP8 attention's errors of its float64 reference, and bitwise the same call's
    with replays off."""
    from flashtriton.cache import CACHE
    from flashtriton.launch.runner import last_choice

    scale = 128 ** -0.5

    def call(seed):
        quantized, descales, exact = _quantized(2, 4, 2, 97, 144, 128, per_head=True, seed=seed)
        q8, k8, v8 = quantized
        if keys_contiguous:  # (Nk = 144, a multiple of 16: read as it is, K loaded interleaved)
            v8 = v8.transpose(2, 3).contiguous().transpose(2, 3)
        inputs = (q8, k8, v8, is_causal, scale, descale_table(tuple(descales), 2, 2, DEVICE), torch.bfloat16,
                  gluon_forward.FP8_DEFAULT_OPTIONS)
        return gluon_forward.fp8_forward_gluon(*inputs), last_choice("forward"), (quantized, descales, exact), inputs

    assert not call(0)[1].replayed
    (o, lse), choice, (quantized, descales, exact), inputs = call(1)
    assert choice.replayed, choice
    low = _plain_fp8_attention(exact, is_causal, scale, (quantized, descales))
    checks = _checks(o, lse, exact, is_causal, scale, low)
    assert all(c.ok for c in checks), checks
    monkeypatch.setattr(CACHE, "replays", False)
    o_built, lse_built = gluon_forward.fp8_forward_gluon(*inputs)
    assert not last_choice("forward").replayed
    assert torch.equal(o, o_built) and torch.equal(lse, lse_built)


@pytest.mark.skipif(not ON_HOPPER, reason="the FP8 Gluon kernel runs on an sm_90 GPU only")
@pytest.mark.parametrize("head_dim", gluon_forward.FP8_HEAD_DIMS)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 2, 1, 1), (2, 4, 2, 17, 63), (2, 4, 2, 130, 97), (1, 8, 2, 1000, 1100)])
def test_gluon_fp8_matches_float64_reference(monkeypatch, head_dim, is_causal, per_head, shape):
    """On sm_90 the Gluon kernel's FP8 form runs (checked); O and L within twice plain FP8 attention's errors
    (its scores accumulated by the tensor cores and its probabilities rounded to e4m3 for P V, as the
    kernel's are), the rows without keys as above; called without L (its sums by the tensor cores,
    FP8_WITHOUT_LSE_OPTIONS), O within the same bound; at D = 256 too (FP8_AUTO_HEAD_DIMS), auto or, under a
    release the kernels have not run on, FLASHTRITON_FORWARD=gluon."""
    from flashtriton import api
    calls = []

    def counted(*args):
        calls.append((args[0].dtype, args[-1]))
        return gluon_forward.fp8_forward_gluon(*args)
    monkeypatch.setattr(api, "fp8_forward_gluon", counted)
    # auto, which takes the kernel under a Triton release it ran on; under another it must be asked for
    if gluon_forward.gluon_ran() and head_dim in gluon_forward.FP8_AUTO_HEAD_DIMS:
        monkeypatch.delenv(gluon_forward.FORWARD_PATH_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(gluon_forward.FORWARD_PATH_VARIABLE, "gluon")
    quantized, (qd, kd, vd), exact = _quantized(*shape, head_dim, per_head)
    o, lse = flashtriton.flash_attention_fp8(*quantized, is_causal=is_causal, q_descale=qd, k_descale=kd,
                                             v_descale=vd, return_lse=True)
    scale = head_dim ** -0.5
    low = _plain_fp8_attention(exact, is_causal, scale, (quantized, (qd, kd, vd)))
    checks = _checks(o, lse, exact, is_causal, scale, low)
    assert all(c.ok for c in checks), checks
    o_alone = flashtriton.flash_attention_fp8(*quantized, is_causal=is_causal, q_descale=qd, k_descale=kd,
                                              v_descale=vd)
    check = bounded("O without L", o_alone, attention_ref(*exact, is_causal=is_causal, scale=scale)[0], low[0],
                    torch.bfloat16)
    assert check.ok, check
    assert calls == [(E4M3, gluon_forward.FP8_DEFAULT_OPTIONS), (E4M3, gluon_forward.FP8_WITHOUT_LSE_OPTIONS)]


FP8_OPTIONS = gluon_forward.flag_sets(fp8=True)


@pytest.mark.skipif(not ON_HOPPER, reason="the FP8 Gluon kernel runs on an sm_90 GPU only")
@pytest.mark.parametrize("head_dim", gluon_forward.FP8_HEAD_DIMS)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 2, 130, 700), (1, 8, 2, 640, 640)])
@pytest.mark.parametrize("options", list(FP8_OPTIONS.values()), ids=list(FP8_OPTIONS))
def test_gluon_fp8_options_match_float64_reference(head_dim, is_causal, shape, options):
    """The FP8 kernel with lazy_rescale (kernels/gluon_rescale.py: probabilities up to 256, within e4m3's
    448), sums_by_mma (the sums of the e4m3 P by the tensor cores), o_by_tma (the bf16 O by TMA stores) and
    paired_stages (K and V^T sharing a stage), alone and together, on scores whose row maxima grow across key
    blocks, some by more than the threshold: O and L within twice plain FP8 attention's errors, as
    test_gluon_fp8_matches_float64_reference. sums_by_mma's e4m3 sums were wrong under Triton 3.6 until its
    ones tile was written as bytes (docs/performance.md, entry 97: ptxas 12.8 packed half of each word from
    an unrelated register); "all" is FP8_ALL_FLAGS, without lazy_rescale, which FP8 refuses beside
    sums_by_mma. On these peaked scores sums_by_mma meets L's bound; on broad ones (those of the test
    above) its sums of the rounded P do not, so FP8's default leaves it off (entry 98). scaled_p rounds P as
    2^8 P, which L undoes (entry 99). o_by_tma, on by default in FP8, once faulted at D = 64 causal (a TMA
    store at a negative row, entry 92): shape (2, 4, 2, 130, 700) has such a tile."""
    quantized, descales, exact = _quantized(*shape, head_dim, per_head=False, growing=True)
    batch, heads_kv = shape[0], shape[2]
    descale = descale_table(tuple(descales), batch, heads_kv, DEVICE)
    scale = head_dim ** -0.5
    o, lse = gluon_forward.fp8_forward_gluon(*quantized, is_causal, scale, descale, torch.bfloat16, options)
    low = _plain_fp8_attention(exact, is_causal, scale, (quantized, descales))
    checks = _checks(o, lse, exact, is_causal, scale, low)
    assert all(c.ok for c in checks), checks


needs_gluon = pytest.mark.skipif(not gluon_forward.gluon_available(), reason="Gluon's kernels and descriptors")


@needs_gluon
def test_key_of_column_is_the_probabilities_relabeling():
    """With K loaded interleaved, accumulator column c holds key key_of_column(c) (kernels/gluon_masks.py, its
    formula run on CPU tensors): the operand column that _probabilities_operand makes of column c, so that P V
    reads V^T's keys in their own order."""
    from flashtriton.kernels.gluon_masks import key_of_column
    cols = torch.arange(256)
    keys = key_of_column.fn(cols)
    # operand column a takes accumulator column relabel[a] (_probabilities_operand's reshape and permute)
    relabel = torch.arange(256).view(-1, 2, 2, 4, 2).permute(0, 1, 3, 2, 4).reshape(-1)
    assert torch.equal(keys[relabel], torch.arange(256))


@needs_gluon
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_interleaved_keys_descriptor_puts_key_of_column_in_each_row(layout, head_dim):
    """interleaved_keys_descriptor's 5-D box, read as TMA reads it (each element at the descriptor's strides
    from the (batch, head)'s coordinates that interleaved_keys_map gives the kernel; groups past the
    descriptor's rows zero): row c of every key block holds key block start + key_of_column(c), for K laid
    out (B, Hkv, Nk, D) or (B, Nk, Hkv, D), every batch and head, the last block past Nk included."""
    from flashtriton.kernels.gluon_masks import key_of_column
    batch, heads_kv, seqlen_k = 2, 3, 400
    block_n = gluon_forward.BLOCK_N[head_dim]
    torch.manual_seed(head_dim)
    shape = (batch, heads_kv, seqlen_k, head_dim) if layout == "bhnd" else (batch, seqlen_k, heads_kv, head_dim)
    k = torch.randint(0, 256, shape, dtype=torch.uint8)
    k = (k if layout == "bhnd" else k.transpose(1, 2)).view(E4M3)
    k_map = gluon_forward.interleaved_keys_map(k)
    assert k_map == ((heads_kv * 25, 25, 0) if layout == "bhnd" else (25, 0, head_dim))
    desc = gluon_forward.interleaved_keys_descriptor(k, k_map, block_n)
    assert desc.block_shape == [block_n // 16, 2, 4, 2, head_dim]
    flat = torch.as_strided(k.view(torch.uint8), (k.untyped_storage().nbytes(), ), (1, ), 0)
    groups_b, groups_h, inner_h = k_map
    keys = key_of_column.fn(torch.arange(block_n))
    for b in range(batch):
        for h in range(heads_kv):
            for start in range(0, seqlen_k, block_n):
                first = b * groups_b + h * groups_h + start // 16
                rows = []
                for g in range(first, first + block_n // 16):
                    if g >= desc.shape[0]:
                        rows.append(torch.zeros(16, head_dim, dtype=torch.uint8))
                        continue
                    assert h * inner_h + head_dim <= desc.shape[4]
                    box = torch.as_strided(flat, (2, 4, 2, head_dim), desc.strides[1:],
                                           g * desc.strides[0] + h * inner_h)
                    rows.append(box.reshape(16, head_dim))
                tile = torch.cat(rows)
                held = start + keys
                inside = held < seqlen_k
                assert torch.equal(tile[inside], k[b, h, held[inside]].view(torch.uint8)), (b, h, start)


@needs_gluon
def test_interleaved_keys_only_where_one_descriptor_reaches_every_head():
    """interleaved_keys_map: None for Nk not a multiple of 16 (a group would straddle two heads), for rows at
    no single stride (heads outermost) and for rows not 16 bytes apart (TMA); keys_contiguous: a V whose keys
    are contiguous and TMA-readable. A launch asked for interleaved keys it cannot have is refused, naming
    what it needs."""
    k = torch.empty(2, 3, 96, 64, dtype=E4M3)
    assert gluon_forward.interleaved_keys_map(k) == (18, 6, 0)
    assert gluon_forward.interleaved_keys_map(torch.empty(2, 3, 97, 64, dtype=E4M3)) is None
    assert gluon_forward.interleaved_keys_map(torch.empty(3, 2, 96, 64, dtype=E4M3).transpose(0, 1)) is None
    assert gluon_forward.interleaved_keys_map(torch.empty(1, 1, 96, 72, dtype=E4M3)[:, :, :, :64]) is None  # TMA
    v_t = torch.empty(2, 3, 64, 96, dtype=E4M3)
    assert gluon_forward.keys_contiguous(v_t.transpose(2, 3)) and not gluon_forward.keys_contiguous(k)
    assert not gluon_forward.keys_contiguous(torch.empty(2, 3, 64, 97, dtype=E4M3).transpose(2, 3))
    q = torch.empty(2, 6, 32, 64, dtype=E4M3)
    o, lse = torch.empty(q.shape, dtype=torch.bfloat16), torch.empty(2, 6, 32)
    bad_k = torch.empty(2, 3, 97, 64, dtype=E4M3)
    with pytest.raises(ValueError, match="keys_interleaved=True takes .* Nk a multiple of 16"):
        gluon_forward.gluon_forward_launch(q, bad_k, torch.empty(2, 3, 64, 97, dtype=E4M3), o, lse, False, 0.125,
                                           overlap=True, descale=torch.ones(3, 2, 3), keys_interleaved=True)


@pytest.mark.parametrize("is_causal", [False, True])
def test_a_v_with_contiguous_keys_is_the_same_attention(is_causal):
    """flash_attention_fp8 takes a V whose keys are contiguous (a transposed view of a (B, Hkv, D, Nk) tensor)
    on every path: on the Gluon kernel it is read as it is (below), elsewhere (CPU: the interpreter's
    flash_attention) the result is bitwise its row-major copy's."""
    (q8, k8, v8), (qd, kd, vd), _ = _quantized(1, 4, 2, 17, 32, 64, per_head=True, seed=3)
    v_keys_contiguous = v8.transpose(2, 3).contiguous().transpose(2, 3)
    args = dict(is_causal=is_causal, q_descale=qd, k_descale=kd, v_descale=vd, return_lse=True)
    o, lse = flashtriton.flash_attention_fp8(q8, k8, v8, **args)
    o_t, lse_t = flashtriton.flash_attention_fp8(q8, k8, v_keys_contiguous, **args)
    if ON_HOPPER:  # (the kernel's two paths sum in another order: the GPU test below bounds them)
        torch.testing.assert_close(o_t.float(), o.float(), rtol=2 ** -6, atol=2 ** -6 * o.abs().max().item())
    else:
        assert torch.equal(o_t, o) and torch.equal(lse_t, lse)


@pytest.mark.skipif(not ON_HOPPER, reason="the FP8 Gluon kernel runs on an sm_90 GPU only")
@pytest.mark.parametrize("head_dim", gluon_forward.FP8_HEAD_DIMS)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 2, 1, 16), (2, 4, 2, 17, 64), (2, 4, 2, 130, 96), (2, 4, 2, 97, 144),
                                   (1, 8, 2, 640, 704), (1, 2, 1, 300, 2112), (2, 4, 2, 63, 97)])
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_gluon_fp8_reads_a_v_with_contiguous_keys_as_it_is(monkeypatch, head_dim, is_causal, shape, layout):
    """A V whose keys are contiguous (FlashAttention-3's column-major V) is read as it is, K loaded interleaved
    to match (interleaved_keys_map: K (B, Hkv, Nk, D) or (B, Nk, Hkv, D) in order, Nk a multiple of 16): no
    copy of V, and O and L as the copy's up to the order of the rows' sums and of P V's products inside a
    wgmma (the same products of the same keys), without flags and with the library's two FP8 sets; the
    library's FP8 result (with L) within twice plain FP8 attention's errors. At Nk = 97 V is copied."""
    quantized, descales, exact = _quantized(*shape, head_dim, per_head=True, seed=shape[3])
    q8, k8, v8 = quantized
    if layout == "bnhd":
        k8 = k8.transpose(1, 2).contiguous().transpose(1, 2)
    v_keys_contiguous = v8.transpose(2, 3).contiguous().transpose(2, 3)
    descale = descale_table(tuple(descales), shape[0], shape[2], DEVICE)
    scale = head_dim ** -0.5
    copies = []
    copy = gluon_forward._fp8_values_spec  # (the copy's launch, made for every call that copies V)
    monkeypatch.setattr(gluon_forward, "_fp8_values_spec", lambda v: copies.append(v.shape) or copy(v))
    interleaved = shape[4] % 16 == 0
    for options in (gluon_forward.ForwardOptions(), gluon_forward.FP8_DEFAULT_OPTIONS,
                    gluon_forward.FP8_WITHOUT_LSE_OPTIONS):
        o_copy, lse_copy = gluon_forward.fp8_forward_gluon(q8, k8, v8, is_causal, scale, descale, torch.bfloat16,
                                                           options)
        o, lse = gluon_forward.fp8_forward_gluon(q8, k8, v_keys_contiguous, is_causal, scale, descale,
                                                 torch.bfloat16, options)
        assert len(copies) == (1 if interleaved else 2), (options, copies)
        copies.clear()
        assert not o.isnan().any()
        torch.testing.assert_close(o.float(), o_copy.float(), rtol=2 ** -6, atol=2 ** -6 * o_copy.abs().max().item())
        torch.testing.assert_close(lse, lse_copy, rtol=0, atol=1e-4)
        if options == gluon_forward.FP8_DEFAULT_OPTIONS:
            checks = _checks(o, lse, exact, is_causal, scale, _plain_fp8_attention(exact, is_causal, scale,
                                                                                  (quantized, descales)))
            assert all(c.ok for c in checks), checks


@pytest.mark.skipif(not ON_HOPPER, reason="the FP8 Gluon kernel runs on an sm_90 GPU only")
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("is_causal", [False, True])
def test_gluon_fp8_scaled_p_on_broad_scores(head_dim, is_causal):
    """scaled_p (P rounded to e4m3 as 2^8 P) on the broad scores of test_gluon_fp8_matches_float64_reference
    (K twice Q), where without it a row's small probabilities fall on e4m3's subnormal grid: O and L within
    twice plain FP8 attention's errors, and O's RMSE at most 1.02x that of the library's FP8 form without
    it (8-16% smaller in the CPU emulation, docs/performance.md entry 99). With sums_by_mma as well
    (FP8_ALL_FLAGS, the next candidate for calls that do not ask for L, whose sums of the e4m3 P miss L's bound
    here), O within its bound and its RMSE likewise."""
    quantized, descales, exact = _quantized(1, 8, 2, 1000, 1100, head_dim, per_head=False, seed=head_dim)
    descale = descale_table(tuple(descales), 1, 2, DEVICE)
    scale = head_dim ** -0.5
    low = _plain_fp8_attention(exact, is_causal, scale, (quantized, descales))
    o64 = attention_ref(*exact, is_causal=is_causal, scale=scale)[0]

    def run(options):
        return gluon_forward.fp8_forward_gluon(*quantized, is_causal, scale, descale, torch.bfloat16, options)

    def rmse(o):
        return (o.double() - o64).pow(2).mean().sqrt().item()
    library = rmse(run(gluon_forward.FP8_DEFAULT_OPTIONS)[0])
    o, lse = run(gluon_forward.FP8_DEFAULT_OPTIONS._replace(scaled_p=True))
    checks = _checks(o, lse, exact, is_causal, scale, low)
    assert all(c.ok for c in checks), checks
    assert rmse(o) <= 1.02 * library, (rmse(o), library)
    o_all = run(gluon_forward.FP8_ALL_FLAGS)[0]
    check = bounded("O", o_all, o64, low[0], torch.bfloat16)
    assert check.ok, check
    assert rmse(o_all) <= 1.02 * library, (rmse(o_all), library)


@pytest.mark.parametrize("return_lse", [True, False])
def test_sums_by_the_tensor_cores_only_where_l_is_not_returned(monkeypatch, return_lse):
    """Where the FP8 kernel runs, a call that returns L takes FP8_DEFAULT_OPTIONS (exact sums of P), one that
    does not FP8_WITHOUT_LSE_OPTIONS (the sums of the e4m3 P by the tensor cores, which cost L its accuracy:
    docs/performance.md, entry 98); what the kernel returns is what the call returns."""
    from flashtriton import api
    (q8, k8, v8), (qd, kd, vd), _ = _quantized(1, 4, 2, 9, 11, 16, per_head=False)
    seen = []
    outputs = torch.randn(q8.shape, device=DEVICE), torch.randn(q8.shape[:3], device=DEVICE)

    def kernel(q, k, v, is_causal, scale, descale, out_dtype, options):
        seen.append(options)
        return outputs
    monkeypatch.setattr(api, "fp8_gluon_selected", lambda *args: True)
    monkeypatch.setattr(api, "fp8_forward_gluon", kernel)
    out = flashtriton.flash_attention_fp8(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, return_lse=return_lse)
    assert seen == [gluon_forward.FP8_DEFAULT_OPTIONS if return_lse else gluon_forward.FP8_WITHOUT_LSE_OPTIONS]
    assert gluon_forward.FP8_WITHOUT_LSE_OPTIONS == gluon_forward.FP8_DEFAULT_OPTIONS._replace(sums_by_mma=True)
    if return_lse:
        assert out[0] is outputs[0] and out[1] is outputs[1]
    else:
        assert out is outputs[0]


@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("path", ["auto", "gluon", "triton"])
def test_forward_path_picks_the_fp8_form(monkeypatch, path, head_dim):
    """The Gluon FP8 form on sm_90 unless FLASHTRITON_FORWARD=triton (auto: under a Triton release the kernels
    ran on, at a head dim the form ran at, FP8_AUTO_HEAD_DIMS); elsewhere (CPU too) never."""
    monkeypatch.setenv(gluon_forward.FORWARD_PATH_VARIABLE, path)
    (q8, k8, v8), _, _ = _quantized(1, 2, 2, 256, 256, head_dim, per_head=False)
    wanted = path == "gluon" or (path == "auto" and gluon_forward.gluon_ran()
                                 and head_dim in gluon_forward.FP8_AUTO_HEAD_DIMS)
    assert gluon_forward.fp8_gluon_selected(q8, k8, v8) == (ON_HOPPER and wanted)
