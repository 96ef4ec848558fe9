#!/usr/bin/env bash
# Runs the GPU arm's test programs (test_gpu_*) from the folder given, each
# printing one OK/FAIL line per case; on a machine without a GPU each says
# SKIP and succeeds. test_gpu_ops runs twice: with the 8-bit single-token
# mat-vec (the default) and with TG_GPU_MMVQ=0. Usage: scripts/gpu-test.sh BUILD/gpu/tests [MODEL.gguf ...]
# Exit status: 0 when every program passed (or skipped), 1 otherwise.
set -u
dir=${1:?usage: gpu-test.sh TESTDIR [MODEL.gguf ...]}; shift
fail=0
for t in "$dir"/test_gpu_*; do
  [ -x "$t" ] || continue
  echo "=== $(basename "$t")"
  if [ "$(basename "$t")" = test_gpu_model ]; then "$t" "$@" || fail=1
  else "$t" || fail=1; fi
  if [ "$(basename "$t")" = test_gpu_ops ]; then   # the f32 single-token mat-vec too
    echo "=== $(basename "$t") (TG_GPU_MMVQ=0)"
    TG_GPU_MMVQ=0 "$t" || fail=1
  fi
done
exit $fail
