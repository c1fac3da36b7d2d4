#!/usr/bin/env python3
"""The figures of scripts/gpu-perf.sh, read from the logs its steps left in
WORK (WORK/STEP.log, the profilers' WORK/kernels.KEY.csv, WORK/setup.txt,
WORK/gpu-before.csv and gpu-after.csv):

  python3 scripts/gpu-perf-summary.py WORK OUT GPU STEP...
      prints summary.json's "figures" (setup, the GPU's state before and after,
      the rows, per-kernel times) and writes OUT/perf.json (the rows) and, once
      something was profiled, OUT/kernels.json, each replaced atomically
  python3 scripts/gpu-perf-summary.py --table OUT/perf.json
      prints the rows as a table

One row per workload and precision (steps loom.W.A.V and peer.W.A): loom's
fastest variant by median ms per step against the peer's fastest mode by median
(ratio_vs_peer_best = peer ms / loom ms, above 1 when loom is faster), with
that variant's launches and host syncs per step and both sides' peak GPU
memory, and every variant and mode beside. Every figure is optional: a step
that failed, was cut or never ran leaves its figures out (with what its log
says), and the output stays valid whatever the logs hold.
"""
import csv
import io
import json
import os
import re
import sys
from gpu_summary_common import json_lines, read

KERNEL_TOP = 20  # kernels listed per profiled step, by total time


def last_words(text):
    """What a step that left no figures said last (its error, usually)."""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    return lines[-1][:300] if lines else "no output"


def key_value_file(text):
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_0-9]+): (.*)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def gpu_state(work, name):
    """nvidia-smi's CSV query (header and one line per GPU) as a dict for GPU 0."""
    state = {}
    for suffix in ("", "-reasons"):
        rows = list(csv.reader(io.StringIO(read(os.path.join(work, f"gpu-{name}{suffix}.csv")))))
        if len(rows) >= 2 and len(rows[0]) == len(rows[1]):
            state.update({h.strip(): v.strip() for h, v in zip(rows[0], rows[1])})
        elif rows and suffix == "":
            state["error"] = " ".join(" ".join(r) for r in rows)[:300]
    return state


BANDWIDTH_KEYS = ("shape", "dtype", "layout", "fusion", "pass", "kernels", "median_ms", "gbs", "pass_gbs", "peak_gbs",
                  "fraction_of_peak", "speedup_vs_v1", "max_rel_diff", "check")


def loom_figures(text):
    """The loom benchmark's JSON line, or why there is none; batch_norm_bandwidth's
    lines (one per configuration and kernels) as a "bandwidth" list."""
    lines = [r for r in json_lines(text) if str(r.get("bench", "")).startswith("loom")]
    bandwidth = [r for r in lines if r.get("bench") == "loom batch_norm_bandwidth"]
    if bandwidth:
        return {"bandwidth": [{k: r.get(k) for k in BANDWIDTH_KEYS} for r in bandwidth]}
    if lines:
        r = lines[-1]
        keep = ("median_ms", "min_ms", "max_ms", "ms_per_step", "repeats", "steps", "warmup", "timing",
                "launches_per_step", "kernel_launches_per_step", "library_calls_per_step", "device_copies_per_step",
                "syncs_per_step", "sync_kinds_per_step", "peak_allocated_bytes", "peak_reserved_bytes",
                "peak_allocated_bytes_runs", "peak_reserved_bytes_runs",
                "images_per_s", "skipped_steps", "graph_runs_per_step", "graph_fallbacks_per_step", "cuda_graph",
                "gpu")
        return {k: r[k] for k in keep if k in r}
    skipped = re.findall(r"skipped: (.*)", text)
    if skipped:
        return {"skipped": skipped[-1].strip()}
    return {"error": last_words(text)} if text else {"error": "did not run"}


def peer_modes(text, kind):
    """Each peer mode's figures (median ms, runs, peak bytes) or its error / skip."""
    modes = {}
    for r in json_lines(text):
        mode = r.get("mode")
        if not mode:
            continue
        if kind == "convnet":
            if r.get("bench") != "torch convnet train":
                continue
            modes[mode] = {"median_ms": r.get("step_ms"), "ms_per_step": [r.get("step_ms")],
                           "timing": "mean of one run (wall clock, host copies included)",
                           "peak_bytes": None if r.get("peak_allocated_mb") is None
                           else int(r["peak_allocated_mb"] * 2**20), "torch": r.get("torch")}
        elif "median_ms" in r:
            modes[mode] = {"median_ms": r["median_ms"], "ms_per_step": r.get("ms_per_step"),
                           "peak_bytes": r.get("peak_bytes"), "torch": r.get("torch"), "cudnn": r.get("cudnn")}
        elif "error" in r or "skipped" in r:
            modes[mode] = {k: r[k] for k in ("error", "skipped") if k in r}
    return modes


def kernel_table(path):
    """Per-kernel times of one profiled step from ncu's or nsys's CSV: kernels,
    GPU time, the longest kernels; None when the file holds no table."""
    text = read(path)
    if not text:
        return None
    lines = text.splitlines()
    header_at = next((i for i, l in enumerate(lines) if '"Kernel Name"' in l and '"Metric Value"' in l), None)
    totals = {}  # name -> [count, ns]
    tool = None
    if header_at is not None:  # ncu --csv: one row per kernel and metric
        tool = "ncu"
        scale = {"ns": 1, "nsecond": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}
        for row in csv.DictReader(io.StringIO("\n".join(lines[header_at:]))):
            if row.get("Metric Name") != "gpu__time_duration.sum":
                continue
            try:
                ns = float(str(row.get("Metric Value", "")).replace(",", "")) * scale.get(row.get("Metric Unit", "ns"), 1)
            except ValueError:
                continue
            entry = totals.setdefault(row.get("Kernel Name", "?"), [0, 0.0])
            entry[0] += 1
            entry[1] += ns
    else:  # nsys stats --report cuda_gpu_kern_sum --format csv
        header_at = next((i for i, l in enumerate(lines) if "Total Time (ns)" in l and "Name" in l), None)
        if header_at is None:
            return None
        tool = "nsys"
        for row in csv.DictReader(io.StringIO("\n".join(lines[header_at:]))):
            try:
                count = int(str(row.get("Instances", "0")).replace(",", ""))
                ns = float(str(row.get("Total Time (ns)", "0")).replace(",", ""))
            except ValueError:
                continue
            entry = totals.setdefault(row.get("Name", "?"), [0, 0.0])
            entry[0] += count
            entry[1] += ns
    if not totals:
        return None
    total_ns = sum(ns for _, ns in totals.values())
    top = sorted(totals.items(), key=lambda kv: -kv[1][1])[:KERNEL_TOP]
    return {"tool": tool, "kernels_per_step": sum(c for c, _ in totals.values()),
            "distinct_kernels": len(totals), "gpu_ms_per_step": round(total_ns / 1e6, 3),
            "top": [{"name": name[:160], "count": c, "total_us": round(ns / 1e3, 1),
                     "share": round(ns / total_ns, 4) if total_ns else None} for name, (c, ns) in top]}


def row_amp(workload, amp):
    return "autocast_f16" if workload.startswith("convnet") and amp == "O2" else amp


def build_rows(work, gpu, names, profiler):
    groups = {}  # (workload, amp) -> {"variants": {}, "peer": None}, in step order
    kernels = {}
    for name in names:
        parts = name.split(".")
        if parts[0] == "loom" and len(parts) == 4:
            groups.setdefault((parts[1], parts[2]), {"variants": {}, "peer": None})["variants"][parts[3]] = \
                loom_figures(read(os.path.join(work, name + ".log")))
        elif parts[0] == "peer" and len(parts) == 3:
            kind = "convnet" if parts[1].startswith("convnet") else "resnet"
            text = read(os.path.join(work, name + ".log"))
            modes = peer_modes(text, kind)
            groups.setdefault((parts[1], parts[2]), {"variants": {}, "peer": None})["peer"] = \
                modes if modes else {"(none)": {"error": last_words(text) if text else "did not run"}}
        elif parts[0] == "kernels" and len(parts) == 4:
            key = ".".join(parts[1:])
            table = kernel_table(os.path.join(work, f"kernels.{key}.csv"))
            if table:
                kernels[key] = table
    rows = []
    for (workload, amp), g in groups.items():
        timed = {v: f for v, f in g["variants"].items() if isinstance(f.get("median_ms"), (int, float))}
        best_variant = min(timed, key=lambda v: timed[v]["median_ms"]) if timed else None
        loom = timed.get(best_variant, {})
        peer = g["peer"] or {}
        timed_modes = {m: f for m, f in peer.items() if isinstance(f.get("median_ms"), (int, float))}
        best_mode = min(timed_modes, key=lambda m: timed_modes[m]["median_ms"]) if timed_modes else None
        peer_best = timed_modes.get(best_mode, {})
        ratio = None
        if loom.get("median_ms") and peer_best.get("median_ms"):
            ratio = round(peer_best["median_ms"] / loom["median_ms"], 3)
        profiled = kernels.get(f"{workload}.{amp}.{best_variant}") if best_variant else None
        rows.append({
            "workload": workload, "amp": row_amp(workload, amp), "gpu": gpu,
            "loom_median_ms": loom.get("median_ms"), "loom_min_ms": loom.get("min_ms"),
            "loom_max_ms": loom.get("max_ms"), "loom_variant": best_variant,
            "peer_best_mode": best_mode, "peer_best_median_ms": peer_best.get("median_ms"),
            "ratio_vs_peer_best": ratio,
            "launches_per_step": loom.get("launches_per_step"), "syncs_per_step": loom.get("syncs_per_step"),
            "loom_peak_bytes": loom.get("peak_allocated_bytes"), "peer_peak_bytes": peer_best.get("peak_bytes"),
            "kernels_per_step_profiled": profiled["kernels_per_step"] if profiled else None,
            "kernels": ("profiled: kernels.json " + f"{workload}.{amp}.{best_variant}") if profiled
            else ("not available: " + profiler if profiler.startswith("none") else "not profiled"),
            "variants": g["variants"], "peer_modes": peer,
        })
    return rows, kernels


def replace_file(path, value):
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def mib(value):
    return "-" if value is None else f"{value / 2**20:.0f}"


def number(value, digits=2):
    return "-" if value is None else f"{value:.{digits}f}"


def print_table(path):
    try:
        with open(path) as f:
            rows = json.load(f)
    except (OSError, ValueError) as e:
        print(f"gpu-perf: no table: {path} is missing or not JSON ({e})")
        return
    gpus = sorted({str(r.get("gpu")) for r in rows})
    print(f"gpu-perf: loom against the peer's best mode on {', '.join(gpus) or 'no GPU'} (ms per step, median)")
    head = (f"{'workload':27} {'amp':12} {'loom ms':>8} {'variant':14} {'peer ms':>8} {'best mode':14} "
            f"{'peer/loom':>9} {'launches':>8} {'syncs':>6} {'MiB loom':>8} {'MiB peer':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['workload']:27} {r['amp']:12} {number(r.get('loom_median_ms')):>8} {str(r.get('loom_variant') or '-'):14} "
              f"{number(r.get('peer_best_median_ms')):>8} {str(r.get('peer_best_mode') or '-'):14} "
              f"{number(r.get('ratio_vs_peer_best'), 3):>9} {number(r.get('launches_per_step'), 0):>8} "
              f"{number(r.get('syncs_per_step'), 1):>6} {mib(r.get('loom_peak_bytes')):>8} {mib(r.get('peer_peak_bytes')):>8}")
    bandwidth = [b for r in rows for v in (r.get("variants") or {}).values() if isinstance(v, dict)
                 for b in v.get("bandwidth") or []]
    if bandwidth:
        print("gpu-perf: batch norm's passes in GB/s (bytes no implementation avoids / median time), "
              "the fraction of the GPU's peak, and the speed-up over v1")
        for b in bandwidth:
            shape = "x".join(str(d) for d in b.get("shape") or [])
            print(f"  {shape:16} {str(b.get('dtype')):5} {str(b.get('layout')):5} {str(b.get('fusion')):9} "
                  f"{str(b.get('pass')):9} {str(b.get('kernels')):3} {number(b.get('gbs'), 0):>6} GB/s "
                  f"{number(b.get('fraction_of_peak'), 3):>6} {number(b.get('speedup_vs_v1'), 2):>5}x "
                  f"{str(b.get('check'))}")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--table":
        print_table(sys.argv[2])
        return
    if len(sys.argv) < 4:
        sys.exit("usage: gpu-perf-summary.py WORK OUT GPU STEP... | --table PERF_JSON")
    work, out, gpu, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    setup = key_value_file(read(os.path.join(work, "setup.txt")))
    rows, kernels = build_rows(work, gpu, names, setup.get("profiler", "none (not recorded)"))
    replace_file(os.path.join(out, "perf.json"), rows)
    if kernels:
        replace_file(os.path.join(out, "kernels.json"), kernels)
    figures = {"setup": setup,
               "gpu_state": {"before": gpu_state(work, "before"), "after": gpu_state(work, "after")},
               "rows": rows, "kernels": kernels}
    json.dump(figures, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
