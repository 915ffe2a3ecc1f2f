"""The Gluon forward (kernels/gluon_forward.py): Gluon does not run under Triton's interpreter, so on CPU its
kernels are compiled for sm_90 and their SASS checked; on an sm_90 GPU they run against the float64
reference."""

import functools
import os
from unittest import mock

import pytest
import torch

from conftest import DEVICE, ON_GPU
from flashtriton.cache import CACHE
from flashtriton.launch import gluon_backward, gluon_forward
from flashtriton.reference import attention_ref
from flashtriton.testing import bounded, make_qkv
from flashtriton.tools.inspect import gluon_forward_options
from helpers import compiling, inspect_reports

pytestmark = pytest.mark.skipif(not gluon_forward.gluon_available(),
                                reason="the Gluon kernels compile under Triton's releases "
                                       f"{gluon_forward.GLUON_RELEASES} (launch/gluon_forward.py)")
ON_HOPPER = ON_GPU and torch.cuda.get_device_capability() == (9, 0)
# Whether "auto" takes the Gluon kernels under the installed release (gluon_forward.GLUON_RELEASES_RUN).
RAN = gluon_forward.gluon_ran()
# The SASS figures below (spilled bytes, counts of instructions) are those of Triton 3.6, the H200 machine's
# release, where the kernels were tuned and raced. Under the other releases they compile they keep the
# structure checked here, but ptxas allocates registers and lays out code otherwise: up to 176 bytes spilled
# where 3.6 spills none (Triton 3.9, FP8 at D = 64) and other counts (docs/hopper.md, "Which Triton").
# There the spills are bounded by SPILLS_ELSEWHERE and the exact counts are left to 3.6.
FIGURES_RELEASE = "3.6"
EXACT = gluon_forward.installed_release() == FIGURES_RELEASE
SPILLS_ELSEWHERE = 192


def spills_within(report: dict, bound: int) -> bool:
    """Whether a report's spilled bytes (stack and local) are within `bound`, or within SPILLS_ELSEWHERE
    under a release other than FIGURES_RELEASE."""
    return report["stack_bytes"] + report["local_bytes"] <= (bound if EXACT else max(bound, SPILLS_ELSEWHERE))


def inspect_gluon_reports(head_dims: str, dtypes: str) -> list[dict]:
    return inspect_reports("--gluon", "--head-dims", head_dims, "--dtypes", dtypes)


@pytest.fixture(scope="module")
def reports():
    # bf16 and the FP8 form: fp16 compiles the same code with another element type (`inspect --gluon
    # --dtypes fp16`), and each compile costs the suite seconds.
    return inspect_gluon_reports("64,128", "bf16,fp8")


def test_compiles_to_asynchronous_wgmma_with_register_reallocation(reports):
    """Every variant (D 64 and 128, causal and not, each of the kernel's three forms with two softmax
    warpgroups, at D = 64 the overlapped form with three, and the library's form with key counts, with
    lazy_rescale, with sums_by_mma, with o_by_tma and with paired_stages, three warpgroups at
    D = 64 without a mask and two with one): matrix
    products on wgmma, issued asynchronously (ptxas did not serialise them), no spilled registers, the
    partitions trading registers (USETMAXREG), the launch's warps x registers within the SM's 64K, and the
    stages within 227 KB of shared memory. The overlapped forms keep products in flight: each softmax
    warpgroup's loop waits for Q K^T with P V still running (a partial wait), which ptxas can drop without
    its serialisation advisory (docs/performance.md, entry 93)."""
    reports = [r for r in reports if r["kernel"] == "attn_fwd_gluon_kernel" and r["dtype"] == "bfloat16"]
    # head dims x masks x (forms + key counts + the flags alone and the library's), and D = 64's three
    # warpgroups with each mask
    flags = gluon_forward_options()[1:]
    assert len(reports) == 2 * 2 * (len(gluon_forward.FORMS) + 1 + len(flags)) + 2
    assert {r["config"].split("-", 4)[4] for r in reports} == {*gluon_forward.FORMS, "overlap-key-counts",
                                                               *("overlap" + flag.suffix() for flag in flags)}
    assert sum(r["config"].startswith("M64x3-") for r in reports) == 3 + len(flags)
    for r in reports:
        if not EXACT and r["config"].endswith("-sums"):
            continue  # (a lab flag; under Triton 3.9 its waits are serialised: test_sums_by_mma_trade_...)
        warpgroups = int(r["config"].split("-")[0].split("x")[1])
        assert r["hgmma"] > 0 and r["hmma"] == 0, r
        assert not r["wgmma_serialized"] and r["added_waits"] == 0, r  # (ptxas waits only where the PTX does)
        in_turn = r["config"].endswith("-in-turn")
        assert (r["partial_waits"] == 0) if in_turn else (r["partial_waits"] >= warpgroups), r
        # Three warpgroups get 160 registers each (the most the loader's 24 leave); the causal form's masks,
        # and the key counts', then spill 8-24 bytes to the stack on Triton 3.6. Bounded here, to be
        # weighed on the H200.
        spill_bound = 32 if warpgroups == 3 and (r["causal"] or r["config"].endswith("key-counts")) else 0
        assert spills_within(r, spill_bound), r
        assert r["register_reallocations"] > 0, r
        assert r["registers"] * (4 + 4 * warpgroups) * 32 <= 65536, r
        assert r["shared_bytes"] <= 227 * 1024, r


@pytest.fixture(scope="module")
def reports_256():
    return inspect_gluon_reports("256", "bf16")


def test_head_dim_256_compiles_every_form_without_spills(reports_256):
    """D = 256 in 16-bit (the FP8 form in the next test, the backward after it): each form and each flag the
    head dim takes (O by TMA does not fit), both masks, as check_head_dim_256 says (O's 64 x 256 fp32 is 128
    of a softmax thread's 240 registers; Q, K and V take 192 KB); and with lazy_rescale a skippable rescale
    of D / 2 FMULs per warpgroup."""
    reports = [r for r in reports_256 if r["kernel"] == "attn_fwd_gluon_kernel"]
    flags = [f for f in gluon_forward_options()[1:] if gluon_forward.options_fit(f, 256)]
    forms = {*gluon_forward.FORMS, "overlap-key-counts", *("overlap" + flag.suffix() for flag in flags)}
    assert sorted((r["config"].split("-", 4)[4], r["causal"]) for r in reports) == sorted(
        (form, causal) for form in forms for causal in (False, True))
    by_form = {(r["config"].split("-", 4)[4], r["causal"]): r for r in reports}
    check_head_dim_256(by_form, "overlap", instruction_k=16)
    for causal in (False, True):
        assert by_form["overlap-lazy", causal]["skippable_fmul"] == 2 * 256 // 2


def test_backward_at_head_dim_256_shares_its_keys_and_splits_columns(reports_256):
    """The dK/dV kernel at D = 256 (kernels/gluon_backward.py, _split_query_block), both masks, without dQ
    (the deterministic form: the Triton dQ kernel's) and with it: one tile of 64 keys per program; per query
    block and warpgroup S^T and dP^T for half of the block's 64 queries (k = 16 over D: 16 products each,
    dP^T's over dO's two column halves), then dV and dK over its half of D's columns from both warpgroups'
    P^T and dS^T (k = 16 over 32 queries: 2 products per half each), and with dQ, dQ^T for its own queries
    in four 64-row chunks (k = 16 over 64 keys: 4 products each), each staged by 16 four-byte stores per
    thread (transposed into the swizzled tile: no wider store fits); on wgmma not serialised, with a product
    in flight at a wait; the partitions trading registers, within the SM's registers and 227 KB of shared
    memory (230,688 bytes without dQ: K and V 64 KB, the ring 128 KB, P^T and dS^T 32 KB; dQ's staging
    takes no more, as it lies in dO's halves); without dQ a spill only in the causal form, 16 bytes stored
    before the loops; with dQ up to 152 bytes (loop invariants reloaded in the loop: bounded here, weighed
    by the races of docs/performance.md, entry 107); the warpgroups meeting at DS_BARRIER."""
    from flashtriton.kernels.gluon_backward import DS_BARRIER
    reports = [r for r in reports_256 if r["kernel"] == "attn_bwd_dkdv_gluon_kernel"]
    base = f"N64x1-M64-s2-r{gluon_backward.REGISTERS[0]}/{gluon_backward.REGISTERS[1]}"
    assert sorted((r["config"], r["causal"]) for r in reports) == [
        (base + form, causal) for form in ("", "-dq-atomic") for causal in (False, True)], reports
    for r in reports:
        loops = 2 if r["causal"] else 1  # causal: the diagonal's blocks in a loop of their own
        dq = r["config"].endswith("-dq-atomic")
        assert r["hgmma"] == 2 * loops * (2 * 256 // 16 + 2 * 2 * 32 // 16 + dq * 4 * 64 // 16), r
        assert r["hmma"] == 0 and not r["wgmma_serialized"] and r["partial_waits"] > 0, r
        assert r["added_waits"] == 0, r  # (its products start from zeros: ptxas waits only where the PTX does)
        assert spills_within(r, (152 if dq else 16) if r["causal"] else (128 if dq else 0)), r
        assert r["shared_stores"].get("4", 0) == (2 * loops * 4 * 16 if dq else 0), r
        assert r["register_reallocations"] > 0 and r["registers"] * (4 + 4 * 2) * 32 <= 65536, r
        assert r["shared_bytes"] <= 227 * 1024, r
        assert DS_BARRIER.value in r["barriers"], r


def test_backward_at_head_dim_256_stages_dq_in_the_halves_of_do():
    """At D = 256 the launcher takes a dQ buffer laid out like dQ (not in register order: dq_in_fragments,
    refused by name), reduced in (32, 64) tiles, each warpgroup's queries by 64 of D's columns; dO comes in
    column halves; auto keeps the form without dQ for deterministic calls there (DETERMINISTIC_HEAD_DIMS),
    and a head dim the kernel does not take is refused by name."""
    from flashtriton.launch.backward import statistics_buffer
    assert 256 in gluon_backward.BLOCK_M and gluon_backward.dq_share(256) == (32, 256)  # its own queries, all of D
    assert gluon_backward.DETERMINISTIC_HEAD_DIMS == (256, ) and not gluon_backward.dq_in_fragments(256)
    assert gluon_backward.dq_in_fragments(128) == gluon_backward.DQ_FRAGMENTS
    assert gluon_backward.program_keys(256) == gluon_backward.KEYS
    assert gluon_backward.program_keys(128) == gluon_backward.WARPGROUPS * gluon_backward.KEYS
    q = torch.randn(1, 2, 100, 256, dtype=torch.bfloat16)
    lse2, delta = statistics_buffer(torch.empty(1, 2, 100))
    dq_acc = gluon_backward.dq_accumulator(q, False)
    assert dq_acc.shape == q.shape
    with pytest.raises(ValueError, match=r"dq_fragments must be False at head dim 256"):
        gluon_backward.gluon_dkdv_launch(q, q, q, q, lse2, delta, q, q, False, 0.1, dq_acc, dq_fragments=True)
    kernel, grid, args, kwargs = gluon_backward.gluon_dkdv_launch(q, q, q, q, lse2, delta, q, q, True, 0.1, dq_acc)
    assert grid == (2 * 2, )  # cdiv(100, 64) key tiles x 2 heads
    assert list(args[5].block_shape) == [1, 1, 64, 128] and list(args[8].block_shape) == [1, 1, 32, 64]
    assert gluon_backward.gluon_dkdv_launch(q, q, q, q, lse2, delta, q, q, True, 0.1)[2][8] is None
    q96 = torch.randn(1, 2, 100, 96, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"takes head dims \(64, 128, 256\), got 96"):
        gluon_backward.gluon_dkdv_launch(q96, q96, q96, q96, lse2, delta, q96, q96, True, 0.1)


def test_backward_starts_its_products_from_the_statistics_where_measured():
    """The launcher passes STATS_IN_ACC where STATS_IN_ACCUMULATORS has the head dim (D = 128, where it was
    measured faster), as asked otherwise, and refuses it by name at D = 256, whose dP^T is summed over dO's
    column halves."""
    from flashtriton.kernels.gluon_backward import attn_bwd_dkdv_gluon_kernel
    from flashtriton.launch.backward import statistics_buffer
    lse2, delta = statistics_buffer(torch.empty(1, 2, 100))
    flag = attn_bwd_dkdv_gluon_kernel.arg_names.index("STATS_IN_ACC")
    for head_dim in (64, 128, 256):
        q = torch.randn(1, 2, 100, head_dim, dtype=torch.bfloat16)
        args = gluon_backward.gluon_dkdv_launch(q, q, q, q, lse2, delta, q, q, True, 0.1)[2]
        assert args[flag] is (head_dim in gluon_backward.STATS_IN_ACCUMULATORS), head_dim
    assert gluon_backward.STATS_IN_ACCUMULATORS == (128, )
    q = torch.randn(1, 2, 100, 64, dtype=torch.bfloat16)
    args = gluon_backward.gluon_dkdv_launch(q, q, q, q, lse2, delta, q, q, True, 0.1, stats_in_acc=True)[2]
    assert args[flag] is True
    q = torch.randn(1, 2, 100, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"stats_in_acc must be False at head dim 256"):
        gluon_backward.gluon_dkdv_launch(q, q, q, q, lse2, delta, q, q, True, 0.1, stats_in_acc=True)


STATS_IN_ACC_SCRIPT = """
import re

import torch

from flashtriton.launch import gluon_backward
from flashtriton.launch.backward import statistics_buffer
from flashtriton.tools import inspect

lse2, delta = statistics_buffer(torch.empty(1, 2, 4096))
for head_dim in (64, 128):
    q = torch.randn(1, 2, 4096, head_dim, dtype=torch.bfloat16)
    for causal in (False, True):
        for on in (False, True):
            dq_acc = gluon_backward.dq_accumulator(q, gluon_backward.DQ_FRAGMENTS,
                                                   split_rows=gluon_backward.split_dq_by_rows(head_dim))
            launch = gluon_backward.gluon_dkdv_launch(q, q, q, q, lse2, delta, q, q, causal, 0.1, dq_acc,
                                                      dq_fragments=gluon_backward.DQ_FRAGMENTS, stats_in_acc=on)
            sass = inspect.offline_sass(*launch).split(chr(10))
            print(head_dim, causal, on, sum(bool(re.search(r"\\b(?:STL|LDL)\\b", x)) for x in sass),
                  sum("WARPGROUP.DEPBAR.LE gsb0, 0x1" in x for x in sass),
                  *(sum(re.search(rf"\\b{op}\\b", x) is not None for x in sass) for op in ("FADD", "FFMA")))
"""


def test_statistics_in_the_accumulators_drop_their_subtractions_without_spills(tmp_path):
    """The library's backward forms at D = 64 and 128, both masks, with and without STATS_IN_ACC, compiled
    offline: with it the kernel has fewer FADDs (dP^T - D is the product's own sum) and fewer FFMAs (so is
    S^T - L / c: exp2's argument is one multiply), spills no more, and its products still overlap (waits
    that leave one product in flight)."""
    script = tmp_path / "stats_in_acc.py"
    script.write_text(STATS_IN_ACC_SCRIPT)
    forms = {tuple(f[:3]): [int(x) for x in f[3:]] for f in (line.split() for line in compiling(str(script)).split("\n")
                                                             if line)}
    assert len(forms) == 8, forms
    for (head_dim, causal, on), (spills, partial_waits, fadds, ffmas) in forms.items():
        if on == "True":
            off = forms[head_dim, causal, "False"]
            assert fadds < off[2] and ffmas < off[3], forms
            assert partial_waits >= 1 and (spills <= off[0] or not EXACT), forms


DELTA_AFTER_SCRIPT = """
import itertools
import re

import torch

from flashtriton.launch import gluon_backward
from flashtriton.launch.backward import statistics_buffer
from flashtriton.tools import inspect

lse2, delta = statistics_buffer(torch.empty(1, 2, 4096))
q = torch.randn(1, 2, 4096, 128, dtype=torch.bfloat16)
for causal in (False, True):
    for delta_in_acc in (True, False):
        dq_acc = gluon_backward.dq_accumulator(q, True)
        launch = gluon_backward.gluon_dkdv_launch(q, q, q, q, lse2, delta, q, q, causal, 0.1, dq_acc,
                                                  dq_fragments=True, delta_in_acc=delta_in_acc)
        sass = inspect.offline_sass(*launch)
        # the kernel's products and waits in order, runs of one instruction counted: "HGMMA.64x64x16*8" ...
        steps = re.findall(r"HGMMA\\.64x\\d+x16|WARPGROUP\\.DEPBAR\\.LE gsb0, 0x\\d", sass)
        runs = [f"{op}*{len(list(group))}" for op, group in itertools.groupby(steps)]
        # S^T's product (8 of 64x64 at D = 128), a full wait, then dP^T's (8 more)
        waited = sum(runs[i:i + 3] == ["HGMMA.64x64x16*8", "WARPGROUP.DEPBAR.LE gsb0, 0x0*1", "HGMMA.64x64x16*8"]
                     for i in range(len(runs)))
        print(causal, delta_in_acc, waited, runs.count("HGMMA.64x64x16*16"))
"""


def test_backward_with_d_after_issues_both_score_products_together(tmp_path):
    """D = 128, both masks: in the library's form, whose dP^T starts from -D, ptxas has at least one compute
    loop wait for all of S^T's product before it issues dP^T's (a product that starts from registers written
    while another runs waits for it); with D subtracted after the product instead (delta_in_acc=False,
    the kernel's DELTA_AFTER) no loop does, and every loop issues S^T's and dP^T's 16 instructions back to
    back (docs/performance.md, entry 142)."""
    script = tmp_path / "delta_after.py"
    script.write_text(DELTA_AFTER_SCRIPT)
    forms = {tuple(f[:2]): [int(x) for x in f[2:]] for f in (line.split() for line in compiling(str(script)).split("\n")
                                                             if line)}
    assert len(forms) == 4, forms
    for causal in ("False", "True"):
        loops = 2 * (2 if causal == "True" else 1)  # (each compute warpgroup's; causal: the masked loop too)
        waited, together = forms[causal, "False"]
        assert (waited, together) == (0, loops), forms
        waited, together = forms[causal, "True"]
        assert waited >= 1 and waited + together == loops, forms


DQ_BY_LOADER_SCRIPT = """
import re

import torch

from flashtriton.launch import gluon_backward
from flashtriton.launch.backward import statistics_buffer
from flashtriton.tools import inspect

lse2, delta = statistics_buffer(torch.empty(1, 2, 4096))
for head_dim in (64, 128):
    q = torch.randn(1, 2, 4096, head_dim, dtype=torch.bfloat16)
    split_rows = gluon_backward.split_dq_by_rows(head_dim)
    for causal in (False, True):
        for on in (False, True):
            dq_acc = gluon_backward.dq_accumulator(q, True, split_rows=split_rows)
            launch = gluon_backward.gluon_dkdv_launch(q, q, q, q, lse2, delta, q, q, causal, 0.1, dq_acc,
                                                      dq_split_rows=split_rows, dq_fragments=True, dq_by_loader=on)
            lines = inspect.offline_sass(*launch).split(chr(10))
            compute = [lines[f:t + 1] for f, t in inspect.innermost_loops(lines)]
            loader = [lines[f:t + 1] for f, t in inspect.innermost_loops(lines, "UTMALDG")
                      if not any("HGMMA" in x for x in lines[f:t + 1])]
            def count(bodies, pattern):
                return sum(bool(re.search(pattern, x)) for body in bodies for x in body)
            print(head_dim, causal, on, len(compute), count(compute, "UTMAREDG"), count(compute, r"DEPBAR\\.LE SB0"),
                  count(compute, "BAR\\.ARV"), count(loader, "UTMAREDG"), count(compute + loader, r"\\b(?:STL|LDL)\\b"))
"""


def test_backward_with_dq_by_the_loader_moves_the_reductions_out_of_the_compute_loops(tmp_path):
    """D = 64 and 128, both masks, compiled offline with and without DQ_BY_LOADER: without it each compute
    loop issues its dQ reduction and waits for the last one's read (`DEPBAR.LE SB0`); with it no compute
    loop does either, each hands its staged share over with one more non-blocking arrive per block, and
    the loader's loop issues both warpgroups' reductions; no innermost loop spills more with it, and under
    the release the figures come from (EXACT) none spills either way."""
    script = tmp_path / "dq_by_loader.py"
    script.write_text(DQ_BY_LOADER_SCRIPT)
    forms = {tuple(f[:3]): [int(x) for x in f[3:]] for f in (line.split() for line in compiling(str(script)).split("\n")
                                                             if line)}
    assert len(forms) == 8, forms
    for (head_dim, causal, on), (loops, reductions, read_waits, arrives, loader_reductions, spills) in forms.items():
        # (under Triton 3.8 the D = 128 causal loops spill without it: 15 loads and stores; with it none)
        assert spills <= forms[head_dim, causal, "False"][5] and (spills == 0 or not EXACT), forms
        if on == "True":
            assert (reductions, read_waits, loader_reductions) == (0, 0, 2), forms
            assert arrives == forms[head_dim, causal, "False"][3] + loops, forms
        else:
            assert reductions == read_waits == loops and loader_reductions == 0, forms


def check_head_dim_256(by_form: dict, overlap: str, instruction_k: int):
    """What every Gluon forward form compiled at D = 256 shows (`by_form`: its reports by (form, causal);
    `overlap`: the overlapped form's name, its flags' forms that name and a suffix): two softmax warpgroups
    over 64-key blocks, wgmma asynchronous (the overlapped forms' loops waiting with P V in flight), no
    spilled register, the partitions trading registers, within the SM's registers and 227 KB of shared
    memory; with paired stages one arrive per block, and with sums_by_mma BLOCK_N / instruction_k thin
    products per P V."""
    for (form, _), r in by_form.items():
        assert r["kernel"] == "attn_fwd_gluon_kernel" and r["config"].startswith("M64x2-N64-"), r
        assert r["hgmma"] > 0 and r["hmma"] == 0 and not r["wgmma_serialized"], r
        assert r["partial_waits"] == (0 if form == "in-turn" else 2), r
        assert spills_within(r, 0) and r["register_reallocations"] > 0, r
        assert r["registers"] * (4 + 4 * 2) * 32 <= 65536 and r["shared_bytes"] <= 227 * 1024, r
    for causal in (False, True):
        plain = by_form[overlap, causal]
        assert (by_form[overlap + "-paired", causal]["loop_arrives"], plain["loop_arrives"]) == (2, 4)
        thin = by_form[overlap + "-sums", causal]["hgmma"] - plain["hgmma"]
        assert thin == 2 * 2 * 64 // instruction_k if EXACT else thin > 0


def test_fp8_head_dim_256_compiles_every_flag_without_spills():
    """The FP8 form at D = 256 (which auto takes: FP8_AUTO_HEAD_DIMS, docs/performance.md, entries 104 and
    108): without flags, with each FP8 flag alone and with the library's FP8 flags, both
    masks, as check_head_dim_256 says (e4m3 wgmma, k = 32); and O by TMA, which fits beside FP8's tiles."""
    reports = inspect_gluon_reports("256", "fp8")
    flags = gluon_forward_options(fp8=True)
    by_form = {(r["config"].split("-", 4)[4], r["causal"]): r for r in reports}
    assert sorted(by_form) == sorted(("overlap-fp8" + f.suffix(), causal) for f in flags for causal in (False, True))
    check_head_dim_256(by_form, "overlap-fp8", instruction_k=32)
    for causal in (False, True):
        assert by_form["overlap-fp8-ostore", causal]["tma_stores"] > by_form["overlap-fp8", causal]["tma_stores"]


def test_causal_mask_compares_with_immediates(reports):
    """The causal forward's mask (kernels/gluon_masks.py) compiles to about two instructions per score of
    the blocks that cross the diagonal: with two warpgroups each form's causal SASS is at most 320
    instructions longer than its non-causal one (120-240 on Triton 3.6 with the mask compared against
    immediates; 400-744 when the column indices were compared in registers, docs/performance.md entry 84).
    Counted under FIGURES_RELEASE (3.6): Triton 3.8 lays the ping-pong form out 384-416 longer."""
    if not EXACT:
        pytest.skip("instruction counts are checked under FIGURES_RELEASE, Triton 3.6")
    forward = {(r["head_dim"], r["causal"], r["config"]): r["instructions"] for r in reports
               if r["kernel"] == "attn_fwd_gluon_kernel" and r["dtype"] == "bfloat16"
               and r["config"].startswith("M64x2-") and r["config"].endswith(("-overlap", "-pingpong", "-in-turn"))}
    pairs = [(head_dim, config) for head_dim, causal, config in forward
             if causal and (head_dim, False, config) in forward]
    assert len(pairs) == 6, forward
    for head_dim, config in pairs:
        extra = forward[head_dim, True, config] - forward[head_dim, False, config]
        assert 0 < extra <= 320, (head_dim, config, extra)


def test_fp8_forward_compiles_to_8_bit_wgmma(reports):
    """The FP8 form (D 64 and 128, causal and not): both products on wgmma's e4m3 form (QGMMA, counted
    with HGMMA), not serialised, the partitions trading registers, no spills at D = 128 (at most 32 bytes
    at D = 64, where three softmax warpgroups have 160 registers each and the loop carries P in fp32),
    within shared memory. And P rounded to e4m3 beside its wgmma: the whole kernel's SASS at most 4000
    instructions at D = 128 without a mask (3624 on Triton 3.6; 4384 when an e4m3 P crossed the loop's
    iterations and was repacked byte by byte, docs/performance.md entry 85)."""
    reports = [r for r in reports if r["dtype"] == "float8_e4m3fn" and r["config"].endswith("-overlap-fp8")]
    assert sorted((r["head_dim"], r["causal"]) for r in reports) == [(64, False), (64, True), (128, False),
                                                                       (128, True)]
    for r in reports:
        assert r["config"].endswith("-overlap-fp8"), r
        assert r["hgmma"] > 0 and r["hmma"] == 0, r
        assert not r["wgmma_serialized"] and r["partial_waits"] >= int(r["config"].split("-")[0][-1]), r
        assert r["register_reallocations"] > 0, r
        assert spills_within(r, 32 if r["head_dim"] == 64 else 0), r
        assert r["shared_bytes"] <= 227 * 1024, r
        if r["head_dim"] == 128 and not r["causal"]:
            assert r["instructions"] <= 4000, r


def option_forms(reports, suffix):
    """The forward reports of one ForwardOptions form (config ending in `suffix`: bf16 and FP8, D 64 and 128,
    both masks), each as (report, its softmax warpgroups, the report of the same form without the option)."""
    forward = [r for r in reports if r["kernel"] == "attn_fwd_gluon_kernel"]
    forms = [r for r in forward if r["config"].endswith(("-overlap" + suffix, "-overlap-fp8" + suffix))]
    assert sorted((r["dtype"], r["head_dim"], r["causal"]) for r in forms) == sorted(
        (dtype, head_dim, causal) for dtype in ("bfloat16", "float8_e4m3fn") for head_dim in (64, 128)
        for causal in (False, True))
    return [(r, int(r["config"].split("-")[0].split("x")[1]),
             next(t for t in forward if t["config"] == r["config"].removesuffix(suffix)
                  and (t["dtype"], t["head_dim"], t["causal"]) == (r["dtype"], r["head_dim"], r["causal"])))
            for r in forms]


def test_scaled_p_costs_a_subtraction_per_row(reports):
    """With scaled_p (FP8 only: launch/gluon_forward.py's FP8_ONLY) P is rounded to e4m3 as 2^8 P: one
    subtraction per row a thread holds and key block, and L's once per tile, so the form's SASS is within
    8 instructions per softmax warpgroup of the same form's without it (0-8 in all on Triton 3.6), with the
    same products and registers, no spill beyond its, wgmma still asynchronous. D 64 and 128, both masks."""
    forward = [r for r in reports if r["kernel"] == "attn_fwd_gluon_kernel"]
    forms = [r for r in forward if r["config"].endswith("-scaled")]
    assert sorted((r["dtype"], r["head_dim"], r["causal"]) for r in forms) == sorted(
        ("float8_e4m3fn", head_dim, causal) for head_dim in (64, 128) for causal in (False, True))
    for r in forms:
        twin = next(t for t in forward if t["config"] == r["config"].removesuffix("-scaled")
                    and (t["dtype"], t["head_dim"], t["causal"]) == (r["dtype"], r["head_dim"], r["causal"]))
        warpgroups = int(r["config"].split("-")[0].split("x")[1])
        if EXACT:
            assert 0 <= r["instructions"] - twin["instructions"] <= 8 * warpgroups, (r, twin)
            assert r["registers"] == twin["registers"], (r, twin)
        assert spills_within(r, twin["stack_bytes"] + twin["local_bytes"]), (r, twin)
        assert r["hgmma"] == twin["hgmma"] and not r["wgmma_serialized"], (r, twin)


def test_lazy_rescale_branches_over_the_rescale(reports):
    """With lazy_rescale (kernels/gluon_rescale.py), each softmax warpgroup's overlapped loop multiplies O by
    its rows' factors behind a branch, D / 2 FMULs per thread (a warpgroup's code is its own, so the kernel
    has WARPGROUPS such runs), which no other form has; and nothing else gets worse: no spill beyond the
    same form's without it, wgmma still asynchronous. bf16 and FP8, D 64 and 128, both masks."""
    for r, warpgroups, twin in option_forms(reports, "-lazy"):
        assert r["skippable_fmul"] == warpgroups * r["head_dim"] // 2, r
        assert spills_within(r, twin["stack_bytes"] + twin["local_bytes"]), (r, twin)
        assert r["hgmma"] == twin["hgmma"] and not r["wgmma_serialized"], (r, twin)
    assert not any(r["skippable_fmul"] for r in reports if r["kernel"] == "attn_fwd_gluon_kernel"
                   and not r["config"].endswith("-lazy"))


def test_o_by_tma_stores_each_tile_in_one_copy(reports):
    """With o_by_tma, each softmax warpgroup writes O through shared memory and one TMA store per tile (a
    UTMASTG per warpgroup's code), a 64 x D staging tile per warpgroup in shared memory within 227 KB, no
    spill beyond the same form's without it (but FP8 at D = 64, whose three warpgroups have 160 registers:
    16 bytes more on Triton 3.6, bounded at 24), wgmma still asynchronous. bf16 and FP8 (a bf16 O), D 64 and
    128, both masks."""
    for r, warpgroups, twin in option_forms(reports, "-ostore"):
        # (Triton 3.8 and 3.9 share one UTMASTG between the warpgroups' code in some forms)
        assert (r["tma_stores"] == warpgroups if EXACT else r["tma_stores"] >= 1) and twin["tma_stores"] == 0, (r, twin)
        assert r["shared_bytes"] - twin["shared_bytes"] >= warpgroups * 64 * r["head_dim"] * 2, (r, twin)
        assert r["shared_bytes"] <= 227 * 1024, r
        extra = 24 if r["dtype"] == "float8_e4m3fn" and warpgroups == 3 else 0
        assert spills_within(r, twin["stack_bytes"] + twin["local_bytes"] + extra), (r, twin)
        assert not r["wgmma_serialized"], r


def test_sums_by_mma_trade_adds_for_thin_products(reports):
    """With sums_by_mma, each softmax warpgroup takes its rows' sums of P as P times ones beside P V: per
    warpgroup and P V (two sites: the loop's and the tile's last block) BLOCK_N / 16 more m64n8 products
    (BLOCK_N / 32 in FP8), at least 100 fewer SASS instructions than the same form without it (the adds and
    the sums' quad shuffles; 144-416 on Triton 3.6), at most 8 bytes spilled beyond that form's (each block's
    sums held apart from the row's total until the wait: FP8 at D = 64 causal, 40 bytes against 32), wgmma still
    asynchronous, 2 KB of ones (1 KB in FP8) in shared memory. bf16 and FP8, D 64 and 128, both masks.
    Checked under FIGURES_RELEASE (3.6) only: Triton 3.9 compiles the form at D = 64 with three
    warpgroups with every wait at zero, 104 bytes spilled and more instructions than without it
    (docs/hopper.md, "Which Triton")."""
    if not EXACT:
        pytest.skip("sums_by_mma's trade is checked under FIGURES_RELEASE, Triton 3.6")
    for r, warpgroups, twin in option_forms(reports, "-sums"):
        fp8, block_n = r["dtype"] == "float8_e4m3fn", gluon_forward.BLOCK_N[r["head_dim"]]
        assert r["hgmma"] - twin["hgmma"] == warpgroups * 2 * (block_n // (32 if fp8 else 16)), (r, twin)
        assert r["instructions"] <= twin["instructions"] - 100, (r, twin)
        assert r["stack_bytes"] + r["local_bytes"] <= twin["stack_bytes"] + twin["local_bytes"] + 8, (r, twin)
        assert not r["wgmma_serialized"], r
        assert r["shared_bytes"] - twin["shared_bytes"] >= 8 * block_n * (1 if fp8 else 2), (r, twin)


ONES_TILE_SCRIPT = """
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashtriton.kernels.gluon_forward import _ones_tile
from flashtriton.kernels.gluon_releases import thread_barrier
from flashtriton.launch.arguments import COMPILE_OPTIONS
from flashtriton.tools import inspect


@gluon.jit
def ones_kernel(OUT, BLOCK_N: gl.constexpr):
    ones = _ones_tile(OUT.dtype.element_ty, BLOCK_N)
    thread_barrier()
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows = gl.arange(0, 8, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
    gl.store(OUT + rows[:, None] * BLOCK_N + cols[None, :], ones.load(layout))


out = torch.empty(8, 128, dtype=torch.float8_e4m3fn)
print(inspect.offline_sass(ones_kernel, (1, ), (out, 128), dict(num_warps=4, **COMPILE_OPTIONS)))
"""


def test_fp8_ones_tile_is_written_as_bytes(tmp_path):
    """sums_by_mma's FP8 tile of ones (_ones_tile) is stored as the bytes of e4m3's 1.0, no conversion in
    the SASS: Triton 3.6's ptxas packed a converted 1.0 pair beside the upper half of an unrelated register,
    and half the ones were not 1 (docs/performance.md, entry 97)."""
    script = tmp_path / "ones_tile.py"
    script.write_text(ONES_TILE_SCRIPT)
    sass = compiling(str(script))
    assert "0x38383838" in sass and "STS" in sass, sass
    assert "F2FP" not in sass, sass


FP8_PACKING_SCRIPT = """
import re

import torch

from flashtriton.kernels.gluon_forward import attn_fwd_gluon_kernel_any_keys
from flashtriton.launch import gluon_forward
from flashtriton.tools import inspect

# (Nk, head dim, causal, options): as flash_attention_fp8 launches the kernel with and without L
for seqlen_k, head_dim, causal, options in [(1, 128, False, gluon_forward.FP8_DEFAULT_OPTIONS),
                                            (1, 128, True, gluon_forward.FP8_WITHOUT_LSE_OPTIONS),
                                            (1, 256, False, gluon_forward.FP8_WITHOUT_LSE_OPTIONS),
                                            (2, 128, False, gluon_forward.FP8_DEFAULT_OPTIONS)]:
    q = torch.randn(2, 4, 1, head_dim).to(torch.float8_e4m3fn)
    k = torch.randn(2, 2, seqlen_k, head_dim).to(torch.float8_e4m3fn)
    vt = torch.zeros(2, 2, head_dim, 32).to(torch.float8_e4m3fn)
    o, lse = torch.empty(q.shape, dtype=torch.bfloat16), torch.empty(2, 4, 1)
    launch = gluon_forward.gluon_forward_launch(q, k, vt, o, lse, causal, head_dim ** -0.5, overlap=True,
                                                descale=torch.ones(3, 2, 2), options=options)
    sass = inspect.offline_sass(*launch)
    packs = re.findall(r"F2FP\\.SATFINITE\\.E4M3\\.F32\\.PACK_AB_MERGE_C (R\\w+), (R\\w+), (R\\w+), (R\\w+)", sass)
    print(seqlen_k, head_dim, launch[0] is attn_fwd_gluon_kernel_any_keys, len(packs), sorted({c for *_, c in packs}))
"""


def test_fp8_probabilities_packed_without_unrelated_halves(tmp_path):
    """The FP8 forward at Nq = Nk = 1, as flash_attention_fp8 launches it (with L, and without: sums_by_mma),
    is the kernel's twin not specialised on Nk, and at Nk = 2 the kernel itself (fails if the launcher takes
    the specialised one at Nk = 1). Specialised on Nk = 1, the mask made most of P one value, and Triton
    3.6's ptxas (12.8) packed P's e4m3 pairs with halves of unrelated registers: O wrong or NaN on an H200
    in most launches, and L with sums_by_mma (docs/performance.md, entry 105). Under that release each pair
    is packed beside zeros (RZ), as in every compile but the specialised one; other ptxas releases merge the
    pairs otherwise, so there the kernel picked is what is checked."""
    script = tmp_path / "fp8_packing.py"
    script.write_text(FP8_PACKING_SCRIPT)
    lines = compiling(str(script)).split("\n")
    forms = [line.split() for line in lines if line]
    assert [(f[0], f[2]) for f in forms] == [("1", "True")] * 3 + [("2", "False")], lines
    for form in forms:
        assert int(form[3]) >= 64, lines
        if EXACT:
            assert form[4:] == ["['RZ']"], lines


INTERLEAVED_KEYS_SCRIPT = """
import re

import torch

from flashtriton.launch import gluon_forward
from flashtriton.tools import inspect

# FP8 with V's keys contiguous, as fp8_forward_gluon launches it: K loaded interleaved, V^T read as it is
for head_dim in (64, 128, 256):
    for causal in (False, True):
        q = torch.randn(2, 4, 1024, head_dim).to(torch.float8_e4m3fn)
        k = torch.randn(2, 2, 1024, head_dim).to(torch.float8_e4m3fn)
        v_t = torch.randn(2, 2, head_dim, 1024).to(torch.float8_e4m3fn)
        o, lse = torch.empty(q.shape, dtype=torch.bfloat16), torch.empty(2, 4, 1024)
        launch = gluon_forward.gluon_forward_launch(q, k, v_t, o, lse, causal, head_dim ** -0.5, overlap=True,
                                                    descale=torch.ones(3, 2, 2), keys_interleaved=True)
        sass = inspect.offline_sass(*launch)
        print(head_dim, causal, len(re.findall(r"UTMALDG\\.5D", sass)), len(re.findall(r"\\b(?:STL|LDL)\\b", sass)),
              len(re.findall(r"WARPGROUP\\.DEPBAR\\.LE gsb0, 0x[12]\\b", sass)), len(re.findall(r"QGMMA", sass)))
"""


def test_fp8_interleaved_keys_compile_to_5d_loads_without_spills(tmp_path):
    """The FP8 form with K loaded interleaved (a V with contiguous keys read as it is, fp8_forward_gluon): at
    D 64, 128 and 256, both masks, K's blocks come by 5-D TMA loads (UTMALDG.5D), no register spills (no
    local loads or stores), the products on e4m3 wgmma and still overlapped (partial waits)."""
    script = tmp_path / "interleaved_keys.py"
    script.write_text(INTERLEAVED_KEYS_SCRIPT)
    forms = [line.split() for line in compiling(str(script)).split("\n") if line]
    assert [(f[0], f[1]) for f in forms] == [(d, c) for d in ("64", "128", "256") for c in ("False", "True")]
    for _, _, loads, spills, partial_waits, products in forms:
        assert int(loads) >= 1 and int(partial_waits) >= 1 and int(products) > 0, forms
        assert int(spills) == 0 or not EXACT, forms


def test_paired_stages_release_each_block_once(reports):
    """With paired_stages, K of block j + 1 and V of block j share a stage: each softmax warpgroup's
    overlapped loop arrives on one mbarrier per key block, where the same form without it arrives on two
    (K's and V's stages); fewer instructions, no spill beyond that form's, wgmma still asynchronous, no
    more shared memory. bf16 and FP8, D 64 and 128, both masks."""
    for r, warpgroups, twin in option_forms(reports, "-paired"):
        assert (r["loop_arrives"], twin["loop_arrives"]) == (warpgroups, 2 * warpgroups), (r, twin)
        assert r["instructions"] < twin["instructions"], (r, twin)
        assert spills_within(r, twin["stack_bytes"] + twin["local_bytes"]), (r, twin)
        assert r["shared_bytes"] <= twin["shared_bytes"] and not r["wgmma_serialized"], (r, twin)


def test_forward_loop_barriers_are_one_per_arrive_and_under_3_6_one_per_group_of_waits(reports):
    """The warpgroup barriers (BAR.SYNC) in each softmax warpgroup's key-block loop: one before each
    mbarrier arrive, which one thread issues for the warpgroup; and under Triton 3.6, whose barrier analysis
    counts a wait as a write of its mbarrier, one more before each run of waits that follows an arrive or a
    wait on the same ring: one per block in the overlapped and ping-pong forms (K's and V's waits side by
    side), two in the in-turn form (an arrive between them). Triton 3.9 puts none after an arrive, and in
    these loops an arrive's barrier stands between one block's waits and the next's.
    benchmarks/gluon_barrier_rule.py shows the rule on a minimal ring; docs/performance.md, entry 116. bf16
    and FP8, D 64 and 128, both masks, every form and flag."""
    release = gluon_forward.installed_release()
    if release not in ("3.6", "3.9"):
        pytest.skip(f"the barriers are counted under Triton 3.6 and 3.9, not {release}")
    forward = [r for r in reports if r["kernel"] == "attn_fwd_gluon_kernel"]
    assert len(forward) > 60
    for r in forward:
        warpgroups = int(r["config"].split("-")[0].split("x")[1])
        waits_barriers = warpgroups * (2 if r["config"].endswith("-in-turn") else 1)
        if release == "3.9":  # (every loop has an arrive since entry 126 removed named_release)
            waits_barriers = 0
        assert r["loop_barriers"] == r["loop_arrives"] + waits_barriers, r


def test_backward_compiles_to_asynchronous_wgmma_with_register_reallocation(reports):
    """The dK/dV kernel (D 64 and 128, causal and not, with and without dQ by atomics, staged in register
    order or like dQ, and at D = 64 split by rows or by columns): its four products per query block on wgmma
    (S^T and dP^T over D, then dV and dK over the block's queries; with dQ, its share over the 128 keys),
    not serialised by ptxas, the partitions trading registers, within the SM's registers and shared memory,
    no spills without dQ and a bounded few with it; dQ's staging in 16-byte stores in register order (each
    thread's 32 accumulator registers in 8 stores per compute warpgroup), in 8-byte ones otherwise."""
    reports = [r for r in reports if r["kernel"] == "attn_bwd_dkdv_gluon_kernel"]
    forms = [(r["head_dim"], r["causal"], "".join(r["config"].split("-", 4)[4:])) for r in reports]
    assert sorted(forms) == sorted([(d, c, f) for d in (64, 128) for c in (False, True)
                                    for f in ("", "dq-atomic", "dq-atomic-fragments")]
                                   + [(64, c, f) for c in (False, True)
                                      for f in ("dq-atomic-split-rows", "dq-atomic-split-rows-fragments")]), forms
    for r in reports:
        atomic = "-dq-atomic" in r["config"]
        split_rows = "-split-rows" in r["config"]
        block_m = int(r["config"].split("-")[1].removeprefix("M"))
        # per warpgroup: S^T and dP^T over D, dV and dK over the block's queries, and with dQ its share
        # = dS K over the 128 keys: for each 64 of the block's rows (half of D), or 64 rows (all of D)
        dq = 128 // 16 * (1 if split_rows else block_m // 64)
        products = 2 * r["head_dim"] // 16 + 2 * block_m // 16 + (dq if atomic else 0)
        loops = 2 if r["causal"] else 1  # causal: the diagonal's blocks in a loop of their own
        assert r["hgmma"] == 2 * loops * products, r
        assert r["hmma"] == 0, r
        assert not r["wgmma_serialized"] and r["partial_waits"] > 0, r  # (a product still in flight at a wait)
        # ptxas waits where the PTX does, but at D = 128 (STATS_IN_ACC): there dP^T's product starts from -D,
        # written while S^T's runs, and waits for it (docs/performance.md, entry 142)
        assert r["added_waits"] == (1 if r["head_dim"] == 128 else 0), r
        # dQ's accumulator joins dK and dV in the atomic form (32 registers at D = 64, beside S^T and dP^T of
        # 128 rows): ptxas spills 8-80 bytes there on Triton 3.6; none in the form without dQ.
        bound = 128 if atomic else 0
        if r["config"].endswith("-fragments"):  # the library's order (entries 74, 75, 82)
            bound = {(64, False): 0, (64, True): 24, (128, False): 0, (128, True): 8}[r["head_dim"], r["causal"]]
        assert spills_within(r, bound), r
        wide = r["shared_stores"].get("16", 0)
        assert wide == (2 * 8 * loops if r["config"].endswith("-fragments") else 0), r
        assert r["register_reallocations"] > 0, r
        assert r["registers"] * (4 + 4 * gluon_backward.WARPGROUPS) * 32 <= 65536, r
        assert r["shared_bytes"] <= 227 * 1024, r
    # dQ's form meets its two compute warpgroups at named barrier DS_BARRIER; Triton's warp specialisation
    # numbers its own barriers from the bottom, so the form without dQ must not already use that id.
    from flashtriton.kernels.gluon_backward import DS_BARRIER
    for head_dim in (64, 128):
        for causal in (False, True):
            plain, atomic = ([r for r in reports if (r["head_dim"], r["causal"]) == (head_dim, causal)
                              and (r["config"].endswith("-dq-atomic") if a else "-dq-atomic" not in r["config"])][0]
                             for a in (False, True))
            assert DS_BARRIER.value not in plain["barriers"], plain
            assert set(atomic["barriers"]) == {*plain["barriers"], DS_BARRIER.value}, (plain, atomic)


def test_backward_path_variable(monkeypatch):
    """FLASHTRITON_BACKWARD: unset is auto, which keeps the Triton dK/dV kernel (the Gluon one is opt-in
    until timed); a value outside auto/triton/gluon raises, naming the variable; on CPU the interpreter
    runs the Triton kernels whatever it says."""
    monkeypatch.delenv(gluon_backward.BACKWARD_PATH_VARIABLE, raising=False)
    assert gluon_backward.backward_path() == "auto"
    q, k, v = make_qkv(1, 2, 2, 64, 256, 128, torch.bfloat16, "cpu", requires_grad=False)
    monkeypatch.setenv(gluon_backward.BACKWARD_PATH_VARIABLE, " GLUON ")
    assert gluon_backward.backward_path() == "gluon"
    assert not gluon_backward.gluon_backward_selected(q, k, v, q, False)
    monkeypatch.setenv(gluon_backward.BACKWARD_PATH_VARIABLE, "cudnn")
    with pytest.raises(ValueError, match="FLASHTRITON_BACKWARD='cudnn'.*auto"):
        gluon_backward.backward_path()


@pytest.mark.skipif(not ON_HOPPER, reason="Gluon's sm_90 kernels run on a Hopper GPU only")
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 2, 1, 1), (2, 4, 2, 17, 63), (2, 4, 2, 97, 130), (2, 4, 2, 130, 97),
                                   (1, 4, 4, 300, 333), (3, 8, 2, 1000, 1100)])
@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_matches_float64_reference(monkeypatch, head_dim, is_causal, shape, deterministic):
    """FLASHTRITON_BACKWARD=gluon: flash_attention's dK and dV from the Gluon kernel, dQ from its loop by
    TMA reductions (at D = 256 its own queries' dQ^T, staged in dO's halves), or under
    torch.use_deterministic_algorithms from the Triton dQ kernel; O, L and every
    gradient bounded by twice plain bf16 attention's error against the float64 reference; odd lengths,
    Nq != Nk both ways (causal rows that see no key: zero gradients), GQA, more key tiles than one; the
    kernel is checked to have run, in the form asked for."""
    from flashtriton import flash_attention
    from flashtriton.launch import backward
    from flashtriton.testing import compare_with_reference

    calls = []

    def counted(*args, **kwargs):
        calls.append(args[-1] is None)  # dq_acc: None when dQ comes from the Triton kernel
        return gluon_backward.gluon_dkdv_spec(*args, **kwargs)
    monkeypatch.setattr(backward, "gluon_dkdv_spec", counted)
    monkeypatch.setattr(CACHE, "replays", False)  # (a replay would launch without building the spec)
    monkeypatch.setenv(gluon_backward.BACKWARD_PATH_VARIABLE, "gluon")
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: deterministic)
    batch, heads_q, heads_kv, seqlen_q, seqlen_k = shape
    torch.manual_seed(seqlen_q + head_dim)
    q, k, v = make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, torch.bfloat16, DEVICE)
    torch.full((batch, heads_kv, seqlen_k, head_dim), float("nan"), device=DEVICE, dtype=q.dtype)  # recycled
    checks = compare_with_reference(lambda q, k, v: flash_attention(q, k, v, is_causal=is_causal, return_lse=True),
                                    q, k, v, is_causal)
    assert all(c.ok for c in checks), checks
    assert calls and set(calls) == {deterministic}, calls  # (every head dim's kernel adds dQ up in its loop)


def backward_in_form(monkeypatch, form: dict, fragments: bool) -> list:
    """flash_attention's backward on the Gluon kernel launched in `form` (gluon_dkdv_launch's A/B options),
    dQ's buffer in register order or not (`fragments`); returns the list each launch's (tiles, the kernel's
    arguments by name) are appended to."""
    from flashtriton.launch import backward

    launches = []

    def spec_in_form(*args, **kwargs):
        launch = functools.partial(gluon_backward.gluon_dkdv_launch, **form)
        with mock.patch.object(gluon_backward, "gluon_dkdv_launch", launch):
            spec = gluon_backward.gluon_dkdv_spec(*args, **kwargs)
        values = (*spec.tensors, *spec.descriptors, *spec.scalars)
        launches.append((spec.tiles, dict(zip(spec.kernel.arg_names, values, strict=True))))
        return spec
    monkeypatch.setattr(backward, "gluon_dkdv_spec", spec_in_form)
    monkeypatch.setattr(CACHE, "replays", False)  # (a replay of the default form's plan would not call the form)
    monkeypatch.setattr(gluon_backward, "DQ_FRAGMENTS", fragments)
    monkeypatch.setenv(gluon_backward.BACKWARD_PATH_VARIABLE, "gluon")
    return launches


@pytest.mark.skipif(not ON_HOPPER, reason="Gluon's sm_90 kernels run on a Hopper GPU only")
@pytest.mark.parametrize("form", [dict(block_m=64), dict(dq_split_rows=False)])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 2, 17, 63), (2, 4, 2, 130, 97), (1, 4, 4, 300, 333), (3, 8, 2, 1000, 1100)])
def test_backward_ab_forms_at_head_dim_64(monkeypatch, form, is_causal, shape):
    """The A/B forms the launcher keeps beside D = 64's default: 64-row query blocks, and dQ split by D's
    columns between the compute warpgroups (the default splits its rows). Every gradient within twice plain
    bf16 attention's error of the float64 reference: odd lengths (rows past Nq read L = 0 and D = 0 there),
    Nq != Nk both ways, GQA, several key tiles."""
    from flashtriton import flash_attention
    from flashtriton.testing import compare_with_reference

    # (dQ's buffer in its other order: any blocks, any split)
    launches = backward_in_form(monkeypatch, form, fragments=False)
    batch, heads_q, heads_kv, seqlen_q, seqlen_k = shape
    torch.manual_seed(seqlen_q)
    q, k, v = make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, 64, torch.bfloat16, DEVICE)
    checks = compare_with_reference(lambda q, k, v: flash_attention(q, k, v, is_causal=is_causal, return_lse=True),
                                    q, k, v, is_causal)
    assert all(c.ok for c in checks), checks
    # the form ran, with dQ by its reductions
    assert launches and all(a["dq_desc"] is not None for _, a in launches), launches


@pytest.mark.skipif(not ON_HOPPER, reason="Gluon's sm_90 kernels run on a Hopper GPU only")
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 2, 17, 63), (2, 4, 2, 130, 97), (3, 8, 2, 1000, 1100)])
def test_backward_with_d_after_at_head_dim_128(monkeypatch, is_causal, shape):
    """The A/B form with L in S^T's accumulator but D subtracted after dP^T's product (delta_in_acc=False):
    every gradient within twice plain bf16 attention's error of the float64 reference, both masks (rows
    that see no key: zero gradients), odd lengths, Nq != Nk both ways, GQA."""
    from flashtriton import flash_attention
    from flashtriton.testing import compare_with_reference

    launches = backward_in_form(monkeypatch, dict(delta_in_acc=False), fragments=True)
    batch, heads_q, heads_kv, seqlen_q, seqlen_k = shape
    torch.manual_seed(seqlen_q + 1)
    q, k, v = make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, 128, torch.bfloat16, DEVICE)
    checks = compare_with_reference(lambda q, k, v: flash_attention(q, k, v, is_causal=is_causal, return_lse=True),
                                    q, k, v, is_causal)
    assert all(c.ok for c in checks), checks
    assert launches and all(t.endswith("-dq-atomic-fragments") and a["STATS_IN_ACC"] and a["DELTA_AFTER"]
                            for t, a in launches), launches


def test_backward_launch_refuses_dq_by_loader_where_it_cannot_apply():
    """dq_by_loader=True without dQ's buffer, or at D = 256 (whose dQ is staged in dO's halves), is an error
    naming the argument; None takes the library's choice there, off."""
    from flashtriton.launch.backward import statistics_buffer

    lse2, delta = statistics_buffer(torch.empty(1, 2, 256))
    q = torch.randn(1, 2, 256, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="dq_by_loader needs dq_acc"):
        gluon_backward.gluon_dkdv_launch(q, q, q, q, lse2, delta, q, q, True, 0.1, dq_by_loader=True)
    q256 = torch.randn(1, 2, 256, 256, dtype=torch.bfloat16)
    dq_acc = gluon_backward.dq_accumulator(q256, False)
    with pytest.raises(ValueError, match="head dim 256"):
        gluon_backward.gluon_dkdv_launch(q256, q256, q256, q256, lse2, delta, q256, q256, True, 0.1, dq_acc,
                                         dq_by_loader=True)
    args = gluon_backward.gluon_dkdv_launch(q256, q256, q256, q256, lse2, delta, q256, q256, True, 0.1, dq_acc)[2]
    assert args[-1] is False


@pytest.mark.skipif(not ON_HOPPER, reason="Gluon's sm_90 kernels run on a Hopper GPU only")
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 2, 1, 1), (2, 4, 2, 17, 63), (2, 4, 2, 130, 97), (1, 4, 4, 300, 333),
                                   (3, 8, 2, 1000, 1100)])
@pytest.mark.parametrize("fragments", [True, False])
def test_backward_with_dq_by_the_loader(monkeypatch, head_dim, is_causal, shape, fragments):
    """The form whose loader issues dQ's reductions (dq_by_loader=True, the kernel's DQ_BY_LOADER), dQ's
    buffer in either order: every gradient within twice plain bf16 attention's error of the float64
    reference, both masks (rows that see no key: zero gradients), one query block and several (the last
    block's staging tiles are not handed back), odd lengths, Nq != Nk both ways, GQA (the loader's
    blocks run over the group's query heads)."""
    from flashtriton import flash_attention
    from flashtriton.testing import compare_with_reference

    launches = backward_in_form(monkeypatch, dict(dq_by_loader=True), fragments=fragments)
    batch, heads_q, heads_kv, seqlen_q, seqlen_k = shape
    torch.manual_seed(seqlen_q + head_dim + 2)
    q, k, v = make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, torch.bfloat16, DEVICE)
    checks = compare_with_reference(lambda q, k, v: flash_attention(q, k, v, is_causal=is_causal, return_lse=True),
                                    q, k, v, is_causal)
    assert all(c.ok for c in checks), checks
    assert launches and all(a["DQ_BY_LOADER"] and a["dq_desc"] is not None for _, a in launches), launches


@pytest.mark.skipif(not ON_HOPPER, reason="Gluon's sm_90 kernels run on a Hopper GPU only")
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 2, 17, 63), (2, 4, 2, 130, 97), (3, 8, 2, 1000, 1100)])
@pytest.mark.parametrize("fragments", [True, False])
def test_backward_in_either_dq_order(monkeypatch, head_dim, is_causal, shape, fragments):
    """DQ_FRAGMENTS (the library's): the kernel stages dQ in its registers' order into a buffer of that
    order, which dq_from_fragments_kernel puts back in place; or (False) dQ's own order, as before. Every
    gradient within twice plain bf16 attention's error of the float64 reference; odd lengths (the last
    block's rows past Nq land in the buffer's padding, or in dQ's order are clipped by TMA; at D = 64, split
    by rows, the second warpgroup's share can lie wholly past Nq), Nq != Nk both ways, GQA; a second call
    replays the recorded launches."""
    from flashtriton import flash_attention
    from flashtriton.launch import last_choice
    from flashtriton.testing import compare_with_reference

    monkeypatch.setattr(gluon_backward, "DQ_FRAGMENTS", fragments)
    monkeypatch.setenv(gluon_backward.BACKWARD_PATH_VARIABLE, "gluon")
    batch, heads_q, heads_kv, seqlen_q, seqlen_k = shape
    torch.manual_seed(seqlen_q + head_dim)
    q, k, v = make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, torch.bfloat16, DEVICE)
    for _ in range(2):
        checks = compare_with_reference(lambda q, k, v: flash_attention(q, k, v, is_causal=is_causal,
                                                                        return_lse=True), q, k, v, is_causal)
        assert all(c.ok for c in checks), checks
    dkdv = last_choice("backward").names()[0]  # (its str also names dQ's kernel, which this path does not run)
    assert dkdv.endswith(gluon_backward.dkdv_form(True, gluon_backward.split_dq_by_rows(head_dim), fragments)), dkdv


@pytest.mark.skipif(not ON_HOPPER, reason="Gluon's sm_90 kernels run on a Hopper GPU only")
def test_auto_backward_takes_gluon_where_measured_faster(monkeypatch):
    """FLASHTRITON_BACKWARD unset: the Gluon backward from AUTO_MIN_KEYS[head dim, causal] keys, not with
    fewer, nor for a deterministic backward but at D = 256 (DETERMINISTIC_HEAD_DIMS: there its form without
    dQ, the Triton dQ kernel's), nor at a head dim the table leaves out."""
    monkeypatch.delenv(gluon_backward.BACKWARD_PATH_VARIABLE, raising=False)

    def selected(head_dim, seqlen_k, is_causal, deterministic=False):
        q, k, v = make_qkv(1, 2, 2, 64, seqlen_k, head_dim, torch.bfloat16, DEVICE, requires_grad=False)
        return gluon_backward.gluon_backward_selected(q, k, v, q, is_causal, deterministic)
    for (head_dim, is_causal), keys in gluon_backward.AUTO_MIN_KEYS.items():
        assert selected(head_dim, keys, is_causal) == RAN
        assert not selected(head_dim, keys - 1, is_causal)
        # (dQ by reductions is not deterministic; at D = 256 the form without it, dQ from the Triton kernel)
        assert selected(head_dim, keys, is_causal, deterministic=True) == (
            RAN and head_dim in gluon_backward.DETERMINISTIC_HEAD_DIMS)
    assert not selected(96, 8192, False)  # (a head dim the Gluon backward does not take)


@pytest.mark.skipif(not ON_HOPPER, reason="Gluon's sm_90 kernels run on a Hopper GPU only")
@pytest.mark.parametrize("is_causal", [False, True])
def test_backward_without_dq_takes_the_gluon_kernel_alone(monkeypatch, is_causal):
    """needs = (False, True, True) (q without grad): no Triton gradient kernel launches, and dK, dV equal
    the ones the same path gives beside dQ."""
    from flashtriton.launch.backward import attention_backward
    from flashtriton.launch.forward import attention_forward

    monkeypatch.setenv(gluon_backward.BACKWARD_PATH_VARIABLE, "gluon")
    torch.manual_seed(5)
    q, k, v = make_qkv(2, 4, 2, 97, 300, 128, torch.bfloat16, DEVICE, requires_grad=False)
    do = torch.randn_like(q)
    o, lse = attention_forward(q, k, v, is_causal, 128 ** -0.5)
    _, dk, dv = attention_backward(do, q, k, v, o, lse, is_causal, 128 ** -0.5)
    dq_alone, dk_alone, dv_alone = attention_backward(do, q, k, v, o, lse, is_causal, 128 ** -0.5,
                                                      needs=(False, True, True))
    assert dq_alone is None
    assert torch.equal(dk_alone, dk) and torch.equal(dv_alone, dv)


@pytest.mark.parametrize("with_dq", [False, True])
def test_backward_launch_spec_names_what_a_replay_rebuilds(with_dq):
    """gluon_dkdv_spec's contract with a replay (runner.run, replay.RecordedLaunch): the spec's per-call
    tensors are the kernel's first parameters (DK, DV), and its descriptors the next ones, each built over
    the source that attention_backward hands a replay in the same position: (q, k, v, do, lse2, delta[,
    dq_acc]). Without dQ, the kernel's None descriptor stays among the recorded scalars."""
    from flashtriton.launch.backward import statistics_buffer

    q, k, v, do, dk, dv = (torch.randn(1, 2, 97, 64, dtype=torch.bfloat16) for _ in range(6))
    lse2, delta = statistics_buffer(torch.empty(1, 2, 97))
    dq_acc = torch.zeros(q.shape) if with_dq else None
    spec = gluon_backward.gluon_dkdv_spec(q, k, v, do, lse2, delta, dk, dv, True, 0.125, dq_acc)
    names = spec.kernel.arg_names
    assert names[:2] == ["DK", "DV"] and spec.tensors[0] is dk and spec.tensors[1] is dv
    sources = (q, k, v, do, lse2, delta, dq_acc)[:len(spec.descriptors)]
    assert len(spec.descriptors) == (7 if with_dq else 6)
    for name, desc, source in zip(names[2:], spec.descriptors, sources, strict=False):
        assert name.endswith("_desc") and desc.base is source, (name, desc)
    assert (names[2 + len(spec.descriptors)] == "dq_desc") == (not with_dq)
    assert spec.scalars[0] is None if not with_dq else spec.scalars[0] == dk.stride(0)
    assert spec.tiles == f"gluon-N64x2-M128-s2{'-dq-atomic-split-rows' if with_dq else ''}"  # (D = 64's split)


@pytest.mark.parametrize("head_dim, block_m", [(128, 128), (64, 96)])
def test_backward_launch_rejects_query_blocks_it_cannot_hold(head_dim, block_m):
    """The launcher's A/B option: 128-row query blocks only at D = 64 (at D = 128 the stages would not fit in
    shared memory), and no size but 64 and 128: a ValueError naming the value, not a compile failure; and
    dQ split by rows only where each compute warpgroup gets 64 rows."""
    from flashtriton.launch.backward import statistics_buffer

    q = torch.randn(1, 2, 64, head_dim, dtype=torch.bfloat16)
    lse2, delta = statistics_buffer(torch.empty(1, 2, 64))
    with pytest.raises(ValueError, match=f"block_m must be 64, or 128 at head dim 64.*got {block_m}"):
        gluon_backward.gluon_dkdv_launch(q, q, q, q, lse2, delta, q, q, False, 0.1, block_m=block_m)
    with pytest.raises(ValueError, match="dq_split_rows needs 128-row query blocks.*got block_m=64"):
        gluon_backward.gluon_dkdv_launch(q, q, q, q, lse2, delta, q, q, False, 0.1, block_m=64, dq_split_rows=True)


def test_supports():
    q, k, v = make_qkv(1, 4, 2, 40, 50, 64, torch.bfloat16, "cpu", requires_grad=False)
    # (on CPU the device check does not apply: only compiled there)
    assert gluon_forward.gluon_forward_supports(q, k, v)
    assert gluon_forward.gluon_forward_supports(q.transpose(1, 2).contiguous().transpose(1, 2), k, v)  # (B, N, H, D)
    assert not gluon_forward.gluon_forward_supports(q.float(), k.float(), v.float())
    q96, k96, v96 = make_qkv(1, 4, 2, 40, 50, 96, torch.bfloat16, "cpu", requires_grad=False)
    assert not gluon_forward.gluon_forward_supports(q96, k96, v96)
    assert not gluon_forward.gluon_forward_supports(q, k[:, :, :0], v[:, :, :0])  # no key: TMA needs one
    odd = torch.randn(1, 4, 40, 65, dtype=torch.bfloat16)[..., :64]  # rows 130 bytes apart: not TMA-aligned
    assert not gluon_forward.gluon_forward_supports(odd, k, v)
    # D = 256 (64-key blocks), in 16-bit and in FP8
    q256, k256, v256 = make_qkv(1, 4, 2, 40, 50, 256, torch.bfloat16, "cpu", requires_grad=False)
    assert gluon_forward.gluon_forward_supports(q256, k256, v256)
    fp8 = (torch.float8_e4m3fn, )
    for x in ((q, k, v), (q256, k256, v256)):
        assert gluon_forward.gluon_forward_supports(*(t.to(torch.float8_e4m3fn) for t in x), dtypes=fp8)
    assert not gluon_forward.gluon_forward_supports(*(x.to(torch.float8_e4m3fn) for x in (q96, k96, v96)),
                                                    dtypes=fp8)


def test_launch_refuses_what_it_cannot_hold():
    """gluon_forward_launch, called directly (A/B scripts, inspect), names the head dims it takes, and refuses
    O by TMA at D = 256 in 16-bit, where O's staging tiles would not fit beside the rings in shared memory
    (FP8's do), scaled_p outside FP8, in FP8 lazy_rescale with sums_by_mma or with scaled_p (FP8_ALL_FLAGS
    says why), and in FP8 a V that is not V^T."""
    def launch(head_dim, dtype=torch.bfloat16, v=None, **kwargs):
        q = torch.randn(1, 2, 64, head_dim).to(dtype)
        if v is None:  # (FP8: V^T)
            v = torch.randn(1, 2, head_dim, 64).to(dtype) if dtype == torch.float8_e4m3fn else q
        o, lse = torch.empty(q.shape, dtype=torch.bfloat16), torch.empty(1, 2, 64)
        return gluon_forward.gluon_forward_launch(q, q, v, o, lse, False, 0.1, overlap=True, **kwargs)
    assert launch(256)[1] == (2, )  # 2 x 2 heads' 64 rows: one tile each
    # FP8 takes V^T, (B, Hkv, D, Nk), as fp8_forward_gluon prepares it, not V
    with pytest.raises(ValueError, match=r"an FP8 call takes V transposed, \(B, Hkv, D, Nk\), and descale factors"):
        launch(128, torch.float8_e4m3fn, v=torch.randn(1, 2, 64, 128).to(torch.float8_e4m3fn),
               descale=torch.ones(3, 1, 2))
    with pytest.raises(ValueError, match=r"head dims \(64, 128, 256\), got 96; the Triton kernels"):
        launch(96)
    with pytest.raises(ValueError, match=r"head dims \(64, 128, 256\) in FP8, got 96"):
        launch(96, torch.float8_e4m3fn, descale=torch.ones(3, 1, 2))
    with pytest.raises(ValueError, match=r"o_by_tma=True needs a head dim in \(64, 128\) in 16-bit, got 256"):
        launch(256, options=gluon_forward.ForwardOptions(o_by_tma=True))
    # FP8's rings are half the bytes: at D = 256 O's staging tiles fit beside them (the FP8 default takes them)
    assert launch(256, torch.float8_e4m3fn, descale=torch.ones(3, 1, 2),
                  options=gluon_forward.FP8_ALL_FLAGS)[1] == (2, )
    for head_dim in (64, 128):
        with pytest.raises(ValueError, match=r"sums_by_mma=True with lazy_rescale=True is refused in FP8"):
            launch(head_dim, torch.float8_e4m3fn, descale=torch.ones(3, 1, 2),
                   options=gluon_forward.ForwardOptions(lazy_rescale=True, sums_by_mma=True))
        with pytest.raises(ValueError, match=r"scaled_p=True with lazy_rescale=True is refused: .* turn one"):
            launch(head_dim, torch.float8_e4m3fn, descale=torch.ones(3, 1, 2),
                   options=gluon_forward.ForwardOptions(lazy_rescale=True, scaled_p=True))
        with pytest.raises(ValueError, match=r"scaled_p=True is for FP8 calls only: it keeps small probabilities"):
            launch(head_dim, options=gluon_forward.ForwardOptions(scaled_p=True))
        assert launch(head_dim, options=gluon_forward.ALL_FLAGS)[1] == (2, )  # (bf16 takes both)
        assert launch(head_dim, torch.float8_e4m3fn, descale=torch.ones(3, 1, 2),
                      options=gluon_forward.FP8_ALL_FLAGS)[1] == (2, )


def assert_matches_reference(q, k, v, is_causal, scale, o, lse):
    """O and L within twice plain bf16 attention's error of the float64 reference; rows that see no key
    (causal, Nq > Nk) give O = 0 and L = -inf exactly."""
    o64, lse64 = attention_ref(q.double(), k.double(), v.double(), is_causal=is_causal, scale=scale)
    low_o, low_lse = attention_ref(q, k, v, is_causal=is_causal, scale=scale, upcast=False)
    finite = torch.isfinite(lse64)
    for check in (bounded("O", o, o64, low_o, q.dtype), bounded("L", lse[finite], lse64[finite], low_lse[finite],
                                                                q.dtype)):
        assert check.ok, check
    assert torch.equal(torch.isneginf(lse), ~finite)
    assert not o[~finite].any()


@pytest.mark.skipif(not ON_HOPPER, reason="Gluon's sm_90 kernels run on a Hopper GPU only")
@pytest.mark.parametrize("head_dim", gluon_forward.HEAD_DIMS)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("seqlens", [(1, 1), (17, 63), (97, 130), (130, 97), (300, 333), (1024, 1024)])
@pytest.mark.parametrize("form", list(gluon_forward.FORMS))
def test_matches_float64_reference(head_dim, is_causal, seqlens, form):
    """O and L against the float64 reference, bounded by twice plain bf16 attention's error; GQA 4/2; O's
    memory NaN-filled before (the caching allocator hands the freed block to o); rows that see no key
    (causal, Nq > Nk) give O = 0 and L = -inf."""
    torch.manual_seed(sum(seqlens) + head_dim)
    q, k, v = make_qkv(2, 4, 2, *seqlens, head_dim, torch.bfloat16, DEVICE, requires_grad=False)
    scale = head_dim ** -0.5
    torch.full(q.shape, float("nan"), device=DEVICE, dtype=q.dtype)  # freed: o reuses its block
    o, lse = gluon_forward.attention_forward_gluon(q, k, v, is_causal, scale, *gluon_forward.FORMS[form])
    assert_matches_reference(q, k, v, is_causal, scale, o, lse)


def growing_scores(q, k):
    """q and k scaled so that the scores' row maxima grow from key block to key block, by more than the
    lazy rescale's threshold in some rows and by less in others: key block b (of BLOCK_N keys) times 1 + b, query
    row i times 0.25 to 2 by i % 8."""
    block = torch.arange(k.shape[2], device=k.device) // gluon_forward.BLOCK_N[k.shape[-1]]
    rows = torch.arange(q.shape[2], device=q.device) % 8
    return q * (0.25 + rows / 4)[:, None].to(q.dtype), k * (1 + block)[:, None].to(k.dtype)


FORWARD_OPTIONS = gluon_forward.flag_sets()


@pytest.mark.skipif(not ON_HOPPER, reason="Gluon's sm_90 kernels run on a Hopper GPU only")
@pytest.mark.parametrize("head_dim", gluon_forward.HEAD_DIMS)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("seqlens", [(1, 513), (130, 700), (700, 130), (640, 640)])
@pytest.mark.parametrize("form", list(gluon_forward.FORMS))
@pytest.mark.parametrize("options", list(FORWARD_OPTIONS))
def test_forward_options_match_float64_reference(head_dim, is_causal, seqlens, form, options):
    """lazy_rescale (kernels/gluon_rescale.py), sums_by_mma, o_by_tma and paired_stages, alone and together, on
    scores whose maxima grow across key blocks (growing_scores): rows that keep a stale max (probabilities up to 256),
    rows that rescale, and warps with both; O and L against the float64 reference as
    test_matches_float64_reference, O's memory NaN-filled before (o_by_tma: TMA must drop the rows past Nq,
    and before row 0 in a causal call's first tile). Key counts 513 and 700 leave the rings' stages at odd
    phases across a persistent program's tiles (paired_stages takes one stage more per tile). sums_by_mma
    and paired_stages need the overlapped loop (the in-turn form refuses them). o_by_tma once faulted on the
    causal tiles that start before row 0 (130 x 700, 1 x 513: docs/performance.md, entry 92)."""
    if form == "in-turn" and any(getattr(FORWARD_OPTIONS[options], name) for name in gluon_forward.OVERLAP_ONLY):
        pytest.skip(f"{', '.join(gluon_forward.OVERLAP_ONLY)} need overlap (test_options_that_need_overlap)")
    if not gluon_forward.options_fit(FORWARD_OPTIONS[options], head_dim):
        pytest.skip("O's staging tiles do not fit beside D = 256's rings (test_launch_refuses_what_it_cannot_hold)")
    torch.manual_seed(sum(seqlens) + head_dim)
    q, k, v = make_qkv(2, 4, 2, *seqlens, head_dim, torch.bfloat16, DEVICE, requires_grad=False)
    q, k = growing_scores(q, k)
    scale = head_dim ** -0.5
    torch.full(q.shape, float("nan"), device=DEVICE, dtype=q.dtype)  # freed: o reuses its block
    o, lse = gluon_forward.attention_forward_gluon(q, k, v, is_causal, scale, *gluon_forward.FORMS[form],
                                                   options=FORWARD_OPTIONS[options])
    assert_matches_reference(q, k, v, is_causal, scale, o, lse)


@pytest.mark.skipif(not ON_HOPPER, reason="Gluon's sm_90 kernels run on a Hopper GPU only")
@pytest.mark.parametrize("is_causal", [False, True])
def test_o_by_tma_in_flash_attn_layout(is_causal):
    """o_by_tma with q, k, v in flash_attn's (B, N, H, D) layout (seen as (B, H, N, D)): O comes back in the
    same layout, written through its descriptor's strides; a repeated call replays its launch with O's
    descriptor rebuilt over the new O."""
    torch.manual_seed(7)
    q, k, v = (torch.randn(2, 200, 4, 128, device=DEVICE, dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    for _ in range(2):
        torch.full((2, 200, 4, 128), float("nan"), device=DEVICE, dtype=q.dtype)  # freed: o reuses its block
        o, lse = gluon_forward.attention_forward_gluon(q, k, v, is_causal, 128 ** -0.5,
                                                       options=FORWARD_OPTIONS["ostore"])
        assert o.stride() == q.stride()
        assert_matches_reference(q, k, v, is_causal, 128 ** -0.5, o, lse)


@pytest.mark.parametrize("option", ["sums_by_mma", "paired_stages"])
def test_options_that_need_overlap(option):
    q = torch.randn(1, 2, 64, 64, dtype=torch.bfloat16)
    o, lse = torch.empty_like(q), torch.empty(1, 2, 64)
    with pytest.raises(ValueError, match=f"{option}=True needs overlap=True"):
        gluon_forward.gluon_forward_launch(q, q, q, o, lse, False, 0.1, overlap=False,
                                           options=gluon_forward.ForwardOptions(**{option: True}))


@pytest.mark.parametrize("form", list(gluon_forward.FORMS))
def test_default_options_fit_each_form(form):
    """A launch without options takes the library's (DEFAULT_OPTIONS), less those that need the overlapped
    loop in the in-turn form, which would refuse them: the kernel's last flags are ForwardOptions' but
    o_by_tma (O's descriptor), in order."""
    q = torch.randn(1, 2, 64, 64, dtype=torch.bfloat16)
    o, lse = torch.empty_like(q), torch.empty(1, 2, 64)
    args = gluon_forward.gluon_forward_launch(q, q, q, o, lse, False, 0.1, *gluon_forward.FORMS[form])[2]
    expected = gluon_forward.DEFAULT_OPTIONS
    if form == "in-turn":
        expected = expected._replace(**dict.fromkeys(gluon_forward.OVERLAP_ONLY, False))
    assert args[-len(gluon_forward.KERNEL_FLAGS):] == gluon_forward.kernel_flags(expected)
    assert gluon_forward.default_options(form != "in-turn") == expected
    from flashtriton.kernels.gluon_forward import attn_fwd_gluon_kernel
    kernel_names = attn_fwd_gluon_kernel.arg_names[-len(gluon_forward.KERNEL_FLAGS):]
    assert kernel_names == [field.upper() for field in gluon_forward.KERNEL_FLAGS], kernel_names
    assert args[7] is None  # bf16 leaves o_by_tma off: O's descriptor is None


def test_fp8_default_options_store_o_by_tma():
    """An FP8 launch without options takes FP8_DEFAULT_OPTIONS: the library's flags and O by TMA stores (O's
    descriptor among the arguments): with paired stages, 3-7% over neither flag in FP8 on the H200
    (docs/performance.md, entry 92). Not sums_by_mma: faster in FP8, but its sums of the e4m3 P put L up to
    0.023 low on broad scores (entry 98)."""
    q = torch.randn(1, 2, 256, 128).to(torch.float8_e4m3fn)
    vt = torch.randn(1, 2, 128, 256).to(torch.float8_e4m3fn)
    o, lse = torch.empty(q.shape, dtype=torch.bfloat16), torch.empty(1, 2, 256)
    args = gluon_forward.gluon_forward_launch(q, q, vt, o, lse, False, 0.1, overlap=True,
                                              descale=torch.ones(3, 1, 2))[2]
    expected = gluon_forward.FP8_DEFAULT_OPTIONS
    assert expected.o_by_tma and expected._replace(o_by_tma=False) == gluon_forward.DEFAULT_OPTIONS
    assert args[7] is not None and args[-len(gluon_forward.KERNEL_FLAGS):] == gluon_forward.kernel_flags(expected)


@pytest.mark.skipif(not ON_HOPPER, reason="Gluon's sm_90 kernels run on a Hopper GPU only")
@pytest.mark.parametrize("head_dim", gluon_forward.HEAD_DIMS)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("form", list(gluon_forward.FORMS))
def test_key_counts_on_a_padded_cache(head_dim, is_causal, form):
    """seqused_k: each sequence attends to its own first keys of a padded K and V whose rows past the count
    hold NaN, its causal diagonal at its last key. Counts 0 (O = 0, L = -inf), 5 (shorter than a key
    block: the block ending at the count starts before key 0), 128 (whole blocks), 300, 333 (the whole
    cache); 130 queries, GQA 4/2: each sequence against the float64 reference on its own keys."""
    torch.manual_seed(head_dim + is_causal)
    counts = [0, 5, 128, 300, 333]
    q, k, v = make_qkv(len(counts), 4, 2, 130, 333, head_dim, torch.bfloat16, DEVICE, requires_grad=False)
    for b, count in enumerate(counts):
        k[b, :, count:] = float("nan")
        v[b, :, count:] = float("nan")
    scale = head_dim ** -0.5
    seqused_k = torch.tensor(counts, dtype=torch.int32, device=DEVICE)
    o, lse = gluon_forward.attention_forward_gluon(q, k, v, is_causal, scale, *gluon_forward.FORMS[form],
                                                   seqused_k=seqused_k)
    assert not o[0].any() and torch.isneginf(lse[0]).all()
    for b, count in enumerate(counts[1:], start=1):
        one = slice(b, b + 1)
        assert_matches_reference(q[one], k[one, :, :count], v[one, :, :count], is_causal, scale, o[one], lse[one])


@pytest.mark.skipif(not ON_HOPPER, reason="Gluon's sm_90 kernels run on a Hopper GPU only")
@pytest.mark.parametrize("path", ["auto", "triton"])
def test_chunked_prefill_with_lengths_takes_the_gluon_forward(monkeypatch, path):
    """A KV-cache call with DENSE_FROM_QUERIES queries or more and a lengths tensor at D = 128 (a chunked
    prefill, as serving engines call it) runs the Gluon forward with the lengths as key counts, or the
    Triton forward under FLASHTRITON_FORWARD=triton: O and L of each sequence against the float64
    reference on its own keys, NaN past each length in the cache."""
    from flashtriton.kvcache import flash_attention_with_kvcache
    from flashtriton.launch import last_choice

    monkeypatch.setenv(gluon_forward.FORWARD_PATH_VARIABLE, path)
    torch.manual_seed(7)
    lengths = [1500, 2048, 3000, 4096]
    q = torch.randn(4, 8, 512, 128, device=DEVICE, dtype=torch.bfloat16)
    # flash_attn's (B, N, H, D) cache, seen as (B, H, N, D)
    k_cache, v_cache = (torch.randn(4, 4096, 2, 128, device=DEVICE, dtype=torch.bfloat16).transpose(1, 2)
                        for _ in range(2))
    for b, length in enumerate(lengths):
        k_cache[b, :, length:] = float("nan")
        v_cache[b, :, length:] = float("nan")
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    o, lse = flash_attention_with_kvcache(q, k_cache, v_cache, seqlens, is_causal=True, return_lse=True)
    took_gluon = str(last_choice("forward")).startswith("gluon")
    assert took_gluon == (path == "auto" and RAN), last_choice("forward")  # (auto: gluon_forward.gluon_ran)
    for b, length in enumerate(lengths):
        one = slice(b, b + 1)
        assert_matches_reference(q[one], k_cache[one, :, :length], v_cache[one, :, :length], True, 128 ** -0.5,
                                 o[one], lse[one])


@pytest.mark.skipif(not ON_HOPPER, reason="Gluon's sm_90 kernels run on a Hopper GPU only")
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("head_dim", gluon_forward.HEAD_DIMS)
@pytest.mark.parametrize("form", list(gluon_forward.FORMS))
def test_persistent_programs_take_several_tiles(head_dim, form, is_causal):
    """More tiles than SMs (3 x 8 heads x 16 row tiles = 384), with and without a causal mask (Nk = 2100
    keeps the causal grid persistent too): each persistent program runs ~3 tiles of different heads and
    batches, of different lengths when causal, its barriers' phases running on across them; ragged Nq and
    Nk, GQA 8/2, against the float64 reference."""
    torch.manual_seed(head_dim)
    q, k, v = make_qkv(3, 8, 2, 2000, 2100, head_dim, torch.bfloat16, DEVICE, requires_grad=False)
    assert 3 * 8 * 16 > torch.cuda.get_device_properties(0).multi_processor_count
    o, lse = gluon_forward.attention_forward_gluon(q, k, v, is_causal, head_dim ** -0.5, *gluon_forward.FORMS[form])
    assert_matches_reference(q, k, v, is_causal, head_dim ** -0.5, o, lse)


@pytest.mark.parametrize("seqlen_k, head_dim, persistent", [(8192, 128, True), (8193, 128, False), (4096, 64, True),
                                                           (4097, 64, False), (16384, 64, False), (4096, 256, True),
                                                           (4097, 256, False)])
def test_causal_grid_is_persistent_up_to_its_keys(seqlen_k, head_dim, persistent):
    """The launch's grid (no GPU needed: off the GPU it is sized for an H200's 132 SMs): one program per SM
    without a mask at any length, and with a causal mask up to PERSISTENT_CAUSAL_MAX_KEYS keys (8192 at
    D = 128, 4096 at D = 64 and 256); one program per tile past it."""
    def grid(is_causal):
        q = torch.empty(4, 8, 4096, head_dim, dtype=torch.bfloat16)
        k = torch.empty(4, 8, seqlen_k, head_dim, dtype=torch.bfloat16)
        o, lse = torch.empty_like(q), torch.empty(4, 8, 4096)
        return gluon_forward.gluon_forward_launch(q, k, k, o, lse, is_causal, 0.1, True)[1][0]
    tiles = 4 * 8 * -(-4096 // (gluon_forward.WARPGROUPS[head_dim] * gluon_forward.BLOCK_M))
    assert tiles > 132
    assert grid(False) == 132
    assert grid(True) == (132 if persistent else tiles)


@pytest.mark.parametrize("head_dim, is_causal, seqlen_k, fp8, form", [
    (64, False, 4096, False, (True, 3)), (64, True, 4096, False, (True, 2)), (64, True, 4097, False, (False, 3)),
    (64, True, 4096, True, (True, 3)), (128, True, 4096, False, (True, 2)), (128, False, 512, False, (True, 2)),
    (256, False, 4096, False, (True, 2)), (256, True, 8192, False, (False, 2))])
def test_grid_form_takes_two_warpgroups_on_a_persistent_causal_grid(head_dim, is_causal, seqlen_k, fp8, form):
    """(persistent, softmax warpgroups) by the rules: three warpgroups at D = 64 but two on a persistent causal
    grid in 16-bit (FP8 keeps three); what a caller forces stands."""
    assert gluon_forward.grid_form(head_dim, is_causal, seqlen_k, fp8) == form
    assert gluon_forward.grid_form(head_dim, is_causal, seqlen_k, fp8, persistent=False, warpgroups=3) == (False, 3)
    assert gluon_forward.grid_form(head_dim, is_causal, seqlen_k, fp8, persistent=True)[0]


@pytest.mark.skipif(not ON_HOPPER, reason="Gluon's sm_90 kernels run on a Hopper GPU only")
def test_flash_attn_layout_and_fresh_outputs():
    """(B, N, H, D) inputs seen as (B, H, N, D): 4-D descriptors take any strides, and o is laid out like
    q, over memory NaN-filled before."""
    torch.manual_seed(0)
    q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in
               make_qkv(2, 8, 8, 257, 257, 128, torch.bfloat16, DEVICE, requires_grad=False))
    torch.full((2, 8, 257, 128), float("nan"), device=DEVICE, dtype=torch.bfloat16)  # recycled below
    o, lse = gluon_forward.attention_forward_gluon(q, k, v, True, 128 ** -0.5)
    o64, _ = attention_ref(q.double(), k.double(), v.double(), is_causal=True)
    low_o, _ = attention_ref(q, k, v, is_causal=True, upcast=False)
    check = bounded("O", o, o64, low_o, q.dtype)
    assert check.ok, check


def test_bench_providers_force_the_path(monkeypatch):
    """`bench --providers flashtriton_triton,flashtriton_gluon` time flash_attention with FLASHTRITON_FORWARD
    set while they run, and unset after."""
    from flashtriton.tools.bench import PROVIDERS
    monkeypatch.delenv(gluon_forward.FORWARD_PATH_VARIABLE, raising=False)
    for path in ("triton", "gluon"):
        with PROVIDERS[f"flashtriton_{path}"].context():
            assert gluon_forward.forward_path() == path
    assert os.environ.get(gluon_forward.FORWARD_PATH_VARIABLE) is None


def test_forward_path_variable(monkeypatch):
    """FLASHTRITON_FORWARD: unset is auto; a value outside auto/triton/gluon raises, naming the variable;
    on CPU the interpreter runs the Triton kernels whatever it says."""
    monkeypatch.delenv(gluon_forward.FORWARD_PATH_VARIABLE, raising=False)
    assert gluon_forward.forward_path() == "auto"
    monkeypatch.setenv(gluon_forward.FORWARD_PATH_VARIABLE, " Gluon ")
    assert gluon_forward.forward_path() == "gluon"
    q, k, v = make_qkv(1, 2, 2, 64, 2048, 128, torch.bfloat16, "cpu", requires_grad=False)
    assert not gluon_forward.gluon_forward_selected(q, k, v, False)
    monkeypatch.setenv(gluon_forward.FORWARD_PATH_VARIABLE, "cudnn")
    with pytest.raises(ValueError, match="FLASHTRITON_FORWARD='cudnn'.*auto"):
        gluon_forward.forward_path()


def test_triton_releases():
    """The Gluon kernels compile under the installed Triton's release (or this module would be skipped), the
    releases they ran on are among those they compile under, and a release is read as major.minor."""
    assert gluon_forward.installed_release() in gluon_forward.GLUON_RELEASES
    assert set(gluon_forward.GLUON_RELEASES_RUN) <= set(gluon_forward.GLUON_RELEASES)
    assert gluon_forward.triton_release("3.9.0") == "3.9"
    assert gluon_forward.triton_release("3.10.1+git1a2b3c") == "3.10"
    assert RAN == (gluon_forward.installed_release() in gluon_forward.GLUON_RELEASES_RUN)


@pytest.mark.skipif(not ON_HOPPER, reason="Gluon's sm_90 kernels run on a Hopper GPU only")
def test_auto_needs_a_release_the_kernels_ran_on(monkeypatch):
    """Under a Triton release the Gluon kernels compile under but have not run on, auto keeps the Triton
    kernels (forward, backward and FP8's dequantized fallback) and FLASHTRITON_FORWARD=gluon and
    FLASHTRITON_BACKWARD=gluon still take the Gluon ones."""
    q, k, v = make_qkv(4, 4, 4, 2048, 2048, 128, torch.bfloat16, DEVICE, requires_grad=False)  # AUTO_MIN_WORK
    q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
    for release, ran in (("3.6", True), ("3.9", False)):
        monkeypatch.setattr(gluon_forward, "installed_release", lambda release=release: release)
        monkeypatch.setattr(gluon_forward, "GLUON_RELEASES_RUN", ("3.6", ))
        for path in ("auto", "gluon"):
            monkeypatch.setenv(gluon_forward.FORWARD_PATH_VARIABLE, path)
            monkeypatch.setenv(gluon_backward.BACKWARD_PATH_VARIABLE, path)
            wanted = ran or path == "gluon"
            assert gluon_forward.gluon_forward_selected(q, k, v, True) == wanted, (release, path)
            assert gluon_backward.gluon_backward_selected(q, k, v, q, True) == wanted, (release, path)
            assert gluon_forward.fp8_gluon_selected(q8, k8, v8) == wanted, (release, path)


@pytest.mark.skipif(not ON_HOPPER, reason="Gluon's sm_90 kernels run on a Hopper GPU only")
def test_forward_auto_selection_follows_its_table(monkeypatch):
    """FLASHTRITON_FORWARD unset: the Gluon forward from AUTO_MIN_KEYS[head dim, causal] keys, not with one
    fewer, for calls of at least AUTO_MIN_WORK; the table has every head dim the kernel takes, both masks."""
    monkeypatch.delenv(gluon_forward.FORWARD_PATH_VARIABLE, raising=False)

    def selected(head_dim, seqlen_k, is_causal, seqlen_q):
        q, k, v = make_qkv(1, 2, 2, seqlen_q, seqlen_k, head_dim, torch.bfloat16, DEVICE, requires_grad=False)
        return gluon_forward.gluon_forward_selected(q, k, v, is_causal)
    for (head_dim, is_causal), keys in gluon_forward.AUTO_MIN_KEYS.items():
        seqlen_q = -(-gluon_forward.AUTO_MIN_WORK // (2 * (keys - 1) * head_dim))  # enough work either way
        assert selected(head_dim, keys, is_causal, seqlen_q) == RAN, (head_dim, is_causal, keys)
        assert not selected(head_dim, keys - 1, is_causal, seqlen_q), (head_dim, is_causal, keys)
    assert set(gluon_forward.AUTO_MIN_KEYS) == {(d, c) for d in gluon_forward.HEAD_DIMS for c in (False, True)}


@pytest.mark.skipif(not ON_HOPPER, reason="Gluon's sm_90 kernels run on a Hopper GPU only")
@pytest.mark.parametrize("path, batch, head_dim, seqlen, variant, gluon", [
    ("auto", 16, 128, 1041, {}, True), ("auto", 4, 128, 1041, {}, True), ("auto", 1, 128, 1041, {}, False),
    ("auto", 32, 128, 529, {}, False),
    ("auto", 64, 128, 529, {"is_causal": False}, True),
    ("auto", 8, 64, 4113, {}, True), ("auto", 64, 64, 1000, {}, False),
    ("auto", 8, 64, 4113, {"is_causal": False}, True),
    ("auto", 8, 64, 2065, {"is_causal": False}, True), ("auto", 16, 64, 2040, {"is_causal": False}, False),
    ("auto", 32, 256, 529, {"is_causal": False}, True), ("auto", 8, 256, 1041, {}, True),
    ("auto", 16, 256, 1000, {}, False), ("gluon", 1, 64, 300, {}, True),
    ("triton", 8, 128, 2065, {}, False), ("auto", 16, 128, 1041, {"window_size": (64, 0)}, False),
    ("gluon", 1, 128, 1041, {"softcap": 20.0}, False)])
def test_api_selects_path(monkeypatch, path, batch, head_dim, seqlen, variant, gluon):
    """flash_attention takes the Gluon forward where FLASHTRITON_FORWARD and gluon_forward_selected say so
    (auto, AUTO_MIN_KEYS: D = 128 from 1024 keys, 512 without a mask, D = 64 from 1024, 2048 without a mask,
    D = 256 from 1024, 512 without a mask; and
    B·Hq·Nq·Nk·D >= AUTO_MIN_WORK (2^31): 4 x 4 x 1024 x 1041 x 128 and 64 x 4 x 512 x 529 x 128 are over
    it, 1 x 4 x ... under), and the Triton kernels for every variant; either way O, L and the gradients (the
    Triton backward on the Gluon forward's O and L) match the float64 reference. Causal unless the variant
    says otherwise."""
    from flashtriton import flash_attention
    from flashtriton.launch import last_choice
    from flashtriton.testing import compare_with_reference

    monkeypatch.setenv(gluon_forward.FORWARD_PATH_VARIABLE, path)
    torch.manual_seed(seqlen + head_dim)
    variant = dict(variant)
    is_causal = variant.pop("is_causal", True)
    q, k, v = make_qkv(batch, 4, 2, seqlen - 17, seqlen, head_dim, torch.bfloat16, DEVICE)
    checks = compare_with_reference(lambda q, k, v: flash_attention(q, k, v, is_causal=is_causal, return_lse=True,
                                                                    **variant),
                                    q, k, v, is_causal, **variant)
    assert all(c.ok for c in checks), checks
    # (auto takes the Gluon kernels only under a release they ran on: gluon_forward.gluon_ran)
    took_gluon = str(last_choice("forward")).startswith("gluon")
    assert took_gluon == (gluon and (RAN or path == "gluon")), last_choice("forward")


@pytest.mark.skipif(not ON_HOPPER, reason="Gluon's sm_90 kernels run on a Hopper GPU only")
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 2, 1, 1), (2, 4, 2, 17, 63), (2, 4, 2, 130, 97), (2, 4, 2, 300, 333),
                                   (3, 8, 2, 2000, 2100)])
@pytest.mark.parametrize("form", ["overlap", "pingpong"])
def test_three_warpgroups(is_causal, shape, form):
    """D = 64 with three softmax warpgroups (192-row tiles), overlapped, with and without the turns going
    round the three: the float64 reference bounds O and L,
    rows that see no key give O = 0 and L = -inf; the last shape has more tiles than SMs (persistent
    programs take several without a causal mask)."""
    batch, heads_q, heads_kv, seqlen_q, seqlen_k = shape
    torch.manual_seed(seqlen_q)
    q, k, v = make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, 64, torch.bfloat16, DEVICE, requires_grad=False)
    o, lse = gluon_forward.attention_forward_gluon(q, k, v, is_causal, 0.125, *gluon_forward.FORMS[form],
                                                   warpgroups=3)
    assert_matches_reference(q, k, v, is_causal, 0.125, o, lse)


@pytest.mark.skipif(not ON_HOPPER, reason="Gluon's sm_90 kernels run on a Hopper GPU only")
def test_a_repeated_call_replays_its_launch(monkeypatch):
    """A second call like the first (shapes, strides, dtypes, options) replays the first's launch with its
    own tensors: fresh values and key counts give their own O and L, within the float64 reference's bound.
    A call with other strides ((B, N, H, D) memory), or with replays off, goes through Triton's launch."""
    from flashtriton.launch.runner import last_choice

    def call(q, k, v, counts):
        o, lse = gluon_forward.attention_forward_gluon(q, k, v, True, 0.125,
                                                       seqused_k=torch.tensor(counts, dtype=torch.int32,
                                                                              device=DEVICE))
        for b, count in enumerate(counts):
            one = slice(b, b + 1)
            assert_matches_reference(q[one], k[one, :, :count], v[one, :, :count], True, 0.125, o[one], lse[one])
        return last_choice("forward")

    CACHE.reset()
    torch.manual_seed(0)
    first, second = (make_qkv(2, 4, 2, 97, 333, 128, torch.bfloat16, DEVICE, requires_grad=False) for _ in range(2))
    assert not call(*first, [333, 130]).replayed
    choice = call(*second, [17, 300])
    tiles = gluon_forward.gluon_tiles(2, 128) + gluon_forward.DEFAULT_OPTIONS.suffix()  # (the library's options)
    assert choice.replayed and str(choice) == f"gluon-{tiles}", choice
    bnhd = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in second]
    assert not call(*bnhd, [17, 300]).replayed
    monkeypatch.setattr(CACHE, "replays", False)
    assert not call(*second, [300, 17]).replayed


@pytest.mark.skipif(not ON_HOPPER, reason="Gluon's sm_90 kernels run on a Hopper GPU only")
@pytest.mark.parametrize("deterministic", [False, True])
def test_a_repeated_backward_replays_the_gluon_launch(monkeypatch, deterministic):
    """The Gluon backward's launch is part of the backward's plan: a second call like the first replays
    the statistics launch and the Gluon kernel, then dQ's un-permute (in the deterministic form the Triton
    dQ kernel instead) with its own tensors, whose gradients are bounded by the float64 reference's; dK
    and dV (one writer each) equal those of a call that goes through Triton's launch path, bitwise."""
    from flashtriton import flash_attention
    from flashtriton.launch.backward import attention_backward
    from flashtriton.launch.runner import last_choice
    from flashtriton.testing import compare_with_reference

    monkeypatch.setenv(gluon_backward.BACKWARD_PATH_VARIABLE, "gluon")
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: deterministic)
    CACHE.reset()
    torch.manual_seed(1)

    def checked(q, k, v):
        checks = compare_with_reference(lambda q, k, v: flash_attention(q, k, v, is_causal=True, return_lse=True),
                                        q, k, v, True)
        assert all(c.ok for c in checks), checks
        return last_choice("backward")
    first, second = (make_qkv(2, 4, 2, 97, 300, 128, torch.bfloat16, DEVICE) for _ in range(2))
    assert not checked(*first).replayed
    choice = checked(*second)
    assert choice.replayed and choice.names()[0].startswith("gluon-N64x2-M64"), choice

    q, k, v = (x.detach() for x in second)
    do = torch.randn_like(q)
    o, lse = flash_attention(q, k, v, is_causal=True, return_lse=True)
    attention_backward(do, q, k, v, o, lse, True, 128 ** -0.5)  # (records: its key is not autograd's)
    replayed = attention_backward(do, q, k, v, o, lse, True, 128 ** -0.5)
    assert last_choice("backward").replayed
    # dQ's trip back from the kernel's register order is the plan's last launch, not one through Triton
    backward_plans = [list(plan.launches) for plan in CACHE.plans.values() if "stats" in plan.launches]
    expected = ["stats", "dq", "gluon_dkdv"] if deterministic else ["stats", "gluon_dkdv", "dq_fragments"]
    assert backward_plans and all(names == expected for names in backward_plans), backward_plans
    monkeypatch.setattr(CACHE, "replays", False)
    launched = attention_backward(do, q, k, v, o, lse, True, 128 ** -0.5)
    assert not last_choice("backward").replayed
    assert torch.equal(replayed[1], launched[1]) and torch.equal(replayed[2], launched[2])
