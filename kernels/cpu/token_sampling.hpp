// The next token drawn from a row of logits on the CPU, and its log-probability
// (kernels/ops.hpp, SampleTokensArgs, states the rule; the CUDA kernel follows it).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace l3::kernels::cpu {

struct SamplingRule {
  double temperature = 0.0;  // 0: greedy
  double top_p = 1.0;
  std::int64_t top_k = 0;      // 0: no limit
  float logprob_scale = 1.0F;  // the log-probabilities are of softmax(logprob_scale * logits)
};

// Work memory reused from row to row (a thread's).
struct SamplingScratch {
  std::vector<double> weight;
  std::vector<std::int32_t> order;
  std::vector<float> row;
};

// The token drawn from `logits` (the candidate ids only) with the uniform number u in [0, 1).
[[nodiscard]] std::int32_t sample_row(std::span<const float> logits, const SamplingRule& rule,
                                      double u, SamplingScratch& scratch);

// log p(token) over the whole row of z = scale * logits, as lm_head_cross_entropy computes a
// row's loss (its negative) with that logit_scale: the same exp, sums and roundings, so the two
// agree bit for bit on the same logits.
[[nodiscard]] float row_logprob(std::span<const float> logits, std::int32_t token, float scale,
                                SamplingScratch& scratch);

// Rows of logits (n, V): tokens (n), and logprobs (n) unless empty.
void sample_tokens(std::span<std::int32_t> tokens, std::span<float> logprobs,
                   std::span<const float> logits, std::span<const double> uniforms,
                   std::int64_t vocab, std::int64_t candidates, const SamplingRule& rule);

}  // namespace l3::kernels::cpu
