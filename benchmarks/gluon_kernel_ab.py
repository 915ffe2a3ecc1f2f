r"""The Gluon kernels of this tree against an earlier commit's, on an sm_90 GPU: the earlier kernel file is
loaded beside the current one and launched with the same launchers' arguments. Make the file first (the
device copy of the tree has no .git), e.g.

    git show 27b6e9f:src/flashtriton/kernels/gluon_backward.py | sed 's/^from \./from flashtriton.kernels./' \
        > benchmarks/base_kernel.py
    PYTHONPATH=src python benchmarks/gluon_kernel_ab.py bwd benchmarks/base_kernel.py --base-block-m 64

`bwd`: the whole backward with FLASHTRITON_BACKWARD=gluon on each kernel (the earlier one at the current
launcher's query blocks unless --base-block-m says otherwise; a kernel from before entry 88 scales its dQ
itself, which the current launcher's read-back scales again, so its dQ error column is off, not its time), on
the current one also at D = 128 with three Q/dO stages, with D subtracted after dP^T's product
(`current_d_after`: L alone in the accumulators), with dQ's reductions issued the other way
(`current_dq_by_loader_flipped`: DQ_BY_LOADER turned over), at D = 64 with 64-row query blocks and with dQ split by
columns, and with dQ staged in dQ's own order (DQ_FRAGMENTS off; the D = 64 forms run so too, and the earlier
kernel unless it has the register-order form, 9ab68f7 on); the Triton backward and cuDNN's (TFLOP/s on 2.5x
the forward's FLOPs).
`fwd`: the forward's overlapped form on each kernel (the earlier one launched directly, not replayed),
the current one (`current`: the library's DEFAULT_OPTIONS) also with each of flags_turned_over's sets
(launch/gluon_forward.ForwardOptions, those the head dim takes), each flag turned over from the library's
setting: O's rescale skipped where the maxima held (`current_lazy`: lazy_rescale,
kernels/gluon_rescale.py), the rows' sums by the tensor cores (`current_sums`: sums_by_mma), O by TMA stores
(`current_ostore`: o_by_tma), each added to the defaults, K and V paired in one stage taken from them
(`current_no_paired`: paired_stages off), and every flag at once (`current_all`); the Triton forward and
cuDNN's; the current
one again, last (`current_again`: its gap to `current`
is what a provider's place in the round is worth);
`--pingpong` adds both kernels' ping-pong form. Interleaved rounds of `do_bench`, medians; one JSON line
per shape, with each provider's largest error against float32 SDPA (O, or dQ, dK, dV).
docs/performance.md, entries 66, 69-73, 86-92, 142 and 144.
"""

import argparse
import functools
import json
from unittest import mock

import torch
import torch.nn.functional as F

import ab_runs
from flashtriton.cache import CACHE
from flashtriton.launch import gluon_backward, gluon_forward
from flashtriton.launch.backward import attention_backward
from flashtriton.launch.forward import attention_forward

FORWARD_SHAPES = [(4, 16, 4096, 128, False), (4, 16, 4096, 128, True), (1, 16, 16384, 128, True),
                  (8, 16, 2048, 128, True), (16, 16, 1024, 128, True), (16, 16, 1024, 128, False),
                  (4, 32, 4096, 64, False), (4, 32, 4096, 64, True), (8, 16, 2048, 64, True), (1, 16, 16384, 64, True),
                  (2, 16, 8192, 64, True), (1, 16, 32768, 64, True), (4, 16, 4096, 256, False),
                  (4, 16, 4096, 256, True)]
BACKWARD_SHAPES = [(4, 16, 4096, 128, False), (4, 16, 4096, 128, True), (1, 16, 16384, 128, True),
                   (8, 16, 2048, 128, False), (16, 16, 1024, 128, True), (16, 16, 1024, 128, False),
                   (32, 16, 512, 128, False), (8, 16, 2048, 128, True), (4, 32, 4096, 64, False),
                   (4, 32, 4096, 64, True), (1, 16, 16384, 64, True), (8, 16, 2048, 64, False),
                   (16, 16, 1024, 64, False), (8, 16, 2048, 64, True), (1, 16, 16384, 128, False)]


def load_kernel(path: str, name: str):
    """The @gluon.jit function `name` of the kernel file at `path`."""
    return getattr(ab_runs.load_module(path, "base_kernels"), name)


def base_arguments(base, kernel, args: tuple, **earlier) -> tuple:
    """The current kernel's positional `args` for the earlier kernel `base`, matched by parameter name (the
    two may order them differently), with `earlier`: values of parameters only the earlier kernel has."""
    named = earlier | dict(zip(kernel.arg_names, args, strict=True))
    return tuple(named[name] for name in base.arg_names)


def flags_turned_over(default: gluon_forward.ForwardOptions, head_dim: int, fp8: bool = False
                      ) -> dict[str, gluon_forward.ForwardOptions]:
    """`default` (the library's options) with one flag turned over, by its FLAG_NAMES name (a flag on by
    default as "no_<name>"), and every flag the precision takes on (all_flags): what each flag changes beside
    what the library runs (docs/performance.md, entries 86-92). Only the sets the kernel takes at this head
    dim and precision (gluon_forward.options_fit): O by TMA not at D = 256, in FP8 not lazy_rescale beside
    sums_by_mma."""
    options = {}
    for name, field in zip(gluon_forward.FLAG_NAMES, gluon_forward.ForwardOptions._fields, strict=True):
        on = getattr(default, field)
        options[("no_" if on else "") + name] = default._replace(**{field: not on})
    options["all"] = gluon_forward.all_flags(fp8)
    return {name: o for name, o in options.items() if gluon_forward.options_fit(o, head_dim, fp8)}


def race_forward(base, pingpong: bool, batch: int, heads: int, n: int, head_dim: int, causal: bool,
                 rounds: int, skip: frozenset = frozenset()) -> dict:
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    scale = head_dim ** -0.5

    def form(turns: bool, options: gluon_forward.ForwardOptions | None = None):
        return lambda: gluon_forward.attention_forward_gluon(q, k, v, causal, scale, True, turns, options=options)

    def base_form(turns: bool):
        def run():
            o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device=q.device)
            kernel, grid, args, kwargs = gluon_forward.gluon_forward_launch(q, k, v, o, lse, causal, scale, True, turns,
                                                                            options=gluon_forward.ForwardOptions())
            base[grid](*base_arguments(base, kernel, args), **kwargs)
            return o, lse
        return run
    providers = {"base": base_form(False), "current": form(False)}
    flag_sets = flags_turned_over(gluon_forward.DEFAULT_OPTIONS, head_dim)
    providers.update({f"current_{name}": form(False, options) for name, options in flag_sets.items()})
    if pingpong:
        providers.update(base_pingpong=base_form(True), current_pingpong=form(True))
        if "all" in flag_sets:  # (not at D = 256, which O by TMA does not fit)
            providers.update(current_pingpong_all=form(True, flag_sets["all"]))
    providers.update(triton=ab_runs.on_path(gluon_forward.FORWARD_PATH_VARIABLE, "triton",
                                            lambda: attention_forward(q, k, v, causal, scale)))
    providers = {name: fn for name, fn in providers.items() if name not in skip}
    reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    errors = {name: ab_runs.largest_error(fn()[0], reference) for name, fn in providers.items()}
    providers["cudnn"] = ab_runs.cudnn(q, k, v, causal)
    if "current" in providers:  # last in each round: what the first place is worth
        providers["current_again"] = providers["current"]
    flops = 4 * batch * heads * n * n * head_dim / (2 if causal else 1)
    return ab_runs.shape_line(batch, heads, n, head_dim, causal, flops, ab_runs.timed_rounds(providers, rounds),
                              err=errors)


def race_backward(base, base_block_m, batch: int, heads: int, n: int, head_dim: int, causal: bool, rounds: int,
                  skip: frozenset = frozenset()) -> dict:
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = head_dim ** -0.5
    o, lse = attention_forward(q, k, v, causal, scale)

    launch = gluon_backward.gluon_dkdv_launch

    def base_launch(q, k, v, do, lse2, delta, *args, **kwargs):
        """The earlier kernel at `base_block_m` query rows per block (the launcher's default if None), its
        arguments matched to the current ones by name (with L and D's pointers, for a kernel from before
        853b0c5, whose compute warpgroups loaded them)."""
        kernel, grid, arguments, options = launch(q, k, v, do, lse2, delta, *args, block_m=base_block_m, **kwargs)
        return base, grid, base_arguments(base, kernel, arguments, LSE2=lse2,
                                          DELTA=delta, stats_stride=lse2.stride(-2)), options

    def backward(path: str = "gluon", launcher=launch, fragments: bool = gluon_backward.DQ_FRAGMENTS, **form):
        """The whole backward on `path`, the Gluon kernel launched by `launcher` in `form` (gluon_dkdv_launch's
        options), dQ's buffer in register order with `fragments` (DQ_FRAGMENTS); each provider keeps its own
        recorded plans, so that its calls replay its own launches (a launch path without replays would time
        Triton's host work on the shorter shapes)."""
        plans = {}
        buffer = functools.partial(gluon_backward.dq_accumulator, block_m=form.get("block_m"),
                                   split_rows=form.get("dq_split_rows"))  # (dQ's buffer to match the form)

        def run():
            with (mock.patch.object(gluon_backward, "gluon_dkdv_launch", functools.partial(launcher, **form)),
                  mock.patch.object(gluon_backward, "dq_accumulator", buffer),
                  mock.patch.object(gluon_backward, "DQ_FRAGMENTS", fragments),
                  mock.patch.object(CACHE, "plans", plans)):
                return attention_backward(do, q, k, v, o, lse, causal, scale)
        return ab_runs.on_path(gluon_backward.BACKWARD_PATH_VARIABLE, path, run)
    # (the earlier kernel in the library's dQ order where it has that form, 9ab68f7 on, at the library's blocks)
    base_fragments = "DQ_FRAGMENTS" in base.arg_names and base_block_m is None and gluon_backward.DQ_FRAGMENTS
    providers = {"base": backward(launcher=base_launch, fragments=base_fragments), "current": backward(),
                 "triton": backward("triton"), "current_dq_in_place": backward(fragments=False)}
    if head_dim == 64:  # the current kernel at the earlier 64-row query blocks, and with dQ split by columns
        providers["current_m64"] = backward(block_m=64, fragments=False)
        providers["current_split_cols"] = backward(dq_split_rows=False)
    else:  # (three stages of 128-row blocks do not fit in shared memory)
        providers["current_3_stages"] = backward(stages=3)
    if head_dim == 128:  # L alone in S^T's accumulator, D subtracted after dP^T's product (its issue unwaited)
        providers["current_d_after"] = backward(delta_in_acc=False)
    if head_dim <= 128:  # dQ's reductions issued by the loader or by the compute warpgroups, turned over
        providers["current_dq_by_loader_flipped"] = backward(dq_by_loader=not gluon_backward.DQ_BY_LOADER)
    providers = {name: fn for name, fn in providers.items() if name not in skip}
    grads = ab_runs.float32_gradients(q, k, v, do, causal)
    errors = {name: [ab_runs.largest_error(g, r) for g, r in zip(fn(), grads, strict=True)]
              for name, fn in providers.items()}
    providers["cudnn"] = ab_runs.cudnn_backward(q, k, v, do, causal)
    flops = 2.5 * 4 * batch * heads * n * n * head_dim / (2 if causal else 1)
    return ab_runs.shape_line(batch, heads, n, head_dim, causal, flops, ab_runs.timed_rounds(providers, rounds),
                              err=errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("fwd", "bwd"))
    parser.add_argument("base", help="the earlier commit's kernels/gluon_forward.py (fwd) or gluon_backward.py (bwd)")
    parser.add_argument("--pingpong", action="store_true", help="fwd: also each kernel's ping-pong form")
    parser.add_argument("--base-block-m", type=int, default=None,
                        help="bwd: the earlier kernel's query rows per block (64 for one from before 853b0c5; "
                        "default: the current launcher's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", default=None, help="indices into the mode's shapes (default: all)")
    parser.add_argument("--skip", default="", help="providers to leave out, e.g. base,current_3_stages")
    args = parser.parse_args()
    skip = frozenset(filter(None, args.skip.split(",")))
    shapes = FORWARD_SHAPES if args.mode == "fwd" else BACKWARD_SHAPES
    if args.shapes is not None:
        shapes = [shapes[int(i)] for i in args.shapes.split(",")]
    if args.mode == "fwd":
        base = load_kernel(args.base, "attn_fwd_gluon_kernel")
        lines = (race_forward(base, args.pingpong, *shape, args.rounds, skip) for shape in shapes)
    else:
        base = load_kernel(args.base, "attn_bwd_dkdv_gluon_kernel")
        lines = (race_backward(base, args.base_block_m, *shape, args.rounds, skip) for shape in shapes)
    for line in lines:
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
