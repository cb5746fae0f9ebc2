// GRPO's steps: a StepSource whose micro-batches are made, each step, by the model being
// trained. A step takes --global-batch prompts of the epoch's order (rank r the r-th 1/W of
// them), generates --num-generations completions of each on that rank with the generation engine
// over the training model (its current weights, its sharding, its LoRA adapters), scores them,
// turns the step's rewards (gathered from every rank, in the global order) into advantages, and
// packs the prompt + completion sequences into micro-batches whose loss positions are the
// completions' tokens, each with its advantage, the log-probability it was drawn with and its
// weight in the loss type's normalisation (train/objectives/policy_gradient_loss.hpp).
//
// Sampling is keyed by (seed, step, prompt, sample, token): a step's completions do not depend
// on the ranks, the batch or a restart, so a run resumed from a checkpoint generates what the
// uninterrupted run did (CPU: bit for bit).
//
// Asynchronous GRPO (--generation-ranks, generation_link.hpp) splits that work: a source on the
// generating ranks makes the batches (make_batch), one on the training ranks receives them and
// trains. The class's code is in three files: rollout_source.cpp (generating, scoring, the
// micro-batches, the log-probability passes), rollout_files.cpp (the cache files of
// CKPT_DIR/rollouts and --log-completions) and rollout_link.cpp (the asynchronous parts).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/log.hpp"
#include "dist/world.hpp"
#include "io/tokenizer/tokenizer.hpp"
#include "model/generation_engine.hpp"
#include "model/llama_model.hpp"
#include "train/grpo/completion.hpp"
#include "train/grpo/completions_log.hpp"
#include "train/grpo/environment.hpp"
#include "train/grpo/episodes.hpp"
#include "train/grpo/generation_link.hpp"
#include "train/grpo/prompt_set.hpp"
#include "train/grpo/reward_command.hpp"
#include "train/grpo/reward_model.hpp"
#include "train/grpo_settings.hpp"
#include "train/metrics.hpp"
#include "train/step_source.hpp"

namespace l3::train::grpo {

// The policy GRPO's KL (--beta > 0) is measured against: LoRA's base (the trained model with
// its adapters off) or a frozen copy of the initial model; model null: none (beta 0).
struct ReferencePolicy {
  model::LlamaModel* model = nullptr;
  bool adapters = true;  // false: run `model` without its LoRA adapters
};

struct RolloutConfig {
  GrpoSettings settings;
  std::uint64_t seed = 0;
  std::int64_t prompts_per_step = 0;  // --global-batch, over all ranks
  std::int64_t micro_batch = 0;       // completions per forward/backward pass
  std::int64_t seq_len = 0;           // a prompt + its completion fit in one row
  bool shard_parameters = false;      // --reward-model's weights sharded like the policy's
  std::string tokenizer;              // what decodes completions (prep's, by default)
  // --num-iterations > 1: where each generation batch is saved (CKPT_DIR/rollouts), so that a
  // run resumed inside a cycle trains on it; empty: not saved.
  std::string cache_dir;
  // A stop request's flag (SIGTERM, SIGUSR1), which ends a wait for --reward-command (exit 75).
  const std::atomic<bool>* stop = nullptr;
  // Asynchronous GRPO (--generation-ranks; generation_link.hpp): the link to the other group,
  // null without. On a training rank, the steps' batches come over it and the weights go; on a
  // generating rank (generate = true) the source makes batches for make_batch() only.
  const GenerationLink* link = nullptr;
  bool generate = false;
  // Training ranks: this rank's pieces of the trained weights (fp32 master, trainable layout),
  // and (LoRA) its pieces of the frozen base (together they cover it).
  std::function<WeightPieces()> trained_weights;
  std::function<WeightPieces()> frozen_base;
  // How the trained weights travel: the backend's compute dtype (generation_link.hpp).
  WireType weights_wire = WireType::f32;
};

// The engine's sequences in flight on each rank: a step's completions there, at most 64.
[[nodiscard]] std::int64_t engine_slots(std::int64_t prompts_per_step, std::int64_t num_generations,
                                        int ranks);

class RolloutSource final : public StepSource {
 public:
  // Collective over `world`. `model`: the model being trained (outlives the source). Throws a
  // usage Error for prompts that cannot all be used (none fits --seq-len with
  // --max-completion-length) and bad_input for records a reward cannot read.
  // `validation`: the --val-data prompts, empty for none.
  RolloutSource(const dist::World& world, const core::Logger& log, model::LlamaModel& model,
                ReferencePolicy reference, PromptSet prompts, PromptSet validation,
                RolloutConfig config);
  RolloutSource(const RolloutSource&) = delete;
  RolloutSource& operator=(const RolloutSource&) = delete;
  RolloutSource(RolloutSource&&) = delete;
  RolloutSource& operator=(RolloutSource&&) = delete;

  void start(const StepShape& shape, data::Position from) override;
  const data::StepData& next() override;
  [[nodiscard]] double last_wait_ms() const override { return 0.0; }
  [[nodiscard]] std::optional<std::int64_t> steps_in_epoch(std::int64_t epoch) const override;
  // The validation prompts' greedy completions and --num-generations sampled ones, scored:
  // "reward" is the mean reward of the greedy ones (with --reward-match answer: the exact-answer
  // accuracy), "reward_sampled" the sampled ones'. Collective.
  [[nodiscard]] std::optional<EvalMetrics> evaluate() override;
  // The verifier's input ended and its last words checked (RewardCommand::finish). Collective.
  void finish() override;

  void set_total_steps(std::int64_t total) override { total_ = total; }
  void before_checkpoint(std::int64_t steps) override;
  void end_run(bool stopped) override;
  ~RolloutSource() override;  // (declared again below: the link's stop on an error's way out)

  // A generating rank's work: the generation batch of global step `step` (from 0) with the
  // model's current weights, generated, scored and with its advantages, as the rollout cache
  // stores it, on this group's rank 0 (empty elsewhere); `extra`: metrics to add. Collective
  // over this source's world.
  [[nodiscard]] std::string make_batch(std::int64_t step,
                                       const std::vector<std::pair<std::string, double>>& extra);
  // The setup a training rank 0 sends each generating rank (generation_link.hpp).
  [[nodiscard]] static std::string setup_text(const model::ModelConfig& config,
                                              const std::string& tokenizer, WireType weights);

  // Prompts too long to leave room for a completion (left out of every epoch).
  [[nodiscard]] std::int64_t skipped_prompts() const noexcept { return skipped_; }

 private:
  using Completion = grpo::Completion;
  // The prompts (sample numbers) of (epoch, step), over all ranks, in order.
  [[nodiscard]] std::vector<std::int64_t> step_prompts(std::int64_t epoch, std::int64_t step) const;
  // This rank's slice [begin, end) of a step's n prompts.
  [[nodiscard]] std::pair<std::int64_t, std::int64_t> share(std::int64_t n, int rank) const;
  // `samples` completions of each of `mine` (prompts of `set`), sampled as `sampling` says.
  std::vector<Completion> generate(const PromptSet& set, const std::vector<std::int64_t>& mine,
                                   std::int64_t samples, const model::SamplingSettings& sampling);
  // Every reward of every completion, and their weighted sum. Collective (the reward model's
  // passes; a failing reward on one rank stops every rank with its message).
  void score(const PromptSet& set, std::vector<Completion>& completions);
  // The step's generation batch: generated, scored, its advantages, its micro-batches.
  void roll_out(std::int64_t step);
  // roll_out's two halves: the completions of this rank's share, scored, with their advantages
  // and the step's metrics; then their micro-batches, log, reference log-probabilities, ...
  struct Rolled {
    std::vector<Completion> completions;
    std::vector<std::pair<std::string, double>> metrics;
  };
  Rolled generate_batch(std::int64_t step);
  void use_batch(std::vector<Completion> completions,
                 std::vector<std::pair<std::string, double>> metrics, std::int64_t step);
  // Every rank's completions in the global order, as one cache file's text, on rank 0.
  [[nodiscard]] std::string batch_text(const std::vector<Completion>& completions,
                                       const std::vector<std::pair<std::string, double>>& metrics,
                                       std::int64_t step);
  // This rank's share of a cache file's text (`path` names it in errors), and its metrics.
  std::vector<Completion> parse_batch(const std::string& text, std::int64_t cycle,
                                      const std::string& path,
                                      std::vector<std::pair<std::string, double>>& metrics);
  // Asynchronous GRPO, a training rank: the step's batch from the generating ranks.
  void linked_next(std::int64_t step);
  void send_weights(std::int64_t version);
  // Completes the sends of the versions up to `version` (all with nullopt).
  void complete_sends(std::optional<std::int64_t> version);
  // Rank 0: the batch of `step` received (and saved to the cache) unless it is already here.
  const std::string& receive_batch(std::int64_t step);
  void send_setup();
  void prune_cache(std::int64_t step);
  void build_batches(const std::vector<Completion>& completions);
  // --num-iterations > 1: the completions' log-probabilities under the current weights (the
  // trainer's forward pass), into the micro-batches and the completions.
  void old_log_probabilities(std::vector<Completion>& completions);
  // beta > 0: the completions' log-probabilities under the reference policy, into the
  // micro-batches and the completions.
  void reference_log_probabilities(std::vector<Completion>& completions);
  // Asynchronous GRPO with a lag, a generating rank: the completions' log-probabilities under
  // its weights (the behaviour policy) by the trainer's forward pass, into old_logprobs.
  void behaviour_log_probabilities(std::vector<Completion>& completions);
  // The log-probability of every counted position of `batch` under `model` (its trainer's
  // forward pass), by position (0 where nothing counts).
  [[nodiscard]] std::vector<float> log_probabilities(model::LlamaModel& model, bool adapters,
                                                     const data::Batch& batch);
  // A per-position array of the micro-batches back into each completion's tokens.
  [[nodiscard]] std::vector<float> completion_values(std::vector<float> data::Batch::*field,
                                                     std::size_t completion,
                                                     std::size_t length) const;
  [[nodiscard]] std::string cycle_file(std::int64_t step) const;
  // The cycle's batch into the rollout cache, old and reference log-probabilities included (a
  // run resumed inside the cycle reads it back); with `prune`, older cycles' files go
  // (asynchronous GRPO prunes its own way: prune_cache).
  void save_cycle(const std::vector<Completion>& completions,
                  const std::vector<std::pair<std::string, double>>& metrics, std::int64_t step,
                  bool prune = true);
  void restore_cycle(std::int64_t cycle);
  void write_log(const std::vector<Completion>& completions, std::int64_t step);
  // Rank 0: --log-completions opened, without the lines of the steps after `resumed_at` that
  // an interrupted run wrote (train/grpo/completions_log.hpp).
  void open_log(std::optional<std::int64_t> resumed_at);

  const dist::World& world_;
  const core::Logger& log_;
  model::LlamaModel& model_;
  ReferencePolicy reference_;
  PromptSet prompts_;
  PromptSet validation_;
  RolloutConfig config_;
  tokenizer::Tokenizer tokenizer_;
  std::vector<std::int64_t> usable_;  // prompts that fit, in sample order
  std::int64_t skipped_ = 0;
  model::SamplingSettings sampling_;  // the training's (a step's seed set per step)
  std::unique_ptr<model::GenerationEngine> engine_;
  std::unique_ptr<RewardCommand> command_;
  std::unique_ptr<Environment> environment_;  // --environment: episodes_ talk to it
  std::unique_ptr<EpisodeRunner> episodes_;
  double environment_ms_ = 0.0;  // the last generate()'s wait for the environment
  std::unique_ptr<RewardModel> reward_model_;
  std::unique_ptr<CompletionsLog> log_file_;  // rank 0, with --log-completions
  data::Position position_{0, 0};
  std::int32_t pad_ = 0;
  data::StepData current_;
  // The generation batch in use: the global step that made it (-1: none yet), its metrics, and
  // where each completion of this rank sits in current_.micro (micro-batch, first target).
  std::int64_t cycle_ = -1;
  std::vector<std::pair<std::string, double>> cycle_metrics_;
  std::map<std::size_t, std::pair<std::size_t, std::int64_t>> placement_;
  // Asynchronous GRPO, training ranks: the run's steps, the batches received (rank 0), the next
  // step whose batch is to be asked for, the last version sent, whether the generating ranks
  // were let go, and the step's waits.
  std::int64_t total_ = 0;
  std::map<std::int64_t, std::string> received_;
  std::int64_t next_request_ = 0;
  std::int64_t first_request_ = 0;  // the first step this run asked the generating ranks for
  std::int64_t last_received_ = -1;
  // The versions sent whose sends may not be complete yet (oldest first).
  std::deque<std::unique_ptr<VersionSends>> outgoing_;
  bool generators_failed_ = false;
  bool leaving_on_error_ = false;  // the destructor's end_run: wait for no send
  std::int64_t sent_version_ = -1;
  bool set_up_ = false;
  bool ended_ = false;
  double wait_ms_ = 0.0;
  double weights_ms_ = 0.0;
  std::int64_t weights_bytes_ = 0;
};

}  // namespace l3::train::grpo
