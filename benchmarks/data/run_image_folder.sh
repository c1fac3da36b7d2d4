#!/usr/bin/env bash
# ImageFolder throughput, loom beside torchvision's DataLoader + PIL on the same files, with the ratio.
# Needs Debian's python3-pil (and python3-torchvision for the peer; scripts/setup.sh --peers).
# Usage: benchmarks/data/run_image_folder.sh [build-dir] [workers] [images] [rounds]
# Rounds alternate loom and each peer, so that load on the machine falls on
# both; each round's figures are printed, then the spread over the rounds.
# The peers are Debian's /usr/bin/python3 and $LOOM_PEER_PYTHON (another python
# with torch, torchvision and PIL), else ./.venv/bin/python when present
# (scripts/setup.sh --peers installs PyTorch 2.x there).
# The CPU figure (images per CPU-second of the decoding thread, see
# bench_image_folder.cpp and image_folder_peer.py) is the one to compare on a
# loaded machine; the wall-clock one moves with the load.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build}
workers=${2:-1,2}
images=${3:-400}
rounds=${4:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

second=${LOOM_PEER_PYTHON:-}
[[ -z "$second" && -x "$here/../../.venv/bin/python" ]] && second="$here/../../.venv/bin/python"
peers=()
for python in /usr/bin/python3 $second; do
  if "$python" -c 'import torchvision, PIL' 2>/dev/null; then
    peers+=("$python")
  else
    echo "$python has no torchvision and PIL (apt-get install python3-torchvision): no peer figures from it" >&2
  fi
done

/usr/bin/python3 "$here/image_folder_peer.py" --write "$work/folder" --images "$images"
for round in $(seq "$rounds"); do
  "$build/benchmarks/data/bench_image_folder" --folder "$work/folder" --workers "$workers" | tee -a "$work/results.jsonl"
  for python in ${peers[@]+"${peers[@]}"}; do
    "$python" "$here/image_folder_peer.py" --folder "$work/folder" --workers "$workers" | tee -a "$work/results.jsonl"
  done
done
/usr/bin/python3 - "$work/results.jsonl" "$rounds" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
rounds = int(sys.argv[2])
def key(r):
    return "loom" if r["framework"] == "loom" else "torchvision " + r["torchvision"]
runs = {}  # (framework, workers) -> one row per round, in order
for r in rows:
    runs.setdefault((key(r), r["workers"]), []).append(r)
def spread(values):
    values = sorted(values)
    return "%g..%g (median %g)" % (values[0], values[-1], values[len(values) // 2])
for (name, workers), loom in sorted(runs.items()):
    if name != "loom":
        continue
    print("workers %d, loom: %s images per CPU-s, %s images/s per worker" % (
        workers, spread([r["images_per_cpu_s"] for r in loom]), spread([r["images_per_s_per_worker"] for r in loom])))
    for (peer, peer_workers), other in sorted(runs.items()):
        if peer == "loom" or peer_workers != workers:
            continue
        cpu = [round(a["images_per_cpu_s"] / b["images_per_cpu_s"], 2) for a, b in zip(loom, other)]
        collate = [round(a["images_per_cpu_s"] / b["images_per_cpu_s_with_collate"], 2) for a, b in zip(loom, other)]
        wall = [round(a["images_per_s"] / b["images_per_s"], 2) for a, b in zip(loom, other)]
        print("  %s: %s images per CPU-s (%s with collate), %s images/s per worker" % (
            peer, spread([r["images_per_cpu_s"] for r in other]),
            spread([r["images_per_cpu_s_with_collate"] for r in other]),
            spread([r["images_per_s_per_worker"] for r in other])))
        print("  ratio per round, CPU: %s (against dataset[i] alone), %s (against the loop with collate); "
              "wall: %s" % (cpu, collate, wall))
PY
