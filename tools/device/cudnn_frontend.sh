#!/usr/bin/env bash
# Puts NVIDIA's header-only cudnn-frontend (include/ only) where loom's CMake looks for it,
# OUT_DIR/cudnn-frontend/include (default .device/, git-ignored), so that a CUDA build here
# compiles cuDNN attention (src/loom/kernels/cuda/attention_cudnn.cpp, LOOM_CUDA_ATTENTION=cudnn).
# The headers come from the `fetch` tool's mirror; nothing of them enters loom's tree. Reconfigure
# the build afterwards (cmake -S . -B build-cuda) so that it finds them.
#   tools/device/cudnn_frontend.sh CUDNN_FRONTEND_GIT_DIR [OUT_DIR]
# e.g. tools/device/cudnn_frontend.sh /work/.mirror/NVIDIA+cudnn-frontend/repo .device
set -euo pipefail
FRONTEND_GIT=$1 OUT=${2:-.device}
rm -rf "$OUT/cudnn-frontend"
mkdir -p "$OUT/cudnn-frontend"
git --git-dir="$FRONTEND_GIT" archive HEAD include | tar -x -C "$OUT/cudnn-frontend"
git --git-dir="$FRONTEND_GIT" rev-parse --short HEAD > "$OUT/cudnn-frontend/VERSION"
echo "cudnn-frontend $(cat "$OUT/cudnn-frontend/VERSION") headers in $OUT/cudnn-frontend/include"
