#!/usr/bin/env bash
# Call 2 of NOTES entry 33: D=128 causal mask formulations at more lengths; D=64 tiles and dQ tiles.
# Its kernels: bash benchmarks/results/h200/ab_dkdv_forms/make_kernels.sh first.
# Run from the repository root on the two-GPU machine: bash benchmarks/results/h200/ab_dkdv_forms/run2.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
AB="python3 benchmarks/ab_dkdv.py --kernel head=head_backward.py --kernel forms=loop_forms_backward.py --kernel oldmask=loop_forms_oldmask_backward.py --out $OUT"
(CUDA_VISIBLE_DEVICES=0 timeout 530 $AB --name ab_d128_causal_2 --case 16,16,1024,128,causal --case 1,16,16384,128,causal --case 4,16,4096,128,causal \
  --variant "head one loop:head:64,128,8,3,tma" \
  --variant "new mask everywhere 64 s2:forms:64,64,4,2,tma:LOOP_FORM=3" \
  --variant "new mask everywhere 64 s3:forms:64,64,4,3,tma:LOOP_FORM=3" \
  --variant "new mask everywhere 128 s3:forms:64,128,8,3,tma:LOOP_FORM=3" \
  --variant "new mask everywhere 128 s2:forms:64,128,8,2,tma:LOOP_FORM=3" \
  --variant "old mask everywhere 64 s2:oldmask:64,64,4,2,tma:LOOP_FORM=3" \
  --variant "old mask everywhere 128 s3:oldmask:64,128,8,3,tma:LOOP_FORM=3" \
  --variant "new mask everywhere 64 s2 bp:forms:64,64,4,2:LOOP_FORM=3" > $OUT/gpu0.log 2>&1) &
(CUDA_VISIBLE_DEVICES=1 timeout 530 bash -c "$AB --name ab_d64_causal_2 --case 1,16,16384,64,causal \
  --variant 'head:head:64,64,4,3,tma' \
  --variant 'head cap128:head:64,64,4,3,tma:maxnreg=128' \
  --variant 'head s4:head:64,64,4,4,tma' \
  --variant 'head s2:head:64,64,4,2,tma' \
  --variant 'head dq w4:head:64,64,4,3,tma:dq=128/64/4/3/tma' \
  --variant 'head dq 64:head:64,64,4,3,tma:dq=64/64/4/3/tma' \
  --variant 'head dq s4:head:64,64,4,3,tma:dq=128/64/8/4/tma' \
  --variant 'head dq s2:head:64,64,4,3,tma:dq=128/64/8/2/tma' \
  --variant 'head dq 128x128:head:64,64,4,3,tma:dq=128/128/8/2/tma'; \
  $AB --name ab_d64_noncausal_2 --case 1,32,16384,64 \
  --variant 'head:head:64,64,4,3,tma' \
  --variant 'head s4:head:64,64,4,4,tma' \
  --variant 'head s2:head:64,64,4,2,tma' \
  --variant 'head dq w4:head:64,64,4,3,tma:dq=128/64/4/3/tma' \
  --variant 'head dq 64:head:64,64,4,3,tma:dq=64/64/4/3/tma' \
  --variant 'head dq s4:head:64,64,4,3,tma:dq=128/64/8/4/tma'" > $OUT/gpu1.log 2>&1) &
wait
tail -n 60 $OUT/gpu0.log $OUT/gpu1.log
