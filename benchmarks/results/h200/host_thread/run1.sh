#!/usr/bin/env bash
# Call 1 of NOTES entry 39, on one H200, from the repository root, with ab_base/ carried (698da17's package,
# see ab_stats/run1.sh): bash benchmarks/results/h200/host_thread/run1.sh
# 1. where autograd's device thread spends the host time of a small backward (host_backward_thread.py);
# 2. and 3. parts 1 and 2 of what entry 38 left to run (its ab_stats/run_next.sh, removed since; part 3
#    ran as run5.sh): D=128 causal one loop with L and D through TMA, and D=128 causal at small N against
#    698da17 on static tiles.
export PYTHONPATH=src PYTHONUNBUFFERED=1
timeout 150 python3 benchmarks/host_backward_thread.py --out $OUT > $OUT/host_thread.log 2>&1
grep -v "^ \{10\}\|^$" $OUT/host_thread.log | grep -v "ncalls\|Ordered by\|function calls" | head -60
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
