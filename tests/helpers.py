"""Test-side wrappers over flashtriton.testing (shared with the benchmark's correctness check)."""

import json
import os
import subprocess
import sys

import torch

from conftest import DEVICE
from flashtriton import attention_ref, launch
from flashtriton.testing import backward_rounding_slack, bounded, compare_with_reference, make_qkv, max_err

__all__ = ["BackwardTiles", "with_backward_tiles", "check_against_reference", "make_qkv", "max_err", "packed_qkv",
           "reference_per_sequence", "failed_checks", "inspect_reports", "compiling"]


def compiling(*command: str) -> str:
    """The stdout of `python *command` run to compile real kernels: in its own process, without
    TRITON_INTERPRET, and without TRITON_DEFAULT_FP_FUSION: Triton 3.9 warns when a launch leaves FP fusion
    to its default, which no launch may (launch/arguments.py, COMPILE_OPTIONS)."""
    drop = ("TRITON_INTERPRET", "TRITON_DEFAULT_FP_FUSION")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    src = os.path.join(os.path.dirname(__file__), "..", "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, *command], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "TRITON_DEFAULT_FP_FUSION" not in out.stderr, out.stderr[-2000:]
    return out.stdout


def inspect_reports(*flags: str) -> list[dict]:
    """`python -m flashtriton inspect --json *flags`'s reports (compiling's process)."""
    return json.loads(compiling("-m", "flashtriton", "inspect", "--json", *flags))


def check_against_reference(fn, q, k, v, is_causal, scale=None, factor=2.0, window_size=(-1, -1), softcap=0.0,
                            alibi_slopes=None):
    checks = compare_with_reference(fn, q, k, v, is_causal, scale, factor, window_size, softcap, alibi_slopes)
    failed = [str(c) for c in checks if not c.ok]
    assert not failed, "; ".join(failed)


class BackwardTiles(torch.autograd.Function):
    """`BackwardTiles.apply(q, k, v, is_causal, options, configs, autotune) -> (o, lse)`: the launchers
    under autograd, with the backward's tiles chosen (configs = (dK/dV, dQ), or None) or its autotuners
    forced on or off, which the public API picks by problem size. `options`: the launchers' keywords."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal, options, configs, autotune):
        o, lse = launch.attention_forward(q, k, v, is_causal, **options)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.arguments = (is_causal, options, configs, autotune)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        is_causal, options, configs, autotune = ctx.arguments
        grads = launch.attention_backward(do, *ctx.saved_tensors, is_causal, **options, configs=configs,
                                          autotune=autotune)
        return *grads, None, None, None, None


def with_backward_tiles(q, k, v, is_causal, configs, autotune=None, window=(-1, -1)):
    """(o, lse) of the kernels with chosen backward tiles (dK/dV, dQ), or the backward's autotuners forced
    on (the public API picks by problem size)."""
    return BackwardTiles.apply(q, k, v, is_causal, dict(scale=q.shape[-1] ** -0.5, window=window), configs, autotune)


def packed_qkv(lengths_q, lengths_k, heads_q, heads_kv, head_dim, dtype, device=DEVICE):
    """q (total_q, Hq, D), k, v (total_k, Hkv, D) requiring grad, and the int32 cu_seqlens of the lengths."""
    cu = [torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device=device)
          for n in (lengths_q, lengths_k)]
    q = torch.randn(sum(lengths_q), heads_q, head_dim, device=device, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(sum(lengths_k), heads_kv, head_dim, device=device, dtype=dtype, requires_grad=True)
            for _ in range(2))
    return q, k, v, *cu


def reference_per_sequence(q, k, v, cu_q, cu_k, upcast, **kwargs):
    """The reference run sequence by sequence, packed back: (o, lse (Hq, total_q)). A dropout mask, if
    given, is (batch, Hq, max_q, max_k): each sequence's top-left corner."""
    outs, lses = [], []
    slopes = kwargs.pop("alibi_slopes", None)
    mask = kwargs.pop("dropout_mask", None)
    for b in range(len(cu_q) - 1):
        qs, ks, vs = (x[c[b]:c[b + 1]].permute(1, 0, 2) for x, c in ((q, cu_q), (k, cu_k), (v, cu_k)))
        if upcast:
            qs, ks, vs = qs.double(), ks.double(), vs.double()
        s = None if slopes is None else (slopes if slopes.dim() == 1 else slopes[b])
        m = None if mask is None else mask[b, :, :qs.shape[-2], :ks.shape[-2]]
        o, lse = attention_ref(qs, ks, vs, upcast=upcast, alibi_slopes=s, dropout_mask=m, **kwargs)
        outs.append(o.permute(1, 0, 2))
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses, dim=-1)


def failed_checks(o, lse, grads, inputs, do, reference, factor=2.0, packed=False) -> list[str]:
    """Bound a call's O, L and gradients of `inputs` (q, k, v) against `reference(q, k, v, upcast) -> (o, lse)`
    in float64, each by `factor` times the error of the same reference run in the inputs' precision; also
    L = -inf exactly on the rows that see no key. `packed`: flash_attention_varlen's layouts (o (total, H,
    D), lse (H, total)). Returns the failures, as text."""
    q, k, v = inputs
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in inputs)
    o64, lse64 = reference(q64, k64, v64, True)
    ref_grads = torch.autograd.grad(o64, (q64, k64, v64), do.double(), allow_unused=True, retain_graph=True)
    slack = backward_rounding_slack(o, do, o64, lse64, (q64, k64, v64), packed) if o.numel() else [0.0] * 3
    low_o, low_lse = reference(q, k, v, False)
    low_grads = torch.autograd.grad(low_o, (q, k, v), do, allow_unused=True)
    finite = torch.isfinite(lse64)
    checks = [bounded("O", o, o64, low_o, q.dtype, factor),
              bounded("L", lse[finite], lse64[finite], low_lse[finite], q.dtype, factor)]
    for name, g, ref, low, extra in zip(("dQ", "dK", "dV"), grads, ref_grads, low_grads, slack, strict=True):
        zero = torch.zeros_like(g)  # a tensor the reference does not reach (no key visible) has zero gradient
        checks.append(bounded(name, g, zero if ref is None else ref, zero if low is None else low, q.dtype, factor,
                              extra))
    failed = [str(c) for c in checks if not c.ok]
    if not torch.equal(torch.isneginf(lse), ~finite):
        failed.append("L is -inf on other rows than those that see no key")
    return failed
