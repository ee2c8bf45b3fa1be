# Sourced (not run) by run_gpu_checks.sh and dry_run.sh: the environment that runs an unpacked
# loom-device pack (tools/device/pack.sh) without any library of the host's own but glibc,
# libstdc++/libgcc_s and the CUDA driver.
#   source tools/device/env.sh /tmp/loomdev/loom-device [nocuda]
# nocuda: leave out the image's CUDA dirs (the dry run on a machine without a GPU).
LOOMDEV=${1:?usage: source tools/device/env.sh <unpacked loom-device dir> [nocuda]}
LOOMDEV=$(cd "$LOOMDEV" && pwd)
_cuda_dirs=""
if [ "${2:-}" != nocuda ]; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && _cuda_dirs="$_cuda_dirs:$d"
  done
  # The pip nvidia-* wheels (cu13: nvidia/cu13/lib; nccl: nvidia/nccl/lib) of every python3.
  for _site in $(python3 -c 'import site,sys; print(" ".join(site.getsitepackages()+[site.getusersitepackages()]))' 2>/dev/null) \
               /opt/torch/.venv/lib/python3*/site-packages /usr/local/lib/python3*/dist-packages /usr/lib/python3/dist-packages; do
    [ -d "$_site/nvidia" ] || continue
    for d in $(find "$_site/nvidia" -maxdepth 4 -name 'lib*.so*' -printf '%h\n' 2>/dev/null | sort -u); do
      case ":$_cuda_dirs:" in *":$d:"*) ;; *) _cuda_dirs="$_cuda_dirs:$d" ;; esac
    done
  done
fi
# The pack first, then the image's CUDA, then whatever the image set (the driver's dir, say),
# and last the packed libcudart as a fallback.
export LOOM_DEVICE_ORIG_LD_LIBRARY_PATH=${LOOM_DEVICE_ORIG_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}}
export LD_LIBRARY_PATH="$LOOMDEV/lib${_cuda_dirs}${LOOM_DEVICE_ORIG_LD_LIBRARY_PATH:+:$LOOM_DEVICE_ORIG_LD_LIBRARY_PATH}:$LOOMDEV/lib/cuda-fallback"
[ "${2:-}" = nocuda ] && export LD_LIBRARY_PATH="$LOOMDEV/lib:$LOOMDEV/lib/cuda-fallback"
unset _cuda_dirs _site d
# OpenMPI 4.1 (Debian's) relocated: every install dir it reads, pointed into the pack.
export OPAL_PREFIX=$LOOMDEV/mpi
export OPAL_EXEC_PREFIX=$LOOMDEV/mpi
export OPAL_BINDIR=$LOOMDEV/mpi/bin
export OPAL_LIBDIR=$LOOMDEV/mpi/lib/x86_64-linux-gnu/openmpi/lib
export OPAL_PKGLIBDIR=$LOOMDEV/mpi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
export OPAL_DATADIR=$LOOMDEV/mpi/share
export OPAL_PKGDATADIR=$LOOMDEV/mpi/share/openmpi
export OPAL_SYSCONFDIR=$LOOMDEV/mpi/etc/openmpi
export PMIX_PREFIX=$LOOMDEV/pmix2
export PMIX_LIBDIR=$LOOMDEV/pmix2/lib
export PMIX_PKGLIBDIR=$LOOMDEV/pmix2/lib/pmix
export PMIX_DATADIR=$LOOMDEV/pmix2/share
export PMIX_PKGDATADIR=$LOOMDEV/pmix2/share/pmix
# Root on the device; one node: shared memory + TCP over ob1 (no UCX/OFI/verbs probing);
# no single-copy (CMA needs ptrace, which a VM may refuse).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_base_warn_component_unused=0
export PATH="$LOOMDEV/build:$LOOMDEV/mpi/bin:$PATH"
