"""The Gluon forward's ablation on a Hopper GPU (the H200's figures are the ones that count): each of its
schedules (launch/gluon_forward.py FORMS: in turn, overlapped, ping-pong) beside the Triton forward (no
warp specialisation) and cuDNN, bf16, in TFLOP/s (forward FLOPs 4·B·H·N²·D, halved when causal). Every
provider of a shape is timed in ROUNDS interleaved rounds of triton.testing.do_bench; the median round is
kept. Errors are max |o - cuDNN's o|.

    PYTHONPATH=src python benchmarks/gluon_forms.py [--out DIR] [--shapes 0,1]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from flashtriton.launch import gluon_forward
from flashtriton.launch.forward import attention_forward
from flashtriton.launch.kernel_set import DEFAULT_KERNELS
from flashtriton.tools.bench import environment

ROUNDS = 5
# (B, H, N, D, causal): the FlashAttention-2 paper's N = 4096 shapes, cs336's, and a short one
SHAPES = [(4, 16, 4096, 128, False), (4, 16, 4096, 128, True), (1, 16, 16384, 128, True),
          (16, 16, 1024, 128, False), (4, 32, 4096, 64, False), (4, 32, 4096, 64, True), (1, 16, 16384, 64, True)]


def providers(q, k, v, causal):
    scale = q.shape[-1] ** -0.5
    # kernels=DEFAULT_KERNELS keeps attention_forward on the Triton kernels (the Gluon path takes only
    # calls with the default kernel set left as None).
    found = {"triton": lambda: attention_forward(q, k, v, causal, scale, kernels=DEFAULT_KERNELS)[0]}
    for form, (overlap, pingpong) in gluon_forward.FORMS.items():
        found[f"gluon {form}"] = (lambda o=overlap, p=pingpong:
                                  gluon_forward.attention_forward_gluon(q, k, v, causal, scale, o, p)[0])

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    found["cudnn"] = cudnn
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--shapes", default=",".join(map(str, range(len(SHAPES)))), help="indices into SHAPES")
    args = parser.parse_args()
    rows = []
    for index in map(int, args.shapes.split(",")):
        b, h, n, d, causal = SHAPES[index]
        torch.manual_seed(index)
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        found = providers(q, k, v, causal)
        reference = found["cudnn"]().float()
        errors = {name: (fn().float() - reference).abs().max().item() for name, fn in found.items()}
        torch.cuda.synchronize()
        times = {name: [] for name in found}
        for _ in range(ROUNDS):
            for name, fn in found.items():
                times[name].append(do_bench(fn, warmup=10, rep=40))
        flops = 4 * b * h * n * n * d / (2 if causal else 1)
        row = dict(batch=b, heads=h, seqlen=n, head_dim=d, causal=causal,
                   ms={name: statistics.median(t) for name, t in times.items()},
                   tflops={name: flops / statistics.median(t) / 1e9 for name, t in times.items()},
                   max_error_vs_cudnn=errors)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gluon_forms.json").write_text(json.dumps(dict(meta=environment(), rows=rows), indent=1))
        names = list(rows[0]["tflops"])
        lines = ["| shape | " + " | ".join(names) + " | best Gluon / cuDNN |", "|---" * (len(names) + 2) + "|"]
        for r in rows:
            best = max(v for name, v in r["tflops"].items() if name.startswith("gluon"))
            shape = f"B{r['batch']} H{r['heads']} N{r['seqlen']} D{r['head_dim']}{' causal' if r['causal'] else ''}"
            lines.append(f"| {shape} | " + " | ".join(f"{r['tflops'][name]:.0f}" for name in names)
                         + f" | {best / r['tflops']['cudnn']:.2f} |")
        title = f"TFLOP/s, bf16, {torch.cuda.get_device_name()} (benchmarks/gluon_forms.py)"
        (args.out / "gluon_forms.md").write_text(title + "\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
