#!/usr/bin/env bash
# Installs the Debian packages tokgate builds and tests with, only those
# missing, so a second run costs one dpkg query. Run as root (CI) or with sudo.
set -euo pipefail

pkgs=(
  build-essential pkg-config git ca-certificates xz-utils
  libsqlite3-dev sqlite3 libzstd-dev libcmocka-dev libpcre2-dev
  libjansson-dev libfyaml-dev libxxhash-dev libssl-dev libcurl4-openssl-dev
  clang libclang-rt-14-dev valgrind
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross libstdc++6-arm64-cross qemu-user
  hipcc libamdhip64-dev rocm-device-libs
  cmake nodejs npm
  slurm-wlm munge
  libjansson-dev:arm64 libssl-dev:arm64 libpcre2-dev:arm64 libxxhash-dev:arm64
  libzstd-dev:arm64 libc6:arm64 libstdc++6:arm64 libgomp1:arm64
)
# Optional pieces: set TOKGATE_NO_HIP=1 to skip the ROCm compiler (large).
if [ "${TOKGATE_NO_HIP:-0}" = 1 ]; then
  pkgs=("${pkgs[@]/hipcc}"); pkgs=("${pkgs[@]/libamdhip64-dev}"); pkgs=("${pkgs[@]/rocm-device-libs}")
fi

# The aarch64 arm links Debian's arm64 libraries (multiarch) and runs under
# qemu-user; the architecture must be known to dpkg before apt resolves them.
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO dpkg --add-architecture arm64
fi

missing=()
for p in "${pkgs[@]}"; do
  [ -n "$p" ] || continue
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
# node and npm may come from elsewhere (a machine image); accept them on PATH.
if command -v node >/dev/null && command -v npm >/dev/null; then
  missing=("${missing[@]/nodejs}"); missing=("${missing[@]/npm}")
fi
clean=()
for p in "${missing[@]}"; do [ -n "$p" ] && clean+=("$p"); done
if [ ${#clean[@]} -eq 0 ]; then
  echo "setup-deps: all packages present"
  exit 0
fi
echo "setup-deps: installing ${clean[*]}"
SUDO=
[ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${clean[@]}"
