"""Tile configurations: the static tables, the resource model that prunes configurations, and the
autotuners of the forward and of the backward's two kernels.

Small problems take the static tables (`forward_config`, `backward_configs`): their kernels run for
microseconds, and picking a config costs host time. Large ones go through `attn_fwd_autotuned`,
`attn_bwd_dkdv_autotuned` and `attn_bwd_dq_autotuned`, which time the sweeps' winners for the head dim
at hand once per (head dim, mask, dtype, sequence-length bucket) and, with `cache_results=True`, store
the choice in Triton's cache directory, so that later processes skip the timing (docs/tuning.md measures
what a first call costs).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch
import triton
import triton.testing
from triton.runtime.jit import KernelInterface

from . import _interpreter, launch
from .kernels.backward import attn_bwd_dkdv_kernel, attn_bwd_dq_kernel
from .kernels.forward import attn_fwd_kernel


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 1
    use_tma: bool = False  # tensor descriptors (Hopper's TMA copy engine) instead of block pointers
    # producer/consumer warp groups for the unmasked loop (needs use_tma). With Triton 3.6 on sm_90 it
    # fails to compile at 4 warps and changes nothing at 8 (the same SASS; NOTES entry 25): swept, not tuned.
    warp_specialize: bool = False
    qk_ahead: bool = False  # the unmasked loop issues the next q @ k^T before this tile's softmax
    # registers per thread that ptxas may use (its .maxnreg), None for its own choice: a cap that lets one
    # more block share the SM's 64K registers (65536 / (3 blocks * 128 threads) -> 168) can pay more than
    # the few bytes it spills (NOTES entry 38)
    max_registers: int | None = None

    @property
    def name(self) -> str:
        return (f"M{self.block_m}-N{self.block_n}-w{self.num_warps}-s{self.num_stages}"
                f"{'-tma' if self.use_tma else ''}{'-ws' if self.warp_specialize else ''}"
                f"{'-qka' if self.qk_ahead else ''}{f'-r{self.max_registers}' if self.max_registers else ''}")


def block_d(head_dim: int) -> int:
    """The head dim padded to a power of two, at least 16 (tl.dot's smallest reduction)."""
    return max(16, 1 << (head_dim - 1).bit_length())


def row_bytes(head_dim: int, dtype: torch.dtype) -> int:
    """Bytes of one row of a Q/K/V tile in shared memory: what sets the tile sizes."""
    return block_d(head_dim) * dtype.itemsize


# ------------------------------------------------------------------------------------------ static table

def forward_config(head_dim: int, dtype: torch.dtype, device: torch.device, use_tma: bool) -> TileConfig:
    """The forward's tiles for problems too small to autotune: the sweeps' winners
    (benchmarks/results/h200/sweeps/, docs/tuning.md), per data path."""
    return _forward_config(head_dim, dtype, device.type, use_tma)


@functools.cache
def _forward_config(head_dim: int, dtype: torch.dtype, device_type: str, use_tma: bool) -> TileConfig:
    if device_type != "cuda":
        # The interpreter: small, unequal tiles keep it fast and exercise every loop split.
        return TileConfig(block_m=32, block_n=16, use_tma=use_tma)
    width = row_bytes(head_dim, dtype)
    # TMA: the interleaved A/B of NOTES entry 36 (benchmarks/results/h200/ab_forward_tiles/); block
    # pointers: the sweeps.
    if width <= 128:  # D <= 64 in 16 bits
        return TileConfig(64, 128, 4, 2, True) if use_tma else TileConfig(128, 64, num_warps=4, num_stages=3)
    if width <= 256:  # D = 128 in 16 bits
        return TileConfig(64, 64, 4, 3, True) if use_tma else TileConfig(128, 64, num_warps=8, num_stages=3)
    return TileConfig(64, 32, num_warps=4, num_stages=1, use_tma=use_tma)  # D = 256


def backward_configs(head_dim: int, dtype: torch.dtype, device: torch.device) -> tuple[TileConfig, TileConfig]:
    """(dK/dV config, dQ config) for problems too small to autotune: the backward sweeps' best block-pointer
    tiles (benchmarks/results/h200/sweeps/sweep_dkdv_*, sweep_dq_*). dK/dV keeps BLOCK_N key rows resident
    and streams BLOCK_M query rows; dQ the reverse."""
    if device.type != "cuda":
        return TileConfig(block_m=16, block_n=32), TileConfig(block_m=32, block_n=16)
    width = row_bytes(head_dim, dtype)
    if dtype.itemsize == 4 and width <= 256:
        # float32 (D <= 64): IEEE products run on the FMA units with their operands in registers; these
        # are the tiles that do not spill (`inspect --dtypes fp32`; the 16-bit tiles spill 9-17 KB).
        return (TileConfig(block_m=16, block_n=64, num_warps=4, num_stages=1),
                TileConfig(block_m=64, block_n=16, num_warps=4, num_stages=1))
    if width <= 128:  # dQ: 64 x 64 ties the best block-pointer tile (128 x 64, 4.64 ms) without its spill
        return (TileConfig(block_m=32, block_n=64, num_warps=4, num_stages=3),
                TileConfig(block_m=64, block_n=64, num_warps=4, num_stages=3))
    if width <= 256:
        return (TileConfig(block_m=64, block_n=64, num_warps=4, num_stages=2),
                TileConfig(block_m=128, block_n=64, num_warps=8, num_stages=3))
    # D = 256, not swept: dK and dV of 64 rows need two warp groups to stay in registers
    return (TileConfig(block_m=16, block_n=64, num_warps=8, num_stages=1),
            TileConfig(block_m=64, block_n=16, num_warps=8, num_stages=1))


# ---------------------------------------------------------------------------------------- resource model

SPILL_GUARD = 160  # fp32 registers per thread the two [BLOCK_M, *] tiles may take, leaving room for the rest


def shared_memory_bytes(cfg: TileConfig, head_dim: int, dtype: torch.dtype) -> int:
    """Q tile once, K and V tiles num_stages deep each, plus the P tile staged for the second dot."""
    d = row_bytes(head_dim, dtype)
    return cfg.block_m * d + 2 * cfg.num_stages * cfg.block_n * d + cfg.block_m * cfg.block_n * dtype.itemsize


def accumulator_registers(cfg: TileConfig, head_dim: int) -> float:
    """fp32 registers per thread held by the output accumulator and the score tile (two with qk_ahead)."""
    score_tiles = 2 if cfg.qk_ahead else 1
    return (cfg.block_m * block_d(head_dim) + score_tiles * cfg.block_m * cfg.block_n) / (32 * cfg.num_warps)


def why_pruned(cfg: TileConfig, head_dim: int, dtype: torch.dtype, smem_limit: int) -> str | None:
    """Why `cfg` cannot run well for this head dim and dtype (docs/tuning.md), or None if it can."""
    smem = shared_memory_bytes(cfg, head_dim, dtype)
    if smem > smem_limit:
        return f"{smem // 1024} KB of shared memory > {smem_limit // 1024} KB"
    if accumulator_registers(cfg, head_dim) > SPILL_GUARD:
        return f"{accumulator_registers(cfg, head_dim):.0f} accumulator registers per thread would spill"
    if cfg.warp_specialize and not cfg.use_tma:
        return "warp specialisation needs the TMA loads"
    if cfg.warp_specialize and cfg.num_warps < 8:
        # Triton 3.6's warp-specialisation pass fails on sm_90 with 4 warps (seen on the H200).
        return "warp specialisation needs 8 warps here"
    if cfg.warp_specialize and dtype.itemsize != 2:
        return "warp specialisation was only measured with 16-bit inputs"
    if cfg.qk_ahead and cfg.warp_specialize:
        return "qk_ahead orders the loop by hand; warp specialisation would reorder it again"
    if cfg.block_m == 64 and cfg.num_warps == 8:
        # wgmma works on 64-row slabs, one per 4-warp group: a second group would have to split the
        # columns and share each row's softmax (the Triton tutorial prunes these too).
        return "8 warps on 64 query rows"
    return None


def backward_shared_memory_bytes(kernel: str, cfg: TileConfig, head_dim: int, dtype: torch.dtype) -> int:
    """dK/dV ("dkdv") keeps a K and a V tile resident and streams Q and dO `num_stages` deep; dQ ("dq") the
    reverse. Plus one [BLOCK_M, BLOCK_N] tile (P or dS) staged for a product."""
    d = row_bytes(head_dim, dtype)
    resident, streamed = (cfg.block_n, cfg.block_m) if kernel == "dkdv" else (cfg.block_m, cfg.block_n)
    return 2 * resident * d + 2 * cfg.num_stages * streamed * d + cfg.block_m * cfg.block_n * dtype.itemsize


def backward_registers(kernel: str, cfg: TileConfig, head_dim: int) -> float:
    """fp32 registers per thread held by the accumulators (dK and dV, or dQ) and two score-sized tiles."""
    resident = cfg.block_n if kernel == "dkdv" else cfg.block_m
    accumulators = (2 if kernel == "dkdv" else 1) * resident * block_d(head_dim)
    return (accumulators + 2 * cfg.block_m * cfg.block_n) / (32 * cfg.num_warps)


BACKWARD_SPILL_GUARD = 200  # the dK/dV kernel's defaults already sit near 255 registers (sm90_kernels.md)


def why_pruned_backward(kernel: str, cfg: TileConfig, head_dim: int, dtype: torch.dtype,
                        smem_limit: int) -> str | None:
    """Why a dK/dV or dQ config cannot run well, or None. Their products have the resident tile's rows as
    wgmma's M, so 8 warps (two warp groups) need at least 128 of them."""
    smem = backward_shared_memory_bytes(kernel, cfg, head_dim, dtype)
    if smem > smem_limit:
        return f"{smem // 1024} KB of shared memory > {smem_limit // 1024} KB"
    regs = backward_registers(kernel, cfg, head_dim)
    if regs > BACKWARD_SPILL_GUARD:
        return f"{regs:.0f} accumulator registers per thread would spill"
    resident = cfg.block_n if kernel == "dkdv" else cfg.block_m
    if cfg.num_warps == 8 and resident < 128:
        return f"8 warps on {resident} resident rows"
    return None


HOPPER_SHARED_MEMORY = 232448  # bytes one block may use on an H100/H200 (227 KB)


def shared_memory_limit(device: torch.device) -> int:
    """Shared memory one block may use on `device`; the interpreter models a Hopper GPU."""
    if device.type != "cuda":
        return HOPPER_SHARED_MEMORY
    return _cuda_shared_memory(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _cuda_shared_memory(index: int) -> int:
    return triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]


# ------------------------------------------------------------------------------------------- autotuning

# The forward's candidates per row width (BLOCK_D * itemsize), (TileConfig: BLOCK_M, BLOCK_N, warps, stages,
# TMA): on TMA, the winners of an interleaved A/B over the paper suite's shapes (NOTES entry 36: 64 x 128
# at D=64 and 64 x 64 at D=128 beat the tiles the first sweeps picked, and 128 x 64 stays for the D=64
# causal rows at N <= 2048 that it wins by 1-2%); on block pointers, the sweeps' winners at N=4096
# (docs/tuning.md). Every launch through an autotuner sets the descriptors' boxes to its own tiles
# (_WithDescriptorBoxes), so TMA candidates of different tiles sit side by side. D=256 was not swept: its
# candidates are the static choice and neighbours that fit shared memory.
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
# block-pointer ones. At D=64, dK/dV's 64 x 64 TMA tile capped at 168 registers, so that three blocks share
# an SM, is 12-14% ahead on the causal rows (NOTES entry 38); the uncapped one stays for the variants that
# the cap would spill (softcap, ALiBi, dropout: 376-568 bytes). At D=128 causal, dK/dV's 64 x 64 tile with
# two stages on TMA wins since it runs one loop (7-13% ahead of 64 x 128 with 8 warps, its best before;
# NOTES entry 33). dQ tiles of 128 keys lost (NOTES entry 35). D=256 keeps its one static config.
BACKWARD_CANDIDATES: dict[str, dict[int, list[TileConfig]]] = {
    "dkdv": {128: [TileConfig(64, 64, 4, 3, True, max_registers=168), TileConfig(64, 64, 4, 3, True),
                   TileConfig(32, 64, 4, 3), TileConfig(64, 64, 4, 3)],
             256: [TileConfig(64, 64, 4, 2, True), TileConfig(64, 64, 4, 3, True),
                   TileConfig(64, 64, 4, 2), TileConfig(64, 128, 8, 3), TileConfig(64, 128, 8, 2)],
             512: [TileConfig(16, 64, 8, 1)]},
    "dq": {128: [TileConfig(128, 64, 8, 3, True), TileConfig(128, 64, 4, 3, True),
                 TileConfig(128, 64, 4, 3), TileConfig(64, 64, 4, 3)],
           256: [TileConfig(128, 64, 8, 3, True), TileConfig(128, 64, 8, 2, True),
                 TileConfig(128, 64, 8, 3), TileConfig(64, 64, 4, 2)],
           512: [TileConfig(64, 16, 8, 1)]},
}

# Below this much work (B * Hq * Nq * Nk * D) a forward takes tens of microseconds, the static table is
# within noise of the best config, and the autotuner's own host cost (it keys every call) would show.
# The backward uses the same threshold.
AUTOTUNE_MIN_WORK = 2**34


def width_class(head_dim: int, dtype: torch.dtype) -> int:
    width = row_bytes(head_dim, dtype)
    return next(w for w in sorted(FORWARD_CANDIDATES) if width <= w)


@functools.cache  # on every autotuned call's host path
def tma_candidate_tile(kernel: str, head_dim: int, dtype: torch.dtype) -> tuple[int, int] | None:
    """(BLOCK_M, BLOCK_N) of the first TMA candidate of `kernel` ("fwd", "dkdv", "dq") for this width, or
    None if it has none (the launch then takes the autotuner without descriptors). The launcher builds the
    descriptors at this tile; each autotuned launch resets their boxes to its own tiles."""
    candidates = (FORWARD_CANDIDATES if kernel == "fwd" else BACKWARD_CANDIDATES[kernel])[width_class(head_dim, dtype)]
    return next(((c.block_m, c.block_n) for c in candidates if c.use_tma), None)


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


def _prune_forward(configs: list[triton.Config], named_args: dict, **meta) -> list[triton.Config]:
    """Keep the candidates of this head dim's width class that fit the GPU (at least the static config)."""
    q, head_dim = named_args["Q"], meta["HEAD_DIM"]
    smem = shared_memory_limit(q.device)
    return _keep_candidates(configs, FORWARD_CANDIDATES[width_class(head_dim, q.dtype)],
                            lambda cfg: why_pruned(cfg, head_dim, q.dtype, smem) is None,
                            forward_config(head_dim, q.dtype, _GPU, use_tma=False))


def _backward_pruner(kernel: str):
    def prune(configs: list[triton.Config], named_args: dict, **meta) -> list[triton.Config]:
        """Keep this backward kernel's candidates for the head dim's width class that fit the GPU."""
        q, head_dim = named_args["Q"], meta["HEAD_DIM"]
        smem = shared_memory_limit(q.device)
        static = backward_configs(head_dim, q.dtype, _GPU)[0 if kernel == "dkdv" else 1]
        return _keep_candidates(configs, BACKWARD_CANDIDATES[kernel][width_class(head_dim, q.dtype)],
                                lambda cfg: why_pruned_backward(kernel, cfg, head_dim, q.dtype, smem) is None
                                or cfg == static, static)
    return prune


def _triton_configs(candidates: list[TileConfig], with_tma: bool, forward: bool) -> list[triton.Config]:
    unique = dict.fromkeys(c for c in candidates if with_tma or not c.use_tma)
    return [triton.Config({"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "USE_TMA": c.use_tma,
                           **({"WARP_SPECIALIZE": c.warp_specialize} if forward else {})},
                          num_warps=c.num_warps, num_stages=c.num_stages, maxnreg=c.max_registers)
            for c in unique]


def seqlen_bucket(seqlen_q: int, seqlen_k: int) -> int:
    """The autotuner's sequence-length key: the longer length rounded up to a power of two, so that a
    new length retunes only when it crosses a power of two."""
    return 1 << (max(seqlen_q, seqlen_k, 1) - 1).bit_length()


def _time_config(kernel_call, quantiles):
    """The autotuner's timer: medians of a shorter run than do_bench's default (25 ms warm-up, 100 ms),
    which is plenty to rank configs whose kernels take a millisecond. The interpreter has no GPU to time:
    there one call stands in, so that the tests can run the autotuner's machinery."""
    if _interpreter.is_active():
        start = time.perf_counter()
        kernel_call()
        return [time.perf_counter() - start] * len(quantiles)
    return triton.testing.do_bench(kernel_call, warmup=10, rep=40, quantiles=quantiles)


class _WithDescriptorBoxes(KernelInterface):
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


def _autotuned(kernel, candidates: list[TileConfig], with_tma: bool, prune):
    # The dtypes of the tensor arguments join the key automatically.
    return triton.autotune(
        configs=_triton_configs(candidates, with_tma, forward=kernel is attn_fwd_kernel),
        key=["HEAD_DIM", "MASK_LEFT", "MASK_RIGHT", "SOFTCAP", "ALIBI", "VARLEN", "DROPOUT", "INPUT_PRECISION",
             "tuning_seqlen"],
        prune_configs_by={"early_config_prune": prune},
        do_bench=_time_config,
        cache_results=True,
    )(_WithDescriptorBoxes(kernel) if with_tma else kernel)


# (autotuner, constexprs, dtype, length bucket) -> (the triton.Config it picked, its launch keywords).
_picked: dict = {}


def run_autotuned(tuner, grid, args: tuple, meta: dict, dtype: torch.dtype, bucket: int) -> tuple:
    """tuner[grid](*args, **meta); returns the config that ran, and the compiled kernel it launched with
    that config's launch keywords (for launch.Recorded), or None for the call that ran the autotuner.
    Triton's Autotuner rebuilds its key from every argument of every call (~40 µs of host time for these
    kernels' ~50 arguments; NOTES entry 34). The launch's constexprs (`meta`), input dtype and length
    bucket determine that key (the other tensors' dtypes are fixed), so once they have been through the
    autotuner, its pick is launched straight away."""
    key = (tuner, *meta.values(), dtype, bucket)
    picked = _picked.get(key)
    if picked is None:
        tuner[grid](*args, **meta)
        _picked[key] = tuner.best_config, tuner.best_config.all_kwargs()
        return tuner.best_config, None
    config, config_kwargs = picked
    compiled = tuner.fn[grid](*args, **meta, **config_kwargs)
    return config, (compiled, config_kwargs)


def forget_picks() -> None:
    """Drop run_autotuned's memory of the autotuners' picks, and the launch plans recorded from them
    (tests that clear an autotuner's cache)."""
    _picked.clear()
    launch.forget()


def _all(candidates_by_width: dict[int, list[TileConfig]]) -> list[TileConfig]:
    return [c for configs in candidates_by_width.values() for c in configs]


# Two autotuners per kernel: with tensor descriptors at hand (a Hopper GPU and aligned tensors) the
# candidates include the TMA ones; without, block pointers only. Their keys and disk caches stay apart
# because their config lists differ. The backward kernels overwrite their outputs, so timing them on the
# real arguments is harmless.
attn_fwd_autotuned = {tma: _autotuned(attn_fwd_kernel, _all(FORWARD_CANDIDATES), tma, _prune_forward)
                      for tma in (True, False)}
attn_bwd_dkdv_autotuned = {tma: _autotuned(attn_bwd_dkdv_kernel, _all(BACKWARD_CANDIDATES["dkdv"]), tma,
                                           _backward_pruner("dkdv")) for tma in (True, False)}
attn_bwd_dq_autotuned = {tma: _autotuned(attn_bwd_dq_kernel, _all(BACKWARD_CANDIDATES["dq"]), tma,
                                         _backward_pruner("dq")) for tma in (True, False)}
