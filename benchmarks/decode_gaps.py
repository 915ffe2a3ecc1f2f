"""The decode rows still short of issue 20's targets, raced against kernel variants: CUDA-graph µs in
interleaved rounds beside cuDNN (contiguous rows) or the same keys in a contiguous cache (paged rows).
docs/performance.md, entry 64.

Variants are the library's kernel with one change, built from its source at run time (a copy with the
change, imported from a temporary folder), launched with the library's own prepared arguments:
- `evict_first`: K and V loaded with the evict-first L2 policy (a streamed cache has no reuse);
- `heads_fastest`: grid axes 0 and 1 swapped, so that neighbouring programs are neighbouring heads of one
  key range rather than neighbouring key ranges of one head;
the library's kernel with its partials merged in 1 or 2 warps instead of 4, or by `merge_in_chunks` (the
head dim over programs of one warp); and forced split counts, tiles (OTHER_TILES) and pointer loads
(REGISTER_TILES) through `attention_decode`'s own arguments.

    PYTHONPATH=src python benchmarks/decode_gaps.py [--shapes 0,3]
"""

import importlib.util
import tempfile
from pathlib import Path

import torch
import triton
import triton.language as tl

from ab_runs import cudnn, main, timed_rounds
from decode_page16_small import contiguous_copy
from flashtriton import launch
from flashtriton.kernels import decode as decode_kernels
from flashtriton.launch.decode import prepare_decode
from flashtriton.launch.tiles import TileConfig
from flashtriton.tools.decode_bench import DecodeShape, _inputs

ROUNDS = 5
# (B, Hq, Hkv, Nk, Nq, layout, forced split counts): the large contiguous rows that trailed cuDNN in the
# suite at 7643f50, one that did not (B64 32/8 Nk8192), and paged block 16's worst rows.
SHAPES = [(8, 32, 32, 8192, 1, "contiguous", (1, 3, 4)), (8, 32, 32, 32768, 1, "contiguous", (1, 4)),
          (1, 32, 32, 32768, 1, "contiguous", (8, 32)), (1, 32, 8, 131072, 1, "contiguous", (32, 128)),
          (8, 32, 8, 8192, 1, "contiguous", (8, 32)), (8, 32, 8, 8192, 4, "contiguous", (8, 32)),
          (256, 32, 32, 1024, 1, "contiguous", (2,)), (64, 32, 8, 8192, 1, "contiguous", (2,)),
          (64, 32, 8, 1024, 1, "paged16", (1, 4)), (256, 32, 8, 1024, 1, "paged16", (1, 4))]
# Paged block 16 with 32-key tiles in four stages (entry 44's best single-split tile).
SHORT_TILES = TileConfig(16, 32, num_warps=4, num_stages=4)
# Key tiles other than the rule's 64 keys in two stages, on the contiguous rows: more bytes in flight per
# program (three stages, 128 keys) or more warps to issue them.
OTHER_TILES = {"64 keys, 3 stages": TileConfig(16, 64, num_warps=4, num_stages=3),
               "128 keys, 2 stages": TileConfig(16, 128, num_warps=4, num_stages=2),
               "64 keys, 8 warps": TileConfig(16, 64, num_warps=8, num_stages=2)}
# cuDNN's loads (entry 64): pointer loads into registers (one stage: no cp.async ring), latency hidden by
# the programs an SM holds, beside the rule's tiles through pointers rather than TMA.
REGISTER_TILES = {"pointers": None, "pointers, 64 keys, 1 stage": TileConfig(16, 64, num_warps=4, num_stages=1),
                  "pointers, 128 keys, 1 stage": TileConfig(16, 128, num_warps=4, num_stages=1)}

EDITS = {
    "evict_first": [(f"{x} = tl.load({x}_base + {x}_offsets[:, None], mask=kv_mask, other=0.0)",
                     f"{x} = tl.load({x}_base + {x}_offsets[:, None], mask=kv_mask, other=0.0, "
                     "eviction_policy='evict_first')") for x in "kv"],
    "heads_fastest": [("split = tl.program_id(0)", "split = tl.program_id(1)"),
                      ("off_hkv = tl.program_id(1) // m_tiles", "off_hkv = tl.program_id(0) // m_tiles"),
                      ("start_m = (tl.program_id(1) % m_tiles)", "start_m = (tl.program_id(0) % m_tiles)")],
}


def variant_kernel(name: str, folder: Path):
    """attn_decode_kernel with EDITS[name] applied, from a copy of kernels/decode.py in `folder`."""
    source = Path(decode_kernels.__file__).read_text().replace("from .common import",
                                                               "from flashtriton.kernels.common import")
    for old, new in EDITS[name]:
        if source.count(old) != 1:
            raise RuntimeError(f"variant {name}: {old!r} is not in kernels/decode.py exactly once")
        source = source.replace(old, new)
    path = folder / f"decode_{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"decode_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.attn_decode_kernel


MERGE_CHUNK = 32  # head-dim columns per program of merge_in_chunks


@triton.jit
def merge_in_chunks(O_PART, LSE_PART, O, stride_ob, stride_oh, stride_om, num_heads_q, seqlen_q, num_splits,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, CHUNK: tl.constexpr):
    """The library's merge (kernels/decode.py, attn_decode_combine_kernel) with each row's head dim split
    over BLOCK_D // CHUNK programs of one warp (grid axis 2: batch x chunks): every split's partial stays
    in one warp, so the sums over the splits need no barrier across warps; o only, no LSE."""
    chunks: tl.constexpr = BLOCK_D // CHUNK
    token, head = tl.program_id(0), tl.program_id(1)
    off_b, chunk = tl.program_id(2) // chunks, tl.program_id(2) % chunks
    row = (off_b.to(tl.int64) * num_heads_q + head) * seqlen_q + token
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = chunk * CHUNK + tl.arange(0, CHUNK)
    lse_s = tl.load(LSE_PART + row * num_splits + offs_s, mask=offs_s < num_splits, other=float("-inf"))
    lse_max = tl.max(lse_s, 0)
    weight = tl.exp2(lse_s - tl.where(lse_max == float("-inf"), 0.0, lse_max))
    total = tl.sum(weight, 0)
    o_s = tl.load(O_PART + (row * num_splits + offs_s)[:, None] * BLOCK_D + offs_d[None, :],
                  mask=(offs_s < num_splits)[:, None], other=0.0)
    o = tl.sum(o_s * weight[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    o_ptrs = O + off_b.to(tl.int64) * stride_ob + head.to(tl.int64) * stride_oh + token.to(tl.int64) * stride_om
    tl.store(o_ptrs + offs_d, o.to(O.dtype.element_ty), mask=offs_d < HEAD_DIM)


def variant_call(kernel, swap: bool, q, k, v, lengths, table, merge_warps: int = 4, chunked_merge: bool = False):
    """A decoding call through `kernel` with the library's prepared arguments (its split rule and tiles),
    its partials merged by the combine kernel in `merge_warps` warps (the library's until entry 65: 4), or
    with `chunked_merge` by merge_in_chunks."""
    call = prepare_decode(q, k, v, lengths, q.shape[-1] ** -0.5, block_table=table, return_lse=False)
    config = {key: value for key, value in call.config.items() if value is not None}
    grid = (call.grid[1], call.grid[0], call.grid[2]) if swap else call.grid
    batch, heads_q, seqlen_q = call.sizes

    def run():
        o = torch.empty_like(q)
        outs = (o, None)
        if call.splits > 1:
            outs = (q.new_empty((*call.sizes, call.splits, call.block_d), dtype=torch.float32),
                    q.new_empty((*call.sizes, call.splits), dtype=torch.float32))
        tensors = call.decode_tensors(q, k, v, outs, lengths, None, None, table, None, None, None)
        kernel[grid](*tensors, *call.scalars, **call.meta, **config)
        if call.splits > 1 and chunked_merge:
            merge_in_chunks[(seqlen_q, heads_q, batch * (call.block_d // MERGE_CHUNK))](
                *outs, o, *call.combine_scalars, **call.combine_meta, CHUNK=MERGE_CHUNK, num_warps=1)
        elif call.splits > 1:
            decode_kernels.attn_decode_combine_kernel[(seqlen_q, heads_q, batch)](
                *outs, o, None, *call.combine_scalars, **call.combine_meta, num_warps=merge_warps)
        return o
    return run


def race(batch, heads_q, heads_kv, seqlen_k, seqlen_q, layout, splits) -> dict:
    shape = DecodeShape(batch, heads_q, heads_kv, seqlen_k, 128, seqlen_q=seqlen_q, layout=layout)
    torch.manual_seed(0)
    q, k, v, table = _inputs(shape)
    lengths = torch.full((batch,), seqlen_k, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()  # do_bench_cudagraph's side stream does not wait for the inputs

    def ours(**forced):
        return lambda: launch.attention_decode(q, k, v, lengths, 128 ** -0.5, block_table=table, **forced)[0]
    rule = prepare_decode(q, k, v, lengths, 128 ** -0.5, block_table=table)
    providers = {f"rule ({rule.splits})": ours()}
    with tempfile.TemporaryDirectory() as folder:
        for name in EDITS:
            kernel = variant_kernel(name, Path(folder))
            providers[name] = variant_call(kernel, name == "heads_fastest", q, k, v, lengths, table)
        if rule.splits > 1:  # the merge's own latency (2.7-5.9 µs under ncu, entry 64) with fewer warps
            for warps in (1, 2):
                providers[f"merge in {warps} warps"] = variant_call(decode_kernels.attn_decode_kernel, False, q, k,
                                                                    v, lengths, table, warps)
            providers["merge in 32-column chunks"] = variant_call(decode_kernels.attn_decode_kernel, False, q, k, v,
                                                                  lengths, table, chunked_merge=True)
        for count in splits:
            providers[f"splits {count}"] = ours(num_splits=count)
        if layout == "paged16":
            for count in (1, 2, 4):
                providers[f"32-key tiles, splits {count}"] = ours(num_splits=count, tiles=SHORT_TILES)
            kc, vc = contiguous_copy(k, v, table, batch, heads_kv, seqlen_k)
            torch.cuda.synchronize()
            providers["contiguous"] = lambda: launch.attention_decode(q, kc, vc, lengths, 128 ** -0.5)[0]
        else:
            for name, tiles in OTHER_TILES.items():
                providers[name] = ours(tiles=tiles)
            for name, tiles in REGISTER_TILES.items():
                providers[name] = ours(tiles=tiles, tma=False)
            providers["cudnn"] = cudnn(q, k, v)
        with torch.no_grad():
            expected = providers[f"rule ({rule.splits})"]()
            same = {name: torch.equal(fn(), expected) for name, fn in providers.items() if name in EDITS}
            close = {name: bool((fn().float() - expected.float()).abs().max() < 2e-2) for name, fn in providers.items()}
            ms = timed_rounds(providers, ROUNDS, graphs=True)
    base = ms["contiguous" if layout == "paged16" else "cudnn"]
    return dict(shape=f"B{batch} H{heads_q}/{heads_kv} Nk{seqlen_k} Nq{seqlen_q} D128 {layout}",
                us={name: round(t * 1e3, 1) for name, t in ms.items()},
                vs_base={name: round(t / base, 4) for name, t in ms.items()},
                bitwise_equal=same, close=close)


if __name__ == "__main__":
    main(race, SHAPES, __doc__)
