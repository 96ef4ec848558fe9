#!/usr/bin/env bash
# test_slurm.sh: the sharded sweep on a real single-node Slurm.
#
# Starts munged, slurmctld and slurmd by hand (config in a temporary folder:
# one node, this machine, 2 CPUs, proctrack/linuxproc, no cgroups), submits
# specs/sweeps/nightly.yaml as a 4-shard job array plus the dependent merge
# job (scripts/slurm/submit.sh), runs the same sweep unsharded meanwhile,
# waits for Slurm (bounded), and checks that the merged store holds the same
# verdicts as the unsharded one, and that merging a shard again changes
# nothing. The daemons are stopped (by their pids) whatever happens.
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
ids=$(bash scripts/slurm/submit.sh specs/sweeps/nightly.yaml 4 "$T/out") || fail "submit.sh failed: $ids"
array=$(echo "$ids" | awk '/^array/{print $2}')
merge=$(echo "$ids" | awk '/^merge/{print $2}')
echo "test_slurm: array job $array, merge job $merge"

# the same sweep, unsharded, while Slurm works
"$TOKGATE" sweep specs/sweeps/nightly.yaml --db "$T/unsharded.db" >"$T/unsharded.txt" 2>"$T/unsharded.err"
rc=$?
[ $rc -le 1 ] || fail "unsharded sweep: exit $rc: $(tail -5 "$T/unsharded.err")"

for _ in $(seq 1 600); do
  [ -z "$(squeue -h -j "$array,$merge" 2>/dev/null)" ] && break
  sleep 1
done
[ -z "$(squeue -h -j "$array,$merge" 2>/dev/null)" ] || fail "Slurm jobs still queued after 600 s: $(squeue -h)"
[ -f "$T/out/merged.db" ] || fail "no merged store; merge log: $(cat "$T/out/merge.log" 2>/dev/null); shard logs: $(tail -3 "$T"/out/shard-*.log 2>/dev/null)"
for i in 1 2 3 4; do
  [ -f "$T/out/shard-$i.db" ] || fail "shard $i store missing: $(tail -5 "$T/out/shard-$i.log" 2>/dev/null)"
done

verdicts() {
  sqlite3 "$1" "SELECT s.name, r.verdict, coalesce(v.arm, '-'), coalesce(v.prompt, '-'), v.key, v.value
                FROM verdict v JOIN run r ON r.id = v.run_id JOIN spec s ON s.id = r.spec_id
                WHERE v.set_no = (SELECT max(set_no) FROM verdict_set WHERE run_id = r.id)
                ORDER BY 1, 3, 4, 5, 6"
}
n_runs=$(sqlite3 "$T/out/merged.db" "SELECT count(*) FROM run")
[ "$n_runs" = 4 ] || fail "merged store has $n_runs runs, expected 4"
verdicts "$T/unsharded.db" >"$T/v-unsharded.txt"
verdicts "$T/out/merged.db" >"$T/v-merged.txt"
[ -s "$T/v-unsharded.txt" ] || fail "the unsharded store has no verdicts"
if ! cmp -s "$T/v-unsharded.txt" "$T/v-merged.txt"; then
  diff "$T/v-unsharded.txt" "$T/v-merged.txt" | head -20
  fail "merged verdicts differ from the unsharded sweep's"
fi
echo "test_slurm: merged verdicts equal the unsharded sweep's ($(wc -l <"$T/v-merged.txt") verdict rows, 4 runs)"

# idempotent: merging shard 1 again adds nothing
before=$(sqlite3 "$T/out/merged.db" "SELECT (SELECT count(*) FROM run), (SELECT count(*) FROM step), (SELECT count(*) FROM verdict)")
out=$("$TOKGATE" merge "$T/out/shard-1.db" -o "$T/out/merged.db") || fail "merging shard 1 again: $out"
after=$(sqlite3 "$T/out/merged.db" "SELECT (SELECT count(*) FROM run), (SELECT count(*) FROM step), (SELECT count(*) FROM verdict)")
[ "$before" = "$after" ] || fail "merging shard 1 again changed the store: $before -> $after"
echo "$out" | grep -q "0 runs added" || fail "merging shard 1 again: $out"
echo "test_slurm: PASS"
