#!/usr/bin/env bash
# The aarch64 llama.cpp oracle as one command: the cross-built tg-llama
# (make aarch64) over the prebuilt arm64 libllama, under qemu-user. It
# speaks arm protocol v1 on stdin/stdout, so a spec can name it as an
# `exec:` arm; the spec's `llama: {lib, worker, wrap}` form runs the same
# argv. Extra arguments are passed to tg-llama.
#
#   scripts/run-aarch64.sh [--lib PATH/libllama.so]
# Environment: AARCH64_WORKER (default build/aarch64/bin/tg-llama),
# AARCH64_SYSROOT (default /usr/aarch64-linux-gnu).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
worker=${AARCH64_WORKER:-$top/build/aarch64/bin/tg-llama}
sysroot=${AARCH64_SYSROOT:-/usr/aarch64-linux-gnu}
lib=$top/.cache/npm/linux-arm64/bins/linux-arm64/libllama.so
command -v qemu-aarch64 >/dev/null || { echo "run-aarch64: qemu-aarch64 not found (apt-get install qemu-user)" >&2; exit 2; }
[ -x "$worker" ] || { echo "run-aarch64: $worker missing (make aarch64)" >&2; exit 2; }
case " $* " in *" --lib "*) exec qemu-aarch64 -L "$sysroot" "$worker" "$@" ;; esac
exec qemu-aarch64 -L "$sysroot" "$worker" --lib "$lib" "$@"
