# Helpers for the app-level test scripts (sourced): a temporary directory and
# cleanup at exit, a small MNIST-format subset of Fashion-MNIST, free ports,
# waiting for output, two "nodes" (also in network namespaces), and output
# parsing.

# on_exit COMMAND: COMMAND (a string, evaluated then) runs when the script
# exits, before the ones registered earlier (a process is stopped before its
# directory is removed). Use it instead of `trap ... EXIT`, which would drop
# the others. The script's exit status is kept.
exit_commands=()
on_exit() {
  exit_commands=("$1" "${exit_commands[@]}")
  trap run_exit_commands EXIT
}
run_exit_commands() {
  local command
  for command in "${exit_commands[@]}"; do eval "$command"; done
}

# require_torch: $python, a Python with PyTorch 2.x ($LOOM_TORCH_PYTHON, else
# the repository's .venv, which scripts/setup.sh --peers makes), and $version,
# its PyTorch's version; without one the test is skipped (exit 77).
require_torch() {
  python=${LOOM_TORCH_PYTHON:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.venv/bin/python}
  if ! version=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null) || [[ $version != 2.* ]]; then
    echo "SKIP: no PyTorch 2.x in $python (scripts/setup.sh --peers installs one into .venv)"
    exit 77
  fi
}

# make_work_dir [TRAIN TEST]: a new temporary directory in $work, removed at
# exit; given TRAIN and TEST, make_mnist_subset "$work/data" TRAIN TEST too.
make_work_dir() {
  work=$(mktemp -d)
  on_exit "rm -rf $(printf '%q' "$work")"
  (($# == 0)) || make_mnist_subset "$work/data" "$@"
}

# absolute_path PATH: PATH from the root (its directory must exist), for a
# program started from another directory.
absolute_path() {
  echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
}

# make_mnist_subset DIR TRAIN TEST: the first TRAIN training and TEST test
# images of /usr/share/datasets/fashion-mnist as uncompressed IDX files.
# Exits 77 (skip) when the dataset is not installed.
make_mnist_subset() {
  local dir=$1 train=$2 test=$3 source=/usr/share/datasets/fashion-mnist
  if [[ ! -f $source/train-images-idx3-ubyte.gz ]]; then
    echo "SKIP: $source is missing (apt-get install dataset-fashion-mnist)"
    exit 77
  fi
  mkdir -p "$dir"
  python3 - "$source" "$dir" "$train" "$test" <<'PY'
import gzip, struct, sys
source, out, train, test = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for name, count in [("train-images-idx3-ubyte", train), ("train-labels-idx1-ubyte", train),
                    ("t10k-images-idx3-ubyte", test), ("t10k-labels-idx1-ubyte", test)]:
    data = gzip.open(f"{source}/{name}.gz").read()
    magic = struct.unpack(">I", data[:4])[0]
    if magic == 2051:
        rows, cols = struct.unpack(">II", data[8:16])
        body = struct.pack(">IIII", magic, count, rows, cols) + data[16:16 + count * rows * cols]
    else:
        body = struct.pack(">II", magic, count) + data[8:8 + count]
    open(f"{out}/{name}", "wb").write(body)
PY
}

# A TCP port nobody listens on right now.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# The "Test accuracy: 0.7860 (786/1000)" line's numbers: "786 1000".
accuracy_counts() {
  sed -n 's/^Test accuracy: [0-9.]* (\([0-9]*\)\/\([0-9]*\))$/\1 \2/p' "$1"
}

# The lines two runs must share exactly: loss lines and the test accuracy.
result_lines() {
  grep -E '^(Epoch \[|Test accuracy)' "$1"
}

fail() {
  echo "FAIL: $*"
  exit 1
}

# expect_one_line_error DESCRIPTION EXPECTED_TEXT COMMAND...: COMMAND, run in
# this directory for 60 s at most, must exit non-zero (not by the timeout) with exactly
# one line on stderr that holds EXPECTED_TEXT. Prints "ok ..." or "FAIL ..."
# and counts a failure in $failures.
expect_one_line_error() {
  local what=$1 expected=$2
  shift 2
  local err status lines
  err=$(timeout 60 "$@" 2>&1 >/dev/null)
  status=$?
  lines=$(printf '%s\n' "$err" | grep -c .)
  if [[ $status -eq 0 || $status -ge 124 ]]; then
    echo "FAIL $what: exit status $status"; failures=$((failures + 1))
  elif [[ $lines -ne 1 ]]; then
    echo "FAIL $what: expected one line on stderr, got $lines:"; printf '%s\n' "$err"; failures=$((failures + 1))
  elif [[ "$err" != *"$expected"* ]]; then
    echo "FAIL $what: stderr lacks '$expected': $err"; failures=$((failures + 1))
  else
    echo "ok   $what: $err"
  fi
}

# wait_until SECONDS COMMAND...: runs COMMAND every 0.02 s until it succeeds;
# non-zero when it has not after SECONDS.
wait_until() {
  local tries=$(($1 * 50))
  shift
  until "$@"; do
    ((--tries > 0)) || return 1
    sleep 0.02
  done
}

# has_lines COUNT PATTERN FILE: FILE has COUNT or more lines that match the
# grep PATTERN (false while FILE does not exist).
has_lines() {
  local count
  count=$(grep -c -- "$2" "$3" 2>/dev/null)
  ((${count:-0} >= $1))
}

# on_two_nodes NAME COMMAND...: `COMMAND NODE` for nodes 0 and 1 at once,
# each one's output in $work/NAME<NODE>.out and .err. Waits for node 0, then
# node 1; at the first that exits non-zero, sends the other SIGTERM and fails
# showing that node's stderr. COMMAND may be a function; one that ends in
# `exec` keeps the pid that the SIGTERM reaches.
on_two_nodes() {
  local name=$1 node status pids=()
  shift
  for node in 0 1; do
    "$@" "$node" >"$work/$name$node.out" 2>"$work/$name$node.err" &
    pids+=($!)
  done
  for node in 0 1; do
    wait "${pids[$node]}"
    status=$?
    if ((status != 0)); then
      kill -TERM "${pids[@]}" 2>/dev/null
      cat "$work/$name$node.err"
      fail "$name: node $node exited with $status"
    fi
  done
}

# make_namespace_pair NAME SUBNET: two network namespaces, $ns0 and $ns1,
# joined by a veth pair with SUBNET.1 in $ns0 and SUBNET.2 in $ns1 (SUBNET
# like 10.213.0), loopback up in both, node 1 reaching node 0; removed with
# every process in them when the script exits. Returns 1 with the reason in
# $namespace_error where namespaces cannot be made here (not root, no
# iproute2, not permitted); fails the test when a later step does not work.
make_namespace_pair() {
  local name=$1 subnet=$2 error
  if [[ $(id -u) != 0 ]]; then
    namespace_error="network namespaces need root"
    return 1
  elif ! command -v ip >/dev/null; then
    namespace_error="iproute2 (ip) is not installed"
    return 1
  fi
  ns0=loom_${name}0_$$ ns1=loom_${name}1_$$ veth0=loomv0_$$ veth1=loomv1_$$
  if ! error=$(ip netns add "$ns0" 2>&1); then
    namespace_error="cannot create a network namespace: $error"
    return 1
  fi
  on_exit remove_namespace_pair
  if ! error=$(ip netns add "$ns1" 2>&1 && ip link add "$veth0" type veth peer name "$veth1" 2>&1 &&
               ip netns exec "$ns0" true 2>&1); then
    namespace_error="cannot create a second namespace, a veth pair, or run in a namespace: $error"
    return 1
  fi
  ip link set "$veth0" netns "$ns0" && ip link set "$veth1" netns "$ns1" || fail "cannot move the veth ends"
  ip -n "$ns0" addr add "$subnet.1/24" dev "$veth0" && ip -n "$ns1" addr add "$subnet.2/24" dev "$veth1" ||
    fail "cannot assign addresses"
  ip -n "$ns0" link set lo up && ip -n "$ns1" link set lo up || fail "cannot bring loopback up"
  ip -n "$ns0" link set "$veth0" up && ip -n "$ns1" link set "$veth1" up || fail "cannot bring the veth pair up"
  ip netns exec "$ns1" python3 - "$subnet.1" <<'PY' || fail "node 1 cannot reach $subnet.1"
import socket, sys
s = socket.socket()
s.settimeout(2)
try:
    s.connect((sys.argv[1], 9))
except ConnectionRefusedError:
    pass
PY
}
remove_namespace_pair() {
  local ns
  for ns in "$ns0" "$ns1"; do ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null; done
  ip link del "$veth0" 2>/dev/null
  for ns in "$ns0" "$ns1"; do ip netns del "$ns" 2>/dev/null; done
}
