"""Tile configurations: the static tables that small problems take, and the resource model (shared memory,
registers) that prunes configurations before anything is compiled.

Small problems take the static tables (`forward_config`, `backward_configs`): their kernels run for
microseconds, and picking a config by timing would cost more host time than it saves. Large ones go
through the autotuners (launch/autotune.py), whose candidates the same resource model prunes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton

from .arguments import next_power_of_2


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 1
    use_tma: bool = False  # tensor descriptors (Hopper's TMA copy engine) instead of masked pointer loads
    # producer/consumer warp groups for the unmasked loop (needs use_tma). With Triton 3.6 on sm_90 it
    # fails to compile at 4 warps and changes nothing at 8 (the same SASS): swept, not tuned.
    warp_specialize: bool = False
    qk_ahead: bool = False  # the unmasked loop issues the next q @ k^T before this tile's softmax
    # registers per thread that ptxas may use (its .maxnreg), None for its own choice: a cap that lets one
    # more block share the SM's 64K registers (65536 / (3 blocks * 128 threads) -> 168) can pay more than
    # the few bytes it spills
    max_registers: int | None = None

    @property
    def name(self) -> str:
        return (f"M{self.block_m}-N{self.block_n}-w{self.num_warps}-s{self.num_stages}"
                f"{'-tma' if self.use_tma else ''}{'-ws' if self.warp_specialize else ''}"
                f"{'-qka' if self.qk_ahead else ''}{f'-r{self.max_registers}' if self.max_registers else ''}")


@functools.cache
def block_d(head_dim: int) -> int:
    """The head dim padded to a power of two, at least 16 (tl.dot's smallest reduction)."""
    return max(16, next_power_of_2(head_dim))


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
    # TMA: an interleaved A/B over the paper suite's shapes (docs/performance.md); pointer loads: the sweeps.
    if width <= 128:  # D <= 64 in 16 bits
        return TileConfig(64, 128, 4, 2, True) if use_tma else TileConfig(128, 64, num_warps=4, num_stages=3)
    if width <= 256:  # D = 128 in 16 bits
        return TileConfig(64, 64, 4, 3, True) if use_tma else TileConfig(128, 64, num_warps=8, num_stages=3)
    return TileConfig(64, 32, num_warps=4, num_stages=1, use_tma=use_tma)  # D = 256


def backward_configs(head_dim: int, dtype: torch.dtype, device: torch.device) -> tuple[TileConfig, TileConfig]:
    """(dK/dV config, dQ config) for problems too small to autotune: the backward sweeps' best pointer-load
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
    if width <= 128:  # dQ: 64 x 64 ties the best pointer-load tile (128 x 64, 4.64 ms) without its spill
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
