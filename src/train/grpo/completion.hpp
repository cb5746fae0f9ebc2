// One sample of a GRPO prompt as the rollout's parts pass it around (rollout_source.cpp makes and
// trains on it, rollout_files.cpp stores it, rollout_link.cpp sends it between the ranks that
// generate and those that train): what the engine generated, how it scored, and the
// log-probabilities the loss needs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace l3::train::grpo {

// One sample of a prompt: what the engine generated and how it scored.
struct Completion {
  std::int64_t prompt = 0;        // sample number in the prompt set
  std::int64_t sample = 0;        // 0 .. G-1
  std::vector<std::int32_t> ids;  // the new tokens, the stop token included when it ended on one
  std::vector<float> logprobs;    // the generator's, one per id
  bool truncated = false;         // ended on --max-completion-length, not on a stop token
  std::string text;               // the decoded completion (without the stop token)
  std::vector<double> rewards;    // one per reward function, in GrpoSettings::reward_names order
  double reward = 0.0;            // their weighted sum
  double advantage = 0.0;
  // --num-iterations > 1, or asynchronous GRPO with a lag: the log-probability of each id under
  // the policy that generated it, by the trainer's forward pass (the probability ratio's
  // denominator).
  std::vector<float> old_logprobs;
  // beta > 0: the log-probability of each id under the reference policy.
  std::vector<float> ref_logprobs;
};

}  // namespace l3::train::grpo
