#!/usr/bin/env bash
# fuzz.sh BUILD SECONDS TARGET...: runs each libFuzzer program
# BUILD/fuzz/fuzz_TARGET for SECONDS, starting from the kept corpus
# tests/fuzz/corpus/TARGET (read only: new inputs go to BUILD/corpus-TARGET)
# and the crash regressions tests/fuzz/regressions/TARGET. A crash leaves its
# input in BUILD/crashes/; copy it to tests/fuzz/regressions/TARGET/ and
# fix the bug (test_fuzz_replay replays it from then on).
# Prints one line per target: executions, seconds, exec/s, new corpus size.
# Exit status 1 when any target crashed.
set -u
build=${1:?usage: fuzz.sh BUILD SECONDS TARGET...}; secs=${2:?}; shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
export TG_ROOT=$root
status=0
summary=()
for t in "$@"; do
  bin=$build/fuzz/fuzz_$t
  [ -x "$bin" ] || { echo "fuzz.sh: missing $bin" >&2; exit 2; }
  out=$build/corpus-$t; mkdir -p "$out" "$build/crashes"
  seeds=("$root/tests/fuzz/corpus/$t")
  [ -d "$root/tests/fuzz/regressions/$t" ] && seeds+=("$root/tests/fuzz/regressions/$t")
  log=$build/$t.log
  echo "=== fuzz $t for ${secs}s"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -print_final_stats=1 -artifact_prefix="$build/crashes/$t-" "$out" "${seeds[@]}" >"$log" 2>&1
  rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  n=$(ls "$out" | wc -l)
  if [ $rc -ne 0 ]; then
    status=1
    echo "fuzz $t: CRASH (exit $rc), see $log and $build/crashes/"
    grep -E "ERROR|SUMMARY|Assertion|runtime error" "$log" | head -5
  fi
  summary+=("fuzz $t: ${runs:-?} executions in ${secs}s (${rate:-?}/s), $n new corpus inputs, exit $rc")
done
printf '%s\n' "${summary[@]}"
exit $status
