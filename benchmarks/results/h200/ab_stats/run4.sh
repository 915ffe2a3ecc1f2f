#!/usr/bin/env bash
# Call 4 of NOTES entry 38: the paper suite's backward rows at N <= 2048 alone on one GPU (their eager calls
# are host-bound, and a second suite on the host's other GPU slows them), then the GPU test suite.
# Run from the repository root, with FLASHTRITON_COMMIT set: bash benchmarks/results/h200/ab_stats/run4.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
PACK=small.tgz TESTS=0 MERGE=1 BENCH_ARGS="--seqlens 512,1024,2048" timeout 240 \
  bash benchmarks/h200.sh paper bwd,fwd_bwd > $OUT/small.log 2>&1
timeout 330 python3 -m pytest -q -p no:cacheprovider -n 8 -k "not scale" tests > $OUT/pytest_gpu.log 2>&1
tail -n 3 $OUT/pytest_gpu.log; grep "flashtriton  bwd\|flashtriton  fwd_bwd" $OUT/small.log
