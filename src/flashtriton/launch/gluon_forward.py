"""The Gluon forward's launcher (kernels/gluon_forward.py), and which calls it takes.

attention_forward (launch/forward.py) takes this path for a plain forward (no window, softcap, ALiBi,
dropout or packed batch) that `gluon_forward_selected` accepts: on an sm_90 GPU, where it is faster than
the Triton kernel (the H200 A/B of docs/performance.md, "The Gluon forward"). The environment variable
FLASHTRITON_FORWARD forces a path: "triton" never takes it, "gluon" takes it for every call it supports
(D = 64 too, any length), "auto" (the default) decides by head dim, length and size. The Triton kernels
stay the reference: interpreter-tested, portable, and what every variant runs. "auto" takes the Gluon
kernels only under a Triton release they have run on (GLUON_RELEASES_RUN); "gluon" under any release they
compile under (GLUON_RELEASES).

Tiles: WARPGROUPS softmax warpgroups (two at D = 128 and 256, three at D = 64, two on a persistent causal
grid) of BLOCK_M = 64 query rows each (a tile holds 128 or 192), key blocks of BLOCK_N = 128 keys (64 at
D = 256), NUM_STAGES = 2 shared-memory stages of K and V (2 x 64 KB at D = 128, with Q's 32 KB: 160 KB of
the H200's 227 KB per block; at D = 256, 2 x 64 KB and Q's 64 KB: 192 KB).

D = 256 compiles with no spilled register in 192 KB of shared memory, passes the GPU tests and ran
1.33-1.64x the Triton kernel (AUTO_MIN_KEYS). The FP8 form compiles at D = 256 too (164 KB with O by TMA,
no spill) and has run on an H100 (entries 104-105): auto takes it there too (FP8_AUTO_HEAD_DIMS). The
Gluon backward has a form of its own at D = 256 (launch/gluon_backward.py).
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import torch

from ..kernels.fp8_values import fp8_values_kernel
from . import replay
from .arguments import COMPILE_OPTIONS, LOG2E, cdiv, cuda_properties, sm_count
from .runner import LaunchSpec, replay_recorded, run

BLOCK_M = 64
# Keys per block, by head dim. At D = 256 a softmax thread holds O's 64 x 256 fp32 (128 registers), so the
# scores take 64 keys (32 registers; 128 keys spill), and two stages of 128 keys would not fit shared memory.
BLOCK_N = {64: 128, 128: 128, 256: 64}
NUM_STAGES = 2
HEAD_DIMS = tuple(BLOCK_N)
FP8_HEAD_DIMS = (64, 128, 256)  # the FP8 form's
# ... and those "auto" takes it at: all three. D = 256 in FP8 has run on an H100 only (no H200 came in five
# sessions), in two calls 1.52-1.56x the bf16 forward and 1.58-1.59x cuDNN, its GPU tests and the Nk = 1
# loop passing (docs/performance.md, entries 104, 105 and 108): flash_attention on the e4m3 values, what
# auto ran there before, is the bf16 forward.
FP8_AUTO_HEAD_DIMS = (64, 128, 256)
# O by TMA stages each warpgroup's 64 x D output in shared memory: in 16-bit another 64 KB at D = 256,
# past the 227 KB beside 192 KB of Q, K and V. FP8's tiles are half the bytes: at D = 256, 164 KB in all.
O_BY_TMA_HEAD_DIMS = (64, 128)


def forward_head_dims(fp8: bool) -> tuple[int, ...]:
    """The head dims the Gluon forward takes: HEAD_DIMS, or in FP8 FP8_HEAD_DIMS."""
    return FP8_HEAD_DIMS if fp8 else HEAD_DIMS
WARPGROUPS = {64: 3, 128: 2, 256: 2}  # softmax warpgroups per tile, by head dim (the faster on the H200: entry 49)
# ... but a persistent causal grid takes two at D = 64 in 16-bit: its 192-row tiles shared out among the
# programs less evenly than 128-row ones: 1.04-1.38x three there from 2048 to 8192 keys (entry 80)
PERSISTENT_CAUSAL_WARPGROUPS = {64: 2, 128: 2, 256: 2}
# Registers per thread by softmax warpgroups: (at launch, each softmax thread's after setmaxnreg). The SM's
# 64K are shared by the loader's 4 warps and the softmax warpgroups: with two (12 warps), 168 at launch,
# then 240 per softmax thread and what is left (24) per loader thread; with three (16 warps), 128, then
# 160 and 32, as FlashAttention-3 runs D = 64 (S is 64 x 128 fp32 and O 64 x 64: 96 registers).
REGISTERS = {2: (168, 240), 3: (128, 160)}
_DTYPES = (torch.bfloat16, torch.float16)
# The kernel's schedules, as (overlap, pingpong): each block's products and softmax in turn; block j's Q K^T
# issued with block j-1's P V (the softmax written between their waits, which ptxas runs first: the
# kernel's module docstring); and that with the warpgroups taking turns on the tensor cores.
FORMS = {"in-turn": (False, False), "overlap": (True, False), "pingpong": (True, True)}


class ForwardOptions(NamedTuple):
    """Changes to the Gluon forward that are flags of the same kernel, off here; DEFAULT_OPTIONS and
    FP8_DEFAULT_OPTIONS name those the library runs, once raced on the H200."""
    # O rescaled only where a row's max grew by more than 2^8 (the kernel's LAZY_RESCALE,
    # kernels/gluon_rescale.py): 51 fewer instructions per key block and warp at D = 128 offline (entry 86)
    lazy_rescale: bool = False
    # each row's sum of P by the tensor cores, P times ones beside P V (SUMS_BY_MMA; overlapped loop only):
    # 50 fewer instructions per key block and warp at D = 128 offline, for 8 thin products (entry 87)
    sums_by_mma: bool = False
    # O written by TMA stores from shared memory, FlashAttention-3's epilogue (the kernel's o_desc), instead
    # of through pointers: the epilogue's instructions per tile, which count at short lengths (entry 89)
    o_by_tma: bool = False
    # K of block j + 1 and V of block j in one stage of the two rings, released together (the kernel's
    # PAIRED_STAGES; overlapped loop only): one mbarrier arrive, and the warpgroup barrier Triton puts before
    # it, per key block instead of two, for K held until P V has run (entry 90)
    paired_stages: bool = False
    # FP8 only, not with lazy_rescale: P rounded to e4m3 as 2^8 P (the kernel's SCALED_P), so that a broad
    # row's small probabilities keep their bits rather than fall on e4m3's subnormal grid; L takes the 8 back
    # out. Results move slightly (O's error -16% on broad scores, CPU emulation); instructions +2 per key
    # block and warp (entry 99)
    scaled_p: bool = False

    def suffix(self) -> str:
        """For logs: e.g. "-lazy-ostore", "" when all are off."""
        return "".join(f"-{name}" for name, on in zip(FLAG_NAMES, self, strict=True) if on)


# ForwardOptions' fields as logs and A/B runs name them
FLAG_NAMES = ("lazy", "sums", "ostore", "paired", "scaled")
# ... and those the kernel takes as its last arguments, in this order: o_by_tma is O's descriptor instead
KERNEL_FLAGS = tuple(field for field in ForwardOptions._fields if field != "o_by_tma")


def kernel_flags(options: ForwardOptions) -> tuple[bool, ...]:
    """`options` as the kernel's last arguments (KERNEL_FLAGS)."""
    return tuple(getattr(options, field) for field in KERNEL_FLAGS)


# The flags that only an FP8 call takes, and why (why_options_refused).
FP8_ONLY = {"scaled_p": "it keeps small probabilities out of e4m3's subnormals; bf16 and fp16 round P "
                        "relative to its size at every magnitude it takes"}


def single_flags(fp8: bool = False) -> dict[str, ForwardOptions]:
    """Each of ForwardOptions' flags that the precision takes, on alone, by its FLAG_NAMES name (the A/B
    runs', inspect's, the tests')."""
    return {name: ForwardOptions(**{field: True})
            for name, field in zip(FLAG_NAMES, ForwardOptions._fields, strict=True) if fp8 or field not in FP8_ONLY}


# every flag bf16 and fp16 take on (the tests', the A/B runs')
ALL_FLAGS = ForwardOptions(*(True, ) * len(ForwardOptions._fields))._replace(**dict.fromkeys(FP8_ONLY, False))
# In FP8 sums_by_mma and lazy_rescale exclude each other: the sums are of the e4m3 P, and with a kept max a
# row's largest P is any value up to 2^8, rounded by up to 2^-4 of itself, not exactly 1: L took that
# rounding, 1.2-2.1x its bound on the GPU (docs/performance.md, entry 97); and scaled_p would take that P to
# 2^16, past e4m3's range. The FP8 "all" leaves lazy out.
FP8_ALL_FLAGS = ALL_FLAGS._replace(lazy_rescale=False, **dict.fromkeys(FP8_ONLY, True))


def all_flags(fp8: bool = False) -> ForwardOptions:
    """Every flag the form takes on: ALL_FLAGS, or in FP8 FP8_ALL_FLAGS."""
    return FP8_ALL_FLAGS if fp8 else ALL_FLAGS


def flag_sets(fp8: bool = False) -> dict[str, ForwardOptions]:
    """single_flags() and all_flags(fp8) as "all": the sets the GPU tests run the kernel with."""
    return single_flags(fp8) | {"all": all_flags(fp8)}


# What the library runs: the flags measured correct and faster on the H200 (docs/performance.md, entries 91
# and 92): paired_stages, 5-9% in FP8 and 0-1.6% in bf16 (against a provider that its place in the round may
# have slowed, entry 92); in FP8 also o_by_tma: the two together 3-7% over neither on six shapes. In bf16
# o_by_tma ran -5% (cs336's shape) to +3% and sums_by_mma -6% to -0.5%, so they stay off there;
# lazy_rescale ran 2-5% slower in bf16. In FP8 sums_by_mma ran 1.02-1.11x with O's errors unchanged, but
# its sums are of P rounded to e4m3, whose grid below 2^-6 loses most of a broad row's small probabilities:
# L came out up to 0.023 low in the GPU tests, 8x plain FP8 attention's (exact sums; on an H100, entry 98),
# so it stays off there too.
DEFAULT_OPTIONS = ForwardOptions(paired_stages=True)
FP8_DEFAULT_OPTIONS = DEFAULT_OPTIONS._replace(o_by_tma=True)
# ... and where flash_attention_fp8 does not return L, sums_by_mma too: the sums of the e4m3 P cost L its
# accuracy, not O (O's RMSE unchanged, the kernel 1.02-1.11x at D = 64 and 128 on an H100: entry 98).
FP8_WITHOUT_LSE_OPTIONS = FP8_DEFAULT_OPTIONS._replace(sums_by_mma=True)


# The flags that need the overlapped loop, and why (the in-turn form refuses them).
OVERLAP_ONLY = {"sums_by_mma": "the sums are taken beside the overlapped loop's P V",
                "paired_stages": "a stage pairs the K and V that the overlapped loop's products read together"}


def default_options(overlap: bool, fp8: bool = False) -> ForwardOptions:
    """DEFAULT_OPTIONS (FP8_DEFAULT_OPTIONS for an FP8 call) for a form: without OVERLAP_ONLY's flags in the
    in-turn one."""
    options = FP8_DEFAULT_OPTIONS if fp8 else DEFAULT_OPTIONS
    return options if overlap else options._replace(**dict.fromkeys(OVERLAP_ONLY, False))


def why_options_refused(options: ForwardOptions, head_dim: int, fp8: bool = False) -> str | None:
    """Why the kernel at this head dim and precision does not take what `options` ask for, or None: O by TMA
    past O_BY_TMA_HEAD_DIMS in 16-bit (shared memory), FP8_ONLY's flags in bf16 and fp16, and in FP8 lazy_rescale with
    sums_by_mma (L's accuracy) or scaled_p (e4m3's range) (FP8_ALL_FLAGS). gluon_forward_launch raises it;
    inspect and the A/B runs leave such options out."""
    if options.o_by_tma and not fp8 and head_dim not in O_BY_TMA_HEAD_DIMS:
        return (f"o_by_tma=True needs a head dim in {O_BY_TMA_HEAD_DIMS} in 16-bit, got {head_dim}: O's staging "
                "tiles would not fit in shared memory beside the rings (FP8's fit at every head dim)")
    for name, why in FP8_ONLY.items():
        if getattr(options, name) and not fp8:
            return f"{name}=True is for FP8 calls only: {why}"
    if fp8 and options.scaled_p and options.lazy_rescale:
        return ("scaled_p=True with lazy_rescale=True is refused: a row's kept max already lets P reach 2^8, "
                "and scaled by 2^8 more it would pass e4m3's largest value (448); turn one of them off")
    if fp8 and options.sums_by_mma and options.lazy_rescale:
        return ("sums_by_mma=True with lazy_rescale=True is refused in FP8: the sums of the e4m3 P would carry "
                "the rounding of each row's largest P into L; turn one of them off")
    return None


def options_fit(options: ForwardOptions, head_dim: int, fp8: bool = False) -> bool:
    """Whether the kernel takes `options` at this head dim and precision (why_options_refused)."""
    return why_options_refused(options, head_dim, fp8) is None


# The Triton releases whose Gluon the kernels compile under for sm_90, with the SASS facts tests/test_gluon.py
# checks (kernels/gluon_releases.py names what moved between them), and of those the ones the kernels have
# run on: 3.6 (the H200 machine's) and 3.9 (on an H100: the GPU suite, and the Gluon forward 1.06-1.31x and
# backward 1.09-1.37x the Triton kernels in the same process, docs/performance.md, entry 98). "auto" takes
# the Gluon kernels only on a release they have run on; on the others FLASHTRITON_FORWARD=gluon and
# FLASHTRITON_BACKWARD=gluon take them (docs/hopper.md, "Which Triton"). A newer release is added to
# GLUON_RELEASES once its compile has been checked, to GLUON_RELEASES_RUN once the GPU suite and the races
# have run under it.
GLUON_RELEASES = ("3.6", "3.7", "3.8", "3.9")
GLUON_RELEASES_RUN = ("3.6", "3.9")


def triton_release(version: str) -> str:
    """Triton's release, major.minor, of a version string, e.g. "3.6" of "3.6.0"."""
    return ".".join(version.split(".")[:2])


@functools.cache
def installed_release() -> str:
    """The installed Triton's release (triton_release), read once: gluon_ran asks it on every call's path."""
    import triton

    return triton_release(triton.__version__)


@functools.cache
def gluon_available() -> bool:
    """Whether this Triton has a Gluon the kernels compile under (GLUON_RELEASES). Gluon is experimental and
    its API moves between releases, so a release counts once the kernels' compile under it was checked."""
    if installed_release() not in GLUON_RELEASES:
        return False
    try:
        from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma  # noqa: F401
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    return True


def gluon_ran() -> bool:
    """Whether the Gluon kernels have run on a GPU under this Triton's release (GLUON_RELEASES_RUN): what
    "auto" asks before it takes them."""
    return installed_release() in GLUON_RELEASES_RUN


def tma_readable(x: torch.Tensor) -> bool:
    """Whether a TMA descriptor can read `x` as it is: its last dim contiguous, its start and every other
    dim's stride multiples of 16 bytes."""
    return x.stride(-1) == 1 and x.data_ptr() % 16 == 0 and all(s * x.element_size() % 16 == 0
                                                                 for s in x.stride()[:-1])


def interleaved_keys_map(k: torch.Tensor) -> tuple[int, int, int] | None:
    """Where a 5-D TMA descriptor over k (B, Hkv, Nk, D) finds each (batch, KV head)'s keys in groups of 16, as
    the kernel's (k_groups_b, k_groups_h, k_inner_h): groups per batch, groups per head, and the head's offset
    in the descriptor's last dim; or None where no such descriptor exists. The descriptor's outer dim counts
    16-key groups over all rows, so the rows must follow one another at one stride: the heads one after the
    other along the keys ((B, Hkv, Nk, D) in order), or side by side in each key's row ((B, Nk, Hkv, D) in
    order); and Nk must be a multiple of 16, or a group would straddle two heads or sequences."""
    batch, heads_kv, seqlen_k, head_dim = k.shape
    if seqlen_k % 16 or not tma_readable(k):
        return None
    stride_b, stride_h, stride_n, _ = k.stride()
    groups = seqlen_k // 16
    heads_along_keys = heads_kv == 1 or stride_h == seqlen_k * stride_n
    if heads_along_keys and (batch == 1 or stride_b == heads_kv * seqlen_k * stride_n):
        return heads_kv * groups, groups, 0
    if (heads_kv == 1 or stride_h == head_dim) and (batch == 1 or stride_b == seqlen_k * stride_n):
        return groups, 0, head_dim
    return None


def interleaved_keys_descriptor(k: torch.Tensor, k_map: tuple[int, int, int], block_n: int):
    """The 5-D TMA descriptor that loads a block of k's keys interleaved (the kernel's _copy_block): box
    (block_n / 16, 2, 4, 2, D) over (16-key groups, n, t, j, the last dim), so that shared-memory row
    16h + 8n + 2t + j of a block holds key 16h + 4t + 2n + j; `k_map` from interleaved_keys_map. FP8's P V
    then reads V^T with its keys in their own order (kernels/gluon_masks.py, key_of_column)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    batch, heads_kv, _, head_dim = k.shape
    groups_b, _, inner_h = k_map
    stride_n = k.stride(2)
    box = [block_n // 16, 2, 4, 2, head_dim]
    layout = gl.NVMMASharedLayout.get_default_for(box, gl.float8e4nv)
    return TensorDescriptor(k, [batch * groups_b, 2, 4, 2, heads_kv * head_dim if inner_h else head_dim],
                            [16 * stride_n, 2 * stride_n, 4 * stride_n, stride_n, 1], box, layout)


def keys_contiguous(v: torch.Tensor) -> bool:
    """Whether v (B, Hkv, Nk, D) has its keys contiguous (a transposed view of a (B, Hkv, D, Nk) tensor, say)
    and TMA can read its V^T view as it is: what an FP8 call needs to skip V's copy."""
    return v.stride(2) == 1 and tma_readable(v.transpose(2, 3))


def gluon_forward_supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtypes: tuple = _DTYPES) -> bool:
    """Whether the Gluon forward takes this (B, H, N, D) call with no variant flag: a dtype of `dtypes` (bf16
    or fp16; the FP8 form float8 e4m3, fp8_gluon_supports), D in HEAD_DIMS (FP8: FP8_HEAD_DIMS), at least one
    key, every dim's stride but the last a multiple of 16 bytes and the last 1 (TMA), on an sm_90 GPU (any
    device when only compiled offline)."""
    head_dims = forward_head_dims(q.dtype == torch.float8_e4m3fn)
    if q.dtype not in dtypes or q.dim() != 4 or q.shape[-1] not in head_dims or k.shape[2] == 0:
        return False
    if not all(tma_readable(x) for x in (q, k, v)):
        return False
    if q.device.type == "cuda":
        properties = cuda_properties(q.device.index)
        if (properties.major, properties.minor) != (9, 0):
            return False
    return gluon_available()


FORWARD_PATH_VARIABLE = "FLASHTRITON_FORWARD"
PATHS = ("auto", "triton", "gluon")  # what FLASHTRITON_FORWARD and FLASHTRITON_BACKWARD take
# "auto" takes the Gluon forward where it ran faster than the Triton kernel on the H200: AUTO_MIN_KEYS
# maps (head dim, causal) to the fewest keys. At D = 128, 1.1-1.3x from 1024 keys, causal or not, and
# 1.16x at 512 keys without a mask (0.91x with one; docs/performance.md, entry 55). At
# D = 64 with three warpgroups, without a mask 1.03-1.05x at 2048 and 4096 keys but 0.89x at 1024 (two
# runs through flash_attention with each path forced, entry 81); causal, since the mask compares with
# immediates and with the grids below (entry 84, through the API), 1.03-1.10x at 1024 and 2048 keys,
# 0.98-1.02x at 4096, 1.005-1.06x at 8192 (the Gluon kernel's speed there moves by ~5% between
# processes), and 1.02-1.12x from 16384, one program per tile (entries 72, 81, 84). And only for
# calls with at least AUTO_MIN_WORK = B·Hq·Nq·Nk·D: 2^33 (about 75 µs of GPU time) while only the Triton
# path replayed a recorded launch; since the Gluon launch replays too (entry 67), raced again through the
# API on an H100 (entry 121, two runs): at 2^31, B1 H16 N1024 D128 1.06-1.09x without a mask and 1.15-1.17x
# causal; B1 H8 N2048 D128 causal 1.25x and B1 H16 N2048 D64 causal 1.10x (2^32); at 2^30, B4 H8 N512 D128
# 0.89-0.91x. So 2^31: about 20 µs of GPU work. D = 256 (on an H100
# through the API, entry 98): 1.33x at 512 keys without a mask, 1.40x at 1024 with one, the shortest raced,
# and 1.49-1.64x from there to 16384.
AUTO_MIN_KEYS = {(128, False): 512, (128, True): 1024, (64, False): 2048, (64, True): 1024, (256, False): 512,
                 (256, True): 1024}
AUTO_MIN_WORK = 2 ** 31
# A causal call's grid is persistent up to this many keys, by head dim: at D = 128 in bf16, 1.02-1.08x one
# program per tile from 1024 to 8192 keys and 0.69x at 16384 (entry 55); in FP8, 1.01x at 8192 and 0.66x at
# 16384. At D = 64, 0.91x at 16384 in FP8 (entry 60) and in bf16 0.94x at 8192 (two warpgroups against one
# program per tile with three, entry 84), though a head's K and V take half the bytes or less there. D = 256:
# D = 128's bound in bytes (4 MiB of K and V per head), not measured.
PERSISTENT_CAUSAL_MAX_KEYS = {64: 4096, 128: 8192, 256: 4096}


def path_from_environment(variable: str, what: str) -> str:
    """The path the environment variable `variable` asks for: "auto" (unset), "triton" or "gluon"; `what`
    names it in the error."""
    path = os.environ.get(variable, "auto").strip().lower() or "auto"
    if path not in PATHS:
        raise ValueError(f"{variable}={path!r} is not a {what} path; use one of {PATHS} (or leave it unset "
                         "for auto)")
    return path


def forward_path() -> str:
    """The path FLASHTRITON_FORWARD asks for: "auto" (unset), "triton" or "gluon"."""
    return path_from_environment(FORWARD_PATH_VARIABLE, "forward")


def gluon_tiles(warpgroups: int, block_n: int, overlap: bool = True, pingpong: bool = False,
                stages: int = NUM_STAGES) -> str:
    """What attention_forward_gluon runs with these arguments, for logs: e.g. M64x2-N128-s2-overlap."""
    form = next(name for name, flags in FORMS.items() if flags == (overlap, pingpong))
    return f"M{BLOCK_M}x{warpgroups}-N{block_n}-s{stages}-{form}"


def grid_form(head_dim: int, is_causal: bool, seqlen_k: int, fp8: bool = False, persistent: bool | None = None,
              warpgroups: int | None = None) -> tuple[bool, int]:
    """(persistent, softmax warpgroups) of a launch, each as given or by the rules: persistent, one program
    per SM, unless a causal call's heads are long; causal tiles differ in length, so the programs drift
    apart across heads, and past PERSISTENT_CAUSAL_MAX_KEYS the heads in flight no longer share L2: one
    program per tile then, longest first (docs/performance.md, entries 47, 55 and 60). The warpgroups:
    WARPGROUPS by head dim, or in 16-bit PERSISTENT_CAUSAL_WARPGROUPS on a persistent causal grid."""
    if persistent is None:
        persistent = not is_causal or seqlen_k <= PERSISTENT_CAUSAL_MAX_KEYS[head_dim]
    if warpgroups is None:
        table = PERSISTENT_CAUSAL_WARPGROUPS if is_causal and persistent and not fp8 else WARPGROUPS
        warpgroups = table[head_dim]
    return persistent, warpgroups


def gluon_forward_selected(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> bool:
    """Whether a plain forward of these (B, H, N, D) tensors runs the Gluon kernel (see the module
    docstring; with "auto", only under a Triton release the kernels ran on: gluon_ran). Only on a CUDA
    device: on CPU the interpreter runs the Triton kernels."""
    if q.device.type != "cuda":
        return False
    path = forward_path()
    if path == "triton":
        return False
    batch, heads, seqlen_q, head_dim = q.shape
    # auto's size bounds first: they cost a few multiplications, and most calls they turn away never pay
    # for the stride checks below (this runs on every forward's host path)
    if path == "auto" and not (k.shape[2] >= AUTO_MIN_KEYS.get((head_dim, is_causal), float("inf"))
                               and batch * heads * seqlen_q * k.shape[2] * head_dim >= AUTO_MIN_WORK
                               and gluon_ran()):
        return False
    return gluon_forward_supports(q, k, v)


def gluon_forward_launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                         is_causal: bool, scale: float, overlap: bool = False, pingpong: bool = False,
                         block_n: int | None = None, stages: int = NUM_STAGES, warpgroups: int | None = None,
                         descale: torch.Tensor | None = None, persistent: bool | None = None,
                         seqused_k: torch.Tensor | None = None,
                         options: ForwardOptions | None = None, keys_interleaved: bool = False) -> tuple:
    """(kernel, grid, args, kwargs) of the call that writes o (like q) and lse (B, Hq, Nq) float32: launched
    by attention_forward_gluon, compiled offline by tools/inspect.py. `overlap`: each warpgroup issues a
    block's Q K^T with the previous block's P V (the kernel's OVERLAP); `pingpong` (with overlap): the
    warpgroups take turns on the tensor cores (PINGPONG); `block_n`, `stages` and `warpgroups` (2 or 3): the
    key tile, the ring's depth and the softmax warpgroups per tile (A/B runs; None: BLOCK_N's by head dim,
    grid_form's rule);
    `persistent` forces the grid, one program per SM or one per tile (None: grid_form's rule). FP8
    (q in float8 e4m3): `v` is fp8_values_operand's V^T, (B, Hkv, D, Nk rounded up to 32), and `descale`
    float32 (3, B, Hkv) contiguous holds Q's, K's and V's factors (fp8_forward_gluon prepares both).
    `seqused_k` (B,) int32: each sequence's count of keys on the padded k and v (attention_forward's).
    `options`: ForwardOptions (None: default_options(overlap, fp8); with o_by_tma, O's descriptor sits among the
    descriptors, after V's, else its None is among the scalars). `keys_interleaved` (FP8): `v` is V^T with its
    keys in their own order (a view of V whose keys are contiguous, keys_contiguous), and K is loaded
    interleaved to match (interleaved_keys_descriptor) instead."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from ..kernels.gluon_forward import attn_fwd_gluon_kernel, attn_fwd_gluon_kernel_any_keys

    batch, heads, seqlen_q, head_dim = q.shape
    seqlen_k = k.shape[2]
    fp8 = q.dtype == torch.float8_e4m3fn
    if head_dim not in forward_head_dims(fp8):
        raise ValueError(f"the Gluon forward takes head dims {forward_head_dims(fp8)}"
                         f"{' in FP8' if fp8 else ''}, got {head_dim}; the Triton kernels take the others")
    persistent, warpgroups = grid_form(head_dim, is_causal, seqlen_k, fp8, persistent, warpgroups)
    block_n = BLOCK_N[head_dim] if block_n is None else block_n
    options = default_options(overlap, fp8) if options is None else options
    elements = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float8_e4m3fn: gl.float8e4nv}

    def descriptor(x: torch.Tensor, rows: int, cols: int = head_dim):
        box = [1, 1, rows, cols]
        layout = gl.NVMMASharedLayout.get_default_for(box, elements[x.dtype])
        return TensorDescriptor.from_tensor(x, box, layout)
    refused = why_options_refused(options, head_dim, fp8)
    if refused is not None:
        raise ValueError(refused)
    if fp8 and (descale is None or v.shape[2] != head_dim):
        raise ValueError("an FP8 call takes V transposed, (B, Hkv, D, Nk), and descale factors "
                         "(fp8_forward_gluon prepares both)")
    k_map = (0, 0, 0)
    if keys_interleaved:
        k_map = interleaved_keys_map(k) if fp8 and seqused_k is None else None
        if k_map is None:
            raise ValueError("keys_interleaved=True takes an FP8 call without seqused_k, and k whose "
                             "rows follow one another at one stride with Nk a multiple of 16 (interleaved_keys_map), "
                             f"got k of shape {tuple(k.shape)} and strides {k.stride()}")
    for name, why in OVERLAP_ONLY.items():
        if getattr(options, name) and not overlap:
            raise ValueError(f"{name}=True needs overlap=True: {why}")
    if pingpong and not overlap:
        raise ValueError("pingpong=True needs overlap=True: the turns are taken around the overlapped products")
    if warpgroups not in REGISTERS:
        raise ValueError(f"warpgroups must be one of {tuple(REGISTERS)} (softmax warpgroups per tile), "
                         f"got {warpgroups}")
    max_registers, softmax_registers = REGISTERS[warpgroups]
    num_m_blocks = cdiv(seqlen_q, warpgroups * BLOCK_M)
    num_tiles = batch * heads * num_m_blocks
    # (persistent: one program per SM, the registers admitting one, each looping over tiles; grid_form)
    programs = min(num_tiles, sm_count(q)) if persistent else num_tiles
    k_desc = interleaved_keys_descriptor(k, k_map, block_n) if keys_interleaved else descriptor(k, block_n)
    args = (o, lse, descale, seqused_k, descriptor(q, BLOCK_M), k_desc,
            descriptor(v, head_dim, block_n) if fp8 else descriptor(v, block_n),
            descriptor(o, BLOCK_M) if options.o_by_tma else None, o.stride(0), o.stride(1), o.stride(2), heads,
            heads // k.shape[1], seqlen_q, seqlen_k, num_m_blocks, num_tiles, cdiv(num_tiles, programs), *k_map,
            scale * LOG2E, warpgroups, stages, is_causal, overlap, pingpong, softmax_registers, fp8,
            *kernel_flags(options))
    grid = (programs, )
    # (at Nk = 1 the kernel not specialised on it, whose FP8 P ptxas packs right: kernels/gluon_forward.py)
    kernel = attn_fwd_gluon_kernel_any_keys if seqlen_k == 1 else attn_fwd_gluon_kernel
    return kernel, grid, args, dict(num_warps=4, maxnreg=max_registers, **COMPILE_OPTIONS)


def attention_forward_gluon(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: float,
                            overlap: bool = True, pingpong: bool = False, block_n: int | None = None,
                            stages: int = NUM_STAGES, warpgroups: int | None = None,
                            seqused_k: torch.Tensor | None = None,
                            options: ForwardOptions | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """o like q, and lse (B, Hq, Nq) float32, through the Gluon kernel; the caller checked
    gluon_forward_supports. The default form, overlapped without ping-pong, was the fastest of the three
    on the H200 (docs/performance.md, "The Gluon forward"). `seqused_k`: as attention_forward's;
    `options`: as gluon_forward_launch's. A call
    like an earlier one (equal plan key: replay.py) replays that call's launch instead of going through
    Triton's launch path and building its arguments again; what ran is last_choice("forward")."""
    from .forward import empty_in_order

    options = default_options(overlap) if options is None else options
    o = empty_in_order(q)
    lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
    if o.numel() == 0:
        return o, lse
    tensors = {"gluon_fwd": _per_call(q, k, v, o, lse, None, seqused_k, options)}
    key = None
    if replay.replayable(q.device):
        device, stream = replay.current_device_and_stream()
        key = replay.plan_key(device, (q, k, v, seqused_k), "gluon", is_causal, scale, overlap, pingpong, block_n,
                              stages, warpgroups, options)
        if replay_recorded("forward", key, tensors, stream):
            return o, lse
    # (resolved here, so that the launch and the log name the same count and key block)
    warpgroups = grid_form(q.shape[-1], is_causal, k.shape[2], warpgroups=warpgroups)[1]
    block_n = BLOCK_N[q.shape[-1]] if block_n is None else block_n
    launch = gluon_forward_launch(q, k, v, o, lse, is_causal, scale, overlap, pingpong, block_n, stages, warpgroups,
                                  seqused_k=seqused_k, options=options)
    tiles = "gluon-" + gluon_tiles(warpgroups, block_n, overlap, pingpong, stages) + options.suffix()
    run("forward", key, [_kernel_spec(launch, tensors["gluon_fwd"], tiles)], ("gluon_fwd", ))
    return o, lse


def _per_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
              descale: torch.Tensor | None, seqused_k: torch.Tensor | None, options: ForwardOptions) -> tuple:
    """The kernel's per-call arguments, as its launch (gluon_forward_launch) takes them first and a replay
    passes them: (its tensors, the sources of its descriptors); without o_by_tma O's descriptor is a None
    among the recorded scalars."""
    return (o, lse, descale, seqused_k), ((q, k, v, o) if options.o_by_tma else (q, k, v))


def _kernel_spec(launch: tuple, per_call: tuple, tiles: str) -> LaunchSpec:
    """gluon_forward_launch's (kernel, grid, args, kwargs) as the runner's launch: its args split into the
    per-call tensors, the descriptors (one per source in `per_call`, _per_call's) and the recorded rest."""
    kernel, grid, args, kwargs = launch
    tensors, descriptors = len(per_call[0]), len(per_call[0]) + len(per_call[1])
    return LaunchSpec("gluon_fwd", kernel, lambda meta: grid, args[:tensors], args[tensors:descriptors],
                      args[descriptors:], {}, kwargs, tiles)


FP8_VALUES_TILE = (128, 64)  # fp8_values_kernel's (keys, dims) per program


def fp8_gluon_selected(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether flash_attention_fp8 runs this call on the Gluon kernel: on a CUDA device, unless
    FLASHTRITON_FORWARD=triton (or it is auto under a Triton release the kernels have not run on, gluon_ran,
    or at a head dim the FP8 form has not run at, FP8_AUTO_HEAD_DIMS), where gluon_forward_supports'
    conditions hold for float8 e4m3 (V's layout does not matter: it is copied). Else flash_attention runs
    (api.py, _fp8_without_its_kernel)."""
    path = forward_path()
    if q.device.type != "cuda" or path == "triton":
        return False
    if path == "auto" and not (gluon_ran() and q.shape[-1] in FP8_AUTO_HEAD_DIMS):
        return False
    return gluon_forward_supports(q, k, k, dtypes=(torch.float8_e4m3fn, ))


def fp8_values_operand(v: torch.Tensor) -> torch.Tensor:
    """V (B, Hkv, Nk, D) as the FP8 kernel reads it: transposed, (B, Hkv, D, Nk rounded up to 32), keys
    padded with zeros (the kernel masks their probabilities) and relabeled in every 32 as the kernel
    relabels P's (kernels/gluon_forward.py, _probabilities_operand): column 16h + 4t + 2n + j holds key
    16h + 8n + 2t + j. wgmma takes 8-bit operands only with the reduced dim contiguous, and P V reduces
    over the keys. One pass of D x Nk bytes per KV head (fp8_values_kernel)."""
    vt, spec = _fp8_values_spec(v)
    if vt.numel():
        run("fp8_values", None, [spec], ())
    return vt.view(v.dtype)


def _fp8_values_spec(v: torch.Tensor) -> tuple[torch.Tensor, LaunchSpec]:
    """fp8_values_operand's buffer (bytes, uninitialised) and the launch that fills it."""
    batch, heads_kv, seqlen_k, head_dim = v.shape
    padded_k = cdiv(seqlen_k, 32) * 32
    vt = torch.empty(batch, heads_kv, head_dim, padded_k, device=v.device, dtype=torch.uint8)
    grid = (batch * heads_kv, cdiv(padded_k, FP8_VALUES_TILE[0]), cdiv(head_dim, FP8_VALUES_TILE[1]))
    spec = LaunchSpec("fp8_values", fp8_values_kernel, lambda meta: grid, (v.view(torch.uint8), vt), (),
                      (*v.stride(), heads_kv, seqlen_k, padded_k, head_dim, *FP8_VALUES_TILE), {}, {})
    return vt, spec


def fp8_forward_gluon(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: float,
                      descale: torch.Tensor, out_dtype: torch.dtype,
                      options: ForwardOptions | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The FP8 forward on the Gluon kernel: q, k, v float8 e4m3 (B, H, N, D) (gluon_forward_supports' layout
    conditions for q and k), `descale` float32 (3, B, Hkv) (Q's, K's and V's factors); returns o like q in
    `out_dtype` and lse (B, Hq, Nq) float32. `options`: as gluon_forward_launch's (None: FP8_DEFAULT_OPTIONS).
    V is copied into the kernel's layout first (fp8_values_operand), unless its keys are contiguous and K's
    layout lets the kernel load K interleaved (keys_contiguous, interleaved_keys_map): then V is read as it is,
    FlashAttention-3's column-major V. A call like an earlier one (equal plan key: replay.py) replays that
    call's launches, V's copy included, as attention_forward_gluon does: building the descriptors and going
    through Triton's launch path took more host time than a causal call at 4096 keys takes on the GPU
    (docs/performance.md, entry 128)."""
    from .forward import empty_in_order

    options = FP8_DEFAULT_OPTIONS if options is None else options
    keys_interleaved = keys_contiguous(v) and interleaved_keys_map(k) is not None
    o = empty_in_order(q, dtype=out_dtype)
    lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
    if o.numel() == 0:
        return o, lse
    if keys_interleaved:
        vt, specs = v.transpose(2, 3), []
    else:  # (the copy's launch first, in the plan too)
        vt_bytes, copy = _fp8_values_spec(v)
        vt, specs = vt_bytes.view(v.dtype), [copy]
    tensors = {spec.name: (spec.tensors, ()) for spec in specs}
    tensors["gluon_fwd"] = _per_call(q, k, vt, o, lse, descale, None, options)
    key = None
    if replay.replayable(q.device):
        device, stream = replay.current_device_and_stream()
        key = replay.plan_key(device, (q, k, v, descale), "gluon-fp8", is_causal, scale, out_dtype, options)
        if replay_recorded("forward", key, tensors, stream):
            return o, lse
    # (resolved here, so that the launch and the log name the same count)
    warpgroups = grid_form(q.shape[-1], is_causal, k.shape[2], fp8=True)[1]
    launch = gluon_forward_launch(q, k, vt, o, lse, is_causal, scale, overlap=True, warpgroups=warpgroups,
                                  descale=descale, options=options, keys_interleaved=keys_interleaved)
    tiles = "gluon-fp8-" + gluon_tiles(warpgroups, BLOCK_N[q.shape[-1]]) + options.suffix()
    run("forward", key, [*specs, _kernel_spec(launch, tensors["gluon_fwd"], tiles)], ("gluon_fwd", ))
    return o, lse
