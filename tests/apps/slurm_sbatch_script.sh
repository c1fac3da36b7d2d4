#!/usr/bin/env bash
# scripts/slurm_train_mnist.sbatch under a stand-in for SLURM: a fake `srun`
# starts SLURM_NTASKS local tasks with SLURM_PROCID / SLURM_LOCALID /
# SLURM_NODEID / SLURM_NTASKS / SLURM_SRUN_COMM_HOST set, as srun does, and a
# fake `scontrol show hostnames` names this machine. The batch script must
# train at world 2 with no launcher and rank 0 alone must report.
# Usage: slurm_sbatch_script.sh TRAIN_MNIST LOOMRUN
set -u
train_mnist=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/dist_common.sh"
script=$here/../../scripts/slurm_train_mnist.sbatch
make_work_dir 2000 500

mkdir -p "$work/bin" "$work/build/apps"
ln -s "$(absolute_path "$train_mnist")" "$work/build/apps/train_mnist"
cat >"$work/bin/scontrol" <<'SH'
#!/bin/sh
[ "$1 $2" = "show hostnames" ] && echo 127.0.0.1
SH
cat >"$work/bin/srun" <<'SH'
#!/usr/bin/env bash
# srun OPTIONS... PROGRAM ARGS...: SLURM_NTASKS local tasks, each with srun's variables.
while [[ $1 == -* ]]; do shift; done
pids=()
for ((task = 0; task < SLURM_NTASKS; task++)); do
  SLURM_STEP_ID=0 SLURM_PROCID=$task SLURM_LOCALID=$task SLURM_NODEID=0 SLURM_SRUN_COMM_HOST=127.0.0.1 "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
exit $status
SH
chmod +x "$work/bin/scontrol" "$work/bin/srun"

(cd "$work" && PATH=$work/bin:$PATH SLURM_JOB_NODELIST=node[1-2] SLURM_NTASKS=2 SLURM_CPUS_PER_TASK=1 \
  MASTER_PORT=$(free_port) LOOM=$work/build timeout 90 bash "$script" --data "$work/data" --max-steps 8 \
  --log-interval 4 >"$work/out" 2>"$work/err") || { cat "$work/out" "$work/err"; fail "the sbatch script failed"; }
cat "$work/out"
# --backend auto picks shm: both tasks run on this host, whatever the node list says.
grep -q '^Distributed: 2 processes (SLURM (srun)), backend shm, batch 100 per process, SyncBatchNorm$' "$work/out" ||
  fail "not a world of 2 started by SLURM"
[[ $(grep -c '^Test accuracy: .*/500)$' "$work/out") == 1 ]] || fail "expected one accuracy line over all 500 test images"
[[ $(grep -c "^Epoch \\[" "$work/out") == 2 ]] || fail "expected 2 loss lines, from rank 0 only"
echo "ok: the sbatch example trains at world 2 under srun's variables"
