"""PyTorch peer of scaling_step: DDP (Gloo, CPU) training steps of the same
models measured the same way (batches built up front, median step time of the
slowest rank after warm-up), one JSON line from rank 0. The ConvNet and the
Fashion-MNIST reader come from ../shared/peers/torch_mnist_ddp.py.
  /usr/bin/python3 torch_scaling_peer.py --model resnet18 --world 2 --batch 32 --steps 20
"""
import argparse
import importlib.util
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = os.environ.get("LOOM_PEERS", os.path.join(HERE, "..", "..", "..", "shared", "peers"))


def shared_peer():
    spec = importlib.util.spec_from_file_location("torch_mnist_ddp", os.path.join(PEERS, "torch_mnist_ddp.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_model(name):
    if name == "convnet":
        return shared_peer().ConvNet()
    import torchvision
    return getattr(torchvision.models, name)(num_classes=10)


def make_batches(args, rank):
    if args.model == "convnet":
        peer = shared_peer()
        xs = torch.from_numpy(peer.idx(f"{peer.ROOT}/train-images-idx3-ubyte.gz").astype("float32") / 255.0)
        ys = torch.from_numpy(peer.idx(f"{peer.ROOT}/train-labels-idx1-ubyte.gz").astype("int64"))
        sampler = torch.utils.data.distributed.DistributedSampler(range(len(ys)), num_replicas=args.world, rank=rank)
        order = list(sampler)
        count = min(len(order) // args.batch, args.warmup + args.steps, 64)
        return [(xs[order[b * args.batch:(b + 1) * args.batch]], ys[order[b * args.batch:(b + 1) * args.batch]])
                for b in range(count)]
    g = torch.Generator().manual_seed(1000 + rank)
    size = args.image_size
    return [(torch.randn(args.batch, 3, size, size, generator=g), torch.randint(0, 10, (args.batch,), generator=g))]


def train(rank, args):
    torch.set_num_threads(args.threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    torch.manual_seed(0)
    batches = make_batches(args, rank)
    model = nn.parallel.DistributedDataParallel(make_model(args.model), bucket_cap_mb=args.bucket_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    times, losses = [], []
    for step in range(args.warmup + args.steps):
        x, y = batches[step % len(batches)]
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        elapsed = time.perf_counter() - start
        losses.append(loss.item())
        if step >= args.warmup:
            times.append(elapsed * 1e3)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # the group runs at its slowest rank's pace
    if not all(map(lambda v: v == v and abs(v) != float("inf"), losses)):
        raise RuntimeError(f"rank {rank}: a loss is not finite")
    if rank == 0:
        step_ms = statistics.median(slowest.tolist())
        print(json.dumps({"peer": f"torch {torch.__version__} DDP gloo", "model": args.model, "world": args.world,
                          "threads": args.threads, "batch_per_rank": args.batch, "steps": args.steps,
                          "step_ms": round(step_ms, 3),
                          "images_per_s": round(args.batch * args.world / step_ms * 1e3, 2),
                          "loss_first": losses[0], "loss_last": losses[-1]}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="convnet")
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--batch", type=int, default=100, help="per rank")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--bucket-mb", type=float, default=25)
    p.add_argument("--port", type=int, default=29623)
    args = p.parse_args()
    mp.spawn(train, nprocs=args.world, args=(args,))
