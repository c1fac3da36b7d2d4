#!/usr/bin/env bash
# train_mnist started by PyTorch 2.x's own torchrun, as the torchrun tutorial
# starts training: its workers join the agent's c10d TCPStore
# (TORCHELASTIC_USE_AGENT_STORE=True) as clients.
#   1. torchrun --standalone --nproc_per_node=2
#   2. two "nodes": two torchrun agents, --nnodes=2 --rdzv-backend=c10d
#      --rdzv-endpoint=127.0.0.1:PORT --rdzv-id=123 (the tutorial's command)
#   3. --max-restarts=1 with rank 1 killed (SIGKILL) mid-training: torchrun
#      restarts both, TORCHELASTIC_RESTART_COUNT=1, the second attempt trains
#   4. a fatal error: torchrun's failure summary shows loom's message from the
#      error file (TORCHELASTIC_ERROR_FILE), not "error_file: <N/A>"
#   5. (as root with iproute2) the two agents in two network namespaces
#      joined by a veth pair, node 1 reaching node 0 only over it
# Needs a PyTorch 2.x importable from the repository's .venv (scripts/setup.sh
# --peers) or $LOOM_TORCH_PYTHON; skips otherwise.
# Usage: torchrun_launch.sh TRAIN_MNIST LOOMRUN
set -u
source "$(dirname "$0")/dist_common.sh"
train_mnist=$(absolute_path "$1")
require_torch
torchrun=("$python" -m torch.distributed.run)
echo "torchrun of PyTorch $version"
make_work_dir 2000 500
common=(--data "$work/data" --max-steps 6 --log-interval 3 --batch-size 50 --timeout 60)
export OMP_NUM_THREADS=1

check_world_2() {  # LABEL FILE
  grep -q '^Distributed: 2 processes (torchrun-style (RANK / WORLD_SIZE))' "$2" || { cat "$2"; fail "$1: not a world of 2 under torchrun"; }
  [[ $(grep -c '^Training complete in' "$2") == 1 ]] || { cat "$2"; fail "$1: expected one report, from rank 0"; }
  read -r _ total <<<"$(accuracy_counts "$2")"
  [[ ${total:-0} == 500 ]] || fail "$1: the accuracy covers ${total:-no} of 500 test images"
}

# two_agents LABEL NAME AGENT: `AGENT NODE` (a function that ends by exec'ing
# one torchrun agent) for nodes 0 and 1 at once; together a world of 2.
two_agents() {
  on_two_nodes "$2" "$3"
  cat "$work/${2}0.out" "$work/${2}1.out" >"$work/$2.out"
  check_world_2 "$1" "$work/$2.out"
}

# 1. --standalone
timeout 120 "${torchrun[@]}" --standalone --nproc_per_node=2 --no-python "$train_mnist" "${common[@]}" \
  >"$work/standalone.out" 2>"$work/standalone.err" || { cat "$work/standalone.err"; fail "torchrun --standalone failed"; }
check_world_2 "--standalone" "$work/standalone.out"
echo "ok 1 ($SECONDS s): torchrun --standalone --nproc_per_node=2"

# 2. Two agents meeting through the c10d rendezvous.
port=$(free_port)
rendezvous_agent() {
  exec timeout 120 "${torchrun[@]}" --nnodes=2 --nproc_per_node=1 --rdzv-id=123 --rdzv-backend=c10d \
    --rdzv-endpoint=127.0.0.1:$port --no-python "$train_mnist" "${common[@]}"
}
two_agents "two nodes, c10d rendezvous" node rendezvous_agent
echo "ok 2 ($SECONDS s): two torchrun agents, --rdzv-backend=c10d --rdzv-endpoint"

# 3. Rank 1 killed in the first attempt; --max-restarts=1 starts both again.
cat >"$work/worker.sh" <<SH
#!/usr/bin/env bash
echo "attempt \$TORCHELASTIC_RESTART_COUNT rank \$RANK agent store \$TORCHELASTIC_USE_AGENT_STORE" >>"$work/attempts"
if [[ \$TORCHELASTIC_RESTART_COUNT == 0 ]]; then
  "$train_mnist" --data "$work/data" --epochs 1000 --batch-size 50 --log-interval 1 --timeout 60 &
  child=\$!
  if [[ \$RANK == 1 ]]; then sleep 3; kill -9 \$child; fi
  wait \$child
  exit \$?
fi
exec "$train_mnist" ${common[*]}
SH
chmod +x "$work/worker.sh"
timeout 150 "${torchrun[@]}" --standalone --nproc_per_node=2 --max-restarts=1 --no-python "$work/worker.sh" \
  >"$work/restart.out" 2>"$work/restart.err" || { cat "$work/restart.err"; fail "torchrun --max-restarts=1 failed"; }
sort "$work/attempts"
[[ $(sort "$work/attempts" | tr '\n' ';') == "attempt 0 rank 0 agent store True;attempt 0 rank 1 agent store True;attempt 1 rank 0 agent store True;attempt 1 rank 1 agent store True;" ]] ||
  fail "expected two attempts of ranks 0 and 1"
grep -q 'Epoch \[1/1000\]' "$work/restart.out" || fail "the first attempt did not train before rank 1 was killed"
awk '/^Training on/ { attempt++ } attempt == 2' "$work/restart.out" >"$work/second.out"
check_world_2 "--max-restarts=1" "$work/second.out"
echo "ok 3 ($SECONDS s): rank 1 killed, torchrun restarted the group (TORCHELASTIC_RESTART_COUNT=1), the second attempt trained"

# 4. A fatal error reaches torchrun's summary through the error file.
timeout 120 "${torchrun[@]}" --standalone --nproc_per_node=2 --no-python "$train_mnist" --data "$work/missing" \
  >"$work/bad.out" 2>"$work/bad.err"
status=$?
[[ $status -ne 0 && $status -lt 124 ]] || fail "a missing data directory under torchrun: status $status"
grep -q 'error_file: /' "$work/bad.err" || { cat "$work/bad.err"; fail "torchrun's summary has no error file"; }
grep -q "traceback.*train_mnist: rank [01]: .*$work/missing" "$work/bad.err" ||
  { cat "$work/bad.err"; fail "torchrun's summary does not show loom's message"; }
echo "ok 4 ($SECONDS s): torchrun's failure summary shows loom's error from TORCHELASTIC_ERROR_FILE"
# 5. Two agents in two network namespaces. torchrun cannot tell there that the
# endpoint is its own address (no name for the namespace's address), so node 0
# says it hosts the rendezvous (is_host=1), and each names its address.
namespace_agent() {
  local ns_var=ns$1 host=()
  [[ $1 == 0 ]] && host=(--rdzv-conf is_host=1)
  exec ip netns exec "${!ns_var}" timeout 150 "${torchrun[@]}" --nnodes=2 --nproc_per_node=1 --rdzv-id=215 \
    --rdzv-backend=c10d --rdzv-endpoint=10.215.0.1:29400 "${host[@]}" --local-addr=10.215.0.$(($1 + 1)) \
    --no-python "$train_mnist" "${common[@]}"
}
if make_namespace_pair tr 10.215.0; then
  two_agents "two namespaces" ns namespace_agent
  echo "ok 5 ($SECONDS s): two torchrun agents in two network namespaces over a veth pair"
else
  echo "not run 5: $namespace_error"
fi
echo "ok: train_mnist under PyTorch $version's torchrun"
