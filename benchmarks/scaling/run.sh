#!/usr/bin/env bash
# The scaling benchmark in one command: builds its programs, runs the driver
# (benchmarks/scaling/scaling.py) and leaves JSON, CSV and a PNG behind.
#   benchmarks/scaling/run.sh --quick     # CI-sized: ConvNet, world 1 and 2, a few steps
#   benchmarks/scaling/run.sh --full      # ConvNet + ResNet-18, repeats, bucket sweep, PyTorch, plot;
#                                         # writes benchmarks/results/scaling-<date>-<host>.* (under 10 min on the 2-core VM,
#                                         # 2026-11-29; more with more models or worlds)
#   benchmarks/scaling/run.sh --full --models convnet,resnet18,resnet50 --repeats 5   # driver flags pass through
# Environment: LOOM_BUILD (default ./build), LOOM_PEERS (../shared/peers).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${LOOM_BUILD:-build}
if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$build" --target scaling_step allreduce_timing -j "$(nproc)" >/dev/null
args=("$@")
if [[ " $* " == *" --full "* && " $* " != *" --out "* ]]; then
  args+=(--out benchmarks/results)
fi
echo "# $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
exec python3 benchmarks/scaling/scaling.py --build "$build" "${args[@]}"
