#!/usr/bin/env bash
# Runs a gtest binary one process per test suite, JOBS (default 6) at a time, so that a sticky
# CUDA error (an illegal address) in one suite cannot fail the others:
#   gtest_suites.sh BINARY LOGDIR [FILTER]
# Each suite's output goes to LOGDIR/gtest_<suite>.log (+ .xml); prints every log, then one
# "suite NAME rc=N" line per suite; exits 1 if any suite failed.
set -u
bin=$1 dir=$2 filter=${3:-*} jobs=${JOBS:-6}
mkdir -p "$dir"
"$bin" --gtest_list_tests --gtest_filter="$filter" | awk '
  /^[^ ]/ { if ($1 ~ /\.$/) suite = $1; else suite = ""; next }
  /^  / && suite != "" { t[suite] = t[suite] (t[suite] == "" ? "" : ":") suite $1 }
  END { for (s in t) print t[s] }' > "$dir/suites.txt"
: > "$dir/suites_rc.txt"
while read -r tests; do
  suite=${tests%%.*}
  name=$(printf '%s' "$suite" | tr -c 'A-Za-z0-9' _)
  ( "$bin" --gtest_filter="$tests" --gtest_color=no --gtest_output=xml:"$dir/gtest_$name.xml" \
      > "$dir/gtest_$name.log" 2>&1
    echo "suite $suite rc=$?" >> "$dir/suites_rc.txt" ) &
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
done < "$dir/suites.txt"
wait
cat "$dir"/gtest_*.log
cat "$dir/suites_rc.txt"
! grep -qv 'rc=0$' "$dir/suites_rc.txt"
