#!/usr/bin/env bash
# The rehearsal of scripts/gpu-perf.sh, on a machine without a GPU: the script
# itself with gpu-check's fakes (scenarios.sh: nvidia-smi, nvcc, the tiny CMake
# project whose binaries print the benchmarks' JSON, the peers through
# fakes/python) and a fake ncu. Two calls, as on the device machine:
#   P  a fresh machine: every workload, precision O0 first, the default
#      variants (the ResNet binary does not know --channels-last: that variant
#      is skipped), no profiler; loom's ImageNet O0 run hangs, the deadline
#      cuts it and skips the rest
#   Q  a warm rerun on P's build: ResNet-50 CIFAR and the ConvNet at O2, a
#      variant the binary does not know, --channels-last known, compile mode
#      given its time, per-kernel times under ncu
#   R  a warm rerun on P's build: one of the other models (mobilenet_v2_s32_b128)
#      at O2, loom's binary and the peer both given --arch
#   S  a warm rerun on P's build: batch_norm_bandwidth at O2 and O0 (no peer, no
#      per-kernel times), its bandwidth lines in perf.json and the table
# and bad usage (one line, exit 2). perf_expect.py holds what each must show.
#   tests/gpu_check/perf_rehearsal.sh REPO
set -uo pipefail
repo=$(cd "${1:?usage: perf_rehearsal.sh REPO}" && pwd)
here=$repo/tests/gpu_check
script=gpu-perf.sh
# shellcheck source=tests/gpu_check/scenarios.sh
source "$here/scenarios.sh"

mkdir -p "$tmp/root/usr/local/cuda-13.0/bin" "$tmp/peers" "$tmp/Qbin"
cp "$here/fakes/nvcc" "$tmp/root/usr/local/cuda-13.0/bin/nvcc"
echo "# stands in for ../shared/peers/torch_resnet_gpu.py (fakes/python runs the fake)" > "$tmp/peers/torch_resnet_gpu.py"
ln -s "$here/fakes/ncu" "$tmp/Qbin/ncu"
cc -O1 -o "$tmp/fake_binary" "$here/fake_project/fake_binary.c" || exit 1
export FAKE_BINARY=$tmp/fake_binary
machine=(LOOM_GPU_CHECK_ROOT="$tmp/root" LOOM_PERF_PEER="$tmp/peers/torch_resnet_gpu.py")

# Bad usage, before anything runs: one line and exit 2.
for bad in "--workloads resnet9" "--amps fp8" "--deadline soon"; do
  # shellcheck disable=SC2086  # bad holds the arguments
  PATH=$search_path "$repo/scripts/gpu-perf.sh" $bad "$tmp/bad-out" > "$tmp/bad.${bad%% *}.txt" 2>&1
  echo $? >> "$tmp/bad.${bad%% *}.txt"
done
PATH=$search_path LOOM_PERF_VARIANTS="nocolon" "$repo/scripts/gpu-perf.sh" "$tmp/bad-out" > "$tmp/bad.variants.txt" 2>&1
echo $? >> "$tmp/bad.variants.txt"

start_scenario P "${machine[@]}" LOOM_PERF_DEADLINE=16 LOOM_PERF_AMPS=O0,O2,bf16 LOOM_PERF_PROFILER=none \
  FAKE_HANG=perf.imagenet.O0
finish_scenario P
touch "$tmp/P/build/marker-from-the-first-call"
EXTRA_PATH=$tmp/Qbin BUILD=$tmp/P/build start_scenario Q "${machine[@]}" LOOM_PERF_DEADLINE=120 \
  LOOM_PERF_WORKLOADS=resnet50_cifar_b128,convnet_b100 LOOM_PERF_AMPS=O2 LOOM_PERF_COMPILE_S=30 \
  FAKE_EXTRA_FLAGS=--channels-last \
  "LOOM_PERF_VARIANTS=default:;channels_last:--channels-last;bn_new:LOOM_FAKE_BN=new --batch-norm new"
finish_scenario Q
BUILD=$tmp/P/build start_scenario R "${machine[@]}" LOOM_PERF_DEADLINE=60 LOOM_PERF_WORKLOADS=mobilenet_v2_s32_b128 \
  LOOM_PERF_AMPS=O2 LOOM_PERF_PROFILER=none LOOM_PERF_VARIANTS=default:
finish_scenario R
BUILD=$tmp/P/build start_scenario S "${machine[@]}" LOOM_PERF_DEADLINE=60 LOOM_PERF_WORKLOADS=batch_norm_bandwidth \
  LOOM_PERF_AMPS=O2,O0 LOOM_PERF_VARIANTS=default:
finish_scenario S

for s in P Q R S; do
  echo "---- scenario $s: rc $(cat "$tmp/$s/rc"), $(cat "$tmp/$s/wall_ms") ms; console:"
  grep -E "^gpu-perf: (===|.*skipped|.*not built)" "$tmp/$s/console.txt" | grep -v ": ===.*(limit" | cut -c11-120 | tr '\n' ';'
  echo
done
python3 "$here/perf_expect.py" "$tmp"
