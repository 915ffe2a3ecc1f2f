#!/usr/bin/env bash
# Call 2 of NOTES entry 38: register caps of the dK/dV kernel (GPU 0), and the cs336 suite autotuned at this
# commit (GPU 1). ab_base/ as in run1.sh. Run from the repository root on the two-GPU machine, with
# FLASHTRITON_COMMIT set: bash benchmarks/results/h200/ab_stats/run2.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
AB="python3 benchmarks/ab_dkdv.py --package base=ab_base --out $OUT"
(CUDA_VISIBLE_DEVICES=0 timeout 500 $AB --name ab_caps_d64_causal --case 1,16,16384,64,causal \
  --case 4,32,4096,64,causal --case 16,16,1024,64,causal \
  --variant "before:base:64,64,4,3,tma" \
  --variant "cap168:.:64,64,4,3,tma:maxnreg=168" \
  --variant "32x64 cap128:.:32,64,4,3,tma:maxnreg=128" \
  --variant "32x64 s2 cap128:.:32,64,4,2,tma:maxnreg=128" \
  --variant "32x64 s4 cap128:.:32,64,4,4,tma:maxnreg=128" > $OUT/gpu0.log 2>&1) &
(CUDA_VISIBLE_DEVICES=1 PACK=gpu1.tgz TESTS=0 timeout 500 bash benchmarks/h200.sh cs336 > $OUT/gpu1.log 2>&1) &
wait
tail -n 25 $OUT/gpu0.log; tail -n 30 $OUT/gpu1.log
