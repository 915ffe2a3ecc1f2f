#!/usr/bin/env bash
# Everything the H200 run checks and times, in one call (see README, "Benchmarks"):
#   1. the test suite on the GPU (larger sizes than on CPU), log to $OUT/pytest_gpu.log
#   2. python -m flashtriton bench: correctness against float64, then the suite's table against the peers
# Results land in $OUT (the device tool's output folder) or benchmarks/results/h200/; the table prints last.
#   3. with SWEEP=1, the forward tile sweep (python -m flashtriton sweep) on the paper's D=64 and D=128 shapes,
#      packed into $OUT/sweeps.tgz
# Usage: [SWEEP=1] [TESTS=0] bash benchmarks/h200.sh [suite] [modes]   e.g. bash benchmarks/h200.sh article fwd,bwd
set -uo pipefail
suite=${1:-article}
modes=${2:-fwd}
out=${OUT:-benchmarks/results/h200}
mkdir -p "$out"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# The device copy of the tree has no .git: pass FLASHTRITON_COMMIT=$(git rev-parse --short HEAD) in.
export FLASHTRITON_COMMIT=${FLASHTRITON_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/gpu.txt"

workers=$(( $(nproc) / 2 )); [ "$workers" -gt 8 ] && workers=8
if [ "${TESTS:-1}" = 1 ]; then  # TESTS_K narrows the GPU suite with pytest -k
  python3 -m pytest -q -p no:cacheprovider -n "$workers" ${TESTS_K:+-k "$TESTS_K"} tests > "$out/pytest_gpu.log" 2>&1
  echo "pytest (GPU): $(tail -n 1 "$out/pytest_gpu.log")"
fi
python3 -m flashtriton bench --suite "$suite" --modes "$modes" --out "$out" 2>&1 | tee "$out/bench_$suite.log"
if [ "${SWEEP:-0}" = 1 ]; then  # the FlashAttention-2 paper's shapes: 16k tokens, H = 2048 / D
  # The device tool returns at most 8 files: the sweeps travel as one archive.
  sweeps=$(mktemp -d)
  for args in "--heads 32 --head-dim 64" "--heads 16 --head-dim 128"; do
    python3 -m flashtriton sweep --batch 4 --seqlen 4096 $args --jobs "$workers" --out "$sweeps" 2>&1 \
      | grep -v "compile:\|time:" | tail -n 18
    tar czf "$out/sweeps.tgz" -C "$sweeps" .
  done
fi
