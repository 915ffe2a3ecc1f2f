"""The forward's launcher: q (B, Hq, Nq, D) and k, v (B, Hkv, Nk, D) with any strides whose last one is
1, already checked by the public API; allocates O and L, builds the launch and runs it (runner.py)."""

from __future__ import annotations

import torch

from .. import _interpreter
from . import replay
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
from .descriptors import attention_descriptors, tma_strides
from .dropout import new_dropout_seed
from .gluon_forward import attention_forward_gluon, gluon_forward_selected
from .kernel_set import DEFAULT_KERNELS, Kernels
from .runner import LaunchSpec, replay_recorded, run
from .tiles import TileConfig, block_d, forward_config


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: float,
                      config: TileConfig | None = None, autotune: bool | None = None,
                      window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                      alibi_slopes: torch.Tensor | None = None, varlen: Varlen | None = None,
                      dropout_p: float = 0.0, dropout_seed: torch.Tensor | None = None,
                      kernels: Kernels | None = None,
                      seqused_k: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns o like q and lse (B, Hq, Nq) in float32. `config` overrides the tile choice (tuning, tests);
    `autotune` forces the autotuner on or off (default: on for large problems on a GPU); `window` is the
    sliding window (left, right), -1 for unbounded (arguments.band); `softcap` > 0 caps the scores;
    `alibi_slopes` (Hq,) or (B, Hq) float32 adds ALiBi's bias (see flash_attention); `varlen` describes a
    packed batch (Varlen); `dropout_p` > 0 drops probabilities with the Philox key in `dropout_seed` (one
    int64 on q's device; the backward must get the same one); `kernels` replaces the kernels launched;
    `seqused_k` (B,) int32 counts the keys in use of each sequence of a padded k and v (a KV cache), whose
    last Nq positions the queries hold (forward only: no backward takes it)."""
    if (config is None and kernels is None
            and plain_call(window, softcap, alibi_slopes, varlen, dropout_p)
            and gluon_forward_selected(q, k, v, is_causal)):
        return attention_forward_gluon(q, k, v, is_causal, scale, seqused_k=seqused_k)
    heads_q, seqlen_q, head_dim = q.shape[1:]
    o, lse = forward_outputs(q, packed=varlen is not None)
    if o.numel() == 0:
        return o, lse
    batch, grid_q, grid_k = grid_dims(q, k, varlen)
    if autotune is None:
        autotune = (config is None and q.device.type == "cuda"
                    and autotune_by_default(batch * heads_q * grid_q * grid_k * head_dim))
    if dropout_p > 0 and dropout_seed is None:
        dropout_seed = new_dropout_seed(q.device)
    optional = (*variant_pointers(alibi_slopes, varlen, dropout_seed), seqused_k)
    tensors = {"fwd": ((q, k, v, o, lse, *optional), (q, k, v, o))}

    key = None
    if replay.replayable(q.device):
        device, stream = replay.current_device_and_stream()
        key = replay.plan_key(device, (q, k, v, *optional), kernels, is_causal,
                              scale, config, autotune, tuple(window), softcap,
                              None if varlen is None else varlen[2:], dropout_p)
        if replay_recorded("forward", key, tensors, stream):
            return o, lse
    _interpreter.prepare(q.device)
    spec = _forward_launch(tensors["fwd"], q, k, (batch, grid_q, grid_k), is_causal, scale, config, autotune, window,
                           softcap, alibi_slopes, varlen, dropout_p, kernels or DEFAULT_KERNELS)
    run("forward", key, [spec], ("fwd",))
    return o, lse


def empty_in_order(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An uninitialised dense tensor shaped like x (in `dtype`, default x's) whose dims lie in memory in the
    order of x's strides. That is x's own layout when x is dense, as torch.empty_like keeps it; for a slice
    of a bigger tensor (q out of a (B, N, 3, H, D) qkv, seen as (B, H, N, D)) it is the dense layout in the
    same order, here (B, N, H, D), where empty_like would fall back to (B, H, N, D)."""
    if x.is_contiguous():  # the common case, without the sort (this runs on every call's host path)
        return torch.empty_like(x, dtype=dtype)
    order = sorted(range(x.dim()), key=lambda d: -x.stride(d))  # stable: equal strides keep their order
    dense = torch.empty([x.shape[d] for d in order], device=x.device, dtype=dtype or x.dtype)
    return dense.permute(sorted(range(x.dim()), key=order.__getitem__))


def forward_outputs(q: torch.Tensor, packed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """O and L, allocated for q (B, Hq, Nq, D): O laid out like q (empty_in_order), L (B, Hq, Nq) float32.
    A packed batch's O is packed like q, (total_q, Hq, D), seen as (1, Hq, total_q, D). The custom op's
    fake implementation allocates through this too, so that its strides are a real call's."""
    heads_q, seqlen_q, head_dim = q.shape[1:]
    if packed:
        o = torch.empty((seqlen_q, heads_q, head_dim), device=q.device, dtype=q.dtype).permute(1, 0, 2)[None]
    else:
        o = empty_in_order(q)
    return o, torch.empty((q.shape[0], heads_q, seqlen_q), device=q.device, dtype=torch.float32)


def _forward_launch(tensors: tuple, q: torch.Tensor, k: torch.Tensor, dims: tuple[int, int, int], is_causal: bool,
                    scale: float, config: TileConfig | None, autotune: bool, window: tuple[int, int], softcap: float,
                    alibi_slopes: torch.Tensor | None, varlen: Varlen | None, dropout_p: float,
                    kernels: Kernels) -> LaunchSpec:
    (_, _, v, o, *_), desc_sources = tensors
    heads_q, seqlen_q, head_dim = q.shape[1:]
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    batch, grid_q, grid_k = dims  # (arguments.grid_dims)
    bd = block_d(head_dim)
    flags, window_left, window_right, causal_order = variant_flags(is_causal, window, softcap, alibi_slopes,
                                                                   varlen, dropout_p)
    bucket = seqlen_bucket(grid_q, grid_k)
    scalars = (*bhr_strides(q, k, v, o, varlen=varlen), heads_q, seqlen_q, seqlen_k, window_left, window_right,
               scale * LOG2E, *score_mods(scale, softcap, alibi_slopes), dropout_p,
               heads_per_group(k, heads_q // heads_kv, causal_order), bucket)
    meta = dict(GROUP_SIZE=heads_q // heads_kv, HEAD_DIM=head_dim, BLOCK_D=bd,
                INPUT_PRECISION=input_precision(q.dtype), **flags)

    def grid(meta):
        return cdiv(grid_q, meta["BLOCK_M"]), heads_q, batch
    # A packed batch takes pointer loads: a tile past a sequence's end would read into the next one.
    if autotune:
        tile = tma_candidate_tile("fwd", head_dim, q.dtype)  # each autotuned launch sets its own boxes
        strides = tma_strides(*desc_sources) if varlen is None and tile is not None else None
        descs = attention_descriptors(desc_sources, strides, tile, bd)
        return LaunchSpec("fwd", kernels.forward, grid, tensors[0], descs, scalars, meta,
                          autotuner=autotuner("fwd", kernels.forward, strides is not None),
                          tune_key=(q.dtype, bucket))
    # Small problems on a GPU take pointer loads: encoding descriptors would cost more host time than
    # TMA saves. The interpreter takes TMA where it can, so that the CPU tests cover that path.
    cfg = config or forward_config(head_dim, q.dtype, q.device, use_tma=q.device.type != "cuda")
    strides = tma_strides(*desc_sources) if cfg.use_tma and varlen is None else None
    use_tma = strides is not None
    descs = attention_descriptors(desc_sources, strides, (cfg.block_m, cfg.block_n), bd)
    launch_kwargs = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, USE_TMA=use_tma,
                         WARP_SPECIALIZE=use_tma and cfg.warp_specialize, QK_AHEAD=cfg.qk_ahead,
                         num_warps=cfg.num_warps, num_stages=cfg.num_stages, maxnreg=cfg.max_registers)
    return LaunchSpec("fwd", kernels.forward, grid, tensors[0], descs, scalars, meta, launch_kwargs, (cfg, use_tma))
