#!/usr/bin/env bash
# Packs a CUDA build of loom for the lent GPU machine (a bare CUDA image: CUDA 13, PyTorch,
# cmake; no OpenBLAS, OpenMPI, toml++, pcre2, gtest; no network). See tools/device/README.md.
#   tools/device/pack.sh [BUILD_DIR] [OUT_DIR]      (defaults: build .device)
# Writes OUT_DIR/loom-device.tar.xz, unpacking to loom-device/:
#   build/...        the binaries the GPU checks run (stripped) and the CTest files of tests/gpu,
#                    tests/gpu/nccl (paths rewritten on the device by run_gpu_checks.sh)
#   lib/             the ldd closure of those binaries and of OpenMPI/PMIx's plugins, minus
#                    glibc, libstdc++/libgcc_s, the CUDA driver and the big CUDA libraries
#   lib/cuda-fallback/libcudart.so.13   (0.7 MB; put LAST on LD_LIBRARY_PATH: the image's first)
#   lib/cupti/       the timeline tracer (libloom_kernel_trace.so) and its libcupti.so.13 (4 MB)
#   mpi/             OpenMPI 4.1 laid out like /usr (bin/, lib/x86_64-linux-gnu/openmpi/lib/openmpi3
#                    plugins, share/openmpi help files, etc/openmpi): relocate with OPAL_PREFIX=mpi
#                    and OPAL_SYSCONFDIR=mpi/etc/openmpi
#   pmix2/           Debian's PMIx (OpenMPI's pmix component): PMIX_PREFIX=pmix2
#   MANIFEST, PACK_INFO (the build and source dirs whose absolute paths the CTest files hold)
# libcublasLt (540 MB), libcublas (54 MB) and libnccl (218 MB) are NOT packed: the image has them
# (/usr/local/cuda/lib64, the pip nvidia-cublas / nvidia-nccl-cu13 wheels).
set -euo pipefail
BUILD=$(cd "${1:-build}" && pwd)
OUT_DIR=${2:-.device}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
[ -x "$BUILD/loom" ] || { echo "pack.sh: no $BUILD/loom" >&2; exit 1; }
case "$(ldd "$BUILD/loom")" in *libcudart*) ;; *) echo "pack.sh: warning: $BUILD/loom is not a CUDA build" >&2 ;; esac
SRC=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD/CMakeCache.txt" 2>/dev/null || true)

STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
P=$STAGE/loom-device
mkdir -p "$P/build" "$P/lib/cuda-fallback" "$P/mpi/bin" "$P/mpi/etc"

# 1. Binaries (stripped).
bins=(loom tests/loom_tests tests/gpu/loom_gpu_tests)
for f in "$BUILD"/tests/gpu/nccl/* "$BUILD"/bench/bench_*; do
  [ -f "$f" ] && [ -x "$f" ] && bins+=("${f#"$BUILD"/}")
done
for b in "${bins[@]}"; do
  [ -f "$BUILD/$b" ] || { echo "pack.sh: missing $BUILD/$b" >&2; continue; }
  mkdir -p "$P/build/$(dirname "$b")"
  strip -o "$P/build/$b" "$BUILD/$b"
done
# CTest files of the GPU tests (absolute paths; run_gpu_checks.sh rewrites them).
for d in tests/gpu tests/gpu/nccl; do
  mkdir -p "$P/build/$d"
  cp "$BUILD/$d"/CTestTestfile.cmake "$P/build/$d/"
  for f in "$BUILD/$d"/*_include.cmake "$BUILD/$d"/*_tests.cmake; do [ -f "$f" ] && cp "$f" "$P/build/$d/"; done
done
printf 'subdirs("tests/gpu")\nsubdirs("tests/gpu/nccl")\n' > "$P/build/CTestTestfile.cmake"

# 2. OpenMPI (Debian 4.1) and PMIx, laid out for OPAL_PREFIX / PMIX_PREFIX.
MPILIB=/usr/lib/x86_64-linux-gnu/openmpi/lib
mkdir -p "$P/mpi/lib/x86_64-linux-gnu/openmpi/lib"
cp -a "$MPILIB/openmpi3" "$P/mpi/lib/x86_64-linux-gnu/openmpi/lib/"
mkdir -p "$P/mpi/share"; cp -a /usr/share/openmpi "$P/mpi/share/"
cp -a /etc/openmpi "$P/mpi/etc/"
cp -L /usr/bin/orterun /usr/bin/orted "$P/mpi/bin/"
for l in mpirun mpiexec; do ln -s orterun "$P/mpi/bin/$l"; done
PMIX=/usr/lib/x86_64-linux-gnu/pmix2
mkdir -p "$P/pmix2/lib"
cp -a "$PMIX/share" "$P/pmix2/"
cp -a "$PMIX/lib/pmix" "$P/pmix2/lib/"
strip --strip-unneeded "$P"/mpi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so "$P"/pmix2/lib/pmix/*.so 2>/dev/null || true

# 3. The shared-library closure (ldd is already transitive).
skip='^(linux-vdso|ld-linux|libc|libm|libpthread|libdl|librt|libutil|libresolv|libanl|libmvec|libnsl|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl|libcudnn|libnvrtc)\.so'
# cuDNN attention's plugin (built where the cudnn-frontend headers were found), which loom
# opens at run time from its library path: into lib/. libcudnn and libnvrtc are the image's.
if [ -f "$BUILD/libloom_cudnn.so" ]; then
  strip --strip-unneeded -o "$P/lib/libloom_cudnn.so" "$BUILD/libloom_cudnn.so"
fi
{
  for b in "${bins[@]}"; do [ -f "$BUILD/$b" ] && echo "$BUILD/$b"; done
  if [ -f "$BUILD/libloom_cudnn.so" ]; then echo "$BUILD/libloom_cudnn.so"; fi
  echo "$P/mpi/bin/orterun"; echo "$P/mpi/bin/orted"
  ls "$P"/mpi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so "$P"/pmix2/lib/pmix/*.so
} | while read -r f; do ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'; done \
  | sort -u | while read -r name path; do
      if [[ "$name" =~ $skip ]]; then continue; fi
      [ -e "$P/lib/$name" ] || cp -L "$path" "$P/lib/$name"
    done
strip --strip-unneeded "$P"/lib/*.so* 2>/dev/null || true
# The timeline tracer (tools/device/kernel_trace: a CUDA injection library, loaded through
# CUDA_INJECTION64_PATH by the trace phase only) and the CUPTI it was built against, kept apart
# in lib/cupti/ so that nothing else loads it.
if [ -f "$BUILD/tools/device/kernel_trace/libloom_kernel_trace.so" ]; then
  mkdir -p "$P/lib/cupti"
  strip --strip-unneeded -o "$P/lib/cupti/libloom_kernel_trace.so" "$BUILD/tools/device/kernel_trace/libloom_kernel_trace.so"
  cp -L "$(ldd "$BUILD/tools/device/kernel_trace/libloom_kernel_trace.so" | awk '/libcupti/ {print $3}')" "$P/lib/cupti/"
fi
cp -L /usr/local/cuda/lib64/libcudart.so.13 "$P/lib/cuda-fallback/" 2>/dev/null \
  || cp -L "$(ldd "$BUILD/loom" | awk '/libcudart/ {print $3}')" "$P/lib/cuda-fallback/" 2>/dev/null || true
missing=$(for b in "${bins[@]}"; do ldd "$BUILD/$b" 2>/dev/null; done | grep 'not found' | sort -u || true)
[ -z "$missing" ] || { echo "pack.sh: the build itself has unresolved libraries here:" >&2; echo "$missing" >&2; }

cat > "$P/PACK_INFO" <<INFO
build_dir=$BUILD
source_dir=$SRC
mpiexec=$(command -v mpiexec || echo /usr/bin/mpiexec)
packed_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)
host=$(uname -n)
loom_commit=$(git -C "${SRC:-.}" rev-parse --short HEAD 2>/dev/null || echo unknown)
cuda=$(ldd "$BUILD/loom" | awk '/libcudart|libcublasLt|libnccl/ {print $1}' | tr '\n' ' ')
needs_glibc=$(find "$P/build" "$P/lib" "$P/mpi/bin" -type f -exec objdump -T {} + 2>/dev/null | grep -oE 'GLIBC_2\.[0-9]+' | sort -uV | tail -1)
needs_libstdcxx=$(find "$P/build" "$P/lib" -type f -exec objdump -T {} + 2>/dev/null | grep -oE 'GLIBCXX_3\.4\.[0-9]+' | sort -uV | tail -1)
INFO
(cd "$STAGE" && find loom-device \( -type f -o -type l \) -printf '%10s %p\n' | sort -k2) > "$P/MANIFEST"

tar -C "$STAGE" -cf - loom-device | xz -9 -T0 > "$OUT_DIR/loom-device.tar.xz.tmp"
mv "$OUT_DIR/loom-device.tar.xz.tmp" "$OUT_DIR/loom-device.tar.xz"
echo "unpacked: $(du -sh "$P" | cut -f1) in $(find "$P" -type f | wc -l) files ($(ls "$P/lib" | grep -c '\.so') libraries in lib/)"
echo "archive:  $OUT_DIR/loom-device.tar.xz $(stat -c %s "$OUT_DIR/loom-device.tar.xz") bytes ($(du -h "$OUT_DIR/loom-device.tar.xz" | cut -f1))"
