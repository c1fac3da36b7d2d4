#!/usr/bin/env bash
# --zero (ZeRO stage 1: dist::ZeroRedundancyOptimizer) in both apps.
# train_mnist -g 2 --zero, with SGD momentum, Adam and --amp O2: its step and
# epoch checkpoints are byte for byte those of the same run without --zero
# (the optimizer state gathered on rank 0 in the unsharded format); a run
# stopped at step 27 resumes from step 21 without --zero, and an unsharded
# run's checkpoint resumes with --zero, both ending bit-identical to the
# uninterrupted run. A SIGTERM under --zero (no step checkpoint due) stops
# both ranks with one checkpoint, which resumes without --zero as an
# uninterrupted run goes on. train_resnet50_cifar --zero under loomrun writes
# the unsharded run's checkpoint. --zero with one process: one error line.
# Usage: zero_redundancy.sh TRAIN_MNIST LOOMRUN TRAIN_RESNET50_CIFAR
set -u
train_mnist=$1
loomrun=$2
train_resnet=$3
source "$(dirname "$0")/dist_common.sh"
make_work_dir 640 100
# 640 images, 2 processes of 16: 20 steps per epoch.
common=(--data "$work/data" --epochs 2 --batch-size 16 --log-interval 1 --threads 1 --timeout 60 --progress none
        --checkpoint-every 7 --keep-checkpoints 0)

# run NAME ARGS...: train_mnist -g 2 (two spawned ranks).
run() {
  local name=$1
  shift
  timeout 120 "$train_mnist" -g 2 "${common[@]}" "$@" >"$work/$name.out" 2>"$work/$name.err"
  local status=$?
  ((status == 0)) || { cat "$work/$name.err"; fail "$name exited with $status"; }
}

# loss lines of `log` after global step `after`
losses_after() {
  awk -v after="$2" -F'[][/]' '/^Epoch \[/ { if (($2 - 1) * 20 + $5 > after) print }' "$1"
}

for config in sgd adam O2; do
  case $config in
    sgd) extra=() ;;
    adam) extra=(--optimizer adam) ;;
    O2) extra=(--amp O2) ;;
  esac
  plain=$work/$config-plain zero=$work/$config-zero
  run $config-plain "${extra[@]}" --checkpoint-dir "$plain" --save "$plain.safetensors"
  run $config-zero "${extra[@]}" --zero --checkpoint-dir "$zero" --max-steps 27
  grep -q '^--zero: the optimizer state is sharded over 2 processes; rank 0 steps ' "$work/$config-zero.out" ||
    fail "$config: no '--zero: ...' line: $(head -3 "$work/$config-zero.out")"
  for file in 2GPU_step7 2GPU_step14 2GPU_1epoch 2GPU_step21; do
    cmp "$plain/$file.checkpoint" "$zero/$file.checkpoint" ||
      fail "$config: --zero's $file.checkpoint differs from the unsharded run's"
  done
  # Sharded at world 2 -> unsharded; and an unsharded checkpoint -> sharded.
  run $config-unsharded "${extra[@]}" --checkpoint-dir "$zero" --resume auto --save "$zero.safetensors"
  run $config-sharded "${extra[@]}" --zero --checkpoint-dir "$work/$config-sharded" \
    --resume "$plain/2GPU_step21.checkpoint" --save "$work/$config-sharded.safetensors"
  for resumed in unsharded sharded; do
    grep -q "^Resuming from .*/2GPU_step21.checkpoint (written by 2 processes) at epoch 2, sample 32, on 2 processes, batch 1 (step 21)" \
      "$work/$config-$resumed.out" || fail "$config $resumed: no 'Resuming from ... step 21' line: $(head -5 "$work/$config-$resumed.out")"
    diff <(losses_after "$work/$config-plain.out" 21) <(grep '^Epoch \[' "$work/$config-$resumed.out") ||
      fail "$config: the loss lines resumed $resumed differ from the uninterrupted run's"
  done
  cmp "$plain.safetensors" "$zero.safetensors" || fail "$config: the model resumed without --zero differs"
  cmp "$plain.safetensors" "$work/$config-sharded.safetensors" || fail "$config: the model resumed with --zero differs"
  cmp "$plain/2GPU_2epoch.checkpoint" "$work/$config-sharded/2GPU_2epoch.checkpoint" ||
    fail "$config: the last checkpoint of the run resumed with --zero differs"
  echo "ok: $config: --zero's checkpoints are the unsharded run's, byte for byte; resumed either way, bit-identical"
done

# ---- SIGTERM under --zero: no step checkpoint due, so the stop's checkpoint gathers the state ----
make_mnist_subset "$work/big" 8000 100
sig=(--data "$work/big" --epochs 1 --batch-size 8 --log-interval 1 --threads 1 --timeout 60 --progress none)
timeout 120 "$train_mnist" -g 2 "${sig[@]}" --zero --checkpoint-dir "$work/term" >"$work/term.out" 2>"$work/term.err" &
pid=$!
wait_until 20 has_lines 30 '^Epoch \[' "$work/term.out" || { kill -TERM $pid; fail "no 30 loss lines in 20 s"; }
kill -TERM $pid  # train_mnist -g forwards it to both ranks
wait $pid
status=$?
((status == 143)) || { cat "$work/term.err"; fail "after SIGTERM train_mnist -g 2 --zero exited with $status, expected 143"; }
step=$(sed -n 's/^Preempted by SIGTERM after step \([0-9]*\): checkpoint .* written; resume with --resume auto (exit code 143)$/\1/p' "$work/term.out")
[[ -n $step ]] || fail "rank 0 printed no 'Preempted by SIGTERM' line: $(tail -3 "$work/term.out")"
[[ $(ls "$work/term") == "2GPU_step$step.checkpoint" ]] || fail "expected exactly 2GPU_step$step.checkpoint: $(ls -a "$work/term")"
end=$((step + 20))
timeout 120 "$train_mnist" -g 2 "${sig[@]}" --checkpoint-dir "$work/term" --resume auto --max-steps $end \
  --save "$work/term.safetensors" >"$work/term-resumed.out" 2>&1 || fail "the resumed run failed: $(tail -3 "$work/term-resumed.out")"
timeout 120 "$train_mnist" -g 2 "${sig[@]}" --checkpoint-dir '' --max-steps $end --save "$work/reference.safetensors" \
  >"$work/reference.out" 2>&1 || fail "the uninterrupted run failed: $(tail -3 "$work/reference.out")"
diff <(grep '^Epoch \[' "$work/reference.out" | tail -n 20) <(grep '^Epoch \[' "$work/term-resumed.out") ||
  fail "the loss lines resumed after SIGTERM differ from the uninterrupted run's"
cmp "$work/term.safetensors" "$work/reference.safetensors" || fail "the model resumed after SIGTERM differs"
echo "ok: SIGTERM under --zero after step $step: one checkpoint; resumed without --zero, bit-identical at step $end"

# ---- train_resnet50_cifar --zero under loomrun ----
resnet=(--synthetic --synthetic-size 32 --model resnet18 --stem cifar -b 8 -e 1 --threads 1 --timeout 60
        --log-interval 1 --progress none)
for mode in plain zero; do
  flag=()
  [[ $mode == zero ]] && flag=(--zero)
  timeout 120 "$loomrun" --nproc_per_node=2 --master_port="$(free_port)" "$train_resnet" "${resnet[@]}" "${flag[@]}" \
    --checkpoint-dir "$work/resnet-$mode" >"$work/resnet-$mode.out" 2>&1 ||
    fail "train_resnet50_cifar ${flag[*]}: $(tail -3 "$work/resnet-$mode.out")"
done
cmp "$work/resnet-plain/2GPU_1epoch.checkpoint" "$work/resnet-zero/2GPU_1epoch.checkpoint" ||
  fail "train_resnet50_cifar --zero's checkpoint differs from the unsharded run's"
echo "ok: train_resnet50_cifar --zero writes the unsharded run's checkpoint"

# ---- --zero with one process ----
failures=0
expect_one_line_error "train_mnist --zero with one process" \
  "train_mnist: --zero shards the optimizer state over several processes, but this run has one" \
  "$train_mnist" --data "$work/data" --zero
expect_one_line_error "train_resnet50_cifar --zero with one process" \
  "train_resnet50_cifar: --zero shards the optimizer state over several processes, but this run has one" \
  "$train_resnet" --synthetic --zero
((failures == 0)) || fail "$failures bad-input case(s) failed"
echo "ok: --zero"
