#!/usr/bin/env bash
# Call 4 of NOTES entry 39 (call 3 never replayed: Triton 3.6's launch hooks are an empty HookChain, not
# None), on one H200, from the repository root: the replay tests, then call 3's host loop again.
export PYTHONPATH=src PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_launch.py tests/test_cuda_graph.py \
  tests/test_flash_attention.py > $OUT/pytest_gpu.log 2>&1
tail -n 6 $OUT/pytest_gpu.log
timeout 200 python3 benchmarks/host_backward_loop.py --out $OUT > $OUT/host_loop.log 2>&1
grep "µs /\|causal:" $OUT/host_loop.log
