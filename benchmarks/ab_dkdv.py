"""A/B/C... of dK/dV kernel variants in one process (GPU only): each variant is a kernel source (this tree's
or another commit's backward.py), a tile config and extra launch keywords (constexprs, `maxnreg`); dQ is
fixed. Rounds of `triton.testing.do_bench` medians go through the variants in turn, so that a drift of the
clocks hits all alike; the report is each variant's median over rounds, the speedup over the first, and
the largest difference of its gradients from the first's.

    git show 6ebd345:src/flashtriton/kernels/backward.py > old_backward.py   # untracked: it travels
    PYTHONPATH=src python benchmarks/ab_dkdv.py --kernel old=old_backward.py \\
        --case 1,16,16384,64,causal --dq 128,64,8,3,tma \\
        --variant "head:old:64,64,4,3,tma" --variant "mask everywhere:.:64,64,4,3,tma:LOOP_FORM=3" [--out DIR]

A variant is "label:kernel:BLOCK_M,BLOCK_N,warps,stages[,tma][:key=value,...]", kernel "." for this tree.
When a change reaches past the dK/dV kernel (its arguments, the preprocess), compare whole packages
instead: `--package base=DIR` imports the copy of the package in DIR/flashtriton under its own name, and a
variant whose kernel is "base" runs that copy's backward, dK/dV kernel and all:

    mkdir -p base && git archive 698da17 src/flashtriton | tar -x -C base --strip-components=1
    PYTHONPATH=src python benchmarks/ab_dkdv.py --package base=base --case 1,16,16384,64,causal \
        --variant "before:base:64,64,4,3,tma" --variant "after:.:64,64,4,3,tma"
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from ab_backward import interleaved_times, parse_case  # this folder is on the path when run as a script
from flashtriton import ops
from flashtriton.testing import make_qkv
from flashtriton.tuning import TileConfig


def load_kernel(path: Path):
    """attn_bwd_dkdv_kernel of another backward.py (its relative imports made absolute)."""
    source = path.read_text().replace("from .common import", "from flashtriton.kernels.common import")
    folder = Path(tempfile.mkdtemp())
    name = f"backward_{path.stem}"
    (folder / f"{name}.py").write_text(source)  # Triton reads a kernel's source from its file
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.attn_bwd_dkdv_kernel


def load_package(name: str, folder: Path):
    """The `ops` module of the copy of flashtriton in folder/flashtriton, imported as package `name` (its
    imports are relative, so the copy uses its own kernels throughout)."""
    package = folder / "flashtriton"
    spec = importlib.util.spec_from_file_location(name, package / "__init__.py",
                                                  submodule_search_locations=[str(package)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return importlib.import_module(f"{name}.ops")


def tile(text: str) -> TileConfig:
    parts = text.split(",")
    return TileConfig(*map(int, parts[:4]), use_tma=parts[4:] == ["tma"])


class WithLaunchKeywords:
    """A kernel whose launches get extra keywords (constexprs, `maxnreg`)."""

    def __init__(self, kernel, keywords: dict):
        self.kernel, self.keywords = kernel, keywords

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.kernel[grid](*args, **{**kwargs, **self.keywords})


def parse_variant(text: str, kernels: dict, dq: str) -> tuple[str, tuple, TileConfig, TileConfig]:
    """(label, (ops module, dK/dV kernel), dK/dV tiles, dQ tiles); the keyword dq=M/N/warps/stages[/tma]
    replaces --dq."""
    label, kernel_name, config, *extra = text.split(":")
    keywords = {}
    for item in (extra[0].split(",") if extra else []):
        key, value = item.split("=")
        if key == "dq":
            dq = value.replace("/", ",")
        else:
            keywords[key] = int(value)
    module, kernel = kernels[kernel_name]
    return (label, (module, WithLaunchKeywords(kernel, keywords) if keywords else kernel), tile(config),
            tile(dq))


def backward_with(module_and_kernel, do, q, k, v, o, lse, causal: bool, configs):
    """`module`'s backward with `kernel` as its dK/dV kernel (the module's own restored after each call)."""
    module, kernel = module_and_kernel
    default = module.attn_bwd_dkdv_kernel

    def call():
        module.attn_bwd_dkdv_kernel = kernel
        try:
            return module.attention_backward(do, q, k, v, o, lse, causal, q.shape[-1] ** -0.5, configs, False)
        finally:
            module.attn_bwd_dkdv_kernel = default
    return call


def _wall_ms(call) -> float:
    start = time.perf_counter()
    call()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", action="append", default=[], help="NAME=PATH of another backward.py")
    parser.add_argument("--package", action="append", default=[],
                        help="NAME=DIR: the copy of the package in DIR/flashtriton")
    parser.add_argument("--case", action="append", required=True, help="B,H,N,D[,causal]")
    parser.add_argument("--dq", default="128,64,8,3,tma", help="the dQ kernel's tiles")
    parser.add_argument("--variant", action="append", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--name", default="ab_dkdv", help="the result file's name (without .json)")
    parser.add_argument("--device", default="cuda", help="cpu with TRITON_INTERPRET=1: a dry run of the script")
    args = parser.parse_args()
    kernels = {".": (ops, ops.attn_bwd_dkdv_kernel)}
    kernels.update({name: (ops, load_kernel(Path(path))) for name, path in (k.split("=") for k in args.kernel)})
    for name, folder in (p.split("=") for p in args.package):
        module = load_package(f"flashtriton_{name}", Path(folder))
        kernels[name] = (module, module.attn_bwd_dkdv_kernel)
    variants = [parse_variant(v, kernels, args.dq) for v in args.variant]
    rows = []
    for case in args.case:
        batch, heads, seqlen, head_dim, causal = parse_case(case)
        q, k, v = make_qkv(batch, heads, heads, seqlen, seqlen, head_dim, torch.bfloat16, args.device,
                           requires_grad=False)
        o, lse = ops.attention_forward(q, k, v, causal, head_dim ** -0.5)
        do = torch.randn_like(o)
        calls, grads = [], []
        for label, kernel, config, dq in variants:
            call = backward_with(kernel, do, q, k, v, o, lse, causal, (config, dq))
            try:
                grads.append(call())
                calls.append((label, f"{config.name} {dq.name}", call))
            except Exception as error:  # a variant that does not compile or fit is reported, not fatal
                print(f"{label}: failed: {str(error).splitlines()[0][:200]}", flush=True)
        timer = None if args.device == "cuda" else _wall_ms  # a dry run has no do_bench
        times = interleaved_times([call for _, _, call in calls], args.rounds, timer, warmup=10, rep=50)
        first = statistics.median(times[0])
        print(f"B{batch} H{heads} N{seqlen} D{head_dim} causal={causal} (dK/dV tiles, dQ tiles)", flush=True)
        for (label, config, _), g, all_ms in zip(calls, grads, times, strict=True):
            ms = statistics.median(all_ms)
            diff = max((x.float() - y.float()).abs().max().item() / y.float().abs().max().item()
                       for x, y in zip(g, grads[0], strict=True))
            rows.append(dict(shape=[batch, heads, seqlen, head_dim], causal=causal, variant=label,
                             tiles=config, ms=ms, speedup=first / ms,
                             max_rel_diff=diff, all_ms=all_ms))
            print(f"  {label:28s} {config:37s} {ms:.3f} ms  x{first / ms:.3f}  grads differ {diff:.1e}",
                  flush=True)
        if args.out:  # after every case, so that a run cut short keeps what it finished
            args.out.mkdir(parents=True, exist_ok=True)
            gpu = torch.cuda.get_device_name() if args.device == "cuda" else args.device
            (args.out / f"{args.name}.json").write_text(json.dumps(
                dict(gpu=gpu, variants=args.variant, dq=args.dq, rows=rows), indent=1))


if __name__ == "__main__":
    main()
