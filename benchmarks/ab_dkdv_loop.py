"""A/B in one process (GPU only): this tree's dK/dV kernel against an earlier commit's, same tiles,
interleaved rounds of `triton.testing.do_bench` medians; also the largest difference between their
gradients. NOTES entry 31 compared the one-loop kernel with the three-loop one of 6ebd345:

    git show 6ebd345:src/flashtriton/kernels/backward.py > old_backward.py   # untracked: it travels
    PYTHONPATH=src python benchmarks/ab_dkdv_loop.py --old old_backward.py [--out DIR]
"""

import argparse
import importlib.util
import json
import tempfile
from pathlib import Path

import torch

from ab_backward import interleaved_medians  # this folder is on the path when run as a script
from flashtriton import ops
from flashtriton.testing import make_qkv
from flashtriton.tuning import TileConfig

DQ = TileConfig(128, 64, 8, 3, True)
CASES = [  # (B, H, N, D, causal, dK/dV tiles): the autotuner's usual picks
    (1, 16, 16384, 64, True, TileConfig(64, 64, 4, 3, True)),  # cs336
    (4, 32, 4096, 64, False, TileConfig(64, 64, 4, 3, True)),
    (4, 16, 4096, 128, True, TileConfig(64, 128, 8, 3, True)),
    (4, 16, 4096, 128, False, TileConfig(64, 64, 4, 2, True)),
]


def _load_old_kernel(path: Path):
    """attn_bwd_dkdv_kernel of an earlier backward.py (its relative imports made absolute)."""
    source = path.read_text().replace("from .common import", "from flashtriton.kernels.common import")
    folder = Path(tempfile.mkdtemp())
    (folder / "old_backward.py").write_text(source)  # Triton reads a kernel's source from its file
    spec = importlib.util.spec_from_file_location("old_backward", folder / "old_backward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.attn_bwd_dkdv_kernel


def _backward_with(kernel, default, do, q, k, v, o, lse, causal, configs):
    """The backward with `kernel` as its dK/dV kernel (restored to `default` after each call)."""
    def call():
        ops.attn_bwd_dkdv_kernel = kernel
        try:
            return ops.attention_backward(do, q, k, v, o, lse, causal, q.shape[-1] ** -0.5, configs, False)
        finally:
            ops.attn_bwd_dkdv_kernel = default
    return call


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", type=Path, required=True, help="backward.py of the commit to compare with")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    new_kernel, old_kernel, rows = ops.attn_bwd_dkdv_kernel, _load_old_kernel(args.old), []
    for batch, heads, seqlen, head_dim, causal, dkdv in CASES:
        q, k, v = make_qkv(batch, heads, heads, seqlen, seqlen, head_dim, torch.bfloat16, "cuda", requires_grad=False)
        o, lse = ops.attention_forward(q, k, v, causal, head_dim ** -0.5)
        do = torch.randn_like(o)

        a, b = (_backward_with(kernel, new_kernel, do, q, k, v, o, lse, causal, (dkdv, DQ))
                for kernel in (old_kernel, new_kernel))
        ga, gb = a(), b()
        diff = max((x.float() - y.float()).abs().max().item() / y.float().abs().max().item()
                   for x, y in zip(ga, gb, strict=True))
        told, tnew, times_old, times_new = interleaved_medians(a, b, args.rounds, warmup=10, rep=50)
        rows.append(dict(shape=[batch, heads, seqlen, head_dim], causal=causal, dkdv=dkdv.name, dq=DQ.name,
                         old_ms=told, new_ms=tnew, speedup=told / tnew, max_rel_diff=diff, old_all=times_old,
                         new_all=times_new))
        print(f"B{batch} H{heads} N{seqlen} D{head_dim} causal={causal} {dkdv.name}: old {told:.3f} ms, "
              f"new {tnew:.3f} ms, speedup {told / tnew:.3f}, grads differ by {diff:.1e} (relative)", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ab_dkdv_loop.json").write_text(json.dumps(dict(gpu=torch.cuda.get_device_name(), rows=rows),
                                                               indent=1))


if __name__ == "__main__":
    main()
