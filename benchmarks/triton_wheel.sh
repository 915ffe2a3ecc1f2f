#!/usr/bin/env bash
# A Triton release for the device machine, which reaches no package index and takes 64 MiB per call with
# the tree: the release's cp312 Linux wheel from PyPI, cut to what compiling and running for sm_90 needs,
# packed in xz (Triton 3.9.0: 286 MB as a wheel, 53 MB here; docs/performance.md, entry 97). Cut: the AMD
# backend (and its entry point, which Triton imports at start), CUPTI and the proton profiler, the
# instrumentation library, the symbols of libtriton.so (strip --strip-unneeded: 500 -> 192 MB), cuobjdump and
# nvdisasm (SASS dumps only), and of the two ptxas the one the release does not run for sm_90 (from 3.9 on
# it runs ptxas-blackwell, the newer CUDA's, for sm_90 too; before, ptxas).
# Usage (here): bash benchmarks/triton_wheel.sh 3.9.0 [DIR]   -> DIR/triton-3.9.0.tar.xz (DIR default: t39;
#   ignore it in .git/info/exclude and name it in the run's carry)
# On the device: mkdir -p /tmp/triton && xz -dc DIR/triton-3.9.0.tar.xz | tar x -C /tmp/triton \
#   && export PYTHONPATH=/tmp/triton:src
set -euo pipefail
version=$1
dir=${2:-t39}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
PIP_CONFIG_FILE=/dev/null python3 -m pip download --isolated --quiet --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$work" "triton==$version"
mkdir "$work/site"
unzip -q "$work"/triton-*.whl -d "$work/site"
cd "$work/site"
nvidia=triton/backends/nvidia
rm -rf triton/backends/amd "$nvidia"/lib/cupti* triton/_C/libproton.so triton/instrumentation \
  "$nvidia/bin/cuobjdump" "$nvidia/bin/nvdisasm"
sed -i '/triton.backends.amd/d; /^amd *=/d' triton-*.dist-info/entry_points.txt
# Which ptxas compiles sm_90: the release's get_ptxas says (3.9: "if arch < 90: ... ptxas" then ptxas_blackwell).
if grep -q "arch < 90" "$nvidia/compiler.py"; then rm -f "$nvidia/bin/ptxas"; else rm -f "$nvidia/bin/ptxas-blackwell"; fi
strip --strip-unneeded triton/_C/libtriton.so
cd - > /dev/null
mkdir -p "$dir"
tar cf - -C "$work/site" . | xz -T0 -9 > "$dir/triton-$version.tar.xz"
ls -l "$dir/triton-$version.tar.xz"
