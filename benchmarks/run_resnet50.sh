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
  # The peer runs under a wrapper that adds its peak RSS (getrusage, KiB) to its JSON line.
  # Every thread pool of the peer at the same count (torch.set_num_threads leaves OpenBLAS at all cores).
  torch=$(OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads MKL_NUM_THREADS=$threads /usr/bin/python3 - "$peer" --batch "$batch" --steps "$steps" --threads "$threads" <<'PY' | tail -n 1
import contextlib, io, json, resource, runpy, sys
sys.argv = sys.argv[1:]
out = io.StringIO()
with contextlib.redirect_stdout(out):
    runpy.run_path(sys.argv[0], run_name="__main__")
line = json.loads(out.getvalue().strip().splitlines()[-1])
line["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
print(json.dumps(line))
PY
)
  echo "$torch"
  python3 - "$loom" "$torch" <<'PY'
import json, sys
loom, torch = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(json.dumps({"loom_images_per_s": loom["images_per_s"], "torch_images_per_s": torch["images_per_s"],
                  "ratio": round(loom["images_per_s"] / torch["images_per_s"], 3),
                  "loom_peak_rss_mb": loom["peak_rss_mb"], "torch_peak_rss_mb": torch["peak_rss_mb"],
                  "rss_ratio": round(loom["peak_rss_mb"] / torch["peak_rss_mb"], 3), "peer": torch["peer"]}))
PY
else
  echo "PyTorch not installed (scripts/setup.sh --peers): no peer figure" >&2
fi
