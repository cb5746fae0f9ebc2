#include "cli/prompt_records.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/bounded_read.hpp"
#include "core/error.hpp"
#include "io/prep/input_split.hpp"
#include "io/prep/record_format.hpp"

namespace l3::cli {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

PromptRecord format_record(const tokenizer::Tokenizer& tokenizer, std::string_view text,
                           const core::ErrorContext& where, std::int64_t line,
                           std::int64_t max_prompt) {
  // Checked for depth and size by parse_json; read again in order for the carried fields.
  const json record = core::parse_json(text, "", where);
  if (!record.is_object()) throw core::bad_input("a record must be a JSON object");
  PromptRecord out;
  out.line = line;
  out.prompt = prep::RecordFormatter(tokenizer, prep::FormatOptions{}).prompt(record).tokens;
  if (static_cast<std::int64_t>(out.prompt.size()) > max_prompt) {
    throw core::bad_input(fmt::format(
        "the prompt has {} tokens: with --max-new it does not fit in the model's context "
        "(at most {} prompt tokens)",
        out.prompt.size(), std::max<std::int64_t>(max_prompt, 0)));
  }
  out.carried = ordered_json::object();
  const ordered_json fields = ordered_json::parse(text);
  for (const auto& item : fields.items()) {
    const std::string& key = item.key();
    if (key == "prompt" || key == "messages") continue;
    if (std::find(kGenerationOutputKeys.begin(), kGenerationOutputKeys.end(), key) !=
        kGenerationOutputKeys.end()) {
      throw core::bad_input(
          fmt::format(R"(the field "{}" is also a key of the output lines; rename it)", key));
    }
    out.carried[key] = item.value();
  }
  return out;
}

}  // namespace

PromptRecord read_prompt_record(const tokenizer::Tokenizer& tokenizer, std::string_view text,
                                const std::string& file, std::int64_t line,
                                std::int64_t max_prompt) {
  const core::ErrorContext where{.file = file, .line = line};
  try {
    return format_record(tokenizer, text, where, line, max_prompt);
  } catch (core::Error& e) {
    e.add_context(where);
    throw;
  }
}

void for_each_prompt_line(const std::string& path,
                          const std::function<void(std::string_view, std::int64_t)>& record) {
  const std::vector<prep::InputFile> inputs = prep::list_inputs({path});
  if (inputs.size() != 1) {
    throw core::usage_error(
        fmt::format("--input {} names {} files; give one file", path, inputs.size()));
  }
  const prep::InputFile& input = inputs.front();
  std::int64_t number = 0;
  prep::for_each_line(input, prep::FileRange{.file = 0, .begin = 0, .end = input.size},
                      [&](std::string_view line, std::int64_t /*offset*/) {
                        ++number;
                        if (prep::is_blank_line(line)) return;
                        record(line, number);
                      });
}

}  // namespace l3::cli
