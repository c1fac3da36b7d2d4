"""Fake benchmarks/scaling/scaling.py --device cuda: records its arguments and
writes OUT/STEM.json with a weak-scaling point per world, in the real report's
layout (points, ddp_overhead_world1, allreduce, projection_measured)."""
import argparse
import json
import os

p = argparse.ArgumentParser()
for name in ("--device", "--worlds", "--out", "--stem", "--models", "--build"):
    p.add_argument(name)
args, _ = p.parse_known_args()
with open(os.path.join(os.environ["FAKE_STATE"], "ran.log"), "a") as f:
    f.write(f"scaling.resnet50 --device {args.device} --worlds {args.worlds} --models {args.models}\n")
worlds = [int(w) for w in args.worlds.split(",")]
points = [{"model": "resnet50", "mode": "weak", "world": w, "batch_per_rank": 128, "step_ms": 200.0 + w,
           "images_per_s": 640.0 * w * 200 / (200.0 + w), "efficiency": 200 / (200.0 + w)} for w in worlds]
report = {"points": points, "ddp_overhead_world1": [{"model": "resnet50", "batch": 128, "overhead": 0.02}],
          "problems": [],
          "projection_measured": {"clusters": {"nvlink-ib": {"weak_scaling": [{"world": 8, "efficiency": 0.97}]}}}}
if len(worlds) > 1:
    report["allreduce"] = {"world": max(worlds), "backend": "nccl", "alpha_us": 20.0, "bus_bandwidth_gbs": 300.0}
os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, args.stem + ".json"), "w") as f:
    json.dump(report, f)
print("fake scaling: worlds", args.worlds)
