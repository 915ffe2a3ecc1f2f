#!/usr/bin/env bash
# Call 3 of NOTES entry 38: register caps of the dK/dV kernel, then the paper suite's D=128 backward rows
# (GPU 0); the paper suite's D=64 backward rows (GPU 1). ab_base/ as in run1.sh. Run from the repository
# root on the two-GPU machine, with FLASHTRITON_COMMIT set: bash benchmarks/results/h200/ab_stats/run3.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
AB="python3 benchmarks/ab_dkdv.py --package base=ab_base --out $OUT"
(export CUDA_VISIBLE_DEVICES=0; timeout 540 bash -c "$AB --name ab_caps_d64_causal --case 1,16,16384,64,causal \
  --case 4,32,4096,64,causal --case 16,16,1024,64,causal \
  --variant 'before:base:64,64,4,3,tma' \
  --variant 'cap168:.:64,64,4,3,tma:maxnreg=168' \
  --variant 'no cap:.:64,64,4,3,tma' \
  --variant '32x64 cap128:.:32,64,4,3,tma:maxnreg=128' \
  --variant '32x64 s2 cap128:.:32,64,4,2,tma:maxnreg=128' \
  --variant '32x64 s4 cap128:.:32,64,4,4,tma:maxnreg=128' > $OUT/gpu0.log 2>&1; \
  PACK=gpu0.tgz TESTS=0 MERGE=1 BENCH_ARGS='--head-dims 128' bash benchmarks/h200.sh paper bwd,fwd_bwd > $OUT/gpu0_paper.log 2>&1") &
(CUDA_VISIBLE_DEVICES=1 PACK=gpu1.tgz TESTS=0 MERGE=1 BENCH_ARGS="--head-dims 64" timeout 540 \
  bash benchmarks/h200.sh paper bwd,fwd_bwd > $OUT/gpu1.log 2>&1) &
wait
tail -n 25 $OUT/gpu0.log; tail -n 24 $OUT/gpu0_paper.log; tail -n 24 $OUT/gpu1.log
