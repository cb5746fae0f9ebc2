#include "cli/prompt_format.hpp"

#include <nlohmann/json.hpp>

#include "core/error.hpp"

namespace l3::cli {

using nlohmann::json;

std::vector<std::int32_t> generation_prompt(const tokenizer::Tokenizer& tokenizer,
                                            std::string_view text, bool chat,
                                            const std::optional<std::string>& system) {
  if (!chat) {
    std::vector<std::int32_t> ids = {tokenizer.special(tokenizer::Special::begin_of_text)};
    tokenizer.encode_append(text, ids);
    return ids;
  }
  json messages = json::array();
  if (system) messages.push_back({{"role", "system"}, {"content", *system}});
  messages.push_back({{"role", "user"}, {"content", std::string(text)}});
  return chat_prompt(tokenizer, messages);
}

std::vector<std::int32_t> chat_prompt(const tokenizer::Tokenizer& tokenizer, const json& messages) {
  // prep's formatter: the template is the one of the training data and of GRPO's prompts.
  const prep::RecordFormatter formatter(tokenizer, prep::FormatOptions{});
  return formatter.conversation_prompt(messages).tokens;
}

}  // namespace l3::cli
