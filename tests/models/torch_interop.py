"""Checks loom's checkpoints of torchvision's models against torchvision, both
ways; run by tests/models/test_interop.cpp as  PYTHON torch_interop.py DIR [MODEL...]
(default resnet50; MODEL is a torchvision.models constructor name).

loom -> torch: DIR/loom_MODEL.checkpoint (loom's state_dict plus its
  "__training__." keys) loads with load_state_dict(strict=True) into
  torchvision.models.MODEL(num_classes=10); in eval mode on DIR/loom_MODEL_io's
  "input" it must give loom's "logits" within 1e-4 (relative to the largest
  logit when that is over 1).
torch -> loom: writes DIR/torch_MODEL.safetensors (a freshly initialised
  torchvision model whose batch-norm statistics were moved by a few training
  forwards, ConvNeXt's layer scales drawn from [0.5, 1) instead of 1e-6) and DIR/torch_MODEL_io.safetensors ("input", "logits" in eval mode)
  for the C++ side to load and compare.

Files are read with the `safetensors` package when it is installed, and
otherwise parsed here from the format's definition with json + struct + numpy
(an 8-byte little-endian header length, a JSON header, raw little-endian data).
Exit 0 on success; any mismatch raises.
"""
import json, os, struct, sys

import numpy as np
import torch
import torchvision

DTYPES = {"F32": (np.float32, torch.float32), "F64": (np.float64, torch.float64), "F16": (np.float16, torch.float16),
          "I64": (np.int64, torch.int64), "I32": (np.int32, torch.int32), "U8": (np.uint8, torch.uint8)}
TRAINING_PREFIX = "__training__."


def read_safetensors(path):
    try:
        from safetensors.torch import load_file  # the reference implementation, when installed
        return load_file(path), "safetensors " + __import__("safetensors").__version__
    except ImportError:
        pass
    with open(path, "rb") as f:
        blob = f.read()
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + length])
    data = blob[8 + length:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        if entry["dtype"] == "BF16":  # numpy has no bfloat16: widen the bits to f32
            bits = np.frombuffer(data[begin:end], dtype="<u2").astype(np.uint32) << 16
            out[name] = torch.from_numpy(bits.view(np.float32).reshape(entry["shape"]).copy()).to(torch.bfloat16)
            continue
        np_dtype, _ = DTYPES[entry["dtype"]]
        array = np.frombuffer(data[begin:end], dtype=np.dtype(np_dtype).newbyteorder("<"))
        out[name] = torch.from_numpy(array.reshape(entry["shape"]).copy())
    return out, "json + struct + numpy"


def write_safetensors(path, tensors):
    header, chunks, offset = {}, [], 0
    names = {v: k for k, (_, v) in DTYPES.items()}
    for name, t in tensors.items():
        raw = t.detach().contiguous().numpy().tobytes()  # native order: little-endian (asserted in main)
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def main(directory, name="resnet50"):
    """loom -> torch and torch -> loom for torchvision.models.NAME(num_classes=10)."""
    assert sys.byteorder == "little"
    torch.set_num_threads(2)
    build = getattr(torchvision.models, name)
    state, reader = read_safetensors(os.path.join(directory, f"loom_{name}.checkpoint"))
    training_keys = [k for k in state if k.startswith(TRAINING_PREFIX)]
    assert training_keys, "expected loom's training state beside the model"
    model_state = {k: v for k, v in state.items() if not k.startswith(TRAINING_PREFIX)}
    model = build(num_classes=10)
    model.load_state_dict(model_state, strict=True)
    tracked = [v for k, v in model.state_dict().items() if k.endswith("num_batches_tracked")]
    has_batch_norm = any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())  # not ConvNeXt
    assert bool(tracked) == has_batch_norm and all(t.dtype == torch.int64 for t in tracked)
    model.eval()
    io, _ = read_safetensors(os.path.join(directory, f"loom_{name}_io.safetensors"))
    with torch.no_grad():
        logits = model(io["input"])
    difference = (logits - io["logits"]).abs().max().item()
    tolerance = 1e-4 * max(1.0, io["logits"].abs().max().item())
    print(f"{name}: loom -> torch: {len(model_state)} tensors read with {reader} (+{len(training_keys)} training keys "
          f"ignored), max |logits difference| = {difference:.3g} (tolerance {tolerance:.3g})")
    assert difference <= tolerance, f"{name}: logits differ by {difference}"

    torch.manual_seed(1)
    reference = build(num_classes=10)
    with torch.no_grad():
        for key, parameter in reference.named_parameters():
            if key.endswith("layer_scale"):  # ConvNeXt's: at 1e-6 the blocks would hardly reach the logits
                parameter.uniform_(0.5, 1.0)
    reference.train()
    with torch.no_grad():
        for _ in range(2):
            reference(torch.randn(4, 3, 32, 32))
    reference.eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = reference(x)
    write_safetensors(os.path.join(directory, f"torch_{name}.safetensors"), reference.state_dict())
    write_safetensors(os.path.join(directory, f"torch_{name}_io.safetensors"), {"input": x, "logits": expected})
    print(f"{name}: torch -> loom: wrote torch_{name}.safetensors and torch_{name}_io.safetensors")


if __name__ == "__main__":
    for model_name in sys.argv[2:] or ["resnet50"]:
        main(sys.argv[1], model_name)
