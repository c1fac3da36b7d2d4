# shellcheck shell=bash
# What scripts/gpu-check.sh and scripts/gpu-perf.sh share, sourced by both: a
# table of steps run in order under one deadline (each under `timeout -k` with
# the smaller of its own cap and the time left, less a margin; skipped when
# less than a minimum is left), summary.json rewritten atomically before and
# after every step, every step's log packed into results.tar.gz, and the
# machine: nvidia-smi, nvcc (PATH, /usr/local/cuda*/bin, PyTorch's
# nvidia/*/bin), the libraries' directories, .deps, and a CMake configuration
# reused on a warm machine through its stamp.
#
# The sourcing script sets `tool` (its name in messages and its log's name),
# `self` and `repo`, and defines figures_command (prints the figures JSON,
# read from the step logs in $work; it may also write the script's own files
# into OUT). It may set skip_rc: a step that exits with it is recorded as
# skipped and counts as passed, its note taken from the last "skipped: " line
# it printed; and define before_step, after_step and print_last (see run_steps,
# run_step, finish_run).
#
# Settings, for both scripts (environment):
#   LOOM_GPU_MARGIN    seconds kept back from every step's limit for the kill, packing and
#                      the summary (15)
#   LOOM_GPU_MIN_STEP  a step is skipped when less than this is left after the margin (30)
#   LOOM_GPU_KILL_GRACE  seconds between timeout's TERM and its KILL (5)
#   LOOM_GPU_TEST_TIMEOUT  seconds each gpu test may run (120; part of the CMake configuration)
#   LOOM_GPU_BUILD     build directory (build-gpu), shared by both scripts; LOOM_GPU_JOBS (nproc)
#   LOOM_GPU_ARCH      CUDA architecture, instead of nvidia-smi's compute capability
#   LOOM_GPU_NVCC      nvcc to use; else PATH, /usr/local/cuda/bin, /usr/local/cuda-*/bin
#                      (newest first), then PyTorch's nvidia/*/bin
#   LOOM_GPU_PYTHON    the Python with PyTorch (python3)
# For the CI rehearsal (tests/gpu_check) only: LOOM_GPU_CHECK_SOURCE (the CMake
# project to configure and build, default this repository) and
# LOOM_GPU_CHECK_ROOT (a prefix for the /usr/local/cuda* search).

log() { printf '%s: %s\n' "$tool" "$*"; }

# The clock in milliseconds (bash 5's EPOCHREALTIME, no subprocess).
now_ms() { local t=${EPOCHREALTIME/./}; now=$(( 10#$t / 1000 )); }

# json_string TEXT: TEXT as a JSON string in $J (quotes, backslashes and
# control characters escaped; no subprocess, as the summary is written often).
json_string() {
  local s=$1
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  s=${s//$'\r'/\\r}
  s=${s//$'\t'/\\t}
  s=${s//[$'\001'-$'\037']/}
  J="\"$s\""
}

# ---- finding nvcc ------------------------------------------------------------------------------

# python_nvidia_dirs: the nvidia/* package directories of the Python's
# site-packages (PyTorch's CUDA wheels: nvidia/cudnn, nvidia/nccl, nvidia/cuda_nvcc, ...).
python_nvidia_dirs() {
  timeout 60 "$py" - <<'PY' 2>/dev/null
import os, site, sys
roots = []
candidates = list(getattr(site, "getsitepackages", lambda: [])()) + [site.getusersitepackages()] + sys.path
for d in candidates:
    root = os.path.realpath(os.path.join(d, "nvidia")) if d else ""
    if root and os.path.isdir(root) and root not in roots:
        roots.append(root)
for root in roots:
    for name in sorted(os.listdir(root)):
        if os.path.isdir(os.path.join(root, name)):
            print(os.path.join(root, name))
PY
}

# find_nvcc: prints the nvcc to build with, or nothing ($nvidia_dirs: python_nvidia_dirs' answer).
find_nvcc() {
  local root=${LOOM_GPU_CHECK_ROOT:-} candidate
  if [[ -n ${LOOM_GPU_NVCC:-} ]]; then
    echo "$LOOM_GPU_NVCC"
    return
  fi
  if candidate=$(command -v nvcc); then
    echo "$candidate"
    return
  fi
  local dirs=("$root/usr/local/cuda/bin")
  local versioned
  versioned=$(compgen -G "$root/usr/local/cuda-*/bin" | sort -V -r)
  [[ -n $versioned ]] && mapfile -t -O 1 dirs <<< "$versioned"
  while IFS= read -r candidate; do
    [[ -n $candidate ]] && dirs+=("$candidate/bin")
  done <<< "$nvidia_dirs"
  for candidate in "${dirs[@]}"; do
    if [[ -x $candidate/nvcc ]]; then
      echo "$candidate/nvcc"
      return
    fi
  done
}

# arch_of CAP: the CMake CUDA architecture of a compute capability ("9.0" -> 90);
# 90 (H100/H200) when the query answered nothing usable.
arch_of() {
  local cap=${1//[[:space:]]/}
  if [[ $cap =~ ^[0-9]+\.[0-9]+$ ]]; then echo "${cap/./}"; else echo 90; fi
}

# ---- internal steps both scripts run (as `SCRIPT --internal NAME ...` under timeout) ------------

# internal_build DIR JOBS TARGET...: builds those of the targets that the
# configured project has (test_gpu_nccl exists only when CMake found NCCL),
# keeping going past errors so that one compile error loses only what needs it.
internal_build() {
  local dir=$1 jobs=$2 target present=()
  shift 2
  local known keep_going=(-k)
  [[ -f $dir/build.ninja ]] && keep_going=(-k 0)
  known=$(cmake --build "$dir" --target help 2>/dev/null)
  for target in "$@"; do
    if grep -qE "(^|\.\.\. )$target(:|\$| )" <<< "$known"; then
      present+=("$target")
    else
      echo "build: the project has no target $target (skipped)"
    fi
  done
  echo "build: ${present[*]} (-j $jobs, ${keep_going[*]})"
  cmake --build "$dir" -j "$jobs" --target "${present[@]}" -- "${keep_going[@]}"
}

# internal_data DIR: synthetic IDX files (a learnable bar per class) in DIR.
internal_data() {
  local dir=$1
  "$py" - "$dir" <<'PY'
import os, struct, sys
import numpy as np
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(0)
def write(prefix, n):
    labels = rng.integers(0, 10, n).astype(np.uint8)
    images = rng.normal(40, 30, (n, 28, 28))
    for k in range(10):  # class k lights a k-dependent bar
        images[labels == k, 2 * k:2 * k + 8, 4:24] += 120
    images = np.clip(images, 0, 255).astype(np.uint8)
    with open(os.path.join(out, f"{prefix}-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
    with open(os.path.join(out, f"{prefix}-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 2049, n) + labels.tobytes())
write("train", 20000)
write("t10k", 2000)
print(f"synthetic IDX data in {out}")
PY
}

# data_step_command: sets data (the IDX directory the ConvNet steps read:
# Fashion-MNIST if installed, else synthetic files in the build directory) and
# data_cmd (the data step's command).
data_step_command() {
  data=/usr/share/datasets/fashion-mnist
  data_cmd="echo 'data: Fashion-MNIST in $data'"
  if [[ ! -f $data/train-images-idx3-ubyte && ! -f $data/train-images-idx3-ubyte.gz ]]; then
    data=$build/synthetic-mnist
    data_cmd="$(printf '%q' "$self") --internal data $(printf '%q' "$data")"
    [[ -f $data/t10k-labels-idx1-ubyte ]] && data_cmd="echo 'data: synthetic IDX files in $data (made earlier)'"
  fi
}

# ---- the summary and the packed results --------------------------------------------------------

# Step table: parallel arrays, index = order of value. passes_skipped[i] is 1
# for a step that skipped itself (skip_rc): that counts as success.
names=() caps=() needs=() commands=() status=() rcs=() seconds=() limits=() notes=() passes_skipped=()

add_step() {  # add_step NAME CAP NEEDS COMMAND (NEEDS: a binary that must exist, or "")
  names+=("$1") caps+=("$2") needs+=("$3") commands+=("$4")
  status+=("pending") rcs+=("null") seconds+=("null") limits+=("null") notes+=("") passes_skipped+=(0)
}

# step_passed I: whether step I succeeded (or skipped itself).
step_passed() { [[ ${status[$1]} == ok || ( ${status[$1]} == skipped && ${passes_skipped[$1]} == 1 ) ]]; }

# publish [figures]: summary.json (the step table, written here, and the
# figures figures_command last read from the logs: read again when "figures"
# is given, i.e. after a step that ran) and, after a step that ran,
# results.tar.gz; each replaced atomically (a rename within OUT).
publish() {
  now_ms
  local i sep="" ok=$finished tmp=$out/.summary.json.tmp
  [[ -n $error ]] && ok=false
  for i in "${!status[@]}"; do step_passed "$i" || ok=false; done
  if [[ ${1:-} == figures ]]; then
    figures_command > "$work/.figures.json" 2>> "$work/summary-errors.txt" &&
      mv -f "$work/.figures.json" "$work/figures.json" && figures=$(< "$work/figures.json")
  fi
  local e g c a n b
  json_string "$error"; e=$J
  json_string "$gpu_name"; g=$J
  json_string "$gpu_cap"; c=$J
  json_string "$arch"; a=$J
  json_string "$nvcc"; n=$J
  json_string "$build"; b=$J
  {
    printf '{"ok": %s, "finished": %s, "deadline_s": %d, "elapsed_s": %d, "error": %s,\n' \
      "$ok" "$finished" "$deadline" $(( (now - start) / 1000 )) "$e"
    printf ' "machine": {"gpu": %s, "gpu_count": %d, "compute_capability": %s, "arch": %s, "nvcc": %s, "build": %s},\n' \
      "$g" "$gpu_count" "$c" "$a" "$n" "$b"
    printf ' "steps": [\n'
    for i in "${!names[@]}"; do
      json_string "${names[$i]}"; n=$J
      json_string "${status[$i]}"; c=$J
      json_string "${notes[$i]}"; e=$J
      printf '%s  {"name": %s, "status": %s, "rc": %s, "seconds": %s, "limit_s": %s, "cap_s": %d, "note": %s}' \
        "$sep" "$n" "$c" "${rcs[$i]}" "${seconds[$i]}" "${limits[$i]}" "${caps[$i]}" "$e"
      sep=$',\n'
    done
    printf '\n ],\n "figures": '
    printf '%s\n' "$figures"
    printf '}\n'
  } > "$tmp" && mv -f "$tmp" "$out/summary.json"
  [[ ${1:-} == figures ]] || return 0
  cp "$out/summary.json" "$work/summary.json"
  if tar -C "$work" --exclude='./.*' -czf "$out/.results.tar.gz.tmp" . 2>/dev/null; then
    # Over 15 MiB it would not come back: keep only the last MiB of each log.
    if (( $(stat -c %s "$out/.results.tar.gz.tmp") > 15 * 1024 * 1024 )); then
      local trimmed=$work.trimmed
      rm -rf "$trimmed" && cp -r "$work" "$trimmed"
      find "$trimmed" -name '*.log' -size +1M -exec sh -c 'tail -c 1048576 "$1" > "$1.t" && mv "$1.t" "$1"' _ {} \;
      tar -C "$trimmed" --exclude='./.*' -czf "$out/.results.tar.gz.tmp" . 2>/dev/null
      rm -rf "$trimmed"
    fi
    mv -f "$out/.results.tar.gz.tmp" "$out/results.tar.gz"
  fi
}

# capped_copy FILE MAX: copies stdin to FILE (at most 8 MiB) and to stdout (at
# most MAX bytes), line by line as it comes.
# (awk_interactive: mawk reads a pipe in blocks unless told otherwise, and the
# log would lag behind the step.)
capped_copy() {
  awk "${awk_interactive[@]}" -v file="$1" -v max="$2" -v file_max=$(( 8 * 1024 * 1024 )) '
    { n = length($0) + 1
      if (written + n <= file_max) { print > file; fflush(file) } else if (!file_cut) { print "[log cut at 8 MiB]" > file; file_cut = 1 }
      written += n
      if (shown + n <= max) { print; fflush() } else if (!cut) { print "[... the rest of this step is in results.tar.gz]"; fflush(); cut = 1 }
      shown += n }'
}

# run_step I: runs step I under the deadline and records it. The step's
# command sees its limit in seconds as GPU_STEP_LIMIT. A script that reads
# more from a step's log defines after_step I (it may set the step's status
# and note; the summary is written after it).
run_step() {
  local i=$1 name=${names[$1]} left limit rc t0
  now_ms
  left=$(( (start + deadline * 1000 - now) / 1000 - margin ))
  if (( left < min_step )); then
    # Time only runs out further: this step and every later one are skipped.
    local j
    for (( j = i; j < ${#names[@]}; ++j )); do
      [[ ${status[$j]} == pending ]] || continue
      status[j]="skipped" notes[j]="deadline: ${left} s left after the ${margin} s margin, under ${min_step} s"
      log "${names[$j]}: skipped, ${left} s left"
    done
    publish
    return
  fi
  if [[ -n ${needs[$i]} && ! -x ${needs[$i]} ]]; then
    status[i]="not_built" notes[i]="${needs[$i]} does not exist (the build failed or was cut)"
    log "$name: not built, skipped"
    publish
    return
  fi
  limit=$(( caps[i] < left ? caps[i] : left ))
  status[i]="running" limits[i]=$limit
  publish
  now_ms
  t0=$now
  log "=== [$(( (now - start) / 1000 )) s] $name (limit $limit s): ${commands[$i]}"
  # In the background, so that a TERM to this script is handled at once (the
  # trap ends the step's process group, which timeout leads).
  rm -f "$work/.step.pid" "$work/.step.rc"
  ( GPU_STEP_LIMIT=$limit timeout -k "$kill_grace" "$limit" stdbuf -oL -eL bash -c "${commands[$i]}" < /dev/null 2>&1 &
    echo $! > "$work/.step.pid"
    wait $!
    echo $? > "$work/.step.rc" ) 2>&1 | capped_copy "$work/$name.log" $(( 256 * 1024 )) &
  wait $!
  rc=$(cat "$work/.step.rc" 2>/dev/null || echo 1)
  rm -f "$work/.step.pid" "$work/.step.rc"
  now_ms
  rcs[i]=$rc seconds[i]=$(( (now - t0) / 1000 ))
  if (( rc == 0 )); then
    status[i]="ok"
  elif (( (rc == 124 || rc == 137) && (now - t0) / 1000 >= limit )); then
    status[i]="timed_out" notes[i]="cut at its limit of $limit s"
  elif [[ -n ${skip_rc:-} ]] && (( rc == skip_rc )); then
    status[i]="skipped" passes_skipped[i]=1 notes[i]=$(grep -o 'skipped: .*' "$work/$name.log" | tail -1)
  else
    status[i]="failed"
  fi
  if [[ $name == gpu.* ]] && grep -q "skipped: no CUDA device visible" "$work/$name.log"; then
    status[i]="failed" notes[i]="nvidia-smi sees a GPU but the CUDA runtime reports none"
  fi
  if [[ $name == gpu.* ]] && grep -q "\*\*\*Timeout" "$work/$name.log"; then
    notes[i]="a test outlived its $test_timeout s timeout"
  fi
  if declare -F after_step >/dev/null; then after_step "$i"; fi
  log "=== $name: ${status[$i]} (rc $rc, ${seconds[$i]} s)"
  publish figures
}

# on_signal: ends the running step, records it as interrupted, publishes.
on_signal() {
  local pid i
  pid=$(cat "$work/.step.pid" 2>/dev/null) && kill -KILL -- "-$pid" 2>/dev/null
  for i in "${!status[@]}"; do
    [[ ${status[$i]} == running ]] && status[i]="interrupted"
  done
  finished=true error="stopped by a signal"
  publish figures
  exit 143
}

# ---- a run from start to end -------------------------------------------------------------------

# parse_options DEFAULT_DEADLINE DEADLINE_VARIABLE "$@": --deadline and OUT (the
# script's own options are gone by then); sets deadline and out, and checks
# every number the settings hold. Bad usage exits 2 with one line.
parse_options() {
  local variable=$2 usage="usage: scripts/$tool.sh [--deadline SECONDS] OUT"
  deadline=${!variable:-$1}
  shift 2
  local positional=()
  while (( $# )); do
    case $1 in
      --deadline) deadline=${2:-}; shift 2 || { echo "$tool: --deadline needs a number of seconds" >&2; exit 2; } ;;
      --deadline=*) deadline=${1#*=}; shift ;;
      -h|--help) sed -n '2,/^set -uo/p' "$self" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
      -*) echo "$tool: unknown option $1 ($usage)" >&2; exit 2 ;;
      *) positional+=("$1"); shift ;;
    esac
  done
  if (( ${#positional[@]} != 1 )); then
    echo "$usage" >&2
    exit 2
  fi
  out=${positional[0]}
  for setting in "--deadline ($variable)":"$deadline" LOOM_GPU_MARGIN:"${LOOM_GPU_MARGIN:-15}" \
                 LOOM_GPU_MIN_STEP:"${LOOM_GPU_MIN_STEP:-30}" LOOM_GPU_KILL_GRACE:"${LOOM_GPU_KILL_GRACE:-5}" \
                 LOOM_GPU_TEST_TIMEOUT:"${LOOM_GPU_TEST_TIMEOUT:-120}"; do
    if [[ ! ${setting#*:} =~ ^[0-9]+$ ]]; then
      echo "$tool: ${setting%%:*} must be a whole number of seconds, not '${setting#*:}'" >&2
      exit 2
    fi
  done
}

# start_run FILE...: the clock starts; OUT is emptied of this script's files
# (its log, summary.json, results.tar.gz and the FILEs it writes itself), a
# work directory made, everything printed copied to OUT/$tool.log, a first
# summary written.
start_run() {
  now_ms
  start=$now
  margin=${LOOM_GPU_MARGIN:-15} min_step=${LOOM_GPU_MIN_STEP:-30} kill_grace=${LOOM_GPU_KILL_GRACE:-5}
  test_timeout=${LOOM_GPU_TEST_TIMEOUT:-120}
  mkdir -p "$out" && out=$(cd "$out" && pwd) || { echo "$tool: cannot create $out" >&2; exit 2; }
  local f
  rm -f "$out/summary.json" "$out/$tool.log" "$out/results.tar.gz" "$out/.summary.json.tmp" "$out/.results.tar.gz.tmp"
  for f in "$@"; do rm -f "$out/$f" "$out/.$f.tmp"; done
  work=$(mktemp -d "${TMPDIR:-/tmp}/loom-$tool.XXXXXX")
  trap 'rm -rf "$work"' EXIT  # everything in it is in OUT/results.tar.gz
  finished=false error="" figures="{}" gpu_name="" gpu_cap="" gpu_count=0 arch="" nvcc="" hints=()
  export PYTHONUNBUFFERED=1
  awk_interactive=()
  # (Not `awk -W version | grep -q mawk`: under pipefail, grep's early exit can
  # SIGPIPE mawk's later version lines, and the pipeline then fails.)
  [[ $(awk -W version 2>&1) == *mawk* ]] && awk_interactive=(-W interactive)
  py=${LOOM_GPU_PYTHON:-python3}
  source_dir=${LOOM_GPU_CHECK_SOURCE:-$repo}
  build=${LOOM_GPU_BUILD:-$repo/build-gpu}
  [[ $build = /* ]] || build=$PWD/$build
  jobs=${LOOM_GPU_JOBS:-$(nproc)}
  exec > >(tee "$out/$tool.log") 2>&1
  trap on_signal TERM INT
  publish
}

# find_machine: the GPUs (exits 2, with the reason in summary.json, when
# nvidia-smi is missing or fails), their architecture, nvcc, the library
# directories (LD_LIBRARY_PATH, CMake hints) and .deps; then configure_cmd,
# the configure step's command (the build reused when its stamp matches).
find_machine() {
  if ! command -v nvidia-smi >/dev/null || ! timeout 30 nvidia-smi -L > "$work/nvidia-smi-L.txt" 2>&1; then
    error="no NVIDIA GPU: nvidia-smi is missing or fails; run this on the GPU machine"
    log "$error"
    finished=true
    publish
    exit 2
  fi
  gpu_count=$(grep -c '^GPU' "$work/nvidia-smi-L.txt")
  gpu_name=$(timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  gpu_cap=$(timeout 20 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ')
  [[ $gpu_cap =~ ^[0-9]+\.[0-9]+$ ]] || gpu_cap=""
  arch=${LOOM_GPU_ARCH:-$(arch_of "$gpu_cap")}
  nvidia_dirs=$(python_nvidia_dirs)
  nvcc=$(find_nvcc)
  log "$gpu_count x ${gpu_name:-unknown GPU}, compute capability ${gpu_cap:-not reported} -> sm_$arch; nvcc ${nvcc:-not found}"

  # Libraries outside the toolkit: the nvidia/* wheel directories (PyTorch's).
  local library_path="" d toolkit_lib=""
  [[ -n $nvcc ]] && toolkit_lib=$(dirname "$(dirname "$(readlink -f "$nvcc")")")/lib64
  while IFS= read -r d; do
    [[ -d $d/lib ]] || continue
    library_path="$library_path:$d/lib"
    if [[ -f $d/include/cudnn.h ]] && ! compgen -G "$toolkit_lib/libcudnn.so*" >/dev/null; then hints+=("-DCUDNN_ROOT=$d"); fi
    if [[ -f $d/include/cublas_v2.h ]] && ! compgen -G "$toolkit_lib/libcublas.so*" >/dev/null; then hints+=("-DCUBLAS_ROOT=$d"); fi
    if [[ -f $d/include/nccl.h ]] && ! compgen -G "$toolkit_lib/libnccl.so*" >/dev/null; then hints+=("-DNCCL_ROOT=$d"); fi
  done <<< "$nvidia_dirs"
  # C++ dependencies: the system's, else .deps (scripts/gpu-deps.sh).
  local prefix_args=()
  if [[ -d $repo/.deps/root/usr ]]; then
    local deps=$repo/.deps/root
    prefix_args=("-DCMAKE_PREFIX_PATH=$deps/usr"
                 "-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,$deps/usr/lib/x86_64-linux-gnu:$deps/lib/x86_64-linux-gnu:$deps/usr/lib")
    library_path="$library_path:$deps/usr/lib/x86_64-linux-gnu:$deps/lib/x86_64-linux-gnu:$deps/usr/lib"
    log "C++ dependencies from .deps where the system lacks them"
  fi
  export LD_LIBRARY_PATH="${library_path#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

  # ---- the build directory: kept across calls ----
  local generator=() want_generator="Unix Makefiles"
  if command -v ninja >/dev/null; then generator=(-G Ninja) want_generator=Ninja; fi
  if [[ -f $build/CMakeCache.txt ]] && ! grep -qx "CMAKE_GENERATOR:INTERNAL=$want_generator" "$build/CMakeCache.txt"; then
    log "$build was made with another generator: starting it afresh"
    rm -rf "$build"
  fi
  local configure=(cmake -S "$source_dir" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON
                   "-DCMAKE_CUDA_ARCHITECTURES:STRING=$arch" "-DCMAKE_CUDA_COMPILER=$nvcc"
                   "-DLOOM_GPU_TEST_TIMEOUT:STRING=$test_timeout" "${hints[@]}" "${prefix_args[@]}")
  # The stamp: the configuration a successful configure ran with. The same one
  # on a later call (a warm machine, either script) reuses the build as it is.
  local stamp_file=$build/gpu-check.stamp stamp
  stamp=$(printf '%q ' "${configure[@]}")
  if [[ -f $stamp_file && $(cat "$stamp_file") == "$stamp" ]] &&
     [[ -f $build/build.ninja || -f $build/Makefile ]]; then
    configure_cmd="echo 'configure: reusing $build (same configuration as its stamp)'"
  else
    configure_cmd="rm -f $(printf '%q' "$stamp_file") && $stamp && printf '%s' $(printf '%q' "$stamp") > $(printf '%q' "$stamp_file")"
  fi
}

# run_steps: every pending step in order; a configure step without nvcc fails
# without running. A script that must decide on a step as it comes defines
# before_step I (returning 1 when it settled the step itself).
run_steps() {
  local i
  for i in "${!names[@]}"; do
    [[ ${status[$i]} == pending ]] || continue
    if declare -F before_step >/dev/null && ! before_step "$i"; then
      continue
    fi
    if [[ ${names[$i]} == configure && -z $nvcc ]]; then
      status[i]="failed" notes[i]="no nvcc on PATH, in /usr/local/cuda*/bin or in PyTorch's nvidia/*/bin (set LOOM_GPU_NVCC)"
      log "${notes[$i]}"
      continue
    fi
    run_step "$i"
  done
}

# finish_run: the last summary, one line of every step's status (then, when
# the script defines print_last, what it prints last); exits 0 when every step
# succeeded, else 1.
finish_run() {
  finished=true
  publish figures
  local i line="" st=0
  for i in "${!names[@]}"; do
    line+="${line:+, }${names[$i]} ${status[$i]}"
    step_passed "$i" || st=1
  done
  log "$line"
  log "$(( (now - start) / 1000 )) s of $deadline; summary in $out/summary.json, logs in $out/results.tar.gz"
  if declare -F print_last >/dev/null; then print_last; fi
  exit $st
}
