#!/usr/bin/env bash
# ResNet-50 training throughput (CIFAR-shaped 32x32 input), loom beside PyTorch
# eager and torch.compile (benchmarks/peers/torch_resnet50_cifar.py) in one run,
# for the ImageNet stem and the CIFAR stem: images/s, the ratios, each as a
# share of this machine's f32 GEMM peak measured in the same run, peak RSS.
# Usage: benchmarks/run_resnet50.sh [threads] [steps] [batch] [stems]
#   steps: 20 by default. resnet50_throughput checks that the loss on its
#   repeated batch fell; it runs the CIFAR stem at lr 0.001 (the ImageNet
#   stem at 0.01), where that loss falls from the first step (at 0.01 it
#   climbs to about 9 first, in PyTorch too).
#   stems: "imagenet cifar" (default), or one of them
#   LOOM_BUILD=dir picks the build directory (default: build);
#   LOOM_PEER_PYTHON picks the peers' python (see benchmarks/peer_python.sh).
# PyTorch 2.x: scripts/setup.sh --peers. Without a PyTorch, loom's figures alone.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
steps=${2:-20}
batch=${3:-32}
stems=${4:-imagenet cifar}
build=${LOOM_BUILD:-build}
source benchmarks/peer_python.sh
# The GEMM peak at this thread count (gemm_peak prints 1 thread, then `threads`).
gemm_peak=$("$build/benchmarks/gemm_peak" --threads "$threads" | tail -n 1)
echo "$gemm_peak"
for stem in $stems; do
  loom=$("$build/benchmarks/resnet50_throughput" --threads "$threads" --steps "$steps" --batch "$batch" --stem "$stem")
  echo "$loom"
  run_peers benchmarks/peers/torch_resnet50_cifar.py --batch "$batch" --steps "$steps" --threads "$threads" --stem "$stem"
  python3 benchmarks/peer_summary.py --label "ResNet-50, $stem stem, 32x32, batch $batch, $threads threads" \
    --batch "$batch" --gemm-peak "$gemm_peak" --loom "$loom" "${peer_args[@]}"
done
