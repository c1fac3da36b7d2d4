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
skip() {
  echo "SKIP: $*"
  exit 77
}
[[ $(id -u) == 0 ]] || skip "network namespaces need root"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"

tag=$$
ns0=loom_node0_$tag ns1=loom_node1_$tag
veth0=loomv0_$tag veth1=loomv1_$tag
veth0=${veth0:0:15} veth1=${veth1:0:15}
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  ip netns pids "$ns0" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
  ip netns pids "$ns1" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
  ip link del "$veth0" 2>/dev/null
  ip netns del "$ns0" 2>/dev/null
  ip netns del "$ns1" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

ip netns add "$ns0" 2>"$work/ip.err" || skip "cannot create a network namespace: $(cat "$work/ip.err")"
ip netns add "$ns1" || skip "cannot create a second network namespace"
ip link add "$veth0" type veth peer name "$veth1" 2>"$work/ip.err" || skip "cannot create a veth pair: $(cat "$work/ip.err")"
ip link set "$veth0" netns "$ns0" && ip link set "$veth1" netns "$ns1" || fail "cannot move the veth ends"
ip -n "$ns0" addr add 10.213.0.1/24 dev "$veth0" && ip -n "$ns1" addr add 10.213.0.2/24 dev "$veth1" ||
  fail "cannot assign addresses"
for ns in "$ns0" "$ns1"; do ip -n "$ns" link set lo up; done
ip -n "$ns0" link set "$veth0" up && ip -n "$ns1" link set "$veth1" up || fail "cannot bring the veth pair up"
ip netns exec "$ns0" true 2>"$work/ip.err" || skip "ip netns exec does not work here: $(cat "$work/ip.err")"
# Node 1 reaches node 0 over the pair, and nothing else.
ip netns exec "$ns1" python3 -c 'import socket; s = socket.socket(); s.settimeout(2)
try:
    s.connect(("10.213.0.1", 9))
except ConnectionRefusedError:
    pass' || fail "node 1 cannot reach 10.213.0.1"

make_mnist_subset "$work/data" 2000 500
args=(--data "$work/data" --max-steps 20 --batch-size 50 --log-interval 5 --timeout 60)
# 120 s per run, stretched in a sanitized build (its tests get LOOM_TEST_TIMEOUT_SCALE).
limit=$((120 * ${LOOM_TEST_TIMEOUT_SCALE:-1}))
for node in 0 1; do
  ns_var=ns$node
  ip netns exec "${!ns_var}" timeout "$limit" "$loomrun" --nnodes=2 --node_rank=$node --nproc_per_node=1 --rdzv_id=213 \
    --master_addr=10.213.0.1 --master_port=29500 "$train_mnist" "${args[@]}" >"$work/node$node.out" 2>"$work/node$node.err" &
  pids+=($!)
done
wait "${pids[0]}"; status0=$?
wait "${pids[1]}"; status1=$?
cat "$work/node0.out"
((status0 == 0 && status1 == 0)) || { cat "$work/node0.err" "$work/node1.err"; fail "two nodes: exit $status0 / $status1"; }
grep -q 'Distributed: 2 processes' "$work/node0.out" || fail "node 0 did not run a world of 2"
[[ ! -s "$work/node1.out" ]] || fail "node 1 (rank 1) printed: $(cat "$work/node1.out")"

timeout "$limit" "$loomrun" --nproc_per_node=2 --master_port="$(free_port)" "$train_mnist" "${args[@]}" \
  >"$work/one_node.out" 2>"$work/one_node.err" || { cat "$work/one_node.err"; fail "one node with 2 processes failed"; }
diff <(result_lines "$work/node0.out") <(result_lines "$work/one_node.out") ||
  fail "two nodes and one node at world 2 printed different results"
echo "ok: two namespaces over a veth pair train exactly like one node with two processes"
