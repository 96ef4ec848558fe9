#!/usr/bin/env bash
# Runs each cmocka test program given on the command line, prints its output
# (cmocka's summary lines included), and ends with one plain summary line.
# Exit status: 0 when every program passed, 1 otherwise.
set -u
pass=0; fail=0; failed=()
for t in "$@"; do
  name=$(basename "$t")
  echo "=== $name"
  start=$(date +%s)
  if "$t"; then pass=$((pass+1)); else fail=$((fail+1)); failed+=("$name"); fi
  echo "--- $name: $(( $(date +%s) - start ))s"
done
[ $fail -eq 0 ] || echo "failed programs: ${failed[*]}"
echo "test programs: $pass passed, $fail failed"
[ $fail -eq 0 ]
