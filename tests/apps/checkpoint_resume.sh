#!/usr/bin/env bash
# Exact resume of train_mnist on the CPU: a run stopped in the middle of an
# epoch and resumed with --resume auto ends bit-identical to an uninterrupted
# one (every later step checkpoint and the final --save model compared byte
# for byte, the loss lines compared too), at world 1, at world 2 (loomrun) and at
# world 1 with --amp O2 (f32 master weights and the loss scale).
# Then SIGTERM to one rank of two (srun-style processes) in the middle of an
# epoch: both ranks stop after the same step, rank 0 writes one checkpoint,
# both exit 143, and the resumed run matches an uninterrupted one.
# Usage: checkpoint_resume.sh TRAIN_MNIST LOOMRUN
set -u
train_mnist=$1
loomrun=$2
source "$(dirname "$0")/dist_common.sh"
make_work_dir 640 100
common=(--data "$work/data" --epochs 3 --log-interval 1 --threads 1 --timeout 60 --checkpoint-every 7)

# loss lines of `log` after global step `after` (20 steps per epoch)
losses_after() {
  awk -v after="$2" -F'[][/]' '/^Epoch \[/ { if (($2 - 1) * 20 + $5 > after) print }' "$1"
}

# run WORLD NAME ARGS...: train_mnist at world 1, or under loomrun at world 2.
run() {
  local world=$1 name=$2
  shift 2
  if [[ $world == 1 ]]; then
    timeout 120 "$train_mnist" --batch-size 32 "${common[@]}" "$@" >"$work/$name.out" 2>"$work/$name.err"
  else
    timeout 120 "$loomrun" --nproc_per_node=2 --master_port="$(free_port)" "$train_mnist" --batch-size 16 \
      "${common[@]}" "$@" >"$work/$name.out" 2>"$work/$name.err"
  fi
  local status=$?
  ((status == 0)) || { cat "$work/$name.err"; fail "$name exited with $status"; }
}

# World 1, world 2, and world 1 with mixed precision (--amp O2: f32 masters and the loss scale resume too).
for config in 1 2 1-O2; do
  world=${config%%-*}
  amp=()
  [[ $config == *-O2 ]] && amp=(--amp O2)
  a=$work/w$config-full b=$work/w$config-resumed
  run $world w$config-full "${amp[@]}" --checkpoint-dir "$a" --keep-checkpoints 0 --save "$a.safetensors"
  run $world w$config-first "${amp[@]}" --checkpoint-dir "$b" --max-steps 27
  [[ -f $b/${world}GPU_step21.checkpoint && ! -e $b/${world}GPU_step28.checkpoint ]] || fail "$config: expected step 21 as the newest checkpoint: $(ls "$b")"
  [[ -f $b/${world}GPU_1epoch.checkpoint ]] || fail "$config: no epoch checkpoint with the tutorial's name: $(ls "$b")"
  run $world w$config-second "${amp[@]}" --checkpoint-dir "$b" --resume auto --save "$b.safetensors"
  grep -q "^Resuming from $b/${world}GPU_step21.checkpoint (written by $world process[es]*) at epoch 2, sample 32, on $world process[es]*, batch 1 (step 21)" "$work/w$config-second.out" ||
    fail "$config: no 'Resuming from ... step 21' line: $(head -5 "$work/w$config-second.out")"
  diff <(losses_after "$work/w$config-full.out" 21) <(grep '^Epoch \[' "$work/w$config-second.out") ||
    fail "$config: the loss lines after the resume differ from the uninterrupted run's"
  [[ $(grep -c '^Epoch \[' "$work/w$config-second.out") == 39 ]] || fail "$config: expected 39 steps after the resume"
  cmp "$a.safetensors" "$b.safetensors" || fail "$config: the final models differ"
  for file in ${world}GPU_step49.checkpoint ${world}GPU_step56.checkpoint ${world}GPU_2epoch.checkpoint ${world}GPU_3epoch.checkpoint; do
    cmp "$a/$file" "$b/$file" || fail "$config: $file differs from the uninterrupted run's"
  done
  # --keep-checkpoints 3 (the default) kept the three newest step checkpoints, and every epoch checkpoint.
  [[ $(cd "$b" && ls ${world}GPU_step*.checkpoint | sort -V | tr '\n' ' ') == "${world}GPU_step42.checkpoint ${world}GPU_step49.checkpoint ${world}GPU_step56.checkpoint " ]] ||
    fail "$config: rotation kept $(ls "$b")"
  echo "ok: $config (world $world ${amp[*]}) resumed mid-epoch from step 21 and ended bit-identical"
done

# ---- SIGTERM to one of two ranks in the middle of an epoch ----
make_mnist_subset "$work/big" 8000 100
sig=(--data "$work/big" --epochs 1 --batch-size 8 --log-interval 1 --threads 1 --timeout 60)
# srun_pair NAME ARGS...: two ranks with srun's variables, in the background (pids in pid0 / pid1).
srun_pair() {
  local name=$1 port
  shift
  port=$(free_port)
  for rank in 0 1; do
    env -u MASTER_ADDR -u RANK -u WORLD_SIZE SLURM_STEP_ID=0 SLURM_PROCID=$rank SLURM_NTASKS=2 SLURM_LOCALID=$rank SLURM_NODEID=0 \
      SLURM_SRUN_COMM_HOST=127.0.0.1 MASTER_PORT=$port \
      timeout 120 "$train_mnist" "${sig[@]}" "$@" >"$work/$name.$rank.out" 2>"$work/$name.$rank.err" &
    eval "pid$rank=\$!"
  done
}
srun_pair term --checkpoint-dir "$work/term"
wait_until 20 has_lines 30 '^Epoch \[' "$work/term.0.out"
kill -TERM "$pid1"
wait "$pid0"; status0=$?
wait "$pid1"; status1=$?
[[ $status0 == 143 && $status1 == 143 ]] || { cat "$work"/term.*.err; fail "after SIGTERM the ranks exited with $status0 and $status1, expected 143 (128 + SIGTERM)"; }
step=$(sed -n 's/^Preempted by SIGTERM after step \([0-9]*\): checkpoint .* written; resume with --resume auto (exit code 143)$/\1/p' "$work/term.0.out")
[[ -n $step ]] || fail "rank 0 printed no 'Preempted by SIGTERM' line: $(tail -3 "$work/term.0.out")"
grep -q "^rank 1: stopped by SIGTERM after step $step\$" "$work/term.1.err" || fail "rank 1 did not stop after step $step: $(cat "$work/term.1.err")"
((step > 30 && step < 500)) || fail "stopped after step $step, not in the middle of the 500-step epoch"
[[ $(ls "$work/term") == "2GPU_step$step.checkpoint" ]] || fail "expected exactly one checkpoint, 2GPU_step$step.checkpoint: $(ls -a "$work/term")"
echo "ok: SIGTERM to rank 1: both ranks stopped after step $step, one checkpoint"

end=$((step + 20))
srun_pair resumed --checkpoint-dir "$work/term" --resume auto --max-steps $end --save "$work/term.safetensors"
wait "$pid0" && wait "$pid1" || { cat "$work"/resumed.*.err; fail "the resumed run failed"; }
srun_pair reference --checkpoint-dir '' --max-steps $end --save "$work/reference.safetensors"
wait "$pid0" && wait "$pid1" || { cat "$work"/reference.*.err; fail "the uninterrupted run failed"; }
grep -q "^Resuming from $work/term/2GPU_step$step.checkpoint (written by 2 processes) at epoch 1, sample $((16 * step)), on 2 processes, batch $step (step $step)" "$work/resumed.0.out" ||
  fail "no 'Resuming from' line: $(head -5 "$work/resumed.0.out")"
diff <(grep '^Epoch \[' "$work/reference.0.out" | tail -n 20) <(grep '^Epoch \[' "$work/resumed.0.out") ||
  fail "the resumed run's loss lines differ from the uninterrupted run's"
cmp "$work/term.safetensors" "$work/reference.safetensors" || fail "the resumed run's model differs from the uninterrupted run's"
echo "ok: resumed after SIGTERM and ended bit-identical to an uninterrupted run at step $end"
