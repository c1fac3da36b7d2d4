#!/usr/bin/env bash
# Chaos test: train_mnist's ConvNet at world 2 under loomrun --max_restarts 3,
# a checkpoint every 20 steps, and a rank SIGKILLed at three random steps
# (seeded: LOOM_CHAOS_SEED, printed). Each time loomrun restarts both ranks,
# they resume by themselves (--resume auto after a restart) and loomrun says
# from which step. The final model is bit-identical to an uninterrupted run's,
# and no failure costs more than 20 steps of work (counted from the log: the
# last step logged before the failure minus the step resumed from).
# Usage: chaos_restart.sh TRAIN_MNIST LOOMRUN
set -u
train_mnist=$1
loomrun=$2
source "$(dirname "$0")/dist_common.sh"
make_work_dir 1600 100
on_exit 'kill -KILL "${launcher:-}" 2>/dev/null'
steps=300 per_epoch=50  # 1600 images, 16 per rank and step
common=(--data "$work/data" --epochs 6 --batch-size 16 --log-interval 1 --threads 1 --timeout 30 --max-steps $steps)

seed=${LOOM_CHAOS_SEED:-$(date +%s)}
RANDOM=$seed
# One kill in each third of the run, far enough from the next for the restart.
targets=($((30 + RANDOM % 60)) $((120 + RANDOM % 60)) $((210 + RANDOM % 60)))
ranks=($((RANDOM % 2)) $((RANDOM % 2)) $((RANDOM % 2)))
echo "chaos seed $seed: SIGKILL rank ${ranks[0]} at step ${targets[0]}, rank ${ranks[1]} at step ${targets[1]}, rank ${ranks[2]} at step ${targets[2]}"

# The uninterrupted run.
timeout 120 "$loomrun" --nproc_per_node=2 --master_port="$(free_port)" "$train_mnist" "${common[@]}" \
  --checkpoint-dir "$work/reference" --save "$work/reference.safetensors" >"$work/reference.out" 2>"$work/reference.err" ||
  { cat "$work/reference.err"; fail "the uninterrupted run exited with $?"; }

# The global step of the last loss line in a log, 0 before the first.
last_step() {
  awk -F'[][/]' -v n=$per_epoch '/^Epoch \[/ { s = ($2 - 1) * n + $5 } END { print s + 0 }' "$1"
}
# The pid of the process with RANK=$1 among the launcher's children.
pid_of_rank() {
  for child in $(pgrep -P "$launcher"); do
    tr '\0' '\n' <"/proc/$child/environ" 2>/dev/null | grep -qx "RANK=$1" && { echo "$child"; return; }
  done
}

: >"$work/chaos.out"
port=$(free_port)
"$loomrun" --nproc_per_node=2 --master_port="$port" --max_restarts=3 --term_grace=2 "$train_mnist" "${common[@]}" \
  --checkpoint-dir "$work/chaos" --checkpoint-every 20 --save "$work/chaos.safetensors" >"$work/chaos.out" 2>"$work/chaos.err" &
launcher=$!
deadline=$((SECONDS + 150))
for k in 0 1 2; do
  while (($(last_step "$work/chaos.out") < targets[k])); do
    kill -0 "$launcher" 2>/dev/null || { cat "$work/chaos.err"; fail "loomrun ended before step ${targets[k]}"; }
    ((SECONDS < deadline)) || fail "timed out waiting for step ${targets[k]}"
    sleep 0.01
  done
  pid=$(pid_of_rank "${ranks[k]}")
  [[ -n $pid ]] || fail "rank ${ranks[k]} not found among loomrun's children"
  kill -KILL "$pid"
  echo "killed rank ${ranks[k]} (pid $pid) at step $(last_step "$work/chaos.out")"
  while (($(grep -c '^Resuming from' "$work/chaos.out") <= k)); do
    kill -0 "$launcher" 2>/dev/null || { cat "$work/chaos.err"; fail "loomrun ended instead of restarting after failure $((k + 1))"; }
    ((SECONDS < deadline)) || fail "timed out waiting for restart $((k + 1))"
    sleep 0.01
  done
done
wait "$launcher"
status=$?
launcher=""
[[ $status == 0 ]] || { cat "$work/chaos.err"; fail "loomrun exited with $status"; }

# Work lost per failure: the last step logged before each "Resuming from" line minus the step resumed from.
awk -F'[][/]' -v n=$per_epoch '
  /^Epoch \[/ { last = ($2 - 1) * n + $5 }
  /^Resuming from/ { match($0, /\(step [0-9]+\)/); resumed = substr($0, RSTART + 6, RLENGTH - 7)
                     printf "failure %d: last logged step %d, resumed from step %d: %d steps lost\n", ++k, last, resumed, last - resumed }
' "$work/chaos.out" | tee "$work/lost"
[[ $(wc -l <"$work/lost") == 3 ]] || fail "expected 3 resumes"
awk '{ if ($NF != "lost" || $(NF - 2) > 20 || $(NF - 2) < 0) bad = 1 } END { exit bad }' "$work/lost" || fail "a failure cost more than 20 steps"
grep -E '^loomrun: (restarting|restart [0-9]:)' "$work/chaos.err"
[[ $(grep -c '^loomrun: restarting the 2 local processes (restart [123] of 3) after rank [01] (local rank [01], pid [0-9]*) was killed by signal 9 (SIGKILL)$' "$work/chaos.err") == 3 ]] ||
  fail "loomrun did not report 3 restarts with the failed rank: $(cat "$work/chaos.err")"
[[ $(grep -c '^loomrun: restart [123]: the processes resumed from step [0-9]* (epoch [0-9]*, batch [0-9]*) from ' "$work/chaos.err") == 3 ]] ||
  fail "loomrun did not report the steps resumed from: $(cat "$work/chaos.err")"
[[ $(grep -c '^Training complete' "$work/chaos.out") == 1 ]] || fail "expected one 'Training complete'"
cmp "$work/chaos.safetensors" "$work/reference.safetensors" || fail "the final model differs from the uninterrupted run's"
echo "ok: 3 SIGKILLs, 3 automatic resumes, final parameters bit-identical to the uninterrupted run's"
