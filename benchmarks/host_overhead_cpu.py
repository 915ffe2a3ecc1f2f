"""The launcher's own host cost, on any machine: the kernels are stubbed out, so what is timed is our
Python between the call and Triton's launch (checks, allocation, config choice, descriptors, and for the
autotuned path Triton's Autotuner.run). Runs on CPU tensors through Triton's interpreter mode; the
figures are for comparing commits on one machine, not for the GPU host (benchmarks/host_overhead.py).

    PYTHONPATH=src python benchmarks/host_overhead_cpu.py
"""

import os
import time

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from flashtriton import ops, tuning  # noqa: E402
from flashtriton.tuning import TileConfig  # noqa: E402


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None

    def run(self, *args, **kwargs):
        return None


def per_call_us(fn, calls: int = 20000) -> float:
    for _ in range(500):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    q = torch.randn(1, 2, 128, 64, dtype=torch.bfloat16)
    ops.attention_forward(q, q, q, False, 0.125, autotune=True)  # tune once, so later calls only key
    ops.attn_fwd_kernel = _NoLaunch()
    for tuner in tuning.attn_fwd_autotuned.values():
        tuner.fn = _NoLaunch()
    block_ptr = TileConfig(128, 64, 4, 3)  # what small problems take on a GPU
    with torch.no_grad():
        static = per_call_us(lambda: ops.attention_forward(q, q, q, False, 0.125, block_ptr))
        tuned = per_call_us(lambda: ops.attention_forward(q, q, q, False, 0.125, autotune=True), 5000)
    print(f"attention_forward, static block-pointer tiles, launch stubbed: {static:.1f} µs per call")
    print(f"attention_forward, autotuned (TMA descriptors), launch stubbed: {tuned:.1f} µs per call")


if __name__ == "__main__":
    main()
