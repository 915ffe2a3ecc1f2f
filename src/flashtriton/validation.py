"""Argument checks shared by the public entry points. Each error names the argument, the value and the fix."""

from __future__ import annotations

import math
import numbers
import weakref

import torch

from . import _interpreter
from .cache import CACHE

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256
MAX_GRID_YZ = 65535  # CUDA's limit on a grid's 2nd and 3rd dims, which carry heads and batch


def check_window(window_size: object) -> tuple[int, int]:
    """`window_size` as a (left, right) pair of ints, each -1 (unbounded) or >= 0."""
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(isinstance(w, int) and not isinstance(w, bool) for w in window_size)):
        raise TypeError(f"window_size must be a pair of ints (left, right), got {window_size!r}; "
                        "use -1 for an unbounded side, e.g. (256, 0) for 256 keys back and none ahead")
    left, right = window_size
    if left < -1 or right < -1:
        raise ValueError(f"window_size {tuple(window_size)} has a side below -1; each side is a count of keys "
                         ">= 0, or -1 for unbounded")
    return left, right


def check_flags(**flags: object) -> None:
    """Every keyword a bool (is_causal, return_lse, ...)."""
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")


def check_softcap(softcap: object) -> float:
    """`softcap` as a float: 0 (off) or a finite positive cap."""
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"softcap must be a number, got {softcap!r}; 0.0 turns it off")
    if not (math.isfinite(softcap) and softcap >= 0):
        raise ValueError(f"softcap must be 0 (off) or a finite positive cap, got {softcap}")
    return float(softcap)


def check_dropout(dropout_p: object) -> float:
    """`dropout_p` as a float in [0, 1)."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p must be a number in [0, 1), got {dropout_p!r}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}; 0.0 turns dropout off")
    return float(dropout_p)


def check_alibi_slopes(alibi_slopes: object, q: torch.Tensor, batch: int | None = None) -> torch.Tensor:
    """ALiBi slopes: float32, on q's device, shape (Hq,) or (B, Hq) for q (B, Hq, Nq, D) (or, with
    `batch` given, for a packed q (total, Hq, D) of `batch` sequences); returned with a contiguous last dim."""
    packed = batch is not None
    if packed:
        heads = q.shape[1]
    else:
        batch, heads = q.shape[0], q.shape[-3] if q.dim() >= 3 else 1
    if not isinstance(alibi_slopes, torch.Tensor):
        raise TypeError(f"alibi_slopes must be a torch.Tensor of shape ({heads},) or ({batch}, {heads}), "
                        f"got {type(alibi_slopes).__name__}")
    if alibi_slopes.dtype != torch.float32:
        raise TypeError(f"alibi_slopes must be float32, got {alibi_slopes.dtype}; convert with "
                        "alibi_slopes.float()")
    if alibi_slopes.device != q.device:
        raise ValueError(f"alibi_slopes is on {alibi_slopes.device} but q is on {q.device}")
    if (q.dim() != 4 and not packed) or tuple(alibi_slopes.shape) not in ((heads,), (batch, heads)):
        layout = "(total, Hq, D) holding that many sequences" if packed else "(B, Hq, Nq, D)"
        raise ValueError(f"alibi_slopes must have shape ({heads},) or ({batch}, {heads}) for q of shape "
                         f"{tuple(q.shape)} {layout}, got {tuple(alibi_slopes.shape)}")
    return alibi_slopes if alibi_slopes.stride(-1) == 1 else alibi_slopes.contiguous()


def check_inputs(q: object, k: object, v: object, *, is_causal: object, kernels: bool = True) -> None:
    """Validate q (..., Nq, D), k and v (..., Nk, D).

    Leading dims must match, except that for inputs of rank >= 4 dim -3 is the head dim and q may have
    a multiple of k's heads (grouped-query attention). `kernels=False` (the PyTorch implementations)
    skips what only the Triton kernels need: a CUDA device, the head-dim and grid limits.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() < 2:
            raise ValueError(f"{name} must have at least 2 dims (..., seqlen, head_dim), got shape {tuple(x.shape)}")
    check_flags(is_causal=is_causal)
    if not (q.dim() == k.dim() == v.dim()):
        raise ValueError(f"q, k and v must have the same number of dims, got shapes "
                         f"{tuple(q.shape)}, {tuple(k.shape)} and {tuple(v.shape)}")

    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"q has dtype {q.dtype}; supported are float16, bfloat16 and float32: "
                        f"convert it with q.to(torch.bfloat16)")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {x.dtype} but q has {q.dtype}; convert with {name}.to(q.dtype)")

    for name, x in (("k", k), ("v", v)):
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device} but q is on {q.device}; put q, k and v on one device")
    if kernels and q.device.type != "cuda" and _interpreter.switched_on_after_import():
        raise RuntimeError(
            "TRITON_INTERPRET=1 was set after flashtriton was imported; Triton reads it when the kernels are "
            "defined, at import: set it before the first `import flashtriton` (e.g. in the shell)")
    if kernels and q.device.type != "cuda" and not _interpreter.is_active():
        raise ValueError(
            f"q, k and v are on {q.device}, but the kernels run on CUDA GPUs; move them with .cuda(), or set "
            "TRITON_INTERPRET=1 before importing flashtriton to run the kernels through Triton's interpreter")

    head_dim = q.shape[-1]
    if k.shape[-1] != head_dim or v.shape[-1] != head_dim:
        raise ValueError(f"head dims differ: q {q.shape[-1]}, k {k.shape[-1]}, v {v.shape[-1]}; "
                         "q, k and v need the same last dim")
    if kernels and not 1 <= head_dim <= MAX_HEAD_DIM:
        raise NotImplementedError(f"head_dim {head_dim} is not supported; it must be between 1 and {MAX_HEAD_DIM}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")

    if q.dim() >= 4:
        if q.shape[:-3] != k.shape[:-3]:
            raise ValueError(f"batch dims differ: q {tuple(q.shape[:-3])} vs k {tuple(k.shape[:-3])}")
        heads_q, heads_kv = q.shape[-3], k.shape[-3]
        if heads_kv == 0 or heads_q % heads_kv != 0:
            raise ValueError(
                f"q has {heads_q} heads and k/v have {heads_kv}; the query heads must be a multiple of the "
                "key/value heads (equal for plain attention, a multiple for grouped-query attention)")
    elif q.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"leading dims differ: q {tuple(q.shape[:-2])} vs k {tuple(k.shape[:-2])}")

    if not kernels:
        return
    heads = q.shape[-3] if q.dim() >= 4 else 1
    batch = math.prod(q.shape[:-3]) if q.dim() >= 4 else math.prod(q.shape[:-2])
    for name, value in (("heads", heads), ("batch (the product of the leading dims)", batch)):
        if value > MAX_GRID_YZ:
            raise ValueError(f"q has {value} {name}; the kernels launch at most {MAX_GRID_YZ}: "
                             "split the call into chunks along that dim")


def check_scale(scale: object, head_dim: int) -> float:
    """The softmax scale as a float: 1/sqrt(head_dim) when None, else a finite positive number."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a float or None, got {scale!r}")
    scale = float(scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be finite and positive, got {scale}; leave it None for 1/sqrt(head_dim)")
    return scale


def last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    """The kernels need unit stride along head_dim (any other strides are fine); copy once if not."""
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()


def _host_values(cu: torch.Tensor) -> list[int]:
    """cu.tolist(), remembered for as long as this very tensor lives unmodified (its version counter
    counts in-place writes). Reading device memory back waits for the GPU, so without this every eager
    call would stall the stream; with it a batch's cu_seqlens is read once, by its forward. Kept in the
    cache (cache.py) by id(tensor): (weak reference, version, values)."""
    remembered = CACHE.host_values
    seen = remembered.get(id(cu))
    if seen is not None and seen[0]() is cu and seen[1] == cu._version:
        return seen[2]
    values = cu.tolist()
    if len(remembered) > 64:  # drop entries whose tensors are gone
        for key in [key for key, (ref, _, _) in remembered.items() if ref() is None]:
            del remembered[key]
    remembered[id(cu)] = (weakref.ref(cu), cu._version, values)
    return values


def check_varlen(q: object, k: object, v: object, cu_seqlens_q: object, cu_seqlens_k: object,
                 max_seqlen_q: object, max_seqlen_k: object, *, is_causal: object) -> None:
    """Validate a packed batch: q (total_q, Hq, D), k and v (total_k, Hkv, D), cumulative lengths int32
    (batch + 1,) that start at 0, never decrease and end at the totals, and maximum lengths at least the
    longest sequence. Reads the lengths back to the host (one small copy each), except while a CUDA graph
    is being captured or torch.compile traces the call, where a copy to the host is not allowed: there
    only their type, shape and device are checked, and the values are the caller's responsibility."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 3:
            raise ValueError(f"{name} must have 3 dims (total_tokens, heads, head_dim) in a packed batch, got "
                             f"shape {tuple(x.shape)}")
    # the rest of the per-tensor checks, on the (1, H, total, D) views the kernels read
    check_inputs(*(x.permute(1, 0, 2)[None] for x in (q, k, v)), is_causal=is_causal)
    # Neither a CUDA graph capture nor torch.compile's trace can read tensor values back to the host.
    capturing = torch.compiler.is_compiling() or (q.device.type == "cuda" and torch.cuda.is_current_stream_capturing())
    lengths = {}
    for name, cu, total in (("cu_seqlens_q", cu_seqlens_q, q.shape[0]), ("cu_seqlens_k", cu_seqlens_k, k.shape[0])):
        if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or len(cu) < 1:
            raise TypeError(f"{name} must be a 1-D int32 tensor of batch + 1 cumulative lengths, got "
                            f"{cu.dtype if isinstance(cu, torch.Tensor) else type(cu).__name__} "
                            f"{tuple(cu.shape) if isinstance(cu, torch.Tensor) else ''}; e.g. "
                            "torch.tensor([0, 5, 12], dtype=torch.int32, device=q.device)")
        if cu.device != q.device:
            raise ValueError(f"{name} is on {cu.device} but q is on {q.device}")
        if capturing:
            lengths[name] = []
            continue
        host = _host_values(cu)
        if host[0] != 0 or host[-1] != total or any(b < a for a, b in zip(host, host[1:], strict=False)):
            raise ValueError(f"{name} must start at 0, never decrease and end at {total} (the packed length), "
                             f"got {host[:8]}{' ...' if len(host) > 8 else ''}")
        lengths[name] = [b - a for a, b in zip(host, host[1:], strict=False)]
    if len(cu_seqlens_q) != len(cu_seqlens_k):
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k describe {len(cu_seqlens_q) - 1} and "
                         f"{len(cu_seqlens_k) - 1} sequences; they must describe the same batch")
    for name, given, key in (("max_seqlen_q", max_seqlen_q, "cu_seqlens_q"),
                             ("max_seqlen_k", max_seqlen_k, "cu_seqlens_k")):
        longest = max(lengths[key], default=0)
        if isinstance(given, bool) or not isinstance(given, numbers.Integral) or given < longest:
            raise ValueError(f"{name} must be an int >= the longest sequence ({longest}), got {given!r}")
