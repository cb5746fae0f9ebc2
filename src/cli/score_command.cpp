#include "cli/score_command.hpp"

#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/inference_model.hpp"
#include "cli/prompt_format.hpp"
#include "cli/record_scoring.hpp"
#include "core/error.hpp"
#include "io/prep/input_split.hpp"
#include "model/reward_scores.hpp"

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
      R"(with --prompt/--response: print {"reward", "tokens", "ids"} (ids: the scored sequence))");
}

namespace {

void score_file(const std::string& path, model::LlamaModel& model,
                const prep::RecordFormatter& formatter, std::int32_t pad_id) {
  ScoreSummary summary;
  for (const prep::InputFile& input : prep::list_inputs({path})) {
    std::int64_t number = 0;
    prep::for_each_line(input, prep::FileRange{.file = 0, .begin = 0, .end = input.size},
                        [&](std::string_view line, std::int64_t /*offset*/) {
                          ++number;
                          if (line.find_first_not_of(" \t\r") == std::string_view::npos) return;
                          const core::ErrorContext where{.file = input.path, .line = number};
                          json record;
                          try {
                            record = json::parse(line);
                          } catch (const json::exception& e) {
                            throw core::bad_input(fmt::format("not JSON: {}", e.what()), where);
                          }
                          RecordScore score;
                          try {
                            score = score_record(model, formatter, record, pad_id);
                          } catch (core::Error& e) {
                            e.add_context(where);
                            throw;
                          }
                          summary.add(score);
                          std::cout << score.to_json(number).dump() << '\n';
                        });
  }
  std::cout << summary.to_json().dump() << '\n';
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
  if (!context.world.is_root()) return core::kExitOk;  // an interactive tool: one rank works

  const InferenceModel loaded = load_inference_model(path, model::HeadKind::reward);
  const tokenizer::Tokenizer tokenizer = load_inference_tokenizer(o, loaded, context.log);
  context.log.info("loaded {} (step {}, {:.1f} M parameters)", loaded.step_dir,
                   loaded.manifest.step,
                   static_cast<double>(loaded.model->layout().parameter_count()) / 1e6);
  // Formatted as `prep preference` formats the chosen side of a record: the reward model's
  // training data.
  const prep::RecordFormatter formatter(tokenizer, prep::FormatOptions{});
  const std::int32_t pad_id = tokenizer.special(tokenizer::Special::finetune_right_pad);

  if (file) {
    score_file(o["input"].as<std::string>(), *loaded.model, formatter, pad_id);
  } else {
    const json record = {{"prompt", o["prompt"].as<std::string>()},
                         {"response", o["response"].as<std::string>()}};
    const std::vector<std::int32_t> tokens = response_sequence(formatter, record);
    const float reward = model::sequence_reward(*loaded.model, tokens, pad_id);
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
