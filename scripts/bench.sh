#!/usr/bin/env bash
# Runs every benchmark the project has, each printing its figures as ratios
# against llama.cpp measured in the same run. Benchmarks are never tests:
# nothing here fails on a slow figure. Usage: scripts/bench.sh [BUILD]
set -u
build=${1:-build}
top=$(cd "$(dirname "$0")/.." && pwd)
export TG_BUILD=$top/$build TG_ROOT=$top TG_CACHE=${TG_CACHE:-$top/.cache}
for b in bench-tokenizer.sh bench-kernels.sh bench-store.sh bench-gate.sh bench-cpu.sh; do
  if [ -x "$top/scripts/$b" ]; then
    echo "=== $b"
    "$top/scripts/$b" "$build" || echo "$b: exited $?"
  fi
done
