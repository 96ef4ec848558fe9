#!/usr/bin/env bash
# Decode and prefill tokens/s of the gpu tier on an 8b-shape Q4_K_M, beside
# llama.cpp CUDA on the same file in the same run when both are there, as a
# ratio, plus the fraction of the memory-bandwidth roofline. A benchmark:
# it never fails on a slow figure.
#
#   bash scripts/gpu-bench.sh GPUBUILD [--model FILE] [--llama-cuda-lib LIB]
#        [--llama-bench BIN] [--prefill N] [--decode N] [--bin DIR]
#
#   GPUBUILD            BUILD/gpu of engine/gpu/gpu.mk (tests/bench_gpu, bin/tg-engine)
#   --model FILE        an 8b-shape Q4_K_M GGUF (default: the synthetic 8b
#                       shape in memory, and no llama.cpp figure)
#   --llama-cuda-lib L  a CUDA libllama.so (e.g. build/llama-cuda/lib/libllama.so
#                       from scripts/gpu-gate.sh, or scripts/build-llama-gpu.sh):
#                       tg-engine --tier gpu and tg-llama over that library get
#                       the same protocol requests, a prompt of --prefill ids and
#                       --decode steps after a warm-up, and the ratio is printed
#   --llama-bench BIN   llama.cpp's llama-bench built with CUDA: the same through
#                       its CSV
#   --prefill N, --decode N   512 and 128
#   --bin DIR           where tg-llama is (GPUBUILD/../bin)
set -u
usage() { sed -n '/^#   bash scripts\/gpu-bench.sh/,/^#   --bin DIR/p' "$0" | sed 's/^#//' >&2; exit 2; }
cmdline="bash scripts/gpu-bench.sh $*"
gb=
model= LLAMA_CUDA_LIB= LLAMA_BENCH= np=512 nd=128 bins=
while [ $# -gt 0 ]; do
  case $1 in
    --model) model=${2:?--model FILE}; shift 2 ;;
    --llama-cuda-lib) LLAMA_CUDA_LIB=${2:?--llama-cuda-lib LIB}; shift 2 ;;
    --llama-bench) LLAMA_BENCH=${2:?--llama-bench BIN}; shift 2 ;;
    --prefill) np=${2:?--prefill N}; shift 2 ;;
    --decode) nd=${2:?--decode N}; shift 2 ;;
    --bin) bins=${2:?--bin DIR}; shift 2 ;;
    -h|--help) usage ;;
    -*) echo "gpu-bench: unknown option $1" >&2; usage ;;
    *) [ -z "$gb" ] || usage; gb=$1; shift ;;
  esac
done
[ -n "$gb" ] || usage
echo "gpu-bench: command: $cmdline"
bench=$gb/tests/bench_gpu
[ -x "$bench" ] || { echo "gpu-bench: $bench not built (make gpu)"; exit 0; }
if [ -n "$model" ]; then src=("$model"); else src=(--synthetic 8b); fi
out=$("$bench" "${src[@]}" --prefill "$np" --decode "$nd") || { echo "$out"; echo "gpu-bench: bench_gpu failed"; exit 0; }
echo "$out"
ours_d=$(sed -n 's/.*decode_tok_s=\([0-9.]*\).*/\1/p' <<<"$out")
ours_p=$(sed -n 's/.*prefill_tok_s=\([0-9.]*\).*/\1/p' <<<"$out")
if [ -n "$model" ] && [ -n "${LLAMA_BENCH:-}" ] && [ -x "${LLAMA_BENCH:-}" ]; then
  lb=$("$LLAMA_BENCH" -m "$model" -p "$np" -n "$nd" -ngl 99 -r 3 -o csv 2>/dev/null) || lb=
  echo "llama-bench csv:"; echo "$lb"
  lp=$(python3 - "$np" "$nd" <<<"$lb" 2>/dev/null <<'PY'
import csv, sys
np_, nd_ = sys.argv[1], sys.argv[2]
rows = list(csv.DictReader(sys.stdin))
p = [r for r in rows if r.get("n_prompt") == np_ and r.get("n_gen") == "0"]
d = [r for r in rows if r.get("n_gen") == nd_ and r.get("n_prompt") == "0"]
print(p[0]["avg_ts"] if p else "", d[0]["avg_ts"] if d else "")
PY
)
  read -r llama_p llama_d <<<"$lp"
  if [ -n "${llama_d:-}" ]; then
    echo "llama_cuda_prefill_tok_s=$llama_p llama_cuda_decode_tok_s=$llama_d"
    python3 -c "print('decode_ratio=%.3f prefill_ratio=%.3f' % ($ours_d/$llama_d, $ours_p/$llama_p))"
  fi
elif [ -n "$model" ] && [ -f "${LLAMA_CUDA_LIB:-}" ]; then
  bins=${bins:-$(dirname "$gb")/bin}
  ids=$(seq -s, 1000 $((999 + np)))
  dec="{\"op\":\"decode\",\"prompt\":[$ids],\"steps\":$((nd + 1)),\"top_k\":32}"
  one() { # name options worker...
    local name=$1 opts=$2; shift 2
    printf '%s\n' '{"op":"hello","protocol":1}' "{\"op\":\"load\",\"model\":\"$model\",\"options\":$opts}" \
      "$dec" "$dec" "$dec" '{"op":"bye"}' | "$@" 2>/dev/null | grep '"done"' |
    awk -v n="$name" -v np="$np" -v nd="$nd" -F'[:,}]' '
      { for (i = 1; i < NF; i++) { if ($i ~ /"prefill"/) p = $(i+1); if ($i ~ /"decode"/ && $(i+1) ~ /^[0-9.]+$/) d = $(i+1) }
        if (NR > 1) { pt = np / (p / 1000); dt = nd / (d / 1000); if (pt > bp) bp = pt; if (dt > bd) bd = dt } }
      END { printf "%s_prefill_tok_s=%.1f %s_decode_tok_s=%.1f\n", n, bp, n, bd }'
  }
  g=$(one gpu_tier '{"n_ctx":1024}' "$gb/bin/tg-engine" --tier gpu)
  l=$(one llama_cuda '{"n_gpu_layers":999,"n_ctx":1024}' "$bins/tg-llama" --lib "$LLAMA_CUDA_LIB")
  echo "$g"; echo "$l"
  awk -v g="$g" -v l="$l" 'BEGIN { split(g, a, /[= ]/); split(l, b, /[= ]/);
    if (b[2] > 0 && b[4] > 0) printf "ratio gpu/llama-cuda: prefill %.2f decode %.2f (protocol requests, best of 2 after a warm-up)\n", a[2]/b[2], a[4]/b[4] }'
else
  echo "gpu-bench: no llama.cpp CUDA figure (give --model and --llama-cuda-lib or --llama-bench for the ratio)"
fi
