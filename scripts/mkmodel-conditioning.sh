#!/usr/bin/env bash
# How much a tg-mkmodel file amplifies rounding: writes a 0.6b-shape Q4_K_M
# file (seed 1; extra tg-mkmodel options pass through, e.g. --n-layer 36),
# runs a teacher-forced gate over the ref tier with the cpu tier and
# llama.cpp's x86-64 CPU build (both round activations to 8 bits, as every
# fast arm does), and prints per arm the mean KL to the ref tier, the steps
# decided against it at a gap of 0.5 or more, and the spread of the ref
# tier's top1-top2 gaps. A file fit for the GPU gates shows no such step and
# a KL near 0.01 or below (engine/tools/tg-mkmodel.c, "Conditioning").
#
# Usage (repository root, after make all and make fetch):
#   bash scripts/mkmodel-conditioning.sh [--steps N] [tg-mkmodel options...]
# About a minute on 2 cores at 24 steps; the file and the store stay in
# $TMPDIR/tg-conditioning.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
steps=24
if [ "${1:-}" = --steps ]; then steps=$2; shift 2; fi
B=${BUILD:-build}
d=${TMPDIR:-/tmp}/tg-conditioning
mkdir -p "$d"
for t in tg-mkmodel tokgate tg-engine tg-llama; do
  [ -x "$B/bin/$t" ] || { echo "mkmodel-conditioning: $B/bin/$t is missing (make all)" >&2; exit 2; }
done
lib=.cache/npm/linux-x64/bins/linux-x64/libllama.so
[ -f "$lib" ] || { echo "mkmodel-conditioning: $lib is missing (make fetch)" >&2; exit 2; }
command -v sqlite3 >/dev/null || { echo "mkmodel-conditioning: needs the sqlite3 shell" >&2; exit 2; }

"$B/bin/tg-mkmodel" --preset 0.6b --type q4_k_m --seed 1 "$@" -o "$d/m.gguf" >/dev/null
sha=$(sha256sum "$d/m.gguf" | cut -c1-64)
cat > "$d/spec.yaml" <<EOF
name: mkmodel-conditioning
model: {path: $d/m.gguf, sha256: $sha}
prompts: specs/prompts/manpy6.txt
steps: $steps
top_k: 32
legs: 1
jobs: 1
mode: teacher-forced
reference: ref
policy: {kind: near-tie, band: 0.5}
arms:
  - {name: ref, engine: ref, options: {n_ctx: 256, threads: $(nproc)}}
  - {name: cpu, engine: cpu, options: {n_ctx: 256, threads: $(nproc)}}
  - {name: llama-cpu, llama: {lib: $lib, options: {threads: $(nproc), n_ctx: 256}}}
EOF
rm -f "$d/tokgate.db"
TOKGATE_BIN=$top/$B/bin "$B/bin/tokgate" gate "$d/spec.yaml" --db "$d/tokgate.db" > "$d/gate.txt" 2>&1 || true
echo "tg-mkmodel 0.6b $* (sha256 $sha), 6 prompts x $steps steps over the ref tier:"
sqlite3 -separator ' ' "$d/tokgate.db" \
  "SELECT printf('  %-10s KL mean %.4f, steps against it at gap >= 0.5: %d, divergences %d/%d', arm, avg(kl),
          sum(class NOT IN ('EXACT','NEAR_TIE')), sum(token != ref_token), count(*))
   FROM compare WHERE set_no = 1 GROUP BY arm"
sqlite3 -separator ' ' "$d/tokgate.db" \
  "SELECT printf('  ref gaps: %d steps, %d below 0.5, %d below 1.0; distinct ref tokens %d', count(*),
          sum(ref_gap < 0.5), sum(ref_gap < 1.0), count(DISTINCT ref_token))
   FROM compare WHERE set_no = 1 AND arm = 'cpu'"
