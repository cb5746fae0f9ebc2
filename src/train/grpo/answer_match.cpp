#include "train/grpo/answer_match.hpp"

#include <nlohmann/json.hpp>

#include "io/prep/record_format.hpp"

namespace l3::train::grpo {

std::optional<std::string> expected_answer(const nlohmann::json& record) {
  const auto answer = record.find("answer");
  if (answer == record.end() || !(answer->is_string() || answer->is_number())) return std::nullopt;
  return answer->is_string() ? answer->get<std::string>() : answer->dump();
}

double answer_match(const nlohmann::json& record, std::string_view completion) {
  const std::optional<std::string> answer = expected_answer(record);
  return answer && prep::strip(completion) == prep::strip(*answer) ? 1.0 : 0.0;
}

}  // namespace l3::train::grpo
