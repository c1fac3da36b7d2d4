# Helpers for the multi-process app tests (sourced): a small MNIST-format
# subset of Fashion-MNIST, free ports, and output parsing.

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
