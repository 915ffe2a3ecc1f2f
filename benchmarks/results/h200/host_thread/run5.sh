#!/usr/bin/env bash
# Call 5 of NOTES entry 39, on one H200, from the repository root, with FLASHTRITON_COMMIT set: the paper
# suite's backward rows that missed in entry 38 (causal N = 1024, host-bound; D=128 causal N = 16384),
# alone on the GPU, with the recorded launches and the causal one-loop TMA statistics.
export PYTHONPATH=src PYTHONUNBUFFERED=1
TESTS=0 MERGE=1 BENCH_ARGS="--seqlens 1024,16384" timeout 420 bash benchmarks/h200.sh paper bwd > $OUT/rerun.log 2>&1
grep "flashtriton  bwd\|sdpa_flash  bwd\|flex  bwd" $OUT/rerun.log | head -40
