"""The Gluon forward's grid at short lengths, on an sm_90 GPU: a persistent grid (one program per SM, each
looping over tiles) against one program per tile, with a causal mask, and the Gluon kernel against the
Triton kernel at N = 512 and 1024, with cuDNN beside them; at D = 64 each grid with two and with three
softmax warpgroups (128- or 192-row tiles). Providers in interleaved rounds, `do_bench` medians, bf16;
prints one JSON line per shape (TFLOP/s, and each output's largest error against SDPA in float32).
docs/performance.md, entries 55 and 80.

    PYTHONPATH=src python benchmarks/gluon_grid_ab.py [--shapes 8,9,5]
"""


import functools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import ab_runs
from flashtriton.launch import gluon_forward
from flashtriton.launch.forward import attention_forward
from flashtriton.launch.kernel_set import DEFAULT_KERNELS

ROUNDS = 5
# (batch, heads, N, head dim, causal)
SHAPES = [(32, 16, 512, 128, False), (32, 16, 512, 128, True), (16, 16, 1024, 128, True), (8, 16, 2048, 128, True),
          (4, 16, 4096, 128, True), (2, 16, 8192, 128, True), (32, 32, 512, 64, False), (16, 32, 1024, 64, False),
          (1, 16, 16384, 128, True), (1, 32, 8192, 128, True),
          (1, 16, 16384, 64, True), (4, 32, 4096, 64, True),  # D = 64 causal: may auto take Gluon (entry 60)?
          (8, 16, 2048, 64, True), (2, 16, 8192, 64, True), (1, 16, 32768, 64, True)]


def gluon(q, k, v, causal: bool, scale: float, persistent: bool, warpgroups: int | None = None) -> torch.Tensor:
    """The Gluon forward (overlapped form) on a grid of one program per SM or one per tile, with `warpgroups`
    softmax warpgroups (None: the launcher's choice)."""
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
    kernel, grid, args, kwargs = gluon_forward.gluon_forward_launch(q, k, v, o, lse, causal, scale, True, False,
                                                                    persistent=persistent, warpgroups=warpgroups)
    kernel[grid](*args, **kwargs)
    return o


def race(batch: int, heads: int, n: int, head_dim: int, causal: bool) -> dict:
    """One shape's TFLOP/s and errors for each provider (the per-tile grid only with a causal mask: without
    one the launcher's grid is persistent already; at D = 64 each grid with two and three warpgroups)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    scale = head_dim ** -0.5

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    providers = {"triton": lambda: attention_forward(q, k, v, causal, scale, kernels=DEFAULT_KERNELS)[0],
                 "gluon_tile": lambda: gluon(q, k, v, causal, scale, False),
                 "gluon_pers": lambda: gluon(q, k, v, causal, scale, True), "cudnn": cudnn}
    if head_dim == 64:
        for grid, persistent in (("tile", False), ("pers", True)):
            for warpgroups in (2, 3):
                providers[f"gluon_{grid}_w{warpgroups}"] = functools.partial(gluon, q, k, v, causal, scale, persistent,
                                                                             warpgroups)
    if not causal:
        providers = {name: fn for name, fn in providers.items() if not name.startswith("gluon_tile")}
    reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    errors = {name: (fn().float() - reference).abs().max().item() for name, fn in providers.items()}
    flops = 4 * batch * heads * n * n * head_dim / (2 if causal else 1)
    return ab_runs.shape_line(batch, heads, n, head_dim, causal, flops, ab_runs.timed_rounds(providers, ROUNDS),
                              err={name: float(f"{e:.1e}") for name, e in errors.items()})


if __name__ == "__main__":
    ab_runs.main(race, SHAPES, __doc__.split("\n\n")[0])
