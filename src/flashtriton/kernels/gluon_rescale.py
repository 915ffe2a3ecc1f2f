"""O's rescale in the Gluon forward, skipped by the warps whose rows kept their maxima (issue 21).

The online softmax multiplies O's accumulator by exp2(m_old - m_new) whenever a row's running max grows:
at D = 128 that is 64 multiplies per thread and key block, an eighth of the overlapped loop's
instructions, on the path from the wait for P V to the next products. FlashAttention-4 (on Blackwell)
lets a row keep its old max while the new one is at most RESCALE_THRESHOLD above it: the probabilities
are then exp2(s - m_old), up to 2^RESCALE_THRESHOLD = 256 (within bf16, fp16 and e4m3, whose largest is
448), O and the row sum stay consistent with the old max, and the result is the same softmax. After the
first key blocks a row's max rarely grows that much, so most blocks need no rescale at all; a warp
whose 16 rows all kept theirs (a vote) branches over the multiplies. Gluon has no branch a warp can
take on its own, so the multiplies sit in inline PTX, behind one warp-uniform branch per PACK of a
thread's values; ptxas keeps O in place on both paths (docs/performance.md, entry 86)."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

RESCALE_THRESHOLD = gl.constexpr(8.0)  # in log2 units: probabilities up to 256
PACK = 16  # O's values per inline-asm statement: one branch each (a thread holds D / 2 of them)


def _skippable_multiplies(pack: int) -> str:
    """PTX for `pack` values: outputs $0.., O's values, each row's factor, then the warp's vote; the
    outputs are O's values unchanged when the vote is 0. Every input is read (into temporaries) before any
    output is written, so outputs may share inputs' registers; ptxas gives each output its own input's
    register, and the moves cost nothing."""
    lines = ["{", ".reg .pred %skip;", f".reg .f32 %t<{pack}>;", f"setp.eq.s32 %skip, ${3 * pack}, 0;"]
    lines += [f"mov.f32 %t{i}, ${pack + i};" for i in range(pack)]
    lines += ["@%skip bra.uni SKIP;"]
    lines += [f"mul.f32 %t{i}, %t{i}, ${2 * pack + i};" for i in range(pack)]
    lines += ["SKIP:"]
    lines += [f"mov.f32 ${i}, %t{i};" for i in range(pack)]
    lines += ["}"]
    return "\n".join(lines)


_MULTIPLY = gl.constexpr(_skippable_multiplies(PACK))
_MULTIPLY_CONSTRAINTS = gl.constexpr(",".join(["=f"] * PACK + ["f"] * (2 * PACK) + ["r"] * PACK))
_PACK = gl.constexpr(PACK)
# Over a thread's two rows of wgmma's accumulator layout (rows r and r + 8 of its warp's 16): 1 in every
# thread of the warp if any of its rows has a factor other than 1.
_VOTE = gl.constexpr("{ .reg .pred %any; setp.neu.f32 %any, $2, 0f3F800000; "
                     "setp.neu.or.f32 %any, $3, 0f3F800000, %any; vote.sync.any.pred %any, %any, 0xffffffff; "
                     "selp.s32 $0, 1, 0, %any; mov.b32 $1, $0; }")


@gluon.jit
def keep_max(m_old, m_new):
    """Each row's max for this block: the old one while the new is at most RESCALE_THRESHOLD above it (a
    row that has seen no key, m_old = -inf, takes the new one: the difference is NaN or +inf)."""
    return gl.where(m_new - m_old <= RESCALE_THRESHOLD, m_old, m_new)


@gluon.jit
def rescale_where_needed(acc, alpha):
    """acc * alpha[:, None] (acc in wgmma's accumulator layout, alpha in its row slice), the multiplies
    skipped by every warp whose rows all have alpha == 1."""
    vote = gl.inline_asm_elementwise(_VOTE, "=r,=r,f,f", [alpha], dtype=gl.int32, is_pure=False, pack=2)
    return gl.inline_asm_elementwise(_MULTIPLY, _MULTIPLY_CONSTRAINTS, [acc, alpha[:, None], vote[:, None]],
                                     dtype=gl.float32, is_pure=True, pack=_PACK)
