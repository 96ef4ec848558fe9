#!/usr/bin/env bash
# Runs every benchmark the project has, each printing its figures as ratios
# against llama.cpp measured in the same run where llama.cpp has the same
# operation. Benchmarks are never tests: nothing here fails on a slow figure.
# Usage: scripts/bench.sh [BUILD]
set -u
build=${1:-build}
top=$(cd "$(dirname "$0")/.." && pwd)
export TG_BUILD=$top/$build TG_ROOT=$top TG_CACHE=${TG_CACHE:-$top/.cache}
run() { echo "=== $*"; "$@" || echo "$1: exited $?"; }
run "$top/scripts/bench-tokenizer.sh" "$build"
BUILD=$build run "$top/scripts/bench-kernels.sh" -m 64
run "$top/scripts/bench-store.sh" "$build"
run "$top/scripts/bench-gate.sh" "$build"
run "$top/scripts/bench-cpu.sh" "$build"
