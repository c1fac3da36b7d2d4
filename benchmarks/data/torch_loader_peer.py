#!/usr/bin/env python3
"""torchvision peer of bench_data: the same transforms through a torch DataLoader.

CIFAR-10 (binary batch files, e.g. the synthetic ones bench_data writes):
RandomCrop(32, 4) + RandomHorizontalFlip + ToTensor + Normalize, on PIL images
as torchvision.datasets.CIFAR10 yields them. Fashion-MNIST (IDX gz): ToTensor +
Normalize. One JSON line per (dataset, workers), fields as bench_data prints.
    /usr/bin/python3 torch_loader_peer.py --cifar-dir DIR [--workers 1,2] [--images 10000]
"""
import argparse
import gzip
import json
import math
import os
import time

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)


def read_cifar(directory):
    records = []
    for i in range(1, 6):
        raw = np.fromfile(os.path.join(directory, f"data_batch_{i}.bin"), dtype=np.uint8)
        records.append(raw.reshape(-1, 3073))
    records = np.concatenate(records)
    images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy()  # HWC, as torchvision keeps it
    return images, records[:, 0].astype(np.int64)


def read_mnist(directory):
    with gzip.open(os.path.join(directory, "train-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 28, 28)
    with gzip.open(os.path.join(directory, "train-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), dtype=np.uint8, offset=8).astype(np.int64)
    return images, labels


class ImageArrayDataset(Dataset):
    """What torchvision.datasets.CIFAR10 / MNIST do per sample: PIL image, then transform."""

    def __init__(self, images, labels, transform, mode):
        self.images, self.labels, self.transform, self.mode = images, labels, transform, mode

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        image = Image.fromarray(self.images[index], mode=self.mode)
        return self.transform(image), int(self.labels[index])


def validate(batch_images, mean, std):
    low = torch.tensor([(0 - m) / s for m, s in zip(mean, std)]).view(1, -1, 1, 1)
    high = torch.tensor([(1 - m) / s for m, s in zip(mean, std)]).view(1, -1, 1, 1)
    assert torch.isfinite(batch_images).all(), "non-finite values"
    assert (batch_images >= low - 1e-5).all() and (batch_images <= high + 1e-5).all(), "values out of range"


def bench(name, transform_name, dataset, mean, std, workers, batch_size, repeats):
    # Persistent workers: after the first epoch, process start-up is out of the timing.
    torch.manual_seed(0)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers, drop_last=False,
                        persistent_workers=workers > 0)
    best = math.inf
    for repeat in range(repeats):
        start = time.perf_counter()
        samples = 0
        for index, (images, labels) in enumerate(loader):
            if repeat == 0 and index == 0:
                validate(images, mean, std)
            samples += len(labels)
        best = min(best, time.perf_counter() - start)
        assert samples == len(dataset)
    images_per_s = len(dataset) / best
    print(json.dumps({
        "benchmark": "data_pipeline", "framework": "torchvision", "dataset": name, "transforms": transform_name,
        "mode": "loader", "workers": workers, "batch_size": batch_size, "images": len(dataset),
        "seconds": round(best, 4), "images_per_s": round(images_per_s),
        "images_per_s_per_worker": round(images_per_s / max(workers, 1)),
        "peer": f"torch {torch.__version__}, torchvision DataLoader"}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cifar-dir", required=True)
    parser.add_argument("--mnist-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--images", type=int, default=10000, help="first N images of each set (throughput only)")
    parser.add_argument("--repeats", type=int, default=2, help="epochs; the fastest is reported")
    args = parser.parse_args()
    workers = [int(w) for w in args.workers.split(",")]

    images, labels = read_cifar(args.cifar_dir)
    cifar = ImageArrayDataset(images[:args.images], labels[:args.images], transforms.Compose([
        transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
        transforms.Normalize(CIFAR_MEAN, CIFAR_STD)]), "RGB")
    for w in workers:
        bench("cifar10", "RandomCrop(32,4)+RandomHorizontalFlip+ToTensor+Normalize", cifar, CIFAR_MEAN, CIFAR_STD,
              w, args.batch_size, args.repeats)
    if args.mnist_dir:
        images, labels = read_mnist(args.mnist_dir)
        mnist = ImageArrayDataset(images[:args.images], labels[:args.images], transforms.Compose([
            transforms.ToTensor(), transforms.Normalize(MNIST_MEAN, MNIST_STD)]), "L")
        for w in workers:
            bench("fashion-mnist", "ToTensor+Normalize", mnist, MNIST_MEAN, MNIST_STD, w, args.batch_size,
                  args.repeats)


if __name__ == "__main__":
    main()
