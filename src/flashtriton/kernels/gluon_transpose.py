"""V^T for the FP8 forward's P V, made inside the kernel: the load partition transposes each V block in
shared memory (issue 21; FlashAttention-3's in-kernel transpose, the kernel's TRANSPOSE_V).

wgmma takes 8-bit operands only with the reduced dim contiguous, and P V reduces over the keys, so the
FP8 forward reads V^T tiles, (D, keys). Without this, V^T is a copy made before the kernel
(fp8_values.py): one more pass over V per call, 5-8% of the call at 4096 keys (docs/performance.md, entry
121). Here V comes in by TMA as it is, (keys, D), into a raw stage; the loader's four warps read it into
registers, and write it back transposed into the ring's V stage, its keys relabeled in every 16 as the
softmax relabels P's (gluon_forward.py, _probabilities_operand): column 16h + 4t + 2n + j holds key
16h + 8n + 2t + j.

A block goes through registers a piece of keys at a time, 32 bytes per thread: the loader keeps 24
registers (launch/gluon_forward.py, REGISTERS). In a piece, each thread holds keys {k, k+1, k+8, k+9}
(one relabeled 4-column group) at four consecutive dims, so that its loads are 4-byte rows of V and its
stores 4-byte runs of V^T's columns; lanes run over the groups' t and over dims, which Triton stores with
stmatrix (piece_layout).
"""

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

PIECE_BYTES = gl.constexpr(4096)  # per piece of a block: 32 bytes per thread of the loader's 128


@triton.constexpr_function
def piece_layout(keys, dims):
    """The register layout of a (keys, dims) piece of V: a thread's registers hold keys bits 0 and 3 (j, n)
    and dims bits 0 and 1; its lane keys bits 1 and 2 (t) and dims bits 2 to 4; the warps the next two bits
    (dims first), the registers the rest."""
    def bit(dim, b):
        return [1 << b, 0] if dim == 0 else [0, 1 << b]
    key_bits, dim_bits = keys.bit_length() - 1, dims.bit_length() - 1
    regs = [bit(0, 0), bit(0, 3), bit(1, 0), bit(1, 1)]
    lanes = [bit(0, 1), bit(0, 2), bit(1, 2), bit(1, 3), bit(1, 4)]
    rest = [bit(1, b) for b in range(5, dim_bits)] + [bit(0, b) for b in range(4, key_bits)]
    return gl.DistributedLinearLayout(regs + rest[2:], lanes, rest[:2], [], [keys, dims])


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
    PIECE: gl.constexpr = PIECE_BYTES // D  # keys per piece: 64, 32 or 16 at D = 64, 128 or 256
    for i in gl.static_range(KEYS // PIECE):
        x = raw.slice(i * PIECE, PIECE, dim=0).load(piece_layout(PIECE, D))
        # key 16h + 8n + 2t + j -> column 16h + 4t + 2n + j
        x = x.reshape([PIECE // 16, 2, 4, 2, D]).permute((0, 2, 1, 3, 4)).reshape([PIECE, D])
        vt.slice(i * PIECE, PIECE, dim=1).store(x.permute((1, 0)))
