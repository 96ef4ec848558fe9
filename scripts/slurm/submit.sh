#!/usr/bin/env bash
# Submits a tokgate sweep to Slurm: a plan of N shards, a job array that
# runs them (shard.sbatch) and a merge job that waits for the array
# (merge.sbatch), merges the night into the history store and runs the
# trend. Run from the repository root (specs name paths relative to it;
# --chdir is set to it); prints the two job ids and the CPUs per shard.
#
#   scripts/slurm/submit.sh SWEEP.yaml N OUTDIR HISTORY.db [sbatch options...]
#
# OUTDIR holds tonight's plan, shard stores and logs; HISTORY.db is the
# store that keeps every night (created by the first merge; keep it). Both
# must be on a filesystem every compute node sees at the same path.
#
# CPUs: each shard task asks for the CPUs its biggest unit needs (threads x
# jobs, from the plan). An sbatch option --cpus-per-task=C (or -c C) is the
# allocation instead: the plan caps each spec's legs side by side to fit it
# (the spec text and its tokens stay the same) and only the shard tasks get
# it. Other sbatch options (--partition, --mail-type=FAIL --mail-user=...)
# go to both jobs.
#
# Environment: TOKGATE (default build/bin/tokgate, made absolute here).
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: $0 SWEEP.yaml N OUTDIR HISTORY.db [sbatch options...]" >&2; exit 2; }
sweep=$1; n=$2; out=$3; history=$4; shift 4
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out" "$(dirname "$history")"
out=$(cd "$out" && pwd)
history=$(cd "$(dirname "$history")" && pwd)/$(basename "$history")
tokgate=$(realpath "${TOKGATE:-build/bin/tokgate}")
export TOKGATE=$tokgate

# --cpus-per-task / -c: the allocation the plan fits; the rest passes through
cap=; opts=()
while [ $# -gt 0 ]; do
  case $1 in
    --cpus-per-task=*) cap=${1#*=} ;;
    --cpus-per-task|-c) [ $# -ge 2 ] || { echo "$0: $1 needs a value" >&2; exit 2; }; cap=$2; shift ;;
    -c*) cap=${1#-c} ;;
    *) opts+=("$1") ;;
  esac
  shift
done
plan_args=(plan "$sweep" --shards "$n" --out "$out/plan.json")
[ -n "$cap" ] && plan_args+=(--cpus-per-task "$cap")
"$tokgate" "${plan_args[@]}" >"$out/plan.txt"
cpus=$(sed -n 's/^ *"cpus_per_task": *\([0-9][0-9]*\).*/\1/p' "$out/plan.json")
[ -n "$cpus" ] || { echo "$0: $out/plan.json has no cpus_per_task" >&2; exit 2; }

array=$(sbatch --parsable --array=1-"$n" --cpus-per-task="$cpus" --chdir="$PWD" --output="$out/shard-%a.log" \
        ${opts[@]+"${opts[@]}"} "$here/shard.sbatch" "$out")
array=${array%%;*}
merge=$(sbatch --parsable --dependency=afterany:"$array" --chdir="$PWD" --output="$out/merge.log" \
        ${opts[@]+"${opts[@]}"} "$here/merge.sbatch" "$out" "$history")
merge=${merge%%;*}
echo "array $array"
echo "merge $merge"
echo "cpus-per-task $cpus"
