"""matplotlib is an optional extra: plots are drawn when it is installed and skipped otherwise."""

from __future__ import annotations


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt
