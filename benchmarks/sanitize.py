"""What compute-sanitizer runs (benchmarks/h200.sh with SANITIZE=1): forward and backward of every kernel
on odd shapes, on both data paths (block pointers and TMA), with the variants, each call checked to be
finite; each backward runs twice, the second time replaying the first one's launches. Then the decode
kernels: contiguous and paged caches, ragged lengths from 0 to full, forced tiles and split counts, the
flags, chunked prefills on the dense forward, a growing cache replaying one plan, and CUDA-graph captures
followed by a call of a new shape (the sequence after which two H200 probes saw an illegal memory access,
docs/performance.md entry 40). Small on purpose: under memcheck every memory access is instrumented.
`--gluon`: the Gluon kernels alone (sm_90), through the public API with both paths forced to them: the
forward in bf16 and in FP8 with and without L, the backward with dQ by reductions and deterministic, at
D = 64, 128 and 256, odd shapes and Nk = 1 (the forward's unspecialised twin).

    compute-sanitizer --tool memcheck --error-exitcode 1 python benchmarks/sanitize.py [--quick | --decode | --gluon]
"""

import dataclasses
import itertools
import sys

import torch

from flashtriton import (
    flash_attention,
    flash_attention_fp8,
    flash_attention_varlen,
    flash_attention_with_kvcache,
    launch,
)
from flashtriton.launch.tiles import backward_configs, forward_config
from flashtriton.tools.bench import environment_variable


def _call(q, k, v, causal, tma, bwd=None, **mods) -> None:
    """Forward and backward with the static tiles of q's head dim (or the backward tiles `bwd`), on the
    chosen data path."""
    device, head_dim = q.device, q.shape[-1]
    fwd = forward_config(head_dim, q.dtype, device, use_tma=tma)
    if bwd is None:
        bwd = tuple(dataclasses.replace(c, use_tma=tma) for c in backward_configs(head_dim, q.dtype, device))
    o, lse = launch.attention_forward(q, k, v, causal, head_dim ** -0.5, config=fwd, autotune=False, **mods)
    do = torch.randn_like(o)
    grads = launch.attention_backward(do, q, k, v, o, lse, causal, head_dim ** -0.5, configs=bwd, autotune=False,
                                   **mods)
    assert all(torch.isfinite(x).all() for x in (o, *grads))
    # The same call again replays the first one's recorded launches (launch/replay.py): the same gradients.
    again = launch.attention_backward(do, q, k, v, o, lse, causal, head_dim ** -0.5, configs=bwd, autotune=False,
                                   **mods)
    assert all(torch.equal(a, b) for a, b in zip(grads, again, strict=True))


def main() -> None:
    quick = "--quick" in sys.argv  # one shape and head dim, e.g. for racecheck, which is slower still
    torch.manual_seed(0)
    device = torch.device("cuda")
    if "--decode" in sys.argv:  # the decode kernels alone
        calls = _decode_calls(device)
        torch.cuda.synchronize()
        print(f"sanitize target: {calls} decode calls ran")
        return
    if "--gluon" in sys.argv:
        calls = _gluon_calls(device, quick)
        torch.cuda.synchronize()
        print(f"sanitize target: {calls} Gluon forward and backward calls ran")
        return
    calls = 0

    def qkv(seqlen_q, seqlen_k, head_dim):
        q = torch.randn(2, 4, seqlen_q, head_dim, device=device, dtype=torch.bfloat16)
        k, v = (torch.randn(2, 2, seqlen_k, head_dim, device=device, dtype=torch.bfloat16) for _ in range(2))
        return q, k, v  # GQA: two query heads per key/value head

    shapes = [(97, 130)] if quick else [(1, 1), (97, 130), (130, 97)]
    head_dims = (64,) if quick else (40, 128)
    for (seqlen_q, seqlen_k), head_dim, tma, causal in itertools.product(shapes, head_dims, (False, True),
                                                                         (False, True)):
        _call(*qkv(seqlen_q, seqlen_k, head_dim), causal, tma)
        calls += 1
    if not quick:  # the variants' code paths, once each
        for tma in (False, True):
            q, k, v = qkv(130, 97, 40)
            _call(q, k, v, True, tma, window=(9, 3), softcap=20.0, alibi_slopes=torch.rand(4, device=device))
            _call(q, k, v, True, tma, dropout_p=0.2, dropout_seed=launch.new_dropout_seed(device))
            calls += 2
        # the autotuner's D=128 dK/dV tile of 128 keys (pointer loads, 8 warps) and dQ on TMA, which the
        # static tables never take (its 64 x 64 TMA tile is the static one on TMA, above)
        wide = (launch.TileConfig(64, 128, 8, 3), launch.TileConfig(128, 64, 8, 3, True))
        # and D=64's autotuned dK/dV tile, whose register cap (ptxas .maxnreg) spills a few bytes to local memory
        capped = (launch.TileConfig(64, 64, 4, 3, True, max_registers=168), launch.TileConfig(128, 64, 8, 3, True))
        for seqlen_q, seqlen_k in shapes:
            _call(*qkv(seqlen_q, seqlen_k, 128), True, True, bwd=wide)
            _call(*qkv(seqlen_q, seqlen_k, 64), True, True, bwd=capped)
            calls += 2
        lengths = [0, 17, 1, 130, 63]
        cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)
        q = torch.randn(sum(lengths), 4, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(sum(lengths), 2, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
                for _ in range(2))
        o = flash_attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), is_causal=True)
        o.backward(torch.randn_like(o))
        calls += 1
        calls += _decode_calls(device)
    torch.cuda.synchronize()
    print(f"sanitize target: {calls} forward+backward and decode calls ran")


def _gluon_calls(device, quick: bool) -> int:
    """The Gluon forward and backward through the API, both paths forced to Gluon (every call they support),
    each output checked to be finite; returns the count. GQA with two query heads per KV head."""
    shapes = [(97, 130)] if quick else [(1, 1), (97, 130), (130, 97), (1, 300)]
    calls = 0
    with environment_variable("FLASHTRITON_FORWARD", "gluon"), environment_variable("FLASHTRITON_BACKWARD", "gluon"):
        for (seqlen_q, seqlen_k), head_dim, causal in itertools.product(shapes, (64, 128, 256), (False, True)):
            q = torch.randn(2, 4, seqlen_q, head_dim, device=device, dtype=torch.bfloat16, requires_grad=True)
            k, v = (torch.randn(2, 2, seqlen_k, head_dim, device=device, dtype=torch.bfloat16, requires_grad=True)
                    for _ in range(2))
            o = flash_attention(q, k, v, is_causal=causal)
            assert torch.isfinite(o).all()
            # dQ by reductions and then deterministic (dQ from the Triton dQ kernel)
            for deterministic in (False, True):
                grads = torch.autograd.grad(flash_attention(q, k, v, is_causal=causal, deterministic=deterministic),
                                            (q, k, v), torch.randn_like(o))
                assert all(torch.isfinite(g).all() for g in grads)
            # FP8 with and without L (the second takes the tensor cores' sums)
            q8, k8, v8 = (x.detach().to(torch.float8_e4m3fn) for x in (q, k, v))
            o8, lse = flash_attention_fp8(q8, k8, v8, is_causal=causal, return_lse=True)
            assert torch.isfinite(o8).all() and not torch.isnan(lse).any()
            assert torch.isfinite(flash_attention_fp8(q8, k8, v8, is_causal=causal)).all()
            calls += 1
    return calls


def _decode_calls(device) -> int:
    """The decode launcher on every path it has, each output checked to be finite; returns the count."""
    calls = 0
    lengths = torch.tensor([0, 17, 300, 1, 257], dtype=torch.int32, device=device)
    capacity = 320
    tiles = [None, launch.TileConfig(16, 32, 4, 2), launch.TileConfig(16, 128, 4, 2), launch.TileConfig(32, 256, 8, 2)]
    for head_dim, seqlen_q, page in itertools.product((64, 128), (1, 4), (None, 16, 64, 256)):
        q = torch.randn(5, 8, seqlen_q, head_dim, device=device, dtype=torch.bfloat16)
        k, v = (torch.randn(5, 2, capacity, head_dim, device=device, dtype=torch.bfloat16) for _ in range(2))
        table = None
        if page is not None:  # every sequence's blocks, scattered over a pool with spares
            blocks = -(-capacity // page)
            table = torch.randperm(5 * blocks + 3, device=device)[:5 * blocks].view(5, blocks).to(torch.int32)
            k, v = (torch.randn(5 * blocks + 3, 2, page, head_dim, device=device, dtype=torch.bfloat16)
                    for _ in range(2))
        for tile, splits in itertools.product(tiles, (0, 1, 3, 32)):
            if tile is not None and head_dim == 128 and tile.block_n == 256:
                continue
            o, lse = launch.attention_decode(q, k, v, lengths, head_dim ** -0.5, block_table=table, tiles=tile,
                                             num_splits=splits, is_causal=seqlen_q > 1)
            assert torch.isfinite(o).all()
            calls += 1
        o, lse = launch.attention_decode(q, k, v, lengths, 0.1, block_table=table, window=(40, 0), softcap=10.0,
                                         alibi_slopes=torch.rand(8, device=device), is_causal=True)
        assert torch.isfinite(o).all()
        calls += 1
    # chunked prefills with per-sequence lengths: the dense forward with a key count per sequence
    for head_dim, kwargs in itertools.product((64, 128), (dict(is_causal=True), dict(window=(40, 0), softcap=10.0))):
        q = torch.randn(5, 8, 130, head_dim, device=device, dtype=torch.bfloat16)
        k, v = (torch.randn(5, 2, capacity, head_dim, device=device, dtype=torch.bfloat16) for _ in range(2))
        o, lse = launch.attention_decode(q, k, v, lengths, 0.1, **kwargs)
        assert torch.isfinite(o).all()
        calls += 1
    # a growing cache (a new, longer tensor every step) replays one plan with each step's lengths and strides
    q = torch.randn(3, 8, 1, 128, device=device, dtype=torch.bfloat16)
    for n in (100, 101, 102, 128, 129):
        k, v = (torch.randn(3, 2, n, 128, device=device, dtype=torch.bfloat16) for _ in range(2))
        with torch.no_grad():
            assert torch.isfinite(flash_attention_with_kvcache(q, k, v, n)).all()
        calls += 1
    # CUDA-graph captures of forced splits, then a call of a new, larger shape
    for batch, splits in ((1, 32), (1, 9), (64, 3)):
        q = torch.randn(batch, 32, 1, 128, device=device, dtype=torch.bfloat16)
        k, v = (torch.randn(batch, 8 if batch > 1 else 32, 2048, 128, device=device, dtype=torch.bfloat16)
                for _ in range(2))
        seqlens = torch.full((batch,), 2048, dtype=torch.int32, device=device)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            launch.attention_decode(q, k, v, seqlens, 0.1, num_splits=splits)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(3):
                    o, _ = launch.attention_decode(q, k, v, seqlens, 0.1, num_splits=splits)
            graph.replay()
        torch.cuda.synchronize()
        assert torch.isfinite(o).all()
        calls += 4
    return calls


if __name__ == "__main__":
    main()
