#!/usr/bin/env bash
# Builds loom's libFuzzer harnesses (tests/fuzz) with clang, ASan and UBSan in
# build-fuzz and runs each for a while.
#   scripts/fuzz.sh [seconds per harness, default 30] [harness...]
# Each harness starts from its committed seeds (tests/fuzz/corpus/<harness>)
# and regression cases (tests/fuzz/regressions/<harness>); what it learns is
# kept in build-fuzz/corpus/<harness> for the next run. A crash, a sanitizer
# report, an input that takes over 1 s, or one that makes the process use over
# 1 GiB (or ask for it in one allocation) fails the run; the input is saved
# under build-fuzz/artifacts/<harness>/. Commit it to regressions/<harness>/
# once fixed: CTest replays those in every build (fuzz_regression.<harness>).
# Environment: JOBS (build parallelism, default nproc); FUZZ_JOBS (harnesses
# run at once, default JOBS); FUZZ_SEED (libFuzzer's -seed; default 0, a new
# random seed each run). CI sets FUZZ_SEED=1: from the
# same seeds and an empty learned corpus a (single-threaded) harness then
# mutates in the same order on every run, so CI's 20 s repeat what a longer
# run with that seed checked, instead of failing at random on a bug it happens
# upon; finding new bugs is for runs without it.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-30}"
shift || true
harnesses=("$@")
if (( ${#harnesses[@]} == 0 )); then
  # Every harness there is (tests/fuzz/fuzz_<harness>.cpp).
  for source in tests/fuzz/fuzz_*.cpp; do
    name=$(basename "$source" .cpp)
    harnesses+=("${name#fuzz_}")
  done
fi
dir=build-fuzz
jobs="${JOBS:-$(nproc)}"

launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(cd .. && pwd)}"
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$dir" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DLOOM_CUDA=OFF -DLOOM_FUZZ=ON -DLOOM_BUILD_BENCHMARKS=OFF "${launcher[@]}" >/dev/null
cmake --build "$dir" -j "$jobs" --target "${harnesses[@]/#/fuzz_}"

export ASAN_OPTIONS="${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"

# One harness's run; its output goes to $dir/fuzz_<harness>.log, its exit
# status to $dir/fuzz_<harness>.status.
run_harness() {
  local harness=$1 corpus="$dir/corpus/$1" artifacts="$dir/artifacts/$1" status=0
  local seeds=(tests/fuzz/corpus/"$harness")
  [[ -d tests/fuzz/regressions/$harness ]] && seeds+=(tests/fuzz/regressions/"$harness")
  "$dir/tests/fuzz/fuzz_$harness" -max_total_time="$seconds" -timeout=1 -rss_limit_mb=1024 \
    -malloc_limit_mb=1024 -print_final_stats=1 -seed="${FUZZ_SEED:-0}" -artifact_prefix="$artifacts/" "$corpus" \
    "${seeds[@]}" > "$dir/fuzz_$harness.log" 2>&1 || status=$?
  echo "$status" > "$dir/fuzz_$harness.status"
}

# The harnesses are single-threaded: run as many at once as there are cores
# (FUZZ_JOBS), each still for `seconds`.
fuzz_jobs="${FUZZ_JOBS:-$jobs}"
echo "fuzz: ${#harnesses[@]} harnesses, ${seconds} s each, ${fuzz_jobs} at a time"
for harness in "${harnesses[@]}"; do
  mkdir -p "$dir/corpus/$harness" "$dir/artifacts/$harness"
  rm -f "$dir/fuzz_$harness.status"
  while (( $(jobs -rp | wc -l) >= fuzz_jobs )); do wait -n || true; done
  run_harness "$harness" &
done
wait
failed=()
for harness in "${harnesses[@]}"; do
  log="$dir/fuzz_$harness.log"
  echo "== fuzz_$harness: ${seconds} s"
  if [[ "$(cat "$dir/fuzz_$harness.status" 2>/dev/null)" == 0 ]]; then
    # The executions, coverage (cov: edges, ft: features) and corpus at the end, and the peak memory.
    grep -E "DONE|^stat::number_of_executed_units|^stat::peak_rss_mb" "$log" | sed 's/^/   /' || true
  else
    echo "fuzz_$harness FAILED (log $log; input under $dir/artifacts/$harness):"
    # What went wrong, the stack, and what the harness or the C++ runtime
    # printed before dying (an abort's reason, an uncaught exception).
    grep -E "ERROR|SUMMARY|Test unit written|timeout|out-of-memory|malloc\(|^ *#[0-9]+ 0x|^fuzz_|terminate|what\(\)" \
      "$log" | head -n 40 | sed 's/^/   /'
    failed+=("$harness")
  fi
done
if (( ${#failed[@]} )); then
  echo "fuzz: failed: ${failed[*]}"
  exit 1
fi
echo "fuzz: ${#harnesses[@]} harnesses ran ${seconds} s each without a failure"
