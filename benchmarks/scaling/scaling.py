#!/usr/bin/env python3
"""Data-parallel scaling benchmark driver. Runs scaling_step at world sizes
1, 2, 4, ... (CPU processes over shared memory or Gloo, one thread each, or GPUs with NCCL) in
weak scaling (fixed batch per rank) and strong scaling (fixed global batch);
measures DDP against the bare model at world 1, a bucket-size sweep at the
largest world, all-reduce times for the alpha-beta fit, PyTorch DDP in the
same run; predicts every measured point from the world-1 profile with the
fitted cost model, projects ResNet-50 on H200 clusters to 512 GPUs, and writes
JSON, CSV and (with gnuplot) a PNG. benchmarks/scaling/run.sh wraps it.
  python3 benchmarks/scaling/scaling.py --quick --build build --out /tmp/scaling
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import cost_model as cm  # noqa: E402
import timeline as tl  # noqa: E402

DATASET_IMAGES = {"convnet": 60000}  # Fashion-MNIST train; the ResNets: CIFAR-10 train
DEFAULT_DATASET_IMAGES = 50000
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
DEFAULT_ASSUMPTION = os.path.join(HERE, "profiles", "h200_resnet50_assumed.json")
TORCH = "/usr/bin/python3"


# --- running processes ---------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_average() -> list[float]:
    try:
        return [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except OSError:
        return []


def launch(command: list[str], world: int, threads: int, timeout_s: float, copies: int = 1) -> list[str]:
    """Starts `world` ranks of `command` with torchrun's variables (RANK,
    WORLD_SIZE, LOCAL_RANK, ..., MASTER_ADDR/PORT), or with copies > 1 that
    many independent world-1 processes side by side (each with its own port;
    "{copy}" in the command is replaced by the copy's number). Returns each
    process's stdout; when one fails the others are ended and the error names it."""
    procs = []
    group_port = free_port()
    for k in range(max(world, copies)):
        rank, size = (0, 1) if copies > 1 else (k, world)
        port = free_port() if copies > 1 else group_port
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(size), GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS=str(threads))
        argv = [a.replace("{copy}", str(k)) for a in command]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + timeout_s
    failed = None
    while any(p.poll() is None for p in procs):
        failed = next((r for r, p in enumerate(procs) if p.poll() not in (None, 0)), None)
        if failed is not None or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if failed is None:
        failed = next((r for r, p in enumerate(procs) if p.poll() not in (None, 0)), None)
    timed_out = failed is None and any(p.poll() is None for p in procs)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    outputs = [p.communicate() for p in procs]
    if failed is not None or timed_out:
        who = (f"process {failed} exited with {procs[failed].returncode}" if failed is not None
               else f"timed out after {timeout_s:.0f} s")
        errors = "\n".join(f"[{r}] {err.strip()}" for r, (_, err) in enumerate(outputs) if err.strip())
        raise RuntimeError(f"{' '.join(command)} at world {world} x{copies}: {who}\n{errors}")
    return [out for out, _ in outputs]


class Runner:
    def __init__(self, args):
        self.args = args
        self.build = args.build
        self.tmp = os.path.join(args.work, "ranks")
        os.makedirs(self.tmp, exist_ok=True)
        self.count = 0

    def step(self, c: "Config") -> dict:
        """One scaling_step run; returns {"copies": n, "docs": every process's JSON}."""
        a = self.args
        self.count += 1
        path = os.path.join(self.tmp, f"run{self.count}_rank{{rank}}_copy{{copy}}.json")
        cmd = [os.path.join(self.args.bin, "scaling_step"), "--model", c.model,
               "--batch-size", str(c.batch), "--steps", str(a.steps[c.model]), "--warmup", str(a.warmup[c.model]),
               "--threads", str(a.threads), "--bucket-mb", str(c.cap), "--device", a.device,
               "--image-size", str(a.image_size), "--backend", a.backend, "--output", path,
               "--block", str(a.block or max(2, a.steps[c.model] // 6))]
        if a.data:
            cmd += ["--data", a.data]
        if c.compare_bare:
            cmd.append("--compare-bare")
        t = time.monotonic()
        launch(cmd, c.world, a.threads, a.timeout, c.copies)
        n = max(c.world, c.copies)
        docs = [read_json(path.replace("{rank}", str(0 if c.copies > 1 else k)).replace("{copy}", str(k)))
                for k in range(n)]
        run = {"copies": c.copies, "docs": docs}
        log(f"  {c.describe()}: {statistics.median(s['step_ms'] for s in pooled([run])):.1f} ms/step "
            f"({time.monotonic() - t:.0f} s, load {load_average()[:1]})")
        return run

    def allreduce(self, world: int) -> dict:
        a = self.args
        cmd = [os.path.join(self.args.bin, "allreduce_timing"), "--sizes",
               ",".join(str(s) for s in a.allreduce_sizes), "--iterations", str(a.allreduce_iterations),
               "--device", a.device, "--backend", a.backend]
        out = launch(cmd, world, 1, a.timeout)
        return json.loads(out[0].strip().splitlines()[-1])


def allreduce_fit(allreduce: list[dict], top: int) -> tuple[cm.Link | None, dict]:
    """The alpha-beta fit of this machine's all-reduce (the median over repeats
    per size) and its report entry. On a loaded machine the medians can shrink
    with size (a small message delayed by the scheduler) and no line fits: then
    no link (so no predictions from it), and the entry says why."""
    sizes = [r["bytes"] for r in allreduce[0]["sizes"]]
    medians = [statistics.median(a["sizes"][i]["median_ms"] for a in allreduce) for i in range(len(sizes))]
    entry = {"world": top, "backend": allreduce[0]["backend"],
             "sizes": [{"bytes": b, "median_ms": t} for b, t in zip(sizes, medians)]}
    try:
        link, fit = cm.fit_alpha_beta([(b, t * 1e-3) for b, t in zip(sizes, medians)], top)
    except ValueError as e:
        log(f"scaling: no all-reduce fit, so no predictions from it: {e}")
        entry["fit_error"] = str(e)
        return None, entry
    for size in entry["sizes"]:
        size["fitted_ms"] = (fit["intercept_s"] + fit["slope_s_per_byte"] * size["bytes"]) * 1e3
    entry.update({"alpha_us": link.alpha_s * 1e6, "bus_bandwidth_gbs": link.bandwidth / 1e9,
                  "fit_max_abs_relative_error": fit["max_abs_relative_error"]})
    return link, entry


def read_json(path: str):
    with open(path) as f:
        return json.load(f)


def log(message: str):
    print(message, file=sys.stderr, flush=True)


# --- measurements -> figures ---------------------------------------------------------------------

@dataclass(frozen=True)
class Config:
    """One measured configuration. copies > 1 (world 1 only): that many
    independent world-1 processes side by side, the compute of one rank under
    the core occupancy of a world of `copies` without any communication."""
    model: str
    world: int
    batch: int
    cap: float = 25
    compare_bare: bool = False
    copies: int = 1

    def describe(self) -> str:
        side = f" x{self.copies} side by side" if self.copies > 1 else ""
        return (f"{self.model} world {self.world}{side} batch {self.batch} cap {self.cap:g} MiB"
                f"{' +bare' if self.compare_bare else ''}")


def pooled(runs: list[dict], key: str = "steps") -> list[dict]:
    """Step records over repeats: per step of a group, the merged record
    (timeline.merge_ranks); independent copies each add their own steps."""
    steps = []
    for run in runs:
        if run["copies"] > 1:
            for d in run["docs"]:
                steps += d[key]
        else:
            steps += tl.merge_ranks([d[key] for d in run["docs"]])
    return steps


def world1_profile(runs: list[dict], model: str, batch: int, source: str) -> cm.Profile:
    """The cost model's input from world-1 runs with --compare-bare: DDP's
    phase medians, and each parameter's gradient-ready time: its median
    share of the bare model's backward (timed by hooks) times DDP's backward."""
    steps = pooled(runs)
    ddp = tl.summarize_steps(steps)
    first = runs[0]["docs"][0]
    shares = []
    for run in runs:
        for d in run["docs"]:
            for step, ready in zip(d["bare_steps"], d["parameter_ready_ms"]):
                backward = step["backward_end_ms"] - step["backward_start_ms"]
                shares.append([r / backward for r in ready])
    ready = [statistics.median(col) * ddp["backward_ms"] for col in zip(*shares)]
    params = [{"name": p["name"], "bytes": p["bytes"], "ready_ms": r} for p, r in zip(first["parameters"], ready)]
    # Every step's compute (DDP's step without communication at world 1): how
    # much a rank's step varies, for the cost model's wait for the slowest rank.
    samples = [s["step_ms"] for s in steps]
    return cm.Profile.from_json({"forward_ms": ddp["forward_ms"], "backward_ms": ddp["backward_ms"],
                                 "optimizer_ms": ddp["optimizer_ms"], "parameters": params,
                                 "batch_per_device": batch, "buffer_bytes": first["buffer_bytes"],
                                 "step_samples_ms": samples, "model": model, "source": source})


def own_compute_prediction(steps: list[dict], world: int, link: cm.Link) -> float:
    """The comm model alone: the point's own forward / backward / optimizer
    medians and bucket ready times, all-reduces from the fitted link."""
    s = tl.summarize_steps(steps)
    first = steps[len(steps) // 2]
    buckets = [cm.Bucket(b["ready_ms"] - first["backward_start_ms"], b["bytes"]) for b in first["buckets"]]
    ready = [statistics.median(st["buckets"][i]["ready_ms"] - st["backward_start_ms"] for st in steps)
             for i in range(len(buckets))]
    buckets = [cm.Bucket(r * 1e-3, b.nbytes) for r, b in zip(ready, buckets)]
    comm = [cm.ring_allreduce_time(world, b.nbytes, link) for b in buckets]
    schedule = cm.overlap_schedule(buckets, comm, s["backward_ms"] * 1e-3)
    return cm.step_time(s["forward_ms"] * 1e-3, s["backward_ms"] * 1e-3, s["optimizer_ms"] * 1e-3, schedule) * 1e3


def run_peer(args, peer: str, model: str, world: int, batch: int) -> dict | None:
    """One PyTorch run: the shared tutorial peer (torch_mnist_ddp.py, end to end
    with its data loader) or torch_scaling_peer.py (scaling_step's method)."""
    if peer == "tutorial":
        script = os.path.join(args.peers, "torch_mnist_ddp.py")
        cmd = [TORCH, script, "--world", str(world), "--threads", str(args.threads), "--batch", str(batch),
               "--max-steps", str(args.tutorial_steps), "--port", str(free_port())]
    else:
        cmd = [TORCH, os.path.join(HERE, "torch_scaling_peer.py"), "--model", model, "--world", str(world),
               "--batch", str(batch), "--steps", str(args.steps[model]), "--warmup", str(args.warmup[model]),
               "--threads", str(args.threads), "--image-size", str(args.image_size), "--port", str(free_port())]
    env = dict(os.environ, LOOM_PEERS=args.peers, OMP_NUM_THREADS=str(args.threads))
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout, check=True).stdout
        result = json.loads(out.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as e:
        log(f"  PyTorch {peer} {model} world {world}: failed ({e}); no peer figure")
        return None
    log(f"  PyTorch ({peer}) {model} world {world} batch {batch}: {result['images_per_s']:.1f} images/s")
    return result


def batch_at(args, model, mode, world):
    return args.weak_batch[model] if mode == "weak" else args.strong_batch[model] // world


def measure(args) -> dict:
    runner = Runner(args)
    report = {"machine": machine(args), "config": {k: v for k, v in vars(args).items() if k != "func"},
              "load_before": load_average()}
    worlds = args.worlds
    top = max(worlds)
    configs = []  # each measured `repeats` times, the repeats interleaved
    for model in args.models:
        for mode in ("weak", "strong"):
            for w in worlds:
                if mode == "strong" and args.strong_batch[model] % w:
                    continue
                configs.append(Config(model, w, batch_at(args, model, mode, w), compare_bare=w == 1 and mode == "weak"))
        for w in worlds[1:]:
            if args.side_by_side:
                configs.append(Config(model, 1, args.weak_batch[model], compare_bare=True, copies=w))
        if model in args.sweep_models and top > 1:
            configs += [Config(model, top, args.weak_batch[model], cap) for cap in args.bucket_caps]
    configs = list(dict.fromkeys(configs))
    runs = {c: [] for c in configs}
    log(f"scaling: {len(configs)} configurations x {args.repeats} repeats; load {load_average()}")
    # PyTorch in the same run, its runs interleaved with loom's (same load).
    peer_jobs = []
    if args.peer and torch_available():
        for model in args.models:
            for mode in ("weak", "strong"):
                for w in worlds:
                    if mode == "strong" and args.strong_batch[model] % w:
                        continue
                    for method in (("matched", "tutorial") if model == "convnet" else ("matched",)):
                        peer_jobs.append((model, mode, w, batch_at(args, model, mode, w), method))
    elif args.peer:
        log("scaling: PyTorch not found at /usr/bin/python3 (scripts/setup.sh --peers): no peer figures")
    peer_results = {job: [] for job in peer_jobs}
    allreduce = []
    for repeat in range(args.repeats):
        if top > 1:
            allreduce.append(runner.allreduce(top))
        for c in configs:
            runs[c].append(runner.step(c))
        done = {}
        for job in peer_jobs:
            key = (job[0], job[2], job[3], job[4])  # weak and strong share a run when the batch matches
            if key not in done:
                done[key] = run_peer(args, job[4], job[0], job[2], job[3])
            if done[key]:
                peer_results[job].append(done[key])
    report["load_after_runs"] = load_average()
    report["bucket_checks"] = [bucket_check(c, rs[0]["docs"][0]) for c, rs in runs.items()]

    link = None
    if allreduce:
        link, report["allreduce"] = allreduce_fit(allreduce, top)
    ring = (lambda n, b: cm.ring_allreduce_time(n, b, link)) if link else None

    # World-1 profiles: alone, and side by side with world-1 copies (per world).
    profiles, side_profiles = {}, {}
    for c, rs in runs.items():
        if c.world == 1 and c.compare_bare and c.copies == 1:
            profiles[(c.model, c.batch)] = world1_profile(rs, c.model, c.batch, "measured at world 1, alone")
        elif c.copies > 1:
            side_profiles[(c.model, c.batch, c.copies)] = world1_profile(
                rs, c.model, c.batch, f"measured at world 1, {c.copies} copies side by side")

    points, overheads = [], []
    for model in args.models:
        for mode in ("weak", "strong"):
            base_rate, base_rates = None, []
            for w in worlds:
                c = Config(model, w, batch_at(args, model, mode, w), compare_bare=w == 1 and mode == "weak")
                if c not in runs:
                    continue
                steps = pooled(runs[c])
                backend = runs[c][0]["docs"][0]["backend"]
                # shm runs each collective on the compute thread, inside backward's hooks.
                blocking = backend == "shm"
                s = tl.summarize_steps(steps, blocking)
                rate = w * c.batch / s["step_ms"] * 1e3
                # Per repeat: world 1 and world w ran minutes apart at most, under much the same load.
                rates = [w * c.batch / statistics.median(st["step_ms"] for st in pooled([r])) * 1e3 for r in runs[c]]
                if w == 1:
                    base_rate, base_rates = rate, rates
                point = {"model": model, "mode": mode, "world": w, "backend": backend,
                         "batch_per_rank": c.batch,
                         "global_batch": w * c.batch,
                         **{k: s[k] for k in ("step_ms", "forward_ms", "backward_ms", "optimizer_ms", "comm_ms",
                                              "hidden_share", "exposed_comm_ms", "steps")},
                         "step_ms_iqr": iqr([st["step_ms"] for st in steps]),
                         "images_per_s": rate, "efficiency": rate / (w * base_rate) if base_rate else None,
                         "epoch_s": DATASET_IMAGES.get(model, DEFAULT_DATASET_IMAGES) / rate,
                         "repeats": len(runs[c])}
                if base_rates and w > 1:
                    paired = [r / (w * b) for r, b in zip(rates, base_rates)]
                    point["efficiency_per_repeat"] = paired
                    point["efficiency_paired"] = statistics.median(paired)
                if ring and w > 1:
                    alone = profiles.get((model, c.batch)) or nearest_profile(profiles, model, c.batch)
                    if alone:
                        pred = cm.predict_step(alone, w, ring, blocking=blocking)
                        point["predicted_step_ms"] = pred.step_s * 1e3
                        point["prediction_error"] = pred.step_s * 1e3 / s["step_ms"] - 1
                        point["predicted_comm_ms"] = pred.comm_s * 1e3
                    side = side_profiles.get((model, c.batch, w))
                    if side:
                        pred = cm.predict_step(side, w, ring, blocking=blocking)
                        point["predicted_side_by_side_step_ms"] = pred.step_s * 1e3
                        point["side_by_side_prediction_error"] = pred.step_s * 1e3 / s["step_ms"] - 1
                        point["predicted_straggler_ms"] = cm.straggler_s(side.step_samples_s, w) * 1e3
                        point["side_by_side_compute_ms"] = side.compute_s * 1e3
                        # What DDP itself costs once the machine's sharing is taken out: the
                        # step of world-1 copies side by side over the world-w step.
                        side_step = tl.summarize_steps(pooled(runs[Config(model, 1, c.batch, 25, True, w)]))["step_ms"]
                        point["side_by_side_step_ms"] = side_step
                        point["efficiency_vs_side_by_side"] = side_step / s["step_ms"]
                    if not blocking:  # with shm the point's own backward already holds its collectives
                        point["predicted_from_own_compute_ms"] = own_compute_prediction(steps, w, link)
                        point["own_compute_prediction_error"] = point["predicted_from_own_compute_ms"] / s["step_ms"] - 1
                if c.compare_bare:
                    overheads.append({"model": model, "batch": c.batch, **overhead_of(runs[c])})
                points.append(point)
    report["points"] = points
    report["ddp_overhead_world1"] = list({(o["model"], o["batch"]): o for o in overheads}.values())
    report["side_by_side_world1"] = [
        {"model": m, "batch": b, "copies": k, "step_ms": tl.summarize_steps(pooled(runs[Config(m, 1, b, 25, True, k)]))["step_ms"],
         "overhead": overhead_of(runs[Config(m, 1, b, 25, True, k)])}
        for (m, b, k) in side_profiles]

    # Bucket sweep: measured at the largest world, predicted from the world-1 profiles.
    sweep = []
    for model in args.sweep_models:
        if model not in args.models or top == 1:
            continue
        batch = args.weak_batch[model]
        for cap in args.bucket_caps:
            c = Config(model, top, batch, cap)
            backend = runs[c][0]["docs"][0]["backend"]
            s = tl.summarize_steps(pooled(runs[c]), blocking=backend == "shm")
            row = {"model": model, "world": top, "bucket_cap_mib": cap, "step_ms": s["step_ms"],
                   "comm_ms": s["comm_ms"], "hidden_share": s["hidden_share"], "exposed_comm_ms": s["exposed_comm_ms"],
                   "buckets": len(runs[c][0]["docs"][0]["buckets"]), "backend": backend}
            for label, profile in (("predicted_step_ms", profiles.get((model, batch))),
                                   ("predicted_side_by_side_step_ms", side_profiles.get((model, batch, top)))):
                if ring and profile:
                    row[label] = cm.predict_step(profile, top, ring, cm.MiB, int(cap * cm.MiB),
                                                 blocking=backend == "shm").step_s * 1e3
            sweep.append(row)
    report["bucket_sweep"] = sweep
    report["profiles"] = [profile_json(p) for p in list(profiles.values()) + list(side_profiles.values())]

    report["pytorch"] = []
    for (model, mode, w, batch, method), results in peer_results.items():
        if results:
            rate = statistics.median(r["images_per_s"] for r in results)
            report["pytorch"].append({"model": model, "mode": mode, "world": w, "batch_per_rank": batch,
                                      "method": method, "peer": results[0]["peer"], "images_per_s": rate,
                                      "runs": [r["images_per_s"] for r in results]})
    attach_peer_ratios(report)
    report["load_end"] = load_average()
    return report


def bucket_check(c: Config, doc: dict) -> dict:
    """The cost model's bucket assignment against the buckets DDP built."""
    groups = cm.assign_buckets([p["bytes"] for p in doc["parameters"]], doc["first_bucket_bytes_cap"],
                               doc["bucket_bytes_cap"])
    names = [[doc["parameters"][k]["name"] for k in g] for g in groups]
    return {"what": c.describe(), "ddp": doc["buckets"], "model": names}


def overhead_of(runs: list[dict]) -> dict:
    """DDP against the bare model over every process of world-1 --compare-bare
    runs (blocks renamed per run and process so that they stay apart)."""
    ddp, bare = [], []
    for i, run in enumerate(runs):
        for k, d in enumerate(run["docs"]):
            ddp += [{**s, "block": (i, k, s["block"])} for s in d["steps"]]
            bare += [{**s, "block": (i, k, s["block"])} for s in d["bare_steps"]]
    return tl.block_overhead(ddp, bare)


def iqr(values):
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
    return q[2] - q[0]


def nearest_profile(profiles, model, batch):
    mine = [(abs(b - batch), p) for (m, b), p in profiles.items() if m == model]
    return min(mine, key=lambda t: t[0])[1].scaled(batch) if mine else None


def profile_json(p: cm.Profile) -> dict:
    return {"model": p.name, "source": p.source, "batch_per_device": p.batch_per_device,
            "forward_ms": p.forward_s * 1e3, "backward_ms": p.backward_s * 1e3, "optimizer_ms": p.optimizer_s * 1e3,
            "buffer_bytes": p.buffer_bytes,
            "parameters": [{"bytes": b, "ready_ms": r * 1e3} for b, r in zip(p.parameter_bytes, p.parameter_ready_s)]}


def torch_available() -> bool:
    return os.path.exists(TORCH) and subprocess.run([TORCH, "-c", "import torch, torchvision"],
                                                    capture_output=True).returncode == 0


def attach_peer_ratios(report):
    for method in ("matched", "tutorial"):
        peers = {(p["model"], p["mode"], p["world"]): p for p in report["pytorch"] if p["method"] == method}
        base = {(m, mode): p["images_per_s"] for (m, mode, w), p in peers.items() if w == 1}
        base_runs = {(m, mode): p["runs"] for (m, mode, w), p in peers.items() if w == 1}
        for p in peers.values():
            b = base.get((p["model"], p["mode"]))
            p["efficiency"] = p["images_per_s"] / (p["world"] * b) if b else None
            runs = base_runs.get((p["model"], p["mode"]))
            if p["world"] > 1 and runs and len(runs) == len(p["runs"]):
                p["efficiency_paired"] = statistics.median(r / (p["world"] * b1) for r, b1 in zip(p["runs"], runs))
        for point in report["points"]:
            p = peers.get((point["model"], point["mode"], point["world"]))
            if p:
                point[f"torch_{method}_images_per_s"] = p["images_per_s"]
                point[f"torch_{method}_efficiency"] = p["efficiency"]
                if "efficiency_paired" in p:
                    point[f"torch_{method}_efficiency_paired"] = p["efficiency_paired"]
                point[f"loom_over_torch_{method}"] = point["images_per_s"] / p["images_per_s"]


# --- projections ---------------------------------------------------------------------------------

def projections(args, measured: dict | None = None) -> dict:
    """ResNet-50 on H200 (an assumed profile, or `measured`: a profile_json of
    this run) from 1 to 512 GPUs on each preset cluster, weak scaling at the
    profile's batch; and the bucket-cap sweep."""
    assumed = measured or read_json(args.assumption)
    profile = cm.Profile.from_json(assumed)
    worlds = cm.powers_of_two(1, args.project_to)
    out = {"profile": {k: assumed.get(k, "") for k in ("model", "source", "batch_per_device", "forward_ms",
                                                         "backward_ms", "optimizer_ms", "assumption")},
           "bucket_caps": {"first_mib": args.first_bucket_mb, "cap_mib": 25}, "clusters": {}}
    for name in args.clusters:
        cluster = cluster_from_args(args, name)
        at = lambda n, b, c=cluster: cm.cluster_allreduce_time(n, b, c)  # noqa: E731
        rows = cm.project(profile, worlds, at, int(args.first_bucket_mb * cm.MiB), 25 * cm.MiB)
        best8, sweep8 = cm.best_bucket_cap(profile, min(8, args.project_to), at, args.bucket_caps)
        best_top, sweep_top = cm.best_bucket_cap(profile, args.project_to, at, args.bucket_caps)
        out["clusters"][name] = {"description": cluster.name, "gpus_per_node": cluster.gpus_per_node,
                                 "intra": vars(cluster.intra), "inter": vars(cluster.inter),
                                 "hierarchical": cluster.hierarchical, "weak_scaling": rows,
                                 "bucket_sweep": {"8": {"best_cap_mib": best8, "rows": sweep8},
                                                  str(args.project_to): {"best_cap_mib": best_top, "rows": sweep_top}}}
    return out


def cluster_from_args(args, name) -> cm.Cluster:
    c = cm.PRESETS[name]
    intra, inter = c.intra, c.inter
    if args.intra_alpha_us is not None:
        intra = cm.Link(args.intra_alpha_us * 1e-6, intra.bandwidth, intra.name + " (alpha set)")
    if args.intra_bandwidth_gbs is not None:
        intra = cm.Link(intra.alpha_s, args.intra_bandwidth_gbs * 1e9, intra.name + " (bandwidth set)")
    if args.inter_alpha_us is not None:
        inter = cm.Link(args.inter_alpha_us * 1e-6, inter.bandwidth, inter.name + " (alpha set)")
    if args.inter_bandwidth_gbs is not None:
        inter = cm.Link(inter.alpha_s, args.inter_bandwidth_gbs * 1e9, inter.name + " (bandwidth set)")
    return cm.Cluster(args.gpus_per_node or c.gpus_per_node, intra, inter, c.hierarchical, c.name)


# --- report checks, files, plot ------------------------------------------------------------------

def validate_report(report: dict) -> list[str]:
    """The report's schema and sanity: what CI checks. Returns the problems."""
    problems = []
    for key in ("machine", "config", "points", "ddp_overhead_world1", "projection", "load_before"):
        if key not in report:
            problems.append(f"missing key {key}")
    for p in report.get("points", []):
        where = f"{p.get('model')} {p.get('mode')} world {p.get('world')}"
        for key in ("step_ms", "images_per_s", "epoch_s", "forward_ms", "backward_ms", "optimizer_ms"):
            if not isinstance(p.get(key), (int, float)) or p[key] <= 0:
                problems.append(f"{where}: {key} = {p.get(key)!r} is not a positive time/rate")
        e = p.get("efficiency")
        if not isinstance(e, (int, float)) or not 0 < e <= 1.5:
            problems.append(f"{where}: efficiency {e!r} outside (0, 1.5]")
        if p["world"] > 1:
            if not isinstance(p.get("comm_ms"), (int, float)) or p["comm_ms"] <= 0:
                problems.append(f"{where}: no communication time measured ({p.get('comm_ms')!r})")
            h = p.get("hidden_share")
            if h is not None and not 0 <= h <= 1:
                problems.append(f"{where}: hidden share {h} outside [0, 1]")
            if "predicted_step_ms" in p and not p["predicted_step_ms"] > 0:
                problems.append(f"{where}: predicted step {p['predicted_step_ms']} is not positive")
    for check in report.get("bucket_checks", []):
        if check["ddp"] != check["model"]:
            problems.append(f"{check['what']}: DDP's buckets {check['ddp']} differ from the cost model's {check['model']}")
    if not any(p["world"] == 1 for p in report.get("points", [])):
        problems.append("no world-1 point")
    for o in report.get("ddp_overhead_world1", []):
        if not (o.get("ddp_step_ms", 0) > 0 and o.get("bare_step_ms", 0) > 0):
            problems.append(f"DDP overhead entry without positive step times: {o}")
    wanted = report.get("config", {}).get("project_measured")
    if wanted and "projection_measured" not in report:
        problems.append(f"--project-measured {wanted}: no projection from a measured profile")
    for key in ("projection", "projection_measured"):
        for name, c in report.get(key, {}).get("clusters", {}).items():
            for row in c["weak_scaling"]:
                if not (row["step_ms"] > 0 and 0 < row["efficiency"] <= 1.5):
                    problems.append(f"{key} {name} world {row['world']}: {row}")
    return problems


def machine(args) -> dict:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = ""
    return {"host": socket.gethostname(), "cpu": cpu, "cores": len(os.sched_getaffinity(0)),
            "platform": platform.platform(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "loom_commit": commit, "device": args.device}


def write_csv(path, rows, columns):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


POINT_COLUMNS = ["model", "mode", "world", "backend", "batch_per_rank", "global_batch", "step_ms", "step_ms_iqr", "images_per_s",
                 "efficiency", "efficiency_paired", "epoch_s", "forward_ms", "backward_ms", "optimizer_ms", "comm_ms", "hidden_share",
                 "exposed_comm_ms", "predicted_step_ms", "prediction_error", "predicted_side_by_side_step_ms",
                 "side_by_side_prediction_error", "predicted_straggler_ms", "side_by_side_compute_ms", "side_by_side_step_ms",
                 "efficiency_vs_side_by_side", "predicted_from_own_compute_ms",
                 "own_compute_prediction_error", "torch_matched_images_per_s", "torch_matched_efficiency",
                 "torch_matched_efficiency_paired", "loom_over_torch_matched", "torch_tutorial_images_per_s",
                 "torch_tutorial_efficiency", "torch_tutorial_efficiency_paired",
                 "loom_over_torch_tutorial", "steps", "repeats"]


def write_outputs(report, out, stem, plot: bool, work: str):
    os.makedirs(out, exist_ok=True)
    files = {"json": os.path.join(out, f"{stem}.json"), "csv": os.path.join(out, f"{stem}.csv"),
             "projection_csv": os.path.join(out, f"{stem}-projection.csv")}
    with open(files["json"], "w") as f:
        json.dump(report, f, indent=1)
    write_csv(files["csv"], report["points"], POINT_COLUMNS)
    rows = [{"cluster": name, **r} for name, c in report["projection"]["clusters"].items() for r in c["weak_scaling"]]
    write_csv(files["projection_csv"], rows, ["cluster", "world", "batch_per_device", "step_ms", "images_per_s",
                                              "efficiency", "comm_ms", "exposed_comm_ms", "hidden_share", "buckets"])
    if report.get("bucket_sweep"):
        files["sweep_csv"] = os.path.join(out, f"{stem}-bucket-sweep.csv")
        write_csv(files["sweep_csv"], report["bucket_sweep"], ["model", "world", "bucket_cap_mib", "step_ms",
                                                              "predicted_step_ms", "predicted_side_by_side_step_ms",
                                                              "comm_ms", "hidden_share",
                                                              "exposed_comm_ms", "buckets"])
    if plot:
        png = os.path.join(out, f"{stem}.png")
        if make_plot(report, png, work):
            files["png"] = png
    return files


def ranks_label(report) -> str:
    """"CPU processes, shm, 1 thread each" or "GPUs, nccl": what a rank was in the measured points."""
    backends = sorted({p.get("backend", "gloo") for p in report["points"]})
    config = report.get("config", {})
    if config.get("device", "cpu") != "cpu":
        return f"GPUs, {'/'.join(backends)}"
    threads = config.get("threads", 1)
    return f"CPU processes, {'/'.join(backends)}, {threads} thread{'s' if threads != 1 else ''} each"


def make_plot(report, png, work) -> bool:
    """Three panels with gnuplot: this machine's measured and predicted points,
    the H200 ResNet-50 projection, and the bucket sweep."""
    if not shutil.which("gnuplot"):
        log("scaling: gnuplot not found (scripts/setup.sh --peers installs gnuplot-nox): no plot")
        return False
    d = os.path.join(work, "plot")
    os.makedirs(d, exist_ok=True)
    series = []
    for model in sorted({p["model"] for p in report["points"]}):
        rows = {}
        for p in report["points"]:
            if p["model"] != model:
                continue
            r = rows.setdefault(p["world"], {})
            if p["mode"] == "weak":
                pred = p.get("predicted_side_by_side_step_ms") or p.get("predicted_step_ms")
                if p["world"] == 1:
                    pred = p["step_ms"]
                r.update(weak=p["images_per_s"], eff=p["efficiency"],
                         pred=p["global_batch"] / pred * 1e3 if pred else "NaN",
                         torch=p.get("torch_matched_images_per_s", "NaN"),
                         torch_eff=p.get("torch_matched_efficiency") or "NaN")
            else:
                r["strong"] = p["images_per_s"]
        f = os.path.join(d, f"measured-{model}.dat")
        with open(f, "w") as fh:
            fh.write("# world weak_images_per_s strong_images_per_s predicted_weak efficiency torch_images_per_s torch_efficiency\n")
            for w in sorted(rows):
                r = rows[w]
                fh.write(" ".join(str(r.get(k, "NaN")) for k in ("weak", "strong", "pred", "eff", "torch", "torch_eff"))
                         .join((f"{w} ", "\n")))
        series.append((model, f))
    proj = []
    for name, c in report["projection"]["clusters"].items():
        f = os.path.join(d, f"projection-{name}.dat")
        with open(f, "w") as fh:
            for r in c["weak_scaling"]:
                fh.write(f"{r['world']} {r['images_per_s']} {r['efficiency']}\n")
        proj.append((name, f))
    sweep_files = []
    for model in sorted({r["model"] for r in report.get("bucket_sweep", [])}):
        rows = [r for r in report["bucket_sweep"] if r["model"] == model]
        f = os.path.join(d, f"sweep-{model}.dat")
        with open(f, "w") as fh:
            for r in rows:
                fh.write(f"{r['bucket_cap_mib']} {r['step_ms']} {r.get('predicted_step_ms', 'NaN')}\n")
        sweep_files.append((f"{model} world {rows[0]['world']} measured / predicted (ms)", f))
    for name, c in report["projection"]["clusters"].items():
        top = max(c["bucket_sweep"], key=int)
        f = os.path.join(d, f"sweep-projected-{name}.dat")
        with open(f, "w") as fh:
            for r in c["bucket_sweep"][top]["rows"]:
                fh.write(f"{r['bucket_cap_mib']} {r['step_ms']} NaN\n")
        sweep_files.append((f"ResNet-50 H200 x{top} {name} projected (ms)", f))

    m = report["machine"]
    load = report.get("load_before", [])
    g = ["set terminal pngcairo size 1800,640 font ',10' noenhanced", f"set output '{png}'",
         "set multiplot layout 1,3", "set logscale x 2", "set grid", "set ytics nomirror", "set y2tics",
         "set y2range [0:1.2]", "set y2label 'scaling efficiency (dashed / dotted)'",
         "set key outside bottom center horizontal maxcols 3 font ',8'"]
    g += [f"set title \"This machine: {m['cores']} cores, {m['cpu'][:40]}, {m['date'][:10]}\\n"
          f"load average {load}; points measured, solid line predicted\"",
          f"set xlabel 'ranks ({ranks_label(report)})'", "set ylabel 'images/s'", "set logscale y",
          "set xrange [0.8:*]"]
    plots = []
    for colour, (model, f) in enumerate(series, start=1):
        plots += [f"'{f}' using 1:2 with points pt 7 ps 1.6 lc {colour} title '{model} weak, loom'",
                  f"'{f}' using 1:3 with points pt 9 ps 1.6 lc {colour} title '{model} strong, loom'",
                  f"'{f}' using 1:4 with lines lw 2 lc {colour} title '{model} weak, predicted'",
                  f"'{f}' using 1:6 with points pt 6 ps 1.6 lc {colour} title '{model} weak, PyTorch'",
                  f"'{f}' using 1:5 axes x1y2 with linespoints dt 2 pt 7 ps 0.6 lc {colour} title 'efficiency loom'",
                  f"'{f}' using 1:7 axes x1y2 with linespoints dt 3 pt 6 ps 0.6 lc {colour} title 'efficiency PyTorch'"]
    g.append("plot " + ", \\\n  ".join(plots))
    pr = report["projection"]["profile"]
    g += [f"set title \"Projection: {pr['model']} on H200, batch {pr['batch_per_device']}/GPU, DDP caps 1 + 25 MiB\\n"
          "ASSUMED compute (not measured); alpha-beta ring all-reduce, buckets overlapping backward\"",
          "set xlabel 'GPUs (8 per node: NVLink inside, InfiniBand NDR or 25 GbE between)'", "set xrange [1:*]"]
    plots = []
    for i, (name, f) in enumerate(proj, start=1):
        plots.append(f"'{f}' using 1:2 with linespoints lc {i} title '{name} images/s'")
        plots.append(f"'{f}' using 1:3 axes x1y2 with lines dt 2 lw 2 lc {i} title '{name} efficiency'")
    g.append("plot " + ", \\\n  ".join(plots))
    g += ["unset y2tics", "unset y2label", "set title 'Bucket cap sweep (DDP paper): step time against bucket_cap_mb'",
          "set xlabel 'bucket cap (MiB)'", "set ylabel 'step ms'", "set xrange [0.8:128]"]
    plots = []
    for i, (title, f) in enumerate(sweep_files, start=1):
        plots.append(f"'{f}' using 1:2 with linespoints lc {i} title '{title}'")
        plots.append(f"'{f}' using 1:3 with lines dt 2 lc {i} notitle")
    if plots:
        g.append("plot " + ", \\\n  ".join(plots))
    g.append("unset multiplot")
    script = os.path.join(d, "plot.gp")
    with open(script, "w") as f:
        f.write("\n".join(g) + "\n")
    r = subprocess.run(["gnuplot", script], capture_output=True, text=True)
    if r.returncode:
        log(f"scaling: gnuplot failed: {r.stderr.strip()}")
        return False
    return True


def summary_lines(report) -> list[str]:
    lines = [f"machine: {report['machine']['host']}, {report['machine']['cores']} cores, {report['machine']['cpu']}; "
             f"load average before {report['load_before']}, after {report.get('load_end')}"]
    if "allreduce" in report and "fit_error" in report["allreduce"]:
        lines.append(f"all-reduce fit: none ({report['allreduce']['fit_error']})")
    elif "allreduce" in report:
        a = report["allreduce"]
        lines.append(f"all-reduce fit (world {a['world']}, {a['backend']}): alpha {a['alpha_us']:.1f} us, "
                     f"bus bandwidth {a['bus_bandwidth_gbs']:.2f} GB/s, max fit error {100 * a['fit_max_abs_relative_error']:.1f}%")
    for o in report["ddp_overhead_world1"]:
        lines.append(f"DDP overhead at world 1, {o['model']} batch {o['batch']}: {100 * o['overhead']:+.2f}% "
                     f"(DDP {o['ddp_step_ms']:.2f} ms, bare {o['bare_step_ms']:.2f} ms, {o['blocks']} blocks)")
    for p in report["points"]:
        s = (f"{p['model']:9s} {p['mode']:6s} world {p['world']} batch {p['batch_per_rank']:4d}: "
             f"{p['step_ms']:8.2f} ms  {p['images_per_s']:8.1f} img/s  eff {p['efficiency']:.3f}"
             + (f" (paired {p['efficiency_paired']:.3f})" if "efficiency_paired" in p else "")
             + f"  epoch {p['epoch_s']:.0f} s")
        if p["world"] > 1:
            s += f"  comm {p['comm_ms']:.2f} ms hidden {fmt_share(p['hidden_share'])} exposed {p['exposed_comm_ms']:.2f} ms"
        if "efficiency_vs_side_by_side" in p:
            s += f"  eff vs side-by-side {p['efficiency_vs_side_by_side']:.3f}"
        if "predicted_step_ms" in p:
            s += f"  predicted {p['predicted_step_ms']:.2f} ms ({100 * p['prediction_error']:+.1f}%)"
        if "predicted_side_by_side_step_ms" in p:
            s += (f" / side-by-side profile {p['predicted_side_by_side_step_ms']:.2f} ms "
                  f"({100 * p['side_by_side_prediction_error']:+.1f}%"
                  f"{', of it straggler %.2f ms' % p['predicted_straggler_ms'] if 'predicted_straggler_ms' in p else ''})")
        if "loom_over_torch_matched" in p:
            s += f"  torch eff {p['torch_matched_efficiency']:.3f}"
            if "torch_matched_efficiency_paired" in p:
                s += f" (paired {p['torch_matched_efficiency_paired']:.3f})"
            s += f" loom/torch {p['loom_over_torch_matched']:.2f}"
        if "loom_over_torch_tutorial" in p:
            s += f" (tutorial peer {p['loom_over_torch_tutorial']:.2f})"
        lines.append(s)
    for o in report.get("side_by_side_world1", []):
        lines.append(f"world 1 x{o['copies']} side by side, {o['model']} batch {o['batch']}: {o['step_ms']:.2f} ms/step "
                     f"(DDP over bare {100 * o['overhead']['overhead']:+.2f}%)")
    for r in report.get("bucket_sweep", []):
        lines.append(f"sweep {r['model']} world {r['world']} cap {r['bucket_cap_mib']:>3} MiB: {r['step_ms']:.2f} ms"
                     + (f", predicted {r['predicted_step_ms']:.2f} (alone)" if "predicted_step_ms" in r else "")
                     + (f" / {r['predicted_side_by_side_step_ms']:.2f} (side-by-side profile)"
                        if "predicted_side_by_side_step_ms" in r else ""))
    for key, label in (("projection", "projection"), ("projection_measured", "projection from the measured profile")):
        for name, c in report.get(key, {}).get("clusters", {}).items():
            eff = {r["world"]: r["efficiency"] for r in c["weak_scaling"]}
            lines.append(f"{label} {name}: efficiency "
                         + ", ".join(f"{w}: {eff[w]:.3f}" for w in sorted(eff) if w > 1)
                         + f"; best bucket cap at 8 GPUs {c['bucket_sweep']['8']['best_cap_mib']} MiB")
    return lines


def fmt_share(x):
    return "n/a" if x is None else f"{100 * x:.0f}%"


def parse_map(text: str, models) -> dict:
    """'convnet=100,resnet18=32' -> dict (a bare number applies to every model)."""
    out = {}
    for part in text.split(","):
        if "=" in part:
            k, v = part.split("=")
            out[k.strip()] = int(v)
        else:
            out.update({m: int(part) for m in models})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="CI: ConvNet, worlds 1 and 2, a few steps, no peer, no plot")
    mode.add_argument("--full", action="store_true", help="ConvNet and ResNet-18, sweep, peers, plot (under 10 min on the 2-core VM, 2026-11-29)")
    p.add_argument("--build", default=os.environ.get("LOOM_BUILD", os.path.join(ROOT, "build")))
    p.add_argument("--bin", default=None, help="directory of scaling_step and allreduce_timing "
                   "(default: <build>/benchmarks/scaling)")
    p.add_argument("--out", default=None, help="output directory (default: <build>/scaling)")
    p.add_argument("--work", default=None, help="per-rank JSON and plot data (default: <build>/scaling-work)")
    p.add_argument("--stem", default=None, help="file name stem (default: scaling-<date>-<host>)")
    p.add_argument("--models", default=None, help="comma list: convnet, resnet18, resnet50, ...")
    p.add_argument("--worlds", default=None, help="comma list (default 1, 2, 4, ... up to the cores or GPUs)")
    p.add_argument("--weak-batch", default="convnet=100,resnet18=32,resnet50=16", help="per-rank batch, weak scaling")
    p.add_argument("--strong-batch", default=None, help="global batch, strong scaling (default: weak x largest world)")
    p.add_argument("--steps", default=None, help="measured steps per run: a number, or per model "
                   "(default: quick 8; full convnet=40,resnet18=12,resnet50=6)")
    p.add_argument("--warmup", default=None, help="steps before measuring, like --steps (default: quick 2; full 5 / 3)")
    p.add_argument("--repeats", type=int, default=None, help="runs per configuration, interleaved")
    p.add_argument("--block", type=int, default=None,
                   help="steps per interleaved DDP / bare block at world 1 (default: a sixth of --steps, at least 2)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads per rank")
    p.add_argument("--device", default="cpu", help="cpu, or cuda (one rank per GPU, NCCL)")
    p.add_argument("--backend", default="auto", choices=["auto", "gloo", "shm", "nccl"],
                   help="process group (auto: nccl on GPUs; shm for CPU ranks on one host)")
    p.add_argument("--data", default=None, help="Fashion-MNIST directory for the ConvNet, or 'synthetic'")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--sweep-models", default=None, help="models for the bucket sweep at the largest world")
    p.add_argument("--bucket-caps", default="1,5,10,25,50,100", help="MiB")
    p.add_argument("--allreduce-sizes", default="4096,65536,262144,1048576,4194304,16777216,67108864")
    p.add_argument("--allreduce-iterations", type=int, default=None)
    p.add_argument("--side-by-side", action=argparse.BooleanOptionalAction, default=True,
                   help="also run world-1 copies side by side (compute under the same core occupancy, no communication)")
    p.add_argument("--peer", action=argparse.BooleanOptionalAction, default=None, help="measure PyTorch DDP too")
    p.add_argument("--tutorial-steps", type=int, default=200,
                   help="steps per process of ../shared/peers/torch_mnist_ddp.py (end to end, with its loader)")
    p.add_argument("--peers", default=os.environ.get("LOOM_PEERS", os.path.join(ROOT, "..", "shared", "peers")))
    p.add_argument("--plot", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--timeout", type=float, default=900, help="seconds per launched run")
    g = p.add_argument_group("projection (ResNet-50 on H200 clusters)")
    g.add_argument("--assumption", default=DEFAULT_ASSUMPTION, help="per-device profile JSON (forward/backward ms, ready offsets)")
    g.add_argument("--clusters", default="nvlink-ib,nvlink-25gbe", help=f"presets: {', '.join(cm.PRESETS)}")
    g.add_argument("--project-to", type=int, default=512)
    g.add_argument("--first-bucket-mb", type=float, default=1)
    g.add_argument("--gpus-per-node", type=int, default=None)
    g.add_argument("--intra-alpha-us", type=float, default=None)
    g.add_argument("--intra-bandwidth-gbs", type=float, default=None)
    g.add_argument("--inter-alpha-us", type=float, default=None)
    g.add_argument("--inter-bandwidth-gbs", type=float, default=None)
    p.add_argument("--project-only", action="store_true", help="only the projection from --assumption (no runs)")
    p.add_argument("--project-measured", metavar="MODEL", default=None,
                   help="also project the clusters from MODEL's world-1 profile measured in this run (e.g. resnet50 "
                        "on one GPU: --device cuda --models resnet50 --worlds 1 --image-size 224)")
    p.add_argument("--replot", metavar="REPORT_JSON", help="redraw the PNG (and CSV) of an earlier report, no runs")
    a = p.parse_args(argv)

    quick = a.quick
    a.models = (a.models or ("convnet" if quick else "convnet,resnet18")).split(",")
    limit = gpu_count() if a.device.startswith("cuda") else len(os.sched_getaffinity(0))
    a.worlds_given = bool(a.worlds)
    a.worlds = [int(w) for w in a.worlds.split(",")] if a.worlds else cm.powers_of_two(1, max(1, limit))
    if quick and not a.worlds_given:
        a.worlds = [1, 2]  # CI: two CPU ranks whatever the machine has
    a.weak_batch = parse_map(a.weak_batch, a.models)
    for m in a.models:
        a.weak_batch.setdefault(m, 32)
    top = max(a.worlds)
    a.strong_batch = parse_map(a.strong_batch, a.models) if a.strong_batch else {}
    for m in a.models:
        a.strong_batch.setdefault(m, a.weak_batch[m] * top)
    a.steps = parse_map(a.steps or ("8" if quick else "convnet=40,resnet18=12,resnet50=6"), a.models)
    a.warmup = parse_map(a.warmup or ("2" if quick else "convnet=5,resnet18=3,resnet50=2"), a.models)
    for m in a.models:
        a.steps.setdefault(m, 8)
        a.warmup.setdefault(m, 2)
    a.repeats = a.repeats or (1 if quick else 3)
    a.sweep_models = (a.sweep_models or ("" if quick else "resnet18")).split(",") if (a.sweep_models or not quick) else []
    a.sweep_models = [m for m in a.sweep_models if m]
    a.bucket_caps = [float(c) if "." in c else int(c) for c in a.bucket_caps.split(",")]
    a.allreduce_sizes = [int(s) for s in a.allreduce_sizes.split(",")]
    if quick and a.allreduce_sizes == [4096, 65536, 262144, 1048576, 4194304, 16777216, 67108864]:
        a.allreduce_sizes = [4096, 65536, 1048576, 8388608]
    a.allreduce_iterations = a.allreduce_iterations or (8 if quick else 20)
    a.peer = (not quick) if a.peer is None else a.peer
    if a.device.startswith("cuda"):
        a.side_by_side = False  # world-1 copies would share one GPU
    a.plot = (not quick) if a.plot is None else a.plot
    a.clusters = a.clusters.split(",")
    if "convnet" in a.models and not a.data and not os.path.isdir(FASHION_MNIST):
        log(f"scaling: {FASHION_MNIST} not found (Debian package dataset-fashion-mnist); the ConvNet gets synthetic images")
        a.data = "synthetic"
    a.out = a.out or os.path.join(a.build, "scaling")
    a.bin = a.bin or os.path.join(a.build, "benchmarks", "scaling")
    a.work = a.work or os.path.join(a.build, "scaling-work")
    date = datetime.date.today().isoformat()
    a.stem = a.stem or f"scaling-{date}-{socket.gethostname()}"
    os.makedirs(a.out, exist_ok=True)

    if a.replot:
        report = read_json(a.replot)
        out, stem = os.path.dirname(os.path.abspath(a.replot)), os.path.splitext(os.path.basename(a.replot))[0]
        print(json.dumps({"files": write_outputs(report, out, stem, True, a.work)}))
        return 0
    if a.project_only:
        report = {"machine": machine(a), "projection": projections(a)}
        for line in summary_lines({**report, "load_before": load_average(), "ddp_overhead_world1": [], "points": []})[1:]:
            print(line)
        with open(os.path.join(a.out, f"{a.stem}-projection.json"), "w") as f:
            json.dump(report, f, indent=1)
        return 0
    for program in ("scaling_step", "allreduce_timing"):
        path = os.path.join(a.bin, program)
        if not os.access(path, os.X_OK):
            log(f"scaling: {path} not found; build it (cmake --build {a.build} --target {program}) or pass --build")
            return 2
    report = measure(a)
    report["projection"] = projections(a)
    if a.project_measured:
        alone = [p for p in report["profiles"] if p["model"] == a.project_measured and p["source"].endswith("alone")]
        if alone:  # the cluster projection from this device's own world-1 profile
            report["projection_measured"] = projections(a, {**alone[0], "source": f"{alone[0]['source']} on {a.device}"})
        else:
            log(f"scaling: --project-measured {a.project_measured}: no world-1 profile of it was measured "
                f"(--models must hold it, with world 1)")
    problems = validate_report(report)
    report["problems"] = problems
    files = write_outputs(report, a.out, a.stem, a.plot, a.work)
    for line in summary_lines(report):
        print(line)
    print(json.dumps({"files": files}))
    if problems:
        log("scaling: the report failed its checks:\n  " + "\n  ".join(problems))
        return 1
    return 0


def gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
        return max(1, sum(1 for line in out.splitlines() if line.startswith("GPU")))
    except OSError:
        return 1


if __name__ == "__main__":
    sys.exit(main())
