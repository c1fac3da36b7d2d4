#!/usr/bin/env python3
"""torchvision peer of bench_image_folder, and the image tree both read.

  image_folder_peer.py --write DIR [--images 400] [--classes 4]
      writes DIR/class_k/img_n.jpg (ImageNet-sized JPEGs, 500x375 and
      375x500, quality 90) with PIL; a few PNGs among them.
  image_folder_peer.py --folder DIR [--workers 1,2] [--size 224]
      torchvision.datasets.ImageFolder + RandomResizedCrop(size) +
      RandomHorizontalFlip + ToTensor + Normalize through a torch DataLoader
      with that many worker processes; one JSON line per worker count, fields
      as bench_image_folder prints, plus the torch and torchvision versions.
      The CPU figures come from epochs in this process (num_workers=0), the
      work one worker process does: images_per_cpu_s counts the CPU time of
      dataset[i] alone (time.thread_time, as bench_image_folder counts get()),
      images_per_cpu_s_with_collate that of the whole loop, batching included
      (time.process_time).
"""
import argparse
import json
import os
import random
import time


def write_tree(directory, images, classes):
    from PIL import Image, ImageDraw
    rng = random.Random(0)
    for n in range(images):
        klass = os.path.join(directory, "class_%d" % (n % classes))
        os.makedirs(klass, exist_ok=True)
        size = (500, 375) if n % 2 == 0 else (375, 500)
        image = Image.new("RGB", size, (rng.randrange(256), rng.randrange(256), rng.randrange(256)))
        draw = ImageDraw.Draw(image)
        for _ in range(20):
            x, y = rng.randrange(size[0]), rng.randrange(size[1])
            draw.ellipse((x, y, x + rng.randrange(20, 200), y + rng.randrange(20, 200)),
                         fill=(rng.randrange(256), rng.randrange(256), rng.randrange(256)))
        if n % 10 == 9:
            image.save(os.path.join(klass, "img_%05d.png" % n))
        else:
            image.save(os.path.join(klass, "img_%05d.jpg" % n), quality=90)


def run_peer(folder, workers, size, batch_size, repeats):
    import torch
    import torchvision
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms
    torch.set_num_threads(1)
    transform = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                                    transforms.ToTensor(),
                                    transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    dataset = datasets.ImageFolder(folder, transform)

    class Timed(torch.utils.data.Dataset):
        def __init__(self):
            self.seconds = 0.0

        def __len__(self):
            return len(dataset)

        def __getitem__(self, index):
            start = time.thread_time()
            sample = dataset[index]
            self.seconds += time.thread_time() - start
            return sample

    timed = Timed()
    best_item, best_loop = float("inf"), float("inf")
    for _ in range(repeats):
        timed.seconds = 0.0
        start = time.process_time()
        samples = sum(images.shape[0] for images, _ in DataLoader(timed, batch_size=batch_size, shuffle=True))
        best_loop = min(best_loop, time.process_time() - start)
        best_item = min(best_item, timed.seconds)
        assert samples == len(dataset)
    for count in workers:
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=count,
                            persistent_workers=count > 0)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            samples = sum(images.shape[0] for images, _ in loader)
            best = min(best, time.perf_counter() - start)
            assert samples == len(dataset)
        print(json.dumps({"benchmark": "image_folder", "framework": "torchvision", "torch": torch.__version__,
                          "torchvision": torchvision.__version__, "workers": count, "batch_size": batch_size,
                          "images": len(dataset), "seconds": round(best, 4),
                          "images_per_s": round(len(dataset) / best, 1),
                          "images_per_s_per_worker": round(len(dataset) / best / max(count, 1), 1),
                          "worker_cpu_seconds": round(best_item, 4),
                          "images_per_cpu_s": round(len(dataset) / best_item, 1),
                          "images_per_cpu_s_with_collate": round(len(dataset) / best_loop, 1)}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write")
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--folder")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if args.write:
        write_tree(args.write, args.images, args.classes)
    if args.folder:
        run_peer(args.folder, [int(w) for w in args.workers.split(",")], args.size, args.batch_size, args.repeats)


if __name__ == "__main__":
    main()
