#!/usr/bin/env bash
# Builds llama.cpp's libllama + ggml with a GPU backend from the llama.cpp
# source bundled with the pinned node-llama-cpp package, for tg-llama on
# the GPU machine (tg-llama dlopens the result: no relinking of tokgate).
#
#   scripts/build-llama-gpu.sh                  CUDA, sm_90 (H100/H200)
#   scripts/build-llama-gpu.sh --arch 89        CUDA, another compute capability
#   scripts/build-llama-gpu.sh --hip            HIP/ROCm, gfx90a;gfx1030
#   scripts/build-llama-gpu.sh --hip --arch gfx942
#   options: -j N (default 2), --out DIR
#
# Output (printed on stdout when done):
#   ${XDG_CACHE_HOME:-$HOME/.cache}/tokgate/llama-<cuda|hip>-<arch>-<bundle sha256[0:16]>/lib/libllama.so
# with libggml*.so beside it. Only the library targets are built (llama and
# the ggml it links; no tools, tests, examples or server), shared, with the
# backends linked in (GGML_BACKEND_DL=OFF), so the folder is self-contained.
# Idempotent: a finished build with the same stamp is not rebuilt. Use it as
#   tg-llama --lib DIR/lib/libllama.so      (spec: llama: {lib: DIR/lib/libllama.so})
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cache=${TOKGATE_CACHE:-$top/.cache}
kind=cuda arch= jobs=2 out=
while [ $# -gt 0 ]; do
  case $1 in
    --hip) kind=hip; shift ;;
    --cuda) kind=cuda; shift ;;
    --arch) arch=$2; shift 2 ;;
    -j) jobs=$2; shift 2 ;;
    -j*) jobs=${1#-j}; shift ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--cuda|--hip] [--arch ARCH] [-j N] [--out DIR]" >&2; exit 2 ;;
  esac
done
[ -n "$arch" ] || { [ $kind = cuda ] && arch=90 || arch="gfx90a;gfx1030"; }

bundle=$cache/npm/node-llama-cpp/llama/gitRelease.bundle
src=$cache/llama.cpp
[ -f "$bundle" ] && [ -f "$src/CMakeLists.txt" ] \
  || { echo "build-llama-gpu: llama.cpp source missing: run scripts/fetch-npm.sh" >&2; exit 1; }
command -v cmake >/dev/null || { echo "build-llama-gpu: cmake not found" >&2; exit 1; }

flags=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=OFF
       -DGGML_NATIVE=OFF -DGGML_CPU=ON
       -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF
       -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
       -DLLAMA_BUILD_APP=OFF -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON)
env_prefix=()
if [ $kind = cuda ]; then
  command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] \
    || { echo "build-llama-gpu: nvcc not found (install the CUDA toolkit, or PATH=/usr/local/cuda/bin:\$PATH)" >&2; exit 1; }
  flags+=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$arch")
  [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null \
    && flags+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
else
  command -v hipconfig >/dev/null || { echo "build-llama-gpu: hipconfig not found (ROCm/HIP SDK)" >&2; exit 1; }
  flags+=(-DGGML_HIP=ON "-DGPU_TARGETS=$arch")
  env_prefix=(env "HIPCXX=$(hipconfig -l)/clang" "HIP_PATH=$(hipconfig -R)")
fi

sum=$(sha256sum "$bundle" | cut -c1-16)
tag=$(printf '%s' "$arch" | tr ';' '_')
dest=${out:-${XDG_CACHE_HOME:-$HOME/.cache}/tokgate/llama-$kind-$tag-$sum}
commit=unknown
[ -e "$src/.git" ] && commit=$(git -C "$src" rev-parse --verify -q HEAD 2>/dev/null || echo unknown)
stamp="kind=$kind arch=$arch bundle=$sum commit=$commit flags=${flags[*]}"
if [ -f "$dest/lib/libllama.so" ] && [ -f "$dest/STAMP" ] && [ "$(cat "$dest/STAMP")" = "$stamp" ]; then
  echo "$dest/lib/libllama.so"; exit 0
fi

mkdir -p "$dest/lib"
echo "build-llama-gpu: configuring $kind ($arch) llama.cpp $commit in $dest/build" >&2
"${env_prefix[@]}" cmake -S "$src" -B "$dest/build" "${flags[@]}" >"$dest/cmake.log" 2>&1 \
  || { echo "build-llama-gpu: configure failed, see $dest/cmake.log" >&2; exit 1; }
echo "build-llama-gpu: building llama + ggml (-j$jobs; GPU kernels take a long while)" >&2
"${env_prefix[@]}" cmake --build "$dest/build" --target llama -j "$jobs" >"$dest/build.log" 2>&1 \
  || { echo "build-llama-gpu: build failed, see $dest/build.log" >&2; exit 1; }
# Collect the shared objects (real files and their soname links) in lib/.
find "$dest/build" \( -name 'libllama.so*' -o -name 'libggml*.so*' \) \( -type f -o -type l \) \
  -exec cp -P {} "$dest/lib/" \;
[ -e "$dest/lib/libllama.so" ] || { echo "build-llama-gpu: no libllama.so produced" >&2; exit 1; }
printf '%s\n' "$stamp" >"$dest/STAMP"
echo "$dest/lib/libllama.so"
