# shellcheck shell=bash
# What the rehearsals of scripts/gpu-check.sh (rehearsal.sh) and
# scripts/gpu-perf.sh (perf_rehearsal.sh) share, sourced by both after they
# set repo, here and script: a temporary directory removed at exit with every
# fake process left hanging, a PATH without nvcc and nvidia-smi that starts
# with the fakes, and the scenarios (started side by side, each watched by
# sampler.py, then waited for).
tmp=$(mktemp -d "${TMPDIR:-/tmp}/${script%.sh}-rehearsal.XXXXXX")
cleanup() {
  local f pid
  for f in "$tmp"/*/state/pids/*.pid; do
    [[ -f $f ]] && pid=$(cat "$f") && kill "$pid" 2>/dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

real_python=$(python3 -c 'import sys; print(sys.executable)')

# PATH without any nvcc, nvidia-smi, ncu, nsys or compute-sanitizer: a directory
# that holds them is replaced by a copy of its other entries (symbolic links);
# the fakes come first.
fakebin=$tmp/fakebin
mkdir -p "$fakebin"
ln -s "$here/fakes/nvidia-smi" "$fakebin/nvidia-smi"
ln -s "$real_python" "$fakebin/python3"
search_path=$fakebin
IFS=: read -ra path_dirs <<< "$PATH"
for d in "${path_dirs[@]}"; do
  [[ -d $d ]] || continue
  if [[ -e $d/nvcc || -e $d/nvidia-smi || -e $d/ncu || -e $d/nsys || -e $d/compute-sanitizer ]]; then
    filtered=$tmp/path/$(printf '%s' "$d" | tr / _)
    mkdir -p "$filtered"
    find "$d" -mindepth 1 -maxdepth 1 ! -name nvcc ! -name nvidia-smi ! -name ncu ! -name nsys \
      ! -name compute-sanitizer -print0 |
      xargs -0 -r ln -s -t "$filtered"
    search_path+=":$filtered"
  else
    search_path+=":$d"
  fi
done

# start_scenario NAME VARIABLE=value...: runs scripts/$script OUT in the
# background in its own directory $tmp/NAME (state/ for the fakes, out/, the
# console, rc, wall_ms, the sampler's findings), with that environment beside
# the rehearsal's; EXTRA_PATH comes first on PATH, BUILD replaces the build
# directory, EXTRA_PYTHONPATH is added to the fakes' site.
start_scenario() {
  local name=$1
  shift
  local dir=$tmp/$name
  mkdir -p "$dir/state/pids" "$dir/out"
  : > "$dir/state/compiles"
  python3 "$here/sampler.py" "$dir/out" "$dir/stop" "$dir/sampler.json" &
  echo $! > "$dir/sampler.pid"
  local started
  started=$(date +%s%N)
  ( env -u PYTHONUNBUFFERED -u LOOM_GPU_NVCC -u LOOM_GPU_ARCH -u LOOM_GPU_STEPS -u LOOM_GPU_DEADLINE \
      -u LOOM_GPU_SANITIZER -u LOOM_PERF_DEADLINE -u LOOM_PERF_WORKLOADS -u LOOM_PERF_AMPS -u LOOM_PERF_VARIANTS -u LOOM_PERF_PEER \
      -u LOOM_PERF_PEER_MODES -u LOOM_PERF_PROFILER -u LOOM_PERF_COMPILE_S -u LOOM_PERF_REPEATS -u LOOM_PERF_STEPS \
      -u LOOM_PERF_WARMUP PATH="${EXTRA_PATH:+$EXTRA_PATH:}$search_path" PYTHONPATH="$here/fakes/site${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH}" \
      FAKE_STATE="$dir/state" FAKE_DIR="$here/fakes" FAKE_REAL_PYTHON="$real_python" \
      LOOM_GPU_PYTHON="$here/fakes/python" LOOM_GPU_CHECK_SOURCE="$here/fake_project" \
      LOOM_GPU_BUILD="${BUILD:-$dir/build}" LOOM_GPU_MARGIN=3 LOOM_GPU_MIN_STEP=3 LOOM_GPU_KILL_GRACE=1 \
      LOOM_GPU_TEST_TIMEOUT=2 LOOM_GPU_JOBS=2 TMPDIR="$dir" "$@" \
      "$repo/scripts/$script" "$dir/out" > "$dir/console.txt" 2>&1 &
    echo $! > "$dir/pid"
    wait $!
    rc=$?
    echo $(( ($(date +%s%N) - started) / 1000000 )) > "$dir/wall_ms"
    echo "$rc" > "$dir/rc"
    touch "$dir/stop" ) 2> "$dir/runner.err" &
  echo $! > "$dir/runner.pid"
  until [[ -s $dir/pid ]]; do sleep 0.01; done
}

# finish NAME: waits for the check (its rc and milliseconds are recorded as it
# ends) and its sampler.
finish_scenario() {
  local dir=$tmp/$1
  wait "$(cat "$dir/runner.pid")"
  wait "$(cat "$dir/sampler.pid")"
}

