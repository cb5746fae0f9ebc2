# shellcheck shell=bash
# Shared by jobs/*.sbatch (sourced, not run): launch llama3-hpc with srun inside a Slurm
# allocation, forward checkpoint-and-stop signals to it, requeue the job when it stopped at a
# checkpoint (exit 75), and restart it after a failure (a rank or a node lost) a bounded number
# of times, each attempt resuming from the newest good checkpoint. See docs/HPC.md.
#
# Environment the user may set (all optional):
#   LLAMA3_HPC        the program (default: llama3-hpc on PATH, e.g. after `spack load llama3-hpc`)
#   L3_SRUN_FLAGS     extra srun flags, word-split (e.g. "--mpi=pmix --cpu-bind=cores")
#   L3_MAX_ATTEMPTS   launches per allocation before the job fails (default 3)
#   L3_RETRY_DELAY    seconds between a failed attempt and the next (default 10)
#   L3_MAX_REQUEUES   requeues after which an exit 75 fails the job instead (default 100)

l3_job_name=${SLURM_JOB_NAME:-llama3-hpc}
l3_stop_signal=""  # the checkpoint-and-stop signal received during the current attempt
l3_trapped=0       # a trapped signal interrupted `wait`
l3_child=""        # pid of the running srun
l3_err_log=""      # the current attempt's stderr, for the "last error" line

l3_log() {
  printf '%s [%s job %s] %s\n' "$(date +%FT%T)" "$l3_job_name" "${SLURM_JOB_ID:-none}" "$*" >&2
}

l3_die() {  # l3_die CODE MESSAGE
  local code=$1
  shift
  l3_log "error: $*"
  exit "$code"
}

# l3_find_program: sets l3_bin, checked once so that a missing install fails with the fix rather
# than with exit 127 from every rank.
l3_find_program() {
  local program=${LLAMA3_HPC:-llama3-hpc}
  l3_bin=$(command -v "$program") ||
    l3_die 2 "'$program' not found: 'spack load llama3-hpc', add its bin/ to PATH, or set LLAMA3_HPC"
}

# l3_config_file PATH: the config file the job was given, which must exist and be readable.
l3_config_file() {
  [[ -n ${1:-} ]] || l3_die 2 "no config file: sbatch $0 CONFIG.ini [llama3-hpc options]"
  [[ -f $1 && -r $1 ]] || l3_die 2 "config file '$1' not found or not readable (relative paths are from $(pwd))"
}

# Threads and the job's end time for the program. Since Slurm 22.05 srun does not inherit
# --cpus-per-task from the allocation; SRUN_CPUS_PER_TASK passes it on. SLURM_JOB_END_TIME (used by
# llama3-hpc to stop in time) is set by newer Slurm only; derive it from the job's end time otherwise.
l3_prepare_environment() {
  if [[ -n ${SLURM_CPUS_PER_TASK:-} ]]; then
    export SRUN_CPUS_PER_TASK=${SRUN_CPUS_PER_TASK:-$SLURM_CPUS_PER_TASK}
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$SLURM_CPUS_PER_TASK}
  fi
  if [[ -n ${SLURM_JOB_ID:-} ]]; then
    local end
    end=$(squeue -h -j "$SLURM_JOB_ID" -o %e 2>/dev/null || true)
    if [[ $end =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}T ]]; then
      export SLURM_JOB_END_TIME
      SLURM_JOB_END_TIME=$(date -d "$end" +%s)
    fi
  fi
}

l3_on_signal() {  # trap handler: forward a stop request to srun, which passes it to every rank
  local sig=$1
  l3_trapped=1
  l3_stop_signal=$sig
  if [[ -n $l3_child ]] && kill -0 "$l3_child" 2>/dev/null; then
    l3_log "SIG$sig received: asking llama3-hpc to checkpoint and stop (exit 75)"
    kill -s "$sig" "$l3_child" 2>/dev/null || true
  else
    l3_log "SIG$sig received between attempts: stopping"
  fi
}

# l3_srun ARGS...: run `srun ARGS` in the background, wait for it while forwarding signals, and
# return its exit status. A trapped signal interrupts `wait` (status > 128 while srun still runs),
# so wait again until srun itself has ended; a second `wait` on an already reaped pid gives 127.
l3_srun() {
  local rc status
  local -a launcher=(srun --kill-on-bad-exit=1)
  # One rank per GPU, each seeing every GPU of its node and choosing by node-local rank.
  if [[ -n ${SLURM_JOB_GPUS:-}${SLURM_GPUS_ON_NODE:-} ]]; then launcher+=(--gpu-bind=none); fi
  # shellcheck disable=SC2206  # deliberately word-split
  launcher+=(${L3_SRUN_FLAGS:-})
  rm -f "$l3_err_log"
  l3_err_log=$(mktemp "${TMPDIR:-/tmp}/l3-job-${SLURM_JOB_ID:-none}-XXXXXX.err")
  "${launcher[@]}" "$@" 2> >(tee "$l3_err_log" >&2) &
  l3_child=$!
  l3_trapped=0
  wait "$l3_child"
  rc=$?
  while ((l3_trapped)); do
    l3_trapped=0
    wait "$l3_child"
    status=$?
    ((status == 127)) && break
    rc=$status
  done
  l3_child=""
  return "$rc"
}

# The error line of the last attempt: the program's last line mentioning an error, else srun's or
# slurmstepd's (a rank killed, a node lost), else the last line.
l3_last_error() {
  local line
  [[ -s $l3_err_log ]] || { echo "(no output on stderr)"; return; }
  line=$(grep -iE 'error|fatal|killed|terminated' "$l3_err_log" | grep -vE '^(srun|slurmstepd)' | tail -n 1)
  [[ -n $line ]] || line=$(grep -iE 'error|fatal|killed|terminated' "$l3_err_log" | tail -n 1)
  [[ -n $line ]] || line=$(tail -n 1 "$l3_err_log")
  echo "$line"
}

# Nodes of the allocation still alive (under --no-kill a failed node leaves it); "" outside Slurm.
l3_alive_nodes() {
  [[ -n ${SLURM_JOB_ID:-} ]] || return 0
  scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/^ *NumNodes=\([0-9]*\).*/\1/p' | head -n 1
}

l3_requeue() {
  local restarts=${SLURM_RESTART_COUNT:-0} limit=${L3_MAX_REQUEUES:-100}
  if [[ -z ${SLURM_JOB_ID:-} ]]; then
    l3_log "stopped at a checkpoint outside Slurm: run the same command again to continue"
    exit 75
  fi
  ((restarts < limit)) ||
    l3_die 75 "stopped at a checkpoint again after $restarts requeues (L3_MAX_REQUEUES=$limit): not requeued"
  l3_log "stopped at a checkpoint: requeueing job $SLURM_JOB_ID (requeue $((restarts + 1)))"
  # On success Slurm ends this script right here; it comes back with SLURM_RESTART_COUNT + 1.
  scontrol requeue "$SLURM_JOB_ID" ||
    l3_die 75 "scontrol requeue failed (submitted with --no-requeue, or JobRequeue=0?): resubmit to continue"
  exit 0
}

# l3_has_option NAME CONFIG ARGS...: whether --NAME is set on the command line or in the config file.
l3_has_option() {
  local name=$1 config=$2 arg
  shift 2
  for arg in "$@"; do [[ $arg == "--$name" || $arg == "--$name="* ]] && return 0; done
  grep -qE "^[[:space:]]*${name}[[:space:]]*=" "$config"
}

# l3_without_resume ARGS...: ARGS without any --resume option (a retry always resumes: auto).
l3_without_resume() {
  l3_args=()
  while (($#)); do
    case $1 in
      --resume) shift ;;
      --resume=*) ;;
      *) l3_args+=("$1") ;;
    esac
    shift
  done
}

# l3_run_phase NAME CONFIG ARGS...: the restart loop around `srun ARGS`; returns 0 when done. Exit codes of ARGS:
# 0 finished, 2 bad input (not retried), 75 checkpointed and stopped (requeue), anything else a
# failure (a crash, a rank or a node lost), retried up to L3_MAX_ATTEMPTS times. A training phase
# with --ckpt-dir resumes on every retry and requeue with --resume auto (the first attempt of a
# fresh job keeps what the user chose); without --ckpt-dir a retry would start over, so none is made.
l3_run_phase() {
  local phase=$1 config=$2
  shift 2
  local attempts=${L3_MAX_ATTEMPTS:-3} delay=${L3_RETRY_DELAY:-10} attempt rc resumable=0
  local start_nodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}} nodes
  local ntasks=${SLURM_NTASKS:-1}
  local -a args shape
  [[ $attempts =~ ^[1-9][0-9]*$ ]] || l3_die 2 "L3_MAX_ATTEMPTS must be a positive integer, got '$attempts'"
  [[ $delay =~ ^[0-9]+$ ]] || l3_die 2 "L3_RETRY_DELAY must be a number of seconds, got '$delay'"
  if [[ $phase == sft || $phase == reward || $phase == dpo || $phase == grpo ]]; then
    if l3_has_option ckpt-dir "$config" "$@"; then
      resumable=1
    else
      attempts=1
      l3_log "warning: no ckpt-dir in $config: no checkpoints, so no restart after a failure or signal"
    fi
  fi
  trap 'l3_on_signal USR1' USR1
  trap 'l3_on_signal TERM' TERM
  trap 'l3_on_signal INT' INT
  trap 'rm -f "$l3_err_log"' EXIT
  l3_prepare_environment
  l3_log "$phase: $ntasks ranks on $start_nodes nodes, job restart ${SLURM_RESTART_COUNT:-0}, up to $attempts attempts"
  for ((attempt = 1; attempt <= attempts; attempt++)); do
    l3_stop_signal=""
    args=("$@")
    if ((resumable)) && ((attempt > 1 || ${SLURM_RESTART_COUNT:-0} > 0)); then
      l3_without_resume "$@"
      args=("${l3_args[@]}" --resume auto)
    fi
    shape=()
    nodes=$(l3_alive_nodes)
    if [[ -n $nodes && $nodes -lt $start_nodes ]]; then
      # --no-kill kept the job alive on fewer nodes: as many ranks per node as before, resharded.
      shape=(--nodes="$nodes" --ntasks=$((nodes * (ntasks / start_nodes))))
      l3_log "continuing on $nodes of $start_nodes nodes (${shape[1]#--ntasks=} ranks)"
    fi
    l3_log "$phase attempt $attempt/$attempts: ${args[*]}"
    l3_srun "${shape[@]}" "${args[@]}"
    rc=$?
    case $rc in
      0)
        l3_log "$phase finished"
        return 0
        ;;
      75) l3_requeue ;;
      2) l3_die 2 "$phase: bad input or options (exit 2), not retried: $(l3_last_error)" ;;
    esac
    # Ended by a signal (time limit, preemption) without a clean stop: requeue, resume from the last
    # checkpoint; without checkpoints there is nothing to resume, so the job fails.
    if [[ -n $l3_stop_signal ]]; then
      ((resumable)) || l3_die "$rc" "$phase ended by SIG$l3_stop_signal (exit $rc) without checkpoints"
      l3_log "$phase exited $rc after SIG$l3_stop_signal: requeueing to resume from the last checkpoint"
      l3_requeue
    fi
    l3_log "$phase attempt $attempt/$attempts failed with exit $rc: $(l3_last_error)"
    if ((attempt < attempts)); then
      l3_log "next attempt in $delay s$( ((resumable)) && echo ", from the newest good checkpoint")"
      sleep "$delay" &
      wait $! || true
      if [[ -n $l3_stop_signal ]]; then
        ((resumable)) && l3_requeue
        l3_die "$rc" "$phase stopped by SIG$l3_stop_signal after a failed attempt"
      fi
    fi
  done
  l3_die "$rc" "$phase failed $attempts times; last error: $(l3_last_error)"
}

# l3_job PHASE CONFIG [OPTIONS...]: the body of sft.sbatch, reward.sbatch, dpo.sbatch, grpo.sbatch (and of prep.sbatch,
# once per config file): `llama3-hpc PHASE --config CONFIG OPTIONS...` under the restart loop.
l3_job() {
  local phase=$1 config=${2:-}
  l3_config_file "$config"
  shift 2
  l3_find_program
  l3_run_phase "$phase" "$config" "$l3_bin" "$phase" --config "$config" "$@"
}
