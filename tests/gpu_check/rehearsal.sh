#!/usr/bin/env bash
# The GPU check's rehearsal, on a machine without a GPU: scripts/gpu-check.sh
# itself, driven with a fake nvidia-smi on PATH (one H200, or two that do not
# report their compute capability), a fake nvcc where the real one is not
# looked for on PATH, a tiny CMake project in place of loom's build
# (fake_project/: the same targets, binary paths and gpu tests) and fake steps
# that fail, hang or are killed. The scenarios run side by side:
#   A  one H200; CMake's configure hangs past the deadline
#   C  two GPUs, no compute capability, nvcc only in PyTorch's nvidia/*/bin and
#      no compute-sanitizer, a binary that fails to compile, a gpu test that
#      fails and one that hangs; then B, a second call on C's build with
#      nothing failing and a fake compute-sanitizer on PATH
#   D  one H200, nvcc in /usr/local/cuda-*/bin; SIGKILLed while the env step's
#      PyTorch query hangs
#   E  nvidia-smi fails (no GPU)
#   F  one H200, compute-sanitizer beside nvcc in /usr/local/cuda-*/bin that
#      finds an error under memcheck and refuses the device under synccheck; a
#      staged train_mnist run fails
# expect.py holds what each must show.
#   tests/gpu_check/rehearsal.sh REPO
set -uo pipefail
repo=$(cd "${1:?usage: rehearsal.sh REPO}" && pwd)
here=$repo/tests/gpu_check
script=gpu-check.sh
# shellcheck source=tests/gpu_check/scenarios.sh
source "$here/scenarios.sh"

# A nvcc in two /usr/local/cuda-* directories under a fake root (the newer
# must win); for C only in a fake site-packages' nvidia/cuda_nvcc/bin.
for v in 12.9 13.0; do
  mkdir -p "$tmp/root/usr/local/cuda-$v/bin"
  cp "$here/fakes/nvcc" "$tmp/root/usr/local/cuda-$v/bin/nvcc"
done
mkdir -p "$tmp/emptyroot" "$tmp/siteC/nvidia/cuda_nvcc/bin"
cp "$here/fakes/nvcc" "$tmp/siteC/nvidia/cuda_nvcc/bin/nvcc"
# compute-sanitizer beside the newest nvcc (F's), and on PATH for B.
cp "$here/fakes/compute-sanitizer" "$tmp/root/usr/local/cuda-13.0/bin/compute-sanitizer"
mkdir -p "$tmp/sanitizerB"
cp "$here/fakes/compute-sanitizer" "$tmp/sanitizerB/compute-sanitizer"

cc -O1 -o "$tmp/fake_binary" "$here/fake_project/fake_binary.c" || exit 1
export FAKE_BINARY=$tmp/fake_binary
start_scenario A LOOM_GPU_CHECK_ROOT="$tmp/root" LOOM_GPU_DEADLINE=16 FAKE_HANG=configure
machine_c=(LOOM_GPU_CHECK_ROOT="$tmp/emptyroot" FAKE_GPUS=2 FAKE_NO_CAP=1)
EXTRA_PYTHONPATH=$tmp/siteC start_scenario C "${machine_c[@]}" LOOM_GPU_DEADLINE=90 \
  FAKE_BUILD_FAIL=train_mnist FAKE_FAIL=gpu.runtime FAKE_HANG=gpu.backend_ops
start_scenario D LOOM_GPU_CHECK_ROOT="$tmp/root" LOOM_GPU_DEADLINE=60 FAKE_HANG=env
start_scenario E LOOM_GPU_CHECK_ROOT="$tmp/root" FAKE_NVSMI_FAIL=1
start_scenario F LOOM_GPU_CHECK_ROOT="$tmp/root" LOOM_GPU_DEADLINE=90 FAKE_SANITIZER_FINDING=memcheck \
  FAKE_SANITIZER_REFUSE=synccheck FAKE_FAIL=train_mnist.shm_g4

# D: once the hanging PyTorch query's last line before the hang (printed
# without a flush) is in gpu-check.log, SIGKILL the check.
# (Up to 90 s: once in CI, beside two package builds, 40 s were not enough;
# the failure message then shows the log's end.)
for _ in $(seq 900); do
  grep -q 'torch_nccl: 2.28.3' "$tmp/D/out/gpu-check.log" 2>/dev/null && break
  kill -0 "$(cat "$tmp/D/pid")" 2>/dev/null || break
  sleep 0.1
done
kill -KILL "$(cat "$tmp/D/pid")" 2>/dev/null
finish_scenario D
finish_scenario E
finish_scenario A
finish_scenario C
finish_scenario F
# B: a second call on the same machine (C's), on C's build directory, nothing
# failing; compute-sanitizer found on PATH.
touch "$tmp/C/build/marker-from-the-first-call"
EXTRA_PATH=$tmp/sanitizerB EXTRA_PYTHONPATH=$tmp/siteC BUILD=$tmp/C/build start_scenario B "${machine_c[@]}" \
  LOOM_GPU_DEADLINE=90
finish_scenario B
# G: a third call on that machine that runs only the sanitizer steps
# (LOOM_GPU_ONLY); an expression that is not one is refused.
EXTRA_PATH=$tmp/sanitizerB EXTRA_PYTHONPATH=$tmp/siteC BUILD=$tmp/C/build start_scenario G "${machine_c[@]}" \
  LOOM_GPU_DEADLINE=90 'LOOM_GPU_ONLY=^sanitizer\.'
finish_scenario G
PATH=$search_path LOOM_GPU_ONLY='([' "$repo/scripts/gpu-check.sh" "$tmp/bad-only" > "$tmp/bad-only.txt" 2>&1
echo $? >> "$tmp/bad-only.txt"

for s in A B C D E F G; do
  echo "---- scenario $s: rc $(cat "$tmp/$s/rc"), $(cat "$tmp/$s/wall_ms") ms; console:"
  grep -E "^gpu-check: (===|.*skipped|.*not built)" "$tmp/$s/console.txt" | grep -v ": ===.*(limit" | cut -c12-120 | tr '\n' ';'
  echo
done
python3 "$here/expect.py" "$tmp"
