#!/usr/bin/env bash
# --version on every app: exit 0, nothing on stderr, "PROGRAM VERSION" first
# (VERSION from project(VERSION) in CMakeLists.txt, given by CTest), then
# loom's build summary and this machine's kernels.
#   apps_version.sh VERSION CUDA(ON|OFF) train_mnist train_resnet50_cifar loomrun
set -u
version=$1 cuda=$2
shift 2
source "$(dirname "$0")/dist_common.sh"
make_work_dir
failures=0
for bin in "$@"; do
  app=$(basename "$bin")
  out=$(timeout 60 "$bin" --version 2>"$work/err")
  status=$?
  err=$(cat "$work/err")
  problem=""
  if [[ $status -ne 0 ]]; then problem="exit status $status"
  elif [[ -n "$err" ]]; then problem="stderr: $err"
  elif [[ "$(head -n 1 <<<"$out")" != "$app $version" ]]; then problem="first line is not '$app $version'"
  elif ! grep -q "^loom $version" <<<"$out"; then problem="no 'loom $version' line"
  elif ! grep -q "^CPU kernels: .*Eigen" <<<"$out"; then problem="no CPU kernels line"
  elif [[ $cuda == ON ]] && ! grep -q "^CUDA [0-9.]* for architectures .*, cuDNN [0-9]" <<<"$out"; then problem="no CUDA line with architectures and cuDNN"
  elif [[ $cuda != ON ]] && ! grep -q "^CUDA: not built in" <<<"$out"; then problem="no 'CUDA: not built in'"
  elif ! grep -q "^this machine: f32 GEMM kernel " <<<"$out"; then problem="no 'this machine' line"
  fi
  if [[ -n "$problem" ]]; then
    echo "FAIL $app --version: $problem"; printf '%s\n' "$out"; failures=$((failures + 1))
  else
    echo "ok   $app --version:"; printf '%s\n' "$out" | sed 's/^/     /'
  fi
done
exit $((failures > 0))
