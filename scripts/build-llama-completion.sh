#!/usr/bin/env bash
# Builds stock llama.cpp `llama-completion` (CPU only) from the llama.cpp
# source bundled with the pinned node-llama-cpp package, for the chain of
# custody check: the same model and prompt through llama.cpp's own CLI must
# give the same greedy text as tg-llama over libllama.
#
# The build is cached outside the repository, keyed by the bundle's sha256:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/tokgate/llama-completion-<sha256[0:16]>/bin/llama-completion
# Idempotent: when that binary and its stamp exist, nothing is rebuilt.
# Prints the binary's path on stdout (progress goes to stderr).
#
#   scripts/build-llama-completion.sh [-j N]      (default -j2)
#
# Usage of the result (greedy, raw prompt, generated text only on stdout):
#   llama-completion -m MODEL -p PROMPT -n 48 --temp 0 -no-cnv --no-warmup \
#     --simple-io --no-display-prompt -t 2 -s 0 2>/dev/null
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cache=${TOKGATE_CACHE:-$top/.cache}
jobs=2
while [ $# -gt 0 ]; do
  case $1 in
    -j) jobs=$2; shift 2 ;;
    -j*) jobs=${1#-j}; shift ;;
    *) echo "usage: $0 [-j N]" >&2; exit 2 ;;
  esac
done

bundle=$cache/npm/node-llama-cpp/llama/gitRelease.bundle
src=$cache/llama.cpp
[ -f "$bundle" ] || { echo "build-llama-completion: $bundle missing: run scripts/fetch-npm.sh" >&2; exit 1; }
[ -f "$src/CMakeLists.txt" ] || { echo "build-llama-completion: $src missing: run scripts/fetch-npm.sh" >&2; exit 1; }
command -v cmake >/dev/null || { echo "build-llama-completion: cmake not found (apt-get install cmake)" >&2; exit 1; }

sum=$(sha256sum "$bundle" | cut -c1-16)
dest=${XDG_CACHE_HOME:-$HOME/.cache}/tokgate/llama-completion-$sum
bin=$dest/bin/llama-completion
commit=unknown
[ -e "$src/.git" ] && commit=$(git -C "$src" rev-parse --verify -q HEAD 2>/dev/null || echo unknown)
flags=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF
       -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF
       -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF
       -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON
       -DGGML_CUDA=OFF -DGGML_HIP=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF)
stamp="bundle=$sum commit=$commit flags=${flags[*]}"

if [ -x "$bin" ] && [ -f "$dest/STAMP" ] && [ "$(cat "$dest/STAMP")" = "$stamp" ]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$dest/bin"
echo "build-llama-completion: configuring llama.cpp $commit in $dest/build" >&2
cmake -S "$src" -B "$dest/build" "${flags[@]}" >"$dest/cmake.log" 2>&1 \
  || { echo "build-llama-completion: cmake configure failed, see $dest/cmake.log" >&2; exit 1; }
echo "build-llama-completion: building llama-completion (-j$jobs; several minutes)" >&2
cmake --build "$dest/build" --target llama-completion -j "$jobs" >"$dest/build.log" 2>&1 \
  || { echo "build-llama-completion: build failed, see $dest/build.log" >&2; exit 1; }
found=$(find "$dest/build" -type f -name llama-completion -perm -u+x | head -1)
[ -n "$found" ] || { echo "build-llama-completion: no llama-completion binary produced" >&2; exit 1; }
cp "$found" "$bin.tmp" && mv "$bin.tmp" "$bin"
printf '%s\n' "$stamp" >"$dest/STAMP"
echo "$bin"
