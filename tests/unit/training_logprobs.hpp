// The training forward pass's log-probability of each token of a sequence from a position on:
// the model's pass over the whole sequence and lm_head_cross_entropy's row losses (of the logits
// times logit_scale), negated. What
// generation's log-probabilities are compared with (CPU model; on the CPU backend).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "core/error.hpp"
#include "model/batch.hpp"
#include "model/llama_model.hpp"

namespace l3::test {

inline std::vector<float> training_logprobs(model::LlamaModel& model,
                                            const std::vector<std::int32_t>& tokens,
                                            std::size_t first, float logit_scale = 1.0F) {
  model::BatchBuilder builder(1, static_cast<std::int64_t>(tokens.size()), 0);
  std::vector<std::uint8_t> mask(tokens.size(), 0);
  std::fill(mask.begin() + static_cast<std::ptrdiff_t>(first), mask.end(), 1);
  builder.add(tokens, mask);
  model.load_batch(builder.finish());
  model.forward({});
  const model::HeadInputs in = model.head();
  if (in.counted != static_cast<std::int64_t>(tokens.size() - first)) {
    throw core::internal_error("training_logprobs: the batch counts other positions");
  }
  std::vector<float> row_loss(tokens.size() - first);
  model.ops().lm_head_cross_entropy({.row_loss = kernels::TensorView(std::span(row_loss)),
                                     .h = in.hidden,
                                     .w = model.lm_head_weight(),
                                     .rows = in.loss_rows,
                                     .targets = in.loss_targets,
                                     .logit_scale = logit_scale});
  for (float& l : row_loss) l = -l;
  return row_loss;
}

}  // namespace l3::test
