#!/usr/bin/env bash
# loom's GPU speed against PyTorch's fastest modes in one command, for the same
# machines as scripts/gpu-check.sh (one command at most 600 s, at most 8 files
# back): one call of at most 7 minutes on a fresh machine, a rerun of at most
# 3 minutes on a warm one (the build is reused: gpu-check's stamp).
#   scripts/gpu-perf.sh [--deadline SECONDS] [--workloads LIST] [--amps LIST] OUT
#
# Steps, in order of value, under one deadline (scripts/gpu-steps.sh runs them;
# a step that would start with too little time left is skipped and recorded):
#   configure, data, build   the CMake configuration (reused when its stamp matches), the
#                    ConvNet's IDX files when it is measured, and only the benchmarks run
#   loom.W.A.V, peer.W.A     per precision A, per workload W, interleaved: loom's first variant,
#                    the peer (every mode), loom's other variants. loom: the benchmark binary
#                    with --repeats R --steps S --warmup N, CUDA-event timing, median / min /
#                    max ms per step, launches and host syncs per step (loom's counters),
#                    peak GPU memory. Peer: ../shared/peers/torch_resnet_gpu.py, unchanged,
#                    its modes one after the other, each mode's runs back to back
#                    (ConvNet: benchmarks/torch_convnet_gpu.py, one run per mode)
#   kernels.W.A.V    per-kernel times of one training step of each variant, under ncu
#                    (--profile-from-start off; the binaries' --cuda-profile-step) or nsys when
#                    one is on the machine; else recorded as not available
# The GPU's name, clocks, power, temperature and clock-limit reasons are read with
# nvidia-smi before the first measurement and after the last.
#
# Workloads (--workloads, LOOM_PERF_WORKLOADS; all three by default, in this order):
#   resnet50_cifar_b128        ResNet-50, CIFAR stem, 32 px, batch 128
#   resnet50_imagenet224_b256  ResNet-50, ImageNet stem, 224 px, batch 256
#   convnet_b100               the tutorials' ConvNet, batch 100, on IDX files
# and, named only, MODEL_s32_b128 for each other model of the apps' --model
# (vgg11_bn, vgg16_bn, mobilenet_v2, mobilenet_v3_small, mobilenet_v3_large,
# efficientnet_b0, regnet_y_400mf, convnext_tiny): torchvision's model at 32 px,
# batch 128, 10 classes, loom's resnet50_throughput --arch MODEL and the peer's
# --arch MODEL (issue 52); and, named only, batch_norm_bandwidth: batch norm's
# passes at three ResNet-50 shapes as GB/s against the GPU's bandwidth
# (benchmarks/batch_norm_bandwidth, the CUDA kernels LOOM_CUDA_BATCH_NORM=v1 and
# v2 interleaved inside each run, issue 46), per precision its dtype (O0 f32,
# O2 f16, bf16 bf16), no peer and no per-kernel step; its rows' variants hold
# the "bandwidth" lines and the table lists them.
# Precisions (--amps, LOOM_PERF_AMPS; O2,bf16,O0 by default): loom's --amp O2 / bf16 / O0
# against the peer's --dtype f16 / bf16 / f32 (TF32 off on both sides). The ConvNet
# has O0 (peer eager_f32) and O2, measured as autocast f16 (loom --autocast f16, peer
# channels_last_autocast_f16; its rows say amp "autocast_f16"), and no bf16 peer.
# Variants (LOOM_PERF_VARIANTS): "NAME:ARGS;NAME:ARGS", ARGS being flags and
# VARIABLE=value settings given to loom's binary (default
# "default:;channels_last:--channels-last"). A variant with a flag the binary does
# not list in its --help is recorded as skipped, not failed (hooks for what later
# work adds: NCHW/NHWC, old/new batch norm); a setting is passed as it is, e.g.
# "fused:--channels-last LOOM_CUDNN_GRAPH=1" (issue 47's fused convolutions;
# their rows' graph_runs_per_step and graph_fallbacks_per_step say what ran)
# or "graph:--channels-last --cuda-graph" (the step as one CUDA graph).
#
# OUT holds at most 6 files at any moment: summary.json (the step table and every
# figure, rewritten atomically before and after every step), perf.json (a list of
# rows, one per workload and precision: workload, amp, gpu, loom_median_ms and its
# variant, peer_best_mode, peer_best_median_ms, ratio_vs_peer_best = peer ms / loom
# ms, launches_per_step, syncs_per_step, loom_peak_bytes, peer_peak_bytes, each
# variant's and each peer mode's figures), kernels.json (per-kernel times, when
# profiled), gpu-perf.log (everything printed; the table last), results.tar.gz
# (every step's log and the profilers' CSV files) and, for an instant, the
# temporary file that replaces one of them.
# Exit status: 0 when every step succeeded (or skipped a variant the binary does
# not know), 1 otherwise, 2 for bad usage or no GPU.
#
# Environment (and the settings scripts/gpu-steps.sh lists: margin, minimum step,
# kill grace, build directory, jobs, arch, nvcc, Python):
#   LOOM_PERF_DEADLINE  seconds from the start by which the last summary is written (420;
#                       --deadline overrides; 180 suits a warm rerun)
#   LOOM_PERF_REPEATS, LOOM_PERF_STEPS, LOOM_PERF_WARMUP  timed runs, steps per run and
#                       warm-up steps, both sides (3, 100, 20)
#   LOOM_PERF_PEER      the peer program (default: .deps/peers/torch_resnet_gpu.py, which
#                       scripts/gpu-deps.sh copies there, else ../shared/peers/)
#   LOOM_PERF_PEER_MODES  the peer's modes (eager,channels_last,cuda_graph,compile); compile
#                       runs only in a peer step whose limit is at least LOOM_PERF_COMPILE_S
#                       (240: max-autotune compiles for minutes), else it is recorded as
#                       not started
#   LOOM_PERF_PROFILER  auto (ncu, else nsys), ncu, nsys or none
# C++ dependencies the machine lacks come from .deps (scripts/gpu-deps.sh).
set -uo pipefail

tool=gpu-perf
self=$(readlink -f "${BASH_SOURCE[0]}")
repo=$(dirname "$(dirname "$self")")
# shellcheck source=scripts/gpu-steps.sh
source "$repo/scripts/gpu-steps.sh"
skip_rc=77

# summary.json's figures from the step logs; perf.json and kernels.json
# written into OUT as they are read.
figures_command() { timeout 30 python3 "$repo/scripts/gpu-perf-summary.py" "$work" "$out" "$gpu_name" "${names[@]}"; }
print_last() { python3 "$repo/scripts/gpu-perf-summary.py" --table "$out/perf.json"; }

all_workloads="resnet50_cifar_b128,resnet50_imagenet224_b256,convnet_b100"
other_models="vgg11_bn vgg16_bn mobilenet_v2 mobilenet_v3_small mobilenet_v3_large efficientnet_b0 regnet_y_400mf
              convnext_tiny"
all_amps="O2,bf16,O0"

# ---- what each workload runs -------------------------------------------------------------------

# workload_spec W: sets binary, loom_args, peer_kind (resnet or convnet), peer_args,
# loom_cap and peer_cap (seconds) for workload W; fails for an unknown one.
workload_spec() {
  case $1 in
    resnet50_cifar_b128)
      binary=resnet50_throughput loom_args="--stem cifar --size 32 --batch 128" peer_kind=resnet
      peer_args="--stem cifar --size 32 --batch 128" loom_cap=120 peer_cap=150 ;;
    resnet50_imagenet224_b256)
      binary=resnet50_throughput loom_args="--stem imagenet --size 224 --batch 256" peer_kind=resnet
      peer_args="--stem imagenet --size 224 --batch 256" loom_cap=240 peer_cap=300 ;;
    convnet_b100)
      binary=convnet_throughput loom_args="--batch-size 100 --data $(printf '%q' "${data:-}")" peer_kind=convnet
      peer_args="--batch-size 100 --data $(printf '%q' "${data:-}")" loom_cap=60 peer_cap=120 ;;
    batch_norm_bandwidth)
      binary=batch_norm_bandwidth loom_args="--shapes 128x256x32x32,128x2048x4x4,32x64x56x56" peer_kind=bandwidth
      peer_args="" loom_cap=240 peer_cap=0 ;;
    *_s32_b128)
      local model=${1%_s32_b128}
      [[ " ${other_models//$'\n'/ } " == *" $model "* ]] || return 1
      binary=resnet50_throughput loom_args="--arch $model --stem imagenet --size 32 --batch 128" peer_kind=resnet
      peer_args="--arch $model --stem imagenet --size 32 --batch 128" loom_cap=120 peer_cap=150 ;;
    *) return 1 ;;
  esac
}

# precision_spec KIND AMP: sets loom_amp (loom's flags) and peer_amp (the peer's
# flags) for AMP on a workload of KIND; fails where KIND has no such row.
precision_spec() {
  case $1:$2 in
    resnet:O0) loom_amp="--amp O0" peer_amp="--dtype f32" ;;
    resnet:O2) loom_amp="--amp O2" peer_amp="--dtype f16" ;;
    resnet:bf16) loom_amp="--amp bf16" peer_amp="--dtype bf16" ;;
    convnet:O0) loom_amp="" peer_amp="--modes eager_f32" ;;
    convnet:O2) loom_amp="--autocast f16" peer_amp="--modes channels_last_autocast_f16" ;;
    bandwidth:O0) loom_amp="--dtypes f32" peer_amp="" ;;
    bandwidth:O2) loom_amp="--dtypes f16" peer_amp="" ;;
    bandwidth:bf16) loom_amp="--dtypes bf16" peer_amp="" ;;
    *) return 1 ;;
  esac
}

# find_peer: the peer program's path, or nothing.
find_peer() {
  local candidate
  for candidate in "${LOOM_PERF_PEER:-}" "$repo/.deps/peers/torch_resnet_gpu.py" \
                   "$repo/../shared/peers/torch_resnet_gpu.py" "$repo/shared/peers/torch_resnet_gpu.py"; do
    if [[ -n $candidate && -f $candidate ]]; then
      readlink -f "$candidate"
      return
    fi
  done
}

# find_profiler: "ncu PATH", "nsys PATH" or "none REASON".
find_profiler() {
  local want=${LOOM_PERF_PROFILER:-auto} candidate
  if [[ $want == none ]]; then
    echo "none LOOM_PERF_PROFILER=none"
    return
  fi
  if [[ $want == auto || $want == ncu ]]; then
    for candidate in "$(command -v ncu)" ${nvcc:+"$(dirname "$nvcc")/ncu"} /usr/local/cuda/bin/ncu \
                     $(compgen -G "/opt/nvidia/nsight-compute/*/ncu" | sort -V -r); do
      [[ -n $candidate && -x $candidate ]] && { echo "ncu $candidate"; return; }
    done
  fi
  if [[ $want == auto || $want == nsys ]]; then
    candidate=$(command -v nsys) && { echo "nsys $candidate"; return; }
  fi
  echo "none no ${want/auto/ncu or nsys} on this machine"
}

# ---- internal steps (run as `gpu-perf.sh --internal NAME ...` under timeout) -------------------

# variant_command SPEC BINARY ARGS...: sets cmd (env + the binary, its args and the
# variant's flags); returns 1, printing why, when the binary does not list one of
# the variant's flags in its --help.
variant_command() {
  local spec=$1 binary=$2 token help
  shift 2
  local settings=() flags=()
  for token in $spec; do
    if [[ $token =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; then settings+=("$token"); else flags+=("$token"); fi
  done
  help=$("$binary" --help 2>&1)
  for token in "${flags[@]}"; do
    [[ $token == --* ]] || continue
    if ! grep -qE -- "(^|[[:space:],])${token%%=*}([[:space:]=,]|\$)" <<< "$help"; then
      echo "skipped: $(basename "$binary") does not know $token"
      return 1
    fi
  done
  cmd=(env "${settings[@]}" "$binary" "$@" "${flags[@]}")
}

# internal_loom SPEC BINARY ARGS...: one variant of loom's benchmark.
internal_loom() {
  local cmd
  variant_command "$@" || exit "$skip_rc"
  echo "loom: ${cmd[*]}"
  exec "${cmd[@]}"
}

# internal_peer KIND PEER ARGS...: the peer, its modes within the step's limit.
internal_peer() {
  local kind=$1 peer=$2
  shift 2
  if [[ $kind == convnet ]]; then
    exec "$py" "$peer" "$@"
  fi
  local modes=${LOOM_PERF_PEER_MODES:-eager,channels_last,cuda_graph,compile} limit=${GPU_STEP_LIMIT:-600}
  local compile_s=${LOOM_PERF_COMPILE_S:-240}
  if [[ ,$modes, == *,compile,* ]] && (( limit < compile_s )); then
    modes=$(tr ',' '\n' <<< "$modes" | grep -vx compile | paste -sd, -)
    echo "{\"mode\": \"compile\", \"skipped\": \"not started: this step's limit of $limit s is under LOOM_PERF_COMPILE_S=$compile_s\"}"
  fi
  # No mode starts in the last 40 s of the limit (the peer's own budget).
  echo "peer: $py $peer $* --modes $modes --budget-s $(( limit > 80 ? limit - 40 : limit / 2 ))"
  exec "$py" "$peer" "$@" --modes "$modes" --budget-s $(( limit > 80 ? limit - 40 : limit / 2 ))
}

# internal_kernels TOOL PATH CSV SPEC BINARY ARGS...: one step of the variant under
# the profiler; its per-kernel table in CSV.
internal_kernels() {
  local tool_name=$1 profiler=$2 csv=$3 cmd
  shift 3
  variant_command "$@" || exit "$skip_rc"
  case $tool_name in
    ncu)
      echo "kernels: $profiler ... ${cmd[*]}"
      # Clocks and caches as the step leaves them (ncu's defaults lock the clocks
      # to base and flush the caches before every kernel).
      "$profiler" --profile-from-start off --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum --csv --print-units base --log-file "$csv" "${cmd[@]}" ;;
    nsys)
      local report=${csv%.csv}
      "$profiler" profile --capture-range=cudaProfilerApi --capture-range-end=stop --force-overwrite true \
        -o "$report" "${cmd[@]}" &&
        "$profiler" stats --report cuda_gpu_kern_sum --format csv --output - "$report.nsys-rep" > "$csv" ;;
  esac
}

# gpu_state NAME: the GPU's clocks, power and limits now, into $work/gpu-NAME.csv.
gpu_state() {
  local fields=name,pstate,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.draw,power.limit
  fields+=,temperature.gpu,utilization.gpu,memory.used,memory.total,driver_version
  timeout 20 nvidia-smi --query-gpu=$fields --format=csv > "$work/gpu-$1.csv" 2>&1
  # Why clocks are held down: the newer field name, else the older one.
  { timeout 20 nvidia-smi --query-gpu=clocks_event_reasons.active --format=csv 2>/dev/null ||
      timeout 20 nvidia-smi --query-gpu=clocks_throttle_reasons.active --format=csv 2>/dev/null; } \
    > "$work/gpu-$1-reasons.csv"
}

# before_step I: the GPU's state just before the first measurement.
before_step() {
  if [[ ${names[$1]} == loom.* || ${names[$1]} == peer.* ]] && [[ ! -f $work/gpu-before.csv ]]; then
    gpu_state before
  fi
  return 0
}

# ---- main --------------------------------------------------------------------------------------

main() {
  local workloads=${LOOM_PERF_WORKLOADS:-$all_workloads} amps=${LOOM_PERF_AMPS:-$all_amps} rest=()
  while (( $# )); do
    case $1 in
      --workloads) workloads=${2:-}; shift 2 || { echo "gpu-perf: --workloads needs a list" >&2; exit 2; } ;;
      --workloads=*) workloads=${1#*=}; shift ;;
      --amps) amps=${2:-}; shift 2 || { echo "gpu-perf: --amps needs a list" >&2; exit 2; } ;;
      --amps=*) amps=${1#*=}; shift ;;
      *) rest+=("$1"); shift ;;
    esac
  done
  parse_options 420 LOOM_PERF_DEADLINE "${rest[@]}"
  local w a setting
  for w in ${workloads//,/ }; do
    workload_spec "$w" || {
      echo "gpu-perf: unknown workload '$w' in --workloads (known: $all_workloads, batch_norm_bandwidth, and" \
           "MODEL_s32_b128 for MODEL one of" $other_models")" >&2
      exit 2
    }
  done
  for a in ${amps//,/ }; do
    [[ ,$all_amps, == *,$a,* ]] || { echo "gpu-perf: unknown precision '$a' in --amps (known: $all_amps)" >&2; exit 2; }
  done
  for setting in LOOM_PERF_REPEATS:"${LOOM_PERF_REPEATS:-3}" LOOM_PERF_STEPS:"${LOOM_PERF_STEPS:-100}" \
                 LOOM_PERF_WARMUP:"${LOOM_PERF_WARMUP:-20}" LOOM_PERF_COMPILE_S:"${LOOM_PERF_COMPILE_S:-240}"; do
    if [[ ! ${setting#*:} =~ ^[0-9]+$ ]] || [[ ${setting%%:*} != LOOM_PERF_WARMUP && ${setting#*:} == 0 ]]; then
      echo "gpu-perf: ${setting%%:*} must be a positive whole number, not '${setting#*:}'" >&2
      exit 2
    fi
  done
  local repeats=${LOOM_PERF_REPEATS:-3} steps=${LOOM_PERF_STEPS:-100} warmup=${LOOM_PERF_WARMUP:-20}
  local variants=${LOOM_PERF_VARIANTS-default:;channels_last:--channels-last} variant_names=() variant_specs=() v
  IFS=';' read -ra v <<< "$variants"
  for setting in "${v[@]}"; do
    [[ -z ${setting// /} ]] && continue
    if [[ ! ${setting%%:*} =~ ^[A-Za-z0-9_-]+$ || $setting != *:* ]]; then
      echo "gpu-perf: LOOM_PERF_VARIANTS entry '$setting' is not NAME:ARGS (NAME of letters, digits, _ and -)" >&2
      exit 2
    fi
    variant_names+=("${setting%%:*}") variant_specs+=("${setting#*:}")
  done
  (( ${#variant_names[@]} )) || { echo "gpu-perf: LOOM_PERF_VARIANTS names no variant" >&2; exit 2; }
  case ${LOOM_PERF_PROFILER:-auto} in
    auto|ncu|nsys|none) ;;
    *) echo "gpu-perf: LOOM_PERF_PROFILER must be auto, ncu, nsys or none, not '$LOOM_PERF_PROFILER'" >&2; exit 2 ;;
  esac

  start_run perf.json kernels.json
  find_machine
  log "deadline $deadline s, margin $margin s, steps under $min_step s skipped"
  log "workloads $workloads; precisions $amps; variants ${variant_names[*]}; $repeats runs of $steps steps after $warmup"
  if (( repeats < 3 || steps < 100 || warmup < 20 )); then
    log "note: fewer than 3 runs of 100 steps after 20 warm-up steps: not the protocol of perf.json's figures"
  fi
  local peer profiler q_self q_build
  peer=$(find_peer)
  profiler=$(find_profiler)
  {
    echo "peer: ${peer:-none}"
    [[ -n $peer ]] && echo "peer_sha256: $(sha256sum "$peer" | cut -d' ' -f1)"
    echo "profiler: $profiler"
    echo "protocol: $repeats runs of $steps steps after $warmup warm-up steps"
  } > "$work/setup.txt"
  log "peer ${peer:-not found}; per-kernel times: $profiler"
  q_self=$(printf '%q' "$self") q_build=$(printf '%q' "$build")

  local data data_cmd targets=() need_data=0
  data_step_command
  [[ ,$workloads, == *,resnet50_* || ,$workloads, == *_s32_b128,* ]] && targets+=(resnet50_throughput)
  [[ ,$workloads, == *,convnet_b100,* ]] && { targets+=(convnet_throughput); need_data=1; }
  [[ ,$workloads, == *,batch_norm_bandwidth,* ]] && targets+=(batch_norm_bandwidth)
  add_step configure 240 "" "$configure_cmd"
  (( need_data )) && add_step data 60 "" "$data_cmd"
  add_step build 300 "" "$q_self --internal build $q_build $jobs ${targets[*]}"

  local binary loom_args peer_kind peer_args loom_cap peer_cap loom_amp peer_amp i key
  local timing="--repeats $repeats --steps $steps --warmup $warmup" kernel_steps=()
  # Precision by precision (the mixed ones first by default), each workload in turn.
  for a in ${amps//,/ }; do
    for w in ${workloads//,/ }; do
      workload_spec "$w"
      precision_spec "$peer_kind" "$a" || continue
      local path=$build/benchmarks/$binary q_path
      q_path=$(printf '%q' "$path")
      for i in "${!variant_names[@]}"; do
        key="$w.$a.${variant_names[$i]}"
        add_step "loom.$key" "$loom_cap" "$path" \
          "$q_self --internal loom $(printf '%q' "${variant_specs[$i]}") $q_path --device cuda $loom_args $loom_amp $timing"
        # The bandwidth benchmark compares its kernels itself: no profile, no peer.
        [[ $peer_kind == bandwidth ]] && continue
        kernel_steps+=("kernels.$key|$path|$q_self --internal kernels ${profiler%% *} $(printf '%q' "${profiler#* }") $(printf '%q' "$work/kernels.$key.csv") $(printf '%q' "${variant_specs[$i]}") $q_path --device cuda $loom_args $loom_amp --repeats 1 --steps 1 --warmup $warmup --cuda-profile-step")
        (( i == 0 )) || continue
        # The peer right after loom's first variant.
        local peer_program=$peer
        [[ $peer_kind == convnet ]] && peer_program=$repo/benchmarks/torch_convnet_gpu.py
        if [[ $peer_kind == convnet ]]; then
          add_step "peer.$w.$a" "$peer_cap" "" \
            "$q_self --internal peer convnet $(printf '%q' "$peer_program") $peer_args $peer_amp --steps $(( repeats * steps )) --warmup $warmup"
        else
          add_step "peer.$w.$a" "$peer_cap" "" \
            "$q_self --internal peer resnet $(printf '%q' "$peer_program") $peer_args $peer_amp --warmup $warmup --steps $steps --repeats $repeats"
        fi
        if [[ -z $peer_program ]]; then
          status[-1]="skipped" notes[-1]="no peer: set LOOM_PERF_PEER, or run scripts/gpu-deps.sh (copies ../shared/peers/torch_resnet_gpu.py into .deps/peers) and carry .deps"
        fi
      done
    done
  done
  local entry
  for entry in "${kernel_steps[@]}"; do
    IFS='|' read -r key binary setting <<< "$entry"
    add_step "$key" 120 "$binary" "$setting"
    if [[ $profiler == none* ]]; then
      status[-1]="skipped" passes_skipped[-1]=1 notes[-1]="per-kernel times not available: ${profiler#none }"
    fi
  done
  publish
  run_steps
  [[ -f $work/gpu-before.csv ]] && gpu_state after
  finish_run
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  if [[ ${1:-} == --internal ]]; then
    py=${LOOM_GPU_PYTHON:-python3}
    case ${2:-} in
      data) internal_data "$3" ;;
      build) shift 2; internal_build "$@" ;;
      loom) shift 2; internal_loom "$@" ;;
      peer) shift 2; internal_peer "$@" ;;
      kernels) shift 2; internal_kernels "$@" ;;
      *) echo "gpu-perf: unknown internal step ${2:-}" >&2; exit 2 ;;
    esac
    exit
  fi
  main "$@"
fi
