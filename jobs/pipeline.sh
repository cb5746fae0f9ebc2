#!/usr/bin/env bash
# Submit the whole pipeline as chained Slurm jobs: prep -> sft -> reward and/or dpo -> grpo, each
# starting when the one it needs finished successfully (--dependency=afterok; a failed stage cancels
# the rest). dpo needs the SFT stage only: it runs beside the reward stage when both are given;
# grpo runs after the reward stage (it may score with that model), else after SFT.
#   jobs/pipeline.sh [--prep DATA.ini]... [--sft SFT.ini] [--reward RM.ini] [--dpo DPO.ini]
#       [--grpo GRPO.ini] [--STAGE-sbatch 'OPTIONS']... [-- SBATCH_OPTIONS]
#
# Stages not given are left out (at least one is needed). Each stage's sbatch gets, in this order:
#   -- SBATCH_OPTIONS          every stage (account, QOS, mail)
#   --train-sbatch 'OPTIONS'   the training stages: sft, reward, dpo, grpo (GPUs, nodes, time)
#   --STAGE-sbatch 'OPTIONS'   that stage only: --prep-sbatch, --sft-sbatch, --reward-sbatch,
#                              --dpo-sbatch, --grpo-sbatch
# so the prep job does not get the training's GPUs. OPTIONS is split into words as the shell
# splits them (quotes keep blanks); each --*-sbatch may be repeated, and may be written with '='.
# An option that comes twice on a stage's line takes its later, more specific value. E.g.
#   jobs/pipeline.sh --prep sft-data.ini --prep pairs.ini --sft sft.ini --reward rm.ini \
#       --prep-sbatch '--partition=cpu --ntasks-per-node=32' \
#       --train-sbatch '--partition=gpu --nodes=2 --gpus-per-node=4 --ntasks-per-node=4' \
#       --dpo-sbatch --time=04:00:00 -- --account=proj42
# Example configs: jobs/dpo.ini, jobs/grpo.ini (the others: docs/HPC.md). Prints the job ids, one
# per line as "stage id", and exits non-zero if a submission failed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

usage() {
  sed -n '6,/^[^#]/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}

# add_words ARRAY OPTION TEXT: TEXT split into words as the shell would (blanks, quotes,
# backslashes: xargs's rules), appended to ARRAY.
add_words() {
  local -n words_into=$1
  local -a words=()
  xargs -r true <<<"$3" 2>/dev/null ||
    { echo "pipeline.sh: $2: cannot split '$3' into sbatch options (an unclosed quote?)" >&2; exit 2; }
  mapfile -d '' -t words < <(xargs -r printf '%s\0' <<<"$3")
  words_into+=("${words[@]}")
}

preps=()
sft=""
reward=""
dpo=""
grpo=""
# Each stage's own sbatch options, and the training stages' (used through namerefs).
# shellcheck disable=SC2034
prep_sbatch=() sft_sbatch=() reward_sbatch=() dpo_sbatch=() grpo_sbatch=() train_sbatch=()
while (($#)); do
  [[ $1 == --?*=* ]] && set -- "${1%%=*}" "${1#*=}" "${@:2}"  # --option=value
  case $1 in
    --prep) preps+=("${2:?--prep needs a config file}"); shift 2 ;;
    --sft) sft=${2:?--sft needs a config file}; shift 2 ;;
    --reward) reward=${2:?--reward needs a config file}; shift 2 ;;
    --dpo) dpo=${2:?--dpo needs a config file}; shift 2 ;;
    --grpo) grpo=${2:?--grpo needs a config file}; shift 2 ;;
    --prep-sbatch | --sft-sbatch | --reward-sbatch | --dpo-sbatch | --grpo-sbatch | --train-sbatch)
      (($# >= 2)) || { echo "pipeline.sh: $1 needs sbatch options (quote several: $1 '--partition=P --time=T')" >&2; exit 2; }
      stage=${1#--}
      add_words "${stage%-sbatch}_sbatch" "$1" "$2"
      shift 2
      ;;
    -h | --help) usage 0 ;;
    --) shift; break ;;
    *) echo "pipeline.sh: unknown argument '$1'" >&2; usage 2 ;;
  esac
done
sbatch_options=("$@")
((${#preps[@]})) || [[ -n $sft || -n $reward || -n $dpo || -n $grpo ]] || { echo "pipeline.sh: no stage given" >&2; usage 2; }
# Options for a stage that is not given are a mistake (a misspelt stage, a forgotten config).
for stage in prep sft reward dpo grpo; do
  declare -n given_options=${stage}_sbatch
  if ((${#given_options[@]})); then
    if [[ $stage == prep ]]; then ((${#preps[@]})); else [[ -n ${!stage} ]]; fi ||
      { echo "pipeline.sh: --$stage-sbatch given without --$stage" >&2; exit 2; }
  fi
  unset -n given_options
done
stages=("${preps[@]}")
[[ -n $sft ]] && stages+=("$sft")
[[ -n $reward ]] && stages+=("$reward")
[[ -n $dpo ]] && stages+=("$dpo")
[[ -n $grpo ]] && stages+=("$grpo")
for config in "${stages[@]}"; do
  [[ -f $config && -r $config ]] || { echo "pipeline.sh: config file '$config' not found or not readable" >&2; exit 2; }
done
command -v sbatch >/dev/null || { echo "pipeline.sh: sbatch not found (run this on a Slurm login node)" >&2; exit 2; }

previous=""
# submit STAGE SCRIPT CONFIG...: sbatch after the previous stage, with every stage's options, the
# training stages' (not for prep) and the stage's own; prints and remembers the job id.
submit() {
  local stage=$1 script=$2
  shift 2
  local -n own_options=${stage}_sbatch
  local -a dependency=() options=("${sbatch_options[@]}")
  [[ -n $previous ]] && dependency=(--dependency="afterok:$previous" --kill-on-invalid-dep=yes)
  if [[ $stage != prep ]]; then options+=("${train_sbatch[@]}"); fi
  options+=("${own_options[@]}")
  previous=$(sbatch --parsable "${dependency[@]}" "${options[@]}" "$here/$script" "$@")
  previous=${previous%%;*}  # --parsable prints "id" or "id;cluster"
  echo "$stage $previous"
}

((${#preps[@]})) && submit prep prep.sbatch "${preps[@]}"
[[ -n $sft ]] && submit sft sft.sbatch "$sft"
after_sft=$previous
[[ -n $reward ]] && submit reward reward.sbatch "$reward"
after_reward=$previous
if [[ -n $dpo ]]; then
  previous=$after_sft
  submit dpo dpo.sbatch "$dpo"
fi
if [[ -n $grpo ]]; then
  previous=$after_reward
  submit grpo grpo.sbatch "$grpo"
fi
exit 0
