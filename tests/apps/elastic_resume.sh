#!/usr/bin/env bash
# Elastic resume of train_mnist (issue 49): a run of 2 processes under loomrun
# stopped mid-epoch resumes with --resume auto on 1 process, which is stopped
# and resumed on 3. Each resume names the world it came from and the sample
# it continues at, and notes the new global batch (--batch-size is per
# process); every epoch's steps add up to the epoch's samples. Then bad
# input, one line each and no checkpoint touched: a checkpoint of a newer
# format, and one of another model.
# Usage: elastic_resume.sh TRAIN_MNIST LOOMRUN
set -u
train_mnist=$1
loomrun=$2
source "$(dirname "$0")/dist_common.sh"
make_work_dir 240 60
dir=$work/checkpoints
common=(--data "$work/data" --epochs 2 --batch-size 10 --log-interval 1 --threads 1 --timeout 60
        --checkpoint-dir "$dir" --checkpoint-every 1 --keep-checkpoints 0)

# run WORLD NAME ARGS...: train_mnist alone at world 1, else under loomrun.
run() {
  local world=$1 name=$2
  shift 2
  if [[ $world == 1 ]]; then
    timeout 120 "$train_mnist" "${common[@]}" "$@" >"$work/$name.out" 2>"$work/$name.err"
  else
    timeout 120 "$loomrun" --nproc_per_node="$world" --master_port="$(free_port)" "$train_mnist" \
      "${common[@]}" "$@" >"$work/$name.out" 2>"$work/$name.err"
  fi
  local status=$?
  ((status == 0)) || { cat "$work/$name.err"; fail "$name exited with $status"; }
}

# 240 images: 12 steps of 2 x 10 in an epoch at world 2; 3 of them, then 6 of
# 1 x 10 at world 1 (samples 60 -> 120), then the other 120 at world 3 (4 steps of 3 x 10).
run 2 first --max-steps 3
run 1 second --resume auto --max-steps 9
grep -q "^Resuming from $dir/2GPU_step3.checkpoint (written by 2 processes) at epoch 1, sample 60, on 1 process, batch 3 (step 3)$" "$work/second.out" ||
  fail "world 1: no 'Resuming from ... (written by 2 processes)' line: $(head -5 "$work/second.out")"
grep -q "^note: the global batch is now 10 (1 x 10 per process); the checkpoint's run had 20 over 2; the learning rate is kept as given$" "$work/second.out" ||
  fail "world 1: no note of the new global batch: $(head -5 "$work/second.out")"
run 3 third --resume auto
grep -q "^Resuming from $dir/1GPU_step9.checkpoint (written by 1 process) at epoch 1, sample 120, on 3 processes, batch 9 (step 9)$" "$work/third.out" ||
  fail "world 3: no 'Resuming from ... (written by 1 process)' line: $(head -5 "$work/third.out")"
# Epoch 1 ends after 9 + 4 steps at world 3 (the last loss line of the epoch), epoch 2 has 240 / 30 = 8.
grep -q '^Epoch \[1/2\], Step \[13/13\], Loss: ' "$work/third.out" || fail "world 3: epoch 1 did not end at step 13: $(grep '^Epoch' "$work/third.out" | head -5)"
grep -q '^Epoch \[2/2\], Step \[8/8\], Loss: ' "$work/third.out" || fail "world 3: epoch 2 did not have 8 steps"
[[ -f $dir/3GPU_2epoch.checkpoint ]] || fail "no 3GPU_2epoch.checkpoint: $(ls "$dir")"
echo "ok: train_mnist 2 -> 1 -> 3 processes, each resume from the other world's newest checkpoint"

# expect_error DESCRIPTION EXPECTED_TEXT ARGS...: train_mnist ARGS fails with one line
# (expect_one_line_error, dist_common.sh) and changes no checkpoint.
failures=0
checkpoints_state() { (cd "$dir" && ls -la --time-style=full-iso && md5sum ./*); }
expect_error() {
  local before
  before=$(checkpoints_state)
  expect_one_line_error "$1" "$2" "$train_mnist" "${common[@]}" "${@:3}"
  [[ $before == "$(checkpoints_state)" ]] || fail "$1: the checkpoint directory changed"
}

# A checkpoint of a newer format: the header's version raised (the data and its CRC untouched).
python3 - "$dir/3GPU_2epoch.checkpoint" "$work/newer.checkpoint" <<'PY'
import json, struct, sys
data = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
header["__metadata__"]["__training__.format_version"] = "99"
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])
PY
expect_error "a checkpoint of a newer format" \
  "checkpoint $work/newer.checkpoint has format version 99, newer than this loom reads (2)" --resume "$work/newer.checkpoint"
cp "$work/newer.checkpoint" "$dir/4GPU_step99.checkpoint"
expect_error "--resume auto meets a checkpoint of a newer format" \
  "checkpoint $dir/4GPU_step99.checkpoint has format version 99" --resume auto
rm "$dir/4GPU_step99.checkpoint"
expect_error "a checkpoint of another model" \
  "checkpoint $dir/3GPU_2epoch.checkpoint does not match the model:" --resume "$dir/3GPU_2epoch.checkpoint" --model resnet18
# ResNet-18's checkpoint into a ResNet-50: the first tensor of another shape comes first, with both shapes.
timeout 120 "$train_mnist" --data "$work/data" --model resnet18 --epochs 1 --batch-size 4 --max-steps 1 --threads 1 \
  --checkpoint-dir "$work/resnet18" --checkpoint-every 1 >"$work/resnet18.out" 2>&1 || fail "resnet18 run: $(cat "$work/resnet18.out")"
expect_error "a ResNet-18 checkpoint for a ResNet-50" \
  "$work/resnet18/1GPU_step1.checkpoint does not match the model: 'layer1.0.conv1.weight' has shape [64, 64, 3, 3], the model expects [64, 64, 1, 1]" \
  --resume "$work/resnet18/1GPU_step1.checkpoint" --model resnet50
((failures == 0)) || fail "$failures bad-input case(s) failed"
echo "ok: elastic resume"
