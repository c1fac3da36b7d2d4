#!/usr/bin/env bash
# ConvNet training throughput (Fashion-MNIST, batch 100, world 1), loom beside
# PyTorch eager and torch.compile (benchmarks/peers/torch_mnist_ddp.py) in one
# run: images/s, the ratios, each as a share of this machine's f32 GEMM peak
# measured in the same run, peak RSS.
# Usage: benchmarks/run_convnet.sh [threads] [steps]
#   LOOM_BUILD=dir picks the build directory (default: build);
#   LOOM_PEER_PYTHON picks the peers' python (see benchmarks/peer_python.sh).
# PyTorch 2.x: scripts/setup.sh --peers. Without a PyTorch, loom's figures alone.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
steps=${2:-300}
build=${LOOM_BUILD:-build}
source benchmarks/peer_python.sh
gemm_peak=$("$build/benchmarks/gemm_peak" --threads "$threads" | tail -n 1)
echo "$gemm_peak"
loom=$("$build/benchmarks/convnet_throughput" --threads "$threads" --steps "$steps")
echo "$loom"
# The peer times from its first step; its steady figure (after 20 steps, the
# compile and warm-up) is the one compared, as loom's leaves out its warm-up.
run_peers benchmarks/peers/torch_mnist_ddp.py --world 1 --threads "$threads" --max-steps "$((steps + 20))" --epochs 1
python3 benchmarks/peer_summary.py --label "ConvNet, Fashion-MNIST, batch 100, world 1, $threads threads" \
  --batch 100 --gemm-peak "$gemm_peak" --loom "$loom" --rate steady_images_per_s "${peer_args[@]}"
