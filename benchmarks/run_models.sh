#!/usr/bin/env bash
# Training throughput of torchvision's CNN families on the CPU (issue 52, item
# 5): loom (resnet50_throughput --arch MODEL) beside PyTorch eager
# (benchmarks/peers/torch_resnet50_cifar.py --arch MODEL) in one run, each
# model in turn, 10 classes, SGD with momentum on one repeated batch of random
# images: batch 32 at 32x32, and MobileNetV2 and EfficientNet-B0 also batch 8
# at 224x224. Prints both JSON lines and the ratio per model.
# Usage: benchmarks/run_models.sh [threads] [steps] [models...]
#   LOOM_BUILD=dir picks the build directory (default: build);
#   LOOM_PEER_PYTHON picks the peers' python (see benchmarks/peer_python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
steps=${2:-5}
shift 2 || shift $#
models=("$@")
((${#models[@]})) || models=(vgg11_bn vgg16_bn mobilenet_v2 mobilenet_v3_small mobilenet_v3_large efficientnet_b0
                             regnet_y_400mf convnext_tiny)
build=${LOOM_BUILD:-build}
source benchmarks/peer_python.sh
peer_modes=eager  # torch.compile's CPU warm-up is minutes per model on 2 cores
# measure MODEL BATCH SIZE: loom, then the peer, then the ratio.
measure() {
  local loom
  # lr 0.001: every model's loss on the repeated batch falls from the first steps (checked by the benchmark).
  loom=$("$build/benchmarks/resnet50_throughput" --arch "$1" --batch "$2" --size "$3" --steps "$steps" \
           --threads "$threads" --lr 0.001)
  echo "$loom"
  run_peers benchmarks/peers/torch_resnet50_cifar.py --arch "$1" --batch "$2" --size "$3" --steps "$steps" \
    --threads "$threads" --lr 0.001
  python3 - "$1" "$2" "$3" "$loom" "${peer_args[@]}" <<'PY'
import json, sys
model, batch, size, loom = sys.argv[1:5]
peers = [json.loads(line) for flag, line in zip(sys.argv[5::2], sys.argv[6::2]) if line.strip()]
rate = json.loads(loom)["images_per_s"]
ratio = f"{rate / peers[0]['images_per_s']:.2f}x PyTorch eager ({peers[0]['images_per_s']} images/s)" if peers else "no peer"
print(f"== {model}, batch {batch} at {size}x{size}: loom {rate} images/s, {ratio}")
PY
}
for model in "${models[@]}"; do
  measure "$model" 32 32
  if [[ $model == mobilenet_v2 || $model == efficientnet_b0 ]]; then measure "$model" 8 224; fi
done
