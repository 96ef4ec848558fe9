#!/usr/bin/env bash
# How slow is the aarch64 oracle? Runs the cross-built tg-llama over the
# arm64 libllama under qemu-aarch64 on a prompt set (default: the shipped
# model, specs/prompts/manpy6.txt, 48 greedy steps each) and prints the wall
# time of the whole worker session and the summed prefill/decode times the
# worker reports, next to the same session on the native x86-64 oracle.
#
#   scripts/bench-aarch64-oracle.sh [MODEL] [PROMPTS] [STEPS]
# Environment: BUILD (default build), AARCH64_WORKER (default
# build/aarch64/bin/tg-llama), THREADS (x86 threads, default 1).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
model=${1:-models/tiny-trained-qwen3-Q4_K_M.gguf}
prompts=${2:-specs/prompts/manpy6.txt}
steps=${3:-48}
build=${BUILD:-build}
x86=$build/bin/tg-llama
arm=${AARCH64_WORKER:-build/aarch64/bin/tg-llama}
lib_x86=.cache/npm/linux-x64/bins/linux-x64/libllama.so
lib_arm=.cache/npm/linux-arm64/bins/linux-arm64/libllama.so
for f in "$x86" "$arm" "$lib_x86" "$lib_arm" "$model" "$prompts"; do
  [ -e "$f" ] || { echo "bench-aarch64-oracle: $f missing" >&2; exit 1; }
done
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# 1. token ids of every prompt (x86 worker, vocabulary only)
{
  printf '{"op":"load","model":"%s","options":{"vocab_only":true}}\n' "$model"
  while IFS= read -r p || [ -n "$p" ]; do
    p=${p//\\/\\\\}; p=${p//\"/\\\"}
    printf '{"op":"tokenize","text":"%s"}\n' "$p"
  done <"$prompts"
  echo '{"op":"bye"}'
} >"$tmp/tok.in"
"$x86" --lib "$lib_x86" <"$tmp/tok.in" 2>/dev/null | sed -n 's/^{"ok":true,"ids":\(\[[0-9,]*\]\)}$/\1/p' >"$tmp/ids"
n=$(wc -l <"$tmp/ids")

# 2. the decode session
{
  printf '{"op":"load","model":"%s","options":{"threads":%d}}\n' "$model" "${THREADS:-1}"
  while read -r ids; do
    printf '{"op":"decode","prompt":%s,"steps":%d,"top_k":32}\n' "$ids" "$steps"
  done <"$tmp/ids"
  echo '{"op":"bye"}'
} >"$tmp/dec.in"

run() { # name, argv...
  local name=$1; shift
  local t0 t1
  t0=$(date +%s.%N)
  "$@" <"$tmp/dec.in" >"$tmp/$name.out" 2>"$tmp/$name.err"
  t1=$(date +%s.%N)
  awk -v name="$name" -v wall="$(echo "$t1 - $t0" | bc)" -v n="$n" -v steps="$steps" '
    /"done":true/ { match($0, /"prefill":[0-9.e+-]+/); p += substr($0, RSTART+10, RLENGTH-10)
                    match($0, /"decode":[0-9.e+-]+/); d += substr($0, RSTART+9, RLENGTH-9) }
    /"load":/ && /"model"/ { match($0, /"load":[0-9.e+-]+/); l = substr($0, RSTART+7, RLENGTH-7) }
    END { printf "%-8s %d prompts x %d steps: wall %.1f s (load %.0f ms, prefill %.0f ms, decode %.0f ms = %.1f ms/step)\n",
          name, n, steps, wall, l, p, d, d / (n * (steps - 1)) }' "$tmp/$name.out"
}
run x86 "$x86" --lib "$lib_x86"
run aarch64 qemu-aarch64 -L /usr/aarch64-linux-gnu "$arm" --lib "$lib_arm"
cmp -s <(grep -o '"token":[0-9]*' "$tmp/x86.out") <(grep -o '"token":[0-9]*' "$tmp/aarch64.out") \
  && echo "greedy tokens: identical" \
  || echo "greedy tokens: differ at $(diff <(grep -o '"token":[0-9]*' "$tmp/x86.out") <(grep -o '"token":[0-9]*' "$tmp/aarch64.out") | grep -c '^<') of $((n * steps)) steps (free-running: the first difference changes the rest of that prompt)"
