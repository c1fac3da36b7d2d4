#!/usr/bin/env bash
# train_mnist started by Open MPI's real mpirun on this machine, as a user
# would start it: nothing set (no MASTER_ADDR / MASTER_PORT; rank 0's store on
# 127.0.0.1 at a port derived from the mpirun job), a world of 2 with rank 0
# alone reporting; a failing run's error lines carry "rank N:"; a second
# mpirun job started at the same time gets a port of its own.
# Usage: mpirun_launch.sh TRAIN_MNIST LOOMRUN
set -u
source "$(dirname "$0")/dist_common.sh"
train_mnist=$(absolute_path "$1")
if ! command -v mpirun >/dev/null; then
  echo "SKIP: mpirun is not installed (Debian's openmpi-bin; scripts/setup.sh installs it)"
  exit 77
fi
make_work_dir 2000 500
# Root needs Open MPI's consent; --oversubscribe lets 2 ranks share fewer cores.
mpirun=(mpirun --oversubscribe -np 2)
[[ $(id -u) == 0 ]] && mpirun+=(--allow-run-as-root)
echo "$(mpirun --version | head -n 1)"
common=(--data "$work/data" --max-steps 6 --log-interval 3 --timeout 60 --batch-size 50)

# Two jobs at once, each with nothing set: each job's ranks meet in their own store.
# Each mpirun gets its own session directory: Open MPI 4.1's daemons race to
# create the shared /tmp/ompi.<host>.<uid> when started together ("mkdir ...
# File exists", orte_init failed), which is Open MPI's, not loom's.
pids=()
for job in a b; do
  mkdir -p "$work/ompi-$job"
  (cd "$work" && env -u MASTER_ADDR -u MASTER_PORT timeout 120 "${mpirun[@]}" --mca orte_tmpdir_base "$work/ompi-$job" \
    "$train_mnist" "${common[@]}" \
    >"$work/$job.out" 2>"$work/$job.err") &
  pids+=($!)
done
for job in 0 1; do wait "${pids[$job]}" || { cat "$work/a.err" "$work/b.err"; fail "mpirun job $job failed"; }; done
for job in a b; do
  cat "$work/$job.out"
  grep -q '^Distributed: 2 processes (Open MPI (mpirun)), backend shm' "$work/$job.out" ||
    fail "job $job: not a world of 2 started by Open MPI"
  [[ $(grep -c '^Training complete in' "$work/$job.out") == 1 ]] || fail "job $job: expected one report, from rank 0"
  read -r correct total <<<"$(accuracy_counts "$work/$job.out")"
  [[ ${total:-0} == 500 ]] || fail "job $job: the accuracy covers ${total:-no} images, expected all 500 once"
done

# A failing run: each rank's error line names its rank.
env -u MASTER_ADDR -u MASTER_PORT timeout 60 "${mpirun[@]}" "$train_mnist" --data "$work/missing" \
  >"$work/bad.out" 2>"$work/bad.err"
status=$?
[[ $status -ne 0 && $status -lt 124 ]] || fail "a missing data directory under mpirun: status $status"
for rank in 0 1; do
  grep -q "^train_mnist: rank $rank: .*$work/missing" "$work/bad.err" ||
    { cat "$work/bad.err"; fail "no error line from rank $rank naming the directory"; }
done
echo "ok: mpirun -np 2 trains with nothing set, two jobs at once; errors name their rank"
