#!/usr/bin/env bash
# NOTES entry 36: the forward's 64 x 128 tile on TMA against the width's TMA tile (128 x 64), interleaved,
# over the paper suite's shapes and cs336. One H200: bash benchmarks/results/h200/ab_forward_tiles/run.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 500 > $OUT/clocks.csv &
smi=$!
d64=""; d128=""
for bn in "16 1024" "8 2048" "4 4096" "2 8192" "1 16384"; do
  set -- $bn
  d64="$d64 --case $1,32,$2,64 --case $1,32,$2,64,causal"
  d128="$d128 --case $1,16,$2,128 --case $1,16,$2,128,causal"
done
timeout 250 python3 benchmarks/ab_forward.py --out $OUT --name ab_forward_d64 --case 1,16,16384,64,causal $d64 \
  --variant 128,64,4,3,tma --variant 128,64,4,4,tma --variant 128,64,8,3,tma \
  --variant 64,128,4,2,tma --variant 64,128,4,3,tma --variant 64,128,4,2 2>&1 | grep -v Warn
timeout 200 python3 benchmarks/ab_forward.py --out $OUT --name ab_forward_d128 $d128 \
  --variant 128,64,8,3,tma --variant 64,128,4,2,tma --variant 64,64,4,3,tma 2>&1 | grep -v Warn
kill $smi
