#!/usr/bin/env bash
# Store ingest: synthetic top-32 step rows written through store_put_leg,
# rows per second and bytes per step on disk, for the real Qwen3 vocabulary
# and for identical legs (stored once: same_as); and, when a gate store is
# there (default: the tokgate.db of `make gate`), its real step rows
# replayed (a copy: the store is never touched), once cycled to 200k rows
# and once as much as the default gate writes (4 arms x 2 legs x 288 steps,
# leg 2 equal to leg 1). docs/store.md has the figures.
# Usage: scripts/bench-store.sh [BUILD] [STORE]
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
  echo "== one default gate's worth of them"
  "$build/bin/bench-store" --replay "$tmp/replay.db" --steps 2304 --legs 2
fi
