"""The backward's launchers: the per-row statistics (one launch), then the dK/dV and dQ kernels, on the
tensors of the forward (launch/forward.py's layouts) and dO."""

from __future__ import annotations

import torch

from .. import _interpreter
from . import gluon_backward, replay
from .arguments import (
    LOG2E,
    Varlen,
    bhr_strides,
    cdiv,
    grid_dims,
    heads_per_group,
    input_precision,
    plain_call,
    score_mods,
    variant_flags,
    variant_pointers,
)
from .autotune import autotune_by_default, autotuner, seqlen_bucket, tma_candidate_tile
from .descriptors import attention_descriptors, statistics_descriptors, tma_strides
from .forward import empty_in_order
from .gluon_backward import gluon_backward_selected, gluon_dkdv_spec
from .kernel_set import DEFAULT_KERNELS, Kernels
from .runner import LaunchSpec, replay_recorded, run
from .tiles import TileConfig, backward_configs, block_d


def statistics_buffer(lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two float32 tensors laid out like `lse`, for L * log2(e) and D = rowsum(dO * O), with every head's
    row padded to a multiple of 4 elements (16 bytes, so that TMA can read it): views into one buffer."""
    rows = lse.shape[-1]
    buffer = torch.empty(2, *lse.shape[:-1], cdiv(rows, 4) * 4, device=lse.device, dtype=torch.float32)
    return buffer[..., :rows].unbind(0)


def statistics_launch(o: torch.Tensor, do: torch.Tensor, lse: torch.Tensor, lse2: torch.Tensor,
                      delta: torch.Tensor, varlen: Varlen | None, kernel) -> LaunchSpec:
    """The backward's first launch: the per-row statistics its loops stream, L * log2(e) into `lse2` and
    D = rowsum(dO * O) into `delta` (statistics_buffer)."""
    _, heads_q, seqlen_q, head_dim = o.shape
    batch, grid_q, _ = grid_dims(o, o, varlen)
    pre_block = 64 if o.device.type == "cuda" else 32
    tensors = (o, do, lse, lse2, delta, None if varlen is None else varlen.cu_seqlens_q)
    scalars = (*bhr_strides(o, do, varlen=varlen), heads_q, seqlen_q, lse2.stride(-2))
    meta = dict(HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim), BLOCK_M=pre_block, VARLEN=varlen is not None)
    return LaunchSpec("stats", kernel, lambda meta: (cdiv(grid_q, pre_block), heads_q, batch), tensors, (), scalars,
                      meta)


def backward_stats(o: torch.Tensor, do: torch.Tensor, lse: torch.Tensor,
                   varlen: Varlen | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the statistics launch alone: (L * log2(e), D), each shaped like `lse` (tests, tools)."""
    lse2, delta = statistics_buffer(lse)
    run("statistics", None, [statistics_launch(o, do, lse, lse2, delta, varlen, DEFAULT_KERNELS.preprocess)], ())
    return lse2, delta


def attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       o: torch.Tensor, lse: torch.Tensor, is_causal: bool, scale: float,
                       configs: tuple[TileConfig, TileConfig] | None = None, autotune: bool | None = None,
                       window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                       alibi_slopes: torch.Tensor | None = None, varlen: Varlen | None = None,
                       dropout_p: float = 0.0, dropout_seed: torch.Tensor | None = None,
                       needs: tuple[bool, bool, bool] = (True, True, True), kernels: Kernels | None = None,
                       deterministic: bool = False,
                       ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Returns dq, dk, dv shaped like q, k, v. With `deterministic` (or torch.use_deterministic_algorithms)
    bitwise reproducible: every element has a single writer, and for a given choice of tiles the summation
    order is fixed. Without, the Gluon path (launch/gluon_backward.py: sm_90, where selected) adds dQ up
    by atomic reductions, in an order that varies; the Triton path is deterministic either way.
    `configs` = (dK/dV config, dQ config)
    overrides the tile choice; `autotune` forces the autotuners on or off (default: as the forward, for
    16-bit inputs); `needs` says which of dq, dk, dv are wanted (autograd's needs_input_grad): the dQ
    kernel runs only for dq and the dK/dV kernel only for dk or dv, and an unwanted gradient comes back as
    None; the other keywords as in attention_forward."""
    heads_q, seqlen_q, head_dim = q.shape[1:]
    if do.stride(-1) != 1:
        do = do.contiguous()
    need_dq, need_dkdv = needs[0], needs[1] or needs[2]
    dq, dk, dv = gradient_outputs(q, k, v)
    if dq.numel() == 0 or dk.numel() == 0:  # nothing attends: every gradient is zero
        return _wanted((dq.zero_(), dk.zero_(), dv.zero_()), needs)
    if dropout_p > 0 and dropout_seed is None:
        raise ValueError("dropout_p > 0 needs the forward's dropout_seed, so that the backward drops the same "
                         "probabilities")
    batch, grid_q, grid_k = grid_dims(q, k, varlen)
    if autotune is None:  # float32 keeps its static tiles: the candidates are 16-bit sweeps' winners
        autotune = (configs is None and q.device.type == "cuda" and q.element_size() == 2
                    and autotune_by_default(batch * heads_q * grid_q * grid_k * head_dim))
    optional = variant_pointers(alibi_slopes, varlen, dropout_seed)
    # A plain call may take its dK/dV from the Gluon kernel, after the Triton launches (the statistics it
    # reads); with dQ in the same loop (atomic adds), unless the run asks for deterministic algorithms: then
    # dQ comes from the Triton dQ kernel (auto takes that form at gluon_backward.DETERMINISTIC_HEAD_DIMS).
    deterministic = deterministic or torch.are_deterministic_algorithms_enabled()
    gluon = (need_dkdv and configs is None and kernels is None
             and plain_call(window, softcap, alibi_slopes, varlen, dropout_p)
             and gluon_backward_selected(q, k, v, do, is_causal, deterministic))
    dq_acc = None
    fragments = gluon_backward.dq_in_fragments(head_dim)  # (read once: the buffer, launch and cast agree)
    if gluon and need_dq and not deterministic:
        dq_acc = gluon_backward.dq_accumulator(q, fragments)
    lse2, delta = statistics_buffer(lse)
    tensors = {"stats": ((o, do, lse, lse2, delta, optional[1]), ())}
    if gluon:
        tensors["gluon_dkdv"] = ((dk, dv), (q, k, v, do, lse2, delta, dq_acc))
        if dq_acc is not None and fragments:  # dQ back in place from the kernel's register order
            tensors["dq_fragments"] = ((dq_acc, dq), ())
    elif need_dkdv:
        tensors["dkdv"] = ((q, k, v, do, lse2, delta, dk, dv, *optional), (q, k, v, do, lse2, delta))
    if need_dq and dq_acc is None:
        tensors["dq"] = ((q, k, v, do, lse2, delta, dq, *optional), (q, k, v, do))

    key = None
    if replay.replayable(q.device):
        device, stream = replay.current_device_and_stream()
        key = replay.plan_key(device, (q, k, v, do, o, lse, *optional), kernels,
                              is_causal, scale, None if configs is None else tuple(configs), autotune, tuple(window),
                              softcap, None if varlen is None else varlen[2:], dropout_p, tuple(needs), gluon,
                              dq_acc is None, fragments)
        if replay_recorded("backward", key, tensors, stream):
            return _wanted(_gradients(dq, dk, dv, dq_acc, fragments, scale), needs)
    _interpreter.prepare(q.device)
    kernels = kernels or DEFAULT_KERNELS
    specs = [statistics_launch(o, do, lse, lse2, delta, varlen, kernels.preprocess),
             *_gradient_launches(tensors, q, k, (batch, grid_q, grid_k), is_causal, scale, configs, autotune, window,
                                 softcap, alibi_slopes, varlen, dropout_p, kernels)]
    if gluon:
        specs.append(gluon_dkdv_spec(q, k, v, do, lse2, delta, dk, dv, is_causal, scale, dq_acc,
                                     dq_fragments=fragments))
        if "dq_fragments" in tensors:
            specs.append(gluon_backward.dq_fragments_spec(dq, dq_acc, scale))
    run("backward", key, specs, ("gluon_dkdv" if gluon else "dkdv", "dq"))
    return _wanted(_gradients(dq, dk, dv, dq_acc, fragments, scale), needs)


def _gradients(dq, dk, dv, dq_acc, fragments: bool, scale: float):
    """(dq, dk, dv) once the launches have run: on the Gluon path with `dq_acc` (float32) its kernel added
    dQ / scale there, which dq then takes in its own dtype, times `scale` (in register order, with
    `fragments`, the plan's last launch did)."""
    if dq_acc is not None and not fragments:
        torch.mul(dq_acc, scale, out=dq)
    return dq, dk, dv


def gradient_outputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """dq, dk, dv, laid out like q, k, v (forward.empty_in_order); the custom op's fake implementation
    allocates through this too."""
    return empty_in_order(q), empty_in_order(k), empty_in_order(v)


def _gradient_launches(tensors: dict, q: torch.Tensor, k: torch.Tensor, dims: tuple[int, int, int], is_causal: bool,
                       scale: float,
                       configs: tuple[TileConfig, TileConfig] | None, autotune: bool, window: tuple[int, int],
                       softcap: float, alibi_slopes: torch.Tensor | None, varlen: Varlen | None, dropout_p: float,
                       kernels: Kernels) -> list[LaunchSpec]:
    """The dK/dV and dQ launches wanted (`tensors` holds their per-call arguments)."""
    if "dkdv" not in tensors and "dq" not in tensors:  # dK/dV alone, from the Gluon kernel
        return []
    heads_q, seqlen_q, head_dim = q.shape[1:]
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    batch, grid_q, grid_k = dims  # (arguments.grid_dims)
    bd = block_d(head_dim)
    group = heads_q // heads_kv
    flags, window_left, window_right, causal_order = variant_flags(is_causal, window, softcap, alibi_slopes,
                                                                   varlen, dropout_p)
    meta = dict(GROUP_SIZE=group, HEAD_DIM=head_dim, BLOCK_D=bd, INPUT_PRECISION=input_precision(q.dtype), **flags)
    bucket = seqlen_bucket(grid_q, grid_k)
    v, do, lse2, delta = tensors["dkdv" if "dkdv" in tensors else "dq"][0][2:6]
    shared = (seqlen_q, seqlen_k, lse2.stride(-2), window_left, window_right, scale, scale * LOG2E,
              *score_mods(scale, softcap, alibi_slopes), dropout_p)
    launches = {}  # name: (kernel, grid, scalars)
    if "dkdv" in tensors:
        dk, dv = tensors["dkdv"][0][6:8]
        launches["dkdv"] = (kernels.dkdv, lambda meta: (cdiv(grid_k, meta["BLOCK_N"]), heads_kv, batch),
                            (*bhr_strides(q, k, v, do, dk, dv, varlen=varlen), heads_kv, *shared,
                             heads_per_group(q, 1 / group, causal_order), bucket))
    if "dq" in tensors:
        dq = tensors["dq"][0][6]
        launches["dq"] = (kernels.dq, lambda meta: (cdiv(grid_q, meta["BLOCK_M"]), heads_q, batch),
                          (*bhr_strides(q, k, v, do, dq, varlen=varlen), heads_q, *shared,
                           heads_per_group(k, group, causal_order), bucket))
    # The descriptors exist before the pick, at the first TMA candidate's tiles; each autotuned launch
    # sets their boxes to its own (autotune.WithDescriptorBoxes). A packed batch takes pointer loads: a
    # tile past a sequence's end would read into the next one.
    if autotune:
        strides = tma_strides(q, k, v, do) if varlen is None else None
        specs = []
        for name, (kernel, grid, scalars) in launches.items():
            descs = _descriptors(name, q, k, v, do, lse2, delta, strides, tma_candidate_tile(name, head_dim, q.dtype),
                                 bd)
            specs.append(LaunchSpec(name, kernel, grid, tensors[name][0], descs, scalars, meta,
                                    autotuner=autotuner(name, kernel, descs[0] is not None),
                                    tune_key=(q.dtype, bucket)))
        return specs
    static = dict(zip(("dkdv", "dq"), configs or backward_configs(head_dim, q.dtype, q.device), strict=True))
    use_tma = (static["dkdv"].use_tma or static["dq"].use_tma) and varlen is None
    strides = tma_strides(q, k, v, do) if use_tma else None
    specs = []
    for name, (kernel, grid, scalars) in launches.items():
        cfg = static[name]
        descs = _descriptors(name, q, k, v, do, lse2, delta, strides,
                             (cfg.block_m, cfg.block_n) if cfg.use_tma else None, bd)
        launch_kwargs = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, USE_TMA=descs[0] is not None,
                             num_warps=cfg.num_warps, num_stages=cfg.num_stages, maxnreg=cfg.max_registers)
        specs.append(LaunchSpec(name, kernel, grid, tensors[name][0], descs, scalars, meta, launch_kwargs,
                                (cfg, strides is not None)))
    return specs


def _descriptors(name: str, q, k, v, do, lse2, delta, strides, tile, bd: int) -> tuple:
    """A backward kernel's descriptors (Nones without TMA): Q, K, V and dO, then for dK/dV (which streams
    them per query tile) L * log2 e and D."""
    descs = attention_descriptors((q, k, v, do), strides, tile, bd)
    if name != "dkdv":
        return descs
    if descs[0] is None:
        return (*descs, None, None)
    return (*descs, *statistics_descriptors(lse2, delta, tile[0]))


def _wanted(grads: tuple, needs: tuple[bool, bool, bool]) -> tuple:
    return tuple(g if need else None for g, need in zip(grads, needs, strict=True))
