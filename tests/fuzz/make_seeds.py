#!/usr/bin/python3
"""Writes the fuzzers' seed corpus (corpus/<harness>/): small valid inputs of
each format, which libFuzzer mutates. Run from anywhere; needs numpy and PIL
(python3-numpy, python3-pil) for the pickle and image seeds."""
import gzip
import io
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

# Pickles as torchvision's CIFAR-10 python batches hold them (dicts of numpy
# arrays and lists), at the protocols Python writes them.
import pickle  # noqa: E402
import numpy  # noqa: E402

batch = {b"batch_label": b"training batch 1 of 5", b"labels": [3, 9],
         b"data": numpy.arange(2 * 12, dtype=numpy.uint8).reshape(2, 12), b"filenames": [b"a.png", b"b.png"]}
for protocol in (2, 4, 5):
    write("pickle", f"batch_p{protocol}.pkl", pickle.dumps(batch, protocol=protocol))
write("pickle", "meta.pkl", pickle.dumps({"label_names": ["airplane", "cat"], "num_vis": 3072, "x": None,
                                          "t": (True, -1, 2 ** 40), "f": numpy.array([1.5], dtype="<f4")}, protocol=2))

# Images: the first byte chooses RGB (0) or grayscale (1), then the file.
from PIL import Image  # noqa: E402


def image_bytes(mode, fmt, **options):
    image = Image.new(mode, (5, 3))
    image.putdata([tuple((x * 40 + y * 7 + c * 50) % 256 for c in range(len(mode))) if len(mode) > 1
                   else (x * 40 + y * 7) % 256 for y in range(3) for x in range(5)])
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


write("image", "rgb.png", b"\0" + image_bytes("RGB", "PNG"))
write("image", "rgba_gray_mode.png", b"\1" + image_bytes("RGBA", "PNG"))
write("image", "gray.png", b"\1" + image_bytes("L", "PNG"))
palette = io.BytesIO()
Image.new("RGB", (4, 4), (200, 10, 10)).convert("P").save(palette, "PNG")
write("image", "palette.png", b"\0" + palette.getvalue())
write("image", "rgb.jpg", b"\0" + image_bytes("RGB", "JPEG", quality=90))
write("image", "gray.jpg", b"\1" + image_bytes("L", "JPEG"))
write("image", "progressive.jpg", b"\0" + image_bytes("RGB", "JPEG", progressive=True, subsampling=2))


# TCPStore: what a client sends (PyTorch's c10d protocol, little-endian):
# the validation handshake, then queries.
def tcp_bytes(value):
    value = value.encode() if isinstance(value, str) else value
    return struct.pack("<Q", len(value)) + value


def tcp_keys(keys):
    return struct.pack("<Q", len(keys)) + b"".join(tcp_bytes(k) for k in keys)


hello = bytes([0]) + struct.pack("<I", 0x3C85F7CE)
write("tcp_store", "set_get", hello + bytes([1]) + tcp_bytes("/a") + tcp_bytes("1") + bytes([3]) + tcp_bytes("/a"))
write("tcp_store", "add_check_wait", hello + bytes([4]) + tcp_bytes("/n") + struct.pack("<q", 5) + bytes([4]) +
      tcp_bytes("/n") + struct.pack("<q", -2) + bytes([5]) + tcp_keys(["/n", "/m"]) + bytes([6]) + tcp_keys(["/n"]))
write("tcp_store", "wait_missing_cancel", hello + bytes([6]) + tcp_keys(["/later"]) + bytes([12]) +
      bytes([1]) + tcp_bytes("/later") + tcp_bytes("x"))
write("tcp_store", "multi", hello + bytes([11]) + struct.pack("<Q", 2) + tcp_bytes("/k1") + tcp_bytes("v1") +
      tcp_bytes("/k2") + tcp_bytes("") + bytes([10]) + tcp_keys(["/k1", "/k2", "/k3"]) + bytes([7]))
write("tcp_store", "compare_append_delete", hello + bytes([2]) + tcp_bytes("/c") + tcp_bytes("") + tcp_bytes("d") +
      bytes([2]) + tcp_bytes("/c") + tcp_bytes("d") + tcp_bytes("e") + bytes([9]) + tcp_bytes("/c") +
      tcp_bytes("f") + bytes([8]) + tcp_bytes("/c") + bytes([13]) + struct.pack("<I", 77) + hello[0:5])
write("tcp_store", "no_handshake", bytes([3]) + tcp_bytes("/a"))

# Launch environments: NAME=VALUE lines; a first line "#" + bytes gives overrides.
write("launch_env", "torchrun", b"RANK=1\nWORLD_SIZE=4\nLOCAL_RANK=1\nLOCAL_WORLD_SIZE=2\nGROUP_RANK=0\n"
      b"MASTER_ADDR=node0\nMASTER_PORT=29400\nTORCHELASTIC_RESTART_COUNT=0\nLOOM_COLLECTIVE_TIMEOUT=2.5\n")
write("launch_env", "slurm", b"SLURM_PROCID=3\nSLURM_NTASKS=4\nSLURM_LOCALID=1\nSLURM_NTASKS_PER_NODE=2\n"
      b"SLURM_NODEID=1\nSLURM_STEP_ID=0\nSLURM_JOB_NODELIST=node[01-02]\nSLURM_STEP_NODELIST=node[01-02,7]\n"
      b"SLURM_TASKS_PER_NODE=2(x2)\nMASTER_PORT=1234\n")
write("launch_env", "open_mpi", b"OMPI_COMM_WORLD_RANK=2\nOMPI_COMM_WORLD_SIZE=3\nOMPI_COMM_WORLD_LOCAL_RANK=2\n"
      b"OMPI_COMM_WORLD_LOCAL_SIZE=3\nOMPI_COMM_WORLD_NODE_RANK=0\nOMPI_MCA_ess_base_jobid=1234567\n"
      b"PMIX_NAMESPACE=prterun-host-1@1\n")
write("launch_env", "overrides", b"#\x01\x02\x00\nMASTER_ADDR=127.0.0.1\n")

# The apps' flags: arguments separated by NUL bytes.
for i, args in enumerate([["--epochs", "3", "--lr=0.05", "-b", "32", "--device", "cpu"],
                          ["--epochs", "1", "--epochs", "2", "--checkpoint-dir", "", "--resume", "auto"],
                          ["--checkpoint-every", "100", "--keep-checkpoints", "0", "--checkpoint-signal", "SIGUSR2",
                           "--on-checkpoint-error", "continue", "-c", "ckpt.safetensors"],
                          ["-v", "--data", "/tmp/x", "--device=cuda:1", "--lr", "1e-3"],
                          ["--help"], ["--epochs", "-1"], ["--unknown", "x"]]):
    write("app_flags", f"seed{i}", "\0".join(args).encode())
