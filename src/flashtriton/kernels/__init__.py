"""The kernels: only `@triton.jit` code (and `@gluon.jit` in gluon_forward.py), no torch and no allocation."""
