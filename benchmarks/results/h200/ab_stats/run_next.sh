#!/usr/bin/env bash
# Ran in NOTES entry 39 as host_thread/run1.sh (parts 1 and 2) and host_thread/run5.sh (part 3).
# For the next device session (NOTES.md Open, backward 1 and the missing rows): run from the repository
# root on one H200, with FLASHTRITON_COMMIT set: bash benchmarks/results/h200/ab_stats/run_next.sh
# 1. D=128 causal: the one-loop dK/dV kernel with L and D through TMA (offline: unserialised, 254 registers)
#    against the tree's, whole backward, dQ fixed, interleaved;
# 2. D=128 causal at small N against 698da17 (ab_base/ as in run1.sh, carried): entry 38 left a regression
#    there not ruled out; on static tiles (the kernels) and through the suite's timer (host included);
# 3. the paper suite's backward rows that missed in entry 38's run (causal N=1024, host-bound there; D=128
#    causal N=16384, 1.296x sdpa_flash), alone on the GPU.
export PYTHONPATH=src PYTHONUNBUFFERED=1
sed 's/        if USE_TMA and not ONE_LOOP:/        if USE_TMA and (not ONE_LOOP or MASK_RIGHT):/' \
  src/flashtriton/kernels/backward.py > d128_tma_backward.py
grep -q "not ONE_LOOP or MASK_RIGHT" d128_tma_backward.py || { echo "the sed did not apply"; exit 1; }
timeout 240 python3 benchmarks/ab_dkdv.py --kernel tma=d128_tma_backward.py --name ab_d128_tma_stats --out $OUT \
  --case 4,16,4096,128,causal --case 1,16,16384,128,causal --case 16,16,1024,128,causal \
  --variant "pointer loads:.:64,64,4,2,tma" --variant "TMA statistics:tma:64,64,4,2,tma" > $OUT/ab_d128.log 2>&1
tail -n 12 $OUT/ab_d128.log
timeout 150 python3 benchmarks/ab_dkdv.py --package base=ab_base --name ab_d128_small --out $OUT \
  --case 16,16,1024,128,causal --case 8,16,2048,128,causal \
  --variant "698da17:base:64,64,4,2,tma" --variant "this tree:.:64,64,4,2,tma" > $OUT/ab_d128_small.log 2>&1
tail -n 6 $OUT/ab_d128_small.log
timeout 150 python3 benchmarks/ab_small_backward.py --package base=ab_base --out $OUT > $OUT/ab_small.log 2>&1
tail -n 15 $OUT/ab_small.log
TESTS=0 MERGE=1 BENCH_ARGS="--seqlens 1024,16384" timeout 300 bash benchmarks/h200.sh paper bwd > $OUT/rerun.log 2>&1
grep "flashtriton  bwd" $OUT/rerun.log
