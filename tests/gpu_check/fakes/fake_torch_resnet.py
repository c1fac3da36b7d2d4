"""Fake benchmarks/peers/torch_resnet50_cifar.py: records its arguments in
$FAKE_STATE/ran.log and prints the peer's JSON line for its --amp and
--channels-last (f32 2,000 images/s, f16 4,000, channels-last f16 8,000, bf16 4,000)."""
import argparse
import json
import os

p = argparse.ArgumentParser()
p.add_argument("--amp", default="none")
p.add_argument("--channels-last", action="store_true")
args, _ = p.parse_known_args()
with open(os.path.join(os.environ["FAKE_STATE"], "ran.log"), "a") as f:
    f.write(f"bench.torch_resnet50 --amp {args.amp}{' --channels-last' if args.channels_last else ''}\n")
rate = 2000.0 if args.amp == "none" else 8000.0 if args.channels_last else 4000.0
print(json.dumps({"peer": "torch 2.11.0 (fake)", "arch": "resnet50", "stem": "cifar", "device": "cuda", "amp": args.amp,
                  "channels_last": args.channels_last, "batch": 128, "images_per_s": rate}))
