#!/usr/bin/env bash
# Bad input to train_mnist: each case must exit non-zero with exactly one line
# on stderr that names the problem, never a crash or a hang.
set -u
bin=$1
source "$(dirname "$0")/dist_common.sh"
make_work_dir
failures=0

# expect_error DESCRIPTION EXPECTED_TEXT ARGS...: train_mnist ARGS gives one error line (expect_one_line_error).
expect_error() {
  local what=$1 expected=$2
  shift 2
  expect_one_line_error "$what" "$expected" "$bin" "$@"
}

# IDX files made by hand: magic, counts, dims, then the bytes.
python3 - "$work" <<'PY'
import gzip, os, struct, sys
work = sys.argv[1]
def images(n, extra=b""):
    return struct.pack(">IIII", 2051, n, 28, 28) + bytes(n * 784) + extra
def labels(n, value=1):
    return struct.pack(">II", 2049, n) + bytes([value]) * n
def write(d, files):
    os.makedirs(d, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
good = {"train-images-idx3-ubyte": images(10), "train-labels-idx1-ubyte": labels(10),
        "t10k-images-idx3-ubyte": images(5), "t10k-labels-idx1-ubyte": labels(5)}
write(f"{work}/good", good)
write(f"{work}/truncated", {**good, "train-images-idx3-ubyte": images(10)[:-100]})
write(f"{work}/magic", {**good, "train-images-idx3-ubyte": struct.pack(">I", 1234) + images(10)[4:]})
write(f"{work}/count", {**good, "train-labels-idx1-ubyte": labels(9)})
write(f"{work}/label", {**good, "t10k-labels-idx1-ubyte": labels(5, 12)})
write(f"{work}/missing", {k: v for k, v in good.items() if not k.startswith("t10k")})
with gzip.open(f"{work}/gzip-truncated.gz", "wb") as f:
    f.write(images(10))
data = open(f"{work}/gzip-truncated.gz", "rb").read()
write(f"{work}/gz", {"train-images-idx3-ubyte.gz": data[: len(data) // 2], "train-labels-idx1-ubyte": labels(10),
                     "t10k-images-idx3-ubyte": images(5), "t10k-labels-idx1-ubyte": labels(5)})
PY

# torchvision's layouts: --data ROOT means ROOT/MNIST/raw (as MNIST(root, download=True) leaves it), and
# without --data ./MNIST/raw is looked at (the torchrun tutorial's root "./").
mkdir -p "$work/tvroot/MNIST" "$work/cwd/MNIST" "$work/run"
cp -r "$work/good" "$work/tvroot/MNIST/raw"
cp -r "$work/truncated" "$work/cwd/MNIST/raw"
if out=$(cd "$work/run" && timeout 120 "$bin" --data "$work/tvroot" --epochs 1 --batch-size 5 2>&1); then
  echo "ok   --data ROOT reads ROOT/MNIST/raw"
else
  echo "FAIL --data ROOT with ROOT/MNIST/raw: $out"; failures=$((failures + 1))
fi
# Image folders (DIR/train/<class>/, DIR/val/), inferred from --data, read in grayscale at 28x28.
if python=$(for p in python3 /usr/bin/python3; do "$p" -c 'import PIL' 2>/dev/null && { echo "$p"; break; }; done) &&
   [[ -n "$python" ]] && "$python" "$(dirname "$0")/../data/make_image_folder.py" "$work/imf" >/dev/null; then
  mkdir -p "$work/folders" && cp -r "$work/imf/tree" "$work/folders/train" && cp -r "$work/imf/tree" "$work/folders/val"
  if out=$(cd "$work/run" && timeout 120 "$bin" --data "$work/folders" --epochs 1 --batch-size 4 2>&1) &&
     [[ "$out" == *"Training on ImageFolder $work/folders (5 classes) (11 training, 11 test images)"* ]]; then
    echo "ok   image folders inferred from --data"
  else
    echo "FAIL image folders: $out"; failures=$((failures + 1))
  fi
  expect_error "ConvNet on 32x32 image folders" "--model convnet takes 1x28x28 images" \
    --data "$work/folders" --image-size 32 --epochs 1
else
  echo "FAIL could not write image folders (python3 with PIL: apt-get install python3-pil)"; failures=$((failures + 1))
fi
pushd "$work/cwd" >/dev/null
expect_error "./MNIST/raw is where train_mnist looks without --data" "MNIST/raw/train-images-idx3-ubyte"
popd >/dev/null
expect_error "missing data directory" "$work/nowhere" --data "$work/nowhere"
expect_error "truncated IDX file" "train-images-idx3-ubyte" --data "$work/truncated"
expect_error "wrong magic number" "1234" --data "$work/magic"
expect_error "label count differs from image count" "train-labels-idx1-ubyte" --data "$work/count"
expect_error "label out of range" "t10k-labels-idx1-ubyte" --data "$work/label"
expect_error "missing test files" "t10k-images-idx3-ubyte" --data "$work/missing"
expect_error "truncated gzip IDX file" "train-images-idx3-ubyte.gz" --data "$work/gz"
expect_error "unknown flag" "--frobnicate" --frobnicate
expect_error "unknown dataset kind" "--dataset" --dataset imagenet
expect_error "negative epoch count" "--epochs: must be a whole number >= 0, got '-1'" --epochs -1
expect_error "non-numeric batch size" "--batch-size: 'ten' is not a whole number" --batch-size ten
expect_error "negative clipping norm" "--clip-grad-norm: must be a number >= 0, got '-1'" --clip-grad-norm -1
expect_error "NaN clipping norm" "--clip-grad-norm: must be a number >= 0, got 'nan'" --clip-grad-norm nan
expect_error "no batch per step" "--accumulate-steps: must be a whole number >= 1, got '0'" --accumulate-steps 0
expect_error "negative accumulation" "--accumulate-steps: must be a whole number >= 1, got '-2'" --accumulate-steps -2
for flag in --clip-grad-norm --accumulate-steps; do  # the new flags are listed in --help
  if ! "$bin" --help | grep -q -- "$flag"; then echo "FAIL --help lacks $flag"; failures=$((failures + 1)); fi
done
expect_error "CUDA on a machine without it" "CUDA" --device cuda --data "$work/truncated"
# Checked before any rendezvous, as in train_resnet50_cifar (apps/training.h: choose_backend).
expect_error "--backend nccl for CPU training" "nccl" --backend nccl --device cpu --data "$work/good"
expect_error "--cuda-graph without a GPU" "--cuda-graph captures each training step as a CUDA graph, which needs a GPU (--device cuda), not --device cpu" \
  --cuda-graph --device cpu --data "$work/good"
# An environment variable with a value it does not take (read at the first 5x5 convolution).
bin_without_env=$bin
bin=$work/with-env.sh
printf '#!/bin/sh\nLOOM_CPU_WINOGRAD=yes exec "%s" "$@"\n' "$bin_without_env" >"$bin"
chmod +x "$bin"
expect_error "LOOM_CPU_WINOGRAD neither 0 nor 1" "LOOM_CPU_WINOGRAD must be 0" --data "$work/good" --epochs 1
# A GEMM kernel that does not exist (read when the app names its kernels at start).
printf '#!/bin/sh\nLOOM_CPU_GEMM=avx1024 exec "%s" "$@"\n' "$bin_without_env" >"$bin"
expect_error "LOOM_CPU_GEMM not a kernel" "LOOM_CPU_GEMM must be avx512, avx2-fma or eigen" --data "$work/good" --epochs 1
# A log level that is not one fails before training, in a single process too.
printf '#!/bin/sh\nLOOM_LOG_LEVEL=loud exec "%s" "$@"\n' "$bin_without_env" >"$bin"
expect_error "LOOM_LOG_LEVEL not a level" "LOOM_LOG_LEVEL='loud' is not a log level" --data "$work/good" --epochs 1
bin=$bin_without_env

if [[ $failures -ne 0 ]]; then
  echo "$failures bad-input case(s) failed"
  exit 1
fi
echo "all bad-input cases gave one clear error line"
