"""dQ's float32 buffer in register order (kernels/dq_fragments.py): dq_from_fragments_kernel puts every
warpgroup's share of every query block back in place (on a GPU, or through Triton's interpreter on CPU).
The Gluon kernel that fills the buffer runs on sm_90 only (tests/test_gluon.py)."""

import os
import subprocess
import sys

import pytest
import torch

from conftest import DEVICE
from flashtriton.launch import gluon_backward
from flashtriton.launch.arguments import cdiv
from flashtriton.launch.runner import run


def _share_positions(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, col) in a (rows, cols) share of each offset of its chunk, read off fragment_bits bit by bit."""
    from flashtriton.kernels.dq_fragments import fragment_bits

    offsets = torch.arange(rows * cols)
    position = [torch.zeros_like(offsets), torch.zeros_like(offsets)]
    for i, (dim, bit) in enumerate(fragment_bits(rows, cols)):
        position[dim] |= ((offsets >> i) & 1) << bit
    return position[0], position[1]


@pytest.mark.parametrize("head_dim, split_rows", [(64, False), (64, True), (128, False)])
@pytest.mark.parametrize("seqlen_q", [1, 97, 130])
def test_dq_from_fragments_puts_each_share_back(head_dim, split_rows, seqlen_q):
    """Shares of dQ / scale written chunk by chunk in register order (a chunk per batch, head, query block
    and warpgroup), as the Gluon kernel adds them, come back at their rows and columns times the scale,
    exactly (a power of two), in dQ's dtype; the rows of the last block past Nq are dropped and nothing
    else of dQ is written (NaN-poisoned)."""
    batch, heads = 2, 3
    block_m = gluon_backward.BLOCK_M[head_dim]
    rows, cols = gluon_backward.dq_share(head_dim, block_m, split_rows)
    row, col = _share_positions(rows, cols)
    assert len(set(zip(row.tolist(), col.tolist(), strict=True))) == rows * cols  # one offset per element
    num_m = cdiv(seqlen_q, block_m)
    torch.manual_seed(seqlen_q + head_dim)
    # dQ, its last block padded; values bf16 holds exactly, so that the cast's rounding is not under test
    # (Triton 3.6's interpreter truncates to bf16 where a GPU rounds to nearest)
    full = torch.randn(batch, heads, num_m * block_m, head_dim).to(torch.bfloat16).float().to(DEVICE)
    blocks = full.view(batch * heads * num_m, block_m, head_dim)
    acc = torch.empty(batch * heads * num_m, gluon_backward.WARPGROUPS, rows, cols, device=DEVICE)
    for g in range(gluon_backward.WARPGROUPS):
        share = blocks[:, g * rows:(g + 1) * rows] if split_rows else blocks[:, :, g * cols:(g + 1) * cols]
        acc[:, g] = share[:, row, col].view(-1, rows, cols) / 0.125
    dq = torch.full((batch, heads, seqlen_q, head_dim), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    run("dq_fragments", None, [gluon_backward.dq_fragments_spec(dq, acc, 0.125)], ())  # (as a backward's plan)
    assert torch.equal(dq, full[:, :, :seqlen_q].to(torch.bfloat16))


def test_dq_accumulator_shapes():
    """The buffer dq_accumulator makes: like q, or one chunk per (batch, head, query block, warpgroup), each
    warpgroup's share half the block's rows at D = 64 (split_dq_by_rows) and half of D's columns at 128."""
    q = torch.empty(2, 3, 130, 64)
    assert gluon_backward.dq_accumulator(q, fragments=False).shape == q.shape
    rows, cols = gluon_backward.dq_share(64)
    assert gluon_backward.dq_accumulator(q, fragments=True).shape == (2 * 3 * 2, 2, rows, cols) == (12, 2, 64, 64)
    assert gluon_backward.dq_accumulator(q, fragments=True, split_rows=False).shape == (12, 2, 128, 32)
    assert gluon_backward.dq_accumulator(torch.empty(2, 3, 130, 128), fragments=True).shape == (2 * 3 * 3, 2, 64, 64)
    assert not gluon_backward.dq_accumulator(q, fragments=True).any()


def test_dq_from_fragments_compiles_for_sm_90():
    """The same kernel compiled for sm_90 (offline, in a process without TRITON_INTERPRET): Triton's compiler
    takes the permutation only as a literal tuple, which the interpreter does not check."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.join(os.path.dirname(__file__), "..", "src") + os.pathsep + env.get("PYTHONPATH", "")
    script = """
import torch
from flashtriton.kernels.dq_fragments import dq_from_fragments_kernel
from flashtriton.tools.inspect import HOPPER, _compile_offline
for rows, cols, split, head_dim in ((128, 32, False, 64), (64, 64, True, 64), (64, 64, False, 128)):
    acc, dq = torch.empty(12, 2, rows, cols), torch.empty(2, 3, 130, head_dim, dtype=torch.bfloat16)
    compiled = _compile_offline(dq_from_fragments_kernel, (24, ), (acc, dq, *dq.stride()[:3], 3, 2, 130, 0.125, rows,
                                cols, 2, split), dict(num_warps=4), HOPPER)
    assert "STG" in compiled.asm["sass"]
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
