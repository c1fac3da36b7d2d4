#!/usr/bin/env bash
# train_resnet50_cifar run as a user would: on CIFAR-10-format files made here,
# 2 epochs with per-epoch checkpoints, then a resume from the epoch-1
# checkpoint that must reproduce the epoch-2 checkpoint byte for byte, as must
# a --channels-last run; the synthetic-data path; two processes with DDP on
# loopback, also with --sync-bn, evaluating a test set of odd size (21
# images) so that every image must be counted exactly once; and bad input,
# each case exiting non-zero with exactly one line on stderr that names the
# problem.
set -u
bin=$1
source "$(dirname "$0")/../apps/dist_common.sh"
make_work_dir
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# Small, learnable CIFAR-10 binary files: 16 images per training batch file,
# 21 test images, colour and stripes by label.
python3 "$(dirname "$0")/make_cifar_files.py" "$work/cifar/cifar-10-batches-bin" --train-per-file 16 --test 21 ||
  { echo "FAIL could not write the CIFAR-format files"; exit 1; }
common=(--data "$work/cifar" --model resnet18 -b 16 --threads 2 --workers 1 --log-interval 2 --seed 3)

# 1. Two epochs straight.
mkdir -p "$work/a" "$work/b"
(cd "$work/a" && timeout 120 "$bin" "${common[@]}" -e 2 >out.txt 2>err.txt)
status=$?
out=$(cat "$work/a/out.txt")
if [[ $status -ne 0 ]]; then
  fail "2-epoch run: exit status $status: $(cat "$work/a/err.txt")"
else
  for expected in ">>> Training on 1 " "Epoch[1/2], Step[2/5], Loss: " "Time dataload: " " ms, Time training: " \
                  "Epoch[2/2], Step[4/5]" ">>> Training complete in: 0:" ">>> Test accuracy: "; do
    [[ "$out" == *"$expected"* ]] || fail "2-epoch run: output lacks '$expected'"
  done
  [[ "$out" != *"synthetic"* ]] || fail "2-epoch run on CIFAR files mentions synthetic data"
  for epoch in 1 2; do
    [[ -f "$work/a/checkpoint/1GPU_${epoch}epoch.checkpoint" ]] || fail "no checkpoint/1GPU_${epoch}epoch.checkpoint"
  done
  echo "ok   2-epoch run: $(grep -c '^Epoch\[' <<<"$out") loss lines, $(grep 'Test accuracy' <<<"$out")"
fi

# 2. Resume from the epoch-1 checkpoint: epoch 2 only, same final state.
(cd "$work/b" && timeout 120 "$bin" "${common[@]}" -e 2 -c "$work/a/checkpoint/1GPU_1epoch.checkpoint" >out.txt 2>err.txt)
status=$?
resumed=$(cat "$work/b/out.txt")
if [[ $status -ne 0 ]]; then
  fail "resumed run: exit status $status: $(cat "$work/b/err.txt")"
else
  [[ "$resumed" == *"Resuming from $work/a/checkpoint/1GPU_1epoch.checkpoint (written by 1 process) at epoch 2, sample 0, on 1 process"* ]] || fail "resumed run: no 'Resuming from' line"
  [[ "$resumed" != *"Epoch[1/2]"* ]] || fail "resumed run repeated epoch 1"
  [[ "$resumed" == *"Epoch[2/2], Step[4/5]"* ]] || fail "resumed run: no epoch-2 loss line"
  [[ ! -e "$work/b/checkpoint/1GPU_1epoch.checkpoint" ]] || fail "resumed run rewrote the epoch-1 checkpoint"
  if cmp -s "$work/a/checkpoint/1GPU_2epoch.checkpoint" "$work/b/checkpoint/1GPU_2epoch.checkpoint"; then
    echo "ok   resumed run: its epoch-2 checkpoint is byte-identical to the uninterrupted run's"
  else
    fail "resumed run: epoch-2 checkpoint differs from the uninterrupted run's"
  fi
  [[ "$(grep 'Test accuracy' <<<"$out")" == "$(grep 'Test accuracy' <<<"$resumed")" ]] || fail "resumed run: different test accuracy"
  [[ "$(grep '^Epoch\[2/2\]' <<<"$out" | cut -d, -f1-3)" == "$(grep '^Epoch\[2/2\]' <<<"$resumed" | cut -d, -f1-3)" ]] ||
    fail "resumed run: epoch-2 losses differ"
fi

# 2b. Step checkpoints, and a resume from the middle of epoch 1 (step 3 of 5,
# inside the warm-up): the rest of epoch 1, the cosine schedule's step, and
# epoch 2 as in the uninterrupted run, byte for byte.
mkdir -p "$work/c" "$work/d"
failures_before=$failures
(cd "$work/c" && timeout 120 "$bin" "${common[@]}" -e 2 --checkpoint-every 3 --keep-checkpoints 0 >out.txt 2>err.txt) ||
  fail "run with --checkpoint-every 3: $(cat "$work/c/err.txt")"
(cd "$work/d" && timeout 120 "$bin" "${common[@]}" -e 2 --checkpoint-every 3 --resume "$work/c/checkpoint/1GPU_step3.checkpoint" \
  >out.txt 2>err.txt) || fail "resume from step 3: $(cat "$work/d/err.txt")"
grep -q "^Resuming from $work/c/checkpoint/1GPU_step3.checkpoint (written by 1 process) at epoch 1, sample [0-9]*, on 1 process, batch 3 (step 3)" "$work/d/out.txt" ||
  fail "resume from step 3: no 'Resuming from' line: $(head -3 "$work/d/out.txt")"
for file in 1GPU_step6.checkpoint 1GPU_step9.checkpoint 1GPU_1epoch.checkpoint 1GPU_2epoch.checkpoint; do
  cmp -s "$work/c/checkpoint/$file" "$work/d/checkpoint/$file" || fail "resume from step 3: $file differs"
done
cmp -s "$work/a/checkpoint/1GPU_2epoch.checkpoint" "$work/d/checkpoint/1GPU_2epoch.checkpoint" ||
  fail "resume from step 3: the epoch-2 checkpoint differs from the run without step checkpoints"
[[ "$(grep '^>>> Test accuracy' "$work/a/out.txt")" == "$(grep '^>>> Test accuracy' "$work/d/out.txt")" ]] ||
  fail "resume from step 3: different test accuracy"
((failures == failures_before)) && echo "ok   resumed mid-epoch from step 3: every later checkpoint byte-identical"

# 2c. --channels-last: NHWC weights and batches. On the CPU the kernels take
# their inputs contiguous, so the run computes the same values and its
# epoch-2 checkpoint (weights, momentum buffers, all state) is byte-identical.
mkdir -p "$work/nhwc"
if ! (cd "$work/nhwc" && timeout 120 "$bin" "${common[@]}" -e 2 --channels-last >out.txt 2>err.txt); then
  fail "--channels-last run: $(cat "$work/nhwc/err.txt")"
elif cmp -s "$work/a/checkpoint/1GPU_2epoch.checkpoint" "$work/nhwc/checkpoint/1GPU_2epoch.checkpoint"; then
  echo "ok   --channels-last run: its epoch-2 checkpoint is byte-identical to the NCHW run's"
else
  fail "--channels-last run: its epoch-2 checkpoint differs from the NCHW run's"
fi

# expect_run DESCRIPTION DIR EXPECTED_TEXT... -- ARGS...: the app with ARGS,
# run in DIR, must exit 0 with every EXPECTED_TEXT in its output (stdout and
# stderr); prints its accuracy line then.
expect_run() {
  local what=$1 dir=$2 expected=() text status run_output
  shift 2
  while [[ $1 != "--" ]]; do expected+=("$1"); shift; done
  shift
  run_output=$(cd "$dir" && timeout 120 "$bin" "$@" 2>&1)
  status=$?
  if [[ $status -ne 0 ]]; then
    fail "$what: exit status $status: $run_output"
    return
  fi
  for text in "${expected[@]}"; do
    [[ "$run_output" == *"$text"* ]] || { fail "$what: output lacks '$text': $run_output"; return; }
  done
  echo "ok   $what: $(grep 'Test accuracy' <<<"$run_output")"
}

# 3. Synthetic data: the accuracy line says so.
expect_run "synthetic run" "$work/a" ">>> Test accuracy (synthetic data): " -- \
  --synthetic --synthetic-size 32 --model resnet18 -b 16 -e 1 --threads 2 --checkpoint-dir ""

# 3b. torchvision's python layout (cifar-10-batches-py, pickled numpy batches), one short epoch.
if python=$(for p in python3 /usr/bin/python3; do "$p" -c 'import numpy' 2>/dev/null && { echo "$p"; break; }; done) &&
   [[ -n "$python" ]] &&
   "$python" "$(dirname "$0")/../data/make_cifar_pickles.py" "$work/py/cifar-10-batches-py" default \
     --train-per-file 8 --test 5 >/dev/null; then
  expect_run "run on torchvision's cifar-10-batches-py" "$work/a" "Epoch[1/1], Step[5/5]" ">>> Test accuracy: " -- \
    --data "$work/py" --model resnet18 -b 8 -e 1 --threads 2 --log-interval 1 --checkpoint-dir ""
else
  fail "could not write cifar-10-batches-py (python3 with numpy: apt-get install python3-numpy)"
fi

# 3c. Image folders (DIR/train/<class>/, DIR/val/<class>/, JPEG and PNG written by PIL): the head has
# one output per class found, --image-size sets the crop.
if [[ -n "${python:-}" ]] && "$python" -c 'import PIL' 2>/dev/null &&
   "$python" "$(dirname "$0")/../data/make_image_folder.py" "$work/imf" >/dev/null; then
  mkdir -p "$work/folders" && cp -r "$work/imf/tree" "$work/folders/train" && cp -r "$work/imf/tree" "$work/folders/val"
  expect_run "run on image folders" "$work/a" "(5 classes)" "Epoch[1/1], Step[3/3]" -- \
    --data "$work/folders" --image-size 32 --model resnet18 -b 4 -e 1 --threads 2 --workers 2 --log-interval 1 --checkpoint-dir ""
else
  fail "could not write image folders (python3 with PIL: apt-get install python3-pil)"
fi

# 4. Two processes (torchrun-style variables), Gloo + DistributedDataParallel.
# run_two_ranks DIR ARGS...: ranks 0 and 1 of a world of 2 (torchrun-style
# variables, a free loopback port) in DIR, output in DIR/rank0.txt and
# DIR/rank1.txt; ddp_status is the last non-zero exit status, or 0.
run_two_ranks() {
  local dir=$1 port rank job
  shift
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  mkdir -p "$dir"
  for rank in 0 1; do
    (cd "$dir" && RANK=$rank WORLD_SIZE=2 LOCAL_RANK=$rank LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
       timeout 120 "$bin" "$@" >"rank$rank.txt" 2>&1) &
  done
  ddp_status=0
  for job in $(jobs -p); do wait "$job" || ddp_status=$?; done
}
run_two_ranks "$work/ddp" --synthetic --synthetic-size 32 --model resnet18 -b 16 -e 1 --threads 1 --log-interval 1
rank0=$(cat "$work/ddp/rank0.txt")
if [[ $ddp_status -ne 0 ]]; then
  fail "2-process run: exit status $ddp_status: $rank0 / $(cat "$work/ddp/rank1.txt")"
elif [[ "$rank0" != *">>> Training on 2 "* || "$rank0" != *"Step[2/2]"* || ! -f "$work/ddp/checkpoint/2GPU_1epoch.checkpoint" ]]; then
  fail "2-process run: expected 'Training on 2', 2 steps of 8 per rank and checkpoint/2GPU_1epoch.checkpoint: $rank0"
else
  echo "ok   2-process run: $(grep 'Test accuracy' <<<"$rank0")"
fi

# 4b. Elastic resume (issue 49): the one-process step-3 checkpoint of 2b on two
# processes. -b is the global batch (8 per process now), so the step count
# goes on (epoch 1 ends at step 5 of 5) and there is no global-batch note.
if [[ -f "$work/c/checkpoint/1GPU_step3.checkpoint" ]]; then
  run_two_ranks "$work/elastic" "${common[@]}" -e 2 --threads 1 --log-interval 1 \
    --resume "$work/c/checkpoint/1GPU_step3.checkpoint"
  rank0=$(cat "$work/elastic/rank0.txt")
  if [[ $ddp_status -ne 0 ]]; then
    fail "1 -> 2 processes: exit status $ddp_status: $rank0 / $(cat "$work/elastic/rank1.txt")"
  elif [[ "$rank0" != *"Resuming from $work/c/checkpoint/1GPU_step3.checkpoint (written by 1 process) at epoch 1, sample 48, on 2 processes, batch 3 (step 3)"* ||
          "$rank0" == *"note: the global batch"* || "$rank0" != *"Epoch[1/2], Step[5/5]"* || "$rank0" != *"Epoch[2/2], Step[5/5]"* ]]; then
    fail "1 -> 2 processes: expected the resume line, no global-batch note and 5 steps in each epoch: $rank0"
  else
    echo "ok   1 -> 2 processes from the step-3 checkpoint: $(grep 'Test accuracy' <<<"$rank0")"
  fi
else
  fail "2b wrote no checkpoint/1GPU_step3.checkpoint"
fi

# 5. Two processes with --sync-bn on the CIFAR files: SyncBatchNorm under DDP,
# and the 21 test images counted once (ranks test 11 and 10, no padding).
run_two_ranks "$work/syncbn" --data "$work/cifar" --model resnet18 -b 16 -e 1 --max-steps 2 --threads 1 --log-interval 1 \
  --sync-bn --backend gloo
rank0=$(cat "$work/syncbn/rank0.txt")
if [[ $ddp_status -ne 0 ]]; then
  fail "2-process --sync-bn run: exit status $ddp_status: $rank0 / $(cat "$work/syncbn/rank1.txt")"
elif [[ "$rank0" != *"backend gloo, SyncBatchNorm"* || "$rank0" != *"Step[2/2]"* ]]; then
  fail "2-process --sync-bn run: expected 'backend gloo, SyncBatchNorm' and 2 steps: $rank0"
elif [[ "$rank0" != *">>> Test accuracy: "*"/21)"* ]]; then
  fail "2-process --sync-bn run: the accuracy does not count the 21 test images once: $(grep 'Test accuracy' <<<"$rank0")"
else
  echo "ok   2-process --sync-bn run: $(grep 'Test accuracy' <<<"$rank0")"
fi
# The checkpoint of a SyncBatchNorm run has the plain model's names: it resumes without --sync-bn.
if [[ -f "$work/syncbn/checkpoint/2GPU_1epoch.checkpoint" ]]; then
  expect_run "the --sync-bn checkpoint resumes in one plain process" "$work/syncbn" "Resuming from" "/21)" -- \
    --data "$work/cifar" --model resnet18 -b 16 -e 2 --max-steps 1 --threads 2 --checkpoint-dir "" \
    -c "$work/syncbn/checkpoint/2GPU_1epoch.checkpoint"
else
  fail "2-process --sync-bn run wrote no checkpoint/2GPU_1epoch.checkpoint"
fi

# 6. Bad input. expect_error DESCRIPTION EXPECTED_TEXT [VAR=VALUE...] -- ARGS...
expect_error() {
  local what=$1 expected=$2
  shift 2
  local environment=()
  while [[ $1 != "--" ]]; do environment+=("$1"); shift; done
  shift
  pushd "$work" >/dev/null
  expect_one_line_error "$what" "$expected" env "${environment[@]}" "$bin" "$@"
  popd >/dev/null
}
mkdir -p "$work/truncated"
cp -r "$work/cifar/cifar-10-batches-bin" "$work/truncated/"
head -c 5000 "$work/cifar/cifar-10-batches-bin/data_batch_2.bin" >"$work/truncated/cifar-10-batches-bin/data_batch_2.bin"
printf 'not a checkpoint' >"$work/garbage.checkpoint"

expect_error "missing data directory" "cifar-10-binary.tar.gz" -- --data "$work/nowhere"
expect_error "no batches: both layouts named" "cifar-10-batches-py" -- --data "$work"
expect_error "missing data directory names it" "$work/nowhere" -- --data "$work/nowhere"
expect_error "truncated CIFAR-10 file" "data_batch_2.bin" -- --data "$work/truncated"
expect_error "batch size not divisible by the world size" "--batch-size 128 is the global batch and must divide evenly across the 3 processes" \
  RANK=0 WORLD_SIZE=3 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 -- -b 128 --synthetic
# Both apps name the rank in errors when several run (apps/training.h: run_app).
expect_error "an error names the rank" "train_resnet50_cifar: rank 0: --batch-size 128 is the global batch" \
  RANK=0 WORLD_SIZE=3 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 -- -b 128 --synthetic
expect_error "missing checkpoint" "nowhere.checkpoint cannot be opened" -- --synthetic -c "$work/nowhere.checkpoint"
expect_error "corrupt checkpoint" "garbage.checkpoint" -- --synthetic -c "$work/garbage.checkpoint"
expect_error "checkpoint of another model" "does not match the model" -- --data "$work/cifar" --model resnet34 \
  -c "$work/a/checkpoint/1GPU_1epoch.checkpoint"
expect_error "CUDA on a machine without it" "CUDA" -- --device cuda --synthetic
if [[ "$("$bin" --backend nccl --synthetic --synthetic-size 8 -b 4 -e 1 --checkpoint-dir "" 2>&1)" == *"built without CUDA"* ]]; then
  expect_error "--backend nccl in a build without CUDA" 'backend "nccl": loom was built without CUDA' -- --backend nccl --synthetic
else  # without NCCL, without a visible GPU, or (with both) for CPU training
  expect_error "--backend nccl for CPU training" "nccl" -- --backend nccl --device cpu --synthetic
fi
expect_error "unknown backend" "--backend" -- --backend mpi
expect_error "negative warm-up" "--warmup-epochs: must be a number >= 0, got '-1'" -- --warmup-epochs -1
expect_error "unknown model" "--model" -- --model resnet20
expect_error "unknown stem" "--stem" -- --stem tiny
expect_error "non-numeric batch size" "--batch-size" -- -b ten
expect_error "zero batch size" "--batch-size" -- -b 0
expect_error "negative clipping norm" "--clip-grad-norm: must be a number >= 0, got '-0.5'" -- --clip-grad-norm -0.5
expect_error "no batch per step" "--accumulate-steps: must be a whole number >= 1, got '0'" -- --accumulate-steps 0
for flag in --clip-grad-norm --accumulate-steps; do  # the new flags are listed in --help
  "$bin" --help | grep -q -- "$flag" || fail "--help lacks $flag"
done

if [[ $failures -ne 0 ]]; then
  echo "$failures case(s) failed"
  exit 1
fi
echo "all train_resnet50_cifar cases passed"
