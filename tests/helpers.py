"""Test-side wrappers over flashtriton.testing (shared with the benchmark's correctness check)."""

from flashtriton.testing import compare_with_reference, make_qkv, max_err

__all__ = ["check_against_reference", "make_qkv", "max_err"]


def check_against_reference(fn, q, k, v, is_causal, scale=None, factor=2.0):
    checks = compare_with_reference(fn, q, k, v, is_causal, scale, factor)
    failed = [str(c) for c in checks if not c.ok]
    assert not failed, "; ".join(failed)
