#!/usr/bin/env bash
# Submits a tokgate sweep to Slurm: a plan of N shards, a job array that
# runs them (shard.sbatch) and a merge job that waits for the array
# (merge.sbatch). Run from the repository root (specs name paths relative
# to it); prints the two job ids.
#
#   scripts/slurm/submit.sh SWEEP.yaml N OUTDIR [sbatch options...]
#
# Environment: TOKGATE (default build/bin/tokgate, made absolute here).
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 SWEEP.yaml N OUTDIR [sbatch options...]" >&2; exit 2; }
sweep=$1; n=$2; out=$3; shift 3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
export TOKGATE=$(realpath "${TOKGATE:-build/bin/tokgate}")
export TOKGATE_OUT=$out TOKGATE_SHARDS=$n TOKGATE_PLAN=$out/plan.json
"$TOKGATE" plan "$sweep" --shards "$n" --out "$TOKGATE_PLAN" >"$out/plan.txt"
array=$(sbatch --parsable --array=1-"$n" --chdir="$PWD" --output="$out/shard-%a.log" "$@" "$here/shard.sbatch")
array=${array%%;*}
merge=$(sbatch --parsable --dependency=afterany:"$array" --chdir="$PWD" --output="$out/merge.log" "$@" "$here/merge.sbatch")
merge=${merge%%;*}
echo "array $array"
echo "merge $merge"
