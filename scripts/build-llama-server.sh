#!/usr/bin/env bash
# Builds stock llama.cpp `llama-server` (CPU only) for the http arm's tests
# and specs/server.yaml: the server people deploy, gated through its HTTP API
# against tg-llama over the same libllama.
#
# As scripts/build-llama-completion.sh does for llama-completion, this
# compiles only the server's own sources from the llama.cpp source bundled
# with the pinned node-llama-cpp package (tools/server/*.cpp), the
# multimodal library the server links (tools/mtmd: mtmd*.cpp, clip.cpp,
# models/*.cpp; llama.cpp builds it as its own library, not part of
# `common`) and vendor/hash, with g++ against the bundled headers, and links
# them against the SAME prebuilt libraries tg-llama loads
# (.cache/npm/linux-x64/bins/linux-x64: libllama-common.so, which already
# holds cpp-httplib and the rest of `common`, libllama.v0.4.0.so,
# libggml.v0.4.0.so, libggml-base.so), with an rpath to that folder and the
# prebuilt CPU backends symlinked next to the binary (ggml_backend_load_all()
# looks there). Same kernels, same rounding as the llama arm.
#
# The embedded web UI: the bundle has the UI's sources (tools/ui) but no
# built assets (tools/ui/dist), and building them needs npm packages or a
# download. The server builds without them: tools/ui/embed.cpp, run with no
# asset folder, writes an empty asset table (ui.cpp/ui.h without
# LLAMA_UI_HAS_ASSETS), and the server then serves the API only. Nothing is
# downloaded: the build works offline.
#
# Cached outside the repository, idempotent (nothing is rebuilt when the
# binary and its stamp exist; an interrupted build keeps its objects):
#   ${XDG_CACHE_HOME:-$HOME/.cache}/tokgate/llama-server-<bundle>-<libs>/bin/llama-server
# where <bundle> is the first 16 hex digits of the bundle's sha256 and <libs>
# those of the sha256 of the prebuilt libraries' sha256 list. Points the
# symlink <repo>/build/bin/llama-server at the binary (for specs/server.yaml
# and tests/test_server.c). Prints the binary's path on stdout (progress
# goes to stderr). Several minutes on 2 cores the first time (-j N: compile
# jobs, default 2).
#
#   scripts/build-llama-server.sh [-j N]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cache=${TOKGATE_CACHE:-$top/.cache}
. "$top/scripts/llama-prebuilt.sh"
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
pre=$cache/npm/linux-x64/bins/linux-x64
[ -f "$bundle" ] || { echo "build-llama-server: $bundle missing: run scripts/fetch-npm.sh" >&2; exit 1; }
[ -f "$src/tools/server/server.cpp" ] || { echo "build-llama-server: $src/tools/server missing: run scripts/fetch-npm.sh" >&2; exit 1; }
[ "$(uname -m)" = x86_64 ] || { echo "build-llama-server: links the x86-64 prebuilt libllama; not on $(uname -m)" >&2; exit 1; }
prebuilt_check build-llama-server "$pre"

sum=$(sha256sum "$bundle" | cut -c1-16)
libsum=$(prebuilt_sum "$pre")
commit=unknown
[ -e "$src/.git" ] && commit=$(git -C "$src" rev-parse --verify -q HEAD 2>/dev/null || echo unknown)
dest=${XDG_CACHE_HOME:-$HOME/.cache}/tokgate/llama-server-$sum-$libsum
bin=$dest/bin/llama-server
cxxflags=(-std=c++17 -O2 -pthread -w)
stamp="relink bundle=$sum commit=$commit libs=$libsum prebuilt=$pre cxx=$(g++ -dumpfullversion) flags=${cxxflags[*]}"
prebuilt_cached "$bin" "$dest" "$stamp" "$top"
# objects of another stamp (compiler, flags) are not reused
if [ -f "$dest/obj/STAMP" ] && [ "$(cat "$dest/obj/STAMP")" != "$stamp" ]; then rm -rf "$dest/obj"; fi
mkdir -p "$dest/bin" "$dest/obj" "$dest/ui"
printf '%s\n' "$stamp" >"$dest/obj/STAMP"
log=$dest/build.log
: >"$log"

# the empty UI asset table
if [ ! -f "$dest/ui/ui.cpp" ]; then
  g++ -std=c++17 -O1 -o "$dest/ui/llama-ui-embed" "$src/tools/ui/embed.cpp" >>"$log" 2>&1 \
    || { echo "build-llama-server: compiling tools/ui/embed.cpp failed, see $log" >&2; exit 1; }
  "$dest/ui/llama-ui-embed" "$dest/ui/ui.cpp.tmp" "$dest/ui/ui.h" >>"$log" 2>&1 \
    || { echo "build-llama-server: llama-ui-embed failed, see $log" >&2; exit 1; }
  mv "$dest/ui/ui.cpp.tmp" "$dest/ui/ui.cpp"
fi

inc=(-I"$src/include" -I"$src/ggml/include" -I"$src/common" -I"$src/vendor"
     -I"$src/vendor/hash" -I"$src/tools/mtmd" -I"$src/tools/server" -I"$src" -I"$dest/ui")
srcs=()
for f in server-chat server-task server-queue server-common server-context server-stream \
         server-tools server-mcp server-schema server server-http server-models main; do
  srcs+=("$src/tools/server/$f.cpp")
done
for f in mtmd mtmd-audio mtmd-image mtmd-helper mtmd-helper-gen clip; do srcs+=("$src/tools/mtmd/$f.cpp"); done
mtmd_models=$(sed -n 's/^ *models\/\([A-Za-z0-9_.-]*\.cpp\) *$/\1/p' "$src/tools/mtmd/CMakeLists.txt")
[ -n "$mtmd_models" ] || { echo "build-llama-server: no models/*.cpp listed in tools/mtmd/CMakeLists.txt" >&2; exit 1; }
for f in $mtmd_models; do srcs+=("$src/tools/mtmd/models/$f"); done
srcs+=("$src/vendor/hash/hash.cpp" "$src/vendor/hash/xxhash/xxhash.c" "$src/vendor/hash/sha256/sha256.c" "$src/vendor/hash/sha1/sha1.c")
srcs+=("$dest/ui/ui.cpp")

# one object per source, named after its path under the tree; compiled
# only when missing (an interrupted build resumes), $jobs at a time
objs=()
todo=()
for s in "${srcs[@]}"; do
  [ -f "$s" ] || { echo "build-llama-server: $s missing from the bundle" >&2; exit 1; }
  rel=${s#"$src/"}; rel=${rel#"$dest/"}
  o=$dest/obj/$(printf '%s' "$rel" | tr '/' '_').o
  objs+=("$o")
  [ -f "$o" ] || todo+=("$s"$'\t'"$o")
done
echo "build-llama-server: compiling ${#todo[@]} of ${#objs[@]} sources against the bundled headers (-j$jobs)" >&2
compile() {
  local s=${1%%$'\t'*} o=${1#*$'\t'} cc=(g++ "${cxxflags[@]}")
  # vendor/hash: sha1.c is compiled as C++ (it lives in a namespace), the
  # other C files as C
  case $s in */sha1.c) cc+=(-x c++) ;; *.c) cc=(gcc -O2 -w) ;; esac
  if "${cc[@]}" "${inc[@]}" -c "$s" -o "$o.tmp" >"$o.log" 2>&1; then
    mv "$o.tmp" "$o"; rm -f "$o.log"
  else
    echo "build-llama-server: g++ failed on $s, see $o.log" >&2; return 1
  fi
}
export -f compile
export cxxflags_s="${cxxflags[*]}" inc_s="${inc[*]}"
if [ ${#todo[@]} -gt 0 ]; then
  # xargs runs bash -c with the arrays rebuilt from their flattened copies
  # (the include paths hold no spaces: the cache path is checked below)
  case "$src$dest" in *' '*) echo "build-llama-server: paths with spaces are not supported: $src, $dest" >&2; exit 1 ;; esac
  printf '%s\0' "${todo[@]}" | xargs -0 -P "$jobs" -n 1 bash -c \
    'read -ra cxxflags <<<"$cxxflags_s"; read -ra inc <<<"$inc_s"; compile "$1"' _ \
    || { echo "build-llama-server: compile failed" >&2; exit 1; }
fi

echo "build-llama-server: linking against the prebuilt libraries in $pre" >&2
g++ -pthread -o "$bin.tmp" "${objs[@]}" -L"$pre" -Wl,--as-needed -lllama-common -lllama \
    -l:libggml.v0.4.0.so -lggml-base -Wl,-rpath,"$pre" >>"$log" 2>&1 \
  || { echo "build-llama-server: link failed, see $log" >&2; exit 1; }
prebuilt_backends "$pre" "$dest/bin"
prebuilt_install build-llama-server "$bin" "$dest" "$stamp" "$top"
