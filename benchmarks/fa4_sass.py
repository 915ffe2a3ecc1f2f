"""FlashAttention-4's Hopper kernels compiled offline on a CPU machine, their steady loops counted as
sass_loops.py counts ours: instructions per block and warp, barriers among them, the commonest opcodes. The
CuTe DSL compiles for a target it is told (FLASH_ATTENTION_ARCH picks FA4's sm_90 classes, CUTE_DSL_ARCH the
code, FLASH_ATTENTION_NUM_SMS the H100/H200's 132 SMs), from tensors that carry only shapes (torch's
FakeTensorMode); `--keep-cubin` keeps what ptxas made. FA4's autograd function needs a CUDA build of torch,
so the script calls the two functions under it, `_flash_attn_fwd` and `_flash_attn_bwd`, which choose the
same tiles (flash-attn-4 4.0.0b36). docs/performance.md, entry 144.

FA4 and its dependencies are not the library's: install them beside it, or unpack them into a directory
named by FLASHTRITON_FA4_SITE as for the bench's fa4 provider (flash-attn-4, nvidia-cutlass-dsl and its
libs-base, libs-core and libs-cu13, cuda-bindings, apache-tvm-ffi, torch-c-dlpack-ext, quack-kernels, einops).

    FLASHTRITON_FA4_SITE=<site> PYTHONPATH=src python benchmarks/fa4_sass.py bwd --head-dim 64 --causal
"""

import argparse
import os
import site
import tempfile

import torch

from flashtriton.tools.inspect import cubin_sass, innermost_loops
from sass_loops import describe


def compile_fa4(kind: str, batch: int, heads: int, seqlen: int, head_dim: int, causal: bool) -> list:
    """FA4's compiled kernels for one bf16 call of `kind` ("fwd" or "bwd") at these sizes, in compile order."""
    for name, value in (("FLASH_ATTENTION_ARCH", "sm_90"), ("CUTE_DSL_ARCH", "sm_90a"),
                        ("FLASH_ATTENTION_NUM_SMS", "132")):
        os.environ.setdefault(name, value)
    here = os.getcwd()
    scratch = tempfile.TemporaryDirectory()
    os.chdir(scratch.name)  # (--keep-cubin also writes each cubin into the directory the DSL was imported in)
    if os.environ.get("FLASHTRITON_FA4_SITE"):
        site.addsitedir(os.environ["FLASHTRITON_FA4_SITE"])  # (processes the cutlass wheels' .pth files)
    import cutlass.cute as cute
    from flash_attn.cute import interface
    from torch._subclasses.fake_tensor import FakeTensorMode

    compiled = []
    plain_compile = cute.compile

    def keeping(*args, options: str = "", **kwargs):
        kernel = plain_compile(*args, options=f"{options} --keep-cubin".strip(), **kwargs)
        compiled.append(kernel)
        return kernel

    interface.cute.compile = keeping  # (the module's own reference: FA4 calls cute.compile through it)
    try:
        with FakeTensorMode():
            q, k, v = (torch.empty(batch, seqlen, heads, head_dim, dtype=torch.bfloat16, device="cuda")
                       for _ in range(3))
            if kind == "fwd":
                interface._flash_attn_fwd(q, k, v, causal=causal, return_lse=True)
            else:
                out, dout = torch.empty_like(q), torch.empty_like(q)
                lse = torch.empty(batch, heads, seqlen, dtype=torch.float32, device="cuda")
                interface._flash_attn_bwd(q, k, v, out, dout, lse, causal=causal)
    finally:
        interface.cute.compile = plain_compile
        os.chdir(here)
        scratch.cleanup()
    return compiled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kernel_kind", choices=["fwd", "bwd"])
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seqlen", type=int, default=16384)
    args = parser.parse_args()
    kernels = compile_fa4(args.kernel_kind, args.batch, args.heads, args.seqlen, args.head_dim, args.causal)
    for kernel in kernels:
        cubin = getattr(kernel.artifacts, "CUBIN", None)
        if cubin is None:
            continue
        sass, usage = cubin_sass(cubin)
        lines = sass.splitlines()
        if not any("HGMMA" in line for line in lines):  # (the backward's pre- and post-processing)
            continue
        print(f"kernel: {len(lines)} instructions, {usage}")
        for first, last in innermost_loops(lines):
            arrives = sum("BAR.ARV" in line for line in lines[first:last + 1])
            print(f"loop at {first}: {describe(lines, first, last)}; {arrives} BAR.ARV")


if __name__ == "__main__":
    main()
