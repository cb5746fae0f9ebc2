// Multi-turn episodes (grpo --environment): each sample of a prompt is a conversation between
// the policy and the environment (environment.hpp). The policy's turn is generated until its
// stop token; the environment reads the conversation so far and answers with messages (a tool's
// result, a user's reply), which are rendered in the chat template, followed by the assistant's
// header, and prefilled after the turn in the same engine slot (GenerationEngine::run_turns:
// its KV cache is kept, nothing is generated twice); the policy takes its next turn from there,
// until the environment answers with the episode's reward.
//
// An episode is one Completion: `ids` are every token after the prompt, the policy's (its turns
// and their stop tokens, with the log-probabilities they were drawn with) and the environment's
// (its messages and the next turn's header: context, log-probability 0), told apart by
// `policy`. All of them fit in --max-completion-length: a policy turn that reaches the limit
// ends the episode truncated, and so do environment messages that would leave no room for the
// next turn; either way the environment is asked once more, with "final": true, for the reward.
//
// An environment's failure on one rank is held until every episode of the rank has ended (no
// further turn is asked for) and then thrown by the caller on every rank together
// (dist::agree_on_failure), so that no rank is left in a pass the others have left.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "io/prep/record_format.hpp"
#include "io/tokenizer/tokenizer.hpp"
#include "model/generation_engine.hpp"
#include "train/grpo/completion.hpp"
#include "train/grpo/environment.hpp"
#include "train/grpo/prompt_set.hpp"

namespace l3::train::grpo {

struct EpisodeLimits {
  std::int64_t max_turns = 8;   // policy turns per episode (--max-turns)
  std::int64_t max_tokens = 0;  // tokens after the prompt (--max-completion-length)
  int fault_rank = 0;           // the rank the fault point grpo.turn names (core/fault_injection)
};

// What a rank's episodes of one generation took: the environment's seconds (its answers,
// counted from the request's sending to the answer's parsing) and the first failure, if any.
struct EpisodeOutcome {
  double environment_ms = 0.0;
  std::exception_ptr failure;
};

class EpisodeRunner {
 public:
  // `tokenizer` renders the environment's messages and decodes the policy's turns; both
  // outlive the runner.
  EpisodeRunner(Environment& environment, const tokenizer::Tokenizer& tokenizer,
                EpisodeLimits limits);

  // `samples` episodes of each prompt of `mine` (indices into `set`) on `engine`, with the
  // sampling the caller set: one Completion each, prompt by prompt in `mine`'s order, sample by
  // sample (rewards and advantages not set; environment_reward is the environment's).
  // `agree`: the engine's pass agreement (collective engines).
  [[nodiscard]] std::vector<Completion> run(model::GenerationEngine& engine, const PromptSet& set,
                                            const std::vector<std::int64_t>& mine,
                                            std::int64_t samples,
                                            const model::GenerationEngine::PassAgreement& agree,
                                            EpisodeOutcome& outcome);

 private:
  Environment& environment_;
  const tokenizer::Tokenizer& tokenizer_;
  prep::RecordFormatter formatter_;
  EpisodeLimits limits_;
};

}  // namespace l3::train::grpo
