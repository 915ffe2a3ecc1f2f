#!/usr/bin/env bash
# Call 6 of NOTES entry 38: the paper suite's backward rows at N = 1024 and 2048 alone on one GPU, then
# compute-sanitizer memcheck over benchmarks/sanitize.py. Run from the repository root, with
# FLASHTRITON_COMMIT set: bash benchmarks/results/h200/ab_stats/run6.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
PACK=small.tgz TESTS=0 MERGE=1 BENCH_ARGS="--seqlens 1024,2048" timeout 280 \
  bash benchmarks/h200.sh paper bwd,fwd_bwd > $OUT/small.log 2>&1
timeout 230 compute-sanitizer --tool memcheck --error-exitcode 1 python3 benchmarks/sanitize.py > $OUT/sanitize_memcheck.log 2>&1
echo "memcheck exit $?"; tail -n 3 $OUT/sanitize_memcheck.log
grep "flashtriton  bwd\|flashtriton  fwd_bwd" $OUT/small.log
