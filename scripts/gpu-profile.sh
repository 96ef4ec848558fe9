#!/usr/bin/env bash
# Nsight Compute (ncu) profile of the gpu tier's decode launches, on a GPU
# machine, from the folder scripts/gpu-pack.sh packed. Run from the
# repository root:
#
#   bash scripts/gpu-profile.sh --pack DIR [--out DIR] [--work DIR]
#        [--kernels REGEX] [--layers FIRST:N] [--set NAME] [--prefill N]
#        [--decode N]
#
#   --pack DIR        what scripts/gpu-pack.sh wrote (required)
#   --out DIR         the reports (/tmp/gpu-profile)
#   --work DIR        where the binaries are unpacked (build/gpu-profile)
#   --kernels REGEX   the decode kernels profiled (the fused decode path's:
#                     norms, mat-vecs, gate/up, attention)
#   --layers F:N      the layers of the last decode step profiled in full (4:3,
#                     the synthetic 8b shape's first Q4_K, Q4_K and Q6_K
#                     down projections)
#   --set NAME        ncu's section set (full: stall reasons, source counters)
#   --prefill N       tokens in the cache before the decode steps (512)
#   --decode N        decode steps after the prefill; the last is profiled (1)
#
# bench_gpu --synthetic 8b --no-graph (warm-up, a prefill of N tokens, the
# decode steps) under ncu: the chosen layers of the last step with the
# section set: profile.ncu-rep (about 40 MB for 21 launches), and as text
# details.txt (every section of every launch, about 7 MB),
# launches-full.txt (a line a launch: duration, DRAM throughput, issue rate,
# active warps, the main stalls, registers, occupancy), source-KERNEL.csv
# (per source line and SASS instruction: stall samples and instruction
# counts of each kernel's first profiled launch; the build carries
# -lineinfo) and source-KERNEL-top.txt (its 30 source lines with the most
# stall samples). ncu is given --clock-control none: the clocks
# are left as the machine has them, as in the benchmark. The launches are
# counted, not named: the fused kernels serve single-token steps only, so
# the warm-up's 4 steps and the decode steps hold all of them.
set -u
usage() { sed -n '/^#   bash scripts\/gpu-profile.sh/,/^#   --decode/p' "$0" | sed 's/^#//' >&2; exit 2; }
C= OUT=/tmp/gpu-profile W=build/gpu-profile SET=full PREFILL=512 LAYERS=4:3 DECODE=1
KRE='k_rmsnorm_q8|k_mv_stream|k_mv_fused|k_mv_swiglu|k_attn_decode'
while [ $# -gt 0 ]; do
  case $1 in
    --pack) C=${2:?--pack DIR}; shift 2 ;;
    --out) OUT=${2:?--out DIR}; shift 2 ;;
    --work) W=${2:?--work DIR}; shift 2 ;;
    --kernels) KRE=${2:?--kernels REGEX}; shift 2 ;;
    --layers) LAYERS=${2:?--layers FIRST:N}; shift 2 ;;
    --set) SET=${2:?--set NAME}; shift 2 ;;
    --prefill) PREFILL=${2:?--prefill N}; shift 2 ;;
    --decode) DECODE=${2:?--decode N}; shift 2 ;;
    -h|--help) usage ;;
    *) echo "gpu-profile: unknown argument $1" >&2; usage ;;
  esac
done
[ -n "$C" ] && [ -d "$C" ] || { echo "gpu-profile: --pack DIR (a folder from scripts/gpu-pack.sh) is required" >&2; usage; }
case $LAYERS in *[!0-9:]*|:*|*:|*:*:*|'') echo "gpu-profile: --layers $LAYERS: expected FIRST:N" >&2; exit 2 ;; esac
case $LAYERS in *:*) ;; *) echo "gpu-profile: --layers $LAYERS: expected FIRST:N" >&2; exit 2 ;; esac
case $PREFILL in ''|*[!0-9]*) echo "gpu-profile: --prefill $PREFILL: expected a token count" >&2; exit 2 ;; esac
case $DECODE in ''|0|*[!0-9]*) echo "gpu-profile: --decode $DECODE: expected a positive step count" >&2; exit 2 ;; esac
L0=${LAYERS%:*} LN=${LAYERS#*:}
[ "$LN" -ge 1 ] && [ $(( L0 + LN )) -le 36 ] || { echo "gpu-profile: --layers $LAYERS: expected N >= 1 layers within the 36 of the 8b shape" >&2; exit 2; }
command -v ncu >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
command -v ncu >/dev/null || { echo "gpu-profile: ncu (Nsight Compute) is not on this machine" >&2; exit 1; }
mkdir -p "$OUT" "$W/bin" "$W/deps"
tar -C "$W/bin" -xzf "$C/bin.tar.gz" && tar -C "$W/deps" -xzf "$C/deps.tar.gz" || { echo "gpu-profile: unpacking $C failed" >&2; exit 1; }
export LD_LIBRARY_PATH=$W/deps:${LD_LIBRARY_PATH:-}
B=("$W/bin/bench_gpu" --synthetic 8b --no-graph --prefill "$PREFILL" --decode "$DECODE")
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
ncu --version | tail -1

# which launches: a decode step's fused launches are 7 a layer (2 norms,
# q/k/v, attention, o, gate/up, down), then the final norm and the
# vocabulary projection; the
# prefills use none of them, so the profiled step's launches are found by
# count: bench_gpu's 4 warm-up steps, then its decode steps
step=$(( 36 * 7 + 2 ))   # the synthetic 8b shape: 36 layers
N=$(( (4 + DECODE) * step ))
echo "gpu-profile: $N matching launches expected"
SKIP=$(( N - step + 7 * L0 )) CNT=$(( 7 * LN ))

# the chosen layers of the last step, in full
T=$(date +%s)
timeout 200 ncu --clock-control none -k "regex:$KRE" --launch-skip "$SKIP" --launch-count "$CNT" --set "$SET" \
    --import-source yes -f -o "$OUT/profile" "${B[@]}" > "$OUT/profile.log" 2>&1
echo "gpu-profile: --set $SET, $CNT launches from $SKIP: rc=$? in $(( $(date +%s) - T )) s"
ncu -i "$OUT/profile.ncu-rep" --page details --print-details all --print-units base > "$OUT/details.txt" 2>&1
# per launch: the figures that say what bounds it
awk '/^  [a-z_ ]*k_[a-z0-9_]*[<(]/ { if (n) print ""; n++; split($0, a, "("); printf "%s", a[1]; g = $0; sub(/.*\) \(/, "(", g); sub(/, Context.*/, "", g); printf " %s:", g }
     /^    (Duration|DRAM Throughput|Registers Per Thread|Achieved Occupancy|Issued Warp Per Scheduler|Active Warps Per Scheduler|Stall Long Scoreboard|Stall Barrier|Stall Membar) / && !seen[n, $1 $2] {
       seen[n, $1 $2] = 1; v = $NF; $NF = ""; sub(/ +(ns|%|inst|warp|register\/thread|cycle) *$/, "", $0); gsub(/^ +| +$/, "", $0); printf " %s=%s", $0, v }
     END { print "" }' "$OUT/details.txt" > "$OUT/launches-full.txt"
cat "$OUT/launches-full.txt"
for k in $(echo "$KRE" | tr '|' ' '); do
  ncu -i "$OUT/profile.ncu-rep" -k "regex:$k" -c 1 --page source --csv --print-source cuda,sass \
      > "$OUT/source-$k.csv" 2> "$OUT/source-$k.err"
  [ -s "$OUT/source-$k.csv" ] || rm -f "$OUT/source-$k.csv"
  [ -s "$OUT/source-$k.err" ] || rm -f "$OUT/source-$k.err"
done
# each kernel's source lines by stall samples (the first profiled launch;
# rows without a line number are its SASS and are not counted twice)
for f in "$OUT"/source-*.csv; do
  [ -f "$f" ] || continue
  python3 - "$f" <<'PYEOF' > "${f%.csv}-top.txt"
import csv, sys, collections
cur, hdr, agg, tot = None, None, collections.OrderedDict(), 0.0
for r in csv.reader(open(sys.argv[1])):
    if not r: continue
    if r[0] == "File Path": cur, hdr = r[1].split("/")[-1], None; continue
    if r[0] == "Function Name":
        if hdr is None and cur and not agg: print("kernel:", r[1])
        continue
    if r[0] == "Line No": hdr = r; continue
    if hdr is None or not r[0].strip(): continue
    d = dict(zip(hdr, r))
    try: n = float(d.get("Warp Stall Sampling (All Samples)") or 0)
    except ValueError: continue
    a = agg.setdefault((cur, r[0]), [0.0, r[1].strip()[:100], collections.Counter()])
    a[0] += n; tot += n
    for k, v in d.items():
        if k.startswith("stall_") and not k.endswith("(Not Issued)"):
            try: a[2][k[6:]] += float(v or 0)
            except ValueError: pass
print(f"source-line stall samples: {tot:.0f}")
for (fl, ln), (n, src, st) in sorted(agg.items(), key=lambda kv: -kv[1][0])[:30]:
    if n <= 0: break
    top = " ".join(f"{k}={v:.0f}" for k, v in st.most_common(3) if v > 0)
    print(f"{100 * n / (tot or 1):5.1f}% {fl}:{ln} [{top}] {src}")
PYEOF
  head -12 "${f%.csv}-top.txt"
done
ls -la "$OUT"
