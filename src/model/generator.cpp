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

double log_probability(std::span<const float> logits, std::int32_t token, float scale) {
  if (token < 0 || static_cast<std::size_t>(token) >= logits.size()) {
    throw core::internal_error(
        fmt::format("log_probability: token {} outside {} logits", token, logits.size()));
  }
  const auto z = [scale](float l) { return static_cast<double>(scale * l); };
  const double top = z(*std::max_element(logits.begin(), logits.end()));
  double sum = 0.0;
  for (const float l : logits) sum += std::exp(z(l) - top);
  return z(logits[static_cast<std::size_t>(token)]) - top - std::log(sum);
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
  if (options.prompt_logprobs) {
    BatchBuilder builder(1, length, 0);
    builder.add({prompt.begin(), prompt.end()}, std::vector<std::uint8_t>(prompt.size(), 1));
    const std::vector<float> all = model_.logits(builder.finish());  // (prompt, V)
    const auto v = static_cast<std::size_t>(model_.config().vocab_size);
    for (std::size_t i = 1; i < prompt.size(); ++i) {
      result.prompt_logprobs.push_back(
          log_probability(std::span<const float>(all).subspan((i - 1) * v, v), prompt[i], scale));
    }
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
