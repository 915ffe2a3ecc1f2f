"""What the compiler made of each kernel, without a GPU: `python -m flashtriton inspect`.

Triton compiles for a target it is told about; it needs no GPU for that. This module runs the real
launchers (`attention_forward`, `attention_backward`) on CPU tensors of the right dtypes and strides with
Triton's driver replaced by one that reports an sm_90 (Hopper) GPU, so every kernel is specialised and
compiled exactly as on the H200 but not launched. From each compiled kernel it reads:

- registers per thread, stack and local memory (spills) from `cuobjdump --dump-resource-usage`, in the
  same call as the SASS;
- dynamic shared memory from the kernel's metadata;
- how many matrix instructions of each kind the SASS holds: HGMMA is Hopper's warp-group MMA (wgmma;
  QGMMA its 8-bit form, counted with it), HMMA the older per-warp tensor-core instruction. A Hopper
  attention kernel should show HGMMA only;
- how many waits on them (`WARPGROUP.DEPBAR`), and whether ptxas serialised them: its advisory C7515,
  which Triton shows only when asked (`knobs.nvidia.dump_ptxas_log`): read from the log of Triton's own
  ptxas run, or, where Triton's cache had the kernel and ran no ptxas, from running ptxas on the PTX
  again. A serialised kernel waits after every HGMMA, so no matrix product overlaps anything
  (docs/performance.md).

Triton ships `cuobjdump` and `nvdisasm` with its NVIDIA backend, so this runs on any machine with Triton.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import os
import re
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
from triton.backends.compiler import GPUTarget

from ..launch import DEFAULT_KERNELS, Varlen, attention_backward, attention_forward
from ..launch.autotune import BACKWARD_CANDIDATES, width_class
from ..launch.tiles import backward_configs, forward_config

HOPPER = GPUTarget("cuda", 90, 32)
# The kernels a forward and backward launch: their names, and where they sit in a launch.Kernels.
KERNELS = {"attn_fwd_kernel": "forward", "attn_bwd_preprocess_kernel": "preprocess", "attn_bwd_dkdv_kernel": "dkdv",
           "attn_bwd_dq_kernel": "dq"}


class _OfflineDriver:
    """Stands in for Triton's CUDA driver: reports a Hopper GPU, launches nothing."""

    def __init__(self, target: GPUTarget):
        self.target = target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        return torch.device("cpu")


class OfflineKernel(NamedTuple):
    """A kernel compiled offline: Triton's `asm` (ptx, cubin, ...) and `metadata`, and the log of the ptxas
    run that made its cubin (None where Triton's cache held the kernel, so that no ptxas ran)."""
    asm: dict
    metadata: object
    ptxas_log: str | None


class _Capture:
    """Stands in for a kernel: `kernel[grid](...)` compiles (warmup) and records an OfflineKernel in `sink`."""

    def __init__(self, name: str, kernel, sink: dict):
        self.name, self.kernel, self.sink = name, kernel, sink

    def __getitem__(self, grid):
        def compile_only(*args, **kwargs):
            # Triton prints ptxas's log to stdout when asked: kept, it saves running ptxas again for its
            # advisories (_wgmma_serialized), a sixth of what compiling and reading a kernel cost.
            printed = io.StringIO()
            with triton.knobs.nvidia.scope(), contextlib.redirect_stdout(printed):
                triton.knobs.nvidia.dump_ptxas_log = True
                compiled = self.kernel.warmup(*args, grid=grid, **kwargs)
                compiled = compiled.result() if hasattr(compiled, "result") else compiled
            log = printed.getvalue()
            self.sink[self.name] = OfflineKernel(compiled.asm, compiled.metadata, log if "ptxas" in log else None)
        return compile_only


@contextlib.contextmanager
def _offline(target: GPUTarget):
    """Yields (sink, kernels): launchers given `kernels=kernels` compile for `target` into `sink`."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("inspect compiles real kernels: run it without TRITON_INTERPRET=1")
    from triton.runtime import driver
    sink: dict = {}
    captures = {field: _Capture(name, getattr(DEFAULT_KERNELS, field), sink) for name, field in KERNELS.items()}
    driver.set_active(_OfflineDriver(target))
    try:
        yield sink, DEFAULT_KERNELS._replace(**captures)
    finally:
        # Back to the real driver; without a GPU there is none to build, so leave it to be made lazily.
        if torch.cuda.is_available():
            driver.reset_active()
        else:
            driver.set_active(None)


@dataclass
class KernelReport:
    kernel: str
    head_dim: int
    dtype: str
    causal: bool
    config: str
    registers: int
    stack_bytes: int
    local_bytes: int
    shared_bytes: int
    hgmma: int
    hmma: int
    wgmma_waits: int
    wgmma_serialized: bool
    register_reallocations: int  # USETMAXREG in the SASS: warp-specialised partitions trading registers
    f2f: int  # F2F in the SASS: float conversions on the SM's slow conversion unit (16 per clock)
    sass_sha1: str  # of the SASS's instructions: equal hashes, same machine code (--json only)
    # The named-barrier ids the SASS syncs or arrives on (BAR.SYNC/ARV/RED with an immediate id): Triton's
    # warp specialisation's own, and those a Gluon kernel names (kernels/gluon_barriers.py) (--json only).
    barriers: tuple[int, ...] = ()
    # Shared-memory stores by width in bytes, {4: STS, 8: STS.64, 16: STS.128} (--json only): the Gluon
    # backward's dQ staging takes 16-byte ones in its register-order form.
    shared_stores: dict[int, int] = dataclasses.field(default_factory=dict)
    # SASS instructions in all (--json only): what a change of the elementwise code costs in issue slots.
    instructions: int = 0
    # FMULs that a predicated forward branch jumps over (--json only): the Gluon forward's O rescale behind
    # its warp's vote (kernels/gluon_rescale.py).
    skippable_fmul: int = 0
    # TMA stores (UTMASTG) in the SASS (--json only): the Gluon forward's O with o_by_tma.
    tma_stores: int = 0
    # mbarrier arrives (SYNCS.ARRIVE) in the innermost loops that issue wgmma (--json only): the Gluon
    # forward's stage releases per key block and softmax warpgroup, two, or one with paired_stages.
    loop_arrives: int = 0
    # waits for wgmma groups that leave some in flight (WARPGROUP.DEPBAR.LE gsb0 with a nonzero count; --json
    # only): a form that overlaps its products keeps some; ptxas may instead wait for each at once, without
    # the serialisation advisory (the FP8 forward with 256-key blocks, docs/performance.md entry 93).
    partial_waits: int = 0
    # warpgroup barriers (BAR.SYNC) in the same loops as loop_arrives (--json only): Triton puts one before
    # each single-thread mbarrier arrive, and one before a wait that follows a wait on the same array of
    # mbarriers or (3.6 only) an arrive (benchmarks/gluon_barrier_rule.py; docs/performance.md, entry 116).
    loop_barriers: int = 0
    # stmatrix stores (STSM) in the SASS (--json only): O's staging tile with o_by_tma, 16 bytes per thread each.
    matrix_stores: int = 0
    # wgmma waits in the SASS beyond the PTX's (WARPGROUP.DEPBAR against wgmma.wait_group; --json only): ptxas
    # adds a full wait before a product that starts from registers written while another runs, which holds
    # that product's issue until the other is done (the D = 128 backward's dP^T; docs/performance.md, entry 142).
    added_waits: int = 0


def _cuobjdump(cubin: bytes, *options: str) -> str:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, *options, f.name], capture_output=True, text=True, check=True).stdout


def _resource_usage(listing: str) -> dict[str, int]:
    """Registers, stack and local bytes from a listing of `cuobjdump --dump-resource-usage`."""
    return {key: int(value) for key, value in re.findall(r"\b(REG|STACK|LOCAL):(\d+)", listing)}


# An instruction of cuobjdump's listing: `/*1a2b0*/   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ ;`
_INSTRUCTION = re.compile(r"/\*[0-9a-f]+\*/\s+([^;]*;)")


def _sass(listing: str) -> str:
    """The kernel's instructions, one per line, from a listing of `cuobjdump -sass`. Not Triton's
    asm["sass"]: its parser reads a four-digit address and stops at the first instruction past 64 KB of
    code, which the backward's causal kernels pass (two loops over the query blocks per compute warpgroup)."""
    return "\n".join(_INSTRUCTION.findall(listing))


def _wgmma_serialized(ptx: str, ptxas_log: str | None) -> bool:
    """Whether ptxas serialises the kernel's wgmma instructions (advisory C7515): from the log of the run
    that compiled it, or, without one, from a second ptxas run."""
    if ptxas_log is not None:
        return "C7515" in ptxas_log
    from triton.backends.nvidia.compiler import get_ptxas

    tool = get_ptxas(90).path  # the ptxas Triton itself compiles sm_90 with (3.9: its CUDA 13 one)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        out = subprocess.run([tool, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True,
                             text=True, check=True)
    return "C7515" in out.stdout + out.stderr


# A barrier instruction with an immediate id (`BAR.SYNC.DEFER_BLOCKING 0x2, 0x80;`, `BAR.ARV 0xf, 0x100;`).
_NAMED_BARRIER = re.compile(r"\bBAR\.(?:SYNC|ARV|RED)[\w.]*\s+(0x[0-9a-f]+|\d+)\b")


def _report(name: str, compiled: OfflineKernel, head_dim: int, dtype: torch.dtype, causal: bool,
            config: str) -> KernelReport:
    sass, usage = cubin_sass(compiled.asm["cubin"])
    lines = sass.splitlines()
    loop_opcodes = innermost_wgmma_loop_opcodes(lines)
    return KernelReport(name, head_dim, str(dtype).removeprefix("torch."), causal, config,
                        usage.get("REG", 0), usage.get("STACK", 0), usage.get("LOCAL", 0),
                        compiled.metadata.shared, len(re.findall(r"\b[HQ]GMMA\.", sass)),
                        len(re.findall(r"\bHMMA\.", sass)), len(re.findall(r"\bWARPGROUP\.DEPBAR", sass)),
                        _wgmma_serialized(compiled.asm["ptx"], compiled.ptxas_log),
                        len(re.findall(r"\bUSETMAXREG\b", sass)), len(re.findall(r"\bF2F\.", sass)),
                        hashlib.sha1(sass.encode()).hexdigest()[:12],
                        tuple(sorted({int(i, 0) for i in _NAMED_BARRIER.findall(sass)})),
                        _shared_stores(sass), sass.count(";"), skippable_fmuls(lines),
                        len(re.findall(r"\bUTMASTG\b", sass)),
                        sum(opcode.startswith("SYNCS.ARRIVE") for opcode in loop_opcodes),
                        len(re.findall(r"\bWARPGROUP\.DEPBAR\.LE gsb0, 0x0*[1-9a-f]", sass)),
                        sum(opcode.startswith("BAR.SYNC") for opcode in loop_opcodes),
                        len(re.findall(r"\bSTSM\.", sass)),
                        len(re.findall(r"\bWARPGROUP\.DEPBAR\b", sass))
                        - len(re.findall(r"\bwgmma\.wait_group\b", compiled.asm["ptx"])))


def branch_target(line: str) -> int | None:
    """A SASS branch's target as a line number of _sass's listing (cuobjdump lists a kernel's instructions
    16 bytes apart from address 0), or None if `line` is no branch. A branch may name a second predicate
    before its target (`@!P1 BRA P2, 0x3540`: taken where !P1 and P2 both hold)."""
    match = re.search(r"\bBRA(?:\.U)? (?:!?U?P\d, )?(0x[0-9a-f]+)", line)
    return int(match.group(1), 16) // 16 if match else None


def loops(lines: list[str]) -> list[tuple[int, int]]:
    """(first, last) line of each loop of a SASS listing: a backward branch's target, and the branch."""
    targets = ((branch_target(line), i) for i, line in enumerate(lines))
    return [(target, i) for target, i in targets if target is not None and target < i]


def innermost_loops(lines: list[str], opcode: str = r"[HQ]GMMA") -> list[tuple[int, int]]:
    """(first, last) of each loop of a listing that issues an instruction matching `opcode` (by default
    wgmma) and holds no other loop (ptxas puts an mbarrier wait's retry at the kernel's end, branching back:
    a span that holds the loops between)."""
    spans = loops(lines)
    return [(first, last) for first, last in spans
            if any(re.search(rf"\b{opcode}\.", line) for line in lines[first:last + 1])
            and not any((f, t) != (first, last) and first <= f and t <= last for f, t in spans)]


def innermost_wgmma_loop_opcodes(lines: list[str]) -> list[str]:
    """The opcodes of innermost_loops' wgmma loops, in order."""
    return [line.split()[1 if line.startswith("@") else 0] for first, last in innermost_loops(lines)
            for line in lines[first:last + 1]]


def branched_over(lines: list[str], first: int = 0, last: int | None = None,
                  counted: Callable[[list[str]], bool] = lambda run: True) -> int:
    """Instructions among lines[first:last + 1] of a SASS listing that predicated branches forward, each to a
    target within them, jump over, counting only the runs `counted` accepts."""
    end = len(lines) - 1 if last is None else last
    skipped = 0
    for i in range(first, end + 1):
        target = branch_target(lines[i])
        if lines[i].startswith("@") and target is not None and i + 1 < target <= end + 1:
            skipped += (target - i - 1) * counted(lines[i + 1:target])
    return skipped


def skippable_fmuls(lines: list[str], first: int = 0, last: int | None = None) -> int:
    """FMULs in runs of nothing else that a predicated branch forward jumps over, among lines[first:last + 1]
    of a SASS listing: the Gluon forward's O rescale behind its warp's vote (kernels/gluon_rescale.py)."""
    return branched_over(lines, first, last, lambda run: all(line.startswith("FMUL") for line in run))


def _shared_stores(sass: str) -> dict[int, int]:
    """{bytes per thread: count} of the SASS's STS instructions (STSM, the matrix store, aside)."""
    sizes = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "64": 8, "128": 16}
    counts: dict[int, int] = {}
    for suffix in re.findall(r"\bSTS((?:\.\w+)*)\s", sass):
        size = next((sizes[part] for part in suffix.split(".") if part in sizes), 4)
        counts[size] = counts.get(size, 0) + 1
    return counts


def inspect_defaults(head_dim: int, dtype: torch.dtype, causal: bool, seqlen: int = 4096,
                     use_tma: bool = True, target: GPUTarget = HOPPER, qk_ahead: bool = False,
                     backward_tma: bool = False, backward_candidates: bool = False) -> list[KernelReport]:
    """Compile the forward and backward kernels with the static tiles of a GPU call of this shape, or with
    the opt-in variants (`qk_ahead` forward, `backward_tma`) on the same tiles; with `backward_candidates`,
    the backward on each kernel's first autotuner candidate instead (the one large calls usually run)."""
    cuda = torch.device("cuda")
    fwd_cfg = dataclasses.replace(forward_config(head_dim, dtype, cuda, use_tma), qk_ahead=qk_ahead)
    if qk_ahead:
        fwd_cfg = dataclasses.replace(fwd_cfg, warp_specialize=False)  # the two do not combine
    bwd_cfgs = tuple(dataclasses.replace(c, use_tma=backward_tma) for c in backward_configs(head_dim, dtype, cuda))
    if backward_candidates:
        width = width_class(head_dim, dtype)
        bwd_cfgs = tuple(BACKWARD_CANDIDATES[kernel][width][0] for kernel in ("dkdv", "dq"))
    q = torch.randn(1, 2, seqlen, head_dim, dtype=dtype)
    reports = []
    with _offline(target) as (compiled, kernels):
        attention_forward(q, q, q, causal, head_dim ** -0.5, fwd_cfg, kernels=kernels)
        attention_backward(q, q, q, q, q, torch.zeros(1, 2, seqlen), causal, head_dim ** -0.5, bwd_cfgs,
                           kernels=kernels)
    names = {"attn_fwd_kernel": fwd_cfg.name, "attn_bwd_preprocess_kernel": "-",
             "attn_bwd_dkdv_kernel": bwd_cfgs[0].name, "attn_bwd_dq_kernel": bwd_cfgs[1].name}
    for name in KERNELS:
        reports.append(_report(name, compiled[name], head_dim, dtype, causal, names[name]))
    return reports


def inspect_backward_candidates(head_dim: int, dtype: torch.dtype, causal: bool, seqlen: int = 4096,
                                target: GPUTarget = HOPPER) -> list[KernelReport]:
    """The backward kernels compiled on each of their autotuner candidates for this head dim's width class
    (BACKWARD_CANDIDATES): the i-th dK/dV candidate beside the i-th dQ one, the shorter list's last standing
    in for the rest; each report named by its tiles."""
    width = width_class(head_dim, dtype)
    dkdv, dq = (BACKWARD_CANDIDATES[kernel][width] for kernel in ("dkdv", "dq"))
    q = torch.randn(1, 2, seqlen, head_dim, dtype=dtype)
    reports = []
    for i in range(max(len(dkdv), len(dq))):
        pair = (dkdv[min(i, len(dkdv) - 1)], dq[min(i, len(dq) - 1)])
        with _offline(target) as (compiled, kernels):
            attention_backward(q, q, q, q, q, torch.zeros(1, 2, seqlen), causal, head_dim ** -0.5, pair,
                               kernels=kernels)
        for name, cfg in zip(("attn_bwd_dkdv_kernel", "attn_bwd_dq_kernel"), pair, strict=True):
            reports.append(_report(name, compiled[name], head_dim, dtype, causal, cfg.name))
    return reports


def inspect_variants(head_dim: int, dtype: torch.dtype, causal: bool, seqlen: int = 4096,
                     target: GPUTarget = HOPPER) -> list[KernelReport]:
    """Compile the forward and backward kernels with each variant's flags on the static tiles: a sliding
    window with softcap and ALiBi, dropout, and a packed variable-length batch; and the forward with a
    key count per sequence (a chunked prefill against a KV cache). Triton's interpreter does
    not type-check kernels the way the compiler does, so this is where a variant's compile error shows
    without a GPU."""
    cuda = torch.device("cuda")
    fwd_cfg = forward_config(head_dim, dtype, cuda, use_tma=True)
    bwd_cfgs = backward_configs(head_dim, dtype, cuda)
    q = torch.randn(2, 4, seqlen, head_dim, dtype=dtype)
    lse = torch.zeros(2, 4, seqlen)
    cu = torch.tensor([0, seqlen // 3, seqlen], dtype=torch.int32)
    variants = {
        "window+softcap+alibi": (q, lse, dict(window=(512, 0), softcap=30.0, alibi_slopes=torch.rand(4))),
        "dropout": (q, lse, dict(dropout_p=0.1, dropout_seed=torch.zeros(1, dtype=torch.int64))),
        "varlen": (q[:1], lse[:1], dict(varlen=Varlen(cu, cu, seqlen - seqlen // 3, seqlen - seqlen // 3))),
    }
    reports = []
    for name, (x, x_lse, kwargs) in variants.items():
        with _offline(target) as (compiled, kernels):
            attention_forward(x, x, x, causal, head_dim ** -0.5, fwd_cfg, **kwargs, kernels=kernels)
            attention_backward(x, x, x, x, x, x_lse, causal, head_dim ** -0.5, bwd_cfgs, **kwargs, kernels=kernels)
        for kernel in KERNELS:
            reports.append(_report(kernel, compiled[kernel], head_dim, dtype, causal, name))
    with _offline(target) as (compiled, kernels):  # a padded KV cache's key count per sequence: forward only
        attention_forward(q, q, q, causal, head_dim ** -0.5, fwd_cfg, kernels=kernels,
                          seqused_k=torch.tensor([seqlen // 3, seqlen], dtype=torch.int32))
    reports.append(_report("attn_fwd_kernel", compiled["attn_fwd_kernel"], head_dim, dtype, causal, "key counts"))
    return reports


def _compile_offline(kernel, grid: tuple, args: tuple, kwargs: dict, target: GPUTarget):
    """A launcher's (kernel, grid, args, kwargs), compiled for `target` as _Capture compiles the Triton
    kernels; returns its OfflineKernel."""
    sink: dict = {}
    with _offline(target):
        _Capture("kernel", kernel, sink)[grid](*args, **kwargs)
    return sink["kernel"]


def offline_sass(kernel, grid: tuple, args: tuple, kwargs: dict, target: GPUTarget = HOPPER) -> str:
    """The SASS of a launcher's (kernel, grid, args, kwargs) compiled for `target`, on any machine: for
    scripts that read a kernel's instructions themselves (benchmarks/gluon_wait_order.py)."""
    return cubin_sass(_compile_offline(kernel, grid, args, kwargs, target).asm["cubin"])[0]


def cubin_sass(cubin: bytes) -> tuple[str, dict[str, int]]:
    """A cubin's instructions, one per line, and its registers, stack and local bytes per thread: for cubins
    compiled elsewhere (benchmarks/fa4_sass.py reads FlashAttention-4's)."""
    listing = _cuobjdump(cubin, "--dump-resource-usage", "-sass")
    return _sass(listing), _resource_usage(listing)


def inspect_decode(head_dim: int, cache_dtype: torch.dtype, causal: bool, seqlen: int = 8192,
                   target: GPUTarget = HOPPER, tma: bool | None = None) -> list[KernelReport]:
    """Compile the decode kernel (launch/decode.py) as a decoding step launches it: a bf16 q, one token
    for each of 32 query heads over 8 KV heads (Nq = 4 with `causal`), against a contiguous cache of
    `seqlen` keys in `cache_dtype` (bf16, or float8_e4m3fn with descales), on its decode_tiles; `tma`
    forces the tiles' path (None: the launcher's rule)."""
    from ..kernels.decode import attn_decode_kernel
    from ..launch.decode import prepare_decode

    tokens = 4 if causal else 1
    q = torch.randn(8, 32, tokens, head_dim, dtype=torch.bfloat16)
    k, v = (torch.randn(8, 8, seqlen, head_dim).to(cache_dtype) for _ in range(2))
    fp8 = cache_dtype == torch.float8_e4m3fn
    k_descale, v_descale = (torch.ones(8, 8), torch.ones(1)) if fp8 else (None, None)
    lengths = torch.full((8,), seqlen, dtype=torch.int32)
    call = prepare_decode(q, k, v, lengths, head_dim ** -0.5, is_causal=causal, k_descale=k_descale,
                          v_descale=v_descale, tma=tma)
    outs = (torch.empty(8, 32, tokens, call.splits, call.block_d), torch.empty(8, 32, tokens, call.splits))
    tensors = call.decode_tensors(q, k, v, outs, lengths, None, None, None, None, k_descale, v_descale)
    compiled = _compile_offline(attn_decode_kernel, call.grid, (*tensors, *call.scalars),
                                {**call.meta, **call.config}, target)
    tiles = f"{call.meta['BLOCK_M']}x{call.meta['BLOCK_N']}, {call.config['num_warps']} warps, " \
            f"{call.config['num_stages']} stages{', TMA' if call.tma else ''}"
    return [_report("attn_decode_kernel", compiled, head_dim, cache_dtype, causal, tiles)]


def inspect_gluon(head_dim: int, dtype: torch.dtype, causal: bool, seqlen: int = 4096,
                  target: GPUTarget = HOPPER) -> list[KernelReport]:
    """Compile the Gluon forward (launch/gluon_forward.py) for this shape, as attention_forward_gluon
    would launch it, in each of its FORMS (in turn, overlapped, ping-pong) without flags and with two softmax
    warpgroups; at D = 64 also overlapped with three (FlashAttention-3's tile there, and what the library
    runs); the library's form with key counts (seqused_k) and its flags; and that form with each flag of
    gluon_forward_options() alone, and with the library's flags where they are several. For
    float8_e4m3fn, the FP8 forward as fp8_forward_gluon launches it, without flags and likewise."""
    from ..launch import gluon_forward

    if dtype == torch.float8_e4m3fn:  # the FP8 form: the default schedule, V^T, a bf16 output
        q = torch.randn(1, 2, seqlen, head_dim).to(dtype)
        vt = torch.randn(1, 2, head_dim, seqlen).to(dtype)
        o, lse = torch.empty(q.shape, dtype=torch.bfloat16), torch.empty(1, 2, seqlen)
        warpgroups = gluon_forward.grid_form(head_dim, causal, seqlen, fp8=True)[1]
        reports = []
        for options in gluon_forward_options(fp8=True):
            kernel, grid, args, kwargs = gluon_forward.gluon_forward_launch(
                q, q, vt, o, lse, causal, head_dim ** -0.5, overlap=True,
                descale=torch.ones(3, 1, 2), options=options)
            config = _gluon_config(warpgroups, head_dim, "overlap-fp8" + options.suffix())
            reports.append(_report(kernel.__name__, _compile_offline(kernel, grid, args, kwargs, target), head_dim,
                                   dtype, causal, config))
        return reports
    q = torch.randn(1, 2, seqlen, head_dim, dtype=dtype)
    o, lse = torch.empty_like(q), torch.empty(1, 2, seqlen)
    variants = [(form, flags, 2) for form, flags in gluon_forward.FORMS.items()]
    if head_dim == 64:
        variants.append(("overlap", gluon_forward.FORMS["overlap"], 3))
    reports = []
    for form, (overlap, pingpong), warpgroups in variants:
        kernel, grid, args, kwargs = gluon_forward.gluon_forward_launch(q, q, q, o, lse, causal, head_dim ** -0.5,
                                                                        overlap, pingpong, warpgroups=warpgroups,
                                                                        options=gluon_forward.ForwardOptions())
        compiled = _compile_offline(kernel, grid, args, kwargs, target)
        reports.append(_report(kernel.__name__, compiled, head_dim, dtype, causal,
                               _gluon_config(warpgroups, head_dim, form)))
    # the form the library runs, with a key count per sequence (a KV cache's chunked prefill)
    kernel, grid, args, kwargs = gluon_forward.gluon_forward_launch(
        q, q, q, o, lse, causal, head_dim ** -0.5, *gluon_forward.FORMS["overlap"],
        seqused_k=torch.tensor([seqlen // 3], dtype=torch.int32))
    warpgroups = gluon_forward.grid_form(head_dim, causal, seqlen)[1]  # the library's, as below
    reports.append(_report(kernel.__name__, _compile_offline(kernel, grid, args, kwargs, target), head_dim, dtype,
                           causal, _gluon_config(warpgroups, head_dim, "overlap-key-counts")))
    # the library's form with each flag alone (and with the library's flags), those the head dim takes
    for options in gluon_forward_options()[1:]:
        if not gluon_forward.options_fit(options, head_dim):
            continue
        kernel, grid, args, kwargs = gluon_forward.gluon_forward_launch(
            q, q, q, o, lse, causal, head_dim ** -0.5, *gluon_forward.FORMS["overlap"], options=options)
        reports.append(_report(kernel.__name__, _compile_offline(kernel, grid, args, kwargs, target), head_dim,
                               dtype, causal, _gluon_config(warpgroups, head_dim, "overlap" + options.suffix())))
    return reports


def gluon_forward_options(fp8: bool = False) -> list:
    """The Gluon forward's flags as inspect_gluon compiles them: none, each alone that the precision takes (O's
    rescale skipped where the maxima held, the rows' sums by the tensor cores, O by TMA, K and V paired in one
    stage, in FP8 P scaled before its rounding), and the library's set (default_options, bf16's or FP8's) where
    it is more than one flag; named in the reports by ForwardOptions.suffix."""
    from ..launch.gluon_forward import ForwardOptions, default_options, single_flags

    sets = [ForwardOptions(), *single_flags(fp8).values()]
    library = default_options(True, fp8)
    return sets + ([library] if library not in sets else [])


def _gluon_config(warpgroups: int, head_dim: int, form: str) -> str:
    """The Gluon forward's tiles, registers and form as a report's `config`, e.g. M64x2-N128-s2-r168/240-overlap."""
    from ..launch import gluon_forward

    launch_registers, softmax_registers = gluon_forward.REGISTERS[warpgroups]
    return (f"M{gluon_forward.BLOCK_M}x{warpgroups}-N{gluon_forward.BLOCK_N[head_dim]}-s{gluon_forward.NUM_STAGES}-"
            f"r{launch_registers}/{softmax_registers}-{form}")


def inspect_gluon_backward(head_dim: int, dtype: torch.dtype, causal: bool, seqlen: int = 4096,
                           target: GPUTarget = HOPPER) -> list[KernelReport]:
    """Compile the Gluon dK/dV kernel (launch/gluon_backward.py) for this shape, as attention_backward
    would launch it under FLASHTRITON_BACKWARD=gluon, deterministic (without dQ) and not (dQ by TMA
    reductions, staged in register order: DQ_FRAGMENTS; at D = 64 split by rows, split_dq_by_rows; at D = 256
    staged as dQ lies, dq_in_fragments); and the A/B forms the library does not run: dQ staged like dQ, and
    at D = 64 split by D's columns."""
    from ..launch import gluon_backward
    from ..launch.backward import statistics_buffer

    q = torch.randn(1, 2, seqlen, head_dim, dtype=dtype)
    lse2, delta = statistics_buffer(torch.empty(1, 2, seqlen))
    launch_registers, compute_registers = gluon_backward.REGISTERS
    reports = []
    forms = [(False, False, False), (True, False, False)]
    forms += [(True, False, True)] if not gluon_backward.splits_columns(head_dim) else []
    forms += [(True, True, False), (True, True, True)] if head_dim == 64 else []
    for atomic, split_rows, fragments in forms:
        dq_acc = gluon_backward.dq_accumulator(q, fragments, split_rows=split_rows) if atomic else None
        kernel, grid, args, kwargs = gluon_backward.gluon_dkdv_launch(q, q, q, q, lse2, delta, q, q, causal,
                                                                      head_dim ** -0.5, dq_acc,
                                                                      dq_split_rows=split_rows, dq_fragments=fragments)
        compiled = _compile_offline(kernel, grid, args, kwargs, target)
        config = (f"N{gluon_backward.KEYS}x{gluon_backward.program_keys(head_dim) // gluon_backward.KEYS}-"
                  f"M{gluon_backward.BLOCK_M[head_dim]}-"
                  f"s{gluon_backward.NUM_STAGES}-r{launch_registers}/{compute_registers}"
                  f"{gluon_backward.dkdv_form(atomic, split_rows, fragments)}")
        reports.append(_report(kernel.__name__, compiled, head_dim, dtype, causal, config))
    return reports


def markdown(reports: list[KernelReport]) -> str:
    lines = ["| kernel | D | dtype | causal | tiles | regs | spill (stack+local B) | smem B | HGMMA | HMMA "
             "| wgmma waits | serialised | USETMAXREG | F2F |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r.kernel} | {r.head_dim} | {r.dtype} | {r.causal} | {r.config} | {r.registers} | "
              f"{r.stack_bytes + r.local_bytes} | {r.shared_bytes} | {r.hgmma} | {r.hmma} | {r.wgmma_waits} | "
              f"{'yes' if r.wgmma_serialized else 'no'} | {r.register_reallocations} | {r.f2f} |" for r in reports]
    return "\n".join(lines)
