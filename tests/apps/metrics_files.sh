#!/usr/bin/env bash
# --metrics and --tensorboard on real runs of train_mnist: one process for two
# epochs, two processes under loomrun (DDP's communication fields), and
# --amp O2 (the loss scale). Every metrics record is checked against
# docs/metrics.md by check_metrics.py; the event files are read back by
# read_tfevents.py (framing, CRCs and protobuf parsed by hand), and by
# TensorBoard's own EventAccumulator where the tensorboard package imports
# (python3, or the python $LOOM_TENSORBOARD_PYTHON names). Bad paths fail with
# one line naming the flag.
# Usage: metrics_files.sh TRAIN_MNIST LOOMRUN
set -u
train_mnist=$1
loomrun=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/dist_common.sh"
make_work_dir 400 100
args=(--data "$work/data" --batch-size 50 --log-interval 2 --threads 1 --checkpoint-dir '' --progress none)

# 1. One process, two epochs of 8 steps.
timeout 120 "$train_mnist" "${args[@]}" --epochs 2 --metrics "$work/one.jsonl" --tensorboard "$work/tb-one" \
  >"$work/one.out" 2>&1 || { cat "$work/one.out"; fail "train_mnist --metrics --tensorboard failed"; }
python3 "$here/check_metrics.py" "$work/one.jsonl" --world 1 --steps-between 2 --epochs 2 || fail "world 1 metrics"
[[ $(grep -c '"type": "step"' "$work/one.jsonl") == 8 ]] || fail "expected 8 step records (2 epochs x 8 steps / 2)"
# The last epoch record's accuracy is the one train_mnist prints.
printed=$(sed -n 's/^Test accuracy: \([0-9.]*\) .*/\1/p' "$work/one.out")
python3 - "$work/one.jsonl" "$printed" <<'PY' || fail "the metrics file's final accuracy differs from the printed one"
import json, sys
epochs = [json.loads(l) for l in open(sys.argv[1]) if '"epoch"' in l and json.loads(l)["type"] == "epoch"]
assert abs(epochs[-1]["test_accuracy"] - float(sys.argv[2])) < 5e-5, (epochs[-1], sys.argv[2])
assert epochs[0]["test_accuracy"] is not None, "epoch 1 was not evaluated"
PY
events=("$work"/tb-one/events.out.tfevents.*)
[[ -f "${events[0]}" ]] || fail "no event file in --tensorboard $work/tb-one"
python3 "$here/read_tfevents.py" --expect train/loss --expect train/images_per_s --expect epoch/test_accuracy \
  "${events[@]}" >"$work/scalars.txt" || fail "the event file does not read back"
# The event file holds the metrics file's numbers (as 32-bit floats).
python3 - "$work/one.jsonl" "$work/scalars.txt" <<'PY' || fail "TensorBoard scalars differ from the metrics records"
import json, struct, sys
records = [json.loads(l) for l in open(sys.argv[1])]
scalars = {}
for line in open(sys.argv[2]):
    tag, step, value = line.split()
    scalars[(tag, int(step))] = float(value)
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
checked = 0
for r in records:
    prefix = {"step": "train/", "epoch": "epoch/"}.get(r["type"])
    if prefix is None:
        continue
    for field in ("loss", "lr", "images_per_s", "test_accuracy"):
        if r.get(field) is not None:
            assert scalars[(prefix + field, r["step"])] == f32(r[field]), (field, r)
            checked += 1
assert checked >= 30, checked
print(f"ok   {checked} TensorBoard scalars equal the metrics records")
PY
echo "ok   world 1: $(python3 "$here/check_metrics.py" "$work/one.jsonl" --world 1)"

tensorboard_python=""
for python in python3 ${LOOM_TENSORBOARD_PYTHON:-}; do
  if "$python" -c 'import tensorboard.backend.event_processing.event_accumulator' 2>/dev/null; then
    tensorboard_python=$python; break
  fi
done
if [[ -n "$tensorboard_python" ]]; then
  "$tensorboard_python" - "$work/tb-one" <<'PY' || fail "TensorBoard's EventAccumulator cannot read the event file"
import sys
from tensorboard.backend.event_processing import event_accumulator
accumulator = event_accumulator.EventAccumulator(sys.argv[1])
accumulator.Reload()
tags = accumulator.Tags()["scalars"]
assert "train/loss" in tags and "epoch/test_accuracy" in tags, tags
loss = accumulator.Scalars("train/loss")
assert [e.step for e in loss] == [2, 4, 6, 8, 10, 12, 14, 16], [e.step for e in loss]
assert len(accumulator.Scalars("epoch/test_accuracy")) == 2
print(f"ok   TensorBoard's EventAccumulator reads {len(tags)} scalar tags, train/loss at steps {[e.step for e in loss]}")
PY
else
  echo "note: the tensorboard package is not importable here; the event file was checked by read_tfevents.py only"
fi

# 2. Two processes under loomrun: the communication fields.
timeout 120 "$loomrun" --nproc_per_node=2 --standalone "$train_mnist" "${args[@]}" --epochs 1 --max-steps 4 \
  --metrics "$work/two.jsonl" --tensorboard "$work/tb-two" >"$work/two.out" 2>&1 ||
  { cat "$work/two.out"; fail "loomrun train_mnist --metrics failed"; }
python3 "$here/check_metrics.py" "$work/two.jsonl" --world 2 --epochs 1 || fail "world 2 metrics"
[[ $(ls "$work/tb-two" | wc -l) == 1 ]] || fail "rank 1 wrote an event file too: $(ls "$work/tb-two")"
echo "ok   world 2: $(python3 "$here/check_metrics.py" "$work/two.jsonl" --world 2)"

# 3. --amp O2: the loss scale and skipped steps.
if timeout 120 "$train_mnist" "${args[@]}" --epochs 1 --max-steps 4 --amp O2 --metrics "$work/amp.jsonl" \
     >"$work/amp.out" 2>&1; then
  python3 "$here/check_metrics.py" "$work/amp.jsonl" --world 1 --amp-scaler --epochs 1 || fail "--amp O2 metrics"
  echo "ok   --amp O2: loss_scale and skipped_steps in every record"
else
  cat "$work/amp.out"; fail "train_mnist --amp O2 --metrics failed"
fi

# 4. A resumed run appends: the earlier records stay.
lines_before=$(wc -l <"$work/one.jsonl")
timeout 120 "$train_mnist" "${args[@]}" --epochs 1 --max-steps 2 --metrics "$work/one.jsonl" >/dev/null 2>&1 ||
  fail "a second run onto the same --metrics file failed"
(( $(wc -l <"$work/one.jsonl") > lines_before )) && [[ $(grep -c '"type": "header"' "$work/one.jsonl") == 2 ]] ||
  fail "the second run did not append its header and records"
echo "ok   a second run appends to the metrics file"

# 5. Bad paths (under a file, so no directory can be made): one line naming the flag, before training.
touch "$work/a-file"
err=$(timeout 60 "$train_mnist" "${args[@]}" --epochs 1 --metrics "$work/a-file/m.jsonl" 2>&1 >/dev/null)
[[ $? -ne 0 && $(grep -c . <<<"$err") == 1 && "$err" == *"--metrics $work/a-file/m.jsonl"* ]] ||
  fail "--metrics under a file: $err"
err=$(timeout 60 "$train_mnist" "${args[@]}" --epochs 1 --tensorboard "$work/a-file/tb" 2>&1 >/dev/null)
[[ $? -ne 0 && $(grep -c . <<<"$err") == 1 && "$err" == *"--tensorboard $work/a-file/tb"* ]] ||
  fail "--tensorboard under a file: $err"
echo "ok   bad --metrics / --tensorboard paths: one line naming the flag"
