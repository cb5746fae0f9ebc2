#include "cli/tokenize_command.hpp"

#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/bounded_read.hpp"
#include "core/error.hpp"
#include "io/prep/input_split.hpp"
#include "io/prep/record_format.hpp"
#include "io/tokenizer/tokenizer.hpp"

namespace l3::cli {

void declare_tokenize_options(po::options_description& options,
                              po::positional_options_description& /*positional*/) {
  options.add_options()(
      "tokenizer", po::value<std::string>()->required()->value_name("FILE|bytes"),
      "tokenizer.model, tokenizer.json, a model directory, or the built-in 'bytes'")(
      "bos", po::bool_switch(), "start every line's ids with <|begin_of_text|>")(
      "eos", po::bool_switch(), "end every line's ids with <|end_of_text|>")(
      "prep", po::value<std::string>()->value_name("sft|preference"),
      "read records as 'prep sft' or 'prep preference' does (messages with the chat template, "
      "prompt and completion, ...) and print the ids and loss mask it trains on: {\"ids\", "
      "\"mask\"}, or {\"chosen\": {...}, \"rejected\": {...}}");
}

namespace {

nlohmann::json example_json(const prep::Example& e) {
  return {{"ids", e.tokens}, {"mask", e.mask}};
}

}  // namespace

int run_tokenize(const CommandContext& context) {
  if (!context.world.is_root()) return core::kExitOk;  // a stream filter: one rank does the work
  const auto tokenizer = tokenizer::Tokenizer::load(context.options["tokenizer"].as<std::string>());
  const bool bos = context.options["bos"].as<bool>();
  const bool eos = context.options["eos"].as<bool>();
  const std::string as_prep =
      context.options.count("prep") != 0 ? context.options["prep"].as<std::string>() : "";
  if (!as_prep.empty() && as_prep != "sft" && as_prep != "preference")
    throw core::usage_error(fmt::format("--prep {}: give sft or preference", as_prep));
  if (!as_prep.empty() && (bos || eos))
    throw core::usage_error("--bos and --eos are for plain text, not with --prep");
  const prep::RecordFormatter formatter(tokenizer, prep::FormatOptions{});
  std::string line;
  std::vector<std::int32_t> ids;
  core::LineReader lines(std::cin, "stdin");
  while (lines.next(line)) {
    const core::ErrorContext where{.file = "stdin", .line = lines.line_number()};
    if (prep::is_blank_line(line)) continue;  // as prep skips it
    const nlohmann::json record = core::parse_json(line, "", where);
    if (!as_prep.empty()) {
      nlohmann::json out;
      try {
        // What prep keeps, or why it drops the record (one line per record either way).
        prep::Verdict verdict = prep::Verdict::keep;
        if (as_prep == "sft") {
          prep::Example example = formatter.sft(record);
          verdict = formatter.fit(example);
          out = example_json(example);
        } else {
          prep::PreferenceExample pair = formatter.preference(record);
          verdict = formatter.fit(pair);
          out = {{"chosen", example_json(pair.chosen)}, {"rejected", example_json(pair.rejected)}};
        }
        if (verdict != prep::Verdict::keep) out = {{"dropped", prep::verdict_name(verdict)}};
      } catch (core::Error& e) {
        e.add_context(where);
        throw;
      }
      std::cout << out.dump() << '\n';
      continue;
    }
    const auto text = record.find("text");
    if (!record.is_object() || text == record.end() || !text->is_string()) {
      throw core::bad_input(R"(expected an object with a string "text")", where);
    }
    ids.clear();
    if (bos) ids.push_back(tokenizer.special(tokenizer::Special::begin_of_text));
    try {
      tokenizer.encode_append(text->get_ref<const std::string&>(), ids);
    } catch (core::Error& e) {
      e.add_context(where);
      throw;
    }
    if (eos) ids.push_back(tokenizer.special(tokenizer::Special::end_of_text));
    std::cout << nlohmann::json{{"ids", ids}}.dump() << '\n';
  }
  std::cout.flush();
  return core::kExitOk;
}

}  // namespace l3::cli
