#!/usr/bin/env bash
# Tokenizer throughput: tokgate's tokenizer and llama.cpp's on the same
# deterministic 10 MB text, one core each, printed side by side with the
# ratio. Runs on the shipped trained vocabulary and, when the test suite has
# written it, on the real Qwen3 vocabulary (151,936 tokens).
#
#   scripts/bench-tokenizer.sh [BUILD] [MB]      (BUILD defaults to build)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
mb=${2:-10}
case $build in /*) ;; *) build=$root/$build ;; esac
cache=${TG_CACHE:-$root/.cache}
bin=$build/bin/bench-tokenizer
lib=$cache/npm/linux-x64/bins/linux-x64/libllama.so
corpus=$root/tests/data/tokenizer_corpus.txt
[ -x "$bin" ] || { echo "bench-tokenizer: $bin not built (make $bin)" >&2; exit 2; }
[ -r "$lib" ] || { echo "bench-tokenizer: no llama.cpp library at $lib (make fetch)" >&2; exit 2; }
echo "== trained vocabulary (8192 tokens, qwen2)"
taskset -c 0 "$bin" "$root/models/tiny-trained-qwen3-Q4_K_M.gguf" "$lib" "$corpus" "$mb"
q=$build/tok-qwen3-vocab.gguf
if [ -r "$q" ]; then
  echo "== Qwen3 vocabulary (151,936 tokens, qwen2)"
  taskset -c 0 "$bin" "$q" "$lib" "$corpus" "$mb"
else
  echo "(no $q: run $build/tests/test_tokenizer once to write it)"
fi
