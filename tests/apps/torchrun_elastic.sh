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
common=(--data "$work/data" --epochs 8 --batch-size 10 --log-interval 5 --threads 1 --timeout 20
        --checkpoint-dir "$work/checkpoints" --checkpoint-every 10 --keep-checkpoints 3)

# agent NAME: a torchrun agent of one worker in the background, its pid in
# $launched. torchrun starts its workers in sessions of their own: a node is
# killed as kill_node does it, the workers first.
agent() {
  "$python" -m torch.distributed.run --nnodes=1:2 --nproc_per_node=1 --max-restarts=3 --monitor-interval=1 \
    --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:$port --rdzv-id=elastic --rdzv-conf=last_call_timeout=6 \
    --no-python "$train_mnist" "${common[@]}" >"$work/$1.out" 2>"$work/$1.err" &
  launched=$!
  on_exit "kill_node $launched"
}
kill_node() {
  pkill -KILL -P "$1"
  kill -KILL "$1" 2>/dev/null
}
agent a; a=$launched
sleep 2  # a binds the endpoint and hosts the rendezvous store; b joins it within a's last call
agent b; b=$launched
wait_until 90 has_lines 4 '^Epoch \[1/8\]' "$work/a.out" ||
  fail "no training at world 2: $(tail -5 "$work/a.err" "$work/b.err")"
grep -q '^Distributed: 2 processes' "$work/a.out" || fail "the first round is not a world of 2: $(head -3 "$work/a.out")"
kill_node "$b"
wait "$b" 2>/dev/null
echo "ok 1 ($SECONDS s): 2 nodes trained; node b killed"

wait_until 120 grep -q '(written by 2 processes) at epoch [0-9]*, sample [0-9]*, on 1 process' "$work/a.out" ||
  fail "the survivor did not resume at world 1: $(tail -3 "$work/a.out"; tail -20 "$work/a.err")"
echo "ok 2 ($SECONDS s): torchrun restarted the survivor alone; it resumed the world-2 checkpoint on 1 process"

agent c; c=$launched
wait "$c"; status_c=$?
wait "$a"; status_a=$?
((status_a == 0 && status_c == 0)) ||
  fail "the agents exited with $status_a and $status_c: $(tail -20 "$work/a.err" "$work/c.err")"
resumed=$(grep -h '(written by 1 process) at epoch [0-9]*, sample [0-9]*, on 2 processes' "$work/a.out" "$work/c.out")
[[ -n $resumed ]] || fail "no resume from world 1 on 2 processes: $(grep -h '^Resuming' "$work/a.out" "$work/c.out")"
[[ -f $work/checkpoints/2GPU_8epoch.checkpoint ]] ||
  fail "the run did not end at world 2: $(ls "$work/checkpoints")"
# No rank started over: every Training run after the first resumed.
starts=$(cat "$work/a.out" "$work/c.out" | grep -c '^Training on')
resumes=$(cat "$work/a.out" "$work/c.out" | grep -c '^Resuming from')
((resumes == starts - 1)) || fail "$starts runs started but $resumes resumed: $(grep -h '^Resuming\|^Training on' "$work/a.out" "$work/c.out")"
echo "$resumed"
echo "ok 3 ($SECONDS s): node c joined; the survivor stopped with a checkpoint and both resumed it at world 2 and finished"
echo "ok: train_mnist under PyTorch $version's torchrun --nnodes=1:2"
