"""Fake ../shared/peers/torch_resnet_gpu.py: records its arguments (--arch where given) in
$FAKE_STATE/ran.log and prints, as the real one does, one JSON line per mode
of --modes (median ms by stem, dtype and mode; peak bytes) and a last
{"best": ...} line. Hangs after the first mode when FAKE_HANG names
peer.<stem>.<dtype> (its pid in $FAKE_STATE/pids/)."""
import argparse
import json
import os
import time

p = argparse.ArgumentParser()
for name in ("--arch", "--stem", "--size", "--batch", "--dtype", "--modes", "--warmup", "--steps", "--repeats", "--budget-s"):
    p.add_argument(name)
a = p.parse_args()
state = os.environ["FAKE_STATE"]
with open(os.path.join(state, "ran.log"), "a") as f:
    arch = f"--arch {a.arch} " if a.arch else ""
    f.write(f"peer.resnet {arch}--stem {a.stem} --size {a.size} --batch {a.batch} --dtype {a.dtype} --modes {a.modes} "
            f"--warmup {a.warmup} --steps {a.steps} --repeats {a.repeats} --budget-s {a.budget_s}\n")
# Median ms per mode at the CIFAR size; ten times that at ImageNet's.
MS = {"f32": {"eager": 42.0, "channels_last": 44.0, "cuda_graph": 41.0, "compile": 43.0},
      "mixed": {"eager": 16.0, "channels_last": 12.0, "cuda_graph": 11.0, "compile": 9.0}}
scale = {"cifar": 1.0, "imagenet": 10.0}[a.stem]
best = None
for k, mode in enumerate(a.modes.split(",")):
    median = MS["f32" if a.dtype == "f32" else "mixed"][mode] * scale
    row = {"mode": mode, "arch": a.arch or "resnet50", "stem": a.stem, "size": int(a.size), "batch": int(a.batch),
           "dtype": a.dtype, "ms_per_step": [median * 1.01, median, median * 0.98], "median_ms": median,
           "images_per_s": round(int(a.batch) * 1000 / median, 1), "loss": 2.3, "peak_bytes": 1500000000,
           "torch": "2.11.0 (fake)", "cudnn": 91900, "gpu": "NVIDIA H200"}
    print(json.dumps(row), flush=True)
    if best is None or median < best["median_ms"]:
        best = row
    if k == 0 and f"peer.{a.stem}.{a.dtype}" in os.environ.get("FAKE_HANG", "").split():
        with open(os.path.join(state, "pids", f"peer.{a.stem}.{a.dtype}.pid"), "w") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(1000)
print(json.dumps({"best": best}), flush=True)
