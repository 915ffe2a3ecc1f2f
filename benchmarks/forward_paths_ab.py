"""The forward's two paths as a user reaches them, on an sm_90 GPU: `flash_attention` (no gradient) with
FLASHTRITON_FORWARD=triton and with =gluon, beside cuDNN and the Gluon launcher called directly
(`gluon_launch`: what the API adds, in the same process), bf16, in interleaved rounds of `do_bench`
(medians, TFLOP/s on 4·B·H·N²·D, halved when causal). Where `auto` switches paths
(launch/gluon_forward.py AUTO_MIN_KEYS) comes from races like this one; one JSON line per shape, with each
path's largest error against float32 SDPA. docs/performance.md, entries 81 and 84.

    PYTHONPATH=src python benchmarks/forward_paths_ab.py [--shapes 0,1]
"""

import torch
import torch.nn.functional as F

import ab_runs
from flashtriton import flash_attention
from flashtriton.launch import gluon_forward

ROUNDS = 5
# (batch, heads, N, head dim, causal): D = 64, causal and not, around auto's bounds; then D = 256 (9-13)
# and shorter (14, 15), where auto's bounds come from (docs/performance.md, entries 93 and 98); then small calls
SHAPES = [(16, 16, 1024, 64, True), (8, 16, 2048, 64, True), (4, 32, 4096, 64, True), (2, 16, 8192, 64, True),
          (1, 16, 16384, 64, True), (8, 16, 2048, 64, False), (4, 32, 4096, 64, False), (16, 32, 1024, 64, False),
          (8, 32, 2048, 64, False),
          (8, 16, 1024, 256, False), (4, 16, 2048, 256, True), (4, 16, 4096, 256, False), (4, 16, 4096, 256, True),
          (1, 16, 16384, 256, True), (16, 16, 512, 256, False), (8, 16, 1024, 256, True),
          # small calls (16-21), around AUTO_MIN_WORK: 2^30-2^32 of B·H·N²·D, where it moved from 2^33 to 2^31
          # (docs/performance.md, entry 121); a prefill of one short prompt lands here
          (1, 16, 1024, 128, False), (1, 16, 1024, 128, True), (1, 8, 2048, 128, True), (2, 16, 1024, 64, False),
          (1, 16, 2048, 64, True), (4, 8, 512, 128, False)]


def race(batch: int, heads: int, n: int, head_dim: int, causal: bool) -> dict:
    q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)

    def forward():
        with torch.no_grad():
            return flash_attention(q, k, v, is_causal=causal)

    providers = {path: ab_runs.on_path(gluon_forward.FORWARD_PATH_VARIABLE, path, forward)
                 for path in ("triton", "gluon")}
    errors = {path: ab_runs.largest_error(fn(), reference) for path, fn in providers.items()}
    providers["gluon_launch"] = lambda: gluon_forward.attention_forward_gluon(q, k, v, causal, head_dim ** -0.5)
    cudnn = ab_runs.cudnn(q, k, v, causal)
    try:
        cudnn()
        providers["cudnn"] = cudnn
    except RuntimeError:  # (no cuDNN kernel for this shape: the race goes on without it)
        pass
    flops = 4 * batch * heads * n * n * head_dim / (2 if causal else 1)
    return ab_runs.shape_line(batch, heads, n, head_dim, causal, flops, ab_runs.timed_rounds(providers, ROUNDS),
                              err=errors)


if __name__ == "__main__":
    ab_runs.main(race, SHAPES, __doc__.split("\n\n")[0])
