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
