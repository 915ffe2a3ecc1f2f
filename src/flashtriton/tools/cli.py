"""flashtriton's command line: `python -m flashtriton {bench, sweep, roofline, inspect}`.

bench: on a CUDA GPU, a correctness check against float64, then a suite's benchmark table against the
peers; without one, the same correctness check on small shapes through Triton's interpreter (timing needs
a GPU). sweep and roofline need a GPU; inspect compiles the kernels for Hopper on any machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

MODES = ("fwd", "bwd", "fwd_bwd")
DTYPES = ("bf16", "fp16", "fp32")
INSPECT_DTYPES = (*DTYPES, "fp8")  # fp8: the Gluon forward's FP8 form (--gluon)


def _comma_list(valid: tuple[str, ...] | None = None, kind=str):
    """An argparse type: a comma-separated list of `kind`, each one of `valid` when given."""
    def parse(text: str) -> list:
        items = [x.strip() for x in text.split(",") if x.strip()]
        try:
            items = [kind(x) for x in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {kind.__name__}s") from None
        unknown = [x for x in items if valid is not None and x not in valid]
        if unknown or not items:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(map(str, unknown)) or 'empty list'}; "
                                             f"choose from {', '.join(valid or ())}")
        return items
    return parse


def _parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(prog="python -m flashtriton", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"flashtriton {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{bench,sweep,roofline,inspect}")
    bench = sub.add_parser(
        "bench", help="check correctness, then time against the peers (GPU)",
        description="On a CUDA GPU: check O, L and the gradients against float64, then time a suite against "
                    "the peers (PyTorch's SDPA backends, FlexAttention) and print its table. Without a GPU: the "
                    "same check on small shapes through Triton's interpreter (timing needs a GPU).")
    bench.add_argument("--suite", default="article",
                       choices=["article", "paper", "cs336", "memory", "variants", "decode", "cp"],
                       help="article: the article's table; paper: the FlashAttention-2 paper's sweep; "
                            "cs336: B=1, H=16, N=16384, D=64 causal; memory: peak memory of forward + "
                            "backward at N = 16k and 64k (add sdpa_math, plain attention, to --providers); "
                            "variants: GQA, a sliding window, softcap, ALiBi and a packed batch at D=128 "
                            "(fwd and bwd); decode: a few query tokens against a KV cache, contiguous and "
                            "paged, in ms and TB/s against a measured read ceiling, cuDNN and sdpa_flash; "
                            "cp: context-parallel ring and Ulysses attention, under torchrun (one rank per GPU; "
                            "alone, G = 1)")
    bench.add_argument("--providers", default="flashtriton,sdpa,sdpa_flash,sdpa_cudnn,flex", type=_comma_list(),
                       help="comma-separated providers to race (default: %(default)s; also sdpa_math; "
                            "flashtriton_triton and flashtriton_gluon, flash_attention with its forward path forced "
                            "(FLASHTRITON_FORWARD); and fa4, "
                            "FlashAttention-4 where importable, FLASHTRITON_FA4_SITE naming a site directory)")
    bench.add_argument("--modes", default=None, type=_comma_list(MODES),
                       help="comma-separated: fwd, bwd, fwd_bwd (default: fwd; all three for cs336; "
                            "fwd_bwd for memory; fwd and bwd for variants)")
    bench.add_argument("--out", type=Path, default=None, help="write <suite>.json/.md/.png into this folder")
    bench.add_argument("--seqlens", default=None, type=_comma_list(kind=int),
                       help="comma-separated: time only these N of the suite")
    bench.add_argument("--head-dims", default=None, type=_comma_list(kind=int),
                       help="comma-separated: time only these D of the suite")
    bench.add_argument("--variants", default=None, type=_comma_list(),
                       help="comma-separated: time only the shapes of these variants of the variants suite "
                            "by kind (e.g. varlen,alibi; 'plain' for none)")
    bench.add_argument("--merge", action="store_true",
                       help="keep the rows of an earlier <suite>.json in --out that this run does not replace")

    sweep = sub.add_parser(
        "sweep", help="time every tile configuration of one kernel (GPU); CSV + heatmap",
        description="Compile and time each tile configuration (BLOCK_M, BLOCK_N, warps, stages, TMA, warp "
                    "specialisation) of the forward, or of one backward kernel, on one bf16 shape; write a CSV, "
                    "a heatmap and a summary. Needs a CUDA GPU, except --replot.")
    sweep.add_argument("--batch", type=int, default=4, help="batch size (default: %(default)s)")
    sweep.add_argument("--heads", type=int, default=8, help="heads (default: %(default)s)")
    sweep.add_argument("--seqlen", type=int, default=4096, help="sequence length N (default: %(default)s)")
    sweep.add_argument("--head-dim", type=int, default=64, help="head dim D (default: %(default)s)")
    sweep.add_argument("--causal", action="store_true", help="a causal mask (default: none)")
    sweep.add_argument("--kernel", default="fwd", choices=["fwd", "dkdv", "dq"],
                       help="the forward (default), or one of the backward's kernels (the other keeps its tiles)")
    sweep.add_argument("--jobs", type=int, default=None, help="parallel compile processes (default: one per core)")
    sweep.add_argument("--match", default=None, metavar="REGEX",
                       help="sweep only the configs whose name (e.g. M64-N128-w8-s2-tma-ws) matches; the "
                            "static default is always timed as the yardstick")
    sweep.add_argument("--out", type=Path, default=Path("."), help="folder for the CSV, PNG and summary")
    sweep.add_argument("--replot", type=Path, default=None, metavar="CSV",
                       help="redraw the heatmap of a sweep's CSV (no GPU needed) and exit")

    roofline = sub.add_parser(
        "roofline", help="place the kernels on the GPU's roofline; ncu profiles (GPU)",
        description="Measure the GPU's bf16 matmul and copy ceilings, time each provider at D=64 and 128, "
                    "N=4096, and place them on a roofline; profile flashtriton's kernels with Nsight Compute "
                    "where ncu is on the PATH. Needs a CUDA GPU.")
    roofline.add_argument("--providers", default="flashtriton,sdpa,sdpa_flash", type=_comma_list(),
                          help="comma-separated providers to place (default: %(default)s)")
    roofline.add_argument("--modes", default="fwd,bwd", type=_comma_list(MODES),
                          help="comma-separated: fwd, bwd, fwd_bwd (default: %(default)s)")
    roofline.add_argument("--no-ncu", action="store_true", help="skip the Nsight Compute profile")
    roofline.add_argument("--out", type=Path, default=Path("."), help="folder for roofline.json/.md/.png")
    roofline.add_argument("--profile-target", action="store_true", help=argparse.SUPPRESS)
    roofline.add_argument("--head-dim", type=int, default=64, help=argparse.SUPPRESS)
    roofline.add_argument("--causal", action="store_true", help=argparse.SUPPRESS)
    roofline.add_argument("--backward", action="store_true", help=argparse.SUPPRESS)

    inspect = sub.add_parser(
        "inspect", help="compile the kernels for sm_90 (no GPU needed): registers, spills, wgmma",
        description="Compile the forward and backward kernels for Hopper (sm_90) with Triton's own ptxas, on "
                    "any machine, and report per kernel: registers, spilled bytes, shared memory, and the "
                    "HGMMA (wgmma) and HMMA instruction counts of the SASS.")
    inspect.add_argument("--head-dims", default="64,128,256", type=_comma_list(kind=int),
                         help="comma-separated (default: %(default)s)")
    inspect.add_argument("--dtypes", default="bf16", type=_comma_list(INSPECT_DTYPES),
                         help="comma-separated: bf16, fp16, fp32, fp8 (with --gluon or --decode) "
                              "(default: %(default)s)")
    inspect.add_argument("--no-tma", action="store_true", help="the forward on pointer loads instead of TMA")
    inspect.add_argument("--qk-ahead", action="store_true", help="the experimental q k^T-ahead forward")
    inspect.add_argument("--backward-tma", action="store_true",
                         help="the backward's static tiles on TMA (the autotuner's data path)")
    inspect.add_argument("--backward-candidates", action="store_true",
                         help="the backward on each kernel's first autotuner candidate instead of its static tiles")
    inspect.add_argument("--every-backward-candidate", action="store_true",
                         help="the backward kernels alone, on each of their autotuner candidates (the i-th dK/dV "
                              "one beside the i-th dQ one)")
    inspect.add_argument("--variants", action="store_true",
                         help="compile each variant (window + softcap + ALiBi, dropout, varlen) instead")
    inspect.add_argument("--gluon", action="store_true",
                         help="the Gluon kernels (FlashAttention-3 structure: the forward in its forms, the dK/dV "
                              "kernel; D = 64 and 128, bf16 and fp16) instead")
    inspect.add_argument("--decode", action="store_true",
                         help="the decode kernel instead, a bf16 q against a cache in each dtype (bf16, fp8: an "
                              "FP8 cache); without and with a causal mask over 4 query tokens")
    inspect.add_argument("--json", action="store_true", help="print JSON instead of a markdown table")
    return parser


def _check_names(parser: argparse.ArgumentParser, option: str, given: list[str] | None, valid) -> None:
    """Exit through argparse (status 2) when a list option names something that does not exist."""
    unknown = [x for x in given or () if x not in valid]
    if unknown:
        parser.error(f"argument {option}: unknown {', '.join(unknown)}; choose from {', '.join(valid)}")



def _roofline(args: argparse.Namespace) -> int:
    from .bench import environment, warm_up_gpu
    from .roofline import (
        PROFILED_KERNELS,
        measure_ceilings,
        measure_points,
        ncu_summary,
        run_profile_target,
        write_report,
    )

    if args.profile_target:
        run_profile_target(args.head_dim, args.causal, args.backward)
        return 0
    warm_up_gpu()
    ceilings = measure_ceilings()
    print(f"ceilings: bf16 matmul {ceilings.matmul_tflops:.0f} TFLOP/s, copy {ceilings.copy_tbps:.2f} TB/s")
    points = measure_points(args.providers, args.modes)
    profiles = {}
    if not args.no_ncu:
        args.out.mkdir(parents=True, exist_ok=True)
        for head_dim in (64, 128):
            for kernel in PROFILED_KERNELS:
                name = f"{kernel.removeprefix('attn_').removesuffix('_kernel')} D{head_dim}-N4096-full"
                profiles[name] = ncu_summary(head_dim, False, args.out / f"ncu_{name.replace(' ', '_')}.csv",
                                             kernel)
    write_report(args.out, ceilings, points, profiles, environment())
    print((args.out / "roofline.md").read_text())
    return 0


def _inspect(args: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    import torch

    from ..launch import gluon_backward, gluon_forward
    from .inspect import (
        inspect_backward_candidates,
        inspect_decode,
        inspect_defaults,
        inspect_gluon,
        inspect_gluon_backward,
        inspect_variants,
        markdown,
    )

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": torch.float8_e4m3fn}
    if "fp8" in args.dtypes and not (args.gluon or args.decode):
        raise SystemExit("--dtypes fp8 is the Gluon forward's FP8 form or the decode kernel's FP8 cache: add "
                         "--gluon or --decode")
    reports = []
    for name in args.dtypes:
        for head_dim in args.head_dims:
            for causal in (False, True):
                if args.decode:
                    reports += inspect_decode(head_dim, dtypes[name], causal)
                    continue
                if args.variants:
                    reports += inspect_variants(head_dim, dtypes[name], causal)
                    continue
                if args.every_backward_candidate:
                    reports += inspect_backward_candidates(head_dim, dtypes[name], causal)
                    continue
                if args.gluon:  # the head dims each Gluon kernel takes
                    if head_dim in gluon_forward.forward_head_dims(name == "fp8"):
                        reports += inspect_gluon(head_dim, dtypes[name], causal)
                    if name != "fp8" and head_dim in gluon_backward.BLOCK_M:  # (FP8: a forward only)
                        reports += inspect_gluon_backward(head_dim, dtypes[name], causal)
                    continue
                reports += inspect_defaults(head_dim, dtypes[name], causal, use_tma=not args.no_tma,
                                            qk_ahead=args.qk_ahead, backward_tma=args.backward_tma,
                                            backward_candidates=args.backward_candidates)
    print(json.dumps([asdict(r) for r in reports]) if args.json else markdown(reports))
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from .sweep import heatmap, read_csv, run_sweep, write_csv

    if args.replot is not None:
        png = args.replot.with_suffix(".png")
        if not heatmap(read_csv(args.replot), png, f"forward TFLOP/s, {args.replot.stem.removeprefix('sweep_')}, bf16"):
            print("drawing the heatmap needs matplotlib: pip install matplotlib", file=sys.stderr)
            return 2
        print(f"wrote {png}")
        return 0

    shape = f"B{args.batch}-H{args.heads}-N{args.seqlen}-D{args.head_dim}-{'causal' if args.causal else 'full'}"
    what = {"fwd": "forward", "dkdv": "backward's dK/dV", "dq": "backward's dQ"}[args.kernel]
    print(f"Sweeping the {what} tiles on {shape}, bf16")
    start = time.perf_counter()
    results, pruned = run_sweep(args.batch, args.heads, args.seqlen, args.head_dim, args.causal,
                                kernel=args.kernel, match=args.match)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / (f"sweep_{shape}" if args.kernel == "fwd" else f"sweep_{args.kernel}_{shape}")
    write_csv(results, stem.with_suffix(".csv"))
    title = "forward TFLOP/s" if args.kernel == "fwd" else f"backward TFLOP/s ({what} tiles varied)"
    heatmap(results, stem.with_suffix(".png"), f"{title}, {shape}, bf16")
    timed = sorted((r for r in results if r.tflops), key=lambda r: -r.tflops)
    compile_s = [r.compile_s for r in results if r.status != "compile error" and r.compile_s > 0]
    lines = [f"# Tile sweep of the {what} kernel, {shape}, bf16", "",
             f"{len(results)} configs compiled and timed in {time.perf_counter() - start:.0f} s; "
             f"compile + first run per config: median {statistics.median(compile_s):.1f} s, "
             f"max {max(compile_s):.1f} s." if compile_s else "", "",
             "" if args.kernel == "fwd" else "Times are of the whole backward, the other kernel on its static tiles.",
             "| BLOCK_M | BLOCK_N | warps | stages | TMA | warp spec. | q k^T ahead | ms | TFLOP/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r.block_m} | {r.block_n} | {r.num_warps} | {r.num_stages} | {r.use_tma} | {r.warp_specialize} "
              f"| {r.qk_ahead} | {r.ms:.3f} | {r.tflops:.0f} |" for r in timed[:12]]
    failed = [r for r in results if not r.tflops]
    lines += ["", f"Not timed ({len(failed)}):"] + [f"- M{r.block_m} N{r.block_n} w{r.num_warps} s{r.num_stages} "
                                                      f"tma={r.use_tma} ws={r.warp_specialize} qka={r.qk_ahead}: "
                                                      f"{r.status}" for r in failed]
    lines += ["", f"Pruned before compiling ({len(pruned)}):"] + [f"- {p}" for p in pruned]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:16 + 2]))
    return 0


def _bench_cpu() -> int:
    from .bench import check_correctness
    print("No CUDA GPU: checking the Triton kernels through Triton's interpreter on small shapes "
          "(O, L, dQ, dK, dV against float64). Timing needs a GPU.")
    ok = check_correctness("cpu", [(17, 17), (63, 97), (130, 65)], head_dim=64)
    print("all checks passed" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


def _bench_gpu(args: argparse.Namespace) -> int:
    import torch

    from ..testing import make_qkv
    from .bench import (
        DEFAULT_MODES,
        article_table,
        check_correctness,
        environment,
        has_memory_figures,
        memory_table,
        provider_table,
        run_suite,
        sdpa_default_backend,
        write_results,
    )

    if args.suite == "cp":  # its own process group, shapes and table (tools/cp_bench.py)
        from .cp_bench import bench_cp
        return bench_cp(args.out, seqlens=args.seqlens)
    if args.suite == "decode":  # its own shapes, providers and table (tools/decode_bench.py)
        from .decode_bench import bench_decode
        return bench_decode(args.out, head_dims=None if args.head_dims is None else set(args.head_dims))
    providers = args.providers
    modes = DEFAULT_MODES[args.suite] if args.modes is None else args.modes

    print(f"Correctness on {torch.cuda.get_device_name()} (O, L, dQ, dK, dV against float64):")
    if not check_correctness("cuda", [(1, 1), (97, 97), (130, 1000), (1025, 511)], head_dim=64):
        print("correctness check FAILED: not timing", file=sys.stderr)
        return 1

    meta = environment()
    q, k, v = make_qkv(4, 8, 8, 1024, 1024, 64, torch.bfloat16, "cuda", requires_grad=False)
    meta["sdpa_backend"] = sdpa_default_backend(q, k, v, False)
    seqlens, head_dims = (None if arg is None else set(arg) for arg in (args.seqlens, args.head_dims))
    print(f"\nTiming suite '{args.suite}' (plain SDPA dispatches to {meta['sdpa_backend']}):")
    unavailable: list[dict] = []
    variants = None if args.variants is None else set(args.variants)
    rows = run_suite(args.suite, providers, modes, keep=lambda s: (seqlens is None or s.seqlen_q in seqlens)
                     and (head_dims is None or s.head_dim in head_dims)
                     and (variants is None or s.variant_kind in variants), unavailable=unavailable)
    if unavailable:
        meta["unavailable"] = unavailable
    if args.out is not None:
        rows = write_results(args.out, args.suite, rows, meta, merge=args.merge)
        print(f"\nwrote {args.out}/{args.suite}.json, .md, .png")
    print(f"\n{provider_table(rows)}")
    if has_memory_figures(rows, unavailable):
        print(f"\nPeak memory of one forward + backward beyond its inputs (MiB):\n{memory_table(rows, unavailable)}")
    if args.suite == "article" and "sdpa" in providers:
        print(f"\nThe article's table (forward, B=4, H=8, D=64, bf16; SDPA = {meta['sdpa_backend']}):")
        print(article_table(rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)  # before torch loads: --help and --version answer at once
    import torch

    on_gpu = torch.cuda.is_available()
    if args.command == "bench" and not on_gpu and os.environ.get("TRITON_INTERPRET") != "1":
        # The check runs through the interpreter, which Triton picks when the kernels are defined: before
        # anything below imports them.
        if "flashtriton.kernels" in sys.modules:  # main() called in a process that already ran them
            print("no CUDA GPU, and the kernels were imported compiled: run again with TRITON_INTERPRET=1",
                  file=sys.stderr)
            return 2
        os.environ["TRITON_INTERPRET"] = "1"
    if args.command in ("bench", "roofline"):
        from .bench import PROVIDERS, SUITES

        _check_names(parser, f"{args.command} --providers", args.providers, list(PROVIDERS))
        if args.command == "bench":
            _check_names(parser, "bench --variants", args.variants,
                         list(dict.fromkeys(s.variant_kind for s in SUITES["variants"]())))

    if args.command == "inspect":
        return _inspect(args)
    if args.command == "roofline":
        if not on_gpu:
            print("the roofline measures the GPU: it needs a CUDA GPU", file=sys.stderr)
            return 2
        return _roofline(args)
    if args.command == "sweep":
        if not on_gpu and args.replot is None:
            print("the sweep times kernels: it needs a CUDA GPU", file=sys.stderr)
            return 2
        return _sweep(args)
    return _bench_gpu(args) if on_gpu else _bench_cpu()
