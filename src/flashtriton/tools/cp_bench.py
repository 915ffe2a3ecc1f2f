"""The `cp` suite: context-parallel attention under torchrun, one rank per GPU.

    torchrun --nproc-per-node=G -m flashtriton bench --suite cp [--seqlens 8192,32768] [--out DIR]
    python -m flashtriton bench --suite cp            # G = 1: the ring code's overhead on one GPU

B=1, H=32, D=128, bf16, causal, a total sequence of N tokens: per-rank time of the forward and of forward +
backward for ring attention (zigzag layout) and Ulysses, and the scaling efficiency against one GPU
doing 1/G of the work: (time of `flash_attention` on the whole sequence, on one rank, / G) / the slowest
rank's time. With G = 1 that is plain `flash_attention`'s time over the ring's: 1.0 means no overhead.

Timing: every rank runs the same fixed number of calls (a collective inside each call would deadlock on
ranks that chose different counts, as do_bench does), between a barrier and a synchronize, ROUNDS
interleaved rounds, median; the slowest rank's median is reported.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

ROUNDS = 3
CALLS = 5
SHAPE = dict(batch=1, heads=32, head_dim=128)
SEQLENS = (8192, 32768, 131072)


def _init() -> tuple[int, int, torch.device]:
    """The process group torchrun describes, or a group of one."""
    if not dist.is_initialized():
        if "RANK" in os.environ:
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        else:
            store = dist.HashStore()
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", store=store, rank=0,
                                    world_size=1)
    rank = dist.get_rank()
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        return dist.get_world_size(), rank, torch.device("cuda", local)
    return dist.get_world_size(), rank, torch.device("cpu")


def _seconds(fn, device: torch.device, calls: int) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()  # warm-up: compiles, autotunes, records launches
    sync()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls


def _slowest(value: float, device: torch.device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def cp_rows(seqlens=SEQLENS, batch: int = SHAPE["batch"], heads: int = SHAPE["heads"],
            head_dim: int = SHAPE["head_dim"], dtype=torch.bfloat16, rounds: int = ROUNDS,
            calls: int = CALLS) -> list[dict]:
    from ..api import flash_attention
    from ..distributed import contiguous_shard, ring_attention, ulysses_attention, zigzag_shard
    world, rank, device = _init()
    rows = []
    for seqlen in seqlens:
        generator = torch.Generator(device=device).manual_seed(seqlen)  # the same whole inputs on every rank
        q, k, v, do = (torch.randn(batch, heads, seqlen, head_dim, device=device, dtype=dtype, generator=generator)
                       for _ in range(4))
        zig = [zigzag_shard(x).requires_grad_() for x in (q, k, v)]
        con = [contiguous_shard(x).requires_grad_() for x in (q, k, v)]
        do_zig, do_con = zigzag_shard(do), contiguous_shard(do)
        whole = [x.clone().requires_grad_() for x in (q, k, v)]

        def fwd_bwd(attend, inputs, grad):
            def run():
                attend(*inputs).backward(grad)
                for x in inputs:
                    x.grad = None
            return run

        def fwd(attend, inputs):
            def run():
                with torch.no_grad():
                    attend(*inputs)
            return run
        calls_of = {
            "flash_attention (whole sequence, one rank)": (lambda *t: flash_attention(*t, is_causal=True), whole, do),
            "ring (zigzag)": (lambda *t: ring_attention(*t, is_causal=True), zig, do_zig),
            "ulysses": (lambda *t: ulysses_attention(*t, is_causal=True), con, do_con),
        }
        times = {(name, mode): [] for name in calls_of for mode in ("fwd", "fwd_bwd")}
        for _ in range(rounds):
            for name, (attend, inputs, grad) in calls_of.items():
                times[name, "fwd"].append(_seconds(fwd(attend, inputs), device, calls))
                times[name, "fwd_bwd"].append(_seconds(fwd_bwd(attend, inputs, grad), device, calls))
        ms = {f"{name} {mode}": 1e3 * _slowest(statistics.median(t), device) for (name, mode), t in times.items()}
        row = dict(world=world, seqlen=seqlen, batch=batch, heads=heads, head_dim=head_dim, ms=ms, efficiency={})
        for mode in ("fwd", "fwd_bwd"):
            ideal = ms[f"flash_attention (whole sequence, one rank) {mode}"] / world
            for name in ("ring (zigzag)", "ulysses"):
                row["efficiency"][f"{name} {mode}"] = ideal / ms[f"{name} {mode}"]
        rows.append(row)
        if rank == 0:
            print(json.dumps(row), flush=True)
        del q, k, v, do, zig, con, whole
    return rows


def cp_table(rows: list[dict]) -> str:
    lines = ["| G | N | mode | flash_attention, whole N, ms | ring ms | ring efficiency | ulysses ms | "
             "ulysses efficiency |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for mode in ("fwd", "fwd_bwd"):
            ms, eff = r["ms"], r["efficiency"]
            lines.append(f"| {r['world']} | {r['seqlen']} | {mode} | "
                         f"{ms[f'flash_attention (whole sequence, one rank) {mode}']:.3f} | "
                         f"{ms[f'ring (zigzag) {mode}']:.3f} | {eff[f'ring (zigzag) {mode}']:.2f} | "
                         f"{ms[f'ulysses {mode}']:.3f} | {eff[f'ulysses {mode}']:.2f} |")
    return "\n".join(lines)


def bench_cp(out: Path | None, seqlens=None) -> int:
    from .bench import environment
    rows = cp_rows(seqlens or SEQLENS)
    if dist.get_rank() == 0:
        table = cp_table(rows)
        print(table)
        if out is not None:
            meta = environment()
            out.mkdir(parents=True, exist_ok=True)
            name = f"cp_g{rows[0]['world']}"
            (out / f"{name}.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
            (out / f"{name}.md").write_text(
                f"# Context parallelism, G = {rows[0]['world']}, on {meta.get('gpu')}\n\ncommit {meta.get('commit')}, "
                f"one run. B=1, H=32, D=128, bf16, causal; the slowest rank's median ms of {CALLS} calls, "
                f"{ROUNDS} interleaved rounds. Efficiency: (flash_attention on the whole sequence / G) / the "
                "rank's time. `torchrun --nproc-per-node=G -m flashtriton bench --suite cp`.\n\n" + table + "\n")
    dist.destroy_process_group()
    return 0
