"""What each scenario of rehearsal.sh must show; prints every failed
expectation and exits 1 if there was one.
  python3 expect.py TMP"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scenario_checks import expect, lines, load, packed, report, statuses  # noqa: E402

tmp = sys.argv[1]

STAGED = ("staged.gloo_g2_sync_bn", "staged.shm_g4_sync_bn", "staged.gloo_g2_zero", "staged.shm_g2_no_pad_last",
          "staged.loomrun_gloo_2", "staged.torchrun_shm_2")
SANITIZER = ("sanitizer.memcheck", "sanitizer.memcheck_train_mnist", "sanitizer.memcheck_resnet50_cifar",
             "sanitizer.racecheck", "sanitizer.synccheck")
ALL = ("env", "configure", "data", "build", "gpu.runtime", "gpu.backend_ops", "gpu.training", "gpu.nccl",
       "gpu.host_staging", "gpu.elastic_cuda", "gpu.device_ordinal", "gpu.data_loader", "gpu.conv_graphs",
       "gpu.conv_graphs_training", "gpu.batch_norm_v2", *STAGED, *SANITIZER,
       "bench.loom_convnet_f32", "bench.torch_convnet", "bench.loom_convnet_tf32",
       "bench.loom_convnet_channels_last_f16", "train_mnist", "bench.resnet50_cifar", "scaling.resnet50",
       "sanitizer.initcheck")

# A: CMake's configure hangs; the deadline cuts it and skips the rest.
s, st, sampler, rc, wall, d = load("A")
deadline = 16
statuses(st, {"env": "ok", "configure": "timed_out", **{n: "skipped" for n in ALL[2:]}}, "A")
expect(rc == 1, "A", f"exit status 1 when a step did not pass, not {rc}")
expect(wall <= deadline + 2, "A", f"the whole check within its deadline of {deadline} s (+2), not {wall:.1f} s")
expect(s.get("finished") is True and s.get("ok") is False and s.get("elapsed_s", 99) <= deadline, "A",
       f"finished within the deadline, not ok: {s.get('finished')}, {s.get('ok')}, {s.get('elapsed_s')} s")
hang = st.get("configure", {})
expect(hang.get("limit_s") is not None and hang["limit_s"] < hang.get("cap_s", 0)
       and hang.get("seconds") is not None and hang["seconds"] <= hang["limit_s"] + 2, "A",
       f"the hanging step cut at the time left, under its own cap: {hang}")
expect(s.get("machine", {}).get("arch") == "90", "A", "sm_90 from compute capability 9.0")

# C: two GPUs without a compute capability, nvcc from PyTorch's wheels, a
# compile error, a failing and a hanging gpu test.
s, st, sampler, rc, wall, d = load("C")
m = s.get("machine", {})
expect(m.get("arch") == "90" and m.get("gpu_count") == 2, "C", f"arch 90 when nvidia-smi gives none, 2 GPUs: {m}")
configured = lines(os.path.join(d, "build", "configured.txt"))
expect("CMAKE_CUDA_ARCHITECTURES=90" in configured, "C", f"configured for sm_90: {configured}")
expect("LOOM_GPU_TEST_TIMEOUT=2" in configured, "C", f"the per-test GPU timeout passed to CMake: {configured}")
expect(m.get("nvcc", "").endswith("/siteC/nvidia/cuda_nvcc/bin/nvcc"), "C",
       f"nvcc from PyTorch's nvidia/*/bin, not {m.get('nvcc')}")
statuses(st, {"env": "ok", "configure": "ok", "build": "failed", "gpu.runtime": "failed", "gpu.backend_ops": "failed",
              "gpu.training": "ok", "gpu.nccl": "ok", "gpu.host_staging": "ok", "gpu.elastic_cuda": "ok",
              "gpu.device_ordinal": "ok",
              "gpu.data_loader": "ok", **{n: "not_built" for n in STAGED},
              **{n: "skipped" for n in (*SANITIZER, "sanitizer.initcheck")}, "bench.loom_convnet_f32": "ok",
              "bench.torch_convnet": "ok", "train_mnist": "not_built", "bench.resnet50_cifar": "ok",
              "scaling.resnet50": "ok"}, "C")
expect(all("compute-sanitizer" in st.get(n, {}).get("note", "") for n in SANITIZER), "C",
       f"the sanitizer steps say that no compute-sanitizer was found: {[st.get(n) for n in SANITIZER[:1]]}")
expect(s.get("figures", {}).get("machine", {}).get("compute_sanitizer") == "none", "C",
       f"no compute-sanitizer in the environment report: {s.get('figures', {}).get('machine')}")
expect(rc == 1, "C", f"exit status 1, not {rc}")
compiles = lines(os.path.join(d, "state", "compiles"))
expect(len(compiles) == 9, "C", f"the build kept going past the error: 9 binaries tried, not {compiles}")
figures = s.get("figures", {}).get("steps", {})
expect("gpu.backend_ops" in figures.get("gpu.backend_ops", {}).get("timed_out_tests", []), "C",
       f"gpu.backend_ops cut by the per-test timeout: {figures.get('gpu.backend_ops')}")
expect("fake gpu.backend_ops: running" in packed(d, "gpu.backend_ops.log"), "C",
       "the hung test's unflushed line in its log (stdbuf -oL)")
expect(figures.get("gpu.nccl", {}).get("world") == 2 and figures.get("gpu.nccl", {}).get("cuda_devices") == 2, "C",
       f"gpu.nccl at world 2: {figures.get('gpu.nccl')}")
ran = lines(os.path.join(d, "state", "ran.log"))
expect("scaling.resnet50 --device cuda --worlds 1,2 --models resnet50" in ran, "C", f"weak scaling 1..2 GPUs: {ran}")
scaling = s.get("figures", {}).get("scaling_resnet50", {})
expect([p.get("world") for p in scaling.get("points", [])] == [1, 2], "C", f"the scaling curve in the summary: {scaling}")
expect(scaling.get("ddp_vs_bare_world1") and scaling.get("allreduce"), "C",
       "DDP against the bare model and the NCCL all-reduce in the summary")
expect(sampler["versions"] >= 15, "C", f"summary.json rewritten as the steps went (seen {sampler['versions']} versions)")

# B: the second call on C's build directory.
s, st, sampler, rc, wall, d = load("B")
statuses(st, {n: "ok" for n in ALL}, "B")
expect(rc == 0 and s.get("ok") is True, "B", f"exit status 0 and ok when every step passed, not {rc}, {s.get('ok')}")
expect(os.path.exists(os.path.join(tmp, "C", "build", "marker-from-the-first-call")), "B",
       "the build directory kept (not deleted and remade)")
compiles = lines(os.path.join(d, "state", "compiles"))
expect(compiles == ["train_mnist"], "B", f"only what failed before compiled on the second call, not {compiles}")
expect("reusing" in packed(d, "configure.log"), "B", "configure reused the build (its stamp matched)")
ratios = s.get("figures", {}).get("ratios", {})
expect(ratios == {"convnet f32 (TF32 off)": 1.25, "convnet TF32": 1.2, "convnet channels-last autocast f16": 1.25,
                  "resnet50 f32 (TF32 off)": 1.25, "resnet50 f16": 1.25, "resnet50 bf16": 1.25},
       "B", f"loom/PyTorch ratios per row: {ratios}")
resnet = s.get("figures", {}).get("benchmarks", {}).get("resnet50_cifar", [])
expect([r.get("torch_channels_last_images_per_s") for r in resnet] == [None, 8000.0, None], "B",
       f"PyTorch's channels-last f16 beside the f16 row: {resnet}")
ran = lines(os.path.join(d, "state", "ran.log"))
expect("bench.torch_convnet --modes eager_f32,eager_tf32,channels_last_autocast_f16" in ran, "B",
       "the PyTorch peer run with f32 (TF32 off), TF32 and autocast rows")
expect(any(r.startswith("bench.loom_convnet_tf32") and "--tf32" in r for r in ran), "B", "loom's TF32 row")
expect(any(r.startswith("bench.loom_convnet_f32") and "--tf32" not in r for r in ran), "B", "loom's f32 row without TF32")
amps = [r.split("--amp ")[1].split()[0] for r in ran if r.startswith("bench.resnet50_cifar") and "--amp " in r]
expect(amps == ["O0", "O2", "bf16"] and all("--device cuda" in r for r in ran if r.startswith("bench.resnet50_cifar")),
       "B", f"loom's ResNet-50 on the GPU at O0, O2, bf16: {amps}")
peer = [r for r in ran if r.startswith("bench.torch_resnet50")]
expect(peer == ["bench.torch_resnet50 --amp none", "bench.torch_resnet50 --amp f16",
                "bench.torch_resnet50 --amp f16 --channels-last", "bench.torch_resnet50 --amp bf16"], "B",
       f"PyTorch's ResNet-50 peer in f32, f16 (NCHW, channels-last), bf16: {peer}")
expect(s.get("figures", {}).get("steps", {}).get("train_mnist", {}).get("test_accuracy") == 0.88, "B",
       "train_mnist's accuracy in the summary")
machine = s.get("figures", {}).get("machine", {})
expect(machine.get("torch_cudnn") == "91300" and machine.get("driver") == "580.159.04", "B",
       f"the environment report in the summary: {machine}")
expect(machine.get("compute_sanitizer", "").endswith("/sanitizerB/compute-sanitizer"), "B",
       f"compute-sanitizer found on PATH: {machine.get('compute_sanitizer')}")
# The staged runs: train_mnist on CUDA over gloo and shm, 2 and 4 ranks, with SyncBatchNorm, ZeRO, no padding.
staged = [r for r in ran if r.startswith("train_mnist.")]
for key, flags in (("train_mnist.gloo_g2", "--backend gloo -g 2 --sync-bn"), ("train_mnist.shm_g4", "--backend shm -g 4 --sync-bn"),
                   ("train_mnist.gloo_g2", "--backend gloo -g 2 --zero"), ("train_mnist.shm_g2", "--backend shm -g 2 --no-pad-last")):
    expect(any(r.startswith(key + " ") and flags in r and "--device cuda" in r and "--max-steps 20" in r for r in staged),
           "B", f"train_mnist --device cuda {flags} --max-steps 20 ran: {staged}")
# And under the launchers: loomrun over gloo, torchrun over shm (the fake python records it).
expect(any(r.startswith("loomrun --standalone --nproc_per_node=2 ") and "train_mnist --device cuda" in r
           and "--max-steps 20" in r and r.endswith(" --backend gloo") for r in ran), "B",
       f"loomrun started 2 ranks of train_mnist on CUDA over gloo: {ran}")
expect(any(r.startswith("torchrun --standalone --nproc_per_node=2 --no-python ") and "train_mnist --device cuda" in r
           and "--max-steps 20" in r and r.endswith(" --backend shm") for r in ran), "B",
       f"torchrun started 2 ranks of train_mnist on CUDA over shm: {ran}")
step_figures = s.get("figures", {}).get("steps", {})
expect(step_figures.get("staged.shm_g4_sync_bn", {}).get("processes") == 4
       and step_figures.get("staged.shm_g4_sync_bn", {}).get("backend") == "shm"
       and step_figures.get("staged.shm_g4_sync_bn", {}).get("test_accuracy") == 0.88, "B",
       f"a staged run's processes, backend and accuracy in the summary: {step_figures.get('staged.shm_g4_sync_bn')}")
# Every sanitizer step ran its tool with a finding's exit status, over what it names.
sanitized = [r for r in ran if r.startswith("sanitizer ")]
for tool, program in (("memcheck", "test_gpu --test-suite=runtime,backend_ops,training --test-case-exclude="),
                      ("memcheck", "train_mnist --device cuda"), ("memcheck", "train_resnet50_cifar --device cuda"),
                      ("racecheck", "test_gpu --test-suite=backend_ops --test-case=elementwise ops and reductions,"),
                      ("synccheck", "test_gpu --test-suite=backend_ops --test-case=elementwise ops and reductions,"),
                      ("initcheck", "test_gpu --test-suite=backend_ops --test-case=elementwise ops and reductions,")):
    # memcheck with loom's allocator not caching, so that it sees each tensor's bounds.
    caching = "(LOOM_CUDA_NO_CACHING=1)" if tool == "memcheck" else "(LOOM_CUDA_NO_CACHING=)"
    expect(any(r.startswith(f"sanitizer {tool} ") and "--error-exitcode 86" in r and program in r
               and r.endswith(caching) for r in sanitized),
           "B", f"compute-sanitizer --tool {tool} over {program}, {caching}: {sanitized}")
expect(step_figures.get("sanitizer.memcheck", {}).get("errors") == 0
       and step_figures.get("sanitizer.memcheck", {}).get("cases") == 3, "B",
       f"the sanitizer's error count and the test cases in the summary: {step_figures.get('sanitizer.memcheck')}")

# D: SIGKILL while the env step's PyTorch query hangs.
s, st, sampler, rc, wall, d = load("D")
statuses(st, {"env": "running", **{n: "pending" for n in ALL[1:]}}, "D")
expect(rc == 137, "D", f"killed by SIGKILL (rc 137), not rc {rc}")
log = "\n".join(lines(os.path.join(d, "out", "gpu-check.log")))
expect("torch_nccl: 2.28.3" in log, "D", "the hung Python query's unflushed lines in gpu-check.log (PYTHONUNBUFFERED); "
       f"the log ended with: {log[-1500:]!r}")
m = s.get("machine", {})
expect(m.get("nvcc", "").endswith("/root/usr/local/cuda-13.0/bin/nvcc"), "D",
       f"nvcc from the newest /usr/local/cuda-*/bin, not {m.get('nvcc')}")

# F: compute-sanitizer beside nvcc finds an error under memcheck and refuses the
# device under synccheck; one staged run fails.
s, st, sampler, rc, wall, d = load("F")
statuses(st, {"staged.gloo_g2_sync_bn": "ok", "staged.shm_g4_sync_bn": "failed", "staged.gloo_g2_zero": "ok",
              "staged.shm_g2_no_pad_last": "ok", "sanitizer.memcheck": "failed", "sanitizer.memcheck_train_mnist": "failed",
              "sanitizer.memcheck_resnet50_cifar": "failed", "sanitizer.racecheck": "ok", "sanitizer.synccheck": "failed",
              "sanitizer.initcheck": "ok", "gpu.host_staging": "ok", "scaling.resnet50": "ok"}, "F")
expect(rc == 1 and s.get("ok") is False, "F", f"exit status 1 and not ok, not {rc}, {s.get('ok')}")
memcheck = st.get("sanitizer.memcheck", {})
expect(memcheck.get("rc") == 86 and "found errors: ERROR SUMMARY: 1 error" in memcheck.get("note", ""), "F",
       f"the finding's exit status and summary in the step's note: {memcheck}")
expect("Invalid __global__ write" in packed(d, "sanitizer.memcheck.log"), "F", "the finding in the step's log")
expect("refused" in st.get("sanitizer.synccheck", {}).get("note", ""), "F",
       f"a refused device named in the note: {st.get('sanitizer.synccheck')}")
figures = s.get("figures", {})
expect(figures.get("steps", {}).get("sanitizer.memcheck", {}).get("errors") == 1
       and figures.get("steps", {}).get("sanitizer.synccheck", {}).get("refused_device") is True, "F",
       f"findings and the refusal in the summary's figures: {figures.get('steps', {}).get('sanitizer.memcheck')}")
expect(figures.get("machine", {}).get("compute_sanitizer", "").endswith("/root/usr/local/cuda-13.0/bin/compute-sanitizer"),
       "F", f"compute-sanitizer beside the nvcc used: {figures.get('machine', {}).get('compute_sanitizer')}")
ran = lines(os.path.join(d, "state", "ran.log"))
expect(len([r for r in ran if r.startswith("train_mnist.")]) == 4, "F",
       f"every staged run ran, also after the failed one: {ran}")

# G: LOOM_GPU_ONLY selects the sanitizer steps; env, configure, data and build run anyway.
s, st, sampler, rc, wall, d = load("G")
statuses(st, {"env": "ok", "configure": "ok", "data": "ok", "build": "ok",
              **{n: "ok" for n in (*SANITIZER, "sanitizer.initcheck")},
              **{n: "skipped" for n in ALL if n.startswith(("gpu.", "staged.", "bench.", "scaling."))},
              "train_mnist": "skipped"}, "G")
expect(rc == 0 and "LOOM_GPU_ONLY" in st.get("gpu.runtime", {}).get("note", ""), "G",
       f"exit status 0, and a skipped step's note names LOOM_GPU_ONLY: {rc}, {st.get('gpu.runtime')}")
text = lines(os.path.join(tmp, "bad-only.txt"))
expect(len(text) == 2 and "LOOM_GPU_ONLY" in text[0] and text[-1] == "2", "G",
       f"a LOOM_GPU_ONLY that is no regular expression: one line and exit status 2, not {text}")

# E: no GPU.
s, st, sampler, rc, wall, d = load("E")
expect(rc == 2 and "nvidia-smi" in (s.get("error") or ""), "E", f"exit 2 and the reason in summary.json: {rc}, {s.get('error')}")

# The PyTorch peer's arithmetic per mode: f32 without TF32 (PyTorch's default
# leaves cuDNN's TF32 on), TF32 in its own row.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))
import types  # noqa: E402

import torch_convnet_gpu  # noqa: E402


def pytorch_defaults():
    return types.SimpleNamespace(backends=types.SimpleNamespace(
        cudnn=types.SimpleNamespace(allow_tf32=True), cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(allow_tf32=False))))


for mode, want in (("eager_f32", False), ("eager_tf32", True), ("channels_last_autocast_f16", False)):
    fake = pytorch_defaults()
    torch_convnet_gpu.set_math_mode(fake, mode)
    expect(fake.backends.cudnn.allow_tf32 is want and fake.backends.cuda.matmul.allow_tf32 is want, "peer",
           f"torch_convnet_gpu.py {mode}: TF32 {'on' if want else 'off'} in cuDNN and cuBLAS")

report("gpu-check rehearsal")
