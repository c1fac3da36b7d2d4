"""One f64 training step of torchvision's CNNs, for loom's parity test (issue 52).

  python torch_parity.py fixtures DIR [MODEL...]   writes DIR/parity_MODEL.json
  python torch_parity.py check DIR MODEL...        compares DIR/loom_parity_MODEL.safetensors
                                                   (every loom tensor) with PyTorch, exit 1 on a mismatch

The step, the same in tests/models/test_parity.cpp: torchvision.models.MODEL(num_classes=10,
dropout=0.0) (efficientnet_b0 also stochastic_depth_prob=0.0; regnet_y_400mf has no dropout;
convnext_tiny only stochastic_depth_prob=0.0: nothing random remains) in f64 and in training mode
(batch norm on the batch's statistics); every parameter from `generated(name, shape)` below
(ConvNeXt's (C, 1, 1) layer scales too), batch-norm buffers at their initial values (mean 0, var 1);
input generated("input", (B, 3, S, S)) * 2 with B = 4, S = 32 (regnet_y_400mf B = 2, S = 40;
convnext_tiny B = 2, S = 32: input_shape says why), targets the first B of [3, 7, 1, 5];
loss = cross_entropy (mean);
backward; SGD(lr=0.1, momentum=0.9, weight_decay=1e-4).step(). torch.nn.Hardsigmoid (MobileNetV3) is swapped for
relu6(x + 3) / 6, the same function with an exact f64 derivative (ExactHardsigmoid says why). Batch 4, not 2:
at batch 2 the last batch norms see 2 values per channel and a 1e-15 change of the input moves some gradients by
3e-6 relative (mobilenet_v2), beyond any 1e-8 comparison; at batch 4 by 6e-10 at most.

generated(name, shape): element j of a tensor is u = splitmix64(fnv1a64(name) + j) >> 11, as
2^-53 * u in [0, 1) -> 2 u - 1 in [-1, 1); scaled by 1/sqrt(fan_in) for weights of 2 or more
dimensions (fan_in = numel / shape[0]), 1 + 0.2 u for other "...weight" tensors (batch-norm
scales), 0.1 u for biases. Integer arithmetic only, so both sides make the same bits.

A fixture holds, per model: the logits, the loss, and for every parameter's gradient, every
updated parameter and every updated batch-norm buffer: the sum, the sum of |x|, the sum of
squares and the entries at 4 fixed positions (0, n/3, 2n/3, n-1). 25 to 155 KB a model.
"""
import json, os, sys

import numpy as np
import torch
import torchvision

MODELS = ["mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0", "regnet_y_400mf",
          "convnext_tiny", "vgg11_bn", "vgg16_bn"]
MASK = (1 << 64) - 1


def fnv1a64(text):
    h = 0xCBF29CE484222325
    for byte in text.encode():
        h = ((h ^ byte) * 0x100000001B3) & MASK
    return h


def uniform(name, count):
    """2^-53 * (splitmix64(fnv1a64(name) + j) >> 11) * 2 - 1 for j < count, in f64."""
    with np.errstate(over="ignore"):
        z = np.uint64(fnv1a64(name)) + np.arange(count, dtype=np.uint64) + np.uint64(1)
        z = z * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53 * 2.0 - 1.0


def generated(name, shape):
    count = int(np.prod(shape)) if len(shape) else 1
    u = uniform(name, count)
    if len(shape) >= 2:
        values = u / np.sqrt(count // shape[0])
    elif name.endswith("weight"):
        values = 1.0 + 0.2 * u
    else:
        values = 0.1 * u
    return torch.from_numpy(values.reshape(shape))


class ExactHardsigmoid(torch.nn.Module):
    """relu6(x + 3) / 6: torch.nn.Hardsigmoid's function. PyTorch's CPU backward of hardsigmoid multiplies by
    1.0f / 6.0f, a float, also in f64 (0.1666666716337204: 2.98e-8 relative off), which would make every
    gradient behind a MobileNetV3 squeeze-excitation block differ from the exact one by about 3e-8; autograd
    through relu6 and the division gives the exact derivative (loom's)."""

    def forward(self, x):
        return torch.nn.functional.relu6(x + 3.0) / 6.0


def exact_hardsigmoid(model):
    for parent in model.modules():
        for key, child in parent.named_children():
            if isinstance(child, torch.nn.Hardsigmoid):
                setattr(parent, key, ExactHardsigmoid())


def build(name):
    kwargs = {"num_classes": 10, "dropout": 0.0}
    if name == "efficientnet_b0":
        kwargs["stochastic_depth_prob"] = 0.0
    if name == "regnet_y_400mf":
        del kwargs["dropout"]
    if name == "convnext_tiny":
        kwargs = {"num_classes": 10, "stochastic_depth_prob": 0.0}
    model = getattr(torchvision.models, name)(**kwargs).double()
    exact_hardsigmoid(model)  # MobileNetV3's squeeze-excitation scale (no parameters: the state_dict is unchanged)
    with torch.no_grad():
        for key, parameter in model.named_parameters():
            parameter.copy_(generated(key, tuple(parameter.shape)))
    model.train()
    return model


def input_shape(name):
    """(batch, 3, size, size): 4 images at 32x32, where the last batch norms (1x1) see 4 values per channel;
    regnet_y_400mf 2 at 40x40 (2x2 at its last stage: 8 values; at 4 x 32x32 a 1e-15 change of the input moves its
    gradients by 1e-9 relative, at 2 x 40x40 by 1e-12); convnext_tiny, which has no batch norm, 2 at 32x32."""
    if name == "regnet_y_400mf":
        return (2, 3, 40, 40)
    return (2 if name == "convnext_tiny" else 4, 3, 32, 32)


def step(name):
    model = build(name)
    shape = input_shape(name)
    x = generated("input", shape) * 2.0  # the "...weight" rule does not apply: 4-d
    targets = torch.tensor([3, 7, 1, 5][:shape[0]])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits, targets)
    loss.backward()
    grads = {key: p.grad.detach().clone() for key, p in model.named_parameters()}
    optimizer.step()
    return model, logits.detach(), loss.detach(), grads


def summary(t):
    flat = t.detach().reshape(-1).double()
    n = flat.numel()
    positions = sorted({0, n // 3, 2 * n // 3, n - 1})
    return {"sum": flat.sum().item(), "abs_sum": flat.abs().sum().item(), "sum_squares": (flat * flat).sum().item(),
            "positions": positions, "values": [flat[i].item() for i in positions]}


def fixture(name):
    model, logits, loss, grads = step(name)
    state = model.state_dict()
    return {"model": name, "torch": torch.__version__, "torchvision": torchvision.__version__,
            "logits": logits.reshape(-1).tolist(), "loss": loss.item(),
            "gradients": {k: summary(v) for k, v in grads.items()},
            "updated": {k: summary(v) for k, v in state.items() if v.dtype == torch.float64}}


def check(directory, names):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_interop import read_safetensors
    worst_all = 0.0
    for name in names:
        model, logits, loss, grads = step(name)
        loom, _ = read_safetensors(os.path.join(directory, f"loom_parity_{name}.safetensors"))
        expected = {"logits": logits, "loss": loss.reshape(1)}
        expected.update({"grad." + k: v for k, v in grads.items()})
        expected.update({"updated." + k: v for k, v in model.state_dict().items() if v.dtype == torch.float64})
        missing = sorted(set(expected) - set(loom))
        assert not missing, f"{name}: loom's file lacks {missing[:5]}"
        errors = []
        floors = {kind: 1e-6 * max(v.abs().max().item() for k, v in expected.items() if k.startswith(kind))
                  for kind in ("grad.", "updated.")}
        for key, reference in expected.items():
            # Relative to the tensor's largest entry, but at least a millionth of the largest of its kind: a
            # gradient that is zero in exact arithmetic (a batch-norm bias feeding a batch norm) is rounding noise.
            # One under a thousandth of that floor (zero in exact arithmetic) must be under it in loom too.
            floor = next((f for kind, f in floors.items() if key.startswith(kind)), 0.0)
            if reference.abs().max().item() < 1e-3 * floor:
                below = loom[key].double().abs().max().item() < 1e-3 * floor
                errors.append((0.0 if below else float("inf"), key))
                continue
            scale = max(reference.abs().max().item(), floor, 1e-300)
            errors.append(((loom[key].double().reshape(reference.shape) - reference).abs().max().item() / scale, key))
        errors.sort(reverse=True)
        worst = errors[0][0]
        worst_of = lambda kind: next(f"{e:.3g} ({k})" for e, k in errors if k.startswith(kind))
        print(f"{name}: {len(expected)} tensors, largest relative differences: logits {worst_of('logits')}, loss "
              f"{worst_of('loss')}, gradients {worst_of('grad.')}, updated {worst_of('updated.')}")
        worst_all = max(worst_all, worst)
    return worst_all <= 1e-8


def main(argv):
    torch.set_num_threads(2)
    mode, directory, names = argv[1], argv[2], argv[3:] or MODELS
    if mode == "fixtures":
        for name in names:
            path = os.path.join(directory, f"parity_{name}.json")
            with open(path, "w") as f:
                json.dump(fixture(name), f, indent=0)
            print(f"wrote {path} ({os.path.getsize(path)} bytes)")
        return 0
    if mode == "check":
        return 0 if check(directory, names) else 1
    raise SystemExit(f"unknown mode {mode!r}: fixtures or check")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
