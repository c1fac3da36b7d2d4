#!/usr/bin/env bash
# ResNet-50 training throughput (CIFAR-shaped input), loom beside PyTorch
# (../shared/peers/torch_resnet50_cifar.py) in one run, and their ratio.
# Usage: benchmarks/run_resnet50.sh [threads] [steps] [batch]   (after scripts/setup.sh --peers)
#   LOOM_BUILD=dir picks the build directory (default: build).
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
steps=${2:-10}
batch=${3:-32}
build=${LOOM_BUILD:-build}
peer=${LOOM_PEERS:-../shared/peers}/torch_resnet50_cifar.py
loom=$("$build/benchmarks/resnet50_throughput" --threads "$threads" --steps "$steps" --batch "$batch")
echo "$loom"
if /usr/bin/python3 -c "import torch, torchvision" 2>/dev/null && [[ -f "$peer" ]]; then
  torch=$(/usr/bin/python3 "$peer" --batch "$batch" --steps "$steps" --threads "$threads" | tail -n 1)
  echo "$torch"
  python3 - "$loom" "$torch" <<'PY'
import json, sys
loom, torch = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(json.dumps({"loom_images_per_s": loom["images_per_s"], "torch_images_per_s": torch["images_per_s"],
                  "ratio": round(loom["images_per_s"] / torch["images_per_s"], 3), "peer": torch["peer"]}))
PY
else
  echo "PyTorch not installed (scripts/setup.sh --peers): no peer figure" >&2
fi
