#!/usr/bin/env bash
# Call 1 of NOTES entry 33: dK/dV loop forms and tiles, interleaved A/B.
# Its kernels: bash benchmarks/results/h200/ab_dkdv_forms/make_kernels.sh first.
# Run from the repository root on the two-GPU machine: bash benchmarks/results/h200/ab_dkdv_forms/run1.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
AB="python3 benchmarks/ab_dkdv.py --kernel head=head_backward.py --kernel forms=loop_forms_backward.py --out $OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu.txt
(CUDA_VISIBLE_DEVICES=0 timeout 530 $AB --name ab_d64_causal --case 1,16,16384,64,causal --case 4,32,4096,64,causal \
  --variant "head 3 loops:head:64,64,4,3,tma" \
  --variant "3 loops new mask:forms:64,64,4,3,tma:LOOP_FORM=1" \
  --variant "masked everywhere:forms:64,64,4,3,tma:LOOP_FORM=3" \
  --variant "interior+edges:forms:64,64,4,3,tma:LOOP_FORM=4" \
  --variant "one loop branch:forms:64,64,4,3,tma:LOOP_FORM=2" \
  --variant "masked everywhere cap168:forms:64,64,4,3,tma:LOOP_FORM=3,maxnreg=168" \
  --variant "masked everywhere 32:forms:32,64,4,3,tma:LOOP_FORM=3" \
  --variant "one loop branch 32:forms:32,64,4,3,tma:LOOP_FORM=2" \
  --variant "interior+edges 32:forms:32,64,4,3,tma:LOOP_FORM=4" \
  --variant "one loop 128:forms:64,128,8,2,tma:LOOP_FORM=2" \
  --variant "masked everywhere 128:forms:64,128,8,2,tma:LOOP_FORM=3" > $OUT/gpu0.log 2>&1) &
(CUDA_VISIBLE_DEVICES=1 timeout 530 bash -c "$AB --name ab_d128_causal --case 4,16,4096,128,causal --case 2,16,8192,128,causal \
  --variant 'head one loop:head:64,128,8,3,tma' \
  --variant 'policy new mask:forms:64,128,8,3,tma' \
  --variant 'masked everywhere:forms:64,128,8,3,tma:LOOP_FORM=3' \
  --variant 'interior+edges:forms:64,128,8,3,tma:LOOP_FORM=4' \
  --variant 'head 3 loops 64:head:64,64,4,2,tma' \
  --variant 'masked everywhere 64 s2:forms:64,64,4,2,tma:LOOP_FORM=3' \
  --variant 'masked everywhere 64 s3:forms:64,64,4,3,tma:LOOP_FORM=3'; \
  $AB --name ab_d64_noncausal --case 2,32,8192,64 \
  --variant 'head:head:64,64,4,3,tma' --variant '32:forms:32,64,4,3,tma' --variant '128 s2:forms:64,128,8,2,tma' \
  --variant '128 s3:forms:64,128,8,3,tma' --variant '128 s2 bp:forms:64,128,8,2'; \
  $AB --name ab_d128_noncausal --case 4,16,4096,128 \
  --variant 'head:head:64,64,4,2,tma' --variant '128 s2:forms:64,128,8,2,tma' --variant '128 s3:forms:64,128,8,3,tma' \
  --variant '64 s3:forms:64,64,4,3,tma'" > $OUT/gpu1.log 2>&1) &
wait
tail -n 40 $OUT/gpu0.log $OUT/gpu1.log
