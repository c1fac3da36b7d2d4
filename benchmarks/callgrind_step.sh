#!/usr/bin/env bash
# Instruction counts of ONE training step of each CPU benchmark model under
# valgrind --tool=callgrind: a signal that stays put on a busy machine, where
# timings do not. Counts ignore memory stalls and threading, so read them as
# "work done", beside (not instead of) the quiet-machine timings.
# Usage: benchmarks/callgrind_step.sh [threads] [out_dir] [cases...]
#   threads: 1 (default; with more, the worker threads' instructions are not
#            counted: callgrind toggles collection per thread)
#   out_dir: where the callgrind.out.* files go (default: a temporary directory);
#            read one with callgrind_annotate --inclusive=yes FILE.
#   cases:   model:stem:batch (default: resnet50:imagenet:32 resnet50:cifar:32
#            convnet:-:100). Under callgrind a step runs about 50x slower: the
#            CIFAR stem's batch 32 takes long on a loaded machine; its counts
#            grow about linearly with the batch.
#   LOOM_BUILD=dir picks the build directory (default: build); the build needs
#   the training_step target (cmake --build build --target training_step).
# Prints one line per case: model, stem, batch, instructions (Ir) of the step.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-1}
out=${2:-$(mktemp -d)}
shift $(( $# < 2 ? $# : 2 ))
cases=("$@")
(( ${#cases[@]} )) || cases=(resnet50:imagenet:32 resnet50:cifar:32 convnet:-:100)
build=${LOOM_BUILD:-build}
step="$build/benchmarks/training_step"
if [[ ! -x "$step" ]]; then
  echo "callgrind_step.sh: $step not found; build it with: cmake --build $build --target training_step" >&2
  exit 1
fi
command -v valgrind >/dev/null || { echo "callgrind_step.sh: valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
mkdir -p "$out"
for case in "${cases[@]}"; do
  IFS=: read -r model stem batch <<<"$case"
  name="$model-$stem-b$batch-t$threads"
  file="$out/callgrind.out.$name"
  # Only counted_training_step (one step after a warm-up step) is counted;
  # instrumentation starts there too when training_step was built with
  # valgrind's headers (callgrind.h).
  OMP_NUM_THREADS=$threads valgrind --tool=callgrind --callgrind-out-file="$file" --collect-atstart=no \
    --instr-atstart="$([[ $("$step" --callgrind-requests 2>/dev/null) == yes ]] && echo no || echo yes)" \
    --toggle-collect='counted_training_step*' \
    "$step" --model "$model" --stem "${stem/-/imagenet}" --batch "$batch" --threads "$threads" --warmup 1 \
    >"$out/$name.stdout" 2>"$out/$name.log"
  ir=$(callgrind_annotate "$file" 2>/dev/null | awk '/PROGRAM TOTALS/ && !found {gsub(",", "", $1); print $1; found = 1}')  # reads to the end: no SIGPIPE under pipefail
  printf '%-10s %-9s batch %-4s threads %s  Ir %s\n' "$model" "$stem" "$batch" "$threads" "$ir"
done
echo "callgrind files: $out" >&2
