#include "model/generator.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "catch.hpp"
#include "core/error.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "model/token_sampler.hpp"
#include "numeric_support.hpp"
#include "train/objectives/bradley_terry_loss.hpp"
#include "train/reward_scores.hpp"

using l3::model::BatchBuilder;
using l3::model::GenerationOptions;
using l3::model::GenerationResult;
using l3::model::Generator;
using l3::model::HeadKind;
using l3::model::LlamaModel;
using l3::model::ModelConfig;
using l3::model::SamplingParams;
using l3::test::rel_error;

namespace {

// Weights larger than the 0.02 init, so that attention and every layer shape the logits.
void randomize(LlamaModel& model, std::uint32_t stream) {
  model.initialize(l3::test::test_seed() + stream);
  auto p = model.parameters().as<float>();
  l3::test::Random rnd(stream);
  const auto noise = rnd.normal(p.size(), 0.1F);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] += noise[i];
}

// Logits (n, V) of one sequence in one forward pass of the whole model.
std::vector<float> full_logits(LlamaModel& model, const std::vector<std::int32_t>& tokens) {
  BatchBuilder builder(1, static_cast<std::int64_t>(tokens.size()), 0);
  builder.add(tokens, std::vector<std::uint8_t>(tokens.size(), 1));
  return model.logits(builder.finish());
}

std::vector<float> row(const std::vector<float>& logits, std::int64_t r, std::int64_t vocab) {
  return {logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab};
}

// The tiny preset with randomized weights on the CPU backend.
struct TinyModel {
  explicit TinyModel(std::uint32_t stream) { randomize(model, stream); }
  const ModelConfig c = l3::model::preset("tiny");
  l3::kernels::CpuOps ops;
  LlamaModel model{c, HeadKind::language_model, ops};
};

// log-softmax of `logits` at `token`, in fp64 from scratch (no max subtracted).
double reference_logprob(const std::vector<float>& logits, std::int32_t token) {
  double sum = 0;
  for (const float l : logits) sum += std::exp(static_cast<double>(l));
  return static_cast<double>(logits[static_cast<std::size_t>(token)]) - std::log(sum);
}

GenerationResult run(LlamaModel& model, const std::vector<std::int32_t>& prompt,
                     const GenerationOptions& options) {
  Generator generator(model);
  return generator.generate(prompt, options);
}

}  // namespace

TEST_CASE("generator logits equal the full forward pass at every position", "[generate]") {
  INFO("seed " << l3::test::test_seed());
  for (const bool tied : {false, true}) {
    INFO("tied " << tied);
    ModelConfig c = l3::model::preset("tiny");
    c.tie_word_embeddings = tied;
    l3::kernels::CpuOps ops;
    LlamaModel model(c, HeadKind::language_model, ops);
    randomize(model, 40);
    l3::test::Random rnd(41);
    const std::int64_t prompt = 13;
    const std::int64_t total = 21;
    const auto tokens = rnd.integers(static_cast<std::size_t>(total), 512);
    const std::vector<float> expected = full_logits(model, tokens);

    Generator generator(model);
    generator.reset(total);
    const std::vector<float> prefill =
        generator.extend(std::span(tokens).first(static_cast<std::size_t>(prompt)), true);
    REQUIRE(prefill.size() == static_cast<std::size_t>(prompt * c.vocab_size));
    for (std::int64_t t = 0; t < prompt; ++t) {
      INFO("prefill position " << t);
      CHECK(rel_error(row(prefill, t, c.vocab_size), row(expected, t, c.vocab_size)) < 1e-4);
    }
    // several tokens at once into a non-empty cache (the host attention with n > 1)
    const std::int64_t chunk = 3;
    const std::vector<float> extended =
        generator.extend(std::span(tokens).subspan(static_cast<std::size_t>(prompt), chunk), true);
    for (std::int64_t t = 0; t < chunk; ++t) {
      INFO("chunk position " << prompt + t);
      CHECK(rel_error(row(extended, t, c.vocab_size), row(expected, prompt + t, c.vocab_size)) <
            1e-4);
    }
    for (std::int64_t t = prompt + chunk; t < total; ++t) {
      INFO("decode position " << t);
      const std::vector<float> logits =
          generator.extend(std::span(tokens).subspan(static_cast<std::size_t>(t), 1));
      CHECK(rel_error(logits, row(expected, t, c.vocab_size)) < 1e-4);
    }
    CHECK(generator.length() == total);
    CHECK_THROWS_AS(generator.extend(std::span(tokens).first(1)), l3::core::Error);  // full
  }
}

TEST_CASE("greedy generation is deterministic and follows the argmax of full logits",
          "[generate]") {
  INFO("seed " << l3::test::test_seed());
  TinyModel tiny(42);
  const ModelConfig& c = tiny.c;
  LlamaModel& model = tiny.model;
  l3::test::Random rnd(43);
  const auto prompt = rnd.integers(9, 512);
  GenerationOptions options;
  options.max_new = 12;
  const GenerationResult result = run(model, prompt, options);
  CHECK_FALSE(result.stopped);
  REQUIRE(result.tokens.size() == 12);
  CHECK(run(model, prompt, options).tokens == result.tokens);

  REQUIRE(result.logprobs.size() == result.tokens.size());
  std::vector<std::int32_t> sequence = prompt;
  for (std::size_t i = 0; i < result.tokens.size(); ++i) {
    const std::int32_t token = result.tokens[i];
    const auto logits = full_logits(model, sequence);
    const auto last = row(logits, static_cast<std::int64_t>(sequence.size()) - 1, c.vocab_size);
    const std::int32_t expected = l3::model::argmax(last);
    INFO("position " << sequence.size() << ": " << token << " vs " << expected);
    CHECK(result.logprobs[i] == Approx(reference_logprob(last, token)).margin(1e-4));
    CHECK(result.logprobs[i] <= 0.0);
    // the same token, or a tie within fp32 rounding of the two computations
    CHECK((token == expected || std::abs(last[static_cast<std::size_t>(token)] -
                                         last[static_cast<std::size_t>(expected)]) < 1e-5F));
    sequence.push_back(token);
  }
}

TEST_CASE("prompt log-probabilities follow the full forward pass", "[generate]") {
  INFO("seed " << l3::test::test_seed());
  TinyModel tiny(46);
  const ModelConfig& c = tiny.c;
  LlamaModel& model = tiny.model;
  l3::test::Random rnd(47);
  const auto prompt = rnd.integers(11, 512);
  GenerationOptions options;
  options.max_new = 3;
  options.prompt_logprobs = true;
  const GenerationResult result = run(model, prompt, options);
  REQUIRE(result.prompt_logprobs.size() == prompt.size() - 1);
  const auto logits = full_logits(model, prompt);
  for (std::size_t i = 1; i < prompt.size(); ++i) {
    INFO("prompt position " << i);
    const auto r = row(logits, static_cast<std::int64_t>(i) - 1, c.vocab_size);
    CHECK(result.prompt_logprobs[i - 1] == Approx(reference_logprob(r, prompt[i])).margin(1e-4));
  }
  // Asked for or not, the generation is the same (up to the last bits of the first token's
  // logits: the prefill's lm_head then multiplies all the prompt's rows, not the last alone).
  options.prompt_logprobs = false;
  const GenerationResult plain = run(model, prompt, options);
  CHECK(plain.tokens == result.tokens);
  REQUIRE(plain.logprobs.size() == result.logprobs.size());
  for (std::size_t i = 0; i < plain.logprobs.size(); ++i)
    CHECK(plain.logprobs[i] == Approx(result.logprobs[i]).margin(1e-6));
  CHECK(plain.prompt_logprobs.empty());
  // With nothing to generate, the prompt is still scored.
  options.prompt_logprobs = true;
  options.max_new = 0;
  CHECK(run(model, prompt, options).prompt_logprobs == result.prompt_logprobs);
}

TEST_CASE("sampling is reproducible with a seed and differs between seeds", "[generate]") {
  INFO("seed " << l3::test::test_seed());
  TinyModel tiny(44);
  LlamaModel& model = tiny.model;
  l3::test::Random rnd(45);
  const auto prompt = rnd.integers(5, 512);
  GenerationOptions options;
  options.max_new = 24;
  options.temperature = 1.0;
  options.top_p = 0.95;
  options.seed = 1;
  const auto first = run(model, prompt, options).tokens;
  CHECK(run(model, prompt, options).tokens == first);
  options.seed = 2;
  CHECK(run(model, prompt, options).tokens != first);

  // A nucleus so small that only the most likely token is left: greedy.
  options.top_p = 1e-9;
  GenerationOptions greedy;
  greedy.max_new = options.max_new;
  CHECK(run(model, prompt, options).tokens == run(model, prompt, greedy).tokens);

  // Only ids below the limit are drawn.
  options.top_p = 1.0;
  options.vocab_limit = 7;
  const auto limited = run(model, prompt, options).tokens;
  CHECK(std::all_of(limited.begin(), limited.end(), [](std::int32_t t) { return t < 7; }));
}

TEST_CASE("generation ends at a stop token and leaves it out", "[generate]") {
  INFO("seed " << l3::test::test_seed());
  const ModelConfig c = l3::model::preset("tiny");
  l3::kernels::CpuOps ops;
  LlamaModel model(c, HeadKind::language_model, ops);
  randomize(model, 46);
  l3::test::Random rnd(47);
  const auto prompt = rnd.integers(6, 512);
  GenerationOptions options;
  options.max_new = 10;
  options.temperature = 1.0;
  options.seed = 3;
  const auto all = run(model, prompt, options).tokens;
  REQUIRE(all.size() == 10);
  const std::int32_t stop = all[4];
  const auto first = std::find(all.begin(), all.end(), stop) - all.begin();
  options.stop_tokens = {999, stop};
  const GenerationResult stopped = run(model, prompt, options);
  CHECK(stopped.stopped);
  CHECK(stopped.tokens == std::vector<std::int32_t>(all.begin(), all.begin() + first));

  options.max_new = 0;
  const GenerationResult none = run(model, prompt, options);
  CHECK(none.tokens.empty());
  CHECK_FALSE(none.stopped);
}

TEST_CASE("generation beyond max position embeddings is a usage error", "[generate]") {
  ModelConfig c = l3::model::preset("tiny");
  c.max_position_embeddings = 32;
  l3::kernels::CpuOps ops;
  LlamaModel model(c, HeadKind::language_model, ops);
  model.initialize(5);
  const std::vector<std::int32_t> prompt(30, 65);
  GenerationOptions options;
  options.max_new = 2;
  CHECK(run(model, prompt, options).tokens.size() == 2);
  options.max_new = 3;
  try {
    (void)run(model, prompt, options);
    FAIL("no error");
  } catch (const l3::core::Error& e) {
    CHECK(e.kind() == l3::core::ErrorKind::usage);
    CHECK(std::string(e.what()).find("max_position_embeddings 32") != std::string::npos);
  }
  CHECK_THROWS_AS(run(model, {}, options), l3::core::Error);  // no prompt
  options.max_new = 2;
  options.temperature = -1.0;
  CHECK_THROWS_AS(run(model, prompt, options), l3::core::Error);
  const std::vector<std::int32_t> bad = {1, 512};  // beyond the vocabulary
  options.temperature = 0.0;
  CHECK_THROWS_AS(run(model, bad, options), l3::core::Error);
  LlamaModel reward(c, HeadKind::reward, ops);
  CHECK_THROWS_AS(Generator(reward), l3::core::Error);
}

TEST_CASE("the sampler draws from the tempered nucleus", "[generate]") {
  // probabilities 0.5, 0.3, 0.2 at temperature 1
  const std::vector<float> logits = {std::log(0.5F), std::log(0.3F), std::log(0.2F)};
  const SamplingParams plain{1.0, 1.0};
  CHECK(l3::model::sample_token(logits, plain, 0.0) == 0);
  CHECK(l3::model::sample_token(logits, plain, 0.49) == 0);
  CHECK(l3::model::sample_token(logits, plain, 0.51) == 1);
  CHECK(l3::model::sample_token(logits, plain, 0.79) == 1);
  CHECK(l3::model::sample_token(logits, plain, 0.81) == 2);
  CHECK(l3::model::sample_token(logits, plain, 0.999999) == 2);

  // top-p 0.6: the nucleus is {0, 1} (0.5 < 0.6 <= 0.8), renormalised to 5/8 and 3/8
  const SamplingParams nucleus{1.0, 0.6};
  CHECK(l3::model::sample_token(logits, nucleus, 0.6) == 0);
  CHECK(l3::model::sample_token(logits, nucleus, 0.65) == 1);
  CHECK(l3::model::sample_token(logits, nucleus, 0.999999) == 1);

  // Frequencies over an even grid of u follow softmax(logits / T): T = 2 flattens them.
  const SamplingParams hot{2.0, 1.0};
  std::vector<int> counts(3, 0);
  const int draws = 10000;
  for (int i = 0; i < draws; ++i) {
    ++counts[static_cast<std::size_t>(l3::model::sample_token(logits, hot, (i + 0.5) / draws))];
  }
  const std::vector<double> weights = {std::sqrt(0.5), std::sqrt(0.3), std::sqrt(0.2)};
  const double total = weights[0] + weights[1] + weights[2];
  for (std::size_t k = 0; k < 3; ++k) {
    CHECK(counts[k] / static_cast<double>(draws) == Approx(weights[k] / total).margin(2e-4));
  }

  CHECK(l3::model::sample_token(logits, SamplingParams{0.0, 0.5}, 0.9) == 0);  // greedy
  CHECK_THROWS_AS(l3::model::validate(SamplingParams{-0.1, 1.0}), l3::core::Error);
  CHECK_THROWS_AS(l3::model::validate(SamplingParams{1.0, 0.0}), l3::core::Error);
  CHECK_THROWS_AS(l3::model::validate(SamplingParams{1.0, 1.5}), l3::core::Error);
  CHECK_THROWS_AS(l3::model::validate(SamplingParams{NAN, 1.0}), l3::core::Error);
}

TEST_CASE("sequence rewards equal the scores of a reward batch", "[generate][reward]") {
  INFO("seed " << l3::test::test_seed());
  const ModelConfig c = l3::model::preset("tiny");
  l3::kernels::CpuOps ops;
  LlamaModel model(c, HeadKind::reward, ops);
  randomize(model, 48);
  l3::test::Random rnd(49);
  const auto chosen = rnd.integers(11, 512);
  const auto rejected = rnd.integers(7, 512);
  const auto pair = l3::train::pair_rewards(model, chosen, rejected, 4);
  // Different batch shapes sum in different orders: fp32 rounding of ~1e-6 in absolute terms,
  // which a relative tolerance alone misjudges when a reward happens to be near 0.
  CHECK(l3::train::sequence_reward(model, chosen, 4) ==
        Approx(pair.chosen).epsilon(1e-5).margin(1e-5));
  CHECK(l3::train::sequence_reward(model, rejected, 4) ==
        Approx(pair.rejected).epsilon(1e-5).margin(1e-5));

  BatchBuilder builder(2, 16, 4);
  builder.add_pair(chosen, rejected);
  const auto out = l3::train::BradleyTerryLoss(model).forward(builder.finish(), 0.0);
  CHECK(out.chosen[0] == Approx(pair.chosen).epsilon(1e-5).margin(1e-5));
  CHECK(out.rejected[0] == Approx(pair.rejected).epsilon(1e-5).margin(1e-5));
  CHECK(pair.chosen != pair.rejected);
}
