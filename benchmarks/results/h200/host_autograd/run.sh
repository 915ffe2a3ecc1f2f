#!/usr/bin/env bash
# The last call of the session of NOTES entries 35-37: what autograd adds to a forward + backward
# (benchmarks/host_autograd.py), then the paper suite's forward at N = 1024 and 2048 with the tiles of
# entry 36 (merged into paper.json). One H200: bash benchmarks/results/h200/host_autograd/run.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
timeout 100 python3 benchmarks/host_autograd.py --out $OUT 2>&1 | grep -v Warn
FLASHTRITON_COMMIT=${COMMIT:-unknown} TESTS=0 MERGE=1 BENCH_ARGS="--seqlens 1024,2048" timeout 115 \
  bash benchmarks/h200.sh paper fwd 2>&1 | grep "flashtriton  fwd\|^| [0-9]" | head -40
