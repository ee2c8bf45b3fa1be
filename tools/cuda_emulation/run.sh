#!/usr/bin/env bash
# Builds and runs the emulated attention kernels (see emulated_cuda.hpp); needs only g++ and the
# CUDA headers (cuda_bf16.h), no GPU. Argument: mma, pipelined or both (the default).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CUDA_INCLUDE=${CUDA_INCLUDE:-/usr/local/cuda/include}
BUILD=${BUILD:-/tmp/loom-cuda-emulation}
mkdir -p "$BUILD"
FLAGS=(-std=c++20 -O2 -pthread -DLOOM_CUDA_EMULATION -I"$ROOT/src" -I"$ROOT/tools/cuda_emulation" -I"$CUDA_INCLUDE")
for f in kernels_mma kernels_pipelined attention_main; do
  g++ "${FLAGS[@]}" -c "$ROOT/tools/cuda_emulation/$f.cpp" -o "$BUILD/$f.o" &
done
wait
g++ -pthread "$BUILD"/kernels_mma.o "$BUILD"/kernels_pipelined.o "$BUILD"/attention_main.o -o "$BUILD/attention"
"$BUILD/attention" "${1:-both}"
