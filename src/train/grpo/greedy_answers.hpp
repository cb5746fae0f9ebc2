// `eval` of a language model on prompt data (`prep prompts`, GRPO's): the greedy completion of
// every prompt with an "answer", and how many match it exactly (stripped) — grpo's evaluation's
// rewards/answer_match/mean with --reward-match answer, so that a GRPO checkpoint (or any
// other language model) is scored after the run as the run scored it.
#pragma once

#include <cstdint>

#include "dist/world.hpp"
#include "io/tokenizer/tokenizer.hpp"
#include "model/llama_model.hpp"
#include "train/grpo/prompt_set.hpp"
#include "train/metrics.hpp"

namespace l3::train::grpo {

struct GreedyAnswerConfig {
  std::int64_t seq_len = 0;                // a prompt and its completion fit in it
  std::int64_t max_completion_length = 0;  // new tokens at most (the stop token included)
};

// Collective over `world`: each rank completes a contiguous share of the prompts (greedy, the
// engine's batch; with sharded weights every rank runs every pass). The metrics, the same on
// every rank: rewards/answer_match/mean, completions/mean_length, completions/truncated (the
// share that reached max_completion_length without a stop token) and prompts; skipped_samples
// counts the prompts too long for seq_len - max_completion_length. A bad_input Error naming the
// data when no prompt has an answer.
[[nodiscard]] EvalMetrics greedy_answers(const dist::World& world, model::LlamaModel& model,
                                         const PromptSet& prompts,
                                         const tokenizer::Tokenizer& tokenizer,
                                         const GreedyAnswerConfig& config);

}  // namespace l3::train::grpo
