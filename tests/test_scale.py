"""Scale, on a big GPU only: a tensor of more than 2^31 elements (64-bit offsets) and a 128k context,
forward and backward, against a float32 reference computed in chunks (plain attention at these sizes
would need hundreds of GB for its score matrix).

The bound: a plain bf16 attention cannot run here to set the yardstick the small tests use, so each
output must be within a few bf16 roundings of the float32 reference's largest value (errors of the
small shapes, measured against float64, sit well inside this).
"""

import dataclasses
import math

import pytest
import torch

BF16_EPS = 2.0**-8
DEVICE = "cuda"


def _gpu_memory_gb() -> float:
    return torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else 0.0


pytestmark = pytest.mark.skipif(_gpu_memory_gb() < 75, reason="needs a GPU with at least 75 GB")


def _chunked_lse(q, k, scale, is_causal, rows=2048):
    """L of every query row of one (Nq, D) head against (Nk, D) keys, float32, in chunks of rows."""
    n_q, n_k = q.shape[0], k.shape[0]
    out = torch.empty(n_q, device=q.device, dtype=torch.float32)
    for start in range(0, n_q, rows):
        s = (q[start:start + rows].float() @ k.float().T) * scale
        if is_causal:
            i = torch.arange(start, min(start + rows, n_q), device=q.device)[:, None] + (n_k - n_q)
            s = s.masked_fill(torch.arange(n_k, device=q.device)[None, :] > i, float("-inf"))
        out[start:start + rows] = torch.logsumexp(s, dim=-1)
    return out


def _probs(q_rows, rows_idx, k, lse_rows, scale, is_causal, n_q):
    """P of the given query rows (float32), from L."""
    s = (q_rows.float() @ k.float().T) * scale
    if is_causal:
        i = rows_idx[:, None] + (k.shape[0] - n_q)
        s = s.masked_fill(torch.arange(k.shape[0], device=k.device)[None, :] > i, float("-inf"))
    return torch.exp(s - lse_rows[:, None])


def _reference_head(q, k, v, do, scale, is_causal, rows, cols, outputs):
    """float32 reference of one head: L, O and dQ of query rows `rows`, dK and dV of key rows `cols` (their
    sums run over every query row, in chunks). dQ and dK are computed for each entry of `outputs`
    (path -> that path's O of this head) with D = rowsum(dO * O) from that O, as FlashAttention's backward
    defines it: O itself is checked against the reference, and D from the rounded O is otherwise the
    dominant error where dS is ~0 (a causal row with one or two keys; see testing.backward_rounding_slack)."""
    n_q = q.shape[0]
    qf, kf, vf, dof = q.float(), k.float(), v.float(), do.float()
    full_lse = _chunked_lse(qf, kf, scale, is_causal)
    p = _probs(qf[rows], rows, kf, full_lse[rows], scale, is_causal, n_q)
    shared = {"L": full_lse[rows], "O": p @ vf}
    refs = {path: dict(shared) for path in outputs}
    dp_rows = dof[rows] @ vf.T
    for path, o in outputs.items():
        d_rows = (dof[rows] * o[rows].float()).sum(-1)
        refs[path]["dQ"] = scale * (p * (dp_rows - d_rows[:, None])) @ kf
        refs[path]["dK"] = torch.zeros(len(cols), k.shape[1], device=k.device)
    dv = torch.zeros(len(cols), k.shape[1], device=k.device)
    for start in range(0, n_q, 4096):
        idx = torch.arange(start, min(start + 4096, n_q), device=q.device)
        p_cols = _probs(qf[idx], idx, kf, full_lse[idx], scale, is_causal, n_q)[:, cols]  # (chunk, cols)
        dv += p_cols.T @ dof[idx]
        dp_cols = dof[idx] @ vf[cols].T
        for path, o in outputs.items():
            d_chunk = (dof[idx] * o[idx].float()).sum(-1)
            refs[path]["dK"] += scale * (p_cols * (dp_cols - d_chunk[:, None])).T @ qf[idx]
    for ref in refs.values():
        ref["dV"] = dv
    return refs


def _run_and_check(batch, heads, seqlen, head_dim, is_causal, heads_to_check, sample, tolerance):
    """Forward and backward on both data paths (pointer loads and TMA, each with its static tiles; the
    autotuner would time every candidate on calls of seconds), then the checked heads of each against one
    float32 reference."""
    from flashtriton import launch
    from flashtriton.launch import tiles
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seqlen, head_dim, device=DEVICE, dtype=torch.bfloat16)
               for _ in range(3))
    do = torch.randn_like(q)
    scale = head_dim ** -0.5
    device = torch.device(DEVICE)
    bwd_cfgs = tiles.backward_configs(head_dim, q.dtype, device)
    kept = {}  # path -> {(b, h): (o, lse, dq, dk, dv)}
    for path, tma in (("pointer loads", False), ("TMA", True)):
        f = tiles.forward_config(head_dim, q.dtype, device, use_tma=tma)
        bw = tuple(dataclasses.replace(c, use_tma=tma) for c in bwd_cfgs)
        o, lse = launch.attention_forward(q, k, v, is_causal, scale, config=f, autotune=False)
        dq, dk, dv = launch.attention_backward(do, q, k, v, o, lse, is_causal, scale, configs=bw, autotune=False)
        for x in (o, dq, dk, dv):
            assert torch.isfinite(x).all(), path
        kept[path] = {(b, h): tuple(x[b, h].clone() for x in (o, lse, dq, dk, dv)) for b, h in heads_to_check}
        del o, lse, dq, dk, dv
    report = {}
    for b, h in heads_to_check:
        rows, cols = sample(seqlen), sample(seqlen)
        refs = _reference_head(q[b, h], k[b, h], v[b, h], do[b, h], scale, is_causal, rows, cols,
                               {path: outs[(b, h)][0] for path, outs in kept.items()})
        for path, outs in kept.items():
            ref = refs[path]
            o, lse, dq, dk, dv = outs[(b, h)]
            got = {"L": lse[rows], "O": o[rows], "dQ": dq[rows], "dK": dk[cols], "dV": dv[cols]}
            report[(path, b, h)] = {name: (got[name].float() - ref[name]).abs().max().item()
                                    / max(ref[name].abs().max().item(), 1.0 if name == "L" else 1e-30)
                                    for name in ref}
    print(report)  # shown with -s; the GPU logs keep it
    for where, errors in report.items():
        bad = {name: err for name, err in errors.items() if err > tolerance[name]}
        assert not bad, f"{where}: relative errors {bad} above {tolerance}"


TOLERANCE = {"L": 1e-5, "O": 2 * BF16_EPS, "dQ": 4 * BF16_EPS, "dK": 4 * BF16_EPS, "dV": 4 * BF16_EPS}


def test_more_than_2_31_elements_forward_and_backward():
    """B=1, H=32, N=532480, D=128 bf16: 2.18e9 elements per tensor, so the last head's rows sit past
    2^31 elements from the start; checked on the first head and on the last head's final rows."""
    seqlen = 532480
    assert 32 * seqlen * 128 > 2**31
    first_past = math.ceil((2**31 - 31 * seqlen * 128) / 128)  # first row of head 31 past 2^31 elements

    def sample(n):
        picks = [0, 1, n // 2, first_past, first_past + 1, n - 2, n - 1]
        return torch.tensor(sorted({min(max(p, 0), n - 1) for p in picks}), device=DEVICE)
    _run_and_check(1, 32, seqlen, 128, True, [(0, 0), (0, 31)], sample, TOLERANCE)


def test_128k_context_forward_and_backward():
    """B=1, H=8, N=131072, D=128 causal bf16, checked on two heads at rows across the whole length."""
    def sample(n):
        return torch.linspace(0, n - 1, 64, device=DEVICE).long()
    _run_and_check(1, 8, 131072, 128, True, [(0, 0), (0, 7)], sample, TOLERANCE)
