#!/usr/bin/env bash
# ImageFolder throughput, loom beside torchvision's DataLoader + PIL on the same files, with the ratio.
# Needs Debian's python3-pil (and python3-torchvision for the peer; scripts/setup.sh --peers).
# Usage: benchmarks/data/run_image_folder.sh [build-dir] [workers] [images]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build}
workers=${2:-1,2}
images=${3:-400}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

/usr/bin/python3 "$here/image_folder_peer.py" --write "$work/folder" --images "$images"
"$build/benchmarks/data/bench_image_folder" --folder "$work/folder" --workers "$workers" | tee "$work/loom.jsonl"
if /usr/bin/python3 -c 'import torchvision' 2>/dev/null; then
  /usr/bin/python3 "$here/image_folder_peer.py" --folder "$work/folder" --workers "$workers" | tee "$work/torch.jsonl"
  python3 - "$work/loom.jsonl" "$work/torch.jsonl" <<'PY'
import json, sys
loom = [json.loads(line) for line in open(sys.argv[1])]
torch = {r["workers"]: r for r in map(json.loads, open(sys.argv[2]))}
for r in loom:
    peer = torch.get(r["workers"])
    if peer:
        print(json.dumps({"workers": r["workers"], "loom_images_per_s_per_worker": r["images_per_s_per_worker"],
                          "torchvision_images_per_s_per_worker": peer["images_per_s_per_worker"],
                          "ratio": round(r["images_per_s"] / peer["images_per_s"], 2)}))
PY
else
  echo "torchvision is not installed (apt-get install python3-torchvision): no peer figures" >&2
fi
