"""What each scenario of perf_rehearsal.sh must show; prints every failed
expectation and exits 1 if there was one. The figures the fakes print: loom
(fake_binary.c) 10 ms per step at O2 / bf16 and 40 at O0 with the CIFAR stem,
10x with ImageNet's, the ConvNet 1.0 (f32) and 0.8 ms (autocast f16), each 0.8x
with --channels-last; the ResNet peer (fake_torch_resnet_gpu.py) eager 16,
channels_last 12, cuda_graph 11, compile 9 ms in f16 / bf16 and 42, 44, 41, 43
in f32; the ConvNet peer 1.25 ms (f32) and 0.833 (channels-last autocast f16).
  python3 perf_expect.py TMP"""
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scenario_checks import expect, lines, load, packed, report, statuses  # noqa: E402

tmp = sys.argv[1]
CIFAR, IMAGENET, CONVNET = "resnet50_cifar_b128", "resnet50_imagenet224_b256", "convnet_b100"


def perf_rows(d, scenario):
    try:
        with open(os.path.join(d, "out", "perf.json")) as f:
            rows = json.load(f)
    except (OSError, ValueError) as e:
        expect(False, scenario, f"perf.json is missing or not valid JSON: {e}")
        return {}
    expect(isinstance(rows, list), scenario, "perf.json is a list of rows")
    return {(r.get("workload"), r.get("amp")): r for r in rows}


def row_is(rows, key, want, scenario):
    row = rows.get(key)
    if row is None:
        expect(False, scenario, f"a row for {key} in perf.json, among {sorted(rows)}")
        return {}
    for field, value in want.items():
        got = row.get(field)
        same = abs(got - value) < 1e-6 if isinstance(value, float) and isinstance(got, (int, float)) else got == value
        expect(same, scenario, f"{key} {field} = {value!r}, not {got!r}")
    return row


# Bad usage: one line naming what is wrong, exit 2, before anything runs.
for name, words in (("--workloads", "resnet9"), ("--workloads", "MODEL_s32_b128"), ("--amps", "fp8"), ("--deadline", "soon"), ("variants", "nocolon")):
    text = lines(os.path.join(tmp, f"bad.{name}.txt"))
    expect(len(text) == 2 and text[-1] == "2" and words in text[0], "usage",
           f"{name}: one line naming '{words}' and exit status 2, not {text}")

# P: a fresh machine; the deadline cuts the hanging ImageNet O0 run.
s, st, sampler, rc, wall, d = load("P")
deadline = 16
statuses(st, {"configure": "ok", "data": "ok", "build": "ok", f"loom.{CIFAR}.O0.default": "ok",
              f"peer.{CIFAR}.O0": "ok", f"loom.{CIFAR}.O0.channels_last": "skipped",
              f"loom.{IMAGENET}.O0.default": "timed_out", f"peer.{IMAGENET}.O0": "skipped",
              f"loom.{CONVNET}.O0.default": "skipped", f"loom.{CIFAR}.O2.default": "skipped",
              f"kernels.{CIFAR}.O0.default": "skipped"}, "P")
note = st.get(f"loom.{CIFAR}.O0.channels_last", {}).get("note", "")
expect("resnet50_throughput does not know --channels-last" in note, "P", f"the unknown variant's note: {note!r}")
expect(st.get(f"peer.{IMAGENET}.O0", {}).get("note", "").startswith("deadline"), "P", "later steps skipped by the deadline")
expect("LOOM_PERF_PROFILER=none" in st.get(f"kernels.{CIFAR}.O0.default", {}).get("note", ""), "P",
       "per-kernel times recorded as not available")
expect(rc == 1 and s.get("ok") is False and s.get("finished") is True, "P",
       f"exit status 1, finished, not ok: {rc}, {s.get('finished')}, {s.get('ok')}")
expect(wall <= deadline + 2 and s.get("elapsed_s", 99) <= deadline, "P",
       f"within its deadline of {deadline} s (+2): {wall:.1f} s, summary {s.get('elapsed_s')} s")
cut = st.get(f"loom.{IMAGENET}.O0.default", {})
expect(cut.get("limit_s") is not None and cut["limit_s"] < cut.get("cap_s", 0), "P",
       f"the hanging run cut at the time left, under its cap: {cut}")
compiles = lines(os.path.join(d, "state", "compiles"))
expect(sorted(compiles) == ["convnet_throughput", "resnet50_throughput"], "P", f"only the benchmarks built: {compiles}")
rows = perf_rows(d, "P")
row = row_is(rows, (CIFAR, "O0"), {"gpu": "NVIDIA H200", "loom_median_ms": 40.0, "loom_variant": "default",
                                   "loom_min_ms": 39.6, "loom_max_ms": 40.8, "peer_best_mode": "cuda_graph",
                                   "peer_best_median_ms": 41.0, "ratio_vs_peer_best": 1.025, "launches_per_step": 1000,
                                   "syncs_per_step": 0, "loom_peak_bytes": 2000000000,
                                   "peer_peak_bytes": 1500000000}, "P")
expect("not started" in str(row.get("peer_modes", {}).get("compile", {}).get("skipped")), "P",
       f"the peer's compile mode not started within a short step: {row.get('peer_modes')}")
expect(set(row.get("peer_modes", {})) == {"eager", "channels_last", "cuda_graph", "compile"}, "P",
       f"each peer mode in the row: {row.get('peer_modes')}")
expect("does not know" in str(row.get("variants", {}).get("channels_last", {}).get("skipped")), "P",
       f"the skipped variant in the row: {row.get('variants')}")
expect(str(row.get("kernels", "")).startswith("not available"), "P", f"kernels not available: {row.get('kernels')}")
row = row_is(rows, (IMAGENET, "O0"), {"loom_median_ms": None, "ratio_vs_peer_best": None}, "P")
expect("fake perf.imagenet.O0: running" in str(row.get("variants", {}).get("default", {}).get("error")), "P",
       f"the cut run's last words in its row: {row.get('variants')}")
ran = lines(os.path.join(d, "state", "ran.log"))
runs = [r.split(" ")[0] for r in ran]
expect(runs[:3] == ["perf.cifar.O0", "peer.resnet", "perf.imagenet.O0"], "P",
       f"loom and the peer interleaved, precision by precision: {runs[:4]}")
expect(any(r.startswith("perf.imagenet.O0 --device cuda --stem imagenet --size 224 --batch 256 --amp O0") for r in ran),
       "P", "loom's ImageNet run at 224 px, batch 256")
expect(f"perf.cifar.O0 --device cuda --stem cifar --size 32 --batch 128 --amp O0 --repeats 3 --steps 100 --warmup 20"
       in ran, "P", f"loom's CIFAR O0 run: {ran[:1]}")
peer = [r for r in ran if r.startswith("peer.resnet")]
expect(bool(peer) and peer[0].startswith("peer.resnet --stem cifar --size 32 --batch 128 --dtype f32 "
                                         "--modes eager,channels_last,cuda_graph --warmup 20 --steps 100 --repeats 3 --budget-s "),
       "P", f"the peer's CIFAR f32 run: {peer[:1]}")
fig = s.get("figures", {})
before, after = fig.get("gpu_state", {}).get("before", {}), fig.get("gpu_state", {}).get("after", {})
expect(before.get("clocks.current.sm [MHz]") == "345 MHz" and after.get("clocks.current.sm [MHz]") == "1980 MHz"
       and before.get("power.draw [W]") == "120.5 W" and after.get("clocks_event_reasons.active") is not None, "P",
       f"the GPU's clocks and power before and after: {before}, {after}")
with open(os.path.join(tmp, "peers", "torch_resnet_gpu.py"), "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
expect(fig.get("setup", {}).get("peer_sha256") == digest, "P", f"the peer's sha256 recorded: {fig.get('setup')}")
log = lines(os.path.join(d, "out", "gpu-perf.log"))
table = [i for i, l in enumerate(log) if l.startswith("gpu-perf: loom against the peer's best mode")]
expect(bool(table) and any(l.startswith(CIFAR) and " 1.025 " in l for l in log[table[-1]:]) and
       len(log) - table[-1] <= 3 + len(rows), "P", f"the table printed last: {log[-8:]}")
expect("fake perf.imagenet.O0: running" in packed(d, f"loom.{IMAGENET}.O0.default.log"), "P",
       "the cut run's log in results.tar.gz")

# Q: a warm rerun on P's build.
s, st, sampler, rc, wall, d = load("Q")
expect(rc == 0 and s.get("ok") is True, "Q", f"exit status 0 and ok, not {rc}, {s.get('ok')}: "
       + str({n: v["status"] for n, v in st.items() if v["status"] != "ok"}))
expect("reusing" in packed(d, "configure.log"), "Q", "configure reused P's build (its stamp matched)")
expect(lines(os.path.join(d, "state", "compiles")) == [] and
       os.path.exists(os.path.join(tmp, "P", "build", "marker-from-the-first-call")), "Q", "nothing rebuilt")
statuses(st, {f"loom.{CIFAR}.O2.bn_new": "skipped", f"kernels.{CIFAR}.O2.bn_new": "skipped",
              f"loom.{CIFAR}.O2.channels_last": "ok", f"kernels.{CIFAR}.O2.channels_last": "ok",
              f"loom.{CONVNET}.O2.channels_last": "ok", f"peer.{CONVNET}.O2": "ok"}, "Q")
expect(not any(n.startswith("loom.") and ".O0." in n for n in st), "Q", "only --amps O2 measured")
rows = perf_rows(d, "Q")
expect(list(rows) == [(CIFAR, "O2"), (CONVNET, "autocast_f16")], "Q", f"two rows, in the order run: {list(rows)}")
row = row_is(rows, (CIFAR, "O2"), {"loom_median_ms": 8.0, "loom_variant": "channels_last", "peer_best_mode": "compile",
                                   "peer_best_median_ms": 9.0, "ratio_vs_peer_best": 1.125,
                                   "kernels_per_step_profiled": 4}, "Q")
expect(row.get("variants", {}).get("default", {}).get("median_ms") == 10.0, "Q", "every variant's figures in the row")
row_is(rows, (CONVNET, "autocast_f16"), {"loom_median_ms": 0.64, "loom_variant": "channels_last",
                                         "peer_best_mode": "channels_last_autocast_f16", "peer_best_median_ms": 0.833,
                                         "ratio_vs_peer_best": round(0.833 / 0.64, 3),
                                         "peer_peak_bytes": 20 * 2**20}, "Q")
try:
    with open(os.path.join(d, "out", "kernels.json")) as f:
        kernels = json.load(f)
except (OSError, ValueError) as e:
    kernels = {}
    expect(False, "Q", f"kernels.json is missing or not valid JSON: {e}")
k = kernels.get(f"{CIFAR}.O2.channels_last", {})
top = k.get("top", [{}])
expect(k.get("tool") == "ncu" and k.get("kernels_per_step") == 4 and k.get("gpu_ms_per_step") == 0.075
       and top[0].get("name", "").startswith("sm90_xmma_fprop") and top[0].get("total_us") == 50.0
       and top[1].get("count") == 2 and top[1].get("total_us") == 20.0, "Q", f"ncu's kernel table summed: {k}")
expect(sorted(kernels) == sorted(f"{w}.O2.{v}" for w in (CIFAR, CONVNET) for v in ("default", "channels_last")), "Q",
       f"one kernel table per variant that ran: {sorted(kernels)}")
ran = lines(os.path.join(d, "state", "ran.log"))
expect(any(r.startswith("ncu env ") and "--repeats 1 --steps 1 --warmup 20 --cuda-profile-step --channels-last" in r
           for r in ran), "Q", f"one step of a variant under ncu: {[r for r in ran if r.startswith('ncu')][:1]}")
expect(any(r.startswith("perf.convnet.autocast_f16 --device cuda --batch-size 100 --data ") and "--autocast f16" in r
           for r in ran), "Q", "loom's ConvNet on the IDX files, autocast f16")
expect(any(r.startswith("peer.resnet --stem cifar --size 32 --batch 128 --dtype f16 ") for r in ran), "Q",
       "the peer's CIFAR run in f16 against --amp O2")
expect("bench.torch_convnet --modes channels_last_autocast_f16" in ran, "Q", "the ConvNet peer's channels-last f16 mode")
expect(any(r.startswith("peer.resnet") and "--modes eager,channels_last,cuda_graph,compile" in r for r in ran), "Q",
       "compile started where the step's limit allows it (LOOM_PERF_COMPILE_S)")

# R: another model of --model, named by the workload: --arch on both sides.
s, st, sampler, rc, wall, d = load("R")
MOBILENET = "mobilenet_v2_s32_b128"
expect(rc == 0 and s.get("ok") is True, "R", f"exit status 0 and ok, not {rc}, {s.get('ok')}")
statuses(st, {f"loom.{MOBILENET}.O2.default": "ok", f"peer.{MOBILENET}.O2": "ok"}, "R")
rows = perf_rows(d, "R")
expect(list(rows) == [(MOBILENET, "O2")], "R", f"one row: {list(rows)}")
ran = lines(os.path.join(d, "state", "ran.log"))
expect(any(r.startswith("perf.imagenet.O2 --device cuda --arch mobilenet_v2 --stem imagenet --size 32 --batch 128")
           for r in ran), "R", f"loom's binary given --arch mobilenet_v2: {ran}")
expect(any(r.startswith("peer.resnet --arch mobilenet_v2 --stem imagenet --size 32 --batch 128 --dtype f16 ")
           for r in ran), "R", f"the peer given --arch mobilenet_v2: {ran}")

# S: the batch-norm bandwidth workload, named: one loom step per precision (its
# dtype), no peer and no per-kernel step, the bandwidth lines in the rows and the table.
s, st, sampler, rc, wall, d = load("S")
BANDWIDTH = "batch_norm_bandwidth"
expect(rc == 0 and s.get("ok") is True, "S", f"exit status 0 and ok, not {rc}, {s.get('ok')}")
statuses(st, {f"loom.{BANDWIDTH}.O2.default": "ok", f"loom.{BANDWIDTH}.O0.default": "ok"}, "S")
expect(not any(n.startswith(("peer.", "kernels.")) for n in st), "S", f"no peer or kernels step: {sorted(st)}")
rows = perf_rows(d, "S")
expect(list(rows) == [(BANDWIDTH, "O2"), (BANDWIDTH, "O0")], "S", f"a row per precision: {list(rows)}")
lines_o2 = rows.get((BANDWIDTH, "O2"), {}).get("variants", {}).get("default", {}).get("bandwidth", [])
expect([(b.get("kernels"), b.get("dtype"), b.get("gbs"), b.get("speedup_vs_v1")) for b in lines_o2]
       == [("v1", "f16", 1000.0, 1.0), ("v2", "f16", 2500.0, 2.5)], "S", f"the O2 row's bandwidth lines: {lines_o2}")
ran = lines(os.path.join(d, "state", "ran.log"))
expect(any(r.startswith("perf.batch_norm.f16 --device cuda --shapes 128x256x32x32,128x2048x4x4,32x64x56x56 "
                        "--dtypes f16 --repeats ") for r in ran), "S", f"the benchmark given f16 for O2: {ran}")
log = lines(os.path.join(d, "out", "gpu-perf.log"))
expect(any(" v2 " in l and "2500 GB/s" in l and "2.50x" in l for l in log), "S", f"the bandwidth table: {log[-8:]}")

report("gpu-perf rehearsal")
