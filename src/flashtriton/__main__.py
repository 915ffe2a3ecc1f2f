"""Command line: `python -m flashtriton bench [--suite article] [--out DIR]`.

On a CUDA GPU: a correctness check against float64, then the suite's benchmark table against SDPA.
Without one: the same correctness check on small shapes through Triton's interpreter (timing needs a GPU).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m flashtriton", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="check correctness, then time against the peers (GPU)")
    bench.add_argument("--suite", default="article", choices=["article"], help="which benchmark table")
    bench.add_argument("--providers", default="flashtriton,sdpa,sdpa_flash,sdpa_cudnn",
                       help="comma-separated providers to race (default: %(default)s)")
    bench.add_argument("--modes", default="fwd", help="comma-separated: fwd, bwd, fwd_bwd (default: %(default)s)")
    bench.add_argument("--out", type=Path, default=None, help="write <suite>.json/.md/.png here")
    return parser


def _bench_cpu() -> int:
    from .bench import check_correctness
    print("No CUDA GPU: checking the Triton kernels through Triton's interpreter on small shapes "
          "(O, L, dQ, dK, dV against float64). Timing needs a GPU.")
    ok = check_correctness("cpu", [(17, 17), (63, 97), (130, 65)], head_dim=64)
    print("all checks passed" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


def _bench_gpu(args: argparse.Namespace) -> int:
    import torch

    from .bench import (
        PROVIDERS,
        article_table,
        check_correctness,
        environment,
        provider_table,
        run_suite,
        sdpa_default_backend,
        write_results,
    )
    from .testing import make_qkv

    providers = [p.strip() for p in args.providers.split(",") if p.strip()]
    unknown = [p for p in providers if p not in PROVIDERS]
    if unknown:
        print(f"unknown provider(s) {unknown}; choose from {sorted(PROVIDERS)}", file=sys.stderr)
        return 2
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if any(m not in ("fwd", "bwd", "fwd_bwd") for m in modes):
        print(f"--modes takes fwd, bwd, fwd_bwd; got {args.modes!r}", file=sys.stderr)
        return 2

    print(f"Correctness on {torch.cuda.get_device_name()} (O, L, dQ, dK, dV against float64):")
    if not check_correctness("cuda", [(1, 1), (97, 97), (130, 1000), (1025, 511)], head_dim=64):
        print("correctness check FAILED: not timing", file=sys.stderr)
        return 1

    meta = environment()
    q, k, v = make_qkv(4, 8, 8, 1024, 1024, 64, torch.bfloat16, "cuda", requires_grad=False)
    meta["sdpa_backend"] = sdpa_default_backend(q, k, v, False)
    print(f"\nTiming suite '{args.suite}' (plain SDPA dispatches to {meta['sdpa_backend']}):")
    rows = run_suite(args.suite, providers, modes)
    if args.out is not None:
        write_results(args.out, args.suite, rows, meta)
        print(f"\nwrote {args.out}/{args.suite}.json, .md, .png")
    print(f"\n{provider_table(rows)}")
    if args.suite == "article" and "sdpa" in providers:
        print(f"\nThe article's table (forward, B=4, H=8, D=64, bf16; SDPA = {meta['sdpa_backend']}):")
        print(article_table(rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        if os.environ.get("TRITON_INTERPRET") != "1":
            # triton.jit chose compiled kernels when flashtriton was imported; start again interpreted.
            env = dict(os.environ, TRITON_INTERPRET="1")
            argv = sys.argv[1:] if argv is None else argv
            os.execve(sys.executable, [sys.executable, "-m", "flashtriton", *argv], env)
        return _bench_cpu()
    return _bench_gpu(args)


if __name__ == "__main__":
    sys.exit(main())
