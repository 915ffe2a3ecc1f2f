#!/usr/bin/env bash
# Call 1 of NOTES entry 38: the backward's L and D through TMA (this tree) against 698da17 (ab_base/, made by
#   mkdir -p ab_base && git archive 698da17 src/flashtriton | tar -x -C ab_base --strip-components=1).
# Run from the repository root on the two-GPU machine: bash benchmarks/results/h200/ab_stats/run1.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
AB="python3 benchmarks/ab_dkdv.py --package base=ab_base --out $OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.limit --format=csv > $OUT/gpu.txt
(CUDA_VISIBLE_DEVICES=0 timeout 500 $AB --name ab_d64_causal --case 1,16,16384,64,causal --case 4,32,4096,64,causal \
  --variant "before:base:64,64,4,3,tma" \
  --variant "after:.:64,64,4,3,tma" \
  --variant "after cap168:.:64,64,4,3,tma:maxnreg=168" \
  --variant "after s2:.:64,64,4,2,tma" \
  --variant "after s2 cap168:.:64,64,4,2,tma:maxnreg=168" \
  --variant "after 32x64:.:32,64,4,3,tma" \
  --variant "before 32x64:base:32,64,4,3,tma" > $OUT/gpu0.log 2>&1) &
(CUDA_VISIBLE_DEVICES=1 timeout 500 bash -c "$AB --name ab_d128_causal --case 4,16,4096,128,causal --case 1,16,16384,128,causal \
  --variant 'before:base:64,64,4,2,tma' --variant 'after:.:64,64,4,2,tma'; \
  $AB --name ab_noncausal --case 4,32,4096,64 --case 4,16,4096,128 \
  --variant 'before:base:64,64,4,3,tma' --variant 'after:.:64,64,4,3,tma' \
  --variant 'before s2:base:64,64,4,2,tma' --variant 'after s2:.:64,64,4,2,tma'" > $OUT/gpu1.log 2>&1) &
wait
tail -n 30 $OUT/gpu0.log $OUT/gpu1.log
