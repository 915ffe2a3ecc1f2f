"""Launching a compiled kernel again without Triton's per-call work.

`kernel[grid](*args, **kwargs)` (Triton's JITFunction.run) binds and specialises every argument, looks the
compiled kernel up by that key, checks the kernel's globals and launch hooks, then launches: tens of
microseconds of host time per launch for kernels with ~50 arguments. A small backward is three launches
whose GPU time is a few hundred microseconds, so that host time decides how fast it runs
(docs/performance.md, "Host time"); a small forward likewise.

A `Recorded` launch keeps what one such launch found: the compiled kernel, the grid, and every argument
that is not a tensor (the scalars, the constexprs, the defaults). Replaying it passes the call's tensors
and the kept rest straight to the compiled kernel's launcher. That is only valid for a call that Triton
would specialise the same way, so a plan is replayed only for a call whose `plan_key` equals the
recording call's: equal shapes, strides, 16-byte alignments, dtypes and options fix every scalar
argument and every specialisation.
"""

from __future__ import annotations

import inspect
from typing import NamedTuple

import torch
from triton import knobs
from triton.runtime import driver

from ..cache import CACHE
from .arguments import input_precision
from .descriptors import descriptor


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

    def arguments(self, prefix: tuple, scalars: tuple | None = None) -> tuple:
        """Every argument in signature order: `prefix`, then the recorded scalars (or, where the launcher
        passes them, this call's `scalars` in their place: values that Triton specialises the same way),
        then the constexprs."""
        return (*prefix, *self.suffix) if scalars is None else (*prefix, *scalars, *self.suffix[len(scalars):])

    def launch_grid(self, grid: tuple | None = None) -> tuple:
        return self.grid if grid is None else tuple(grid) + (1,) * (3 - len(grid))

    def replay(self, prefix: tuple, stream: int, scalars: tuple | None = None, grid: tuple | None = None) -> None:
        c = self.compiled
        c.run(*self.launch_grid(grid), stream, c.function, c.packed_metadata, None, None, None,
              *self.arguments(prefix, scalars))


class RecordedLaunch(NamedTuple):
    """A Recorded launch and how to rebuild its tensor descriptors over a later call's tensors: each
    descriptor's (shape, strides, box) in `layout`, None without TMA; `count` of them. The shape is kept
    rather than read off the later tensor because a descriptor may view its tensor in other dims (the FP8
    forward's 5-D K, launch/gluon_forward.py); an equal plan key makes it the later call's too."""
    recorded: Recorded
    layout: tuple | None
    count: int

    @classmethod
    def of(cls, jit_fn, compiled, grid_dims: tuple, args: tuple, kwargs: dict, tensor_count: int,
           descs: tuple) -> RecordedLaunch:
        """The launch of `compiled` that took `args`: `tensor_count` tensors (or Nones), then `descs`."""
        layout = (None if not descs or descs[0] is None
                  else tuple((list(d.shape), d.strides, d.block_shape) for d in descs))
        return cls(Recorded(jit_fn, compiled, grid_dims, args, kwargs, tensor_count + len(descs)), layout,
                   len(descs))

    def replay(self, tensors: tuple, desc_sources: tuple, stream: int, scalars: tuple | None = None,
               grid: tuple | None = None) -> None:
        """Launch again with this call's tensors, and descriptors of the first `count` of `desc_sources`
        (and this call's scalars and grid, where the launcher's plan key leaves them free)."""
        if self.layout is None:
            descs = (None,) * self.count
        else:
            descs = tuple(descriptor(t, strides, box, shape)
                          for t, (shape, strides, box) in zip(desc_sources[:self.count], self.layout, strict=True))
        self.recorded.replay((*tensors, *descs), stream, scalars, grid)


class Plan(NamedTuple):
    """A forward's or backward's launches as recorded, in launch order, and the choice they replay as."""
    launches: dict[str, RecordedLaunch]
    choice: object

    def replay(self, tensors: dict[str, tuple], stream: int) -> None:
        """`tensors`: {launch name: (tensors, descriptor sources[, scalars, grid])}."""
        for name, launch in self.launches.items():
            given = tensors[name]
            launch.replay(given[0], given[1], stream, *given[2:])


def replayable(device: torch.device) -> bool:
    """Whether launches on `device` may be recorded and replayed: a CUDA device without Triton's
    interpreter (TRITON_INTERPRET=1 runs the kernels' Python, on CUDA tensors too: nothing is compiled),
    and no launch hooks (a profiler's hooks need Triton's own launch path)."""
    return (CACHE.replays and device.type == "cuda" and not knobs.runtime.interpret
            and _no_hooks(knobs.runtime.launch_enter_hook) and _no_hooks(knobs.runtime.launch_exit_hook))


def _no_hooks(hook) -> bool:
    # Triton 3.6 keeps an always-present chain of hooks (HookChain), empty unless a tool adds one.
    return hook is None or not getattr(hook, "calls", True)


def current_device_and_stream() -> tuple[int, int]:
    """The CUDA device Triton itself would launch on (torch's current one) and the raw handle of its
    current stream."""
    device = driver.active.get_current_device()
    return device, driver.active.get_current_stream(device)


def plan_key(device: int, tensors: tuple, *options) -> tuple:
    """Everything a call's launches depend on except what its tensors hold: each input's (or None's)
    shape, strides, dtype and 16-byte alignment, the device, float32's matmul precision and the call's
    options (the outputs are allocated from these). Two calls with equal keys bind every kernel argument
    to the same scalars and Triton specialises them the same way, so the second may replay the first's
    launches."""
    layout = tuple([None if t is None else (t.shape, t.stride(), t.dtype, t.data_ptr() % 16 == 0) for t in tensors])
    return (device, layout, input_precision(tensors[0].dtype), *options)


def int_specialization(values: tuple[int, ...]) -> tuple:
    """How Triton specialises each int argument (its 32- or 64-bit type, whether it is 1, whether 16
    divides it): integer arguments that are equal here compile to the same kernel, so a plan key may
    hold this instead of their values, and the replay pass the values (the decode launcher's lengths and
    strides, which a growing cache changes on every step)."""
    return tuple([(-2**31 <= v < 2**31, v == 1, v % 16 == 0) for v in values])
