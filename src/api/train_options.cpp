#include "api/train_options.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "ckpt/peft_adapter.hpp"
#include "core/deadline.hpp"
#include "core/error.hpp"
#include "core/option_domain.hpp"
#include "kernels/backend_options.hpp"

namespace l3::api {

namespace {

// The bounds of the size options: far beyond any run, so that a mistyped number is named at once
// (the memory plan then bounds what a real run allocates).
constexpr double kMaxSeqLen = 1 << 24;  // model::kMaxPositions
constexpr double kMaxBatch = 1 << 24;
constexpr double kMaxSteps = 1e15;
constexpr double kMinBeta = 1e-6;  // DPO's --beta
constexpr double kMaxBeta = 1e6;
const core::Domain kUnitInterval{.lowest = 0, .highest = 1, .highest_excluded = true};

// GRPO's own options, named and defaulted after TRL's GRPOConfig (kebab-case).
void declare_grpo_options(po::options_description& options) {
  const train::GrpoSettings d;
  options.add_options()(
      "num-generations",
      core::number<std::int64_t>(core::between(2, 1 << 16))
          ->default_value(d.num_generations)
          ->value_name("G"),
      "completions sampled per prompt (a group, whose rewards set each other's baseline)")(
      "max-completion-length",
      core::number<std::int64_t>(core::between(1, kMaxSeqLen))
          ->default_value(d.max_completion_length)
          ->value_name("N"),
      "new tokens a completion may have; prompts longer than --seq-len - N are left out")(
      "temperature",
      core::number<double>(core::Domain{.lowest = 0, .lowest_excluded = true, .highest = 100})
          ->default_value(d.temperature)
          ->value_name("T"),
      "sampling temperature of the completions")(
      "top-p",
      core::number<double>(core::Domain{.lowest = 0, .lowest_excluded = true, .highest = 1})
          ->default_value(d.top_p)
          ->value_name("P"),
      "nucleus sampling: draw from the most likely tokens whose probabilities add up to P")(
      "top-k",
      core::number<std::int64_t>(core::between(0, 1 << 24))
          ->default_value(d.top_k)
          ->value_name("K"),
      "draw from the K most likely tokens (0: all)")(
      "beta",
      core::number<double>(core::between(0, kMaxBeta))->default_value(d.beta)->value_name("B"),
      "weight of the KL to the reference (k3 estimator); 0: no reference is kept")(
      "epsilon",
      core::number<double>(core::between(0, 1))->default_value(d.epsilon)->value_name("EPS"),
      "clipping of the probability ratio: [1 - EPS, 1 + EPS-HIGH]")(
      "epsilon-high", core::number<double>(core::between(0, 100))->value_name("EPS"),
      "upper clipping bound (DAPO's clip-higher; default --epsilon)")(
      "loss-type", po::value<std::string>()->default_value("dapo")->value_name("TYPE"),
      "grpo (per-completion means), bnpo (per-micro-batch token means), dr_grpo (sum / "
      "(completions x max-completion-length)) or dapo (the step's token mean)")(
      "scale-rewards",
      po::value<std::string>()->default_value("group")->value_name("group|batch|none"),
      "divide advantages by the group's reward std, the batch's, or nothing")(
      "advantage", po::value<std::string>()->default_value("grpo")->value_name("grpo|rloo"),
      "baseline: the group's mean reward (GRPO) or the mean of the other completions (RLOO)")(
      "num-iterations",
      core::number<std::int64_t>(core::between(1, 1024))
          ->default_value(d.num_iterations)
          ->value_name("N"),
      "optimizer steps per generation batch")(
      "generation-ranks", core::number<std::int64_t>(core::between(1, 65536))->value_name("N"),
      "asynchronous GRPO: the last N ranks generate and score while the others train, with a "
      "fixed lag (--max-staleness); default: every rank generates, then trains")(
      "max-staleness", core::number<std::int64_t>(core::between(0, 64))->value_name("S"),
      "with --generation-ranks: step k trains on completions of the policy after step k-1-S "
      "(with --num-iterations N: a batch's N steps on those of the policy S batches older); "
      "fixed, so runs are reproducible; default 1; 0: on-policy")(
      "mask-truncated-completions", po::bool_switch(),
      "leave completions cut by --max-completion-length out of the loss")(
      "no-importance-sampling-correction", po::bool_switch(),
      "do not weigh each token's loss by the ratio of the trainer's to the generator's "
      "probability (TRL's vllm_importance_sampling_correction=False)")(
      "importance-sampling-mode",
      po::value<std::string>()->default_value("sequence_mask")->value_name("MODE"),
      "the ratio per completion (sequence_*) or per token (token_*), set to 0 outside its bounds "
      "(*_mask) or clipped into them (*_truncate)")(
      "importance-sampling-clip-max",
      po::value<std::string>()->default_value("3")->value_name("C|none"),
      "the ratio's upper bound")(
      "importance-sampling-clip-min",
      po::value<std::string>()->default_value("none")->value_name("C|none"),
      "the ratio's lower bound")(
      "raw-logprobs", po::bool_switch(),
      "compute the log-probabilities (policy, old policy, reference, generator) and the entropy "
      "from the raw logits; default: from the logits divided by --temperature, as TRL")(
      "pad-completions", po::bool_switch(),
      "give each completion a row of --seq-len in the training passes (slower: for comparison); "
      "default: completions and their prompts packed end to end, as SFT packs documents")(
      "environment", po::value<std::string>()->value_name("\"CMD ARGS\""),
      "multi-turn episodes: after each policy turn the environment reads the conversation (one "
      "JSON line) and answers with messages to append or the episode's {\"reward\": x}")(
      "max-turns", core::number<std::int64_t>(core::between(1, 1024))->value_name("N"),
      "policy turns per episode at most (default 8; with --environment)")(
      "reward-match", po::value<std::string>()->value_name("answer"),
      "built-in reward: 1 when the completion, stripped, equals the record's \"answer\", else 0")(
      "reward-command", po::value<std::string>()->value_name("\"CMD ARGS\""),
      "a verifier: one JSON request per line on its stdin ({prompt, completion, record}), one "
      "{\"reward\": x} line back per request")(
      "reward-timeout",
      core::number<double>(core::Domain{.lowest = 0, .lowest_excluded = true, .highest = 86400})
          ->default_value(d.reward_timeout)
          ->value_name("SECONDS"),
      "how long the verifier (or the environment) may take to answer one request")(
      "reward-weights", po::value<std::string>()->value_name("W,W,..."),
      "weights of the rewards in use, in the order environment, answer-match, command, model "
      "(default all 1)")(
      "reward-model", po::value<std::string>()->value_name("CKPT"),
      "a reward model scores each completion as `score` does: a reward checkpoint, a Hugging "
      "Face LlamaForSequenceClassification directory, or a base with --reward-adapter")(
      "reward-adapter", po::value<std::string>()->value_name("DIR"),
      "a LoRA reward adapter in PEFT's format (SEQ_CLS) folded into --reward-model")(
      "log-completions", po::value<std::string>()->value_name("FILE"),
      "write every sample as a JSON line {step, record, completion, ids, reward, advantage}")(
      "tokenizer", po::value<std::string>()->value_name("FILE|bytes"),
      "what decodes completions for the rewards (default: the one the prompts were prepared "
      "with)");
}

// --reward-weights "1,0.5": finite numbers.
std::vector<double> parse_weights(const std::string& text) {
  std::vector<double> weights;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    std::size_t used = 0;
    double w = 0;
    try {
      w = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || !std::isfinite(w)) {
      throw core::usage_error(
          fmt::format("--reward-weights {}: '{}' is not a number (give W,W,...)", text, item));
    }
    weights.push_back(w);
    at = comma + 1;
  }
  return weights;
}

void declare_common(po::options_description& o, train::Phase phase) {
  const train::TrainConfig d;
  const bool sft = phase == train::Phase::sft;
  o.add_options()("model", po::value<std::string>()->value_name("PRESET|config.json"),
                  "model preset (tiny, llama3.2-1b, llama3-8b, ...) or a Hugging Face config.json "
                  "(random initial weights unless --init)")(
      "init", po::value<std::string>()->value_name("CKPT"),
      sft ? "start from this checkpoint (a step directory, or a checkpoint root: its latest) or "
            "Hugging Face model directory (LlamaForCausalLM)"
      : phase == train::Phase::dpo
          ? "the SFT checkpoint or Hugging Face model (LlamaForCausalLM) the policy starts from; "
            "it is also the reference model"
      : phase == train::Phase::grpo
          ? "the SFT checkpoint or Hugging Face model (LlamaForCausalLM) the policy starts from "
            "(with LoRA, its base is the reference of --beta)"
          : "the SFT checkpoint or Hugging Face model directory whose backbone the reward model "
            "starts from (or a LlamaForSequenceClassification model, head included)")(
      "data", po::value<std::string>()->value_name("DIR"),
      sft                           ? "SFT dataset (made by 'prep sft')"
      : phase == train::Phase::grpo ? "prompt dataset (made by 'prep prompts')"
                                    : "preference dataset (made by 'prep preference')")(
      "val-data", po::value<std::string>()->value_name("DIR"),
      "validation dataset, evaluated every --eval-every steps and at the end")(
      "seq-len",
      core::number<std::int64_t>(core::between(1, kMaxSeqLen))
          ->default_value(d.seq_len)
          ->value_name("N"),
      sft ? "tokens per row (documents packed into it)"
      : phase == train::Phase::grpo
          ? "tokens per row: a prompt and its completion (prompts longer than --seq-len - "
            "--max-completion-length are left out, with a warning)"
          : "tokens per row: a pair's prompt and response (each side its own row)")(
      "global-batch", core::number<std::int64_t>(core::between(1, kMaxBatch))->value_name("N"),
      sft ? "rows of --seq-len tokens per optimizer step, over all ranks (required)"
      : phase == train::Phase::grpo
          ? "prompts per optimizer step, over all ranks (required): each gives "
            "--num-generations completions, generated and trained on one rank"
          : "preference pairs per optimizer step, over all ranks (required)")(
      "micro-batch",
      core::number<std::int64_t>(core::between(1, kMaxBatch))
          ->default_value(d.micro_batch)
          ->value_name("N"),
      sft ? "rows per rank and forward/backward pass; gradient accumulation = global / (ranks x "
            "micro)"
      : phase == train::Phase::grpo
          ? "completions per rank and forward/backward pass (one per row)"
          : "pairs per rank and forward/backward pass; gradient accumulation = global / (ranks "
            "x micro)")(
      "steps",
      core::number<std::int64_t>(core::between(0, kMaxSteps))->default_value(0)->value_name("N"),
      "optimizer steps (0: --epochs)")(
      "epochs", core::number<std::int64_t>(core::between(0, train::kMaxEpochs))->value_name("N"),
      "passes over the data, when --steps is not given (then 1 by default)")(
      "drop-long", po::bool_switch(),
      phase == train::Phase::grpo
          ? "no effect for grpo: a prompt that does not fit is always left out"
          : "leave out samples (documents, pairs) longer than --seq-len instead of truncating "
            "them")("lr",
                    core::number<double>(core::at_least(0))
                        ->default_value(sft                           ? 2e-5
                                        : phase == train::Phase::grpo ? 1e-6
                                                                      : 1e-5)
                        ->value_name("LR"),
                    "peak learning rate")(
      "min-lr", core::number<double>(core::at_least(0))->value_name("LR"),
      "learning rate at the end of the cosine decay (default 0.1 x --lr)")(
      "warmup",
      core::number<std::int64_t>(core::between(0, kMaxSteps))
          ->default_value(0)
          ->value_name("STEPS"),
      "linear warmup steps")(
      "weight-decay",
      core::number<float>(core::at_least(0))->default_value(d.adamw.weight_decay)->value_name("WD"),
      "AdamW weight decay (2-D weights only)")(
      "beta1", core::number<float>(kUnitInterval)->default_value(d.adamw.beta1)->value_name("B1"),
      "AdamW beta1")(
      "beta2", core::number<float>(kUnitInterval)->default_value(d.adamw.beta2)->value_name("B2"),
      "AdamW beta2")(
      "adam-eps",
      core::number<float>(core::above(0))->default_value(d.adamw.eps)->value_name("EPS"),
      "AdamW epsilon")(
      "grad-clip",
      core::number<double>(core::at_least(0))->default_value(d.grad_clip)->value_name("NORM"),
      "clip the global gradient norm to this (0: no clipping)")(
      "seed", core::number<std::uint64_t>(core::Domain{})->default_value(d.seed),
      "seed of the initial weights and the data order")(
      "recompute", po::bool_switch(),
      "recompute each block's activations in the backward pass (less memory, ~1/3 more compute)")(
      "lora-rank", core::number<int>(core::between(0, 65536))->default_value(0)->value_name("R"),
      "train LoRA adapters of rank R (PEFT's), the model's weights frozen; 0: full fine-tuning")(
      "lora-alpha",
      core::number<double>(core::Domain{.lowest = 0,
                                        .lowest_excluded = true,
                                        .highest = model::LoraConfig::kMaxAlpha})
          ->default_value(8.0)
          ->value_name("A"),
      "LoRA: adapters scaled by A / R (PEFT's lora_alpha; default 8, as PEFT)")(
      "lora-rslora", po::bool_switch(), "LoRA: scale by A / sqrt(R) (rank-stabilised LoRA)")(
      "lora-dropout",
      core::number<double>(core::Domain{.lowest = 0, .highest = 1, .highest_excluded = true})
          ->default_value(0.0)
          ->value_name("P"),
      "LoRA: dropout on each adapter's input while training")(
      "lora-targets",
      po::value<std::string>()->default_value("q,k,v,o,gate,up,down")->value_name("LIST"),
      "LoRA: the layers that get adapters, of q, k, v, o, gate, up, down (or q_proj, ...)")(
      "init-adapter", po::value<std::string>()->value_name("DIR"),
      "LoRA: start from this PEFT adapter directory (PEFT's or export --adapter's); its r, "
      "alpha, rsLoRA, dropout and targets are the run's unless given")(
      "backend",
      po::value<std::string>()
          ->default_value(std::string(kernels::backend_name(d.backend)))
          ->value_name("auto|cpu|cuda"),
      "compute backend")(
      "eval-every",
      core::number<std::int64_t>(core::between(0, kMaxSteps))->default_value(0)->value_name("N"),
      "evaluate on --val-data every N steps (and always at the end)")(
      "eval-on-start", po::bool_switch(),
      "evaluate on --val-data before the first step too (a run from the start: step 0)")(
      "log-every",
      core::number<std::int64_t>(core::between(0, kMaxSteps))
          ->default_value(d.log_every)
          ->value_name("N"),
      "print a metrics line every N steps (0: first and last only)")(
      "metrics", po::value<std::string>()->value_name("FILE"),
      "append one JSON object per step and evaluation to FILE (metrics.jsonl)")(
      "tensorboard", po::value<std::string>()->value_name("DIR"),
      "write TensorBoard event files to DIR: every number of --metrics as a scalar "
      "(train/..., eval/...) against the step (rank 0; a resumed run appends)")(
      "ckpt-dir", po::value<std::string>()->value_name("DIR"),
      "write checkpoints here: DIR/step-NNNNNNNN/ and DIR/latest (always at the end)")(
      "checkpoint-every",
      core::number<std::int64_t>(core::between(0, kMaxSteps))->default_value(0)->value_name("N"),
      "also checkpoint every N steps (0: only at the end)")(
      "ckpt-local", po::value<std::string>()->value_name("DIR"),
      "node-local checkpoint storage (local NVMe, $TMPDIR, /dev/shm; %h: the node's name): each "
      "rank writes only its own state there, with copies on other nodes (docs/HPC.md)")(
      "checkpoint-every-local",
      core::number<std::int64_t>(core::between(0, kMaxSteps))->default_value(0)->value_name("K"),
      "write a node-local checkpoint every K steps (with --ckpt-local)")(
      "ckpt-redundancy",
      po::value<std::string>()->default_value("partner")->value_name("partner|xor|none"),
      "how node-local checkpoints survive a lost node: a copy of each rank's state on another "
      "node, XOR parity over ranks on different nodes, or nothing")(
      "flush-every",
      core::number<std::int64_t>(core::between(0, kMaxSteps))
          ->default_value(d.flush_every)
          ->value_name("M"),
      "also write every M-th node-local checkpoint to --ckpt-dir, in the background (0: never; "
      "the final and requested checkpoints always go there)")(
      "ckpt-xor-set",
      core::number<int>(core::between(2, 1024))->default_value(d.xor_set_size)->value_name("N"),
      "--ckpt-redundancy xor: ranks per parity set (on as many nodes); each stores 1/(N-1) of a "
      "state extra")(
      "max-bad-steps",
      core::number<int>(core::between(1, 1e6))->default_value(d.max_bad_steps)->value_name("N"),
      "stop after N steps in a row with a non-finite loss or gradient norm (they are skipped)")(
      "dry-run-memory", po::bool_switch(),
      "print what the run takes in the backend's memory per rank (weights, master copy, "
      "gradients, AdamW moments, activations) and exit, allocating nothing")(
      "dry-run-ranks",
      core::number<int>(core::between(0, 1 << 24))->default_value(0)->value_name("N"),
      "--dry-run-memory: plan for N ranks (0: the ranks of this run)")(
      "peak-tflops",
      core::number<double>(core::at_least(0))->default_value(0)->value_name("TFLOPS"),
      "per-rank peak for MFU (0: known GPUs by name; none on the CPU)")(
      "no-shard-optimizer", po::bool_switch(),
      "keep the whole AdamW state on every rank instead of 1/N per rank (ZeRO-1)")(
      "shard-gradients", po::bool_switch(),
      "ZeRO-2: hold no whole gradient buffer, only the layers being computed and 1/N of the "
      "reduced gradients per rank (each micro-batch is then reduced across ranks, and several "
      "micro-batches per step add up in fp32)")(
      "shard-parameters", po::bool_switch(),
      "ZeRO-3 (implies --shard-gradients): hold no whole copy of the weights either, only 1/N "
      "per rank; each layer's weights are all-gathered before its forward and backward, the "
      "next layer's while this one computes")(
      "shard-group-size",
      core::number<int>(core::between(0, 1 << 24))->default_value(0)->value_name("G"),
      "--shard-parameters: shard within groups of G consecutive ranks (one node, say) and "
      "replicate across the groups, whose gradients are then added up (0: all ranks; G must "
      "divide the ranks)")(
      "context-parallel",
      core::number<int>(core::between(1, 1 << 16))->default_value(1)->value_name("C"),
      "split every sequence over groups of C consecutive ranks (long context: each rank holds "
      "1/C of the tokens and their activations; attention gathers the keys and values from the "
      "group); the other ranks' groups are data parallel. --seq-len must be a multiple of 2C "
      "(sft, reward and dpo, on the CPU backend so far)")(
      "tensor-parallel",
      core::number<int>(core::between(1, 1 << 10))->default_value(1)->value_name("T"),
      "split every layer over groups of T consecutive ranks (Megatron-style: attention heads, "
      "MLP columns and the vocabulary; each rank holds 1/T of the weights and runs the same "
      "batch); composes with --context-parallel and the data-parallel groups. T must divide the "
      "model's heads, key/value heads, MLP width and vocabulary (sft, reward and dpo with full "
      "fine-tuning, on the CPU backend so far)")(
      "no-prefetch-gathers", po::bool_switch(),
      "--shard-parameters: gather each layer's weights when it is reached instead of while the "
      "previous one computes (for comparison; the results are bit-identical)")(
      "grad-accum-dtype",
      po::value<std::string>()
          ->default_value(std::string(train::grad_accum_dtype_name(d.grad_accum_dtype)))
          ->value_name("auto|fp32|bf16"),
      "CUDA backend: the dtype gradients add up in across a step's micro-batches and lm_head "
      "blocks (ZeRO-0/1: the whole gradient buffer; ZeRO-2: the reduced 1/N). auto: fp32 when a "
      "step has several micro-batches per rank, else bf16; fp32 costs 2 more bytes per parameter "
      "(ZeRO-2: per parameter / N) and twice the gradient traffic")(
      "bucket-mb",
      core::number<double>(core::Domain{.lowest = 0, .lowest_excluded = true, .highest = 1 << 20})
          ->default_value(d.bucket_mb)
          ->value_name("MIB"),
      "gradient reduction bucket size")(
      "no-overlap-reduction", po::bool_switch(),
      "reduce gradients after the backward pass instead of during it")(
      "grad-exchange",
      po::value<std::string>()
          ->default_value(std::string(train::exchange_choice_name(d.grad_exchange)))
          ->value_name("auto|mpi|nccl"),
      "how ranks exchange gradients and weights: nccl (GPU buffers, one rank per GPU), mpi "
      "(host memory; from GPUs through host buffers), auto (nccl on the CUDA backend when "
      "every rank has a GPU of its own)")(
      "deterministic", po::bool_switch(),
      "bit-identical results run after run and across restarts: on the GPU, gradients are "
      "summed on the host in rank order (MPI) unless --grad-exchange nccl is given")(
      "attention",
      po::value<std::string>()
          ->default_value(std::string(kernels::attention_name(d.attention)))
          ->value_name("auto|cudnn|cudnn-nondeterministic|fallback"),
      "CUDA attention: auto (cuDNN's fused flash attention with its deterministic backward where "
      "cuDNN serves the GPU and shape, the fallback elsewhere), cudnn (the same, cuDNN asked for "
      "by name), cudnn-nondeterministic (cuDNN's faster backward: gives up bit-identical reruns "
      "and bitwise restart), fallback (cuBLAS GEMMs and softmax kernels); all but "
      "cudnn-nondeterministic are deterministic; the CPU backend ignores auto and fallback")(
      "device", core::number<int>(core::between(-1, 1 << 16))->default_value(-1)->value_name("N"),
      "CUDA device of this rank (-1: the node-local rank modulo the visible devices)")(
      "prefetch-depth",
      core::number<int>(core::between(1, 64))->default_value(d.prefetch_depth)->value_name("N"),
      "steps of data prepared ahead")(
      "ignore-tokenizer-mismatch", po::bool_switch(),
      "train even if the data was tokenized with another tokenizer than the --init model's")(
      "progress", po::value<std::string>()->default_value("auto")->value_name("auto|always|never"),
      "rank 0's progress bar on stderr: auto when stderr is a terminal; always also through "
      "mpiexec's pipes")("no-progress", po::bool_switch(), "the same as --progress never")(
      "resume", po::value<std::string>()->default_value("auto")->value_name("auto|none|CKPT"),
      "auto: continue from the newest good checkpoint in --ckpt-dir (damaged ones are set "
      "aside); none: start over; or a checkpoint to continue from")(
      "resume-verify", po::value<std::string>()->default_value("full")->value_name("full|quick"),
      "full: check every checksum before resuming; quick: manifest, sizes and structure only")(
      "keep-last",
      core::number<int>(core::between(2, 1e6))->default_value(d.keep_last)->value_name("K"),
      "keep the newest K complete checkpoints (at least 2)")(
      "checkpoint-sync", po::bool_switch(),
      "write checkpoints on the training thread instead of in the background")(
      "allow-config-change", po::bool_switch(),
      "resume even if options that change the training (lr, batch, seed, data...) changed")(
      "deadline", po::value<std::string>()->value_name("SECONDS|TIME"),
      "checkpoint and exit 75 before this: seconds from now or an ISO-8601 time (default: "
      "SLURM_JOB_END_TIME when set)")(
      "deadline-margin",
      core::number<double>(core::at_least(0))->default_value(d.deadline_margin)->value_name("S"),
      "seconds kept in reserve before the deadline, on top of a step and a checkpoint");
}

template <typename T>
T get(const po::variables_map& o, const char* name) {
  return o[name].as<T>();
}

// An option naming a file or directory: "" when not given. Given empty (`--ckpt-dir ""`, a config
// line `ckpt-dir =`) it is refused, never read as "not given": a run that silently saved
// nothing would be the result.
std::string optional_string(const po::variables_map& o, const char* name) {
  if (o.count(name) == 0) return {};
  std::string value = o[name].as<std::string>();
  if (value.empty()) {
    throw core::usage_error(
        fmt::format("--{} is empty: give a value, or leave the option out", name));
  }
  return value;
}

bool given(const po::variables_map& o, const char* name) {
  return o.count(name) != 0 && !o[name].defaulted();
}

// Options that only mean something with another one: refused without it, never ignored.
void require_companions(const po::variables_map& o, const train::TrainConfig& c) {
  if (!c.lora.enabled()) {
    for (const char* name : {"lora-alpha", "lora-rslora", "lora-dropout", "lora-targets"}) {
      if (given(o, name) && (std::string_view(name) != "lora-rslora" || o[name].as<bool>())) {
        throw core::usage_error(fmt::format(
            "--{} is a LoRA option: it needs --lora-rank R (or --init-adapter DIR)", name));
      }
    }
  }
  if (c.ckpt_local.empty()) {
    for (const char* name : {"ckpt-redundancy", "flush-every", "ckpt-xor-set"}) {
      if (given(o, name)) {
        throw core::usage_error(fmt::format(
            "--{} is an option of the node-local level: it needs --ckpt-local DIR", name));
      }
    }
  }
  if (c.ckpt_redundancy != ckpt::Redundancy::xor_parity && given(o, "ckpt-xor-set"))
    throw core::usage_error("--ckpt-xor-set needs --ckpt-redundancy xor");
}

}  // namespace

void declare_train_options(po::options_description& options, train::Phase phase) {
  declare_common(options, phase);
  if (phase == train::Phase::reward) {
    options.add_options()("margin-from-data", po::bool_switch(),
                          "use the records' margins: -log sigmoid(r_chosen - r_rejected - margin)")(
        "center-rewards",
        core::number<double>(core::at_least(0))->default_value(0)->value_name("COEF"),
        "add COEF x (r_chosen + r_rejected)^2 to keep rewards centred at 0 (TRL uses 0.01)");
  }
  if (phase == train::Phase::dpo) {
    const model::DpoSettings d;
    // Bounded so that the losses stay finite: B x (a difference of log-probabilities) for the
    // sigmoid loss, (h - 1/(2B))^2 for IPO.
    options.add_options()("beta",
                          core::number<double>(core::between(kMinBeta, kMaxBeta))
                              ->default_value(d.beta)
                              ->value_name("B"),
                          "how far the policy may move from the reference: the loss is "
                          "-log sigmoid(B [(log pi(c) - log ref(c)) - (log pi(r) - log ref(r))])")(
        "label-smoothing",
        core::number<double>(core::Domain{.lowest = 0, .highest = 0.5, .highest_excluded = true})
            ->default_value(d.label_smoothing)
            ->value_name("EPS"),
        "conservative DPO: the share of pairs assumed mislabelled (sigmoid loss only)")(
        "loss", po::value<std::string>()->default_value("sigmoid")->value_name("sigmoid|ipo"),
        "sigmoid (DPO) or ipo ((h - 1/(2B))^2 on per-token mean log-probabilities)")(
        "reference-dir", po::value<std::string>()->value_name("DIR"),
        "full fine-tuning: where the reference model's log-probabilities of the pairs are "
        "stored (default: CKPT_DIR/reference; without --ckpt-dir, in memory only)");
  }
  if (phase == train::Phase::grpo) declare_grpo_options(options);
}

void declare_config_and_log_options(po::options_description& options) {
  options.add_options()("config", po::value<std::string>()->value_name("FILE"),
                        "read options from FILE ('key = value' lines; the command line wins)")(
      "log-level", po::value<std::string>()->default_value("info")->value_name("LEVEL"),
      "trace, debug, info, warn, error or off")("log-all-ranks", po::bool_switch(),
                                                "log from every rank, not only rank 0");
}

core::LogConfig log_config_from(const po::variables_map& values) {
  core::LogConfig config;
  config.level = core::parse_log_level(values["log-level"].as<std::string>());
  config.all_ranks = values["log-all-ranks"].as<bool>();
  return config;
}

namespace {

// --init-adapter DIR: its LoRA settings are the run's, and an option given on the command line
// must agree with the adapter's shape (rank, targets) and scale (alpha, rsLoRA).
void adopt_adapter_settings(const po::variables_map& o, train::TrainConfig& c) {
  const ckpt::PeftAdapterConfig adapter = ckpt::read_peft_adapter_config(c.init_adapter);
  const model::LoraConfig& a = adapter.lora;
  const auto given = [&](const char* name) { return o.count(name) != 0 && !o[name].defaulted(); };
  const auto require_same = [&](const char* name, bool same, const std::string& theirs) {
    if (given(name) && !same) {
      throw core::usage_error(
          fmt::format("--{} disagrees with --init-adapter {}, whose adapters have {} (leave "
                      "--{} out to take the adapter's)",
                      name, c.init_adapter, theirs, name));
    }
  };
  require_same("lora-rank", c.lora.rank == a.rank, fmt::format("r={}", a.rank));
  require_same("lora-targets", c.lora.targets == a.targets, "targets " + a.targets_text());
  require_same("lora-alpha", c.lora.alpha == a.alpha, fmt::format("lora_alpha={}", a.alpha));
  require_same("lora-rslora", c.lora.rslora == a.rslora,
               a.rslora ? "use_rslora=true" : "use_rslora=false");
  const double dropout = given("lora-dropout") ? c.lora.dropout : a.dropout;
  c.lora = a;
  c.lora.dropout = dropout;
}

}  // namespace

train::TrainConfig train_config_from(const po::variables_map& o, train::Phase phase,
                                     bool data_may_come_from_host) {
  train::TrainConfig c;
  c.phase = phase;
  c.model = optional_string(o, "model");
  c.init = optional_string(o, "init");
  c.data = optional_string(o, "data");
  c.val_data = optional_string(o, "val-data");
  c.backend = kernels::parse_backend(get<std::string>(o, "backend"));
  c.seq_len = get<std::int64_t>(o, "seq-len");
  c.global_batch = o.count("global-batch") != 0 ? get<std::int64_t>(o, "global-batch") : 0;
  c.micro_batch = get<std::int64_t>(o, "micro-batch");
  c.steps = get<std::int64_t>(o, "steps");
  c.epochs = o.count("epochs") != 0 ? get<std::int64_t>(o, "epochs") : 0;
  c.drop_long = get<bool>(o, "drop-long");
  c.lr = get<double>(o, "lr");
  c.min_lr = o.count("min-lr") != 0 ? get<double>(o, "min-lr") : -1.0;
  c.warmup = get<std::int64_t>(o, "warmup");
  c.adamw.weight_decay = get<float>(o, "weight-decay");
  c.adamw.beta1 = get<float>(o, "beta1");
  c.adamw.beta2 = get<float>(o, "beta2");
  c.adamw.eps = get<float>(o, "adam-eps");
  c.grad_clip = get<double>(o, "grad-clip");
  c.seed = get<std::uint64_t>(o, "seed");
  c.recompute = get<bool>(o, "recompute");
  c.lora.rank = get<int>(o, "lora-rank");
  c.lora.alpha = get<double>(o, "lora-alpha");
  c.lora.rslora = get<bool>(o, "lora-rslora");
  c.lora.dropout = get<double>(o, "lora-dropout");
  c.lora.targets = model::parse_lora_targets(get<std::string>(o, "lora-targets"));
  c.init_adapter = optional_string(o, "init-adapter");
  if (!c.init_adapter.empty()) adopt_adapter_settings(o, c);
  c.eval_every = get<std::int64_t>(o, "eval-every");
  c.eval_on_start = get<bool>(o, "eval-on-start");
  c.log_every = get<std::int64_t>(o, "log-every");
  c.metrics = optional_string(o, "metrics");
  c.tensorboard = optional_string(o, "tensorboard");
  std::error_code resolve_error;
  if (!c.tensorboard.empty() &&
      std::filesystem::weakly_canonical(std::filesystem::absolute(c.tensorboard), resolve_error) ==
          std::filesystem::path("/")) {
    throw core::usage_error(
        fmt::format("--tensorboard {}: the root directory; name a directory of the run's own (e.g. "
                    "runs/NAME/tensorboard)",
                    c.tensorboard));
  }
  c.ckpt_dir = optional_string(o, "ckpt-dir");
  c.checkpoint_every = get<std::int64_t>(o, "checkpoint-every");
  c.ckpt_local = optional_string(o, "ckpt-local");
  c.checkpoint_every_local = get<std::int64_t>(o, "checkpoint-every-local");
  c.ckpt_redundancy = ckpt::parse_redundancy(get<std::string>(o, "ckpt-redundancy"));
  c.flush_every = get<std::int64_t>(o, "flush-every");
  c.xor_set_size = get<int>(o, "ckpt-xor-set");
  c.max_bad_steps = get<int>(o, "max-bad-steps");
  c.peak_tflops = get<double>(o, "peak-tflops");
  c.shard_optimizer = !get<bool>(o, "no-shard-optimizer");
  c.shard_parameters = get<bool>(o, "shard-parameters");
  c.prefetch_gathers = !get<bool>(o, "no-prefetch-gathers");
  c.shard_group_size = get<int>(o, "shard-group-size");
  c.context_parallel = get<int>(o, "context-parallel");
  c.tensor_parallel = get<int>(o, "tensor-parallel");
  c.shard_gradients = get<bool>(o, "shard-gradients") || c.shard_parameters;
  c.grad_accum_dtype = train::parse_grad_accum_dtype(get<std::string>(o, "grad-accum-dtype"));
  c.bucket_mb = get<double>(o, "bucket-mb");
  c.overlap_reduction = !get<bool>(o, "no-overlap-reduction");
  c.grad_exchange = train::parse_exchange_choice(get<std::string>(o, "grad-exchange"));
  c.device = get<int>(o, "device");
  c.attention = kernels::parse_attention(get<std::string>(o, "attention"));
  c.deterministic = get<bool>(o, "deterministic");
  c.prefetch_depth = get<int>(o, "prefetch-depth");
  c.ignore_tokenizer_mismatch = get<bool>(o, "ignore-tokenizer-mismatch");
  // --progress is checked even with --no-progress: a misspelt value is never ignored.
  const train::ProgressMode progress = train::parse_progress_mode(get<std::string>(o, "progress"));
  c.progress = get<bool>(o, "no-progress") ? train::ProgressMode::never : progress;
  c.resume = train::parse_resume_choice(get<std::string>(o, "resume"));
  const auto verify = get<std::string>(o, "resume-verify");
  if (verify != "full" && verify != "quick")
    throw core::usage_error("--resume-verify must be full or quick");
  c.verify_resume = verify == "full";
  c.keep_last = get<int>(o, "keep-last");
  c.checkpoint_sync = get<bool>(o, "checkpoint-sync");
  c.allow_config_change = get<bool>(o, "allow-config-change");
  c.deadline_margin = get<double>(o, "deadline-margin");
  if (o.count("deadline") != 0) {
    if (c.ckpt_dir.empty())
      throw core::usage_error("--deadline needs --ckpt-dir (it checkpoints before the deadline)");
    c.deadline_unix = core::parse_deadline(get<std::string>(o, "deadline"), core::unix_now());
  } else if (const core::SlurmEndTime slurm =
                 core::slurm_end_time(std::getenv("SLURM_JOB_END_TIME"));
             !c.ckpt_dir.empty()) {
    if (slurm.time) c.deadline_unix = *slurm.time;
    if (!slurm.problem.empty()) c.warnings.push_back(slurm.problem);
  }
  if (phase == train::Phase::reward) {
    c.margin_from_data = get<bool>(o, "margin-from-data");
    c.center_rewards = get<double>(o, "center-rewards");
  }
  if (phase == train::Phase::dpo) {
    c.dpo.beta = get<double>(o, "beta");
    c.dpo.label_smoothing = get<double>(o, "label-smoothing");
    c.dpo.loss = train::parse_preference_loss(get<std::string>(o, "loss"));
    if (c.dpo.loss == kernels::PreferenceLoss::ipo && c.dpo.label_smoothing > 0)
      throw core::usage_error("--label-smoothing applies to --loss sigmoid only");
    c.reference_dir = optional_string(o, "reference-dir");
  }
  if (phase == train::Phase::grpo) {
    train::GrpoSettings& g = c.grpo;
    g.num_generations = get<std::int64_t>(o, "num-generations");
    g.max_completion_length = get<std::int64_t>(o, "max-completion-length");
    g.temperature = get<double>(o, "temperature");
    g.top_p = get<double>(o, "top-p");
    g.top_k = get<std::int64_t>(o, "top-k");
    g.beta = get<double>(o, "beta");
    g.epsilon = get<double>(o, "epsilon");
    g.epsilon_high = o.count("epsilon-high") != 0 ? get<double>(o, "epsilon-high") : -1.0;
    g.loss_type = train::parse_policy_loss_type(get<std::string>(o, "loss-type"));
    g.scale_rewards = train::parse_reward_scaling(get<std::string>(o, "scale-rewards"));
    g.advantage = train::parse_advantage_estimator(get<std::string>(o, "advantage"));
    g.num_iterations = get<std::int64_t>(o, "num-iterations");
    if (o.count("generation-ranks") != 0)
      g.generation_ranks = get<std::int64_t>(o, "generation-ranks");
    if (o.count("max-staleness") != 0) g.max_staleness = get<std::int64_t>(o, "max-staleness");
    g.mask_truncated_completions = get<bool>(o, "mask-truncated-completions");
    g.importance_sampling_correction = !get<bool>(o, "no-importance-sampling-correction");
    g.importance_sampling_mode =
        train::parse_importance_sampling_mode(get<std::string>(o, "importance-sampling-mode"));
    g.importance_sampling_clip_max = train::parse_importance_sampling_bound(
        "importance-sampling-clip-max", get<std::string>(o, "importance-sampling-clip-max"));
    g.importance_sampling_clip_min = train::parse_importance_sampling_bound(
        "importance-sampling-clip-min", get<std::string>(o, "importance-sampling-clip-min"));
    g.tempered_logprobs = !get<bool>(o, "raw-logprobs");
    g.pack_completions = !get<bool>(o, "pad-completions");
    if (const std::string match = optional_string(o, "reward-match"); !match.empty()) {
      if (match != "answer")
        throw core::usage_error(
            fmt::format("--reward-match {}: the built-in match is 'answer'", match));
      g.reward_match_answer = true;
    }
    g.environment = optional_string(o, "environment");
    if (o.count("max-turns") > 0) g.max_turns = get<std::int64_t>(o, "max-turns");
    g.reward_command = optional_string(o, "reward-command");
    g.reward_timeout = get<double>(o, "reward-timeout");
    g.reward_model = optional_string(o, "reward-model");
    g.reward_adapter = optional_string(o, "reward-adapter");
    if (const std::string w = optional_string(o, "reward-weights"); !w.empty())
      g.reward_weights = parse_weights(w);
    g.log_completions = optional_string(o, "log-completions");
    c.tokenizer = optional_string(o, "tokenizer");
  }
  require_companions(o, c);
  c.data_from_host = data_may_come_from_host && c.data.empty();
  if (get<bool>(o, "dry-run-memory")) {
    // A memory plan needs the model and the micro-batch, not the data or the batch over ranks.
    train::TrainConfig planned = c;
    if (planned.data.empty()) planned.data = "(dry run)";
    if (planned.global_batch == 0) planned.global_batch = planned.micro_batch;
    planned.data_from_host = false;
    planned.validate();
    return c;
  }
  c.validate();
  c.data_from_host = false;  // the Session decides, once it knows whether there is a DataSource
  return c;
}

}  // namespace l3::api
