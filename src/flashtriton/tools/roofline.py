"""The roofline (the article's part 5): where the kernels sit against the GPU's two ceilings.

`python -m flashtriton roofline --out DIR` measures, in the same run, the dense bf16 matmul rate (an
8192^3 product) and the device-to-device copy bandwidth (bytes read plus written), times our forward and
backward and the peers on a few shapes, and plots TFLOP/s against arithmetic intensity (FLOPs per byte of
the fewest bytes the operation must move: every input read once, every output written once). Where Nsight
Compute (`ncu`) is on the PATH it also profiles one launch of the forward and of each backward kernel and
keeps the metrics that say why a kernel sits where it does: tensor-pipe activity, achieved occupancy,
shared-memory bank conflicts.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..testing import make_qkv
from .bench import Shape, time_provider
from .plotting import pyplot

SHAPES = [Shape(4, 32, 32, 4096, 4096, 64, False), Shape(4, 32, 32, 4096, 4096, 64, True),
          Shape(4, 16, 16, 4096, 4096, 128, False), Shape(4, 16, 16, 4096, 4096, 128, True)]
NVTX_RANGE = "flashtriton_profile"  # the one launch ncu profiles
NCU_SECTIONS = ("SpeedOfLight", "Occupancy", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis_Tables",
                "LaunchStats")
# Rows of ncu's details page worth keeping in the summary (matched case-insensitively as substrings).
NCU_KEEP = ("compute (sm) throughput", "memory throughput", "duration", "achieved occupancy",
            "theoretical occupancy", "registers per thread", "bank conflicts", "executed ipc",
            "issue slots busy", "tensor", "l2 hit rate", "dram throughput")


@dataclass
class Ceilings:
    matmul_tflops: float  # dense bf16 8192^3 product
    copy_tbps: float  # device-to-device copy, bytes read + written


@dataclass
class Point:
    provider: str
    shape: str
    mode: str
    tflops: float
    intensity: float  # FLOPs per byte of the minimal traffic


def measure_ceilings() -> Ceilings:
    import triton.testing
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    ms = triton.testing.do_bench(lambda: a @ b, warmup=100, rep=500, return_mode="median")
    matmul = 2 * 8192**3 / ms / 1e9
    src = torch.randn(2**28, device="cuda", dtype=torch.float32)  # 1 GiB
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    copy = 2 * src.numel() * src.element_size() / ms / 1e9
    return Ceilings(matmul, copy)


def minimal_bytes(shape: Shape, mode: str, itemsize: int = 2) -> float:
    """Every tensor the operation needs read once and every result written once."""
    q = shape.batch * shape.heads_q * shape.seqlen_q * shape.head_dim * itemsize
    kv = shape.batch * shape.heads_kv * shape.seqlen_k * shape.head_dim * itemsize
    lse = shape.batch * shape.heads_q * shape.seqlen_q * 4
    fwd = 2 * q + 2 * kv + lse  # q, k, v in; o, lse out
    bwd = 4 * q + 4 * kv + 2 * lse  # q, o, do, k, v, lse, delta in; dq, dk, dv out
    return {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd + bwd}[mode]


def measure_points(providers: list[str], modes: list[str], log: Callable[[str], None] = print) -> list[Point]:
    points = []
    for shape in SHAPES:
        q, k, v = make_qkv(shape.batch, shape.heads_q, shape.heads_kv, shape.seqlen_q, shape.seqlen_k,
                           shape.head_dim, torch.bfloat16, "cuda")
        name = f"D{shape.head_dim}-N{shape.seqlen_q}-{'causal' if shape.causal else 'full'}"
        for mode in modes:
            for provider in providers:
                ms = time_provider(provider, shape, mode, q, k, v)
                point = Point(provider, name, mode, shape.flops(mode) / ms / 1e9,
                              shape.flops(mode) / minimal_bytes(shape, mode))
                points.append(point)
                log(f"  {provider:<12} {mode:<4} {name:<22} {point.tflops:6.0f} TFLOP/s  "
                    f"intensity {point.intensity:7.0f} FLOP/B")
    return points


def plot(ceilings: Ceilings, points: list[Point], path: Path, title: str) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(7.5, 5))
    ridge = ceilings.matmul_tflops * 1e12 / (ceilings.copy_tbps * 1e12)  # FLOP/B where the roofs meet
    xs = [1, ridge, max(4 * ridge, max((p.intensity for p in points), default=ridge) * 2)]
    ax.plot(xs, [min(ceilings.matmul_tflops, ceilings.copy_tbps * x) for x in xs], color="black", lw=1.5,
            label=f"roof: {ceilings.copy_tbps:.2f} TB/s copy, {ceilings.matmul_tflops:.0f} TFLOP/s matmul")
    markers = {"fwd": "o", "bwd": "s", "fwd_bwd": "^"}
    for provider in dict.fromkeys(p.provider for p in points):
        mine = [p for p in points if p.provider == provider]
        color = None
        for mode in dict.fromkeys(p.mode for p in mine):
            sel = [p for p in mine if p.mode == mode]
            line = ax.scatter([p.intensity for p in sel], [p.tflops for p in sel], marker=markers[mode],
                              color=color, label=f"{provider} {mode}")
            color = line.get_facecolor()[0]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte of minimal traffic)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# The kernels ncu can profile: the forward, and the backward's two (see kernels/backward.py).
PROFILED_KERNELS = ("attn_fwd_kernel", "attn_bwd_dkdv_kernel", "attn_bwd_dq_kernel")


def run_profile_target(head_dim: int, causal: bool, backward: bool = False) -> None:
    """What ncu profiles: warm-up calls (the first ones may autotune, launching every candidate), then
    the forward (and with `backward`, the backward) once more inside the NVTX range that ncu filters on.
    The launchers are called directly: autograd runs a backward on its own device thread, outside a
    range pushed on this one, and ncu then finds no backward kernel in it."""
    from ..launch import attention_backward, attention_forward
    heads = 2048 // head_dim
    q, k, v = make_qkv(4, heads, heads, 4096, 4096, head_dim, torch.bfloat16, "cuda")
    do = torch.randn_like(q)
    scale = head_dim ** -0.5

    def step():
        o, lse = attention_forward(q, k, v, causal, scale)
        if backward:
            attention_backward(do, q, k, v, o, lse, causal, scale)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(NVTX_RANGE)
    step()
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()


def ncu_summary(head_dim: int, causal: bool, raw_csv: Path, kernel: str = "attn_fwd_kernel") -> list[dict] | str:
    """Profile one launch of `kernel` (one of PROFILED_KERNELS) with Nsight Compute; the rows of NCU_KEEP,
    or why there are none."""
    if kernel not in PROFILED_KERNELS:
        raise ValueError(f"kernel must be one of {PROFILED_KERNELS}, got {kernel!r}")
    ncu = shutil.which("ncu")
    if ncu is None:
        return "ncu is not on the PATH"
    cmd = [ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", f"{NVTX_RANGE}/",
           "--kernel-name", kernel, "--launch-count", "1", "--csv", "--page", "details"]
    for section in NCU_SECTIONS:
        cmd += ["--section", section]
    cmd += [sys.executable, "-m", "flashtriton", "roofline", "--profile-target", "--head-dim", str(head_dim)]
    cmd += ["--causal"] if causal else []
    cmd += ["--backward"] if kernel != "attn_fwd_kernel" else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).parents[1]),
                                                                  os.environ.get("PYTHONPATH")])))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    raw_csv.write_text(out.stdout + "\n# stderr\n" + out.stderr)
    lines = [line for line in out.stdout.splitlines() if line.startswith('"')]
    if out.returncode != 0 or not lines:
        return f"ncu failed (exit {out.returncode}): {(out.stderr or out.stdout).strip()[-500:]}"
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    keep = [{"section": r.get("Section Name", ""), "metric": r.get("Metric Name", ""),
             "unit": r.get("Metric Unit", ""), "value": r.get("Metric Value", "")}
            for r in rows if any(k in r.get("Metric Name", "").lower() for k in NCU_KEEP)]
    return keep or "ncu ran but none of the expected metrics were in its output (see the raw CSV)"


def write_report(out: Path, ceilings: Ceilings, points: list[Point], profiles: dict[str, list[dict] | str],
                 meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "roofline.json").write_text(json.dumps({"meta": meta, "ceilings": asdict(ceilings),
                                                   "points": [asdict(p) for p in points],
                                                   "ncu": profiles}, indent=1))
    md = [f"# Roofline on {meta['gpu']}", f"torch {meta['torch']}, triton {meta['triton']}, commit {meta['commit']}",
          "", f"Ceilings measured in this run: dense bf16 matmul {ceilings.matmul_tflops:.0f} TFLOP/s, "
          f"device copy {ceilings.copy_tbps:.2f} TB/s (ridge at "
          f"{ceilings.matmul_tflops / ceilings.copy_tbps:.0f} FLOP/B).", "",
          "| provider | shape | mode | TFLOP/s | % of matmul | FLOP/B |", "|---|---|---|---|---|---|"]
    md += [f"| {p.provider} | {p.shape} | {p.mode} | {p.tflops:.0f} | "
           f"{100 * p.tflops / ceilings.matmul_tflops:.0f}% | {p.intensity:.0f} |" for p in points]
    for name, profile in profiles.items():
        md += ["", f"## Nsight Compute: {name}", ""]
        if isinstance(profile, str):
            md.append(profile)
        else:
            md += ["| section | metric | value | unit |", "|---|---|---|---|"]
            md += [f"| {r['section']} | {r['metric']} | {r['value']} | {r['unit']} |" for r in profile]
    (out / "roofline.md").write_text("\n".join(md) + "\n")
    plot(ceilings, points, out / "roofline.png", f"roofline, {meta['gpu']}, bf16, B·N = 16k tokens")
