#!/usr/bin/env bash
# Builds the parsers' libFuzzer targets (clang, AddressSanitizer + UndefinedBehaviorSanitizer)
# in their own build directory and runs each on a scratch copy of its seed corpus
# (tests/fuzz/corpus/<target>/, made by make_seeds.py).
#   tests/fuzz/run_fuzz.sh SECONDS        every target for SECONDS seconds (./run test: 20)
#   tests/fuzz/run_fuzz.sh --runs N       every target for N inputs
# Fails on the first target that finds a crash, a sanitizer report, a hang (10 s per input; 60 s
# for published_runs, whose every input runs the planner) or
# an exception other than loom::Error; the input that did it is kept under
# $LOOM_FUZZ_BUILD_DIR/artifacts/ and named in the output. Reproduce with
#   build-fuzz/tests/fuzz/fuzz_<target> ARTIFACT
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${LOOM_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}
TARGETS=(safetensors checkpoint config token_shard tokenizer tokenizer_json published_runs)

if [ "${1:-}" = "--runs" ] && [ -n "${2:-}" ]; then
  limit=(-runs="$2"); what="$2 inputs"
elif [[ "${1:-}" =~ ^[0-9]+$ ]]; then
  limit=(-max_total_time="$1"); what="$1 s"
else
  echo "usage: tests/fuzz/run_fuzz.sh SECONDS | --runs N" >&2
  exit 64
fi
command -v clang++ >/dev/null || { echo "run_fuzz.sh: clang++ not found (Debian: apt-get install clang libclang-rt-dev)" >&2; exit 1; }

echo "== building the fuzz targets ($BUILD, clang, ASan + UBSan)"
start=$(date +%s)
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DLOOM_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" -j "${LOOM_JOBS:-$(nproc)}"
echo "== built in $(( $(date +%s) - start )) s"

mkdir -p "$BUILD/artifacts"
for target in "${TARGETS[@]}"; do
  work=$(mktemp -d)
  cp "$ROOT/tests/fuzz/corpus/$target/"* "$work/"
  log="$BUILD/fuzz_$target.log"
  echo "== fuzz_$target for $what"
  t0=$(date +%s)
  # A published-runs record is predicted whole (every unstated micro-batch, V and recomputation
  # tried, pipelines simulated), which under the sanitizers takes seconds, not a hang.
  timeout=10; [ "$target" = published_runs ] && timeout=60
  if ! UBSAN_OPTIONS=print_stacktrace=1 "$BUILD/tests/fuzz/fuzz_$target" "${limit[@]}" -timeout=$timeout -print_final_stats=1 \
       -artifact_prefix="$BUILD/artifacts/$target-" "$work" >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "fuzz_$target FAILED: see $log and $BUILD/artifacts/" >&2
    rm -rf "$work"
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  echo "   $runs inputs in $(( $(date +%s) - t0 )) s, no crash; corpus $(ls "$work" | wc -l) files"
  rm -rf "$work"
done
