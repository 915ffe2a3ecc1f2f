#!/usr/bin/env bash
# NOTES entry 35, second call: the preprocess kernel's own time (cs336, D=128 N=16384), a forward sweep of
# the cs336 shape over the candidates and the never-measured q k^T-ahead forward, and the cs336 suite
# with the providers interleaved. One H200: bash benchmarks/results/h200/kernel_split/run2.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 500 > $OUT/clocks.csv &
smi=$!
timeout 120 python3 benchmarks/kernel_split.py --out $OUT --name kernel_split_delta --peers "" \
  --case 1,16,16384,64,causal --case 1,16,16384,128,causal 2>&1 | grep -v Warn
timeout 150 python3 -m flashtriton sweep --batch 1 --heads 16 --seqlen 16384 --head-dim 64 --causal --jobs 8 \
  --match "M128-N64-w[48]-s[34]-tma(-qka)?$|M128-N128-w8-s3-tma(-qka)?$|M64-N128-w4-s[23]-tma(-qka)?$" --out $OUT/sweeps 2>&1 | grep -v "compile:\|time:" | tail -n 14
FLASHTRITON_COMMIT=${COMMIT:-unknown} TESTS=0 timeout 200 bash benchmarks/h200.sh cs336 2>&1 | tail -n 22
kill $smi
