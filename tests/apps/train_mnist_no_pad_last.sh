#!/usr/bin/env bash
# train_mnist -g 2 --no-pad-last (issue 50: Join for uneven inputs) on 3001
# training images, a count two processes cannot split evenly: rank 0 trains
# on 1501 (16 batches of 100), rank 1 on 1500 (15). The run ends, rank 0
# prints its 16 steps, and the metrics file's epoch records count every image
# once (3001) where DistributedSampler's default padding counts 3002; also
# with --accumulate-steps 2 (rank 1's data ends inside a step), where --zero
# changes nothing. With one process the flag changes nothing; beside
# --sync-bn it is one usage line.
# Usage: train_mnist_no_pad_last.sh TRAIN_MNIST
set -u
train_mnist=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/dist_common.sh"
make_work_dir 3001 200
args=(--data "$work/data" --batch-size 100 --epochs 2 --log-interval 4 --threads 1 --timeout 60
      --checkpoint-dir '' --progress none)

# train NAME ARGS...: train_mnist with ARGS, its metrics in $work/NAME.jsonl.
train() {
  local name=$1
  shift
  MASTER_PORT=$(free_port) timeout 120 "$train_mnist" "${args[@]}" --metrics "$work/$name.jsonl" "$@" \
    >"$work/$name.out" 2>"$work/$name.err" || { cat "$work/$name.err"; fail "$name: train_mnist $* exited with $?"; }
}
# The images of each epoch record, e.g. "3001 3001".
epoch_images() {
  python3 -c 'import json, sys
print(" ".join(str(r["images"]) for r in map(json.loads, open(sys.argv[1])) if r["type"] == "epoch"))' "$1"
}

train uneven -g 2 --no-pad-last
train uneven_accumulate -g 2 --no-pad-last --accumulate-steps 2
train uneven_zero -g 2 --no-pad-last --accumulate-steps 2 --zero
train padded -g 2
train single --no-pad-last
train single_default

for run in uneven uneven_accumulate padded single; do
  [[ $(grep -c '^Training complete in' "$work/$run.out") == 1 ]] || fail "$run: expected one 'Training complete' line"
  read -r correct total <<<"$(accuracy_counts "$work/$run.out")"
  [[ ${total:-0} == 200 ]] || fail "$run: the test accuracy covers ${total:-no} images, expected all 200"
done
python3 "$here/check_metrics.py" "$work/uneven.jsonl" --world 2 --epochs 2 >/dev/null || fail "--no-pad-last metrics"
[[ $(epoch_images "$work/uneven.jsonl") == "3001 3001" ]] ||
  fail "--no-pad-last: epochs of $(epoch_images "$work/uneven.jsonl") images, expected 3001 each"
[[ $(epoch_images "$work/uneven_accumulate.jsonl") == "3001 3001" ]] ||
  fail "--no-pad-last --accumulate-steps 2: epochs of $(epoch_images "$work/uneven_accumulate.jsonl") images"
[[ $(epoch_images "$work/padded.jsonl") == "3002 3002" ]] ||
  fail "padded: epochs of $(epoch_images "$work/padded.jsonl") images, expected 3002 (one repeated)"
[[ $(epoch_images "$work/single.jsonl") == "3001 3001" ]] || fail "one process: $(epoch_images "$work/single.jsonl")"
grep -q '^Epoch \[2/2\], Step \[16/16\]' "$work/uneven.out" || fail "--no-pad-last: no line for rank 0's step 16"
grep -q '^Epoch \[2/2\], Step \[8/8\]' "$work/uneven_accumulate.out" || fail "--accumulate-steps 2: no step 8 line"
# ZeRO: the joined rank's step (the Trainer's ShadowStep) runs the sharded step with the others.
diff <(result_lines "$work/uneven_accumulate.out") <(result_lines "$work/uneven_zero.out") ||
  fail "--no-pad-last --zero trains otherwise than without --zero"
diff <(result_lines "$work/single.out") <(result_lines "$work/single_default.out") ||
  fail "with one process --no-pad-last changed the run"
echo "ok   -g 2 --no-pad-last: 3001 images an epoch (padded: 3002); one process: no change"

failures=0
expect_one_line_error "--no-pad-last with --sync-bn" "drop --sync-bn or --no-pad-last" \
  "$train_mnist" -g 2 --no-pad-last --sync-bn --data "$work/data"
((failures == 0)) || exit 1
