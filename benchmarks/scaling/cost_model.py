"""Cost model of data-parallel training steps: ring all-reduce under an
alpha-beta model (flat and two-level), DDP's bucket assignment, the overlap
schedule of bucket all-reduces behind backward, and projections of step time
and scaling efficiency from one device's measured (or assumed) profile.

Units: seconds, bytes, bytes per second. Standard library only (CI runs it).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace

MiB = 1 << 20
GB = 1e9


@dataclass(frozen=True)
class Link:
    """One level of interconnect under the alpha-beta model.

    alpha_s: latency of one ring step (one message), seconds.
    bandwidth: bus bandwidth in bytes/s, as nccl-tests reports it
      (busbw = algbw * 2(n-1)/n), so ring all-reduce of B bytes over n ranks
      takes 2(n-1)*alpha + 2(n-1)/n * B / bandwidth. For the inter-node level
      of a cluster it is what one node moves (all its NICs together).
    """
    alpha_s: float
    bandwidth: float
    name: str = ""


@dataclass(frozen=True)
class Cluster:
    """Nodes of `gpus_per_node` devices joined by `intra` inside a node and
    `inter` between nodes. `hierarchical` picks the two-level all-reduce
    (reduce-scatter in the node, all-reduce of each shard across nodes, all-gather
    in the node); otherwise one flat ring over every device, paced by `inter`."""
    gpus_per_node: int
    intra: Link
    inter: Link
    hierarchical: bool = True
    name: str = ""


def ring_allreduce_time(n: int, nbytes: float, link: Link) -> float:
    """Ring all-reduce of `nbytes` over `n` ranks: 2(n-1) steps of latency
    alpha, each rank sending 2(n-1)/n of the buffer (reduce-scatter, then
    all-gather)."""
    if n < 1:
        raise ValueError(f"ring_allreduce_time: n must be >= 1, got {n}")
    if n == 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) * link.alpha_s + 2 * (n - 1) / n * nbytes / link.bandwidth


def cluster_allreduce_time(n: int, nbytes: float, cluster: Cluster) -> float:
    """All-reduce of `nbytes` over `n` devices of `cluster`. Up to one node it
    is a ring over the intra-node link. Across m = n / g nodes:
      hierarchical: intra reduce-scatter + all-gather, 2(g-1)*a_i + 2(g-1)/g * B / bw_i,
                    plus the inter-node ring all-reduce of each device's B/g shard;
                    the g shards' rings share the node's links, so together they
                    move 2(m-1)/m * B at the node's bandwidth: 2(m-1)*a_e + 2(m-1)/m * B / bw_e
      flat:         one ring over all n devices paced by the inter-node link,
                    2(n-1)*a_e + 2(n-1)/n * B / bw_e."""
    g = cluster.gpus_per_node
    if n <= g:
        return ring_allreduce_time(n, nbytes, cluster.intra)
    if not cluster.hierarchical:
        return ring_allreduce_time(n, nbytes, cluster.inter)
    if n % g:
        raise ValueError(f"cluster_allreduce_time: {n} devices is not a whole number of {g}-device nodes")
    m = n // g
    return ring_allreduce_time(g, nbytes, cluster.intra) + ring_allreduce_time(m, nbytes, cluster.inter)


# Presets. Bandwidths are bus bandwidths a tuned NCCL reaches, not line rates.
NVLINK_H200 = Link(alpha_s=2e-6, bandwidth=370 * GB, name="NVLink/NVSwitch, 8x H200 (~370 GB/s bus bw)")
IB_NDR = Link(alpha_s=5e-6, bandwidth=8 * 50 * GB, name="InfiniBand NDR, 8 NICs x ~50 GB/s per node")
ETHERNET_25G = Link(alpha_s=30e-6, bandwidth=2.9 * GB, name="25 GbE, one NIC per node (~2.9 GB/s)")

PRESETS = {
    "nvlink-ib": Cluster(8, NVLINK_H200, IB_NDR, True, "8x H200 per node (NVLink), InfiniBand NDR between nodes"),
    "nvlink-25gbe": Cluster(8, NVLINK_H200, ETHERNET_25G, True, "8x H200 per node (NVLink), 25 GbE between nodes"),
    "nvlink-ib-flat": Cluster(8, NVLINK_H200, Link(5e-6, 50 * GB, "InfiniBand NDR, ~50 GB/s per GPU"), False,
                              "8x H200 per node, one flat ring paced by one 50 GB/s NIC"),
}


def fit_alpha_beta(samples: list[tuple[float, float]], n: int) -> tuple[Link, dict]:
    """Fits time = a + b * bytes to measured all-reduce times (bytes, seconds)
    of a ring over `n` ranks, weighting by 1/time^2 (relative error, so that
    small messages fix the latency and large ones the bandwidth); then
    alpha = a / (2(n-1)) and bandwidth = 2(n-1)/n / b. A negative intercept is
    clamped to 0 and the slope refitted. Returns the link and fit statistics
    (a, b, per-sample relative error)."""
    if n < 2 or len(samples) < 2:
        raise ValueError("fit_alpha_beta needs n >= 2 and at least two sizes")
    w = [1.0 / (t * t) for _, t in samples]
    sw = sum(w)
    sx = sum(wi * x for wi, (x, _) in zip(w, samples))
    sy = sum(wi * y for wi, (_, y) in zip(w, samples))
    sxx = sum(wi * x * x for wi, (x, _) in zip(w, samples))
    sxy = sum(wi * x * y for wi, (x, y) in zip(w, samples))
    det = sw * sxx - sx * sx
    b = (sw * sxy - sx * sy) / det
    a = (sy - b * sx) / sw
    if a < 0:
        a, b = 0.0, sxy / sxx
    if b <= 0:
        raise ValueError(f"fit_alpha_beta: the fitted time does not grow with size (slope {b}); samples {samples}")
    link = Link(alpha_s=a / (2 * (n - 1)), bandwidth=2 * (n - 1) / n / b, name=f"fitted, world {n}")
    errors = [(a + b * x) / y - 1 for x, y in samples]
    return link, {"intercept_s": a, "slope_s_per_byte": b, "relative_errors": errors,
                  "max_abs_relative_error": max(abs(e) for e in errors)}


# --- DDP's buckets and the overlap schedule -----------------------------------------------------

def assign_buckets(parameter_bytes: list[int], first_bucket_bytes_cap: int, bucket_bytes_cap: int) -> list[list[int]]:
    """loom's (and PyTorch's) bucket assignment for parameters of one dtype and
    device, given their sizes in registration order: walk them in reverse; a
    bucket closes when adding the next parameter would pass its cap (the first
    bucket's cap is first_bucket_bytes_cap); a parameter larger than the cap
    gets a bucket of its own. Returns indices, buckets in launch order."""
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for k in reversed(range(len(parameter_bytes))):
        cap = first_bucket_bytes_cap if not buckets else bucket_bytes_cap
        if current and size + parameter_bytes[k] > cap:
            buckets.append(current)
            current, size = [], 0
        current.append(k)
        size += parameter_bytes[k]
    if current:
        buckets.append(current)
    return buckets


@dataclass(frozen=True)
class Bucket:
    ready_s: float  # after backward start, when its last gradient arrived
    nbytes: float


@dataclass
class Schedule:
    starts: list[float]
    dones: list[float]
    backward_s: float
    blocking: bool = False  # collectives ran on the compute thread (backward_s includes them)

    @property
    def comm_end_s(self) -> float:
        return self.dones[-1] if self.dones else 0.0

    @property
    def exposed_s(self) -> float:
        """Communication the step waits for after backward ends."""
        return max(0.0, self.comm_end_s - self.backward_s)

    @property
    def comm_s(self) -> float:
        return sum(d - s for s, d in zip(self.starts, self.dones))

    @property
    def hidden_share(self) -> float | None:
        """Share of communication time that ran before backward ended."""
        total = self.comm_s
        if total <= 0:
            return None
        if self.blocking:
            return 0.0
        hidden = sum(max(0.0, min(d, self.backward_s) - s) for s, d in zip(self.starts, self.dones))
        return hidden / total


def overlap_schedule(buckets: list[Bucket], comm_times_s: list[float], backward_s: float) -> Schedule:
    """Buckets all-reduce one at a time in bucket order (every rank issues the
    same sequence); bucket i starts when it is ready and bucket i-1 is done.
    Times are from backward start."""
    starts, dones = [], []
    previous_done = 0.0
    for bucket, comm in zip(buckets, comm_times_s, strict=True):
        start = max(bucket.ready_s, previous_done)
        previous_done = start + comm
        starts.append(start)
        dones.append(previous_done)
    return Schedule(starts, dones, backward_s)


def blocking_schedule(buckets: list[Bucket], comm_times_s: list[float], backward_s: float) -> Schedule:
    """Buckets all-reduced on the compute thread as they become ready (the shm
    backend): each collective delays the rest of backward, so bucket i starts
    at its ready time plus the collectives before it, and backward ends that
    much later. Nothing is hidden. Times are from backward start."""
    starts, dones = [], []
    delay = 0.0
    for bucket, comm in zip(buckets, comm_times_s, strict=True):
        start = max(bucket.ready_s + delay, dones[-1] if dones else 0.0)
        delay = start + comm - bucket.ready_s
        starts.append(start)
        dones.append(start + comm)
    return Schedule(starts, dones, backward_s + sum(comm_times_s), blocking=True)


def step_time(forward_s: float, backward_s: float, optimizer_s: float, schedule: Schedule, sync_s: float = 0.0) -> float:
    """forward + max(backward end, last bucket done) + optimizer, plus `sync_s`
    spent outside that (the broadcast of buffers before forward)."""
    return forward_s + sync_s + max(backward_s, schedule.comm_end_s) + optimizer_s


# --- Profiles and projections -------------------------------------------------------------------

@dataclass
class Profile:
    """One device's step at a given per-device batch: forward (with the loss),
    backward and optimizer times, and each parameter's gradient size and when
    it became ready after backward start, in registration order. `buffer_bytes`:
    what DDP broadcasts before each forward (batch-norm statistics)."""
    forward_s: float
    backward_s: float
    optimizer_s: float
    parameter_bytes: list[int]
    parameter_ready_s: list[float]
    batch_per_device: int
    buffer_bytes: int = 0
    step_samples_s: list[float] = field(default_factory=list)  # measured step times, for straggler_s
    name: str = ""
    source: str = ""  # "measured ..." or "assumption ..."
    extra: dict = field(default_factory=dict)

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s + self.optimizer_s

    def buckets(self, first_bucket_bytes_cap: int, bucket_bytes_cap: int) -> list[Bucket]:
        groups = assign_buckets(self.parameter_bytes, first_bucket_bytes_cap, bucket_bytes_cap)
        return [Bucket(max(self.parameter_ready_s[k] for k in g), sum(self.parameter_bytes[k] for k in g)) for g in groups]

    def scaled(self, batch_per_device: int) -> "Profile":
        """Compute times scaled linearly with the per-device batch (strong
        scaling moves the batch); gradient sizes stay."""
        f = batch_per_device / self.batch_per_device
        return replace(self, forward_s=self.forward_s * f, backward_s=self.backward_s * f,
                       parameter_ready_s=[r * f for r in self.parameter_ready_s], batch_per_device=batch_per_device,
                       step_samples_s=[t * f for t in self.step_samples_s])

    @staticmethod
    def from_json(d: dict) -> "Profile":
        ms = 1e-3
        params = d["parameters"]
        return Profile(forward_s=d["forward_ms"] * ms, backward_s=d["backward_ms"] * ms,
                       optimizer_s=d["optimizer_ms"] * ms, parameter_bytes=[int(p["bytes"]) for p in params],
                       parameter_ready_s=[p["ready_ms"] * ms for p in params],
                       batch_per_device=int(d["batch_per_device"]), buffer_bytes=int(d.get("buffer_bytes", 0)),
                       step_samples_s=[t * ms for t in d.get("step_samples_ms", [])],
                       name=d.get("model", ""), source=d.get("source", ""), extra=d)


@dataclass
class Prediction:
    world: int
    step_s: float
    comm_s: float
    exposed_s: float
    hidden_share: float | None
    buckets: int

    def as_dict(self) -> dict:
        return {"world": self.world, "step_ms": self.step_s * 1e3, "comm_ms": self.comm_s * 1e3,
                "exposed_comm_ms": self.exposed_s * 1e3,
                "hidden_share": None if self.hidden_share is None else round(self.hidden_share, 4),
                "buckets": self.buckets}


def expected_max(samples: list[float], n: int) -> float:
    """E[max of n independent draws] from the empirical distribution of
    `samples`: sum over the sorted values x_(i) of x_(i) * ((i/m)^n - ((i-1)/m)^n)."""
    xs = sorted(samples)
    m = len(xs)
    return sum(x * ((i / m) ** n - ((i - 1) / m) ** n) for i, x in enumerate(xs, 1))


def straggler_s(step_samples_s: list[float], world: int) -> float:
    """What meeting the slowest of `world` ranks in every all-reduce adds to
    the median step, when each rank's step varies as `step_samples_s` (one
    device's step times, seconds) and the ranks vary independently:
    E[max of world draws] - median. Zero at world 1 or without samples."""
    if world <= 1 or not step_samples_s:
        return 0.0
    return max(0.0, expected_max(step_samples_s, world) - statistics.median(step_samples_s))


def predict_step(profile: Profile, world: int, allreduce_time, first_bucket_bytes_cap: int = MiB,
                 bucket_bytes_cap: int = 25 * MiB, blocking: bool = False) -> Prediction:
    """Step time of `profile` at `world` devices; `allreduce_time(n, bytes)` gives
    one all-reduce's seconds (e.g. a ring_allreduce_time / cluster_allreduce_time
    partial). At world 1 DDP runs no collective. With the profile's
    `step_samples_s` (its device's measured step times), the wait for the
    slowest rank is added (straggler_s); without them (the GPU presets) it is
    taken as zero. `blocking`: the collectives run on the compute thread
    (blocking_schedule, the shm backend) instead of beside backward."""
    buckets = profile.buckets(first_bucket_bytes_cap, bucket_bytes_cap)
    comm = [allreduce_time(world, b.nbytes) if world > 1 else 0.0 for b in buckets]
    schedule = (blocking_schedule if blocking else overlap_schedule)(buckets, comm, profile.backward_s)
    sync = allreduce_time(world, profile.buffer_bytes) if world > 1 and profile.buffer_bytes else 0.0
    sync += straggler_s(profile.step_samples_s, world)
    return Prediction(world, step_time(profile.forward_s, schedule.backward_s, profile.optimizer_s, schedule, sync),
                      schedule.comm_s, schedule.exposed_s, schedule.hidden_share, len(buckets))


def project(profile: Profile, worlds: list[int], allreduce_time, first_bucket_bytes_cap: int = MiB,
            bucket_bytes_cap: int = 25 * MiB, global_batch: int | None = None) -> list[dict]:
    """Weak scaling (global_batch None: the profile's per-device batch on every
    device) or strong scaling (global_batch split over the devices, compute
    scaled linearly). Each row: world, step_ms, images_per_s, efficiency
    (images/s over world x images/s at world 1), comm and overlap figures."""
    def at(world):
        p = profile if global_batch is None else profile.scaled(global_batch // world)
        return p, predict_step(p, world, allreduce_time, first_bucket_bytes_cap, bucket_bytes_cap)

    p1, base = at(1)
    base_rate = p1.batch_per_device / base.step_s
    rows = []
    for n in worlds:
        p, pred = at(n)
        rate = n * p.batch_per_device / pred.step_s
        rows.append({**pred.as_dict(), "batch_per_device": p.batch_per_device, "images_per_s": rate,
                     "efficiency": rate / (n * base_rate)})
    return rows


def best_bucket_cap(profile: Profile, world: int, allreduce_time, caps_mib=(1, 5, 10, 25, 50, 100),
                    first_bucket_bytes_cap: int = MiB) -> tuple[int, list[dict]]:
    """Predicted step time for each bucket cap at `world`; returns the best cap (MiB) and the rows."""
    rows = []
    for cap in caps_mib:
        pred = predict_step(profile, world, allreduce_time, first_bucket_bytes_cap, int(cap * MiB))
        rows.append({"bucket_cap_mib": cap, **pred.as_dict()})
    best = min(rows, key=lambda r: r["step_ms"])["bucket_cap_mib"]
    return best, rows


def powers_of_two(low: int, high: int) -> list[int]:
    return [1 << k for k in range(int(math.log2(low)), int(math.log2(high)) + 1)]
