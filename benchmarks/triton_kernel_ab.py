r"""The Triton forward kernel of this tree against an earlier commit's, on a GPU: the earlier kernels/forward.py
and kernels/common.py are loaded as a package beside the library's and launched through the same launcher
(`attention_forward(..., kernels=...)`) on the same static tiles, so that only the kernel code differs. Make
the folder first (the device copy of the tree has no .git), e.g.

    mkdir -p benchmarks/base_triton && touch benchmarks/base_triton/__init__.py && for f in forward common; do
        git show 02017b9:src/flashtriton/kernels/$f.py > benchmarks/base_triton/$f.py; done
    PYTHONPATH=src python benchmarks/triton_kernel_ab.py benchmarks/base_triton [--shapes 0,1]

Interleaved rounds of `do_bench`, medians, bf16, beside cuDNN; one JSON line per shape with each kernel's
largest error against float32 SDPA. docs/performance.md, entry 80.
"""

import argparse
import importlib
import importlib.util
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import ab_runs
from flashtriton.launch.forward import attention_forward
from flashtriton.launch.kernel_set import DEFAULT_KERNELS, Kernels
from flashtriton.launch.tiles import forward_config

ROUNDS = 5
# (batch, heads, N, head dim, causal): the paper suite's shapes at N = 2048 and 4096, and cs336's
SHAPES = [(8, 32, 2048, 64, True), (4, 32, 4096, 64, True), (4, 32, 4096, 64, False), (8, 16, 2048, 128, True),
          (4, 16, 4096, 128, True), (4, 16, 4096, 128, False), (1, 16, 16384, 64, True)]


def load_forward(folder: str):
    """The attn_fwd_kernel of the package in `folder` (an earlier forward.py and common.py, and an
    __init__.py), imported under the name base_triton."""
    path = Path(folder)
    spec = importlib.util.spec_from_file_location("base_triton", path / "__init__.py",
                                                  submodule_search_locations=[str(path)])
    package = importlib.util.module_from_spec(spec)
    sys.modules["base_triton"] = package
    spec.loader.exec_module(package)
    return importlib.import_module("base_triton.forward").attn_fwd_kernel


def race(base, batch: int, heads: int, n: int, head_dim: int, causal: bool, device: str = "cuda") -> dict:
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, head_dim, device=device, dtype=torch.bfloat16) for _ in range(3))
    scale = head_dim ** -0.5
    config = forward_config(head_dim, q.dtype, q.device, use_tma=q.device.type == "cuda")
    base_kernels = Kernels(forward=base)
    providers = {"base": lambda: attention_forward(q, k, v, causal, scale, config, kernels=base_kernels)[0],
                 "current": lambda: attention_forward(q, k, v, causal, scale, config, kernels=DEFAULT_KERNELS)[0]}
    reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    errors = {name: ab_runs.largest_error(fn(), reference) for name, fn in providers.items()}
    if device != "cuda":  # (a check of the plumbing through the interpreter: no timing)
        return dict(err=errors)
    providers["cudnn"] = ab_runs.cudnn(q, k, v, causal)
    flops = 4 * batch * heads * n * n * head_dim / (2 if causal else 1)
    return ab_runs.shape_line(batch, heads, n, head_dim, causal, flops, ab_runs.timed_rounds(providers, ROUNDS),
                              err=errors, tiles=config.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="a folder with the earlier kernels/forward.py, common.py and an __init__.py")
    parser.add_argument("--shapes", default=None, help="indices into SHAPES (default: all)")
    args = parser.parse_args()
    base = load_forward(args.base)
    shapes = SHAPES if args.shapes is None else [SHAPES[int(i)] for i in args.shapes.split(",")]
    for shape in shapes:
        print(json.dumps(race(base, *shape)), flush=True)


if __name__ == "__main__":
    main()
