// The prompt records of `generate --input`: JSONL (plain or .gz), one record per non-blank line,
// {"prompt": TEXT} (a user turn of the Llama 3 chat template) or {"messages": [...]} (a
// conversation that ends before the assistant's answer), formatted as `generate --chat` and
// `prep` format them, with the assistant header appended. Any other field of a record is carried
// through into its output lines.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "io/tokenizer/tokenizer.hpp"

namespace l3::cli {

// The keys of an output line (cli/generation_job.hpp); a record's own field may not be one.
inline constexpr std::array<std::string_view, 7> kGenerationOutputKeys = {
    "line", "sample", "completion", "ids", "stopped", "logprobs", "prompt_ids"};

struct PromptRecord {
  std::int64_t line = 0;             // in its file, from 1
  std::vector<std::int32_t> prompt;  // the formatted prompt's ids
  nlohmann::ordered_json carried;    // the record's other fields, in its order (an object)
};

// One record: `text` is line `line` of `file`. bad_input Errors name file:line: not JSON, not
// an object, neither or both of "prompt" and "messages", a field of the wrong type, a field
// named as an output key, or a prompt of more than `max_prompt` tokens (prompt + --max-new
// beyond the model's positions).
[[nodiscard]] PromptRecord read_prompt_record(const tokenizer::Tokenizer& tokenizer,
                                              std::string_view text, const std::string& file,
                                              std::int64_t line, std::int64_t max_prompt);

// Calls record(text, line) for each non-blank line of the JSONL file `path` (plain or .gz; the
// prep readers' checks: a regular file, bounded lines, a whole gzip stream), in order. A pattern
// naming several files is a usage Error.
void for_each_prompt_line(const std::string& path,
                          const std::function<void(std::string_view, std::int64_t)>& record);

}  // namespace l3::cli
