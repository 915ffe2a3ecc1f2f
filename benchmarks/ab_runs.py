"""What the A/B scripts beside it share (gluon_grid_ab.py, gluon_backward_ab.py, gluon_kernel_ab.py,
fp8_forward.py, fp8_fallback.py, the decode scripts): providers timed in interleaved rounds, a shape's
JSON line, the command line that picks shapes (and an earlier file to race beside, --base), a file loaded
as a module, and the peers and references they race against. Run as scripts
(`python benchmarks/<name>.py`), they import this from their own folder."""

import argparse
import importlib.util
import json
import statistics
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench, do_bench_cudagraph

from flashtriton.tools.bench import environment_variable


def timed_rounds(providers: dict[str, Callable], rounds: int, graphs: bool = False) -> dict[str, float]:
    """Each provider's median ms over `rounds` rounds, one do_bench of each per round in turn, so that the
    GPU's clock and heat drift alike for all; with `graphs`, do_bench_cudagraph (the GPU time alone; it
    runs on a side stream, so the inputs must be ready: synchronise first)."""
    times = {name: [] for name in providers}
    for _ in range(rounds):
        for name, fn in providers.items():
            times[name].append(do_bench_cudagraph(fn, rep=30) if graphs else do_bench(fn, warmup=10, rep=40))
    return {name: statistics.median(t) for name, t in times.items()}


def shape_line(batch: int, heads: int, n: int, head_dim: int, causal: bool, flops: float, ms: dict[str, float],
               **extra) -> dict:
    """One shape's result: its name, each provider's TFLOP/s on `flops` and ms, and `extra` entries."""
    return dict(shape=f"B{batch} H{heads} N{n} D{head_dim} {'causal' if causal else 'full'}",
                tflops={name: round(flops / t / 1e9, 1) for name, t in ms.items()},
                ms={name: round(t, 4) for name, t in ms.items()}, **extra)


def main(race: Callable[..., dict], shapes: list[tuple], description: str,
         load_base: Callable[[str], object] | None = None) -> None:
    """Print race(*shape) as a JSON line for every shape, or for those --shapes picks by index; with
    `load_base`, also `--base FILE`, whose load_base(FILE) each race takes as `base=`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--shapes", default=None, help="indices into the script's SHAPES (default: all)")
    if load_base is not None:
        parser.add_argument("--base", default=None, help="an earlier commit's file to race beside this tree's")
    args = parser.parse_args()
    extra = {} if load_base is None else {"base": None if args.base is None else load_base(args.base)}
    for shape in shapes if args.shapes is None else [shapes[int(i)] for i in args.shapes.split(",")]:
        print(json.dumps(race(*shape, **extra)), flush=True)


def load_module(path: str, name: str):
    """The Python file at `path` imported as the module `name` (e.g. an earlier commit's copy of a file; a
    name inside the flashtriton package lets its relative imports resolve against this tree)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def fp8_cache(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(k_fp8, v_fp8, k_descale, v_descale): a bf16 cache in e4m3 with one factor per tensor (its largest
    magnitude maps to e4m3's 448), as the decode A/B scripts race it."""
    k_descale, v_descale = (x.abs().amax().float().reshape(1) / 448 for x in (k, v))
    k8, v8 = ((x.float() / s).to(torch.float8_e4m3fn) for x, s in ((k, k_descale), (v, v_descale)))
    return k8, v8, k_descale, v_descale


def cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> Callable:
    """PyTorch SDPA's cuDNN backend on (B, H, N, D) q, k, v (with enable_gqa where k has fewer heads), as a
    provider."""
    gqa = q.shape[1] != k.shape[1]

    def call():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    return call


def inside(context: Callable[[], AbstractContextManager], fn: Callable) -> Callable:
    """fn as a provider that runs inside a fresh `context()` each call: e.g. a path forced by
    `lambda: environment_variable(variable, value)`, or a kernel swapped in by mock.patch.object."""
    def run():
        with context():
            return fn()
    return run


def on_path(variable: str, path: str, fn: Callable) -> Callable:
    """fn with the environment variable that picks a path (FLASHTRITON_FORWARD, FLASHTRITON_BACKWARD) set
    to `path` while it runs."""
    return inside(lambda: environment_variable(variable, path), fn)


def largest_error(x: torch.Tensor, reference: torch.Tensor) -> float:
    """The largest absolute difference, to two digits, as the scripts' JSON lines report it."""
    return float(f"{(x.float() - reference).abs().max().item():.1e}")


def float32_gradients(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, causal: bool) -> tuple:
    """(dQ, dK, dV) of SDPA in float32 on (B, H, N, D) inputs: the reference the backward scripts' errors are
    taken against."""
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
    return torch.autograd.grad(F.scaled_dot_product_attention(*leaves, is_causal=causal), leaves, do.float())


def cudnn_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, causal: bool) -> Callable:
    """cuDNN's backward (through SDPA's autograd graph, built once) on these inputs, as a provider."""
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = F.scaled_dot_product_attention(*leaves, is_causal=causal)
    return lambda: torch.autograd.grad(o, leaves, do, retain_graph=True)
