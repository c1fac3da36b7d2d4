#!/usr/bin/env bash
# loom's programs under a real SLURM cluster: one node (this machine) whose
# munged, slurmctld and slurmd this test configures and starts under a
# temporary directory (a generated slurm.conf, a fresh munge key, free ports)
# and stops by pid at the end. Runs, each checked from its output:
#   1. srun -n 2 train_mnist                    (SLURM's variables, world 2)
#   2. sbatch scripts/slurm_train_mnist.sbatch  as written (no arguments; the
#      data in ./data/MNIST/raw, torchvision's layout), then with extra
#      arguments that repeat the script's own (--epochs 1 wins over its 2)
#   3. sbatch scripts/slurm_train_resnet50_cifar.sbatch --synthetic ... (its
#      header usage), writing ./checkpoint/2GPU_1epoch.checkpoint
#   4. mpirun -np 2 inside an sbatch script     (Open MPI's ranks win over the
#      batch script's SLURM_PROCID=0 / SLURM_NTASKS=2)
#   5. scancel of a running job                 (its tasks end, the job is CANCELLED)
# Exits 77 (skip) only when SLURM or munge is not installed.
# Usage: slurm_cluster.sh TRAIN_MNIST LOOMRUN TRAIN_RESNET50_CIFAR
set -u
train_mnist=$1
train_resnet=$3
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
source "$here/dist_common.sh"
for program in slurmctld slurmd munged sbatch srun scontrol scancel sinfo; do
  if ! command -v "$program" >/dev/null && [[ ! -x /usr/sbin/$program ]]; then
    echo "SKIP: $program is not installed (Debian's slurm-wlm and munge; scripts/setup.sh installs them)"
    exit 77
  fi
done
if [[ $(id -u) != 0 ]]; then
  echo "SKIP: slurmd must run as root to start jobs"
  exit 77
fi
PATH=$PATH:/usr/sbin

work=$(mktemp -d /tmp/loom-slurm.XXXXXX)
chmod 755 "$work"
daemons=()
stop_cluster() {
  local pid
  for pid in "${daemons[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${daemons[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
  done
  rm -rf "$work"
}
trap stop_cluster EXIT
show_logs() {
  for log in "$work"/log/*.log; do echo "--- $log"; tail -n 30 "$log"; done
}
die() { show_logs; fail "$@"; }

# ---- munge: a key of our own, its socket under $work ----
mkdir -p "$work/munge" "$work/log" "$work/state" "$work/spool" "$work/jobs"
chmod 755 "$work/munge"
dd if=/dev/urandom of="$work/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$work/munge/munge.key"
munged --force --key-file="$work/munge/munge.key" --socket="$work/munge/munge.socket" \
  --pid-file="$work/munge/munged.pid" --seed-file="$work/munge/munge.seed" --log-file="$work/log/munged.log" ||
  die "munged did not start"
for _ in $(seq 50); do [[ -s $work/munge/munged.pid ]] && break; sleep 0.1; done
daemons+=("$(cat "$work/munge/munged.pid")")

# ---- slurm.conf: this machine, its CPUs, free ports ----
node=$(hostname -s)
cpus=$(nproc)
((cpus >= 2)) || cpus=2  # the example scripts ask for 2 tasks x 1 CPU
export SLURM_CONF=$work/slurm.conf
cat >"$SLURM_CONF" <<CONF
ClusterName=loomtest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$work/munge/munge.socket
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge=600
KillWait=5
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF

slurmctld -D -i -f "$SLURM_CONF" >"$work/log/slurmctld.out" 2>&1 &
daemons+=($!)
slurmd -D -f "$SLURM_CONF" -N "$node" >"$work/log/slurmd.out" 2>&1 &
daemons+=($!)
state=""
for _ in $(seq 60); do
  state=$(sinfo -h -N -o %T 2>/dev/null | head -n 1)
  [[ $state == idle ]] && break
  sleep 0.5
done
[[ $state == idle ]] || { cat "$work/log/"*.out; die "the node did not come up (state '$state')"; }
echo "SLURM $(sinfo --version | cut -d' ' -f2): node $node with $cpus CPUs is idle"

# Programs and data where the example scripts look: ./build/apps, ./data/MNIST/raw.
mkdir -p "$work/jobs/build/apps"
ln -s "$(absolute_path "$train_mnist")" "$work/jobs/build/apps/train_mnist"
ln -s "$(absolute_path "$train_resnet")" "$work/jobs/build/apps/train_resnet50_cifar"
make_mnist_subset "$work/jobs/data/MNIST/raw" 1200 300
cd "$work/jobs"

# job_state ID: RUNNING, COMPLETED, FAILED, CANCELLED, ...
job_state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }

# sbatch_wait LABEL ARGS...: submits and waits for the job; prints its id.
sbatch_wait() {
  local label=$1
  shift
  local id
  id=$(MASTER_PORT=$(free_port) timeout 240 sbatch --parsable --wait "$@" 2>"$work/$label.sbatch.err")
  local status=$?
  id=${id%%;*}
  [[ -n $id ]] || { cat "$work/$label.sbatch.err"; die "$label: sbatch gave no job id"; }
  [[ $status == 0 ]] || { cat "$work/$label.sbatch.err" ./*-"$id".out 2>/dev/null; die "$label: job $id ended with status $status ($(job_state "$id"))"; }
  echo "$id"
}

# 1. srun -n 2: two tasks, SLURM's variables, rank 0 alone reports.
MASTER_PORT=$(free_port) timeout 120 srun -n 2 --kill-on-bad-exit=1 "$train_mnist" --max-steps 6 --log-interval 3 \
  --batch-size 50 --threads 1 >srun.out 2>srun.err || { cat srun.err; die "srun -n 2 failed"; }
cat srun.out
grep -q '^Distributed: 2 processes (SLURM (srun)), backend shm' srun.out || die "srun -n 2: not a world of 2 started by srun"
[[ $(grep -c '^Training complete in' srun.out) == 1 ]] || die "srun -n 2: expected one report, from rank 0"
read -r _ total <<<"$(accuracy_counts srun.out)"
[[ ${total:-0} == 300 ]] || die "srun -n 2: the accuracy covers ${total:-no} of 300 images"
echo "ok 1: srun -n 2"

# 2. The MNIST example as written, then with arguments repeating its own.
id=$(sbatch_wait mnist "$repo/scripts/slurm_train_mnist.sbatch")
out=loom-mnist-$id.out
cat "$out"
grep -q '^Distributed: 2 processes (SLURM (srun)), backend shm, batch 100 per process, SyncBatchNorm$' "$out" ||
  die "sbatch as written: not the world of 2 with SyncBatchNorm the script asks for"
# No loss lines at 6 steps per epoch: the images trained (throughput x time) say 2 epochs of 1200.
images=$(awk '/^Training complete in:/ { split($4, t, ":"); s = t[1] * 3600 + t[2] * 60 + t[3] }
              /^Throughput:/ { r = $2 } END { printf "%d", r * s + 0.5 }' "$out")
((images > 2300 && images < 2500)) || die "sbatch as written: trained $images images, not 2 epochs x 1200"
id=$(sbatch_wait mnist-args "$repo/scripts/slurm_train_mnist.sbatch" --epochs 1 --max-steps 4 --log-interval 2)
out=loom-mnist-$id.out
cat "$out"
grep -q '^Epoch \[1/1\], Step \[4/' "$out" || die "sbatch ... --epochs 1: the last --epochs did not win"
! grep -q '^Epoch \[2/' "$out" || die "sbatch ... --epochs 1 trained a second epoch"
echo "ok 2: the MNIST sbatch example, as written and with extra arguments"

# 3. The ResNet example's header usage, on synthetic data.
id=$(sbatch_wait resnet "$repo/scripts/slurm_train_resnet50_cifar.sbatch" --synthetic --synthetic-size 64 \
  --model resnet18 -b 16 -e 1 --max-steps 2 --log-interval 1)
out=loom-resnet50-$id.out
cat "$out"
grep -q '>>> Training on 2 CPU processes' "$out" || die "resnet sbatch: not 2 processes"
[[ -f checkpoint/2GPU_1epoch.checkpoint ]] || die "resnet sbatch: no checkpoint/2GPU_1epoch.checkpoint"
echo "ok 3: the ResNet sbatch example"

# 4. mpirun inside a batch script: Open MPI's ranks, not the script's SLURM_PROCID=0.
if command -v mpirun >/dev/null; then
  cat >mpirun.sbatch <<SH
#!/bin/bash
#SBATCH --ntasks=2
#SBATCH --output=mpirun-%j.out
echo "batch script: SLURM_PROCID=\${SLURM_PROCID:-unset} SLURM_NTASKS=\$SLURM_NTASKS SLURM_STEP_ID=\${SLURM_STEP_ID:-unset}"
mpirun --allow-run-as-root --oversubscribe -np 2 build/apps/train_mnist --max-steps 4 --log-interval 2 --batch-size 50 --threads 1
SH
  id=$(sbatch_wait mpirun mpirun.sbatch)
  cat "mpirun-$id.out"
  grep -q '^Distributed: 2 processes (Open MPI (mpirun)), backend shm' "mpirun-$id.out" ||
    die "mpirun in sbatch: not a world of 2 started by Open MPI"
  [[ $(grep -c '^Training complete in' "mpirun-$id.out") == 1 ]] || die "mpirun in sbatch: expected one report"
  echo "ok 4: mpirun -np 2 inside sbatch"
else
  echo "FAIL 4: mpirun is not installed (openmpi-bin)"
  exit 1
fi

# 5. scancel a running job: its tasks end and the job is CANCELLED.
id=$(MASTER_PORT=$(free_port) sbatch --parsable "$repo/scripts/slurm_train_mnist.sbatch" --epochs 1000 --log-interval 1)
id=${id%%;*}
for _ in $(seq 120); do grep -q '^Epoch \[1/1000\]' "loom-mnist-$id.out" 2>/dev/null && break; sleep 0.5; done
grep -q '^Epoch \[1/1000\]' "loom-mnist-$id.out" || { cat "loom-mnist-$id.out"; die "scancel: the job did not start training"; }
scancel "$id"
for _ in $(seq 60); do [[ $(job_state "$id") == CANCELLED ]] && ! pgrep -f "$work/jobs/build/apps/train_mnist" >/dev/null && break; sleep 0.5; done
[[ $(job_state "$id") == CANCELLED ]] || die "scancel: job $id is $(job_state "$id"), not CANCELLED"
! pgrep -f "$work/jobs/build/apps/train_mnist" >/dev/null || die "scancel: train_mnist still runs 30 s after scancel"
echo "ok 5: scancel ended the running job"
echo "ok: loom under a real SLURM cluster (srun, sbatch examples, mpirun in sbatch, scancel)"
