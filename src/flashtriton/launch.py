"""Launching a compiled kernel again without Triton's per-call work (NOTES entry 39).

`kernel[grid](*args, **kwargs)` (Triton's JITFunction.run) binds and specialises every argument, looks the
compiled kernel up by that key, checks the kernel's globals and launch hooks, then launches: tens of
microseconds of host time per launch on the H200 machine's CPU, for kernels with ~50 arguments. A small
backward is three launches, and its GPU time is a few hundred microseconds, so that host time decides how
fast it runs (NOTES entries 37 and 39); a small forward likewise.

A `Recorded` launch keeps what one such launch found: the compiled kernel, the grid, and every argument
that is not a tensor (the scalars, the constexprs, the defaults). Replaying it passes the call's tensors
and the kept rest straight to the compiled kernel's launcher. It is only valid for a call that Triton
would have specialised the same way: the caller (ops) replays a plan only for a call whose shapes,
strides, 16-byte alignments, dtypes and options all equal those of the call that recorded it, which fixes
every scalar argument and every specialisation.
"""

from __future__ import annotations

import inspect

import torch
from triton import knobs
from triton.runtime import driver

# Set False to launch every kernel through Triton's JITFunction.run (A/B timing, tests).
ENABLED = True

# plan key (ops) -> the plan's recorded launches; emptied by `forget`, and when it grows past PLAN_LIMIT
# (a workload whose shapes never repeat would otherwise grow it without bound).
PLANS: dict = {}
PLAN_LIMIT = 512


class Recorded:
    """One kernel launch, minus its tensors: `replay(prefix, stream)` launches the same compiled kernel
    on the same grid with `prefix` (the per-call tensors, tensor descriptors and Nones, in the positions
    they had) followed by the recorded scalars and constexprs."""

    __slots__ = ("jit_fn", "compiled", "grid", "suffix")

    def __init__(self, jit_fn, compiled, grid: tuple, args: tuple, kwargs: dict, prefix_length: int):
        # The launcher takes every parameter in signature order, constexprs and defaults included, as
        # JITFunction.run passes them; kwargs that are not parameters (num_warps, ...) are compile options.
        params = list(inspect.signature(jit_fn.fn).parameters.values())[len(args):]
        tail = tuple(kwargs[p.name] if p.name in kwargs else p.default for p in params)
        self.jit_fn, self.compiled = jit_fn, compiled  # (the kernel: tests replay it through the interpreter)
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.suffix = (*args[prefix_length:], *tail)

    def replay(self, prefix: tuple, stream: int) -> None:
        c = self.compiled
        c.run(*self.grid, stream, c.function, c.packed_metadata, None, None, None, *prefix, *self.suffix)


def replayable(device: torch.device) -> bool:
    """Whether launches on `device` may be recorded and replayed: a CUDA device without Triton's
    interpreter (TRITON_INTERPRET=1 runs the kernels' Python, on CUDA tensors too: nothing is compiled),
    and no launch hooks (a profiler's hooks need Triton's own launch path)."""
    return (ENABLED and device.type == "cuda" and not knobs.runtime.interpret
            and _no_hooks(knobs.runtime.launch_enter_hook) and _no_hooks(knobs.runtime.launch_exit_hook))


def _no_hooks(hook) -> bool:
    # Triton 3.6 keeps an always-present chain of hooks (HookChain), empty unless a tool adds one.
    return hook is None or not getattr(hook, "calls", True)


def current_device_and_stream() -> tuple[int, int]:
    """The CUDA device Triton itself would launch on (torch's current one) and the raw handle of its
    current stream."""
    device = driver.active.get_current_device()
    return device, driver.active.get_current_stream(device)


def remember(key, plan) -> None:
    if len(PLANS) >= PLAN_LIMIT:
        PLANS.clear()
    PLANS[key] = plan


def forget() -> None:
    """Drop every recorded plan (tests that change the autotuners' candidates or picks)."""
    PLANS.clear()
