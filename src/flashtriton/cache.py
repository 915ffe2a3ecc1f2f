"""Everything flashtriton remembers between calls, in one object, with one `reset`.

- `plans`: recorded launches, by plan key (launch/replay.py): a call like an earlier one replays them.
- `picks`: the autotuners' picks, by (autotuner, constexprs, dtype, length bucket) (launch/autotune.py).
- `autotuners`: the Triton autotuners themselves, made on first use for each (kernel, TMA or not).
- `host_values`: cu_seqlens read back to the host, while that very tensor lives unmodified
  (validation.py).
- `kvcache_calls`: KV-cache calls whose arguments passed the checks of everything but the index
  tensors' values, by signature (every tensor's shape, strides, dtype, device and alignment, every
  option), each with the launch prepared for it (launch/decode.py's DecodeCall; kvcache.py).
- `kvcache_families`: the same signatures less what a growing contiguous cache changes each step (its
  length, outer strides, an int length's value), for calls that passed the checks (kvcache.py).
- `checked`: KV-cache index tensors (lengths, block tables) whose values passed the checks, while they
  live unmodified (validation.py).
- `per_step`: what the transformers backend reads from a decoding step's mask or position ids (left
  padding, keys written), while that very tensor lives unmodified: the layers of a step share them
  (integrations/transformers.py).
- `last`: the tiles the latest forward and backward ran, and whether they were replayed (for logs).
- `replays`: set False to launch every kernel through Triton's own launch path (A/B timing, tests).

Pure functions of their arguments (device properties, the static tile tables) are memoised where they
are defined: they hold facts that never change, so there is nothing to reset.
"""

from __future__ import annotations

PLAN_LIMIT = 512  # a workload whose shapes never repeat would otherwise grow `plans` without bound
TABLE_LIMIT = 64  # the other tables' entries: a few per decoding step, or per live tensor, are in use at once


class Cache:
    def __init__(self) -> None:
        self.plans: dict = {}
        self.picks: dict = {}
        self.autotuners: dict = {}
        self.host_values: dict = {}
        self.kvcache_calls: dict = {}
        self.kvcache_families: dict = {}
        self.checked: dict = {}
        self.per_step: dict = {}
        self.last: dict = {}
        self.replays = True

    def remember_plan(self, key, plan) -> None:
        remember(self.plans, key, plan, PLAN_LIMIT)

    def reset(self) -> None:
        """Forget every plan, pick, autotuner timing, host copy and log entry; replays back on."""
        self.plans.clear()
        self.picks.clear()
        for tuner in self.autotuners.values():
            tuner.cache.clear()
        self.host_values.clear()
        self.kvcache_calls.clear()
        self.kvcache_families.clear()
        self.checked.clear()
        self.per_step.clear()
        self.last.clear()
        self.replays = True


CACHE = Cache()


def remember(table: dict, key, value, limit: int = TABLE_LIMIT) -> None:
    """table[key] = value, in one of CACHE's tables, cleared when it holds `limit` entries: a workload
    whose keys never repeat would otherwise grow it without bound."""
    if len(table) >= limit:
        table.clear()
    table[key] = value


def reset() -> None:
    """Forget everything flashtriton remembered between calls (tests, and tools that change tiles)."""
    CACHE.reset()
