#!/usr/bin/env bash
# The context-parallel scaling run (issue 23), one device call on a machine of G GPUs, NCCL, one rank a GPU:
#   torchrun of `python -m flashtriton bench --suite cp` (tools/cp_bench.py: time, exactness, a traced step)
#   -> cp_g<G>.json, cp_g<G>_trace_*.json.gz, and cp.md / cp.png over every cp_g*.json there.
# ring-flash-attn, the peer, travels as its wheel (no registry on the device machine): before the call,
#   pip download --no-deps "ring-flash-attn>=0.1.8,<0.2" -d peers/
# and carry peers/ (the run installs it into a scratch site directory; without it the peer is left out).
# Usage: [G=2] [SEQLENS=32768,131072] [OUT=dir] [FLASHTRITON_COMMIT=sha] bash benchmarks/cp_scaling.sh
# At G = 2 the default lengths take about 3 minutes; 524288 tokens take about as long again, so they go in a
# second call (SEQLENS=524288), whose rows join the first call's cp_g2.json when the commit is the same
# (unpack the first call's cp.tgz into benchmarks/results/h200/ in between: the tree travels with it).
# Without $OUT the files land in benchmarks/results/h200/ (the committed cp_g*.json join the report);
# with it they travel packed as $OUT/cp.tgz, refreshed after each step.
set -uo pipefail
G=${G:-$(nvidia-smi -L | wc -l)}
SEQLENS=${SEQLENS:-32768,131072}
if [ -n "${OUT:-}" ]; then
  out=$(mktemp -d)
  cp benchmarks/results/h200/cp_g*.json "$out/" 2>/dev/null
else
  out=benchmarks/results/h200
fi
# NVLink multicast stays off: a program using it can take a shared host's GPUs out of service
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# gloo (the agreement's host round trip) over loopback: one host, and nothing else is reachable there
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export FLASHTRITON_COMMIT=${FLASHTRITON_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
pack() { [ -z "${OUT:-}" ] || tar czf "$OUT/cp.tgz" -C "$out" . ; }

if ls peers/ring_flash_attn-*.whl > /dev/null 2>&1; then
  site=$(mktemp -d)
  python3 -m pip install -q --no-index --no-deps --target "$site" peers/ring_flash_attn-*.whl
  export PYTHONPATH=$PYTHONPATH:$site
fi
{ nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm --format=csv; nvidia-smi topo -m
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
} 2>&1 | tee "$out/cp_g${G}_machine.txt"
torchrun --standalone --nproc-per-node="$G" -m flashtriton bench --suite cp --seqlens "$SEQLENS" --out "$out" 2>&1 \
  | grep -v "_warn_once\|Profiler clears events" | tee "$out/cp_g${G}.log"
pack
