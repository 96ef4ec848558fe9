#!/usr/bin/env bash
# Builds stock llama.cpp `llama-completion` (CPU only) for the chain of
# custody check: the same model and prompt through llama.cpp's own CLI must
# give the same greedy text as tg-llama over libllama.
#
# Default (relink): compile only the tool's own sources
# (tools/completion/completion.cpp + main.cpp of the llama.cpp source bundled
# with the pinned node-llama-cpp package) with g++ against the bundled headers,
# and link them against the SAME prebuilt libraries tg-llama loads
# (.cache/npm/linux-x64/bins/linux-x64: libllama-common.so, llama.cpp's
# `common` library of the same release, libllama.v0.4.0.so,
# libggml.v0.4.0.so, libggml-base.so), with an rpath to that folder. The
# prebuilt ggml is a GGML_BACKEND_DL build: the stock tool's
# ggml_backend_load_all() looks for libggml-cpu-*.so next to the executable
# (/proc/self/exe, symlinks resolved) and in the current directory, so the
# cache folder holds symlinks to the prebuilt CPU variants; ggml scores them
# and loads the best for this CPU, as tg-llama's
# ggml_backend_load_all_from_path(<prebuilt dir>) does. Same kernels, same
# rounding: custody is EXACT or a real defect. One g++ compile (~10 s).
#
# --from-source: the old full cmake build of the bundled tree (static ggml
# compiled here; --cpu-variant picks the x86 feature set, see below). It need
# not round like the prebuilt library at a near-tie, so it is for
# investigation only; it does not replace build/bin/llama-completion.
#
# Cached outside the repository, idempotent (nothing is rebuilt when the
# binary and its stamp exist):
#   relink:      ${XDG_CACHE_HOME:-$HOME/.cache}/tokgate/llama-completion-<bundle>-<libs>/bin/llama-completion
#   from source: ${XDG_CACHE_HOME:-$HOME/.cache}/tokgate/llama-completion-<bundle>/bin/llama-completion
# where <bundle> is the first 16 hex digits of the bundle's sha256 and <libs>
# those of the sha256 of the prebuilt libraries' sha256 list. The relink also
# points the symlink <repo>/build/bin/llama-completion at its binary (for
# specs/custody.yaml and tests/test_llama.c). Prints the binary's path on
# stdout (progress goes to stderr).
#
#   scripts/build-llama-completion.sh [--from-source [-j N] [--cpu-variant NAME|auto|native]]
#
# CPU code path of --from-source: llama.cpp's numerics depend on the SIMD
# kernels compiled in (a 0.05 logit near-tie can flip between an
# -march=native build and the prebuilt). With --cpu-variant auto (the default
# on x86-64) the build is compiled for the features of the variant the
# prebuilt would load, read from the bundled ggml/src/CMakeLists.txt and
# matched against /proc/cpuinfo; --cpu-variant zen4 names one; native uses
# -march=native. Even so it does not round exactly like the prebuilt.
#
# Usage of the result (greedy, raw prompt, generated text only on stdout):
#   llama-completion -m MODEL -p PROMPT -n 48 --temp 0 -no-cnv --no-warmup \
#     --simple-io --no-display-prompt -t 2 -s 0 2>/dev/null
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cache=${TOKGATE_CACHE:-$top/.cache}
. "$top/scripts/llama-prebuilt.sh"
jobs=2 variant=auto from_source=0
while [ $# -gt 0 ]; do
  case $1 in
    --from-source) from_source=1; shift ;;
    -j) jobs=$2; shift 2 ;;
    -j*) jobs=${1#-j}; shift ;;
    --cpu-variant) variant=$2; shift 2 ;;
    *) echo "usage: $0 [--from-source [-j N] [--cpu-variant NAME|auto|native]]" >&2; exit 2 ;;
  esac
done

bundle=$cache/npm/node-llama-cpp/llama/gitRelease.bundle
src=$cache/llama.cpp
[ -f "$bundle" ] || { echo "build-llama-completion: $bundle missing: run scripts/fetch-npm.sh" >&2; exit 1; }
[ -f "$src/CMakeLists.txt" ] || { echo "build-llama-completion: $src missing: run scripts/fetch-npm.sh" >&2; exit 1; }
sum=$(sha256sum "$bundle" | cut -c1-16)
commit=unknown
[ -e "$src/.git" ] && commit=$(git -C "$src" rev-parse --verify -q HEAD 2>/dev/null || echo unknown)

if [ $from_source = 0 ]; then
  [ "$(uname -m)" = x86_64 ] || { echo "build-llama-completion: the relink uses the x86-64 prebuilt; on $(uname -m) use --from-source" >&2; exit 1; }
  pre=$cache/npm/linux-x64/bins/linux-x64
  prebuilt_check build-llama-completion "$pre"
  libsum=$(prebuilt_sum "$pre")
  dest=${XDG_CACHE_HOME:-$HOME/.cache}/tokgate/llama-completion-$sum-$libsum
  bin=$dest/bin/llama-completion
  cxx=(g++ -std=c++17 -O2 -pthread
       -I"$src/include" -I"$src/ggml/include" -I"$src/common" -I"$src/vendor" -I"$src/tools/completion"
       "$src/tools/completion/completion.cpp" "$src/tools/completion/main.cpp"
       -L"$pre" -Wl,--as-needed -lllama-common -lllama -l:libggml.v0.4.0.so -lggml-base
       -Wl,-rpath,"$pre")
  stamp="relink bundle=$sum commit=$commit libs=$libsum prebuilt=$pre cxx=$(g++ -dumpfullversion)"
  prebuilt_cached "$bin" "$dest" "$stamp" "$top"
  mkdir -p "$dest/bin"
  prebuilt_backends "$pre" "$dest/bin"
  echo "build-llama-completion: compiling tools/completion against the prebuilt libraries in $pre" >&2
  "${cxx[@]}" -o "$bin.tmp" >"$dest/build.log" 2>&1 \
    || { echo "build-llama-completion: g++ failed, see $dest/build.log" >&2; exit 1; }
  prebuilt_install build-llama-completion "$bin" "$dest" "$stamp" "$top"
  exit 0
fi

command -v cmake >/dev/null || { echo "build-llama-completion: cmake not found (apt-get install cmake)" >&2; exit 1; }
dest=${XDG_CACHE_HOME:-$HOME/.cache}/tokgate/llama-completion-$sum
bin=$dest/bin/llama-completion
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
