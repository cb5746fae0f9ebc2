#include "train/grpo/greedy_answers.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/bounded_read.hpp"
#include "core/error.hpp"
#include "core/timer.hpp"
#include "dist/collectives.hpp"
#include "model/generation_engine.hpp"
#include "train/grpo/answer_match.hpp"

namespace l3::train::grpo {

namespace {

// The engine's concurrent completions on one rank: its share of the prompts, at most 64 (grpo's
// bound, so that a pass has the rows a step's generation has).
int engine_slots(std::int64_t share) {
  return static_cast<int>(std::clamp<std::int64_t>(share, 1, 64));
}

}  // namespace

EvalMetrics greedy_answers(const dist::World& world, model::LlamaModel& model,
                           const PromptSet& prompts, const tokenizer::Tokenizer& tokenizer,
                           const GreedyAnswerConfig& config) {
  const core::Stopwatch watch;
  const std::int64_t longest_prompt = config.seq_len - config.max_completion_length;
  if (longest_prompt < 1) {
    throw core::usage_error(
        fmt::format("--seq-len {} leaves no room for a prompt beside --max-completion-length {}",
                    config.seq_len, config.max_completion_length));
  }
  // Every rank reads the same records: the same selection everywhere.
  std::vector<std::int64_t> answered;
  std::int64_t too_long = 0;
  std::int64_t without_answer = 0;
  for (std::int64_t i = 0; i < prompts.size(); ++i) {
    const std::optional<std::string> answer =
        expected_answer(core::parse_json(prompts.record(i), "", {}));
    if (!answer) {
      ++without_answer;
    } else if (static_cast<std::int64_t>(prompts.prompt(i).size()) > longest_prompt) {
      ++too_long;
    } else {
      answered.push_back(i);
    }
  }
  if (answered.empty()) {
    throw core::bad_input(
        without_answer == prompts.size()
            ? std::string(R"(no prompt record has an "answer" (a string or a number) to compare )"
                          "greedy completions with")
            : fmt::format("no prompt with an \"answer\" fits in --seq-len {} with "
                          "--max-completion-length {} (prompts of at most {} tokens)",
                          config.seq_len, config.max_completion_length, longest_prompt),
        {.file = prompts.directory()});
  }
  const auto n = static_cast<std::int64_t>(answered.size());
  const std::int64_t begin = n * world.rank() / world.size();
  const std::int64_t end = n * (world.rank() + 1) / world.size();

  const model::SamplingSettings greedy{
      .temperature = 0.0,
      .stop_tokens = {tokenizer.special(tokenizer::Special::end_of_turn),
                      tokenizer.special(tokenizer::Special::end_of_text)},
      .vocab_limit = tokenizer.vocab_size()};
  model::GenerationEngine engine(
      model,
      model::EngineShape{.slots = engine_slots((n + world.size() - 1) / world.size()),
                         .capacity = config.seq_len},
      greedy);
  // Sums over the ranks: matches, completion lengths (the stop token counted, as grpo's
  // completions/mean_length), truncated completions.
  std::vector<double> sums(3, 0.0);
  std::int64_t next = begin;
  engine.run(
      [&]() -> std::optional<model::GenerationRequest> {
        if (next == end) return std::nullopt;
        const std::int64_t record = answered[static_cast<std::size_t>(next++)];
        const std::span<const std::int32_t> ids = prompts.prompt(record);
        return model::GenerationRequest{.record = record,
                                        .prompt = {ids.begin(), ids.end()},
                                        .max_new = config.max_completion_length};
      },
      [&](model::GenerationOutput&& o) {
        const nlohmann::json record = core::parse_json(prompts.record(o.record), "", {});
        sums[0] += answer_match(record, tokenizer.decode(o.tokens));
        sums[1] += static_cast<double>(o.tokens.size() + (o.stop_token >= 0 ? 1U : 0U));
        sums[2] += o.stopped ? 0.0 : 1.0;
      },
      {},
      // Every rank runs the passes together: with sharded weights a pass gathers them.
      [&](bool work) {
        return dist::all_reduce(world.comm(), work ? 1 : 0, dist::ReduceOp::max,
                                "eval generation pass") > 0;
      });
  dist::all_reduce(world.comm(), std::span<double>(sums), dist::ReduceOp::sum, "eval answers");

  EvalMetrics m;
  m.phase = Phase::grpo;
  m.skipped_samples = too_long;
  const auto count = static_cast<double>(n);
  m.extra.emplace_back("rewards/answer_match/mean", sums[0] / count);
  m.extra.emplace_back("completions/mean_length", sums[1] / count);
  m.extra.emplace_back("completions/truncated", sums[2] / count);
  m.extra.emplace_back("prompts", count);
  if (without_answer > 0)
    m.extra.emplace_back("prompts_without_answer", static_cast<double>(without_answer));
  m.seconds = watch.seconds();
  return m;
}

}  // namespace l3::train::grpo
