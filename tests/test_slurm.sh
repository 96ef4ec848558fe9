#!/usr/bin/env bash
# test_slurm.sh: the sharded nightly sweep on a real single-node Slurm.
#
# Starts munged, slurmctld and slurmd by hand (config in a temporary folder:
# one node, this machine, 2 CPUs, proctrack/linuxproc, no cgroups), and
# runs two nights into one history store, as a team would:
# - night 1: specs/sweeps/nightly.yaml as a 4-shard job array plus the
#   dependent merge job (scripts/slurm/submit.sh ... --cpus-per-task=2),
#   while the same sweep runs unsharded. Checks that each shard task was
#   given the CPUs its plan asks for and at least the threads of the spec's
#   arms (and that without the option the plan asks threads x jobs), that
#   the merged history holds the same verdicts as the unsharded store, that
#   the merge job exits 0 (every spec is FIRST), and that merging a shard
#   again changes nothing.
# - night 2: nightly-cpu with the engine's perturb option (a near tie
#   flips): the merge job must fail with exit 1, its trend naming the
#   regression and its likely cause.
# The daemons are stopped (by their pids) whatever happens.
#
# Skips (exit 0 with a SKIPPED line) when Slurm or munge is not installed,
# when not root (slurmd launches jobs), or when the workers or the model are
# missing. Environment: TG_ROOT, TG_BUILD as set by scripts/run-tests.sh.
set -u
root=${TG_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
build=${TG_BUILD:-$root/build}
skip() { echo "test_slurm: SKIPPED: $*"; exit 0; }
fail() { echo "test_slurm: FAIL: $*"; exit 1; }
for b in munged slurmctld slurmd sbatch squeue sinfo scontrol sqlite3; do
  command -v "$b" >/dev/null || skip "$b is not installed (apt-get install slurm-wlm munge sqlite3)"
done
[ "$(id -u)" = 0 ] || skip "slurmd must run as root to start jobs"
for f in "$build/bin/tokgate" "$build/bin/tg-engine" "$build/bin/tg-llama" \
         "$root/models/tiny-trained-qwen3-Q4_K_M.gguf" "$root/specs/sweeps/nightly.yaml"; do
  [ -e "$f" ] || skip "$f is missing"
done

T=$(mktemp -d /tmp/tg-test-slurm-XXXXXX)
host=$(hostname -s)
port=$((20000 + RANDOM % 20000))
mkdir -p "$T/state" "$T/spool" "$T/munge" "$T/out"
chmod 700 "$T/munge"
cleanup() {
  for p in slurmd slurmctld munged; do
    [ -f "$T/$p.pid" ] && kill "$(cat "$T/$p.pid")" 2>/dev/null
  done
  sleep 1
  for p in slurmd slurmctld munged; do
    [ -f "$T/$p.pid" ] && kill -9 "$(cat "$T/$p.pid")" 2>/dev/null
  done
  if [ "${TG_KEEP:-0}" = 1 ]; then echo "test_slurm: kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT

# munge: our own key, socket and pid file
dd if=/dev/urandom of="$T/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$T/munge/munge.key"
munged --key-file="$T/munge/munge.key" --socket="$T/munge/munge.sock" \
       --pid-file="$T/munged.pid" --log-file="$T/munge/munged.log" \
       --seed-file="$T/munge/munged.seed" --force 2>"$T/munge/start.err" ||
  fail "munged did not start: $(cat "$T/munge/start.err")"

cat >"$T/slurm.conf" <<CONF
ClusterName=tokgate
SlurmctldHost=$host
SlurmctldAddr=127.0.0.1
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$T/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
NodeName=$host NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=tokgate Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$T/slurm.conf
slurmctld -f "$T/slurm.conf" -i || fail "slurmctld did not start: $(tail -5 "$T/slurmctld.log" 2>/dev/null)"
slurmd -f "$T/slurm.conf" || fail "slurmd did not start: $(tail -5 "$T/slurmd.log" 2>/dev/null)"
up=0
for _ in $(seq 1 60); do
  state=$(sinfo -h -o %t 2>/dev/null | head -1)
  case "$state" in idle*|mix*|alloc*) up=1; break ;; esac
  sleep 1
done
[ $up = 1 ] || fail "the node did not come up (state '${state:-none}'): $(tail -5 "$T/slurmd.log" 2>/dev/null)"
echo "test_slurm: slurm up on $host (port $port)"

cd "$root"
export TOKGATE=$build/bin/tokgate
H=$T/history/nightly.db

# the plan's CPUs: threads x jobs by default, jobs capped by --cpus-per-task
spec_threads=$(sed -n 's/.*threads: *\([0-9][0-9]*\).*/\1/p' specs/default.yaml | sort -n | tail -1)
"$TOKGATE" plan specs/sweeps/nightly.yaml --shards 4 --out "$T/plan-free.json" >"$T/plan-free.txt" ||
  fail "tokgate plan failed"
grep -q "cpus-per-task: $((spec_threads * 2)) " "$T/plan-free.txt" ||
  fail "the plan should ask $spec_threads threads x 2 jobs: $(cat "$T/plan-free.txt")"

# night 1: 4 shards, 2 CPUs each (the node has 2)
ids=$(bash scripts/slurm/submit.sh specs/sweeps/nightly.yaml 4 "$T/out1" "$H" --cpus-per-task=2) ||
  fail "submit.sh failed: $ids"
array=$(echo "$ids" | awk '/^array/{print $2}')
merge=$(echo "$ids" | awk '/^merge/{print $2}')
echo "test_slurm: night 1: array job $array, merge job $merge"
# every shard task got the CPUs the plan asks, and at least the spec's threads
cpt=$(scontrol show job "$array" 2>/dev/null | grep -o 'CPUs/Task=[0-9]*' | sort -u)
planned=$(sed -n 's/^ *"cpus_per_task": *\([0-9][0-9]*\).*/\1/p' "$T/out1/plan.json")
[ "$cpt" = "CPUs/Task=$planned" ] || fail "shard tasks asked '$cpt', the plan says $planned"
[ "$planned" -ge "$spec_threads" ] || fail "shards get $planned CPUs, fewer than the arms' $spec_threads threads"
grep -q '"jobs": 1,' "$T/out1/plan.json" || fail "with 2 CPUs the plan should run one leg at a time"
echo "test_slurm: shard tasks ask $cpt (arms use $spec_threads threads; jobs capped to 1)"

# the same sweep, unsharded, while Slurm works
"$TOKGATE" sweep specs/sweeps/nightly.yaml --db "$T/unsharded.db" >"$T/unsharded.txt" 2>"$T/unsharded.err"
rc=$?
[ $rc -le 1 ] || fail "unsharded sweep: exit $rc: $(tail -5 "$T/unsharded.err")"

wait_jobs() {
  for _ in $(seq 1 600); do
    [ -z "$(squeue -h -j "$1" 2>/dev/null)" ] && return 0
    sleep 1
  done
  fail "Slurm jobs still queued after 600 s: $(squeue -h)"
}
job_exit() { scontrol show job "$1" 2>/dev/null | grep -o ' ExitCode=[0-9]*:[0-9]*' | head -1; }
wait_jobs "$array,$merge"
[ -f "$H" ] || fail "no history store; merge log: $(cat "$T/out1/merge.log" 2>/dev/null); shard logs: $(tail -3 "$T"/out1/shard-*.log 2>/dev/null)"
for i in 1 2 3 4; do
  [ -f "$T/out1/shard-$i.db" ] || fail "shard $i store missing: $(tail -5 "$T/out1/shard-$i.log" 2>/dev/null)"
done
[ "$(cat "$T/out1/merge.exit" 2>/dev/null)" = 0 ] || fail "night 1's merge should exit 0: $(tail -20 "$T/out1/merge.log")"
[ "$(job_exit "$merge")" = " ExitCode=0:0" ] || fail "night 1's merge job: $(job_exit "$merge")"

verdicts() {
  sqlite3 "$1" "SELECT s.name, r.verdict, coalesce(v.arm, '-'), coalesce(v.prompt, '-'), v.key, v.value
                FROM verdict v JOIN run r ON r.id = v.run_id JOIN spec s ON s.id = r.spec_id
                WHERE v.set_no = (SELECT max(set_no) FROM verdict_set WHERE run_id = r.id)
                ORDER BY 1, 3, 4, 5, 6"
}
n_runs=$(sqlite3 "$H" "SELECT count(*) FROM run")
[ "$n_runs" = 4 ] || fail "the history has $n_runs runs, expected 4"
verdicts "$T/unsharded.db" >"$T/v-unsharded.txt"
verdicts "$H" >"$T/v-merged.txt"
[ -s "$T/v-unsharded.txt" ] || fail "the unsharded store has no verdicts"
if ! cmp -s "$T/v-unsharded.txt" "$T/v-merged.txt"; then
  diff "$T/v-unsharded.txt" "$T/v-merged.txt" | head -20
  fail "merged verdicts differ from the unsharded sweep's"
fi
echo "test_slurm: merged verdicts equal the unsharded sweep's ($(wc -l <"$T/v-merged.txt") verdict rows, 4 runs)"

# idempotent: merging shard 1 again adds nothing
before=$(sqlite3 "$H" "SELECT (SELECT count(*) FROM run), (SELECT count(*) FROM step), (SELECT count(*) FROM verdict)")
out=$("$TOKGATE" merge "$T/out1/shard-1.db" -o "$H") || fail "merging shard 1 again: $out"
after=$(sqlite3 "$H" "SELECT (SELECT count(*) FROM run), (SELECT count(*) FROM step), (SELECT count(*) FROM verdict)")
[ "$before" = "$after" ] || fail "merging shard 1 again changed the store: $before -> $after"
echo "$out" | grep -q "0 runs added" || fail "merging shard 1 again: $out"

# night 2: nightly-cpu with a perturbed engine arm; the merge job must fail
cat >"$T/perturbed.yaml" <<YAML
name: nightly-tiny
overrides:
  steps: 8
  legs: 2
  prompts:
    - {id: p1, text: "The following options are supported:"}
    - {id: p2, text: "def __init__(self, *args, **kwargs):"}
specs:
  - spec: $root/specs/default.yaml
    name: nightly-cpu
    arms: [cpu, llama-cpu]
    arm_options: {cpu: {perturb: "noise=0.04:out_norm:-1"}}
YAML
ids=$(bash scripts/slurm/submit.sh "$T/perturbed.yaml" 1 "$T/out2" "$H" --cpus-per-task=2) ||
  fail "submit.sh (night 2) failed: $ids"
array=$(echo "$ids" | awk '/^array/{print $2}')
merge=$(echo "$ids" | awk '/^merge/{print $2}')
echo "test_slurm: night 2: array job $array, merge job $merge"
wait_jobs "$array,$merge"
[ "$(cat "$T/out2/merge.exit" 2>/dev/null)" = 1 ] ||
  fail "night 2's merge should exit 1 (a regression): $(tail -20 "$T/out2/merge.log" 2>/dev/null)"
[ "$(job_exit "$merge")" = " ExitCode=1:0" ] || fail "night 2's merge job should fail with 1: $(job_exit "$merge")"
grep -q "REGRESSION cpu: tokens: " "$T/out2/merge.log" && grep -q 'options.perturb - -> "noise=0.04:out_norm:-1"' "$T/out2/merge.log" ||
  fail "night 2's trend should name the tokens regression and the perturb option: $(cat "$T/out2/merge.log")"
grep -q "TREND_SPECS=1" "$T/out2/merge.log" || fail "night 2's trend should cover its plan's one spec"
[ -f "$T/out2/trend.md" ] && [ -f "$T/out2/svg/nightly-cpu-trend.svg" ] || fail "night 2: no trend.md or SVG"
echo "test_slurm: night 2's merge job failed with 1: $(grep -m1 'REGRESSION cpu' "$T/out2/merge.log" | cut -c1-100)..."
echo "test_slurm: PASS"
