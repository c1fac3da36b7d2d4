#!/usr/bin/env bash
# train_resnet50_cifar's default optimizer settings learn: SGD lr 0.1, momentum
# 0.9, weight decay 5e-4, cosine schedule and the default warm-up, unchanged,
# on CIFAR-format files with a learnable signal (per class a colour and a
# stripe texture, plus noise; make_cifar_files.py). Only the run is shortened
# (ResNet-18, 640 training images, batch 32, 3 epochs) to fit two cores. The
# test set holds 101 images, so the accuracy line must also count 101.
set -u
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../apps/dist_common.sh"
make_work_dir

python3 "$here/make_cifar_files.py" "$work/cifar/cifar-10-batches-bin" --train-per-file 128 --test 101 --noise 60 --seed 1 ||
  { echo "FAIL could not write the CIFAR-format files"; exit 1; }

start=$SECONDS
out=$(cd "$work" && timeout 240 "$bin" --data "$work/cifar" --model resnet18 -b 32 -e 3 --threads 2 --workers 1 \
      --checkpoint-dir "" --log-interval 5 2>&1)
status=$?
echo "$out"
echo "(run took $((SECONDS - start)) s)"
if [[ $status -ne 0 ]]; then
  echo "FAIL exit status $status"
  exit 1
fi
# ">>> Test accuracy: 0.9406 (95/101)"
line=$(grep '^>>> Test accuracy: ' <<<"$out")
if [[ ! "$line" =~ \(([0-9]+)/([0-9]+)\)$ ]]; then
  echo "FAIL no '>>> Test accuracy: a (correct/total)' line"
  exit 1
fi
correct=${BASH_REMATCH[1]}
total=${BASH_REMATCH[2]}
if [[ $total -ne 101 ]]; then
  echo "FAIL the accuracy counts $total test images; the test set has 101"
  exit 1
fi
# Chance is 1 in 10; a model that learned the colours gets nearly all.
if ((correct * 2 <= total)); then
  echo "FAIL test accuracy $correct/$total is not above 0.5: the default hyper-parameters did not learn"
  exit 1
fi
echo "ok   default hyper-parameters learn: $correct/$total test images correct"
