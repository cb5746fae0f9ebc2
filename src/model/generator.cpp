#include "model/generator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "core/error.hpp"
#include "model/batch.hpp"

namespace l3::model {

Generator::Generator(LlamaModel& model) : model_(model) {
  if (model.layout().head() != HeadKind::language_model) {
    throw core::usage_error(
        "generation needs a model with a language-model head, not a reward "
        "model");
  }
}

GenerationResult Generator::generate(std::span<const std::int32_t> prompt,
                                     const GenerationOptions& options) {
  if (prompt.empty()) throw core::usage_error("generation needs a prompt of at least one token");
  if (options.max_new < 0) {
    throw core::usage_error(fmt::format("max-new must be >= 0, not {}", options.max_new));
  }
  SamplingSettings settings{.temperature = options.temperature,
                            .top_p = options.top_p,
                            .top_k = options.top_k,
                            .seed = options.seed,
                            .stop_tokens = options.stop_tokens,
                            .vocab_limit = options.vocab_limit,
                            .tempered_logprobs = options.tempered_logprobs};
  validate(settings);
  const auto length = static_cast<std::int64_t>(prompt.size());
  const std::int64_t capacity = length + options.max_new;
  if (capacity > model_.config().max_position_embeddings) {
    throw core::usage_error(fmt::format(
        "{} positions (prompt + new tokens) exceed the model's max_position_embeddings {}",
        capacity, model_.config().max_position_embeddings));
  }
  GenerationResult result;
  const float scale = options.tempered_logprobs ? kernels::logit_scale(options.temperature) : 1.0F;
  if (options.prompt_logprobs && prompt.size() > 1) {
    // Each prompt token's log-probability given those before it: the training forward's
    // cross-entropy, a block of logits at a time (never the prompt's whole (length, V)).
    BatchBuilder builder(1, length, 0);
    builder.add({prompt.begin(), prompt.end()}, std::vector<std::uint8_t>(prompt.size(), 1));
    const std::vector<float> logprobs = model_.target_log_probs(builder.finish(), scale);
    result.prompt_logprobs.assign(logprobs.begin(), logprobs.end());
  }
  if (options.max_new == 0) return result;

  GenerationEngine engine(model_, {.slots = 1, .capacity = capacity}, std::move(settings));
  std::optional<GenerationRequest> request =
      GenerationRequest{.prompt = {prompt.begin(), prompt.end()}, .max_new = options.max_new};
  engine.run([&] { return std::exchange(request, std::nullopt); },
             [&](GenerationOutput&& out) {
               result.tokens = std::move(out.tokens);
               result.logprobs.assign(out.logprobs.begin(), out.logprobs.end());
               result.stopped = out.stopped;
             });
  return result;
}

}  // namespace l3::model
