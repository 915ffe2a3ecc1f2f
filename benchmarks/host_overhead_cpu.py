"""The launcher's own host cost, on any machine: the kernels are stand-ins that launch nothing, so what is
timed is our Python between the call and Triton's launch (checks, allocation, config choice,
descriptors, and for the autotuned path our keying of the autotuner's pick). Runs on CPU tensors through
Triton's interpreter mode; the figures compare commits on one machine, not the GPU host
(benchmarks/host_overhead.py).

    PYTHONPATH=src python benchmarks/host_overhead_cpu.py
"""

import os
import statistics
import time

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from flashtriton import launch  # noqa: E402
from flashtriton.launch import TileConfig, autotune  # noqa: E402


class _NoLaunch:
    """A kernel that launches nothing. Its `fn` is the real kernel, where Triton's autotuner finds the
    cache key (and so the real kernel's pick in Triton's disk cache)."""

    def __init__(self, kernel):
        self.arg_names, self.fn = kernel.arg_names, kernel

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None

    def run(self, *args, **kwargs):
        return None


def per_call_us(fn, calls: int) -> float:
    for _ in range(500):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    q = torch.randn(1, 2, 128, 64, dtype=torch.bfloat16)
    stub = launch.Kernels(forward=_NoLaunch(launch.DEFAULT_KERNELS.forward))
    launch.attention_forward(q, q, q, False, 0.125, autotune=True)  # tune once, so later calls only key
    # The stand-in's autotuner takes the real one's pick, so later calls only key and launch.
    autotune.autotuner("fwd", stub.forward, True).cache.update(
        autotune.autotuner("fwd", launch.DEFAULT_KERNELS.forward, True).cache)
    block_ptr = TileConfig(128, 64, 4, 3)  # what small problems take on a GPU
    rounds = {"static": [], "tuned": []}
    with torch.no_grad():
        for _ in range(5):  # interleaved rounds: the machine's drift hits both alike
            rounds["static"].append(per_call_us(
                lambda: launch.attention_forward(q, q, q, False, 0.125, block_ptr, kernels=stub), 20000))
            rounds["tuned"].append(per_call_us(
                lambda: launch.attention_forward(q, q, q, False, 0.125, autotune=True, kernels=stub), 5000))
    print(f"attention_forward, static pointer-load tiles, launch stubbed: "
          f"{statistics.median(rounds['static']):.1f} µs per call (median of 5 rounds)")
    print(f"attention_forward, autotuned (TMA descriptors), launch stubbed: "
          f"{statistics.median(rounds['tuned']):.1f} µs per call (median of 5 rounds)")


if __name__ == "__main__":
    main()
