"""Test setup: choose the device, run the kernels through Triton's interpreter without a GPU, and poison
every `torch.empty` with NaN so that an output element a kernel forgets to write fails the test."""

import os
import zlib

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    # Must be set before flashtriton's kernels are defined: triton.jit reads it at decoration time.
    os.environ["TRITON_INTERPRET"] = "1"

from flashtriton.cache import CACHE, reset  # noqa: E402  (after TRITON_INTERPRET)
from flashtriton.launch import replay  # noqa: E402

DEVICE = "cuda" if ON_GPU else "cpu"


def _poisoned(factory):
    def make(*args, **kwargs):
        out = factory(*args, **kwargs)
        if out.is_floating_point():
            with torch.no_grad():  # (a leaf that requires grad, as Inductor's pattern setup makes, takes it too)
                out.fill_(float("nan"))
        return out
    return make


@pytest.fixture(autouse=True)
def forget_between_tests():
    # Each test records its own launches, picks and host copies (cache.py): a plan recorded by an earlier
    # test would replay past whatever a later one patches or passes.
    reset()


@pytest.fixture(autouse=True)
def poison_empty(monkeypatch):
    monkeypatch.setattr(torch, "empty", _poisoned(torch.empty))
    monkeypatch.setattr(torch, "empty_like", _poisoned(torch.empty_like))


@pytest.fixture(autouse=True)
def fresh_seed(request):
    # Fresh random inputs per test, reproducible from the test's id.
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def replays_through_the_interpreter(monkeypatch):
    """On CPU, plans are recorded and replayed as on a GPU, except that a replay launches its kernel
    through the interpreter with the reassembled arguments (all of them positional, as the compiled
    launcher takes them): what ops records, keys and reassembles gets checked without a GPU."""
    if ON_GPU:
        return
    monkeypatch.setattr(replay, "replayable", lambda device: CACHE.replays)
    monkeypatch.setattr(replay, "current_device_and_stream", lambda: (0, 0))
    monkeypatch.setattr(replay.Recorded, "replay", replay_through_the_jit_function)


def replay_through_the_jit_function(self, prefix, stream, scalars=None, grid=None):
    """replay.Recorded.replay, relaunching the recorded kernel through its jit function (the interpreter on
    CPU; a test's stand-in kernel on any device) instead of the compiled launcher."""
    self.jit_fn[self.launch_grid(grid)](*self.arguments(prefix, scalars))


# The longest tests (the fuzzers' many cases, the offline compiles) first: with `pytest -n 2` they then
# run beside the many short ones instead of alone at the end.
_LONGEST_FIRST = ("test_fuzz.py", "test_compiled.py")


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.path.name not in _LONGEST_FIRST)  # stable: the order within is kept
