#!/usr/bin/env bash
# The default gate's wall time and the harness's share of it: tokgate prints
# its own CPU time (spawning, protocol parsing, the store) against the wall
# time of the legs. Targets (issue 6): gate <= 60 s on a 2-core VM, harness
# share <= 3%. Usage: scripts/bench-gate.sh [BUILD]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
case $build in /*) ;; *) build=$top/$build ;; esac
db=$(mktemp -d)/bench-gate.db
cd "$top"
start=$(date +%s.%N)
"$build/bin/tokgate" gate specs/default.yaml --db "$db" >/dev/null 2>"$db.err" || true
end=$(date +%s.%N)
grep '^tokgate: run' "$db.err" || cat "$db.err"
awk -v a="$start" -v b="$end" 'BEGIN { printf "bench-gate: default gate %.1f s wall (target <= 60 s)\n", b - a }'
rm -rf "$(dirname "$db")"
