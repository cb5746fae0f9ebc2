#!/usr/bin/env bash
# The job scripts (jobs/) under a real Slurm started on this machine for the test
# (tests/slurm/local_slurm.sh; SKIP, exit 77, where it cannot run), with tiny models:
#   complete  sft.sbatch runs to completion with the weights of the same run under mpiexec; a
#             rerun of the finished job exits at once; a bad config fails at once (exit 2); a
#             preempted job (SIGTERM) checkpoints, requeues itself and finishes
#   requeue   --time=2 with USR1 60 s ahead: the job checkpoints, exits 75, requeues itself and
#             finishes with the weights of an uninterrupted run
#   restart   a rank killed with SIGKILL mid-run: the restart loop resumes and the job finishes
#             with the uninterrupted run's weights; the same from the node-local level
#             (--ckpt-local) when it is newer than ckpt-dir; a job failing on every attempt fails
#             loudly
#   pipeline  jobs/pipeline.sh: each stage's sbatch line (a stand-in sbatch: every stage's, the
#             training stages' and its own options; the prep job without the training's --gres);
#             jobs/dpo.ini and grpo.ini hold only their command's options;
#             prep -> sft -> reward and dpo -> grpo (with the reward model) end to end, prep on 1
#             task and training on 2; a failed stage cancels the rest
#
#   slurm_test.sh CASE LLAMA3_HPC SOURCE_DIR MPIEXEC
set -uo pipefail
case_name=${1:?usage: slurm_test.sh CASE LLAMA3_HPC SOURCE_DIR MPIEXEC}
bin=${2:?}
source_dir=${3:?}
mpiexec=${4:?}
work=$(mktemp -d "${TMPDIR:-/tmp}/l3-slurm-XXXXXX")
failures=0

cleanup() {
  scancel --full --signal=KILL --user="$(id -un)" >/dev/null 2>&1 || true
  "$source_dir/tests/slurm/local_slurm.sh" stop "$work/slurm"
  rm -rf "$work"
}
"$source_dir/tests/slurm/local_slurm.sh" start "$work/slurm" || {
  rc=$?
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
export SLURM_CONF=$work/slurm/slurm.conf
export LLAMA3_HPC=$bin OMP_NUM_THREADS=1 L3_RETRY_DELAY=1 L3_ERROR_GRACE_SECONDS=2
cd "$work" || exit 1

fail() {
  echo "FAIL [$1]"
  failures=$((failures + 1))
}
pass() { echo "ok   [$1]"; }
check() {  # check NAME COMMAND...: pass if COMMAND succeeds
  local name=$1
  shift
  if "$@"; then pass "$name"; else fail "$name"; fi
}

# job_state ID: COMPLETED, FAILED, ... as scontrol reports it.
job_state() { scontrol show job "$1" 2>/dev/null | sed -n 's/^ *JobState=\([A-Z_]*\).*/\1/p'; }
job_field() { scontrol show job "$1" 2>/dev/null | grep -o "$2=[^ ]*" | head -n 1 | cut -d= -f2; }

# wait_job ID SECONDS: wait until the job has ended for good (a requeued job comes back); prints
# its final state. A job still running after SECONDS is cancelled and reported as HUNG.
wait_job() {
  local id=$1 limit=$2 state
  for ((t = 0; t < limit * 2; t++)); do
    state=$(job_state "$id")
    case $state in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE)
        echo "$state"
        return
        ;;
    esac
    sleep 0.5
  done
  scancel "$id" 2>/dev/null
  echo HUNG
}

show_output() {  # the last lines of a job's output file
  echo "--- $1 ---"
  tail -n "${2:-15}" "$1" 2>/dev/null
}

digest() { "$bin" ckpt verify --json "$1" 2>/dev/null; }

# --- data: a reversal task (SFT) and preference pairs ---
# shellcheck source=tests/support/reversal_data.sh
source "$source_dir/tests/support/reversal_data.sh"
write_reversal_jsonl .
prep_data() { prep_reversal_data "$bin" .; }

# sft_config FILE CKPT_DIR STEPS [KEY=VALUE...]: a tiny-model SFT config; KEY=VALUE adds or replaces.
sft_config() {
  local file=$1 kv key
  local -A options=([model]=tiny [data]=$work/sft [steps]=$3 [seq-len]=128 [global-batch]=12
    [micro-batch]=2 [lr]=3e-3 [warmup]=2 [ckpt-dir]=$2 [no-progress]=true)
  shift 3
  for kv in "$@"; do options[${kv%%=*}]=${kv#*=}; done
  for key in "${!options[@]}"; do echo "$key = ${options[$key]}"; done >"$file"
}

# reference CONFIG RANKS CKPT_DIR: the same run under plain mpiexec (in the background).
reference() {
  "$mpiexec" -n "$2" "$bin" sft --config "$1" --ckpt-dir "$3" >"$3.log" 2>&1
}

case $case_name in
complete)
  prep_data || { echo "prep failed"; exit 1; }
  sft_config sft.ini "$work/ckpt" 20 checkpoint-every=5 log-every=5
  reference sft.ini 2 "$work/ref" &
  ref_pid=$!
  id=$(sbatch --parsable --ntasks-per-node=2 "$source_dir/jobs/sft.sbatch" sft.ini)
  state=$(wait_job "$id" 120)
  wait "$ref_pid"
  check "sft.sbatch: job $id completes ($state)" test "$state" = COMPLETED
  check "sft.sbatch: the job's weights equal the same run under mpiexec" \
    test -n "$(digest ref/step-00000020)" -a "$(digest ckpt/step-00000020)" = "$(digest ref/step-00000020)"
  [[ $state == COMPLETED ]] || show_output "l3-sft-$id.out"
  before=$(stat -c %Y ckpt/latest)
  id=$(sbatch --parsable --ntasks-per-node=2 "$source_dir/jobs/sft.sbatch" sft.ini)
  state=$(wait_job "$id" 60)
  check "a rerun of the finished job completes at once ($state)" \
    grep -q "sft done: 0 steps" "l3-sft-$id.out"
  check "... and leaves the checkpoints alone" test "$(stat -c %Y ckpt/latest)" = "$before"
  # Bad input: exit 2, not retried.
  sft_config bad.ini "$work/ckpt-bad" 20 data="$work/no-such-data"
  id=$(L3_MAX_ATTEMPTS=3 sbatch --parsable --ntasks-per-node=2 "$source_dir/jobs/sft.sbatch" bad.ini)
  state=$(wait_job "$id" 60)
  check "a bad config fails the job ($state, exit $(job_field "$id" ExitCode))" \
    test "$state" = FAILED -a "$(job_field "$id" ExitCode)" = 2:0
  check "... at once, naming the problem" grep -q "not retried:.*no-such-data" "l3-sft-$id.out"
  check "... after one attempt" test "$(grep -c 'attempt [0-9]/' "l3-sft-$id.out")" = 1
  [[ $failures -eq 0 ]] || show_output "l3-sft-$id.out"
  id=$(sbatch --parsable "$source_dir/jobs/sft.sbatch" 2>&1)
  state=$(wait_job "$id" 60)
  check "no config file: the job fails with the usage" grep -q "no config file" "l3-sft-$id.out"
  # Preemption: SIGTERM to the batch shell and the job step (what Slurm sends) -> checkpoint,
  # exit 75, requeue, resume, finish. SIGTERM goes once the checkpoint of step 50 is in: about
  # step 75 of 500 (0.5 s polls at ~20 ms a step), 425 steps before the end.
  sft_config term.ini "$work/ckpt-term" 500 checkpoint-every=50 log-every=50
  id=$(sbatch --parsable --ntasks-per-node=2 "$source_dir/jobs/sft.sbatch" term.ini)
  for ((t = 0; t < 240; t++)); do
    [[ -e ckpt-term/latest ]] && break
    sleep 0.5
  done
  scancel --signal=TERM --full "$id"
  state=$(wait_job "$id" 240)
  out=l3-sft-$id.out
  check "preempted job $id (SIGTERM) completes ($state) after $(job_field "$id" Restarts) requeue(s)" \
    test "$state" = COMPLETED -a "$(job_field "$id" Restarts)" -ge 1
  check "... having forwarded SIGTERM and stopped with exit 75" \
    grep -q "SIGTERM received: asking llama3-hpc" "$out"
  check "... and resumed from its checkpoint ($(grep -o 'resumed at step [0-9]*' "$out" | head -n 1) of 500)" \
    grep -q "resumed at step" "$out"
  [[ $failures -eq 0 ]] || show_output "$out" 30
  ;;

requeue)
  prep_data || { echo "prep failed"; exit 1; }
  # About 90 s of training on one rank: USR1 comes 60 s before the 2-minute limit (Slurm sends
  # it up to a minute early, never late), so it lands with a third or more of the steps left.
  # Machines differ several-fold in speed: the steps are what this one trains in 90 s, timed on
  # 20 alone (4000 at most, 150 at least); beside its reference run the job trains 1.1 to 1.3
  # times slower than that, never faster (USR1 at step 507 of 604 with a 65-s target: too close).
  # (A cap of 1000 was too low: at 55 ms a step the job ended in 56 s, before USR1 at 60 s.)
  sft_config probe.ini "$work/probe" 20 seq-len=512 global-batch=16 micro-batch=4
  started=$(date +%s%N)
  "$bin" sft --config probe.ini >/dev/null 2>&1
  elapsed_ms=$((($(date +%s%N) - started) / 1000000))
  steps=$((90 * 20 * 1000 / (elapsed_ms > 0 ? elapsed_ms : 1)))
  steps=$((steps > 4000 ? 4000 : (steps < 150 ? 150 : steps)))
  last=$(printf 'step-%08d' "$steps")
  echo "20 steps in $elapsed_ms ms: the job trains $steps steps"
  sft_config long.ini "$work/ckpt" "$steps" seq-len=512 global-batch=16 micro-batch=4 \
    checkpoint-every=$((steps / 10)) log-every=$((steps / 10)) deadline-margin=5
  reference long.ini 1 "$work/ref" &
  ref_pid=$!
  id=$(sbatch --parsable --time=2 --signal=B:USR1@60 "$source_dir/jobs/sft.sbatch" long.ini)
  state=$(wait_job "$id" 540)
  wait "$ref_pid"
  out=l3-sft-$id.out
  check "time-limited job $id completes ($state) after $(job_field "$id" Restarts) requeues" \
    test "$state" = COMPLETED -a "$(job_field "$id" Restarts)" -ge 1
  check "the job got SIGUSR1 and forwarded it" grep -q "SIGUSR1 received: asking llama3-hpc" "$out"
  check "llama3-hpc checkpointed and exited 75 ($(grep -o 'stopped at step [0-9]*' "$out" | head -n 1) of $steps)" \
    grep -q "stopped at step .* (exit 75)" "$out"
  check "the job requeued itself and resumed" grep -q "resumed at step" "$out"
  check "its final weights equal an uninterrupted run's" \
    test -n "$(digest "ref/$last")" -a "$(digest "ckpt/$last")" = "$(digest "ref/$last")"
  [[ $failures -eq 0 ]] || show_output "$out" 40
  ;;

restart)
  prep_data || { echo "prep failed"; exit 1; }
  # Rank 1 is killed once the checkpoint of step 50 is in: about step 75 of 500 (0.5 s polls
  # at ~20 ms a step beside the reference run), 425 steps before the end.
  sft_config long.ini "$work/ckpt" 500 checkpoint-every=50 log-every=50
  reference long.ini 2 "$work/ref" &
  ref_pid=$!
  id=$(sbatch --parsable --ntasks-per-node=2 "$source_dir/jobs/sft.sbatch" long.ini)
  # Once the first checkpoint is in, kill rank 1 (SLURM_PROCID=1 in its environment) with SIGKILL.
  killed=""
  for ((t = 0; t < 240; t++)); do
    [[ -z $killed ]] || break
    if [[ -e ckpt/latest ]]; then
      for pid in $(pgrep -f "sft --config long.ini"); do
        if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx SLURM_PROCID=1; then
          kill -9 "$pid" && killed=$pid
        fi
      done
    fi
    sleep 0.5
  done
  state=$(wait_job "$id" 240)
  wait "$ref_pid"
  out=l3-sft-$id.out
  check "rank 1 killed mid-run (pid ${killed:-none})" test -n "$killed"
  check "job $id completes ($state)" test "$state" = COMPLETED
  check "the restart loop logged the failure and a second attempt" \
    grep -q "attempt 2/3: .* --resume auto" "$out"
  check "the second attempt resumed from a checkpoint ($(grep -o 'resumed at step [0-9]*' "$out" | head -n 1) of 500)" \
    grep -q "resumed at step" "$out"
  check "the final weights equal an uninterrupted run's" \
    test -n "$(digest ref/step-00000500)" -a "$(digest ckpt/step-00000500)" = "$(digest ref/step-00000500)"
  [[ $failures -eq 0 ]] || show_output "$out" 40
  # With node-local checkpoints (every 50 steps, every 2nd flushed to ckpt-dir): rank 1 killed
  # right after the node-local checkpoint of step 150; the restart loop resumes from it, not
  # from ckpt-dir's step 100.
  sft_config local.ini "$work/ckpt-local" 200 log-every=50 "ckpt-local=$work/local/%h" \
    checkpoint-every-local=50 flush-every=2
  reference local.ini 2 "$work/ref-local"
  id=$(L3_FAULT="ckpt.local.complete@1#3=kill" \
    sbatch --parsable --ntasks-per-node=2 "$source_dir/jobs/sft.sbatch" local.ini)
  state=$(wait_job "$id" 240)
  out=l3-sft-$id.out
  check "node-local level: job $id completes ($state)" test "$state" = COMPLETED
  check "... after a second attempt" grep -q "attempt 2/3: .* --resume auto" "$out"
  check "... which resumed from the node-local step 150 (ckpt-dir's newest: 100)" \
    grep -q "resuming from the node-local level at step 150 (--ckpt-dir's newest is step 100)" "$out"
  check "... and ends with the uninterrupted run's weights" \
    test -n "$(digest ref-local/step-00000200)" -a "$(digest ckpt-local/step-00000200)" = "$(digest ref-local/step-00000200)"
  [[ $failures -eq 0 ]] || show_output "$out" 40
  # A job whose every attempt crashes: N attempts, then a loud failure with the last error.
  sft_config crash.ini "$work/ckpt-crash" 20 log-every=5
  id=$(L3_MAX_ATTEMPTS=2 L3_FAULT="train.update@1#3=throw-internal" \
    sbatch --parsable --ntasks-per-node=2 "$source_dir/jobs/sft.sbatch" crash.ini)
  state=$(wait_job "$id" 120)
  out=l3-sft-$id.out
  check "a job failing on every attempt fails ($state)" test "$state" = FAILED
  check "... after 2 attempts, with the last error" grep -q "sft failed 2 times; last error: .*error" "$out"
  [[ $failures -eq 0 ]] || show_output "$out" 20
  ;;

grpo_async)
  # jobs/grpo.sbatch with a generating rank (generation-ranks = 1: 1 generating + 2 training
  # ranks on one node, a verifier command on the generating one), signalled once its first
  # checkpoint is in (USR1 to the batch shell, as --signal=B:USR1 does before the time limit):
  # both groups stop at a checkpoint, exit 75, the job requeues and resumes, and it ends with the
  # weights of the same run uninterrupted under mpiexec.
  prep_data || { echo "prep failed"; exit 1; }
  write_reversal_prompts sft.jsonl prompts.jsonl
  "$bin" prep prompts --input prompts.jsonl --tokenizer bytes --output prompts >/dev/null 2>&1 ||
    { echo "prep prompts failed"; exit 1; }
  sft_config sft.ini "$work/sft-ckpt" 8 seq-len=64 global-batch=8
  "$mpiexec" -n 2 "$bin" sft --config sft.ini >sft.log 2>&1 || { tail -3 sft.log; exit 1; }
  cat >similarity.py <<'PY'
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    answer, completion = r["record"]["answer"], r["completion"].strip()
    same = sum(1 for a, b in zip(answer, completion) if a == b)
    print(json.dumps({"reward": same / max(len(answer), len(completion), 1)}), flush=True)
PY
  {
    echo "init = $work/sft-ckpt"
    echo "data = $work/prompts"
    echo "reward-match = answer"
    echo "reward-command = python3 $work/similarity.py"
    echo "steps = 40"
    echo "seq-len = 64"
    echo "global-batch = 4"
    echo "num-generations = 4"
    echo "micro-batch = 4"
    echo "max-completion-length = 12"
    echo "lr = 1e-3"
    echo "checkpoint-every = 5"
    echo "log-every = 5"
    echo "generation-ranks = 1"
    echo "deterministic = true"
    echo "no-progress = true"
  } >grpo-common.ini
  { cat grpo-common.ini; echo "ckpt-dir = $work/ckpt"; } >grpo.ini
  { cat grpo-common.ini; echo "ckpt-dir = $work/ref"; } >ref.ini
  "$mpiexec" -n 3 "$bin" grpo --config ref.ini >ref.log 2>&1 || { tail -3 ref.log; exit 1; }
  id=$(sbatch --parsable --ntasks-per-node=3 "$source_dir/jobs/grpo.sbatch" grpo.ini)
  for ((t = 0; t < 240; t++)); do
    [[ -e ckpt/latest ]] && break
    sleep 0.5
  done
  scancel --signal=USR1 --batch "$id"
  state=$(wait_job "$id" 240)
  out=l3-grpo-$id.out
  check "grpo.sbatch, 1 generating + 2 training ranks: signalled job $id completes ($state) after $(job_field "$id" Restarts) requeue(s)" \
    test "$state" = COMPLETED -a "$(job_field "$id" Restarts)" -ge 1
  check "... both groups stopped at a checkpoint with exit 75 ($(grep -o 'stopped at step [0-9]*' "$out" | head -n 1))" \
    grep -q "stopped at step .* (exit 75)" "$out"
  check "... and resumed ($(grep -o 'resumed at step [0-9]*' "$out" | head -n 1) of 40)" \
    grep -q "resumed at step" "$out"
  check "... to the uninterrupted run's weights (not the initial ones)" \
    test -n "$(digest ref/step-00000040)" -a "$(digest ckpt/step-00000040)" = "$(digest ref/step-00000040)" \
    -a "$(digest ref/step-00000040)" != "$(digest "$work/sft-ckpt/step-00000008")"
  [[ $failures -eq 0 ]] || show_output "$out" 40
  ;;

pipeline)
  # Each stage's sbatch line, from a stand-in sbatch that records its arguments ([word] each).
  mkdir -p fake-bin
  cat >fake-bin/sbatch <<'EOF'
#!/usr/bin/env bash
calls=0
[[ -f $FAKE_SBATCH_LOG ]] && calls=$(wc -l <"$FAKE_SBATCH_LOG")
{ printf '[%s]' "$@"; echo; } >>"$FAKE_SBATCH_LOG"
echo "$((101 + calls))"
EOF
  chmod +x fake-bin/sbatch
  touch p.ini s.ini r.ini d.ini g.ini
  export FAKE_SBATCH_LOG=$work/sbatch-lines
  PATH="$work/fake-bin:$PATH" "$source_dir/jobs/pipeline.sh" --prep p.ini --sft s.ini \
    --reward r.ini --dpo d.ini --grpo g.ini --prep-sbatch '--partition=cpu --ntasks-per-node=32' \
    --train-sbatch='--partition=gpu --gres=gpu:4' --dpo-sbatch --time=04:00:00 \
    --grpo-sbatch "--comment='two words'" -- --account=proj >/dev/null
  line=()
  [[ -f $FAKE_SBATCH_LOG ]] && mapfile -t line <"$FAKE_SBATCH_LOG"
  check "pipeline.sh: 5 sbatch calls" test "${#line[@]}" = 5
  check "... prep: every stage's options and its own, not the training's" \
    grep -q '^\[--parsable\]\[--account=proj\]\[--partition=cpu\]\[--ntasks-per-node=32\]\[[^]]*/prep\.sbatch\]\[p\.ini\]$' <<<"${line[0]-}"
  check "... sft: every stage's, then the training stages'" \
    grep -q '\[--kill-on-invalid-dep=yes\]\[--account=proj\]\[--partition=gpu\]\[--gres=gpu:4\]\[[^]]*/sft\.sbatch\]' <<<"${line[1]-}"
  check "... dpo: after sft (job 102), its own options last" \
    grep -q '^\[--parsable\]\[--dependency=afterok:102\].*\[--gres=gpu:4\]\[--time=04:00:00\]\[[^]]*/dpo\.sbatch\]' <<<"${line[3]-}"
  check "... grpo: a quoted value stays one word" grep -q '\[--comment=two words\]\[[^]]*/grpo\.sbatch\]' <<<"${line[4]-}"
  check "... options for a stage not given are refused (exit 2)" \
    test "$(PATH="$work/fake-bin:$PATH" "$source_dir/jobs/pipeline.sh" --sft s.ini --reward-sbatch -N2 2>&1; echo "rc $?")" \
    = "pipeline.sh: --reward-sbatch given without --reward"$'\n'"rc 2"
  [[ $failures -eq 0 ]] || printf '%s\n' "${line[@]}"
  # The example configs of jobs/: every key an option of their command (a plan of the tiny model).
  plans() { "$bin" "$1" --config "$2" --model tiny --dry-run-memory --dry-run-ranks 8 >/dev/null 2>&1; }
  for phase in dpo grpo; do
    sed '/^init =/d' "$source_dir/jobs/$phase.ini" >"example-$phase.ini"
    check "jobs/$phase.ini: every key is a '$phase' option" plans "$phase" "example-$phase.ini"
  done
  printf 'kind = sft\ninput = %s/sft.jsonl\ntokenizer = bytes\noutput = %s/sft\n' "$work" "$work" >prep-sft.ini
  printf 'kind = preference\ninput = %s/pref.jsonl\ntokenizer = bytes\noutput = %s/pref\n' "$work" "$work" >prep-pref.ini
  sed 's/"completion"/"answer"/' "$work/sft.jsonl" >"$work/prompts.jsonl"
  printf 'kind = prompts\ninput = %s/prompts.jsonl\ntokenizer = bytes\noutput = %s/prompts\n' "$work" "$work" >prep-prompts.ini
  sft_config sft.ini "$work/ckpt-sft" 12 log-every=4
  {
    echo "init = $work/ckpt-sft"
    echo "data = $work/pref"
    echo "steps = 8"
    echo "seq-len = 128"
    echo "global-batch = 8"
    echo "micro-batch = 2"
    echo "ckpt-dir = $work/ckpt-rm"
    echo "no-progress = true"
  } >reward.ini
  {
    sed -e "s|ckpt-rm|ckpt-dpo|" reward.ini
    echo "log-every = 1"
  } >dpo.ini
  {
    echo "init = $work/ckpt-sft"
    echo "data = $work/prompts"
    echo "reward-match = answer"
    echo "reward-model = $work/ckpt-rm"
    echo "steps = 2"
    echo "seq-len = 128"
    echo "global-batch = 2"
    echo "num-generations = 4"
    echo "max-completion-length = 16"
    echo "micro-batch = 4"
    echo "log-every = 1"
    echo "ckpt-dir = $work/ckpt-grpo"
    echo "no-progress = true"
  } >grpo.ini
  mapfile -t jobs < <("$source_dir/jobs/pipeline.sh" --prep prep-sft.ini --prep prep-pref.ini \
    --prep prep-prompts.ini --sft sft.ini --reward reward.ini --dpo dpo.ini --grpo grpo.ini \
    --train-sbatch --ntasks-per-node=2 -- --comment=l3-pipeline)
  check "pipeline.sh submits 5 jobs (${jobs[*]})" test "${#jobs[@]}" = 5
  check "prep runs on 1 task, the training stages on 2 (--train-sbatch), all with the -- options" \
    test "$(for job in "${jobs[@]}"; do echo -n "$(job_field "${job#* }" NumTasks)/$(job_field "${job#* }" Comment) "; done)" \
    = "1/l3-pipeline 2/l3-pipeline 2/l3-pipeline 2/l3-pipeline 2/l3-pipeline "
  sft_id=${jobs[1]#sft }
  check "sft waits for prep (afterok)" grep -q "afterok:${jobs[0]#prep }" <<<"$(job_field "$sft_id" Dependency)"
  reward_id=${jobs[2]#reward }
  dpo_id=${jobs[3]#dpo }
  check "dpo waits for sft, not for reward" grep -q "afterok:$sft_id" <<<"$(job_field "$dpo_id" Dependency)"
  grpo_id=${jobs[4]#grpo }
  check "grpo waits for reward" grep -q "afterok:$reward_id" <<<"$(job_field "$grpo_id" Dependency)"
  state=$(wait_job "$reward_id" 240)
  state=$(wait_job "$dpo_id" 240)
  state=$(wait_job "$grpo_id" 240)
  for job in "${jobs[@]}"; do
    check "stage ${job% *} (job ${job#* }) completed" test "$(job_state "${job#* }")" = COMPLETED
  done
  check "the reward model's checkpoint verifies" "$bin" ckpt verify --quick ckpt-rm
  check "... and started from the SFT model" grep -q "model from $work/ckpt-sft" "l3-reward-$reward_id.out"
  check "the DPO policy's checkpoint verifies" "$bin" ckpt verify --quick ckpt-dpo
  check "... its first step's loss log 2 against the SFT model" \
    grep -q "step 1/8 | loss 0.6931 | acc 0.000" "l3-dpo-$dpo_id.out"
  check "the GRPO policy's checkpoint verifies" "$bin" ckpt verify --quick ckpt-grpo
  check "... its steps report their rewards" grep -q "step 2/2 | loss .* | reward " "l3-grpo-$grpo_id.out"
  check "... scored by the reward stage's model too" grep -q "GRPO reward model: $work/ckpt-rm" "l3-grpo-$grpo_id.out"
  [[ $failures -eq 0 ]] || for f in l3-*.out; do show_output "$f"; done
  # A failing first stage: the later ones are cancelled, not left pending.
  printf 'kind = sft\ninput = %s/missing.jsonl\ntokenizer = bytes\noutput = %s/x\n' "$work" "$work" >bad-prep.ini
  mapfile -t jobs < <("$source_dir/jobs/pipeline.sh" --prep bad-prep.ini --sft sft.ini)
  state=$(wait_job "${jobs[1]#sft }" 60)
  check "after a failed prep ($(job_state "${jobs[0]#prep }")) the sft stage is cancelled ($state)" \
    test "$(job_state "${jobs[0]#prep }")" = FAILED -a "$state" = CANCELLED
  ;;

*)
  echo "unknown case '$case_name'"
  exit 2
  ;;
esac

echo "$failures failure(s)"
[[ $failures -eq 0 ]]
