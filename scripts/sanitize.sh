#!/usr/bin/env bash
# Builds loom's CPU suite with sanitizers and runs it.
#   scripts/sanitize.sh address [ctest args...]   ASan + UBSan in build-asan
#   scripts/sanitize.sh thread  [ctest args...]   TSan in build-tsan
# Extra arguments go to ctest, e.g. `-R 'dist\.|test_data'` or `-E models.resume`.
# Environment: JOBS (build and ctest parallelism, default: nproc),
# LOOM_TEST_TIMEOUT_SCALE (test timeouts are multiplied by it; default 4),
# SANITIZE_BUILD_ONLY=1 (build, run nothing). The runtime options (halt on the
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

launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(cd .. && pwd)}"
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
# RelWithDebInfo: optimized (the suite is slow enough under a sanitizer) with
# line numbers in the reports.
cmake -S . -B "$dir" -DLOOM_CUDA=OFF -DLOOM_SANITIZE="$sanitizers" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DLOOM_TEST_TIMEOUT_SCALE="${LOOM_TEST_TIMEOUT_SCALE:-4}" \
      "${launcher[@]}" >/dev/null
cmake --build "$dir" -j "$jobs"
[[ "${SANITIZE_BUILD_ONLY:-0}" == 1 ]] && exit 0
# Sanitizer reports go to files there (also those of child processes whose
# output a test does not show); any file is a failure.
reports="$dir/sanitizer-reports"
rm -rf "$reports" && mkdir -p "$reports"
status=0
# GPU tests skip on a CPU build anyway; the sanitized build is CPU only.
ctest --test-dir "$dir" -j "$jobs" --output-on-failure -LE gpu "$@" || status=$?
if compgen -G "$reports/*" >/dev/null; then
  for report in "$reports"/*; do
    echo "==== sanitizer report $report"
    cat "$report"
  done
  echo "sanitize: $(ls "$reports" | wc -l) sanitizer report(s) in $reports"
  status=1
fi
exit "$status"
