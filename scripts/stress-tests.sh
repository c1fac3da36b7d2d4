#!/usr/bin/env bash
# Runs the whole CPU suite N times while background processes keep every core
# busy, to find tests that fail under load (timeouts too tight, races, port
# clashes). Reports each repetition and the failed tests; exits non-zero when
# any repetition failed.
#   scripts/stress-tests.sh N [build dir, default build] [ctest args...]
# Environment: JOBS (ctest -j, default nproc), LOAD (busy processes, default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."

repetitions="${1:?usage: scripts/stress-tests.sh N [build dir] [ctest args...]}"
shift
dir="${1:-build}"
shift || true
jobs="${JOBS:-$(nproc)}"
load="${LOAD:-$(nproc)}"
[[ -f "$dir/CTestTestfile.cmake" ]] || { echo "stress-tests: $dir is not a configured build (run scripts/setup.sh)" >&2; exit 2; }

# The load: one busy loop per core, at normal priority, killed on exit.
busy=()
cleanup() { for pid in "${busy[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT
for ((i = 0; i < load; ++i)); do
  ( while :; do :; done ) &
  busy+=("$!")
done

logs="$dir/stress"
mkdir -p "$logs"
failed_runs=0
declare -A failures=()
for ((run = 1; run <= repetitions; ++run)); do
  log="$logs/run-$run.log"
  start=$SECONDS
  if ctest --test-dir "$dir" -j "$jobs" -LE gpu --output-on-failure "$@" > "$log" 2>&1; then
    echo "stress-tests: run $run/$repetitions passed ($((SECONDS - start)) s, $(grep -c 'Test *#' "$log") tests)"
  else
    failed_runs=$((failed_runs + 1))
    names=$(sed -n 's/^ *[0-9]* - \([^ ]*\) (.*/\1/p' "$log" | tr '\n' ' ')
    echo "stress-tests: run $run/$repetitions FAILED ($((SECONDS - start)) s): $names(log $log)"
    for name in $names; do failures[$name]=$(( ${failures[$name]:-0} + 1 )); done
  fi
done
echo "stress-tests: $repetitions repetitions under $load busy processes, $failed_runs failed"
for name in "${!failures[@]}"; do echo "  $name failed ${failures[$name]} time(s)"; done
(( failed_runs == 0 ))
