#!/usr/bin/env bash
# Submit the whole pipeline as chained Slurm jobs: prep -> sft -> reward and/or dpo -> grpo, each
# starting when the one it needs finished successfully (--dependency=afterok; a failed stage cancels
# the rest). dpo needs the SFT stage only: it runs beside the reward stage when both are given;
# grpo runs after the reward stage (it may score with that model), else after SFT.
#   jobs/pipeline.sh [--prep DATA.ini]... [--sft SFT.ini] [--reward RM.ini] [--dpo DPO.ini]
#       [--grpo GRPO.ini] [-- SBATCH]
#
# Stages not given are left out (at least one is needed). SBATCH_OPTIONS go to every sbatch, e.g.
#   jobs/pipeline.sh --prep sft-data.ini --prep pairs.ini --sft sft.ini --reward rm.ini \
#       -- --account=proj42 --partition=gpu
# Prints the job ids, one per line as "stage id", and exits non-zero if a submission failed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

usage() {
  sed -n '6,11p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}

preps=()
sft=""
reward=""
dpo=""
grpo=""
while (($#)); do
  case $1 in
    --prep) preps+=("${2:?--prep needs a config file}"); shift 2 ;;
    --sft) sft=${2:?--sft needs a config file}; shift 2 ;;
    --reward) reward=${2:?--reward needs a config file}; shift 2 ;;
    --dpo) dpo=${2:?--dpo needs a config file}; shift 2 ;;
    --grpo) grpo=${2:?--grpo needs a config file}; shift 2 ;;
    -h | --help) usage 0 ;;
    --) shift; break ;;
    *) echo "pipeline.sh: unknown argument '$1'" >&2; usage 2 ;;
  esac
done
sbatch_options=("$@")
((${#preps[@]})) || [[ -n $sft || -n $reward || -n $dpo || -n $grpo ]] || { echo "pipeline.sh: no stage given" >&2; usage 2; }
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
# submit STAGE SCRIPT CONFIG...: sbatch after the previous stage; prints and remembers the job id.
submit() {
  local stage=$1 script=$2
  shift 2
  local -a dependency=()
  [[ -n $previous ]] && dependency=(--dependency="afterok:$previous" --kill-on-invalid-dep=yes)
  previous=$(sbatch --parsable "${dependency[@]}" "${sbatch_options[@]}" "$here/$script" "$@")
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
