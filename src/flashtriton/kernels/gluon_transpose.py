"""V^T for the FP8 forward's P V, made inside the kernel: the load partition transposes each V block in
shared memory (issue 21; FlashAttention-3's in-kernel transpose, the kernel's TRANSPOSE_V).

wgmma takes 8-bit operands only with the reduced dim contiguous, and P V reduces over the keys, so the
FP8 forward reads V^T tiles, (D, keys). Without this, V^T is a copy made before the kernel
(fp8_values.py): one more pass over V per call, 5-8% of the call at 4096 keys (docs/performance.md, entry
121). Here V comes in by TMA as it is, (keys, D), into a raw stage; the loader's four warps read it into
registers and write it back transposed into the ring's V stage, its keys relabeled in every 16 as the
softmax relabels P's (gluon_forward.py, _probabilities_operand): column 16h + 4t + 2n + j holds key
16h + 8n + 2t + j.

The bytes move as 32-bit words. A thread reads the words of keys k, k + 1, k + 8 and k + 9 (k = 16h + 2t)
at four consecutive dims, whose bytes, transposed as a 4 x 4 matrix (eight byte permutes, _TRANSPOSE),
are the words of V^T's four dims at relabeled columns 16h + 4t to 16h + 4t + 3. A block goes through
registers a piece of keys at a time, 32 bytes per thread (the loader keeps 24 registers:
launch/gluon_forward.py, REGISTERS); lanes run over t and over dims (piece_layout), which makes the
loads conflict-free and lets Triton store the words with stmatrix: at D = 128, per block and thread, 16
8-byte loads, 64 permutes and 8 stmatrix stores.
"""

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .gluon_releases import reinterpret

PIECE_BYTES = gl.constexpr(4096)  # per piece of a block: 32 bytes per thread of the loader's 128
# Four words w(n, j) -> four words o(i), byte 2n + j of o(i) being byte i of w(n, j): $4..$7 are w(0, 0),
# w(0, 1), w(1, 0), w(1, 1); the first two permutes pair bytes 0 and 1 of the j's, the next two bytes 2 and 3.
_TRANSPOSE = gl.constexpr("""{
    .reg .b32 t0, t1, t2, t3;
    prmt.b32 t0, $4, $5, 0x5140;
    prmt.b32 t1, $6, $7, 0x5140;
    prmt.b32 t2, $4, $5, 0x7362;
    prmt.b32 t3, $6, $7, 0x7362;
    prmt.b32 $0, t0, t1, 0x5410;
    prmt.b32 $1, t0, t1, 0x7632;
    prmt.b32 $2, t2, t3, 0x5410;
    prmt.b32 $3, t2, t3, 0x7632;
}""")


@triton.constexpr_function
def piece_layout(keys, words):
    """The register layout of a (keys, words) piece of V read as 32-bit words (4 dims each): a thread's
    registers hold keys bits 0 and 3 (j, n) and words bit 0 (two words, one 8-byte load per key); its lane
    keys bits 1 and 2 (t) and words bits 1 to 3; the warps the next two bits (words first), the registers
    the rest. A warp's loads then take 256 bytes in two conflict-free passes of the 128-byte swizzle."""
    def bit(dim, b):
        return [1 << b, 0] if dim == 0 else [0, 1 << b]
    key_bits, word_bits = keys.bit_length() - 1, words.bit_length() - 1
    regs = [bit(0, 0), bit(0, 3), bit(1, 0)]
    lanes = [bit(0, 1), bit(0, 2), bit(1, 1), bit(1, 2), bit(1, 3)]
    rest = [bit(1, b) for b in range(4, word_bits)] + [bit(0, b) for b in range(4, key_bits)]
    return gl.DistributedLinearLayout(regs + rest[2:], lanes, rest[:2], [], [keys, words])


@triton.constexpr_function
def as_words(layout):
    """A 2-D NVMMA shared layout of 8-bit elements as the same bytes in 32-bit ones (the swizzle is of bytes)."""
    return gl.NVMMASharedLayout(layout.swizzle_byte_width, 32, 2)


@triton.constexpr_function
def values_layout(dims, keys):
    """V^T's (1, 1, D, keys) stage layout: what a TMA descriptor over V^T with that box would have (the
    launcher's, when V^T is copied before the kernel), which the P V wgmma reads either way."""
    return gl.NVMMASharedLayout.get_default_for([1, 1, dims, keys], gl.float8e4nv)


@gluon.jit
def transpose_values(raw, vt):
    """raw (keys, D), V's block as TMA brought it -> vt (D, keys), V^T with its keys relabeled (the module
    docstring), through the calling partition's registers. The caller fences the writes for the tensor
    cores (fence_async_shared) before it hands vt on."""
    KEYS: gl.constexpr = raw.shape[0]
    D: gl.constexpr = raw.shape[1]
    WORDS: gl.constexpr = D // 4
    PIECE: gl.constexpr = PIECE_BYTES // D  # keys per piece: 64, 32 or 16 at D = 64, 128 or 256
    raw_words = reinterpret(raw, gl.int32, [KEYS, WORDS], as_words(raw.layout))
    vt_words = reinterpret(vt, gl.int32, [D, KEYS // 4], as_words(vt.layout))
    for i in gl.static_range(KEYS // PIECE):
        x = raw_words.slice(i * PIECE, PIECE, dim=0).load(piece_layout(PIECE, WORDS))
        # key 16h + 8n + 2t + j -> (h, t, word, n, j); then the four words of each (h, t, word), by (n, j)
        x = x.reshape([PIECE // 16, 2, 4, 2, WORDS]).permute((0, 2, 4, 1, 3))
        j0, j1 = x.split()
        w00, w10 = j0.split()
        w01, w11 = j1.split()
        o0, o1, o2, o3 = gl.inline_asm_elementwise(_TRANSPOSE, "=r,=r,=r,=r,r,r,r,r", [w00, w01, w10, w11],
                                                   dtype=(gl.int32, ) * 4, is_pure=True, pack=1)
        # o(i) is dim 4 word + i at V^T's word 4h + t (columns 16h + 4t to 16h + 4t + 3)
        y = gl.join(gl.join(o0, o1), gl.join(o2, o3))  # (h, t, word, i % 2, i / 2)
        y = y.permute((2, 4, 3, 0, 1)).reshape([D, PIECE // 4])
        vt_words.slice(i * (PIECE // 4), PIECE // 4, dim=1).store(y)
