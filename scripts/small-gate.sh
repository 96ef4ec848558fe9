#!/usr/bin/env bash
# small-gate.sh BUILD [WRAP...]: one small gate on the shipped tiny trained
# model with the binaries of BUILD (make asan, make valgrind). The reference
# is llama.cpp's CPU build (tg-llama); the engine's ref and cpu tiers run as
# exec arms, each started as WRAP... BUILD/bin/tg-engine --tier T (e.g. a
# valgrind command line), and tokgate itself runs under WRAP too.
# Passes (exit 0) when tokgate ends with a verdict (exit 0 or 1) and every
# leg is clean: no cause, no fault pattern in stderr (sanitizer reports and
# valgrind's error exit included). Prints the verdict keys.
set -u
build=${1:?usage: small-gate.sh BUILD [WRAP...]}; shift
build=$(cd "$build" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${TG_CACHE:-$root/.cache}
model=$root/models/tiny-trained-qwen3-Q4_K_M.gguf
lib=$cache/npm/linux-x64/bins/linux-x64/libllama.so
for f in "$build/bin/tokgate" "$build/bin/tg-engine" "$build/bin/tg-llama" "$model" "$lib"; do
  [ -e "$f" ] || { echo "small-gate: missing $f" >&2; exit 2; }
done
dir=$(mktemp -d /tmp/tg-small-gate-XXXXXX)
trap 'rm -rf "$dir"' EXIT
sha=$(sha256sum "$model" | cut -d' ' -f1)
# the wrap as a YAML flow list prefix: [w1, w2, ..., 
wrap=""
for w in "$@"; do wrap="$wrap\"$w\", "; done
cat > "$dir/s.yaml" <<YAML
name: small-gate
model: {path: $model, sha256: $sha}
prompts: [{id: p1, text: "The following options are supported:"}]
steps: ${SMALL_GATE_STEPS:-4}
top_k: 8
legs: 2
reference: llama-cpu
policy: {kind: near-tie, band: 0.20}
timeout: {request: 600, leg: 1200}
arms:
  - {name: llama-cpu, llama: {lib: $lib, options: {threads: 1}}}
  - {name: ref, exec: [${wrap}"$build/bin/tg-engine", --tier, ref]}
  - {name: cpu, exec: [${wrap}"$build/bin/tg-engine", --tier, cpu], options: {threads: 1}}
fault_patterns: ["AddressSanitizer", "LeakSanitizer", "runtime error:", "Invalid read", "Invalid write", "uninitialised"]
YAML
"$@" "$build/bin/tokgate" gate "$dir/s.yaml" --db "$dir/t.db" --jobs 2 --out "$dir/report.txt"
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 1 ]; then
  echo "small-gate: tokgate exited with $rc (expected a verdict: 0 or 1)" >&2
  exit 1
fi
bad=$(sqlite3 "$dir/t.db" "SELECT a.name || ' leg ' || l.leg || ': ' || coalesce(l.cause, '') || ' ' || coalesce(l.fault_lines, '')
  FROM leg l JOIN arm a ON a.id = l.arm_id WHERE l.cause IS NOT NULL OR l.fault_lines IS NOT NULL")
legs=$(sqlite3 "$dir/t.db" "SELECT count(*) FROM leg")
if [ -n "$bad" ] || [ "$legs" != 6 ]; then
  echo "small-gate: $legs legs stored (expected 6); legs with a fault:" >&2
  echo "$bad" >&2
  exit 1
fi
echo "small-gate: 6 clean legs (tokgate exit $rc)"
