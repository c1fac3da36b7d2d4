#!/usr/bin/env bash
# Checkpoint writes that fail, and checkpoints that are damaged, as a user of
# train_mnist meets them: a file size limit (ulimit -f), a full disk (a small
# tmpfs) and a read-only directory (the tmpfs remounted ro) give one error
# naming the file and the cause and leave the previous checkpoint intact and
# loadable (--on-checkpoint-error continue trains on); a process killed with
# SIGKILL in the middle of a write (a test hook pauses the writer) leaves the
# previous checkpoint usable and its temporary file is cleared on the next
# start; a first SIGINT starts the stop with a checkpoint and a second one
# ends the process at once; --resume auto skips a truncated or corrupt newest checkpoint, says
# so, and takes the previous one. The tmpfs parts need root (mount); without
# it they are skipped and the rest still runs.
# Usage: checkpoint_failures.sh TRAIN_MNIST
set -u
train_mnist=$1
source "$(dirname "$0")/dist_common.sh"
make_work_dir 640 100
mounted=""
on_exit '[[ -n $mounted ]] && umount "$mounted"'
options=(--batch-size 32 --threads 1 --workers 0 --log-interval 100)
common=(--data "$work/data" "${options[@]}")
dir=$work/ckpt

# train NAME ARGS...: the exit status in $status, output in $work/NAME.{out,err}.
train() {
  local name=$1
  shift
  timeout 60 "$train_mnist" "${common[@]}" --epochs 1 --checkpoint-every 5 "$@" >"$work/$name.out" 2>"$work/$name.err"
  status=$?
}
# intact DIR: the step-5 checkpoint is as written, loads and trains on; no temporary files.
intact() {
  [[ $(md5sum <"$1/1GPU_step5.checkpoint") == "$base_sum" ]] || fail "the previous checkpoint $1/1GPU_step5.checkpoint changed"
  [[ -z $(find "$1" -name '.*.tmp-*') ]] || fail "temporary files left in $1: $(ls -a "$1")"
  train check --resume "$1/1GPU_step5.checkpoint" --max-steps 6 --checkpoint-dir ''
  [[ $status == 0 ]] || fail "the previous checkpoint does not load: $(cat "$work/check.err")"
}

train base --max-steps 5 --checkpoint-dir "$dir"
[[ $status == 0 && -f $dir/1GPU_step5.checkpoint ]] || fail "the first run wrote no step-5 checkpoint: $(cat "$work/base.err")"
base_sum=$(md5sum <"$dir/1GPU_step5.checkpoint")

# ---- a file size limit: write() fails with EFBIG ----
(ulimit -f 64 && train limit --resume auto --max-steps 10 --checkpoint-dir "$dir" && exit $status)
status=$?
[[ $status == 1 ]] || fail "under ulimit -f 64 the run exited with $status, expected 1"
grep -q "checkpoint $dir/1GPU_step10.checkpoint: writing .* failed .*(the file size limit, ulimit -f, is reached); the previous checkpoint, if any, is unchanged" "$work/limit.err" ||
  fail "no clear error for the file size limit: $(cat "$work/limit.err")"
intact "$dir"
(ulimit -f 64 && train limit_continue --resume auto --max-steps 10 --checkpoint-dir "$dir" --on-checkpoint-error continue && exit $status)
status=$?
[[ $status == 0 ]] || fail "--on-checkpoint-error continue: exited with $status: $(cat "$work/limit_continue.err")"
grep -q "^warning: checkpoint $dir/1GPU_step10.checkpoint: .*training continues without this checkpoint" "$work/limit_continue.err" ||
  fail "--on-checkpoint-error continue: no warning: $(cat "$work/limit_continue.err")"
grep -q '^Training complete' "$work/limit_continue.out" || fail "--on-checkpoint-error continue did not finish training"
intact "$dir"
echo "ok: file size limit"

# ---- a full disk and a read-only directory (tmpfs; needs mount) ----
if mkdir -p "$work/mnt" && mount -t tmpfs -o size=400k tmpfs "$work/mnt" 2>/dev/null; then
  mounted=$work/mnt
  cp "$dir/1GPU_step5.checkpoint" "$mounted/"
  train full --resume auto --max-steps 10 --checkpoint-dir "$mounted"
  [[ $status == 1 ]] || fail "on a full disk the run exited with $status, expected 1"
  grep -q "checkpoint $mounted/1GPU_step10.checkpoint: .*No space left on device (the disk is full)" "$work/full.err" ||
    fail "no clear error for the full disk: $(cat "$work/full.err")"
  intact "$mounted"
  mount -o remount,ro "$mounted" || fail "remounting the tmpfs read-only failed"
  train readonly --resume auto --max-steps 10 --checkpoint-dir "$mounted"
  [[ $status == 1 ]] || fail "in a read-only directory the run exited with $status, expected 1"
  grep -q "checkpoint $mounted/1GPU_step10.checkpoint: cannot create a temporary file in $mounted: Read-only file system" "$work/readonly.err" ||
    fail "no clear error for the read-only directory: $(cat "$work/readonly.err")"
  intact "$mounted"
  echo "ok: full disk and read-only directory"
else
  echo "SKIP (part): cannot mount a tmpfs here (not root?): full-disk and read-only checks not run"
fi

# ---- SIGKILL in the middle of a write ----
LOOM_CHECKPOINT_TEST_PAUSE_AT_BYTE=50000 "$train_mnist" "${common[@]}" --epochs 1 --checkpoint-every 5 --resume auto --max-steps 10 \
  --checkpoint-dir "$dir" >"$work/killed.out" 2>"$work/killed.err" &
pid=$!
wait_until 10 grep -q 'checkpoint writer paused' "$work/killed.err"
grep -q 'checkpoint writer paused (test hook) after 50000 bytes' "$work/killed.err" ||
  { kill -KILL "$pid"; fail "the writer never paused: $(cat "$work/killed.err")"; }
kill -KILL "$pid"
wait "$pid" 2>/dev/null
partial=$(find "$dir" -name '.1GPU_step10.checkpoint.tmp-*')
[[ -n $partial && $(stat -c %s "$partial") == 50000 && ! -e $dir/1GPU_step10.checkpoint ]] ||
  fail "expected a 50000-byte temporary file and no step-10 checkpoint: $(ls -la "$dir")"
train after_kill --resume auto --max-steps 10 --checkpoint-dir "$dir"
[[ $status == 0 ]] || fail "the run after the kill failed: $(cat "$work/after_kill.err")"
grep -q "^Removed $partial, left by a checkpoint write that was interrupted" "$work/after_kill.out" ||
  fail "the temporary file was not reported removed: $(head -5 "$work/after_kill.out")"
grep -q "^Resuming from $dir/1GPU_step5.checkpoint (written by 1 process) at epoch 1, sample [0-9]*, on 1 process, batch 5 (step 5)" "$work/after_kill.out" || fail "did not resume from step 5"
[[ -z $(find "$dir" -name '.*.tmp-*') && -f $dir/1GPU_step10.checkpoint ]] || fail "after the kill: $(ls -a "$dir")"
echo "ok: SIGKILL during a write"

# ---- Ctrl-C twice: the first starts the stop with a checkpoint, the second ends the process at once ----
make_mnist_subset "$work/big" 6000 100  # 188 steps in the first epoch: no epoch checkpoint before the SIGINT
LOOM_CHECKPOINT_TEST_PAUSE_AT_BYTE=50000 "$train_mnist" "${options[@]}" --data "$work/big" --epochs 1 --checkpoint-dir "$work/interrupted" \
  >"$work/interrupted.out" 2>"$work/interrupted.err" &
pid=$!
wait_until 10 has_lines 1 '^Training on' "$work/interrupted.out"
kill -INT "$pid"
wait_until 10 grep -q 'checkpoint writer paused' "$work/interrupted.err"
grep -q 'checkpoint writer paused .* of .*/\.1GPU_step[0-9]*\.checkpoint\.tmp-' "$work/interrupted.err" ||
  { kill -KILL "$pid"; fail "the first SIGINT did not start a step checkpoint write: $(cat "$work/interrupted.err")"; }
kill -INT "$pid"
wait "$pid"
status=$?
[[ $status == 130 ]] || { kill -KILL "$pid" 2>/dev/null; fail "the second SIGINT: exit status $status, expected 130 (killed by SIGINT)"; }
! grep -q '^Preempted' "$work/interrupted.out" || fail "the second SIGINT let the process finish its checkpoint"
echo "ok: the first SIGINT stops with a checkpoint, the second ends the process at once"

# ---- --resume auto with a truncated, then a corrupt, newest checkpoint ----
for damage in truncated corrupt; do
  cp "$dir/1GPU_step10.checkpoint" "$work/good10"
  if [[ $damage == truncated ]]; then
    truncate -s 100000 "$dir/1GPU_step10.checkpoint"
  else
    python3 -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(150000); b = f.read(1)[0]; f.seek(150000); f.write(bytes([b ^ 0xff]))' \
      "$dir/1GPU_step10.checkpoint"
  fi
  train fallback_$damage --resume auto --max-steps 12 --checkpoint-dir "$dir"
  [[ $status == 0 ]] || fail "$damage: --resume auto failed: $(cat "$work/fallback_$damage.err")"
  grep -q "^Skipping checkpoint $dir/1GPU_step10.checkpoint, it is truncated or corrupt: .*; trying the previous one" "$work/fallback_$damage.out" ||
    fail "$damage: the damaged checkpoint was not reported: $(head -5 "$work/fallback_$damage.out")"
  grep -q "^Resuming from $dir/1GPU_step5.checkpoint (written by 1 process) at epoch 1, sample [0-9]*, on 1 process, batch 5 (step 5)" "$work/fallback_$damage.out" || fail "$damage: did not fall back to step 5"
  cp "$work/good10" "$dir/1GPU_step10.checkpoint"
done
grep -q "CRC-32" "$work/fallback_corrupt.out" || fail "the corrupt checkpoint's report does not name the checksum"
truncate -s 100000 "$dir/1GPU_step10.checkpoint"
train explicit --resume "$dir/1GPU_step10.checkpoint" --max-steps 12 --checkpoint-dir ''
[[ $status == 1 ]] && grep -q "checkpoint $dir/1GPU_step10.checkpoint: .*truncated or corrupt" "$work/explicit.err" ||
  fail "--resume of a truncated file: status $status: $(cat "$work/explicit.err")"
echo "ok: damaged newest checkpoints are skipped, named, and the previous one is used"
