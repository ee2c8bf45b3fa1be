#!/usr/bin/env bash
# Builds and runs the emulated attention kernels (see emulated_cuda.hpp) by hand; needs only g++
# (shim/ stands in for the CUDA headers). ctest runs the same as `cuda_emulation_attention`.
# Argument: mma, pipelined or both (the default).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-/tmp/loom-cuda-emulation}
mkdir -p "$BUILD"
FLAGS=(-std=c++20 -O2 -pthread -Wno-unknown-pragmas -fno-strict-aliasing -DLOOM_CUDA_EMULATION
       -I"$ROOT/tools/cuda_emulation/shim" -I"$ROOT/src" -I"$ROOT/tools/cuda_emulation")
for f in kernels_mma kernels_pipelined attention_main; do
  g++ "${FLAGS[@]}" -c "$ROOT/tools/cuda_emulation/$f.cpp" -o "$BUILD/$f.o" &
done
wait
g++ -pthread "$BUILD"/kernels_mma.o "$BUILD"/kernels_pipelined.o "$BUILD"/attention_main.o -o "$BUILD/attention"
"$BUILD/attention" "${1:-both}"
