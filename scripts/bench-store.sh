#!/usr/bin/env bash
# Store ingest: synthetic top-32 step rows written through store_put_leg,
# rows per second and bytes per step on disk, for the real Qwen3 vocabulary
# and for identical legs (stored once). Targets (issue 6): >= 200k rows/s,
# <= 160 bytes per step; and, when a gate store is there (default: the
# tokgate.db of `make gate`), its real step rows replayed (a copy: the
# store is never touched). Usage: scripts/bench-store.sh [BUILD] [STORE]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
case $build in /*) ;; *) build=$top/$build ;; esac
echo "== unique steps, 151,936-token vocabulary"
"$build/bin/bench-store" --vocab 151936
echo "== 6 identical legs"
"$build/bin/bench-store" --legs 6
replay=${2:-$top/tokgate.db}
if [ -f "$replay" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  cp "$replay" "$tmp/replay.db"
  for x in -wal -shm; do [ -f "$replay$x" ] && cp "$replay$x" "$tmp/replay.db$x"; done
  echo "== real steps replayed from $replay"
  "$build/bin/bench-store" --replay "$tmp/replay.db"
fi
