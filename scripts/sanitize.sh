#!/usr/bin/env bash
# Builds loom's CPU suite with sanitizers and runs it.
#   scripts/sanitize.sh address [ctest args...]   ASan + UBSan in build-asan
#   scripts/sanitize.sh thread  [ctest args...]   TSan in build-tsan
# Extra arguments go to ctest, e.g. `-R 'dist\.|test_data'` or `-E models.resume`.
# `thread` without ctest arguments builds and runs only what issue 18 asks TSan
# to cover: the data loader (test_data), the process groups, stores, DDP and
# launcher (dist.*) and loomrun (loomrun_*); give ctest arguments (e.g. `-E
# '^$'` for everything) to build the whole suite and run that instead.
# Environment: JOBS (build and ctest parallelism, default: nproc),
# LOOM_TEST_TIMEOUT_SCALE (test timeouts are multiplied by it; default 4),
# SANITIZE_BUILD_ONLY=1 (build, run nothing), SANITIZE_CMAKE_ARGS (more
# configure arguments, e.g. -DLOOM_BUILD_BENCHMARKS=OFF), SANITIZE_SKIP_LABELS
# (tests with these CTest labels are not run; default gpu). The runtime options (halt on the
# first report, suppression files) come from the CTest properties that
# tests/CMakeLists.txt sets in a sanitized build, so plain `ctest --test-dir
# build-asan` checks the same way.
set -euo pipefail
cd "$(dirname "$0")/.."

kind="${1:-}"
case "$kind" in
  address) sanitizers=address,undefined; dir=build-asan ;;
  thread) sanitizers=thread; dir=build-tsan ;;
  *) echo "usage: scripts/sanitize.sh address|thread [ctest args...]" >&2; exit 2 ;;
esac
shift
jobs="${JOBS:-$(nproc)}"
targets=()
if [[ "$kind" == thread && $# == 0 ]]; then
  targets=(--target test_data loom_dist_tests loom_store_tool loomrun train_mnist)
  set -- -R '^(test_data|dist\..*|loomrun_.*)$'
fi

launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(cd .. && pwd)}"
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
# RelWithDebInfo: optimized (the suite is slow enough under a sanitizer) with
# line numbers in the reports.
cmake -S . -B "$dir" -DLOOM_CUDA=OFF -DLOOM_SANITIZE="$sanitizers" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DLOOM_TEST_TIMEOUT_SCALE="${LOOM_TEST_TIMEOUT_SCALE:-4}" \
      "${launcher[@]}" ${SANITIZE_CMAKE_ARGS:-} >/dev/null
cmake --build "$dir" -j "$jobs" "${targets[@]}"
[[ "${SANITIZE_BUILD_ONLY:-0}" == 1 ]] && exit 0
# Sanitizer reports go to files there (also those of child processes whose
# output a test does not show); any file is a failure.
reports="$dir/sanitizer-reports"
rm -rf "$reports" && mkdir -p "$reports"
status=0
# GPU tests skip on a CPU build anyway; the sanitized build is CPU only.
ctest --test-dir "$dir" -j "$jobs" --output-on-failure -LE "${SANITIZE_SKIP_LABELS:-gpu}" "$@" || status=$?
if compgen -G "$reports/*" >/dev/null; then
  for report in "$reports"/*; do
    echo "==== sanitizer report $report"
    cat "$report"
  done
  echo "sanitize: $(ls "$reports" | wc -l) sanitizer report(s) in $reports"
  status=1
fi
# GCC 12's combined ASan+UBSan runtime ignores log_path for UBSan's reports
# (they go to stderr; clang's writes the file): find them in the output of
# every test, passing ones too, which holds the children's inherited stderr.
# A child whose stderr its test captures still dies (halt_on_error, exit 1).
log="$dir/Testing/Temporary/LastTest.log"
if [[ -f "$log" ]] && grep -qE "runtime error: |ERROR: (Address|Leak|Thread)Sanitizer|WARNING: ThreadSanitizer" "$log"; then
  echo "==== sanitizer reports in the tests' output ($log):"
  grep -nE -A 12 "runtime error: |ERROR: (Address|Leak|Thread)Sanitizer|WARNING: ThreadSanitizer" "$log" | head -n 200
  status=1
fi
exit "$status"
