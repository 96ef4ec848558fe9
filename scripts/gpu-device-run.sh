#!/usr/bin/env bash
# One device session of the GPU arm, for a machine with an NVIDIA GPU and
# nvcc but without this project's Debian -dev packages: unpacks the .debs
# carried in .carry/gpu-debs into /tmp, builds with nvcc (sm_90), runs the
# kernel-level tests, the model test on the shipped trained model, a
# 0.6b-shape Q4_K_M from tg-mkmodel (when .carry/tokenizer.json is there)
# and the benchmark on the synthetic 8b shape (GPU_RUN_06=0 skips the
# 0.6b file). Logs go to $OUT.
# Usage (repository root): bash scripts/gpu-device-run.sh
set -u
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
B=build/dev
exec > >(tee "$OUT/run.log") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
head -2 /etc/os-release; nvcc --version | tail -1; gcc --version | head -1
P=/tmp/gpudeps; mkdir -p $P
for f in .carry/gpu-debs/*.deb; do dpkg -x "$f" $P; done
L=$P/usr/lib/x86_64-linux-gnu
export C_INCLUDE_PATH=$P/usr/include:$P/usr/include/x86_64-linux-gnu
export CPLUS_INCLUDE_PATH=$C_INCLUDE_PATH LIBRARY_PATH=$L LD_LIBRARY_PATH=$L:${LD_LIBRARY_PATH:-}
export TG_ROOT=$PWD TG_BUILD=$PWD/$B TG_CACHE=$PWD/.carry
t0=$(date +%s)
make -f engine/gpu/gpu.mk BUILD=$B -j16 gpu >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
timeout 120 $B/gpu/tests/test_gpu_ops > "$OUT/ops.txt" 2>&1; echo "test_gpu_ops rc=$?"
grep -v "^OK" "$OUT/ops.txt" | head -40; grep -c "^OK" "$OUT/ops.txt"
timeout 150 $B/gpu/tests/test_gpu_model > "$OUT/model-tiny.txt" 2>&1; echo "test_gpu_model(tiny) rc=$?"
cat "$OUT/model-tiny.txt" | tail -20
timeout 150 $B/gpu/tests/bench_gpu --synthetic 8b --prefill 512 --decode 128 > "$OUT/bench-8b.txt" 2>&1
echo "bench rc=$?"; cat "$OUT/bench-8b.txt"
TG_GPU_NO_GRAPH=1 timeout 60 $B/gpu/tests/bench_gpu --synthetic 8b --prefill 64 --decode 64 2>&1 | grep decode_tok
if [ "${GPU_RUN_06:-1}" = 1 ] && [ -f .carry/tokenizer.json ] && [ $(( $(date +%s) - t0 )) -lt 330 ]; then
  mkdir -p .carry/npm/tokenizer-qwen3/models && cp .carry/tokenizer.json .carry/npm/tokenizer-qwen3/models/
  make BUILD=$B NO_SETUP=1 -j16 PKG_LIBS="-lsqlite3 -lzstd -lpcre2-8 -ljansson -lfyaml -lcrypto -lxxhash" \
    $B/bin/tg-mkmodel >>"$OUT/build.log" 2>&1 || echo "tg-mkmodel build failed"
  s=$(date +%s)
  timeout 120 $B/bin/tg-mkmodel --preset 0.6b --type q4_k_m --seed 1 -o /tmp/q06.gguf > "$OUT/mk06.txt" 2>&1
  echo "mkmodel 0.6b rc=$? in $(( $(date +%s) - s )) s"
  if [ -f /tmp/q06.gguf ]; then
    TG_GPU_YARDSTICK=ref TG_GPU_STEPS=6 timeout 150 $B/gpu/tests/test_gpu_model /tmp/q06.gguf > "$OUT/model-06.txt" 2>&1
    echo "test_gpu_model(0.6b) rc=$?"; tail -12 "$OUT/model-06.txt"
    timeout 60 $B/gpu/tests/bench_gpu /tmp/q06.gguf --prefill 256 --decode 128 | tail -3
  fi
fi
echo "total $(( $(date +%s) - t0 )) s"
