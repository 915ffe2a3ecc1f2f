"""Running the kernels on CPU tensors through Triton's interpreter (`TRITON_INTERPRET=1`).

The interpreter runs each program with NumPy. It stores bfloat16 as raw uint16 bits, and in Triton 3.6 its
`tl.dot` multiplies those bits as integers (triton-lang/triton#11584, "not supported yet" upstream). The
kernels only ever feed bf16 values to `tl.dot` (everything else is upcast to fp32 first), so converting
the dot's bf16 operands to fp32 is all it takes to run them exactly as a GPU would.
"""

from __future__ import annotations

import functools
import os

import torch


def require_numpy() -> None:
    """Raise ImportError with the fix when TRITON_INTERPRET=1 and NumPy is missing: Triton's interpreter
    imports it when it wraps the kernels, and its own error would not say which extra brings it."""
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        return
    try:
        import numpy  # noqa: F401
    except ImportError:
        raise ImportError("TRITON_INTERPRET=1 runs the kernels through Triton's interpreter, which needs NumPy: "
                          "pip install 'flashtriton[cpu]'") from None


@functools.cache  # the kernels are defined once, at import
def is_active() -> bool:
    """True when the kernels were defined interpreted: Triton reads TRITON_INTERPRET once, when `triton.jit`
    wraps each function, so what counts is its value when flashtriton's kernels were imported."""
    from triton.runtime.interpreter import InterpretedFunction

    from .kernels.forward import attn_fwd_kernel

    return isinstance(attn_fwd_kernel, InterpretedFunction)


def switched_on_after_import() -> bool:
    """True when TRITON_INTERPRET=1 is set now but the kernels were compiled ones: set after the import,
    too late to take effect, and Triton would then look for a GPU driver."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1" and not is_active()


@functools.cache  # patches once per process
def _patch_bf16_dot() -> None:
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder_cls = interpreter.InterpreterBuilder
    original = builder_cls.create_dot

    def _to_fp32(handle):
        if handle.dtype.scalar == tl.bfloat16:
            data = interpreter._convert_float(handle.data, tl.bfloat16, tl.float32, None).view(np.float32)
            return interpreter.TensorHandle(data, tl.float32)
        return handle

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, _to_fp32(a), _to_fp32(b), d, input_precision, max_num_imprecise_acc)

    builder_cls.create_dot = create_dot


def prepare(device: torch.device) -> None:
    """Called before every launch: patches the interpreter's bf16 dot once when running on the CPU."""
    if device.type != "cuda" and is_active():
        _patch_bf16_dot()
