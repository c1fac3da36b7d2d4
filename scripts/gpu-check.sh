#!/usr/bin/env bash
# The GPU check in one command, for a machine with NVIDIA GPUs, nvcc and no
# network, that lends its time briefly (one command at most 600 s) and returns
# at most 8 files from its output folder:
#   scripts/gpu-check.sh [--deadline SECONDS] OUT
#
# Steps, in order of value, each under `timeout -k` with the smaller of its own
# cap and the time left before the deadline (less a margin), and skipped,
# recorded as such, when less than LOOM_GPU_MIN_STEP seconds are left
# (scripts/gpu-steps.sh runs them; scripts/gpu-perf.sh shares it):
#   env              nvidia-smi, driver, nvcc, gcc, OS, CMake, PyTorch and its cuDNN
#   configure        CMake, Release, this GPU's architecture (90 when nvidia-smi does not say);
#                    skipped on a second call whose configuration is unchanged (a stamp file)
#   data             Fashion-MNIST if installed, else synthetic IDX files
#   build            `-k 0`: one compile error loses only what depends on it; each later
#                    step runs when its binary exists
#   gpu.runtime, gpu.backend_ops, gpu.training, gpu.nccl, gpu.data_loader
#                    the gpu test suites, one ctest call each, every test cut at
#                    LOOM_GPU_TEST_TIMEOUT (120 s); gpu.nccl runs at world N on N GPUs
#   bench.*          loom's ConvNet on the GPU in f32 (TF32 off), PyTorch's (f32 with TF32
#                    off, TF32, channels-last autocast f16), loom's TF32 and channels-last
#                    autocast f16 rows, then train_mnist for one epoch on the GPU
#   bench.resnet50_cifar  ResNet-50 (CIFAR stem, batch 128): loom at --amp O0, O2 and bf16,
#                    then PyTorch's peer in f32 (TF32 off) and autocast f16 / bf16
#   scaling.resnet50 ResNet-50's world-1 profile and the cluster projection from it; on N >= 2
#                    GPUs the weak-scaling curve from 1 to N GPUs (one process per GPU, NCCL)
#                    and DDP against the bare model
#
# OUT holds at most 4 files at any moment: summary.json (rewritten atomically
# before and after every step: each step's status, seconds and figures, so a
# kill at any moment leaves a valid summary), gpu-check.log (everything
# printed), results.tar.gz (every step's full log and output, repacked after
# every step) and, for an instant, the temporary file that replaces one of them.
# Exit status: 0 when every step succeeded, 1 otherwise, 2 for bad usage or no GPU.
#
# Environment (and the settings scripts/gpu-steps.sh lists: margin, minimum
# step, kill grace, test timeout, build directory, jobs, arch, nvcc, Python):
#   LOOM_GPU_DEADLINE  seconds from the start by which the last summary is written (540;
#                      --deadline overrides)
#   LOOM_GPU_STEPS     ConvNet benchmark steps (500)
# C++ dependencies the machine lacks come from .deps (scripts/gpu-deps.sh).
set -uo pipefail

tool=gpu-check
self=$(readlink -f "${BASH_SOURCE[0]}")
repo=$(dirname "$(dirname "$self")")
# shellcheck source=scripts/gpu-steps.sh
source "$repo/scripts/gpu-steps.sh"

# The figures of summary.json, read from the step logs.
figures_command() { timeout 30 python3 "$repo/scripts/gpu-check-summary.py" "$work" "${names[@]}"; }

# ---- internal steps (run as `gpu-check.sh --internal NAME ...` under timeout) -------------------

internal_env() {
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -n)"
  echo "os: $( (. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME") || uname -s)"
  echo "kernel: $(uname -r)"
  echo "cpus: $(nproc)"
  echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo 2>/dev/null)"
  echo "gpu_count: $gpu_count"
  echo "gpu: $gpu_name"
  echo "compute_capability: ${gpu_cap:-unknown (nvidia-smi did not say)}"
  echo "arch: $arch"
  echo "driver: $(timeout 20 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
  echo "nvcc: $nvcc"
  echo "nvcc_version: $("$nvcc" --version 2>&1 | grep -o 'release [0-9.]*, V[0-9.]*' | head -1)"
  echo "gcc: $(gcc --version 2>/dev/null | head -1)"
  echo "cmake: $(cmake --version 2>/dev/null | head -1)"
  echo "ninja: $(ninja --version 2>/dev/null || echo none)"
  echo "python: $py ($("$py" --version 2>&1))"
  "$py" - <<'PY' 2>&1
try:
    import torch
except Exception as e:  # noqa: BLE001
    print(f"torch: not importable ({type(e).__name__}: {e})")
    print("torch_cuda: no")
else:
    print(f"torch: {torch.__version__} (CUDA {torch.version.cuda})")
    try:
        print(f"torch_cudnn: {torch.backends.cudnn.version()}")
    except Exception as e:  # noqa: BLE001
        print(f"torch_cudnn: unknown ({e})")
    try:
        print(f"torch_nccl: {'.'.join(map(str, torch.cuda.nccl.version()))}")
    except Exception as e:  # noqa: BLE001
        print(f"torch_nccl: unknown ({e})")
    ok = torch.cuda.is_available()
    print(f"torch_cuda: {'yes' if ok else 'no'}")
    if ok:
        print(f"torch_devices: {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
PY
  echo "library_hints: ${hints[*]:-none}"
  echo "--- nvidia-smi"
  timeout 20 nvidia-smi 2>&1
  timeout 20 nvidia-smi topo -m 2>&1 | head -20
  return 0
}

# internal_resnet_bench BUILD TORCH: ResNet-50 with the CIFAR stem, batch 128,
# on the GPU: loom's resnet50_throughput at --amp O0, O2 and bf16, then, when
# TORCH is "yes", PyTorch's peer in f32 (TF32 off), autocast f16 (NCHW and
# channels-last) and autocast bf16. One JSON line each; fails when one fails.
internal_resnet_bench() {
  local build=$1 torch=$2 rc=0 amp mode
  for amp in O0 O2 bf16; do
    "$build/benchmarks/resnet50_throughput" --device cuda --stem cifar --batch 128 --warmup 5 --steps 30 \
      --amp "$amp" || rc=1
  done
  if [[ $torch != yes ]]; then
    echo "PyTorch with CUDA is not importable by $py: no peer rows"
    return $rc
  fi
  for mode in none f16 "f16 --channels-last" bf16; do
    # shellcheck disable=SC2086  # mode holds a flag
    "$py" "$repo/benchmarks/peers/torch_resnet50_cifar.py" --device cuda --stem cifar --batch 128 --steps 30 \
      --amp $mode || rc=1
  done
  return $rc
}

# ---- main --------------------------------------------------------------------------------------

main() {
  parse_options 540 LOOM_GPU_DEADLINE "$@"
  start_run
  bench_steps=${LOOM_GPU_STEPS:-500}
  find_machine
  log "deadline $deadline s, margin $margin s, steps under $min_step s skipped, each gpu test cut at $test_timeout s"

  local targets="test_gpu test_gpu_nccl convnet_throughput train_mnist resnet50_throughput scaling_step allreduce_timing"
  local data data_cmd
  data_step_command
  local q_build q_py q_repo
  q_build=$(printf '%q' "$build") q_py=$(printf '%q' "$py") q_repo=$(printf '%q' "$repo")
  local ctest_cmd="ctest --test-dir $q_build --timeout $test_timeout --output-on-failure -V -R"
  local convnet="$q_build/benchmarks/convnet_throughput --device cuda --steps $bench_steps --warmup 20 --data $(printf '%q' "$data")"
  local worlds=1 w=2
  while (( w < gpu_count )); do worlds+=",$w"; w=$(( w * 2 )); done
  (( gpu_count > 1 )) && worlds+=",$gpu_count"

  add_step env 60 "" "$(printf '%q' "$self") --internal env"
  add_step configure 240 "" "$configure_cmd"
  add_step data 60 "" "$data_cmd"
  add_step build 480 "" "$(printf '%q' "$self") --internal build $q_build $jobs $targets"
  local suite
  for suite in runtime backend_ops training nccl data_loader; do
    local binary=$build/tests/gpu/test_gpu
    [[ $suite == nccl ]] && binary=$build/tests/gpu/test_gpu_nccl
    add_step "gpu.$suite" $(( test_timeout + 30 )) "$binary" "$ctest_cmd '^gpu\\.$suite\$'"
  done
  add_step bench.loom_convnet_f32 90 "$build/benchmarks/convnet_throughput" "$convnet"
  add_step bench.torch_convnet 180 "" \
    "$q_py $q_repo/benchmarks/torch_convnet_gpu.py --data $(printf '%q' "$data") --steps $bench_steps --modes eager_f32,eager_tf32,channels_last_autocast_f16"
  add_step bench.loom_convnet_tf32 90 "$build/benchmarks/convnet_throughput" "$convnet --tf32"
  add_step bench.loom_convnet_channels_last_f16 90 "$build/benchmarks/convnet_throughput" "$convnet --channels-last --autocast f16"
  add_step train_mnist 150 "$build/apps/train_mnist" \
    "$q_build/apps/train_mnist --device cuda --epochs 1 --data $(printf '%q' "$data") --log-interval 100 --verbose"
  # PyTorch's rows only where the env step found PyTorch with CUDA (read when the step runs).
  local torch_found="grep -qx 'torch_cuda: yes' $(printf '%q' "$work/env.log") && echo yes || echo no"
  add_step bench.resnet50_cifar 150 "$build/benchmarks/resnet50_throughput" \
    "$(printf '%q' "$self") --internal resnet_bench $q_build \$($torch_found)"
  add_step scaling.resnet50 $(( 150 + 60 * ($(tr -cd , <<< "$worlds" | wc -c)) )) "$build/benchmarks/scaling/scaling_step" \
    "$q_py $q_repo/benchmarks/scaling/scaling.py --device cuda --build $q_build --models resnet50 --worlds $worlds --image-size 224 --weak-batch resnet50=128 --strong-batch resnet50=128 --steps resnet50=10 --warmup resnet50=3 --repeats 1 --no-peer --no-plot --project-measured resnet50 --out $(printf '%q' "$work/scaling") --work $(printf '%q' "$work/scaling-work") --stem scaling-resnet50-gpu --timeout 400"
  publish

  export GPU_CHECK_GPU_COUNT=$gpu_count GPU_CHECK_GPU_NAME=$gpu_name GPU_CHECK_GPU_CAP=$gpu_cap GPU_CHECK_ARCH=$arch \
         GPU_CHECK_NVCC=$nvcc GPU_CHECK_HINTS="${hints[*]}"
  run_steps
  finish_run
}

# before_step I: bench.torch_convnet runs only where the env step found PyTorch with CUDA.
before_step() {
  if [[ ${names[$1]} == bench.torch_convnet ]] && ! grep -qx "torch_cuda: yes" "$work/env.log" 2>/dev/null; then
    status[$1]="skipped" notes[$1]="PyTorch with CUDA is not importable by $py (see the env step)"
    log "bench.torch_convnet: skipped, no PyTorch with CUDA"
    return 1
  fi
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  if [[ ${1:-} == --internal ]]; then
    # The env and data steps, started by run_step under its timeout; the
    # machine's facts come from the environment main() exported.
    py=${LOOM_GPU_PYTHON:-python3}
    case ${2:-} in
      env)
        gpu_count=${GPU_CHECK_GPU_COUNT:-0} gpu_name=${GPU_CHECK_GPU_NAME:-} gpu_cap=${GPU_CHECK_GPU_CAP:-}
        arch=${GPU_CHECK_ARCH:-} nvcc=${GPU_CHECK_NVCC:-} hints=(${GPU_CHECK_HINTS:-})
        internal_env ;;
      data) internal_data "$3" ;;
      build) shift 2; internal_build "$@" ;;
      resnet_bench) shift 2; internal_resnet_bench "$@" ;;
      *) echo "gpu-check: unknown internal step ${2:-}" >&2; exit 2 ;;
    esac
    exit
  fi
  main "$@"
fi
