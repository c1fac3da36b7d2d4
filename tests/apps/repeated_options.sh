#!/usr/bin/env bash
# Options as Python's argparse takes them: one given twice keeps its last
# value, so a wrapper script's defaults (the sbatch examples) can be
# overridden by its user. train_mnist, train_resnet50_cifar and loomrun.
# Usage: repeated_options.sh TRAIN_MNIST LOOMRUN TRAIN_RESNET50_CIFAR
set -u
train_mnist=$1
loomrun=$2
source "$(dirname "$0")/dist_common.sh"
train_resnet=$(absolute_path "$3")
make_work_dir 600 100

timeout 60 "$train_mnist" --data "$work/data" --epochs 5 --log-interval 2 --max-steps 2 --epochs 1 --threads 1 \
  >"$work/mnist.out" 2>&1 || { cat "$work/mnist.out"; fail "train_mnist with --epochs twice failed"; }
grep -q '^Epoch \[1/1\], Step \[2/' "$work/mnist.out" || { cat "$work/mnist.out"; fail "train_mnist: the last --epochs (1) did not win"; }

(cd "$work" && timeout 120 "$train_resnet" --synthetic --synthetic-size 32 --model resnet18 -b 16 -e 3 --max-steps 1 \
  --log-interval 1 --checkpoint-dir '' -e 1 --threads 1 >resnet.out 2>&1) || { cat "$work/resnet.out"; fail "train_resnet50_cifar with -e twice failed"; }
grep -q '^Epoch\[1/1\], Step\[1/' "$work/resnet.out" || { cat "$work/resnet.out"; fail "train_resnet50_cifar: the last -e (1) did not win"; }

timeout 120 "$loomrun" --nproc_per_node=3 --master_port=1 --nproc_per_node=2 --standalone "$train_mnist" --data "$work/data" \
  --max-steps 2 --log-interval 1 --batch-size 50 >"$work/loomrun.out" 2>&1 || { cat "$work/loomrun.out"; fail "loomrun with --nproc_per_node twice failed"; }
grep -q '^Distributed: 2 processes' "$work/loomrun.out" || { cat "$work/loomrun.out"; fail "loomrun: the last --nproc_per_node (2) did not win"; }
echo "ok: the last of a repeated option wins in train_mnist, train_resnet50_cifar and loomrun"
