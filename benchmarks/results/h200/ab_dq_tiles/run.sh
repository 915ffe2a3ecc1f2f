#!/usr/bin/env bash
# NOTES entry 35: dQ tiles of 128 keys per step (never in the sweep's space), interleaved A/B on one H200.
# Run from the repository root: bash benchmarks/results/h200/ab_dq_tiles/run.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
AB="python3 benchmarks/ab_dkdv.py --out $OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu.txt
timeout 380 $AB --name ab_dq_d64 --case 1,16,16384,64,causal --case 1,32,16384,64 --case 4,32,4096,64,causal \
  --variant "dq 128x64 w8 s3:.:64,64,4,3,tma:dq=128/64/8/3/tma" \
  --variant "dq 128x128 w8 s2:.:64,64,4,3,tma:dq=128/128/8/2/tma" \
  --variant "dq 128x128 w8 s3:.:64,64,4,3,tma:dq=128/128/8/3/tma" \
  --variant "dq 64x128 w4 s2:.:64,64,4,3,tma:dq=64/128/4/2/tma" \
  --variant "dq 64x128 w4 s3:.:64,64,4,3,tma:dq=64/128/4/3/tma" \
  --variant "dkdv 128x128 w8 s3:.:128,128,8,3,tma:dq=128/64/8/3/tma" 2>&1 | grep -v Warn
timeout 180 $AB --name ab_dq_d128 --case 1,16,16384,128,causal --case 4,16,4096,128 \
  --variant "dq 128x64 w8 s3:.:64,64,4,2,tma:dq=128/64/8/3/tma" \
  --variant "dq 128x128 w8 s2:.:64,64,4,2,tma:dq=128/128/8/2/tma" \
  --variant "dq 64x128 w4 s2:.:64,64,4,2,tma:dq=64/128/4/2/tma" 2>&1 | grep -v Warn
