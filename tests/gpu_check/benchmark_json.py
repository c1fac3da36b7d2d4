"""The contract between loom's benchmark binaries and scripts/gpu-perf.sh, on
the CPU: resnet50_throughput's JSON line has the runs, their median, min and
max, the per-step counters (0 on the CPU) and the protocol, and
gpu-perf-summary.py turns that very line into a perf.json row.
  python3 benchmark_json.py REPO BUILD"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

repo, build = sys.argv[1], sys.argv[2]
failures = []


def expect(condition, what):
    if not condition:
        failures.append(what)


binary = os.path.join(build, "benchmarks", "resnet50_throughput")
args = ["--arch", "resnet18", "--batch", "2", "--size", "32", "--steps", "2", "--repeats", "3", "--warmup", "1",
        "--threads", "1", "--cuda-profile-step"]
run = subprocess.run([binary, *args], capture_output=True, text=True, timeout=300)
expect(run.returncode == 0, f"resnet50_throughput exits 0, not {run.returncode}: {run.stderr[-500:]}")
line = next((l for l in reversed(run.stdout.splitlines()) if l.startswith("{")), "{}")
r = json.loads(line)
runs = r.get("ms_per_step", [])
expect(len(runs) == 3 and all(ms > 0 for ms in runs), f"three runs timed: {runs}")
if runs:
    expect(abs(r.get("median_ms", -1) - statistics.median(runs)) < 1e-3 and r.get("min_ms") == min(runs)
           and r.get("max_ms") == max(runs), f"median, min and max of the runs: {r}")
    expect(abs(r.get("step_ms", -1) - r["median_ms"]) < 1e-3, "step_ms is the median")
expect(r.get("timing") == "steady_clock" and r.get("repeats") == 3 and r.get("steps") == 2 and r.get("warmup") == 1
       and r.get("size") == 32, f"the protocol in the line: {r}")
expect(r.get("launches_per_step") == 0 and r.get("syncs_per_step") == 0 and r.get("graph_fallbacks_per_step") == 0
       and r.get("graph_runs_per_step") == 0
       and set(r.get("sync_kinds_per_step", {})) == {"stream", "event", "device", "device_to_host_copy", "blocking_copy"},
       "no CUDA counts on the CPU, every kind of host sync named")
expect(r.get("loss_last", 99) < r.get("loss_first", 0), "the loss fell")

with tempfile.TemporaryDirectory() as work:
    step = "loom.resnet50_cifar_b128.O0.default"
    with open(os.path.join(work, step + ".log"), "w") as f:
        f.write(run.stdout)
    summary = subprocess.run([sys.executable, os.path.join(repo, "scripts", "gpu-perf-summary.py"), work, work,
                              "cpu", step], capture_output=True, text=True, timeout=60)
    expect(summary.returncode == 0, f"gpu-perf-summary.py exits 0: {summary.stderr[-500:]}")
    try:
        with open(os.path.join(work, "perf.json")) as f:
            rows = json.load(f)
    except (OSError, ValueError) as e:
        rows = []
        expect(False, f"perf.json written: {e}")
    row = rows[0] if rows else {}
    expect(row.get("loom_median_ms") == r.get("median_ms") and row.get("loom_variant") == "default"
           and row.get("launches_per_step") == 0 and row.get("syncs_per_step") == 0
           and row.get("variants", {}).get("default", {}).get("ms_per_step") == runs,
           f"the row gpu-perf-summary.py makes of it: {row}")

for f in failures:
    print("FAILED:", f)
print(f"benchmark JSON: {len(failures)} failed expectations")
sys.exit(1 if failures else 0)
