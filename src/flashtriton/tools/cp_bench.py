"""The `cp` suite: context-parallel attention under torchrun, one rank per GPU.

    torchrun --nproc-per-node=G -m flashtriton bench --suite cp [--seqlens 32768,131072] [--out DIR]
    python -m flashtriton bench --suite cp            # G = 1: the ring code's overhead on one GPU

B=1, H=32, D=128, bf16, causal, a total sequence of N tokens. Three parts, each in cp_g<G>.json:

- **Time**: per-rank time of the forward and of forward + backward for each provider, and the scaling
  efficiency against one GPU doing 1/G of the work: (time of `flash_attention` on the whole sequence, on
  one rank, / G) / the slowest rank's time. With G = 1 that is plain `flash_attention`'s time over the
  provider's: 1.0 means no overhead. Providers: flashtriton's zigzag ring and Ulysses on (B, H, n, D)
  shards; its `zigzag_ring_flash_attn_func` and, where the `cp` extra is installed and G >= 2,
  ring-flash-attn's ring on the same kernels (tools/ring_flash_attn_peer.py), both on flash_attn's
  (B, n, H, D) layout.
- **Exactness**: O, L, dQ, dK, dV of every sharded provider against float64 on the whole sequence
  (allowed twice the error of `flash_attention` on one GPU), and their largest difference from that
  single-GPU result, at B=1, H=8, N=8192 (testing.check_shard); the worst over the ranks.
- **Overlap** (CUDA): one forward + backward step of each ring under torch.profiler, at N = 131072 (or the
  longest N timed below it; none where every N is longer): how long the transfers (NCCL kernels) ran and
  how much of that time other kernels ran beside them. The traces are kept,
  cp_g<G>_trace_<provider>_rank<r>.json.gz.

A run at the commit of an existing cp_g<G>.json in the output folder adds its rows to that file's (its
lengths replacing the same lengths), so that long lengths can run in a call of their own. cp.md and cp.png
gather every cp_g*.json there: one file per G, each at its own commit.

Timing: every rank runs the same fixed number of calls (a collective inside each call would deadlock on
ranks that chose different counts, as do_bench does), between a barrier and a synchronize, interleaved
rounds, median; the slowest rank's median is reported. Above 131072 tokens a call takes seconds, so
there are fewer calls and rounds.
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as dist

SHAPE = dict(batch=1, heads=32, head_dim=128)
SEQLENS = (32768, 131072)
EXACT_SHAPE = dict(batch=1, heads=8, seqlen=8192, head_dim=128)
TRACE_SEQLEN = 131072
WHOLE = "flash_attention (whole sequence, one rank)"
RINGS = ("ring (zigzag)", "ring-flash-attn (zigzag)")  # the providers whose transfers are traced
TARGETS = dict(fwd=0.85, fwd_bwd=0.90)  # the zigzag ring's scaling efficiency at 128k tokens on 2 GPUs


def _calls_and_rounds(seqlen: int) -> tuple[int, int]:
    return (5, 3) if seqlen <= 131072 else (1, 2)


def _init() -> tuple[int, int, torch.device]:
    """The process group torchrun describes, or a group of one. On GPUs, gloo beside NCCL: the calls'
    agreement (an object gather) then goes over the host, without synchronising the GPU
    (docs/distributed.md)."""
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        if "RANK" in os.environ:
            dist.init_process_group(backend)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    rank = dist.get_rank()
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        return dist.get_world_size(), rank, torch.device("cuda", local)
    return dist.get_world_size(), rank, torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _seconds(fn, device: torch.device, calls: int, warm_up: bool) -> float:
    if warm_up:  # compiles, autotunes, records launches
        fn()
        _sync(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / calls


def _per_rank(values: list[float], device: torch.device) -> list[list[float]]:
    """Every rank's `values`, in rank order."""
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [t.tolist() for t in every]


class _Provider(NamedTuple):
    """One way of computing the attention of the whole sequence: `inputs(x)` turns a whole (B, H, N, D)
    tensor into what `attend(q, k, v)` takes on this rank (also dO's form for the backward), and
    `with_lse(q, k, v)` returns (o, lse) as (B, H, n, D) and (B, H, n) of this rank's `shard` of the rows,
    for the exactness check."""
    inputs: Callable
    attend: Callable
    with_lse: Callable
    shard: Callable


def providers(world: int) -> dict[str, _Provider]:
    """The suite's providers for a group of `world` ranks. ring-flash-attn only from two ranks: alone, its
    backward still sends its gradients to itself, which gloo cannot."""
    from ..api import flash_attention
    from ..distributed import (
        contiguous_shard,
        ring_attention,
        ulysses_attention,
        zigzag_ring_flash_attn_func,
        zigzag_shard,
    )
    from .ring_flash_attn_peer import load_zigzag_ring

    def zigzag(x):
        return zigzag_shard(x, dim=2)

    def contiguous(x):
        return contiguous_shard(x, dim=2)

    def whole(x):
        return x

    def flash_attn_layout(x):  # a zigzag shard in (B, n, H, D), as a flash_attn user holds it
        return zigzag(x).transpose(1, 2).contiguous()

    def flash_attn_style(fn):
        def with_lse(q, k, v):  # (B, H, n, D) in and out, the call itself on (B, n, H, D)
            o, lse, _ = fn(*(t.transpose(1, 2) for t in (q, k, v)), causal=True, return_attn_probs=True)
            return o.transpose(1, 2), lse
        return _Provider(flash_attn_layout, lambda *t: fn(*t, causal=True), with_lse, zigzag)

    found = {
        WHOLE: _Provider(whole, lambda *t: flash_attention(*t, is_causal=True),
                         lambda *t: flash_attention(*t, is_causal=True, return_lse=True), whole),
        "ring (zigzag)": _Provider(zigzag, lambda *t: ring_attention(*t, is_causal=True),
                                   lambda *t: ring_attention(*t, is_causal=True, return_lse=True), zigzag),
        "ulysses": _Provider(contiguous, lambda *t: ulysses_attention(*t, is_causal=True),
                             lambda *t: ulysses_attention(*t, is_causal=True, return_lse=True), contiguous),
        "ring (zigzag), flash_attn layout": flash_attn_style(zigzag_ring_flash_attn_func),
    }
    peer = load_zigzag_ring() if world > 1 else None
    if peer is not None:
        found["ring-flash-attn (zigzag)"] = flash_attn_style(peer)
    return found


def _whole_inputs(seed: int, batch: int, heads: int, seqlen: int, head_dim: int, dtype, device):
    """q, k, v, dO of the whole sequence, the same on every rank."""
    generator = torch.Generator(device=device).manual_seed(seed)
    return tuple(torch.randn(batch, heads, seqlen, head_dim, device=device, dtype=dtype, generator=generator)
                 for _ in range(4))


def _steps(provider: _Provider, whole: tuple) -> dict[str, Callable[[], None]]:
    """One call of `provider` on its form of `whole`: "fwd" under no_grad, "fwd_bwd" with its backward;
    both on the same inputs, made once (at 512k tokens a provider's shards of q, k, v, dO are 8 GiB)."""
    q, k, v, do = (provider.inputs(x.detach()) for x in whole)
    leaves = [x.requires_grad_() for x in (q, k, v)]

    def fwd():
        with torch.no_grad():
            provider.attend(*leaves)

    def fwd_bwd():
        provider.attend(*leaves).backward(do)
        for x in leaves:
            x.grad = None
    return dict(fwd=fwd, fwd_bwd=fwd_bwd)


def cp_rows(seqlens=SEQLENS, batch: int = SHAPE["batch"], heads: int = SHAPE["heads"],
            head_dim: int = SHAPE["head_dim"], dtype=torch.bfloat16, calls_and_rounds=_calls_and_rounds,
            every: dict[str, _Provider] | None = None) -> list[dict]:
    """The time rows, one per sequence length; printed as they come."""
    world, rank, device = _init()
    every = providers(world) if every is None else every
    rows = []
    for seqlen in seqlens:
        calls, rounds = calls_and_rounds(seqlen)
        whole = _whole_inputs(seqlen, batch, heads, seqlen, head_dim, dtype, device)
        runs = {(name, mode): run for name, p in every.items() for mode, run in _steps(p, whole).items()}
        times = {key: [] for key in runs}
        for round_ in range(rounds):
            for key, run in runs.items():
                times[key].append(_seconds(run, device, calls, warm_up=round_ == 0))
        per_rank = _per_rank([1e3 * statistics.median(t) for t in times.values()], device)
        ms_per_rank = {f"{name} {mode}": [ranks[i] for ranks in per_rank] for i, (name, mode) in enumerate(times)}
        ms = {key: max(values) for key, values in ms_per_rank.items()}  # the slowest rank's
        row = dict(world=world, seqlen=seqlen, batch=batch, heads=heads, head_dim=head_dim, calls=calls,
                   rounds=rounds, ms=ms, ms_per_rank=ms_per_rank, efficiency={})
        for mode in ("fwd", "fwd_bwd"):
            ideal = ms[f"{WHOLE} {mode}"] / world
            for name in every:
                if name != WHOLE:
                    row["efficiency"][f"{name} {mode}"] = ideal / ms[f"{name} {mode}"]
        rows.append(row)
        if rank == 0:
            print(json.dumps(row), flush=True)
        del whole, runs
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def cp_exactness(batch: int = EXACT_SHAPE["batch"], heads: int = EXACT_SHAPE["heads"],
                 seqlen: int = EXACT_SHAPE["seqlen"], head_dim: int = EXACT_SHAPE["head_dim"],
                 dtype=torch.bfloat16, every: dict[str, _Provider] | None = None) -> dict[str, dict]:
    """Per sharded provider and quantity: the worst rank's error against float64, what it was allowed,
    whether every rank passed, and the largest difference from single-GPU `flash_attention`."""
    from ..testing import check_shard
    world, rank, device = _init()
    every = providers(world) if every is None else every
    whole = _whole_inputs(1, batch, heads, seqlen, head_dim, dtype, device)
    single = every[WHOLE].with_lse
    found = {}
    for name, provider in every.items():
        if name == WHOLE:
            continue
        checks = check_shard(provider.with_lse, single, provider.shard, whole, dict(is_causal=True))
        mine = torch.tensor([[c.err, c.allowed, float(not c.ok), diff] for c, diff in checks], dtype=torch.float64,
                            device=device)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # the worst rank (the largest allowance: a bound, not a pair)
        found[name] = {c.name: dict(err=m[0], allowed=m[1], ok=not m[2], diff_single=m[3])
                       for c, m in zip((c for c, _ in checks), mine.tolist(), strict=True)}
    if rank == 0:
        print(json.dumps(dict(exactness=found)), flush=True)
    return found


def cp_overlap(out: Path | None, seqlens=SEQLENS, batch: int = SHAPE["batch"], heads: int = SHAPE["heads"],
               head_dim: int = SHAPE["head_dim"], dtype=torch.bfloat16,
               every: dict[str, _Provider] | None = None) -> dict:
    """One traced forward + backward of each ring (CUDA only): transfer_overlap per rank, and the traces."""
    world, rank, device = _init()
    if device.type != "cuda":
        return {}
    from torch.profiler import ProfilerActivity, profile

    from .transfer_overlap import transfer_overlap
    if not any(n <= TRACE_SEQLEN for n in seqlens):
        return {}
    every = providers(world) if every is None else every
    seqlen = max(n for n in seqlens if n <= TRACE_SEQLEN)
    whole = _whole_inputs(seqlen, batch, heads, seqlen, head_dim, dtype, device)
    found = dict(seqlen=seqlen)
    for name in (n for n in RINGS if n in every):
        run = _steps(every[name], whole)["fwd_bwd"]
        run()
        _sync(device)
        dist.barrier()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run()
            _sync(device)
        path = Path(f"/tmp/cp_trace_{os.getpid()}.json")
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            slug = name.split(" ")[0]
            with gzip.open(out / f"cp_g{world}_trace_{slug}_rank{rank}.json.gz", "wt") as f:
                json.dump(events, f)
        path.unlink()
        per_rank = [None] * world
        dist.all_gather_object(per_rank, transfer_overlap(events))
        found[name] = per_rank
    if rank == 0:
        print(json.dumps(dict(overlap=found)), flush=True)
    return found


def cp_table(rows: list[dict]) -> str:
    names = [key[: -len(" fwd")] for key in rows[0]["efficiency"] if key.endswith(" fwd")]
    lines = ["| G | N | mode | flash_attention, whole N, ms | " + " | ".join(f"{n} ms (efficiency)" for n in names)
             + " |", "|---" * (4 + len(names)) + "|"]
    for r in rows:
        for mode in ("fwd", "fwd_bwd"):
            ms, eff = r["ms"], r["efficiency"]
            lines.append(f"| {r['world']} | {r['seqlen']} | {mode} | {ms[f'{WHOLE} {mode}']:.3f} | "
                         + " | ".join(f"{ms[f'{n} {mode}']:.3f} ({eff[f'{n} {mode}']:.2f})" for n in names) + " |")
    return "\n".join(lines)


def exactness_table(found: dict[str, dict]) -> str:
    lines = ["| provider | quantity | error vs float64 | allowed | within | max diff from one GPU |",
             "|---|---|---|---|---|---|"]
    for name, quantities in found.items():
        for quantity, f in quantities.items():
            lines.append(f"| {name} | {quantity} | {f['err']:.2e} | {f['allowed']:.2e} | "
                         f"{'yes' if f['ok'] else 'NO'} | {f['diff_single']:.2e} |")
    return "\n".join(lines)


def overlap_table(found: dict) -> str:
    lines = ["| provider | rank | step ms | kernels ms | transfers ms | hidden | exposed ms |",
             "|---|---|---|---|---|---|---|"]
    for name, per_rank in found.items():
        if name == "seqlen":
            continue
        for rank, o in enumerate(per_rank):
            hidden = "-" if o["hidden_fraction"] is None else f"{o['hidden_fraction']:.1%}"
            lines.append(f"| {name} | {rank} | {o['step_us'] / 1e3:.3f} | {o['compute_us'] / 1e3:.3f} | "
                         f"{o['transfer_us'] / 1e3:.3f} | {hidden} | {o['exposed_us'] / 1e3:.3f} |")
    return "\n".join(lines)


def cp_report(out: Path) -> str:
    """cp.md (and cp.png with matplotlib) from every cp_g*.json in `out`: each G's tables, and the
    efficiency against N per provider and G."""
    from .plotting import pyplot
    runs = sorted((json.loads(p.read_text()) for p in out.glob("cp_g*.json")), key=lambda r: r["rows"][0]["world"])
    parts = ["# Context parallelism on NVIDIA H200s\n",
             "B=1, H=32, D=128, bf16, causal. Efficiency: (flash_attention on the whole sequence on one GPU / G) / "
             "the slowest rank's time. Command: `torchrun --nproc-per-node=G -m flashtriton bench --suite cp` "
             "(benchmarks/cp_scaling.sh); tools/cp_bench.py says what each part measures.\n"]
    for run in runs:
        world, meta = run["rows"][0]["world"], run["meta"]
        parts.append(f"## G = {world} (commit {meta.get('commit')}, {meta.get('gpu')}, torch {meta.get('torch')})\n")
        parts.append(cp_table(run["rows"]) + "\n")
        if run.get("exactness"):
            shape = run.get("exact_shape", EXACT_SHAPE)
            parts.append(f"Exactness at B={shape['batch']} H={shape['heads']} N={shape['seqlen']} "
                         f"D={shape['head_dim']}, the worst rank:\n\n" + exactness_table(run["exactness"]) + "\n")
        if run.get("overlap"):
            parts.append(f"One traced forward + backward at N={run['overlap']['seqlen']}:\n\n"
                         + overlap_table(run["overlap"]) + "\n")
    text = "\n".join(parts)
    (out / "cp.md").write_text(text)
    plt = pyplot()
    if plt is not None and runs:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
        for ax, mode in zip(axes, ("fwd", "fwd_bwd"), strict=True):
            for run in runs:
                rows = run["rows"]
                for key in rows[0]["efficiency"]:
                    if key.endswith(f" {mode}"):
                        name = key[: -len(mode) - 1]
                        ax.plot([r["seqlen"] for r in rows], [r["efficiency"][key] for r in rows], marker="o",
                                label=f"G={rows[0]['world']} {name}")
            ax.set_xscale("log", base=2)
            ax.axhline(1.0, color="grey", linewidth=0.8)
            # the scaling run's targets (issue 23): the zigzag ring at 128k tokens on 2 GPUs
            ax.axhline(TARGETS[mode], color="grey", linewidth=0.8, linestyle="--", label="target, 128k on 2 GPUs")
            ax.set_title({"fwd": "forward", "fwd_bwd": "forward + backward"}[mode])
            ax.set_xlabel("total sequence length N")
        axes[0].set_ylabel("scaling efficiency")
        axes[1].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "cp.png", dpi=120)
        plt.close(fig)
    return text


def merged_run(run: dict, earlier: dict | None) -> dict:
    """`run` with the rows of an `earlier` run of the same commit at other lengths, and its overlap where
    `run` traced none; an earlier commit's run is replaced whole."""
    if earlier is None or earlier["meta"].get("commit") != run["meta"].get("commit"):
        return run
    lengths = {r["seqlen"] for r in run["rows"]}
    rows = sorted([r for r in earlier["rows"] if r["seqlen"] not in lengths] + run["rows"], key=lambda r: r["seqlen"])
    return dict(run, rows=rows, overlap=run["overlap"] or earlier.get("overlap", {}))


def bench_cp(out: Path | None, seqlens=None) -> int:
    from .bench import environment
    seqlens = seqlens or SEQLENS
    every = providers(_init()[0])
    rows = cp_rows(seqlens, every=every)
    exactness = cp_exactness(**EXACT_SHAPE, every=every)
    overlap = cp_overlap(out, seqlens, every=every)
    if dist.get_rank() == 0:
        print(cp_table(rows))
        print(exactness_table(exactness))
        if overlap:
            print(overlap_table(overlap))
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            path = out / f"cp_g{rows[0]['world']}.json"
            run = dict(meta=environment(), rows=rows, exactness=exactness, exact_shape=EXACT_SHAPE, overlap=overlap)
            path.write_text(json.dumps(merged_run(run, json.loads(path.read_text()) if path.exists() else None),
                                       indent=1))
            cp_report(out)
    dist.destroy_process_group()
    return 0
