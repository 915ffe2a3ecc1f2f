"""How the FP8 forward's rounding of P to e4m3 moves O's error, emulated in float64 on the CPU (no kernel
runs): plain attention of e4m3-quantized inputs (per tensor, max |x| / 448), P rounded to e4m3 (or bf16)
before P V, O rounded to bf16, RMSE against the float64 attention of the same dequantized inputs. Two
questions of docs/performance.md entry 87: does normalising by the sum of the rounded P (sums_by_mma)
rather than of the fp32 P change the error, and does scaling P by 2^offset before rounding (FlashAttention-4's
"low precision scaling", which keeps small probabilities out of e4m3's subnormals) help. And what the
rounded sums do to L (entry 98): `l_shift_mean` and `l_shift_worst`, log(sum of the rounded P / sum of P)
over the rows, which is how far sums_by_mma moves L; and those of sums of P rounded to bf16 and fp16
instead (entry 99: whether the tensor cores' sums of a 16-bit P would meet L's bound). `--k-scale` widens
the scores: the GPU tests draw K twice as large as Q (scores of standard deviation 2), where the rounding's
bias shows.

    python benchmarks/fp8_rounding_cpu.py [--seqlen 2048] [--head-dim 128] [--k-scale 2]
"""

import argparse

import torch

E4M3 = torch.float8_e4m3fn


def _rmse(o: torch.Tensor, reference: torch.Tensor) -> float:
    """O rounded to bf16, as the kernel stores it, against the reference."""
    return float(f"{(o.to(torch.bfloat16).double() - reference).pow(2).mean().sqrt().item():.3e}")


def emulate(seqlen: int, head_dim: int, heads: int = 4, seed: int = 0, k_scale: float = 1.0) -> list[dict]:
    torch.manual_seed(seed)
    exact = [torch.randn(1, heads, seqlen, head_dim) * (k_scale if i == 1 else 1.0) for i in range(3)]
    descales = [x.abs().amax() / 448 for x in exact]
    q, k, v = ((x / d).to(E4M3).double() * d for x, d in zip(exact, descales, strict=True))
    rows = []
    for causal in (False, True):
        s = q @ k.transpose(-1, -2) * head_dim ** -0.5
        if causal:
            s = s.masked_fill(torch.ones(seqlen, seqlen, dtype=torch.bool).tril().logical_not(), float("-inf"))
        reference = torch.softmax(s, -1) @ v
        p = torch.exp(s - s.amax(-1, keepdim=True))
        for rounded_dtype in (E4M3, torch.bfloat16, torch.float16):
            for offset in ((0, 4, 8) if rounded_dtype == E4M3 else (0, )):
                scaled = p * 2.0 ** offset
                rounded = scaled.float().to(rounded_dtype).double()
                l_shift = (rounded.sum(-1) / scaled.sum(-1)).log()
                rows.append(dict(causal=causal, p_dtype=str(rounded_dtype).removeprefix("torch."), offset=offset,
                                 rmse_sum_fp32_p=_rmse(rounded @ v / scaled.sum(-1, keepdim=True), reference),
                                 rmse_sum_rounded_p=_rmse(rounded @ v / rounded.sum(-1, keepdim=True), reference),
                                 l_shift_mean=float(f"{l_shift.mean().item():.2e}"),
                                 l_shift_worst=float(f"{l_shift.abs().max().item():.2e}")))
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--k-scale", type=float, default=1.0, help="K's standard deviation (Q's and V's: 1)")
    cli = parser.parse_args()
    for row in emulate(cli.seqlen, cli.head_dim, k_scale=cli.k_scale):
        print(row)
