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

  // Multi-turn episodes (--environment, episodes.hpp). `ids` are then every token after the
  // prompt: `policy` says which are the policy's (1: its turns and their stop tokens, what the
  // loss counts) and which the environment's (0: its messages and the next turn's header,
  // context with log-probability 0). Empty: a single turn, every id the policy's. `text` is the
  // policy's last turn.
  std::vector<std::uint8_t> policy;
  std::int64_t turns = 1;       // the policy's turns
  std::int64_t tool_calls = 0;  // the environment's "ipython" messages
  std::string conversation;     // the whole conversation, a JSON list of {"role", "content"}
  double environment_reward = 0.0;

  // Whether ids[k] is the policy's.
  [[nodiscard]] bool is_policy(std::size_t k) const noexcept {
    return policy.empty() || policy[k] != 0;
  }
  // The policy's tokens (the completion's length as the metrics and the loss count it).
  [[nodiscard]] std::int64_t policy_tokens() const noexcept {
    std::int64_t n = 0;
    for (std::size_t k = 0; k < ids.size(); ++k) n += is_policy(k) ? 1 : 0;
    return n;
  }
};

}  // namespace l3::train::grpo
