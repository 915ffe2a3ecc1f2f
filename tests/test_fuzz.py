"""Property-based fuzzing with hypothesis: random shapes, dtypes and every flag, together, against the
float64 reference (O, L, dQ, dK, dV; no NaN; L = -inf exactly where a row sees no key).

The number of cases is FLASHTRITON_FUZZ_EXAMPLES per test (default 12: CI runs them through the
interpreter in about a minute per test, and on a GPU each case's new flags compile four kernels for ~8 s
while one test's cases run serially on one pytest worker). CI draws the same cases every run (derandomised), so
that it cannot turn red by luck; a soak draws fresh ones:

    FLASHTRITON_FUZZ_EXAMPLES=2000 FLASHTRITON_FUZZ_SOAK=1 python -m pytest -q tests/test_fuzz.py

A failing case prints its drawn arguments and seed (hypothesis shrinks it to a small one first).
"""

import os

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from conftest import DEVICE, ON_GPU  # noqa: E402
from flashtriton import attention_ref, flash_attention, flash_attention_varlen, launch  # noqa: E402
from helpers import failed_checks, make_qkv, packed_qkv, reference_per_sequence  # noqa: E402

EXAMPLES = int(os.environ.get("FLASHTRITON_FUZZ_EXAMPLES", "12"))
SOAK = os.environ.get("FLASHTRITON_FUZZ_SOAK") == "1"
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not SOAK, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
MAX_N = 300 if ON_GPU else 80  # the interpreter runs every program in Python: keep CPU cases small


@st.composite
def flags(draw, heads_q: int, batch: int):
    """The keywords every public function takes, each on or off."""
    kwargs = dict(is_causal=draw(st.booleans()))
    if draw(st.booleans()):
        kwargs["window_size"] = (draw(st.integers(-1, MAX_N // 2)), draw(st.integers(-1, MAX_N // 2)))
    if draw(st.booleans()):
        kwargs["scale"] = draw(st.floats(0.01, 2.0))
    if draw(st.integers(0, 3)) == 0:
        kwargs["softcap"] = draw(st.floats(0.5, 60.0))
    if draw(st.integers(0, 3)) == 0:
        shape = (heads_q,) if draw(st.booleans()) else (batch, heads_q)
        kwargs["alibi_slopes"] = torch.rand(shape, device=DEVICE) * draw(st.floats(0.01, 1.0))
    if draw(st.integers(0, 3)) == 0:
        kwargs["dropout_p"] = draw(st.floats(0.05, 0.7))
    return kwargs


def _dropout_mask(kwargs, seed, batch, heads_q, seqlen_q, seqlen_k):
    """The mask the call drew: the same draw of its Philox key after the same manual_seed."""
    if not kwargs.get("dropout_p"):
        return None
    torch.manual_seed(seed)
    return launch.dropout_mask(launch.new_dropout_seed(torch.device(DEVICE)), batch, heads_q, seqlen_q, seqlen_k,
                            kwargs["dropout_p"])


def _check_call(call, inputs, reference, kwargs, seed, mask_shape, label, packed=False):
    """Run `call(q, k, v, return_lse=True, **kwargs)` forward and backward and bound O, L and the gradients
    against `reference(q, k, v, upcast, **kwargs)` with the dropout mask the call drew (mask_shape: batch,
    heads, max Nq, max Nk). An input that no output reaches (an empty packed batch) has zero gradient."""
    torch.manual_seed(seed)
    o, lse = call(*inputs, return_lse=True, **kwargs)
    ref_kwargs = {**kwargs, "dropout_mask": _dropout_mask(kwargs, seed, *mask_shape)}
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, inputs, do, allow_unused=True)
    grads = [torch.zeros_like(x) if g is None else g for g, x in zip(grads, inputs, strict=True)]

    def bound_reference(q, k, v, upcast):
        return reference(q, k, v, upcast=upcast, **ref_kwargs)

    failed = failed_checks(o, lse, grads, inputs, do, bound_reference, packed=packed)
    assert not failed, f"{label} {kwargs}: " + "; ".join(failed)


@st.composite
def dense_cases(draw):
    batch, heads_kv, group = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 3))
    shape = dict(batch=batch, heads_q=heads_kv * group, heads_kv=heads_kv,
                 seqlen_q=draw(st.integers(1, MAX_N)), seqlen_k=draw(st.integers(1, MAX_N)),
                 head_dim=draw(st.sampled_from([1, 5, 16, 24, 40, 64, 80, 128])),
                 dtype=draw(st.sampled_from([torch.float16, torch.bfloat16, torch.float32])))
    return shape, draw(flags(shape["heads_q"], batch)), draw(st.integers(0, 2**31 - 1))


@FUZZ
@given(case=dense_cases())
def test_fuzz_dense_against_reference(case):
    shape, kwargs, seed = case
    torch.manual_seed(seed)
    q, k, v = make_qkv(shape["batch"], shape["heads_q"], shape["heads_kv"], shape["seqlen_q"], shape["seqlen_k"],
                       shape["head_dim"], shape["dtype"], DEVICE)
    _check_call(flash_attention, (q, k, v), attention_ref, kwargs, seed,
                (shape["batch"], shape["heads_q"], shape["seqlen_q"], shape["seqlen_k"]), f"{shape}")


@st.composite
def varlen_cases(draw):
    heads_kv, group = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    count = draw(st.integers(1, 4))
    lengths = [draw(st.lists(st.integers(0, MAX_N // 2), min_size=count, max_size=count)) for _ in range(2)]
    shape = dict(lengths_q=lengths[0], lengths_k=lengths[1], heads_q=heads_kv * group, heads_kv=heads_kv,
                 head_dim=draw(st.sampled_from([8, 16, 40, 64])),
                 dtype=draw(st.sampled_from([torch.float16, torch.bfloat16, torch.float32])))
    return shape, draw(flags(shape["heads_q"], count)), draw(st.integers(0, 2**31 - 1))


@FUZZ
@given(case=varlen_cases())
def test_fuzz_varlen_against_reference(case):
    shape, kwargs, seed = case
    torch.manual_seed(seed)
    q, k, v, cu_q, cu_k = packed_qkv(shape["lengths_q"], shape["lengths_k"], shape["heads_q"], shape["heads_kv"],
                                     shape["head_dim"], shape["dtype"])
    max_q, max_k = max(shape["lengths_q"]), max(shape["lengths_k"])

    def call(q, k, v, **kw):
        return flash_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **kw)

    def reference(q, k, v, upcast, **kw):
        return reference_per_sequence(q, k, v, cu_q, cu_k, upcast, **kw)

    _check_call(call, (q, k, v), reference, kwargs, seed,
                (len(shape["lengths_q"]), shape["heads_q"], max_q, max_k), f"{shape}", packed=True)
