"""dQ's float32 buffer in register order (kernels/dq_fragments.py): dq_from_fragments_kernel puts every
warpgroup's share of every query block back in place, through Triton's interpreter on CPU. The Gluon
kernel that fills the buffer runs on sm_90 only (tests/test_gluon.py)."""

import pytest
import torch

from flashtriton.launch import gluon_backward
from flashtriton.launch.arguments import cdiv


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
    """Shares of dQ written chunk by chunk in register order (a chunk per batch, head, query block and
    warpgroup) come back at their rows and columns, exactly, in dQ's dtype; the rows of the last block past
    Nq are dropped and nothing else of dQ is written (NaN-poisoned)."""
    batch, heads = 2, 3
    block_m = gluon_backward.BLOCK_M[head_dim]
    rows, cols = gluon_backward.dq_share(head_dim, block_m, split_rows)
    row, col = _share_positions(rows, cols)
    assert len(set(zip(row.tolist(), col.tolist(), strict=True))) == rows * cols  # one offset per element
    num_m = cdiv(seqlen_q, block_m)
    torch.manual_seed(seqlen_q + head_dim)
    # dQ, its last block padded; values bf16 holds exactly, so that the cast's rounding is not under test
    # (Triton 3.6's interpreter truncates to bf16 where a GPU rounds to nearest)
    full = torch.randn(batch, heads, num_m * block_m, head_dim).to(torch.bfloat16).float()
    blocks = full.view(batch * heads * num_m, block_m, head_dim)
    acc = torch.empty(batch * heads * num_m, gluon_backward.WARPGROUPS, rows, cols)
    for g in range(gluon_backward.WARPGROUPS):
        share = blocks[:, g * rows:(g + 1) * rows] if split_rows else blocks[:, :, g * cols:(g + 1) * cols]
        acc[:, g] = share[:, row, col].view(-1, rows, cols)
    dq = torch.full((batch, heads, seqlen_q, head_dim), float("nan"), dtype=torch.bfloat16)
    gluon_backward.dq_from_accumulator(dq, acc, fragments=True, split_rows=split_rows)
    assert torch.equal(dq, full[:, :, :seqlen_q].to(torch.bfloat16))


def test_dq_accumulator_shapes():
    """The buffer dq_accumulator makes: like q, or one chunk per (batch, head, query block, warpgroup)."""
    q = torch.empty(2, 3, 130, 64)
    assert gluon_backward.dq_accumulator(q, fragments=False).shape == q.shape
    rows, cols = gluon_backward.dq_share(64)
    assert gluon_backward.dq_accumulator(q, fragments=True).shape == (2 * 3 * 2, 2, rows, cols) == (12, 2, 128, 32)
    assert gluon_backward.dq_accumulator(q, fragments=True, split_rows=True).shape == (12, 2, 64, 64)
    assert not gluon_backward.dq_accumulator(q, fragments=True).any()
