"""How much of a step's communication ran under its kernels, from a torch.profiler chrome trace: the GPU's
kernels and copies as spans, the transfers (NCCL kernels, peer-to-peer copies) against everything else.
The `cp` suite reports it for one traced step of each ring (tools/cp_bench.py)."""

from __future__ import annotations


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _length(spans) -> float:
    return sum(b - a for a, b in spans)


def _overlap(a, b) -> float:
    """The total length of the intersection of two unions of disjoint spans."""
    total, j = 0.0, 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            total += min(end, b[k][1]) - max(start, b[k][0])
            k += 1
    return total


def transfer_overlap(events: list[dict]) -> dict:
    """From a chrome trace's events (torch.profiler's export), the GPU's kernels and copies of one step:
    the transfers (NCCL kernels, peer-to-peer copies) against everything else. `hidden_fraction`: the
    part of the transfers' time during which another kernel also ran; `exposed_us` the rest."""
    transfers, compute = [], []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        span = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        name = e.get("name", "")
        (transfers if "nccl" in name.lower() or "PtoP" in name else compute).append(span)
    if not transfers and not compute:
        return dict(step_us=0.0, compute_us=0.0, transfer_us=0.0, hidden_us=0.0, exposed_us=0.0,
                    hidden_fraction=None)
    transfers, compute = _union(transfers), _union(compute)
    everything = _union(transfers + compute)
    transfer_us, hidden_us = _length(transfers), _overlap(transfers, compute)
    return dict(step_us=everything[-1][1] - everything[0][0], compute_us=_length(compute),
                transfer_us=transfer_us, hidden_us=hidden_us, exposed_us=transfer_us - hidden_us,
                hidden_fraction=hidden_us / transfer_us if transfer_us else None)
