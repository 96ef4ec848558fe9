#!/usr/bin/env bash
# One session of the gpu tier on a machine with an NVIDIA GPU and nvcc:
# builds with nvcc (sm_90), runs the kernel-level tests, the model test on
# the shipped trained model, a 0.6b-shape Q4_K_M from tg-mkmodel (when a
# Qwen3 tokenizer.json is given) and the benchmark on the synthetic 8b
# shape. Logs go to the output folder.
#
#   bash scripts/gpu-device-run.sh [--out DIR] [--build DIR] [--debs DIR]
#        [--tokenizer FILE] [--no-06b]
#
#   --out DIR         logs (/tmp/gpu-out)
#   --build DIR       the build folder (build/dev)
#   --debs DIR        Debian 12 .debs of this project's -dev packages, for a
#                     machine that lacks them: unpacked into /tmp and put on
#                     the include and library paths
#   --tokenizer FILE  the Qwen3 tokenizer.json (its tokenizer_config.json beside
#                     it) for tg-mkmodel's 0.6b file
#                     (without it the 0.6b part is skipped)
#   --no-06b          skip the 0.6b file
# Run from the repository root.
set -u
usage() { sed -n '/^#   bash scripts\/gpu-device-run.sh/,/^#   --no-06b/p' "$0" | sed 's/^#//' >&2; exit 2; }
OUT=/tmp/gpu-out B=build/dev DEBS= TOK= RUN06=1
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT=${2:?--out DIR}; shift 2 ;;
    --build) B=${2:?--build DIR}; shift 2 ;;
    --debs) DEBS=${2:?--debs DIR}; shift 2 ;;
    --tokenizer) TOK=${2:?--tokenizer FILE}; shift 2 ;;
    --no-06b) RUN06=0; shift ;;
    -h|--help) usage ;;
    *) echo "gpu-device-run: unknown argument $1" >&2; usage ;;
  esac
done
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
head -2 /etc/os-release; nvcc --version | tail -1; gcc --version | head -1
LINK_LIBS=
if [ -n "$DEBS" ]; then
  P=/tmp/gpudeps; mkdir -p $P
  for f in "$DEBS"/*.deb; do dpkg -x "$f" $P; done
  L=$P/usr/lib/x86_64-linux-gnu
  export C_INCLUDE_PATH=$P/usr/include:$P/usr/include/x86_64-linux-gnu
  export CPLUS_INCLUDE_PATH=$C_INCLUDE_PATH LIBRARY_PATH=$L LD_LIBRARY_PATH=$L:${LD_LIBRARY_PATH:-}
  LINK_LIBS="-lsqlite3 -lzstd -lpcre2-8 -ljansson -lfyaml -lcrypto -lxxhash"   # no pkg-config files there
fi
export TG_ROOT=$PWD TG_BUILD=$PWD/$B TG_CACHE=$PWD/.cache
t0=$(date +%s)
make -f engine/gpu/gpu.mk BUILD=$B -j16 gpu >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
timeout 120 $B/gpu/tests/test_gpu_ops > "$OUT/ops.txt" 2>&1; echo "test_gpu_ops rc=$?"
grep -v "^OK" "$OUT/ops.txt" | head -40; grep -c "^OK" "$OUT/ops.txt"
timeout 150 $B/gpu/tests/test_gpu_model > "$OUT/model-tiny.txt" 2>&1; echo "test_gpu_model(tiny) rc=$?"
tail -20 "$OUT/model-tiny.txt"
timeout 150 $B/gpu/tests/bench_gpu --synthetic 8b --prefill 512 --decode 128 > "$OUT/bench-8b.txt" 2>&1
echo "bench rc=$?"; cat "$OUT/bench-8b.txt"
timeout 60 $B/gpu/tests/bench_gpu --synthetic 8b --prefill 64 --decode 64 --no-graph 2>&1 | grep decode_tok
if [ "$RUN06" = 1 ] && [ -n "$TOK" ]; then
  make BUILD=$B NO_SETUP=1 -j16 ${LINK_LIBS:+PKG_LIBS="$LINK_LIBS"} $B/bin/tg-mkmodel >>"$OUT/build.log" 2>&1 \
    || echo "tg-mkmodel build failed"
  s=$(date +%s)
  timeout 120 $B/bin/tg-mkmodel --preset 0.6b --type q4_k_m --seed 1 --tokenizer "$TOK" -o /tmp/q06.gguf \
    > "$OUT/mk06.txt" 2>&1
  echo "mkmodel 0.6b rc=$? in $(( $(date +%s) - s )) s"
  if [ -f /tmp/q06.gguf ]; then
    TG_GPU_YARDSTICK=ref TG_GPU_STEPS=6 timeout 150 $B/gpu/tests/test_gpu_model /tmp/q06.gguf > "$OUT/model-06.txt" 2>&1
    echo "test_gpu_model(0.6b) rc=$?"; tail -12 "$OUT/model-06.txt"
    timeout 60 $B/gpu/tests/bench_gpu /tmp/q06.gguf --prefill 256 --decode 128 | tail -3
  fi
fi
echo "total $(( $(date +%s) - t0 )) s"
