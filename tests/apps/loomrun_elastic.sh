#!/usr/bin/env bash
# loomrun --nnodes 1:2 (torchrun's elastic mode) on one host: two launchers
# meet at one rendezvous endpoint and train_mnist runs at world 2; one
# launcher is killed (SIGKILL, its process with it), the survivor's process
# fails, and after a restart the survivor's round closes with one node, which
# resumes the world-2 checkpoint on 1 process; a new launcher then comes, the
# survivor stops its process with a checkpoint, and both resume it at world 2
# and finish. Issue 49.
# Usage: loomrun_elastic.sh TRAIN_MNIST LOOMRUN
set -u
train_mnist=$1
loomrun=$2
source "$(dirname "$0")/dist_common.sh"
make_work_dir 8000 100
port=$(free_port)
common=(--data "$work/data" --epochs 2 --batch-size 10 --log-interval 5 --threads 1 --timeout 20
        --checkpoint-dir "$work/checkpoints" --checkpoint-every 10 --keep-checkpoints 0)

# launcher NAME: a loomrun of one process in the background (its pid in $launched).
launcher() {
  "$loomrun" --nnodes=1:2 --nproc_per_node=1 --rdzv_endpoint=127.0.0.1:$port --rdzv_id=elastic \
    --rdzv_conf=last_call_timeout=6 --max_restarts=3 --term_grace=20 "$train_mnist" "${common[@]}" \
    >"$work/$1.out" 2>"$work/$1.err" &
  launched=$!
  on_exit "kill -KILL $launched 2>/dev/null"
}
launcher a; a=$launched
sleep 1  # a binds the endpoint and hosts the store; b joins it (within a's 6 s last call)
launcher b; b=$launched
wait_until 60 has_lines 4 '^Epoch \[1/2\]' "$work/a.out" || fail "no training at world 2: $(cat "$work/a.err" "$work/b.err")"
grep -q 'rendezvous round 0: 2 nodes' "$work/a.err" || fail "round 0 is not 2 nodes: $(cat "$work/a.err")"
kill -KILL "$b"
wait "$b" 2>/dev/null
# The survivor restarts alone and resumes the world-2 checkpoint on 1 process.
wait_until 90 grep -q '(written by 2 processes) at epoch [0-9]*, sample [0-9]*, on 1 process' "$work/a.out" ||
  fail "the survivor did not resume at world 1: $(tail -5 "$work/a.out"; cat "$work/a.err")"
grep -q 'rendezvous round 1: 1 node, this one node rank 0' "$work/a.err" || fail "no round of 1 node: $(cat "$work/a.err")"
# A new launcher joins: the survivor stops its process with a checkpoint and both go on at world 2.
launcher c; c=$launched
wait "$c"; status_c=$?
wait "$a"; status_a=$?
((status_a == 0 && status_c == 0)) || fail "the launchers exited with $status_a and $status_c: $(cat "$work/a.err" "$work/c.err")"
grep -q 'a node waits to join; ending the local processes (SIGTERM)' "$work/a.err" || fail "the survivor did not see the new node: $(cat "$work/a.err")"
# (round 2: the new round waits until the survivor has stopped its process)
sed -n '/a node waits to join/,$p' "$work/a.err" | grep -q 'rendezvous round 2: 2 nodes' ||
  fail "no round of 2 nodes after the join: $(cat "$work/a.err")"
grep -qh '(written by 1 process) at epoch [0-9]*, sample [0-9]*, on 2 processes' "$work/a.out" "$work/c.out" ||
  fail "no resume from world 1 on 2 processes: $(grep -h Resuming "$work/a.out" "$work/c.out")"
[[ -f $work/checkpoints/2GPU_2epoch.checkpoint ]] || fail "the run did not end at world 2: $(ls "$work/checkpoints")"
grep -h '^Resuming from' "$work/a.out" "$work/c.out"
echo "ok: loomrun --nnodes 1:2: 2 nodes, one killed, 1 node, one joined, 2 nodes, finished"
