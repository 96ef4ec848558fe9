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
#   scripts/build-llama-completion.sh [-j N] [--cpu-variant NAME|auto|native]
#
# CPU code path: llama.cpp's numerics depend on the SIMD kernels compiled in
# (a 0.05 logit near-tie can flip between an -march=native build and the
# prebuilt). The prebuilt npm libllama ships one ggml-cpu library per x86
# feature set (haswell, skylakex, zen4, ...) and loads the best one this CPU
# supports; with --cpu-variant auto (the default on x86-64) the stock build
# is compiled for that same variant's features, read from the bundled
# ggml/src/CMakeLists.txt and matched against /proc/cpuinfo, so both run the
# same kernels. --cpu-variant zen4 names one; native uses -march=native.
#
# Usage of the result (greedy, raw prompt, generated text only on stdout):
#   llama-completion -m MODEL -p PROMPT -n 48 --temp 0 -no-cnv --no-warmup \
#     --simple-io --no-display-prompt -t 2 -s 0 2>/dev/null
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cache=${TOKGATE_CACHE:-$top/.cache}
jobs=2 variant=auto
while [ $# -gt 0 ]; do
  case $1 in
    -j) jobs=$2; shift 2 ;;
    -j*) jobs=${1#-j}; shift ;;
    --cpu-variant) variant=$2; shift 2 ;;
    *) echo "usage: $0 [-j N] [--cpu-variant NAME|auto|native]" >&2; exit 2 ;;
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

# The x86 variant: name and features, as ggml_add_cpu_backend_variant lists them.
cpu_flags=()
if [ "$variant" != native ] && [ "$(uname -m)" = x86_64 ]; then
  variants=$(awk '/GGML_SYSTEM_ARCH STREQUAL "x86"/ {on=1; next} on && /elseif/ {on=0}
                  on && /ggml_add_cpu_backend_variant\(/ {
                    sub(/.*ggml_add_cpu_backend_variant\(/, ""); sub(/\).*/, ""); print }' \
             "$src/ggml/src/CMakeLists.txt")
  [ -n "$variants" ] || { echo "build-llama-completion: no x86 variants in ggml/src/CMakeLists.txt" >&2; exit 1; }
  cpuflag() { case $1 in SSE42) echo sse4_2 ;; AVX512) echo avx512f ;; AVX512_VBMI) echo avx512vbmi ;;
              *) echo "$1" | tr 'A-Z' 'a-z' ;; esac; }
  have=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  pick= pick_feats= best=-1
  while read -r name feats; do
    if [ "$variant" = auto ]; then
      ok=1; n=0
      for f in $feats; do case $have in *" $(cpuflag "$f") "*) n=$((n+1)) ;; *) ok=0 ;; esac; done
      if [ $ok = 1 ] && [ $n -gt $best ]; then best=$n pick=$name pick_feats=$feats; fi
    elif [ "$name" = "$variant" ]; then pick=$name pick_feats=$feats
    fi
  done <<<"$variants"
  [ -n "$pick" ] || { echo "build-llama-completion: unknown --cpu-variant $variant (known: $(echo "$variants" | cut -d' ' -f1 | tr '\n' ' '))" >&2; exit 1; }
  echo "build-llama-completion: CPU variant $pick ($pick_feats)" >&2
  cpu_flags=(-DGGML_NATIVE=OFF)
  for f in SSE42 AVX F16C FMA AVX2 BMI2 AVX512 AVX512_VBMI AVX512_VNNI AVX512_BF16 AVX_VNNI AMX_TILE AMX_INT8; do
    case " $pick_feats " in *" $f "*) cpu_flags+=("-DGGML_$f=ON") ;; *) cpu_flags+=("-DGGML_$f=OFF") ;; esac
  done
fi
flags+=("${cpu_flags[@]}")
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
