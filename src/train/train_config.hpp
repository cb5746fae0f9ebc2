// Everything a training run (SFT or reward) is configured by: what the CLI's `sft` and
// `reward` options set, and what an embedding application sets in code. validate() checks what
// can be checked without the data or the model.
#pragma once

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "ckpt/local_redundancy.hpp"
#include "ckpt/resume.hpp"
#include "core/phase.hpp"
#include "kernels/backends.hpp"
#include "l3/l3.hpp"
#include "model/dpo_settings.hpp"
#include "model/lora_config.hpp"
#include "train/adamw_optimizer.hpp"
#include "train/grpo_settings.hpp"
#include "train/run_choices.hpp"

namespace l3::train {

using Phase = l3::Phase;  // the public enum (include/l3/l3.hpp)

// The most passes over the data one run plans (--epochs): its steps are counted epoch by epoch
// before the first step, for the learning-rate schedule; longer runs give --steps.
inline constexpr std::int64_t kMaxEpochs = 10000;
using core::phase_name;

// Fields are grouped by meaning, not by size: one instance per run.
struct TrainConfig {  // NOLINT(clang-analyzer-optin.performance.Padding)
  Phase phase = Phase::sft;
  std::string model;  // preset name or config.json; may be empty when `init` is a checkpoint
  std::string init;   // checkpoint (step directory or root) to start from; empty: random
  std::string data;   // dataset directory (index.json)
  bool data_from_host = false;  // the training data comes from a StepSource instead (embedding)
  std::string val_data;         // validation dataset; empty: none
  kernels::Backend backend = kernels::Backend::automatic;
  int device = -1;  // CUDA device; -1: node-local rank modulo the visible devices
  // auto: cuDNN's fused attention with its deterministic backward where it runs, else the
  // fallback (kernels/backends.hpp)
  kernels::Attention attention = kernels::Attention::automatic;

  std::int64_t seq_len = 2048;
  std::int64_t global_batch = 0;  // rows (SFT) or pairs (reward) per optimizer step
  std::int64_t micro_batch = 1;   // per rank and forward/backward pass
  std::int64_t steps = 0;         // optimizer steps; 0: from `epochs`
  std::int64_t epochs = 0;        // used when steps == 0 (default 1)
  bool drop_long = false;         // SFT samples longer than seq_len: drop (else truncate)

  double lr = 3e-4;
  double min_lr = -1;  // < 0: 0.1 x lr
  std::int64_t warmup = 0;
  AdamWConfig adamw{.beta1 = 0.9F, .beta2 = 0.95F, .eps = 1e-8F, .weight_decay = 0.1F};
  double grad_clip = 1.0;  // <= 0: no clipping
  std::uint64_t seed = 1234;
  bool recompute = false;
  // LoRA (rank > 0): the model's weights frozen, adapters and a reward model's score head
  // trained (model/lora_config.hpp).
  model::LoraConfig lora{};
  // A PEFT LoRA adapter directory (ckpt/peft_adapter.hpp) whose adapters, and a reward model's
  // score head, a fresh LoRA run starts from instead of PEFT's initialisation; empty: none.
  std::string init_adapter;

  // Reward phase.
  bool margin_from_data = false;
  double center_rewards = 0.0;
  // DPO phase: the loss, and where the reference model's precomputed log-probabilities go
  // (full fine-tuning; empty: <ckpt_dir>/reference; with LoRA the base model is the reference).
  model::DpoSettings dpo{};
  std::string reference_dir;
  // GRPO phase: sampling, rewards and the loss (grpo_settings.hpp), and the tokenizer that
  // decodes completions for the rewards (empty: the one the prompts were prepared with).
  GrpoSettings grpo{};
  std::string tokenizer;

  // Data parallelism.
  bool shard_optimizer = true;
  // ZeRO-2: no whole gradient buffer; each micro-batch's gradients reduced group by group into
  // 1/N per rank (data_parallel.hpp).
  bool shard_gradients = false;
  // ZeRO-3: no whole copy of the weights either; each layer group's weights are all-gathered
  // from their owners before use (needs shard_gradients).
  bool shard_parameters = false;
  bool prefetch_gathers = true;  // ZeRO-3: gather the next layer group while one computes
  // ZeRO-3 hybrid sharding: shard within groups of this many consecutive ranks, replicate across
  // the groups (0: one group of all the ranks).
  int shard_group_size = 0;
  // Context parallelism: groups of this many consecutive ranks share each micro-batch's rows,
  // each rank holding 2 of their 2C chunks (data::context_share); 1: off.
  int context_parallel = 1;
  // Tensor parallelism: groups of this many consecutive ranks hold each layer's heads, MLP
  // columns and vocabulary rows between them (model/tensor_slice.hpp) and run the same
  // micro-batches; 1: off. The grid is rank = (data group x C + context rank) x T + tensor rank.
  int tensor_parallel = 1;
  GradAccumDtype grad_accum_dtype = GradAccumDtype::automatic;  // see fp32_gradients()
  double bucket_mb = 32.0;
  bool overlap_reduction = true;
  ExchangeChoice grad_exchange = ExchangeChoice::automatic;
  // Bit-identical runs and restarts: reductions in a fixed order (on the GPU, the automatic
  // exchange is MPI, whose sums do not depend on NCCL's topology-dependent algorithm choice).
  bool deterministic = false;
  // Keep the fp32 master weights in the optimizer's ZeRO-1 shards even when the model
  // computes in f32 (always so in bf16): the GPU's arrangement, for tests on the CPU.
  bool master_in_optimizer = false;
  int prefetch_depth = 2;

  // Cadence and output.
  std::int64_t eval_every = 0;  // 0: at the end only (when val_data is given)
  bool eval_on_start = false;   // also before the first step of a run from the start (TRL's)
  std::int64_t log_every = 10;
  std::string metrics;      // JSONL file, appended to; empty: none
  std::string tensorboard;  // directory of TensorBoard event files (rank 0); empty: none
  std::string ckpt_dir;     // empty: no checkpoints
  std::int64_t checkpoint_every = 0;
  // The node-local level (docs/HPC.md): every checkpoint_every_local steps each rank's state to
  // ckpt_local ("%h": the node's name) with copies on other nodes; every flush_every-th of those
  // also to ckpt_dir.
  std::string ckpt_local;  // empty: no node-local level
  std::int64_t checkpoint_every_local = 0;
  ckpt::Redundancy ckpt_redundancy = ckpt::Redundancy::partner;
  std::int64_t flush_every = 10;  // 0: never (the final and requested checkpoints still are)
  int xor_set_size = 8;
  ckpt::ResumeChoice resume;         // the newest good one in ckpt_dir, none, or a path
  bool verify_resume = true;         // check every checksum before resuming (else structure)
  int keep_last = 3;                 // complete checkpoints kept (at least 2)
  bool checkpoint_sync = false;      // write checkpoints on the training thread
  bool allow_config_change = false;  // resume even if options that change the math changed
  double deadline_unix = 0;          // checkpoint and stop before this time (0: none)
  double deadline_margin = 60;       // seconds kept in reserve before the deadline
  int max_bad_steps = 5;
  double peak_tflops = 0;  // per rank; 0: known GPUs by name, else no MFU
  bool ignore_tokenizer_mismatch = false;
  ProgressMode progress = ProgressMode::automatic;  // rank 0's progress bar on stderr
  // What parsing the options had to warn about (an unusable SLURM_JOB_END_TIME): logged when
  // the run starts.
  std::vector<std::string> warnings;

  // usage Error for what cannot be right whatever the data and model.
  void validate() const;
  // Micro-batches per step on each of `ranks` ranks (at least 1; the data plan checks that the
  // global batch divides). A context-parallel group's ranks share theirs, and a tensor-parallel
  // group's run the same ones.
  [[nodiscard]] std::int64_t accumulation(int world) const noexcept {
    const int ranks =
        std::max(world / (std::max(context_parallel, 1) * std::max(tensor_parallel, 1)), 1);
    const std::int64_t micro = std::max<std::int64_t>(1, micro_batch);
    if (phase == Phase::grpo) {  // prompts per step, num_generations completions each
      const std::int64_t completions =
          global_batch / std::max(ranks, 1) * std::max<std::int64_t>(1, grpo.num_generations);
      return std::max<std::int64_t>(1, (completions + micro - 1) / micro);
    }
    return std::max<std::int64_t>(1, global_batch / (static_cast<std::int64_t>(ranks) * micro));
  }
  // Whether gradients add up in fp32 where the backend computes in bf16 (--grad-accum-dtype):
  // the model's whole buffer (ZeRO-0/1) or the optimizers' reduced pieces (ZeRO-2).
  [[nodiscard]] bool fp32_gradients(int ranks) const noexcept {
    return grad_accum_dtype == GradAccumDtype::fp32 ||
           (grad_accum_dtype == GradAccumDtype::automatic && accumulation(ranks) > 1);
  }
  // The options' values as the options spell them (the manifest's "config").
  [[nodiscard]] nlohmann::json to_json() const;
};

// The options' names of the enumerated choices, and back (usage Errors naming the option).
[[nodiscard]] ExchangeChoice parse_exchange_choice(std::string_view name);
[[nodiscard]] std::string_view exchange_choice_name(ExchangeChoice choice) noexcept;
[[nodiscard]] ProgressMode parse_progress_mode(std::string_view name);  // auto, always, never
[[nodiscard]] GradAccumDtype parse_grad_accum_dtype(std::string_view name);
[[nodiscard]] kernels::PreferenceLoss parse_preference_loss(std::string_view name);
[[nodiscard]] std::string_view preference_loss_name(kernels::PreferenceLoss loss) noexcept;
[[nodiscard]] std::string_view grad_accum_dtype_name(GradAccumDtype dtype) noexcept;
// --resume: "auto", "none", or a checkpoint path.
[[nodiscard]] ckpt::ResumeChoice parse_resume_choice(std::string_view value);

}  // namespace l3::train
