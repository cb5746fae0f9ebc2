#include "cli/score_command.hpp"

#include <fmt/format.h>

#include <exception>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli/inference_model.hpp"
#include "cli/record_scoring.hpp"
#include "core/bounded_read.hpp"
#include "core/error.hpp"
#include "dist/collectives.hpp"
#include "dist/communicator.hpp"
#include "io/prep/input_split.hpp"
#include "train/reward_scores.hpp"

namespace l3::cli {

using nlohmann::json;

void declare_score_options(po::options_description& options,
                           po::positional_options_description& /*positional*/) {
  declare_inference_model_options(options);
  options.add_options()("prompt", po::value<std::string>()->value_name("TEXT"),
                        "the user's message (with --response)")(
      "response", po::value<std::string>()->value_name("TEXT"), "the assistant's answer to score")(
      "input", po::value<std::string>()->value_name("FILE.jsonl"),
      R"(score the records of a JSONL file (plain or .gz): {"prompt", "chosen", "rejected"} )"
      R"(pairs or {"prompt", "response"})")(
      "json", po::bool_switch(),
      R"(with --prompt/--response: print {"reward", "tokens", "ids"} (ids: the scored sequence))")(
      "shard-parameters", po::bool_switch(),
      "on N ranks: hold 1/N of the weights per rank (a model larger than one rank's memory) and "
      "score N records at a time, one per rank (CPU backend)");
}

namespace {

// What a rank sends rank 0 for its record of a round.
struct ScoredRecord {
  std::int64_t line = 0;  // 0: no record (the round had fewer records than ranks)
  std::int32_t pair = 0;
  float chosen = 0.0F;
  float rejected = 0.0F;
};

// The records of `path` over the ranks of `world` (one rank, or with --shard-parameters all of
// them): every rank reads the file; the records go to the ranks in rounds of one each, and
// every rank makes one forward pass per round (an idle one without a record), so that a sharded
// model's gathers stay collective. A bad record stops every rank before the round's passes (its
// rank reports it with file:line); rank 0 prints the scores in file order, then the summary.
void score_file(const dist::World& world, const std::string& path, model::LlamaModel& model,
                const prep::RecordFormatter& formatter, std::int32_t pad_id) {
  ScoreSummary summary;
  std::vector<std::pair<std::int64_t, std::string>> round;  // (line number, text)
  const auto run_round = [&](const std::string& file) {
    ScoredRecord mine;
    ScoringInput input;
    std::exception_ptr failure;
    const auto r = static_cast<std::size_t>(world.rank());
    if (r < round.size()) {
      mine.line = round[r].first;
      try {
        const core::ErrorContext where{.file = file, .line = mine.line};
        try {
          input = prepare_record(formatter, core::parse_json(round[r].second, "", where));
        } catch (core::Error& e) {
          e.add_context(where);
          throw;
        }
      } catch (...) {
        failure = std::current_exception();
      }
    }
    dist::agree_on_failure(world, failure);
    if (mine.line > 0) {
      const RecordScore score = score_prepared(model, input, pad_id);
      mine.pair = score.pair ? 1 : 0;
      mine.chosen = score.chosen;
      mine.rejected = score.rejected;
    } else {
      train::score_nothing(model);
    }
    const std::vector<ScoredRecord> all = dist::gather_bytes(world.comm(), mine, 0, "scores");
    for (const ScoredRecord& s : all) {
      if (s.line == 0) continue;
      const RecordScore score{.pair = s.pair != 0, .chosen = s.chosen, .rejected = s.rejected};
      summary.add(score);
      std::cout << score.to_json(s.line).dump() << '\n';
    }
    round.clear();
  };
  for (const prep::InputFile& input : prep::list_inputs({path})) {
    std::int64_t number = 0;
    prep::for_each_line(input, prep::FileRange{.file = 0, .begin = 0, .end = input.size},
                        [&](std::string_view line, std::int64_t /*offset*/) {
                          ++number;
                          if (prep::is_blank_line(line)) return;
                          round.emplace_back(number, std::string(line));
                          if (round.size() == static_cast<std::size_t>(world.size()))
                            run_round(input.path);
                        });
    if (!round.empty()) run_round(input.path);
  }
  if (world.is_root()) std::cout << summary.to_json().dump() << '\n';
}

}  // namespace

int run_score(const CommandContext& context) {
  const po::variables_map& o = context.options;
  const std::string path = model_path_option(o);
  const bool file = o.count("input") > 0;
  const bool pair = o.count("prompt") > 0 || o.count("response") > 0;
  if (file == pair || (pair && (o.count("prompt") == 0 || o.count("response") == 0))) {
    throw core::usage_error("give --prompt TEXT --response TEXT, or --input FILE.jsonl");
  }
  const bool sharded = o["shard-parameters"].as<bool>();
  // An interactive tool: one rank works, unless the weights are spread over the ranks.
  if (!sharded && !context.world.is_root()) return core::kExitOk;

  const InferenceModel loaded =
      load_inference_model(path, model::HeadKind::reward, train::ModelPurpose::score,
                           sharded ? &context.world : nullptr, adapter_option(o));
  const tokenizer::Tokenizer tokenizer = load_inference_tokenizer(o, loaded, context.log);
  context.log.info("loaded {}{} (step {}, {:.1f} M parameters)", loaded.step_dir,
                   loaded.adapter.empty() ? "" : " with the adapter " + loaded.adapter,
                   loaded.manifest.step,
                   static_cast<double>(loaded.model->layout().parameter_count()) / 1e6);
  // Formatted as `prep preference` formats the chosen side of a record: the reward model's
  // training data.
  const prep::RecordFormatter formatter(tokenizer, prep::FormatOptions{});
  const std::int32_t pad_id = tokenizer.special(tokenizer::Special::finetune_right_pad);

  if (file) {
    const std::string input = o["input"].as<std::string>();
    if (sharded) {
      score_file(context.world, input, *loaded.model, formatter, pad_id);
    } else {
      const dist::World alone(MPI_COMM_SELF);
      score_file(alone, input, *loaded.model, formatter, pad_id);
    }
  } else {
    // Every rank formats the record (the same error everywhere, if any), then rank 0 scores it
    // while the others take part in its gathers.
    const json record = {{"prompt", o["prompt"].as<std::string>()},
                         {"response", o["response"].as<std::string>()}};
    const std::vector<std::int32_t> tokens = formatter.response(record).tokens;
    if (!context.world.is_root()) {
      train::score_nothing(*loaded.model);
      return core::kExitOk;
    }
    const float reward = train::sequence_reward(*loaded.model, tokens, pad_id);
    if (o["json"].as<bool>()) {
      std::cout << nlohmann::ordered_json{{"reward", json_number(reward)},
                                          {"tokens", tokens.size()},
                                          {"ids", tokens}}
                       .dump()
                << '\n';
    } else {
      std::cout << fmt::format("{}\n", reward);
    }
  }
  std::cout.flush();
  return core::kExitOk;
}

}  // namespace l3::cli
