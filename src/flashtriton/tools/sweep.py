"""Tile sweeps (the article's part 2): time every tile configuration of one kernel on one shape.

The forward's configurations are BLOCK_M x BLOCK_N x num_warps x num_stages x {pointer loads, TMA, TMA +
warp specialisation, TMA + q k^T ahead}; a backward kernel's (dK/dV or dQ) are its tile shapes x
num_warps x num_stages x {pointer loads, TMA}, timed as the whole backward with the other kernel on its
static tiles. Those that cannot fit an SM's shared memory or would spill registers are skipped before
compiling (the arithmetic is in docs/tuning.md). The rest are compiled in parallel worker processes (each
compile is CPU-bound; Triton's on-disk cache hands the binaries to the timing process), checked against
the static configuration's output, and timed with `triton.testing.do_bench`.
"""

from __future__ import annotations

import csv
import itertools
import os
import re
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..launch import attention_backward, attention_forward
from ..launch.tiles import TileConfig, backward_configs, shared_memory_limit, why_pruned, why_pruned_backward
from .plotting import pyplot

BLOCK_MS = (64, 128)
BLOCK_NS = (32, 64, 128)
WARPS = (4, 8)
STAGES = (2, 3, 4)
# (use_tma, warp_specialize, qk_ahead)
VARIANTS = ((False, False, False), (True, False, False), (True, True, False), (True, False, True))
VARIANT_NAMES = {(False, False, False): "pointer loads", (True, False, False): "TMA",
                 (True, True, False): "TMA + warp specialisation", (True, False, True): "TMA + q k^T ahead"}
# The backward kernels' tiles as (BLOCK_M, BLOCK_N): dK/dV keeps BLOCK_N key rows resident and streams
# short query tiles; dQ keeps BLOCK_M query rows and streams short key tiles.
BACKWARD_TILES = {"dkdv": ((16, 64), (16, 128), (32, 64), (32, 128), (64, 64), (64, 128)),
                  "dq": ((64, 16), (64, 32), (64, 64), (128, 16), (128, 32), (128, 64))}


def candidate_configs(head_dim: int, dtype: torch.dtype, smem_limit: int,
                      kernel: str = "fwd") -> tuple[list[TileConfig], list[str]]:
    """(configs worth compiling, one line per pruned config saying why) for the forward or one of the
    backward kernels. A backward kernel's static default is always kept, as the yardstick."""
    keep, pruned = [], []
    if kernel == "fwd":
        for bm, bn, warps, stages, (tma, ws, ahead) in itertools.product(BLOCK_MS, BLOCK_NS, WARPS, STAGES,
                                                                         VARIANTS):
            cfg = TileConfig(bm, bn, warps, stages, use_tma=tma, warp_specialize=ws, qk_ahead=ahead)
            reason = why_pruned(cfg, head_dim, dtype, smem_limit)
            if reason is None:
                keep.append(cfg)
            else:
                pruned.append(f"{cfg.name}: {reason}")
        return keep, pruned
    default = dict(zip(("dkdv", "dq"), backward_configs(head_dim, dtype, torch.device("cuda")), strict=True))[kernel]
    for (bm, bn), warps, stages, tma in itertools.product(BACKWARD_TILES[kernel], WARPS, (1, 2, 3), (False, True)):
        cfg = TileConfig(bm, bn, warps, stages, use_tma=tma)
        reason = why_pruned_backward(kernel, cfg, head_dim, dtype, smem_limit)
        if reason is None or cfg == default:
            keep.append(cfg)
        else:
            pruned.append(f"{cfg.name}: {reason}")
    if default not in keep:
        keep.append(default)
    return keep, pruned


def matching(configs: list[TileConfig], pattern: str, kernel: str, head_dim: int,
             dtype: torch.dtype) -> list[TileConfig]:
    """The configs whose name matches `pattern`, plus the backward kernel's static default (the yardstick
    of a backward sweep)."""
    regex = re.compile(pattern)
    keep = [c for c in configs if regex.search(c.name)]
    if kernel != "fwd":
        default = backward_configs(head_dim, dtype, torch.device("cuda"))[0 if kernel == "dkdv" else 1]
        keep += [default] if default not in keep else []
    return keep


@dataclass
class SweepResult:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    use_tma: bool
    warp_specialize: bool
    compile_s: float
    ms: float | None
    tflops: float | None
    max_diff: float | None
    status: str
    qk_ahead: bool = False  # the fields from here on came later: CSVs written before them still read
    kernel: str = "fwd"  # fwd, dkdv or dq


def _run(kernel: str, cfg: TileConfig | None, q, k, v, causal: bool, scale: float, saved=None):
    """The forward with `cfg`, or the backward with `cfg` for one of its kernels and the static choice
    for the other (`saved` = (o, lse, do) from the forward)."""
    if kernel == "fwd":
        return attention_forward(q, k, v, causal, scale, cfg)
    o, lse, do = saved
    configs = None
    if cfg is not None:
        default_dkdv, default_dq = backward_configs(q.shape[-1], q.dtype, q.device)
        configs = (cfg, default_dq) if kernel == "dkdv" else (default_dkdv, cfg)
    return attention_backward(do, q, k, v, o, lse, causal, scale, configs)


def _compile_one(args) -> tuple[TileConfig, float, str]:
    """Worker: compile one config by running it on a small input with the same layout."""
    cfg, head_dim, dtype, causal, kernel = args
    try:
        q = torch.randn(1, 1, 256, head_dim, device="cuda", dtype=dtype)
        saved = None
        if kernel != "fwd":
            o, lse = attention_forward(q, q, q, causal, 1.0)
            saved = (o, lse, torch.randn_like(q))
        start = time.perf_counter()
        _run(kernel, cfg, q, q, q, causal, 1.0, saved)
        torch.cuda.synchronize()
        return cfg, time.perf_counter() - start, "ok"
    except Exception as exc:  # a config the compiler rejects is a result, not a crash
        return cfg, 0.0, f"compile error: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"


def _progress(items: Iterable, total: int, desc: str):
    try:
        from tqdm import tqdm
        return tqdm(items, total=total, desc=desc)
    except ImportError:
        return items


def run_sweep(batch: int, heads: int, seqlen: int, head_dim: int, causal: bool, dtype=torch.bfloat16,
              jobs: int | None = None, log=print, kernel: str = "fwd",
              match: str | None = None) -> tuple[list[SweepResult], list[str]]:
    """Compile every candidate of `kernel` (or those whose name matches the regex `match`) in parallel,
    check each against the static choice's output, and time it: the forward alone, or the whole backward
    with one of its kernels varied."""
    import triton
    import triton.testing

    smem_limit = shared_memory_limit(torch.device("cuda", torch.cuda.current_device()))
    configs, pruned = candidate_configs(head_dim, dtype, smem_limit, kernel)
    if match is not None:
        configs = matching(configs, match, kernel, head_dim, dtype)
    log(f"{len(configs)} configs to compile and time, {len(pruned)} pruned "
        f"(shared memory per block: {smem_limit // 1024} KB)")

    jobs = jobs or max(1, min(8, (os.cpu_count() or 2) // 2))
    compiled = {}
    ctx = torch.multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        work = pool.map(_compile_one, [(c, head_dim, dtype, causal, kernel) for c in configs])
        for cfg, seconds, status in _progress(work, len(configs), "compile"):
            compiled[cfg] = (seconds, status)

    q = torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=dtype)
    k, v = torch.randn_like(q), torch.randn_like(q)
    scale = head_dim ** -0.5
    saved = None
    if kernel != "fwd":
        o, lse = attention_forward(q, k, v, causal, scale)
        saved = (o, lse, torch.randn_like(q))
    reference = _run(kernel, None, q, k, v, causal, scale, saved)  # the static choice
    flops = 4.0 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
    flops *= 1.0 if kernel == "fwd" else 2.5
    results = []
    for cfg in _progress(configs, len(configs), "time"):
        seconds, status = compiled[cfg]
        ms = tflops = diff = None
        if status == "ok":
            out = _run(kernel, cfg, q, k, v, causal, scale, saved)
            # every output (O and L, or dQ, dK, dV) relative to its largest reference value
            diff = max(((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()
                       for a, b in zip(out, reference, strict=True))
            if diff > 2e-2:
                status = "wrong result"
            else:
                ms = triton.testing.do_bench(lambda cfg=cfg: _run(kernel, cfg, q, k, v, causal, scale, saved),
                                             warmup=25, rep=100, return_mode="median")
                tflops = flops / ms / 1e9
        results.append(SweepResult(cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages, cfg.use_tma,
                                   cfg.warp_specialize, seconds, ms, tflops, diff, status, cfg.qk_ahead,
                                   kernel))
    return results, pruned


def write_csv(results: list[SweepResult], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(results[0])))
        writer.writeheader()
        writer.writerows(asdict(r) for r in results)


def read_csv(path: Path) -> list[SweepResult]:
    def parse(field, text):
        kind = SweepResult.__annotations__[field]
        if text == "":
            return None
        if kind.startswith("bool"):
            return text == "True"
        if kind.startswith("int"):
            return int(text)
        if kind.startswith("float"):
            return float(text)
        return text
    with path.open() as f:
        return [SweepResult(**{k: parse(k, v) for k, v in row.items()}) for row in csv.DictReader(f)]


def heatmap(results: list[SweepResult], path: Path, title: str) -> bool:
    """One panel per variant: rows BLOCK_M x BLOCK_N, columns num_warps x num_stages, colour TFLOP/s."""
    plt = pyplot()
    if plt is None:
        return False
    rows = sorted({(r.block_m, r.block_n) for r in results})
    cols = sorted({(r.num_warps, r.num_stages) for r in results})
    variants = [v for v in VARIANTS if any((r.use_tma, r.warp_specialize, r.qk_ahead) == v for r in results)]
    best = max((r.tflops or 0) for r in results)
    fig, axes = plt.subplots(1, len(variants), figsize=(5.2 * len(variants), 4.4), squeeze=False,
                             gridspec_kw={"wspace": 0.25})
    for ax, variant in zip(axes[0], variants, strict=True):
        grid = [[float("nan")] * len(cols) for _ in rows]
        for r in results:
            if (r.use_tma, r.warp_specialize, r.qk_ahead) == variant and r.tflops:
                grid[rows.index((r.block_m, r.block_n))][cols.index((r.num_warps, r.num_stages))] = r.tflops
        im = ax.imshow(grid, vmin=0, vmax=best, cmap="viridis")
        for i, row in enumerate(grid):
            for j, value in enumerate(row):
                if value == value:  # not NaN
                    ax.text(j, i, f"{value:.0f}", ha="center", va="center", fontsize=7,
                            color="black" if value > 0.6 * best else "white")
        ax.set_xticks(range(len(cols)), [f"w{w}s{s}" for w, s in cols], fontsize=7)
        ax.set_yticks(range(len(rows)), [f"{m}x{n}" for m, n in rows], fontsize=7)
        ax.set_xlabel("num_warps, num_stages")
        if ax is axes[0][0]:
            ax.set_ylabel("BLOCK_M x BLOCK_N")
        ax.set_title(VARIANT_NAMES[variant], fontsize=9)
    fig.colorbar(im, ax=axes[0].tolist(), label="TFLOP/s", shrink=0.8)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return True
