"""Bookkeeping of DDP's per-step timestamps (scaling_step's JSON): how long
the bucket all-reduces ran, how much of that was hidden behind backward, what
the step waited for after backward, and the robust summaries over steps.

A step record (ms from the step's start, as scaling_step writes it):
  {"step_ms", "forward_ms", "backward_start_ms", "backward_end_ms", "reduced_ms",
   "optimizer_ms", "buckets": [{"bytes", "ready_ms", "launched_ms", "started_ms", "done_ms"}, ...]}
A bucket's started_ms may be null (no collective ran, or the backend did not
say); it is then taken as max(launched, previous bucket's done), which is when
an in-order backend can start it.
"""
from __future__ import annotations

import statistics


def bucket_intervals(step: dict) -> list[tuple[float, float]]:
    """(start, done) of each bucket's collective, in bucket order; empty when
    no collective ran (world 1)."""
    intervals = []
    previous_done = None
    for b in step.get("buckets", []):
        done = b.get("done_ms")
        if done is None or b.get("launched_ms") is None:
            continue
        start = b.get("started_ms")
        if start is None:
            start = b["launched_ms"] if previous_done is None else max(b["launched_ms"], previous_done)
        intervals.append((start, max(start, done)))
        previous_done = done
    return intervals


def communication(step: dict, blocking: bool = False) -> dict:
    """comm_ms: total time collectives ran; hidden_ms: the part before backward
    ended; hidden_share = hidden / comm (None without communication);
    exposed_ms: time from backward end until every bucket was reduced.
    `blocking`: the collectives ran on the compute thread (the shm backend),
    so backward waited for each of them: none of it is hidden, all of it is
    exposed, though it lies before backward's end."""
    intervals = bucket_intervals(step)
    backward_start = step["backward_start_ms"]
    backward_end = step["backward_end_ms"]
    comm = sum(d - s for s, d in intervals)
    if blocking:
        return {"comm_ms": comm, "hidden_ms": 0.0, "hidden_share": 0.0 if comm > 0 else None, "exposed_ms": comm}
    hidden = sum(max(0.0, min(d, backward_end) - max(s, backward_start)) for s, d in intervals)
    reduced = step.get("reduced_ms")
    exposed = max(0.0, reduced - backward_end) if reduced is not None else 0.0
    return {"comm_ms": comm, "hidden_ms": hidden, "hidden_share": hidden / comm if comm > 0 else None,
            "exposed_ms": exposed}


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize_steps(steps: list[dict], blocking: bool = False) -> dict:
    """Medians over steps of the step phases and the communication figures
    (`blocking` as for communication). hidden_share is the median step's share
    (robust to one slow step)."""
    comms = [communication(s, blocking) for s in steps]
    return {
        "step_ms": median([s["step_ms"] for s in steps]),
        "forward_ms": median([s["forward_ms"] for s in steps]),
        "backward_ms": median([s["backward_end_ms"] - s["backward_start_ms"] for s in steps]),
        "optimizer_ms": median([s["optimizer_ms"] for s in steps]),
        "comm_ms": median([c["comm_ms"] for c in comms]),
        "hidden_share": median([c["hidden_share"] for c in comms]),
        "exposed_comm_ms": median([c["exposed_ms"] for c in comms]),
        "steps": len(steps),
    }


def merge_ranks(ranks: list[list[dict]]) -> list[dict]:
    """One record per step for the whole group, from each rank's records of
    the same steps: the step time is the slowest rank's (the ranks meet in
    every all-reduce, so the group runs at that pace); the phases and bucket
    timestamps are those of the rank whose backward ended last. That rank
    arrives last at each collective, so its (started, done) intervals hold the
    collective itself, where an earlier rank's also hold its wait for the
    straggler."""
    count = min(len(r) for r in ranks)
    merged = []
    for i in range(count):
        records = [r[i] for r in ranks]
        straggler = max(records, key=lambda s: s["backward_end_ms"])
        merged.append({**straggler, "step_ms": max(s["step_ms"] for s in records)})
    return merged


def slowest_rank_steps(ranks: list[list[dict]]) -> list[float]:
    """Per step, the slowest rank's step time."""
    return [s["step_ms"] for s in merge_ranks(ranks)]


def block_overhead(ddp_steps: list[dict], bare_steps: list[dict]) -> dict:
    """DDP's cost over the bare model from interleaved blocks of steps (each
    record carries its "block"): per block the ratio of median step times
    (blocks run back to back see the same machine load), then the median of
    those ratios; also the ratio of the pooled medians."""
    ratios = []
    for block in sorted({s["block"] for s in ddp_steps}):
        ddp = [s["step_ms"] for s in ddp_steps if s["block"] == block]
        bare = [s["step_ms"] for s in bare_steps if s["block"] == block]
        if ddp and bare:
            ratios.append(statistics.median(ddp) / statistics.median(bare))
    ddp_all = [s["step_ms"] for s in ddp_steps]
    bare_all = [s["step_ms"] for s in bare_steps]
    return {"ddp_step_ms": statistics.median(ddp_all), "bare_step_ms": statistics.median(bare_all),
            "overhead": statistics.median(ratios) - 1 if ratios else None,
            "overhead_pooled": statistics.median(ddp_all) / statistics.median(bare_all) - 1,
            "blocks": len(ratios)}
