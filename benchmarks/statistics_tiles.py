"""The backward's statistics launch (kernels/backward.py: attn_bwd_preprocess_kernel, D = rowsum(dO * O) and
L * log2 e) on an sm_90 GPU, in each of its query-row blocks and warp counts: GPU time alone
(do_bench_cudagraph medians of interleaved rounds) and the bandwidth it reaches on O's and dO's bytes, beside
a copy of O of the same bytes as a yardstick for the memory. Its results are checked against the
library's launch. One JSON line per shape. docs/performance.md, entry 110.

    PYTHONPATH=src python benchmarks/statistics_tiles.py [--shapes 0,1]
"""

import torch

import ab_runs
from flashtriton.kernels.backward import attn_bwd_preprocess_kernel
from flashtriton.launch.arguments import cdiv
from flashtriton.launch.backward import statistics_buffer, statistics_launch

# (batch, heads, N, head dim, causal: unused, the launch has no mask): cs336's shape, the paper suite's
# D = 64 and D = 128 rows, D = 256's backward shape
SHAPES = [(1, 16, 16384, 64, True), (4, 32, 4096, 64, False), (4, 16, 4096, 128, False), (1, 16, 16384, 128, True),
          (4, 16, 2048, 256, False)]
BLOCKS = (32, 64, 128, 256)
WARPS = (2, 4, 8)


def race(batch: int, heads: int, n: int, head_dim: int, causal: bool) -> dict:
    torch.manual_seed(0)
    o, do = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lse = torch.randn(batch, heads, n, device="cuda")
    library = statistics_launch(o, do, lse, *statistics_buffer(lse), None, attn_bwd_preprocess_kernel)
    reference = None
    providers, wrong = {}, []
    for block_m in BLOCKS:
        for warps in WARPS:
            lse2, delta = statistics_buffer(lse)
            spec = statistics_launch(o, do, lse, lse2, delta, None, attn_bwd_preprocess_kernel)
            meta = dict(spec.meta, BLOCK_M=block_m)
            grid = (cdiv(n, block_m), heads, batch)

            def launch(spec=spec, meta=meta, grid=grid, warps=warps):
                attn_bwd_preprocess_kernel[grid](*spec.tensors, *spec.scalars, **meta, num_warps=warps)
            name = f"m{block_m}_w{warps}" + ("_library" if (block_m, warps) == (library.meta["BLOCK_M"], 4) else "")
            launch()
            if reference is None:
                reference = (lse2.clone(), delta.clone())
            elif not (torch.equal(lse2, reference[0]) and torch.allclose(delta, reference[1], rtol=1e-5, atol=1e-5)):
                wrong.append(name)
            providers[name] = launch
    copy = torch.empty_like(o)
    providers["copy_o"] = lambda: copy.copy_(o)
    torch.cuda.synchronize()
    ms = ab_runs.timed_rounds(providers, 5, graphs=True)
    read = 2 * o.numel() * o.element_size()  # O and dO (L and the two outputs are 1/D of it each)
    line = ab_runs.shape_line(batch, heads, n, head_dim, False, 0.0, ms, wrong=wrong)
    line.pop("tflops")
    line["us"] = {name: round(t * 1e3, 1) for name, t in line.pop("ms").items()}
    # (copy_o's on the same bytes: the copy reads O and writes as many)
    line["gb_per_s"] = {name: round(read / t / 1e6) for name, t in ms.items()}
    return line


if __name__ == "__main__":
    ab_runs.main(race, SHAPES, __doc__.split("\n\n")[0])
