"""Argument checks shared by the public entry points. Each error names the argument, the value and the fix."""

from __future__ import annotations

import math
import numbers
import weakref

import torch

from . import _interpreter
from .cache import CACHE, remember

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


def check_inputs(q: object, k: object, v: object, *, is_causal: object, kernels: bool = True,
                 fp8: bool = False, kv_fp8: bool = False) -> None:
    """Validate q (..., Nq, D), k and v (..., Nk, D).

    Leading dims must match, except that for inputs of rank >= 4 dim -3 is the head dim and q may have
    a multiple of k's heads (grouped-query attention). `kernels=False` (the PyTorch implementations)
    skips what only the Triton kernels need: a CUDA device, the head-dim and grid limits. `fp8`: the
    inputs of flash_attention_fp8, float8 e4m3 instead of SUPPORTED_DTYPES; `kv_fp8`: k and v alone in
    float8 e4m3 (an FP8 KV cache), q in SUPPORTED_DTYPES.
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

    if fp8 and q.dtype != torch.float8_e4m3fn:
        raise TypeError(f"q has dtype {q.dtype}; flash_attention_fp8 takes torch.float8_e4m3fn (quantize with "
                        "(q / q_scale).to(torch.float8_e4m3fn) and pass q_descale=q_scale), or call flash_attention")
    if not fp8 and q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"q has dtype {q.dtype}; supported are float16, bfloat16 and float32: "
                        f"convert it with q.to(torch.bfloat16)")
    for name, x in (("k", k), ("v", v)):
        if kv_fp8 and x.dtype != torch.float8_e4m3fn:
            raise TypeError(f"{name} has dtype {x.dtype}; an FP8 cache holds torch.float8_e4m3fn in both k_cache and "
                            "v_cache")
        if not kv_fp8 and x.dtype != q.dtype:
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


def host_reads_forbidden(device: torch.device) -> bool:
    """Whether a tensor's values may not be read back to the host here: while torch.compile traces the call
    or a CUDA graph is being captured. Tracing is asked first: Dynamo does not trace the capture query."""
    return torch.compiler.is_compiling() or (device.type == "cuda" and torch.cuda.is_current_stream_capturing())


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
    capturing = host_reads_forbidden(q.device)
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


def _check_index_tensor(name: str, x: object, dims: int, q: torch.Tensor, shape_hint: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.int32 or x.dim() != dims:
        got = f"{x.dtype} of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"{name} must be an int32 tensor {shape_hint}, got {got}; convert it with "
                        f"{name}.to(torch.int32)")
    if x.device != q.device:
        raise ValueError(f"{name} is on {x.device} but q is on {q.device}; put it on q's device")
    if x.shape[0] != q.shape[0]:
        raise ValueError(f"{name} has {x.shape[0]} rows but q has batch {q.shape[0]}; it needs one per sequence")


def _checked_before(tensors: tuple[torch.Tensor, ...], sizes: tuple) -> tuple[bool, tuple, tuple]:
    """(whether check_kvcache passed these very tensors, unmodified since (their version counters), with
    these sizes; the key and state that _remember_checked records once they pass). A decode loop that
    keeps its block table and advances its lengths in place then reads them back only when they change."""
    key = tuple(map(id, tensors))
    state = (tuple([t._version for t in tensors]), sizes)
    seen = CACHE.checked.get(key)
    same = seen is not None and seen[1] == state
    if same:
        for ref, tensor in zip(seen[0], tensors, strict=True):
            same = same and ref() is tensor
    return same, key, state


def _remember_checked(tensors: tuple[torch.Tensor, ...], key: tuple, state: tuple) -> None:
    remember(CACHE.checked, key, (tuple(weakref.ref(t) for t in tensors), state))


def mark_kvcache_checked(cache_seqlens: torch.Tensor | None, k_cache: torch.Tensor,
                         cache_leftpad: torch.Tensor | None = None) -> None:
    """Record lengths (int32 (B,)) that their caller built in [0, k_cache's positions] for a contiguous
    cache with one row per sequence, no appended keys and no other index tensors (but left padding
    `cache_leftpad`, int32 (B,) within those lengths, if given; None lengths: an int length, the whole
    cache), as if check_kvcache had read and passed them: a call with these very tensors, unmodified,
    skips the read back to the host (a wait for the GPU) that its check would cost."""
    tensors = tuple([x for x in (cache_seqlens, cache_leftpad) if x is not None])
    _remember_checked(tensors, *_checked_before(tensors, (0, k_cache.shape[2], k_cache.shape[0]))[1:])


def check_kvcache(q: object, k_cache: object, v_cache: object, cache_seqlens: object, k: object, v: object,
                  block_table: object, cache_batch_idx: object, cache_leftpad: object, *, is_causal: object,
                  k_descale: object = None, v_descale: object = None) -> None:
    """Validate a call against a KV cache, in flashtriton's layout: q (B, Hq, Nq, D); the caches
    (B_cache, Hkv, Nmax, D), or with `block_table` (B, max_blocks) int32 paged (num_blocks, Hkv,
    block_size, D), in q's dtype or float8 e4m3 (then with `k_descale` and `v_descale` as check_descale
    takes them); `cache_seqlens` an int or int32 (B,); new k, v (B, Hkv, N_new, D) in q's dtype or both
    None; `cache_batch_idx` and `cache_leftpad` int32 (B,) or None. Then the index tensors' values, as
    check_kvcache_values."""
    _check_kvcache_layout(q, k_cache, v_cache, cache_seqlens, k, v, block_table, cache_batch_idx, cache_leftpad,
                          is_causal)
    if k_cache.dtype == torch.float8_e4m3fn:
        for name, descale in (("k_descale", k_descale), ("v_descale", v_descale)):
            check_descale(name, descale, q, k_cache.shape[1])
    elif k_descale is not None or v_descale is not None:
        raise ValueError(f"k_descale and v_descale are an FP8 cache's factors (torch.float8_e4m3fn); this cache is "
                         f"{k_cache.dtype}: leave them None")
    check_kvcache_values(q, k_cache, cache_seqlens, k, block_table, cache_batch_idx, cache_leftpad)


def check_kvcache_values(q: torch.Tensor, k_cache: torch.Tensor, cache_seqlens: torch.Tensor | int,
                         k: torch.Tensor | None, block_table: torch.Tensor | None,
                         cache_batch_idx: torch.Tensor | None, cache_leftpad: torch.Tensor | None) -> None:
    """The values of a KV-cache call's index tensors, whose layouts passed check_kvcache: lengths that fit
    the cache with the appended keys, block and cache indices in range, left padding within the length.
    They are read back to the host (a copy that waits for the GPU) once for as long as these very tensors
    live unmodified, and not at all while a CUDA graph is captured or torch.compile traces: there they
    are the caller's responsibility."""
    index_tensors = tuple([x for x in (cache_seqlens, cache_leftpad, cache_batch_idx, block_table)
                           if isinstance(x, torch.Tensor)])
    if not index_tensors or torch.compiler.is_compiling():
        return
    batch, new = q.shape[0], 0 if k is None else k.shape[2]
    capacity = k_cache.shape[2] if block_table is None else block_table.shape[1] * k_cache.shape[2]
    same, key, state = _checked_before(index_tensors, (new, capacity, k_cache.shape[0]))
    if same or (q.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        return
    # One copy to the host for every value check.
    lengths = (cache_seqlens if isinstance(cache_seqlens, torch.Tensor)
               else torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device))
    checks = [lengths.min(), lengths.max()]
    if cache_leftpad is not None:
        checks += [cache_leftpad.min(), (cache_leftpad - lengths - new).max()]
    if cache_batch_idx is not None:
        checks += [cache_batch_idx.min(), cache_batch_idx.max()]
    if block_table is not None:
        used = (torch.arange(block_table.shape[1], device=q.device)[None, :] * k_cache.shape[2]
                < (lengths + new)[:, None])
        checks += [torch.where(used, block_table, 0).min(), torch.where(used, block_table, 0).max()]
    values = torch.stack([c.to(torch.int64) for c in checks]).tolist()
    if values[0] < 0 or values[1] > capacity - new:
        raise ValueError(f"cache_seqlens must be in [0, {capacity - new}] (the cache's {capacity} positions less the "
                         f"{new} appended), got values from {values[0]} to {values[1]}")
    rest = iter(values[2:])
    if cache_leftpad is not None:
        low, over = next(rest), next(rest)
        if low < 0 or over > 0:
            where = "below 0" if low < 0 else "past its length"
            raise ValueError("cache_leftpad must be in [0, cache_seqlens + new tokens] for every sequence (the "
                             f"first cached key each one uses), got a value {where}")
    if cache_batch_idx is not None:
        low, high = next(rest), next(rest)
        if low < 0 or high >= k_cache.shape[0]:
            raise ValueError(f"cache_batch_idx must index rows of k_cache, in [0, {k_cache.shape[0] - 1}], got values "
                             f"from {low} to {high}")
    if block_table is not None:
        low, high = next(rest), next(rest)
        if low < 0 or high >= k_cache.shape[0]:
            raise ValueError(f"block_table's entries for the blocks in use must index k_cache's {k_cache.shape[0]} "
                             f"blocks, in [0, {k_cache.shape[0] - 1}], got values from {low} to {high}")
    _remember_checked(index_tensors, key, state)


def _check_kvcache_layout(q: object, k_cache: object, v_cache: object, cache_seqlens: object, k: object, v: object,
                          block_table: object, cache_batch_idx: object, cache_leftpad: object,
                          is_causal: object) -> None:
    """check_kvcache's checks of types, shapes, dtypes and devices, and of an int cache_seqlens against
    the cache: everything but the index tensors' values."""
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must have 4 dims, got shape {tuple(x.shape)}: q (batch, heads, seqlen_q, "
                             "head_dim), the caches (batch_cache, heads_kv, max_seqlen, head_dim), or paged "
                             "(num_blocks, heads_kv, block_size, head_dim)")
    _check_same_cache_shape(k_cache, v_cache)
    # dtypes, devices, head dims, GQA: as for a call on q and one cache row per sequence (the cache itself
    # when it has one row per sequence: the views cost microseconds on every decoding step)
    rows = ((k_cache, v_cache) if k_cache.shape[0] == q.shape[0] else
            tuple(x[:1].expand(q.shape[0], -1, -1, -1) for x in (k_cache, v_cache)))
    fp8 = torch.float8_e4m3fn in (k_cache.dtype, v_cache.dtype)
    check_inputs(q, *rows, is_causal=is_causal, kv_fp8=fp8)
    if (k is None) != (v is None):
        raise ValueError("k and v (the new keys and values to append) must be given together, or both be None")
    new = 0
    if k is not None:
        for name, x in (("k", k), ("v", v)):
            expected = (q.shape[0], k_cache.shape[1], x.shape[2] if isinstance(x, torch.Tensor) else 0, q.shape[3])
            if not isinstance(x, torch.Tensor) or x.dim() != 4 or tuple(x.shape) != expected:
                got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"{name} (new entries to append) must be (batch, heads_kv, new_tokens, head_dim) = "
                                 f"{expected[:2]} + (N_new, {expected[3]}), got {got}")
            if fp8 and x.dtype != q.dtype:
                raise TypeError(f"{name} is {x.dtype}, but new entries for an FP8 cache come in q's dtype "
                                f"({q.dtype}) and are quantized as they are written; convert it with "
                                f"{name}.to(q.dtype)")
            if (not fp8 and x.dtype != k_cache.dtype) or x.device != k_cache.device:
                raise TypeError(f"{name} is {x.dtype} on {x.device} but the cache is {k_cache.dtype} on "
                                f"{k_cache.device}; convert it with {name}.to(k_cache)")
        if k.shape != v.shape:
            raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
        new = k.shape[2]
    batch = q.shape[0]
    if block_table is not None:
        _check_index_tensor("block_table", block_table, 2, q, "(batch, max_blocks_per_sequence)")
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx selects rows of a contiguous cache; with block_table (a paged cache) "
                             "each sequence's blocks already say where it lives: pass one of the two")
        if cache_leftpad is not None:
            raise NotImplementedError("cache_leftpad with a paged cache (block_table) is not supported: start each "
                                      "sequence at its first block instead")
        capacity = block_table.shape[1] * k_cache.shape[2]
    else:
        capacity = k_cache.shape[2]
        if cache_batch_idx is not None:
            _check_index_tensor("cache_batch_idx", cache_batch_idx, 1, q, "(batch,)")
        elif k_cache.shape[0] != batch:
            raise ValueError(f"k_cache holds {k_cache.shape[0]} sequences but q has batch {batch}; pass "
                             "cache_batch_idx (int32 (batch,)) to say which cache row each sequence uses")
    if cache_leftpad is not None:
        _check_index_tensor("cache_leftpad", cache_leftpad, 1, q, "(batch,)")
    if isinstance(cache_seqlens, torch.Tensor):
        _check_index_tensor("cache_seqlens", cache_seqlens, 1, q, "(batch,)")
    elif isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, numbers.Integral):
        raise TypeError(f"cache_seqlens must be an int or an int32 tensor (batch,), got {cache_seqlens!r}")
    else:
        _check_int_length(cache_seqlens, new, capacity)


def _check_same_cache_shape(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")


def _check_int_length(cache_seqlens: int, new: int, capacity: int) -> None:
    if not 0 <= cache_seqlens <= capacity - new:
        raise ValueError(f"cache_seqlens {cache_seqlens} plus {new} appended tokens does not fit the cache's "
                         f"{capacity} positions; it must be in [0, {capacity - new}]")


def check_grown_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        cache_seqlens: torch.Tensor | int, k: torch.Tensor | None, cache_batch_idx: torch.Tensor | None,
                        cache_leftpad: torch.Tensor | None) -> None:
    """check_kvcache for a call on a contiguous cache that differs from one that passed it only in the
    cache's length (dim 2), the strides that length sets, and an int cache_seqlens' value: a decoding
    loop whose cache grows every step (transformers' DynamicCache). Of the layout checks only those
    depend on these (K and V of one length, an int length that fits); then the index values."""
    _check_same_cache_shape(k_cache, v_cache)
    if not isinstance(cache_seqlens, torch.Tensor):
        _check_int_length(cache_seqlens, 0 if k is None else k.shape[2], k_cache.shape[2])
    check_kvcache_values(q, k_cache, cache_seqlens, k, None, cache_batch_idx, cache_leftpad)


FP8_OUT_DTYPES = (torch.bfloat16, torch.float16)


def check_descale(name: str, descale: object, q: torch.Tensor, heads_kv: int) -> None:
    """An FP8 call's descale factor `name`: None (1), or float32 on q's device, one per tensor (a single
    element) or one per (batch, KV head), (B, Hkv), as FlashAttention-3 takes them."""
    if descale is None:
        return
    if not isinstance(descale, torch.Tensor) or descale.dtype != torch.float32:
        raise TypeError(f"{name} must be a float32 tensor (or None for 1), got "
                        f"{descale.dtype if isinstance(descale, torch.Tensor) else type(descale).__name__}")
    if descale.device != q.device:
        raise ValueError(f"{name} is on {descale.device} but q is on {q.device}; put it on q's device")
    if descale.numel() != 1 and tuple(descale.shape) != (q.shape[0], heads_kv):
        raise ValueError(f"{name} must hold one factor per tensor (one element) or one per (batch, KV head), "
                         f"shape ({q.shape[0]}, {heads_kv}); got shape {tuple(descale.shape)}")
