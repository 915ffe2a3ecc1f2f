"""Test-side wrappers over flashtriton.testing (shared with the benchmark's correctness check)."""

import torch

from flashtriton.ops import attention_backward, attention_forward
from flashtriton.testing import compare_with_reference, make_qkv, max_err

__all__ = ["WithBackwardTiles", "check_against_reference", "make_qkv", "max_err"]


def check_against_reference(fn, q, k, v, is_causal, scale=None, factor=2.0, window_size=(-1, -1), softcap=0.0,
                            alibi_slopes=None):
    checks = compare_with_reference(fn, q, k, v, is_causal, scale, factor, window_size, softcap, alibi_slopes)
    failed = [str(c) for c in checks if not c.ok]
    assert not failed, "; ".join(failed)


class WithBackwardTiles(torch.autograd.Function):
    """The kernels with chosen backward tiles, or the backward's autotuners forced on (the public API
    picks by problem size): `WithBackwardTiles.apply(q, k, v, is_causal, configs, autotune, window)`."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal, configs, autotune=None, window=(-1, -1)):
        o, lse = attention_forward(q, k, v, is_causal, q.shape[-1] ** -0.5, window=window)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal, ctx.configs, ctx.autotune, ctx.window = is_causal, configs, autotune, window
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        grads = attention_backward(do, q, k, v, o, lse, ctx.is_causal, q.shape[-1] ** -0.5, ctx.configs,
                                   ctx.autotune, window=ctx.window)
        return *grads, None, None, None, None
