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
#   gpu.runtime, gpu.backend_ops, gpu.training, gpu.nccl, gpu.host_staging,
#   gpu.elastic_cuda, gpu.device_ordinal, gpu.data_loader, gpu.conv_graphs, gpu.conv_graphs_training,
#   gpu.batch_norm_v2
#                    the gpu test suites, one ctest call each, every test cut at
#                    LOOM_GPU_TEST_TIMEOUT (120 s); gpu.nccl runs at world N on N GPUs,
#                    gpu.host_staging 2 and 4 ranks on GPU 0 over gloo and shm,
#                    gpu.elastic_cuda checkpoints resumed at world 2 -> 1 -> 3 on GPU 0,
#                    gpu.device_ordinal cuda:1 where two GPUs are visible, gpu.conv_graphs the
#                    fused cuDNN graphs (issue 47, behind LOOM_CUDNN_GRAPH) against the unfused ops,
#                    gpu.conv_graphs_training the same through batch_norm_relu_conv2d and in a
#                    ResNet-50 step,
#                    gpu.batch_norm_v2 LOOM_CUDA_BATCH_NORM=v2 against the CPU at ResNet-50's shapes
#   staged.*         train_mnist on CUDA over gloo and shm (collectives staged through host
#                    memory), the ranks sharing GPU 0, 20 steps each: gloo -g 2 --sync-bn,
#                    shm -g 4 --sync-bn, gloo -g 2 --zero, shm -g 2 --no-pad-last; then 2
#                    ranks under loomrun (gloo) and, where PyTorch is, torchrun (shm)
#   sanitizer.*      compute-sanitizer (beside nvcc, on PATH or LOOM_GPU_SANITIZER; a finding
#                    fails the step): memcheck over gpu.runtime, gpu.backend_ops and
#                    gpu.training (but the cases that mostly run cuDNN's algorithm variants or
#                    a CPU reference training), memcheck over 5 steps of train_mnist and 3 of
#                    train_resnet50_cifar, racecheck and synccheck over the backend_ops cases
#                    of loom's shared-memory reductions; initcheck over those last, after the
#                    benchmarks, when time is left
#   bench.*          loom's ConvNet on the GPU in f32 (TF32 off), PyTorch's (f32 with TF32
#                    off, TF32, channels-last autocast f16), loom's TF32 and channels-last
#                    autocast f16 rows, then train_mnist for one epoch on the GPU
#   bench.resnet50_cifar  ResNet-50 (CIFAR stem, batch 128): loom at --amp O0, O2 and bf16,
#                    then PyTorch's peer in f32 (TF32 off) and autocast f16 / bf16
#   scaling.resnet50 ResNet-50's world-1 profile and the cluster projection from it; on N >= 2
#                    GPUs the weak-scaling curve from 1 to N GPUs (one process per GPU, NCCL)
#                    and DDP against the bare model
#   sanitizer.initcheck  (above)
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
#   LOOM_GPU_ONLY      a regular expression: run only the steps whose names it matches
#                      (env, configure, data and build always run), e.g. '^sanitizer\.' on
#                      a warm machine after a first call that ran out of time
#   LOOM_GPU_SANITIZER compute-sanitizer to use; else beside nvcc, the toolkit's
#                      compute-sanitizer/, PATH, /usr/local/cuda*/bin, PyTorch's nvidia/*
# C++ dependencies the machine lacks come from .deps (scripts/gpu-deps.sh).
set -uo pipefail

tool=gpu-check
self=$(readlink -f "${BASH_SOURCE[0]}")
repo=$(dirname "$(dirname "$self")")
# shellcheck source=scripts/gpu-steps.sh
source "$repo/scripts/gpu-steps.sh"

# The figures of summary.json, read from the step logs.
figures_command() { timeout 30 python3 "$repo/scripts/gpu-check-summary.py" "$work" "${names[@]}"; }

# compute-sanitizer's exit status when it found something (--error-exitcode).
sanitizer_exit=86

# find_sanitizer: prints the compute-sanitizer to run, or nothing: LOOM_GPU_SANITIZER, else
# beside nvcc (as named, then its real directory and the toolkit's compute-sanitizer/),
# PATH, /usr/local/cuda*/bin (newest first), then PyTorch's nvidia/*
# (find_machine's nvcc and nvidia_dirs).
find_sanitizer() {
  local root=${LOOM_GPU_CHECK_ROOT:-} dirs=() candidate real versioned
  if [[ -n ${LOOM_GPU_SANITIZER:-} ]]; then
    echo "$LOOM_GPU_SANITIZER"
    return
  fi
  if [[ -n $nvcc ]]; then
    real=$(readlink -f "$nvcc")
    dirs+=("$(dirname "$nvcc")" "$(dirname "$real")" "$(dirname "$(dirname "$real")")/compute-sanitizer")
  fi
  if candidate=$(command -v compute-sanitizer); then dirs+=("$(dirname "$candidate")"); fi
  dirs+=("$root/usr/local/cuda/bin")
  versioned=$(compgen -G "$root/usr/local/cuda-*/bin" | sort -V -r)
  [[ -n $versioned ]] && mapfile -t -O "${#dirs[@]}" dirs <<< "$versioned"
  while IFS= read -r candidate; do
    [[ -n $candidate ]] && dirs+=("$candidate/bin" "$candidate/compute-sanitizer")
  done <<< "$nvidia_dirs"
  for candidate in "${dirs[@]}"; do
    if [[ -x $candidate/compute-sanitizer ]]; then
      echo "$candidate/compute-sanitizer"
      return
    fi
  done
}

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
  echo "compute_sanitizer: ${sanitizer:-none}"
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
  local probe=""
  [[ $probe =~ ${LOOM_GPU_ONLY:-} ]]
  if (( $? == 2 )); then
    echo "gpu-check: LOOM_GPU_ONLY is not a regular expression: '$LOOM_GPU_ONLY'" >&2
    exit 2
  fi
  start_run
  bench_steps=${LOOM_GPU_STEPS:-500}
  find_machine
  sanitizer=$(find_sanitizer)
  log "compute-sanitizer ${sanitizer:-not found}"
  log "deadline $deadline s, margin $margin s, steps under $min_step s skipped, each gpu test cut at $test_timeout s"

  local targets="test_gpu test_gpu_nccl convnet_throughput train_mnist train_resnet50_cifar loomrun resnet50_throughput"
  targets+=" scaling_step allreduce_timing"
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
  for suite in runtime backend_ops training nccl host_staging elastic_cuda device_ordinal data_loader conv_graphs \
      conv_graphs_training batch_norm_v2; do
    local binary=$build/tests/gpu/test_gpu
    [[ $suite == nccl || $suite == host_staging || $suite == elastic_cuda ]] && binary=$build/tests/gpu/test_gpu_nccl
    add_step "gpu.$suite" $(( test_timeout + 30 )) "$binary" "$ctest_cmd '^gpu\\.$suite\$'"
  done
  # The app on CUDA over the CPU backends, its ranks sharing GPU 0 (-g spawns them).
  local mnist run backend ranks flag flag_name
  mnist="$q_build/apps/train_mnist --device cuda --data $(printf '%q' "$data") --checkpoint-dir ''"
  for run in "gloo 2 --sync-bn" "shm 4 --sync-bn" "gloo 2 --zero" "shm 2 --no-pad-last"; do
    read -r backend ranks flag <<< "$run"
    flag_name=${flag#--}
    add_step "staged.${backend}_g${ranks}_${flag_name//-/_}" 60 "$build/apps/train_mnist" \
      "$mnist --backend $backend -g $ranks $flag --epochs 1 --max-steps 20 --batch-size 50 --log-interval 5"
  done
  # The same started by the launchers users start it with: loomrun, and PyTorch's
  # torchrun where the env step found PyTorch (its ranks' --device cuda is
  # cuda:(LOCAL_RANK mod 1), GPU 0 for both).
  local launched="$mnist --epochs 1 --max-steps 20 --batch-size 50 --log-interval 5"
  add_step staged.loomrun_gloo_2 60 "$build/apps/train_mnist" \
    "$q_build/apps/loomrun --standalone --nproc_per_node=2 $launched --backend gloo"
  add_step staged.torchrun_shm_2 60 "$build/apps/train_mnist" \
    "$q_py -m torch.distributed.run --standalone --nproc_per_node=2 --no-python $launched --backend shm"
  sanitizer_steps "$q_build" "$(printf '%q' "$data")"
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
  add_step sanitizer.initcheck 90 "$build/tests/gpu/test_gpu" "$initcheck_cmd"
  publish

  export GPU_CHECK_GPU_COUNT=$gpu_count GPU_CHECK_GPU_NAME=$gpu_name GPU_CHECK_GPU_CAP=$gpu_cap GPU_CHECK_ARCH=$arch \
         GPU_CHECK_NVCC=$nvcc GPU_CHECK_SANITIZER=$sanitizer GPU_CHECK_HINTS="${hints[*]}"
  run_steps
  finish_run
}

# sanitizer_steps BUILD DATA (both quoted for the shell): the compute-sanitizer
# steps but initcheck, whose command is left in initcheck_cmd (it runs last).
# Each sanitizes one process, with cuDNN's heuristic algorithm choice (the
# benchmark search would run every algorithm under the tool); API errors are
# not reported, as loom checks every CUDA call itself and some tests provoke
# them (out of memory, a bad ordinal).
sanitizer_steps() {
  local q_build=$1 q_data=$2 tool
  tool="LOOM_CUDNN_SEARCH=heuristic $(printf '%q' "${sanitizer:-compute-sanitizer}") --error-exitcode $sanitizer_exit"
  tool+=" --report-api-errors no --print-limit 50 --tool"
  local test_gpu=$q_build/tests/gpu/test_gpu
  # memcheck: every case but those that mostly run cuDNN's algorithm variants, the
  # fused cuDNN graphs (behind LOOM_CUDNN_GRAPH, unproven; their plans compile
  # kernels, slow under the tool) and the ConvNet's CPU-referenced training (the
  # apps below train under memcheck); batch norm v2 at ResNet-50's shapes is in
  # a suite of its own (the small batch-norm cases run v2 under the tool),
  # with loom's allocator not caching (LOOM_CUDA_NO_CACHING=1: each tensor its own
  # cudaMalloc, so that memcheck sees its bounds, not those of a 2 MiB segment).
  local memcheck="LOOM_CUDA_NO_CACHING=1 $tool memcheck"
  local skipped="conv2d with cuDNN*,conv2d backward kernels*,conv2d keeps the input*,the ConvNet*loss curve*,cuDNN graph*"
  add_step sanitizer.memcheck 180 "$build/tests/gpu/test_gpu" \
    "$memcheck $test_gpu --test-suite=runtime,backend_ops,training '--test-case-exclude=$skipped'"
  add_step sanitizer.memcheck_train_mnist 90 "$build/apps/train_mnist" \
    "$memcheck $q_build/apps/train_mnist --device cuda --data $q_data --epochs 1 --max-steps 5 --batch-size 32 --log-interval 1 --checkpoint-dir ''"
  add_step sanitizer.memcheck_resnet50_cifar 120 "$build/apps/train_resnet50_cifar" \
    "$memcheck $q_build/apps/train_resnet50_cifar --device cuda --synthetic --synthetic-size 64 -b 16 -e 1 --max-steps 3 --stem cifar --workers 0 --log-interval 1 --checkpoint-dir ''"
  # racecheck and synccheck (shared memory and barriers) where loom's kernels use
  # them: the block reductions of elementwise sums, batch norm, softmax and losses,
  # layer norm.
  local reductions="'--test-case=elementwise ops and reductions,batch_norm: training*,log_softmax*,avg_pool2d and layer_norm'"
  add_step sanitizer.racecheck 120 "$build/tests/gpu/test_gpu" "$tool racecheck $test_gpu --test-suite=backend_ops $reductions"
  add_step sanitizer.synccheck 60 "$build/tests/gpu/test_gpu" "$tool synccheck $test_gpu --test-suite=backend_ops $reductions"
  initcheck_cmd="$tool initcheck $test_gpu --test-suite=backend_ops $reductions"
}

# before_step I: only the steps LOOM_GPU_ONLY selects; bench.torch_convnet and
# staged.torchrun_* only where the env step found PyTorch with CUDA; the sanitizer steps only where
# there is a compute-sanitizer.
before_step() {
  if [[ -n ${LOOM_GPU_ONLY:-} && ! ${names[$1]} =~ ^(env|configure|data|build)$ && ! ${names[$1]} =~ $LOOM_GPU_ONLY ]]
  then
    status[$1]="skipped" passes_skipped[$1]=1 notes[$1]="not selected by LOOM_GPU_ONLY=$LOOM_GPU_ONLY"
    return 1
  fi
  if [[ ${names[$1]} == bench.torch_convnet || ${names[$1]} == staged.torchrun_* ]] &&
     ! grep -qx "torch_cuda: yes" "$work/env.log" 2>/dev/null; then
    status[$1]="skipped" notes[$1]="PyTorch with CUDA is not importable by $py (see the env step)"
    log "${names[$1]}: skipped, no PyTorch with CUDA"
    return 1
  fi
  if [[ ${names[$1]} == sanitizer.* && -z $sanitizer ]]; then
    status[$1]="skipped"
    notes[$1]="no compute-sanitizer beside nvcc, on PATH, in /usr/local/cuda*/bin or PyTorch's nvidia/* (set LOOM_GPU_SANITIZER)"
    log "${names[$1]}: skipped, no compute-sanitizer"
    return 1
  fi
}

# after_step I: a sanitizer step's note says what compute-sanitizer reported:
# its findings (the step exited with sanitizer_exit), or that it refused the
# GPU (as it did under gVisor), so that nothing was checked.
after_step() {
  local i=$1 log=$work/${names[$1]}.log
  [[ ${names[$i]} == sanitizer.* ]] || return 0
  if grep -qaE "Device not supported|not supported on this (device|platform)" "$log"; then
    notes[i]="compute-sanitizer refused this GPU or its runtime: nothing was checked (see the step's log)"
  elif [[ ${rcs[$i]} == "$sanitizer_exit" ]]; then
    notes[i]="compute-sanitizer found errors: $(grep -aoE '(ERROR|RACECHECK) SUMMARY: [^=]*' "$log" | tail -1)"
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
        arch=${GPU_CHECK_ARCH:-} nvcc=${GPU_CHECK_NVCC:-} sanitizer=${GPU_CHECK_SANITIZER:-} hints=(${GPU_CHECK_HINTS:-})
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
