#!/usr/bin/env bash
# Weight-streaming speed of the CPU kernels (GB/s of weight bytes) next to
# memcpy, a plain read and llama.cpp's own ggml vec_dot kernels, plus the
# prefill-shaped tg_cpu_matmul. Builds the helper into BUILD (default
# build/) first; extra arguments go to bench-kernels (-m MB -c COLS -t
# THREADS -r REPS -T TIER). Set TG_CPU_ISA to pin the tier tg_cpu_matmul uses.
#   scripts/bench-kernels.sh              # every tier, 256 MiB per matrix
#   BUILD=build/rel scripts/bench-kernels.sh -t 2 -T avx512vnni
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-build}
make -C "$root" --no-print-directory BUILD="$build" "$build/bin/bench-kernels" >&2
export TG_CACHE=${TG_CACHE:-$root/.cache}
exec "$root/$build/bin/bench-kernels" "$@"
