#!/usr/bin/env bash
# `srun -n 4 loom train` on a one-machine Slurm cluster gives the one-process run's losses and
# weights to the dist tests' tolerances, and mpirun's on one host bit for bit (dp 2 x tp 2;
# parity_case.sh). The script writes a slurm.conf for this machine alone,
# starts slurmctld and slurmd from a temporary directory (their state, spool, logs and pid
# files all inside it), waits for the node to be idle, runs the job, and in a trap cancels any
# job, stops both daemons and removes the directory.
# Exits 77 (ctest: Skipped) when it cannot run here: not root (slurmd starts tasks as other
# users only as root), or Debian's slurm-wlm is not installed.
# Usage: slurm_local.sh <mpiexec> <path to loom> (mpiexec for the one-host run it must equal)
set -u
mpiexec=${1:?usage: slurm_local.sh <mpiexec> <loom>}
loom=${2:?usage: slurm_local.sh <mpiexec> <loom>}
skip() { echo "slurm_local: SKIPPED: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root to run slurmd"
for tool in slurmctld slurmd srun sinfo squeue scancel; do
  command -v "$tool" >/dev/null || skip "$tool not found (apt-get install slurm-wlm)"
done

dir=$(mktemp -d /tmp/loom_slurm.XXXXXX)
ctld_pid=""
slurmd_pid=""
cleanup() {
  if [ -n "$ctld_pid" ]; then
    scancel --quiet --full "--partition=loom" 2>/dev/null
    for _ in $(seq 50); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  for pid in $slurmd_pid $ctld_pid; do kill "$pid" 2>/dev/null; done
  for pid in $slurmd_pid $ctld_pid; do wait "$pid" 2>/dev/null; done
  [ -n "${KEEP:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT
trap "exit 143" INT TERM  # so that the EXIT trap cleans up after a signal too
fail() {
  echo "slurm_local: FAIL: $*"
  for f in "$dir"/*.log; do [ -f "$f" ] && { echo "--- $f ---"; tail -n 40 "$f"; }; done
  exit 1
}
source "$(dirname "$0")/parity_case.sh"

# Two free TCP ports for the daemons (a fixed pair could clash with a cluster on this machine).
read -r ctld_port slurmd_port < <(/usr/bin/python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
host=$(hostname -s)
mkdir -p "$dir/state" "$dir/spool"
# auth/none and cred/none: no munge daemon or key (Slurm 22.05 still ships both plugins; fine for
# a cluster that only listens on this machine). proctrack/linuxproc and task/none: no cgroups,
# which containers often lack. config_overrides: trust CPUs=4 on a 2-core machine, so four
# tasks fit on the one node (they share the cores, like mpirun --oversubscribe).
cat >"$dir/slurm.conf" <<CONF
ClusterName=loomci
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
NodeName=loomnode NodeHostname=$host NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=loom Nodes=loomnode Default=YES MaxTime=10 State=UP
CONF
export SLURM_CONF="$dir/slurm.conf"

slurmctld -D -i -f "$SLURM_CONF" >"$dir/slurmctld.log" 2>&1 &
ctld_pid=$!
slurmd -D -N loomnode -f "$SLURM_CONF" >"$dir/slurmd.log" 2>&1 &
slurmd_pid=$!
state=""
for _ in $(seq 150); do  # up to 30 s for the node to register
  state=$(sinfo -h -n loomnode -o %T 2>/dev/null)
  [ "$state" = idle ] && break
  kill -0 "$ctld_pid" 2>/dev/null || fail "slurmctld exited"
  kill -0 "$slurmd_pid" 2>/dev/null || fail "slurmd exited"
  sleep 0.2
done
[ "$state" = idle ] || fail "the node is '$state' after 30 s, expected idle"
echo "slurm_local: slurmctld and slurmd up (ports $ctld_port, $slurmd_port), node loomnode idle"

parity_prepare
parity_reference
parity_mpirun_reference "$mpiexec"
# Debian's OpenMPI 4.1 has no PMI-2 client (--mpi=pmi2 fails in MPI_Init); it talks PMIx to
# Slurm's mpi/pmix plugin. --kill-on-bad-exit: a failed rank ends the step, not a hang.
mapfile -t args < <(parity_train_args slurm parallel)
OMP_NUM_THREADS=1 LOOM_COMM_TIMEOUT_S=60 timeout 150 \
  srun -n "$PARITY_RANKS" --mpi=pmix --kill-on-bad-exit=1 --time=3 "$loom" "${args[@]}" \
  >"$dir/slurm.log" 2>&1 || fail "srun -n $PARITY_RANKS loom train exited with $?"
parity_compare slurm
echo "slurm_local: PASS (srun -n $PARITY_RANKS --mpi=pmix, dp 2 x tp 2)"
