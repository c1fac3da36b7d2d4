#!/usr/bin/env python3
"""Writes h200_resnet50_assumed.json: an ASSUMED (not measured) per-GPU
profile of ResNet-50 training on one H200, the input of the GPU projection.

How the numbers are derived (every constant is stated here and in the file):
- Work: the multiply-accumulates of every conv and the fc layer of
  torchvision's ResNet-50 at 224x224 (computed below: 4.09 GMAC per image),
  2 FLOP each, forward; backward = 2x forward (input and weight gradients),
  except conv1, whose input needs no gradient (1x).
- Speed: a stated fraction of the H200's dense BF16 tensor-core peak (989
  TFLOPS). 12% (~119 TFLOPS, ~4,800 images/s) is in the range public
  mixed-precision ResNet-50 training reaches on H100-class GPUs; ResNet-50 is
  limited by memory-bound batch-norm and activations, not by the tensor cores.
- Timeline: backward visits layers in reverse; a parameter's gradient is
  ready when its layer's backward has run. Batch-norm, ReLU and pooling time is
  folded into the convolutions in proportion to their FLOPs. Batch-norm
  parameters are ready just before the convolution that precedes them.
- Gradients are f32 (AMP keeps master weights and gradients in f32), so each
  bucket's bytes are 4 x parameters.
- Optimizer: a fused SGD-momentum pass over 25.6 M parameters (~0.5 GB of
  traffic at ~4.8 TB/s): 0.3 ms, rounded up.
Replace the file with a measured profile (scaling_step --compare-bare on one
GPU writes every figure it needs) when a GPU is available.
"""
import json
import os

PEAK_TFLOPS = 989.0       # H200 SXM dense BF16
FRACTION_OF_PEAK = 0.12
BATCH = 256
OPTIMIZER_MS = 0.3


def resnet50_layers(size=224):
    """(parameter names, MACs per image) of every parametrised layer, in
    registration order; batch-norm entries have 0 MACs."""
    layers = []
    def conv(name, cin, cout, k, hout):
        layers.append(([f"{name}.weight"], k * k * cin * cout * hout * hout))
    def bn(name):
        layers.append(([f"{name}.weight", f"{name}.bias"], 0))
    h = size // 2
    conv("conv1", 3, 64, 7, h)
    bn("bn1")
    h //= 2  # maxpool
    cin = 64
    for li, (planes, blocks, stride) in enumerate([(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)], start=1):
        for b in range(blocks):
            s = stride if b == 0 else 1
            hout = h // s
            p = f"layer{li}.{b}"
            conv(f"{p}.conv1", cin, planes, 1, h)
            bn(f"{p}.bn1")
            conv(f"{p}.conv2", planes, planes, 3, hout)
            bn(f"{p}.bn2")
            conv(f"{p}.conv3", planes, planes * 4, 1, hout)
            bn(f"{p}.bn3")
            if b == 0:
                conv(f"{p}.downsample.0", cin, planes * 4, 1, hout)
                bn(f"{p}.downsample.1")
            cin, h = planes * 4, hout
    layers.append((["fc.weight", "fc.bias"], 2048 * 1000))
    return layers


def parameter_sizes():
    """Elements of each parameter, by the same walk."""
    sizes = {}
    def conv(name, cin, cout, k):
        sizes[f"{name}.weight"] = k * k * cin * cout
    def bn(name, c):
        sizes[f"{name}.weight"] = sizes[f"{name}.bias"] = c
    conv("conv1", 3, 64, 7)
    bn("bn1", 64)
    cin = 64
    for li, (planes, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)], start=1):
        for b in range(blocks):
            p = f"layer{li}.{b}"
            conv(f"{p}.conv1", cin, planes, 1)
            bn(f"{p}.bn1", planes)
            conv(f"{p}.conv2", planes, planes, 3)
            bn(f"{p}.bn2", planes)
            conv(f"{p}.conv3", planes, planes * 4, 1)
            bn(f"{p}.bn3", planes * 4)
            if b == 0:
                conv(f"{p}.downsample.0", cin, planes * 4, 1)
                bn(f"{p}.downsample.1", planes * 4)
            cin = planes * 4
    sizes["fc.weight"], sizes["fc.bias"] = 2048 * 1000, 1000
    return sizes


def main():
    layers = resnet50_layers()
    sizes = parameter_sizes()
    macs = sum(m for _, m in layers)
    forward_flop = 2 * macs * BATCH
    backward_weights = [2 * m * (1 if names == ["conv1.weight"] else 2) * BATCH for names, m in layers]
    backward_flop = sum(backward_weights)
    flops = PEAK_TFLOPS * 1e12 * FRACTION_OF_PEAK
    forward_ms = forward_flop / flops * 1e3
    backward_ms = backward_flop / flops * 1e3
    # Reverse walk: time at which each layer's backward has finished.
    ready = {}
    elapsed = 0.0
    for (names, _), work in zip(reversed(layers), reversed(backward_weights)):
        elapsed += work / flops * 1e3
        for n in names:
            ready[n] = elapsed
    # Batch-norm buffers DDP broadcasts before forward: running mean and
    # variance (f32) per channel, num_batches_tracked (i64) per layer.
    norms = [names[0] for names, m in layers if m == 0]
    buffer_bytes = sum(8 * sizes[n] + 8 for n in norms)
    params = [{"name": n, "bytes": 4 * sizes[n], "ready_ms": round(ready[n], 4)} for names, _ in layers for n in names]
    assert len(params) == len(sizes) == 161, len(params)
    out = {
        "model": "resnet50", "device": "NVIDIA H200 SXM (one GPU)",
        "source": "ASSUMPTION, not a measurement: FLOP count x stated fraction of peak",
        "assumption": (f"torchvision ResNet-50, 224x224, batch {BATCH} per GPU, BF16 autocast with f32 gradients; "
                       f"{macs / 1e9:.2f} GMAC/image forward, backward 2x forward (conv1 1x); "
                       f"{FRACTION_OF_PEAK:.0%} of {PEAK_TFLOPS:.0f} TFLOPS dense BF16 peak "
                       f"= {flops / 1e12:.0f} TFLOPS sustained ({BATCH / (forward_ms + backward_ms) * 1e3:.0f} images/s); "
                       "batch-norm/ReLU time folded into the convolutions; "
                       f"optimizer {OPTIMIZER_MS} ms. Generated by make_h200_resnet50_assumption.py."),
        "batch_per_device": BATCH, "forward_ms": round(forward_ms, 3), "backward_ms": round(backward_ms, 3),
        "optimizer_ms": OPTIMIZER_MS, "buffer_bytes": buffer_bytes,
        "gradient_bytes": 4 * sum(sizes.values()), "parameters": params,
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "h200_resnet50_assumed.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"{path}: {sum(sizes.values()) / 1e6:.2f} M parameters, {macs / 1e9:.2f} GMAC/image, "
          f"forward {forward_ms:.1f} ms, backward {backward_ms:.1f} ms at batch {BATCH}")


if __name__ == "__main__":
    main()
