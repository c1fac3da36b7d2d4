#!/usr/bin/env bash
# --model in both apps for torchvision's CNNs beyond the ResNets (issue 52):
# train_resnet50_cifar trains mobilenet_v2, mobilenet_v3_small / _large,
# efficientnet_b0, regnet_y_400mf and convnext_tiny for 2 steps on synthetic
# 32x32 images (efficientnet_b0 and regnet_y_400mf under --amp O2, convnext_tiny
# also under --amp bf16); mobilenet_v3_small resumes from its epoch-1 checkpoint to the
# same epoch-2 checkpoint byte for byte and runs at world 2 with DDP and
# --sync-bn; train_mnist trains vgg11_bn, mobilenet_v2 and regnet_y_400mf on 1x28x28
# Fashion-MNIST (the channel repeated, padded to 32x32), and
# train_resnet50_cifar --dataset mnist vgg11_bn for one step (the two VGG runs:
# 132M parameters; its test set must be padded like its training set). Bad --model / --stem give one line. vgg16_bn shares vgg11_bn's code
# path and is left out (138M parameters).
# Usage: train_models_apps.sh TRAIN_RESNET50_CIFAR TRAIN_MNIST
set -u
cifar_bin=$1
mnist_bin=$2
source "$(dirname "$0")/../apps/dist_common.sh"
make_work_dir
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
synthetic=(--synthetic --synthetic-size 8 -b 4 --threads 2 --log-interval 1 --seed 5)

# run_app DESCRIPTION DIR EXPECTED_TEXT BIN ARGS...: BIN ARGS in DIR must exit 0 with EXPECTED_TEXT in its output.
run_app() {
  local what=$1 dir=$2 expected=$3 bin=$4 output status
  shift 4
  mkdir -p "$dir"
  output=$(cd "$dir" && timeout 120 "$bin" "$@" 2>&1)
  status=$?
  if [[ $status -ne 0 ]]; then
    fail "$what: exit status $status: $output"
  elif [[ "$output" != *"$expected"* ]]; then
    fail "$what: output lacks '$expected': $output"
  else
    echo "ok   $what: $(grep 'Test accuracy' <<<"$output")"
  fi
}

# 1. Two steps of each model on synthetic CIFAR-shaped data, one process, with checkpoints.
# Some under mixed precision: --amp O2 (f16 model, f32 master weights) or bf16.
for run in mobilenet_v2 mobilenet_v3_large efficientnet_b0:O2 regnet_y_400mf:O2 convnext_tiny convnext_tiny:bf16; do
  model=${run%%:*} amp=() dir=$work/${run/:/_}
  [[ $run == *:* ]] && amp=(--amp "${run#*:}")
  run_app "$model${amp[*]:+ ${amp[*]}}" "$dir" "Epoch[1/1], Step[2/2], Loss: " "$cifar_bin" "${synthetic[@]}" \
    --model "$model" -e 1 "${amp[@]}"
  [[ -f "$dir/checkpoint/1GPU_1epoch.checkpoint" ]] || fail "$run wrote no checkpoint/1GPU_1epoch.checkpoint"
done

# 2. mobilenet_v3_small: 2 epochs of 1 step, then a resume from epoch 1 that must write the same epoch-2 checkpoint.
small=("${synthetic[@]}" --model mobilenet_v3_small -e 2 --max-steps 1)
run_app "mobilenet_v3_small, 2 epochs" "$work/small" "Epoch[2/2], Step[1/1], Loss: " "$cifar_bin" "${small[@]}"
run_app "mobilenet_v3_small resumed at epoch 2" "$work/small_resumed" "Resuming from" "$cifar_bin" "${small[@]}" \
  -c "$work/small/checkpoint/1GPU_1epoch.checkpoint"
if cmp -s "$work/small/checkpoint/1GPU_2epoch.checkpoint" "$work/small_resumed/checkpoint/1GPU_2epoch.checkpoint"; then
  echo "ok   mobilenet_v3_small: the resumed run's epoch-2 checkpoint is byte-identical"
else
  fail "mobilenet_v3_small: the resumed run's epoch-2 checkpoint differs (or is missing)"
fi

# 3. World 2: DDP with SyncBatchNorm (Gloo on loopback, torchrun-style variables).
port=$(free_port)
mkdir -p "$work/ddp"
for rank in 0 1; do
  (cd "$work/ddp" && RANK=$rank WORLD_SIZE=2 LOCAL_RANK=$rank LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
     MASTER_PORT=$port timeout 120 "$cifar_bin" --synthetic --synthetic-size 8 -b 4 -e 1 --threads 1 --log-interval 1 \
     --model mobilenet_v3_small --sync-bn --backend gloo >"rank$rank.txt" 2>&1) &
done
ddp_status=0
for job in $(jobs -p); do wait "$job" || ddp_status=$?; done
rank0=$(cat "$work/ddp/rank0.txt")
if [[ $ddp_status -ne 0 ]]; then
  fail "2-process mobilenet_v3_small --sync-bn: exit status $ddp_status: $rank0 / $(cat "$work/ddp/rank1.txt")"
elif [[ "$rank0" != *"backend gloo, SyncBatchNorm"* || "$rank0" != *"Step[2/2]"* ||
        ! -f "$work/ddp/checkpoint/2GPU_1epoch.checkpoint" ]]; then
  fail "2-process mobilenet_v3_small --sync-bn: expected SyncBatchNorm, 2 steps and a checkpoint: $rank0"
else
  echo "ok   2-process mobilenet_v3_small --sync-bn: $(grep 'Test accuracy' <<<"$rank0")"
fi

# 4. train_mnist on 1x28x28 images: the channel repeated to 3 and the images padded to 32x32.
if make_mnist_subset "$work/mnist" 8 4 >/dev/null 2>&1 || [[ -f "$work/mnist/train-images-idx3-ubyte" ]]; then
  for model in vgg11_bn mobilenet_v2 regnet_y_400mf; do
    save=()
    [[ $model != vgg11_bn ]] && save=(--save "$work/mnist_$model/model.safetensors")
    run_app "train_mnist --model $model" "$work/mnist_$model" "Test accuracy: " "$mnist_bin" --data "$work/mnist" \
      --model "$model" --batch-size 4 --epochs 1 --threads 2 --log-interval 1 --checkpoint-dir "" "${save[@]}"
  done
  # train_resnet50_cifar on the same 28x28 images: training and test both padded to 32x32 (VGG's five pools
  # need it; a 28x28 test set ended at the first evaluation).
  run_app "train_resnet50_cifar --dataset mnist --model vgg11_bn" "$work/cifar_app_mnist_vgg" "Test accuracy" \
    "$cifar_bin" --dataset mnist --data "$work/mnist" --model vgg11_bn -b 4 -e 1 --max-steps 1 --threads 2 \
    --log-interval 1
  # The channel-repeating wrapper keeps torchvision's state_dict: mobilenet_v2's 314 keys, features.* and
  # classifier.*; regnet_y_400mf's 384, stem.*, trunk_output.* and fc.*.
  python3 - "$work/mnist_mobilenet_v2/model.safetensors" "$work/mnist_regnet_y_400mf/model.safetensors" <<'PY' ||
import json, struct, sys
def keys(path):
    blob = open(path, "rb").read()
    return [k for k in json.loads(blob[8:8 + struct.unpack("<Q", blob[:8])[0]]) if k != "__metadata__"]
mobilenet, regnet = keys(sys.argv[1]), keys(sys.argv[2])
assert len(mobilenet) == 314 and all(k.startswith(("features.", "classifier.")) for k in mobilenet), mobilenet[:5]
assert "features.0.0.weight" in mobilenet and "classifier.1.weight" in mobilenet
assert len(regnet) == 384 and all(k.startswith(("stem.", "trunk_output.", "fc.")) for k in regnet), regnet[:5]
assert "trunk_output.block1.block1-0.f.se.fc1.bias" in regnet and "fc.weight" in regnet
PY
    fail "train_mnist --model mobilenet_v2 / regnet_y_400mf --save: not torchvision's keys"
else
  echo "SKIP train_mnist part: /usr/share/datasets/fashion-mnist is missing (apt-get install dataset-fashion-mnist)"
fi

# 5. Bad input: one line each.
expect_one_line_error "unknown --model" "mobilenet_v3_small" "$cifar_bin" --synthetic --model mobilenet_v4
expect_one_line_error "train_mnist unknown --model" "efficientnet_b0" "$mnist_bin" --model alexnet
expect_one_line_error "--stem cifar with --model mobilenet_v2" "--stem cifar applies to the ResNets only" \
  "$cifar_bin" --synthetic --synthetic-size 8 --model mobilenet_v2 --stem cifar --checkpoint-dir ""
help=$("$cifar_bin" --help)
[[ "$help" == *"efficientnet_b0"* && "$help" == *"vgg16_bn"* && "$help" == *"regnet_y_400mf"* &&
   "$help" == *"convnext_tiny"* ]] || fail "--help does not list the models"

((failures == 0)) || { echo "$failures failure(s)"; exit 1; }
echo "all passed"
