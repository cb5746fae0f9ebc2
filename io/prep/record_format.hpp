// JSONL records -> token sequences with loss masks, through the Llama 3 instruct template:
//   <|begin_of_text|> then per message
//   <|start_header_id|>ROLE<|end_header_id|>\n\n + content.strip() + <|eot_id|>
// A mask of 1 marks a training target (the token is predicted from those before it); the
// <|begin_of_text|> is never one.
//
// SFT records, one of:
//   {"messages": [{"role", "content"}, ...]}   loss on assistant turns and their <|eot_id|>
//                                              (the last assistant turn only with last_turn_only)
//   {"prompt": ..., "completion": ...}         chat: a user and an assistant turn, loss on the
//                                              completion and its <|eot_id|>; raw: BOS + prompt +
//                                              completion + <|end_of_text|>, loss on completion +
//                                              end
//   {"text": ...}                              BOS + text + <|end_of_text|>, loss after BOS
// Prompt records (GRPO's, generate --input's): {"prompt": TEXT} or {"messages": [...]} ending
// before the assistant's turn, formatted up to the assistant header (prompt()).
// Preference records: {"prompt", "chosen", "rejected"} with strings or message lists (the
// prompt may be absent when chosen/rejected are whole conversations), optional "margin". Both
// sequences end with <|eot_id|>; their masks mark the final assistant turn.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/tokenizer/tokenizer.hpp"

namespace l3::prep {

enum class Template { chat, raw };
enum class Truncation { drop, left };

struct FormatOptions {
  Template prompt_template = Template::chat;  // for {"prompt", "completion"} records
  bool last_turn_only = false;                // messages: loss on the last assistant turn only
  std::int64_t max_len = 0;                   // 0: no limit
  Truncation truncation = Truncation::drop;
};

struct Example {
  std::vector<std::int32_t> tokens;
  std::vector<std::uint8_t> mask;
  bool empty_content = false;  // the record's text was empty
};

struct PreferenceExample {
  Example chosen;
  Example rejected;
  std::optional<float> margin;
};

enum class Verdict { keep, empty, all_masked, too_long };
[[nodiscard]] std::string_view verdict_name(Verdict v) noexcept;

class RecordFormatter {
 public:
  RecordFormatter(const tokenizer::Tokenizer& tokenizer, FormatOptions options);

  // Throw bad_input Errors with the reason (the caller adds file:line).
  [[nodiscard]] Example sft(const nlohmann::json& record) const;
  [[nodiscard]] PreferenceExample preference(const nlohmann::json& record) const;
  // A {"prompt", "response"} record (strings or message lists, as in preference records; the
  // prompt may be absent when the response is a whole conversation) formatted as the chosen side
  // of a preference record: a response as a reward model sees it (`score`, GRPO's
  // --reward-model).
  [[nodiscard]] Example response(const nlohmann::json& record) const;
  // A prompt record, {"prompt": TEXT} (a user turn) or {"messages": [...]} (a conversation that
  // ends before the assistant's answer), in the chat template with the assistant header
  // appended: the model continues with the answer. The mask is all 0.
  [[nodiscard]] Example prompt(const nlohmann::json& record) const;
  // A conversation as prompt() formats it (bad_input unless a non-empty list that does not end
  // with an assistant turn).
  [[nodiscard]] Example conversation_prompt(const nlohmann::json& messages) const;

  // What follows a policy's turn in a multi-turn episode (GRPO's --environment): `messages`
  // ({"role", "content"} objects, an environment's) in the chat template, then the assistant
  // header, without <|begin_of_text|>: appended after the turn's <|eot_id|>, the conversation
  // reads as prompt() formats it. The mask is all 0.
  [[nodiscard]] Example continuation(const nlohmann::json& messages) const;
  // Whether to keep an example, after truncating it to max_len when the policy allows:
  // truncation removes prompt tokens right after <|begin_of_text|> (never targets).
  [[nodiscard]] Verdict fit(Example& example) const;
  [[nodiscard]] Verdict fit(PreferenceExample& pair) const;

 private:
  struct Message {
    std::string role;
    std::string content;
  };
  void begin(Example& out) const;
  // <|start_header_id|>assistant<|end_header_id|>\n\n: the model answers next.
  void append_assistant_header(Example& out) const;
  void append_message(Example& out, const Message& message, bool trained) const;
  void append_text(Example& out, std::string_view text, std::uint8_t mask) const;
  void append_special(Example& out, tokenizer::Special token, std::uint8_t mask) const;
  [[nodiscard]] Example conversation(const std::vector<Message>& messages, bool last_only) const;
  [[nodiscard]] static std::vector<Message> messages_of(const nlohmann::json& value,
                                                        const char* field);

  const tokenizer::Tokenizer& tokenizer_;
  FormatOptions options_;
};

// Python's str.strip() (Unicode whitespace at both ends); text that is not valid UTF-8 (a
// model's completion) is taken byte by byte where it is not.
[[nodiscard]] std::string_view strip(std::string_view text);

}  // namespace l3::prep
