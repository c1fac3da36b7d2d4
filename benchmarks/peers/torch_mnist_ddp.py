"""Peer measurement (copied from the shared ../shared/peers/ of session 7, with peak RSS and a free
port by default): the DDP tutorials' MNIST ConvNet trained with PyTorch DDP (gloo, CPU)
on Fashion-MNIST from Debian's dataset-fashion-mnist. Prints one JSON line per run.
Usage: python3 torch_mnist_ddp.py --world 2 --epochs 1 --threads 1 [--amp-bf16] [--compile]
--compile wraps the DDP model in torch.compile (PyTorch 2.x, inductor); steady_images_per_s leaves out
the first 20 steps (compilation, warm-up)."""
import argparse, gzip, json, os, resource, socket, struct, sys, time
import numpy as np
import torch, torch.nn as nn, torch.distributed as dist, torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_convnet import ConvNet  # noqa: E402

ROOT = "/usr/share/datasets/fashion-mnist"

def idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, n = struct.unpack(">II", data[:8])
    if magic == 2051:
        r, c = struct.unpack(">II", data[8:16])
        return np.frombuffer(data, np.uint8, offset=16).reshape(n, 1, r, c)
    return np.frombuffer(data, np.uint8, offset=8)

def train_gflop_per_step(batch):
    """Forward + backward FLOPs of one step of the ConvNet on `batch` images (a multiply-add is 2), as
    PyTorch's FlopCounterMode counts them; None where this PyTorch has no flop counter (1.13)."""
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return None
    model = ConvNet()
    with FlopCounterMode(display=False) as counter:
        nn.CrossEntropyLoss()(model(torch.zeros(batch, 1, 28, 28)), torch.zeros(batch, dtype=torch.int64)).backward()
    return round(counter.get_total_flops() / 1e9, 3)

def train(rank, args):
    torch.set_num_threads(args.threads)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", str(args.port))
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    torch.manual_seed(0)
    xs = torch.from_numpy(idx(f"{ROOT}/train-images-idx3-ubyte.gz").astype(np.float32) / 255.0)
    ys = torch.from_numpy(idx(f"{ROOT}/train-labels-idx1-ubyte.gz").astype(np.int64))
    xt = torch.from_numpy(idx(f"{ROOT}/t10k-images-idx3-ubyte.gz").astype(np.float32) / 255.0)
    yt = torch.from_numpy(idx(f"{ROOT}/t10k-labels-idx1-ubyte.gz").astype(np.int64))
    ds = torch.utils.data.TensorDataset(xs, ys)
    sampler = torch.utils.data.distributed.DistributedSampler(ds, num_replicas=args.world, rank=rank)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch, sampler=sampler, num_workers=0)
    model = nn.parallel.DistributedDataParallel(ConvNet())
    if args.compile: model = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    crit = nn.CrossEntropyLoss()
    steps = 0
    t0 = time.perf_counter(); t_warm = None
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for i, (x, y) in enumerate(loader):
            if args.max_steps and steps >= args.max_steps: break
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp_bf16):
                loss = crit(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step(); steps += 1
            if steps == 20: t_warm = time.perf_counter()
    dist.barrier()
    t_end = time.perf_counter(); train_s = t_end - t0
    steady = round((steps - 20) * args.batch * args.world / (t_end - t_warm), 1) if t_warm and steps > 20 else None
    model.eval(); correct = 0
    with torch.no_grad():
        shard = slice(rank, None, args.world)
        pred = model.module(xt[shard]).argmax(1)
        c = torch.tensor([(pred == yt[shard]).sum().item(), len(yt[shard])], dtype=torch.float64)
        dist.all_reduce(c)
    if rank == 0:
        print(json.dumps({"peer": f"torch {torch.__version__} DDP gloo" + (" compiled" if args.compile else ""), "world": args.world, "threads": args.threads,
                          "batch_per_rank": args.batch, "steps_per_rank": steps, "train_s": round(train_s, 3),
                          "images_per_s": round(steps * args.batch * args.world / train_s, 1), "steady_images_per_s": steady,
                          "test_acc": round(c[0].item() / c[1].item(), 4),
                          "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                          "train_gflop_per_step": train_gflop_per_step(args.batch)}), flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=1); p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=100); p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--threads", type=int, default=1); p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--port", type=int, default=0, help="rendezvous port; 0 picks a free one"); p.add_argument("--amp-bf16", action="store_true")
    p.add_argument("--compile", action="store_true")
    a = p.parse_args()
    if a.port == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0)); a.port = s.getsockname()[1]
    mp.spawn(train, nprocs=a.world, args=(a,))
