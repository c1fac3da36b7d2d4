#!/usr/bin/env bash
# Installs what loom needs (Debian packages; idempotent), then configures and
# builds it in ./build. Usage: scripts/setup.sh [--peers] [extra cmake args]
#   --peers  also installs PyTorch (python3-torch, torchvision, OpenBLAS) for the
#            benchmarks' side-by-side measurements.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake libeigen3-dev doctest-dev libgloo-dev zlib1g-dev nlohmann-json3-dev
          libcli11-dev dataset-fashion-mnist iproute2 python3 pkgconf)
if [[ "${1:-}" == "--peers" ]]; then
  shift
  packages+=(python3-torch python3-torchvision libopenblas0-pthread python3-numpy gnuplot-nox)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if (( ${#missing[@]} )); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$(nproc)"
