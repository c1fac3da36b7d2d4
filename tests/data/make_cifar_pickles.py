#!/usr/bin/env python3
"""Writes CIFAR-10 batches in torchvision's python layout with Python's own
pickle and numpy (Debian's python3-numpy): data_batch_1 .. data_batch_5,
test_batch and batches.meta in OUT, each a pickled dict as the CIFAR tarball
has it ({"data": uint8 array (N, 3072), "labels": [N ints], "batch_label":
..., "filenames": [...]}).

Pixel j of image i (counted over the training batches in order, then the
test batch from 0) is (i * 131 + j * 7 + (j // 1024) * 3) % 256 and its label
is (i * 3 + 1) % 10, so a reader can be checked without this script's help.

  make_cifar_pickles.py OUT STYLE [--train-per-file N] [--test N]

STYLE:
  py2           protocol 2 as Python 2's cPickle wrote the CIFAR files: byte-string
                keys and values, the pixel data as one BINSTRING
  protocol2     Python 3's pickle at protocol 2 with str keys (bytes become
                _codecs.encode(..., 'latin1'))
  protocol2-bytes-keys  the same with bytes keys
  default       Python 3's pickle.DEFAULT_PROTOCOL, str keys
  protocol5     protocol 5 (numpy pickles arrays as _frombuffer of a bytearray)
  numpy-labels  the default protocol with the labels as an int64 numpy array
"""
import argparse
import io
import os
import pickle
import struct

import numpy as np


class Python2Pickler(pickle._Pickler):
    """Python's pure pickler with bytes saved as Python 2 saved its str:
    SHORT_BINSTRING below 256 bytes, BINSTRING above (Python 2's pickle.py)."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_py2_str(self, obj):
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str


def pixels(first, count):
    i = np.arange(first, first + count, dtype=np.int64)[:, None]
    j = np.arange(3072, dtype=np.int64)[None, :]
    return ((i * 131 + j * 7 + (j // 1024) * 3) % 256).astype(np.uint8)


def labels(first, count):
    return [(i * 3 + 1) % 10 for i in range(first, first + count)]


def dump(path, entry, style):
    if style == "py2":
        buffer = io.BytesIO()
        Python2Pickler(buffer, protocol=2).dump(entry)
        data = buffer.getvalue()
    else:
        protocol = {"protocol2": 2, "protocol2-bytes-keys": 2, "protocol5": 5}.get(style, pickle.DEFAULT_PROTOCOL)
        data = pickle.dumps(entry, protocol=protocol)
    with open(path, "wb") as out:
        out.write(data)


def entry(style, batch_label, first, count):
    text = (lambda s: s.encode()) if style in ("py2", "protocol2-bytes-keys") else (lambda s: s)
    label_values = labels(first, count)
    if style == "numpy-labels":
        label_values = np.array(label_values, dtype=np.int64)
    return {
        text("batch_label"): text(batch_label),
        text("labels"): label_values,
        text("data"): pixels(first, count),
        text("filenames"): [text("image_%05d.png" % k) for k in range(first, first + count)],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("style", choices=["py2", "protocol2", "protocol2-bytes-keys", "default", "protocol5",
                                          "numpy-labels"])
    parser.add_argument("--train-per-file", type=int, default=4)
    parser.add_argument("--test", type=int, default=3)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for b in range(5):
        first = b * args.train_per_file
        dump(os.path.join(args.out, "data_batch_%d" % (b + 1)),
             entry(args.style, "training batch %d of 5" % (b + 1), first, args.train_per_file), args.style)
    dump(os.path.join(args.out, "test_batch"), entry(args.style, "testing batch 1 of 1", 0, args.test), args.style)
    text = (lambda s: s.encode()) if args.style in ("py2", "protocol2-bytes-keys") else (lambda s: s)
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    dump(os.path.join(args.out, "batches.meta"),
         {text("num_cases_per_batch"): args.train_per_file, text("label_names"): [text(n) for n in names],
          text("num_vis"): 3072}, args.style)


if __name__ == "__main__":
    main()
