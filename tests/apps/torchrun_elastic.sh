#!/usr/bin/env bash
# train_mnist under PyTorch 2.x's torchrun in its elastic mode (issue 49):
# two agents, --nnodes=1:2 over the c10d rendezvous, train at world 2; one
# node is killed (its agent and worker, SIGKILL), the survivor's worker fails,
# its agent restarts it in a round of 1 node and it resumes the world-2
# checkpoint on 1 process; a new agent then comes, the survivor's agent stops
# its worker (SIGTERM: loom writes a checkpoint) and both resume that one at
# world 2 and finish. The new node's workers start with
# TORCHELASTIC_RESTART_COUNT=0 from their own agent: they resume because the
# ranks agree on it (train::any_rank_restarted).
# All of it twice: on loopback, then (as root with iproute2) with each node in
# a network namespace of its own, joined by a veth pair: a in one, b and then
# c in the other, the rendezvous hosted in a's.
# Needs a PyTorch 2.x importable from the repository's .venv (scripts/setup.sh
# --peers) or $LOOM_TORCH_PYTHON; skips otherwise (CI).
# Usage: torchrun_elastic.sh TRAIN_MNIST LOOMRUN
set -u
source "$(dirname "$0")/dist_common.sh"
train_mnist=$(absolute_path "$1")
require_torch
echo "torchrun of PyTorch $version"
make_work_dir 8000 100
port=$(free_port)
export OMP_NUM_THREADS=1
# PyTorch 2.5+ shares the rendezvous TCPStore with the workers by default;
# a node joining a running job then times out in the agents' own rendezvous
# (the rank-0 agent does not publish MASTER_ADDR again for the new round,
# and the attempt prefixes differ between nodes: pytorch#135712). README
# gives users the same setting.
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
# 8 epochs: at world 1 they last long enough (about 20 s here) for the new
# agent to start and join before the survivor's run ends.
common=(--epochs 8 --batch-size 10 --log-interval 5 --threads 1 --timeout 20 --checkpoint-every 10
        --keep-checkpoints 3)

# agent NAME NODE: a torchrun agent of one worker on node NODE (0 or 1) in the
# background, its pid in $launched. torchrun starts its workers in sessions of
# their own: a node is killed as kill_node does it, the workers first. In
# namespaces, torchrun cannot tell that the endpoint is node 0's own address:
# node 0 says it hosts the rendezvous (is_host=1), and each names its address.
agent() {
  local name=$1 node=$2 in_node=() conf=last_call_timeout=6 address=()
  if [[ $place == namespaces ]]; then
    local ns_var=ns$node
    in_node=(ip netns exec "${!ns_var}")
    address=(--local-addr="$subnet.$((node + 1))")
    ((node == 0)) && conf+=,is_host=1
  fi
  "${in_node[@]}" "$python" -m torch.distributed.run --nnodes=1:2 --nproc_per_node=1 --max-restarts=3 \
    --monitor-interval=1 --rdzv-backend=c10d --rdzv-endpoint="$endpoint" --rdzv-id=elastic --rdzv-conf="$conf" \
    "${address[@]}" --no-python "$train_mnist" --data "$work/data" --checkpoint-dir "$run/checkpoints" "${common[@]}" \
    >"$run/$name.out" 2>"$run/$name.err" &
  launched=$!
  on_exit "kill_node $launched"
}
kill_node() {
  pkill -KILL -P "$1"
  kill -KILL "$1" 2>/dev/null
}

# elastic_run: the whole scenario in $place, its files in $work/$place.
elastic_run() {
  run=$work/$place
  mkdir -p "$run"
  agent a 0; local a=$launched
  sleep 2  # a binds the endpoint and hosts the rendezvous store; b joins it within a's last call
  agent b 1; local b=$launched
  wait_until 90 has_lines 4 '^Epoch \[1/8\]' "$run/a.out" ||
    fail "$place: no training at world 2: $(tail -5 "$run/a.err" "$run/b.err")"
  grep -q '^Distributed: 2 processes' "$run/a.out" || fail "$place: the first round is not a world of 2: $(head -3 "$run/a.out")"
  kill_node "$b"
  wait "$b" 2>/dev/null
  echo "ok 1 ($place, $SECONDS s): 2 nodes trained; node b killed"

  wait_until 120 grep -q '(written by 2 processes) at epoch [0-9]*, sample [0-9]*, on 1 process' "$run/a.out" ||
    fail "$place: the survivor did not resume at world 1: $(tail -3 "$run/a.out"; tail -20 "$run/a.err")"
  echo "ok 2 ($place, $SECONDS s): torchrun restarted the survivor alone; it resumed the world-2 checkpoint on 1 process"

  agent c 1; local c=$launched status_a status_c
  wait "$c"; status_c=$?
  wait "$a"; status_a=$?
  ((status_a == 0 && status_c == 0)) ||
    fail "$place: the agents exited with $status_a and $status_c: $(tail -20 "$run/a.err" "$run/c.err")"
  local resumed starts resumes
  resumed=$(grep -h '(written by 1 process) at epoch [0-9]*, sample [0-9]*, on 2 processes' "$run/a.out" "$run/c.out")
  [[ -n $resumed ]] ||
    fail "$place: no resume from world 1 on 2 processes: $(grep -h '^Resuming' "$run/a.out" "$run/c.out")"
  [[ -f $run/checkpoints/2GPU_8epoch.checkpoint ]] ||
    fail "$place: the run did not end at world 2: $(ls "$run/checkpoints")"
  # No rank started over: every Training run after the first resumed.
  starts=$(cat "$run/a.out" "$run/c.out" | grep -c '^Training on')
  resumes=$(cat "$run/a.out" "$run/c.out" | grep -c '^Resuming from')
  ((resumes == starts - 1)) ||
    fail "$place: $starts runs started but $resumes resumed: $(grep -h '^Resuming\|^Training on' "$run/a.out" "$run/c.out")"
  echo "$resumed"
  echo "ok 3 ($place, $SECONDS s): node c joined; the survivor stopped with a checkpoint and both resumed it at world 2 and finished"
}

place=loopback endpoint=127.0.0.1:$port
elastic_run
if make_namespace_pair te 10.216.0; then
  place=namespaces subnet=10.216.0 endpoint=10.216.0.1:29400
  elastic_run
else
  echo "not run in namespaces: $namespace_error"
fi
echo "ok: train_mnist under PyTorch $version's torchrun --nnodes=1:2"
