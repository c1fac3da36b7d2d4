#!/usr/bin/env python3
"""Writes the fuzzers' seed corpus (corpus/<harness>/): small valid inputs of
each format, which libFuzzer mutates. Run from anywhere; standard library only."""
import gzip
import json
import pathlib
import struct

root = pathlib.Path(__file__).resolve().parent / "corpus"


def write(harness, name, data):
    path = root / harness / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


# IDX: big-endian magic, dimension sizes, then unsigned bytes.
images = struct.pack(">IIII", 2051, 2, 3, 3) + bytes(range(18))
labels = struct.pack(">II", 2049, 4) + bytes([0, 9, 3, 7])
write("idx", "images.idx", images)
write("idx", "labels.idx", labels)
write("idx", "images.idx.gz", gzip.compress(images, mtime=0))
write("idx", "labels.idx.gz", gzip.compress(labels, mtime=0))

# CIFAR-10 binary: records of a label byte and 3x32x32 pixels.
write("cifar10", "two_records.bin", bytes([3]) + bytes(i % 251 for i in range(3072)) + bytes([9]) + bytes(3072))


def safetensors(tensors, metadata):
    """tensors: name -> (dtype, shape, raw bytes)."""
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + data


write("checkpoint", "state_dict.safetensors", safetensors({
    "fc.weight": ("F32", [2, 2], struct.pack("<4f", 1, -2, 0.5, 3)),
    "fc.bias": ("F16", [2], struct.pack("<2e", 1, -1)),
    "bn.num_batches_tracked": ("I64", [], struct.pack("<q", 7)),
}, {"format": "pt"}))
write("checkpoint", "training.safetensors", safetensors({
    "fc.weight": ("F32", [1, 2], struct.pack("<2f", 1, 2)),
    "__training__.optimizer.fc.weight.momentum_buffer": ("F32", [1, 2], struct.pack("<2f", 0.1, 0.2)),
    "__training__.extra.scaler": ("BF16", [1], b"\x80\x3f"),
}, {"format": "pt", "__training__.epoch": "3", "__training__.step": "120",
    "__training__.scheduler_last_epoch": "2", "__training__.sampler_epoch": "3",
    "__training__.generator.default.seed": "42", "__training__.generator.default.counter": "9"}))

# --device: first byte the local rank, second the device count, then the flag.
for i, (rank, count, name) in enumerate([(0, 0, "cpu"), (1, 2, "cuda"), (0, 4, "cuda:3"), (0, 0, "auto"),
                                         (3, 2, "auto")]):
    write("device_flag", f"seed{i}", bytes([rank, count]) + name.encode())
