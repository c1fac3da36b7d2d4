#!/usr/bin/env bash
# The apps' data as a user gives it (#50): image folders as torchvision's
# ImageFolder(root) takes them (class folders directly under --data, a
# held-out --val-fraction or --val-data), and damaged data files, each of
# which must stop the run with one line naming the file and what is wrong:
# an empty CIFAR-10 batch, a gzipped IDX header declaring billions of labels
# (peak memory under 1 GB), test images of another size than the training
# ones, a FIFO named .jpg; a python batch with 1 GiB of stray bytes after it
# trains, with peak memory far below the stray bytes.
#   data_readers.sh TRAIN_MNIST TRAIN_RESNET50_CIFAR
set -u
mnist=$1
cifar=$2
source "$(dirname "$0")/dist_common.sh"
make_work_dir
cd "$work"
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# max_rss_mib COMMAND...: runs it under /usr/bin/time -v; prints its peak resident set in MiB ('' without time).
max_rss_mib() {
  [[ -x /usr/bin/time ]] || return 0
  (cd "$work" && timeout 120 /usr/bin/time -v "$@" >/dev/null 2>"$work/time.txt")
  awk -F: '/Maximum resident set size/ {print int($2 / 1024)}' "$work/time.txt"
}

python=$(for p in python3 /usr/bin/python3; do "$p" -c 'import PIL, numpy' 2>/dev/null && { echo "$p"; break; }; done)
if [[ -z "$python" ]]; then
  echo "skipped: no python3 with PIL and numpy (apt-get install python3-pil python3-numpy)"
  exit 77
fi
data_dir=$(cd "$(dirname "$0")/../data" && pwd)

# ---- image folders ----
"$python" "$data_dir/make_image_folder.py" "$work/imf" >/dev/null || { fail "make_image_folder.py"; exit 1; }
root=$work/imf/tree  # ROOT/<class>/..., torchvision's ImageFolder(root)
if out=$(cd "$work" && timeout 120 "$mnist" --data "$root" --epochs 1 --batch-size 4 --checkpoint-dir "" 2>&1) &&
   [[ "$out" == *"Validation split: 0.1 of each class of $root held out (seed 0): "* ]] &&
   [[ "$out" == *"Test accuracy"* ]]; then
  echo "ok   train_mnist on ROOT/<class>/: $(grep 'Validation split' <<<"$out")"
else
  fail "train_mnist on ROOT/<class>/: $out"
fi
if out=$(cd "$work" && timeout 120 "$mnist" --data "$root" --dataset imagefolder --val-fraction 0.5 --seed 3 \
           --epochs 1 --batch-size 4 --checkpoint-dir "" 2>&1) &&
   [[ "$out" == *"Validation split: 0.5 of each class of $root held out (seed 3): "* ]]; then
  echo "ok   --val-fraction 0.5 --seed 3"
else
  fail "--val-fraction 0.5: $out"
fi
mkdir -p "$work/split" && cp -r "$root" "$work/split/train" && cp -r "$root" "$work/split/val"
if out=$(cd "$work" && timeout 120 "$mnist" --data "$work/split" --epochs 1 --batch-size 4 --checkpoint-dir "" 2>&1) &&
   [[ "$out" == *"Validation split: the separate folder $work/split/val (11 images)"* ]]; then
  echo "ok   ROOT/train + ROOT/val as before"
else
  fail "ROOT/train + ROOT/val: $out"
fi
if out=$(cd "$work" && timeout 300 "$cifar" --data "$root" --val-data "$work/split/val" --image-size 32 \
           --model resnet18 -b 4 -e 1 --max-steps 1 --threads 2 --checkpoint-dir "" 2>&1) &&
   [[ "$out" == *"Validation split: the separate folder $work/split/val (11 images); training on $root (11 images)"* ]]; then
  echo "ok   train_resnet50_cifar --val-data"
else
  fail "train_resnet50_cifar --val-data: $out"
fi
expect_one_line_error "--val-fraction out of range" "--val-fraction: must be a number above 0 and below 1, got '1.5'" \
  "$mnist" --data "$root" --val-fraction 1.5
expect_one_line_error "--val-fraction beside ROOT/val" "are both given; use one" \
  "$mnist" --data "$work/split" --val-fraction 0.2 --epochs 1
expect_one_line_error "--val-data missing" "the validation folder $work/nowhere does not exist" \
  "$cifar" --data "$root" --dataset imagefolder --val-data "$work/nowhere"
class=$(head -1 "$work/imf/expected/classes.txt")
mkfifo "$root/$class/pipe.jpg"
expect_one_line_error "a FIFO named .jpg" "pipe.jpg is a FIFO (named pipe), not an image file" \
  "$mnist" --data "$root" --epochs 1 --checkpoint-dir ""
rm "$root/$class/pipe.jpg"

# ---- CIFAR-10 ----
"$python" - "$work" <<'PY'
import os, sys
work = sys.argv[1]
def batch(n):
    return b"".join(bytes([i % 10]) + bytes((i * 7 + j) % 256 for j in range(3072)) for i in range(n))
for name, empty in (("empty-train", "data_batch_1.bin"), ("empty-test", "test_batch.bin")):
    d = os.path.join(work, name, "cifar-10-batches-bin")
    os.makedirs(d)
    for f in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        with open(os.path.join(d, f), "wb") as out:
            out.write(b"" if f == empty else batch(4))
PY
expect_one_line_error "an empty data_batch_1.bin" \
  "CIFAR-10 file $work/empty-train/cifar-10-batches-bin/data_batch_1.bin has 0 bytes; expected a multiple of 3073 above zero" \
  "$cifar" --data "$work/empty-train"
expect_one_line_error "an empty test_batch.bin" "test_batch.bin has 0 bytes" "$cifar" --data "$work/empty-test"
"$python" "$data_dir/make_cifar_pickles.py" "$work/py/cifar-10-batches-py" default --train-per-file 8 --test 4 >/dev/null
batch=$work/py/cifar-10-batches-py/data_batch_1
truncate -s +1G "$batch"  # sparse: 1 GiB of zero bytes after the pickle, no disk
peak=$(max_rss_mib "$cifar" --data "$work/py" --model resnet18 --stem cifar -b 4 -e 1 --max-steps 1 --threads 2 \
         --checkpoint-dir "")
if [[ -z "$peak" ]]; then
  echo "skip peak memory of the python batch with 1 GiB after it (no /usr/bin/time)"
elif grep -q "Exit status: 0" "$work/time.txt" && (( peak < 700 )); then
  echo "ok   a python batch with 1 GiB of stray bytes after it trains, peak ${peak} MiB"
else
  fail "python batch with stray bytes: peak ${peak} MiB; $(tail -5 "$work/time.txt")"
fi

# ---- IDX ----
"$python" - "$work" <<'PY'
import gzip, os, struct, sys
work = sys.argv[1]
def write(d, files):
    os.makedirs(d, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
images = lambda n, side=28: struct.pack(">IIII", 2051, n, side, side) + bytes(n * side * side)
labels = lambda n: struct.pack(">II", 2049, n) + bytes(n)
good = {"train-images-idx3-ubyte": images(10), "train-labels-idx1-ubyte": labels(10),
        "t10k-images-idx3-ubyte": images(5), "t10k-labels-idx1-ubyte": labels(5)}
# Headers declaring 4 billion labels (and images of 1x1) over 16 MiB of zeros (16 KB of gzip).
bomb_labels = gzip.compress(struct.pack(">II", 2049, 4000000000) + bytes(16 << 20), mtime=0)
bomb_images = gzip.compress(struct.pack(">IIII", 2051, 4000000000, 1, 1) + bytes(16 << 20), mtime=0)
rest = {k: v for k, v in good.items() if not k.startswith("train")}
write(f"{work}/bomb", {**rest, "train-images-idx3-ubyte": images(10), "train-labels-idx1-ubyte.gz": bomb_labels})
write(f"{work}/bombs", {**rest, "train-images-idx3-ubyte.gz": bomb_images, "train-labels-idx1-ubyte.gz": bomb_labels})
write(f"{work}/sizes", {**good, "t10k-images-idx3-ubyte": images(5, 32)})
PY
expect_one_line_error "a gzipped IDX header declaring 4 billion labels beside 10 images" \
  "IDX files do not match: $work/bomb/train-images-idx3-ubyte holds 10 images but $work/bomb/train-labels-idx1-ubyte.gz holds 4000000000 labels" \
  "$mnist" --data "$work/bomb"
expect_one_line_error "gzipped IDX headers declaring 4 billion images and labels" \
  "IDX file $work/bombs/train-images-idx3-ubyte.gz: the header declares 4000000000 images of 1x1" \
  "$mnist" --data "$work/bombs"
for case in bomb bombs; do
  peak=$(max_rss_mib "$mnist" --data "$work/$case" --epochs 1)
  if [[ -n "$peak" ]] && (( peak >= 1000 )); then fail "refusing $case took ${peak} MiB"; fi
  [[ -n "$peak" ]] && echo "ok   refusing $case peaks at ${peak} MiB"
done
expect_one_line_error "test images of another size" \
  "$work/sizes/train-images-idx3-ubyte holds images of 28x28 pixels but $work/sizes/t10k-images-idx3-ubyte holds images of 32x32" \
  "$mnist" --data "$work/sizes"
# A validation split asked of MNIST, which brings its own test files, is refused, not ignored.
expect_one_line_error "--val-fraction with MNIST" "applies to image folders only: $work/bomb holds MNIST" \
  "$mnist" --data "$work/bomb" --val-fraction 0.2

if [[ $failures -ne 0 ]]; then
  echo "$failures case(s) failed"
  exit 1
fi
echo "all data-reader cases passed"
