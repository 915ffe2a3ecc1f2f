"""Running a call's launches: each launcher (forward.py, backward.py) builds a list of `LaunchSpec`s,
and `run` takes them through one of three paths:

- replayed: a call like an earlier one (equal plan key, replay.py) relaunches that call's compiled
  kernels with this call's tensors, and builds nothing;
- static: the spec names its tiles; `kernel[grid](...)` through Triton;
- autotuned: the spec names an autotuner; its pick is launched (autotune.py).

The static and autotuned paths record what they launched, so that the next such call replays it. What
ran (tiles, replayed or not) is kept as a `Choice` in the cache, under "forward" or "backward".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import triton

from ..cache import CACHE
from .arguments import COMPILE_OPTIONS
from .autotune import run_autotuned, tile_config_of
from .replay import Plan, RecordedLaunch


class LaunchSpec(NamedTuple):
    """One kernel launch, built and not yet run: `kernel[grid(meta)](*tensors, *descriptors, *scalars, **meta)`
    with the static tiles' keywords in `config`, or through `autotuner` when it is set."""
    name: str  # which launch of the call it is ("fwd"; "stats", "dkdv", "dq")
    kernel: object  # the @triton.jit function
    grid: Callable[[dict], tuple[int, ...]]
    tensors: tuple  # per call: the tensors, and Nones for variants that are off
    descriptors: tuple  # per call: the TMA descriptors, or Nones
    scalars: tuple  # sizes, strides, scales: fixed by the plan key
    meta: dict  # constexprs that every config shares
    config: dict | None = None  # the static tiles' launch keywords
    tiles: tuple | None = None  # (those tiles, whether the tensors allowed TMA): the choice to log
    autotuner: object = None
    tune_key: tuple = ()  # (dtype, length bucket): the rest of the autotuner's key


class Choice(NamedTuple):
    """The tiles of a call's tiled kernels (the forward's; or the backward's dK/dV and dQ), each the
    autotuner's triton.Config, a static (TileConfig, whether the tensors allowed TMA), or None where that
    kernel did not run; and whether the call replayed a recorded plan. Kept raw, and named only when read:
    naming costs the hot path microseconds."""
    picks: tuple
    replayed: bool = False

    def names(self) -> list[str]:
        return [_name(p) for p in self.picks]

    def __str__(self) -> str:
        names = self.names()
        return names[0] if len(names) == 1 else f"dK/dV {names[0]}, dQ {names[1]}"


def last_choice(entry: str) -> Choice | None:
    """What the latest "forward" or "backward" ran, for logs."""
    return CACHE.last.get(entry)


def replay_recorded(entry: str, key, tensors: dict[str, tuple[tuple, tuple]], stream: int) -> bool:
    """Replay the plan recorded under `key` on `stream` (a raw CUDA stream handle) with this call's
    `tensors` ({launch name: (tensors, descriptor sources)}); False when there is none (or `key` is None:
    replays are off)."""
    plan = CACHE.plans.get(key) if key is not None else None
    if plan is None:
        return False
    plan.replay(tensors, stream)
    CACHE.last[entry] = plan.choice
    return True


def run(entry: str, key, specs: list[LaunchSpec], picks: tuple[str, ...]) -> None:
    """Launch `specs` in order through Triton (static tiles or an autotuner), and record them as the plan
    for `key` (None: do not record) when every one of them could be: not so for a call that ran an
    autotuner's timing. `picks` names the tiled launches whose tiles the Choice reports (none: no log entry)."""
    launches: dict[str, RecordedLaunch] = {}
    chosen: dict[str, object] = {}
    for spec in specs:
        args = (*spec.tensors, *spec.descriptors, *spec.scalars)
        if spec.autotuner is None:
            kwargs = {**spec.meta, **(spec.config or {}), **COMPILE_OPTIONS}
            dims = spec.grid(kwargs)
            compiled = spec.kernel[dims](*args, **kwargs)
            chosen[spec.name] = spec.tiles
        else:
            chosen[spec.name], launched = run_autotuned(spec.autotuner, spec.grid, args, spec.meta, *spec.tune_key)
            if launched is None:  # this call ran the autotuner's timing: nothing to record
                key = None
                continue
            compiled, config_kwargs = launched
            kwargs, dims = {**spec.meta, **config_kwargs}, spec.grid(config_kwargs)
        if key is not None:
            launches[spec.name] = RecordedLaunch.of(spec.kernel, compiled, dims, args, kwargs, len(spec.tensors),
                                                    spec.descriptors)
    choice = Choice(tuple(map(chosen.get, picks)))
    if picks:
        CACHE.last[entry] = choice
    if key is not None:
        CACHE.remember_plan(key, Plan(launches, choice._replace(replayed=True)))


def _name(pick) -> str:
    if pick is None:
        return "not run"
    if isinstance(pick, str):  # a kernel outside the tiled Triton set (the Gluon forward), by name
        return pick
    if isinstance(pick, triton.Config):
        return tile_config_of(pick).name
    tiles, use_tma = pick  # a static TileConfig, with its TMA paths as far as the tensors allowed them
    return dataclasses.replace(tiles, use_tma=tiles.use_tma and use_tma,
                               warp_specialize=tiles.warp_specialize and use_tma).name
