#include <algorithm>
#include <array>

#include "cli/ckpt_command.hpp"
#include "cli/command.hpp"
#include "cli/demo_command.hpp"
#include "cli/eval_command.hpp"
#include "cli/export_command.hpp"
#include "cli/generate_command.hpp"
#include "cli/info_command.hpp"
#include "cli/prep_command.hpp"
#include "cli/report_command.hpp"
#include "cli/score_command.hpp"
#include "cli/tokenize_command.hpp"
#include "cli/train_command.hpp"

namespace l3::cli {

namespace {

// Order = the order of `llama3-hpc --help`: the pipeline first, tools after.
constexpr std::array kCommands = {
    Command{.name = "prep",
            .summary = "Tokenize JSONL (SFT, preference or prompts) into HDF5 training shards",
            .usage = "prep sft|preference|prompts --input FILE.jsonl --tokenizer FILE|bytes "
                     "--output DIR",
            .description =
                "Tokenizes records with the Llama 3 tokenizer and chat template and writes HDF5 "
                "shards plus index.json, each rank its share of the input. Records: SFT "
                R"({"messages": [...]}, {"prompt", "completion"} or {"text"}; preference )"
                R"({"prompt", "chosen", "rejected"[, "margin"]}; prompts (for grpo) {"prompt"} )"
                R"(or {"messages"}, their other fields (an "answer") kept for the rewards. See )"
                "docs/FORMAT.md.",
            .declare = declare_prep_options,
            .run = run_prep},
    Command{
        .name = "sft",
        .summary = "Supervised fine-tuning (cross-entropy on response tokens)",
        .usage =
            "sft (--init MODEL | --model PRESET|config.json) --data DIR [--ckpt-dir DIR] [options]",
        .description =
            "Trains a Llama 3 model on SFT shards (cross-entropy on the response tokens) "
            "with data parallelism over the MPI ranks and a ZeRO-1 sharded AdamW; evaluates "
            "on --val-data, writes metrics.jsonl and checkpoints. See docs/TRAINING.md.",
        .declare = declare_sft_options,
        .run = run_sft,
        .stops_cleanly = true},
    Command{.name = "reward",
            .summary = "Reward-model training (Bradley-Terry on preference pairs)",
            .usage = "reward --init SFT_MODEL --data DIR [--ckpt-dir DIR] [options]",
            .description = "Adds a scalar score head to an SFT model and trains it on preference "
                           "shards with the Bradley-Terry loss, -log sigmoid(r_chosen - r_rejected "
                           "[- margin]). See docs/TRAINING.md.",
            .declare = declare_reward_options,
            .run = run_reward,
            .stops_cleanly = true},
    Command{.name = "dpo",
            .summary = "Direct preference optimisation of the policy on preference pairs",
            .usage = "dpo --init SFT_MODEL --data DIR [--ckpt-dir DIR] [options]",
            .description =
                "Trains the policy (a causal LM, from an SFT checkpoint or Hugging Face model, "
                "which is also the reference) on preference shards with the DPO loss, "
                "-log sigmoid(beta [(log pi(c) - log ref(c)) - (log pi(r) - log ref(r))]) over "
                "the responses' tokens. With LoRA the base model is the reference; otherwise "
                "the reference's log-probabilities are computed once and stored. See "
                "docs/TRAINING.md.",
            .declare = declare_dpo_options,
            .run = run_dpo,
            .stops_cleanly = true},
    Command{.name = "grpo",
            .summary = "Online RL: the policy trained on its own completions, scored (GRPO, RLOO)",
            .usage = "grpo --init SFT_MODEL --data PROMPTS (--environment CMD | --reward-match "
                     "answer | --reward-command CMD | --reward-model CKPT)... [--ckpt-dir DIR] "
                     "[options]",
            .description =
                "Each step samples --num-generations completions of every prompt with the "
                "generation engine on the weights being trained (with --environment, "
                "multi-turn episodes: a program answers each turn with tool results or user "
                "replies), scores them (the environment's reward, the built-in answer match, a "
                "verifier command, a reward model), turns each group's rewards into advantages "
                "and trains the policy with the clipped surrogate loss of TRL's GRPOTrainer "
                "(--loss-type dapo, grpo, dr_grpo, bnpo). See docs/TRAINING.md.",
            .declare = declare_grpo_options,
            .run = run_grpo,
            .stops_cleanly = true},
    Command{.name = "eval",
            .summary = "Evaluate a model: loss/perplexity, reward accuracy, DPO's metrics or "
                       "exact answers",
            .usage = "eval --init CKPT --data DIR [options]",
            .description =
                "Runs a checkpoint over a whole dataset on the available ranks and prints one "
                R"(JSON object on one line: {"loss", "perplexity", "tokens"} for SFT data, )"
                R"({"accuracy", "margin", "reward_mean", "reward_std", "pairs"} for preference )"
                "data (token- and pair-weighted; a DPO checkpoint: DPO's metrics), and for "
                "prompt data (prep prompts) the exact-answer accuracy of greedy completions, as "
                R"(grpo's evaluation computes it: {"rewards/answer_match/mean", )"
                R"("completions/mean_length", "completions/truncated", "prompts"}.)",
            .declare = declare_eval_options,
            .run = run_eval},
    Command{.name = "generate",
            .summary = "Generate text from a model (greedy, temperature, top-p)",
            .usage = "generate --init CKPT (--prompt TEXT [--chat] | --input FILE.jsonl --output "
                     "FILE.jsonl) [options]",
            .description =
                "Continues a prompt (or answers it as a chat turn with --chat) with a model "
                "loaded from a checkpoint: greedy, or sampled with temperature and top-p, with a "
                "KV cache, on the CPU. Runs on rank 0. With --input, a batch job on every rank: "
                "completions of every prompt record of a JSONL file, written in input order to "
                "--output; SIGTERM, SIGUSR1 or --deadline save its progress (exit 75) and the "
                "same command continues.",
            .declare = declare_generate_options,
            .run = run_generate,
            .stops_cleanly = true},
    Command{.name = "score",
            .summary = "Score prompt+response pairs with a reward model",
            .usage = "score --init CKPT (--prompt TEXT --response TEXT | --input FILE.jsonl)",
            .description =
                "Prints the reward a reward-model checkpoint gives to a response, or to the "
                "chosen and rejected sides of preference records (JSON lines and a summary: "
                "accuracy, mean margin). Formats them as 'prep preference' does. Runs on rank 0.",
            .declare = declare_score_options,
            .run = run_score},
    Command{.name = "export",
            .summary = "Export a checkpoint as a Hugging Face model directory",
            .usage = "export --ckpt CKPT --output DIR [--merge|--adapter] [--dtype bf16|fp32] "
                     "[--shard-size 5GB] [--overwrite]",
            .description =
                "Writes a Hugging Face model directory that transformers and vLLM load: an SFT "
                "checkpoint as LlamaForCausalLM, a reward checkpoint as "
                "LlamaForSequenceClassification; config.json, generation_config.json, "
                "safetensors (sharded with an index above --shard-size) and the tokenizer files "
                "when known. Written to DIR.partial, renamed when complete. See docs/HF.md.",
            .declare = declare_export_options,
            .run = run_export},
    Command{.name = "tokenize",
            .summary = "Tokenize JSONL text on stdin into token ids on stdout",
            .usage = "tokenize --tokenizer FILE|bytes [--bos] [--eos] [--prep sft|preference] < "
                     "in.jsonl > out.jsonl",
            .description =
                R"(Reads {"text": ...} lines and writes {"ids": [...]} lines, encoding the text )"
                "exactly as Meta's Llama 3 tokenizer does (special-token text stays text).",
            .declare = declare_tokenize_options,
            .run = run_tokenize},
    Command{.name = "ckpt",
            .summary = "List, verify or prune checkpoints",
            .usage = "ckpt list|verify|prune DIR [options]",
            .description =
                "DIR is a checkpoint root (a run's --ckpt-dir) or one step directory. list: "
                "steps, phase, ranks, size and state (complete, partial, damaged, latest); "
                "verify: manifest, files and every slice's checksum (exit 2 naming any damaged "
                "checkpoint; --json adds per-tensor digests that compare runs of any size); "
                "prune: keep the newest --keep-last complete checkpoints.",
            .declare = declare_ckpt_options,
            .run = run_ckpt},
    Command{.name = "report",
            .summary = "Charts of training runs' metrics as one HTML page",
            .usage = "report RUN... --output FILE.html",
            .description =
                "Reads the metrics files of one or more runs (a --metrics file, or a directory "
                "of them such as the demo's workdir) and writes one self-contained HTML page: a "
                "summary table, then per phase the loss with evaluations, checkpoints and "
                "restarts, the phase's own metrics, learning rate, gradient norm, tokens/s and "
                "data wait against the step, the runs overlaid. No network or JavaScript needed "
                "to view it. Runs on rank 0. See docs/CLI.md.",
            .declare = declare_report_options,
            .run = run_report},
    Command{.name = "demo",
            .summary = "Run the built-in demo: prep, SFT, reward model, DPO, GRPO, evaluation",
            .usage = "demo [--workdir DIR]",
            .description =
                "Writes a small built-in instruction dataset, preference dataset and prompt "
                "dataset with exact answers, prepares them with the built-in bytes tokenizer, "
                "fine-tunes a tiny model on them (SFT), trains a reward model from its "
                "checkpoint and the SFT model by DPO and by GRPO, prints the evaluation results, "
                "writes the report (report.html) and prints what to run next with your own "
                "data. Its time and results depend on the machine: docs/TRAINING.md (\"The "
                "demo\") lists measured runs. Run it under mpiexec to use several ranks.",
            .declare = declare_demo_options,
            .run = run_demo},
    Command{.name = "info",
            .summary = "Report ranks, nodes, CPU binding, devices, backends and libraries",
            .usage = "info [--json]",
            .description = "Gathers what every rank sees and checks collectives across the "
                           "world. Run it under the same launcher as your job (srun, mpiexec) "
                           "to see where the ranks landed.",
            .declare = declare_info_options,
            .run = run_info},
};

}  // namespace

std::span<const Command> command_table() noexcept { return kCommands; }

const Command* find_command(std::string_view name) noexcept {
  const auto* found = std::find_if(kCommands.begin(), kCommands.end(),
                                   [&](const Command& c) { return c.name == name; });
  return found == kCommands.end() ? nullptr : found;
}

}  // namespace l3::cli
