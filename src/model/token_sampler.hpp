// Choosing the next token from a row of logits: greedy (temperature 0), or a draw from
// softmax(logits / temperature) restricted to the nucleus (top-p) of the distribution.
#pragma once

#include <cstdint>
#include <span>

namespace l3::model {

struct SamplingParams {
  double temperature = 0.0;  // 0: greedy (argmax, the lowest id on ties)
  double top_p = 1.0;        // keep the most likely tokens whose probabilities add up to top_p
};

// Throws a usage Error when temperature is negative or not finite, or top_p is not in (0, 1].
void validate(const SamplingParams& params);

// The id of the largest logit (the first one on ties).
[[nodiscard]] std::int32_t argmax(std::span<const float> logits);

// A token drawn with the uniform number u in [0, 1): the same logits, params and u always give
// the same token. Top-p keeps the smallest set of most likely tokens (ties by lower id) whose
// probability reaches top_p, always at least the most likely one, and draws within it.
[[nodiscard]] std::int32_t sample_token(std::span<const float> logits, const SamplingParams& params,
                                        double u);

}  // namespace l3::model
