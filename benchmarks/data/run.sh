#!/usr/bin/env bash
# Data pipeline throughput, loom beside torchvision on the same data, with the ratio.
# Usage: benchmarks/data/run.sh [build-dir] [workers] [peer-images]
#   e.g. benchmarks/data/run.sh /work/build-data 1,2 10000
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build}
workers=${2:-1,2}
peer_images=${3:-10000}
bench=$build/benchmarks/data/bench_data
mnist=/usr/share/datasets/fashion-mnist
[[ -d $mnist ]] || mnist=""
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Both sides read the same CIFAR-10 batch files and the same Fashion-MNIST files.
"$bench" --write-synthetic-cifar "$work/cifar"
"$bench" --cifar-dir "$work/cifar" --mnist-dir "$mnist" --workers "$workers" | tee "$work/loom.jsonl"
/usr/bin/python3 "$here/torch_loader_peer.py" --cifar-dir "$work/cifar" --mnist-dir "$mnist" --workers "$workers" \
  --images "$peer_images" | tee "$work/torch.jsonl"
python3 - "$work/loom.jsonl" "$work/torch.jsonl" <<'PY'
import json, sys
loom = [json.loads(line) for line in open(sys.argv[1])]
torch = {(r["dataset"], r["workers"]): r for r in map(json.loads, open(sys.argv[2]))}
for r in loom:
    peer = torch.get((r["dataset"], r["workers"]))
    if r["mode"] != "loader" or peer is None:
        continue
    print(json.dumps({"dataset": r["dataset"], "workers": r["workers"],
                      "loom_images_per_s": r["images_per_s"], "torchvision_images_per_s": peer["images_per_s"],
                      "ratio": round(r["images_per_s"] / peer["images_per_s"], 1)}))
PY
