#!/usr/bin/env bash
# The GPU token gate and the GPU benchmark in one session on a GPU machine
# (NVIDIA, with nvcc and cmake, without this project's -dev packages), from
# the folder scripts/gpu-pack.sh packed. Run from the repository root:
#
#   bash scripts/gpu-gate.sh --pack DIR [--out DIR] [--work DIR]
#        [--time-limit SECONDS] [--only 8b-ref|bench] [--with-8b-llama] [--keep-llama]
#        [--no-replay] [--no-llama]
#
#   --pack DIR          what scripts/gpu-pack.sh wrote (required)
#   --out DIR           logs, stores and reports (/tmp/gpu-out)
#   --work DIR          builds, models and the store (build/gpu-dev)
#   --time-limit S      skip the phases that would not fit in S seconds from
#                       the start (none by default)
#   --only 8b-ref       only the 8b gate over the ref tier (below)
#   --only bench        only the benchmark (4, 5 below) on the 8b file
#   --with-8b-llama     also specs/gpu-8b.yaml, scored against llama-cuda
#   --keep-llama        also leave the CUDA libllama in OUT/llama-cuda-lib.tar.gz
#                       (a later run takes it from the pack folder, by that name)
#   --no-replay         skip step 5 (the stage replay gates, about 150 s), so
#                       that the benchmark and the gates fit a shorter call
#   --no-llama          do not build llama.cpp (a call too short for its
#                       build): with --only bench, our arm's figures and the
#                       A/B only, no ratio
#
# 1. builds llama.cpp's libllama + ggml with CUDA (sm_90, CUDA graphs on,
#    flash attention kernels on) from the bundled source into
#    build/llama-cuda/lib (in the background; skipped when already there);
# 2. unpacks our prebuilt binaries and their runtime libraries, the x86-64
#    CPU libllama (.cache/npm/linux-x64/...) and the tokenizer;
# 3. generates the 0.6b- and 8b-shape Q4_K_M files with tg-mkmodel into
#    models/ and pins their sha256 into copies of specs/gpu-*.yaml;
# 4. benchmark on the 8b file: the same protocol requests to tg-engine
#    --tier gpu and to tg-llama over the CUDA libllama (a 512-token prompt
#    then 128 steps, after one warm-up request): prefill and decode tokens/s
#    and the ratio; a decode A/B of the TG_GPU_* settings (each the
#    fastest of three bench_gpu runs); bench_gpu
#    for the copy bandwidth, the roofline, a per-kernel profile and each
#    launch class's share of the graph-replayed step (ATTRIB lines, the
#    step timed without the class: TG_GPU_TIMING_DROP); where the pack has
#    a bench_gpu-base (an earlier build's bench_gpu: gpu-pack.sh --base),
#    its decode is timed beside the default's, so that a kernel change
#    whose default path moved is compared in the same call;
# 5. stage replay of the gpu tier against the ref tier: specs/gpu-tiny-replay.yaml
#    (the shipped model) and specs/gpu-0.6b-replay.yaml, gates with `replay:`,
#    and `tokgate localize` of one step of each (its stage table, in $OUT);
# 6. gates, once llama.cpp is built: specs/gpu-0.6b-ref.yaml and
#    specs/gpu-8b-ref.yaml (gpu, llama-cuda, llama-cpu teacher-forced over
#    the ref tier; the gpu arm gates) and specs/gpu-0.6b.yaml (scored against
#    llama-cuda), each with its markdown evidence (tokgate report --format md)
#    in $OUT.
# --only 8b-ref runs only steps 2, 3 (the 8b file) and that gate, without
# building llama.cpp (a machine with too little time left for the build);
# the spec's llama.cpp CUDA arms are then dropped (said in the log) and the
# gate is gpu and llama.cpp CPU over the ref tier.
# With --time-limit, phases are skipped when the time is short, so a run
# always leaves its logs, the store and what finished in OUT, all of it also
# in OUT/0-all.tar.gz (one file to bring back); a second run with the same
# work folder reuses the llama.cpp build, the models and the store, and does
# only what is missing (a gate cut short is resumed). In run 4 (Dec 3)
# llama.cpp's CUDA build took 216-253 s, the 8b file 26-55 s, the tests and
# the benchmark about 100 s, the 0.6b gates 40 s and the 8b gate over the
# ref tier 205 s (without its llama-cuda arm; 363 s with it in run 5).
set -u
CMDLINE="bash scripts/gpu-gate.sh $*"
usage() { sed -n '/^#   bash scripts\/gpu-gate.sh/,/the benchmark and the gates fit/p' "$0" | sed 's/^#//' >&2; exit 2; }
C= OUT=/tmp/gpu-out W=build/gpu-dev BUDGET=1000000000 ONLY= WITH_8B_LLAMA=0 KEEP_LLAMA=0 REPLAY=1 NO_LLAMA=0
while [ $# -gt 0 ]; do
  case $1 in
    --pack) C=${2:?--pack DIR}; shift 2 ;;
    --out) OUT=${2:?--out DIR}; shift 2 ;;
    --work) W=${2:?--work DIR}; shift 2 ;;
    --time-limit) BUDGET=${2:?--time-limit SECONDS}; shift 2 ;;
    --only) ONLY=${2:?--only 8b-ref|bench}; shift 2 ;;
    --with-8b-llama) WITH_8B_LLAMA=1; shift ;;
    --keep-llama) KEEP_LLAMA=1; shift ;;
    --no-replay) REPLAY=0; shift ;;
    --no-llama) NO_LLAMA=1; shift ;;
    -h|--help) usage ;;
    *) echo "gpu-gate: unknown argument $1" >&2; usage ;;
  esac
done
[ -n "$C" ] && [ -d "$C" ] || { echo "gpu-gate: --pack DIR (a folder from scripts/gpu-pack.sh) is required" >&2; usage; }
case $BUDGET in ''|*[!0-9]*) echo "gpu-gate: --time-limit $BUDGET: expected seconds" >&2; exit 2 ;; esac
mkdir -p "$OUT" "$W"
C=$(cd "$C" && pwd) W=$(cd "$W" && pwd)   # absolute: the paths below are handed to other programs
exec > >(tee -a "$OUT/run.log") 2>&1
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( BUDGET - $(date +%s) + T0 )); }
say() { echo "[$(el) s] $*"; }
mkdir -p $W/models
DB=$W/tokgate.db
# (tar's status 1, "file changed as we read it", is run.log growing: the
# archive is still whole)
bundle() { tar -C "$OUT" -czf "$OUT/0-all.tar.gz.tmp" --exclude='0-all.tar.gz*' --exclude=llama-cuda-lib.tar.gz . 2>/dev/null
           [ $? -le 1 ] && mv "$OUT/0-all.tar.gz.tmp" "$OUT/0-all.tar.gz"; }
NPROC=$(nproc)

say "host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader
head -1 /etc/os-release; command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
nvcc --version | tail -1; cmake --version | head -1

# ---- 1. llama.cpp CUDA, in the background --------------------------------
LL=$PWD/build/llama-cuda   # where the specs name it (specs/gpu-*.yaml)
if [ ! -f $LL/lib/libllama.so ] && [ -f $C/llama-cuda-lib.tar.gz ]; then
  mkdir -p $LL/lib && tar -C $LL/lib -xzf $C/llama-cuda-lib.tar.gz && say "llama.cpp CUDA: from $C/llama-cuda-lib.tar.gz"
fi
if [ -n "$ONLY" ] && [ "$ONLY" != 8b-ref ] && [ "$ONLY" != bench ]; then say "--only $ONLY: expected 8b-ref or bench"; exit 2; fi
if [ ! -f $LL/lib/libllama.so ] && [ "$ONLY" != 8b-ref ] && [ $NO_LLAMA = 0 ]; then
  rm -rf $W/lsrc && mkdir -p $W/lsrc && tar -C $W/lsrc -xzf $C/llama-src.tar.gz
  (
    s=$(date +%s)
    cmake -S $W/lsrc -B $LL/build -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=OFF \
      -DGGML_NATIVE=OFF -DGGML_CPU=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_COMMON=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
      -DLLAMA_BUILD_APP=OFF -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DGGML_CUDA_GRAPHS=ON -DGGML_CUDA_NCCL=OFF -DGGML_CCACHE=OFF -DCMAKE_CUDA_COMPILER=$(command -v nvcc) \
      >"$OUT/llama-cmake.log" 2>&1 || { echo "llama.cpp configure FAILED"; exit 1; }
    cmake --build $LL/build --target llama -j "$NPROC" >"$OUT/llama-build.log" 2>&1 \
      || { echo "llama.cpp build FAILED"; tail -20 "$OUT/llama-build.log"; exit 1; }
    mkdir -p $LL/lib
    find $LL/build \( -name 'libllama.so*' -o -name 'libggml*.so*' \) \( -type f -o -type l \) -exec cp -P {} $LL/lib/ \;
    echo "llama.cpp CUDA built in $(( $(date +%s) - s )) s ($(cat $W/lsrc/COMMIT 2>/dev/null))"
  ) > "$OUT/llama.txt" 2>&1 &
  LPID=$!
else
  LPID=
  if [ -f $LL/lib/libllama.so ]; then say "llama.cpp CUDA: reusing $LL/lib"; else say "llama.cpp CUDA: not built (--only 8b-ref or --no-llama)"; fi
fi

# ---- 2. our binaries, libraries, the CPU libllama, the tokenizer -----------
mkdir -p $W/bin $W/deps .cache/npm/linux-x64/bins/linux-x64 $W/tok
tar -C $W/bin -xzf $C/bin.tar.gz && tar -C $W/deps -xzf $C/deps.tar.gz \
  && tar -C .cache/npm/linux-x64/bins/linux-x64 -xzf $C/llama-cpu.tar.gz \
  && gzip -dc $C/tokenizer.json.gz > $W/tok/tokenizer.json || { say "unpack FAILED"; exit 1; }
if [ -f $C/tokenizer_config.json ]; then cp $C/tokenizer_config.json $W/tok/
else say "no $C/tokenizer_config.json: the models' sha256 will differ from the specs' (re-run scripts/gpu-pack.sh)"; fi
export LD_LIBRARY_PATH=$W/deps:${LD_LIBRARY_PATH:-}
export TOKGATE_BIN=$W/bin TG_ROOT=$PWD TG_BUILD=$W TG_CACHE=$PWD/.cache
TK=$W/bin/tokgate
ldd $TK $W/bin/tg-engine | grep "not found" && say "missing libraries (above)"
say "device: $(printf '%s\n' '{"op":"hello","protocol":1}' '{"op":"bye"}' | $W/bin/tg-engine --tier gpu | head -1 | grep -o '"device":"[^"]*"')"

# ---- 3. models -----------------------------------------------------------
mk() {   # preset file threads
  if [ ! -f "$2" ]; then
    local s=$(date +%s)
    $W/bin/tg-mkmodel --preset $1 --type q4_k_m --seed 1 --threads $3 --tokenizer $W/tok/tokenizer.json -o "$2" \
      || { say "tg-mkmodel $1 FAILED"; return 1; }
    say "tg-mkmodel $1: $(( $(date +%s) - s )) s, $(stat -c %s "$2") bytes"
  fi
}
pin() {  # spec model -> $W/specs/<spec>, sha pinned (hashed once per model file)
  local sha
  [ "$2.sha256" -nt "$2" ] || sha256sum "$2" | cut -c1-64 > "$2.sha256"
  sha=$(cat "$2.sha256")
  mkdir -p $W/specs
  sed -e "s/^  sha256: .*/  sha256: $sha/" -e "s|^  path: .*|  path: $2|" specs/$1 > $W/specs/$1
  say "pinned $1: $2 sha256 $sha"
}
# the latest run of spec file $1 in $DB that has no verdict yet (a gate cut
# short by a previous call's time on a still-warm machine): resumed, so its
# complete legs are not run again
unfinished() {
  python3 - "$DB" "$(sed -n 's/^name: *//p' $W/specs/$1 | head -1)" <<'PY' 2>/dev/null
import sqlite3, sys
try:
    db = sqlite3.connect(sys.argv[1])
    r = db.execute("SELECT r.id FROM run r JOIN spec s ON s.id = r.spec_id WHERE s.name = ? AND NOT EXISTS "
                   "(SELECT 1 FROM verdict_set v WHERE v.run_id = r.id) ORDER BY r.id DESC LIMIT 1",
                   (sys.argv[2],)).fetchone()
    print(r[0] if r else "")
except Exception:
    print("")
PY
}
gate() { # spec name, evidence tag[, noise: also rescore under the noise policy]
  local s=$(date +%s) resume=() pend
  pend=$(unfinished $1)
  [ -n "$pend" ] && resume=(--resume $pend) && say "gate $1: resuming run $pend"
  timeout $(( $(left) - 15 )) $TK gate $W/specs/$1 --db $DB "${resume[@]}" > "$OUT/gate-$2.txt" 2>"$OUT/gate-$2.err"
  local rc=$?
  say "gate $1: rc=$rc in $(( $(date +%s) - s )) s"; cat "$OUT/gate-$2.txt" | tail -40
  $TK report --db $DB --format md --out "$OUT/evidence-$2.md" >/dev/null 2>>"$OUT/gate-$2.err"
  [ -s "$OUT/evidence-$2.md" ] || say "report $2 failed"
  # the same rows under the noise policy (llama-cpu and llama-cuda-nofa are
  # variants of llama-cuda): a new verdict set, no arm runs again. Only for
  # the specs whose reference has variants: over the ref tier there are none,
  # and the noise policy would pass EXACT steps only
  local run; run=$($TK report --db $DB --format json 2>/dev/null | grep -m1 -o '"id": *[0-9]*' | grep -o '[0-9]*$')
  if [ -n "$run" ] && [ "${3:-}" = noise ]; then
    $TK rescore $run --db $DB --policy noise > "$OUT/gate-$2-noise.txt" 2>&1; say "rescore $2 (noise) rc=$?"
    tail -30 "$OUT/gate-$2-noise.txt"
    $TK report $run --db $DB --format md --out "$OUT/evidence-$2-noise.md" >/dev/null 2>&1
  fi
  for f in $DB $DB-wal $DB-shm; do [ -f $f ] && cp $f "$OUT/"; done
  bundle
}
bench_one() { # name, then the worker argv; load options in $LOPT
  local ids; ids=$(seq -s, 1000 1511)
  local dec="{\"op\":\"decode\",\"prompt\":[$ids],\"steps\":129,\"top_k\":32}"
  printf '%s\n' '{"op":"hello","protocol":1}' "{\"op\":\"load\",\"model\":\"$M8\",\"options\":$LOPT}" \
    "$dec" "$dec" "$dec" '{"op":"bye"}' | timeout 200 "${@:2}" 2>"$OUT/bench-$1.err" | grep '"done"' > "$OUT/bench-$1.jsonl"
  # the first request is the warm-up; the figures are the best of the other two
  awk -v n="$1" -F'[:,}]' '
    { for (i = 1; i < NF; i++) { if ($i ~ /"prefill"/) p = $(i+1); if ($i ~ /"decode"/ && $(i+1) ~ /^[0-9.]+$/) d = $(i+1) }
      if (NR > 1) { pt = 512 / (p / 1000); dt = 128 / (d / 1000); if (pt > bp) bp = pt; if (dt > bd) bd = dt } }
    END { printf "BENCH %s prefill_tok_s=%.1f decode_tok_s=%.1f (512-token prompt, 128 steps, best of 2 after a warm-up)\n", n, bp, bd }' \
    "$OUT/bench-$1.jsonl" | tee -a "$OUT/bench.txt"
}
bench_pair() { # both workers, the same requests, then the ratio
  echo "BENCH command: $CMDLINE" | tee -a "$OUT/bench.txt"
  LOPT='{"n_ctx":1024}' bench_one gpu $W/bin/tg-engine --tier gpu
  LOPT='{"n_gpu_layers":999,"n_ctx":1024}' bench_one llama-cuda $W/bin/tg-llama --lib $LL/lib/libllama.so
  awk '/^BENCH gpu /{split($3,a,"=");split($4,b,"=");gp=a[2];gd=b[2]} /^BENCH llama-cuda /{split($3,a,"=");split($4,b,"=");lp=a[2];ld=b[2]}
       END { if (lp > 0 && ld > 0) printf "RATIO gpu/llama-cuda: prefill %.2f decode %.2f\n", gp/lp, gd/ld }' "$OUT/bench.txt" | tee -a "$OUT/bench.txt"
}
dtok() { grep -o 'decode_tok_s=[0-9.]*' "$1" | tail -1 | cut -d= -f2; }
# bench_gpu on the 8b file three times, the fastest run's output into $1
# ($2: the binary, then VAR=value settings): in run 20 two runs of one
# binary in a row decoded 3.5% apart, more than a candidate must gain
bench3() {
  local f=$1 bin=$2 i d bd=0; shift 2
  rm -f "$f"
  for i in 1 2 3; do
    env "$@" timeout 90 $bin $M8 --prefill 512 --decode 128 > "$f.$i" 2>&1
    d=$(dtok "$f.$i")
    if [ -n "$d" ] && awk -v a="$d" -v b="$bd" 'BEGIN { exit !(a > b) }'; then bd=$d; cp "$f.$i" "$f"; fi
  done
  [ -f "$f" ] || cp "$f.1" "$f"
  rm -f "$f".[123]
}
M06=$W/models/tg-mkmodel-0.6b-q4_k_m-s1.gguf   # the specs name models/...; pin() points them here
M8=$W/models/tg-mkmodel-8b-q4_k_m-s1.gguf
if [ "$ONLY" = bench ]; then   # the 8b file, bench_gpu, then both workers once llama.cpp is built
  mk 8b $M8 $NPROC || exit 1
  # the kernels first: a decode setting whose kernels fail test_gpu_ops is
  # not timed
  timeout 150 $W/bin/test_gpu_ops > "$OUT/test_gpu_ops.txt" 2>&1; rco=$?
  say "test_gpu_ops rc=$rco $(grep -c '^OK' "$OUT/test_gpu_ops.txt") OK $(grep -c '^FAIL' "$OUT/test_gpu_ops.txt") FAIL"
  grep -v '^OK' "$OUT/test_gpu_ops.txt" | head -10
  timeout 100 $W/bin/test_gpu_model > "$OUT/test_gpu_model.txt" 2>&1   # the shipped model against the ref tier
  say "test_gpu_model (tiny) rc=$?"; grep -v '^OK' "$OUT/test_gpu_model.txt" | tail -4
  # what a launch-to-launch edge costs under each ordering (a diagnostic)
  [ -x $W/bin/edge_gpu ] && timeout 60 $W/bin/edge_gpu 2>&1 | tee "$OUT/edge_gpu.txt"
  # decode settings off by default, timed against the default (a comma joins one's variables):
  # the flag chain between the fused launches, spinning and napping 32 ns (docs/gpu.md)
  cands="TG_GPU_CHAIN=1 TG_GPU_CHAIN=2"
  [ $rco -gt 1 ] && cands= && say "test_gpu_ops did not finish: no new setting timed"
  bench3 "$OUT/bench_gpu-8b.txt" $W/bin/bench_gpu
  say "bench_gpu 8b (the fastest of 3 runs)"; cat "$OUT/bench_gpu-8b.txt"
  best=$(dtok "$OUT/bench_gpu-8b.txt"); best=${best:-0}; kept=
  if [ -x $W/bin/bench_gpu-base ]; then   # the earlier build's default in this call
    bench3 "$OUT/bench_gpu-8b-base.txt" $W/bin/bench_gpu-base
    say "bench_gpu 8b, the base build: decode $(dtok "$OUT/bench_gpu-8b-base.txt") tok/s (the fastest of 3;" \
        "this build's $best)"
  fi
  for cfg in $cands; do
    [ "$(left)" -gt 110 ] || { say "no time left for $cfg and the rest"; break; }
    f="$OUT/bench_gpu-8b-$(echo $cfg | tr '=,' '--').txt"
    bench3 "$f" $W/bin/bench_gpu $(echo $cfg | tr , ' ')
    d=$(dtok "$f"); say "bench_gpu 8b ($cfg): decode ${d:-?} tok/s (the fastest of 3), $(grep -o 'decode_digest=[0-9a-f]*' "$f") (best so far $best)"
    [ -n "$d" ] && awk -v a="$d" -v b="$best" 'BEGIN { exit !(a > b * 1.015) }' || continue
    t="$OUT/test_gpu_ops-$(echo $cfg | tr '=,' '--').txt"
    env $(echo $cfg | tr , ' ') timeout 150 $W/bin/test_gpu_ops > "$t" 2>&1
    m="$OUT/test_gpu_model-$(echo $cfg | tr '=,' '--').txt"   # the shipped model against the ref tier
    env $(echo $cfg | tr , ' ') timeout 100 $W/bin/test_gpu_model > "$m" 2>&1; rcm=$?
    if [ "$(grep -c '^FAIL' "$t")" = 0 ] && grep -q '^test_gpu_ops: ' "$t" && [ $rcm = 0 ]; then
      kept=$cfg; best=$d; say "kept: $cfg (test_gpu_ops and test_gpu_model pass under it)"
    else say "$cfg was faster but test_gpu_ops or test_gpu_model (rc=$rcm) fails under it: not kept"; tail -3 "$m"; fi
  done
  grep -o 'decode_digest=[0-9a-f]*' "$OUT/bench_gpu-8b.txt" | head -1 | sed 's/^/default /'
  # the graph-replayed step launch by launch, from the kernels' own start
  # and end times (CUPTI records; tests/gpu/timeline_gpu.cu)
  if [ -x $W/bin/timeline_gpu ]; then
    [ -n "${TG_CUPTI:-}" ] || export TG_CUPTI=$(ls /usr/local/cuda*/lib64/libcupti.so.1[3-9]* \
      /usr/local/cuda*/extras/CUPTI/lib64/libcupti.so.1[3-9]* 2>/dev/null | head -1)
    env $(echo $kept | tr , ' ') timeout 60 $W/bin/timeline_gpu $M8 --prefill 512 --decode 32 \
      --raw "$OUT/timeline-8b.tsv" > "$OUT/timeline-8b.txt" 2>&1
    say "timeline_gpu 8b${kept:+ under $kept} rc=$?"; cat "$OUT/timeline-8b.txt"
  fi
  TG_GPU_PROFILE=1 timeout 60 $W/bin/bench_gpu $M8 --prefill 512 --decode 64 > "$OUT/bench_gpu-8b-profile-default.txt" 2>&1 \
    && grep -A20 "^profile" "$OUT/bench_gpu-8b-profile-default.txt"
  [ -n "$kept" ] && env $(echo $kept | tr , ' ') TG_GPU_PROFILE=1 timeout 60 $W/bin/bench_gpu $M8 --prefill 512 --decode 64 \
      > "$OUT/bench_gpu-8b-profile.txt" 2>&1 && grep -A20 "^profile" "$OUT/bench_gpu-8b-profile.txt"
  # each launch class's share of the graph-replayed step: the step timed
  # with the class left out (TG_GPU_TIMING_DROP; the logits are then wrong),
  # while llama.cpp builds
  base=$best   # the kept setting's figure (the default's when none was kept)
  [ -n "$kept" ] && say "attribution under $kept"
  for cls in attn qkv wo ffn down norm out; do
    [ "$(left)" -gt 110 ] || { say "attribution cut short: no time left"; break; }
    f="$OUT/bench_gpu-8b-drop-$cls.txt"
    bench3 "$f" $W/bin/bench_gpu $(echo $kept | tr , ' ') TG_GPU_TIMING_DROP=$cls
    awk -v c=$cls -v a="${base:-0}" -v b="$(dtok "$f")" 'BEGIN { if (a > 0 && b > 0)
      printf "ATTRIB %-5s step %7.1f us without it (%.1f tok/s), its share %6.1f us = %4.1f%%\n", c, 1e6/b, b,
             1e6/a - 1e6/b, 100 * (1e6/a - 1e6/b) / (1e6/a); else printf "ATTRIB %s: no figure\n", c }' \
      | tee -a "$OUT/attrib.txt"
  done
  if [ -n "$LPID" ]; then say "waiting for the llama.cpp build"; wait $LPID; fi
  cat "$OUT/llama.txt" 2>/dev/null
  if [ -f $LL/lib/libllama.so ]; then
    bench_pair
    if [ -n "$kept" ]; then   # the protocol pair again with the kept setting
      say "the pair again with $kept"
      export $(echo $kept | tr , ' '); CMDLINE="$kept $CMDLINE"; bench_pair
    fi
  fi
  bundle; say "done"; exit 0
fi
if [ "$ONLY" = 8b-ref ]; then
  mk 8b $M8 $NPROC && pin gpu-8b-ref.yaml $M8 || exit 1
  if [ ! -f $LL/lib/libllama.so ]; then
    sed -i -e '/^  - {name: llama-cuda/d' -e 's/variant_of: llama-cuda, //' $W/specs/gpu-8b-ref.yaml
    say "no llama.cpp CUDA build: gpu-8b-ref.yaml runs without its llama-cuda arms"
  fi
  gate gpu-8b-ref.yaml 8b-ref
  cp $W/specs/*.yaml "$OUT/" 2>/dev/null; bundle; say "done"; exit 0
fi
mk 0.6b $M06 $NPROC && pin gpu-0.6b-ref.yaml $M06 && pin gpu-0.6b.yaml $M06

# kernel checks; a failing fused-path kernel switches its feature off for
# everything that follows (the top-k search bound, the streamed mat-vecs, or
# the whole fused single-token path), so the gates run on tested kernels
FZRE='^FAIL (mv_fused|mv_swiglu|rmsnorm_q8|attn_decode)'
timeout 120 $W/bin/test_gpu_ops > "$OUT/test_gpu_ops.txt" 2>&1; rco=$?
say "test_gpu_ops rc=$rco $(grep -c '^OK' "$OUT/test_gpu_ops.txt") OK $(grep -c '^FAIL' "$OUT/test_gpu_ops.txt") FAIL"
grep -v '^OK' "$OUT/test_gpu_ops.txt" | head -10
if grep -q '^FAIL topk(' "$OUT/test_gpu_ops.txt"; then export TG_GPU_TOPK_BOUND=0; say "top-k FAILED: TG_GPU_TOPK_BOUND=0"; fi
# decode settings off by default until a device run keeps them (the A/B
# below; none now)
AB_NEW=
if grep -qE "$FZRE" "$OUT/test_gpu_ops.txt" || [ $rco -gt 1 ]; then
  TG_GPU_STREAM=0 timeout 120 $W/bin/test_gpu_ops > "$OUT/test_gpu_ops-direct.txt" 2>&1
  if grep -qE "$FZRE" "$OUT/test_gpu_ops-direct.txt"; then
    export TG_GPU_FUSED=0; say "fused kernels FAILED: TG_GPU_FUSED=0 from here on"
  else
    export TG_GPU_STREAM=0; say "streamed mat-vecs FAILED: TG_GPU_STREAM=0 from here on"
  fi
fi
for mode in 1 0; do   # the shipped trained model against the ref tier, 6 x 48 teacher-forced, fused path on/off
  TG_GPU_FUSED=${TG_GPU_FUSED:-$mode} timeout 100 $W/bin/test_gpu_model > "$OUT/test_gpu_model-tiny-fused$mode.txt" 2>&1
  say "test_gpu_model (tiny, TG_GPU_FUSED=${TG_GPU_FUSED:-$mode}) rc=$?"; tail -4 "$OUT/test_gpu_model-tiny-fused$mode.txt"
  [ "${TG_GPU_FUSED:-1}" = 0 ] && break
done
# the 0.6b file against the cpu tier: two approximate tiers whose top-16
# logits differ by up to 0.69 on this file (runs 5-7), so a 0.5 gap is
# inside their joint error (run 7 flipped one step at gap 0.664 with f16 KV
# after the RoPE angles changed); the gap bound is 1.0 here. The exact check
# of the same file is the replay below.
if [ -f $M06 ]; then
  TG_GPU_GAP=1.0 TG_GPU_YARDSTICK=cpu TG_GPU_STEPS=24 timeout 100 $W/bin/test_gpu_model $M06 > "$OUT/test_gpu_model-0.6b.txt" 2>&1
  say "test_gpu_model (0.6b against the cpu tier, 6 x 24) rc=$?"; tail -4 "$OUT/test_gpu_model-0.6b.txt"
fi

# stage replay of the gpu tier against the exact arbiter (the ref tier), no
# llama.cpp needed: the shipped model and the 0.6b file, each a gate with
# `replay:` (REPLAY=PASS: no stage over budget) and the whole stage table of
# one step (tokgate localize, markdown into OUT)
replay_gate() { # spec tag prompt/step
  [ "$(left)" -gt 120 ] || { say "replay $1: no time left"; return; }
  gate $1 $2
  grep "tokgate: replay" "$OUT/gate-$2.err" | tail -12
  timeout $(( $(left) - 10 )) $TK localize $3 --arms ref,gpu --db $DB --evidence "$OUT" > "$OUT/localize-$2.txt" 2>&1
  say "localize $3 ($2) rc=$?"; grep -E "^(FIRST_OVER|OVER_BUDGET|REPLAY|stage replay)" "$OUT/localize-$2.txt" | head -8
}
if [ $REPLAY = 1 ]; then
  pin gpu-tiny-replay.yaml $PWD/models/tiny-trained-qwen3-Q4_K_M.gguf && replay_gate gpu-tiny-replay.yaml tiny-replay p7/40
  [ -f $M06 ] && pin gpu-0.6b-replay.yaml $M06 && replay_gate gpu-0.6b-replay.yaml 0.6b-replay p1/16
else
  say "stage replay skipped (--no-replay)"
fi

[ "$(left)" -gt 300 ] && mk 8b $M8 $NPROC && pin gpu-8b.yaml $M8 && pin gpu-8b-ref.yaml $M8

# our arm alone on the 8b file while llama.cpp may still build
if [ -f $M8 ] && [ "$(left)" -gt 120 ]; then
  bench3 "$OUT/bench_gpu-8b.txt" $W/bin/bench_gpu
  say "bench_gpu 8b (the fastest of 3 runs)"; cat "$OUT/bench_gpu-8b.txt"
  TG_GPU_PROFILE=1 timeout 60 $W/bin/bench_gpu $M8 --prefill 512 --decode 64 > "$OUT/bench_gpu-8b-profile.txt" 2>&1
  say "bench_gpu 8b, per-kernel profile rc=$?"; grep -A16 "^profile" "$OUT/bench_gpu-8b-profile.txt"
  # decode A/B of the launch and kernel settings (512-token context, 128
  # steps, as the protocol benchmark below), greedy: each candidate is
  # timed on top of the settings kept so far and kept when it is more than
  # 1.5% faster and test_gpu_ops passes under the whole set; the set holds
  # for the rest of the run (the device string of each arm names it).
  # (a comma joins the settings of one candidate)
  kept=; best=$(dtok "$OUT/bench_gpu-8b.txt"); best=${best:-0}
  for cfg in TG_GPU_STREAM_ROWS=1 TG_GPU_STREAM_ROWS=q6 TG_GPU_PDL=0 TG_GPU_PDL=2 \
             TG_GPU_ATT_SPLITS=16 TG_GPU_ATT_SPLITS=64 $AB_NEW; do
    [ "$(left)" -gt 200 ] || break
    trial=${kept:+$kept,}$cfg
    f="$OUT/bench_gpu-8b-$(echo $trial | tr '=,' '--').txt"
    bench3 "$f" $W/bin/bench_gpu $(echo $trial | tr , ' ')
    d=$(dtok "$f"); say "bench_gpu 8b ($trial): decode ${d:-?} tok/s (the fastest of 3; best so far $best)"
    [ -n "$d" ] && awk -v a="$d" -v b="$best" 'BEGIN { exit !(a > b * 1.015) }' || continue
    t="$OUT/test_gpu_ops-$(echo $trial | tr '=,' '--').txt"
    env $(echo $trial | tr , ' ') timeout 120 $W/bin/test_gpu_ops > "$t" 2>&1
    bad=$(grep -c '^FAIL' "$t")
    if [ "$bad" = 0 ] && grep -q '^test_gpu_ops: ' "$t"; then
      kept=$trial; best=$d; say "kept: $kept ($best tok/s, test_gpu_ops passes)"
    else
      say "$trial was faster but test_gpu_ops fails under it ($bad cases): not kept"
    fi
  done
  if [ -n "$kept" ]; then export $(echo $kept | tr , ' '); say "from here on: $kept"; fi
  TG_GPU_FUSED=0 timeout 90 $W/bin/bench_gpu $M8 --prefill 64 --decode 64 > "$OUT/bench_gpu-8b-plain.txt" 2>&1
  say "bench_gpu 8b (TG_GPU_FUSED=0, the plain path) rc=$?"; grep -i "decode" "$OUT/bench_gpu-8b-plain.txt"
fi

if [ -n "$LPID" ]; then
  say "waiting for the llama.cpp build"
  while kill -0 $LPID 2>/dev/null && [ "$(left)" -gt 150 ]; do sleep 5; done
  kill -0 $LPID 2>/dev/null && say "llama.cpp build still running; gates without it are not run"
fi
cat "$OUT/llama.txt" 2>/dev/null
HAVE_LC=0; [ -f $LL/lib/libllama.so ] && HAVE_LC=1

# ---- 4. gates ----------------------------------------------------------------

# ---- 5. benchmark: the gpu arm vs llama.cpp CUDA, same requests ---------------
if [ $HAVE_LC = 1 ] && [ -f $M8 ] && [ "$(left)" -gt 60 ]; then
  bench_pair
fi

# the gates of issue 7 (gpu, llama-cuda, llama-cpu over the ref tier's
# tokens), then the 0.6b one scored against llama-cuda; the 8b gate may take
# longer than one call: a still-warm machine's next call resumes it
# (--with-8b-llama also runs specs/gpu-8b.yaml, scored against llama-cuda)
if [ $HAVE_LC = 1 ] && [ -f $W/specs/gpu-0.6b-ref.yaml ] && [ "$(left)" -gt 90 ]; then gate gpu-0.6b-ref.yaml 0.6b-ref; fi
if [ $HAVE_LC = 1 ] && [ -f $W/specs/gpu-0.6b.yaml ] && [ "$(left)" -gt 90 ]; then gate gpu-0.6b.yaml 0.6b noise; fi
# (started only with time for the whole gate, 205 s in run 4; a cut run is
# resumed by the next call on a warm machine)
if [ $HAVE_LC = 1 ] && [ -f $W/specs/gpu-8b-ref.yaml ] && { [ -n "$(unfinished gpu-8b-ref.yaml)" ] || [ "$(left)" -gt 230 ]; }; then
  gate gpu-8b-ref.yaml 8b-ref
fi
if [ "$WITH_8B_LLAMA" = 1 ] && [ $HAVE_LC = 1 ] && [ -f $W/specs/gpu-8b.yaml ] && [ "$(left)" -gt 100 ]; then
  gate gpu-8b.yaml 8b noise
fi

# ---- bring back --------------------------------------------------------------
for d in $DB $W/ref.db; do
  for f in $d $d-wal $d-shm; do [ -f $f ] && cp $f "$OUT/"; done
done
cp $W/specs/*.yaml "$OUT/" 2>/dev/null
ls -la $LL/lib 2>/dev/null | head -20 > "$OUT/llama-libs.txt"
# the CUDA libllama, so that a later run can skip its build (put it in the
# pack folder as llama-cuda-lib.tar.gz; about 44 MB: --keep-llama)
if [ "$KEEP_LLAMA" = 1 ] && [ -f $LL/lib/libllama.so ] && [ ! -f $C/llama-cuda-lib.tar.gz ]; then
  tar -C $LL/lib -czf "$OUT/llama-cuda-lib.tar.gz" . && ls -la "$OUT/llama-cuda-lib.tar.gz"
fi
bundle
say "done"
