#!/usr/bin/env bash
# ConvNet training throughput, loom beside PyTorch (../shared/peers) in one run.
# Usage: benchmarks/run_convnet.sh [threads] [steps]   (after scripts/setup.sh --peers)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
steps=${2:-300}
peer=${LOOM_PEERS:-../shared/peers}/torch_mnist_ddp.py
loom=$(build/benchmarks/convnet_throughput --threads "$threads" --steps "$steps")
echo "$loom"
if /usr/bin/python3 -c "import torch" 2>/dev/null && [[ -f "$peer" ]]; then
  # Every thread pool of the peer at the same count (torch.set_num_threads leaves OpenBLAS at all cores).
  torch=$(OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads MKL_NUM_THREADS=$threads /usr/bin/python3 "$peer" --world 1 --threads "$threads" --max-steps "$((steps + 10))" --epochs 1 | tail -n 1)
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
