"""Inputs and error bounds shared by the test suite and the benchmark's correctness checks.

A kernel is judged against a float64 reference, and its error is bounded by a small multiple of the
error that a plain PyTorch attention computed in the same low precision makes against that reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .reference import attention_ref

# Unit roundoff of each input dtype: the "one rounding of the output" slack in the bound.
EPS = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7, torch.float32: 2.0**-23}
ABS_FLOOR = 1e-5  # for outputs that are exactly 0 in the reference (one key: dK = 0)


def make_qkv(batch: int, heads_q: int, heads_kv: int, seqlen_q: int, seqlen_k: int, head_dim: int,
             dtype: torch.dtype, device: torch.device | str, requires_grad: bool = True):
    """Fresh standard-normal (B, H, N, D) q, k, v; never zeros, which hide unwritten outputs."""
    def rand(heads, seqlen):
        x = torch.randn(batch, heads, seqlen, head_dim, dtype=dtype, device=device)
        return x.requires_grad_(requires_grad)
    return rand(heads_q, seqlen_q), rand(heads_kv, seqlen_k), rand(heads_kv, seqlen_k)


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


@dataclass
class Check:
    name: str
    err: float  # max |kernel - float64 reference|
    allowed: float  # factor * (plain low-precision attention's error) + one rounding
    nan: bool

    @property
    def ok(self) -> bool:
        return not self.nan and self.err <= self.allowed

    def __str__(self) -> str:
        return f"{self.name}: err {self.err:.2e} (allowed {self.allowed:.2e}){' NaN' if self.nan else ''}"


def bounded(name: str, out: torch.Tensor, ref: torch.Tensor, low: torch.Tensor, dtype: torch.dtype,
            factor: float = 2.0, extra: float = 0.0) -> Check:
    """`extra`: a further error the algorithm makes by design (see backward_rounding_slack)."""
    if out.shape != ref.shape:
        raise AssertionError(f"{name}: shape {tuple(out.shape)} != {tuple(ref.shape)}")
    slack = EPS[dtype] * (ref.double().abs().max().item() if ref.numel() else 0.0)
    allowed = factor * max_err(low, ref) + slack + ABS_FLOOR + extra
    return Check(name, max_err(out, ref), allowed, bool(torch.isnan(out).any()))


def backward_rounding_slack(o: torch.Tensor, do: torch.Tensor, o64: torch.Tensor, lse64: torch.Tensor,
                            inputs64: tuple[torch.Tensor, ...], packed: bool = False) -> list[float]:
    """What FlashAttention's backward owes, by design, to its own roundings, per input of `inputs64`
    (float64 leaves of the reference's graph, which must still be alive; `o64` is that graph's output).
    Plain attention makes none of these errors, so its error alone cannot bound them. Three terms:

    - The rounding of O: the backward takes D = rowsum(dO * O) from the O it returned, in the inputs'
      precision, so each dS_ij = P_ij (dP_ij - D_i) is off by -P_ij dD_i with dD_i = rowsum(dO * (O - O64)).
      Since P_ij = dL_i / ds_ij, that error is exactly the gradient of -sum_i dD_i L_i, taken through the
      reference's L. It dominates where the true dS is ~0, e.g. a row with one key.
    - Float32 noise between D and dP (below).
    - P recomputed from L in float32 (below).

    `packed`: o is (total, H, D) and L (H, total), flash_attention_varlen's layouts; else L is o.shape[:-1]."""
    if not lse64.requires_grad:  # no key anywhere: no dS to be off
        return [0.0] * len(inputs64)
    finite = torch.isfinite(lse64.detach())

    def per_row(x):  # a per-row quantity of O's layout in L's, 0 on rows that see no key
        x = x.transpose(0, 1) if packed else x
        return torch.where(finite, x, torch.zeros_like(x))

    delta_err = per_row((do.double() * (o.double() - o64.detach())).sum(-1))
    # Plus float32 noise: D and each dP_ij are sums of D products taken in different orders, which differ
    # by a few roundings of the terms' size even where O is exact (one key: O = V). Weighted by a generous
    # 8 roundings of sum |dO * O|, taken through the same gradient with its sign dropped.
    noise = per_row(8 * 2.0**-24 * (do.double() * o64.detach()).abs().sum(-1))
    exact = torch.autograd.grad(lse64, inputs64, -delta_err, retain_graph=True, allow_unused=True)
    rough = torch.autograd.grad(lse64, inputs64, noise, retain_graph=True, allow_unused=True)
    # And P itself: the backward recomputes P_ij = exp2(s_ij c - L_i c) in float32 from L stored in float32,
    # so P_ij is off by a relative ~(|s_ij| + |L_i|) 2^-24 a few times over; where P_ij matters, |s_ij| is
    # within ~17 of |L_i|. Relative errors eps_ij of P move dV_j by sum_i eps_ij P_ij dO_i, which the
    # gradient of O with the upstream |dO| eps_i bounds exactly (P >= 0); for dQ and dK the same gradient
    # is an estimate of the size (their terms carry dS_ij, of either sign), doubled. It matters in float32
    # only (the fuzzer found dV 1.97e-5 against 1.71e-5 at D=128, scale 1.625, |L| ~ 60).
    eps = torch.where(finite, 4 * 2.0**-24 * (2 * lse64.detach().abs() + 17), 0.0)
    eps = eps.transpose(0, 1) if packed else eps  # in O's layout
    recompute = torch.autograd.grad(o64, inputs64, do.double().abs() * eps[..., None], retain_graph=True,
                                    allow_unused=True)

    def size(g):
        return 0.0 if g is None or not g.numel() else torch.nan_to_num(g, nan=0.0).abs().max().item()
    return [size(e) + size(r) + (1 if i == 2 else 2) * size(p)
            for i, (e, r, p) in enumerate(zip(exact, rough, recompute, strict=True))]


def compare_with_reference(fn: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                           scale: float | None = None, factor: float = 2.0,
                           window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: torch.Tensor | None = None) -> list[Check]:
    """Run `fn(q, k, v) -> (o, lse)` on (B, H, N, D) tensors forward and backward and bound O, L, dQ, dK, dV,
    each by `factor` times the error of the plain low-precision attention (plus one rounding). The two
    references run a few batch elements at a time (_references), REFERENCE_SCORES scores at most: the
    batches are independent, and a whole batch's float64 graph (several B·H·Nq·Nk tensors of scores) took
    17-33 GB per test on the GPU suite's long rows."""
    o, lse = fn(q, k, v)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    mods = dict(window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes)
    step = max(1, REFERENCE_SCORES // max(q.shape[1] * q.shape[2] * k.shape[2], 1))
    parts = [_references(q, k, v, o, do, slice(b, b + step), is_causal, scale, mods)
             for b in range(0, max(q.shape[0], 1), step)]
    o64, lse64, low_o, low_lse = (torch.cat([part[i] for part in parts]) for i in range(4))
    ref_grads, low_grads = ([torch.cat([part[i][j] for part in parts]) for j in range(3)] for i in (4, 5))
    slack = [max(part[6][j] for part in parts) for j in range(3)]

    finite = torch.isfinite(lse64)
    checks = [bounded("O", o, o64, low_o, q.dtype, factor),
              bounded("L", lse[finite], lse64[finite], low_lse[finite], q.dtype, factor)]
    # L must be -inf exactly where a row sees no key, and finite elsewhere.
    mismatched = (torch.isneginf(lse) != ~finite).sum().item()
    checks.append(Check("L=-inf rows", float(mismatched), 0.0, False))
    for name, g, ref, low, extra in zip(("dQ", "dK", "dV"), grads, ref_grads, low_grads, slack, strict=True):
        checks.append(bounded(name, g, ref, low, q.dtype, factor, extra))
    return checks


# The most scores (B·Hq·Nq·Nk) compare_with_reference's references take at once: 512 MB of float64 each.
REFERENCE_SCORES = 2 ** 26


def _references(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, do: torch.Tensor,
                batches: slice, is_causal: bool, scale: float | None, mods: dict) -> tuple:
    """The float64 and plain low-precision attention of the batch elements `batches`: (O64, L64, O, L, the
    float64 gradients, the low-precision gradients, backward_rounding_slack)."""
    slopes = mods["alibi_slopes"]
    mods = dict(mods, alibi_slopes=slopes[batches] if slopes is not None and slopes.dim() == 2 else slopes)
    leaves64 = tuple(x[batches].detach().double().requires_grad_() for x in (q, k, v))
    o64, lse64 = attention_ref(*leaves64, is_causal=is_causal, scale=scale, **mods)
    grads64 = torch.autograd.grad(o64, leaves64, do[batches].double(), retain_graph=True)
    slack = backward_rounding_slack(o[batches], do[batches], o64, lse64, leaves64)
    leaves = tuple(x[batches].detach().requires_grad_() for x in (q, k, v))
    low_o, low_lse = attention_ref(*leaves, is_causal=is_causal, scale=scale, upcast=False, **mods)
    low_grads = torch.autograd.grad(low_o, leaves, do[batches])
    return o64.detach(), lse64.detach(), low_o.detach(), low_lse.detach(), grads64, low_grads, slack


def check_shard(attend: Callable, attend_whole: Callable, shard: Callable, whole: tuple[torch.Tensor, ...],
                reference_kwargs: dict) -> list[tuple[Check, float]]:
    """Context parallelism's check, on one rank: `attend(q, k, v) -> (o, lse)` on this rank's shards
    (`shard(x)` of each whole (B, H, N, D) tensor) against float64 on the whole sequence, forward and
    backward with dO = `whole[3]`. Each of O, L, dQ, dK, dV is allowed twice the error that
    `attend_whole` (single-device attention, same signature) makes on the whole sequence; each comes
    with its largest difference from that single-device result, the sharding's own error."""
    q, k, v, do = whole
    leaves64 = [x.double().requires_grad_() for x in (q, k, v)]
    o64, lse64 = attention_ref(*leaves64, **reference_kwargs)
    o64.backward(do.double())
    single = [x.clone().requires_grad_() for x in (q, k, v)]
    o1, lse1 = attend_whole(*single)
    o1.backward(do)
    mine = [shard(x).detach().requires_grad_() for x in (q, k, v)]
    o, lse = attend(*mine)
    o.backward(shard(do))

    def rows(x):  # a (B, H, N) tensor's rows of this shard
        return shard(x[..., None])[..., 0]
    pairs = [("O", o, shard(o64), shard(o1), q.dtype), ("L", lse, rows(lse64), rows(lse1), torch.float32)]
    pairs += [(name, x.grad, shard(x64.grad), shard(x1.grad), q.dtype)
              for name, x, x64, x1 in zip(("dQ", "dK", "dV"), mine, leaves64, single, strict=True)]
    return [(bounded(name, out, ref, low, dtype), max_err(out, low)) for name, out, ref, low, dtype in pairs]
