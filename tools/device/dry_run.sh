#!/usr/bin/env bash
# A dry run of the device pack on this machine (no GPU needed): unpacks .device/loom-device.tar.xz
# into a temp dir and, with LD_LIBRARY_PATH naming only the pack (tools/device/env.sh nocuda),
#   1. checks `ldd` of every packed binary: nothing "not found", and every library resolved from
#      the pack except glibc, libstdc++/libgcc_s and the CUDA libraries the image provides
#      (cuDNN and NVRTC too, which only the cuDNN attention plugin links);
#   2. checks with LD_DEBUG=libs which files `loom --help` and `mpirun` really load;
#   3. in a private mount namespace (unshare -m, needs root) where the host's own copies of the
#      packed libraries, OpenMPI's and PMIx's dirs, /usr/share/openmpi and /etc/openmpi are
#      hidden, runs the packed `loom --help`, a 2-step CPU `loom train` and `mpirun -np 2 loom
#      train` (OPAL_PREFIX relocation, plugins and help files from the pack).
#   tools/device/dry_run.sh [ARCHIVE]       (default .device/loom-device.tar.xz; exit 0 = passed)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
ARCHIVE=${1:-$REPO/.device/loom-device.tar.xz}
[ -f "$ARCHIVE" ] || { echo "dry_run: no $ARCHIVE (run tools/device/pack.sh first)"; exit 1; }
T=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$T"' EXIT
tar xf "$ARCHIVE" -C "$T"
P=$T/loom-device
echo "dry_run: unpacked $(du -sh "$P" | cut -f1) to $P"
# shellcheck source=env.sh
source "$REPO/tools/device/env.sh" "$P" nocuda
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
allowed='^(linux-vdso|/lib64/ld-linux[^ ]*|ld-linux[^ ]*|libc|libm|libpthread|libdl|librt|libutil|libresolv|libmvec|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl|libcudnn|libnvrtc)\.so'
status=0

echo "== 1. ldd of the packed binaries, OpenMPI and its plugins"
for f in $(find "$P/build" -type f -perm -u+x) "$P/mpi/bin/orterun" "$P/mpi/bin/orted" \
         "$P"/mpi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so "$P"/pmix2/lib/pmix/*.so "$P"/lib/*.so*; do
  out=$(ldd "$f" 2>&1) || true
  if grep -q 'not found' <<<"$out"; then echo "NOT FOUND in ${f#"$P"/}:"; grep 'not found' <<<"$out"; status=1; fi
  bad=$(awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' <<<"$out" | grep -v " $P/" | grep -Ev "$allowed" || true)
  [ -z "$bad" ] || { echo "from outside the pack in ${f#"$P"/}: $bad"; status=1; }
done
[ $status = 0 ] && echo "ok: every library of $(find "$P/build" -type f -perm -u+x | wc -l) binaries and $(ls "$P"/mpi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so | wc -l) plugins resolves into the pack (or is glibc/libstdc++/CUDA)"

# The timeline tracer loads only in the trace phase, with lib/cupti/ in front.
if [ -f "$P/lib/cupti/libloom_kernel_trace.so" ]; then
  out=$(LD_LIBRARY_PATH="$P/lib/cupti:$LD_LIBRARY_PATH" ldd "$P/lib/cupti/libloom_kernel_trace.so" 2>&1) || true
  if grep -q 'not found' <<<"$out" || ! grep -q "libcupti.so.* => $P/lib/cupti/" <<<"$out"; then
    echo "the tracer does not resolve its CUPTI from lib/cupti:"; echo "$out"; status=1
  else
    echo "ok: lib/cupti/libloom_kernel_trace.so takes lib/cupti/$(ls "$P/lib/cupti" | grep libcupti)"
  fi
fi

echo "== 2. LD_DEBUG=libs: what loom --help loads"
LD_DEBUG=libs "$P/build/loom" --help >/dev/null 2>"$T/ld.log"
loaded=$(sed -n 's/.*calling init: //p' "$T/ld.log" | sort -u)
echo "$loaded" | sed 's/^/  /'
outside=$(echo "$loaded" | grep -v "^$P/" | xargs -n1 basename | grep -Ev "$allowed" || true)
[ -z "$outside" ] || { echo "loaded from outside the pack: $outside"; status=1; }

echo "== 3. the pack alone: host copies hidden in a private mount namespace"
mkdir -p "$T/data" "$T/empty"
python3 - "$T/data/train_000000.bin" <<'PY'
import random, struct, sys
rng = random.Random(7)
tokens, t = [], 0
for _ in range(20000):
    t = (5 * t + 1) % 64 if rng.random() < 0.8 else rng.randrange(64)
    tokens.append(t)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *([20240520, 1, len(tokens)] + [0] * 253)))
    f.write(struct.pack(f"<{len(tokens)}H", *tokens))
PY
for n in 1 2; do cat > "$T/cpu$n.toml" <<TOML
[model]
arch = "gpt2"
vocab_size = 64
max_seq_len = 16
n_layer = 2
n_embd = 32
n_head = 4
[data]
train = "$T/data/train_*.bin"
[train]
batch_size = 2
seq_len = 16
steps = 2
threads = 1
device = "cpu"
[checkpoint]
dir = "$T/ckpt$n"
[log]
dir = "$T/run$n"
TOML
done
# The host's copies of every packed library (by soname and real file), and OpenMPI's/PMIx's dirs.
hide_files=() ; hide_dirs=(/usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2
  /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/share/openmpi /etc/openmpi)
for l in "$P"/lib/*.so*; do
  n=$(basename "$l")
  for d in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu/openblas-openmp; do
    [ -e "$d/$n" ] && hide_files+=("$(readlink -f "$d/$n")")
  done
done
for b in orterun orted; do [ -e /usr/bin/$b ] && hide_files+=("$(readlink -f /usr/bin/$b)"); done
# (files inside the hidden dirs are hidden with them)
mapfile -t hide_files < <(printf '%s\n' "${hide_files[@]}" | sort -u | grep -Ev "^($(IFS='|'; echo "${hide_dirs[*]}"))/")
cat > "$T/inner.sh" <<INNER
set -u
for d in ${hide_dirs[*]}; do [ -d "\$d" ] && mount --bind "$T/empty" "\$d"; done
# libpcre2-8 last: mount itself needs it (libselinux).
for f in $(printf '%s\n' "${hide_files[@]}" | grep -v pcre2 | tr '\n' ' ') $(printf '%s\n' "${hide_files[@]}" | grep pcre2 | tr '\n' ' '); do
  mount --bind /dev/null "\$f" || echo "could not hide \$f"
done
echo "hidden: ${#hide_dirs[@]} dirs, ${#hide_files[@]} files (e.g. /lib/x86_64-linux-gnu/libmpi.so.40 is now \$(stat -Lc %s /lib/x86_64-linux-gnu/libmpi.so.40 2>/dev/null || echo absent) bytes)"
rc=0
"$P/build/loom" --help > "$T/help.log" 2>&1 || { echo "FAIL: loom --help"; rc=1; }
timeout 120 "$P/build/loom" train "$T/cpu1.toml" > "$T/train1.log" 2>&1 || { echo "FAIL: loom train (1 process)"; rc=1; }
OMPI_MCA_mca_base_component_show_load_errors=1 timeout 180 "$P/mpi/bin/mpirun" --allow-run-as-root -np 2 "$P/build/loom" train "$T/cpu2.toml" > "$T/train2.log" 2>&1 || { echo "FAIL: mpirun -np 2 loom train"; rc=1; }
# OpenMPI's help texts from the pack: a failing rank makes mpirun print one.
timeout 60 "$P/mpi/bin/mpirun" --allow-run-as-root -np 1 false > "$T/help_text.log" 2>&1
txt=\$(<"$T/help_text.log")   # (no grep in here: libpcre2-8 is hidden)
if [[ \$txt == *"couldn't open the help file"* || \$txt != *"non-zero"* ]]; then
  echo "FAIL: mpirun's help texts not found in the pack:"; cat "$T/help_text.log"; rc=1
fi
exit \$rc
INNER
if unshare -m --propagation private bash "$T/inner.sh"; then
  echo "ok: loom --help, a 2-step loom train, mpirun -np 2 loom train and mpirun's help texts came from the pack alone"
else
  status=1
fi
for f in help train1 train2; do echo "--- $f.log (last lines)"; tail -n 6 "$T/$f.log"; done
for n in 1 2; do
  steps=$(grep -c '"kind": *"train"\|"kind":"train"' "$T/run$n/metrics.jsonl" 2>/dev/null || echo 0)
  echo "run$n: $steps train records in metrics.jsonl"
  [ "$steps" -ge 2 ] || status=1
done
grep -iE 'unable to (open|load)|component .* (failed|not found)|error' "$T/train2.log" && { echo "mpirun printed errors above"; status=1; }
[ $status = 0 ] && echo "dry_run: PASSED" || echo "dry_run: FAILED"
exit $status
