#include "model/generator.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <vector>

#include "catch.hpp"
#include "core/error.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/cpu/token_sampling.hpp"
#include "model/generation_engine.hpp"
#include "numeric_support.hpp"
#include "train/objectives/bradley_terry_loss.hpp"
#include "train/reward_scores.hpp"
#include "training_logprobs.hpp"

using l3::model::BatchBuilder;
using l3::model::EngineShape;
using l3::model::GenerationEngine;
using l3::model::GenerationOptions;
using l3::model::GenerationOutput;
using l3::model::GenerationRequest;
using l3::model::GenerationResult;
using l3::model::Generator;
using l3::model::HeadKind;
using l3::model::LlamaModel;
using l3::model::ModelConfig;
using l3::model::SamplingSettings;
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

// Every completion of `requests` through one engine.
std::vector<GenerationOutput> generate_all(LlamaModel& model,
                                           const std::vector<GenerationRequest>& requests,
                                           const EngineShape& shape,
                                           const SamplingSettings& settings,
                                           const GenerationEngine::StopCheck& stop = {}) {
  GenerationEngine engine(model, shape, settings);
  std::size_t next = 0;
  std::vector<GenerationOutput> outputs;
  engine.run(
      [&]() -> std::optional<GenerationRequest> {
        if (next == requests.size()) return std::nullopt;
        return requests[next++];
      },
      [&](GenerationOutput&& out) { outputs.push_back(std::move(out)); }, stop);
  // in request order (they finish in any)
  std::sort(outputs.begin(), outputs.end(), [](const auto& a, const auto& b) {
    return std::pair(a.record, a.sample) < std::pair(b.record, b.sample);
  });
  return outputs;
}

// Prompts of several lengths, two samples each.
std::vector<GenerationRequest> mixed_requests(std::uint32_t stream, std::int64_t max_new) {
  l3::test::Random rnd(stream);
  std::vector<GenerationRequest> requests;
  for (const std::size_t length : {5U, 13U, 1U, 9U, 17U}) {
    const auto prompt = rnd.integers(length, 512);
    for (std::int64_t sample = 0; sample < 2; ++sample) {
      requests.push_back({.record = static_cast<std::int64_t>(requests.size() / 2),
                          .sample = sample,
                          .prompt = prompt,
                          .max_new = max_new});
    }
  }
  return requests;
}

}  // namespace

TEST_CASE("generated log-probabilities equal the training forward's", "[generate]") {
  INFO("seed " << l3::test::test_seed());
  for (const bool tied : {false, true}) {
    // 0.7 with tempered log-probabilities: GRPO's (TRL's), of softmax(logits / 0.7)
    for (const double temperature : {0.0, 1.0, 0.7}) {
      const bool tempered = temperature == 0.7;
      const float scale = tempered ? l3::kernels::logit_scale(temperature) : 1.0F;
      INFO("tied " << tied << ", temperature " << temperature);
      ModelConfig c = l3::model::preset("tiny");
      c.tie_word_embeddings = tied;
      l3::kernels::CpuOps ops;
      LlamaModel model(c, HeadKind::language_model, ops);
      randomize(model, 40);
      const auto requests = mixed_requests(41, 8);
      // 3 slots for 10 requests (continuous batching), and few rows per pass: the 17-token
      // prompt is prefilled in chunks, the later ones against its cached prefix.
      const auto outputs =
          generate_all(model, requests, {.slots = 3, .capacity = 32, .prefill_chunk = 6},
                       {.temperature = temperature, .seed = 7, .tempered_logprobs = tempered});
      REQUIRE(outputs.size() == requests.size());
      double worst = 0.0;
      std::size_t exact = 0;
      std::size_t total = 0;
      for (std::size_t i = 0; i < outputs.size(); ++i) {
        const GenerationOutput& out = outputs[i];
        REQUIRE(out.tokens.size() == 8);
        REQUIRE(out.logprobs.size() == 8);
        std::vector<std::int32_t> sequence = requests[i].prompt;
        sequence.insert(sequence.end(), out.tokens.begin(), out.tokens.end());
        const auto expected =
            l3::test::training_logprobs(model, sequence, requests[i].prompt.size(), scale);
        for (std::size_t t = 0; t < out.tokens.size(); ++t) {
          const double error = std::abs(out.logprobs[t] - expected[t]) /
                               std::max(1.0, static_cast<double>(std::abs(expected[t])));
          worst = std::max(worst, error);
          exact += out.logprobs[t] == expected[t] ? 1U : 0U;
          ++total;
        }
      }
      INFO(exact << " of " << total << " bit for bit; largest relative difference " << worst);
      CHECK(worst <= 1e-6);
    }
  }
}

TEST_CASE("a completion does not depend on the batch it ran in", "[generate]") {
  INFO("seed " << l3::test::test_seed());
  TinyModel tiny(48);
  const auto requests = mixed_requests(49, 10);
  const SamplingSettings settings{.temperature = 0.9, .top_p = 0.9, .top_k = 40, .seed = 11};
  // Prompts of up to 17 tokens in chunks of 6: chunks after the first attend to the cache.
  const auto one = generate_all(tiny.model, requests,
                                {.slots = 1, .capacity = 27, .prefill_chunk = 6}, settings);
  for (const EngineShape shape :
       {EngineShape{.slots = 4, .capacity = 40, .prefill_chunk = 6},
        EngineShape{.slots = 10, .capacity = 27, .prefill_chunk = 6, .max_rows = 15},
        EngineShape{.slots = 3, .capacity = 30, .prefill_chunk = 6, .max_rows = 8}}) {
    INFO("slots " << shape.slots << ", max rows " << shape.max_rows);
    const auto many = generate_all(tiny.model, requests, shape, settings);
    REQUIRE(many.size() == one.size());
    for (std::size_t i = 0; i < one.size(); ++i) {
      INFO("request " << i);
      CHECK(many[i].tokens == one[i].tokens);
      REQUIRE(many[i].logprobs.size() == one[i].logprobs.size());
      for (std::size_t t = 0; t < one[i].logprobs.size(); ++t) {
        CHECK(many[i].logprobs[t] == one[i].logprobs[t]);  // bit for bit
      }
    }
  }
  // Another sample of the same record draws other tokens.
  CHECK(one[0].tokens != one[1].tokens);
}

TEST_CASE("the engine ends sequences on stop tokens, stop checks and length", "[generate]") {
  INFO("seed " << l3::test::test_seed());
  TinyModel tiny(50);
  auto requests = mixed_requests(51, 6);
  requests[3].max_new = 0;
  requests[4].max_new = 1;
  const SamplingSettings settings{.temperature = 1.0, .seed = 5};
  const auto plain = generate_all(tiny.model, requests, {.slots = 2, .capacity = 24}, settings);
  CHECK(plain[3].tokens.empty());
  CHECK_FALSE(plain[3].stopped);
  CHECK(plain[4].tokens.size() == 1);
  // A stop token cuts every completion at its first occurrence, and is left out.
  const std::int32_t stop = plain[0].tokens[2];
  SamplingSettings stopping = settings;
  stopping.stop_tokens = {stop};
  const auto stopped = generate_all(tiny.model, requests, {.slots = 3, .capacity = 24}, stopping);
  for (std::size_t i = 0; i < plain.size(); ++i) {
    const auto at = std::find(plain[i].tokens.begin(), plain[i].tokens.end(), stop);
    CHECK(stopped[i].tokens == std::vector<std::int32_t>(plain[i].tokens.begin(), at));
    CHECK(stopped[i].stopped == (at != plain[i].tokens.end()));
  }
  // A stop check (the stop strings') ends a sequence after the token it saw, kept.
  const auto checked =
      generate_all(tiny.model, requests, {.slots = 2, .capacity = 24}, settings,
                   [](const GenerationRequest&, std::span<const std::int32_t> tokens) {
                     return tokens.size() == 2;
                   });
  for (std::size_t i = 0; i < plain.size(); ++i) {
    const std::size_t keep = std::min<std::size_t>(2, plain[i].tokens.size());
    CHECK(checked[i].tokens ==
          std::vector<std::int32_t>(plain[i].tokens.begin(),
                                    plain[i].tokens.begin() + static_cast<std::ptrdiff_t>(keep)));
    CHECK(checked[i].stopped == (plain[i].tokens.size() >= 2));
  }
  // A request beyond the engine's capacity is a usage error.
  auto too_long = requests;
  too_long[2].max_new = 30;
  try {
    (void)generate_all(tiny.model, too_long, {.slots = 2, .capacity = 24}, settings);
    FAIL("no error");
  } catch (const l3::core::Error& e) {
    CHECK(e.kind() == l3::core::ErrorKind::usage);
  }
  CHECK_THROWS_AS(l3::model::validate(SamplingSettings{.top_k = -1}), l3::core::Error);
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
    const auto expected =
        static_cast<std::int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
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
  using Rule = l3::kernels::cpu::SamplingRule;
  l3::kernels::cpu::SamplingScratch scratch;
  const auto draw = [&](const std::vector<float>& logits, const Rule& rule, double u) {
    return l3::kernels::cpu::sample_row(logits, rule, u, scratch);
  };
  // probabilities 0.5, 0.3, 0.2 at temperature 1
  const std::vector<float> logits = {std::log(0.5F), std::log(0.3F), std::log(0.2F)};
  const Rule plain{1.0, 1.0};
  CHECK(draw(logits, plain, 0.0) == 0);
  CHECK(draw(logits, plain, 0.49) == 0);
  CHECK(draw(logits, plain, 0.51) == 1);
  CHECK(draw(logits, plain, 0.79) == 1);
  CHECK(draw(logits, plain, 0.81) == 2);
  CHECK(draw(logits, plain, 0.999999) == 2);

  // top-p 0.6: the nucleus is {0, 1} (0.5 < 0.6 <= 0.8), renormalised to 5/8 and 3/8
  const Rule nucleus{1.0, 0.6};
  CHECK(draw(logits, nucleus, 0.6) == 0);
  CHECK(draw(logits, nucleus, 0.65) == 1);
  CHECK(draw(logits, nucleus, 0.999999) == 1);

  // Frequencies over an even grid of u follow softmax(logits / T): T = 2 flattens them.
  const Rule hot{2.0, 1.0};
  std::vector<int> counts(3, 0);
  const int draws = 10000;
  for (int i = 0; i < draws; ++i) {
    ++counts[static_cast<std::size_t>(draw(logits, hot, (i + 0.5) / draws))];
  }
  const std::vector<double> weights = {std::sqrt(0.5), std::sqrt(0.3), std::sqrt(0.2)};
  const double total = weights[0] + weights[1] + weights[2];
  for (std::size_t k = 0; k < 3; ++k) {
    CHECK(counts[k] / static_cast<double>(draws) == Approx(weights[k] / total).margin(2e-4));
  }

  CHECK(draw(logits, Rule{0.0, 0.5}, 0.9) == 0);  // greedy
  // top-k 2 keeps {0, 1} (5/8, 3/8), whatever top-p leaves of them
  const Rule top2{1.0, 1.0, 2};
  CHECK(draw(logits, top2, 0.6) == 0);
  CHECK(draw(logits, top2, 0.65) == 1);
  CHECK(draw(logits, Rule{1.0, 0.5, 2}, 0.99) == 0);  // nucleus of {0, 1} at 0.5: {0}
  // The draw walks the kept ids in ascending order: with 0.2, 0.3, 0.5 the nucleus at 0.6 is
  // {1, 2} (3/8, 5/8), and a small u picks id 1.
  const std::vector<float> rising = {std::log(0.2F), std::log(0.3F), std::log(0.5F)};
  CHECK(draw(rising, Rule{1.0, 0.6}, 0.3) == 1);
  CHECK(draw(rising, Rule{1.0, 0.6}, 0.4) == 2);
  // Ties: the lower id first.
  const std::vector<float> flat = {0.0F, 0.0F, 0.0F, 0.0F};
  CHECK(draw(flat, Rule{1.0, 1.0, 1}, 0.99) == 0);
  CHECK(draw(flat, Rule{1.0, 0.5}, 0.99) == 1);
  CHECK(draw(flat, Rule{0.0, 1.0}, 0.5) == 0);
  using l3::model::SamplingSettings;
  CHECK_THROWS_AS(l3::model::validate(SamplingSettings{.temperature = -0.1}), l3::core::Error);
  CHECK_THROWS_AS(l3::model::validate(SamplingSettings{.top_p = 0.0}), l3::core::Error);
  CHECK_THROWS_AS(l3::model::validate(SamplingSettings{.top_p = 1.5}), l3::core::Error);
  CHECK_THROWS_AS(l3::model::validate(SamplingSettings{.temperature = NAN}), l3::core::Error);
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

namespace {

// Every turn of every request's multi-turn sequence through one engine: after turn 1 the
// sequence goes on with {3 + record, 7, 11} and 5 new tokens at most, after turn 2 with
// {5 + sample} and 4, and it ends after turn 3. Turns by (record, sample), in order.
using Turns = std::map<std::pair<std::int64_t, std::int64_t>, std::vector<GenerationOutput>>;
Turns run_three_turns(LlamaModel& model, const std::vector<GenerationRequest>& requests,
                      const EngineShape& shape, const SamplingSettings& settings) {
  GenerationEngine engine(model, shape, settings);
  std::size_t next = 0;
  Turns turns;
  engine.run_turns(
      [&]() -> std::optional<GenerationRequest> {
        if (next == requests.size()) return std::nullopt;
        return requests[next++];
      },
      [&](GenerationOutput&& turn) -> std::optional<GenerationEngine::Continuation> {
        std::vector<GenerationOutput>& mine = turns[{turn.record, turn.sample}];
        const std::int64_t record = turn.record;
        const std::int64_t sample = turn.sample;
        mine.push_back(std::move(turn));
        if (mine.size() == 1) {
          return GenerationEngine::Continuation{
              .tokens = {static_cast<std::int32_t>(3 + record), 7, 11}, .max_new = 5};
        }
        if (mine.size() == 2) {
          return GenerationEngine::Continuation{.tokens = {static_cast<std::int32_t>(5 + sample)},
                                                .max_new = 4};
        }
        return std::nullopt;
      });
  return turns;
}

}  // namespace

TEST_CASE("multi-turn sequences continue from the cache, as a whole sequence's forward pass",
          "[generate]") {
  INFO("seed " << l3::test::test_seed());
  TinyModel tiny(52);
  const auto requests = mixed_requests(53, 6);
  const SamplingSettings settings{.temperature = 0.9, .seed = 13};
  // Prompts of up to 17 tokens, 6 + 3 + 5 + 1 + 4 more: capacity 36. One slot at a time, then
  // slots sharing passes with few rows (continuations prefilled beside decoding rows).
  const Turns one = run_three_turns(tiny.model, requests,
                                    {.slots = 1, .capacity = 36, .prefill_chunk = 6}, settings);
  REQUIRE(one.size() == requests.size());
  const Turns many =
      run_three_turns(tiny.model, requests,
                      {.slots = 4, .capacity = 36, .prefill_chunk = 6, .max_rows = 10}, settings);
  double worst = 0.0;
  for (const GenerationRequest& request : requests) {
    INFO("record " << request.record << ", sample " << request.sample);
    const std::vector<GenerationOutput>& turns = one.at({request.record, request.sample});
    const std::vector<GenerationOutput>& other = many.at({request.record, request.sample});
    REQUIRE(turns.size() == 3);
    REQUIRE(other.size() == 3);
    // The whole sequence: prompt, turn, continuation, turn, continuation, turn.
    std::vector<std::int32_t> sequence = request.prompt;
    std::vector<std::size_t> drawn;  // positions after the prompt of the drawn tokens
    const std::vector<std::vector<std::int32_t>> continuations = {
        {static_cast<std::int32_t>(3 + request.record), 7, 11},
        {static_cast<std::int32_t>(5 + request.sample)}};
    const std::vector<std::size_t> limits = {6, 5, 4};
    for (std::size_t k = 0; k < 3; ++k) {
      CHECK(turns[k].tokens.size() == limits[k]);  // no stop token: each turn to its max_new
      CHECK_FALSE(turns[k].stopped);
      CHECK(other[k].tokens == turns[k].tokens);  // whatever the slots and rows: bit for bit
      CHECK(other[k].logprobs == turns[k].logprobs);
      for (const std::int32_t t : turns[k].tokens) {
        drawn.push_back(sequence.size() - request.prompt.size());
        sequence.push_back(t);
      }
      if (k < 2) sequence.insert(sequence.end(), continuations[k].begin(), continuations[k].end());
    }
    const auto expected =
        l3::test::training_logprobs(tiny.model, sequence, request.prompt.size(), 1.0F);
    std::size_t d = 0;
    for (const GenerationOutput& turn : turns) {
      for (const float logprob : turn.logprobs) {
        const double e = expected[drawn[d++]];
        worst = std::max(worst, std::abs(logprob - e) / std::max(1.0, std::abs(e)));
      }
    }
  }
  INFO("largest relative difference from the whole sequence's forward pass " << worst);
  CHECK(worst <= 1e-6);
}
