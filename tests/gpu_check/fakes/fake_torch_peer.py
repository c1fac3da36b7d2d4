"""Fake benchmarks/torch_convnet_gpu.py: one JSON row per --modes entry,
printed WITHOUT flushing (only PYTHONUNBUFFERED=1 shows a row before a kill);
hangs after the first row when FAKE_HANG names bench.torch_convnet."""
import argparse
import json
import os
import time

p = argparse.ArgumentParser()
p.add_argument("--modes", required=True)
args, _ = p.parse_known_args()
state = os.environ["FAKE_STATE"]
with open(os.path.join(state, "ran.log"), "a") as f:
    f.write("bench.torch_convnet --modes " + args.modes + "\n")
rates = {"eager_f32": 80000.0, "eager_tf32": 100000.0, "channels_last_autocast_f16": 120000.0}
for k, mode in enumerate(args.modes.split(",")):
    rate = rates.get(mode, 1.0)
    print(json.dumps({"bench": "torch convnet train", "mode": mode, "tf32": mode == "eager_tf32",
                      "images_per_s": rate, "step_ms": round(100 * 1000 / rate, 3), "peak_allocated_mb": 20.0}))
    if k == 0 and "bench.torch_convnet" in os.environ.get("FAKE_HANG", "").split():
        with open(os.path.join(state, "pids", "bench.torch_convnet.pid"), "w") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(1000)
