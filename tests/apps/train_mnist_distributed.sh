#!/usr/bin/env bash
# train_mnist at world 2 (CPU, Gloo, 1 thread per process) started every way
# the tutorials start it: `-n 1 -g 2 -nr 0` (it spawns its ranks like
# mp.spawn), loomrun --nproc_per_node=2 (torchrun), and two processes with
# srun's SLURM_* variables. All three print the same loss lines and test
# accuracy, from rank 0 only, with every test image counted once; with
# --sync-bn and the same sample order, world 1 at batch 100 reaches the same
# accuracy as world 2 at 50 per process.
# Usage: train_mnist_distributed.sh TRAIN_MNIST LOOMRUN
set -u
train_mnist=$1
loomrun=$2
source "$(dirname "$0")/dist_common.sh"
make_work_dir 3000 1000
common=(--data "$work/data" --max-steps 25 --log-interval 5 --timeout 60 --sync-bn)

MASTER_PORT=$(free_port) timeout 120 "$train_mnist" -n 1 -g 2 -nr 0 --batch-size 50 "${common[@]}" \
  >"$work/spawn.out" 2>"$work/spawn.err" || { cat "$work/spawn.err"; fail "train_mnist -g 2 exited with $?"; }

timeout 120 "$loomrun" --nproc_per_node=2 --master_port="$(free_port)" "$train_mnist" --batch-size 50 "${common[@]}" \
  >"$work/loomrun.out" 2>"$work/loomrun.err" || { cat "$work/loomrun.err"; fail "loomrun exited with $?"; }

port=$(free_port)
for rank in 0 1; do
  env -u MASTER_ADDR SLURM_STEP_ID=0 SLURM_PROCID=$rank SLURM_NTASKS=2 SLURM_LOCALID=$rank SLURM_NODEID=0 \
    SLURM_SRUN_COMM_HOST=127.0.0.1 MASTER_PORT=$port \
    timeout 120 "$train_mnist" --batch-size 50 "${common[@]}" >"$work/slurm.$rank.out" 2>"$work/slurm.$rank.err" &
  pids[$rank]=$!
done
for rank in 0 1; do
  wait "${pids[$rank]}" || { cat "$work/slurm.$rank.err"; fail "SLURM-style rank $rank exited with $?"; }
done

timeout 120 "$train_mnist" --threads 1 --batch-size 100 "${common[@]}" >"$work/single.out" 2>"$work/single.err" ||
  { cat "$work/single.err"; fail "train_mnist at world 1 exited with $?"; }

cat "$work/spawn.out"
for run in spawn loomrun slurm.0; do
  [[ $(grep -c '^Training complete in' "$work/$run.out") == 1 ]] || fail "$run: expected one 'Training complete' line"
  [[ $(grep -c '^Epoch \[1/2\], Step \[' "$work/$run.out") == 5 ]] || fail "$run: expected 5 loss lines (rank 0 only)"
  read -r correct total <<<"$(accuracy_counts "$work/$run.out")"
  [[ ${total:-0} == 1000 ]] || fail "$run: the test accuracy covers ${total:-no} images, expected all 1000 once"
done
[[ ! -s "$work/slurm.1.out" ]] || fail "rank 1 printed: $(cat "$work/slurm.1.out")"
diff <(result_lines "$work/spawn.out") <(result_lines "$work/loomrun.out") || fail "-g 2 and loomrun differ"
diff <(result_lines "$work/spawn.out") <(result_lines "$work/slurm.0.out") || fail "-g 2 and SLURM variables differ"

read -r correct2 total <<<"$(accuracy_counts "$work/spawn.out")"
read -r correct1 total <<<"$(accuracy_counts "$work/single.out")"
difference=$((correct2 > correct1 ? correct2 - correct1 : correct1 - correct2))
echo "world 2 x 50: $correct2/1000 correct, world 1 x 100: $correct1/1000 correct"
((difference <= 5)) || fail "world 2 and world 1 differ by $difference test images (more than 0.5 points)"

# -n 2 without MASTER_ADDR: one line saying what to set.
err=$(env -u MASTER_ADDR timeout 30 "$train_mnist" -n 2 -g 1 -nr 0 --data "$work/data" 2>&1 >/dev/null)
status=$?
[[ $status -ne 0 && $status -lt 124 && "$err" == *"set MASTER_ADDR"* ]] || fail "-n 2 without MASTER_ADDR: status $status: $err"
echo "ok: -g 2, loomrun and SLURM variables agree; world 1 matches world 2 with SyncBatchNorm"
