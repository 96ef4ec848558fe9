#!/usr/bin/env bash
# bench-cpu.sh: the cpu tier against llama.cpp, same file, same threads, same
# run. Prints prompt (prefill) and decode tokens/s of both and their ratios,
# and each worker's peak resident memory (VmHWM) against the model file size
# plus the KV cache the run fills. A benchmark, not a test: it never fails on
# a slow figure (exit 1 only when a worker cannot run).
#
#   scripts/bench-cpu.sh [BUILD]        (make bench-cpu)
#
# Environment: MODEL (default: the 0.6b-shape Q4_K_M from tg-mkmodel, made
# and cached in $TG_CACHE/models like tests/test_model does), THREADS
# (default 2), PROMPT (prompt tokens, default 128), STEPS (decode steps,
# default 64), REPS (measured rounds, best kept, default 5),
# LLAMA_LIB (default the prebuilt x86-64 libllama from the npm cache),
# ISA=avx2 (x86-64: both at AVX2 on an AVX-512 machine, as on a machine
# without AVX-512: the cpu tier through TG_CPU_ISA=avx2, llama.cpp through
# its haswell CPU variant alone, from a folder of links to the library
# that offers no other variant).
# Both workers speak protocol v1; the figures are the "ms" of their done
# lines: prefill = PROMPT / ms.prefill, decode = (STEPS-1) / ms.decode.
# The two workers run at the same time and take the requests in turns (see
# below), so the ratios compare them under the same load.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
case $build in /*) ;; *) build=$top/$build ;; esac
cache=${TG_CACHE:-$top/.cache}
threads=${THREADS:-2}
prompt_n=${PROMPT:-128}
steps=${STEPS:-64}
reps=${REPS:-5}
lib=${LLAMA_LIB:-$cache/npm/linux-x64/bins/linux-x64/libllama.so}
engine=$build/bin/tg-engine
llama=$build/bin/tg-llama
isa=${ISA:-}

for b in "$engine" "$llama"; do
  [ -x "$b" ] || { echo "bench-cpu: $b is not built (make BUILD=${build#$top/})" >&2; exit 1; }
done
[ -f "$lib" ] || { echo "bench-cpu: $lib is missing (make fetch)" >&2; exit 1; }

model=${MODEL:-}
if [ -z "$model" ]; then
  mk=$build/bin/tg-mkmodel
  [ -x "$mk" ] || { echo "bench-cpu: $mk is not built" >&2; exit 1; }
  sha=$(sha256sum "$mk" | cut -c1-16)
  mkdir -p "$cache/models"
  model=$cache/models/mk-$sha-0.6b-q4_k_m-s1.gguf
  if [ ! -f "$model" ]; then
    echo "bench-cpu: generating $model (once)" >&2
    "$mk" --preset 0.6b --type q4_k_m --seed 1 -o "$model" >&2
  fi
fi

# The prompt: token ids 1000, 1001, ... (any valid ids do for speed).
ids=$(seq 1000 $((1000 + prompt_n - 1)) | paste -sd, -)
n_ctx=$((prompt_n + steps + 16))
decode_req="{\"op\":\"decode\",\"prompt\":[$ids],\"steps\":$steps,\"top_k\":8}"

# The two workers run side by side, each started once and loaded once, and
# take the same requests in turns: a warm-up decode each (pages the model
# in), then REPS rounds of one measured decode each, the order swapped every
# round, so a load that comes and goes on the machine falls on both alike.
# Each worker's best prefill and best decode are kept.
fifo_dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$fifo_dir"
}
trap cleanup EXIT

case $isa in
  '') ;;
  avx2)
    # llama.cpp loads the best CPU variant it finds beside its library: the
    # links offer only the haswell one (AVX2, FMA, F16C)
    libdir=$(dirname "$lib")
    [ -f "$libdir/libggml-cpu-haswell.so" ] || { echo "bench-cpu: ISA=avx2: no libggml-cpu-haswell.so in $libdir" >&2; exit 1; }
    mkdir "$fifo_dir/lib"
    for f in "$libdir"/*.so*; do
      case $(basename "$f") in libggml-cpu-*) [ "$(basename "$f")" = libggml-cpu-haswell.so ] || continue ;; esac
      ln -s "$f" "$fifo_dir/lib/"
    done
    lib=$fifo_dir/lib/$(basename "$lib")
    export TG_CPU_ISA=avx2 ;;
  *) echo "bench-cpu: ISA=$isa: expected avx2 (or unset)" >&2; exit 2 ;;
esac

# start_worker IDX argv...: the worker's requests go to fd win[IDX], its
# answers come from fd wout[IDX].
declare -a win wout wpid
start_worker() {
  local i=$1; shift
  mkfifo "$fifo_dir/in$i" "$fifo_dir/out$i"
  "$@" <"$fifo_dir/in$i" >"$fifo_dir/out$i" 2>/dev/null &
  wpid[$i]=$!
  pids+=("$!")
  local fi fo
  exec {fi}>"$fifo_dir/in$i" {fo}<"$fifo_dir/out$i"
  win[$i]=$fi
  wout[$i]=$fo
}

# request IDX JSON: sends one request, prints the answer's last line (a
# load's one line; a decode's done line; or the error). The answer is read
# by grep in blocks, not by bash a byte at a time: the reader must not take
# CPU time from the worker it times (the worker writes nothing after that
# line until its next request, so nothing read past it is lost).
request() {
  local i=$1
  echo "$2" >&"${win[$i]}"
  case $2 in
    *'"op":"load"'*) head -n 1 <&"${wout[$i]}" ;;
    *) grep -m 1 -E '"done"|"ok":false' <&"${wout[$i]}" ;;
  esac
}

names=(tg-engine llama.cpp)
load_req="{\"op\":\"load\",\"model\":\"$model\",\"options\":{\"threads\":$threads,\"n_ctx\":$n_ctx}}"
file_bytes=$(stat -c %s "$model")
# KV cache the run fills: layers x positions x kv width x (K and V) x bytes.
read -r n_layer kv_dim < <("$engine" --tier cpu <<<"{\"op\":\"load\",\"model\":\"$model\",\"options\":{\"threads\":1,\"n_ctx\":16}}" 2>/dev/null |
  sed -n 's/.*"n_layer":\([0-9]*\).*"n_head_kv":\([0-9]*\),"head_dim":\([0-9]*\).*/\1 \2 \3/p' |
  awk '{print $1, $2 * $3}')
positions=$((prompt_n + steps - 1))
kv_f16=$((n_layer * positions * kv_dim * 2 * 2))

echo "bench-cpu: command: THREADS=$threads PROMPT=$prompt_n STEPS=$steps REPS=$reps${MODEL:+ MODEL=$MODEL}${isa:+ ISA=$isa} scripts/bench-cpu.sh ${build#$top/}"
echo "bench-cpu: $(basename "$model") ($((file_bytes / 1048576)) MiB), $threads threads, prompt $prompt_n tokens, $steps decode steps, best of $reps"
echo "bench-cpu: $(uname -m), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
start_worker 0 "$engine" --tier cpu --threads "$threads"
start_worker 1 "$llama" --lib "$lib"
for i in 0 1; do
  line=$(request $i "$load_req")
  case $line in *'"ok":true'*) ;; *) echo "bench-cpu: ${names[$i]} load failed: $line" >&2; exit 1 ;; esac
done
best_p=(0 0)
best_d=(0 0)
for r in $(seq 0 "$reps"); do
  order="0 1"
  [ $((r % 2)) -eq 1 ] && order="1 0"
  for i in $order; do
    line=$(request $i "$decode_req")
    case $line in *'"ok":true'*) ;; *) echo "bench-cpu: ${names[$i]} decode failed: $line" >&2; exit 1 ;; esac
    [ "$r" -eq 0 ] && continue   # warm-up
    mp=$(sed -n 's/.*"prefill":\([0-9.e+-]*\).*/\1/p' <<<"$line")
    md=$(sed -n 's/.*"decode":\([0-9.e+-]*\).*/\1/p' <<<"$line")
    read -r best_p[$i] best_d[$i] < <(awk -v p="$mp" -v d="$md" -v bp="${best_p[$i]}" -v bd="${best_d[$i]}" \
      -v n="$prompt_n" -v s="$steps" 'BEGIN {
        tp = n / (p / 1000); td = (s - 1) / (d / 1000);
        if (tp > bp) bp = tp; if (td > bd) bd = td; printf "%.3f %.3f\n", bp, bd }')
  done
done
hwm=()
for i in 0 1; do
  hwm[$i]=$(awk '/^VmHWM:/ {print $2}' "/proc/${wpid[$i]}/status")
  echo '{"op":"bye"}' >&"${win[$i]}"
done
for i in 0 1; do
  exec {win[$i]}>&-
  wait "${wpid[$i]}" 2>/dev/null || true
done
echo "bench-cpu: load average after $(cut -d' ' -f1-3 /proc/loadavg)"
ep=${best_p[0]} ed=${best_d[0]} eh=${hwm[0]}
lp=${best_p[1]} ld=${best_d[1]} lh=${hwm[1]}
awk -v ep="$ep" -v ed="$ed" -v eh="$eh" -v lp="$lp" -v ld="$ld" -v lh="$lh" -v fb="$file_bytes" -v kv="$kv_f16" 'BEGIN {
  printf "%-10s %14s %14s %14s\n", "", "prefill tok/s", "decode tok/s", "VmHWM MiB"
  printf "%-10s %14.2f %14.2f %14.1f\n", "tg-engine", ep, ed, eh / 1024
  printf "%-10s %14.2f %14.2f %14.1f\n", "llama.cpp", lp, ld, lh / 1024
  printf "RATIO_PREFILL=%.3f   (target >= 1.00)\n", ep / lp
  printf "RATIO_DECODE=%.3f   (target >= 1.30)\n", ed / ld
  lim = fb * 1.10 + kv
  printf "MEMORY: tg-engine VmHWM %.1f MiB; file %.1f MiB + 10%% + KV cache (f16, %d positions) %.1f MiB = %.1f MiB: %s\n",
    eh / 1024, fb / 1048576, '"$positions"', kv / 1048576, lim / 1048576, (eh * 1024 <= lim) ? "within" : "OVER"
}'
