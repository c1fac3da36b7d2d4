#!/usr/bin/env bash
# Data-parallel scaling on this machine's CPU, loom beside PyTorch DDP in one
# run: train_mnist at world 1 (1 thread) and world 2 (two processes, 1 thread
# each, Gloo), and benchmarks/peers/torch_mnist_ddp.py --world 1 / 2
# --threads 1 alike (PyTorch DDP over Gloo, eager and, at world 2, with
# torch.compile), all on Fashion-MNIST with batch 100 per process, SGD
# 0.01 / 0.9. Prints each run as JSON, then the ratios (the better of eager
# and compiled is the peer at world 2).
#   benchmarks/dist/run_scaling_quick.sh            # 200 steps per process
#   benchmarks/dist/run_scaling_quick.sh 500        # steps per process
#   benchmarks/dist/run_scaling_quick.sh --epochs 2 # full epochs (minutes)
# Environment: LOOM_BUILD (default ./build); LOOM_PEER_PYTHON picks the peer's
# python (benchmarks/peer_python.sh: ./.venv's PyTorch 2.x when present).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${LOOM_BUILD:-build}
peer=benchmarks/peers/torch_mnist_ddp.py
source benchmarks/peer_python.sh
if [[ ${1:-} == --epochs ]]; then
  epochs=${2:?--epochs needs a number}
  loom_limit=(--epochs "$epochs")
  torch_limit=(--epochs "$epochs")
  mode="$epochs epochs"
else
  steps=${1:-200}
  loom_limit=(--epochs 1 --max-steps "$steps")
  torch_limit=(--epochs 1 --max-steps "$steps")
  mode="$steps steps per process"
fi
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# loom WORLD: one JSON line from train_mnist's output, after checking the run.
loom() {
  local world=$1 output
  output=$(MASTER_PORT=$(free_port) "$build/apps/train_mnist" -g "$world" --threads 1 --batch-size 100 \
    --log-interval 100000 "${loom_limit[@]}")
  python3 - "$world" "$output" <<'PY'
import json, re, sys
world, text = int(sys.argv[1]), sys.argv[2]
throughput = re.search(r"^Throughput: ([0-9.]+) images/s", text, re.M)
accuracy = re.search(r"^Test accuracy: ([0-9.]+) \((\d+)/(\d+)\)", text, re.M)
seconds = re.search(r"^Training complete in: (\d+):(\d+):([0-9.]+)", text, re.M)
if not (throughput and accuracy and seconds) or int(accuracy.group(3)) != 10000 or float(accuracy.group(1)) < 0.5:
    sys.exit(f"loom world {world}: implausible result:\n{text}")
h, m, s = seconds.groups()
print(json.dumps({"system": "loom", "world": world, "threads": 1, "images_per_s": float(throughput.group(1)),
                  "train_s": round(int(h) * 3600 + int(m) * 60 + float(s), 3),
                  "test_acc": float(accuracy.group(1))}))
PY
}

# torch WORLD [--compile]. torch.set_num_threads(1) does not reach OpenBLAS's
# own thread pool (Debian's libopenblas0-pthread): without these the
# "1 thread" peer uses ~1.6 cores.
torch() {
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 \
    "$peer_python" "$peer" --world "$1" --threads 1 --batch 100 --port "$(free_port)" "${torch_limit[@]}" "${@:2}" \
    | tail -n 1
}

echo "# $mode; $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
loom1=$(loom 1); echo "$loom1"
loom2=$(loom 2); echo "$loom2"
torch1='{}' torch2='{}' torch2c='{}'
if [[ -n "$peer_version" ]]; then
  torch1=$(torch 1); echo "$torch1"
  torch2=$(torch 2); echo "$torch2"
  if "$peer_python" -c 'import sys, torch; sys.exit(not hasattr(torch, "compile"))'; then
    torch2c=$(torch 2 --compile); echo "$torch2c"
  fi
fi
python3 - "$loom1" "$loom2" "$torch1" "$torch2" "$torch2c" <<'PY'
import json, sys
l1, l2, t1, t2, t2c = (json.loads(a) for a in sys.argv[1:])
summary = {"loom_scaling_2_over_1": round(l2["images_per_s"] / l1["images_per_s"], 3),
           "loom_accuracy_points_2_minus_1": round(100 * (l2["test_acc"] - l1["test_acc"]), 2)}
if t1 and t2:
    # The peer's steady rate (after its first 20 steps: torch.compile's
    # compile and the warm-up left out) where it has one; loom's rate is the
    # whole run's, its first steps included: the comparison favours the peer.
    rate = lambda t: t.get("steady_images_per_s") or t["images_per_s"]
    best2 = max((t for t in (t2, t2c) if t), key=rate)
    summary.update({"torch_scaling_2_over_1": round(rate(t2) / rate(t1), 3),
                    "loom_over_torch_world1": round(l1["images_per_s"] / rate(t1), 3),
                    "loom_over_torch_world2_eager": round(l2["images_per_s"] / rate(t2), 3),
                    "loom_over_torch_world2": round(l2["images_per_s"] / rate(best2), 3),
                    "peer": best2.get("peer", "")})
print(json.dumps(summary))
PY
