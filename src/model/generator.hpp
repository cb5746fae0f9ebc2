// One prompt's generation (interactive `generate --prompt`, the demo's samples): the batched
// engine (generation_engine.hpp) with one slot, sized for this prompt.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/generation_engine.hpp"
#include "model/llama_model.hpp"

namespace l3::model {

struct GenerationOptions {
  std::int64_t max_new = 128;  // new tokens at most (the stop token included)
  double temperature = 0.0;    // 0: greedy
  double top_p = 1.0;          // nucleus sampling when < 1 (and temperature > 0)
  std::int64_t top_k = 0;      // only the k most likely when > 0 (and temperature > 0)
  std::uint64_t seed = 0;      // the engine's record 0, sample 0
  std::vector<std::int32_t> stop_tokens{};
  // Draw only ids below this (a tokenizer smaller than the model's vocabulary); 0: all.
  std::int64_t vocab_limit = 0;
  // Also the log-probability of each prompt token after the first, given the ones before it
  // (from one training forward pass over the prompt).
  bool prompt_logprobs = false;
  // The log-probabilities are of softmax(logits / temperature) (temperature > 0), the
  // distribution the tokens are drawn from before top-k and top-p; false: of the raw logits.
  bool tempered_logprobs = false;
};

struct GenerationResult {
  std::vector<std::int32_t> tokens;  // the new tokens, without the stop token
  // log p(token) of each new token under the model: log-softmax of its logits over the whole
  // vocabulary, before top-k and top-p, and before the temperature unless tempered_logprobs
  // (raw: what transformers' log_softmax(logits) and vLLM's default give)
  std::vector<double> logprobs;
  // With GenerationOptions::prompt_logprobs: log p(prompt[i] | prompt[0..i)) for i >= 1.
  std::vector<double> prompt_logprobs;
  bool stopped = false;  // ended on a stop token (not on max_new)
};

class Generator {
 public:
  // The model must have a language-model head; it is used, never modified.
  explicit Generator(LlamaModel& model);

  // Prefill of `prompt` (not empty), then up to options.max_new tokens. A usage Error when
  // prompt + max_new exceed max_position_embeddings.
  GenerationResult generate(std::span<const std::int32_t> prompt, const GenerationOptions& options);

 private:
  LlamaModel& model_;
};

}  // namespace l3::model
