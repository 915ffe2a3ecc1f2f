"""Forward and backward can be captured in a CUDA graph: no host synchronisation or host-to-device copy on
the launch path (GPU only; the interpreter has no graphs)."""

import pytest
import torch

from flashtriton import flash_attention, flash_attention_varlen
from helpers import packed_qkv

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


def _captured(step):
    """Warm `step` up on a side stream (compiling, and autotuning where it would), capture it, and return
    (graph, its static outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    return graph, outs


def _assert_replays_like_eager(step, inputs, replays=2):
    """Capture `step`, then `replays` times write fresh values into `inputs` (the captured tensors),
    replay, and compare with an eager `step()`: the same kernels in the same order, so bit for bit."""
    graph, outs = _captured(step)
    for _ in range(replays):
        with torch.no_grad():
            for x in inputs:
                x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(outs, step(), strict=True):
            torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_dense_forward_and_backward_replay_like_eager(is_causal):
    q, k, v = (torch.randn(2, 4, 97, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    do = torch.randn_like(q)

    def step():
        o = flash_attention(q, k, v, is_causal=is_causal, window_size=(40, -1), softcap=20.0)
        return (o.detach(), *torch.autograd.grad(o, (q, k, v), do))

    _assert_replays_like_eager(step, (q, k, v, do))


def test_varlen_forward_and_backward_replay_like_eager():
    lengths = [0, 17, 63, 130]
    q, k, v, cu, _ = packed_qkv(lengths, lengths, 4, 2, 64, torch.bfloat16, device="cuda")
    do = torch.randn_like(q)

    def step():
        o = flash_attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), is_causal=True)
        return (o.detach(), *torch.autograd.grad(o, (q, k, v), do))

    _assert_replays_like_eager(step, (q, k, v, do), replays=1)
