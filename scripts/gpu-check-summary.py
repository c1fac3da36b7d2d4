#!/usr/bin/env python3
"""The figures of scripts/gpu-check.sh's summary.json ("figures"), read
from the logs its steps left in WORK (WORK/STEP.log), printed as JSON:
  machine            what the env step found (GPU, driver, nvcc, gcc, OS, PyTorch, cuDNN)
  steps              per gpu test suite: test cases, passed, failed, tests cut at the
                     per-test timeout; per train_mnist and staged.* run: accuracy, images/s
                     (staged.*: processes, backend); per sanitizer.* step: compute-sanitizer's
                     errors (racecheck's hazards), whether it refused the GPU, and the test
                     cases or the app's figures of what ran under it
  benchmarks.convnet one row per arithmetic: "convnet f32 (TF32 off)", "convnet TF32",
                     "convnet channels-last autocast f16", loom's and PyTorch's images/s
  benchmarks.resnet50_cifar  ResNet-50 (CIFAR stem, batch 128) per precision: "resnet50 f32
                     (TF32 off)" (loom O0, PyTorch f32), "resnet50 f16" (loom O2, PyTorch
                     autocast f16; its channels-last figure beside), "resnet50 bf16"
  ratios             loom / PyTorch images/s per row, of both tables
  scaling_resnet50   ResNet-50 per world (weak scaling over NCCL), DDP against the bare
                     model, the all-reduce fit, the cluster projection from this GPU's profile

  python3 scripts/gpu-check-summary.py WORK STEP...

Every figure is optional: a step that failed, was cut or never ran leaves its
figures out, and the output stays valid whatever the logs hold.
"""
import json
import os
import re
import sys
from gpu_summary_common import json_lines, read as read_file

ROWS = {  # benchmark row -> (loom's flags, PyTorch's mode)
    "convnet f32 (TF32 off)": ((False, False, "none"), "eager_f32"),
    "convnet TF32": ((True, False, "none"), "eager_tf32"),
    "convnet channels-last autocast f16": ((False, True, "f16"), "channels_last_autocast_f16"),
}


def read(work, name):
    return read_file(os.path.join(work, name))


def env_figures(text):
    machine = {}
    for line in text.split("\n--- nvidia-smi")[0].splitlines():
        m = re.match(r"^([a-z_]+): (.*)$", line)
        if m:
            machine[m.group(1)] = m.group(2).strip()
    return machine


def test_figures(text):
    figures = {}
    counts = re.findall(r"test cases:\s*(\d+) \|\s*(\d+) passed \|\s*(\d+) failed(?: \|\s*(\d+) skipped)?", text)
    if counts:
        cases, passed, failed, skipped = counts[-1]
        figures.update(cases=int(cases), passed=int(passed), failed=int(failed), skipped=int(skipped or 0))
    assertions = re.findall(r"assertions:\s*(\d+) \|\s*(\d+) passed \|\s*(\d+) failed", text)
    if assertions:
        figures["assertions"] = {"total": int(assertions[-1][0]), "failed": int(assertions[-1][2])}
    timeouts = re.findall(r"Test\s+#\d+: (\S+) \.+\*\*\*Timeout", text)
    if timeouts:
        figures["timed_out_tests"] = timeouts
    if "skipped: no CUDA device visible" in text:
        figures["no_cuda_device"] = True
    devices = re.search(r"CUDA devices: (\d+)", text)
    if devices:
        figures["cuda_devices"] = int(devices.group(1))
    return figures


def loom_key(row):
    return (bool(row.get("tf32", False)), bool(row.get("channels_last", False)), row.get("autocast", "none"))


def benchmark_table(steps, work):
    loom, torch = [], []
    for step in steps:
        if step["name"].startswith("bench.loom"):
            loom += [r for r in json_lines(read(work, step["name"] + ".log")) if r.get("bench") == "loom convnet train"]
        elif step["name"] == "bench.torch_convnet":
            torch += [r for r in json_lines(read(work, step["name"] + ".log")) if r.get("bench") == "torch convnet train"]
    table = []
    for label, (flags, mode) in ROWS.items():
        ours = next((r for r in loom if loom_key(r) == flags), None)
        theirs = next((r for r in torch if r.get("mode") == mode), None)
        if not ours and not theirs:
            continue
        row = {"row": label, "loom_images_per_s": ours and ours.get("images_per_s"),
               "torch_images_per_s": theirs and theirs.get("images_per_s"),
               "loom_peak_allocated_mb": ours and ours.get("peak_allocated_mb"),
               "torch_peak_allocated_mb": theirs and theirs.get("peak_allocated_mb")}
        if row["loom_images_per_s"] and row["torch_images_per_s"]:
            row["loom_vs_torch"] = round(row["loom_images_per_s"] / row["torch_images_per_s"], 3)
        table.append(row)
    return table, loom, torch


RESNET_ROWS = {  # row -> (loom's --amp, PyTorch's --amp)
    "resnet50 f32 (TF32 off)": ("O0", "none"),
    "resnet50 f16": ("O2", "f16"),
    "resnet50 bf16": ("bf16", "bf16"),
}


def resnet_table(work):
    rows = json_lines(read(work, "bench.resnet50_cifar.log"))
    loom = [r for r in rows if r.get("bench") == "loom resnet50 train"]
    torch = [r for r in rows if str(r.get("peer", "")).startswith("torch")]
    table = []
    for label, (amp, mode) in RESNET_ROWS.items():
        ours = next((r for r in loom if r.get("amp") == amp), None)
        theirs = next((r for r in torch if r.get("amp") == mode and not r.get("channels_last")), None)
        channels_last = next((r for r in torch if r.get("amp") == mode and r.get("channels_last")), None)
        if not ours and not theirs:
            continue
        row = {"row": label, "loom_images_per_s": ours and ours.get("images_per_s"),
               "torch_images_per_s": theirs and theirs.get("images_per_s")}
        if channels_last:
            row["torch_channels_last_images_per_s"] = channels_last.get("images_per_s")
        if row["loom_images_per_s"] and row["torch_images_per_s"]:
            row["loom_vs_torch"] = round(row["loom_images_per_s"] / row["torch_images_per_s"], 3)
        table.append(row)
    return table, loom, torch


def train_figures(text):
    figures = {}
    for key, pattern, kind in (("test_accuracy", r"Test accuracy: ([0-9.]+)", float),
                               ("images_per_s", r"Throughput: ([0-9.]+) images/s", float),
                               ("training_time", r"Training complete in: (\S+)", str),
                               ("cuda_memory", r"CUDA memory: (.*)", str)):
        m = re.search(pattern, text)
        if m:
            figures[key] = kind(m.group(1))
    return figures


def staged_figures(text):
    figures = train_figures(text)
    m = re.search(r"Distributed: (\d+) processes \([^)]*\), backend (\S+?),", text)
    if m:
        figures.update(processes=int(m.group(1)), backend=m.group(2))
    return figures


def sanitizer_figures(text):
    figures = {}
    errors = re.findall(r"ERROR SUMMARY: (\d+) errors?", text)
    if errors:
        figures["errors"] = int(errors[-1])
    hazards = re.findall(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", text)
    if hazards:
        figures["hazards"] = {"displayed": int(hazards[-1][0]), "errors": int(hazards[-1][1]),
                              "warnings": int(hazards[-1][2])}
    if re.search(r"Device not supported|not supported on this (device|platform)", text):
        figures["refused_device"] = True
    tests = test_figures(text)
    tests.pop("no_cuda_device", None)
    figures.update(tests)
    figures.update(train_figures(text))
    return figures


def scaling_figures(work):
    path = os.path.join(work, "scaling", "scaling-resnet50-gpu.json")
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError):
        return {}
    keep = ("mode", "world", "batch_per_rank", "step_ms", "images_per_s", "efficiency", "comm_ms", "hidden_share")
    figures = {"points": [{k: p.get(k) for k in keep} for p in report.get("points", [])],
               "ddp_vs_bare_world1": report.get("ddp_overhead_world1", []),
               "problems": report.get("problems", [])}
    if report.get("allreduce"):
        a = report["allreduce"]
        figures["allreduce"] = {k: a.get(k) for k in ("world", "backend", "alpha_us", "bus_bandwidth_gbs")}
    projected = report.get("projection_measured", {}).get("clusters", {})
    figures["projection_from_measured_profile"] = {
        name: {str(r.get("world")): r.get("efficiency") for r in c.get("weak_scaling", []) if r.get("world") in (8, 64, 512)}
        for name, c in projected.items()}
    return figures


def main():
    work, names = sys.argv[1], sys.argv[2:]
    steps = {}
    gpu_count = None
    machine = env_figures(read(work, "env.log"))
    try:
        gpu_count = int(machine.get("gpu_count", ""))
    except ValueError:
        pass
    for name in names:
        text = read(work, name + ".log")
        if name.startswith("gpu.") and text:
            steps[name] = test_figures(text)
            if name == "gpu.nccl":
                steps[name]["world"] = gpu_count
        elif name == "train_mnist" and text:
            steps[name] = train_figures(text)
        elif name.startswith("staged.") and text:
            steps[name] = staged_figures(text)
        elif name.startswith("sanitizer.") and text:
            steps[name] = sanitizer_figures(text)
    table, loom, torch = benchmark_table([{"name": n} for n in names], work)
    resnet, resnet_loom, resnet_torch = resnet_table(work)
    figures = {"machine": machine, "steps": steps,
               "benchmarks": {"convnet": table, "loom_rows": loom, "torch_rows": torch,
                              "resnet50_cifar": resnet, "resnet50_loom_rows": resnet_loom,
                              "resnet50_torch_rows": resnet_torch},
               "ratios": {r["row"]: r["loom_vs_torch"] for r in table + resnet if "loom_vs_torch" in r},
               "scaling_resnet50": scaling_figures(work)}
    json.dump(figures, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
