#!/usr/bin/env bash
# loom's TCPStore and PyTorch 2.x's torch.distributed.TCPStore sharing one
# store: PyTorch's server (its libuv and its classic backend) with loom's
# client, and loom's server with PyTorch's client, both clients exchanging
# keys and one counter. Needs a PyTorch 2.x importable from the repository's
# .venv (scripts/setup.sh --peers) or from $LOOM_TORCH_PYTHON; skips otherwise.
# Usage: torch_store_interop.sh LOOM_STORE_TOOL
set -u
tool=$1
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${LOOM_TORCH_PYTHON:-$repo/.venv/bin/python}
if ! version=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null) || [[ $version != 2.* ]]; then
  echo "SKIP: no PyTorch 2.x in $python (scripts/setup.sh --peers installs one into .venv)"
  exit 77
fi
echo "PyTorch $version from $python"
exec "$python" - "$tool" <<'PY'
import subprocess, sys
from datetime import timedelta
import torch.distributed as dist

tool = sys.argv[1]
failures = []
def expect(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)

for libuv in (True, False):
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=30), use_libuv=libuv)
    result = subprocess.run([tool, "client", str(server.port)], timeout=60)
    expect(result.returncode == 0, f"loom's client against PyTorch's server (use_libuv={libuv})")
    expect(server.get("alpha") == b"one", f"PyTorch reads the key loom set (use_libuv={libuv})")
    expect(server.add("counter", 0) == 4, f"PyTorch reads loom's counter (use_libuv={libuv})")
    del server

loom = subprocess.Popen([tool, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
port = int(loom.stdout.readline())
try:
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
    client.set("from_python", "c10d")
    result = subprocess.run([tool, "exchange", str(port)], timeout=60)
    expect(result.returncode == 0, "loom's client beside PyTorch's client on loom's server")
    client.wait(["from_loom"])
    expect(client.get("from_loom") == b"d01c", "PyTorch's client reads loom's key")
    expect(client.add("shared_counter", 1) == 11, "one counter for both")
    expect(client.check(["from_loom", "from_python"]), "check")
    expect(not client.check(["nope"]), "check of a missing key")
    try:
        client.wait(["never"], timedelta(milliseconds=300))
        expect(False, "a wait on a missing key times out")
    except Exception as error:
        expect("imeout" in str(error) or "timed out" in str(error), f"a wait on a missing key times out ({error})")
    expect(client.get("from_loom") == b"d01c", "the client works after a timed-out wait")
    expect(client.compare_set("from_python", "c10d", "done") == b"done", "compare_set")
    expect(client.num_keys() >= 3, "num_keys")
    expect(client.delete_key("from_python"), "delete_key")
    expect(not client.check(["from_python"]), "the deleted key is gone")
finally:
    loom.stdin.close()
    loom.wait(timeout=10)
if failures:
    print(f"FAIL: {len(failures)} check(s)")
    sys.exit(1)
print("ok: loom's TCPStore and PyTorch's share stores both ways")
PY
