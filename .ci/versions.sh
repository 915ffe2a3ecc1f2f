# The torch/Triton pairs CI tests (.ci/run); pyproject.toml's bounds admit exactly this range
# (tests/test_install.py checks that they agree). Each torch release pins the Triton it was built with.
OLDEST_TORCH=2.11.0   # pins triton 3.6.0: the H200 machine's pair
OLDEST_TRITON=3.6.0
NEWEST_TORCH=2.15.0   # pins triton ~=3.9.0: the newest on PyPI (2026-12-02)
NEWEST_TRITON=3.9.0
