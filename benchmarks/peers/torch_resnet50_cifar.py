"""Peer measurement (copied from the shared ../shared/peers/ of session 7, with peak RSS added):
torchvision ResNet-50 (or --arch: any torchvision model; num_classes=10) training steps on CIFAR-shaped
random data (3x32x32, or --size), SGD momentum; CPU, or CUDA with --device cuda (TF32 off; --amp f16 / bf16:
autocast, f16 with a GradScaler; timed between device synchronisations). Prints one JSON line.
Usage: python3 torch_resnet50_cifar.py --batch 32 --steps 10 --threads 2
  [--arch resnet18] [--stem cifar] [--channels-last] [--compile] [--lr LR] [--device cuda] [--amp f16]
--stem cifar replaces the 7x7/2 conv + maxpool with a 3x3/1 conv and no maxpool (the usual
CIFAR ResNet); --compile uses torch.compile (PyTorch 2.x, inductor), timed after its warm-up."""
import argparse, json, resource, time, torch, torchvision
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=32); p.add_argument("--steps", type=int, default=10)
p.add_argument("--threads", type=int, default=2); p.add_argument("--arch", default="resnet50", help="any torchvision.models constructor")
p.add_argument("--size", type=int, default=32, help="image height and width")
p.add_argument("--stem", choices=["imagenet", "cifar"], default="imagenet")
p.add_argument("--channels-last", action="store_true"); p.add_argument("--compile", action="store_true")
p.add_argument("--device", default="cpu", help="cpu or cuda (TF32 off unless --amp)")
p.add_argument("--amp", choices=["none", "f16", "bf16"], default="none", help="CUDA autocast (f16 with a GradScaler)")
p.add_argument("--lr", type=float, default=None, help="SGD learning rate (default: 0.01, 0.001 with --stem cifar, as loom's)")
a = p.parse_args()
torch.set_num_threads(a.threads); torch.manual_seed(0)
dev = torch.device(a.device)
torch.backends.cudnn.allow_tf32 = False; torch.backends.cuda.matmul.allow_tf32 = False
m = getattr(torchvision.models, a.arch)(num_classes=10)
if a.stem == "cifar":
    m.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False); m.maxpool = torch.nn.Identity()
fmt = torch.channels_last if a.channels_last else torch.contiguous_format
m = m.to(dev, memory_format=fmt)
opt = torch.optim.SGD(m.parameters(), lr=a.lr or (0.001 if a.stem == "cifar" else 0.01), momentum=0.9)
x = torch.randn(a.batch, 3, a.size, a.size).to(dev, memory_format=fmt); y = torch.randint(0, 10, (a.batch,)).to(dev)
crit = torch.nn.CrossEntropyLoss()
step_model = torch.compile(m) if a.compile else m
amp_dtype = {"f16": torch.float16, "bf16": torch.bfloat16}.get(a.amp)
scaler = torch.amp.GradScaler("cuda") if a.amp == "f16" else None
def step():
    opt.zero_grad()
    with torch.autocast(dev.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        loss = crit(step_model(x), y)
    if scaler:
        scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
    else:
        loss.backward(); opt.step()
def sync():
    if dev.type == "cuda": torch.cuda.synchronize()
for _ in range(3 if a.compile else 2):
    step()
sync(); t0 = time.perf_counter()
for _ in range(a.steps):
    step()
sync(); dt = time.perf_counter() - t0
def train_gflop_per_step():
    """Forward + backward FLOPs of one step of the eager model (a multiply-add is 2), as PyTorch's
    FlopCounterMode counts them; None where this PyTorch has no flop counter (1.13)."""
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return None
    with FlopCounterMode(display=False) as counter:
        crit(m(x), y).backward()
    opt.zero_grad()
    return round(counter.get_total_flops() / 1e9, 3)
print(json.dumps({"peer": f"torch {torch.__version__}" + (" compiled" if a.compile else ""), "arch": a.arch,
                  "stem": a.stem, "size": a.size, "device": a.device, "amp": a.amp, "channels_last": a.channels_last, "batch": a.batch, "threads": a.threads,
                  "step_ms": round(1000 * dt / a.steps, 1), "images_per_s": round(a.batch * a.steps / dt, 1),
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                  "train_gflop_per_step": train_gflop_per_step()}))
