"""Causal masks on wgmma accumulator tiles, at one comparison with a constant and one select per score
(issue 21).

In wgmma's accumulator layout (m64nNk16) a thread holds, of every 8 columns, the two at 2 (lane % 4) and
2 (lane % 4) + 1. So a column index is `cols & 6`, the part that depends on the lane, plus a constant of
the register. Written as `cols[None, :] <= last[:, None]`, the comparison keeps every column index in a
register and compares register with register; moved to `cols - (cols & 6) <= last - (cols & 6)`, the left
side folds to each register's constant and the right side to one value per row, so that ptxas compares
with an immediate (docs/performance.md, entry 84). Both spellings give the same booleans in any layout.

An FP8 call whose V has its keys contiguous loads K interleaved (launch/gluon_forward.py,
interleaved_keys_map): the accumulator's column 16h + 8n + 2t + j then holds key 16h + 4t + 2n + j,
key_of_column. Its masks compare those keys as they are: folded like the above, the keys' comparisons
spilled registers in the three-warpgroup form at D = 64 (docs/performance.md, entry 123)."""

from triton.experimental import gluon


@gluon.jit
def _folded(cols, bound):
    """(cols, bound) as the comparison takes them: each side less the lane's part of the column index, the
    left a constant per register, the right one value per row and lane part."""
    lane = cols & 6
    return (cols - lane)[None, :], bound[:, None] - lane[None, :]


@gluon.jit
def columns_at_most(cols, last):
    """cols[None, :] <= last[:, None]: `cols` a tile's column indices (SliceLayout(0, accumulator)),
    `last` each row's last visible column (SliceLayout(1, accumulator))."""
    left, right = _folded(cols, last)
    return left <= right


@gluon.jit
def columns_at_least(cols, first):
    """cols[None, :] >= first[:, None], as columns_at_most."""
    left, right = _folded(cols, first)
    return left >= right


@gluon.jit
def key_of_column(cols):
    """The key that each accumulator column holds when K was loaded interleaved: column 16h + 8n + 2t + j
    holds key 16h + 4t + 2n + j, the column of P V's A operand that the column's probability becomes in FP8
    (gluon_forward.py, _probabilities_operand), so that V^T is read in its own order."""
    return (cols & -16) | ((cols & 6) << 1) | ((cols & 8) >> 2) | (cols & 1)
