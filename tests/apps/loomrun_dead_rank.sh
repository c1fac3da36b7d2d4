#!/usr/bin/env bash
# A rank that dies or hangs mid-training: two loomrun "nodes" on loopback, one
# rank each, train_mnist with a 4 s collective timeout (LOOM_COLLECTIVE_TIMEOUT).
#  1. rank 1 gets SIGKILL: its loomrun exits non-zero naming rank 1 and
#     SIGKILL; rank 0 fails its next collective, exits non-zero, and its
#     loomrun names rank 0's exit code, all within the timeout.
#  2. rank 1 gets SIGSTOP: rank 0's collective times out after ~4 s; rank 0
#     exits non-zero with the timeout in its message.
# Usage: loomrun_dead_rank.sh TRAIN_MNIST LOOMRUN
set -u
train_mnist=$1
loomrun=$2
source "$(dirname "$0")/dist_common.sh"
make_work_dir 2000 100
pids=()
on_exit 'for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done'
export LOOM_COLLECTIVE_TIMEOUT=4
args=(--data "$work/data" --epochs 1000 --batch-size 20 --log-interval 1 --threads 1 --workers 0)

now() { date +%s.%N; }
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$2"; }

# start_nodes NAME: both loomruns in the background; sets node0, node1.
start_nodes() {
  local name=$1 port
  port=$(free_port)
  for node in 0 1; do
    timeout 60 "$loomrun" --nnodes=2 --node_rank=$node --nproc_per_node=1 --master_addr=127.0.0.1 \
      --master_port="$port" --term_grace=2 "$train_mnist" "${args[@]}" >"$work/$name.$node.out" 2>"$work/$name.$node.err" &
    pids+=($!)
    eval "node$node=$!"
  done
  # Training is under way once rank 0 printed a few loss lines.
  wait_until 30 has_lines 3 'Step \[' "$work/$name.0.out" ||
    { cat "$work/$name".*.err; fail "$name: training did not start within 30 s"; }
}

# The train_mnist process under `timeout` $1 -> loomrun.
rank_of() { pgrep -P "$(pgrep -P "$1" | head -n 1)" | head -n 1; }

# wait_for PID SECONDS: its exit status, or fail when it runs longer.
wait_for() {
  local pid=$1 limit=$2 start
  start=$(now)
  while kill -0 "$pid" 2>/dev/null; do
    if [[ $(elapsed "$start" "$(now)" | cut -d. -f1) -ge $limit ]]; then fail "pid $pid still running after $limit s"; fi
    sleep 0.05
  done
  wait "$pid"
}

# ---- 1. SIGKILL ----
start_nodes kill
victim=$(rank_of "$node1")
[[ -n $victim ]] || fail "no rank under loomrun node 1"
killed_at=$(now)
kill -KILL "$victim"
wait_for "$node1" 10; status1=$?
wait_for "$node0" 12; status0=$?
took=$(elapsed "$killed_at" "$(now)")
echo "--- node 1's loomrun (exit $status1):"; cat "$work/kill.1.err"
echo "--- node 0's loomrun (exit $status0, $took s after the kill):"; cat "$work/kill.0.err"
((status1 != 0)) || fail "node 1's loomrun exited 0 after its rank was killed"
grep -q 'rank 1 (local rank 0, pid [0-9]*) was killed by signal 9 (SIGKILL)' "$work/kill.1.err" ||
  fail "node 1's loomrun does not name rank 1 and SIGKILL"
((status0 != 0)) || fail "node 0's loomrun exited 0 although rank 1 died"
grep -q 'loomrun: .*rank 0 (local rank 0, pid [0-9]*) exited with code 1' "$work/kill.0.err" ||
  fail "node 0's loomrun does not name rank 0's exit code"
grep -q 'train_mnist: rank 0: ' "$work/kill.0.err" || fail "rank 0 printed no error"
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < 4 + 6 else 1)" "$took" || fail "rank 0 took $took s to fail"

# ---- 2. SIGSTOP: a hung peer ----
start_nodes stop
victim=$(rank_of "$node1")
stopped_at=$(now)
kill -STOP "$victim"
wait_for "$node0" 20; status0=$?
took=$(elapsed "$stopped_at" "$(now)")
kill -KILL "$victim"
wait_for "$node1" 10; status1=$?
echo "--- node 0's loomrun (exit $status0, $took s after SIGSTOP):"; cat "$work/stop.0.err"
((status0 != 0)) || fail "rank 0 exited 0 although rank 1 hung"
grep -q 'timeout 4 s' "$work/stop.0.err" || fail "rank 0's error does not mention the 4 s timeout"
python3 -c "import sys; t = float(sys.argv[1]); sys.exit(0 if 3.5 <= t < 4 + 8 else 1)" "$took" ||
  fail "rank 0 failed $took s after its peer hung; expected about the 4 s timeout"
((status1 != 0)) || fail "node 1's loomrun exited 0 after its rank was killed"
echo "ok: a killed rank and a hung rank both end the job with the rank named"
