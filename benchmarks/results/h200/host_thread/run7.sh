#!/usr/bin/env bash
# Call 9 of NOTES entry 39, on one H200, from the repository root: the forward's recorded launches (replay
# tests, with the forward's own, and the suites' tests of every path that calls it), then host_overhead.py,
# replayed against every launch through Triton.
export PYTHONPATH=src PYTHONUNBUFFERED=1
timeout 130 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_launch.py tests/test_flash_attention.py \
  tests/test_cuda_graph.py tests/test_varlen.py tests/test_dropout.py tests/test_window.py tests/test_score_mods.py \
  > $OUT/pytest_gpu.log 2>&1
tail -n 8 $OUT/pytest_gpu.log
timeout 110 python3 benchmarks/host_overhead.py --out $OUT > $OUT/host_overhead.log 2>&1
tail -n 26 $OUT/host_overhead.log
