#!/usr/bin/env bash
# Nsight Compute (ncu) profile of the gpu tier's decode launches, on a GPU
# machine, from the folder scripts/gpu-pack.sh packed. Run from the
# repository root:
#
#   bash scripts/gpu-profile.sh --pack DIR [--out DIR] [--work DIR]
#        [--kernels REGEX] [--layers FIRST:N] [--set NAME] [--prefill N]
#        [--decode N] [--times]
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
#   --times           first, every matching launch's duration alone
#
# bench_gpu --synthetic 8b --no-graph (warm-up, a prefill of N tokens, the
# decode steps) under ncu: the chosen layers of the last step with the
# section set (profile.ncu-rep, and as text: details.txt, and
# source-KERNEL.csv, the per-line stall samples and instruction counts of
# each kernel's first profiled launch; the build carries -lineinfo). With
# --times, first every matching launch with its duration and DRAM bytes,
# launched one at a time (launches.csv; launches-summary.txt: the last
# step's launches by kernel). ncu is given --clock-control none: the clocks
# are left as the machine has them, as in the benchmark. The launches are
# counted, not named: the fused kernels serve single-token steps only, so
# the warm-up's 4 steps and the decode steps hold all of them.
set -u
usage() { sed -n '/^#   bash scripts\/gpu-profile.sh/,/^#   --times/p' "$0" | sed 's/^#//' >&2; exit 2; }
C= OUT=/tmp/gpu-profile W=build/gpu-profile SET=full PREFILL=512 LAYERS=4:3 DECODE=1 TIMES=0
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
    --times) TIMES=1; shift ;;
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
command -v ncu >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
command -v ncu >/dev/null || { echo "gpu-profile: ncu (Nsight Compute) is not on this machine" >&2; exit 1; }
mkdir -p "$OUT" "$W/bin" "$W/deps"
tar -C "$W/bin" -xzf "$C/bin.tar.gz" && tar -C "$W/deps" -xzf "$C/deps.tar.gz" || { echo "gpu-profile: unpacking $C failed" >&2; exit 1; }
export LD_LIBRARY_PATH=$W/deps:${LD_LIBRARY_PATH:-}
B=("$W/bin/bench_gpu" --synthetic 8b --no-graph --prefill "$PREFILL" --decode "$DECODE")
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
ncu --version | tail -1

# a decode step's fused launches: 7 a layer (2 norms, q/k/v, attention, o,
# gate/up, down), then the final norm and the vocabulary projection; the
# prefills use none of them, so the profiled step's launches are found by
# count: bench_gpu's 4 warm-up steps, then its decode steps
step=$(( 36 * 7 + 2 ))   # the synthetic 8b shape: 36 layers
N=$(( (4 + DECODE) * step ))
if [ "$TIMES" = 1 ]; then   # every matching launch, its duration alone
  T=$(date +%s)
  timeout 200 ncu --clock-control none -k "regex:$KRE" --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
      --print-units base "${B[@]}" > "$OUT/launches.raw" 2> "$OUT/launches.err"
  echo "gpu-profile: launch times rc=$? in $(( $(date +%s) - T )) s"
  grep '^"' "$OUT/launches.raw" > "$OUT/launches.csv"
  N=$(awk -F'","' 'NR > 1 { gsub(/"/, "", $1); if (!($1 in seen)) { seen[$1] = 1; n++ } } END { print n + 0 }' \
      "$OUT/launches.csv")
  python3 - "$OUT/launches.csv" "$step" <<'PYEOF' > "$OUT/launches-summary.txt"
import csv, sys, collections
rows = list(csv.DictReader(open(sys.argv[1])))
step = int(sys.argv[2])
t = [r for r in rows if r.get("Metric Name") == "gpu__time_duration.sum"]
b = {r["ID"]: float(r["Metric Value"].replace(",", "")) for r in rows if r.get("Metric Name") == "dram__bytes_read.sum"}
agg = collections.OrderedDict()
for r in t[-step:]:
    k = r["Kernel Name"].split("(")[0]
    a = agg.setdefault(k, [0, 0.0, 0.0])
    a[0] += 1; a[1] += float(r["Metric Value"].replace(",", "")); a[2] += b.get(r["ID"], 0.0)
tot = sum(a[1] for a in agg.values()) or 1.0
print("the last decode step, launches one at a time")
for k, a in agg.items():
    print(f"{k:40s} n={a[0]:4d} total_us={a[1]/1e3:9.1f} ({100*a[1]/tot:4.1f}%) per_launch_us={a[1]/a[0]/1e3:7.2f} "
          f"MB={a[2]/a[0]/1e6:7.2f} TB/s={a[2]/a[1]/1e3 if a[1] else 0:5.2f}")
print(f"{'sum':40s} total_us={tot/1e3:9.1f}")
PYEOF
  cat "$OUT/launches-summary.txt"
fi
echo "gpu-profile: $N matching launches expected"
SKIP=$(( N - step + 7 * L0 )) CNT=$(( 7 * LN ))

# 2. the chosen layers of the last step, in full
T=$(date +%s)
timeout 200 ncu --clock-control none -k "regex:$KRE" --launch-skip "$SKIP" --launch-count "$CNT" --set "$SET" \
    --import-source yes -f -o "$OUT/profile" "${B[@]}" > "$OUT/profile.log" 2>&1
echo "gpu-profile: pass 2 (--set $SET, $CNT launches from $SKIP) rc=$? in $(( $(date +%s) - T )) s"
ncu -i "$OUT/profile.ncu-rep" --page details --print-details all --print-units base > "$OUT/details.txt" 2>&1
for k in $(echo "$KRE" | tr '|' ' '); do
  ncu -i "$OUT/profile.ncu-rep" -k "regex:$k" -c 1 --page source --csv --print-source cuda,sass \
      > "$OUT/source-$k.csv" 2> "$OUT/source-$k.err" || rm -f "$OUT/source-$k.csv"
done
ls -la "$OUT"
