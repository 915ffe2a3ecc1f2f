"""The compiled kernels, read offline for sm_90 (no GPU needed): matrix products on wgmma, no spills."""


import os
import subprocess
import sys

import pytest
import triton

from flashtriton.tools.inspect import branch_target, loops, skippable_fmuls
from helpers import inspect_reports


def _inspect(*flags: str, head_dim: int = 64) -> list[dict]:
    return inspect_reports("--head-dims", str(head_dim), *flags)


@pytest.fixture(scope="module")
def reports():
    return _inspect()


def test_matrix_products_use_hopper_wgmma(reports):
    for r in reports:
        if r["kernel"] != "attn_bwd_preprocess_kernel":
            assert r["hgmma"] > 0 and r["hmma"] == 0, r


def test_forward_does_not_spill(reports):
    for r in reports:
        if r["kernel"] == "attn_fwd_kernel":
            assert r["stack_bytes"] == 0 and r["local_bytes"] == 0, r


def test_wgmma_runs_asynchronously(reports):
    """ptxas serialises a kernel's wgmma instructions (a wait after each) when non-wgmma code defines
    their accumulators between issue and wait (NOTES entry 31). The forward and dQ kernels, and the dK/dV
    kernel's one-loop form (no band here), must stay clear of it. The causal D=64 dK/dV kernel's three
    loops on pointer loads (the static tiles here) are still serialised; on TMA, its autotuned data path,
    they are not (the next test)."""
    for r in reports:
        one_loop_dkdv = r["kernel"] == "attn_bwd_dkdv_kernel" and not r["causal"]
        if r["kernel"] in ("attn_fwd_kernel", "attn_bwd_dq_kernel") or one_loop_dkdv:
            assert not r["wgmma_serialized"] and r["wgmma_waits"] < r["hgmma"], r
    if triton.__version__.startswith("3.6"):  # the advisory is read where ptxas gives it (3.9 does not here)
        assert [r["causal"] for r in reports if r["wgmma_serialized"]] == [True], reports


def test_ptxas_log_is_kept_from_the_compile_and_read_again_from_a_cached_kernel(tmp_path):
    """inspect reads ptxas's advisories from the log of the ptxas run that Triton made for the kernel; a
    kernel from Triton's cache comes without one, and ptxas is run again for it (tools/inspect.py). Both
    give the same answer: here on the causal D = 64 dK/dV kernel on pointer loads, which Triton 3.6's ptxas
    serialises (the test above; 3.9's does not)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.join(os.path.dirname(__file__), "..", "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # empty: the first compile runs ptxas
    script = """
import torch
from flashtriton.tools import inspect
read = inspect._wgmma_serialized
logs = []
inspect._wgmma_serialized = lambda ptx, log: logs.append(log is not None) or read(ptx, log)
for attempt in range(2):
    logs.clear()
    reports = inspect.inspect_defaults(64, torch.bfloat16, True)
    print(all(logs) if attempt == 0 else any(logs), [r.wgmma_serialized for r in reports])
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    first, cached = out.stdout.splitlines()
    serialized = str([False, False, triton.__version__.startswith("3.6"), False])  # fwd, preprocess, dK/dV, dQ
    assert (first, cached) == (f"True {serialized}", f"False {serialized}"), out.stdout


# The dK/dV TMA tiles were tuned on Triton 3.6, the H200 machine's. Compiled offline, Triton 3.8 (with
# its ptxas 12.9) and 3.9 (with CUDA 13's) serialise their wgmmas in both tests below, so the cause is
# not the ptxas alone; 3.7 is untested; none of these has run on a GPU here. Strict: a newer Triton that
# stops serialising them turns these red, so that the note is revisited.
TUNED_TRITON_ONLY = pytest.mark.xfail(not triton.__version__.startswith("3.6"), strict=True,
                                      reason="Triton after 3.6 serialises the dK/dV TMA tiles' wgmmas")


@TUNED_TRITON_ONLY
def test_d128_dkdv_runs_one_loop_asynchronously_without_spills():
    """At D=128 the dK/dV kernel runs one loop with both masks; on the autotuner's TMA tile it must keep
    its wgmmas asynchronous and its registers unspilled, which is what the causal row's mask written by
    key row buys (NOTES entry 33)."""
    reports = _inspect("--backward-tma", head_dim=128)
    dkdv = [r for r in reports if r["kernel"] == "attn_bwd_dkdv_kernel"]
    assert {r["causal"] for r in dkdv} == {False, True}
    for r in dkdv:
        assert r["config"] == "M64-N64-w4-s2-tma", r
        assert not r["wgmma_serialized"] and r["wgmma_waits"] < r["hgmma"], r
        assert r["stack_bytes"] + r["local_bytes"] == 0, r


@TUNED_TRITON_ONLY
def test_backward_candidates_run_asynchronously_and_d64_dkdv_fits_three_blocks_per_sm():
    """The backward on each kernel's first autotuner candidate, what large calls run. At D=64 the dK/dV
    kernel loads L and D through TMA, which keeps ptxas from serialising the causal three loops, and is
    capped at 168 registers, so that three 128-thread blocks share an SM's 64K registers, for a few
    spilled bytes (NOTES entry 38): 12-14% off the causal backward."""
    reports = [r for r in _inspect("--backward-candidates", head_dim=64) if r["kernel"] != "attn_fwd_kernel"]
    dkdv = [r for r in reports if r["kernel"] == "attn_bwd_dkdv_kernel"]
    assert {r["causal"] for r in dkdv} == {False, True}
    for r in reports:
        if r["kernel"] != "attn_bwd_preprocess_kernel":
            assert not r["wgmma_serialized"] and r["wgmma_waits"] < r["hgmma"], r
    for r in dkdv:
        assert r["config"] == "M64-N64-w4-s3-tma-r168" and r["registers"] <= 168, r
        assert r["stack_bytes"] + r["local_bytes"] <= 32, r


def test_opt_in_variants_compile_to_wgmma_without_spills():
    """The q k^T-ahead forward and the backward's TMA loads (not defaults yet) on the same tiles."""
    reports = _inspect("--qk-ahead", "--backward-tma")
    names = {r["kernel"]: r["config"] for r in reports}
    assert names["attn_fwd_kernel"].endswith("-qka") and names["attn_bwd_dkdv_kernel"].endswith("-tma")
    for r in reports:
        if r["kernel"] != "attn_bwd_preprocess_kernel":
            assert r["hgmma"] > 0 and r["hmma"] == 0 and r["stack_bytes"] + r["local_bytes"] == 0, r


def test_every_variant_compiles_for_hopper():
    """Window + softcap + ALiBi, dropout and varlen, and the forward's key counts, compile for sm_90 with
    wgmma products: the interpreter that runs the other tests does not type-check kernels as the compiler
    does."""
    reports = _inspect("--variants")
    assert {r["config"] for r in reports} == {"window+softcap+alibi", "dropout", "varlen", "key counts"}
    for r in reports:
        if r["kernel"] != "attn_bwd_preprocess_kernel":
            assert r["hgmma"] > 0 and r["hmma"] == 0, r


@pytest.mark.parametrize("head_dim", [64, 128])
def test_decode_kernel_compiles_without_spills_or_slow_conversions(head_dim):
    """The decode kernel for a bf16 and an FP8 cache, as a decoding step launches it: no spills, and, for
    the FP8 cache, no F2F. Widening e4m3 to bf16 costs an F2F per value on the 16-per-clock conversion
    unit, which bounded the loop on the H200; the kernel widens to fp16 instead (docs/performance.md,
    entry 62). The FP8 cache's longer, three-stage key tiles stay clear of spilling."""
    reports = _inspect("--decode", "--dtypes", "bf16,fp8", head_dim=head_dim)
    assert {(r["dtype"], r["causal"]) for r in reports} == {(d, c) for d in ("bfloat16", "float8_e4m3fn")
                                                            for c in (False, True)}
    for r in reports:
        assert r["hmma"] > 0 and r["stack_bytes"] + r["local_bytes"] == 0, r
        if r["dtype"] == "float8_e4m3fn":
            assert r["f2f"] == 0 and r["config"].endswith("3 stages"), r


def test_d256_backward_candidates_beside_the_static_tiles_do_not_spill():
    """At D = 256 the backward's static tiles (never swept) spill; the autotuner's other candidates there, the
    tiles the resource model passes, compile without a spilled byte: dK/dV on 32 resident keys (mma.sync),
    dQ on 128 query rows (wgmma, two warpgroups) or on 32 (docs/performance.md, entry 101). Both masks."""
    import torch

    from flashtriton.launch import autotune, tiles

    static = tiles.backward_configs(256, torch.bfloat16, torch.device("cuda"))
    width = autotune.width_class(256, torch.bfloat16)
    others = {kernel: autotune.BACKWARD_CANDIDATES[kernel][width][1:] for kernel in ("dkdv", "dq")}
    assert all(autotune.BACKWARD_CANDIDATES[kernel][width][0] == cfg
               for kernel, cfg in zip(others, static, strict=True))
    for kernel, cfgs in others.items():
        assert cfgs and all(tiles.why_pruned_backward(kernel, c, 256, torch.bfloat16, tiles.HOPPER_SHARED_MEMORY)
                            is None for c in cfgs)
    reports = _inspect("--every-backward-candidate", head_dim=256)
    names = {kernel: {c.name for c in cfgs} for kernel, cfgs in others.items()}
    checked = [r for r in reports if r["config"] in names[r["kernel"].split("_")[2]]]
    assert {(r["kernel"], r["config"], r["causal"]) for r in checked} == {
        (f"attn_bwd_{kernel}_kernel", name, causal) for kernel in names for name in names[kernel]
        for causal in (False, True)}
    for r in checked:
        assert r["stack_bytes"] + r["local_bytes"] == 0 and r["hgmma"] + r["hmma"] > 0, r


def test_sass_branches_and_loops_are_read_with_or_without_a_second_predicate():
    # cuobjdump's addresses are 16 bytes a line; ptxas writes "@!P1 BRA P2, 0x..." for a branch taken where
    # both predicates hold, as the causal forward's jump over its mask
    assert branch_target("@!P1 BRA P2, 0x3540 ;") == 0x354
    assert branch_target("@P1 BRA 0x2410 ;") == 0x241
    assert branch_target("FSEL R1, R2, -INF , !P1 ;") is None
    listing = ["UMOV UR4, 0x1 ;", "@!P1 BRA P2, 0x40 ;", "FMUL R1, R1, R2 ;", "FMUL R3, R3, R2 ;",
               "@P0 BRA 0x0 ;"]
    assert loops(listing) == [(0, 4)]
    assert skippable_fmuls(listing) == 2
