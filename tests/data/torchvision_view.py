#!/usr/bin/env python3
"""What torchvision itself makes of a CIFAR-10 root and an image folder, for
comparison with loom's readers (needs Debian's python3-torchvision).

  torchvision_view.py cifar ROOT OUT   torchvision.datasets.CIFAR10(ROOT, train=True
                                       and False): OUT/train.hwc and OUT/test.hwc (uint8
                                       N x 32 x 32 x 3, as .data holds them) and
                                       OUT/train.labels, OUT/test.labels (one per line).
                                       The md5 check of the genuine tarball is skipped:
                                       the files are generated.
  torchvision_view.py folder ROOT OUT  torchvision.datasets.ImageFolder(ROOT): OUT/classes.txt
                                       and OUT/samples.txt ("label<TAB>path relative to ROOT").
"""
import os
import sys

from torchvision import datasets
from torchvision.datasets import cifar

# The files are generated, so the md5 sums of the genuine tarball's files cannot match.
cifar.check_integrity = lambda *args, **kwargs: True


def main():
    kind, root, out = sys.argv[1:4]
    os.makedirs(out, exist_ok=True)
    if kind == "cifar":
        for train, name in ((True, "train"), (False, "test")):
            dataset = datasets.CIFAR10(root, train=train, download=False)
            with open(os.path.join(out, name + ".hwc"), "wb") as f:
                f.write(dataset.data.tobytes())
            with open(os.path.join(out, name + ".labels"), "w") as f:
                f.write("".join("%d\n" % label for label in dataset.targets))
    else:
        dataset = datasets.ImageFolder(root)
        with open(os.path.join(out, "classes.txt"), "w") as f:
            f.write("".join(name + "\n" for name in dataset.classes))
        with open(os.path.join(out, "samples.txt"), "w") as f:
            f.write("".join("%d\t%s\n" % (label, os.path.relpath(path, root)) for path, label in dataset.samples))


if __name__ == "__main__":
    main()
