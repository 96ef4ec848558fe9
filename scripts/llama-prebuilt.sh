# llama-prebuilt.sh: what scripts/build-llama-server.sh and
# scripts/build-llama-completion.sh share when they compile llama.cpp tools
# against the prebuilt libraries of the npm cache (the libraries tg-llama
# loads). Sourced, not run.

# prebuilt_check WHO PRE: PRE holds the prebuilt libllama, libggml and CPU
# backends, and g++ is installed; otherwise one line on stderr naming WHO
# (the script) and what to do, and exit 1.
prebuilt_check() {
  local who=$1 pre=$2 f
  for f in libllama-common.so libllama.v0.4.0.so libggml.v0.4.0.so libggml-base.so; do
    [ -f "$pre/$f" ] || { echo "$who: $pre/$f missing: run scripts/fetch-npm.sh" >&2; exit 1; }
  done
  ls "$pre"/libggml-cpu-*.so >/dev/null 2>&1 \
    || { echo "$who: no $pre/libggml-cpu-*.so (CPU backends) found" >&2; exit 1; }
  command -v g++ >/dev/null || { echo "$who: g++ not found (apt-get install g++)" >&2; exit 1; }
}

# prebuilt_sum PRE: the first 16 hex digits of the sha256 of the prebuilt
# libraries' sha256 list (the <libs> of the cache folders' names).
prebuilt_sum() {
  (cd "$1" && sha256sum ./*.so | sha256sum | cut -c1-16)
}

# prebuilt_link BIN TOP: points TOP/build/bin/<BIN's name> at BIN
# (atomically: a symlink renamed into place).
prebuilt_link() {
  local name
  name=$(basename "$1")
  mkdir -p "$2/build/bin"
  ln -sfn "$1" "$2/build/bin/$name.tmp" && mv -T "$2/build/bin/$name.tmp" "$2/build/bin/$name"
}

# prebuilt_cached BIN DEST STAMP TOP: when BIN exists and DEST/STAMP says
# STAMP, links it (prebuilt_link), prints its path and exits 0: nothing to
# build.
prebuilt_cached() {
  if [ -x "$1" ] && [ -f "$2/STAMP" ] && [ "$(cat "$2/STAMP")" = "$3" ]; then
    prebuilt_link "$1" "$4"
    echo "$1"
    exit 0
  fi
}

# prebuilt_backends PRE DIR: the prebuilt CPU backends symlinked into DIR,
# next to the executable, where ggml_backend_load_all() looks.
prebuilt_backends() {
  local f
  rm -f "$2"/libggml-cpu-*.so
  for f in "$1"/libggml-cpu-*.so; do ln -sfn "$f" "$2/$(basename "$f")"; done
}

# prebuilt_install WHO BIN DEST STAMP TOP: BIN.tmp, just linked against the
# prebuilt libraries, must answer --version (the bundled common headers
# must match the prebuilt libllama-common's ABI: a mismatch shows as a
# crash or an error there; DEST/version.log keeps its output); then it
# becomes BIN, DEST/STAMP records STAMP, BIN is linked (prebuilt_link) and
# its path printed.
prebuilt_install() {
  local who=$1 bin=$2 dest=$3 stamp=$4 top=$5
  "$bin.tmp" --version >"$dest/version.log" 2>&1 \
    || { echo "$who: $bin.tmp --version failed (libllama-common.so ABI mismatch?), see $dest/version.log" >&2; exit 1; }
  mv "$bin.tmp" "$bin"
  printf '%s\n' "$stamp" >"$dest/STAMP"
  prebuilt_link "$bin" "$top"
  echo "$bin"
}
