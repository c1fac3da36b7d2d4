#!/usr/bin/env bash
# train_mnist --trace: a short world-2 run under loomrun (gloo on loopback, one
# data worker) writes one Chrome trace per rank; each parses as JSON (python3's
# json) and holds op events (conv2d, conv2d backward), DDP bucket events
# (ready, launched on the training thread; reduce and done on gloo's
# communication thread), data waits and batch builds on the data worker's
# thread, with nonnegative durations. A world-1 run writes the file named, and
# an unwritable --trace path fails before training.
# Usage: train_mnist_trace.sh TRAIN_MNIST LOOMRUN
set -u
train_mnist=$1
loomrun=$2
source "$(dirname "$0")/dist_common.sh"
make_work_dir 400 100
args=(--data "$work/data" --epochs 1 --batch-size 20 --max-steps 6 --log-interval 2 --threads 1 --workers 1
      --checkpoint-dir '')

timeout 120 "$loomrun" --standalone --nproc_per_node=2 "$train_mnist" "${args[@]}" --backend gloo \
  --trace "$work/trace.json" >"$work/2.out" 2>"$work/2.err" || fail "the world-2 run failed: $(cat "$work/2.err")"
grep -q "Wrote the trace to $work/trace.rank0.json" "$work/2.out" || fail "rank 0 did not name its trace: $(cat "$work/2.out")"

check_trace() {  # FILE WORLD
  python3 - "$1" "$2" <<'PY' || fail "$1: see above"
import json, sys
path, world = sys.argv[1], int(sys.argv[2])
trace = json.load(open(path))
events = [e for e in trace["traceEvents"] if e["ph"] != "M"]
threads = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
problems = []
def expect(condition, message):
    if not condition: problems.append(message)
for e in events:
    expect(e["ph"] in ("X", "i"), f"unexpected phase {e}")
    expect(all(k in e for k in ("name", "cat", "pid", "tid", "ts")), f"missing fields in {e}")
    if e["ph"] == "X": expect(e["dur"] >= 0, f"negative duration in {e}")
def named(name, cat):
    return [e for e in events if e["name"] == name and e["cat"] == cat]
for op in ("conv2d", "conv2d backward", "linear", "cross_entropy"):
    expect(len(named(op, "op")) >= 6, f"fewer than 6 '{op}' events (6 steps)")
main = named("conv2d", "op")[0]["tid"] if named("conv2d", "op") else None
expect(threads.get(main) == "main", f"the training thread is named {threads.get(main)!r}")
waits = named("data wait", "data")
expect(len(waits) >= 6, "fewer than 6 data waits")
expect(all(e["tid"] == main for e in waits), "a data wait is not on the training thread")
builds = named("build batch", "data")
expect(builds and all(threads.get(e["tid"]) == "data worker" for e in builds), "batches are not built on a 'data worker' thread")
expect(trace["otherData"]["dropped_events"] == 0, "events were dropped")
if world > 1:
    for phase in ("ready", "launched"):
        found = named(f"bucket 0 {phase}", "ddp")
        expect(len(found) >= 6 and all(e["tid"] == main and e["ph"] == "i" for e in found),
               f"'bucket 0 {phase}' is missing or not an instant on the training thread")
    for name, phase in (("bucket 0 reduce", "X"), ("bucket 0 done", "i")):
        found = named(name, "ddp")
        expect(len(found) >= 6 and all(threads.get(e["tid"]) == "gloo communication" and e["ph"] == phase for e in found),
               f"'{name}' is missing or not on the gloo communication thread")
    for reduce in named("bucket 0 reduce", "ddp"):
        ready = max(e["ts"] for e in named("bucket 0 ready", "ddp") if e["ts"] <= reduce["ts"])
        expect(ready <= reduce["ts"], "a bucket was reduced before it was ready")
    expect(any(e["cat"] == "collective" and e["name"].startswith("all_reduce") for e in events),
           "no all_reduce collective event")
if problems:
    print(path + ":\n  " + "\n  ".join(problems))
    sys.exit(1)
PY
}
check_trace "$work/trace.rank0.json" 2
check_trace "$work/trace.rank1.json" 2

# World 1: the file as named.
timeout 120 "$train_mnist" "${args[@]}" --trace "$work/one.json" >"$work/1.out" 2>"$work/1.err" ||
  fail "the world-1 run failed: $(cat "$work/1.err")"
check_trace "$work/one.json" 1

# An unwritable path: an error naming it, before any training.
"$train_mnist" "${args[@]}" --trace "$work/no-such-dir/trace.json" >"$work/bad.out" 2>"$work/bad.err" &&
  fail "an unwritable --trace path was accepted"
grep -q -- "--trace $work/no-such-dir/trace.json: cannot write this file" "$work/bad.err" || fail "the error does not name --trace: $(cat "$work/bad.err")"
if grep -q "Step \[" "$work/bad.out"; then fail "training ran despite the bad --trace path"; fi
echo "PASS"
