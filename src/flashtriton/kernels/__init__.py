"""The Triton kernels: only `@triton.jit` code, no torch and no allocation."""
