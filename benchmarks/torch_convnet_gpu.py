#!/usr/bin/env python3
"""PyTorch peer of `convnet_throughput --device cuda`: the tutorials' ConvNet,
batch 100, SGD(lr 0.01, momentum 0.9) on the same IDX files, on one GPU.

Three modes, each validated (finite, falling loss) before it is reported:
  eager_f32                       -- what loom's default GPU path does: f32 with
                                     TF32 off in cuDNN and cuBLAS (PyTorch's default
                                     leaves cuDNN's TF32 on, which would compare
                                     different arithmetic)
  eager_tf32                      -- f32 tensors, TF32 tensor cores allowed (as
                                     loom's convnet_throughput --tf32)
  channels_last_autocast_f16      -- PyTorch's fast path for convnets
Each batch is copied from host memory to the GPU every step, as loom does.
Prints one JSON line per mode: images/s after warm-up and peak GPU memory.

  python3 benchmarks/torch_convnet_gpu.py --data DIR --steps 500
"""
import argparse
import gzip
import json
import os
import struct
import sys
import time


def read_idx(path):
    import numpy as np

    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def find(directory, stem):
    for name in (stem, stem + ".gz"):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            return path
    raise SystemExit(f"torch_convnet_gpu: {stem} not found in {directory}")


def set_math_mode(torch, mode):
    """TF32 in cuDNN and cuBLAS on for eager_tf32 only (PyTorch's own default
    leaves cuDNN's on); returns whether it is on."""
    tf32 = mode == "eager_tf32"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    return tf32


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--modes", default="eager_f32,eager_tf32,channels_last_autocast_f16")
    args = parser.parse_args()

    import torch
    import torch.nn as nn
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
    from torch_convnet import ConvNet

    if not torch.cuda.is_available():
        print(json.dumps({"bench": "torch convnet train", "skipped": "no CUDA device visible to PyTorch"}))
        return 0
    device = torch.device("cuda")
    images = torch.from_numpy(read_idx(find(args.data, "train-images-idx3-ubyte")).copy())
    labels = torch.from_numpy(read_idx(find(args.data, "train-labels-idx1-ubyte")).astype("int64"))

    n = images.shape[0]
    generator = torch.Generator().manual_seed(0)
    for mode in args.modes.split(","):
        channels_last = mode.startswith("channels_last")
        autocast = "autocast" in mode
        tf32 = set_math_mode(torch, mode)
        torch.manual_seed(0)
        model = ConvNet().to(device)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        criterion = nn.CrossEntropyLoss()
        scaler = torch.amp.GradScaler("cuda", enabled=autocast)
        order = torch.randperm(n, generator=generator)
        losses = []
        torch.cuda.reset_peak_memory_stats()
        start = None
        total = args.warmup + args.steps
        for step in range(total):
            if step == args.warmup:
                torch.cuda.synchronize()
                start = time.perf_counter()
            offset = (step * args.batch_size) % (n - args.batch_size + 1)
            index = order[offset:offset + args.batch_size]
            x = (images[index].float() / 255.0).unsqueeze(1)
            y = labels[index]
            x = x.to(device, memory_format=torch.channels_last) if channels_last else x.to(device)
            y = y.to(device)
            with torch.autocast("cuda", dtype=torch.float16, enabled=autocast):
                loss = criterion(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            losses.append(loss.detach())
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        values = [float(l) for l in losses]
        tenth = max(1, len(values) // 10)
        first, last = sum(values[:tenth]) / tenth, sum(values[-tenth:]) / tenth
        if not all(v == v and abs(v) != float("inf") for v in values):
            raise SystemExit(f"torch_convnet_gpu {mode}: loss is not finite")
        if not last < first:
            raise SystemExit(f"torch_convnet_gpu {mode}: loss did not fall ({first:.4f} -> {last:.4f})")
        print(json.dumps({
            "bench": "torch convnet train", "mode": mode, "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "tf32": tf32, "batch": args.batch_size, "steps": args.steps,
            "images_per_s": round(args.steps * args.batch_size / seconds, 1),
            "step_ms": round(1000 * seconds / args.steps, 3),
            "loss_first": round(first, 4), "loss_last": round(last, 4),
            "peak_allocated_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1),
            "peak_reserved_mb": round(torch.cuda.max_memory_reserved() / 2**20, 1),
        }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
