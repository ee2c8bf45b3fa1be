#!/usr/bin/env bash
# Builds llm.c's GPT-2 CUDA trainer (train_gpt2cu) here, for the device machine's bench
# (bench/llmc_gpu.sh), into OUT_DIR/llmc/ (default .device/, git-ignored, carried with the
# pack). llm.c and NVIDIA's header-only cudnn-frontend come from the `fetch` tool's mirrors;
# nothing of either is copied into loom's tree. cuDNN 9 (headers and libcudnn) comes from the
# CUDA toolkit here; the device image has libcudnn.so.9 from its pip wheels (env.sh puts them on
# LD_LIBRARY_PATH). About 5 minutes on 2 cores.
#
#   tools/device/build_llmc.sh LLMC_GIT_DIR CUDNN_FRONTEND_GIT_DIR [OUT_DIR]
# e.g. tools/device/build_llmc.sh /work/.mirror/karpathy+llm.c/repo \
#          /work/.mirror/NVIDIA+cudnn-frontend/repo .device
set -euo pipefail
LLMC_GIT=$1 FRONTEND_GIT=$2 OUT=${3:-.device}
SRC=$(mktemp -d)
trap 'rm -rf "$SRC"' EXIT
git --git-dir="$LLMC_GIT" archive HEAD Makefile train_gpt2.cu llmc | tar -x -C "$SRC"
mkdir -p "$SRC/cudnn-frontend"
# CUDA 13 passes a cudaMemLocation where CUDA 12 took a device id (llm.c's managed-memory
# fallback, taken only when cudaMalloc runs out); patched in the temporary copy only.
sed -i 's/cudaMemAdvise(\*out, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdvise(*out, bytes, cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' \
    "$SRC/llmc/cuda_utils.cuh"
git --git-dir="$FRONTEND_GIT" archive HEAD include | tar -x -C "$SRC/cudnn-frontend"
# Without NVML's header here llm.c leaves out its GPU-utilisation logging (mfu.h), so NVML is
# not linked (this toolkit has no stub of it). The newest cudnn-frontend compiles some engines
# with NVRTC and the driver API (the device has both: the pip nvrtc wheel, the driver).
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
( cd "$SRC" && make train_gpt2cu USE_CUDNN=1 NO_MULTI_GPU=1 NO_USE_MPI=1 GPU_COMPUTE_CAPABILITY=90 \
      NVCC="$CUDA_HOME/bin/nvcc" NVCC_LDFLAGS="-lcublas -lcublasLt -lcudnn -lnvrtc -lcuda" )
mkdir -p "$OUT/llmc"
cp "$SRC/train_gpt2cu" "$OUT/llmc/"
printf 'llm.c %s, cudnn-frontend %s, built %s\n' \
    "$(git --git-dir="$LLMC_GIT" rev-parse --short HEAD)" \
    "$(git --git-dir="$FRONTEND_GIT" rev-parse --short HEAD)" "$(date -u +%F)" > "$OUT/llmc/VERSION"
echo "built $OUT/llmc/train_gpt2cu ($(cat "$OUT/llmc/VERSION"))"
