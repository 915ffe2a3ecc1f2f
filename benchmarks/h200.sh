#!/usr/bin/env bash
# Everything the H200 run checks and times, in one call, in this order (the suites come early so that a
# run cut short by the device's time limit keeps them):
#   1. the test suite on the GPU (larger sizes than on CPU), then the attention tests with the Gluon paths
#      forced (FLASHTRITON_FORWARD=gluon FLASHTRITON_BACKWARD=gluon)       -> pytest_gpu.log, pytest_gpu_gluon.log
#   2. python -m flashtriton bench for each suite: correctness against float64, then the suite's table
#      against the peers                                                    -> <suite>.json/.md/.png, bench_<suite>.log
#   3. with SWEEP=1, the forward tile sweep on the FlashAttention-2 paper's D=64 and D=128 shapes
#                                                                            -> sweeps/sweep_*.csv/.md/.png
#   4. with HOST=1, where the host time of a small call goes              -> host_overhead.json, *_profile.txt
#   5. with FIRST=1, what a first call costs (compiling, autotuning)        -> first_call.json
#   6. with SANITIZE=1, compute-sanitizer memcheck and racecheck over benchmarks/sanitize.py -> sanitize_*.log
#   7. with ROOFLINE=1, the ceilings, the roofline and an ncu profile      -> roofline.json/.md/.png, ncu_*.csv
# BENCH_ARGS passes more arguments to every bench (e.g. "--head-dims 64"); with MERGE=1 the suite's
# committed <suite>.json is the starting point and the new rows replace or join its rows.
# Without $OUT everything lands in benchmarks/results/h200/. With $OUT (the device tool's output folder,
# which returns at most 8 files) it travels packed as $OUT/results.tgz, refreshed after every step so a
# run cut short keeps what it finished: unpack it into benchmarks/results/h200/. PACK renames the archive, so
# that runs on several GPUs of one machine can go side by side, e.g. on two:
#   CUDA_VISIBLE_DEVICES=0 PACK=gpu0.tgz bash benchmarks/h200.sh cs336 & \
#   CUDA_VISIBLE_DEVICES=1 PACK=gpu1.tgz TESTS=0 bash benchmarks/h200.sh paper; wait
# and a suite split across them joins again with benchmarks/merge_results.py.
# Usage: [SWEEP=1] [SWEEPS="<sweep args>;..."] [SANITIZE=1] [ROOFLINE=1] [HOST=1] [FIRST=1] [TESTS=0] [TESTS_K=expr] [BENCH_ARGS=...] [MERGE=1] bash benchmarks/h200.sh [suites] [modes]
#   e.g. bash benchmarks/h200.sh "article paper cs336"        (modes default per suite; see --help)
set -uo pipefail
suites=${1:-article}
modes=${2:-}
if [ -n "${OUT:-}" ]; then out=$(mktemp -d); else out=benchmarks/results/h200; fi
mkdir -p "$out"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# The device copy of the tree has no .git: pass FLASHTRITON_COMMIT=$(git rev-parse --short HEAD) in.
export FLASHTRITON_COMMIT=${FLASHTRITON_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
pack() { [ -z "${OUT:-}" ] || tar czf "$OUT/${PACK:-results.tgz}" -C "$out" . ; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/gpu.txt"

workers=$(( $(nproc) / 2 )); [ "$workers" -gt 8 ] && workers=8
if [ "${TESTS:-1}" = 1 ]; then  # TESTS_K narrows the GPU suite with pytest -k
  # --durations: the whole suite outlasts one 10-minute device call, and its slowest tests say where to cut
  python3 -m pytest -q -p no:cacheprovider -n "$workers" --durations=40 ${TESTS_K:+-k "$TESTS_K"} tests \
    > "$out/pytest_gpu.log" 2>&1
  echo "pytest (GPU): $(tail -n 1 "$out/pytest_gpu.log")"
  # The forward's and backward's tests again with every plain call on the Gluon kernels where they apply
  # (sm_90), so that both paths pass them (auto takes them from some hundreds or thousands of keys: few
  # test calls are that big). Tests about a path's selection set the variables themselves.
  FLASHTRITON_FORWARD=gluon FLASHTRITON_BACKWARD=gluon python3 -m pytest -q -p no:cacheprovider -n "$workers" \
    --durations=40 ${TESTS_K:+-k "$TESTS_K"} tests/test_flash_attention.py tests/test_numerics.py tests/test_interfaces.py \
    tests/test_nn.py tests/test_cuda_graph.py tests/test_gluon.py > "$out/pytest_gpu_gluon.log" 2>&1
  echo "pytest (GPU, FLASHTRITON_FORWARD=gluon FLASHTRITON_BACKWARD=gluon): $(tail -n 1 "$out/pytest_gpu_gluon.log")"
  pack
fi
for suite in $suites; do
  merge=""
  if [ "${MERGE:-0}" = 1 ]; then
    merge=--merge
    [ "$out" = benchmarks/results/h200 ] || cp "benchmarks/results/h200/$suite.json" "$out/" 2>/dev/null
  fi
  python3 -m flashtriton bench --suite "$suite" ${modes:+--modes "$modes"} --out "$out" $merge ${BENCH_ARGS:-} 2>&1 \
    | grep -v "_warn_once\|Profiler clears events" | tee "$out/bench_$suite.log"
  pack
done
if [ "${SWEEP:-0}" = 1 ]; then
  # the FlashAttention-2 paper's shapes at N=4096 unless SWEEPS lists others (';'-separated)
  sweeps=${SWEEPS:-"--heads 32 --head-dim 64;--heads 16 --head-dim 128;--heads 16 --head-dim 128 --causal"}
  IFS=';' read -ra sweep_list <<< "$sweeps"
  for args in "${sweep_list[@]}"; do
    python3 -m flashtriton sweep --batch 4 --seqlen 4096 $args --jobs "$workers" --out "$out/sweeps" 2>&1 \
      | grep -v "compile:\|time:" | tail -n 18
    pack
  done
fi
if [ "${HOST:-0}" = 1 ]; then
  python3 benchmarks/host_overhead.py --out "$out" 2>&1 | tail -n 20
  pack
fi
if [ "${FIRST:-0}" = 1 ]; then
  python3 benchmarks/first_call.py --out "$out" 2>&1 | tail -n 6
  pack
fi
if [ "${SANITIZE:-0}" = 1 ]; then  # memcheck over every kernel and path; racecheck on one shape
  for tool in memcheck racecheck; do
    quick=""; [ "$tool" = racecheck ] && quick=--quick
    compute-sanitizer --tool "$tool" --error-exitcode 1 python3 benchmarks/sanitize.py $quick \
      > "$out/sanitize_$tool.log" 2>&1
    echo "compute-sanitizer $tool: exit $? ($(grep -c "ERROR SUMMARY: 0 errors\|RACECHECK SUMMARY: 0 hazards" "$out/sanitize_$tool.log") clean summaries); $(tail -n 1 "$out/sanitize_$tool.log")"
    pack
  done
fi
if [ "${ROOFLINE:-0}" = 1 ]; then
  python3 -m flashtriton roofline --out "$out" 2>&1 | tail -n 40
  pack
fi
