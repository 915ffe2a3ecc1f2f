#!/usr/bin/env bash
# NOTES entry 35: the backward split into its kernels at N = 4096-16384 (B * N fixed) next to the peers,
# and dQ's 64 x 128 tile at D=64 non-causal (its JSON is kept in ../ab_dq_tiles/). One H200:
#   bash benchmarks/results/h200/kernel_split/run.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu.txt
timeout 330 python3 benchmarks/kernel_split.py --out $OUT --case 4,16,4096,128,causal --case 2,16,8192,128,causal \
  --case 1,16,16384,128,causal --case 2,32,8192,64 --case 1,32,16384,64 --case 1,16,16384,64,causal 2>&1 | grep -v Warn
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv >> $OUT/gpu.txt
timeout 150 python3 benchmarks/ab_dkdv.py --out $OUT --name ab_dq_d64_noncausal --case 4,32,4096,64 --case 2,32,8192,64 \
  --case 1,32,16384,64 \
  --variant "dq 128x64 w8 s3:.:64,64,4,3,tma:dq=128/64/8/3/tma" \
  --variant "dq 64x128 w4 s3:.:64,64,4,3,tma:dq=64/128/4/3/tma" \
  --variant "dq 64x128 w4 s2:.:64,64,4,3,tma:dq=64/128/4/2/tma" 2>&1 | grep -v Warn
