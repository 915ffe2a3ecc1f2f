"""Which @triton.jit kernels a call launches: the library's own by default. A tool or test that times or
compiles other kernels (an A/B of a rewritten kernel, `inspect`'s compile-only stand-ins) passes its own
`Kernels` to the launchers' `kernels=`; a call with other kernels records its own launch plan."""

from __future__ import annotations

from typing import NamedTuple

from ..kernels.backward import attn_bwd_dkdv_kernel, attn_bwd_dq_kernel, attn_bwd_preprocess_kernel
from ..kernels.common import dropout_mask_kernel
from ..kernels.forward import attn_fwd_kernel


class Kernels(NamedTuple):
    forward: object = attn_fwd_kernel
    preprocess: object = attn_bwd_preprocess_kernel  # the backward's statistics
    dkdv: object = attn_bwd_dkdv_kernel
    dq: object = attn_bwd_dq_kernel
    dropout_mask: object = dropout_mask_kernel


DEFAULT_KERNELS = Kernels()
