// Token sequences for inference, formatted exactly as training data was (prep's
// RecordFormatter): a generation prompt. (A response as a reward model sees it:
// RecordFormatter::response.)
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/prep/record_format.hpp"
#include "io/tokenizer/tokenizer.hpp"

namespace l3::cli {

// chat: <|begin_of_text|>[system turn]<|start_header_id|>user<|end_header_id|>\n\n TEXT
// <|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n (turn contents stripped, as prep
// does); otherwise <|begin_of_text|> TEXT, as {"text"} records and the raw template begin.
[[nodiscard]] std::vector<std::int32_t> generation_prompt(const tokenizer::Tokenizer& tokenizer,
                                                          std::string_view text, bool chat,
                                                          const std::optional<std::string>& system);

// A conversation (a JSON list of {"role", "content"} messages that does not end with the
// assistant's turn) in the chat template with the assistant header appended, as
// generation_prompt's chat form: the model continues with the assistant's answer. bad_input
// Errors say what is wrong with the list (the caller adds file:line).
[[nodiscard]] std::vector<std::int32_t> chat_prompt(const tokenizer::Tokenizer& tokenizer,
                                                    const nlohmann::json& messages);

}  // namespace l3::cli
