"""Launchers for the Triton kernels and the autograd function that wires them together.

Launchers take canonical 4-D tensors, `q` (B, Hq, Nq, D) and `k`, `v` (B, Hkv, Nk, D), with any strides
whose last one is 1, check nothing the public API already checked, allocate outputs and launch. A
forward or backward like an earlier one (same layouts, options and kernels) replays that one's recorded
launches (launch.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import NamedTuple

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from . import _interpreter, launch
from .kernels.backward import attn_bwd_dkdv_kernel, attn_bwd_dq_kernel, attn_bwd_preprocess_kernel
from .kernels.forward import attn_fwd_kernel
from .launch import Recorded
from .tuning import (
    AUTOTUNE_MIN_WORK,
    TileConfig,
    attn_bwd_dkdv_autotuned,
    attn_bwd_dq_autotuned,
    attn_fwd_autotuned,
    backward_configs,
    block_d,
    forward_config,
    run_autotuned,
    seqlen_bucket,
    tile_config_of,
    tma_candidate_tile,
)
from .validation import (
    check_alibi_slopes,
    check_dropout,
    check_inputs,
    check_scale,
    check_softcap,
    check_varlen,
    check_window,
    last_dim_contiguous,
)

LOG2E = math.log2(math.e)


def _fp32_matmul_uses_tf32() -> bool:
    """PyTorch's own setting for float32 matmuls. Read through `fp32_precision` where it exists: reading
    the legacy `allow_tf32` raises once a program has set the new API."""
    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", None)
    if precision is None:
        return bool(matmul.allow_tf32)
    if precision == "none":  # inherits the global setting
        precision = getattr(torch.backends, "fp32_precision", "ieee")
    return precision == "tf32"


def _input_precision(dtype: torch.dtype) -> str:
    if dtype == torch.float32 and not _fp32_matmul_uses_tf32():
        return "ieee"
    return "tf32"  # ignored for 16-bit inputs


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride()[:3]


@functools.cache
def _cuda_properties(index: int):
    return torch.cuda.get_device_properties(index)


def _band(is_causal: bool, window: tuple[int, int]) -> tuple[bool, bool, int, int]:
    """(MASK_LEFT, MASK_RIGHT, window_left, window_right) for the kernels. Query i sees key j iff
    i + d - left <= j <= i + d + right with d = Nk - Nq, a side with -1 being unbounded; causal caps the
    right side at 0 (the band is the intersection of both masks)."""
    left, right = window
    if is_causal:
        right = 0 if right < 0 else min(right, 0)
    return left >= 0, right >= 0, max(left, 0), max(right, 0)


def _score_mods(scale: float, softcap: float, alibi_slopes: torch.Tensor | None) -> tuple[float, float, int]:
    """The kernels' (softcap_scale, softcap_log2, stride_alibi_b): scores become softcap * tanh(s / softcap),
    computed as softcap_log2 * tanh(q.k * softcap_scale) in exp2's units; ALiBi slopes of shape (Hq,) are
    shared by every batch (stride 0)."""
    stride_b = 0 if alibi_slopes is None or alibi_slopes.dim() == 1 else alibi_slopes.stride(0)
    if softcap > 0:
        return scale / softcap, softcap * LOG2E, stride_b
    return 0.0, 0.0, stride_b


def _heads_per_group(streamed: torch.Tensor, heads_per_stream: float, causal_order: bool) -> int:
    """How many (batch, head) pairs a causal launch groups together (see program_tile): as many as have
    the tiles they stream fit in three quarters of the L2. Each pair streams two tensors shaped like
    `streamed`'s heads (K and V for the forward and dQ; Q and dO for dK/dV), shared by `heads_per_stream`
    pairs (the query heads of a GQA group share K and V; a dK/dV program streams Q and dO of its whole
    group: 1 / group size). Other launches (not `causal_order`: no band, or one bounded on the left)
    ignore it."""
    if not causal_order:
        return 1
    l2_bytes = _cuda_properties(streamed.device.index).L2_cache_size if streamed.device.type == "cuda" else 50 * 2**20
    per_head = max(1, int(2 * streamed.shape[2] * streamed.shape[3] * streamed.element_size() / heads_per_stream))
    return max(1, 3 * l2_bytes // 4 // per_head)


def _descriptor_strides(t: torch.Tensor) -> list[int]:
    """The strides a (B, H, N, D) descriptor of `t` gets. A dim of size 1 is only ever indexed at 0, so
    an unaligned stride there (a view's leftover) is replaced by the packed one."""
    strides = list(t.stride())
    strides[-1] = 1
    for i in range(len(strides) - 2, -1, -1):
        if t.shape[i] == 1 and (strides[i] * t.element_size()) % 16 != 0:
            strides[i] = strides[i + 1] * t.shape[i + 1]
    return strides


def _tma_strides(*tensors: torch.Tensor) -> list[list[int]] | None:
    """Each tensor's descriptor strides if all of them can be read through TMA, else None. TMA needs a
    Hopper GPU (or the interpreter, which emulates it), 16-byte aligned base addresses, 16-byte multiples
    for every stride but the last, and non-empty dims."""
    device = tensors[0].device
    if device.type == "cuda" and _cuda_properties(device.index).major < 9:
        return None
    all_strides = []
    for t in tensors:
        strides, size = _descriptor_strides(t), t.element_size()
        if t.numel() == 0 or t.data_ptr() % 16 or any(st * size % 16 for st in strides[:-1]):
            return None
        all_strides.append(strides)
    return all_strides


def _descriptors(tensors: tuple, strides: list[list[int]] | None, tile: tuple[int, int] | None, bd: int) -> tuple:
    """(B, H, N, D) tensor descriptors of (q, k, v, o or dO) at tile (BLOCK_M, BLOCK_N): Q's and O's (dO's)
    boxes are one head's [BLOCK_M, bd] rows, K's and V's [BLOCK_N, bd] (the rule
    tuning._WithDescriptorBoxes applies per autotuned launch); four Nones without a tile, or without the
    strides of tensors that passed _tma_strides. Triton's launcher encodes them on the host at every launch
    (~10 µs for four on the H200 machine's CPU). They are made without the dataclass's __post_init__, which
    checks again what _tma_strides checked, at ~5 µs a descriptor: a backward makes ten (NOTES entry 34)."""
    if tile is None or strides is None:
        return (None,) * len(tensors)
    block_m, block_n = tile
    return tuple(_descriptor(t, st, [1, 1, rows, bd])
                 for t, st, rows in zip(tensors, strides, (block_m, block_n, block_n, block_m), strict=True))


def _descriptor(t: torch.Tensor, strides: list[int], block_shape: list[int]) -> TensorDescriptor:
    """TensorDescriptor(t, t.shape, strides, block_shape, padding="zero") without its __post_init__ checks."""
    desc = object.__new__(TensorDescriptor)
    desc.base, desc.shape, desc.strides, desc.block_shape, desc.padding = (t, list(t.shape), strides, block_shape,
                                                                           "zero")
    return desc


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)  # triton.cdiv is a JIT helper whose call costs the host ~5 µs


def _autotune_by_default(work: int) -> bool:
    """Autotune forwards and backwards of at least AUTOTUNE_MIN_WORK (B * Hq * Nq * Nk * D), unless the environment sets
    FLASHTRITON_AUTOTUNE=0: then every call takes the static tiles, so that outputs do not depend on what
    a machine's timing picked (different tiles sum in a different order)."""
    return work >= AUTOTUNE_MIN_WORK and os.environ.get("FLASHTRITON_AUTOTUNE", "1") != "0"


# The latest forward launch, for logs: (static TileConfig, whether it got TMA) or (the autotuner's pick, a
# triton.Config, None). Kept raw because building a TileConfig per call would cost the hot path microseconds.
_last_forward_choice: list = [None]


def _chosen_tiles(choice, use_tma: bool | None) -> str:
    """The name of the tiles a launch ran: an autotuner's pick (a triton.Config; use_tma None), or a static
    TileConfig with its TMA paths as far as the tensors allowed them; None for a kernel that did not run."""
    if choice is None:
        return "not run"
    if use_tma is None:
        return tile_config_of(choice).name
    return dataclasses.replace(choice, use_tma=choice.use_tma and use_tma,
                               warp_specialize=choice.warp_specialize and use_tma).name


def last_forward_choice() -> str:
    """The tiles of the most recent forward launch (the autotuner's pick, or the static one): for logs."""
    if _last_forward_choice[0] is None:
        return "none yet"
    return _chosen_tiles(*_last_forward_choice[0])


class Varlen(NamedTuple):
    """A packed batch of variable-length sequences: sequence b is rows cu_seqlens_q[b]:cu_seqlens_q[b + 1]
    of q (and likewise for k, v), at most max_seqlen_q (max_seqlen_k) long. The launchers then take q as
    the (1, Hq, total_q, D) view of the packed (total_q, Hq, D) tensor, and lse is (1, Hq, total_q)."""
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int


def _grid_dims(q: torch.Tensor, k: torch.Tensor, varlen: Varlen | None) -> tuple[int, int, int]:
    """(batch, query length, key length) the grid covers: a packed batch has one grid slice per
    sequence, as long as the longest."""
    if varlen is None:
        return q.shape[0], q.shape[2], k.shape[2]
    return len(varlen.cu_seqlens_q) - 1, varlen.max_seqlen_q, varlen.max_seqlen_k


def _bhr_strides(*tensors: torch.Tensor, varlen: Varlen | None = None) -> tuple[int, ...]:
    """Each tensor's (batch, head, row) strides; a packed batch's are (0, head, row): each program finds
    its sequence's first row in cu_seqlens."""
    strides: tuple[int, ...] = ()
    for t in tensors:  # a loop, not a generator: this runs on every call's host path
        strides += _strides(t) if varlen is None else (0, t.stride(1), t.stride(2))
    return strides


def _variant_meta(is_causal: bool, window: tuple[int, int], softcap: float, alibi_slopes: torch.Tensor | None,
                  varlen: Varlen | None, dropout_p: float) -> tuple[dict, int, int, bool]:
    """The kernels' variant flags (constexprs), the band's two widths, and whether the launch takes the
    causal order (a band bounded on the right only). Flags that are off stay out of the dict: the kernels
    default them to False."""
    mask_left, mask_right, window_left, window_right = _band(is_causal, window)
    meta = dict(MASK_LEFT=mask_left, MASK_RIGHT=mask_right, SOFTCAP=softcap > 0, ALIBI=alibi_slopes is not None)
    if varlen is not None:
        meta["VARLEN"] = True
    if dropout_p > 0:
        meta["DROPOUT"] = True
    return meta, window_left, window_right, mask_right and not mask_left


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: float,
                      config: TileConfig | None = None, autotune: bool | None = None,
                      window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                      alibi_slopes: torch.Tensor | None = None, varlen: Varlen | None = None,
                      dropout_p: float = 0.0, dropout_seed: torch.Tensor | None = None,
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns o like q and lse (B, Hq, Nq) in float32. `config` overrides the tile choice (tuning, tests);
    `autotune` forces the autotuner on or off (default: on for large problems on a GPU); `window` is the
    sliding window (left, right), -1 for unbounded (see _band); `softcap` > 0 caps the scores;
    `alibi_slopes` (Hq,) or (B, Hq) float32 adds ALiBi's bias (see flash_attention); `varlen` describes a
    packed batch (see Varlen); `dropout_p` > 0 drops probabilities with the Philox key in `dropout_seed`
    (one int64 on q's device; the backward must get the same one)."""
    _, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    # a packed batch's output is packed like q: (total_q, Hq, D) seen as (1, Hq, total_q, D)
    o = torch.empty_like(q) if varlen is None else q.new_empty((seqlen_q, heads_q, head_dim)).permute(1, 0, 2)[None]
    lse = torch.empty((q.shape[0], heads_q, seqlen_q), device=q.device, dtype=torch.float32)
    if o.numel() == 0:
        return o, lse
    on_gpu = q.device.type == "cuda"
    batch, grid_q, grid_k = _grid_dims(q, k, varlen)
    if autotune is None:
        autotune = config is None and on_gpu and _autotune_by_default(batch * heads_q * grid_q * grid_k * head_dim)
    if dropout_p > 0 and dropout_seed is None:
        dropout_seed = new_dropout_seed(q.device)
    # the variants' pointers (None where off)
    cu_seqlens = (None, None) if varlen is None else (varlen.cu_seqlens_q, varlen.cu_seqlens_k)
    optional = (alibi_slopes, *cu_seqlens, dropout_seed)

    # A call like one before it replays that call's launch (launch.py); the first records it.
    plan_key = None
    if launch.replayable(q.device):
        device, stream = launch.current_device_and_stream()
        plan_key = _plan_key(device, (q, k, v, *optional), attn_fwd_kernel, is_causal, scale, config, autotune,
                             tuple(window), softcap, None if varlen is None else varlen[2:], dropout_p)
        plan = launch.PLANS.get(plan_key)
        if plan is not None:
            recorded, _last_forward_choice[0] = plan
            recorded.replay((q, k, v, o, lse, *optional), (q, k, v, o), stream)
            return o, lse

    _interpreter.prepare(q.device)
    bd = block_d(head_dim)
    flags, window_left, window_right, causal_order = _variant_meta(is_causal, window, softcap, alibi_slopes,
                                                                   varlen, dropout_p)
    bucket = seqlen_bucket(grid_q, grid_k)
    rest = (*_bhr_strides(q, k, v, o, varlen=varlen), heads_q, seqlen_q, seqlen_k, window_left, window_right,
            scale * LOG2E, *_score_mods(scale, softcap, alibi_slopes), dropout_p,
            _heads_per_group(k, heads_q // heads_kv, causal_order), bucket)
    meta = dict(GROUP_SIZE=heads_q // heads_kv, HEAD_DIM=head_dim, BLOCK_D=bd,
                INPUT_PRECISION=_input_precision(q.dtype), **flags)
    tensor_args = (q, k, v, o, lse, *optional)

    def grid(meta):
        return _cdiv(grid_q, meta["BLOCK_M"]), heads_q, batch
    # A packed batch takes block pointers: a tile past a sequence's end would read into the next one.
    if autotune:
        tile = tma_candidate_tile("fwd", head_dim, q.dtype)  # each autotuned launch sets its own
        tma_strides = _tma_strides(q, k, v, o) if varlen is None and tile is not None else None
        with_tma = tma_strides is not None
        descs = _descriptors((q, k, v, o), tma_strides, tile, bd)
        full_args = (*tensor_args, *descs, *rest)
        picked, launched = run_autotuned(attn_fwd_autotuned[with_tma], grid, full_args, meta, q.dtype, bucket)
        _last_forward_choice[0] = (picked, None)
        if plan_key is not None and launched is not None:  # (None: this call ran the autotuner)
            compiled, config_kwargs = launched
            launch.remember(plan_key, (_Launch.of(attn_fwd_kernel, compiled, grid(config_kwargs), full_args,
                                                  {**meta, **config_kwargs}, len(tensor_args), descs),
                                       _last_forward_choice[0]))
        return o, lse
    # Small problems on a GPU take block pointers: encoding descriptors would cost more host time than
    # TMA saves. The interpreter takes TMA where it can, so that the CPU tests cover that path.
    cfg = config or forward_config(head_dim, q.dtype, q.device, use_tma=not on_gpu)
    tma_strides = _tma_strides(q, k, v, o) if cfg.use_tma and varlen is None else None
    use_tma = tma_strides is not None
    _last_forward_choice[0] = (cfg, use_tma)
    descs = _descriptors((q, k, v, o), tma_strides, (cfg.block_m, cfg.block_n), bd)
    full_args = (*tensor_args, *descs, *rest)
    launch_kwargs = dict(meta, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, USE_TMA=use_tma,
                         WARP_SPECIALIZE=use_tma and cfg.warp_specialize, QK_AHEAD=cfg.qk_ahead,
                         num_warps=cfg.num_warps, num_stages=cfg.num_stages, maxnreg=cfg.max_registers)
    grid_dims = grid(launch_kwargs)
    compiled = attn_fwd_kernel[grid_dims](*full_args, **launch_kwargs)
    if plan_key is not None:
        launch.remember(plan_key, (_Launch.of(attn_fwd_kernel, compiled, grid_dims, full_args, launch_kwargs,
                                              len(tensor_args), descs), _last_forward_choice[0]))
    return o, lse


class _Launch(NamedTuple):
    """One recorded launch (launch.Recorded) and how to rebuild its tensor descriptors over a later call's
    tensors: each descriptor's (strides, box), `layout`, None without TMA; `count` of them."""
    recorded: Recorded
    layout: tuple | None
    count: int

    @classmethod
    def of(cls, jit_fn, compiled, grid_dims: tuple, full_args: tuple, kwargs: dict, tensor_args: int,
           descs: tuple = ()) -> _Launch:
        """The launch of `compiled` that took `full_args`: `tensor_args` tensors (or Nones), then `descs`."""
        layout = None if not descs or descs[0] is None else tuple((d.strides, d.block_shape) for d in descs)
        return cls(Recorded(jit_fn, compiled, grid_dims, full_args, kwargs, tensor_args + len(descs)), layout,
                   len(descs))

    def replay(self, tensor_args: tuple, desc_sources: tuple, stream: int) -> None:
        """Launch again with this call's tensors, and descriptors of the first `count` of `desc_sources`."""
        if self.layout is None:
            descs = (None,) * self.count
        else:
            descs = tuple(_descriptor(t, strides, box)
                          for t, (strides, box) in zip(desc_sources[:self.count], self.layout, strict=True))
        self.recorded.replay((*tensor_args, *descs), stream)


# The latest backward launch's tiles, for logs: ((dK/dV, dQ) static configs, whether they got TMA) or
# ((dK/dV, dQ) the autotuners' picks, None).
_last_backward_choice: list = [None]


def last_backward_choice() -> str:
    """The tiles of the most recent backward's two kernels: for logs."""
    if _last_backward_choice[0] is None:
        return "none yet"
    choices, use_tma = _last_backward_choice[0]
    dkdv, dq = (_chosen_tiles(choice, use_tma) for choice in choices)
    return f"dK/dV {dkdv}, dQ {dq}"


def backward_stats(o: torch.Tensor, do: torch.Tensor, lse: torch.Tensor, varlen: Varlen | None = None,
                   recorded: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward's first launch: the per-row statistics its loops stream, L * log2(e) and
    D = rowsum(dO * O), in float32. Each is laid out like `lse` but with every head's row padded to a
    multiple of 4 elements (16 bytes, so that TMA can read it): views of shape lse.shape into one buffer.
    o and do as attention_backward takes them; `recorded` (a dict) gets the launch under "stats" (_Launch)."""
    _, heads_q, seqlen_q, head_dim = o.shape
    batch, grid_q, _ = _grid_dims(o, o, varlen)
    lse2, delta = _stats_buffer(lse)
    pre_block = 64 if o.device.type == "cuda" else 32
    grid = (_cdiv(grid_q, pre_block), heads_q, batch)
    args = (o, do, lse, lse2, delta, None if varlen is None else varlen.cu_seqlens_q,
            *_bhr_strides(o, do, varlen=varlen), heads_q, seqlen_q, lse2.stride(-2))
    meta = dict(HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim), BLOCK_M=pre_block, VARLEN=varlen is not None)
    compiled = attn_bwd_preprocess_kernel[grid](*args, **meta)
    if recorded is not None:
        recorded["stats"] = _Launch.of(attn_bwd_preprocess_kernel, compiled, grid, args, meta, 6)
    return lse2, delta


def _stats_buffer(lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows = lse.shape[-1]
    buffer = torch.empty(2, *lse.shape[:-1], _cdiv(rows, 4) * 4, device=lse.device, dtype=torch.float32)
    return buffer[..., :rows].unbind(0)


def attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       o: torch.Tensor, lse: torch.Tensor, is_causal: bool, scale: float,
                       configs: tuple[TileConfig, TileConfig] | None = None, autotune: bool | None = None,
                       window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                       alibi_slopes: torch.Tensor | None = None, varlen: Varlen | None = None,
                       dropout_p: float = 0.0, dropout_seed: torch.Tensor | None = None,
                       needs: tuple[bool, bool, bool] = (True, True, True),
                       ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Returns dq, dk, dv shaped like q, k, v. Deterministic: every element has a single writer, and for
    a given choice of tiles the summation order is fixed. `configs` = (dK/dV config, dQ config)
    overrides the tile choice; `autotune` forces the autotuners on or off (default: as the forward);
    `needs` says which of dq, dk, dv are wanted (autograd's needs_input_grad): the dQ kernel runs only
    for dq and the dK/dV kernel only for dk or dv, and an unwanted gradient comes back as None; the other
    keywords as in attention_forward."""
    _, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    if do.stride(-1) != 1:
        do = do.contiguous()
    need_dq, need_dkdv = needs[0], needs[1] or needs[2]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if dq.numel() == 0 or dk.numel() == 0:  # nothing attends: every gradient is zero
        return _wanted((dq.zero_(), dk.zero_(), dv.zero_()), needs)
    if dropout_p > 0 and dropout_seed is None:
        raise ValueError("dropout_p > 0 needs the forward's dropout_seed, so that the backward drops the same "
                         "probabilities")
    batch, grid_q, grid_k = _grid_dims(q, k, varlen)
    if autotune is None:  # float32 keeps its static tiles: the candidates are 16-bit sweeps' winners
        autotune = (configs is None and q.device.type == "cuda" and q.element_size() == 2
                    and _autotune_by_default(batch * heads_q * grid_q * grid_k * head_dim))
    cu_seqlens = (None, None) if varlen is None else (varlen.cu_seqlens_q, varlen.cu_seqlens_k)
    optional = (alibi_slopes, *cu_seqlens, dropout_seed)  # the variants' pointers (None where off)

    # A call like one before it replays that call's launches (launch.py); the first records them.
    plan = plan_key = None
    if launch.replayable(q.device):
        device, stream = launch.current_device_and_stream()
        plan_key = _plan_key(device, (q, k, v, do, o, lse, *optional),
                             (attn_bwd_preprocess_kernel, attn_bwd_dkdv_kernel, attn_bwd_dq_kernel), is_causal, scale,
                             None if configs is None else tuple(configs), autotune, tuple(window), softcap,
                             None if varlen is None else varlen[2:], dropout_p, tuple(needs))
        recorded_plan = launch.PLANS.get(plan_key)
        if recorded_plan is not None:
            return recorded_plan.replay(stream, q, k, v, o, do, lse, dq, dk, dv, optional, needs)
        plan = _BackwardPlan()

    _interpreter.prepare(q.device)
    bd = block_d(head_dim)
    lse2, delta = backward_stats(o, do, lse, varlen, None if plan is None else plan.launches)
    stride_stats = lse2.stride(-2)
    group = heads_q // heads_kv
    flags, window_left, window_right, causal_order = _variant_meta(is_causal, window, softcap, alibi_slopes,
                                                                   varlen, dropout_p)
    meta = dict(GROUP_SIZE=group, HEAD_DIM=head_dim, BLOCK_D=bd, INPUT_PRECISION=_input_precision(q.dtype), **flags)
    bucket = seqlen_bucket(grid_q, grid_k)
    mods = (*_score_mods(scale, softcap, alibi_slopes), dropout_p)
    dkdv_args, dq_args = _kernel_tensor_args(q, k, v, do, lse2, delta, dq, dk, dv, optional).values()
    dkdv_rest = (*_bhr_strides(q, k, v, do, dk, dv, varlen=varlen), heads_kv, seqlen_q, seqlen_k, stride_stats,
                 window_left, window_right, scale, scale * LOG2E, *mods,
                 _heads_per_group(q, 1 / group, causal_order), bucket)
    dq_rest = (*_bhr_strides(q, k, v, do, dq, varlen=varlen), heads_q, seqlen_q, seqlen_k, stride_stats,
               window_left, window_right, scale, scale * LOG2E, *mods, _heads_per_group(k, group, causal_order),
               bucket)

    def dkdv_grid(meta):
        return _cdiv(grid_k, meta["BLOCK_N"]), heads_kv, batch

    def dq_grid(meta):
        return _cdiv(grid_q, meta["BLOCK_M"]), heads_q, batch

    # The descriptors exist before the pick, at the first TMA candidate's tiles; each autotuned launch
    # sets their boxes to its own (tuning._WithDescriptorBoxes). A packed batch takes block pointers: a
    # tile past a sequence's end would read into the next one.
    if autotune:
        tma_strides = _tma_strides(q, k, v, do) if varlen is None else None
        tiles = [tma_candidate_tile(which, head_dim, q.dtype) for which in ("dkdv", "dq")]
        picks = []
        for name, kernel, tile, autotuned, grid, args, rest, wanted in (
                ("dkdv", attn_bwd_dkdv_kernel, tiles[0], attn_bwd_dkdv_autotuned, dkdv_grid, dkdv_args, dkdv_rest,
                 need_dkdv),
                ("dq", attn_bwd_dq_kernel, tiles[1], attn_bwd_dq_autotuned, dq_grid, dq_args, dq_rest, need_dq)):
            if not wanted:
                picks.append(None)
                continue
            descs = _backward_descriptors(q, k, v, do, lse2, delta, tma_strides, tile, bd, name == "dkdv")
            full_args = (*args, *descs, *rest)
            config, launched = run_autotuned(autotuned[descs[0] is not None], grid, full_args, meta, q.dtype, bucket)
            picks.append(config)
            if plan is not None and launched is not None:  # (None: this call ran the autotuner)
                compiled, config_kwargs = launched
                plan.launches[name] = _Launch.of(kernel, compiled, grid(config_kwargs), full_args,
                                                 {**meta, **config_kwargs}, len(args), descs)
        _last_backward_choice[0] = plan_choice = (tuple(picks), None)
    else:
        dkdv_cfg, dq_cfg = configs or backward_configs(head_dim, q.dtype, q.device)
        use_tma = (dkdv_cfg.use_tma or dq_cfg.use_tma) and varlen is None
        tma_strides = _tma_strides(q, k, v, do) if use_tma else None
        _last_backward_choice[0] = plan_choice = ((dkdv_cfg if need_dkdv else None, dq_cfg if need_dq else None),
                                                  tma_strides is not None)
        for name, kernel, cfg, grid, args, rest, wanted in (
                ("dkdv", attn_bwd_dkdv_kernel, dkdv_cfg, dkdv_grid, dkdv_args, dkdv_rest, need_dkdv),
                ("dq", attn_bwd_dq_kernel, dq_cfg, dq_grid, dq_args, dq_rest, need_dq)):
            if not wanted:
                continue
            descs = _backward_descriptors(q, k, v, do, lse2, delta, tma_strides,
                                          (cfg.block_m, cfg.block_n) if cfg.use_tma else None, bd, name == "dkdv")
            full_args = (*args, *descs, *rest)
            launch_kwargs = dict(meta, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, USE_TMA=descs[0] is not None,
                                 num_warps=cfg.num_warps, num_stages=cfg.num_stages, maxnreg=cfg.max_registers)
            grid_dims = grid(launch_kwargs)
            compiled = kernel[grid_dims](*full_args, **launch_kwargs)
            if plan is not None:
                plan.launches[name] = _Launch.of(kernel, compiled, grid_dims, full_args, launch_kwargs, len(args),
                                                 descs)
    if plan is not None and plan.complete(need_dkdv, need_dq):
        plan.choice = plan_choice
        launch.remember(plan_key, plan)
    return _wanted((dq, dk, dv), needs)


def _plan_key(device: int, tensors: tuple, *options) -> tuple:
    """Everything a forward's or backward's launches depend on but what its tensors hold: each input's
    (or None's) shape, strides, dtype and 16-byte alignment, the device, float32's matmul precision and
    the call's options (the outputs are allocated from these), the kernels among them (so that a kernel
    swapped in, as benchmarks/ab_dkdv.py does, records its own plan). Two calls with equal keys bind every
    kernel argument to the same scalars and Triton specialises them the same way, so the second may
    replay the first's launches (launch.py)."""
    layout = tuple(None if t is None else (t.shape, t.stride(), t.dtype, t.data_ptr() % 16 == 0) for t in tensors)
    return (device, layout, _input_precision(tensors[0].dtype), *options)


def _kernel_tensor_args(q, k, v, do, lse2, delta, dq, dk, dv, optional: tuple) -> dict:
    """The dK/dV and dQ kernels' leading arguments: tensors, then the variants' (None where off)."""
    return {"dkdv": (q, k, v, do, lse2, delta, dk, dv, *optional), "dq": (q, k, v, do, lse2, delta, dq, *optional)}


class _BackwardPlan:
    """A backward's launches as recorded (_Launch): "stats", then "dkdv" and "dq" where they ran, in launch
    order. `choice` is what last_backward_choice reports for it."""

    def __init__(self):
        self.launches: dict[str, _Launch] = {}
        self.choice = None

    def complete(self, need_dkdv: bool, need_dq: bool) -> bool:
        """Whether every wanted launch was recorded (not so on a call that ran an autotuner)."""
        return list(self.launches) == ["stats", *(["dkdv"] if need_dkdv else []), *(["dq"] if need_dq else [])]

    def replay(self, stream: int, q, k, v, o, do, lse, dq, dk, dv, optional: tuple, needs: tuple) -> tuple:
        lse2, delta = _stats_buffer(lse)
        tensor_args = _kernel_tensor_args(q, k, v, do, lse2, delta, dq, dk, dv, optional)
        tensor_args["stats"] = (o, do, lse, lse2, delta, optional[1])
        for name, recorded in self.launches.items():
            recorded.replay(tensor_args[name], (q, k, v, do, lse2, delta), stream)
        _last_backward_choice[0] = self.choice
        return _wanted((dq, dk, dv), needs)


def _backward_descriptors(q, k, v, do, lse2, delta, strides, tile, bd: int, stats: bool) -> tuple:
    """A backward kernel's descriptors (Nones without TMA): Q, K, V and dO, then with `stats` (the dK/dV
    kernel, which streams them per query tile) L * log2 e and D."""
    descs = _descriptors((q, k, v, do), strides, tile, bd)
    if not stats:
        return descs
    if descs[0] is None:
        return (*descs, None, None)
    # (B, H, N) with [1, 1, BLOCK_M] boxes; backward_stats pads their rows to 16 bytes for TMA
    return (*descs, *(_descriptor(t, list(t.stride()), [1, 1, tile[0]]) for t in (lse2, delta)))


def _wanted(grads: tuple, needs: tuple[bool, bool, bool]) -> tuple:
    return tuple(g if need else None for g, need in zip(grads, needs, strict=True))


def new_dropout_seed(device: torch.device) -> torch.Tensor:
    """A Philox key drawn from torch's generator for `device` (so torch.manual_seed reproduces a run),
    left on the device: the kernels load it, and nothing waits for it on the host."""
    return torch.randint(0, 2**62, (1,), device=device, dtype=torch.int64)


def attention_probs(Q: torch.Tensor, K: torch.Tensor, is_causal: bool, mods: dict) -> torch.Tensor:
    """The (B, Hq, Nq, Nk) float32 probabilities a call used (after dropout and its 1 / (1 - p) scaling,
    0 where dropped), recomputed with the reference and the kernels' dropout mask: a testing aid."""
    from .reference import attention_ref
    q4, k4 = _as_4d(Q).float(), _as_4d(K).float()
    keep = None
    if mods.get("dropout_p", 0.0) > 0:
        keep = dropout_mask(mods["dropout_seed"], q4.shape[0], q4.shape[1], q4.shape[2], k4.shape[2],
                            mods["dropout_p"])
    _, _, probs = attention_ref(q4, k4, k4, is_causal=is_causal, scale=mods["scale"], upcast=False,
                                window_size=mods.get("window", NO_WINDOW), softcap=mods.get("softcap", 0.0),
                                alibi_slopes=mods.get("alibi_slopes"), dropout_p=mods.get("dropout_p", 0.0),
                                dropout_mask=keep, return_probs=True)
    return probs


def dropout_mask(seed: torch.Tensor, batch: int, heads: int, seqlen_q: int, seqlen_k: int,
                 dropout_p: float) -> torch.Tensor:
    """The boolean (B, Hq, Nq, Nk) mask of kept probabilities that the kernels draw for `seed`."""
    from .kernels.common import dropout_mask_kernel
    _interpreter.prepare(seed.device)
    keep = torch.empty((batch, heads, seqlen_q, seqlen_k), device=seed.device, dtype=torch.int8)
    if keep.numel():
        dropout_mask_kernel[(_cdiv(seqlen_q, 32), _cdiv(seqlen_k, 32), batch * heads)](
            seed, keep, heads, seqlen_q, seqlen_k, dropout_p, BLOCK_M=32, BLOCK_N=32)
    return keep.bool()


def _as_4d(x: torch.Tensor) -> torch.Tensor:
    """(..., H, N, D) -> (B, H, N, D), merging extra leading dims into B; (N, D) and (B, N, D) get H = 1."""
    if x.dim() == 2:
        return x[None, None]
    if x.dim() == 3:
        return x[:, None]
    if x.dim() == 4:
        return x
    return x.reshape(-1, *x.shape[-3:])


NO_WINDOW = (-1, -1)


def _checked_mods(q: torch.Tensor, scale, window_size, softcap, alibi_slopes, dropout_p,
                  batch: int | None = None) -> dict:
    """The public keywords, checked, as the launchers' keyword arguments; those left at their defaults
    stay out (the launchers' defaults), which keeps the plain call's host path short. With dropout, the
    call's Philox key is drawn here, once for its forward and backward. `batch` is the number of
    sequences of a packed q."""
    mods = dict(scale=check_scale(scale, q.shape[-1]))
    if window_size != NO_WINDOW:
        mods["window"] = check_window(window_size)
    if softcap != 0.0:
        mods["softcap"] = check_softcap(softcap)
    if alibi_slopes is not None:
        mods["alibi_slopes"] = check_alibi_slopes(alibi_slopes, q, batch=batch)
    if dropout_p != 0.0:
        mods["dropout_p"] = check_dropout(dropout_p)
        mods["dropout_seed"] = new_dropout_seed(q.device)
    return mods


def flash_attention_forward(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, is_causal: bool,
                            scale: float | None, window_size: tuple[int, int] = NO_WINDOW, softcap: float = 0.0,
                            alibi_slopes: torch.Tensor | None = None, dropout_p: float = 0.0) -> tuple:
    """Validate, then run the forward on (..., N, d) tensors: returns (Q, K, V, O, L, mods) with Q, K, V as
    the kernels read them (copied only if their last dim was not contiguous) and `mods` the checked
    keyword arguments of attention_forward and attention_backward (scale, window, softcap, alibi_slopes,
    dropout_p and the dropout seed drawn for this call). No autograd."""
    check_inputs(Q, K, V, is_causal=is_causal)
    mods = _checked_mods(Q, scale, window_size, softcap, alibi_slopes, dropout_p)
    Q, K, V = (last_dim_contiguous(x) for x in (Q, K, V))
    if Q.dim() == 4:  # the API's layout: no views to make (each costs a few microseconds of host time)
        return Q, K, V, *attention_forward(Q, K, V, is_causal, **mods), mods
    o4, lse4 = attention_forward(_as_4d(Q), _as_4d(K), _as_4d(V), is_causal, **mods)
    return Q, K, V, o4.view(Q.shape), lse4.view(Q.shape[:-1]), mods


class FlashAttentionTriton(torch.autograd.Function):
    """FlashAttention-2 in Triton, forward and backward.

    `FlashAttentionTriton.apply(Q, K, V, is_causal=False, scale=None, return_lse=False, window_size=(-1, -1),
    softcap=0.0, alibi_slopes=None)` returns O, or `(O, L)` with `return_lse=True` (L carries no
    gradient); the last three as in `flash_attention`. Q: (..., Nq, d), K and V: (..., Nk, d), with
    equal leading dims except that a 4-D (or larger) input may have fewer key/value heads (dim -3) than
    query heads (GQA). O: like Q; L: Q.shape[:-1], float32, natural log. Saves exactly `Q, K, V, O, L`.
    """

    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False, scale=None, return_lse=False, window_size=NO_WINDOW,
                softcap=0.0, alibi_slopes=None, dropout_p=0.0, return_attn_probs=False):
        Q, K, V, O, L, mods = flash_attention_forward(Q, K, V, is_causal, scale, window_size, softcap,
                                                      alibi_slopes, dropout_p)
        ctx.save_for_backward(Q, K, V, O, L)
        ctx.is_causal, ctx.mods = is_causal, mods
        outputs = [O]
        if return_lse:
            outputs.append(L)
        if return_attn_probs:
            outputs.append(attention_probs(Q, K, is_causal, mods))
        ctx.mark_non_differentiable(*outputs[1:])
        return tuple(outputs) if len(outputs) > 1 else O

    @staticmethod
    def backward(ctx, dO, *_unused_dL):
        Q, K, V, O, L = ctx.saved_tensors
        q4 = _as_4d(Q)
        grads = attention_backward(_as_4d(dO), q4, _as_4d(K), _as_4d(V), _as_4d(O), L.view(q4.shape[:-1]),
                                   ctx.is_causal, **ctx.mods, needs=tuple(ctx.needs_input_grad[:3]))
        grads = [None if g is None else g.view(x.shape) for g, x in zip(grads, (Q, K, V), strict=True)]
        return *_no_second_derivative(grads, Q, K, V), *(None,) * 8


class _NoSecondDerivative(torch.autograd.Function):
    """Passes first-order gradients through; differentiating them again raises. The kernels' gradients
    carry no graph, so without this a double backward would fail with an unrelated-looking message."""

    @staticmethod
    def forward(ctx, anchors, *tensors):  # `anchors` inputs tie the outputs to the graph; the rest pass
        return tuple(g.view_as(g) for g in tensors[anchors:])

    @staticmethod
    def backward(ctx, *_):
        raise NotImplementedError(
            "flash_attention has no second derivative (double backward): compute its gradients without "
            "create_graph=True, or use flashtriton.attention_ref (plain attention) where a second "
            "derivative is needed")


def _no_second_derivative(grads: list, *inputs: torch.Tensor) -> list:
    """`grads` as they are, unless the backward runs with create_graph=True: then tied to the inputs
    through _NoSecondDerivative, so that a second derivative is a clear error."""
    anchors = [x for x in inputs if x.requires_grad]
    if not torch.is_grad_enabled() or not anchors or all(g is None for g in grads):
        return grads
    present = [g for g in grads if g is not None]
    tied = iter(_NoSecondDerivative.apply(len(anchors), *anchors, *present))
    return [None if g is None else next(tied) for g in grads]


def _packed_as_4d(x: torch.Tensor) -> torch.Tensor:
    """(total, H, D) -> the (1, H, total, D) view the launchers take (see Varlen)."""
    return x.permute(1, 0, 2)[None]


class FlashAttentionVarlen(torch.autograd.Function):
    """FlashAttention-2 on a packed batch of variable-length sequences, forward and backward.

    `FlashAttentionVarlen.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal,
    scale, return_lse, window_size, softcap, alibi_slopes, dropout_p)`: q (total_q, Hq, D), k and v
    (total_k, Hkv, D); returns o (total_q, Hq, D), and with return_lse also lse (Hq, total_q), float32 (no
    gradient). Dropout's Philox counters are (row and column within the sequence, sequence * Hq + head).
    """

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False,
                scale=None, return_lse=False, window_size=NO_WINDOW, softcap=0.0, alibi_slopes=None,
                dropout_p=0.0):
        check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=is_causal)
        mods = _checked_mods(q, scale, window_size, softcap, alibi_slopes, dropout_p, batch=len(cu_seqlens_q) - 1)
        # The kernels index cu_seqlens with unit stride: a strided view is copied (once, a few bytes).
        mods["varlen"] = Varlen(cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), int(max_seqlen_q),
                                int(max_seqlen_k))
        q, k, v = (last_dim_contiguous(x) for x in (q, k, v))
        o4, lse4 = attention_forward(_packed_as_4d(q), _packed_as_4d(k), _packed_as_4d(v), is_causal, **mods)
        o, lse = o4[0].permute(1, 0, 2), lse4[0]
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal, ctx.mods = is_causal, mods
        if return_lse:
            ctx.mark_non_differentiable(lse)
            return o, lse
        return o

    @staticmethod
    def backward(ctx, do, *_unused_dlse):
        q, k, v, o, lse = ctx.saved_tensors
        grads = attention_backward(_packed_as_4d(do), *(_packed_as_4d(x) for x in (q, k, v, o)), lse[None],
                                   ctx.is_causal, **ctx.mods, needs=tuple(ctx.needs_input_grad[:3]))
        grads = [None if g is None else g[0].permute(1, 0, 2) for g in grads]
        return *_no_second_derivative(grads, q, k, v), *(None,) * 11
