#!/usr/bin/env bash
# Decode and prefill tokens/s of the GPU arm on an 8b-shape Q4_K_M, beside
# llama.cpp CUDA on the same file in the same run when both are there, as a
# ratio, plus the fraction of the memory-bandwidth roofline. A benchmark:
# it never fails on a slow figure.
# Usage: scripts/gpu-bench.sh GPUBUILD   (GPUBUILD = BUILD/gpu, holding tests/bench_gpu)
# Environment: TG_GPU_BENCH_MODEL (an 8b-shape Q4_K_M GGUF; default: the
#   synthetic 8b shape in memory), LLAMA_BENCH (llama.cpp's llama-bench built
#   with CUDA, e.g. by scripts/build-llama-gpu.sh), TG_GPU_PREFILL (512),
#   TG_GPU_DECODE (128).
set -u
gb=${1:?usage: gpu-bench.sh GPUBUILD}
bench=$gb/tests/bench_gpu
[ -x "$bench" ] || { echo "gpu-bench: $bench not built (make gpu)"; exit 0; }
np=${TG_GPU_PREFILL:-512}; nd=${TG_GPU_DECODE:-128}
model=${TG_GPU_BENCH_MODEL:-}
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
else
  echo "gpu-bench: no llama.cpp CUDA figure (set TG_GPU_BENCH_MODEL and LLAMA_BENCH for the ratio)"
fi
