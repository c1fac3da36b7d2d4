#!/usr/bin/env bash
# Installs what loom needs (Debian packages; idempotent), then configures and
# builds it in ./build. Usage: scripts/setup.sh [--peers] [extra cmake args]
#   --peers  also installs the benchmarks' peers: PyTorch 2.x, torchvision and
#            NumPy from the Python package index into ./.venv (gigabytes; the
#            benchmarks/run_*.sh peers and the torchrun tests use it), Debian's
#            PyTorch 1.13 (python3-torch, torchvision, OpenBLAS), and valgrind
#            for benchmarks/callgrind_step.sh.
# The real launchers the tests start loom's programs with come from Debian:
# Open MPI (openmpi-bin) and a one-node SLURM cluster (slurm-wlm, munge).
# With nvcc present it also fetches the cudnn-frontend headers (the cuDNN
# graph API; scripts/fetch-cudnn-frontend.sh) into .deps, best-effort: without
# pip or network loom builds without them (the unfused convolutions only).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake libeigen3-dev doctest-dev libgloo-dev zlib1g-dev nlohmann-json3-dev
          libcli11-dev dataset-fashion-mnist iproute2 python3 python3-numpy python3-pil libturbojpeg0-dev libjpeg62-turbo-dev libpng-dev
          openmpi-bin slurm-wlm munge pkgconf
          gnuplot-nox  # scripts/plot_metrics
          clang)  # clang: libFuzzer for scripts/fuzz.sh
have_nvcc=0
if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] || compgen -G '/usr/local/cuda-*/bin/nvcc' >/dev/null; then
  have_nvcc=1
  packages+=(python3-pip)  # pip download: the cudnn-frontend headers
fi
peers=0
if [[ "${1:-}" == "--peers" ]]; then
  shift
  peers=1
  packages+=(python3-torch python3-torchvision libopenblas0-pthread python3-numpy gnuplot-nox python3-venv valgrind)
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

if (( peers )); then
  # PyTorch 2.x as users install it today: the benchmarks' peers (with
  # torchvision) and the torchrun tests (torchrun, the c10d TCPStore of today).
  [[ -x .venv/bin/python ]] || python3 -m venv .venv
  .venv/bin/python -c 'import sys, torch, torchvision, numpy; sys.exit(not torch.__version__.startswith("2."))' \
    2>/dev/null || .venv/bin/pip install -q --upgrade torch torchvision numpy
fi

if (( have_nvcc )); then
  scripts/fetch-cudnn-frontend.sh ||
    echo "setup: going on without cudnn-frontend: loom builds the unfused convolutions only" \
         "(rerun scripts/fetch-cudnn-frontend.sh, or pass -DCUDNN_FRONTEND_INCLUDE_DIR=...)" >&2
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$(nproc)"
