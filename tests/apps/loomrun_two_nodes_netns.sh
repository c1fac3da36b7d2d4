#!/usr/bin/env bash
# Two "nodes" on one machine: two network namespaces joined by a veth pair
# (10.213.x addresses that exist only inside them), one loomrun in each
# (--nnodes=2 --node_rank=K --master_addr=<node 0's address>), train_mnist for
# a few steps. Rank 0 must print exactly what one node with two processes
# prints. Skips (77) where namespaces cannot be made (not root, no iproute2,
# no permission); the namespaces are removed however the test ends.
# Usage: loomrun_two_nodes_netns.sh TRAIN_MNIST LOOMRUN
set -u
train_mnist=$1
loomrun=$2
source "$(dirname "$0")/dist_common.sh"
make_work_dir
make_namespace_pair node 10.213.0 || { echo "SKIP: $namespace_error"; exit 77; }
make_mnist_subset "$work/data" 2000 500
args=(--data "$work/data" --max-steps 20 --batch-size 50 --log-interval 5 --timeout 60)
# 120 s per run, stretched in a sanitized build (its tests get LOOM_TEST_TIMEOUT_SCALE).
limit=$((120 * ${LOOM_TEST_TIMEOUT_SCALE:-1}))

# loomrun_node NODE: node NODE's loomrun, in its namespace.
loomrun_node() {
  local ns_var=ns$1
  exec ip netns exec "${!ns_var}" timeout "$limit" "$loomrun" --nnodes=2 --node_rank="$1" --nproc_per_node=1 --rdzv_id=213 \
    --master_addr=10.213.0.1 --master_port=29500 "$train_mnist" "${args[@]}"
}
on_two_nodes node loomrun_node
cat "$work/node0.out"
grep -q 'Distributed: 2 processes' "$work/node0.out" || fail "node 0 did not run a world of 2"
[[ ! -s "$work/node1.out" ]] || fail "node 1 (rank 1) printed: $(cat "$work/node1.out")"

timeout "$limit" "$loomrun" --nproc_per_node=2 --master_port="$(free_port)" "$train_mnist" "${args[@]}" \
  >"$work/one_node.out" 2>"$work/one_node.err" || { cat "$work/one_node.err"; fail "one node with 2 processes failed"; }
diff <(result_lines "$work/node0.out") <(result_lines "$work/one_node.out") ||
  fail "two nodes and one node at world 2 printed different results"
echo "ok: two namespaces over a veth pair train exactly like one node with two processes"
