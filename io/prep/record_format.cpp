#include "io/prep/record_format.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "io/tokenizer/utf8.hpp"

namespace l3::prep {

using nlohmann::json;
using tokenizer::Special;

namespace {

// The largest margin a preference record may carry (docs/FORMAT.md).
constexpr double kMaxMargin = 1e6;

const std::string& string_field(const json& record, const char* field) {
  const auto it = record.find(field);
  if (it == record.end()) throw core::bad_input(fmt::format(R"(missing "{}")", field));
  if (!it->is_string()) throw core::bad_input(fmt::format(R"("{}" must be a string)", field));
  return it->get_ref<const std::string&>();
}

bool has_target(const Example& e) {
  return std::any_of(e.mask.begin(), e.mask.end(), [](std::uint8_t m) { return m != 0; });
}

}  // namespace

std::string_view verdict_name(Verdict v) noexcept {
  switch (v) {
    case Verdict::keep:
      return "kept";
    case Verdict::empty:
      return "empty";
    case Verdict::all_masked:
      return "no_targets";
    case Verdict::too_long:
      return "too_long";
  }
  return "?";
}

std::string_view strip(std::string_view text) {
  // A code point counts as whitespace only when it is whole (a model's completion need not be
  // UTF-8: what does not decode stays).
  const auto space_at = [&](std::size_t start, std::size_t end, std::size_t& next) {
    const std::string_view piece = text.substr(start, end - start);
    std::size_t used = 0;
    const bool space = tokenizer::python_isspace(tokenizer::next_code_point(piece, used));
    next = start + used;
    return space && used <= piece.size();
  };
  std::size_t begin = 0;
  while (begin < text.size()) {
    std::size_t next = begin;
    if (!space_at(begin, text.size(), next)) break;
    begin = next;
  }
  std::size_t end = text.size();
  while (end > begin) {
    std::size_t start = end - 1;  // step back to the start of the last code point
    while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0U) == 0x80U) --start;
    std::size_t next = start;
    if (!space_at(start, end, next) || next != end) break;
    end = start;
  }
  return text.substr(begin, end - begin);
}

RecordFormatter::RecordFormatter(const tokenizer::Tokenizer& tokenizer, FormatOptions options)
    : tokenizer_(tokenizer), options_(options) {}

void RecordFormatter::append_special(Example& out, Special token, std::uint8_t mask) const {
  out.tokens.push_back(tokenizer_.special(token));
  out.mask.push_back(mask);
}

void RecordFormatter::append_text(Example& out, std::string_view text, std::uint8_t mask) const {
  tokenizer_.encode_append(text, out.tokens);
  out.mask.resize(out.tokens.size(), mask);
}

void RecordFormatter::begin(Example& out) const { append_special(out, Special::begin_of_text, 0); }

void RecordFormatter::append_assistant_header(Example& out) const {
  append_special(out, Special::start_header, 0);
  append_text(out, "assistant", 0);
  append_special(out, Special::end_header, 0);
  append_text(out, "\n\n", 0);
}

void RecordFormatter::append_message(Example& out, const Message& message, bool trained) const {
  append_special(out, Special::start_header, 0);
  append_text(out, message.role, 0);
  append_special(out, Special::end_header, 0);
  append_text(out, "\n\n", 0);
  const auto mask = static_cast<std::uint8_t>(trained ? 1 : 0);
  append_text(out, strip(message.content), mask);
  append_special(out, Special::end_of_turn, mask);
}

std::vector<RecordFormatter::Message> RecordFormatter::messages_of(const json& value,
                                                                   const char* field) {
  if (!value.is_array() || value.empty()) {
    throw core::bad_input(
        fmt::format(R"("{}" must be a non-empty list of {{"role", "content"}} messages)", field));
  }
  std::vector<Message> messages;
  for (std::size_t i = 0; i < value.size(); ++i) {
    const json& m = value[i];
    const auto role = m.is_object() ? m.find("role") : m.end();
    const auto content = m.is_object() ? m.find("content") : m.end();
    if (!m.is_object() || role == m.end() || !role->is_string() || content == m.end() ||
        !content->is_string()) {
      throw core::bad_input(
          fmt::format(R"({}[{}] must be {{"role": string, "content": string}})", field, i));
    }
    messages.push_back({role->get<std::string>(), content->get<std::string>()});
  }
  return messages;
}

Example RecordFormatter::conversation(const std::vector<Message>& messages, bool last_only) const {
  std::size_t last_assistant = messages.size();
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role == "assistant") last_assistant = i;
  }
  Example out;
  begin(out);
  bool any_content = false;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const bool trained = messages[i].role == "assistant" && (!last_only || i == last_assistant);
    append_message(out, messages[i], trained);
    any_content = any_content || !strip(messages[i].content).empty();
  }
  out.empty_content = !any_content;
  return out;
}

Example RecordFormatter::conversation_prompt(const json& messages) const {
  const std::vector<Message> turns = messages_of(messages, "messages");
  if (turns.back().role == "assistant") {
    throw core::bad_input(
        R"("messages" must end before the assistant's answer, not with an assistant turn)");
  }
  Example out = conversation(turns, false);
  append_assistant_header(out);
  return out;
}

Example RecordFormatter::continuation(const json& messages) const {
  Example out;
  for (const Message& m : messages_of(messages, "messages")) append_message(out, m, false);
  append_assistant_header(out);
  return out;
}

Example RecordFormatter::prompt(const json& record) const {
  if (!record.is_object()) throw core::bad_input("a record must be a JSON object");
  const bool has_prompt = record.contains("prompt");
  const bool has_messages = record.contains("messages");
  if (has_prompt == has_messages) {
    throw core::bad_input(has_prompt ? R"(give "prompt" or "messages", not both)"
                                     : R"(expected "prompt" (a string) or "messages" (a list))");
  }
  if (has_messages) return conversation_prompt(record["messages"]);
  const json& text = record["prompt"];
  if (!text.is_string()) throw core::bad_input(R"("prompt" must be a string)");
  return conversation_prompt(json::array({{{"role", "user"}, {"content", text}}}));
}

Example RecordFormatter::sft(const json& record) const {
  if (!record.is_object()) throw core::bad_input("a record must be a JSON object");
  if (record.contains("messages"))
    return conversation(messages_of(record["messages"], "messages"), options_.last_turn_only);
  if (record.contains("prompt") || record.contains("completion")) {
    const std::string& prompt = string_field(record, "prompt");
    const std::string& completion = string_field(record, "completion");
    if (options_.prompt_template == Template::chat) {
      Example out = conversation({{"user", prompt}, {"assistant", completion}}, false);
      out.empty_content = strip(completion).empty();
      return out;
    }
    Example out;
    begin(out);
    append_text(out, prompt, 0);
    append_text(out, completion, 1);
    append_special(out, Special::end_of_text, 1);
    out.empty_content = completion.empty();
    return out;
  }
  if (record.contains("text")) {
    const std::string& text = string_field(record, "text");
    Example out;
    begin(out);
    append_text(out, text, 1);
    append_special(out, Special::end_of_text, 1);
    out.empty_content = text.empty();
    return out;
  }
  throw core::bad_input(R"(expected "messages", "prompt" + "completion", or "text")");
}

PreferenceExample RecordFormatter::preference(const json& record) const {
  if (!record.is_object()) throw core::bad_input("a record must be a JSON object");
  std::vector<Message> prompt;
  if (const auto p = record.find("prompt"); p != record.end()) {
    if (p->is_string()) {
      prompt.push_back({"user", p->get<std::string>()});
    } else {
      prompt = messages_of(*p, "prompt");
    }
  }
  auto side = [&](const char* field) {
    const auto it = record.find(field);
    if (it == record.end()) throw core::bad_input(fmt::format(R"(missing "{}")", field));
    std::vector<Message> messages = prompt;
    if (it->is_string()) {
      if (prompt.empty())
        throw core::bad_input(fmt::format(R"("{}" is a string but there is no "prompt")", field));
      messages.push_back({"assistant", it->get<std::string>()});
    } else {
      const std::vector<Message> turns = messages_of(*it, field);
      messages.insert(messages.end(), turns.begin(), turns.end());
    }
    if (messages.back().role != "assistant") {
      throw core::bad_input(fmt::format(R"("{}" must end with an assistant turn)", field));
    }
    Example out = conversation(messages, true);  // the final assistant turn is what is compared
    out.empty_content = strip(messages.back().content).empty();
    return out;
  };
  PreferenceExample pair{side("chosen"), side("rejected"), std::nullopt};
  if (const auto m = record.find("margin"); m != record.end() && !m->is_null()) {
    if (!m->is_number()) throw core::bad_input(R"("margin" must be a number)");
    // Stored as fp32: a margin beyond its range would be stored as inf, and training on it
    // diverge (reward --margin-from-data).
    const double margin = m->get<double>();
    if (!std::isfinite(margin) || std::abs(margin) > kMaxMargin) {
      throw core::bad_input(fmt::format(
          R"("margin" {} is out of range: a finite number within +-{:g})", margin, kMaxMargin));
    }
    pair.margin = static_cast<float>(margin);
  }
  return pair;
}

Example RecordFormatter::response(const json& record) const {
  if (!record.is_object()) throw core::bad_input("a record must be a JSON object");
  const auto answer = record.find("response");
  if (answer == record.end()) throw core::bad_input(R"(missing "response")");
  json pair = {{"chosen", *answer}, {"rejected", *answer}};
  if (const auto prompt = record.find("prompt"); prompt != record.end()) pair["prompt"] = *prompt;
  try {
    return std::move(preference(pair).chosen);
  } catch (core::Error& e) {
    // preference() speaks of "chosen"; the record calls it "response"
    std::string message = e.message();
    for (std::size_t at = message.find("chosen"); at != std::string::npos;
         at = message.find("chosen", at + 8)) {
      message.replace(at, 6, "response");
    }
    throw core::bad_input(message, e.context());
  }
}

Verdict RecordFormatter::fit(Example& e) const {
  if (e.empty_content) return Verdict::empty;
  if (!has_target(e)) return Verdict::all_masked;
  const auto limit = static_cast<std::size_t>(options_.max_len);
  if (options_.max_len <= 0 || e.tokens.size() <= limit) return Verdict::keep;
  if (options_.truncation == Truncation::drop) return Verdict::too_long;
  // Remove prompt tokens from the left, after <|begin_of_text|>, never a target.
  const auto first_target =
      static_cast<std::size_t>(std::find(e.mask.begin(), e.mask.end(), 1) - e.mask.begin());
  const std::size_t removable = first_target > 1 ? first_target - 1 : 0;
  const std::size_t excess = e.tokens.size() - limit;
  if (excess > removable) return Verdict::too_long;
  e.tokens.erase(e.tokens.begin() + 1, e.tokens.begin() + 1 + static_cast<std::ptrdiff_t>(excess));
  e.mask.erase(e.mask.begin() + 1, e.mask.begin() + 1 + static_cast<std::ptrdiff_t>(excess));
  return Verdict::keep;
}

Verdict RecordFormatter::fit(PreferenceExample& pair) const {
  const Verdict c = fit(pair.chosen);
  if (c != Verdict::keep) return c;
  return fit(pair.rejected);
}

}  // namespace l3::prep
