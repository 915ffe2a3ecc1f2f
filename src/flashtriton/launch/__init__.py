"""The host side of the kernels: each launcher checks nothing the public API checked, allocates its
outputs, builds its launches and runs them (runner.py: replayed, static or autotuned).

    forward.py     attention_forward: O and L
    backward.py    attention_backward: the statistics, then dK/dV and dQ
    decode.py      attention_decode: a few queries against a KV cache (split-KV, paged), and the append
    gluon_forward.py  the Gluon forward for sm_90 (imported on use; not selected by the API yet)
    dropout.py     dropout's Philox key, and the mask and probabilities a call used
    arguments.py   the kernels' scalar arguments (strides, band, score modifiers, grouping)
    descriptors.py TMA tensor descriptors
    tiles.py       TileConfig, the static tables, the resource model
    autotune.py    the autotuners' candidates, and launching through them
    replay.py      recorded launches and the plan key
    runner.py      LaunchSpec, and the one runner of all three paths
    kernel_set.py  which @triton.jit kernels a call launches
"""

from .. import _interpreter

# First, before anything imports Triton: with TRITON_INTERPRET=1, `import triton.language` already needs NumPy.
_interpreter.require_numpy()

from .arguments import Varlen  # noqa: E402
from .backward import attention_backward, backward_stats, gradient_outputs  # noqa: E402
from .decode import append_to_cache, attention_decode  # noqa: E402
from .dropout import dropout_mask, new_dropout_seed  # noqa: E402
from .forward import attention_forward, empty_in_order, forward_outputs  # noqa: E402
from .kernel_set import DEFAULT_KERNELS, Kernels  # noqa: E402
from .runner import Choice, last_choice  # noqa: E402
from .tiles import TileConfig  # noqa: E402

__all__ = ["Choice", "DEFAULT_KERNELS", "Kernels", "TileConfig", "Varlen", "append_to_cache", "attention_backward",
           "attention_decode", "attention_forward", "backward_stats", "dropout_mask", "empty_in_order",
           "forward_outputs", "gradient_outputs", "last_choice", "new_dropout_seed"]
