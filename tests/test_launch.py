"""Recorded launches (launch.py): a forward or backward like an earlier one replays that one's launches,
and must compute exactly what Triton's own launch path computes. Replays exist on a GPU only; on CPU the
same tests record and key plans as on a GPU and replay them through the interpreter
(`replays_through_the_interpreter`), and the argument assembly is checked against a stand-in kernel."""

import pytest
import torch

from conftest import DEVICE, ON_GPU
from flashtriton import flash_attention, flash_attention_varlen, launch
from flashtriton.cache import CACHE, PLAN_LIMIT, reset
from flashtriton.launch import TileConfig, replay
from helpers import make_qkv, packed_qkv, with_backward_tiles


def test_recorded_launch_passes_the_new_tensors_then_the_recorded_scalars_and_constexprs():
    """The launcher takes every parameter in signature order: the call's prefix (tensors, descriptors,
    Nones), the recorded scalars, then the constexprs, from the launch's keywords or their defaults."""
    def kernel(X, Y, desc, n, scale, BLOCK: "tl.constexpr", FLAG: "tl.constexpr" = False):  # noqa: F821
        pass

    class JitFn:  # what Recorded reads of a Triton kernel: its Python function's signature
        fn = kernel

    class Compiled:
        function, packed_metadata = "function", "metadata"

        def run(self, *args):
            seen.append(args)
    seen = []
    x, y = torch.zeros(2), torch.ones(2)
    recorded = replay.Recorded(JitFn, Compiled(), (4, 2), (x, y, None, 17, 0.5), dict(BLOCK=64, num_warps=4),
                               prefix_length=3)
    x2, y2 = torch.zeros(3), torch.ones(3)
    recorded.replay((x2, y2, "new desc"), stream=7)
    assert len(seen) == 1
    grid, (stream, function, metadata), hooks, args = seen[0][:3], seen[0][3:6], seen[0][6:9], seen[0][9:]
    assert grid == (4, 2, 1) and stream == 7 and function == "function" and metadata == "metadata"
    assert hooks == (None, None, None)  # launch metadata and the enter and exit hooks
    assert args[0] is x2 and args[1] is y2 and args[2:] == ("new desc", 17, 0.5, 64, False)


def test_launch_hooks_and_the_interpreter_turn_replays_off(monkeypatch):
    """A tool's launch hooks (a profiler's) see every launch only on Triton's own launch path, and the
    interpreter compiles nothing to replay, CUDA tensors or not."""
    from triton import knobs
    cuda = torch.device("cuda")
    assert replay.replayable(cuda) == ON_GPU  # the CPU tests run through the interpreter
    monkeypatch.setattr(knobs.runtime, "interpret", False)
    assert replay.replayable(cuda)
    knobs.runtime.launch_enter_hook.add(print)
    try:
        assert not replay.replayable(cuda)
    finally:
        knobs.runtime.launch_enter_hook.remove(print)
    assert not replay.replayable(torch.device("cpu"))
    monkeypatch.setattr(CACHE, "replays", False)
    assert not replay.replayable(cuda)


def test_plans_stay_bounded():
    reset()
    for i in range(PLAN_LIMIT + 3):
        CACHE.remember_plan(i, object())
    assert 0 < len(CACHE.plans) <= PLAN_LIMIT


def test_no_replay_without_a_gpu():
    """The interpreter (CPU) launches through Triton every time: nothing is recorded."""
    q, k, v = make_qkv(1, 2, 2, 17, 17, 16, torch.bfloat16, DEVICE)
    for _ in range(2):
        flash_attention(q, k, v, is_causal=True).backward(torch.randn_like(q))
    assert (len(CACHE.plans) > 0) == ON_GPU


def _grads(fn, inputs, do):
    """The output and the gradients of one forward + backward."""
    for x in inputs:
        x.grad = None
    o = fn(*inputs)
    o.backward(do)
    return [o.detach().clone(), *(x.grad.clone() for x in inputs)]


def _count_replays(monkeypatch) -> list:
    replays, original = [], replay.Recorded.replay
    monkeypatch.setattr(replay.Recorded, "replay", lambda self, *a: replays.append(1) or original(self, *a))
    return replays


def _check_replay_is_exact(monkeypatch, fn, inputs, do):
    """Triton's launches, then the recording call, then a replay (forward: one launch, backward: three):
    bitwise the same output and gradients."""
    monkeypatch.setattr(CACHE, "replays", False)
    want = _grads(fn, inputs, do)
    monkeypatch.setattr(CACHE, "replays", True)
    replays = _count_replays(monkeypatch)
    recorded = _grads(fn, inputs, do)
    assert not replays and len(CACHE.plans) == 2  # the forward's plan and the backward's
    replayed = _grads(fn, inputs, do)
    assert len(replays) == 4, "the second call did not replay every launch"
    for w, r1, r2 in zip(want, recorded, replayed, strict=True):
        assert torch.equal(w, r1) and torch.equal(w, r2)


replayed = pytest.mark.usefixtures("replays_through_the_interpreter")
N_Q, N_K = (300, 257) if ON_GPU else (37, 29)


@replayed
@pytest.mark.parametrize("variant", ["causal", "gqa-full", "window-softcap-alibi", "dropout", "float32", "d96"])
def test_replayed_backward_equals_triton_launches(monkeypatch, variant):
    dtype = torch.float32 if variant == "float32" else torch.bfloat16
    head_dim = 96 if variant == "d96" else 64
    heads_kv = 2 if variant == "gqa-full" else 4
    q, k, v = make_qkv(2, 4, heads_kv, N_Q, N_K, head_dim, dtype, DEVICE)
    kwargs = dict(is_causal=variant != "gqa-full")
    if variant == "window-softcap-alibi":
        kwargs.update(window_size=(N_K // 4, 0), softcap=20.0, alibi_slopes=torch.rand(4, device=DEVICE))
    if variant == "dropout":
        kwargs.update(dropout_p=0.1)
        torch.manual_seed(0)

    def fn(q, k, v):
        if variant == "dropout":  # the same mask on every call
            torch.manual_seed(0)
        return flash_attention(q, k, v, **kwargs)
    _check_replay_is_exact(monkeypatch, fn, (q, k, v), torch.randn_like(q))


@replayed
@pytest.mark.parametrize("tiles", ["pointer-loads", "tma", "autotuned"])
def test_replayed_backward_on_static_and_autotuned_tiles(monkeypatch, tiles):
    q, k, v = make_qkv(2, 4, 2, *((700, 929) if ON_GPU else (70, 93)), 64, torch.bfloat16, DEVICE)
    use_tma = tiles == "tma"
    sizes = ((64, 64, 4, 3), (128, 64, 8, 3)) if ON_GPU else ((16, 32), (32, 16))
    configs = None if tiles == "autotuned" else tuple(TileConfig(*size, use_tma=use_tma) for size in sizes)

    def fn(q, k, v):
        return with_backward_tiles(q, k, v, True, configs, tiles == "autotuned")[0]
    _check_replay_is_exact(monkeypatch, fn, (q, k, v), torch.randn_like(q))


@replayed
def test_replayed_backward_of_a_packed_batch(monkeypatch):
    lengths_q, lengths_k = ([37, 130, 1], [63, 97, 17]) if ON_GPU else ([17, 40, 1], [23, 31, 9])
    q, k, v, cu_q, cu_k = packed_qkv(lengths_q, lengths_k, 4, 2, 64, torch.bfloat16)

    def fn(q, k, v):
        return flash_attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), is_causal=True)
    _check_replay_is_exact(monkeypatch, fn, (q, k, v), torch.randn_like(q))


@replayed
def test_a_call_with_other_strides_or_alignment_records_its_own_plan(monkeypatch):
    """Triton specialises on 16-byte alignment and on strides: a view that differs there is another plan."""
    buffer = torch.randn(3, 2, 4, N_Q, 64 + 8, device=DEVICE, dtype=torch.bfloat16)
    replays = _count_replays(monkeypatch)
    aligned = [buffer[i, :, :, :, :64].detach().requires_grad_() for i in range(3)]
    shifted = [buffer[i, :, :, :, 1:65].detach().requires_grad_() for i in range(3)]  # 2 bytes off
    do = torch.randn(2, 4, N_Q, 64, device=DEVICE, dtype=torch.bfloat16)
    grads = []
    for inputs in (aligned, shifted, aligned, shifted):
        grads.append(_grads(lambda q, k, v: flash_attention(q, k, v, is_causal=True), inputs, do))
    assert len(CACHE.plans) == 4 and len(replays) == 8  # a forward and a backward plan per layout
    monkeypatch.setattr(CACHE, "replays", False)
    for inputs, got in zip((aligned, shifted), grads[2:], strict=True):
        want = _grads(lambda q, k, v: flash_attention(q, k, v, is_causal=True), inputs, do)
        assert all(torch.equal(w, g) for w, g in zip(want, got, strict=True))


@replayed
@pytest.mark.parametrize("path", ["pointer-loads", "tma", "autotuned"])
def test_replayed_forward_equals_triton_launches(monkeypatch, path):
    """Without autograd (inference), a forward like an earlier one replays its launch."""
    q, k, v = make_qkv(2, 4, 2, N_Q, N_K, 64, torch.bfloat16, DEVICE, requires_grad=False)
    size = (64, 64, 4, 2) if ON_GPU else (16, 32)
    config = None if path == "autotuned" else TileConfig(*size, use_tma=path == "tma")

    def forward():
        return launch.attention_forward(q, k, v, True, 0.125, config=config, autotune=path == "autotuned")
    monkeypatch.setattr(CACHE, "replays", False)
    want = forward()
    monkeypatch.setattr(CACHE, "replays", True)
    replays = _count_replays(monkeypatch)
    got = [forward(), forward()]
    assert len(replays) == 1 and len(CACHE.plans) == 1
    assert all(torch.equal(a, b) for out in got for a, b in zip(want, out, strict=True))


@replayed
def test_a_kernel_swapped_in_records_its_own_plan(monkeypatch):
    """A tool that times another dK/dV kernel passes it as `kernels=`: a replay of the first kernel's plan
    would time that one twice."""
    import triton
    q, k, v = make_qkv(1, 2, 2, N_Q, N_Q, 64, torch.bfloat16, DEVICE, requires_grad=False)
    o, lse = launch.attention_forward(q, k, v, True, 0.125)
    do = torch.randn_like(o)
    replays = _count_replays(monkeypatch)
    for _ in range(2):
        launch.attention_backward(do, q, k, v, o, lse, True, 0.125)
    assert len(CACHE.plans) == 2 and len(replays) == 3  # the forward's plan, the backward's; one replay
    other = launch.DEFAULT_KERNELS._replace(dkdv=triton.jit(launch.DEFAULT_KERNELS.dkdv.fn))
    launch.attention_backward(do, q, k, v, o, lse, True, 0.125, kernels=other)
    assert len(CACHE.plans) == 3 and len(replays) == 3


@replayed
def test_reset_drops_the_plans_and_picks():
    q, k, v = make_qkv(1, 2, 2, N_Q, N_Q, 64, torch.bfloat16, DEVICE)
    flash_attention(q, k, v, is_causal=True).backward(torch.randn_like(q))
    assert CACHE.plans
    reset()
    assert not CACHE.plans


def test_backward_ops_still_take_unhashable_options():
    """Lists where tuples are expected (configs, window) must not break the plan's key."""
    q, k, v = make_qkv(1, 2, 2, 33, 33, 32, torch.bfloat16, DEVICE)
    o, lse = launch.attention_forward(q, k, v, True, 0.2)
    do = torch.randn_like(o)
    tiles = [TileConfig(16, 32), TileConfig(32, 16)]
    grads = launch.attention_backward(do, q, k, v, o, lse, True, 0.2, tiles, window=[-1, -1])
    again = launch.attention_backward(do, q, k, v, o, lse, True, 0.2, tuple(tiles), window=(-1, -1))
    assert all(torch.equal(a, b) for a, b in zip(grads, again, strict=True))


def test_host_next_power_of_2_is_tritons():
    """The launchers' plain-Python next_power_of_2 (Triton's is a slower constexpr function) agrees with
    Triton's for every n >= 1."""
    import triton

    from flashtriton.launch.arguments import next_power_of_2
    for n in [*range(1, 1100), 2**20 - 1, 2**20, 2**20 + 1]:
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
