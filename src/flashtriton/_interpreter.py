"""Running the kernels on CPU tensors through Triton's interpreter (`TRITON_INTERPRET=1`).

The interpreter runs each program with NumPy. It stores bfloat16 as raw uint16 bits, and in Triton 3.6 its
`tl.dot` multiplies those bits as integers (triton-lang/triton#11584, "not supported yet" upstream). The
kernels only ever feed bf16 values to `tl.dot` (everything else is upcast to fp32 first), so converting
the dot's bf16 operands to fp32 is all it takes to run them exactly as a GPU would.

The interpreter also re-patches `triton.language` (walking every member of four modules) at each call of
a @triton.jit helper, though the launch already patched those modules for its whole run: a third of the
CPU suite's time. Helper calls inside a launch skip it when the launch has patched every module they use.
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


def is_active() -> bool:
    """True when the kernels were defined interpreted: Triton reads TRITON_INTERPRET once, when `triton.jit`
    wraps each function, so what counts is its value when flashtriton's kernels were imported. (Not
    memoised: torch.compile traces this, and an isinstance check is as cheap as a cache lookup.)"""
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


@functools.cache  # patches once per process
def _patch_language_once_per_launch() -> None:
    import inspect

    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._patch_lang
    launch_patched: list[set[int]] = []  # ids of the modules the running launch has patched (empty outside)

    def modules_of(fn) -> set[int]:
        return {id(m) for m in fn.__globals__.values() if inspect.ismodule(m) and m in (tl, tl.core)}

    def patch_lang(fn):
        if launch_patched and modules_of(fn) <= launch_patched[-1]:
            return interpreter._LangPatchScope()  # nothing to patch, nothing to restore
        scope = original(fn)
        if launch_patched:  # a helper that uses a module the launch did not patch: now patched, as upstream
            launch_patched[-1] |= modules_of(fn)
            return scope
        launch_patched.append(modules_of(fn))  # the launch itself: its scope is restored when it ends
        restore = scope.restore

        def restore_and_end_launch():
            launch_patched.pop()
            restore()

        scope.restore = restore_and_end_launch
        return scope

    interpreter._patch_lang = patch_lang


def prepare(device: torch.device) -> None:
    """Called before every launch: patches the interpreter once when running on the CPU."""
    if device.type != "cuda" and is_active():
        _patch_bf16_dot()
        _patch_language_once_per_launch()
