#!/usr/bin/env bash
# Call 3 of NOTES entry 39, on one H200, from the repository root: the backward's recorded launches
# (launch.py) against Triton's launch path, host and GPU time per do_bench iteration at the suite's
# host-bound rows; then the GPU test suite, which replays wherever a test repeats a backward.
export PYTHONPATH=src PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/host_backward_loop.py --out $OUT > $OUT/host_loop.log 2>&1
grep "µs /\|causal:" $OUT/host_loop.log
timeout 340 python3 -m pytest -q -p no:cacheprovider -n 8 -k "not scale" tests > $OUT/pytest_gpu.log 2>&1
tail -n 12 $OUT/pytest_gpu.log
