#!/usr/bin/env python3
"""Writes small CIFAR-10 binary files with a learnable signal, for the
train_resnet50_cifar tests: data_batch_1.bin .. data_batch_5.bin and
test_batch.bin in OUT (records of 1 label byte + 3072 pixel bytes, channel
planes of 32x32), no dependencies beyond the standard library.

Class k has its own colour and stripe texture (horizontal for even k,
vertical for odd k, period 2 + k // 2, random phase per image) plus uniform
per-pixel noise, so a classifier can learn it; labels of the training images
are random, the test images cycle through the classes (k % 10).

  make_cifar_files.py OUT [--train-per-file N] [--test N] [--noise A] [--seed S]
"""
import argparse
import os
import random

# Ten well-separated colours (R, G, B).
COLOURS = [(200, 40, 40), (40, 200, 40), (40, 40, 200), (200, 200, 40), (200, 40, 200),
           (40, 200, 200), (120, 120, 120), (230, 140, 40), (90, 40, 150), (150, 230, 150)]


def record(label, rng, noise):
    vertical = label % 2 == 1
    period = 2 + label // 2
    phase = rng.randrange(8)
    planes = []
    for channel in range(3):
        base = COLOURS[label][channel]
        values = bytearray(1024)
        for y in range(32):
            for x in range(32):
                stripe = 25 if ((x if vertical else y) + phase) // period % 2 == 0 else -25
                value = base + stripe + rng.randrange(-noise, noise + 1)
                values[y * 32 + x] = min(255, max(0, value))
        planes.append(bytes(values))
    return bytes([label]) + b"".join(planes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--train-per-file", type=int, default=16, help="images in each of the 5 training files")
    parser.add_argument("--test", type=int, default=20, help="images in test_batch.bin")
    parser.add_argument("--noise", type=int, default=40, help="per-pixel noise amplitude (uniform, +-)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    os.makedirs(args.out, exist_ok=True)
    for i in range(1, 6):
        with open(os.path.join(args.out, f"data_batch_{i}.bin"), "wb") as f:
            f.write(b"".join(record(rng.randrange(10), rng, args.noise) for _ in range(args.train_per_file)))
    with open(os.path.join(args.out, "test_batch.bin"), "wb") as f:
        f.write(b"".join(record(k % 10, rng, args.noise) for k in range(args.test)))


if __name__ == "__main__":
    main()
