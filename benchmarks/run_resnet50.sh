#!/usr/bin/env bash
# ResNet-50 training throughput (CIFAR-shaped 32x32 input), loom beside PyTorch
# eager and torch.compile (benchmarks/peers/torch_resnet50_cifar.py) in one run,
# for the ImageNet stem and the CIFAR stem: images/s, the ratios, each as a
# share of this machine's f32 GEMM peak measured in the same run, peak RSS.
# Usage: benchmarks/run_resnet50.sh [threads] [steps] [batch] [stems]
#   stems: "imagenet cifar" (default), or one of them
#   LOOM_BUILD=dir picks the build directory (default: build);
#   LOOM_PEER_PYTHON picks the peers' python (see benchmarks/peer_python.sh).
# PyTorch 2.x: scripts/setup.sh --peers. Without a PyTorch, loom's figures alone.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
steps=${2:-10}
batch=${3:-32}
stems=${4:-imagenet cifar}
build=${LOOM_BUILD:-build}
peer=benchmarks/peers/torch_resnet50_cifar.py
source benchmarks/peer_python.sh
# The GEMM peak at this thread count (gemm_peak prints 1 thread, then `threads`).
gemm_peak=$("$build/benchmarks/gemm_peak" --threads "$threads" | tail -n 1)
echo "$gemm_peak"
[[ -n "$peer_version" ]] && echo "peer: $peer_python ($peer_version)" ||
  echo "no PyTorch with torchvision for $peer_python (scripts/setup.sh --peers): loom's figures alone" >&2
# Every thread pool of the peer at the same count (torch.set_num_threads leaves OpenBLAS at all cores).
run_peer() {
  OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads MKL_NUM_THREADS=$threads \
    "$peer_python" "$peer" --batch "$batch" --steps "$steps" --threads "$threads" "$@" | tail -n 1
}
for stem in $stems; do
  loom=$("$build/benchmarks/resnet50_throughput" --threads "$threads" --steps "$steps" --batch "$batch" --stem "$stem")
  echo "$loom"
  peers=()
  if [[ -n "$peer_version" ]]; then
    eager=$(run_peer --stem "$stem") || { echo "the eager peer failed" >&2; eager=""; }
    echo "$eager"
    peers+=(--peer "$eager")
    if "$peer_python" -c 'import sys, torch; sys.exit(not hasattr(torch, "compile"))'; then
      compiled=$(run_peer --stem "$stem" --compile) || { echo "the torch.compile peer failed" >&2; compiled=""; }
      echo "$compiled"
      peers+=(--peer "$compiled")
    fi
  fi
  python3 benchmarks/peer_summary.py --label "ResNet-50, $stem stem, 32x32, batch $batch, $threads threads" \
    --batch "$batch" --gemm-peak "$gemm_peak" --loom "$loom" "${peers[@]}"
done
