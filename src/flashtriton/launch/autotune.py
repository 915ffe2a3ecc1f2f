"""Autotuning: the candidates of the forward and of the backward's two kernels, and launching through
Triton's autotuner.

Each autotuner times the candidates of the head dim's width class once per (head dim, mask, variants,
dtype, sequence-length bucket) and, with `cache_results=True`, stores its pick in Triton's cache
directory, so that later processes skip the timing (docs/tuning.md measures what a first call costs).
There are two autotuners per kernel: with tensor descriptors at hand (a Hopper GPU and aligned tensors)
the candidates include the TMA ones; without, pointer loads only. They are made on first use and owned
by the cache (cache.py), keyed by the kernel they launch.
"""

from __future__ import annotations

import functools
import os
import time

import torch
import triton
import triton.testing
from triton.runtime.jit import KernelInterface

from .. import _interpreter
from ..cache import CACHE
from .arguments import COMPILE_OPTIONS, next_power_of_2
from .tiles import (
    TileConfig,
    backward_configs,
    forward_config,
    row_bytes,
    shared_memory_limit,
    why_pruned,
    why_pruned_backward,
)

# The forward's candidates per row width (BLOCK_D * itemsize), (TileConfig: BLOCK_M, BLOCK_N, warps, stages,
# TMA): on TMA, the winners of an interleaved A/B over the paper suite's shapes (64 x 128 at D=64 and
# 64 x 64 at D=128 beat the tiles the first sweeps picked; 128 x 64 stays for the D=64 causal rows at
# N <= 2048, which it wins by 1-2%); on pointer loads, the sweeps' winners at N=4096 (docs/tuning.md).
# Every launch through an autotuner sets the descriptors' boxes to its own tiles (WithDescriptorBoxes),
# so TMA candidates of different tiles sit side by side. D=256 was not swept: its candidates are the
# static choice and neighbours that fit shared memory.
FORWARD_CANDIDATES: dict[int, list[TileConfig]] = {
    128: [TileConfig(64, 128, 4, 2, True), TileConfig(128, 64, 4, 3, True),
          TileConfig(128, 64, 4, 3), TileConfig(128, 64, 8, 4), TileConfig(64, 128, 4, 2)],
    256: [TileConfig(64, 64, 4, 3, True), TileConfig(128, 64, 8, 3, True),
          TileConfig(128, 32, 8, 3), TileConfig(128, 64, 8, 3)],
    512: [TileConfig(64, 32, 4, 1, True), TileConfig(64, 32, 4, 2, True), TileConfig(64, 32, 4, 1),
          TileConfig(64, 64, 4, 2), TileConfig(128, 32, 8, 2)],
}

# The backward kernels' candidates, from their sweeps (cs336's shape at D=64, the paper's N=4096 at D=128,
# both masks; benchmarks/results/h200/sweeps/sweep_dkdv_*, sweep_dq_*): the best TMA configs and the best
# pointer-load ones. At D=64, dK/dV's 64 x 64 TMA tile capped at 168 registers, so that three blocks share
# an SM, is 12-14% ahead on the causal rows; the uncapped one stays for the variants that the cap would
# spill (softcap, ALiBi, dropout: 376-568 bytes). At D=128 causal, dK/dV's 64 x 64 tile with two stages on
# TMA wins since it runs one loop (7-13% ahead of 64 x 128 with 8 warps). dQ tiles of 128 keys lost.
# D=256 was not swept. Its static tiles spill (dK/dV 272-688 bytes, dQ 192-232, compiled offline), so beside
# them sit the tiles the resource model passes that ptxas compiles without a spill (docs/performance.md,
# entry 101): dK/dV on 32 resident keys and 16 query rows (mma.sync: wgmma wants 64 rows per warpgroup;
# 32 query rows spill 16 bytes causal), dQ on 128 query rows with two warpgroups (wgmma) or on 32; the
# autotuner times them on the GPU it runs on.
BACKWARD_CANDIDATES: dict[str, dict[int, list[TileConfig]]] = {
    "dkdv": {128: [TileConfig(64, 64, 4, 3, True, max_registers=168), TileConfig(64, 64, 4, 3, True),
                   TileConfig(32, 64, 4, 3), TileConfig(64, 64, 4, 3)],
             256: [TileConfig(64, 64, 4, 2, True), TileConfig(64, 64, 4, 3, True),
                   TileConfig(64, 64, 4, 2), TileConfig(64, 128, 8, 3), TileConfig(64, 128, 8, 2)],
             512: [TileConfig(16, 64, 8, 1), TileConfig(16, 32, 4, 1)]},
    "dq": {128: [TileConfig(128, 64, 8, 3, True), TileConfig(128, 64, 4, 3, True),
                 TileConfig(128, 64, 4, 3), TileConfig(64, 64, 4, 3)],
           256: [TileConfig(128, 64, 8, 3, True), TileConfig(128, 64, 8, 2, True),
                 TileConfig(128, 64, 8, 3), TileConfig(64, 64, 4, 2)],
           512: [TileConfig(64, 16, 8, 1), TileConfig(128, 16, 8, 1), TileConfig(32, 32, 4, 1)]},
}

# Below this much work (B * Hq * Nq * Nk * D) a forward takes tens of microseconds, the static table is
# within noise of the best config, and the autotuner's own host cost (it keys every call) would show.
# The backward uses the same threshold.
AUTOTUNE_MIN_WORK = 2**34


def autotune_by_default(work: int) -> bool:
    """Autotune calls of at least AUTOTUNE_MIN_WORK (B * Hq * Nq * Nk * D), unless the environment sets
    FLASHTRITON_AUTOTUNE=0: then every call takes the static tiles, so that outputs do not depend on what
    a machine's timing picked (different tiles sum in a different order)."""
    return work >= AUTOTUNE_MIN_WORK and os.environ.get("FLASHTRITON_AUTOTUNE", "1") != "0"


def width_class(head_dim: int, dtype: torch.dtype) -> int:
    width = row_bytes(head_dim, dtype)
    return next(w for w in sorted(FORWARD_CANDIDATES) if width <= w)


def candidates(kernel: str, head_dim: int, dtype: torch.dtype) -> list[TileConfig]:
    """The candidates of `kernel` ("fwd", "dkdv", "dq") for this head dim's width class."""
    return (FORWARD_CANDIDATES if kernel == "fwd" else BACKWARD_CANDIDATES[kernel])[width_class(head_dim, dtype)]


@functools.cache  # on every autotuned call's host path
def tma_candidate_tile(kernel: str, head_dim: int, dtype: torch.dtype) -> tuple[int, int] | None:
    """(BLOCK_M, BLOCK_N) of the first TMA candidate of `kernel` ("fwd", "dkdv", "dq") for this width, or
    None if it has none (the launch then takes the autotuner without descriptors). The launcher builds the
    descriptors at this tile; each autotuned launch resets their boxes to its own tiles."""
    return next(((c.block_m, c.block_n) for c in candidates(kernel, head_dim, dtype) if c.use_tma), None)


def tile_config_of(config: triton.Config) -> TileConfig:
    """The TileConfig that one of the autotuner's configs stands for."""
    kw = config.kwargs
    return TileConfig(kw["BLOCK_M"], kw["BLOCK_N"], config.num_warps, config.num_stages, kw["USE_TMA"],
                      kw.get("WARP_SPECIALIZE", False), max_registers=config.maxnreg)


_GPU = torch.device("cuda")  # the static tables' GPU rows are the fallback (the interpreter runs them too)


def _keep_candidates(configs: list[triton.Config], wanted: list[TileConfig], fits, fallback: TileConfig,
                     ) -> list[triton.Config]:
    """The autotuner's configs that stand for `wanted` TileConfigs and fit; else the static fallback."""
    kept = [config for config in configs if (cfg := tile_config_of(config)) in wanted and fits(cfg)]
    if not kept:
        kept = [c for c in configs if tile_config_of(c) == fallback][:1] or configs[:1]
    return kept


def prune_forward(configs: list[triton.Config], named_args: dict, **meta) -> list[triton.Config]:
    """Keep the candidates of this head dim's width class that fit the GPU (at least the static config)."""
    q, head_dim = named_args["Q"], meta["HEAD_DIM"]
    smem = shared_memory_limit(q.device)
    return _keep_candidates(configs, candidates("fwd", head_dim, q.dtype),
                            lambda cfg: why_pruned(cfg, head_dim, q.dtype, smem) is None,
                            forward_config(head_dim, q.dtype, _GPU, use_tma=False))


def backward_pruner(kernel: str):
    def prune(configs: list[triton.Config], named_args: dict, **meta) -> list[triton.Config]:
        """Keep this backward kernel's candidates for the head dim's width class that fit the GPU."""
        q, head_dim = named_args["Q"], meta["HEAD_DIM"]
        smem = shared_memory_limit(q.device)
        static = backward_configs(head_dim, q.dtype, _GPU)[0 if kernel == "dkdv" else 1]
        return _keep_candidates(configs, candidates(kernel, head_dim, q.dtype),
                                lambda cfg: why_pruned_backward(kernel, cfg, head_dim, q.dtype, smem) is None
                                or cfg == static, static)
    return prune


def triton_configs(tiles: list[TileConfig], with_tma: bool, forward: bool) -> list[triton.Config]:
    unique = dict.fromkeys(c for c in tiles if with_tma or not c.use_tma)
    return [triton.Config({"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "USE_TMA": c.use_tma,
                           **({"WARP_SPECIALIZE": c.warp_specialize} if forward else {})},
                          num_warps=c.num_warps, num_stages=c.num_stages, maxnreg=c.max_registers)
            for c in unique]


def seqlen_bucket(seqlen_q: int, seqlen_k: int) -> int:
    """The autotuner's sequence-length key: the longer length rounded up to a power of two, so that a
    new length retunes only when it crosses a power of two."""
    return next_power_of_2(max(seqlen_q, seqlen_k))


def _time_config(kernel_call, quantiles):
    """The autotuner's timer: medians of a shorter run than do_bench's default (25 ms warm-up, 100 ms),
    which is plenty to rank configs whose kernels take a millisecond. The interpreter has no GPU to time:
    there one call stands in, so that the tests can run the autotuner's machinery."""
    if _interpreter.is_active():
        start = time.perf_counter()
        kernel_call()
        return [time.perf_counter() - start] * len(quantiles)
    return triton.testing.do_bench(kernel_call, warmup=10, rep=40, quantiles=quantiles)


class WithDescriptorBoxes(KernelInterface):
    """A kernel as its autotuner launches it: each launch first sets the tensor descriptors' boxes to the
    launched config's tiles (Q and O or dO rows: BLOCK_M; K and V rows: BLOCK_N), so that TMA candidates of
    different tiles share the one set of descriptors that the launcher built. An autotuner's own pre_hook
    would not do: Triton calls it while timing, but not before launching a pick it found in its disk
    cache; and a config's pre_hook turns that cache off."""

    BOXES = {"desc_q": "BLOCK_M", "desc_o": "BLOCK_M", "desc_do": "BLOCK_M", "desc_k": "BLOCK_N", "desc_v": "BLOCK_N",
             "desc_lse2": "BLOCK_M", "desc_delta": "BLOCK_M"}

    def __init__(self, kernel):
        self.fn = kernel  # Triton's autotuner finds the JIT function (its cache key) through .fn
        self.arg_names = kernel.arg_names
        self.boxes = [(kernel.arg_names.index(name), block) for name, block in self.BOXES.items()
                      if name in kernel.arg_names]

    def run(self, *args, **kwargs):
        for index, block in self.boxes:
            desc = args[index]
            if desc is not None:
                desc.block_shape = [1, 1, kwargs[block], *desc.block_shape[3:]]  # (B, H, N[, D]) descriptors
        return self.fn.run(*args, **kwargs)


def _all(candidates_by_width: dict[int, list[TileConfig]]) -> list[TileConfig]:
    return [c for configs in candidates_by_width.values() for c in configs]


def autotuner(which: str, kernel, with_tma: bool):
    """The autotuner that launches `kernel` as `which` ("fwd", "dkdv" or "dq"), with or without the TMA
    candidates. The backward kernels overwrite their outputs, so timing them on the real arguments is
    harmless; the dtypes of the tensor arguments join the key automatically."""
    key = (kernel, with_tma)
    tuner = CACHE.autotuners.get(key)
    if tuner is None:
        by_width = FORWARD_CANDIDATES if which == "fwd" else BACKWARD_CANDIDATES[which]
        tuner = triton.autotune(
            configs=triton_configs(_all(by_width), with_tma, forward=which == "fwd"),
            key=["HEAD_DIM", "MASK_LEFT", "MASK_RIGHT", "SOFTCAP", "ALIBI", "VARLEN", "DROPOUT", "INPUT_PRECISION",
                 "tuning_seqlen"],
            prune_configs_by={"early_config_prune": prune_forward if which == "fwd" else backward_pruner(which)},
            do_bench=_time_config,
            cache_results=True,
        )(WithDescriptorBoxes(kernel) if with_tma else kernel)
        CACHE.autotuners[key] = tuner
    return tuner


def run_autotuned(tuner, grid, args: tuple, meta: dict, dtype: torch.dtype, bucket: int) -> tuple:
    """tuner[grid](*args, **meta); returns the config that ran, and the compiled kernel it launched with
    that config's launch keywords (for a recorded launch), or None for the call that ran the autotuner.
    Triton's Autotuner rebuilds its key from every argument of every call (~40 µs of host time for these
    kernels' ~50 arguments). The launch's constexprs (`meta`), input dtype and length bucket determine
    that key (the other tensors' dtypes are fixed), so once they have been through the autotuner, its
    pick is launched straight away."""
    key = (tuner, *meta.values(), dtype, bucket)
    picked = CACHE.picks.get(key)
    if picked is None:
        tuner[grid](*args, **meta, **COMPILE_OPTIONS)
        CACHE.picks[key] = tuner.best_config, tuner.best_config.all_kwargs()
        return tuner.best_config, None
    config, config_kwargs = picked
    compiled = tuner.fn[grid](*args, **meta, **config_kwargs, **COMPILE_OPTIONS)
    return config, (compiled, config_kwargs)
