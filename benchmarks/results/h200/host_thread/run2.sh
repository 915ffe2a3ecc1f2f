#!/usr/bin/env bash
# Call 2 of NOTES entry 39, on one H200, from the repository root: host against GPU time per do_bench
# iteration at the paper suite's host-bound backward rows, with a profile of our backward there; then the
# GPU test suite (with 05974f5's causal one-loop TMA statistics and entry 38's new tests).
export PYTHONPATH=src PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/host_backward_loop.py --out $OUT > $OUT/host_loop.log 2>&1
grep -v "^ \{10\}\|^$" $OUT/host_loop.log | grep -v "Ordered by\|function calls\|List reduced" | head -90
timeout 330 python3 -m pytest -q -p no:cacheprovider -n 8 -k "not scale" tests > $OUT/pytest_gpu.log 2>&1
tail -n 3 $OUT/pytest_gpu.log
