#!/usr/bin/env bash
# A private single-node Slurm for the job-script tests: its own slurm.conf, ports, state and spool
# under STATE_DIR, so it neither needs nor disturbs a Slurm already on the machine.
#
#   local_slurm.sh start STATE_DIR   start munged (if not running), slurmctld and slurmd; wait
#                                    until the node is idle. Exit 77 (the tests' SKIP) when Slurm
#                                    is not installed or cannot run here, with the reason on stderr.
#   local_slurm.sh stop STATE_DIR    stop the two daemons (munged is left running: it is shared).
#
# Clients find it through SLURM_CONF=STATE_DIR/slurm.conf.
set -euo pipefail
cmd=${1:?usage: local_slurm.sh start|stop STATE_DIR}
state=${2:?usage: local_slurm.sh start|stop STATE_DIR}

skip() {
  echo "SKIP: $*" >&2
  exit 77
}

stop_daemons() {
  local f pid
  for f in "$state/slurmd.pid" "$state/slurmctld.pid"; do
    [[ -s $f ]] || continue
    pid=$(<"$f")
    kill "$pid" 2>/dev/null || continue
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done
}

if [[ $cmd == stop ]]; then
  stop_daemons
  exit 0
fi
[[ $cmd == start ]] || { echo "local_slurm.sh: unknown command '$cmd'" >&2; exit 2; }

for tool in slurmctld slurmd sbatch scontrol munged; do
  command -v "$tool" >/dev/null || skip "'$tool' not found (Debian: scripts/install-deps.sh --test-tools)"
done
[[ $(id -u) -eq 0 ]] || skip "starting slurmd needs root"

mkdir -p "$state/spool" "$state/save"
host=$(hostname -s)
# Ports of our own (pid-derived) so an existing Slurm on the default ports 6817/6818 is not hit.
port=$((20000 + ($$ % 20000) * 2))
memory_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 3 / 4)}' /proc/meminfo)
cat >"$state/slurm.conf" <<CONF
ClusterName=l3test
SlurmctldHost=$host
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
# A requeued job becomes eligible after the credential lifetime (default 120 s): shorter here.
AuthInfo=cred_expire=10
SlurmUser=root
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmdSpoolDir=$state/spool
StateSaveLocation=$state/save
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
# A pending job that becomes eligible (a requeued one, after cred_expire) starts at the next
# scheduling pass, not at an event: every second here, not every 30 s (backfill) or 60 s (main).
SchedulerParameters=sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobRequeue=1
MpiDefault=pmi2
ReturnToService=2
KillWait=10
MinJobAge=600
# At least 4 CPUs, whatever the machine has (config_overrides: slurmd takes the configured
# count): asynchronous GRPO's job runs 3 ranks (tests/slurm/slurm_test.sh grpo_async).
SlurmdParameters=config_overrides
NodeName=$host CPUs=$(($(nproc) < 4 ? 4 : $(nproc))) RealMemory=$memory_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$state/slurm.conf

if ! pgrep -x munged >/dev/null; then
  mkdir -p /run/munge /var/log/munge /var/lib/munge /etc/munge
  [[ -s /etc/munge/munge.key ]] || head -c 1024 /dev/urandom >/etc/munge/munge.key
  chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
  chmod 400 /etc/munge/munge.key
  if id munge >/dev/null 2>&1 && command -v runuser >/dev/null; then
    runuser -u munge -- munged --force || skip "munged does not start"
  else
    munged --force || skip "munged does not start"
  fi
fi

slurmctld -f "$state/slurm.conf" || skip "slurmctld does not start (see $state/slurmctld.log)"
slurmd -f "$state/slurm.conf" || { stop_daemons; skip "slurmd does not start (see $state/slurmd.log)"; }
for _ in $(seq 1 60); do
  sinfo -h -o %T 2>/dev/null | grep -q idle && exit 0
  sleep 0.5
done
stop_daemons
skip "the Slurm node did not come up in 30 s (see $state/slurmd.log and $state/slurmctld.log)"
