#!/usr/bin/env bash
# The GPU check in one command, for a machine with an NVIDIA GPU, nvcc and no
# network: configures a Release build for this GPU's architecture, finds
# cuDNN / cuBLAS / NCCL (the CUDA toolkit's, or the nvidia-* wheels of a
# Python site-packages, e.g. PyTorch's), builds only what the check needs,
# runs the `gpu` tests, ConvNet training on the GPU, loom's ConvNet benchmark
# and (when PyTorch is importable) its PyTorch peer on the same GPU, then
# (time permitting) ResNet-50's world-1 DDP profile on the GPU with the
# cluster projection from it (OUTDIR/scaling/), and writes
# OUTDIR/summary.json and OUTDIR/gpu-check.log.
#   scripts/gpu-check.sh OUTDIR
# Environment: LOOM_GPU_BUILD (build directory, default build-gpu),
# LOOM_GPU_JOBS (default nproc), LOOM_GPU_STEPS (benchmark steps, default 500),
# LOOM_GPU_BUILD_TIMEOUT (seconds, default 420: enough for 16 cores),
# LOOM_GPU_PROFILE_BEFORE (seconds into the run after which the last step,
# ResNet-50's profile and projection, is left out; default 450).
# C++ dependencies the machine lacks come from .deps (scripts/gpu-deps.sh).
# Exit status 0 when the build, every gpu test and every benchmark succeeded.
set -uo pipefail
out=${1:?usage: scripts/gpu-check.sh OUTDIR}
mkdir -p "$out" && out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.." && repo=$(pwd)
exec > >(tee "$out/gpu-check.log") 2>&1
build=${LOOM_GPU_BUILD:-$repo/build-gpu}
jobs=${LOOM_GPU_JOBS:-$(nproc)}
steps=${LOOM_GPU_STEPS:-500}
build_timeout=${LOOM_GPU_BUILD_TIMEOUT:-420}
steps_file=$out/steps.jsonl
: > "$steps_file"
t_start=$(date +%s)

# step NAME TIMEOUT COMMAND... : runs it, logs it, records rc and seconds.
step() {
  local name=$1 limit=$2
  shift 2
  local t0
  t0=$(date +%s)
  echo "=== [$(( t0 - t_start ))s] $name: $*" >&2  # stderr: stdout may be redirected to a result file
  timeout "$limit" "$@"
  local rc=$?
  echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $(( $(date +%s) - t0 ))}" >> "$steps_file"
  echo "=== $name: rc $rc" >&2
  return $rc
}

# ---- the machine ----
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU (nvidia-smi fails); run this on the GPU machine"
  exit 2
fi
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' ')
arch=${cap/./}
echo "gpu-check: $gpu_name, compute capability $cap (sm_$arch), driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
echo "gpu-check: nvcc $nvcc: $("$nvcc" --version | tail -1)"
echo "gpu-check: cmake $(cmake --version | head -1), $(nproc) cores, building with -j$jobs"

# ---- libraries outside the toolkit: the nvidia/* wheel directories ----
wheel_dirs=$(python3 - <<'PY' 2>/dev/null
import os, site, sys
roots = set()
candidates = list(getattr(site, "getsitepackages", lambda: [])()) + [site.getusersitepackages()] + sys.path
for d in candidates:
    if d and os.path.isdir(os.path.join(d, "nvidia")):
        roots.add(os.path.realpath(os.path.join(d, "nvidia")))
for root in sorted(roots):
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if os.path.isdir(os.path.join(path, "lib")):
            print(path)
PY
)
toolkit_lib=$(dirname "$(dirname "$(readlink -f "$nvcc")")")/lib64
hints=()
library_path=""
for d in $wheel_dirs; do
  library_path="$library_path:$d/lib"
  if [[ -f $d/include/cudnn.h ]] && ! compgen -G "$toolkit_lib/libcudnn.so*" >/dev/null; then hints+=("-DCUDNN_ROOT=$d"); fi
  if [[ -f $d/include/cublas_v2.h ]] && ! compgen -G "$toolkit_lib/libcublas.so*" >/dev/null; then hints+=("-DCUBLAS_ROOT=$d"); fi
  if [[ -f $d/include/nccl.h ]] && ! compgen -G "$toolkit_lib/libnccl.so*" >/dev/null; then hints+=("-DNCCL_ROOT=$d"); fi
done
echo "gpu-check: library hints: ${hints[*]:-none (all in the CUDA toolkit)}"

# ---- C++ dependencies: the system's, else .deps (scripts/gpu-deps.sh) ----
prefix_args=()
if [[ -d $repo/.deps/root/usr ]]; then
  deps=$repo/.deps/root
  prefix_args=("-DCMAKE_PREFIX_PATH=$deps/usr"
               "-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,$deps/usr/lib/x86_64-linux-gnu:$deps/lib/x86_64-linux-gnu:$deps/usr/lib")
  library_path="$library_path:$deps/usr/lib/x86_64-linux-gnu:$deps/lib/x86_64-linux-gnu:$deps/usr/lib"
  echo "gpu-check: using C++ dependencies from .deps where the system lacks them"
else
  for header in eigen3/Eigen/Core doctest/doctest.h CLI/CLI.hpp nlohmann/json.hpp gloo/config.h zlib.h; do
    [[ -f /usr/include/$header || -f /usr/local/include/$header ]] ||
      echo "gpu-check: warning: /usr/include/$header is missing; run scripts/gpu-deps.sh where apt works and carry .deps"
  done
fi
export LD_LIBRARY_PATH="${library_path#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# ---- configure and build what the check runs ----
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# A build directory from another architecture or generator is started afresh.
if [[ -f $build/CMakeCache.txt ]]; then
  want_generator=$([[ ${#generator[@]} -gt 0 ]] && echo Ninja || echo "Unix Makefiles")
  grep -q "CMAKE_CUDA_ARCHITECTURES:STRING=$arch\$" "$build/CMakeCache.txt" &&
    grep -q "CMAKE_GENERATOR:INTERNAL=$want_generator\$" "$build/CMakeCache.txt" || rm -rf "$build"
fi
targets=(test_gpu test_caching_allocator convnet_throughput train_mnist scaling_step allreduce_timing)
build_ok=0
if step configure 300 cmake -S "$repo" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON \
     -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_CUDA_COMPILER="$nvcc" "${hints[@]}" "${prefix_args[@]}"; then
  # The NCCL process group's test (gpu.nccl) exists when CMake found NCCL.
  if grep -q "gpu\.nccl" "$build/tests/gpu/CTestTestfile.cmake" 2>/dev/null; then
    targets+=(test_gpu_nccl)
  else
    echo "gpu-check: CMake did not find NCCL: no NCCL process group, gpu.nccl not built"
  fi
  step build "$build_timeout" cmake --build "$build" -j "$jobs" --target "${targets[@]}" && build_ok=1
fi

# ---- data: Fashion-MNIST if installed, else a learnable synthetic set in IDX format ----
data=/usr/share/datasets/fashion-mnist
if [[ ! -f $data/train-images-idx3-ubyte && ! -f $data/train-images-idx3-ubyte.gz ]]; then
  data=$build/synthetic-mnist
  python3 - "$data" <<'PY'
import os, struct, sys
import numpy as np
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(0)
def write(prefix, n):
    labels = rng.integers(0, 10, n).astype(np.uint8)
    images = rng.normal(40, 30, (n, 28, 28))
    for k in range(10):  # class k lights a k-dependent bar
        rows = labels == k
        images[rows, 2 * k:2 * k + 8, 4:24] += 120
    images = np.clip(images, 0, 255).astype(np.uint8)
    with open(os.path.join(out, f"{prefix}-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
    with open(os.path.join(out, f"{prefix}-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 2049, n) + labels.tobytes())
write("train", 20000)
write("t10k", 2000)
PY
  echo "gpu-check: no Fashion-MNIST installed; using synthetic IDX data in $data"
fi

tests_ok=0
bench_ok=0
if (( build_ok )); then
  # ---- tests ----
  step test_caching_allocator 120 "$build/tests/gpu/test_caching_allocator" > "$out/test_caching_allocator.log" 2>&1
  allocator_rc=$?
  tail -3 "$out/test_caching_allocator.log"
  step gpu_tests 420 ctest --test-dir "$build" -L gpu -V --output-junit "$out/ctest-gpu.xml" \
    > "$out/ctest-gpu.log" 2>&1
  gpu_rc=$?
  if grep -q "skipped: no CUDA device visible" "$out/ctest-gpu.log"; then
    echo "gpu-check: nvidia-smi sees a GPU but the CUDA runtime reports none; the gpu suites skipped (a failure here)"
    gpu_rc=1
  fi
  grep -E "test cases:|assertions:|Status:|Test +#|tests passed|skipped:|ERROR|FAILED|CHECK.*is NOT correct" "$out/ctest-gpu.log" | head -80
  (( allocator_rc == 0 && gpu_rc == 0 )) && tests_ok=1

  # ---- training and benchmarks ----
  bench_ok=1
  step train_mnist 180 "$build/apps/train_mnist" --device cuda --epochs 1 --data "$data" --log-interval 50 --verbose \
    > "$out/train_mnist.log" 2>&1 || bench_ok=0
  cat "$out/train_mnist.log"
  : > "$out/bench.jsonl"
  step loom_convnet_cuda 180 "$build/benchmarks/convnet_throughput" --device cuda --steps "$steps" --warmup 20 \
    --data "$data" >> "$out/bench.jsonl" || bench_ok=0
  step loom_convnet_cuda_channels_last_autocast 180 "$build/benchmarks/convnet_throughput" --device cuda \
    --channels-last --autocast f16 --steps "$steps" --warmup 20 --data "$data" >> "$out/bench.jsonl" || bench_ok=0
  step loom_convnet_cpu 180 "$build/benchmarks/convnet_throughput" --threads "$jobs" --steps 50 --warmup 5 \
    --data "$data" >> "$out/bench.jsonl" || bench_ok=0
fi
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  step torch_convnet_cuda 240 python3 "$repo/benchmarks/torch_convnet_gpu.py" --data "$data" --steps "$steps" \
    >> "$out/bench.jsonl" || bench_ok=0
else
  echo "gpu-check: PyTorch with CUDA is not importable: no peer figures"
fi
cat "$out/bench.jsonl" 2>/dev/null

# ---- ResNet-50's world-1 profile on this GPU, and the cluster projection from it ----
# (the scaling benchmark's projection otherwise rests on an assumed profile);
# only while time is left, as it comes last.
if (( build_ok )) && (( $(date +%s) - t_start < ${LOOM_GPU_PROFILE_BEFORE:-450} )); then
  step scaling_resnet50_profile 150 python3 "$repo/benchmarks/scaling/scaling.py" --device cuda --build "$build" \
    --models resnet50 --worlds 1 --image-size 224 --weak-batch resnet50=128 --steps resnet50=10 \
    --warmup resnet50=3 --repeats 1 --no-peer --no-plot --project-measured resnet50 --out "$out/scaling" \
    --work "$build/scaling-work" --stem scaling-resnet50-gpu > "$out/scaling-resnet50.log" 2>&1
  grep -v "^  " "$out/scaling-resnet50.log" | tail -12
else
  echo "gpu-check: no time left for ResNet-50's GPU profile (or no build)"
fi

# ---- summary ----
python3 - "$out" "$gpu_name" "$cap" "$build_ok" "$tests_ok" "$bench_ok" "$(( $(date +%s) - t_start ))" <<'PY'
import json, os, re, sys
out, gpu, cap, build_ok, tests_ok, bench_ok, seconds = sys.argv[1:]
def read(name):
    path = os.path.join(out, name)
    return open(path, errors="replace").read() if os.path.exists(path) else ""
steps = [json.loads(l) for l in read("steps.jsonl").splitlines() if l.strip()]
suites = {}
for block in re.split(r"\n(?=\d+: Test command:)", read("ctest-gpu.log")):
    name = re.search(r"Test command: .*--test-suite=(\w+)", block)
    counts = re.search(r"test cases:\s*(\d+) \|\s*(\d+) passed \|\s*(\d+) failed", block)
    if name:
        suites[name.group(1)] = ({"cases": int(counts.group(1)), "passed": int(counts.group(2)),
                                  "failed": int(counts.group(3))} if counts else
                                 {"skipped": "skipped: no CUDA device visible" in block, "no summary": True})
bench = []
for line in read("bench.jsonl").splitlines():
    try:
        bench.append(json.loads(line))
    except ValueError:
        pass
def pick(pred):
    return next((b for b in bench if pred(b)), None)
loom_gpu = pick(lambda b: b.get("bench") == "loom convnet train" and b.get("on", "").startswith("cuda") and not b.get("channels_last"))
loom_amp = pick(lambda b: b.get("bench") == "loom convnet train" and b.get("channels_last") and b.get("autocast") == "f16")
torch_f32 = pick(lambda b: b.get("mode") == "eager_f32")
torch_amp = pick(lambda b: b.get("mode") == "channels_last_autocast_f16")
ratios = {}
if loom_gpu and torch_f32:
    ratios["loom_f32_vs_torch_eager_f32"] = round(loom_gpu["images_per_s"] / torch_f32["images_per_s"], 3)
if loom_amp and torch_amp:
    ratios["loom_channels_last_autocast_f16_vs_torch_same"] = round(loom_amp["images_per_s"] / torch_amp["images_per_s"], 3)
train = read("train_mnist.log")
accuracy = re.search(r"Test accuracy: ([0-9.]+)", train)
memory = re.search(r"CUDA memory: (.*)", train)
summary = {
    "gpu": gpu, "compute_capability": cap, "seconds": int(seconds),
    "ok": build_ok == "1" and tests_ok == "1" and bench_ok == "1",
    "build_ok": build_ok == "1", "tests_ok": tests_ok == "1", "benchmarks_ok": bench_ok == "1",
    "steps": steps, "gpu_test_suites": suites,
    "train_mnist": {"test_accuracy": float(accuracy.group(1)) if accuracy else None,
                    "memory": memory.group(1) if memory else None},
    "benchmarks": bench, "ratios": ratios,
}
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
print(json.dumps({k: summary[k] for k in ("ok", "build_ok", "tests_ok", "benchmarks_ok", "seconds", "ratios")}))
PY
[[ $build_ok == 1 && $tests_ok == 1 && $bench_ok == 1 ]]
